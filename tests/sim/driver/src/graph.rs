//! Stream capture and CUDA graphs through the driver API, as XLA's command buffers use them: a
//! driver handle is the runtime's (`CUgraph` is `cudaGraph_t`, `CUstream` is `cudaStream_t`),
//! so each call is the simulated runtime's function of the same job, looked up in the loaded
//! runtime itself (never interposed: a tracer sees the driver call alone), its error code
//! translated as the memory functions' are.

use core::ffi::{c_uint, c_ulonglong, CStr};

use cuda_abi::cudart::{
    cudaGraphExecUpdateResultInfo, cudaGraphExec_t, cudaGraphInstantiateParams, cudaGraphNode_t,
    cudaGraph_t, cudaStreamCaptureMode, cudaStream_t,
};
use cuda_abi::driver::*;

use crate::api::rt_fn;
use crate::memory::cu_result;

/// Calls the runtime's `name`, of C type `F`, through `call`; `CUDA_ERROR_NOT_INITIALIZED`
/// when no simulated runtime is loaded.
///
/// # Safety
/// `F` must be the C signature of `name`, and `call` must pass it valid arguments.
unsafe fn runtime<F: Copy>(name: &CStr, call: impl FnOnce(F) -> c_uint) -> CUresult {
    // SAFETY: per the caller.
    match unsafe { rt_fn::<F>(name) } {
        Some(f) => cu_result(call(f)),
        None => CUDA_ERROR_NOT_INITIALIZED,
    }
}

/// `cuStreamBeginCapture_v2` (what `cuStreamBeginCapture` means since CUDA 10.1).
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(
    hStream: CUstream,
    mode: CUstreamCaptureMode,
) -> CUresult {
    type F = unsafe extern "C" fn(cudaStream_t, cudaStreamCaptureMode) -> c_uint;
    // SAFETY: `cudaStreamBeginCapture`'s C signature; the runtime validates the stream.
    unsafe { runtime(c"cudaStreamBeginCapture", |f: F| f(hStream, mode)) }
}

/// `cuStreamEndCapture`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(hStream: CUstream, phGraph: *mut CUgraph) -> CUresult {
    type F = unsafe extern "C" fn(cudaStream_t, *mut cudaGraph_t) -> c_uint;
    // SAFETY: `cudaStreamEndCapture`'s C signature; the runtime checks the out-pointer.
    unsafe { runtime(c"cudaStreamEndCapture", |f: F| f(hStream, phGraph)) }
}

/// `cuGraphCreate` (`flags` must be 0).
#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(phGraph: *mut CUgraph, flags: c_uint) -> CUresult {
    type F = unsafe extern "C" fn(*mut cudaGraph_t, c_uint) -> c_uint;
    // SAFETY: `cudaGraphCreate`'s C signature.
    unsafe { runtime(c"cudaGraphCreate", |f: F| f(phGraph, flags)) }
}

/// `cuGraphAddChildGraphNode`: `childGraph` cloned into `hGraph` as one node.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddChildGraphNode(
    phGraphNode: *mut CUgraphNode,
    hGraph: CUgraph,
    dependencies: *const CUgraphNode,
    numDependencies: usize,
    childGraph: CUgraph,
) -> CUresult {
    type F = unsafe extern "C" fn(
        *mut cudaGraphNode_t,
        cudaGraph_t,
        *const cudaGraphNode_t,
        usize,
        cudaGraph_t,
    ) -> c_uint;
    // SAFETY: `cudaGraphAddChildGraphNode`'s C signature; the runtime validates the handles
    // and reads `numDependencies` nodes.
    unsafe {
        runtime(c"cudaGraphAddChildGraphNode", |f: F| {
            f(
                phGraphNode,
                hGraph,
                dependencies,
                numDependencies,
                childGraph,
            )
        })
    }
}

/// `cuGraphInstantiateWithFlags` (what `cuGraphInstantiate` means since CUDA 12).
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    flags: c_ulonglong,
) -> CUresult {
    type F = unsafe extern "C" fn(*mut cudaGraphExec_t, cudaGraph_t, c_ulonglong) -> c_uint;
    // SAFETY: `cudaGraphInstantiateWithFlags`'s C signature.
    unsafe {
        runtime(c"cudaGraphInstantiateWithFlags", |f: F| {
            f(phGraphExec, hGraph, flags)
        })
    }
}

/// The runtime's `name` (`cudaGraphInstantiateWithParams` or its `_ptsz` form) for
/// `cuGraphInstantiateWithParams`: `CUDA_GRAPH_INSTANTIATE_PARAMS` is laid out as the
/// runtime's `cudaGraphInstantiateParams`.
///
/// # Safety
/// The caller's arguments, as the driver call received them.
unsafe fn instantiate_with_params(
    name: &CStr,
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    type F = unsafe extern "C" fn(
        *mut cudaGraphExec_t,
        cudaGraph_t,
        *mut cudaGraphInstantiateParams,
    ) -> c_uint;
    // SAFETY: the C signature of both runtime spellings; the two parameter blocks have the
    // same fields in the same order.
    unsafe {
        runtime(name, |f: F| {
            f(phGraphExec, hGraph, instantiateParams.cast())
        })
    }
}

/// `cuGraphInstantiateWithParams`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    // SAFETY: the caller's arguments.
    unsafe {
        instantiate_with_params(
            c"cudaGraphInstantiateWithParams",
            phGraphExec,
            hGraph,
            instantiateParams,
        )
    }
}

/// `cuGraphLaunch`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult {
    type F = unsafe extern "C" fn(cudaGraphExec_t, cudaStream_t) -> c_uint;
    // SAFETY: `cudaGraphLaunch`'s C signature.
    unsafe { runtime(c"cudaGraphLaunch", |f: F| f(hGraphExec, hStream)) }
}

/// `cuGraphExecDestroy`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(hGraphExec: CUgraphExec) -> CUresult {
    type F = unsafe extern "C" fn(cudaGraphExec_t) -> c_uint;
    // SAFETY: `cudaGraphExecDestroy`'s C signature.
    unsafe { runtime(c"cudaGraphExecDestroy", |f: F| f(hGraphExec)) }
}

/// `cuGraphDestroy`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(hGraph: CUgraph) -> CUresult {
    type F = unsafe extern "C" fn(cudaGraph_t) -> c_uint;
    // SAFETY: `cudaGraphDestroy`'s C signature.
    unsafe { runtime(c"cudaGraphDestroy", |f: F| f(hGraph)) }
}

/// `cuStreamEndCapture` of a program built with per-thread default streams.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(
    hStream: CUstream,
    phGraph: *mut CUgraph,
) -> CUresult {
    type F = unsafe extern "C" fn(cudaStream_t, *mut cudaGraph_t) -> c_uint;
    // SAFETY: `cudaStreamEndCapture_ptsz`'s C signature.
    unsafe { runtime(c"cudaStreamEndCapture_ptsz", |f: F| f(hStream, phGraph)) }
}

/// `cuGraphInstantiateWithParams` of a program built with per-thread default streams.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    instantiateParams: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    // SAFETY: the caller's arguments.
    unsafe {
        instantiate_with_params(
            c"cudaGraphInstantiateWithParams_ptsz",
            phGraphExec,
            hGraph,
            instantiateParams,
        )
    }
}

/// `cuGraphLaunch` of a program built with per-thread default streams.
#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(
    hGraphExec: CUgraphExec,
    hStream: CUstream,
) -> CUresult {
    type F = unsafe extern "C" fn(cudaGraphExec_t, cudaStream_t) -> c_uint;
    // SAFETY: `cudaGraphLaunch_ptsz`'s C signature.
    unsafe { runtime(c"cudaGraphLaunch_ptsz", |f: F| f(hGraphExec, hStream)) }
}

/// `cuGraphExecUpdate_v2` (what `cuGraphExecUpdate` means since CUDA 12):
/// `CUgraphExecUpdateResultInfo` is laid out as the runtime's `cudaGraphExecUpdateResultInfo`.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecUpdate_v2(
    hGraphExec: CUgraphExec,
    hGraph: CUgraph,
    resultInfo: *mut CUgraphExecUpdateResultInfo,
) -> CUresult {
    type F = unsafe extern "C" fn(
        cudaGraphExec_t,
        cudaGraph_t,
        *mut cudaGraphExecUpdateResultInfo,
    ) -> c_uint;
    // SAFETY: `cudaGraphExecUpdate`'s C signature; the two result blocks have the same fields
    // in the same order.
    unsafe {
        runtime(c"cudaGraphExecUpdate", |f: F| {
            f(hGraphExec, hGraph, resultInfo.cast())
        })
    }
}
