//! Streams, events, host functions, stream capture and graphs.

use core::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::sync::{Arc, Mutex};

use cuda_abi::cudart::*;

use crate::streams::{Event, Graph, GraphExec, MemcpyParams, Node, NodeBody, StreamKind};
use crate::{errors, guard, out, rt, Op, Runtime, CAPTURE_MODE};

/// Lowest and highest stream priorities (lower number = higher priority), as on Hopper.
const PRIORITY_LEAST: c_int = 0;
const PRIORITY_GREATEST: c_int = -5;

fn create(stream: *mut cudaStream_t, flags: c_uint, priority: c_int) -> Result<(), cudaError_t> {
    let r = rt()?;
    if stream.is_null() || flags & !cudaStreamNonBlocking != 0 {
        return Err(cudaErrorInvalidValue);
    }
    let priority = priority.clamp(PRIORITY_GREATEST, PRIORITY_LEAST);
    let s = r.spawn_stream(r.current_device(), StreamKind::User, flags, priority)?;
    let h = r.streams.insert(s);
    // SAFETY: out-pointer checked above.
    unsafe { out(stream, h as cudaStream_t) }
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreate(stream: *mut cudaStream_t) -> cudaError_t {
    guard(|| create(stream, cudaStreamDefault, 0))
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithFlags(
    stream: *mut cudaStream_t,
    flags: c_uint,
) -> cudaError_t {
    guard(|| create(stream, flags, 0))
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithPriority(
    stream: *mut cudaStream_t,
    flags: c_uint,
    priority: c_int,
) -> cudaError_t {
    guard(|| create(stream, flags, priority))
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> cudaError_t {
    guard(|| {
        rt()?;
        // Either pointer may be null.
        if !least.is_null() {
            // SAFETY: non-null out-pointer from the caller.
            unsafe { least.write(PRIORITY_LEAST) };
        }
        if !greatest.is_null() {
            // SAFETY: as above.
            unsafe { greatest.write(PRIORITY_GREATEST) };
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaStreamDestroy(stream: cudaStream_t) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let s = r
            .streams
            .remove(stream as usize)
            .ok_or(cudaErrorInvalidResourceHandle)?;
        // Returns at once; queued work still completes (the worker drains, then exits).
        s.close();
        Ok(())
    })
}

fn stream_flags(
    stream: cudaStream_t,
    flags: *mut c_uint,
    per_thread: bool,
) -> Result<(), cudaError_t> {
    let s = rt()?.stream(stream, per_thread)?;
    // SAFETY: out-pointer from the caller.
    unsafe { out(flags, s.flags) }
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamGetFlags(
    stream: cudaStream_t,
    flags: *mut c_uint,
) -> cudaError_t {
    guard(|| stream_flags(stream, flags, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamGetPriority(
    stream: cudaStream_t,
    priority: *mut c_int,
) -> cudaError_t {
    guard(|| {
        let s = rt()?.stream(stream, false)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(priority, s.priority) }
    })
}

/// Synchronising with or querying a capturing stream is illegal and invalidates the capture.
fn refuse_if_capturing(s: &crate::streams::Stream) -> Result<(), cudaError_t> {
    if let Some(cap) = s.capture() {
        cap.lock().unwrap_or_else(|p| p.into_inner()).invalidated = true;
        return Err(cudaErrorStreamCaptureUnsupported);
    }
    Ok(())
}

fn synchronize(stream: cudaStream_t, per_thread: bool) -> Result<(), cudaError_t> {
    let r = rt()?;
    let s = r.stream(stream, per_thread)?;
    refuse_if_capturing(&s)?;
    r.check_capture_safe()?;
    s.synchronize();
    errors::sticky()
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamSynchronize(stream: cudaStream_t) -> cudaError_t {
    guard(|| synchronize(stream, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamSynchronize_ptsz(stream: cudaStream_t) -> cudaError_t {
    guard(|| synchronize(stream, true))
}

fn query(stream: cudaStream_t, per_thread: bool) -> Result<(), cudaError_t> {
    let r = rt()?;
    let s = r.stream(stream, per_thread)?;
    refuse_if_capturing(&s)?;
    errors::sticky()?;
    if s.completed() >= s.submitted() {
        Ok(())
    } else {
        Err(cudaErrorNotReady)
    }
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamQuery(stream: cudaStream_t) -> cudaError_t {
    // cudaErrorNotReady is a status, not an error: it does not become the last error.
    match query(stream, false) {
        Err(cudaErrorNotReady) => cudaErrorNotReady,
        r => guard(|| r),
    }
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamQuery_ptsz(stream: cudaStream_t) -> cudaError_t {
    match query(stream, true) {
        Err(cudaErrorNotReady) => cudaErrorNotReady,
        r => guard(|| r),
    }
}

fn event(r: &Runtime, e: cudaEvent_t) -> Result<Arc<Event>, cudaError_t> {
    r.events
        .get(e as usize)
        .ok_or(cudaErrorInvalidResourceHandle)
}

fn wait_event(
    stream: cudaStream_t,
    ev: cudaEvent_t,
    flags: c_uint,
    per_thread: bool,
) -> Result<(), cudaError_t> {
    let r = rt()?;
    let s = r.stream(stream, per_thread)?;
    let e = event(r, ev)?;
    if flags & !1 != 0 {
        return Err(cudaErrorInvalidValue);
    }
    if let Some(cap) = e.captured() {
        // Waiting on an event recorded in a capture pulls this stream into that capture
        // (fork/join across streams, as torch.cuda.graph does with side streams).
        match s.capture() {
            Some(mine) if Arc::ptr_eq(&mine, &cap) => return Ok(()),
            Some(_) => return Err(cudaErrorStreamCaptureMerge),
            None => {
                *s.capture.lock().unwrap_or_else(|p| p.into_inner()) = Some(cap);
                return Ok(());
            }
        }
    }
    let Some(dep) = e.dep() else {
        // Never recorded: nothing to wait for.
        return Ok(());
    };
    if let Some(cap) = s.capture() {
        // A captured stream may not depend on uncaptured work.
        cap.lock().unwrap_or_else(|p| p.into_inner()).invalidated = true;
        return Err(cudaErrorStreamCaptureIsolation);
    }
    let op: Op = Box::new(|| Ok(()));
    r.submit(&s, vec![dep], op).map(|_| ())
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamWaitEvent(
    stream: cudaStream_t,
    event: cudaEvent_t,
    flags: c_uint,
) -> cudaError_t {
    guard(|| wait_event(stream, event, flags, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamWaitEvent_ptsz(
    stream: cudaStream_t,
    event: cudaEvent_t,
    flags: c_uint,
) -> cudaError_t {
    guard(|| wait_event(stream, event, flags, true))
}

fn event_create(ev: *mut cudaEvent_t, flags: c_uint) -> Result<(), cudaError_t> {
    let r = rt()?;
    if ev.is_null() || flags & !0xf != 0 {
        return Err(cudaErrorInvalidValue);
    }
    let h = r.events.insert(Event::new(flags));
    // SAFETY: out-pointer checked above.
    unsafe { out(ev, h as cudaEvent_t) }
}
#[no_mangle]
pub unsafe extern "C" fn cudaEventCreate(event: *mut cudaEvent_t) -> cudaError_t {
    guard(|| event_create(event, cudaEventDefault))
}
#[no_mangle]
pub unsafe extern "C" fn cudaEventCreateWithFlags(
    event: *mut cudaEvent_t,
    flags: c_uint,
) -> cudaError_t {
    guard(|| event_create(event, flags))
}
#[no_mangle]
pub unsafe extern "C" fn cudaEventDestroy(event: cudaEvent_t) -> cudaError_t {
    guard(|| {
        rt()?
            .events
            .remove(event as usize)
            .map(|_| ())
            .ok_or(cudaErrorInvalidResourceHandle)
    })
}

pub(crate) fn record(
    ev: cudaEvent_t,
    stream: cudaStream_t,
    per_thread: bool,
) -> Result<(), cudaError_t> {
    let r = rt()?;
    let e = event(r, ev)?;
    let s = r.stream(stream, per_thread)?;
    errors::sticky()?;
    if let Some(cap) = s.capture() {
        e.record_captured(cap);
        return Ok(());
    }
    e.record(&s, r.implicit_deps(&s))
}
#[no_mangle]
pub unsafe extern "C" fn cudaEventRecord(event: cudaEvent_t, stream: cudaStream_t) -> cudaError_t {
    guard(|| record(event, stream, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaEventRecord_ptsz(
    event: cudaEvent_t,
    stream: cudaStream_t,
) -> cudaError_t {
    guard(|| record(event, stream, true))
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventSynchronize(ev: cudaEvent_t) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let e = event(r, ev)?;
        if e.captured().is_some() {
            return Err(cudaErrorCapturedEvent);
        }
        r.check_capture_safe()?;
        if let Some(d) = e.dep() {
            d.wait();
        }
        errors::sticky()
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventQuery(ev: cudaEvent_t) -> cudaError_t {
    let r = (|| {
        let r = rt()?;
        let e = event(r, ev)?;
        if e.captured().is_some() {
            return Err(cudaErrorCapturedEvent);
        }
        errors::sticky()?;
        match e.dep() {
            Some(d) if !d.done() => Err(cudaErrorNotReady),
            _ => Ok(()),
        }
    })();
    match r {
        Err(cudaErrorNotReady) => cudaErrorNotReady,
        r => guard(|| r),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaEventElapsedTime(
    ms: *mut f32,
    start: cudaEvent_t,
    end: cudaEvent_t,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let (a, b) = (event(r, start)?, event(r, end)?);
        if a.flags & cudaEventDisableTiming != 0 || b.flags & cudaEventDisableTiming != 0 {
            return Err(cudaErrorInvalidResourceHandle);
        }
        if a.dep().is_none() || b.dep().is_none() {
            return Err(cudaErrorInvalidResourceHandle);
        }
        let (Some(t0), Some(t1)) = (a.time(), b.time()) else {
            return Err(cudaErrorNotReady);
        };
        let d = if t1 >= t0 {
            (t1 - t0).as_secs_f64()
        } else {
            -(t0 - t1).as_secs_f64()
        };
        // SAFETY: out-pointer from the caller.
        unsafe { out(ms, (d * 1e3) as f32) }
    })
}

/// A host function and its argument, moved to the stream worker.
pub(crate) struct HostCall(unsafe extern "C" fn(*mut c_void), *mut c_void);
// SAFETY: CUDA runs host functions on a driver thread by contract; the caller made it so.
unsafe impl Send for HostCall {}

pub(crate) fn launch_host_func(
    stream: cudaStream_t,
    f: cudaHostFn_t,
    data: *mut c_void,
    per_thread: bool,
) -> Result<(), cudaError_t> {
    let r = rt()?;
    let f = f.ok_or(cudaErrorInvalidValue)?;
    let s = r.stream(stream, per_thread)?;
    let call = HostCall(f, data);
    let op: Op = Box::new(move || {
        let c = &call;
        // SAFETY: the function and argument the program enqueued; it must not call CUDA.
        unsafe { (c.0)(c.1) };
        Ok(())
    });
    r.submit_as(&s, Vec::new(), op, cudaGraphNodeTypeHost)
        .map(|_| ())
}
#[no_mangle]
pub unsafe extern "C" fn cudaLaunchHostFunc(
    stream: cudaStream_t,
    f: cudaHostFn_t,
    user_data: *mut c_void,
) -> cudaError_t {
    guard(|| launch_host_func(stream, f, user_data, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaLaunchHostFunc_ptsz(
    stream: cudaStream_t,
    f: cudaHostFn_t,
    user_data: *mut c_void,
) -> cudaError_t {
    guard(|| launch_host_func(stream, f, user_data, true))
}

fn is_capturing(
    stream: cudaStream_t,
    status: *mut cudaStreamCaptureStatus,
    per_thread: bool,
) -> Result<(), cudaError_t> {
    let r = rt()?;
    let s = r.stream(stream, per_thread)?;
    if s.kind == StreamKind::Legacy && r.capturing() {
        // Querying the legacy stream during a capture is itself illegal.
        return Err(cudaErrorStreamCaptureImplicit);
    }
    let st = match s.capture() {
        None => cudaStreamCaptureStatusNone,
        Some(c) if c.lock().unwrap_or_else(|p| p.into_inner()).invalidated => {
            cudaStreamCaptureStatusInvalidated
        }
        Some(_) => cudaStreamCaptureStatusActive,
    };
    // SAFETY: out-pointer from the caller.
    unsafe { out(status, st) }
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamIsCapturing(
    stream: cudaStream_t,
    status: *mut cudaStreamCaptureStatus,
) -> cudaError_t {
    guard(|| is_capturing(stream, status, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamIsCapturing_ptsz(
    stream: cudaStream_t,
    status: *mut cudaStreamCaptureStatus,
) -> cudaError_t {
    guard(|| is_capturing(stream, status, true))
}

fn capture_info(
    stream: cudaStream_t,
    status: *mut cudaStreamCaptureStatus,
    id: *mut c_ulonglong,
    graph: *mut cudaGraph_t,
    deps: *mut *const cudaGraphNode_t,
    num_deps: *mut usize,
    per_thread: bool,
) -> Result<(), cudaError_t> {
    is_capturing(stream, status, per_thread)?;
    let s = rt()?.stream(stream, per_thread)?;
    // The sequence's id, the graph under construction and this stream's frontier (the node it
    // captured last: what its next captured work will depend on). The frontier array stays
    // valid until the stream captures again, as CUDA promises until the next call on it.
    let (cid, g, tail) = match s.capture() {
        Some(c) => {
            let c = c.lock().unwrap_or_else(|p| p.into_inner());
            let tail = c
                .tails
                .get(&s.id)
                .map_or(std::ptr::null(), |b| &**b as *const usize);
            (c.id, c.graph_handle, tail)
        }
        None => (0, 0, std::ptr::null()),
    };
    // SAFETY: optional out-pointers from the caller, written only when non-null.
    unsafe {
        if !id.is_null() {
            id.write(cid);
        }
        if !graph.is_null() {
            graph.write(g as cudaGraph_t);
        }
        if !deps.is_null() {
            deps.write(tail.cast());
        }
        if !num_deps.is_null() {
            num_deps.write(usize::from(!tail.is_null()));
        }
    }
    Ok(())
}
/// The unversioned export keeps its CUDA 11 signature for old binaries; headers of CUDA 12
/// rename calls to `cudaStreamGetCaptureInfo_v2`.
#[cfg(not(sim_cuda13))]
#[no_mangle]
pub unsafe extern "C" fn cudaStreamGetCaptureInfo(
    stream: cudaStream_t,
    capture_status_out: *mut cudaStreamCaptureStatus,
    id_out: *mut c_ulonglong,
) -> cudaError_t {
    let none = std::ptr::null_mut();
    guard(|| {
        capture_info(
            stream,
            capture_status_out,
            id_out,
            none,
            none.cast(),
            none.cast(),
            false,
        )
    })
}
#[cfg(not(sim_cuda13))]
#[no_mangle]
pub unsafe extern "C" fn cudaStreamGetCaptureInfo_v2(
    stream: cudaStream_t,
    capture_status_out: *mut cudaStreamCaptureStatus,
    id_out: *mut c_ulonglong,
    graph_out: *mut cudaGraph_t,
    dependencies_out: *mut *const cudaGraphNode_t,
    num_dependencies_out: *mut usize,
) -> cudaError_t {
    guard(|| {
        capture_info(
            stream,
            capture_status_out,
            id_out,
            graph_out,
            dependencies_out,
            num_dependencies_out,
            false,
        )
    })
}
#[cfg(not(sim_cuda13))]
#[no_mangle]
pub unsafe extern "C" fn cudaStreamGetCaptureInfo_v2_ptsz(
    stream: cudaStream_t,
    capture_status_out: *mut cudaStreamCaptureStatus,
    id_out: *mut c_ulonglong,
    graph_out: *mut cudaGraph_t,
    dependencies_out: *mut *const cudaGraphNode_t,
    num_dependencies_out: *mut usize,
) -> cudaError_t {
    guard(|| {
        capture_info(
            stream,
            capture_status_out,
            id_out,
            graph_out,
            dependencies_out,
            num_dependencies_out,
            true,
        )
    })
}

/// CUDA 13's `cudaStreamGetCaptureInfo` (CUDA 12's `_v3`: with edge data). Every edge of the
/// simulator's graphs is a default edge: `*edge_data_out` is null (no annotations).
#[cfg(sim_cuda13)]
#[allow(clippy::too_many_arguments)]
fn capture_info_13(
    stream: cudaStream_t,
    status: *mut cudaStreamCaptureStatus,
    id: *mut c_ulonglong,
    graph: *mut cudaGraph_t,
    deps: *mut *const cudaGraphNode_t,
    edges: *mut *const cudaGraphEdgeData,
    count: *mut usize,
    per_thread: bool,
) -> Result<(), cudaError_t> {
    capture_info(stream, status, id, graph, deps, count, per_thread)?;
    if !edges.is_null() {
        // SAFETY: optional out-pointer from the caller.
        unsafe { edges.write(std::ptr::null()) };
    }
    Ok(())
}
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaStreamGetCaptureInfo(
    stream: cudaStream_t,
    capture_status_out: *mut cudaStreamCaptureStatus,
    id_out: *mut c_ulonglong,
    graph_out: *mut cudaGraph_t,
    dependencies_out: *mut *const cudaGraphNode_t,
    edge_data_out: *mut *const cudaGraphEdgeData,
    num_dependencies_out: *mut usize,
) -> cudaError_t {
    guard(|| {
        capture_info_13(
            stream,
            capture_status_out,
            id_out,
            graph_out,
            dependencies_out,
            edge_data_out,
            num_dependencies_out,
            false,
        )
    })
}
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaStreamGetCaptureInfo_ptsz(
    stream: cudaStream_t,
    capture_status_out: *mut cudaStreamCaptureStatus,
    id_out: *mut c_ulonglong,
    graph_out: *mut cudaGraph_t,
    dependencies_out: *mut *const cudaGraphNode_t,
    edge_data_out: *mut *const cudaGraphEdgeData,
    num_dependencies_out: *mut usize,
) -> cudaError_t {
    guard(|| {
        capture_info_13(
            stream,
            capture_status_out,
            id_out,
            graph_out,
            dependencies_out,
            edge_data_out,
            num_dependencies_out,
            true,
        )
    })
}

fn begin_capture(
    stream: cudaStream_t,
    mode: cudaStreamCaptureMode,
    per_thread: bool,
) -> Result<(), cudaError_t> {
    let r = rt()?;
    if mode > cudaStreamCaptureModeRelaxed {
        return Err(cudaErrorInvalidValue);
    }
    let s = r.stream(stream, per_thread)?;
    if s.kind == StreamKind::Legacy {
        return Err(cudaErrorStreamCaptureUnsupported);
    }
    if s.capture().is_some() {
        return Err(cudaErrorIllegalState);
    }
    let graph = Arc::new(Graph::default());
    let h = r.graphs.insert(graph.clone());
    let cap = s.begin_capture(mode, graph, h);
    r.add_capture(cap);
    Ok(())
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCapture(
    stream: cudaStream_t,
    mode: cudaStreamCaptureMode,
) -> cudaError_t {
    guard(|| begin_capture(stream, mode, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamBeginCapture_ptsz(
    stream: cudaStream_t,
    mode: cudaStreamCaptureMode,
) -> cudaError_t {
    guard(|| begin_capture(stream, mode, true))
}

fn end_capture(
    stream: cudaStream_t,
    graph: *mut cudaGraph_t,
    per_thread: bool,
) -> Result<(), cudaError_t> {
    let r = rt()?;
    if graph.is_null() {
        return Err(cudaErrorInvalidValue);
    }
    let s = r.stream(stream, per_thread)?;
    let cap = s.capture().ok_or(cudaErrorIllegalState)?;
    {
        let c = cap.lock().unwrap_or_else(|p| p.into_inner());
        if c.mode != cudaStreamCaptureModeRelaxed && c.thread != std::thread::current().id() {
            return Err(cudaErrorStreamCaptureWrongThread);
        }
    }
    // Every stream that joined the sequence leaves it.
    for st in r.device_streams(s.device) {
        if st.capture().is_some_and(|c| Arc::ptr_eq(&c, &cap)) {
            st.leave_capture();
        }
    }
    r.remove_capture(&cap);
    let c = cap.lock().unwrap_or_else(|p| p.into_inner());
    if c.invalidated {
        // The partial graph is destroyed.
        if let Some(g) = r.graphs.remove(c.graph_handle) {
            r.drop_nodes(&g);
        }
        // SAFETY: out-pointer checked above.
        unsafe { graph.write(std::ptr::null_mut()) };
        return Err(cudaErrorStreamCaptureInvalidated);
    }
    // The graph handed out during the capture (cudaStreamGetCaptureInfo) is the result.
    // SAFETY: out-pointer checked above.
    unsafe { out(graph, c.graph_handle as cudaGraph_t) }
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture(
    stream: cudaStream_t,
    graph: *mut cudaGraph_t,
) -> cudaError_t {
    guard(|| end_capture(stream, graph, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaStreamEndCapture_ptsz(
    stream: cudaStream_t,
    graph: *mut cudaGraph_t,
) -> cudaError_t {
    guard(|| end_capture(stream, graph, true))
}

#[no_mangle]
pub unsafe extern "C" fn cudaThreadExchangeStreamCaptureMode(
    mode: *mut cudaStreamCaptureMode,
) -> cudaError_t {
    guard(|| {
        if mode.is_null() {
            return Err(cudaErrorInvalidValue);
        }
        // SAFETY: non-null in/out pointer from the caller.
        let new = unsafe { mode.read() };
        if new > cudaStreamCaptureModeRelaxed {
            return Err(cudaErrorInvalidValue);
        }
        let old = CAPTURE_MODE.with(|m| m.replace(new));
        // SAFETY: as above.
        unsafe { mode.write(old) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaGraphInstantiate(
    exec: *mut cudaGraphExec_t,
    graph: cudaGraph_t,
    _flags: c_ulonglong,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let g = r
            .graphs
            .get(graph as usize)
            .ok_or(cudaErrorInvalidResourceHandle)?;
        let h = r.execs.insert(Arc::new(GraphExec::of(&g)));
        // SAFETY: out-pointer from the caller.
        unsafe { out(exec, h as cudaGraphExec_t) }
    })
}

fn graph_launch(
    exec: cudaGraphExec_t,
    stream: cudaStream_t,
    per_thread: bool,
) -> Result<(), cudaError_t> {
    let r = rt()?;
    let g = r
        .execs
        .get(exec as usize)
        .ok_or(cudaErrorInvalidResourceHandle)?;
    let s = r.stream(stream, per_thread)?;
    // The instance's memcpy parameters as they are now: a later
    // cudaGraphExecMemcpyNodeSetParams1D changes later launches only.
    let nodes: Vec<(Arc<Node>, Option<MemcpyParams>)> = g
        .nodes
        .iter()
        .map(|n| {
            (
                n.work(),
                *n.memcpy.lock().unwrap_or_else(|p| p.into_inner()),
            )
        })
        .collect();
    let works: Vec<Arc<Node>> = nodes.iter().map(|(n, _)| n.clone()).collect();
    // Replays the nodes in the graph's order, which respects their dependencies: no API call
    // (and so no hook) runs for them.
    let op: Op = Box::new(move || {
        for (node, params) in &nodes {
            run_node(node, params.as_ref())?;
        }
        Ok(())
    });
    if s.capture().is_some() {
        // Launched into a capture, the whole graph becomes one child-graph node, whose
        // kernels are told of the launches of the graph it went into.
        crate::errors::sticky()?;
        let hook: crate::streams::LaunchHook =
            Box::new(move || crate::streams::notify_launched(&works));
        return r.capture_hooked_node(
            &s,
            cudaGraphNodeTypeGraph,
            NodeBody::Op(Mutex::new(op)),
            Some(hook),
        );
    }
    // Library kernels take their places in orders shared with eager work (NCCL's sequence
    // numbers) now, at the launch call, as on a GPU: not when the stream reaches the replay.
    crate::streams::notify_launched(&works);
    r.submit_as(&s, Vec::new(), op, cudaGraphNodeTypeGraph)
        .map(|_| ())
}
/// Runs one node of a launched graph: a memcpy node from `params` (the instance's own for a
/// node of the launched graph itself, the node's for one inside a child graph), a child graph
/// node by running the child's nodes in their order.
fn run_node(node: &Node, params: Option<&MemcpyParams>) -> Result<(), cudaError_t> {
    match (&node.body, params) {
        (NodeBody::Memcpy(_), Some(p)) | (NodeBody::Memcpy(p), None) => {
            crate::api_memory::run_memcpy_node(p)
        }
        (NodeBody::Op(op), _) => (op.lock().unwrap_or_else(|p| p.into_inner()))(),
        (NodeBody::Empty, _) => Ok(()),
        (NodeBody::Graph(children), _) => children.iter().try_for_each(|c| run_node(c, None)),
        (NodeBody::Conditional { handle, bodies }, _) => {
            let body = if handle.default != 0 {
                bodies.first()
            } else {
                bodies.get(1)
            };
            body.map_or(Ok(()), |b| {
                b.nodes().iter().try_for_each(|c| run_node(c, None))
            })
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaGraphLaunch(
    exec: cudaGraphExec_t,
    stream: cudaStream_t,
) -> cudaError_t {
    guard(|| graph_launch(exec, stream, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaGraphLaunch_ptsz(
    exec: cudaGraphExec_t,
    stream: cudaStream_t,
) -> cudaError_t {
    guard(|| graph_launch(exec, stream, true))
}

#[no_mangle]
pub unsafe extern "C" fn cudaGraphDestroy(graph: cudaGraph_t) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let g = r
            .graphs
            .remove(graph as usize)
            .ok_or(cudaErrorInvalidResourceHandle)?;
        // Instances keep their own references to the nodes; the handles die with the graph.
        r.drop_nodes(&g);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaGraphExecDestroy(exec: cudaGraphExec_t) -> cudaError_t {
    guard(|| {
        rt()?
            .execs
            .remove(exec as usize)
            .map(|_| ())
            .ok_or(cudaErrorInvalidResourceHandle)
    })
}
