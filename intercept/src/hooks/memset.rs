//! `cudaMemset*` hooks: a memset writes device memory, so it is recorded (a `memset` record
//! with the byte value and the extent, no tensor: they say all that was written), in the op
//! order of its stream, like a copy. Without the record, a buffer zeroed before a GEMM or a
//! collective reads it would seem last written by whatever op wrote it before.
//!
//! Memsets are captured with the copies (`--apis memcpy`). Synchronous spellings run on the
//! legacy default stream (`_ptds`: the per-thread one). The pointer-array tracking
//! ([`crate::uploads`]) does not follow memsets: a pointer array partly cleared on the device
//! differs from its upload, which the tracer's check of the array's snapshot finds (a gap). Each signature is written once, in a
//! [`memset_hook!`] invocation; the real function is looked up under the hook's name.

use core::ffi::{c_int, c_void};

use cuda_abi::cudart::*;
use ttrace_proto::record::{MemsetOp, Op};

use crate::cuda::MISSING;
use crate::{mode, real};

/// The legacy default stream, as synchronous memsets use it (recorded as 0).
const LEGACY: cudaStream_t = core::ptr::null_mut();

/// The stream a `_ptsz` call means by 0.
fn per_thread(s: cudaStream_t) -> cudaStream_t {
    if s.is_null() {
        cudaStreamPerThread
    } else {
        s
    }
}

/// A 1-D memset of `count` bytes.
fn linear(dst: *mut c_void, value: c_int, count: usize) -> MemsetOp {
    rows(dst, count, value, count, 1)
}

/// A 2-D memset: `height` rows of `width` bytes, `pitch` bytes apart.
fn rows(dst: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize) -> MemsetOp {
    MemsetOp {
        dst: dst as u64,
        // CUDA sets each byte to `value` converted to `unsigned char`.
        value: value as u8,
        width: width as u64,
        height: height as u64,
        depth: 1,
        pitch: pitch as u64,
        slice_pitch: (pitch as u64).saturating_mul(height as u64),
    }
}

/// A 3-D memset: slices are `pitch * ysize` bytes apart.
fn pitched(p: cudaPitchedPtr, value: c_int, e: cudaExtent) -> MemsetOp {
    MemsetOp {
        depth: e.depth as u64,
        slice_pitch: (p.pitch as u64).saturating_mul(p.ysize as u64),
        ..rows(p.ptr, p.pitch, value, e.width, e.height)
    }
}

/// The capturing path of every memset hook (`None` from planning: nothing written).
fn capture(
    api: &'static str,
    op: MemsetOp,
    stream: cudaStream_t,
    real: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    crate::around_metadata(
        api,
        stream,
        || (op.bytes() > 0).then_some(Op::Memset(op)),
        real,
        |r| r == cudaSuccess,
    )
}

/// One `cudaMemset*` entry point: `name(C signature) => (stream) MemsetOp`. The real function
/// is called exactly once with the program's arguments, and its status returned.
macro_rules! memset_hook {
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? ) => ($stream:expr) $op:expr) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> cudaError_t {
            let Some(real) = real::real_of!($name, fn($($t),*) -> cudaError_t, Cudart) else {
                return MISSING;
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            let run = || unsafe { real($($a),*) };
            if mode::off(mode::MEMCPY) {
                return run();
            }
            capture(stringify!($name), $op, $stream, run)
        }
    };
}

memset_hook! {
    /// `cudaError_t cudaMemset(void* devPtr, int value, size_t count)`.
    cudaMemset(devPtr: *mut c_void, value: c_int, count: usize) => (LEGACY)
    linear(devPtr, value, count)
}

memset_hook! {
    /// `cudaMemset` for code built with `--default-stream per-thread`.
    cudaMemset_ptds(devPtr: *mut c_void, value: c_int, count: usize) => (cudaStreamPerThread)
    linear(devPtr, value, count)
}

memset_hook! {
    /// `cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream)`.
    cudaMemsetAsync(devPtr: *mut c_void, value: c_int, count: usize, stream: cudaStream_t)
    => (stream) linear(devPtr, value, count)
}

memset_hook! {
    /// `cudaMemsetAsync` for code built with `--default-stream per-thread`.
    cudaMemsetAsync_ptsz(devPtr: *mut c_void, value: c_int, count: usize, stream: cudaStream_t)
    => (per_thread(stream)) linear(devPtr, value, count)
}

memset_hook! {
    /// `cudaError_t cudaMemset2D(void* devPtr, size_t pitch, int value, size_t width, size_t
    /// height)`.
    cudaMemset2D(devPtr: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize)
    => (LEGACY) rows(devPtr, pitch, value, width, height)
}

memset_hook! {
    /// `cudaMemset2D` for code built with `--default-stream per-thread`.
    cudaMemset2D_ptds(
        devPtr: *mut c_void,
        pitch: usize,
        value: c_int,
        width: usize,
        height: usize,
    ) => (cudaStreamPerThread) rows(devPtr, pitch, value, width, height)
}

memset_hook! {
    /// `cudaError_t cudaMemset2DAsync(void* devPtr, size_t pitch, int value, size_t width,
    /// size_t height, cudaStream_t stream)`.
    cudaMemset2DAsync(
        devPtr: *mut c_void,
        pitch: usize,
        value: c_int,
        width: usize,
        height: usize,
        stream: cudaStream_t,
    ) => (stream) rows(devPtr, pitch, value, width, height)
}

memset_hook! {
    /// `cudaMemset2DAsync` for code built with `--default-stream per-thread`.
    cudaMemset2DAsync_ptsz(
        devPtr: *mut c_void,
        pitch: usize,
        value: c_int,
        width: usize,
        height: usize,
        stream: cudaStream_t,
    ) => (per_thread(stream)) rows(devPtr, pitch, value, width, height)
}

memset_hook! {
    /// `cudaError_t cudaMemset3D(cudaPitchedPtr pitchedDevPtr, int value, cudaExtent extent)`.
    cudaMemset3D(pitchedDevPtr: cudaPitchedPtr, value: c_int, extent: cudaExtent) => (LEGACY)
    pitched(pitchedDevPtr, value, extent)
}

memset_hook! {
    /// `cudaMemset3D` for code built with `--default-stream per-thread`.
    cudaMemset3D_ptds(pitchedDevPtr: cudaPitchedPtr, value: c_int, extent: cudaExtent)
    => (cudaStreamPerThread) pitched(pitchedDevPtr, value, extent)
}

memset_hook! {
    /// `cudaError_t cudaMemset3DAsync(cudaPitchedPtr pitchedDevPtr, int value, cudaExtent
    /// extent, cudaStream_t stream)`.
    cudaMemset3DAsync(
        pitchedDevPtr: cudaPitchedPtr,
        value: c_int,
        extent: cudaExtent,
        stream: cudaStream_t,
    ) => (stream) pitched(pitchedDevPtr, value, extent)
}

memset_hook! {
    /// `cudaMemset3DAsync` for code built with `--default-stream per-thread`.
    cudaMemset3DAsync_ptsz(
        pitchedDevPtr: cudaPitchedPtr,
        value: c_int,
        extent: cudaExtent,
        stream: cudaStream_t,
    ) => (per_thread(stream)) pitched(pitchedDevPtr, value, extent)
}
