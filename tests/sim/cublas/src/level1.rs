//! Single-precision BLAS the simulator computes besides the GEMMs: `cublasSaxpy_v2`,
//! `cublasSscal_v2`, `cublasSdot_v2` and the BLAS-like extension `cublasSgeam`.
//!
//! Each validates its handle and arguments during the call and runs as one kernel on the
//! handle's stream, exactly like the GEMMs: device pointers are translated at launch (a range
//! the device cannot access makes the kernel fault with `cudaErrorIllegalAddress`), scalars are
//! read during the call in `CUBLAS_POINTER_MODE_HOST` and by the kernel in
//! `CUBLAS_POINTER_MODE_DEVICE`.
//!
//! Vectors follow the BLAS convention for strides: element `i` of `n` lies at `i * inc` for
//! `inc >= 0` and at `(n - 1 - i) * |inc|` for `inc < 0` (the pointer is the lowest address).
//!
//! Arithmetic, in f32 as on the GPU (FFMA):
//! * axpy: `y[i] = fma(alpha, x[i], y[i])`; with alpha == 0 y is left as it is (BLAS);
//! * scal: `x[i] = alpha * x[i]`; `n <= 0` or `incx <= 0` does nothing (BLAS);
//! * dot: `acc = fma(x[i], y[i], acc)` from 0 in index order; `n <= 0` gives 0. In host
//!   pointer mode the call returns once the result is in `*result` (it waits for the stream);
//!   while the handle's stream is capturing that cannot happen, and the call returns
//!   `CUBLAS_STATUS_NOT_SUPPORTED`. In device pointer mode the kernel writes `*result`;
//! * geam: `C = alpha * op(A) + beta * op(B)` as `fma(alpha, a, beta * b)`; an operand whose
//!   scalar is 0 is not read (NaNs in it do not propagate, and it may be null), so `alpha = 1,
//!   beta = 0` transposes A and `alpha = beta = 0` zeroes C. In place, `C == A` requires
//!   `transa = N` and `lda == ldc` (likewise for B), else `CUBLAS_STATUS_INVALID_VALUE`.
//!
//! Statuses: `CUBLAS_STATUS_NOT_INITIALIZED` for a bad handle; `CUBLAS_STATUS_INVALID_VALUE`
//! for a null scalar or result pointer, and for geam negative sizes, an unknown operation,
//! `lda`/`ldb` < max(1, rows of op's input), `ldc` < max(1, m) and the in-place rules;
//! `CUBLAS_STATUS_EXECUTION_FAILED` when the runtime refuses the launch (or, for a host-mode
//! dot, when its kernel did not deliver a result).

use core::ffi::{c_int, c_void};
use std::sync::mpsc;
use std::sync::OnceLock;

use cuda_abi::cublas::*;
use cuda_abi::cudart::*;
use sim_blas::{enqueue, enqueue_fault, guard, Range, Scalar};
use sim_kernels::dtype::DType;
use sim_kernels::gemm::{Layout, Op};

use crate::{state, Handle};

/// A strided f32 vector of `n` elements.
#[derive(Clone, Copy)]
struct Strided {
    n: usize,
    inc: i64,
}

impl Strided {
    /// Elements from the lowest to the highest one touched (0 when empty).
    fn span(self) -> Option<usize> {
        if self.n == 0 {
            return Some(0);
        }
        let step = usize::try_from(self.inc.unsigned_abs()).ok()?;
        (self.n - 1).checked_mul(step)?.checked_add(1)
    }

    /// The element offset of element `i`.
    fn at(self, i: usize) -> usize {
        let step = self.inc.unsigned_abs() as usize;
        if self.inc >= 0 {
            i * step
        } else {
            (self.n - 1 - i) * step
        }
    }

    /// Translates the vector at `p`: its range, or [`sim_blas::Inaccessible`].
    fn bind(self, p: *const c_void) -> Result<Range, sim_blas::Inaccessible> {
        let bytes = self
            .span()
            .and_then(|e| e.checked_mul(4))
            .ok_or(sim_blas::Inaccessible)?;
        Range::new(p, bytes)
    }
}

fn get(b: &[u8], i: usize) -> f32 {
    DType::F32.load(b, i) as f32
}

fn put(b: &mut [u8], i: usize, v: f32) {
    DType::F32.store(b, i, v.into());
}

/// alpha (or beta) as the handle's pointer mode says: read now, or bound for the kernel.
/// `Err(None)`: null; `Err(Some(()))`: a device pointer the device cannot access.
///
/// # Safety
/// In host pointer mode `p` must be null or a readable f32.
unsafe fn scalar(h: &Handle, p: *const f32) -> Result<Scalar, Option<()>> {
    if p.is_null() {
        return Err(None);
    }
    if h.pointer_mode == CUBLAS_POINTER_MODE_DEVICE {
        Scalar::device(p.cast(), DType::F32).ok_or(Some(()))
    } else {
        // SAFETY: host pointer mode: a readable host f32, per the contract.
        Ok(unsafe { Scalar::host(p.cast(), DType::F32) })
    }
}

/// A sized 32-bit argument as `usize` (negative: `None`).
fn size(v: c_int) -> Option<usize> {
    usize::try_from(v).ok()
}

/// Whether `stream` is being captured (asked of the runtime through a handle lookup, like the
/// library's own statically linked runtime would: invisible to interposers).
fn is_capturing(stream: cudaStream_t) -> bool {
    type IsCapturingFn =
        unsafe extern "C" fn(cudaStream_t, *mut cudaStreamCaptureStatus) -> cudaError_t;
    static F: OnceLock<usize> = OnceLock::new();
    let addr = *F.get_or_init(|| {
        sim_device::runtime_symbol(c"cudaStreamIsCapturing").map_or(0, |p| p as usize)
    });
    if addr == 0 {
        return false;
    }
    // SAFETY: the runtime's cudaStreamIsCapturing has this signature.
    let f = unsafe { std::mem::transmute::<usize, IsCapturingFn>(addr) };
    let mut status: cudaStreamCaptureStatus = cudaStreamCaptureStatusNone;
    // SAFETY: a query with a valid output pointer.
    let rc = unsafe { f(stream, &mut status) };
    rc == cudaSuccess && status != cudaStreamCaptureStatusNone
}

/// `cublasSaxpy_v2`: `y = alpha * x + y`.
#[no_mangle]
pub unsafe extern "C" fn cublasSaxpy_v2(
    handle: cublasHandle_t,
    n: c_int,
    alpha: *const f32,
    x: *const f32,
    incx: c_int,
    y: *mut f32,
    incy: c_int,
) -> cublasStatus_t {
    guard(|| {
        let h = match state(handle) {
            Ok(h) => h,
            Err(e) => return e,
        };
        // SAFETY: per cuBLAS's contract for alpha.
        let alpha = match unsafe { scalar(&h, alpha) } {
            Ok(a) => a,
            Err(None) => return CUBLAS_STATUS_INVALID_VALUE,
            Err(Some(())) => return enqueue_fault(h.stream as cudaStream_t),
        };
        let Some(n) = size(n).filter(|n| *n > 0) else {
            return CUBLAS_STATUS_SUCCESS;
        };
        let (xs, ys) = (
            Strided {
                n,
                inc: incx.into(),
            },
            Strided {
                n,
                inc: incy.into(),
            },
        );
        let stream = h.stream as cudaStream_t;
        let (Ok(xr), Ok(yr)) = (xs.bind(x.cast()), ys.bind(y.cast_const().cast())) else {
            return enqueue_fault(stream);
        };
        enqueue(stream, move || {
            let a = alpha.read() as f32;
            if a == 0.0 {
                return Ok(());
            }
            // x is copied first: it may overlap y.
            // SAFETY: validated at launch; no mutable view exists yet.
            let xb = unsafe { xr.bytes() }.to_vec();
            // SAFETY: validated at launch; the only live view of y.
            let yb = unsafe { yr.bytes_mut() };
            for i in 0..n {
                let (ix, iy) = (xs.at(i), ys.at(i));
                put(yb, iy, a.mul_add(get(&xb, ix), get(yb, iy)));
            }
            Ok(())
        })
    })
}

/// `cublasSscal_v2`: `x = alpha * x`.
#[no_mangle]
pub unsafe extern "C" fn cublasSscal_v2(
    handle: cublasHandle_t,
    n: c_int,
    alpha: *const f32,
    x: *mut f32,
    incx: c_int,
) -> cublasStatus_t {
    guard(|| {
        let h = match state(handle) {
            Ok(h) => h,
            Err(e) => return e,
        };
        // SAFETY: per cuBLAS's contract for alpha.
        let alpha = match unsafe { scalar(&h, alpha) } {
            Ok(a) => a,
            Err(None) => return CUBLAS_STATUS_INVALID_VALUE,
            Err(Some(())) => return enqueue_fault(h.stream as cudaStream_t),
        };
        let Some(n) = size(n).filter(|n| *n > 0) else {
            return CUBLAS_STATUS_SUCCESS;
        };
        if incx <= 0 {
            return CUBLAS_STATUS_SUCCESS;
        }
        let xs = Strided {
            n,
            inc: incx.into(),
        };
        let stream = h.stream as cudaStream_t;
        let Ok(xr) = xs.bind(x.cast_const().cast()) else {
            return enqueue_fault(stream);
        };
        enqueue(stream, move || {
            let a = alpha.read() as f32;
            // SAFETY: validated at launch; the only live view of x.
            let xb = unsafe { xr.bytes_mut() };
            for i in 0..n {
                let ix = xs.at(i);
                put(xb, ix, a * get(xb, ix));
            }
            Ok(())
        })
    })
}

/// Where a dot product goes.
enum DotOut {
    /// Host pointer mode: sent to the waiting caller.
    Host(mpsc::Sender<f32>),
    /// Device pointer mode: written by the kernel.
    Device(Range),
}

/// `cublasSdot_v2`: `*result = sum x[i] * y[i]`.
#[no_mangle]
pub unsafe extern "C" fn cublasSdot_v2(
    handle: cublasHandle_t,
    n: c_int,
    x: *const f32,
    incx: c_int,
    y: *const f32,
    incy: c_int,
    result: *mut f32,
) -> cublasStatus_t {
    guard(|| {
        let h = match state(handle) {
            Ok(h) => h,
            Err(e) => return e,
        };
        if result.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        let stream = h.stream as cudaStream_t;
        let host = h.pointer_mode != CUBLAS_POINTER_MODE_DEVICE;
        if host && is_capturing(stream) {
            // The call would wait for a kernel that is only recorded.
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        let n = size(n).unwrap_or(0);
        let (xs, ys) = (
            Strided {
                n,
                inc: incx.into(),
            },
            Strided {
                n,
                inc: incy.into(),
            },
        );
        let (tx, rx) = mpsc::channel();
        let out = if host {
            Ok(DotOut::Host(tx))
        } else {
            drop(tx);
            Range::new(result.cast_const().cast(), 4).map(DotOut::Device)
        };
        let bound = match (xs.bind(x.cast()), ys.bind(y.cast()), out) {
            (Ok(xr), Ok(yr), Ok(out)) => Ok((xr, yr, out)),
            // A host-mode sender dropped here leaves the caller without a result.
            _ => Err(cudaErrorIllegalAddress),
        };
        let st = enqueue(stream, move || {
            let (xr, yr, out) = bound.as_ref().map_err(|e| *e)?;
            // SAFETY: validated at launch; read-only views.
            let (xb, yb) = unsafe { (xr.bytes(), yr.bytes()) };
            let mut acc = 0f32;
            for i in 0..n {
                acc = get(xb, xs.at(i)).mul_add(get(yb, ys.at(i)), acc);
            }
            match out {
                // The caller may have gone (it never does: it waits); nothing to do then.
                DotOut::Host(tx) => {
                    let _ = tx.send(acc);
                }
                // SAFETY: validated for 4 bytes at launch; the only live view.
                DotOut::Device(r) => put(unsafe { r.bytes_mut() }, 0, acc),
            }
            Ok(())
        });
        if st != CUBLAS_STATUS_SUCCESS || !host {
            return st;
        }
        // The kernel is dropped after it ran (or without running): either way `recv` returns.
        match rx.recv() {
            Ok(v) => {
                // SAFETY: host pointer mode: a writable host f32, per the contract.
                unsafe { *result = v };
                CUBLAS_STATUS_SUCCESS
            }
            Err(_) => CUBLAS_STATUS_EXECUTION_FAILED,
        }
    })
}

/// One geam operand: its range (empty when not read) and layout.
#[derive(Clone, Copy)]
struct Operand {
    range: Range,
    layout: Layout,
    op: Op,
    /// Whether a non-null pointer was given (device pointer mode binds it).
    given: bool,
}

impl Operand {
    /// op(X)(i, j) from the bytes `b`.
    fn at(&self, b: &[u8], i: usize, j: usize) -> f32 {
        match self.op {
            Op::N => get(b, self.layout.index(i, j, 0)),
            Op::T => get(b, self.layout.index(j, i, 0)),
        }
    }
}

/// `cublasSgeam`: `C = alpha * op(A) + beta * op(B)`, C `m x n`.
#[no_mangle]
pub unsafe extern "C" fn cublasSgeam(
    handle: cublasHandle_t,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: c_int,
    n: c_int,
    alpha: *const f32,
    A: *const f32,
    lda: c_int,
    beta: *const f32,
    B: *const f32,
    ldb: c_int,
    C: *mut f32,
    ldc: c_int,
) -> cublasStatus_t {
    guard(|| {
        let h = match state(handle) {
            Ok(h) => h,
            Err(e) => return e,
        };
        let (Some(ta), Some(tb)) = (Op::from_cublas(transa), Op::from_cublas(transb)) else {
            return CUBLAS_STATUS_INVALID_VALUE;
        };
        let (Some(mu), Some(nu)) = (size(m), size(n)) else {
            return CUBLAS_STATUS_INVALID_VALUE;
        };
        // The rows of op's input: m for N, n for T.
        let rows_of = |op: Op| if op == Op::N { m } else { n };
        if lda < rows_of(ta).max(1) || ldb < rows_of(tb).max(1) || ldc < m.max(1) {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        let c_addr = C as usize;
        let in_place_bad = |p: *const f32, op: Op, ld: c_int| {
            p as usize == c_addr && c_addr != 0 && (op != Op::N || ld != ldc)
        };
        if in_place_bad(A, ta, lda) || in_place_bad(B, tb, ldb) {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        let stream = h.stream as cudaStream_t;
        // SAFETY: per cuBLAS's contract for alpha and beta.
        let scalars = unsafe { (scalar(&h, alpha), scalar(&h, beta)) };
        let (alpha, beta) = match scalars {
            (Ok(a), Ok(b)) => (a, b),
            (Err(None), _) | (_, Err(None)) => return CUBLAS_STATUS_INVALID_VALUE,
            _ => return enqueue_fault(stream),
        };
        if mu == 0 || nu == 0 {
            return CUBLAS_STATUS_SUCCESS;
        }
        let operand = |p: *const f32, op: Op, ld: c_int, s: Scalar| {
            let layout = Layout::col(DType::F32, ld as usize);
            let (r, c) = if op == Op::N { (mu, nu) } else { (nu, mu) };
            // An operand is read unless its scalar is a host 0 (or, device mode, it is null).
            let read = match s {
                Scalar::Value(v) => v != 0.0,
                Scalar::Device(..) => !p.is_null(),
            };
            let range = if read {
                Range::new(p.cast(), layout.span_bytes(r, c, 1))?
            } else {
                Range::EMPTY
            };
            Ok::<_, sim_blas::Inaccessible>(Operand {
                range,
                layout,
                op,
                given: read,
            })
        };
        let c_layout = Layout::col(DType::F32, ldc as usize);
        let bound = (
            operand(A, ta, lda, alpha),
            operand(B, tb, ldb, beta),
            Range::new(C.cast_const().cast(), c_layout.span_bytes(mu, nu, 1)),
        );
        let (Ok(a), Ok(b), Ok(cr)) = bound else {
            return enqueue_fault(stream);
        };
        enqueue(stream, move || {
            let (al, be) = (alpha.read() as f32, beta.read() as f32);
            // A nonzero scalar read on the device with its operand unbound (null): the kernel
            // reads address 0.
            if (al != 0.0 && !a.given) || (be != 0.0 && !b.given) {
                return Err(cudaErrorIllegalAddress);
            }
            // The operands are copied first: in place, C is A or B.
            // SAFETY: validated at launch; no mutable view exists yet.
            let (ab, bb) = unsafe { (a.range.bytes().to_vec(), b.range.bytes().to_vec()) };
            // SAFETY: validated at launch; the only live view of C.
            let cb = unsafe { cr.bytes_mut() };
            for j in 0..nu {
                for i in 0..mu {
                    let v = match (al != 0.0, be != 0.0) {
                        (true, true) => al.mul_add(a.at(&ab, i, j), be * b.at(&bb, i, j)),
                        (true, false) => al * a.at(&ab, i, j),
                        (false, true) => be * b.at(&bb, i, j),
                        (false, false) => 0.0,
                    };
                    put(cb, c_layout.index(i, j, 0), v);
                }
            }
            Ok(())
        })
    })
}
