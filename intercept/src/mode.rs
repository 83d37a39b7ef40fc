//! What the hooks do right now, in one atomic word.
//!
//! Every hook starts with [`off`]: one relaxed load of [`MODE`] and a mask test. When the
//! family's bit is clear the hook calls the real function and returns: that is the whole cost of
//! a hook that does not capture (no allocation, lock or thread-local access).
//!
//! The word starts as [`UNINIT`], so the first hook of the process (whatever its family) takes
//! the cold path: it reads the configuration from the environment and sets the bits (none
//! with `TTRACE=0`). A fault, `fork` (in the child), or a failed session start clears
//! every bit for good; `ttrace_pause()`/`ttrace_resume()` clear and restore the capture bits.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;

use ttrace_proto::config::{CaptureConfig, Family};

/// Capture host/device copies.
pub const MEMCPY: u32 = 1 << 0;
/// Capture cuBLAS and cuBLASLt GEMMs.
pub const GEMM: u32 = 1 << 1;
/// Capture NCCL collectives and point-to-point.
pub const NCCL: u32 = 1 << 2;
/// Track NCCL communicators and group depth (kept while paused, so that a resume inside a
/// group still defers correctly).
pub const COMMS: u32 = 1 << 3;
/// Track NVTX ranges and marks.
pub const NVTX: u32 = 1 << 4;
/// Record kernel launch names.
pub const KERNELS: u32 = 1 << 5;
/// A perturbed reference run: GEMM outputs get round-off-sized noise (`TTRACE_PERTURB`). Not
/// a capture bit: `ttrace_pause()` leaves the run perturbed, so the program's numbers do not
/// depend on what is captured.
pub const PERTURB: u32 = 1 << 6;
/// The configuration has not been read yet.
pub const UNINIT: u32 = 1 << 31;

/// The bits `ttrace_pause()` clears.
const CAPTURE_BITS: u32 = MEMCPY | GEMM | NCCL | KERNELS;

/// The current mode.
pub static MODE: AtomicU32 = AtomicU32::new(UNINIT);
/// Set once capture was disabled for good (fault, fork child, failed start).
static DEAD: AtomicBool = AtomicBool::new(false);
/// The bits configured at start, restored by `ttrace_resume()`.
static CONFIGURED: AtomicU32 = AtomicU32::new(0);
static CONFIG: OnceLock<Option<CaptureConfig>> = OnceLock::new();

/// Whether a hook of `bits` passes straight through. One relaxed load on the hot path.
#[inline(always)]
pub fn off(bits: u32) -> bool {
    let m = MODE.load(Ordering::Relaxed);
    if m & (bits | UNINIT) == 0 {
        return true;
    }
    m & UNINIT != 0 && init_then_off(bits)
}

#[cold]
#[inline(never)]
fn init_then_off(bits: u32) -> bool {
    if std::panic::catch_unwind(init).is_err() {
        // Never unwind into the program: a tracer that cannot start stays out of the way.
        let _ = MODE.compare_exchange(UNINIT, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
    MODE.load(Ordering::Relaxed) & bits == 0
}

/// Whether any of `bits` is set now (after [`off`] initialised the mode).
#[inline(always)]
pub fn on(bits: u32) -> bool {
    MODE.load(Ordering::Relaxed) & bits != 0
}

/// Whether `TTRACE` leaves the library on: `TTRACE=0` (or `off`, `false`, `no`) makes it a
/// pure pass-through, whatever else is set.
pub fn enabled() -> bool {
    !matches!(
        std::env::var("TTRACE").as_deref().map(str::trim),
        Ok("0" | "off" | "false" | "no")
    )
}

/// Reads the configuration once and sets the mode. Capture is on unless `TTRACE=0`: with
/// `TTRACE_SOCKET` the process reports to that daemon, without it to the user's collector
/// (started on demand, see `collector`).
fn init() {
    if !enabled() {
        CONFIGURED.store(0, Ordering::Relaxed);
        let _ = MODE.compare_exchange(UNINIT, 0, Ordering::AcqRel, Ordering::Relaxed);
        return;
    }
    let cfg = config();
    let bits = match cfg {
        Some(c) if crate::identity::rank_selected(c) => {
            let mut b = COMMS | NVTX;
            for (f, bit) in [
                (Family::Memcpy, MEMCPY),
                (Family::Gemm, GEMM),
                (Family::Nccl, NCCL),
            ] {
                if c.captures(f) {
                    b |= bit;
                }
            }
            if c.kernels {
                b |= KERNELS;
            }
            if c.perturb.is_some() {
                b |= PERTURB;
            }
            b
        }
        // A rank left out of the capture is still perturbed: the run as a whole is the
        // perturbed reference.
        Some(c) if c.perturb.is_some() => PERTURB,
        _ => 0,
    };
    CONFIGURED.store(bits, Ordering::Relaxed);
    // Only the first initialiser wins; a racing fault or fork keeps its zero.
    let _ = MODE.compare_exchange(UNINIT, bits, Ordering::AcqRel, Ordering::Relaxed);
}

/// The capture configuration (`None`: malformed, reported once).
pub fn config() -> Option<&'static CaptureConfig> {
    CONFIG
        .get_or_init(|| match CaptureConfig::from_vars(ttrace_vars()) {
            Ok(c) => Some(c),
            Err(e) => {
                crate::log::error(&format!("capture disabled: {e}"));
                None
            }
        })
        .as_ref()
}

/// The `TTRACE_*` variables of the environment (`std::env::vars` would panic on a variable
/// that is not UTF-8, and any program may have one).
fn ttrace_vars() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with("TTRACE_"))
        .collect()
}

/// Turns capture off for good. Returns whether this call did it (the first one).
pub fn disable() -> bool {
    // DEAD first: a concurrent `resume` that sees it alive then fails its compare-exchange.
    let first = !DEAD.swap(true, Ordering::AcqRel);
    MODE.store(0, Ordering::Release);
    first
}

/// Stops perturbing GEMM outputs for good (capture goes on). Returns whether this call did
/// it.
pub fn stop_perturbing() -> bool {
    MODE.fetch_and(!PERTURB, Ordering::AcqRel) & PERTURB != 0
}

/// Whether capture was disabled for good.
pub fn dead() -> bool {
    DEAD.load(Ordering::Acquire)
}

/// `fork` child handler: async-signal-safe (two atomic stores).
pub fn disable_in_child() {
    DEAD.store(true, Ordering::Release);
    MODE.store(0, Ordering::Release);
}

/// Set once the tracer stopped capture for good because no selected step is left.
static FINISHED: AtomicBool = AtomicBool::new(false);

/// Stops capturing for good without a fault: every later record would be dropped
/// (`TTRACE_STEPS` selects no later step). NVTX, communicator tracking and a perturbed run go
/// on; `ttrace_resume()` does not capture again.
pub fn stop_capture() {
    FINISHED.store(true, Ordering::Release);
    MODE.fetch_and(!CAPTURE_BITS, Ordering::AcqRel);
}

/// `ttrace_pause()`: clears the capture bits (tracking of NVTX ranges, communicators and NCCL
/// groups continues).
pub fn pause() {
    let _ = off(0);
    MODE.fetch_and(!CAPTURE_BITS, Ordering::AcqRel);
}

/// `ttrace_resume()`: restores the configured capture bits, unless capture died.
pub fn resume() {
    let _ = off(0);
    let want = CONFIGURED.load(Ordering::Relaxed) & CAPTURE_BITS;
    let _ = MODE.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |m| {
        if dead() || m & UNINIT != 0 {
            None
        } else {
            Some(m | want)
        }
    });
}

/// Whether any capture bit is configured (a session is wanted).
pub fn configured() -> bool {
    let _ = off(0);
    CONFIGURED.load(Ordering::Relaxed) != 0 && !dead()
}
