//! `cublasLtMatrixTransform` and its descriptor: `C = alpha * op(A) + beta * op(B)`, a layout
//! change (transpose, order, type) with scaling and addition.
//!
//! The descriptor (`cublasLtMatrixTransformDescCreate`/`Init_internal`/`Destroy`/
//! `SetAttribute`/`GetAttribute`) lives in its header-defined opaque storage like the others
//! ([`crate::desc::TRANSFORM_DESC`]): `SCALE_TYPE` (from the constructor), `POINTER_MODE`
//! (default HOST), `TRANSA`, `TRANSB` (default N), each an `int32_t`.
//!
//! Supported: scale type `CUDA_R_32F`; pointer modes HOST (alpha and beta read during the call)
//! and DEVICE (read by the kernel); A, B and C each of `CUDA_R_32F`, `CUDA_R_16F` or
//! `CUDA_R_16BF` (independently: every element is converted to f32, the result rounded to C's
//! type, nearest-even), in `CUBLASLT_ORDER_COL` or `CUBLASLT_ORDER_ROW`; one matrix per layout.
//! The arithmetic is f32: `fma(alpha, a, beta * b)`; an operand whose scalar is 0 is not read,
//! and may be null with a null layout. The kernel runs on the `stream` argument and reads A and
//! B before writing C, so C may be A or B.
//!
//! Statuses: `CUBLAS_STATUS_NOT_INITIALIZED` for a bad handle; `CUBLAS_STATUS_INVALID_VALUE` for
//! a bad descriptor, a null alpha, beta, C or C layout, a non-null operand with a null layout,
//! an unknown operation, or shapes that disagree (op(A) and op(B) must be C's rows x cols);
//! `CUBLAS_STATUS_NOT_SUPPORTED` for another scale type, pointer mode, data type or order, and
//! for a batch count other than 1.

use core::ffi::c_void;

use cuda_abi::cublas::*;
use cuda_abi::cublaslt::*;
use cuda_abi::cudart::*;
use cuda_abi::library_types::*;
use sim_blas::{enqueue, enqueue_fault, guard, Range, Scalar};
use sim_kernels::dtype::DType;
use sim_kernels::gemm::{Layout, Op};

use crate::desc::{Desc, TRANSFORM_DESC};
use crate::{create, destroy, hand_out, handle_live, read_layout, MatrixDesc};

fn transform_defaults(d: &Desc, scale: cudaDataType) {
    d.put(CUBLASLT_MATRIX_TRANSFORM_DESC_SCALE_TYPE, scale as u64);
    d.put(
        CUBLASLT_MATRIX_TRANSFORM_DESC_POINTER_MODE,
        CUBLASLT_POINTER_MODE_HOST as u64,
    );
    d.put(CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA, CUBLAS_OP_N as u64);
    d.put(CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSB, CUBLAS_OP_N as u64);
}

/// `cublasLtMatrixTransformDescCreate`.
#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixTransformDescCreate(
    transformDesc: *mut cublasLtMatrixTransformDesc_t,
    scaleType: cudaDataType,
) -> cublasStatus_t {
    guard(|| {
        if transformDesc.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        let d = create::<cublasLtMatrixTransformDescOpaque_t>(&TRANSFORM_DESC);
        if let Ok(d) = &d {
            transform_defaults(d, scaleType);
        }
        // SAFETY: checked non-null.
        unsafe { hand_out(transformDesc, d, |d| d.raw().cast()) }
    })
}

/// `cublasLtMatrixTransformDescInit_internal` (the header's inline
/// `cublasLtMatrixTransformDescInit` passes `sizeof` of the opaque struct).
#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixTransformDescInit_internal(
    transformDesc: cublasLtMatrixTransformDesc_t,
    size: usize,
    scaleType: cudaDataType,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: the caller provides `size` bytes of storage.
        match unsafe { Desc::init(transformDesc.cast(), size, &TRANSFORM_DESC) } {
            Ok(d) => {
                transform_defaults(&d, scaleType);
                CUBLAS_STATUS_SUCCESS
            }
            Err(e) => e,
        }
    })
}

/// `cublasLtMatrixTransformDescDestroy`.
#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixTransformDescDestroy(
    transformDesc: cublasLtMatrixTransformDesc_t,
) -> cublasStatus_t {
    // SAFETY: a descriptor handle, per the caller's contract.
    guard(|| unsafe {
        destroy::<cublasLtMatrixTransformDescOpaque_t>(transformDesc.cast(), &TRANSFORM_DESC)
    })
}

/// `cublasLtMatrixTransformDescSetAttribute`.
#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixTransformDescSetAttribute(
    transformDesc: cublasLtMatrixTransformDesc_t,
    attr: cublasLtMatrixTransformDescAttributes_t,
    buf: *const c_void,
    sizeInBytes: usize,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: a descriptor handle and a buffer of `sizeInBytes`, per the contract.
        unsafe {
            Desc::open(transformDesc.cast(), &TRANSFORM_DESC)
                .map_or_else(|e| e, |d| d.set(attr, buf, sizeInBytes))
        }
    })
}

/// `cublasLtMatrixTransformDescGetAttribute`.
#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixTransformDescGetAttribute(
    transformDesc: cublasLtMatrixTransformDesc_t,
    attr: cublasLtMatrixTransformDescAttributes_t,
    buf: *mut c_void,
    sizeInBytes: usize,
    sizeWritten: *mut usize,
) -> cublasStatus_t {
    guard(|| {
        // SAFETY: a descriptor handle and buffers as documented, per the contract.
        unsafe {
            Desc::open(transformDesc.cast(), &TRANSFORM_DESC)
                .map_or_else(|e| e, |d| d.get(attr, buf, sizeInBytes, sizeWritten))
        }
    })
}

/// One input of the transform, bound at launch.
#[derive(Clone, Copy)]
struct Input {
    range: Range,
    layout: Layout,
    op: Op,
    /// Whether it is bound (else a nonzero scalar makes the kernel fault).
    bound: bool,
}

impl Input {
    /// op(X)(i, j) as f32.
    fn at(&self, b: &[u8], i: usize, j: usize) -> f32 {
        let idx = match self.op {
            Op::N => self.layout.index(i, j, 0),
            Op::T => self.layout.index(j, i, 0),
        };
        // f16/bf16/f32 values are exact in f32.
        self.layout.dtype.load(b, idx) as f32
    }
}

/// A layout the transform supports: its description, or the status refusing it.
///
/// # Safety
/// `l` must be a layout handle from this library.
unsafe fn layout(l: cublasLtMatrixLayout_t) -> Result<MatrixDesc, cublasStatus_t> {
    // SAFETY: per the contract.
    let d = unsafe { read_layout(l) }?;
    if d.batch != 1 || !matches!(d.dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    Ok(d)
}

/// Validates an input: `None` when it is absent (null pointer and layout).
///
/// # Safety
/// `l` must be null or a layout handle from this library.
unsafe fn input(
    p: *const c_void,
    l: cublasLtMatrixLayout_t,
    op: Op,
    (rows, cols): (usize, usize),
) -> Result<Option<MatrixDesc>, cublasStatus_t> {
    if l.is_null() {
        return if p.is_null() {
            Ok(None)
        } else {
            Err(CUBLAS_STATUS_INVALID_VALUE)
        };
    }
    // SAFETY: per the contract.
    let d = unsafe { layout(l) }?;
    let want = if op == Op::N {
        (rows, cols)
    } else {
        (cols, rows)
    };
    if (d.rows, d.cols) != want {
        return Err(CUBLAS_STATUS_INVALID_VALUE);
    }
    Ok(Some(d))
}

/// `cublasLtMatrixTransform`: `C = alpha * op(A) + beta * op(B)` on `stream`.
#[no_mangle]
pub unsafe extern "C" fn cublasLtMatrixTransform(
    lightHandle: cublasLtHandle_t,
    transformDesc: cublasLtMatrixTransformDesc_t,
    alpha: *const c_void,
    A: *const c_void,
    Adesc: cublasLtMatrixLayout_t,
    beta: *const c_void,
    B: *const c_void,
    Bdesc: cublasLtMatrixLayout_t,
    C: *mut c_void,
    Cdesc: cublasLtMatrixLayout_t,
    stream: cudaStream_t,
) -> cublasStatus_t {
    guard(|| {
        if !handle_live(lightHandle) {
            return CUBLAS_STATUS_NOT_INITIALIZED;
        }
        // SAFETY: descriptor handles, per the caller's contract.
        let desc = match unsafe { Desc::open(transformDesc.cast(), &TRANSFORM_DESC) } {
            Ok(d) => d,
            Err(e) => return e,
        };
        if desc.u64(CUBLASLT_MATRIX_TRANSFORM_DESC_SCALE_TYPE) as u32 != CUDA_R_32F {
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        let device_scalars = match desc.u64(CUBLASLT_MATRIX_TRANSFORM_DESC_POINTER_MODE) as u32 {
            CUBLASLT_POINTER_MODE_HOST => false,
            CUBLASLT_POINTER_MODE_DEVICE => true,
            _ => return CUBLAS_STATUS_NOT_SUPPORTED,
        };
        let ops = (
            Op::from_cublas(desc.u64(CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA) as u32),
            Op::from_cublas(desc.u64(CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSB) as u32),
        );
        let (Some(ta), Some(tb)) = ops else {
            return CUBLAS_STATUS_INVALID_VALUE;
        };
        if alpha.is_null() || beta.is_null() || C.is_null() || Cdesc.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        // SAFETY: a layout handle, per the contract.
        let c = match unsafe { layout(Cdesc) } {
            Ok(c) => c,
            Err(e) => return e,
        };
        let shape = (c.rows, c.cols);
        // SAFETY: layout handles (or null), per the contract.
        let (a, b) = match unsafe { (input(A, Adesc, ta, shape), input(B, Bdesc, tb, shape)) } {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return e,
        };
        let scalars = if device_scalars {
            Scalar::device(alpha, DType::F32).zip(Scalar::device(beta, DType::F32))
        } else {
            // SAFETY: host pointer mode: host pointers to f32 values.
            Some(unsafe {
                (
                    Scalar::host(alpha, DType::F32),
                    Scalar::host(beta, DType::F32),
                )
            })
        };
        let Some((alpha, beta)) = scalars else {
            return enqueue_fault(stream);
        };
        if c.rows == 0 || c.cols == 0 {
            return CUBLAS_STATUS_SUCCESS;
        }
        // An input is read unless its scalar is a host 0 or it is absent.
        let bind = |p: *const c_void, d: &Option<MatrixDesc>, op: Op, s: Scalar| {
            let Some(d) = d else {
                return Ok(Input {
                    range: Range::EMPTY,
                    layout: c.layout,
                    op,
                    bound: false,
                });
            };
            let read = !matches!(s, Scalar::Value(v) if v == 0.0) && !p.is_null();
            let range = if read {
                Range::new(p, d.layout.span_bytes(d.rows, d.cols, 1))?
            } else {
                Range::EMPTY
            };
            Ok::<_, sim_blas::Inaccessible>(Input {
                range,
                layout: d.layout,
                op,
                bound: read,
            })
        };
        let c_layout = c.layout;
        let (rows, cols) = shape;
        let bound = (
            bind(A, &a, ta, alpha),
            bind(B, &b, tb, beta),
            Range::new(C.cast_const(), c_layout.span_bytes(rows, cols, 1)),
        );
        let (Ok(a), Ok(b), Ok(cr)) = bound else {
            return enqueue_fault(stream);
        };
        enqueue(stream, move || {
            let (al, be) = (alpha.read() as f32, beta.read() as f32);
            // A nonzero scalar with its operand absent: the kernel reads address 0.
            if (al != 0.0 && !a.bound) || (be != 0.0 && !b.bound) {
                return Err(cudaErrorIllegalAddress);
            }
            // The inputs are copied first: C may be A or B.
            // SAFETY: validated at launch; no mutable view exists yet.
            let (ab, bb) = unsafe { (a.range.bytes().to_vec(), b.range.bytes().to_vec()) };
            // SAFETY: validated at launch; the only live view of C.
            let cb = unsafe { cr.bytes_mut() };
            for j in 0..cols {
                for i in 0..rows {
                    let v = match (al != 0.0, be != 0.0) {
                        (true, true) => al.mul_add(a.at(&ab, i, j), be * b.at(&bb, i, j)),
                        (true, false) => al * a.at(&ab, i, j),
                        (false, true) => be * b.at(&bb, i, j),
                        (false, false) => 0.0,
                    };
                    c_layout.dtype.store(cb, c_layout.index(i, j, 0), v.into());
                }
            }
            Ok(())
        })
    })
}
