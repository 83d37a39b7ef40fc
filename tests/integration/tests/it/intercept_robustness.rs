//! libttrace.so never changes what a program sees: with `TTRACE=0` the probes behave
//! exactly as untraced; traced, they still pass (every check of the simulated stack, under
//! capture); failing calls return the same codes; graph capture becomes a gap and the graph
//! replays correctly; a device fault disables capture with one log line and a gap.

use crate::intercept_util;

use integration_tests::describe;
use intercept_util::*;
use ttrace_format::record::{GapReason, Op, Role};

/// Single-process probes (and their arguments) that check the simulated stack's behaviour.
const PROBES: &[&[&str]] = &[
    &["gemm-cublas", "--sim"],
    &["gemm-lt", "--sim"],
    &["stream-order"],
    &["stale-read"],
    &["capture"],
    &["pageable-copies"],
    &["errors"],
    &["traced", "memcpy"],
    &["traced", "gemm"],
    &["traced", "graph"],
    &["traced", "errors"],
    &["traced", "fork"],
    &["collectives", "single-process"],
];

fn gaps(run: &Run) -> Vec<(GapReason, String)> {
    run.records
        .iter()
        .filter_map(|r| match &r.record.op {
            Op::Gap(g) => Some((g.reason, g.skipped_api.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn with_capture_off_every_probe_behaves_as_untraced() {
    for args in PROBES {
        let plain = untraced(1, args);
        let pre = probe_command(1, args)
            .env("LD_PRELOAD", libttrace())
            .env("TTRACE", "0")
            .output()
            .expect("probe starts");
        assert!(
            plain.status.success(),
            "{args:?} untraced\n{}",
            describe(&plain)
        );
        assert!(
            pre.status.success(),
            "{args:?} preloaded\n{}",
            describe(&pre)
        );
        assert_eq!(plain.stdout, pre.stdout, "{args:?}: same output");
        assert!(
            pre.stderr.is_empty(),
            "{args:?}: nothing logged\n{}",
            describe(&pre)
        );
    }
    let pre = probe_command(3, &["collectives"])
        .env("LD_PRELOAD", libttrace())
        .env("TTRACE", "0")
        .output()
        .expect("simrun starts");
    assert!(pre.status.success(), "{}", describe(&pre));
}

#[test]
fn traced_probes_still_pass_and_their_snapshots_are_intact() {
    for args in PROBES {
        let run = traced(1, args, &[]);
        assert!(
            run.out.status.success(),
            "{args:?} traced\n{}",
            describe(&run.out)
        );
        assert_checksums(&run);
        assert!(
            !stderr(&run.out).contains("ttrace["),
            "{args:?}: the tracer logged\n{}",
            describe(&run.out)
        );
    }
    let run = traced(3, &["collectives"], &[]);
    assert_ok(&run);
    assert_checksums(&run);
    assert_eq!(run.summary.processes.len(), 3);
    assert!(run
        .summary
        .processes
        .iter()
        .all(|p| p.clean_exit && p.error.is_none()));
    // The probe captures one all-reduce into a graph and launches it twice: no gap, and each
    // launch is a record on every rank (10 000 floats of input and output).
    let g = gaps(&run);
    assert!(g.is_empty(), "{g:?}");
    for rank in 0..3 {
        let replays = run
            .of_rank(rank)
            .into_iter()
            .filter(|r| match &r.record.op {
                Op::Collective(c) => {
                    r.record.api == "ncclAllReduce"
                        && c.count == 10_000
                        && r.record.tensors.iter().all(|t| t.captured)
                }
                _ => false,
            })
            .count();
        // Three of that size: the eager one in between and the two replays.
        assert_eq!(replays, 3, "rank {rank}");
    }
}

#[test]
fn failing_calls_return_the_same_codes_under_the_tracer() {
    let plain = untraced(1, &["traced", "errors"]);
    let run = traced(1, &["traced", "errors"], &[]);
    assert_ok(&run);
    let line = String::from_utf8_lossy(&plain.stdout);
    assert!(line.contains("codes ["), "{line}");
    assert_eq!(run.out.stdout, plain.stdout);
    // A failed call is not a record.
    assert!(
        run.records
            .iter()
            .all(|r| !r.record.api.starts_with("cublas")),
        "no GEMM ran"
    );
}

#[test]
fn ops_in_a_captured_graph_are_snapshotted_at_each_replay_and_the_graph_still_replays() {
    let run = traced(1, &["traced", "graph"], &[]);
    assert_ok(&run);
    assert!(String::from_utf8_lossy(&run.out.stdout).contains("2 replays"));
    assert_eq!(gaps(&run), vec![]);
    // The graph's copy and GEMM, once per replay, with that replay's bytes.
    let gemms: Vec<&Rec> = run
        .records
        .iter()
        .filter(|r| r.record.api == "cublasGemmEx")
        .collect();
    assert_eq!(gemms.len(), 2);
    for g in &gemms {
        assert_eq!(
            recompute(g).0,
            g.tensor(Role::D).1,
            "replay GEMM recomputes"
        );
    }
    assert_ne!(gemms[0].tensor(Role::B).1, gemms[1].tensor(Role::B).1);
    let copies: Vec<&Rec> = run
        .records
        .iter()
        .filter(|r| r.record.api == "cudaMemcpyAsync" && r.has(Role::Dst))
        .filter(|r| r.tensor(Role::Dst).0.nbytes == 8 * 8 * 4)
        .collect();
    // A's upload before the capture, then the graph's copy once per replay.
    let replayed: Vec<&[u8]> = copies.iter().map(|r| r.tensor(Role::Dst).1).collect();
    for g in &gemms {
        assert!(
            replayed.contains(&g.tensor(Role::B).1),
            "each replay's copy carries the GEMM's B"
        );
    }
}

#[test]
fn a_device_fault_disables_capture_with_one_line_and_a_gap() {
    let run = traced(1, &["gemm-fault"], &[]);
    assert_ok(&run);
    let err = stderr(&run.out);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("ttrace[")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("capture disabled"), "{err}");
    let g = gaps(&run);
    assert_eq!(g.len(), 1, "{g:?}");
    assert_eq!(g[0].0, GapReason::TracerFault);
}

/// `sim-probe ARGS` traced with the simulator refusing what `SIM_CUDA_REFUSE_REGISTERED_COPY`
/// says (`which`): the program's output must be the untraced one.
fn traced_refusing(args: &[&str], which: &str) -> Run {
    let plain = untraced(1, args);
    let run = traced(1, args, &[("SIM_CUDA_REFUSE_REGISTERED_COPY", which)]);
    assert_ok(&run);
    assert_eq!(run.out.stdout, plain.stdout, "{args:?} runs as untraced");
    run
}

/// Where the run's `copy_refused` gaps are among its records.
fn copy_refused_at(run: &Run) -> Vec<usize> {
    (0..run.records.len())
        .filter(|&i| {
            matches!(&run.records[i].record.op, Op::Gap(g) if g.reason == GapReason::CopyRefused)
        })
        .collect()
}

/// Nothing is lost silently: a snapshot copy the runtime refuses (an H200 refused copies
/// across two pinned registrations) leaves its tensor as metadata only in the op's record, and
/// a `copy_refused` gap right after the record names the API, the tensor and the error. The
/// program sees nothing.
#[test]
fn a_snapshot_copy_the_runtime_refuses_is_a_gap_after_its_record() {
    let run = traced_refusing(&["traced", "gemm"], "3");
    assert!(
        stderr(&run.out).contains("refused"),
        "{}",
        describe(&run.out)
    );
    let at = copy_refused_at(&run);
    assert_eq!(at.len(), 1, "one refused copy, one gap");
    let i = at[0];
    let Op::Gap(g) = &run.records[i].record.op else {
        unreachable!("filtered on gaps");
    };
    assert!(i > 0, "the gap follows its record");
    let before = &run.records[i - 1].record;
    assert_eq!(before.api, g.skipped_api, "{g:?}");
    assert_eq!(before.seq + 1, run.records[i].record.seq);
    let lost: Vec<_> = before.tensors.iter().filter(|t| !t.captured).collect();
    assert_eq!(lost.len(), 1, "{:?}", before.tensors);
    assert_eq!(g.bytes, lost[0].nbytes);
    assert!(
        g.detail.contains(&format!("{:?}", lost[0].role)),
        "the gap names the tensor: {}",
        g.detail
    );
    assert_eq!(run.summary.gaps, 1, "the daemon counts it");
}

/// The same in a CUDA graph: a replay whose snapshot node the runtime refuses to point at the
/// replay's ring slot records that tensor as metadata only, with a `copy_refused` gap after
/// the replay's record; the graph still replays as untraced.
#[test]
fn a_refused_graph_snapshot_node_is_a_gap_after_the_replays_record() {
    let run = traced_refusing(&["traced", "graph"], "node:1");
    let at = copy_refused_at(&run);
    assert_eq!(at.len(), 1, "one refused node, one gap");
    let (gap, before) = (&run.records[at[0]].record, &run.records[at[0] - 1].record);
    let Op::Gap(g) = &gap.op else {
        unreachable!("filtered on gaps");
    };
    assert_eq!(before.api, g.skipped_api, "{g:?}");
    assert!(
        before
            .tensors
            .iter()
            .any(|t| !t.captured && t.nbytes == g.bytes),
        "the replay's record keeps the tensor as metadata: {:?} {g:?}",
        before.tensors
    );
    assert!(g.detail.contains("graph snapshot node"), "{}", g.detail);
}

#[test]
fn a_forked_child_passes_through_and_the_parent_keeps_capturing() {
    let plain = untraced(1, &["traced", "fork"]);
    let run = traced(1, &["traced", "fork"], &[]);
    assert_ok(&run);
    assert_eq!(
        run.out.stdout, plain.stdout,
        "the child's copy fails the same way"
    );
    assert!(
        !stderr(&run.out).contains("ttrace["),
        "{}",
        describe(&run.out)
    );
    assert_eq!(run.summary.processes.len(), 1, "the child never connected");
    let copies: Vec<_> = run
        .records
        .iter()
        .filter(|r| matches!(r.record.op, Op::Memcpy(_)))
        .collect();
    assert_eq!(
        copies.len(),
        2,
        "the parent's two copies, before and after the fork"
    );
    assert_checksums(&run);
}

#[test]
fn an_environment_that_is_not_utf8_is_no_problem() {
    use std::os::unix::ffi::OsStrExt;
    let junk = std::ffi::OsStr::from_bytes(b"\xff\xfe junk");
    let run = traced_with(1, &["traced", "memcpy"], |c| {
        c.env("NOT_UTF8", junk);
    });
    assert_ok(&run);
    assert!(!run.records.is_empty());
}
