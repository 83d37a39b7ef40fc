//! Every matmul of the model, through cuBLAS (`cublasGemmEx`, `cublasGemmStridedBatchedEx`) or
//! cuBLASLt (`cublasLtMatmul`), column-major as the libraries see it.
//!
//! Row-major `[rows, cols]` activations and PyTorch-style `[out, in]` weights are column-major
//! `[cols, rows]` matrices to BLAS, so a linear layer `Y = X W^T` is the "TN" GEMM
//! `Y_cm[out, T] = W_cm^T X_cm`, the layout Hopper's FP8 kernels require. FP8 GEMMs always run
//! on cuBLASLt with per-tensor scale pointers (`A_SCALE_POINTER`, `B_SCALE_POINTER`: the inverse
//! quantisation scales). Compute type is always `CUBLAS_COMPUTE_32F` (no TF32).

use core::ffi::{c_int, c_longlong, c_void};

use anyhow::{anyhow, bail, Result};
use cuda_dyn::abi::cublas::*;
use cuda_dyn::abi::cublaslt::*;
use cuda_dyn::abi::library_types::CUDA_R_32F;
use cuda_dyn::cublas::*;
use cuda_dyn::cublaslt::*;

use crate::cli::GemmPath;
use crate::cuda::{Buf, DType, Stream};

/// Fails unless a cuBLAS/cuBLASLt call returned `CUBLAS_STATUS_SUCCESS`.
macro_rules! blas {
    ($e:expr) => {{
        // SAFETY: a cuBLAS/cuBLASLt call with live handles, descriptors and device buffers
        // covering the matrices described.
        let st = unsafe { $e };
        if st != CUBLAS_STATUS_SUCCESS {
            return Err(anyhow!("{} returned status {st}", stringify!($e)));
        }
    }};
}

/// A matrix operand: buffer (starting at the first element), leading dimension and batch
/// stride, in elements.
#[derive(Debug, Clone, Copy)]
pub struct Mat {
    /// Buffer from the first element on.
    pub buf: Buf,
    /// Leading dimension.
    pub ld: usize,
    /// Elements between consecutive matrices of a batch.
    pub stride: usize,
}

impl Mat {
    /// A single matrix with leading dimension `ld`.
    pub fn new(buf: Buf, ld: usize) -> Mat {
        Mat { buf, ld, stride: 0 }
    }
    /// A strided batch.
    pub fn batched(buf: Buf, ld: usize, stride: usize) -> Mat {
        Mat { buf, ld, stride }
    }
}

/// One GEMM: `D = alpha * scale_a * scale_b * op(A) op(B) + beta * D`.
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    /// Transpose A.
    pub ta: bool,
    /// Transpose B.
    pub tb: bool,
    /// Rows of op(A) and D.
    pub m: usize,
    /// Columns of op(B) and D.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// Batch count.
    pub batch: usize,
    /// Alpha.
    pub alpha: f32,
    /// Beta (1 accumulates into D).
    pub beta: f32,
    /// A.
    pub a: Mat,
    /// B.
    pub b: Mat,
    /// C and D (in place).
    pub d: Mat,
    /// FP8 scale of A (device f32), or none.
    pub scale_a: Option<Buf>,
    /// FP8 scale of B (device f32), or none.
    pub scale_b: Option<Buf>,
}

impl Gemm {
    /// A plain (unbatched, unscaled) GEMM.
    #[allow(clippy::too_many_arguments)]
    pub fn new(ta: bool, tb: bool, m: usize, n: usize, k: usize, a: Mat, b: Mat, d: Mat) -> Gemm {
        Gemm {
            ta,
            tb,
            m,
            n,
            k,
            batch: 1,
            alpha: 1.0,
            beta: 0.0,
            a,
            b,
            d,
            scale_a: None,
            scale_b: None,
        }
    }

    fn a_dims(&self) -> (usize, usize) {
        if self.ta {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        }
    }
    fn b_dims(&self) -> (usize, usize) {
        if self.tb {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        }
    }

    /// Checks that every operand's buffer covers what the GEMM touches.
    fn check(&self) -> Result<()> {
        let span = |m: &Mat, rows: usize, cols: usize| {
            if rows == 0 || cols == 0 {
                0
            } else {
                (self.batch - 1) * m.stride + (cols - 1) * m.ld + rows
            }
        };
        let (ar, ac) = self.a_dims();
        let (br, bc) = self.b_dims();
        for (name, m, r, c) in [
            ("A", &self.a, ar, ac),
            ("B", &self.b, br, bc),
            ("D", &self.d, self.m, self.n),
        ] {
            if m.ld < r.max(1) || span(m, r, c) > m.buf.len {
                bail!(
                    "GEMM {name}: {r}x{c} (ld {}, stride {}, batch {}) does not fit {} elements",
                    m.ld,
                    m.stride,
                    self.batch,
                    m.buf.len
                );
            }
        }
        Ok(())
    }
}

/// The rank's cuBLAS and cuBLASLt handles, bound to its stream.
pub struct Blas {
    cublas: usize,
    lt: usize,
    stream: Stream,
    path: GemmPath,
}

fn op(t: bool) -> cublasOperation_t {
    if t {
        CUBLAS_OP_T
    } else {
        CUBLAS_OP_N
    }
}

fn is_fp8(d: DType) -> bool {
    matches!(d, DType::E4M3 | DType::E5M2)
}

impl Blas {
    /// Creates the handles.
    pub fn new(stream: Stream, path: GemmPath) -> Result<Blas> {
        let mut h: cublasHandle_t = std::ptr::null_mut();
        blas!(cublasCreate_v2(&mut h));
        blas!(cublasSetStream_v2(h, stream.raw()));
        let mut lt: cublasLtHandle_t = std::ptr::null_mut();
        blas!(cublasLtCreate(&mut lt));
        Ok(Blas {
            cublas: h as usize,
            lt: lt as usize,
            stream,
            path,
        })
    }

    /// Enqueues the GEMM on the stream.
    pub fn run(&self, g: &Gemm) -> Result<()> {
        g.check()?;
        if is_fp8(g.a.buf.dt) || self.path == GemmPath::Lt {
            self.lt(g)
        } else {
            self.cublas(g)
        }
    }

    fn cublas(&self, g: &Gemm) -> Result<()> {
        let h = self.cublas as cublasHandle_t;
        let (alpha, beta) = (g.alpha, g.beta);
        let ap = (&alpha as *const f32).cast::<c_void>();
        let bp = (&beta as *const f32).cast::<c_void>();
        let i = |v: usize| v as c_int;
        if g.batch == 1 {
            blas!(cublasGemmEx(
                h,
                op(g.ta),
                op(g.tb),
                i(g.m),
                i(g.n),
                i(g.k),
                ap,
                g.a.buf.ptr(),
                g.a.buf.dt.cuda(),
                i(g.a.ld),
                g.b.buf.ptr(),
                g.b.buf.dt.cuda(),
                i(g.b.ld),
                bp,
                g.d.buf.ptr(),
                g.d.buf.dt.cuda(),
                i(g.d.ld),
                CUBLAS_COMPUTE_32F,
                CUBLAS_GEMM_DEFAULT
            ));
        } else {
            let l = |v: usize| v as c_longlong;
            blas!(cublasGemmStridedBatchedEx(
                h,
                op(g.ta),
                op(g.tb),
                i(g.m),
                i(g.n),
                i(g.k),
                ap,
                g.a.buf.ptr(),
                g.a.buf.dt.cuda(),
                i(g.a.ld),
                l(g.a.stride),
                g.b.buf.ptr(),
                g.b.buf.dt.cuda(),
                i(g.b.ld),
                l(g.b.stride),
                bp,
                g.d.buf.ptr(),
                g.d.buf.dt.cuda(),
                i(g.d.ld),
                l(g.d.stride),
                i(g.batch),
                CUBLAS_COMPUTE_32F,
                CUBLAS_GEMM_DEFAULT
            ));
        }
        Ok(())
    }

    fn lt(&self, g: &Gemm) -> Result<()> {
        let mut desc: cublasLtMatmulDesc_t = std::ptr::null_mut();
        blas!(cublasLtMatmulDescCreate(
            &mut desc,
            CUBLAS_COMPUTE_32F,
            CUDA_R_32F
        ));
        let mut layouts: Vec<cublasLtMatrixLayout_t> = Vec::new();
        let mut pref: cublasLtMatmulPreference_t = std::ptr::null_mut();
        let r = self.lt_with(g, desc, &mut layouts, &mut pref);
        // SAFETY: descriptors created above (null ones are skipped).
        unsafe {
            for l in layouts {
                cublasLtMatrixLayoutDestroy(l);
            }
            if !pref.is_null() {
                cublasLtMatmulPreferenceDestroy(pref);
            }
            cublasLtMatmulDescDestroy(desc);
        }
        r
    }

    fn lt_with(
        &self,
        g: &Gemm,
        desc: cublasLtMatmulDesc_t,
        layouts: &mut Vec<cublasLtMatrixLayout_t>,
        pref: &mut cublasLtMatmulPreference_t,
    ) -> Result<()> {
        fn set_desc<T: Copy>(
            d: cublasLtMatmulDesc_t,
            attr: cublasLtMatmulDescAttributes_t,
            v: T,
        ) -> Result<()> {
            blas!(cublasLtMatmulDescSetAttribute(
                d,
                attr,
                (&v as *const T).cast(),
                std::mem::size_of::<T>()
            ));
            Ok(())
        }
        set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, op(g.ta) as i32)?;
        set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, op(g.tb) as i32)?;
        if let Some(s) = g.scale_a {
            set_desc(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, s.ptr())?;
        }
        if let Some(s) = g.scale_b {
            set_desc(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, s.ptr())?;
        }
        let (ar, ac) = g.a_dims();
        let (br, bc) = g.b_dims();
        for (m, rows, cols) in [(&g.a, ar, ac), (&g.b, br, bc), (&g.d, g.m, g.n)] {
            let mut l: cublasLtMatrixLayout_t = std::ptr::null_mut();
            blas!(cublasLtMatrixLayoutCreate(
                &mut l,
                m.buf.dt.cuda(),
                rows as u64,
                cols as u64,
                m.ld as i64
            ));
            layouts.push(l);
            if g.batch > 1 {
                let count = g.batch as i32;
                let stride = m.stride as i64;
                blas!(cublasLtMatrixLayoutSetAttribute(
                    l,
                    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    (&count as *const i32).cast(),
                    4
                ));
                blas!(cublasLtMatrixLayoutSetAttribute(
                    l,
                    CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    (&stride as *const i64).cast(),
                    8
                ));
            }
        }
        let (la, lb, ld) = (layouts[0], layouts[1], layouts[2]);
        // The heuristic query PyTorch makes before every cublasLtMatmul.
        blas!(cublasLtMatmulPreferenceCreate(pref));
        let ws: u64 = 0;
        blas!(cublasLtMatmulPreferenceSetAttribute(
            *pref,
            CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&ws as *const u64).cast(),
            8
        ));
        let mut result = cublasLtMatmulHeuristicResult_t::default();
        let mut count: c_int = 0;
        let lt = self.lt as cublasLtHandle_t;
        blas!(cublasLtMatmulAlgoGetHeuristic(
            lt,
            desc,
            la,
            lb,
            ld,
            ld,
            *pref,
            1,
            &mut result,
            &mut count
        ));
        if count < 1 {
            bail!("cublasLtMatmulAlgoGetHeuristic found no algorithm");
        }
        let (alpha, beta) = (g.alpha, g.beta);
        blas!(cublasLtMatmul(
            lt,
            desc,
            (&alpha as *const f32).cast(),
            g.a.buf.ptr(),
            la,
            g.b.buf.ptr(),
            lb,
            (&beta as *const f32).cast(),
            g.d.buf.ptr(),
            ld,
            g.d.buf.ptr(),
            ld,
            &result.algo,
            std::ptr::null_mut(),
            0,
            self.stream.raw()
        ));
        Ok(())
    }
}
