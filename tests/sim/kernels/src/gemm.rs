//! The simulated GEMM: `D = epilogue(alpha * op(A) op(B) + beta * C)`, over byte slices.
//!
//! This is the one engine behind every simulated cuBLAS and cuBLASLt GEMM. It is public and
//! pure so that a test can recompute a captured GEMM on host buffers and get the simulated
//! stack's result *bitwise*: [`gemm`] with the same [`Gemm`] and the same bytes always produces
//! the same bytes.
//!
//! # Operands
//! Matrices are column-major (or row-major, [`Order::Row`], as cuBLASLt allows) with a leading
//! dimension `ld` (elements between consecutive columns, rows for row order) and a batch stride
//! (elements between consecutive matrices of a strided batch; 0 repeats one matrix). `op(A)` is
//! `m x k`: A is stored `m x k` for [`Op::N`] and `k x m` for [`Op::T`] (`CUBLAS_OP_C` is `T`
//! for real types); `op(B)` is `k x n`; C and D are `m x n`. Element types are any [`DType`];
//! C may be absent ([`CInput::None`]: beta is treated as 0 and C is never read) or live in D's
//! buffer ([`CInput::InD`], cuBLAS's in-place `C == D`).
//!
//! # Algorithm (the exact order of every rounding)
//! 1. **Inputs.** Each element of op(A) and op(B) is loaded exactly, then rounded to the
//!    compute type's *input* format: f16 for `32F_FAST_16F`, bf16 for `32F_FAST_16BF`, TF32
//!    (10 explicit mantissa bits, round to nearest even) for `32F_FAST_TF32`, f16 for `16F`;
//!    otherwise kept. They are then held in the *accumulator* format: f32 for the 16F and 32F
//!    families, f64 for 64F and 32I (exact for 8-bit integers).
//! 2. **Plan** ([`plan`]), from the shape only (`m, n, k, batch`) and the accumulator:
//!    * `lanes` L = 16 for f16/f32 accumulators, 8 for f64 (one SIMD register group, or the
//!      k-interleave of a tensor-core fragment);
//!    * the K tile `kt` = `k` when `k <= 256` (one tile), 128 when `k <= 2048`, else 256; the
//!      K range is cut into `tiles = ceil(k / kt)` consecutive tiles (the last may be short);
//!    * the split-K factor `splits`: with `out_tiles = ceil(m/128) * ceil(n/128) * batch`
//!      (128x128 output tiles per CTA, [`SM_COUNT`] = 132 SMs), `splits = 1` when
//!      `out_tiles >= SM_COUNT / 2` or `tiles < 4`; otherwise
//!      `min(ceil(SM_COUNT / out_tiles), tiles / 2, 16)` (at least 2 tiles per split).
//! 3. **Dot product** of row `i` of op(A) and column `j` of op(B), for each output element:
//!    * *tile sum*: L lane accumulators start at +0; element `t0 + q` of a tile starting at
//!      `t0` goes to lane `q mod L`, lanes accumulate in increasing `q` as `lane = lane + a*b`
//!      (product rounded to the accumulator, then the sum; no FMA; a 16F accumulator rounds the
//!      sum to f16 after every add). The lanes are then reduced as a butterfly tree:
//!      `lane[i] += lane[i + w]` for `w = L/2, L/4, ..., 1`; the tile sum is `lane[0]`;
//!    * *split partial*: split `s` owns tiles `s, s + splits, s + 2*splits, ...` (interleaved
//!      over K, so a contiguous K shard never coincides with one split) and sums their tile
//!      sums left to right, starting from the first tile sum;
//!    * *total*: split partials summed left to right (`s = 0, 1, ...`) in the accumulator.
//! 4. **Epilogue**, every operation rounded to the *scale type* (f32 for the 32F family, f16 for
//!    16F, f64 for 64F; f32 arithmetic for 16-bit scale types, then rounded):
//!    `alpha' = alpha * scale_a * scale_b` (left to right), `v = alpha' * total`; when C is
//!    read, `v = v + (beta * scale_c) * C[i,j]`; `v = v + bias[i]`; the aux output (GELU_AUX)
//!    stores `v` rounded to its type (for DGELU the aux matrix is instead read: `v = v *
//!    gelu'(aux[i,j])`, GELU' evaluated in f32); then RELU (`max(v, 0)`) or GELU (tanh form,
//!    evaluated in f32); `amax_D = max |v|` over the output (NaNs ignored); finally
//!    `D[i,j] = round_D(v * scale_d)` (the product in the scale type, then one rounding to D's
//!    type, saturating for FP8).
//! 5. **Bias gradients** ([`BiasGrad`]), per batch entry: each sum (a row of op(A) over k, a
//!    column of op(B) over k, or a row of the step-4 values `v` over n) is a dot product with
//!    ones under the plan of its own length (`plan(1, 1, len, 1, compute)`), in the
//!    accumulator, then rounded once to the bias type.
//!
//! The plan never reproduces a K-sharded computation: one tile spans all of a small K (so the
//! lanes interleave both halves of K), larger K has at least 3 tiles, summed left to right or in
//! interleaved splits. A GEMM over `k/2 + k/2` summed afterwards therefore associates the
//! products differently from the unsharded one and differs in its last bits, within round-off.
//!
//! Integers (`32I` compute, I8 inputs) are summed exactly in f64 and the result saturates
//! (real cuBLAS wraps on i32 overflow).

use crate::dtype::DType;
use half::{bf16, f16};

/// The number of SMs of the simulated device (an H100 SXM), used by [`plan`].
pub const SM_COUNT: usize = 132;

/// `op()` of an operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// As stored.
    N,
    /// Transposed (also `CUBLAS_OP_C` for real types).
    T,
}

impl Op {
    /// From a raw `cublasOperation_t`: N=0, T=1, C=2 (= T for real types).
    pub fn from_cublas(raw: u32) -> Option<Op> {
        match raw {
            0 => Some(Op::N),
            1 | 2 => Some(Op::T),
            _ => None,
        }
    }
}

/// Memory order of a matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Order {
    /// Column-major: `ld` separates columns.
    Col,
    /// Row-major: `ld` separates rows.
    Row,
}

/// How a stored matrix lies in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Element type.
    pub dtype: DType,
    /// Leading dimension, in elements.
    pub ld: usize,
    /// Memory order.
    pub order: Order,
    /// Elements from one matrix of a strided batch to the next (0: the same matrix).
    pub batch_stride: usize,
}

impl Layout {
    /// A column-major layout, no batch stride.
    pub fn col(dtype: DType, ld: usize) -> Layout {
        Layout {
            dtype,
            ld,
            order: Order::Col,
            batch_stride: 0,
        }
    }

    /// The same layout with a batch stride.
    pub fn strided(self, batch_stride: usize) -> Layout {
        Layout {
            batch_stride,
            ..self
        }
    }

    /// Element index of `(r, c)` in matrix `b` of the batch.
    #[inline]
    pub fn index(&self, r: usize, c: usize, b: usize) -> usize {
        let within = match self.order {
            Order::Col => r + c * self.ld,
            Order::Row => r * self.ld + c,
        };
        b * self.batch_stride + within
    }

    /// Whether `ld` is valid for a `rows x cols` matrix (`ld >= rows` in column order,
    /// `ld >= cols` in row order; at least 1).
    pub fn ld_valid(&self, rows: usize, cols: usize) -> bool {
        let min = match self.order {
            Order::Col => rows,
            Order::Row => cols,
        };
        self.ld >= min.max(1)
    }

    /// Bytes from the first element to the end of the last one of `batch` matrices of
    /// `rows x cols` (0 when empty): what a kernel reads or writes.
    pub fn span_bytes(&self, rows: usize, cols: usize, batch: usize) -> usize {
        if rows == 0 || cols == 0 || batch == 0 {
            return 0;
        }
        (self.index(rows - 1, cols - 1, batch - 1) + 1) * self.dtype.size()
    }
}

/// A `cublasComputeType_t`: how products are accumulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compute {
    /// `CUBLAS_COMPUTE_16F`: f16 inputs, f16 accumulation (every add rounded to f16).
    F16,
    /// `CUBLAS_COMPUTE_32F`: f32 accumulation, inputs as given.
    F32,
    /// `CUBLAS_COMPUTE_32F_FAST_16F`: inputs rounded to f16, f32 accumulation.
    F32Fast16F,
    /// `CUBLAS_COMPUTE_32F_FAST_16BF`: inputs rounded to bf16, f32 accumulation.
    F32Fast16BF,
    /// `CUBLAS_COMPUTE_32F_FAST_TF32`: inputs rounded to TF32, f32 accumulation.
    F32FastTF32,
    /// `CUBLAS_COMPUTE_64F`.
    F64,
    /// `CUBLAS_COMPUTE_32I`: integer inputs, exact accumulation.
    I32,
}

impl Compute {
    /// From a raw `cublasComputeType_t` (pedantic variants map to their plain type) or a legacy
    /// `cudaDataType` passed as a compute type (`CUDA_R_32F`=0, `R_64F`=1, `R_16F`=2,
    /// `R_32I`=10), as `cublasMigrateComputeType` in `cublas_api.h` would map it.
    pub fn from_raw(raw: u32) -> Option<Compute> {
        Some(match raw {
            64 | 65 | 2 => Compute::F16,
            68 | 69 | 0 => Compute::F32,
            74 => Compute::F32Fast16F,
            75 => Compute::F32Fast16BF,
            77 => Compute::F32FastTF32,
            70 | 71 | 1 => Compute::F64,
            72 | 73 | 10 => Compute::I32,
            _ => return None,
        })
    }

    /// The scale type (of alpha and beta) cuBLAS uses with this compute type.
    pub fn default_scale_type(self) -> DType {
        match self {
            Compute::F16 => DType::F16,
            Compute::F64 => DType::F64,
            Compute::I32 => DType::I32,
            _ => DType::F32,
        }
    }

    /// Unit roundoff of the accumulator (0 for exact integer accumulation).
    pub fn accumulator_unit_roundoff(self) -> f64 {
        match self {
            Compute::F16 => DType::F16.epsilon() / 2.0,
            Compute::F64 => DType::F64.epsilon() / 2.0,
            Compute::I32 => 0.0,
            _ => DType::F32.epsilon() / 2.0,
        }
    }

    /// Unit roundoff of the rounding applied to inputs (0 when inputs are kept as given).
    pub fn input_unit_roundoff(self) -> f64 {
        match self {
            Compute::F16 | Compute::F32Fast16F => 2f64.powi(-11),
            Compute::F32Fast16BF => 2f64.powi(-8),
            Compute::F32FastTF32 => 2f64.powi(-11),
            _ => 0.0,
        }
    }

    fn accumulator(self) -> Accum {
        match self {
            Compute::F16 => Accum::F16,
            Compute::F64 | Compute::I32 => Accum::F64,
            _ => Accum::F32,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Accum {
    F16,
    F32,
    F64,
}

/// Pointwise activation of the epilogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// None.
    #[default]
    Identity,
    /// `max(x, 0)`.
    Relu,
    /// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    Gelu,
    /// GELU's gradient (DGELU): the value is multiplied by `gelu'(x)`, `x` being the forward
    /// pre-activation read from the aux matrix, which is an *input* here.
    DGelu,
}

/// What a bias-gradient epilogue reduces (into the bias vector, which is then an output).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BiasGrad {
    /// BGRADA: `sum_k op(A)[i, k]`, m values (inputs as held by the accumulator, no alpha).
    A,
    /// BGRADB: `sum_k op(B)[k, j]`, n values.
    B,
    /// DRELU/DGELU_BGRAD: `sum_j D[i, j]` of the values before `scale_d` and the output
    /// rounding, m values.
    D,
}

/// A bias vector (length m, packed) added to every column of the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BiasLayout {
    /// Element type.
    pub dtype: DType,
    /// Elements between the bias vectors of consecutive batch entries.
    pub batch_stride: usize,
}

/// Everything after the accumulation (cuBLASLt's epilogue, FP8 scaling).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Epilogue {
    /// Bias added before the activation.
    pub bias: Option<BiasLayout>,
    /// Activation.
    pub activation: Activation,
    /// Where the pre-activation value is stored (GELU_AUX), as an `m x n` matrix; for
    /// [`Activation::DGelu`], where the forward pre-activation is read.
    pub aux: Option<Layout>,
    /// A bias gradient to compute, written with this layout.
    pub bgrad: Option<(BiasGrad, BiasLayout)>,
    /// Scale of A (dequantisation factor), multiplied into alpha.
    pub scale_a: f64,
    /// Scale of B, multiplied into alpha.
    pub scale_b: f64,
    /// Scale of C, multiplied into beta.
    pub scale_c: f64,
    /// Scale of D, applied after amax and before the output rounding.
    pub scale_d: f64,
}

impl Default for Epilogue {
    fn default() -> Self {
        Epilogue {
            bias: None,
            activation: Activation::Identity,
            aux: None,
            bgrad: None,
            scale_a: 1.0,
            scale_b: 1.0,
            scale_c: 1.0,
            scale_d: 1.0,
        }
    }
}

/// A GEMM problem: shapes, layouts, types, scalars.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    /// Rows of op(A), C and D.
    pub m: usize,
    /// Columns of op(B), C and D.
    pub n: usize,
    /// Columns of op(A), rows of op(B).
    pub k: usize,
    /// Number of matrices in the strided batch.
    pub batch: usize,
    /// op of A.
    pub transa: Op,
    /// op of B.
    pub transb: Op,
    /// Layout of A as stored.
    pub a: Layout,
    /// Layout of B as stored.
    pub b: Layout,
    /// Layout of C.
    pub c: Layout,
    /// Layout of D.
    pub d: Layout,
    /// Compute type.
    pub compute: Compute,
    /// Type of alpha and beta (and of every epilogue operation).
    pub scale_type: DType,
    /// alpha, already a value of the scale type.
    pub alpha: f64,
    /// beta, already a value of the scale type.
    pub beta: f64,
    /// Epilogue.
    pub epilogue: Epilogue,
}

impl Gemm {
    /// A plain column-major GEMM with leading dimensions equal to the row counts: a starting
    /// point for tests and probes.
    pub fn simple(m: usize, n: usize, k: usize, ab: DType, cd: DType, compute: Compute) -> Gemm {
        Gemm {
            m,
            n,
            k,
            batch: 1,
            transa: Op::N,
            transb: Op::N,
            a: Layout::col(ab, m.max(1)),
            b: Layout::col(ab, k.max(1)),
            c: Layout::col(cd, m.max(1)),
            d: Layout::col(cd, m.max(1)),
            compute,
            scale_type: compute.default_scale_type(),
            alpha: 1.0,
            beta: 0.0,
            epilogue: Epilogue::default(),
        }
    }

    /// `(rows, cols)` of A as stored.
    pub fn a_dims(&self) -> (usize, usize) {
        match self.transa {
            Op::N => (self.m, self.k),
            Op::T => (self.k, self.m),
        }
    }

    /// `(rows, cols)` of B as stored.
    pub fn b_dims(&self) -> (usize, usize) {
        match self.transb {
            Op::N => (self.k, self.n),
            Op::T => (self.n, self.k),
        }
    }

    /// Bytes of A the GEMM reads.
    pub fn a_bytes(&self) -> usize {
        let (r, c) = self.a_dims();
        if self.m == 0 || self.n == 0 {
            return 0;
        }
        self.a.span_bytes(r, c, self.batch)
    }

    /// Bytes of B the GEMM reads.
    pub fn b_bytes(&self) -> usize {
        let (r, c) = self.b_dims();
        if self.m == 0 || self.n == 0 {
            return 0;
        }
        self.b.span_bytes(r, c, self.batch)
    }

    /// Bytes of C the GEMM reads (when beta is nonzero).
    pub fn c_bytes(&self) -> usize {
        self.c.span_bytes(self.m, self.n, self.batch)
    }

    /// Bytes of D the GEMM writes.
    pub fn d_bytes(&self) -> usize {
        self.d.span_bytes(self.m, self.n, self.batch)
    }

    /// Bytes of the aux output written, if any.
    pub fn aux_bytes(&self) -> usize {
        self.epilogue
            .aux
            .map_or(0, |l| l.span_bytes(self.m, self.n, self.batch))
    }

    /// Bytes of the bias vector(s) read, if any.
    pub fn bias_bytes(&self) -> usize {
        match self.epilogue.bias {
            Some(b) if self.m > 0 && self.n > 0 && self.batch > 0 => {
                ((self.batch - 1) * b.batch_stride + self.m) * b.dtype.size()
            }
            _ => 0,
        }
    }

    /// Bytes of the bias gradient written, if any.
    pub fn bgrad_bytes(&self) -> usize {
        match self.epilogue.bgrad {
            Some((src, l)) if self.m > 0 && self.n > 0 && self.batch > 0 => {
                let len = if src == BiasGrad::B { self.n } else { self.m };
                ((self.batch - 1) * l.batch_stride + len) * l.dtype.size()
            }
            _ => 0,
        }
    }

    /// The leading dimensions that real cuBLAS would reject (`ld < rows`).
    pub fn check_lds(&self) -> Result<(), GemmError> {
        let (ar, ac) = self.a_dims();
        let (br, bc) = self.b_dims();
        let ok = self.a.ld_valid(ar, ac)
            && self.b.ld_valid(br, bc)
            && self.c.ld_valid(self.m, self.n)
            && self.d.ld_valid(self.m, self.n)
            && self.epilogue.aux.is_none_or(|l| l.ld_valid(self.m, self.n));
        if ok {
            Ok(())
        } else {
            Err(GemmError::LeadingDimension)
        }
    }
}

/// Where C comes from.
#[derive(Debug, Clone, Copy)]
pub enum CInput<'a> {
    /// No C: the result is `alpha * op(A) op(B)` whatever beta is (beta == 0 in cuBLAS terms).
    None,
    /// A separate buffer with [`Gemm::c`]'s layout.
    Buffer(&'a [u8]),
    /// C is D (in place): read from the D buffer, with [`Gemm::d`]'s layout, which must equal
    /// [`Gemm::c`].
    InD,
}

/// The buffers of one call.
#[derive(Debug)]
pub struct Buffers<'a> {
    /// A.
    pub a: &'a [u8],
    /// B.
    pub b: &'a [u8],
    /// C.
    pub c: CInput<'a>,
    /// D (written).
    pub d: &'a mut [u8],
    /// The bias vector when the epilogue has one.
    pub bias: Option<&'a [u8]>,
    /// The aux matrix when the epilogue has one (an output, or DGELU's input).
    pub aux: Option<&'a mut [u8]>,
    /// The bias gradient output when the epilogue computes one.
    pub bgrad: Option<&'a mut [u8]>,
}

/// Results besides D.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// `max |v|` over the outputs before `scale_d` (0 when empty).
    pub amax_d: f64,
}

/// Why a GEMM could not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmError {
    /// A buffer is shorter than the layout needs (names the operand).
    BufferTooSmall(&'static str),
    /// A leading dimension is smaller than the matrix it describes.
    LeadingDimension,
    /// In-place C with a layout different from D's.
    InPlaceLayout,
    /// The epilogue needs a buffer that was not given.
    MissingBuffer(&'static str),
}

impl std::fmt::Display for GemmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GemmError::BufferTooSmall(w) => write!(f, "buffer {w} is smaller than its layout"),
            GemmError::LeadingDimension => write!(f, "a leading dimension is too small"),
            GemmError::InPlaceLayout => write!(f, "in-place C needs C's layout equal to D's"),
            GemmError::MissingBuffer(w) => write!(f, "the epilogue needs buffer {w}"),
        }
    }
}

impl std::error::Error for GemmError {}

/// The accumulation plan of a problem: see the module documentation, step 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Lane accumulators per tile.
    pub lanes: usize,
    /// K elements per tile.
    pub k_tile: usize,
    /// Number of K tiles.
    pub tiles: usize,
    /// Split-K factor.
    pub splits: usize,
}

/// The plan [`gemm`] uses for a problem.
pub fn plan(m: usize, n: usize, k: usize, batch: usize, compute: Compute) -> Plan {
    let lanes = match compute.accumulator() {
        Accum::F64 => 8,
        _ => 16,
    };
    let k_tile = if k <= 256 {
        k.max(1)
    } else if k <= 2048 {
        128
    } else {
        256
    };
    let tiles = k.div_ceil(k_tile);
    let out_tiles = (m.div_ceil(128) * n.div_ceil(128) * batch).max(1);
    let splits = if out_tiles >= SM_COUNT / 2 || tiles < 4 {
        1
    } else {
        SM_COUNT.div_ceil(out_tiles).min(tiles / 2).clamp(1, 16)
    };
    Plan {
        lanes,
        k_tile,
        tiles,
        splits,
    }
}

/// Rounds an f32 to TF32 (10 explicit mantissa bits), nearest even; NaN and infinities pass.
#[inline]
pub fn round_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let bits = x.to_bits();
    let lsb = (bits >> 13) & 1;
    f32::from_bits(bits.wrapping_add(0xfff + lsb) & !0x1fff)
}

/// Rounds `x` to `t` and back, fast for the float types.
#[inline]
fn round_to(t: DType, x: f64) -> f64 {
    match t {
        DType::F64 => x,
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        other => other.round(x),
    }
}

/// Arithmetic in the scale type: each result rounded once to it. 16-bit types compute in f32
/// (exact for products of 16-bit values) and round.
#[derive(Clone, Copy)]
struct ScaleArith(DType);

impl ScaleArith {
    #[inline]
    fn mul(self, x: f64, y: f64) -> f64 {
        match self.0 {
            DType::F64 => x * y,
            DType::F32 => (x as f32 * y as f32) as f64,
            DType::F16 | DType::BF16 => round_to(self.0, (x as f32 * y as f32) as f64),
            t => t.round(x * y),
        }
    }
    #[inline]
    fn add(self, x: f64, y: f64) -> f64 {
        match self.0 {
            DType::F64 => x + y,
            DType::F32 => (x as f32 + y as f32) as f64,
            DType::F16 | DType::BF16 => round_to(self.0, (x as f32 + y as f32) as f64),
            t => t.round(x + y),
        }
    }
}

/// GELU, tanh approximation, evaluated in f32.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// The derivative of [`gelu_tanh`], evaluated in f32.
#[inline]
pub fn gelu_tanh_grad(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const C: f32 = 0.044_715;
    let t = (SQRT_2_OVER_PI * (x + C * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * C * x * x)
}

/// Accumulator arithmetic: the element type and how a lane is updated.
trait Acc {
    type T: Copy + Default + Into<f64>;
    fn from_f64(x: f64) -> Self::T;
    fn mac(acc: Self::T, a: Self::T, b: Self::T) -> Self::T;
    fn add(x: Self::T, y: Self::T) -> Self::T;
}

struct AccF32;
impl Acc for AccF32 {
    type T = f32;
    #[inline]
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
    #[inline(always)]
    fn mac(acc: f32, a: f32, b: f32) -> f32 {
        acc + a * b
    }
    #[inline(always)]
    fn add(x: f32, y: f32) -> f32 {
        x + y
    }
}

struct AccF16;
impl AccF16 {
    #[inline(always)]
    fn r(x: f32) -> f32 {
        f16::from_f32(x).to_f32()
    }
}
impl Acc for AccF16 {
    type T = f32;
    #[inline]
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
    #[inline(always)]
    fn mac(acc: f32, a: f32, b: f32) -> f32 {
        // f16 x f16 is exact in f32; the sum is rounded to f32, then to f16.
        Self::r(acc + a * b)
    }
    #[inline(always)]
    fn add(x: f32, y: f32) -> f32 {
        Self::r(x + y)
    }
}

struct AccF64;
impl Acc for AccF64 {
    type T = f64;
    #[inline]
    fn from_f64(x: f64) -> f64 {
        x
    }
    #[inline(always)]
    fn mac(acc: f64, a: f64, b: f64) -> f64 {
        acc + a * b
    }
    #[inline(always)]
    fn add(x: f64, y: f64) -> f64 {
        x + y
    }
}

/// One tile: L lanes, element q to lane q mod L, butterfly reduction.
#[inline]
fn tile_sum<A: Acc, const L: usize>(a: &[A::T], b: &[A::T]) -> A::T {
    let mut lanes = [A::T::default(); L];
    let (ac, ar) = a.as_chunks::<L>();
    let (bc, br) = b.as_chunks::<L>();
    for (x, y) in ac.iter().zip(bc) {
        for l in 0..L {
            lanes[l] = A::mac(lanes[l], x[l], y[l]);
        }
    }
    for (l, (x, y)) in ar.iter().zip(br).enumerate() {
        lanes[l] = A::mac(lanes[l], *x, *y);
    }
    let mut w = L / 2;
    while w >= 1 {
        for i in 0..w {
            lanes[i] = A::add(lanes[i], lanes[i + w]);
        }
        w /= 2;
    }
    lanes[0]
}

/// The full dot product of one output element under `plan`.
#[inline]
fn dot<A: Acc, const L: usize>(a: &[A::T], b: &[A::T], p: &Plan) -> A::T {
    let k = a.len();
    if k == 0 {
        return A::T::default();
    }
    let tile = |t: usize| {
        let lo = t * p.k_tile;
        let hi = (lo + p.k_tile).min(k);
        tile_sum::<A, L>(&a[lo..hi], &b[lo..hi])
    };
    let mut total: Option<A::T> = None;
    for s in 0..p.splits {
        let mut part: Option<A::T> = None;
        let mut t = s;
        while t < p.tiles {
            let ts = tile(t);
            part = Some(part.map_or(ts, |acc| A::add(acc, ts)));
            t += p.splits;
        }
        if let Some(ps) = part {
            total = Some(total.map_or(ps, |acc| A::add(acc, ps)));
        }
    }
    total.unwrap_or_default()
}

/// How inputs are rounded before accumulation.
#[inline]
fn input_round(compute: Compute, x: f64) -> f64 {
    match compute {
        Compute::F16 | Compute::F32Fast16F => f16::from_f64(x).to_f64(),
        Compute::F32Fast16BF => bf16::from_f64(x).to_f64(),
        Compute::F32FastTF32 => round_tf32(x as f32) as f64,
        _ => x,
    }
}

/// Packs op(A) of batch entry `bi` as `m` rows of `k` and op(B) as `n` rows of `k`.
fn pack<A: Acc>(g: &Gemm, a: &[u8], b: &[u8], bi: usize, pa: &mut Vec<A::T>, pb: &mut Vec<A::T>) {
    let (m, n, k) = (g.m, g.n, g.k);
    pa.clear();
    pb.clear();
    let conv = |t: DType, bytes: &[u8], idx: usize| {
        A::from_f64(input_round(g.compute, t.load(bytes, idx)))
    };
    for i in 0..m {
        for kk in 0..k {
            let idx = match g.transa {
                Op::N => g.a.index(i, kk, bi),
                Op::T => g.a.index(kk, i, bi),
            };
            pa.push(conv(g.a.dtype, a, idx));
        }
    }
    for j in 0..n {
        for kk in 0..k {
            let idx = match g.transb {
                Op::N => g.b.index(kk, j, bi),
                Op::T => g.b.index(j, kk, bi),
            };
            pb.push(conv(g.b.dtype, b, idx));
        }
    }
}

/// Runs the GEMM described by `g` on `bufs`. Deterministic: the same problem and bytes give the
/// same result bits. See the module documentation for the exact algorithm.
pub fn gemm(g: &Gemm, bufs: Buffers<'_>) -> Result<Outcome, GemmError> {
    g.check_lds()?;
    if bufs.a.len() < g.a_bytes() {
        return Err(GemmError::BufferTooSmall("A"));
    }
    if bufs.b.len() < g.b_bytes() {
        return Err(GemmError::BufferTooSmall("B"));
    }
    if bufs.d.len() < g.d_bytes() {
        return Err(GemmError::BufferTooSmall("D"));
    }
    match bufs.c {
        CInput::Buffer(c) if g.beta != 0.0 && c.len() < g.c_bytes() => {
            return Err(GemmError::BufferTooSmall("C"))
        }
        CInput::InD if g.beta != 0.0 && g.c != g.d => return Err(GemmError::InPlaceLayout),
        _ => {}
    }
    let bias = match (g.epilogue.bias, bufs.bias) {
        (None, _) => None,
        (Some(_), None) => return Err(GemmError::MissingBuffer("bias")),
        (Some(_), Some(buf)) if buf.len() < g.bias_bytes() => {
            return Err(GemmError::BufferTooSmall("bias"))
        }
        (Some(l), Some(buf)) => Some((l, buf)),
    };
    let aux = match (g.epilogue.aux, bufs.aux) {
        (None, _) => None,
        (Some(_), None) => return Err(GemmError::MissingBuffer("aux")),
        (Some(_), Some(buf)) if buf.len() < g.aux_bytes() => {
            return Err(GemmError::BufferTooSmall("aux"))
        }
        (Some(l), Some(buf)) => Some((l, buf)),
    };
    let bgrad = match (g.epilogue.bgrad, bufs.bgrad) {
        (None, _) => None,
        (Some(_), None) => return Err(GemmError::MissingBuffer("bgrad")),
        (Some(_), Some(buf)) if buf.len() < g.bgrad_bytes() => {
            return Err(GemmError::BufferTooSmall("bgrad"))
        }
        (Some(spec), Some(buf)) => Some((spec, buf)),
    };
    if g.epilogue.activation == Activation::DGelu && aux.is_none() {
        return Err(GemmError::MissingBuffer("aux"));
    }
    let out = Out {
        c: if g.beta == 0.0 { CInput::None } else { bufs.c },
        d: bufs.d,
        bias,
        aux,
        bgrad,
    };
    match g.compute.accumulator() {
        Accum::F32 => run::<AccF32, 16>(g, bufs.a, bufs.b, out),
        Accum::F16 => run::<AccF16, 16>(g, bufs.a, bufs.b, out),
        Accum::F64 => run::<AccF64, 8>(g, bufs.a, bufs.b, out),
    }
}

struct Out<'a> {
    c: CInput<'a>,
    d: &'a mut [u8],
    bias: Option<(BiasLayout, &'a [u8])>,
    aux: Option<(Layout, &'a mut [u8])>,
    bgrad: Option<((BiasGrad, BiasLayout), &'a mut [u8])>,
}

fn run<A: Acc, const L: usize>(
    g: &Gemm,
    a: &[u8],
    b: &[u8],
    mut out: Out<'_>,
) -> Result<Outcome, GemmError> {
    let p = plan(g.m, g.n, g.k, g.batch, g.compute);
    debug_assert_eq!(p.lanes, L);
    let sa = ScaleArith(g.scale_type);
    let e = &g.epilogue;
    let alpha = sa.mul(
        sa.mul(round_to(g.scale_type, g.alpha), e.scale_a),
        e.scale_b,
    );
    let beta_c = sa.mul(round_to(g.scale_type, g.beta), e.scale_c);
    let mut amax = 0f64;
    let (mut pa, mut pb) = (Vec::new(), Vec::new());
    let keep_d = matches!(e.bgrad, Some((BiasGrad::D, _)));
    let mut dvals = vec![A::T::default(); if keep_d { g.m * g.n } else { 0 }];
    for bi in 0..g.batch {
        pack::<A>(g, a, b, bi, &mut pa, &mut pb);
        for j in 0..g.n {
            let bcol = &pb[j * g.k..(j + 1) * g.k];
            for i in 0..g.m {
                let arow = &pa[i * g.k..(i + 1) * g.k];
                let total: f64 = dot::<A, L>(arow, bcol, &p).into();
                let mut v = sa.mul(alpha, total);
                let di = g.d.index(i, j, bi);
                match out.c {
                    CInput::None => {}
                    CInput::Buffer(c) => {
                        let cv = g.c.dtype.load(c, g.c.index(i, j, bi));
                        v = sa.add(v, sa.mul(beta_c, cv));
                    }
                    CInput::InD => {
                        let cv = g.d.dtype.load(out.d, di);
                        v = sa.add(v, sa.mul(beta_c, cv));
                    }
                }
                if let Some((bl, bias)) = out.bias {
                    v = sa.add(v, bl.dtype.load(bias, bi * bl.batch_stride + i));
                }
                if let Some((al, aux)) = out.aux.as_mut() {
                    if e.activation == Activation::DGelu {
                        let x = al.dtype.load(aux, al.index(i, j, bi));
                        v = sa.mul(v, round_to(g.scale_type, gelu_tanh_grad(x as f32) as f64));
                    } else {
                        al.dtype.store(aux, al.index(i, j, bi), v);
                    }
                }
                v = match e.activation {
                    Activation::Identity => v,
                    Activation::Relu => {
                        if v > 0.0 || v.is_nan() {
                            v
                        } else {
                            0.0
                        }
                    }
                    Activation::Gelu => round_to(g.scale_type, gelu_tanh(v as f32) as f64),
                    Activation::DGelu => v,
                };
                if keep_d {
                    dvals[j * g.m + i] = A::from_f64(v);
                }
                if v.abs() > amax {
                    amax = v.abs();
                }
                let dv = if e.scale_d == 1.0 {
                    v
                } else {
                    sa.mul(v, e.scale_d)
                };
                g.d.dtype.store(out.d, di, dv);
            }
        }
        if let Some(((src, bl), buf)) = out.bgrad.as_mut() {
            bias_grad::<A, L>(g, *src, *bl, bi, &pa, &pb, &dvals, buf);
        }
    }
    Ok(Outcome { amax_d: amax })
}

/// Writes batch entry `bi`'s bias gradient: each sum is a dot product with ones under the plan
/// of its own length, so it follows the same tiled, lane-interleaved order as the GEMM.
#[allow(clippy::too_many_arguments)]
fn bias_grad<A: Acc, const L: usize>(
    g: &Gemm,
    src: BiasGrad,
    bl: BiasLayout,
    bi: usize,
    pa: &[A::T],
    pb: &[A::T],
    dvals: &[A::T],
    out: &mut [u8],
) {
    let (rows, len, data): (usize, usize, Vec<A::T>) = match src {
        BiasGrad::A => (g.m, g.k, pa.to_vec()),
        BiasGrad::B => (g.n, g.k, pb.to_vec()),
        // dvals is column-major m x n: transpose so that each row's n values are contiguous.
        BiasGrad::D => {
            let mut t = Vec::with_capacity(g.m * g.n);
            for i in 0..g.m {
                t.extend((0..g.n).map(|j| dvals[j * g.m + i]));
            }
            (g.m, g.n, t)
        }
    };
    let ones = vec![A::from_f64(1.0); len];
    let p = plan(1, 1, len, 1, g.compute);
    for r in 0..rows {
        let s: f64 = dot::<A, L>(&data[r * len..(r + 1) * len], &ones, &p).into();
        bl.dtype.store(out, bi * bl.batch_stride + r, s);
    }
}

/// The exact result, for tests: `alpha * scale_a * scale_b * sum_k a*b` (+ `beta * scale_c *
/// C`, + bias) in f64 on the stored input values (no input rounding), before activation and
/// output rounding, and the magnitude `|alpha| * sum_k |a*b|` (+ `|beta * C|` + `|bias|`) that
/// scales round-off bounds. Both as `batch` column-major `m x n` matrices.
pub fn reference(
    g: &Gemm,
    a: &[u8],
    b: &[u8],
    c: Option<&[u8]>,
    bias: Option<&[u8]>,
) -> (Vec<f64>, Vec<f64>) {
    let e = &g.epilogue;
    let alpha = g.alpha * e.scale_a * e.scale_b;
    let beta = g.beta * e.scale_c;
    let mut val = Vec::with_capacity(g.m * g.n * g.batch);
    let mut mag = Vec::with_capacity(g.m * g.n * g.batch);
    for bi in 0..g.batch {
        for j in 0..g.n {
            for i in 0..g.m {
                let (mut s, mut sa) = (0f64, 0f64);
                for kk in 0..g.k {
                    let ai = match g.transa {
                        Op::N => g.a.index(i, kk, bi),
                        Op::T => g.a.index(kk, i, bi),
                    };
                    let bidx = match g.transb {
                        Op::N => g.b.index(kk, j, bi),
                        Op::T => g.b.index(j, kk, bi),
                    };
                    let p = g.a.dtype.load(a, ai) * g.b.dtype.load(b, bidx);
                    s += p;
                    sa += p.abs();
                }
                let (mut v, mut m) = (alpha * s, alpha.abs() * sa);
                if let (Some(c), true) = (c, g.beta != 0.0) {
                    let cv = beta * g.c.dtype.load(c, g.c.index(i, j, bi));
                    v += cv;
                    m += cv.abs();
                }
                if let (Some(bl), Some(bias)) = (e.bias, bias) {
                    let bv = bl.dtype.load(bias, bi * bl.batch_stride + i);
                    v += bv;
                    m += bv.abs();
                }
                val.push(v);
                mag.push(m);
            }
        }
    }
    (val, mag)
}

/// Half the smallest positive subnormal of a float type: its absolute rounding error floor.
fn abs_floor(t: DType) -> f64 {
    match t {
        DType::E4M3 => 2f64.powi(-10),
        DType::E5M2 => 2f64.powi(-17),
        DType::F16 => 2f64.powi(-25),
        DType::BF16 => 2f64.powi(-134),
        DType::F32 => 2f64.powi(-150),
        _ => 0.0,
    }
}

/// The round-off bound of one output element of `g` before `scale_d` and activation
/// (Higham's deterministic and probabilistic GEMM bounds), given its exact value and magnitude from [`reference()`]:
/// `(5 sqrt(k) u_acc + 2 u_in + 4 u_scale) * mag + 1.01 u_out |exact| + floor`, i.e. the
/// probabilistic `lambda sqrt(k) u` accumulation bound with lambda = 5, the rounding of both
/// factors of every product to the compute type's input format, the scale-type operations of
/// the epilogue, and one rounding to D's type (its subnormal floor included). The plan's
/// tiling only lowers the real error below the `sqrt(k)` model.
pub fn round_off_bound(g: &Gemm, exact: f64, mag: f64) -> f64 {
    const LAMBDA: f64 = 5.0;
    let u_acc = g.compute.accumulator_unit_roundoff();
    let u_in = g.compute.input_unit_roundoff();
    let u_scale = if g.scale_type.is_float() {
        g.scale_type.epsilon() / 2.0
    } else {
        0.0
    };
    let u_out = if g.d.dtype.is_float() {
        g.d.dtype.epsilon() / 2.0
    } else {
        0.5
    };
    let kf = g.k.max(1) as f64;
    (LAMBDA * kf.sqrt() * u_acc + 2.0 * u_in + 4.0 * u_scale) * mag
        + u_out * exact.abs() * 1.01
        + abs_floor(g.d.dtype)
        + f64::MIN_POSITIVE
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SplitMix64: a deterministic stream of test values.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        /// Uniform in [-1, 1).
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        }
    }

    /// A buffer for `batch` `rows x cols` matrices of `l`: positions outside the matrices
    /// (ld and batch padding) hold NaN (or 0x7f for integers) so that reading them shows.
    fn fill(
        l: &Layout,
        rows: usize,
        cols: usize,
        batch: usize,
        rng: &mut Rng,
        range: f64,
    ) -> Vec<u8> {
        let n = l.span_bytes(rows, cols, batch) / l.dtype.size();
        let mut buf = vec![0u8; n * l.dtype.size()];
        for i in 0..n {
            if l.dtype.is_float() {
                l.dtype.store(&mut buf, i, f64::NAN);
            } else {
                l.dtype.store(&mut buf, i, 127.0);
            }
        }
        for bi in 0..batch {
            for c in 0..cols {
                for r in 0..rows {
                    let v = if l.dtype.is_float() {
                        rng.unit() * range
                    } else {
                        (rng.unit() * range).round()
                    };
                    l.dtype.store(&mut buf, l.index(r, c, bi), v);
                }
            }
        }
        buf
    }

    struct Case {
        ab: DType,
        b: DType,
        c: DType,
        d: DType,
        compute: Compute,
    }

    fn case(ab: DType, cd: DType, compute: Compute) -> Case {
        Case {
            ab,
            b: ab,
            c: cd,
            d: cd,
            compute,
        }
    }

    /// Runs `g` on random inputs and checks every element against the f64 reference; returns D.
    fn check(g: &Gemm, seed: u64) -> Vec<u8> {
        let mut rng = Rng(seed);
        let (ar, ac) = g.a_dims();
        let (br, bc) = g.b_dims();
        let range = |t: DType| if t.is_float() { 1.0 } else { 100.0 };
        let a = fill(&g.a, ar, ac, g.batch, &mut rng, range(g.a.dtype));
        let b = fill(&g.b, br, bc, g.batch, &mut rng, range(g.b.dtype));
        let c = fill(&g.c, g.m, g.n, g.batch, &mut rng, range(g.c.dtype));
        let mut d = vec![0xffu8; g.d_bytes()];
        let bufs = Buffers {
            a: &a,
            b: &b,
            c: CInput::Buffer(&c),
            d: &mut d,
            bias: None,
            aux: None,
            bgrad: None,
        };
        gemm(g, bufs).expect("gemm runs");
        let (val, mag) = reference(g, &a, &b, Some(&c), None);
        let mut idx = 0;
        for bi in 0..g.batch {
            for j in 0..g.n {
                for i in 0..g.m {
                    let got = g.d.dtype.load(&d, g.d.index(i, j, bi));
                    let want = g.d.dtype.round(val[idx]);
                    let err = (got - val[idx]).abs();
                    let bd = round_off_bound(g, val[idx], mag[idx]);
                    assert!(
                        err <= bd,
                        "{g:?}\nD[{i},{j},{bi}] = {got}, exact {} (rounded {want}), error {err:e} > bound {bd:e}",
                        val[idx]
                    );
                    idx += 1;
                }
            }
        }
        d
    }

    fn problem(
        cs: &Case,
        (m, n, k): (usize, usize, usize),
        (ta, tb): (Op, Op),
        pad: usize,
        batch: usize,
    ) -> Gemm {
        let mut g = Gemm::simple(m, n, k, cs.ab, cs.d, cs.compute);
        g.b.dtype = cs.b;
        g.c.dtype = cs.c;
        g.transa = ta;
        g.transb = tb;
        let (ar, ac) = g.a_dims();
        let (br, bc) = g.b_dims();
        g.a = Layout::col(cs.ab, ar + pad).strided((ar + pad) * ac + 5 * pad);
        g.b = Layout::col(cs.b, br + pad).strided((br + pad) * bc + 3 * pad);
        g.c = Layout::col(cs.c, m + pad).strided((m + pad) * n + pad);
        g.d = Layout::col(cs.d, m + 2 * pad).strided((m + 2 * pad) * n + pad);
        g.batch = batch;
        g.alpha = g.scale_type.round(0.75);
        g.beta = g.scale_type.round(-0.5);
        g
    }

    #[test]
    fn every_type_and_compute_combination_is_within_the_round_off_bound() {
        use Compute as C;
        use DType as T;
        let cases = [
            case(T::F32, T::F32, C::F32),
            case(T::F32, T::F32, C::F32Fast16F),
            case(T::F32, T::F32, C::F32Fast16BF),
            case(T::F32, T::F32, C::F32FastTF32),
            case(T::F16, T::F16, C::F32),
            case(T::F16, T::F32, C::F32),
            case(T::BF16, T::BF16, C::F32),
            case(T::BF16, T::F32, C::F32),
            case(T::F16, T::F16, C::F16),
            case(T::F64, T::F64, C::F64),
            case(T::E4M3, T::BF16, C::F32),
            case(T::E4M3, T::F32, C::F32),
            case(T::E4M3, T::E4M3, C::F32),
            Case {
                ab: T::E4M3,
                b: T::E5M2,
                c: T::F16,
                d: T::F16,
                compute: C::F32,
            },
            Case {
                ab: T::E5M2,
                b: T::E4M3,
                c: T::BF16,
                d: T::E5M2,
                compute: C::F32,
            },
            Case {
                ab: T::I8,
                b: T::I8,
                c: T::I32,
                d: T::I32,
                compute: C::I32,
            },
        ];
        let shapes = [
            (5, 7, 3),
            (17, 9, 300),
            (3, 4, 1000),
            (2, 3, 2600),
            (33, 20, 64),
        ];
        let mut seed = 1;
        for cs in &cases {
            for &(m, n, k) in &shapes {
                for (ta, tb) in [
                    (Op::N, Op::N),
                    (Op::T, Op::N),
                    (Op::N, Op::T),
                    (Op::T, Op::T),
                ] {
                    let batch = if k > 500 { 1 } else { 2 };
                    seed += 1;
                    let mut g = problem(cs, (m, n, k), (ta, tb), 3, batch);
                    if cs.compute == Compute::I32 {
                        g.alpha = 1.0;
                        g.beta = 1.0;
                    }
                    check(&g, seed);
                }
            }
        }
    }

    #[test]
    fn same_problem_same_bits() {
        let cs = case(DType::BF16, DType::F32, Compute::F32);
        let g = problem(&cs, (9, 11, 700), (Op::T, Op::N), 1, 2);
        assert_eq!(check(&g, 7), check(&g, 7));
    }

    #[test]
    fn plan_splits_k_only_for_few_output_tiles() {
        let p = plan(8, 8, 4096, 1, Compute::F32);
        assert_eq!((p.lanes, p.k_tile, p.tiles), (16, 256, 16));
        assert!(p.splits > 1, "{p:?}");
        assert_eq!(plan(4096, 4096, 4096, 1, Compute::F32).splits, 1);
        assert_eq!(
            plan(64, 64, 200, 1, Compute::F64),
            Plan {
                lanes: 8,
                k_tile: 200,
                tiles: 1,
                splits: 1
            }
        );
        assert_eq!(plan(64, 64, 300, 1, Compute::F32).tiles, 3);
    }

    /// A GEMM over K split in two halves (the second accumulating onto the first with beta = 1,
    /// as a K-sharded layer followed by a sum would) is within round-off of the unsharded one
    /// but never bitwise equal to it.
    #[test]
    fn k_sharded_gemm_differs_from_unsharded_only_by_round_off() {
        for ab in [DType::F32, DType::BF16] {
            for k in [32, 64, 200, 256, 300, 512, 1000, 2048, 4096, 5000] {
                let (m, n) = (8, 8);
                let mut rng = Rng(k as u64);
                let full = Gemm::simple(m, n, k, ab, DType::F32, Compute::F32);
                let a = fill(&full.a, m, k, 1, &mut rng, 1.0);
                let b = fill(&full.b, k, n, 1, &mut rng, 1.0);
                let mut d_full = vec![0u8; full.d_bytes()];
                let run = |g: &Gemm, a: &[u8], b: &[u8], c: CInput<'_>, d: &mut [u8]| {
                    gemm(
                        g,
                        Buffers {
                            a,
                            b,
                            c,
                            d,
                            bias: None,
                            aux: None,
                            bgrad: None,
                        },
                    )
                    .expect("gemm runs");
                };
                run(&full, &a, &b, CInput::None, &mut d_full);

                let h = k / 2;
                let sz = ab.size();
                let mut first = Gemm::simple(m, n, h, ab, DType::F32, Compute::F32);
                first.a.ld = m;
                first.b.ld = k;
                let mut second = Gemm::simple(m, n, k - h, ab, DType::F32, Compute::F32);
                second.a.ld = m;
                second.b.ld = k;
                second.beta = 1.0;
                let mut d_sh = vec![0u8; full.d_bytes()];
                run(&first, &a, &b, CInput::None, &mut d_sh);
                run(
                    &second,
                    &a[h * m * sz..],
                    &b[h * sz..],
                    CInput::InD,
                    &mut d_sh,
                );

                assert_ne!(
                    d_full, d_sh,
                    "{ab:?} k={k}: sharded result is bitwise equal"
                );
                // The other way to combine shards: two separate partial GEMMs summed in f32
                // afterwards (an all-reduce of partial sums).
                let (mut p0, mut p1) = (vec![0u8; full.d_bytes()], vec![0u8; full.d_bytes()]);
                let second0 = Gemm {
                    beta: 0.0,
                    ..second
                };
                run(&first, &a, &b, CInput::None, &mut p0);
                run(
                    &second0,
                    &a[h * m * sz..],
                    &b[h * sz..],
                    CInput::None,
                    &mut p1,
                );
                let summed: Vec<u8> = (0..m * n)
                    .flat_map(|i| {
                        (DType::F32.load(&p0, i) as f32 + DType::F32.load(&p1, i) as f32)
                            .to_ne_bytes()
                    })
                    .collect();
                assert_ne!(
                    d_full, summed,
                    "{ab:?} k={k}: summed shards are bitwise equal"
                );
                let (val, mag) = reference(&full, &a, &b, None, None);
                for (idx, (v, mg)) in val.iter().zip(&mag).enumerate() {
                    let x = DType::F32.load(&d_full, idx);
                    let y = DType::F32.load(&d_sh, idx);
                    let bd = round_off_bound(&full, *v, *mg);
                    assert!(
                        (x - y).abs() <= 2.0 * bd,
                        "{ab:?} k={k} [{idx}]: {x} vs {y}, bound {bd:e}"
                    );
                }
            }
        }
    }

    #[test]
    fn beta_zero_never_reads_c() {
        let g = Gemm::simple(4, 3, 5, DType::F32, DType::F32, Compute::F32);
        let mut rng = Rng(3);
        let a = fill(&g.a, 4, 5, 1, &mut rng, 1.0);
        let b = fill(&g.b, 5, 3, 1, &mut rng, 1.0);
        let c = vec![0xffu8; g.c_bytes()]; // all NaN
        let mut d = c.clone();
        gemm(
            &g,
            Buffers {
                a: &a,
                b: &b,
                c: CInput::Buffer(&c),
                d: &mut d,
                bias: None,
                aux: None,
                bgrad: None,
            },
        )
        .expect("runs");
        assert!((0..12).all(|i| DType::F32.load(&d, i).is_finite()));
        let mut d2 = c.clone();
        gemm(
            &g,
            Buffers {
                a: &a,
                b: &b,
                c: CInput::InD,
                d: &mut d2,
                bias: None,
                aux: None,
                bgrad: None,
            },
        )
        .expect("runs");
        assert_eq!(d, d2);
        // With beta != 0 the NaN does propagate.
        let g1 = Gemm { beta: 1.0, ..g };
        gemm(
            &g1,
            Buffers {
                a: &a,
                b: &b,
                c: CInput::Buffer(&c),
                d: &mut d2,
                bias: None,
                aux: None,
                bgrad: None,
            },
        )
        .expect("runs");
        assert!(DType::F32.load(&d2, 0).is_nan());
    }

    #[test]
    fn bad_layouts_and_buffers_are_rejected() {
        let mut g = Gemm::simple(4, 3, 5, DType::F32, DType::F32, Compute::F32);
        let a = vec![0u8; g.a_bytes()];
        let b = vec![0u8; g.b_bytes()];
        let mut d = vec![0u8; g.d_bytes()];
        let short = vec![0u8; g.b_bytes() - 1];
        let r = gemm(
            &g,
            Buffers {
                a: &a,
                b: &short,
                c: CInput::None,
                d: &mut d,
                bias: None,
                aux: None,
                bgrad: None,
            },
        );
        assert_eq!(r, Err(GemmError::BufferTooSmall("B")));
        g.a.ld = 3;
        let r = gemm(
            &g,
            Buffers {
                a: &a,
                b: &b,
                c: CInput::None,
                d: &mut d,
                bias: None,
                aux: None,
                bgrad: None,
            },
        );
        assert_eq!(r, Err(GemmError::LeadingDimension));
    }

    #[test]
    fn tf32_rounds_to_nearest_even() {
        assert_eq!(round_tf32(1.0 + 2f32.powi(-11)), 1.0);
        assert_eq!(round_tf32(1.0 + 3.0 * 2f32.powi(-11)), 1.0 + 2f32.powi(-9));
        assert_eq!(round_tf32(1.0 + 2f32.powi(-12)), 1.0);
        assert!(round_tf32(f32::NAN).is_nan());
    }

    #[test]
    fn bias_gelu_and_aux_epilogue() {
        let (m, n, k) = (6, 5, 40);
        let mut g = Gemm::simple(m, n, k, DType::BF16, DType::BF16, Compute::F32);
        g.epilogue.bias = Some(BiasLayout {
            dtype: DType::BF16,
            batch_stride: 0,
        });
        g.epilogue.activation = Activation::Gelu;
        g.epilogue.aux = Some(Layout::col(DType::BF16, m + 2));
        let mut rng = Rng(11);
        let a = fill(&g.a, m, k, 1, &mut rng, 1.0);
        let b = fill(&g.b, k, n, 1, &mut rng, 1.0);
        let bias = fill(&Layout::col(DType::BF16, m), m, 1, 1, &mut rng, 2.0);
        let mut d = vec![0u8; g.d_bytes()];
        let mut aux = vec![0u8; g.aux_bytes()];
        let bufs = Buffers {
            a: &a,
            b: &b,
            c: CInput::None,
            d: &mut d,
            bias: Some(&bias),
            aux: Some(&mut aux),
            bgrad: None,
        };
        gemm(&g, bufs).expect("runs");
        let (val, mag) = reference(&g, &a, &b, None, Some(&bias));
        for j in 0..n {
            for i in 0..m {
                let idx = i + j * m;
                let pre = DType::BF16.load(&aux, i + j * (m + 2));
                let bd = round_off_bound(&g, val[idx], mag[idx]);
                assert!(
                    (pre - val[idx]).abs() <= bd,
                    "aux [{i},{j}] {pre} vs {}",
                    val[idx]
                );
                let want = gelu_tanh(val[idx] as f32) as f64;
                let got = DType::BF16.load(&d, idx);
                // GELU's slope is below 1.13: the pre-activation error passes through scaled.
                assert!(
                    (got - want).abs() <= 1.13 * bd + 2f64.powi(-8) * want.abs(),
                    "D [{i},{j}] {got} vs {want}"
                );
            }
        }
        // RELU zeroes negatives.
        g.epilogue.activation = Activation::Relu;
        g.epilogue.aux = None;
        gemm(
            &g,
            Buffers {
                a: &a,
                b: &b,
                c: CInput::None,
                d: &mut d,
                bias: Some(&bias),
                aux: None,
                bgrad: None,
            },
        )
        .expect("runs");
        for (idx, v) in val.iter().enumerate() {
            let got = DType::BF16.load(&d, idx);
            assert!(got >= 0.0);
            if *v < -0.1 {
                assert_eq!(got, 0.0);
            }
        }
    }

    /// FP8: `D = scale_d * (alpha * scale_a * scale_b * AB + beta * scale_c * C)`, with amax of
    /// the value before scale_d.
    #[test]
    fn fp8_scales_and_amax() {
        let (m, n, k) = (16, 8, 64);
        let mut g = Gemm::simple(m, n, k, DType::E4M3, DType::E4M3, Compute::F32);
        g.transa = Op::T;
        g.a = Layout::col(DType::E4M3, k);
        g.c = Layout::col(DType::BF16, m);
        g.beta = 0.5;
        g.epilogue.scale_a = 0.25;
        g.epilogue.scale_b = 2.0;
        g.epilogue.scale_c = 4.0;
        g.epilogue.scale_d = 8.0;
        let mut rng = Rng(5);
        let a = fill(&g.a, k, m, 1, &mut rng, 1.0);
        let b = fill(&g.b, k, n, 1, &mut rng, 1.0);
        let c = fill(&g.c, m, n, 1, &mut rng, 1.0);
        let mut d = vec![0u8; g.d_bytes()];
        let out = gemm(
            &g,
            Buffers {
                a: &a,
                b: &b,
                c: CInput::Buffer(&c),
                d: &mut d,
                bias: None,
                aux: None,
                bgrad: None,
            },
        )
        .expect("runs");
        let (val, mag) = reference(&g, &a, &b, Some(&c), None);
        let mut amax = 0f64;
        for (idx, (v, mg)) in val.iter().zip(&mag).enumerate() {
            amax = amax.max(v.abs());
            let got = DType::E4M3.load(&d, idx);
            let want = v * 8.0;
            let bd = 8.0 * round_off_bound(&g, *v, *mg);
            assert!(
                (got - want).abs() <= bd,
                "D[{idx}] {got} vs {want} (bound {bd:e})"
            );
        }
        assert!(
            (out.amax_d - amax).abs() <= 1e-5 * amax,
            "amax {} vs {amax}",
            out.amax_d
        );
    }

    /// The FAST compute types really round their inputs: on f32 data they give different bits
    /// than 32F, and errors of the input format's size.
    #[test]
    fn fast_compute_types_round_inputs() {
        let (m, n, k) = (8, 8, 128);
        let base = Gemm::simple(m, n, k, DType::F32, DType::F32, Compute::F32);
        let mut rng = Rng(21);
        let a = fill(&base.a, m, k, 1, &mut rng, 1.0);
        let b = fill(&base.b, k, n, 1, &mut rng, 1.0);
        let (val, _) = reference(&base, &a, &b, None, None);
        let max_err = |compute: Compute| {
            let g = Gemm { compute, ..base };
            let mut d = vec![0u8; g.d_bytes()];
            let bufs = Buffers {
                a: &a,
                b: &b,
                c: CInput::None,
                d: &mut d,
                bias: None,
                aux: None,
                bgrad: None,
            };
            gemm(&g, bufs).expect("runs");
            let e = val
                .iter()
                .enumerate()
                .map(|(i, v)| (DType::F32.load(&d, i) - v).abs());
            e.fold(0.0, f64::max)
        };
        let exact = max_err(Compute::F32);
        let tf32 = max_err(Compute::F32FastTF32);
        let bf = max_err(Compute::F32Fast16BF);
        assert!(exact < 1e-5, "{exact}");
        assert!(
            tf32 > 20.0 * exact && tf32 < 1e-2,
            "tf32 {tf32} vs f32 {exact}"
        );
        assert!(bf > 4.0 * tf32, "bf16 {bf} vs tf32 {tf32}");
    }

    /// DGELU_BGRAD, BGRADA and BGRADB: the gradient of GELU applied with the aux matrix as
    /// input, and the bias-gradient sums, within round-off of f64.
    #[test]
    fn gradient_epilogues() {
        let (m, n, k) = (12, 9, 70);
        let f32b = BiasLayout {
            dtype: DType::F32,
            batch_stride: 16,
        };
        let mut g = Gemm::simple(m, n, k, DType::BF16, DType::F32, Compute::F32);
        g.transb = Op::T;
        g.b = Layout::col(DType::BF16, n);
        g.batch = 2;
        g.a = g.a.strided(m * k);
        g.b = g.b.strided(n * k);
        g.d = g.d.strided(m * n);
        g.epilogue.activation = Activation::DGelu;
        g.epilogue.aux = Some(Layout::col(DType::BF16, m).strided(m * n));
        g.epilogue.bgrad = Some((BiasGrad::D, f32b));
        let mut rng = Rng(31);
        let a = fill(&g.a, m, k, 2, &mut rng, 1.0);
        let b = fill(&g.b, n, k, 2, &mut rng, 1.0);
        let mut aux = fill(&g.epilogue.aux.expect("set"), m, n, 2, &mut rng, 2.0);
        let aux_before = aux.clone();
        let mut d = vec![0u8; g.d_bytes()];
        let mut bg = vec![0u8; g.bgrad_bytes()];
        let bufs = Buffers {
            a: &a,
            b: &b,
            c: CInput::None,
            d: &mut d,
            bias: None,
            aux: Some(&mut aux),
            bgrad: Some(&mut bg),
        };
        gemm(&g, bufs).expect("runs");
        assert_eq!(aux, aux_before, "DGELU reads aux, never writes it");
        let (val, mag) = reference(&g, &a, &b, None, None);
        for bi in 0..2 {
            for i in 0..m {
                let (mut row, mut row_mag) = (0f64, 0f64);
                for j in 0..n {
                    let idx = bi * m * n + j * m + i;
                    let x = DType::BF16.load(&aux, idx) as f32;
                    let grad = gelu_tanh_grad(x) as f64;
                    let want = val[idx] * grad;
                    let got = DType::F32.load(&d, idx);
                    let bd = round_off_bound(&g, want, mag[idx] * grad.abs()) + 1e-6 * want.abs();
                    assert!((got - want).abs() <= bd, "D[{i},{j},{bi}] {got} vs {want}");
                    row += want;
                    row_mag += mag[idx] * grad.abs();
                }
                let got = DType::F32.load(&bg, bi * 16 + i);
                let bd = 2.0 * round_off_bound(&g, row, row_mag) * (n as f64).sqrt();
                assert!((got - row).abs() <= bd, "bgrad[{i},{bi}] {got} vs {row}");
            }
        }

        // BGRADA / BGRADB: sums of op(A) rows and op(B) columns over k.
        for (src, len) in [(BiasGrad::A, m), (BiasGrad::B, n)] {
            let mut g2 = g;
            g2.epilogue = Epilogue::default();
            g2.epilogue.bgrad = Some((src, f32b));
            let mut bg = vec![0u8; g2.bgrad_bytes()];
            let bufs = Buffers {
                a: &a,
                b: &b,
                c: CInput::None,
                d: &mut d,
                bias: None,
                aux: None,
                bgrad: Some(&mut bg),
            };
            gemm(&g2, bufs).expect("runs");
            for bi in 0..2 {
                for r in 0..len {
                    let (mut want, mut mg) = (0f64, 0f64);
                    for kk in 0..k {
                        let v = match src {
                            BiasGrad::A => DType::BF16.load(&a, g2.a.index(r, kk, bi)),
                            _ => DType::BF16.load(&b, g2.b.index(r, kk, bi)),
                        };
                        want += v;
                        mg += v.abs();
                    }
                    let got = DType::F32.load(&bg, bi * 16 + r);
                    assert!(
                        (got - want).abs() <= round_off_bound(&g2, want, mg),
                        "{src:?}[{r},{bi}] {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn legacy_compute_types_are_accepted() {
        assert_eq!(Compute::from_raw(0), Some(Compute::F32));
        assert_eq!(Compute::from_raw(68), Some(Compute::F32));
        assert_eq!(Compute::from_raw(77), Some(Compute::F32FastTF32));
        assert_eq!(Compute::from_raw(2), Some(Compute::F16));
        assert_eq!(Compute::from_raw(14), None);
    }
}
