//! GEMMs under libttrace.so: every cuBLAS and cuBLASLt record carries operands from which
//! `sim_kernels::gemm` recomputes its captured result bitwise (so A, B and C were taken at the
//! right moment, packed right, with the right parameters, scales and epilogue).

mod intercept_util;

use intercept_util::*;
use sim_kernels::gemm::{
    gemm, Activation, BiasLayout, Buffers, CInput, Compute, Epilogue, Gemm, Layout, Op as SimOp,
};
use ttrace_format::dtype::DType;
use ttrace_format::record::{GapReason, GemmOp, Op, Role};

/// One f32 value of a captured scalar tensor.
fn f32_of(r: &Rec, role: Role) -> f64 {
    let (t, b) = r.tensor(role);
    assert_eq!(t.dtype, DType::F32, "{role:?}");
    f32::from_le_bytes(b[..4].try_into().expect("4 bytes")) as f64
}

/// A captured scalar of the GEMM's scale type (device pointer mode).
fn scalar(r: &Rec, role: Role) -> f64 {
    let (t, b) = r.tensor(role);
    sim_dtype(t.dtype).load(b, 0)
}

/// The result (D, aux, amax) `sim_kernels::gemm` computes from a record's captured inputs.
fn recompute(r: &Rec) -> (Vec<u8>, Option<Vec<u8>>, f64) {
    let Op::Gemm(g) = &r.record.op else {
        panic!("not a GEMM: {:?}", r.record.op)
    };
    let g: &GemmOp = g;
    let (m, n, k, batch) = (g.m as usize, g.n as usize, g.k as usize, g.batch as usize);
    let transa = SimOp::from_cublas(g.transa).expect("transa");
    let transb = SimOp::from_cublas(g.transb).expect("transb");
    let (ar, ac) = if transa == SimOp::N { (m, k) } else { (k, m) };
    let (br, bc) = if transb == SimOp::N { (k, n) } else { (n, k) };
    let packed = |role: Role, rows: usize, cols: usize| {
        let (t, _) = r.tensor(role);
        Layout::col(sim_dtype(t.dtype), rows).strided(rows * cols)
    };
    let (a_t, a) = r.tensor(Role::A);
    let (_, b) = r.tensor(Role::B);
    let (d_t, _) = r.tensor(Role::D);
    let c_in = r.has(Role::CIn).then(|| r.tensor(Role::CIn).1.to_vec());
    let scale_type = sim_dtype(DType::from_cuda(g.scale_type).expect("scale type"));
    let alpha = g.alpha.unwrap_or_else(|| scalar(r, Role::Alpha));
    let beta = match (&c_in, g.beta) {
        (None, _) => 0.0,
        (Some(_), Some(b)) => b,
        (Some(_), None) => scalar(r, Role::Beta),
    };
    let mut epilogue = Epilogue::default();
    match g.epilogue {
        1 => {}
        4 => {
            let (t, _) = r.tensor(Role::Bias);
            epilogue.bias = Some(BiasLayout {
                dtype: sim_dtype(t.dtype),
                batch_stride: if t.shape.len() == 2 { m } else { 0 },
            })
        }
        160 => {
            epilogue.activation = Activation::Gelu;
            epilogue.aux = Some(packed(Role::Aux, m, n));
        }
        e => panic!("epilogue {e} not covered by this test"),
    }
    for (role, slot) in [
        (Role::ScaleA, &mut epilogue.scale_a),
        (Role::ScaleB, &mut epilogue.scale_b),
        (Role::ScaleC, &mut epilogue.scale_c),
        (Role::ScaleD, &mut epilogue.scale_d),
    ] {
        if r.has(role) {
            *slot = f32_of(r, role);
        }
    }
    let sg = Gemm {
        m,
        n,
        k,
        batch,
        transa,
        transb,
        a: Layout::col(sim_dtype(a_t.dtype), ar).strided(ar * ac),
        b: packed(Role::B, br, bc),
        c: if c_in.is_some() {
            packed(Role::CIn, m, n)
        } else {
            packed(Role::D, m, n)
        },
        d: packed(Role::D, m, n),
        compute: Compute::from_raw(g.compute_type).expect("compute type"),
        scale_type,
        alpha,
        beta,
        epilogue,
    };
    let mut d = vec![0u8; d_t.nbytes as usize];
    let mut aux = r
        .has(Role::Aux)
        .then(|| vec![0u8; r.tensor(Role::Aux).0.nbytes as usize]);
    let bias = r.has(Role::Bias).then(|| r.tensor(Role::Bias).1);
    let out = gemm(
        &sg,
        Buffers {
            a,
            b,
            c: c_in.as_deref().map_or(CInput::None, CInput::Buffer),
            d: &mut d,
            bias,
            aux: aux.as_deref_mut(),
            bgrad: None,
        },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", r.record.api));
    (d, aux, out.amax_d)
}

#[test]
fn captured_gemms_recompute_bitwise() {
    let run = traced(1, &["traced", "gemm"], &[]);
    assert_ok(&run);
    assert_checksums(&run);
    let gemms: Vec<&Rec> = run
        .records
        .iter()
        .filter(|r| r.record.api.starts_with("cublas"))
        .collect();
    let apis: Vec<&str> = gemms.iter().map(|r| r.record.api.as_str()).collect();
    assert_eq!(
        apis,
        [
            "cublasSgemm_v2",
            "cublasGemmEx",
            "cublasHgemm",
            "cublasGemmStridedBatchedEx",
            "cublasSgemmStridedBatched",
            "cublasGemmBatchedEx",
            "cublasGemmEx",
            "cublasSgemm_v2",
            "cublasLtMatmul",
            "cublasLtMatmul",
            "cublasLtMatmul",
        ]
    );
    for r in &gemms {
        if matches!(r.record.op, Op::Gap(_)) {
            continue;
        }
        let (d, aux, amax) = recompute(r);
        assert!(
            d == r.tensor(Role::D).1,
            "{}: D differs from the recomputation",
            r.record.api
        );
        if let Some(aux) = aux {
            assert!(
                aux == r.tensor(Role::Aux).1,
                "{}: aux differs",
                r.record.api
            );
        }
        if r.has(Role::AmaxD) {
            assert_eq!(f32_of(r, Role::AmaxD), amax as f32 as f64, "amax");
        }
    }
    let gemm_op = |i: usize| match &gemms[i].record.op {
        Op::Gemm(g) => g.clone(),
        other => panic!("{other:?}"),
    };
    // Sgemm: beta != 0 in place: C before the op; padded A packed to [k, m].
    let sg = gemm_op(0);
    assert_eq!(
        (sg.lda, sg.ldc, sg.alpha, sg.beta),
        (8, 6, Some(1.5), Some(0.5))
    );
    assert_eq!(gemms[0].tensor(Role::A).0.shape, vec![3, 5]);
    assert!(gemms[0].has(Role::CIn));
    assert_ne!(gemms[0].tensor(Role::CIn).1, gemms[0].tensor(Role::D).1);
    // GemmEx with beta = 0 reads no C.
    assert!(!gemms[1].has(Role::CIn));
    assert_eq!(
        (
            gemm_op(1).transa,
            gemm_op(1).a_type,
            gemm_op(1).compute_type
        ),
        (1, 14, 68)
    );
    // Strided batches: [batch, cols, rows], strides recorded as passed.
    assert_eq!(gemms[3].tensor(Role::A).0.shape, vec![3, 7, 6]);
    assert_eq!((gemm_op(3).batch, gemm_op(3).stride_a), (3, 6 * 7 + 3));
    // The pointer-array batch is a gap, with its parameters.
    match &gemms[5].record.op {
        Op::Gap(g) => {
            assert_eq!(g.reason, GapReason::ShapeUnknown);
            assert!(g.detail.contains("m=4 n=4 k=4 batch=1"), "{}", g.detail);
        }
        other => panic!("{other:?}"),
    }
    // Device pointer mode: alpha and beta captured as tensors, C taken.
    let dev = gemm_op(6);
    assert_eq!((dev.alpha, dev.beta), (None, None));
    assert_eq!(
        (scalar(gemms[6], Role::Alpha), scalar(gemms[6], Role::Beta)),
        (0.75, 1.0)
    );
    assert!(gemms[6].has(Role::CIn));
    // The TF32 math mode is the Sgemm's compute type.
    assert_eq!(gemm_op(7).compute_type, 77);
    // cuBLASLt: bias epilogue in place; FP8 with scales, amax and fast accumulation; GELU aux.
    assert_eq!(gemm_op(8).epilogue, 4);
    assert_eq!(gemms[8].tensor(Role::Bias).0.dtype, DType::BF16);
    assert!(gemms[8].has(Role::CIn));
    let fp8 = gemm_op(9);
    assert!(fp8.fast_accum && fp8.a_type == 28 && fp8.d_type == 28);
    assert_eq!(
        [Role::ScaleA, Role::ScaleB, Role::ScaleD].map(|s| f32_of(gemms[9], s)),
        [0.5, 2.0, 4.0]
    );
    assert!(!gemms[9].has(Role::CIn), "beta = 0: C is not read");
    assert!(f32_of(gemms[9], Role::AmaxD) > 0.0);
    assert_eq!(gemms[10].tensor(Role::Aux).0.shape, vec![2, 4, 8]);
    assert_eq!(gemm_op(10).batch, 2);
}

#[test]
fn the_selection_variables_limit_what_is_taken() {
    let run = traced(
        1,
        &["traced", "gemm"],
        &[
            ("TTRACE_APIS", "gemm"),
            ("TTRACE_INPUTS", "0"),
            ("TTRACE_MAX_TENSOR_BYTES", "200"),
        ],
    );
    assert_ok(&run);
    assert_checksums(&run);
    assert!(
        run.records
            .iter()
            .all(|r| r.record.api.starts_with("cublas")),
        "only GEMMs"
    );
    assert_eq!(run.records.len(), 11);
    for r in &run.records {
        for (t, b) in r.record.tensors.iter().zip(&r.bytes) {
            // The bias of a BIAS epilogue is read: an input too.
            let input = matches!(
                t.role,
                Role::A | Role::B | Role::CIn | Role::Alpha | Role::Beta | Role::Bias
            );
            let expect = !input && t.nbytes <= 200 && t.nbytes > 0;
            assert_eq!(
                b.is_some(),
                expect,
                "{} {:?} ({} bytes)",
                r.record.api,
                t.role,
                t.nbytes
            );
            assert_eq!(t.captured, b.is_some());
        }
    }
}
