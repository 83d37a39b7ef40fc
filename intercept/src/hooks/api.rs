//! The optional C API of include/ttrace.h, for programs that want to mark steps or pause
//! capture. Safe to call at any time, from any thread, traced or not.

use std::sync::atomic::{AtomicBool, Ordering};

use ttrace_proto::config::StepRule;

use crate::tracer;
use crate::{mode, session};

/// `void ttrace_step(void)`: starts a new step under `TTRACE_STEP_RULE=api` (ignored by the
/// other rules).
#[no_mangle]
pub extern "C" fn ttrace_step() {
    let _ = crate::catch(|| {
        if !mode::configured() {
            return;
        }
        let Some(s) = session::current() else {
            // No record yet: nothing to separate (but a one-step run was marked).
            CALLED_BEFORE_CAPTURE.store(true, Ordering::Relaxed);
            return;
        };
        if s.cfg.step_rule == StepRule::Api {
            tracer::push_mark(s.cfg, true, None);
        }
    });
}

/// Whether `ttrace_step()` was called before capture began (before the first CUDA call).
static CALLED_BEFORE_CAPTURE: AtomicBool = AtomicBool::new(false);

/// Whether `ttrace_step()` was called before capture began: the step rule never sees that
/// call, and a run whose only call it was is a one-step run, not one whose marks went missing.
pub(crate) fn step_called_before_capture() -> bool {
    CALLED_BEFORE_CAPTURE.load(Ordering::Relaxed)
}

/// `void ttrace_pause(void)`: stops capturing (NVTX ranges, NCCL groups and communicators are
/// still tracked, so a resume inside a group stays correct).
#[no_mangle]
pub extern "C" fn ttrace_pause() {
    let _ = crate::catch(mode::pause);
}

/// `void ttrace_resume(void)`: captures again what the configuration selects.
#[no_mangle]
pub extern "C" fn ttrace_resume() {
    let _ = crate::catch(mode::resume);
}
