//! CUDA libraries the hooks cannot see: a library whose entry points ttrace hooks, loaded with
//! `dlopen` without `RTLD_GLOBAL` and called through `dlsym(handle, name)` (JAX's XLA plugin
//! reaches cuBLAS, cuBLASLt, NCCL and the runtime this way: seen on an H200 with jax 0.11, a
//! traced matmul left an empty store), never reaches a hook: `LD_PRELOAD` interposition works
//! in the global scope only. Those calls cannot be captured, so they are said to be lost: each
//! such library is one `unsupported` gap naming it (`skipped_api`: its file name), recorded when
//! the process exits, also by a process that captured nothing else (the session starts then),
//! and one line on stderr. The run never reports itself clean.
//!
//! Found with [`real::privately_loaded`]: a loaded copy whose probe function is not the one the
//! global scope resolves.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use ttrace_proto::record::{GapOp, GapReason, Op};

use crate::{engine, log, mode, real, session, tracer};

/// The paths already reported by this process.
static REPORTED: Mutex<BTreeSet<Vec<u8>>> = Mutex::new(BTreeSet::new());

/// The privately loaded CUDA libraries not reported yet.
fn unreported() -> Vec<(real::Lib, std::ffi::CString)> {
    let mut seen = REPORTED.lock().unwrap_or_else(|p| p.into_inner());
    real::privately_loaded()
        .into_iter()
        .filter(|(_, path)| seen.insert(path.to_bytes().to_vec()))
        .collect()
}

/// Records one gap per privately loaded CUDA library not reported yet (a session must be
/// running or startable). Returns whether any was recorded.
pub fn report() -> bool {
    if mode::dead() || mode::config().is_none() {
        return false;
    }
    let found = unreported();
    if found.is_empty() || session::get().is_none() {
        return false;
    }
    for (lib, path) in &found {
        let path = path.to_string_lossy();
        let file = path.rsplit('/').next().unwrap_or(&path).to_string();
        let detail = format!(
            "{path} was loaded without RTLD_GLOBAL (dlopen) and its entry points are reached \
             with dlsym(handle, ...): its calls ({lib:?}) bypass ttrace's hooks and are not \
             captured"
        );
        log::warn(&detail);
        announce(&format!("{detail}; the store records it as a gap"));
        let op = Op::Gap(GapOp {
            reason: GapReason::Unsupported,
            skipped_api: file,
            bytes: 0,
            detail,
        });
        let m = engine::meta("dlopen", op, 0, 0);
        tracer::push(tracer::Entry::Gap(Box::new(m)));
    }
    true
}

/// One line on stderr, whatever the log level.
fn announce(line: &str) {
    use std::io::Write;
    let line = format!("ttrace[{}]: {line}\n", std::process::id());
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// The exit handler registered when the library loads (so it runs after the program's own
/// and after a session's, which reports first): a process that never started a session, yet
/// loaded a CUDA library privately, starts one to record the gaps, then drains it.
pub extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if session::current().is_some() {
            return;
        }
        if report() {
            let wait = mode::config().map_or(10_000, |c| c.wait_ms.clamp(1_000, 30_000));
            tracer::shutdown(Duration::from_millis(wait));
        }
    });
}
