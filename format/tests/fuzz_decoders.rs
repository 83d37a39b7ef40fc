//! Fuzzing the decoders of untrusted bytes with proptest: the record decoder (`Frame::parse`,
//! the reader's `Segment` with every tensor decoded, also as owned frames, `read_index`) and the
//! wire protocol (`wire::read_msg`). Inputs are arbitrary bytes and valid encodings with random
//! edits; the property is that nothing panics (and whatever reads back intact is checked).
//!
//! Bounded: `PROPTEST_CASES` sets the cases per property (default below), so CI runs it in
//! seconds.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use ttrace_format::frame::FrameHeader;
use ttrace_format::reader::Segment;
use ttrace_format::store::{index_path, read_index, Frame, SEGMENT_MAGIC};
use ttrace_format::wire::{self, ClientMsg, CommInfo, DaemonMsg, Hello};

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

/// A valid segment (with a bit of everything) and its index, built once.
fn valid() -> &'static (Vec<u8>, Vec<u8>) {
    static SEG: std::sync::OnceLock<(Vec<u8>, Vec<u8>)> = std::sync::OnceLock::new();
    SEG.get_or_init(|| {
        let dir = common::Scratch::new("fuzz-seed");
        let made = common::records(0, 0, 7, 2);
        common::write_segment(dir.path(), &made, 0, 0, true);
        let seg = ttrace_format::store::segment_path(dir.path(), 0, 0);
        (
            std::fs::read(&seg).expect("seed"),
            std::fs::read(index_path(&seg)).expect("seed index"),
        )
    })
}

fn valid_segment() -> &'static Vec<u8> {
    &valid().0
}

fn scratch_file(bytes: &[u8]) -> std::path::PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!("ttrace-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let p = dir.join(format!("s{}.seg", N.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&p, bytes).expect("write");
    p
}

/// Opens `bytes` as a segment (with `index` next to it, if any) and reads everything it
/// offers, as views and as owned frames.
fn read_all(bytes: &[u8], index: Option<&[u8]>) {
    let path = scratch_file(bytes);
    if let Some(i) = index {
        std::fs::write(index_path(&path), i).expect("index");
    }
    if let Ok(seg) = Segment::open(&path) {
        for f in seg.into_frames().flatten() {
            for i in 0..f.blobs.len() {
                let _ = f.tensor_bytes(i);
            }
        }
    }
    if let Ok(seg) = Segment::open(&path) {
        for i in 0..seg.len() {
            if let Ok(v) = seg.read(i) {
                for t in 0..v.record.tensors.len() {
                    if let Ok(bytes) = v.tensor_bytes(t) {
                        // What decodes is what the record's CRC says.
                        assert_eq!(crc32fast::hash(&bytes), v.record.tensors[t].crc32);
                        let _ = v.tensor(t);
                    }
                }
            }
            let _ = seg.read_meta(i);
        }
        for i in seg.issues() {
            let _ = i.to_string();
        }
    }
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(index_path(&path));
}

/// Random edits: (position fraction, new byte) pairs and an optional cut.
fn mutate(base: &[u8], edits: &[(u32, u8)], cut: Option<u32>) -> Vec<u8> {
    let mut b = base.to_vec();
    for &(at, v) in edits {
        let i = at as usize % b.len();
        b[i] = v;
    }
    if let Some(c) = cut {
        b.truncate(c as usize % (b.len() + 1));
    }
    b
}

fn client_msgs() -> Vec<ClientMsg> {
    let rec = common::records(1, 2, 2, 2).remove(1).record;
    vec![
        ClientMsg::Hello(Hello {
            protocol: wire::PROTOCOL_VERSION,
            pid: 7,
            rank: 1,
            world_size: 2,
            local_rank: 1,
            hostname: "n".into(),
            exe: "python".into(),
            argv: vec!["python".into(), "t.py".into()],
            ring_capacity: 1 << 20,
            ..Hello::default()
        }),
        ClientMsg::Comm(CommInfo {
            key: 5,
            size: 2,
            rank: 1,
            global_rank: 1,
            parent: None,
            color: Some(0),
            api: "ncclCommInitRank".into(),
        }),
        ClientMsg::Publish {
            record: Box::new(rec),
            slot: None,
        },
        ClientMsg::Bye {
            records: 3,
            gaps: 0,
            warnings: vec!["the whole run is step 0".into()],
        },
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn frame_parse_never_panics(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Frame::parse(0, body);
    }

    #[test]
    fn frame_parse_of_edited_bodies_never_panics(
        edits in proptest::collection::vec((any::<u32>(), any::<u8>()), 1..6),
        which in 0usize..7,
    ) {
        let seg = valid_segment();
        let path = scratch_file(seg);
        let body = Segment::open(&path)
            .expect("valid")
            .into_frames()
            .map_while(Result::ok)
            .nth(which)
            .map(|f| f.body);
        let _ = std::fs::remove_file(&path);
        if let Some(b) = body {
            let _ = Frame::parse(0, mutate(&b, &edits, None));
        }
    }

    #[test]
    fn edited_bodies_under_a_valid_crc_never_panic(
        edits in proptest::collection::vec((any::<u32>(), any::<u8>()), 1..6),
        cut in proptest::option::of(any::<u32>()),
        which in 0usize..7,
    ) {
        // Past the checksum: the record metadata, blob headers and compressed bytes are what
        // a buggy writer (not a bad disk) could produce.
        let seg = valid_segment();
        let path = scratch_file(seg);
        let bodies: Vec<Vec<u8>> = Segment::open(&path)
            .expect("valid")
            .into_frames()
            .map_while(Result::ok)
            .map(|f| f.body)
            .collect();
        let _ = std::fs::remove_file(&path);
        let mut bytes = seg[..64].to_vec();
        for (i, b) in bodies.iter().enumerate() {
            let body = if i == which { mutate(b, &edits, cut) } else { b.clone() };
            let h = FrameHeader { body_len: body.len() as u64, crc32: crc32fast::hash(&body) };
            bytes.extend(h.encode());
            bytes.extend(body);
        }
        read_all(&bytes, None);
    }

    #[test]
    fn segments_of_arbitrary_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let mut bytes = vec![0u8; 64];
        bytes[..8].copy_from_slice(&SEGMENT_MAGIC);
        bytes[8] = 1;
        bytes.extend(tail);
        read_all(&bytes, None);
    }

    #[test]
    fn edited_segments_never_panic(
        edits in proptest::collection::vec((any::<u32>(), any::<u8>()), 0..8),
        cut in proptest::option::of(any::<u32>()),
        index_edits in proptest::collection::vec((any::<u32>(), any::<u8>()), 0..3),
        with_index in any::<bool>(),
    ) {
        let index = mutate(&valid().1, &index_edits, None);
        read_all(&mutate(valid_segment(), &edits, cut), with_index.then_some(&index[..]));
    }

    #[test]
    fn indexes_of_arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let p = scratch_file(&bytes);
        let _ = read_index(&p);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn wire_read_msg_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let mut r = &bytes[..];
        while let Ok(Some(_)) = wire::read_msg::<ClientMsg>(&mut r) {}
        let mut r = &bytes[..];
        while let Ok(Some(_)) = wire::read_msg::<DaemonMsg>(&mut r) {}
    }

    #[test]
    fn edited_wire_messages_never_panic(
        which in 0usize..4,
        edits in proptest::collection::vec((any::<u32>(), any::<u8>()), 1..6),
        cut in proptest::option::of(any::<u32>()),
    ) {
        let frame = wire::encode(&client_msgs()[which]).expect("encode");
        let bytes = mutate(&frame, &edits, cut);
        let mut r = &bytes[..];
        while let Ok(Some(_)) = wire::read_msg::<ClientMsg>(&mut r) {}
    }
}

#[test]
fn the_seeds_are_valid() {
    // The edited inputs start from valid encodings: check they are.
    let path = scratch_file(valid_segment());
    std::fs::write(index_path(&path), &valid().1).expect("index");
    let seg = Segment::open(&path).expect("valid segment");
    assert_eq!(seg.len(), 7);
    assert!(seg.issues().is_empty(), "{:?}", seg.issues());
    assert!(seg.records().all(|r| r.is_ok()));
    for m in client_msgs() {
        let f = wire::encode(&m).expect("encode");
        assert_eq!(
            wire::read_msg::<ClientMsg>(&mut &f[..]).expect("decodes"),
            Some(m)
        );
    }
}
