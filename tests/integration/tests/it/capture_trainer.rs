//! The capture acceptance run: the fixture trainer at tp=2, dp=2, pp=2 (BF16, 3 steps, 2
//! micro-batches) under libttrace.so and a real ttraced. The store must hold every GEMM with
//! operands that recompute its output bitwise, every all-reduce with inputs that reduce to its
//! output, the weight upload equal to the trainer's canonical initialisation, no gap, and the
//! same step numbering as the world-1 reference run; tracing must not change a bit of the
//! training; and a rank killed mid-run must leave a readable store and no hang.

use crate::intercept_util;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use integration_tests::{bin, describe, sim_dir};
use intercept_util::*;
use ttrace_format::record::{CopyDirection, Op, Role};

const MODEL: &[&str] = &["--precision", "bf16", "--micro-batches", "2"];

fn trainer(world: usize, layout: &[&str], extra: &[&str]) -> Command {
    let mut c = if world > 1 {
        let mut c = Command::new(bin("simrun"));
        c.args(["--nproc-per-node", &world.to_string(), "--"])
            .arg(bin("trainer"));
        c
    } else {
        Command::new(bin("trainer"))
    };
    c.args(MODEL)
        .args(layout)
        .args(extra)
        .env("LD_LIBRARY_PATH", sim_dir());
    c
}

const LAYOUT: &[&str] = &["--tp", "2", "--dp", "2", "--pp", "2"];

fn losses(out: &std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("step "))
        .map(String::from)
        .collect()
}

/// Steps seen per rank.
fn steps_per_rank(run: &Run) -> BTreeMap<u32, u64> {
    let mut m = BTreeMap::new();
    for r in &run.records {
        let e = m.entry(r.record.rank).or_insert(0);
        *e = (*e).max(r.record.step + 1);
    }
    m
}

/// The trainer's initial fp32 master weights on `rank`, as blocks (one per parameter) from
/// `--steps 0 --dump`.
fn initial_blocks(dir: &std::path::Path, rank: u32) -> Vec<Vec<u8>> {
    let tsv = std::fs::read_to_string(dir.join(format!("weights.rank{rank}.tsv"))).expect("tsv");
    let data = std::fs::read(dir.join(format!("weights.rank{rank}.f32"))).expect("f32");
    tsv.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let (off, count): (usize, usize) =
                (f[4].parse().expect("offset"), f[5].parse().expect("count"));
            data[off..off + count * 4].to_vec()
        })
        .collect()
}

#[test]
fn the_trainer_at_tp2_dp2_pp2_is_captured_completely_and_exactly() {
    // The reference (world 1) and the distributed run, untraced and traced.
    let reference = traced_command(trainer(1, &[], &["--steps", "3"]));
    assert_ok(&reference);
    let plain = trainer(8, LAYOUT, &["--steps", "3"])
        .output()
        .expect("simrun starts");
    assert!(plain.status.success(), "{}", describe(&plain));
    let run = traced_command(trainer(8, LAYOUT, &["--steps", "3"]));
    assert_ok(&run);
    assert_checksums(&run);

    assert_eq!(losses(&plain).len(), 3);
    assert_eq!(
        losses(&run.out),
        losses(&plain),
        "tracing changed the losses"
    );
    assert_eq!(run.summary.gaps, 0, "gaps in a lossless run");
    assert_eq!(run.summary.processes.len(), 8);

    // Step numbering: every rank finds the reference's steps.
    let ref_steps = steps_per_rank(&reference);
    assert_eq!(ref_steps.values().copied().collect::<Vec<_>>(), vec![3]);
    for (rank, steps) in steps_per_rank(&run) {
        assert_eq!(
            steps, 3,
            "rank {rank} numbered {steps} steps, the reference 3"
        );
    }

    // Every GEMM recomputes bitwise from its captured inputs.
    let mut gemms = 0;
    for r in &run.records {
        if let Op::Gemm(_) = &r.record.op {
            let (d, _, _) = recompute(r);
            assert!(
                d == r.tensor(Role::D).1,
                "rank {} step {} seq {} ({}, {:?}): D differs from its recomputation",
                r.record.rank,
                r.record.step,
                r.record.seq,
                r.record.api,
                r.record.nvtx
            );
            gemms += 1;
        }
    }
    assert!(gemms > 100, "{gemms} GEMMs");

    // Every all-reduce output is the ring-order reduction of its group's captured inputs.
    assert!(check_all_reduces(&run.records) >= 10);

    // The weight upload (the largest host-to-device copy of step 0 on each rank) holds the
    // trainer's canonical initialisation: every parameter block at its own place.
    let dump = TempDir::new("capture-init");
    let d = trainer(
        8,
        LAYOUT,
        &["--steps", "0", "--dump", &dump.path().to_string_lossy()],
    )
    .output()
    .expect("simrun starts");
    assert!(d.status.success(), "{}", describe(&d));
    for rank in 0..8u32 {
        let upload = run
            .of_rank(rank)
            .into_iter()
            .filter(|r| {
                r.record.step == 0
                    && matches!(&r.record.op, Op::Memcpy(m) if m.direction == CopyDirection::HostToDevice)
            })
            .max_by_key(|r| r.record.tensors[0].nbytes)
            .expect("a weight upload");
        let bytes = upload.bytes[0].as_deref().expect("captured");
        let mut blocks = initial_blocks(dump.path(), rank);
        // Largest first, so that small, repetitive blocks (norm weights of ones) take the
        // places left over.
        blocks.sort_by_key(|b| std::cmp::Reverse(b.len()));
        let mut taken = vec![false; bytes.len()];
        for b in &blocks {
            let at = (0..=bytes.len() - b.len())
                .step_by(4)
                .find(|&i| {
                    !taken[i..i + b.len()].iter().any(|&t| t)
                        && &bytes[i..i + b.len()] == b.as_slice()
                })
                .unwrap_or_else(|| {
                    panic!(
                        "rank {rank}: a parameter block of {} bytes is not in the upload",
                        b.len()
                    )
                });
            taken[at..at + b.len()].iter_mut().for_each(|t| *t = true);
        }
        let stray = (0..bytes.len())
            .filter(|&i| !taken[i] && bytes[i] != 0)
            .count();
        assert_eq!(
            stray, 0,
            "rank {rank}: upload bytes outside every parameter block (not padding)"
        );
    }
}

/// Pid of the trainer process with `RANK=rank` under simrun.
/// A deeper model: at the last pipeline stage the next micro-batch's activations differ from
/// the previous one's by only ~0.2 (relative), closer to an optimizer's nudge than a model's
/// input ever is. The auto rule must still take them for new data: 3 steps on every rank
/// (a rule that took moves under 0.25 for weight updates numbered ranks 4-7 as 4 steps).
#[test]
fn a_deep_pipeline_stage_numbers_one_step_per_training_iteration() {
    let deep = [
        "--steps", "3", "--hidden", "256", "--layers", "8", "--ffn", "512",
    ];
    let run = traced_command(trainer(8, LAYOUT, &deep));
    assert_ok(&run);
    let steps = steps_per_rank(&run);
    assert_eq!(steps.len(), 8, "{steps:?}");
    for (rank, n) in steps {
        assert_eq!(
            n, 3,
            "rank {rank} numbered {n} steps for 3 training iterations"
        );
    }
}

fn rank_pid(rank: u32) -> Option<i32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmd).contains("trainer") {
            continue;
        }
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let env = String::from_utf8_lossy(&env);
        let ours = format!("ttrace-capture-kill-{}-", std::process::id());
        let mut vars = env.split('\0');
        if vars.clone().any(|v| v == format!("RANK={rank}"))
            && vars.any(|v| v.starts_with("TTRACE_SOCKET=") && v.contains(&ours))
        {
            return Some(pid);
        }
    }
    None
}

#[test]
fn a_rank_killed_mid_run_leaves_a_readable_store_and_no_hang() {
    // The daemon's socket path names this test and process, so the killer finds exactly our
    // rank 3.
    let c = trainer(8, LAYOUT, &["--steps", "400"]);
    let killer = std::thread::spawn(|| {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            if let Some(pid) = rank_pid(3) {
                // Let it publish a few steps first.
                std::thread::sleep(Duration::from_millis(300));
                // SAFETY: a plain kill(2) of a process this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    });
    let t = Instant::now();
    let run = traced_command_tagged(c, "capture-kill");
    assert!(
        killer.join().expect("killer thread"),
        "rank 3 never started"
    );
    assert!(
        t.elapsed() < Duration::from_secs(120),
        "the job took {:?} after a rank died",
        t.elapsed()
    );
    assert!(
        !run.out.status.success(),
        "the job must fail when a rank dies"
    );
    let rank3 = run
        .summary
        .processes
        .iter()
        .find(|p| p.rank == 3)
        .expect("rank 3 registered");
    assert!(!rank3.clean_exit, "rank 3 was killed");
    assert!(rank3.records > 0, "rank 3 published before it died");
    // Everything the daemon accepted reads back intact (read_store panics on a corrupt frame).
    let stored = run.of_rank(3).len() as u64;
    assert_eq!(
        stored, rank3.records,
        "rank 3's published records are all in the store"
    );
    assert!(run.records.iter().any(|r| r.record.rank != 3));
}
