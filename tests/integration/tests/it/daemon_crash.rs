//! A traced process killed with SIGKILL loses nothing it had published: the daemon holds its
//! own mapping of the ring and writes every published record, marking the exit unclean.

use crate::daemon_util;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use daemon_util::*;
use ttrace_format::store::Manifest;
use ttraced::test_client::bf16_pattern;

/// `target/<profile>/examples/loadgen` (built by `cargo test`, or `cargo build --examples -p
/// ttraced`).
fn loadgen() -> std::path::PathBuf {
    let p = integration_tests::profile_dir()
        .join("examples")
        .join("loadgen");
    assert!(
        p.exists(),
        "{} is missing: cargo build --release --examples -p ttraced",
        p.display()
    );
    p
}

/// Starts `loadgen publish ARGS` against the daemon and waits for its line `published N` with
/// N >= `at_least`; returns the child and N.
fn publisher(socket: &std::path::Path, args: &[&str], at_least: u64) -> (std::process::Child, u64) {
    let mut child = Command::new(loadgen())
        .arg("publish")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("loadgen starts");
    let out = child.stdout.take().expect("stdout");
    for line in BufReader::new(out).lines() {
        let line = line.expect("reads");
        if let Some(n) = line.strip_prefix("published ") {
            let n: u64 = n.parse().expect("a count");
            if n >= at_least {
                return (child, n);
            }
        }
    }
    panic!(
        "loadgen ended before publishing {at_least} records: {:?}",
        child.wait()
    );
}

/// The bytes loadgen publishes as tensor `t` of its `seq`-th record (see examples/loadgen.rs).
fn expected(rank: u32, seq: u64, t: u64, elems: usize) -> Vec<u8> {
    bf16_pattern(elems, (rank as u64) << 40 | seq << 2 | t)
}

fn check_rank(store: &std::path::Path, rank: u32, per_step: u64, elems: usize) -> u64 {
    let mut n = 0u64;
    let mut step = 0u64;
    loop {
        let seg = ttrace_format::store::segment_path(store, rank, step);
        if !seg.exists() {
            break;
        }
        for f in frames(store, rank, step) {
            let global = f.record.t_call_ns; // loadgen puts its running count here
            assert_eq!(global, n, "records are contiguous and in order");
            assert_eq!((f.record.step, f.record.seq), (n / per_step, n % per_step));
            for t in 0..2 {
                assert_eq!(
                    f.tensor_bytes(t as usize).expect("decodes"),
                    expected(rank, n, t, elems),
                    "record {n} tensor {t}"
                );
            }
            n += 1;
        }
        step += 1;
    }
    n
}

#[test]
fn a_process_killed_after_publishing_keeps_every_record() {
    let dir = TempDir::new("daemon-kill");
    let h = start(dir.path());
    let store = h.store().to_path_buf();
    let (mut child, n) = publisher(
        h.socket(),
        &[
            "--rank",
            "2",
            "--records",
            "37",
            "--per-step",
            "10",
            "--hang",
        ],
        37,
    );
    assert_eq!(n, 37);
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let s = h
        .finalize(Some(0), Duration::from_secs(5))
        .expect("finalize");
    assert_eq!(check_rank(&store, 2, 10, 4096), 37);
    let m = Manifest::read(&store).expect("manifest");
    assert!(m.finalized);
    assert_eq!(m.ranks.len(), 1);
    assert_eq!((m.ranks[0].rank, m.ranks[0].records), (2, 37));
    assert!(!m.ranks[0].clean_exit, "no goodbye: unclean exit");
    assert_eq!(
        s.processes[0].error, None,
        "a crash is not a protocol error"
    );
}

#[test]
fn a_process_killed_mid_stream_keeps_a_contiguous_prefix() {
    let dir = TempDir::new("daemon-kill-mid");
    let h = start(dir.path());
    let store = h.store().to_path_buf();
    // Publishes until killed; killed right after it said it had published 200.
    let (mut child, n) = publisher(
        h.socket(),
        &[
            "--rank",
            "1",
            "--records",
            "0",
            "--per-step",
            "64",
            "--elems",
            "2048",
        ],
        200,
    );
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let s = h
        .finalize(Some(0), Duration::from_secs(5))
        .expect("finalize");
    let kept = check_rank(&store, 1, 64, 2048);
    assert!(kept >= n, "kept {kept} of at least {n} published");
    assert_eq!(s.records, kept);
    assert!(!s.processes[0].clean_exit);
}
