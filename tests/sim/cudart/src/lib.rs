//! Simulated `libcudart.so.12`: the CUDA 12 runtime API on host memory.
//!
//! What a tracer can observe behaves as on a GPU:
//! * device pointers are not host-dereferenceable ([`heap`]); pinned host memory is
//!   device-accessible, pageable memory is not;
//! * streams run their work asynchronously on worker threads, in order, after the call returned;
//!   cross-stream order comes only from events and the legacy default stream's rules
//!   ([`streams`]);
//! * the synchronous/asynchronous rules of memcpy with pageable or pinned memory, the
//!   per-thread default stream (`_ptds`/`_ptsz` exports), stream capture with its
//!   thread-mode rules, and sticky kernel faults.
//!
//! The simulated cuBLAS, cuBLASLt and NCCL reach this runtime through the private exports in
//! `ext` (see the `sim-device` crate), like real libraries that link the runtime statically.
//!
//! Environment: `SIM_CUDA_DEVICES` (number of devices, default 8; `CUDA_VISIBLE_DEVICES`
//! narrows it as usual).
#![allow(clippy::missing_safety_doc)]

pub mod errors;
pub mod heap;
pub mod streams;

#[cfg(sim_cuda13)]
mod api13;
mod api_device;
mod api_extra;
mod api_graph;
mod api_kernel;
mod api_memory;
mod api_stream;
mod ext;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cuda_abi::cudart::*;
use heap::Heap;
use streams::{
    Capture, Dep, Event, Graph, GraphExec, Handles, Node, NodeBody, Op, Stream, StreamKind,
};

/// Per-device state.
pub struct Device {
    legacy: OnceLock<Option<Arc<Stream>>>,
    /// Every stream ever created on the device that is still alive (for implicit sync and
    /// `cudaDeviceSynchronize`).
    streams: Mutex<Vec<Weak<Stream>>>,
    /// Whether the device's primary context exists: the runtime creates it on the first call
    /// that needs the device (`cudaSetDevice`, work on a stream, an allocation), and the
    /// simulated driver (`cuDevicePrimaryCtxGetState`) reports it, as PyTorch checks.
    primary: AtomicBool,
}

/// Process-wide runtime state, created on the first call.
pub struct Runtime {
    pub heap: Heap,
    devices: Vec<Device>,
    streams: Handles<Stream>,
    events: Handles<Event>,
    graphs: Handles<Graph>,
    execs: Handles<GraphExec>,
    /// Every node of a live graph (node handles are validated against it).
    nodes: Handles<Node>,
    /// Active capture sequences (usually none: checked with one atomic load).
    captures: Mutex<Vec<Arc<Mutex<Capture>>>>,
    active_captures: AtomicUsize,
}

/// Set in a child forked after the runtime was initialised (a `pthread_atfork` child handler
/// registered at initialisation): such a child may not use it. A flag, not a `getpid` per
/// call: a system call in every export would charge the host for what a driver does not.
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn forked_child() {
    FORKED.store(true, Ordering::Relaxed);
}

static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();

thread_local! {
    static CURRENT_DEVICE: Cell<i32> = const { Cell::new(0) };
    static CAPTURE_MODE: Cell<cudaStreamCaptureMode> = const { Cell::new(cudaStreamCaptureModeGlobal) };
    static PER_THREAD: RefCell<HashMap<i32, PerThreadStream>> = RefCell::new(HashMap::new());
}

/// A thread's per-thread default stream: closed when the thread exits, so its worker drains
/// the queue and ends instead of outliving the thread.
struct PerThreadStream(Arc<Stream>);

impl Drop for PerThreadStream {
    fn drop(&mut self) {
        self.0.close();
    }
}

fn device_count_from_env() -> usize {
    let n = std::env::var("SIM_CUDA_DEVICES")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(8);
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) if !v.trim().is_empty() => v
            .split(',')
            .filter(|d| d.trim().parse::<usize>().is_ok_and(|i| i < n))
            .count(),
        Ok(_) => 0,
        Err(_) => n,
    }
}

/// The runtime, or the error every call returns when it cannot exist.
pub fn rt() -> Result<&'static Runtime, cudaError_t> {
    let r = RUNTIME
        .get_or_init(|| {
            let heap = Heap::new().ok()?;
            // SAFETY: registers a handler that only stores to an atomic (async-signal-safe).
            unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
            let devices = (0..device_count_from_env())
                .map(|_| Device {
                    legacy: OnceLock::new(),
                    streams: Mutex::new(Vec::new()),
                    primary: AtomicBool::new(false),
                })
                .collect();
            Some(Runtime {
                heap,
                devices,
                streams: Handles::default(),
                events: Handles::default(),
                graphs: Handles::default(),
                execs: Handles::default(),
                nodes: Handles::default(),
                captures: Mutex::new(Vec::new()),
                active_captures: AtomicUsize::new(0),
            })
        })
        .as_ref()
        .ok_or(cudaErrorInitializationError)?;
    if FORKED.load(Ordering::Relaxed) {
        // CUDA cannot be used in a child forked after initialisation.
        return Err(cudaErrorInitializationError);
    }
    if r.devices.is_empty() {
        return Err(cudaErrorNoDevice);
    }
    Ok(r)
}

/// Runs an export's body: a panic never crosses the C boundary; errors become the thread's
/// last error.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), cudaError_t>) -> cudaError_t {
    let r =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(Err(cudaErrorUnknown));
    errors::status(r)
}

/// Writes `v` through an out-pointer, rejecting null.
pub(crate) unsafe fn out<T>(p: *mut T, v: T) -> Result<(), cudaError_t> {
    if p.is_null() {
        return Err(cudaErrorInvalidValue);
    }
    // SAFETY: non-null out-pointer supplied by the caller, as the C API requires.
    unsafe { p.write(v) };
    Ok(())
}

impl Runtime {
    pub fn device_count(&self) -> i32 {
        self.devices.len() as i32
    }

    pub fn current_device(&self) -> i32 {
        CURRENT_DEVICE.with(|d| d.get())
    }

    pub fn set_current_device(&self, d: i32) -> Result<(), cudaError_t> {
        if d < 0 || d >= self.device_count() {
            return Err(cudaErrorInvalidDevice);
        }
        CURRENT_DEVICE.with(|c| c.set(d));
        self.activate(d);
        Ok(())
    }

    /// `cudaErrorInvalidResourceHandle` unless `g` is a live graph.
    pub fn graph_exists(&self, g: cudaGraph_t) -> Result<(), cudaError_t> {
        self.graphs
            .get(g as usize)
            .map(|_| ())
            .ok_or(cudaErrorInvalidResourceHandle)
    }

    /// Creates device `d`'s primary context (a flag: the simulator needs no context state).
    pub fn activate(&self, d: i32) {
        if let Ok(dev) = self.device(d) {
            dev.primary.store(true, Ordering::Release);
        }
    }

    /// Whether device `d`'s primary context exists.
    pub fn is_active(&self, d: i32) -> bool {
        self.device(d)
            .is_ok_and(|dev| dev.primary.load(Ordering::Acquire))
    }

    fn device(&self, d: i32) -> Result<&Device, cudaError_t> {
        self.devices.get(d as usize).ok_or(cudaErrorInvalidDevice)
    }

    /// Creates a stream on device `d` and registers it with the device.
    fn spawn_stream(
        &self,
        d: i32,
        kind: StreamKind,
        flags: u32,
        priority: i32,
    ) -> Result<Arc<Stream>, cudaError_t> {
        let s = Stream::spawn(d, kind, flags, priority).ok_or(cudaErrorMemoryAllocation)?;
        let dev = self.device(d)?;
        let mut list = dev.streams.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&s));
        Ok(s)
    }

    /// The legacy default stream of device `d`.
    fn legacy(&self, d: i32) -> Result<Arc<Stream>, cudaError_t> {
        self.device(d)?
            .legacy
            .get_or_init(|| self.spawn_stream(d, StreamKind::Legacy, 0, 0).ok())
            .clone()
            .ok_or(cudaErrorMemoryAllocation)
    }

    /// The calling thread's per-thread default stream on the current device.
    fn per_thread(&self) -> Result<Arc<Stream>, cudaError_t> {
        let d = self.current_device();
        if let Some(s) = PER_THREAD.with(|m| m.borrow().get(&d).map(|p| p.0.clone())) {
            return Ok(s);
        }
        let s = self.spawn_stream(d, StreamKind::PerThread, 0, 0)?;
        PER_THREAD.with(|m| m.borrow_mut().insert(d, PerThreadStream(s.clone())));
        Ok(s)
    }

    /// Maps a stream handle to its stream. `per_thread_default` says how the caller was built:
    /// a `_ptsz`/`_ptds` export means handle 0 is the per-thread stream.
    pub fn stream(
        &self,
        h: cudaStream_t,
        per_thread_default: bool,
    ) -> Result<Arc<Stream>, cudaError_t> {
        self.activate(self.current_device());
        match h as usize {
            0 if per_thread_default => self.per_thread(),
            0 | 1 => self.legacy(self.current_device()),
            2 => self.per_thread(),
            h => self.streams.get(h).ok_or(cudaErrorInvalidResourceHandle),
        }
    }

    /// Live streams of device `d` (destroyed streams still draining included).
    fn device_streams(&self, d: i32) -> Vec<Arc<Stream>> {
        self.device(d).map_or_else(
            |_| Vec::new(),
            |dev| {
                dev.streams
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .filter_map(Weak::upgrade)
                    .collect()
            },
        )
    }

    /// Implicit dependencies of new work on `s` (legacy default stream rules).
    fn implicit_deps(&self, s: &Arc<Stream>) -> Vec<Dep> {
        match s.kind {
            StreamKind::Legacy => self
                .device_streams(s.device)
                .iter()
                .filter(|o| o.is_blocking() && o.submitted() > o.completed())
                .map(|o| o.tail())
                .collect(),
            _ if s.is_blocking() => match self.device(s.device).ok().and_then(|d| d.legacy.get()) {
                Some(Some(l)) if l.submitted() > l.completed() => vec![l.tail()],
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// Submits `op` to `s`: recorded into the capture when `s` is capturing (returns `None`),
    /// else enqueued after its implicit dependencies and `extra` (returns its sequence number).
    pub fn submit(
        &self,
        s: &Arc<Stream>,
        extra: Vec<Dep>,
        op: Op,
    ) -> Result<Option<u64>, cudaError_t> {
        self.submit_as(s, extra, op, cudaGraphNodeTypeKernel)
    }

    /// [`Runtime::submit`] for work that becomes a node of type `kind` in a capture.
    pub fn submit_as(
        &self,
        s: &Arc<Stream>,
        extra: Vec<Dep>,
        op: Op,
        kind: cudaGraphNodeType,
    ) -> Result<Option<u64>, cudaError_t> {
        errors::sticky()?;
        if s.capture().is_some() {
            self.capture_node(s, kind, NodeBody::Op(Mutex::new(op)))?;
            return Ok(None);
        }
        if s.kind == StreamKind::Legacy && self.capturing() {
            // The legacy stream would depend on (or be depended on by) a capturing blocking
            // stream of this device: CUDA refuses and invalidates those captures.
            let mut hit = false;
            for o in self.device_streams(s.device) {
                if o.is_blocking() {
                    if let Some(cap) = o.capture() {
                        cap.lock().unwrap_or_else(|p| p.into_inner()).invalidated = true;
                        hit = true;
                    }
                }
            }
            if hit {
                return Err(cudaErrorStreamCaptureImplicit);
            }
        }
        let mut deps = self.implicit_deps(s);
        deps.extend(extra);
        s.enqueue(deps, op)
            .map(Some)
            .ok_or(cudaErrorInvalidResourceHandle)
    }

    /// Submits `op` and waits for it (synchronous API calls).
    pub fn submit_and_wait(&self, s: &Arc<Stream>, op: Op) -> Result<(), cudaError_t> {
        if let Some(seq) = self.submit(s, Vec::new(), op)? {
            s.wait_for(seq);
        }
        errors::sticky()
    }

    /// Appends a node to the graph `s` is capturing into, after the node `s` captured last.
    pub fn capture_node(
        &self,
        s: &Arc<Stream>,
        kind: cudaGraphNodeType,
        body: NodeBody,
    ) -> Result<(), cudaError_t> {
        self.capture_hooked_node(s, kind, body, None)
    }

    /// [`Runtime::capture_node`] of a node with a launch hook ([`streams::Node::launched`]).
    pub fn capture_hooked_node(
        &self,
        s: &Arc<Stream>,
        kind: cudaGraphNodeType,
        body: NodeBody,
        launched: Option<streams::LaunchHook>,
    ) -> Result<(), cudaError_t> {
        let cap = s.capture().ok_or(cudaErrorIllegalState)?;
        let mut c = cap.lock().unwrap_or_else(|p| p.into_inner());
        if c.invalidated {
            return Err(cudaErrorStreamCaptureInvalidated);
        }
        let mut nodes = c.graph.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let deps = nodes.last().map(|n| n.handle()).into_iter().collect();
        let node = Arc::new(Node {
            kind,
            body,
            deps,
            launched: launched.map(Mutex::new),
        });
        let h = self.nodes.insert(node.clone());
        nodes.push(node);
        drop(nodes);
        c.tails.insert(s.id, Box::new(h));
        Ok(())
    }

    /// Forgets the node handles of a destroyed graph.
    pub fn drop_nodes(&self, g: &Graph) {
        for n in g.nodes() {
            self.nodes.remove(n.handle());
            // A conditional node owns its body graphs: they die with it.
            if let streams::NodeBody::Conditional { bodies, .. } = &n.body {
                for b in bodies {
                    self.graphs.remove(Arc::as_ptr(b) as usize);
                    self.drop_nodes(b);
                }
            }
        }
    }

    /// Whether any capture sequence is active (one atomic load on the common path).
    pub fn capturing(&self) -> bool {
        self.active_captures.load(Ordering::Acquire) > 0
    }

    fn add_capture(&self, c: Arc<Mutex<Capture>>) {
        self.captures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(c);
        self.active_captures.fetch_add(1, Ordering::AcqRel);
    }

    fn remove_capture(&self, c: &Arc<Mutex<Capture>>) {
        let mut list = self.captures.lock().unwrap_or_else(|p| p.into_inner());
        let before = list.len();
        list.retain(|x| !Arc::ptr_eq(x, c));
        if list.len() < before {
            self.active_captures.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// CUDA's rule for "potentially unsafe" calls (allocation, synchronisation, synchronous
    /// copies) during stream capture, depending on the calling thread's capture mode: refused
    /// with `cudaErrorStreamCaptureUnsupported`, and the offending captures are invalidated.
    pub fn check_capture_safe(&self) -> Result<(), cudaError_t> {
        if !self.capturing() {
            return Ok(());
        }
        let mode = CAPTURE_MODE.with(|m| m.get());
        if mode == cudaStreamCaptureModeRelaxed {
            return Ok(());
        }
        let me = std::thread::current().id();
        let mut refused = false;
        for cap in self
            .captures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let mut c = cap.lock().unwrap_or_else(|p| p.into_inner());
            let own = c.thread == me && c.mode != cudaStreamCaptureModeRelaxed;
            let foreign_global = c.thread != me && c.mode == cudaStreamCaptureModeGlobal;
            if own || (mode == cudaStreamCaptureModeGlobal && foreign_global) {
                c.invalidated = true;
                refused = true;
            }
        }
        if refused {
            Err(cudaErrorStreamCaptureUnsupported)
        } else {
            Ok(())
        }
    }

    /// Waits for all work on device `d`.
    pub fn synchronize_device(&self, d: i32) {
        for s in self.device_streams(d) {
            s.synchronize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_forked_after_initialisation_cannot_use_the_runtime_and_its_parent_still_can() {
        assert!(
            rt().is_ok(),
            "the runtime initialises (SIM_CUDA_DEVICES default)"
        );
        // SAFETY: the child only reads an atomic and an initialised OnceLock, then leaves with
        // _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let refused = matches!(rt(), Err(e) if e == cudaErrorInitializationError);
            // SAFETY: _exit is async-signal-safe; the child runs no destructor.
            unsafe { libc::_exit(if refused { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the forked child was not refused (status {status})"
        );
        assert!(rt().is_ok(), "the parent keeps its runtime");
    }
}
