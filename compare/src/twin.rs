//! Whether a perturbed reference's perturbation reached the GEMMs it was meant to disturb
//! (docs/compare.md, section 4, "Steps").
//!
//! A perturbed reference (`ttrace run --perturb`) flips the last mantissa bit of about half
//! the elements of every F32, F16 and BF16 GEMM output, so each of those outputs differs from
//! the reference's, and so does everything downstream. Its drift over the steps then measures
//! how far one rounding per GEMM carries, and compare leaves out the modelled step drift.
//! But a twin may leave GEMMs alone: before the perturbation was recorded into CUDA graphs,
//! every replayed GEMM ran unperturbed, and where every GEMM is graphed the twin was the
//! reference bit for bit: it measured no drift at all, and a correct run was reported diverged
//! once its weights had drifted for enough steps (a graphed tp2 fixture trainer, FP32: at step
//! 89 of 120). Graphed GEMMs past the staging budget are still left alone, and the wrong store
//! may be given.
//!
//! What is read is the data, never how the twin was made: a GEMM output of the twin that holds
//! exactly the reference's bytes (same length and CRC-32) was neither perturbed nor reached by
//! any perturbation upstream. A perturbed output differs in about half its nonzero finite
//! elements (one with `m` of them stays identical with probability `2^-m`), so an output of
//! [`MIN_ELEMENTS`] elements or more, not all zero, is taken for unperturbed by chance only
//! when nearly all its elements are zero or non-finite; the cost of that error is a tolerance
//! as without a twin, never a tighter one. From the first step holding such an output on, the
//! twin's drift is not taken
//! for a measurement (the steps' drift is modelled as without a twin); before it, it is.
//! Metadata only (records' CRC-32s): every partition of a comparison decides the same.

use std::collections::BTreeSet;

use ttrace_format::dtype::DType;
use ttrace_format::record::{Record, Role, Tensor};

use crate::trace::{gemm, RunTrace};

/// Where a perturbed reference measures the drift over the steps, and what the report says
/// where it does not.
#[derive(Debug, Clone, Default)]
pub struct Reach {
    /// The first step whose GEMM outputs it left alone ([`unperturbed`]).
    unperturbed_from: Option<u64>,
    /// Reference steps it holds no records of ([`missing_steps`]).
    missing: BTreeSet<u64>,
    /// The report's warnings about it.
    pub warnings: Vec<String>,
}

impl Reach {
    /// Assesses the twin `pert` of `reff` (rank `rank` of both).
    pub fn of(reff: &RunTrace, pert: &RunTrace, rank: u32) -> Reach {
        let mut warnings = Vec::new();
        if pert.manifest.config.perturb.is_none() {
            warnings.push(format!(
                "--perturbed {} was not run with ttrace run --perturb (its manifest names no \
                 seed): where it equals the reference it measures nothing",
                pert.path.display()
            ));
        }
        let left = unperturbed(reff, pert, rank);
        warnings.extend(left.as_ref().map(Unperturbed::warning));
        let missing = missing_steps(reff, pert, rank);
        warnings.extend(missing_warning(&missing));
        Reach {
            unperturbed_from: left.map(|u| u.first_step),
            missing: missing.into_iter().collect(),
            warnings,
        }
    }

    /// Whether the twin's own drift measures that of `step` (its perturbation reached every
    /// step up to it, and it holds that step).
    pub fn measures(&self, step: u64) -> bool {
        self.unperturbed_from.is_none_or(|s| step < s) && !self.missing.contains(&step)
    }
}

/// Elements a GEMM output needs for its twin's identical bytes to mean "not perturbed".
pub const MIN_ELEMENTS: u64 = 64;

/// GEMM outputs a perturbed reference left exactly as the reference computed them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unperturbed {
    /// The first step holding one: the twin measures the steps' drift only before it.
    pub first_step: u64,
    /// How many (all steps).
    pub outputs: u64,
    /// Of how many perturbable GEMM outputs both stores captured.
    pub of: u64,
}

impl Unperturbed {
    /// The report's warning.
    pub fn warning(&self) -> String {
        format!(
            "the perturbed reference left {} of {} GEMM outputs bit for bit as the reference \
             computed them, the first in step {} (not perturbed: see its run's exit log, or \
             not a perturbed run of the reference at all): from that step on its drift is not \
             a measurement, and the steps' drift is modelled as without a perturbed reference",
            self.outputs, self.of, self.first_step
        )
    }
}

/// The GEMM outputs of the twin `pert` that hold exactly the bytes of `reff`'s (rank `rank`
/// of both: single-device references), paired by step, seq and API; `None` when there is none.
fn unperturbed(reff: &RunTrace, pert: &RunTrace, rank: u32) -> Option<Unperturbed> {
    let mut found: Option<Unperturbed> = None;
    let mut of = 0u64;
    for step in reff.steps() {
        for rec in reff.records(rank, step).iter() {
            let Some(d) = perturbable_output(rec) else {
                continue;
            };
            let Some(twin) = pert
                .record(rank, step, rec.seq)
                .filter(|t| t.api == rec.api)
            else {
                continue;
            };
            let Some(td) = perturbable_output(&twin) else {
                continue;
            };
            of += 1;
            if td.nbytes == d.nbytes && td.crc32 == d.crc32 && d.crc32 != zeros_crc(d.nbytes) {
                let f = found.get_or_insert(Unperturbed {
                    first_step: step,
                    outputs: 0,
                    of: 0,
                });
                f.outputs += 1;
            }
        }
    }
    found.map(|f| Unperturbed { of, ..f })
}

/// The steps of `reff` (rank `rank`) the twin `pert` holds no records of (a twin that ran
/// fewer steps under the same command line, or died): it measures no drift there.
fn missing_steps(reff: &RunTrace, pert: &RunTrace, rank: u32) -> Vec<u64> {
    reff.steps()
        .into_iter()
        .filter(|&s| pert.records(rank, s).is_empty())
        .collect()
}

/// The report's warning for [`missing_steps`] (none when there are none).
fn missing_warning(steps: &[u64]) -> Option<String> {
    let (&first, &last) = (steps.first()?, steps.last()?);
    let which = if first == last {
        first.to_string()
    } else if steps.len() as u64 == last - first + 1 {
        format!("{first}-{last}")
    } else {
        let shown: Vec<String> = steps.iter().take(8).map(u64::to_string).collect();
        let more = if steps.len() > 8 { ", ..." } else { "" };
        format!("{}{more}", shown.join(", "))
    };
    Some(format!(
        "the perturbed reference holds no records of {} reference step(s) ({which}): there \
         the steps' drift is modelled as without a perturbed reference",
        steps.len()
    ))
}

/// The output of a GEMM record that a perturbed reference disturbs: its one captured D of
/// F32, F16 or BF16 of at least [`MIN_ELEMENTS`] elements.
fn perturbable_output(rec: &Record) -> Option<&Tensor> {
    gemm(rec)?;
    let mut outputs = rec.tensors.iter().filter(|t| t.role == Role::D);
    let d = outputs.next()?;
    let wide = matches!(d.dtype, DType::F32 | DType::F16 | DType::BF16);
    (outputs.next().is_none() && d.captured && wide && d.elements() >= MIN_ELEMENTS).then_some(d)
}

/// The CRC-32 of `n` zero bytes, in O(log n) combinations.
fn zeros_crc(n: u64) -> u32 {
    const BLOCK: u64 = 64;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[0u8; BLOCK as usize][..(n % BLOCK) as usize]);
    let mut power = crc32fast::Hasher::new();
    power.update(&[0u8; BLOCK as usize]);
    // The blocks are all zeros: their order does not matter.
    let mut blocks = n / BLOCK;
    while blocks > 0 {
        if blocks & 1 == 1 {
            crc.combine(&power);
        }
        let p = power.clone();
        power.combine(&p);
        blocks >>= 1;
    }
    crc.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_steps_are_named_as_a_range_or_a_list() {
        assert_eq!(missing_warning(&[]), None);
        let w = missing_warning(&[3, 4, 5]).unwrap_or_default();
        assert!(w.contains("3 reference step(s) (3-5)"), "{w}");
        let w = missing_warning(&[1, 3]).unwrap_or_default();
        assert!(w.contains("(1, 3)"), "{w}");
    }

    #[test]
    fn the_crc_of_zeros_is_that_of_the_bytes() {
        for n in [0u64, 1, 63, 64, 65, 1000, 4096, 100_003] {
            assert_eq!(
                zeros_crc(n),
                crc32fast::hash(&vec![0u8; n as usize]),
                "{n} bytes"
            );
        }
    }
}
