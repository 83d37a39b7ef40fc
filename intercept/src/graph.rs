//! CUDA graphs: ops captured into a graph are snapshotted on every replay.
//!
//! * **Capture.** A hooked op whose stream is being captured enqueues its snapshot copies on
//!   that stream as usual, so each becomes a 1-D memcpy node right before or after the op's
//!   node. The nodes write into the *sink*, a pinned buffer owned by the tracer that nothing
//!   reads; each node's handle is read back with `cudaStreamGetCaptureInfo` (the stream's
//!   frontier right after the copy). The op's metadata and its copy nodes form a [`Template`],
//!   filed under the graph being built. The hook records nothing else: the op has not run.
//! * **Instantiate.** The instance inherits its graph's templates (`cudaGraphInstantiate*`).
//! * **Launch.** For each template, in capture order: a ring slot is reserved in ticket order
//!   (a `RingFull` gap when none comes in time) and the instance's copy nodes are redirected
//!   into it (`cudaGraphExecMemcpyNodeSetParams1D`, which affects this and later launches
//!   only). The graph is launched; one completion event per template is recorded on the launch
//!   stream after it; the entries go to the tracer like any snapshot, so each replay publishes
//!   its own record set with its own step and seq. Then the nodes are pointed back at the
//!   sink: a launch the tracer does not see never writes into ring space handed out again.
//! * **Graphs not captured.** An instance of a graph the tracer did not capture (built node
//!   by node, or captured while copies were not hooked) whose nodes copy or set memory records
//!   a `GraphCapture` gap at each launch, naming its copy, memset, child-graph and conditional
//!   nodes, and the ops its child graphs hold that hooks saw being captured ([`child_added`]:
//!   XLA's command buffers nest each captured cuBLAS call so).
//! * **Gaps.** Where a replay cannot be snapshotted (no node found for a copy, a strided
//!   tensor of too many rows, no staging memory, the graph launched into another capture, an
//!   instance updated with `cudaGraphExecUpdate`), each replay records a `GraphCapture` gap
//!   saying why; a captured graph holding conditional nodes records one after its records.
//! * **Destroyed graphs.** The runtime refuses to redirect a node of a graph that was
//!   destroyed (`cudaErrorInvalidValue`, seen on an H200), and PyTorch destroys each graph
//!   right after instantiating it. So `cudaGraphDestroy` of a graph whose instances still
//!   redirect snapshot nodes is deferred: it returns success, and the real call runs when
//!   the last such instance is destroyed (or updated away from those nodes).
//!
//! The driver API's graph calls (`cuGraphLaunch`, ...) come here as the runtime's do: the
//! handles are the same.
//!
//! No host callback, no synchronisation, no legacy stream. A per-instance lock is held across
//! the redirects and the launch (CUDA requires launches of one instance to be serialised by
//! the program anyway; no hook runs under it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cuda_abi::cudart::{
    cudaError_t, cudaGraphNodeTypeConditional, cudaGraphNodeTypeGraph, cudaGraphNodeTypeMemcpy,
    cudaGraphNodeTypeMemset, cudaStreamCaptureModeRelaxed, cudaStream_t, cudaSuccess,
};
use ttrace_proto::record::{GapReason, Op, Tensor};
use ttrace_proto::ring::Slot;

use crate::cuda::{self, ErrScope};
use crate::engine::{self, Call};
use crate::plan::{Copy, TensorPlan, When};
use crate::session::{self, Session};
use crate::tracer::{Captured, Entry, PerTensor, Ticket};
use crate::{mode, thread};

/// A pitched tensor is captured as one copy node per row; beyond this many rows its replays
/// are gaps (one node per row would swamp the graph).
const MAX_ROWS: u64 = 4096;

/// One snapshot copy node: `len` bytes from `src` to `at` bytes into the template's slot.
#[derive(Debug, Clone, Copy)]
struct NodeCopy {
    node: usize,
    src: u64,
    len: u64,
    at: u64,
    tensor: usize,
}

/// A captured op: what each replay publishes.
#[derive(Debug, Clone)]
struct Template {
    api: &'static str,
    op: Op,
    stream: u64,
    device: i32,
    tensors: Vec<Tensor>,
    offsets: PerTensor<Option<u64>>,
    total: u64,
    copies: Vec<NodeCopy>,
    /// Why its replays cannot be snapshotted (each records a gap).
    gap: Option<String>,
    /// Tensors whose snapshot copy node the runtime refused during the capture, with why:
    /// metadata only at every replay, each with a `CopyRefused` gap after the record.
    refused: Vec<(usize, String)>,
    /// The bytes some tensors must hold at each replay (a pointer-array batch's arrays).
    expect: Vec<(usize, Arc<[u8]>)>,
}

/// Templates of the graphs being captured or captured, by graph handle.
static GRAPHS: Mutex<Option<HashMap<usize, Vec<Arc<Template>>>>> = Mutex::new(None);
/// Instances whose graph had templates, or whose graph the tracer did not capture but whose
/// nodes move data, by instance handle.
static EXECS: Mutex<Option<HashMap<usize, Arc<Exec>>>> = Mutex::new(None);
/// The ops captured from a stream (their API names) that graphs hold inside child-graph nodes
/// (`cudaGraphAddChildGraphNode`: XLA's command buffers), by parent graph handle: a launch of
/// the parent runs them without a snapshot, and its gap names them.
static NESTED: Mutex<Option<HashMap<usize, Vec<&'static str>>>> = Mutex::new(None);
/// Graphs whose live instances redirect snapshot copy nodes (the runtime refuses nodes of a
/// destroyed graph), by graph handle.
static HELD: Mutex<Option<HashMap<usize, Held>>> = Mutex::new(None);
/// The sink: (address, bytes). Older, smaller sinks stay allocated (nodes may point there).
static SINK: Mutex<(usize, u64)> = Mutex::new((0, 0));

/// A graph kept alive for the instances made from it.
#[derive(Debug, Default)]
struct Held {
    /// Live instances whose snapshot copy nodes are this graph's.
    instances: usize,
    /// The program destroyed it: the real `cudaGraphDestroy` runs after the last instance.
    destroyed: bool,
}

struct Exec {
    templates: Vec<Arc<Template>>,
    /// The graph whose nodes this instance's templates redirect (it must outlive them).
    origin: Option<usize>,
    /// What each launch runs that no template snapshots, said by the gap it records: the
    /// data-moving nodes of a graph the tracer did not capture (built node by node with
    /// `cudaGraphAdd*Node`, or captured while copies were not hooked: no templates then), or
    /// the conditional nodes and nested ops of a captured one ([`hidden_work`]).
    unseen: Option<String>,
    /// Serialises redirect + launch + reset of this instance.
    launch: Mutex<()>,
}

fn graphs<T>(f: impl FnOnce(&mut HashMap<usize, Vec<Arc<Template>>>) -> T) -> T {
    let mut g = GRAPHS.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

fn execs<T>(f: impl FnOnce(&mut HashMap<usize, Arc<Exec>>) -> T) -> T {
    let mut g = EXECS.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

fn nested<T>(f: impl FnOnce(&mut HashMap<usize, Vec<&'static str>>) -> T) -> T {
    let mut g = NESTED.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// After `child` was added to `parent` as a child-graph node: the ops captured into `child`
/// (and into its own children) now also run, unsnapshotted, in `parent`.
pub fn child_added(parent: usize, child: usize) {
    let mut apis: Vec<&'static str> = graphs(|g| {
        g.get(&child)
            .map(|ts| ts.iter().map(|t| t.api).collect())
            .unwrap_or_default()
    });
    apis.extend(nested(|n| n.get(&child).cloned().unwrap_or_default()));
    if !apis.is_empty() {
        nested(|n| n.entry(parent).or_default().extend(apis));
    }
}

/// What the ops `graph`'s child-graph nodes hold (hooks saw them captured into the children)
/// amount to, for its launches' gap: "its child graphs hold N ops captured from a stream
/// (cublasLtMatmul ×3, ...), which ...", or `None` when they hold none.
fn nested_ops(graph: usize) -> Option<String> {
    let apis = nested(|n| n.get(&graph).cloned())?;
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for a in &apis {
        match counts.iter_mut().find(|(n, _)| n == a) {
            Some((_, c)) => *c += 1,
            None => counts.push((a, 1)),
        }
    }
    let list: Vec<String> = counts.iter().map(|(a, c)| format!("{a} ×{c}")).collect();
    Some(format!(
        "its child graphs hold {} ops captured from a stream ({}), which run at each launch \
         without a snapshot (a child's nodes are copies of the captured ones, which cannot be \
         redirected); in an XLA (JAX) program, XLA_FLAGS=--xla_gpu_enable_command_buffer= \
         makes XLA call them eagerly, where they are captured",
        apis.len(),
        list.join(", ")
    ))
}

fn held<T>(f: impl FnOnce(&mut HashMap<usize, Held>) -> T) -> T {
    let mut g = HELD.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// Files `e` as instance `exec`, holding its graph for it; lets go of what the instance it
/// replaces held.
fn file_exec(exec: usize, e: Exec) {
    if let Some(graph) = e.origin {
        held(|h| h.entry(graph).or_default().instances += 1);
    }
    let old = execs(|x| x.insert(exec, Arc::new(e)));
    if let Some(graph) = old.and_then(|o| o.origin) {
        let_go(graph);
    }
}

/// An instance that held `graph` is gone: destroys the graph when the program did and no
/// other instance holds it.
fn let_go(graph: usize) {
    let destroy = held(|h| {
        let g = h.get_mut(&graph)?;
        g.instances = g.instances.saturating_sub(1);
        if g.instances > 0 {
            return None;
        }
        h.remove(&graph).map(|g| g.destroyed)
    });
    if destroy == Some(true) {
        if let Err(code) = cuda::graph_destroy(graph) {
            crate::log::warn(&format!(
                "cudaGraphDestroy of a graph whose destruction waited for its instances failed \
                 (cudaError {code})"
            ));
        }
    }
}

/// A sink of at least `len` bytes (allocated in relaxed capture mode: the allocation happens
/// while the program captures, which a global-mode capture would otherwise refuse).
fn sink(len: u64) -> Result<usize, cudaError_t> {
    let (p, have) = *SINK.lock().unwrap_or_else(|p| p.into_inner());
    if have >= len && p != 0 {
        return Ok(p);
    }
    let want = len.max(have.saturating_mul(2)).max(1 << 20);
    let prev = cuda::exchange_capture_mode(cudaStreamCaptureModeRelaxed)?;
    let r = cuda::malloc_host(want as usize);
    let _ = cuda::exchange_capture_mode(prev);
    let q = r? as usize;
    let mut s = SINK.lock().unwrap_or_else(|p| p.into_inner());
    if s.1 < want {
        *s = (q, want);
    }
    Ok(s.0)
}

/// An op being recorded into a graph, between its hook's begin and finish.
pub struct Recording {
    graph: usize,
    stream: cudaStream_t,
    plans: Vec<TensorPlan>,
    sink: usize,
    t: Template,
}

/// Starts recording `call` (its stream is capturing) as a template of the graph being built.
/// `None`: not recorded (the old behaviour: one `GraphCapture` gap now).
pub fn begin(call: Call, device: i32, s: &Session) -> Option<Recording> {
    let graph = match cuda::capture_info(call.stream) {
        Ok((g, _)) if g != 0 => g,
        _ => {
            let bytes = call.tensors.iter().map(|t| t.nbytes).sum();
            let m = engine::meta(call.api, call.op, call.stream_id, device);
            let detail = "the stream is being captured into a CUDA graph the runtime does not \
                          name (cudaStreamGetCaptureInfo): its replays are not snapshotted";
            engine::gap(m, GapReason::GraphCapture, bytes, detail.into());
            return None;
        }
    };
    let mut plans = call.tensors;
    // No rule-only copies in a graph: its replays' records are taken whole.
    engine::select(s, &mut plans, false);
    engine::fit_one_slot(s, &mut plans);
    let (offsets, total) = engine::layout(&plans);
    let tensors = plans.iter().map(|t| engine::tensor_of(t, true)).collect();
    let expect = engine::expectations(&plans);
    let mut rec = Recording {
        graph,
        stream: call.stream,
        plans,
        sink: 0,
        t: Template {
            api: call.api,
            op: call.op,
            stream: call.stream_id,
            device,
            tensors,
            offsets,
            total,
            copies: Vec::new(),
            gap: None,
            refused: Vec::new(),
            expect,
        },
    };
    if total > 0 {
        match sink(total) {
            Ok(p) => rec.sink = p,
            Err(code) => {
                rec.t.gap = Some(format!(
                    "no pinned staging memory for the graph's snapshot copies (cudaError {code})"
                ))
            }
        }
    }
    rec.copy(When::Before);
    Some(rec)
}

/// Completes the recording after the real call (`ok`: the op was captured) and files the
/// template under its graph.
pub fn finish(mut rec: Recording, ok: bool) {
    let _err = ErrScope::new();
    if !ok {
        // Copy nodes already captured keep writing into the sink; nothing is published.
        return;
    }
    rec.copy(When::After);
    let t = &mut rec.t;
    t.copies.retain(|c| t.tensors[c.tensor].captured);
    let graph = rec.graph;
    let t = Arc::new(rec.t);
    graphs(|g| g.entry(graph).or_default().push(t));
}

impl Recording {
    /// Enqueues the copies taken at `when` into the sink and notes their nodes.
    fn copy(&mut self, when: When) {
        if self.t.gap.is_some() || self.sink == 0 {
            return;
        }
        for i in 0..self.plans.len() {
            let (Some(off), true) = (self.t.offsets[i], self.t.tensors[i].captured) else {
                continue;
            };
            if self.plans[i].when != when {
                continue;
            }
            for c in self.plans[i].copies() {
                let pieces = match c {
                    Copy::Linear { dst, src, len } => vec![(dst, src, len)],
                    Copy::Pitched {
                        dst,
                        src,
                        spitch,
                        width,
                        height,
                    } => {
                        if height > MAX_ROWS {
                            self.t.gap = Some(format!(
                                "a strided tensor of {height} rows ({:?}) in a CUDA graph: \
                                 more than {MAX_ROWS} copy nodes",
                                self.plans[i].role
                            ));
                            return;
                        }
                        (0..height)
                            .map(|r| (dst + r * width, src + r * spitch, width))
                            .collect()
                    }
                };
                for (dst, src, len) in pieces {
                    if !self.piece(i, off + dst, src, len) {
                        self.t.tensors[i].captured = false;
                        break;
                    }
                }
                if !self.t.tensors[i].captured {
                    break;
                }
            }
        }
    }

    /// One copy node; `false` when it could not be captured.
    fn piece(&mut self, tensor: usize, at: u64, src: u64, len: u64) -> bool {
        let dst = (self.sink + at as usize) as *mut u8;
        if let Err(code) = cuda::copy_linear(dst, src, len, self.stream) {
            let role = self.plans[tensor].role;
            crate::log::warn(&format!(
                "{}: graph snapshot copy of {role:?} refused (cudaError {code}): the tensor is \
                 recorded without its bytes at every replay",
                self.t.api
            ));
            self.t.refused.push((
                tensor,
                format!(
                    "the runtime refused the snapshot copy node of {role:?} ({} bytes, \
                     cudaError {code}) when the graph was captured: the replay's record, just \
                     before this gap, keeps it as metadata only",
                    self.plans[tensor].nbytes
                ),
            ));
            return false;
        }
        match cuda::capture_info(self.stream) {
            Ok((_, Some(node))) => {
                self.t.copies.push(NodeCopy {
                    node,
                    src,
                    len,
                    at,
                    tensor,
                });
                true
            }
            _ => {
                self.t.gap = Some(
                    "the snapshot copy's graph node could not be identified \
                     (cudaStreamGetCaptureInfo)"
                        .into(),
                );
                false
            }
        }
    }
}

/// After a successful `cudaStreamEndCapture`-family call failed: forgets the templates of the
/// graph that was being built (the runtime destroyed it; its handle may come back).
pub fn capture_failed(graph: usize) {
    if graph != 0 {
        graphs(|g| g.remove(&graph));
        nested(|n| n.remove(&graph));
    }
}

fn unseen_work(graph: usize) -> Option<String> {
    // Ops the hooks saw being captured into a child graph: named whatever is captured.
    let held = nested_ops(graph);
    if !mode::on(mode::MEMCPY) && held.is_none() {
        return None;
    }
    let _err = ErrScope::new();
    let mut detail = match cuda::node_types(graph) {
        Ok(types) => {
            let count = |t| types.iter().filter(|&&x| x == t).count();
            let (copies, memsets, children, conditionals) = (
                count(cudaGraphNodeTypeMemcpy),
                count(cudaGraphNodeTypeMemset),
                count(cudaGraphNodeTypeGraph),
                count(cudaGraphNodeTypeConditional),
            );
            if copies + memsets + children + conditionals == 0 && held.is_none() {
                return None;
            }
            let mut d = format!(
                "a CUDA graph the tracer did not capture (built node by node, or captured while \
                 copies were not hooked): its {copies} copy, {memsets} memset and {children} \
                 child-graph nodes run at each launch without being captured"
            );
            if conditionals > 0 {
                // Their bodies (XLA's while loops, torch.cond) may copy or multiply anything.
                d.push_str(&format!(
                    ", and {conditionals} conditional (if/while/switch) nodes, whose body \
                     graphs run without being captured or inspected"
                ));
            }
            d
        }
        Err(code) => format!(
            "a CUDA graph the tracer did not capture, whose nodes could not be listed \
             (cudaError {code}): what each launch moves is not captured"
        ),
    };
    if let Some(ops) = held {
        detail.push_str("; ");
        detail.push_str(&ops);
    }
    Some(detail)
}

/// Files `exec` as an instance of a graph the tracer did not capture: with the gap its
/// launches record when its nodes move data ([`unseen_work`]), else not at all.
fn file_unseen(exec: usize, graph: usize) {
    match unseen_work(graph) {
        Some(detail) => {
            file_exec(
                exec,
                Exec {
                    templates: Vec::new(),
                    origin: None,
                    unseen: Some(detail),
                    launch: Mutex::new(()),
                },
            );
        }
        None => exec_destroyed(exec),
    }
}

/// What a launch of a captured graph runs that none of its templates covers: conditional
/// nodes (added during the capture, as torch.cond does), whose bodies no hook inspects, and
/// child graphs holding ops captured elsewhere ([`child_added`]). The gap each launch records
/// after the replay's records, if there is any.
fn hidden_work(graph: usize) -> Option<String> {
    let conditionals = {
        let _err = ErrScope::new();
        cuda::node_types(graph).map_or(0, |types| {
            types
                .iter()
                .filter(|&&t| t == cudaGraphNodeTypeConditional)
                .count()
        })
    };
    let mut parts = Vec::new();
    if conditionals > 0 {
        parts.push(format!(
            "{conditionals} conditional (if/while/switch) nodes, whose body graphs run without \
             being captured or inspected"
        ));
    }
    parts.extend(nested_ops(graph));
    (!parts.is_empty()).then(|| {
        format!(
            "a captured CUDA graph (its other ops are snapshotted): {}",
            parts.join("; ")
        )
    })
}

/// After `cudaGraphInstantiate*` made `exec` from `graph`.
pub fn instantiated(exec: usize, graph: usize) {
    let Some(templates) = graphs(|g| g.get(&graph).cloned()) else {
        file_unseen(exec, graph);
        return;
    };
    let redirects = templates.iter().any(|t| !t.copies.is_empty());
    file_exec(
        exec,
        Exec {
            templates,
            origin: redirects.then_some(graph),
            unseen: hidden_work(graph),
            launch: Mutex::new(()),
        },
    );
}

/// After a successful `cudaGraphExecUpdate`: the instance runs `graph`'s work now. Its copy
/// nodes are not the nodes the instance was made with, and only those can be redirected, so
/// each replay records a gap per captured op (the new graph's ops when they were captured
/// under the tracer, else the old ones).
pub fn updated(exec: usize, graph: usize) {
    let old = execs(|x| x.get(&exec).cloned());
    let Some(base) = graphs(|g| g.get(&graph).cloned()).or_else(|| {
        old.filter(|e| e.unseen.is_none())
            .map(|e| e.templates.clone())
    }) else {
        file_unseen(exec, graph);
        return;
    };
    let detail = "the instance was updated with cudaGraphExecUpdate: its snapshot copy nodes \
                  cannot be redirected any more";
    let templates = base
        .iter()
        .map(|t| {
            Arc::new(Template {
                copies: Vec::new(),
                gap: Some(detail.into()),
                ..Template::clone(t)
            })
        })
        .collect();
    file_exec(
        exec,
        Exec {
            templates,
            origin: None,
            unseen: None,
            launch: Mutex::new(()),
        },
    );
}

/// `cudaGraphDestroy`: deferred (success returned, the real call made later) while an
/// instance made from `graph` redirects its snapshot copy nodes, else the real call.
pub fn destroy(graph: usize, real: impl FnOnce() -> cudaError_t) -> cudaError_t {
    let deferred = crate::catch(|| {
        held(|h| match h.get_mut(&graph) {
            Some(g) if g.instances > 0 => {
                g.destroyed = true;
                true
            }
            _ => false,
        })
    })
    .unwrap_or(false);
    let forget = || {
        graphs(|g| g.remove(&graph));
        nested(|n| n.remove(&graph));
    };
    if deferred {
        // The handle stays valid (the graph lives on), so it cannot name another graph.
        let _ = crate::catch(forget);
        return cudaSuccess;
    }
    let r = real();
    if r == cudaSuccess {
        let _ = crate::catch(forget);
    }
    r
}

/// After `cudaGraphExecDestroy`.
pub fn exec_destroyed(exec: usize) {
    if let Some(graph) = execs(|x| x.remove(&exec)).and_then(|e| e.origin) {
        let_go(graph);
    }
}

/// What one template does in one replay.
enum Replay {
    /// A gap record.
    Gap {
        ticket: Ticket,
        reason: GapReason,
        bytes: u64,
        detail: String,
    },
    /// A record; its copy nodes point into `slot` (when there is one) for this launch.
    Record {
        ticket: Ticket,
        slot: Option<Slot>,
        /// Tensors whose node could not be pointed at the slot this time, with why.
        lost: Vec<(usize, String)>,
        /// The places, right after the record's, of its `CopyRefused` gaps (the template's
        /// refused nodes, then `lost`).
        gaps: Vec<Ticket>,
    },
}

/// `cudaGraphLaunch` or the driver's `cuGraphLaunch` (`api`): snapshots every template of
/// `exec` around the real launch.
pub fn launch(
    api: &'static str,
    exec: usize,
    stream: cudaStream_t,
    real: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    let Some(e) = crate::catch(|| execs(|x| x.get(&exec).cloned())).flatten() else {
        return real();
    };
    if e.templates.is_empty() {
        return match e.unseen.clone() {
            Some(detail) => unseen_gap(api, stream, detail, real),
            None => real(),
        };
    }
    let r = {
        let Some(_guard) = thread::Guard::enter() else {
            return real();
        };
        let _serial = e.launch.lock().unwrap_or_else(|p| p.into_inner());
        let plan = crate::catch(|| prepare(&e, exec, stream)).flatten();
        let r = real();
        if let Some(replays) = plan {
            let _ = crate::catch(|| complete(&e, exec, stream, replays, r == cudaSuccess));
        }
        r
    };
    match e.unseen.clone() {
        Some(detail) => unseen_gap(api, stream, detail, || r),
        None => r,
    }
}

/// What a launch runs unseen (`detail`): one gap, on the launch stream, once `call` (the
/// launch, or its result) says it succeeded; after the replay's records when the graph has
/// templates too.
fn unseen_gap(
    api: &'static str,
    stream: cudaStream_t,
    detail: String,
    call: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    crate::around_metadata(
        api,
        stream,
        || Some(Op::gap(GapReason::GraphCapture, api, 0, detail)),
        call,
        |r| r == cudaSuccess,
    )
}

/// Reserves and redirects (before the real launch).
fn prepare(e: &Exec, exec: usize, stream: cudaStream_t) -> Option<Vec<Replay>> {
    let s = session::get()?;
    if mode::dead() {
        return None;
    }
    let _err = ErrScope::new();
    let nested = match cuda::is_capturing(stream) {
        Ok(c) => c,
        // The legacy stream during a capture, a bad handle: the launch reports it.
        Err(_) => return None,
    };
    let mut held: Option<u64> = None;
    let mut out = Vec::with_capacity(e.templates.len());
    for t in &e.templates {
        // A replayed GEMM may move the step like an eager one (prefilter.rs).
        let counted =
            crate::prefilter::counts_op(s.cfg, &t.op, |g| crate::tracer::gemm_sig(t.api, g));
        let why = if nested {
            Some((
                GapReason::GraphCapture,
                "the graph was launched into another stream capture: replays of the outer graph \
                 run no API call"
                    .to_string(),
            ))
        } else {
            t.gap.clone().map(|d| (GapReason::GraphCapture, d))
        };
        if let Some((reason, detail)) = why {
            let ticket = Ticket::take_counted(counted);
            held.get_or_insert(ticket.number());
            out.push(Replay::Gap {
                ticket,
                reason,
                bytes: t.total,
                detail,
            });
            continue;
        }
        if t.copies.is_empty() {
            let ticket = Ticket::take_counted(counted);
            held.get_or_insert(ticket.number());
            out.push(Replay::Record {
                ticket,
                slot: None,
                lost: Vec::new(),
                gaps: gap_tickets(t.refused.len()),
            });
            continue;
        }
        let Some((ticket, slot)) = engine::reserve(s, t.total, held, counted) else {
            let ticket = Ticket::take_counted(counted);
            held.get_or_insert(ticket.number());
            out.push(Replay::Gap {
                ticket,
                reason: GapReason::RingFull,
                bytes: t.total,
                detail: format!(
                    "no ring space for {} bytes of a CUDA graph replay within TTRACE_WAIT_MS={} ms",
                    t.total, s.cfg.wait_ms
                ),
            });
            continue;
        };
        held.get_or_insert(ticket.number());
        // SAFETY: the slot was just reserved by this thread; only its address is taken here,
        // the bytes are written by the replay's copy nodes.
        let base = unsafe { s.ring.slot_bytes(&slot) }.as_mut_ptr() as usize;
        let mut lost = Vec::new();
        for c in &t.copies {
            let dst = (base + c.at as usize) as *mut u8;
            if let Err(code) = cuda::redirect_copy(exec, c.node, dst, c.src, c.len) {
                // The node still points into the sink: the tensor is missing this time.
                crate::log::debug(&format!(
                    "{}: cannot redirect a graph snapshot node (cudaError {code})",
                    t.api
                ));
                if !lost.iter().any(|l: &(usize, String)| l.0 == c.tensor) {
                    let role = t.tensors.get(c.tensor).map_or_else(
                        || format!("tensor {}", c.tensor),
                        |x| format!("{:?}", x.role),
                    );
                    lost.push((
                        c.tensor,
                        format!(
                            "the runtime refused to point the graph snapshot node of {role} \
                             at this replay's ring slot (cudaError {code}): the replay's record, \
                             just before this gap, keeps it as metadata only"
                        ),
                    ));
                }
            }
        }
        let gaps = gap_tickets(t.refused.len() + lost.len());
        out.push(Replay::Record {
            ticket,
            slot: Some(slot),
            lost,
            gaps,
        });
    }
    Some(out)
}

/// Places in call order for `n` gaps after a record (none counted by the step rule).
fn gap_tickets(n: usize) -> Vec<Ticket> {
    (0..n).map(|_| Ticket::take_counted(false)).collect()
}

/// Hands the replay's entries to the tracer and points the nodes back at the sink (after the
/// real launch).
fn complete(e: &Exec, exec: usize, stream: cudaStream_t, replays: Vec<Replay>, ok: bool) {
    let _err = ErrScope::new();
    let sink = SINK.lock().unwrap_or_else(|p| p.into_inner()).0;
    for (t, r) in e.templates.iter().zip(replays) {
        match r {
            Replay::Gap {
                ticket,
                reason,
                bytes,
                detail,
            } => {
                if ok {
                    let m = engine::meta(t.api, t.op.clone(), t.stream, t.device);
                    let m = crate::tracer::gap_meta(m, reason, bytes, detail);
                    ticket.push(Entry::Gap(Box::new(m)));
                }
                // Not launched: the dropped ticket is a skip.
            }
            Replay::Record {
                ticket,
                slot,
                lost,
                gaps,
            } => {
                let redirected = slot.is_some();
                publish(t, (ticket, gaps), slot, &lost, stream, ok);
                if redirected {
                    reset(t, exec, sink);
                }
            }
        }
    }
}

/// One template's record of this replay.
fn publish(
    t: &Template,
    (ticket, gap_tickets): (Ticket, Vec<Ticket>),
    slot: Option<Slot>,
    lost: &[(usize, String)],
    stream: cudaStream_t,
    ok: bool,
) {
    let event = match slot {
        Some(_) if ok => {
            let ev = cuda::record_completion(t.device, stream);
            match ev {
                Ok(ev) => Some(ev),
                Err(code) => {
                    crate::fault(
                        t.api,
                        format!(
                            "cannot record a graph replay's completion event (cudaError {code})"
                        ),
                    );
                    // The slot is never handed out again: capture is off for good.
                    ticket.push(Entry::Skip {
                        slot: None,
                        event: None,
                    });
                    return;
                }
            }
        }
        _ => None,
    };
    if !ok {
        ticket.push(Entry::Skip { slot, event });
        return;
    }
    let mut tensors = t.tensors.clone();
    for &(i, _) in lost {
        tensors[i].captured = false;
    }
    let meta = engine::meta(t.api, t.op.clone(), t.stream, t.device);
    // Refused copies are gaps after the record (nothing is lost silently).
    let gaps: Vec<(u64, String)> = t
        .refused
        .iter()
        .chain(lost)
        .map(|(i, why)| (tensors.get(*i).map_or(0, |x| x.nbytes), why.clone()))
        .collect();
    let gap_meta = (!gaps.is_empty()).then(|| meta.clone());
    ticket.push(Entry::Capture(Box::new(Captured {
        meta,
        tensors,
        offsets: t.offsets.clone(),
        slot,
        event,
        // A replay's tensors go through its slot: ops too large for the ring are metadata
        // only in a graph (their copy nodes cannot be chunked per launch).
        streams: Vec::new(),
        prefiltered: false,
        expect: t.expect.clone(),
        rule_only: PerTensor::new(),
        fingerprints: PerTensor::new(),
    })));
    if let Some(m) = gap_meta {
        for ((bytes, detail), place) in gaps.into_iter().zip(gap_tickets) {
            let g = crate::tracer::gap_meta(m.clone(), GapReason::CopyRefused, bytes, detail);
            place.push(Entry::Gap(Box::new(g)));
        }
    }
}

/// Points a template's copy nodes back at the sink for later launches.
fn reset(t: &Template, exec: usize, sink: usize) {
    for c in &t.copies {
        let dst = (sink + c.at as usize) as *mut u8;
        if let Err(code) = cuda::redirect_copy(exec, c.node, dst, c.src, c.len) {
            // The node keeps writing into this replay's slot at every launch: no ring space
            // may ever be reused, so capture stops.
            crate::fault(
                t.api,
                format!("cannot point a graph snapshot node back at its staging buffer (cudaError {code})"),
            );
            return;
        }
    }
}
