//! Simulated `libnccl.so.2` (NCCL 2.27.5 ABI): collectives and point-to-point between ranks in
//! different processes (or threads), through shared memory, on the simulated CUDA runtime.
//!
//! What tracers depend on, and this library reproduces:
//! * **Asynchrony.** A call validates its arguments and enqueues a kernel on its stream through
//!   the runtime's private launch interface (`sim_device::launch`); the kernel blocks that
//!   stream until every rank arrived. The call itself returns at once.
//! * **Groups.** Inside `ncclGroupStart`/`ncclGroupEnd` (nestable, per thread) calls are only
//!   recorded; everything launches at the outermost `ncclGroupEnd`. Sends and receives of one
//!   group progress concurrently (no deadlock when messages exceed the mailbox).
//! * **Numerics.** Reductions run in the buffer's dtype in NCCL's ring order, rounding after every
//!   hop (`sim_kernels::reduce`); all ranks get identical bits. `ncclAvg` is NCCL's
//!   pre-multiplied sum by `1/n` for floating types (sum then truncating division for integers),
//!   not a division of the sum.
//! * **Failure.** A peer that dies (or aborts) makes the others' kernels fail within a fraction
//!   of a second with `cudaErrorLaunchFailure`; `ncclCommGetAsyncError` then reports
//!   `ncclRemoteError` and later calls on the communicator return it. A buffer that is not
//!   device-accessible faults the kernel (`cudaErrorIllegalAddress`, like real NCCL with its
//!   default `NCCL_CHECK_POINTERS=0`), or is refused with `ncclInvalidArgument` at the call
//!   when `NCCL_CHECK_POINTERS=1`. Every wait gives up after `SIM_NCCL_TIMEOUT` seconds
//!   (default 300).
//!
//! * **Graphs.** A collective enqueued on a capturing stream runs at every launch of the graph,
//!   taking its place in the communicator's order at the `cudaGraphLaunch` call (eager
//!   collectives issued between capture and launch do not wait for it; those issued after the
//!   launch come after it, as the stream runs them after the replay).
//!
//! Bootstrap: `ncclGetUniqueId` returns a random id, or, when `NCCL_COMM_ID` ("host:port" of
//! the bootstrap root) is set, an id derived from it and from how many ids the process made
//! before, so that every rank's k-th call yields the same id without an out-of-band channel.
//! Split communicators get ids derived from their parent's. The transport is described in
//! `shm.rs`, the execution model (lanes, sequence numbers, stream joins) in `exec.rs`.
//!
//! Environment: `SIM_NCCL_TIMEOUT`, `SIM_NCCL_SLOT_BYTES` (staging slot, default 256 KiB),
//! `SIM_NCCL_MBOX_BYTES` (point-to-point ring, default 64 KiB), `SIM_NCCL_SHM_DIR` (default
//! `/dev/shm`), `NCCL_COMM_ID`, `NCCL_CHECK_POINTERS`, `NCCL_COMM_BLOCKING`, `NCCL_DEBUG`
//! (`WARN`/`INFO`: failures are printed to stderr).
//!
//! Known differences from NCCL: `ncclCommSplit` inside a group runs at the call (blocking), so
//! one thread cannot split several communicators of one clique in a group; a non-blocking
//! communicator (`blocking = 0`) returns `ncclInProgress` from init only, every other call
//! completes before returning.
// The exports' safety contract is NCCL's header (valid pointers of the documented sizes).
#![allow(clippy::missing_safety_doc)]

pub mod api;
#[cfg(sim_cuda13)]
pub mod api13;
pub mod api_extra;
pub mod comm;
pub mod exec;
pub mod group;
pub mod shm;

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// `ncclGetLastError`'s text: a fixed NUL-terminated buffer like NCCL's, of atomics so that a
/// concurrent update is not a data race (a reader may see a mix of two messages, as in NCCL).
static LAST_ERROR: [AtomicU8; 1024] = [const { AtomicU8::new(0) }; 1024];

/// Sets the text `ncclGetLastError` returns (and prints it when `NCCL_DEBUG` asks for warnings).
pub fn set_last_error(msg: &str) {
    let b = msg.as_bytes();
    let n = b.len().min(LAST_ERROR.len() - 1);
    for (slot, byte) in LAST_ERROR.iter().zip(&b[..n]) {
        slot.store(*byte, Relaxed);
    }
    LAST_ERROR[n].store(0, Relaxed);
    debug_warn(msg);
}

/// Pointer to the last-error text.
pub fn last_error_ptr() -> *const core::ffi::c_char {
    LAST_ERROR.as_ptr().cast()
}

/// Prints `NCCL WARN msg` to stderr when `NCCL_DEBUG` is WARN, INFO or TRACE.
pub fn debug_warn(msg: &str) {
    let on = std::env::var("NCCL_DEBUG")
        .map(|v| matches!(v.to_ascii_uppercase().as_str(), "WARN" | "INFO" | "TRACE"))
        .unwrap_or(false);
    if on {
        eprintln!("[pid {}] NCCL WARN {msg}", std::process::id());
    }
}
