//! The one table of element types' rounding constants, shared by compare's tolerances and
//! check's reduction bounds; `cudaDataType_t` codes are read through
//! [`DType::from_cuda`] (the codes `cuda_abi::library_types` declares), never re-numbered.

use ttrace_format::dtype::DType;

/// Significand bits after the point of a float type (`None`: not a float type).
fn fraction_bits(d: DType) -> Option<i32> {
    Some(match d {
        DType::F64 => 52,
        DType::F32 => 23,
        DType::F16 => 10,
        DType::BF16 => 7,
        DType::F8_E4M3 => 3,
        DType::F8_E5M2 => 2,
        _ => return None,
    })
}

/// Machine epsilon of a float type (`2^(1-t)`, t significand bits; 1 for other types).
pub fn epsilon(d: DType) -> f64 {
    2f64.powi(-fraction_bits(d).unwrap_or(0))
}

/// Unit round-off (half of epsilon): the largest relative error of one rounding.
pub fn unit_roundoff(d: DType) -> f64 {
    epsilon(d) / 2.0
}

/// The smallest positive (subnormal) value of a float type: the absolute error a rounding
/// near zero can make (`None` for integer types).
pub fn smallest(d: DType) -> Option<f64> {
    Some(match d {
        DType::F64 => f64::from_bits(1),
        DType::F32 => 2f64.powi(-149),
        DType::F16 => 2f64.powi(-24),
        DType::BF16 => 2f64.powi(-133),
        DType::F8_E4M3 => 2f64.powi(-9),
        DType::F8_E5M2 => 2f64.powi(-16),
        _ => return None,
    })
}

/// Unit round-off and smallest positive value of a float type; `None` for integer types
/// (reduced exactly).
pub fn roundoff(d: DType) -> Option<(f64, f64)> {
    fraction_bits(d)?;
    Some((unit_roundoff(d), smallest(d)?))
}

/// The element type of a GEMM operand's `cudaDataType_t`.
pub fn of_cuda(t: u32) -> Option<DType> {
    DType::from_cuda(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_abi::library_types as lt;

    #[test]
    fn epsilons_are_the_textbook_ones() {
        assert_eq!(epsilon(DType::BF16), 0.0078125);
        assert_eq!(epsilon(DType::F32), 1.1920928955078125e-7);
        assert_eq!(unit_roundoff(DType::F8_E4M3), 2f64.powi(-4));
    }

    #[test]
    fn integer_types_round_nothing() {
        assert_eq!(roundoff(DType::I32), None);
        assert_eq!(
            roundoff(DType::F32),
            Some((2f64.powi(-24), 2f64.powi(-149)))
        );
        assert_eq!(roundoff(DType::F64).map(|r| r.1), Some(f64::from_bits(1)));
    }

    #[test]
    fn gemm_operand_codes_are_the_abi_crates() {
        assert_eq!(of_cuda(lt::CUDA_R_16BF), Some(DType::BF16));
        assert_eq!(of_cuda(lt::CUDA_R_16F), Some(DType::F16));
        assert_eq!(of_cuda(lt::CUDA_R_8F_E4M3), Some(DType::F8_E4M3));
        assert_eq!(of_cuda(lt::CUDA_R_8F_E5M2), Some(DType::F8_E5M2));
        assert_eq!(of_cuda(lt::CUDA_R_32F), Some(DType::F32));
    }
}
