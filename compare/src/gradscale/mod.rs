//! What a data-parallel gradient reduction must output, decided from the data.
//!
//! The reference (world size 1) computes the full-batch gradient `G`; each data-parallel rank
//! computes a partial over its share of the batch, and the reduction over the data-parallel
//! group combines them. Programs differ in where they put the batch size: a loss averaged over
//! each rank's batch whose gradients are averaged (`ncclAvg`) outputs `G`; a summed loss
//! averaged over the replicas and divided by the local batch afterwards (sum then divide)
//! outputs `G / dp`; mean-loss gradients summed and divided by `dp` afterwards output `dp * G`.
//! The factor applied after the reduction runs in code ttrace does not capture, so the scale
//! the reduction must have is read from what the program does with its output: the weights the
//! next step reads.
//!
//! * **Updates** ([`Update::Needs`]): when the weight update is proportional to the gradient in
//!   both runs (SGD: `ΔW = k·G`, checked by [`proportion`]), the reduction must output
//!   `k_ref / k_run` times the reference's gradient for the weights to move alike. The scales
//!   measured over every reduced gradient must agree, and be a legal convention
//!   ([`legal`]: 1, dp or 1/dp); a reduction whose output has another scale is a LOCAL
//!   divergence there (a sum where the program's update expects an average).
//! * **Scale-invariant updates** ([`Update::NotProportional`], Adam): the weights cannot tell a
//!   scale; the gradient's scale still matters through the optimizer's epsilon and clipping
//!   thresholds, which the reference's gradient defines, so the reduction must reproduce it
//!   at scale 1.
//! * **No updates** (weights not captured: `--no-inputs`, a single step): the scale the
//!   outputs show is accepted when it is legal and the same for every reduction (said in a
//!   warning); a wrong one then shows in the next step's tensors.
//! * An update that needs a scale no convention gives (the host divides twice) is a fault
//!   after the reduction: the reductions are judged by the legal scale their outputs show,
//!   and the weights of the next step diverge.
//!
//! `--dp-reduction-scale` overrides the decision.

use serde::{Deserialize, Serialize};

use crate::kernels::median_magnitude;

pub mod updates;

/// How far (as a ratio) a measured scale may lie from a legal one and still be it.
const SNAP: f64 = 1.2;

/// The share of the measurements that must agree on one scale.
const AGREE: f64 = 0.75;

/// The legal scales of a data-parallel reduction's output relative to the reference's
/// gradient: 1, dp, 1/dp.
pub fn legal(dp: u32) -> [f64; 3] {
    let dp = f64::from(dp.max(1));
    [1.0, dp, 1.0 / dp]
}

/// The legal scale within [`SNAP`] of `x`, if any.
pub fn snap(x: f64, dp: u32) -> Option<f64> {
    if !(x.is_finite() && x > 0.0) {
        return None;
    }
    legal(dp)
        .into_iter()
        .find(|s| (x / s).ln().abs() <= SNAP.ln())
}

/// The least-squares scale `s` of `x ≈ s·y`, `None` when `y` is zero.
pub fn ratio(x: &[f32], y: &[f32]) -> Option<f64> {
    let (mut xy, mut yy) = (0f64, 0f64);
    for (&a, &b) in x.iter().zip(y) {
        xy += f64::from(a) * f64::from(b);
        yy += f64::from(b) * f64::from(b);
    }
    (yy > 0.0 && xy.is_finite()).then(|| xy / yy)
}

/// How a weight update `dw` relates to a gradient `g`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Proportion {
    /// Least-squares `k` of `dw ≈ k·g`.
    pub k: f64,
    /// The same fit over the half of the elements with the smaller `|g|`, and over the other
    /// half: equal for an update proportional to the gradient (SGD, whatever rounding noise
    /// the weights carry), far apart for one that normalizes it (Adam: `|dw|` hardly depends
    /// on `|g|`).
    pub k_small: f64,
    /// See `k_small`.
    pub k_large: f64,
    /// Cosine between `dw` and `g`.
    pub cosine: f64,
}

impl Proportion {
    /// Whether the update follows the gradient at all (cosine of magnitude at least 0.5):
    /// not when it is below the weights' resolution (mostly rounded away in BF16).
    pub fn resolved(&self) -> bool {
        self.cosine.abs() >= 0.5
    }

    /// Whether the update is proportional to the gradient: it follows the gradient with one
    /// factor for small and large gradients alike (within 1.5x).
    pub fn proportional(&self) -> bool {
        let q = self.k_small / self.k_large;
        self.resolved() && q.is_finite() && (1.0 / 1.5..=1.5).contains(&q)
    }
}

/// Fits `dw ≈ k·g` overall and on the small and large halves of `|g|`. `None` when the
/// slices differ in length, hold fewer than 16 elements, or either is zero.
pub fn proportion(dw: &[f32], g: &[f32]) -> Option<Proportion> {
    proportion_split(dw, g, median_magnitude(g)?)
}

/// Independent accumulators per sum in [`proportion_split`] (so that the loop vectorizes).
const SPLIT_LANES: usize = 4;

/// [`proportion`] with the median of `|g|` given ([`crate::kernels::median_magnitude`]): one pass over the
/// elements, no allocation, no per-element branch (the halves are selected by a mask).
pub fn proportion_split(dw: &[f32], g: &[f32], median: f32) -> Option<Proportion> {
    if dw.len() != g.len() || dw.len() < 16 {
        return None;
    }
    let mut acc: crate::simd::SplitLanes = [[0f64; SPLIT_LANES]; 7];
    add_split(dw, g, median, &mut acc);
    split_fits(&acc)
}

/// Adds `dw` and `g` into `acc`: whole chunks through the AVX2 loop where the CPU has it
/// (bit-identical), the rest in the portable one. Elements go to lane `i % SPLIT_LANES` of
/// their index in the slices: slices that continue others must start at a multiple of
/// [`SPLIT_LANES`] for the sums to be those of one call over everything.
fn add_split(dw: &[f32], g: &[f32], median: f32, acc: &mut crate::simd::SplitLanes) {
    let done = crate::simd::add_split_chunks(dw, g, median, acc);
    add_split_lanes(&dw[done..], &g[done..], median, acc);
}

/// Elements of a weight's change formed at a time by [`proportion_of_change`]: 16 KiB, in
/// the first-level cache; a multiple of [`SPLIT_LANES`].
const CHANGE_BLOCK: usize = 4096;

/// [`proportion`] of the change `after - before` (each difference rounded to f32, as a
/// vector of the differences holds it), bit for bit, without that vector: it is formed a
/// block at a time. A weight's whole change in memory cost a fresh buffer (its page faults)
/// per reduction compared with its update.
pub fn proportion_of_change(after: &[f32], before: &[f32], g: &[f32]) -> Option<Proportion> {
    if after.len() != g.len() || before.len() != g.len() || g.len() < 16 {
        return None;
    }
    let median = median_magnitude(g)?;
    let mut acc: crate::simd::SplitLanes = [[0f64; SPLIT_LANES]; 7];
    let mut dw = [0f32; CHANGE_BLOCK];
    for ((a, b), g) in after
        .chunks(CHANGE_BLOCK)
        .zip(before.chunks(CHANGE_BLOCK))
        .zip(g.chunks(CHANGE_BLOCK))
    {
        let dw = &mut dw[..g.len()];
        for ((d, &a), &b) in dw.iter_mut().zip(a).zip(b) {
            *d = a - b;
        }
        add_split(dw, g, median, &mut acc);
    }
    split_fits(&acc)
}

/// The fits of [`proportion_split`] from its sums.
fn split_fits(acc: &crate::simd::SplitLanes) -> Option<Proportion> {
    let total = |i: usize| (acc[i][0] + acc[i][2]) + (acc[i][1] + acc[i][3]);
    let [xy, yy, xx, xy_large, yy_large, xy_small, yy_small] = [0, 1, 2, 3, 4, 5, 6].map(total);
    // The least-squares scale of one part, as [`ratio`] says it.
    let fit = |xy: f64, yy: f64| (yy > 0.0 && xy.is_finite()).then(|| xy / yy);
    let k = fit(xy, yy)?;
    let (k_small, k_large) = (fit(xy_small, yy_small)?, fit(xy_large, yy_large)?);
    if xx == 0.0 || yy == 0.0 {
        return None;
    }
    Some(Proportion {
        k,
        k_small,
        k_large,
        cosine: xy / (xx * yy).sqrt(),
    })
}

/// The portable loop of [`proportion_split`]: element `i` of `dw` (a) and `g` (b) into lane
/// `i % SPLIT_LANES` of Σab, Σbb, Σaa over all, Σab and Σbb over the large half of `|b|`,
/// the same over the small half.
fn add_split_lanes(dw: &[f32], g: &[f32], median: f32, acc: &mut crate::simd::SplitLanes) {
    let mut add = |l: usize, a: f32, b: f32| {
        let (a64, b64) = (f64::from(a), f64::from(b));
        let (ab, bb) = (a64 * b64, b64 * b64);
        // NaN magnitudes fall in the small half, as `>=` says.
        let large = u64::from(b.abs() >= median).wrapping_neg();
        let keep = |v: f64, m: u64| f64::from_bits(v.to_bits() & m);
        acc[0][l] += ab;
        acc[1][l] += bb;
        acc[2][l] += a64 * a64;
        acc[3][l] += keep(ab, large);
        acc[4][l] += keep(bb, large);
        acc[5][l] += keep(ab, !large);
        acc[6][l] += keep(bb, !large);
    };
    let (dc, gc) = (dw.chunks_exact(SPLIT_LANES), g.chunks_exact(SPLIT_LANES));
    let (dr, gr) = (dc.remainder(), gc.remainder());
    for (da, ga) in dc.zip(gc) {
        for l in 0..SPLIT_LANES {
            add(l, da[l], ga[l]);
        }
    }
    for (l, (&a, &b)) in dr.iter().zip(gr).enumerate() {
        add(l, a, b);
    }
}

/// What the weights of the next step say about one reduced gradient.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Update {
    /// The weights were not captured in both steps, or not found.
    Unknown,
    /// The update is not proportional to the gradient in one of the runs (Adam).
    NotProportional,
    /// Both updates are proportional: the reduction must output this times the reference's
    /// gradient for the weights to move alike (`k_ref / k_run`).
    Needs(f64),
}

impl Update {
    /// From the reference's and the run's fits (see [`proportion`]); an update that does not
    /// follow its gradient in either run says nothing.
    pub fn from_fits(reference: Option<Proportion>, run: Option<Proportion>) -> Update {
        match (reference, run) {
            (Some(r), Some(x)) if !(r.resolved() && x.resolved()) => Update::Unknown,
            (Some(r), Some(x)) if r.proportional() && x.proportional() => {
                let need = r.k / x.k;
                if need.is_finite() && need > 0.0 {
                    Update::Needs(need)
                } else {
                    Update::NotProportional
                }
            }
            (Some(_), Some(_)) => Update::NotProportional,
            _ => Update::Unknown,
        }
    }
}

/// One data-parallel reduction of one gradient (a rank's part of it) in one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evidence {
    /// The output's least-squares scale against the reference's gradient.
    pub output: Option<f64>,
    /// What the next step's weights say.
    pub update: Update,
}

/// Where a decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// `--dp-reduction-scale`.
    Option,
    /// The weight updates (proportional to the gradients) need this scale.
    Updates,
    /// The updates do not depend on the gradient's scale (Adam): the reference's, 1.
    ScaleInvariantUpdates,
    /// No update was captured: the scale the reductions' outputs show, legal and agreed.
    Outputs,
    /// The updates need a scale no convention gives (a fault after the reduction): the legal
    /// scale the outputs show.
    OutputsAfterIllegalUpdates,
    /// Nothing decided it: 1.
    Default,
    /// No data-parallel reduction was compared.
    NoReduction,
}

/// The scale every data-parallel reduction's output must have, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// Output / reference gradient.
    pub scale: f64,
    /// What decided it.
    pub basis: Basis,
    /// One line saying so.
    pub detail: String,
}

/// The legal scale at least [`AGREE`] of `values` lie at (within [`SNAP`]).
fn agreed(values: &[f64], dp: u32) -> Option<f64> {
    let snapped: Vec<Option<f64>> = values.iter().map(|&v| snap(v, dp)).collect();
    legal(dp).into_iter().find(|s| {
        let n = snapped.iter().filter(|v| **v == Some(*s)).count();
        !values.is_empty() && n as f64 >= AGREE * values.len() as f64
    })
}

/// `s` as a reader knows it: `1`, `dp (2)`, `1/dp (1/2)` or the number.
pub fn name(s: f64, dp: u32) -> String {
    let dp_f = f64::from(dp);
    if (s - 1.0).abs() < 1e-9 {
        "1".into()
    } else if dp > 1 && (s - dp_f).abs() < 1e-9 {
        format!("dp ({dp})")
    } else if dp > 1 && (s - 1.0 / dp_f).abs() < 1e-9 {
        format!("1/dp (1/{dp})")
    } else {
        format!("{s:.4}")
    }
}

/// The median of positive `values`, in log scale (`None` when empty).
fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Decides the scale of every data-parallel reduction's output (see the module doc).
pub fn decide(evidence: &[Evidence], dp: u32, given: Option<f64>) -> Decision {
    let decision = |scale: f64, basis: Basis, detail: String| Decision {
        scale,
        basis,
        detail,
    };
    if let Some(s) = given {
        return decision(
            s,
            Basis::Option,
            format!("{} (--dp-reduction-scale)", name(s, dp)),
        );
    }
    if evidence.is_empty() {
        return decision(1.0, Basis::NoReduction, "no data-parallel reduction".into());
    }
    let needs: Vec<f64> = evidence
        .iter()
        .filter_map(|e| match e.update {
            Update::Needs(n) => Some(n),
            _ => None,
        })
        .collect();
    let outputs: Vec<f64> = evidence.iter().filter_map(|e| e.output).collect();
    let invariant = evidence
        .iter()
        .filter(|e| e.update == Update::NotProportional)
        .count();
    let from_outputs = |basis: Basis, why: String| match agreed(&outputs, dp) {
        Some(s) => decision(
            s,
            basis,
            format!(
                "{}, the scale the reductions' outputs show ({why})",
                name(s, dp)
            ),
        ),
        None => decision(
            1.0,
            Basis::Default,
            format!("1 ({why}, and the outputs agree on no legal scale)"),
        ),
    };
    // Updates that mostly do not follow the gradient (Adam; a large epsilon makes its small
    // gradients' updates look proportional) cannot say a scale: the few that look
    // proportional would take a partly scale-blind update's ratio for a convention.
    let seen = needs.len() + invariant;
    if !needs.is_empty() && needs.len() as f64 >= AGREE * seen as f64 {
        if let Some(s) = agreed(&needs, dp) {
            return decision(
                s,
                Basis::Updates,
                format!(
                    "{}, what the next step's weight updates need ({} gradients)",
                    name(s, dp),
                    needs.len()
                ),
            );
        }
        let m = median(&needs).unwrap_or(f64::NAN);
        return from_outputs(
            Basis::OutputsAfterIllegalUpdates,
            format!(
                "the weight updates need {m:.4}, which no convention gives: the fault lies \
                 after the reduction"
            ),
        );
    }
    if invariant > 0 {
        return decision(
            1.0,
            Basis::ScaleInvariantUpdates,
            "1, the reference's gradient (the weight updates do not follow the gradient's \
             scale, e.g. Adam: only the reference's scale keeps its epsilon and clipping)"
                .into(),
        );
    }
    from_outputs(
        Basis::Outputs,
        "no weight update was captured to decide it".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values of varied magnitude and sign.
    fn grads(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = ((i as f64 * 0.7548776662).fract() - 0.5) * 2.0;
                (x * x * x + 0.01 * x) as f32
            })
            .collect()
    }

    fn ev(output: f64, update: Update) -> Evidence {
        Evidence {
            output: Some(output),
            update,
        }
    }

    /// The straightforward fit the one-pass [`proportion_split`] must agree with: the halves
    /// gathered into vectors, each sum a plain loop.
    fn plain_proportion(dw: &[f32], g: &[f32]) -> Option<Proportion> {
        if dw.len() != g.len() || dw.len() < 16 {
            return None;
        }
        let k = ratio(dw, g)?;
        let mut mags: Vec<f32> = g.iter().map(|v| v.abs()).collect();
        mags.sort_by(f32::total_cmp);
        let median = mags[mags.len() / 2];
        let half = |large: bool| {
            let (x, y): (Vec<f32>, Vec<f32>) = dw
                .iter()
                .zip(g)
                .filter(|(_, b)| (b.abs() >= median) == large)
                .map(|(a, b)| (*a, *b))
                .unzip();
            ratio(&x, &y)
        };
        let (k_small, k_large) = (half(false)?, half(true)?);
        let (mut xx, mut yy, mut xy) = (0f64, 0f64, 0f64);
        for (&a, &b) in dw.iter().zip(g) {
            let (a, b) = (f64::from(a), f64::from(b));
            xx += a * a;
            yy += b * b;
            xy += a * b;
        }
        if xx == 0.0 || yy == 0.0 {
            return None;
        }
        Some(Proportion {
            k,
            k_small,
            k_large,
            cosine: xy / (xx * yy).sqrt(),
        })
    }

    #[test]
    fn the_fit_of_a_change_is_the_fit_of_the_change_formed_whole_to_the_bit() {
        for n in [15, 16, 17, 4095, 4096, 4097, 3 * 4096 + 5] {
            let g = grads(n);
            let before: Vec<f32> = g.iter().map(|v| 0.5 + 3.0 * v).collect();
            let after: Vec<f32> = before.iter().zip(&g).map(|(w, v)| w - 0.01 * v).collect();
            let dw: Vec<f32> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
            let got = proportion_of_change(&after, &before, &g);
            let want = proportion(&dw, &g);
            let bits = |p: Option<Proportion>| {
                p.map(|p| [p.k, p.k_small, p.k_large, p.cosine].map(f64::to_bits))
            };
            assert_eq!(bits(got), bits(want), "n {n}");
            assert_eq!(got.is_some(), n >= 16, "n {n}");
        }
        assert!(proportion_of_change(&[1.0; 20], &[0.0; 19], &grads(20)).is_none());
    }

    #[test]
    fn the_one_pass_fit_agrees_with_the_plain_one_on_odd_lengths_and_non_finite_values() {
        let close = |a: f64, b: f64| a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs());
        for n in [16, 17, 31, 1001, 4099] {
            let g = grads(n);
            let adam: Vec<f32> = g.iter().map(|v| 1e-3 * v.signum()).collect();
            let mut nan = g.clone();
            nan[n / 3] = f32::NAN;
            let mut inf_update: Vec<f32> = g.iter().map(|v| 0.1 * v).collect();
            inf_update[n - 1] = f32::INFINITY;
            let mut inf_grad = g.clone();
            inf_grad[1] = f32::NEG_INFINITY;
            let zeros = vec![0f32; n];
            for (dw, grad) in [
                (&adam, &g),
                (&inf_update, &g),
                (&adam, &nan),
                (&adam, &inf_grad),
                (&zeros, &g),
                (&g, &zeros),
            ] {
                let (got, want) = (proportion(dw, grad), plain_proportion(dw, grad));
                match (got, want) {
                    (Some(a), Some(b)) => assert!(
                        close(a.k, b.k)
                            && close(a.k_small, b.k_small)
                            && close(a.k_large, b.k_large)
                            && close(a.cosine, b.cosine),
                        "n {n}: {a:?} != {b:?}"
                    ),
                    (None, None) => {}
                    (a, b) => panic!("n {n}: {a:?} != {b:?}"),
                }
            }
        }
    }

    #[test]
    fn the_vector_loop_of_the_fit_gives_the_portable_loops_bits() {
        // Whatever the CPU, the sums are those of the portable loop, bit for bit: odd lengths,
        // NaN and infinite values, gradients exactly at the median.
        let mut g = grads(1003);
        let mut dw: Vec<f32> = g.iter().map(|v| -0.01 * v + 1e-6).collect();
        let median = median_magnitude(&g).expect("not empty");
        g[3] = -median;
        g[4] = median;
        g[7] = f32::NAN;
        g[9] = f32::NEG_INFINITY;
        dw[11] = f32::INFINITY;
        dw[12] = f32::NAN;
        for n in [0, 1, 3, 4, 5, 8, 13, 64, 1001, 1003] {
            let mut vector: crate::simd::SplitLanes = [[0f64; SPLIT_LANES]; 7];
            let done = crate::simd::add_split_chunks(&dw[..n], &g[..n], median, &mut vector);
            add_split_lanes(&dw[done..n], &g[done..n], median, &mut vector);
            let mut portable: crate::simd::SplitLanes = [[0f64; SPLIT_LANES]; 7];
            add_split_lanes(&dw[..n], &g[..n], median, &mut portable);
            let bits = |acc: &crate::simd::SplitLanes| acc.map(|l| l.map(f64::to_bits));
            assert_eq!(bits(&vector), bits(&portable), "n {n}");
        }
    }

    #[test]
    fn only_one_dp_and_its_inverse_are_legal() {
        assert_eq!(snap(1.05, 2), Some(1.0));
        assert_eq!(snap(0.48, 2), Some(0.5));
        assert_eq!(snap(2.1, 2), Some(2.0));
        assert_eq!(snap(4.0, 2), None);
        assert_eq!(snap(4.0, 4), Some(4.0));
        assert_eq!(snap(0.7, 2), None);
        assert_eq!(snap(-1.0, 2), None);
        assert_eq!(snap(f64::NAN, 2), None);
    }

    #[test]
    fn sgd_updates_are_proportional_and_adam_updates_are_not() {
        let g = grads(1024);
        let sgd: Vec<f32> = g.iter().map(|v| -0.05 * v).collect();
        let p = proportion(&sgd, &g).expect("fit");
        assert!(p.proportional(), "{p:?}");
        assert!((p.k + 0.05).abs() < 1e-6, "{p:?}");
        // Rounding noise on the weights (a bf16 cast) leaves the factor alone.
        let noisy: Vec<f32> = sgd
            .iter()
            .enumerate()
            .map(|(i, v)| v + 0.002 * ((i as f32 * 0.618).fract() - 0.5))
            .collect();
        assert!(proportion(&noisy, &g).expect("fit").proportional());
        // Adam's first step: lr·g/(|g| + eps), about lr·sign(g).
        let adam: Vec<f32> = g.iter().map(|v| -1e-3 * v / (v.abs() + 1e-8)).collect();
        let p = proportion(&adam, &g).expect("fit");
        assert!(!p.proportional(), "{p:?}");
        // Nothing to fit.
        assert!(proportion(&[0.0; 32], &grads(32)).is_none());
        assert!(proportion(&sgd[..8], &g[..8]).is_none());
    }

    #[test]
    fn the_updates_decide_between_sum_and_average() {
        // Sum loss, ncclAvg, host divides by the local batch: the reduction outputs G/2 and
        // the run's update factor is twice the reference's.
        let e = vec![ev(0.5, Update::Needs(0.5)); 4];
        let d = decide(&e, 2, None);
        assert_eq!((d.scale, d.basis), (0.5, Basis::Updates), "{d:?}");
        // The same program summing instead: its output is G (legal-looking), but the updates
        // need G/2, so the sum is the fault, judged against 1/2.
        let e = vec![ev(1.0, Update::Needs(0.5)); 4];
        assert_eq!(decide(&e, 2, None).scale, 0.5);
        // Mean loss, sum, divided by dp afterwards.
        let e = vec![ev(2.0, Update::Needs(2.0)); 3];
        assert_eq!(decide(&e, 2, None).scale, 2.0);
        // Measurement noise within the snap.
        let e = [
            ev(0.5, Update::Needs(0.47)),
            ev(0.5, Update::Needs(0.55)),
            ev(0.5, Update::Needs(0.51)),
        ];
        assert_eq!(decide(&e, 2, None).scale, 0.5);
    }

    #[test]
    fn an_update_no_convention_explains_leaves_the_reductions_to_their_outputs() {
        // The host divides twice: the updates need 4x (local batch 8, dp 2).
        let e = vec![ev(0.5, Update::Needs(4.0)); 4];
        let d = decide(&e, 2, None);
        assert_eq!(
            (d.scale, d.basis),
            (0.5, Basis::OutputsAfterIllegalUpdates),
            "{d:?}"
        );
        // Updates that disagree among themselves decide nothing either.
        let e = [
            ev(1.0, Update::Needs(1.0)),
            ev(1.0, Update::Needs(2.0)),
            ev(1.0, Update::Needs(0.5)),
        ];
        assert_eq!(decide(&e, 2, None).basis, Basis::OutputsAfterIllegalUpdates);
    }

    #[test]
    fn scale_invariant_updates_hold_the_reduction_to_the_reference_gradient() {
        // Adam: a sum where an average was due is not visible in the weights; the reduction
        // must give the reference's gradient.
        let e = vec![ev(2.0, Update::NotProportional); 4];
        let d = decide(&e, 2, None);
        assert_eq!((d.scale, d.basis), (1.0, Basis::ScaleInvariantUpdates));
        // Adam with a large epsilon: the smallest gradients' updates look proportional (and
        // need the scale of the output, whatever it is); the rest do not.
        let mut e = vec![ev(2.0, Update::NotProportional); 30];
        e.extend([ev(2.0, Update::Needs(1.6)), ev(2.0, Update::Needs(2.0))]);
        let d = decide(&e, 2, None);
        assert_eq!((d.scale, d.basis), (1.0, Basis::ScaleInvariantUpdates));
    }

    #[test]
    fn without_updates_the_agreed_legal_output_scale_is_taken() {
        let e = vec![ev(0.5, Update::Unknown); 4];
        let d = decide(&e, 2, None);
        assert_eq!((d.scale, d.basis), (0.5, Basis::Outputs), "{d:?}");
        // An illegal or disagreeing scale is not taken: the default 1 holds them to the
        // reference.
        let e = vec![ev(0.7, Update::Unknown); 4];
        assert_eq!(decide(&e, 2, None).basis, Basis::Default);
        let e = [
            ev(0.5, Update::Unknown),
            ev(1.0, Update::Unknown),
            ev(2.0, Update::Unknown),
        ];
        assert_eq!(decide(&e, 2, None).basis, Basis::Default);
    }

    #[test]
    fn the_option_overrides_and_no_reduction_decides_nothing() {
        let e = vec![ev(0.5, Update::Needs(0.5)); 4];
        let d = decide(&e, 2, Some(2.0));
        assert_eq!((d.scale, d.basis), (2.0, Basis::Option));
        assert_eq!(decide(&[], 2, None).basis, Basis::NoReduction);
    }

    #[test]
    fn updates_follow_from_both_fits() {
        let g = grads(256);
        let run: Vec<f32> = g.iter().map(|v| -0.1 * v).collect();
        let reff: Vec<f32> = g.iter().map(|v| -0.05 * v).collect();
        let u = Update::from_fits(proportion(&reff, &g), proportion(&run, &g));
        match u {
            Update::Needs(n) => assert!((n - 0.5).abs() < 1e-6, "{n}"),
            other => panic!("{other:?}"),
        }
        let adam: Vec<f32> = g.iter().map(|v| -1e-3 * v.signum()).collect();
        assert_eq!(
            Update::from_fits(proportion(&adam, &g), proportion(&run, &g)),
            Update::NotProportional
        );
        assert_eq!(
            Update::from_fits(None, proportion(&run, &g)),
            Update::Unknown
        );
        // An update rounded away (BF16 weights moved by far less than their resolution)
        // follows no gradient: it says nothing.
        let unresolved: Vec<f32> = (0..256)
            .map(|i| if i % 7 == 0 { 1e-3 } else { 0.0 })
            .collect();
        assert_eq!(
            Update::from_fits(proportion(&reff, &g), proportion(&unresolved, &g)),
            Update::Unknown
        );
    }
}
