//! The optional C API of include/ttrace.h, for programs that want to mark steps or pause
//! capture. Safe to call at any time, from any thread, traced or not.

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
            // No record yet: nothing to separate.
            return;
        };
        if s.cfg.step_rule == StepRule::Api {
            tracer::push_mark(s.cfg, true, None);
        }
    });
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
