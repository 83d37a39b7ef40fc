//! The cuBLAS GEMM entry points beyond the core ones: typed strided batches (f64, f16),
//! `cublasSgemmEx`, the `_64` variants and gemv are captured, self-describing (batch count, strides,
//! leading dimensions as passed) and recompute bitwise from their own captured operands; a
//! pointer-array batch whose arrays were uploaded from the host is captured like a strided one.

use crate::intercept_util;

use intercept_util::*;
use ttrace_format::record::{GapReason, GemmOp, Op, Role};

fn gemm(r: &Rec) -> &GemmOp {
    match &r.record.op {
        Op::Gemm(g) => g,
        other => panic!("{}: {other:?}", r.record.api),
    }
}

#[test]
fn batched_ex_64_bit_and_pointer_array_gemms_are_captured() {
    let run = traced(1, &["traced", "gemm-more"], &[]);
    assert_ok(&run);
    assert_checksums(&run);
    let recs: Vec<&Rec> = run
        .records
        .iter()
        .filter(|r| r.record.api.starts_with("cublas"))
        .collect();
    let apis: Vec<&str> = recs.iter().map(|r| r.record.api.as_str()).collect();
    assert_eq!(
        apis,
        [
            "cublasDgemmStridedBatched",
            "cublasHgemmStridedBatched",
            "cublasSgemmEx",
            "cublasSgemm_v2_64",
            "cublasGemmEx_64",
            "cublasGemmStridedBatchedEx_64",
            "cublasDgemmStridedBatched_64",
            "cublasSgemmBatched",
            "cublasSgemv_v2",
        ]
    );
    for r in &recs {
        let (d, _, _) = recompute(r);
        assert!(
            d == r.tensor(Role::D).1,
            "{}: D differs from the recomputation",
            r.record.api
        );
    }
    // Strided batches carry batch count, strides and leading dimensions as passed; the
    // operands are packed per batch entry: [batch, cols, rows].
    let d = gemm(recs[0]);
    assert_eq!(
        (d.batch, d.lda, d.stride_a, d.stride_b, d.stride_c),
        (2, 6, 6 * 5 + 1, 5 * 3 + 2, 12)
    );
    assert_eq!(
        (d.a_type, d.compute_type, d.alpha, d.beta),
        (1, 70, Some(1.25), Some(-0.5))
    );
    assert_eq!(recs[0].tensor(Role::A).0.shape, vec![2, 5, 4]);
    assert!(recs[0].has(Role::CIn));
    let hb = gemm(recs[1]);
    assert_eq!(
        (hb.batch, hb.transa, hb.a_type, hb.compute_type),
        (3, 1, 2, 64)
    );
    assert!(!recs[1].has(Role::CIn), "beta = 0 reads no C");
    // SgemmEx: typed operands, f32 scalars and compute.
    let ex = gemm(recs[2]);
    assert_eq!(
        (ex.a_type, ex.c_type, ex.compute_type, ex.scale_type),
        (14, 0, 68, 0)
    );
    // The _64 variants record what their int twins record.
    assert_eq!(
        (gemm(recs[3]).m, gemm(recs[3]).alpha, gemm(recs[3]).batch),
        (3, Some(2.0), 1)
    );
    assert_eq!(
        (
            gemm(recs[4]).transa,
            gemm(recs[4]).a_type,
            gemm(recs[4]).d_type
        ),
        (1, 2, 0)
    );
    let sb = gemm(recs[5]);
    assert_eq!(
        (sb.batch, sb.transb, sb.stride_c, sb.beta),
        (2, 1, 9, Some(0.5))
    );
    assert_eq!(gemm(recs[6]).batch, 2);
    // The pointer-array batch (A and B the same matrices, arrays uploaded from the host): a
    // GEMM packed per entry, recomputed above.
    assert_eq!((gemm(recs[7]).batch, gemm(recs[7]).stride_a), (2, 0));
    assert_eq!(recs[7].tensor(Role::A).0.shape, vec![2, 3, 3]);
    assert_eq!(recs[7].tensor(Role::A).1, recs[7].tensor(Role::B).1);
    // The gemv is the GEMM m x 1 x k, x read as a transposed 1 x k matrix with ld = incx.
    let gv = gemm(recs[8]);
    assert_eq!(
        (gv.m, gv.n, gv.k, gv.transb, gv.lda, gv.ldb, gv.beta),
        (5, 1, 4, 1, 6, 2, Some(0.25))
    );
    assert_eq!(recs[8].tensor(Role::B).0.shape, vec![4, 1]);
    assert_eq!(run.summary.gaps, 0);
    // Neither check nor compare misjudges batched records or the gap: the store checks clean
    // and matches itself.
    let checked = ttrace_compare::check::check_store(&run.store, &mut |_, _| {}).expect("check");
    assert!(checked.findings.is_empty(), "{:?}", checked.findings);
    let opts = ttrace_compare::CompareOptions::default();
    let cmp =
        ttrace_compare::compare(&run.store, &run.store, &opts, &mut |_, _| {}).expect("compare");
    assert!(cmp.first_divergence.is_none(), "{:?}", cmp.first_divergence);
    assert!(
        !cmp.tensors.is_empty(),
        "nothing compared: {:?}",
        cmp.warnings
    );
}

#[test]
fn a_gemv_into_a_strided_output_is_a_gap_with_its_arguments() {
    // The simulator computes these (checked against f64 by the probe), so a call that moved
    // data and was not captured shows up as a gap, not as nothing.
    let run = traced(1, &["traced", "gemv-strided"], &[]);
    assert_ok(&run);
    let recs: Vec<&Rec> = run
        .records
        .iter()
        .filter(|r| r.record.api.starts_with("cublas"))
        .collect();
    let gaps: Vec<(&str, GapReason, &str)> = recs
        .iter()
        .map(|r| match &r.record.op {
            Op::Gap(g) => (g.skipped_api.as_str(), g.reason, g.detail.as_str()),
            other => panic!("{}: {other:?}", r.record.api),
        })
        .collect();
    assert_eq!(gaps.len(), 2, "{gaps:?}");
    assert_eq!(gaps[0].0, "cublasSgemv_v2");
    assert_eq!(gaps[1].0, "cublasDgemv_v2");
    assert!(gaps.iter().all(|g| g.1 == GapReason::Unsupported));
    assert!(gaps[0].2.contains("incx=1 incy=2"), "{}", gaps[0].2);
    assert!(gaps[1].2.contains("incx=2 incy=3"), "{}", gaps[1].2);
    assert_eq!(run.summary.gaps, 2);
}
