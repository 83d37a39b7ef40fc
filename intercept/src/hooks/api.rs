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
        if mode::config().is_none_or(|c| c.step_rule != StepRule::Api) {
            return;
        }
        // Seen even before the first CUDA call (a one-step run's only mark may come then),
        // pushed once a session runs (before it, no step has records).
        tracer::note_rule_mark();
        if let Some(s) = session::current() {
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
