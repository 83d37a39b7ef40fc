//! CUDA graph hooks: the calls that build, instantiate, launch and destroy graphs, so that ops
//! captured into a graph are snapshotted at each replay (the logic is in `graph.rs`).
//!
//! Each returns exactly what the real function returned; bookkeeping runs after a successful
//! call only, under `catch_unwind`.

use cuda_abi::cudart::*;

use crate::cuda::{self, MISSING};
use crate::{graph, mode, real};

use core::ffi::c_ulonglong;

/// The families whose ops a graph may hold: graph calls are tracked while any is captured.
const FAMILIES: u32 = mode::MEMCPY | mode::GEMM | mode::NCCL;

fn end_capture(
    stream: cudaStream_t,
    out: *mut cudaGraph_t,
    real: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    if mode::off(FAMILIES) {
        return real();
    }
    // The graph being built, before the call ends the capture.
    let building = crate::catch(|| {
        let _e = cuda::ErrScope::new();
        cuda::capture_info(stream).map_or(0, |(g, _)| g)
    })
    .unwrap_or(0);
    let r = real();
    if r != cudaSuccess {
        let _ = crate::catch(|| graph::capture_failed(building));
    } else if !out.is_null() {
        // SAFETY: the runtime wrote the graph through the program's out-pointer.
        let g = unsafe { *out } as usize;
        if g != building {
            let _ = crate::catch(|| graph::capture_failed(building));
        }
    }
    r
}

/// `cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph)`.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture(
    stream: cudaStream_t,
    graph: *mut cudaGraph_t,
) -> cudaError_t {
    let Some(real) = real::cudaStreamEndCapture() else {
        return MISSING;
    };
    // SAFETY: the program's arguments, forwarded unchanged.
    end_capture(stream, graph, || unsafe { real(stream, graph) })
}

/// `cudaStreamEndCapture` for code built with `--default-stream per-thread`.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture_ptsz(
    stream: cudaStream_t,
    graph: *mut cudaGraph_t,
) -> cudaError_t {
    let Some(real) = real::cudaStreamEndCapture_ptsz() else {
        return MISSING;
    };
    let s = if stream.is_null() {
        cudaStreamPerThread
    } else {
        stream
    };
    // SAFETY: the program's arguments, forwarded unchanged.
    end_capture(s, graph, || unsafe { real(stream, graph) })
}

fn instantiate(
    exec: *mut cudaGraphExec_t,
    graph: cudaGraph_t,
    real: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    let r = real();
    if r == cudaSuccess && !exec.is_null() && !mode::off(FAMILIES) {
        // SAFETY: the runtime wrote the instance through the program's out-pointer.
        let e = unsafe { *exec } as usize;
        let _ = crate::catch(|| graph::instantiated(e, graph as usize));
    }
    r
}

/// `cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
/// unsigned long long flags)`.
#[no_mangle]
pub unsafe extern "C" fn cudaGraphInstantiate(
    exec: *mut cudaGraphExec_t,
    graph: cudaGraph_t,
    flags: c_ulonglong,
) -> cudaError_t {
    let Some(real) = real::cudaGraphInstantiate() else {
        return MISSING;
    };
    // SAFETY: the program's arguments, forwarded unchanged.
    instantiate(exec, graph, || unsafe { real(exec, graph, flags) })
}

/// `cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
/// unsigned long long flags)` (what PyTorch calls).
#[no_mangle]
pub unsafe extern "C" fn cudaGraphInstantiateWithFlags(
    exec: *mut cudaGraphExec_t,
    graph: cudaGraph_t,
    flags: c_ulonglong,
) -> cudaError_t {
    let Some(real) = real::cudaGraphInstantiateWithFlags() else {
        return MISSING;
    };
    // SAFETY: the program's arguments, forwarded unchanged.
    instantiate(exec, graph, || unsafe { real(exec, graph, flags) })
}

/// `cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
/// cudaGraphInstantiateParams* instantiateParams)`.
#[no_mangle]
pub unsafe extern "C" fn cudaGraphInstantiateWithParams(
    exec: *mut cudaGraphExec_t,
    graph: cudaGraph_t,
    params: *mut cudaGraphInstantiateParams,
) -> cudaError_t {
    let Some(real) = real::cudaGraphInstantiateWithParams() else {
        return MISSING;
    };
    // SAFETY: the program's arguments, forwarded unchanged.
    instantiate(exec, graph, || unsafe { real(exec, graph, params) })
}

/// `cudaGraphInstantiateWithParams` for code built with `--default-stream per-thread`.
#[no_mangle]
pub unsafe extern "C" fn cudaGraphInstantiateWithParams_ptsz(
    exec: *mut cudaGraphExec_t,
    graph: cudaGraph_t,
    params: *mut cudaGraphInstantiateParams,
) -> cudaError_t {
    let Some(real) = real::cudaGraphInstantiateWithParams_ptsz() else {
        return MISSING;
    };
    // SAFETY: the program's arguments, forwarded unchanged.
    instantiate(exec, graph, || unsafe { real(exec, graph, params) })
}

/// `cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)`.
#[no_mangle]
pub unsafe extern "C" fn cudaGraphLaunch(
    exec: cudaGraphExec_t,
    stream: cudaStream_t,
) -> cudaError_t {
    let Some(real) = real::cudaGraphLaunch() else {
        return MISSING;
    };
    if mode::off(FAMILIES) {
        // SAFETY: the program's arguments, forwarded unchanged.
        return unsafe { real(exec, stream) };
    }
    // SAFETY: as above.
    graph::launch(exec as usize, stream, || unsafe { real(exec, stream) })
}

/// `cudaGraphLaunch` for code built with `--default-stream per-thread`.
#[no_mangle]
pub unsafe extern "C" fn cudaGraphLaunch_ptsz(
    exec: cudaGraphExec_t,
    stream: cudaStream_t,
) -> cudaError_t {
    let Some(real) = real::cudaGraphLaunch_ptsz() else {
        return MISSING;
    };
    if mode::off(FAMILIES) {
        // SAFETY: the program's arguments, forwarded unchanged.
        return unsafe { real(exec, stream) };
    }
    let s = if stream.is_null() {
        cudaStreamPerThread
    } else {
        stream
    };
    // SAFETY: as above.
    graph::launch(exec as usize, s, || unsafe { real(exec, stream) })
}

/// `cudaError_t cudaGraphExecUpdate(cudaGraphExec_t hGraphExec, cudaGraph_t hGraph,
/// cudaGraphExecUpdateResultInfo* resultInfo)`.
#[no_mangle]
pub unsafe extern "C" fn cudaGraphExecUpdate(
    exec: cudaGraphExec_t,
    graph: cudaGraph_t,
    info: *mut cudaGraphExecUpdateResultInfo,
) -> cudaError_t {
    let Some(real) = real::cudaGraphExecUpdate() else {
        return MISSING;
    };
    // SAFETY: the program's arguments, forwarded unchanged.
    let r = unsafe { real(exec, graph, info) };
    if r == cudaSuccess && !mode::off(FAMILIES) {
        let _ = crate::catch(|| graph::updated(exec as usize, graph as usize));
    }
    r
}

/// `cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)`.
#[no_mangle]
pub unsafe extern "C" fn cudaGraphExecDestroy(exec: cudaGraphExec_t) -> cudaError_t {
    let Some(real) = real::cudaGraphExecDestroy() else {
        return MISSING;
    };
    // SAFETY: the program's argument, forwarded unchanged.
    let r = unsafe { real(exec) };
    if r == cudaSuccess {
        let _ = crate::catch(|| graph::exec_destroyed(exec as usize));
    }
    r
}

/// `cudaError_t cudaGraphDestroy(cudaGraph_t graph)`.
#[no_mangle]
pub unsafe extern "C" fn cudaGraphDestroy(graph: cudaGraph_t) -> cudaError_t {
    let Some(real) = real::cudaGraphDestroy() else {
        return MISSING;
    };
    // SAFETY: the program's argument, forwarded unchanged.
    let r = unsafe { real(graph) };
    if r == cudaSuccess {
        let _ = crate::catch(|| graph::graph_destroyed(graph as usize));
    }
    r
}
