//! Reads, from the traces, how the weights move after a data-parallel reduction: the
//! evidence [`super::decide`] weighs.
//!
//! A reduced gradient updates some weight in code ttrace does not capture; the weight is read
//! again by a GEMM of the next step. Which operand that is, is found in the reference, by
//! data: the GEMM operand (A or B) of step t+1 with as many elements as the gradient whose
//! change since step t (the same operand: the n-th GEMM of its signature in the step) follows
//! the reference's gradient most closely (cosine at least 0.5). An optimizer updates weights
//! element by element, so the gradient and the weight share their element order. The run's
//! weight is the same operand of the run GEMMs aligned with those reference GEMMs on the
//! rank that reduced the gradient.
//!
//! Only the first two steps that have a next step are read: the convention is a property of
//! the program, and this bounds the cost on long runs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rayon::prelude::*;
use ttrace_format::record::{Record, Role};

use super::{median_magnitude, proportion, proportion_split, Proportion, Update};
use crate::align::{Alignment, RefOp};
use crate::trace::{gemm, RunTrace, Values};
use crate::CompareError;

/// A GEMM's signature in its step: API and (m, n, k, transa, transb).
type Signature = (String, [u64; 5]);

fn signature(r: &Record) -> Option<Signature> {
    let g = gemm(r)?;
    Some((
        r.api.clone(),
        [g.m, g.n, g.k, u64::from(g.transa), u64::from(g.transb)],
    ))
}

/// The weight a reference gradient updates: the operand `role` of the reference GEMM `at`
/// (step t) and `next` (step t+1), and how its change follows the gradient.
#[derive(Debug, Clone)]
struct RefWeight {
    at: RefOp,
    next: RefOp,
    role: Role,
    fit: Proportion,
}

/// Reads weight updates for reductions (see the module doc).
pub struct Updates<'a> {
    reff: &'a RunTrace,
    ref_rank: u32,
    run: &'a RunTrace,
    al: &'a Alignment,
    /// Steps whose reductions are looked at (each with its next step compared too).
    steps: Vec<u64>,
    /// The weight of each reference gradient, once searched.
    weights: BTreeMap<RefOp, Option<RefWeight>>,
    /// Reference operands' changes from step t to t+1, by their checksums in both steps
    /// (each read once per step, not once per gradient searched), up to [`DELTA_CACHE`].
    deltas: BTreeMap<(u64, u32, u32), Option<Delta>>,
    delta_bytes: usize,
}

/// The most bytes of reference operand changes kept while weights are searched.
const DELTA_CACHE: usize = 64 << 20;

/// The most bytes of candidate weight changes fitted at once, on every core.
const FIT_BATCH: usize = DELTA_CACHE / 4;

/// A reference operand's change from step t to t+1, shared by the candidates fitted.
type Delta = Arc<Vec<f32>>;

/// A candidate weight of a gradient: its operand in step t and t+1, and its change.
type Candidate = (RefOp, RefOp, Role, Delta);

impl<'a> Updates<'a> {
    /// Over the compared `steps` of `run` and its reference.
    pub fn new(
        reff: &'a RunTrace,
        ref_rank: u32,
        run: &'a RunTrace,
        al: &'a Alignment,
        steps: &[u64],
    ) -> Updates<'a> {
        let steps = steps
            .iter()
            .copied()
            .filter(|s| steps.contains(&(s + 1)))
            .take(2)
            .collect();
        Updates {
            reff,
            ref_rank,
            run,
            al,
            steps,
            weights: BTreeMap::new(),
            deltas: BTreeMap::new(),
            delta_bytes: 0,
        }
    }

    /// What the next step's weights say of a reduced gradient: `x`, the reduction's output
    /// over elements `e0..e1` of the D of `writer` (a run GEMM on `rank`, aligned with
    /// `ref_op`, whose D is the reference gradient `g`).
    pub fn of(
        &mut self,
        rank: u32,
        writer: &Record,
        ref_op: RefOp,
        g: &Values,
        (e0, e1): (usize, usize),
        x: &[f32],
    ) -> Result<Update, CompareError> {
        if !self.steps.contains(&ref_op.0) {
            return Ok(Update::Unknown);
        }
        if !self.weights.contains_key(&ref_op) {
            let w = self.find(ref_op, g)?;
            self.weights.insert(ref_op, w);
        }
        let Some(w) = self.weights.get(&ref_op).cloned().flatten() else {
            return Ok(Update::Unknown);
        };
        let d_elems = writer
            .tensors
            .iter()
            .find(|t| t.role == Role::D)
            .map_or(0, |t| t.elements() as usize);
        let (Some(before), Some(after)) = (
            self.run_operand(rank, w.at, w.role)?,
            self.run_operand(rank, w.next, w.role)?,
        ) else {
            return Ok(Update::Unknown);
        };
        if before.data.len() != d_elems || after.data.len() != d_elems || e1 > d_elems {
            return Ok(Update::Unknown);
        }
        let dw: Vec<f32> = after.data[e0..e1]
            .iter()
            .zip(&before.data[e0..e1])
            .map(|(a, b)| a - b)
            .collect();
        Ok(Update::from_fits(Some(w.fit), proportion(&dw, x)))
    }

    /// The operand `role` of the run GEMM on `rank` aligned with reference op `op`.
    fn run_operand(
        &self,
        rank: u32,
        op: RefOp,
        role: Role,
    ) -> Result<Option<Values>, CompareError> {
        let Some(seq) = self
            .al
            .of_ref
            .get(&op)
            .and_then(|v| v.iter().find(|s| s.0 == rank).map(|s| s.1))
        else {
            return Ok(None);
        };
        match self.run.record(rank, op.0, seq) {
            Some(r) => self.run.values(&r, role),
            None => Ok(None),
        }
    }

    /// Searches the reference for the weight `g` (the D of `ref_op`) updates.
    fn find(&mut self, ref_op: RefOp, g: &Values) -> Result<Option<RefWeight>, CompareError> {
        let (t, next) = (ref_op.0, ref_op.0 + 1);
        let at = ordinals(&self.reff.records(self.ref_rank, t));
        let mut best: Option<RefWeight> = None;
        let mut n_of: BTreeMap<Signature, u64> = BTreeMap::new();
        // A weight read by several GEMMs (every micro-batch, forward and backward) is fitted
        // once: its copies share their checksum.
        let mut seen: BTreeSet<(u32, u32)> = BTreeSet::new();
        // The gradient's halves are the same for every candidate weight: split once.
        let Some(median) = median_magnitude(&g.data) else {
            return Ok(None);
        };
        let screen = Screen::of(&g.data);
        // Candidates are read in order, fitted a batch at a time on every core, and the best
        // chosen in their order: the same choice whatever the number of threads.
        let mut batch: Vec<Candidate> = Vec::new();
        let mut batch_bytes = 0usize;
        for r1 in self.reff.records(self.ref_rank, next).iter() {
            let Some(sig) = signature(r1) else { continue };
            let n = n_of.entry(sig.clone()).or_default();
            let ordinal = *n;
            *n += 1;
            let Some(&seq0) = at.get(&(sig, ordinal)) else {
                continue;
            };
            let Some(r0) = self.reff.record(self.ref_rank, t, seq0) else {
                continue;
            };
            let r0 = &*r0;
            for role in [Role::A, Role::B] {
                let crc = |r: &Record| {
                    r.tensors
                        .iter()
                        .find(|x| x.role == role && x.captured)
                        .filter(|x| x.elements() as usize == g.data.len())
                        .map(|x| x.crc32)
                };
                // Same size, captured in both steps, changed (an updated weight), not seen.
                let (Some(c0), Some(c1)) = (crc(r0), crc(r1)) else {
                    continue;
                };
                if c0 == c1 || !seen.insert((c0, c1)) {
                    continue;
                }
                let key = (t, c0, c1);
                if !self.deltas.contains_key(&key) {
                    let dw = delta(self.reff, (r0, r1), role, g.data.len())?.map(Arc::new);
                    let bytes = dw.as_ref().map_or(0, |d| d.len() * 4);
                    if self.delta_bytes + bytes > DELTA_CACHE {
                        self.deltas.clear();
                        self.delta_bytes = 0;
                    }
                    self.delta_bytes += bytes;
                    self.deltas.insert(key, dw);
                }
                let Some(Some(dw)) = self.deltas.get(&key) else {
                    continue;
                };
                // Most candidates are other weights of the same size: a sample of their
                // change tells them from the gradient's weight before they are fitted.
                if !screen.may_follow(|i| dw[i]) {
                    continue;
                }
                batch_bytes += dw.len() * 4;
                batch.push(((t, seq0), (next, r1.seq), role, Arc::clone(dw)));
                if batch_bytes >= FIT_BATCH {
                    fit_batch(&mut best, std::mem::take(&mut batch), &g.data, median);
                    batch_bytes = 0;
                }
            }
        }
        fit_batch(&mut best, batch, &g.data, median);
        Ok(best)
    }
}

/// Elements of a gradient sampled (evenly spaced) to screen its candidate weights.
const SCREEN_SAMPLES: usize = 4096;

/// Nonzero gradient elements the sample must hold to be trusted: fewer (a small or sparse
/// gradient, like an embedding's) and every candidate is fitted.
const SCREEN_NONZERO: usize = 512;

/// Sampled |cosine| under which a candidate is not fitted: a weight is chosen only at a
/// cosine of 0.5 or more, and the sampled cosine of one that reaches it lies within a few
/// hundredths of its cosine (a standard error of at most 1/sqrt(512)).
const SCREEN_COSINE: f64 = 0.25;

/// A gradient's sample, for telling candidate weight changes that cannot follow it
/// ([`Screen::may_follow`]) before they are fitted whole: on the large benchmark config
/// most candidates of a gradient are the other layers' weights of its size.
struct Screen {
    /// Every `stride`-th element is sampled (`None`: nothing is screened).
    stride: Option<usize>,
    /// The sampled gradient.
    g: Vec<f32>,
}

impl Screen {
    fn of(g: &[f32]) -> Screen {
        let stride = g.len() / SCREEN_SAMPLES;
        let sample: Vec<f32> = if stride >= 2 {
            g.iter().step_by(stride).copied().collect()
        } else {
            Vec::new()
        };
        let nonzero = sample.iter().filter(|v| **v != 0.0).count();
        let trusted = nonzero >= SCREEN_NONZERO && sample.iter().all(|v| v.is_finite());
        Screen {
            stride: trusted.then_some(stride),
            g: sample,
        }
    }

    /// Whether a change (element `i` given by `dw`) may follow the gradient: its sampled
    /// |cosine| with it is at least [`SCREEN_COSINE`], or the sample cannot tell.
    fn may_follow(&self, dw: impl Fn(usize) -> f32) -> bool {
        let Some(stride) = self.stride else {
            return true;
        };
        let (mut xy, mut xx, mut yy) = (0f64, 0f64, 0f64);
        for (k, &g) in self.g.iter().enumerate() {
            let (x, y) = (f64::from(dw(k * stride)), f64::from(g));
            xy += x * y;
            xx += x * x;
            yy += y * y;
        }
        // A change the sample does not see (zero there, or not finite) is fitted whole.
        if !(xx > 0.0 && xy.is_finite() && xx.is_finite()) {
            return true;
        }
        xy.abs() >= SCREEN_COSINE * (xx * yy).sqrt()
    }
}

/// Fits the candidates of `batch` in parallel and keeps, in their order, the first that
/// follows the gradient `g` best (cosine at least 0.5) in `best`.
fn fit_batch(best: &mut Option<RefWeight>, batch: Vec<Candidate>, g: &[f32], median: f32) {
    let fits: Vec<Option<Proportion>> = batch
        .par_iter()
        .map(|c| proportion_split(&c.3, g, median))
        .collect();
    for ((at, next, role, _), fit) in batch.into_iter().zip(fits) {
        let Some(fit) = fit else { continue };
        let better = best
            .as_ref()
            .is_none_or(|b| fit.cosine.abs() > b.fit.cosine.abs());
        if fit.cosine.abs() >= 0.5 && better {
            *best = Some(RefWeight {
                at,
                next,
                role,
                fit,
            });
        }
    }
}

/// The change of operand `role` from `r0` to `r1` (`None` unless both hold `n` elements).
fn delta(
    reff: &RunTrace,
    (r0, r1): (&Record, &Record),
    role: Role,
    n: usize,
) -> Result<Option<Vec<f32>>, CompareError> {
    let (Some(w0), Some(w1)) = (reff.values(r0, role)?, reff.values(r1, role)?) else {
        return Ok(None);
    };
    if w0.data.len() != n || w1.data.len() != n {
        return Ok(None);
    }
    Ok(Some(
        w1.data
            .iter()
            .zip(w0.data.iter())
            .map(|(a, b)| a - b)
            .collect(),
    ))
}

/// (signature, n-th GEMM of that signature) → seq, over one step's records.
fn ordinals(recs: &[Record]) -> BTreeMap<(Signature, u64), u64> {
    let mut n_of: BTreeMap<Signature, u64> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for r in recs {
        let Some(sig) = signature(r) else { continue };
        let n = n_of.entry(sig.clone()).or_default();
        out.insert((sig, *n), r.seq);
        *n += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1).
    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    #[test]
    fn the_screen_keeps_a_change_that_follows_the_gradient_and_drops_unrelated_ones() {
        let n = 1 << 16;
        let g = noise(n, 1);
        let screen = Screen::of(&g);
        assert!(
            screen.stride.is_some(),
            "a large dense gradient is screened"
        );
        // SGD's update, with the noise of BF16 weights: followed (cosine about -0.7).
        let rounding = noise(n, 2);
        let sgd: Vec<f32> = g
            .iter()
            .zip(&rounding)
            .map(|(g, r)| -0.01 * g + 0.01 * r)
            .collect();
        assert!(screen.may_follow(|i| sgd[i]));
        // Another weight's change: unrelated (cosine about 0).
        let other = noise(n, 3);
        assert!(!screen.may_follow(|i| other[i]));
        // A change the sample does not see is fitted whole.
        assert!(screen.may_follow(|i| if i % 2 == 1 { 1.0 } else { 0.0 }));
    }

    #[test]
    fn small_and_sparse_gradients_are_not_screened() {
        let other = noise(1 << 16, 3);
        // Fewer elements than two samples' worth: every candidate is fitted.
        let small = noise(SCREEN_SAMPLES, 1);
        assert!(Screen::of(&small).may_follow(|i| other[i]));
        // An embedding's gradient: a few rows of 1024 nonzero, the rest zero.
        let mut sparse = vec![0f32; 1 << 16];
        for row in [3usize, 17, 40] {
            sparse[row * 1024..(row + 1) * 1024].copy_from_slice(&noise(1024, row as u64));
        }
        let screen = Screen::of(&sparse);
        assert!(screen.stride.is_none());
        assert!(screen.may_follow(|i| other[i]));
    }
}
