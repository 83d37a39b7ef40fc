//! Error reporting: the per-thread last error, the context's sticky error, names and strings.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};

use core::ffi::c_char;
use cuda_abi::cudart::*;

thread_local! {
    static LAST_ERROR: Cell<cudaError_t> = const { Cell::new(cudaSuccess) };
}

/// A fault inside a kernel (illegal address, launch failure) poisons the context: every later
/// call that synchronises or launches returns it, as on a GPU.
static STICKY: AtomicU32 = AtomicU32::new(cudaSuccess);

/// Records a kernel fault.
pub fn set_sticky(e: cudaError_t) {
    let _ = STICKY.compare_exchange(cudaSuccess, e, Ordering::AcqRel, Ordering::Acquire);
}

/// The context's sticky error, if any.
pub fn sticky() -> Result<(), cudaError_t> {
    match STICKY.load(Ordering::Acquire) {
        cudaSuccess => Ok(()),
        e => Err(e),
    }
}

/// Returns `r` as a status code, remembering an error as the thread's last error.
pub fn status(r: Result<(), cudaError_t>) -> cudaError_t {
    match r {
        Ok(()) => cudaSuccess,
        Err(e) => {
            LAST_ERROR.with(|l| l.set(e));
            e
        }
    }
}

/// `cudaGetLastError`: returns and clears; a sticky error cannot be cleared.
pub fn take_last() -> cudaError_t {
    let e = LAST_ERROR.with(|l| l.replace(cudaSuccess));
    if e == cudaSuccess {
        STICKY.load(Ordering::Acquire)
    } else {
        e
    }
}

/// `cudaPeekAtLastError`.
pub fn peek_last() -> cudaError_t {
    let e = LAST_ERROR.with(|l| l.get());
    if e == cudaSuccess {
        STICKY.load(Ordering::Acquire)
    } else {
        e
    }
}

/// (code, name, description) as `cudaGetErrorName` / `cudaGetErrorString` give them.
const TABLE: &[(cudaError_t, &str, &str)] = &[
    (cudaSuccess, "cudaSuccess\0", "no error\0"),
    (cudaErrorInvalidValue, "cudaErrorInvalidValue\0", "invalid argument\0"),
    (cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation\0", "out of memory\0"),
    (cudaErrorInitializationError, "cudaErrorInitializationError\0", "initialization error\0"),
    (cudaErrorCudartUnloading, "cudaErrorCudartUnloading\0", "driver shutting down\0"),
    (cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration\0", "invalid configuration argument\0"),
    (cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue\0", "invalid pitch argument\0"),
    (cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer\0", "invalid device pointer\0"),
    (cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection\0", "invalid copy direction for memcpy\0"),
    (cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver\0", "CUDA driver version is insufficient for CUDA runtime version\0"),
    (cudaErrorNoDevice, "cudaErrorNoDevice\0", "no CUDA-capable device is detected\0"),
    (cudaErrorInvalidDevice, "cudaErrorInvalidDevice\0", "invalid device ordinal\0"),
    (cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice\0", "no kernel image is available for execution on the device\0"),
    (cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction\0", "invalid device function\0"),
    (cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol\0", "invalid device symbol\0"),
    (cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled\0", "peer access is already enabled\0"),
    (cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle\0", "invalid resource handle\0"),
    (cudaErrorIllegalState, "cudaErrorIllegalState\0", "the operation cannot be performed in the present state\0"),
    (cudaErrorNotReady, "cudaErrorNotReady\0", "device not ready\0"),
    (cudaErrorIllegalAddress, "cudaErrorIllegalAddress\0", "an illegal memory access was encountered\0"),
    (cudaErrorContextIsDestroyed, "cudaErrorContextIsDestroyed\0", "context is destroyed\0"),
    (cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered\0", "part or all of the requested memory range is already mapped\0"),
    (cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered\0", "pointer does not correspond to a registered memory region\0"),
    (cudaErrorLaunchFailure, "cudaErrorLaunchFailure\0", "unspecified launch failure\0"),
    (cudaErrorNotPermitted, "cudaErrorNotPermitted\0", "operation not permitted\0"),
    (cudaErrorNotSupported, "cudaErrorNotSupported\0", "operation not supported\0"),
    (cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported\0", "operation not permitted when stream is capturing\0"),
    (cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated\0", "operation failed due to a previous error during capture\0"),
    (cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge\0", "operation would result in a merge of separate capture sequences\0"),
    (cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched\0", "capture was not ended in the same stream as it began\0"),
    (cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined\0", "capturing stream has unjoined work\0"),
    (cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation\0", "dependency created on uncaptured work in another stream\0"),
    (cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit\0", "operation would make the legacy stream depend on a capturing blocking stream\0"),
    (cudaErrorCapturedEvent, "cudaErrorCapturedEvent\0", "operation not permitted on an event last recorded in a capturing stream\0"),
    (cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread\0", "attempt to terminate a thread-local capture sequence from another thread\0"),
    (cudaErrorGraphExecUpdateFailure, "cudaErrorGraphExecUpdateFailure\0", "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update\0"),
    (cudaErrorUnknown, "cudaErrorUnknown\0", "unknown error\0"),
];

/// `cudaGetErrorName`.
pub fn name(e: cudaError_t) -> *const c_char {
    TABLE
        .iter()
        .find(|(c, _, _)| *c == e)
        .map_or(c"cudaErrorUnknown".as_ptr(), |(_, n, _)| n.as_ptr().cast())
}

/// `cudaGetErrorString`.
pub fn string(e: cudaError_t) -> *const c_char {
    TABLE
        .iter()
        .find(|(c, _, _)| *c == e)
        .map_or(c"unrecognized error code".as_ptr(), |(_, _, s)| {
            s.as_ptr().cast()
        })
}
