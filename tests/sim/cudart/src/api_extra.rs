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

// ---- Graphs: captured graphs are linear lists without an editable node structure ---------

/// The simulator's graphs expose no nodes: a graph reports zero of them.
#[no_mangle]
pub unsafe extern "C" fn cudaGraphGetNodes(
    graph: cudaGraph_t,
    _nodes: *mut cudaGraphNode_t,
    count: *mut usize,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        r.graph_exists(graph)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(count, 0) }
    })
}

#[cfg(not(sim_cuda13))]
#[no_mangle]
pub unsafe extern "C" fn cudaGraphNodeGetDependencies(
    _node: cudaGraphNode_t,
    _deps: *mut cudaGraphNode_t,
    _count: *mut usize,
) -> cudaError_t {
    // No node handle is ever handed out, so any handle is invalid.
    guard(|| rt().and(Err(cudaErrorInvalidValue)))
}

/// CUDA 13 (CUDA 12's `_v2`): with edge data.
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaGraphNodeGetDependencies(
    _node: cudaGraphNode_t,
    _deps: *mut cudaGraphNode_t,
    _edge_data: *mut cudaGraphEdgeData,
    _count: *mut usize,
) -> cudaError_t {
    // No node handle is ever handed out, so any handle is invalid.
    guard(|| rt().and(Err(cudaErrorInvalidValue)))
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
