//! Preparing a comparison: the stores opened and checked against each other
//! ([`crate::validate`]), the steps chosen, the run aligned ([`crate::align`]) and its
//! layout given or discovered ([`crate::layout`]).

use std::collections::BTreeMap;
use std::path::Path;

use crate::align::{self, Alignment, RefOp};
use crate::engine::CompareOptions;
use crate::layout::LayoutSummary;
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
    let ((reff, run), pert) = rayon::join(
        || rayon::join(|| RunTrace::open(reff_path), || RunTrace::open(run_path)),
        || opts.perturbed.as_deref().map(RunTrace::open),
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

/// The ordinal of every reference GEMM within its step (depth for the analytic bound).
pub(crate) fn gemm_ordinals(reff: &RunTrace, rank: u32, steps: &[u64]) -> BTreeMap<RefOp, u64> {
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
