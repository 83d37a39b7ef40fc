//! cuBLASLt entry points (`cublasLt.h`, CUDA 12.8).
use core::ffi::{c_int, c_void};

use crate::abi::cublas::{cublasComputeType_t, cublasStatus_t};
use crate::abi::cublaslt::*;
use crate::abi::cudart::cudaStream_t;
use crate::abi::library_types::libraryPropertyType;
use crate::abi::library_types::{cudaDataType, cudaDataType_t};

crate::dyn_api! {
    fn cublasLtCreate(lightHandle: *mut cublasLtHandle_t) -> cublasStatus_t;
    fn cublasLtDestroy(lightHandle: cublasLtHandle_t) -> cublasStatus_t;
    fn cublasLtGetVersion() -> usize;
    fn cublasLtGetProperty(type_: libraryPropertyType, value: *mut c_int) -> cublasStatus_t;
    fn cublasLtMatmulDescCreate(matmulDesc: *mut cublasLtMatmulDesc_t, computeType: cublasComputeType_t, scaleType: cudaDataType_t) -> cublasStatus_t;
    fn cublasLtMatmulDescInit_internal(matmulDesc: cublasLtMatmulDesc_t, size: usize, computeType: cublasComputeType_t, scaleType: cudaDataType_t) -> cublasStatus_t;
    fn cublasLtMatmulDescDestroy(matmulDesc: cublasLtMatmulDesc_t) -> cublasStatus_t;
    fn cublasLtMatmulDescSetAttribute(matmulDesc: cublasLtMatmulDesc_t, attr: cublasLtMatmulDescAttributes_t, buf: *const c_void, sizeInBytes: usize) -> cublasStatus_t;
    fn cublasLtMatmulDescGetAttribute(matmulDesc: cublasLtMatmulDesc_t, attr: cublasLtMatmulDescAttributes_t, buf: *mut c_void, sizeInBytes: usize, sizeWritten: *mut usize) -> cublasStatus_t;
    fn cublasLtMatrixLayoutCreate(matLayout: *mut cublasLtMatrixLayout_t, type_: cudaDataType, rows: u64, cols: u64, ld: i64) -> cublasStatus_t;
    fn cublasLtMatrixLayoutInit_internal(matLayout: cublasLtMatrixLayout_t, size: usize, type_: cudaDataType, rows: u64, cols: u64, ld: i64) -> cublasStatus_t;
    fn cublasLtMatrixLayoutDestroy(matLayout: cublasLtMatrixLayout_t) -> cublasStatus_t;
    fn cublasLtMatrixLayoutSetAttribute(matLayout: cublasLtMatrixLayout_t, attr: cublasLtMatrixLayoutAttribute_t, buf: *const c_void, sizeInBytes: usize) -> cublasStatus_t;
    fn cublasLtMatrixLayoutGetAttribute(matLayout: cublasLtMatrixLayout_t, attr: cublasLtMatrixLayoutAttribute_t, buf: *mut c_void, sizeInBytes: usize, sizeWritten: *mut usize) -> cublasStatus_t;
    fn cublasLtMatmulPreferenceCreate(pref: *mut cublasLtMatmulPreference_t) -> cublasStatus_t;
    fn cublasLtMatmulPreferenceInit_internal(pref: cublasLtMatmulPreference_t, size: usize) -> cublasStatus_t;
    fn cublasLtMatmulPreferenceDestroy(pref: cublasLtMatmulPreference_t) -> cublasStatus_t;
    fn cublasLtMatmulPreferenceSetAttribute(pref: cublasLtMatmulPreference_t, attr: cublasLtMatmulPreferenceAttributes_t, buf: *const c_void, sizeInBytes: usize) -> cublasStatus_t;
    fn cublasLtMatmulPreferenceGetAttribute(pref: cublasLtMatmulPreference_t, attr: cublasLtMatmulPreferenceAttributes_t, buf: *mut c_void, sizeInBytes: usize, sizeWritten: *mut usize) -> cublasStatus_t;
    fn cublasLtMatmulAlgoGetHeuristic(
        lightHandle: cublasLtHandle_t, operationDesc: cublasLtMatmulDesc_t,
        Adesc: cublasLtMatrixLayout_t, Bdesc: cublasLtMatrixLayout_t, Cdesc: cublasLtMatrixLayout_t,
        Ddesc: cublasLtMatrixLayout_t, preference: cublasLtMatmulPreference_t,
        requestedAlgoCount: c_int, heuristicResultsArray: *mut cublasLtMatmulHeuristicResult_t,
        returnAlgoCount: *mut c_int,
    ) -> cublasStatus_t;
    fn cublasLtMatmul(
        lightHandle: cublasLtHandle_t, computeDesc: cublasLtMatmulDesc_t, alpha: *const c_void,
        A: *const c_void, Adesc: cublasLtMatrixLayout_t, B: *const c_void, Bdesc: cublasLtMatrixLayout_t,
        beta: *const c_void, C: *const c_void, Cdesc: cublasLtMatrixLayout_t, D: *mut c_void,
        Ddesc: cublasLtMatrixLayout_t, algo: *const cublasLtMatmulAlgo_t, workspace: *mut c_void,
        workspaceSizeInBytes: usize, stream: cudaStream_t,
    ) -> cublasStatus_t;
    fn cublasLtMatrixTransformDescCreate(transformDesc: *mut cublasLtMatrixTransformDesc_t, scaleType: cudaDataType) -> cublasStatus_t;
    fn cublasLtMatrixTransformDescInit_internal(transformDesc: cublasLtMatrixTransformDesc_t, size: usize, scaleType: cudaDataType) -> cublasStatus_t;
    fn cublasLtMatrixTransformDescDestroy(transformDesc: cublasLtMatrixTransformDesc_t) -> cublasStatus_t;
    fn cublasLtMatrixTransformDescSetAttribute(transformDesc: cublasLtMatrixTransformDesc_t, attr: cublasLtMatrixTransformDescAttributes_t, buf: *const c_void, sizeInBytes: usize) -> cublasStatus_t;
    fn cublasLtMatrixTransformDescGetAttribute(transformDesc: cublasLtMatrixTransformDesc_t, attr: cublasLtMatrixTransformDescAttributes_t, buf: *mut c_void, sizeInBytes: usize, sizeWritten: *mut usize) -> cublasStatus_t;
    fn cublasLtMatrixTransform(
        lightHandle: cublasLtHandle_t, transformDesc: cublasLtMatrixTransformDesc_t,
        alpha: *const c_void, A: *const c_void, Adesc: cublasLtMatrixLayout_t,
        beta: *const c_void, B: *const c_void, Bdesc: cublasLtMatrixLayout_t,
        C: *mut c_void, Cdesc: cublasLtMatrixLayout_t, stream: cudaStream_t,
    ) -> cublasStatus_t;
}
