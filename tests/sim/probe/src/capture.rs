//! `traced`: programs for the capture tests (tests/integration/tests/intercept_*.rs). Each
//! scenario drives one family of hooked calls in a fixed order with data the tests can predict
//! or recompute, checks what it can see itself (results, return codes), and prints one line the
//! test can compare between a traced and an untraced run. They know nothing of ttrace, except
//! `steps api`, which calls `ttrace_step()` when the global scope has it.
//!
//! * `memcpy`: every copy spelling; the bytes are [`pattern`]s (the tests regenerate them).
//! * `memset`: every memset spelling, results checked, then a GEMM reading a zeroed buffer
//!   (memset.rs).
//! * `gemm`: cuBLAS (S/H/Ex, strided batches, device scalars, the pointer-array batch, TF32
//!   math mode) and
//!   cuBLASLt (bias, FP8 scales and amax, GELU aux, batched).
//! * `gemm-more`: the typed strided batches of f64 and f16, `cublasSgemmEx`, the `_64` entry
//!   points, a `cublasSgemmBatched` pointer-array batch (a gap for the tracer), and a
//!   `cublasSgemv_v2` with a strided input.
//! * `gemm-ptrarrays`: pointer-array batches with host-built arrays, and arrays rewritten on
//!   the device, by a late pinned source, or built on the device (ptrarrays.rs).
//! * `gemm-blockscaled [corrupt]`: an MXFP8 cuBLASLt matmul with block scales, one of them
//!   rewritten on the device with `corrupt` (blockscaled.rs).
//! * `uploads [N] [BYTES]`: timed small host-to-device copies (scripts/bench-uploads.sh).
//! * `gemv-strided`: a `cublasSgemv_v2` (transposed) and a `cublasDgemv_v2` whose output is
//!   strided (`incy` 2 and 3), results checked against f64 (a gap for the tracer).
//! * `nccl` (under simrun): every collective, in place and not, inside groups, send/recv, a
//!   split communicator.
//! * `nccl-extra` (under simrun, 3 ranks): `ncclCommShrink` without the last rank and an
//!   all-reduce on it; PreMulSum all-reduces with a host factor (0.5) and a device factor
//!   (0.25); a group closed by `ncclGroupSimulateEnd` (runs nothing) then a real group.
//! * `nccl-threads` (one process): a thread per device (4) joins one communicator with
//!   `ncclCommInitRank` and all-reduces on it.
//! * `graph`: a copy and a GEMM captured into a CUDA graph, replayed twice, results checked.
//! * `graph-step [N]` (under simrun): one training-like step captured into a graph (an H2D
//!   copy of the input, a GEMM, an in-place all-reduce of its output) and replayed N times
//!   (default 3) with new input bytes each time; each replay's result is checked.
//! * `graph-update`: a copy and a GEMM captured twice (two graphs, same topology); an instance
//!   of the first is launched, updated to the second (`cudaGraphExecUpdate`), launched again.
//! * `errors`: calls that fail; prints their return codes.
//! * `steps auto|nvtx|api`: three training steps of two micro-batches each.
//! * `threads`: four threads copying concurrently ([`thread_copy`] says what).
//! * `fork`: a copy, `fork()` (the child copies too, which the runtime refuses after
//!   initialisation, and exits through `exit`), another copy in the parent.

use core::ffi::{c_char, c_int, c_void};

use cuda_dyn::abi::cublas::*;
use cuda_dyn::abi::cublaslt::*;
use cuda_dyn::abi::cudart::*;
use cuda_dyn::abi::library_types::*;
use cuda_dyn::abi::nccl::*;
use cuda_dyn::cublas::*;
use cuda_dyn::cublaslt::*;
use cuda_dyn::cudart::*;
use cuda_dyn::nccl::*;
use cuda_dyn::nvtx::*;
use sim_kernels::dtype::DType;
use sim_kernels::gemm::{gemm as sim_gemm, Buffers, CInput, Compute, Gemm};

use crate::support::{ck, job, nc, stream, world, DevBuf};

/// Fails unless the cuBLAS(Lt) call succeeded.
macro_rules! bl {
    ($e:expr) => {{
        // SAFETY: a cuBLAS call with arguments prepared by the probe.
        let code = unsafe { $e };
        if code != CUBLAS_STATUS_SUCCESS {
            return Err(format!("{} returned status {code}", stringify!($e)));
        }
    }};
}

extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn fork() -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
}

/// The bytes of copy number `salt`: `len` bytes the tests regenerate.
pub fn pattern(salt: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            ((i as u32).wrapping_mul(31).wrapping_add(salt as u32 * 7) ^ (i as u32 >> 8)) as u8
        })
        .collect()
}

/// Entry point: `traced SCENARIO [ARGS]`.
pub fn traced(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("memcpy") => memcpy(),
        Some("memcpy-then-overwrite") => memcpy_then_overwrite(),
        Some("memcpy3d") => memcpy3d(),
        Some("memcpy-array") => memcpy_array(),
        Some("memcpy-symbol") => memcpy_symbol(),
        Some("memset") => crate::memset::run(),
        Some("memset-graph") => crate::memset::graph(),
        Some("gemm") => gemms(),
        Some("gemm-more") => more_gemms(),
        Some("gemm-ptrarrays") => crate::ptrarrays::run(),
        Some("gemm-blockscaled") => crate::blockscaled::run(args),
        Some("uploads") => crate::ptrarrays::uploads(args),
        Some("gemv-strided") => gemv_strided(),
        Some("nccl") => nccl(),
        Some("nccl-extra") => nccl_extra(),
        Some("nccl-threads") => nccl_threads(),
        Some("graph") => graph(),
        Some("graph-step") => graph_step(args.get(1).map_or(Ok(3), |n| {
            n.parse().map_err(|_| format!("graph-step: bad replay count {n}"))
        })?),
        Some("graph-update") => graph_update(),
        Some("errors") => errors(),
        Some("steps") if args.get(1).is_some_and(|a| a == "backward") => steps_backward(),
        Some("steps") => steps(args.get(1).map_or("auto", String::as_str)),
        Some("fork") => forked(),
        Some("threads") => threads(),
        _ => Err(
            "usage: traced memcpy|memcpy-then-overwrite|memcpy3d|memcpy-array|memcpy-symbol|memset|memset-graph|gemm|gemm-more|gemm-ptrarrays|gemm-blockscaled [corrupt]|uploads [N] [BYTES]|gemv-strided|nccl|graph|graph-step [N]|graph-update|errors|steps [auto|nvtx|api|backward]|fork|threads"
                .into(),
        ),
    }
}

/// A host function enqueued between copies: its launch is recorded by name.
unsafe extern "C" fn traced_marker(_: *mut c_void) {}

pub(crate) fn pinned(data: &[u8]) -> Result<*mut u8, String> {
    let mut p: *mut c_void = std::ptr::null_mut();
    ck!(cudaMallocHost(&mut p, data.len().max(1)));
    // SAFETY: a fresh pinned allocation of `data.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.cast::<u8>(), data.len()) };
    Ok(p.cast())
}

fn memcpy() -> Result<(), String> {
    let s = stream()?;
    let d1 = DevBuf::new(4096)?;
    let d2 = DevBuf::new(4096)?;
    let d3 = DevBuf::new(64 * 10)?;
    let d4 = DevBuf::new(4096)?;
    let p1 = pattern(1, 4096);
    // 1: pageable host to device.
    ck!(cudaMemcpyAsync(
        d1.ptr,
        p1.as_ptr().cast(),
        4096,
        cudaMemcpyHostToDevice,
        s
    ));
    // Two host functions: named in the next op's kernels_before.
    ck!(cudaLaunchHostFunc(
        s,
        Some(traced_marker),
        std::ptr::null_mut()
    ));
    ck!(cudaLaunchHostFunc(
        s,
        Some(traced_marker),
        std::ptr::null_mut()
    ));
    // 2: device to host.
    let mut back = vec![0u8; 4096];
    ck!(cudaMemcpyAsync(
        back.as_mut_ptr().cast(),
        d1.ptr,
        4096,
        cudaMemcpyDeviceToHost,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    if back != p1 {
        return Err("device-to-host copy returned other bytes".into());
    }
    // 3: cudaMemcpyDefault from pinned memory (resolved to host-to-device).
    let p2 = pinned(&pattern(2, 1000))?;
    ck!(cudaMemcpy(d2.ptr, p2.cast(), 1000, cudaMemcpyDefault));
    // 4: pitched 40 x 10 from a 48-byte pitch into a 64-byte pitch.
    let p3 = pattern(3, 48 * 10);
    ck!(cudaMemcpy2DAsync(
        d3.ptr,
        64,
        p3.as_ptr().cast(),
        48,
        40,
        10,
        cudaMemcpyHostToDevice,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    // 5: device to device on the per-thread default stream.
    ck!(cudaMemcpyAsync_ptsz(
        d4.ptr,
        d1.ptr,
        4096,
        cudaMemcpyDeviceToDevice,
        std::ptr::null_mut()
    ));
    ck!(cudaStreamSynchronize(cudaStreamPerThread));
    // 6: peer copy to device 1.
    ck!(cudaSetDevice(1));
    let d5 = DevBuf::new(4096)?;
    ck!(cudaSetDevice(0));
    ck!(cudaMemcpyPeer(d5.ptr, 1, d1.ptr, 0, 4096));
    // Host to host: not a device snapshot.
    let mut hh = vec![0u8; 64];
    ck!(cudaMemcpy(
        hh.as_mut_ptr().cast(),
        p1.as_ptr().cast(),
        64,
        cudaMemcpyHostToHost
    ));
    ck!(cudaDeviceSynchronize());
    ck!(cudaFreeHost(p2.cast()));
    println!("traced memcpy OK");
    Ok(())
}

/// Deterministic values in [-1, 1).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
}

/// `len` elements of `t`, random (NaN in padding is the tests' business, not needed here).
pub(crate) fn values(t: DType, len: usize, rng: &mut Rng) -> Vec<u8> {
    let mut v = vec![0u8; len * t.size()];
    for i in 0..len {
        t.store(&mut v, i, rng.next() * 2.0);
    }
    v
}

pub(crate) fn up(data: &[u8]) -> Result<DevBuf, String> {
    // Uploads without a hooked copy would need a kernel; a plain copy is one more record,
    // which the tests expect (host-to-device records before each GEMM).
    DevBuf::from_host(data)
}

fn scalar_dev(v: f32) -> Result<DevBuf, String> {
    up(&v.to_le_bytes())
}

fn gemms() -> Result<(), String> {
    let s = stream()?;
    let mut h: cublasHandle_t = std::ptr::null_mut();
    bl!(cublasCreate_v2(&mut h));
    bl!(cublasSetStream_v2(h, s));
    let mut rng = Rng(7);

    // 1. Sgemm, padded leading dimensions, beta != 0 in place.
    let (m, n, k) = (5, 4, 3);
    let a = up(&values(DType::F32, 8 * k, &mut rng))?;
    let b = up(&values(DType::F32, 3 * n, &mut rng))?;
    let c = up(&values(DType::F32, 6 * n, &mut rng))?;
    let (alpha, beta) = (1.5f32, 0.5f32);
    bl!(cublasSgemm_v2(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        m as c_int,
        n as c_int,
        k as c_int,
        &alpha,
        a.ptr.cast(),
        8,
        b.ptr.cast(),
        3,
        &beta,
        c.ptr.cast(),
        6
    ));

    // 2. GemmEx bf16 x bf16 -> f32, TN, beta = 0.
    let (m, n, k) = (16usize, 8usize, 32usize);
    let a = up(&values(DType::BF16, k * m, &mut rng))?;
    let b = up(&values(DType::BF16, k * n, &mut rng))?;
    let c2 = DevBuf::new(m * n * 4)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    bl!(cublasGemmEx(
        h,
        CUBLAS_OP_T,
        CUBLAS_OP_N,
        m as c_int,
        n as c_int,
        k as c_int,
        (&alpha as *const f32).cast(),
        a.ptr,
        CUDA_R_16BF,
        k as c_int,
        b.ptr,
        CUDA_R_16BF,
        k as c_int,
        (&beta as *const f32).cast(),
        c2.ptr,
        CUDA_R_32F,
        m as c_int,
        CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT_TENSOR_OP
    ));

    // 3. Hgemm, beta = 1.
    let a = up(&values(DType::F16, 64, &mut rng))?;
    let b = up(&values(DType::F16, 64, &mut rng))?;
    let c3 = up(&values(DType::F16, 64, &mut rng))?;
    let one = __half { __x: 0x3c00 };
    bl!(cublasHgemm(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_T,
        8,
        8,
        8,
        &one,
        a.ptr.cast(),
        8,
        b.ptr.cast(),
        8,
        &one,
        c3.ptr.cast(),
        8
    ));

    // 4. Strided batch, bf16 in and out, padded strides, beta = 0.25.
    let (m, n, k, batch) = (6usize, 5usize, 7usize, 3usize);
    let (sa, sb, sc) = (m * k + 3, k * n + 5, m * n + 2);
    let a = up(&values(DType::BF16, sa * batch, &mut rng))?;
    let b = up(&values(DType::BF16, sb * batch, &mut rng))?;
    let c4 = up(&values(DType::BF16, sc * batch, &mut rng))?;
    let (alpha, beta) = (1.0f32, 0.25f32);
    bl!(cublasGemmStridedBatchedEx(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        m as c_int,
        n as c_int,
        k as c_int,
        (&alpha as *const f32).cast(),
        a.ptr,
        CUDA_R_16BF,
        m as c_int,
        sa as i64,
        b.ptr,
        CUDA_R_16BF,
        k as c_int,
        sb as i64,
        (&beta as *const f32).cast(),
        c4.ptr,
        CUDA_R_16BF,
        m as c_int,
        sc as i64,
        batch as c_int,
        CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT
    ));

    // 5. SgemmStridedBatched, contiguous.
    let a = up(&values(DType::F32, 4 * 4 * 2, &mut rng))?;
    let b = up(&values(DType::F32, 4 * 4 * 2, &mut rng))?;
    let c5 = DevBuf::new(4 * 4 * 2 * 4)?;
    let (alpha, beta) = (2.0f32, 0.0f32);
    bl!(cublasSgemmStridedBatched(
        h,
        CUBLAS_OP_T,
        CUBLAS_OP_T,
        4,
        4,
        4,
        &alpha,
        a.ptr.cast(),
        4,
        16,
        b.ptr.cast(),
        4,
        16,
        &beta,
        c5.ptr.cast(),
        4,
        16,
        2
    ));

    // 6. Pointer-array batch: the tracer records a gap.
    let a6 = up(&values(DType::F32, 16, &mut rng))?;
    let c6 = DevBuf::new(16 * 4)?;
    let ptrs = up(&[(a6.ptr as u64).to_le_bytes(), (c6.ptr as u64).to_le_bytes()].concat())?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    bl!(cublasGemmBatchedEx(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        4,
        4,
        4,
        (&alpha as *const f32).cast(),
        ptrs.ptr.cast(),
        CUDA_R_32F,
        4,
        ptrs.ptr.cast(),
        CUDA_R_32F,
        4,
        (&beta as *const f32).cast(),
        ptrs.at(8).cast(),
        CUDA_R_32F,
        4,
        1,
        CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT
    ));

    // 7. Device pointer mode: alpha and beta in device memory, beta = 1.
    let a = up(&values(DType::F32, 9, &mut rng))?;
    let b = up(&values(DType::F32, 9, &mut rng))?;
    let c7 = up(&values(DType::F32, 9, &mut rng))?;
    let (da, db) = (scalar_dev(0.75)?, scalar_dev(1.0)?);
    bl!(cublasSetPointerMode_v2(h, CUBLAS_POINTER_MODE_DEVICE));
    bl!(cublasGemmEx(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        3,
        3,
        3,
        da.ptr,
        a.ptr,
        CUDA_R_32F,
        3,
        b.ptr,
        CUDA_R_32F,
        3,
        db.ptr,
        c7.ptr,
        CUDA_R_32F,
        3,
        CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT
    ));
    bl!(cublasSetPointerMode_v2(h, CUBLAS_POINTER_MODE_HOST));

    // 8. Sgemm under the TF32 math mode (what PyTorch's allow_tf32 sets).
    let a = up(&values(DType::F32, 16 * 32, &mut rng))?;
    let b = up(&values(DType::F32, 32 * 8, &mut rng))?;
    let c8 = DevBuf::new(16 * 8 * 4)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    bl!(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH));
    bl!(cublasSgemm_v2(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        16,
        8,
        32,
        &alpha,
        a.ptr.cast(),
        16,
        b.ptr.cast(),
        32,
        &beta,
        c8.ptr.cast(),
        16
    ));
    bl!(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    ck!(cudaStreamSynchronize(s));
    bl!(cublasDestroy_v2(h));

    lt_cases(s, &mut rng)?;
    ck!(cudaStreamSynchronize(s));
    println!("traced gemm OK");
    Ok(())
}

pub(crate) fn desc(compute: u32, scale: u32) -> Result<cublasLtMatmulDesc_t, String> {
    let mut d: cublasLtMatmulDesc_t = std::ptr::null_mut();
    bl!(cublasLtMatmulDescCreate(&mut d, compute, scale));
    Ok(d)
}

pub(crate) fn set<T: Copy>(d: cublasLtMatmulDesc_t, attr: u32, v: T) -> Result<(), String> {
    bl!(cublasLtMatmulDescSetAttribute(
        d,
        attr,
        (&v as *const T).cast(),
        std::mem::size_of::<T>()
    ));
    Ok(())
}

pub(crate) fn layout(
    t: u32,
    rows: u64,
    cols: u64,
    ld: i64,
    batch: i32,
    stride: i64,
) -> Result<cublasLtMatrixLayout_t, String> {
    let mut l: cublasLtMatrixLayout_t = std::ptr::null_mut();
    bl!(cublasLtMatrixLayoutCreate(&mut l, t, rows, cols, ld));
    if batch > 1 {
        bl!(cublasLtMatrixLayoutSetAttribute(
            l,
            CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            (&batch as *const i32).cast(),
            4
        ));
        bl!(cublasLtMatrixLayoutSetAttribute(
            l,
            CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            (&stride as *const i64).cast(),
            8
        ));
    }
    Ok(l)
}

fn lt_cases(s: cudaStream_t, rng: &mut Rng) -> Result<(), String> {
    let mut lt: cublasLtHandle_t = std::ptr::null_mut();
    bl!(cublasLtCreate(&mut lt));

    // 8. bf16 TN with a bias epilogue, in place with beta = 1.
    let (m, n, k) = (16usize, 12usize, 24usize);
    let a = up(&values(DType::BF16, k * m, rng))?;
    let b = up(&values(DType::BF16, k * n, rng))?;
    let cd = up(&values(DType::BF16, m * n, rng))?;
    let bias = up(&values(DType::BF16, m, rng))?;
    let d = desc(CUBLAS_COMPUTE_32F, CUDA_R_32F)?;
    set(d, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T as i32)?;
    set(d, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS)?;
    set(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.ptr as u64)?;
    let la = layout(CUDA_R_16BF, k as u64, m as u64, k as i64, 1, 0)?;
    let lb = layout(CUDA_R_16BF, k as u64, n as u64, k as i64, 1, 0)?;
    let lc = layout(CUDA_R_16BF, m as u64, n as u64, m as i64, 1, 0)?;
    let (alpha, beta) = (1.0f32, 1.0f32);
    bl!(cublasLtMatmul(
        lt,
        d,
        (&alpha as *const f32).cast(),
        a.ptr,
        la,
        b.ptr,
        lb,
        (&beta as *const f32).cast(),
        cd.ptr,
        lc,
        cd.ptr,
        lc,
        std::ptr::null(),
        std::ptr::null_mut(),
        0,
        s
    ));

    // 9. FP8 E4M3 TN, scales for A, B and D, amax of D; D in E4M3, C in BF16 (not read).
    let (m, n, k) = (16usize, 16usize, 32usize);
    let a = up(&values(DType::E4M3, k * m, rng))?;
    let b = up(&values(DType::E4M3, k * n, rng))?;
    let c = DevBuf::new(m * n * 2)?;
    let d8 = DevBuf::new(m * n)?;
    let (sa, sb, sd) = (scalar_dev(0.5)?, scalar_dev(2.0)?, scalar_dev(4.0)?);
    let amax = DevBuf::new(4)?;
    let d = desc(CUBLAS_COMPUTE_32F, CUDA_R_32F)?;
    set(d, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T as i32)?;
    set(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sa.ptr as u64)?;
    set(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sb.ptr as u64)?;
    set(d, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, sd.ptr as u64)?;
    set(d, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax.ptr as u64)?;
    set(d, CUBLASLT_MATMUL_DESC_FAST_ACCUM, 1i8)?;
    let la = layout(CUDA_R_8F_E4M3, k as u64, m as u64, k as i64, 1, 0)?;
    let lb = layout(CUDA_R_8F_E4M3, k as u64, n as u64, k as i64, 1, 0)?;
    let lc = layout(CUDA_R_16BF, m as u64, n as u64, m as i64, 1, 0)?;
    let ld = layout(CUDA_R_8F_E4M3, m as u64, n as u64, m as i64, 1, 0)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    bl!(cublasLtMatmul(
        lt,
        d,
        (&alpha as *const f32).cast(),
        a.ptr,
        la,
        b.ptr,
        lb,
        (&beta as *const f32).cast(),
        c.ptr,
        lc,
        d8.ptr,
        ld,
        std::ptr::null(),
        std::ptr::null_mut(),
        0,
        s
    ));

    // 10. f32, batch of 2 with padded strides, GELU with its aux output, C != D with beta.
    let (m, n, k, batch) = (8usize, 4usize, 5usize, 2i32);
    let (sa, sb, sc) = (m * k + 4, k * n + 1, m * n + 8);
    let a = up(&values(DType::F32, sa * 2, rng))?;
    let b = up(&values(DType::F32, sb * 2, rng))?;
    let c = up(&values(DType::F32, sc * 2, rng))?;
    let dd = DevBuf::new(sc * 2 * 4)?;
    let aux = DevBuf::new(sc * 2 * 4)?;
    let d = desc(CUBLAS_COMPUTE_32F, CUDA_R_32F)?;
    set(d, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX)?;
    set(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux.ptr as u64)?;
    set(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, m as i64)?;
    set(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, sc as i64)?;
    let la = layout(CUDA_R_32F, m as u64, k as u64, m as i64, batch, sa as i64)?;
    let lb = layout(CUDA_R_32F, k as u64, n as u64, k as i64, batch, sb as i64)?;
    let lc = layout(CUDA_R_32F, m as u64, n as u64, m as i64, batch, sc as i64)?;
    let (alpha, beta) = (0.5f32, 2.0f32);
    bl!(cublasLtMatmul(
        lt,
        d,
        (&alpha as *const f32).cast(),
        a.ptr,
        la,
        b.ptr,
        lb,
        (&beta as *const f32).cast(),
        c.ptr,
        lc,
        dd.ptr,
        lc,
        std::ptr::null(),
        std::ptr::null_mut(),
        0,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    bl!(cublasLtDestroy(lt));
    Ok(())
}

/// Rank-specific f32 values.
fn rank_f32(rank: usize, salt: usize, len: usize) -> Vec<u8> {
    let mut rng = Rng((rank * 1000 + salt) as u64 + 1);
    values(DType::F32, len, &mut rng)
}

/// A buffer of NaNs (what a snapshot taken too early would show).
fn garbage(bytes: usize) -> Result<DevBuf, String> {
    up(&vec![0xffu8; bytes])
}

fn nccl() -> Result<(), String> {
    let j = job()?;
    let (r, n) = (j.rank, j.n);
    let comm = world(&j)?;
    let s = stream()?;
    let f32t = ncclFloat32;

    // 1. All-reduce, out of place.
    let a1 = up(&rank_f32(r, 1, 1000))?;
    let b1 = garbage(4000)?;
    nc!(ncclAllReduce(a1.ptr, b1.ptr, 1000, f32t, ncclSum, comm, s));
    // 2. All-reduce in place, bf16.
    let mut rng = Rng(r as u64 + 50);
    let x2 = up(&values(DType::BF16, 512, &mut rng))?;
    nc!(ncclAllReduce(
        x2.ptr,
        x2.ptr,
        512,
        ncclBfloat16,
        ncclSum,
        comm,
        s
    ));
    // 3. Two all-reduces in a group (launched at the outermost end; nested start/end inside).
    let a3 = up(&rank_f32(r, 3, 300))?;
    let b3 = garbage(1200)?;
    let a4 = up(&rank_f32(r, 4, 200))?;
    let b4 = garbage(800)?;
    nc!(ncclGroupStart());
    nc!(ncclAllReduce(a3.ptr, b3.ptr, 300, f32t, ncclSum, comm, s));
    nc!(ncclGroupStart());
    nc!(ncclAllReduce(a4.ptr, b4.ptr, 200, f32t, ncclSum, comm, s));
    nc!(ncclGroupEnd());
    nc!(ncclGroupEnd());
    // 4. All-gather and reduce-scatter.
    let a5 = up(&rank_f32(r, 5, 100))?;
    let b5 = garbage(400 * n)?;
    nc!(ncclAllGather(a5.ptr, b5.ptr, 100, f32t, comm, s));
    let a6 = up(&rank_f32(r, 6, 100 * n))?;
    let b6 = garbage(400)?;
    nc!(ncclReduceScatter(
        a6.ptr, b6.ptr, 100, f32t, ncclSum, comm, s
    ));
    // 5. Broadcast from 0; in-place ncclBcast from the last rank.
    let a7 = up(&rank_f32(r, 7, 200))?;
    let b7 = garbage(800)?;
    nc!(ncclBroadcast(a7.ptr, b7.ptr, 200, f32t, 0, comm, s));
    let x8 = up(&rank_f32(r, 8, 64))?;
    nc!(ncclBcast(x8.ptr, 64, f32t, (n - 1) as c_int, comm, s));
    // 6. A ring of sends and receives in one group.
    let a9 = up(&rank_f32(r, 9, 300))?;
    let b9 = garbage(1200)?;
    nc!(ncclGroupStart());
    nc!(ncclSend(a9.ptr, 300, f32t, ((r + 1) % n) as c_int, comm, s));
    nc!(ncclRecv(
        b9.ptr,
        300,
        f32t,
        ((r + n - 1) % n) as c_int,
        comm,
        s
    ));
    nc!(ncclGroupEnd());
    // 7. A split communicator (everyone, reversed order) and an all-reduce on it.
    let mut sub: ncclComm_t = std::ptr::null_mut();
    nc!(ncclCommSplit(
        comm,
        0,
        (n - r) as c_int,
        &mut sub,
        std::ptr::null_mut()
    ));
    let a10 = up(&rank_f32(r, 10, 128))?;
    let b10 = garbage(512)?;
    nc!(ncclAllReduce(a10.ptr, b10.ptr, 128, f32t, ncclSum, sub, s));
    ck!(cudaStreamSynchronize(s));
    nc!(ncclCommDestroy(sub));
    nc!(ncclCommDestroy(comm));
    println!("rank {r} of {n}: traced nccl OK");
    Ok(())
}

fn more_gemms() -> Result<(), String> {
    let s = stream()?;
    let mut h: cublasHandle_t = std::ptr::null_mut();
    bl!(cublasCreate_v2(&mut h));
    bl!(cublasSetStream_v2(h, s));
    let mut rng = Rng(23);
    // 1. DgemmStridedBatched: padded lda and strides, beta != 0, batch 2.
    let (m, n, k, batch) = (4usize, 3usize, 5usize, 2usize);
    let (lda, sa, sb, sc) = (6, 6 * k + 1, k * n + 2, m * n);
    let a = up(&values(DType::F64, sa * batch, &mut rng))?;
    let b = up(&values(DType::F64, sb * batch, &mut rng))?;
    let c1 = up(&values(DType::F64, sc * batch, &mut rng))?;
    let (alpha, beta) = (1.25f64, -0.5f64);
    bl!(cublasDgemmStridedBatched(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        m as c_int,
        n as c_int,
        k as c_int,
        &alpha,
        a.ptr.cast(),
        lda as c_int,
        sa as i64,
        b.ptr.cast(),
        k as c_int,
        sb as i64,
        &beta,
        c1.ptr.cast(),
        m as c_int,
        sc as i64,
        batch as c_int
    ));
    // 2. HgemmStridedBatched, A transposed, beta = 0, batch 3.
    let a = up(&values(DType::F16, 4 * 4 * 3, &mut rng))?;
    let b = up(&values(DType::F16, 4 * 2 * 3, &mut rng))?;
    let c2 = DevBuf::new(4 * 2 * 3 * 2)?;
    let (alpha, beta) = (half::f16::from_f32(0.5), half::f16::from_f32(0.0));
    let (alpha, beta) = (
        __half {
            __x: alpha.to_bits(),
        },
        __half {
            __x: beta.to_bits(),
        },
    );
    bl!(cublasHgemmStridedBatched(
        h,
        CUBLAS_OP_T,
        CUBLAS_OP_N,
        4,
        2,
        4,
        &alpha,
        a.ptr.cast(),
        4,
        16,
        b.ptr.cast(),
        4,
        8,
        &beta,
        c2.ptr.cast(),
        4,
        8,
        3
    ));
    // 3. SgemmEx: bf16 operands, f32 output and scalars.
    let a = up(&values(DType::BF16, 5 * 6, &mut rng))?;
    let b = up(&values(DType::BF16, 6 * 3, &mut rng))?;
    let c3 = up(&values(DType::F32, 5 * 3, &mut rng))?;
    let (alpha, beta) = (1.0f32, 1.0f32);
    bl!(cublasSgemmEx(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        5,
        3,
        6,
        &alpha,
        a.ptr,
        CUDA_R_16BF,
        5,
        b.ptr,
        CUDA_R_16BF,
        6,
        &beta,
        c3.ptr,
        CUDA_R_32F,
        5
    ));
    // 4. Sgemm_v2_64.
    let a = up(&values(DType::F32, 3 * 4, &mut rng))?;
    let b = up(&values(DType::F32, 4 * 2, &mut rng))?;
    let c4 = DevBuf::new(3 * 2 * 4)?;
    let (alpha, beta) = (2.0f32, 0.0f32);
    bl!(cublasSgemm_v2_64(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        3,
        2,
        4,
        &alpha,
        a.ptr.cast(),
        3,
        b.ptr.cast(),
        4,
        &beta,
        c4.ptr.cast(),
        3
    ));
    // 5. GemmEx_64: f16 operands, f32 compute and output.
    let a = up(&values(DType::F16, 8 * 4, &mut rng))?;
    let b = up(&values(DType::F16, 8 * 4, &mut rng))?;
    let c5 = DevBuf::new(4 * 4 * 4)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    bl!(cublasGemmEx_64(
        h,
        CUBLAS_OP_T,
        CUBLAS_OP_N,
        4,
        4,
        8,
        (&alpha as *const f32).cast(),
        a.ptr,
        CUDA_R_16F,
        8,
        b.ptr,
        CUDA_R_16F,
        8,
        (&beta as *const f32).cast(),
        c5.ptr,
        CUDA_R_32F,
        4,
        CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT
    ));
    // 6. GemmStridedBatchedEx_64: bf16, batch 2, beta != 0.
    let a = up(&values(DType::BF16, 3 * 3 * 2, &mut rng))?;
    let b = up(&values(DType::BF16, 3 * 3 * 2, &mut rng))?;
    let c6 = up(&values(DType::BF16, 3 * 3 * 2, &mut rng))?;
    let (alpha, beta) = (1.0f32, 0.5f32);
    bl!(cublasGemmStridedBatchedEx_64(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_T,
        3,
        3,
        3,
        (&alpha as *const f32).cast(),
        a.ptr,
        CUDA_R_16BF,
        3,
        9,
        b.ptr,
        CUDA_R_16BF,
        3,
        9,
        (&beta as *const f32).cast(),
        c6.ptr,
        CUDA_R_16BF,
        3,
        9,
        2,
        CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT
    ));
    // 7. DgemmStridedBatched_64, batch 2, beta = 0.
    let a = up(&values(DType::F64, 2 * 2 * 2, &mut rng))?;
    let b = up(&values(DType::F64, 2 * 2 * 2, &mut rng))?;
    let c7 = DevBuf::new(2 * 2 * 2 * 8)?;
    let (alpha, beta) = (1.0f64, 0.0f64);
    bl!(cublasDgemmStridedBatched_64(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        2,
        2,
        2,
        &alpha,
        a.ptr.cast(),
        2,
        4,
        b.ptr.cast(),
        2,
        4,
        &beta,
        c7.ptr.cast(),
        2,
        4,
        2
    ));
    // 8. SgemmBatched: pointer arrays in device memory, batch 2 (the tracer records a gap).
    let a8 = up(&values(DType::F32, 9 * 2, &mut rng))?;
    let c8 = DevBuf::new(9 * 2 * 4)?;
    let ptrs: Vec<u8> = [
        a8.ptr as u64,
        a8.ptr as u64 + 36,
        c8.ptr as u64,
        c8.ptr as u64 + 36,
    ]
    .iter()
    .flat_map(|p| p.to_le_bytes())
    .collect();
    let ptrs = up(&ptrs)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    bl!(cublasSgemmBatched(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        3,
        3,
        3,
        &alpha,
        ptrs.ptr.cast(),
        3,
        ptrs.ptr.cast(),
        3,
        &beta,
        ptrs.at(16).cast(),
        3,
        2
    ));
    // 9. Sgemv, A not transposed, x strided (incx = 2), beta != 0.
    let a9 = up(&values(DType::F32, 6 * 4, &mut rng))?;
    let x9 = up(&values(DType::F32, 4 * 2, &mut rng))?;
    let y9 = up(&values(DType::F32, 5, &mut rng))?;
    let (alpha, beta) = (1.5f32, 0.25f32);
    bl!(cublasSgemv_v2(
        h,
        CUBLAS_OP_N,
        5,
        4,
        &alpha,
        a9.ptr.cast(),
        6,
        x9.ptr.cast(),
        2,
        &beta,
        y9.ptr.cast(),
        1
    ));
    ck!(cudaStreamSynchronize(s));
    bl!(cublasDestroy_v2(h));
    println!("traced gemm-more OK");
    Ok(())
}

/// `gemv-strided`: matrix-vector products into a strided `y`, checked against f64; the
/// elements between y's strides are left alone.
fn gemv_strided() -> Result<(), String> {
    let s = stream()?;
    let mut h: cublasHandle_t = std::ptr::null_mut();
    bl!(cublasCreate_v2(&mut h));
    bl!(cublasSetStream_v2(h, s));
    let mut rng = Rng(29);
    // y = alpha op(A) x + beta y, A `rows x cols` (ld `lda`), in f64 with y's stride `incy`.
    let want = |t: DType,
                trans,
                [rows, cols, lda]: [usize; 3],
                a: &[u8],
                x: &[u8],
                incx,
                y: &[u8],
                incy,
                [alpha, beta]: [f64; 2]| {
        let (m, k) = if trans == CUBLAS_OP_N {
            (rows, cols)
        } else {
            (cols, rows)
        };
        let mut out: Vec<f64> = (0..y.len() / t.size()).map(|i| t.load(y, i)).collect();
        for i in 0..m {
            let dot: f64 = (0..k)
                .map(|j| {
                    let aij = if trans == CUBLAS_OP_N {
                        i + j * lda
                    } else {
                        j + i * lda
                    };
                    t.load(a, aij) * t.load(x, j * incx)
                })
                .sum();
            out[i * incy] = alpha * dot + beta * out[i * incy];
        }
        out
    };
    // 1. Sgemv, A (5 x 4, lda 6) transposed: y (4 elements) every 2nd of 8.
    let (a1, x1, y1) = (
        values(DType::F32, 6 * 4, &mut rng),
        values(DType::F32, 5, &mut rng),
        values(DType::F32, 8, &mut rng),
    );
    let (da, dx, dy1) = (up(&a1)?, up(&x1)?, up(&y1)?);
    let (alpha, beta) = (0.75f32, 0.5f32);
    bl!(cublasSgemv_v2(
        h,
        CUBLAS_OP_T,
        5,
        4,
        &alpha,
        da.ptr.cast(),
        6,
        dx.ptr.cast(),
        1,
        &beta,
        dy1.ptr.cast(),
        2
    ));
    let w1 = want(
        DType::F32,
        CUBLAS_OP_T,
        [5, 4, 6],
        &a1,
        &x1,
        1,
        &y1,
        2,
        [0.75, 0.5],
    );
    // 2. Dgemv, A (3 x 4, lda 3) not transposed, x every 2nd: y (3 elements) every 3rd of 9.
    let (a2, x2, y2) = (
        values(DType::F64, 3 * 4, &mut rng),
        values(DType::F64, 4 * 2, &mut rng),
        values(DType::F64, 9, &mut rng),
    );
    let (da2, dx2, dy2) = (up(&a2)?, up(&x2)?, up(&y2)?);
    let (alpha, beta) = (1.0f64, -1.0f64);
    bl!(cublasDgemv_v2(
        h,
        CUBLAS_OP_N,
        3,
        4,
        &alpha,
        da2.ptr.cast(),
        3,
        dx2.ptr.cast(),
        2,
        &beta,
        dy2.ptr.cast(),
        3
    ));
    let w2 = want(
        DType::F64,
        CUBLAS_OP_N,
        [3, 4, 3],
        &a2,
        &x2,
        2,
        &y2,
        3,
        [1.0, -1.0],
    );
    ck!(cudaStreamSynchronize(s));
    for (name, t, got, w) in [
        ("Sgemv", DType::F32, dy1.read()?, w1),
        ("Dgemv", DType::F64, dy2.read()?, w2),
    ] {
        for (i, w) in w.iter().enumerate() {
            let g = t.load(&got, i);
            if (g - w).abs() > 1e-5 * (1.0 + w.abs()) {
                return Err(format!("{name}: y[{i}] is {g}, want {w}"));
            }
        }
    }
    bl!(cublasDestroy_v2(h));
    println!("traced gemv-strided OK");
    Ok(())
}

/// The factors of the PreMulSum all-reduces of `nccl-extra`.
pub const PREMUL_HOST: f32 = 0.5;
pub const PREMUL_DEVICE: f32 = 0.25;

fn nccl_extra() -> Result<(), String> {
    let j = job()?;
    let (r, n) = (j.rank, j.n);
    let comm = world(&j)?;
    let s = stream()?;
    let f32t = ncclFloat32;
    // 1. PreMulSum, host factor.
    let mut f = PREMUL_HOST;
    let mut op: ncclRedOp_t = 0;
    nc!(ncclRedOpCreatePreMulSum(
        &mut op,
        (&mut f as *mut f32).cast(),
        f32t,
        ncclScalarHostImmediate,
        comm
    ));
    let a1 = up(&rank_f32(r, 11, 256))?;
    let b1 = garbage(1024)?;
    nc!(ncclAllReduce(a1.ptr, b1.ptr, 256, f32t, op, comm, s));
    ck!(cudaStreamSynchronize(s));
    nc!(ncclRedOpDestroy(op, comm));
    // 2. PreMulSum, device factor (read when the collective runs).
    let fd = up(&PREMUL_DEVICE.to_le_bytes())?;
    nc!(ncclRedOpCreatePreMulSum(
        &mut op,
        fd.ptr,
        f32t,
        ncclScalarDevice,
        comm
    ));
    let a2 = up(&rank_f32(r, 12, 128))?;
    let b2 = garbage(512)?;
    nc!(ncclAllReduce(a2.ptr, b2.ptr, 128, f32t, op, comm, s));
    ck!(cudaStreamSynchronize(s));
    nc!(ncclRedOpDestroy(op, comm));
    // 3. A simulated group (nothing runs: b3 keeps its bytes), then a real one.
    let a3 = up(&rank_f32(r, 13, 64))?;
    let b3 = garbage(256)?;
    nc!(ncclGroupStart());
    nc!(ncclAllReduce(a3.ptr, b3.ptr, 64, f32t, ncclSum, comm, s));
    let mut info = ncclSimInfo_t {
        size: std::mem::size_of::<ncclSimInfo_t>(),
        magic: NCCL_SIM_INFO_MAGIC,
        version: NCCL_VERSION_CODE as u32,
        estimatedTime: NCCL_UNDEF_FLOAT,
    };
    nc!(ncclGroupSimulateEnd(&mut info));
    ck!(cudaStreamSynchronize(s));
    if b3.read()? != vec![0xffu8; 256] {
        return Err("a simulated group ran its all-reduce".into());
    }
    let a4 = up(&rank_f32(r, 14, 64))?;
    let b4 = garbage(256)?;
    nc!(ncclGroupStart());
    nc!(ncclAllReduce(a4.ptr, b4.ptr, 64, f32t, ncclSum, comm, s));
    nc!(ncclGroupEnd());
    ck!(cudaStreamSynchronize(s));
    // 4. The survivors shrink the world without the last rank and all-reduce on it.
    if r + 1 < n {
        let mut excluded = [(n - 1) as c_int];
        let mut small: ncclComm_t = std::ptr::null_mut();
        nc!(ncclCommShrink(
            comm,
            excluded.as_mut_ptr(),
            1,
            &mut small,
            std::ptr::null_mut(),
            NCCL_SHRINK_DEFAULT
        ));
        let a5 = up(&rank_f32(r, 15, 96))?;
        let b5 = garbage(384)?;
        nc!(ncclAllReduce(a5.ptr, b5.ptr, 96, f32t, ncclSum, small, s));
        ck!(cudaStreamSynchronize(s));
        nc!(ncclCommDestroy(small));
    }
    nc!(ncclCommDestroy(comm));
    println!("rank {r} of {n}: traced nccl-extra OK");
    Ok(())
}

/// Devices (and threads) of `nccl-threads`.
pub const THREAD_DEVICES: usize = 4;

fn nccl_threads() -> Result<(), String> {
    let mut id = ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    nc!(ncclGetUniqueId(&mut id));
    let n = THREAD_DEVICES;
    let results: Vec<Result<(), String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..n)
            .map(|d| {
                sc.spawn(move || -> Result<(), String> {
                    ck!(cudaSetDevice(d as c_int));
                    let mut comm: ncclComm_t = std::ptr::null_mut();
                    nc!(ncclCommInitRank(&mut comm, n as c_int, id, d as c_int));
                    let s = stream()?;
                    let a = up(&rank_f32(d, 21, 64))?;
                    let b = garbage(256)?;
                    nc!(ncclAllReduce(
                        a.ptr,
                        b.ptr,
                        64,
                        ncclFloat32,
                        ncclSum,
                        comm,
                        s
                    ));
                    ck!(cudaStreamSynchronize(s));
                    nc!(ncclCommDestroy(comm));
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    results.into_iter().collect::<Result<Vec<()>, String>>()?;
    println!("traced nccl-threads OK");
    Ok(())
}

fn graph() -> Result<(), String> {
    let s = stream()?;
    let mut h: cublasHandle_t = std::ptr::null_mut();
    bl!(cublasCreate_v2(&mut h));
    bl!(cublasSetStream_v2(h, s));
    let (m, n, k) = (8usize, 8usize, 8usize);
    let mut rng = Rng(3);
    let a_host = values(DType::F32, m * k, &mut rng);
    let b1 = values(DType::F32, k * n, &mut rng);
    let b2 = values(DType::F32, k * n, &mut rng);
    let staging = pinned(&b1)?;
    let a = up(&a_host)?;
    let b = DevBuf::new(k * n * 4)?;
    let c = DevBuf::new(m * n * 4)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    ck!(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    ck!(cudaMemcpyAsync(
        b.ptr,
        staging.cast(),
        k * n * 4,
        cudaMemcpyHostToDevice,
        s
    ));
    bl!(cublasGemmEx(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        m as c_int,
        n as c_int,
        k as c_int,
        (&alpha as *const f32).cast(),
        a.ptr,
        CUDA_R_32F,
        m as c_int,
        b.ptr,
        CUDA_R_32F,
        k as c_int,
        (&beta as *const f32).cast(),
        c.ptr,
        CUDA_R_32F,
        m as c_int,
        CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT
    ));
    let mut g: cudaGraph_t = std::ptr::null_mut();
    ck!(cudaStreamEndCapture(s, &mut g));
    let mut exec: cudaGraphExec_t = std::ptr::null_mut();
    ck!(cudaGraphInstantiate(&mut exec, g, 0));
    for (round, bh) in [&b1, &b2].into_iter().enumerate() {
        // SAFETY: the pinned staging buffer the graph's copy reads, idle between replays.
        unsafe { std::ptr::copy_nonoverlapping(bh.as_ptr(), staging, bh.len()) };
        ck!(cudaGraphLaunch(exec, s));
        ck!(cudaStreamSynchronize(s));
        let got = c.download(s)?;
        let gm = Gemm::simple(m, n, k, DType::F32, DType::F32, Compute::F32);
        let mut want = vec![0u8; m * n * 4];
        sim_gemm(
            &gm,
            Buffers {
                a: &a_host,
                b: bh,
                c: CInput::None,
                d: &mut want,
                bias: None,
                aux: None,
                bgrad: None,
            },
        )
        .map_err(|e| e.to_string())?;
        if got != want {
            return Err(format!("graph replay {round} computed a wrong GEMM"));
        }
    }
    ck!(cudaGraphExecDestroy(exec));
    ck!(cudaGraphDestroy(g));
    bl!(cublasDestroy_v2(h));
    println!("traced graph OK (2 replays)");
    Ok(())
}

/// Replay `i`'s input on rank `r` (the tests regenerate it).
pub fn graph_step_input(r: usize, i: usize, len: usize) -> Vec<u8> {
    rank_f32(r, 100 + i, len)
}

fn graph_step(replays: usize) -> Result<(), String> {
    let j = job()?;
    let (r, n) = (j.rank, j.n);
    let comm = world(&j)?;
    let s = stream()?;
    let mut h: cublasHandle_t = std::ptr::null_mut();
    bl!(cublasCreate_v2(&mut h));
    bl!(cublasSetStream_v2(h, s));
    let (m, nn, k) = (16usize, 8usize, 32usize);
    let a_host = rank_f32(r, 99, m * k);
    let a = up(&a_host)?;
    let staging = pinned(&vec![0u8; k * nn * 4])?;
    let b = DevBuf::new(k * nn * 4)?;
    let c = DevBuf::new(m * nn * 4)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    // Global mode, as torch.cuda.graph captures by default.
    ck!(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    ck!(cudaMemcpyAsync(
        b.ptr,
        staging.cast(),
        k * nn * 4,
        cudaMemcpyHostToDevice,
        s
    ));
    bl!(cublasGemmEx(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        m as c_int,
        nn as c_int,
        k as c_int,
        (&alpha as *const f32).cast(),
        a.ptr,
        CUDA_R_32F,
        m as c_int,
        b.ptr,
        CUDA_R_32F,
        k as c_int,
        (&beta as *const f32).cast(),
        c.ptr,
        CUDA_R_32F,
        m as c_int,
        CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT
    ));
    nc!(ncclAllReduce(
        c.ptr,
        c.ptr,
        m * nn,
        ncclFloat32,
        ncclSum,
        comm,
        s
    ));
    let mut g: cudaGraph_t = std::ptr::null_mut();
    ck!(cudaStreamEndCapture(s, &mut g));
    let mut exec: cudaGraphExec_t = std::ptr::null_mut();
    ck!(cudaGraphInstantiateWithFlags(&mut exec, g, 0));
    let gm = Gemm::simple(m, nn, k, DType::F32, DType::F32, Compute::F32);
    for i in 0..replays {
        let input = graph_step_input(r, i, k * nn);
        // SAFETY: the pinned staging buffer the graph's copy reads, idle between replays.
        unsafe { std::ptr::copy_nonoverlapping(input.as_ptr(), staging, input.len()) };
        ck!(cudaGraphLaunch(exec, s));
        ck!(cudaStreamSynchronize(s));
        let got = c.download(s)?;
        // Every rank's GEMM output, summed in rank order (two ranks: exact in any order).
        let mut want = vec![0f32; m * nn];
        for q in 0..n {
            let mut d = vec![0u8; m * nn * 4];
            let aq = rank_f32(q, 99, m * k);
            let bq = graph_step_input(q, i, k * nn);
            sim_gemm(
                &gm,
                Buffers {
                    a: &aq,
                    b: &bq,
                    c: CInput::None,
                    d: &mut d,
                    bias: None,
                    aux: None,
                    bgrad: None,
                },
            )
            .map_err(|e| e.to_string())?;
            for (w, x) in want.iter_mut().zip(d.chunks_exact(4)) {
                *w += f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
            }
        }
        let got: Vec<f32> = got
            .chunks_exact(4)
            .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
            .collect();
        if n <= 2 && got != want {
            return Err(format!("graph replay {i}: wrong all-reduced GEMM output"));
        }
    }
    ck!(cudaGraphExecDestroy(exec));
    ck!(cudaGraphDestroy(g));
    bl!(cublasDestroy_v2(h));
    nc!(ncclCommDestroy(comm));
    println!("traced graph-step rank {r} OK ({replays} replays)");
    Ok(())
}

fn graph_update() -> Result<(), String> {
    let s = stream()?;
    let mut h: cublasHandle_t = std::ptr::null_mut();
    bl!(cublasCreate_v2(&mut h));
    bl!(cublasSetStream_v2(h, s));
    let n = 8usize;
    let mut rng = Rng(5);
    let a = up(&values(DType::F32, n * n, &mut rng))?;
    let staging = pinned(&values(DType::F32, n * n, &mut rng))?;
    let (b, c) = (DevBuf::new(n * n * 4)?, DevBuf::new(n * n * 4)?);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let mut graphs = [std::ptr::null_mut(); 2];
    for g in &mut graphs {
        ck!(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        ck!(cudaMemcpyAsync(
            b.ptr,
            staging.cast(),
            n * n * 4,
            cudaMemcpyHostToDevice,
            s
        ));
        bl!(cublasSgemm_v2(
            h,
            CUBLAS_OP_N,
            CUBLAS_OP_N,
            n as c_int,
            n as c_int,
            n as c_int,
            &alpha,
            a.ptr.cast(),
            n as c_int,
            b.ptr.cast(),
            n as c_int,
            &beta,
            c.ptr.cast(),
            n as c_int
        ));
        ck!(cudaStreamEndCapture(s, g));
    }
    let mut exec: cudaGraphExec_t = std::ptr::null_mut();
    ck!(cudaGraphInstantiate(&mut exec, graphs[0], 0));
    ck!(cudaGraphLaunch(exec, s));
    ck!(cudaStreamSynchronize(s));
    let first = c.download(s)?;
    let mut info = cudaGraphExecUpdateResultInfo {
        result: 99,
        errorNode: std::ptr::null_mut(),
        errorFromNode: std::ptr::null_mut(),
    };
    ck!(cudaGraphExecUpdate(exec, graphs[1], &mut info));
    if info.result != cudaGraphExecUpdateSuccess {
        return Err(format!("cudaGraphExecUpdate result {}", info.result));
    }
    ck!(cudaGraphLaunch(exec, s));
    ck!(cudaStreamSynchronize(s));
    if c.download(s)? != first {
        return Err("the updated instance computed another result".into());
    }
    ck!(cudaGraphExecDestroy(exec));
    for g in graphs {
        ck!(cudaGraphDestroy(g));
    }
    bl!(cublasDestroy_v2(h));
    println!("traced graph-update OK");
    Ok(())
}

fn errors() -> Result<(), String> {
    let d = DevBuf::new(64)?;
    let host = [0u8; 64];
    let mut codes = Vec::new();
    // SAFETY: calls that must fail, with arguments the runtime validates.
    unsafe {
        codes.push(cudaMemcpy(d.ptr, host.as_ptr().cast(), 16, 77));
        codes.push(cudaMemcpyAsync(
            d.ptr,
            host.as_ptr().cast(),
            16,
            cudaMemcpyHostToDevice,
            0xdead0 as cudaStream_t,
        ));
        codes.push(cudaGetLastError());
        // An explicit direction contradicting the pointers.
        codes.push(cudaMemcpy(
            d.ptr,
            host.as_ptr().cast(),
            16,
            cudaMemcpyDeviceToHost,
        ));
        codes.push(cudaGetLastError());
    }
    let mut h: cublasHandle_t = std::ptr::null_mut();
    bl!(cublasCreate_v2(&mut h));
    let one = 1.0f32;
    // SAFETY: invalid sizes; cuBLAS validates them before touching memory.
    unsafe {
        codes.push(cublasGemmEx(
            h,
            CUBLAS_OP_N,
            CUBLAS_OP_N,
            -1,
            4,
            4,
            (&one as *const f32).cast(),
            d.ptr,
            CUDA_R_32F,
            4,
            d.ptr,
            CUDA_R_32F,
            4,
            (&one as *const f32).cast(),
            d.ptr,
            CUDA_R_32F,
            4,
            CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT,
        ));
        codes.push(cublasSgemm_v2(
            h,
            CUBLAS_OP_N,
            CUBLAS_OP_N,
            4,
            4,
            4,
            &one,
            d.ptr.cast(),
            2,
            d.ptr.cast(),
            4,
            &one,
            d.ptr.cast(),
            4,
        ));
    }
    bl!(cublasDestroy_v2(h));
    let mut comm: ncclComm_t = std::ptr::null_mut();
    let dev: c_int = 0;
    nc!(ncclCommInitAll(&mut comm, 1, &dev));
    // SAFETY: an invalid datatype, refused before launch.
    unsafe {
        codes.push(ncclAllReduce(
            d.ptr,
            d.ptr,
            4,
            99,
            ncclSum,
            comm,
            std::ptr::null_mut(),
        ));
    }
    nc!(ncclCommDestroy(comm));
    if codes.iter().take(2).any(|&c| c == cudaSuccess) {
        return Err(format!("an invalid call succeeded: {codes:?}"));
    }
    println!("traced errors: codes {codes:?}");
    Ok(())
}

fn steps(rule: &str) -> Result<(), String> {
    let s = stream()?;
    let mut h: cublasHandle_t = std::ptr::null_mut();
    bl!(cublasCreate_v2(&mut h));
    bl!(cublasSetStream_v2(h, s));
    // SAFETY: a NUL-terminated name looked up in the global scope (RTLD_DEFAULT is null).
    let step_fn = unsafe { dlsym(std::ptr::null_mut(), c"ttrace_step".as_ptr()) };
    let (m, n, k) = (8usize, 4usize, 16usize);
    let mut rng = Rng(11);
    // Weights, and the values the "optimizer" writes into them after each step.
    let w = up(&values(DType::F32, m * k, &mut rng))?;
    let updates: Vec<DevBuf> = (0..3)
        .map(|_| up(&values(DType::F32, m * k, &mut rng)))
        .collect::<Result<_, _>>()?;
    let x = DevBuf::new(k * n * 4)?;
    let y = DevBuf::new(m * n * 4)?;
    let batches: Vec<Vec<u8>> = (0..6)
        .map(|_| values(DType::F32, k * n, &mut rng))
        .collect();
    let (alpha, beta) = (1.0f32, 0.0f32);
    for step in 0..3 {
        if rule == "nvtx" {
            // SAFETY: a NUL-terminated message.
            unsafe { nvtxRangePushA(c"train_step".as_ptr()) };
        }
        if rule == "api" && !step_fn.is_null() {
            // SAFETY: `void ttrace_step(void)` from include/ttrace.h.
            unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(step_fn)() };
        }
        for micro in 0..2 {
            let batch = &batches[step * 2 + micro];
            ck!(cudaMemcpyAsync(
                x.ptr,
                batch.as_ptr().cast(),
                batch.len(),
                cudaMemcpyHostToDevice,
                s
            ));
            bl!(cublasGemmEx(
                h,
                CUBLAS_OP_N,
                CUBLAS_OP_N,
                m as c_int,
                n as c_int,
                k as c_int,
                (&alpha as *const f32).cast(),
                w.ptr,
                CUDA_R_32F,
                m as c_int,
                x.ptr,
                CUDA_R_32F,
                k as c_int,
                (&beta as *const f32).cast(),
                y.ptr,
                CUDA_R_32F,
                m as c_int,
                CUBLAS_COMPUTE_32F,
                CUBLAS_GEMM_DEFAULT
            ));
            ck!(cudaStreamSynchronize(s));
        }
        // The optimizer: new weights in place.
        ck!(cudaMemcpyAsync(
            w.ptr,
            updates[step].ptr,
            m * k * 4,
            cudaMemcpyDeviceToDevice,
            s
        ));
        if rule == "nvtx" {
            // SAFETY: closes the range opened above.
            unsafe { nvtxRangePop() };
        }
    }
    ck!(cudaStreamSynchronize(s));
    bl!(cublasDestroy_v2(h));
    println!("traced steps {rule} OK");
    Ok(())
}

/// Synchronous copies whose bytes the program changes as soon as they return, from a
/// `cudaStreamNonBlocking` stream (which does not wait for the legacy default stream): a
/// download of `x` (values 1, 2, 3, ...), then `x` zeroed; an upload into `x` (values 101,
/// 102, ...), then `x` set to 0xff bytes. A snapshot must hold the bytes each copy moved.
fn memcpy_then_overwrite() -> Result<(), String> {
    let side = stream()?;
    let n = 4096usize;
    let first: Vec<u8> = (0..n).map(|i| (1 + i % 200) as u8).collect();
    let x = DevBuf::from_host(&first)?;
    let got = x.read()?;
    if got != first {
        return Err("the download did not bring the uploaded bytes".into());
    }
    ck!(cudaMemsetAsync(x.ptr, 0, n, side));
    ck!(cudaStreamSynchronize(side));
    let second: Vec<u8> = (0..n).map(|i| (101 + i % 100) as u8).collect();
    x.write(0, &second)?;
    ck!(cudaMemsetAsync(x.ptr, 0xff, n, side));
    ck!(cudaStreamSynchronize(side));
    ck!(cudaDeviceSynchronize());
    println!("traced memcpy-then-overwrite OK");
    Ok(())
}

/// Copies to and from a `__device__` variable, registered as nvcc's start-up code registers it
/// (`__cudaRegisterFatBinary`, `__cudaRegisterVar` with its 64-byte host shadow, bytes 1..=64):
/// 32 bytes (101..) at offset 8 with `cudaMemcpyToSymbol`, 16 bytes (201..) at offset 48 with
/// `cudaMemcpyToSymbolAsync` on a stream, a copy to an unregistered symbol (refused), then all
/// 64 read back with `cudaMemcpyFromSymbol` and checked.
fn memcpy_symbol() -> Result<(), String> {
    type RegisterFatBinary = unsafe extern "C" fn(*mut c_void) -> *mut *mut c_void;
    type RegisterVar = unsafe extern "C" fn(
        *mut *mut c_void,
        *mut c_char,
        *mut c_char,
        *const c_char,
        c_int,
        usize,
        c_int,
        c_int,
    );
    // The runtime is loaded (with RTLD_GLOBAL) by the first call through cuda-dyn.
    let s = stream()?;
    let find = |name: &core::ffi::CStr| {
        // SAFETY: a NUL-terminated name looked up in the global scope (RTLD_DEFAULT is null).
        let p = unsafe { dlsym(std::ptr::null_mut(), name.as_ptr()) };
        (!p.is_null())
            .then_some(p)
            .ok_or(format!("{name:?} is not exported"))
    };
    // SAFETY: the runtime's registration entry points, with nvcc's C signatures.
    let (register_binary, register_var) = unsafe {
        (
            std::mem::transmute::<*mut c_void, RegisterFatBinary>(find(
                c"__cudaRegisterFatBinary",
            )?),
            std::mem::transmute::<*mut c_void, RegisterVar>(find(c"__cudaRegisterVar")?),
        )
    };
    let shadow: &'static mut [u8; 64] = Box::leak(Box::new([0u8; 64]));
    for (i, b) in shadow.iter_mut().enumerate() {
        *b = (i + 1) as u8;
    }
    let initial = *shadow;
    let name = c"probe_table".as_ptr().cast_mut();
    // SAFETY: a module handle made now and a host shadow of 64 bytes that lives forever.
    unsafe {
        let module = register_binary(std::ptr::null_mut());
        register_var(module, shadow.as_mut_ptr().cast(), name, name, 0, 64, 0, 0);
    }
    let symbol = shadow.as_ptr().cast::<c_void>();
    let first: Vec<u8> = (0..32).map(|i| 101 + i as u8).collect();
    let second: Vec<u8> = (0..16).map(|i| 201 + i as u8).collect();
    ck!(cudaMemcpyToSymbol(
        symbol,
        first.as_ptr().cast(),
        32,
        8,
        cudaMemcpyHostToDevice
    ));
    ck!(cudaMemcpyToSymbolAsync(
        symbol,
        second.as_ptr().cast(),
        16,
        48,
        cudaMemcpyHostToDevice,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    let mut back = [0u8; 64];
    ck!(cudaMemcpyFromSymbol(
        back.as_mut_ptr().cast(),
        symbol,
        64,
        0,
        cudaMemcpyDeviceToHost
    ));
    // A symbol no variable was registered at: the runtime refuses the copy.
    let unknown = [0u8; 8];
    // SAFETY: the runtime reads nothing of an unregistered symbol; `first` has 32 bytes.
    let refused = unsafe {
        cudaMemcpyToSymbol(
            unknown.as_ptr().cast(),
            first.as_ptr().cast(),
            8,
            0,
            cudaMemcpyHostToDevice,
        )
    };
    if refused != cudaErrorInvalidSymbol {
        return Err(format!(
            "a copy to an unregistered symbol returned {refused}"
        ));
    }
    let mut want = initial;
    want[8..40].copy_from_slice(&first);
    want[48..64].copy_from_slice(&second);
    if back != want {
        return Err(format!("the variable holds {back:?}, not {want:?}"));
    }
    println!("traced memcpy-symbol OK");
    Ok(())
}

/// 3-D copies (which ttrace records as gaps): a 2 x 3 x 10-byte block uploaded into a pitched
/// device buffer at position (4, 1, 1) with `cudaMemcpy3D`, read back whole with
/// `cudaMemcpy3DAsync` on a stream, and checked.
fn memcpy3d() -> Result<(), String> {
    let s = stream()?;
    let (pitch, ysize, slices) = (32usize, 5usize, 3usize);
    let dev = DevBuf::new(pitch * ysize * slices)?;
    ck!(cudaMemset(dev.ptr, 0, dev.bytes));
    let (w, h, d) = (10usize, 3usize, 2usize);
    let mut block: Vec<u8> = (0..w * h * d).map(|i| (i + 1) as u8).collect();
    let pitched = |ptr: *mut c_void, pitch: usize, xsize: usize, ysize: usize| cudaPitchedPtr {
        ptr,
        pitch,
        xsize,
        ysize,
    };
    let up = cudaMemcpy3DParms {
        srcArray: std::ptr::null_mut(),
        srcPos: cudaPos::default(),
        srcPtr: pitched(block.as_mut_ptr().cast(), w, w, h),
        dstArray: std::ptr::null_mut(),
        dstPos: cudaPos { x: 4, y: 1, z: 1 },
        dstPtr: pitched(dev.ptr, pitch, pitch, ysize),
        extent: cudaExtent {
            width: w,
            height: h,
            depth: d,
        },
        kind: cudaMemcpyHostToDevice,
    };
    ck!(cudaMemcpy3D(&up));
    let mut back = vec![0u8; pitch * ysize * slices];
    let down = cudaMemcpy3DParms {
        srcArray: std::ptr::null_mut(),
        srcPos: cudaPos::default(),
        srcPtr: pitched(dev.ptr, pitch, pitch, ysize),
        dstArray: std::ptr::null_mut(),
        dstPos: cudaPos::default(),
        dstPtr: pitched(back.as_mut_ptr().cast(), pitch, pitch, ysize),
        extent: cudaExtent {
            width: pitch,
            height: ysize,
            depth: slices,
        },
        kind: cudaMemcpyDeviceToHost,
    };
    ck!(cudaMemcpy3DAsync(&down, s));
    ck!(cudaStreamSynchronize(s));
    for z in 0..slices {
        for y in 0..ysize {
            for x in 0..pitch {
                let inside =
                    (1..1 + d).contains(&z) && (1..1 + h).contains(&y) && (4..4 + w).contains(&x);
                let want = if inside {
                    block[(z - 1) * w * h + (y - 1) * w + (x - 4)]
                } else {
                    0
                };
                let got = back[z * pitch * ysize + y * pitch + x];
                if got != want {
                    return Err(format!(
                        "3-D copy: byte ({x}, {y}, {z}) is {got}, not {want}"
                    ));
                }
            }
        }
    }
    // Between devices: the block to a second buffer (device 0 to device 0) and back to the
    // host through a third, each checked.
    let (w2, h2, d2) = (pitch, ysize, slices);
    let peer = |src: *mut c_void, dst: *mut c_void| cudaMemcpy3DPeerParms {
        srcArray: std::ptr::null_mut(),
        srcPos: cudaPos::default(),
        srcPtr: pitched(src, pitch, pitch, ysize),
        srcDevice: 0,
        dstArray: std::ptr::null_mut(),
        dstPos: cudaPos::default(),
        dstPtr: pitched(dst, pitch, pitch, ysize),
        dstDevice: 0,
        extent: cudaExtent {
            width: w2,
            height: h2,
            depth: d2,
        },
    };
    let second = DevBuf::new(pitch * ysize * slices)?;
    let third = DevBuf::new(pitch * ysize * slices)?;
    ck!(cudaMemcpy3DPeer(&peer(dev.ptr, second.ptr)));
    ck!(cudaMemcpy3DPeerAsync(&peer(second.ptr, third.ptr), s));
    ck!(cudaStreamSynchronize(s));
    let mut again = vec![0u8; pitch * ysize * slices];
    ck!(cudaMemcpy(
        again.as_mut_ptr().cast(),
        third.ptr,
        again.len(),
        cudaMemcpyDeviceToHost
    ));
    if again != back {
        return Err("3-D peer copies: the bytes differ from the source's".into());
    }
    println!("traced memcpy3d OK");
    Ok(())
}

/// Copies into, between and out of CUDA arrays of f32 (16 x 4 elements: rows of 64 bytes):
/// a 2-D upload of 40 x 3 bytes at (8, 1), the whole array to a second one, a 2-D download
/// of it, then a linear upload of 100 bytes across rows from (60, 0) and its download.
/// Checks the bytes it reads back.
fn memcpy_array() -> Result<(), String> {
    let s = stream()?;
    let desc = cudaChannelFormatDesc {
        x: 32,
        y: 0,
        z: 0,
        w: 0,
        f: 2, // cudaChannelFormatKindFloat
    };
    let (mut a, mut b): (cudaArray_t, cudaArray_t) = (std::ptr::null_mut(), std::ptr::null_mut());
    ck!(cudaMallocArray(&mut a, &desc, 16, 4, 0));
    ck!(cudaMallocArray(&mut b, &desc, 16, 4, 0));
    let zeros = vec![0u8; 256];
    ck!(cudaMemcpyToArray(
        a,
        0,
        0,
        zeros.as_ptr().cast(),
        256,
        cudaMemcpyHostToDevice
    ));
    let block: Vec<u8> = (0..120).map(|i| (i + 1) as u8).collect();
    ck!(cudaMemcpy2DToArray(
        a,
        8,
        1,
        block.as_ptr().cast(),
        40,
        40,
        3,
        cudaMemcpyHostToDevice
    ));
    ck!(cudaMemcpy2DArrayToArray(
        b,
        0,
        0,
        a,
        0,
        0,
        64,
        4,
        cudaMemcpyDeviceToDevice
    ));
    let mut back = vec![0u8; 256];
    ck!(cudaMemcpy2DFromArrayAsync(
        back.as_mut_ptr().cast(),
        64,
        b,
        0,
        0,
        64,
        4,
        cudaMemcpyDeviceToHost,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    for (i, &got) in back.iter().enumerate() {
        let (y, x) = (i / 64, i % 64);
        let inside = (1..4).contains(&y) && (8..48).contains(&x);
        let want = if inside {
            block[(y - 1) * 40 + x - 8]
        } else {
            0
        };
        if got != want {
            return Err(format!(
                "array copies: byte ({x}, {y}) is {got}, not {want}"
            ));
        }
    }
    let line: Vec<u8> = (0..100).map(|i| 200u8.wrapping_add(i)).collect();
    ck!(cudaMemcpyToArray(
        a,
        60,
        0,
        line.as_ptr().cast(),
        100,
        cudaMemcpyHostToDevice
    ));
    let mut again = vec![0u8; 100];
    ck!(cudaMemcpyFromArray(
        again.as_mut_ptr().cast(),
        a,
        60,
        0,
        100,
        cudaMemcpyDeviceToHost
    ));
    if again != line {
        return Err("array copies: the linear copy read back other bytes".into());
    }
    ck!(cudaFreeArray(a));
    ck!(cudaFreeArray(b));
    println!("traced memcpy-array OK");
    Ok(())
}

/// Five training iterations the way a caching allocator lays them out: every tensor in a
/// fresh buffer (weight casts, batches, activations), so that only the backward pass tells the
/// `auto` step rule where a step ends. Each iteration: the batch `x` (512 x 1024 f32, 2 MiB:
/// its glimpse is not the whole of it) and this step's weights `w` (16 x 512) are uploaded;
/// the forward GEMM `y = w·x` (the anchor), a second layer of the same shape on other
/// tensors, then the weight gradient `dw = dy·xᵀ`, which reads the anchor's `x` transposed.
fn steps_backward() -> Result<(), String> {
    let s = stream()?;
    let mut h: cublasHandle_t = std::ptr::null_mut();
    bl!(cublasCreate_v2(&mut h));
    bl!(cublasSetStream_v2(h, s));
    let (m, n, k) = (16usize, 1024usize, 512usize);
    let mut rng = Rng(29);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let gemm = |transb, a: &DevBuf, b: &DevBuf, c: &DevBuf, (rows, cols, inner, ldb)| {
        bl!(cublasSgemm_v2(
            h,
            CUBLAS_OP_N,
            transb,
            rows as c_int,
            cols as c_int,
            inner as c_int,
            &alpha,
            a.ptr.cast(),
            rows as c_int,
            b.ptr.cast(),
            ldb as c_int,
            &beta,
            c.ptr.cast(),
            rows as c_int
        ));
        Ok(())
    };
    // Every buffer lives to the end: no address is handed out twice.
    let mut held = Vec::new();
    for _ in 0..5 {
        let x = up(&values(DType::F32, k * n, &mut rng))?;
        let w = up(&values(DType::F32, m * k, &mut rng))?;
        let y = DevBuf::new(m * n * 4)?;
        gemm(CUBLAS_OP_N, &w, &x, &y, (m, n, k, k))?;
        let (x2, w2) = (
            up(&values(DType::F32, k * n, &mut rng))?,
            up(&values(DType::F32, m * k, &mut rng))?,
        );
        let y2 = DevBuf::new(m * n * 4)?;
        gemm(CUBLAS_OP_N, &w2, &x2, &y2, (m, n, k, k))?;
        let dy = up(&values(DType::F32, m * n, &mut rng))?;
        let dw = DevBuf::new(m * k * 4)?;
        gemm(CUBLAS_OP_T, &dy, &x, &dw, (m, k, n, k))?;
        ck!(cudaStreamSynchronize(s));
        // An iteration's host work (the next batch's loading): the tracer catches up, so that
        // under `--steps` the next iteration's hooks know the anchor its records told, as they
        // do in a training loop, also on a loaded machine.
        std::thread::sleep(std::time::Duration::from_millis(50));
        held.extend([x, w, y, x2, w2, y2, dy, dw]);
    }
    bl!(cublasDestroy_v2(h));
    println!("traced steps backward OK");
    Ok(())
}

fn forked() -> Result<(), String> {
    let s = stream()?;
    let d = DevBuf::new(256)?;
    let data = pattern(9, 256);
    ck!(cudaMemcpyAsync(
        d.ptr,
        data.as_ptr().cast(),
        256,
        cudaMemcpyHostToDevice,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    // SAFETY: fork in a program that only calls async-signal-safe-enough code in the child
    // (one runtime call, a print, exit).
    let pid = unsafe { fork() };
    if pid < 0 {
        return Err("fork failed".into());
    }
    if pid == 0 {
        // SAFETY: a plain copy with valid arguments.
        let code = unsafe { cudaMemcpy(d.ptr, data.as_ptr().cast(), 256, cudaMemcpyHostToDevice) };
        println!("child copy returned {code}");
        std::process::exit(0);
    }
    let mut status: c_int = -1;
    // SAFETY: waits for our own child.
    if unsafe { waitpid(pid, &mut status, 0) } != pid || status != 0 {
        return Err(format!("the child failed: wait status {status}"));
    }
    ck!(cudaMemcpyAsync(
        d.ptr,
        data.as_ptr().cast(),
        256,
        cudaMemcpyHostToDevice,
        s
    ));
    ck!(cudaStreamSynchronize(s));
    println!("traced fork OK");
    Ok(())
}

/// Copy `i` of thread `t` in `threads`: its salt and length.
pub fn thread_copy(t: usize, i: usize) -> (u8, usize) {
    ((t * 50 + i) as u8, 1000 + (i * 37 + t * 11) % 3000)
}

/// Threads in `threads`, and copies per thread.
pub const THREADS: (usize, usize) = (4, 200);

fn threads() -> Result<(), String> {
    let (nt, per) = THREADS;
    let results: Vec<Result<(), String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..nt)
            .map(|t| {
                sc.spawn(move || -> Result<(), String> {
                    let s = stream()?;
                    let d = DevBuf::new(4096)?;
                    for i in 0..per {
                        let (salt, len) = thread_copy(t, i);
                        let data = pattern(salt, len);
                        ck!(cudaMemcpyAsync(
                            d.ptr,
                            data.as_ptr().cast(),
                            len,
                            cudaMemcpyHostToDevice,
                            s
                        ));
                    }
                    ck!(cudaStreamSynchronize(s));
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    results.into_iter().collect::<Result<Vec<()>, String>>()?;
    println!("traced threads OK");
    Ok(())
}
