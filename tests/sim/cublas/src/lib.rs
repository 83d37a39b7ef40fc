//! Simulated `libcublas.so.12`: handles and the GEMM entry points of cuBLAS 12.8, the helper
//! copies (`cublas{Set,Get}{Vector,Matrix}[Async][_64]`, see `copies`) and a few f32 BLAS
//! routines (`cublasSaxpy_v2`, `cublasSscal_v2`, `cublasSdot_v2`, `cublasSgeam`, see
//! `level1`).
//!
//! Every GEMM runs as a kernel on the handle's stream (`cublasSetStream_v2`; default 0, the
//! legacy default stream) through the simulated runtime, and computes with
//! [`sim_kernels::gemm`], whose documentation gives the exact accumulation order.
//!
//! Status codes follow cuBLAS: `CUBLAS_STATUS_NOT_INITIALIZED` for a null or destroyed handle
//! (or when no simulated runtime is loaded, at `cublasCreate_v2`); `CUBLAS_STATUS_INVALID_VALUE`
//! for negative sizes, an unknown operation, `ld` smaller than the rows of its matrix, a null
//! alpha/beta, a negative batch count; `CUBLAS_STATUS_NOT_SUPPORTED` for a type combination or
//! compute type the real `cublasGemmEx` table lacks (FP8 included: FP8 GEMMs are cuBLASLt
//! only) or an unknown algorithm; `CUBLAS_STATUS_EXECUTION_FAILED` when the runtime refuses the
//! launch. Pointers the device cannot access fault inside the kernel (see [`sim_blas`]).
//!
//! Scalars: in `CUBLAS_POINTER_MODE_HOST` alpha and beta are read during the call; in
//! `CUBLAS_POINTER_MODE_DEVICE` the kernel reads them when it runs. With beta == 0 C is never
//! read (NaNs in it do not propagate).
//!
//! Math mode: `cublasSgemm_v2`/`cublasSgemmStridedBatched` use TF32 inputs under
//! `CUBLAS_TF32_TENSOR_OP_MATH` and f16 inputs under the deprecated `CUBLAS_TENSOR_OP_MATH`;
//! the `*Ex` functions follow their explicit compute type only.
#![allow(clippy::missing_safety_doc)]

use core::ffi::{c_char, c_int, c_longlong, c_void};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use cuda_abi::cublas::*;
use cuda_abi::cudart::cudaStream_t;
use cuda_abi::library_types::*;
use sim_blas::{enqueue_gemm, guard, GemmKernel, Range, Scalar};
use sim_kernels::dtype::DType;
use sim_kernels::gemm::{Compute, Gemm, Layout, Op};

/// The state behind a `cublasHandle_t`.
#[derive(Debug, Clone, Copy)]
struct Handle {
    stream: usize,
    pointer_mode: cublasPointerMode_t,
    math_mode: cublasMath_t,
    atomics_mode: cublasAtomicsMode_t,
    sm_count_target: c_int,
    workspace: usize,
    workspace_size: usize,
}

/// Live handles, by address. The address is a real heap allocation (like cuBLAS's context
/// struct), freed by `cublasDestroy_v2`.
static HANDLES: Mutex<Option<HashMap<usize, Handle>>> = Mutex::new(None);

fn handles() -> MutexGuard<'static, Option<HashMap<usize, Handle>>> {
    HANDLES.lock().unwrap_or_else(|e| e.into_inner())
}

/// The state of a live handle.
pub(crate) fn state(h: cublasHandle_t) -> Result<Handle, cublasStatus_t> {
    handles()
        .as_ref()
        .and_then(|m| m.get(&(h as usize)).copied())
        .ok_or(CUBLAS_STATUS_NOT_INITIALIZED)
}

mod copies;
mod legacy;
mod legacy_unsupported;
mod level1;
mod more_gemms;
mod unsupported;
mod xt;
mod xt_unsupported;

/// Private export for the simulated cuBLASLt, which accepts a cuBLAS handle as its own.
#[no_mangle]
pub unsafe extern "C" fn __simcublasHandleLive(h: cublasHandle_t) -> c_int {
    state(h).is_ok() as c_int
}

/// What an entry point the simulator does not compute returns: `CUBLAS_STATUS_NOT_SUPPORTED`
/// for a live handle (or none expected), `CUBLAS_STATUS_NOT_INITIALIZED` for a bad one. With
/// `SIM_CUDA_LOG_KERNELS=1` the call is logged, as refused kernel launches are.
fn unsupported_call(name: &str, h: Option<cublasHandle_t>) -> cublasStatus_t {
    if let Some(h) = h {
        if let Err(e) = state(h) {
            return e;
        }
    }
    not_computed(name)
}

/// `CUBLAS_STATUS_NOT_SUPPORTED` for an entry point the simulator does not compute, said on
/// stderr with `SIM_CUDA_LOG_KERNELS=1`.
fn not_computed(name: &str) -> cublasStatus_t {
    if std::env::var("SIM_CUDA_LOG_KERNELS").is_ok_and(|v| v == "1") {
        eprintln!(
            "sim-cublas: {name} is not computed by the simulator (CUBLAS_STATUS_NOT_SUPPORTED)"
        );
    }
    CUBLAS_STATUS_NOT_SUPPORTED
}

/// Changes a live handle.
fn update(h: cublasHandle_t, f: impl FnOnce(&mut Handle)) -> cublasStatus_t {
    match handles().as_mut().and_then(|m| m.get_mut(&(h as usize))) {
        Some(s) => {
            f(s);
            CUBLAS_STATUS_SUCCESS
        }
        None => CUBLAS_STATUS_NOT_INITIALIZED,
    }
}

/// `CUBLAS_STATUS_INVALID_VALUE` for a live handle, else `CUBLAS_STATUS_NOT_INITIALIZED`.
fn invalid(h: cublasHandle_t) -> cublasStatus_t {
    state(h).map_or_else(|e| e, |_| CUBLAS_STATUS_INVALID_VALUE)
}

/// Size of the allocation behind a handle (cuBLAS's context is a few hundred bytes).
const CONTEXT_BYTES: usize = 256;

#[no_mangle]
pub unsafe extern "C" fn cublasCreate_v2(handle: *mut cublasHandle_t) -> cublasStatus_t {
    guard(|| {
        if handle.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if !sim_device::available() {
            return CUBLAS_STATUS_NOT_INITIALIZED;
        }
        let ctx = Box::into_raw(Box::new([0u8; CONTEXT_BYTES]));
        let st = Handle {
            stream: 0,
            pointer_mode: CUBLAS_POINTER_MODE_HOST,
            math_mode: CUBLAS_DEFAULT_MATH,
            atomics_mode: CUBLAS_ATOMICS_NOT_ALLOWED,
            sm_count_target: 0,
            workspace: 0,
            workspace_size: 0,
        };
        handles()
            .get_or_insert_with(HashMap::new)
            .insert(ctx as usize, st);
        // SAFETY: checked non-null; the caller provides a writable handle slot.
        unsafe { *handle = ctx.cast() };
        CUBLAS_STATUS_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasDestroy_v2(handle: cublasHandle_t) -> cublasStatus_t {
    guard(|| {
        let removed = handles()
            .as_mut()
            .and_then(|m| m.remove(&(handle as usize)));
        match removed {
            Some(_) => {
                // SAFETY: the address came from Box::into_raw in cublasCreate_v2 and was live.
                drop(unsafe { Box::from_raw(handle.cast::<[u8; CONTEXT_BYTES]>()) });
                CUBLAS_STATUS_SUCCESS
            }
            None => CUBLAS_STATUS_NOT_INITIALIZED,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetVersion_v2(
    handle: cublasHandle_t,
    version: *mut c_int,
) -> cublasStatus_t {
    guard(|| {
        if let Err(e) = state(handle) {
            return e;
        }
        if version.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        // SAFETY: non-null output slot.
        unsafe { *version = CUBLAS_VERSION };
        CUBLAS_STATUS_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetProperty(
    type_: libraryPropertyType,
    value: *mut c_int,
) -> cublasStatus_t {
    // SAFETY: forwarded with the caller's contract.
    unsafe { sim_blas::get_property(type_, value) }
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetCudartVersion() -> usize {
    12080
}

#[no_mangle]
pub unsafe extern "C" fn cublasSetStream_v2(
    handle: cublasHandle_t,
    streamId: cudaStream_t,
) -> cublasStatus_t {
    guard(|| update(handle, |s| s.stream = streamId as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetStream_v2(
    handle: cublasHandle_t,
    streamId: *mut cudaStream_t,
) -> cublasStatus_t {
    guard(|| {
        let s = match state(handle) {
            Ok(s) => s,
            Err(e) => return e,
        };
        if streamId.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        // SAFETY: non-null output slot.
        unsafe { *streamId = s.stream as cudaStream_t };
        CUBLAS_STATUS_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasSetPointerMode_v2(
    handle: cublasHandle_t,
    mode: cublasPointerMode_t,
) -> cublasStatus_t {
    guard(|| {
        if mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE {
            return invalid(handle);
        }
        update(handle, |s| s.pointer_mode = mode)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetPointerMode_v2(
    handle: cublasHandle_t,
    mode: *mut cublasPointerMode_t,
) -> cublasStatus_t {
    guard(|| {
        let s = match state(handle) {
            Ok(s) => s,
            Err(e) => return e,
        };
        if mode.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        // SAFETY: non-null output slot.
        unsafe { *mode = s.pointer_mode };
        CUBLAS_STATUS_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasSetMathMode(
    handle: cublasHandle_t,
    mode: cublasMath_t,
) -> cublasStatus_t {
    guard(|| {
        let base = mode & !CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
        if base > CUBLAS_TF32_TENSOR_OP_MATH {
            return invalid(handle);
        }
        update(handle, |s| s.math_mode = mode)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetMathMode(
    handle: cublasHandle_t,
    mode: *mut cublasMath_t,
) -> cublasStatus_t {
    guard(|| {
        let s = match state(handle) {
            Ok(s) => s,
            Err(e) => return e,
        };
        if mode.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        // SAFETY: non-null output slot.
        unsafe { *mode = s.math_mode };
        CUBLAS_STATUS_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasSetAtomicsMode(
    handle: cublasHandle_t,
    mode: cublasAtomicsMode_t,
) -> cublasStatus_t {
    guard(|| update(handle, |s| s.atomics_mode = mode))
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetAtomicsMode(
    handle: cublasHandle_t,
    mode: *mut cublasAtomicsMode_t,
) -> cublasStatus_t {
    guard(|| {
        let s = match state(handle) {
            Ok(s) => s,
            Err(e) => return e,
        };
        if mode.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        // SAFETY: non-null output slot.
        unsafe { *mode = s.atomics_mode };
        CUBLAS_STATUS_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasSetSmCountTarget(
    handle: cublasHandle_t,
    smCountTarget: c_int,
) -> cublasStatus_t {
    guard(|| {
        if smCountTarget < 0 {
            return invalid(handle);
        }
        update(handle, |s| s.sm_count_target = smCountTarget)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasGetSmCountTarget(
    handle: cublasHandle_t,
    smCountTarget: *mut c_int,
) -> cublasStatus_t {
    guard(|| {
        let s = match state(handle) {
            Ok(s) => s,
            Err(e) => return e,
        };
        if smCountTarget.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        // SAFETY: non-null output slot.
        unsafe { *smCountTarget = s.sm_count_target };
        CUBLAS_STATUS_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasSetWorkspace_v2(
    handle: cublasHandle_t,
    workspace: *mut c_void,
    workspaceSizeInBytes: usize,
) -> cublasStatus_t {
    guard(|| {
        if workspace.is_null() && workspaceSizeInBytes > 0 {
            return invalid(handle);
        }
        update(handle, |s| {
            s.workspace = workspace as usize;
            s.workspace_size = workspaceSizeInBytes;
        })
    })
}

/// `cublasGetStatusName`.
#[no_mangle]
pub unsafe extern "C" fn cublasGetStatusName(status: cublasStatus_t) -> *const c_char {
    sim_blas::status_name(status).as_ptr()
}

/// `cublasGetStatusString`.
#[no_mangle]
pub unsafe extern "C" fn cublasGetStatusString(status: cublasStatus_t) -> *const c_char {
    sim_blas::status_string(status).as_ptr()
}

/// The arguments common to every GEMM entry point, as received.
pub(crate) struct GemmCall {
    pub(crate) handle: cublasHandle_t,
    pub(crate) transa: cublasOperation_t,
    pub(crate) transb: cublasOperation_t,
    pub(crate) m: c_int,
    pub(crate) n: c_int,
    pub(crate) k: c_int,
    pub(crate) alpha: *const c_void,
    pub(crate) beta: *const c_void,
    pub(crate) a_type: DType,
    pub(crate) b_type: DType,
    pub(crate) c_type: DType,
    pub(crate) lda: c_int,
    pub(crate) ldb: c_int,
    pub(crate) ldc: c_int,
    pub(crate) batch: c_int,
    pub(crate) strides: [c_longlong; 3],
    pub(crate) compute: Compute,
    pub(crate) scale_type: DType,
}

/// A validated GEMM call: the problem (alpha/beta not yet read) and the handle state.
struct Prepared {
    g: Gemm,
    h: Handle,
    alpha: Scalar,
    beta: Scalar,
}

impl GemmCall {
    /// Validates the call as cuBLAS does and reads host-mode scalars.
    ///
    /// # Safety
    /// Host-mode alpha/beta must be readable host pointers.
    unsafe fn prepare(&self) -> Result<Option<Prepared>, cublasStatus_t> {
        let h = state(self.handle)?;
        let (Some(transa), Some(transb)) =
            (Op::from_cublas(self.transa), Op::from_cublas(self.transb))
        else {
            return Err(CUBLAS_STATUS_INVALID_VALUE);
        };
        if self.m < 0 || self.n < 0 || self.k < 0 || self.batch < 0 {
            return Err(CUBLAS_STATUS_INVALID_VALUE);
        }
        if self.strides.iter().any(|s| *s < 0) {
            return Err(CUBLAS_STATUS_INVALID_VALUE);
        }
        let (m, n, k) = (self.m as usize, self.n as usize, self.k as usize);
        let ld = |x: c_int| x.max(0) as usize;
        let mut g = Gemm::simple(m, n, k, self.a_type, self.c_type, self.compute);
        g.b.dtype = self.b_type;
        g.transa = transa;
        g.transb = transb;
        g.batch = self.batch as usize;
        g.a = Layout::col(self.a_type, ld(self.lda)).strided(self.strides[0] as usize);
        g.b = Layout::col(self.b_type, ld(self.ldb)).strided(self.strides[1] as usize);
        g.c = Layout::col(self.c_type, ld(self.ldc)).strided(self.strides[2] as usize);
        g.d = g.c;
        g.scale_type = self.scale_type;
        if g.check_lds().is_err() {
            return Err(CUBLAS_STATUS_INVALID_VALUE);
        }
        if self.alpha.is_null() || self.beta.is_null() {
            return Err(CUBLAS_STATUS_INVALID_VALUE);
        }
        if m == 0 || n == 0 || g.batch == 0 {
            return Ok(None);
        }
        let (alpha, beta) = if h.pointer_mode == CUBLAS_POINTER_MODE_DEVICE {
            let dev = |p| Scalar::device(p, self.scale_type);
            match (dev(self.alpha), dev(self.beta)) {
                (Some(a), Some(b)) => (a, b),
                // The kernel would fault reading them.
                _ => return Err(FAULT),
            }
        } else {
            // SAFETY: host pointer mode: the caller passes host pointers.
            unsafe {
                (
                    Scalar::host(self.alpha, self.scale_type),
                    Scalar::host(self.beta, self.scale_type),
                )
            }
        };
        Ok(Some(Prepared { g, h, alpha, beta }))
    }
}

/// Internal marker: launch a faulting kernel instead of the GEMM.
const FAULT: cublasStatus_t = cublasStatus_t::MAX;

/// Validates, binds and enqueues a strided GEMM.
pub(crate) unsafe fn strided_gemm(
    call: GemmCall,
    a: *const c_void,
    b: *const c_void,
    c: *mut c_void,
) -> cublasStatus_t {
    // SAFETY: per the entry point's contract.
    let p = match unsafe { call.prepare() } {
        Ok(Some(p)) => p,
        Ok(None) => return CUBLAS_STATUS_SUCCESS,
        Err(FAULT) => {
            return state(call.handle).map_or(CUBLAS_STATUS_NOT_INITIALIZED, |h| {
                sim_blas::enqueue_fault(h.stream as cudaStream_t)
            })
        }
        Err(e) => return e,
    };
    let mut k = GemmKernel::new(p.g, p.alpha, p.beta);
    let c_read = !matches!(p.beta, Scalar::Value(v) if v == 0.0);
    let bound = k.bind(a, b, c, c, c_read).map(|()| k);
    enqueue_gemm(p.h.stream as cudaStream_t, bound)
}

/// Whether `cublasGemmEx` supports the combination (the cuBLAS 12 `cublasGemmEx` table for
/// real types).
pub(crate) fn gemm_ex_supported(
    compute: Compute,
    scale: DType,
    a: DType,
    b: DType,
    c: DType,
) -> bool {
    use DType::*;
    if a != b || scale != compute.default_scale_type() {
        return false;
    }
    match compute {
        Compute::F16 => a == F16 && c == F16,
        Compute::I32 => a == I8 && c == I32,
        Compute::F64 => a == F64 && c == F64,
        Compute::F32 => matches!(
            (a, c),
            (BF16, BF16) | (F16, F16) | (I8, F32) | (BF16, F32) | (F16, F32) | (F32, F32)
        ),
        Compute::F32Fast16F | Compute::F32Fast16BF | Compute::F32FastTF32 => a == F32 && c == F32,
    }
}

fn algo_valid(algo: cublasGemmAlgo_t) -> bool {
    (CUBLAS_GEMM_DEFAULT..=CUBLAS_GEMM_ALGO23).contains(&algo)
        || (CUBLAS_GEMM_DEFAULT_TENSOR_OP..=CUBLAS_GEMM_ALGO15_TENSOR_OP).contains(&algo)
}

/// The types and compute of a `*Ex` call, or the status rejecting them.
pub(crate) fn ex_types(
    a: cudaDataType,
    b: cudaDataType,
    c: cudaDataType,
    compute: cublasComputeType_t,
    algo: cublasGemmAlgo_t,
) -> Result<(DType, DType, DType, Compute), cublasStatus_t> {
    let (Some(at), Some(bt), Some(ct), Some(comp)) = (
        DType::from_cuda(a),
        DType::from_cuda(b),
        DType::from_cuda(c),
        Compute::from_raw(compute),
    ) else {
        return Err(CUBLAS_STATUS_NOT_SUPPORTED);
    };
    if !gemm_ex_supported(comp, comp.default_scale_type(), at, bt, ct) || !algo_valid(algo) {
        return Err(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    Ok((at, bt, ct, comp))
}

/// The compute type of a single-precision routine under the handle's math mode.
pub(crate) fn sgemm_compute(handle: cublasHandle_t) -> Compute {
    match state(handle).map(|h| h.math_mode & 0xf) {
        Ok(CUBLAS_TF32_TENSOR_OP_MATH) => Compute::F32FastTF32,
        Ok(CUBLAS_TENSOR_OP_MATH) => Compute::F32Fast16F,
        _ => Compute::F32,
    }
}

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
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            more_gemms::gemm_any(
                handle,
                [transa, transb],
                [m.into(), n.into(), k.into()],
                [alpha.cast(), beta.cast()],
                [
                    (A.cast(), lda.into(), 0),
                    (B.cast(), ldb.into(), 0),
                    (C.cast_const().cast(), ldc.into(), 0),
                ],
                [DType::F32; 3],
                1,
                sgemm_compute(handle),
                DType::F32,
            )
        }
    })
}

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
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            more_gemms::gemm_any(
                handle,
                [transa, transb],
                [m.into(), n.into(), k.into()],
                [alpha.cast(), beta.cast()],
                [
                    (A.cast(), lda.into(), 0),
                    (B.cast(), ldb.into(), 0),
                    (C.cast_const().cast(), ldc.into(), 0),
                ],
                [DType::F64; 3],
                1,
                Compute::F64,
                DType::F64,
            )
        }
    })
}

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
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            more_gemms::gemm_any(
                handle,
                [transa, transb],
                [m.into(), n.into(), k.into()],
                [alpha.cast(), beta.cast()],
                [
                    (A.cast(), lda.into(), 0),
                    (B.cast(), ldb.into(), 0),
                    (C.cast_const().cast(), ldc.into(), 0),
                ],
                [DType::F16; 3],
                1,
                Compute::F16,
                DType::F16,
            )
        }
    })
}

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
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            more_gemms::gemm_any(
                handle,
                [transa, transb],
                [m.into(), n.into(), k.into()],
                [alpha.cast(), beta.cast()],
                [
                    (A.cast(), lda.into(), strideA),
                    (B.cast(), ldb.into(), strideB),
                    (C.cast_const().cast(), ldc.into(), strideC),
                ],
                [DType::F32; 3],
                batchCount.into(),
                sgemm_compute(handle),
                DType::F32,
            )
        }
    })
}

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
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            more_gemms::gemm_ex_any(
                handle,
                [transa, transb],
                [m.into(), n.into(), k.into()],
                [alpha, beta],
                [
                    (A, lda.into(), 0),
                    (B, ldb.into(), 0),
                    (C.cast_const(), ldc.into(), 0),
                ],
                [Atype, Btype, Ctype],
                1,
                computeType,
                algo,
            )
        }
    })
}

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
    guard(|| {
        // SAFETY: per cuBLAS's contract for the arguments.
        unsafe {
            more_gemms::gemm_ex_any(
                handle,
                [transa, transb],
                [m.into(), n.into(), k.into()],
                [alpha, beta],
                [
                    (A, lda.into(), strideA),
                    (B, ldb.into(), strideB),
                    (C.cast_const(), ldc.into(), strideC),
                ],
                [Atype, Btype, Ctype],
                batchCount.into(),
                computeType,
                algo,
            )
        }
    })
}

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
    guard(|| {
        if let Err(e) = state(handle) {
            return e;
        }
        let (a_type, b_type, c_type, compute) =
            match ex_types(Atype, Btype, Ctype, computeType, algo) {
                Ok(t) => t,
                Err(e) => return e,
            };
        // Each matrix is a batch of one; the pointer arrays are read by the kernel.
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
            batch: batchCount.min(1),
            strides: [0; 3],
            compute,
            scale_type: compute.default_scale_type(),
        };
        if batchCount < 0 {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        // SAFETY: per cuBLAS's contract for the arguments.
        let p = match unsafe { call.prepare() } {
            Ok(Some(p)) => p,
            Ok(None) => return CUBLAS_STATUS_SUCCESS,
            Err(FAULT) => {
                return state(handle).map_or(CUBLAS_STATUS_NOT_INITIALIZED, |h| {
                    sim_blas::enqueue_fault(h.stream as cudaStream_t)
                })
            }
            Err(e) => return e,
        };
        let count = batchCount as usize;
        let bytes = count * std::mem::size_of::<*const c_void>();
        let arrays =
            [Aarray.cast::<c_void>(), Barray.cast(), Carray.cast()].map(|p| Range::new(p, bytes));
        let stream = p.h.stream as cudaStream_t;
        let [Ok(aa), Ok(ba), Ok(ca)] = arrays else {
            return sim_blas::enqueue_fault(stream);
        };
        let template = GemmKernel::new(p.g, p.alpha, p.beta);
        let c_read = !matches!(p.beta, Scalar::Value(v) if v == 0.0);
        sim_blas::enqueue(stream, move || {
            for i in 0..count {
                let ptr = |r: &Range| -> *mut c_void {
                    // SAFETY: the array was validated for `count` pointers at launch.
                    let b = unsafe { r.bytes() };
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&b[i * 8..i * 8 + 8]);
                    usize::from_ne_bytes(w) as *mut c_void
                };
                let mut k = template;
                let (a, b, c) = (ptr(&aa), ptr(&ba), ptr(&ca));
                k.bind(a, b, c, c, c_read)
                    .map_err(|_| cuda_abi::cudart::cudaErrorIllegalAddress)?;
                k.run()?;
            }
            Ok(())
        })
    })
}
