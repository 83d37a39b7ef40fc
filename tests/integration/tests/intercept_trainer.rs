//! The fixture trainer (tests/trainer: Megatron-style TP+SP, DP with ZeRO-1, BF16, cuBLASLt)
//! under libttrace.so on four ranks: its losses are unchanged, the `auto` rule finds its three
//! steps on every rank with no code change, nothing is skipped, and every all-reduce it ran
//! checks out against the captured inputs of its group (what `ttrace check` relies on).

mod intercept_util;

use std::collections::BTreeMap;
use std::process::Command;

use integration_tests::{bin, describe, sim_dir};
use intercept_util::*;
use sim_kernels::reduce::{allreduce_first_rank, reduce_chain, ReduceOp};
use ttrace_format::record::{CollectiveKind, Op, Role};

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

    // Every all-reduce: per communicator, the n-th call of each member.
    let mut calls: BTreeMap<(u64, usize), Vec<&Rec>> = BTreeMap::new();
    let mut count: BTreeMap<(u64, u32), usize> = BTreeMap::new();
    for r in &run.records {
        let Op::Collective(c) = &r.record.op else {
            continue;
        };
        if c.kind != CollectiveKind::AllReduce {
            continue;
        }
        let n = count.entry((c.comm, r.record.rank)).or_default();
        calls.entry((c.comm, *n)).or_default().push(r);
        *n += 1;
    }
    assert!(!calls.is_empty());
    let mut checked = 0;
    for ((comm, n), mut recs) in calls {
        let Op::Collective(c0) = &recs[0].record.op else {
            unreachable!()
        };
        assert_eq!(recs.len(), c0.comm_size as usize, "comm {comm:x} call {n}");
        recs.sort_by_key(|r| match &r.record.op {
            Op::Collective(c) => c.comm_rank,
            _ => unreachable!(),
        });
        let (t, _) = recs[0].tensor(Role::Input);
        let dt = sim_dtype(t.dtype);
        let op = match c0.redop {
            Some(0) => ReduceOp::Sum,
            Some(2) => ReduceOp::Max,
            Some(3) => ReduceOp::Min,
            Some(4) => ReduceOp::avg(dt, recs.len()),
            other => panic!("reduction {other:?}"),
        };
        let inputs: Vec<&[u8]> = recs.iter().map(|r| r.tensor(Role::Input).1).collect();
        let es = dt.size();
        let count = inputs[0].len() / es;
        let mut want = vec![0u8; inputs[0].len()];
        for e in 0..count {
            let one: Vec<&[u8]> = inputs.iter().map(|i| &i[e * es..(e + 1) * es]).collect();
            let first = allreduce_first_rank(e, count, inputs.len());
            reduce_chain(dt, op, &one, first, &mut want[e * es..(e + 1) * es]);
        }
        for r in &recs {
            assert!(
                r.tensor(Role::Output).1 == &want[..],
                "all-reduce {n} on comm {comm:x}, rank {}: output differs",
                r.record.rank
            );
        }
        checked += 1;
    }
    assert!(checked >= 10, "{checked} all-reduces checked");
}
