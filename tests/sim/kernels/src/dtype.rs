//! Element types of device buffers and their exact conversions.
//!
//! Every conversion to a narrow type rounds to nearest-even exactly as the hardware does:
//! `half` for FP16/BF16, `float8` (a port of NVIDIA's `cuda_fp8.hpp`, saturating to the largest
//! finite value like `__NV_SATFINITE`) for E4M3/E5M2.

use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};

/// The element type of a buffer, whatever API named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    /// FP8 E4M3 (`e4m3fn`: no infinities, largest finite 448).
    E4M3,
    /// FP8 E5M2.
    E5M2,
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::E4M3 | DType::E5M2 | DType::I8 | DType::U8 => 1,
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::E4M3 | DType::E5M2
        )
    }

    /// Machine epsilon (distance from 1 to the next representable value); 1 for integers.
    pub fn epsilon(self) -> f64 {
        match self {
            DType::F64 => f64::EPSILON,
            DType::F32 => f32::EPSILON as f64,
            DType::F16 => 2f64.powi(-10),
            DType::BF16 => 2f64.powi(-7),
            DType::E4M3 => 2f64.powi(-3),
            DType::E5M2 => 2f64.powi(-2),
            _ => 1.0,
        }
    }

    /// The type of a `cudaDataType_t` value, if it is a real scalar type the simulator handles.
    pub fn from_cuda(t: u32) -> Option<DType> {
        use cuda_abi::library_types::*;
        Some(match t {
            CUDA_R_32F => DType::F32,
            CUDA_R_64F => DType::F64,
            CUDA_R_16F => DType::F16,
            CUDA_R_16BF => DType::BF16,
            CUDA_R_8F_E4M3 => DType::E4M3,
            CUDA_R_8F_E5M2 => DType::E5M2,
            CUDA_R_8I => DType::I8,
            CUDA_R_8U => DType::U8,
            CUDA_R_32I => DType::I32,
            CUDA_R_32U => DType::U32,
            CUDA_R_64I => DType::I64,
            CUDA_R_64U => DType::U64,
            _ => return None,
        })
    }

    /// Reads element `i` of `bytes` (little-endian, native layout) as f64. Exact for every
    /// type except 64-bit integers beyond 2^53.
    #[inline]
    pub fn load(self, bytes: &[u8], i: usize) -> f64 {
        let s = self.size();
        let b = &bytes[i * s..(i + 1) * s];
        match self {
            DType::F32 => f32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as f64,
            DType::F64 => f64::from_ne_bytes(b.try_into().expect("8 bytes")),
            DType::F16 => f16::from_bits(u16::from_ne_bytes([b[0], b[1]])).to_f64(),
            DType::BF16 => bf16::from_bits(u16::from_ne_bytes([b[0], b[1]])).to_f64(),
            DType::E4M3 => F8E4M3::from_bits(b[0]).to_f64(),
            DType::E5M2 => F8E5M2::from_bits(b[0]).to_f64(),
            DType::I8 => b[0] as i8 as f64,
            DType::U8 => b[0] as f64,
            DType::I32 => i32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as f64,
            DType::U32 => u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as f64,
            DType::I64 => i64::from_ne_bytes(b.try_into().expect("8 bytes")) as f64,
            DType::U64 => u64::from_ne_bytes(b.try_into().expect("8 bytes")) as f64,
        }
    }

    /// Rounds `v` to this type (nearest-even; FP8 saturates to the largest finite value;
    /// integers round to nearest and saturate) and writes it as element `i` of `bytes`.
    #[inline]
    pub fn store(self, bytes: &mut [u8], i: usize, v: f64) {
        let s = self.size();
        let b = &mut bytes[i * s..(i + 1) * s];
        match self {
            // f64 -> f32 is a single correctly rounded step.
            DType::F32 => b.copy_from_slice(&(v as f32).to_ne_bytes()),
            DType::F64 => b.copy_from_slice(&v.to_ne_bytes()),
            DType::F16 => b.copy_from_slice(&f16::from_f64(v).to_bits().to_ne_bytes()),
            DType::BF16 => b.copy_from_slice(&bf16::from_f64(v).to_bits().to_ne_bytes()),
            DType::E4M3 => b[0] = F8E4M3::from_f64(v).to_bits(),
            DType::E5M2 => b[0] = F8E5M2::from_f64(v).to_bits(),
            DType::I8 => b[0] = (v.round() as i8) as u8,
            DType::U8 => b[0] = v.round() as u8,
            DType::I32 => b.copy_from_slice(&(v.round() as i32).to_ne_bytes()),
            DType::U32 => b.copy_from_slice(&(v.round() as u32).to_ne_bytes()),
            DType::I64 => b.copy_from_slice(&(v.round() as i64).to_ne_bytes()),
            DType::U64 => b.copy_from_slice(&(v.round() as u64).to_ne_bytes()),
        }
    }

    /// Rounds `v` to this type and back, as a value would be after a store and a load.
    #[inline]
    pub fn round(self, v: f64) -> f64 {
        let mut buf = [0u8; 8];
        self.store(&mut buf, 0, v);
        self.load(&buf, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_types_round_to_nearest_even() {
        // 1 + 2^-8 is exactly half-way between two bf16 values: ties go to the even one (1.0).
        assert_eq!(DType::BF16.round(1.0 + 2f64.powi(-8)), 1.0);
        assert_eq!(
            DType::BF16.round(1.0 + 3.0 * 2f64.powi(-8)),
            1.0 + 2f64.powi(-6)
        );
        assert_eq!(DType::F16.round(1.0 + 2f64.powi(-11)), 1.0);
        assert_eq!(DType::E4M3.round(1.0 + 2f64.powi(-4)), 1.0);
        assert_eq!(DType::E5M2.round(1.0 + 2f64.powi(-3)), 1.0);
    }

    #[test]
    fn fp8_saturates_to_largest_finite() {
        assert_eq!(DType::E4M3.round(1e6), 448.0);
        assert_eq!(DType::E4M3.round(-1e6), -448.0);
        assert_eq!(DType::E5M2.round(1e9), 57344.0);
    }

    #[test]
    fn every_fp8_bit_pattern_round_trips() {
        for t in [DType::E4M3, DType::E5M2] {
            for bits in 0u8..=255 {
                let v = t.load(&[bits], 0);
                if !v.is_finite() {
                    // NaN stays NaN; E5M2's infinities saturate like __NV_SATFINITE.
                    continue;
                }
                let mut out = [0u8];
                t.store(&mut out, 0, v);
                assert_eq!(t.load(&out, 0), v, "{t:?} bits {bits:#04x}");
            }
        }
    }

    #[test]
    fn cuda_codes_map_to_types() {
        assert_eq!(DType::from_cuda(14), Some(DType::BF16));
        assert_eq!(DType::from_cuda(28), Some(DType::E4M3));
        assert_eq!(DType::from_cuda(29), Some(DType::E5M2));
        assert_eq!(DType::from_cuda(4), None, "complex types are not simulated");
    }
}
