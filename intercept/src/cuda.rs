//! The runtime calls the tracer itself makes, through the real functions (never the hooks),
//! as small safe wrappers. A missing function is `cudaErrorSharedObjectSymbolNotFound`.
//!
//! A failing runtime call sets the calling thread's last error, which the program may read
//! with `cudaGetLastError`; [`ErrScope`] puts it back when the tracer's own call failed.

use core::ffi::{c_int, c_void};
use std::sync::Mutex;

use cuda_abi::cudart::*;

use crate::real;

/// `cudaErrorSharedObjectSymbolNotFound`: what a hook returns when the real function is
/// nowhere (a program probing for the symbol found the hook).
pub const MISSING: cudaError_t = 302;

/// Whether `code` is one of the runtime's sticky errors: the context is unusable, every later
/// call fails the same way (a kernel fault, a launch failure, a destroyed context).
pub fn is_fatal(code: cudaError_t) -> bool {
    matches!(
        code,
        214 | 700 | 702 | 709 | 710 | 714 | 715 | 716 | 717 | 718 | 719
    )
}

/// Keeps the calling thread's last runtime error as the program left it.
pub struct ErrScope {
    before: Option<cudaError_t>,
}

impl ErrScope {
    /// Notes the current last error (without clearing it).
    pub fn new() -> ErrScope {
        ErrScope {
            // SAFETY: no arguments; only reads the thread's last error.
            before: real::cudaPeekAtLastError().map(|f| unsafe { f() }),
        }
    }
}

impl Drop for ErrScope {
    fn drop(&mut self) {
        let (Some(before), Some(peek), Some(get)) = (
            self.before,
            real::cudaPeekAtLastError(),
            real::cudaGetLastError(),
        ) else {
            return;
        };
        // SAFETY: no arguments.
        let now = unsafe { peek() };
        // A tracer call failed after a clean state: clear it. (An error the program had not
        // read yet cannot be put back if the tracer's replaced it; the tracer only makes calls
        // that fail when the program's own call fails the same way.)
        if now != before && before == cudaSuccess {
            // SAFETY: no arguments; clears the thread's last error.
            unsafe { get() };
        }
    }
}

fn check(code: cudaError_t) -> Result<(), cudaError_t> {
    if code == cudaSuccess {
        Ok(())
    } else {
        Err(code)
    }
}

/// The current device.
pub fn get_device() -> Result<i32, cudaError_t> {
    let f = real::cudaGetDevice().ok_or(MISSING)?;
    let mut d: c_int = 0;
    // SAFETY: an out-pointer to a local.
    check(unsafe { f(&mut d) })?;
    Ok(d)
}

fn set_device(d: i32) -> Result<(), cudaError_t> {
    let f = real::cudaSetDevice().ok_or(MISSING)?;
    // SAFETY: plain value argument.
    check(unsafe { f(d) })
}

/// Whether `stream` is being captured into a graph (active or invalidated capture).
pub fn is_capturing(stream: cudaStream_t) -> Result<bool, cudaError_t> {
    let f = real::cudaStreamIsCapturing().ok_or(MISSING)?;
    let mut st: cudaStreamCaptureStatus = cudaStreamCaptureStatusNone;
    // SAFETY: the program's stream handle and an out-pointer to a local.
    check(unsafe { f(stream, &mut st) })?;
    Ok(st != cudaStreamCaptureStatusNone)
}

/// Whether `ptr` is device memory (device or managed), per `cudaPointerGetAttributes`.
pub fn is_device_memory(ptr: *const c_void) -> Result<bool, cudaError_t> {
    /// `struct cudaPointerAttributes` as CUDA 13 declares it: CUDA 12's four fields, then
    /// `long reserved[8]`. CUDA 13's runtime writes all 88 bytes, CUDA 12's the first 24, so
    /// this buffer is right for the runtime of either major (docs/cuda13.md).
    #[repr(C)]
    struct Attributes {
        a: cudaPointerAttributes,
        reserved: [core::ffi::c_long; 8],
    }
    let f = real::cudaPointerGetAttributes().ok_or(MISSING)?;
    let mut buf = Attributes {
        a: cudaPointerAttributes {
            type_: cudaMemoryTypeUnregistered,
            device: 0,
            devicePointer: core::ptr::null_mut(),
            hostPointer: core::ptr::null_mut(),
        },
        reserved: [0; 8],
    };
    // The pointer covers the whole buffer, not only its first field.
    let out = (&mut buf as *mut Attributes).cast::<cudaPointerAttributes>();
    // SAFETY: an out-pointer to a local as large as either major's struct; the pointer is
    // only classified.
    check(unsafe { f(out, ptr) })?;
    let a = buf.a;
    Ok(matches!(
        a.type_,
        cudaMemoryTypeDevice | cudaMemoryTypeManaged
    ))
}

/// Enqueues a copy of `len` bytes from `src` (any memory the device reaches) to `dst` in the
/// pinned ring, on `stream`.
pub fn copy_linear(
    dst: *mut u8,
    src: u64,
    len: u64,
    stream: cudaStream_t,
) -> Result<(), cudaError_t> {
    // `dst` is `len` bytes of the pinned ring slot the caller owns; `src` is an address the
    // program's op uses.
    memcpy_async(dst.cast(), src as *const c_void, len, stream)
}

/// Enqueues a pitched copy (`height` rows of `width` bytes, `spitch` apart) packed into `dst`.
pub fn copy_pitched(
    dst: *mut u8,
    src: u64,
    spitch: u64,
    width: u64,
    height: u64,
    stream: cudaStream_t,
) -> Result<(), cudaError_t> {
    // `dst` is `width * height` bytes of the caller's ring slot; the source rows are inside
    // the operand the program's op reads or writes.
    let rows = Rows {
        dpitch: width,
        spitch,
        width,
        height,
    };
    memcpy_2d_async(dst.cast(), src as *const c_void, rows, stream)
}

/// Enqueues a copy of `len` bytes from the host buffer `src` to `dst` (device memory the
/// program's op wrote), on `stream`.
pub fn copy_back_linear(
    dst: u64,
    src: *const u8,
    len: u64,
    stream: cudaStream_t,
) -> Result<(), cudaError_t> {
    // `src` is `len` readable bytes of the caller's pinned buffer; `dst` is the range of the
    // op's output the same bytes were copied from.
    memcpy_async(dst as *mut c_void, src.cast(), len, stream)
}

/// Enqueues the inverse of [`copy_pitched`]: `height` packed rows of `width` bytes at `src`
/// back to rows `dpitch` bytes apart at `dst`.
pub fn copy_back_pitched(
    dst: u64,
    dpitch: u64,
    src: *const u8,
    width: u64,
    height: u64,
    stream: cudaStream_t,
) -> Result<(), cudaError_t> {
    // `src` is `width * height` readable bytes of the caller's pinned buffer; the destination
    // rows are the ones the same bytes were copied from.
    let rows = Rows {
        dpitch,
        spitch: width,
        width,
        height,
    };
    memcpy_2d_async(dst as *mut c_void, src.cast(), rows, stream)
}

/// The real `cudaMemcpyAsync` of `len` bytes, `cudaMemcpyDefault` (the runtime classifies
/// both ends), on `stream`. Only for the ranges the four `copy_*` functions above describe.
fn memcpy_async(
    dst: *mut c_void,
    src: *const c_void,
    len: u64,
    stream: cudaStream_t,
) -> Result<(), cudaError_t> {
    let f = real::cudaMemcpyAsync().ok_or(MISSING)?;
    // SAFETY: the callers above pass a range of the tracer's pinned memory and a range of
    // memory the program's op uses, each `len` bytes.
    check(unsafe { f(dst, src, len as usize, cudaMemcpyDefault, stream) })
}

/// The rows of a pitched copy: `height` rows of `width` bytes, `spitch` apart at the source
/// and `dpitch` apart at the destination.
struct Rows {
    dpitch: u64,
    spitch: u64,
    width: u64,
    height: u64,
}

/// The real `cudaMemcpy2DAsync` of `rows`, `cudaMemcpyDefault`, on `stream`. Only for the
/// ranges the `copy_*pitched` functions above describe.
fn memcpy_2d_async(
    dst: *mut c_void,
    src: *const c_void,
    rows: Rows,
    stream: cudaStream_t,
) -> Result<(), cudaError_t> {
    let f = real::cudaMemcpy2DAsync().ok_or(MISSING)?;
    // SAFETY: the callers above pass packed rows of the tracer's pinned memory and the rows
    // of an operand the program's op uses, `height` rows of `width` bytes each.
    check(unsafe {
        f(
            dst,
            rows.dpitch as usize,
            src,
            rows.spitch as usize,
            rows.width as usize,
            rows.height as usize,
            cudaMemcpyDefault,
            stream,
        )
    })
}

/// Records `ev` on `stream`.
pub fn event_record(ev: cudaEvent_t, stream: cudaStream_t) -> Result<(), cudaError_t> {
    let f = real::cudaEventRecord().ok_or(MISSING)?;
    // SAFETY: an event from the pool and the op's stream.
    check(unsafe { f(ev, stream) })
}

/// `cudaEventQuery`: `cudaSuccess` when complete, `cudaErrorNotReady` while pending.
pub fn event_query(ev: cudaEvent_t) -> cudaError_t {
    match real::cudaEventQuery() {
        // SAFETY: an event from the pool.
        Some(f) => unsafe { f(ev) },
        None => MISSING,
    }
}

/// `cudaEventSynchronize`: blocks the calling thread (not the device) until `ev` completed.
/// The pool's events are `cudaEventBlockingSync`: the thread sleeps in the driver instead of
/// spinning.
pub fn event_synchronize(ev: cudaEvent_t) -> cudaError_t {
    match real::cudaEventSynchronize() {
        // SAFETY: an event from the pool.
        Some(f) => unsafe { f(ev) },
        None => MISSING,
    }
}

/// Page-locks `len` bytes at `ptr` for DMA (portable: every device).
pub fn host_register(ptr: *mut u8, len: usize) -> Result<(), cudaError_t> {
    let f = real::cudaHostRegister().ok_or(MISSING)?;
    // SAFETY: a live mapping of `len` bytes owned by the tracer for the life of the process.
    check(unsafe { f(ptr.cast(), len, cudaHostRegisterPortable) })
}

/// Waits until `stream` has done everything enqueued on it (the perturbation of a reference
/// run only: the capture path never synchronises).
pub fn stream_synchronize(stream: cudaStream_t) -> Result<(), cudaError_t> {
    let f = real::cudaStreamSynchronize().ok_or(MISSING)?;
    // SAFETY: the program's stream handle, which its op just used.
    check(unsafe { f(stream) })
}

/// Allocates `len` bytes of page-locked host memory.
pub fn malloc_host(len: usize) -> Result<*mut u8, cudaError_t> {
    let f = real::cudaMallocHost().ok_or(MISSING)?;
    let mut p: *mut c_void = core::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    check(unsafe { f(&mut p, len) })?;
    if p.is_null() {
        return Err(2); // cudaErrorMemoryAllocation
    }
    Ok(p.cast())
}

/// Enqueues `f(data)` on `stream` (the perturbation of a reference run recorded into a CUDA
/// graph: during a stream capture it becomes a host node, run at every replay).
pub fn launch_host_func(
    stream: cudaStream_t,
    f: unsafe extern "C" fn(*mut c_void),
    data: *mut c_void,
) -> Result<(), cudaError_t> {
    let real = real::cudaLaunchHostFunc().ok_or(MISSING)?;
    // SAFETY: the program's stream; `f` touches only host memory (no CUDA call) and `data`
    // stays valid for as long as the stream or a graph made from it may run it.
    check(unsafe { real(stream, Some(f), data) })
}

/// Frees memory from [`malloc_host`].
pub fn free_host(p: *mut u8) -> Result<(), cudaError_t> {
    let f = real::cudaFreeHost().ok_or(MISSING)?;
    // SAFETY: `p` came from cudaMallocHost and nothing uses it any more.
    check(unsafe { f(p.cast()) })
}

/// Sets the calling thread's stream-capture mode; returns the previous one.
pub fn exchange_capture_mode(
    mode: cudaStreamCaptureMode,
) -> Result<cudaStreamCaptureMode, cudaError_t> {
    let f = real::cudaThreadExchangeStreamCaptureMode().ok_or(MISSING)?;
    let mut m = mode;
    // SAFETY: an in/out pointer to a local.
    check(unsafe { f(&mut m) })?;
    Ok(m)
}

/// A completion event from the pool, with the device it belongs to and the stream it was
/// recorded on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub raw: usize,
    pub device: i32,
    /// The stream it was last recorded on ([`lane`]; 0 while not recorded): of two events
    /// recorded on one lane, the later completes after the earlier.
    pub lane: u64,
}

impl Event {
    /// The handle.
    pub fn handle(self) -> cudaEvent_t {
        self.raw as cudaEvent_t
    }
}

/// Events by device, created lazily (`cudaEventDisableTiming | cudaEventBlockingSync`) and
/// reused once complete (a process drives a few devices: a list beats a hash map).
static POOL: Mutex<Vec<(i32, Vec<usize>)>> = Mutex::new(Vec::new());

/// An event of `device` (the caller's current device must be `device`, or it is switched for
/// the creation and restored).
pub fn event_get(device: i32) -> Result<Event, cudaError_t> {
    let pooled = POOL
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter_mut()
        .find(|(d, _)| *d == device)
        .and_then(|(_, free)| free.pop());
    if let Some(raw) = pooled {
        return Ok(Event {
            raw,
            device,
            lane: 0,
        });
    }
    // Created outside the pool's lock: never hold a tracer lock while calling CUDA.
    let f = real::cudaEventCreateWithFlags().ok_or(MISSING)?;
    let current = get_device()?;
    if current != device {
        set_device(device)?;
    }
    let mut ev: cudaEvent_t = core::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    let r = check(unsafe { f(&mut ev, cudaEventDisableTiming | cudaEventBlockingSync) });
    if current != device {
        let _ = set_device(current);
    }
    r?;
    Ok(Event {
        raw: ev as usize,
        device,
        lane: 0,
    })
}

/// Returns a completed (or never recorded) event to the pool.
pub fn event_put(ev: Event) {
    let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
    match pool.iter_mut().find(|(d, _)| *d == ev.device) {
        Some((_, free)) => free.push(ev.raw),
        None => pool.push((ev.device, vec![ev.raw])),
    }
}

/// Records a pooled event of `device` on `stream` (the op's, on the calling thread), after
/// everything enqueued on it so far: a snapshot's completion.
pub fn record_completion(device: i32, stream: cudaStream_t) -> Result<Event, cudaError_t> {
    let ev = event_get(device)?;
    if let Err(code) = event_record(ev.handle(), stream) {
        // Never recorded: nothing can wait on it.
        event_put(ev);
        return Err(code);
    }
    Ok(Event {
        lane: lane(device, stream),
        ..ev
    })
}

/// Which stream work enqueued on `stream` by the calling thread runs on, as a key: the device's
/// legacy default stream for `0` and `cudaStreamLegacy` (whichever thread), the calling
/// thread's own for `cudaStreamPerThread`, else the stream the handle names. Never 0.
fn lane(device: i32, stream: cudaStream_t) -> u64 {
    let (handle, thread) = match stream as usize {
        0 => (cudaStreamLegacy as u64, 0),
        h if h == cudaStreamPerThread as usize => (
            h as u64,
            crate::thread::with(|t| t.tid()).unwrap_or_else(crate::identity::gettid),
        ),
        h => (h as u64, 0),
    };
    crate::identity::Fnv::default()
        .u64(device as u64)
        .u64(handle)
        .u64(thread)
        .finish()
        .max(1)
}

/// The major version of the CUDA runtime the program uses (12 when it cannot be told).
pub fn runtime_major() -> i32 {
    use std::sync::atomic::{AtomicI32, Ordering};
    static MAJOR: AtomicI32 = AtomicI32::new(0);
    let m = MAJOR.load(Ordering::Relaxed);
    if m != 0 {
        return m;
    }
    let mut v: c_int = 0;
    let m = match real::cudaRuntimeGetVersion() {
        // SAFETY: an out-pointer to a local.
        Some(f) if unsafe { f(&mut v) } == cudaSuccess && v > 0 => v / 1000,
        _ => 12,
    };
    MAJOR.store(m, Ordering::Relaxed);
    m
}

/// The graph `stream` is being captured into and the node the stream captured last (its
/// frontier, when it is exactly one node); `(0, None)` when it is not capturing.
pub fn capture_info(stream: cudaStream_t) -> Result<(usize, Option<usize>), cudaError_t> {
    let mut status: cudaStreamCaptureStatus = 0;
    let mut graph: cudaGraph_t = core::ptr::null_mut();
    let mut deps: *const cudaGraphNode_t = core::ptr::null();
    let mut n: usize = 0;
    let null = core::ptr::null_mut();
    if runtime_major() >= 13 {
        let f = real::cudaStreamGetCaptureInfo().ok_or(MISSING)?;
        let mut edges: *const cudaGraphEdgeData = core::ptr::null();
        // SAFETY: out-pointers to locals; CUDA 13's signature (checked by the major version).
        check(unsafe {
            f(
                stream,
                &mut status,
                null,
                &mut graph,
                &mut deps,
                &mut edges,
                &mut n,
            )
        })?;
    } else {
        let f = real::cudaStreamGetCaptureInfo_v2().ok_or(MISSING)?;
        // SAFETY: out-pointers to locals.
        check(unsafe { f(stream, &mut status, null, &mut graph, &mut deps, &mut n) })?;
    }
    if status != cudaStreamCaptureStatusActive {
        return Ok((0, None));
    }
    let tail = if n == 1 && !deps.is_null() {
        // SAFETY: the runtime's array of `n` node handles, valid until the next call on the
        // stream.
        Some(unsafe { *deps } as usize)
    } else {
        None
    };
    Ok((graph as usize, tail))
}

/// Points a 1-D memcpy node of an instantiated graph at `dst` for its later launches.
pub fn redirect_copy(
    exec: usize,
    node: usize,
    dst: *mut u8,
    src: u64,
    len: u64,
) -> Result<(), cudaError_t> {
    let f = real::cudaGraphExecMemcpyNodeSetParams1D().ok_or(MISSING)?;
    // SAFETY: an instance and a memcpy node of its graph the tracer captured; `dst` is `len`
    // bytes of pinned memory the tracer owns; `src` is the node's own source.
    check(unsafe {
        f(
            exec as cudaGraphExec_t,
            node as cudaGraphNode_t,
            dst.cast(),
            src as *const c_void,
            len as usize,
            cudaMemcpyDefault,
        )
    })
}

/// Destroys `graph` (`cudaGraphDestroy`): one whose destruction the program asked for while
/// the tracer still needed its nodes (graph.rs).
pub fn graph_destroy(graph: usize) -> Result<(), cudaError_t> {
    // The runtime's, else the driver's (a program such as XLA that makes its graphs through
    // the driver need not load the runtime; the handles are the same).
    if let Some(destroy) = real::cudaGraphDestroy() {
        // SAFETY: a graph the program made and asked to destroy, which nothing uses any more.
        return check(unsafe { destroy(graph as cudaGraph_t) });
    }
    let destroy = real::cuGraphDestroy().ok_or(MISSING)?;
    // SAFETY: as above.
    check(unsafe { destroy(graph as cuda_abi::driver::CUgraph) })
}

/// The type of every node of `graph` (`cudaGraphGetNodes`, `cudaGraphNodeGetType`).
pub fn node_types(graph: usize) -> Result<Vec<cudaGraphNodeType>, cudaError_t> {
    let nodes = real::cudaGraphGetNodes().ok_or(MISSING)?;
    let kind = real::cudaGraphNodeGetType().ok_or(MISSING)?;
    let mut n = 0usize;
    // SAFETY: a graph the program instantiated; a null array asks for the count only.
    check(unsafe { nodes(graph as cudaGraph_t, core::ptr::null_mut(), &mut n) })?;
    let mut list: Vec<cudaGraphNode_t> = vec![core::ptr::null_mut(); n];
    // SAFETY: `list` has room for `n` nodes, the count passed.
    check(unsafe { nodes(graph as cudaGraph_t, list.as_mut_ptr(), &mut n) })?;
    list.truncate(n);
    list.into_iter()
        .map(|node| {
            let mut t: cudaGraphNodeType = 0;
            // SAFETY: a node of the graph and an out-pointer to a local.
            check(unsafe { kind(node, &mut t) }).map(|()| t)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events recorded on one lane complete in order, so the lane must name the stream work
    /// really runs on: 0 and `cudaStreamLegacy` are the device's one legacy stream (whichever
    /// thread), `cudaStreamPerThread` is each thread's own, a created stream is itself.
    #[test]
    fn a_lane_is_the_stream_work_runs_on() {
        let (named, s) = (0x5000usize, 0x5000 as cudaStream_t);
        assert_eq!(lane(0, std::ptr::null_mut()), lane(0, cudaStreamLegacy));
        assert_ne!(
            lane(0, cudaStreamLegacy),
            lane(1, cudaStreamLegacy),
            "per device"
        );
        assert_ne!(lane(0, s), lane(0, cudaStreamLegacy));
        let here = (
            lane(0, cudaStreamPerThread),
            lane(0, s),
            lane(0, cudaStreamLegacy),
        );
        let there = std::thread::spawn(move || {
            (
                lane(0, cudaStreamPerThread),
                lane(0, named as cudaStream_t),
                lane(0, cudaStreamLegacy),
            )
        })
        .join()
        .expect("thread");
        assert_ne!(here.0, there.0, "each thread has its own per-thread stream");
        assert_eq!(
            (here.1, here.2),
            (there.1, there.2),
            "shared streams are shared"
        );
        assert!(
            [here.0, here.1, here.2].iter().all(|&l| l != 0),
            "0 means not recorded"
        );
    }
}
