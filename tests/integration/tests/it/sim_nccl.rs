//! The simulated NCCL across processes: every collective against an f64 reference, groups,
//! splits and point-to-point under `simrun`, and bounded failure when a rank dies.

use std::process::Output;
use std::time::{Duration, Instant};

use integration_tests::{bin, command, describe, probe, simrun_probe};

/// How long the survivors of a dead rank may take to fail (they notice within a fraction of a
/// second; the rest is slack for a loaded machine). simrun's grace period is far longer, so a
/// hang cannot pass for a failure.
const FAILURE_BOUND: Duration = Duration::from_secs(20);

fn ok_lines(out: &Output) -> usize {
    String::from_utf8_lossy(&out.stdout)
        .matches("collectives OK")
        .count()
}

#[test]
fn collectives_on_four_ranks_match_the_reference() {
    let out = simrun_probe(4, &["collectives"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(ok_lines(&out), 4, "{}", describe(&out));
}

#[test]
fn tiny_staging_slots_and_mailboxes_give_the_same_results_on_three_ranks() {
    // Many windows per collective and messages thousands of times the mailbox; an odd ring.
    let out = command("simrun")
        .env("SIM_NCCL_SLOT_BYTES", "4096")
        .env("SIM_NCCL_MBOX_BYTES", "512")
        .args(["--nproc-per-node", "3", "--"])
        .arg(bin("sim-probe"))
        .arg("collectives")
        .output()
        .expect("simrun starts");
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(ok_lines(&out), 3, "{}", describe(&out));
}

#[test]
fn one_process_drives_four_devices_with_init_all_and_grouped_init() {
    let out = probe(&["collectives", "single-process"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("4 devices: collectives OK"),
        "{}",
        describe(&out)
    );
}

/// Runs the probe's peer-failure mode and checks that every survivor reported the NCCL error
/// and exited nonzero, quickly.
fn survivors_fail(mode: &str, nproc: usize, victim: usize) {
    let t0 = Instant::now();
    let out = command("simrun")
        .args(["--grace-period", "120", "--nproc-per-node"])
        .arg(nproc.to_string())
        .arg("--")
        .arg(bin("sim-probe"))
        .args(["collectives", mode, &victim.to_string()])
        .output()
        .expect("simrun starts");
    let took = t0.elapsed();
    assert!(!out.status.success(), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("peer failure detected").count(),
        nproc - 1,
        "every survivor must report the failure\n{}",
        describe(&out)
    );
    assert!(
        stderr.contains("ncclResult 6"),
        "survivors report ncclRemoteError\n{}",
        describe(&out)
    );
    assert!(
        took < FAILURE_BOUND,
        "the job took {took:?} to fail\n{}",
        describe(&out)
    );
}

#[test]
fn a_killed_rank_makes_every_other_rank_fail_within_seconds() {
    survivors_fail("kill", 4, 2);
}

#[test]
fn a_rank_that_exits_makes_every_other_rank_fail_within_seconds() {
    survivors_fail("exit", 3, 0);
}
