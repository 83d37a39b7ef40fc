//! CUDA libraries the hooks cannot be in front of are said to be lost, not left silent: a
//! program that reaches the runtime and cuBLAS as JAX's XLA plugin does (tests/integration/c/
//! private_blas.c: `dlopen` without `RTLD_GLOBAL`, every entry point through
//! `dlsym(handle, ...)`) makes calls no `LD_PRELOAD` hook sees. Each such library is one
//! `unsupported` gap naming it, recorded at exit, also when the process captured nothing else
//! (its session starts then), so the run never reports itself clean. A library in the global
//! scope is not reported, and its calls are captured as usual.

use crate::intercept_util;

use integration_tests::c_build::compile_c;
use intercept_util::*;
use ttrace_format::record::{GapReason, Op};

#[test]
fn libraries_loaded_without_rtld_global_are_gaps_naming_them() {
    for major in [12, 13] {
        let Some(sim) = integration_tests::sim_dir_for(major) else {
            eprintln!(
                "SKIP CUDA {major}: build its simulated stack (scripts/build-sim-cuda13.sh \
                 --release; scripts/test.sh does)"
            );
            continue;
        };
        let exe = compile_c(
            "private_blas.c",
            &format!("private_blas{major}"),
            major,
            &sim,
            &[],
        );
        let (cudart, cublas) = (
            format!("libcudart.so.{major}"),
            format!("libcublas.so.{major}"),
        );
        for (scope, private) in [
            ("local", vec![cudart.as_str(), cublas.as_str()]),
            ("global", vec![cublas.as_str()]),
        ] {
            let mut cmd = std::process::Command::new(&exe);
            cmd.args([scope, &cudart, &cublas])
                .env_remove("LD_LIBRARY_PATH");
            let run = traced_command_tagged(cmd, "private-blas-c");
            assert_ok(&run);
            let out = String::from_utf8_lossy(&run.out.stdout);
            assert!(
                out.contains("private_blas: OK"),
                "CUDA {major} {scope}: {out}"
            );
            let mut gaps: Vec<(&str, GapReason)> = Vec::new();
            for r in &run.records {
                if let Op::Gap(g) = &r.record.op {
                    assert!(
                        g.detail.contains("without RTLD_GLOBAL"),
                        "CUDA {major} {scope}: {}",
                        g.detail
                    );
                    gaps.push((g.skipped_api.as_str(), g.reason));
                }
            }
            let want: Vec<(&str, GapReason)> = private
                .iter()
                .map(|&l| (l, GapReason::Unsupported))
                .collect();
            assert_eq!(
                gaps, want,
                "CUDA {major} {scope}: one gap per private library"
            );
            assert_eq!(run.summary.gaps, want.len() as u64, "CUDA {major} {scope}");
            // The GEMM went to the private cuBLAS: no hook saw it. The copies are captured
            // when the runtime is in the global scope.
            let gemms = run
                .records
                .iter()
                .filter(|r| matches!(r.record.op, Op::Gemm(_)))
                .count();
            let copies = run
                .records
                .iter()
                .filter(|r| matches!(r.record.op, Op::Memcpy(_)))
                .count();
            assert_eq!(gemms, 0, "CUDA {major} {scope}");
            assert_eq!(
                copies,
                if scope == "global" { 3 } else { 0 },
                "CUDA {major} {scope}"
            );
            let err = String::from_utf8_lossy(&run.out.stderr);
            assert!(
                err.contains(&format!("{cublas} was loaded without RTLD_GLOBAL")),
                "CUDA {major} {scope}: said on stderr: {err}"
            );
        }
    }
}
