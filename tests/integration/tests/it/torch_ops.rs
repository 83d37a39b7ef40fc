//! Real PyTorch (the PyPI wheels, in venvs made by scripts/torch-venv.sh) on the simulated CUDA
//! stack, traced by `ttrace run`: copies, cuBLAS and cuBLASLt GEMMs in fp32/fp16/bf16, an FP8
//! `torch._scaled_mm`, a linear backward, and a kernel launch that torch must turn into a
//! Python exception (tests/torch/ops.py). torch's NVTX ranges (NVTX 3, compiled into torch)
//! are on the records of the ops inside them, and `--step-rule nvtx:NAME` numbers the steps by
//! them.
//!
//! Asserted: the program's exit status and every tensor it saw are the same traced and
//! untraced; every tensor torch copied back is byte-equal to a captured copy, and every GEMM
//! result to a captured GEMM output `D`; no gap; `ttrace check` has nothing to say.
//! Skips (passing, with a SKIP line) when the venv is absent.

use crate::torch_util;

use integration_tests::{describe, TempDir};
use torch_util::{captured_as, check_is_silent, export, find, saved, Torch};
use ttrace_format::store::Manifest;

/// Labels of tensors that are a GEMM's output.
const GEMM_LABELS: [&str; 9] = [
    "mm_",
    "addmm_",
    "linear_",
    "bmm_",
    "baddbmm_",
    "scaled_mm",
    "bwd_",
    "after_refusal_mm",
    "linear_bias_",
];

fn ops(version: &'static str) {
    let Some(torch) = find(version) else { return };
    let tmp = TempDir::new(&format!("torch-ops-{version}"));
    let script = Torch::script("ops.py");
    let plain_out = tmp.path().join("plain");
    let traced_out = tmp.path().join("traced");
    let store = tmp.path().join("store");
    let code = std::path::Path::new("3");

    let plain = torch.plain(&torch.python, &[&script, &plain_out, code]);
    assert_eq!(
        plain.status.code(),
        Some(3),
        "untraced run: {}",
        describe(&plain)
    );
    let traced = torch.traced(&store, &torch.python, &[&script, &traced_out, code]);
    assert_eq!(
        traced.status.code(),
        Some(3),
        "traced run: {}",
        describe(&traced)
    );
    for o in [&plain, &traced] {
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(
            stdout.contains("kernel launch refused: CUDA error: no kernel image"),
            "torch raised its RuntimeError for the kernel launch: {}",
            describe(o)
        );
    }

    let stderr = String::from_utf8_lossy(&traced.stderr);
    let attached: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("attached to CUDA runtime"))
        .collect();
    assert_eq!(attached.len(), 1, "one attach line: {}", describe(&traced));
    assert!(
        attached[0].contains(&format!("libcudart.so.{}", torch.cuda_major)),
        "attached to the wrong runtime: {}",
        attached[0]
    );

    let seen = saved(&traced_out);
    assert_eq!(
        seen,
        saved(&plain_out),
        "tracing changed what torch computed"
    );
    assert!(seen.len() >= 25, "{} tensors saved", seen.len());

    let m = Manifest::read(&store).expect("manifest");
    assert!(m.finalized);
    assert_eq!(m.ranks.len(), 1);
    assert_eq!(m.ranks[0].gaps, 0, "gaps recorded: {}", describe(&traced));

    let cap = export(&store, &tmp.path().join("export"));
    for t in &seen {
        assert!(
            captured_as(&cap, 0, &t.bytes, |api, role| api.starts_with("cudaMemcpy")
                && (role == "Src" || role == "Dst")),
            "{}: no captured copy has torch's bytes",
            t.name
        );
        if GEMM_LABELS.iter().any(|l| t.label().starts_with(l)) {
            assert!(
                captured_as(&cap, 0, &t.bytes, |api, role| api.starts_with("cublas")
                    && role == "D"),
                "{}: no captured GEMM output D has torch's bytes",
                t.name
            );
        }
    }
    // Which entry points torch picks differs between versions (2.10: cublasSgemm_v2 /
    // cublasGemmEx / cublasLtMatmul; 2.15 more cuBLASLt); the bias and FP8 GEMMs are cuBLASLt
    // in both.
    assert!(
        cap.iter().any(|c| c.api == "cublasLtMatmul"),
        "no cublasLtMatmul captured"
    );
    // torch's NVTX ranges (NVTX 3, compiled into torch) are on the records of the ops
    // inside them, once each.
    let records = crate::intercept_util::read_store(&store);
    let ranges: Vec<(&str, Vec<&str>)> = records
        .iter()
        .map(|r| {
            let path = r.record.nvtx.iter().map(String::as_str).collect();
            (r.record.api.as_str(), path)
        })
        .collect();
    let gemm_ranges = ["gemms.float32", "gemms.float16", "gemms.bfloat16"];
    for (api, path) in &ranges {
        assert!(
            path.is_empty()
                || (path.len() == 1 && (path[0] == "copies" || gemm_ranges.contains(&path[0]))),
            "{api}: NVTX path {path:?}"
        );
    }
    assert!(
        ranges
            .iter()
            .any(|(api, path)| api.starts_with("cudaMemcpy") && path == &["copies"]),
        "no copy in the range `copies`: {ranges:?}"
    );
    for g in gemm_ranges {
        assert!(
            ranges
                .iter()
                .any(|(api, path)| api.starts_with("cublas") && path == &[g]),
            "no GEMM in the range `{g}`: {ranges:?}"
        );
    }
    check_is_silent(&store);

    // A range torch opens, pushed (`torch.cuda.nvtx.range`) or started
    // (`torch.cuda.nvtx.range_start`), is a step boundary under `--step-rule nvtx:NAME`: the
    // copies before it stay in step 0, its GEMMs and what follows are step 1.
    for (rule, name) in [
        ("nvtx:gemms.float16", "marked"),
        ("nvtx:from.float16", "started"),
    ] {
        let marked = tmp.path().join(name);
        let out = torch.traced_with(
            &marked,
            &["--step-rule", rule],
            &torch.python,
            &[&script, &tmp.path().join(format!("{name}-out"))],
        );
        assert!(out.status.success(), "{rule}: {}", describe(&out));
        let records = crate::intercept_util::read_store(&marked);
        let step_of = |range: &str| -> Vec<u64> {
            let mut steps: Vec<u64> = records
                .iter()
                .filter(|r| r.record.nvtx.first().is_some_and(|n| n == range))
                .map(|r| r.record.step)
                .collect();
            steps.dedup();
            steps
        };
        assert_eq!(step_of("copies"), [0], "{rule}: the copies before the mark");
        assert_eq!(step_of("gemms.float32"), [0], "{rule}");
        assert_eq!(
            step_of("gemms.float16"),
            [1],
            "{rule}: the mark starts step 1"
        );
        assert_eq!(step_of("gemms.bfloat16"), [1], "{rule}");
    }
}

#[test]
fn torch_2_10_cuda_12_ops_are_captured_byte_exact() {
    ops("2.10.0");
}

#[test]
fn torch_2_15_cuda_13_ops_are_captured_byte_exact() {
    ops("2.15.0");
}
