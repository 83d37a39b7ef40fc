//! The fixture trainer (tests/trainer: Megatron-style TP+SP, DP with ZeRO-1, BF16, cuBLASLt)
//! under libttrace.so on four ranks: its losses are unchanged, the `auto` rule finds its three
//! steps on every rank with no code change, nothing is skipped, and every all-reduce it ran
//! checks out against the captured inputs of its group (what `ttrace check` relies on).

use crate::intercept_util;

use std::process::Command;

use integration_tests::{bin, describe, sim_dir};
use intercept_util::*;

const ARGS: &[&str] = &[
    "--steps",
    "3",
    "--tp",
    "2",
    "--dp",
    "2",
    "--sp",
    "--zero1",
    "--micro-batches",
    "2",
    "--precision",
    "bf16",
    "--gemm",
    "lt",
];

fn trainer() -> Command {
    let mut c = Command::new(bin("simrun"));
    c.args(["--nproc-per-node", "4", "--"])
        .arg(bin("trainer"))
        .args(ARGS)
        .env("LD_LIBRARY_PATH", sim_dir());
    c
}

fn losses(out: &std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("step "))
        .map(String::from)
        .collect()
}

#[test]
fn the_trainer_traced_on_four_ranks() {
    let plain = trainer().output().expect("simrun starts");
    assert!(plain.status.success(), "{}", describe(&plain));
    let run = traced_command(trainer());
    assert_ok(&run);
    assert_checksums(&run);
    assert_eq!(
        losses(&run.out),
        losses(&plain),
        "tracing changed the training"
    );
    assert_eq!(losses(&plain).len(), 3);
    assert_eq!(run.summary.gaps, 0);
    assert_eq!(run.summary.processes.len(), 4);
    for p in &run.summary.processes {
        assert_eq!(
            p.steps, 3,
            "rank {}: the auto rule finds the 3 steps",
            p.rank
        );
        assert!(p.clean_exit);
    }

    let checked = check_all_reduces(&run.records);
    assert!(checked >= 10, "{checked} all-reduces checked");
}
