//! cuBLAS-XT (`cublasXt.h`): BLAS-3 over the devices a handle was given, on host or device
//! matrices, returning when the result is in place. The simulator computes `cublasXtSgemm`
//! and `cublasXtDgemm` on the host (after the device's queued work, which may write the
//! operands), and keeps the handle's device list and block size; the other routines
//! (xt_unsupported.rs, generated) check their handle and return `CUBLAS_STATUS_NOT_SUPPORTED`.
//! The matrices are read and written in place: the simulated device memory is host memory.

use core::ffi::c_int;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use cuda_abi::cublas::*;

/// The state behind a `cublasXtHandle_t`.
#[derive(Debug, Clone, Default)]
struct XtHandle {
    devices: Vec<c_int>,
    block_dim: c_int,
}

/// Live XT handles, by address (a real allocation, freed by `cublasXtDestroy`).
static HANDLES: Mutex<Option<HashMap<usize, XtHandle>>> = Mutex::new(None);

fn handles() -> MutexGuard<'static, Option<HashMap<usize, XtHandle>>> {
    HANDLES.lock().unwrap_or_else(|e| e.into_inner())
}

fn state(h: cublasXtHandle_t) -> Result<XtHandle, cublasStatus_t> {
    handles()
        .as_ref()
        .and_then(|m| m.get(&(h as usize)).cloned())
        .ok_or(CUBLAS_STATUS_NOT_INITIALIZED)
}

/// An XT routine the simulator does not compute: the handle checked, then not supported.
pub(crate) fn unsupported(name: &str, h: cublasXtHandle_t) -> cublasStatus_t {
    if let Err(e) = state(h) {
        return e;
    }
    crate::not_computed(name)
}

#[no_mangle]
pub unsafe extern "C" fn cublasXtCreate(handle: *mut cublasXtHandle_t) -> cublasStatus_t {
    if handle.is_null() {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    let h = Box::into_raw(Box::new(0u64)) as usize;
    handles().get_or_insert_with(HashMap::new).insert(
        h,
        XtHandle {
            devices: Vec::new(),
            block_dim: 1024,
        },
    );
    // SAFETY: the caller's out-pointer, checked non-null.
    unsafe { *handle = h as cublasXtHandle_t };
    CUBLAS_STATUS_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasXtDestroy(handle: cublasXtHandle_t) -> cublasStatus_t {
    let Some(_) = handles()
        .as_mut()
        .and_then(|m| m.remove(&(handle as usize)))
    else {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    };
    // SAFETY: the allocation cublasXtCreate made for this handle, removed from the table above.
    drop(unsafe { Box::from_raw(handle as *mut u64) });
    CUBLAS_STATUS_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasXtDeviceSelect(
    handle: cublasXtHandle_t,
    nb_devices: c_int,
    device_id: *mut c_int,
) -> cublasStatus_t {
    if nb_devices <= 0 || device_id.is_null() {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    // SAFETY: `nb_devices` ids at `device_id`, per the contract.
    let ids = unsafe { std::slice::from_raw_parts(device_id, nb_devices as usize) }.to_vec();
    let mut g = handles();
    let Some(s) = g.as_mut().and_then(|m| m.get_mut(&(handle as usize))) else {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    };
    s.devices = ids;
    CUBLAS_STATUS_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasXtSetBlockDim(
    handle: cublasXtHandle_t,
    block_dim: c_int,
) -> cublasStatus_t {
    if block_dim <= 0 {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    let mut g = handles();
    let Some(s) = g.as_mut().and_then(|m| m.get_mut(&(handle as usize))) else {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    };
    s.block_dim = block_dim;
    CUBLAS_STATUS_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasXtGetBlockDim(
    handle: cublasXtHandle_t,
    block_dim: *mut c_int,
) -> cublasStatus_t {
    if block_dim.is_null() {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    match state(handle) {
        Ok(s) => {
            // SAFETY: the caller's out-pointer, checked non-null.
            unsafe { *block_dim = s.block_dim };
            CUBLAS_STATUS_SUCCESS
        }
        Err(e) => e,
    }
}

/// The element types XT's real GEMMs are simulated for.
trait Real: Copy + Into<f64> {
    fn from_f64(v: f64) -> Self;
}

impl Real for f32 {
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
}

impl Real for f64 {
    fn from_f64(v: f64) -> f64 {
        v
    }
}

/// `C = alpha op(A) op(B) + beta C`, column-major, on the host, once the device is idle.
///
/// # Safety
/// cuBLAS-XT's contract for the arguments (matrices of the given sizes and leading dimensions).
#[allow(clippy::too_many_arguments)]
unsafe fn gemm<T: Real>(
    handle: cublasXtHandle_t,
    [transa, transb]: [cublasOperation_t; 2],
    [m, n, k]: [usize; 3],
    [alpha, beta]: [*const T; 2],
    (a, lda): (*const T, usize),
    (b, ldb): (*const T, usize),
    (c, ldc): (*mut T, usize),
) -> cublasStatus_t {
    let s = match state(handle) {
        Ok(s) => s,
        Err(e) => return e,
    };
    if s.devices.is_empty() {
        // cublasXtDeviceSelect comes first.
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    let ops = [transa, transb];
    if ops.iter().any(|&o| o != CUBLAS_OP_N && o != CUBLAS_OP_T) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    let (a_rows, b_rows) = (
        if transa == CUBLAS_OP_N { m } else { k },
        if transb == CUBLAS_OP_N { k } else { n },
    );
    if alpha.is_null()
        || beta.is_null()
        || lda < a_rows.max(1)
        || ldb < b_rows.max(1)
        || ldc < m.max(1)
    {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if let Some(sync) = sim_device::runtime_symbol(c"cudaDeviceSynchronize") {
        // SAFETY: the simulated runtime's cudaDeviceSynchronize, which takes no arguments.
        let sync = unsafe {
            std::mem::transmute::<*mut core::ffi::c_void, unsafe extern "C" fn() -> c_int>(sync)
        };
        // SAFETY: as above.
        if unsafe { sync() } != 0 {
            return CUBLAS_STATUS_EXECUTION_FAILED;
        }
    }
    // SAFETY: host-readable scalars, per the contract.
    let (alpha, beta): (f64, f64) = unsafe { ((*alpha).into(), (*beta).into()) };
    let at = |i: usize, l: usize| -> f64 {
        let idx = if transa == CUBLAS_OP_N {
            l * lda + i
        } else {
            i * lda + l
        };
        // SAFETY: within the m x k (or k x m) matrix A of leading dimension lda.
        unsafe { (*a.add(idx)).into() }
    };
    let bt = |l: usize, j: usize| -> f64 {
        let idx = if transb == CUBLAS_OP_N {
            j * ldb + l
        } else {
            l * ldb + j
        };
        // SAFETY: within the k x n (or n x k) matrix B of leading dimension ldb.
        unsafe { (*b.add(idx)).into() }
    };
    for j in 0..n {
        for i in 0..m {
            let dot: f64 = (0..k).map(|l| at(i, l) * bt(l, j)).sum();
            // SAFETY: within the m x n matrix C of leading dimension ldc.
            let cij = unsafe { &mut *c.add(j * ldc + i) };
            let old: f64 = if beta == 0.0 { 0.0 } else { (*cij).into() };
            *cij = T::from_f64(alpha * dot + beta * old);
        }
    }
    CUBLAS_STATUS_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cublasXtSgemm(
    handle: cublasXtHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: usize,
    n: usize,
    k: usize,
    alpha: *const f32,
    A: *const f32,
    lda: usize,
    B: *const f32,
    ldb: usize,
    beta: *const f32,
    C: *mut f32,
    ldc: usize,
) -> cublasStatus_t {
    // SAFETY: per cuBLAS-XT's contract for the arguments.
    unsafe {
        gemm(
            handle,
            [transa, transb],
            [m, n, k],
            [alpha, beta],
            (A, lda),
            (B, ldb),
            (C, ldc),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn cublasXtDgemm(
    handle: cublasXtHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: usize,
    n: usize,
    k: usize,
    alpha: *const f64,
    A: *const f64,
    lda: usize,
    B: *const f64,
    ldb: usize,
    beta: *const f64,
    C: *mut f64,
    ldc: usize,
) -> cublasStatus_t {
    // SAFETY: per cuBLAS-XT's contract for the arguments.
    unsafe {
        gemm(
            handle,
            [transa, transb],
            [m, n, k],
            [alpha, beta],
            (A, lda),
            (B, ldb),
            (C, ldc),
        )
    }
}
