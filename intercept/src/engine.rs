//! The snapshot engine: runs a [`plan`](crate::plan) around the real call.
//!
//! [`begin`] (before the real call): hands an op on a stream under graph capture to
//! [`graph`](crate::graph) (snapshotted at each replay), applies the selection (inputs, size
//! cap; an op whose step or rank cannot be selected keeps only what the step rule needs,
//! [`prefilter`](crate::prefilter)), reserves ONE ring slot for all captured tensors in ticket order (waiting at most
//! `TTRACE_WAIT_MS`, else a `RingFull` gap) or, for tensors above half the ring, streams them
//! through it in chunks, and enqueues the copies of inputs the op overwrites. [`finish`] (after it): enqueues the other copies on the
//! op's stream, records a pooled event after them and hands the entry to the tracer. NCCL ops
//! inside a group call `finish` at the outermost `ncclGroupEnd`, when their kernels exist.
//! No device synchronisation anywhere; no lock is held across a CUDA call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cuda_abi::cudart::cudaStream_t;
use ttrace_proto::config::StepRule;
use ttrace_proto::record::{GapReason, GemmOp, Op, Role, Tensor};
use ttrace_proto::ring::Slot;

use crate::cuda::{self, ErrScope};
use crate::fingerprint::Layout;
use crate::plan::{Copy, TensorPlan, When};
use crate::session::{self, Session};
use crate::tracer::{self, Captured, ChunkEntry, Entry, Meta, PerTensor, Ticket};
use crate::{graph, mode, prefilter, stall, thread};

/// An op about to be called.
pub struct Call {
    /// The C function, exactly.
    pub api: &'static str,
    pub op: Op,
    /// The stream the op runs on, as the copies and the event must use it (the per-thread
    /// default stream is `cudaStreamPerThread`, never 0, for a `_ptsz` call).
    pub stream: cudaStream_t,
    /// The stream as recorded.
    pub stream_id: u64,
    /// The device the op runs on (`None`: the current device).
    pub device: Option<i32>,
    pub tensors: Vec<TensorPlan>,
}

/// An op between [`begin`] and [`finish`].
pub struct InFlight {
    snap: Snap,
    /// A communicator whose asynchronous launch must finish before the copies after the op
    /// (non-blocking NCCL communicators).
    pub nccl_comm: usize,
}

/// How an op in flight is snapshotted.
enum Snap {
    /// Now, through the ring.
    Eager(Box<Eager>),
    /// At every replay of the CUDA graph the op is being captured into.
    Graph(Box<graph::Recording>),
}

/// An op snapshotted through the ring.
struct Eager {
    /// Its place in call order (`None` for a streamed op: taken at [`finish`], after its
    /// chunks).
    ticket: Option<Ticket>,
    /// Per tensor, the stream its bytes go through in chunks (`Some` on every captured tensor
    /// of a streamed op, filled as each is streamed).
    streams: Vec<Option<u64>>,
    /// Whether the op's tensors go through the ring in chunks.
    streamed: bool,
    meta: Meta,
    plans: Vec<TensorPlan>,
    /// Per tensor, the fingerprint its slot space holds instead of its bytes (a tensor copied
    /// for the step rule only, fingerprint.rs).
    fingerprints: PerTensor<Option<Layout>>,
    tensors: Vec<Tensor>,
    offsets: PerTensor<Option<u64>>,
    slot: Option<Slot>,
    slot_ptr: usize,
    stream: usize,
    device: i32,
    copied: bool,
    /// A copy was refused with a sticky error: the context failed.
    fatal: Option<u32>,
    /// Tensors whose snapshot copy the runtime refused, with its error: each becomes a
    /// `CopyRefused` gap after the record (empty, unallocated, almost always).
    refused: Vec<(usize, u32)>,
    /// Its ticket is counted (it may move the step, prefilter.rs).
    counted: bool,
    /// Reduced to what the step rule needs (prefilter.rs).
    prefiltered: bool,
    /// The program's call returns only once its work is complete ([`InFlight::complete_at_return`]).
    complete_at_return: bool,
}

impl InFlight {
    fn new(snap: Snap) -> InFlight {
        InFlight { snap, nccl_comm: 0 }
    }

    /// The ticket's number (`None`: a streamed op takes its ticket when it finishes; an op
    /// recorded into a graph takes none, its replays do).
    pub fn ticket(&self) -> Option<u64> {
        match &self.snap {
            Snap::Eager(e) => e.ticket.as_ref().map(Ticket::number),
            Snap::Graph(_) => None,
        }
    }

    /// Whether the op's tensors are streamed in chunks: finishing it waits for the collector,
    /// so an `ncclGroupEnd` finishes such ops after the others.
    pub fn is_streamed(&self) -> bool {
        matches!(&self.snap, Snap::Eager(e) if e.streamed)
    }

    /// The program's call returns only once its work is done and its outputs are snapshotted
    /// after it (a synchronous upload, hooks/cudart.rs): [`finish`] then returns only once the
    /// snapshot's copies are done too. Else the program, which may change the bytes at once
    /// from a stream that does not wait for the legacy default stream
    /// (`cudaStreamNonBlocking`), would have them copied changed: a snapshot of bytes the copy
    /// never made (seen on the simulator, an in-place all-reduce right after the synchronous
    /// upload of its buffer).
    pub fn complete_at_return(&mut self) {
        if let Snap::Eager(e) = &mut self.snap {
            e.complete_at_return = true;
        }
    }
}

/// Numbers the process's streamed tensors.
static NEXT_STREAM: AtomicU64 = AtomicU64::new(0);

/// Serialises ring reservations (with their tickets) among the process's threads.
static RESERVE: Mutex<()> = Mutex::new(());

/// Snapshot copies the runtime refused (their tensors were recorded without bytes).
static REFUSED_COPIES: AtomicU64 = AtomicU64::new(0);

/// Snapshot copies the runtime refused so far: said at exit (tracer.rs).
pub(crate) fn refused_copies() -> u64 {
    REFUSED_COPIES.load(Ordering::Relaxed)
}

/// The call-time metadata of an op on this thread.
pub fn meta(api: &'static str, op: Op, stream_id: u64, device: i32) -> Meta {
    meta_of(api, op, stream_id, device, true)
}

/// [`meta`], with the NVTX ranges around the op and the kernel launches before it only when
/// `context` (else the launches are forgotten and no ranges are shared: a record reduced by
/// the step filter is not stored).
fn meta_of(api: &'static str, op: Op, stream_id: u64, device: i32, context: bool) -> Meta {
    let context_of = |t: &mut thread::ThreadState| {
        if context {
            (t.ranges(), t.take_kernels())
        } else {
            t.forget_kernels();
            (thread::no_ranges(), Vec::new())
        }
    };
    let (thread, (nvtx, kernels_before)) = thread::with(|t| (t.tid(), context_of(t)))
        .unwrap_or_else(|| (crate::identity::gettid(), (thread::no_ranges(), Vec::new())));
    Meta {
        api,
        op,
        stream: stream_id,
        device,
        thread,
        nvtx,
        kernels_before,
        t_call_ns: tracer::now_ns(),
        gemm_ordinal: None,
    }
}

/// Records a gap in call order.
pub fn gap(meta: Meta, reason: GapReason, bytes: u64, detail: String) {
    tracer::push(Entry::Gap(Box::new(tracer::gap_meta(
        meta, reason, bytes, detail,
    ))));
}

/// Prepares the snapshot of `call` before the real function runs. `None`: not captured (a gap
/// was recorded if something was skipped).
pub fn begin(call: Call) -> Option<InFlight> {
    let session = session::get()?;
    let _err = ErrScope::new();
    let device = match call.device {
        Some(d) => d,
        None => cuda::get_device().unwrap_or(0),
    };
    let auto = session.cfg.step_rule == StepRule::Auto;
    match cuda::is_capturing(call.stream) {
        Ok(false) => {}
        // Snapshotted at every replay of the graph (graph.rs).
        Ok(true) => {
            if auto && matches!(call.op, Op::Gemm(_)) {
                prefilter::note_graph_gemm();
            }
            return graph::begin(call, device, session)
                .map(|r| InFlight::new(Snap::Graph(Box::new(r))));
        }
        // A gap is recorded whatever its stream says: the API it names may not run on that
        // stream (the legacy cuBLAS API's kernel stream, cuBLAS-XT's own streams), and the
        // gap is all that says the call happened. Nothing is enqueued for it.
        Err(_) if matches!(call.op, Op::Gap(_)) && call.tensors.is_empty() => {}
        // The legacy stream during a capture, a bad handle: the op reports the same error.
        Err(_) => return None,
    }
    let cfg = session.cfg;
    let mut plans = call.tensors;
    select(session, &mut plans, matches!(call.op, Op::Gemm(_)));
    // The GEMM's signature, computed once for what reads it below.
    let sig = std::cell::OnceCell::new();
    let sig_of = |g: &GemmOp| *sig.get_or_init(|| tracer::gemm_sig(call.api, g));
    // Under `auto` every GEMM call takes its ordinal (the rule's periods, steps.rs).
    let turn = match &call.op {
        Op::Gemm(g) if auto => Some(prefilter::gemm_turn(sig_of(g))),
        _ => None,
    };
    // Within a period only the GEMMs the rule reads can move the step.
    let counted =
        turn.and_then(|t| t.within) != Some(false) && prefilter::counts_op(cfg, &call.op, sig_of);
    // Whether the op is streamed follows from what a full capture takes, so that the records
    // come in the same order (a streamed op takes its ticket after the call) and the step
    // rule sees the same operands (streamed ones are not sampled).
    let streamed = layout(&plans).1 > slot_limit(session.ring.capacity());
    if streamed {
        // Chunks are published as they come: nothing is copied for the rule alone.
        for t in plans.iter_mut().filter(|t| t.rule_only) {
            (t.captured, t.rule_only) = (false, false);
        }
    }
    let prefiltered = !prefilter::may_be_wanted(cfg, device);
    if prefiltered {
        prefilter::keep_rule_inputs(cfg, &call.op, counted, turn, &mut plans);
        if prefilter::needless(counted, &plans) {
            // Its kernels would have gone with its record, which is never stored.
            let _ = thread::with(|t| t.forget_kernels());
            tracer::note_needless();
            return None;
        }
        if !streamed {
            // Not stored: read for the step rule only, so their fingerprints suffice.
            for t in plans.iter_mut().filter(|t| t.captured) {
                t.rule_only = matches!(t.role, Role::A | Role::B);
            }
        }
    }
    // Only a GEMM that may recur the anchor needs its operands' fingerprints; the others'
    // glimpses tell whether they read the anchor's bytes again (fingerprint.rs).
    let recurs = match &call.op {
        Op::Gemm(g) if plans.iter().any(|t| t.rule_only) => {
            prefilter::may_recur_anchor(|| sig_of(g))
        }
        _ => true,
    };
    let fingerprints: PerTensor<Option<Layout>> =
        plans.iter().map(|t| fingerprint_only(t, recurs)).collect();
    let (offsets, total) = layout_in_slot(&plans, &fingerprints);
    let mut m = meta_of(call.api, call.op, call.stream_id, device, !prefiltered);
    m.gemm_ordinal = turn.map(|t| t.ordinal);
    if streamed {
        let how = Prefilter {
            counted,
            prefiltered,
        };
        return Some(begin_streamed(session, m, plans, call.stream, device, how));
    }
    let (ticket, slot) = if total > 0 {
        match reserve(session, total, None, counted) {
            Some((t, s)) => (t, Some(s)),
            None => {
                let detail = if stall::spent(cfg.max_stall_ms) {
                    format!(
                        "no ring space for {total} bytes, and the process already waited \
                         TTRACE_MAX_STALL_MS={} ms on the daemon in all",
                        cfg.max_stall_ms
                    )
                } else {
                    format!(
                        "no ring space for {total} bytes within TTRACE_WAIT_MS={} ms",
                        cfg.wait_ms
                    )
                };
                gap(m, GapReason::RingFull, total, detail);
                return None;
            }
        }
    } else {
        (Ticket::take_counted(counted), None)
    };
    let slot_ptr = slot.map_or(0, |s| {
        // SAFETY: the slot was just reserved by this thread; only its address is taken here,
        // the bytes are written by the device copies.
        unsafe { session.ring.slot_bytes(&s) }.as_mut_ptr() as usize
    });
    let tensors = plans.iter().map(|t| tensor_of(t, !prefiltered)).collect();
    let mut f = Eager {
        ticket: Some(ticket),
        streams: Vec::new(),
        streamed: false,
        meta: m,
        plans,
        fingerprints,
        tensors,
        offsets,
        slot,
        slot_ptr,
        stream: call.stream as usize,
        device,
        copied: false,
        fatal: None,
        refused: Vec::new(),
        counted,
        prefiltered,
        complete_at_return: false,
    };
    f.copy(When::Before);
    Some(InFlight::new(Snap::Eager(Box::new(f))))
}

/// Applies the capture settings to an op's tensors: inputs (`TTRACE_INPUTS`) and the size cap
/// (`--max-tensor-bytes`). Under the auto step rule a `gemm`'s A and B are still copied when
/// inputs are off, for the rule only (its CRCs and samples: the steps are numbered as in a
/// full capture), and not stored.
pub(crate) fn select(session: &Session, plans: &mut [TensorPlan], gemm: bool) {
    let cfg = session.cfg;
    let rule = gemm && cfg.step_rule == StepRule::Auto;
    for t in plans.iter_mut() {
        if !t.captured {
            continue;
        }
        if t.nbytes > cfg.max_tensor_bytes {
            t.captured = false;
        } else if t.input && !cfg.inputs {
            t.rule_only = rule && matches!(t.role, Role::A | Role::B);
            t.captured = t.rule_only;
        }
    }
}

/// Where each captured tensor goes in the op's one slot (`None`: not captured), and the slot's
/// size.
pub(crate) fn layout(plans: &[TensorPlan]) -> (PerTensor<Option<u64>>, u64) {
    layout_in_slot(plans, &[])
}

/// [`layout`] where the tensors with a `fingerprints` entry take only their fingerprint's
/// bytes.
fn layout_in_slot(
    plans: &[TensorPlan],
    fingerprints: &[Option<Layout>],
) -> (PerTensor<Option<u64>>, u64) {
    // As `tensor_offsets` places them, in one pass.
    let mut end = 0u64;
    let offsets = plans
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let size = match fingerprints.get(i) {
                Some(Some(fp)) => fp.bytes(),
                _ => t.nbytes,
            };
            t.captured.then(|| ttrace_proto::ring::pack(&mut end, size))
        })
        .collect();
    (offsets, end)
}

/// The fingerprint (or with `recurs` false, the glimpse) a tensor copied for the step rule
/// only is reduced to (one copy of its pieces): when its bytes lie at one address, in order
/// (else it is copied whole and the tracer takes the fingerprint from its packed bytes).
fn fingerprint_only(t: &TensorPlan, recurs: bool) -> Option<Layout> {
    let contiguous = t.blocks.is_none() && t.source.is_contiguous();
    (t.captured && t.rule_only && contiguous).then(|| {
        if recurs {
            Layout::of(t.nbytes)
        } else {
            Layout::glimpse(t.nbytes)
        }
    })
}

/// The copy that brings the fingerprint `fp` of a contiguous tensor at `src` into its slot
/// space.
fn fingerprint_copy(src: u64, fp: Layout) -> Copy {
    if fp.count == 1 {
        Copy::Linear {
            dst: 0,
            src,
            len: fp.width,
        }
    } else {
        Copy::Pitched {
            dst: 0,
            src,
            spitch: fp.stride,
            width: fp.width,
            height: fp.count,
        }
    }
}

/// Keeps an op's tensors only if they fit one slot (the ring's largest page-locked part;
/// metadata only otherwise): for snapshots that cannot be streamed in chunks (a graph replay's
/// copy nodes are fixed).
pub(crate) fn fit_one_slot(session: &Session, plans: &mut [TensorPlan]) {
    // A slot lies in one page-locked part of the ring (session.rs).
    if layout(plans).1 > session.pin.largest_part() {
        plans.iter_mut().for_each(|t| t.captured = false);
    }
}

/// A record's tensor from its plan. `crc32` is filled by the tracer, and the strides of the
/// packed bytes when the record is published (tracer.rs: the many records dropped outside
/// `--steps` never allocate them). A record reduced by the step filter gets no shape either:
/// it is never published as a record (a gap stands in for it if it turns out selected).
pub(crate) fn tensor_of(t: &TensorPlan, with_shape: bool) -> Tensor {
    Tensor {
        role: t.role,
        dtype: t.dtype,
        strides: Vec::new(),
        shape: if with_shape {
            t.shape.to_vec()
        } else {
            Vec::new()
        },
        ptr: t.ptr,
        nbytes: t.nbytes,
        captured: t.captured,
        crc32: 0,
    }
}

/// The bytes some tensors must hold for their record to stand, by tensor index (a
/// pointer-array batch's arrays, [`TensorPlan::expect`]).
pub(crate) fn expectations(plans: &[TensorPlan]) -> Vec<(usize, std::sync::Arc<[u8]>)> {
    plans
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.expect.clone().map(|e| (i, e)))
        .collect()
}

/// The tensors (by index) copied for the step rule only.
fn rule_only(plans: &[TensorPlan]) -> PerTensor<usize> {
    plans
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.rule_only.then_some(i))
        .collect()
}

/// Completes the snapshot after the real call: `ok` says whether the op was launched (a call
/// that failed is not recorded; copies already enqueued still complete before its slot is
/// reused).
pub fn finish(f: InFlight, ok: bool) {
    match f.snap {
        Snap::Graph(rec) => graph::finish(*rec, ok),
        Snap::Eager(e) => finish_eager(*e, ok),
    }
}

fn finish_eager(mut f: Eager, ok: bool) {
    let _err = ErrScope::new();
    if f.streamed {
        return finish_streamed(f, ok);
    }
    let Some(ticket) = f.ticket.take() else {
        return;
    };
    if ok && !mode::dead() {
        f.copy(When::After);
    }
    let stream = f.stream as cudaStream_t;
    if let Some(code) = f.fatal {
        // The context failed (a kernel fault, possibly this op's): nothing more can be taken.
        crate::fault(
            f.meta.api,
            format!("the device context failed (cudaError {code})"),
        );
        ticket.push(Entry::Skip {
            slot: None,
            event: None,
        });
        return;
    }
    let event = if f.copied {
        match cuda::record_completion(f.device, stream) {
            Ok(ev) => {
                if f.complete_at_return {
                    // Before the tracer has it (it returns it to the pool once complete).
                    // An error here is the tracer's to report, when it waits.
                    let _ = cuda::event_synchronize(ev.handle());
                }
                Some(ev)
            }
            Err(code) => {
                // Copies are in flight with no way to see them finish: stop capturing so the
                // ring space is never handed out again.
                crate::fault(
                    f.meta.api,
                    format!("cannot record a completion event (cudaError {code})"),
                );
                ticket.push(Entry::Skip {
                    slot: None,
                    event: None,
                });
                return;
            }
        }
    } else {
        None
    };
    if !ok {
        ticket.push(Entry::Skip {
            slot: f.slot,
            event,
        });
        return;
    }
    let refusals = refusal_gaps(&f);
    let c = Captured {
        meta: f.meta,
        tensors: f.tensors,
        offsets: f.offsets,
        slot: f.slot,
        event,
        streams: Vec::new(),
        prefiltered: f.prefiltered,
        expect: expectations(&f.plans),
        rule_only: rule_only(&f.plans),
        fingerprints: f.fingerprints,
    };
    ticket.push(Entry::Capture(Box::new(c)));
    for (m, bytes, detail) in refusals {
        gap(m, GapReason::CopyRefused, bytes, detail);
    }
}

/// The `CopyRefused` gaps of `f`'s refused snapshot copies, to record after its record:
/// (meta, bytes, detail) each.
fn refusal_gaps(f: &Eager) -> Vec<(Meta, u64, String)> {
    f.refused
        .iter()
        .map(|&(i, code)| {
            let p = &f.plans[i];
            let m = Meta {
                t_call_ns: tracer::now_ns(),
                ..f.meta.clone()
            };
            let detail = format!(
                "the runtime refused the snapshot copy of {:?} ({} bytes, cudaError {code}): \
                 the op's record, before this gap, keeps it as metadata only",
                p.role, p.nbytes
            );
            (m, p.nbytes, detail)
        })
        .collect()
}

impl Eager {
    /// Enqueues the copies of the captured tensors taken at `when`. A copy the runtime refuses
    /// leaves its tensor uncaptured.
    fn copy(&mut self, when: When) {
        let stream = self.stream as cudaStream_t;
        for (i, p) in self.plans.iter().enumerate() {
            let (Some(off), true) = (self.offsets[i], self.tensors[i].captured) else {
                continue;
            };
            if p.when != when {
                continue;
            }
            let base = self.slot_ptr + off as usize;
            // A fingerprint is one copy: no list to build.
            let (one, all);
            let copies: &[Copy] = match self.fingerprints[i] {
                Some(fp) => {
                    one = [fingerprint_copy(p.source.src, fp)];
                    &one
                }
                None => {
                    all = p.copies();
                    &all
                }
            };
            for &c in copies {
                let r = enqueue(base, c, stream);
                match r {
                    Ok(()) => self.copied = true,
                    Err(code) => {
                        if cuda::is_fatal(code) {
                            // The context failed (an earlier kernel's fault, seen here first
                            // when the fault wins the race with this op): the op is not
                            // recorded and the fault path says so once, not as a refusal.
                            self.fatal.get_or_insert(code);
                            self.tensors[i].captured = false;
                            break;
                        }
                        // The record keeps the tensor as metadata only: said once as a
                        // warning, counted for the exit summary (an H200 refused copies
                        // across two ring registrations).
                        let line = format!(
                            "{}: snapshot copy of {:?} refused (cudaError {code}): the tensor \
                             is recorded without its bytes",
                            self.meta.api, p.role
                        );
                        if REFUSED_COPIES.fetch_add(1, Ordering::Relaxed) == 0 {
                            crate::log::warn(&line);
                        } else {
                            crate::log::debug(&line);
                        }
                        self.tensors[i].captured = false;
                        self.refused.push((i, code));
                        break;
                    }
                }
            }
        }
    }
}

/// Enqueues one snapshot copy on `stream` into the ring at `base` (+ the copy's offset).
pub(crate) fn enqueue(base: usize, c: Copy, stream: cudaStream_t) -> Result<(), u32> {
    match c {
        Copy::Linear { dst, src, len } => {
            cuda::copy_linear((base + dst as usize) as *mut u8, src, len, stream)
        }
        Copy::Pitched {
            dst,
            src,
            spitch,
            width,
            height,
        } => cuda::copy_pitched(
            (base + dst as usize) as *mut u8,
            src,
            spitch,
            width,
            height,
            stream,
        ),
    }
}

/// Reserves `total` bytes and a ticket, waiting for the daemon to free space at most
/// `TTRACE_WAIT_MS`, and no longer than what is left of the process's stall budget (the
/// wait is charged to it). Gives up at once when the tracer waits for this thread's own
/// deferred group, or for `held` (a ticket the caller holds unpushed): no space can come
/// before that is handed in.
pub(crate) fn reserve(
    s: &Session,
    total: u64,
    held: Option<u64>,
    counted: bool,
) -> Option<(Ticket, Slot)> {
    let started = Instant::now();
    let r = reserve_until(s, total, started, held, counted);
    let waited = started.elapsed();
    if waited > Duration::from_millis(1) {
        stall::charge(waited);
    }
    r
}

fn reserve_until(
    s: &Session,
    total: u64,
    started: Instant,
    held: Option<u64>,
    counted: bool,
) -> Option<(Ticket, Slot)> {
    let wait = Duration::from_millis(s.cfg.wait_ms).min(stall::remaining(s.cfg.max_stall_ms));
    let deadline = started + wait;
    let deferred = my_oldest_deferred();
    let mine = match (deferred, held) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    reserve_polling(s, total, mine, counted, || Instant::now() >= deadline)
}

/// Reserves `len` bytes and a ticket, polling with a growing pause, until capture dies, the
/// tracer stopped or waits for `mine` (a ticket of this thread's that is not handed in yet: no
/// space can come before it is, once the daemon has released what the tracer published), or
/// `out_of_time` says the wait is over. The ticket is
/// `counted` (prefilter.rs) as asked.
fn reserve_polling(
    s: &Session,
    len: u64,
    mine: Option<u64>,
    counted: bool,
    mut out_of_time: impl FnMut() -> bool,
) -> Option<(Ticket, Slot)> {
    let mut pause = Duration::from_micros(50);
    loop {
        {
            let _l = RESERVE.lock().unwrap_or_else(|p| p.into_inner());
            // A slot lies in one page-locked part of the ring, locked before any copy goes
            // into it (session.rs). The ring may start its next lap early to stay in the
            // locked part only when no ticket is out: then the slots in use are released
            // without the program, and a burst after this slot (an NCCL group, a graph
            // replay: they cannot wait for their own first ticket) gets the whole ring once
            // they are (proto/src/ring.rs, `Ring::reserve_within`).
            let front = if tracer::no_ticket_out() {
                s.pin.locked()
            } else {
                s.ring.capacity()
            };
            let head = s.ring.head();
            if let Some(slot) =
                s.ring
                    .reserve_within(len, Duration::ZERO, |off| s.pin.part_end(off), front)
            {
                if slot.pos > head && s.ring.tail() < slot.pos {
                    // The bytes the slot skipped (to the next lap, or part) are released on
                    // their own, as soon as the slots before them are: with the slot, a
                    // slot held long (an NCCL group's first) would keep the ring's tail
                    // before them, and every slot after it within their length.
                    Ticket::take().push(Entry::Skip {
                        slot: Some(Slot {
                            pos: head,
                            len: slot.pos - head,
                            end: slot.pos,
                        }),
                        event: None,
                    });
                }
                let end = slot.pos % s.ring.capacity() + slot.len;
                if let Err(why) = s.pin.cover(end) {
                    // Copies into pageable memory would wait for the device: stop capturing.
                    Ticket::take().push(Entry::Skip {
                        slot: Some(slot),
                        event: None,
                    });
                    crate::fault("cudaHostRegister", why);
                    return None;
                }
                return Some((Ticket::take_counted(counted), slot));
            }
        }
        if mode::dead()
            || out_of_time()
            || tracer::stopped()
            // Space can still come from the daemon releasing what the tracer published
            // before the ticket it waits for.
            || (mine.is_some_and(|m| tracer::waiting_for() == m) && !tracer::daemon_owes(s.ring))
        {
            return None;
        }
        // Space comes from the tracer publishing or skipping what it holds: no nap now.
        tracer::nudge();
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
}

/// The oldest ticket of this thread's deferred NCCL group, or of the snapshots a hook holds
/// before its call ([`thread::ThreadState::holding`]): the tracer cannot get past it before it
/// is handed in, so no ring space can come while it waits there.
fn my_oldest_deferred() -> Option<u64> {
    thread::with(|t| {
        let group = t.deferred.iter().filter_map(InFlight::ticket).min();
        match (group, t.holding) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    })
    .flatten()
}

/// The most one record reserves in one slot (half the ring): larger snapshots are streamed in
/// chunks, so that other records keep flowing beside them and no snapshot is too large.
fn slot_limit(capacity: u64) -> u64 {
    capacity / 2
}

/// Whether a snapshot of `bytes` is streamed in chunks rather than copied into one slot.
pub(crate) fn is_streamed_size(bytes: u64) -> bool {
    session::get().is_some_and(|s| bytes > slot_limit(s.ring.capacity()))
}

/// Bytes of one chunk of a streamed tensor: a quarter of the ring, so that the device copies
/// of one chunk overlap the collector's work on the previous ones.
fn chunk_bytes(capacity: u64) -> u64 {
    (capacity / 4 / ttrace_proto::ring::ALIGN * ttrace_proto::ring::ALIGN)
        .max(ttrace_proto::ring::ALIGN)
}

/// How the step selection treats an op (prefilter.rs).
#[derive(Clone, Copy)]
struct Prefilter {
    counted: bool,
    prefiltered: bool,
}

/// [`begin`] for an op whose tensors do not fit one slot: each captured tensor goes through
/// the ring in chunks, the inputs the op overwrites now, the others after it (in [`finish`]).
/// The record takes its ticket after its last chunk.
fn begin_streamed(
    s: &Session,
    meta: Meta,
    plans: Vec<TensorPlan>,
    stream: cudaStream_t,
    device: i32,
    how: Prefilter,
) -> InFlight {
    let tensors = plans.iter().map(|t| tensor_of(t, true)).collect();
    let mut f = Eager {
        ticket: None,
        streams: vec![None; plans.len()],
        streamed: true,
        meta,
        offsets: smallvec::smallvec![None; plans.len()],
        fingerprints: smallvec::smallvec![None; plans.len()],
        plans,
        tensors,
        slot: None,
        slot_ptr: 0,
        stream: stream as usize,
        device,
        copied: false,
        fatal: None,
        refused: Vec::new(),
        counted: how.counted,
        prefiltered: how.prefiltered,
        complete_at_return: false,
    };
    f.stream_all(s, When::Before);
    InFlight::new(Snap::Eager(Box::new(f)))
}

/// [`finish`] for a streamed op.
fn finish_streamed(mut f: Eager, ok: bool) {
    let Some(s) = session::get() else {
        return;
    };
    if ok && !mode::dead() && f.fatal.is_none() {
        f.stream_all(s, When::After);
    }
    if !ok || f.fatal.is_some() {
        // The call failed: what was streamed before it goes.
        for id in f.streams.iter().flatten() {
            tracer::push(Entry::StreamAbort(*id));
        }
        return;
    }
    let c = Captured {
        meta: f.meta,
        tensors: f.tensors,
        offsets: f.offsets,
        slot: None,
        event: None,
        streams: f.streams,
        prefiltered: f.prefiltered,
        expect: expectations(&f.plans),
        rule_only: PerTensor::new(),
        fingerprints: PerTensor::new(),
    };
    Ticket::take_counted(f.counted).push(Entry::Capture(Box::new(c)));
}

impl Eager {
    /// Streams the captured tensors taken at `when`; a tensor that cannot be streamed whole
    /// is left uncaptured, with a gap saying why.
    fn stream_all(&mut self, s: &Session, when: When) {
        for i in 0..self.plans.len() {
            if !self.tensors[i].captured || self.plans[i].when != when {
                continue;
            }
            match self.stream_tensor(s, i) {
                Ok(id) => self.streams[i] = Some(id),
                Err((reason, detail)) => {
                    self.tensors[i].captured = false;
                    let m = Meta {
                        t_call_ns: tracer::now_ns(),
                        ..self.meta.clone()
                    };
                    gap(m, reason, self.plans[i].nbytes, detail);
                }
            }
        }
    }

    /// Copies tensor `i` into the ring chunk by chunk, each chunk on the op's stream with an
    /// event after it, handed to the tracer under a ticket of its own. Waiting for space is
    /// waiting for the collector to take earlier chunks.
    fn stream_tensor(&mut self, s: &Session, i: usize) -> Result<u64, (GapReason, String)> {
        let id = NEXT_STREAM.fetch_add(1, Ordering::Relaxed);
        let p = &self.plans[i];
        let (total, chunk) = (p.nbytes, chunk_bytes(s.ring.capacity()));
        let stream = self.stream as cudaStream_t;
        let (mut offset, mut index) = (0u64, 0u32);
        let abort_for = |reason: GapReason, index: u32, why: String| {
            if index > 0 {
                tracer::push(Entry::StreamAbort(id));
            }
            Err((reason, why))
        };
        let abort = |index: u32, why: String| abort_for(GapReason::RingFull, index, why);
        while offset < total {
            let len = chunk.min(total - offset);
            let Some((ticket, slot)) = reserve_chunk(s, len) else {
                return abort(
                    index,
                    format!(
                        "streaming a {total}-byte tensor: no ring space for chunk {index} \
                         ({len} bytes) while the collector released nothing for \
                         TTRACE_WAIT_MS={} ms (or the TTRACE_MAX_STALL_MS={} ms budget ran out)",
                        s.cfg.wait_ms, s.cfg.max_stall_ms
                    ),
                );
            };
            // SAFETY: the slot was just reserved by this thread; only its address is taken.
            let base = unsafe { s.ring.slot_bytes(&slot) }.as_mut_ptr() as usize;
            let mut refused = None;
            for c in p.copies_range(offset, len) {
                let r = enqueue(base, c, stream);
                if let Err(code) = r {
                    refused = Some(code);
                    break;
                }
            }
            if let Some(code) = refused.filter(|c| cuda::is_fatal(*c)) {
                // The context failed: nothing more can be taken, the slot is never reused.
                self.fatal = Some(code);
                crate::fault(
                    self.meta.api,
                    format!("the device context failed (cudaError {code})"),
                );
                ticket.push(Entry::Skip {
                    slot: None,
                    event: None,
                });
                return abort(index, format!("cudaError {code}"));
            }
            let event = match cuda::record_completion(self.device, stream) {
                Ok(ev) => {
                    if self.complete_at_return && offset + len == total {
                        // The last chunk: the earlier ones completed before it (one stream).
                        let _ = cuda::event_synchronize(ev.handle());
                    }
                    ev
                }
                Err(code) => {
                    crate::fault(
                        self.meta.api,
                        format!("cannot record a completion event (cudaError {code})"),
                    );
                    ticket.push(Entry::Skip {
                        slot: None,
                        event: None,
                    });
                    return abort(index, format!("cudaError {code}"));
                }
            };
            if let Some(code) = refused {
                ticket.push(Entry::Skip {
                    slot: Some(slot),
                    event: Some(event),
                });
                return abort_for(
                    GapReason::CopyRefused,
                    index,
                    format!("the runtime refused a snapshot copy (cudaError {code})"),
                );
            }
            ticket.push(Entry::Chunk(Box::new(ChunkEntry {
                stream: id,
                index,
                offset,
                len,
                total,
                elem: p.dtype.size() as u8,
                slot,
                event,
            })));
            offset += len;
            index += 1;
        }
        Ok(id)
    }
}

/// Reserves a chunk's slot. The wait ends when the collector, owing published slots, has
/// released nothing for `TTRACE_WAIT_MS` (or what is left of the stall budget): only such
/// periods are charged to the budget. Waiting while it keeps releasing is the capture's
/// throughput, and waiting while the device still runs the op (an output's chunks follow it
/// on its stream) is the op's own time: neither is a stall.
fn reserve_chunk(s: &Session, len: u64) -> Option<(Ticket, Slot)> {
    let wait = Duration::from_millis(s.cfg.wait_ms);
    let mine = my_oldest_deferred();
    let mut tail = s.ring.tail();
    let mut idle_since = Instant::now();
    reserve_polling(s, len, mine, false, || {
        let now = Instant::now();
        let t = s.ring.tail();
        // Only the daemon sitting on published slots is a stall: while the device runs the
        // op (an after-copy waits for it) or the tracer waits for a chunk's copy, nothing is
        // owed yet. A tracer that has not started yet counts as idle, so the wait stays
        // bounded (a big copy as the process's first op comes before the thread runs).
        let started = tracer::waiting_for() != u64::MAX;
        if started && (t != tail || !tracer::daemon_owes(s.ring)) {
            (tail, idle_since) = (t, now);
        }
        let idle = now - idle_since;
        let over = idle >= wait.min(stall::remaining(s.cfg.max_stall_ms));
        if over {
            stall::charge(idle);
        }
        over
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{matrix, Matrix};
    use ttrace_proto::ring::tensor_offsets;

    fn operand(rows: u64, ld: u64) -> TensorPlan {
        let m = Matrix {
            ptr: 0x10_0000,
            dtype: 14, // BF16
            rows,
            cols: 1024,
            ld,
            batch: 1,
            stride: 0,
            batched: false,
        };
        TensorPlan {
            rule_only: true,
            ..matrix(Role::A, &m, When::After, true)
        }
    }

    /// An operand copied for the step rule only takes one pitched copy of its fingerprint's
    /// pieces, and its slot space is the fingerprint's, whatever the operand's size.
    #[test]
    fn a_rule_only_operand_copies_only_its_fingerprint() {
        // Up to 64 MiB the fingerprint is the whole operand (one plain copy's worth).
        let small = operand(1024, 1024);
        let fp = fingerprint_only(&small, true).expect("a contiguous operand is fingerprinted");
        assert_eq!(fp.bytes(), small.nbytes);
        // A GEMM that cannot recur the anchor takes the glimpse: over 1 MiB, the pieces only.
        assert!(small.nbytes > crate::fingerprint::GLIMPSE_WHOLE_MAX);
        let glimpse = fingerprint_only(&small, false).expect("a contiguous operand is glimpsed");
        assert_eq!(glimpse, Layout::glimpse(small.nbytes));
        assert_eq!(
            glimpse.bytes(),
            crate::fingerprint::PIECE * crate::fingerprint::PIECES
        );
        assert!(matches!(
            fingerprint_copy(small.source.src, glimpse),
            Copy::Pitched { height, .. } if height == crate::fingerprint::PIECES
        ));
        // Over 64 MiB, the pieces only: one pitched copy.
        let t = operand(65_536, 65_536);
        assert!(t.nbytes > crate::fingerprint::WHOLE_MAX);
        let fp = fingerprint_only(&t, true).expect("a contiguous operand is fingerprinted");
        assert_eq!(fingerprint_only(&t, false), Some(fp));
        assert_eq!(
            fp.bytes(),
            crate::fingerprint::PIECE * crate::fingerprint::PIECES
        );
        assert_eq!(
            fingerprint_copy(t.source.src, fp),
            Copy::Pitched {
                dst: 0,
                src: 0x10_0000,
                spitch: fp.stride,
                width: crate::fingerprint::PIECE,
                height: crate::fingerprint::PIECES,
            }
        );
        let plans = [t];
        let (_, total) = layout_in_slot(&plans, &[Some(fp)]);
        assert!(total < plans[0].nbytes / 100, "{total} bytes in the slot");
    }

    /// The tensors lie in the slot where `tensor_offsets` (the daemon's reading) puts the
    /// captured ones, fingerprints taking their own size.
    #[test]
    fn the_slot_layout_is_tensor_offsets_of_the_captured_sizes() {
        let mut plans = vec![operand(1000, 1024), operand(64, 64), operand(3, 3)];
        plans[1].captured = false;
        let fp = Some(Layout::of(plans[2].nbytes));
        let (offsets, total) = layout_in_slot(&plans, &[None, None, fp]);
        let sizes = [plans[0].nbytes, fp.map_or(0, |f| f.bytes())];
        let (want, want_total) = tensor_offsets(&sizes);
        assert_eq!(offsets.as_slice(), [Some(want[0]), None, Some(want[1])]);
        assert_eq!(total, want_total);
        // Whether an op is streamed is decided from the size of its whole slot.
        let (_, whole) = tensor_offsets(&[plans[0].nbytes, plans[2].nbytes]);
        assert_eq!(layout(&plans).1, whole);
    }

    /// A stored operand, or one whose rows are padded (its packed bytes are not at one
    /// address), is copied whole: the tracer takes the fingerprint from its packed bytes.
    #[test]
    fn stored_or_padded_operands_are_copied_whole() {
        let stored = TensorPlan {
            rule_only: false,
            ..operand(1024, 1024)
        };
        assert_eq!(fingerprint_only(&stored, true), None);
        assert_eq!(fingerprint_only(&operand(1000, 1024), true), None);
        assert_eq!(fingerprint_only(&operand(1000, 1024), false), None);
    }
}
