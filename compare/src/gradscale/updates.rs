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

use super::{proportion_of_change, proportion_split, Proportion, Update};
use crate::align::{Alignment, RefOp};
use crate::kernels::median_magnitude;
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
        let change = proportion_of_change(&after.data[e0..e1], &before.data[e0..e1], x);
        Ok(Update::from_fits(Some(w.fit), change))
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
