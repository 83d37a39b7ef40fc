//! CUDA graph hooks: the calls that build, instantiate, launch and destroy graphs, so that ops
//! captured into a graph are snapshotted at each replay (the logic is in `graph.rs`), in the
//! runtime's spelling and in the driver's (`cuGraphLaunch`, ...).
//!
//! Each returns exactly what the real function returned; bookkeeping runs after a successful
//! call only, under `catch_unwind`.

use cuda_abi::cudart::*;
use cuda_abi::driver::{
    CUgraph, CUgraphExec, CUgraphExecUpdateResultInfo, CUgraphNode, CUresult, CUstream,
    CUDA_GRAPH_INSTANTIATE_PARAMS,
};

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

/// Runs the real call; after a successful one, `note` (under `catch_unwind`).
fn on_success(real: impl FnOnce() -> cudaError_t, note: impl FnOnce()) -> cudaError_t {
    let r = real();
    if r == cudaSuccess {
        let _ = crate::catch(note);
    }
    r
}

/// The stream a `_ptsz` call means by 0.
fn per_thread(stream: cudaStream_t) -> cudaStream_t {
    if stream.is_null() {
        cudaStreamPerThread
    } else {
        stream
    }
}

/// One graph entry point: `name(C signature) => |real| what the hook does`, where `real`
/// calls the real function, looked up under the hook's name, with the program's arguments
/// (the hook calls it exactly once).
macro_rules! graph_hook {
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? ) => |$real:ident| $body:expr) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> cudaError_t {
            let Some(real) = real::real_of!($name, fn($($t),*) -> cudaError_t, Cudart) else {
                return MISSING;
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            let $real = || unsafe { real($($a),*) };
            $body
        }
    };
}

graph_hook! {
    /// `cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph)`.
    cudaStreamEndCapture(stream: cudaStream_t, graph: *mut cudaGraph_t)
    => |real| end_capture(stream, graph, real)
}

graph_hook! {
    /// `cudaStreamEndCapture` for code built with `--default-stream per-thread`.
    cudaStreamEndCapture_ptsz(stream: cudaStream_t, graph: *mut cudaGraph_t)
    => |real| end_capture(per_thread(stream), graph, real)
}

graph_hook! {
    /// `cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
    /// unsigned long long flags)`.
    cudaGraphInstantiate(exec: *mut cudaGraphExec_t, graph: cudaGraph_t, flags: c_ulonglong)
    => |real| instantiate(exec, graph, real)
}

graph_hook! {
    /// `cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* pGraphExec, cudaGraph_t
    /// graph, unsigned long long flags)` (what PyTorch calls).
    cudaGraphInstantiateWithFlags(
        exec: *mut cudaGraphExec_t,
        graph: cudaGraph_t,
        flags: c_ulonglong,
    ) => |real| instantiate(exec, graph, real)
}

graph_hook! {
    /// `cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t* pGraphExec, cudaGraph_t
    /// graph, cudaGraphInstantiateParams* instantiateParams)`.
    cudaGraphInstantiateWithParams(
        exec: *mut cudaGraphExec_t,
        graph: cudaGraph_t,
        params: *mut cudaGraphInstantiateParams,
    ) => |real| instantiate(exec, graph, real)
}

graph_hook! {
    /// `cudaGraphInstantiateWithParams` for code built with `--default-stream per-thread`.
    cudaGraphInstantiateWithParams_ptsz(
        exec: *mut cudaGraphExec_t,
        graph: cudaGraph_t,
        params: *mut cudaGraphInstantiateParams,
    ) => |real| instantiate(exec, graph, real)
}

graph_hook! {
    /// `cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)`.
    cudaGraphLaunch(exec: cudaGraphExec_t, stream: cudaStream_t) => |real| {
        if mode::off(FAMILIES) {
            real()
        } else {
            graph::launch("cudaGraphLaunch", exec as usize, stream, real)
        }
    }
}

graph_hook! {
    /// `cudaGraphLaunch` for code built with `--default-stream per-thread`.
    cudaGraphLaunch_ptsz(exec: cudaGraphExec_t, stream: cudaStream_t) => |real| {
        if mode::off(FAMILIES) {
            real()
        } else {
            graph::launch("cudaGraphLaunch_ptsz", exec as usize, per_thread(stream), real)
        }
    }
}

graph_hook! {
    /// `cudaError_t cudaGraphExecUpdate(cudaGraphExec_t hGraphExec, cudaGraph_t hGraph,
    /// cudaGraphExecUpdateResultInfo* resultInfo)`.
    cudaGraphExecUpdate(
        exec: cudaGraphExec_t,
        graph: cudaGraph_t,
        info: *mut cudaGraphExecUpdateResultInfo,
    ) => |real| {
        on_success(real, || {
            if !mode::off(FAMILIES) {
                graph::updated(exec as usize, graph as usize)
            }
        })
    }
}

graph_hook! {
    /// `cudaError_t cudaGraphAddChildGraphNode(cudaGraphNode_t* pGraphNode, cudaGraph_t graph,
    /// const cudaGraphNode_t* pDependencies, size_t numDependencies, cudaGraph_t childGraph)`.
    cudaGraphAddChildGraphNode(
        node: *mut cudaGraphNode_t,
        graph: cudaGraph_t,
        deps: *const cudaGraphNode_t,
        count: usize,
        child: cudaGraph_t,
    ) => |real| on_success(real, || {
        if !mode::off(FAMILIES) {
            graph::child_added(graph as usize, child as usize)
        }
    })
}

graph_hook! {
    /// `cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)`.
    cudaGraphExecDestroy(exec: cudaGraphExec_t)
    => |real| on_success(real, || graph::exec_destroyed(exec as usize))
}

graph_hook! {
    /// `cudaError_t cudaGraphDestroy(cudaGraph_t graph)`.
    cudaGraphDestroy(graph: cudaGraph_t) => |real| graph::destroy(graph as usize, real)
}

// ---- The driver API's spellings (`libcuda.so`: XLA's command buffers, programs that take
// driver functions from `cuGetProcAddress`). Its handles are the runtime's (`CUgraph` is
// `cudaGraph_t`, `CUstream` is `cudaStream_t`) and `CUresult` is numerically `cudaError_t`
// where these calls meet (0 is success), so each does what its runtime twin does; without
// them, ops captured into a graph that the driver instantiates and launches were never
// recorded, not even as a gap.

/// One driver graph entry point: as [`graph_hook!`], the real function looked up in the
/// driver.
macro_rules! cu_graph_hook {
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? ) => |$real:ident| $body:expr) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            let Some(real) = real::real_of!($name, fn($($t),*) -> CUresult, Driver) else {
                return super::driver::MISSING;
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            let $real = || unsafe { real($($a),*) };
            $body
        }
    };
}

cu_graph_hook! {
    /// `CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph)`.
    cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph)
    => |real| end_capture(stream, graph, real)
}

cu_graph_hook! {
    /// `cuStreamEndCapture` for code built with per-thread default streams.
    cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut CUgraph)
    => |real| end_capture(per_thread(stream), graph, real)
}

cu_graph_hook! {
    /// `CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
    /// unsigned long long flags)` (what CUDA 12+ headers call `cuGraphInstantiate`).
    cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: c_ulonglong)
    => |real| instantiate(exec, graph, real)
}

cu_graph_hook! {
    /// `CUresult cuGraphInstantiateWithParams(CUgraphExec* phGraphExec, CUgraph hGraph,
    /// CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams)`.
    cuGraphInstantiateWithParams(
        exec: *mut CUgraphExec,
        graph: CUgraph,
        params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
    ) => |real| instantiate(exec, graph, real)
}

cu_graph_hook! {
    /// `cuGraphInstantiateWithParams` for code built with per-thread default streams.
    cuGraphInstantiateWithParams_ptsz(
        exec: *mut CUgraphExec,
        graph: CUgraph,
        params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
    ) => |real| instantiate(exec, graph, real)
}

cu_graph_hook! {
    /// `CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)`.
    cuGraphLaunch(exec: CUgraphExec, stream: CUstream) => |real| {
        if mode::off(FAMILIES) {
            real()
        } else {
            graph::launch("cuGraphLaunch", exec as usize, stream, real)
        }
    }
}

cu_graph_hook! {
    /// `cuGraphLaunch` for code built with per-thread default streams.
    cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) => |real| {
        if mode::off(FAMILIES) {
            real()
        } else {
            graph::launch("cuGraphLaunch_ptsz", exec as usize, per_thread(stream), real)
        }
    }
}

cu_graph_hook! {
    /// `CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
    /// CUgraphExecUpdateResultInfo* resultInfo)` (what CUDA 12+ headers call
    /// `cuGraphExecUpdate`).
    cuGraphExecUpdate_v2(
        exec: CUgraphExec,
        graph: CUgraph,
        info: *mut CUgraphExecUpdateResultInfo,
    ) => |real| {
        on_success(real, || {
            if !mode::off(FAMILIES) {
                graph::updated(exec as usize, graph as usize)
            }
        })
    }
}

cu_graph_hook! {
    /// `CUresult cuGraphAddChildGraphNode(CUgraphNode* phGraphNode, CUgraph hGraph, const
    /// CUgraphNode* dependencies, size_t numDependencies, CUgraph childGraph)`: how XLA's
    /// command buffers nest each captured cuBLAS call.
    cuGraphAddChildGraphNode(
        node: *mut CUgraphNode,
        graph: CUgraph,
        deps: *const CUgraphNode,
        count: usize,
        child: CUgraph,
    ) => |real| on_success(real, || {
        if !mode::off(FAMILIES) {
            graph::child_added(graph as usize, child as usize)
        }
    })
}

cu_graph_hook! {
    /// `CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)`.
    cuGraphExecDestroy(exec: CUgraphExec)
    => |real| on_success(real, || graph::exec_destroyed(exec as usize))
}

cu_graph_hook! {
    /// `CUresult cuGraphDestroy(CUgraph hGraph)`.
    cuGraphDestroy(graph: CUgraph) => |real| graph::destroy(graph as usize, real)
}
