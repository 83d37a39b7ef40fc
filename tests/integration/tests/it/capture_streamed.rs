//! Tensors of any size: a snapshot larger than the ring streams through it
//! in chunks and is stored byte-exact, read back transparently by every reader; nothing is
//! gapped. The ring here is 256 KiB and the tensors 16-32 times larger, so the tests are fast.

use crate::intercept_util;

use integration_tests::{bin, describe};
use intercept_util::*;
use ttrace_format::reader::{IssueKind, Store};
use ttrace_format::record::{Op, Role};

const RING: &str = "262144";

/// `sim-probe big`'s all-reduce input (tests/sim/probe/src/big.rs).
fn allreduce_input(rank: usize, i: usize) -> f32 {
    (i % 1021) as f32 + rank as f32 * 0.5
}

fn f32_bytes(v: impl Iterator<Item = f32>) -> Vec<u8> {
    v.flat_map(f32::to_le_bytes).collect()
}

#[test]
fn a_copy_many_times_larger_than_the_ring_is_captured_byte_exact() {
    let len = 4 << 20;
    let run = traced(
        1,
        &["big", "copy", &len.to_string()],
        &[("TTRACE_RING_BYTES", RING)],
    );
    assert_ok(&run);
    assert_checksums(&run);
    assert_eq!(run.summary.gaps, 0, "nothing gapped");
    let copies: Vec<&Rec> = run.records.iter().collect();
    assert_eq!(
        copies.len(),
        2,
        "{:?}",
        copies.iter().map(|r| &r.record.api).collect::<Vec<_>>()
    );
    let want = pattern(11, len);
    assert!(
        copies[0].tensor(Role::Dst).1 == &want[..],
        "the H2D copy's bytes"
    );
    assert!(
        copies[1].tensor(Role::Src).1 == &want[..],
        "the D2H copy's bytes"
    );

    // The store reader resolves the streamed tensors the same way, and finds nothing wrong.
    let store = Store::open(&run.store).expect("store opens");
    assert!(store.issues().is_empty(), "{:?}", store.issues());
    let seg = store.open_segment(0, 0).expect("segment");
    let v = seg.read(0).expect("record");
    let i = v
        .record
        .tensors
        .iter()
        .position(|t| t.role == Role::Dst)
        .expect("dst");
    assert!(v.tensor_bytes(i).expect("reads") == want);
    assert!(
        v.stored_len(i).expect("captured") > len as u64 / 2,
        "the stored size counts the stream file"
    );

    // `ttrace export` (safetensors) reads it too.
    let out_dir = run.store.with_extension("export");
    let out = std::process::Command::new(bin("ttrace"))
        .arg("export")
        .arg(&run.store)
        .args(["--format", "safetensors", "--out"])
        .arg(&out_dir)
        .output()
        .expect("ttrace export runs");
    assert!(out.status.success(), "{}", describe(&out));
    let exported: Vec<u8> = std::fs::read_dir(&out_dir)
        .expect("export written")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .flat_map(|e| std::fs::read(e.path()).expect("read"))
        .collect();
    assert!(
        exported.windows(want.len()).any(|w| w == &want[..]),
        "the exported file holds the tensor's bytes"
    );
}

#[test]
fn an_in_place_all_reduce_larger_than_the_ring_is_captured_before_and_after() {
    let (n, len) = (2usize, 8usize << 20);
    let count = len / 4;
    let run = traced(
        n,
        &["big", "allreduce", &len.to_string()],
        &[("TTRACE_RING_BYTES", RING)],
    );
    assert_ok(&run);
    assert_checksums(&run);
    assert_eq!(run.summary.gaps, 0, "nothing gapped");
    let sum = f32_bytes((0..count).map(|i| (0..n).map(|r| allreduce_input(r, i)).sum()));
    for rank in 0..n as u32 {
        let recs = run.of_rank(rank);
        let ar = recs
            .iter()
            .find(|r| matches!(r.record.op, Op::Collective(_)))
            .unwrap_or_else(|| panic!("rank {rank}: no all-reduce"));
        let input = f32_bytes((0..count).map(|i| allreduce_input(rank as usize, i)));
        assert!(
            ar.tensor(Role::Input).1 == &input[..],
            "rank {rank}: input before the op"
        );
        assert!(
            ar.tensor(Role::Output).1 == &sum[..],
            "rank {rank}: output after it"
        );
    }
}

/// A stream file that was never completed (its process died mid-stream) is reported as lost
/// data by the reader and `ttrace fsck`, and never read as a tensor.
#[test]
fn a_partial_stream_is_counted_as_lost_never_read() {
    let run = traced(
        1,
        &["big", "copy", &(1 << 20).to_string()],
        &[("TTRACE_RING_BYTES", RING)],
    );
    assert_ok(&run);
    let streams = run.store.join("streams");
    let name = std::fs::read_dir(&streams)
        .expect("streams dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "tts"))
        .expect("a stream file");
    // As a crash leaves it: a `.part` file, cut short.
    let bytes = std::fs::read(&name).expect("read");
    std::fs::write(name.with_extension("tts.part"), &bytes[..bytes.len() / 2]).expect("write");
    std::fs::remove_file(&name).expect("remove");
    let store = Store::open(&run.store).expect("store opens");
    assert!(
        store
            .issues()
            .iter()
            .any(|i| i.kind == IssueKind::PartialStream && i.kind.loses_data()),
        "{:?}",
        store.issues()
    );
    let seg = store.open_segment(0, 0).expect("segment");
    let mut bad = 0;
    for v in seg.records() {
        let v = v.expect("record");
        for (i, t) in v.record.tensors.iter().enumerate() {
            if t.captured && v.tensor_bytes(i).is_err() {
                bad += 1;
            }
        }
    }
    assert_eq!(
        bad, 1,
        "the tensor whose stream is gone is an error, not bytes"
    );
    let out = std::process::Command::new(bin("ttrace"))
        .arg("fsck")
        .arg(&run.store)
        .output()
        .expect("fsck runs");
    assert!(
        !out.status.success(),
        "fsck reports the loss: {}",
        describe(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("partial streamed tensor")
            || String::from_utf8_lossy(&out.stderr).contains("partial streamed tensor"),
        "{}",
        describe(&out)
    );
}
