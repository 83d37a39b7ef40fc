//! Whether two stores (and a perturbed reference) can be compared at all: one line naming
//! the difference when they cannot (exit 2), instead of a divergence that only says the
//! inputs were not what `ttrace compare` needs.

use ttrace_format::record::GemmOp;

use crate::align::Alignment;
use crate::tolerance::Precision;
use crate::trace::{gemm, RunTrace};
use crate::CompareError;

/// The share of GEMMs without a counterpart above which two stores are not one model (a
/// few may fail to align in a correct run: a pipeline schedule the aligner reads partly).
const UNALIGNED_SHARE: f64 = 0.05;

/// The reference is the world-size-1 run; a reference of several ranks opposite a run of
/// one is most likely REF and RUN swapped.
pub fn references(reff: &RunTrace, run: &RunTrace) -> Result<(), CompareError> {
    let (rw, uw) = (reff.world_size(), run.world_size());
    if rw <= 1 {
        return Ok(());
    }
    Err(CompareError::Invalid(if uw == 1 {
        format!(
            "REF and RUN look swapped: the reference {} ran on {rw} ranks and the run {} on \
             one; the reference is the world-size-1 run (ttrace compare {} {})",
            reff.path.display(),
            run.path.display(),
            run.path.display(),
            reff.path.display()
        )
    } else {
        format!(
            "the reference {} ran on {rw} ranks: it must be a world-size-1 run",
            reff.path.display()
        )
    }))
}

/// REF and RUN compute in one precision (`theirs`: the run's, the narrowest operand type
/// over every rank's GEMMs).
pub fn precisions(
    reff: &RunTrace,
    run: &RunTrace,
    precision: Precision,
    theirs: Precision,
) -> Result<(), CompareError> {
    if theirs != precision {
        return Err(CompareError::Invalid(format!(
            "the reference {} computes in {} but the run {} in {}: compare runs of one precision",
            reff.path.display(),
            precision.name(),
            run.path.display(),
            theirs.name()
        )));
    }
    Ok(())
}

/// A GEMM's signature for telling models apart.
fn signature(g: &GemmOp) -> (u64, u64, u64, u64, u32, u32, u32, u32) {
    (
        g.m, g.n, g.k, g.batch, g.transa, g.transb, g.a_type, g.b_type,
    )
}

/// How a step's GEMMs differ between the reference and the perturbed reference: (the
/// step, the perturbed reference's GEMMs, the reference's).
pub type GemmsDiffer = (u64, usize, usize);

/// Whether the GEMMs of `step` differ between the reference and the perturbed reference
/// (each read on its first rank): in number or in shapes and types. A step the perturbed
/// reference holds no GEMM of is not compared.
pub fn perturbed_step(reff: &RunTrace, pert: &RunTrace, step: u64) -> Option<GemmsDiffer> {
    let (rr, pr) = (
        reff.ranks().first().copied()?,
        pert.ranks().first().copied()?,
    );
    let (ra, rb) = (reff.records(rr, step), pert.records(pr, step));
    let a: Vec<_> = ra.iter().filter_map(gemm).collect();
    let b: Vec<_> = rb.iter().filter_map(gemm).collect();
    let differs = !b.is_empty()
        && (a.len() != b.len() || a.iter().zip(&b).any(|(x, y)| signature(x) != signature(y)));
    differs.then_some((step, b.len(), a.len()))
}

/// The perturbed reference is the reference's command run again with `--perturb`: the same
/// precision (`theirs`: its own, over every rank's GEMMs), world size, GEMMs (`differs`: the first
/// step whose GEMMs differ, [`perturbed_step`]) and command line.
pub fn perturbed(
    reff: &RunTrace,
    pert: &RunTrace,
    precision: Precision,
    theirs: Precision,
    differs: Option<GemmsDiffer>,
) -> Result<(), CompareError> {
    let name = pert.path.display();
    if theirs != precision {
        return Err(CompareError::Invalid(format!(
            "--perturbed {name} computes in {} but the reference in {}: it must be the \
             reference's command run with ttrace run --perturb",
            theirs.name(),
            precision.name()
        )));
    }
    if pert.world_size() != reff.world_size() {
        return Err(CompareError::Invalid(format!(
            "--perturbed {name} ran on {} ranks but the reference on {}: it must be the \
             reference's command run with ttrace run --perturb",
            pert.world_size(),
            reff.world_size()
        )));
    }
    if let Some((s, b, a)) = differs {
        return Err(CompareError::Invalid(format!(
            "--perturbed {name} is another model: its GEMMs in step {s} differ from the \
             reference's ({b} against {a} GEMMs, or other shapes)"
        )));
    }
    let (ca, cb) = (&reff.manifest.command, &pert.manifest.command);
    let base = |c: &[String]| {
        c.first()
            .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
            .unwrap_or_default()
    };
    if base(ca) != base(cb) || ca.get(1..) != cb.get(1..) {
        let first = (0..ca.len().max(cb.len()))
            .find(|&i| ca.get(i) != cb.get(i))
            .unwrap_or(0);
        return Err(CompareError::Invalid(format!(
            "--perturbed {name} is not the reference's command: argument {first} is `{}` \
             there and `{}` in the reference",
            cb.get(first).map_or("", String::as_str),
            ca.get(first).map_or("", String::as_str)
        )));
    }
    Ok(())
}

/// REF and RUN train one model: almost every run GEMM (`run_gemms` of them, every rank's
/// in the steps compared) has a counterpart in the reference, and, when the run was captured
/// whole (every rank), almost every reference GEMM (`ref_gemms`) has one in the run.
pub fn same_model(
    reff: &RunTrace,
    run: &RunTrace,
    al: &Alignment,
    ref_gemms: usize,
    run_gemms: usize,
) -> Result<(), CompareError> {
    if al.of_ref.is_empty() {
        return Err(CompareError::NothingAligned(format!(
            "no GEMM of {} could be aligned with one of {} ({} unaligned): are they the same \
             model, data and steps?{}",
            run.path.display(),
            reff.path.display(),
            al.unaligned,
            al.warnings
                .first()
                .map(|w| format!(" (first problem: {w})"))
                .unwrap_or_default()
        )));
    }
    let share = |n: usize, of: usize| n as f64 > UNALIGNED_SHARE * of as f64;
    if share(al.unaligned as usize, run_gemms) {
        return Err(CompareError::Invalid(format!(
            "the run {} and the reference {} train different models: {} of the run's \
             {run_gemms} GEMMs have no counterpart in the reference",
            run.path.display(),
            reff.path.display(),
            al.unaligned
        )));
    }
    let missing = ref_gemms.saturating_sub(al.of_ref.len());
    if run.missing_ranks().is_empty() && share(missing, ref_gemms) {
        return Err(CompareError::Invalid(format!(
            "the run {} and the reference {} train different models: {missing} of the \
             reference's {ref_gemms} GEMMs have no counterpart in the run",
            run.path.display(),
            reff.path.display()
        )));
    }
    Ok(())
}
