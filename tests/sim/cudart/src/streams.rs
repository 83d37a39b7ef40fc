//! Streams, events, stream capture and graphs.
//!
//! Every stream has a worker thread that runs its operations in submission order, after the
//! submitting call has returned. Ordering between streams follows CUDA's rules and nothing
//! else: an event wait, or the legacy default stream's implicit synchronisation (work on the
//! legacy stream waits for all earlier work on the device's blocking streams, and work on a
//! blocking stream waits for earlier legacy-stream work; `cudaStreamNonBlocking` streams are
//! exempt). A dependency is "stream S has completed its operation number n", so waits are a
//! counter and a condition variable.
//!
//! While a stream is being captured, submissions are appended to the capture's graph as nodes
//! instead of running; a graph launch replays them in order on the launch stream. Copies between
//! device and pinned memory become memcpy nodes whose parameters an instantiated graph can
//! change (`cudaGraphExecMemcpyNodeSetParams1D`); other work is an opaque node of its type.
//! A graph can also be built node by node (`cudaGraphCreate`, `cudaGraphAdd*Node`): a node may
//! only depend on nodes already in its graph, so the order nodes were added in is always an
//! order that respects every dependency, and a launch runs them in that order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use crossbeam_channel::{unbounded, Sender};
use cuda_abi::cudart::*;

/// An operation on a stream. `FnMut` because a captured operation replays on every graph launch.
pub type Op = Box<dyn FnMut() -> Result<(), cudaError_t> + Send>;

/// "Stream `stream` has completed its operation number `seq`".
#[derive(Clone)]
pub struct Dep {
    pub stream: Arc<Stream>,
    pub seq: u64,
}

impl Dep {
    /// Blocks until the dependency is satisfied.
    pub fn wait(&self) {
        self.stream.wait_for(self.seq);
    }
    /// Whether the dependency is satisfied.
    pub fn done(&self) -> bool {
        self.stream.completed() >= self.seq
    }
}

struct Task {
    deps: Vec<Dep>,
    op: Op,
}

/// `SIM_CUDA_LEGACY_DELAY_US=N`: each operation of a legacy default stream starts N µs late (a
/// device whose legacy stream lags behind its non-blocking streams), so that tests can show
/// work that assumed an order CUDA does not promise.
fn legacy_delay() -> Option<std::time::Duration> {
    static DELAY: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        std::env::var("SIM_CUDA_LEGACY_DELAY_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&us| us > 0)
            .map(std::time::Duration::from_micros)
    })
}

/// How a stream takes part in implicit synchronisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// The device's legacy default stream (handle 0 or `cudaStreamLegacy`).
    Legacy,
    /// A thread's per-thread default stream: blocking, but never a capture origin for others.
    PerThread,
    /// Created by `cudaStreamCreate*`.
    User,
}

/// The state of a capture sequence.
pub struct Capture {
    pub id: u64,
    pub mode: cudaStreamCaptureMode,
    /// Thread that began the capture (its thread-local rules apply).
    pub thread: std::thread::ThreadId,
    pub invalidated: bool,
    /// The graph being built (`cudaStreamGetCaptureInfo` hands out its handle).
    pub graph: Arc<Graph>,
    pub graph_handle: usize,
    /// Per stream of the sequence, the last node it captured (its capture frontier), boxed
    /// so that the pointer `cudaStreamGetCaptureInfo` returns stays put.
    pub tails: HashMap<u64, Box<usize>>,
}

/// The parameters of a memcpy node (addresses as the program gave them): `depth` slices of
/// `height` rows of `width` bytes, rows `dpitch`/`spitch` bytes apart and slices
/// `dslice`/`sslice` bytes apart (a 1-D or 2-D copy is one slice; its slice strides are unused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemcpyParams {
    pub dst: usize,
    pub dpitch: usize,
    pub src: usize,
    pub spitch: usize,
    pub width: usize,
    pub height: usize,
    pub kind: cudaMemcpyKind,
    pub depth: usize,
    pub dslice: usize,
    pub sslice: usize,
}

impl MemcpyParams {
    /// A 2-D copy (one slice).
    #[allow(clippy::too_many_arguments)]
    pub fn rows(
        dst: usize,
        dpitch: usize,
        src: usize,
        spitch: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
    ) -> MemcpyParams {
        MemcpyParams {
            dst,
            dpitch,
            src,
            spitch,
            width,
            height,
            kind,
            depth: 1,
            dslice: 0,
            sslice: 0,
        }
    }
}

/// What a node does when its graph runs.
pub enum NodeBody {
    /// Opaque work (a library kernel, a host function, a memset, ...).
    Op(Mutex<Op>),
    /// A copy, executed from its (instance's) parameters.
    Memcpy(MemcpyParams),
    /// Nothing (`cudaGraphAddEmptyNode`: a node that only orders others).
    Empty,
    /// A child graph (`cudaGraphAddChildGraphNode`): the child's nodes as they were when the
    /// node was added, in their (dependency-respecting) order. Nodes never change once added,
    /// so sharing them is the copy CUDA makes; their handles stay the child graph's.
    Graph(Vec<Arc<Node>>),
    /// An `if` conditional node (`cudaGraphAddNode`): body 0 runs when the handle's value is
    /// non-zero, body 1 (if any) when it is zero. The bodies are graphs of their own, filled
    /// after the node exists, so they are read when the node runs.
    Conditional {
        handle: Arc<ConditionalHandle>,
        bodies: Vec<Arc<Graph>>,
    },
}

/// A conditional handle (`cudaGraphConditionalHandleCreate`). Only device code can set its
/// value (`cudaGraphSetConditional`), which cannot run here: it holds its default.
pub struct ConditionalHandle {
    pub default: u32,
}

/// A node of a graph. Its handle is its address.
pub struct Node {
    pub kind: cudaGraphNodeType,
    pub body: NodeBody,
    /// The handles of the nodes it depends on, all added to its graph before it. A captured
    /// node depends on the node captured before it (none for the first).
    pub deps: Vec<usize>,
    /// What a library kernel does when a graph holding it is launched, on the launching
    /// thread (`SIM_WORK_LAUNCHED` of the kernel contract): NCCL takes its operations' places
    /// in their communicators' order then.
    pub launched: Option<Mutex<LaunchHook>>,
}

/// A node's launch hook ([`Node::launched`]).
pub type LaunchHook = Box<dyn FnMut() + Send>;

/// Calls the launch hooks of `nodes` (and of the nodes of their child graphs) in order.
pub fn notify_launched<'a>(nodes: impl IntoIterator<Item = &'a Arc<Node>>) {
    for n in nodes {
        if let Some(h) = &n.launched {
            (h.lock().unwrap_or_else(|p| p.into_inner()))();
        }
        if let NodeBody::Graph(children) = &n.body {
            notify_launched(children);
        }
    }
}

impl Node {
    /// The node's handle.
    pub fn handle(self: &Arc<Self>) -> usize {
        Arc::as_ptr(self) as usize
    }

    /// A memcpy node's parameters (what an instance starts from); `None` for other nodes.
    pub fn memcpy(&self) -> Option<MemcpyParams> {
        match &self.body {
            NodeBody::Memcpy(p) => Some(*p),
            _ => None,
        }
    }
}

struct Counters {
    submitted: u64,
    completed: u64,
    /// The lowest operation number a blocked waiter waits for (`u64::MAX`: none). The worker
    /// wakes waiters only when it is reached, as a GPU wakes a blocking-sync waiter only when
    /// its event completes, not at every kernel the stream runs.
    next_wake: u64,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            submitted: 0,
            completed: 0,
            next_wake: u64::MAX,
        }
    }
}

/// A stream and its worker.
pub struct Stream {
    pub id: u64,
    pub device: i32,
    pub kind: StreamKind,
    pub flags: u32,
    pub priority: i32,
    counters: Mutex<Counters>,
    done: Condvar,
    /// `None` once the stream is destroyed (the worker drains its queue, then exits).
    queue: Mutex<Option<Sender<Task>>>,
    /// Active capture sequence, shared by every stream that joined it.
    pub capture: Mutex<Option<Arc<Mutex<Capture>>>>,
}

static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_CAPTURE_ID: AtomicU64 = AtomicU64::new(1);

impl Stream {
    /// Creates a stream and starts its worker thread.
    pub fn spawn(device: i32, kind: StreamKind, flags: u32, priority: i32) -> Option<Arc<Stream>> {
        let (tx, rx) = unbounded::<Task>();
        let id = NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed);
        let stream = Arc::new(Stream {
            id,
            device,
            kind,
            flags,
            priority,
            counters: Mutex::new(Counters::default()),
            done: Condvar::new(),
            queue: Mutex::new(Some(tx)),
            capture: Mutex::new(None),
        });
        // The worker owns a strong reference until the queue closes (cudaStreamDestroy), so
        // work queued on a destroyed stream still runs, as in CUDA.
        let me = stream.clone();
        let delay = match kind {
            StreamKind::Legacy => legacy_delay(),
            _ => None,
        };
        std::thread::Builder::new()
            .name(format!("sim-stream-{id}"))
            .spawn(move || {
                for mut task in rx {
                    for d in &task.deps {
                        d.wait();
                    }
                    if let Some(d) = delay {
                        std::thread::sleep(d);
                    }
                    let result = (task.op)();
                    drop(task);
                    if let Err(e) = result {
                        crate::errors::set_sticky(e);
                    }
                    let mut c = me.counters.lock().unwrap_or_else(|p| p.into_inner());
                    c.completed += 1;
                    if c.completed >= c.next_wake {
                        // Every waiter wakes; those still short of their target set it again.
                        c.next_wake = u64::MAX;
                        me.done.notify_all();
                    }
                }
            })
            .ok()?;
        Some(stream)
    }

    /// Whether this stream synchronises implicitly with the legacy default stream.
    pub fn is_blocking(&self) -> bool {
        self.kind != StreamKind::Legacy && self.flags & cudaStreamNonBlocking == 0
    }

    /// Number of operations submitted so far (the sequence number of the last one).
    pub fn submitted(&self) -> u64 {
        self.counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .submitted
    }

    /// Number of operations completed so far.
    pub fn completed(&self) -> u64 {
        self.counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .completed
    }

    /// A dependency on everything submitted so far.
    pub fn tail(self: &Arc<Self>) -> Dep {
        Dep {
            stream: self.clone(),
            seq: self.submitted(),
        }
    }

    /// Blocks until operation `seq` has completed.
    pub fn wait_for(&self, seq: u64) {
        let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        while c.completed < seq {
            c.next_wake = c.next_wake.min(seq);
            c = self.done.wait(c).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Blocks until everything submitted so far has completed.
    pub fn synchronize(&self) {
        let target = self.submitted();
        self.wait_for(target);
    }

    /// Enqueues `op` to run after `deps`. Returns its sequence number, or `None` when the
    /// stream has been destroyed.
    pub fn enqueue(&self, deps: Vec<Dep>, op: Op) -> Option<u64> {
        let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let tx = queue.as_ref()?;
        let seq = {
            let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
            c.submitted += 1;
            c.submitted
        };
        // The receiver lives as long as the sender: the worker only stops when the queue closes.
        tx.send(Task { deps, op }).ok()?;
        Some(seq)
    }

    /// Closes the queue: queued work still runs, then the worker exits.
    pub fn close(&self) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// The active capture sequence of this stream, if any.
    pub fn capture(&self) -> Option<Arc<Mutex<Capture>>> {
        self.capture
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Starts a capture sequence with this stream as its origin, building `graph`.
    pub fn begin_capture(
        &self,
        mode: cudaStreamCaptureMode,
        graph: Arc<Graph>,
        graph_handle: usize,
    ) -> Arc<Mutex<Capture>> {
        let cap = Arc::new(Mutex::new(Capture {
            id: NEXT_CAPTURE_ID.fetch_add(1, Ordering::Relaxed),
            mode,
            thread: std::thread::current().id(),
            invalidated: false,
            graph,
            graph_handle,
            tails: HashMap::new(),
        }));
        *self.capture.lock().unwrap_or_else(|p| p.into_inner()) = Some(cap.clone());
        cap
    }

    /// Ends this stream's participation in its capture sequence.
    pub fn leave_capture(&self) -> Option<Arc<Mutex<Capture>>> {
        self.capture
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// One event.
pub struct Event {
    pub flags: u32,
    state: Mutex<EventState>,
}

#[derive(Default)]
struct EventState {
    /// The last record: where, and which generation (re-recording bumps it).
    record: Option<Dep>,
    generation: u64,
    /// When the last record was reached by its stream.
    time: Option<Instant>,
    /// Recorded inside a capture sequence (only usable to order captured work).
    captured: Option<Arc<Mutex<Capture>>>,
}

impl Event {
    pub fn new(flags: u32) -> Arc<Event> {
        Arc::new(Event {
            flags,
            state: Mutex::new(EventState::default()),
        })
    }

    /// Records the event on `stream` (not capturing): it completes when the stream reaches it.
    pub fn record(
        self: &Arc<Self>,
        stream: &Arc<Stream>,
        deps: Vec<Dep>,
    ) -> Result<(), cudaError_t> {
        let generation = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            s.generation += 1;
            s.time = None;
            s.captured = None;
            s.generation
        };
        let me = self.clone();
        let seq = stream
            .enqueue(
                deps,
                Box::new(move || {
                    let mut s = me.state.lock().unwrap_or_else(|p| p.into_inner());
                    if s.generation == generation {
                        s.time = Some(Instant::now());
                    }
                    Ok(())
                }),
            )
            .ok_or(cudaErrorInvalidResourceHandle)?;
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.generation == generation {
            s.record = Some(Dep {
                stream: stream.clone(),
                seq,
            });
        }
        Ok(())
    }

    /// Marks the event as recorded inside `capture`.
    pub fn record_captured(&self, capture: Arc<Mutex<Capture>>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.generation += 1;
        s.record = None;
        s.time = None;
        s.captured = Some(capture);
    }

    /// The capture sequence the event was last recorded in, if any.
    pub fn captured(&self) -> Option<Arc<Mutex<Capture>>> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .captured
            .clone()
    }

    /// The dependency a wait on this event means now (none when never recorded).
    pub fn dep(&self) -> Option<Dep> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record
            .clone()
    }

    /// When the last record completed, if it has.
    pub fn time(&self) -> Option<Instant> {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &s.record {
            Some(d) if d.done() => s.time,
            _ => None,
        }
    }
}

/// A graph, made by stream capture or node by node: its nodes in the order they were added
/// (an order that respects their dependencies).
#[derive(Default)]
pub struct Graph {
    pub nodes: Mutex<Vec<Arc<Node>>>,
}

impl Graph {
    /// A copy of the node list.
    pub fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A node of an instantiated graph: the handle of the node it was instantiated from (what
/// the update calls name it by), the work it runs (another graph's after
/// `cudaGraphExecUpdate`), and for a memcpy node the instance's own parameters (changed by
/// `cudaGraphExecMemcpyNodeSetParams1D` for later launches only).
pub struct ExecNode {
    pub origin: usize,
    pub node: Mutex<Arc<Node>>,
    pub memcpy: Mutex<Option<MemcpyParams>>,
}

impl ExecNode {
    /// The work the node runs now.
    pub fn work(&self) -> Arc<Node> {
        self.node.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// An instantiated graph (shares the opaque operations with its graph).
pub struct GraphExec {
    pub nodes: Vec<ExecNode>,
}

impl GraphExec {
    /// Instantiates `graph` as it is now.
    pub fn of(graph: &Graph) -> GraphExec {
        let nodes = graph
            .nodes()
            .into_iter()
            .map(|node| {
                let memcpy = node.memcpy();
                ExecNode {
                    origin: node.handle(),
                    node: Mutex::new(node),
                    memcpy: Mutex::new(memcpy),
                }
            })
            .collect();
        GraphExec { nodes }
    }
}

/// Handles given to the program, mapped back to the objects. A handle that is not in the map
/// (never created, or destroyed) is rejected instead of being dereferenced.
pub struct Handles<T> {
    map: Mutex<HashMap<usize, Arc<T>>>,
}

impl<T> Default for Handles<T> {
    fn default() -> Self {
        Handles {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Handles<T> {
    /// Registers `obj` and returns its handle (the object's address, never 0, 1 or 2).
    pub fn insert(&self, obj: Arc<T>) -> usize {
        let h = Arc::as_ptr(&obj) as usize;
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(h, obj);
        h
    }
    pub fn get(&self, h: usize) -> Option<Arc<T>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&h)
            .cloned()
    }
    pub fn remove(&self, h: usize) -> Option<Arc<T>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&h)
    }
    /// Every live object.
    pub fn all(&self) -> Vec<Arc<T>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// An op that blocks its stream until the test lets it go.
    fn gate() -> (mpsc::Sender<()>, Op) {
        let (tx, rx) = mpsc::channel::<()>();
        let rx = Mutex::new(rx);
        let op: Op = Box::new(move || {
            let _ = rx.lock().map(|r| r.recv());
            Ok(())
        });
        (tx, op)
    }

    #[test]
    fn waiters_for_different_operations_each_wake_when_theirs_completes() {
        let s = Stream::spawn(0, StreamKind::User, 0, 0).expect("stream");
        let (open1, op1) = gate();
        let (open3, op3) = gate();
        let first = s.enqueue(Vec::new(), op1).expect("queued");
        let _second = s.enqueue(Vec::new(), Box::new(|| Ok(()))).expect("queued");
        let third = s.enqueue(Vec::new(), op3).expect("queued");
        let (done_tx, done_rx) = mpsc::channel();
        for target in [third, first] {
            let (s, done_tx) = (s.clone(), done_tx.clone());
            std::thread::spawn(move || {
                s.wait_for(target);
                let _ = done_tx.send(target);
            });
        }
        // Both wait; nothing has completed.
        assert!(done_rx.recv_timeout(Duration::from_millis(50)).is_err());
        open1.send(()).expect("gate");
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(10)), Ok(first));
        // The second op completes too; the later waiter went back to sleep for its own.
        s.wait_for(first + 1);
        assert!(done_rx.recv_timeout(Duration::from_millis(50)).is_err());
        assert_eq!(s.completed(), 2);
        open3.send(()).expect("gate");
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(10)), Ok(third));
        s.synchronize();
        assert_eq!(s.completed(), 3);
    }
}
