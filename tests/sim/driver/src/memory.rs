//! Memory management, copies and memsets of the driver API (`cuMemAlloc_v2`, `cuMemcpy*`,
//! `cuMemsetD*`), served by the simulated runtime that owns memory and streams.
//!
//! Allocation and copies go through the runtime's public `cudaMalloc` / `cudaFree` /
//! `cudaMemcpy` / `cudaMemcpyAsync` / `cudaMemset` / `cudaMemsetAsync`, looked up in the
//! runtime itself (a handle `dlsym`, which `LD_PRELOAD` does not interpose): a tracer sees the
//! driver call, never a runtime call it did not make, as with NVIDIA's runtime, which is built
//! on the driver and not the other way round. The synchronous copies behave like `cudaMemcpy`
//! (the legacy default stream, synchronous with respect to the host as CUDA's "API
//! synchronization behavior" documents); the `Async` ones are ordered on `hStream` (0: the
//! legacy default stream). `cuMemcpy` / `cuMemcpyAsync` infer the direction from where the
//! ends lie (unified addressing: `cudaMemcpyDefault`).
//!
//! `cuMemsetD16` / `cuMemsetD32` repeat a 16- or 32-bit pattern, which `cudaMemset` (bytes
//! only) cannot: they enqueue a kernel through the runtime's private launch interface
//! (`sim_device::launch`), as the simulated cuBLAS does. Their destination must be aligned to
//! the element size and lie in one allocation the device reaches, else
//! `CUDA_ERROR_INVALID_VALUE`. The synchronous memsets are asynchronous with respect to the
//! host for device memory and fully synchronous for pinned host or managed memory, as CUDA's
//! "API synchronization behavior" documents.
//!
//! The other copies and memsets (2-D, 3-D, array, peer, batch, with attributes; 2-D memsets)
//! are exported with their exact signatures and return `CUDA_ERROR_NOT_SUPPORTED`.

use core::ffi::{c_int, c_uchar, c_uint, c_ulonglong, c_ushort, c_void};
use std::ffi::CStr;

use cuda_abi::cudart::{
    cudaError_t, cudaMemcpyDefault, cudaMemcpyDeviceToDevice, cudaMemcpyDeviceToHost,
    cudaMemcpyHostToDevice, cudaMemcpyKind, cudaMemoryTypeHost, cudaMemoryTypeManaged,
    cudaPointerAttributes, cudaStreamPerThread, cudaStream_t,
};
use cuda_abi::driver::*;

use crate::api::{rt_fn, runtime};

/// A runtime error as the driver reports it: the codes both APIs share keep their number
/// (`cudaErrorMemoryAllocation` is `CUDA_ERROR_OUT_OF_MEMORY`, `cudaErrorIllegalAddress` is
/// `CUDA_ERROR_ILLEGAL_ADDRESS`, ...); the runtime's own argument errors (invalid pitch,
/// symbol, host or device pointer, copy direction) are `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn cu_result(e: cudaError_t) -> CUresult {
    match e {
        0..=4 => e,
        // cudaErrorInvalidPitchValue, cudaErrorInvalidSymbol, cudaErrorInvalidHostPointer,
        // cudaErrorInvalidDevicePointer, cudaErrorInvalidMemcpyDirection, ...
        5..=99 => CUDA_ERROR_INVALID_VALUE,
        _ => e,
    }
}

/// The runtime function `name` of C type `F`, or `CUDA_ERROR_NOT_INITIALIZED` when no
/// simulated runtime is loaded.
///
/// # Safety
/// `F` must be the C signature of `name`.
unsafe fn runtime_fn<F: Copy>(name: &CStr) -> Result<F, CUresult> {
    // SAFETY: per the caller.
    unsafe { rt_fn::<F>(name) }.ok_or(CUDA_ERROR_NOT_INITIALIZED)
}

fn done(r: Result<cudaError_t, CUresult>) -> CUresult {
    match r {
        Ok(e) => cu_result(e),
        Err(e) => e,
    }
}

type MemcpyFn = unsafe extern "C" fn(*mut c_void, *const c_void, usize, cudaMemcpyKind) -> c_uint;
type MemcpyAsyncFn =
    unsafe extern "C" fn(*mut c_void, *const c_void, usize, cudaMemcpyKind, cudaStream_t) -> c_uint;

/// `cudaMemcpy(dst, src, n, kind)` of the runtime.
fn memcpy(dst: *mut c_void, src: *const c_void, n: usize, kind: cudaMemcpyKind) -> CUresult {
    memcpy_as(c"cudaMemcpy", dst, src, n, kind)
}

/// The runtime's synchronous copy `name` (`cudaMemcpy`, or `cudaMemcpy_ptds` on the calling
/// thread's default stream).
fn memcpy_as(
    name: &CStr,
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: cudaMemcpyKind,
) -> CUresult {
    // SAFETY: `cudaMemcpy`'s C signature, which `cudaMemcpy_ptds` shares.
    done(unsafe { runtime_fn::<MemcpyFn>(name) }.map(|f| {
        // SAFETY: the runtime validates both ranges against its allocations.
        unsafe { f(dst, src, n, kind) }
    }))
}

/// The stream a per-thread-default-stream call (`_ptsz`) means by `s`: 0 is the calling
/// thread's default stream (`CU_STREAM_PER_THREAD`).
fn per_thread(s: CUstream) -> CUstream {
    if s.is_null() {
        cudaStreamPerThread
    } else {
        s
    }
}

/// `cudaMemcpyAsync(dst, src, n, kind, stream)` of the runtime.
fn memcpy_async(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: cudaMemcpyKind,
    stream: CUstream,
) -> CUresult {
    // SAFETY: `cudaMemcpyAsync`'s C signature.
    done(
        unsafe { runtime_fn::<MemcpyAsyncFn>(c"cudaMemcpyAsync") }.map(|f| {
            // SAFETY: the runtime validates both ranges and the stream handle.
            unsafe { f(dst, src, n, kind, stream) }
        }),
    )
}

fn addr(p: CUdeviceptr) -> *mut c_void {
    p as usize as *mut c_void
}

// ---- Allocation ---------------------------------------------------------------------------

/// `cuMemAlloc_v2`: `bytesize` bytes of device memory on the current context's device;
/// `CUDA_ERROR_INVALID_VALUE` for a null `dptr` or a size of 0.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    type F = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_uint;
    if dptr.is_null() || bytesize == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `cudaMalloc`'s C signature.
    let r = done(unsafe { runtime_fn::<F>(c"cudaMalloc") }.map(|f| {
        // SAFETY: a valid out-pointer.
        unsafe { f(&mut p, bytesize) }
    }));
    if r == CUDA_SUCCESS {
        // SAFETY: checked non-null out-pointer from the caller.
        unsafe { dptr.write(p as usize as CUdeviceptr) };
    }
    r
}

/// `cuMemFree_v2`: frees memory `cuMemAlloc_v2` (or `cudaMalloc`) returned;
/// `CUDA_ERROR_INVALID_VALUE` for any other address.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    type F = unsafe extern "C" fn(*mut c_void) -> c_uint;
    if runtime().is_none() {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    // SAFETY: `cudaFree`'s C signature.
    done(unsafe { runtime_fn::<F>(c"cudaFree") }.map(|f| {
        // SAFETY: the runtime checks the address is one of its allocations.
        unsafe { f(addr(dptr)) }
    }))
}

// ---- Copies -------------------------------------------------------------------------------

/// `cuMemcpy`: `ByteCount` bytes between any two addresses (the direction from where they
/// lie), synchronous like `cudaMemcpy`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    ByteCount: usize,
) -> CUresult {
    memcpy(addr(dst), addr(src), ByteCount, cudaMemcpyDefault)
}

/// `cuMemcpyAsync`: `cuMemcpy` ordered on `hStream`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    memcpy_async(addr(dst), addr(src), ByteCount, cudaMemcpyDefault, hStream)
}

/// `cuMemcpyHtoD_v2`: host to device, synchronous.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dstDevice: CUdeviceptr,
    srcHost: *const c_void,
    ByteCount: usize,
) -> CUresult {
    memcpy(addr(dstDevice), srcHost, ByteCount, cudaMemcpyHostToDevice)
}

/// `cuMemcpyDtoH_v2`: device to host, synchronous.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dstHost: *mut c_void,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
) -> CUresult {
    memcpy(dstHost, addr(srcDevice), ByteCount, cudaMemcpyDeviceToHost)
}

/// `cuMemcpyDtoD_v2`: device to device (asynchronous with respect to the host, as
/// `cudaMemcpy` of device memory is).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(
    dstDevice: CUdeviceptr,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
) -> CUresult {
    memcpy(
        addr(dstDevice),
        addr(srcDevice),
        ByteCount,
        cudaMemcpyDeviceToDevice,
    )
}

/// `cuMemcpyHtoDAsync_v2`: host to device on `hStream`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dstDevice: CUdeviceptr,
    srcHost: *const c_void,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    memcpy_async(
        addr(dstDevice),
        srcHost,
        ByteCount,
        cudaMemcpyHostToDevice,
        hStream,
    )
}

/// `cuMemcpyDtoHAsync_v2`: device to host on `hStream`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dstHost: *mut c_void,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    memcpy_async(
        dstHost,
        addr(srcDevice),
        ByteCount,
        cudaMemcpyDeviceToHost,
        hStream,
    )
}

/// `cuMemcpyDtoDAsync_v2`: device to device on `hStream`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dstDevice: CUdeviceptr,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    memcpy_async(
        addr(dstDevice),
        addr(srcDevice),
        ByteCount,
        cudaMemcpyDeviceToDevice,
        hStream,
    )
}

// ---- Memsets ------------------------------------------------------------------------------

/// Completes a synchronous memset that `r` enqueued on the legacy default stream: CUDA makes
/// it synchronous with respect to the host when `dst` is pinned host or managed memory (the
/// host may read it at once), asynchronous for device memory.
fn finish_sync_memset(dst: CUdeviceptr, r: CUresult) -> CUresult {
    finish_sync_memset_on(dst, r, std::ptr::null_mut())
}

/// [`finish_sync_memset`] of a memset enqueued on `stream`.
fn finish_sync_memset_on(dst: CUdeviceptr, r: CUresult, stream: CUstream) -> CUresult {
    type Attr = unsafe extern "C" fn(*mut cudaPointerAttributes, *const c_void) -> c_uint;
    type Sync = unsafe extern "C" fn(cudaStream_t) -> c_uint;
    if r != CUDA_SUCCESS {
        return r;
    }
    // SAFETY: cudaPointerAttributes is plain data (integers and pointers): all-zero is valid.
    let mut a: cudaPointerAttributes = unsafe { std::mem::zeroed() };
    // SAFETY: `cudaPointerGetAttributes`'s C signature.
    let host_visible = unsafe { runtime_fn::<Attr>(c"cudaPointerGetAttributes") }.is_ok_and(|f| {
        // SAFETY: a valid out-pointer; the runtime only classifies the address.
        let ok = unsafe { f(&mut a, addr(dst)) } == 0;
        ok && (a.type_ == cudaMemoryTypeHost || a.type_ == cudaMemoryTypeManaged)
    });
    if !host_visible {
        return CUDA_SUCCESS;
    }
    // SAFETY: `cudaStreamSynchronize`'s C signature.
    done(
        unsafe { runtime_fn::<Sync>(c"cudaStreamSynchronize") }.map(|f| {
            // SAFETY: the stream the memset was enqueued on.
            unsafe { f(stream) }
        }),
    )
}

/// `cudaMemset` (`stream` None) or `cudaMemsetAsync` of the runtime.
fn memset_bytes(dst: CUdeviceptr, value: c_uchar, n: usize, stream: Option<CUstream>) -> CUresult {
    type Sync = unsafe extern "C" fn(*mut c_void, c_int, usize) -> c_uint;
    type Async = unsafe extern "C" fn(*mut c_void, c_int, usize, cudaStream_t) -> c_uint;
    let v = c_int::from(value);
    done(match stream {
        // SAFETY: `cudaMemset`'s C signature.
        None => unsafe { runtime_fn::<Sync>(c"cudaMemset") }.map(|f| {
            // SAFETY: the runtime validates the range.
            unsafe { f(addr(dst), v, n) }
        }),
        // SAFETY: `cudaMemsetAsync`'s C signature.
        Some(s) => unsafe { runtime_fn::<Async>(c"cudaMemsetAsync") }.map(|f| {
            // SAFETY: the runtime validates the range and the stream.
            unsafe { f(addr(dst), v, n, s) }
        }),
    })
}

/// Fills `n` elements of the little-endian `pattern` (2 or 4 bytes) at `dst`, as a kernel on
/// `stream` (the legacy default stream for the synchronous calls).
fn memset_pattern<const W: usize>(
    dst: CUdeviceptr,
    pattern: [u8; W],
    n: usize,
    stream: CUstream,
) -> CUresult {
    if runtime().is_none() {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if !dst.is_multiple_of(W as CUdeviceptr) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if n == 0 {
        return CUDA_SUCCESS;
    }
    let Some(len) = n.checked_mul(W) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let Some(dev) = sim_device::device_access(addr(dst), len) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    cu_result(sim_device::launch(stream, move || {
        // SAFETY: the range was validated as device-accessible; the stream orders this kernel
        // after and before every other access to it.
        let bytes = unsafe { dev.slice_mut(len) };
        for chunk in bytes.chunks_exact_mut(W) {
            chunk.copy_from_slice(&pattern);
        }
        Ok(())
    }))
}

/// `cuMemsetD8_v2`: `N` bytes set to `uc` (legacy default stream).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dstDevice: CUdeviceptr, uc: c_uchar, N: usize) -> CUresult {
    finish_sync_memset(dstDevice, memset_bytes(dstDevice, uc, N, None))
}

/// `cuMemsetD16_v2`: `N` 16-bit values set to `us`; `dstDevice` 2-byte aligned.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16_v2(
    dstDevice: CUdeviceptr,
    us: c_ushort,
    N: usize,
) -> CUresult {
    let r = memset_pattern(dstDevice, us.to_le_bytes(), N, std::ptr::null_mut());
    finish_sync_memset(dstDevice, r)
}

/// `cuMemsetD32_v2`: `N` 32-bit values set to `ui`; `dstDevice` 4-byte aligned.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2(dstDevice: CUdeviceptr, ui: c_uint, N: usize) -> CUresult {
    let r = memset_pattern(dstDevice, ui.to_le_bytes(), N, std::ptr::null_mut());
    finish_sync_memset(dstDevice, r)
}

/// `cuMemsetD8Async`: `cuMemsetD8_v2` on `hStream`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(
    dstDevice: CUdeviceptr,
    uc: c_uchar,
    N: usize,
    hStream: CUstream,
) -> CUresult {
    memset_bytes(dstDevice, uc, N, Some(hStream))
}

/// `cuMemsetD16Async`: `cuMemsetD16_v2` on `hStream`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16Async(
    dstDevice: CUdeviceptr,
    us: c_ushort,
    N: usize,
    hStream: CUstream,
) -> CUresult {
    memset_pattern(dstDevice, us.to_le_bytes(), N, hStream)
}

/// `cuMemsetD32Async`: `cuMemsetD32_v2` on `hStream`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async(
    dstDevice: CUdeviceptr,
    ui: c_uint,
    N: usize,
    hStream: CUstream,
) -> CUresult {
    memset_pattern(dstDevice, ui.to_le_bytes(), N, hStream)
}

// ---- Per-thread default stream spellings --------------------------------------------------
// What a program built with `CUDA_API_PER_THREAD_DEFAULT_STREAM` calls: the synchronous
// `_ptds` copies and memsets use the calling thread's default stream, and the `Async` `_ptsz`
// ones take 0 to mean it.

/// `cuMemcpy` on the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy_ptds(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    ByteCount: usize,
) -> CUresult {
    memcpy_as(
        c"cudaMemcpy_ptds",
        addr(dst),
        addr(src),
        ByteCount,
        cudaMemcpyDefault,
    )
}

/// `cuMemcpyAsync`, stream 0 meaning the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync_ptsz(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    memcpy_async(
        addr(dst),
        addr(src),
        ByteCount,
        cudaMemcpyDefault,
        per_thread(hStream),
    )
}

/// `cuMemcpyHtoD_v2` on the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2_ptds(
    dstDevice: CUdeviceptr,
    srcHost: *const c_void,
    ByteCount: usize,
) -> CUresult {
    memcpy_as(
        c"cudaMemcpy_ptds",
        addr(dstDevice),
        srcHost,
        ByteCount,
        cudaMemcpyHostToDevice,
    )
}

/// `cuMemcpyDtoH_v2` on the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2_ptds(
    dstHost: *mut c_void,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
) -> CUresult {
    memcpy_as(
        c"cudaMemcpy_ptds",
        dstHost,
        addr(srcDevice),
        ByteCount,
        cudaMemcpyDeviceToHost,
    )
}

/// `cuMemcpyDtoD_v2` on the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2_ptds(
    dstDevice: CUdeviceptr,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
) -> CUresult {
    memcpy_as(
        c"cudaMemcpy_ptds",
        addr(dstDevice),
        addr(srcDevice),
        ByteCount,
        cudaMemcpyDeviceToDevice,
    )
}

/// `cuMemcpyHtoDAsync_v2`, stream 0 meaning the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2_ptsz(
    dstDevice: CUdeviceptr,
    srcHost: *const c_void,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    memcpy_async(
        addr(dstDevice),
        srcHost,
        ByteCount,
        cudaMemcpyHostToDevice,
        per_thread(hStream),
    )
}

/// `cuMemcpyDtoHAsync_v2`, stream 0 meaning the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2_ptsz(
    dstHost: *mut c_void,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    memcpy_async(
        dstHost,
        addr(srcDevice),
        ByteCount,
        cudaMemcpyDeviceToHost,
        per_thread(hStream),
    )
}

/// `cuMemcpyDtoDAsync_v2`, stream 0 meaning the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2_ptsz(
    dstDevice: CUdeviceptr,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    memcpy_async(
        addr(dstDevice),
        addr(srcDevice),
        ByteCount,
        cudaMemcpyDeviceToDevice,
        per_thread(hStream),
    )
}

/// `cuMemsetD8_v2` on the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2_ptds(
    dstDevice: CUdeviceptr,
    uc: c_uchar,
    N: usize,
) -> CUresult {
    let r = memset_bytes(dstDevice, uc, N, Some(cudaStreamPerThread));
    finish_sync_memset_on(dstDevice, r, cudaStreamPerThread)
}

/// `cuMemsetD16_v2` on the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16_v2_ptds(
    dstDevice: CUdeviceptr,
    us: c_ushort,
    N: usize,
) -> CUresult {
    let r = memset_pattern(dstDevice, us.to_le_bytes(), N, cudaStreamPerThread);
    finish_sync_memset_on(dstDevice, r, cudaStreamPerThread)
}

/// `cuMemsetD32_v2` on the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2_ptds(
    dstDevice: CUdeviceptr,
    ui: c_uint,
    N: usize,
) -> CUresult {
    let r = memset_pattern(dstDevice, ui.to_le_bytes(), N, cudaStreamPerThread);
    finish_sync_memset_on(dstDevice, r, cudaStreamPerThread)
}

/// `cuMemsetD8Async`, stream 0 meaning the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async_ptsz(
    dstDevice: CUdeviceptr,
    uc: c_uchar,
    N: usize,
    hStream: CUstream,
) -> CUresult {
    memset_bytes(dstDevice, uc, N, Some(per_thread(hStream)))
}

/// `cuMemsetD16Async`, stream 0 meaning the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16Async_ptsz(
    dstDevice: CUdeviceptr,
    us: c_ushort,
    N: usize,
    hStream: CUstream,
) -> CUresult {
    memset_pattern(dstDevice, us.to_le_bytes(), N, per_thread(hStream))
}

/// `cuMemsetD32Async`, stream 0 meaning the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async_ptsz(
    dstDevice: CUdeviceptr,
    ui: c_uint,
    N: usize,
    hStream: CUstream,
) -> CUresult {
    memset_pattern(dstDevice, ui.to_le_bytes(), N, per_thread(hStream))
}

// ---- Not simulated ------------------------------------------------------------------------
// The 2-D, 3-D, array, peer, batch and attribute copies and the 2-D memsets: exported with
// their exact signatures (libttrace.so hooks them as gaps) and refused.

/// `cuMemcpyPeer`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeer(
    _dstDevice: CUdeviceptr,
    _dstContext: CUcontext,
    _srcDevice: CUdeviceptr,
    _srcContext: CUcontext,
    _ByteCount: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyDtoA_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoA_v2(
    _dstArray: CUarray,
    _dstOffset: usize,
    _srcDevice: CUdeviceptr,
    _ByteCount: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyAtoD_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAtoD_v2(
    _dstDevice: CUdeviceptr,
    _srcArray: CUarray,
    _srcOffset: usize,
    _ByteCount: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyHtoA_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoA_v2(
    _dstArray: CUarray,
    _dstOffset: usize,
    _srcHost: *const c_void,
    _ByteCount: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyAtoH_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAtoH_v2(
    _dstHost: *mut c_void,
    _srcArray: CUarray,
    _srcOffset: usize,
    _ByteCount: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyAtoA_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAtoA_v2(
    _dstArray: CUarray,
    _dstOffset: usize,
    _srcArray: CUarray,
    _srcOffset: usize,
    _ByteCount: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy2D_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2(_pCopy: *const CUDA_MEMCPY2D) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy2DUnaligned_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(_pCopy: *const CUDA_MEMCPY2D) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy3D_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3D_v2(_pCopy: *const CUDA_MEMCPY3D) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy3DPeer`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DPeer(_pCopy: *const CUDA_MEMCPY3D_PEER) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyPeerAsync`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeerAsync(
    _dstDevice: CUdeviceptr,
    _dstContext: CUcontext,
    _srcDevice: CUdeviceptr,
    _srcContext: CUcontext,
    _ByteCount: usize,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyHtoAAsync_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoAAsync_v2(
    _dstArray: CUarray,
    _dstOffset: usize,
    _srcHost: *const c_void,
    _ByteCount: usize,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyAtoHAsync_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAtoHAsync_v2(
    _dstHost: *mut c_void,
    _srcArray: CUarray,
    _srcOffset: usize,
    _ByteCount: usize,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy2DAsync_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(
    _pCopy: *const CUDA_MEMCPY2D,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy3DAsync_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DAsync_v2(
    _pCopy: *const CUDA_MEMCPY3D,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy3DPeerAsync`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DPeerAsync(
    _pCopy: *const CUDA_MEMCPY3D_PEER,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyBatchAsync`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[cfg(not(sim_cuda13))]
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyBatchAsync(
    _dsts: *mut CUdeviceptr,
    _srcs: *mut CUdeviceptr,
    _sizes: *mut usize,
    _count: usize,
    _attrs: *mut CUmemcpyAttributes,
    _attrsIdxs: *mut usize,
    _numAttrs: usize,
    _failIdx: *mut usize,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy3DBatchAsync`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[cfg(not(sim_cuda13))]
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DBatchAsync(
    _numOps: usize,
    _opList: *mut CUDA_MEMCPY3D_BATCH_OP,
    _failIdx: *mut usize,
    _flags: c_ulonglong,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemsetD2D8_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8_v2(
    _dstDevice: CUdeviceptr,
    _dstPitch: usize,
    _uc: c_uchar,
    _Width: usize,
    _Height: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemsetD2D16_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D16_v2(
    _dstDevice: CUdeviceptr,
    _dstPitch: usize,
    _us: c_ushort,
    _Width: usize,
    _Height: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemsetD2D32_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32_v2(
    _dstDevice: CUdeviceptr,
    _dstPitch: usize,
    _ui: c_uint,
    _Width: usize,
    _Height: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemsetD2D8Async`: `Height` rows of `Width` bytes, `dstPitch` apart, set to `uc` on
/// `hStream`, through the runtime's `cudaMemset2DAsync` (which validates the extent). The one
/// 2-D driver memset simulated: tracers record it as a gap, and a test needs it to succeed.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8Async(
    dstDevice: CUdeviceptr,
    dstPitch: usize,
    uc: c_uchar,
    Width: usize,
    Height: usize,
    hStream: CUstream,
) -> CUresult {
    type Async =
        unsafe extern "C" fn(*mut c_void, usize, c_int, usize, usize, cudaStream_t) -> c_uint;
    done(
        // SAFETY: `cudaMemset2DAsync`'s C signature.
        unsafe { runtime_fn::<Async>(c"cudaMemset2DAsync") }.map(|f| {
            // SAFETY: the runtime validates the extent and the stream.
            unsafe {
                f(
                    addr(dstDevice),
                    dstPitch,
                    c_int::from(uc),
                    Width,
                    Height,
                    hStream,
                )
            }
        }),
    )
}

/// `cuMemsetD2D16Async`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D16Async(
    _dstDevice: CUdeviceptr,
    _dstPitch: usize,
    _us: c_ushort,
    _Width: usize,
    _Height: usize,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemsetD2D32Async`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32Async(
    _dstDevice: CUdeviceptr,
    _dstPitch: usize,
    _ui: c_uint,
    _Width: usize,
    _Height: usize,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyBatchAsync_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyBatchAsync_v2(
    _dsts: *mut CUdeviceptr,
    _srcs: *mut CUdeviceptr,
    _sizes: *mut usize,
    _count: usize,
    _attrs: *mut CUmemcpyAttributes,
    _attrsIdxs: *mut usize,
    _numAttrs: usize,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy3DBatchAsync_v2`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DBatchAsync_v2(
    _numOps: usize,
    _opList: *mut CUDA_MEMCPY3D_BATCH_OP,
    _flags: c_ulonglong,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyWithAttributesAsync`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyWithAttributesAsync(
    _dst: CUdeviceptr,
    _src: CUdeviceptr,
    _size: usize,
    _attr: *mut CUmemcpyAttributes,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy3DWithAttributesAsync`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DWithAttributesAsync(
    _op: *mut CUDA_MEMCPY3D_BATCH_OP,
    _flags: c_ulonglong,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

// Their per-thread default stream spellings, refused alike.

/// `cuMemcpyPeer_ptds`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeer_ptds(
    _dstDevice: CUdeviceptr,
    _dstContext: CUcontext,
    _srcDevice: CUdeviceptr,
    _srcContext: CUcontext,
    _ByteCount: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyDtoA_v2_ptds`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoA_v2_ptds(
    _dstArray: CUarray,
    _dstOffset: usize,
    _srcDevice: CUdeviceptr,
    _ByteCount: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyAtoD_v2_ptds`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAtoD_v2_ptds(
    _dstDevice: CUdeviceptr,
    _srcArray: CUarray,
    _srcOffset: usize,
    _ByteCount: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyHtoA_v2_ptds`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoA_v2_ptds(
    _dstArray: CUarray,
    _dstOffset: usize,
    _srcHost: *const c_void,
    _ByteCount: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyAtoH_v2_ptds`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAtoH_v2_ptds(
    _dstHost: *mut c_void,
    _srcArray: CUarray,
    _srcOffset: usize,
    _ByteCount: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyAtoA_v2_ptds`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAtoA_v2_ptds(
    _dstArray: CUarray,
    _dstOffset: usize,
    _srcArray: CUarray,
    _srcOffset: usize,
    _ByteCount: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy2D_v2_ptds`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2_ptds(_pCopy: *const CUDA_MEMCPY2D) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy2DUnaligned_v2_ptds`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2_ptds(_pCopy: *const CUDA_MEMCPY2D) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy3D_v2_ptds`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3D_v2_ptds(_pCopy: *const CUDA_MEMCPY3D) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy3DPeer_ptds`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DPeer_ptds(_pCopy: *const CUDA_MEMCPY3D_PEER) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyPeerAsync_ptsz`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeerAsync_ptsz(
    _dstDevice: CUdeviceptr,
    _dstContext: CUcontext,
    _srcDevice: CUdeviceptr,
    _srcContext: CUcontext,
    _ByteCount: usize,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyHtoAAsync_v2_ptsz`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoAAsync_v2_ptsz(
    _dstArray: CUarray,
    _dstOffset: usize,
    _srcHost: *const c_void,
    _ByteCount: usize,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyAtoHAsync_v2_ptsz`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAtoHAsync_v2_ptsz(
    _dstHost: *mut c_void,
    _srcArray: CUarray,
    _srcOffset: usize,
    _ByteCount: usize,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy2DAsync_v2_ptsz`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2_ptsz(
    _pCopy: *const CUDA_MEMCPY2D,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy3DAsync_v2_ptsz`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DAsync_v2_ptsz(
    _pCopy: *const CUDA_MEMCPY3D,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy3DPeerAsync_ptsz`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DPeerAsync_ptsz(
    _pCopy: *const CUDA_MEMCPY3D_PEER,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemsetD2D8_v2_ptds`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8_v2_ptds(
    _dstDevice: CUdeviceptr,
    _dstPitch: usize,
    _uc: c_uchar,
    _Width: usize,
    _Height: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemsetD2D16_v2_ptds`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D16_v2_ptds(
    _dstDevice: CUdeviceptr,
    _dstPitch: usize,
    _us: c_ushort,
    _Width: usize,
    _Height: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemsetD2D32_v2_ptds`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32_v2_ptds(
    _dstDevice: CUdeviceptr,
    _dstPitch: usize,
    _ui: c_uint,
    _Width: usize,
    _Height: usize,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemsetD2D16Async_ptsz`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D16Async_ptsz(
    _dstDevice: CUdeviceptr,
    _dstPitch: usize,
    _us: c_ushort,
    _Width: usize,
    _Height: usize,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemsetD2D32Async_ptsz`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D32Async_ptsz(
    _dstDevice: CUdeviceptr,
    _dstPitch: usize,
    _ui: c_uint,
    _Width: usize,
    _Height: usize,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyBatchAsync_ptsz`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[cfg(not(sim_cuda13))]
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyBatchAsync_ptsz(
    _dsts: *mut CUdeviceptr,
    _srcs: *mut CUdeviceptr,
    _sizes: *mut usize,
    _count: usize,
    _attrs: *mut CUmemcpyAttributes,
    _attrsIdxs: *mut usize,
    _numAttrs: usize,
    _failIdx: *mut usize,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy3DBatchAsync_ptsz`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[cfg(not(sim_cuda13))]
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DBatchAsync_ptsz(
    _numOps: usize,
    _opList: *mut CUDA_MEMCPY3D_BATCH_OP,
    _failIdx: *mut usize,
    _flags: c_ulonglong,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyBatchAsync_v2_ptsz`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyBatchAsync_v2_ptsz(
    _dsts: *mut CUdeviceptr,
    _srcs: *mut CUdeviceptr,
    _sizes: *mut usize,
    _count: usize,
    _attrs: *mut CUmemcpyAttributes,
    _attrsIdxs: *mut usize,
    _numAttrs: usize,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy3DBatchAsync_v2_ptsz`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DBatchAsync_v2_ptsz(
    _numOps: usize,
    _opList: *mut CUDA_MEMCPY3D_BATCH_OP,
    _flags: c_ulonglong,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpyWithAttributesAsync_ptsz`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyWithAttributesAsync_ptsz(
    _dst: CUdeviceptr,
    _src: CUdeviceptr,
    _size: usize,
    _attr: *mut CUmemcpyAttributes,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemcpy3DWithAttributesAsync_ptsz`: not simulated (`CUDA_ERROR_NOT_SUPPORTED`).
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DWithAttributesAsync_ptsz(
    _op: *mut CUDA_MEMCPY3D_BATCH_OP,
    _flags: c_ulonglong,
    _hStream: CUstream,
) -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMemsetD2D8Async`, stream 0 meaning the calling thread's default stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD2D8Async_ptsz(
    dstDevice: CUdeviceptr,
    dstPitch: usize,
    uc: c_uchar,
    Width: usize,
    Height: usize,
    hStream: CUstream,
) -> CUresult {
    // SAFETY: the caller's arguments, on the stream they mean.
    unsafe { cuMemsetD2D8Async(dstDevice, dstPitch, uc, Width, Height, per_thread(hStream)) }
}
