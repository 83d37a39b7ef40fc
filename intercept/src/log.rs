//! Log lines on stderr, `ttrace[PID]: ...`, filtered by `TTRACE_LOG` (error, warn, info,
//! debug; default warn). Never used on a hook's pass-through path.

use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};

const UNSET: u8 = u8::MAX;
static LEVEL: AtomicU8 = AtomicU8::new(UNSET);

fn level() -> u8 {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != UNSET {
        return l;
    }
    let l = match std::env::var("TTRACE_LOG").as_deref() {
        Ok("error") => 0,
        Ok("info") => 2,
        Ok("debug") => 3,
        _ => 1,
    };
    LEVEL.store(l, Ordering::Relaxed);
    l
}

fn emit(at: u8, msg: &str) {
    if level() >= at {
        // One write per line so lines of concurrent processes do not interleave.
        let line = format!("ttrace[{}]: {msg}\n", std::process::id());
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// A failure that changes what is captured.
pub fn error(msg: &str) {
    emit(0, msg);
}

/// Something the user should know.
pub fn warn(msg: &str) {
    emit(1, msg);
}

/// Progress.
pub fn info(msg: &str) {
    emit(2, msg);
}

/// Details for debugging the tracer.
pub fn debug(msg: &str) {
    emit(3, msg);
}
