//! cuBLAS's helper copies between host and device: `cublas{Set,Get}{Vector,Matrix}`, their
//! `Async` forms and the `_64` variant of each (16 entry points, none takes a handle).
//!
//! Each is one 2-D copy of the simulated runtime (`cudaMemcpy2D`, or `cudaMemcpy2DAsync` on the
//! caller's stream), as real cuBLAS does it with its statically linked runtime:
//! * a vector of `n` elements of `elemSize` bytes strided by `incx`/`incy` elements is `n` rows
//!   of `elemSize` bytes with pitches `elemSize * inc`;
//! * a column-major matrix is `cols` rows of `rows * elemSize` bytes with pitches
//!   `elemSize * ld`.
//!
//! The runtime's functions are looked up in the runtime itself
//! ([`sim_device::runtime_symbol`]), so a tracer interposing `cudaMemcpy2D*` does not see these
//! copies (it sees the cuBLAS call), and a failed copy leaves the caller's last runtime error
//! as it was (cuBLAS's copy goes through its own runtime, not the application's).
//!
//! Statuses, as documented: `CUBLAS_STATUS_INVALID_VALUE` for `n`/`rows`/`cols` < 0,
//! `elemSize` <= 0, `incx`/`incy` <= 0 or `lda`/`ldb` < max(1, rows);
//! `CUBLAS_STATUS_MAPPING_ERROR` when the runtime refuses the copy (a host pointer where device
//! memory is expected, a range leaving its allocation, a bad stream, a sticky error). The
//! synchronous forms run on the legacy default stream and return when the copy is done; the
//! `Async` forms are exactly as asynchronous as `cudaMemcpy2DAsync` (a pageable source is
//! staged during the call, a pageable destination makes the call wait). Sizes whose byte
//! counts do not fit the host's address space are `CUBLAS_STATUS_INVALID_VALUE`.

use core::ffi::{c_int, c_void};
use std::sync::OnceLock;

use cuda_abi::cublas::*;
use cuda_abi::cudart::*;
use sim_blas::guard;

/// `cudaMemcpy2D`.
type Memcpy2DFn = unsafe extern "C" fn(
    *mut c_void,
    usize,
    *const c_void,
    usize,
    usize,
    usize,
    cudaMemcpyKind,
) -> cudaError_t;
/// `cudaMemcpy2DAsync`.
type Memcpy2DAsyncFn = unsafe extern "C" fn(
    *mut c_void,
    usize,
    *const c_void,
    usize,
    usize,
    usize,
    cudaMemcpyKind,
    cudaStream_t,
) -> cudaError_t;
/// `cudaPeekAtLastError` / `cudaGetLastError`.
type LastErrorFn = unsafe extern "C" fn() -> cudaError_t;

/// The runtime's export `name`, cached (0 when there is no simulated runtime).
fn symbol(slot: &'static OnceLock<usize>, name: &'static core::ffi::CStr) -> usize {
    *slot.get_or_init(|| sim_device::runtime_symbol(name).map_or(0, |p| p as usize))
}

/// Which way a copy goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// `Set*`: host to device.
    Set,
    /// `Get*`: device to host.
    Get,
}

/// One helper copy, as received (sizes widened to 64 bits).
struct Copy2D {
    dir: Dir,
    /// Bytes per row of the 2-D copy (elemSize for a vector, rows * elemSize for a matrix).
    width: i64,
    /// Rows of the 2-D copy (n for a vector, cols for a matrix).
    height: i64,
    elem: i64,
    src: *const c_void,
    /// Source stride in elements (incx or lda).
    src_ld: i64,
    dst: *mut c_void,
    /// Destination stride in elements (incy or ldb).
    dst_ld: i64,
    /// `None`: the synchronous form (legacy default stream, blocking).
    stream: Option<cudaStream_t>,
}

impl Copy2D {
    fn run(&self) -> cublasStatus_t {
        let bytes = |v: i64| usize::try_from(v).ok();
        let sizes = (
            self.elem.checked_mul(self.src_ld).and_then(bytes),
            self.elem.checked_mul(self.dst_ld).and_then(bytes),
            bytes(self.width),
            bytes(self.height),
        );
        let (Some(spitch), Some(dpitch), Some(width), Some(height)) = sizes else {
            return CUBLAS_STATUS_INVALID_VALUE;
        };
        if width == 0 || height == 0 {
            return CUBLAS_STATUS_SUCCESS;
        }
        let kind = match self.dir {
            Dir::Set => cudaMemcpyHostToDevice,
            Dir::Get => cudaMemcpyDeviceToHost,
        };
        static PEEK: OnceLock<usize> = OnceLock::new();
        static CLEAR: OnceLock<usize> = OnceLock::new();
        let (peek, clear) = (
            symbol(&PEEK, c"cudaPeekAtLastError"),
            symbol(&CLEAR, c"cudaGetLastError"),
        );
        let before = if peek == 0 {
            cudaSuccess
        } else {
            // SAFETY: the runtime's cudaPeekAtLastError has this signature.
            unsafe { std::mem::transmute::<usize, LastErrorFn>(peek)() }
        };
        let rc = match self.stream {
            None => {
                static F: OnceLock<usize> = OnceLock::new();
                let f = symbol(&F, c"cudaMemcpy2D");
                if f == 0 {
                    return CUBLAS_STATUS_MAPPING_ERROR;
                }
                // SAFETY: the runtime's cudaMemcpy2D; the pointers and pitches are the
                // caller's, validated by the runtime as for any cudaMemcpy2D.
                unsafe {
                    std::mem::transmute::<usize, Memcpy2DFn>(f)(
                        self.dst, dpitch, self.src, spitch, width, height, kind,
                    )
                }
            }
            Some(stream) => {
                static F: OnceLock<usize> = OnceLock::new();
                let f = symbol(&F, c"cudaMemcpy2DAsync");
                if f == 0 {
                    return CUBLAS_STATUS_MAPPING_ERROR;
                }
                // SAFETY: as above, for cudaMemcpy2DAsync.
                unsafe {
                    std::mem::transmute::<usize, Memcpy2DAsyncFn>(f)(
                        self.dst, dpitch, self.src, spitch, width, height, kind, stream,
                    )
                }
            }
        };
        if rc == cudaSuccess {
            return CUBLAS_STATUS_SUCCESS;
        }
        if before == cudaSuccess && clear != 0 {
            // The failure belongs to cuBLAS's own runtime: the application's last error stays
            // clear. (A sticky error is not cleared by this; it stays, as on a GPU.)
            // SAFETY: the runtime's cudaGetLastError has this signature.
            unsafe { std::mem::transmute::<usize, LastErrorFn>(clear)() };
        }
        CUBLAS_STATUS_MAPPING_ERROR
    }
}

/// A vector copy: validated as `cublasSetVector` documents, then run.
#[allow(clippy::too_many_arguments)]
fn vector(
    dir: Dir,
    n: i64,
    elem: i64,
    x: *const c_void,
    incx: i64,
    y: *mut c_void,
    incy: i64,
    stream: Option<cudaStream_t>,
) -> cublasStatus_t {
    if n < 0 || elem <= 0 || incx <= 0 || incy <= 0 {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    Copy2D {
        dir,
        width: elem,
        height: n,
        elem,
        src: x,
        src_ld: incx,
        dst: y,
        dst_ld: incy,
        stream,
    }
    .run()
}

/// A matrix copy: validated as `cublasSetMatrix` documents, then run.
#[allow(clippy::too_many_arguments)]
fn matrix(
    dir: Dir,
    rows: i64,
    cols: i64,
    elem: i64,
    a: *const c_void,
    lda: i64,
    b: *mut c_void,
    ldb: i64,
    stream: Option<cudaStream_t>,
) -> cublasStatus_t {
    if rows < 0 || cols < 0 || elem <= 0 || lda < rows.max(1) || ldb < rows.max(1) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    let Some(width) = rows.checked_mul(elem) else {
        return CUBLAS_STATUS_INVALID_VALUE;
    };
    Copy2D {
        dir,
        width,
        height: cols,
        elem,
        src: a,
        src_ld: lda,
        dst: b,
        dst_ld: ldb,
        stream,
    }
    .run()
}

/// `cublasSetVector`: `n` elements from host `x` (stride `incx`) to device `devicePtr`
/// (stride `incy`), on the legacy default stream; returns when the copy is done.
#[no_mangle]
pub unsafe extern "C" fn cublasSetVector(
    n: c_int,
    elemSize: c_int,
    x: *const c_void,
    incx: c_int,
    devicePtr: *mut c_void,
    incy: c_int,
) -> cublasStatus_t {
    guard(|| {
        let (n, e, ix, iy) = (n.into(), elemSize.into(), incx.into(), incy.into());
        vector(Dir::Set, n, e, x, ix, devicePtr, iy, None)
    })
}

/// `cublasSetVector_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasSetVector_64(
    n: i64,
    elemSize: i64,
    x: *const c_void,
    incx: i64,
    devicePtr: *mut c_void,
    incy: i64,
) -> cublasStatus_t {
    guard(|| vector(Dir::Set, n, elemSize, x, incx, devicePtr, incy, None))
}

/// `cublasGetVector`: `n` elements from device `x` (stride `incx`) to host `y` (stride
/// `incy`), on the legacy default stream; returns when the copy is done.
#[no_mangle]
pub unsafe extern "C" fn cublasGetVector(
    n: c_int,
    elemSize: c_int,
    x: *const c_void,
    incx: c_int,
    y: *mut c_void,
    incy: c_int,
) -> cublasStatus_t {
    guard(|| {
        let (n, e, ix, iy) = (n.into(), elemSize.into(), incx.into(), incy.into());
        vector(Dir::Get, n, e, x, ix, y, iy, None)
    })
}

/// `cublasGetVector_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasGetVector_64(
    n: i64,
    elemSize: i64,
    x: *const c_void,
    incx: i64,
    y: *mut c_void,
    incy: i64,
) -> cublasStatus_t {
    guard(|| vector(Dir::Get, n, elemSize, x, incx, y, incy, None))
}

/// `cublasSetMatrix`: `rows x cols` column-major elements from host `A` (leading dimension
/// `lda`) to device `B` (`ldb`), on the legacy default stream; returns when the copy is done.
#[no_mangle]
pub unsafe extern "C" fn cublasSetMatrix(
    rows: c_int,
    cols: c_int,
    elemSize: c_int,
    A: *const c_void,
    lda: c_int,
    B: *mut c_void,
    ldb: c_int,
) -> cublasStatus_t {
    guard(|| {
        let (r, c, e) = (rows.into(), cols.into(), elemSize.into());
        matrix(Dir::Set, r, c, e, A, lda.into(), B, ldb.into(), None)
    })
}

/// `cublasSetMatrix_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasSetMatrix_64(
    rows: i64,
    cols: i64,
    elemSize: i64,
    A: *const c_void,
    lda: i64,
    B: *mut c_void,
    ldb: i64,
) -> cublasStatus_t {
    guard(|| matrix(Dir::Set, rows, cols, elemSize, A, lda, B, ldb, None))
}

/// `cublasGetMatrix`: `rows x cols` column-major elements from device `A` (`lda`) to host `B`
/// (`ldb`), on the legacy default stream; returns when the copy is done.
#[no_mangle]
pub unsafe extern "C" fn cublasGetMatrix(
    rows: c_int,
    cols: c_int,
    elemSize: c_int,
    A: *const c_void,
    lda: c_int,
    B: *mut c_void,
    ldb: c_int,
) -> cublasStatus_t {
    guard(|| {
        let (r, c, e) = (rows.into(), cols.into(), elemSize.into());
        matrix(Dir::Get, r, c, e, A, lda.into(), B, ldb.into(), None)
    })
}

/// `cublasGetMatrix_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasGetMatrix_64(
    rows: i64,
    cols: i64,
    elemSize: i64,
    A: *const c_void,
    lda: i64,
    B: *mut c_void,
    ldb: i64,
) -> cublasStatus_t {
    guard(|| matrix(Dir::Get, rows, cols, elemSize, A, lda, B, ldb, None))
}

/// `cublasSetVectorAsync`: [`cublasSetVector`] as a copy on `stream`.
#[no_mangle]
pub unsafe extern "C" fn cublasSetVectorAsync(
    n: c_int,
    elemSize: c_int,
    hostPtr: *const c_void,
    incx: c_int,
    devicePtr: *mut c_void,
    incy: c_int,
    stream: cudaStream_t,
) -> cublasStatus_t {
    guard(|| {
        let (n, e, ix, iy) = (n.into(), elemSize.into(), incx.into(), incy.into());
        vector(Dir::Set, n, e, hostPtr, ix, devicePtr, iy, Some(stream))
    })
}

/// `cublasSetVectorAsync_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasSetVectorAsync_64(
    n: i64,
    elemSize: i64,
    hostPtr: *const c_void,
    incx: i64,
    devicePtr: *mut c_void,
    incy: i64,
    stream: cudaStream_t,
) -> cublasStatus_t {
    guard(|| {
        vector(
            Dir::Set,
            n,
            elemSize,
            hostPtr,
            incx,
            devicePtr,
            incy,
            Some(stream),
        )
    })
}

/// `cublasGetVectorAsync`: [`cublasGetVector`] as a copy on `stream`.
#[no_mangle]
pub unsafe extern "C" fn cublasGetVectorAsync(
    n: c_int,
    elemSize: c_int,
    devicePtr: *const c_void,
    incx: c_int,
    hostPtr: *mut c_void,
    incy: c_int,
    stream: cudaStream_t,
) -> cublasStatus_t {
    guard(|| {
        let (n, e, ix, iy) = (n.into(), elemSize.into(), incx.into(), incy.into());
        vector(Dir::Get, n, e, devicePtr, ix, hostPtr, iy, Some(stream))
    })
}

/// `cublasGetVectorAsync_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasGetVectorAsync_64(
    n: i64,
    elemSize: i64,
    devicePtr: *const c_void,
    incx: i64,
    hostPtr: *mut c_void,
    incy: i64,
    stream: cudaStream_t,
) -> cublasStatus_t {
    guard(|| {
        vector(
            Dir::Get,
            n,
            elemSize,
            devicePtr,
            incx,
            hostPtr,
            incy,
            Some(stream),
        )
    })
}

/// `cublasSetMatrixAsync`: [`cublasSetMatrix`] as a copy on `stream`.
#[no_mangle]
pub unsafe extern "C" fn cublasSetMatrixAsync(
    rows: c_int,
    cols: c_int,
    elemSize: c_int,
    A: *const c_void,
    lda: c_int,
    B: *mut c_void,
    ldb: c_int,
    stream: cudaStream_t,
) -> cublasStatus_t {
    guard(|| {
        let (r, c, e) = (rows.into(), cols.into(), elemSize.into());
        matrix(
            Dir::Set,
            r,
            c,
            e,
            A,
            lda.into(),
            B,
            ldb.into(),
            Some(stream),
        )
    })
}

/// `cublasSetMatrixAsync_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasSetMatrixAsync_64(
    rows: i64,
    cols: i64,
    elemSize: i64,
    A: *const c_void,
    lda: i64,
    B: *mut c_void,
    ldb: i64,
    stream: cudaStream_t,
) -> cublasStatus_t {
    guard(|| matrix(Dir::Set, rows, cols, elemSize, A, lda, B, ldb, Some(stream)))
}

/// `cublasGetMatrixAsync`: [`cublasGetMatrix`] as a copy on `stream`.
#[no_mangle]
pub unsafe extern "C" fn cublasGetMatrixAsync(
    rows: c_int,
    cols: c_int,
    elemSize: c_int,
    A: *const c_void,
    lda: c_int,
    B: *mut c_void,
    ldb: c_int,
    stream: cudaStream_t,
) -> cublasStatus_t {
    guard(|| {
        let (r, c, e) = (rows.into(), cols.into(), elemSize.into());
        matrix(
            Dir::Get,
            r,
            c,
            e,
            A,
            lda.into(),
            B,
            ldb.into(),
            Some(stream),
        )
    })
}

/// `cublasGetMatrixAsync_64`.
#[no_mangle]
pub unsafe extern "C" fn cublasGetMatrixAsync_64(
    rows: i64,
    cols: i64,
    elemSize: i64,
    A: *const c_void,
    lda: i64,
    B: *mut c_void,
    ldb: i64,
    stream: cudaStream_t,
) -> cublasStatus_t {
    guard(|| matrix(Dir::Get, rows, cols, elemSize, A, lda, B, ldb, Some(stream)))
}
