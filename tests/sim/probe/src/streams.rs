//! Probes of the runtime's asynchrony: what a tracer sees if it reads too early, stream and
//! event ordering, the legacy default stream, pageable vs pinned copies, graph capture, and
//! device pointers that fault on the host.

use core::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use cuda_dyn::abi::cudart::*;
use cuda_dyn::cudart::*;

use crate::support::{ck, cuda_error};

/// Fails unless the call returned `expected`.
macro_rules! expect_code {
    ($e:expr, $expected:expr) => {{
        // SAFETY: as above.
        let code = unsafe { $e };
        if code != $expected {
            return Err(format!(
                "{} returned {}, expected {}",
                stringify!($e),
                cuda_error(code),
                cuda_error($expected)
            ));
        }
    }};
}

/// A gate a host function blocks on, so a test knows exactly what a stream has not run yet.
static GATE_OPEN: AtomicBool = AtomicBool::new(false);
static HOST_CALLS: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn wait_for_gate(_: *mut c_void) {
    while !GATE_OPEN.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

unsafe extern "C" fn count_call(_: *mut c_void) {
    HOST_CALLS.fetch_add(1, Ordering::AcqRel);
}

fn close_gate() {
    GATE_OPEN.store(false, Ordering::Release);
}
fn open_gate() {
    GATE_OPEN.store(true, Ordering::Release);
}

fn stream(flags: u32) -> Result<cudaStream_t, String> {
    let mut s: cudaStream_t = std::ptr::null_mut();
    ck!(cudaStreamCreateWithFlags(&mut s, flags));
    Ok(s)
}

fn device_buffer(bytes: usize) -> Result<*mut c_void, String> {
    let mut p = std::ptr::null_mut();
    ck!(cudaMalloc(&mut p, bytes));
    Ok(p)
}

fn pinned_buffer(bytes: usize) -> Result<*mut u8, String> {
    let mut p = std::ptr::null_mut();
    ck!(cudaMallocHost(&mut p, bytes));
    Ok(p.cast())
}

/// A reader that copies device memory back without synchronising sees stale bytes; after a
/// synchronisation it sees the new ones.
pub fn stale_read(_: &[String]) -> Result<(), String> {
    const N: usize = 4096;
    let s = stream(cudaStreamNonBlocking)?;
    let dev = device_buffer(N)?;
    let host = pinned_buffer(N)?;
    ck!(cudaMemset(dev, 1, N));
    ck!(cudaDeviceSynchronize());
    // SAFETY: `host` is N bytes of pinned memory.
    unsafe { std::ptr::write_bytes(host, 0, N) };

    close_gate();
    ck!(cudaLaunchHostFunc(
        s,
        Some(wait_for_gate),
        std::ptr::null_mut()
    ));
    ck!(cudaMemsetAsync(dev, 2, N, s));
    ck!(cudaMemcpyAsync(
        host.cast(),
        dev,
        N,
        cudaMemcpyDeviceToHost,
        s
    ));
    let mut done: cudaEvent_t = std::ptr::null_mut();
    ck!(cudaEventCreateWithFlags(&mut done, cudaEventDisableTiming));
    ck!(cudaEventRecord(done, s));
    // The calls returned, but the stream has not run them: the host buffer is stale.
    // SAFETY: pinned host memory, read racily on purpose (the worker is parked at the gate).
    let early = unsafe { host.read_volatile() };
    if early != 0 {
        return Err(format!(
            "read before synchronising saw {early}, expected the stale 0"
        ));
    }
    expect_code!(cudaEventQuery(done), cudaErrorNotReady);
    expect_code!(cudaStreamQuery(s), cudaErrorNotReady);
    open_gate();
    ck!(cudaEventSynchronize(done));
    // SAFETY: the copy has completed.
    let bytes = unsafe { std::slice::from_raw_parts(host, N) };
    if bytes.iter().any(|&b| b != 2) {
        return Err("after synchronising, the copy did not deliver the memset's bytes".into());
    }
    ck!(cudaEventQuery(done));
    ck!(cudaStreamQuery(s));
    ck!(cudaStreamDestroy(s));
    ck!(cudaFree(dev));
    ck!(cudaFreeHost(host.cast()));
    Ok(())
}

/// Streams are ordered against each other only by events; the legacy default stream waits for
/// blocking streams but not for non-blocking ones.
pub fn stream_order(_: &[String]) -> Result<(), String> {
    const N: usize = 256;
    let blocked = stream(cudaStreamNonBlocking)?;
    let free = stream(cudaStreamNonBlocking)?;
    let dev = device_buffer(N)?;
    let host = pinned_buffer(N)?;

    // 1. Independent streams: `free` runs while `blocked` is parked.
    close_gate();
    ck!(cudaLaunchHostFunc(
        blocked,
        Some(wait_for_gate),
        std::ptr::null_mut()
    ));
    ck!(cudaMemsetAsync(dev, 7, N, free));
    ck!(cudaStreamSynchronize(free));
    expect_code!(cudaStreamQuery(blocked), cudaErrorNotReady);

    // 2. An event makes `free` wait for `blocked`.
    let mut ev: cudaEvent_t = std::ptr::null_mut();
    ck!(cudaEventCreate(&mut ev));
    ck!(cudaMemsetAsync(dev, 9, N, blocked));
    ck!(cudaEventRecord(ev, blocked));
    ck!(cudaStreamWaitEvent(free, ev, 0));
    ck!(cudaMemcpyAsync(
        host.cast(),
        dev,
        N,
        cudaMemcpyDeviceToHost,
        free
    ));
    std::thread::sleep(Duration::from_millis(50));
    expect_code!(cudaStreamQuery(free), cudaErrorNotReady);
    open_gate();
    ck!(cudaStreamSynchronize(free));
    // SAFETY: the copy has completed.
    if unsafe { host.read() } != 9 {
        return Err("the event wait did not order the copy after the other stream's memset".into());
    }

    // 3. The legacy default stream waits for a blocking stream's earlier work ...
    let blocking = stream(cudaStreamDefault)?;
    close_gate();
    ck!(cudaLaunchHostFunc(
        blocking,
        Some(wait_for_gate),
        std::ptr::null_mut()
    ));
    ck!(cudaMemsetAsync(dev, 3, N, blocking));
    ck!(cudaMemcpyAsync(
        host.cast(),
        dev,
        N,
        cudaMemcpyDeviceToHost,
        std::ptr::null_mut()
    ));
    let mut legacy_done: cudaEvent_t = std::ptr::null_mut();
    ck!(cudaEventCreate(&mut legacy_done));
    ck!(cudaEventRecord(legacy_done, std::ptr::null_mut()));
    std::thread::sleep(Duration::from_millis(50));
    expect_code!(cudaEventQuery(legacy_done), cudaErrorNotReady);
    open_gate();
    ck!(cudaEventSynchronize(legacy_done));
    // SAFETY: the copy has completed.
    if unsafe { host.read() } != 3 {
        return Err("the legacy stream did not wait for the blocking stream's memset".into());
    }
    // ... but not for a non-blocking stream's.
    close_gate();
    ck!(cudaLaunchHostFunc(
        blocked,
        Some(wait_for_gate),
        std::ptr::null_mut()
    ));
    ck!(cudaMemset(dev, 4, N));
    ck!(cudaMemcpy(host.cast(), dev, N, cudaMemcpyDeviceToHost));
    // SAFETY: cudaMemcpy is synchronous.
    if unsafe { host.read() } != 4 {
        return Err("the legacy stream was held up by a non-blocking stream".into());
    }
    open_gate();
    ck!(cudaDeviceSynchronize());

    // 4. Timing events measure what ran between them.
    let (mut t0, mut t1): (cudaEvent_t, cudaEvent_t) = (std::ptr::null_mut(), std::ptr::null_mut());
    ck!(cudaEventCreate(&mut t0));
    ck!(cudaEventCreate(&mut t1));
    close_gate();
    ck!(cudaEventRecord(t0, free));
    ck!(cudaLaunchHostFunc(
        free,
        Some(wait_for_gate),
        std::ptr::null_mut()
    ));
    ck!(cudaEventRecord(t1, free));
    std::thread::sleep(Duration::from_millis(30));
    let mut ms = 0f32;
    expect_code!(cudaEventElapsedTime(&mut ms, t0, t1), cudaErrorNotReady);
    open_gate();
    ck!(cudaEventSynchronize(t1));
    ck!(cudaEventElapsedTime(&mut ms, t0, t1));
    if !(20.0..5000.0).contains(&ms) {
        return Err(format!("elapsed time {ms} ms, expected about 30 ms"));
    }
    expect_code!(cudaEventElapsedTime(&mut ms, t0, legacy_done), cudaSuccess);
    let mut untimed: cudaEvent_t = std::ptr::null_mut();
    ck!(cudaEventCreateWithFlags(
        &mut untimed,
        cudaEventDisableTiming
    ));
    ck!(cudaEventRecord(untimed, free));
    ck!(cudaEventSynchronize(untimed));
    expect_code!(
        cudaEventElapsedTime(&mut ms, t0, untimed),
        cudaErrorInvalidResourceHandle
    );
    Ok(())
}

/// Pageable copies: a D2H copy into pageable memory is complete when the call returns; an H2D
/// copy from pageable memory has staged its source, so the caller may overwrite it at once.
pub fn pageable_copies(_: &[String]) -> Result<(), String> {
    const N: usize = 1024;
    let s = stream(cudaStreamNonBlocking)?;
    let dev = device_buffer(N)?;
    let mut src = vec![5u8; N];
    close_gate();
    ck!(cudaLaunchHostFunc(
        s,
        Some(wait_for_gate),
        std::ptr::null_mut()
    ));
    ck!(cudaMemcpyAsync(
        dev,
        src.as_ptr().cast(),
        N,
        cudaMemcpyHostToDevice,
        s
    ));
    src.fill(6);
    open_gate();
    let mut back = vec![0u8; N];
    ck!(cudaMemcpyAsync(
        back.as_mut_ptr().cast(),
        dev,
        N,
        cudaMemcpyDeviceToHost,
        s
    ));
    // No synchronisation: a copy into pageable memory has completed on return.
    if back.iter().any(|&b| b != 5) {
        return Err(
            "pageable H2D source was not staged at call time, or D2H returned early".into(),
        );
    }
    // cudaMemcpyDefault infers the direction from the pointers.
    let mut back2 = vec![0u8; N];
    ck!(cudaMemcpy(
        back2.as_mut_ptr().cast(),
        dev,
        N,
        cudaMemcpyDefault
    ));
    if back2 != back {
        return Err("cudaMemcpyDefault did not copy device to host".into());
    }
    // A device pointer on the host side of an explicit direction is rejected.
    expect_code!(
        cudaMemcpy(dev, dev, N, cudaMemcpyHostToDevice),
        cudaErrorInvalidValue
    );
    // Pointer attributes.
    let mut attr = cudaPointerAttributes {
        type_: 0,
        device: 0,
        devicePointer: std::ptr::null_mut(),
        hostPointer: std::ptr::null_mut(),
    };
    ck!(cudaPointerGetAttributes(&mut attr, dev));
    if attr.type_ != cudaMemoryTypeDevice {
        return Err(format!(
            "device pointer reported as memory type {}",
            attr.type_
        ));
    }
    ck!(cudaPointerGetAttributes(&mut attr, back.as_ptr().cast()));
    if attr.type_ != cudaMemoryTypeUnregistered {
        return Err(format!(
            "pageable pointer reported as memory type {}",
            attr.type_
        ));
    }
    ck!(cudaHostRegister(
        back.as_mut_ptr().cast(),
        N,
        cudaHostRegisterDefault
    ));
    ck!(cudaPointerGetAttributes(&mut attr, back.as_ptr().cast()));
    if attr.type_ != cudaMemoryTypeHost {
        return Err(format!(
            "registered pointer reported as memory type {}",
            attr.type_
        ));
    }
    expect_code!(
        cudaHostRegister(back.as_mut_ptr().cast(), N, cudaHostRegisterDefault),
        cudaErrorHostMemoryAlreadyRegistered
    );
    ck!(cudaHostUnregister(back.as_mut_ptr().cast()));
    // Two registrations side by side: a copy lies in one, or CUDA refuses it (an H200 did).
    let mut two = vec![0u8; 2 * N];
    let (first, second) = (two.as_mut_ptr(), two[N..].as_mut_ptr());
    ck!(cudaHostRegister(first.cast(), N, cudaHostRegisterDefault));
    ck!(cudaHostRegister(second.cast(), N, cudaHostRegisterDefault));
    ck!(cudaMemcpy(second.cast(), dev, N, cudaMemcpyDeviceToHost));
    expect_code!(
        cudaMemcpyAsync(first.add(N / 2).cast(), dev, N, cudaMemcpyDeviceToHost, s),
        cudaErrorInvalidValue
    );
    ck!(cudaStreamSynchronize(s));
    ck!(cudaHostUnregister(first.cast()));
    ck!(cudaHostUnregister(second.cast()));
    Ok(())
}

/// Stream capture: captured work does not run until the graph is launched (once per launch);
/// unsafe calls during a global-mode capture are refused and invalidate it, unless the thread
/// switched to relaxed mode; the legacy stream cannot be queried during a capture.
pub fn capture(_: &[String]) -> Result<(), String> {
    const N: usize = 64;
    let s = stream(cudaStreamNonBlocking)?;
    let dev = device_buffer(N)?;
    let host = pinned_buffer(N)?;
    HOST_CALLS.store(0, Ordering::Release);

    ck!(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    let mut st: cudaStreamCaptureStatus = 0;
    ck!(cudaStreamIsCapturing(s, &mut st));
    if st != cudaStreamCaptureStatusActive {
        return Err(format!("capture status {st} while capturing"));
    }
    expect_code!(
        cudaStreamIsCapturing(std::ptr::null_mut(), &mut st),
        cudaErrorStreamCaptureImplicit
    );
    ck!(cudaMemsetAsync(dev, 8, N, s));
    ck!(cudaMemcpyAsync(
        host.cast(),
        dev,
        N,
        cudaMemcpyDeviceToHost,
        s
    ));
    ck!(cudaLaunchHostFunc(
        s,
        Some(count_call),
        std::ptr::null_mut()
    ));
    // The relaxed thread may allocate during the capture.
    let mut mode = cudaStreamCaptureModeRelaxed;
    ck!(cudaThreadExchangeStreamCaptureMode(&mut mode));
    let extra = device_buffer(N)?;
    ck!(cudaThreadExchangeStreamCaptureMode(&mut mode));
    let mut graph: cudaGraph_t = std::ptr::null_mut();
    ck!(cudaStreamEndCapture(s, &mut graph));
    std::thread::sleep(Duration::from_millis(20));
    if HOST_CALLS.load(Ordering::Acquire) != 0 {
        return Err("captured work ran during capture".into());
    }
    let mut exec: cudaGraphExec_t = std::ptr::null_mut();
    ck!(cudaGraphInstantiate(&mut exec, graph, 0));
    ck!(cudaGraphLaunch(exec, s));
    ck!(cudaGraphLaunch(exec, s));
    ck!(cudaStreamSynchronize(s));
    if HOST_CALLS.load(Ordering::Acquire) != 2 {
        return Err(format!(
            "graph replays ran the host function {} times, expected 2",
            HOST_CALLS.load(Ordering::Acquire)
        ));
    }
    // SAFETY: the replayed copy has completed.
    if unsafe { host.read() } != 8 {
        return Err("the replayed copy did not deliver the captured memset's bytes".into());
    }

    // An unsafe call in global mode invalidates the capture.
    ck!(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    let mut p = std::ptr::null_mut();
    expect_code!(cudaMalloc(&mut p, N), cudaErrorStreamCaptureUnsupported);
    ck!(cudaStreamIsCapturing(s, &mut st));
    if st != cudaStreamCaptureStatusInvalidated {
        return Err(format!(
            "capture status {st} after an unsafe call, expected invalidated"
        ));
    }
    let mut g2: cudaGraph_t = std::ptr::null_mut();
    expect_code!(
        cudaStreamEndCapture(s, &mut g2),
        cudaErrorStreamCaptureInvalidated
    );
    // After the capture, everything works again.
    ck!(cudaMalloc(&mut p, N));
    ck!(cudaFree(p));
    ck!(cudaFree(extra));
    ck!(cudaGraphExecDestroy(exec));
    ck!(cudaGraphDestroy(graph));
    Ok(())
}

/// The nodes of a captured graph: the graph exists during the capture (the capture info names
/// it and the stream's frontier), a copy between device and pinned memory is a memcpy node, and
/// an instance's memcpy node can be redirected for later launches only; a redirect CUDA refuses
/// is refused.
pub fn graph_nodes(_: &[String]) -> Result<(), String> {
    const N: usize = 64;
    let s = stream(cudaStreamNonBlocking)?;
    let dev = device_buffer(N)?;
    let (a, b, c) = (pinned_buffer(N)?, pinned_buffer(N)?, pinned_buffer(N)?);
    let other_dev = device_buffer(N)?;
    ck!(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    ck!(cudaMemsetAsync(dev, 7, N, s));
    ck!(cudaMemcpyAsync(a.cast(), dev, N, cudaMemcpyDeviceToHost, s));
    let (mut st, mut id, mut building) = (0, 0u64, std::ptr::null_mut());
    let (mut deps, mut ndeps): (*const cudaGraphNode_t, usize) = (std::ptr::null(), 0);
    ck!(cudaStreamGetCaptureInfo_v2(
        s,
        &mut st,
        &mut id,
        &mut building,
        &mut deps,
        &mut ndeps
    ));
    if ndeps != 1 || deps.is_null() || building.is_null() {
        return Err(format!(
            "capture info: {ndeps} frontier nodes, graph {building:?}"
        ));
    }
    // SAFETY: the runtime's array of `ndeps` nodes, valid until the next call on the stream.
    let copy_node = unsafe { *deps };
    ck!(cudaLaunchHostFunc(
        s,
        Some(count_call),
        std::ptr::null_mut()
    ));
    let mut graph: cudaGraph_t = std::ptr::null_mut();
    ck!(cudaStreamEndCapture(s, &mut graph));
    if graph != building {
        return Err("cudaStreamEndCapture returned another graph than the capture built".into());
    }
    let mut nodes = [std::ptr::null_mut(); 4];
    let mut count = nodes.len();
    ck!(cudaGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count));
    let mut kinds = Vec::new();
    for n in &nodes[..count] {
        let mut k = 99;
        ck!(cudaGraphNodeGetType(*n, &mut k));
        kinds.push(k);
    }
    let want = [
        cudaGraphNodeTypeMemset,
        cudaGraphNodeTypeMemcpy,
        cudaGraphNodeTypeHost,
    ];
    if kinds != want || nodes[1] != copy_node || !nodes[3].is_null() {
        return Err(format!("graph nodes of types {kinds:?}, expected {want:?}"));
    }
    let mut exec: cudaGraphExec_t = std::ptr::null_mut();
    ck!(cudaGraphInstantiate(&mut exec, graph, 0));
    let set = |dst: *mut u8, len: usize| unsafe {
        // SAFETY: live instance and node handles; the runtime validates the rest.
        cudaGraphExecMemcpyNodeSetParams1D(exec, copy_node, dst.cast(), dev, len, cudaMemcpyDefault)
    };
    // A launch enqueued behind a closed gate keeps the parameters it was launched with.
    close_gate();
    ck!(cudaLaunchHostFunc(
        s,
        Some(wait_for_gate),
        std::ptr::null_mut()
    ));
    if set(b, N) != cudaSuccess {
        return Err("redirecting the copy node to other pinned memory failed".into());
    }
    ck!(cudaGraphLaunch(exec, s));
    if set(c, N) != cudaSuccess {
        return Err("redirecting the copy node again failed".into());
    }
    open_gate();
    ck!(cudaGraphLaunch(exec, s));
    ck!(cudaStreamSynchronize(s));
    // SAFETY: pinned buffers of N bytes; the launches have completed.
    let read = |p: *mut u8| unsafe { std::slice::from_raw_parts(p, N).to_vec() };
    if read(a) != vec![0u8; N] || read(b) != vec![7u8; N] || read(c) != vec![7u8; N] {
        return Err("each launch did not copy to the destination set before it".into());
    }
    // Refused as by CUDA: another kind of memory, a zero count, a node that is no memcpy.
    if set(other_dev.cast(), N) != cudaErrorInvalidValue || set(b, 0) != cudaErrorInvalidValue {
        return Err("a redirect to device memory or of zero bytes was accepted".into());
    }
    // SAFETY: as above.
    let memset_node = unsafe {
        cudaGraphExecMemcpyNodeSetParams1D(exec, nodes[0], b.cast(), dev, N, cudaMemcpyDefault)
    };
    if memset_node != cudaErrorInvalidValue {
        return Err("a memset node was redirected like a memcpy node".into());
    }
    ck!(cudaGraphExecDestroy(exec));
    ck!(cudaGraphDestroy(graph));
    Ok(())
}

/// A graph built node by node (`cudaGraphCreate`, `cudaGraphAdd*Node`): an upload, a device
/// to device copy after it, a pitched 4-byte memset, an empty node, a 3-D copy after the device
/// copy, a child graph (a 2-byte memset; its graph destroyed once added), and a download after
/// the device copy and the empty node. The nodes are reported in the order they were added,
/// with their types; an instance launched twice on a stream runs after the stream's earlier
/// work and copies what the host source holds at each launch; every byte is checked. Invalid
/// additions are refused with `cudaErrorInvalidValue` and leave the graph unchanged.
pub fn graph_build(_: &[String]) -> Result<(), String> {
    const N: usize = 256;
    const PITCH: usize = 64;
    const POISON: u8 = 0xEE;
    let s = stream(cudaStreamNonBlocking)?;
    let (host_src, host_dst) = (pinned_buffer(N)?, pinned_buffer(N)?);
    let (a, b) = (device_buffer(N)?, device_buffer(N)?);
    let (c, m, k) = (device_buffer(N)?, device_buffer(N)?, device_buffer(N)?);
    for p in [b, c, m, k] {
        ck!(cudaMemset(p, POISON as i32, N));
    }
    // SAFETY: pinned buffer of N bytes; no work uses it yet.
    unsafe { std::ptr::write_bytes(host_dst, POISON, N) };
    // The poison is on the legacy stream, which the non-blocking stream does not wait for.
    ck!(cudaDeviceSynchronize());

    let null = std::ptr::null::<cudaGraphNode_t>();
    let mut g: cudaGraph_t = std::ptr::null_mut();
    expect_code!(cudaGraphCreate(&mut g, 1), cudaErrorInvalidValue);
    expect_code!(
        cudaGraphCreate(std::ptr::null_mut(), 0),
        cudaErrorInvalidValue
    );
    ck!(cudaGraphCreate(&mut g, 0));
    let none = || std::ptr::null_mut::<CUgraphNode_st>();
    let (mut up, mut d2d, mut set4, mut empty) = (none(), none(), none(), none());
    let (mut copy3d, mut child, mut down) = (none(), none(), none());
    ck!(cudaGraphAddMemcpyNode1D(
        &mut up,
        g,
        null,
        0,
        a,
        host_src.cast(),
        N,
        cudaMemcpyHostToDevice
    ));
    ck!(cudaGraphAddMemcpyNode1D(
        &mut d2d,
        g,
        &up,
        1,
        b,
        a,
        N,
        cudaMemcpyDeviceToDevice
    ));
    // 4-byte elements: 8 per row (32 bytes), rows PITCH bytes apart; the rest of each row
    // keeps its poison.
    let memset4 = cudaMemsetParams {
        dst: m,
        pitch: PITCH,
        value: 0x1122_3344,
        elementSize: 4,
        width: 8,
        height: N / PITCH,
    };
    ck!(cudaGraphAddMemsetNode(&mut set4, g, null, 0, &memset4));
    ck!(cudaGraphAddEmptyNode(&mut empty, g, &set4, 1));
    // Two slices of two rows of 32 bytes: b's rows to c's, in pitched layout.
    let pitched = |ptr: *mut c_void| cudaPitchedPtr {
        ptr,
        pitch: PITCH,
        xsize: PITCH,
        ysize: 2,
    };
    let origin = cudaPos { x: 0, y: 0, z: 0 };
    let p3d = cudaMemcpy3DParms {
        srcArray: std::ptr::null_mut(),
        srcPos: origin,
        srcPtr: pitched(b),
        dstArray: std::ptr::null_mut(),
        dstPos: origin,
        dstPtr: pitched(c),
        extent: cudaExtent {
            width: 32,
            height: 2,
            depth: 2,
        },
        kind: cudaMemcpyDeviceToDevice,
    };
    ck!(cudaGraphAddMemcpyNode(&mut copy3d, g, &d2d, 1, &p3d));
    // A child graph of one 2-byte memset, copied into the node: destroying it changes nothing.
    let mut cg: cudaGraph_t = std::ptr::null_mut();
    ck!(cudaGraphCreate(&mut cg, 0));
    let memset2 = cudaMemsetParams {
        dst: k,
        pitch: 0,
        value: 0xBEEF,
        elementSize: 2,
        width: N / 2,
        height: 1,
    };
    let mut inner = none();
    ck!(cudaGraphAddMemsetNode(&mut inner, cg, null, 0, &memset2));
    ck!(cudaGraphAddChildGraphNode(&mut child, g, null, 0, cg));
    ck!(cudaGraphDestroy(cg));
    let after = [d2d, empty];
    ck!(cudaGraphAddMemcpyNode1D(
        &mut down,
        g,
        after.as_ptr(),
        after.len(),
        host_dst.cast(),
        b,
        N,
        cudaMemcpyDeviceToHost
    ));

    // Refused, as CUDA documents: a null out-pointer, a null dependency array with a count, a
    // dependency of another graph, a dependency named twice, invalid parameters.
    let mut other: cudaGraph_t = std::ptr::null_mut();
    ck!(cudaGraphCreate(&mut other, 0));
    let mut foreign = none();
    ck!(cudaGraphAddEmptyNode(&mut foreign, other, null, 0));
    let mut refused = none();
    expect_code!(
        cudaGraphAddEmptyNode(std::ptr::null_mut(), g, null, 0),
        cudaErrorInvalidValue
    );
    expect_code!(
        cudaGraphAddEmptyNode(&mut refused, g, null, 1),
        cudaErrorInvalidValue
    );
    expect_code!(
        cudaGraphAddEmptyNode(&mut refused, g, &foreign, 1),
        cudaErrorInvalidValue
    );
    let twice = [up, up];
    expect_code!(
        cudaGraphAddEmptyNode(&mut refused, g, twice.as_ptr(), 2),
        cudaErrorInvalidValue
    );
    let bad_size = cudaMemsetParams {
        elementSize: 3,
        ..memset4
    };
    expect_code!(
        cudaGraphAddMemsetNode(&mut refused, g, null, 0, &bad_size),
        cudaErrorInvalidValue
    );
    expect_code!(
        cudaGraphAddMemcpyNode1D(&mut refused, g, null, 0, b, a, 0, cudaMemcpyDeviceToDevice),
        cudaErrorInvalidValue
    );
    expect_code!(
        cudaGraphAddMemcpyNode1D(&mut refused, g, null, 0, b, a, N + 1, cudaMemcpyDefault),
        cudaErrorInvalidValue
    );
    ck!(cudaGraphDestroy(other));

    let want = [up, d2d, set4, empty, copy3d, child, down];
    let mut nodes = [std::ptr::null_mut(); 8];
    let mut count = nodes.len();
    ck!(cudaGraphGetNodes(g, nodes.as_mut_ptr(), &mut count));
    if nodes[..count] != want || !nodes[count].is_null() {
        return Err(format!(
            "cudaGraphGetNodes gave {count} nodes {:?}, expected {want:?}",
            &nodes[..count]
        ));
    }
    let mut kinds = Vec::new();
    for n in want {
        let mut t = 99;
        ck!(cudaGraphNodeGetType(n, &mut t));
        kinds.push(t);
    }
    let want_kinds = [
        cudaGraphNodeTypeMemcpy,
        cudaGraphNodeTypeMemcpy,
        cudaGraphNodeTypeMemset,
        cudaGraphNodeTypeEmpty,
        cudaGraphNodeTypeMemcpy,
        cudaGraphNodeTypeGraph,
        cudaGraphNodeTypeMemcpy,
    ];
    if kinds != want_kinds {
        return Err(format!("node types {kinds:?}, expected {want_kinds:?}"));
    }

    let mut exec: cudaGraphExec_t = std::ptr::null_mut();
    ck!(cudaGraphInstantiate(&mut exec, g, 0));
    let read_device = |p: *mut c_void| -> Result<Vec<u8>, String> {
        let mut v = vec![0u8; N];
        ck!(cudaMemcpy(
            v.as_mut_ptr().cast(),
            p,
            N,
            cudaMemcpyDeviceToHost
        ));
        Ok(v)
    };
    // What the download buffer holds before each launch: the poison, then the previous
    // launch's bytes.
    let mut before = vec![POISON; N];
    for launch in 0..2u8 {
        // SAFETY: pinned buffer of N bytes; the previous launch has completed.
        let src = unsafe { std::slice::from_raw_parts_mut(host_src, N) };
        for (i, x) in src.iter_mut().enumerate() {
            *x = (i as u8).wrapping_mul(7).wrapping_add(launch * 101);
        }
        let src = src.to_vec();
        // The launch is stream-ordered: it runs after the gate the stream is held at.
        close_gate();
        ck!(cudaLaunchHostFunc(
            s,
            Some(wait_for_gate),
            std::ptr::null_mut()
        ));
        ck!(cudaGraphLaunch(exec, s));
        std::thread::sleep(Duration::from_millis(20));
        // SAFETY: pinned buffer of N bytes, read while the launch is held back.
        let early = unsafe { std::slice::from_raw_parts(host_dst, N) }.to_vec();
        if early != before {
            return Err(format!(
                "launch {launch} ran before the work enqueued ahead of it"
            ));
        }
        open_gate();
        ck!(cudaStreamSynchronize(s));
        // SAFETY: pinned buffer of N bytes; the launch has completed.
        let got = unsafe { std::slice::from_raw_parts(host_dst, N) }.to_vec();
        if got != src {
            return Err(format!(
                "launch {launch}: the download did not bring back the upload's bytes"
            ));
        }
        let want_c: Vec<u8> = (0..N)
            .map(|i| if i % PITCH < 32 { src[i] } else { POISON })
            .collect();
        if read_device(c)? != want_c {
            return Err(format!(
                "launch {launch}: the 3-D copy node's bytes are wrong"
            ));
        }
        let want_m: Vec<u8> = (0..N)
            .map(|i| match i % PITCH {
                j if j < 32 => 0x1122_3344u32.to_le_bytes()[j % 4],
                _ => POISON,
            })
            .collect();
        if read_device(m)? != want_m {
            return Err(format!(
                "launch {launch}: the pitched memset node's bytes are wrong"
            ));
        }
        let want_k: Vec<u8> = (0..N).map(|i| 0xBEEFu16.to_le_bytes()[i % 2]).collect();
        if read_device(k)? != want_k {
            return Err(format!(
                "launch {launch}: the child graph's memset bytes are wrong"
            ));
        }
        before = src;
    }
    ck!(cudaGraphExecDestroy(exec));
    ck!(cudaGraphDestroy(g));
    // SAFETY: the node handle died with its graph.
    if unsafe { cudaGraphNodeGetType(up, &mut 0) } == cudaSuccess {
        return Err("a node of a destroyed graph is still valid".into());
    }
    println!("graph-build OK");
    Ok(())
}

/// Dereferences a device pointer on the host: on a GPU this faults, and so it must here.
pub fn device_deref(_: &[String]) -> Result<(), String> {
    let dev = device_buffer(64)?;
    // SAFETY: deliberately invalid: the process is expected to die with SIGSEGV.
    let v = unsafe { dev.cast::<u8>().read_volatile() };
    Err(format!(
        "reading a device pointer on the host returned {v} instead of faulting"
    ))
}

/// The last-error protocol, device queries and invalid frees.
pub fn errors(_: &[String]) -> Result<(), String> {
    let mut n = 0;
    ck!(cudaGetDeviceCount(&mut n));
    if n < 1 {
        return Err("no devices".into());
    }
    expect_code!(cudaSetDevice(n), cudaErrorInvalidDevice);
    // SAFETY: reading and clearing the last error.
    if unsafe { cudaGetLastError() } != cudaErrorInvalidDevice {
        return Err("cudaGetLastError did not report the failed cudaSetDevice".into());
    }
    // SAFETY: as above.
    if unsafe { cudaGetLastError() } != cudaSuccess {
        return Err("cudaGetLastError did not clear the error".into());
    }
    let mut v = 0;
    ck!(cudaRuntimeGetVersion(&mut v));
    if v / 1000 != 12 {
        return Err(format!("runtime version {v}"));
    }
    let mut prop = cudaDeviceProp::default();
    ck!(cudaGetDeviceProperties_v2(&mut prop, 0));
    if prop.major < 9 || prop.multiProcessorCount <= 0 {
        return Err("device properties are not those of an FP8-capable device".into());
    }
    let mut p = std::ptr::null_mut();
    expect_code!(cudaFree(0x1234usize as *mut c_void), cudaErrorInvalidValue);
    ck!(cudaMalloc(&mut p, 16));
    ck!(cudaFree(p));
    expect_code!(cudaFree(p), cudaErrorInvalidValue);
    Ok(())
}
