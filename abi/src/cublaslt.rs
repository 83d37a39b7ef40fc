//! `cublasLt.h` (CUDA 12.8, cuBLAS 12.8.4): types and constants of the cuBLASLt API.
//!
//! Every enum of the header is transcribed with all its enumerators, in header order (doc lines
//! are the first sentence of the header's comment). All cuBLASLt enums have non-negative values,
//! so gcc gives them the type `unsigned int`. The descriptor structs are "semi-opaque": the caller
//! may allocate them (`cublasLt*Init`), so their size is ABI.
use core::ffi::{c_float, c_int, c_uint};

use crate::cublas::cublasStatus_t;

crate::opaque_struct!(
    /// `struct cublasLtContext`: the pointee of `cublasLtHandle_t`.
    cublasLtContext
);
/// A cuBLASLt library context.
pub type cublasLtHandle_t = *mut cublasLtContext;

/// Semi-opaque storage of a matrix layout descriptor.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct cublasLtMatrixLayoutOpaque_t {
    /// Library-defined contents.
    #[cfg(not(sim_cuda13))]
    pub data: [u64; 8],
    /// cuBLAS 13 grew it.
    #[cfg(sim_cuda13)]
    pub data: [u64; 14],
}
/// A matrix layout descriptor.
pub type cublasLtMatrixLayout_t = *mut cublasLtMatrixLayoutOpaque_t;

/// Semi-opaque algorithm descriptor; may be serialised and restored with the same library.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct cublasLtMatmulAlgo_t {
    /// Library-defined contents.
    pub data: [u64; 8],
}

/// Semi-opaque storage of a matmul operation descriptor.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct cublasLtMatmulDescOpaque_t {
    /// Library-defined contents.
    pub data: [u64; 32],
}
/// A matmul operation descriptor.
pub type cublasLtMatmulDesc_t = *mut cublasLtMatmulDescOpaque_t;

/// Semi-opaque storage of a matrix transform descriptor.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct cublasLtMatrixTransformDescOpaque_t {
    /// Library-defined contents.
    pub data: [u64; 8],
}
/// A matrix transform descriptor.
pub type cublasLtMatrixTransformDesc_t = *mut cublasLtMatrixTransformDescOpaque_t;

/// Semi-opaque storage of a heuristic search preference descriptor.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct cublasLtMatmulPreferenceOpaque_t {
    /// Library-defined contents.
    #[cfg(not(sim_cuda13))]
    pub data: [u64; 8],
    /// cuBLAS 13 grew it.
    #[cfg(sim_cuda13)]
    pub data: [u64; 12],
}
/// A heuristic search preference descriptor.
pub type cublasLtMatmulPreference_t = *mut cublasLtMatmulPreferenceOpaque_t;

/// One result of `cublasLtMatmulAlgoGetHeuristic`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct cublasLtMatmulHeuristicResult_t {
    /// The configured algorithm.
    pub algo: cublasLtMatmulAlgo_t,
    /// Workspace the algorithm needs, in bytes.
    pub workspaceSize: usize,
    /// `CUBLAS_STATUS_SUCCESS` when the other fields are valid.
    pub state: cublasStatus_t,
    /// Device utilisation estimate (1.0: one full wave).
    pub wavesCount: c_float,
    /// Reserved.
    pub reserved: [c_int; 4],
}

/// `cublasLtLoggerCallback_t`.
pub type cublasLtLoggerCallback_t = Option<
    unsafe extern "C" fn(
        logLevel: c_int,
        functionName: *const core::ffi::c_char,
        message: *const core::ffi::c_char,
    ),
>;

/// `cublasLtNumericalImplFlags_t`: a mask of `CUBLASLT_NUMERICAL_IMPL_FLAGS_*`.
pub type cublasLtNumericalImplFlags_t = u64;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA: cublasLtNumericalImplFlags_t = 0x1;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA: cublasLtNumericalImplFlags_t = 0x2;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_IMMA`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_IMMA: cublasLtNumericalImplFlags_t = 0x4;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_DMMA`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_DMMA: cublasLtNumericalImplFlags_t = 0x8;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_TENSOR_OP_MASK`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_TENSOR_OP_MASK: cublasLtNumericalImplFlags_t = 0xfe;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_OP_TYPE_MASK`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_OP_TYPE_MASK: cublasLtNumericalImplFlags_t = 0xff;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_16F`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_16F: cublasLtNumericalImplFlags_t = 0x100;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F: cublasLtNumericalImplFlags_t = 0x200;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_64F`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_64F: cublasLtNumericalImplFlags_t = 0x400;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32I`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32I: cublasLtNumericalImplFlags_t = 0x800;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_TYPE_MASK`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_TYPE_MASK: cublasLtNumericalImplFlags_t =
    0xff00;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16F`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16F: cublasLtNumericalImplFlags_t = 0x10000;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF: cublasLtNumericalImplFlags_t = 0x20000;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_TF32`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_TF32: cublasLtNumericalImplFlags_t = 0x40000;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F: cublasLtNumericalImplFlags_t = 0x80000;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_64F`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_64F: cublasLtNumericalImplFlags_t = 0x100000;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8I`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8I: cublasLtNumericalImplFlags_t = 0x200000;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8F_E4M3`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8F_E4M3: cublasLtNumericalImplFlags_t = 0x400000;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8F_E5M2`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8F_E5M2: cublasLtNumericalImplFlags_t = 0x800000;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_OP_INPUT_TYPE_MASK`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_OP_INPUT_TYPE_MASK: cublasLtNumericalImplFlags_t = 0xff0000;
/// `CUBLASLT_NUMERICAL_IMPL_FLAGS_GAUSSIAN`.
pub const CUBLASLT_NUMERICAL_IMPL_FLAGS_GAUSSIAN: cublasLtNumericalImplFlags_t = 0x100000000;

/// `cublasLtMatmulTile_t`.
pub type cublasLtMatmulTile_t = c_uint;
pub const CUBLASLT_MATMUL_TILE_UNDEFINED: cublasLtMatmulTile_t = 0;
pub const CUBLASLT_MATMUL_TILE_8x8: cublasLtMatmulTile_t = 1;
pub const CUBLASLT_MATMUL_TILE_8x16: cublasLtMatmulTile_t = 2;
pub const CUBLASLT_MATMUL_TILE_16x8: cublasLtMatmulTile_t = 3;
pub const CUBLASLT_MATMUL_TILE_8x32: cublasLtMatmulTile_t = 4;
pub const CUBLASLT_MATMUL_TILE_16x16: cublasLtMatmulTile_t = 5;
pub const CUBLASLT_MATMUL_TILE_32x8: cublasLtMatmulTile_t = 6;
pub const CUBLASLT_MATMUL_TILE_8x64: cublasLtMatmulTile_t = 7;
pub const CUBLASLT_MATMUL_TILE_16x32: cublasLtMatmulTile_t = 8;
pub const CUBLASLT_MATMUL_TILE_32x16: cublasLtMatmulTile_t = 9;
pub const CUBLASLT_MATMUL_TILE_64x8: cublasLtMatmulTile_t = 10;
pub const CUBLASLT_MATMUL_TILE_32x32: cublasLtMatmulTile_t = 11;
pub const CUBLASLT_MATMUL_TILE_32x64: cublasLtMatmulTile_t = 12;
pub const CUBLASLT_MATMUL_TILE_64x32: cublasLtMatmulTile_t = 13;
pub const CUBLASLT_MATMUL_TILE_32x128: cublasLtMatmulTile_t = 14;
pub const CUBLASLT_MATMUL_TILE_64x64: cublasLtMatmulTile_t = 15;
pub const CUBLASLT_MATMUL_TILE_128x32: cublasLtMatmulTile_t = 16;
pub const CUBLASLT_MATMUL_TILE_64x128: cublasLtMatmulTile_t = 17;
pub const CUBLASLT_MATMUL_TILE_128x64: cublasLtMatmulTile_t = 18;
pub const CUBLASLT_MATMUL_TILE_64x256: cublasLtMatmulTile_t = 19;
pub const CUBLASLT_MATMUL_TILE_128x128: cublasLtMatmulTile_t = 20;
pub const CUBLASLT_MATMUL_TILE_256x64: cublasLtMatmulTile_t = 21;
pub const CUBLASLT_MATMUL_TILE_64x512: cublasLtMatmulTile_t = 22;
pub const CUBLASLT_MATMUL_TILE_128x256: cublasLtMatmulTile_t = 23;
pub const CUBLASLT_MATMUL_TILE_256x128: cublasLtMatmulTile_t = 24;
pub const CUBLASLT_MATMUL_TILE_512x64: cublasLtMatmulTile_t = 25;
pub const CUBLASLT_MATMUL_TILE_64x96: cublasLtMatmulTile_t = 26;
pub const CUBLASLT_MATMUL_TILE_96x64: cublasLtMatmulTile_t = 27;
pub const CUBLASLT_MATMUL_TILE_96x128: cublasLtMatmulTile_t = 28;
pub const CUBLASLT_MATMUL_TILE_128x160: cublasLtMatmulTile_t = 29;
pub const CUBLASLT_MATMUL_TILE_160x128: cublasLtMatmulTile_t = 30;
pub const CUBLASLT_MATMUL_TILE_192x128: cublasLtMatmulTile_t = 31;
pub const CUBLASLT_MATMUL_TILE_128x192: cublasLtMatmulTile_t = 32;
pub const CUBLASLT_MATMUL_TILE_128x96: cublasLtMatmulTile_t = 33;
pub const CUBLASLT_MATMUL_TILE_32x256: cublasLtMatmulTile_t = 34;
pub const CUBLASLT_MATMUL_TILE_256x32: cublasLtMatmulTile_t = 35;
pub const CUBLASLT_MATMUL_TILE_8x128: cublasLtMatmulTile_t = 36;
pub const CUBLASLT_MATMUL_TILE_8x192: cublasLtMatmulTile_t = 37;
pub const CUBLASLT_MATMUL_TILE_8x256: cublasLtMatmulTile_t = 38;
pub const CUBLASLT_MATMUL_TILE_8x320: cublasLtMatmulTile_t = 39;
pub const CUBLASLT_MATMUL_TILE_8x384: cublasLtMatmulTile_t = 40;
pub const CUBLASLT_MATMUL_TILE_8x448: cublasLtMatmulTile_t = 41;
pub const CUBLASLT_MATMUL_TILE_8x512: cublasLtMatmulTile_t = 42;
pub const CUBLASLT_MATMUL_TILE_8x576: cublasLtMatmulTile_t = 43;
pub const CUBLASLT_MATMUL_TILE_8x640: cublasLtMatmulTile_t = 44;
pub const CUBLASLT_MATMUL_TILE_8x704: cublasLtMatmulTile_t = 45;
pub const CUBLASLT_MATMUL_TILE_8x768: cublasLtMatmulTile_t = 46;
pub const CUBLASLT_MATMUL_TILE_16x64: cublasLtMatmulTile_t = 47;
pub const CUBLASLT_MATMUL_TILE_16x128: cublasLtMatmulTile_t = 48;
pub const CUBLASLT_MATMUL_TILE_16x192: cublasLtMatmulTile_t = 49;
pub const CUBLASLT_MATMUL_TILE_16x256: cublasLtMatmulTile_t = 50;
pub const CUBLASLT_MATMUL_TILE_16x320: cublasLtMatmulTile_t = 51;
pub const CUBLASLT_MATMUL_TILE_16x384: cublasLtMatmulTile_t = 52;
pub const CUBLASLT_MATMUL_TILE_16x448: cublasLtMatmulTile_t = 53;
pub const CUBLASLT_MATMUL_TILE_16x512: cublasLtMatmulTile_t = 54;
pub const CUBLASLT_MATMUL_TILE_16x576: cublasLtMatmulTile_t = 55;
pub const CUBLASLT_MATMUL_TILE_16x640: cublasLtMatmulTile_t = 56;
pub const CUBLASLT_MATMUL_TILE_16x704: cublasLtMatmulTile_t = 57;
pub const CUBLASLT_MATMUL_TILE_16x768: cublasLtMatmulTile_t = 58;
pub const CUBLASLT_MATMUL_TILE_24x64: cublasLtMatmulTile_t = 59;
pub const CUBLASLT_MATMUL_TILE_24x128: cublasLtMatmulTile_t = 60;
pub const CUBLASLT_MATMUL_TILE_24x192: cublasLtMatmulTile_t = 61;
pub const CUBLASLT_MATMUL_TILE_24x256: cublasLtMatmulTile_t = 62;
pub const CUBLASLT_MATMUL_TILE_24x320: cublasLtMatmulTile_t = 63;
pub const CUBLASLT_MATMUL_TILE_24x384: cublasLtMatmulTile_t = 64;
pub const CUBLASLT_MATMUL_TILE_24x448: cublasLtMatmulTile_t = 65;
pub const CUBLASLT_MATMUL_TILE_24x512: cublasLtMatmulTile_t = 66;
pub const CUBLASLT_MATMUL_TILE_24x576: cublasLtMatmulTile_t = 67;
pub const CUBLASLT_MATMUL_TILE_24x640: cublasLtMatmulTile_t = 68;
pub const CUBLASLT_MATMUL_TILE_24x704: cublasLtMatmulTile_t = 69;
pub const CUBLASLT_MATMUL_TILE_24x768: cublasLtMatmulTile_t = 70;
pub const CUBLASLT_MATMUL_TILE_32x192: cublasLtMatmulTile_t = 71;
pub const CUBLASLT_MATMUL_TILE_32x320: cublasLtMatmulTile_t = 72;
pub const CUBLASLT_MATMUL_TILE_32x384: cublasLtMatmulTile_t = 73;
pub const CUBLASLT_MATMUL_TILE_32x448: cublasLtMatmulTile_t = 74;
pub const CUBLASLT_MATMUL_TILE_32x512: cublasLtMatmulTile_t = 75;
pub const CUBLASLT_MATMUL_TILE_32x576: cublasLtMatmulTile_t = 76;
pub const CUBLASLT_MATMUL_TILE_32x640: cublasLtMatmulTile_t = 77;
pub const CUBLASLT_MATMUL_TILE_32x704: cublasLtMatmulTile_t = 78;
pub const CUBLASLT_MATMUL_TILE_32x768: cublasLtMatmulTile_t = 79;
pub const CUBLASLT_MATMUL_TILE_40x64: cublasLtMatmulTile_t = 80;
pub const CUBLASLT_MATMUL_TILE_40x128: cublasLtMatmulTile_t = 81;
pub const CUBLASLT_MATMUL_TILE_40x192: cublasLtMatmulTile_t = 82;
pub const CUBLASLT_MATMUL_TILE_40x256: cublasLtMatmulTile_t = 83;
pub const CUBLASLT_MATMUL_TILE_40x320: cublasLtMatmulTile_t = 84;
pub const CUBLASLT_MATMUL_TILE_40x384: cublasLtMatmulTile_t = 85;
pub const CUBLASLT_MATMUL_TILE_40x448: cublasLtMatmulTile_t = 86;
pub const CUBLASLT_MATMUL_TILE_40x512: cublasLtMatmulTile_t = 87;
pub const CUBLASLT_MATMUL_TILE_40x576: cublasLtMatmulTile_t = 88;
pub const CUBLASLT_MATMUL_TILE_40x640: cublasLtMatmulTile_t = 89;
pub const CUBLASLT_MATMUL_TILE_40x704: cublasLtMatmulTile_t = 90;
pub const CUBLASLT_MATMUL_TILE_40x768: cublasLtMatmulTile_t = 91;
pub const CUBLASLT_MATMUL_TILE_48x64: cublasLtMatmulTile_t = 92;
pub const CUBLASLT_MATMUL_TILE_48x128: cublasLtMatmulTile_t = 93;
pub const CUBLASLT_MATMUL_TILE_48x192: cublasLtMatmulTile_t = 94;
pub const CUBLASLT_MATMUL_TILE_48x256: cublasLtMatmulTile_t = 95;
pub const CUBLASLT_MATMUL_TILE_48x320: cublasLtMatmulTile_t = 96;
pub const CUBLASLT_MATMUL_TILE_48x384: cublasLtMatmulTile_t = 97;
pub const CUBLASLT_MATMUL_TILE_48x448: cublasLtMatmulTile_t = 98;
pub const CUBLASLT_MATMUL_TILE_48x512: cublasLtMatmulTile_t = 99;
pub const CUBLASLT_MATMUL_TILE_48x576: cublasLtMatmulTile_t = 100;
pub const CUBLASLT_MATMUL_TILE_48x640: cublasLtMatmulTile_t = 101;
pub const CUBLASLT_MATMUL_TILE_48x704: cublasLtMatmulTile_t = 102;
pub const CUBLASLT_MATMUL_TILE_48x768: cublasLtMatmulTile_t = 103;
pub const CUBLASLT_MATMUL_TILE_56x64: cublasLtMatmulTile_t = 104;
pub const CUBLASLT_MATMUL_TILE_56x128: cublasLtMatmulTile_t = 105;
pub const CUBLASLT_MATMUL_TILE_56x192: cublasLtMatmulTile_t = 106;
pub const CUBLASLT_MATMUL_TILE_56x256: cublasLtMatmulTile_t = 107;
pub const CUBLASLT_MATMUL_TILE_56x320: cublasLtMatmulTile_t = 108;
pub const CUBLASLT_MATMUL_TILE_56x384: cublasLtMatmulTile_t = 109;
pub const CUBLASLT_MATMUL_TILE_56x448: cublasLtMatmulTile_t = 110;
pub const CUBLASLT_MATMUL_TILE_56x512: cublasLtMatmulTile_t = 111;
pub const CUBLASLT_MATMUL_TILE_56x576: cublasLtMatmulTile_t = 112;
pub const CUBLASLT_MATMUL_TILE_56x640: cublasLtMatmulTile_t = 113;
pub const CUBLASLT_MATMUL_TILE_56x704: cublasLtMatmulTile_t = 114;
pub const CUBLASLT_MATMUL_TILE_56x768: cublasLtMatmulTile_t = 115;
pub const CUBLASLT_MATMUL_TILE_64x192: cublasLtMatmulTile_t = 116;
pub const CUBLASLT_MATMUL_TILE_64x320: cublasLtMatmulTile_t = 117;
pub const CUBLASLT_MATMUL_TILE_64x384: cublasLtMatmulTile_t = 118;
pub const CUBLASLT_MATMUL_TILE_64x448: cublasLtMatmulTile_t = 119;
pub const CUBLASLT_MATMUL_TILE_64x576: cublasLtMatmulTile_t = 120;
pub const CUBLASLT_MATMUL_TILE_64x640: cublasLtMatmulTile_t = 121;
pub const CUBLASLT_MATMUL_TILE_64x704: cublasLtMatmulTile_t = 122;
pub const CUBLASLT_MATMUL_TILE_64x768: cublasLtMatmulTile_t = 123;
pub const CUBLASLT_MATMUL_TILE_72x64: cublasLtMatmulTile_t = 124;
pub const CUBLASLT_MATMUL_TILE_72x128: cublasLtMatmulTile_t = 125;
pub const CUBLASLT_MATMUL_TILE_72x192: cublasLtMatmulTile_t = 126;
pub const CUBLASLT_MATMUL_TILE_72x256: cublasLtMatmulTile_t = 127;
pub const CUBLASLT_MATMUL_TILE_72x320: cublasLtMatmulTile_t = 128;
pub const CUBLASLT_MATMUL_TILE_72x384: cublasLtMatmulTile_t = 129;
pub const CUBLASLT_MATMUL_TILE_72x448: cublasLtMatmulTile_t = 130;
pub const CUBLASLT_MATMUL_TILE_72x512: cublasLtMatmulTile_t = 131;
pub const CUBLASLT_MATMUL_TILE_72x576: cublasLtMatmulTile_t = 132;
pub const CUBLASLT_MATMUL_TILE_72x640: cublasLtMatmulTile_t = 133;
pub const CUBLASLT_MATMUL_TILE_80x64: cublasLtMatmulTile_t = 134;
pub const CUBLASLT_MATMUL_TILE_80x128: cublasLtMatmulTile_t = 135;
pub const CUBLASLT_MATMUL_TILE_80x192: cublasLtMatmulTile_t = 136;
pub const CUBLASLT_MATMUL_TILE_80x256: cublasLtMatmulTile_t = 137;
pub const CUBLASLT_MATMUL_TILE_80x320: cublasLtMatmulTile_t = 138;
pub const CUBLASLT_MATMUL_TILE_80x384: cublasLtMatmulTile_t = 139;
pub const CUBLASLT_MATMUL_TILE_80x448: cublasLtMatmulTile_t = 140;
pub const CUBLASLT_MATMUL_TILE_80x512: cublasLtMatmulTile_t = 141;
pub const CUBLASLT_MATMUL_TILE_80x576: cublasLtMatmulTile_t = 142;
pub const CUBLASLT_MATMUL_TILE_88x64: cublasLtMatmulTile_t = 143;
pub const CUBLASLT_MATMUL_TILE_88x128: cublasLtMatmulTile_t = 144;
pub const CUBLASLT_MATMUL_TILE_88x192: cublasLtMatmulTile_t = 145;
pub const CUBLASLT_MATMUL_TILE_88x256: cublasLtMatmulTile_t = 146;
pub const CUBLASLT_MATMUL_TILE_88x320: cublasLtMatmulTile_t = 147;
pub const CUBLASLT_MATMUL_TILE_88x384: cublasLtMatmulTile_t = 148;
pub const CUBLASLT_MATMUL_TILE_88x448: cublasLtMatmulTile_t = 149;
pub const CUBLASLT_MATMUL_TILE_88x512: cublasLtMatmulTile_t = 150;
pub const CUBLASLT_MATMUL_TILE_96x192: cublasLtMatmulTile_t = 151;
pub const CUBLASLT_MATMUL_TILE_96x256: cublasLtMatmulTile_t = 152;
pub const CUBLASLT_MATMUL_TILE_96x320: cublasLtMatmulTile_t = 153;
pub const CUBLASLT_MATMUL_TILE_96x384: cublasLtMatmulTile_t = 154;
pub const CUBLASLT_MATMUL_TILE_96x448: cublasLtMatmulTile_t = 155;
pub const CUBLASLT_MATMUL_TILE_96x512: cublasLtMatmulTile_t = 156;
pub const CUBLASLT_MATMUL_TILE_104x64: cublasLtMatmulTile_t = 157;
pub const CUBLASLT_MATMUL_TILE_104x128: cublasLtMatmulTile_t = 158;
pub const CUBLASLT_MATMUL_TILE_104x192: cublasLtMatmulTile_t = 159;
pub const CUBLASLT_MATMUL_TILE_104x256: cublasLtMatmulTile_t = 160;
pub const CUBLASLT_MATMUL_TILE_104x320: cublasLtMatmulTile_t = 161;
pub const CUBLASLT_MATMUL_TILE_104x384: cublasLtMatmulTile_t = 162;
pub const CUBLASLT_MATMUL_TILE_104x448: cublasLtMatmulTile_t = 163;
pub const CUBLASLT_MATMUL_TILE_112x64: cublasLtMatmulTile_t = 164;
pub const CUBLASLT_MATMUL_TILE_112x128: cublasLtMatmulTile_t = 165;
pub const CUBLASLT_MATMUL_TILE_112x192: cublasLtMatmulTile_t = 166;
pub const CUBLASLT_MATMUL_TILE_112x256: cublasLtMatmulTile_t = 167;
pub const CUBLASLT_MATMUL_TILE_112x320: cublasLtMatmulTile_t = 168;
pub const CUBLASLT_MATMUL_TILE_112x384: cublasLtMatmulTile_t = 169;
pub const CUBLASLT_MATMUL_TILE_120x64: cublasLtMatmulTile_t = 170;
pub const CUBLASLT_MATMUL_TILE_120x128: cublasLtMatmulTile_t = 171;
pub const CUBLASLT_MATMUL_TILE_120x192: cublasLtMatmulTile_t = 172;
pub const CUBLASLT_MATMUL_TILE_120x256: cublasLtMatmulTile_t = 173;
pub const CUBLASLT_MATMUL_TILE_120x320: cublasLtMatmulTile_t = 174;
pub const CUBLASLT_MATMUL_TILE_120x384: cublasLtMatmulTile_t = 175;
pub const CUBLASLT_MATMUL_TILE_128x320: cublasLtMatmulTile_t = 176;
pub const CUBLASLT_MATMUL_TILE_128x384: cublasLtMatmulTile_t = 177;
pub const CUBLASLT_MATMUL_TILE_136x64: cublasLtMatmulTile_t = 178;
pub const CUBLASLT_MATMUL_TILE_136x128: cublasLtMatmulTile_t = 179;
pub const CUBLASLT_MATMUL_TILE_136x192: cublasLtMatmulTile_t = 180;
pub const CUBLASLT_MATMUL_TILE_136x256: cublasLtMatmulTile_t = 181;
pub const CUBLASLT_MATMUL_TILE_136x320: cublasLtMatmulTile_t = 182;
pub const CUBLASLT_MATMUL_TILE_144x64: cublasLtMatmulTile_t = 183;
pub const CUBLASLT_MATMUL_TILE_144x128: cublasLtMatmulTile_t = 184;
pub const CUBLASLT_MATMUL_TILE_144x192: cublasLtMatmulTile_t = 185;
pub const CUBLASLT_MATMUL_TILE_144x256: cublasLtMatmulTile_t = 186;
pub const CUBLASLT_MATMUL_TILE_144x320: cublasLtMatmulTile_t = 187;
pub const CUBLASLT_MATMUL_TILE_152x64: cublasLtMatmulTile_t = 188;
pub const CUBLASLT_MATMUL_TILE_152x128: cublasLtMatmulTile_t = 189;
pub const CUBLASLT_MATMUL_TILE_152x192: cublasLtMatmulTile_t = 190;
pub const CUBLASLT_MATMUL_TILE_152x256: cublasLtMatmulTile_t = 191;
pub const CUBLASLT_MATMUL_TILE_152x320: cublasLtMatmulTile_t = 192;
pub const CUBLASLT_MATMUL_TILE_160x64: cublasLtMatmulTile_t = 193;
pub const CUBLASLT_MATMUL_TILE_160x192: cublasLtMatmulTile_t = 194;
pub const CUBLASLT_MATMUL_TILE_160x256: cublasLtMatmulTile_t = 195;
pub const CUBLASLT_MATMUL_TILE_168x64: cublasLtMatmulTile_t = 196;
pub const CUBLASLT_MATMUL_TILE_168x128: cublasLtMatmulTile_t = 197;
pub const CUBLASLT_MATMUL_TILE_168x192: cublasLtMatmulTile_t = 198;
pub const CUBLASLT_MATMUL_TILE_168x256: cublasLtMatmulTile_t = 199;
pub const CUBLASLT_MATMUL_TILE_176x64: cublasLtMatmulTile_t = 200;
pub const CUBLASLT_MATMUL_TILE_176x128: cublasLtMatmulTile_t = 201;
pub const CUBLASLT_MATMUL_TILE_176x192: cublasLtMatmulTile_t = 202;
pub const CUBLASLT_MATMUL_TILE_176x256: cublasLtMatmulTile_t = 203;
pub const CUBLASLT_MATMUL_TILE_184x64: cublasLtMatmulTile_t = 204;
pub const CUBLASLT_MATMUL_TILE_184x128: cublasLtMatmulTile_t = 205;
pub const CUBLASLT_MATMUL_TILE_184x192: cublasLtMatmulTile_t = 206;
pub const CUBLASLT_MATMUL_TILE_184x256: cublasLtMatmulTile_t = 207;
pub const CUBLASLT_MATMUL_TILE_192x64: cublasLtMatmulTile_t = 208;
pub const CUBLASLT_MATMUL_TILE_192x192: cublasLtMatmulTile_t = 209;
pub const CUBLASLT_MATMUL_TILE_192x256: cublasLtMatmulTile_t = 210;
pub const CUBLASLT_MATMUL_TILE_200x64: cublasLtMatmulTile_t = 211;
pub const CUBLASLT_MATMUL_TILE_200x128: cublasLtMatmulTile_t = 212;
pub const CUBLASLT_MATMUL_TILE_200x192: cublasLtMatmulTile_t = 213;
pub const CUBLASLT_MATMUL_TILE_208x64: cublasLtMatmulTile_t = 214;
pub const CUBLASLT_MATMUL_TILE_208x128: cublasLtMatmulTile_t = 215;
pub const CUBLASLT_MATMUL_TILE_208x192: cublasLtMatmulTile_t = 216;
pub const CUBLASLT_MATMUL_TILE_216x64: cublasLtMatmulTile_t = 217;
pub const CUBLASLT_MATMUL_TILE_216x128: cublasLtMatmulTile_t = 218;
pub const CUBLASLT_MATMUL_TILE_216x192: cublasLtMatmulTile_t = 219;
pub const CUBLASLT_MATMUL_TILE_224x64: cublasLtMatmulTile_t = 220;
pub const CUBLASLT_MATMUL_TILE_224x128: cublasLtMatmulTile_t = 221;
pub const CUBLASLT_MATMUL_TILE_224x192: cublasLtMatmulTile_t = 222;
pub const CUBLASLT_MATMUL_TILE_232x64: cublasLtMatmulTile_t = 223;
pub const CUBLASLT_MATMUL_TILE_232x128: cublasLtMatmulTile_t = 224;
pub const CUBLASLT_MATMUL_TILE_232x192: cublasLtMatmulTile_t = 225;
pub const CUBLASLT_MATMUL_TILE_240x64: cublasLtMatmulTile_t = 226;
pub const CUBLASLT_MATMUL_TILE_240x128: cublasLtMatmulTile_t = 227;
pub const CUBLASLT_MATMUL_TILE_240x192: cublasLtMatmulTile_t = 228;
pub const CUBLASLT_MATMUL_TILE_248x64: cublasLtMatmulTile_t = 229;
pub const CUBLASLT_MATMUL_TILE_248x128: cublasLtMatmulTile_t = 230;
pub const CUBLASLT_MATMUL_TILE_248x192: cublasLtMatmulTile_t = 231;
pub const CUBLASLT_MATMUL_TILE_256x192: cublasLtMatmulTile_t = 232;
pub const CUBLASLT_MATMUL_TILE_264x64: cublasLtMatmulTile_t = 233;
pub const CUBLASLT_MATMUL_TILE_264x128: cublasLtMatmulTile_t = 234;
pub const CUBLASLT_MATMUL_TILE_272x64: cublasLtMatmulTile_t = 235;
pub const CUBLASLT_MATMUL_TILE_272x128: cublasLtMatmulTile_t = 236;
pub const CUBLASLT_MATMUL_TILE_280x64: cublasLtMatmulTile_t = 237;
pub const CUBLASLT_MATMUL_TILE_280x128: cublasLtMatmulTile_t = 238;
pub const CUBLASLT_MATMUL_TILE_288x64: cublasLtMatmulTile_t = 239;
pub const CUBLASLT_MATMUL_TILE_288x128: cublasLtMatmulTile_t = 240;
pub const CUBLASLT_MATMUL_TILE_296x64: cublasLtMatmulTile_t = 241;
pub const CUBLASLT_MATMUL_TILE_296x128: cublasLtMatmulTile_t = 242;
pub const CUBLASLT_MATMUL_TILE_304x64: cublasLtMatmulTile_t = 243;
pub const CUBLASLT_MATMUL_TILE_304x128: cublasLtMatmulTile_t = 244;
pub const CUBLASLT_MATMUL_TILE_312x64: cublasLtMatmulTile_t = 245;
pub const CUBLASLT_MATMUL_TILE_312x128: cublasLtMatmulTile_t = 246;
pub const CUBLASLT_MATMUL_TILE_320x64: cublasLtMatmulTile_t = 247;
pub const CUBLASLT_MATMUL_TILE_320x128: cublasLtMatmulTile_t = 248;
pub const CUBLASLT_MATMUL_TILE_328x64: cublasLtMatmulTile_t = 249;
pub const CUBLASLT_MATMUL_TILE_328x128: cublasLtMatmulTile_t = 250;
pub const CUBLASLT_MATMUL_TILE_336x64: cublasLtMatmulTile_t = 251;
pub const CUBLASLT_MATMUL_TILE_336x128: cublasLtMatmulTile_t = 252;
pub const CUBLASLT_MATMUL_TILE_344x64: cublasLtMatmulTile_t = 253;
pub const CUBLASLT_MATMUL_TILE_344x128: cublasLtMatmulTile_t = 254;
pub const CUBLASLT_MATMUL_TILE_352x64: cublasLtMatmulTile_t = 255;
pub const CUBLASLT_MATMUL_TILE_352x128: cublasLtMatmulTile_t = 256;
pub const CUBLASLT_MATMUL_TILE_360x64: cublasLtMatmulTile_t = 257;
pub const CUBLASLT_MATMUL_TILE_360x128: cublasLtMatmulTile_t = 258;
pub const CUBLASLT_MATMUL_TILE_368x64: cublasLtMatmulTile_t = 259;
pub const CUBLASLT_MATMUL_TILE_368x128: cublasLtMatmulTile_t = 260;
pub const CUBLASLT_MATMUL_TILE_376x64: cublasLtMatmulTile_t = 261;
pub const CUBLASLT_MATMUL_TILE_376x128: cublasLtMatmulTile_t = 262;
pub const CUBLASLT_MATMUL_TILE_384x64: cublasLtMatmulTile_t = 263;
pub const CUBLASLT_MATMUL_TILE_384x128: cublasLtMatmulTile_t = 264;
pub const CUBLASLT_MATMUL_TILE_392x64: cublasLtMatmulTile_t = 265;
pub const CUBLASLT_MATMUL_TILE_400x64: cublasLtMatmulTile_t = 266;
pub const CUBLASLT_MATMUL_TILE_408x64: cublasLtMatmulTile_t = 267;
pub const CUBLASLT_MATMUL_TILE_416x64: cublasLtMatmulTile_t = 268;
pub const CUBLASLT_MATMUL_TILE_424x64: cublasLtMatmulTile_t = 269;
pub const CUBLASLT_MATMUL_TILE_432x64: cublasLtMatmulTile_t = 270;
pub const CUBLASLT_MATMUL_TILE_440x64: cublasLtMatmulTile_t = 271;
pub const CUBLASLT_MATMUL_TILE_448x64: cublasLtMatmulTile_t = 272;
pub const CUBLASLT_MATMUL_TILE_456x64: cublasLtMatmulTile_t = 273;
pub const CUBLASLT_MATMUL_TILE_464x64: cublasLtMatmulTile_t = 274;
pub const CUBLASLT_MATMUL_TILE_472x64: cublasLtMatmulTile_t = 275;
pub const CUBLASLT_MATMUL_TILE_480x64: cublasLtMatmulTile_t = 276;
pub const CUBLASLT_MATMUL_TILE_488x64: cublasLtMatmulTile_t = 277;
pub const CUBLASLT_MATMUL_TILE_496x64: cublasLtMatmulTile_t = 278;
pub const CUBLASLT_MATMUL_TILE_504x64: cublasLtMatmulTile_t = 279;
pub const CUBLASLT_MATMUL_TILE_520x64: cublasLtMatmulTile_t = 280;
pub const CUBLASLT_MATMUL_TILE_528x64: cublasLtMatmulTile_t = 281;
pub const CUBLASLT_MATMUL_TILE_536x64: cublasLtMatmulTile_t = 282;
pub const CUBLASLT_MATMUL_TILE_544x64: cublasLtMatmulTile_t = 283;
pub const CUBLASLT_MATMUL_TILE_552x64: cublasLtMatmulTile_t = 284;
pub const CUBLASLT_MATMUL_TILE_560x64: cublasLtMatmulTile_t = 285;
pub const CUBLASLT_MATMUL_TILE_568x64: cublasLtMatmulTile_t = 286;
pub const CUBLASLT_MATMUL_TILE_576x64: cublasLtMatmulTile_t = 287;
pub const CUBLASLT_MATMUL_TILE_584x64: cublasLtMatmulTile_t = 288;
pub const CUBLASLT_MATMUL_TILE_592x64: cublasLtMatmulTile_t = 289;
pub const CUBLASLT_MATMUL_TILE_600x64: cublasLtMatmulTile_t = 290;
pub const CUBLASLT_MATMUL_TILE_608x64: cublasLtMatmulTile_t = 291;
pub const CUBLASLT_MATMUL_TILE_616x64: cublasLtMatmulTile_t = 292;
pub const CUBLASLT_MATMUL_TILE_624x64: cublasLtMatmulTile_t = 293;
pub const CUBLASLT_MATMUL_TILE_632x64: cublasLtMatmulTile_t = 294;
pub const CUBLASLT_MATMUL_TILE_640x64: cublasLtMatmulTile_t = 295;
pub const CUBLASLT_MATMUL_TILE_648x64: cublasLtMatmulTile_t = 296;
pub const CUBLASLT_MATMUL_TILE_656x64: cublasLtMatmulTile_t = 297;
pub const CUBLASLT_MATMUL_TILE_664x64: cublasLtMatmulTile_t = 298;
pub const CUBLASLT_MATMUL_TILE_672x64: cublasLtMatmulTile_t = 299;
pub const CUBLASLT_MATMUL_TILE_680x64: cublasLtMatmulTile_t = 300;
pub const CUBLASLT_MATMUL_TILE_688x64: cublasLtMatmulTile_t = 301;
pub const CUBLASLT_MATMUL_TILE_696x64: cublasLtMatmulTile_t = 302;
pub const CUBLASLT_MATMUL_TILE_704x64: cublasLtMatmulTile_t = 303;
pub const CUBLASLT_MATMUL_TILE_712x64: cublasLtMatmulTile_t = 304;
pub const CUBLASLT_MATMUL_TILE_720x64: cublasLtMatmulTile_t = 305;
pub const CUBLASLT_MATMUL_TILE_728x64: cublasLtMatmulTile_t = 306;
pub const CUBLASLT_MATMUL_TILE_736x64: cublasLtMatmulTile_t = 307;
pub const CUBLASLT_MATMUL_TILE_744x64: cublasLtMatmulTile_t = 308;
pub const CUBLASLT_MATMUL_TILE_752x64: cublasLtMatmulTile_t = 309;
pub const CUBLASLT_MATMUL_TILE_760x64: cublasLtMatmulTile_t = 310;
pub const CUBLASLT_MATMUL_TILE_768x64: cublasLtMatmulTile_t = 311;
pub const CUBLASLT_MATMUL_TILE_64x16: cublasLtMatmulTile_t = 312;
pub const CUBLASLT_MATMUL_TILE_64x24: cublasLtMatmulTile_t = 313;
pub const CUBLASLT_MATMUL_TILE_64x40: cublasLtMatmulTile_t = 314;
pub const CUBLASLT_MATMUL_TILE_64x48: cublasLtMatmulTile_t = 315;
pub const CUBLASLT_MATMUL_TILE_64x56: cublasLtMatmulTile_t = 316;
pub const CUBLASLT_MATMUL_TILE_64x72: cublasLtMatmulTile_t = 317;
pub const CUBLASLT_MATMUL_TILE_64x80: cublasLtMatmulTile_t = 318;
pub const CUBLASLT_MATMUL_TILE_64x88: cublasLtMatmulTile_t = 319;
pub const CUBLASLT_MATMUL_TILE_64x104: cublasLtMatmulTile_t = 320;
pub const CUBLASLT_MATMUL_TILE_64x112: cublasLtMatmulTile_t = 321;
pub const CUBLASLT_MATMUL_TILE_64x120: cublasLtMatmulTile_t = 322;
pub const CUBLASLT_MATMUL_TILE_64x136: cublasLtMatmulTile_t = 323;
pub const CUBLASLT_MATMUL_TILE_64x144: cublasLtMatmulTile_t = 324;
pub const CUBLASLT_MATMUL_TILE_64x152: cublasLtMatmulTile_t = 325;
pub const CUBLASLT_MATMUL_TILE_64x160: cublasLtMatmulTile_t = 326;
pub const CUBLASLT_MATMUL_TILE_64x168: cublasLtMatmulTile_t = 327;
pub const CUBLASLT_MATMUL_TILE_64x176: cublasLtMatmulTile_t = 328;
pub const CUBLASLT_MATMUL_TILE_64x184: cublasLtMatmulTile_t = 329;
pub const CUBLASLT_MATMUL_TILE_64x200: cublasLtMatmulTile_t = 330;
pub const CUBLASLT_MATMUL_TILE_64x208: cublasLtMatmulTile_t = 331;
pub const CUBLASLT_MATMUL_TILE_64x216: cublasLtMatmulTile_t = 332;
pub const CUBLASLT_MATMUL_TILE_64x224: cublasLtMatmulTile_t = 333;
pub const CUBLASLT_MATMUL_TILE_64x232: cublasLtMatmulTile_t = 334;
pub const CUBLASLT_MATMUL_TILE_64x240: cublasLtMatmulTile_t = 335;
pub const CUBLASLT_MATMUL_TILE_64x248: cublasLtMatmulTile_t = 336;
pub const CUBLASLT_MATMUL_TILE_64x264: cublasLtMatmulTile_t = 337;
pub const CUBLASLT_MATMUL_TILE_64x272: cublasLtMatmulTile_t = 338;
pub const CUBLASLT_MATMUL_TILE_64x280: cublasLtMatmulTile_t = 339;
pub const CUBLASLT_MATMUL_TILE_64x288: cublasLtMatmulTile_t = 340;
pub const CUBLASLT_MATMUL_TILE_64x296: cublasLtMatmulTile_t = 341;
pub const CUBLASLT_MATMUL_TILE_64x304: cublasLtMatmulTile_t = 342;
pub const CUBLASLT_MATMUL_TILE_64x312: cublasLtMatmulTile_t = 343;
pub const CUBLASLT_MATMUL_TILE_64x328: cublasLtMatmulTile_t = 344;
pub const CUBLASLT_MATMUL_TILE_64x336: cublasLtMatmulTile_t = 345;
pub const CUBLASLT_MATMUL_TILE_64x344: cublasLtMatmulTile_t = 346;
pub const CUBLASLT_MATMUL_TILE_64x352: cublasLtMatmulTile_t = 347;
pub const CUBLASLT_MATMUL_TILE_64x360: cublasLtMatmulTile_t = 348;
pub const CUBLASLT_MATMUL_TILE_64x368: cublasLtMatmulTile_t = 349;
pub const CUBLASLT_MATMUL_TILE_64x376: cublasLtMatmulTile_t = 350;
pub const CUBLASLT_MATMUL_TILE_64x392: cublasLtMatmulTile_t = 351;
pub const CUBLASLT_MATMUL_TILE_64x400: cublasLtMatmulTile_t = 352;
pub const CUBLASLT_MATMUL_TILE_64x408: cublasLtMatmulTile_t = 353;
pub const CUBLASLT_MATMUL_TILE_64x416: cublasLtMatmulTile_t = 354;
pub const CUBLASLT_MATMUL_TILE_64x424: cublasLtMatmulTile_t = 355;
pub const CUBLASLT_MATMUL_TILE_64x432: cublasLtMatmulTile_t = 356;
pub const CUBLASLT_MATMUL_TILE_64x440: cublasLtMatmulTile_t = 357;
pub const CUBLASLT_MATMUL_TILE_64x456: cublasLtMatmulTile_t = 358;
pub const CUBLASLT_MATMUL_TILE_64x464: cublasLtMatmulTile_t = 359;
pub const CUBLASLT_MATMUL_TILE_64x472: cublasLtMatmulTile_t = 360;
pub const CUBLASLT_MATMUL_TILE_64x480: cublasLtMatmulTile_t = 361;
pub const CUBLASLT_MATMUL_TILE_64x488: cublasLtMatmulTile_t = 362;
pub const CUBLASLT_MATMUL_TILE_64x496: cublasLtMatmulTile_t = 363;
pub const CUBLASLT_MATMUL_TILE_64x504: cublasLtMatmulTile_t = 364;
pub const CUBLASLT_MATMUL_TILE_64x520: cublasLtMatmulTile_t = 365;
pub const CUBLASLT_MATMUL_TILE_64x528: cublasLtMatmulTile_t = 366;
pub const CUBLASLT_MATMUL_TILE_64x536: cublasLtMatmulTile_t = 367;
pub const CUBLASLT_MATMUL_TILE_64x544: cublasLtMatmulTile_t = 368;
pub const CUBLASLT_MATMUL_TILE_64x552: cublasLtMatmulTile_t = 369;
pub const CUBLASLT_MATMUL_TILE_64x560: cublasLtMatmulTile_t = 370;
pub const CUBLASLT_MATMUL_TILE_64x568: cublasLtMatmulTile_t = 371;
pub const CUBLASLT_MATMUL_TILE_64x584: cublasLtMatmulTile_t = 372;
pub const CUBLASLT_MATMUL_TILE_64x592: cublasLtMatmulTile_t = 373;
pub const CUBLASLT_MATMUL_TILE_64x600: cublasLtMatmulTile_t = 374;
pub const CUBLASLT_MATMUL_TILE_64x608: cublasLtMatmulTile_t = 375;
pub const CUBLASLT_MATMUL_TILE_64x616: cublasLtMatmulTile_t = 376;
pub const CUBLASLT_MATMUL_TILE_64x624: cublasLtMatmulTile_t = 377;
pub const CUBLASLT_MATMUL_TILE_64x632: cublasLtMatmulTile_t = 378;
pub const CUBLASLT_MATMUL_TILE_64x648: cublasLtMatmulTile_t = 379;
pub const CUBLASLT_MATMUL_TILE_64x656: cublasLtMatmulTile_t = 380;
pub const CUBLASLT_MATMUL_TILE_64x664: cublasLtMatmulTile_t = 381;
pub const CUBLASLT_MATMUL_TILE_64x672: cublasLtMatmulTile_t = 382;
pub const CUBLASLT_MATMUL_TILE_64x680: cublasLtMatmulTile_t = 383;
pub const CUBLASLT_MATMUL_TILE_64x688: cublasLtMatmulTile_t = 384;
pub const CUBLASLT_MATMUL_TILE_64x696: cublasLtMatmulTile_t = 385;
pub const CUBLASLT_MATMUL_TILE_64x712: cublasLtMatmulTile_t = 386;
pub const CUBLASLT_MATMUL_TILE_64x720: cublasLtMatmulTile_t = 387;
pub const CUBLASLT_MATMUL_TILE_64x728: cublasLtMatmulTile_t = 388;
pub const CUBLASLT_MATMUL_TILE_64x736: cublasLtMatmulTile_t = 389;
pub const CUBLASLT_MATMUL_TILE_64x744: cublasLtMatmulTile_t = 390;
pub const CUBLASLT_MATMUL_TILE_64x752: cublasLtMatmulTile_t = 391;
pub const CUBLASLT_MATMUL_TILE_64x760: cublasLtMatmulTile_t = 392;
pub const CUBLASLT_MATMUL_TILE_128x8: cublasLtMatmulTile_t = 393;
pub const CUBLASLT_MATMUL_TILE_128x16: cublasLtMatmulTile_t = 394;
pub const CUBLASLT_MATMUL_TILE_128x24: cublasLtMatmulTile_t = 395;
pub const CUBLASLT_MATMUL_TILE_128x40: cublasLtMatmulTile_t = 396;
pub const CUBLASLT_MATMUL_TILE_128x48: cublasLtMatmulTile_t = 397;
pub const CUBLASLT_MATMUL_TILE_128x56: cublasLtMatmulTile_t = 398;
pub const CUBLASLT_MATMUL_TILE_128x72: cublasLtMatmulTile_t = 399;
pub const CUBLASLT_MATMUL_TILE_128x80: cublasLtMatmulTile_t = 400;
pub const CUBLASLT_MATMUL_TILE_128x88: cublasLtMatmulTile_t = 401;
pub const CUBLASLT_MATMUL_TILE_128x104: cublasLtMatmulTile_t = 402;
pub const CUBLASLT_MATMUL_TILE_128x112: cublasLtMatmulTile_t = 403;
pub const CUBLASLT_MATMUL_TILE_128x120: cublasLtMatmulTile_t = 404;
pub const CUBLASLT_MATMUL_TILE_128x136: cublasLtMatmulTile_t = 405;
pub const CUBLASLT_MATMUL_TILE_128x144: cublasLtMatmulTile_t = 406;
pub const CUBLASLT_MATMUL_TILE_128x152: cublasLtMatmulTile_t = 407;
pub const CUBLASLT_MATMUL_TILE_128x168: cublasLtMatmulTile_t = 408;
pub const CUBLASLT_MATMUL_TILE_128x176: cublasLtMatmulTile_t = 409;
pub const CUBLASLT_MATMUL_TILE_128x184: cublasLtMatmulTile_t = 410;
pub const CUBLASLT_MATMUL_TILE_128x200: cublasLtMatmulTile_t = 411;
pub const CUBLASLT_MATMUL_TILE_128x208: cublasLtMatmulTile_t = 412;
pub const CUBLASLT_MATMUL_TILE_128x216: cublasLtMatmulTile_t = 413;
pub const CUBLASLT_MATMUL_TILE_128x224: cublasLtMatmulTile_t = 414;
pub const CUBLASLT_MATMUL_TILE_128x232: cublasLtMatmulTile_t = 415;
pub const CUBLASLT_MATMUL_TILE_128x240: cublasLtMatmulTile_t = 416;
pub const CUBLASLT_MATMUL_TILE_128x248: cublasLtMatmulTile_t = 417;
pub const CUBLASLT_MATMUL_TILE_128x264: cublasLtMatmulTile_t = 418;
pub const CUBLASLT_MATMUL_TILE_128x272: cublasLtMatmulTile_t = 419;
pub const CUBLASLT_MATMUL_TILE_128x280: cublasLtMatmulTile_t = 420;
pub const CUBLASLT_MATMUL_TILE_128x288: cublasLtMatmulTile_t = 421;
pub const CUBLASLT_MATMUL_TILE_128x296: cublasLtMatmulTile_t = 422;
pub const CUBLASLT_MATMUL_TILE_128x304: cublasLtMatmulTile_t = 423;
pub const CUBLASLT_MATMUL_TILE_128x312: cublasLtMatmulTile_t = 424;
pub const CUBLASLT_MATMUL_TILE_128x328: cublasLtMatmulTile_t = 425;
pub const CUBLASLT_MATMUL_TILE_128x336: cublasLtMatmulTile_t = 426;
pub const CUBLASLT_MATMUL_TILE_128x344: cublasLtMatmulTile_t = 427;
pub const CUBLASLT_MATMUL_TILE_128x352: cublasLtMatmulTile_t = 428;
pub const CUBLASLT_MATMUL_TILE_128x360: cublasLtMatmulTile_t = 429;
pub const CUBLASLT_MATMUL_TILE_128x368: cublasLtMatmulTile_t = 430;
pub const CUBLASLT_MATMUL_TILE_128x376: cublasLtMatmulTile_t = 431;
pub const CUBLASLT_MATMUL_TILE_128x392: cublasLtMatmulTile_t = 432;
pub const CUBLASLT_MATMUL_TILE_128x400: cublasLtMatmulTile_t = 433;
pub const CUBLASLT_MATMUL_TILE_128x408: cublasLtMatmulTile_t = 434;
pub const CUBLASLT_MATMUL_TILE_128x416: cublasLtMatmulTile_t = 435;
pub const CUBLASLT_MATMUL_TILE_128x424: cublasLtMatmulTile_t = 436;
pub const CUBLASLT_MATMUL_TILE_128x432: cublasLtMatmulTile_t = 437;
pub const CUBLASLT_MATMUL_TILE_128x440: cublasLtMatmulTile_t = 438;
pub const CUBLASLT_MATMUL_TILE_128x448: cublasLtMatmulTile_t = 439;
pub const CUBLASLT_MATMUL_TILE_128x456: cublasLtMatmulTile_t = 440;
pub const CUBLASLT_MATMUL_TILE_128x464: cublasLtMatmulTile_t = 441;
pub const CUBLASLT_MATMUL_TILE_128x472: cublasLtMatmulTile_t = 442;
pub const CUBLASLT_MATMUL_TILE_128x480: cublasLtMatmulTile_t = 443;
pub const CUBLASLT_MATMUL_TILE_128x488: cublasLtMatmulTile_t = 444;
pub const CUBLASLT_MATMUL_TILE_128x496: cublasLtMatmulTile_t = 445;
pub const CUBLASLT_MATMUL_TILE_128x504: cublasLtMatmulTile_t = 446;
pub const CUBLASLT_MATMUL_TILE_128x512: cublasLtMatmulTile_t = 447;
pub const CUBLASLT_MATMUL_TILE_192x8: cublasLtMatmulTile_t = 448;
pub const CUBLASLT_MATMUL_TILE_192x16: cublasLtMatmulTile_t = 449;
pub const CUBLASLT_MATMUL_TILE_192x24: cublasLtMatmulTile_t = 450;
pub const CUBLASLT_MATMUL_TILE_192x32: cublasLtMatmulTile_t = 451;
pub const CUBLASLT_MATMUL_TILE_192x40: cublasLtMatmulTile_t = 452;
pub const CUBLASLT_MATMUL_TILE_192x48: cublasLtMatmulTile_t = 453;
pub const CUBLASLT_MATMUL_TILE_192x56: cublasLtMatmulTile_t = 454;
pub const CUBLASLT_MATMUL_TILE_192x72: cublasLtMatmulTile_t = 455;
pub const CUBLASLT_MATMUL_TILE_192x80: cublasLtMatmulTile_t = 456;
pub const CUBLASLT_MATMUL_TILE_192x88: cublasLtMatmulTile_t = 457;
pub const CUBLASLT_MATMUL_TILE_192x96: cublasLtMatmulTile_t = 458;
pub const CUBLASLT_MATMUL_TILE_192x104: cublasLtMatmulTile_t = 459;
pub const CUBLASLT_MATMUL_TILE_192x112: cublasLtMatmulTile_t = 460;
pub const CUBLASLT_MATMUL_TILE_192x120: cublasLtMatmulTile_t = 461;
pub const CUBLASLT_MATMUL_TILE_192x136: cublasLtMatmulTile_t = 462;
pub const CUBLASLT_MATMUL_TILE_192x144: cublasLtMatmulTile_t = 463;
pub const CUBLASLT_MATMUL_TILE_192x152: cublasLtMatmulTile_t = 464;
pub const CUBLASLT_MATMUL_TILE_192x160: cublasLtMatmulTile_t = 465;
pub const CUBLASLT_MATMUL_TILE_192x168: cublasLtMatmulTile_t = 466;
pub const CUBLASLT_MATMUL_TILE_192x176: cublasLtMatmulTile_t = 467;
pub const CUBLASLT_MATMUL_TILE_192x184: cublasLtMatmulTile_t = 468;
pub const CUBLASLT_MATMUL_TILE_192x200: cublasLtMatmulTile_t = 469;
pub const CUBLASLT_MATMUL_TILE_192x208: cublasLtMatmulTile_t = 470;
pub const CUBLASLT_MATMUL_TILE_192x216: cublasLtMatmulTile_t = 471;
pub const CUBLASLT_MATMUL_TILE_192x224: cublasLtMatmulTile_t = 472;
pub const CUBLASLT_MATMUL_TILE_192x232: cublasLtMatmulTile_t = 473;
pub const CUBLASLT_MATMUL_TILE_192x240: cublasLtMatmulTile_t = 474;
pub const CUBLASLT_MATMUL_TILE_192x248: cublasLtMatmulTile_t = 475;
pub const CUBLASLT_MATMUL_TILE_192x264: cublasLtMatmulTile_t = 476;
pub const CUBLASLT_MATMUL_TILE_192x272: cublasLtMatmulTile_t = 477;
pub const CUBLASLT_MATMUL_TILE_192x280: cublasLtMatmulTile_t = 478;
pub const CUBLASLT_MATMUL_TILE_192x288: cublasLtMatmulTile_t = 479;
pub const CUBLASLT_MATMUL_TILE_192x296: cublasLtMatmulTile_t = 480;
pub const CUBLASLT_MATMUL_TILE_192x304: cublasLtMatmulTile_t = 481;
pub const CUBLASLT_MATMUL_TILE_192x312: cublasLtMatmulTile_t = 482;
pub const CUBLASLT_MATMUL_TILE_192x320: cublasLtMatmulTile_t = 483;
pub const CUBLASLT_MATMUL_TILE_192x328: cublasLtMatmulTile_t = 484;
pub const CUBLASLT_MATMUL_TILE_192x336: cublasLtMatmulTile_t = 485;
pub const CUBLASLT_MATMUL_TILE_256x8: cublasLtMatmulTile_t = 486;
pub const CUBLASLT_MATMUL_TILE_256x16: cublasLtMatmulTile_t = 487;
pub const CUBLASLT_MATMUL_TILE_256x24: cublasLtMatmulTile_t = 488;
pub const CUBLASLT_MATMUL_TILE_256x40: cublasLtMatmulTile_t = 489;
pub const CUBLASLT_MATMUL_TILE_256x48: cublasLtMatmulTile_t = 490;
pub const CUBLASLT_MATMUL_TILE_256x56: cublasLtMatmulTile_t = 491;
pub const CUBLASLT_MATMUL_TILE_256x72: cublasLtMatmulTile_t = 492;
pub const CUBLASLT_MATMUL_TILE_256x80: cublasLtMatmulTile_t = 493;
pub const CUBLASLT_MATMUL_TILE_256x88: cublasLtMatmulTile_t = 494;
pub const CUBLASLT_MATMUL_TILE_256x96: cublasLtMatmulTile_t = 495;
pub const CUBLASLT_MATMUL_TILE_256x104: cublasLtMatmulTile_t = 496;
pub const CUBLASLT_MATMUL_TILE_256x112: cublasLtMatmulTile_t = 497;
pub const CUBLASLT_MATMUL_TILE_256x120: cublasLtMatmulTile_t = 498;
pub const CUBLASLT_MATMUL_TILE_256x136: cublasLtMatmulTile_t = 499;
pub const CUBLASLT_MATMUL_TILE_256x144: cublasLtMatmulTile_t = 500;
pub const CUBLASLT_MATMUL_TILE_256x152: cublasLtMatmulTile_t = 501;
pub const CUBLASLT_MATMUL_TILE_256x160: cublasLtMatmulTile_t = 502;
pub const CUBLASLT_MATMUL_TILE_256x168: cublasLtMatmulTile_t = 503;
pub const CUBLASLT_MATMUL_TILE_256x176: cublasLtMatmulTile_t = 504;
pub const CUBLASLT_MATMUL_TILE_256x184: cublasLtMatmulTile_t = 505;
pub const CUBLASLT_MATMUL_TILE_256x200: cublasLtMatmulTile_t = 506;
pub const CUBLASLT_MATMUL_TILE_256x208: cublasLtMatmulTile_t = 507;
pub const CUBLASLT_MATMUL_TILE_256x216: cublasLtMatmulTile_t = 508;
pub const CUBLASLT_MATMUL_TILE_256x224: cublasLtMatmulTile_t = 509;
pub const CUBLASLT_MATMUL_TILE_256x232: cublasLtMatmulTile_t = 510;
pub const CUBLASLT_MATMUL_TILE_256x240: cublasLtMatmulTile_t = 511;
pub const CUBLASLT_MATMUL_TILE_256x248: cublasLtMatmulTile_t = 512;
pub const CUBLASLT_MATMUL_TILE_256x256: cublasLtMatmulTile_t = 513;
pub const CUBLASLT_MATMUL_TILE_320x8: cublasLtMatmulTile_t = 514;
pub const CUBLASLT_MATMUL_TILE_320x16: cublasLtMatmulTile_t = 515;
pub const CUBLASLT_MATMUL_TILE_320x24: cublasLtMatmulTile_t = 516;
pub const CUBLASLT_MATMUL_TILE_320x32: cublasLtMatmulTile_t = 517;
pub const CUBLASLT_MATMUL_TILE_320x40: cublasLtMatmulTile_t = 518;
pub const CUBLASLT_MATMUL_TILE_320x48: cublasLtMatmulTile_t = 519;
pub const CUBLASLT_MATMUL_TILE_320x56: cublasLtMatmulTile_t = 520;
pub const CUBLASLT_MATMUL_TILE_320x72: cublasLtMatmulTile_t = 521;
pub const CUBLASLT_MATMUL_TILE_320x80: cublasLtMatmulTile_t = 522;
pub const CUBLASLT_MATMUL_TILE_320x88: cublasLtMatmulTile_t = 523;
pub const CUBLASLT_MATMUL_TILE_320x96: cublasLtMatmulTile_t = 524;
pub const CUBLASLT_MATMUL_TILE_320x104: cublasLtMatmulTile_t = 525;
pub const CUBLASLT_MATMUL_TILE_320x112: cublasLtMatmulTile_t = 526;
pub const CUBLASLT_MATMUL_TILE_320x120: cublasLtMatmulTile_t = 527;
pub const CUBLASLT_MATMUL_TILE_320x136: cublasLtMatmulTile_t = 528;
pub const CUBLASLT_MATMUL_TILE_320x144: cublasLtMatmulTile_t = 529;
pub const CUBLASLT_MATMUL_TILE_320x152: cublasLtMatmulTile_t = 530;
pub const CUBLASLT_MATMUL_TILE_320x160: cublasLtMatmulTile_t = 531;
pub const CUBLASLT_MATMUL_TILE_320x168: cublasLtMatmulTile_t = 532;
pub const CUBLASLT_MATMUL_TILE_320x176: cublasLtMatmulTile_t = 533;
pub const CUBLASLT_MATMUL_TILE_320x184: cublasLtMatmulTile_t = 534;
pub const CUBLASLT_MATMUL_TILE_320x192: cublasLtMatmulTile_t = 535;
pub const CUBLASLT_MATMUL_TILE_320x200: cublasLtMatmulTile_t = 536;
pub const CUBLASLT_MATMUL_TILE_384x8: cublasLtMatmulTile_t = 537;
pub const CUBLASLT_MATMUL_TILE_384x16: cublasLtMatmulTile_t = 538;
pub const CUBLASLT_MATMUL_TILE_384x24: cublasLtMatmulTile_t = 539;
pub const CUBLASLT_MATMUL_TILE_384x32: cublasLtMatmulTile_t = 540;
pub const CUBLASLT_MATMUL_TILE_384x40: cublasLtMatmulTile_t = 541;
pub const CUBLASLT_MATMUL_TILE_384x48: cublasLtMatmulTile_t = 542;
pub const CUBLASLT_MATMUL_TILE_384x56: cublasLtMatmulTile_t = 543;
pub const CUBLASLT_MATMUL_TILE_384x72: cublasLtMatmulTile_t = 544;
pub const CUBLASLT_MATMUL_TILE_384x80: cublasLtMatmulTile_t = 545;
pub const CUBLASLT_MATMUL_TILE_384x88: cublasLtMatmulTile_t = 546;
pub const CUBLASLT_MATMUL_TILE_384x96: cublasLtMatmulTile_t = 547;
pub const CUBLASLT_MATMUL_TILE_384x104: cublasLtMatmulTile_t = 548;
pub const CUBLASLT_MATMUL_TILE_384x112: cublasLtMatmulTile_t = 549;
pub const CUBLASLT_MATMUL_TILE_384x120: cublasLtMatmulTile_t = 550;
pub const CUBLASLT_MATMUL_TILE_384x136: cublasLtMatmulTile_t = 551;
pub const CUBLASLT_MATMUL_TILE_384x144: cublasLtMatmulTile_t = 552;
pub const CUBLASLT_MATMUL_TILE_384x152: cublasLtMatmulTile_t = 553;
pub const CUBLASLT_MATMUL_TILE_384x160: cublasLtMatmulTile_t = 554;
pub const CUBLASLT_MATMUL_TILE_384x168: cublasLtMatmulTile_t = 555;
pub const CUBLASLT_MATMUL_TILE_448x8: cublasLtMatmulTile_t = 556;
pub const CUBLASLT_MATMUL_TILE_448x16: cublasLtMatmulTile_t = 557;
pub const CUBLASLT_MATMUL_TILE_448x24: cublasLtMatmulTile_t = 558;
pub const CUBLASLT_MATMUL_TILE_448x32: cublasLtMatmulTile_t = 559;
pub const CUBLASLT_MATMUL_TILE_448x40: cublasLtMatmulTile_t = 560;
pub const CUBLASLT_MATMUL_TILE_448x48: cublasLtMatmulTile_t = 561;
pub const CUBLASLT_MATMUL_TILE_448x56: cublasLtMatmulTile_t = 562;
pub const CUBLASLT_MATMUL_TILE_448x72: cublasLtMatmulTile_t = 563;
pub const CUBLASLT_MATMUL_TILE_448x80: cublasLtMatmulTile_t = 564;
pub const CUBLASLT_MATMUL_TILE_448x88: cublasLtMatmulTile_t = 565;
pub const CUBLASLT_MATMUL_TILE_448x96: cublasLtMatmulTile_t = 566;
pub const CUBLASLT_MATMUL_TILE_448x104: cublasLtMatmulTile_t = 567;
pub const CUBLASLT_MATMUL_TILE_448x112: cublasLtMatmulTile_t = 568;
pub const CUBLASLT_MATMUL_TILE_448x120: cublasLtMatmulTile_t = 569;
pub const CUBLASLT_MATMUL_TILE_448x128: cublasLtMatmulTile_t = 570;
pub const CUBLASLT_MATMUL_TILE_448x136: cublasLtMatmulTile_t = 571;
pub const CUBLASLT_MATMUL_TILE_448x144: cublasLtMatmulTile_t = 572;
pub const CUBLASLT_MATMUL_TILE_512x8: cublasLtMatmulTile_t = 573;
pub const CUBLASLT_MATMUL_TILE_512x16: cublasLtMatmulTile_t = 574;
pub const CUBLASLT_MATMUL_TILE_512x24: cublasLtMatmulTile_t = 575;
pub const CUBLASLT_MATMUL_TILE_512x32: cublasLtMatmulTile_t = 576;
pub const CUBLASLT_MATMUL_TILE_512x40: cublasLtMatmulTile_t = 577;
pub const CUBLASLT_MATMUL_TILE_512x48: cublasLtMatmulTile_t = 578;
pub const CUBLASLT_MATMUL_TILE_512x56: cublasLtMatmulTile_t = 579;
pub const CUBLASLT_MATMUL_TILE_512x72: cublasLtMatmulTile_t = 580;
pub const CUBLASLT_MATMUL_TILE_512x80: cublasLtMatmulTile_t = 581;
pub const CUBLASLT_MATMUL_TILE_512x88: cublasLtMatmulTile_t = 582;
pub const CUBLASLT_MATMUL_TILE_512x96: cublasLtMatmulTile_t = 583;
pub const CUBLASLT_MATMUL_TILE_512x104: cublasLtMatmulTile_t = 584;
pub const CUBLASLT_MATMUL_TILE_512x112: cublasLtMatmulTile_t = 585;
pub const CUBLASLT_MATMUL_TILE_512x120: cublasLtMatmulTile_t = 586;
pub const CUBLASLT_MATMUL_TILE_512x128: cublasLtMatmulTile_t = 587;
pub const CUBLASLT_MATMUL_TILE_576x8: cublasLtMatmulTile_t = 588;
pub const CUBLASLT_MATMUL_TILE_576x16: cublasLtMatmulTile_t = 589;
pub const CUBLASLT_MATMUL_TILE_576x24: cublasLtMatmulTile_t = 590;
pub const CUBLASLT_MATMUL_TILE_576x32: cublasLtMatmulTile_t = 591;
pub const CUBLASLT_MATMUL_TILE_576x40: cublasLtMatmulTile_t = 592;
pub const CUBLASLT_MATMUL_TILE_576x48: cublasLtMatmulTile_t = 593;
pub const CUBLASLT_MATMUL_TILE_576x56: cublasLtMatmulTile_t = 594;
pub const CUBLASLT_MATMUL_TILE_576x72: cublasLtMatmulTile_t = 595;
pub const CUBLASLT_MATMUL_TILE_576x80: cublasLtMatmulTile_t = 596;
pub const CUBLASLT_MATMUL_TILE_576x88: cublasLtMatmulTile_t = 597;
pub const CUBLASLT_MATMUL_TILE_576x96: cublasLtMatmulTile_t = 598;
pub const CUBLASLT_MATMUL_TILE_576x104: cublasLtMatmulTile_t = 599;
pub const CUBLASLT_MATMUL_TILE_576x112: cublasLtMatmulTile_t = 600;
pub const CUBLASLT_MATMUL_TILE_640x8: cublasLtMatmulTile_t = 601;
pub const CUBLASLT_MATMUL_TILE_640x16: cublasLtMatmulTile_t = 602;
pub const CUBLASLT_MATMUL_TILE_640x24: cublasLtMatmulTile_t = 603;
pub const CUBLASLT_MATMUL_TILE_640x32: cublasLtMatmulTile_t = 604;
pub const CUBLASLT_MATMUL_TILE_640x40: cublasLtMatmulTile_t = 605;
pub const CUBLASLT_MATMUL_TILE_640x48: cublasLtMatmulTile_t = 606;
pub const CUBLASLT_MATMUL_TILE_640x56: cublasLtMatmulTile_t = 607;
pub const CUBLASLT_MATMUL_TILE_640x72: cublasLtMatmulTile_t = 608;
pub const CUBLASLT_MATMUL_TILE_640x80: cublasLtMatmulTile_t = 609;
pub const CUBLASLT_MATMUL_TILE_640x88: cublasLtMatmulTile_t = 610;
pub const CUBLASLT_MATMUL_TILE_640x96: cublasLtMatmulTile_t = 611;
pub const CUBLASLT_MATMUL_TILE_704x8: cublasLtMatmulTile_t = 612;
pub const CUBLASLT_MATMUL_TILE_704x16: cublasLtMatmulTile_t = 613;
pub const CUBLASLT_MATMUL_TILE_704x24: cublasLtMatmulTile_t = 614;
pub const CUBLASLT_MATMUL_TILE_704x32: cublasLtMatmulTile_t = 615;
pub const CUBLASLT_MATMUL_TILE_704x40: cublasLtMatmulTile_t = 616;
pub const CUBLASLT_MATMUL_TILE_704x48: cublasLtMatmulTile_t = 617;
pub const CUBLASLT_MATMUL_TILE_704x56: cublasLtMatmulTile_t = 618;
pub const CUBLASLT_MATMUL_TILE_704x72: cublasLtMatmulTile_t = 619;
pub const CUBLASLT_MATMUL_TILE_704x80: cublasLtMatmulTile_t = 620;
pub const CUBLASLT_MATMUL_TILE_704x88: cublasLtMatmulTile_t = 621;
pub const CUBLASLT_MATMUL_TILE_768x8: cublasLtMatmulTile_t = 622;
pub const CUBLASLT_MATMUL_TILE_768x16: cublasLtMatmulTile_t = 623;
pub const CUBLASLT_MATMUL_TILE_768x24: cublasLtMatmulTile_t = 624;
pub const CUBLASLT_MATMUL_TILE_768x32: cublasLtMatmulTile_t = 625;
pub const CUBLASLT_MATMUL_TILE_768x40: cublasLtMatmulTile_t = 626;
pub const CUBLASLT_MATMUL_TILE_768x48: cublasLtMatmulTile_t = 627;
pub const CUBLASLT_MATMUL_TILE_768x56: cublasLtMatmulTile_t = 628;
pub const CUBLASLT_MATMUL_TILE_768x72: cublasLtMatmulTile_t = 629;
pub const CUBLASLT_MATMUL_TILE_768x80: cublasLtMatmulTile_t = 630;
pub const CUBLASLT_MATMUL_TILE_256x512: cublasLtMatmulTile_t = 631;
pub const CUBLASLT_MATMUL_TILE_256x1024: cublasLtMatmulTile_t = 632;
pub const CUBLASLT_MATMUL_TILE_512x512: cublasLtMatmulTile_t = 633;
pub const CUBLASLT_MATMUL_TILE_512x1024: cublasLtMatmulTile_t = 634;
pub const CUBLASLT_MATMUL_TILE_END: cublasLtMatmulTile_t = 635;

/// `cublasLtMatmulStages_t`.
pub type cublasLtMatmulStages_t = c_uint;
pub const CUBLASLT_MATMUL_STAGES_UNDEFINED: cublasLtMatmulStages_t = 0;
pub const CUBLASLT_MATMUL_STAGES_16x1: cublasLtMatmulStages_t = 1;
pub const CUBLASLT_MATMUL_STAGES_16x2: cublasLtMatmulStages_t = 2;
pub const CUBLASLT_MATMUL_STAGES_16x3: cublasLtMatmulStages_t = 3;
pub const CUBLASLT_MATMUL_STAGES_16x4: cublasLtMatmulStages_t = 4;
pub const CUBLASLT_MATMUL_STAGES_16x5: cublasLtMatmulStages_t = 5;
pub const CUBLASLT_MATMUL_STAGES_16x6: cublasLtMatmulStages_t = 6;
pub const CUBLASLT_MATMUL_STAGES_32x1: cublasLtMatmulStages_t = 7;
pub const CUBLASLT_MATMUL_STAGES_32x2: cublasLtMatmulStages_t = 8;
pub const CUBLASLT_MATMUL_STAGES_32x3: cublasLtMatmulStages_t = 9;
pub const CUBLASLT_MATMUL_STAGES_32x4: cublasLtMatmulStages_t = 10;
pub const CUBLASLT_MATMUL_STAGES_32x5: cublasLtMatmulStages_t = 11;
pub const CUBLASLT_MATMUL_STAGES_32x6: cublasLtMatmulStages_t = 12;
pub const CUBLASLT_MATMUL_STAGES_64x1: cublasLtMatmulStages_t = 13;
pub const CUBLASLT_MATMUL_STAGES_64x2: cublasLtMatmulStages_t = 14;
pub const CUBLASLT_MATMUL_STAGES_64x3: cublasLtMatmulStages_t = 15;
pub const CUBLASLT_MATMUL_STAGES_64x4: cublasLtMatmulStages_t = 16;
pub const CUBLASLT_MATMUL_STAGES_64x5: cublasLtMatmulStages_t = 17;
pub const CUBLASLT_MATMUL_STAGES_64x6: cublasLtMatmulStages_t = 18;
pub const CUBLASLT_MATMUL_STAGES_128x1: cublasLtMatmulStages_t = 19;
pub const CUBLASLT_MATMUL_STAGES_128x2: cublasLtMatmulStages_t = 20;
pub const CUBLASLT_MATMUL_STAGES_128x3: cublasLtMatmulStages_t = 21;
pub const CUBLASLT_MATMUL_STAGES_128x4: cublasLtMatmulStages_t = 22;
pub const CUBLASLT_MATMUL_STAGES_128x5: cublasLtMatmulStages_t = 23;
pub const CUBLASLT_MATMUL_STAGES_128x6: cublasLtMatmulStages_t = 24;
pub const CUBLASLT_MATMUL_STAGES_32x10: cublasLtMatmulStages_t = 25;
pub const CUBLASLT_MATMUL_STAGES_8x4: cublasLtMatmulStages_t = 26;
pub const CUBLASLT_MATMUL_STAGES_16x10: cublasLtMatmulStages_t = 27;
pub const CUBLASLT_MATMUL_STAGES_8x5: cublasLtMatmulStages_t = 28;
pub const CUBLASLT_MATMUL_STAGES_8x3: cublasLtMatmulStages_t = 31;
pub const CUBLASLT_MATMUL_STAGES_8xAUTO: cublasLtMatmulStages_t = 32;
pub const CUBLASLT_MATMUL_STAGES_16xAUTO: cublasLtMatmulStages_t = 33;
pub const CUBLASLT_MATMUL_STAGES_32xAUTO: cublasLtMatmulStages_t = 34;
pub const CUBLASLT_MATMUL_STAGES_64xAUTO: cublasLtMatmulStages_t = 35;
pub const CUBLASLT_MATMUL_STAGES_128xAUTO: cublasLtMatmulStages_t = 36;
pub const CUBLASLT_MATMUL_STAGES_256xAUTO: cublasLtMatmulStages_t = 37;
pub const CUBLASLT_MATMUL_STAGES_END: cublasLtMatmulStages_t = 38;

/// `cublasLtClusterShape_t`.
pub type cublasLtClusterShape_t = c_uint;
/// Let library pick cluster shape automatically.
pub const CUBLASLT_CLUSTER_SHAPE_AUTO: cublasLtClusterShape_t = 0;
pub const CUBLASLT_CLUSTER_SHAPE_1x1x1: cublasLtClusterShape_t = 2;
pub const CUBLASLT_CLUSTER_SHAPE_2x1x1: cublasLtClusterShape_t = 3;
pub const CUBLASLT_CLUSTER_SHAPE_4x1x1: cublasLtClusterShape_t = 4;
pub const CUBLASLT_CLUSTER_SHAPE_1x2x1: cublasLtClusterShape_t = 5;
pub const CUBLASLT_CLUSTER_SHAPE_2x2x1: cublasLtClusterShape_t = 6;
pub const CUBLASLT_CLUSTER_SHAPE_4x2x1: cublasLtClusterShape_t = 7;
pub const CUBLASLT_CLUSTER_SHAPE_1x4x1: cublasLtClusterShape_t = 8;
pub const CUBLASLT_CLUSTER_SHAPE_2x4x1: cublasLtClusterShape_t = 9;
pub const CUBLASLT_CLUSTER_SHAPE_4x4x1: cublasLtClusterShape_t = 10;
pub const CUBLASLT_CLUSTER_SHAPE_8x1x1: cublasLtClusterShape_t = 11;
pub const CUBLASLT_CLUSTER_SHAPE_1x8x1: cublasLtClusterShape_t = 12;
pub const CUBLASLT_CLUSTER_SHAPE_8x2x1: cublasLtClusterShape_t = 13;
pub const CUBLASLT_CLUSTER_SHAPE_2x8x1: cublasLtClusterShape_t = 14;
pub const CUBLASLT_CLUSTER_SHAPE_16x1x1: cublasLtClusterShape_t = 15;
pub const CUBLASLT_CLUSTER_SHAPE_1x16x1: cublasLtClusterShape_t = 16;
pub const CUBLASLT_CLUSTER_SHAPE_3x1x1: cublasLtClusterShape_t = 17;
pub const CUBLASLT_CLUSTER_SHAPE_5x1x1: cublasLtClusterShape_t = 18;
pub const CUBLASLT_CLUSTER_SHAPE_6x1x1: cublasLtClusterShape_t = 19;
pub const CUBLASLT_CLUSTER_SHAPE_7x1x1: cublasLtClusterShape_t = 20;
pub const CUBLASLT_CLUSTER_SHAPE_9x1x1: cublasLtClusterShape_t = 21;
pub const CUBLASLT_CLUSTER_SHAPE_10x1x1: cublasLtClusterShape_t = 22;
pub const CUBLASLT_CLUSTER_SHAPE_11x1x1: cublasLtClusterShape_t = 23;
pub const CUBLASLT_CLUSTER_SHAPE_12x1x1: cublasLtClusterShape_t = 24;
pub const CUBLASLT_CLUSTER_SHAPE_13x1x1: cublasLtClusterShape_t = 25;
pub const CUBLASLT_CLUSTER_SHAPE_14x1x1: cublasLtClusterShape_t = 26;
pub const CUBLASLT_CLUSTER_SHAPE_15x1x1: cublasLtClusterShape_t = 27;
pub const CUBLASLT_CLUSTER_SHAPE_3x2x1: cublasLtClusterShape_t = 28;
pub const CUBLASLT_CLUSTER_SHAPE_5x2x1: cublasLtClusterShape_t = 29;
pub const CUBLASLT_CLUSTER_SHAPE_6x2x1: cublasLtClusterShape_t = 30;
pub const CUBLASLT_CLUSTER_SHAPE_7x2x1: cublasLtClusterShape_t = 31;
pub const CUBLASLT_CLUSTER_SHAPE_1x3x1: cublasLtClusterShape_t = 32;
pub const CUBLASLT_CLUSTER_SHAPE_2x3x1: cublasLtClusterShape_t = 33;
pub const CUBLASLT_CLUSTER_SHAPE_3x3x1: cublasLtClusterShape_t = 34;
pub const CUBLASLT_CLUSTER_SHAPE_4x3x1: cublasLtClusterShape_t = 35;
pub const CUBLASLT_CLUSTER_SHAPE_5x3x1: cublasLtClusterShape_t = 36;
pub const CUBLASLT_CLUSTER_SHAPE_3x4x1: cublasLtClusterShape_t = 37;
pub const CUBLASLT_CLUSTER_SHAPE_1x5x1: cublasLtClusterShape_t = 38;
pub const CUBLASLT_CLUSTER_SHAPE_2x5x1: cublasLtClusterShape_t = 39;
pub const CUBLASLT_CLUSTER_SHAPE_3x5x1: cublasLtClusterShape_t = 40;
pub const CUBLASLT_CLUSTER_SHAPE_1x6x1: cublasLtClusterShape_t = 41;
pub const CUBLASLT_CLUSTER_SHAPE_2x6x1: cublasLtClusterShape_t = 42;
pub const CUBLASLT_CLUSTER_SHAPE_1x7x1: cublasLtClusterShape_t = 43;
pub const CUBLASLT_CLUSTER_SHAPE_2x7x1: cublasLtClusterShape_t = 44;
pub const CUBLASLT_CLUSTER_SHAPE_1x9x1: cublasLtClusterShape_t = 45;
pub const CUBLASLT_CLUSTER_SHAPE_1x10x1: cublasLtClusterShape_t = 46;
pub const CUBLASLT_CLUSTER_SHAPE_1x11x1: cublasLtClusterShape_t = 47;
pub const CUBLASLT_CLUSTER_SHAPE_1x12x1: cublasLtClusterShape_t = 48;
pub const CUBLASLT_CLUSTER_SHAPE_1x13x1: cublasLtClusterShape_t = 49;
pub const CUBLASLT_CLUSTER_SHAPE_1x14x1: cublasLtClusterShape_t = 50;
pub const CUBLASLT_CLUSTER_SHAPE_1x15x1: cublasLtClusterShape_t = 51;
pub const CUBLASLT_CLUSTER_SHAPE_END: cublasLtClusterShape_t = 52;

/// `cublasLtMatmulInnerShape_t`.
pub type cublasLtMatmulInnerShape_t = c_uint;
pub const CUBLASLT_MATMUL_INNER_SHAPE_UNDEFINED: cublasLtMatmulInnerShape_t = 0;
pub const CUBLASLT_MATMUL_INNER_SHAPE_MMA884: cublasLtMatmulInnerShape_t = 1;
pub const CUBLASLT_MATMUL_INNER_SHAPE_MMA1684: cublasLtMatmulInnerShape_t = 2;
pub const CUBLASLT_MATMUL_INNER_SHAPE_MMA1688: cublasLtMatmulInnerShape_t = 3;
pub const CUBLASLT_MATMUL_INNER_SHAPE_MMA16816: cublasLtMatmulInnerShape_t = 4;
pub const CUBLASLT_MATMUL_INNER_SHAPE_END: cublasLtMatmulInnerShape_t = 5;

/// `cublasLtMatmulMatrixScale_t`.
pub type cublasLtMatmulMatrixScale_t = c_uint;
/// Scaling factors are single precision scalars applied to the whole tensor.
pub const CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: cublasLtMatmulMatrixScale_t = 0;
/// Scaling factors are tensors that contain a dedicated scaling factor stored as an 8-bit
/// CUDA_R_8F_UE4M3 value for each 16-element block in the innermost dimension of the corresponding
/// data tensor.
pub const CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3: cublasLtMatmulMatrixScale_t = 1;
/// Same as above, except that scaling factor tensor elements have type CUDA_R_8F_UE8M0 and the
/// block size is 32 elements.
pub const CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0: cublasLtMatmulMatrixScale_t = 2;
pub const CUBLASLT_MATMUL_MATRIX_SCALE_END: cublasLtMatmulMatrixScale_t = 3;

/// `cublasLtPointerMode_t`.
pub type cublasLtPointerMode_t = c_uint;
/// Matches CUBLAS_POINTER_MODE_HOST, pointer targets a single value host memory.
pub const CUBLASLT_POINTER_MODE_HOST: cublasLtPointerMode_t = 0;
/// Matches CUBLAS_POINTER_MODE_DEVICE, pointer targets a single value device memory.
pub const CUBLASLT_POINTER_MODE_DEVICE: cublasLtPointerMode_t = 1;
/// Pointer targets an array in device memory.
pub const CUBLASLT_POINTER_MODE_DEVICE_VECTOR: cublasLtPointerMode_t = 2;
/// Alpha pointer targets an array in device memory, beta is zero.
pub const CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO: cublasLtPointerMode_t = 3;
/// Alpha pointer targets an array in device memory, beta is a single value in host memory.
pub const CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST: cublasLtPointerMode_t = 4;

/// `cublasLtPointerModeMask_t`.
pub type cublasLtPointerModeMask_t = c_uint;
/// See CUBLASLT_POINTER_MODE_HOST.
pub const CUBLASLT_POINTER_MODE_MASK_HOST: cublasLtPointerModeMask_t = 1;
/// See CUBLASLT_POINTER_MODE_DEVICE.
pub const CUBLASLT_POINTER_MODE_MASK_DEVICE: cublasLtPointerModeMask_t = 2;
/// See CUBLASLT_POINTER_MODE_DEVICE_VECTOR.
pub const CUBLASLT_POINTER_MODE_MASK_DEVICE_VECTOR: cublasLtPointerModeMask_t = 4;
/// See CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO.
pub const CUBLASLT_POINTER_MODE_MASK_ALPHA_DEVICE_VECTOR_BETA_ZERO: cublasLtPointerModeMask_t = 8;
/// See CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST.
pub const CUBLASLT_POINTER_MODE_MASK_ALPHA_DEVICE_VECTOR_BETA_HOST: cublasLtPointerModeMask_t = 16;

/// `cublasLtOrder_t`.
pub type cublasLtOrder_t = c_uint;
/// Column-major Leading dimension is the stride (in elements) to the beginning of next column in
/// memory.
pub const CUBLASLT_ORDER_COL: cublasLtOrder_t = 0;
/// Row major Leading dimension is the stride (in elements) to the beginning of next row in memory.
pub const CUBLASLT_ORDER_ROW: cublasLtOrder_t = 1;
/// Column-major ordered tiles of 32 columns.
pub const CUBLASLT_ORDER_COL32: cublasLtOrder_t = 2;
/// Column-major ordered tiles of composite tiles with total 32 columns and 8 rows, tile composed of
/// interleaved inner tiles of 4 columns within 4 even or odd rows in an alternating pattern.
pub const CUBLASLT_ORDER_COL4_4R2_8C: cublasLtOrder_t = 3;
/// Column-major ordered tiles of composite tiles with total 32 columns ands 32 rows.
pub const CUBLASLT_ORDER_COL32_2R_4R4: cublasLtOrder_t = 4;

/// `cublasLtMatrixLayoutAttribute_t`.
pub type cublasLtMatrixLayoutAttribute_t = c_uint;
/// Data type, see cudaDataType.
pub const CUBLASLT_MATRIX_LAYOUT_TYPE: cublasLtMatrixLayoutAttribute_t = 0;
/// Memory order of the data, see cublasLtOrder_t.
pub const CUBLASLT_MATRIX_LAYOUT_ORDER: cublasLtMatrixLayoutAttribute_t = 1;
/// Number of rows.
pub const CUBLASLT_MATRIX_LAYOUT_ROWS: cublasLtMatrixLayoutAttribute_t = 2;
/// Number of columns.
pub const CUBLASLT_MATRIX_LAYOUT_COLS: cublasLtMatrixLayoutAttribute_t = 3;
/// Matrix leading dimension.
pub const CUBLASLT_MATRIX_LAYOUT_LD: cublasLtMatrixLayoutAttribute_t = 4;
/// Number of matmul operations to perform in the batch.
pub const CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: cublasLtMatrixLayoutAttribute_t = 5;
/// Stride (in elements) to the next matrix for strided batch operation.
pub const CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: cublasLtMatrixLayoutAttribute_t = 6;
/// Stride (in bytes) to the imaginary plane for planar complex layout.
pub const CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET: cublasLtMatrixLayoutAttribute_t = 7;
/// `uint32_t` `cublasLtBatchMode_t` (cuBLASLt of CUDA 13 only; older libraries refuse the
/// attribute, which means strided batches).
pub const CUBLASLT_MATRIX_LAYOUT_BATCH_MODE: cublasLtMatrixLayoutAttribute_t = 8;

/// `cublasLtBatchMode_t` (CUDA 13): how a layout's batch entries are found.
pub type cublasLtBatchMode_t = c_uint;
/// Entries `STRIDED_BATCH_OFFSET` elements apart (the default).
pub const CUBLASLT_BATCH_MODE_STRIDED: cublasLtBatchMode_t = 0;
/// The matrix pointer is a device array of per-entry pointers.
pub const CUBLASLT_BATCH_MODE_POINTER_ARRAY: cublasLtBatchMode_t = 1;
/// Entries of per-group shapes (grouped GEMM), pointer array in device memory.
pub const CUBLASLT_BATCH_MODE_GROUPED: cublasLtBatchMode_t = 2;

/// `cublasLtMatmulDescAttributes_t`.
pub type cublasLtMatmulDescAttributes_t = c_uint;
/// Compute type, see cudaDataType.
pub const CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: cublasLtMatmulDescAttributes_t = 0;
/// Scale type, see cudaDataType.
pub const CUBLASLT_MATMUL_DESC_SCALE_TYPE: cublasLtMatmulDescAttributes_t = 1;
/// Pointer mode of alpha and beta, see cublasLtPointerMode_t.
pub const CUBLASLT_MATMUL_DESC_POINTER_MODE: cublasLtMatmulDescAttributes_t = 2;
/// Transform of matrix A, see cublasOperation_t.
pub const CUBLASLT_MATMUL_DESC_TRANSA: cublasLtMatmulDescAttributes_t = 3;
/// Transform of matrix B, see cublasOperation_t.
pub const CUBLASLT_MATMUL_DESC_TRANSB: cublasLtMatmulDescAttributes_t = 4;
/// Transform of matrix C, see cublasOperation_t.
pub const CUBLASLT_MATMUL_DESC_TRANSC: cublasLtMatmulDescAttributes_t = 5;
/// Matrix fill mode, see cublasFillMode_t.
pub const CUBLASLT_MATMUL_DESC_FILL_MODE: cublasLtMatmulDescAttributes_t = 6;
/// Epilogue function, see cublasLtEpilogue_t.
pub const CUBLASLT_MATMUL_DESC_EPILOGUE: cublasLtMatmulDescAttributes_t = 7;
/// Bias or bias gradient vector pointer in the device memory.
pub const CUBLASLT_MATMUL_DESC_BIAS_POINTER: cublasLtMatmulDescAttributes_t = 8;
/// Batch stride for bias or bias gradient vector.
pub const CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: cublasLtMatmulDescAttributes_t = 10;
/// Pointer for epilogue auxiliary buffer.
pub const CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: cublasLtMatmulDescAttributes_t = 11;
/// Leading dimension for epilogue auxiliary buffer.
pub const CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: cublasLtMatmulDescAttributes_t = 12;
/// Batch stride for epilogue auxiliary buffer.
pub const CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: cublasLtMatmulDescAttributes_t = 13;
/// Batch stride for alpha vector.
pub const CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE: cublasLtMatmulDescAttributes_t = 14;
/// Number of SMs to target for parallel execution.
pub const CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: cublasLtMatmulDescAttributes_t = 15;
/// Device pointer to the scale factor value that converts data in matrix A to the compute data type
/// range.
pub const CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: cublasLtMatmulDescAttributes_t = 17;
/// Device pointer to the scale factor value to convert data in matrix B to compute data type range.
pub const CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: cublasLtMatmulDescAttributes_t = 18;
/// Device pointer to the scale factor value to convert data in matrix C to compute data type range.
pub const CUBLASLT_MATMUL_DESC_C_SCALE_POINTER: cublasLtMatmulDescAttributes_t = 19;
/// Device pointer to the scale factor value to convert data in matrix D to compute data type range.
pub const CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: cublasLtMatmulDescAttributes_t = 20;
/// Device pointer to the memory location that on completion will be set to the maximum of absolute
/// values in the output matrix.
pub const CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: cublasLtMatmulDescAttributes_t = 21;
/// Type of the data to be stored to the memory pointed to by
/// CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER.
pub const CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: cublasLtMatmulDescAttributes_t = 22;
/// Device pointer to the scaling factor value to convert results from compute type data range to
/// storage data range in the auxiliary matrix that is set via
/// CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER.
pub const CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER: cublasLtMatmulDescAttributes_t = 23;
/// Device pointer to the memory location that on completion will be set to the maximum of absolute
/// values in the buffer that is set via CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER.
pub const CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER: cublasLtMatmulDescAttributes_t = 24;
/// Flag for managing fp8 fast accumulation mode.
pub const CUBLASLT_MATMUL_DESC_FAST_ACCUM: cublasLtMatmulDescAttributes_t = 25;
/// Type of bias or bias gradient vector in the device memory.
pub const CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: cublasLtMatmulDescAttributes_t = 26;
/// EXPERIMENTAL, DEPRECATED: Number of atomic synchronization chunks in the row dimension of the
/// output matrix D.
pub const CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_NUM_CHUNKS_D_ROWS: cublasLtMatmulDescAttributes_t = 27;
/// EXPERIMENTAL, DEPRECATED: Number of atomic synchronization chunks in the column dimension of the
/// output matrix D.
pub const CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_NUM_CHUNKS_D_COLS: cublasLtMatmulDescAttributes_t = 28;
/// EXPERIMENTAL: Pointer to a device array of input atomic counters consumed by a matmul.
pub const CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_IN_COUNTERS_POINTER: cublasLtMatmulDescAttributes_t = 29;
/// EXPERIMENTAL: Pointer to a device array of output atomic counters produced by a matmul.
pub const CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_OUT_COUNTERS_POINTER: cublasLtMatmulDescAttributes_t =
    30;
/// Scaling mode that defines how the matrix scaling factor for matrix A is interpreted int32_t,
/// default: 0.
pub const CUBLASLT_MATMUL_DESC_A_SCALE_MODE: cublasLtMatmulDescAttributes_t = 31;
/// Scaling mode that defines how the matrix scaling factor for matrix B is interpreted int32_t,
/// default: 0.
pub const CUBLASLT_MATMUL_DESC_B_SCALE_MODE: cublasLtMatmulDescAttributes_t = 32;
/// Scaling mode that defines how the matrix scaling factor for matrix C is interpreted int32_t,
/// default: 0.
pub const CUBLASLT_MATMUL_DESC_C_SCALE_MODE: cublasLtMatmulDescAttributes_t = 33;
/// Scaling mode that defines how the matrix scaling factor for matrix D is interpreted int32_t,
/// default: 0.
pub const CUBLASLT_MATMUL_DESC_D_SCALE_MODE: cublasLtMatmulDescAttributes_t = 34;
/// Scaling mode that defines how the matrix scaling factor for the auxiliary matrix is interpreted
/// int32_t, default: 0.
pub const CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE: cublasLtMatmulDescAttributes_t = 35;
/// Device pointer to the scale factors that are used to convert data in matrix D to the compute
/// data type range.
pub const CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER: cublasLtMatmulDescAttributes_t = 36;
/// Scaling mode that defines how the output matrix scaling factor for matrix D is interpreted
/// int32_t, default: 0.
pub const CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE: cublasLtMatmulDescAttributes_t = 37;

/// `cublasLtMatrixTransformDescAttributes_t`.
pub type cublasLtMatrixTransformDescAttributes_t = c_uint;
/// Scale type, see cudaDataType.
pub const CUBLASLT_MATRIX_TRANSFORM_DESC_SCALE_TYPE: cublasLtMatrixTransformDescAttributes_t = 0;
/// Pointer mode of alpha and beta, see cublasLtPointerMode_t.
pub const CUBLASLT_MATRIX_TRANSFORM_DESC_POINTER_MODE: cublasLtMatrixTransformDescAttributes_t = 1;
/// Transform of matrix A, see cublasOperation_t.
pub const CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA: cublasLtMatrixTransformDescAttributes_t = 2;
/// Transform of matrix B, see cublasOperation_t.
pub const CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSB: cublasLtMatrixTransformDescAttributes_t = 3;

/// `cublasLtReductionScheme_t`.
pub type cublasLtReductionScheme_t = c_uint;
/// No reduction scheme, dot-product shall be performed in one sequence.
pub const CUBLASLT_REDUCTION_SCHEME_NONE: cublasLtReductionScheme_t = 0;
/// Reduction is performed "in place" - using the output buffer (and output data type) and counters
/// (in workspace) to guarantee the sequentiality.
pub const CUBLASLT_REDUCTION_SCHEME_INPLACE: cublasLtReductionScheme_t = 1;
/// Intermediate results are stored in compute type in the workspace and reduced in a separate step.
pub const CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE: cublasLtReductionScheme_t = 2;
/// Intermediate results are stored in output type in the workspace and reduced in a separate step.
pub const CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE: cublasLtReductionScheme_t = 4;
pub const CUBLASLT_REDUCTION_SCHEME_MASK: cublasLtReductionScheme_t = 7;

/// `cublasLtEpilogue_t`.
pub type cublasLtEpilogue_t = c_uint;
/// No special postprocessing, just scale and quantize results if necessary.
pub const CUBLASLT_EPILOGUE_DEFAULT: cublasLtEpilogue_t = 1;
/// ReLu, apply ReLu point-wise transform to the results (x:=max(x, 0)).
pub const CUBLASLT_EPILOGUE_RELU: cublasLtEpilogue_t = 2;
/// ReLu, apply ReLu point-wise transform to the results (x:=max(x, 0)).
pub const CUBLASLT_EPILOGUE_RELU_AUX: cublasLtEpilogue_t = 130;
/// Bias, apply (broadcasted) Bias from bias vector.
pub const CUBLASLT_EPILOGUE_BIAS: cublasLtEpilogue_t = 4;
/// ReLu and Bias, apply Bias and then ReLu transform.
pub const CUBLASLT_EPILOGUE_RELU_BIAS: cublasLtEpilogue_t = 6;
/// ReLu and Bias, apply Bias and then ReLu transform This epilogue mode produces an extra output, a
/// ReLu bit-mask matrix, see CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER.
pub const CUBLASLT_EPILOGUE_RELU_AUX_BIAS: cublasLtEpilogue_t = 134;
/// ReLu gradient.
pub const CUBLASLT_EPILOGUE_DRELU: cublasLtEpilogue_t = 136;
/// ReLu and Bias gradients.
pub const CUBLASLT_EPILOGUE_DRELU_BGRAD: cublasLtEpilogue_t = 152;
/// GELU, apply GELU point-wise transform to the results (x:=GELU(x)).
pub const CUBLASLT_EPILOGUE_GELU: cublasLtEpilogue_t = 32;
/// GELU, apply GELU point-wise transform to the results (x:=GELU(x)).
pub const CUBLASLT_EPILOGUE_GELU_AUX: cublasLtEpilogue_t = 160;
/// GELU and Bias, apply Bias and then GELU transform.
pub const CUBLASLT_EPILOGUE_GELU_BIAS: cublasLtEpilogue_t = 36;
/// GELU and Bias, apply Bias and then GELU transform This epilogue mode outputs GELU input as a
/// separate matrix (useful for training).
pub const CUBLASLT_EPILOGUE_GELU_AUX_BIAS: cublasLtEpilogue_t = 164;
/// GELU gradient.
pub const CUBLASLT_EPILOGUE_DGELU: cublasLtEpilogue_t = 192;
/// GELU and Bias gradients.
pub const CUBLASLT_EPILOGUE_DGELU_BGRAD: cublasLtEpilogue_t = 208;
/// Bias gradient based on the input matrix A.
pub const CUBLASLT_EPILOGUE_BGRADA: cublasLtEpilogue_t = 256;
/// Bias gradient based on the input matrix B.
pub const CUBLASLT_EPILOGUE_BGRADB: cublasLtEpilogue_t = 512;

/// `cublasLtMatmulSearch_t`.
pub type cublasLtMatmulSearch_t = c_uint;
/// Ask heuristics for best algo for given usecase.
pub const CUBLASLT_SEARCH_BEST_FIT: cublasLtMatmulSearch_t = 0;
/// Only try to find best config for preconfigured algo id.
pub const CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID: cublasLtMatmulSearch_t = 1;
/// Reserved for future use.
pub const CUBLASLT_SEARCH_RESERVED_02: cublasLtMatmulSearch_t = 2;
/// Reserved for future use.
pub const CUBLASLT_SEARCH_RESERVED_03: cublasLtMatmulSearch_t = 3;
/// Reserved for future use.
pub const CUBLASLT_SEARCH_RESERVED_04: cublasLtMatmulSearch_t = 4;
/// Reserved for future use.
pub const CUBLASLT_SEARCH_RESERVED_05: cublasLtMatmulSearch_t = 5;
/// Reserved for future use.
pub const CUBLASLT_SEARCH_RESERVED_06: cublasLtMatmulSearch_t = 6;
/// Reserved for future use.
pub const CUBLASLT_SEARCH_RESERVED_07: cublasLtMatmulSearch_t = 7;
/// Reserved for future use.
pub const CUBLASLT_SEARCH_RESERVED_08: cublasLtMatmulSearch_t = 8;
/// Reserved for future use.
pub const CUBLASLT_SEARCH_RESERVED_09: cublasLtMatmulSearch_t = 9;

/// `cublasLtMatmulPreferenceAttributes_t`.
pub type cublasLtMatmulPreferenceAttributes_t = c_uint;
/// Search mode, see cublasLtMatmulSearch_t.
pub const CUBLASLT_MATMUL_PREF_SEARCH_MODE: cublasLtMatmulPreferenceAttributes_t = 0;
/// Maximum allowed workspace size in bytes.
pub const CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: cublasLtMatmulPreferenceAttributes_t = 1;
/// Reduction scheme mask, see cublasLtReductionScheme_t.
pub const CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: cublasLtMatmulPreferenceAttributes_t = 3;
/// Minimum buffer alignment for matrix A (in bytes).
pub const CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: cublasLtMatmulPreferenceAttributes_t = 5;
/// Minimum buffer alignment for matrix B (in bytes).
pub const CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: cublasLtMatmulPreferenceAttributes_t = 6;
/// Minimum buffer alignment for matrix C (in bytes).
pub const CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: cublasLtMatmulPreferenceAttributes_t = 7;
/// Minimum buffer alignment for matrix D (in bytes).
pub const CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: cublasLtMatmulPreferenceAttributes_t = 8;
/// Maximum wave count.
pub const CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: cublasLtMatmulPreferenceAttributes_t = 9;
/// Numerical implementation details mask, see cublasLtNumericalImplFlags_t.
pub const CUBLASLT_MATMUL_PREF_IMPL_MASK: cublasLtMatmulPreferenceAttributes_t = 12;

/// `cublasLtMatmulAlgoCapAttributes_t`.
pub type cublasLtMatmulAlgoCapAttributes_t = c_uint;
/// Support for split K, see CUBLASLT_ALGO_CONFIG_SPLITK_NUM int32_t, 0 means no support, supported
/// otherwise.
pub const CUBLASLT_ALGO_CAP_SPLITK_SUPPORT: cublasLtMatmulAlgoCapAttributes_t = 0;
/// Reduction scheme mask, see cublasLtReductionScheme_t; shows supported reduction schemes, if
/// reduction scheme is not masked out it is supported.
pub const CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK: cublasLtMatmulAlgoCapAttributes_t = 1;
/// Support for cta swizzling, see CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING uint32_t, 0 means no support,
/// 1 means supported value of 1, other values are reserved.
pub const CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT: cublasLtMatmulAlgoCapAttributes_t = 2;
/// Support strided batch int32_t, 0 means no support, supported otherwise.
pub const CUBLASLT_ALGO_CAP_STRIDED_BATCH_SUPPORT: cublasLtMatmulAlgoCapAttributes_t = 3;
/// Support results out of place (D != C in D = alpha.A.B + beta.C) int32_t, 0 means no support,
/// supported otherwise.
pub const CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT: cublasLtMatmulAlgoCapAttributes_t = 4;
/// Syrk/herk support (on top of regular gemm) int32_t, 0 means no support, supported otherwise.
pub const CUBLASLT_ALGO_CAP_UPLO_SUPPORT: cublasLtMatmulAlgoCapAttributes_t = 5;
/// Tile ids possible to use, see cublasLtMatmulTile_t; if no tile ids are supported use
/// CUBLASLT_MATMUL_TILE_UNDEFINED use cublasLtMatmulAlgoCapGetAttribute() with sizeInBytes=0 to
/// query actual count array of uint32_t.
pub const CUBLASLT_ALGO_CAP_TILE_IDS: cublasLtMatmulAlgoCapAttributes_t = 6;
/// Custom option range is from 0 to CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX (inclusive), see
/// CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION int32_t.
pub const CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX: cublasLtMatmulAlgoCapAttributes_t = 7;
/// Whether algorithm supports custom (not COL or ROW memory order), see cublasLtOrder_t int32_t 0
/// means only COL and ROW memory order is allowed, non-zero means that algo might have different
/// requirements;.
pub const CUBLASLT_ALGO_CAP_CUSTOM_MEMORY_ORDER: cublasLtMatmulAlgoCapAttributes_t = 10;
/// Bitmask enumerating pointer modes algorithm supports uint32_t, see cublasLtPointerModeMask_t.
pub const CUBLASLT_ALGO_CAP_POINTER_MODE_MASK: cublasLtMatmulAlgoCapAttributes_t = 11;
/// Bitmask enumerating kinds of postprocessing algorithm supports in the epilogue uint32_t, see
/// cublasLtEpilogue_t.
pub const CUBLASLT_ALGO_CAP_EPILOGUE_MASK: cublasLtMatmulAlgoCapAttributes_t = 12;
/// Stages ids possible to use, see cublasLtMatmulStages_t; if no stages ids are supported use
/// CUBLASLT_MATMUL_STAGES_UNDEFINED use cublasLtMatmulAlgoCapGetAttribute() with sizeInBytes=0 to
/// query actual count array of uint32_t.
pub const CUBLASLT_ALGO_CAP_STAGES_IDS: cublasLtMatmulAlgoCapAttributes_t = 13;
/// Support for nagative ld for all of the matrices int32_t 0 means no support, supported otherwise.
pub const CUBLASLT_ALGO_CAP_LD_NEGATIVE: cublasLtMatmulAlgoCapAttributes_t = 14;
/// Details about algorithm's implementation that affect it's numerical behavior uint64_t, see
/// cublasLtNumericalImplFlags_t.
pub const CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS: cublasLtMatmulAlgoCapAttributes_t = 15;
/// Minimum alignment required for A matrix in bytes (required for buffer pointer, leading
/// dimension, and possibly other strides defined for matrix memory order) uint32_t.
pub const CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES: cublasLtMatmulAlgoCapAttributes_t = 16;
/// Minimum alignment required for B matrix in bytes (required for buffer pointer, leading
/// dimension, and possibly other strides defined for matrix memory order) uint32_t.
pub const CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES: cublasLtMatmulAlgoCapAttributes_t = 17;
/// Minimum alignment required for C matrix in bytes (required for buffer pointer, leading
/// dimension, and possibly other strides defined for matrix memory order) uint32_t.
pub const CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES: cublasLtMatmulAlgoCapAttributes_t = 18;
/// Minimum alignment required for D matrix in bytes (required for buffer pointer, leading
/// dimension, and possibly other strides defined for matrix memory order) uint32_t.
pub const CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES: cublasLtMatmulAlgoCapAttributes_t = 19;
/// EXPERIMENTAL: support for synchronization via atomic counters int32_t.
pub const CUBLASLT_ALGO_CAP_ATOMIC_SYNC: cublasLtMatmulAlgoCapAttributes_t = 20;

/// `cublasLtMatmulAlgoConfigAttributes_t`.
pub type cublasLtMatmulAlgoConfigAttributes_t = c_uint;
/// Algorithm index, see cublasLtMatmulAlgoGetIds() readonly, set by cublasLtMatmulAlgoInit()
/// int32_t.
pub const CUBLASLT_ALGO_CONFIG_ID: cublasLtMatmulAlgoConfigAttributes_t = 0;
/// Tile id, see cublasLtMatmulTile_t uint32_t, default: CUBLASLT_MATMUL_TILE_UNDEFINED.
pub const CUBLASLT_ALGO_CONFIG_TILE_ID: cublasLtMatmulAlgoConfigAttributes_t = 1;
/// Number of K splits.
pub const CUBLASLT_ALGO_CONFIG_SPLITK_NUM: cublasLtMatmulAlgoConfigAttributes_t = 2;
/// Reduction scheme, see cublasLtReductionScheme_t uint32_t, default:
/// CUBLASLT_REDUCTION_SCHEME_NONE.
pub const CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME: cublasLtMatmulAlgoConfigAttributes_t = 3;
/// Cta swizzling, change mapping from CUDA grid coordinates to parts of the matrices possible
/// values: 0, 1, other values reserved uint32_t, default: 0.
pub const CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING: cublasLtMatmulAlgoConfigAttributes_t = 4;
/// Custom option, each algorithm can support some custom options that don't fit description of the
/// other config attributes, see CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX to get accepted range for any
/// specific case uint32_t, default: 0.
pub const CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION: cublasLtMatmulAlgoConfigAttributes_t = 5;
/// Stages id, see cublasLtMatmulStages_t uint32_t, default: CUBLASLT_MATMUL_STAGES_UNDEFINED.
pub const CUBLASLT_ALGO_CONFIG_STAGES_ID: cublasLtMatmulAlgoConfigAttributes_t = 6;
/// Inner shape id, see cublasLtMatmulInnerShape_t uint16_t, default: 0
/// (CUBLASLT_MATMUL_INNER_SHAPE_UNDEFINED).
pub const CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID: cublasLtMatmulAlgoConfigAttributes_t = 7;
/// Thread Block Cluster shape id, see cublasLtClusterShape_t.
pub const CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID: cublasLtMatmulAlgoConfigAttributes_t = 8;

// The header's sizes: callers allocate these structs themselves.
const _: () = assert!(core::mem::size_of::<cublasLtMatmulDescOpaque_t>() == 256);
#[cfg(not(sim_cuda13))]
const _: () = assert!(core::mem::size_of::<cublasLtMatrixLayoutOpaque_t>() == 64);
#[cfg(sim_cuda13)]
const _: () = assert!(core::mem::size_of::<cublasLtMatrixLayoutOpaque_t>() == 112);
#[cfg(not(sim_cuda13))]
const _: () = assert!(core::mem::size_of::<cublasLtMatmulPreferenceOpaque_t>() == 64);
#[cfg(sim_cuda13)]
const _: () = assert!(core::mem::size_of::<cublasLtMatmulPreferenceOpaque_t>() == 96);
const _: () = assert!(core::mem::size_of::<cublasLtMatmulAlgo_t>() == 64);
const _: () = assert!(core::mem::size_of::<cublasLtMatmulHeuristicResult_t>() == 96);
