//! `TTRACE_STEPS` is applied before the snapshot work (docs/capture.md, "What filtering
//! saves"): the hooks copy of an unselected step only what the step rule needs, and stop
//! capturing past the last selected step. What a user relies on: the selected steps are stored
//! exactly as a full capture stores them (same step, seq, tensors, CRC-32s, bytes), and the
//! counts still add up (taken = published + dropped + unpublished, nothing unpublished).

use crate::intercept_util;
use crate::torch_util;

use std::process::Command;

use integration_tests::{bin, describe, sim_dir};
use intercept_util::*;
use ttrace_format::record::Op;
use ttrace_format::store::Manifest;

/// The fixture trainer at tp 2 x dp 2 (bf16, two micro-batches), `steps` steps.
fn trainer(steps: u32) -> Command {
    let mut c = Command::new(bin("simrun"));
    c.args(["--nproc-per-node", "4", "--"])
        .arg(bin("trainer"))
        .args(["--precision", "bf16", "--micro-batches", "2"])
        .args(["--tp", "2", "--dp", "2", "--steps", &steps.to_string()])
        .env("LD_LIBRARY_PATH", sim_dir());
    c
}

fn traced_steps(steps: u32, select: Option<&str>) -> Run {
    traced_selecting(trainer(steps), "prefilter", select)
}

/// `c` traced (daemon directory named after `tag`) with the steps `select`ed, saying at exit
/// what it dropped (`TTRACE_LOG=info`); it succeeded and its checksums hold.
fn traced_selecting(mut c: Command, tag: &str, select: Option<&str>) -> Run {
    c.env("TTRACE_LOG", "info");
    if let Some(s) = select {
        c.env("TTRACE_STEPS", s);
    }
    let run = traced_command_tagged(c, tag);
    assert_ok(&run);
    assert_checksums(&run);
    run
}

/// What a record says about the program, without what differs between two runs of it
/// (thread ids, clock times, addresses: the address space is laid out anew each run).
fn essence(r: &Rec) -> String {
    let mut rec = r.record.clone();
    (rec.thread, rec.t_call_ns, rec.t_done_ns, rec.stream) = (0, 0, 0, 0);
    for t in &mut rec.tensors {
        t.ptr = 0;
    }
    // Kernels without a registered name are named by their (relocated) host address.
    for k in &mut rec.kernels_before {
        if k.starts_with("fn@0x") {
            *k = "fn@".into();
        }
    }
    match &mut rec.op {
        Op::Memcpy(m) => (m.dst, m.src) = (0, 0),
        Op::Memset(m) => m.dst = 0,
        Op::Collective(c) => (c.sendbuff, c.recvbuff, c.comm) = (0, 0, 0),
        _ => {}
    }
    format!("{rec:?} {:?}", r.bytes)
}

/// The records of `step`, by rank and seq.
fn of_step(run: &Run, step: u64) -> Vec<String> {
    run.records
        .iter()
        .filter(|r| r.record.step == step)
        .map(essence)
        .collect()
}

/// The records of a filtered capture are those of the full one (the first difference shown).
fn assert_same(got: &[String], want: &[String], what: &str) {
    let cut = |s: &str| s.chars().take(700).collect::<String>();
    if let Some(i) = (0..got.len().min(want.len())).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: record {i} differs from the full capture's\n got: {}\nwant: {}",
            cut(&got[i]),
            cut(&want[i])
        );
    }
    assert_eq!(got.len(), want.len(), "{what}: records");
}

/// Per process, the dropped records its hooks left out and those they reduced before the
/// snapshot (from the `TTRACE_LOG=info` line at exit).
fn left_out_and_reduced(out: &std::process::Output) -> Vec<(u64, u64)> {
    // "... dropped: X left out by their hooks (...), Y reduced to what the step rule needs ..."
    let number_before = |text: &str, words: &str| -> Option<u64> {
        let (head, _) = text.split_once(words)?;
        head.split_whitespace().last()?.parse().ok()
    };
    stderr(out)
        .lines()
        .filter_map(|l| {
            let (_, tail) = l.split_once(" dropped: ")?;
            let left_out = number_before(tail, " left out by their hooks")?;
            let reduced = number_before(tail, " reduced to what")?;
            Some((left_out, reduced))
        })
        .collect()
}

/// Per process, how many dropped records its hooks had reduced or left out.
fn reduced_per_process(out: &std::process::Output) -> Vec<u64> {
    left_out_and_reduced(out)
        .into_iter()
        .map(|(l, r)| l + r)
        .collect()
}

/// Every process published or dropped what it took, and lost nothing.
fn assert_counts_add_up(run: &Run) -> u64 {
    let m = Manifest::read(&run.store).expect("manifest");
    assert_eq!(m.ranks.len(), 4);
    let mut dropped = 0;
    for r in &m.ranks {
        assert!(r.clean_exit, "rank {} did not exit cleanly", r.rank);
        assert_eq!(r.unpublished, 0, "rank {} lost snapshots", r.rank);
        assert!(
            r.taken >= r.records + r.gaps,
            "rank {}: taken {} < published {}",
            r.rank,
            r.taken,
            r.records + r.gaps
        );
        dropped += r.taken - r.records - r.gaps;
    }
    dropped
}

/// Each of the four processes of every run in `runs` said (`TTRACE_LOG=info`) that the step
/// rule follows a period, in words that contain `said`.
fn assert_periods(runs: &[&Run], said: &str) {
    for run in runs {
        let log = stderr(&run.out);
        let periods = log.lines().filter(|l| l.contains(said)).count();
        assert_eq!(periods, 4, "every process follows the period:\n{log}");
    }
}

#[test]
fn selected_steps_are_stored_exactly_as_a_full_capture_stores_them() {
    let full = traced_steps(10, None);
    assert_eq!(full.summary.gaps, 0);
    assert_eq!(
        assert_counts_add_up(&full),
        0,
        "a full capture drops nothing"
    );
    let last = full.records.iter().map(|r| r.record.step).max();
    assert_eq!(last, Some(9), "the full capture numbers ten steps");

    // A late step: the steps before it are numbered from GEMM operand snapshots only, and
    // from step 2 on only from those of the GEMMs where the anchor recurs (the period of the
    // steps, docs/format.md "Periods"), in the full capture as in this one.
    let late = traced_steps(10, Some("8"));
    assert_periods(&[&full, &late], "follows the steps' period from step 2:");
    assert!(late.records.iter().all(|r| r.record.step == 8));
    let want = of_step(&full, 8);
    assert!(want.len() > 100, "{} records in step 8", want.len());
    assert_same(&of_step(&late, 8), &want, "step 8");
    assert!(
        assert_counts_add_up(&late) > 0,
        "the other steps are dropped, counted"
    );
    let reduced = reduced_per_process(&late.out);
    assert_eq!(reduced.len(), 4, "{}", stderr(&late.out));
    assert!(
        reduced.iter().all(|&n| n > 20),
        "the hooks reduced {reduced:?} snapshots of the earlier steps"
    );

    // The first step only: capture stops once the tracer is past it, and says so.
    let first = traced_steps(10, Some("0"));
    assert_same(&of_step(&first, 0), &of_step(&full, 0), "step 0");
    assert_eq!(first.records.len(), of_step(&full, 0).len());
    assert_counts_add_up(&first);
    let log = stderr(&first.out);
    assert!(
        log.contains("capture stops at step 1"),
        "no word of capture stopping:\n{log}"
    );
}

/// A program unlike the trainer (fixture2: C against NVIDIA's headers, one micro-batch,
/// cuBLASLt and cuBLAS, weights stored transposed): the rule learns its own period (five GEMMs
/// a step, one read), and a late selected step is stored as the full capture stores it.
#[test]
fn a_second_fixtures_selected_step_is_stored_as_its_full_capture_stores_it() {
    let run = |select: Option<&str>| {
        let mut c = Command::new(bin("simrun"));
        c.args(["--nproc-per-node", "4", "--"])
            .arg(crate::compare_fixture2::fixture2())
            .args("--precision bf16 --tp 2 --dp 2 --steps 10".split(' '))
            .env("LD_LIBRARY_PATH", sim_dir());
        traced_selecting(c, "prefilter-f2", select)
    };
    let full = run(None);
    assert_eq!(full.records.iter().map(|r| r.record.step).max(), Some(9));
    let late = run(Some("7"));
    assert_periods(
        &[&full, &late],
        "follows the steps' period from step 2: 5 GEMMs a step",
    );
    let want = of_step(&full, 7);
    assert!(want.len() > 40, "{} records in step 7", want.len());
    assert_same(&of_step(&late, 7), &want, "fixture2 step 7");
    assert!(late.records.iter().all(|r| r.record.step == 7));
    assert!(assert_counts_add_up(&late) > 0);
}

/// Every tensor in a fresh buffer, as under a caching allocator (sim-probe `traced steps
/// backward`): only the weight gradient's read of the anchor's 2 MiB input, transposed, tells
/// the `auto` rule where a step ends. Outside the selected step that read is copied as a
/// glimpse, not whole (fingerprint.rs); the rule numbers the steps as it does from the whole
/// bytes, and the selected step is stored as a full capture stores it.
#[test]
fn glimpsed_backward_reads_number_the_steps_as_a_full_capture_does() {
    let args = ["traced", "steps", "backward"];
    let full = traced(1, &args, &[]);
    assert_ok(&full);
    let gemm_steps: Vec<u64> = full
        .records
        .iter()
        .filter(|r| matches!(r.record.op, Op::Gemm(_)))
        .map(|r| r.record.step)
        .collect();
    let want: Vec<u64> = (0..5).flat_map(|s| [s; 3]).collect();
    assert_eq!(gemm_steps, want, "a step per iteration");
    let last = traced(1, &args, &[("TTRACE_STEPS", "4"), ("TTRACE_LOG", "info")]);
    assert_ok(&last);
    assert_checksums(&last);
    let want = of_step(&full, 4);
    assert_same(&of_step(&last, 4), &want, "step 4");
    assert_eq!(last.records.len(), want.len(), "only step 4 is stored");
    // "..., N of them glimpses alone), ..." at exit: the weight gradients of steps 2 and 3
    // (the anchor is known from step 1's records on; whether a hook knows it yet depends on
    // how far the tracer got, which the probe's pause between iterations makes likely, not
    // certain, on a loaded machine: one of the two is asked for).
    let log = stderr(&last.out);
    let glimpses = log
        .split_once(" of them glimpses alone")
        .and_then(|(head, _)| head.split_whitespace().last()?.parse::<u64>().ok());
    assert!(
        glimpses.is_some_and(|n| n >= 1),
        "the weight gradients of the first steps were not glimpsed:\n{log}"
    );
}

#[test]
fn steps_outside_the_run_store_nothing_and_lose_nothing() {
    let run = traced_steps(2, Some("50-60"));
    assert!(run.records.is_empty(), "{} records", run.records.len());
    assert!(
        assert_counts_add_up(&run) > 0,
        "the run's records are dropped, counted"
    );
}

/// A process driving four devices is four ranks: `TTRACE_RANKS` keeps the selected devices'
/// records, exactly as a full capture has them, and drops the others (counted).
#[test]
fn ranks_of_one_process_are_selected_per_device() {
    let args = ["collectives", "single-process"];
    let full = traced(1, &args, &[]);
    assert_ok(&full);
    let some = traced(1, &args, &[("TTRACE_RANKS", "1,3")]);
    assert_ok(&some);
    assert_checksums(&some);
    let ranks: std::collections::BTreeSet<u32> =
        some.records.iter().map(|r| r.record.rank).collect();
    assert_eq!(ranks, [1, 3].into(), "only the selected devices' ranks");
    for rank in [1, 3] {
        let of =
            |run: &Run| -> Vec<String> { run.of_rank(rank).into_iter().map(essence).collect() };
        assert_same(&of(&some), &of(&full), &format!("rank {rank}"));
    }
    let m = Manifest::read(&some.store).expect("manifest");
    let taken: u64 = m.ranks.iter().map(|r| r.taken).sum();
    let published: u64 = m.ranks.iter().map(|r| r.records + r.gaps).sum();
    assert!(m.ranks.iter().all(|r| r.unpublished == 0), "{:?}", m.ranks);
    assert_eq!(
        taken - published,
        (full.records.len() - some.records.len()) as u64,
        "the other devices' records are dropped, counted"
    );
}

/// Under `nvtx:NAME` and `api` the marks bound the step: a selected step is stored as a full
/// capture stores it, and capture stops past it. The records of the steps before it are left
/// out by their hooks (nothing reduced, no tracer work), and still counted into their steps:
/// the marks carry how many were left out.
#[test]
fn marks_bound_the_step_under_the_nvtx_and_api_rules() {
    for (probe_rule, rule) in [("nvtx", "nvtx:train_step"), ("api", "api")] {
        let args = ["traced", "steps", probe_rule];
        let rule = ("TTRACE_STEP_RULE", rule);
        let full = traced(1, &args, &[rule]);
        assert_ok(&full);
        let two = traced(
            1,
            &args,
            &[rule, ("TTRACE_STEPS", "2"), ("TTRACE_LOG", "info")],
        );
        assert_ok(&two);
        assert_checksums(&two);
        assert!(!of_step(&full, 2).is_empty(), "{probe_rule}: a step 2");
        assert_same(
            &two.records.iter().map(essence).collect::<Vec<_>>(),
            &of_step(&full, 2),
            &format!("{probe_rule}: step 2"),
        );
        let log = stderr(&two.out);
        assert!(log.contains("capture stops at step 3"), "{log}");
        assert!(
            matches!(left_out_and_reduced(&two.out)[..], [(left_out, 0)] if left_out > 0),
            "{probe_rule}: steps 0 and 1 left out by their hooks: {log}"
        );
    }
}

/// A mark rule that never saw its mark numbers the whole run step 0 (a misspelt name): the
/// process says so, the store keeps it, and a comparison of the store says so too, naming
/// the ranges the program did open.
#[test]
fn a_mark_rule_that_never_matched_is_kept_by_the_store_and_said_by_compare() {
    let args = ["traced", "steps", "nvtx"];
    let run = traced(1, &args, &[("TTRACE_STEP_RULE", "nvtx:train-step")]);
    assert_ok(&run);
    assert!(run.records.iter().all(|r| r.record.step == 0));
    let said = "TTRACE_STEP_RULE=nvtx:train-step, but no NVTX range or mark named `train-step` \
                was seen: the whole run is step 0 (the outermost names seen: `train_step` (3)";
    assert!(stderr(&run.out).contains(said), "{}", stderr(&run.out));
    let opts = ttrace_compare::CompareOptions::default();
    let cmp =
        ttrace_compare::compare(&run.store, &run.store, &opts, &mut |_, _| {}).expect("compare");
    for store in ["reference", "run"] {
        assert!(
            cmp.warnings
                .iter()
                .any(|w| w.starts_with(&format!("{store} rank 0 warned when captured: {said}"))),
            "{store}: {:?}",
            cmp.warnings
        );
    }
}

/// PyTorch (the Megatron-style model of tests/torch, world 1, bf16, two micro-batches) with
/// `--steps 3` of five iterations: step 3 is stored as a full capture stores it. Skipped where
/// the torch venv is missing (scripts/torch-venv.sh).
#[test]
fn torch_megatron_selected_step_is_stored_as_a_full_capture_stores_it() {
    let Some(torch) = torch_util::find("2.10.0") else {
        return;
    };
    let tmp = integration_tests::TempDir::new("prefilter-torch");
    let script = torch_util::Torch::script("megatron.py");
    let args: Vec<std::path::PathBuf> = [
        "--precision",
        "bf16",
        "--micro-batches",
        "2",
        "--steps",
        "5",
    ]
    .iter()
    .map(std::path::PathBuf::from)
    .collect();
    let mut argv = vec![script.as_path()];
    argv.extend(args.iter().map(|p| p.as_path()));
    let run = |name: &str, options: &[&str]| {
        let store = tmp.path().join(name);
        let out = torch.traced_with(&store, options, &torch.python, &argv);
        assert!(out.status.success(), "{}", describe(&out));
        read_store(&store)
    };
    let full = run("full", &[]);
    let three = run("three", &["--steps", "3"]);
    let of = |recs: &[Rec]| -> Vec<String> {
        recs.iter()
            .filter(|r| r.record.step == 3)
            .map(essence)
            .collect()
    };
    assert!(!of(&full).is_empty(), "the full capture has a step 3");
    assert_eq!(three.len(), of(&three).len(), "only step 3 is stored");
    assert_same(&of(&three), &of(&full), "torch step 3");
}
