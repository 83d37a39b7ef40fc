//! Placement: where each of the run's shards of a reference tensor sits in it (which slice,
//! at which scale), remembered places first ([`crate::hints`]), a search otherwise
//! ([`numerics::place_trusting`]); partial results are handed to the group sums
//! ([`crate::combine`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use ttrace_format::dtype::DType;
use ttrace_format::record::{Record, Role};

use crate::combine::{self, SumSearch};
use crate::comparison::{increment_unknown, operand, param_note, Unjudged};
use crate::hints::{HintKey, Memory};
use crate::layout::LayoutSummary;
use crate::numerics::{self, Placement, ShardError};
use crate::tolerance::Tolerance;
use crate::trace::{gemm, RunTrace, Values};
use crate::CompareError;

/// One shard's comparison.
pub(crate) struct Shard {
    pub(crate) rank: u32,
    pub(crate) seq: u64,
    pub(crate) err: ShardError,
}

/// Where a shard went: its placement and the scale it was divided by.
pub(crate) type Placed = (u32, u64, Placement, f32);

/// One reference tensor's counterparts, placed.
#[derive(Default)]
pub(crate) struct Placing {
    pub(crate) results: Vec<Shard>,
    pub(crate) place_of: Vec<Placed>,
    pub(crate) vals: BTreeMap<(u32, u64), Values>,
    /// Every shard's kind was placed whole before (a misfit is then a divergence, not a
    /// missing sum).
    pub(crate) all_known: bool,
    /// The op was called with other scalars than the reference's.
    pub(crate) param_note: Option<String>,
}

/// A shard not placed yet (its error is unknown).
pub(crate) fn unplaced() -> ShardError {
    ShardError {
        rel: f64::INFINITY,
        norm_ratio: 1.0,
        ref_sq: 0.0,
        worst_row: None,
    }
}

/// What distinguishes GEMMs of one shape that read their operands differently (attention's
/// QK^T and PV, data and weight gradients): API, transposes, leading dimensions, operand
/// types. The types matter where layouts cannot differ: FP8 GEMMs are all TN, and a
/// column-parallel layer's input gradient (BF16 out) and weight gradient (F32 main-grad out)
/// can share shape and leading dimensions while being partial over different communicators.
pub(crate) fn kind_of(rec: &Record) -> String {
    match gemm(rec) {
        Some(g) => format!(
            "{} {}{} {} {} {} {} {} {}/{}/{}",
            rec.api,
            g.transa,
            g.transb,
            g.lda,
            g.ldb,
            g.ldd,
            g.stride_a,
            g.stride_b,
            g.a_type,
            g.b_type,
            g.d_type
        ),
        None => rec.api.clone(),
    }
}

/// Places shards: the scales a shard may be divided by, and what was learnt where shards sit.
pub(crate) struct Placer {
    /// Epsilon of the working precision (errors are relative, tolerances in epsilon).
    pub(crate) eps: f64,
    /// Scales a placement may divide a shard by (gradients of a loss averaged over each
    /// rank's own batch are DP times the reference's).
    pub(crate) scales: Vec<f32>,
    /// Where shards sat before.
    pub(crate) mem: Memory,
    /// A tensor diverged already: the verdict is settled (ops come in order), later
    /// placements are searched more cheaply.
    pub(crate) settled: bool,
}

impl Placer {
    /// A placer for a run of `layout` measured in `eps`.
    pub(crate) fn new(eps: f64, layout: &LayoutSummary) -> Placer {
        Placer {
            eps,
            // Assumption 3: the one scale besides 1 is the data-parallel size; where it is
            // wrong for the program, the data-parallel reduction shows it (its scale is
            // decided from the weight updates, `gradscale`).
            scales: if layout.dp > 1 {
                vec![1.0, layout.dp as f32]
            } else {
                vec![1.0]
            },
            mem: Memory::default(),
            settled: false,
        }
    }

    /// A new step: what judged the previous step's tensors is forgotten.
    pub(crate) fn start_step(&mut self) {
        self.mem.start_step();
        self.settled = false;
    }

    /// Each shard at its best placement (remembered ones first). Shards that cannot be
    /// judged are noted in `unjudged`, shards that cannot be cut out of the reference in
    /// `warnings`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn place_shards(
        &mut self,
        run: &RunTrace,
        (step, ref_rec): (u64, &Record),
        shards: &[(u32, u64)],
        (sub, role): (usize, Role),
        ref_vals: &Values,
        tol: Tolerance,
        (unjudged, warnings): (&mut Unjudged, &mut Vec<String>),
    ) -> Result<Placing, CompareError> {
        let mut out = Placing {
            all_known: true,
            ..Placing::default()
        };
        let mut fitted: Vec<Fitted> = Vec::new();
        for &(rank, seq) in shards {
            let Some(rec) = run.record(rank, step, seq) else {
                continue;
            };
            let rec = &*rec;
            if role == Role::D && increment_unknown(rec) {
                unjudged.note(
                    "an accumulating GEMM's output without its captured C (--no-inputs): \
                     its increment is unknown",
                    rec,
                );
                continue;
            }
            let Some((x, _)) = operand(run, rec, role, false)? else {
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
            match self.fit_again(&key, &x, ref_vals, tol, &mut fitted) {
                Some(f) => {
                    out.results.push(Shard {
                        rank,
                        seq,
                        err: f.err,
                    });
                    out.place_of.push((rank, seq, f.placement, f.scale));
                }
                None => warnings.push(format!(
                    "rank {rank} step {step} seq {seq} {} {role:?}: shape {:?} cannot be cut \
                     out of the reference's {:?}",
                    rec.api, x.shape, ref_vals.shape
                )),
            }
            out.vals.insert((rank, seq), x);
        }
        Ok(out)
    }

    /// [`Placer::fit`] of a shard of one reference tensor, `fitted` holding the fits of the
    /// tensor's shards before it. A shard whose values are bit-for-bit those of an earlier
    /// shard, whose kind remembers the same places, takes that shard's fit (remembered for its
    /// own kind the same way) instead of searching again: the fit is a pure function of the
    /// values, the reference, the tolerance, the places remembered and the scales tried, so
    /// it is the same fit. Data-parallel replicas of a weight are such shards.
    fn fit_again(
        &mut self,
        key: &HintKey,
        x: &Values,
        ref_vals: &Values,
        tol: Tolerance,
        fitted: &mut Vec<Fitted>,
    ) -> Option<numerics::Fit> {
        let known = self.mem.known(key).to_vec();
        let provisional = self.mem.provisional.get(key).cloned();
        let earlier = fitted.iter().find(|f| {
            f.known == known && f.provisional == provisional && same_values(&f.values, x)
        });
        if let Some(f) = earlier {
            let fit = f.fit.clone()?;
            self.remember(key, &fit, tol, x.dtype);
            return Some(fit);
        }
        let fit = self.fit(key, x, ref_vals, tol);
        fitted.push(Fitted {
            values: x.clone(),
            known,
            provisional,
            fit: fit.clone(),
        });
        fit
    }

    /// The best placement of one shard, remembered for its kind when it fits clearly.
    pub(crate) fn fit(
        &mut self,
        key: &HintKey,
        x: &Values,
        ref_vals: &Values,
        tol: Tolerance,
    ) -> Option<numerics::Fit> {
        let known = self.mem.known(key);
        let (accept, trust) = tol.hint_limits(self.eps, x.dtype);
        // After the first divergence the verdict is settled: later tensors only feed the
        // plot and the worst-tensor table, so their placement search is cheaper.
        let quick = self.settled;
        let fit = match self.mem.provisional.get(key) {
            Some((p, sc)) if quick && known.is_empty() => {
                Some(numerics::full_fit(x, ref_vals, p.clone(), *sc))
            }
            // A remembered place that drifted above `accept` but stays within the tolerance
            // is re-validated against the other places instead of searched again.
            _ => numerics::place_trusting(x, ref_vals, known, &self.scales, (accept, trust), quick),
        }?;
        self.remember(key, &fit, tol, x.dtype);
        Some(fit)
    }

    /// Remembers `fit` for `key`: a clean fit (within what a hint may accept) as where to look
    /// first, a loose one as the kind's provisional place.
    fn remember(&mut self, key: &HintKey, fit: &numerics::Fit, tol: Tolerance, dtype: DType) {
        let (accept, _) = tol.hint_limits(self.eps, dtype);
        if fit.err.rel <= accept {
            self.mem.placed_clean(key, fit);
        } else {
            self.mem.placed_loosely(key, fit);
        }
    }

    /// Tries the group sums for partial results; returns the group size (1: no sum fitted).
    pub(crate) fn sums(
        &mut self,
        run: &RunTrace,
        (step, shards, sub): (u64, &[(u32, u64)], usize),
        ref_vals: &Values,
        tol: Tolerance,
        placed: &mut Placing,
    ) -> u32 {
        let kind = shards
            .first()
            .and_then(|&(r, q)| run.record(r, step, q))
            .map(|r| kind_of(&r))
            .unwrap_or_default();
        let search = SumSearch {
            shards,
            vals: &placed.vals,
            ref_vals,
            scales: &self.scales,
            accept: tol.sum_accept(self.eps, ref_vals.dtype),
            kind: &kind,
            quick: self.settled,
        };
        let Some((group, (results, places))) =
            combine::sum_groups(run, step, &search, &placed.results, &mut self.mem.sums)
        else {
            return 1;
        };
        placed.results = results;
        placed.place_of = places;
        for &(rank, seq) in shards {
            if let (Some(rec), Some(x)) =
                (run.record(rank, step, seq), placed.vals.get(&(rank, seq)))
            {
                self.mem.needs_sum.insert((
                    rank,
                    sub,
                    x.shape.clone(),
                    ref_vals.shape.clone(),
                    kind_of(&rec),
                ));
            }
        }
        group
    }

    /// Makes the shards tile the reference ([`combine::cover`]), free slices going to the
    /// ranks whose place they are.
    pub(crate) fn cover(&self, layout: &LayoutSummary, placed: &mut Placing, ref_vals: &Values) {
        let affinity = |rank: u32, p: &Placement| self.mem.affinity(layout, rank, p);
        combine::cover(
            &mut placed.results,
            &mut placed.place_of,
            &placed.vals,
            ref_vals,
            &affinity,
        );
    }
}

/// A shard's fit with what it was a function of besides the reference and the tolerance
/// ([`Placer::fit_again`]).
struct Fitted {
    values: Values,
    known: Vec<(Placement, f32)>,
    provisional: Option<(Placement, f32)>,
    fit: Option<numerics::Fit>,
}

/// Whether `a` and `b` hold the same elements bit for bit (the same buffer, or equal bits),
/// with the same shape and stored type.
fn same_values(a: &Values, b: &Values) -> bool {
    a.shape == b.shape
        && a.dtype == b.dtype
        && (Arc::ptr_eq(&a.data, &b.data)
            || (a.data.len() == b.data.len()
                && a.data
                    .iter()
                    .zip(b.data.iter())
                    .all(|(x, y)| x.to_bits() == y.to_bits())))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::numerics::{Cut, DimSlice};
    use ttrace_format::dtype::DType;

    /// `data` as a one-dimensional F32 tensor.
    pub(crate) fn values(data: &[f32]) -> Values {
        Values {
            shape: vec![data.len() as u64],
            data: data.to_vec().into(),
            dtype: DType::F32,
        }
    }

    /// One half (two parts of `chunk` elements) of a one-dimensional tensor.
    pub(crate) fn half(chunk: u64) -> Placement {
        Placement {
            dims: vec![DimSlice {
                cuts: vec![Cut {
                    parts: 2,
                    outer: 1,
                    chunk,
                }],
            }],
        }
    }

    fn placer() -> Placer {
        let layout = crate::layout::parse("tp=2").expect("a layout");
        Placer::new(crate::tolerance::epsilon(DType::BF16), &layout)
    }

    const TOL: Tolerance = Tolerance {
        value: 4.0,
        source: "analytic",
    };

    fn key() -> HintKey {
        (1, 0, vec![4], vec![8], "cublasGemmEx".into())
    }

    fn reference() -> Values {
        values(&[1.0, -2.0, 3.0, 4.5, -5.0, 6.0, 7.5, 8.0])
    }

    #[test]
    fn a_shard_sits_at_the_slice_it_matches_and_the_place_is_remembered() {
        let mut p = placer();
        let shard = values(&[-5.0, 6.0, 7.5, 8.0]);
        let f = p
            .fit(&key(), &shard, &reference(), TOL)
            .expect("a placement");
        assert_eq!((f.placement.clone(), f.scale), (half(1), 1.0));
        assert!(f.err.rel < 1e-12);
        assert_eq!(p.mem.known(&key()), &[(half(1), 1.0)][..]);
        assert!(p.mem.placed_whole.contains(&key()));
    }

    /// A replica's shard (the same bits as an earlier shard, its kind remembering the same
    /// places) takes the earlier fit, and its kind remembers it as a search would have made
    /// it remember; a shard with other bits, or whose kind remembers other places, is searched.
    #[test]
    fn a_replica_takes_the_fit_of_the_same_values_and_is_remembered_the_same() {
        let other_rank = |rank: u32| {
            let mut k = key();
            k.0 = rank;
            k
        };
        let (mut p, mut searched) = (placer(), placer());
        let mut fitted = Vec::new();
        let shard = values(&[-5.0, 6.0, 7.5, 8.0]);
        let copy = values(&[-5.0, 6.0, 7.5, 8.0]); // another buffer, the same bits
        let first = p.fit_again(&key(), &shard, &reference(), TOL, &mut fitted);
        let again = p.fit_again(&other_rank(2), &copy, &reference(), TOL, &mut fitted);
        assert_eq!(fitted.len(), 1, "the replica was not searched");
        assert_eq!(first, again);
        searched.fit(&key(), &shard, &reference(), TOL);
        searched.fit(&other_rank(2), &copy, &reference(), TOL);
        assert_eq!(p.mem.hints, searched.mem.hints);
        assert_eq!(p.mem.placed_whole, searched.mem.placed_whole);
        assert_eq!(p.mem.usual, searched.mem.usual);
        // -0.0 is not 0.0 bit for bit: searched.
        let signed = values(&[-5.0, 6.0, 7.5, -0.0]);
        p.fit_again(&other_rank(3), &signed, &reference(), TOL, &mut fitted);
        assert_eq!(fitted.len(), 2);
        // The same bits again, but rank 2's kind now remembers a place: searched.
        p.fit_again(&other_rank(2), &shard, &reference(), TOL, &mut fitted);
        assert_eq!(fitted.len(), 3);
    }

    #[test]
    fn a_remembered_place_does_not_pass_a_shard_that_belongs_elsewhere() {
        let mut p = placer();
        p.fit(&key(), &values(&[1.0, -2.0, 3.0, 4.5]), &reference(), TOL);
        assert_eq!(p.mem.known(&key())[0].0, half(0));
        // The next shard of this kind is the other half: searched, not taken at the hint.
        let f = p
            .fit(&key(), &values(&[-5.0, 6.0, 7.5, 8.0]), &reference(), TOL)
            .expect("a placement");
        assert_eq!(f.placement, half(1));
        assert!(f.err.rel < 1e-12);
    }

    #[test]
    fn a_shard_that_fits_nowhere_cleanly_is_placed_provisionally_and_not_remembered() {
        let mut p = placer();
        let off: Vec<f32> = [-5.0f32, 6.0, 7.5, 8.0].iter().map(|v| v * 1.25).collect();
        let f = p
            .fit(&key(), &values(&off), &reference(), TOL)
            .expect("a placement");
        assert!(f.err.rel > 0.1);
        assert!(p.mem.known(&key()).is_empty());
        assert!(!p.mem.placed_whole.contains(&key()));
        assert!(p.mem.provisional.contains_key(&key()));
    }

    #[test]
    fn data_parallel_runs_may_scale_shards_by_their_size_and_others_may_not() {
        let dp = crate::layout::parse("tp=1,dp=4").expect("a layout");
        assert_eq!(Placer::new(1e-3, &dp).scales, vec![1.0, 4.0]);
        let tp = crate::layout::parse("tp=4").expect("a layout");
        assert_eq!(Placer::new(1e-3, &tp).scales, vec![1.0]);
    }
}
