//! GEMM probes: cuBLAS (`gemm-cublas`) and cuBLASLt (`gemm-lt`) through the runtime ABI.
//!
//! Each case uploads random operands (with NaN in every padding element, so that reading
//! outside a matrix shows), runs the GEMM on a stream, copies the result back and checks each
//! element against an f64 reference within `sim_kernels::gemm::round_off_bound`. With `--sim`
//! (the stack is the simulated one) the result must also be bitwise equal to
//! `sim_kernels::gemm::gemm` recomputed on the host: the promise tracer tests rely on.
//! Status codes of invalid calls, the stream a GEMM runs on, device pointer mode, descriptor
//! attribute sizes and the FP8 rules are checked too.

use crate::support::{ck, DevBuf};
use core::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cuda_dyn::abi::cublas::*;
use cuda_dyn::abi::cublaslt::*;
use cuda_dyn::abi::cudart::*;
use cuda_dyn::abi::library_types::*;
use cuda_dyn::cublas::*;
use cuda_dyn::cublaslt::*;
use cuda_dyn::cudart::*;
use sim_kernels::dtype::DType;
use sim_kernels::gemm::{
    gelu_tanh, gelu_tanh_grad, gemm, reference, round_off_bound, Activation, BiasGrad, BiasLayout,
    Buffers, CInput, Compute, Gemm, Layout, Op, Order,
};

/// Fails unless the cuBLAS(Lt) call returned `expected`.
macro_rules! blas {
    ($e:expr) => {
        blas!($e, CUBLAS_STATUS_SUCCESS)
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

/// Options of a probe run.
struct Opts {
    /// The stack is the simulated one: results must match `sim_kernels::gemm` bitwise.
    sim: bool,
}

fn opts(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts { sim: false };
    for a in args {
        match a.as_str() {
            "--sim" => o.sim = true,
            other => return Err(format!("unknown argument {other} (accepted: --sim)")),
        }
    }
    Ok(o)
}

/// SplitMix64.
struct Rng(u64);
impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

/// A host buffer for `batch` `rows x cols` matrices of `l`, NaN outside the matrices.
fn matrix(l: &Layout, rows: usize, cols: usize, batch: usize, rng: &mut Rng) -> Vec<u8> {
    let n = l.span_bytes(rows, cols, batch) / l.dtype.size();
    let mut buf = vec![0u8; n * l.dtype.size()];
    for i in 0..n {
        l.dtype.store(&mut buf, i, f64::NAN);
    }
    for bi in 0..batch {
        for c in 0..cols {
            for r in 0..rows {
                l.dtype.store(&mut buf, l.index(r, c, bi), rng.unit());
            }
        }
    }
    buf
}

/// A GEMM case: the problem in `sim_kernels` terms and its host operands.
struct Job {
    name: String,
    g: Gemm,
    a: Vec<u8>,
    b: Vec<u8>,
    c: Vec<u8>,
    bias: Option<Vec<u8>>,
    /// DGELU's input: the forward pre-activation.
    aux_in: Option<Vec<u8>>,
}

impl Job {
    fn new(name: &str, g: Gemm, seed: u64) -> Job {
        let mut rng = Rng(seed);
        let (ar, ac) = g.a_dims();
        let (br, bc) = g.b_dims();
        let a = matrix(&g.a, ar, ac, g.batch, &mut rng);
        let b = matrix(&g.b, br, bc, g.batch, &mut rng);
        let c = matrix(&g.c, g.m, g.n, g.batch, &mut rng);
        let bias = g.epilogue.bias.map(|bl| {
            let l = Layout::col(bl.dtype, g.m).strided(bl.batch_stride);
            matrix(&l, g.m, 1, g.batch, &mut rng)
        });
        let aux_in = match (g.epilogue.activation, g.epilogue.aux) {
            (Activation::DGelu, Some(al)) => Some(matrix(&al, g.m, g.n, g.batch, &mut rng)),
            _ => None,
        };
        Job {
            name: name.to_string(),
            g,
            a,
            b,
            c,
            bias,
            aux_in,
        }
    }

    /// Checks D (and the aux output, bias gradient and amax) against the f64 reference and,
    /// with `--sim`, against `sim_kernels::gemm` bitwise. `d_before` is D's content before the
    /// call.
    fn check(
        &self,
        o: &Opts,
        d_before: &[u8],
        got: &Outputs<'_>,
        in_place: bool,
    ) -> Result<(), String> {
        let g = &self.g;
        let e = &g.epilogue;
        let name = &self.name;
        let (val, mag) = reference(g, &self.a, &self.b, Some(&self.c), self.bias.as_deref());
        let mut want_amax = 0f64;
        // Per-row sums of the result (DGELU_BGRAD) and their magnitudes.
        let mut rows = vec![(0f64, 0f64); g.m * g.batch];
        for bi in 0..g.batch {
            for j in 0..g.n {
                for i in 0..g.m {
                    let idx = (bi * g.n + j) * g.m + i;
                    let (v, mg) = (val[idx], mag[idx]);
                    let bound = round_off_bound(g, v, mg);
                    let (act, slope) = match (e.activation, &self.aux_in, e.aux) {
                        (Activation::Identity, ..) => (v, 1.0),
                        (Activation::Relu, ..) => (v.max(0.0), 1.0),
                        (Activation::Gelu, ..) => (gelu_tanh(v as f32) as f64, 1.13),
                        (Activation::DGelu, Some(x), Some(al)) => {
                            let grad =
                                gelu_tanh_grad(al.dtype.load(x, al.index(i, j, bi)) as f32) as f64;
                            (v * grad, grad.abs() + 1e-6)
                        }
                        (Activation::DGelu, ..) => {
                            return Err(format!("{name}: DGELU without aux input"))
                        }
                    };
                    if let (Some(aux), Some(al), true) = (got.aux, e.aux, self.aux_in.is_none()) {
                        let x = al.dtype.load(aux, al.index(i, j, bi));
                        if (x - v).abs() > bound {
                            return Err(format!(
                                "{name}: aux[{i},{j},{bi}] = {x}, exact {v}, bound {bound:e}"
                            ));
                        }
                    }
                    want_amax = want_amax.max(act.abs());
                    rows[bi * g.m + i].0 += act;
                    rows[bi * g.m + i].1 += slope * mg;
                    let want = act * e.scale_d;
                    let x = g.d.dtype.load(got.d, g.d.index(i, j, bi));
                    let out_u = g.d.dtype.epsilon() / 2.0;
                    let tol = (slope * bound + 2.0 * out_u * act.abs()) * e.scale_d.abs();
                    let within = (x - want).abs() <= tol; // false for NaN
                    if !within {
                        return Err(format!(
                            "{name}: D[{i},{j},{bi}] = {x}, exact {want}, error {:e} > bound {tol:e}",
                            (x - want).abs()
                        ));
                    }
                }
            }
        }
        if let (Some((src, bl)), Some(bg)) = (e.bgrad, got.bgrad) {
            self.check_bgrad(src, bl, bg, &rows)?;
        }
        if let Some(x) = got.amax {
            if (x - want_amax).abs() > 1e-3 * want_amax + 1e-6 {
                return Err(format!("{name}: amax_D = {x}, expected {want_amax}"));
            }
        }
        if o.sim {
            let mut host_d = d_before.to_vec();
            let mut host_aux = self.aux_in.clone().or_else(|| got.aux.map(|a| a.to_vec()));
            let mut host_bgrad = got.bgrad.map(|b| vec![0u8; b.len()]);
            let c = if in_place {
                CInput::InD
            } else {
                CInput::Buffer(&self.c)
            };
            let bufs = Buffers {
                a: &self.a,
                b: &self.b,
                c,
                d: &mut host_d,
                bias: self.bias.as_deref(),
                aux: host_aux.as_deref_mut(),
                bgrad: host_bgrad.as_deref_mut(),
            };
            let out = gemm(g, bufs).map_err(|e| format!("{name}: host recomputation: {e}"))?;
            if host_d != got.d {
                return Err(format!(
                    "{name}: D differs from sim_kernels::gemm recomputed on the host"
                ));
            }
            if host_aux.as_deref() != got.aux {
                return Err(format!("{name}: aux differs from the host recomputation"));
            }
            if host_bgrad.as_deref() != got.bgrad {
                return Err(format!(
                    "{name}: the bias gradient differs from the host recomputation"
                ));
            }
            if let Some(x) = got.amax {
                if x != out.amax_d as f32 as f64 {
                    return Err(format!(
                        "{name}: amax {x} differs from the host's {}",
                        out.amax_d
                    ));
                }
            }
        }
        Ok(())
    }

    /// Checks a bias gradient: row sums of the result (D), or sums over k of op(A) rows (A) or
    /// op(B) columns (B).
    fn check_bgrad(
        &self,
        src: BiasGrad,
        bl: BiasLayout,
        bg: &[u8],
        rows: &[(f64, f64)],
    ) -> Result<(), String> {
        let g = &self.g;
        let len = if src == BiasGrad::B { g.n } else { g.m };
        for bi in 0..g.batch {
            for r in 0..len {
                let (want, mg, k) = match src {
                    BiasGrad::D => (rows[bi * g.m + r].0, rows[bi * g.m + r].1, g.n),
                    BiasGrad::A | BiasGrad::B => {
                        let (mut s, mut m) = (0f64, 0f64);
                        for kk in 0..g.k {
                            let v = match (src, g.transa, g.transb) {
                                (BiasGrad::A, Op::N, _) => {
                                    g.a.dtype.load(&self.a, g.a.index(r, kk, bi))
                                }
                                (BiasGrad::A, Op::T, _) => {
                                    g.a.dtype.load(&self.a, g.a.index(kk, r, bi))
                                }
                                (_, _, Op::N) => g.b.dtype.load(&self.b, g.b.index(kk, r, bi)),
                                (_, _, Op::T) => g.b.dtype.load(&self.b, g.b.index(r, kk, bi)),
                            };
                            s += v;
                            m += v.abs();
                        }
                        (s, m, g.k)
                    }
                };
                let u_acc = g.compute.accumulator_unit_roundoff();
                let tol = (5.0 * (k as f64).sqrt() + 8.0) * u_acc * mg
                    + bl.dtype.epsilon() * want.abs()
                    + round_off_bound(g, 0.0, mg);
                let x = bl.dtype.load(bg, bi * bl.batch_stride + r);
                let within = (x - want).abs() <= tol;
                if !within {
                    return Err(format!(
                        "{}: bias gradient [{r},{bi}] = {x}, exact {want}, bound {tol:e}",
                        self.name
                    ));
                }
            }
        }
        Ok(())
    }
}

/// What a GEMM produced, copied back to the host.
struct Outputs<'a> {
    d: &'a [u8],
    aux: Option<&'a [u8]>,
    bgrad: Option<&'a [u8]>,
    amax: Option<f64>,
}

/// A `cudaDataType` for a `DType`.
fn cuda_type(t: DType) -> cudaDataType {
    match t {
        DType::F32 => CUDA_R_32F,
        DType::F64 => CUDA_R_64F,
        DType::F16 => CUDA_R_16F,
        DType::BF16 => CUDA_R_16BF,
        DType::E4M3 => CUDA_R_8F_E4M3,
        DType::E5M2 => CUDA_R_8F_E5M2,
        DType::I8 => CUDA_R_8I,
        DType::U8 => CUDA_R_8U,
        DType::I32 => CUDA_R_32I,
        DType::U32 => CUDA_R_32U,
        DType::I64 => CUDA_R_64I,
        DType::U64 => CUDA_R_64U,
    }
}

fn cublas_op(o: Op) -> cublasOperation_t {
    match o {
        Op::N => CUBLAS_OP_N,
        Op::T => CUBLAS_OP_T,
    }
}

/// A scalar as the bytes of type `t`.
fn scalar(t: DType, v: f64) -> [u8; 8] {
    let mut b = [0u8; 8];
    t.store(&mut b, 0, v);
    b
}

/// A cuBLAS-style problem (C is D): column-major, `ld = rows + pad`, batch strides with slack.
fn blas_problem(
    ab: DType,
    cd: DType,
    compute: Compute,
    (m, n, k): (usize, usize, usize),
    (ta, tb): (Op, Op),
    pad: usize,
    batch: usize,
) -> Gemm {
    let mut g = Gemm::simple(m, n, k, ab, cd, compute);
    g.transa = ta;
    g.transb = tb;
    g.batch = batch;
    let (ar, ac) = g.a_dims();
    let (br, bc) = g.b_dims();
    g.a = Layout::col(ab, ar + pad).strided((ar + pad) * ac + pad);
    g.b = Layout::col(ab, br + pad).strided((br + pad) * bc + 2 * pad);
    g.c = Layout::col(cd, m + pad).strided((m + pad) * n + pad);
    g.d = g.c;
    g.alpha = g.scale_type.round(0.75);
    g.beta = g.scale_type.round(-0.5);
    g
}

/// Which cuBLAS entry point a case uses.
#[derive(Clone, Copy, PartialEq)]
enum Entry {
    Sgemm,
    Hgemm,
    GemmEx(cublasComputeType_t),
    SgemmStridedBatched,
    GemmStridedBatchedEx,
    GemmBatchedEx,
}

/// Runs one cuBLAS case on `stream` and checks it.
fn run_blas(
    o: &Opts,
    h: cublasHandle_t,
    stream: cudaStream_t,
    job: &Job,
    entry: Entry,
) -> Result<(), String> {
    let g = &job.g;
    let (da, db, dc) = (
        DevBuf::upload(&job.a, stream)?,
        DevBuf::upload(&job.b, stream)?,
        DevBuf::upload(&job.c, stream)?,
    );
    let (alpha, beta) = (scalar(g.scale_type, g.alpha), scalar(g.scale_type, g.beta));
    let (ap, bp) = (
        alpha.as_ptr().cast::<c_void>(),
        beta.as_ptr().cast::<c_void>(),
    );
    let (m, n, k) = (g.m as i32, g.n as i32, g.k as i32);
    let (ta, tb) = (cublas_op(g.transa), cublas_op(g.transb));
    let (lda, ldb, ldc) = (g.a.ld as i32, g.b.ld as i32, g.c.ld as i32);
    let (sa, sb, sc) = (
        g.a.batch_stride as i64,
        g.b.batch_stride as i64,
        g.c.batch_stride as i64,
    );
    let (at, ct) = (cuda_type(g.a.dtype), cuda_type(g.c.dtype));
    let compute = match g.compute {
        Compute::F16 => CUBLAS_COMPUTE_16F,
        Compute::F64 => CUBLAS_COMPUTE_64F,
        Compute::F32FastTF32 => CUBLAS_COMPUTE_32F_FAST_TF32,
        Compute::F32Fast16BF => CUBLAS_COMPUTE_32F_FAST_16BF,
        Compute::F32Fast16F => CUBLAS_COMPUTE_32F_FAST_16F,
        Compute::I32 => CUBLAS_COMPUTE_32I,
        Compute::F32 => CUBLAS_COMPUTE_32F,
    };
    // Keeps the pointer arrays alive until the stream synchronised.
    let mut _arrays = Vec::new();
    match entry {
        Entry::Sgemm => blas!(cublasSgemm_v2(
            h,
            ta,
            tb,
            m,
            n,
            k,
            ap.cast(),
            da.ptr.cast(),
            lda,
            db.ptr.cast(),
            ldb,
            bp.cast(),
            dc.ptr.cast(),
            ldc
        )),
        Entry::Hgemm => blas!(cublasHgemm(
            h,
            ta,
            tb,
            m,
            n,
            k,
            ap.cast(),
            da.ptr.cast(),
            lda,
            db.ptr.cast(),
            ldb,
            bp.cast(),
            dc.ptr.cast(),
            ldc
        )),
        Entry::GemmEx(ct_raw) => blas!(cublasGemmEx(
            h,
            ta,
            tb,
            m,
            n,
            k,
            ap,
            da.ptr,
            at,
            lda,
            db.ptr,
            at,
            ldb,
            bp,
            dc.ptr,
            ct,
            ldc,
            ct_raw,
            CUBLAS_GEMM_DEFAULT_TENSOR_OP
        )),
        Entry::SgemmStridedBatched => blas!(cublasSgemmStridedBatched(
            h,
            ta,
            tb,
            m,
            n,
            k,
            ap.cast(),
            da.ptr.cast(),
            lda,
            sa,
            db.ptr.cast(),
            ldb,
            sb,
            bp.cast(),
            dc.ptr.cast(),
            ldc,
            sc,
            g.batch as i32
        )),
        Entry::GemmStridedBatchedEx => blas!(cublasGemmStridedBatchedEx(
            h,
            ta,
            tb,
            m,
            n,
            k,
            ap,
            da.ptr,
            at,
            lda,
            sa,
            db.ptr,
            at,
            ldb,
            sb,
            bp,
            dc.ptr,
            ct,
            ldc,
            sc,
            g.batch as i32,
            compute,
            CUBLAS_GEMM_DEFAULT
        )),
        Entry::GemmBatchedEx => {
            // Pointer arrays in device memory, one matrix per strided slot.
            let ptrs = |base: *mut c_void, stride: usize, t: DType| -> Vec<u8> {
                (0..g.batch)
                    .flat_map(|i| (base as usize + i * stride * t.size()).to_ne_bytes())
                    .collect()
            };
            let pa = DevBuf::upload(&ptrs(da.ptr, g.a.batch_stride, g.a.dtype), stream)?;
            let pb = DevBuf::upload(&ptrs(db.ptr, g.b.batch_stride, g.b.dtype), stream)?;
            let pc = DevBuf::upload(&ptrs(dc.ptr, g.c.batch_stride, g.c.dtype), stream)?;
            blas!(cublasGemmBatchedEx(
                h,
                ta,
                tb,
                m,
                n,
                k,
                ap,
                pa.ptr.cast(),
                at,
                lda,
                pb.ptr.cast(),
                at,
                ldb,
                bp,
                pc.ptr.cast(),
                ct,
                ldc,
                g.batch as i32,
                compute,
                CUBLAS_GEMM_DEFAULT
            ));
            _arrays.extend([pa, pb, pc]);
        }
    }
    let d = dc.download(stream)?;
    job.check(
        o,
        &job.c,
        &Outputs {
            d: &d,
            aux: None,
            bgrad: None,
            amax: None,
        },
        true,
    )
}

/// cuBLAS handle on a fresh stream; destroyed on drop.
struct Blas {
    h: cublasHandle_t,
    stream: cudaStream_t,
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created by the probe; nothing is in flight after its last synchronisation.
        unsafe {
            cublasDestroy_v2(self.h);
            cudaStreamDestroy(self.stream);
        }
    }
}

static GATE_OPEN: AtomicBool = AtomicBool::new(false);

unsafe extern "C" fn wait_for_gate(_: *mut c_void) {
    while !GATE_OPEN.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `gemm-cublas`: every cuBLAS GEMM entry point, status codes, streams, pointer modes.
pub fn cublas(args: &[String]) -> Result<(), String> {
    let o = opts(args)?;
    let mut stream: cudaStream_t = std::ptr::null_mut();
    ck!(cudaStreamCreateWithFlags(
        &mut stream,
        cudaStreamNonBlocking
    ));
    let mut h: cublasHandle_t = std::ptr::null_mut();
    blas!(cublasCreate_v2(&mut h));
    let b = Blas { h, stream };
    let mut got: cudaStream_t = 1 as cudaStream_t;
    blas!(cublasGetStream_v2(h, &mut got));
    if !got.is_null() {
        return Err(format!(
            "a new handle's stream is {got:?}, expected 0 (legacy)"
        ));
    }
    blas!(cublasSetStream_v2(h, stream));
    blas!(cublasGetStream_v2(h, &mut got));
    if got != stream {
        return Err("cublasGetStream_v2 does not return the stream just set".into());
    }
    let mut version = 0;
    blas!(cublasGetVersion_v2(h, &mut version));
    if version / 10000 != 12 {
        return Err(format!("cublasGetVersion_v2 = {version}, expected 12xxxx"));
    }

    // Every entry point, every transpose combination, padded leading dimensions.
    let mut seed = 100;
    let transposes = [
        (Op::N, Op::N),
        (Op::T, Op::N),
        (Op::N, Op::T),
        (Op::T, Op::T),
    ];
    for &(ta, tb) in &transposes {
        for &shape in &[(7, 5, 9), (33, 17, 300), (4, 3, 2000)] {
            seed += 1;
            let t = format!("{ta:?}{tb:?} {shape:?}");
            let g = blas_problem(DType::F32, DType::F32, Compute::F32, shape, (ta, tb), 2, 1);
            run_blas(
                &o,
                b.h,
                stream,
                &Job::new(&format!("Sgemm {t}"), g, seed),
                Entry::Sgemm,
            )?;
            let g = blas_problem(
                DType::BF16,
                DType::BF16,
                Compute::F32,
                shape,
                (ta, tb),
                3,
                1,
            );
            run_blas(
                &o,
                b.h,
                stream,
                &Job::new(&format!("GemmEx bf16 {t}"), g, seed),
                Entry::GemmEx(CUBLAS_COMPUTE_32F),
            )?;
        }
    }
    // fp16 inputs accumulating into an f32 C with beta = 1 (Apex's wgrad GEMM), passing the
    // legacy CUDA_R_32F as compute type as C callers of the export may.
    let mut g = blas_problem(
        DType::F16,
        DType::F32,
        Compute::F32,
        (16, 24, 64),
        (Op::N, Op::T),
        0,
        1,
    );
    g.beta = 1.0;
    run_blas(
        &o,
        b.h,
        stream,
        &Job::new("GemmEx f16->f32 legacy compute", g, 7),
        Entry::GemmEx(CUDA_R_32F),
    )?;
    let g = blas_problem(
        DType::F32,
        DType::F32,
        Compute::F32FastTF32,
        (12, 10, 96),
        (Op::T, Op::N),
        1,
        1,
    );
    run_blas(
        &o,
        b.h,
        stream,
        &Job::new("GemmEx tf32", g, 8),
        Entry::GemmEx(CUBLAS_COMPUTE_32F_FAST_TF32),
    )?;
    let g = blas_problem(
        DType::F16,
        DType::F16,
        Compute::F16,
        (9, 8, 40),
        (Op::N, Op::N),
        1,
        1,
    );
    run_blas(&o, b.h, stream, &Job::new("Hgemm", g, 9), Entry::Hgemm)?;
    let g = blas_problem(
        DType::F32,
        DType::F32,
        Compute::F32,
        (6, 5, 20),
        (Op::T, Op::N),
        1,
        3,
    );
    run_blas(
        &o,
        b.h,
        stream,
        &Job::new("SgemmStridedBatched", g, 10),
        Entry::SgemmStridedBatched,
    )?;
    let g = blas_problem(
        DType::BF16,
        DType::BF16,
        Compute::F32,
        (8, 6, 48),
        (Op::N, Op::T),
        2,
        4,
    );
    run_blas(
        &o,
        b.h,
        stream,
        &Job::new("GemmStridedBatchedEx bf16", g, 11),
        Entry::GemmStridedBatchedEx,
    )?;
    let g = blas_problem(
        DType::F16,
        DType::F16,
        Compute::F32,
        (5, 7, 33),
        (Op::T, Op::T),
        1,
        3,
    );
    run_blas(
        &o,
        b.h,
        stream,
        &Job::new("GemmBatchedEx f16", g, 12),
        Entry::GemmBatchedEx,
    )?;

    // TF32 math mode changes Sgemm's inputs (and only when set).
    blas!(cublasSetMathMode(b.h, CUBLAS_TF32_TENSOR_OP_MATH));
    let g = blas_problem(
        DType::F32,
        DType::F32,
        Compute::F32FastTF32,
        (8, 8, 64),
        (Op::N, Op::N),
        0,
        1,
    );
    run_blas(
        &o,
        b.h,
        stream,
        &Job::new("Sgemm under TF32 math mode", g, 13),
        Entry::Sgemm,
    )?;
    blas!(cublasSetMathMode(b.h, CUBLAS_DEFAULT_MATH));

    device_pointer_mode(&o, &b)?;
    runs_on_the_handles_stream(&b)?;
    statuses(&b)?;
    Ok(())
}

/// alpha/beta in device memory, read by the kernel.
fn device_pointer_mode(o: &Opts, b: &Blas) -> Result<(), String> {
    let g = blas_problem(
        DType::F32,
        DType::F32,
        Compute::F32,
        (6, 4, 10),
        (Op::N, Op::N),
        0,
        1,
    );
    let job = Job::new("Sgemm device pointer mode", g, 21);
    let alpha = DevBuf::upload(&scalar(DType::F32, g.alpha)[..4], b.stream)?;
    let beta = DevBuf::upload(&scalar(DType::F32, g.beta)[..4], b.stream)?;
    let (da, db, dc) = (
        DevBuf::upload(&job.a, b.stream)?,
        DevBuf::upload(&job.b, b.stream)?,
        DevBuf::upload(&job.c, b.stream)?,
    );
    blas!(cublasSetPointerMode_v2(b.h, CUBLAS_POINTER_MODE_DEVICE));
    let mut mode = CUBLAS_POINTER_MODE_HOST;
    blas!(cublasGetPointerMode_v2(b.h, &mut mode));
    blas!(cublasSgemm_v2(
        b.h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        6,
        4,
        10,
        alpha.ptr.cast(),
        da.ptr.cast(),
        6,
        db.ptr.cast(),
        10,
        beta.ptr.cast(),
        dc.ptr.cast(),
        6
    ));
    blas!(cublasSetPointerMode_v2(b.h, CUBLAS_POINTER_MODE_HOST));
    if mode != CUBLAS_POINTER_MODE_DEVICE {
        return Err("cublasGetPointerMode_v2 does not report DEVICE".into());
    }
    let d = dc.download(b.stream)?;
    job.check(
        o,
        &job.c,
        &Outputs {
            d: &d,
            aux: None,
            bgrad: None,
            amax: None,
        },
        true,
    )
}

/// The GEMM is enqueued on the handle's stream: while that stream is held by a host function,
/// a copy on another stream still sees D's old contents.
fn runs_on_the_handles_stream(b: &Blas) -> Result<(), String> {
    let (m, n, k) = (4usize, 4usize, 8usize);
    let ones = vec![1f32; m.max(n) * k]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect::<Vec<u8>>();
    let (da, db) = (
        DevBuf::upload(&ones, b.stream)?,
        DevBuf::upload(&ones, b.stream)?,
    );
    let dc = DevBuf::upload(&vec![0u8; m * n * 4], b.stream)?;
    ck!(cudaStreamSynchronize(b.stream));
    let mut other: cudaStream_t = std::ptr::null_mut();
    ck!(cudaStreamCreateWithFlags(&mut other, cudaStreamNonBlocking));
    // Pinned memory is allocated (and freed) outside the held interval: both synchronise.
    let mut pinned: *mut c_void = std::ptr::null_mut();
    ck!(cudaMallocHost(&mut pinned, m * n * 4));
    GATE_OPEN.store(false, Ordering::Release);
    ck!(cudaLaunchHostFunc(
        b.stream,
        Some(wait_for_gate),
        std::ptr::null_mut()
    ));
    let (alpha, beta) = (1f32, 0f32);
    let status = {
        // SAFETY: valid handle and device buffers of the stated sizes.
        unsafe {
            cublasSgemm_v2(
                b.h,
                CUBLAS_OP_N,
                CUBLAS_OP_N,
                m as i32,
                n as i32,
                k as i32,
                &alpha,
                da.ptr.cast(),
                m as i32,
                db.ptr.cast(),
                k as i32,
                &beta,
                dc.ptr.cast(),
                m as i32,
            )
        }
    };
    // Read D on the other stream into pinned memory while the handle's stream is held.
    let early = (|| -> Result<Vec<u8>, String> {
        ck!(cudaMemcpyAsync(
            pinned,
            dc.ptr,
            m * n * 4,
            cudaMemcpyDeviceToHost,
            other
        ));
        ck!(cudaStreamSynchronize(other));
        // SAFETY: `pinned` holds m*n*4 bytes, written by the finished copy.
        Ok(unsafe { std::slice::from_raw_parts(pinned.cast::<u8>(), m * n * 4) }.to_vec())
    })();
    GATE_OPEN.store(true, Ordering::Release);
    ck!(cudaFreeHost(pinned));
    if status != CUBLAS_STATUS_SUCCESS {
        return Err(format!("gated Sgemm returned {status}"));
    }
    let early = early?;
    let late = dc.download(b.stream)?;
    // SAFETY: created above, idle.
    unsafe { cudaStreamDestroy(other) };
    if early.iter().any(|&x| x != 0) {
        return Err("D changed before the handle's stream reached the GEMM".into());
    }
    let v = f32::from_ne_bytes([late[0], late[1], late[2], late[3]]);
    if v != k as f32 {
        return Err(format!("D[0,0] = {v} after the stream ran, expected {k}"));
    }
    Ok(())
}

/// Status codes of invalid calls.
fn statuses(b: &Blas) -> Result<(), String> {
    let buf = DevBuf::new(4096)?;
    let p = buf.ptr;
    let (one, zero) = (1f32, 0f32);
    let (op, oz) = (
        (&one as *const f32).cast::<c_void>(),
        (&zero as *const f32).cast::<c_void>(),
    );
    let null: cublasHandle_t = std::ptr::null_mut();
    blas!(
        cublasSgemm_v2(
            null,
            0,
            0,
            2,
            2,
            2,
            &one,
            p.cast(),
            2,
            p.cast(),
            2,
            &zero,
            p.cast(),
            2
        ),
        CUBLAS_STATUS_NOT_INITIALIZED
    );
    blas!(
        cublasSgemm_v2(
            b.h,
            0,
            0,
            -1,
            2,
            2,
            &one,
            p.cast(),
            2,
            p.cast(),
            2,
            &zero,
            p.cast(),
            2
        ),
        CUBLAS_STATUS_INVALID_VALUE
    );
    blas!(
        cublasSgemm_v2(
            b.h,
            0,
            0,
            4,
            2,
            2,
            &one,
            p.cast(),
            3,
            p.cast(),
            2,
            &zero,
            p.cast(),
            4
        ),
        CUBLAS_STATUS_INVALID_VALUE
    );
    blas!(
        cublasSgemm_v2(
            b.h,
            7,
            0,
            2,
            2,
            2,
            &one,
            p.cast(),
            2,
            p.cast(),
            2,
            &zero,
            p.cast(),
            2
        ),
        CUBLAS_STATUS_INVALID_VALUE
    );
    // FP8 is cuBLASLt-only; mixed A/B types are not in the GemmEx table.
    blas!(
        cublasGemmEx(
            b.h,
            1,
            0,
            16,
            16,
            16,
            op,
            p,
            CUDA_R_8F_E4M3,
            16,
            p,
            CUDA_R_8F_E4M3,
            16,
            oz,
            p,
            CUDA_R_16BF,
            16,
            CUBLAS_COMPUTE_32F,
            -1
        ),
        CUBLAS_STATUS_NOT_SUPPORTED
    );
    blas!(
        cublasGemmEx(
            b.h,
            0,
            0,
            4,
            4,
            4,
            op,
            p,
            CUDA_R_16F,
            4,
            p,
            CUDA_R_16BF,
            4,
            oz,
            p,
            CUDA_R_32F,
            4,
            CUBLAS_COMPUTE_32F,
            -1
        ),
        CUBLAS_STATUS_NOT_SUPPORTED
    );
    // m == 0 is a successful no-op.
    blas!(cublasSgemm_v2(
        b.h,
        0,
        0,
        0,
        2,
        2,
        &one,
        p.cast(),
        1,
        p.cast(),
        2,
        &zero,
        p.cast(),
        1
    ));
    // A destroyed handle.
    let mut h2: cublasHandle_t = std::ptr::null_mut();
    blas!(cublasCreate_v2(&mut h2));
    blas!(cublasDestroy_v2(h2));
    blas!(
        cublasSgemm_v2(
            h2,
            0,
            0,
            2,
            2,
            2,
            &one,
            p.cast(),
            2,
            p.cast(),
            2,
            &zero,
            p.cast(),
            2
        ),
        CUBLAS_STATUS_NOT_INITIALIZED
    );
    ck!(cudaStreamSynchronize(b.stream));
    Ok(())
}

// ---- cuBLASLt ------------------------------------------------------------------------------

/// cuBLASLt handle and stream; destroyed on drop.
struct Lt {
    h: cublasLtHandle_t,
    stream: cudaStream_t,
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: created by the probe; idle.
        unsafe {
            cublasLtDestroy(self.h);
            cudaStreamDestroy(self.stream);
        }
    }
}

/// Sets a descriptor attribute from a value.
fn set_desc<T: Copy>(
    d: cublasLtMatmulDesc_t,
    attr: cublasLtMatmulDescAttributes_t,
    v: T,
) -> Result<(), String> {
    blas!(cublasLtMatmulDescSetAttribute(
        d,
        attr,
        (&v as *const T).cast(),
        std::mem::size_of::<T>()
    ));
    Ok(())
}

fn set_layout<T: Copy>(
    l: cublasLtMatrixLayout_t,
    attr: cublasLtMatrixLayoutAttribute_t,
    v: T,
) -> Result<(), String> {
    blas!(cublasLtMatrixLayoutSetAttribute(
        l,
        attr,
        (&v as *const T).cast(),
        std::mem::size_of::<T>()
    ));
    Ok(())
}

/// Layout descriptors in caller-owned storage (the header's `cublasLtMatrixLayoutInit`).
struct Layouts {
    store: Box<[cublasLtMatrixLayoutOpaque_t; 4]>,
}

impl Layouts {
    fn ptr(&mut self, i: usize) -> cublasLtMatrixLayout_t {
        &mut self.store[i]
    }
}

fn lt_layout(
    store: cublasLtMatrixLayout_t,
    l: &Layout,
    rows: usize,
    cols: usize,
    batch: usize,
) -> Result<(), String> {
    blas!(cublasLtMatrixLayoutInit_internal(
        store,
        std::mem::size_of::<cublasLtMatrixLayoutOpaque_t>(),
        cuda_type(l.dtype),
        rows as u64,
        cols as u64,
        l.ld as i64
    ));
    if l.order == Order::Row {
        set_layout(
            store,
            CUBLASLT_MATRIX_LAYOUT_ORDER,
            CUBLASLT_ORDER_ROW as i32,
        )?;
    }
    if batch > 1 {
        set_layout(store, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, batch as i32)?;
        set_layout(
            store,
            CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            l.batch_stride as i64,
        )?;
    }
    Ok(())
}

/// What a cuBLASLt case needs besides its [`Job`].
#[derive(Default)]
struct LtExtras {
    epilogue: Option<cublasLtEpilogue_t>,
    /// A, B, C, D scales (FP8), as values uploaded to device memory.
    scales: [Option<f32>; 4],
    amax: bool,
    in_place: bool,
    device_scalars: bool,
}

/// Runs one cuBLASLt case with a descriptor made by `cublasLtMatmulDescCreate` and layouts
/// made by `*Init`, and checks it.
fn run_lt(o: &Opts, lt: &Lt, job: &Job, x: &LtExtras) -> Result<(), String> {
    let g = &job.g;
    let s = lt.stream;
    let compute = match g.compute {
        Compute::F16 => CUBLAS_COMPUTE_16F,
        Compute::F64 => CUBLAS_COMPUTE_64F,
        Compute::F32FastTF32 => CUBLAS_COMPUTE_32F_FAST_TF32,
        Compute::F32Fast16BF => CUBLAS_COMPUTE_32F_FAST_16BF,
        Compute::F32Fast16F => CUBLAS_COMPUTE_32F_FAST_16F,
        Compute::I32 => CUBLAS_COMPUTE_32I,
        Compute::F32 => CUBLAS_COMPUTE_32F,
    };
    let mut desc: cublasLtMatmulDesc_t = std::ptr::null_mut();
    blas!(cublasLtMatmulDescCreate(
        &mut desc,
        compute,
        cuda_type(g.scale_type)
    ));
    let r = (|| -> Result<(), String> {
        set_desc(
            desc,
            CUBLASLT_MATMUL_DESC_TRANSA,
            cublas_op(g.transa) as i32,
        )?;
        set_desc(
            desc,
            CUBLASLT_MATMUL_DESC_TRANSB,
            cublas_op(g.transb) as i32,
        )?;
        let mut ls = Layouts {
            store: Box::new([cublasLtMatrixLayoutOpaque_t::default(); 4]),
        };
        let (ar, ac) = g.a_dims();
        let (br, bc) = g.b_dims();
        lt_layout(ls.ptr(0), &g.a, ar, ac, g.batch)?;
        lt_layout(ls.ptr(1), &g.b, br, bc, g.batch)?;
        lt_layout(ls.ptr(2), &g.c, g.m, g.n, g.batch)?;
        lt_layout(ls.ptr(3), &g.d, g.m, g.n, g.batch)?;
        let (da, db, dc) = (
            DevBuf::upload(&job.a, s)?,
            DevBuf::upload(&job.b, s)?,
            DevBuf::upload(&job.c, s)?,
        );
        let d_init = if x.in_place {
            job.c.clone()
        } else {
            vec![0xffu8; g.d_bytes()]
        };
        let dd = if x.in_place {
            None
        } else {
            Some(DevBuf::upload(&d_init, s)?)
        };
        let d_ptr = dd.as_ref().map_or(dc.ptr, |d| d.ptr);
        let mut keep = Vec::new();
        if let Some(e) = x.epilogue {
            set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, e)?;
        }
        if let (Some(bias), Some(bl)) = (&job.bias, g.epilogue.bias) {
            let db = DevBuf::upload(bias, s)?;
            set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, db.ptr)?;
            set_desc(
                desc,
                CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                cuda_type(bl.dtype) as i32,
            )?;
            if g.batch > 1 {
                set_desc(
                    desc,
                    CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                    bl.batch_stride as i64,
                )?;
            }
            keep.push(db);
        }
        // A bias-gradient epilogue writes through the bias pointer.
        let bgrad = match g.epilogue.bgrad {
            Some((_, bl)) => {
                let dg = DevBuf::upload(&vec![0u8; g.bgrad_bytes()], s)?;
                set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, dg.ptr)?;
                set_desc(
                    desc,
                    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                    cuda_type(bl.dtype) as i32,
                )?;
                set_desc(
                    desc,
                    CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                    bl.batch_stride as i64,
                )?;
                Some(dg)
            }
            None => None,
        };
        let aux = match g.epilogue.aux {
            Some(al) => {
                let init = job
                    .aux_in
                    .clone()
                    .unwrap_or_else(|| vec![0u8; g.aux_bytes()]);
                let dx = DevBuf::upload(&init, s)?;
                set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, dx.ptr)?;
                set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, al.ld as i64)?;
                if g.batch > 1 {
                    set_desc(
                        desc,
                        CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE,
                        al.batch_stride as i64,
                    )?;
                }
                set_desc(
                    desc,
                    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                    cuda_type(al.dtype) as i32,
                )?;
                Some(dx)
            }
            None => None,
        };
        let attrs = [
            CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
            CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
            CUBLASLT_MATMUL_DESC_C_SCALE_POINTER,
            CUBLASLT_MATMUL_DESC_D_SCALE_POINTER,
        ];
        for (attr, v) in attrs.iter().zip(x.scales) {
            if let Some(v) = v {
                let dv = DevBuf::upload(&v.to_ne_bytes(), s)?;
                set_desc(desc, *attr, dv.ptr)?;
                keep.push(dv);
            }
        }
        let amax = if x.amax {
            let dv = DevBuf::upload(&[0u8; 4], s)?;
            set_desc(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, dv.ptr)?;
            Some(dv)
        } else {
            None
        };
        let (alpha, beta) = (scalar(g.scale_type, g.alpha), scalar(g.scale_type, g.beta));
        let sz = g.scale_type.size();
        let (dalpha, dbeta) = (
            DevBuf::upload(&alpha[..sz], s)?,
            DevBuf::upload(&beta[..sz], s)?,
        );
        let (ap, bp): (*const c_void, *const c_void) = if x.device_scalars {
            set_desc(
                desc,
                CUBLASLT_MATMUL_DESC_POINTER_MODE,
                CUBLASLT_POINTER_MODE_DEVICE as i32,
            )?;
            (dalpha.ptr, dbeta.ptr)
        } else {
            (alpha.as_ptr().cast(), beta.as_ptr().cast())
        };
        // Heuristic, as PyTorch does before every cublasLtMatmul.
        let mut pref: cublasLtMatmulPreference_t = std::ptr::null_mut();
        blas!(cublasLtMatmulPreferenceCreate(&mut pref));
        let ws: u64 = 1 << 22;
        blas!(cublasLtMatmulPreferenceSetAttribute(
            pref,
            CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&ws as *const u64).cast(),
            8
        ));
        let mut result = cublasLtMatmulHeuristicResult_t::default();
        let mut count = 0;
        blas!(cublasLtMatmulAlgoGetHeuristic(
            lt.h,
            desc,
            ls.ptr(0),
            ls.ptr(1),
            ls.ptr(2),
            ls.ptr(3),
            pref,
            1,
            &mut result,
            &mut count
        ));
        blas!(cublasLtMatmulPreferenceDestroy(pref));
        if count != 1 || result.state != CUBLAS_STATUS_SUCCESS {
            return Err(format!(
                "{}: heuristic returned {count} results, state {}",
                job.name, result.state
            ));
        }
        let c_ptr = if x.in_place { d_ptr } else { dc.ptr };
        blas!(cublasLtMatmul(
            lt.h,
            desc,
            ap,
            da.ptr,
            ls.ptr(0),
            db.ptr,
            ls.ptr(1),
            bp,
            c_ptr,
            ls.ptr(2),
            d_ptr,
            ls.ptr(3),
            &result.algo,
            std::ptr::null_mut(),
            0,
            s
        ));
        let d = match &dd {
            Some(d) => d.download(s)?,
            None => dc.download(s)?,
        };
        let aux_host = match &aux {
            Some(a) => Some(a.download(s)?),
            None => None,
        };
        let bgrad_host = match &bgrad {
            Some(b) => Some(b.download(s)?),
            None => None,
        };
        let amax_host = match &amax {
            Some(a) => {
                let v = a.download(s)?;
                Some(f32::from_ne_bytes([v[0], v[1], v[2], v[3]]) as f64)
            }
            None => None,
        };
        let mut g2 = *g;
        let sc = x.scales.map(|v| v.map_or(1.0, f64::from));
        (
            g2.epilogue.scale_a,
            g2.epilogue.scale_b,
            g2.epilogue.scale_c,
            g2.epilogue.scale_d,
        ) = (sc[0], sc[1], sc[2], sc[3]);
        let scaled = Job {
            name: job.name.clone(),
            g: g2,
            a: job.a.clone(),
            b: job.b.clone(),
            c: job.c.clone(),
            bias: job.bias.clone(),
            aux_in: job.aux_in.clone(),
        };
        let outputs = Outputs {
            d: &d,
            aux: aux_host.as_deref(),
            bgrad: bgrad_host.as_deref(),
            amax: amax_host,
        };
        scaled.check(o, &d_init, &outputs, x.in_place)
    })();
    blas!(cublasLtMatmulDescDestroy(desc));
    r
}

/// A cuBLASLt problem with separate C and D layouts.
fn lt_problem(
    ab: DType,
    c: DType,
    d: DType,
    (m, n, k): (usize, usize, usize),
    (ta, tb): (Op, Op),
    pad: usize,
    batch: usize,
) -> Gemm {
    let mut g = blas_problem(ab, c, Compute::F32, (m, n, k), (ta, tb), pad, batch);
    g.d = Layout::col(d, m + 2 * pad).strided((m + 2 * pad) * n + pad);
    g
}

/// `gemm-lt`: cuBLASLt matmuls (types, transposes, batches, epilogues, FP8), descriptors.
pub fn lt(args: &[String]) -> Result<(), String> {
    let o = opts(args)?;
    let mut stream: cudaStream_t = std::ptr::null_mut();
    ck!(cudaStreamCreateWithFlags(
        &mut stream,
        cudaStreamNonBlocking
    ));
    let mut h: cublasLtHandle_t = std::ptr::null_mut();
    blas!(cublasLtCreate(&mut h));
    let lt = Lt { h, stream };
    // SAFETY: a plain query.
    let v = unsafe { cublasLtGetVersion() };
    if v / 10000 != 12 {
        return Err(format!("cublasLtGetVersion = {v}"));
    }
    let none = LtExtras::default();
    let transposes = [
        (Op::N, Op::N),
        (Op::T, Op::N),
        (Op::N, Op::T),
        (Op::T, Op::T),
    ];
    let mut seed = 500;
    for &(ta, tb) in &transposes {
        seed += 1;
        let t = format!("{ta:?}{tb:?}");
        let g = lt_problem(
            DType::F32,
            DType::F32,
            DType::F32,
            (11, 7, 130),
            (ta, tb),
            1,
            1,
        );
        run_lt(&o, &lt, &Job::new(&format!("Lt f32 {t}"), g, seed), &none)?;
        let g = lt_problem(
            DType::BF16,
            DType::BF16,
            DType::BF16,
            (16, 9, 72),
            (ta, tb),
            2,
            1,
        );
        run_lt(&o, &lt, &Job::new(&format!("Lt bf16 {t}"), g, seed), &none)?;
        let g = lt_problem(
            DType::F16,
            DType::F32,
            DType::F32,
            (5, 12, 40),
            (ta, tb),
            0,
            1,
        );
        run_lt(
            &o,
            &lt,
            &Job::new(&format!("Lt f16->f32 {t}"), g, seed),
            &none,
        )?;
    }
    // In place (C == D), strided batch, device pointer mode.
    let g = blas_problem(
        DType::BF16,
        DType::BF16,
        Compute::F32,
        (12, 8, 64),
        (Op::T, Op::N),
        1,
        3,
    );
    run_lt(
        &o,
        &lt,
        &Job::new("Lt bf16 batched in place", g, 601),
        &LtExtras {
            in_place: true,
            ..LtExtras::default()
        },
    )?;
    let g = lt_problem(
        DType::F32,
        DType::F32,
        DType::F32,
        (6, 6, 50),
        (Op::N, Op::N),
        0,
        2,
    );
    run_lt(
        &o,
        &lt,
        &Job::new("Lt device scalars", g, 602),
        &LtExtras {
            device_scalars: true,
            ..LtExtras::default()
        },
    )?;
    // Row-major layouts.
    let mut g = lt_problem(
        DType::F32,
        DType::F32,
        DType::F32,
        (7, 5, 24),
        (Op::N, Op::N),
        0,
        1,
    );
    g.a = Layout {
        order: Order::Row,
        ld: 24 + 3,
        ..g.a
    };
    g.d = Layout {
        order: Order::Row,
        ld: 5,
        ..g.d
    };
    run_lt(&o, &lt, &Job::new("Lt row-major A and D", g, 603), &none)?;

    // Epilogues: bias + GELU with aux (TE's forward), bias + RELU.
    let mut g = lt_problem(
        DType::BF16,
        DType::BF16,
        DType::BF16,
        (24, 10, 96),
        (Op::T, Op::N),
        0,
        1,
    );
    g.beta = 0.0;
    g.epilogue.bias = Some(BiasLayout {
        dtype: DType::BF16,
        batch_stride: 0,
    });
    g.epilogue.activation = Activation::Gelu;
    g.epilogue.aux = Some(Layout::col(DType::BF16, 32));
    let x = LtExtras {
        epilogue: Some(CUBLASLT_EPILOGUE_GELU_AUX_BIAS),
        ..LtExtras::default()
    };
    run_lt(&o, &lt, &Job::new("Lt bias+GELU_AUX", g, 611), &x)?;
    let mut g = lt_problem(
        DType::F16,
        DType::F16,
        DType::F16,
        (16, 12, 48),
        (Op::N, Op::N),
        1,
        2,
    );
    g.epilogue.bias = Some(BiasLayout {
        dtype: DType::F16,
        batch_stride: 16,
    });
    g.epilogue.activation = Activation::Relu;
    let x = LtExtras {
        epilogue: Some(CUBLASLT_EPILOGUE_RELU_BIAS),
        ..LtExtras::default()
    };
    run_lt(&o, &lt, &Job::new("Lt batched bias+RELU", g, 612), &x)?;

    // Backward epilogues (TE's dgrad of fc2 and wgrad): DGELU_BGRAD, BGRADB, BGRADA.
    let mut g = lt_problem(
        DType::BF16,
        DType::BF16,
        DType::BF16,
        (24, 10, 40),
        (Op::N, Op::N),
        0,
        2,
    );
    g.beta = 0.0;
    g.epilogue.activation = Activation::DGelu;
    g.epilogue.aux = Some(Layout::col(DType::BF16, 24).strided(24 * 10));
    g.epilogue.bgrad = Some((
        BiasGrad::D,
        BiasLayout {
            dtype: DType::BF16,
            batch_stride: 24,
        },
    ));
    let x = LtExtras {
        epilogue: Some(CUBLASLT_EPILOGUE_DGELU_BGRAD),
        ..LtExtras::default()
    };
    run_lt(&o, &lt, &Job::new("Lt DGELU_BGRAD", g, 613), &x)?;
    let mut g = lt_problem(
        DType::BF16,
        DType::F32,
        DType::F32,
        (16, 12, 64),
        (Op::N, Op::T),
        0,
        1,
    );
    g.epilogue.bgrad = Some((
        BiasGrad::B,
        BiasLayout {
            dtype: DType::F32,
            batch_stride: 0,
        },
    ));
    let x = LtExtras {
        epilogue: Some(CUBLASLT_EPILOGUE_BGRADB),
        ..LtExtras::default()
    };
    run_lt(&o, &lt, &Job::new("Lt BGRADB", g, 614), &x)?;
    let mut g = lt_problem(
        DType::F16,
        DType::F16,
        DType::F16,
        (8, 6, 300),
        (Op::T, Op::N),
        0,
        1,
    );
    g.epilogue.bgrad = Some((
        BiasGrad::A,
        BiasLayout {
            dtype: DType::F16,
            batch_stride: 0,
        },
    ));
    let x = LtExtras {
        epilogue: Some(CUBLASLT_EPILOGUE_BGRADA),
        ..LtExtras::default()
    };
    run_lt(&o, &lt, &Job::new("Lt BGRADA", g, 615), &x)?;

    // FP8 (TN): E4M3 x E4M3 -> E4M3 with scales and amax (TE's FP8 forward), -> bf16 + bias,
    // E5M2 x E4M3 -> f32 (a backward GEMM).
    let mut g = lt_problem(
        DType::E4M3,
        DType::BF16,
        DType::E4M3,
        (32, 16, 64),
        (Op::T, Op::N),
        0,
        1,
    );
    g.beta = 0.0;
    let x = LtExtras {
        scales: [Some(0.5), Some(2.0), None, Some(4.0)],
        amax: true,
        ..LtExtras::default()
    };
    run_lt(&o, &lt, &Job::new("Lt fp8 e4m3 scaled + amax", g, 621), &x)?;
    let mut g = lt_problem(
        DType::E4M3,
        DType::BF16,
        DType::BF16,
        (16, 8, 128),
        (Op::T, Op::N),
        0,
        1,
    );
    g.epilogue.bias = Some(BiasLayout {
        dtype: DType::BF16,
        batch_stride: 0,
    });
    let x = LtExtras {
        epilogue: Some(CUBLASLT_EPILOGUE_BIAS),
        scales: [Some(0.25), Some(0.5), None, None],
        amax: true,
        ..LtExtras::default()
    };
    run_lt(&o, &lt, &Job::new("Lt fp8 -> bf16 + bias", g, 622), &x)?;
    let mut g = lt_problem(
        DType::E5M2,
        DType::F32,
        DType::F32,
        (8, 8, 64),
        (Op::T, Op::N),
        0,
        1,
    );
    g.b.dtype = DType::E4M3;
    run_lt(
        &o,
        &lt,
        &Job::new("Lt fp8 e5m2 x e4m3 -> f32", g, 623),
        &LtExtras {
            scales: [Some(2.0), Some(1.0), None, None],
            ..LtExtras::default()
        },
    )?;

    descriptor_rules(&lt)?;
    Ok(())
}

/// Attribute sizes, FP8's TN rule, descriptors read at matmul time, Init storage sizes.
fn descriptor_rules(lt: &Lt) -> Result<(), String> {
    let mut desc = cublasLtMatmulDescOpaque_t::default();
    let d: cublasLtMatmulDesc_t = &mut desc;
    blas!(cublasLtMatmulDescInit_internal(
        d,
        std::mem::size_of::<cublasLtMatmulDescOpaque_t>(),
        CUBLAS_COMPUTE_32F,
        CUDA_R_32F
    ));
    blas!(
        cublasLtMatmulDescInit_internal(d, 16, CUBLAS_COMPUTE_32F, CUDA_R_32F),
        CUBLAS_STATUS_ALLOC_FAILED
    );
    blas!(cublasLtMatmulDescInit_internal(
        d,
        std::mem::size_of::<cublasLtMatmulDescOpaque_t>(),
        CUBLAS_COMPUTE_32F,
        CUDA_R_32F
    ));
    let mut needed = 0usize;
    blas!(cublasLtMatmulDescGetAttribute(
        d,
        CUBLASLT_MATMUL_DESC_BIAS_POINTER,
        std::ptr::null_mut(),
        0,
        &mut needed
    ));
    if needed != 8 {
        return Err(format!("BIAS_POINTER size reported {needed}, expected 8"));
    }
    blas!(
        cublasLtMatmulDescGetAttribute(
            d,
            CUBLASLT_MATMUL_DESC_BIAS_POINTER,
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut()
        ),
        CUBLAS_STATUS_INVALID_VALUE
    );
    let mut epi: u32 = 0;
    let mut written = 0usize;
    blas!(cublasLtMatmulDescGetAttribute(
        d,
        CUBLASLT_MATMUL_DESC_EPILOGUE,
        (&mut epi as *mut u32).cast(),
        4,
        &mut written
    ));
    if epi != CUBLASLT_EPILOGUE_DEFAULT || written != 4 {
        return Err(format!("default epilogue {epi} ({written} bytes)"));
    }
    let wide: u64 = 2;
    blas!(
        cublasLtMatmulDescSetAttribute(
            d,
            CUBLASLT_MATMUL_DESC_TRANSA,
            (&wide as *const u64).cast(),
            8
        ),
        CUBLAS_STATUS_INVALID_VALUE
    );
    blas!(
        cublasLtMatmulDescGetAttribute(
            d,
            CUBLASLT_MATMUL_DESC_TRANSA,
            (&mut epi as *mut u32).cast(),
            8,
            &mut written
        ),
        CUBLAS_STATUS_INVALID_VALUE
    );

    // FP8 needs TN.
    let mut ls = Layouts {
        store: Box::new([cublasLtMatrixLayoutOpaque_t::default(); 4]),
    };
    let (m, n, k) = (16u64, 16u64, 32u64);
    for (i, (t, r, c)) in [
        (CUDA_R_8F_E4M3, m, k),
        (CUDA_R_8F_E4M3, k, n),
        (CUDA_R_16BF, m, n),
        (CUDA_R_16BF, m, n),
    ]
    .into_iter()
    .enumerate()
    {
        blas!(cublasLtMatrixLayoutInit_internal(
            ls.ptr(i),
            64,
            t,
            r,
            c,
            r as i64
        ));
    }
    let mut res = cublasLtMatmulHeuristicResult_t::default();
    let mut count = 0;
    blas!(
        cublasLtMatmulAlgoGetHeuristic(
            lt.h,
            d,
            ls.ptr(0),
            ls.ptr(1),
            ls.ptr(2),
            ls.ptr(3),
            std::ptr::null_mut(),
            1,
            &mut res,
            &mut count
        ),
        CUBLAS_STATUS_NOT_SUPPORTED
    );
    let buf = DevBuf::new(1 << 14)?;
    let p = buf.ptr;
    let (one, zero) = (1f32, 0f32);
    let (op, oz) = (
        (&one as *const f32).cast::<c_void>(),
        (&zero as *const f32).cast::<c_void>(),
    );
    blas!(
        cublasLtMatmul(
            lt.h,
            d,
            op,
            p,
            ls.ptr(0),
            p,
            ls.ptr(1),
            oz,
            p,
            ls.ptr(2),
            p,
            ls.ptr(3),
            std::ptr::null(),
            std::ptr::null_mut(),
            0,
            lt.stream
        ),
        CUBLAS_STATUS_NOT_SUPPORTED
    );
    // A (stored k x m) with TRANSA = T set now is read by the next call: supported.
    blas!(cublasLtMatrixLayoutInit_internal(
        ls.ptr(0),
        64,
        CUDA_R_8F_E4M3,
        k,
        m,
        k as i64
    ));
    set_desc(d, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T as i32)?;
    blas!(cublasLtMatmulAlgoGetHeuristic(
        lt.h,
        d,
        ls.ptr(0),
        ls.ptr(1),
        ls.ptr(2),
        ls.ptr(3),
        std::ptr::null_mut(),
        1,
        &mut res,
        &mut count
    ));
    // Mismatched shapes and scale pointers on non-FP8 inputs.
    blas!(cublasLtMatrixLayoutInit_internal(
        ls.ptr(0),
        64,
        CUDA_R_16BF,
        k,
        m + 1,
        k as i64
    ));
    blas!(
        cublasLtMatmul(
            lt.h,
            d,
            op,
            p,
            ls.ptr(0),
            p,
            ls.ptr(1),
            oz,
            p,
            ls.ptr(2),
            p,
            ls.ptr(3),
            std::ptr::null(),
            std::ptr::null_mut(),
            0,
            lt.stream
        ),
        CUBLAS_STATUS_INVALID_VALUE
    );
    blas!(cublasLtMatrixLayoutInit_internal(
        ls.ptr(0),
        64,
        CUDA_R_16BF,
        k,
        m,
        k as i64
    ));
    blas!(cublasLtMatrixLayoutInit_internal(
        ls.ptr(1),
        64,
        CUDA_R_16BF,
        k,
        n,
        k as i64
    ));
    set_desc(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p)?;
    blas!(
        cublasLtMatmul(
            lt.h,
            d,
            op,
            p,
            ls.ptr(0),
            p,
            ls.ptr(1),
            oz,
            p,
            ls.ptr(2),
            p,
            ls.ptr(3),
            std::ptr::null(),
            std::ptr::null_mut(),
            0,
            lt.stream
        ),
        CUBLAS_STATUS_INVALID_VALUE
    );
    set_desc(
        d,
        CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
        std::ptr::null_mut::<c_void>(),
    )?;
    blas!(cublasLtMatmul(
        lt.h,
        d,
        op,
        p,
        ls.ptr(0),
        p,
        ls.ptr(1),
        oz,
        p,
        ls.ptr(2),
        p,
        ls.ptr(3),
        std::ptr::null(),
        std::ptr::null_mut(),
        0,
        lt.stream
    ));
    // Bitmask and gradient epilogues are not simulated.
    set_desc(
        d,
        CUBLASLT_MATMUL_DESC_EPILOGUE,
        CUBLASLT_EPILOGUE_DRELU_BGRAD,
    )?;
    blas!(
        cublasLtMatmul(
            lt.h,
            d,
            op,
            p,
            ls.ptr(0),
            p,
            ls.ptr(1),
            oz,
            p,
            ls.ptr(2),
            p,
            ls.ptr(3),
            std::ptr::null(),
            std::ptr::null_mut(),
            0,
            lt.stream
        ),
        CUBLAS_STATUS_NOT_SUPPORTED
    );
    let null: cublasLtHandle_t = std::ptr::null_mut();
    blas!(
        cublasLtMatmul(
            null,
            d,
            op,
            p,
            ls.ptr(0),
            p,
            ls.ptr(1),
            oz,
            p,
            ls.ptr(2),
            p,
            ls.ptr(3),
            std::ptr::null(),
            std::ptr::null_mut(),
            0,
            lt.stream
        ),
        CUBLAS_STATUS_NOT_INITIALIZED
    );
    ck!(cudaStreamSynchronize(lt.stream));
    Ok(())
}

/// `gemm-fault`: a GEMM on memory the device cannot access (pageable host memory) is accepted
/// by cuBLAS, then faults on its stream: the sticky `cudaErrorIllegalAddress`.
pub fn fault(args: &[String]) -> Result<(), String> {
    opts(args)?;
    let mut stream: cudaStream_t = std::ptr::null_mut();
    ck!(cudaStreamCreateWithFlags(
        &mut stream,
        cudaStreamNonBlocking
    ));
    let mut h: cublasHandle_t = std::ptr::null_mut();
    blas!(cublasCreate_v2(&mut h));
    blas!(cublasSetStream_v2(h, stream));
    let host = vec![1f32; 64];
    let dev = DevBuf::new(64 * 4)?;
    let (one, zero) = (1f32, 0f32);
    blas!(cublasSgemm_v2(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        8,
        8,
        8,
        &one,
        host.as_ptr(),
        8,
        dev.ptr.cast(),
        8,
        &zero,
        dev.ptr.cast(),
        8
    ));
    // SAFETY: a plain synchronisation.
    let code = unsafe { cudaStreamSynchronize(stream) };
    if code != cudaErrorIllegalAddress {
        return Err(format!("cudaStreamSynchronize after the faulting GEMM returned {code}, expected {cudaErrorIllegalAddress}"));
    }
    std::mem::forget(dev); // The context is broken: freeing would report the sticky error.
    Ok(())
}
