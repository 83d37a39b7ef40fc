//! The per-element kernels of compare: squared-error sums of a shard against its place in the
//! reference, read straight out of the reference (no gathered copy, no index vector).
//!
//! Sums run over fixed blocks of whole rows, in parallel, each row in `LANES` independent f64
//! accumulators (the compiler vectorizes them; one dependent accumulator per sum could not).
//! Block boundaries depend only on the tensor's shape, and blocks are combined in order, so
//! the numbers are the same whatever the number of threads.

use rayon::prelude::*;

/// Independent accumulators per sum within a row.
const LANES: usize = 8;
/// Elements per parallel block (whole rows): large enough that a block outweighs its
/// scheduling, small enough that a large tensor keeps every core busy.
const BLOCK_ELEMS: usize = 1 << 15;

/// Squared sums of a shard `x` (divided by a scale) against reference values `y`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorSums {
    /// Σ (x − y)², equal elements (infinities too) counting 0.
    pub d2: f64,
    /// Σ y².
    pub y2: f64,
    /// Σ x².
    pub x2: f64,
    /// The row with the largest Σ (x − y)² (the last of equals) and that sum.
    pub worst_row: Option<(u64, f64)>,
}

impl ErrorSums {
    const ZERO: ErrorSums = ErrorSums {
        d2: 0.0,
        y2: 0.0,
        x2: 0.0,
        worst_row: None,
    };

    /// Adds the sums of the rows after `self`'s (in order: the result does not depend on
    /// how the rows were split).
    fn then(self, later: ErrorSums) -> ErrorSums {
        let worst_row = match (self.worst_row, later.worst_row) {
            (Some(a), Some(b)) => Some(if b.1.total_cmp(&a.1).is_ge() { b } else { a }),
            (a, b) => b.or(a),
        };
        ErrorSums {
            d2: self.d2 + later.d2,
            y2: self.y2 + later.y2,
            x2: self.x2 + later.x2,
            worst_row,
        }
    }
}

/// (Σ d², Σ y², Σ x²) of one row, `x` divided by `scale` (in f32, as the stored values
/// would be) when it is not 1. Whole chunks of [`LANES`] go through the AVX2 loop where the
/// CPU has it ([`crate::simd`], bit-identical), the rest through the portable one.
#[inline]
fn row_sums(x: &[f32], y: &[f32], scale: f32) -> (f64, f64, f64) {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &y[..n]);
    let mut acc: crate::simd::Lanes = [[0f64; LANES]; 3];
    let done = crate::simd::add_chunks(x, y, scale, &mut acc);
    let (x, y) = (&x[done..], &y[done..]);
    if scale == 1.0 {
        add_lanes(x, y, |v| v, &mut acc);
    } else {
        add_lanes(x, y, |v| v / scale, &mut acc);
    }
    let [d, yy, xx] = &acc;
    (lanes_total(d), lanes_total(yy), lanes_total(xx))
}

/// The portable loop: element `i` of `x` and `y` into lane `i % LANES` of `acc`.
#[inline(always)]
fn add_lanes(x: &[f32], y: &[f32], load: impl Fn(f32) -> f32 + Copy, acc: &mut crate::simd::Lanes) {
    let [d, yy, xx] = acc;
    let xc = x.chunks_exact(LANES);
    let yc = y.chunks_exact(LANES);
    let (xr, yr) = (xc.remainder(), yc.remainder());
    let mut add = |l: usize, a: f32, b: f32| {
        let (a, b) = (load(a) as f64, b as f64);
        let e = diff(a, b);
        d[l] += e * e;
        yy[l] += b * b;
        xx[l] += a * a;
    };
    for (xa, ya) in xc.zip(yc) {
        for l in 0..LANES {
            add(l, xa[l], ya[l]);
        }
    }
    for (l, (&a, &b)) in xr.iter().zip(yr).enumerate() {
        add(l, a, b);
    }
}

/// `a - b`, and 0 for equal values (equal infinities differ by nothing): a select the
/// compiler turns into a compare and a mask, not a branch, so that it vectorizes.
#[inline(always)]
fn diff(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        a - b
    }
}

/// Sum of the lanes, pairwise (a fixed order).
#[inline]
fn lanes_total(v: &[f64; LANES]) -> f64 {
    ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]))
}

/// Where each shard element sits in the reference: per dimension, the reference offset
/// (index times stride) of every shard index. Built once per placement; the last dimension
/// is usually contiguous, and then a shard row is a slice of the reference.
#[derive(Debug, Clone)]
pub struct IndexMap {
    /// Per shard dimension (a scalar is one dimension of 1), reference offsets.
    offsets: Vec<Vec<usize>>,
    /// The last dimension's offsets are `first + i`.
    contiguous_rows: bool,
}

impl IndexMap {
    /// The map of a shard of `shard_shape` whose index `i` along dimension `d` goes to
    /// reference index `map(d, i)`, in a reference of row-major `ref_strides`.
    pub fn new(
        shard_shape: &[u64],
        ref_strides: &[usize],
        map: impl Fn(usize, u64) -> u64,
    ) -> IndexMap {
        let mut offsets: Vec<Vec<usize>> = shard_shape
            .iter()
            .zip(ref_strides)
            .enumerate()
            .map(|(d, (&s, &st))| (0..s).map(|i| map(d, i) as usize * st).collect())
            .collect();
        if offsets.is_empty() {
            offsets.push(vec![0]);
        }
        let last = offsets.last().map_or(&[][..], |v| v.as_slice());
        let contiguous_rows = last.windows(2).all(|w| w[1] == w[0] + 1);
        IndexMap {
            offsets,
            contiguous_rows,
        }
    }

    /// Elements per row (the last dimension).
    pub fn row_len(&self) -> usize {
        self.offsets.last().map_or(1, Vec::len)
    }

    /// Elements of the shard.
    pub fn len(&self) -> usize {
        self.offsets.iter().map(Vec::len).product()
    }

    /// Whether the shard has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The reference offset of the first element of shard row `row`.
    fn row_base(&self, mut row: usize) -> usize {
        let mut base = 0;
        for t in self.offsets[..self.offsets.len() - 1].iter().rev() {
            let n = t.len().max(1);
            base += t.get(row % n).copied().unwrap_or(0);
            row /= n;
        }
        base
    }

    /// The reference offset of shard element `flat` (row-major).
    pub fn offset(&self, flat: usize) -> usize {
        let row_len = self.row_len().max(1);
        let last = self.offsets.last().map_or(&[][..], |v| v.as_slice());
        self.row_base(flat / row_len) + last.get(flat % row_len).copied().unwrap_or(0)
    }

    /// Reference row `row` of the shard: a slice of `reff` when contiguous, else gathered
    /// into `buf`; elements outside `reff` read as NaN.
    fn row<'a>(&self, reff: &'a [f32], row: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
        let base = self.row_base(row);
        let last = self.offsets.last().map_or(&[][..], |v| v.as_slice());
        if self.contiguous_rows {
            let lo = base + last.first().copied().unwrap_or(0);
            if let Some(s) = reff.get(lo..lo + last.len()) {
                return s;
            }
        }
        buf.clear();
        buf.extend(
            last.iter()
                .map(|&o| reff.get(base + o).copied().unwrap_or(f32::NAN)),
        );
        buf
    }

    /// The reference values of shard elements `lo..hi`, in the shard's layout (elements
    /// outside `reff` read as NaN), a row at a time.
    pub fn gather(&self, reff: &[f32], lo: usize, hi: usize) -> Vec<f32> {
        let row_len = self.row_len().max(1);
        let hi = hi.min(self.len());
        let mut out = Vec::with_capacity(hi.saturating_sub(lo));
        let mut buf = Vec::new();
        let mut i = lo;
        while i < hi {
            let (r, c0) = (i / row_len, i % row_len);
            let c1 = row_len.min(c0 + (hi - i));
            let row = self.row(reff, r, &mut buf);
            out.extend_from_slice(&row[c0.min(row.len())..c1.min(row.len())]);
            i += c1 - c0;
        }
        out
    }
}

/// Error sums of `x` (divided by `scale`) against `y`, same layout, rows of `row_len`.
pub fn sums(x: &[f32], y: &[f32], scale: f32, row_len: usize) -> ErrorSums {
    let n = x.len().min(y.len());
    let row_len = row_len.max(1);
    blocked(n, row_len, |r0, r1| {
        let mut acc = ErrorSums::ZERO;
        for r in r0..r1 {
            let (lo, hi) = (r * row_len, ((r + 1) * row_len).min(n));
            acc = acc.then(one_row(r, &x[lo..hi], &y[lo..hi], scale));
        }
        acc
    })
}

/// Error sums of `x` (divided by `scale`) against its place `map` in `reff`.
pub fn sums_at(x: &[f32], reff: &[f32], map: &IndexMap, scale: f32) -> ErrorSums {
    let n = x.len().min(map.len());
    let row_len = map.row_len().max(1);
    blocked(n, row_len, |r0, r1| {
        let mut buf = Vec::new();
        let mut acc = ErrorSums::ZERO;
        for r in r0..r1 {
            let (lo, hi) = (r * row_len, ((r + 1) * row_len).min(n));
            let y = map.row(reff, r, &mut buf);
            acc = acc.then(one_row(r, &x[lo..hi], &y[..hi - lo], scale));
        }
        acc
    })
}

/// Σ (x − y)² relative to Σ y² (absolute when Σ y² is 0): the relative Frobenius error alone,
/// without rows.
pub fn rel_error(x: &[f32], y: &[f32]) -> f64 {
    let s = sums(x, y, 1.0, BLOCK_ELEMS);
    let rel = if s.y2 > 0.0 {
        (s.d2 / s.y2).sqrt()
    } else {
        s.d2.sqrt()
    };
    if rel.is_nan() {
        f64::INFINITY
    } else {
        rel
    }
}

/// How concentrated the difference of `x` from `y` is, element by element relative to the
/// element's own size: the share of Σ (d_i / m_i)² held by its `top` largest terms, with
/// `d_i = x_i − y_i` and `m_i = max(|y_i|, floor)` (1 when at most `top` elements differ).
/// Relative, so that a tensor whose few large elements carry most of its norm (outlier
/// channels, "massive activations") and so most of any proportional difference does not look
/// concentrated; `floor` (the tensor's median magnitude, [`median_magnitude`]) keeps elements
/// near zero from dominating.
/// 0 when x and y are equal, or when the difference is not finite (a NaN or an infinity:
/// not a measure of round-off).
pub fn top_share(x: &[f32], y: &[f32], top: usize, floor: f64) -> f64 {
    if top == 0 {
        return 0.0;
    }
    // The `top` largest terms seen so far, and the least of them: most elements are below
    // it and cost one comparison.
    let mut kept: Vec<f64> = Vec::with_capacity(top);
    let mut least = 0f64;
    let mut total = 0f64;
    for (&a, &b) in x.iter().zip(y) {
        let d = (f64::from(a) - f64::from(b)) / f64::from(b).abs().max(floor);
        let d2 = d * d;
        // NaN makes the total NaN (and the share 0, below).
        total += d2;
        if d2.is_nan() || d2 <= least {
            continue;
        }
        if kept.len() < top {
            kept.push(d2);
            if kept.len() == top {
                least = kept.iter().copied().fold(f64::INFINITY, f64::min);
            }
        } else {
            if let Some(slot) = kept.iter_mut().find(|k| **k == least) {
                *slot = d2;
            }
            least = kept.iter().copied().fold(f64::INFINITY, f64::min);
        }
    }
    if !(total.is_finite() && total > 0.0) {
        return 0.0;
    }
    kept.iter().sum::<f64>() / total
}

/// The median of `|g|` (the element at `len / 2` in total order): the typical size of a
/// tensor's elements whatever its outliers (the gradient's halves of
/// `gradscale::proportion_split`, the scale of a round-off jump's elements). `None` when `g`
/// is empty.
pub fn median_magnitude(g: &[f32]) -> Option<f32> {
    if g.is_empty() {
        return None;
    }
    // |v| has its sign bit clear, NaN included: the total order of magnitudes is the order
    // of their bits as integers. The element of rank len/2 is found by its bits, 16 at a time
    // (a count of each value of the high half, then of the low half among those whose high
    // half it must have): two passes, no copy, no sort.
    let mut rank = g.len() / 2;
    if g.len() < 1 << 16 {
        // Smaller than the counts: selected among a copy.
        let mut mags: Vec<u32> = g.iter().map(|v| v.abs().to_bits()).collect();
        return Some(f32::from_bits(*mags.select_nth_unstable(rank).1));
    }
    let mut counts = vec![0u32; 1 << 16];
    for v in g {
        counts[(v.abs().to_bits() >> 16) as usize] += 1;
    }
    let high = nth_bucket(&counts, &mut rank);
    counts.fill(0);
    for v in g {
        let bits = v.abs().to_bits();
        if bits >> 16 == high {
            counts[(bits & 0xffff) as usize] += 1;
        }
    }
    let low = nth_bucket(&counts, &mut rank);
    Some(f32::from_bits(high << 16 | low))
}

/// The bucket that holds the element of rank `rank` among `counts` (in bucket order); `rank`
/// becomes its rank within that bucket.
fn nth_bucket(counts: &[u32], rank: &mut usize) -> u32 {
    for (bucket, &n) in counts.iter().enumerate() {
        if *rank < n as usize {
            return bucket as u32;
        }
        *rank -= n as usize;
    }
    counts.len() as u32 - 1
}

fn one_row(r: usize, x: &[f32], y: &[f32], scale: f32) -> ErrorSums {
    let (d2, y2, x2) = row_sums(x, y, scale);
    ErrorSums {
        d2,
        y2,
        x2,
        worst_row: Some((r as u64, d2)),
    }
}

/// `block(first row, end row)` over every row of `n` elements in rows of `row_len`, in fixed
/// blocks (in parallel when there are several), combined in order.
fn blocked(
    n: usize,
    row_len: usize,
    block: impl Fn(usize, usize) -> ErrorSums + Sync,
) -> ErrorSums {
    let rows = n.div_ceil(row_len);
    let per_block = (BLOCK_ELEMS / row_len).max(1);
    let blocks = rows.div_ceil(per_block);
    let range = |b: usize| (b * per_block, ((b + 1) * per_block).min(rows));
    if blocks <= 1 {
        return block(0, rows);
    }
    let parts: Vec<ErrorSums> = (0..blocks)
        .into_par_iter()
        .map(|b| {
            let (r0, r1) = range(b);
            block(r0, r1)
        })
        .collect();
    parts.into_iter().fold(ErrorSums::ZERO, ErrorSums::then)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain sequential sums the kernels must agree with (to summation order).
    fn reference_sums(x: &[f32], y: &[f32], scale: f32, row_len: usize) -> ErrorSums {
        let mut acc = ErrorSums::ZERO;
        for (r, (xr, yr)) in x.chunks(row_len).zip(y.chunks(row_len)).enumerate() {
            let (mut d2, mut y2, mut x2) = (0f64, 0f64, 0f64);
            for (&a, &b) in xr.iter().zip(yr) {
                let (a, b) = ((a / scale) as f64, b as f64);
                let d = if a == b { 0.0 } else { a - b };
                d2 += d * d;
                y2 += b * b;
                x2 += a * a;
            }
            acc = acc.then(ErrorSums {
                d2,
                y2,
                x2,
                worst_row: Some((r as u64, d2)),
            });
        }
        acc
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
    }

    #[test]
    fn blocked_sums_agree_with_plain_sums_on_large_and_ragged_tensors() {
        // Three blocks and a ragged tail: 100_003 elements in rows of 37.
        let n = 100_003;
        let y: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.013).sin()).collect();
        let mut x: Vec<f32> = y.iter().map(|v| v * 2.0).collect();
        x[77_777] = 50.0;
        for scale in [1.0, 2.0] {
            let got = sums(&x, &y, scale, 37);
            let want = reference_sums(&x, &y, scale, 37);
            assert!(close(got.d2, want.d2), "{got:?} {want:?}");
            assert!(close(got.y2, want.y2) && close(got.x2, want.x2));
            assert_eq!(got.worst_row.map(|w| w.0), Some(77_777 / 37));
        }
    }

    #[test]
    fn sums_do_not_depend_on_the_number_of_threads() {
        let n = 300_000;
        let y: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.7).cos()).collect();
        let x: Vec<f32> = y.iter().map(|v| v * (1.0 + 1e-3)).collect();
        let run = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool")
                .install(|| sums(&x, &y, 1.0, 64))
        };
        let one = run(1);
        assert_eq!(one, run(2));
        assert_eq!(one, run(5));
    }

    #[test]
    fn the_vector_loop_gives_the_portable_loops_bits_on_odd_lengths_and_non_finite_values() {
        // Whatever the CPU, row sums are those of the portable loop, bit for bit.
        let mut y: Vec<f32> = (0..1003).map(|i| ((i as f32) * 0.37).sin() * 1e3).collect();
        let mut x: Vec<f32> = y.iter().map(|v| v * (1.0 + 1e-4)).collect();
        y[5] = f32::INFINITY;
        x[5] = f32::INFINITY;
        x[9] = f32::NEG_INFINITY;
        y[700] = f32::NAN;
        x[1000] = 1e-40;
        for n in [0, 1, 7, 8, 9, 15, 64, 701, 1003] {
            for scale in [1.0, 2.0, 3.0] {
                let mut acc: crate::simd::Lanes = [[0f64; LANES]; 3];
                add_lanes(&x[..n], &y[..n], |v| v / scale, &mut acc);
                let want = (
                    lanes_total(&acc[0]),
                    lanes_total(&acc[1]),
                    lanes_total(&acc[2]),
                );
                let got = row_sums(&x[..n], &y[..n], scale);
                let bits = |t: (f64, f64, f64)| (t.0.to_bits(), t.1.to_bits(), t.2.to_bits());
                assert_eq!(
                    bits(got),
                    bits(want),
                    "n {n} scale {scale}: {got:?} {want:?}"
                );
            }
        }
    }

    #[test]
    fn equal_infinities_count_as_no_error_and_a_nan_as_infinite() {
        let y = [f32::INFINITY, 1.0, 2.0];
        assert_eq!(sums(&y, &y, 1.0, 3).d2, 0.0);
        assert!(rel_error(&[f32::NAN, 1.0, 2.0], &y).is_infinite());
    }

    #[test]
    fn a_strided_place_reads_the_right_reference_elements() {
        // Columns 2..4 of a [3, 6] reference: contiguous rows at offset 2; every other column:
        // a gathered row.
        let reff: Vec<f32> = (0..18).map(|i| i as f32).collect();
        let slice = IndexMap::new(&[3, 2], &[6, 1], |d, i| if d == 1 { 2 + i } else { i });
        assert_eq!(slice.gather(&reff, 0, 6), vec![2., 3., 8., 9., 14., 15.]);
        // Any range, row by row or not, reads what element-wise offsets say.
        for (lo, hi) in [(0, 6), (1, 4), (3, 3), (5, 6)] {
            let want: Vec<f32> = (lo..hi).map(|i| reff[slice.offset(i)]).collect();
            assert_eq!(slice.gather(&reff, lo, hi), want, "{lo}..{hi}");
        }
        let every_other = IndexMap::new(&[3, 3], &[6, 1], |d, i| if d == 1 { 2 * i } else { i });
        assert_eq!(every_other.gather(&reff, 2, 5), vec![4., 6., 8.]);
        // Outside the reference: NaN.
        let beyond = IndexMap::new(&[2, 2], &[6, 1], |d, i| if d == 0 { 2 + i } else { 4 + i });
        let got = beyond.gather(&reff, 0, 4);
        assert_eq!(&got[..2], &[16., 17.]);
        assert!(got[2].is_nan() && got[3].is_nan());
        let strided = IndexMap::new(&[3, 3], &[6, 1], |d, i| if d == 1 { 2 * i } else { i });
        let x = [0., 2., 4., 6., 8., 10., 12., 14., 16.];
        assert_eq!(sums_at(&x, &reff, &strided, 1.0).d2, 0.0);
        assert_eq!(
            sums_at(&x, &reff, &slice, 1.0).worst_row.map(|w| w.0),
            Some(2)
        );
    }

    #[test]
    fn the_top_share_says_how_concentrated_a_difference_is() {
        let y: Vec<f32> = (0..4096).map(|i| 1.0 + (i as f32) * 1e-3).collect();
        // Every element one ulp off: spread out.
        let spread: Vec<f32> = y.iter().map(|v| f32::from_bits(v.to_bits() + 1)).collect();
        assert!(top_share(&spread, &y, 10, 1.0) < 0.01);
        // Three elements far off, the rest one ulp: concentrated.
        let mut jump = spread.clone();
        for i in [7, 1000, 4000] {
            jump[i] += 1e-2;
        }
        assert!(top_share(&jump, &y, 10, 1.0) > 0.99);
        assert_eq!(top_share(&y, &y, 10, 1.0), 0.0);
        // At most `top` elements differ: all of it.
        let mut few = y.clone();
        few[3] = 5.0;
        assert_eq!(top_share(&few, &y, 10, 1.0), 1.0);
        // Not finite: not a measure of round-off.
        few[5] = f32::NAN;
        assert_eq!(top_share(&few, &y, 10, 1.0), 0.0);
        // A few outliers a thousand times larger carry most of the norm, and so most of a
        // difference proportional to each element (a few ulps everywhere): not concentrated
        // once each element's difference is taken relative to its own size.
        let outliers: Vec<f32> = (0..4096)
            .map(|i| if i % 512 == 0 { 1000.0 } else { 1.0 } * (1.0 + (i as f32) * 1e-4))
            .collect();
        let proportional: Vec<f32> = outliers
            .iter()
            .map(|v| f32::from_bits(v.to_bits() + 3))
            .collect();
        let typical = f64::from(median_magnitude(&outliers).expect("not empty"));
        // Every element over one scale (a floor above them all): the outliers hold it.
        assert!(top_share(&proportional, &outliers, 10, 1e6) > 0.9);
        assert!(top_share(&proportional, &outliers, 10, typical) < 0.1);
    }

    #[test]
    fn the_median_magnitude_is_the_middle_element_in_total_order() {
        let by_sort = |g: &[f32]| {
            let mut m: Vec<f32> = g.iter().map(|v| v.abs()).collect();
            m.sort_by(f32::total_cmp);
            m[m.len() / 2]
        };
        let mut g: Vec<f32> = (0..100_001)
            .map(|i| ((i * 7919) % 1013) as f32 * 1e-3 - 0.5)
            .collect();
        g[5] = f32::NAN;
        g[6] = f32::NEG_INFINITY;
        g[7] = -0.0;
        g[8] = 1e-42;
        for n in [1, 2, 3, 10, 1000, 100_001] {
            let got = median_magnitude(&g[..n]).expect("not empty");
            assert_eq!(got.to_bits(), by_sort(&g[..n]).to_bits(), "{n} elements");
        }
        // Equal high halves: the low half decides.
        let close = [
            1.0f32,
            f32::from_bits(1.0f32.to_bits() + 3),
            f32::from_bits(1.0f32.to_bits() + 1),
        ];
        assert_eq!(median_magnitude(&close), Some(by_sort(&close)));
        assert_eq!(median_magnitude(&[]), None);
    }
}
