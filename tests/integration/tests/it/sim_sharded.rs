//! Sharding changes round-off, never more: a K-sharded GEMM followed by an all-reduce (a
//! row-parallel linear layer) differs bitwise from the unsharded GEMM, in FP32 and BF16, yet both
//! stay within the analytic bound. This is the property every tolerance in `ttrace compare`
//! rests on, so the simulated stack must have it.

use integration_tests::{describe, simrun_probe};

fn ksplit(world: usize) {
    let out = simrun_probe(world, &["ksplit"]);
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for dtype in ["F32", "BF16"] {
        assert!(
            stdout.contains(&format!("W={world}: {dtype}:")),
            "no {dtype} report\n{}",
            describe(&out)
        );
    }
}

#[test]
fn k_sharded_gemm_plus_all_reduce_differs_only_by_round_off_over_2_ranks() {
    ksplit(2);
}

#[test]
fn k_sharded_gemm_plus_all_reduce_differs_only_by_round_off_over_4_ranks() {
    ksplit(4);
}
