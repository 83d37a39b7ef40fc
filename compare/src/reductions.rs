//! Collectives: what each reduction of the run must produce, compared with the reference
//! GEMM output it reduces (found by dataflow: the op that last wrote the buffer it reads).
//!
//! A reduction over a tensor-parallel group (row-parallel all-reduce, sequence-parallel
//! reduce-scatter: partial sums) must give the reference's unsharded result at the scale its
//! inputs were placed at, whatever its `ncclRedOp_t`: averaging partial sums is the group
//! size times too little, a divergence at that collective. A data-parallel reduction's
//! output scale is decided from the data once every reduction was seen
//! ([`crate::gradscale`]). Reductions over other groups (tied weights across pipeline
//! stages) have no reference meaning and are not compared.

use std::collections::{BTreeMap, BTreeSet};

use rayon::prelude::*;

use ttrace_format::dtype::DType;
use ttrace_format::record::{CollectiveKind, MemsetOp, Op, Record, Role, Tensor};

use crate::align::{Alignment, RefOp};
use crate::combine::Merge;
use crate::comparison::{accumulates, comparison, nvtx_path, Pending, Position, Unjudged};
use crate::gradscale::{self, updates::Updates, Evidence};
use crate::layout::LayoutSummary;
use crate::numerics::{self, Placement, ShardError};
use crate::placement::{unplaced, Shard};
use crate::prefetch::TensorAt;
use crate::results::Results;
use crate::tolerance;
use crate::trace::{collective, gemm, Decoding, RunTrace, Values};
use crate::CompareError;

/// What a reduction over a group must produce, relative to the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MustProduce {
    /// A tensor-parallel group's partial sums: the reference's unsharded result, at the
    /// scale its inputs were placed at (1 for partial sums of the reference's own values).
    ReferenceAtInputScale,
    /// A data-parallel group's gradients: the reference's at the scale decided from the
    /// data ([`gradscale::decide`]) or given with `--dp-reduction-scale`.
    ScaledGradient,
}

/// What a reduction over `members` must produce in `layout`; `None` when the group is
/// neither tensor- nor data-parallel (its result has no reference meaning).
pub(crate) fn must_produce(layout: &LayoutSummary, members: &[u32]) -> Option<MustProduce> {
    if crate::layout::is_dp_group(layout, members) {
        Some(MustProduce::ScaledGradient)
    } else if crate::layout::is_tp_group(layout, members) {
        Some(MustProduce::ReferenceAtInputScale)
    } else {
        None
    }
}

/// A reduction piece's error: its output `x` against the reference `y` it must reproduce
/// (rows of `row` elements), at the scale its inputs were placed at (`input_scale`) for a
/// partial sum, at each of `dp_scales` for a data-parallel gradient (one is chosen once
/// every reduction was seen).
pub(crate) fn piece_error(
    must: MustProduce,
    (x, y, row): (&[f32], &[f32], usize),
    input_scale: f64,
    dp_scales: &[f64],
) -> PieceError {
    // x / s in f32 inside the error pass, not in a copy per scale.
    let err_at = |s: f64| numerics::shard_error_scaled(x, y, row, s as f32);
    match must {
        MustProduce::ReferenceAtInputScale => PieceError::At(err_at(input_scale)),
        MustProduce::ScaledGradient => {
            PieceError::ByScale(dp_scales.par_iter().map(|&s| (s, err_at(s))).collect())
        }
    }
}

/// What the collectives' comparison reads.
pub(crate) struct Ctx<'a> {
    pub(crate) reff: &'a RunTrace,
    pub(crate) ref_rank: u32,
    pub(crate) run: &'a RunTrace,
    pub(crate) al: &'a Alignment,
    pub(crate) steps: &'a [u64],
    /// Reference GEMMs whose accumulation buffer uncaptured code also wrote
    /// ([`shared_buffers`]).
    pub(crate) shared: &'a BTreeSet<RefOp>,
    pub(crate) eps: f64,
    pub(crate) layout: &'a LayoutSummary,
    /// The scale of data-parallel reductions' outputs, when `--dp-reduction-scale` gave it.
    pub(crate) dp_given: Option<f64>,
}

/// Reference GEMMs whose accumulation buffer was also written by uncaptured code between
/// two accumulations (its C differs from the previous GEMM's D in the same buffer): their
/// final value is not the GEMM's, so reductions of it are not compared with it. Adds those
/// of `step` (`recs`: the reference's records there) to `out`.
pub(crate) fn shared_buffers(step: u64, recs: &[Record], out: &mut BTreeSet<RefOp>) {
    let s = step;
    let mut last: BTreeMap<(u64, u64), u32> = BTreeMap::new();
    let mut shared_ptrs: Vec<(u64, u64)> = Vec::new();
    let mut members: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
    for r in recs {
        let Some(g) = gemm(r) else { continue };
        let Some(d) = r.tensors.iter().find(|t| t.role == Role::D) else {
            continue;
        };
        let key = (d.ptr, d.nbytes);
        members.entry(key).or_default().push(r.seq);
        if accumulates(g) {
            let c = r.tensors.iter().find(|t| t.role == Role::CIn);
            if let (Some(c), Some(prev)) = (c, last.get(&key)) {
                if c.captured && c.crc32 != *prev {
                    shared_ptrs.push(key);
                }
            }
        }
        if d.captured {
            last.insert(key, d.crc32);
        }
    }
    for key in shared_ptrs {
        for seq in members.get(&key).into_iter().flatten() {
            out.insert((s, *seq));
        }
    }
}

/// The send range a reduction's output reads: output element e reads `base + e * size`.
pub(crate) fn reduction_input_range(
    c: &ttrace_format::record::CollectiveOp,
    out: &Tensor,
) -> (u64, u64) {
    let size = out.dtype.size() as u64;
    let base = match c.kind {
        CollectiveKind::ReduceScatter => c.sendbuff + c.comm_rank as u64 * c.count * size,
        _ => c.sendbuff,
    };
    (base, out.nbytes)
}

/// The tensors an op writes: a GEMM's D, a copy's destination, a collective's output.
pub(crate) fn written(r: &Record) -> impl Iterator<Item = &Tensor> {
    r.tensors
        .iter()
        .filter(|t| matches!(t.role, Role::D | Role::Dst | Role::Output))
}

/// The parts of `[base, base + len)` a memset wrote (its rows; the pitch padding between them
/// is not written).
pub(crate) fn memset_parts(m: &MemsetOp, base: u64, len: u64) -> Vec<(u64, u64)> {
    let end = base.saturating_add(len);
    let mut parts = Vec::new();
    if m.bytes() == 0 {
        return parts;
    }
    let (span_lo, span_hi) = m.span();
    if span_hi <= base || span_lo >= end {
        return parts;
    }
    for z in 0..m.depth {
        let slice = m.dst.saturating_add(z.saturating_mul(m.slice_pitch));
        if slice >= end {
            break;
        }
        // Rows before `base` are skipped without visiting them one by one.
        let first = match (base.saturating_sub(slice), m.pitch) {
            (_, 0) | (0, _) => 0,
            (d, p) => (d / p).saturating_sub(1),
        };
        for y in first..m.height {
            let lo = slice.saturating_add(y.saturating_mul(m.pitch));
            if lo >= end {
                break;
            }
            let (a, b) = (lo.max(base), lo.saturating_add(m.width).min(end));
            if a < b {
                parts.push((a, b));
            }
        }
    }
    parts
}

/// The GEMMs whose output is the last write, before `recs[i]`, to each part of
/// `[base, base + len)`: `(record index, lo, hi)`. Every captured op counts as a writer
/// (copies, memsets and collectives included): a part last written by a copy (an allocator
/// that reused the block for a fresh upload) or zeroed by a memset is linked to no GEMM. Only
/// GEMM outputs of `dtype` are linked.
pub(crate) fn last_writers(
    recs: &[Record],
    i: usize,
    base: u64,
    len: u64,
    dtype: DType,
) -> Vec<(usize, u64, u64)> {
    let mut covered: Vec<(u64, u64)> = Vec::new();
    let mut writers: Vec<(usize, u64, u64)> = Vec::new();
    for (j, g) in recs[..i].iter().enumerate().rev() {
        for t in written(g) {
            let (lo, hi) = (t.ptr.max(base), (t.ptr + t.nbytes).min(base + len));
            // The parts no later op wrote.
            for (a, b) in uncovered(&covered, lo, hi) {
                if gemm(g).is_some() && t.role == Role::D && t.dtype == dtype {
                    writers.push((j, a, b));
                }
            }
            if lo < hi {
                covered.push((lo, hi));
            }
        }
        if let Op::Memset(m) = &g.op {
            covered.extend(memset_parts(m, base, len));
        }
    }
    writers
}

/// The parts of `[lo, hi)` outside every interval of `covered`.
pub(crate) fn uncovered(covered: &[(u64, u64)], lo: u64, hi: u64) -> Vec<(u64, u64)> {
    let mut parts: Vec<(u64, u64)> = (lo < hi).then_some((lo, hi)).into_iter().collect();
    for &(a, b) in covered {
        parts = parts
            .into_iter()
            .flat_map(|(x, y)| [(x, y.min(a)), (x.max(b), y)])
            .filter(|(x, y)| x < y)
            .collect();
    }
    parts
}

/// (step, comm, n-th call on the comm, ref op) → the ranks' pieces.
pub(crate) type CallKey = (u64, u64, usize, RefOp);
/// Per rank: (rank, seq, error, where it sits, what it was reduced from).
pub(crate) type Piece = (u32, u64, PieceError, Position, Link);

/// Where a piece's input came from: the GEMM that last wrote it (its seq on the piece's rank
/// and step), the elements of that GEMM's D, and where they start in the reduction's captured
/// input (`None`: the input was not captured).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Link {
    writer: u64,
    d: (usize, usize),
    input_at: Option<usize>,
}

/// Why a reduction's piece is left out ([`linked`]), as the report's "not comparable" says it.
const CHANGED_AFTER_ITS_GEMM: &str = "reduction input changed after the GEMM that wrote it, \
    by an op ttrace does not capture (e.g. the embedding's gradient added to a tied output \
    layer's): not held to that GEMM's reference";

/// Whether the piece's input is, bit for bit, what its GEMM wrote: an op the capture does not
/// see (a kernel: the embedding's gradient added to a tied output layer's) may have changed
/// it in between, and the GEMM's reference is then not what was reduced. Read only for a
/// comparison that diverged (two more tensors decoded); a piece whose input or GEMM output
/// cannot be read keeps its link.
fn linked(ctx: &Ctx, step: u64, piece: &Piece) -> Result<bool, CompareError> {
    let (rank, seq, .., link) = piece;
    let Some(at) = link.input_at else {
        return Ok(true);
    };
    let (Some(coll), Some(gemm)) = (
        ctx.run.record(*rank, step, *seq),
        ctx.run.record(*rank, step, link.writer),
    ) else {
        return Ok(true);
    };
    let (Some(input), Some(d)) = (
        ctx.run.values(&coll, Role::Input)?,
        ctx.run.values(&gemm, Role::D)?,
    ) else {
        return Ok(true);
    };
    let (lo, hi) = link.d;
    Ok(
        match (d.data.get(lo..hi), input.data.get(at..at + (hi - lo))) {
            (Some(a), Some(b)) => a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            _ => true,
        },
    )
}

/// A reduction piece's error against the reference.
pub(crate) enum PieceError {
    /// At the scale of its inputs (partial sums over a non-data-parallel group).
    At(ShardError),
    /// At each scale a data-parallel reduction may be held to; one is chosen once every
    /// reduction was seen ([`gradscale::decide`]).
    ByScale(Vec<(f64, ShardError)>),
}

impl PieceError {
    pub(crate) fn at(&self, scale: f64) -> ShardError {
        match self {
            PieceError::At(e) => *e,
            PieceError::ByScale(v) => v
                .iter()
                .min_by(|a, b| (a.0 - scale).abs().total_cmp(&(b.0 - scale).abs()))
                .map_or_else(unplaced, |e| e.1),
        }
    }
}

/// The reductions of a run compared with the reference GEMM outputs they reduce.
///
/// A reduction over any group but the data-parallel one (tensor-parallel partial sums:
/// row-parallel all-reduce, sequence-parallel reduce-scatter; averages of replicas) must give
/// the reference's unsharded result at the scale its inputs were placed at, whatever its
/// `ncclRedOp_t`: averaging partial sums is the group size times too little, a divergence at
/// that collective. A data-parallel reduction's output scale is decided from the data once
/// every reduction was seen ([`gradscale`]).
pub(crate) struct Reductions<'a> {
    pub(crate) ctx: &'a Ctx<'a>,
    /// Where the walk placed each run GEMM's D, for the steps it is done with.
    pub(crate) d_place: DPlace,
    pub(crate) ref_cache: BTreeMap<RefOp, Values>,
    pub(crate) by_call: BTreeMap<CallKey, Vec<Piece>>,
    /// Data-parallel calls, compared once their scale is decided: with the reference's shape
    /// and type (no values).
    pub(crate) deferred: Vec<(CallKey, Vec<Piece>, Values)>,
    /// What each data-parallel reduction says of the scale.
    pub(crate) evidence: Vec<Evidence>,
    pub(crate) updates: Updates<'a>,
    /// The scales a data-parallel reduction's output may be held to.
    pub(crate) dp_scales: Vec<f64>,
    /// Pieces not compared because the reduction's input there was not what the GEMM wrote
    /// ([`linked`]), said with the tensors the walk could not judge.
    pub(crate) unjudged: Unjudged,
}

impl Reductions<'_> {
    /// Loads the reference GEMM output of `ref_op` once; whether it is there.
    pub(crate) fn load_reference(&mut self, ref_op: RefOp) -> Result<bool, CompareError> {
        if !self.ref_cache.contains_key(&ref_op) {
            let c = self.ctx;
            let Some(rr) = c.reff.record(c.ref_rank, ref_op.0, ref_op.1) else {
                return Ok(false);
            };
            let Some(v) = c.reff.values(&rr, Role::D)? else {
                return Ok(false);
            };
            self.ref_cache.insert(ref_op, v);
        }
        Ok(true)
    }

    /// Starts decoding, on the thread pool, what [`Reductions::reduction`] reads of `rank`'s
    /// reductions in `step` (`recs`): their outputs and the reference GEMM outputs they
    /// reduce (those not read nor `asked` for yet in the step), in record order up to
    /// `budget` bytes of f32. The same values as read one by one: only when they are decoded
    /// changes.
    pub(crate) fn start(
        &self,
        (rank, step, recs): (u32, u64, &[Record]),
        budget: u64,
        asked: &mut BTreeSet<RefOp>,
    ) -> (Decoding, Decoding) {
        let ctx = self.ctx;
        let (mut run_wants, mut ref_wants) = (Vec::new(), Vec::new());
        let mut bytes = 0u64;
        let refs = asked;
        let mut want = |w: &mut Vec<TensorAt>, rec: &Record, role: Role| -> bool {
            let Some((i, t)) = rec
                .tensors
                .iter()
                .enumerate()
                .find(|(_, t)| t.role == role && t.captured)
            else {
                return true;
            };
            bytes += t.elements() * 4;
            if bytes > budget {
                return false;
            }
            w.push((rec.rank, rec.step, rec.seq, i));
            true
        };
        'recs: for (i, r) in recs.iter().enumerate() {
            let Some(c) = collective(r).filter(|c| {
                matches!(
                    c.kind,
                    CollectiveKind::AllReduce | CollectiveKind::ReduceScatter
                )
            }) else {
                continue;
            };
            let Some(out_t) = r.tensors.iter().find(|t| t.role == Role::Output) else {
                continue;
            };
            let members = ctx.run.comm_members(c.comm).unwrap_or_default();
            if must_produce(ctx.layout, &members).is_none() {
                continue;
            }
            let (base, len) = reduction_input_range(c, out_t);
            let writers = last_writers(recs, i, base, len, out_t.dtype);
            if writers.is_empty() {
                continue;
            }
            if !want(&mut run_wants, r, Role::Output) {
                break;
            }
            for (j, _, _) in writers {
                let Some(&ref_op) = ctx.al.of_run.get(&(rank, step, recs[j].seq)) else {
                    continue;
                };
                if self.ref_cache.contains_key(&ref_op) || !refs.insert(ref_op) {
                    continue;
                }
                if let Some(rr) = ctx.reff.record(ctx.ref_rank, ref_op.0, ref_op.1) {
                    if !want(&mut ref_wants, &rr, Role::D) {
                        break 'recs;
                    }
                }
            }
        }
        (
            ctx.run.decode_ahead(&run_wants),
            ctx.reff.decode_ahead(&ref_wants),
        )
    }

    /// The pieces of one reduction `recs[i]` (the n-th on its communicator) of `rank`.
    pub(crate) fn reduction(
        &mut self,
        rank: u32,
        step: u64,
        recs: &[Record],
        i: usize,
        n: usize,
    ) -> Result<(), CompareError> {
        let ctx = self.ctx;
        let r = &recs[i];
        let Some(c) = collective(r) else {
            return Ok(());
        };
        let Some(out_t) = r.tensors.iter().find(|t| t.role == Role::Output) else {
            return Ok(());
        };
        let Some(members) = ctx.run.comm_members(c.comm) else {
            return Ok(());
        };
        let Some(must) = must_produce(ctx.layout, &members) else {
            return Ok(());
        };
        let (base, len) = reduction_input_range(c, out_t);
        let writers = last_writers(recs, i, base, len, out_t.dtype);
        if writers.is_empty() {
            return Ok(());
        }
        let Some(out) = ctx.run.values(r, Role::Output)? else {
            return Ok(());
        };
        // Where the input was captured: each piece's link to its GEMM is checked on it when
        // the comparison diverges ([`linked`]).
        let input_ptr = r
            .tensors
            .iter()
            .find(|t| t.role == Role::Input && t.captured)
            .map(|t| t.ptr);
        // Where the collective sits in the reference's order: after the aligned GEMM that
        // precedes it on this rank.
        let pos = recs[..i]
            .iter()
            .rev()
            .find_map(|g| ctx.al.of_run.get(&(rank, step, g.seq)))
            .map_or((step, 0, 4), |&(s, q)| (s, q, 4 + n as u32));
        let size = out_t.dtype.size() as u64;
        for (j, lo, hi) in writers {
            let g = &recs[j];
            let Some(&ref_op) = ctx.al.of_run.get(&(rank, step, g.seq)) else {
                continue;
            };
            if ctx.shared.contains(&ref_op) {
                continue;
            }
            let placed = (rank, step, g.seq);
            let Some(d) = g.tensors.iter().find(|t| t.role == Role::D) else {
                continue;
            };
            if !self.d_place.contains_key(&placed) || !self.load_reference(ref_op)? {
                continue;
            }
            let Some((place, d_scale)) = self.d_place.get(&placed) else {
                continue;
            };
            let rv = &self.ref_cache[&ref_op];
            let map = place.index_map(&d.shape, &rv.shape);
            let e = (
                ((lo - d.ptr) / size) as usize,
                ((hi - d.ptr) / size) as usize,
            );
            let (o0, o1) = (((lo - base) / size) as usize, ((hi - base) / size) as usize);
            if e.1 > map.len() || o1 > out.data.len() {
                continue;
            }
            let link = Link {
                writer: g.seq,
                d: e,
                input_at: input_ptr
                    .and_then(|p| lo.checked_sub(p))
                    .map(|b| (b / size) as usize),
            };
            let y = map.gather(&rv.data, e.0, e.1);
            let row = d.shape.last().copied().unwrap_or(1) as usize;
            let x = &out.data[o0..o1];
            if must == MustProduce::ScaledGradient {
                // The option decides without the weights: they are not read.
                let update = match ctx.dp_given {
                    Some(_) => gradscale::Update::Unknown,
                    None => self.updates.of(rank, g, ref_op, rv, e, x)?,
                };
                self.evidence.push(Evidence {
                    output: gradscale::ratio(x, &y),
                    update,
                });
            }
            let err = piece_error(must, (x, &y, row), f64::from(*d_scale), &self.dp_scales);
            self.by_call
                .entry((step, c.comm, n, ref_op))
                .or_default()
                .push((rank, r.seq, err, pos, link));
        }
        Ok(())
    }
}

/// Where the walk placed each run GEMM's D: by (rank, step, seq), its placement and scale.
pub(crate) type DPlace = BTreeMap<(u32, u64, u64), (Placement, f32)>;

/// What the walk tells the reductions as it goes ([`collectives`]).
pub(crate) enum Walked {
    /// The walk is done with `step`: where it placed the run GEMMs' outputs of that step and
    /// the tolerance of each reference GEMM's output.
    Step {
        step: u64,
        d_place: DPlace,
        d_tol: BTreeMap<RefOp, f64>,
    },
    /// The walk is done with every step.
    Done,
}

/// What the reductions found: their comparisons (in step order), the scale data-parallel
/// reductions were held to (`None`: none was seen), and the parts they could not judge
/// ([`linked`]).
pub(crate) type Reduced = (Results, Option<gradscale::Decision>, Unjudged);

/// The walk's news, as [`collectives`] receives it.
struct FromWalk {
    rx: std::sync::mpsc::Receiver<Walked>,
    /// The steps it is done with.
    walked: BTreeSet<u64>,
    /// It is done with every step.
    done: bool,
    /// The tolerance of each reference GEMM's output, for the steps it is done with.
    d_tol: BTreeMap<RefOp, f64>,
}

impl FromWalk {
    /// Waits until the walk is done with `step` (or with every step); false when the walk
    /// stopped before (its error is what the comparison reports).
    fn wait_for(&mut self, step: u64, d_place: &mut DPlace) -> bool {
        while !self.done && !self.walked.contains(&step) {
            if !self.receive(d_place) {
                return false;
            }
        }
        true
    }

    /// Waits until the walk is done with every step; false when it stopped before.
    fn wait_for_the_end(&mut self, d_place: &mut DPlace) -> bool {
        while !self.done {
            if !self.receive(d_place) {
                return false;
            }
        }
        true
    }

    /// Takes the walk's next news; false when the walk stopped without saying it was done.
    fn receive(&mut self, d_place: &mut DPlace) -> bool {
        match self.rx.recv() {
            Ok(Walked::Step {
                step,
                d_place: placed,
                d_tol,
            }) => {
                self.walked.insert(step);
                d_place.extend(placed);
                self.d_tol.extend(d_tol);
            }
            Ok(Walked::Done) => self.done = true,
            Err(_) => return false,
        }
        true
    }
}

/// Compares the outputs of the run's reductions with the reference GEMM outputs they reduce,
/// step by step as the walk is done with each (`walk` says so: a step's reductions read
/// where the walk placed that step's GEMM outputs); `None` when the walk stopped before its
/// end. `memory` is the `--memory` budget (reads are decoded ahead within its window share).
/// Runs beside the walk, on readers of the stores of its own ([`RunTrace::reader`]).
pub(crate) fn collectives(
    ctx: &Ctx,
    walk: std::sync::mpsc::Receiver<Walked>,
    memory: u64,
) -> Result<Option<Reduced>, CompareError> {
    let dp = ctx.layout.dp;
    let mut dp_scales: Vec<f64> = gradscale::legal(dp).to_vec();
    dp_scales.extend(ctx.dp_given);
    let mut from_walk = FromWalk {
        rx: walk,
        walked: BTreeSet::new(),
        done: false,
        d_tol: BTreeMap::new(),
    };
    let mut pending = Results::new(crate::results::results_budget(memory));
    let mut red = Reductions {
        ctx,
        d_place: BTreeMap::new(),
        ref_cache: BTreeMap::new(),
        by_call: BTreeMap::new(),
        deferred: Vec::new(),
        evidence: Vec::new(),
        updates: Updates::new(ctx.reff, ctx.ref_rank, ctx.run, ctx.al, ctx.steps),
        dp_scales,
        unjudged: Unjudged::default(),
    };
    // Step by step: the reference GEMM outputs read for one step's reductions are dropped
    // before the next.
    let window = crate::prefetch::window_budget(memory);
    let ranks = ctx.run.ranks();
    for &step in ctx.steps {
        if !from_walk.wait_for(step, &mut red.d_place) {
            return Ok(None);
        }
        let d_tol = &from_walk.d_tol;
        // What a rank reads is decoded while the rank before it is compared.
        let mut asked: BTreeSet<RefOp> = BTreeSet::new();
        let mut next: Option<(Decoding, Decoding)> = None;
        for (k, &rank) in ranks.iter().enumerate() {
            let recs = ctx.run.records(rank, step);
            let (run_ahead, ref_ahead) = next
                .take()
                .unwrap_or_else(|| red.start((rank, step, &recs), window, &mut asked));
            ctx.run.install(run_ahead);
            ctx.reff.install(ref_ahead);
            if let Some(&after) = ranks.get(k + 1) {
                let after_recs = ctx.run.records(after, step);
                next = Some(red.start((after, step, &after_recs), window, &mut asked));
            }
            let mut calls: BTreeMap<u64, usize> = BTreeMap::new();
            for (i, r) in recs.iter().enumerate() {
                let Some(c) = collective(r) else { continue };
                let n = calls.entry(c.comm).and_modify(|n| *n += 1).or_insert(0);
                let n = *n;
                if matches!(
                    c.kind,
                    CollectiveKind::AllReduce | CollectiveKind::ReduceScatter
                ) {
                    red.reduction(rank, step, &recs, i, n)?;
                }
            }
        }
        for (key, pieces) in std::mem::take(&mut red.by_call) {
            let Some(rv) = red.ref_cache.get(&key.3) else {
                continue;
            };
            if matches!(pieces.first(), Some((_, _, PieceError::ByScale(_), _, _))) {
                let shape_only = Values {
                    shape: rv.shape.clone(),
                    data: Default::default(),
                    dtype: rv.dtype,
                };
                red.deferred.push((key, pieces, shape_only));
            } else {
                reduction_compared(
                    ctx,
                    key,
                    &pieces,
                    rv,
                    1.0,
                    d_tol,
                    (&mut pending, &mut red.unjudged),
                )?;
            }
        }
        red.ref_cache.clear();
        // Where the walk placed this step's outputs is read by this step's reductions only.
        red.d_place.retain(|&(_, s, _), _| s != step);
    }
    // A walk that stopped early is not taken for a whole one.
    if !from_walk.wait_for_the_end(&mut red.d_place) {
        return Ok(None);
    }
    if red.deferred.is_empty() && red.evidence.is_empty() {
        ctx.run.release_decoded();
        ctx.reff.release_decoded();
        return Ok(Some((pending, None, red.unjudged)));
    }
    let decision = gradscale::decide(&red.evidence, dp, ctx.dp_given);
    for (key, pieces, rv) in std::mem::take(&mut red.deferred) {
        reduction_compared(
            ctx,
            key,
            &pieces,
            &rv,
            decision.scale,
            &from_walk.d_tol,
            (&mut pending, &mut red.unjudged),
        )?;
    }
    ctx.run.release_decoded();
    ctx.reff.release_decoded();
    Ok(Some((pending, Some(decision), red.unjudged)))
}

/// Records the comparison of one reduction call (its pieces' errors at `scale` where a
/// data-parallel reduction's were kept at every scale).
pub(crate) fn reduction_compared(
    ctx: &Ctx,
    (step, _comm, _n, ref_op): CallKey,
    pieces: &[Piece],
    rv: &Values,
    scale: f64,
    d_tol: &BTreeMap<RefOp, f64>,
    (pending, unjudged): (&mut Results, &mut Unjudged),
) -> Result<(), CompareError> {
    let Some(rr) = ctx.reff.record(ctx.ref_rank, ref_op.0, ref_op.1) else {
        return Ok(());
    };
    let rr = &*rr;
    let compared =
        |pieces: &[&Piece]| -> Option<(Vec<Shard>, crate::report::TensorComparison, Position)> {
            let run_rec = pieces
                .first()
                .and_then(|p| ctx.run.record(p.0, step, p.1))?;
            let key = pieces
                .iter()
                .map(|s| s.3)
                .min()
                .unwrap_or((step, ref_op.1, 4));
            let results: Vec<Shard> = pieces
                .iter()
                .map(|s| Shard {
                    rank: s.0,
                    seq: s.1,
                    err: s.2.at(scale),
                })
                .collect();
            let mut cmp = comparison(
                &run_rec,
                Role::Output,
                rv,
                &results,
                Merge::Replicated,
                ctx.eps,
                tolerance::reduced(d_tol.get(&ref_op).copied()),
                step,
                ref_op.1,
            );
            cmp.nvtx = nvtx_path(&run_rec).or_else(|| nvtx_path(rr));
            Some((results, cmp, key))
        };
    let all: Vec<&Piece> = pieces.iter().collect();
    let Some(mut done) = compared(&all) else {
        return Ok(());
    };
    if done.1.diverged {
        // Before a divergence is said: were the pieces reduced from what their GEMMs wrote?
        let mut kept = Vec::with_capacity(all.len());
        for p in all.iter().copied() {
            if linked(ctx, step, p)? {
                kept.push(p);
            } else {
                if let Some(rec) = ctx.run.record(p.0, step, p.1) {
                    unjudged.note(CHANGED_AFTER_ITS_GEMM, &rec);
                }
            }
        }
        if kept.len() < all.len() {
            match compared(&kept) {
                Some(again) => done = again,
                None => return Ok(()),
            }
        }
    }
    let (results, cmp, key) = done;
    pending.push(Pending {
        key,
        shards: results.iter().map(|s| (s.rank, s.seq)).collect(),
        cmp,
        ref_op,
        is_collective: true,
        param_note: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ttrace_format::record::{CollectiveOp, GemmOp};

    fn tensor(role: Role, ptr: u64, nbytes: u64) -> Tensor {
        Tensor {
            role,
            dtype: DType::F32,
            shape: vec![nbytes / 4],
            strides: vec![1],
            ptr,
            nbytes,
            captured: true,
            crc32: 0,
        }
    }

    /// A copy (an upload) writing `[ptr, ptr + nbytes)`.
    fn copy_writing(seq: u64, ptr: u64, nbytes: u64) -> Record {
        let mut r = Record::d2h_copy(0, 0, seq, &[]);
        r.tensors = vec![tensor(Role::Dst, ptr, nbytes)];
        r
    }

    fn gemm_writing(seq: u64, ptr: u64, nbytes: u64) -> Record {
        let mut r = Record::d2h_copy(0, 0, seq, &[]);
        r.api = "cublasGemmEx".into();
        r.op = Op::Gemm(Box::new(GemmOp::plain(4, nbytes / 16, 4, 0)));
        r.tensors = vec![tensor(Role::D, ptr, nbytes)];
        r
    }

    fn news(sent: Vec<Walked>) -> FromWalk {
        let (tx, rx) = std::sync::mpsc::channel();
        for n in sent {
            tx.send(n).expect("open");
        }
        FromWalk {
            rx,
            walked: BTreeSet::new(),
            done: false,
            d_tol: BTreeMap::new(),
        }
    }

    fn step(step: u64, seq: u64) -> Walked {
        Walked::Step {
            step,
            d_place: [((0, step, seq), (Placement::whole(1), 1.0))].into(),
            d_tol: [((step, seq), 2.0)].into(),
        }
    }

    #[test]
    fn a_step_s_reductions_wait_for_the_walk_to_be_done_with_it_and_not_for_a_walk_that_stopped() {
        let mut d_place = DPlace::new();
        // The walk did steps 0 and 2, then stopped (an error): step 0 and 2 are known, what
        // comes after is not, and the end is never taken for reached.
        let mut w = news(vec![step(0, 5), step(2, 7)]);
        assert!(w.wait_for(0, &mut d_place));
        assert!(d_place.contains_key(&(0, 0, 5)) && w.d_tol.get(&(0, 5)) == Some(&2.0));
        assert!(
            !d_place.contains_key(&(0, 2, 7)),
            "step 2 not read before it is needed"
        );
        assert!(w.wait_for(2, &mut d_place));
        assert!(d_place.contains_key(&(0, 2, 7)));
        assert!(
            !w.wait_for(3, &mut d_place),
            "the walk stopped before step 3"
        );
        assert!(!news(vec![step(0, 5)]).wait_for_the_end(&mut d_place));
        // A step the walk had no op in is waited for until the walk is done.
        let mut w = news(vec![step(0, 5), Walked::Done]);
        assert!(w.wait_for(1, &mut d_place) && w.wait_for_the_end(&mut d_place));
    }

    #[test]
    fn the_last_writer_of_a_buffer_may_be_a_copy() {
        let copy = copy_writing(2, 0x1000, 64);
        // A GEMM wrote the block, then an upload reused it: the reduction reads the upload.
        let recs = vec![
            gemm_writing(0, 0x1000, 256),
            copy,
            gemm_writing(3, 0x2000, 64),
        ];
        assert!(last_writers(&recs, 3, 0x1000, 64, DType::F32).is_empty());
        // The part the copy did not overwrite is still the GEMM's.
        let w = last_writers(&recs, 3, 0x1000, 128, DType::F32);
        assert_eq!(w, vec![(0, 0x1040, 0x1080)]);
        // A later GEMM writing the whole range is the writer.
        let w = last_writers(&recs, 3, 0x2000, 64, DType::F32);
        assert_eq!(w, vec![(2, 0x2000, 0x2040)]);
    }

    fn memset_writing(seq: u64, dst: u64, width: u64, height: u64, pitch: u64) -> Record {
        let mut r = Record::d2h_copy(0, 0, seq, &[]);
        r.api = "cudaMemset2DAsync".into();
        r.op = Op::Memset(MemsetOp {
            dst,
            value: 0,
            width,
            height,
            depth: 1,
            pitch,
            slice_pitch: pitch * height,
        });
        r.tensors = Vec::new();
        r
    }

    #[test]
    fn a_buffer_zeroed_by_a_memset_is_not_linked_to_the_gemm_that_wrote_it_before() {
        // A GEMM wrote 0x1000..0x1100, then the buffer was zeroed (two 32-byte rows, pitch
        // 64): the reduction reads the zeros, except for the padding the memset left alone.
        let recs = vec![
            gemm_writing(0, 0x1000, 256),
            memset_writing(1, 0x1000, 32, 2, 64),
            gemm_writing(2, 0x2000, 64),
        ];
        let w = last_writers(&recs, 3, 0x1000, 128, DType::F32);
        assert_eq!(w, vec![(0, 0x1020, 0x1040), (0, 0x1060, 0x1080)]);
        let whole = vec![
            gemm_writing(0, 0x1000, 256),
            memset_writing(1, 0x1000, 256, 1, 256),
        ];
        assert!(last_writers(&whole, 2, 0x1000, 256, DType::F32).is_empty());
    }

    #[test]
    fn a_memsets_parts_are_its_rows_clipped_to_the_range() {
        let m = MemsetOp {
            dst: 1000,
            value: 7,
            width: 10,
            height: 3,
            depth: 2,
            pitch: 16,
            slice_pitch: 100,
        };
        assert_eq!(
            memset_parts(&m, 0, 2000),
            vec![
                (1000, 1010),
                (1016, 1026),
                (1032, 1042),
                (1100, 1110),
                (1116, 1126),
                (1132, 1142)
            ]
        );
        assert_eq!(
            memset_parts(&m, 1020, 100),
            vec![(1020, 1026), (1032, 1042), (1100, 1110), (1116, 1120)]
        );
        assert!(memset_parts(&m, 1200, 10).is_empty());
    }

    #[test]
    fn a_data_parallel_piece_is_judged_at_the_decided_scale() {
        let err = |rel: f64| ShardError {
            rel,
            norm_ratio: 1.0,
            ref_sq: 1.0,
            worst_row: None,
        };
        let p = PieceError::ByScale(vec![(1.0, err(0.5)), (2.0, err(0.0)), (0.5, err(1.5))]);
        assert_eq!(p.at(2.0).rel, 0.0);
        assert_eq!(p.at(0.5).rel, 1.5);
        // A partial sum keeps the scale of its inputs, whatever is decided for DP.
        assert_eq!(PieceError::At(err(0.25)).at(2.0).rel, 0.25);
    }

    /// tp2 dp2 pp1, tensor-parallel fastest: tp groups {0,1} {2,3}, dp groups {0,2} {1,3}.
    fn tp2_dp2() -> LayoutSummary {
        crate::layout::parse("tp=2,dp=2").expect("a layout")
    }

    #[test]
    fn a_tensor_parallel_reduction_must_reproduce_the_reference_and_a_data_parallel_one_a_scaled_gradient(
    ) {
        let l = tp2_dp2();
        assert_eq!(
            must_produce(&l, &[0, 1]),
            Some(MustProduce::ReferenceAtInputScale)
        );
        assert_eq!(must_produce(&l, &[1, 3]), Some(MustProduce::ScaledGradient));
        // Ranks differing in both coordinates (tied weights across stages, a world
        // communicator) have no reference meaning.
        assert_eq!(must_produce(&l, &[0, 3]), None);
        assert_eq!(must_produce(&l, &[0, 1, 2, 3]), None);
    }

    #[test]
    fn a_row_parallel_partial_sum_must_reproduce_the_reference_at_scale_one() {
        let reference = [1.0f32, -2.0, 3.0, 4.0];
        let dp_scales = [1.0, 2.0, 0.5];
        let summed = piece_error(
            MustProduce::ReferenceAtInputScale,
            (&reference, &reference, 2),
            1.0,
            &dp_scales,
        );
        assert!(summed.at(2.0).rel < 1e-12);
        // ncclAvg over two ranks: half the sum, whatever scale data parallelism decides.
        let averaged: Vec<f32> = reference.iter().map(|v| v / 2.0).collect();
        let e = piece_error(
            MustProduce::ReferenceAtInputScale,
            (&averaged, &reference, 2),
            1.0,
            &dp_scales,
        );
        assert!(
            (e.at(0.5).rel - 0.5).abs() < 1e-6,
            "an average is half the sum"
        );
        assert!((e.at(2.0).rel - 0.5).abs() < 1e-6);
    }

    #[test]
    fn a_data_parallel_gradient_is_judged_at_every_legal_scale_until_one_is_decided() {
        let reference = [1.0f32, -2.0, 3.0, 4.0];
        let summed_over_two: Vec<f32> = reference.iter().map(|v| v * 2.0).collect();
        let e = piece_error(
            MustProduce::ScaledGradient,
            (&summed_over_two, &reference, 4),
            1.0,
            &[1.0, 2.0, 0.5],
        );
        assert!(
            e.at(2.0).rel < 1e-12,
            "a sum of mean-loss gradients at scale 2"
        );
        assert!(e.at(1.0).rel > 0.9, "at scale 1 it is twice the reference");
    }

    #[test]
    fn a_gradient_judged_at_a_scale_gives_the_numbers_of_a_copy_divided_by_it() {
        // The error pass divides as it reads: the same bits as a copy divided first, at a
        // scale whose inverse is inexact (3) and at a power of two (multiplied by its inverse).
        let x: Vec<f32> = (0..37)
            .map(|i| (i as f32 * 0.37 - 5.0).sin() * 7.0)
            .collect();
        let y: Vec<f32> = x.iter().map(|v| v / 3.0 + 1e-3).collect();
        let e = piece_error(MustProduce::ScaledGradient, (&x, &y, 5), 1.0, &[3.0, 4.0]);
        for s in [3.0f32, 4.0] {
            let divided: Vec<f32> = x.iter().map(|v| v / s).collect();
            let want = numerics::shard_error(&divided, &y, 5);
            let got = e.at(f64::from(s));
            assert_eq!(got.rel.to_bits(), want.rel.to_bits(), "scale {s}");
            assert_eq!(
                got.norm_ratio.to_bits(),
                want.norm_ratio.to_bits(),
                "scale {s}"
            );
        }
    }

    #[test]
    fn a_reduce_scatter_reads_its_own_block_of_the_send_buffer() {
        let out = tensor(Role::Output, 0x9000, 64);
        let mut c = CollectiveOp {
            kind: CollectiveKind::ReduceScatter,
            count: 16,
            nccl_type: cuda_abi::nccl::ncclFloat32,
            redop: Some(cuda_abi::nccl::ncclSum),
            root_or_peer: None,
            comm: 1,
            comm_rank: 1,
            comm_size: 2,
            sendbuff: 0x1000,
            recvbuff: 0x9000,
            group: 0,
            premul: None,
        };
        assert_eq!(reduction_input_range(&c, &out), (0x1000 + 64, 64));
        c.kind = CollectiveKind::AllReduce;
        assert_eq!(reduction_input_range(&c, &out), (0x1000, 64));
    }
}
