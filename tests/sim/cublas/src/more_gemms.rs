//! GEMM entry points beyond the core ones of lib.rs, each a thin shim over the same validated
//! kernel path: the typed strided batches of f64 and f16, `cublasSgemmEx`, the pointer-array
//! `cublas{S,D,H}gemmBatched`, the f32 and f64 gemv (as GEMMs), and the `_64` variants (64-bit
//! sizes) of the GEMMs the simulator computes. Sizes beyond `int` are refused with
//! `CUBLAS_STATUS_NOT_SUPPORTED`: the simulator computes on the host, where such matrices do
//! not fit.

use core::ffi::{c_int, c_longlong, c_void};

use cuda_abi::cublas::*;
use cuda_abi::library_types::*;
use sim_blas::guard;
use sim_kernels::dtype::DType;
use sim_kernels::gemm::Compute;

use crate::{ex_types, gemm_ex_supported, sgemm_compute, state, strided_gemm, GemmCall};

/// A 64-bit size as `int`, or `None` when it does not fit.
fn narrow(v: i64) -> Option<c_int> {
    c_int::try_from(v).ok()
}

/// One matrix argument: pointer, leading dimension, batch stride.
type Mat = (*const c_void, i64, c_longlong);

/// Validates and enqueues a GEMM given with sizes of either width.
///
/// # Safety
/// cuBLAS's contract for the arguments.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_any(
    handle: cublasHandle_t,
    [transa, transb]: [cublasOperation_t; 2],
    [m, n, k]: [i64; 3],
    [alpha, beta]: [*const c_void; 2],
    [a, b, c]: [Mat; 3],
    [a_type, b_type, c_type]: [DType; 3],
    batch: i64,
    compute: Compute,
    scale_type: DType,
) -> cublasStatus_t {
    if let Err(e) = state(handle) {
        return e;
    }
    let sizes = [m, n, k, a.1, b.1, c.1, batch].map(narrow);
    let [Some(m), Some(n), Some(k), Some(lda), Some(ldb), Some(ldc), Some(batch)] = sizes else {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    };
    let call = GemmCall {
        handle,
        transa,
        transb,
        m,
        n,
        k,
        alpha,
        beta,
        a_type,
        b_type,
        c_type,
        lda,
        ldb,
        ldc,
        batch,
        strides: [a.2, b.2, c.2],
        compute,
        scale_type,
    };
    // SAFETY: per the contract.
    unsafe { strided_gemm(call, a.0, b.0, c.0.cast_mut()) }
}

/// [`gemm_any`] for an `Ex` call: the types and compute checked as `cublasGemmEx` does.
///
/// # Safety
/// cuBLAS's contract for the arguments.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_ex_any(
    handle: cublasHandle_t,
    ops: [cublasOperation_t; 2],
    mnk: [i64; 3],
    scalars: [*const c_void; 2],
    mats: [Mat; 3],
    types: [cudaDataType; 3],
    batch: i64,
    compute: cublasComputeType_t,
    algo: cublasGemmAlgo_t,
) -> cublasStatus_t {
    if let Err(e) = state(handle) {
        return e;
    }
    match ex_types(types[0], types[1], types[2], compute, algo) {
        Ok((a, b, c, comp)) => {
            // SAFETY: per the contract.
            unsafe {
                gemm_any(
                    handle,
                    ops,
                    mnk,
                    scalars,
                    mats,
                    [a, b, c],
                    batch,
                    comp,
                    comp.default_scale_type(),
                )
            }
        }
        Err(e) => e,
    }
}

/// `cublasDgemmStridedBatched`.
#[no_mangle]
pub unsafe extern "C" fn cublasDgemmStridedBatched(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f64,
    A: *const f64,
    lda: c_int,
    strideA: c_longlong,
    B: *const f64,
    ldb: c_int,
    strideB: c_longlong,
    beta: *const f64,
    C: *mut f64,
    ldc: c_int,
    strideC: c_longlong,
    batchCount: c_int,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            gemm_any(
                handle,
                [transa, transb],
                [m.into(), n.into(), k.into()],
                [alpha.cast(), beta.cast()],
                [
                    (A.cast(), lda.into(), strideA),
                    (B.cast(), ldb.into(), strideB),
                    (C.cast_const().cast(), ldc.into(), strideC),
                ],
                [DType::F64; 3],
                batchCount.into(),
                Compute::F64,
                DType::F64,
            )
        }
    })
}

/// `cublasHgemmStridedBatched`.
#[no_mangle]
pub unsafe extern "C" fn cublasHgemmStridedBatched(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const __half,
    A: *const __half,
    lda: c_int,
    strideA: c_longlong,
    B: *const __half,
    ldb: c_int,
    strideB: c_longlong,
    beta: *const __half,
    C: *mut __half,
    ldc: c_int,
    strideC: c_longlong,
    batchCount: c_int,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            gemm_any(
                handle,
                [transa, transb],
                [m.into(), n.into(), k.into()],
                [alpha.cast(), beta.cast()],
                [
                    (A.cast(), lda.into(), strideA),
                    (B.cast(), ldb.into(), strideB),
                    (C.cast_const().cast(), ldc.into(), strideC),
                ],
                [DType::F16; 3],
                batchCount.into(),
                Compute::F16,
                DType::F16,
            )
        }
    })
}

/// `cublasSgemm_v2_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasSgemm_v2_64(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    alpha: *const f32,
    A: *const f32,
    lda: i64,
    B: *const f32,
    ldb: i64,
    beta: *const f32,
    C: *mut f32,
    ldc: i64,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            gemm_any(
                handle,
                [transa, transb],
                [m, n, k],
                [alpha.cast(), beta.cast()],
                [
                    (A.cast(), lda, 0),
                    (B.cast(), ldb, 0),
                    (C.cast_const().cast(), ldc, 0),
                ],
                [DType::F32; 3],
                1,
                sgemm_compute(handle),
                DType::F32,
            )
        }
    })
}

/// `cublasSgemmStridedBatched_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasSgemmStridedBatched_64(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    alpha: *const f32,
    A: *const f32,
    lda: i64,
    strideA: c_longlong,
    B: *const f32,
    ldb: i64,
    strideB: c_longlong,
    beta: *const f32,
    C: *mut f32,
    ldc: i64,
    strideC: c_longlong,
    batchCount: i64,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            gemm_any(
                handle,
                [transa, transb],
                [m, n, k],
                [alpha.cast(), beta.cast()],
                [
                    (A.cast(), lda, strideA),
                    (B.cast(), ldb, strideB),
                    (C.cast_const().cast(), ldc, strideC),
                ],
                [DType::F32; 3],
                batchCount,
                sgemm_compute(handle),
                DType::F32,
            )
        }
    })
}

/// `cublasDgemm_v2_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasDgemm_v2_64(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    alpha: *const f64,
    A: *const f64,
    lda: i64,
    B: *const f64,
    ldb: i64,
    beta: *const f64,
    C: *mut f64,
    ldc: i64,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            gemm_any(
                handle,
                [transa, transb],
                [m, n, k],
                [alpha.cast(), beta.cast()],
                [
                    (A.cast(), lda, 0),
                    (B.cast(), ldb, 0),
                    (C.cast_const().cast(), ldc, 0),
                ],
                [DType::F64; 3],
                1,
                Compute::F64,
                DType::F64,
            )
        }
    })
}

/// `cublasDgemmStridedBatched_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasDgemmStridedBatched_64(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    alpha: *const f64,
    A: *const f64,
    lda: i64,
    strideA: c_longlong,
    B: *const f64,
    ldb: i64,
    strideB: c_longlong,
    beta: *const f64,
    C: *mut f64,
    ldc: i64,
    strideC: c_longlong,
    batchCount: i64,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            gemm_any(
                handle,
                [transa, transb],
                [m, n, k],
                [alpha.cast(), beta.cast()],
                [
                    (A.cast(), lda, strideA),
                    (B.cast(), ldb, strideB),
                    (C.cast_const().cast(), ldc, strideC),
                ],
                [DType::F64; 3],
                batchCount,
                Compute::F64,
                DType::F64,
            )
        }
    })
}

/// `cublasHgemm_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasHgemm_64(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    alpha: *const __half,
    A: *const __half,
    lda: i64,
    B: *const __half,
    ldb: i64,
    beta: *const __half,
    C: *mut __half,
    ldc: i64,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            gemm_any(
                handle,
                [transa, transb],
                [m, n, k],
                [alpha.cast(), beta.cast()],
                [
                    (A.cast(), lda, 0),
                    (B.cast(), ldb, 0),
                    (C.cast_const().cast(), ldc, 0),
                ],
                [DType::F16; 3],
                1,
                Compute::F16,
                DType::F16,
            )
        }
    })
}

/// `cublasHgemmStridedBatched_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasHgemmStridedBatched_64(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    alpha: *const __half,
    A: *const __half,
    lda: i64,
    strideA: c_longlong,
    B: *const __half,
    ldb: i64,
    strideB: c_longlong,
    beta: *const __half,
    C: *mut __half,
    ldc: i64,
    strideC: c_longlong,
    batchCount: i64,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            gemm_any(
                handle,
                [transa, transb],
                [m, n, k],
                [alpha.cast(), beta.cast()],
                [
                    (A.cast(), lda, strideA),
                    (B.cast(), ldb, strideB),
                    (C.cast_const().cast(), ldc, strideC),
                ],
                [DType::F16; 3],
                batchCount,
                Compute::F16,
                DType::F16,
            )
        }
    })
}

/// `cublasSgemmEx`: typed operands, f32 scalars and accumulation under the handle's math mode (the
/// type combinations of `cublasGemmEx` with an f32 compute type).
#[no_mangle]
pub unsafe extern "C" fn cublasSgemmEx(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    A: *const c_void,
    Atype: cudaDataType,
    lda: c_int,
    B: *const c_void,
    Btype: cudaDataType,
    ldb: c_int,
    beta: *const f32,
    C: *mut c_void,
    Ctype: cudaDataType,
    ldc: c_int,
) -> cublasStatus_t {
    guard(|| {
        let compute = sgemm_compute(handle);
        let (Some(a), Some(b), Some(c)) = (
            DType::from_cuda(Atype),
            DType::from_cuda(Btype),
            DType::from_cuda(Ctype),
        ) else {
            return CUBLAS_STATUS_NOT_SUPPORTED;
        };
        if !gemm_ex_supported(Compute::F32, DType::F32, a, b, c) {
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            gemm_any(
                handle,
                [transa, transb],
                [m.into(), n.into(), k.into()],
                [alpha.cast(), beta.cast()],
                [
                    (A, lda.into(), 0),
                    (B, ldb.into(), 0),
                    (C.cast_const(), ldc.into(), 0),
                ],
                [a, b, c],
                1,
                compute,
                DType::F32,
            )
        }
    })
}

/// `cublasSgemmEx_64`: `cublasSgemmEx` with 64-bit sizes.
#[no_mangle]
pub unsafe extern "C" fn cublasSgemmEx_64(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    alpha: *const f32,
    A: *const c_void,
    Atype: cudaDataType,
    lda: i64,
    B: *const c_void,
    Btype: cudaDataType,
    ldb: i64,
    beta: *const f32,
    C: *mut c_void,
    Ctype: cudaDataType,
    ldc: i64,
) -> cublasStatus_t {
    guard(|| {
        let compute = sgemm_compute(handle);
        let (Some(a), Some(b), Some(c)) = (
            DType::from_cuda(Atype),
            DType::from_cuda(Btype),
            DType::from_cuda(Ctype),
        ) else {
            return CUBLAS_STATUS_NOT_SUPPORTED;
        };
        if !gemm_ex_supported(Compute::F32, DType::F32, a, b, c) {
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            gemm_any(
                handle,
                [transa, transb],
                [m, n, k],
                [alpha.cast(), beta.cast()],
                [(A, lda, 0), (B, ldb, 0), (C.cast_const(), ldc, 0)],
                [a, b, c],
                1,
                compute,
                DType::F32,
            )
        }
    })
}

/// `cublasGemmEx_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasGemmEx_64(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    alpha: *const c_void,
    A: *const c_void,
    Atype: cudaDataType,
    lda: i64,
    B: *const c_void,
    Btype: cudaDataType,
    ldb: i64,
    beta: *const c_void,
    C: *mut c_void,
    Ctype: cudaDataType,
    ldc: i64,
    computeType: cublasComputeType_t,
    algo: cublasGemmAlgo_t,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            gemm_ex_any(
                handle,
                [transa, transb],
                [m, n, k],
                [alpha, beta],
                [(A, lda, 0), (B, ldb, 0), (C.cast_const(), ldc, 0)],
                [Atype, Btype, Ctype],
                1,
                computeType,
                algo,
            )
        }
    })
}

/// `cublasGemmStridedBatchedEx_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasGemmStridedBatchedEx_64(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    alpha: *const c_void,
    A: *const c_void,
    Atype: cudaDataType,
    lda: i64,
    strideA: c_longlong,
    B: *const c_void,
    Btype: cudaDataType,
    ldb: i64,
    strideB: c_longlong,
    beta: *const c_void,
    C: *mut c_void,
    Ctype: cudaDataType,
    ldc: i64,
    strideC: c_longlong,
    batchCount: i64,
    computeType: cublasComputeType_t,
    algo: cublasGemmAlgo_t,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            gemm_ex_any(
                handle,
                [transa, transb],
                [m, n, k],
                [alpha, beta],
                [
                    (A, lda, strideA),
                    (B, ldb, strideB),
                    (C.cast_const(), ldc, strideC),
                ],
                [Atype, Btype, Ctype],
                batchCount,
                computeType,
                algo,
            )
        }
    })
}

/// `cublasSgemmBatched`: the f32 pointer-array batch, as `cublasGemmBatchedEx` computes it under
/// the handle's math mode.
#[no_mangle]
pub unsafe extern "C" fn cublasSgemmBatched(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    Aarray: *const *const f32,
    lda: c_int,
    Barray: *const *const f32,
    ldb: c_int,
    beta: *const f32,
    Carray: *const *mut f32,
    ldc: c_int,
    batchCount: c_int,
) -> cublasStatus_t {
    let compute = match sgemm_compute(handle) {
        Compute::F32FastTF32 => CUBLAS_COMPUTE_32F_FAST_TF32,
        Compute::F32Fast16F => CUBLAS_COMPUTE_32F_FAST_16F,
        _ => CUBLAS_COMPUTE_32F,
    };
    // SAFETY: the same contract, with the f32 types spelled out.
    unsafe {
        crate::cublasGemmBatchedEx(
            handle,
            transa,
            transb,
            m,
            n,
            k,
            alpha.cast(),
            Aarray.cast(),
            CUDA_R_32F,
            lda,
            Barray.cast(),
            CUDA_R_32F,
            ldb,
            beta.cast(),
            Carray.cast(),
            CUDA_R_32F,
            ldc,
            batchCount,
            compute,
            CUBLAS_GEMM_DEFAULT,
        )
    }
}

/// `cublasDgemmBatched`: the f64 pointer-array batch, as `cublasGemmBatchedEx` computes it.
#[no_mangle]
pub unsafe extern "C" fn cublasDgemmBatched(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f64,
    Aarray: *const *const f64,
    lda: c_int,
    Barray: *const *const f64,
    ldb: c_int,
    beta: *const f64,
    Carray: *const *mut f64,
    ldc: c_int,
    batchCount: c_int,
) -> cublasStatus_t {
    // SAFETY: the same contract, with the f64 types spelled out.
    unsafe {
        crate::cublasGemmBatchedEx(
            handle,
            transa,
            transb,
            m,
            n,
            k,
            alpha.cast(),
            Aarray.cast(),
            CUDA_R_64F,
            lda,
            Barray.cast(),
            CUDA_R_64F,
            ldb,
            beta.cast(),
            Carray.cast(),
            CUDA_R_64F,
            ldc,
            batchCount,
            CUBLAS_COMPUTE_64F,
            CUBLAS_GEMM_DEFAULT,
        )
    }
}

/// `cublasHgemmBatched`: the f16 pointer-array batch, as `cublasGemmBatchedEx` computes it
/// (f16 compute and scalars).
#[no_mangle]
pub unsafe extern "C" fn cublasHgemmBatched(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const __half,
    Aarray: *const *const __half,
    lda: c_int,
    Barray: *const *const __half,
    ldb: c_int,
    beta: *const __half,
    Carray: *const *mut __half,
    ldc: c_int,
    batchCount: c_int,
) -> cublasStatus_t {
    // SAFETY: the same contract, with the f16 types spelled out.
    unsafe {
        crate::cublasGemmBatchedEx(
            handle,
            transa,
            transb,
            m,
            n,
            k,
            alpha.cast(),
            Aarray.cast(),
            CUDA_R_16F,
            lda,
            Barray.cast(),
            CUDA_R_16F,
            ldb,
            beta.cast(),
            Carray.cast(),
            CUDA_R_16F,
            ldc,
            batchCount,
            CUBLAS_COMPUTE_16F,
            CUBLAS_GEMM_DEFAULT,
        )
    }
}

/// A gemv as the GEMM it is: `op(A)` times `x` read as a transposed `1 x K` matrix (leading
/// dimension `incx`), into `y` (`M x 1`), computed like a GEMM of the type (no tensor-op math).
/// A strided output (`incy > 1`) is computed as the transposed product. Reversed vectors
/// (`incx < 1`, `incy < 1`) are refused with `CUBLAS_STATUS_NOT_SUPPORTED` (the simulator's
/// limit, not cuBLAS's).
///
/// # Safety
/// cuBLAS's contract for the arguments.
#[allow(clippy::too_many_arguments)]
unsafe fn gemv(
    handle: cublasHandle_t,
    trans: cublasOperation_t,
    [m, n]: [i64; 2],
    scalars: [*const c_void; 2],
    (a, lda): (*const c_void, i64),
    (x, incx): (*const c_void, i64),
    (y, incy): (*const c_void, i64),
    (t, compute): (DType, Compute),
) -> cublasStatus_t {
    if let Err(e) = state(handle) {
        return e;
    }
    if incy < 1 || incx < 1 {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    let (rows, cols) = if trans == CUBLAS_OP_N { (m, n) } else { (n, m) };
    if incy != 1 {
        // A strided y is a `1 x M` matrix with leading dimension `incy`: the transposed
        // product `y^T = x^T op(A)^T`, x a `1 x K` matrix with leading dimension `incx`.
        let flip = if trans == CUBLAS_OP_N {
            CUBLAS_OP_T
        } else {
            CUBLAS_OP_N
        };
        // SAFETY: per the contract.
        return unsafe {
            gemm_any(
                handle,
                [CUBLAS_OP_N, flip],
                [1, rows, cols],
                scalars,
                [(x, incx, 0), (a, lda, 0), (y, incy, 0)],
                [t; 3],
                1,
                compute,
                t,
            )
        };
    }
    // SAFETY: per the contract.
    unsafe {
        gemm_any(
            handle,
            [trans, CUBLAS_OP_T],
            [rows, 1, cols],
            scalars,
            [(a, lda, 0), (x, incx, 0), (y, rows.max(1), 0)],
            [t; 3],
            1,
            compute,
            t,
        )
    }
}

/// `cublasSgemv_v2`: see [`gemv`].
#[no_mangle]
pub unsafe extern "C" fn cublasSgemv_v2(
    handle: cublasHandle_t,
    trans: cublasOperation_t,
    m: c_int,
    n: c_int,
    alpha: *const f32,
    A: *const f32,
    lda: c_int,
    x: *const f32,
    incx: c_int,
    beta: *const f32,
    y: *mut f32,
    incy: c_int,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            gemv(
                handle,
                trans,
                [m.into(), n.into()],
                [alpha.cast(), beta.cast()],
                (A.cast(), lda.into()),
                (x.cast(), incx.into()),
                (y.cast_const().cast(), incy.into()),
                (DType::F32, Compute::F32),
            )
        }
    })
}

/// `cublasDgemv_v2`: see [`gemv`].
#[no_mangle]
pub unsafe extern "C" fn cublasDgemv_v2(
    handle: cublasHandle_t,
    trans: cublasOperation_t,
    m: c_int,
    n: c_int,
    alpha: *const f64,
    A: *const f64,
    lda: c_int,
    x: *const f64,
    incx: c_int,
    beta: *const f64,
    y: *mut f64,
    incy: c_int,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            gemv(
                handle,
                trans,
                [m.into(), n.into()],
                [alpha.cast(), beta.cast()],
                (A.cast(), lda.into()),
                (x.cast(), incx.into()),
                (y.cast_const().cast(), incy.into()),
                (DType::F64, Compute::F64),
            )
        }
    })
}

/// The `int` values of a `_64` call's sizes, or `None` when one does not fit.
fn narrow_all<const N: usize>(v: [i64; N]) -> Option<[c_int; N]> {
    let mut out = [0; N];
    for (o, x) in out.iter_mut().zip(v) {
        *o = narrow(x)?;
    }
    Some(out)
}

/// `cublasSgemmBatched_64`: `cublasSgemmBatched` when every size fits in `int`.
#[no_mangle]
pub unsafe extern "C" fn cublasSgemmBatched_64(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    alpha: *const f32,
    Aarray: *const *const f32,
    lda: i64,
    Barray: *const *const f32,
    ldb: i64,
    beta: *const f32,
    Carray: *const *mut f32,
    ldc: i64,
    batchCount: i64,
) -> cublasStatus_t {
    let Some([m, n, k, lda, ldb, ldc, batch]) = narrow_all([m, n, k, lda, ldb, ldc, batchCount])
    else {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    };
    // SAFETY: the same contract at `int` width.
    unsafe {
        cublasSgemmBatched(
            handle, transa, transb, m, n, k, alpha, Aarray, lda, Barray, ldb, beta, Carray, ldc,
            batch,
        )
    }
}

/// `cublasDgemmBatched_64`: `cublasDgemmBatched` when every size fits in `int`.
#[no_mangle]
pub unsafe extern "C" fn cublasDgemmBatched_64(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    alpha: *const f64,
    Aarray: *const *const f64,
    lda: i64,
    Barray: *const *const f64,
    ldb: i64,
    beta: *const f64,
    Carray: *const *mut f64,
    ldc: i64,
    batchCount: i64,
) -> cublasStatus_t {
    let Some([m, n, k, lda, ldb, ldc, batch]) = narrow_all([m, n, k, lda, ldb, ldc, batchCount])
    else {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    };
    // SAFETY: the same contract at `int` width.
    unsafe {
        cublasDgemmBatched(
            handle, transa, transb, m, n, k, alpha, Aarray, lda, Barray, ldb, beta, Carray, ldc,
            batch,
        )
    }
}

/// `cublasHgemmBatched_64`: `cublasHgemmBatched` when every size fits in `int`.
#[no_mangle]
pub unsafe extern "C" fn cublasHgemmBatched_64(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    alpha: *const __half,
    Aarray: *const *const __half,
    lda: i64,
    Barray: *const *const __half,
    ldb: i64,
    beta: *const __half,
    Carray: *const *mut __half,
    ldc: i64,
    batchCount: i64,
) -> cublasStatus_t {
    let Some([m, n, k, lda, ldb, ldc, batch]) = narrow_all([m, n, k, lda, ldb, ldc, batchCount])
    else {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    };
    // SAFETY: the same contract at `int` width.
    unsafe {
        cublasHgemmBatched(
            handle, transa, transb, m, n, k, alpha, Aarray, lda, Barray, ldb, beta, Carray, ldc,
            batch,
        )
    }
}

/// `cublasSgemv_v2_64`: `cublasSgemv_v2` when every size fits in `int`.
#[no_mangle]
pub unsafe extern "C" fn cublasSgemv_v2_64(
    handle: cublasHandle_t,
    trans: cublasOperation_t,
    m: i64,
    n: i64,
    alpha: *const f32,
    A: *const f32,
    lda: i64,
    x: *const f32,
    incx: i64,
    beta: *const f32,
    y: *mut f32,
    incy: i64,
) -> cublasStatus_t {
    let Some([m, n, lda, incx, incy]) = narrow_all([m, n, lda, incx, incy]) else {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    };
    // SAFETY: the same contract at `int` width.
    unsafe { cublasSgemv_v2(handle, trans, m, n, alpha, A, lda, x, incx, beta, y, incy) }
}

/// `cublasDgemv_v2_64`: `cublasDgemv_v2` when every size fits in `int`.
#[no_mangle]
pub unsafe extern "C" fn cublasDgemv_v2_64(
    handle: cublasHandle_t,
    trans: cublasOperation_t,
    m: i64,
    n: i64,
    alpha: *const f64,
    A: *const f64,
    lda: i64,
    x: *const f64,
    incx: i64,
    beta: *const f64,
    y: *mut f64,
    incy: i64,
) -> cublasStatus_t {
    let Some([m, n, lda, incx, incy]) = narrow_all([m, n, lda, incx, incy]) else {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    };
    // SAFETY: the same contract at `int` width.
    unsafe { cublasDgemv_v2(handle, trans, m, n, alpha, A, lda, x, incx, beta, y, incy) }
}

/// `cublasGemmBatchedEx_64`: `cublasGemmBatchedEx` when every size fits in `int`.
#[no_mangle]
pub unsafe extern "C" fn cublasGemmBatchedEx_64(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    alpha: *const c_void,
    Aarray: *const *const c_void,
    Atype: cudaDataType,
    lda: i64,
    Barray: *const *const c_void,
    Btype: cudaDataType,
    ldb: i64,
    beta: *const c_void,
    Carray: *const *mut c_void,
    Ctype: cudaDataType,
    ldc: i64,
    batchCount: i64,
    computeType: cublasComputeType_t,
    algo: cublasGemmAlgo_t,
) -> cublasStatus_t {
    let Some([m, n, k, lda, ldb, ldc, batch]) = narrow_all([m, n, k, lda, ldb, ldc, batchCount])
    else {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    };
    // SAFETY: the same contract at `int` width.
    unsafe {
        crate::cublasGemmBatchedEx(
            handle,
            transa,
            transb,
            m,
            n,
            k,
            alpha,
            Aarray,
            Atype,
            lda,
            Barray,
            Btype,
            ldb,
            beta,
            Carray,
            Ctype,
            ldc,
            batch,
            computeType,
            algo,
        )
    }
}
