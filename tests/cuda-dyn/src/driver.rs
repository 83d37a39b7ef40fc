//! CUDA driver API entry points (`cuda.h`), from `libcuda.so.1` (loaded on the first call:
//! see [`crate::LAZY_LIBRARIES`]). The `_v2` names are the ones `cuda.h`'s macros select.
use core::ffi::{c_uchar, c_uint, c_ushort, c_void};

use crate::abi::driver::*;
use crate::dyn_api;

dyn_api! {
    /// Allocates `bytesize` bytes of device memory.
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult;
    /// Frees memory from `cuMemAlloc_v2`.
    fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult;
    /// Copies between any two addresses (unified addressing), synchronously.
    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, ByteCount: usize) -> CUresult;
    /// `cuMemcpy` ordered on a stream.
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, ByteCount: usize, hStream: CUstream) -> CUresult;
    /// Host to device, synchronously.
    fn cuMemcpyHtoD_v2(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize) -> CUresult;
    /// Device to host, synchronously.
    fn cuMemcpyDtoH_v2(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize) -> CUresult;
    /// Device to device.
    fn cuMemcpyDtoD_v2(dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize) -> CUresult;
    /// Host to device on a stream.
    fn cuMemcpyHtoDAsync_v2(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize, hStream: CUstream) -> CUresult;
    /// Device to host on a stream.
    fn cuMemcpyDtoHAsync_v2(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream) -> CUresult;
    /// Device to device on a stream.
    fn cuMemcpyDtoDAsync_v2(dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream) -> CUresult;
    /// Sets `N` bytes.
    fn cuMemsetD8_v2(dstDevice: CUdeviceptr, uc: c_uchar, N: usize) -> CUresult;
    /// Sets `N` 16-bit values (2-byte aligned destination).
    fn cuMemsetD16_v2(dstDevice: CUdeviceptr, us: c_ushort, N: usize) -> CUresult;
    /// Sets `N` 32-bit values (4-byte aligned destination).
    fn cuMemsetD32_v2(dstDevice: CUdeviceptr, ui: c_uint, N: usize) -> CUresult;
    /// `cuMemsetD8_v2` on a stream.
    fn cuMemsetD8Async(dstDevice: CUdeviceptr, uc: c_uchar, N: usize, hStream: CUstream) -> CUresult;
    /// `cuMemsetD16_v2` on a stream.
    fn cuMemsetD16Async(dstDevice: CUdeviceptr, us: c_ushort, N: usize, hStream: CUstream) -> CUresult;
    /// `cuMemsetD32_v2` on a stream.
    fn cuMemsetD32Async(dstDevice: CUdeviceptr, ui: c_uint, N: usize, hStream: CUstream) -> CUresult;
    /// The name of a `CUresult`.
    fn cuGetErrorName(error: CUresult, pStr: *mut *const core::ffi::c_char) -> CUresult;
}
