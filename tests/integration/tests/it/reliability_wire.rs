//! Reliability of the wire, what a same-uid client can make the collector do: every size and
//! count from the wire is bounded before anything is allocated (a ring of capacity 0 is tested
//! where the ring is opened: proto/src/ring.rs).

use crate::daemon_util;

use std::time::Duration;

use daemon_util::{start, TempDir};
use ttrace_format::record::Record;
use ttrace_format::store::Manifest;
use ttrace_format::wire::{ClientMsg, CommInfo};
use ttraced::test_client::{hello, TestClient};

/// A good client's records, to show the daemon still serves everyone.
fn good_client(socket: &std::path::Path, rank: u32, n: u64) -> TestClient {
    let mut c = TestClient::connect(socket, hello(rank, 2, 1 << 20)).expect("good client");
    for seq in 0..n {
        let bytes = vec![seq as u8; 4096];
        c.publish(Record::d2h_copy(rank, 0, seq, &bytes), &[&bytes])
            .expect("publishes");
    }
    c
}

/// One test, so that no other test of this binary opens descriptors while
/// [`decreasing_steps_do_not_exhaust_descriptors`] counts them.
#[test]
fn hostile_sizes_and_counts_are_bounded() {
    a_huge_communicator_size_drops_the_client_only();
    decreasing_steps_do_not_exhaust_descriptors();
    oversized_metadata_drops_the_client_only();
}

/// A `Comm` of size 0xFFFFFFFF (or 10 M) drops that client only; the daemon does not
/// allocate for it and the manifest stays small.
fn a_huge_communicator_size_drops_the_client_only() {
    let dir = TempDir::new("rel-comm");
    let h = start(dir.path());
    let good = good_client(h.socket(), 1, 10);
    for size in [u32::MAX, 10_000_000] {
        let mut bad = TestClient::connect(h.socket(), hello(0, 2, 1 << 16)).expect("connects");
        let _ = bad.send(&ClientMsg::Comm(CommInfo {
            key: 7,
            size,
            rank: 0,
            global_rank: 0,
            parent: None,
            color: None,
            api: "ncclCommInitRank".into(),
        }));
        assert!(good.wait_drained(Duration::from_secs(20)));
    }
    good.bye(10, 0).expect("bye");
    let s = h
        .finalize(Some(0), Duration::from_secs(5))
        .expect("finalizes");
    assert_eq!(s.records, 10);
    assert_eq!(s.dropped_clients, 2, "{:?}", s.processes);
    assert_eq!(s.comms, 0, "the hostile registrations are not kept");
    let store = dir.path().join("store");
    let m = Manifest::read(&store).expect("manifest");
    assert!(m.finalized);
    let size = std::fs::metadata(store.join("manifest.json"))
        .expect("stat")
        .len();
    assert!(size < 64 << 10, "manifest of {size} bytes");
}

/// Descriptors this process has open (the in-process daemon's included).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Step numbers that go down open segments, but a client holds a bounded number of
/// them open (at most 16 held and 32 waiting to be finished, two descriptors each; it was
/// one pair per step, without bound); every record is still stored.
fn decreasing_steps_do_not_exhaust_descriptors() {
    let dir = TempDir::new("rel-steps");
    let h = start(dir.path());
    let before = open_fds();
    let mut c = TestClient::connect(h.socket(), hello(0, 1, 1 << 20)).expect("connects");
    let n = 400u64;
    for i in 0..n {
        let bytes = vec![i as u8; 512];
        c.publish(Record::d2h_copy(0, n - i, 0, &bytes), &[&bytes])
            .expect("publishes");
    }
    assert!(c.wait_drained(Duration::from_secs(60)));
    let during = open_fds();
    assert!(
        during < before + 128,
        "{} descriptors opened for one client",
        during - before
    );
    c.bye(n, 0).expect("bye");
    let s = h
        .finalize(Some(0), Duration::from_secs(5))
        .expect("finalizes");
    assert_eq!(s.records, n);
    assert!(s.lost.is_empty(), "{:?}", s.lost);
}

/// A `Publish` whose metadata would cost far more memory than its bytes on the wire
/// (a flood of empty NVTX strings), or a frame beyond the message limit, drops that client
/// only.
fn oversized_metadata_drops_the_client_only() {
    let dir = TempDir::new("rel-meta");
    let h = start(dir.path());
    let good = good_client(h.socket(), 1, 5);
    let mut bad = TestClient::connect(h.socket(), hello(0, 2, 1 << 16)).expect("connects");
    let mut rec = Record::d2h_copy(0, 0, 0, &[]);
    rec.tensors.clear();
    rec.nvtx = vec![String::new(); 200_000];
    let _ = bad.send(&ClientMsg::Publish {
        record: Box::new(rec),
        slot: None,
    });
    let mut bad2 = TestClient::connect(h.socket(), hello(2, 3, 1 << 16)).expect("connects");
    let mut frame = (8u32 << 20).to_le_bytes().to_vec();
    frame.extend(std::iter::repeat_n(0x60u8, 1 << 16)); // CBOR empty strings, no end
    let _ = bad2.send_raw(&frame);
    drop(bad2);
    assert!(good.wait_drained(Duration::from_secs(20)));
    good.bye(5, 0).expect("bye");
    let s = h
        .finalize(Some(0), Duration::from_secs(5))
        .expect("finalizes");
    let errors: Vec<String> = s.processes.iter().filter_map(|p| p.error.clone()).collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors.iter().any(|e| e.contains("NVTX")), "{errors:?}");
    assert!(errors.iter().any(|e| e.contains("exceeds")), "{errors:?}");
    assert_eq!(s.records, 5);
}
