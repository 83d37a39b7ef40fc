//! The AVX2 inner loops of compare's numerics, chosen at run time: the error sums
//! ([`crate::kernels`]) and the weight-update fit ([`crate::gradscale::proportion_split`]).
//! The workspace is built for the baseline x86-64 (SSE2), where the compiler cannot be
//! trusted to vectorize four or eight f64 lanes with masks.
//!
//! Each performs exactly the per-lane operations of its portable loop (widened to f64, masked
//! where the portable loop selects, products and sums without fused multiply-add), element
//! `i` into lane `i % lanes`, so the sums are bit-identical to the portable ones.

/// Eight lanes each of Σ d², Σ y², Σ x².
pub type Lanes = [[f64; 8]; 3];

/// Adds every whole chunk of eight elements of `x` (divided by `scale`) and `y` into `acc`
/// when the CPU has AVX2; returns how many elements were added (0 without AVX2: the caller
/// adds them all).
pub fn add_chunks(x: &[f32], y: &[f32], scale: f32, acc: &mut Lanes) -> usize {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512F (checked just above), the only requirement of
        // `add_chunks_avx512`; it reads within the slices by itself.
        return unsafe { add_chunks_avx512(x, y, scale, acc) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above), the only requirement of
        // `add_chunks_avx2`; it reads within the slices by itself.
        return unsafe { add_chunks_avx2(x, y, scale, acc) };
    }
    let _ = (x, y, scale, acc);
    0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_chunks_avx2(x: &[f32], y: &[f32], scale: f32, acc: &mut Lanes) -> usize {
    use std::arch::x86_64::*;
    let n = x.len().min(y.len()) / 8 * 8;
    let divide = scale != 1.0;
    // Dividing by a power of two is multiplying by its inverse, exactly (both round the same
    // real number once): a multiply costs a tenth of a divide.
    let inverse = exact_inverse(scale);
    let sv = _mm256_set1_ps(inverse.unwrap_or(scale));
    let [d, yy, xx] = acc;
    // SAFETY: every pointer below is into `acc`'s arrays of 8 (offsets 0 and 4, 4 lanes
    // each) or into `x`/`y` at `i + 8 <= n <= len`; unaligned loads and stores are used.
    unsafe {
        let (mut d_lo, mut d_hi) = (
            _mm256_loadu_pd(d.as_ptr()),
            _mm256_loadu_pd(d.as_ptr().add(4)),
        );
        let (mut y_lo, mut y_hi) = (
            _mm256_loadu_pd(yy.as_ptr()),
            _mm256_loadu_pd(yy.as_ptr().add(4)),
        );
        let (mut x_lo, mut x_hi) = (
            _mm256_loadu_pd(xx.as_ptr()),
            _mm256_loadu_pd(xx.as_ptr().add(4)),
        );
        let mut i = 0;
        while i < n {
            let mut xv = _mm256_loadu_ps(x.as_ptr().add(i));
            if divide {
                xv = match inverse {
                    Some(_) => _mm256_mul_ps(xv, sv),
                    None => _mm256_div_ps(xv, sv),
                };
            }
            let yv = _mm256_loadu_ps(y.as_ptr().add(i));
            let halves = [
                (_mm256_castps256_ps128(xv), _mm256_castps256_ps128(yv)),
                (
                    _mm256_extractf128_ps::<1>(xv),
                    _mm256_extractf128_ps::<1>(yv),
                ),
            ];
            for (h, (xh, yh)) in halves.into_iter().enumerate() {
                let (a, b) = (_mm256_cvtps_pd(xh), _mm256_cvtps_pd(yh));
                // a − b where a != b (NaN included), 0 where equal (equal infinities).
                let e = _mm256_and_pd(_mm256_sub_pd(a, b), _mm256_cmp_pd::<_CMP_NEQ_UQ>(a, b));
                let (de, bb, aa) = (
                    _mm256_mul_pd(e, e),
                    _mm256_mul_pd(b, b),
                    _mm256_mul_pd(a, a),
                );
                if h == 0 {
                    d_lo = _mm256_add_pd(d_lo, de);
                    y_lo = _mm256_add_pd(y_lo, bb);
                    x_lo = _mm256_add_pd(x_lo, aa);
                } else {
                    d_hi = _mm256_add_pd(d_hi, de);
                    y_hi = _mm256_add_pd(y_hi, bb);
                    x_hi = _mm256_add_pd(x_hi, aa);
                }
            }
            i += 8;
        }
        _mm256_storeu_pd(d.as_mut_ptr(), d_lo);
        _mm256_storeu_pd(d.as_mut_ptr().add(4), d_hi);
        _mm256_storeu_pd(yy.as_mut_ptr(), y_lo);
        _mm256_storeu_pd(yy.as_mut_ptr().add(4), y_hi);
        _mm256_storeu_pd(xx.as_mut_ptr(), x_lo);
        _mm256_storeu_pd(xx.as_mut_ptr().add(4), x_hi);
    }
    n
}

/// [`add_chunks_avx2`] with eight f64 lanes in one register: half the instructions per
/// element (compare's largest single cost on bf16 runs). Element `i` goes into lane `i % 8`
/// as in the portable loop, masked where equal, multiplied and added apart (no fused
/// multiply-add): the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn add_chunks_avx512(x: &[f32], y: &[f32], scale: f32, acc: &mut Lanes) -> usize {
    use std::arch::x86_64::*;
    let n = x.len().min(y.len()) / 8 * 8;
    let divide = scale != 1.0;
    let inverse = exact_inverse(scale);
    // SAFETY: every pointer below is into `acc`'s arrays of 8 or into `x`/`y` at
    // `i + 8 <= n <= len`; unaligned loads and stores are used.
    unsafe {
        let sv = _mm256_set1_ps(inverse.unwrap_or(scale));
        let [d, yy, xx] = acc;
        let mut dv = _mm512_loadu_pd(d.as_ptr());
        let mut yv = _mm512_loadu_pd(yy.as_ptr());
        let mut xv = _mm512_loadu_pd(xx.as_ptr());
        let mut i = 0;
        while i < n {
            let mut xf = _mm256_loadu_ps(x.as_ptr().add(i));
            if divide {
                xf = match inverse {
                    Some(_) => _mm256_mul_ps(xf, sv),
                    None => _mm256_div_ps(xf, sv),
                };
            }
            let (a, b) = (
                _mm512_cvtps_pd(xf),
                _mm512_cvtps_pd(_mm256_loadu_ps(y.as_ptr().add(i))),
            );
            // a − b where a != b (NaN included), 0 where equal (equal infinities).
            let e = _mm512_maskz_sub_pd(_mm512_cmp_pd_mask::<_CMP_NEQ_UQ>(a, b), a, b);
            dv = _mm512_add_pd(dv, _mm512_mul_pd(e, e));
            yv = _mm512_add_pd(yv, _mm512_mul_pd(b, b));
            xv = _mm512_add_pd(xv, _mm512_mul_pd(a, a));
            i += 8;
        }
        _mm512_storeu_pd(d.as_mut_ptr(), dv);
        _mm512_storeu_pd(yy.as_mut_ptr(), yv);
        _mm512_storeu_pd(xx.as_mut_ptr(), xv);
    }
    n
}

/// Widens the little-endian BF16 elements of `bytes` into `out` (as many as both hold): a
/// BF16 is the high half of its f32, a NaN made quiet as `half` does (without a branch, so
/// that the loop vectorizes). Compiled for AVX2 where the CPU has it (twice the elements per
/// instruction of the SSE2 baseline).
pub fn widen_bf16(bytes: &[u8], out: &mut [std::mem::MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above), the only requirement of
        // `widen_bf16_avx2`; it stays within the slices by itself.
        return unsafe { widen_bf16_avx2(bytes, out) };
    }
    widen_bf16_portable(bytes, out)
}

#[inline(always)]
fn widen_bf16_portable(bytes: &[u8], out: &mut [std::mem::MaybeUninit<f32>]) {
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let b = u16::from_le_bytes([c[0], c[1]]);
        let quiet = u16::from(b & 0x7fff > 0x7f80) << 6;
        o.write(f32::from_bits(u32::from(b | quiet) << 16));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn widen_bf16_avx2(bytes: &[u8], out: &mut [std::mem::MaybeUninit<f32>]) {
    widen_bf16_portable(bytes, out)
}

/// `1 / scale` when `scale` is a power of two whose inverse is a normal f32: then `x * (1 /
/// scale)` is `x / scale` to the bit for every `x` (subnormal, infinite and NaN included).
fn exact_inverse(scale: f32) -> Option<f32> {
    let inverse = 1.0 / scale;
    let power_of_two = |v: f32| v.is_normal() && v.to_bits() & 0x007f_ffff == 0;
    (power_of_two(scale) && power_of_two(inverse)).then_some(inverse)
}

/// Four lanes each of the seven sums of [`crate::gradscale::proportion_split`]: Σab, Σbb, Σaa
/// over all elements, Σab and Σbb over those with `|b| >= median`, the same over the others.
pub type SplitLanes = [[f64; 4]; 7];

/// Adds every whole chunk of four elements of `dw` (a) and `g` (b) into `acc` when the CPU
/// has AVX2; returns how many elements were added (0 without AVX2: the caller adds them all).
pub fn add_split_chunks(dw: &[f32], g: &[f32], median: f32, acc: &mut SplitLanes) -> usize {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above), the only requirement of
        // `add_split_chunks_avx2`; it reads within the slices by itself.
        return unsafe { add_split_chunks_avx2(dw, g, median, acc) };
    }
    let _ = (dw, g, median, acc);
    0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_split_chunks_avx2(dw: &[f32], g: &[f32], median: f32, acc: &mut SplitLanes) -> usize {
    use std::arch::x86_64::*;
    let n = dw.len().min(g.len()) / 4 * 4;
    // SAFETY: every pointer below is into one of `acc`'s arrays of 4 or into `dw`/`g` at
    // `i + 4 <= n <= len`; unaligned loads and stores are used.
    unsafe {
        let mut v: [__m256d; 7] = [_mm256_setzero_pd(); 7];
        for (k, lanes) in acc.iter().enumerate() {
            v[k] = _mm256_loadu_pd(lanes.as_ptr());
        }
        let med = _mm_set1_ps(median);
        let sign = _mm_set1_ps(-0.0);
        let mut i = 0;
        while i < n {
            let af = _mm_loadu_ps(dw.as_ptr().add(i));
            let bf = _mm_loadu_ps(g.as_ptr().add(i));
            // |b| >= median, false for NaN (as `>=` says), widened to 64-bit lane masks.
            let large32 = _mm_cmp_ps::<_CMP_GE_OQ>(_mm_andnot_ps(sign, bf), med);
            let large = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm_castps_si128(large32)));
            let (a, b) = (_mm256_cvtps_pd(af), _mm256_cvtps_pd(bf));
            let (ab, bb) = (_mm256_mul_pd(a, b), _mm256_mul_pd(b, b));
            v[0] = _mm256_add_pd(v[0], ab);
            v[1] = _mm256_add_pd(v[1], bb);
            v[2] = _mm256_add_pd(v[2], _mm256_mul_pd(a, a));
            v[3] = _mm256_add_pd(v[3], _mm256_and_pd(ab, large));
            v[4] = _mm256_add_pd(v[4], _mm256_and_pd(bb, large));
            v[5] = _mm256_add_pd(v[5], _mm256_andnot_pd(large, ab));
            v[6] = _mm256_add_pd(v[6], _mm256_andnot_pd(large, bb));
            i += 4;
        }
        for (k, lanes) in acc.iter_mut().enumerate() {
            _mm256_storeu_pd(lanes.as_mut_ptr(), v[k]);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dividing_by_a_power_of_two_is_multiplying_by_its_inverse_to_the_bit() {
        assert_eq!(exact_inverse(2.0), Some(0.5));
        assert_eq!(exact_inverse(0.25), Some(4.0));
        assert_eq!(exact_inverse(3.0), None);
        assert_eq!(exact_inverse(0.0), None);
        assert_eq!(exact_inverse(-8.0), Some(-0.125));
        let values = [
            1.0f32,
            -3.7,
            f32::MIN_POSITIVE,
            1e-45,
            3e-39,
            f32::MAX,
            f32::INFINITY,
            -0.0,
            f32::NAN,
            1.234_567_9e-38,
        ];
        for scale in [2.0f32, 4.0, 8.0, 1024.0, 0.5, -2.0] {
            let inverse = exact_inverse(scale).expect("a power of two");
            for x in values
                .into_iter()
                .chain((0..10_000).map(|i| f32::from_bits(i * 429_497)))
            {
                let (d, m) = (x / scale, x * inverse);
                assert!(
                    d.to_bits() == m.to_bits() || (d.is_nan() && m.is_nan()),
                    "{x:e} / {scale}: {d:e} against {m:e}"
                );
            }
        }
    }

    /// Both vector loops, wherever the CPU has them, give the portable loop's bits: element
    /// `i` into lane `i % 8`, equal values (infinities too) no error, a NaN an error.
    #[test]
    fn the_avx2_and_avx512_sums_are_the_portable_sums_to_the_bit() {
        let mut y: Vec<f32> = (0..1021).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
        let mut x: Vec<f32> = y.iter().map(|v| v * 1.001 + 1e-3).collect();
        (x[5], y[5]) = (f32::INFINITY, f32::INFINITY);
        (x[17], y[17]) = (f32::NAN, 1.0);
        (x[30], y[30]) = (2.5, 2.5);
        (x[44], y[44]) = (1e-40, -3e-39);
        for scale in [1.0f32, 2.0, 3.0] {
            let mut want: Lanes = [[0.0; 8]; 3];
            let whole = x.len() / 8 * 8;
            for (i, (&a, &b)) in x[..whole].iter().zip(&y[..whole]).enumerate() {
                let (a, b) = ((a / scale) as f64, b as f64);
                let e = if a == b { 0.0 } else { a - b };
                want[0][i % 8] += e * e;
                want[1][i % 8] += b * b;
                want[2][i % 8] += a * a;
            }
            let bits = |l: &Lanes| l.map(|r| r.map(f64::to_bits));
            #[cfg(target_arch = "x86_64")]
            {
                let paths: [(&str, bool, AddChunks); 2] = [
                    (
                        "avx2",
                        std::arch::is_x86_feature_detected!("avx2"),
                        add_chunks_avx2,
                    ),
                    (
                        "avx512",
                        std::arch::is_x86_feature_detected!("avx512f"),
                        add_chunks_avx512,
                    ),
                ];
                for (name, _, f) in paths.into_iter().filter(|p| p.1) {
                    let mut acc: Lanes = [[0.0; 8]; 3];
                    // SAFETY: the CPU has the loop's instruction set (filtered just above).
                    let done = unsafe { f(&x, &y, scale, &mut acc) };
                    assert_eq!(done, whole, "{name}");
                    assert_eq!(bits(&acc), bits(&want), "{name}, scale {scale}");
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    type AddChunks = unsafe fn(&[f32], &[f32], f32, &mut Lanes) -> usize;

    #[test]
    fn the_avx2_sums_divide_exactly_as_the_portable_ones() {
        let y: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.37).sin()).collect();
        let x: Vec<f32> = y.iter().map(|v| v * 2.0 + 1e-3).collect();
        for scale in [2.0f32, 3.0] {
            let mut acc: Lanes = [[0.0; 8]; 3];
            let done = add_chunks(&x, &y, scale, &mut acc);
            let mut want: Lanes = [[0.0; 8]; 3];
            for (i, (&a, &b)) in x[..done].iter().zip(&y[..done]).enumerate() {
                let (a, b) = ((a / scale) as f64, b as f64);
                let e = if a == b { 0.0 } else { a - b };
                want[0][i % 8] += e * e;
                want[1][i % 8] += b * b;
                want[2][i % 8] += a * a;
            }
            assert_eq!(acc, want, "scale {scale}");
        }
    }
}
