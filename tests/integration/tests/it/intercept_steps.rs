//! Step numbering under libttrace.so (docs/format.md): the `auto` rule finds the three
//! training steps of `sim-probe traced steps` (two micro-batches each, weights updated in place
//! after each step) with no code change; `nvtx:NAME` and `api` (`ttrace_step()`) follow the
//! program's marks; `TTRACE_STEPS` keeps only the selected steps without stalling the ring.

use crate::intercept_util;

use intercept_util::*;
use ttrace_format::record::{CopyDirection, Op, Role};

/// (step, short name) of every record.
fn steps(run: &Run) -> Vec<(u64, &'static str)> {
    run.records
        .iter()
        .map(|r| {
            let what = match &r.record.op {
                Op::Memcpy(m) if m.direction == CopyDirection::HostToDevice => "h2d",
                Op::Memcpy(_) => "d2d",
                Op::Gemm(_) => "gemm",
                other => panic!("unexpected {other:?}"),
            };
            (r.record.step, what)
        })
        .collect()
}

/// One training step: two micro-batches (copy, GEMM), then the optimizer's copy.
fn step(s: u64) -> Vec<(u64, &'static str)> {
    vec![(s, "h2d"), (s, "gemm"), (s, "h2d"), (s, "gemm"), (s, "d2d")]
}

/// The probe's setup: four host-to-device copies (weights and their updates).
fn setup() -> Vec<(u64, &'static str)> {
    vec![(0, "h2d"); 4]
}

#[test]
fn the_auto_rule_finds_steps_and_micro_batches_without_marks() {
    let run = traced(1, &["traced", "steps", "auto"], &[]);
    assert_ok(&run);
    let want: Vec<_> = [setup(), step(0), step(1), step(2)].concat();
    let got = steps(&run);
    // Setup and step 0 share step 0.
    let want: Vec<_> = want
        .into_iter()
        .enumerate()
        .map(|(i, (s, w))| if i < 4 { (0, w) } else { (s, w) })
        .collect();
    assert_eq!(got, want);
    // seq restarts with each step.
    let seqs: Vec<u64> = run.records.iter().map(|r| r.record.seq).collect();
    assert_eq!(&seqs[..9], &(0..9).collect::<Vec<_>>()[..]);
    assert_eq!(&seqs[9..14], &[0, 1, 2, 3, 4]);
}

#[test]
fn nvtx_and_api_marks_start_steps() {
    for (rule, arg) in [("nvtx:train_step", "nvtx"), ("api", "api")] {
        let run = traced(1, &["traced", "steps", arg], &[("TTRACE_STEP_RULE", rule)]);
        assert_ok(&run);
        // The setup is step 0; each mark opens the next step.
        let want: Vec<_> = [setup(), step(1), step(2), step(3)].concat();
        assert_eq!(steps(&run), want, "{rule}");
        if arg == "nvtx" {
            assert_eq!(run.records[4].record.nvtx, vec!["train_step".to_string()]);
        }
    }
    // `ttrace_step()` is ignored under the auto rule.
    let run = traced(1, &["traced", "steps", "api"], &[]);
    assert_eq!(steps(&run).last(), Some(&(2, "d2d")));
}

#[test]
fn selected_steps_only_and_the_ring_keeps_flowing() {
    // A ring of 4 KiB holds a few snapshots: the dropped steps' slots must be released by the
    // tracer itself, or the program would wait TTRACE_WAIT_MS per op and record RingFull gaps.
    let run = traced(
        1,
        &["traced", "steps", "auto"],
        &[
            ("TTRACE_STEPS", "1"),
            ("TTRACE_RING_BYTES", "4096"),
            ("TTRACE_WAIT_MS", "3000"),
        ],
    );
    assert_ok(&run);
    assert_checksums(&run);
    assert_eq!(steps(&run), step(1));
    assert_eq!(run.summary.gaps, 0);
}

#[test]
fn without_inputs_the_auto_rule_numbers_steps_as_a_full_capture_does() {
    // `--no-inputs`: A and B are read for the rule (their CRCs and samples) but not stored.
    let full = traced(1, &["traced", "steps", "auto"], &[]);
    let bare = traced(1, &["traced", "steps", "auto"], &[("TTRACE_INPUTS", "0")]);
    assert_ok(&bare);
    assert_checksums(&bare);
    assert_eq!(steps(&bare), steps(&full));
    let gemms: Vec<&Rec> = bare
        .records
        .iter()
        .filter(|r| matches!(r.record.op, Op::Gemm(_)))
        .collect();
    assert_eq!(gemms.len(), 6);
    for r in gemms {
        for t in &r.record.tensors {
            let input = matches!(t.role, Role::A | Role::B);
            assert_eq!(t.captured, !input, "{:?}", t.role);
            if input {
                assert_eq!(t.crc32, 0, "an input not stored has no checksum");
            }
        }
        assert!(r.has(Role::D));
    }
}
