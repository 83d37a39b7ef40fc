//! cuBLAS GEMM hooks. cuBLAS calls carry no stream: the snapshot runs on the handle's stream
//! at call time (real `cublasGetStream_v2`). alpha and beta are read on the host only in host
//! pointer mode (real `cublasGetPointerMode_v2`); in device mode they are snapshotted as
//! tensors and C is taken before the op whatever beta is.
//!
//! The single-precision routines (`cublasSgemm_v2`, `cublasSgemmStridedBatched`) compute as the
//! handle's math mode says (real `cublasGetMathMode`): their record carries the compute type in
//! effect (`CUBLAS_COMPUTE_32F_FAST_TF32` under `CUBLAS_TF32_TENSOR_OP_MATH`, as PyTorch sets
//! it for `allow_tf32`), so the GEMM can be recomputed. The `*Ex` functions follow their
//! explicit compute type.
//!
//! `cublasGemmBatchedEx` takes arrays of matrix pointers that live in device memory: the host
//! cannot know the matrices without reading those arrays, i.e. synchronising, which the tracer
//! never does. The call is recorded as a `ShapeUnknown` gap carrying its parameters.

use core::ffi::{c_int, c_longlong, c_void};

use cuda_abi::cublas::*;
use cuda_abi::cudart::cudaStream_t;
use cuda_abi::library_types::cudaDataType;
use ttrace_format::dtype::DType;
use ttrace_format::record::{GapOp, GapReason, GemmOp, Op, Role};

use crate::engine::{self, Call};
use crate::plan::{self, Matrix, Vector, When};
use crate::{mode, perturb, real};

/// What a hook returns when the real function is missing.
const MISSING: cublasStatus_t = CUBLAS_STATUS_NOT_SUPPORTED;

/// One matrix argument: pointer, `cudaDataType_t`, leading dimension, batch stride.
#[derive(Clone, Copy)]
struct Operand {
    ptr: *const c_void,
    dtype: cudaDataType,
    ld: c_int,
    stride: c_longlong,
}

/// A cuBLAS GEMM call.
struct Gemm {
    api: &'static str,
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    beta: *const c_void,
    a: Operand,
    b: Operand,
    c: Operand,
    batch: c_int,
    batched: bool,
    compute: u32,
    algo: cublasGemmAlgo_t,
}

/// The scale type (of alpha and beta) of a compute type, as raw `cudaDataType_t` and dtype
/// (legacy `cudaDataType` compute values as `cublasMigrateComputeType` maps them).
pub(crate) fn scale_of(compute: u32) -> (u32, DType) {
    match compute {
        64 | 65 | 2 => (2, DType::F16),
        70 | 71 | 1 => (1, DType::F64),
        72 | 73 | 10 => (10, DType::I32),
        _ => (0, DType::F32),
    }
}

/// A host scalar of type `t`.
///
/// # Safety
/// `p` is null or points to a readable value of type `t`.
pub(crate) unsafe fn read_scalar(p: *const c_void, t: DType) -> Option<f64> {
    if p.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    unsafe {
        Some(match t {
            DType::F32 => *p.cast::<f32>() as f64,
            DType::F64 => *p.cast::<f64>(),
            DType::F16 => half::f16::from_bits(*p.cast::<u16>()).to_f64(),
            DType::BF16 => half::bf16::from_bits(*p.cast::<u16>()).to_f64(),
            DType::I32 => *p.cast::<i32>() as f64,
            _ => return None,
        })
    }
}

/// `(rows, cols)` of an operand stored for `op(X)` of `r x c`.
fn stored(trans: cublasOperation_t, r: u64, c: u64) -> (u64, u64) {
    if trans == CUBLAS_OP_N {
        (r, c)
    } else {
        (c, r)
    }
}

fn handle_stream(handle: cublasHandle_t) -> Option<cudaStream_t> {
    let f = real::cublasGetStream_v2()?;
    let mut s: cudaStream_t = core::ptr::null_mut();
    // SAFETY: the program's handle and an out-pointer to a local.
    (unsafe { f(handle, &mut s) } == CUBLAS_STATUS_SUCCESS).then_some(s)
}

/// The compute type of a single-precision routine under the handle's math mode.
fn single_precision_compute(handle: cublasHandle_t) -> cublasComputeType_t {
    let Some(f) = real::cublasGetMathMode() else {
        return CUBLAS_COMPUTE_32F;
    };
    let mut m: cublasMath_t = CUBLAS_DEFAULT_MATH;
    // SAFETY: the program's handle and an out-pointer to a local.
    if unsafe { f(handle, &mut m) } != CUBLAS_STATUS_SUCCESS {
        return CUBLAS_COMPUTE_32F;
    }
    match m & !CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION {
        CUBLAS_TF32_TENSOR_OP_MATH => CUBLAS_COMPUTE_32F_FAST_TF32,
        CUBLAS_TENSOR_OP_MATH => CUBLAS_COMPUTE_32F_FAST_16F,
        CUBLAS_PEDANTIC_MATH => CUBLAS_COMPUTE_32F_PEDANTIC,
        _ => CUBLAS_COMPUTE_32F,
    }
}

fn host_pointers(handle: cublasHandle_t) -> bool {
    let Some(f) = real::cublasGetPointerMode_v2() else {
        return false;
    };
    let mut m: cublasPointerMode_t = CUBLAS_POINTER_MODE_DEVICE;
    // SAFETY: the program's handle and an out-pointer to a local.
    (unsafe { f(handle, &mut m) } == CUBLAS_STATUS_SUCCESS) && m == CUBLAS_POINTER_MODE_HOST
}

/// The snapshot plan of a cuBLAS GEMM (`None`: nothing to take, e.g. invalid arguments the
/// library refuses).
fn call(g: &Gemm) -> Option<Call> {
    if g.m <= 0 || g.n <= 0 || g.k < 0 || g.batch <= 0 {
        return None;
    }
    let stream = handle_stream(g.handle)?;
    let (m, n, k, batch) = (g.m as u64, g.n as u64, g.k as u64, g.batch as u64);
    let (scale_raw, scale) = scale_of(g.compute);
    let host = host_pointers(g.handle);
    let (alpha, beta) = if host {
        // SAFETY: host pointer mode: alpha and beta point to host values of the scale type.
        unsafe { (read_scalar(g.alpha, scale), read_scalar(g.beta, scale)) }
    } else {
        (None, None)
    };
    let c_read = beta.is_none_or(|b| b != 0.0);
    let matrix = |o: &Operand, (rows, cols): (u64, u64)| Matrix {
        ptr: o.ptr as u64,
        dtype: o.dtype,
        rows,
        cols,
        ld: o.ld.max(0) as u64,
        batch,
        stride: o.stride,
        batched: g.batched,
    };
    let a = matrix(&g.a, stored(g.transa, m, k));
    let b = matrix(&g.b, stored(g.transb, k, n));
    let c = matrix(&g.c, (m, n));
    let mut tensors = vec![
        plan::matrix(Role::A, &a, When::After, true),
        plan::matrix(Role::B, &b, When::After, true),
    ];
    if c_read {
        tensors.push(plan::matrix(Role::CIn, &c, When::Before, true));
    }
    tensors.push(plan::matrix(Role::D, &c, When::After, false));
    if !host {
        for (role, p) in [(Role::Alpha, g.alpha), (Role::Beta, g.beta)] {
            tensors.push(plan::vector(
                role,
                Vector::new(p as u64, Some(scale), 1),
                When::After,
                true,
            ));
        }
    }
    let stride = |o: &Operand| if g.batched { o.stride } else { 0 };
    let op = GemmOp {
        m,
        n,
        k,
        transa: g.transa,
        transb: g.transb,
        lda: g.a.ld as u64,
        ldb: g.b.ld as u64,
        ldc: g.c.ld as u64,
        ldd: g.c.ld as u64,
        batch,
        stride_a: stride(&g.a),
        stride_b: stride(&g.b),
        stride_c: stride(&g.c),
        stride_d: stride(&g.c),
        a_type: g.a.dtype,
        b_type: g.b.dtype,
        c_type: g.c.dtype,
        d_type: g.c.dtype,
        compute_type: g.compute,
        scale_type: scale_raw,
        alpha,
        beta,
        epilogue: cuda_abi::cublaslt::CUBLASLT_EPILOGUE_DEFAULT,
        algo: g.algo,
        fast_accum: false,
    };
    Some(Call {
        api: g.api,
        op: Op::Gemm(Box::new(op)),
        stream,
        stream_id: stream as u64,
        device: None,
        tensors,
    })
}

fn capture(g: Gemm, real: impl FnOnce() -> cublasStatus_t) -> cublasStatus_t {
    crate::around_gemm(
        || engine::begin(call(&g)?),
        real,
        |r| {
            if r == CUBLAS_STATUS_SUCCESS {
                perturb_output(&g);
            }
        },
        |f, r| engine::finish(f, r == CUBLAS_STATUS_SUCCESS),
    )
}

/// A perturbed reference run: noise on C, the output, on the handle's stream.
fn perturb_output(g: &Gemm) {
    if g.m <= 0 || g.n <= 0 || g.batch <= 0 {
        return;
    }
    let Some(stream) = handle_stream(g.handle) else {
        return;
    };
    perturb::gemm_output(
        stream,
        &Matrix {
            ptr: g.c.ptr as u64,
            dtype: g.c.dtype,
            rows: g.m as u64,
            cols: g.n as u64,
            ld: g.c.ld.max(0) as u64,
            batch: g.batch as u64,
            stride: g.c.stride,
            batched: g.batched,
        },
    );
}

fn op(ptr: *const c_void, dtype: cudaDataType, ld: c_int, stride: c_longlong) -> Operand {
    Operand {
        ptr,
        dtype,
        ld,
        stride,
    }
}

/// `cublasSgemm_v2`: f32 GEMM.
#[no_mangle]
pub unsafe extern "C" fn cublasSgemm_v2(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    A: *const f32,
    lda: c_int,
    B: *const f32,
    ldb: c_int,
    beta: *const f32,
    C: *mut f32,
    ldc: c_int,
) -> cublasStatus_t {
    let Some(real) = real::cublasSgemm_v2() else {
        return MISSING;
    };
    if mode::off(mode::GEMM | mode::PERTURB) {
        // SAFETY: the program's arguments, forwarded unchanged.
        return unsafe {
            real(
                handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
            )
        };
    }
    let g = Gemm {
        api: "cublasSgemm_v2",
        handle,
        transa,
        transb,
        m,
        n,
        k,
        alpha: alpha.cast(),
        beta: beta.cast(),
        a: op(A.cast(), 0, lda, 0),
        b: op(B.cast(), 0, ldb, 0),
        c: op(C.cast(), 0, ldc, 0),
        batch: 1,
        batched: false,
        compute: single_precision_compute(handle),
        algo: CUBLAS_GEMM_DEFAULT,
    };
    // SAFETY: as above.
    capture(g, || unsafe {
        real(
            handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
        )
    })
}

/// `cublasDgemm_v2`: f64 GEMM.
#[no_mangle]
pub unsafe extern "C" fn cublasDgemm_v2(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f64,
    A: *const f64,
    lda: c_int,
    B: *const f64,
    ldb: c_int,
    beta: *const f64,
    C: *mut f64,
    ldc: c_int,
) -> cublasStatus_t {
    let Some(real) = real::cublasDgemm_v2() else {
        return MISSING;
    };
    if mode::off(mode::GEMM) {
        // SAFETY: the program's arguments, forwarded unchanged.
        return unsafe {
            real(
                handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
            )
        };
    }
    let g = Gemm {
        api: "cublasDgemm_v2",
        handle,
        transa,
        transb,
        m,
        n,
        k,
        alpha: alpha.cast(),
        beta: beta.cast(),
        a: op(A.cast(), 1, lda, 0),
        b: op(B.cast(), 1, ldb, 0),
        c: op(C.cast(), 1, ldc, 0),
        batch: 1,
        batched: false,
        compute: CUBLAS_COMPUTE_64F,
        algo: CUBLAS_GEMM_DEFAULT,
    };
    // SAFETY: as above.
    capture(g, || unsafe {
        real(
            handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
        )
    })
}

/// `cublasHgemm`: f16 GEMM with f16 accumulation.
#[no_mangle]
pub unsafe extern "C" fn cublasHgemm(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const __half,
    A: *const __half,
    lda: c_int,
    B: *const __half,
    ldb: c_int,
    beta: *const __half,
    C: *mut __half,
    ldc: c_int,
) -> cublasStatus_t {
    let Some(real) = real::cublasHgemm() else {
        return MISSING;
    };
    if mode::off(mode::GEMM | mode::PERTURB) {
        // SAFETY: the program's arguments, forwarded unchanged.
        return unsafe {
            real(
                handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
            )
        };
    }
    let g = Gemm {
        api: "cublasHgemm",
        handle,
        transa,
        transb,
        m,
        n,
        k,
        alpha: alpha.cast(),
        beta: beta.cast(),
        a: op(A.cast(), 2, lda, 0),
        b: op(B.cast(), 2, ldb, 0),
        c: op(C.cast(), 2, ldc, 0),
        batch: 1,
        batched: false,
        compute: CUBLAS_COMPUTE_16F,
        algo: CUBLAS_GEMM_DEFAULT,
    };
    // SAFETY: as above.
    capture(g, || unsafe {
        real(
            handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
        )
    })
}

/// `cublasSgemmStridedBatched`.
#[no_mangle]
pub unsafe extern "C" fn cublasSgemmStridedBatched(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    A: *const f32,
    lda: c_int,
    strideA: c_longlong,
    B: *const f32,
    ldb: c_int,
    strideB: c_longlong,
    beta: *const f32,
    C: *mut f32,
    ldc: c_int,
    strideC: c_longlong,
    batchCount: c_int,
) -> cublasStatus_t {
    let Some(real) = real::cublasSgemmStridedBatched() else {
        return MISSING;
    };
    if mode::off(mode::GEMM | mode::PERTURB) {
        // SAFETY: the program's arguments, forwarded unchanged.
        return unsafe {
            real(
                handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C,
                ldc, strideC, batchCount,
            )
        };
    }
    let g = Gemm {
        api: "cublasSgemmStridedBatched",
        handle,
        transa,
        transb,
        m,
        n,
        k,
        alpha: alpha.cast(),
        beta: beta.cast(),
        a: op(A.cast(), 0, lda, strideA),
        b: op(B.cast(), 0, ldb, strideB),
        c: op(C.cast(), 0, ldc, strideC),
        batch: batchCount,
        batched: true,
        compute: single_precision_compute(handle),
        algo: CUBLAS_GEMM_DEFAULT,
    };
    // SAFETY: as above.
    capture(g, || unsafe {
        real(
            handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc,
            strideC, batchCount,
        )
    })
}

/// `cublasGemmEx`: mixed-precision GEMM (`computeType` read raw: 68/77, or a legacy
/// `cudaDataType` such as 0 from callers that bypass `cublasMigrateComputeType`).
#[no_mangle]
pub unsafe extern "C" fn cublasGemmEx(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    A: *const c_void,
    Atype: cudaDataType,
    lda: c_int,
    B: *const c_void,
    Btype: cudaDataType,
    ldb: c_int,
    beta: *const c_void,
    C: *mut c_void,
    Ctype: cudaDataType,
    ldc: c_int,
    computeType: cublasComputeType_t,
    algo: cublasGemmAlgo_t,
) -> cublasStatus_t {
    let Some(real) = real::cublasGemmEx() else {
        return MISSING;
    };
    if mode::off(mode::GEMM | mode::PERTURB) {
        // SAFETY: the program's arguments, forwarded unchanged.
        return unsafe {
            real(
                handle,
                transa,
                transb,
                m,
                n,
                k,
                alpha,
                A,
                Atype,
                lda,
                B,
                Btype,
                ldb,
                beta,
                C,
                Ctype,
                ldc,
                computeType,
                algo,
            )
        };
    }
    let g = Gemm {
        api: "cublasGemmEx",
        handle,
        transa,
        transb,
        m,
        n,
        k,
        alpha,
        beta,
        a: op(A, Atype, lda, 0),
        b: op(B, Btype, ldb, 0),
        c: op(C.cast_const(), Ctype, ldc, 0),
        batch: 1,
        batched: false,
        compute: computeType,
        algo,
    };
    // SAFETY: as above.
    capture(g, || unsafe {
        real(
            handle,
            transa,
            transb,
            m,
            n,
            k,
            alpha,
            A,
            Atype,
            lda,
            B,
            Btype,
            ldb,
            beta,
            C,
            Ctype,
            ldc,
            computeType,
            algo,
        )
    })
}

/// `cublasGemmStridedBatchedEx`.
#[no_mangle]
pub unsafe extern "C" fn cublasGemmStridedBatchedEx(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    A: *const c_void,
    Atype: cudaDataType,
    lda: c_int,
    strideA: c_longlong,
    B: *const c_void,
    Btype: cudaDataType,
    ldb: c_int,
    strideB: c_longlong,
    beta: *const c_void,
    C: *mut c_void,
    Ctype: cudaDataType,
    ldc: c_int,
    strideC: c_longlong,
    batchCount: c_int,
    computeType: cublasComputeType_t,
    algo: cublasGemmAlgo_t,
) -> cublasStatus_t {
    let Some(real) = real::cublasGemmStridedBatchedEx() else {
        return MISSING;
    };
    if mode::off(mode::GEMM | mode::PERTURB) {
        // SAFETY: the program's arguments, forwarded unchanged.
        return unsafe {
            real(
                handle,
                transa,
                transb,
                m,
                n,
                k,
                alpha,
                A,
                Atype,
                lda,
                strideA,
                B,
                Btype,
                ldb,
                strideB,
                beta,
                C,
                Ctype,
                ldc,
                strideC,
                batchCount,
                computeType,
                algo,
            )
        };
    }
    let g = Gemm {
        api: "cublasGemmStridedBatchedEx",
        handle,
        transa,
        transb,
        m,
        n,
        k,
        alpha,
        beta,
        a: op(A, Atype, lda, strideA),
        b: op(B, Btype, ldb, strideB),
        c: op(C.cast_const(), Ctype, ldc, strideC),
        batch: batchCount,
        batched: true,
        compute: computeType,
        algo,
    };
    // SAFETY: as above.
    capture(g, || unsafe {
        real(
            handle,
            transa,
            transb,
            m,
            n,
            k,
            alpha,
            A,
            Atype,
            lda,
            strideA,
            B,
            Btype,
            ldb,
            strideB,
            beta,
            C,
            Ctype,
            ldc,
            strideC,
            batchCount,
            computeType,
            algo,
        )
    })
}

/// `cublasGemmBatchedEx`: recorded as a `ShapeUnknown` gap (the matrices' addresses are in
/// device memory; reading them would synchronise).
#[no_mangle]
pub unsafe extern "C" fn cublasGemmBatchedEx(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    Aarray: *const *const c_void,
    Atype: cudaDataType,
    lda: c_int,
    Barray: *const *const c_void,
    Btype: cudaDataType,
    ldb: c_int,
    beta: *const c_void,
    Carray: *const *mut c_void,
    Ctype: cudaDataType,
    ldc: c_int,
    batchCount: c_int,
    computeType: cublasComputeType_t,
    algo: cublasGemmAlgo_t,
) -> cublasStatus_t {
    let Some(real) = real::cublasGemmBatchedEx() else {
        return MISSING;
    };
    if mode::off(mode::GEMM) {
        // SAFETY: the program's arguments, forwarded unchanged.
        return unsafe {
            real(
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
                batchCount,
                computeType,
                algo,
            )
        };
    }
    let prepare = || {
        let stream = handle_stream(handle)?;
        let es = |t: u32| DType::from_cuda(t).map_or(0, |d| d.size() as u64);
        let (mm, nn, kk, bb) = (
            m.max(0) as u64,
            n.max(0) as u64,
            k.max(0) as u64,
            batchCount.max(0) as u64,
        );
        let bytes = bb * (mm * kk * es(Atype) + kk * nn * es(Btype) + mm * nn * es(Ctype));
        let detail = format!(
            "m={m} n={n} k={k} batch={batchCount} transa={transa} transb={transb} \
             Atype={Atype} Btype={Btype} Ctype={Ctype} lda={lda} ldb={ldb} ldc={ldc} \
             computeType={computeType} algo={algo} Aarray={Aarray:p} Barray={Barray:p} \
             Carray={Carray:p}: the matrix pointers live in device memory and cannot be read \
             without synchronising"
        );
        engine::begin(Call {
            api: "cublasGemmBatchedEx",
            op: Op::Gap(GapOp {
                reason: GapReason::ShapeUnknown,
                skipped_api: "cublasGemmBatchedEx".into(),
                bytes,
                detail,
            }),
            stream,
            stream_id: stream as u64,
            device: None,
            tensors: Vec::new(),
        })
    };
    crate::around(
        prepare,
        // SAFETY: as above.
        || unsafe {
            real(
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
                batchCount,
                computeType,
                algo,
            )
        },
        |f, r| engine::finish(f, r == CUBLAS_STATUS_SUCCESS),
    )
}
