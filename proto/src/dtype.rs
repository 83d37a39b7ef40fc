//! Element types of captured tensors, named as safetensors names them.

use serde::{Deserialize, Serialize};

/// The element type of a stored tensor.
// Spelled as safetensors spells them (`F8_E4M3`), so names on disk and in exports agree.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    F64,
    F32,
    F16,
    BF16,
    /// FP8 E4M3 (`e4m3fn`: no infinities).
    F8_E4M3,
    F8_E5M2,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
    BOOL,
    /// Unsigned exponent-only FP8 (`CUDA_R_8F_UE8M0`, OCP MX "E8M0"): `2^(b - 127)`, 0xFF NaN.
    /// The block scales of MXFP8 (`CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0`).
    F8_E8M0,
    /// Two FP4 E2M1 values per byte (`CUDA_R_4F_E2M1` packed, as cuBLASLt stores it and as
    /// PyTorch's `float4_e2m1fn_x2`): the value of even index in the low nibble. One element
    /// is one byte: a stored shape counts bytes, its innermost dimension half the values.
    F4_E2M1X2,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F8_E4M3
            | DType::F8_E5M2
            | DType::I8
            | DType::U8
            | DType::BOOL
            | DType::F8_E8M0
            | DType::F4_E2M1X2 => 1,
        }
    }

    /// The safetensors name (`"BF16"`, `"F8_E4M3"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F64 => "F64",
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F8_E4M3 => "F8_E4M3",
            DType::F8_E5M2 => "F8_E5M2",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::I16 => "I16",
            DType::I8 => "I8",
            DType::U64 => "U64",
            DType::U32 => "U32",
            DType::U16 => "U16",
            DType::U8 => "U8",
            DType::BOOL => "BOOL",
            DType::F8_E8M0 => "F8_E8M0",
            DType::F4_E2M1X2 => "F4_E2M1X2",
        }
    }

    /// The type of a `cudaDataType_t` value, for the real scalar types.
    pub const fn from_cuda(t: u32) -> Option<DType> {
        Some(match t {
            0 => DType::F32,
            1 => DType::F64,
            2 => DType::F16,
            3 => DType::I8,
            8 => DType::U8,
            10 => DType::I32,
            12 => DType::U32,
            14 => DType::BF16,
            20 => DType::I16,
            22 => DType::U16,
            24 => DType::I64,
            26 => DType::U64,
            28 => DType::F8_E4M3,
            29 => DType::F8_E5M2,
            30 => DType::F8_E8M0,
            33 => DType::F4_E2M1X2,
            _ => return None,
        })
    }

    /// Values per element: 2 for packed FP4, else 1.
    pub const fn values_per_element(self) -> usize {
        match self {
            DType::F4_E2M1X2 => 2,
            _ => 1,
        }
    }

    /// The type of an `ncclDataType_t` value.
    pub const fn from_nccl(t: u32) -> Option<DType> {
        Some(match t {
            0 => DType::I8,
            1 => DType::U8,
            2 => DType::I32,
            3 => DType::U32,
            4 => DType::I64,
            5 => DType::U64,
            6 => DType::F16,
            7 => DType::F32,
            8 => DType::F64,
            9 => DType::BF16,
            10 => DType::F8_E4M3,
            11 => DType::F8_E5M2,
            _ => return None,
        })
    }

    /// Whether the type is floating point.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DType::F64
                | DType::F32
                | DType::F16
                | DType::BF16
                | DType::F8_E4M3
                | DType::F8_E5M2
                | DType::F8_E8M0
                | DType::F4_E2M1X2
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_and_nccl_codes_agree_on_the_types_both_have() {
        assert_eq!(DType::from_cuda(14), DType::from_nccl(9));
        assert_eq!(DType::from_cuda(28), DType::from_nccl(10));
        assert_eq!(DType::from_cuda(29), DType::from_nccl(11));
        assert_eq!(DType::from_cuda(0), DType::from_nccl(7));
        assert_eq!(
            DType::from_cuda(4),
            None,
            "complex types are not tensors we decode"
        );
    }
}
