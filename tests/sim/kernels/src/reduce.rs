//! Reductions of the simulated NCCL, in the buffer's dtype and in ring order.
//!
//! Real NCCL reduces in the element type of the buffer: every hop of a ring adds the incoming
//! partial result to the local input and rounds the sum to the dtype before forwarding it, so a
//! BF16 all-reduce over n ranks rounds to BF16 n-1 times. The order is fixed by the ring: in a
//! ring all-reduce the data is cut into n chunks and chunk `j` starts at rank `(j+1) % n` and
//! travels `j+1, j+2, ..., j` (NCCL's `runRing` in `src/device/all_reduce.h`: rank r first sends
//! chunk r-1 and finishes chunk r). Reduce-scatter block `b` follows the same path as chunk `b`;
//! a rooted reduce starts at `root+1` and ends at the root. All ranks receive the result the last
//! rank of the chain computed, so they agree bitwise.
//!
//! This module holds the pure routines, on byte slices through [`DType::load`]/[`DType::store`]:
//! [`reduce_chain`] folds the inputs of all ranks in chain order, and the `*_first_rank` helpers
//! say where a chain starts. The simulated NCCL only moves bytes and calls these.
//!
//! Operators ([`ReduceOp`]) follow NCCL's `hostToDevRedOp` (`src/enqueue.cc`): `ncclAvg` is not a
//! division of the sum for floating types but a *pre-multiplied sum* by `1/n` rounded to the
//! dtype (through `float`), and a sum followed by a truncating division for integer types; see
//! [`ReduceOp::avg`]. Integer sums and products wrap, as two's complement device code does.

use crate::dtype::DType;

/// A reduction operator as the device code applies it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReduceOp {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMax`.
    Max,
    /// `ncclMin`.
    Min,
    /// Multiply every input by a scalar, then sum (`ncclRedOpCreatePreMulSum`, and `ncclAvg` of
    /// floating types). The scalar is element 0 of these bytes, in the buffer's dtype.
    PreMulSum([u8; 8]),
    /// Sum, then divide by this number rounding toward zero (`ncclAvg` of integer types).
    SumPostDiv(u64),
}

impl ReduceOp {
    /// The operator NCCL uses for `ncclAvg` on `nranks` ranks: for floating types a
    /// pre-multiplied sum by `1/nranks` computed in double, rounded to `float` and then to the
    /// dtype (so FP8 E4M3 over 3 ranks scales by 0.34375); for integers a sum divided by
    /// `nranks`.
    pub fn avg(dtype: DType, nranks: usize) -> ReduceOp {
        if dtype.is_float() {
            let recip = 1.0 / nranks as f64;
            // NCCL computes float(1.0/n) for every type but double, then converts.
            let v = if dtype == DType::F64 {
                recip
            } else {
                recip as f32 as f64
            };
            ReduceOp::PreMulSum(scalar_bytes(dtype, v))
        } else {
            ReduceOp::SumPostDiv(nranks as u64)
        }
    }
}

/// `v` rounded to `dtype`, as the 8-byte scalar of [`ReduceOp::PreMulSum`].
pub fn scalar_bytes(dtype: DType, v: f64) -> [u8; 8] {
    let mut b = [0u8; 8];
    dtype.store(&mut b, 0, v);
    b
}

/// Elements per ring chunk of an all-reduce of `count` elements over `nranks` ranks: the data
/// is cut into `nranks` contiguous chunks of this many elements (the last may be shorter or
/// empty).
pub fn ring_chunk_len(count: usize, nranks: usize) -> usize {
    count.div_ceil(nranks.max(1)).max(1)
}

/// The rank where the reduction of element `elem` of an all-reduce of `count` elements starts:
/// `(chunk + 1) % nranks`, with `chunk` the element's ring chunk.
pub fn allreduce_first_rank(elem: usize, count: usize, nranks: usize) -> usize {
    (elem / ring_chunk_len(count, nranks) + 1) % nranks
}

/// The rank where the reduction of reduce-scatter block `block` (the block rank `block`
/// receives) starts.
pub fn reduce_scatter_first_rank(block: usize, nranks: usize) -> usize {
    (block + 1) % nranks
}

/// The rank where every element of a rooted reduce starts: the root's successor.
pub fn reduce_first_rank(root: usize, nranks: usize) -> usize {
    (root + 1) % nranks
}

/// Folds `inputs` (one slice per rank, all of `out.len()` bytes) element-wise into `out` in
/// chain order `first, first+1, ..., first-1` (modulo the number of inputs), rounding to
/// `dtype` after every step like a ring of devices does.
///
/// # Panics
/// If `inputs` is empty, `first` is out of range or a slice length differs from `out.len()`
/// or is not a multiple of the element size.
pub fn reduce_chain(dtype: DType, op: ReduceOp, inputs: &[&[u8]], first: usize, out: &mut [u8]) {
    let n = inputs.len();
    assert!(
        n > 0 && first < n,
        "reduce_chain: {n} inputs, first {first}"
    );
    let size = dtype.size();
    assert!(
        out.len().is_multiple_of(size),
        "reduce_chain: partial element"
    );
    for inp in inputs {
        assert_eq!(inp.len(), out.len(), "reduce_chain: input length");
    }
    let elems = out.len() / size;
    if dtype.is_float() {
        float_chain(dtype, op, inputs, first, out, elems);
    } else {
        int_chain(dtype, op, inputs, first, out, elems);
    }
}

fn float_chain(
    dtype: DType,
    op: ReduceOp,
    inputs: &[&[u8]],
    first: usize,
    out: &mut [u8],
    elems: usize,
) {
    let n = inputs.len();
    let scalar = match op {
        ReduceOp::PreMulSum(b) => Some(dtype.load(&b, 0)),
        _ => None,
    };
    // The pre-operation of PreMulSum rounds the product to the dtype before it is summed.
    let pre = |v: f64| match scalar {
        Some(s) => dtype.round(v * s),
        None => v,
    };
    for i in 0..elems {
        let mut acc = pre(dtype.load(inputs[first], i));
        for k in 1..n {
            let x = pre(dtype.load(inputs[(first + k) % n], i));
            let v = match op {
                ReduceOp::Sum | ReduceOp::PreMulSum(_) | ReduceOp::SumPostDiv(_) => acc + x,
                ReduceOp::Prod => acc * x,
                ReduceOp::Max => acc.max(x),
                ReduceOp::Min => acc.min(x),
            };
            // Every hop stores its partial result in the dtype.
            acc = dtype.round(v);
        }
        if let ReduceOp::SumPostDiv(d) = op {
            acc = dtype.round(acc / d as f64);
        }
        dtype.store(out, i, acc);
    }
}

/// Bits of an integer dtype.
fn int_bits(dtype: DType) -> u32 {
    dtype.size() as u32 * 8
}

fn is_signed(dtype: DType) -> bool {
    matches!(dtype, DType::I8 | DType::I32 | DType::I64)
}

/// Element `i` as a 64-bit pattern, sign-extended for signed types, zero-extended otherwise.
fn load_int(dtype: DType, bytes: &[u8], i: usize) -> u64 {
    let s = dtype.size();
    let mut buf = [0u8; 8];
    buf[..s].copy_from_slice(&bytes[i * s..(i + 1) * s]);
    normalize(dtype, u64::from_le_bytes(buf))
}

/// Wraps a 64-bit result to the dtype's width (two's complement), extended back to 64 bits.
fn normalize(dtype: DType, v: u64) -> u64 {
    let bits = int_bits(dtype);
    if bits == 64 {
        return v;
    }
    let shift = 64 - bits;
    if is_signed(dtype) {
        (((v << shift) as i64) >> shift) as u64
    } else {
        (v << shift) >> shift
    }
}

fn store_int(dtype: DType, bytes: &mut [u8], i: usize, v: u64) {
    let s = dtype.size();
    bytes[i * s..(i + 1) * s].copy_from_slice(&v.to_le_bytes()[..s]);
}

fn int_chain(
    dtype: DType,
    op: ReduceOp,
    inputs: &[&[u8]],
    first: usize,
    out: &mut [u8],
    elems: usize,
) {
    let n = inputs.len();
    let signed = is_signed(dtype);
    let less = |a: u64, b: u64| {
        if signed {
            (a as i64) < (b as i64)
        } else {
            a < b
        }
    };
    let scalar = match op {
        ReduceOp::PreMulSum(b) => Some(load_int(dtype, &b, 0)),
        _ => None,
    };
    let pre = |v: u64| match scalar {
        Some(s) => normalize(dtype, v.wrapping_mul(s)),
        None => v,
    };
    for i in 0..elems {
        let mut acc = pre(load_int(dtype, inputs[first], i));
        for k in 1..n {
            let x = pre(load_int(dtype, inputs[(first + k) % n], i));
            let v = match op {
                ReduceOp::Sum | ReduceOp::PreMulSum(_) | ReduceOp::SumPostDiv(_) => {
                    acc.wrapping_add(x)
                }
                ReduceOp::Prod => acc.wrapping_mul(x),
                ReduceOp::Max => {
                    if less(acc, x) {
                        x
                    } else {
                        acc
                    }
                }
                ReduceOp::Min => {
                    if less(x, acc) {
                        x
                    } else {
                        acc
                    }
                }
            };
            acc = normalize(dtype, v);
        }
        if let ReduceOp::SumPostDiv(d) = op {
            let d = d.max(1);
            // Truncation toward zero, like NCCL's FuncSumPostDiv (divides |x| and restores the sign).
            acc = if signed {
                ((acc as i64) / d as i64) as u64
            } else {
                acc / d
            };
        }
        store_int(dtype, out, i, acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift), so that tests need no dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// Uniform in [-1, 1).
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        }
    }

    fn buf(dtype: DType, vals: &[f64]) -> Vec<u8> {
        let mut b = vec![0u8; vals.len() * dtype.size()];
        for (i, v) in vals.iter().enumerate() {
            dtype.store(&mut b, i, *v);
        }
        b
    }

    fn run(dtype: DType, op: ReduceOp, ranks: &[Vec<u8>], first: usize) -> Vec<f64> {
        let inputs: Vec<&[u8]> = ranks.iter().map(|v| v.as_slice()).collect();
        let mut out = vec![0u8; ranks[0].len()];
        reduce_chain(dtype, op, &inputs, first, &mut out);
        (0..out.len() / dtype.size())
            .map(|i| dtype.load(&out, i))
            .collect()
    }

    #[test]
    fn ring_chunks_start_after_their_owner() {
        // 10 elements over 4 ranks: chunks of 3 (the last has 1).
        assert_eq!(ring_chunk_len(10, 4), 3);
        let starts: Vec<usize> = (0..10).map(|e| allreduce_first_rank(e, 10, 4)).collect();
        assert_eq!(starts, [1, 1, 1, 2, 2, 2, 3, 3, 3, 0]);
        assert_eq!(reduce_scatter_first_rank(3, 4), 0);
        assert_eq!(reduce_first_rank(1, 4), 2);
        // Fewer elements than ranks: one element per chunk.
        assert_eq!(allreduce_first_rank(1, 2, 8), 2);
    }

    #[test]
    fn bf16_sum_rounds_after_every_hop_in_chain_order() {
        let t = DType::BF16;
        let tiny = 2f64.powi(-8);
        let ranks = [buf(t, &[1.0]), buf(t, &[tiny]), buf(t, &[tiny])];
        // From rank 0: (1 + 2^-8) ties to 1, then again: 1.
        assert_eq!(run(t, ReduceOp::Sum, &ranks, 0), [1.0]);
        // From rank 1: 2^-8 + 2^-8 = 2^-7 exactly, + 1 = 1 + 2^-7 (representable).
        assert_eq!(run(t, ReduceOp::Sum, &ranks, 1), [1.0 + 2f64.powi(-7)]);
        // The exact sum is 1 + 2^-7: a single rounding at the end would not show the order.
    }

    #[test]
    fn f32_sum_equals_sequential_f32_additions() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let n = 5;
        let elems = 64;
        let t = DType::F32;
        let vals: Vec<Vec<f32>> = (0..n)
            .map(|_| (0..elems).map(|_| rng.unit() as f32 * 1e3).collect())
            .collect();
        let ranks: Vec<Vec<u8>> = vals
            .iter()
            .map(|v| buf(t, &v.iter().map(|x| *x as f64).collect::<Vec<_>>()))
            .collect();
        for first in 0..n {
            let got = run(t, ReduceOp::Sum, &ranks, first);
            for (i, g) in got.iter().enumerate() {
                let mut acc = vals[first][i];
                for k in 1..n {
                    acc += vals[(first + k) % n][i];
                }
                assert_eq!(*g, acc as f64, "element {i}, first {first}");
            }
        }
    }

    /// Sum of |x| over ranks, for element `i`.
    fn abs_sum(t: DType, ranks: &[Vec<u8>], i: usize) -> f64 {
        ranks.iter().map(|r| t.load(r, i).abs()).sum()
    }

    /// Half the smallest subnormal: the absolute round-off of a result near zero.
    fn half_subnormal(t: DType) -> f64 {
        match t {
            DType::E4M3 => 2f64.powi(-10),
            DType::E5M2 => 2f64.powi(-17),
            DType::F16 => 2f64.powi(-25),
            _ => 2f64.powi(-134),
        }
    }

    #[test]
    fn narrow_sums_stay_within_the_ring_round_off_bound() {
        for (t, n) in [
            (DType::BF16, 8),
            (DType::F16, 8),
            (DType::E4M3, 4),
            (DType::E5M2, 4),
        ] {
            let mut rng = Rng(42 + n as u64);
            let elems = 256;
            let ranks: Vec<Vec<u8>> = (0..n)
                .map(|_| {
                    let v: Vec<f64> = (0..elems).map(|_| rng.unit() * 8.0).collect();
                    buf(t, &v)
                })
                .collect();
            let u = t.epsilon() / 2.0;
            let got = run(t, ReduceOp::Sum, &ranks, 3 % n);
            let mut worst: f64 = 0.0;
            for (i, g) in got.iter().enumerate() {
                let exact: f64 = ranks.iter().map(|r| t.load(r, i)).sum();
                // n-1 roundings, each at most u times a partial sum bounded by sum|x|, plus
                // half a subnormal step per rounding near zero.
                let bound = (n - 1) as f64 * (u * abs_sum(t, &ranks, i) * (1.0 + n as f64 * u))
                    + (n - 1) as f64 * half_subnormal(t);
                assert!(
                    (g - exact).abs() <= bound,
                    "{t:?} element {i}: {g} vs {exact}"
                );
                worst = worst.max((g - exact).abs() / bound.max(f64::MIN_POSITIVE));
            }
            // The bound is not vacuous: the narrow types do lose precision.
            assert!(worst > 0.0, "{t:?}: no rounding at all");
        }
    }

    #[test]
    fn max_min_are_exact_and_prod_is_bounded() {
        let mut rng = Rng(7);
        let t = DType::BF16;
        let n = 4;
        let ranks: Vec<Vec<u8>> = (0..n)
            .map(|_| buf(t, &(0..32).map(|_| rng.unit() * 4.0).collect::<Vec<_>>()))
            .collect();
        let max = run(t, ReduceOp::Max, &ranks, 2);
        let min = run(t, ReduceOp::Min, &ranks, 2);
        let prod = run(t, ReduceOp::Prod, &ranks, 2);
        for i in 0..32 {
            let xs: Vec<f64> = ranks.iter().map(|r| t.load(r, i)).collect();
            assert_eq!(max[i], xs.iter().cloned().fold(f64::MIN, f64::max));
            assert_eq!(min[i], xs.iter().cloned().fold(f64::MAX, f64::min));
            let exact: f64 = xs.iter().product();
            let u = t.epsilon() / 2.0;
            assert!(
                (prod[i] - exact).abs() <= 3.0 * u * 1.1 * exact.abs() + 1e-30,
                "prod {i}"
            );
        }
    }

    #[test]
    fn avg_is_a_premultiplied_sum_like_nccl() {
        // The scalar is float(1/n) rounded to the dtype.
        assert_eq!(
            ReduceOp::avg(DType::E4M3, 3),
            ReduceOp::PreMulSum(scalar_bytes(DType::E4M3, 0.34375))
        );
        assert_eq!(
            ReduceOp::avg(DType::F32, 3),
            ReduceOp::PreMulSum(scalar_bytes(DType::F32, (1.0f64 / 3.0) as f32 as f64))
        );
        assert_eq!(ReduceOp::avg(DType::I32, 3), ReduceOp::SumPostDiv(3));
        // bf16 over 3 ranks: each input is multiplied by bf16(1/3) and rounded first.
        let t = DType::BF16;
        let ranks = [buf(t, &[3.0]), buf(t, &[3.0]), buf(t, &[3.0])];
        let s = t.round((1.0f64 / 3.0) as f32 as f64);
        let term = t.round(3.0 * s);
        let expect = t.round(t.round(term + term) + term);
        assert_eq!(run(t, ReduceOp::avg(t, 3), &ranks, 1), [expect]);
        assert!((expect - 3.0).abs() < 0.05);
    }

    #[test]
    fn integer_reductions_wrap_and_divide_toward_zero() {
        let t = DType::I32;
        let ranks = [buf(t, &[i32::MAX as f64, -7.0]), buf(t, &[1.0, 0.0])];
        let out = run(t, ReduceOp::Sum, &ranks, 0);
        assert_eq!(out, [i32::MIN as f64, -7.0]);
        let avg = run(t, ReduceOp::avg(t, 2), &ranks, 0);
        // (MAX + 1) wraps to MIN, MIN / 2; -7 / 2 truncates to -3.
        assert_eq!(avg, [(i32::MIN / 2) as f64, -3.0]);

        let u8t = DType::U8;
        let ranks = [buf(u8t, &[200.0, 3.0]), buf(u8t, &[100.0, 100.0])];
        assert_eq!(run(u8t, ReduceOp::Sum, &ranks, 1), [44.0, 103.0]);
        assert_eq!(run(u8t, ReduceOp::Max, &ranks, 1), [200.0, 100.0]);
        let i8t = DType::I8;
        let ranks = [buf(i8t, &[-56.0]), buf(i8t, &[100.0])];
        assert_eq!(run(i8t, ReduceOp::Max, &ranks, 0), [100.0]);
        assert_eq!(run(i8t, ReduceOp::Min, &ranks, 0), [-56.0]);

        // 64-bit integers are exact beyond 2^53 (no detour through f64).
        let big = (1u64 << 60) + 1;
        let mut a = vec![0u8; 8];
        let mut b = vec![0u8; 8];
        a.copy_from_slice(&big.to_ne_bytes());
        b.copy_from_slice(&2u64.to_ne_bytes());
        let mut out = vec![0u8; 8];
        reduce_chain(DType::U64, ReduceOp::Sum, &[&a, &b], 0, &mut out);
        assert_eq!(u64::from_ne_bytes(out.clone().try_into().unwrap()), big + 2);
        reduce_chain(DType::U64, ReduceOp::Prod, &[&a, &b], 0, &mut out);
        assert_eq!(
            u64::from_ne_bytes(out.try_into().unwrap()),
            big.wrapping_mul(2)
        );
    }

    #[test]
    fn premulsum_scales_every_input() {
        let t = DType::F32;
        let s = scalar_bytes(t, 0.5);
        let ranks = [buf(t, &[2.0, 1.0]), buf(t, &[4.0, 3.0])];
        assert_eq!(run(t, ReduceOp::PreMulSum(s), &ranks, 0), [3.0, 2.0]);
        let ti = DType::I64;
        let si = {
            let mut b = [0u8; 8];
            b.copy_from_slice(&(-3i64).to_le_bytes());
            b
        };
        let ranks = [buf(ti, &[2.0]), buf(ti, &[5.0])];
        assert_eq!(run(ti, ReduceOp::PreMulSum(si), &ranks, 1), [-21.0]);
    }
}
