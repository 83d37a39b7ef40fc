//! Crash accounting: six host-to-device copies and one Sgemm, then the
//! process dies by `abort`, `_exit`, SIGSEGV or SIGKILL. On the catchable ones the snapshots
//! already taken are published first and the program's exit status is unchanged; whatever the
//! way, the store accounts for every snapshot taken: stored + reported lost = taken, and
//! `ttrace ls` shows the lost count.

use crate::intercept_util;

use std::os::unix::process::ExitStatusExt;

use integration_tests::{bin, describe};
use intercept_util::*;
use ttrace_format::record::Role;
use ttrace_format::store::Manifest;

/// Runs `sim-probe big crash HOW` traced; returns the run and the rank's manifest entry.
fn crash(how: &str) -> (Run, ttrace_format::store::RankInfo) {
    let run = traced(1, &["big", "crash", how], &[]);
    let m = Manifest::read(&run.store).expect("manifest");
    assert_eq!(m.ranks.len(), 1, "{:?}", m.ranks);
    let r = m.ranks[0].clone();
    // Six copies and a GEMM were taken, whatever happened next.
    assert_eq!(r.taken, 7, "{how}: taken ({r:?})");
    assert_eq!(
        run.records.len() as u64 + r.unpublished,
        r.taken,
        "{how}: stored + lost = taken ({r:?})"
    );
    assert_eq!(
        run.records.len() as u64,
        r.records,
        "{how}: the manifest counts what is stored"
    );
    // A signal is a crash; `_exit` an exit with the status the program chose.
    assert_eq!(r.clean_exit, how == "exit", "{how}: {r:?}");
    (run, r)
}

/// Every snapshot was flushed before the process died: the six copies with their bytes, and
/// the GEMM.
fn assert_all_flushed(how: &str, run: &Run, r: &ttrace_format::store::RankInfo) {
    assert_eq!(r.unpublished, 0, "{how}: nothing lost ({r:?})");
    assert_eq!(r.unpublished_after, None);
    for (i, rec) in run.records[..6].iter().enumerate() {
        assert!(
            rec.tensor(Role::Dst).1 == &pattern(i as u8 + 1, 4096)[..],
            "{how}: copy {i}"
        );
    }
    assert!(
        run.records[6].record.api.starts_with("cublasSgemm"),
        "{how}"
    );
    assert_checksums(run);
}

#[test]
fn abort_flushes_every_snapshot_and_still_dies_of_sigabrt() {
    let (run, r) = crash("abort");
    assert_eq!(run.out.status.signal(), Some(6), "{}", describe(&run.out));
    assert_all_flushed("abort", &run, &r);
}

#[test]
fn underscore_exit_flushes_every_snapshot_and_keeps_its_status() {
    let (run, r) = crash("exit");
    assert_eq!(run.out.status.code(), Some(3), "{}", describe(&run.out));
    assert_all_flushed("exit", &run, &r);
}

#[test]
fn a_segfault_flushes_every_snapshot_and_still_dies_of_sigsegv() {
    let (run, r) = crash("segv");
    assert_eq!(run.out.status.signal(), Some(11), "{}", describe(&run.out));
    assert_all_flushed("segv", &run, &r);
}

#[test]
fn sigkill_loses_what_was_not_published_and_says_so() {
    let (run, r) = crash("kill");
    assert_eq!(run.out.status.signal(), Some(9), "{}", describe(&run.out));
    // How many the tracer had published when the kill came depends on timing; whatever it
    // was, `crash` checked that they add up. `ttrace ls` names the lost ones.
    let out = std::process::Command::new(bin("ttrace"))
        .arg("ls")
        .arg(&run.store)
        .output()
        .expect("ttrace ls runs");
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    if r.unpublished > 0 {
        // A kill before the tracer published anything leaves no record to count from.
        let said = match r.unpublished_after {
            Some((step, seq)) => format!(
                "crashed, {} lost after step {step} seq {seq}",
                r.unpublished
            ),
            None => format!("crashed, {} lost before its first record", r.unpublished),
        };
        assert!(text.contains(&said), "{text}");
        assert!(text.contains("INCOMPLETE"), "{text}");
    } else {
        assert!(text.contains("crashed"), "{text}");
    }
}

/// The handlers that flush on a signal keep the program's own flags: a SIGINT handler
/// installed without SA_RESTART (Python's) still interrupts blocking calls once capture runs.
/// And the tracer thread blocks termination requests, so that their handler (which waits for
/// the tracer's drain) never runs on it.
#[test]
fn the_flush_handlers_keep_the_programs_signal_flags() {
    let run = traced(1, &["big", "sigflags"], &[]);
    assert!(run.out.status.success(), "{}", describe(&run.out));
    assert!(
        !run.records.is_empty(),
        "the copy was captured (handlers installed)"
    );
}
