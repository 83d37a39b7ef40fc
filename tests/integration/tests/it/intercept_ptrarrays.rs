//! Pointer-array batched GEMMs (`cublasGemmBatchedEx`, `cublas{S,D,H}gemmBatched`): when their
//! arrays of matrix addresses were uploaded from the host, each batch entry is captured from
//! those addresses, packed as a strided batch would be, and equals what the program computed;
//! the device arrays are captured too, as the op read them. When the arrays on the device are
//! not what was uploaded (rewritten on the device, a pinned source changed before its copy
//! ran) or were never uploaded (built on the device), the record is a gap saying so, never
//! data taken from the wrong matrices. (tests/sim/probe/src/ptrarrays.rs is the program.)

use crate::intercept_util;

use intercept_util::*;
use ttrace_format::dtype::DType;
use ttrace_format::record::{GapReason, Op, Role};

/// The `ptrarrays CASE A=.. B=.. C=.. D=..` lines of the program: (case, [A, B, C, D]).
fn expected(stdout: &str) -> Vec<(String, [Vec<u8>; 4])> {
    let unhex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    };
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ptrarrays "))
        .map(|l| {
            let mut parts = l.split(' ');
            let case = parts.next().expect("case").to_string();
            let mut vals = parts.map(|p| unhex(&p[2..]));
            let mut next = || vals.next().expect("four operands");
            (case, [next(), next(), next(), next()])
        })
        .collect()
}

#[test]
fn pointer_array_batches_are_captured_from_uploaded_arrays_and_distrusted_ones_are_gaps() {
    let run = traced(1, &["traced", "gemm-ptrarrays"], &[]);
    assert_ok(&run);
    assert_checksums(&run);
    let stdout = String::from_utf8_lossy(&run.out.stdout).to_string();
    let want = expected(&stdout);
    assert_eq!(
        want.iter().map(|w| w.0.as_str()).collect::<Vec<_>>(),
        ["ex", "s", "d", "h"],
        "{stdout}"
    );
    let recs: Vec<&Rec> = run
        .records
        .iter()
        .filter(|r| r.record.api.starts_with("cublas"))
        .collect();
    let apis: Vec<&str> = recs.iter().map(|r| r.record.api.as_str()).collect();
    assert_eq!(
        apis,
        [
            "cublasGemmBatchedEx",
            "cublasSgemmBatched",
            "cublasDgemmBatched",
            "cublasHgemmBatched",
            "cublasGemmBatchedEx",
            "cublasGemmBatchedEx",
            "cublasGemmBatchedEx",
        ]
    );

    // 1-4: every operand equals the program's, packed per entry; D recomputes from them.
    let dtypes = [DType::F32, DType::F32, DType::F64, DType::F16];
    let batches = [3, 2, 2, 4];
    for (i, (case, [a, b, c, d])) in want.iter().enumerate() {
        let r = recs[i];
        let Op::Gemm(g) = &r.record.op else {
            panic!("{case}: not captured: {:?}", r.record.op)
        };
        assert_eq!(
            (g.batch, g.stride_a, g.stride_c),
            (batches[i], 0, 0),
            "{case}"
        );
        assert_eq!(r.tensor(Role::A).0.dtype, dtypes[i], "{case}");
        assert_eq!(r.tensor(Role::A).0.shape[0], batches[i], "{case}");
        assert!(r.tensor(Role::A).1 == a.as_slice(), "{case}: A");
        assert!(r.tensor(Role::B).1 == b.as_slice(), "{case}: B");
        assert!(r.tensor(Role::D).1 == d.as_slice(), "{case}: D");
        if g.beta != Some(0.0) {
            assert!(r.tensor(Role::CIn).1 == c.as_slice(), "{case}: C before");
        }
        let (recomputed, _, _) = recompute(r);
        assert!(recomputed == d.as_slice(), "{case}: D differs from A, B, C");
        // The arrays, as the op read them: one address per entry.
        for role in [Role::ArrayA, Role::ArrayB, Role::ArrayC] {
            let (t, bytes) = r.tensor(role);
            assert_eq!((t.dtype, t.shape.clone()), (DType::U64, vec![batches[i]]));
            assert_eq!(bytes.len() as u64, 8 * batches[i]);
        }
    }
    assert!(matches!(recs[0].record.op, Op::Gemm(ref g) if g.beta == Some(0.5) && g.transb == 1));

    // 5-7: gaps naming why, with no tensor.
    let gap = |i: usize| match &recs[i].record.op {
        Op::Gap(g) => {
            assert_eq!(g.reason, GapReason::ShapeUnknown);
            assert!(recs[i].record.tensors.is_empty());
            g.detail.clone()
        }
        other => panic!("case {}: {other:?}", i + 1),
    };
    for i in [4, 5] {
        let d = gap(i);
        assert!(
            d.contains("differs from the bytes uploaded") && d.contains("m=2 n=2 k=2 batch=2"),
            "{d}"
        );
    }
    let d = gap(6);
    assert!(d.contains("built on the device"), "{d}");
    assert_eq!(run.summary.gaps, 3);

    // The captured batches check clean and compare equal to themselves.
    let checked = ttrace_compare::check::check_store(&run.store, &mut |_, _| {}).expect("check");
    assert!(checked.findings.is_empty(), "{:?}", checked.findings);
    let opts = ttrace_compare::CompareOptions::default();
    let cmp =
        ttrace_compare::compare(&run.store, &run.store, &opts, &mut |_, _| {}).expect("compare");
    assert!(cmp.first_divergence.is_none(), "{:?}", cmp.first_divergence);
}

#[test]
fn pointer_arrays_uploaded_while_copies_are_not_captured_are_still_found() {
    // `--apis gemm`: the uploads are not recorded, but their host bytes are remembered.
    let run = traced(1, &["traced", "gemm-ptrarrays"], &[("TTRACE_APIS", "gemm")]);
    assert_ok(&run);
    let kinds: Vec<bool> = run
        .records
        .iter()
        .map(|r| matches!(r.record.op, Op::Gemm(_)))
        .collect();
    assert!(
        run.records
            .iter()
            .all(|r| r.record.api.starts_with("cublas")),
        "only GEMMs are recorded"
    );
    assert_eq!(kinds, [true, true, true, true, false, false, false]);
}
