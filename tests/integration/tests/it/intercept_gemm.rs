//! GEMMs under libttrace.so: every cuBLAS and cuBLASLt record carries operands from which
//! `sim_kernels::gemm` recomputes its captured result bitwise (so A, B and C were taken at the
//! right moment, packed right, with the right parameters, scales and epilogue).

use crate::intercept_util;

use intercept_util::*;
use ttrace_format::dtype::DType;
use ttrace_format::record::{Op, Role};

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
    // The pointer-array batch, its arrays uploaded from the host: captured from the uploaded
    // addresses (recomputed above), with the device arrays as the op read them.
    assert_eq!(gemm_op(5).batch, 1);
    assert_eq!(gemms[5].tensor(Role::A).0.shape, vec![1, 4, 4]);
    assert_eq!(gemms[5].tensor(Role::ArrayC).0.dtype, DType::U64);
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
