//! cuBLAS entry points (`cublas_api.h`, CUDA 12.8).
use core::ffi::{c_char, c_int, c_longlong, c_void};

use crate::abi::cublas::*;
use crate::abi::cudart::cudaStream_t;
use crate::abi::library_types::{cudaDataType, libraryPropertyType};

crate::dyn_api! {
    fn cublasCreate_v2(handle: *mut cublasHandle_t) -> cublasStatus_t;
    fn cublasDestroy_v2(handle: cublasHandle_t) -> cublasStatus_t;
    fn cublasGetVersion_v2(handle: cublasHandle_t, version: *mut c_int) -> cublasStatus_t;
    fn cublasGetProperty(type_: libraryPropertyType, value: *mut c_int) -> cublasStatus_t;
    fn cublasSetStream_v2(handle: cublasHandle_t, streamId: cudaStream_t) -> cublasStatus_t;
    fn cublasGetStream_v2(handle: cublasHandle_t, streamId: *mut cudaStream_t) -> cublasStatus_t;
    fn cublasSetPointerMode_v2(handle: cublasHandle_t, mode: cublasPointerMode_t) -> cublasStatus_t;
    fn cublasGetPointerMode_v2(handle: cublasHandle_t, mode: *mut cublasPointerMode_t) -> cublasStatus_t;
    fn cublasSetMathMode(handle: cublasHandle_t, mode: cublasMath_t) -> cublasStatus_t;
    fn cublasGetMathMode(handle: cublasHandle_t, mode: *mut cublasMath_t) -> cublasStatus_t;
    fn cublasSetWorkspace_v2(handle: cublasHandle_t, workspace: *mut c_void, workspaceSizeInBytes: usize) -> cublasStatus_t;
    fn cublasGetStatusName(status: cublasStatus_t) -> *const c_char;
    fn cublasGetStatusString(status: cublasStatus_t) -> *const c_char;
    fn cublasSgemm_v2(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: c_int, n: c_int, k: c_int, alpha: *const f32, A: *const f32, lda: c_int,
        B: *const f32, ldb: c_int, beta: *const f32, C: *mut f32, ldc: c_int,
    ) -> cublasStatus_t;
    fn cublasDgemm_v2(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: c_int, n: c_int, k: c_int, alpha: *const f64, A: *const f64, lda: c_int,
        B: *const f64, ldb: c_int, beta: *const f64, C: *mut f64, ldc: c_int,
    ) -> cublasStatus_t;
    fn cublasHgemm(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: c_int, n: c_int, k: c_int, alpha: *const __half, A: *const __half, lda: c_int,
        B: *const __half, ldb: c_int, beta: *const __half, C: *mut __half, ldc: c_int,
    ) -> cublasStatus_t;
    fn cublasSgemmStridedBatched(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: c_int, n: c_int, k: c_int, alpha: *const f32, A: *const f32, lda: c_int,
        strideA: c_longlong, B: *const f32, ldb: c_int, strideB: c_longlong, beta: *const f32,
        C: *mut f32, ldc: c_int, strideC: c_longlong, batchCount: c_int,
    ) -> cublasStatus_t;
    fn cublasGemmEx(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: c_int, n: c_int, k: c_int, alpha: *const c_void, A: *const c_void, Atype: cudaDataType,
        lda: c_int, B: *const c_void, Btype: cudaDataType, ldb: c_int, beta: *const c_void,
        C: *mut c_void, Ctype: cudaDataType, ldc: c_int, computeType: cublasComputeType_t,
        algo: cublasGemmAlgo_t,
    ) -> cublasStatus_t;
    fn cublasGemmStridedBatchedEx(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: c_int, n: c_int, k: c_int, alpha: *const c_void, A: *const c_void, Atype: cudaDataType,
        lda: c_int, strideA: c_longlong, B: *const c_void, Btype: cudaDataType, ldb: c_int,
        strideB: c_longlong, beta: *const c_void, C: *mut c_void, Ctype: cudaDataType, ldc: c_int,
        strideC: c_longlong, batchCount: c_int, computeType: cublasComputeType_t,
        algo: cublasGemmAlgo_t,
    ) -> cublasStatus_t;
    fn cublasGemmBatchedEx(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: c_int, n: c_int, k: c_int, alpha: *const c_void, Aarray: *const *const c_void,
        Atype: cudaDataType, lda: c_int, Barray: *const *const c_void, Btype: cudaDataType,
        ldb: c_int, beta: *const c_void, Carray: *const *mut c_void, Ctype: cudaDataType,
        ldc: c_int, batchCount: c_int, computeType: cublasComputeType_t, algo: cublasGemmAlgo_t,
    ) -> cublasStatus_t;
    fn cublasDgemmStridedBatched(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: c_int, n: c_int, k: c_int, alpha: *const f64, A: *const f64, lda: c_int,
        strideA: c_longlong, B: *const f64, ldb: c_int, strideB: c_longlong,
        beta: *const f64, C: *mut f64, ldc: c_int, strideC: c_longlong, batchCount: c_int,
    ) -> cublasStatus_t;
    fn cublasHgemmStridedBatched(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: c_int, n: c_int, k: c_int, alpha: *const __half, A: *const __half, lda: c_int,
        strideA: c_longlong, B: *const __half, ldb: c_int, strideB: c_longlong,
        beta: *const __half, C: *mut __half, ldc: c_int, strideC: c_longlong,
        batchCount: c_int,
    ) -> cublasStatus_t;
    fn cublasSgemmEx(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: c_int, n: c_int, k: c_int, alpha: *const f32, A: *const c_void,
        Atype: cudaDataType, lda: c_int, B: *const c_void, Btype: cudaDataType, ldb: c_int,
        beta: *const f32, C: *mut c_void, Ctype: cudaDataType, ldc: c_int,
    ) -> cublasStatus_t;
    fn cublasSgemmBatched(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: c_int, n: c_int, k: c_int, alpha: *const f32, Aarray: *const *const f32,
        lda: c_int, Barray: *const *const f32, ldb: c_int, beta: *const f32,
        Carray: *const *mut f32, ldc: c_int, batchCount: c_int,
    ) -> cublasStatus_t;
    fn cublasDgemmBatched(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: c_int, n: c_int, k: c_int, alpha: *const f64, Aarray: *const *const f64,
        lda: c_int, Barray: *const *const f64, ldb: c_int, beta: *const f64,
        Carray: *const *mut f64, ldc: c_int, batchCount: c_int,
    ) -> cublasStatus_t;
    fn cublasHgemmBatched(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: c_int, n: c_int, k: c_int, alpha: *const __half, Aarray: *const *const __half,
        lda: c_int, Barray: *const *const __half, ldb: c_int, beta: *const __half,
        Carray: *const *mut __half, ldc: c_int, batchCount: c_int,
    ) -> cublasStatus_t;
    fn cublasSgemm_v2_64(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: i64, n: i64, k: i64, alpha: *const f32, A: *const f32, lda: i64, B: *const f32,
        ldb: i64, beta: *const f32, C: *mut f32, ldc: i64,
    ) -> cublasStatus_t;
    fn cublasGemmEx_64(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: i64, n: i64, k: i64, alpha: *const c_void, A: *const c_void, Atype: cudaDataType,
        lda: i64, B: *const c_void, Btype: cudaDataType, ldb: i64, beta: *const c_void,
        C: *mut c_void, Ctype: cudaDataType, ldc: i64, computeType: cublasComputeType_t,
        algo: cublasGemmAlgo_t,
    ) -> cublasStatus_t;
    fn cublasGemmStridedBatchedEx_64(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: i64, n: i64, k: i64, alpha: *const c_void, A: *const c_void, Atype: cudaDataType,
        lda: i64, strideA: c_longlong, B: *const c_void, Btype: cudaDataType, ldb: i64,
        strideB: c_longlong, beta: *const c_void, C: *mut c_void, Ctype: cudaDataType,
        ldc: i64, strideC: c_longlong, batchCount: i64, computeType: cublasComputeType_t,
        algo: cublasGemmAlgo_t,
    ) -> cublasStatus_t;
    fn cublasDgemmStridedBatched_64(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: i64, n: i64, k: i64, alpha: *const f64, A: *const f64, lda: i64,
        strideA: c_longlong, B: *const f64, ldb: i64, strideB: c_longlong, beta: *const f64,
        C: *mut f64, ldc: i64, strideC: c_longlong, batchCount: i64,
    ) -> cublasStatus_t;
    fn cublasSgemv_v2(
        handle: cublasHandle_t, trans: cublasOperation_t, m: c_int, n: c_int,
        alpha: *const f32, A: *const f32, lda: c_int, x: *const f32, incx: c_int,
        beta: *const f32, y: *mut f32, incy: c_int,
    ) -> cublasStatus_t;
    fn cublasDgemv_v2(
        handle: cublasHandle_t, trans: cublasOperation_t, m: c_int, n: c_int,
        alpha: *const f64, A: *const f64, lda: c_int, x: *const f64, incx: c_int,
        beta: *const f64, y: *mut f64, incy: c_int,
    ) -> cublasStatus_t;
    fn cublasSetVector(n: c_int, elemSize: c_int, x: *const c_void, incx: c_int, devicePtr: *mut c_void, incy: c_int) -> cublasStatus_t;
    fn cublasSetVector_64(n: i64, elemSize: i64, x: *const c_void, incx: i64, devicePtr: *mut c_void, incy: i64) -> cublasStatus_t;
    fn cublasGetVector(n: c_int, elemSize: c_int, x: *const c_void, incx: c_int, y: *mut c_void, incy: c_int) -> cublasStatus_t;
    fn cublasGetVector_64(n: i64, elemSize: i64, x: *const c_void, incx: i64, y: *mut c_void, incy: i64) -> cublasStatus_t;
    fn cublasSetMatrix(rows: c_int, cols: c_int, elemSize: c_int, A: *const c_void, lda: c_int, B: *mut c_void, ldb: c_int) -> cublasStatus_t;
    fn cublasSetMatrix_64(rows: i64, cols: i64, elemSize: i64, A: *const c_void, lda: i64, B: *mut c_void, ldb: i64) -> cublasStatus_t;
    fn cublasGetMatrix(rows: c_int, cols: c_int, elemSize: c_int, A: *const c_void, lda: c_int, B: *mut c_void, ldb: c_int) -> cublasStatus_t;
    fn cublasGetMatrix_64(rows: i64, cols: i64, elemSize: i64, A: *const c_void, lda: i64, B: *mut c_void, ldb: i64) -> cublasStatus_t;
    fn cublasSetVectorAsync(n: c_int, elemSize: c_int, hostPtr: *const c_void, incx: c_int, devicePtr: *mut c_void, incy: c_int, stream: cudaStream_t) -> cublasStatus_t;
    fn cublasSetVectorAsync_64(n: i64, elemSize: i64, hostPtr: *const c_void, incx: i64, devicePtr: *mut c_void, incy: i64, stream: cudaStream_t) -> cublasStatus_t;
    fn cublasGetVectorAsync(n: c_int, elemSize: c_int, devicePtr: *const c_void, incx: c_int, hostPtr: *mut c_void, incy: c_int, stream: cudaStream_t) -> cublasStatus_t;
    fn cublasGetVectorAsync_64(n: i64, elemSize: i64, devicePtr: *const c_void, incx: i64, hostPtr: *mut c_void, incy: i64, stream: cudaStream_t) -> cublasStatus_t;
    fn cublasSetMatrixAsync(rows: c_int, cols: c_int, elemSize: c_int, A: *const c_void, lda: c_int, B: *mut c_void, ldb: c_int, stream: cudaStream_t) -> cublasStatus_t;
    fn cublasSetMatrixAsync_64(rows: i64, cols: i64, elemSize: i64, A: *const c_void, lda: i64, B: *mut c_void, ldb: i64, stream: cudaStream_t) -> cublasStatus_t;
    fn cublasGetMatrixAsync(rows: c_int, cols: c_int, elemSize: c_int, A: *const c_void, lda: c_int, B: *mut c_void, ldb: c_int, stream: cudaStream_t) -> cublasStatus_t;
    fn cublasGetMatrixAsync_64(rows: i64, cols: i64, elemSize: i64, A: *const c_void, lda: i64, B: *mut c_void, ldb: i64, stream: cudaStream_t) -> cublasStatus_t;
    fn cublasSaxpy_v2(handle: cublasHandle_t, n: c_int, alpha: *const f32, x: *const f32, incx: c_int, y: *mut f32, incy: c_int) -> cublasStatus_t;
    fn cublasSscal_v2(handle: cublasHandle_t, n: c_int, alpha: *const f32, x: *mut f32, incx: c_int) -> cublasStatus_t;
    fn cublasSdot_v2(handle: cublasHandle_t, n: c_int, x: *const f32, incx: c_int, y: *const f32, incy: c_int, result: *mut f32) -> cublasStatus_t;
    fn cublasSgeam(
        handle: cublasHandle_t, transa: cublasOperation_t, transb: cublasOperation_t,
        m: c_int, n: c_int, alpha: *const f32, A: *const f32, lda: c_int,
        beta: *const f32, B: *const f32, ldb: c_int, C: *mut f32, ldc: c_int,
    ) -> cublasStatus_t;
}
