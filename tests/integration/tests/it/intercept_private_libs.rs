//! Entry points taken with `dlsym(handle, name)` are hooked like linked ones: a program that
//! reaches the runtime and cuBLAS as JAX's XLA plugin does (tests/integration/c/private_blas.c:
//! `dlopen` without `RTLD_GLOBAL`, every entry point through `dlsym(handle, ...)`, no CUDA
//! symbol linked) has its copies and its GEMM captured with their bytes, through the interposed
//! `dlsym` (intercept/src/dlsym.rs). A lookup that finds a second copy of a library, one the
//! hooks do not call, is handed that copy and becomes an `unsupported` gap naming the function
//! and said on stderr: the run does not report itself clean.

use crate::intercept_util;

use integration_tests::c_build::compile_c;
use intercept_util::*;
use ttrace_format::record::{GapReason, Op, Role};

fn f32_bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(f32::to_le_bytes).collect()
}

#[test]
fn entry_points_taken_with_dlsym_from_a_private_library_are_captured() {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("SKIP: dlsym is interposed on x86-64 only");
        return;
    }
    for (major, sim) in cuda_sims() {
        let exe = compile_c(
            "private_blas.c",
            &format!("private_blas{major}"),
            major,
            &sim,
            &[],
        );
        let cudart = format!("libcudart.so.{major}");
        let cublas = format!("libcublas.so.{major}");
        let mut cmd = std::process::Command::new(&exe);
        cmd.args([&cudart, &cublas]).env_remove("LD_LIBRARY_PATH");
        let run = traced_command_tagged(cmd, "private-blas-c");
        assert_ok(&run);
        assert_checksums(&run);
        let out = String::from_utf8_lossy(&run.out.stdout);
        assert!(out.contains("private_blas: OK"), "CUDA {major}: {out}");
        let apis: Vec<&str> = run.records.iter().map(|r| r.record.api.as_str()).collect();
        assert_eq!(
            apis,
            ["cudaMemcpy", "cudaMemcpy", "cublasSgemm_v2", "cudaMemcpy"],
            "CUDA {major}: every call the program made through dlsym, nothing else"
        );
        let a = f32_bytes((0..12).map(|i| i as f32 * 0.5));
        let b = f32_bytes((0..6).map(|i| (i % 3) as f32 - 1.0));
        let gemm = &run.records[2];
        assert!(matches!(gemm.record.op, Op::Gemm(_)), "CUDA {major}");
        assert_eq!(gemm.tensor(Role::A).1, &a[..], "CUDA {major}");
        assert_eq!(gemm.tensor(Role::B).1, &b[..], "CUDA {major}");
        assert_eq!(run.summary.gaps, 0, "CUDA {major}: nothing lost");
    }
}

#[test]
fn a_lookup_in_a_second_copy_of_a_library_is_a_gap_naming_the_function() {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("SKIP: dlsym is interposed on x86-64 only");
        return;
    }
    let sim = integration_tests::sim_dir();
    let exe = compile_c("private_blas.c", "private_blas12", 12, &sim, &[]);
    // A second file of the simulated cuBLAS, dlopened privately after the first was loaded
    // with RTLD_GLOBAL: the hooks call the first copy.
    let dir = integration_tests::profile_dir().join("c-private-blas-copy");
    std::fs::create_dir_all(&dir).expect("dir");
    let copy = dir.join("libcublas.so.12");
    std::fs::copy(sim.join("libcublas.so.12"), &copy).expect("copy the library");
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("libcudart.so.12")
        .arg(&copy)
        .arg(sim.join("libcublas.so.12"))
        .env_remove("LD_LIBRARY_PATH");
    let run = traced_command_tagged(cmd, "private-blas-copy");
    assert_ok(&run);
    let gaps: Vec<(&str, GapReason)> = run
        .records
        .iter()
        .filter_map(|r| match &r.record.op {
            Op::Gap(g) => Some((g.skipped_api.as_str(), g.reason)),
            _ => None,
        })
        .collect();
    // Only hooked entry points are redirected, so only they can be lost: cublasCreate_v2 and
    // cublasDestroy_v2 are not hooked.
    assert_eq!(
        gaps,
        [("cublasSgemm_v2", GapReason::Unsupported)],
        "the GEMM taken from the second copy"
    );
    assert_eq!(run.summary.gaps, 1);
    assert!(
        !run.records
            .iter()
            .any(|r| matches!(r.record.op, Op::Gemm(_))),
        "the second copy's GEMM is not captured (no hook saw it)"
    );
    let err = String::from_utf8_lossy(&run.out.stderr);
    assert!(err.contains("a copy of the library other than"), "{err}");
}

/// Another `LD_PRELOAD` wrapper beside libttrace.so (tests/integration/c/wrap_next.c: a
/// profiler-style `cudaMemcpy` that chains with `dlsym(RTLD_NEXT, ...)`) still finds the next
/// definition after itself, in either preload order: the interposed `dlsym` hands `RTLD_NEXT`
/// to the C library with the caller's return address. Both tools see every call: the wrapper
/// counts the program's two `cudaMemcpy` calls, ttrace records them.
#[test]
fn another_preloaded_wrapper_chaining_with_rtld_next_still_finds_its_next() {
    let sim = integration_tests::sim_dir();
    let wrap = integration_tests::c_build::compile_preload_c("wrap_next.c", "wrap_next");
    let exe = compile_c(
        "graph_nodes.c",
        "graph_nodes12",
        12,
        &sim,
        &["libcudart.so.12"],
    );
    let ttrace = libttrace().display().to_string();
    let wrap = wrap.display().to_string();
    for preload in [format!("{ttrace}:{wrap}"), format!("{wrap}:{ttrace}")] {
        let mut cmd = std::process::Command::new(&exe);
        cmd.env_remove("LD_LIBRARY_PATH");
        let run = traced_command_preloaded(cmd, "wrap-next", &preload);
        assert_ok(&run);
        let err = String::from_utf8_lossy(&run.out.stderr);
        assert!(
            err.contains("wrap_next: 2 calls chained"),
            "LD_PRELOAD={preload}: {err}"
        );
        let copies = run
            .records
            .iter()
            .filter(|r| r.record.api == "cudaMemcpy")
            .count();
        assert_eq!(copies, 2, "LD_PRELOAD={preload}: ttrace saw both copies");
    }
}
