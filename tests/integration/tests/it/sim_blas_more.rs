//! The simulated cuBLAS's helper copies (all 16 forms), its f32 axpy/scal/dot/geam and
//! cuBLASLt's matrix transform compute what NVIDIA documents, with its status codes.

use integration_tests::{describe, probe};

#[test]
fn helper_copies_level1_and_lt_transform_compute_as_documented() {
    let out = probe(&["blas-more"]);
    assert!(
        out.status.success(),
        "sim-probe blas-more failed\n{}",
        describe(&out)
    );
}
