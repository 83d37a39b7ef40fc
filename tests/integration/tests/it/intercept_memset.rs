//! Memsets under libttrace.so: every `cudaMemset*` spelling is a `memset` record (pointer,
//! byte value, extent, stream, order) with no tensor, so that the last writer of a buffer a
//! GEMM reads is seen; a memset of nothing or one the runtime refuses is not recorded, and the
//! program gets the runtime's status unchanged. `ttrace show` and `ttrace ls` list them.

use crate::intercept_util;

use std::process::Command;

use integration_tests::{bin, describe};
use intercept_util::*;
use ttrace_format::record::{MemsetOp, Op, Role};

/// `(api, value, [width, height, depth], pitch, slice pitch, stream)` of a memset record.
type Shape = (String, u8, [u64; 3], u64, u64, u64);

fn memsets(run: &Run) -> Vec<(&Rec, &MemsetOp)> {
    run.records
        .iter()
        .filter_map(|r| match &r.record.op {
            Op::Memset(m) => Some((r, m)),
            _ => None,
        })
        .collect()
}

#[test]
fn every_memset_spelling_is_recorded_with_its_value_extent_and_stream() {
    let run = traced(1, &["traced", "memset"], &[]);
    assert_ok(&run);
    assert_checksums(&run);
    let sets = memsets(&run);
    let s = sets[0].0.record.stream;
    assert_ne!(s, 0, "the probe's own stream");
    let shapes: Vec<Shape> = sets
        .iter()
        .map(|(r, m)| {
            (
                r.record.api.clone(),
                m.value,
                [m.width, m.height, m.depth],
                m.pitch,
                m.slice_pitch,
                r.record.stream,
            )
        })
        .collect();
    assert_eq!(
        shapes,
        vec![
            ("cudaMemsetAsync".into(), 0, [4096, 1, 1], 4096, 4096, s),
            ("cudaMemset2D".into(), 0xab, [40, 10, 1], 64, 640, 0),
            ("cudaMemset".into(), 0, [1536, 1, 1], 1536, 1536, 0),
            // 0x1234 sets the byte 0x34; slices are pitch x ysize (12 rows) apart; stream 0
            // of a _ptsz call is the per-thread default stream.
            (
                "cudaMemset3DAsync_ptsz".into(),
                0x34,
                [40, 10, 2],
                64,
                768,
                2
            ),
        ],
        "a memset of 0 bytes and one the runtime refused are not recorded"
    );
    for (r, _) in &sets {
        assert!(
            r.record.tensors.is_empty(),
            "{}: metadata only",
            r.record.api
        );
    }
    // Everything in step 0, seq in call order; nothing lost.
    for (i, r) in run.records.iter().enumerate() {
        assert_eq!((r.record.step, r.record.seq), (0, i as u64));
    }
    assert_eq!(run.summary.gaps, 0);
    assert_eq!(run.summary.records, run.records.len() as u64);
    // The program saw the runtime's own status for the refused memset.
    let plain = untraced(1, &["traced", "memset"]);
    assert!(plain.status.success(), "{}", describe(&plain));
    assert_eq!(
        String::from_utf8_lossy(&run.out.stdout),
        String::from_utf8_lossy(&plain.stdout)
    );
}

#[test]
fn a_gemm_reading_a_zeroed_buffer_has_the_memset_as_its_last_writer() {
    let run = traced(1, &["traced", "memset"], &[]);
    assert_ok(&run);
    let gemm = run
        .records
        .iter()
        .find(|r| matches!(r.record.op, Op::Gemm(_)))
        .expect("the GEMM is captured");
    let (a, bytes) = gemm.tensor(Role::A);
    assert!(bytes.iter().all(|&b| b == 0), "A was zeroed");
    // The last record before the GEMM that wrote A's first byte: the memset, not the upload
    // it overwrote.
    let writes = |r: &Rec| match &r.record.op {
        Op::Memset(m) => {
            let (lo, hi) = m.span();
            (lo..hi).contains(&a.ptr)
        }
        _ => r
            .record
            .tensors
            .iter()
            .any(|t| t.role == Role::Dst && (t.ptr..t.ptr + t.nbytes).contains(&a.ptr)),
    };
    let writer = run
        .records
        .iter()
        .filter(|r| r.record.seq < gemm.record.seq)
        .rfind(|r| writes(r))
        .expect("some record wrote A");
    assert_eq!(writer.record.api, "cudaMemsetAsync");
    assert_eq!(
        writer.record.stream, gemm.record.stream,
        "ordered on the GEMM's stream"
    );
}

#[test]
fn show_and_ls_list_the_memsets() {
    let run = traced(1, &["traced", "memset"], &[]);
    assert_ok(&run);
    let cli = |args: &[&str]| {
        let out = Command::new(bin("ttrace"))
            .args(args)
            .arg(&run.store)
            .output()
            .expect("ttrace runs");
        assert!(out.status.success(), "{}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let show = cli(&["show", "--rank", "0", "--step", "0", "--no-stats"]);
    let rows: Vec<&str> = show.lines().filter(|l| l.contains("memset to")).collect();
    assert_eq!(rows.len(), 4, "{show}");
    assert!(
        rows[1].contains("cudaMemset2D") && rows[1].contains("0xab"),
        "{show}"
    );
    assert!(rows[3].contains("[2, 10, 40]"), "{show}");
    let only = cli(&[
        "show",
        "--rank",
        "0",
        "--step",
        "0",
        "--no-stats",
        "--apis",
        "memset",
    ]);
    assert_eq!(
        only.lines().filter(|l| l.contains("cuda")).count(),
        4,
        "{only}"
    );
    let ls = cli(&["ls"]);
    let total = run.records.len().to_string();
    assert!(
        ls.lines().any(|l| l.split_whitespace().any(|w| w == total)),
        "ls counts every record, memsets included ({total}):\n{ls}"
    );
}

#[test]
fn a_memset_captured_into_a_graph_is_recorded_at_every_launch() {
    let run = traced(1, &["traced", "memset-graph"], &[]);
    assert_ok(&run);
    let sets = memsets(&run);
    assert_eq!(sets.len(), 2, "one record per launch: {:?}", run.records);
    for (r, m) in &sets {
        assert_eq!(r.record.api, "cudaMemsetAsync");
        assert_eq!((m.value, m.width, m.height, m.depth), (0x5a, 256, 1, 1));
    }
    // Each launch's memset comes before the download that reads it.
    let apis: Vec<&str> = run.records.iter().map(|r| r.record.api.as_str()).collect();
    assert_eq!(
        apis,
        [
            "cudaMemcpyAsync",
            "cudaMemsetAsync",
            "cudaMemcpyAsync",
            "cudaMemsetAsync",
            "cudaMemcpyAsync"
        ]
    );
    assert_eq!(run.summary.gaps, 0);
}
