//! Block-scaled cuBLASLt GEMMs (MXFP8: E4M3 operands with `VEC32_UE8M0` block scales): the
//! scales are captured as `BlockScaleA`/`BlockScaleB` (`F8_E8M0`, cuBLASLt's tiled layout),
//! byte-exact with what the program uploaded, and D follows from the captured operands once
//! they are dequantized by them (ttrace_format::blockscale, checked against the simulator's
//! own implementation of the layout). A scale rewritten on the device before the GEMM makes
//! `ttrace compare` find the divergence at that GEMM, its input A (dequantized) already wrong;
//! a clean run matches itself.

use crate::intercept_util;

use intercept_util::*;
use ttrace_format::blockscale::dequantize_operand;
use ttrace_format::dtype::DType;
use ttrace_format::record::{Op, Role};
use ttrace_format::tensor::element_f64;

/// The program's `blockscaled A=.. SA=.. B=.. SB=.. D=..` line, decoded.
fn printed(stdout: &str) -> Vec<Vec<u8>> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("blockscaled "))
        .expect("the program prints its operands");
    line.split(' ')
        .map(|p| {
            let h = &p[p.find('=').expect("name=hex") + 1..];
            (0..h.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&h[i..i + 2], 16).expect("hex"))
                .collect()
        })
        .collect()
}

fn matmul(run: &Run) -> &Rec {
    run.records
        .iter()
        .find(|r| r.record.api == "cublasLtMatmul")
        .expect("the matmul is recorded")
}

#[test]
fn mxfp8_scales_are_captured_and_d_follows_from_the_dequantized_operands() {
    let run = traced(1, &["traced", "gemm-blockscaled"], &[]);
    assert_ok(&run);
    assert_checksums(&run);
    assert_eq!(
        run.summary.gaps, 0,
        "a block-scaled GEMM is no longer a gap"
    );
    let want = printed(&String::from_utf8_lossy(&run.out.stdout));
    let r = matmul(&run);
    let Op::Gemm(g) = &r.record.op else {
        panic!("{:?}", r.record.op)
    };
    for (role, bytes) in [
        (Role::A, &want[0]),
        (Role::BlockScaleA, &want[1]),
        (Role::B, &want[2]),
        (Role::BlockScaleB, &want[3]),
        (Role::D, &want[4]),
    ] {
        assert!(
            r.tensor(role).1 == bytes.as_slice(),
            "{role:?} differs from the program's"
        );
    }
    assert_eq!(r.tensor(Role::BlockScaleA).0.dtype, DType::F8_E8M0);
    assert!(!r.has(Role::ScaleA), "block scales are not scalar scales");

    // D = A^T B of the dequantized operands, rounded once to BF16.
    let decode = |role, scale_role, is_a| {
        let (t, bytes) = r.tensor(role);
        let mut v: Vec<f32> = (0..bytes.len())
            .map(|i| element_f64(t.dtype, bytes, i).unwrap() as f32)
            .collect();
        let (s, sb) = r.tensor(scale_role);
        assert!(dequantize_operand(&mut v, g, is_a, sb, s.dtype));
        v
    };
    let a = decode(Role::A, Role::BlockScaleA, true);
    let b = decode(Role::B, Role::BlockScaleB, false);
    let (m, n, k) = (g.m as usize, g.n as usize, g.k as usize);
    let d = r.tensor(Role::D).1;
    for j in 0..n {
        for i in 0..m {
            let exact: f64 = (0..k)
                .map(|kk| a[i * k + kk] as f64 * b[j * k + kk] as f64)
                .sum();
            let got = element_f64(DType::BF16, d, j * m + i).unwrap();
            assert!(
                (got - exact).abs() <= exact.abs() * 2f64.powi(-8) + 1e-6,
                "D[{i},{j}] = {got}, dequantized operands give {exact}"
            );
        }
    }
}

#[test]
fn export_writes_block_scales_as_safetensors_f8_e8m0() {
    let run = traced(1, &["traced", "gemm-blockscaled"], &[]);
    assert_ok(&run);
    let want = printed(&String::from_utf8_lossy(&run.out.stdout));
    let out_dir = run.store.with_extension("export");
    let out = std::process::Command::new(integration_tests::bin("ttrace"))
        .arg("export")
        .arg(&run.store)
        .args(["--format", "safetensors", "--roles", "BlockScaleA", "--out"])
        .arg(&out_dir)
        .output()
        .expect("ttrace export runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = std::fs::read_dir(&out_dir)
        .expect("export written")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .expect("a safetensors file");
    let bytes = std::fs::read(file).expect("read");
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("header");
    let (_, t) = header
        .as_object()
        .unwrap()
        .iter()
        .find(|(k, _)| *k != "__metadata__")
        .expect("one tensor");
    assert_eq!(t["dtype"], "F8_E8M0");
    let off = &t["data_offsets"];
    let (a, b) = (
        off[0].as_u64().unwrap() as usize,
        off[1].as_u64().unwrap() as usize,
    );
    assert!(
        bytes[8 + n + a..8 + n + b] == want[1][..],
        "the scales' bytes, as uploaded"
    );
}

#[test]
fn a_scale_corrupted_on_the_device_diverges_at_its_gemm() {
    let clean = traced(1, &["traced", "gemm-blockscaled"], &[]);
    let bad = traced(1, &["traced", "gemm-blockscaled", "corrupt"], &[]);
    assert_ok(&clean);
    assert_ok(&bad);
    let opts = ttrace_compare::CompareOptions::default();
    let same = ttrace_compare::compare(&clean.store, &clean.store, &opts, &mut |_, _| {})
        .expect("compare");
    assert!(
        same.first_divergence.is_none(),
        "{:?}",
        same.first_divergence
    );
    let cmp =
        ttrace_compare::compare(&clean.store, &bad.store, &opts, &mut |_, _| {}).expect("compare");
    let div = cmp.first_divergence.expect("the corrupted scale is found");
    assert!(
        div.position.contains("cublasLtMatmul"),
        "{} ({:?}: {})",
        div.position,
        div.cause,
        div.explanation
    );
    // The scale changed before the op read it, by a write ttrace does not see: A, as the op
    // reads it (dequantized), was already wrong.
    assert!(
        matches!(div.cause, ttrace_compare::report::Cause::Upstream)
            && div.explanation.contains("input A"),
        "{:?}: {}",
        div.cause,
        div.explanation
    );
}
