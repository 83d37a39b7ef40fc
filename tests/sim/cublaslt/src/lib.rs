//! Simulated `libcublasLt.so.12`: handles, descriptors and `cublasLtMatmul` of cuBLASLt 12.8.
//!
//! Descriptors live in their header-defined opaque storage ([`desc`]), so descriptors made by
//! `*Create` and by the header's inline `*Init` behave alike, and `cublasLtMatmul` reads every
//! attribute when it is called (a tracer querying them with `*GetAttribute` inside a hooked
//! `cublasLtMatmul` sees what the matmul uses).
//!
//! `cublasLtMatmul` computes with [`sim_kernels::gemm`] as a kernel on its `stream` argument.
//! Supported, as on an H100 with cuBLASLt 12.8:
//! * layouts `CUBLASLT_ORDER_COL` and `CUBLASLT_ORDER_ROW`, strided batches (every layout's
//!   `BATCH_COUNT` equal to D's; stride 0 repeats a matrix); other orders and planar complex
//!   give `CUBLAS_STATUS_NOT_SUPPORTED`;
//! * types: 16F compute on f16; 32F (and its FAST variants on f32 inputs) on f32/f16/bf16 with
//!   C = D of the input type or f32; 64F; 32I on i8 -> i32; FP8 (E4M3/E5M2 A and B, not both
//!   E5M2) with 32F compute, D of f32 (C f32), bf16/f16 (C the same) or FP8 (C bf16/f16);
//! * **FP8 requires `TRANSA = T` and `TRANSB = N`** (the "TN" layout Hopper's FP8 kernels
//!   support) and column order; anything else is `CUBLAS_STATUS_NOT_SUPPORTED`;
//! * MXFP8 block scaling: `A_SCALE_MODE` and `B_SCALE_MODE` both `VEC32_UE8M0` (FP8 A and
//!   B, one matrix): A and B are dequantized to f32 by their UE8M0 scales (cuBLASLt's
//!   128x4-tile layout, `sim_blas::mx_offset`) and multiplied as f32 operands; other modes
//!   (NVFP4's `VEC16_UE4M3`, the FP32 vector modes) are `CUBLAS_STATUS_NOT_SUPPORTED`;
//! * FP8 scaling (`SCALE_MODE` scalar): `D = scale_D * (alpha * scale_A * scale_B * op(A)
//!   op(B) + beta * scale_C * C)`, each scale an f32 in device memory (null: 1); `AMAX_D`
//!   receives, as f32, the largest magnitude of the result *before* `scale_D`. Scale pointers
//!   with non-FP8 A/B, or a D scale with a non-FP8 D, are `CUBLAS_STATUS_INVALID_VALUE` (the
//!   header's rule for an unsupported combination). `FAST_ACCUM` is accepted and does not
//!   change the arithmetic;
//! * epilogues DEFAULT, RELU, BIAS, RELU_BIAS, GELU, GELU_BIAS, GELU_AUX, GELU_AUX_BIAS (GELU
//!   is the tanh form; the bias, of `BIAS_DATA_TYPE` or by default D's type, or for FP8 inputs
//!   C's type when 16-bit else bf16, is added before the activation; GELU_AUX stores the
//!   pre-activation value in `EPILOGUE_AUX_DATA_TYPE`, default D's type, with `AUX_LD >= m`
//!   and a multiple of 8), and the backward ones DGELU (the result times GELU' of the aux
//!   matrix, then an input), DGELU_BGRAD (also `sum_j` of that result into the bias pointer),
//!   BGRADA and BGRADB (`sum_k` of op(A)'s rows / op(B)'s columns into the bias pointer; see
//!   `sim_kernels::gemm::BiasGrad`). The ReLU bit-mask epilogues (RELU_AUX, RELU_AUX_BIAS,
//!   DRELU, DRELU_BGRAD) are `CUBLAS_STATUS_NOT_SUPPORTED`;
//! * pointer modes HOST (alpha/beta read during the call) and DEVICE (read by the kernel).
//!
//! `cublasLtMatrixTransform` (C = alpha * op(A) + beta * op(B)) and its descriptor are in
//! `transform`.
//!
//! `cublasLtMatmulAlgoGetHeuristic` returns one algorithm (workspace 0, state SUCCESS) for
//! every supported problem and the matmul's status otherwise. Faults follow the simulated
//! cuBLAS (see `launch`).
#![allow(clippy::missing_safety_doc)]

pub mod desc;
mod transform;

use core::ffi::{c_char, c_int, c_void};
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use cuda_abi::cublas::*;
use cuda_abi::cublaslt::*;
use cuda_abi::cudart::cudaStream_t;
use cuda_abi::library_types::*;
use desc::{Desc, Kind, MATMUL_DESC, MATRIX_LAYOUT, PREFERENCE};
use sim_blas::{enqueue_gemm, guard, GemmKernel, Inaccessible, Range, Scalar};
use sim_kernels::dtype::DType;
use sim_kernels::gemm::{
    plan, Activation, BiasGrad, BiasLayout, Compute, Epilogue, Gemm, Layout, Op, Order, SM_COUNT,
};

static HANDLES: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// Descriptors allocated by `*Create`, by address, with their kind's tag.
static CREATED: Mutex<Option<HashMap<usize, u32>>> = Mutex::new(None);

fn lock<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A live `cublasLtCreate` handle, or a live cuBLAS handle: cuBLAS documents that a
/// `cublasHandle_t` may be passed where a `cublasLtHandle_t` is expected (PyTorch does so).
fn handle_live(h: cublasLtHandle_t) -> bool {
    lock(&HANDLES)
        .as_ref()
        .is_some_and(|s| s.contains(&(h as usize)))
        || cublas_handle_live(h)
}

/// Asks the simulated cuBLAS (already loaded: it is the one that made the handle) whether `h`
/// is one of its live handles, through its private export.
fn cublas_handle_live(h: cublasLtHandle_t) -> bool {
    type Live = unsafe extern "C" fn(*mut core::ffi::c_void) -> core::ffi::c_int;
    static F: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let f = F.get_or_init(|| {
        let soname = concat!(env!("SIM_CUBLAS_SONAME"), "\0");
        // SAFETY: NUL-terminated names; RTLD_NOLOAD never loads anything new.
        unsafe {
            let lib = libc::dlopen(soname.as_ptr().cast(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            if lib.is_null() {
                return None;
            }
            let f = libc::dlsym(lib, c"__simcublasHandleLive".as_ptr());
            (!f.is_null()).then_some(f as usize)
        }
    });
    match *f {
        // SAFETY: the simulated cuBLAS's private export has this signature.
        Some(f) => unsafe { std::mem::transmute::<usize, Live>(f)(h.cast()) != 0 },
        None => false,
    }
}

/// Bytes behind a `cublasLtHandle_t`.
const CONTEXT_BYTES: usize = 256;

#[no_mangle]
pub unsafe extern "C" fn cublasLtCreate(lightHandle: *mut cublasLtHandle_t) -> cublasStatus_t {
    guard(|| {
        if lightHandle.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if !sim_device::available() {
            return CUBLAS_STATUS_NOT_INITIALIZED;
        }
        let ctx = Box::into_raw(Box::new([0u8; CONTEXT_BYTES]));
        lock(&HANDLES)
            .get_or_insert_with(HashSet::new)
            .insert(ctx as usize);
        // SAFETY: checked non-null.
        unsafe { *lightHandle = ctx.cast() };
        CUBLAS_STATUS_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtDestroy(lightHandle: cublasLtHandle_t) -> cublasStatus_t {
    guard(|| {
        let removed = lock(&HANDLES)
            .as_mut()
            .is_some_and(|s| s.remove(&(lightHandle as usize)));
        if !removed {
            return CUBLAS_STATUS_NOT_INITIALIZED;
        }
        // SAFETY: the address came from Box::into_raw in cublasLtCreate and was live.
        drop(unsafe { Box::from_raw(lightHandle.cast::<[u8; CONTEXT_BYTES]>()) });
        CUBLAS_STATUS_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtGetVersion() -> usize {
    CUBLAS_VERSION as usize
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtGetCudartVersion() -> usize {
    12080
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtGetProperty(
    type_: libraryPropertyType,
    value: *mut c_int,
) -> cublasStatus_t {
    // SAFETY: forwarded with the caller's contract.
    unsafe { sim_blas::get_property(type_, value) }
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtGetStatusName(status: cublasStatus_t) -> *const c_char {
    sim_blas::status_name(status).as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtGetStatusString(status: cublasStatus_t) -> *const c_char {
    sim_blas::status_string(status).as_ptr()
}

// ---- descriptors -------------------------------------------------------------------------

/// Allocates zeroed storage of `T` for a `*Create`, initialised as `kind`.
fn create<T: Default>(kind: &'static Kind) -> Result<Desc, cublasStatus_t> {
    let p = Box::into_raw(Box::<T>::default());
    lock(&CREATED)
        .get_or_insert_with(HashMap::new)
        .insert(p as usize, kind.tag);
    // SAFETY: a fresh allocation of size_of::<T>() bytes, checked to hold `kind` at compile time.
    unsafe { Desc::init(p.cast(), std::mem::size_of::<T>(), kind) }
}

/// `*Destroy`: frees storage from `*Create`, invalidates caller-owned storage.
unsafe fn destroy<T>(p: *mut c_void, kind: &'static Kind) -> cublasStatus_t {
    if p.is_null() {
        return CUBLAS_STATUS_SUCCESS;
    }
    // SAFETY: a descriptor handle from this library, per the caller's contract.
    let d = match unsafe { Desc::open(p, kind) } {
        Ok(d) => d,
        Err(e) => return e,
    };
    d.invalidate();
    let ours = lock(&CREATED)
        .as_mut()
        .and_then(|m| m.remove(&(p as usize)))
        .is_some();
    if ours {
        // SAFETY: allocated as Box<T> by `create`.
        drop(unsafe { Box::from_raw(p.cast::<T>()) });
    }
    CUBLAS_STATUS_SUCCESS
}

/// Writes a new descriptor handle to `out`.
unsafe fn hand_out<P>(
    out: *mut *mut P,
    d: Result<Desc, cublasStatus_t>,
    raw: impl FnOnce(&Desc) -> *mut P,
) -> cublasStatus_t {
    match d {
        Ok(d) => {
            // SAFETY: the caller checked `out` non-null.
            unsafe { *out = raw(&d) };
            CUBLAS_STATUS_SUCCESS
        }
        Err(e) => e,
    }
}

fn matmul_desc_defaults(d: &Desc, compute: cublasComputeType_t, scale: cudaDataType_t) {
    d.put(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, compute as u64);
    d.put(CUBLASLT_MATMUL_DESC_SCALE_TYPE, scale as u64);
    d.put(CUBLASLT_MATMUL_DESC_FILL_MODE, CUBLAS_FILL_MODE_FULL as u64);
    d.put(
        CUBLASLT_MATMUL_DESC_EPILOGUE,
        CUBLASLT_EPILOGUE_DEFAULT as u64,
    );
    d.put(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, u64::MAX);
    d.put(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, u64::MAX);
}

fn layout_defaults(d: &Desc, type_: cudaDataType, rows: u64, cols: u64, ld: i64) {
    d.put(CUBLASLT_MATRIX_LAYOUT_TYPE, type_ as u64);
    d.put(CUBLASLT_MATRIX_LAYOUT_ORDER, CUBLASLT_ORDER_COL as u64);
    d.put(CUBLASLT_MATRIX_LAYOUT_ROWS, rows);
    d.put(CUBLASLT_MATRIX_LAYOUT_COLS, cols);
    d.put(CUBLASLT_MATRIX_LAYOUT_LD, ld as u64);
    d.put(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 1);
}

fn preference_defaults(d: &Desc) {
    d.put(
        CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
        CUBLASLT_REDUCTION_SCHEME_MASK as u64,
    );
    for a in [
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
    ] {
        d.put(a, 256);
    }
    d.put(CUBLASLT_MATMUL_PREF_IMPL_MASK, u64::MAX);
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulDescCreate(
    matmulDesc: *mut cublasLtMatmulDesc_t,
    computeType: cublasComputeType_t,
    scaleType: cudaDataType_t,
) -> cublasStatus_t {
    guard(|| {
        if matmulDesc.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        let d = create::<cublasLtMatmulDescOpaque_t>(&MATMUL_DESC);
        if let Ok(d) = &d {
            matmul_desc_defaults(d, computeType, scaleType);
        }
        // SAFETY: checked non-null.
        unsafe { hand_out(matmulDesc, d, |d| d.raw().cast()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulDescInit_internal(
    matmulDesc: cublasLtMatmulDesc_t,
    size: usize,
    computeType: cublasComputeType_t,
    scaleType: cudaDataType_t,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: the caller provides `size` bytes of storage.
        match unsafe { Desc::init(matmulDesc.cast(), size, &MATMUL_DESC) } {
            Ok(d) => {
                matmul_desc_defaults(&d, computeType, scaleType);
                CUBLAS_STATUS_SUCCESS
            }
            Err(e) => e,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulDescDestroy(
    matmulDesc: cublasLtMatmulDesc_t,
) -> cublasStatus_t {
    // SAFETY: a descriptor handle, per the caller's contract.
    guard(|| unsafe { destroy::<cublasLtMatmulDescOpaque_t>(matmulDesc.cast(), &MATMUL_DESC) })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulDescSetAttribute(
    matmulDesc: cublasLtMatmulDesc_t,
    attr: cublasLtMatmulDescAttributes_t,
    buf: *const c_void,
    sizeInBytes: usize,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: a descriptor handle and a buffer of `sizeInBytes`, per the contract.
        unsafe {
            Desc::open(matmulDesc.cast(), &MATMUL_DESC)
                .map_or_else(|e| e, |d| d.set(attr, buf, sizeInBytes))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulDescGetAttribute(
    matmulDesc: cublasLtMatmulDesc_t,
    attr: cublasLtMatmulDescAttributes_t,
    buf: *mut c_void,
    sizeInBytes: usize,
    sizeWritten: *mut usize,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: a descriptor handle and buffers as documented, per the contract.
        unsafe {
            Desc::open(matmulDesc.cast(), &MATMUL_DESC)
                .map_or_else(|e| e, |d| d.get(attr, buf, sizeInBytes, sizeWritten))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixLayoutCreate(
    matLayout: *mut cublasLtMatrixLayout_t,
    type_: cudaDataType,
    rows: u64,
    cols: u64,
    ld: i64,
) -> cublasStatus_t {
    guard(|| {
        if matLayout.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        let d = create::<cublasLtMatrixLayoutOpaque_t>(&MATRIX_LAYOUT);
        if let Ok(d) = &d {
            layout_defaults(d, type_, rows, cols, ld);
        }
        // SAFETY: checked non-null.
        unsafe { hand_out(matLayout, d, |d| d.raw().cast()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixLayoutInit_internal(
    matLayout: cublasLtMatrixLayout_t,
    size: usize,
    type_: cudaDataType,
    rows: u64,
    cols: u64,
    ld: i64,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: the caller provides `size` bytes of storage.
        match unsafe { Desc::init(matLayout.cast(), size, &MATRIX_LAYOUT) } {
            Ok(d) => {
                layout_defaults(&d, type_, rows, cols, ld);
                CUBLAS_STATUS_SUCCESS
            }
            Err(e) => e,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixLayoutDestroy(
    matLayout: cublasLtMatrixLayout_t,
) -> cublasStatus_t {
    // SAFETY: a descriptor handle, per the caller's contract.
    guard(|| unsafe { destroy::<cublasLtMatrixLayoutOpaque_t>(matLayout.cast(), &MATRIX_LAYOUT) })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixLayoutSetAttribute(
    matLayout: cublasLtMatrixLayout_t,
    attr: cublasLtMatrixLayoutAttribute_t,
    buf: *const c_void,
    sizeInBytes: usize,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: a descriptor handle and a buffer of `sizeInBytes`, per the contract.
        unsafe {
            Desc::open(matLayout.cast(), &MATRIX_LAYOUT)
                .map_or_else(|e| e, |d| d.set(attr, buf, sizeInBytes))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixLayoutGetAttribute(
    matLayout: cublasLtMatrixLayout_t,
    attr: cublasLtMatrixLayoutAttribute_t,
    buf: *mut c_void,
    sizeInBytes: usize,
    sizeWritten: *mut usize,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: a descriptor handle and buffers as documented, per the contract.
        unsafe {
            Desc::open(matLayout.cast(), &MATRIX_LAYOUT)
                .map_or_else(|e| e, |d| d.get(attr, buf, sizeInBytes, sizeWritten))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulPreferenceCreate(
    pref: *mut cublasLtMatmulPreference_t,
) -> cublasStatus_t {
    guard(|| {
        if pref.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        let d = create::<cublasLtMatmulPreferenceOpaque_t>(&PREFERENCE);
        if let Ok(d) = &d {
            preference_defaults(d);
        }
        // SAFETY: checked non-null.
        unsafe { hand_out(pref, d, |d| d.raw().cast()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulPreferenceInit_internal(
    pref: cublasLtMatmulPreference_t,
    size: usize,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: the caller provides `size` bytes of storage.
        match unsafe { Desc::init(pref.cast(), size, &PREFERENCE) } {
            Ok(d) => {
                preference_defaults(&d);
                CUBLAS_STATUS_SUCCESS
            }
            Err(e) => e,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulPreferenceDestroy(
    pref: cublasLtMatmulPreference_t,
) -> cublasStatus_t {
    // SAFETY: a descriptor handle, per the caller's contract.
    guard(|| unsafe { destroy::<cublasLtMatmulPreferenceOpaque_t>(pref.cast(), &PREFERENCE) })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulPreferenceSetAttribute(
    pref: cublasLtMatmulPreference_t,
    attr: cublasLtMatmulPreferenceAttributes_t,
    buf: *const c_void,
    sizeInBytes: usize,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: a descriptor handle and a buffer of `sizeInBytes`, per the contract.
        unsafe {
            Desc::open(pref.cast(), &PREFERENCE)
                .map_or_else(|e| e, |d| d.set(attr, buf, sizeInBytes))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulPreferenceGetAttribute(
    pref: cublasLtMatmulPreference_t,
    attr: cublasLtMatmulPreferenceAttributes_t,
    buf: *mut c_void,
    sizeInBytes: usize,
    sizeWritten: *mut usize,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: a descriptor handle and buffers as documented, per the contract.
        unsafe {
            Desc::open(pref.cast(), &PREFERENCE)
                .map_or_else(|e| e, |d| d.get(attr, buf, sizeInBytes, sizeWritten))
        }
    })
}

// ---- matmul --------------------------------------------------------------------------------

/// A matrix layout as read from its descriptor.
struct MatrixDesc {
    dtype: DType,
    rows: usize,
    cols: usize,
    layout: Layout,
    batch: usize,
}

/// Reads and checks a layout descriptor.
///
/// # Safety
/// `l` must be a layout handle from this library (or null).
unsafe fn read_layout(l: cublasLtMatrixLayout_t) -> Result<MatrixDesc, cublasStatus_t> {
    // SAFETY: per the contract.
    let d = unsafe { Desc::open(l.cast(), &MATRIX_LAYOUT) }?;
    let dtype = DType::from_cuda(d.u64(CUBLASLT_MATRIX_LAYOUT_TYPE) as u32)
        .ok_or(CUBLAS_STATUS_NOT_SUPPORTED)?;
    let order = match d.u64(CUBLASLT_MATRIX_LAYOUT_ORDER) as u32 {
        CUBLASLT_ORDER_COL => Order::Col,
        CUBLASLT_ORDER_ROW => Order::Row,
        _ => return Err(CUBLAS_STATUS_NOT_SUPPORTED),
    };
    if d.i64(CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET) != 0 {
        return Err(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    let rows = usize::try_from(d.u64(CUBLASLT_MATRIX_LAYOUT_ROWS))
        .map_err(|_| CUBLAS_STATUS_INVALID_VALUE)?;
    let cols = usize::try_from(d.u64(CUBLASLT_MATRIX_LAYOUT_COLS))
        .map_err(|_| CUBLAS_STATUS_INVALID_VALUE)?;
    let ld = usize::try_from(d.i64(CUBLASLT_MATRIX_LAYOUT_LD))
        .map_err(|_| CUBLAS_STATUS_INVALID_VALUE)?;
    let batch = usize::try_from(d.i64(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT))
        .map_err(|_| CUBLAS_STATUS_INVALID_VALUE)?;
    let stride = usize::try_from(d.i64(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET))
        .map_err(|_| CUBLAS_STATUS_INVALID_VALUE)?;
    if batch == 0 || rows > i32::MAX as usize || cols > i32::MAX as usize {
        return Err(CUBLAS_STATUS_INVALID_VALUE);
    }
    let layout = Layout {
        dtype,
        ld,
        order,
        batch_stride: stride,
    };
    if !layout.ld_valid(rows, cols) {
        return Err(CUBLAS_STATUS_INVALID_VALUE);
    }
    Ok(MatrixDesc {
        dtype,
        rows,
        cols,
        layout,
        batch,
    })
}

/// A validated matmul: the problem and the device pointers its descriptor names.
struct Problem {
    g: Gemm,
    device_scalars: bool,
    bias: *mut c_void,
    aux: *mut c_void,
    scales: [*mut c_void; 4],
    amax: *mut c_void,
    /// A's and B's scales are MXFP8 block scales (`scales[0..2]` point to them).
    block: bool,
}

fn is_fp8(t: DType) -> bool {
    matches!(t, DType::E4M3 | DType::E5M2)
}

/// Whether cuBLASLt supports the type combination (see the crate documentation).
fn types_supported(compute: Compute, scale: DType, a: DType, b: DType, c: DType, d: DType) -> bool {
    use DType::*;
    if is_fp8(a) || is_fp8(b) {
        let pair_ok = is_fp8(a) && is_fp8(b) && !(a == E5M2 && b == E5M2);
        let cd_ok = match d {
            F32 => c == F32,
            BF16 | F16 => c == d,
            E4M3 | E5M2 => matches!(c, BF16 | F16),
            _ => false,
        };
        return pair_ok && cd_ok && compute == Compute::F32 && scale == F32;
    }
    if a != b || c != d {
        return false;
    }
    match compute {
        Compute::F16 => a == F16 && d == F16 && scale == F16,
        Compute::F32 => matches!(a, F32 | F16 | BF16) && (d == F32 || d == a) && scale == F32,
        Compute::F32Fast16F | Compute::F32Fast16BF | Compute::F32FastTF32 => {
            a == F32 && d == F32 && scale == F32
        }
        Compute::F64 => a == F64 && d == F64 && scale == F64,
        Compute::I32 => a == I8 && d == I32 && matches!(scale, I32 | F32),
    }
}

/// Reads the descriptors and checks the problem as `cublasLtMatmul` does.
///
/// # Safety
/// The handles must be descriptors from this library (or null; `c` may be null).
unsafe fn prepare(
    desc: cublasLtMatmulDesc_t,
    a: cublasLtMatrixLayout_t,
    b: cublasLtMatrixLayout_t,
    c: cublasLtMatrixLayout_t,
    d: cublasLtMatrixLayout_t,
) -> Result<Problem, cublasStatus_t> {
    // SAFETY: per the contract.
    let (md, ad, bd, dd) = unsafe {
        (
            Desc::open(desc.cast(), &MATMUL_DESC)?,
            read_layout(a)?,
            read_layout(b)?,
            read_layout(d)?,
        )
    };
    let cd = if c.is_null() {
        None
    } else {
        // SAFETY: per the contract.
        Some(unsafe { read_layout(c) }?)
    };
    let compute = Compute::from_raw(md.u64(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE) as u32)
        .ok_or(CUBLAS_STATUS_NOT_SUPPORTED)?;
    let scale_type = DType::from_cuda(md.u64(CUBLASLT_MATMUL_DESC_SCALE_TYPE) as u32)
        .ok_or(CUBLAS_STATUS_NOT_SUPPORTED)?;
    let op = |attr| Op::from_cublas(md.u64(attr) as u32).ok_or(CUBLAS_STATUS_INVALID_VALUE);
    let (transa, transb) = (
        op(CUBLASLT_MATMUL_DESC_TRANSA)?,
        op(CUBLASLT_MATMUL_DESC_TRANSB)?,
    );
    if op(CUBLASLT_MATMUL_DESC_TRANSC)? != Op::N
        || md.u64(CUBLASLT_MATMUL_DESC_FILL_MODE) as u32 != CUBLAS_FILL_MODE_FULL
    {
        return Err(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    // Shapes: D is m x n; op(A) m x k; op(B) k x n; C like D.
    let (m, n) = (dd.rows, dd.cols);
    let (a_m, k) = match transa {
        Op::N => (ad.rows, ad.cols),
        Op::T => (ad.cols, ad.rows),
    };
    let (b_k, b_n) = match transb {
        Op::N => (bd.rows, bd.cols),
        Op::T => (bd.cols, bd.rows),
    };
    let c_layout = cd.as_ref().map_or(dd.layout, |c| c.layout);
    let c_shape_ok = cd
        .as_ref()
        .is_none_or(|c| c.rows == m && c.cols == n && c.batch == dd.batch);
    if a_m != m
        || b_k != k
        || b_n != n
        || !c_shape_ok
        || ad.batch != dd.batch
        || bd.batch != dd.batch
    {
        return Err(CUBLAS_STATUS_INVALID_VALUE);
    }
    let (at, bt, dt) = (ad.dtype, bd.dtype, dd.dtype);
    let ct = cd.as_ref().map_or(dt, |c| c.dtype);
    if !types_supported(compute, scale_type, at, bt, ct, dt) {
        return Err(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    let fp8 = is_fp8(at);
    if fp8
        && (transa != Op::T
            || transb != Op::N
            || [&ad, &bd, &dd].iter().any(|l| l.layout.order != Order::Col))
    {
        return Err(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    let device_scalars = match md.u64(CUBLASLT_MATMUL_DESC_POINTER_MODE) as u32 {
        CUBLASLT_POINTER_MODE_HOST => false,
        CUBLASLT_POINTER_MODE_DEVICE => true,
        _ => return Err(CUBLAS_STATUS_NOT_SUPPORTED),
    };
    // Scaling: FP8 only; scalar, or MXFP8 block scales (VEC32_UE8M0) on both A and B of one
    // matrix (NVFP4 and the FP32 vector modes are not simulated).
    let mode = |a| md.u64(a) as u32;
    let scalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    let mx = CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
    let (a_mode, b_mode) = (
        mode(CUBLASLT_MATMUL_DESC_A_SCALE_MODE),
        mode(CUBLASLT_MATMUL_DESC_B_SCALE_MODE),
    );
    let others = [
        CUBLASLT_MATMUL_DESC_C_SCALE_MODE,
        CUBLASLT_MATMUL_DESC_D_SCALE_MODE,
        CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE,
        CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE,
    ];
    let block = (a_mode, b_mode) == (mx, mx);
    if others.iter().any(|&a| mode(a) != scalar)
        || !(block || (a_mode, b_mode) == (scalar, scalar))
        || (block && (!fp8 || dd.batch != 1))
    {
        return Err(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    let unsupported_ptrs = [
        CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER,
        CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER,
        CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER,
        CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_IN_COUNTERS_POINTER,
        CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_OUT_COUNTERS_POINTER,
    ];
    if unsupported_ptrs.iter().any(|&a| !md.ptr(a).is_null()) {
        return Err(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    let scales = [
        CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
        CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
        CUBLASLT_MATMUL_DESC_C_SCALE_POINTER,
        CUBLASLT_MATMUL_DESC_D_SCALE_POINTER,
    ]
    .map(|a| md.ptr(a));
    let amax = md.ptr(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER);
    if !fp8 && (scales.iter().any(|p| !p.is_null()) || !amax.is_null()) {
        return Err(CUBLAS_STATUS_INVALID_VALUE);
    }
    if !scales[3].is_null() && !is_fp8(dt) {
        return Err(CUBLAS_STATUS_INVALID_VALUE);
    }
    // Epilogue: (bias input, activation, aux matrix, bias gradient).
    let epi = md.u64(CUBLASLT_MATMUL_DESC_EPILOGUE) as u32;
    let (bias_on, activation, aux_on, bgrad) = match epi {
        CUBLASLT_EPILOGUE_DEFAULT => (false, Activation::Identity, false, None),
        CUBLASLT_EPILOGUE_RELU => (false, Activation::Relu, false, None),
        CUBLASLT_EPILOGUE_BIAS => (true, Activation::Identity, false, None),
        CUBLASLT_EPILOGUE_RELU_BIAS => (true, Activation::Relu, false, None),
        CUBLASLT_EPILOGUE_GELU => (false, Activation::Gelu, false, None),
        CUBLASLT_EPILOGUE_GELU_BIAS => (true, Activation::Gelu, false, None),
        CUBLASLT_EPILOGUE_GELU_AUX => (false, Activation::Gelu, true, None),
        CUBLASLT_EPILOGUE_GELU_AUX_BIAS => (true, Activation::Gelu, true, None),
        CUBLASLT_EPILOGUE_DGELU => (false, Activation::DGelu, true, None),
        CUBLASLT_EPILOGUE_DGELU_BGRAD => (false, Activation::DGelu, true, Some(BiasGrad::D)),
        CUBLASLT_EPILOGUE_BGRADA => (false, Activation::Identity, false, Some(BiasGrad::A)),
        CUBLASLT_EPILOGUE_BGRADB => (false, Activation::Identity, false, Some(BiasGrad::B)),
        _ => return Err(CUBLAS_STATUS_NOT_SUPPORTED),
    };
    let stride = |attr| usize::try_from(md.i64(attr)).map_err(|_| CUBLAS_STATUS_INVALID_VALUE);
    let mut epilogue = Epilogue {
        activation,
        ..Epilogue::default()
    };
    let bias = md.ptr(CUBLASLT_MATMUL_DESC_BIAS_POINTER);
    if bias_on || bgrad.is_some() {
        if bias.is_null() {
            return Err(CUBLAS_STATUS_INVALID_VALUE);
        }
        let raw = md.i64(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE);
        let dtype = if raw < 0 {
            match (fp8, ct) {
                (false, _) => dt,
                (true, DType::BF16 | DType::F16) => ct,
                (true, _) => DType::BF16,
            }
        } else {
            DType::from_cuda(raw as u32)
                .filter(|t| t.is_float())
                .ok_or(CUBLAS_STATUS_NOT_SUPPORTED)?
        };
        let layout = BiasLayout {
            dtype,
            batch_stride: stride(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE)?,
        };
        match bgrad {
            Some(src) => epilogue.bgrad = Some((src, layout)),
            None => epilogue.bias = Some(layout),
        }
    }
    let aux = md.ptr(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER);
    if aux_on {
        let ld = stride(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD)?;
        if aux.is_null() || ld < m || ld % 8 != 0 {
            return Err(CUBLAS_STATUS_INVALID_VALUE);
        }
        let raw = md.i64(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE);
        let dtype = if raw < 0 {
            dt
        } else {
            DType::from_cuda(raw as u32)
                .filter(|t| t.is_float())
                .ok_or(CUBLAS_STATUS_NOT_SUPPORTED)?
        };
        epilogue.aux = Some(Layout {
            dtype,
            ld,
            order: Order::Col,
            batch_stride: stride(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE)?,
        });
    }
    let g = Gemm {
        m,
        n,
        k,
        batch: dd.batch,
        transa,
        transb,
        a: ad.layout,
        b: bd.layout,
        c: c_layout,
        d: dd.layout,
        compute,
        scale_type,
        alpha: 1.0,
        beta: 0.0,
        epilogue,
    };
    Ok(Problem {
        g,
        device_scalars,
        bias,
        aux,
        scales,
        amax,
        block,
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmul(
    lightHandle: cublasLtHandle_t,
    computeDesc: cublasLtMatmulDesc_t,
    alpha: *const c_void,
    A: *const c_void,
    Adesc: cublasLtMatrixLayout_t,
    B: *const c_void,
    Bdesc: cublasLtMatrixLayout_t,
    beta: *const c_void,
    C: *const c_void,
    Cdesc: cublasLtMatrixLayout_t,
    D: *mut c_void,
    Ddesc: cublasLtMatrixLayout_t,
    algo: *const cublasLtMatmulAlgo_t,
    workspace: *mut c_void,
    workspaceSizeInBytes: usize,
    stream: cudaStream_t,
) -> cublasStatus_t {
    let _ = (algo, workspace, workspaceSizeInBytes);
    guard(|| {
        if !handle_live(lightHandle) {
            return CUBLAS_STATUS_NOT_INITIALIZED;
        }
        // SAFETY: descriptor handles, per the caller's contract.
        let p = match unsafe { prepare(computeDesc, Adesc, Bdesc, Cdesc, Ddesc) } {
            Ok(p) => p,
            Err(e) => return e,
        };
        if alpha.is_null() || beta.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        let g = p.g;
        if g.m == 0 || g.n == 0 {
            return CUBLAS_STATUS_SUCCESS;
        }
        let st = g.scale_type;
        let scalars = if p.device_scalars {
            Scalar::device(alpha, st).zip(Scalar::device(beta, st))
        } else {
            // SAFETY: host pointer mode: host pointers to scale-type values.
            Some(unsafe { (Scalar::host(alpha, st), Scalar::host(beta, st)) })
        };
        let Some((alpha_s, beta_s)) = scalars else {
            return sim_blas::enqueue_fault(stream);
        };
        // C is bound when it will be read: beta != 0 known now, or a device-side beta with a
        // non-null C (a null C with a nonzero device beta faults in the kernel).
        let c_read = match beta_s {
            Scalar::Value(v) => v != 0.0,
            Scalar::Device(..) => !C.is_null(),
        };
        let mut k = GemmKernel::new(g, alpha_s, beta_s);
        let bound = (|| -> Result<GemmKernel, Inaccessible> {
            k.bind(A, B, C, D, c_read)?;
            if g.epilogue.bgrad.is_some() {
                k.bgrad = Range::new(p.bias, g.bgrad_bytes())?;
            } else {
                k.bias = Range::new(p.bias, g.bias_bytes())?;
            }
            k.aux = Range::new(p.aux, g.aux_bytes())?;
            if p.block {
                k.block_scales = [
                    Range::new(p.scales[0], sim_blas::mx_scale_bytes(g.m, g.k))?,
                    Range::new(p.scales[1], sim_blas::mx_scale_bytes(g.n, g.k))?,
                ];
            }
            let scalar_from = if p.block { 2 } else { 0 };
            for (slot, ptr) in k.scales.iter_mut().zip(p.scales).skip(scalar_from) {
                if !ptr.is_null() {
                    *slot = Some(Scalar::device(ptr, DType::F32).ok_or(Inaccessible)?);
                }
            }
            if !p.amax.is_null() {
                k.amax = Some(sim_device::device_access(p.amax, 4).ok_or(Inaccessible)?);
            }
            Ok(k)
        })();
        enqueue_gemm(stream, bound)
    })
}

/// An algorithm id: the plan the simulated kernel follows, so that a tracer can record it.
fn algo_for(g: &Gemm) -> cublasLtMatmulAlgo_t {
    let p = plan(g.m, g.n, g.k, g.batch, g.compute);
    let mut algo = cublasLtMatmulAlgo_t::default();
    algo.data[0] = 0x5349_4d00; // "SIM\0"
    algo.data[1] = p.k_tile as u64;
    algo.data[2] = p.splits as u64;
    algo.data[3] = p.lanes as u64;
    algo
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulAlgoGetHeuristic(
    lightHandle: cublasLtHandle_t,
    operationDesc: cublasLtMatmulDesc_t,
    Adesc: cublasLtMatrixLayout_t,
    Bdesc: cublasLtMatrixLayout_t,
    Cdesc: cublasLtMatrixLayout_t,
    Ddesc: cublasLtMatrixLayout_t,
    preference: cublasLtMatmulPreference_t,
    requestedAlgoCount: c_int,
    heuristicResultsArray: *mut cublasLtMatmulHeuristicResult_t,
    returnAlgoCount: *mut c_int,
) -> cublasStatus_t {
    guard(|| {
        if !handle_live(lightHandle) {
            return CUBLAS_STATUS_NOT_INITIALIZED;
        }
        if requestedAlgoCount <= 0 || heuristicResultsArray.is_null() || returnAlgoCount.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if !preference.is_null() {
            // SAFETY: a preference handle, per the contract.
            if let Err(e) = unsafe { Desc::open(preference.cast(), &PREFERENCE) } {
                return e;
            }
        }
        // SAFETY: descriptor handles, per the caller's contract.
        let p = match unsafe { prepare(operationDesc, Adesc, Bdesc, Cdesc, Ddesc) } {
            Ok(p) => p,
            Err(e) => return e,
        };
        let g = p.g;
        let pl = plan(g.m, g.n, g.k, g.batch, g.compute);
        let tiles = g.m.div_ceil(128) * g.n.div_ceil(128) * g.batch * pl.splits;
        let result = cublasLtMatmulHeuristicResult_t {
            algo: algo_for(&g),
            workspaceSize: 0,
            state: CUBLAS_STATUS_SUCCESS,
            wavesCount: tiles as f32 / SM_COUNT as f32,
            reserved: [0; 4],
        };
        // SAFETY: non-null, room for `requestedAlgoCount >= 1` results.
        unsafe {
            heuristicResultsArray.write(result);
            *returnAlgoCount = 1;
        }
        CUBLAS_STATUS_SUCCESS
    })
}

// ---- Algorithm enumeration: the simulator's algorithms are chosen per problem shape
// (`cublasLtMatmulAlgoGetHeuristic`); there is no table of algorithm ids to initialise from or
// configure, so these report CUBLAS_STATUS_NOT_SUPPORTED, as cuBLASLt does for an algorithm id
// it lacks. PyTorch uses them only when tuning (TunableOp).

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulAlgoInit(
    lightHandle: cublasLtHandle_t,
    _computeType: cublasComputeType_t,
    _scaleType: cudaDataType_t,
    _Atype: cudaDataType_t,
    _Btype: cudaDataType_t,
    _Ctype: cudaDataType_t,
    _Dtype: cudaDataType_t,
    _algoId: c_int,
    _algo: *mut cublasLtMatmulAlgo_t,
) -> cublasStatus_t {
    guard(|| {
        if !handle_live(lightHandle) {
            return CUBLAS_STATUS_NOT_INITIALIZED;
        }
        CUBLAS_STATUS_NOT_SUPPORTED
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulAlgoCheck(
    lightHandle: cublasLtHandle_t,
    _operationDesc: cublasLtMatmulDesc_t,
    _Adesc: cublasLtMatrixLayout_t,
    _Bdesc: cublasLtMatrixLayout_t,
    _Cdesc: cublasLtMatrixLayout_t,
    _Ddesc: cublasLtMatrixLayout_t,
    _algo: *const cublasLtMatmulAlgo_t,
    _result: *mut cublasLtMatmulHeuristicResult_t,
) -> cublasStatus_t {
    guard(|| {
        if !handle_live(lightHandle) {
            return CUBLAS_STATUS_NOT_INITIALIZED;
        }
        CUBLAS_STATUS_NOT_SUPPORTED
    })
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulAlgoConfigSetAttribute(
    _algo: *mut cublasLtMatmulAlgo_t,
    _attr: cublasLtMatmulAlgoConfigAttributes_t,
    _buf: *const c_void,
    _sizeInBytes: usize,
) -> cublasStatus_t {
    CUBLAS_STATUS_NOT_SUPPORTED
}

#[no_mangle]
pub unsafe extern "C" fn cublasLtMatmulAlgoConfigGetAttribute(
    _algo: *const cublasLtMatmulAlgo_t,
    _attr: cublasLtMatmulAlgoConfigAttributes_t,
    _buf: *mut c_void,
    _sizeInBytes: usize,
    _sizeWritten: *mut usize,
) -> cublasStatus_t {
    CUBLAS_STATUS_NOT_SUPPORTED
}
