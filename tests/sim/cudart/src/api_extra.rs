//! The rest of the runtime API that PyTorch imports: driver entry points, peer access, PCI ids,
//! IPC handles, memory pools, graph queries, the profiler, stream callbacks and flagged events.
//!
//! Each either does what CUDA does in the simulator's terms or fails with the error CUDA
//! documents for a device that lacks the feature; none crashes or blocks.

use core::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::ffi::CStr;
use std::sync::OnceLock;

use cuda_abi::cudart::*;

use crate::api_stream::{launch_host_func, record};
use crate::{guard, out, rt};

/// The simulated driver's `cuGetProcAddress_v2`, found the way the real runtime finds the
/// driver: `libcuda.so.1`, next to this library (RUNPATH `$ORIGIN`) or on the search path.
type GetProcAddress = unsafe extern "C" fn(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> c_int;

fn driver_get_proc_address() -> Option<GetProcAddress> {
    static F: OnceLock<Option<usize>> = OnceLock::new();
    let f = F.get_or_init(|| {
        // SAFETY: dlopen/dlsym with NUL-terminated names; the handle is kept for the process.
        unsafe {
            let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
            if h.is_null() {
                return None;
            }
            let f = libc::dlsym(h, c"cuGetProcAddress_v2".as_ptr());
            (!f.is_null()).then_some(f as usize)
        }
    });
    // SAFETY: the simulated driver's `cuGetProcAddress_v2` has this signature (cuda.h).
    f.map(|f| unsafe { std::mem::transmute::<usize, GetProcAddress>(f) })
}

/// Looks `symbol` up in the driver for `version`: success with a null pointer and
/// `cudaDriverEntryPointSymbolNotFound` when the driver lacks it, as CUDA documents.
fn entry_point(
    symbol: *const c_char,
    func: *mut *mut c_void,
    version: c_uint,
    flags: c_ulonglong,
    status: *mut cudaDriverEntryPointQueryResult,
) -> Result<(), cudaError_t> {
    rt()?;
    if symbol.is_null() || func.is_null() {
        return Err(cudaErrorInvalidValue);
    }
    let get = driver_get_proc_address().ok_or(cudaErrorInsufficientDriver)?;
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut found: c_int = 0;
    // SAFETY: valid symbol string and out-pointers; the driver writes both.
    let rc = unsafe { get(symbol, &mut pfn, version as c_int, flags, &mut found) };
    let st = match (rc, found) {
        (0, 0) => cudaDriverEntryPointSuccess,
        (_, 2) => cudaDriverEntryPointVersionNotSufficent,
        _ => cudaDriverEntryPointSymbolNotFound,
    };
    if st != cudaDriverEntryPointSuccess {
        pfn = std::ptr::null_mut();
    }
    // SAFETY: non-null out-pointer from the caller.
    unsafe { func.write(pfn) };
    if !status.is_null() {
        // SAFETY: optional out-pointer from the caller.
        unsafe { status.write(st) };
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(
    symbol: *const c_char,
    func: *mut *mut c_void,
    flags: c_ulonglong,
    status: *mut cudaDriverEntryPointQueryResult,
) -> cudaError_t {
    // Without a version the runtime asks for its own (CUDART_VERSION).
    guard(|| entry_point(symbol, func, CUDART_VERSION as c_uint, flags, status))
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(
    symbol: *const c_char,
    func: *mut *mut c_void,
    version: c_uint,
    flags: c_ulonglong,
    status: *mut cudaDriverEntryPointQueryResult,
) -> cudaError_t {
    guard(|| entry_point(symbol, func, version, flags, status))
}

/// The `flags` a lookup by a program built with per-thread default streams passes on:
/// `cudaEnableDefault` (0) means the per-thread spellings there.
fn per_thread_default(flags: c_ulonglong) -> c_ulonglong {
    if flags == 0 {
        2 // cudaEnablePerThreadDefaultStream, the driver's CU_GET_PROC_ADDRESS_PER_THREAD_...
    } else {
        flags
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPoint_ptsz(
    symbol: *const c_char,
    func: *mut *mut c_void,
    flags: c_ulonglong,
    status: *mut cudaDriverEntryPointQueryResult,
) -> cudaError_t {
    let flags = per_thread_default(flags);
    guard(|| entry_point(symbol, func, CUDART_VERSION as c_uint, flags, status))
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion_ptsz(
    symbol: *const c_char,
    func: *mut *mut c_void,
    version: c_uint,
    flags: c_ulonglong,
    status: *mut cudaDriverEntryPointQueryResult,
) -> cudaError_t {
    let flags = per_thread_default(flags);
    guard(|| entry_point(symbol, func, version, flags, status))
}

/// The simulated devices share one host memory: peers can always access each other.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        if flags != 0 {
            return Err(cudaErrorInvalidValue);
        }
        if peer < 0 || peer >= r.device_count() || peer == r.current_device() {
            return Err(cudaErrorInvalidDevice);
        }
        Ok(())
    })
}

/// The PCI bus id of a simulated device, in CUDA's `domain:bus:device.function` form: bus
/// `pciBusID` of its properties (device + 1).
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetPCIBusId(
    bus_id: *mut c_char,
    len: c_int,
    device: c_int,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        if device < 0 || device >= r.device_count() {
            return Err(cudaErrorInvalidDevice);
        }
        if bus_id.is_null() || len <= 0 {
            return Err(cudaErrorInvalidValue);
        }
        let s = format!("0000:{:02x}:00.0\0", device + 1);
        let n = s.len().min(len as usize);
        // SAFETY: the caller's buffer holds `len` bytes; the last byte written is a NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), bus_id, n);
            bus_id.add(n - 1).write(0);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventRecordWithFlags(
    event: cudaEvent_t,
    stream: cudaStream_t,
    flags: c_uint,
) -> cudaError_t {
    // cudaEventRecordDefault (0) and cudaEventRecordExternal (1, meaningful only in a graph
    // capture, where the simulator records the event the same way).
    guard(|| {
        if flags > 1 {
            return Err(cudaErrorInvalidValue);
        }
        record(event, stream, false)
    })
}

/// A stream callback and its argument: run as a host function, with the stream's status.
struct Callback {
    f: unsafe extern "C" fn(cudaStream_t, cudaError_t, *mut c_void),
    stream: cudaStream_t,
    data: *mut c_void,
}

unsafe extern "C" fn run_callback(p: *mut c_void) {
    // SAFETY: `p` is the box `cudaStreamAddCallback` leaked for exactly this one call.
    let cb = unsafe { Box::from_raw(p.cast::<Callback>()) };
    // SAFETY: the program's callback with the arguments it registered.
    unsafe { (cb.f)(cb.stream, cudaSuccess, cb.data) };
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamAddCallback(
    stream: cudaStream_t,
    callback: cudaStreamCallback_t,
    user_data: *mut c_void,
    flags: c_uint,
) -> cudaError_t {
    guard(|| {
        let f = callback.ok_or(cudaErrorInvalidValue)?;
        if flags != 0 {
            return Err(cudaErrorInvalidValue);
        }
        let cb = Box::into_raw(Box::new(Callback {
            f,
            stream,
            data: user_data,
        }));
        let r = launch_host_func(stream, Some(run_callback), cb.cast(), false);
        if r.is_err() {
            // SAFETY: not enqueued, so still owned here.
            drop(unsafe { Box::from_raw(cb) });
        }
        r
    })
}

// ---- IPC: the simulator's device memory is private to each process -----------------------

#[no_mangle]
pub unsafe extern "C" fn cudaIpcGetMemHandle(
    _handle: *mut cudaIpcMemHandle_t,
    _dev_ptr: *mut c_void,
) -> cudaError_t {
    guard(|| rt().and(Err(cudaErrorNotSupported)))
}

#[no_mangle]
pub unsafe extern "C" fn cudaIpcOpenMemHandle(
    _dev_ptr: *mut *mut c_void,
    _handle: cudaIpcMemHandle_t,
    _flags: c_uint,
) -> cudaError_t {
    guard(|| rt().and(Err(cudaErrorNotSupported)))
}

#[no_mangle]
pub unsafe extern "C" fn cudaIpcCloseMemHandle(_dev_ptr: *mut c_void) -> cudaError_t {
    guard(|| rt().and(Err(cudaErrorNotSupported)))
}

#[no_mangle]
pub unsafe extern "C" fn cudaIpcGetEventHandle(
    _handle: *mut cudaIpcEventHandle_t,
    _event: cudaEvent_t,
) -> cudaError_t {
    guard(|| rt().and(Err(cudaErrorNotSupported)))
}

#[no_mangle]
pub unsafe extern "C" fn cudaIpcOpenEventHandle(
    _event: *mut cudaEvent_t,
    _handle: cudaIpcEventHandle_t,
) -> cudaError_t {
    guard(|| rt().and(Err(cudaErrorNotSupported)))
}

// ---- Memory pools: the device reports no pool support (cudaDevAttrMemoryPoolsSupported 0) --

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetDefaultMemPool(
    _pool: *mut cudaMemPool_t,
    device: c_int,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        if device < 0 || device >= r.device_count() {
            return Err(cudaErrorInvalidDevice);
        }
        Err(cudaErrorNotSupported)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolGetAttribute(
    _pool: cudaMemPool_t,
    _attr: cudaMemPoolAttr,
    _value: *mut c_void,
) -> cudaError_t {
    guard(|| rt().and(Err(cudaErrorNotSupported)))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolSetAttribute(
    _pool: cudaMemPool_t,
    _attr: cudaMemPoolAttr,
    _value: *mut c_void,
) -> cudaError_t {
    guard(|| rt().and(Err(cudaErrorNotSupported)))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolSetAccess(
    _pool: cudaMemPool_t,
    _desc: *const cudaMemAccessDesc,
    _count: usize,
) -> cudaError_t {
    guard(|| rt().and(Err(cudaErrorNotSupported)))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolTrimTo(_pool: cudaMemPool_t, _keep: usize) -> cudaError_t {
    guard(|| rt().and(Err(cudaErrorNotSupported)))
}

// ---- Graphs: captured (linear) or built node by node (api_graph.rs); queries and updates --

/// The nodes of a graph, in capture order (CUDA's calling convention: a null array asks for
/// the count; a longer array is padded with nulls and the count says how many were written).
#[no_mangle]
pub unsafe extern "C" fn cudaGraphGetNodes(
    graph: cudaGraph_t,
    nodes: *mut cudaGraphNode_t,
    count: *mut usize,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let g = r
            .graphs
            .get(graph as usize)
            .ok_or(cudaErrorInvalidResourceHandle)?;
        let list: Vec<usize> = g.nodes().iter().map(|n| n.handle()).collect();
        // SAFETY: the caller's array and count.
        unsafe { node_list(&list, nodes, count) }
    })
}

/// CUDA's convention for a list of nodes handed out: a null array asks for the count; else
/// `*count` entries are written, padded with nulls, and `*count` becomes how many are real.
///
/// # Safety
/// `count` is null or valid; `nodes` is null or has `*count` entries.
unsafe fn node_list(
    list: &[usize],
    nodes: *mut cudaGraphNode_t,
    count: *mut usize,
) -> Result<(), cudaError_t> {
    if count.is_null() {
        return Err(cudaErrorInvalidValue);
    }
    if nodes.is_null() {
        // SAFETY: out-pointer checked above.
        return unsafe { out(count, list.len()) };
    }
    // SAFETY: in/out pointer checked above.
    let room = unsafe { count.read() };
    for i in 0..room {
        let h = list.get(i).copied().unwrap_or(0);
        // SAFETY: the caller's array has `room` entries.
        unsafe { nodes.add(i).write(h as cudaGraphNode_t) };
    }
    // SAFETY: as above.
    unsafe { out(count, room.min(list.len())) }
}

/// The node's type (`cudaGraphNodeTypeMemcpy` for a captured copy between device and pinned
/// memory, `cudaGraphNodeTypeKernel` for a library's kernel, ...).
#[no_mangle]
pub unsafe extern "C" fn cudaGraphNodeGetType(
    node: cudaGraphNode_t,
    kind: *mut cudaGraphNodeType,
) -> cudaError_t {
    guard(|| {
        let n = rt()?
            .nodes
            .get(node as usize)
            .ok_or(cudaErrorInvalidValue)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(kind, n.kind) }
    })
}

fn node_dependencies(
    node: cudaGraphNode_t,
    deps: *mut cudaGraphNode_t,
    count: *mut usize,
) -> Result<(), cudaError_t> {
    let n = rt()?
        .nodes
        .get(node as usize)
        .ok_or(cudaErrorInvalidValue)?;
    // A captured node depends on the one captured before it; an added node on those it named.
    // SAFETY: the caller's array and count.
    unsafe { node_list(&n.deps, deps, count) }
}

#[cfg(not(sim_cuda13))]
#[no_mangle]
pub unsafe extern "C" fn cudaGraphNodeGetDependencies(
    node: cudaGraphNode_t,
    deps: *mut cudaGraphNode_t,
    count: *mut usize,
) -> cudaError_t {
    guard(|| node_dependencies(node, deps, count))
}

/// CUDA 13 (CUDA 12's `_v2`): with edge data, which is all default here (`edge_data`, when
/// given, is left as the caller zeroed it).
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaGraphNodeGetDependencies(
    node: cudaGraphNode_t,
    deps: *mut cudaGraphNode_t,
    _edge_data: *mut cudaGraphEdgeData,
    count: *mut usize,
) -> cudaError_t {
    guard(|| node_dependencies(node, deps, count))
}

/// Redirects a 1-D memcpy node of an instantiated graph for its later launches. As in CUDA:
/// the node must be a memcpy node of the graph the instance was made from, that graph not
/// destroyed (PyTorch destroys it right after instantiating: on an H200, driver 580, CUDA 13
/// runtime, the call then failed with `cudaErrorInvalidValue`), 1-D at instantiation, the
/// count non-zero, and each endpoint the same kind of memory as before (device memory of the
/// same device, or pinned host memory): else `cudaErrorInvalidValue`.
#[no_mangle]
pub unsafe extern "C" fn cudaGraphExecMemcpyNodeSetParams1D(
    exec: cudaGraphExec_t,
    node: cudaGraphNode_t,
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let e = r
            .execs
            .get(exec as usize)
            .ok_or(cudaErrorInvalidResourceHandle)?;
        // The node's handle dies with its graph (`Runtime::drop_nodes`).
        r.nodes.get(node as usize).ok_or(cudaErrorInvalidValue)?;
        let n = e
            .nodes
            .iter()
            .find(|n| n.origin == node as usize)
            .ok_or(cudaErrorInvalidValue)?;
        let mut params = n.memcpy.lock().unwrap_or_else(|p| p.into_inner());
        let Some(old) = *params else {
            return Err(cudaErrorInvalidValue);
        };
        if old.height != 1 || old.depth != 1 || count == 0 || kind > cudaMemcpyDefault {
            return Err(cudaErrorInvalidValue);
        }
        if dst.is_null() || src.is_null() {
            return Err(cudaErrorInvalidValue);
        }
        let same = crate::api_memory::same_memory_kind;
        if !same(old.dst, dst as usize)? || !same(old.src, src as usize)? {
            return Err(cudaErrorInvalidValue);
        }
        if crate::api_memory::is_registered(dst as usize)?
            && crate::api_memory::refuse_registered(true)
        {
            return Err(cudaErrorInvalidValue);
        }
        *params = Some(crate::streams::MemcpyParams::rows(
            dst as usize,
            count,
            src as usize,
            count,
            count,
            1,
            kind,
        ));
        Ok(())
    })
}

/// Gives an instance the work of `graph`, when its topology is the instance's: the same number
/// of nodes, of the same types, in the same (linear) order; memcpy nodes take `graph`'s
/// parameters. Else `cudaErrorGraphExecUpdateFailure` with the reason in `info`.
#[no_mangle]
pub unsafe extern "C" fn cudaGraphExecUpdate(
    exec: cudaGraphExec_t,
    graph: cudaGraph_t,
    info: *mut cudaGraphExecUpdateResultInfo,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let e = r
            .execs
            .get(exec as usize)
            .ok_or(cudaErrorInvalidResourceHandle)?;
        let g = r
            .graphs
            .get(graph as usize)
            .ok_or(cudaErrorInvalidResourceHandle)?;
        if info.is_null() {
            return Err(cudaErrorInvalidValue);
        }
        let nodes = g.nodes();
        let mut result = cudaGraphExecUpdateSuccess;
        let mut error_node = 0;
        if nodes.len() != e.nodes.len() {
            result = cudaGraphExecUpdateErrorTopologyChanged;
        } else if let Some((n, _)) = nodes
            .iter()
            .zip(&e.nodes)
            .find(|(n, x)| n.kind != x.work().kind)
        {
            result = cudaGraphExecUpdateErrorNodeTypeChanged;
            error_node = n.handle();
        }
        // SAFETY: out-pointer checked above.
        unsafe {
            info.write(cudaGraphExecUpdateResultInfo {
                result,
                errorNode: error_node as cudaGraphNode_t,
                errorFromNode: std::ptr::null_mut(),
            })
        };
        if result != cudaGraphExecUpdateSuccess {
            return Err(cudaErrorGraphExecUpdateFailure);
        }
        for (n, x) in nodes.into_iter().zip(&e.nodes) {
            let params = n.memcpy();
            *x.memcpy.lock().unwrap_or_else(|p| p.into_inner()) = params;
            *x.node.lock().unwrap_or_else(|p| p.into_inner()) = n;
        }
        Ok(())
    })
}

fn instantiate_with_params(
    exec: *mut cudaGraphExec_t,
    graph: cudaGraph_t,
    params: *mut cudaGraphInstantiateParams,
    per_thread: bool,
) -> Result<(), cudaError_t> {
    let r = rt()?;
    if params.is_null() {
        return Err(cudaErrorInvalidValue);
    }
    // SAFETY: non-null in/out block from the caller.
    let p = unsafe { params.read() };
    if p.flags & cudaGraphInstantiateFlagUpload != 0 {
        // The upload stream must be valid; uploading itself is an optimisation here.
        r.stream(p.uploadStream, per_thread)?;
    }
    // SAFETY: forwarded unchanged.
    let code = unsafe { crate::api_stream::cudaGraphInstantiate(exec, graph, p.flags) };
    // SAFETY: as above.
    unsafe {
        (*params).errNode_out = std::ptr::null_mut();
        (*params).result_out = if code == cudaSuccess {
            cudaGraphInstantiateSuccess
        } else {
            cudaGraphInstantiateError
        };
    }
    if code == cudaSuccess {
        Ok(())
    } else {
        Err(code)
    }
}

/// `cudaGraphInstantiate` with a parameter block (flags, upload stream, result out).
#[no_mangle]
pub unsafe extern "C" fn cudaGraphInstantiateWithParams(
    exec: *mut cudaGraphExec_t,
    graph: cudaGraph_t,
    params: *mut cudaGraphInstantiateParams,
) -> cudaError_t {
    guard(|| instantiate_with_params(exec, graph, params, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaGraphInstantiateWithParams_ptsz(
    exec: *mut cudaGraphExec_t,
    graph: cudaGraph_t,
    params: *mut cudaGraphInstantiateParams,
) -> cudaError_t {
    guard(|| instantiate_with_params(exec, graph, params, true))
}

#[no_mangle]
pub unsafe extern "C" fn cudaGraphInstantiateWithFlags(
    exec: *mut cudaGraphExec_t,
    graph: cudaGraph_t,
    flags: c_ulonglong,
) -> cudaError_t {
    // SAFETY: forwarded unchanged.
    unsafe { crate::api_stream::cudaGraphInstantiate(exec, graph, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn cudaGraphDebugDotPrint(
    graph: cudaGraph_t,
    path: *const c_char,
    _flags: c_uint,
) -> cudaError_t {
    guard(|| {
        rt()?.graph_exists(graph)?;
        if path.is_null() {
            return Err(cudaErrorInvalidValue);
        }
        // SAFETY: NUL-terminated path from the caller.
        let p = unsafe { CStr::from_ptr(path) }
            .to_string_lossy()
            .into_owned();
        std::fs::write(p, "digraph sim_graph {\n}\n").map_err(|_| cudaErrorInvalidValue)
    })
}

// ---- Profiler: no profiler attached, so starting and stopping are no-ops (CUDA 5.0+) ------

#[no_mangle]
pub unsafe extern "C" fn cudaProfilerStart() -> cudaError_t {
    guard(|| rt().map(|_| ()))
}

#[no_mangle]
pub unsafe extern "C" fn cudaProfilerStop() -> cudaError_t {
    guard(|| rt().map(|_| ()))
}

/// Private export for the simulated driver: whether device `d`'s primary context exists.
#[no_mangle]
pub unsafe extern "C" fn __simcudaPrimaryContextActive(d: c_int) -> c_int {
    rt().map_or(0, |r| r.is_active(d) as c_int)
}

/// Private export for the simulated driver: creates device `d`'s primary context.
#[no_mangle]
pub unsafe extern "C" fn __simcudaPrimaryContextRetain(d: c_int) -> cudaError_t {
    match rt() {
        Ok(r) if d >= 0 && d < r.device_count() => {
            r.activate(d);
            cudaSuccess
        }
        Ok(_) => cudaErrorInvalidDevice,
        Err(e) => e,
    }
}
