//! Entry points of the CUDA 13 runtime that PyTorch 2.15 imports and the CUDA 12 build does not
//! export (their CUDA 12 forms differ or PyTorch 2.10 does not use them). Device code cannot
//! run here, so libraries of device code cannot be loaded (`cudaErrorNoKernelImageForDevice`,
//! as for a binary without an image for the device) and the graph-building APIs the simulator's
//! linear graphs cannot represent are refused with `cudaErrorNotSupported`.

use core::ffi::{c_char, c_int, c_uint, c_void};

use cuda_abi::cudart::*;

use std::sync::{Arc, Mutex};

use crate::streams::{ConditionalHandle, Graph, NodeBody};
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

/// The conditional handles made so far; handle `h` is entry `h - 1`.
static CONDITIONALS: Mutex<Vec<Arc<ConditionalHandle>>> = Mutex::new(Vec::new());

/// The leading fields of `struct cudaGraphNodeParams` (driver_types.h) for a conditional
/// node: `int type; int reserved0[3];`, then the union, whose `conditional` member
/// (`struct cudaConditionalNodeParams`) begins `cudaGraphConditionalHandle handle; enum
/// cudaGraphConditionalNodeType type; unsigned int size; cudaGraph_t* phGraph_out;` in CUDA
/// 12.4 to 13 alike (13 appends a context). Read through this prefix only.
#[repr(C)]
struct ConditionalParams {
    node_type: c_int,
    reserved0: [c_int; 3],
    handle: cudaGraphConditionalHandle,
    cond_type: c_uint,
    size: c_uint,
    graphs_out: *mut cudaGraph_t,
}

/// `cudaGraphAddNode`: conditional `if` nodes (one body, or two: if/else), whose body graphs
/// are made empty and handed out through `phGraph_out` (a runtime-owned array, as in CUDA).
/// The simulator runs no device code, so nothing can change a handle's value: a `while` or
/// `switch` node, and the other node types through this generic call, are refused with
/// `cudaErrorNotSupported`.
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaGraphAddNode(
    node: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    deps: *const cudaGraphNode_t,
    _edge_data: *const cudaGraphEdgeData,
    num_deps: usize,
    params: *mut cudaGraphNodeParams,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        if params.is_null() {
            return Err(cudaErrorInvalidValue);
        }
        let p = params.cast::<ConditionalParams>();
        // SAFETY: the caller's parameter block, whose leading fields are `ConditionalParams`.
        let (kind, handle, cond, size) = unsafe {
            (
                (*p).node_type as cudaGraphNodeType,
                (*p).handle,
                (*p).cond_type,
                (*p).size,
            )
        };
        if kind != cudaGraphNodeTypeConditional || cond != cudaGraphCondTypeIf {
            return Err(cudaErrorNotSupported);
        }
        if !(1..=2).contains(&size) {
            return Err(cudaErrorInvalidValue);
        }
        let h = usize::try_from(handle)
            .ok()
            .and_then(|h| h.checked_sub(1))
            .and_then(|i| {
                CONDITIONALS
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(i)
                    .cloned()
            })
            .ok_or(cudaErrorInvalidValue)?;
        let bodies: Vec<Arc<Graph>> = (0..size).map(|_| Arc::new(Graph::default())).collect();
        let body_handles: Vec<cudaGraph_t> = bodies
            .iter()
            .map(|b| r.graphs.insert(b.clone()) as cudaGraph_t)
            .collect();
        let added = crate::api_graph::add_node(node, graph, deps, num_deps, kind, || {
            Ok(NodeBody::Conditional {
                handle: h,
                bodies: bodies.clone(),
            })
        });
        if let Err(e) = added {
            for b in &bodies {
                r.graphs.remove(Arc::as_ptr(b) as usize);
            }
            return Err(e);
        }
        // The runtime-owned array of body graphs lives as long as the process (CUDA's lives
        // as long as the node).
        let out: &'static mut [cudaGraph_t] = Box::leak(body_handles.into_boxed_slice());
        // SAFETY: the caller's parameter block (checked non-null above).
        unsafe { (*p).graphs_out = out.as_mut_ptr() };
        Ok(())
    })
}

/// `cudaGraphConditionalHandleCreate`: a handle holding `default_value` (what every launch
/// sees here, device code being unable to set it; `flags` must be 0 or
/// `cudaGraphCondAssignDefault`).
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaGraphConditionalHandleCreate(
    handle: *mut cudaGraphConditionalHandle,
    graph: cudaGraph_t,
    default_value: c_uint,
    flags: c_uint,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        if handle.is_null() || flags & !cudaGraphCondAssignDefault != 0 {
            return Err(cudaErrorInvalidValue);
        }
        r.graphs
            .get(graph as usize)
            .ok_or(cudaErrorInvalidResourceHandle)?;
        let mut all = CONDITIONALS.lock().unwrap_or_else(|e| e.into_inner());
        all.push(Arc::new(ConditionalHandle {
            default: default_value,
        }));
        let h = all.len() as cudaGraphConditionalHandle;
        // SAFETY: non-null out-pointer from the caller.
        unsafe { crate::out(handle, h) }
    })
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
