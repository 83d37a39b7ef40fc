//! The simulated cuBLAS and cuBLASLt compute GEMMs within round-off of an f64 reference,
//! bitwise equal to `sim_kernels::gemm` on the host, on the right stream, with cuBLAS's status
//! codes and cuBLASLt's descriptor, epilogue and FP8 rules.

use integration_tests::{describe, probe};

fn passes(args: &[&str]) {
    let out = probe(args);
    assert!(
        out.status.success(),
        "probe {args:?} failed\n{}",
        describe(&out)
    );
}

#[test]
fn cublas_gemms_are_within_round_off_and_bitwise_reproducible() {
    passes(&["gemm-cublas", "--sim"]);
}

#[test]
fn cublaslt_matmuls_epilogues_and_fp8_follow_the_library_rules() {
    passes(&["gemm-lt", "--sim"]);
}

#[test]
fn a_gemm_on_inaccessible_memory_faults_on_its_stream() {
    passes(&["gemm-fault"]);
}
