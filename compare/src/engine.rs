//! `ttrace compare`: the walk over the reference's ops that calls the units of the engine.
//!
//! Every reference GEMM with counterparts in the run is compared tensor by tensor (inputs A,
//! B, C, then the output D), in the reference's execution order: forward, backward and
//! optimizer, micro-batch after micro-batch, step after step. Each tensor's shards are placed
//! in the reference ([`crate::placement`], remembering places in [`crate::hints`]), combined
//! ([`crate::combine`]: slices tiling it, partial results summed over a group), measured
//! against a tolerance ([`crate::tolerance`]) and recorded ([`crate::comparison`]).
//! Collectives have no counterpart in a single-device run: a reduction's output is compared
//! with the reference GEMM output it reduces ([`crate::reductions`]). The first tensor beyond
//! its tolerance is the verdict ([`crate::localize`]). The stores are opened, checked and
//! aligned first ([`crate::prepare`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use ttrace_format::record::{Record, Role};

use crate::align::RefOp;
use crate::combine::{self, Merge};
use crate::comparison::{accumulates, comparison, operand, Pending, Unjudged};
use crate::gradscale;
use crate::layout::LayoutSummary;
use crate::localize;
use crate::numerics::Placement;
use crate::placement::{Placer, Placing};
use crate::prepare::{bytes_read, nothing_aligned, prepare, step_weight, Prepared};
use crate::reductions::{self, Ctx};
use crate::report::{ChaoticStep, CompareReport, CompareStats, RoundoffJump, RunSummary, Verdict};
use crate::results::Results;
use crate::tolerance::{self, Precision, Tolerance};
use crate::trace::{gemm, RunTrace, Values};
use crate::CompareError;

pub(crate) use crate::comparison::Position;
pub use crate::localize::{describe, split_nvtx};

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
/// each; an eighth for decoded tensors kept and as much for spare buffers
/// ([`crate::prefetch::kept_budgets`]); a sixteenth for the records' metadata
/// ([`metadata_budgets`]), shared the same way; a thirty-second each for the results of
/// the walk and of the reductions, which run side by side
/// ([`crate::results::results_budget`]). The rest (an eighth) is left for what no share
/// bounds: the program and its threads, the tensors of the op being compared, what grows
/// with the steps (the alignment, the results' index: a few hundred bytes a GEMM).
/// Returns (reference, run, perturbed) segment budgets.
pub fn mapping_budgets(memory: u64) -> (u64, u64, u64) {
    let segments = memory / 2;
    (segments / 4, segments / 2, segments / 4)
}

/// How much record metadata each store keeps under a memory budget
/// ([`crate::records`]): a sixteenth of it, the run's store (every rank) half of that and
/// the reference and the perturbed reference a quarter each, as their mappings. Metadata past
/// it (estimated by [`crate::records::approx_bytes`]; about 1.1 KB a record measured on the
/// hidden-32 trainer) is dropped, least recently read first, and read again when wanted. An eighth
/// took the large benchmark config over 100 steps to 1,026 MB under the default 1 GiB (the
/// shares filling); a sixteenth, with the results' share halved, to 913 MB, 1.08x the time.
/// Returns (reference, run, perturbed).
pub fn metadata_budgets(memory: u64) -> (u64, u64, u64) {
    let metadata = memory / 16;
    (metadata / 4, metadata / 2, metadata / 4)
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

/// Runs `job` on a thread of rayon's global pool (in place when the caller is a thread of a
/// pool already). The walk's many short parallel loops (error sums, placement searches) then
/// share their work with the thread that runs them: called from outside the pool, each loop
/// would be handed over to the pool's threads while the caller sleeps until it is done, a
/// wake-up and a sleep per loop, thousands of them in a comparison.
fn on_the_pool<R: Send>(job: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| job())
}

/// Compares `run` against the reference `reff`.
pub fn compare(
    reff_path: &Path,
    run_path: &Path,
    opts: &CompareOptions,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<CompareReport, CompareError> {
    on_the_pool(|| compare_on_the_pool(reff_path, run_path, opts, progress))
}

/// [`compare`], on a thread of the pool.
fn compare_on_the_pool(
    reff_path: &Path,
    run_path: &Path,
    opts: &CompareOptions,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<CompareReport, CompareError> {
    let started = Instant::now();
    let p = prepare(reff_path, run_path, opts)?;
    tracing::debug!(
        seconds = started.elapsed().as_secs_f64(),
        "compare: stores prepared"
    );
    let walked = walk_steps(&p, opts, &p.steps, progress)?;
    tracing::debug!(
        seconds = started.elapsed().as_secs_f64(),
        "compare: walk and reductions done"
    );
    shed(&p);
    if walked.pending.is_empty() {
        return Err(nothing_aligned(&p, reff_path, run_path));
    }
    let bytes = bytes_read(&p);
    tracing::debug!(
        reference = p.reff.metadata_reread(),
        run = p.run.metadata_reread(),
        perturbed = p.pert.as_ref().map_or(0, |t| t.metadata_reread()),
        "compare: segments whose records were read again (dropped from the metadata budget)"
    );
    tracing::debug!(
        records = ttrace_format::store::slow_decodes(),
        "compare: records whose metadata the slower CBOR decoder read (0 expected)"
    );
    let mut warnings = walked.base_warnings;
    warnings.extend(walked.warnings);
    let report = finish(
        &p,
        &p.steps,
        Found {
            pending: walked.pending,
            warnings,
            not_comparable: walked.unjudged.into_report(),
            eps: walked.eps,
            dp_reduction: walked.dp_reduction,
            jumps: walked.jumps,
            chaotic: walked.chaotic,
        },
        (bytes, started.elapsed().as_secs_f64()),
    );
    release(p);
    report
}

/// Drops what the walk kept of the stores (decoded tensors, open segments) on a thread of
/// its own, while the comparisons are ordered and the report made: what comes after the walk
/// reads few tensors (replica drift), and a process that exits with them still mapped spends
/// its last tens of milliseconds unmapping them (the large benchmark config: exit 35 -> 25 ms
/// after the reports are written). Inline when no thread can be made.
fn shed(p: &Prepared) {
    let shed: Vec<_> = p.stores().into_iter().map(|(_, t)| t.shed()).collect();
    let _ = std::thread::Builder::new()
        .name("ttrace-release".into())
        .spawn(move || drop(shed));
}

/// Drops the stores on a thread of their own: unmapping their segments and freeing the
/// decoded tensors takes tens of milliseconds at real sizes (a tenth of a second per GB),
/// which the caller spends writing the report instead. Inline when no thread can be made.
fn release(p: Prepared) {
    let _ = std::thread::Builder::new()
        .name("ttrace-release".into())
        .spawn(move || drop(p));
}

/// Compares the share of the steps that partition `part` of a `--partition I/N` split owns
/// ([`crate::partition::assign`]) and returns a partial report that
/// [`crate::partition::merge`] joins with the others into the whole run's report.
pub fn compare_partition(
    reff_path: &Path,
    run_path: &Path,
    opts: &CompareOptions,
    part: crate::partition::Partition,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<crate::partition::PartialReport, CompareError> {
    on_the_pool(|| partition_on_the_pool(reff_path, run_path, opts, part, progress))
}

/// [`compare_partition`], on a thread of the pool.
fn partition_on_the_pool(
    reff_path: &Path,
    run_path: &Path,
    opts: &CompareOptions,
    part: crate::partition::Partition,
    progress: &mut (dyn FnMut(u64, u64) + Send),
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
    shed(&p);
    let mut warnings = walked.base_warnings;
    warnings.extend(walked.warnings.iter().cloned());
    let mut entries = crate::partition::PendingList::default();
    let report = finish_with_entries(
        &p,
        &mine,
        Found {
            pending: walked.pending,
            warnings,
            not_comparable: walked.unjudged.into_report(),
            eps: walked.eps,
            dp_reduction: walked.dp_reduction,
            jumps: walked.jumps,
            chaotic: walked.chaotic,
        },
        (bytes_read(&p), started.elapsed().as_secs_f64()),
        Some(&mut entries),
    )?;
    let mut late = Vec::new();
    for (name, t) in p.stores() {
        for (line, records) in t.late_unreadable() {
            late.push((name.to_string(), line, records));
        }
    }
    release(p);
    Ok(crate::partition::PartialReport {
        report,
        partition: crate::partition::Partial::new(
            part,
            units,
            mine,
            crate::partition::PartialOptions::of(reff_path, run_path, opts),
            entries,
            (walked.warnings, late),
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
    parts: impl IntoIterator<Item = Result<crate::partition::PartialReport, CompareError>>,
) -> Result<CompareReport, CompareError> {
    let started = Instant::now();
    let p = prepare(reff_path, run_path, opts)?;
    let memory = opts.memory.unwrap_or(DEFAULT_MEMORY);
    let budget = crate::results::results_budget(memory);
    let base = Walk::new(&p, budget).warnings;
    let mut found = Found {
        pending: Results::new(budget),
        warnings: base,
        not_comparable: Vec::new(),
        eps: p.precision.epsilon(),
        dp_reduction: None,
        jumps: Vec::new(),
        chaotic: Vec::new(),
    };
    let mut bytes = 0u64;
    let mut elapsed = 0f64;
    let mut late: Vec<(String, String, u64)> = Vec::new();
    for part in parts {
        let part = part?;
        late.extend(part.partition.late_unreadable.iter().cloned());
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
        let tensors = part
            .report
            .tensors
            .into_vec()
            .map_err(CompareError::Results)?;
        for (cmp, e) in tensors.into_iter().zip(part.partition.pending) {
            found
                .pending
                .push(Pending::from_entry(cmp, e.map_err(CompareError::Results)?))?;
        }
        found.warnings.extend(part.partition.walk_warnings);
        // Partitions come in step order, as a whole run's walk finds them.
        found.jumps.extend(part.report.roundoff_jumps);
        found.chaotic.extend(part.report.chaotic_steps);
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
    let mut report = finish(
        &p,
        &p.steps,
        found,
        (bytes, elapsed + started.elapsed().as_secs_f64()),
    )?;
    add_late_unreadable(&mut report, late);
    Ok(report)
}

/// Records the partitions read at opening but could not read again (`late`: store, line),
/// which the merge does not read itself: said among the warnings and counted among the
/// store's capture losses, as one whole run says and counts them.
fn add_late_unreadable(report: &mut CompareReport, late: Vec<(String, String, u64)>) {
    for (store, line, records) in late {
        if report.warnings.contains(&line) {
            continue;
        }
        report.warnings.push(line);
        let path = match store.as_str() {
            "reference" => report.reference.path.clone(),
            "perturbed" => report
                .perturbed
                .as_ref()
                .map(|s| s.path.clone())
                .unwrap_or_default(),
            _ => report.run.path.clone(),
        };
        let losses = &mut report.capture_losses;
        let at = match losses.iter().position(|l| l.store == store) {
            Some(at) => at,
            None => {
                losses.push(crate::losses::CaptureLosses {
                    store,
                    path,
                    ..Default::default()
                });
                losses.len() - 1
            }
        };
        losses[at].unreadable += records;
    }
}

/// What a walk over some steps found.
struct Walked {
    pending: Results,
    /// Warnings of the whole comparison (alignment, missing ranks, unreadable records).
    base_warnings: Vec<String>,
    /// Warnings of the tensors compared.
    warnings: Vec<String>,
    unjudged: Unjudged,
    eps: f64,
    /// The scale data-parallel reductions were held to (`None`: none was seen).
    dp_reduction: Option<gradscale::Decision>,
    /// Each step's largest round-off jump, in step order ([`Walk::end_step`]).
    jumps: Vec<RoundoffJump>,
    /// The chaotic steps, in step order ([`Walk::end_step`]).
    chaotic: Vec<ChaoticStep>,
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
    let (ref_kept, run_kept, pert_kept) =
        crate::prefetch::kept_budgets(opts.memory.unwrap_or(DEFAULT_MEMORY));
    p.reff.set_decoded_budget(ref_kept);
    p.run.set_decoded_budget(run_kept);
    if let Some(pt) = &p.pert {
        pt.set_decoded_budget(pert_kept);
    }
    // The increments D - beta*C the walk compares are formed on the thread pool as their
    // tensors are decoded; only the reference's tolerance needs what they cancelled.
    p.reff
        .set_increments_ahead(crate::trace::IncrementsAhead::WithCancellation);
    p.run
        .set_increments_ahead(crate::trace::IncrementsAhead::Plain);
    // The reductions run beside the walk, a step behind it, on readers of their own.
    let (tell, news) = std::sync::mpsc::channel();
    let (reff, run) = (p.reff.reader(), p.run.reader());
    let (al, layout, shared) = (&p.al, &p.layout, &p.shared_buffers);
    let (ref_rank, eps) = (p.ref_rank, p.precision.epsilon());
    let dp_given = opts
        .dp_reduction_scale
        .map(|d| f64::from(d.factor(p.layout.dp)));
    let memory = opts.memory.unwrap_or(DEFAULT_MEMORY);
    let reduce = move || {
        let ctx = Ctx {
            reff: &reff,
            ref_rank,
            run: &run,
            al,
            steps,
            shared,
            eps,
            layout,
            dp_given,
        };
        reductions::collectives(&ctx, news, memory)
    };
    let (walked, reduced) = std::thread::scope(|s| {
        let reductions = s.spawn(|| on_reductions_pool(reduce));
        let walked = walk_ops(p, opts, steps, progress, tell);
        let reduced = reductions.join();
        (walked, reduced)
    });
    let (mut walked, reduced) = (walked?, reduced.map_err(|_| panicked_reductions())?);
    // The walk ended (its error, if any, is what was reported above): so did the reductions.
    let (pending, dp_reduction, unjudged) = reduced?.ok_or_else(panicked_reductions)?;
    walked.pending.absorb(pending);
    walked.unjudged.absorb(unjudged);
    walked.dp_reduction = dp_reduction;
    Ok(walked)
}

/// The error of reductions that stopped though the walk did not.
fn panicked_reductions() -> CompareError {
    CompareError::Record("the comparison of the reductions stopped before its end".into())
}

/// Runs `job` on the pool the reductions run on, beside the walk ([`walk_steps`]): their
/// parallel loops share its threads, not the walk's, whose thread may be waiting for them.
/// On the calling thread when the pool cannot be made.
fn on_reductions_pool<R: Send>(job: impl FnOnce() -> R + Send) -> R {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    let pool = POOL.get_or_init(|| crate::trace::side_pool("ttrace-reduce", "on their own thread"));
    match pool {
        Some(pool) => pool.install(job),
        None => job(),
    }
}

/// The walk over the reference's ops of `steps`, telling the reductions (`tell`) where it
/// placed each step's GEMM outputs once it is done with the step.
fn walk_ops(
    p: &Prepared,
    opts: &CompareOptions,
    steps: &[u64],
    progress: &mut dyn FnMut(u64, u64),
    tell: std::sync::mpsc::Sender<reductions::Walked>,
) -> Result<Walked, CompareError> {
    let budget = crate::results::results_budget(opts.memory.unwrap_or(DEFAULT_MEMORY));
    let mut walk = Walk::new(p, budget);
    let base_warnings = std::mem::take(&mut walk.warnings);
    let ops: Vec<(&RefOp, &Vec<(u32, u64)>)> =
        p.al.of_ref
            .iter()
            .filter(|(op, _)| steps.contains(&op.0))
            .collect();
    let total_ops = ops.len() as u64;
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
    // The windows being decoded while the one before them is compared; where the current
    // one ends (`fetched`) and where the last one started ends (`planned`).
    let mut queue: std::collections::VecDeque<crate::prefetch::Ahead> =
        std::collections::VecDeque::new();
    let (mut fetched, mut planned) = (0, 0);
    for (done, (&ref_op, shards)) in ops.into_iter().enumerate() {
        if done == fetched {
            let current = match queue.pop_front() {
                Some(w) => w,
                None => {
                    let w = ahead.start(&plan[planned..], window);
                    planned += w.covered;
                    w
                }
            };
            fetched = done + ahead.install(current);
            while queue.len() < crate::prefetch::WINDOWS_AHEAD && planned < plan.len() {
                let w = ahead.start(&plan[planned..], window);
                planned += w.covered;
                queue.push_back(w);
            }
        }
        progress(done as u64, total_ops);
        if current != Some(ref_op.0) {
            // A step is judged from that step alone (see [`Memory`]).
            if let Some(step) = current {
                if !walk.end_step(step, &tell)? {
                    // The reductions stopped on an error: what walk_steps reports.
                    break;
                }
            }
            current = Some(ref_op.0);
            walk.placer.start_step();
            // The next step's records, read while this one is compared (when they do not
            // all fit the metadata budget).
            if let Some(&next) = steps.iter().find(|&&s| s > ref_op.0) {
                p.reff.read_ahead(next);
                p.run.read_ahead(next);
                if let Some(pt) = &p.pert {
                    pt.read_ahead(next);
                }
            }
        }
        let depth = p.gemm_ordinal.get(&ref_op).copied().unwrap_or(0);
        walk.op(ref_op, shards, depth)?;
    }
    if let Some(step) = current {
        let _ = walk.end_step(step, &tell)?;
    }
    // A receiver gone means the reductions stopped: their join says why.
    let _ = tell.send(reductions::Walked::Done);
    progress(total_ops, total_ops);
    tracing::debug!("compare: walk done");
    p.reff
        .set_increments_ahead(crate::trace::IncrementsAhead::None);
    p.run
        .set_increments_ahead(crate::trace::IncrementsAhead::None);
    // The perturbed reference is not read again.
    if let Some(pt) = &p.pert {
        pt.release_decoded();
    }
    Ok(Walked {
        pending: walk.pending,
        base_warnings,
        warnings: walk.warnings,
        unjudged: walk.unjudged,
        eps: walk.eps,
        dp_reduction: None,
        jumps: walk.jumps,
        chaotic: walk.chaotic,
    })
}

/// The comparisons of a walk (or of merged partitions), before they are ordered.
struct Found {
    pending: Results,
    warnings: Vec<String>,
    not_comparable: Vec<crate::report::NotComparable>,
    eps: f64,
    /// The scale data-parallel reductions were held to (`None`: none was seen).
    dp_reduction: Option<gradscale::Decision>,
    /// Each step's largest round-off jump, in step order.
    jumps: Vec<RoundoffJump>,
    /// The chaotic steps, in step order.
    chaotic: Vec<ChaoticStep>,
}

/// Orders the comparisons of `steps`, localizes the first divergence and assembles the
/// report; `(bytes, elapsed_s)` are what was read and how long it took.
fn finish(
    p: &Prepared,
    steps: &[u64],
    found: Found,
    read: (u64, f64),
) -> Result<CompareReport, CompareError> {
    finish_with_entries(p, steps, found, read, None)
}

/// [`finish`], setting `entries`, when given, to what a partial report keeps of each
/// comparison (in the order of the report's tensors; those of spilled comparisons left in the
/// spill files, [`crate::partition::PendingList`]).
fn finish_with_entries(
    p: &Prepared,
    steps: &[u64],
    found: Found,
    (bytes, elapsed_s): (u64, f64),
    entries: Option<&mut crate::partition::PendingList>,
) -> Result<CompareReport, CompareError> {
    let Found {
        pending,
        mut warnings,
        not_comparable,
        eps,
        dp_reduction,
        jumps,
        chaotic,
    } = found;
    if let Some(line) = jumps_warning(&jumps) {
        warnings.push(line);
    }
    if let Some(line) = chaos_warning(&chaotic) {
        warnings.push(line);
    }
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
    let sorted = pending.into_sorted()?;
    let n = sorted.len();
    let first = (0..n).find(|&i| sorted.diverged(i));
    let first_divergence = match first {
        Some(i) => {
            let last_good = localize::last_good(i, |j| sorted.key(j), |j| sorted.diverged(j));
            let last_good = match last_good {
                Some(j) => Some((j, sorted.read(j)?.cmp)),
                None => None,
            };
            let diverged = sorted.read(i)?;
            let at = (i, &diverged, last_good.as_ref().map(|(j, t)| (*j, t)));
            Some(localize::localize(&p.reff, p.ref_rank, &p.run, at, &p.al)?)
        }
        None => None,
    };
    let mut worst: Vec<usize> = (0..n).collect();
    worst.sort_by(|&a, &b| sorted.ratio(b).total_cmp(&sorted.ratio(a)));
    worst.truncate(10);
    let named: Vec<usize> = first_divergence
        .iter()
        .flat_map(|d| std::iter::once(d.tensor).chain(d.last_good))
        .chain(worst.iter().copied())
        .collect();
    // Moved, not copied: the results are the largest thing a comparison of many steps holds;
    // those spilled stay in the files the walk and the reductions wrote them to.
    let tensors = sorted.into_tensors(entries, named)?;
    tracing::debug!(
        spilled = tensors.is_spilled(),
        "compare: ordered and localized"
    );
    let replica_drift = crate::replicas::drift(&p.signature_ordinal, &p.run, &tensors)?;
    tracing::debug!("compare: replica drift looked for");
    let summary = |t: &RunTrace| RunSummary {
        path: t.path.display().to_string(),
        run_id: t.manifest.run_id.clone(),
        command: t.manifest.command.join(" "),
        world_size: t.ranks().len() as u32,
    };
    let stats = stats(p, steps, tensors.len(), (bytes, elapsed_s));
    let stores = p.stores();
    // Records read at opening that could not be read again (their segment changed since):
    // said with the rest of what could not be read, and counted as a capture's losses.
    for (_, t) in &stores {
        warnings.extend(t.late_unreadable().into_iter().map(|(line, _)| line));
    }
    let capture_losses = crate::losses::of_stores(&stores, steps);
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
        roundoff_jumps: jumps,
        chaotic_steps: chaotic,
        capture_losses,
        stats,
    })
}

/// The report's line on the steps whose perturbed reference showed round-off jumps, if any.
fn jumps_warning(jumps: &[RoundoffJump]) -> Option<String> {
    let first = jumps.first()?;
    let largest = jumps.iter().map(|j| j.floor_eps).fold(0f64, f64::max);
    let num = crate::report::text::fmt_num;
    Some(format!(
        "the perturbed reference shows round-off turned into jumps of a few elements in {}, \
         from step {} ({}: {} eps, {:.0}% of it in {} of {} elements): every tensor of such \
         a step is held to at least {}x its step's largest jump (up to {} eps), since where a \
         jump lands is chance (typical of Adam with a small epsilon; docs/compare.md, \
         section 4)",
        crate::report::text::plural(jumps.len() as u64, "step"),
        first.step,
        first.tensor,
        num(first.error_eps),
        100.0 * first.top_share,
        tolerance::JUMP_ELEMENTS,
        first.elements,
        tolerance::ALPHA,
        num(largest)
    ))
}

/// The report's line on the chaotic steps, if any.
fn chaos_warning(chaotic: &[ChaoticStep]) -> Option<String> {
    let first = chaotic.first()?;
    let worst = chaotic
        .iter()
        .max_by(|a, b| a.relative_error.total_cmp(&b.relative_error))?;
    Some(format!(
        "round-off alone (the perturbed reference) moves a tensor by {:.0}% of its size or \
         more in {}, from step {} ({}: {:.0}%; the most, {:.0}% in step {}): this training \
         amplifies round-off that far, so tolerances there are as wide, and a divergence from \
         step {} on may be round-off that one perturbed reference did not happen to show. \
         Compare the steps before it for a verdict that rests on round-off (--steps), or \
         trace at a lower learning rate (docs/compare.md, section 4)",
        100.0 * tolerance::CHAOTIC,
        crate::report::text::plural(chaotic.len() as u64, "step"),
        first.step,
        first.tensor,
        100.0 * first.relative_error,
        100.0 * worst.relative_error,
        worst.step,
        first.step
    ))
}

/// What was compared and read: ops, aligned GEMMs, tensors, bytes and time.
fn stats(
    p: &Prepared,
    steps: &[u64],
    tensors: usize,
    (bytes, elapsed_s): (u64, f64),
) -> CompareStats {
    CompareStats {
        reference_ops: steps
            .iter()
            .map(|&s| p.reff.record_count(p.ref_rank, s))
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
        tensors_compared: tensors as u64,
        bytes_compared: bytes,
        elapsed_s,
    }
}

/// The walk over the reference's ops in execution order, and what it found.
struct Walk<'a> {
    reff: &'a RunTrace,
    run: &'a RunTrace,
    pert: Option<&'a RunTrace>,
    ref_rank: u32,
    precision: Precision,
    eps: f64,
    placer: Placer,
    /// Placement of each run GEMM's D (for the collectives that reduce it).
    d_place: BTreeMap<(u32, u64, u64), (Placement, f32)>,
    /// Tolerance of each reference GEMM's D.
    d_tol: BTreeMap<RefOp, f64>,
    pending: Results,
    unjudged: Unjudged,
    warnings: Vec<String>,
    /// Every rank of the world is in the store (shards must then tile the reference).
    whole: bool,
    /// The run's layout (ranks' coordinates).
    layout: LayoutSummary,
    /// Where the perturbed reference measures the drift over the steps ([`crate::twin`]).
    twin: crate::twin::Reach,
    /// The comparisons of the step being walked: judged once the step is done, when its
    /// largest round-off jump is known ([`Walk::end_step`]).
    step_results: Vec<Pending>,
    /// The largest round-off jump of the step being walked so far.
    step_jump: Option<RoundoffJump>,
    /// Each walked step's largest round-off jump.
    jumps: Vec<RoundoffJump>,
    /// The perturbed reference's largest relative error of the step being walked so far.
    step_drift: Option<ChaoticStep>,
    /// The walked steps whose largest is at least [`tolerance::CHAOTIC`].
    chaotic: Vec<ChaoticStep>,
}

impl<'a> Walk<'a> {
    /// A walk over `p`, holding at most `results_budget` bytes of its results in memory
    /// ([`crate::results`]).
    fn new(p: &'a Prepared, results_budget: u64) -> Walk<'a> {
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
        warnings.extend(p.reff.capture_warnings("reference"));
        warnings.extend(p.run.capture_warnings("run"));
        if let Some(pt) = &p.pert {
            warnings.extend(pt.capture_warnings("perturbed"));
        }
        let twin = p
            .pert
            .as_ref()
            .map(|pt| crate::twin::Reach::of(&p.reff, pt, p.ref_rank))
            .unwrap_or_default();
        warnings.extend(twin.warnings.iter().cloned());
        Walk {
            reff: &p.reff,
            run: &p.run,
            pert: p.pert.as_ref(),
            ref_rank: p.ref_rank,
            precision: p.precision,
            eps: p.precision.epsilon(),
            placer: Placer::new(p.precision.epsilon(), &p.layout),
            d_place: BTreeMap::new(),
            d_tol: BTreeMap::new(),
            pending: Results::new(results_budget),
            unjudged: Unjudged::default(),
            warnings,
            whole: missing.is_empty(),
            layout: p.layout.clone(),
            twin,
            step_results: Vec::new(),
            step_jump: None,
            jumps: Vec::new(),
            step_drift: None,
            chaotic: Vec::new(),
        }
    }

    /// Ends `step`: its comparisons are judged (a tolerance below the step's round-off jump
    /// floor raised to it, [`tolerance::jump_floor`]) and kept, and the reductions told where
    /// the walk placed its GEMM outputs and their tolerances; false when they stopped (an
    /// error, which their join says: the walk need not go on).
    fn end_step(
        &mut self,
        step: u64,
        tell: &std::sync::mpsc::Sender<reductions::Walked>,
    ) -> Result<bool, CompareError> {
        if let Some(c) = self.step_drift.take() {
            if c.relative_error >= tolerance::CHAOTIC {
                self.chaotic.push(c);
            }
        }
        let floor = self.step_jump.take().map(|j| {
            let floor = j.floor_eps;
            self.jumps.push(j);
            floor
        });
        for mut p in std::mem::take(&mut self.step_results) {
            if let Some(floor) = floor {
                raise_to(&mut p, floor);
            }
            self.pending.push(p)?;
        }
        let mut d_tol = std::mem::take(&mut self.d_tol);
        if let Some(floor) = floor {
            for t in d_tol.values_mut() {
                *t = t.max(floor);
            }
        }
        Ok(tell
            .send(reductions::Walked::Step {
                step,
                d_place: std::mem::take(&mut self.d_place),
                d_tol,
            })
            .is_ok())
    }

    /// The least tolerance the step's round-off jumps found so far set, in epsilon.
    fn floor_so_far(&self) -> f64 {
        self.step_jump.as_ref().map_or(0.0, |j| j.floor_eps)
    }

    /// Notes the perturbed reference's relative error `rel` on the tensor `role` of
    /// `ref_rec` when it is the step's largest so far.
    fn note_drift(&mut self, ref_rec: &Record, role: Role, rel: f64) {
        if !rel.is_finite()
            || self
                .step_drift
                .as_ref()
                .is_some_and(|d| d.relative_error >= rel)
        {
            return;
        }
        self.step_drift = Some(ChaoticStep {
            step: ref_rec.step,
            tensor: format!("{} {role:?}", tensor_name(ref_rec)),
            relative_error: rel,
        });
    }

    /// Notes the perturbed reference's error `e` on the tensor `role` of `ref_rec` when it
    /// is a jump larger than the step's so far.
    fn note_jump(&mut self, ref_rec: &Record, role: Role, e: &tolerance::PerturbedError) {
        if !e.is_jump() {
            return;
        }
        let error_eps = e.rel / self.eps;
        if self
            .step_jump
            .as_ref()
            .is_some_and(|j| j.error_eps >= error_eps)
        {
            return;
        }
        self.step_jump = Some(RoundoffJump {
            step: ref_rec.step,
            tensor: format!("{} {role:?}", tensor_name(ref_rec)),
            error_eps,
            top_share: e.top_share,
            elements: e.elements as u64,
            floor_eps: tolerance::jump_floor(error_eps),
        });
    }

    /// Compares the tensors of one reference op (A, B, then D) with their shards.
    fn op(&mut self, ref_op: RefOp, shards: &[(u32, u64)], depth: u64) -> Result<(), CompareError> {
        let (step, ref_seq) = ref_op;
        let Some(ref_rec) = self.reff.record(self.ref_rank, step, ref_seq) else {
            return Ok(());
        };
        let ref_rec = &*ref_rec;
        // Errors of this op's inputs (within their tolerance) propagate into its output.
        let mut input_error = 0f64;
        for (sub, role) in [Role::A, Role::B, Role::D].into_iter().enumerate() {
            let Some((ref_vals, cancelled)) = operand(self.reff, ref_rec, role, true)? else {
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

    /// The tolerance of a reference tensor ([`tolerance::Terms::for_tensor`]).
    fn tolerance(
        &mut self,
        ref_rec: &Record,
        role: Role,
        ref_vals: &Values,
        depth: u64,
        cancelled: f64,
        input_error: f64,
    ) -> Result<Tolerance, CompareError> {
        let increment = role == Role::D && gemm(ref_rec).is_some_and(accumulates);
        let at = tolerance::TensorAt {
            precision: self.precision,
            dtype: ref_vals.dtype,
            depth,
            step: ref_rec.step,
            perturbed_reference: self.pert.is_some(),
            drift_measured: self.twin.measures(ref_rec.step),
            increment: increment.then_some(cancelled),
            output_of: (role == Role::D).then_some(input_error),
        };
        let pert_rec = self.pert.filter(|_| at.reads_perturbed()).and_then(|p| {
            p.record(self.ref_rank, ref_rec.step, ref_rec.seq)
                .filter(|r| r.api == ref_rec.api)
                .map(|r| (p, r))
        });
        let perturbed = match pert_rec {
            Some((p, rec)) => tolerance::perturbed_error(
                p,
                &rec,
                role,
                ref_vals,
                tolerance::JUMP_MIN_EPS * self.eps,
            )?,
            None => None,
        };
        if let Some(e) = &perturbed {
            self.note_jump(ref_rec, role, e);
            self.note_drift(ref_rec, role, e.rel);
        }
        Ok(tolerance::Terms::for_tensor(at, perturbed.map(|e| e.rel)).tolerance())
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
        tol: Tolerance,
    ) -> Result<Option<f64>, CompareError> {
        let step = ref_op.0;
        let mut placed = self.placer.place_shards(
            self.run,
            (step, ref_rec),
            shards,
            (sub, role),
            ref_vals,
            tol,
            (&mut self.unjudged, &mut self.warnings),
        )?;
        if placed.results.is_empty() {
            return Ok(None);
        }
        let eps = self.eps;
        let beyond = |p: &Placing| p.results.iter().any(|s| tol.exceeded_by(s.err.rel, eps));
        let partial = matches!(role, Role::D | Role::CIn);
        let mut merge_group = 1u32;
        // Partial results before a reduction: the reference is the sum over a group. Tried
        // beyond the tolerance, and where a shard fits its slice loosely and falls short of
        // it in norm as part of a sum does: under FP8 an output's tolerance takes its inputs'
        // quantization errors (tens of epsilon), and a column-parallel layer's partial input
        // gradient passed for the reference's (0.68 relative error, norm ratio 0.71, within
        // its 91.6 eps) while the sum of its group fits at a seventh of that. A complete
        // result with an independent error e is longer than the reference (norm ratio^2
        // about 1 + e^2); a partial one, the reference less the other parts, is shorter
        // (about 1 - e^2): taken for part of a sum below 1 - e^2 / 2, and at least a tenth
        // short (an error correlated with the values moves a complete result's norm too). A
        // sum is taken only where it fits at least twice as well ([`combine::sum_groups`]).
        let part_of_a_sum = |p: &Placing| {
            let accept = tol.sum_accept(eps, ref_vals.dtype);
            p.results.iter().any(|s| {
                let (e, n) = (s.err.rel, s.err.norm_ratio);
                e > accept && n * n < (1.0 - 0.5 * e * e).min(0.9)
            })
        };
        if partial && !placed.all_known && (beyond(&placed) || part_of_a_sum(&placed)) {
            let at = (step, shards, sub);
            merge_group = self.placer.sums(self.run, at, ref_vals, tol, &mut placed);
        }
        // A partial result whose group partners were not captured cannot be summed: not
        // comparable, rather than a divergence made of missing data.
        if partial
            && merge_group == 1
            && (beyond(&placed) || part_of_a_sum(&placed))
            && shards
                .iter()
                .any(|&(rank, _)| combine::partners_missing(self.run, rank, step))
        {
            if let Some(rec) = shards
                .first()
                .and_then(|&(r, q)| self.run.record(r, step, q))
            {
                self.unjudged.note(
                    "a partial result (before its reduction) whose group partners were not \
                     captured (--ranks, or ranks missing from the store)",
                    &rec,
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
            self.placer.cover(&self.layout, &mut placed, ref_vals);
        }
        let merge = placed
            .place_of
            .first()
            .map(|(_, _, p, _)| p.merge(&ref_vals.shape, merge_group))
            .unwrap_or(Merge::Replicated);
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
        // Beyond even the floor of the step's jumps found so far: the step's verdict is
        // settled (its later tensors are placed as cheaply as possible).
        self.placer.settled |=
            cmp.diverged && (placed.param_note.is_some() || cmp.error_eps > self.floor_so_far());
        self.step_results.push(Pending {
            key: (step, ref_op.1, sub as u32),
            shards: placed.results.iter().map(|s| (s.rank, s.seq)).collect(),
            cmp,
            ref_op,
            is_collective: false,
            param_note: placed.param_note,
        });
        Ok(Some(error))
    }
}

/// A reference record as the report's round-off lines name it: its NVTX path, or its API and
/// seq.
fn tensor_name(rec: &Record) -> String {
    if rec.nvtx.is_empty() {
        format!("{} seq {}", rec.api, rec.seq)
    } else {
        rec.nvtx.join("/")
    }
}

/// Raises the tolerance of comparison `p` to `floor` (epsilon) where it is lower, and judges
/// it again: a step's round-off jump bounds what round-off explains in every tensor of the
/// step ([`tolerance::jump_floor`]). A wrong scalar (`param_note`) stays a divergence.
fn raise_to(p: &mut Pending, floor: f64) {
    let cmp = &mut p.cmp;
    if cmp.tolerance_eps >= floor {
        return;
    }
    cmp.tolerance_eps = floor;
    cmp.tolerance_source = tolerance::JUMP_SOURCE.into();
    cmp.diverged = p.param_note.is_some() || cmp.error_eps > floor;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_a_partition_could_not_read_again_make_the_merged_run_incomplete() {
        let mut report = crate::report::text::tests::sample(crate::report::Verdict::Match);
        report.capture_losses.clear();
        assert_eq!(report.exit_code(), 0);
        let line = "rank 1 step 5: its segment changed since the store was opened".to_string();
        add_late_unreadable(
            &mut report,
            vec![
                ("run".into(), line.clone(), 3),
                ("run".into(), line.clone(), 3),
            ],
        );
        assert_eq!(report.exit_code(), crate::losses::EXIT_INCOMPLETE);
        assert_eq!(report.warnings.iter().filter(|w| **w == line).count(), 1);
        assert_eq!(report.capture_losses.len(), 1);
        assert_eq!(
            (
                report.capture_losses[0].store.as_str(),
                report.capture_losses[0].unreadable
            ),
            ("run", 3)
        );
    }

    #[test]
    fn a_dp_reduction_scale_is_a_positive_number_dp_or_its_inverse() {
        assert_eq!(DpScale::parse("1/dp").map(|d| d.factor(4)), Ok(0.25));
        assert_eq!(DpScale::parse("dp").map(|d| d.factor(4)), Ok(4.0));
        assert_eq!(DpScale::parse(" 0.5 ").map(|d| d.factor(4)), Ok(0.5));
        assert!(DpScale::parse("-1").is_err());
        assert!(DpScale::parse("0").is_err());
        assert!(DpScale::parse("nan").is_err());
    }

    #[test]
    fn the_memory_budget_gives_the_run_twice_each_reference() {
        let (r, u, p) = mapping_budgets(1 << 30);
        assert_eq!((r, u, p), (1 << 27, 1 << 28, 1 << 27));
        assert!(
            r + u + p <= 1 << 29,
            "half the budget is for decoded tensors"
        );
    }
}
