//! The `cublasLtMatmul` hook. Shapes, types, transposes, epilogue, bias/aux and FP8 scale
//! pointers are read from the descriptors at call time with the real
//! `cublasLtMatmulDescGetAttribute` / `cublasLtMatrixLayoutGetAttribute` (never by shadowing
//! `*Create`/`SetAttribute`: caller-initialised and mutated descriptors are seen as they are).
//! MXFP8 and NVFP4 block scales (`VEC32_UE8M0`, `VEC16_UE4M3`) are captured as
//! `BlockScaleA/B/D` tensors (the role and dtype say the mode), FP4 operands as packed bytes.
//! A layout that is not column-major, a pointer-array or grouped batch mode (CUDA 13), a
//! scale mode the record cannot express (per-row or per-128-block FP32 scales), or a
//! descriptor that cannot be read, is recorded as a `ShapeUnknown` gap saying which.

use core::ffi::c_void;

use cuda_abi::cublas::*;
use cuda_abi::cublaslt::*;
use cuda_abi::cudart::cudaStream_t;
use ttrace_proto::blockscale;
use ttrace_proto::dtype::DType;
use ttrace_proto::record::{GapReason, GemmOp, Op, Role};

use super::cublas::{around_blas_gemm, read_scalar};
use crate::engine::{self, Call};
use crate::plan::{self, Matrix, TensorPlan, Vector, When};
use crate::{mode, perturb, real};

/// An attribute's raw bytes.
trait Attr: Copy + Default {}
impl Attr for u32 {}
impl Attr for i32 {}
impl Attr for u64 {}
impl Attr for i64 {}
impl Attr for i8 {}

/// The signature the two attribute getters share: (object, attribute, buffer, its size,
/// bytes written).
type GetAttribute<H> =
    unsafe extern "C" fn(H, u32, *mut c_void, usize, *mut usize) -> cublasStatus_t;

/// Attribute `attr` of the program's descriptor or layout `obj`, read with the real `get`.
fn attr_of<T: Attr, H>(get: Option<GetAttribute<H>>, obj: H, attr: u32) -> Option<T> {
    let f = get?;
    let mut v = T::default();
    let mut written = 0usize;
    // SAFETY: the program's descriptor or layout; a buffer of exactly the attribute's
    // documented size.
    let st = unsafe {
        f(
            obj,
            attr,
            (&mut v as *mut T).cast(),
            core::mem::size_of::<T>(),
            &mut written,
        )
    };
    (st == CUBLAS_STATUS_SUCCESS).then_some(v)
}

fn desc_attr<T: Attr>(d: cublasLtMatmulDesc_t, attr: u32) -> Option<T> {
    attr_of(real::cublasLtMatmulDescGetAttribute(), d, attr)
}

fn layout_attr<T: Attr>(l: cublasLtMatrixLayout_t, attr: u32) -> Option<T> {
    attr_of(real::cublasLtMatrixLayoutGetAttribute(), l, attr)
}

/// A matrix layout as read from its descriptor.
#[derive(Debug, Clone, Copy)]
struct Layout {
    dtype: u32,
    order: i32,
    rows: u64,
    cols: u64,
    ld: i64,
    batch: i32,
    stride: i64,
    /// `cublasLtBatchMode_t` (0 strided where the library has no such attribute).
    batch_mode: u32,
}

fn layout(l: cublasLtMatrixLayout_t) -> Option<Layout> {
    if l.is_null() {
        return None;
    }
    Some(Layout {
        dtype: layout_attr(l, CUBLASLT_MATRIX_LAYOUT_TYPE)?,
        order: layout_attr(l, CUBLASLT_MATRIX_LAYOUT_ORDER).unwrap_or(CUBLASLT_ORDER_COL as i32),
        rows: layout_attr(l, CUBLASLT_MATRIX_LAYOUT_ROWS)?,
        cols: layout_attr(l, CUBLASLT_MATRIX_LAYOUT_COLS)?,
        ld: layout_attr(l, CUBLASLT_MATRIX_LAYOUT_LD)?,
        batch: layout_attr(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT).unwrap_or(1),
        stride: layout_attr(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET).unwrap_or(0),
        batch_mode: layout_attr(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE)
            .unwrap_or(CUBLASLT_BATCH_MODE_STRIDED),
    })
}

fn is_fp8(t: u32) -> bool {
    matches!(DType::from_cuda(t), Some(DType::F8_E4M3 | DType::F8_E5M2))
}

/// The arguments of one `cublasLtMatmul`.
struct Matmul {
    desc: cublasLtMatmulDesc_t,
    alpha: *const c_void,
    a: *const c_void,
    adesc: cublasLtMatrixLayout_t,
    b: *const c_void,
    bdesc: cublasLtMatrixLayout_t,
    beta: *const c_void,
    c: *const c_void,
    cdesc: cublasLtMatrixLayout_t,
    d: *mut c_void,
    ddesc: cublasLtMatrixLayout_t,
    stream: cudaStream_t,
}

fn unknown(stream: cudaStream_t, detail: &str) -> Call {
    Call {
        api: "cublasLtMatmul",
        op: Op::gap(
            GapReason::ShapeUnknown,
            "cublasLtMatmul",
            0,
            detail.to_string(),
        ),
        stream,
        stream_id: stream as u64,
        device: None,
        tensors: Vec::new(),
    }
}

/// The snapshot plan of a matmul.
fn call(x: &Matmul) -> Call {
    match plan_matmul(x) {
        Ok(c) => c,
        Err(why) => unknown(x.stream, why),
    }
}

/// The matmul descriptor's attributes a snapshot plan needs.
struct MatmulDesc {
    compute: u32,
    scale_raw: u32,
    scale: Option<DType>,
    /// `cublasLtPointerMode_t`: alpha and beta as host values, device scalars or vectors.
    pmode: u32,
    transa: u32,
    transb: u32,
    epilogue: u32,
    fast_accum: bool,
    a_mode: u32,
    b_mode: u32,
    d_out_mode: u32,
}

/// Reads the descriptor `d`.
fn read_desc(d: cublasLtMatmulDesc_t) -> Result<MatmulDesc, &'static str> {
    let bad = "a matmul descriptor attribute cannot be read";
    let compute: u32 = desc_attr(d, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE).ok_or(bad)?;
    let scale_raw: u32 = desc_attr(d, CUBLASLT_MATMUL_DESC_SCALE_TYPE).ok_or(bad)?;
    let mode_of =
        |attr| desc_attr::<u32>(d, attr).unwrap_or(CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F);
    let desc = MatmulDesc {
        compute,
        scale_raw,
        scale: DType::from_cuda(scale_raw),
        pmode: desc_attr(d, CUBLASLT_MATMUL_DESC_POINTER_MODE).unwrap_or(0),
        transa: desc_attr(d, CUBLASLT_MATMUL_DESC_TRANSA).unwrap_or(CUBLAS_OP_N),
        transb: desc_attr(d, CUBLASLT_MATMUL_DESC_TRANSB).unwrap_or(CUBLAS_OP_N),
        epilogue: desc_attr(d, CUBLASLT_MATMUL_DESC_EPILOGUE).unwrap_or(CUBLASLT_EPILOGUE_DEFAULT),
        fast_accum: desc_attr::<i8>(d, CUBLASLT_MATMUL_DESC_FAST_ACCUM).unwrap_or(0) != 0,
        a_mode: mode_of(CUBLASLT_MATMUL_DESC_A_SCALE_MODE),
        b_mode: mode_of(CUBLASLT_MATMUL_DESC_B_SCALE_MODE),
        d_out_mode: mode_of(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE),
    };
    Ok(desc)
}

/// Refuses scale modes the record cannot describe (after the layouts' checks, so that a
/// matmul failing both is reported for its layout).
fn check_scale_modes(d: cublasLtMatmulDesc_t, desc: &MatmulDesc) -> Result<(), &'static str> {
    let mode_of =
        |attr| desc_attr::<u32>(d, attr).unwrap_or(CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F);
    let block = |mode| {
        mode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F || blockscale::block_of(mode).is_some()
    };
    let scalar_cd = [
        CUBLASLT_MATMUL_DESC_C_SCALE_MODE,
        CUBLASLT_MATMUL_DESC_D_SCALE_MODE,
    ]
    .into_iter()
    .all(|a| mode_of(a) == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F);
    if !(block(desc.a_mode) && block(desc.b_mode) && block(desc.d_out_mode) && scalar_cd) {
        // Per-row and per-128-block FP32 scales: the record has no role that says how they
        // apply, and compare/check would take them for scalars.
        return Err("a scale mode other than scalar or the MXFP8 / NVFP4 block modes (CUBLASLT_MATMUL_DESC_*_SCALE_MODE: OUTER_VEC_32F, VEC128_32F, BLK128x128_32F): the record cannot say how its scales apply");
    }
    Ok(())
}

/// The layouts of A, B, C (D's when there is no C) and D; refuses those whose packed bytes
/// the record cannot describe.
fn read_layouts(x: &Matmul) -> Result<[Layout; 4], &'static str> {
    let bad = "a matrix layout cannot be read";
    let la = layout(x.adesc).ok_or(bad)?;
    let lb = layout(x.bdesc).ok_or(bad)?;
    let ld_ = layout(x.ddesc).ok_or(bad)?;
    let lc = if x.cdesc.is_null() {
        ld_
    } else {
        layout(x.cdesc).ok_or(bad)?
    };
    let all = [la, lb, lc, ld_];
    if all.iter().any(|l| l.order != CUBLASLT_ORDER_COL as i32) {
        return Err("a layout is not column-major (CUBLASLT_ORDER_COL): the packed bytes would not say which order they are in");
    }
    if all
        .iter()
        .any(|l| l.batch_mode != CUBLASLT_BATCH_MODE_STRIDED)
    {
        return Err("a layout is a pointer-array or grouped batch (CUBLASLT_MATRIX_LAYOUT_BATCH_MODE): the matrices' addresses live in device memory and cannot be read without synchronising");
    }
    Ok(all)
}

/// The shape every tensor of one matmul shares.
#[derive(Clone, Copy)]
struct Shape {
    m: u64,
    n: u64,
    k: u64,
    batch: u64,
    batched: bool,
}

impl Shape {
    fn matrix(&self, p: *const c_void, l: &Layout, rows: u64, cols: u64) -> Matrix {
        Matrix {
            ptr: p as u64,
            dtype: l.dtype,
            rows,
            cols,
            ld: l.ld.max(0) as u64,
            batch: self.batch,
            stride: l.stride,
            batched: self.batched,
        }
    }
}

fn plan_matmul(x: &Matmul) -> Result<Call, &'static str> {
    let desc = read_desc(x.desc)?;
    let [la, lb, lc, ld_] = read_layouts(x)?;
    check_scale_modes(x.desc, &desc)?;
    let k = if desc.transa == CUBLAS_OP_N {
        la.cols
    } else {
        la.rows
    };
    let batch = ld_.batch.max(1) as u64;
    let shape = Shape {
        m: ld_.rows,
        n: ld_.cols,
        k,
        batch,
        batched: batch > 1,
    };
    // alpha and beta: host values, device scalars or device vectors (pointer modes 0..4).
    let read = |p: *const c_void, host: bool| -> Option<f64> {
        if !host {
            return None;
        }
        // SAFETY: in this pointer mode the scalar is a host value of the scale type.
        desc.scale.and_then(|t| unsafe { read_scalar(p, t) })
    };
    let alpha = read(x.alpha, desc.pmode == CUBLASLT_POINTER_MODE_HOST);
    let beta = if desc.pmode == 3 {
        Some(0.0)
    } else {
        read(x.beta, matches!(desc.pmode, 0 | 4))
    };
    let c_read = !x.c.is_null() && beta.is_none_or(|b| b != 0.0);
    let mut tensors = operand_tensors(x, &shape, [&la, &lb, &lc, &ld_], c_read);
    scalar_tensors(x, &desc, &shape, &mut tensors);
    epilogue_tensors(x.desc, &desc, &shape, [&la, &lc, &ld_], &mut tensors);
    scale_tensors(x.desc, &desc, &shape, &mut tensors);

    let stride = |l: &Layout| if shape.batched { l.stride } else { 0 };
    let op = GemmOp {
        m: shape.m,
        n: shape.n,
        k,
        transa: desc.transa,
        transb: desc.transb,
        lda: la.ld.max(0) as u64,
        ldb: lb.ld.max(0) as u64,
        ldc: lc.ld.max(0) as u64,
        ldd: ld_.ld.max(0) as u64,
        batch,
        stride_a: stride(&la),
        stride_b: stride(&lb),
        stride_c: stride(&lc),
        stride_d: stride(&ld_),
        a_type: la.dtype,
        b_type: lb.dtype,
        c_type: lc.dtype,
        d_type: ld_.dtype,
        compute_type: desc.compute,
        scale_type: desc.scale_raw,
        alpha,
        beta,
        epilogue: desc.epilogue,
        algo: -1,
        fast_accum: desc.fast_accum,
    };
    Ok(Call {
        api: "cublasLtMatmul",
        op: Op::Gemm(Box::new(op)),
        stream: x.stream,
        stream_id: x.stream as u64,
        device: None,
        tensors,
    })
}

/// A and B (inputs), C when it is read (taken before the op: it may be D, in place), D.
fn operand_tensors(
    x: &Matmul,
    s: &Shape,
    [la, lb, lc, ld_]: [&Layout; 4],
    c_read: bool,
) -> Vec<TensorPlan> {
    let mut tensors = vec![
        plan::matrix(
            Role::A,
            &s.matrix(x.a, la, la.rows, la.cols),
            When::After,
            true,
        ),
        plan::matrix(
            Role::B,
            &s.matrix(x.b, lb, lb.rows, lb.cols),
            When::After,
            true,
        ),
    ];
    if c_read {
        tensors.push(plan::matrix(
            Role::CIn,
            &s.matrix(x.c, lc, s.m, s.n),
            When::Before,
            true,
        ));
    }
    tensors.push(plan::matrix(
        Role::D,
        &s.matrix(x.d, ld_, s.m, s.n),
        When::After,
        false,
    ));
    tensors
}

/// alpha and beta when they live on the device (a scalar, or a vector of M).
fn scalar_tensors(x: &Matmul, desc: &MatmulDesc, s: &Shape, tensors: &mut Vec<TensorPlan>) {
    let vec_len = |mode_vector: bool| if mode_vector { s.m } else { 1 };
    if desc.pmode != CUBLASLT_POINTER_MODE_HOST {
        let vector = desc.pmode != CUBLASLT_POINTER_MODE_DEVICE;
        tensors.push(plan::vector(
            Role::Alpha,
            Vector::new(x.alpha as u64, desc.scale, vec_len(vector)),
            When::After,
            true,
        ));
    }
    if !matches!(desc.pmode, 0 | 3 | 4) {
        let vector = desc.pmode == 2;
        tensors.push(plan::vector(
            Role::Beta,
            Vector::new(x.beta as u64, desc.scale, vec_len(vector)),
            When::After,
            true,
        ));
    }
}

/// The epilogue's bias (input) or bias gradient (output), and its aux matrix: GELU
/// pre-activations (output of GELU_AUX*, input of DGELU*); the bit-packed ReLU masks are
/// metadata only.
fn epilogue_tensors(
    d: cublasLtMatmulDesc_t,
    desc: &MatmulDesc,
    s: &Shape,
    [la, lc, ld_]: [&Layout; 3],
    tensors: &mut Vec<TensorPlan>,
) {
    let ptr = |attr| desc_attr::<u64>(d, attr).unwrap_or(0);
    let int = |attr| desc_attr::<i64>(d, attr).unwrap_or(0);
    let epilogue = desc.epilogue;
    let bias_in = matches!(epilogue, 4 | 6 | 36 | 134 | 164);
    let bias_out = matches!(epilogue, 152 | 208 | 256 | 512);
    let bias_ptr = ptr(CUBLASLT_MATMUL_DESC_BIAS_POINTER);
    if (bias_in || bias_out) && bias_ptr != 0 {
        let raw = desc_attr::<i32>(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE).unwrap_or(-1);
        let dtype = if raw >= 0 {
            DType::from_cuda(raw as u32)
        } else if !is_fp8(la.dtype) {
            DType::from_cuda(ld_.dtype)
        } else {
            match DType::from_cuda(lc.dtype) {
                Some(t @ (DType::BF16 | DType::F16)) => Some(t),
                _ => Some(DType::BF16),
            }
        };
        let len = if epilogue == 512 { s.n } else { s.m };
        let stride = int(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE).max(0) as u64;
        let b = if s.batched { s.batch } else { 1 };
        let v = Vector::new(bias_ptr, dtype, len).batched(b, stride);
        tensors.push(plan::vector(Role::Bias, v, When::After, bias_in));
    }
    let aux_ptr = ptr(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER);
    if aux_ptr != 0 && matches!(epilogue, 130 | 134 | 136 | 152 | 160 | 164 | 192 | 208) {
        let raw = desc_attr::<i32>(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE).unwrap_or(-1);
        let dtype = if raw >= 0 { raw as u32 } else { ld_.dtype };
        let relu_mask = matches!(epilogue, 130 | 134 | 136 | 152);
        let aux = Matrix {
            ptr: aux_ptr,
            dtype: if relu_mask { u32::MAX } else { dtype },
            rows: s.m,
            cols: s.n,
            ld: int(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD).max(0) as u64,
            batch: s.batch,
            stride: int(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE),
            batched: s.batched,
        };
        let input = matches!(epilogue, 136 | 152 | 192 | 208);
        tensors.push(plan::matrix(Role::Aux, &aux, When::After, input));
    }
}

/// FP8 scalar scales (TransformerEngine passes scale_inv), MXFP8 / NVFP4 block scales, and
/// amax. An NVFP4 operand's tensor-wide FP32 scale is alpha (a scalar tensor).
fn scale_tensors(
    d: cublasLtMatmulDesc_t,
    desc: &MatmulDesc,
    s: &Shape,
    tensors: &mut Vec<TensorPlan>,
) {
    let ptr = |attr| desc_attr::<u64>(d, attr).unwrap_or(0);
    let scalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    let (m, n, k) = (s.m, s.n, s.k);
    for (role, pattr, mode, outer, inner) in [
        (
            Role::ScaleA,
            CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
            desc.a_mode,
            m,
            k,
        ),
        (
            Role::ScaleB,
            CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
            desc.b_mode,
            n,
            k,
        ),
        (
            Role::ScaleC,
            CUBLASLT_MATMUL_DESC_C_SCALE_POINTER,
            scalar,
            m,
            n,
        ),
        (
            Role::ScaleD,
            CUBLASLT_MATMUL_DESC_D_SCALE_POINTER,
            scalar,
            m,
            n,
        ),
        (
            Role::BlockScaleD,
            CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER,
            desc.d_out_mode,
            n,
            m,
        ),
    ] {
        let p = ptr(pattr);
        if p != 0 {
            tensors.push(scale_tensor(role, p, mode, outer, inner, s.batch));
        }
    }
    let amax = ptr(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER);
    if amax != 0 {
        tensors.push(plan::vector(
            Role::AmaxD,
            Vector::new(amax, Some(DType::F32), 1),
            When::After,
            false,
        ));
    }
}

/// The scale tensor at `p` for `role` under scale `mode`, of an operand with `outer` rows of
/// `inner` values along K: one F32 in scalar mode, else the block scales (role
/// `BlockScale*`, UE8M0 or UE4M3 bytes in cuBLASLt's tiled layout, per batch entry).
fn scale_tensor(role: Role, p: u64, mode: u32, outer: u64, inner: u64, batch: u64) -> TensorPlan {
    let Some(block) = blockscale::block_of(mode) else {
        return plan::vector(
            role,
            Vector::new(p, Some(DType::F32), 1),
            When::After,
            false,
        );
    };
    let role = match role {
        Role::ScaleA => Role::BlockScaleA,
        Role::ScaleB => Role::BlockScaleB,
        other => other,
    };
    // UE4M3 is E4M3 without the sign (CUDA_R_8F_UE4M3 == CUDA_R_8F_E4M3).
    let dtype = if block == 32 {
        DType::F8_E8M0
    } else {
        DType::F8_E4M3
    };
    let len = blockscale::scale_bytes(outer, inner, block);
    let input = role != Role::BlockScaleD;
    let v = Vector::new(p, Some(dtype), len).batched(batch, len);
    plan::vector(role, v, When::After, input)
}

/// A cuBLASLt entry point: `name(C signature) => |real| what the hook does`, where `real`
/// calls the real function, looked up under the hook's name, with the program's arguments (the
/// hook calls it exactly once).
macro_rules! lt_hook {
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? ) => |$real:ident| $body:expr) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> cublasStatus_t {
            let Some(real) = real::real_of!($name, fn($($t),*) -> cublasStatus_t, CublasLt)
            else {
                return CUBLAS_STATUS_NOT_SUPPORTED;
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            let $real = || unsafe { real($($a),*) };
            $body
        }
    };
}

lt_hook! {
    /// `cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t
    /// computeDesc, const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc, const void*
    /// B, cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C, cublasLtMatrixLayout_t
    /// Cdesc, void* D, cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void*
    /// workspace, size_t workspaceSizeInBytes, cudaStream_t stream)`.
    cublasLtMatmul(
        lightHandle: cublasLtHandle_t,
        computeDesc: cublasLtMatmulDesc_t,
        alpha: *const c_void,
        A: *const c_void,
        Adesc: cublasLtMatrixLayout_t,
        B: *const c_void,
        Bdesc: cublasLtMatrixLayout_t,
        beta: *const c_void,
        C: *const c_void,
        Cdesc: cublasLtMatrixLayout_t,
        D: *mut c_void,
        Ddesc: cublasLtMatrixLayout_t,
        algo: *const cublasLtMatmulAlgo_t,
        workspace: *mut c_void,
        workspaceSizeInBytes: usize,
        stream: cudaStream_t,
    ) => |run| {
        if mode::off(mode::GEMM | mode::PERTURB) {
            return run();
        }
        let x = Matmul {
            desc: computeDesc,
            alpha,
            a: A,
            adesc: Adesc,
            b: B,
            bdesc: Bdesc,
            beta,
            c: C,
            cdesc: Cdesc,
            d: D,
            ddesc: Ddesc,
            stream,
        };
        around_blas_gemm(|| engine::begin(call(&x)), run, || perturb_output(&x))
    }
}

lt_hook! {
    /// `cublasStatus_t cublasLtMatrixTransform(cublasLtHandle_t lightHandle,
    /// cublasLtMatrixTransformDesc_t transformDesc, const void* alpha, const void* A,
    /// cublasLtMatrixLayout_t Adesc, const void* beta, const void* B, cublasLtMatrixLayout_t
    /// Bdesc, void* C, cublasLtMatrixLayout_t Cdesc, cudaStream_t stream)`: C = alpha op(A) +
    /// beta op(B), often a change of layout or order. Not captured: a gap naming it and C's
    /// layout, once the call succeeded.
    cublasLtMatrixTransform(
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
    ) => |run| {
        if mode::off(mode::GEMM) {
            return run();
        }
        crate::around_metadata(
            "cublasLtMatrixTransform",
            stream,
            || {
                let detail = match layout(Cdesc) {
                    Some(l) => format!(
                        "C {}x{} (type {}, order {}, ld {}, batch {}): matrix transforms are not captured",
                        l.rows, l.cols, l.dtype, l.order, l.ld, l.batch
                    ),
                    None => "matrix transforms are not captured".into(),
                };
                Some(Op::gap(GapReason::Unsupported, "cublasLtMatrixTransform", 0, detail))
            },
            run,
            |r| r == CUBLAS_STATUS_SUCCESS,
        )
    }
}

/// A perturbed reference run: noise on D, as its layout describes it (column-major; a
/// row-major D is the same bytes seen transposed, which the element-wise noise does not mind;
/// other orders are left alone).
fn perturb_output(x: &Matmul) {
    let Some(l) = layout(x.ddesc) else {
        return;
    };
    let (rows, cols) = match l.order {
        o if o == CUBLASLT_ORDER_COL as i32 => (l.rows, l.cols),
        o if o == CUBLASLT_ORDER_ROW as i32 => (l.cols, l.rows),
        _ => return perturb::left_alone("a GEMM output in a tiled order"),
    };
    let batch = l.batch.max(1) as u64;
    perturb::gemm_output(
        x.stream,
        &Matrix {
            ptr: x.d as u64,
            dtype: l.dtype,
            rows,
            cols,
            ld: l.ld.max(0) as u64,
            batch,
            stride: l.stride,
            batched: batch > 1,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_modes_give_their_roles_types_and_sizes() {
        // MXFP8 A, 200 x 100: 256 padded rows x ceil(ceil(100/32)/4)*4 = 4 columns.
        let mx = scale_tensor(Role::ScaleA, 0x1000, 2, 200, 100, 1);
        assert_eq!(
            (mx.role, mx.dtype, mx.nbytes),
            (Role::BlockScaleA, DType::F8_E8M0, 1024)
        );
        assert!(mx.input && mx.captured);
        // NVFP4 B, 64 x 256: 128 rows x 16 columns of UE4M3 (stored as E4M3).
        let nv = scale_tensor(Role::ScaleB, 0x1000, 1, 64, 256, 1);
        assert_eq!(
            (nv.role, nv.dtype, nv.nbytes),
            (Role::BlockScaleB, DType::F8_E4M3, 2048)
        );
        // The scales an FP4 D is written with: an output.
        let d = scale_tensor(Role::BlockScaleD, 0x1000, 1, 64, 256, 2);
        assert!(!d.input);
        assert_eq!((d.shape.to_vec(), d.nbytes), (vec![2, 2048], 4096));
        // Scalar mode: one F32.
        let s = scale_tensor(Role::ScaleA, 0x1000, 0, 200, 100, 1);
        assert_eq!((s.role, s.dtype, s.nbytes), (Role::ScaleA, DType::F32, 4));
    }
}
