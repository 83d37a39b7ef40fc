//! The simulated driver's allocation, copies and memsets (`cuMemAlloc_v2`, `cuMemcpy*`,
//! `cuMemsetD8/D16/D32` and their `Async` forms) move the bytes CUDA documents.

use integration_tests::{describe, probe};

#[test]
fn driver_copies_and_memsets_move_the_bytes_cuda_documents() {
    let out = probe(&["driver-copies"]);
    assert!(
        out.status.success(),
        "sim-probe driver-copies failed\n{}",
        describe(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("driver-copies OK"),
        "{}",
        describe(&out)
    );
}
