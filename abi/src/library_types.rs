//! `library_types.h`: data types shared by cuBLAS, cuBLASLt and the runtime.
use core::ffi::c_uint;

/// `enum cudaDataType_t` (all values non-negative, so the C compatible type is `unsigned int`).
pub type cudaDataType_t = c_uint;
/// `cudaDataType` is a typedef of the same enum.
pub type cudaDataType = cudaDataType_t;

pub const CUDA_R_32F: cudaDataType_t = 0;
pub const CUDA_R_64F: cudaDataType_t = 1;
pub const CUDA_R_16F: cudaDataType_t = 2;
pub const CUDA_R_8I: cudaDataType_t = 3;
pub const CUDA_C_32F: cudaDataType_t = 4;
pub const CUDA_C_64F: cudaDataType_t = 5;
pub const CUDA_C_16F: cudaDataType_t = 6;
pub const CUDA_C_8I: cudaDataType_t = 7;
pub const CUDA_R_8U: cudaDataType_t = 8;
pub const CUDA_C_8U: cudaDataType_t = 9;
pub const CUDA_R_32I: cudaDataType_t = 10;
pub const CUDA_C_32I: cudaDataType_t = 11;
pub const CUDA_R_32U: cudaDataType_t = 12;
pub const CUDA_C_32U: cudaDataType_t = 13;
pub const CUDA_R_16BF: cudaDataType_t = 14;
pub const CUDA_C_16BF: cudaDataType_t = 15;
pub const CUDA_R_4I: cudaDataType_t = 16;
pub const CUDA_C_4I: cudaDataType_t = 17;
pub const CUDA_R_4U: cudaDataType_t = 18;
pub const CUDA_C_4U: cudaDataType_t = 19;
pub const CUDA_R_16I: cudaDataType_t = 20;
pub const CUDA_C_16I: cudaDataType_t = 21;
pub const CUDA_R_16U: cudaDataType_t = 22;
pub const CUDA_C_16U: cudaDataType_t = 23;
pub const CUDA_R_64I: cudaDataType_t = 24;
pub const CUDA_C_64I: cudaDataType_t = 25;
pub const CUDA_R_64U: cudaDataType_t = 26;
pub const CUDA_C_64U: cudaDataType_t = 27;
pub const CUDA_R_8F_E4M3: cudaDataType_t = 28;
pub const CUDA_R_8F_E5M2: cudaDataType_t = 29;
pub const CUDA_R_8F_UE8M0: cudaDataType_t = 30;
pub const CUDA_R_6F_E2M3: cudaDataType_t = 31;
pub const CUDA_R_6F_E3M2: cudaDataType_t = 32;
pub const CUDA_R_4F_E2M1: cudaDataType_t = 33;

/// `libraryPropertyType` (`library_types.h`, typedef of `enum libraryPropertyType_t`), taken by
/// `cublasGetProperty` and `cublasLtGetProperty`.
pub type libraryPropertyType = c_uint;
/// `MAJOR_VERSION`.
pub const MAJOR_VERSION: libraryPropertyType = 0;
/// `MINOR_VERSION`.
pub const MINOR_VERSION: libraryPropertyType = 1;
/// `PATCH_LEVEL`.
pub const PATCH_LEVEL: libraryPropertyType = 2;
