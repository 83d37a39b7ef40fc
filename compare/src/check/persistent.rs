//! Weights found by persistence across steps, for runs where no GEMM recurs within a step
//! (one micro-batch): the micro-batch rule of [`super::replicas`] needs a GEMM that reads the
//! same operand twice in a step and finds nothing there.
//!
//! A training step reads its weights again in the next step, changed only by one optimizer
//! update, while activations and gradients are computed from new data. So on each rank, a
//! GEMM operand is a weight when, in the first two steps that rank holds, the same GEMM (same
//! module, API, shape and transposes, the n-th of that signature in its step, used once per
//! step) reads values that stay close: at least [`CLOSE_FRACTION`] of the sampled elements
//! within a relative [`CLOSE_RELATIVE`] of their previous value. New data moves almost every
//! element further than that. Assumption (documented in docs/check.md): each step trains on
//! new data; a run that feeds the same batch every step makes its activations look like
//! weights too.

use std::collections::BTreeMap;

use ttrace_format::reader::Store;
use ttrace_format::record::{Op, Role};

use crate::check::load::Rec;
use crate::trace::{is_float, to_f32};

/// Relative change below which an element counts as kept from one step to the next.
pub const CLOSE_RELATIVE: f32 = 0.125;
/// Fraction of sampled elements that must be kept for the operand to be a weight.
pub const CLOSE_FRACTION: f64 = 0.9;
/// Elements sampled per operand (evenly spaced), to bound what is decoded and compared (the
/// stored tensor is still decompressed whole).
const SAMPLE: usize = 4096;

/// A GEMM's identity on one rank, steps aside: NVTX module, API, m, n, k, transposes.
pub type Signature = (String, String, [u64; 5]);

/// One GEMM use of a signature that occurs once in its step: what the persistence rule and
/// the weights found by it read of its record (not the record: one is kept per GEMM and
/// step of the trace).
#[derive(Debug, Clone)]
pub struct Single {
    /// Rank, step and seq of the record.
    pub at: (u32, u64, u64),
    /// A and B.
    pub operands: [Option<Operand>; 2],
    /// CRC-32s of the FP8 scales of A and of B, when captured.
    pub scales: [Option<u32>; 2],
}

/// An operand tensor of a [`Single`].
#[derive(Debug, Clone, Copy)]
pub struct Operand {
    /// Its index among the record's tensors.
    pub index: usize,
    /// Its element type.
    pub dtype: ttrace_format::dtype::DType,
    /// The CRC-32 of its bytes, when captured.
    pub crc: Option<u32>,
}

impl Single {
    fn of(rec: &Rec) -> Single {
        let tensor = |role: Role| {
            rec.find(role).map(|index| {
                let t = &rec.record.tensors[index];
                Operand {
                    index,
                    dtype: t.dtype,
                    crc: t.captured.then_some(t.crc32),
                }
            })
        };
        let r = &rec.record;
        Single {
            at: (r.rank, r.step, r.seq),
            operands: [tensor(Role::A), tensor(Role::B)],
            scales: [
                tensor(Role::ScaleA).and_then(|t| t.crc),
                tensor(Role::ScaleB).and_then(|t| t.crc),
            ],
        }
    }
}

/// The GEMMs of `recs` (one rank) whose signature occurs exactly once in their step, by
/// signature and step.
pub fn singles(recs: &[&Rec]) -> BTreeMap<Signature, BTreeMap<u64, Single>> {
    let mut count: BTreeMap<(u64, Signature), Vec<&Rec>> = BTreeMap::new();
    for r in recs {
        let Op::Gemm(g) = &r.record.op else { continue };
        let sig = (
            r.record.nvtx.last().cloned().unwrap_or_default(),
            r.record.api.clone(),
            [g.m, g.n, g.k, g.transa as u64, g.transb as u64],
        );
        count.entry((r.record.step, sig)).or_default().push(r);
    }
    let mut out: BTreeMap<Signature, BTreeMap<u64, Single>> = BTreeMap::new();
    for ((step, sig), uses) in count {
        if let [rec] = uses[..] {
            out.entry(sig).or_default().insert(step, Single::of(rec));
        }
    }
    out
}

/// Which operands (0: A, 1: B) of each single-use signature are weights on this rank, judged
/// on the first two consecutive steps that hold the signature.
pub fn weight_operands(
    store: &Store,
    singles: &BTreeMap<Signature, BTreeMap<u64, Single>>,
) -> BTreeMap<Signature, usize> {
    let mut out = BTreeMap::new();
    for (sig, steps) in singles {
        let Some((u0, u1)) = steps
            .iter()
            .zip(steps.iter().skip(1))
            .find(|((a, _), (b, _))| **b == **a + 1)
            .map(|((_, u0), (_, u1))| (u0, u1))
        else {
            continue;
        };
        let kept: Vec<bool> = (0..2)
            .map(|op| match (u0.operands[op], u1.operands[op]) {
                (Some(o0), Some(o1)) => {
                    let a = sampled(store, u0.at, o0);
                    let b = sampled(store, u1.at, o1);
                    matches!((a, b), (Some(a), Some(b)) if persists(&a, &b))
                }
                _ => false,
            })
            .collect();
        // Both operands kept: nothing tells the weight from the data (a fixed batch).
        match (kept[0], kept[1]) {
            (true, false) => {
                out.insert(sig.clone(), 0);
            }
            (false, true) => {
                out.insert(sig.clone(), 1);
            }
            _ => {}
        }
    }
    out
}

/// Correlation across elements, below which an operand read in two steps is not one weight
/// moved by an update (see [`persists`]).
pub const MIN_CORRELATION: f64 = 0.9;

/// Whether `b` is `a` moved by an optimizer update: its elements mostly kept
/// ([`mostly_kept`]), and the two correlated across elements at [`MIN_CORRELATION`] or more.
/// An update moves each element by a small fraction of the weights' spread, so a weight's two
/// readings correlate almost perfectly (0.99 and up on the fixture trainer, whatever the
/// learning rate [`mostly_kept`] accepts). The correlation rules out an operand whose values
/// are all small on the scale of a few large ones, which [`mostly_kept`]'s RMS floor keeps
/// whatever they do: the gradient of the logits at initialisation, about 1/vocab everywhere
/// but -1 at each target token, read by the output layer's weight-gradient GEMM (correlation
/// about 0.1 between steps of new data).
pub fn persists(a: &[f32], b: &[f32]) -> bool {
    mostly_kept(a, b) && correlation(a, b).is_none_or(|c| c >= MIN_CORRELATION)
}

/// Pearson correlation of the finite pairs of `a` and `b`; `None` when either holds one
/// value throughout (no spread to correlate: [`mostly_kept`] alone decides).
fn correlation(a: &[f32], b: &[f32]) -> Option<f64> {
    let pairs = || {
        a.iter()
            .zip(b)
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|(x, y)| (f64::from(*x), f64::from(*y)))
    };
    let n = pairs().count() as f64;
    if n == 0.0 {
        return None;
    }
    let (sx, sy) = pairs().fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let (cxy, cxx, cyy) = pairs().fold((0.0, 0.0, 0.0), |(c, xx, yy), (x, y)| {
        let (dx, dy) = (x - mx, y - my);
        (c + dx * dy, xx + dx * dx, yy + dy * dy)
    });
    (cxx > 0.0 && cyy > 0.0).then(|| cxy / (cxx * cyy).sqrt())
}

/// Whether at least [`CLOSE_FRACTION`] of the elements of `b` lie within [`CLOSE_RELATIVE`]
/// of those of `a`, relative to the larger of the two magnitudes and the root mean square of
/// `a` (so that elements near zero, which an update moves by a large relative amount, count
/// as kept when they moved little on the tensor's scale; equal values count).
pub fn mostly_kept(a: &[f32], b: &[f32]) -> bool {
    if a.len() != b.len() || a.is_empty() {
        return false;
    }
    let rms = (a
        .iter()
        .filter(|x| x.is_finite())
        .map(|x| f64::from(*x).powi(2))
        .sum::<f64>()
        / a.len() as f64)
        .sqrt() as f32;
    let kept = a
        .iter()
        .zip(b)
        .filter(|(x, y)| {
            x == y
                || (x.is_finite()
                    && y.is_finite()
                    && (*x - *y).abs() <= CLOSE_RELATIVE * x.abs().max(y.abs()).max(rms))
        })
        .count();
    kept as f64 >= CLOSE_FRACTION * a.len() as f64
}

/// Up to [`SAMPLE`] evenly spaced elements of operand `op` of the record at (rank, step,
/// seq) (read back from the store), or `None` when not captured, unreadable or not a float
/// type.
fn sampled(store: &Store, (rank, step, seq): (u32, u64, u64), op: Operand) -> Option<Vec<f32>> {
    if op.crc.is_none() || !is_float(op.dtype) {
        return None;
    }
    let seg = store.open_segment(rank, step).ok()?;
    let view = seg.read_seq(seq)?.ok()?;
    let bytes = view.tensor_bytes(op.index).ok()?;
    let size = op.dtype.size().max(1);
    let stride = (bytes.len() / size).div_ceil(SAMPLE).max(1);
    let picked: Vec<u8> = bytes
        .chunks_exact(size)
        .step_by(stride)
        .flatten()
        .copied()
        .collect();
    to_f32(op.dtype, &picked).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_update_keeps_the_values_new_data_does_not() {
        let w: Vec<f32> = (0..1000)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let updated: Vec<f32> = w.iter().map(|x| x * 0.99 + 1e-3).collect();
        assert!(mostly_kept(&w, &updated));
        let new_data: Vec<f32> = (0..1000)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
            .collect();
        assert!(!mostly_kept(&w, &new_data));
    }

    #[test]
    fn an_adam_first_step_keeps_a_weight_while_its_step_is_below_an_eighth_of_the_rms() {
        // Adam's first update moves every element by the learning rate, whatever its size
        // (m / sqrt(v) = ±1): small elements move by far more than 12.5% of themselves and
        // count as kept only through the RMS floor. Weights of std 0.02 (GPT-2's init).
        let w: Vec<f32> = (0..4096)
            .map(|i| 0.02 * 2.0 * 3f32.sqrt() * (((i * 7919) % 4096) as f32 / 4096.0 - 0.5))
            .collect();
        let step = |lr: f32| -> Vec<f32> {
            w.iter()
                .enumerate()
                .map(|(i, x)| x - if i % 3 == 0 { lr } else { -lr })
                .collect()
        };
        assert!(mostly_kept(&w, &step(1e-3)));
        assert!(mostly_kept(&w, &step(2e-3)));
        // A step of a third of the RMS moves most elements too far: not a weight by this
        // rule (a large learning rate on small weights, without warmup).
        assert!(!mostly_kept(&w, &step(0.33 * 0.02)));
    }

    #[test]
    fn the_logits_gradient_at_initialisation_is_kept_by_the_rms_floor_but_is_no_weight() {
        // Softmax of near-zero logits minus one-hot targets, over a mean of 32 tokens: about
        // 1/64/32 everywhere (varying a little with the token), -1/32 at each row's target.
        // Two steps of new data: other tokens, other targets.
        let vocab = 64;
        let grad = |seed: usize| -> Vec<f32> {
            (0..32 * vocab)
                .map(|i| {
                    let (row, col) = (i / vocab, i % vocab);
                    let wobble = ((i * 7919 + seed * 104_729) % 101) as f32 / 101.0 - 0.5;
                    let p = (1.0 + 0.4 * wobble) / vocab as f32 / 32.0;
                    if col == (row * 13 + seed * 29) % vocab {
                        p - 1.0 / 32.0
                    } else {
                        p
                    }
                })
                .collect()
        };
        let (g0, g1) = (grad(0), grad(1));
        assert!(
            mostly_kept(&g0, &g1),
            "the RMS floor keeps the small values"
        );
        assert!(correlation(&g0, &g1).is_some_and(|c| c < 0.5));
        assert!(!persists(&g0, &g1));
        // A weight moved by an update persists.
        let w: Vec<f32> = (0..2048)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 2500.0)
            .collect();
        let moved: Vec<f32> = w
            .iter()
            .enumerate()
            .map(|(i, x)| x + if i.is_multiple_of(3) { 1e-3 } else { -1e-3 })
            .collect();
        assert!(persists(&w, &moved));
        // A constant operand has no spread to correlate: kept values decide.
        assert!(persists(&[0.5; 64], &[0.5; 64]));
    }

    #[test]
    fn identical_values_and_zeros_count_as_kept_nan_does_not() {
        assert!(mostly_kept(&[0.0; 10], &[0.0; 10]));
        assert!(!mostly_kept(&[f32::NAN; 10], &[1.0; 10]));
        assert!(!mostly_kept(&[], &[]));
        assert!(!mostly_kept(&[1.0], &[1.0, 2.0]));
    }
}
