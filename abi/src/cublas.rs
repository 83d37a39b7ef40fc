//! `cublas_api.h` (CUDA 12.8, cuBLAS 12.8.4): types and constants of the cuBLAS v2 API.
//!
//! The enum section is transcribed from the header (every enumerator, in header order); C enums
//! whose values are all non-negative are `unsigned int` to gcc, those with a negative value
//! (`cublasGemmAlgo_t`) are `int`.
use core::ffi::{c_char, c_int, c_uint, c_ushort};

use crate::library_types::cudaDataType;

/// `CUBLAS_VER_MAJOR`.
pub const CUBLAS_VER_MAJOR: c_int = 12;
/// `CUBLAS_VER_MINOR`.
pub const CUBLAS_VER_MINOR: c_int = 8;
/// `CUBLAS_VER_PATCH`.
pub const CUBLAS_VER_PATCH: c_int = 4;
/// `CUBLAS_VER_BUILD`.
pub const CUBLAS_VER_BUILD: c_int = 1;
/// `CUBLAS_VERSION`: major * 10000 + minor * 100 + patch, what `cublasGetVersion_v2` reports.
pub const CUBLAS_VERSION: c_int =
    CUBLAS_VER_MAJOR * 10000 + CUBLAS_VER_MINOR * 100 + CUBLAS_VER_PATCH;

/// `cublasStatus_t`.
pub type cublasStatus_t = c_uint;
pub const CUBLAS_STATUS_SUCCESS: cublasStatus_t = 0;
pub const CUBLAS_STATUS_NOT_INITIALIZED: cublasStatus_t = 1;
pub const CUBLAS_STATUS_ALLOC_FAILED: cublasStatus_t = 3;
pub const CUBLAS_STATUS_INVALID_VALUE: cublasStatus_t = 7;
pub const CUBLAS_STATUS_ARCH_MISMATCH: cublasStatus_t = 8;
pub const CUBLAS_STATUS_MAPPING_ERROR: cublasStatus_t = 11;
pub const CUBLAS_STATUS_EXECUTION_FAILED: cublasStatus_t = 13;
pub const CUBLAS_STATUS_INTERNAL_ERROR: cublasStatus_t = 14;
pub const CUBLAS_STATUS_NOT_SUPPORTED: cublasStatus_t = 15;
pub const CUBLAS_STATUS_LICENSE_ERROR: cublasStatus_t = 16;

/// `cublasFillMode_t`.
pub type cublasFillMode_t = c_uint;
pub const CUBLAS_FILL_MODE_LOWER: cublasFillMode_t = 0;
pub const CUBLAS_FILL_MODE_UPPER: cublasFillMode_t = 1;
pub const CUBLAS_FILL_MODE_FULL: cublasFillMode_t = 2;

/// `cublasDiagType_t`.
pub type cublasDiagType_t = c_uint;
pub const CUBLAS_DIAG_NON_UNIT: cublasDiagType_t = 0;
pub const CUBLAS_DIAG_UNIT: cublasDiagType_t = 1;

/// `cublasSideMode_t`.
pub type cublasSideMode_t = c_uint;
pub const CUBLAS_SIDE_LEFT: cublasSideMode_t = 0;
pub const CUBLAS_SIDE_RIGHT: cublasSideMode_t = 1;

/// `cublasOperation_t`.
pub type cublasOperation_t = c_uint;
pub const CUBLAS_OP_N: cublasOperation_t = 0;
pub const CUBLAS_OP_T: cublasOperation_t = 1;
pub const CUBLAS_OP_C: cublasOperation_t = 2;
/// Synonym if CUBLAS_OP_C.
pub const CUBLAS_OP_HERMITAN: cublasOperation_t = 2;
/// Conjugate, placeholder - not supported in the current release.
pub const CUBLAS_OP_CONJG: cublasOperation_t = 3;

/// `cublasPointerMode_t`.
pub type cublasPointerMode_t = c_uint;
pub const CUBLAS_POINTER_MODE_HOST: cublasPointerMode_t = 0;
pub const CUBLAS_POINTER_MODE_DEVICE: cublasPointerMode_t = 1;

/// `cublasAtomicsMode_t`.
pub type cublasAtomicsMode_t = c_uint;
pub const CUBLAS_ATOMICS_NOT_ALLOWED: cublasAtomicsMode_t = 0;
pub const CUBLAS_ATOMICS_ALLOWED: cublasAtomicsMode_t = 1;

/// `cublasGemmAlgo_t`.
pub type cublasGemmAlgo_t = c_int;
pub const CUBLAS_GEMM_DFALT: cublasGemmAlgo_t = -1;
pub const CUBLAS_GEMM_DEFAULT: cublasGemmAlgo_t = -1;
pub const CUBLAS_GEMM_ALGO0: cublasGemmAlgo_t = 0;
pub const CUBLAS_GEMM_ALGO1: cublasGemmAlgo_t = 1;
pub const CUBLAS_GEMM_ALGO2: cublasGemmAlgo_t = 2;
pub const CUBLAS_GEMM_ALGO3: cublasGemmAlgo_t = 3;
pub const CUBLAS_GEMM_ALGO4: cublasGemmAlgo_t = 4;
pub const CUBLAS_GEMM_ALGO5: cublasGemmAlgo_t = 5;
pub const CUBLAS_GEMM_ALGO6: cublasGemmAlgo_t = 6;
pub const CUBLAS_GEMM_ALGO7: cublasGemmAlgo_t = 7;
pub const CUBLAS_GEMM_ALGO8: cublasGemmAlgo_t = 8;
pub const CUBLAS_GEMM_ALGO9: cublasGemmAlgo_t = 9;
pub const CUBLAS_GEMM_ALGO10: cublasGemmAlgo_t = 10;
pub const CUBLAS_GEMM_ALGO11: cublasGemmAlgo_t = 11;
pub const CUBLAS_GEMM_ALGO12: cublasGemmAlgo_t = 12;
pub const CUBLAS_GEMM_ALGO13: cublasGemmAlgo_t = 13;
pub const CUBLAS_GEMM_ALGO14: cublasGemmAlgo_t = 14;
pub const CUBLAS_GEMM_ALGO15: cublasGemmAlgo_t = 15;
pub const CUBLAS_GEMM_ALGO16: cublasGemmAlgo_t = 16;
pub const CUBLAS_GEMM_ALGO17: cublasGemmAlgo_t = 17;
pub const CUBLAS_GEMM_ALGO18: cublasGemmAlgo_t = 18;
pub const CUBLAS_GEMM_ALGO19: cublasGemmAlgo_t = 19;
pub const CUBLAS_GEMM_ALGO20: cublasGemmAlgo_t = 20;
pub const CUBLAS_GEMM_ALGO21: cublasGemmAlgo_t = 21;
pub const CUBLAS_GEMM_ALGO22: cublasGemmAlgo_t = 22;
pub const CUBLAS_GEMM_ALGO23: cublasGemmAlgo_t = 23;
pub const CUBLAS_GEMM_DEFAULT_TENSOR_OP: cublasGemmAlgo_t = 99;
pub const CUBLAS_GEMM_DFALT_TENSOR_OP: cublasGemmAlgo_t = 99;
pub const CUBLAS_GEMM_ALGO0_TENSOR_OP: cublasGemmAlgo_t = 100;
pub const CUBLAS_GEMM_ALGO1_TENSOR_OP: cublasGemmAlgo_t = 101;
pub const CUBLAS_GEMM_ALGO2_TENSOR_OP: cublasGemmAlgo_t = 102;
pub const CUBLAS_GEMM_ALGO3_TENSOR_OP: cublasGemmAlgo_t = 103;
pub const CUBLAS_GEMM_ALGO4_TENSOR_OP: cublasGemmAlgo_t = 104;
pub const CUBLAS_GEMM_ALGO5_TENSOR_OP: cublasGemmAlgo_t = 105;
pub const CUBLAS_GEMM_ALGO6_TENSOR_OP: cublasGemmAlgo_t = 106;
pub const CUBLAS_GEMM_ALGO7_TENSOR_OP: cublasGemmAlgo_t = 107;
pub const CUBLAS_GEMM_ALGO8_TENSOR_OP: cublasGemmAlgo_t = 108;
pub const CUBLAS_GEMM_ALGO9_TENSOR_OP: cublasGemmAlgo_t = 109;
pub const CUBLAS_GEMM_ALGO10_TENSOR_OP: cublasGemmAlgo_t = 110;
pub const CUBLAS_GEMM_ALGO11_TENSOR_OP: cublasGemmAlgo_t = 111;
pub const CUBLAS_GEMM_ALGO12_TENSOR_OP: cublasGemmAlgo_t = 112;
pub const CUBLAS_GEMM_ALGO13_TENSOR_OP: cublasGemmAlgo_t = 113;
pub const CUBLAS_GEMM_ALGO14_TENSOR_OP: cublasGemmAlgo_t = 114;
pub const CUBLAS_GEMM_ALGO15_TENSOR_OP: cublasGemmAlgo_t = 115;

/// `cublasMath_t`.
pub type cublasMath_t = c_uint;
pub const CUBLAS_DEFAULT_MATH: cublasMath_t = 0;
/// Deprecated, same effect as using CUBLAS_COMPUTE_32F_FAST_16F, will be removed in a future
/// release.
pub const CUBLAS_TENSOR_OP_MATH: cublasMath_t = 1;
/// Same as using matching _PEDANTIC compute type when using `cublas<T>` routine calls or cublasEx()
/// calls with cudaDataType as compute type.
pub const CUBLAS_PEDANTIC_MATH: cublasMath_t = 2;
/// Allow accelerating single precision routines using TF32 tensor cores.
pub const CUBLAS_TF32_TENSOR_OP_MATH: cublasMath_t = 3;
/// Flag to force any reductons to use the accumulator type and not output type in case of mixed
/// precision routines with lower size output type.
pub const CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION: cublasMath_t = 16;

/// `cublasComputeType_t`.
pub type cublasComputeType_t = c_uint;
/// Half - default.
pub const CUBLAS_COMPUTE_16F: cublasComputeType_t = 64;
/// Half - pedantic.
pub const CUBLAS_COMPUTE_16F_PEDANTIC: cublasComputeType_t = 65;
/// Float - default.
pub const CUBLAS_COMPUTE_32F: cublasComputeType_t = 68;
/// Float - pedantic.
pub const CUBLAS_COMPUTE_32F_PEDANTIC: cublasComputeType_t = 69;
/// Float - fast, allows down-converting inputs to half or TF32.
pub const CUBLAS_COMPUTE_32F_FAST_16F: cublasComputeType_t = 74;
/// Float - fast, allows down-converting inputs to bfloat16 or TF32.
pub const CUBLAS_COMPUTE_32F_FAST_16BF: cublasComputeType_t = 75;
/// Float - fast, allows down-converting inputs to TF32.
pub const CUBLAS_COMPUTE_32F_FAST_TF32: cublasComputeType_t = 77;
/// Double - default.
pub const CUBLAS_COMPUTE_64F: cublasComputeType_t = 70;
/// Double - pedantic.
pub const CUBLAS_COMPUTE_64F_PEDANTIC: cublasComputeType_t = 71;
/// Signed 32-bit int - default.
pub const CUBLAS_COMPUTE_32I: cublasComputeType_t = 72;
/// Signed 32-bit int - pedantic.
pub const CUBLAS_COMPUTE_32I_PEDANTIC: cublasComputeType_t = 73;

/// `cublasDataType_t`: kept for backward compatibility, the same enum as `cudaDataType`.
pub type cublasDataType_t = cudaDataType;

crate::opaque_struct!(
    /// `struct cublasContext`: the pointee of `cublasHandle_t`.
    cublasContext
);
/// A cuBLAS library context.
pub type cublasHandle_t = *mut cublasContext;

crate::opaque_struct!(
    /// `struct cublasXtContext`: the pointee of `cublasXtHandle_t` (`cublasXt.h`).
    cublasXtContext
);
/// A cuBLAS-XT context: BLAS-3 routines spread over several devices, on host or device
/// matrices (`cublasXt.h`).
pub type cublasXtHandle_t = *mut cublasXtContext;

/// `float2` (`vector_types.h`, 8-byte aligned): the storage of `cuComplex`.
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct float2 {
    pub x: f32,
    pub y: f32,
}
/// `cuComplex` (`cuComplex.h`): single-precision complex.
pub type cuComplex = float2;

/// `double2` (`vector_types.h`, 16-byte aligned): the storage of `cuDoubleComplex`.
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct double2 {
    pub x: f64,
    pub y: f64,
}
/// `cuDoubleComplex` (`cuComplex.h`): double-precision complex.
pub type cuDoubleComplex = double2;

/// `cublasLogCallback`.
pub type cublasLogCallback = Option<unsafe extern "C" fn(msg: *const c_char)>;

/// `__half` (`cuda_fp16.h`): an IEEE binary16 value, as its raw bits.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct __half {
    /// The binary16 bits.
    pub __x: c_ushort,
}

/// `__nv_bfloat16` (`cuda_bf16.h`): a bfloat16 value, as its raw bits.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct __nv_bfloat16 {
    /// The bfloat16 bits.
    pub __x: c_ushort,
}
