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
//! Each signature is written once, as a line of the list at the end of this file
//! ([`cublas_sigs!`]): `(name, size type, element types, ...)` under its family. A family
//! macro (`typed_gemm!`, `gemm_ex!`, `complex_gemm!`, ...) writes the family's C signature and
//! its call to the typed core once, as a [`gemm_hook!`] for the GEMMs captured (typed, `Ex`,
//! strided-batched, pointer-array, gemv, in `int` and `_64` widths: thin shims over [`gemm`],
//! [`pointer_batch`], [`gemv`] and [`capture`]) or a [`blas_gap!`] for the entry points that
//! move tensor data but are not captured, which record a gap naming the API (no silent holes):
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
pub(super) const MISSING: cublasStatus_t = CUBLAS_STATUS_NOT_SUPPORTED;

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
    // A, B, C, D, the pointer arrays' checks, alpha and beta: one allocation.
    let mut tensors = Vec::with_capacity(6 + checks.len());
    tensors.push(operand(Role::A, &a, 0, When::After, true));
    tensors.push(operand(Role::B, &b, 1, When::After, true));
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
    around_blas_gemm(|| engine::begin(call(&g)?), real, || perturb_output(&g))
}

/// [`crate::around_gemm`] for cuBLAS and cuBLASLt: the output is perturbed, and the snapshot
/// completed as the GEMM's, only when the real call succeeded.
pub(super) fn around_blas_gemm(
    prepare: impl FnOnce() -> Option<engine::InFlight>,
    real: impl FnOnce() -> cublasStatus_t,
    perturb: impl FnOnce(),
) -> cublasStatus_t {
    crate::around_gemm(
        prepare,
        real,
        |r| {
            if r == CUBLAS_STATUS_SUCCESS {
                perturb();
            }
        },
        |f, r| engine::finish(f, r == CUBLAS_STATUS_SUCCESS),
    )
}

/// A perturbed reference run: noise on C, the output, on the handle's stream.
fn perturb_output(g: &Gemm) {
    // A pointer-array batch's outputs are not perturbed (where they are is read from the host
    // copy of its arrays only when captured).
    if g.m <= 0 || g.n <= 0 || g.batch <= 0 {
        return;
    }
    if g.arrays.is_some() {
        return perturb::left_alone("a pointer-array batch's outputs");
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
        op: Op::gap(
            GapReason::ShapeUnknown,
            g.api,
            0,
            format!(
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
        ),
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
            let Some(real) = real::real_of!($name, fn($($t),*) -> cublasStatus_t, Cublas) else {
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
            let Some(real) =
                real::real_of!($name, fn(cublasHandle_t $(, $t)*) -> cublasStatus_t, Cublas)
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

pub(super) use blas_gap;

/// The detail of the gap of a cuBLAS routine other than the GEMMs and gemv (hooks/cublas_routines.rs).
pub(super) fn routine_not_captured() -> String {
    "only cuBLAS's GEMMs and gemv are captured, not its other routines".into()
}

/// The gap of an uncaptured entry point, on the handle's stream, once the call succeeded.
pub(super) fn uncaptured(
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

/// One cuBLAS-XT routine (hooks/cublasxt_routines.rs, generated): `name(C signature) =>
/// GapReason`. XT spreads the routine over the devices its handle was given, on host or device
/// matrices, with streams and copies of its own: a successful call records a gap naming it (a
/// failed one moved nothing).
macro_rules! xt_gap {
    ($(#[$m:meta])* $name:ident ( $h:ident : cublasXtHandle_t $(, $a:ident : $t:ty)* $(,)? )
        => $reason:ident) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($h: cublasXtHandle_t $(, $a: $t)*) -> cublasStatus_t {
            let Some(real) =
                real::real_of!($name, fn(cublasXtHandle_t $(, $t)*) -> cublasStatus_t, Cublas)
            else {
                return MISSING;
            };
            if mode::off(mode::GEMM) {
                // SAFETY: the program's arguments, forwarded unchanged.
                return unsafe { real($h $(, $a)*) };
            }
            gap_without_stream(
                stringify!($name),
                GapReason::$reason,
                "cuBLAS-XT routines (several devices, host or device matrices) are not captured",
                // SAFETY: as above.
                || unsafe { real($h $(, $a)*) },
                |r| r == CUBLAS_STATUS_SUCCESS,
            )
        }
    };
}

pub(super) use xt_gap;

/// One routine of the legacy cuBLAS API (hooks/cublas_legacy.rs, generated): `name(C
/// signature) -> return type`. It has no handle (cuBLAS's own, on the stream
/// `cublasSetKernelStream` set) and reports failure only to `cublasGetError`, which clears it:
/// every call records an `unsupported` gap naming it, in call order, on the legacy default
/// stream. Without the real function it returns zero (its error then unknowable as NVIDIA's
/// own would be).
macro_rules! legacy_gap {
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? ) -> $ret:ty) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $ret {
            let Some(real) = real::real_of!($name, fn($($t),*) -> $ret, Cublas) else {
                // SAFETY: every legacy return type is plain data, zero a valid value.
                return unsafe { core::mem::zeroed() };
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            let run = || unsafe { real($($a),*) };
            if mode::off(mode::GEMM) {
                return run();
            }
            $crate::hooks::cublas::gap_without_stream(
                stringify!($name),
                ttrace_proto::record::GapReason::Unsupported,
                "the legacy cuBLAS API (cublas.h: no handle, the stream cublasSetKernelStream \
                 set) is not captured",
                run,
                |_| true,
            )
        }
    };
}

pub(super) use legacy_gap;

/// The gap of an entry point that runs on streams of its library's own (cuBLAS-XT's, the
/// legacy API's kernel stream), placed on the legacy default stream, recorded in call order once
/// `succeeded` says the call did.
pub(super) fn gap_without_stream<R: Copy>(
    api: &'static str,
    reason: GapReason,
    detail: &'static str,
    real: impl FnOnce() -> R,
    succeeded: impl FnOnce(R) -> bool,
) -> R {
    let op = || Some(Op::gap(reason, api, 0, detail));
    crate::around_metadata(api, core::ptr::null_mut(), op, real, succeeded)
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

/// The modes that make a GEMM capture whose output a perturbed reference run perturbs.
const GEMM_PERTURB: u32 = mode::GEMM | mode::PERTURB;

/// The family of `cublas{S,D,H}gemm`: `(name, size type, element type, cudaDataType, compute type
/// of the handle, modes that make it capture)` -> one [`gemm_hook!`].
macro_rules! typed_gemm {
    ($name:ident, $int:ty, $t:ty, $dtype:expr, $compute:expr, $modes:expr $(,)?) => {
        gemm_hook! {
            #[doc = concat!("`", stringify!($name), "`: GEMM of `", stringify!($t), "` (sizes `", stringify!($int), "`).")]
            $name(
                handle: cublasHandle_t,
                transa: cublasOperation_t,
                transb: cublasOperation_t,
                m: $int,
                n: $int,
                k: $int,
                alpha: *const $t,
                A: *const $t,
                lda: $int,
                B: *const $t,
                ldb: $int,
                beta: *const $t,
                C: *mut $t,
                ldc: $int,
            ) => ($modes)
            gemm(
                handle,
                [transa, transb],
                [w(m), w(n), w(k)],
                [alpha.cast(), beta.cast()],
                [
                    op(A.cast(), $dtype, lda, 0),
                    op(B.cast(), $dtype, ldb, 0),
                    op(C.cast_const().cast(), $dtype, ldc, 0),
                ],
                None,
                ($compute)(handle),
                CUBLAS_GEMM_DEFAULT,
            )
        }
    };
}

/// The family of `cublas{S,D,H}gemmStridedBatched`: `(name, size type, element type, cudaDataType, compute type
/// of the handle, modes that make it capture)` -> one [`gemm_hook!`].
macro_rules! typed_strided {
    ($name:ident, $int:ty, $t:ty, $dtype:expr, $compute:expr, $modes:expr $(,)?) => {
        gemm_hook! {
            #[doc = concat!("`", stringify!($name), "`: strided-batched GEMM of `", stringify!($t), "` (sizes `", stringify!($int), "`).")]
            $name(
                handle: cublasHandle_t,
                transa: cublasOperation_t,
                transb: cublasOperation_t,
                m: $int,
                n: $int,
                k: $int,
                alpha: *const $t,
                A: *const $t,
                lda: $int,
                strideA: c_longlong,
                B: *const $t,
                ldb: $int,
                strideB: c_longlong,
                beta: *const $t,
                C: *mut $t,
                ldc: $int,
                strideC: c_longlong,
                batchCount: $int,
            ) => ($modes)
            gemm(
                handle,
                [transa, transb],
                [w(m), w(n), w(k)],
                [alpha.cast(), beta.cast()],
                [
                    op(A.cast(), $dtype, lda, strideA),
                    op(B.cast(), $dtype, ldb, strideB),
                    op(C.cast_const().cast(), $dtype, ldc, strideC),
                ],
                Some(w(batchCount)),
                ($compute)(handle),
                CUBLAS_GEMM_DEFAULT,
            )
        }
    };
}

/// The family of `cublas{S,D,H}gemmBatched` (pointer arrays, see [`pointer_batch`]): `(name, size type, element type, cudaDataType, compute type
/// of the handle, modes that make it capture)` -> one [`gemm_hook!`].
macro_rules! typed_batched {
    ($name:ident, $int:ty, $t:ty, $dtype:expr, $compute:expr, $modes:expr $(,)?) => {
        gemm_hook! {
            #[doc = concat!("`", stringify!($name), "`: pointer-array batch of `", stringify!($t), "` (sizes `", stringify!($int), "`).")]
            $name(
                handle: cublasHandle_t,
                transa: cublasOperation_t,
                transb: cublasOperation_t,
                m: $int,
                n: $int,
                k: $int,
                alpha: *const $t,
                Aarray: *const *const $t,
                lda: $int,
                Barray: *const *const $t,
                ldb: $int,
                beta: *const $t,
                Carray: *const *mut $t,
                ldc: $int,
                batchCount: $int,
            ) => ($modes)
            pointer_batch(
                handle,
                [transa, transb],
                [w(m), w(n), w(k)],
                [alpha.cast(), beta.cast()],
                [
                    (Aarray.cast(), $dtype, w(lda)),
                    (Barray.cast(), $dtype, w(ldb)),
                    (Carray.cast(), $dtype, w(ldc)),
                ],
                w(batchCount),
                ($compute)(handle),
                CUBLAS_GEMM_DEFAULT,
            )
        }
    };
}

/// The family of `cublas{S,D}gemv`: `(name, size type, element type, cudaDataType, compute type
/// of the handle, modes that make it capture)` -> one [`gemm_hook!`].
macro_rules! typed_gemv {
    ($name:ident, $int:ty, $t:ty, $dtype:expr, $compute:expr, $modes:expr $(,)?) => {
        gemm_hook! {
            #[doc = concat!("`", stringify!($name), "`: matrix-vector product of `", stringify!($t), "` (sizes `", stringify!($int), "`), captured as the GEMM it is (see [`gemv`]).")]
            $name(
                handle: cublasHandle_t,
                trans: cublasOperation_t,
                m: $int,
                n: $int,
                alpha: *const $t,
                A: *const $t,
                lda: $int,
                x: *const $t,
                incx: $int,
                beta: *const $t,
                y: *mut $t,
                incy: $int,
            ) => ($modes)
            gemv(
                handle,
                trans,
                [w(m), w(n)],
                [alpha.cast(), beta.cast()],
                (A.cast(), w(lda)),
                (x.cast(), w(incx)),
                (y.cast_const().cast(), w(incy)),
                ($dtype, ($compute)(handle)),
            )
        }
    };
}

/// The family of `cublasSgemmEx`: `(name, size type)` -> one [`gemm_hook!`].
macro_rules! sgemm_ex {
    ($name:ident, $int:ty $(,)?) => {
        gemm_hook! {
            #[doc = concat!("`", stringify!($name), "`: typed operands, f32 scalars and accumulation (the handle's math mode; sizes `", stringify!($int), "`).")]
            $name(
                handle: cublasHandle_t,
                transa: cublasOperation_t,
                transb: cublasOperation_t,
                m: $int,
                n: $int,
                k: $int,
                alpha: *const f32,
                A: *const c_void,
                Atype: cudaDataType,
                lda: $int,
                B: *const c_void,
                Btype: cudaDataType,
                ldb: $int,
                beta: *const f32,
                C: *mut c_void,
                Ctype: cudaDataType,
                ldc: $int,
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
    };
}

/// The family of `cublasGemmEx`: `(name, size type)` -> one [`gemm_hook!`].
macro_rules! gemm_ex {
    ($name:ident, $int:ty $(,)?) => {
        gemm_hook! {
            #[doc = concat!("`", stringify!($name), "`: mixed-precision GEMM (sizes `", stringify!($int), "`; `computeType` read raw: 68/77, or a legacy `cudaDataType` such as 0 from callers that bypass `cublasMigrateComputeType`).")]
            $name(
                handle: cublasHandle_t,
                transa: cublasOperation_t,
                transb: cublasOperation_t,
                m: $int,
                n: $int,
                k: $int,
                alpha: *const c_void,
                A: *const c_void,
                Atype: cudaDataType,
                lda: $int,
                B: *const c_void,
                Btype: cudaDataType,
                ldb: $int,
                beta: *const c_void,
                C: *mut c_void,
                Ctype: cudaDataType,
                ldc: $int,
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
    };
}

/// The family of `cublasGemmStridedBatchedEx`: `(name, size type)` -> one [`gemm_hook!`].
macro_rules! gemm_strided_ex {
    ($name:ident, $int:ty $(,)?) => {
        gemm_hook! {
            #[doc = concat!("`", stringify!($name), "`: mixed-precision strided-batched GEMM (sizes `", stringify!($int), "`).")]
            $name(
                handle: cublasHandle_t,
                transa: cublasOperation_t,
                transb: cublasOperation_t,
                m: $int,
                n: $int,
                k: $int,
                alpha: *const c_void,
                A: *const c_void,
                Atype: cudaDataType,
                lda: $int,
                strideA: c_longlong,
                B: *const c_void,
                Btype: cudaDataType,
                ldb: $int,
                strideB: c_longlong,
                beta: *const c_void,
                C: *mut c_void,
                Ctype: cudaDataType,
                ldc: $int,
                strideC: c_longlong,
                batchCount: $int,
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
    };
}

/// The family of `cublasGemmBatchedEx` (pointer arrays, see [`pointer_batch`]): `(name, size type)` -> one [`gemm_hook!`].
macro_rules! gemm_batched_ex {
    ($name:ident, $int:ty $(,)?) => {
        gemm_hook! {
            #[doc = concat!("`", stringify!($name), "`: mixed-precision pointer-array batch (sizes `", stringify!($int), "`).")]
            $name(
                handle: cublasHandle_t,
                transa: cublasOperation_t,
                transb: cublasOperation_t,
                m: $int,
                n: $int,
                k: $int,
                alpha: *const c_void,
                Aarray: *const *const c_void,
                Atype: cudaDataType,
                lda: $int,
                Barray: *const *const c_void,
                Btype: cudaDataType,
                ldb: $int,
                beta: *const c_void,
                Carray: *const *mut c_void,
                Ctype: cudaDataType,
                ldc: $int,
                batchCount: $int,
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
    };
}

/// The list of cuBLAS's hooked signatures (at the end of this file): `family { (entry) ... }`
/// makes one hook per entry through the family's macro. The ABI test
/// (tests/integration/tests/it/intercept_abi.rs) expands each entry the same way and compiles
/// the signature against NVIDIA's headers. A new typed variant is one line in the list; a new
/// family is one macro plus its capture logic.
macro_rules! cublas_sigs {
    ($($family:ident { $(($($entry:tt)*))* })*) => {
        $($( $family! { $($entry)* } )*)*
    };
}

/// The family of `cublas{C,Z}gemmBatched`, `cublasCgemm3mBatched`, pointer-array batches of complex matrices (a gap each): `(name, size type, element type, label of the detail)` -> one
/// [`blas_gap!`].
macro_rules! complex_batched {
    ($name:ident, $int:ty, $t:ty, $label:literal $(,)?) => {
        blas_gap! {
            #[doc = concat!("`", stringify!($name), "`: pointer-array batches of complex matrices (not captured: a gap).")]
            $name(
                handle: cublasHandle_t,
                transa: cublasOperation_t,
                transb: cublasOperation_t,
                m: $int,
                n: $int,
                k: $int,
                alpha: *const $t,
                Aarray: *const *const $t,
                lda: $int,
                Barray: *const *const $t,
                ldb: $int,
                beta: *const $t,
                Carray: *const *mut $t,
                ldc: $int,
                batchCount: $int,
            ) => ShapeUnknown,
                    pointer_arrays(m, n, k, batchCount, $label)
        }
    };
}

/// The family of `cublas{S,D}gemmGroupedBatched`, typed grouped GEMMs (MoE) (a gap each): `(name, size type, element type, label of the detail)` -> one
/// [`blas_gap!`].
macro_rules! typed_grouped {
    ($name:ident, $int:ty, $t:ty, $label:literal $(,)?) => {
        blas_gap! {
            #[doc = concat!("`", stringify!($name), "`: typed grouped GEMMs (MoE) (not captured: a gap).")]
            $name(
                handle: cublasHandle_t,
                transa_array: *const cublasOperation_t,
                transb_array: *const cublasOperation_t,
                m_array: *const $int,
                n_array: *const $int,
                k_array: *const $int,
                alpha_array: *const $t,
                Aarray: *const *const $t,
                lda_array: *const $int,
                Barray: *const *const $t,
                ldb_array: *const $int,
                beta_array: *const $t,
                Carray: *const *mut $t,
                ldc_array: *const $int,
                group_count: $int,
                group_size: *const $int,
            ) => ShapeUnknown,
                    // SAFETY: cuBLAS's contract: host arrays of `group_count` elements.
                    unsafe { grouped(group_count, group_size, [m_array, n_array, k_array], $label) }
        }
    };
}

/// The family of `cublasGemmGroupedBatchedEx`, the mixed-precision grouped GEMM (MoE) (a gap each): `(name, size type)` -> one
/// [`blas_gap!`].
macro_rules! grouped_ex {
    ($name:ident, $int:ty $(,)?) => {
        blas_gap! {
            #[doc = concat!("`", stringify!($name), "`: the mixed-precision grouped GEMM (MoE) (not captured: a gap).")]
            $name(
                handle: cublasHandle_t,
                transa_array: *const cublasOperation_t,
                transb_array: *const cublasOperation_t,
                m_array: *const $int,
                n_array: *const $int,
                k_array: *const $int,
                alpha_array: *const c_void,
                Aarray: *const *const c_void,
                Atype: cudaDataType_t,
                lda_array: *const $int,
                Barray: *const *const c_void,
                Btype: cudaDataType_t,
                ldb_array: *const $int,
                beta_array: *const c_void,
                Carray: *const *mut c_void,
                Ctype: cudaDataType_t,
                ldc_array: *const $int,
                group_count: $int,
                group_size: *const $int,
                computeType: cublasComputeType_t,
            ) => ShapeUnknown,
                    // SAFETY: cuBLAS's contract: host arrays of `group_count` elements.
                    unsafe {
                        let types =
                            format!("Atype={Atype} Btype={Btype} Ctype={Ctype} computeType={computeType}");
                        grouped(group_count, group_size, [m_array, n_array, k_array], &types)
                    }
        }
    };
}

/// The family of `cublas{S,D,C,Z,HSH,HSS,TST,TSS}gemvBatched`, pointer-array gemv batches (a gap each): `(name, size type, scalar type, type of A and x, type of y, label of the detail)` -> one
/// [`blas_gap!`].
macro_rules! gemv_batched {
    ($name:ident, $int:ty, $s:ty, $a:ty, $y:ty, $label:literal $(,)?) => {
        blas_gap! {
            #[doc = concat!("`", stringify!($name), "`: pointer-array gemv batches (not captured: a gap).")]
            $name(
                handle: cublasHandle_t,
                trans: cublasOperation_t,
                m: $int,
                n: $int,
                alpha: *const $s,
                Aarray: *const *const $a,
                lda: $int,
                xarray: *const *const $a,
                incx: $int,
                beta: *const $s,
                yarray: *const *mut $y,
                incy: $int,
                batchCount: $int,
            ) => ShapeUnknown,
                    pointer_arrays(m, n, 1, batchCount, $label)
        }
    };
}

/// The family of `cublas{C,Z}gemm`, `cublas{C,Z}gemm3m`, complex GEMMs (a gap each): `(name, size type, element type)` -> one
/// [`blas_gap!`].
macro_rules! complex_gemm {
    ($name:ident, $int:ty, $t:ty $(,)?) => {
        blas_gap! {
            #[doc = concat!("`", stringify!($name), "`: complex GEMMs (not captured: a gap).")]
            $name(
                handle: cublasHandle_t,
                transa: cublasOperation_t,
                transb: cublasOperation_t,
                m: $int,
                n: $int,
                k: $int,
                alpha: *const $t,
                A: *const $t,
                lda: $int,
                B: *const $t,
                ldb: $int,
                beta: *const $t,
                C: *mut $t,
                ldc: $int,
            ) => Unsupported,
                    not_captured("complex GEMMs", format!("m={m} n={n} k={k}"))
        }
    };
}

/// The family of `cublas{C,Z}gemmStridedBatched`, `cublasCgemm3mStridedBatched`, complex strided-batched GEMMs (a gap each): `(name, size type, element type)` -> one
/// [`blas_gap!`].
macro_rules! complex_strided {
    ($name:ident, $int:ty, $t:ty $(,)?) => {
        blas_gap! {
            #[doc = concat!("`", stringify!($name), "`: complex strided-batched GEMMs (not captured: a gap).")]
            $name(
                handle: cublasHandle_t,
                transa: cublasOperation_t,
                transb: cublasOperation_t,
                m: $int,
                n: $int,
                k: $int,
                alpha: *const $t,
                A: *const $t,
                lda: $int,
                strideA: c_longlong,
                B: *const $t,
                ldb: $int,
                strideB: c_longlong,
                beta: *const $t,
                C: *mut $t,
                ldc: $int,
                strideC: c_longlong,
                batchCount: $int,
            ) => Unsupported,
                    not_captured("complex GEMMs", format!("m={m} n={n} k={k} batch={batchCount}"))
        }
    };
}

/// The family of `cublasCgemmEx`, `cublasCgemm3mEx`, complex mixed-precision GEMMs (a gap each): `(name, size type)` -> one
/// [`blas_gap!`].
macro_rules! complex_ex {
    ($name:ident, $int:ty $(,)?) => {
        blas_gap! {
            #[doc = concat!("`", stringify!($name), "`: complex mixed-precision GEMMs (not captured: a gap).")]
            $name(
                handle: cublasHandle_t,
                transa: cublasOperation_t,
                transb: cublasOperation_t,
                m: $int,
                n: $int,
                k: $int,
                alpha: *const cuComplex,
                A: *const c_void,
                Atype: cudaDataType,
                lda: $int,
                B: *const c_void,
                Btype: cudaDataType,
                ldb: $int,
                beta: *const cuComplex,
                C: *mut c_void,
                Ctype: cudaDataType,
                ldc: $int,
            ) => Unsupported,
                    not_captured("complex GEMMs", format!("m={m} n={n} k={k} Atype={Atype} Ctype={Ctype}"))
        }
    };
}

/// The family of `cublas{S,D,C,Z,HSH,HSS,TST,TSS}gemvStridedBatched`, strided-batched gemv (a gap each): `(name, size type, scalar type, type of A and x, type of y)` -> one
/// [`blas_gap!`].
macro_rules! gemv_strided {
    ($name:ident, $int:ty, $s:ty, $a:ty, $y:ty $(,)?) => {
        blas_gap! {
            #[doc = concat!("`", stringify!($name), "`: strided-batched gemv (not captured: a gap).")]
            $name(
                handle: cublasHandle_t,
                trans: cublasOperation_t,
                m: $int,
                n: $int,
                alpha: *const $s,
                A: *const $a,
                lda: $int,
                strideA: c_longlong,
                x: *const $a,
                incx: $int,
                stridex: c_longlong,
                beta: *const $s,
                y: *mut $y,
                incy: $int,
                stridey: c_longlong,
                batchCount: $int,
            ) => Unsupported,
                    not_captured("matrix-vector products", format!("m={m} n={n} batch={batchCount}"))
        }
    };
}

/// The family of `cublas{C,Z}gemv`, complex matrix-vector products (a gap each): `(name, size type, element type)` -> one
/// [`blas_gap!`].
macro_rules! complex_gemv {
    ($name:ident, $int:ty, $t:ty $(,)?) => {
        blas_gap! {
            #[doc = concat!("`", stringify!($name), "`: complex matrix-vector products (not captured: a gap).")]
            $name(
                handle: cublasHandle_t,
                trans: cublasOperation_t,
                m: $int,
                n: $int,
                alpha: *const $t,
                A: *const $t,
                lda: $int,
                x: *const $t,
                incx: $int,
                beta: *const $t,
                y: *mut $t,
                incy: $int,
            ) => Unsupported,
                    not_captured(
                        "matrix-vector products",
                        format!("m={m} n={n} trans={trans} incx={incx} incy={incy}")
                    )
        }
    };
}

// Every hooked cuBLAS entry point, one line each, by family: first those captured, then
// those that move tensor data but are not captured (each records a gap naming the API).
cublas_sigs! {
    typed_gemm {
        (cublasSgemm_v2, c_int, f32, CUDA_R_32F, single_precision_compute, GEMM_PERTURB)
        (cublasDgemm_v2, c_int, f64, CUDA_R_64F, |_| CUBLAS_COMPUTE_64F, mode::GEMM)
        (cublasHgemm, c_int, __half, CUDA_R_16F, |_| CUBLAS_COMPUTE_16F, GEMM_PERTURB)
        (cublasSgemm_v2_64, i64, f32, CUDA_R_32F, single_precision_compute, GEMM_PERTURB)
        (cublasDgemm_v2_64, i64, f64, CUDA_R_64F, |_| CUBLAS_COMPUTE_64F, mode::GEMM)
        (cublasHgemm_64, i64, __half, CUDA_R_16F, |_| CUBLAS_COMPUTE_16F, GEMM_PERTURB)
    }
    typed_strided {
        (cublasSgemmStridedBatched, c_int, f32, CUDA_R_32F, single_precision_compute, GEMM_PERTURB)
        (cublasDgemmStridedBatched, c_int, f64, CUDA_R_64F, |_| CUBLAS_COMPUTE_64F, mode::GEMM)
        (cublasHgemmStridedBatched, c_int, __half, CUDA_R_16F, |_| CUBLAS_COMPUTE_16F, GEMM_PERTURB)
        (cublasSgemmStridedBatched_64, i64, f32, CUDA_R_32F, single_precision_compute, GEMM_PERTURB)
        (cublasDgemmStridedBatched_64, i64, f64, CUDA_R_64F, |_| CUBLAS_COMPUTE_64F, mode::GEMM)
        (cublasHgemmStridedBatched_64, i64, __half, CUDA_R_16F, |_| CUBLAS_COMPUTE_16F, GEMM_PERTURB)
    }
    typed_batched {
        (cublasSgemmBatched, c_int, f32, CUDA_R_32F, single_precision_compute, mode::GEMM)
        (cublasDgemmBatched, c_int, f64, CUDA_R_64F, |_| CUBLAS_COMPUTE_64F, mode::GEMM)
        (cublasHgemmBatched, c_int, __half, CUDA_R_16F, |_| CUBLAS_COMPUTE_16F, mode::GEMM)
        (cublasSgemmBatched_64, i64, f32, CUDA_R_32F, single_precision_compute, mode::GEMM)
        (cublasDgemmBatched_64, i64, f64, CUDA_R_64F, |_| CUBLAS_COMPUTE_64F, mode::GEMM)
        (cublasHgemmBatched_64, i64, __half, CUDA_R_16F, |_| CUBLAS_COMPUTE_16F, mode::GEMM)
    }
    typed_gemv {
        (cublasSgemv_v2, c_int, f32, CUDA_R_32F, |_| CUBLAS_COMPUTE_32F, mode::GEMM)
        (cublasDgemv_v2, c_int, f64, CUDA_R_64F, |_| CUBLAS_COMPUTE_64F, mode::GEMM)
        (cublasSgemv_v2_64, i64, f32, CUDA_R_32F, |_| CUBLAS_COMPUTE_32F, mode::GEMM)
        (cublasDgemv_v2_64, i64, f64, CUDA_R_64F, |_| CUBLAS_COMPUTE_64F, mode::GEMM)
    }
    sgemm_ex {
        (cublasSgemmEx, c_int)
        (cublasSgemmEx_64, i64)
    }
    gemm_ex {
        (cublasGemmEx, c_int)
        (cublasGemmEx_64, i64)
    }
    gemm_strided_ex {
        (cublasGemmStridedBatchedEx, c_int)
        (cublasGemmStridedBatchedEx_64, i64)
    }
    gemm_batched_ex {
        (cublasGemmBatchedEx, c_int)
        (cublasGemmBatchedEx_64, i64)
    }
    complex_batched {
        (cublasCgemmBatched, c_int, cuComplex, "complex f32")
        (cublasZgemmBatched, c_int, cuDoubleComplex, "complex f64")
        (cublasCgemm3mBatched, c_int, cuComplex, "complex f32")
        (cublasCgemmBatched_64, i64, cuComplex, "complex f32")
        (cublasZgemmBatched_64, i64, cuDoubleComplex, "complex f64")
        (cublasCgemm3mBatched_64, i64, cuComplex, "complex f32")
    }
    typed_grouped {
        (cublasSgemmGroupedBatched, c_int, f32, "f32")
        (cublasDgemmGroupedBatched, c_int, f64, "f64")
        (cublasSgemmGroupedBatched_64, i64, f32, "f32")
        (cublasDgemmGroupedBatched_64, i64, f64, "f64")
    }
    grouped_ex {
        (cublasGemmGroupedBatchedEx, c_int)
        (cublasGemmGroupedBatchedEx_64, i64)
    }
    gemv_batched {
        (cublasSgemvBatched, c_int, f32, f32, f32, "gemv f32")
        (cublasDgemvBatched, c_int, f64, f64, f64, "gemv f64")
        (cublasCgemvBatched, c_int, cuComplex, cuComplex, cuComplex, "gemv complex f32")
        (cublasZgemvBatched, c_int, cuDoubleComplex, cuDoubleComplex, cuDoubleComplex, "gemv complex f64")
        (cublasHSHgemvBatched, c_int, f32, __half, __half, "gemv HSH")
        (cublasHSSgemvBatched, c_int, f32, __half, f32, "gemv HSS")
        (cublasTSTgemvBatched, c_int, f32, __nv_bfloat16, __nv_bfloat16, "gemv TST")
        (cublasTSSgemvBatched, c_int, f32, __nv_bfloat16, f32, "gemv TSS")
        (cublasSgemvBatched_64, i64, f32, f32, f32, "gemv f32")
        (cublasDgemvBatched_64, i64, f64, f64, f64, "gemv f64")
        (cublasCgemvBatched_64, i64, cuComplex, cuComplex, cuComplex, "gemv complex f32")
        (cublasZgemvBatched_64, i64, cuDoubleComplex, cuDoubleComplex, cuDoubleComplex, "gemv complex f64")
        (cublasHSHgemvBatched_64, i64, f32, __half, __half, "gemv HSH")
        (cublasHSSgemvBatched_64, i64, f32, __half, f32, "gemv HSS")
        (cublasTSTgemvBatched_64, i64, f32, __nv_bfloat16, __nv_bfloat16, "gemv TST")
        (cublasTSSgemvBatched_64, i64, f32, __nv_bfloat16, f32, "gemv TSS")
    }
    complex_gemm {
        (cublasCgemm_v2, c_int, cuComplex)
        (cublasCgemm3m, c_int, cuComplex)
        (cublasZgemm_v2, c_int, cuDoubleComplex)
        (cublasZgemm3m, c_int, cuDoubleComplex)
        (cublasCgemm_v2_64, i64, cuComplex)
        (cublasCgemm3m_64, i64, cuComplex)
        (cublasZgemm_v2_64, i64, cuDoubleComplex)
        (cublasZgemm3m_64, i64, cuDoubleComplex)
    }
    complex_strided {
        (cublasCgemmStridedBatched, c_int, cuComplex)
        (cublasZgemmStridedBatched, c_int, cuDoubleComplex)
        (cublasCgemm3mStridedBatched, c_int, cuComplex)
        (cublasCgemmStridedBatched_64, i64, cuComplex)
        (cublasZgemmStridedBatched_64, i64, cuDoubleComplex)
        (cublasCgemm3mStridedBatched_64, i64, cuComplex)
    }
    complex_ex {
        (cublasCgemmEx, c_int)
        (cublasCgemm3mEx, c_int)
        (cublasCgemmEx_64, i64)
        (cublasCgemm3mEx_64, i64)
    }
    gemv_strided {
        (cublasSgemvStridedBatched, c_int, f32, f32, f32)
        (cublasDgemvStridedBatched, c_int, f64, f64, f64)
        (cublasCgemvStridedBatched, c_int, cuComplex, cuComplex, cuComplex)
        (cublasZgemvStridedBatched, c_int, cuDoubleComplex, cuDoubleComplex, cuDoubleComplex)
        (cublasHSHgemvStridedBatched, c_int, f32, __half, __half)
        (cublasHSSgemvStridedBatched, c_int, f32, __half, f32)
        (cublasTSTgemvStridedBatched, c_int, f32, __nv_bfloat16, __nv_bfloat16)
        (cublasTSSgemvStridedBatched, c_int, f32, __nv_bfloat16, f32)
        (cublasSgemvStridedBatched_64, i64, f32, f32, f32)
        (cublasDgemvStridedBatched_64, i64, f64, f64, f64)
        (cublasCgemvStridedBatched_64, i64, cuComplex, cuComplex, cuComplex)
        (cublasZgemvStridedBatched_64, i64, cuDoubleComplex, cuDoubleComplex, cuDoubleComplex)
        (cublasHSHgemvStridedBatched_64, i64, f32, __half, __half)
        (cublasHSSgemvStridedBatched_64, i64, f32, __half, f32)
        (cublasTSTgemvStridedBatched_64, i64, f32, __nv_bfloat16, __nv_bfloat16)
        (cublasTSSgemvStridedBatched_64, i64, f32, __nv_bfloat16, f32)
    }
    complex_gemv {
        (cublasCgemv_v2, c_int, cuComplex)
        (cublasZgemv_v2, c_int, cuDoubleComplex)
        (cublasCgemv_v2_64, i64, cuComplex)
        (cublasZgemv_v2_64, i64, cuDoubleComplex)
    }
}
