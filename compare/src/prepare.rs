//! Preparing a comparison: the stores opened and checked against each other
//! ([`crate::validate`]), the steps chosen, the run aligned ([`crate::align`]) and its
//! layout given or discovered ([`crate::layout`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::align::{Alignment, RefOp};
use crate::engine::CompareOptions;
use crate::layout::{LayoutEvidence, LayoutSummary};
use crate::tolerance::Precision;
use crate::trace::{gemm, RunTrace};
use crate::CompareError;

/// The stores opened and checked against each other, the steps chosen, the run aligned.
pub(crate) struct Prepared {
    pub(crate) reff: RunTrace,
    pub(crate) run: RunTrace,
    pub(crate) pert: Option<RunTrace>,
    pub(crate) ref_rank: u32,
    pub(crate) steps: Vec<u64>,
    pub(crate) al: Alignment,
    pub(crate) precision: Precision,
    pub(crate) layout: LayoutSummary,
    /// Each reference GEMM's ordinal within its step, by (step, seq) (depth for the
    /// analytic bound).
    pub(crate) gemm_ordinal: BTreeMap<RefOp, u64>,
    /// Each reference GEMM's ordinal among those of its signature in its step
    /// ([`crate::replicas::signature_ordinals`]).
    pub(crate) signature_ordinal: BTreeMap<RefOp, u64>,
    /// Reference GEMMs whose accumulation buffer uncaptured code also wrote
    /// ([`crate::reductions::shared_buffers`]).
    pub(crate) shared_buffers: BTreeSet<RefOp>,
}

impl Prepared {
    /// The stores compared, by the name reports give them: the reference, the run and the
    /// perturbed reference when there is one.
    pub(crate) fn stores(&self) -> Vec<(&'static str, &RunTrace)> {
        let mut stores = vec![("reference", &self.reff), ("run", &self.run)];
        stores.extend(self.pert.as_ref().map(|p| ("perturbed", p)));
        stores
    }
}

/// Opens the stores, checks that they can be compared (one model, one precision, a
/// world-size-1 reference, a perturbed reference of the same command, a layout the
/// communicator map does not contradict), chooses the steps and aligns the run.
pub(crate) fn prepare(
    reff_path: &Path,
    run_path: &Path,
    opts: &CompareOptions,
) -> Result<Prepared, CompareError> {
    // The stores are read at once (each on every core, by segment): a reference has few
    // segments, too few to keep the cores busy alone. Errors are said in this order.
    let (ref_kept, run_kept, pert_kept) =
        crate::engine::metadata_budgets(opts.memory.unwrap_or(crate::engine::DEFAULT_MEMORY));
    let ((reff, run), pert) = rayon::join(
        || {
            rayon::join(
                || RunTrace::open_within(reff_path, ref_kept),
                || RunTrace::open_within(run_path, run_kept),
            )
        },
        || {
            opts.perturbed
                .as_deref()
                .map(|p| RunTrace::open_within(p, pert_kept))
        },
    );
    let (reff, run, pert) = (reff?, run?, pert.transpose()?);
    let ref_rank = *reff
        .ranks()
        .first()
        .ok_or_else(|| CompareError::Empty(reff_path.display().to_string()))?;
    if run.ranks().is_empty() {
        return Err(CompareError::Empty(run_path.display().to_string()));
    }
    crate::validate::references(&reff, &run)?;
    let steps = choose_steps(&reff, &run, opts.steps.as_deref())?;
    let mut scan = StepScan::of(&reff, ref_rank, &run, pert.as_ref(), &steps);
    let precision = scan.ref_precision;
    crate::validate::precisions(&reff, &run, precision, scan.run_precision)?;
    if let Some(p) = &pert {
        let theirs = scan.pert_precision.unwrap_or(Precision::Fp32);
        crate::validate::perturbed(&reff, p, precision, theirs, scan.pert_differs)?;
    }
    crate::validate::same_model(&reff, &run, &scan.al, scan.ref_gemms, scan.run_gemms)?;
    let al = std::mem::take(&mut scan.al);
    let layout = match &opts.layout {
        Some(l) => {
            let evidence = std::mem::take(&mut scan.layout);
            crate::layout::validate(l, &run, &al, evidence).map_err(CompareError::Invalid)?;
            l.clone()
        }
        None if run.world_size() > 1 && !run.has_collectives() => {
            return Err(CompareError::Invalid(format!(
                "{} holds no collectives (captured without the nccl family?): its layout \
                 cannot be read from the trace; give it with --layout (e.g. tp=2,dp=2)",
                run.path.display()
            )));
        }
        None => crate::layout::conclude(&run, &al, std::mem::take(&mut scan.layout)),
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
        gemm_ordinal: scan.gemm_ordinal,
        signature_ordinal: scan.signature_ordinal,
        shared_buffers: scan.shared_buffers,
    })
}

/// What one reading of each step's records finds for the checks of [`prepare`] and the
/// alignment: a step's records are read once, for all of them together, so that a store
/// whose records do not all fit the metadata budget ([`crate::records`]) is read through once
/// here instead of once per check.
struct StepScan {
    /// The reference's precision (its first rank's GEMMs).
    ref_precision: Precision,
    /// The run's (every rank's).
    run_precision: Precision,
    /// The perturbed reference's (every rank's), when there is one.
    pert_precision: Option<Precision>,
    /// The first step whose GEMMs differ between the reference and the perturbed one.
    pert_differs: Option<crate::validate::GemmsDiffer>,
    al: Alignment,
    /// GEMMs of the reference's first rank and of every rank of the run, in the steps.
    ref_gemms: usize,
    run_gemms: usize,
    /// Every segment of the run's, the steps not compared included.
    layout: LayoutEvidence,
    /// [`Prepared::gemm_ordinal`] and [`Prepared::signature_ordinal`].
    gemm_ordinal: BTreeMap<RefOp, u64>,
    signature_ordinal: BTreeMap<RefOp, u64>,
    shared_buffers: BTreeSet<RefOp>,
}

impl StepScan {
    /// Reads `steps` once, a step at a time, then the run's segments of other steps (for
    /// its layout) if there are any.
    fn of(
        reff: &RunTrace,
        ref_rank: u32,
        run: &RunTrace,
        pert: Option<&RunTrace>,
        steps: &[u64],
    ) -> StepScan {
        let mut scan = StepScan {
            ref_precision: Precision::Fp32,
            run_precision: Precision::Fp32,
            pert_precision: pert.map(|_| Precision::Fp32),
            pert_differs: None,
            al: Alignment::start(run),
            ref_gemms: 0,
            run_gemms: 0,
            layout: LayoutEvidence::default(),
            gemm_ordinal: BTreeMap::new(),
            signature_ordinal: BTreeMap::new(),
            shared_buffers: BTreeSet::new(),
        };
        let ranks = run.ranks();
        for (n, &step) in steps.iter().enumerate() {
            // The next step's records, read while this one is looked at (when they do not
            // all fit the metadata budget).
            if let Some(&next) = steps.get(n + 1) {
                reff.read_ahead(next);
                run.read_ahead(next);
                if let Some(p) = pert {
                    p.read_ahead(next);
                }
            }
            let recs = reff.records(ref_rank, step);
            scan.ref_precision = scan.ref_precision.narrower(Precision::of_records(&recs));
            scan.ref_gemms += recs.iter().filter_map(gemm).count();
            let gemms = recs.iter().filter(|r| gemm(r).is_some());
            for (n, r) in gemms.enumerate() {
                scan.gemm_ordinal.insert((step, r.seq), n as u64);
            }
            crate::replicas::signature_ordinals(step, &recs, &mut scan.signature_ordinal);
            crate::reductions::shared_buffers(step, &recs, &mut scan.shared_buffers);
            for &rank in &ranks {
                let recs = run.records(rank, step);
                scan.run_precision = scan.run_precision.narrower(Precision::of_records(&recs));
                scan.run_gemms += recs.iter().filter_map(gemm).count();
                scan.layout.observe(&recs);
            }
            if let Some(p) = pert {
                for rank in p.ranks() {
                    let q = Precision::of_records(&p.records(rank, step));
                    scan.pert_precision = scan.pert_precision.map(|had| had.narrower(q));
                }
                if scan.pert_differs.is_none() {
                    scan.pert_differs = crate::validate::perturbed_step(reff, p, step);
                }
            }
            scan.al.align_step(reff, run, step);
        }
        for (rank, step) in run.segment_keys() {
            if steps.binary_search(&step).is_err() {
                scan.layout.observe(&run.records(rank, step));
            }
        }
        scan
    }
}

/// The steps to compare: those both stores hold on every rank, within `want` (inclusive
/// ranges) when given. Never proportional to the ranges' width: a range is only a filter.
pub(crate) fn choose_steps(
    reff: &RunTrace,
    run: &RunTrace,
    want: Option<&[(u64, u64)]>,
) -> Result<Vec<u64>, CompareError> {
    steps_within(&reff.steps(), &run.steps(), want)
}

/// [`choose_steps`] over the steps the reference (`ref_steps`) and the run (`run_steps`)
/// hold, each sorted.
pub(crate) fn steps_within(
    ref_steps: &[u64],
    run_steps: &[u64],
    want: Option<&[(u64, u64)]>,
) -> Result<Vec<u64>, CompareError> {
    let mut steps: Vec<u64> = ref_steps
        .iter()
        .copied()
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
                    held(ref_steps),
                    held(run_steps)
                )));
            }
        }
        steps.retain(|s| want.iter().any(|&(a, b)| (a..=b).contains(s)));
    }
    if steps.is_empty() {
        return Err(CompareError::Steps(format!(
            "no step to compare (the reference holds {}, the run {}{})",
            held(ref_steps),
            held(run_steps),
            if want.is_some() {
                ", within --steps"
            } else {
                ""
            }
        )));
    }
    Ok(steps)
}

/// The error when no tensor could be compared.
pub(crate) fn nothing_aligned(p: &Prepared, reff_path: &Path, run_path: &Path) -> CompareError {
    CompareError::NothingAligned(format!(
        "no GEMM of {} could be aligned with one of {} ({} unaligned): are they the same \
         model, data and steps?",
        run_path.display(),
        reff_path.display(),
        p.al.unaligned,
    ))
}

/// Bytes read from the stores so far.
pub(crate) fn bytes_read(p: &Prepared) -> u64 {
    p.reff.bytes_read() + p.run.bytes_read() + p.pert.as_ref().map_or(0, |p| p.bytes_read())
}

/// How much work a step is, for splitting the steps among partitions: the bytes of the
/// tensors its records hold in the reference and in the run (from the stores' metadata).
pub(crate) fn step_weight(p: &Prepared, step: u64) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_compared_are_those_both_runs_hold_within_the_ranges_asked() {
        assert_eq!(
            steps_within(&[0, 1, 2, 3], &[1, 2, 3, 4], None).ok(),
            Some(vec![1, 2, 3])
        );
        let want = [(0, 1), (3, 3)];
        assert_eq!(
            steps_within(&[0, 1, 2, 3], &[1, 2, 3], Some(&want)).ok(),
            Some(vec![1, 3])
        );
    }

    #[test]
    fn a_huge_range_is_a_filter_not_an_allocation() {
        let want = [(0, u64::MAX)];
        assert_eq!(
            steps_within(&[5, 6], &[5, 6], Some(&want)).ok(),
            Some(vec![5, 6])
        );
    }

    #[test]
    fn a_single_step_that_is_not_in_both_runs_is_refused_saying_what_they_hold() {
        let e = steps_within(&[0, 1, 2], &[1, 2], Some(&[(0, 0)]))
            .expect_err("step 0 is only in the reference")
            .to_string();
        assert!(e.contains("step 0 is not in both runs"), "{e}");
        assert!(
            e.contains("the reference holds steps 0-2, the run steps 1-2"),
            "{e}"
        );
        let e = steps_within(&[0], &[1], None)
            .expect_err("nothing in common")
            .to_string();
        assert!(e.starts_with("no step to compare"), "{e}");
    }
}
