//! One tensor's comparison: what is compared (a GEMM's operand, or the increment
//! `D - beta*C` of an accumulating GEMM), the shards' errors assembled into a
//! [`TensorComparison`], and what localization keeps beside it ([`Pending`]); what could not
//! be judged ([`Unjudged`]).

use std::collections::BTreeMap;

use ttrace_format::record::{Record, Role};

use crate::align::RefOp;
use crate::combine::Merge;
use crate::localize::describe;
use crate::placement::Shard;
use crate::report::{RankError, TensorComparison, WorstRow};
use crate::tolerance;
use crate::trace::{gemm, RunTrace, Values};
use crate::CompareError;

/// Sort key of a comparison in execution order: (step, reference seq, sub-order).
pub(crate) type Position = (u64, u64, u32);

#[derive(Clone)]
pub(crate) struct Pending {
    pub(crate) key: Position,
    pub(crate) cmp: TensorComparison,
    /// For localization: the run records (rank, step, seq) behind each shard.
    pub(crate) shards: Vec<(u32, u64)>,
    pub(crate) ref_op: RefOp,
    pub(crate) is_collective: bool,
    /// The op was called with other scalars than the reference's.
    pub(crate) param_note: Option<String>,
}

impl Pending {
    /// What a partial report keeps of a comparison besides the comparison itself.
    pub(crate) fn entry(&self) -> crate::partition::PendingEntry {
        crate::partition::PendingEntry {
            key: self.key,
            shards: self.shards.clone(),
            ref_op: self.ref_op,
            is_collective: self.is_collective,
            param_note: self.param_note.clone(),
        }
    }

    /// A comparison read back from a partial report.
    pub(crate) fn from_entry(cmp: TensorComparison, e: crate::partition::PendingEntry) -> Pending {
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

/// What could not be judged, by reason: how many tensors and the first op.
#[derive(Default)]
pub(crate) struct Unjudged(BTreeMap<&'static str, (u64, String)>);

impl Unjudged {
    pub(crate) fn note(&mut self, reason: &'static str, rec: &Record) {
        let e = self.0.entry(reason).or_insert_with(|| (0, describe(rec)));
        e.0 += 1;
    }

    /// Adds what `other` could not judge (its first op where this has none for a reason).
    pub(crate) fn absorb(&mut self, other: Unjudged) {
        for (reason, (n, first)) in other.0 {
            self.0.entry(reason).or_insert((0, first)).0 += n;
        }
    }

    pub(crate) fn into_report(self) -> Vec<crate::report::NotComparable> {
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

#[allow(clippy::too_many_arguments)]
pub(crate) fn comparison(
    rec: &Record,
    role: Role,
    ref_vals: &Values,
    results: &[Shard],
    merge: Merge,
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
        diverged: tol.exceeded_by(worst_shard, eps),
    }
}

pub(crate) fn nvtx_path(rec: &Record) -> Option<String> {
    if rec.nvtx.is_empty() {
        None
    } else {
        Some(rec.nvtx.join("/"))
    }
}

/// Whether a GEMM accumulates into its output (beta != 0).
pub(crate) fn accumulates(g: &ttrace_format::record::GemmOp) -> bool {
    g.beta.is_some_and(|b| b != 0.0)
}

/// A GEMM's tensor for comparison: `D` of an accumulating GEMM is its increment `D - beta*C`
/// (C is a partial accumulation whose content depends on how buffers are shared, e.g. tied
/// weights or gradient buckets, which differ between a single device and a pipeline). With
/// `cancellation`, also `‖beta*C‖ / ‖D - beta*C‖`: how many digits the subtraction cancelled
/// (0 otherwise, and without it). An increment formed while decoding ahead
/// ([`RunTrace::take_increment`]) from these very values is taken instead of formed again.
pub(crate) fn operand(
    t: &RunTrace,
    rec: &Record,
    role: Role,
    cancellation: bool,
) -> Result<Option<(Values, f64)>, CompareError> {
    let Some(mut v) = t.values(rec, role)? else {
        return Ok(None);
    };
    let mut cancelled = 0.0;
    if role == Role::D {
        if let Some(g) = gemm(rec).filter(|g| accumulates(g)) {
            let beta = g.beta.unwrap_or(0.0) as f32;
            if let Some(c) = t.values(rec, Role::CIn)? {
                if c.data.len() == v.data.len() {
                    let formed = t
                        .take_increment(rec, &v.data, &c.data)
                        .filter(|f| f.cancelled.is_some() || !cancellation);
                    let (values, c) = match formed {
                        Some(f) => (f.values, f.cancelled.unwrap_or(0.0)),
                        None => {
                            let (inc, c) = increment(beta, &v.data, &c.data, cancellation);
                            (std::sync::Arc::new(inc), c.unwrap_or(0.0))
                        }
                    };
                    // D's values are shared with the decoded tensors kept: the increment is
                    // its own buffer, not a copy of D changed in place.
                    v.data = values;
                    cancelled = c;
                }
            }
        }
    }
    Ok(Some((v, cancelled)))
}

/// The increment `d - beta*c` (equal lengths), and with `cancellation` the digits it
/// cancelled, `‖beta*c‖ / ‖d - beta*c‖` (`Some(0.0)` when the increment is zero).
///
/// The norms are summed in element order, in f64: the tolerance (and the report) are the
/// same whoever forms the increment, here or while decoding ahead.
pub(crate) fn increment(
    beta: f32,
    d: &[f32],
    c: &[f32],
    cancellation: bool,
) -> (Vec<f32>, Option<f64>) {
    // Element by element, vectorized: one rounding per operation either way.
    let inc: Vec<f32> = d.iter().zip(c).map(|(&d, &c)| d - beta * c).collect();
    if !cancellation {
        return (inc, None);
    }
    let (mut nc, mut ni) = (0f64, 0f64);
    for (&i, &c) in inc.iter().zip(c) {
        let bc = beta * c;
        nc += (bc as f64).powi(2);
        ni += (i as f64).powi(2);
    }
    (inc, Some(if ni > 0.0 { (nc / ni).sqrt() } else { 0.0 }))
}

/// Whether `rec` accumulates into its output (beta != 0) while its C was not captured
/// (`ttrace run --no-inputs`): its increment `D - beta*C` cannot be formed.
pub(crate) fn increment_unknown(rec: &Record) -> bool {
    gemm(rec).is_some_and(accumulates)
        && !rec
            .tensors
            .iter()
            .any(|t| t.role == Role::CIn && t.captured)
}

/// Whether two GEMMs' alpha/beta differ (beyond the rounding of the scale type).
pub(crate) fn params_differ(
    a: &ttrace_format::record::GemmOp,
    b: &ttrace_format::record::GemmOp,
) -> bool {
    let differ = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) => (x - y).abs() > 1e-6 * x.abs().max(y.abs()),
        _ => false,
    };
    differ(a.alpha, b.alpha) || differ(a.beta, b.beta)
}

pub(crate) fn show_scalar(v: Option<f64>) -> String {
    v.map_or_else(|| "(device)".into(), |v| format!("{v}"))
}

/// Why a run GEMM's scalars make it diverge: called with another alpha or beta than the
/// reference's (e.g. overwriting where it should accumulate).
pub(crate) fn param_note(rank: u32, rec: &Record, ref_rec: &Record) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::ShardError;
    use ttrace_format::dtype::DType;
    use ttrace_format::record::GemmOp;

    fn shard(rank: u32, rel: f64, norm_ratio: f64, ref_sq: f64) -> Shard {
        Shard {
            rank,
            seq: 5,
            err: ShardError {
                rel,
                norm_ratio,
                ref_sq,
                worst_row: Some((rank as u64, rel * 2.0)),
            },
        }
    }

    fn judged(results: &[Shard], tolerance: f64) -> TensorComparison {
        let mut rec = Record::d2h_copy(0, 1, 5, &[]);
        rec.api = "cublasGemmEx".into();
        let reference = Values {
            shape: vec![2, 2],
            data: vec![1.0; 4].into(),
            dtype: DType::BF16,
        };
        let tol = tolerance::Tolerance {
            value: tolerance,
            source: "analytic",
        };
        comparison(
            &rec,
            Role::D,
            &reference,
            results,
            Merge::Replicated,
            0.5,
            tol,
            1,
            9,
        )
    }

    #[test]
    fn a_tensor_is_as_wrong_as_its_worst_shard() {
        let t = judged(&[shard(0, 0.5, 1.0, 1.0), shard(1, 3.0, 1.0, 1.0)], 4.0);
        assert_eq!(t.error_eps, 6.0, "errors are in epsilon (0.5 here)");
        assert!(t.diverged);
        assert_eq!(
            t.ranks.iter().map(|r| r.error_eps).collect::<Vec<_>>(),
            [1.0, 6.0]
        );
        let w = t.worst_row.expect("a worst row");
        assert_eq!((w.rank, w.row, w.error_eps), (1, 1, 12.0));
        assert!(!judged(&[shard(0, 1.5, 1.0, 1.0)], 4.0).diverged);
    }

    #[test]
    fn the_norm_ratio_weighs_each_shard_by_its_share_of_the_reference() {
        // One shard twice its reference, the other exact, holding three times the norm².
        let t = judged(&[shard(0, 0.0, 2.0, 1.0), shard(1, 0.0, 1.0, 3.0)], 4.0);
        assert!((t.norm_ratio - (7.0f64 / 4.0).sqrt()).abs() < 1e-12);
    }

    #[test]
    fn an_increment_is_d_minus_beta_c_and_says_what_it_cancelled_summed_in_order() {
        let d: Vec<f32> = (0..1000)
            .map(|i| 1.0 + (i as f32 * 0.37).sin() * 1e-3)
            .collect();
        let c: Vec<f32> = (0..1000)
            .map(|i| 1.0 + (i as f32 * 0.11).cos() * 1e-4)
            .collect();
        let (plain, none) = increment(1.0, &d, &c, false);
        let (inc, cancelled) = increment(1.0, &d, &c, true);
        assert_eq!(none, None, "nothing summed when not asked");
        assert_eq!(plain, inc, "the same increment either way");
        let want: Vec<f32> = d.iter().zip(&c).map(|(&d, &c)| d - c).collect();
        assert_eq!(inc, want);
        // The norms in element order, in f64: the bits a reference's tolerance is built on.
        let (mut nc, mut ni) = (0f64, 0f64);
        for (&i, &c) in want.iter().zip(&c) {
            nc += (c as f64).powi(2);
            ni += (i as f64).powi(2);
        }
        assert_eq!(cancelled, Some((nc / ni).sqrt()));
        assert!(
            cancelled.is_some_and(|x| x > 1.0),
            "D and beta*C share digits"
        );
        let zero = increment(1.0, &[2.0, 3.0], &[2.0, 3.0], true);
        assert_eq!(
            zero,
            (vec![0.0, 0.0], Some(0.0)),
            "a zero increment cancels nothing"
        );
    }

    #[test]
    fn other_scalars_than_the_references_are_named_with_an_overwrite_said_plainly() {
        let mut op = GemmOp {
            beta: Some(1.0),
            ..GemmOp::plain(4, 4, 4, 0)
        };
        let mut reference = Record::d2h_copy(0, 1, 5, &[]);
        reference.op = ttrace_format::record::Op::Gemm(Box::new(op.clone()));
        op.beta = Some(0.0);
        let mut run = Record::d2h_copy(1, 1, 5, &[]);
        run.op = ttrace_format::record::Op::Gemm(Box::new(op));
        let note = param_note(1, &run, &reference).expect("the scalars differ");
        assert!(
            note.contains("rank 1 called this GEMM with alpha=1 beta=0"),
            "{note}"
        );
        assert!(note.contains("overwrites its output instead of accumulating"));
        assert_eq!(param_note(0, &reference, &reference), None);
    }
}
