//! `sim-probe blas-more`: cuBLAS's helper copies (all 16 forms, strides and leading dimensions
//! larger than the data), f32 axpy/scal/dot/geam and cuBLASLt's matrix transform, each checked
//! against the documented result computed here (bitwise: the simulator documents its f32
//! arithmetic), plus refused calls' statuses.

use core::ffi::c_void;

use crate::support::{ck, DevBuf};
use cuda_dyn::abi::cublas::*;
use cuda_dyn::abi::cublaslt::*;
use cuda_dyn::abi::cudart::*;
use cuda_dyn::abi::library_types::*;
use cuda_dyn::cublas::*;
use cuda_dyn::cublaslt::*;
use cuda_dyn::cudart::*;

/// Fails unless the cuBLAS call returned `$expected` (default success).
macro_rules! st {
    ($e:expr) => {
        st!($e, CUBLAS_STATUS_SUCCESS)
    };
    ($e:expr, $expected:expr) => {{
        // SAFETY: a cuBLAS call with arguments prepared by the probe.
        let code = unsafe { $e };
        if code != $expected {
            return Err(format!(
                "{} returned status {code}, expected {}",
                stringify!($e),
                $expected
            ));
        }
    }};
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Distinct test values.
fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| seed + i as f32 * 0.25 - 1.0).collect()
}

fn same(what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len()
        || got
            .iter()
            .zip(want)
            .any(|(a, b)| a.to_bits() != b.to_bits())
    {
        return Err(format!("{what}: got {got:?}, want {want:?}"));
    }
    Ok(())
}

/// A device buffer of `n` f32 holding `v`.
fn dev(v: &[f32]) -> Result<DevBuf, String> {
    DevBuf::from_host(&bytes(v))
}

fn sync() -> Result<(), String> {
    ck!(cudaDeviceSynchronize());
    Ok(())
}

pub fn blas_more(_args: &[String]) -> Result<(), String> {
    copies()?;
    let mut h: cublasHandle_t = std::ptr::null_mut();
    st!(cublasCreate_v2(&mut h));
    let stream = crate::support::stream()?;
    st!(cublasSetStream_v2(h, stream));
    level1(h)?;
    geam(h)?;
    st!(cublasDestroy_v2(h));
    transform(stream)?;
    Ok(())
}

/// The 16 helper copies: a vector with strides 2 (host) and 3 (device), a 3x4 matrix with
/// leading dimensions 5 (host), 4 (device) and 6 (host again); the device gaps keep their
/// sentinel; refused calls.
fn copies() -> Result<(), String> {
    let stream = crate::support::stream()?;
    let sentinel = -7.0f32;
    for wide in [false, true] {
        for asynchronous in [false, true] {
            let tag = format!("wide={wide} async={asynchronous}");
            // Vector: host x[2i] -> device d[3i] -> host y[i].
            let x = values(8, 1.0);
            let d = dev(&[sentinel; 12])?;
            let mut y = vec![0f32; 4];
            let (xp, yp) = (x.as_ptr().cast::<c_void>(), y.as_mut_ptr().cast::<c_void>());
            match (wide, asynchronous) {
                (false, false) => {
                    st!(cublasSetVector(4, 4, xp, 2, d.ptr, 3));
                    st!(cublasGetVector(4, 4, d.ptr, 3, yp, 1));
                }
                (true, false) => {
                    st!(cublasSetVector_64(4, 4, xp, 2, d.ptr, 3));
                    st!(cublasGetVector_64(4, 4, d.ptr, 3, yp, 1));
                }
                (false, true) => {
                    st!(cublasSetVectorAsync(4, 4, xp, 2, d.ptr, 3, stream));
                    st!(cublasGetVectorAsync(4, 4, d.ptr, 3, yp, 1, stream));
                    ck!(cudaStreamSynchronize(stream));
                }
                (true, true) => {
                    st!(cublasSetVectorAsync_64(4, 4, xp, 2, d.ptr, 3, stream));
                    st!(cublasGetVectorAsync_64(4, 4, d.ptr, 3, yp, 1, stream));
                    ck!(cudaStreamSynchronize(stream));
                }
            }
            same(&format!("vector {tag}"), &y, &[x[0], x[2], x[4], x[6]])?;
            let on_dev = floats(&d.read()?);
            let mut want = vec![sentinel; 12];
            for i in 0..4 {
                want[3 * i] = x[2 * i];
            }
            same(&format!("vector on the device {tag}"), &on_dev, &want)?;

            // Matrix: 3x4, host lda 5 -> device ldb 4 -> host ld 6.
            let a = values(5 * 4, 3.0);
            let d = dev(&[sentinel; 16])?;
            let mut b = vec![0f32; 6 * 4];
            let (ap, bp) = (a.as_ptr().cast::<c_void>(), b.as_mut_ptr().cast::<c_void>());
            match (wide, asynchronous) {
                (false, false) => {
                    st!(cublasSetMatrix(3, 4, 4, ap, 5, d.ptr, 4));
                    st!(cublasGetMatrix(3, 4, 4, d.ptr, 4, bp, 6));
                }
                (true, false) => {
                    st!(cublasSetMatrix_64(3, 4, 4, ap, 5, d.ptr, 4));
                    st!(cublasGetMatrix_64(3, 4, 4, d.ptr, 4, bp, 6));
                }
                (false, true) => {
                    st!(cublasSetMatrixAsync(3, 4, 4, ap, 5, d.ptr, 4, stream));
                    st!(cublasGetMatrixAsync(3, 4, 4, d.ptr, 4, bp, 6, stream));
                    ck!(cudaStreamSynchronize(stream));
                }
                (true, true) => {
                    st!(cublasSetMatrixAsync_64(3, 4, 4, ap, 5, d.ptr, 4, stream));
                    st!(cublasGetMatrixAsync_64(3, 4, 4, d.ptr, 4, bp, 6, stream));
                    ck!(cudaStreamSynchronize(stream));
                }
            }
            let (mut want_dev, mut want_back) = (vec![sentinel; 16], vec![0f32; 24]);
            for j in 0..4 {
                for i in 0..3 {
                    want_dev[i + 4 * j] = a[i + 5 * j];
                    want_back[i + 6 * j] = a[i + 5 * j];
                }
            }
            same(
                &format!("matrix on the device {tag}"),
                &floats(&d.read()?),
                &want_dev,
            )?;
            same(&format!("matrix back {tag}"), &b, &want_back)?;
        }
    }
    // Refused: documented invalid values, and a copy the runtime refuses.
    let host = [0f32; 16];
    let mut out = [0f32; 16];
    let (hp, op) = (
        host.as_ptr().cast::<c_void>(),
        out.as_mut_ptr().cast::<c_void>(),
    );
    let d = dev(&[0.0; 16])?;
    st!(
        cublasSetVector(4, 4, hp, 0, d.ptr, 1),
        CUBLAS_STATUS_INVALID_VALUE
    );
    st!(
        cublasGetVector(4, 0, d.ptr, 1, op, 1),
        CUBLAS_STATUS_INVALID_VALUE
    );
    st!(
        cublasSetVector(-1, 4, hp, 1, d.ptr, 1),
        CUBLAS_STATUS_INVALID_VALUE
    );
    st!(
        cublasSetMatrix(4, 2, 4, hp, 3, d.ptr, 4),
        CUBLAS_STATUS_INVALID_VALUE
    );
    st!(
        cublasGetMatrix_64(4, 2, 4, d.ptr, 4, op, 3),
        CUBLAS_STATUS_INVALID_VALUE
    );
    st!(
        cublasSetMatrixAsync(2, -1, 4, hp, 2, d.ptr, 2, stream),
        CUBLAS_STATUS_INVALID_VALUE
    );
    // A host pointer where device memory is expected: the runtime refuses the copy.
    st!(
        cublasSetVector(4, 4, hp, 1, op, 1),
        CUBLAS_STATUS_MAPPING_ERROR
    );
    // That failure was cuBLAS's own: the application's last error is untouched.
    // SAFETY: a plain query.
    let last = unsafe { cudaGetLastError() };
    if last != cudaSuccess {
        return Err(format!("a refused helper copy left last error {last}"));
    }
    ck!(cudaStreamDestroy(stream));
    Ok(())
}

fn level1(h: cublasHandle_t) -> Result<(), String> {
    // axpy, host alpha: x stride 2, y stride 1; then x stride -1 (read backwards).
    let x = values(10, 0.5);
    let y0 = values(5, 2.0);
    let (dx, dy) = (dev(&x)?, dev(&y0)?);
    let alpha = 2.5f32;
    st!(cublasSaxpy_v2(
        h,
        5,
        &alpha,
        dx.ptr.cast(),
        2,
        dy.ptr.cast(),
        1
    ));
    sync()?;
    let want: Vec<f32> = (0..5).map(|i| alpha.mul_add(x[2 * i], y0[i])).collect();
    same("saxpy", &floats(&dy.read()?), &want)?;
    let dy = dev(&y0)?;
    st!(cublasSaxpy_v2(
        h,
        5,
        &alpha,
        dx.ptr.cast(),
        -1,
        dy.ptr.cast(),
        1
    ));
    sync()?;
    let want: Vec<f32> = (0..5).map(|i| alpha.mul_add(x[4 - i], y0[i])).collect();
    same("saxpy incx -1", &floats(&dy.read()?), &want)?;

    // dot, host result: returns with the result written.
    let y = values(5, -0.75);
    let dy = dev(&y)?;
    let mut r = 0f32;
    st!(cublasSdot_v2(
        h,
        5,
        dx.ptr.cast(),
        2,
        dy.ptr.cast(),
        1,
        &mut r
    ));
    let want = (0..5).fold(0f32, |acc, i| x[2 * i].mul_add(y[i], acc));
    same("sdot (host result)", &[r], &[want])?;
    // dot, device result and scal, device alpha.
    st!(cublasSetPointerMode_v2(h, CUBLAS_POINTER_MODE_DEVICE));
    let dr = dev(&[0.0])?;
    st!(cublasSdot_v2(
        h,
        5,
        dx.ptr.cast(),
        2,
        dy.ptr.cast(),
        1,
        dr.ptr.cast()
    ));
    let da = dev(&[-3.0])?;
    st!(cublasSscal_v2(h, 5, da.ptr.cast(), dy.ptr.cast(), 1));
    sync()?;
    same("sdot (device result)", &floats(&dr.read()?), &[want])?;
    let scaled: Vec<f32> = y.iter().map(|v| -3.0 * v).collect();
    same("sscal (device alpha)", &floats(&dy.read()?), &scaled)?;
    st!(cublasSetPointerMode_v2(h, CUBLAS_POINTER_MODE_HOST));

    // Refused: a bad handle, a null alpha or result.
    st!(
        cublasSaxpy_v2(
            std::ptr::null_mut(),
            5,
            &alpha,
            dx.ptr.cast(),
            1,
            dy.ptr.cast(),
            1
        ),
        CUBLAS_STATUS_NOT_INITIALIZED
    );
    st!(
        cublasSscal_v2(h, 5, std::ptr::null(), dy.ptr.cast(), 1),
        CUBLAS_STATUS_INVALID_VALUE
    );
    st!(
        cublasSdot_v2(
            h,
            5,
            dx.ptr.cast(),
            1,
            dy.ptr.cast(),
            1,
            std::ptr::null_mut()
        ),
        CUBLAS_STATUS_INVALID_VALUE
    );
    Ok(())
}

/// geam on C 3x4: A 3x4 (N, lda 5), B 4x3 (T, ldb 4), C ldc 3; a transpose with B null; in
/// place C == A; a refused in-place call.
fn geam(h: cublasHandle_t) -> Result<(), String> {
    let (m, n) = (3usize, 4usize);
    let a = values(5 * n, 1.5);
    let b = values(4 * m, -2.0);
    let (da, db, dc) = (dev(&a)?, dev(&b)?, dev(&[0.0; 12])?);
    let (alpha, beta) = (1.5f32, -2.0f32);
    st!(cublasSgeam(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_T,
        3,
        4,
        &alpha,
        da.ptr.cast(),
        5,
        &beta,
        db.ptr.cast(),
        4,
        dc.ptr.cast(),
        3
    ));
    sync()?;
    let mut want = vec![0f32; 12];
    for j in 0..n {
        for i in 0..m {
            want[i + 3 * j] = alpha.mul_add(a[i + 5 * j], beta * b[j + 4 * i]);
        }
    }
    same("sgeam N,T", &floats(&dc.read()?), &want)?;

    // Transpose: C (4x3, ldc 4) = A^T, B null with beta 0.
    let (one, zero) = (1f32, 0f32);
    let dt = dev(&[0.0; 12])?;
    st!(cublasSgeam(
        h,
        CUBLAS_OP_T,
        CUBLAS_OP_N,
        4,
        3,
        &one,
        da.ptr.cast(),
        5,
        &zero,
        std::ptr::null(),
        4,
        dt.ptr.cast(),
        4
    ));
    sync()?;
    let mut want = vec![0f32; 12];
    for j in 0..m {
        for i in 0..n {
            want[i + 4 * j] = a[j + 5 * i];
        }
    }
    same("sgeam transpose", &floats(&dt.read()?), &want)?;

    // In place: A = alpha * A + beta * B^T (C == A, lda == ldc, transa N).
    st!(cublasSgeam(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_T,
        3,
        4,
        &alpha,
        da.ptr.cast(),
        5,
        &beta,
        db.ptr.cast(),
        4,
        da.ptr.cast(),
        5
    ));
    sync()?;
    let mut want = a.clone();
    for j in 0..n {
        for i in 0..m {
            want[i + 5 * j] = alpha.mul_add(a[i + 5 * j], beta * b[j + 4 * i]);
        }
    }
    same("sgeam in place", &floats(&da.read()?), &want)?;
    // C == B with transb T is refused.
    st!(
        cublasSgeam(
            h,
            CUBLAS_OP_N,
            CUBLAS_OP_T,
            3,
            3,
            &alpha,
            da.ptr.cast(),
            5,
            &beta,
            db.ptr.cast(),
            4,
            db.ptr.cast(),
            4
        ),
        CUBLAS_STATUS_INVALID_VALUE
    );
    st!(
        cublasSgeam(
            h,
            CUBLAS_OP_N,
            CUBLAS_OP_N,
            3,
            4,
            &alpha,
            da.ptr.cast(),
            2,
            &beta,
            db.ptr.cast(),
            4,
            dc.ptr.cast(),
            3
        ),
        CUBLAS_STATUS_INVALID_VALUE
    );
    Ok(())
}

fn layout(
    t: cudaDataType,
    rows: u64,
    cols: u64,
    ld: i64,
) -> Result<cublasLtMatrixLayout_t, String> {
    let mut l: cublasLtMatrixLayout_t = std::ptr::null_mut();
    st!(cublasLtMatrixLayoutCreate(&mut l, t, rows, cols, ld));
    Ok(l)
}

fn set(d: cublasLtMatrixTransformDesc_t, attr: u32, v: i32) -> Result<(), String> {
    st!(cublasLtMatrixTransformDescSetAttribute(
        d,
        attr,
        (&v as *const i32).cast(),
        4
    ));
    Ok(())
}

/// `cublasLtMatrixTransform`: F32 with A N and B T, BF16 as a transpose (B null, beta 0),
/// the descriptor's attributes and a refused batch.
fn transform(stream: cudaStream_t) -> Result<(), String> {
    let mut lt: cublasLtHandle_t = std::ptr::null_mut();
    st!(cublasLtCreate(&mut lt));
    let mut d: cublasLtMatrixTransformDesc_t = std::ptr::null_mut();
    st!(cublasLtMatrixTransformDescCreate(&mut d, CUDA_R_32F));
    let (mut v, mut written) = (-1i32, 0usize);
    st!(cublasLtMatrixTransformDescGetAttribute(
        d,
        CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA,
        (&mut v as *mut i32).cast(),
        4,
        &mut written
    ));
    if (v, written) != (CUBLAS_OP_N as i32, 4) {
        return Err(format!("TRANSA default: {v} ({written} bytes)"));
    }
    st!(
        cublasLtMatrixTransformDescSetAttribute(
            d,
            CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSB,
            (&v as *const i32).cast(),
            8
        ),
        CUBLAS_STATUS_INVALID_VALUE
    );
    set(d, CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSB, CUBLAS_OP_T as i32)?;

    // F32: C (3x4, ld 3) = alpha * A (3x4, ld 5) + beta * B^T (B 4x3, ld 4).
    let (m, n) = (3usize, 4usize);
    let a = values(5 * n, 0.75);
    let b = values(4 * m, -1.25);
    let (da, db, dc) = (dev(&a)?, dev(&b)?, dev(&[0.0; 12])?);
    let (al, ad) = (layout(CUDA_R_32F, 3, 4, 5)?, layout(CUDA_R_32F, 4, 3, 4)?);
    let cl = layout(CUDA_R_32F, 3, 4, 3)?;
    let (alpha, beta) = (0.5f32, 3.0f32);
    st!(cublasLtMatrixTransform(
        lt,
        d,
        (&alpha as *const f32).cast(),
        da.ptr,
        al,
        (&beta as *const f32).cast(),
        db.ptr,
        ad,
        dc.ptr,
        cl,
        stream
    ));
    ck!(cudaStreamSynchronize(stream));
    let mut want = vec![0f32; 12];
    for j in 0..n {
        for i in 0..m {
            want[i + 3 * j] = alpha.mul_add(a[i + 5 * j], beta * b[j + 4 * i]);
        }
    }
    same("transform f32", &floats(&dc.read()?), &want)?;

    // BF16: C (4x3, ld 4) = 2 * A^T, A 3x4 (ld 3); B absent.
    set(d, CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA, CUBLAS_OP_T as i32)?;
    set(d, CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSB, CUBLAS_OP_N as i32)?;
    let a16: Vec<half::bf16> = values(12, 0.3)
        .iter()
        .map(|v| half::bf16::from_f32(*v * 1.1))
        .collect();
    let a16_bytes: Vec<u8> = a16.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let da16 = DevBuf::from_host(&a16_bytes)?;
    let dc16 = DevBuf::from_host(&[0u8; 24])?;
    let (al16, cl16) = (layout(CUDA_R_16BF, 3, 4, 3)?, layout(CUDA_R_16BF, 4, 3, 4)?);
    let (two, zero) = (2f32, 0f32);
    st!(cublasLtMatrixTransform(
        lt,
        d,
        (&two as *const f32).cast(),
        da16.ptr,
        al16,
        (&zero as *const f32).cast(),
        std::ptr::null(),
        std::ptr::null_mut(),
        dc16.ptr,
        cl16,
        stream
    ));
    ck!(cudaStreamSynchronize(stream));
    let got: Vec<f32> = dc16
        .read()?
        .chunks_exact(2)
        .map(|c| half::bf16::from_ne_bytes([c[0], c[1]]).to_f32())
        .collect();
    let mut want = vec![0f32; 12];
    for j in 0..3 {
        for i in 0..4 {
            want[i + 4 * j] = half::bf16::from_f32(2.0 * a16[j + 3 * i].to_f32()).to_f32();
        }
    }
    same("transform bf16 transpose", &got, &want)?;

    // Refused: a batch of 2.
    let two_batches: i32 = 2;
    st!(cublasLtMatrixLayoutSetAttribute(
        cl16,
        CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
        (&two_batches as *const i32).cast(),
        4
    ));
    st!(
        cublasLtMatrixTransform(
            lt,
            d,
            (&two as *const f32).cast(),
            da16.ptr,
            al16,
            (&zero as *const f32).cast(),
            std::ptr::null(),
            std::ptr::null_mut(),
            dc16.ptr,
            cl16,
            stream
        ),
        CUBLAS_STATUS_NOT_SUPPORTED
    );
    for l in [al, ad, cl, al16, cl16] {
        st!(cublasLtMatrixLayoutDestroy(l));
    }
    st!(cublasLtMatrixTransformDescDestroy(d));
    st!(cublasLtDestroy(lt));
    Ok(())
}
