//! cuBLAS's helper copies between host and device, `cublas{Set,Get}{Vector,Matrix}`, their
//! `Async` forms and the `_64` variant of each: captured as the 2-D copies they are (rows of
//! `elemSize` bytes strided by the increments for a vector, `cols` columns of
//! `rows * elemSize` bytes strided by the leading dimensions for a matrix), through the same
//! path as `cudaMemcpy2DAsync` ([`capture_as`]), under their own API name. cuBLAS runs them
//! with a runtime of its own, which the cudart hooks never see. The synchronous ones use the
//! legacy default stream and return with the copy done (an upload's snapshot is done by then
//! too, as for `cudaMemcpy2D`); the `Async` ones run on the stream they are given.
//!
//! Arguments cuBLAS refuses (`CUBLAS_STATUS_INVALID_VALUE`: a negative size or a size,
//! increment or leading dimension below what the data needs) record nothing when the call
//! fails, as it does; one such call that succeeded anyway is a gap naming it.

use core::ffi::{c_int, c_void};

use cuda_abi::cublas::*;
use cuda_abi::cudart::{
    cudaMemcpyDeviceToHost, cudaMemcpyHostToDevice, cudaMemcpyKind, cudaStream_t,
};

use ttrace_proto::record::{GapReason, Op};

use super::cublas::MISSING;
use super::cudart::{capture_as, pitched, Geometry, LEGACY};
use crate::{mode, real};

/// A vector copy: `n` elements of `elem` bytes, every `incx`-th from `x` to every `incy`-th
/// of `y` (`None`: arguments cuBLAS refuses).
fn vector(
    n: impl Into<i64>,
    elem: impl Into<i64>,
    x: *const c_void,
    incx: impl Into<i64>,
    y: *mut c_void,
    incy: impl Into<i64>,
) -> Option<Geometry> {
    let (n, elem, incx, incy) = (n.into(), elem.into(), incx.into(), incy.into());
    if n < 0 || elem <= 0 || incx <= 0 || incy <= 0 {
        return None;
    }
    let pitch = |inc: i64| usize::try_from(inc.checked_mul(elem)?).ok();
    Some(pitched(
        y,
        pitch(incy)?,
        x,
        pitch(incx)?,
        usize::try_from(elem).ok()?,
        usize::try_from(n).ok()?,
    ))
}

/// A column-major matrix copy: `cols` columns of `rows` elements of `elem` bytes, from `a`
/// (leading dimension `lda` elements) to `b` (`ldb`) (`None`: arguments cuBLAS refuses).
fn matrix(
    rows: impl Into<i64>,
    cols: impl Into<i64>,
    elem: impl Into<i64>,
    a: *const c_void,
    lda: impl Into<i64>,
    b: *mut c_void,
    ldb: impl Into<i64>,
) -> Option<Geometry> {
    let (rows, cols, elem) = (rows.into(), cols.into(), elem.into());
    let (lda, ldb) = (lda.into(), ldb.into());
    if rows < 0 || cols < 0 || elem <= 0 || lda < rows.max(1) || ldb < rows.max(1) {
        return None;
    }
    let bytes = |n: i64| usize::try_from(n.checked_mul(elem)?).ok();
    Some(pitched(
        b,
        bytes(ldb)?,
        a,
        bytes(lda)?,
        bytes(rows)?,
        usize::try_from(cols).ok()?,
    ))
}

/// One helper copy: `name(C signature) => (geometry or None, kind, stream)`. The real
/// function, looked up under the hook's name, is called exactly once with the program's
/// arguments.
macro_rules! blas_copy_hook {
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? )
        => ($g:expr, $kind:expr, $stream:expr)) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> cublasStatus_t {
            let Some(real) = real::real_of!($name, fn($($t),*) -> cublasStatus_t, Cublas) else {
                return MISSING;
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            let run = || unsafe { real($($a),*) };
            if mode::off(mode::MEMCPY) {
                return run();
            }
            let kind: cudaMemcpyKind = $kind;
            match $g {
                Some(g) => capture_as(
                    stringify!($name),
                    g,
                    kind,
                    None,
                    $stream,
                    run,
                    CUBLAS_STATUS_SUCCESS,
                ),
                // Arguments the tracer cannot map to a copy: cuBLAS refuses them, but a call
                // that moved data anyway is a gap, not a silent hole.
                None => crate::around_metadata(
                    stringify!($name),
                    $stream,
                    || {
                        Some(Op::gap(GapReason::Unsupported, stringify!($name), 0, "arguments outside what the tracer maps to a copy"))
                    },
                    run,
                    |r| r == CUBLAS_STATUS_SUCCESS,
                ),
            }
        }
    };
}

blas_copy_hook! {
    /// `cublasSetVector`: a vector upload on the legacy default stream, done when it returns.
    cublasSetVector(n: c_int, elemSize: c_int, x: *const c_void, incx: c_int, devicePtr: *mut c_void, incy: c_int)
        => (vector(n, elemSize, x, incx, devicePtr, incy), cudaMemcpyHostToDevice, LEGACY)
}

blas_copy_hook! {
    /// `cublasSetVectorAsync`: a vector upload on `stream`.
    cublasSetVectorAsync(n: c_int, elemSize: c_int, hostPtr: *const c_void, incx: c_int, devicePtr: *mut c_void, incy: c_int, stream: cudaStream_t)
        => (vector(n, elemSize, hostPtr, incx, devicePtr, incy), cudaMemcpyHostToDevice, stream)
}

blas_copy_hook! {
    /// `cublasSetVector_64`: a vector upload on the legacy default stream, done when it returns.
    cublasSetVector_64(n: i64, elemSize: i64, x: *const c_void, incx: i64, devicePtr: *mut c_void, incy: i64)
        => (vector(n, elemSize, x, incx, devicePtr, incy), cudaMemcpyHostToDevice, LEGACY)
}

blas_copy_hook! {
    /// `cublasSetVectorAsync_64`: a vector upload on `stream`.
    cublasSetVectorAsync_64(n: i64, elemSize: i64, hostPtr: *const c_void, incx: i64, devicePtr: *mut c_void, incy: i64, stream: cudaStream_t)
        => (vector(n, elemSize, hostPtr, incx, devicePtr, incy), cudaMemcpyHostToDevice, stream)
}

blas_copy_hook! {
    /// `cublasGetVector`: a vector download on the legacy default stream, done when it returns.
    cublasGetVector(n: c_int, elemSize: c_int, x: *const c_void, incx: c_int, y: *mut c_void, incy: c_int)
        => (vector(n, elemSize, x, incx, y, incy), cudaMemcpyDeviceToHost, LEGACY)
}

blas_copy_hook! {
    /// `cublasGetVectorAsync`: a vector download on `stream`.
    cublasGetVectorAsync(n: c_int, elemSize: c_int, devicePtr: *const c_void, incx: c_int, hostPtr: *mut c_void, incy: c_int, stream: cudaStream_t)
        => (vector(n, elemSize, devicePtr, incx, hostPtr, incy), cudaMemcpyDeviceToHost, stream)
}

blas_copy_hook! {
    /// `cublasGetVector_64`: a vector download on the legacy default stream, done when it returns.
    cublasGetVector_64(n: i64, elemSize: i64, x: *const c_void, incx: i64, y: *mut c_void, incy: i64)
        => (vector(n, elemSize, x, incx, y, incy), cudaMemcpyDeviceToHost, LEGACY)
}

blas_copy_hook! {
    /// `cublasGetVectorAsync_64`: a vector download on `stream`.
    cublasGetVectorAsync_64(n: i64, elemSize: i64, devicePtr: *const c_void, incx: i64, hostPtr: *mut c_void, incy: i64, stream: cudaStream_t)
        => (vector(n, elemSize, devicePtr, incx, hostPtr, incy), cudaMemcpyDeviceToHost, stream)
}

blas_copy_hook! {
    /// `cublasSetMatrix`: a matrix upload on the legacy default stream, done when it returns.
    cublasSetMatrix(rows: c_int, cols: c_int, elemSize: c_int, A: *const c_void, lda: c_int, B: *mut c_void, ldb: c_int)
        => (matrix(rows, cols, elemSize, A, lda, B, ldb), cudaMemcpyHostToDevice, LEGACY)
}

blas_copy_hook! {
    /// `cublasSetMatrixAsync`: a matrix upload on `stream`.
    cublasSetMatrixAsync(rows: c_int, cols: c_int, elemSize: c_int, A: *const c_void, lda: c_int, B: *mut c_void, ldb: c_int, stream: cudaStream_t)
        => (matrix(rows, cols, elemSize, A, lda, B, ldb), cudaMemcpyHostToDevice, stream)
}

blas_copy_hook! {
    /// `cublasSetMatrix_64`: a matrix upload on the legacy default stream, done when it returns.
    cublasSetMatrix_64(rows: i64, cols: i64, elemSize: i64, A: *const c_void, lda: i64, B: *mut c_void, ldb: i64)
        => (matrix(rows, cols, elemSize, A, lda, B, ldb), cudaMemcpyHostToDevice, LEGACY)
}

blas_copy_hook! {
    /// `cublasSetMatrixAsync_64`: a matrix upload on `stream`.
    cublasSetMatrixAsync_64(rows: i64, cols: i64, elemSize: i64, A: *const c_void, lda: i64, B: *mut c_void, ldb: i64, stream: cudaStream_t)
        => (matrix(rows, cols, elemSize, A, lda, B, ldb), cudaMemcpyHostToDevice, stream)
}

blas_copy_hook! {
    /// `cublasGetMatrix`: a matrix download on the legacy default stream, done when it returns.
    cublasGetMatrix(rows: c_int, cols: c_int, elemSize: c_int, A: *const c_void, lda: c_int, B: *mut c_void, ldb: c_int)
        => (matrix(rows, cols, elemSize, A, lda, B, ldb), cudaMemcpyDeviceToHost, LEGACY)
}

blas_copy_hook! {
    /// `cublasGetMatrixAsync`: a matrix download on `stream`.
    cublasGetMatrixAsync(rows: c_int, cols: c_int, elemSize: c_int, A: *const c_void, lda: c_int, B: *mut c_void, ldb: c_int, stream: cudaStream_t)
        => (matrix(rows, cols, elemSize, A, lda, B, ldb), cudaMemcpyDeviceToHost, stream)
}

blas_copy_hook! {
    /// `cublasGetMatrix_64`: a matrix download on the legacy default stream, done when it returns.
    cublasGetMatrix_64(rows: i64, cols: i64, elemSize: i64, A: *const c_void, lda: i64, B: *mut c_void, ldb: i64)
        => (matrix(rows, cols, elemSize, A, lda, B, ldb), cudaMemcpyDeviceToHost, LEGACY)
}

blas_copy_hook! {
    /// `cublasGetMatrixAsync_64`: a matrix download on `stream`.
    cublasGetMatrixAsync_64(rows: i64, cols: i64, elemSize: i64, A: *const c_void, lda: i64, B: *mut c_void, ldb: i64, stream: cudaStream_t)
        => (matrix(rows, cols, elemSize, A, lda, B, ldb), cudaMemcpyDeviceToHost, stream)
}
