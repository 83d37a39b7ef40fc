//! A misbehaving client is dropped alone: the daemon keeps serving the others, and what the
//! offender published before is in the store, intact.

use crate::daemon_util;

use std::time::Duration;

use daemon_util::*;
use ttrace_format::ring::Slot;
use ttrace_format::wire::{ClientMsg, MAX_FRAME, PROTOCOL_VERSION};
use ttraced::test_client::{hello, ClientError, TestClient};

#[test]
fn a_wrong_protocol_version_or_a_missing_ring_is_refused() {
    let dir = TempDir::new("daemon-refuse");
    let h = start(dir.path());
    let mut old = hello(0, 1, 1 << 16);
    old.protocol = PROTOCOL_VERSION + 1;
    match TestClient::connect(h.socket(), old) {
        Err(ClientError::Refused(why)) => assert!(why.contains("protocol"), "{why}"),
        other => panic!("expected a refusal, got {:?}", other.map(|c| c.run_id)),
    }
    match TestClient::connect_with(h.socket(), hello(0, 1, 1 << 16), false) {
        Err(ClientError::Refused(why)) => assert!(why.contains("fd"), "{why}"),
        other => panic!("expected a refusal, got {:?}", other.map(|c| c.run_id)),
    }
    // The daemon still serves.
    let mut c = TestClient::connect(h.socket(), hello(0, 1, 1 << 16)).expect("a good client");
    let d = bf16_bytes(100, 1);
    c.publish(gemm(0, 0, 0, &[&d]), &[&d]).expect("publish");
    c.bye(1, 0).expect("bye");
    let s = finalize(h);
    assert_eq!(s.records, 1);
    assert_eq!(s.dropped_clients, 2);
}

/// One way of breaking the protocol after two good records.
enum Violation {
    OversizedFrame,
    GarbageCbor,
    SlotOutsideRing,
    SlotReused,
    SlotTooSmall,
    SecondHello,
}

fn misbehave(v: Violation) {
    let dir = TempDir::new("daemon-bad");
    let h = start(dir.path());
    let store = h.store().to_path_buf();
    let mut good = TestClient::connect(h.socket(), hello(1, 2, 1 << 20)).expect("good");
    let mut bad = TestClient::connect(h.socket(), hello(0, 2, 1 << 20)).expect("bad");
    let datas: Vec<Vec<u8>> = (0..2).map(|i| bf16_bytes(3000, i)).collect();
    let mut first = None;
    for (seq, d) in datas.iter().enumerate() {
        let slot = bad
            .publish(gemm(0, 0, seq as u64, &[d]), &[d])
            .expect("publish");
        first.get_or_insert(slot.expect("a slot"));
    }
    let g = bf16_bytes(100, 7);
    good.publish(gemm(1, 0, 0, &[&g]), &[&g])
        .expect("good publishes");
    let d = bf16_bytes(64, 3);
    let rec = gemm(0, 0, 2, &[&d]);
    let sent = match v {
        Violation::OversizedFrame => {
            let mut f = ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec();
            f.extend([0u8; 64]);
            bad.send_raw(&f)
        }
        Violation::GarbageCbor => {
            let mut f = 5u32.to_le_bytes().to_vec();
            f.extend([0xff, 0xfe, 0x13, 0x00, 0x42]);
            bad.send_raw(&f)
        }
        Violation::SlotOutsideRing => bad.send(&ClientMsg::Publish {
            record: Box::new(rec),
            slot: Some(Slot {
                pos: 1 << 30,
                len: 128,
                end: (1 << 30) + 128,
            }),
        }),
        Violation::SlotReused => bad.send(&ClientMsg::Publish {
            record: Box::new(rec),
            slot: first,
        }),
        Violation::SlotTooSmall => {
            let slot = bad.reserve(&[64]).expect("reserve");
            let big = bf16_bytes(4096, 4);
            bad.send(&ClientMsg::Publish {
                record: Box::new(gemm(0, 0, 2, &[&big])),
                slot: Some(slot),
            })
        }
        Violation::SecondHello => bad.send(&ClientMsg::Hello(hello(0, 2, 1 << 20))),
    };
    sent.expect("the violation is sent");
    // The daemon drops the offender; the good client goes on after that.
    std::thread::sleep(Duration::from_millis(50));
    let g2 = bf16_bytes(100, 8);
    good.publish(gemm(1, 0, 1, &[&g2]), &[&g2])
        .expect("good publishes again");
    good.bye(2, 0).expect("bye");
    let s = finalize(h);

    let kept = frames(&store, 0, 0);
    assert_eq!(kept.len(), 2, "the offender's earlier records are kept");
    for (f, d) in kept.iter().zip(&datas) {
        assert_eq!(&f.tensor_bytes(0).expect("decodes"), d);
    }
    let other = frames(&store, 1, 0);
    assert_eq!(other.len(), 2, "the other client was served throughout");
    let bad_p = s
        .processes
        .iter()
        .find(|p| p.rank == 0)
        .expect("offender listed");
    assert!(bad_p.error.is_some() && !bad_p.clean_exit, "{bad_p:?}");
    let good_p = s
        .processes
        .iter()
        .find(|p| p.rank == 1)
        .expect("good listed");
    assert!(good_p.error.is_none() && good_p.clean_exit, "{good_p:?}");
    let m = ttrace_format::store::Manifest::read(&store).expect("manifest");
    assert!(m.finalized);
}

#[test]
fn an_oversized_frame_drops_only_that_client() {
    misbehave(Violation::OversizedFrame);
}

#[test]
fn garbage_cbor_drops_only_that_client() {
    misbehave(Violation::GarbageCbor);
}

#[test]
fn a_slot_outside_the_ring_drops_only_that_client() {
    misbehave(Violation::SlotOutsideRing);
}

#[test]
fn a_slot_published_twice_drops_only_that_client() {
    misbehave(Violation::SlotReused);
}

#[test]
fn a_slot_too_small_for_its_tensors_drops_only_that_client() {
    misbehave(Violation::SlotTooSmall);
}

#[test]
fn a_second_hello_drops_only_that_client() {
    misbehave(Violation::SecondHello);
}

#[test]
fn a_silent_connection_does_not_hold_up_finalize() {
    let dir = TempDir::new("daemon-silent");
    let h = start(dir.path());
    // Connects and never says anything.
    let _idle = std::os::unix::net::UnixStream::connect(h.socket()).expect("connects");
    let mut c = TestClient::connect(h.socket(), hello(0, 1, 1 << 16)).expect("connects");
    let d = bf16_bytes(10, 1);
    c.publish(gemm(0, 0, 0, &[&d]), &[&d]).expect("publish");
    // This client never says goodbye and stays connected: finalize disconnects it.
    let t = std::time::Instant::now();
    let s = h
        .finalize(Some(0), Duration::from_millis(300))
        .expect("finalize");
    assert!(t.elapsed() < Duration::from_secs(5), "bounded wait");
    assert_eq!(s.records, 1);
    assert!(!s.processes[0].clean_exit);
    drop(c);
}
