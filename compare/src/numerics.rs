//! Where a rank's shard sits in the reference tensor, and how far it is off.
//!
//! A shard is placed without annotations by trying every way it can be cut out of the
//! reference: per dimension, the whole dimension, or one of `parts` slices of it, viewed as
//! `[outer, parts, inner]` (`outer` > 1: interleaved slices, e.g. a data-parallel batch slice
//! of a sequence-first activation). The placement with the smallest error wins: a correct
//! shard matches one placement to round-off and every other by O(1), and a wrong shard matches
//! none. Errors are relative Frobenius norms (as TTrace and Megatron-LM compute them), plus the
//! worst row, so an error confined to a few rows is not averaged away.

use std::collections::HashMap;

use rayon::prelude::*;

use crate::kernels::{self, IndexMap};
use crate::report::Merge;
use crate::trace::Values;

/// One cut of a dimension: view it as `[outer, parts, inner]` and keep slice `chunk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cut {
    /// Slices the dimension is cut into.
    pub parts: u64,
    /// Leading blocks (1: a contiguous slice).
    pub outer: u64,
    /// Which slice.
    pub chunk: u64,
}

/// How one dimension of a shard maps into the reference: the cuts applied to the reference
/// dimension, outermost first (none: the whole dimension). Two cuts express two parallel
/// splits of one dimension, e.g. attention's batch×heads dimension cut by DP and by TP.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DimSlice {
    /// Outermost first.
    pub cuts: Vec<Cut>,
}

impl DimSlice {
    /// The whole dimension.
    pub fn whole() -> DimSlice {
        DimSlice::default()
    }

    /// Total slices.
    pub fn parts(&self) -> u64 {
        self.cuts.iter().map(|c| c.parts).product()
    }

    /// The reference index of shard index `i` along this dimension (shard size `size`).
    fn map(&self, mut i: u64, size: u64) -> u64 {
        let mut out_size = size;
        for c in self.cuts.iter().rev() {
            let inner = (out_size / c.outer.max(1)).max(1);
            i = (i / inner) * c.parts * inner + c.chunk * inner + i % inner;
            out_size *= c.parts;
        }
        i
    }

    /// [`DimSlice::map`] for a shard dimension of `size`, its divisions by sizes done once:
    /// for the many indices of the samples a placement search maps.
    fn mapper(&self, size: u64) -> SliceMap {
        let mut out_size = size;
        let mut cuts = [(1u64, 0u64, 0u64); 2];
        let mut n = 0;
        let mut rest = Vec::new();
        for c in self.cuts.iter().rev() {
            let inner = (out_size / c.outer.max(1)).max(1);
            // Products wrap as `map`'s do (modulo 2^64, the same in any order).
            let step = (c.parts.wrapping_mul(inner), c.chunk.wrapping_mul(inner));
            match cuts.get_mut(n) {
                Some(slot) => *slot = (inner, step.0, step.1),
                None => rest.push((inner, step.0, step.1)),
            }
            n += 1;
            out_size = out_size.wrapping_mul(c.parts);
        }
        SliceMap {
            cuts,
            n: n.min(2),
            rest,
        }
    }
}

/// A [`DimSlice`] for one shard dimension size: per cut, innermost first, (inner block,
/// reference stride of a block, offset of the chunk).
struct SliceMap {
    cuts: [(u64, u64, u64); 2],
    n: usize,
    rest: Vec<(u64, u64, u64)>,
}

impl SliceMap {
    /// [`DimSlice::map`] of `i`.
    #[inline]
    fn map(&self, mut i: u64) -> u64 {
        for &(inner, stride, offset) in self.cuts[..self.n].iter().chain(&self.rest) {
            let q = i / inner;
            i = q
                .wrapping_mul(stride)
                .wrapping_add(offset)
                .wrapping_add(i - q * inner);
        }
        i
    }
}

/// Where a shard sits in the reference tensor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Placement {
    /// One entry per dimension of the shard.
    pub dims: Vec<DimSlice>,
}

impl Placement {
    /// The whole tensor.
    pub fn whole(ndim: usize) -> Placement {
        Placement {
            dims: vec![DimSlice::whole(); ndim],
        }
    }

    /// The merge kind for the report (`group_size` > 1: partial sums).
    pub fn merge(&self, ref_shape: &[u64], group_size: u32) -> Merge {
        if group_size > 1 {
            return Merge::Sum { group_size };
        }
        match self.dims.iter().position(|d| d.parts() > 1) {
            None => Merge::Replicated,
            Some(dim) => Merge::Slice {
                dim: dim.min(ref_shape.len().saturating_sub(1)),
                parts: self.dims[dim].parts(),
                outer: self.dims[dim]
                    .cuts
                    .iter()
                    .map(|c| c.outer)
                    .max()
                    .unwrap_or(1),
            },
        }
    }

    /// Where every element of a shard of `shard_shape` sits in a reference of `ref_shape`.
    pub fn index_map(&self, shard_shape: &[u64], ref_shape: &[u64]) -> IndexMap {
        let strides = row_major_strides(ref_shape);
        IndexMap::new(shard_shape, &strides, |d, i| {
            self.dims.get(d).map_or(i, |dim| dim.map(i, shard_shape[d]))
        })
    }
}

fn row_major_strides(shape: &[u64]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as usize;
    }
    s
}

fn divisors(n: u64) -> Vec<u64> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

/// Every way of cutting a reference dimension of size `r` down to `s` with one cut, or with
/// two when `two_cuts`.
fn dim_options(s: u64, r: u64, two_cuts: bool) -> Vec<DimSlice> {
    let ratio = r / s;
    let mut out = Vec::new();
    // One cut.
    for outer in divisors(s) {
        for chunk in 0..ratio {
            out.push(DimSlice {
                cuts: vec![Cut {
                    parts: ratio,
                    outer,
                    chunk,
                }],
            });
        }
    }
    // Two cuts: ratio = p1 * p2.
    for p1 in divisors(ratio)
        .into_iter()
        .filter(|p| two_cuts && *p > 1 && *p < ratio)
    {
        let p2 = ratio / p1;
        let mid = r / p1;
        for o1 in divisors(mid) {
            for c1 in 0..p1 {
                for o2 in divisors(s) {
                    for c2 in 0..p2 {
                        out.push(DimSlice {
                            cuts: vec![
                                Cut {
                                    parts: p1,
                                    outer: o1,
                                    chunk: c1,
                                },
                                Cut {
                                    parts: p2,
                                    outer: o2,
                                    chunk: c2,
                                },
                            ],
                        });
                    }
                }
            }
        }
    }
    out
}

/// The candidate placements of a shard of `shard` shape in a reference of `reff` shape
/// (`None`: it cannot be cut out of it), with dimensions cut twice when `two_cuts`.
pub fn candidates(shard: &[u64], reff: &[u64], two_cuts: bool) -> Option<Vec<Placement>> {
    if shard.len() != reff.len() {
        return None;
    }
    let mut per_dim: Vec<Vec<DimSlice>> = Vec::new();
    for (&s, &r) in shard.iter().zip(reff) {
        if s == r {
            per_dim.push(vec![DimSlice::whole()]);
        } else if s > 0 && r > s && r % s == 0 {
            per_dim.push(dim_options(s, r, two_cuts));
        } else {
            return None;
        }
    }
    let mut out = vec![Placement { dims: Vec::new() }];
    for opts in per_dim {
        let mut next = Vec::with_capacity(out.len() * opts.len());
        for p in &out {
            for o in &opts {
                let mut q = p.clone();
                q.dims.push(o.clone());
                next.push(q);
            }
        }
        out = next;
        if out.len() > 20_000 {
            return None;
        }
    }
    Some(out)
}

/// Error of a shard against its place in the reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShardError {
    /// ‖x − y‖ / ‖y‖ (relative Frobenius; absolute when ‖y‖ is 0).
    pub rel: f64,
    /// ‖x‖ / ‖y‖.
    pub norm_ratio: f64,
    /// Σ y² (to weigh shards when combining their norm ratios).
    pub ref_sq: f64,
    /// The worst row (last dimension) and its relative error against the tensor's RMS row.
    pub worst_row: Option<(u64, f64)>,
}

/// Errors of `x` against `y` (same length), rows of `row_len` elements.
pub fn shard_error(x: &[f32], y: &[f32], row_len: usize) -> ShardError {
    shard_error_scaled(x, y, row_len, 1.0)
}

/// [`shard_error`] of `x` divided by `scale` (in f32, element by element, as a copy divided
/// first would hold: the same numbers, without the copy).
pub fn shard_error_scaled(x: &[f32], y: &[f32], row_len: usize, scale: f32) -> ShardError {
    let rows = x.len() / row_len.max(1);
    error_of(kernels::sums(x, y, scale, row_len), rows)
}

/// The errors of `x` (divided by `scale`) at its place `map` in `reff`.
pub fn shard_error_at(x: &Values, reff: &Values, map: &IndexMap, scale: f32) -> ShardError {
    let rows = x.data.len() / map.row_len().max(1);
    error_of(kernels::sums_at(&x.data, &reff.data, map, scale), rows)
}

/// The errors from the sums over `rows` whole rows.
fn error_of(s: kernels::ErrorSums, rows: usize) -> ShardError {
    let (d2, y2, x2) = (s.d2, s.y2, s.x2);
    let rel = if y2 > 0.0 {
        (d2 / y2).sqrt()
    } else {
        d2.sqrt()
    };
    let norm_ratio = if y2 > 0.0 {
        (x2 / y2).sqrt()
    } else if x2 > 0.0 {
        f64::INFINITY
    } else {
        1.0
    };
    // A row's error relative to the RMS row norm: a wrong row in a healthy tensor stands out
    // even when tiny rows are noisy in relative terms.
    let mean_row_sq = if rows > 0 { y2 / rows as f64 } else { 0.0 };
    let worst_row = s.worst_row.map(|(i, rd)| {
        let e = if mean_row_sq > 0.0 {
            (rd / mean_row_sq).sqrt()
        } else {
            rd.sqrt()
        };
        (i, e)
    });
    ShardError {
        rel: if rel.is_nan() { f64::INFINITY } else { rel },
        norm_ratio,
        ref_sq: y2,
        worst_row,
    }
}

/// At most `count` elements of a shard spread over every coordinate, with their coordinates
/// along each dimension: computed once and screened against every candidate placement.
struct Samples {
    /// The shard's values there.
    values: Vec<f32>,
    /// Per sample, its index along each dimension (`ndim` entries).
    coords: Vec<u64>,
    ndim: usize,
}

/// Where [`Samples`] of a shard of `shape` holding `n` elements are taken: at most `count`
/// flat indices, spread over every coordinate, and each one's coordinates (`shape.len()` per
/// sample). A function of the shape alone, not of the values.
fn sample_places(shape: &[u64], n: usize, count: usize) -> (Vec<usize>, Vec<u64>) {
    let ndim = shape.len();
    // Spread the samples over every coordinate: a fixed stride that divides a row length
    // would only ever look at a few columns.
    const STEP: u64 = 2_654_435_761;
    let take = count.min(n);
    let mut picks = Vec::with_capacity(take);
    let mut coords = vec![0u64; take * ndim];
    for k in 0..take as u64 {
        let i = if n <= count { k } else { (k * STEP) % n as u64 };
        picks.push(i as usize);
        let mut flat = i;
        for d in (0..ndim).rev() {
            let size = shape[d].max(1);
            coords[k as usize * ndim + d] = flat % size;
            flat /= size;
        }
    }
    (picks, coords)
}

impl Samples {
    fn of(x: &Values, count: usize) -> Samples {
        let (picks, coords) = sample_places(&x.shape, x.data.len(), count);
        Samples {
            values: picks.iter().map(|&i| x.data[i]).collect(),
            coords,
            ndim: x.shape.len(),
        }
    }

    /// The reference offset along dimension `d` (of `size` in the shard, `stride` in the
    /// reference) of every sample, at `slice` of that dimension.
    fn offsets(&self, d: usize, size: u64, stride: usize, slice: &DimSlice) -> Vec<usize> {
        let m = slice.mapper(size.max(1));
        (0..self.values.len())
            .map(|k| m.map(self.coords[k * self.ndim + d]) as usize * stride)
            .collect()
    }

    /// [`Samples::error`] with each sample's reference offset the sum of `per_dim` (one
    /// [`Samples::offsets`] per dimension).
    fn error_at(&self, scale: f32, reff: &Values, per_dim: &[&[usize]]) -> f64 {
        if self.values.is_empty() {
            return 0.0;
        }
        let (mut d2, mut y2) = (0f64, 0f64);
        for (k, &v) in self.values.iter().enumerate() {
            let a = (v / scale) as f64;
            let j: usize = per_dim.iter().map(|o| o.get(k).copied().unwrap_or(0)).sum();
            let b = reff.data.get(j).copied().unwrap_or(f32::NAN) as f64;
            let d = if a == b { 0.0 } else { a - b };
            d2 += d * d;
            y2 += b * b;
        }
        relative(d2, y2)
    }

    /// The relative error of the samples (divided by `scale`) at `placement` in `reff`
    /// (row-major `strides`), of a shard of `shard_shape`.
    fn error(
        &self,
        scale: f32,
        reff: &Values,
        strides: &[usize],
        shard_shape: &[u64],
        placement: &Placement,
    ) -> f64 {
        if self.values.is_empty() {
            return 0.0;
        }
        let maps: Vec<SliceMap> = placement
            .dims
            .iter()
            .zip(shard_shape)
            .map(|(dim, &size)| dim.mapper(size.max(1)))
            .collect();
        let (mut d2, mut y2) = (0f64, 0f64);
        for (k, &v) in self.values.iter().enumerate() {
            let a = (v / scale) as f64;
            let at = &self.coords[k * self.ndim..(k + 1) * self.ndim];
            let j: usize = at
                .iter()
                .enumerate()
                .map(|(d, &i)| maps[d].map(i) as usize * strides[d])
                .sum();
            let b = reff.data.get(j).copied().unwrap_or(f32::NAN) as f64;
            let d = if a == b { 0.0 } else { a - b };
            d2 += d * d;
            y2 += b * b;
        }
        relative(d2, y2)
    }
}

/// `sqrt(d2 / y2)` (`sqrt(d2)` when `y2` is 0), a NaN read as infinite.
fn relative(d2: f64, y2: f64) -> f64 {
    let e = if y2 > 0.0 {
        (d2 / y2).sqrt()
    } else {
        d2.sqrt()
    };
    if e.is_nan() {
        f64::INFINITY
    } else {
        e
    }
}

/// A shard's place in the reference and the factor its values are divided by first.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    /// Where it sits.
    pub placement: Placement,
    /// The run's values are divided by this before comparing (1, or the DP size for
    /// gradients of a loss averaged over each rank's own batch).
    pub scale: f32,
    /// How far off it is.
    pub err: ShardError,
}

/// The fit of `x` at `placement` after dividing it by `scale`, over every element.
pub fn full_fit(x: &Values, reff: &Values, placement: Placement, scale: f32) -> Fit {
    let map = placement.index_map(&x.shape, &reff.shape);
    let err = shard_error_at(x, reff, &map, scale);
    Fit {
        placement,
        scale,
        err,
    }
}

/// The best placement of shard `x` in `reff`, trying `hints` first (the first with a
/// relative error of at most `accept` wins), then every candidate at every scale in
/// `scales`; `None` when the shapes cannot correspond.
pub fn place(
    x: &Values,
    reff: &Values,
    hints: &[(Placement, f32)],
    scales: &[f32],
    accept: f64,
) -> Option<Fit> {
    place_with(x, reff, hints, scales, accept, false)
}

/// [`place`], with `quick` taking the best remembered place when one exists and screening
/// candidates on fewer elements (for tensors after the first divergence, which only feed the
/// plot, the worst-tensor table and the count beyond tolerance).
pub fn place_with(
    x: &Values,
    reff: &Values,
    hints: &[(Placement, f32)],
    scales: &[f32],
    accept: f64,
    quick: bool,
) -> Option<Fit> {
    place_trusting(x, reff, hints, scales, (accept, accept), quick)
}

/// How many times smaller a remembered placement's error must be than every other
/// placement's screened error to be kept without a search.
const SEPARATION: f64 = 8.0;

/// Candidates of one search stage and their screened errors: (error, candidate, scale).
type Screen = (std::sync::Arc<Vec<Placement>>, Vec<(f64, usize, f32)>);

/// [`place_with`], where a remembered placement whose error is above `accept` but at most
/// `trust` is re-validated cheaply instead of searched again: kept when every other placement
/// (dimensions cut once) screens at least [`SEPARATION`] times worse. Runs drift apart over
/// the steps, and a correct shard stays one placement to round-off and every other by O(1).
///
/// The full error pass (every element) is made only where a sample of the shard leaves a
/// doubt ([`Skipping::On`]): a remembered place whose sample misses by [`HINT_MISS`] times
/// what it could be kept at, or a candidate of the search that samples [`SKIP_SEPARATION`]
/// times worse than the best one, is not measured in full. When the placement chosen that
/// way is beyond `trust` (a divergence, before the verdict: not `quick`), or not [`MARGIN`]
/// times better than the least of those samples, everything is measured in full again: the
/// divergence that decides the verdict is only ever found by the exhaustive search. A fit within `trust` chosen this way is that search's unless a
/// sample misjudges a place's error by more than these margins (errors concentrated on the
/// sampled elements).
pub fn place_trusting(
    x: &Values,
    reff: &Values,
    hints: &[(Placement, f32)],
    scales: &[f32],
    limits: (f64, f64),
    quick: bool,
) -> Option<Fit> {
    // The exhaustive search, when it follows, measures again much of what the sampled one
    // did: it takes those numbers instead (the same numbers: each a pure function of the
    // shard, the reference and what is measured).
    let mut measured = Measured::default();
    let (fit, skipped) = search_measured(
        (x, reff),
        (hints, scales),
        (limits, quick),
        Skipping::On,
        &mut measured,
    );
    // Nothing left unmeasured: the exhaustive search's own result.
    let Some(skipped) = skipped else {
        return fit;
    };
    // Before the verdict, a fit beyond what can be trusted (a divergence) is never chosen
    // on samples: an error that happens to sit where the samples are makes a fitting place
    // sample badly. After it (quick), tensors only feed the plot and the worst-tensor table.
    let (accept, trust) = limits;
    let decided = |f: &Fit| quick || f.err.rel <= accept.max(trust);
    match fit {
        // Anything left unmeasured sampled MARGIN times worse than the fit: not the best.
        Some(f) if decided(&f) && f.err.rel * MARGIN < skipped => Some(f),
        _ => {
            search_measured(
                (x, reff),
                (hints, scales),
                (limits, quick),
                Skipping::Off,
                &mut measured,
            )
            .0
        }
    }
}

/// What the searches of one placement ([`place_trusting`]) measured: screens, ranked
/// candidates and full fits, each a pure function of the shard, the reference and what is
/// measured (the number of threads does not change them), taken again instead of measured
/// again.
#[derive(Default)]
struct Measured {
    /// [`screen`] with one cut per dimension, then with two.
    screens: [Option<Option<Screen>>; 2],
    /// A stage's best screened candidates ranked on more samples (one cut, two cuts).
    ranked: [Option<Vec<(f64, usize, f32)>>; 2],
    /// Full fits by placement and scale (its bits).
    fits: HashMap<(Placement, u32), Fit>,
}

impl Measured {
    /// [`screen`] of `x` on 32 samples, with `two_cuts`.
    fn screen(
        &mut self,
        x: &Values,
        reff: &Values,
        scales: &[f32],
        two_cuts: bool,
    ) -> Option<Screen> {
        self.screens[usize::from(two_cuts)]
            .get_or_insert_with(|| screen(x, reff, scales, two_cuts, 32))
            .clone()
    }

    /// [`full_fit`] of `x` at `placement` and `scale`.
    fn fit(&mut self, x: &Values, reff: &Values, placement: &Placement, scale: f32) -> Fit {
        let key = (placement.clone(), scale.to_bits());
        if let Some(f) = self.fits.get(&key) {
            return f.clone();
        }
        let f = full_fit(x, reff, placement.clone(), scale);
        self.fits.insert(key, f.clone());
        f
    }

    /// [`full_fit`] of `x` at each of `wanted` (placement, scale), in that order; those not
    /// measured yet in parallel.
    fn fits(&mut self, x: &Values, reff: &Values, wanted: &[(&Placement, f32)]) -> Vec<Fit> {
        let missing: Vec<(Placement, f32)> = wanted
            .iter()
            .filter(|(p, s)| !self.fits.contains_key(&((*p).clone(), s.to_bits())))
            .map(|(p, s)| ((*p).clone(), *s))
            .collect();
        let new: Vec<Fit> = missing
            .into_par_iter()
            .map(|(p, s)| full_fit(x, reff, p, s))
            .collect();
        for f in new {
            self.fits
                .insert((f.placement.clone(), f.scale.to_bits()), f);
        }
        wanted
            .iter()
            .map(|(p, s)| {
                let key = ((*p).clone(), s.to_bits());
                match self.fits.get(&key) {
                    Some(f) => f.clone(),
                    None => full_fit(x, reff, key.0, *s),
                }
            })
            .collect()
    }
}

/// How many times worse than the fit chosen every placement left unmeasured must sample for
/// the choice to stand ([`place_trusting`]).
const MARGIN: f64 = 1.5;

/// How many times what a remembered place could be kept at (`accept`, `trust`) its sample
/// must miss by for its full error pass to be left out.
const HINT_MISS: f64 = 4.0;

/// How many times worse than the best candidate of a search the others must sample for their
/// full error passes to be left out (sampled errors are within some ten percent of the full
/// ones where the error is spread over the tensor, as it is at a wrong place).
const SKIP_SEPARATION: f64 = 2.0;

/// Elements of a shard sampled to decide which full error passes to make: a wrong place misses
/// by O(1), and each sample is a read at a random place of the reference (a cache miss),
/// so a few suffice and more would cost as much as a full pass of a small tensor.
const DOUBT_SAMPLES: usize = 128;

/// Elements of a shard sampled to rank a search's best screened candidates.
const RANK_SAMPLES: usize = 512;

/// Whether [`search`] leaves out the full error passes that samples rule out.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Skipping {
    On,
    Off,
}

/// The placement search of [`place_trusting`]: the best fit, and the least sampled error of
/// the placements it did not measure in full (`None` when none was left out).
#[cfg(test)]
fn search(
    x: &Values,
    reff: &Values,
    hints: &[(Placement, f32)],
    scales: &[f32],
    limits: (f64, f64),
    quick: bool,
    skipping: Skipping,
) -> (Option<Fit>, Option<f64>) {
    let mut fresh = Measured::default();
    search_measured(
        (x, reff),
        (hints, scales),
        (limits, quick),
        skipping,
        &mut fresh,
    )
}

/// [`search`], taking what `measured` holds instead of measuring it again, and adding what
/// it measures.
fn search_measured(
    (x, reff): (&Values, &Values),
    (hints, scales): (&[(Placement, f32)], &[f32]),
    ((accept, trust), quick): ((f64, f64), bool),
    skipping: Skipping,
    measured: &mut Measured,
) -> (Option<Fit>, Option<f64>) {
    let mut best: Option<Fit> = None;
    let mut one_cut: Option<Screen> = None;
    let mut skipped: Option<f64> = None;
    let strides = row_major_strides(&reff.shape);
    // Sampled once each, when first needed: to doubt a place, to rank candidates.
    let (mut doubt, mut rank): (Option<Samples>, Option<Samples>) = (None, None);
    // A remembered place is measured in full unless its sample misses clearly.
    let hint_skip = HINT_MISS * accept.max(trust);
    let mut first = true;
    for (p, s) in hints {
        if p.dims.len() != x.shape.len() {
            continue;
        }
        // The remembered scale first, then the others (a kind of tensor may carry the DP
        // gradient scale in one pass and not in another).
        let order = std::iter::once(*s).chain(scales.iter().copied().filter(|c| c != s));
        for scale in order {
            // The latest place is measured in full: it usually fits, and a sample (spread
            // over the reference) costs about as much as a full pass of a small tensor.
            // After the verdict (quick) a kind of tensor that fits none of its known places
            // is taken at the best of them: the others are sampled first as before it, and
            // where a sample comes within MARGIN of the best fit every one is measured
            // ([`place_trusting`]); measuring every one of a diverged tensor's four known
            // places in full was a third of compare's placement work on a run with a bug.
            let sample_first = !std::mem::take(&mut first);
            if skipping == Skipping::On && sample_first {
                let e =
                    sampled(&mut doubt, x, DOUBT_SAMPLES).error(scale, reff, &strides, &x.shape, p);
                if e > hint_skip {
                    skipped = Some(skipped.map_or(e, |s| s.min(e)));
                    continue;
                }
            }
            let f = measured.fit(x, reff, p, scale);
            if f.err.rel <= accept {
                return (Some(f), skipped);
            }
            if f.err.rel <= trust && !quick {
                let screen = match one_cut.take() {
                    Some(sc) => sc,
                    None => match measured.screen(x, reff, scales, false) {
                        Some(sc) => sc,
                        None => return (None, skipped),
                    },
                };
                if separated(&screen, &f) {
                    return (Some(f), skipped);
                }
                one_cut = Some(screen);
            }
            if best.as_ref().is_none_or(|b| f.err.rel < b.err.rel) {
                best = Some(f);
            }
        }
    }
    // One cut per dimension first; dimensions cut twice only when nothing simpler fits.
    // After the verdict (quick), a kind of tensor already placed that fits none of its known
    // places is taken as diverged there; before it, a search makes sure no other place fits.
    if quick && best.is_some() {
        return (best, skipped);
    }
    // A dimension cut twice (tensor- and data-parallel slices of one dimension: attention's
    // heads x batch) is searched after the verdict too: a kind of tensor first met then
    // takes this search's place as its provisional one, and a place from one cut only would
    // misplace every later tensor of that kind, counted beyond tolerance.
    for two_cuts in [false, true] {
        let (cands, mut scored) = match (two_cuts, one_cut.take()) {
            (false, Some(sc)) => sc,
            _ => match measured.screen(x, reff, scales, two_cuts) {
                Some(sc) => sc,
                None => return (None, skipped),
            },
        };
        scored.truncate(12);
        let rescored = scored.len() > 3 && !quick;
        let ranked = &mut measured.ranked[usize::from(two_cuts)];
        if let (true, Some(r)) = (rescored, ranked.as_ref()) {
            scored = r.clone();
        } else if rescored {
            let samples = sampled(&mut rank, x, RANK_SAMPLES);
            // Candidates share most of their dimensions' slices: each slice's sample offsets
            // are computed once (the same offsets, so the same errors, as one at a time).
            let mut offsets: Vec<HashMap<&DimSlice, Vec<usize>>> =
                vec![HashMap::new(); x.shape.len()];
            for &(_, c, _) in &scored {
                for (d, slice) in cands[c].dims.iter().enumerate() {
                    offsets[d]
                        .entry(slice)
                        .or_insert_with(|| samples.offsets(d, x.shape[d], strides[d], slice));
                }
            }
            // A few hundred elements each: a task each would cost more than the work.
            scored.par_iter_mut().with_min_len(4).for_each(|entry| {
                let per_dim: Vec<&[usize]> = cands[entry.1]
                    .dims
                    .iter()
                    .enumerate()
                    .map(|(d, slice)| offsets[d].get(slice).map_or(&[][..], |v| v.as_slice()))
                    .collect();
                entry.0 = samples.error_at(entry.2, reff, &per_dim);
            });
            scored.sort_by(|a, b| a.0.total_cmp(&b.0));
            *ranked = Some(scored.clone());
        }
        scored.truncate(3);
        if skipping == Skipping::On && scored.len() > 1 {
            let errors: Vec<f64> = if rescored {
                scored.iter().map(|e| e.0).collect()
            } else {
                let samples = sampled(&mut doubt, x, DOUBT_SAMPLES);
                scored
                    .iter()
                    .map(|e| samples.error(e.2, reff, &strides, &x.shape, &cands[e.1]))
                    .collect()
            };
            if let Some((m, others)) = clearly_best(&errors) {
                skipped = Some(skipped.map_or(others, |s| s.min(others)));
                scored = vec![scored[m]];
            }
        }
        let wanted: Vec<(&Placement, f32)> =
            scored.iter().map(|&(_, c, s)| (&cands[c], s)).collect();
        let fits = measured.fits(x, reff, &wanted);
        let fit = fits
            .into_iter()
            .min_by(|a, b| a.err.rel.total_cmp(&b.err.rel));
        if let Some(f) = fit {
            if best.as_ref().is_none_or(|b| f.err.rel < b.err.rel) {
                best = Some(f);
            }
        }
        if best.as_ref().is_some_and(|b| b.err.rel <= accept) {
            break;
        }
    }
    (best, skipped)
}

/// `count` samples of `x` for [`search`], taken on first use.
fn sampled<'s>(samples: &'s mut Option<Samples>, x: &Values, count: usize) -> &'s Samples {
    samples.get_or_insert_with(|| Samples::of(x, count))
}

/// The candidate whose sampled error is [`SKIP_SEPARATION`] times below every other's (and
/// the least of the others'), when there is one: the others need no full error pass.
fn clearly_best(errors: &[f64]) -> Option<(usize, f64)> {
    let m = (0..errors.len()).min_by(|&a, &b| errors[a].total_cmp(&errors[b]))?;
    let others = (0..errors.len())
        .filter(|&i| i != m)
        .map(|i| errors[i])
        .fold(f64::INFINITY, f64::min);
    // Samples that all match exactly (a constant or mostly zero tensor) tell nothing apart.
    (errors[m].is_finite() && others > 0.0 && others >= SKIP_SEPARATION * errors[m])
        .then_some((m, others))
}

/// Whether every other placement of `screen` screened at least [`SEPARATION`] times worse than
/// the full error of `fit`.
fn separated(screen: &Screen, fit: &Fit) -> bool {
    let others = screen
        .1
        .iter()
        .filter(|(_, c, sc)| !(screen.0[*c] == fit.placement && *sc == fit.scale))
        .map(|e| e.0)
        .fold(f64::INFINITY, f64::min);
    others >= SEPARATION * fit.err.rel
}

/// Every candidate placement (dimensions cut twice when `two_cuts`) at every scale, screened
/// on `samples` elements, best first; `None` when the shapes cannot correspond. In parallel,
/// in candidate order (a stable sort keeps ties in that order, so the winner does not depend
/// on the thread count).
fn screen(
    x: &Values,
    reff: &Values,
    scales: &[f32],
    two_cuts: bool,
    samples: usize,
) -> Option<Screen> {
    let plan = ScreenPlan::of(&x.shape, x.data.len(), &reff.shape, (two_cuts, samples))?;
    let cands = &plan.cands;
    // The samples' values; where they sit, and where each candidate puts them, the plan says.
    let picked = Samples {
        values: plan.picks.iter().map(|&i| x.data[i]).collect(),
        coords: Vec::new(),
        ndim: 0,
    };
    let jobs: Vec<(usize, f32)> = scales
        .iter()
        .flat_map(|&scale| (0..cands.len()).map(move |c| (c, scale)))
        .collect();
    // A candidate's screen reads `samples` elements: tasks of a few thousand at least (a
    // task per candidate cost more in scheduling than the work).
    let mut scored: Vec<(f64, usize, f32)> = jobs
        .into_par_iter()
        .with_min_len((4096 / samples.max(1)).max(1))
        .map(|(c, scale)| {
            let at = [plan.offsets[c].as_slice()];
            (picked.error_at(scale, reff, &at), c, scale)
        })
        .collect();
    scored.sort_by(|a, b| a.0.total_cmp(&b.0));
    Some((std::sync::Arc::clone(cands), scored))
}

/// What screening a shard of one shape in a reference of one shape reads, whatever their
/// values: the candidate placements, the sampled elements ([`sample_places`]) and, per
/// candidate, each sample's offset in the reference (the sum of its dimensions' offsets,
/// computed once per dimension's slice). Placement searches screen many tensors of the same
/// shapes (every group sum of a kind of GEMM output, step after step): made once per pair of
/// shapes and kept ([`ScreenPlan::of`]).
struct ScreenPlan {
    /// Shared with the screens made with the plan (each screen's candidates, not a copy).
    cands: std::sync::Arc<Vec<Placement>>,
    /// Flat indices of the sampled elements in the shard.
    picks: Vec<usize>,
    /// Per candidate, per sample, its offset in the reference.
    offsets: Vec<Vec<usize>>,
}

/// The shard's shape and element count, the reference's shape, two cuts, samples.
type PlanKey = (Vec<u64>, usize, Vec<u64>, bool, usize);

/// Bytes of sample offsets the plans kept may hold; past it they are all dropped.
const PLANS_BYTES: usize = 16 << 20;

impl ScreenPlan {
    /// The plan of a shard of `shape` holding `n` elements in a reference of `ref_shape`,
    /// (with `two_cuts`, on `samples` elements), kept for the next one; `None` when the
    /// shapes cannot correspond.
    fn of(
        shape: &[u64],
        n: usize,
        ref_shape: &[u64],
        (two_cuts, samples): (bool, usize),
    ) -> Option<std::sync::Arc<ScreenPlan>> {
        type Kept = (HashMap<PlanKey, Option<std::sync::Arc<ScreenPlan>>>, usize);
        static KEPT: std::sync::OnceLock<std::sync::Mutex<Kept>> = std::sync::OnceLock::new();
        let kept = KEPT.get_or_init(Default::default);
        let key: PlanKey = (shape.to_vec(), n, ref_shape.to_vec(), two_cuts, samples);
        if let Some(plan) = crate::prefetch::lock(kept).0.get(&key) {
            return plan.clone();
        }
        let plan = ScreenPlan::new(shape, n, ref_shape, two_cuts, samples).map(std::sync::Arc::new);
        let bytes = plan.as_ref().map_or(0, |p| {
            p.offsets.len() * p.picks.len() * std::mem::size_of::<usize>()
        });
        let mut kept = crate::prefetch::lock(kept);
        if kept.1 + bytes > PLANS_BYTES {
            *kept = Kept::default();
        }
        kept.1 += bytes;
        kept.0.insert(key, plan.clone());
        plan
    }

    fn new(
        shape: &[u64],
        n: usize,
        ref_shape: &[u64],
        two_cuts: bool,
        samples: usize,
    ) -> Option<ScreenPlan> {
        let cands = candidates(shape, ref_shape, two_cuts)?;
        let (picks, coords) = sample_places(shape, n, samples);
        let places = Samples {
            values: vec![0.0; picks.len()],
            coords,
            ndim: shape.len(),
        };
        let strides = row_major_strides(ref_shape);
        // Candidates share most of their dimensions' slices: each slice's sample offsets are
        // computed once, a candidate's are their sum.
        let mut per_slice: Vec<HashMap<&DimSlice, Vec<usize>>> = vec![HashMap::new(); shape.len()];
        for c in &cands {
            for (d, slice) in c.dims.iter().enumerate() {
                per_slice[d]
                    .entry(slice)
                    .or_insert_with(|| places.offsets(d, shape[d], strides[d], slice));
            }
        }
        let offsets = cands
            .iter()
            .map(|c| {
                let per_dim: Vec<&[usize]> = c
                    .dims
                    .iter()
                    .enumerate()
                    .map(|(d, slice)| per_slice[d].get(slice).map_or(&[][..], |v| v.as_slice()))
                    .collect();
                // The sum `Samples::error_at` forms per sample, formed once.
                (0..picks.len())
                    .map(|k| per_dim.iter().map(|o| o.get(k).copied().unwrap_or(0)).sum())
                    .collect()
            })
            .collect();
        Some(ScreenPlan {
            cands: std::sync::Arc::new(cands),
            picks,
            offsets,
        })
    }
}

/// The f64 product `alpha · op(A) · op(B) + beta · C` of a captured GEMM on the stored
/// layouts (column-major operands stored as `[cols, rows]`, batched as `[batch, cols, rows]`),
/// as the stored D layout (`[batch,] n, m`).
#[allow(clippy::too_many_arguments)]
pub fn gemm_f64(
    g: &ttrace_format::record::GemmOp,
    a: &[f32],
    b: &[f32],
    c: Option<&[f32]>,
    alpha: f64,
    beta: f64,
) -> Option<(Vec<f64>, Vec<f64>)> {
    let (m, n, k) = (g.m as usize, g.n as usize, g.k as usize);
    let batch = g.batch.max(1) as usize;
    let a_rows = if g.transa == 0 { m } else { k };
    let b_rows = if g.transb == 0 { k } else { n };
    if a.len() < batch * m * k || b.len() < batch * k * n {
        return None;
    }
    let mut d = vec![0f64; batch * m * n];
    // Σ |a||b| per element: the scale of the round-off bound.
    let mut abs = vec![0f64; batch * m * n];
    for bi in 0..batch {
        let (ao, bo, dof) = (bi * m * k, bi * k * n, bi * m * n);
        for j in 0..n {
            for i in 0..m {
                let (mut s, mut sa) = (0f64, 0f64);
                for p in 0..k {
                    // op(A)[i, p] and op(B)[p, j] in column-major storage.
                    let av = if g.transa == 0 {
                        a[ao + p * a_rows + i]
                    } else {
                        a[ao + i * a_rows + p]
                    } as f64;
                    let bv = if g.transb == 0 {
                        b[bo + j * b_rows + p]
                    } else {
                        b[bo + p * b_rows + j]
                    } as f64;
                    s += av * bv;
                    sa += (av * bv).abs();
                }
                let mut v = alpha * s;
                let mut va = alpha.abs() * sa;
                if beta != 0.0 {
                    let cv = c
                        .and_then(|c| c.get(dof + j * m + i))
                        .copied()
                        .unwrap_or(0.0) as f64;
                    v += beta * cv;
                    va += (beta * cv).abs();
                }
                d[dof + j * m + i] = v;
                abs[dof + j * m + i] = va;
            }
        }
    }
    Some((d, abs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ttrace_format::dtype::DType;

    /// Values of `shape` (f32) whose element `i` is `f(i)`.
    pub(super) fn vals(shape: &[u64], f: impl Fn(usize) -> f32) -> Values {
        let n: u64 = shape.iter().product();
        Values {
            shape: shape.to_vec(),
            data: (0..n as usize).map(f).collect::<Vec<f32>>().into(),
            dtype: DType::F32,
        }
    }

    #[test]
    fn a_slice_mapped_with_its_divisions_done_once_maps_every_index_as_one_at_a_time() {
        // Every candidate slice of a few shard/reference sizes (dimensions cut once and
        // twice), and three cuts, which no candidate has.
        let mut slices: Vec<(DimSlice, u64)> = Vec::new();
        for (s, r) in [(4u64, 8u64), (6, 24), (3, 12), (8, 64), (5, 5), (1, 16)] {
            for slice in dim_options(s, r, true) {
                slices.push((slice, s));
            }
        }
        let cut = |parts, outer, chunk| Cut {
            parts,
            outer,
            chunk,
        };
        slices.push((
            DimSlice {
                cuts: vec![cut(2, 1, 1), cut(3, 2, 2), cut(2, 4, 1)],
            },
            8,
        ));
        assert!(slices.iter().any(|(d, _)| d.cuts.len() == 2));
        for (slice, size) in &slices {
            let m = slice.mapper(*size);
            for i in 0..*size {
                assert_eq!(
                    m.map(i),
                    slice.map(i, *size),
                    "{slice:?} size {size} index {i}"
                );
            }
        }
    }

    #[test]
    fn a_column_shard_is_placed_at_its_offset() {
        let reff = vals(&[4, 6], |i| (i as f32).sin());
        // Rows 0..4, columns 2..4 of a [4, 6] tensor cut in 3.
        let shard = vals(&[4, 2], |i| {
            let (r, c) = (i / 2, i % 2);
            ((r * 6 + 2 + c) as f32).sin()
        });
        let f = place(&shard, &reff, &[], &[1.0], 0.0).expect("placeable");
        let (p, e) = (f.placement, f.err);
        assert_eq!(p.dims[1].cuts[0].chunk, 1);
        assert_eq!(p.dims[1].parts(), 3);
        assert_eq!(e.rel, 0.0);
    }

    #[test]
    fn an_interleaved_batch_slice_is_found() {
        // [s=3, B=4] tokens flattened as rows; DP rank 1 of 2 holds batch entries 2..4 of every
        // position: rows {p*4 + 2, p*4 + 3}.
        let reff = vals(&[12, 2], |i| (i as f32 * 0.37).cos());
        let rows: Vec<usize> = (0..3).flat_map(|p| [p * 4 + 2, p * 4 + 3]).collect();
        let shard = Values {
            shape: vec![6, 2],
            data: rows
                .iter()
                .flat_map(|&r| [reff.data[r * 2], reff.data[r * 2 + 1]])
                .collect::<Vec<f32>>()
                .into(),
            dtype: DType::F32,
        };
        let f = place(&shard, &reff, &[], &[1.0], 0.0).expect("placeable");
        let (p, e) = (f.placement, f.err);
        assert_eq!(e.rel, 0.0);
        assert_eq!(
            p.dims[0].cuts,
            vec![Cut {
                parts: 2,
                outer: 3,
                chunk: 1
            }]
        );
    }

    #[test]
    fn a_dimension_cut_twice_is_found() {
        // Attention's batch x heads dimension: z = b * NP + n over B = 4, NP = 4; DP rank 1
        // of 2 holds b in 2..4, TP rank 0 of 2 holds n in 0..2.
        let reff = vals(&[16, 3], |i| (i as f32 * 0.71).sin());
        let zs: Vec<usize> = (2..4)
            .flat_map(|b| (0..2).map(move |n| b * 4 + n))
            .collect();
        let shard = Values {
            shape: vec![4, 3],
            data: zs
                .iter()
                .flat_map(|&z| (0..3).map(move |c| z * 3 + c))
                .map(|k| reff.data[k])
                .collect::<Vec<f32>>()
                .into(),
            dtype: DType::F32,
        };
        // Before the verdict and after it (quick: a kind first met then takes this place for
        // every later tensor of the kind).
        for quick in [false, true] {
            let f = place_with(&shard, &reff, &[], &[1.0], 0.0, quick).expect("placeable");
            let (p, e) = (f.placement, f.err);
            assert_eq!(e.rel, 0.0, "quick {quick}: {p:?}");
            assert_eq!(p.dims[0].parts(), 4);
        }
    }

    #[test]
    fn a_wrong_shard_matches_no_placement() {
        let reff = vals(&[4, 6], |i| (i as f32).sin());
        let shard = vals(&[4, 2], |i| (i as f32 * 7.1).cos());
        let e = place(&shard, &reff, &[], &[1.0], 0.0)
            .expect("placeable")
            .err;
        assert!(e.rel > 0.3, "{}", e.rel);
    }

    #[test]
    fn a_scaled_tensor_reports_its_ratio() {
        let y: Vec<f32> = (0..64).map(|i| (i as f32).sin()).collect();
        let x: Vec<f32> = y.iter().map(|v| v * 2.0).collect();
        let e = shard_error(&x, &y, 8);
        assert!((e.norm_ratio - 2.0).abs() < 1e-9);
        assert!((e.rel - 1.0).abs() < 1e-9);
    }

    #[test]
    fn one_bad_row_stands_out() {
        let y: Vec<f32> = (0..1024).map(|i| 1.0 + (i as f32).sin() * 0.1).collect();
        let mut x = y.clone();
        for v in &mut x[64..80] {
            *v *= 1.5;
        }
        let e = shard_error(&x, &y, 16);
        let (row, err) = e.worst_row.expect("rows");
        assert_eq!(row, 4);
        assert!(err > 0.4 && e.rel < 0.1, "{err} {}", e.rel);
    }

    #[test]
    fn gemm_recompute_follows_cublas_layouts() {
        // C (2x2) = A^T (2x3 from a stored 3x2 col-major A) * B (3x2).
        let g = ttrace_format::record::GemmOp {
            transa: 1,
            lda: 3,
            ..ttrace_format::record::GemmOp::plain(2, 2, 3, 0)
        };
        // A col-major 3x2: columns [1,2,3] and [4,5,6]; B col-major 3x2: [1,0,1], [0,1,0].
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0];
        let (d, _) = gemm_f64(&g, &a, &b, None, 1.0, 0.0).expect("sizes");
        // D[i, j] = sum_p A[p, i] B[p, j]: D[0,0]=1+3=4, D[1,0]=4+6=10, D[0,1]=2, D[1,1]=5.
        assert_eq!(d, vec![4.0, 10.0, 2.0, 5.0]);
    }
}
#[cfg(test)]
mod screening_tests {
    use super::tests::vals;
    use super::*;
    use ttrace_format::dtype::DType;

    #[test]
    fn a_dp_slice_of_a_sequence_first_activation_survives_the_screening() {
        // [s = 16, B = 4] tokens x 64 features; DP rank 1 of 2 holds b in 2..4.
        let reff = Values {
            shape: vec![64, 64],
            data: (0..4096)
                .map(|i| ((i as f32) * 0.618).sin())
                .collect::<Vec<f32>>()
                .into(),
            dtype: DType::F32,
        };
        let rows: Vec<usize> = (0..16).flat_map(|p| [p * 4 + 2, p * 4 + 3]).collect();
        let shard = Values {
            shape: vec![32, 64],
            data: rows
                .iter()
                .flat_map(|&r| (0..64).map(move |c| r * 64 + c))
                .map(|k| reff.data[k])
                .collect::<Vec<f32>>()
                .into(),
            dtype: DType::F32,
        };
        let f = place(&shard, &reff, &[], &[1.0, 2.0], 0.0).expect("placeable");
        assert_eq!(f.err.rel, 0.0, "{:?}", f.placement);
    }

    fn rows_of(reff: &Values, rows: std::ops::Range<usize>, noise: f32) -> Values {
        let w = reff.shape[1] as usize;
        Values {
            shape: vec![rows.len() as u64, w as u64],
            data: reff.data[rows.start * w..rows.end * w]
                .iter()
                .enumerate()
                .map(|(i, v)| v * (1.0 + noise * (i as f32 * 1.3).sin()))
                .collect::<Vec<f32>>()
                .into(),
            dtype: DType::F32,
        }
    }

    fn half_of_rows(chunk: u64) -> Placement {
        Placement {
            dims: vec![
                DimSlice {
                    cuts: vec![Cut {
                        parts: 2,
                        outer: 1,
                        chunk,
                    }],
                },
                DimSlice::whole(),
            ],
        }
    }

    #[test]
    fn a_drifted_hint_within_tolerance_is_kept_when_no_other_place_comes_close() {
        let reff = Values {
            shape: vec![8, 64],
            data: (0..512)
                .map(|i| ((i as f32) * 0.37).sin())
                .collect::<Vec<f32>>()
                .into(),
            dtype: DType::F32,
        };
        // Rows 4..8 with 1 % noise: above `accept` (1e-4), within `trust` (5 %).
        let shard = rows_of(&reff, 4..8, 0.01);
        let searched = place_with(&shard, &reff, &[], &[1.0, 2.0], 1e-4, false).expect("fits");
        let kept = place_trusting(
            &shard,
            &reff,
            &[(half_of_rows(1), 1.0)],
            &[1.0, 2.0],
            (1e-4, 0.05),
            false,
        )
        .expect("fits");
        assert_eq!(kept.placement, half_of_rows(1));
        assert_eq!(kept, searched);
        // A search finds the hint's place too, so the above holds with or without the
        // re-validation: that it is what keeps the hint is asserted on its decision.
        let one_cut = screen(&shard, &reff, &[1.0, 2.0], false, 32).expect("placeable");
        assert!(separated(&one_cut, &kept));
        assert!(
            kept.err.rel > 1e-4 && kept.err.rel < 0.05,
            "{}",
            kept.err.rel
        );
    }

    #[test]
    fn a_hint_that_another_place_fits_better_is_searched_again() {
        // The two halves of the rows differ by 3 %: the hint (the wrong half) is within
        // `trust`, the right half fits exactly and must win.
        let reff = Values {
            shape: vec![8, 64],
            data: (0..512)
                .map(|i| {
                    let v = ((i % 256) as f32 * 0.37).sin();
                    if i >= 256 {
                        v * (1.0 + 0.03 * ((i as f32) * 0.9).cos())
                    } else {
                        v
                    }
                })
                .collect::<Vec<f32>>()
                .into(),
            dtype: DType::F32,
        };
        let shard = rows_of(&reff, 4..8, 0.0);
        let wrong_hint = full_fit(&shard, &reff, half_of_rows(0), 1.0);
        assert!(wrong_hint.err.rel < 0.05, "{}", wrong_hint.err.rel);
        let one_cut = screen(&shard, &reff, &[1.0], false, 32).expect("placeable");
        assert!(!separated(&one_cut, &wrong_hint));
        let f = place_trusting(
            &shard,
            &reff,
            &[(half_of_rows(0), 1.0)],
            &[1.0],
            (1e-4, 0.05),
            false,
        )
        .expect("fits");
        assert_eq!(f.placement, half_of_rows(1));
        assert_eq!(f.err.rel, 0.0);
    }

    #[test]
    fn placements_left_unmeasured_by_their_samples_change_nothing_the_full_search_finds() {
        // 32 rows of 64: shards of 8 rows, at each of four places, clean, noisy, scaled or
        // made of another tensor (a divergence, where every place misfits alike).
        let reff = Values {
            shape: vec![32, 64],
            data: (0..2048)
                .map(|i| ((i as f32) * 0.37).sin() * (1.0 + (i / 64) as f32))
                .collect::<Vec<f32>>()
                .into(),
            dtype: DType::F32,
        };
        let quarter = |chunk: u64| Placement {
            dims: vec![
                DimSlice {
                    cuts: vec![Cut {
                        parts: 4,
                        outer: 1,
                        chunk,
                    }],
                },
                DimSlice::whole(),
            ],
        };
        let scaled = |v: &Values, k: f32| Values {
            data: v.data.iter().map(|x| x * k).collect::<Vec<f32>>().into(),
            ..v.clone()
        };
        let other = Values {
            data: (0..512)
                .map(|i| ((i as f32) * 1.91).cos())
                .collect::<Vec<f32>>()
                .into(),
            ..rows_of(&reff, 0..8, 0.0)
        };
        let mut unmeasured = 0;
        for chunk in 0..4u64 {
            let rows = chunk as usize * 8..(chunk as usize + 1) * 8;
            let shards = [
                rows_of(&reff, rows.clone(), 0.0),
                rows_of(&reff, rows.clone(), 0.02),
                scaled(&rows_of(&reff, rows.clone(), 0.0), 2.0),
                other.clone(),
            ];
            for x in &shards {
                for hints in [
                    vec![],
                    vec![(quarter(chunk), 1.0)],
                    vec![(quarter(3 - chunk), 1.0)],
                ] {
                    for quick in [false, true] {
                        let limits = (1e-4, 0.05);
                        let scales = [1.0, 2.0];
                        let got = place_trusting(x, &reff, &hints, &scales, limits, quick);
                        let (fast, skipped) =
                            search(x, &reff, &hints, &scales, limits, quick, Skipping::On);
                        let (full, _) =
                            search(x, &reff, &hints, &scales, limits, quick, Skipping::Off);
                        assert_eq!(got, full, "chunk {chunk} hints {hints:?} quick {quick}");
                        if skipped.is_some() && fast == full {
                            unmeasured += 1;
                        }
                    }
                }
            }
        }
        assert!(unmeasured > 0, "the samples left some full passes out");
    }

    /// [`screen`] as it was before plans were kept: every sample's offset formed from its
    /// coordinates for this tensor.
    fn screen_directly(x: &Values, reff: &Values, scales: &[f32], two_cuts: bool) -> Screen {
        let cands = candidates(&x.shape, &reff.shape, two_cuts).expect("placeable");
        let picked = Samples::of(x, 32);
        let strides = row_major_strides(&reff.shape);
        let mut scored: Vec<(f64, usize, f32)> = Vec::new();
        for &scale in scales {
            for (c, cand) in cands.iter().enumerate() {
                let per_dim: Vec<Vec<usize>> = cand
                    .dims
                    .iter()
                    .enumerate()
                    .map(|(d, slice)| picked.offsets(d, x.shape[d], strides[d], slice))
                    .collect();
                let at: Vec<&[usize]> = per_dim.iter().map(Vec::as_slice).collect();
                scored.push((picked.error_at(scale, reff, &at), c, scale));
            }
        }
        scored.sort_by(|a, b| a.0.total_cmp(&b.0));
        (std::sync::Arc::new(cands), scored)
    }

    #[test]
    fn a_screening_plan_kept_for_its_shapes_screens_other_values_as_one_made_for_them() {
        let reff = vals(&[24, 48], |i| ((i as f32) * 0.41).sin());
        let scales = [1.0, 2.0];
        for two_cuts in [false, true] {
            for salt in [0.0f32, 0.5, 3.0] {
                // Another tensor of the same shapes each time: the plan made for the first.
                let x = vals(&[8, 24], |i| ((i as f32) * 0.77 + salt).cos());
                let plan = ScreenPlan::of(&x.shape, 192, &reff.shape, (two_cuts, 32));
                let again = ScreenPlan::of(&x.shape, 192, &reff.shape, (two_cuts, 32));
                assert!(
                    matches!((&plan, &again), (Some(a), Some(b)) if std::sync::Arc::ptr_eq(a, b)),
                    "kept"
                );
                let got = screen(&x, &reff, &scales, two_cuts, 32).expect("placeable");
                assert_eq!(got, screen_directly(&x, &reff, &scales, two_cuts));
            }
        }
        let odd = vals(&[7, 24], |i| i as f32);
        assert!(ScreenPlan::of(&odd.shape, 168, &reff.shape, (false, 32)).is_none());
    }

    #[test]
    fn an_exhaustive_search_taking_the_sampled_ones_measurements_finds_what_a_fresh_one_does() {
        // A [24, 48] reference; shards of a third of its rows or columns, clean, scaled by
        // 2, or of another tensor (every place misfits: both stages and every rank run).
        let reff = vals(&[24, 48], |i| {
            ((i as f32) * 0.29).sin() * (1.0 + (i / 48) as f32)
        });
        let rows = rows_of(&reff, 8..16, 0.0);
        let cols = vals(&[24, 16], |i| reff.data[(i / 16) * 48 + 16 + i % 16]);
        let other = vals(&[8, 48], |i| ((i as f32) * 1.7).cos());
        let twice = |v: &Values| Values {
            data: v.data.iter().map(|x| x * 2.0).collect::<Vec<f32>>().into(),
            ..v.clone()
        };
        for x in [&rows, &cols, &other, &twice(&rows)] {
            for quick in [false, true] {
                let (limits, scales) = ((1e-4, 0.05), [1.0, 2.0]);
                let mut measured = Measured::default();
                let (sampled, _) = search_measured(
                    (x, &reff),
                    (&[], &scales),
                    (limits, quick),
                    Skipping::On,
                    &mut measured,
                );
                assert!(
                    !measured.fits.is_empty(),
                    "the sampled search measured fits"
                );
                let (taken, _) = search_measured(
                    (x, &reff),
                    (&[], &scales),
                    (limits, quick),
                    Skipping::Off,
                    &mut measured,
                );
                let (fresh, _) = search(x, &reff, &[], &scales, limits, quick, Skipping::Off);
                assert_eq!(taken, fresh, "shape {:?} quick {quick}", x.shape);
                let (again, _) = search(x, &reff, &[], &scales, limits, quick, Skipping::On);
                assert_eq!(sampled, again, "shape {:?} quick {quick}", x.shape);
            }
        }
    }

    #[test]
    fn a_divergence_is_never_found_on_samples_alone() {
        // A shard that fits rows 0..8 to 3e-5, but whose whole error sits on the elements
        // the samples read (tiny there, so each is off by half); rows 8..16 agree with it
        // exactly on those elements and are 1.3 times it everywhere else (off by 0.23).
        // Sampled, the wrong place looks perfect and the right one bad.
        const STEP: u64 = 2_654_435_761;
        let (rows, w) = (32usize, 256usize);
        let n = 8 * w;
        let sampled: std::collections::HashSet<usize> = (0..RANK_SAMPLES as u64)
            .map(|k| ((k * STEP) % n as u64) as usize)
            .collect();
        let base: Vec<f32> = (0..n)
            .map(|i| match sampled.contains(&i) {
                true => 1e-4,
                false => 1.0 + 0.5 * (i as f32 * 0.37).sin(),
            })
            .collect();
        let shard: Vec<f32> = (0..n)
            .map(|i| {
                if sampled.contains(&i) {
                    1.5e-4
                } else {
                    base[i]
                }
            })
            .collect();
        let mut data = base.clone();
        data.extend((0..n).map(|i| match sampled.contains(&i) {
            true => shard[i],
            false => base[i] * 1.3,
        }));
        data.extend((0..rows * w - 2 * n).map(|i| (i as f32 * 1.91).cos()));
        let reff = Values {
            shape: vec![rows as u64, w as u64],
            data: data.into(),
            dtype: DType::F32,
        };
        let x = Values {
            shape: vec![8, w as u64],
            data: shard.into(),
            dtype: DType::F32,
        };
        let limits = (1e-4, 0.05);
        let (full, _) = search(&x, &reff, &[], &[1.0], limits, false, Skipping::Off);
        let full = full.expect("placeable");
        assert!(full.err.rel <= limits.0, "it fits: {:?}", full.err);
        let got = place_trusting(&x, &reff, &[], &[1.0], limits, false);
        assert_eq!(got, Some(full), "the exhaustive search's fit");
    }
}
