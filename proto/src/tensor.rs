//! Captured tensor bytes as typed values: exact decoding of every stored dtype (half, bfloat16
//! and both FP8 formats through the `half` and `float8` crates), summary statistics, and
//! widening to `f32` for consumers that cannot hold the narrow float types.
//!
//! Stored bytes are little-endian and packed row-major as the record's shape says (see
//! docs/format.md); nothing here reorders them.

use std::sync::OnceLock;

use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};
use serde::Serialize;

use crate::dtype::DType;
use crate::FormatError;

/// A tensor's elements, typed.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    F64(Vec<f64>),
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F8E4M3(Vec<F8E4M3>),
    F8E5M2(Vec<F8E5M2>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    I16(Vec<i16>),
    I8(Vec<i8>),
    U64(Vec<u64>),
    U32(Vec<u32>),
    U16(Vec<u16>),
    U8(Vec<u8>),
    Bool(Vec<bool>),
    /// E8M0 scale bytes.
    F8E8M0(Vec<u8>),
    /// Packed FP4 E2M1 pairs (one byte each; see [`DType::F4_E2M1X2`]).
    F4E2M1X2(Vec<u8>),
}

/// Splits `bytes` into `N`-byte little-endian elements and maps each.
fn chunks<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            f(a)
        })
        .collect()
}

/// Checks that `bytes` holds whole elements of `dtype`.
fn check_len(dtype: DType, bytes: &[u8]) -> Result<(), FormatError> {
    if !bytes.len().is_multiple_of(dtype.size()) {
        return Err(FormatError::Invalid(format!(
            "{} bytes are not a whole number of {} elements ({} bytes each)",
            bytes.len(),
            dtype.name(),
            dtype.size()
        )));
    }
    Ok(())
}

impl TensorData {
    /// Decodes packed little-endian `bytes` of `dtype`.
    pub fn from_le_bytes(dtype: DType, bytes: &[u8]) -> Result<TensorData, FormatError> {
        check_len(dtype, bytes)?;
        Ok(match dtype {
            DType::F64 => TensorData::F64(chunks(bytes, f64::from_le_bytes)),
            DType::F32 => TensorData::F32(chunks(bytes, f32::from_le_bytes)),
            DType::F16 => TensorData::F16(chunks(bytes, f16::from_le_bytes)),
            DType::BF16 => TensorData::BF16(chunks(bytes, bf16::from_le_bytes)),
            DType::F8_E4M3 => {
                TensorData::F8E4M3(bytes.iter().map(|&b| F8E4M3::from_bits(b)).collect())
            }
            DType::F8_E5M2 => {
                TensorData::F8E5M2(bytes.iter().map(|&b| F8E5M2::from_bits(b)).collect())
            }
            DType::I64 => TensorData::I64(chunks(bytes, i64::from_le_bytes)),
            DType::I32 => TensorData::I32(chunks(bytes, i32::from_le_bytes)),
            DType::I16 => TensorData::I16(chunks(bytes, i16::from_le_bytes)),
            DType::I8 => TensorData::I8(bytes.iter().map(|&b| b as i8).collect()),
            DType::U64 => TensorData::U64(chunks(bytes, u64::from_le_bytes)),
            DType::U32 => TensorData::U32(chunks(bytes, u32::from_le_bytes)),
            DType::U16 => TensorData::U16(chunks(bytes, u16::from_le_bytes)),
            DType::U8 => TensorData::U8(bytes.to_vec()),
            DType::BOOL => TensorData::Bool(bytes.iter().map(|&b| b != 0).collect()),
            DType::F8_E8M0 => TensorData::F8E8M0(bytes.to_vec()),
            DType::F4_E2M1X2 => TensorData::F4E2M1X2(bytes.to_vec()),
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F64(_) => DType::F64,
            TensorData::F32(_) => DType::F32,
            TensorData::F16(_) => DType::F16,
            TensorData::BF16(_) => DType::BF16,
            TensorData::F8E4M3(_) => DType::F8_E4M3,
            TensorData::F8E5M2(_) => DType::F8_E5M2,
            TensorData::I64(_) => DType::I64,
            TensorData::I32(_) => DType::I32,
            TensorData::I16(_) => DType::I16,
            TensorData::I8(_) => DType::I8,
            TensorData::U64(_) => DType::U64,
            TensorData::U32(_) => DType::U32,
            TensorData::U16(_) => DType::U16,
            TensorData::U8(_) => DType::U8,
            TensorData::Bool(_) => DType::BOOL,
            TensorData::F8E8M0(_) => DType::F8_E8M0,
            TensorData::F4E2M1X2(_) => DType::F4_E2M1X2,
        }
    }

    /// Number of values (elements; two per byte of packed FP4).
    pub fn len(&self) -> usize {
        match self {
            TensorData::F8E8M0(v) => v.len(),
            TensorData::F4E2M1X2(v) => 2 * v.len(),
            TensorData::F64(v) => v.len(),
            TensorData::F32(v) => v.len(),
            TensorData::F16(v) => v.len(),
            TensorData::BF16(v) => v.len(),
            TensorData::F8E4M3(v) => v.len(),
            TensorData::F8E5M2(v) => v.len(),
            TensorData::I64(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::I16(v) => v.len(),
            TensorData::I8(v) => v.len(),
            TensorData::U64(v) => v.len(),
            TensorData::U32(v) => v.len(),
            TensorData::U16(v) => v.len(),
            TensorData::U8(v) => v.len(),
            TensorData::Bool(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as `f64` (exact for every type but 64-bit integers beyond 2^53), `None`
    /// past the end.
    pub fn get_f64(&self, i: usize) -> Option<f64> {
        Some(match self {
            TensorData::F64(v) => *v.get(i)?,
            TensorData::F32(v) => *v.get(i)? as f64,
            TensorData::F16(v) => v.get(i)?.to_f64(),
            TensorData::BF16(v) => v.get(i)?.to_f64(),
            TensorData::F8E4M3(v) => e4m3_f32(v.get(i)?.to_bits()) as f64,
            TensorData::F8E5M2(v) => e5m2_f32(v.get(i)?.to_bits()) as f64,
            TensorData::I64(v) => *v.get(i)? as f64,
            TensorData::I32(v) => *v.get(i)? as f64,
            TensorData::I16(v) => *v.get(i)? as f64,
            TensorData::I8(v) => *v.get(i)? as f64,
            TensorData::U64(v) => *v.get(i)? as f64,
            TensorData::U32(v) => *v.get(i)? as f64,
            TensorData::U16(v) => *v.get(i)? as f64,
            TensorData::U8(v) => *v.get(i)? as f64,
            TensorData::Bool(v) => u8::from(*v.get(i)?) as f64,
            TensorData::F8E8M0(v) => e8m0_f64(*v.get(i)?),
            TensorData::F4E2M1X2(v) => e2m1_pair_f64(*v.get(i / 2)?, i % 2),
        })
    }
}

/// Decoding tables for the two FP8 formats (256 entries each), built from the `float8` crate.
fn fp8_tables() -> &'static ([f32; 256], [f32; 256]) {
    static T: OnceLock<([f32; 256], [f32; 256])> = OnceLock::new();
    T.get_or_init(|| {
        let mut e4 = [0f32; 256];
        let mut e5 = [0f32; 256];
        for b in 0..=255u8 {
            e4[b as usize] = F8E4M3::from_bits(b).to_f32();
            e5[b as usize] = F8E5M2::from_bits(b).to_f32();
        }
        (e4, e5)
    })
}

/// An FP8 E4M3 (`e4m3fn`) byte as `f32`, exactly.
pub fn e4m3_f32(b: u8) -> f32 {
    fp8_tables().0[b as usize]
}

/// An unsigned E8M0 byte (OCP MX scale) as `f64`: `2^(b - 127)`, `0xFF` NaN.
pub fn e8m0_f64(b: u8) -> f64 {
    if b == 0xff {
        f64::NAN
    } else {
        2f64.powi(b as i32 - 127)
    }
}

/// An FP4 E2M1 nibble (the low 4 bits of `n`) as `f64`: sign, 2 exponent bits (bias 1), 1
/// mantissa bit; no infinities or NaN (magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6).
pub fn e2m1_f64(n: u8) -> f64 {
    const MAGNITUDE: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let v = MAGNITUDE[(n & 7) as usize];
    if n & 8 != 0 {
        -v
    } else {
        v
    }
}

/// Value `half` (0: low nibble, 1: high) of a packed FP4 E2M1 byte.
pub fn e2m1_pair_f64(b: u8, half: usize) -> f64 {
    e2m1_f64(if half == 0 { b & 0xf } else { b >> 4 })
}

/// An FP8 E5M2 byte as `f32`, exactly.
pub fn e5m2_f32(b: u8) -> f32 {
    fp8_tables().1[b as usize]
}

/// Whether `dtype` converts to `f32` without changing any value (every value of the type is
/// an `f32`): the 16- and 8-bit floats and the small integers.
pub fn widens_to_f32_exactly(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F32
            | DType::F16
            | DType::BF16
            | DType::F8_E4M3
            | DType::F8_E5M2
            | DType::I16
            | DType::I8
            | DType::U16
            | DType::U8
            | DType::BOOL
            | DType::F8_E8M0
            | DType::F4_E2M1X2
    )
}

/// Converts packed `bytes` of `dtype` to little-endian `f32` bytes, appended to `out`. Only for
/// types that [`widens_to_f32_exactly`]; NaN stays NaN (its payload is not kept). Packed FP4
/// gives two values per byte, low nibble first.
pub fn widen_f32_into(dtype: DType, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), FormatError> {
    check_len(dtype, bytes)?;
    if !widens_to_f32_exactly(dtype) {
        return Err(FormatError::Invalid(format!(
            "{} does not widen to F32 exactly",
            dtype.name()
        )));
    }
    out.reserve(bytes.len() / dtype.size() * dtype.values_per_element() * 4);
    let mut push = |v: f32| out.extend_from_slice(&v.to_le_bytes());
    match dtype {
        DType::F32 => for_each::<4>(bytes, |a| push(f32::from_le_bytes(a))),
        DType::F16 => for_each::<2>(bytes, |a| push(f16::from_le_bytes(a).to_f32())),
        DType::BF16 => for_each::<2>(bytes, |a| push(bf16::from_le_bytes(a).to_f32())),
        DType::F8_E4M3 => bytes.iter().for_each(|&b| push(e4m3_f32(b))),
        DType::F8_E5M2 => bytes.iter().for_each(|&b| push(e5m2_f32(b))),
        DType::I16 => for_each::<2>(bytes, |a| push(i16::from_le_bytes(a) as f32)),
        DType::U16 => for_each::<2>(bytes, |a| push(u16::from_le_bytes(a) as f32)),
        DType::I8 => bytes.iter().for_each(|&b| push(b as i8 as f32)),
        DType::U8 => bytes.iter().for_each(|&b| push(b as f32)),
        DType::BOOL => bytes.iter().for_each(|&b| push(u8::from(b != 0) as f32)),
        // Powers of two from 2^-127 (an f32 subnormal) to 2^127: exact.
        DType::F8_E8M0 => bytes.iter().for_each(|&b| push(e8m0_f64(b) as f32)),
        DType::F4_E2M1X2 => bytes.iter().for_each(|&b| {
            push(e2m1_pair_f64(b, 0) as f32);
            push(e2m1_pair_f64(b, 1) as f32);
        }),
        _ => unreachable!("checked by widens_to_f32_exactly"),
    }
    Ok(())
}

/// Element `i` of packed little-endian `bytes` of `dtype` as `f64`; `None` past the end.
/// For reading a few elements without decoding a whole tensor. Packed FP4 counts values (two
/// per byte, low nibble first).
pub fn element_f64(dtype: DType, bytes: &[u8], i: usize) -> Option<f64> {
    if dtype == DType::F4_E2M1X2 {
        return Some(e2m1_pair_f64(*bytes.get(i / 2)?, i % 2));
    }
    let size = dtype.size();
    let b = bytes.get(i * size..(i + 1) * size)?;
    let mut a = [0u8; 8];
    a[..size].copy_from_slice(b);
    let [b0, b1, b2, b3, ..] = a;
    Some(match dtype {
        DType::F64 => f64::from_le_bytes(a),
        DType::F32 => f32::from_le_bytes([b0, b1, b2, b3]) as f64,
        DType::F16 => f16::from_le_bytes([b0, b1]).to_f64(),
        DType::BF16 => bf16::from_le_bytes([b0, b1]).to_f64(),
        DType::F8_E4M3 => e4m3_f32(b0) as f64,
        DType::F8_E5M2 => e5m2_f32(b0) as f64,
        DType::I64 => i64::from_le_bytes(a) as f64,
        DType::U64 => u64::from_le_bytes(a) as f64,
        DType::I32 => i32::from_le_bytes([b0, b1, b2, b3]) as f64,
        DType::U32 => u32::from_le_bytes([b0, b1, b2, b3]) as f64,
        DType::I16 => i16::from_le_bytes([b0, b1]) as f64,
        DType::U16 => u16::from_le_bytes([b0, b1]) as f64,
        DType::I8 => b0 as i8 as f64,
        DType::U8 => b0 as f64,
        DType::BOOL => u8::from(b0 != 0) as f64,
        DType::F8_E8M0 => e8m0_f64(b0),
        DType::F4_E2M1X2 => e2m1_pair_f64(b0, 0),
    })
}

fn for_each<const N: usize>(bytes: &[u8], mut f: impl FnMut([u8; N])) {
    for c in bytes.chunks_exact(N) {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        f(a);
    }
}

/// Summary of a tensor's values. `min`, `max`, `mean` and `absmax` are over the finite values
/// (`None` when there are none); NaN and infinities are counted instead.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    pub elements: u64,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub mean: Option<f64>,
    pub absmax: Option<f64>,
    pub nan: u64,
    pub inf: u64,
}

#[derive(Default)]
struct Acc {
    n: u64,
    finite: u64,
    min: f64,
    max: f64,
    sum: f64,
    absmax: f64,
    nan: u64,
    inf: u64,
}

impl Acc {
    #[inline]
    fn push(&mut self, v: f64) {
        self.n += 1;
        if v.is_nan() {
            self.nan += 1;
        } else if v.is_infinite() {
            self.inf += 1;
        } else {
            if self.finite == 0 {
                self.min = v;
                self.max = v;
            } else {
                self.min = self.min.min(v);
                self.max = self.max.max(v);
            }
            self.finite += 1;
            self.sum += v;
            self.absmax = self.absmax.max(v.abs());
        }
    }

    fn finish(self) -> Stats {
        let some = |v: f64| (self.finite > 0).then_some(v);
        Stats {
            elements: self.n,
            min: some(self.min),
            max: some(self.max),
            mean: some(self.sum / self.finite.max(1) as f64),
            absmax: some(self.absmax),
            nan: self.nan,
            inf: self.inf,
        }
    }
}

/// Statistics of packed little-endian `bytes` of `dtype`, without building a typed copy.
pub fn stats(dtype: DType, bytes: &[u8]) -> Result<Stats, FormatError> {
    check_len(dtype, bytes)?;
    let mut a = Acc::default();
    match dtype {
        DType::F64 => for_each::<8>(bytes, |b| a.push(f64::from_le_bytes(b))),
        DType::F32 => for_each::<4>(bytes, |b| a.push(f32::from_le_bytes(b) as f64)),
        DType::F16 => for_each::<2>(bytes, |b| a.push(f16::from_le_bytes(b).to_f64())),
        DType::BF16 => for_each::<2>(bytes, |b| a.push(bf16::from_le_bytes(b).to_f64())),
        DType::F8_E4M3 => bytes.iter().for_each(|&b| a.push(e4m3_f32(b) as f64)),
        DType::F8_E5M2 => bytes.iter().for_each(|&b| a.push(e5m2_f32(b) as f64)),
        DType::I64 => for_each::<8>(bytes, |b| a.push(i64::from_le_bytes(b) as f64)),
        DType::I32 => for_each::<4>(bytes, |b| a.push(i32::from_le_bytes(b) as f64)),
        DType::I16 => for_each::<2>(bytes, |b| a.push(i16::from_le_bytes(b) as f64)),
        DType::I8 => bytes.iter().for_each(|&b| a.push(b as i8 as f64)),
        DType::U64 => for_each::<8>(bytes, |b| a.push(u64::from_le_bytes(b) as f64)),
        DType::U32 => for_each::<4>(bytes, |b| a.push(u32::from_le_bytes(b) as f64)),
        DType::U16 => for_each::<2>(bytes, |b| a.push(u16::from_le_bytes(b) as f64)),
        DType::U8 => bytes.iter().for_each(|&b| a.push(b as f64)),
        DType::BOOL => bytes.iter().for_each(|&b| a.push(u8::from(b != 0) as f64)),
        DType::F8_E8M0 => bytes.iter().for_each(|&b| a.push(e8m0_f64(b))),
        DType::F4_E2M1X2 => bytes.iter().for_each(|&b| {
            a.push(e2m1_pair_f64(b, 0));
            a.push(e2m1_pair_f64(b, 1));
        }),
    }
    Ok(a.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// E4M3 (`e4m3fn`) by its definition: bias 7, no infinities, S.1111.111 is NaN.
    fn e4m3_reference(b: u8) -> f32 {
        let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let (e, m) = ((b >> 3) & 0xf, b & 7);
        if e == 0xf && m == 7 {
            return f32::NAN;
        }
        if e == 0 {
            sign * (m as f32 / 8.0) * 2f32.powi(-6)
        } else {
            sign * (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7)
        }
    }

    /// E5M2 by its definition: IEEE-like, bias 15.
    fn e5m2_reference(b: u8) -> f32 {
        let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let (e, m) = ((b >> 2) & 0x1f, b & 3);
        match (e, m) {
            (0x1f, 0) => sign * f32::INFINITY,
            (0x1f, _) => f32::NAN,
            (0, _) => sign * (m as f32 / 4.0) * 2f32.powi(-14),
            _ => sign * (1.0 + m as f32 / 4.0) * 2f32.powi(e as i32 - 15),
        }
    }

    #[test]
    fn one_element_reads_as_the_whole_tensor_decodes_it() {
        // Bytes 0..=255 repeated: every type sees a mix of signs, NaN patterns and zeros.
        let bytes: Vec<u8> = (0..64u32).map(|i| (i * 37 % 256) as u8).collect();
        for dtype in [
            DType::F64,
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::F8_E4M3,
            DType::F8_E5M2,
            DType::I64,
            DType::I32,
            DType::I16,
            DType::I8,
            DType::U64,
            DType::U32,
            DType::U16,
            DType::U8,
            DType::BOOL,
            DType::F8_E8M0,
            DType::F4_E2M1X2,
        ] {
            let whole = TensorData::from_le_bytes(dtype, &bytes).expect("decodes");
            for i in 0..whole.len() {
                let (one, all) = (element_f64(dtype, &bytes, i), whole.get_f64(i));
                assert!(
                    one == all || one.is_some_and(f64::is_nan) && all.is_some_and(f64::is_nan),
                    "{} element {i}: {one:?} vs {all:?}",
                    dtype.name()
                );
            }
            assert_eq!(
                element_f64(dtype, &bytes, whole.len()),
                None,
                "{}",
                dtype.name()
            );
        }
    }

    #[test]
    fn block_scale_and_fp4_values_decode_by_their_definitions() {
        // E8M0: a biased exponent, nothing else.
        assert_eq!(e8m0_f64(127), 1.0);
        assert_eq!(e8m0_f64(0), 2f64.powi(-127));
        assert_eq!(e8m0_f64(254), 2f64.powi(127));
        assert!(e8m0_f64(255).is_nan());
        // E2M1: bias 1, subnormal 0.5, max 6; sign in bit 3.
        let want = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for n in 0..16u8 {
            let (e, m) = ((n >> 1) & 3, n & 1);
            let mag = if e == 0 {
                m as f64 * 0.5
            } else {
                (1.0 + m as f64 / 2.0) * 2f64.powi(e as i32 - 1)
            };
            let v = if n & 8 != 0 { -mag } else { mag };
            assert_eq!(e2m1_f64(n), v, "nibble {n:#x}");
            assert_eq!(e2m1_f64(n).abs(), want[(n & 7) as usize]);
        }
        // Packed pairs: even value in the low nibble; widening gives two values per byte.
        let bytes = [0x2f_u8, 0x71];
        let vals: Vec<f64> = (0..4)
            .map(|i| element_f64(DType::F4_E2M1X2, &bytes, i).unwrap())
            .collect();
        assert_eq!(vals, [-6.0, 1.0, 0.5, 6.0]);
        assert_eq!(element_f64(DType::F4_E2M1X2, &bytes, 4), None);
        let mut out = Vec::new();
        widen_f32_into(DType::F4_E2M1X2, &bytes, &mut out).unwrap();
        let widened: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(widened, [-6.0, 1.0, 0.5, 6.0]);
        let s = stats(DType::F4_E2M1X2, &bytes).unwrap();
        assert_eq!(s.elements, 4);
        assert_eq!(DType::from_cuda(33), Some(DType::F4_E2M1X2));
        assert_eq!(DType::from_cuda(30), Some(DType::F8_E8M0));
    }

    #[test]
    fn every_fp8_value_decodes_exactly() {
        for b in 0..=255u8 {
            let (got, want) = (e4m3_f32(b), e4m3_reference(b));
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "E4M3 {b:#04x}: {got} != {want}"
            );
            let (got, want) = (e5m2_f32(b), e5m2_reference(b));
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "E5M2 {b:#04x}: {got} != {want}"
            );
        }
        assert_eq!(e4m3_f32(0x7e), 448.0);
        assert_eq!(e5m2_f32(0x7b), 57344.0);
    }

    #[test]
    fn every_16_bit_float_widens_exactly() {
        let bytes: Vec<u8> = (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect();
        for dtype in [DType::F16, DType::BF16] {
            let mut out = Vec::new();
            widen_f32_into(dtype, &bytes, &mut out).expect("widens");
            for (i, c) in out.chunks_exact(4).enumerate() {
                let w = f32::from_le_bytes(c.try_into().expect("4 bytes"));
                let bits = i as u16;
                let back = if dtype == DType::F16 {
                    f16::from_f32(w).to_bits()
                } else {
                    bf16::from_f32(w).to_bits()
                };
                if w.is_nan() {
                    continue;
                }
                assert_eq!(
                    back, bits,
                    "{dtype:?} {bits:#06x} -> {w} does not round-trip"
                );
            }
        }
    }

    #[test]
    fn stats_count_non_finite_values_apart() {
        let vals = [
            1.5f32,
            -3.0,
            f32::NAN,
            f32::INFINITY,
            0.5,
            f32::NEG_INFINITY,
        ];
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let s = stats(DType::F32, &bytes).expect("stats");
        assert_eq!(s.elements, 6);
        assert_eq!((s.nan, s.inf), (1, 2));
        assert_eq!((s.min, s.max), (Some(-3.0), Some(1.5)));
        assert_eq!(s.absmax, Some(3.0));
        assert_eq!(s.mean, Some(-1.0 / 3.0));
        let none = stats(DType::F32, &f32::NAN.to_le_bytes()).expect("stats");
        assert_eq!((none.min, none.mean, none.nan), (None, None, 1));
        assert!(stats(DType::F32, &[0, 0, 0]).is_err(), "a partial element");
    }

    #[test]
    fn typed_data_keeps_every_bit() {
        let bytes: Vec<u8> = (0..64u8).collect();
        for dtype in [
            DType::F64,
            DType::F32,
            DType::BF16,
            DType::F8_E5M2,
            DType::I16,
        ] {
            let t = TensorData::from_le_bytes(dtype, &bytes).expect("decodes");
            assert_eq!(t.dtype(), dtype);
            assert_eq!(t.len(), 64 / dtype.size());
        }
        let t = TensorData::from_le_bytes(DType::BF16, &0x3fc0u16.to_le_bytes()).expect("bf16");
        assert_eq!(t.get_f64(0), Some(1.5));
        assert_eq!(t.get_f64(1), None);
        let t = TensorData::from_le_bytes(DType::F8_E4M3, &[0x7e]).expect("e4m3");
        assert_eq!(t.get_f64(0), Some(448.0));
    }
}
