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
//! The real pointer-array batches (`cublas{S,D,H}gemmBatched`, `cublasGemmBatchedEx`, `_64`)
//! are captured when their arrays were uploaded from the host ([`crate::uploads`]): entries
//! from the uploaded addresses, the device arrays snapshotted too and checked by the tracer;
//! arrays built on the device are a `ShapeUnknown` gap.
//!
//! Each signature is written once, in a macro invocation: [`gemm_hook!`] for the GEMMs captured
//! (typed, `Ex`, strided-batched, in `int` and `_64` widths), [`blas_gap!`] for the entry
//! points that move tensor data but are not captured, which record a gap naming the API (no
//! silent holes):
//! * pointer-array batches other than the real ones captured ([`pointer_batch`]: complex,
//!   the grouped GEMMs, batched gemv): the matrices' addresses live in device memory, and
//!   reading them would synchronise, which the tracer never does: `ShapeUnknown`, with the
//!   parameters the host holds (for grouped GEMMs every group's size and shape, which are host
//!   arrays);
//! * complex-valued GEMMs and gemv, batched gemv, and real gemv whose output is strided
//!   (`incy != 1`): `Unsupported`, with their parameters. A real gemv is otherwise captured as
//!   the GEMM it is ([`gemv`]).
//!
//! The real functions are looked up by the macros ([`real::lookup`]) under the hook's name.

use core::ffi::{c_int, c_longlong, c_void};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use cuda_abi::cublas::*;
use cuda_abi::cudart::cudaStream_t;
use cuda_abi::library_types::*;
use ttrace_proto::dtype::DType;
use ttrace_proto::record::{GapOp, GapReason, GemmOp, Op, Role};

use crate::engine::{self, Call};
use crate::plan::{self, Matrix, TensorPlan, Vector, When};
use crate::{mode, perturb, real, uploads};

/// What a hook returns when the real function is missing.
const MISSING: cublasStatus_t = CUBLAS_STATUS_NOT_SUPPORTED;

/// One matrix argument: pointer, `cudaDataType_t`, leading dimension, batch stride.
#[derive(Clone, Copy)]
struct Operand {
    ptr: *const c_void,
    dtype: cudaDataType,
    ld: i64,
    stride: c_longlong,
}

/// A cuBLAS GEMM call.
struct Gemm {
    api: &'static str,
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: i64,
    n: i64,
    k: i64,
    alpha: *const c_void,
    beta: *const c_void,
    a: Operand,
    b: Operand,
    c: Operand,
    batch: i64,
    batched: bool,
    compute: u32,
    algo: cublasGemmAlgo_t,
    /// Why the call cannot be captured as a GEMM (a gemv with a strided output): a gap.
    gap: Option<String>,
    /// A pointer-array batch: the device arrays of A's, B's and C's matrix addresses (the
    /// operands' `ptr` are unused).
    arrays: Option<[*const c_void; 3]>,
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
    let (located, checks) = match g.arrays {
        None => (None, Vec::new()),
        Some(arrays) => match locate(arrays, batch) {
            Ok((blocks, checks)) => (Some(blocks), checks),
            Err(why) => return Some(gap_call(g, stream, why)),
        },
    };
    let operand = |role, m: &Matrix, which: usize, when, input| match &located {
        None => plan::matrix(role, m, when, input),
        Some(blocks) => plan::matrix_at(role, m, blocks[which].clone(), when, input),
    };
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
        operand(Role::A, &a, 0, When::After, true),
        operand(Role::B, &b, 1, When::After, true),
    ];
    if c_read {
        tensors.push(operand(Role::CIn, &c, 2, When::Before, true));
    }
    tensors.push(operand(Role::D, &c, 2, When::After, false));
    tensors.extend(checks);
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
    // A pointer-array batch has no strides (0): its entries are where the arrays say.
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

fn capture(mut g: Gemm, real: impl FnOnce() -> cublasStatus_t) -> cublasStatus_t {
    if let Some(why) = g.gap.take() {
        return uncaptured(g.api, g.handle, GapReason::Unsupported, || why, real);
    }
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
    // A pointer-array batch's outputs are not perturbed (where they are is read from the host
    // copy of its arrays only when captured).
    if g.m <= 0 || g.n <= 0 || g.batch <= 0 || g.arrays.is_some() {
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

/// A matrix argument (leading dimension and stride as the caller passed them).
fn op(ptr: *const c_void, dtype: cudaDataType, ld: impl Into<i64>, stride: c_longlong) -> Operand {
    Operand {
        ptr,
        dtype,
        ld: ld.into(),
        stride,
    }
}

/// An `int` or `int64_t` argument, widened.
fn w(v: impl Into<i64>) -> i64 {
    v.into()
}

/// A GEMM call (its `api` is set by [`gemm_hook!`]): `batch` is `Some` for the strided-batched
/// entry points.
#[allow(clippy::too_many_arguments)]
fn gemm(
    handle: cublasHandle_t,
    [transa, transb]: [cublasOperation_t; 2],
    [m, n, k]: [i64; 3],
    [alpha, beta]: [*const c_void; 2],
    [a, b, c]: [Operand; 3],
    batch: Option<i64>,
    compute: u32,
    algo: cublasGemmAlgo_t,
) -> Gemm {
    Gemm {
        api: "",
        handle,
        transa,
        transb,
        m,
        n,
        k,
        alpha,
        beta,
        a,
        b,
        c,
        batch: batch.unwrap_or(1),
        batched: batch.is_some(),
        compute,
        algo,
        gap: None,
        arrays: None,
    }
}

/// A pointer-array batch (`cublas?gemmBatched`, `cublasGemmBatchedEx`): `arrays` hold the
/// device addresses of `batch` matrices each of A, B and C, of the operands' types and leading
/// dimensions.
#[allow(clippy::too_many_arguments)]
fn pointer_batch(
    handle: cublasHandle_t,
    trans: [cublasOperation_t; 2],
    mnk: [i64; 3],
    scalars: [*const c_void; 2],
    arrays: [(*const c_void, cudaDataType, i64); 3],
    batch: i64,
    compute: u32,
    algo: cublasGemmAlgo_t,
) -> Gemm {
    let operand =
        |(_, dtype, ld): (*const c_void, cudaDataType, i64)| op(core::ptr::null(), dtype, ld, 0);
    let mut g = gemm(
        handle,
        trans,
        mnk,
        scalars,
        arrays.map(operand),
        Some(batch),
        compute,
        algo,
    );
    g.arrays = Some(arrays.map(|a| a.0));
    g
}

/// A pointer-array batch's matrix addresses (of A, B, C) and the snapshots of its arrays.
type Located = ([Arc<[u64]>; 3], Vec<TensorPlan>);

/// Where a pointer-array batch's matrices are: each array's host bytes as last uploaded
/// (uploads.rs), read as addresses, and the array's own snapshot, which the tracer compares
/// with those bytes. `Err`: an array no upload covers (built on the device), with why.
fn locate(arrays: [*const c_void; 3], batch: u64) -> Result<Located, String> {
    let len = batch.saturating_mul(8);
    let mut blocks: Vec<Arc<[u64]>> = Vec::with_capacity(3);
    let mut checks = Vec::with_capacity(3);
    for (name, role, p) in [
        ("A", Role::ArrayA, arrays[0]),
        ("B", Role::ArrayB, arrays[1]),
        ("C", Role::ArrayC, arrays[2]),
    ] {
        let Some(bytes) = uploads::find(p as u64, len) else {
            return Err(format!(
                "the pointer array of {name} ({p:?}, {len} bytes) was built on the device (no \
                 host-to-device copy of it was seen, or it lives in managed memory); it cannot \
                 be read without synchronising"
            ));
        };
        blocks.push(
            bytes
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                .collect(),
        );
        let mut t = plan::vector(
            role,
            Vector::new(p as u64, Some(DType::U64), batch),
            When::Before,
            false,
        );
        t.expect = Some(bytes.into());
        checks.push(t);
    }
    let [a, b, c]: [Arc<[u64]>; 3] = blocks
        .try_into()
        .map_err(|_| "internal: three arrays expected".to_string())?;
    Ok(([a, b, c], checks))
}

/// The gap of a GEMM that cannot be captured (`detail` says why), on its stream.
fn gap_call(g: &Gemm, stream: cudaStream_t, detail: String) -> Call {
    Call {
        api: g.api,
        op: Op::Gap(GapOp {
            reason: GapReason::ShapeUnknown,
            skipped_api: g.api.into(),
            bytes: 0,
            detail: format!(
                "m={} n={} k={} batch={} Atype={} Btype={} Ctype={} lda={} ldb={} ldc={} \
                 computeType={}: {detail}",
                g.m,
                g.n,
                g.k,
                g.batch,
                g.a.dtype,
                g.b.dtype,
                g.c.dtype,
                g.a.ld,
                g.b.ld,
                g.c.ld,
                g.compute
            ),
        }),
        stream,
        stream_id: stream as u64,
        device: None,
        tensors: Vec::new(),
    }
}

/// A gemv, `y = alpha op(A) x + beta y`, as the GEMM it is: `op(A)` (`M x K`) times `x` as a
/// `K x 1` matrix stored transposed (`1 x K`, leading dimension `incx`), into `y` (`M x 1`).
/// A strided or reversed output (`incy != 1`) or input (`incx < 1`) has no such layout: a gap.
#[allow(clippy::too_many_arguments)]
fn gemv(
    handle: cublasHandle_t,
    trans: cublasOperation_t,
    [m, n]: [i64; 2],
    scalars: [*const c_void; 2],
    (a, lda): (*const c_void, i64),
    (x, incx): (*const c_void, i64),
    (y, incy): (*const c_void, i64),
    (dtype, compute): (cudaDataType, u32),
) -> Gemm {
    let (rows, cols) = if trans == CUBLAS_OP_N { (m, n) } else { (n, m) };
    let mut g = gemm(
        handle,
        [trans, CUBLAS_OP_T],
        [rows, 1, cols],
        scalars,
        [
            op(a, dtype, lda, 0),
            op(x, dtype, incx, 0),
            op(y, dtype, rows.max(1), 0),
        ],
        None,
        compute,
        CUBLAS_GEMM_DEFAULT,
    );
    if incy != 1 || incx < 1 {
        g.gap = Some(not_captured(
            "matrix-vector products with incy != 1 or incx < 1",
            format!("m={m} n={n} trans={trans} incx={incx} incy={incy}"),
        ));
    }
    g
}

/// One captured cuBLAS GEMM entry point: `name(C signature) => (modes that make it capture)
/// Gemm`. The real function is called exactly once with the program's arguments.
macro_rules! gemm_hook {
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? ) => ($modes:expr) $gemm:expr) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> cublasStatus_t {
            type Real = unsafe extern "C" fn($($t),*) -> cublasStatus_t;
            static SLOT: AtomicUsize = AtomicUsize::new(0);
            let name = concat!(stringify!($name), "\0");
            // SAFETY: `Real` is the C signature of the function of that name.
            let Some(real) = (unsafe { real::lookup::<Real>(&SLOT, name, real::Lib::Cublas) })
            else {
                return MISSING;
            };
            if mode::off($modes) {
                // SAFETY: the program's arguments, forwarded unchanged.
                return unsafe { real($($a),*) };
            }
            let g = Gemm {
                api: stringify!($name),
                ..$gemm
            };
            // SAFETY: as above.
            capture(g, || unsafe { real($($a),*) })
        }
    };
}

/// One cuBLAS entry point that moves tensor data but is not captured: `name(C signature) =>
/// GapReason, detail`. A successful call records a gap naming it (a failed one moved nothing).
macro_rules! blas_gap {
    ($(#[$m:meta])* $name:ident ( $h:ident : cublasHandle_t $(, $a:ident : $t:ty)* $(,)? )
        => $reason:ident, $detail:expr) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($h: cublasHandle_t $(, $a: $t)*) -> cublasStatus_t {
            type Real = unsafe extern "C" fn(cublasHandle_t $(, $t)*) -> cublasStatus_t;
            static SLOT: AtomicUsize = AtomicUsize::new(0);
            let name = concat!(stringify!($name), "\0");
            // SAFETY: `Real` is the C signature of the function of that name.
            let Some(real) = (unsafe { real::lookup::<Real>(&SLOT, name, real::Lib::Cublas) })
            else {
                return MISSING;
            };
            if mode::off(mode::GEMM) {
                // SAFETY: the program's arguments, forwarded unchanged.
                return unsafe { real($h $(, $a)*) };
            }
            let detail = || $detail;
            // SAFETY: as above.
            uncaptured(stringify!($name), $h, GapReason::$reason, detail, || unsafe {
                real($h $(, $a)*)
            })
        }
    };
}

/// The gap of an uncaptured entry point, on the handle's stream, once the call succeeded.
fn uncaptured(
    api: &'static str,
    handle: cublasHandle_t,
    reason: GapReason,
    detail: impl FnOnce() -> String,
    real: impl FnOnce() -> cublasStatus_t,
) -> cublasStatus_t {
    crate::around(
        || {
            let stream = handle_stream(handle)?;
            engine::begin(Call {
                api,
                op: Op::Gap(GapOp {
                    reason,
                    skipped_api: api.into(),
                    bytes: 0,
                    detail: detail(),
                }),
                stream,
                stream_id: stream as u64,
                device: None,
                tensors: Vec::new(),
            })
        },
        real,
        |f, r| engine::finish(f, r == CUBLAS_STATUS_SUCCESS),
    )
}

/// Why a pointer-array batch is a gap, with its shape.
fn pointer_arrays(
    m: impl Into<i64>,
    n: impl Into<i64>,
    k: impl Into<i64>,
    batch: impl Into<i64>,
    types: &str,
) -> String {
    format!(
        "m={} n={} k={} batch={} {types}: the matrix pointers live in device memory and cannot \
         be read without synchronising",
        m.into(),
        n.into(),
        k.into(),
        batch.into()
    )
}

/// Groups described in a grouped GEMM's detail (the rest are counted).
const GROUPS_SHOWN: usize = 32;

/// Why a grouped GEMM is a gap, with every group's size and shape (host arrays).
///
/// # Safety
/// The arrays hold `count` elements (cuBLAS's contract) or are null.
unsafe fn grouped<I: Copy + Into<i64>>(
    count: I,
    size: *const I,
    [m, n, k]: [*const I; 3],
    types: &str,
) -> String {
    let count = count.into().max(0) as usize;
    let at = |p: *const I, i: usize| -> i64 {
        if p.is_null() {
            -1
        } else {
            // SAFETY: `i < count`, per the contract.
            unsafe { *p.add(i) }.into()
        }
    };
    let mut groups: Vec<String> = (0..count.min(GROUPS_SHOWN))
        .map(|i| {
            format!(
                "{}x(m={} n={} k={})",
                at(size, i),
                at(m, i),
                at(n, i),
                at(k, i)
            )
        })
        .collect();
    if count > GROUPS_SHOWN {
        groups.push(format!("... {} more groups", count - GROUPS_SHOWN));
    }
    format!(
        "groups={count} [{}] {types}: the matrix pointers live in device memory and cannot be \
         read without synchronising",
        groups.join(", ")
    )
}

/// Why an uncaptured GEMM or gemv is a gap.
fn not_captured(what: &str, shape: String) -> String {
    format!("{shape}: {what} are not captured")
}

gemm_hook! {
    /// `cublasSgemm_v2`: f32 GEMM.
    cublasSgemm_v2(
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
    ) => (mode::GEMM | mode::PERTURB)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            op(A.cast(), CUDA_R_32F, lda, 0),
            op(B.cast(), CUDA_R_32F, ldb, 0),
            op(C.cast_const().cast(), CUDA_R_32F, ldc, 0),
        ],
        None,
        single_precision_compute(handle),
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasDgemm_v2`: f64 GEMM.
    cublasDgemm_v2(
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
    ) => (mode::GEMM)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            op(A.cast(), CUDA_R_64F, lda, 0),
            op(B.cast(), CUDA_R_64F, ldb, 0),
            op(C.cast_const().cast(), CUDA_R_64F, ldc, 0),
        ],
        None,
        CUBLAS_COMPUTE_64F,
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasHgemm`: f16 GEMM.
    cublasHgemm(
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
    ) => (mode::GEMM | mode::PERTURB)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            op(A.cast(), CUDA_R_16F, lda, 0),
            op(B.cast(), CUDA_R_16F, ldb, 0),
            op(C.cast_const().cast(), CUDA_R_16F, ldc, 0),
        ],
        None,
        CUBLAS_COMPUTE_16F,
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasSgemmStridedBatched`: f32 strided-batched GEMM.
    cublasSgemmStridedBatched(
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
    ) => (mode::GEMM | mode::PERTURB)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            op(A.cast(), CUDA_R_32F, lda, strideA),
            op(B.cast(), CUDA_R_32F, ldb, strideB),
            op(C.cast_const().cast(), CUDA_R_32F, ldc, strideC),
        ],
        Some(w(batchCount)),
        single_precision_compute(handle),
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasDgemmStridedBatched`: f64 strided-batched GEMM.
    cublasDgemmStridedBatched(
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
    ) => (mode::GEMM)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            op(A.cast(), CUDA_R_64F, lda, strideA),
            op(B.cast(), CUDA_R_64F, ldb, strideB),
            op(C.cast_const().cast(), CUDA_R_64F, ldc, strideC),
        ],
        Some(w(batchCount)),
        CUBLAS_COMPUTE_64F,
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasHgemmStridedBatched`: f16 strided-batched GEMM.
    cublasHgemmStridedBatched(
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
    ) => (mode::GEMM | mode::PERTURB)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            op(A.cast(), CUDA_R_16F, lda, strideA),
            op(B.cast(), CUDA_R_16F, ldb, strideB),
            op(C.cast_const().cast(), CUDA_R_16F, ldc, strideC),
        ],
        Some(w(batchCount)),
        CUBLAS_COMPUTE_16F,
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasSgemmEx`: typed operands, f32 scalars and accumulation (the handle's math mode).
    cublasSgemmEx(
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
    ) => (mode::GEMM | mode::PERTURB)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            op(A, Atype, lda, 0),
            op(B, Btype, ldb, 0),
            op(C.cast_const(), Ctype, ldc, 0),
        ],
        None,
        single_precision_compute(handle),
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasGemmEx`: mixed-precision GEMM (`computeType` read raw: 68/77, or a legacy
    /// `cudaDataType` such as 0 from callers that bypass `cublasMigrateComputeType`).
    cublasGemmEx(
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
    ) => (mode::GEMM | mode::PERTURB)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha, beta],
        [
            op(A, Atype, lda, 0),
            op(B, Btype, ldb, 0),
            op(C.cast_const(), Ctype, ldc, 0),
        ],
        None,
        computeType,
        algo,
    )
}

gemm_hook! {
    /// `cublasGemmStridedBatchedEx`: mixed-precision strided-batched GEMM.
    cublasGemmStridedBatchedEx(
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
    ) => (mode::GEMM | mode::PERTURB)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha, beta],
        [
            op(A, Atype, lda, strideA),
            op(B, Btype, ldb, strideB),
            op(C.cast_const(), Ctype, ldc, strideC),
        ],
        Some(w(batchCount)),
        computeType,
        algo,
    )
}

gemm_hook! {
    /// `cublasSgemm_v2_64`: f32 GEMM (64-bit sizes).
    cublasSgemm_v2_64(
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
    ) => (mode::GEMM | mode::PERTURB)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            op(A.cast(), CUDA_R_32F, lda, 0),
            op(B.cast(), CUDA_R_32F, ldb, 0),
            op(C.cast_const().cast(), CUDA_R_32F, ldc, 0),
        ],
        None,
        single_precision_compute(handle),
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasDgemm_v2_64`: f64 GEMM (64-bit sizes).
    cublasDgemm_v2_64(
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
    ) => (mode::GEMM)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            op(A.cast(), CUDA_R_64F, lda, 0),
            op(B.cast(), CUDA_R_64F, ldb, 0),
            op(C.cast_const().cast(), CUDA_R_64F, ldc, 0),
        ],
        None,
        CUBLAS_COMPUTE_64F,
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasHgemm_64`: f16 GEMM (64-bit sizes).
    cublasHgemm_64(
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
    ) => (mode::GEMM | mode::PERTURB)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            op(A.cast(), CUDA_R_16F, lda, 0),
            op(B.cast(), CUDA_R_16F, ldb, 0),
            op(C.cast_const().cast(), CUDA_R_16F, ldc, 0),
        ],
        None,
        CUBLAS_COMPUTE_16F,
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasSgemmStridedBatched_64`: f32 strided-batched GEMM (64-bit sizes).
    cublasSgemmStridedBatched_64(
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
    ) => (mode::GEMM | mode::PERTURB)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            op(A.cast(), CUDA_R_32F, lda, strideA),
            op(B.cast(), CUDA_R_32F, ldb, strideB),
            op(C.cast_const().cast(), CUDA_R_32F, ldc, strideC),
        ],
        Some(w(batchCount)),
        single_precision_compute(handle),
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasDgemmStridedBatched_64`: f64 strided-batched GEMM (64-bit sizes).
    cublasDgemmStridedBatched_64(
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
    ) => (mode::GEMM)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            op(A.cast(), CUDA_R_64F, lda, strideA),
            op(B.cast(), CUDA_R_64F, ldb, strideB),
            op(C.cast_const().cast(), CUDA_R_64F, ldc, strideC),
        ],
        Some(w(batchCount)),
        CUBLAS_COMPUTE_64F,
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasHgemmStridedBatched_64`: f16 strided-batched GEMM (64-bit sizes).
    cublasHgemmStridedBatched_64(
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
    ) => (mode::GEMM | mode::PERTURB)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            op(A.cast(), CUDA_R_16F, lda, strideA),
            op(B.cast(), CUDA_R_16F, ldb, strideB),
            op(C.cast_const().cast(), CUDA_R_16F, ldc, strideC),
        ],
        Some(w(batchCount)),
        CUBLAS_COMPUTE_16F,
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasSgemmEx_64`: `cublasSgemmEx` with 64-bit sizes.
    cublasSgemmEx_64(
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
    ) => (mode::GEMM | mode::PERTURB)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            op(A, Atype, lda, 0),
            op(B, Btype, ldb, 0),
            op(C.cast_const(), Ctype, ldc, 0),
        ],
        None,
        single_precision_compute(handle),
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasGemmEx_64`: `cublasGemmEx` with 64-bit sizes.
    cublasGemmEx_64(
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
    ) => (mode::GEMM | mode::PERTURB)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha, beta],
        [
            op(A, Atype, lda, 0),
            op(B, Btype, ldb, 0),
            op(C.cast_const(), Ctype, ldc, 0),
        ],
        None,
        computeType,
        algo,
    )
}

gemm_hook! {
    /// `cublasGemmStridedBatchedEx_64`: mixed-precision strided-batched GEMM (64-bit sizes).
    cublasGemmStridedBatchedEx_64(
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
    ) => (mode::GEMM | mode::PERTURB)
    gemm(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha, beta],
        [
            op(A, Atype, lda, strideA),
            op(B, Btype, ldb, strideB),
            op(C.cast_const(), Ctype, ldc, strideC),
        ],
        Some(w(batchCount)),
        computeType,
        algo,
    )
}

gemm_hook! {
    /// `cublasSgemmBatched`: f32 pointer-array batch.
    cublasSgemmBatched(
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
    ) => (mode::GEMM)
    pointer_batch(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            (Aarray.cast(), CUDA_R_32F, w(lda)),
            (Barray.cast(), CUDA_R_32F, w(ldb)),
            (Carray.cast(), CUDA_R_32F, w(ldc)),
        ],
        w(batchCount),
        single_precision_compute(handle),
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasDgemmBatched`: f64 pointer-array batch.
    cublasDgemmBatched(
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
    ) => (mode::GEMM)
    pointer_batch(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            (Aarray.cast(), CUDA_R_64F, w(lda)),
            (Barray.cast(), CUDA_R_64F, w(ldb)),
            (Carray.cast(), CUDA_R_64F, w(ldc)),
        ],
        w(batchCount),
        CUBLAS_COMPUTE_64F,
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasHgemmBatched`: f16 pointer-array batch.
    cublasHgemmBatched(
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
    ) => (mode::GEMM)
    pointer_batch(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            (Aarray.cast(), CUDA_R_16F, w(lda)),
            (Barray.cast(), CUDA_R_16F, w(ldb)),
            (Carray.cast(), CUDA_R_16F, w(ldc)),
        ],
        w(batchCount),
        CUBLAS_COMPUTE_16F,
        CUBLAS_GEMM_DEFAULT,
    )
}

blas_gap! {
    /// `cublasCgemmBatched`: complex f32 pointer-array batch.
    cublasCgemmBatched(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const cuComplex,
        Aarray: *const *const cuComplex,
        lda: c_int,
        Barray: *const *const cuComplex,
        ldb: c_int,
        beta: *const cuComplex,
        Carray: *const *mut cuComplex,
        ldc: c_int,
        batchCount: c_int,
    ) => ShapeUnknown,
            pointer_arrays(m, n, k, batchCount, "complex f32")
}

blas_gap! {
    /// `cublasZgemmBatched`: complex f64 pointer-array batch.
    cublasZgemmBatched(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const cuDoubleComplex,
        Aarray: *const *const cuDoubleComplex,
        lda: c_int,
        Barray: *const *const cuDoubleComplex,
        ldb: c_int,
        beta: *const cuDoubleComplex,
        Carray: *const *mut cuDoubleComplex,
        ldc: c_int,
        batchCount: c_int,
    ) => ShapeUnknown,
            pointer_arrays(m, n, k, batchCount, "complex f64")
}

blas_gap! {
    /// `cublasCgemm3mBatched`: complex f32 pointer-array batch (3m).
    cublasCgemm3mBatched(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const cuComplex,
        Aarray: *const *const cuComplex,
        lda: c_int,
        Barray: *const *const cuComplex,
        ldb: c_int,
        beta: *const cuComplex,
        Carray: *const *mut cuComplex,
        ldc: c_int,
        batchCount: c_int,
    ) => ShapeUnknown,
            pointer_arrays(m, n, k, batchCount, "complex f32")
}

gemm_hook! {
    /// `cublasGemmBatchedEx`: mixed-precision pointer-array batch.
    cublasGemmBatchedEx(
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
    ) => (mode::GEMM)
    pointer_batch(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            (Aarray.cast(), Atype, w(lda)),
            (Barray.cast(), Btype, w(ldb)),
            (Carray.cast(), Ctype, w(ldc)),
        ],
        w(batchCount),
        computeType,
        algo,
    )
}

blas_gap! {
    /// `cublasSgemmGroupedBatched`: f32 grouped GEMM (MoE).
    cublasSgemmGroupedBatched(
        handle: cublasHandle_t,
        transa_array: *const cublasOperation_t,
        transb_array: *const cublasOperation_t,
        m_array: *const c_int,
        n_array: *const c_int,
        k_array: *const c_int,
        alpha_array: *const f32,
        Aarray: *const *const f32,
        lda_array: *const c_int,
        Barray: *const *const f32,
        ldb_array: *const c_int,
        beta_array: *const f32,
        Carray: *const *mut f32,
        ldc_array: *const c_int,
        group_count: c_int,
        group_size: *const c_int,
    ) => ShapeUnknown,
            // SAFETY: cuBLAS's contract: host arrays of `group_count` elements.
            unsafe { grouped(group_count, group_size, [m_array, n_array, k_array], "f32") }
}

blas_gap! {
    /// `cublasDgemmGroupedBatched`: f64 grouped GEMM (MoE).
    cublasDgemmGroupedBatched(
        handle: cublasHandle_t,
        transa_array: *const cublasOperation_t,
        transb_array: *const cublasOperation_t,
        m_array: *const c_int,
        n_array: *const c_int,
        k_array: *const c_int,
        alpha_array: *const f64,
        Aarray: *const *const f64,
        lda_array: *const c_int,
        Barray: *const *const f64,
        ldb_array: *const c_int,
        beta_array: *const f64,
        Carray: *const *mut f64,
        ldc_array: *const c_int,
        group_count: c_int,
        group_size: *const c_int,
    ) => ShapeUnknown,
            // SAFETY: cuBLAS's contract: host arrays of `group_count` elements.
            unsafe { grouped(group_count, group_size, [m_array, n_array, k_array], "f64") }
}

blas_gap! {
    /// `cublasGemmGroupedBatchedEx`: mixed-precision grouped GEMM (MoE).
    cublasGemmGroupedBatchedEx(
        handle: cublasHandle_t,
        transa_array: *const cublasOperation_t,
        transb_array: *const cublasOperation_t,
        m_array: *const c_int,
        n_array: *const c_int,
        k_array: *const c_int,
        alpha_array: *const c_void,
        Aarray: *const *const c_void,
        Atype: cudaDataType_t,
        lda_array: *const c_int,
        Barray: *const *const c_void,
        Btype: cudaDataType_t,
        ldb_array: *const c_int,
        beta_array: *const c_void,
        Carray: *const *mut c_void,
        Ctype: cudaDataType_t,
        ldc_array: *const c_int,
        group_count: c_int,
        group_size: *const c_int,
        computeType: cublasComputeType_t,
    ) => ShapeUnknown,
            // SAFETY: cuBLAS's contract: host arrays of `group_count` elements.
            unsafe {
                let types =
                    format!("Atype={Atype} Btype={Btype} Ctype={Ctype} computeType={computeType}");
                grouped(group_count, group_size, [m_array, n_array, k_array], &types)
            }
}

blas_gap! {
    /// `cublasSgemvBatched`: f32 pointer-array gemv batch.
    cublasSgemvBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const f32,
        Aarray: *const *const f32,
        lda: c_int,
        xarray: *const *const f32,
        incx: c_int,
        beta: *const f32,
        yarray: *const *mut f32,
        incy: c_int,
        batchCount: c_int,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv f32")
}

blas_gap! {
    /// `cublasDgemvBatched`: f64 pointer-array gemv batch.
    cublasDgemvBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const f64,
        Aarray: *const *const f64,
        lda: c_int,
        xarray: *const *const f64,
        incx: c_int,
        beta: *const f64,
        yarray: *const *mut f64,
        incy: c_int,
        batchCount: c_int,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv f64")
}

blas_gap! {
    /// `cublasCgemvBatched`: complex f32 pointer-array gemv batch.
    cublasCgemvBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const cuComplex,
        Aarray: *const *const cuComplex,
        lda: c_int,
        xarray: *const *const cuComplex,
        incx: c_int,
        beta: *const cuComplex,
        yarray: *const *mut cuComplex,
        incy: c_int,
        batchCount: c_int,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv complex f32")
}

blas_gap! {
    /// `cublasZgemvBatched`: complex f64 pointer-array gemv batch.
    cublasZgemvBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const cuDoubleComplex,
        Aarray: *const *const cuDoubleComplex,
        lda: c_int,
        xarray: *const *const cuDoubleComplex,
        incx: c_int,
        beta: *const cuDoubleComplex,
        yarray: *const *mut cuDoubleComplex,
        incy: c_int,
        batchCount: c_int,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv complex f64")
}

blas_gap! {
    /// `cublasHSHgemvBatched`: mixed-precision pointer-array gemv batch (HSH).
    cublasHSHgemvBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const f32,
        Aarray: *const *const __half,
        lda: c_int,
        xarray: *const *const __half,
        incx: c_int,
        beta: *const f32,
        yarray: *const *mut __half,
        incy: c_int,
        batchCount: c_int,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv HSH")
}

blas_gap! {
    /// `cublasHSSgemvBatched`: mixed-precision pointer-array gemv batch (HSS).
    cublasHSSgemvBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const f32,
        Aarray: *const *const __half,
        lda: c_int,
        xarray: *const *const __half,
        incx: c_int,
        beta: *const f32,
        yarray: *const *mut f32,
        incy: c_int,
        batchCount: c_int,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv HSS")
}

blas_gap! {
    /// `cublasTSTgemvBatched`: mixed-precision pointer-array gemv batch (TST).
    cublasTSTgemvBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const f32,
        Aarray: *const *const __nv_bfloat16,
        lda: c_int,
        xarray: *const *const __nv_bfloat16,
        incx: c_int,
        beta: *const f32,
        yarray: *const *mut __nv_bfloat16,
        incy: c_int,
        batchCount: c_int,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv TST")
}

blas_gap! {
    /// `cublasTSSgemvBatched`: mixed-precision pointer-array gemv batch (TSS).
    cublasTSSgemvBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const f32,
        Aarray: *const *const __nv_bfloat16,
        lda: c_int,
        xarray: *const *const __nv_bfloat16,
        incx: c_int,
        beta: *const f32,
        yarray: *const *mut f32,
        incy: c_int,
        batchCount: c_int,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv TSS")
}

blas_gap! {
    /// `cublasCgemm_v2`: complex f32 GEMM.
    cublasCgemm_v2(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const cuComplex,
        A: *const cuComplex,
        lda: c_int,
        B: *const cuComplex,
        ldb: c_int,
        beta: *const cuComplex,
        C: *mut cuComplex,
        ldc: c_int,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k}"))
}

blas_gap! {
    /// `cublasCgemm3m`: complex f32 GEMM (3m).
    cublasCgemm3m(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const cuComplex,
        A: *const cuComplex,
        lda: c_int,
        B: *const cuComplex,
        ldb: c_int,
        beta: *const cuComplex,
        C: *mut cuComplex,
        ldc: c_int,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k}"))
}

blas_gap! {
    /// `cublasCgemmStridedBatched`: complex f32 strided-batched GEMM.
    cublasCgemmStridedBatched(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const cuComplex,
        A: *const cuComplex,
        lda: c_int,
        strideA: c_longlong,
        B: *const cuComplex,
        ldb: c_int,
        strideB: c_longlong,
        beta: *const cuComplex,
        C: *mut cuComplex,
        ldc: c_int,
        strideC: c_longlong,
        batchCount: c_int,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k} batch={batchCount}"))
}

blas_gap! {
    /// `cublasZgemm_v2`: complex f64 GEMM.
    cublasZgemm_v2(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const cuDoubleComplex,
        A: *const cuDoubleComplex,
        lda: c_int,
        B: *const cuDoubleComplex,
        ldb: c_int,
        beta: *const cuDoubleComplex,
        C: *mut cuDoubleComplex,
        ldc: c_int,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k}"))
}

blas_gap! {
    /// `cublasZgemm3m`: complex f64 GEMM (3m).
    cublasZgemm3m(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const cuDoubleComplex,
        A: *const cuDoubleComplex,
        lda: c_int,
        B: *const cuDoubleComplex,
        ldb: c_int,
        beta: *const cuDoubleComplex,
        C: *mut cuDoubleComplex,
        ldc: c_int,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k}"))
}

blas_gap! {
    /// `cublasZgemmStridedBatched`: complex f64 strided-batched GEMM.
    cublasZgemmStridedBatched(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const cuDoubleComplex,
        A: *const cuDoubleComplex,
        lda: c_int,
        strideA: c_longlong,
        B: *const cuDoubleComplex,
        ldb: c_int,
        strideB: c_longlong,
        beta: *const cuDoubleComplex,
        C: *mut cuDoubleComplex,
        ldc: c_int,
        strideC: c_longlong,
        batchCount: c_int,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k} batch={batchCount}"))
}

blas_gap! {
    /// `cublasCgemmEx`: complex mixed-precision GEMM.
    cublasCgemmEx(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const cuComplex,
        A: *const c_void,
        Atype: cudaDataType,
        lda: c_int,
        B: *const c_void,
        Btype: cudaDataType,
        ldb: c_int,
        beta: *const cuComplex,
        C: *mut c_void,
        Ctype: cudaDataType,
        ldc: c_int,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k} Atype={Atype} Ctype={Ctype}"))
}

blas_gap! {
    /// `cublasCgemm3mEx`: complex mixed-precision GEMM (3m).
    cublasCgemm3mEx(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const cuComplex,
        A: *const c_void,
        Atype: cudaDataType,
        lda: c_int,
        B: *const c_void,
        Btype: cudaDataType,
        ldb: c_int,
        beta: *const cuComplex,
        C: *mut c_void,
        Ctype: cudaDataType,
        ldc: c_int,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k} Atype={Atype} Ctype={Ctype}"))
}

blas_gap! {
    /// `cublasCgemm3mStridedBatched`: complex strided-batched GEMM (3m).
    cublasCgemm3mStridedBatched(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: *const cuComplex,
        A: *const cuComplex,
        lda: c_int,
        strideA: c_longlong,
        B: *const cuComplex,
        ldb: c_int,
        strideB: c_longlong,
        beta: *const cuComplex,
        C: *mut cuComplex,
        ldc: c_int,
        strideC: c_longlong,
        batchCount: c_int,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k} batch={batchCount}"))
}

gemm_hook! {
    /// `cublasSgemv_v2`: f32 matrix-vector product, captured as the GEMM it is (see [`gemv`]).
    cublasSgemv_v2(
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
    ) => (mode::GEMM)
    gemv(
        handle,
        trans,
        [w(m), w(n)],
        [alpha.cast(), beta.cast()],
        (A.cast(), w(lda)),
        (x.cast(), w(incx)),
        (y.cast_const().cast(), w(incy)),
        (CUDA_R_32F, CUBLAS_COMPUTE_32F),
    )
}

blas_gap! {
    /// `cublasSgemvStridedBatched`: f32 strided-batched matrix-vector product.
    cublasSgemvStridedBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const f32,
        A: *const f32,
        lda: c_int,
        strideA: c_longlong,
        x: *const f32,
        incx: c_int,
        stridex: c_longlong,
        beta: *const f32,
        y: *mut f32,
        incy: c_int,
        stridey: c_longlong,
        batchCount: c_int,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

gemm_hook! {
    /// `cublasDgemv_v2`: f64 matrix-vector product, captured as the GEMM it is (see [`gemv`]).
    cublasDgemv_v2(
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
    ) => (mode::GEMM)
    gemv(
        handle,
        trans,
        [w(m), w(n)],
        [alpha.cast(), beta.cast()],
        (A.cast(), w(lda)),
        (x.cast(), w(incx)),
        (y.cast_const().cast(), w(incy)),
        (CUDA_R_64F, CUBLAS_COMPUTE_64F),
    )
}

blas_gap! {
    /// `cublasDgemvStridedBatched`: f64 strided-batched matrix-vector product.
    cublasDgemvStridedBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const f64,
        A: *const f64,
        lda: c_int,
        strideA: c_longlong,
        x: *const f64,
        incx: c_int,
        stridex: c_longlong,
        beta: *const f64,
        y: *mut f64,
        incy: c_int,
        stridey: c_longlong,
        batchCount: c_int,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

blas_gap! {
    /// `cublasCgemv_v2`: complex f32 matrix-vector product.
    cublasCgemv_v2(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const cuComplex,
        A: *const cuComplex,
        lda: c_int,
        x: *const cuComplex,
        incx: c_int,
        beta: *const cuComplex,
        y: *mut cuComplex,
        incy: c_int,
    ) => Unsupported,
            not_captured(
                "matrix-vector products",
                format!("m={m} n={n} trans={trans} incx={incx} incy={incy}")
            )
}

blas_gap! {
    /// `cublasCgemvStridedBatched`: complex f32 strided-batched matrix-vector product.
    cublasCgemvStridedBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const cuComplex,
        A: *const cuComplex,
        lda: c_int,
        strideA: c_longlong,
        x: *const cuComplex,
        incx: c_int,
        stridex: c_longlong,
        beta: *const cuComplex,
        y: *mut cuComplex,
        incy: c_int,
        stridey: c_longlong,
        batchCount: c_int,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

blas_gap! {
    /// `cublasZgemv_v2`: complex f64 matrix-vector product.
    cublasZgemv_v2(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const cuDoubleComplex,
        A: *const cuDoubleComplex,
        lda: c_int,
        x: *const cuDoubleComplex,
        incx: c_int,
        beta: *const cuDoubleComplex,
        y: *mut cuDoubleComplex,
        incy: c_int,
    ) => Unsupported,
            not_captured(
                "matrix-vector products",
                format!("m={m} n={n} trans={trans} incx={incx} incy={incy}")
            )
}

blas_gap! {
    /// `cublasZgemvStridedBatched`: complex f64 strided-batched matrix-vector product.
    cublasZgemvStridedBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const cuDoubleComplex,
        A: *const cuDoubleComplex,
        lda: c_int,
        strideA: c_longlong,
        x: *const cuDoubleComplex,
        incx: c_int,
        stridex: c_longlong,
        beta: *const cuDoubleComplex,
        y: *mut cuDoubleComplex,
        incy: c_int,
        stridey: c_longlong,
        batchCount: c_int,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

blas_gap! {
    /// `cublasHSHgemvStridedBatched`: mixed-precision strided-batched gemv (HSH).
    cublasHSHgemvStridedBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const f32,
        A: *const __half,
        lda: c_int,
        strideA: c_longlong,
        x: *const __half,
        incx: c_int,
        stridex: c_longlong,
        beta: *const f32,
        y: *mut __half,
        incy: c_int,
        stridey: c_longlong,
        batchCount: c_int,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

blas_gap! {
    /// `cublasHSSgemvStridedBatched`: mixed-precision strided-batched gemv (HSS).
    cublasHSSgemvStridedBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const f32,
        A: *const __half,
        lda: c_int,
        strideA: c_longlong,
        x: *const __half,
        incx: c_int,
        stridex: c_longlong,
        beta: *const f32,
        y: *mut f32,
        incy: c_int,
        stridey: c_longlong,
        batchCount: c_int,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

blas_gap! {
    /// `cublasTSTgemvStridedBatched`: mixed-precision strided-batched gemv (TST).
    cublasTSTgemvStridedBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const f32,
        A: *const __nv_bfloat16,
        lda: c_int,
        strideA: c_longlong,
        x: *const __nv_bfloat16,
        incx: c_int,
        stridex: c_longlong,
        beta: *const f32,
        y: *mut __nv_bfloat16,
        incy: c_int,
        stridey: c_longlong,
        batchCount: c_int,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

blas_gap! {
    /// `cublasTSSgemvStridedBatched`: mixed-precision strided-batched gemv (TSS).
    cublasTSSgemvStridedBatched(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: c_int,
        n: c_int,
        alpha: *const f32,
        A: *const __nv_bfloat16,
        lda: c_int,
        strideA: c_longlong,
        x: *const __nv_bfloat16,
        incx: c_int,
        stridex: c_longlong,
        beta: *const f32,
        y: *mut f32,
        incy: c_int,
        stridey: c_longlong,
        batchCount: c_int,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

gemm_hook! {
    /// `cublasSgemmBatched_64`: f32 pointer-array batch.
    cublasSgemmBatched_64(
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
    ) => (mode::GEMM)
    pointer_batch(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            (Aarray.cast(), CUDA_R_32F, w(lda)),
            (Barray.cast(), CUDA_R_32F, w(ldb)),
            (Carray.cast(), CUDA_R_32F, w(ldc)),
        ],
        w(batchCount),
        single_precision_compute(handle),
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasDgemmBatched_64`: f64 pointer-array batch.
    cublasDgemmBatched_64(
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
    ) => (mode::GEMM)
    pointer_batch(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            (Aarray.cast(), CUDA_R_64F, w(lda)),
            (Barray.cast(), CUDA_R_64F, w(ldb)),
            (Carray.cast(), CUDA_R_64F, w(ldc)),
        ],
        w(batchCount),
        CUBLAS_COMPUTE_64F,
        CUBLAS_GEMM_DEFAULT,
    )
}

gemm_hook! {
    /// `cublasHgemmBatched_64`: f16 pointer-array batch.
    cublasHgemmBatched_64(
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
    ) => (mode::GEMM)
    pointer_batch(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            (Aarray.cast(), CUDA_R_16F, w(lda)),
            (Barray.cast(), CUDA_R_16F, w(ldb)),
            (Carray.cast(), CUDA_R_16F, w(ldc)),
        ],
        w(batchCount),
        CUBLAS_COMPUTE_16F,
        CUBLAS_GEMM_DEFAULT,
    )
}

blas_gap! {
    /// `cublasCgemmBatched_64`: complex f32 pointer-array batch.
    cublasCgemmBatched_64(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: i64,
        n: i64,
        k: i64,
        alpha: *const cuComplex,
        Aarray: *const *const cuComplex,
        lda: i64,
        Barray: *const *const cuComplex,
        ldb: i64,
        beta: *const cuComplex,
        Carray: *const *mut cuComplex,
        ldc: i64,
        batchCount: i64,
    ) => ShapeUnknown,
            pointer_arrays(m, n, k, batchCount, "complex f32")
}

blas_gap! {
    /// `cublasZgemmBatched_64`: complex f64 pointer-array batch.
    cublasZgemmBatched_64(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: i64,
        n: i64,
        k: i64,
        alpha: *const cuDoubleComplex,
        Aarray: *const *const cuDoubleComplex,
        lda: i64,
        Barray: *const *const cuDoubleComplex,
        ldb: i64,
        beta: *const cuDoubleComplex,
        Carray: *const *mut cuDoubleComplex,
        ldc: i64,
        batchCount: i64,
    ) => ShapeUnknown,
            pointer_arrays(m, n, k, batchCount, "complex f64")
}

blas_gap! {
    /// `cublasCgemm3mBatched_64`: complex f32 pointer-array batch (3m).
    cublasCgemm3mBatched_64(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: i64,
        n: i64,
        k: i64,
        alpha: *const cuComplex,
        Aarray: *const *const cuComplex,
        lda: i64,
        Barray: *const *const cuComplex,
        ldb: i64,
        beta: *const cuComplex,
        Carray: *const *mut cuComplex,
        ldc: i64,
        batchCount: i64,
    ) => ShapeUnknown,
            pointer_arrays(m, n, k, batchCount, "complex f32")
}

gemm_hook! {
    /// `cublasGemmBatchedEx_64`: mixed-precision pointer-array batch.
    cublasGemmBatchedEx_64(
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
    ) => (mode::GEMM)
    pointer_batch(
        handle,
        [transa, transb],
        [w(m), w(n), w(k)],
        [alpha.cast(), beta.cast()],
        [
            (Aarray.cast(), Atype, w(lda)),
            (Barray.cast(), Btype, w(ldb)),
            (Carray.cast(), Ctype, w(ldc)),
        ],
        w(batchCount),
        computeType,
        algo,
    )
}

blas_gap! {
    /// `cublasSgemmGroupedBatched_64`: f32 grouped GEMM (MoE).
    cublasSgemmGroupedBatched_64(
        handle: cublasHandle_t,
        transa_array: *const cublasOperation_t,
        transb_array: *const cublasOperation_t,
        m_array: *const i64,
        n_array: *const i64,
        k_array: *const i64,
        alpha_array: *const f32,
        Aarray: *const *const f32,
        lda_array: *const i64,
        Barray: *const *const f32,
        ldb_array: *const i64,
        beta_array: *const f32,
        Carray: *const *mut f32,
        ldc_array: *const i64,
        group_count: i64,
        group_size: *const i64,
    ) => ShapeUnknown,
            // SAFETY: cuBLAS's contract: host arrays of `group_count` elements.
            unsafe { grouped(group_count, group_size, [m_array, n_array, k_array], "f32") }
}

blas_gap! {
    /// `cublasDgemmGroupedBatched_64`: f64 grouped GEMM (MoE).
    cublasDgemmGroupedBatched_64(
        handle: cublasHandle_t,
        transa_array: *const cublasOperation_t,
        transb_array: *const cublasOperation_t,
        m_array: *const i64,
        n_array: *const i64,
        k_array: *const i64,
        alpha_array: *const f64,
        Aarray: *const *const f64,
        lda_array: *const i64,
        Barray: *const *const f64,
        ldb_array: *const i64,
        beta_array: *const f64,
        Carray: *const *mut f64,
        ldc_array: *const i64,
        group_count: i64,
        group_size: *const i64,
    ) => ShapeUnknown,
            // SAFETY: cuBLAS's contract: host arrays of `group_count` elements.
            unsafe { grouped(group_count, group_size, [m_array, n_array, k_array], "f64") }
}

blas_gap! {
    /// `cublasGemmGroupedBatchedEx_64`: mixed-precision grouped GEMM (MoE).
    cublasGemmGroupedBatchedEx_64(
        handle: cublasHandle_t,
        transa_array: *const cublasOperation_t,
        transb_array: *const cublasOperation_t,
        m_array: *const i64,
        n_array: *const i64,
        k_array: *const i64,
        alpha_array: *const c_void,
        Aarray: *const *const c_void,
        Atype: cudaDataType_t,
        lda_array: *const i64,
        Barray: *const *const c_void,
        Btype: cudaDataType_t,
        ldb_array: *const i64,
        beta_array: *const c_void,
        Carray: *const *mut c_void,
        Ctype: cudaDataType_t,
        ldc_array: *const i64,
        group_count: i64,
        group_size: *const i64,
        computeType: cublasComputeType_t,
    ) => ShapeUnknown,
            // SAFETY: cuBLAS's contract: host arrays of `group_count` elements.
            unsafe {
                let types =
                    format!("Atype={Atype} Btype={Btype} Ctype={Ctype} computeType={computeType}");
                grouped(group_count, group_size, [m_array, n_array, k_array], &types)
            }
}

blas_gap! {
    /// `cublasSgemvBatched_64`: f32 pointer-array gemv batch.
    cublasSgemvBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const f32,
        Aarray: *const *const f32,
        lda: i64,
        xarray: *const *const f32,
        incx: i64,
        beta: *const f32,
        yarray: *const *mut f32,
        incy: i64,
        batchCount: i64,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv f32")
}

blas_gap! {
    /// `cublasDgemvBatched_64`: f64 pointer-array gemv batch.
    cublasDgemvBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const f64,
        Aarray: *const *const f64,
        lda: i64,
        xarray: *const *const f64,
        incx: i64,
        beta: *const f64,
        yarray: *const *mut f64,
        incy: i64,
        batchCount: i64,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv f64")
}

blas_gap! {
    /// `cublasCgemvBatched_64`: complex f32 pointer-array gemv batch.
    cublasCgemvBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const cuComplex,
        Aarray: *const *const cuComplex,
        lda: i64,
        xarray: *const *const cuComplex,
        incx: i64,
        beta: *const cuComplex,
        yarray: *const *mut cuComplex,
        incy: i64,
        batchCount: i64,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv complex f32")
}

blas_gap! {
    /// `cublasZgemvBatched_64`: complex f64 pointer-array gemv batch.
    cublasZgemvBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const cuDoubleComplex,
        Aarray: *const *const cuDoubleComplex,
        lda: i64,
        xarray: *const *const cuDoubleComplex,
        incx: i64,
        beta: *const cuDoubleComplex,
        yarray: *const *mut cuDoubleComplex,
        incy: i64,
        batchCount: i64,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv complex f64")
}

blas_gap! {
    /// `cublasHSHgemvBatched_64`: mixed-precision pointer-array gemv batch (HSH).
    cublasHSHgemvBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const f32,
        Aarray: *const *const __half,
        lda: i64,
        xarray: *const *const __half,
        incx: i64,
        beta: *const f32,
        yarray: *const *mut __half,
        incy: i64,
        batchCount: i64,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv HSH")
}

blas_gap! {
    /// `cublasHSSgemvBatched_64`: mixed-precision pointer-array gemv batch (HSS).
    cublasHSSgemvBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const f32,
        Aarray: *const *const __half,
        lda: i64,
        xarray: *const *const __half,
        incx: i64,
        beta: *const f32,
        yarray: *const *mut f32,
        incy: i64,
        batchCount: i64,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv HSS")
}

blas_gap! {
    /// `cublasTSTgemvBatched_64`: mixed-precision pointer-array gemv batch (TST).
    cublasTSTgemvBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const f32,
        Aarray: *const *const __nv_bfloat16,
        lda: i64,
        xarray: *const *const __nv_bfloat16,
        incx: i64,
        beta: *const f32,
        yarray: *const *mut __nv_bfloat16,
        incy: i64,
        batchCount: i64,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv TST")
}

blas_gap! {
    /// `cublasTSSgemvBatched_64`: mixed-precision pointer-array gemv batch (TSS).
    cublasTSSgemvBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const f32,
        Aarray: *const *const __nv_bfloat16,
        lda: i64,
        xarray: *const *const __nv_bfloat16,
        incx: i64,
        beta: *const f32,
        yarray: *const *mut f32,
        incy: i64,
        batchCount: i64,
    ) => ShapeUnknown,
            pointer_arrays(m, n, 1, batchCount, "gemv TSS")
}

blas_gap! {
    /// `cublasCgemm_v2_64`: complex f32 GEMM.
    cublasCgemm_v2_64(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: i64,
        n: i64,
        k: i64,
        alpha: *const cuComplex,
        A: *const cuComplex,
        lda: i64,
        B: *const cuComplex,
        ldb: i64,
        beta: *const cuComplex,
        C: *mut cuComplex,
        ldc: i64,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k}"))
}

blas_gap! {
    /// `cublasCgemm3m_64`: complex f32 GEMM (3m).
    cublasCgemm3m_64(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: i64,
        n: i64,
        k: i64,
        alpha: *const cuComplex,
        A: *const cuComplex,
        lda: i64,
        B: *const cuComplex,
        ldb: i64,
        beta: *const cuComplex,
        C: *mut cuComplex,
        ldc: i64,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k}"))
}

blas_gap! {
    /// `cublasCgemmStridedBatched_64`: complex f32 strided-batched GEMM.
    cublasCgemmStridedBatched_64(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: i64,
        n: i64,
        k: i64,
        alpha: *const cuComplex,
        A: *const cuComplex,
        lda: i64,
        strideA: c_longlong,
        B: *const cuComplex,
        ldb: i64,
        strideB: c_longlong,
        beta: *const cuComplex,
        C: *mut cuComplex,
        ldc: i64,
        strideC: c_longlong,
        batchCount: i64,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k} batch={batchCount}"))
}

blas_gap! {
    /// `cublasZgemm_v2_64`: complex f64 GEMM.
    cublasZgemm_v2_64(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: i64,
        n: i64,
        k: i64,
        alpha: *const cuDoubleComplex,
        A: *const cuDoubleComplex,
        lda: i64,
        B: *const cuDoubleComplex,
        ldb: i64,
        beta: *const cuDoubleComplex,
        C: *mut cuDoubleComplex,
        ldc: i64,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k}"))
}

blas_gap! {
    /// `cublasZgemm3m_64`: complex f64 GEMM (3m).
    cublasZgemm3m_64(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: i64,
        n: i64,
        k: i64,
        alpha: *const cuDoubleComplex,
        A: *const cuDoubleComplex,
        lda: i64,
        B: *const cuDoubleComplex,
        ldb: i64,
        beta: *const cuDoubleComplex,
        C: *mut cuDoubleComplex,
        ldc: i64,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k}"))
}

blas_gap! {
    /// `cublasZgemmStridedBatched_64`: complex f64 strided-batched GEMM.
    cublasZgemmStridedBatched_64(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: i64,
        n: i64,
        k: i64,
        alpha: *const cuDoubleComplex,
        A: *const cuDoubleComplex,
        lda: i64,
        strideA: c_longlong,
        B: *const cuDoubleComplex,
        ldb: i64,
        strideB: c_longlong,
        beta: *const cuDoubleComplex,
        C: *mut cuDoubleComplex,
        ldc: i64,
        strideC: c_longlong,
        batchCount: i64,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k} batch={batchCount}"))
}

blas_gap! {
    /// `cublasCgemmEx_64`: complex mixed-precision GEMM.
    cublasCgemmEx_64(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: i64,
        n: i64,
        k: i64,
        alpha: *const cuComplex,
        A: *const c_void,
        Atype: cudaDataType,
        lda: i64,
        B: *const c_void,
        Btype: cudaDataType,
        ldb: i64,
        beta: *const cuComplex,
        C: *mut c_void,
        Ctype: cudaDataType,
        ldc: i64,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k} Atype={Atype} Ctype={Ctype}"))
}

blas_gap! {
    /// `cublasCgemm3mEx_64`: complex mixed-precision GEMM (3m).
    cublasCgemm3mEx_64(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: i64,
        n: i64,
        k: i64,
        alpha: *const cuComplex,
        A: *const c_void,
        Atype: cudaDataType,
        lda: i64,
        B: *const c_void,
        Btype: cudaDataType,
        ldb: i64,
        beta: *const cuComplex,
        C: *mut c_void,
        Ctype: cudaDataType,
        ldc: i64,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k} Atype={Atype} Ctype={Ctype}"))
}

blas_gap! {
    /// `cublasCgemm3mStridedBatched_64`: complex strided-batched GEMM (3m).
    cublasCgemm3mStridedBatched_64(
        handle: cublasHandle_t,
        transa: cublasOperation_t,
        transb: cublasOperation_t,
        m: i64,
        n: i64,
        k: i64,
        alpha: *const cuComplex,
        A: *const cuComplex,
        lda: i64,
        strideA: c_longlong,
        B: *const cuComplex,
        ldb: i64,
        strideB: c_longlong,
        beta: *const cuComplex,
        C: *mut cuComplex,
        ldc: i64,
        strideC: c_longlong,
        batchCount: i64,
    ) => Unsupported,
            not_captured("complex GEMMs", format!("m={m} n={n} k={k} batch={batchCount}"))
}

gemm_hook! {
    /// `cublasSgemv_v2_64`: `cublasSgemv_v2` with 64-bit sizes.
    cublasSgemv_v2_64(
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
    ) => (mode::GEMM)
    gemv(
        handle,
        trans,
        [w(m), w(n)],
        [alpha.cast(), beta.cast()],
        (A.cast(), w(lda)),
        (x.cast(), w(incx)),
        (y.cast_const().cast(), w(incy)),
        (CUDA_R_32F, CUBLAS_COMPUTE_32F),
    )
}

blas_gap! {
    /// `cublasSgemvStridedBatched_64`: f32 strided-batched matrix-vector product.
    cublasSgemvStridedBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const f32,
        A: *const f32,
        lda: i64,
        strideA: c_longlong,
        x: *const f32,
        incx: i64,
        stridex: c_longlong,
        beta: *const f32,
        y: *mut f32,
        incy: i64,
        stridey: c_longlong,
        batchCount: i64,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

gemm_hook! {
    /// `cublasDgemv_v2_64`: `cublasDgemv_v2` with 64-bit sizes.
    cublasDgemv_v2_64(
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
    ) => (mode::GEMM)
    gemv(
        handle,
        trans,
        [w(m), w(n)],
        [alpha.cast(), beta.cast()],
        (A.cast(), w(lda)),
        (x.cast(), w(incx)),
        (y.cast_const().cast(), w(incy)),
        (CUDA_R_64F, CUBLAS_COMPUTE_64F),
    )
}

blas_gap! {
    /// `cublasDgemvStridedBatched_64`: f64 strided-batched matrix-vector product.
    cublasDgemvStridedBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const f64,
        A: *const f64,
        lda: i64,
        strideA: c_longlong,
        x: *const f64,
        incx: i64,
        stridex: c_longlong,
        beta: *const f64,
        y: *mut f64,
        incy: i64,
        stridey: c_longlong,
        batchCount: i64,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

blas_gap! {
    /// `cublasCgemv_v2_64`: complex f32 matrix-vector product.
    cublasCgemv_v2_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const cuComplex,
        A: *const cuComplex,
        lda: i64,
        x: *const cuComplex,
        incx: i64,
        beta: *const cuComplex,
        y: *mut cuComplex,
        incy: i64,
    ) => Unsupported,
            not_captured(
                "matrix-vector products",
                format!("m={m} n={n} trans={trans} incx={incx} incy={incy}")
            )
}

blas_gap! {
    /// `cublasCgemvStridedBatched_64`: complex f32 strided-batched matrix-vector product.
    cublasCgemvStridedBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const cuComplex,
        A: *const cuComplex,
        lda: i64,
        strideA: c_longlong,
        x: *const cuComplex,
        incx: i64,
        stridex: c_longlong,
        beta: *const cuComplex,
        y: *mut cuComplex,
        incy: i64,
        stridey: c_longlong,
        batchCount: i64,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

blas_gap! {
    /// `cublasZgemv_v2_64`: complex f64 matrix-vector product.
    cublasZgemv_v2_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const cuDoubleComplex,
        A: *const cuDoubleComplex,
        lda: i64,
        x: *const cuDoubleComplex,
        incx: i64,
        beta: *const cuDoubleComplex,
        y: *mut cuDoubleComplex,
        incy: i64,
    ) => Unsupported,
            not_captured(
                "matrix-vector products",
                format!("m={m} n={n} trans={trans} incx={incx} incy={incy}")
            )
}

blas_gap! {
    /// `cublasZgemvStridedBatched_64`: complex f64 strided-batched matrix-vector product.
    cublasZgemvStridedBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const cuDoubleComplex,
        A: *const cuDoubleComplex,
        lda: i64,
        strideA: c_longlong,
        x: *const cuDoubleComplex,
        incx: i64,
        stridex: c_longlong,
        beta: *const cuDoubleComplex,
        y: *mut cuDoubleComplex,
        incy: i64,
        stridey: c_longlong,
        batchCount: i64,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

blas_gap! {
    /// `cublasHSHgemvStridedBatched_64`: mixed-precision strided-batched gemv (HSH).
    cublasHSHgemvStridedBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const f32,
        A: *const __half,
        lda: i64,
        strideA: c_longlong,
        x: *const __half,
        incx: i64,
        stridex: c_longlong,
        beta: *const f32,
        y: *mut __half,
        incy: i64,
        stridey: c_longlong,
        batchCount: i64,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

blas_gap! {
    /// `cublasHSSgemvStridedBatched_64`: mixed-precision strided-batched gemv (HSS).
    cublasHSSgemvStridedBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const f32,
        A: *const __half,
        lda: i64,
        strideA: c_longlong,
        x: *const __half,
        incx: i64,
        stridex: c_longlong,
        beta: *const f32,
        y: *mut f32,
        incy: i64,
        stridey: c_longlong,
        batchCount: i64,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

blas_gap! {
    /// `cublasTSTgemvStridedBatched_64`: mixed-precision strided-batched gemv (TST).
    cublasTSTgemvStridedBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const f32,
        A: *const __nv_bfloat16,
        lda: i64,
        strideA: c_longlong,
        x: *const __nv_bfloat16,
        incx: i64,
        stridex: c_longlong,
        beta: *const f32,
        y: *mut __nv_bfloat16,
        incy: i64,
        stridey: c_longlong,
        batchCount: i64,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}

blas_gap! {
    /// `cublasTSSgemvStridedBatched_64`: mixed-precision strided-batched gemv (TSS).
    cublasTSSgemvStridedBatched_64(
        handle: cublasHandle_t,
        trans: cublasOperation_t,
        m: i64,
        n: i64,
        alpha: *const f32,
        A: *const __nv_bfloat16,
        lda: i64,
        strideA: c_longlong,
        x: *const __nv_bfloat16,
        incx: i64,
        stridex: c_longlong,
        beta: *const f32,
        y: *mut f32,
        incy: i64,
        stridey: c_longlong,
        batchCount: i64,
    ) => Unsupported,
            not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
}
