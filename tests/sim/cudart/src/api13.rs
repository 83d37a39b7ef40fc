//! Entry points of the CUDA 13 runtime that PyTorch 2.15 imports and the CUDA 12 build does not
//! export (their CUDA 12 forms differ or PyTorch 2.10 does not use them). Device code cannot
//! run here, so libraries of device code cannot be loaded (`cudaErrorNoKernelImageForDevice`,
//! as for a binary without an image for the device) and the graph-building APIs the simulator's
//! linear graphs cannot represent are refused with `cudaErrorNotSupported`.

use core::ffi::{c_char, c_int, c_uint, c_void};

use cuda_abi::cudart::*;

use crate::{guard, rt};

fn no_image() -> Result<(), cudaError_t> {
    rt()?;
    Err(cudaErrorNoKernelImageForDevice)
}

fn unsupported() -> Result<(), cudaError_t> {
    rt()?;
    Err(cudaErrorNotSupported)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn __cudaGetKernel(
    _kernel: *mut cudaKernel_t,
    entry: *const c_void,
) -> cudaError_t {
    // CUDA 13's `<<<>>>` looks the kernel up by its host stub first: refused here, naming it.
    guard(|| crate::api_kernel::no_image(entry, "__cudaGetKernel"))
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn __cudaLaunchKernel(
    _kernel: cudaKernel_t,
    _grid: dim3,
    _block: dim3,
    _args: *mut *mut c_void,
    _shared: usize,
    _stream: cudaStream_t,
) -> cudaError_t {
    guard(no_image)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaLaunchCooperativeKernel(
    _func: *const c_void,
    _grid: dim3,
    _block: dim3,
    _args: *mut *mut c_void,
    _shared: usize,
    _stream: cudaStream_t,
) -> cudaError_t {
    guard(no_image)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaOccupancyMaxActiveBlocksPerMultiprocessor(
    _num_blocks: *mut c_int,
    _func: *const c_void,
    _block_size: c_int,
    _dynamic_smem: usize,
) -> cudaError_t {
    guard(no_image)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaKernelSetAttributeForDevice(
    _kernel: cudaKernel_t,
    _attr: cudaFuncAttribute,
    _value: c_int,
    _device: c_int,
) -> cudaError_t {
    guard(no_image)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaLibraryLoadData(
    _library: *mut cudaLibrary_t,
    _code: *const c_void,
    _jit_options: *mut cudaJitOption,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut cudaLibraryOption,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> cudaError_t {
    guard(no_image)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaLibraryLoadFromFile(
    _library: *mut cudaLibrary_t,
    _file: *const c_char,
    _jit_options: *mut cudaJitOption,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut cudaLibraryOption,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> cudaError_t {
    guard(no_image)
}

/// No library can be loaded, so every library handle is invalid.
fn bad_library() -> Result<(), cudaError_t> {
    rt()?;
    Err(cudaErrorInvalidResourceHandle)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaLibraryUnload(_library: cudaLibrary_t) -> cudaError_t {
    guard(bad_library)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaLibraryGetKernel(
    _kernel: *mut cudaKernel_t,
    _library: cudaLibrary_t,
    _name: *const c_char,
) -> cudaError_t {
    guard(bad_library)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaLibraryGetKernelCount(
    _count: *mut c_uint,
    _library: cudaLibrary_t,
) -> cudaError_t {
    guard(bad_library)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaLibraryGetGlobal(
    _dptr: *mut *mut c_void,
    _bytes: *mut usize,
    _library: cudaLibrary_t,
    _name: *const c_char,
) -> cudaError_t {
    guard(bad_library)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaLibraryGetManaged(
    _dptr: *mut *mut c_void,
    _bytes: *mut usize,
    _library: cudaLibrary_t,
    _name: *const c_char,
) -> cudaError_t {
    guard(bad_library)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaLibraryGetUnifiedFunction(
    _fptr: *mut *mut c_void,
    _library: cudaLibrary_t,
    _symbol: *const c_char,
) -> cudaError_t {
    guard(bad_library)
}

/// Managed memory is not simulated (docs/sim.md).
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaMallocManaged(
    _ptr: *mut *mut c_void,
    _size: usize,
    _flags: c_uint,
) -> cudaError_t {
    guard(unsupported)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaGraphAddNode(
    _node: *mut cudaGraphNode_t,
    _graph: cudaGraph_t,
    _deps: *const cudaGraphNode_t,
    _edge_data: *const cudaGraphEdgeData,
    _num_deps: usize,
    _params: *mut cudaGraphNodeParams,
) -> cudaError_t {
    guard(unsupported)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaGraphConditionalHandleCreate(
    _handle: *mut cudaGraphConditionalHandle,
    _graph: cudaGraph_t,
    _default_value: c_uint,
    _flags: c_uint,
) -> cudaError_t {
    guard(unsupported)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaUserObjectCreate(
    _object: *mut cudaUserObject_t,
    _ptr: *mut c_void,
    _destroy: cudaHostFn_t,
    _refcount: c_uint,
    _flags: c_uint,
) -> cudaError_t {
    guard(unsupported)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaUserObjectRelease(
    _object: cudaUserObject_t,
    _count: c_uint,
) -> cudaError_t {
    guard(unsupported)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaGraphRetainUserObject(
    _graph: cudaGraph_t,
    _object: cudaUserObject_t,
    _count: c_uint,
    _flags: c_uint,
) -> cudaError_t {
    guard(unsupported)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCaptureToGraph(
    _stream: cudaStream_t,
    _graph: cudaGraph_t,
    _deps: *const cudaGraphNode_t,
    _edge_data: *const cudaGraphEdgeData,
    _num_deps: usize,
    _mode: cudaStreamCaptureMode,
) -> cudaError_t {
    guard(unsupported)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaStreamUpdateCaptureDependencies(
    _stream: cudaStream_t,
    _deps: *mut cudaGraphNode_t,
    _edge_data: *const cudaGraphEdgeData,
    _num_deps: usize,
    _flags: c_uint,
) -> cudaError_t {
    guard(unsupported)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetGraphMemAttribute(
    device: c_int,
    _attr: cudaGraphMemAttributeType,
    _value: *mut c_void,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        if device < 0 || device >= r.device_count() {
            return Err(cudaErrorInvalidDevice);
        }
        Err(cudaErrorNotSupported)
    })
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceSetGraphMemAttribute(
    device: c_int,
    _attr: cudaGraphMemAttributeType,
    _value: *mut c_void,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        if device < 0 || device >= r.device_count() {
            return Err(cudaErrorInvalidDevice);
        }
        Err(cudaErrorNotSupported)
    })
}
