//! `ttrace compare`: align, place shards, measure, tolerate, localize.
//!
//! Every reference GEMM with counterparts in the run is compared tensor by tensor (inputs A,
//! B, C, then the output D), in the reference's execution order: forward, backward and
//! optimizer, micro-batch after micro-batch, step after step. Collectives have no
//! counterpart in a single-device run, so a reduction's output is compared with the reference
//! GEMM output it reduces (found by dataflow: the GEMM whose output buffer the collective
//! reads, the latest one to write it). The first tensor beyond its tolerance is the verdict.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Instant;

use ttrace_format::dtype::DType;
use ttrace_format::record::{CollectiveKind, Record, Role, Tensor};

use crate::align::{self, Alignment, RefOp};
use crate::gradscale::{self, updates::Updates, Evidence};
use crate::numerics::{self, Placement, ShardError};
use crate::report::{
    Cause, CompareReport, CompareStats, Divergence, LayoutSummary, RankError, RunSummary,
    TensorComparison, Verdict, WorstRow,
};
use crate::tolerance::{self, Precision};
use crate::trace::{collective, gemm, RunTrace, Values};
use crate::CompareError;

/// What to compare.
#[derive(Debug, Clone, Default)]
pub struct CompareOptions {
    /// Steps to compare, as inclusive ranges (`None`: every step both runs have).
    pub steps: Option<Vec<(u64, u64)>>,
    /// The layout, when the user gave it (otherwise discovered).
    pub layout: Option<LayoutSummary>,
    /// A perturbed reference run (`ttrace run --perturb`), for tolerances.
    pub perturbed: Option<std::path::PathBuf>,
    /// What a data-parallel gradient reduction's output must be, relative to the reference's
    /// gradient (`None`: decided from the data, [`crate::gradscale`]; see [`DpScale`]).
    pub dp_reduction_scale: Option<DpScale>,
    /// The memory budget in bytes (`None`: [`DEFAULT_MEMORY`]); see [`mapping_budgets`].
    pub memory: Option<u64>,
}

/// The default memory budget of a comparison: 1 GiB.
pub const DEFAULT_MEMORY: u64 = 1 << 30;

/// How a memory budget is shared: half for open (mapped) segments, of which the run's
/// store (every rank) gets half and the reference and the perturbed reference a quarter
/// each; the other half for the tensors being compared (decoded to f32) and the report.
/// Returns (reference, run, perturbed) segment budgets.
pub fn mapping_budgets(memory: u64) -> (u64, u64, u64) {
    let segments = memory / 2;
    (segments / 4, segments / 2, segments / 4)
}

/// The expected scale of a data-parallel gradient reduction's output, given by the user
/// (`--dp-reduction-scale`) instead of decided from the data ([`crate::gradscale`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum DpScale {
    /// A fixed factor.
    Factor(f32),
    /// The data-parallel size (a sum of mean-loss gradients, divided afterwards).
    Dp,
    /// One over the data-parallel size (an average of sum-loss gradients).
    InverseDp,
}

impl DpScale {
    /// Parses `1`, `0.5`, `dp` or `1/dp`.
    pub fn parse(s: &str) -> Result<DpScale, String> {
        match s.trim() {
            "dp" => Ok(DpScale::Dp),
            "1/dp" => Ok(DpScale::InverseDp),
            t => t
                .parse::<f32>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .map(DpScale::Factor)
                .ok_or_else(|| format!("`{s}`: expected a positive number, `dp` or `1/dp`")),
        }
    }

    /// The factor for a data-parallel size.
    pub fn factor(self, dp: u32) -> f32 {
        match self {
            DpScale::Factor(f) => f,
            DpScale::Dp => dp as f32,
            DpScale::InverseDp => 1.0 / dp.max(1) as f32,
        }
    }
}

/// One shard's comparison.
struct Shard {
    rank: u32,
    seq: u64,
    err: ShardError,
}

/// The largest relative error at which a remembered placement is taken without a search:
/// well below what a wrong slice gives (O(1)), above what rounding to the tensor's own type
/// gives (FP8 differs by a good fraction of its epsilon).
fn hint_accept(d: DType) -> f64 {
    (0.5 * tolerance::epsilon(d)).max(0.02)
}

/// What distinguishes GEMMs of one shape that read their operands differently (attention's
/// QK^T and PV, data and weight gradients): API, transposes, leading dimensions.
fn kind_of(rec: &Record) -> String {
    match gemm(rec) {
        Some(g) => format!(
            "{} {}{} {} {} {} {} {}",
            rec.api, g.transa, g.transb, g.lda, g.ldb, g.ldd, g.stride_a, g.stride_b
        ),
        None => rec.api.clone(),
    }
}

/// A kind of tensor on a rank: (rank, role slot, shard shape, reference shape, kind).
type HintKey = (u32, usize, Vec<u64>, Vec<u64>, String);

/// A shard not placed yet (its error is unknown).
fn unplaced() -> ShardError {
    ShardError {
        rel: f64::INFINITY,
        norm_ratio: 1.0,
        ref_sq: 0.0,
        worst_row: None,
    }
}

/// Placements that fitted a group sum before, by (communicator, shard shape, reference shape).
/// (communicator, first rank of the group, shard shape, reference shape, kind): each group
/// sits at its own slice.
type SumHints = BTreeMap<(u64, u32, Vec<u64>, Vec<u64>, String), Vec<(Placement, f32)>>;

/// Keeps the last few distinct placements that fitted (several ops share a key).
fn remember(known: &mut Vec<(Placement, f32)>, f: &numerics::Fit) {
    if let Some(i) = known
        .iter()
        .position(|(p, s)| *p == f.placement && *s == f.scale)
    {
        let k = known.remove(i);
        known.insert(0, k);
    } else {
        known.insert(0, (f.placement.clone(), f.scale));
        known.truncate(4);
    }
}

/// Where a shard went: its placement and the scale it was divided by.
type Placed = (u32, u64, Placement, f32);

/// Sort key of a comparison in execution order: (step, reference seq, sub-order).
pub(crate) type Position = (u64, u64, u32);

struct Pending {
    key: Position,
    cmp: TensorComparison,
    /// For localization: the run records (rank, step, seq) behind each shard.
    shards: Vec<(u32, u64)>,
    ref_op: RefOp,
    is_collective: bool,
    /// The op was called with other scalars than the reference's.
    param_note: Option<String>,
}

impl Pending {
    /// What a partial report keeps of a comparison besides the comparison itself.
    fn entry(&self) -> crate::partition::PendingEntry {
        crate::partition::PendingEntry {
            key: self.key,
            shards: self.shards.clone(),
            ref_op: self.ref_op,
            is_collective: self.is_collective,
            param_note: self.param_note.clone(),
        }
    }

    /// A comparison read back from a partial report.
    fn from_entry(cmp: TensorComparison, e: crate::partition::PendingEntry) -> Pending {
        Pending {
            key: e.key,
            cmp,
            shards: e.shards,
            ref_op: e.ref_op,
            is_collective: e.is_collective,
            param_note: e.param_note,
        }
    }
}

/// Whether a GEMM accumulates into its output (beta != 0).
fn accumulates(g: &ttrace_format::record::GemmOp) -> bool {
    g.beta.is_some_and(|b| b != 0.0)
}

/// Whether two GEMMs' alpha/beta differ (beyond the rounding of the scale type).
fn params_differ(a: &ttrace_format::record::GemmOp, b: &ttrace_format::record::GemmOp) -> bool {
    let differ = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) => (x - y).abs() > 1e-6 * x.abs().max(y.abs()),
        _ => false,
    };
    differ(a.alpha, b.alpha) || differ(a.beta, b.beta)
}

fn show_scalar(v: Option<f64>) -> String {
    v.map_or_else(|| "(device)".into(), |v| format!("{v}"))
}

/// A GEMM's tensor for comparison: `D` of an accumulating GEMM is its increment `D - beta*C`
/// (C is a partial accumulation whose content depends on how buffers are shared, e.g. tied
/// weights or gradient buckets, which differ between a single device and a pipeline). With
/// it, `‖beta*C‖ / ‖D - beta*C‖`: how many digits the subtraction cancelled (0 otherwise).
fn operand(t: &RunTrace, rec: &Record, role: Role) -> Result<Option<(Values, f64)>, CompareError> {
    let Some(mut v) = t.values(rec, role)? else {
        return Ok(None);
    };
    let mut cancelled = 0.0;
    if role == Role::D {
        if let Some(g) = gemm(rec).filter(|g| accumulates(g)) {
            let beta = g.beta.unwrap_or(0.0) as f32;
            if let Some(c) = t.values(rec, Role::CIn)? {
                if c.data.len() == v.data.len() {
                    let (mut nc, mut ni) = (0f64, 0f64);
                    for (d, c) in v.data.iter_mut().zip(&c.data) {
                        let bc = beta * c;
                        *d -= bc;
                        nc += (bc as f64).powi(2);
                        ni += (*d as f64).powi(2);
                    }
                    if ni > 0.0 {
                        cancelled = (nc / ni).sqrt();
                    }
                }
            }
        }
    }
    Ok(Some((v, cancelled)))
}

/// Whether `rec` accumulates into its output (beta != 0) while its C was not captured
/// (`ttrace run --no-inputs`): its increment `D - beta*C` cannot be formed.
fn increment_unknown(rec: &Record) -> bool {
    gemm(rec).is_some_and(accumulates)
        && !rec
            .tensors
            .iter()
            .any(|t| t.role == Role::CIn && t.captured)
}

/// Whether a communicator `rank` belongs to (by the manifest's map) has members the store
/// holds no records of in `step`.
fn partners_missing(run: &RunTrace, rank: u32, step: u64) -> bool {
    run.manifest.comms.iter().any(|c| {
        c.size > 1
            && c.members.contains(&Some(rank))
            && c.members
                .iter()
                .any(|m| m.is_none_or(|m| run.records(m, step).is_empty()))
    })
}

/// What could not be judged, by reason: how many tensors and the first op.
#[derive(Default)]
struct Unjudged(BTreeMap<&'static str, (u64, String)>);

impl Unjudged {
    fn note(&mut self, reason: &'static str, rec: &Record) {
        let e = self.0.entry(reason).or_insert_with(|| (0, describe(rec)));
        e.0 += 1;
    }

    fn into_report(self) -> Vec<crate::report::NotComparable> {
        self.0
            .into_iter()
            .map(|(reason, (tensors, first))| crate::report::NotComparable {
                reason: reason.to_string(),
                tensors,
                first,
            })
            .collect()
    }
}

/// Reference GEMMs whose accumulation buffer was also written by uncaptured code between
/// two accumulations (its C differs from the previous GEMM's D in the same buffer): their
/// final value is not the GEMM's, so reductions of it are not compared with it.
fn shared_buffers(reff: &RunTrace, rank: u32, steps: &[u64]) -> std::collections::BTreeSet<RefOp> {
    let mut out = std::collections::BTreeSet::new();
    for &s in steps {
        let mut last: BTreeMap<(u64, u64), u32> = BTreeMap::new();
        let mut shared_ptrs: Vec<(u64, u64)> = Vec::new();
        let mut members: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
        for r in reff.records(rank, s) {
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
    out
}

/// Compares `run` against the reference `reff`.
pub fn compare(
    reff_path: &Path,
    run_path: &Path,
    opts: &CompareOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<CompareReport, CompareError> {
    let started = Instant::now();
    let p = prepare(reff_path, run_path, opts)?;
    let walked = walk_steps(&p, opts, &p.steps, progress)?;
    if walked.pending.is_empty() {
        return Err(nothing_aligned(&p, reff_path, run_path));
    }
    let bytes = bytes_read(&p);
    let mut warnings = walked.base_warnings;
    warnings.extend(walked.warnings);
    finish(
        &p,
        &p.steps,
        Found {
            pending: walked.pending,
            warnings,
            not_comparable: walked.unjudged.into_report(),
            eps: walked.eps,
            dp_reduction: walked.dp_reduction,
        },
        (bytes, started.elapsed().as_secs_f64()),
    )
}

/// Compares the share of the steps that partition `part` of a `--partition I/N` split owns
/// ([`crate::partition::assign`]) and returns a partial report that
/// [`crate::partition::merge`] joins with the others into the whole run's report.
pub fn compare_partition(
    reff_path: &Path,
    run_path: &Path,
    opts: &CompareOptions,
    part: crate::partition::Partition,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<crate::partition::PartialReport, CompareError> {
    let started = Instant::now();
    let p = prepare(reff_path, run_path, opts)?;
    let weights: Vec<(u64, u64)> = p.steps.iter().map(|&s| (s, step_weight(&p, s))).collect();
    let units: Vec<crate::partition::Unit> = weights
        .iter()
        .zip(crate::partition::assign(&weights, part.count))
        .map(|(&(step, bytes), partition)| crate::partition::Unit {
            step,
            bytes,
            partition,
        })
        .collect();
    let mine: Vec<u64> = units
        .iter()
        .filter(|u| u.partition == part.index)
        .map(|u| u.step)
        .collect();
    let walked = walk_steps(&p, opts, &mine, progress)?;
    let mut pending = walked.pending;
    pending.sort_by_key(|p| p.key);
    let entries: Vec<crate::partition::PendingEntry> = pending.iter().map(Pending::entry).collect();
    let mut warnings = walked.base_warnings;
    warnings.extend(walked.warnings.iter().cloned());
    let report = finish(
        &p,
        &mine,
        Found {
            pending,
            warnings,
            not_comparable: walked.unjudged.into_report(),
            eps: walked.eps,
            dp_reduction: walked.dp_reduction,
        },
        (bytes_read(&p), started.elapsed().as_secs_f64()),
    )?;
    Ok(crate::partition::PartialReport {
        report,
        partition: crate::partition::Partial::new(
            part,
            units,
            mine,
            crate::partition::PartialOptions::of(reff_path, run_path, opts),
            entries,
            walked.warnings,
        ),
    })
}

/// Joins the comparisons of partial reports (checked against each other by
/// [`crate::partition::merge`]) into the report of the whole run: the stores' metadata are
/// read again to order, localize and look for replica drift exactly as one run does.
pub(crate) fn merged(
    reff_path: &Path,
    run_path: &Path,
    opts: &CompareOptions,
    parts: Vec<crate::partition::PartialReport>,
) -> Result<CompareReport, CompareError> {
    let started = Instant::now();
    let p = prepare(reff_path, run_path, opts)?;
    let base = Walk::new(&p).warnings;
    let mut found = Found {
        pending: Vec::new(),
        warnings: base,
        not_comparable: Vec::new(),
        eps: p.precision.epsilon(),
        dp_reduction: None,
    };
    let mut bytes = 0u64;
    let mut elapsed = 0f64;
    for part in parts {
        bytes += part.report.stats.bytes_compared;
        elapsed += part.report.stats.elapsed_s;
        found.eps = part.report.epsilon;
        // Each partition decided from its own steps. Its reductions were judged at that
        // scale, so partitions that decided differently cannot be joined into one verdict.
        match (&found.dp_reduction, &part.report.dp_reduction) {
            (None, Some(d)) => found.dp_reduction = Some(d.clone()),
            (Some(a), Some(b)) if (a.scale - b.scale).abs() > 1e-6 * a.scale.abs().max(1.0) => {
                return Err(CompareError::Invalid(format!(
                    "partition {} decided data-parallel reductions at scale {} ({}), an \
                     earlier one at {} ({}): run every partition with --dp-reduction-scale",
                    part.partition.index, b.scale, b.detail, a.scale, a.detail
                )));
            }
            _ => {}
        }
        for (cmp, e) in part.report.tensors.into_iter().zip(part.partition.pending) {
            found.pending.push(Pending::from_entry(cmp, e));
        }
        found.warnings.extend(part.partition.walk_warnings);
        for nc in part.report.not_comparable {
            match found
                .not_comparable
                .iter_mut()
                .find(|n| n.reason == nc.reason)
            {
                // The first one in run order stays: partitions come in step order.
                Some(n) => n.tensors += nc.tensors,
                None => found.not_comparable.push(nc),
            }
        }
    }
    found.not_comparable.sort_by(|a, b| a.reason.cmp(&b.reason));
    if found.pending.is_empty() {
        return Err(nothing_aligned(&p, reff_path, run_path));
    }
    finish(
        &p,
        &p.steps,
        found,
        (bytes, elapsed + started.elapsed().as_secs_f64()),
    )
}

/// The error when no tensor could be compared.
fn nothing_aligned(p: &Prepared, reff_path: &Path, run_path: &Path) -> CompareError {
    CompareError::NothingAligned(format!(
        "no GEMM of {} could be aligned with one of {} ({} unaligned): are they the same \
         model, data and steps?",
        run_path.display(),
        reff_path.display(),
        p.al.unaligned,
    ))
}

/// Bytes read from the stores so far.
fn bytes_read(p: &Prepared) -> u64 {
    p.reff.bytes_read() + p.run.bytes_read() + p.pert.as_ref().map_or(0, |p| p.bytes_read())
}

/// How much work a step is, for splitting the steps among partitions: the bytes of the
/// tensors its records hold in the reference and in the run (from the stores' metadata).
fn step_weight(p: &Prepared, step: u64) -> u64 {
    let bytes = |t: &RunTrace, rank: u32| -> u64 {
        t.records(rank, step)
            .iter()
            .flat_map(|r| r.tensors.iter())
            .map(|t| t.nbytes)
            .sum()
    };
    let run: u64 = p.run.ranks().into_iter().map(|r| bytes(&p.run, r)).sum();
    run + bytes(&p.reff, p.ref_rank)
}

/// What a walk over some steps found.
struct Walked {
    pending: Vec<Pending>,
    /// Warnings of the whole comparison (alignment, missing ranks, unreadable records).
    base_warnings: Vec<String>,
    /// Warnings of the tensors compared.
    warnings: Vec<String>,
    unjudged: Unjudged,
    eps: f64,
    /// The scale data-parallel reductions were held to (`None`: none was seen).
    dp_reduction: Option<gradscale::Decision>,
}

/// Compares the tensors of `steps` (a subset of `p.steps`, in order). Each step is judged on
/// its own ([`Memory::start_step`]): a step's verdict is the same whether it is compared
/// alone (a partition) or after the others (a whole run).
fn walk_steps(
    p: &Prepared,
    opts: &CompareOptions,
    steps: &[u64],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Walked, CompareError> {
    // Segments are closed as the comparison moves on: memory is independent of the number
    // of steps and ranks.
    let (ref_budget, run_budget, pert_budget) =
        mapping_budgets(opts.memory.unwrap_or(DEFAULT_MEMORY));
    p.reff.set_mapping_budget(ref_budget);
    p.run.set_mapping_budget(run_budget);
    if let Some(pt) = &p.pert {
        pt.set_mapping_budget(pert_budget);
    }
    let mut walk = Walk::new(p);
    let base_warnings = std::mem::take(&mut walk.warnings);
    let ops: Vec<(&RefOp, &Vec<(u32, u64)>)> =
        p.al.of_ref
            .iter()
            .filter(|(op, _)| steps.contains(&op.0))
            .collect();
    let total_ops = ops.len() as u64;
    let ref_ordinal = gemm_ordinals(&p.reff, p.ref_rank, steps);
    let mut current = None;
    // Tensors are decoded ahead, a window of ops at a time, on every core.
    let ahead = crate::prefetch::Walked {
        reff: &p.reff,
        ref_rank: p.ref_rank,
        run: &p.run,
        pert: p.pert.as_ref(),
    };
    let plan: Vec<(RefOp, &[(u32, u64)])> = ops.iter().map(|(o, s)| (**o, s.as_slice())).collect();
    let window = crate::prefetch::window_budget(opts.memory.unwrap_or(DEFAULT_MEMORY));
    let mut fetched = 0;
    for (done, (&ref_op, shards)) in ops.into_iter().enumerate() {
        if done == fetched {
            fetched = done + ahead.prefetch(&plan[done..], window);
        }
        progress(done as u64, total_ops);
        if current != Some(ref_op.0) {
            // A step is judged from that step alone (see [`Memory`]).
            current = Some(ref_op.0);
            walk.mem.start_step();
            walk.settled = false;
        }
        let depth = ref_ordinal.get(&ref_op).copied().unwrap_or(0);
        walk.op(ref_op, shards, depth)?;
    }
    progress(total_ops, total_ops);
    ahead.release();
    let ctx = Ctx {
        steps,
        ..Ctx::new(p, opts)
    };
    let dp_reduction = collectives(&ctx, &walk.d_place, &walk.d_tol, &mut walk.pending)?;
    Ok(Walked {
        pending: walk.pending,
        base_warnings,
        warnings: walk.warnings,
        unjudged: walk.unjudged,
        eps: walk.eps,
        dp_reduction,
    })
}

/// What the collectives' comparison reads.
struct Ctx<'a> {
    reff: &'a RunTrace,
    ref_rank: u32,
    run: &'a RunTrace,
    al: &'a Alignment,
    steps: &'a [u64],
    eps: f64,
    layout: &'a LayoutSummary,
    /// The scale of data-parallel reductions' outputs, when `--dp-reduction-scale` gave it.
    dp_given: Option<f64>,
}

impl<'a> Ctx<'a> {
    fn new(p: &'a Prepared, opts: &CompareOptions) -> Ctx<'a> {
        Ctx {
            reff: &p.reff,
            ref_rank: p.ref_rank,
            run: &p.run,
            al: &p.al,
            steps: &p.steps,
            eps: p.precision.epsilon(),
            layout: &p.layout,
            dp_given: opts
                .dp_reduction_scale
                .map(|d| f64::from(d.factor(p.layout.dp))),
        }
    }
}

/// The comparisons of a walk (or of merged partitions), before they are ordered.
struct Found {
    pending: Vec<Pending>,
    warnings: Vec<String>,
    not_comparable: Vec<crate::report::NotComparable>,
    eps: f64,
    /// The scale data-parallel reductions were held to (`None`: none was seen).
    dp_reduction: Option<gradscale::Decision>,
}

/// Orders the comparisons of `steps`, localizes the first divergence and assembles the
/// report; `(bytes, elapsed_s)` are what was read and how long it took.
fn finish(
    p: &Prepared,
    steps: &[u64],
    found: Found,
    (bytes, elapsed_s): (u64, f64),
) -> Result<CompareReport, CompareError> {
    let Found {
        mut pending,
        mut warnings,
        not_comparable,
        eps,
        dp_reduction,
    } = found;
    if let Some(d) = dp_reduction.as_ref().filter(|d| {
        matches!(
            d.basis,
            gradscale::Basis::Outputs
                | gradscale::Basis::OutputsAfterIllegalUpdates
                | gradscale::Basis::Default
        )
    }) {
        // First: it says what every data-parallel verdict rests on.
        warnings.insert(
            0,
            format!(
                "data-parallel reductions held to scale {} (--dp-reduction-scale sets it)",
                d.detail
            ),
        );
    }
    pending.sort_by_key(|p| p.key);
    let mut tensors: Vec<TensorComparison> = Vec::with_capacity(pending.len());
    for (i, p) in pending.iter_mut().enumerate() {
        p.cmp.position = i as u64;
        tensors.push(p.cmp.clone());
    }
    let first = pending.iter().position(|p| p.cmp.diverged);
    let first_divergence = match first {
        Some(i) => Some(localize(&p.reff, p.ref_rank, &p.run, &pending, i, &p.al)?),
        None => None,
    };
    let replica_drift = crate::replicas::drift(&p.reff, p.ref_rank, &p.run, &tensors)?;
    let mut worst: Vec<usize> = (0..tensors.len()).collect();
    worst.sort_by(|&a, &b| {
        let r = |t: &TensorComparison| t.error_eps / t.tolerance_eps.max(f64::MIN_POSITIVE);
        r(&tensors[b]).total_cmp(&r(&tensors[a]))
    });
    worst.truncate(10);
    let summary = |t: &RunTrace| RunSummary {
        path: t.path.display().to_string(),
        run_id: t.manifest.run_id.clone(),
        command: t.manifest.command.join(" "),
        world_size: t.ranks().len() as u32,
    };
    let stats = CompareStats {
        reference_ops: steps
            .iter()
            .map(|&s| p.reff.records(p.ref_rank, s).len() as u64)
            .sum(),
        reference_gemms_aligned: p
            .al
            .of_ref
            .keys()
            .filter(|op| steps.contains(&op.0))
            .count() as u64,
        aligned_ops: p
            .al
            .of_run
            .keys()
            .filter(|op| steps.contains(&op.1))
            .count() as u64,
        unaligned_ops: p.al.unaligned,
        tensors_compared: tensors.len() as u64,
        bytes_compared: bytes,
        elapsed_s,
    };
    Ok(CompareReport {
        reference: summary(&p.reff),
        run: summary(&p.run),
        perturbed: p.pert.as_ref().map(summary),
        layout: p.layout.clone(),
        precision: p.precision.name().to_string(),
        epsilon: eps,
        steps: steps.to_vec(),
        verdict: if first_divergence.is_some() || !replica_drift.is_empty() {
            Verdict::Divergence
        } else {
            Verdict::Match
        },
        first_divergence,
        tensors,
        worst,
        warnings,
        not_comparable,
        replica_drift,
        dp_reduction,
        stats,
    })
}

/// Placements that fitted before, per kind of tensor: tried first next time.
///
/// The hints are only where to look first: a hint is kept only when it fits clearly or
/// every other placement is far worse (the place a search would find), so they are carried
/// from step to step. What decides how a tensor is judged (whether a misfit is a divergence
/// or a partial sum, which rank a free slice belongs to, whether the verdict is settled) is
/// learnt anew in every step ([`Memory::start_step`]), so that a step is judged the same
/// whether it is compared alone (a partition) or after the others.
#[derive(Default)]
struct Memory {
    /// Placements that fitted a kind of tensor whole, per rank.
    hints: BTreeMap<HintKey, Vec<(Placement, f32)>>,
    /// Placements that fitted group sums.
    sum_hints: SumHints,
    /// Kinds placed whole and clearly in this step (a misfit is then a divergence, not a
    /// missing sum).
    placed_whole: BTreeSet<HintKey>,
    /// Kinds that were partial results earlier in this step (go straight to the group sums).
    needs_sum: BTreeSet<HintKey>,
    /// The best place found for a kind that never fitted cleanly (reused, without a search,
    /// once the verdict is settled).
    provisional: BTreeMap<HintKey, (Placement, f32)>,
    /// Where each rank's shards cleanly sat: (rank, slices of a cut) → slice → times.
    usual: Usual,
}

impl Memory {
    /// Forgets what judged the previous step's tensors; keeps where to look first.
    fn start_step(&mut self) {
        self.placed_whole.clear();
        self.needs_sum.clear();
        self.provisional.clear();
        self.usual.clear();
    }
}

/// (rank, slices of a cut) → which slice → how many clean placements put it there.
type Usual = BTreeMap<(u32, u64), BTreeMap<u64, u32>>;

/// How much `rank` belongs at placement `p`: for every cut of `p`, the clean placements of
/// the rank's earlier shards in the step at that slice, plus one when the rank's tensor- or
/// data-parallel coordinate in the layout is that slice's index.
fn slice_affinity(usual: &Usual, layout: &LayoutSummary, rank: u32, p: &Placement) -> u32 {
    let (tp, dp, _) = crate::layout::coords(layout, rank);
    let mut a = 0;
    for cut in p.dims.iter().flat_map(|d| d.cuts.iter()) {
        a += 2 * usual
            .get(&(rank, cut.parts))
            .and_then(|m| m.get(&cut.chunk))
            .copied()
            .unwrap_or(0);
        let coord = if cut.parts == u64::from(layout.tp) {
            tp
        } else {
            dp
        };
        a += u32::from(u64::from(coord) == cut.chunk);
    }
    a
}

/// One reference tensor's counterparts, placed.
#[derive(Default)]
struct Placing {
    results: Vec<Shard>,
    place_of: Vec<Placed>,
    vals: BTreeMap<(u32, u64), Values>,
    /// Every shard's kind was placed whole before (a misfit is then a divergence, not a
    /// missing sum).
    all_known: bool,
    /// The op was called with other scalars than the reference's.
    param_note: Option<String>,
}

/// The walk over the reference's ops in execution order, and what it found.
struct Walk<'a> {
    reff: &'a RunTrace,
    run: &'a RunTrace,
    pert: Option<&'a RunTrace>,
    ref_rank: u32,
    precision: Precision,
    eps: f64,
    /// Scales a placement may divide a shard by (gradients of a loss averaged over each
    /// rank's own batch are DP times the reference's).
    scales: Vec<f32>,
    mem: Memory,
    /// Placement of each run GEMM's D (for the collectives that reduce it).
    d_place: BTreeMap<(u32, u64, u64), (Placement, f32)>,
    /// Tolerance of each reference GEMM's D.
    d_tol: BTreeMap<RefOp, f64>,
    pending: Vec<Pending>,
    unjudged: Unjudged,
    warnings: Vec<String>,
    /// A tensor diverged already: the verdict is settled (ops come in order), later
    /// placements are searched more cheaply.
    settled: bool,
    /// Every rank of the world is in the store (shards must then tile the reference).
    whole: bool,
    /// The run's layout (ranks' coordinates).
    layout: LayoutSummary,
}

impl<'a> Walk<'a> {
    fn new(p: &'a Prepared) -> Walk<'a> {
        let mut warnings: Vec<String> = p.al.warnings.clone();
        let missing = p.run.missing_ranks();
        if !missing.is_empty() {
            warnings.push(format!(
                "ranks {missing:?} of the run's {} hold no records (not captured, or lost): \
                 compared on what the store holds",
                p.run.world_size()
            ));
        }
        warnings.extend(p.reff.unreadable.iter().cloned());
        warnings.extend(p.run.unreadable.iter().cloned());
        if let Some(pt) = &p.pert {
            warnings.extend(pt.unreadable.iter().cloned());
        }
        Walk {
            reff: &p.reff,
            run: &p.run,
            pert: p.pert.as_ref(),
            ref_rank: p.ref_rank,
            precision: p.precision,
            eps: p.precision.epsilon(),
            // Assumption 3: the one scale besides 1 is the data-parallel size; where it is
            // wrong for the program, the data-parallel reduction shows it (its scale is
            // decided from the weight updates, `gradscale`).
            scales: if p.layout.dp > 1 {
                vec![1.0, p.layout.dp as f32]
            } else {
                vec![1.0]
            },
            mem: Memory::default(),
            d_place: BTreeMap::new(),
            d_tol: BTreeMap::new(),
            pending: Vec::new(),
            unjudged: Unjudged::default(),
            warnings,
            settled: false,
            whole: missing.is_empty(),
            layout: p.layout.clone(),
        }
    }

    /// Compares the tensors of one reference op (A, B, then D) with their shards.
    fn op(&mut self, ref_op: RefOp, shards: &[(u32, u64)], depth: u64) -> Result<(), CompareError> {
        let (step, ref_seq) = ref_op;
        let Some(ref_rec) = self.reff.record(self.ref_rank, step, ref_seq) else {
            return Ok(());
        };
        // Errors of this op's inputs (within their tolerance) propagate into its output.
        let mut input_error = 0f64;
        for (sub, role) in [Role::A, Role::B, Role::D].into_iter().enumerate() {
            let Some((ref_vals, cancelled)) = operand(self.reff, ref_rec, role)? else {
                continue;
            };
            let tol = self.tolerance(ref_rec, role, &ref_vals, depth, cancelled, input_error)?;
            let Some(cmp_error) =
                self.tensor(ref_op, ref_rec, shards, (sub, role), &ref_vals, tol)?
            else {
                continue;
            };
            if role != Role::D && cmp_error.is_finite() {
                input_error += cmp_error;
            }
        }
        Ok(())
    }

    /// The tolerance of a reference tensor (see [`tolerance::Terms`]).
    fn tolerance(
        &self,
        ref_rec: &Record,
        role: Role,
        ref_vals: &Values,
        depth: u64,
        cancelled: f64,
        input_error: f64,
    ) -> Result<tolerance::Tolerance, CompareError> {
        let increment = role == Role::D && gemm(ref_rec).is_some_and(accumulates);
        // An increment D - C loses the digits C and D share: a perturbed run's 1-ulp change
        // of C says nothing more about it.
        let pert_rec = self.pert.and_then(|p| {
            p.records(self.ref_rank, ref_rec.step)
                .iter()
                .find(|r| r.seq == ref_rec.seq && r.api == ref_rec.api)
        });
        let perturbed = match (self.pert, pert_rec) {
            (Some(p), Some(rec)) if !increment => perturbed_error(p, rec, role, ref_vals)?,
            _ => None,
        };
        Ok(tolerance::Terms {
            precision: self.precision,
            dtype: ref_vals.dtype,
            depth,
            // Without a perturbed reference, the drift over the steps is modelled.
            updates: if self.pert.is_none() { ref_rec.step } else { 0 },
            perturbed,
            cancelled: increment.then_some(cancelled),
            input_error: (role == Role::D).then_some(input_error),
        }
        .tolerance())
    }

    /// Places every shard of one reference tensor and records the comparison; returns its
    /// error in epsilon (`None` when nothing was compared).
    fn tensor(
        &mut self,
        ref_op: RefOp,
        ref_rec: &Record,
        shards: &[(u32, u64)],
        (sub, role): (usize, Role),
        ref_vals: &Values,
        tol: tolerance::Tolerance,
    ) -> Result<Option<f64>, CompareError> {
        let step = ref_op.0;
        let mut placed = self.place_shards(step, ref_rec, shards, (sub, role), ref_vals, tol)?;
        if placed.results.is_empty() {
            return Ok(None);
        }
        let eps = self.eps;
        let beyond = |p: &Placing| p.results.iter().any(|s| s.err.rel / eps > tol.value);
        let mut merge_group = 1u32;
        // Partial results before a reduction: the reference is the sum over a group.
        if matches!(role, Role::D | Role::CIn) && !placed.all_known && beyond(&placed) {
            merge_group = self.sums(step, shards, sub, ref_vals, tol, &mut placed);
        }
        // A partial result whose group partners were not captured cannot be summed: not
        // comparable, rather than a divergence made of missing data.
        if matches!(role, Role::D | Role::CIn)
            && merge_group == 1
            && beyond(&placed)
            && shards
                .iter()
                .any(|&(rank, _)| partners_missing(self.run, rank, step))
        {
            if let Some(rec) = shards
                .first()
                .and_then(|&(r, q)| self.run.record(r, step, q))
            {
                self.unjudged.note(
                    "a partial result (before its reduction) whose group partners were not \
                     captured (--ranks, or ranks missing from the store)",
                    rec,
                );
            }
            return Ok(None);
        }
        if role == Role::D {
            for (rank, seq, p, sc) in &placed.place_of {
                self.d_place.insert((*rank, step, *seq), (p.clone(), *sc));
            }
            self.d_tol.insert(ref_op, tol.value);
        }
        // Shards must tile the reference only when every rank was captured.
        if merge_group == 1 && self.whole {
            let (usual, layout) = (&self.mem.usual, &self.layout);
            let affinity = |rank: u32, p: &Placement| slice_affinity(usual, layout, rank, p);
            cover(
                &mut placed.results,
                &mut placed.place_of,
                &placed.vals,
                ref_vals,
                &affinity,
            );
        }
        let merge = placed
            .place_of
            .first()
            .map(|(_, _, p, _)| p.merge(&ref_vals.shape, merge_group))
            .unwrap_or(crate::report::Merge::Replicated);
        let mut cmp = comparison(
            ref_rec,
            role,
            ref_vals,
            &placed.results,
            merge,
            eps,
            tol,
            step,
            ref_op.1,
        );
        if role == Role::D && gemm(ref_rec).is_some_and(accumulates) {
            cmp.role = "D-C".into();
        }
        if placed.param_note.is_some() {
            cmp.diverged = true;
        }
        let error = cmp.error_eps;
        self.settled |= cmp.diverged;
        self.pending.push(Pending {
            key: (step, ref_op.1, sub as u32),
            shards: placed.results.iter().map(|s| (s.rank, s.seq)).collect(),
            cmp,
            ref_op,
            is_collective: false,
            param_note: placed.param_note,
        });
        Ok(Some(error))
    }

    /// Each shard at its best placement (remembered ones first).
    fn place_shards(
        &mut self,
        step: u64,
        ref_rec: &Record,
        shards: &[(u32, u64)],
        (sub, role): (usize, Role),
        ref_vals: &Values,
        tol: tolerance::Tolerance,
    ) -> Result<Placing, CompareError> {
        let mut out = Placing {
            all_known: true,
            ..Placing::default()
        };
        for &(rank, seq) in shards {
            let Some(rec) = self.run.record(rank, step, seq) else {
                continue;
            };
            if role == Role::D && increment_unknown(rec) {
                self.unjudged.note(
                    "an accumulating GEMM's output without its captured C (--no-inputs): \
                     its increment is unknown",
                    rec,
                );
                continue;
            }
            let Some((x, _)) = operand(self.run, rec, role)? else {
                continue;
            };
            if role == Role::D && out.param_note.is_none() {
                out.param_note = param_note(rank, rec, ref_rec);
            }
            let key: HintKey = (
                rank,
                sub,
                x.shape.clone(),
                ref_vals.shape.clone(),
                kind_of(rec),
            );
            if self.mem.needs_sum.contains(&key) {
                // Partial results last time: go straight to the group sums.
                out.all_known = false;
                out.results.push(Shard {
                    rank,
                    seq,
                    err: unplaced(),
                });
                out.place_of
                    .push((rank, seq, Placement::whole(x.shape.len()), 1.0));
                out.vals.insert((rank, seq), x);
                continue;
            }
            out.all_known &= self.mem.placed_whole.contains(&key);
            match self.fit(&key, &x, ref_vals, tol) {
                Some(f) => {
                    out.results.push(Shard {
                        rank,
                        seq,
                        err: f.err,
                    });
                    out.place_of.push((rank, seq, f.placement, f.scale));
                }
                None => self.warnings.push(format!(
                    "rank {rank} step {step} seq {seq} {} {role:?}: shape {:?} cannot be cut \
                     out of the reference's {:?}",
                    rec.api, x.shape, ref_vals.shape
                )),
            }
            out.vals.insert((rank, seq), x);
        }
        Ok(out)
    }

    /// The best placement of one shard, remembered for its kind when it fits clearly.
    fn fit(
        &mut self,
        key: &HintKey,
        x: &Values,
        ref_vals: &Values,
        tol: tolerance::Tolerance,
    ) -> Option<numerics::Fit> {
        let known = self.mem.hints.get(key).map_or(&[][..], |v| v.as_slice());
        // A hint is trusted only when it fits clearly: a wrong slice of a loosely tolerated
        // tensor (FP8) must not pass as round-off.
        let accept = (0.25 * tol.value * self.eps).min(hint_accept(x.dtype));
        // After the first divergence the verdict is settled: later tensors only feed the
        // plot and the worst-tensor table, so their placement search is cheaper.
        let quick = self.settled;
        let fit = match self.mem.provisional.get(key) {
            Some((p, sc)) if quick && known.is_empty() => {
                Some(numerics::full_fit(x, ref_vals, p.clone(), *sc))
            }
            // A remembered place that drifted above `accept` but stays within the tolerance
            // is re-validated against the other places instead of searched again.
            _ => numerics::place_trusting(
                x,
                ref_vals,
                known,
                &self.scales,
                (accept, tol.value * self.eps),
                quick,
            ),
        }?;
        if fit.err.rel <= accept {
            remember(self.mem.hints.entry(key.clone()).or_default(), &fit);
            self.mem.placed_whole.insert(key.clone());
            for cut in fit.placement.dims.iter().flat_map(|d| d.cuts.iter()) {
                *self
                    .mem
                    .usual
                    .entry((key.0, cut.parts))
                    .or_default()
                    .entry(cut.chunk)
                    .or_default() += 1;
            }
        } else {
            self.mem
                .provisional
                .entry(key.clone())
                .or_insert_with(|| (fit.placement.clone(), fit.scale));
        }
        Some(fit)
    }

    /// Tries the group sums for partial results; returns the group size (1: no sum fitted).
    fn sums(
        &mut self,
        step: u64,
        shards: &[(u32, u64)],
        sub: usize,
        ref_vals: &Values,
        tol: tolerance::Tolerance,
        placed: &mut Placing,
    ) -> u32 {
        let kind = shards
            .first()
            .and_then(|&(r, q)| self.run.record(r, step, q))
            .map(kind_of)
            .unwrap_or_default();
        let Some((group, (results, places))) = sum_groups(
            self.run,
            step,
            shards,
            &placed.vals,
            ref_vals,
            &placed.results,
            &self.scales,
            (tol.value * self.eps).min(hint_accept(ref_vals.dtype)),
            &mut self.mem.sum_hints,
            &kind,
        ) else {
            return 1;
        };
        placed.results = results;
        placed.place_of = places;
        for &(rank, seq) in shards {
            if let (Some(rec), Some(x)) = (
                self.run.record(rank, step, seq),
                placed.vals.get(&(rank, seq)),
            ) {
                self.mem.needs_sum.insert((
                    rank,
                    sub,
                    x.shape.clone(),
                    ref_vals.shape.clone(),
                    kind_of(rec),
                ));
            }
        }
        group
    }
}

/// Why a run GEMM's scalars make it diverge: called with another alpha or beta than the
/// reference's (e.g. overwriting where it should accumulate).
fn param_note(rank: u32, rec: &Record, ref_rec: &Record) -> Option<String> {
    let (g, f) = (gemm(rec)?, gemm(ref_rec)?);
    if !params_differ(g, f) {
        return None;
    }
    Some(format!(
        "rank {rank} called this GEMM with alpha={} beta={} where the reference used \
         alpha={} beta={}{}",
        show_scalar(g.alpha),
        show_scalar(g.beta),
        show_scalar(f.alpha),
        show_scalar(f.beta),
        if g.beta == Some(0.0) && f.beta.is_some_and(|b| b != 0.0) {
            " (it overwrites its output instead of accumulating into it)"
        } else {
            ""
        }
    ))
}

/// The stores opened and checked against each other, the steps chosen, the run aligned.
struct Prepared {
    reff: RunTrace,
    run: RunTrace,
    pert: Option<RunTrace>,
    ref_rank: u32,
    steps: Vec<u64>,
    al: Alignment,
    precision: Precision,
    layout: LayoutSummary,
}

/// Opens the stores, checks that they can be compared (one model, one precision, a
/// world-size-1 reference, a perturbed reference of the same command, a layout the
/// communicator map does not contradict), chooses the steps and aligns the run.
fn prepare(
    reff_path: &Path,
    run_path: &Path,
    opts: &CompareOptions,
) -> Result<Prepared, CompareError> {
    let reff = RunTrace::open(reff_path)?;
    let run = RunTrace::open(run_path)?;
    let pert = match &opts.perturbed {
        Some(p) => Some(RunTrace::open(p)?),
        None => None,
    };
    let ref_rank = *reff
        .ranks()
        .first()
        .ok_or_else(|| CompareError::Empty(reff_path.display().to_string()))?;
    if run.ranks().is_empty() {
        return Err(CompareError::Empty(run_path.display().to_string()));
    }
    crate::validate::references(&reff, &run)?;
    let steps = choose_steps(&reff, &run, opts.steps.as_deref())?;
    let precision = Precision::of(&reff, ref_rank, &steps);
    crate::validate::precisions(&reff, &run, precision, &steps)?;
    if let Some(p) = &pert {
        crate::validate::perturbed(&reff, p, precision, &steps)?;
    }
    let al = align::align(&reff, &run, &steps);
    crate::validate::same_model(&reff, ref_rank, &run, &al, &steps)?;
    let layout = match &opts.layout {
        Some(l) => {
            crate::layout::validate(l, &run, &al).map_err(CompareError::Invalid)?;
            l.clone()
        }
        None if run.world_size() > 1 && !run.has_collectives() => {
            return Err(CompareError::Invalid(format!(
                "{} holds no collectives (captured without the nccl family?): its layout \
                 cannot be read from the trace; give it with --layout (e.g. tp=2,dp=2)",
                run.path.display()
            )));
        }
        None => crate::layout::discover(&run, &al),
    };
    Ok(Prepared {
        reff,
        run,
        pert,
        ref_rank,
        steps,
        al,
        precision,
        layout,
    })
}

/// The steps to compare: those both stores hold on every rank, within `want` (inclusive
/// ranges) when given. Never proportional to the ranges' width: a range is only a filter.
fn choose_steps(
    reff: &RunTrace,
    run: &RunTrace,
    want: Option<&[(u64, u64)]>,
) -> Result<Vec<u64>, CompareError> {
    let run_steps = run.steps();
    let mut steps: Vec<u64> = reff
        .steps()
        .into_iter()
        .filter(|s| run_steps.contains(s))
        .collect();
    let held = |v: &[u64]| match (v.first(), v.last()) {
        (Some(a), Some(b)) if a == b => format!("step {a}"),
        (Some(a), Some(b)) => format!("steps {a}-{b}"),
        _ => "no step".to_string(),
    };
    if let Some(want) = want {
        // A single step asked for by name must be there; a range is clipped to what is.
        for &(a, b) in want {
            if a == b && !steps.contains(&a) {
                return Err(CompareError::Steps(format!(
                    "step {a} is not in both runs (the reference holds {}, the run {})",
                    held(&reff.steps()),
                    held(&run_steps)
                )));
            }
        }
        steps.retain(|s| want.iter().any(|&(a, b)| (a..=b).contains(s)));
    }
    if steps.is_empty() {
        return Err(CompareError::Steps(format!(
            "no step to compare (the reference holds {}, the run {}{})",
            held(&reff.steps()),
            held(&run_steps),
            if want.is_some() {
                ", within --steps"
            } else {
                ""
            }
        )));
    }
    Ok(steps)
}

/// The ordinal of every reference GEMM within its step (depth for the analytic bound).
fn gemm_ordinals(reff: &RunTrace, rank: u32, steps: &[u64]) -> BTreeMap<RefOp, u64> {
    let mut out = BTreeMap::new();
    for &s in steps {
        let mut n = 0u64;
        for r in reff.records(rank, s) {
            if gemm(r).is_some() {
                out.insert((s, r.seq), n);
                n += 1;
            }
        }
    }
    out
}

/// The perturbed reference's relative error on the same tensor.
fn perturbed_error(
    pert: &RunTrace,
    rec: &Record,
    role: Role,
    ref_vals: &Values,
) -> Result<Option<f64>, CompareError> {
    let Some(v) = pert.values(rec, role)? else {
        return Ok(None);
    };
    if v.shape != ref_vals.shape {
        return Ok(None);
    }
    Ok(Some(crate::kernels::rel_error(&v.data, &ref_vals.data)))
}

/// Shards must tile the reference: when several ranks claim the same slice while another
/// slice is claimed by nobody (two data-parallel ranks reading the same batch), the surplus
/// shards are judged at the unclaimed slices instead. Among shards that fit a free slice
/// equally (identical shards), the one with the larger `affinity` for it takes it: the rank
/// whose place in the layout is that slice, so that the blame falls on the rank whose shard
/// is wrong for its place.
fn cover(
    results: &mut [Shard],
    place_of: &mut [Placed],
    vals: &BTreeMap<(u32, u64), Values>,
    ref_vals: &Values,
    affinity: &dyn Fn(u32, &Placement) -> u32,
) {
    let Some(first) = place_of.first() else {
        return;
    };
    let structure = |p: &Placement| -> Vec<Vec<(u64, u64)>> {
        p.dims
            .iter()
            .map(|d| d.cuts.iter().map(|c| (c.parts, c.outer)).collect())
            .collect()
    };
    let shape = structure(&first.2);
    if place_of.iter().any(|p| structure(&p.2) != shape) {
        return;
    }
    // Every slice of that structure: the product of the chunks of every cut.
    let mut all: Vec<Placement> = vec![first.2.clone()];
    for (d, dim) in first.2.dims.iter().enumerate() {
        for (c, cut) in dim.cuts.iter().enumerate() {
            let mut next = Vec::new();
            for p in &all {
                for chunk in 0..cut.parts {
                    let mut q = p.clone();
                    q.dims[d].cuts[c].chunk = chunk;
                    next.push(q);
                }
            }
            all = next;
        }
    }
    let slices = all.len();
    if slices < 2 || !place_of.len().is_multiple_of(slices) {
        return;
    }
    let per_slice = place_of.len() / slices;
    let claims = |p: &Placement, place_of: &[Placed]| place_of.iter().filter(|q| q.2 == *p).count();
    let mut unclaimed: Vec<Placement> = all
        .iter()
        .filter(|p| claims(p, place_of) < per_slice)
        .cloned()
        .collect();
    while let Some(free) = unclaimed.pop() {
        // The surplus shard that fits the free slice best takes it.
        let surplus: Vec<usize> = (0..place_of.len())
            .filter(|&i| claims(&place_of[i].2, place_of) > per_slice)
            .collect();
        let best = surplus
            .iter()
            .filter_map(|&i| {
                let (rank, seq, _, scale) = &place_of[i];
                let x = vals.get(&(*rank, *seq))?;
                let f = numerics::full_fit(x, ref_vals, free.clone(), *scale);
                Some((i, f))
            })
            .min_by(|a, b| {
                // Equal fits within round-off of the comparison itself are ties.
                let (x, y) = (a.1.err.rel, b.1.err.rel);
                if (x - y).abs() <= 1e-9 * x.abs().max(y.abs()) {
                    let aff = |i: usize| affinity(place_of[i].0, &free);
                    aff(b.0).cmp(&aff(a.0))
                } else {
                    x.total_cmp(&y)
                }
            });
        let Some((i, f)) = best else { break };
        place_of[i].2 = free.clone();
        if let Some(r) = results
            .iter_mut()
            .find(|r| r.rank == place_of[i].0 && r.seq == place_of[i].1)
        {
            r.err = f.err;
        }
        if claims(&free, place_of) < per_slice {
            unclaimed.push(free);
        }
    }
}

/// Tries the reference as the sum of a communicator's members' shards (row-parallel partial
/// outputs, data-parallel weight gradients): returns the group size and the shards' errors
/// against it, when that fits better than any single-shard placement.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn sum_groups(
    run: &RunTrace,
    step: u64,
    shards: &[(u32, u64)],
    vals: &BTreeMap<(u32, u64), Values>,
    ref_vals: &Values,
    current: &[Shard],
    scales: &[f32],
    accept: f64,
    hints: &mut SumHints,
    kind: &str,
) -> Option<(u32, (Vec<Shard>, Vec<Placed>))> {
    let current_worst = current.iter().map(|s| s.err.rel).fold(0f64, f64::max);
    let seq_of: BTreeMap<u32, u64> = shards.iter().copied().collect();
    let mut best: Option<(f64, u32, Vec<Shard>, Vec<Placed>)> = None;
    // Communicators the shards' ranks use in this step.
    let mut comms: Vec<u64> = Vec::new();
    for &(rank, _) in shards {
        for &c in run.comms_used(rank, step) {
            if !comms.contains(&c) {
                comms.push(c);
            }
        }
    }
    // Collectives not captured (`--apis gemm`): every communicator of the manifest's map the
    // ranks belong to is a candidate group.
    if comms.is_empty() {
        for c in &run.manifest.comms {
            let holds = shards.iter().any(|&(r, _)| c.members.contains(&Some(r)));
            if c.size > 1 && holds && !comms.contains(&c.key) {
                comms.push(c.key);
            }
        }
    }
    // The communicator that fitted this kind of tensor before goes first.
    let first_rank = shards.iter().map(|s| s.0).min().unwrap_or(0);
    let shape_key = |c: u64| {
        (
            c,
            first_rank,
            vals.values()
                .next()
                .map(|v| v.shape.clone())
                .unwrap_or_default(),
            ref_vals.shape.clone(),
            kind.to_string(),
        )
    };
    comms.sort_by_key(|&c| !hints.contains_key(&shape_key(c)));
    // A communicator known to hold this kind of partial result is the only one tried: when
    // its sum does not fit, the tensor diverged, and no other group will explain it.
    if comms
        .first()
        .is_some_and(|&c| hints.contains_key(&shape_key(c)))
    {
        comms.truncate(1);
    }
    for comm in comms {
        let Some(groups) = partition(run, comm, shards) else {
            continue;
        };
        let mut results = Vec::new();
        let mut places = Vec::new();
        let mut ok = true;
        for g in &groups {
            let mut sum: Option<Values> = None;
            for rank in g {
                let v = seq_of.get(rank).and_then(|seq| vals.get(&(*rank, *seq)));
                match (&mut sum, v) {
                    (_, None) => ok = false,
                    (None, Some(v)) => sum = Some(v.clone()),
                    (Some(s), Some(v)) if s.shape == v.shape => {
                        for (a, b) in s.data.iter_mut().zip(&v.data) {
                            *a += *b;
                        }
                    }
                    (Some(_), Some(_)) => ok = false,
                }
            }
            let Some(sum) = sum.filter(|_| ok) else {
                ok = false;
                break;
            };
            let key = (
                comm,
                g.first().copied().unwrap_or(0),
                sum.shape.clone(),
                ref_vals.shape.clone(),
                kind.to_string(),
            );
            let known = hints.get(&key).map_or(&[][..], |v| v.as_slice());
            let Some(f) = numerics::place(&sum, ref_vals, known, scales, accept) else {
                ok = false;
                break;
            };
            if f.err.rel <= accept {
                remember(hints.entry(key).or_default(), &f);
            }
            for rank in g {
                results.push(Shard {
                    rank: *rank,
                    seq: seq_of[rank],
                    err: f.err,
                });
                places.push((*rank, seq_of[rank], f.placement.clone(), f.scale));
            }
        }
        if !ok || results.len() != shards.len() {
            continue;
        }
        let worst = results.iter().map(|s| s.err.rel).fold(0f64, f64::max);
        if worst < current_worst * 0.5 && best.as_ref().is_none_or(|b| worst < b.0) {
            let size = groups.first().map_or(1, |g| g.len()) as u32;
            best = Some((worst, size, results, places));
        }
        if worst <= accept {
            break;
        }
    }
    best.map(|(_, size, r, p)| (size, (r, p)))
}

/// The groups of the communicator family of `comm` that cover the shards' ranks: `comm`'s
/// members, and for every rank outside them the communicator whose members are the same
/// set translated by a rank offset (the sibling groups of a regular layout). `None` when a
/// rank has no such group.
fn partition(run: &RunTrace, comm: u64, shards: &[(u32, u64)]) -> Option<Vec<Vec<u32>>> {
    let mut base = run.comm_members(comm)?;
    base.sort_unstable();
    let sets: Vec<Vec<u32>> = run
        .manifest
        .comms
        .iter()
        .filter_map(|c| {
            let mut m = c.members.iter().copied().collect::<Option<Vec<u32>>>()?;
            m.sort_unstable();
            Some(m)
        })
        .collect();
    let mut groups: Vec<Vec<u32>> = Vec::new();
    for &(rank, _) in shards {
        if groups.iter().any(|g| g.contains(&rank)) {
            continue;
        }
        let found = base.iter().find_map(|&x| {
            let t: Vec<u32> = base
                .iter()
                .map(|&m| m as i64 + rank as i64 - x as i64)
                .filter(|v| *v >= 0)
                .map(|v| v as u32)
                .collect();
            (t.len() == base.len() && sets.contains(&t)).then_some(t)
        })?;
        groups.push(found);
    }
    Some(groups)
}

#[allow(clippy::too_many_arguments)]
fn comparison(
    rec: &Record,
    role: Role,
    ref_vals: &Values,
    results: &[Shard],
    merge: crate::report::Merge,
    eps: f64,
    tol: tolerance::Tolerance,
    step: u64,
    ref_seq: u64,
) -> TensorComparison {
    let worst_shard = results.iter().map(|s| s.err.rel).fold(0f64, f64::max);
    let (y2, x2) = results.iter().fold((0.0, 0.0), |acc, s| {
        (
            acc.0 + s.err.ref_sq,
            acc.1 + s.err.ref_sq * s.err.norm_ratio * s.err.norm_ratio,
        )
    });
    let norm_ratio = if y2 > 0.0 { (x2 / y2).sqrt() } else { 1.0 };
    let worst_row = results
        .iter()
        .filter_map(|s| s.err.worst_row.map(|(row, e)| (s.rank, row, e)))
        .max_by(|a, b| a.2.total_cmp(&b.2))
        .map(|(rank, row, e)| WorstRow {
            rank,
            row,
            error_eps: e / eps,
        });
    let error_eps = worst_shard / eps;
    TensorComparison {
        position: 0,
        step,
        ref_seq,
        api: rec.api.clone(),
        role: format!("{role:?}"),
        nvtx: nvtx_path(rec),
        shape: ref_vals.shape.clone(),
        dtype: ref_vals.dtype.name().to_string(),
        merge,
        ranks: results
            .iter()
            .map(|s| RankError {
                rank: s.rank,
                seq: s.seq,
                error_eps: s.err.rel / eps,
            })
            .collect(),
        error_eps,
        worst_row,
        norm_ratio,
        tolerance_eps: tol.value,
        tolerance_source: tol.source.to_string(),
        diverged: error_eps > tol.value,
    }
}

fn nvtx_path(rec: &Record) -> Option<String> {
    if rec.nvtx.is_empty() {
        None
    } else {
        Some(rec.nvtx.join("/"))
    }
}

/// The send range a reduction's output reads: output element e reads `base + e * size`.
fn reduction_input_range(c: &ttrace_format::record::CollectiveOp, out: &Tensor) -> (u64, u64) {
    let size = out.dtype.size() as u64;
    let base = match c.kind {
        CollectiveKind::ReduceScatter => c.sendbuff + c.comm_rank as u64 * c.count * size,
        _ => c.sendbuff,
    };
    (base, out.nbytes)
}

/// The tensors an op writes: a GEMM's D, a copy's destination, a collective's output.
fn written(r: &Record) -> impl Iterator<Item = &Tensor> {
    r.tensors
        .iter()
        .filter(|t| matches!(t.role, Role::D | Role::Dst | Role::Output))
}

/// The GEMMs whose output is the last write, before `recs[i]`, to each part of
/// `[base, base + len)`: `(record index, lo, hi)`. Every captured op counts as a writer
/// (copies and collectives included): a part last written by a copy (an allocator that
/// reused the block for a fresh upload) is linked to no GEMM. Only GEMM outputs of `dtype`
/// are linked.
fn last_writers(
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
    }
    writers
}

/// The parts of `[lo, hi)` outside every interval of `covered`.
fn uncovered(covered: &[(u64, u64)], lo: u64, hi: u64) -> Vec<(u64, u64)> {
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
type CallKey = (u64, u64, usize, RefOp);
/// Per rank: (rank, seq, error, where it sits).
type Piece = (u32, u64, PieceError, Position);

/// A reduction piece's error against the reference.
enum PieceError {
    /// At the scale of its inputs (partial sums over a non-data-parallel group).
    At(ShardError),
    /// At each scale a data-parallel reduction may be held to; one is chosen once every
    /// reduction was seen ([`gradscale::decide`]).
    ByScale(Vec<(f64, ShardError)>),
}

impl PieceError {
    fn at(&self, scale: f64) -> ShardError {
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
struct Reductions<'a> {
    ctx: &'a Ctx<'a>,
    d_place: &'a BTreeMap<(u32, u64, u64), (Placement, f32)>,
    ref_cache: BTreeMap<RefOp, Values>,
    shared: BTreeSet<RefOp>,
    by_call: BTreeMap<CallKey, Vec<Piece>>,
    /// Data-parallel calls, compared once their scale is decided: with the reference's shape
    /// and type (no values).
    deferred: Vec<(CallKey, Vec<Piece>, Values)>,
    /// What each data-parallel reduction says of the scale.
    evidence: Vec<Evidence>,
    updates: Updates<'a>,
    /// The scales a data-parallel reduction's output may be held to.
    dp_scales: Vec<f64>,
}

impl Reductions<'_> {
    /// Loads the reference GEMM output of `ref_op` once; whether it is there.
    fn load_reference(&mut self, ref_op: RefOp) -> Result<bool, CompareError> {
        if !self.ref_cache.contains_key(&ref_op) {
            let c = self.ctx;
            let Some(rr) = c.reff.record(c.ref_rank, ref_op.0, ref_op.1) else {
                return Ok(false);
            };
            let Some(v) = c.reff.values(rr, Role::D)? else {
                return Ok(false);
            };
            self.ref_cache.insert(ref_op, v);
        }
        Ok(true)
    }

    /// The pieces of one reduction `recs[i]` (the n-th on its communicator) of `rank`.
    fn reduction(
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
        // Only tensor- and data-parallel reductions have a reference meaning; others (tied
        // weights across stages) combine buffers the reference fills otherwise.
        let Some(members) = ctx.run.comm_members(c.comm) else {
            return Ok(());
        };
        let over_dp = crate::layout::is_dp_group(ctx.layout, &members);
        if !over_dp && !crate::layout::is_tp_group(ctx.layout, &members) {
            return Ok(());
        }
        let (base, len) = reduction_input_range(c, out_t);
        let writers = last_writers(recs, i, base, len, out_t.dtype);
        if writers.is_empty() {
            return Ok(());
        }
        let Some(out) = ctx.run.values(r, Role::Output)? else {
            return Ok(());
        };
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
            if self.shared.contains(&ref_op) {
                continue;
            }
            let (Some((place, d_scale)), Some(d)) = (
                self.d_place.get(&(rank, step, g.seq)),
                g.tensors.iter().find(|t| t.role == Role::D),
            ) else {
                continue;
            };
            if !self.load_reference(ref_op)? {
                continue;
            }
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
            let y = map.gather(&rv.data, e.0, e.1);
            let row = d.shape.last().copied().unwrap_or(1) as usize;
            let x = &out.data[o0..o1];
            let err_at = |s: f64| {
                let xs: Vec<f32> = x.iter().map(|v| v / s as f32).collect();
                numerics::shard_error(&xs, &y, row)
            };
            let err = if over_dp {
                // The option decides without the weights: they are not read.
                let update = match ctx.dp_given {
                    Some(_) => gradscale::Update::Unknown,
                    None => self.updates.of(rank, g, ref_op, rv, e, x)?,
                };
                self.evidence.push(Evidence {
                    output: gradscale::ratio(x, &y),
                    update,
                });
                PieceError::ByScale(self.dp_scales.iter().map(|&s| (s, err_at(s))).collect())
            } else {
                PieceError::At(err_at(f64::from(*d_scale)))
            };
            self.by_call
                .entry((step, c.comm, n, ref_op))
                .or_default()
                .push((rank, r.seq, err, pos));
        }
        Ok(())
    }
}

/// Compares the outputs of the run's reductions with the reference GEMM outputs they reduce;
/// returns the scale data-parallel reductions were held to (`None`: none was seen).
fn collectives(
    ctx: &Ctx,
    d_place: &BTreeMap<(u32, u64, u64), (Placement, f32)>,
    d_tol: &BTreeMap<RefOp, f64>,
    pending: &mut Vec<Pending>,
) -> Result<Option<gradscale::Decision>, CompareError> {
    let dp = ctx.layout.dp;
    let mut dp_scales: Vec<f64> = gradscale::legal(dp).to_vec();
    dp_scales.extend(ctx.dp_given);
    let mut red = Reductions {
        ctx,
        d_place,
        ref_cache: BTreeMap::new(),
        shared: shared_buffers(ctx.reff, ctx.ref_rank, ctx.steps),
        by_call: BTreeMap::new(),
        deferred: Vec::new(),
        evidence: Vec::new(),
        updates: Updates::new(ctx.reff, ctx.ref_rank, ctx.run, ctx.al, ctx.steps),
        dp_scales,
    };
    // Step by step: the reference GEMM outputs read for one step's reductions are dropped
    // before the next.
    for &step in ctx.steps {
        for rank in ctx.run.ranks() {
            let recs = ctx.run.records(rank, step);
            let mut calls: BTreeMap<u64, usize> = BTreeMap::new();
            for (i, r) in recs.iter().enumerate() {
                let Some(c) = collective(r) else { continue };
                let n = calls.entry(c.comm).and_modify(|n| *n += 1).or_insert(0);
                let n = *n;
                if matches!(
                    c.kind,
                    CollectiveKind::AllReduce | CollectiveKind::ReduceScatter
                ) {
                    red.reduction(rank, step, recs, i, n)?;
                }
            }
        }
        for (key, pieces) in std::mem::take(&mut red.by_call) {
            let Some(rv) = red.ref_cache.get(&key.3) else {
                continue;
            };
            if matches!(pieces.first(), Some((_, _, PieceError::ByScale(_), _))) {
                let shape_only = Values {
                    shape: rv.shape.clone(),
                    data: Vec::new(),
                    dtype: rv.dtype,
                };
                red.deferred.push((key, pieces, shape_only));
            } else {
                reduction_compared(ctx, key, &pieces, rv, 1.0, d_tol, pending);
            }
        }
        red.ref_cache.clear();
    }
    if red.deferred.is_empty() && red.evidence.is_empty() {
        return Ok(None);
    }
    let decision = gradscale::decide(&red.evidence, dp, ctx.dp_given);
    for (key, pieces, rv) in std::mem::take(&mut red.deferred) {
        reduction_compared(ctx, key, &pieces, &rv, decision.scale, d_tol, pending);
    }
    Ok(Some(decision))
}

/// Records the comparison of one reduction call (its pieces' errors at `scale` where a
/// data-parallel reduction's were kept at every scale).
fn reduction_compared(
    ctx: &Ctx,
    (step, _comm, _n, ref_op): CallKey,
    pieces: &[Piece],
    rv: &Values,
    scale: f64,
    d_tol: &BTreeMap<RefOp, f64>,
    pending: &mut Vec<Pending>,
) {
    let Some(rr) = ctx.reff.record(ctx.ref_rank, ref_op.0, ref_op.1) else {
        return;
    };
    let Some(run_rec) = pieces.first().and_then(|p| ctx.run.record(p.0, step, p.1)) else {
        return;
    };
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
        run_rec,
        Role::Output,
        rv,
        &results,
        crate::report::Merge::Replicated,
        ctx.eps,
        tolerance::reduced(d_tol.get(&ref_op).copied()),
        step,
        ref_op.1,
    );
    cmp.nvtx = nvtx_path(run_rec).or_else(|| nvtx_path(rr));
    pending.push(Pending {
        key,
        shards: results.iter().map(|s| (s.rank, s.seq)).collect(),
        cmp,
        ref_op,
        is_collective: true,
        param_note: None,
    });
}

/// Splits an NVTX path `forward.mb1/layers.0.mlp.fc1` into pass, micro-batch and module.
pub fn split_nvtx(path: &str) -> (Option<String>, Option<u32>, Option<String>) {
    let mut parts = path.splitn(2, '/');
    let head = parts.next().unwrap_or("");
    let module = parts.next().map(str::to_string);
    let (pass, mb) = match head.split_once('.') {
        Some((p, m)) => (p, m.strip_prefix("mb").and_then(|n| n.parse().ok())),
        None => (head, None),
    };
    let pass = matches!(pass, "forward" | "backward" | "optimizer").then(|| pass.to_string());
    match pass {
        Some(p) => (Some(p), mb, module),
        None => (None, None, Some(path.to_string())),
    }
}

/// Names the first divergence and decides whether its op made it.
fn localize(
    reff: &RunTrace,
    ref_rank: u32,
    run: &RunTrace,
    pending: &[Pending],
    i: usize,
    al: &Alignment,
) -> Result<Divergence, CompareError> {
    let p = &pending[i];
    let t = &p.cmp;
    let diverged_ranks: Vec<u32> = t
        .ranks
        .iter()
        .filter(|r| r.error_eps > t.tolerance_eps)
        .map(|r| r.rank)
        .collect();
    let (rank, seq) = t
        .ranks
        .iter()
        .filter(|r| r.error_eps > t.tolerance_eps)
        .max_by(|a, b| a.error_eps.total_cmp(&b.error_eps))
        .map_or(p.shards[0], |r| (r.rank, r.seq));
    let step = t.step;
    let run_rec = run.record(rank, step, seq);
    // The last good tensor of an earlier op (the op's own other inputs say nothing about
    // where its diverged input came from).
    let last_good = (0..i).rev().find(|&j| {
        !pending[j].cmp.diverged && (pending[j].key.0, pending[j].key.1) != (p.key.0, p.key.1)
    });
    let (pass, nvtx_mb, module) = t.nvtx.as_deref().map_or((None, None, None), split_nvtx);
    let micro_batch = nvtx_mb.or_else(|| al.micro_batch.get(&p.ref_op).copied());
    let position = match run_rec {
        Some(r) => describe(r),
        None => format!("rank {rank} step {step} seq {seq}"),
    };
    let ratio_hint = scale_hint(t.norm_ratio);
    let (cause, explanation) = if let Some(note) = &p.param_note {
        (Cause::Local, format!("{note}{ratio_hint}"))
    } else if p.is_collective {
        let op_hint = run_rec
            .and_then(collective)
            .filter(|c| {
                c.redop == Some(cuda_abi::nccl::ncclAvg)
                    && (t.norm_ratio * c.comm_size as f64 - 1.0).abs() < 0.05
            })
            .map(|c| {
                format!(
                    "; it averages (ncclAvg) over {} ranks where the reference's result is their \
                     sum",
                    c.comm_size
                )
            })
            .unwrap_or_default();
        (
            Cause::Local,
            format!(
                "the {} output differs from the reference while the GEMM output it reduces \
                 matched: the reduction itself is wrong (op, group, or scaling){ratio_hint}\
                 {op_hint}",
                t.api
            ),
        )
    } else if t.role == "D" {
        let why = local_gemm_reason(reff, ref_rank, run, p, rank, seq)?;
        (Cause::Local, format!("{why}{ratio_hint}"))
    } else {
        let prev = last_good.map(|j| {
            let g = &pending[j].cmp;
            format!(
                "{} {} of {}",
                g.role,
                g.api,
                g.nvtx
                    .clone()
                    .unwrap_or_else(|| format!("step {} seq {}", g.step, g.ref_seq))
            )
        });
        (
            Cause::Upstream,
            format!(
                "input {} of this {} was already wrong when the op read it: the bug lies \
                 between the last good tensor{} and this op, in code ttrace does not capture \
                 (kernels, host-side copies, or a missing collective){ratio_hint}{}",
                t.role,
                t.api,
                prev.map(|s| format!(" ({s})")).unwrap_or_default(),
                unaligned_before(run, al, rank, step, seq)
            ),
        )
    };
    Ok(Divergence {
        tensor: i,
        cause,
        explanation,
        last_good,
        kernels_between: run_rec
            .map(|r| r.kernels_before.clone())
            .unwrap_or_default(),
        ranks: diverged_ranks,
        step,
        micro_batch,
        pass,
        module,
        position,
    })
}

/// A note naming the GEMMs of `rank` that ran after its previous aligned GEMM and before
/// `seq` yet have no counterpart in the reference (the alignment left them out: other
/// transposes, shapes or types than the reference's, or a call the reference does not make):
/// the likeliest culprits of an upstream divergence on that rank.
fn unaligned_before(run: &RunTrace, al: &Alignment, rank: u32, step: u64, seq: u64) -> String {
    let mut found: Vec<String> = Vec::new();
    for r in run.records(rank, step).iter().rev().filter(|r| r.seq < seq) {
        let Some(g) = gemm(r) else { continue };
        if al.of_run.contains_key(&(rank, step, r.seq)) {
            break;
        }
        found.push(format!(
            "{} transa={} transb={}",
            describe(r),
            g.transa,
            g.transb
        ));
    }
    if found.is_empty() {
        return String::new();
    }
    found.reverse();
    format!(
        "; in between, {} no counterpart in the reference (left unaligned: other \
         parameters than the reference's GEMMs, or calls the reference does not make): {}",
        if found.len() == 1 {
            "this GEMM has"
        } else {
            "these GEMMs have"
        },
        found.join(", ")
    )
}

/// `rank 3 step 0 seq 17: cublasGemmEx m=64 n=128 k=64`.
pub fn describe(r: &Record) -> String {
    match gemm(r) {
        Some(g) => format!(
            "rank {} step {} seq {}: {} m={} n={} k={}{}",
            r.rank,
            r.step,
            r.seq,
            r.api,
            g.m,
            g.n,
            g.k,
            if g.batch > 1 {
                format!(" batch={}", g.batch)
            } else {
                String::new()
            }
        ),
        None => match collective(r) {
            Some(c) => format!(
                "rank {} step {} seq {}: {} count={} ({} of {})",
                r.rank, r.step, r.seq, r.api, c.count, c.comm_rank, c.comm_size
            ),
            None => format!("rank {} step {} seq {}: {}", r.rank, r.step, r.seq, r.api),
        },
    }
}

/// A hint when the norm ratio reads as a scaling bug.
fn scale_hint(ratio: f64) -> String {
    for k in [2.0f64, 3.0, 4.0, 8.0, 0.5, 0.25, 0.125] {
        if (ratio / k - 1.0).abs() < 0.02 {
            return format!("; run/reference norm = {ratio:.2}: the tensor looks scaled by {k}");
        }
    }
    String::new()
}

/// Why a GEMM's output diverged although its inputs matched.
fn local_gemm_reason(
    reff: &RunTrace,
    ref_rank: u32,
    run: &RunTrace,
    p: &Pending,
    rank: u32,
    seq: u64,
) -> Result<String, CompareError> {
    let step = p.cmp.step;
    let Some(rec) = run.record(rank, step, seq) else {
        return Ok("the GEMM's output diverges while its inputs match".into());
    };
    let Some(g) = gemm(rec) else {
        return Ok("the op's output diverges while its inputs match".into());
    };
    let ref_g = reff.record(ref_rank, p.ref_op.0, p.ref_op.1).and_then(gemm);
    if let Some(f) = ref_g {
        if g.beta != f.beta || g.alpha != f.alpha {
            return Ok(format!(
                "rank {rank} called the GEMM with alpha={:?} beta={:?} where the reference used \
                 alpha={:?} beta={:?}{}",
                g.alpha,
                g.beta,
                f.alpha,
                f.beta,
                if g.beta == Some(0.0) && f.beta.is_some_and(|b| b != 0.0) {
                    " (it overwrites instead of accumulating)"
                } else {
                    ""
                }
            ));
        }
        if g.epilogue != f.epilogue {
            return Ok(format!(
                "rank {rank} ran the GEMM with epilogue {} where the reference used {}",
                g.epilogue, f.epilogue
            ));
        }
    }
    // Recompute from the rank's own inputs.
    let a = run.values(rec, Role::A)?;
    let b = run.values(rec, Role::B)?;
    let c = run.values(rec, Role::CIn)?;
    let d = run.values(rec, Role::D)?;
    if let (Some(a), Some(b), Some(d)) = (a, b, d) {
        let alpha = g.alpha.unwrap_or(1.0);
        let beta = g.beta.unwrap_or(0.0);
        if d.dtype != DType::F8_E4M3 && d.dtype != DType::F8_E5M2 {
            if let Some((exact, abs)) = numerics::gemm_f64(
                g,
                &a.data,
                &b.data,
                c.as_ref().map(|c| c.data.as_slice()),
                alpha,
                beta,
            ) {
                let u = tolerance::unit_roundoff(d.dtype);
                let k = g.k as f64;
                let worst = exact
                    .iter()
                    .zip(&abs)
                    .zip(&d.data)
                    .map(|((e, s), &v)| {
                        (v as f64 - e).abs()
                            / (u * (1.0 + k.sqrt()) * s + u * e.abs() + f64::MIN_POSITIVE)
                    })
                    .fold(0f64, f64::max);
                if worst > 4.0 {
                    return Ok(format!(
                        "rank {rank}'s GEMM output does not follow from its own captured inputs \
                         ({worst:.0}x the round-off bound when recomputed in f64): the GEMM itself \
                         or something writing its output buffer is wrong"
                    ));
                }
            }
        }
    }
    Ok(
        "every rank's GEMM output follows from its own inputs (recomputed in f64), and the \
         inputs match the reference, yet the output does not: the shards do not combine into \
         the reference's result (a wrong shard layout, or a reduction added or missing)"
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ttrace_format::record::{GemmOp, Op};

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
        r.op = Op::Gemm(Box::new(GemmOp {
            m: 4,
            n: nbytes / 16,
            k: 4,
            transa: 0,
            transb: 0,
            lda: 4,
            ldb: 4,
            ldc: 4,
            ldd: 4,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
            stride_d: 0,
            a_type: 0,
            b_type: 0,
            c_type: 0,
            d_type: 0,
            compute_type: 68,
            scale_type: 0,
            alpha: Some(1.0),
            beta: Some(0.0),
            epilogue: 1,
            algo: -1,
            fast_accum: false,
        }));
        r.tensors = vec![tensor(Role::D, ptr, nbytes)];
        r
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

    fn values(data: &[f32]) -> Values {
        Values {
            shape: vec![data.len() as u64],
            data: data.to_vec(),
            dtype: DType::F32,
        }
    }

    fn half(chunk: u64) -> Placement {
        Placement {
            dims: vec![numerics::DimSlice {
                cuts: vec![numerics::Cut {
                    parts: 2,
                    outer: 1,
                    chunk,
                }],
            }],
        }
    }

    #[test]
    fn identical_shards_blame_the_rank_whose_place_they_do_not_fit() {
        let reference = values(&[1.0, 2.0, 3.0, 4.0]);
        // Rank 1 loaded rank 0's half: both fit the first half exactly.
        let vals: BTreeMap<(u32, u64), Values> = [
            ((0, 10), values(&[1.0, 2.0])),
            ((1, 10), values(&[1.0, 2.0])),
        ]
        .into_iter()
        .collect();
        let fit = |rank: u32| Shard {
            rank,
            seq: 10,
            err: numerics::full_fit(&vals[&(rank, 10)], &reference, half(0), 1.0).err,
        };
        let mut results = vec![fit(0), fit(1)];
        let mut place_of: Vec<Placed> = vec![(0, 10, half(0), 1.0), (1, 10, half(0), 1.0)];
        // Rank 1's place is the second half.
        let affinity =
            |rank: u32, p: &Placement| u32::from(u64::from(rank) == p.dims[0].cuts[0].chunk);
        cover(&mut results, &mut place_of, &vals, &reference, &affinity);
        assert_eq!(place_of[1].2, half(1));
        assert!(results[0].err.rel < 1e-9, "rank 0 holds its own half");
        assert!(results[1].err.rel > 0.1, "rank 1 is judged at its place");
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
        assert_eq!(DpScale::parse("1/dp").map(|d| d.factor(4)), Ok(0.25));
        assert!(DpScale::parse("-1").is_err());
    }
}
