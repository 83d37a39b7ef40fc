//! Graphs built node by node (`cudaGraphCreate`, `cudaGraphAdd*Node`), as NVIDIA documents
//! them: memcpy, memset, empty and child-graph nodes with explicit dependencies.
//!
//! A node may only depend on nodes already in its graph (there is no call that adds an edge
//! later), so a graph's node list, in the order nodes were added, always respects every
//! dependency: an instance replays it in that order on the launch stream, like a captured
//! graph. Handles are validated; the errors are the documented `cudaErrorInvalidValue` for a
//! null out-pointer, a null dependency array with a non-zero count, a dependency that is not a
//! node of the graph (or is named twice) and invalid parameters, and
//! `cudaErrorInvalidResourceHandle` for a graph handle that is not a live graph (CUDA's answer
//! to a destroyed graph).

use core::ffi::{c_uint, c_void};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use cuda_abi::cudart::*;

use crate::streams::{Graph, MemcpyParams, Node, NodeBody};
use crate::{guard, out, rt};

#[no_mangle]
pub unsafe extern "C" fn cudaGraphCreate(graph: *mut cudaGraph_t, flags: c_uint) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        // CUDA reserves the flags for future use: they must be 0.
        if graph.is_null() || flags != 0 {
            return Err(cudaErrorInvalidValue);
        }
        let h = r.graphs.insert(Arc::new(Graph::default()));
        // SAFETY: non-null out-pointer from the caller.
        unsafe { out(graph, h as cudaGraph_t) }
    })
}

/// Adds a node of type `kind` doing `body` to `graph`, after the `num_deps` nodes of `deps`,
/// and hands out its handle. Everything is checked before the node exists, so a refused call
/// leaves the graph as it was.
pub(crate) fn add_node(
    node_out: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    deps: *const cudaGraphNode_t,
    num_deps: usize,
    kind: cudaGraphNodeType,
    body: impl FnOnce() -> Result<NodeBody, cudaError_t>,
) -> Result<(), cudaError_t> {
    let r = rt()?;
    if node_out.is_null() || (deps.is_null() && num_deps > 0) {
        return Err(cudaErrorInvalidValue);
    }
    let g = r
        .graphs
        .get(graph as usize)
        .ok_or(cudaErrorInvalidResourceHandle)?;
    let wanted: Vec<usize> = if num_deps == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller's array of `num_deps` handles (checked non-null above).
        unsafe { std::slice::from_raw_parts(deps, num_deps) }
            .iter()
            .map(|&d| d as usize)
            .collect()
    };
    let body = body()?;
    // The graph stays locked from the dependency check to the insertion, so a node added by
    // another thread in between cannot make the order wrong.
    let mut nodes = g.nodes.lock().unwrap_or_else(|p| p.into_inner());
    let members: HashSet<usize> = nodes.iter().map(|n| n.handle()).collect();
    let mut seen = HashSet::new();
    if !wanted
        .iter()
        .all(|d| members.contains(d) && seen.insert(*d))
    {
        return Err(cudaErrorInvalidValue);
    }
    let node = Arc::new(Node {
        kind,
        body,
        deps: wanted,
        launched: None,
    });
    let h = r.nodes.insert(node.clone());
    nodes.push(node);
    drop(nodes);
    // SAFETY: non-null out-pointer from the caller.
    unsafe { out(node_out, h as cudaGraphNode_t) }
}

/// A copy of `count` bytes, as `cudaMemcpy` would make it, when the graph runs. Its ends must
/// be device memory or pinned host memory (`cudaErrorInvalidValue` otherwise, and for a zero
/// count): see [`crate::api_memory::check_memcpy_node`]. An instance can redirect it with
/// `cudaGraphExecMemcpyNodeSetParams1D`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaGraphAddMemcpyNode1D(
    node: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    deps: *const cudaGraphNode_t,
    num_deps: usize,
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    guard(|| {
        add_node(node, graph, deps, num_deps, cudaGraphNodeTypeMemcpy, || {
            let p = MemcpyParams::rows(dst as usize, count, src as usize, count, count, 1, kind);
            crate::api_memory::check_memcpy_node(&p)?;
            Ok(NodeBody::Memcpy(p))
        })
    })
}

/// A copy described as for `cudaMemcpy3D`, between pitched pointers (CUDA arrays are not
/// simulated: `cudaErrorInvalidValue`).
#[no_mangle]
pub unsafe extern "C" fn cudaGraphAddMemcpyNode(
    node: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    deps: *const cudaGraphNode_t,
    num_deps: usize,
    params: *const cudaMemcpy3DParms,
) -> cudaError_t {
    guard(|| {
        add_node(node, graph, deps, num_deps, cudaGraphNodeTypeMemcpy, || {
            if params.is_null() {
                return Err(cudaErrorInvalidValue);
            }
            // SAFETY: the caller's parameter block (checked non-null above).
            let p = unsafe { params.read() };
            crate::api_memory::memcpy_node_3d(&p).map(NodeBody::Memcpy)
        })
    })
}

/// A memset of device memory (`elementSize` 1, 2 or 4; see
/// [`crate::api_memory::memset_node`]).
#[no_mangle]
pub unsafe extern "C" fn cudaGraphAddMemsetNode(
    node: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    deps: *const cudaGraphNode_t,
    num_deps: usize,
    params: *const cudaMemsetParams,
) -> cudaError_t {
    guard(|| {
        add_node(node, graph, deps, num_deps, cudaGraphNodeTypeMemset, || {
            if params.is_null() {
                return Err(cudaErrorInvalidValue);
            }
            // SAFETY: the caller's parameter block (checked non-null above).
            let p = unsafe { params.read() };
            let op = crate::api_memory::memset_node(&p)?;
            Ok(NodeBody::Op(Mutex::new(op)))
        })
    })
}

/// A node that does nothing: it only orders the nodes that depend on it after its own
/// dependencies.
#[no_mangle]
pub unsafe extern "C" fn cudaGraphAddEmptyNode(
    node: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    deps: *const cudaGraphNode_t,
    num_deps: usize,
) -> cudaError_t {
    guard(|| {
        add_node(node, graph, deps, num_deps, cudaGraphNodeTypeEmpty, || {
            Ok(NodeBody::Empty)
        })
    })
}

/// A node that runs a copy of `child` (its nodes as they are now; later changes to `child`
/// do not reach it, as in CUDA, and `child` may be destroyed).
#[no_mangle]
pub unsafe extern "C" fn cudaGraphAddChildGraphNode(
    node: *mut cudaGraphNode_t,
    graph: cudaGraph_t,
    deps: *const cudaGraphNode_t,
    num_deps: usize,
    child: cudaGraph_t,
) -> cudaError_t {
    guard(|| {
        add_node(node, graph, deps, num_deps, cudaGraphNodeTypeGraph, || {
            let c = rt()?
                .graphs
                .get(child as usize)
                .ok_or(cudaErrorInvalidValue)?;
            Ok(NodeBody::Graph(c.nodes()))
        })
    })
}
