//! ttraced files what a producer publishes: byte-exact tensors, one segment per (rank, step)
//! closed with an index, the comm map joined across processes, a finalised manifest.

use crate::daemon_util;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use daemon_util::*;
use ttrace_format::store::{index_path, read_index, segment_path, Manifest};
use ttrace_format::wire::CommInfo;
use ttraced::test_client::{hello, TestClient};

fn comm(key: u64, rank: u32, global_rank: u32) -> CommInfo {
    CommInfo {
        key,
        size: 2,
        rank,
        global_rank,
        parent: None,
        color: None,
        api: "ncclCommInitRank".into(),
    }
}

#[test]
fn published_records_read_back_byte_exact_split_by_step() {
    let dir = TempDir::new("daemon-store");
    let h = start(dir.path());
    let store = h.store().to_path_buf();
    let socket = h.socket().to_path_buf();

    // Rank 3: steps 0, 0, 1, 1 (+ a gap), 2; rank 1 registers the same communicator.
    let mut c3 = TestClient::connect(&socket, hello(3, 4, 1 << 20)).expect("rank 3 connects");
    let mut c1 = TestClient::connect(&socket, hello(1, 4, 1 << 20)).expect("rank 1 connects");
    c3.comm(comm(77, 1, 3)).expect("comm");
    c1.comm(comm(77, 0, 1)).expect("comm");
    let mut expected = Vec::new();
    let plan: [(u64, u64); 5] = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)];
    for (i, &(step, seq)) in plan.iter().enumerate() {
        let a = bf16_bytes(1000 + i * 37, i as u32);
        let b = bf16_bytes(333, 100 + i as u32);
        let d = bf16_bytes(4096, 200 + i as u32);
        let rec = gemm(3, step, seq, &[&a, &b, &d]);
        c3.publish(rec.clone(), &[&a, &b, &d]).expect("publish");
        expected.push((rec, vec![a, b, d]));
    }
    let gap = gap(3, 1, 2);
    c3.publish(gap.clone(), &[]).expect("publish gap");
    let input: Vec<u8> = (0..4096u32)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    let output: Vec<u8> = (0..4096u32)
        .flat_map(|i| (2.0 * i as f32).to_le_bytes())
        .collect();
    let ar = allreduce(1, 0, 0, 77, &input, &output);
    c1.publish(ar.clone(), &[&input, &output]).expect("publish");
    // A tensor over the size cap: metadata only.
    let mut capped = gemm(1, 0, 1, &[&input[..64], &input[..64], &input[..64]]);
    capped.tensors[2].captured = false;
    capped.tensors[2].crc32 = 0;
    c1.publish(capped.clone(), &[&input[..64], &input[..64]])
        .expect("publish");
    c3.bye(6, 1).expect("bye");
    c1.bye(2, 0).expect("bye");
    let s = finalize(h);

    // Segments per step, each with an index listing its seqs.
    for (step, seqs) in [(0u64, vec![0u64, 1]), (1, vec![0, 1, 2]), (2, vec![0])] {
        let seg = segment_path(&store, 3, step);
        let idx = read_index(&index_path(&seg)).expect("each finished segment has an index");
        assert_eq!(
            idx.iter().map(|e| e.seq).collect::<Vec<_>>(),
            seqs,
            "step {step}"
        );
    }
    let mut got = frames(&store, 3, 0);
    got.extend(frames(&store, 3, 1));
    got.extend(frames(&store, 3, 2));
    let gemms: Vec<_> = got
        .iter()
        .filter(|f| f.record.api == "cublasGemmEx" && !f.record.tensors.is_empty())
        .collect();
    assert_eq!(gemms.len(), expected.len());
    for (f, (rec, datas)) in gemms.iter().zip(&expected) {
        assert_eq!(&f.record, rec, "metadata round-trips");
        for (i, d) in datas.iter().enumerate() {
            assert_eq!(
                &f.tensor_bytes(i).expect("decodes"),
                d,
                "tensor {i} byte-exact"
            );
        }
    }
    assert!(
        got.iter().any(|f| f.record == gap),
        "the gap record is kept"
    );
    let r1 = frames(&store, 1, 0);
    assert_eq!(r1.len(), 2);
    assert_eq!(r1[0].record, ar);
    assert_eq!(r1[0].tensor_bytes(0).expect("decodes"), input);
    assert_eq!(r1[0].tensor_bytes(1).expect("decodes"), output);
    assert_eq!(r1[1].record, capped);
    assert_eq!(r1[1].blobs.len(), 2, "no blob for the uncaptured tensor");

    // The manifest: finalised, both processes clean, the communicator joined.
    let m = Manifest::read(&store).expect("manifest");
    assert!(m.finalized);
    assert_eq!(m.exit_code, Some(0));
    assert_eq!(
        m.ranks
            .iter()
            .map(|r| (r.rank, r.records, r.gaps, r.clean_exit))
            .collect::<Vec<_>>(),
        vec![(1, 2, 0, true), (3, 6, 1, true)]
    );
    assert_eq!(m.comms.len(), 1);
    assert_eq!(m.comms[0].members, vec![Some(1), Some(3)]);
    let raw: u64 = expected
        .iter()
        .flat_map(|(_, d)| d)
        .map(|d| d.len() as u64)
        .sum::<u64>()
        + (input.len() + output.len() + 128) as u64;
    assert_eq!(s.bytes_raw, raw);
    assert!(s.bytes_stored < s.bytes_raw, "compressed: {s:?}");
    assert_eq!(
        (s.records, s.gaps, s.ranks, s.steps, s.segments),
        (8, 1, 2, 3, 4)
    );
    assert_eq!(s.crc_mismatches, 0);

    // Private: store and rank directories 0700, socket gone.
    for d in [store.clone(), store.join("rank00003")] {
        let mode = std::fs::metadata(&d).expect("exists").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", d.display());
    }
    assert!(!socket.exists(), "the socket is removed at the end");
}

/// A tensor over 4 MiB is compressed in pieces by several threads (format codec 6) and
/// reads back byte-exact through the store reader, as does a small one next to it; a
/// deduplicated repeat of it resolves to the same bytes.
#[test]
fn large_tensors_compressed_in_pieces_read_back_byte_exact() {
    let dir = TempDir::new("daemon-pieces");
    let h = start(dir.path());
    let store = h.store().to_path_buf();
    let mut c = TestClient::connect(h.socket(), hello(0, 1, 64 << 20)).expect("connects");
    c.wait = Duration::from_secs(30);
    let big = bf16_bytes((9 << 20) / 2 + 3, 7); // 9 MiB + 6 bytes: 3 pieces, a short last one
    let small = bf16_bytes(1000, 8);
    let other = bf16_bytes((5 << 20) / 2, 9);
    let first = gemm(0, 0, 0, &[&big, &small, &other]);
    c.publish(first.clone(), &[&big, &small, &other])
        .expect("publish");
    let again = gemm(0, 0, 1, &[&big, &small, &other]);
    c.publish(again.clone(), &[&big, &small, &other])
        .expect("publish");
    c.bye(2, 0).expect("bye");
    let s = finalize(h);
    assert_eq!(s.crc_mismatches, 0);

    let st = ttrace_format::reader::Store::open(&store).expect("store opens");
    let seg = st.open_segment(0, 0).expect("segment");
    let views: Vec<_> = seg.records().map(|v| v.expect("record reads")).collect();
    assert_eq!(views.len(), 2);
    let (codec, _) = views[0].stored(0).expect("stored");
    assert_eq!(
        codec,
        ttrace_format::codec::Codec::Pieces,
        "the large tensor"
    );
    for v in &views {
        for (i, want) in [&big, &small, &other].into_iter().enumerate() {
            assert_eq!(
                &v.tensor_bytes(i).expect("decodes"),
                want,
                "seq {} tensor {i}",
                v.record.seq
            );
        }
    }
    let m = Manifest::read(&store).expect("manifest");
    assert_eq!(
        m.ranks[0].bytes_deduped,
        (big.len() + small.len() + other.len()) as u64,
        "the repeat is stored as references"
    );
}

#[test]
fn the_socket_is_private_while_the_daemon_runs() {
    let dir = TempDir::new("daemon-perm");
    let h = start(dir.path());
    let sock_mode = std::fs::metadata(h.socket())
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    let dir_mode = std::fs::metadata(h.socket().parent().expect("dir"))
        .expect("dir")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!((sock_mode, dir_mode), (0o600, 0o700));
    // A second daemon on the same socket is refused; a second run in the same store too.
    let again = ttraced::Daemon::start(ttraced::Config::new(h.socket(), dir.path().join("s2")));
    assert!(
        matches!(again, Err(ttraced::Error::InUse(_))),
        "{:?}",
        again.err()
    );
    let m = Manifest::read(h.store()).expect("initial manifest is written at start");
    assert!(!m.finalized);
    finalize(h);
    let reuse = ttraced::Daemon::start(ttraced::Config::new(
        dir.path().join("sock2/s"),
        dir.path().join("store"),
    ));
    assert!(
        matches!(
            reuse,
            Err(ttraced::Error::StoreDir(
                ttraced::store_dir::StoreDirError::NotEmpty(..)
            ))
        ),
        "{:?}",
        reuse.err()
    );
}

#[test]
fn a_small_ring_wraps_and_the_daemon_releases_in_order() {
    let dir = TempDir::new("daemon-wrap");
    let h = start(dir.path());
    let store = h.store().to_path_buf();
    // 64 KiB ring, 300 records of ~20 KiB: the producer must wait for releases many times.
    let mut c = TestClient::connect(h.socket(), hello(0, 1, 64 << 10)).expect("connects");
    c.wait = Duration::from_secs(20);
    let mut datas = Vec::new();
    for seq in 0..300u64 {
        let d = bf16_bytes(5000 + (seq as usize % 7) * 300, seq as u32);
        c.publish(gemm(0, 0, seq, &[&d]), &[&d]).expect("publish");
        datas.push(d);
    }
    assert!(
        c.wait_drained(Duration::from_secs(20)),
        "daemon released every slot"
    );
    c.bye(300, 0).expect("bye");
    finalize(h);
    let got = frames(&store, 0, 0);
    assert_eq!(got.len(), 300);
    for (f, d) in got.iter().zip(&datas) {
        assert_eq!(
            &f.tensor_bytes(0).expect("decodes"),
            d,
            "seq {}",
            f.record.seq
        );
    }
}

#[test]
fn a_checksum_mismatch_is_kept_counted_and_visible() {
    let dir = TempDir::new("daemon-crc");
    let h = start(dir.path());
    let store = h.store().to_path_buf();
    let mut c = TestClient::connect(h.socket(), hello(0, 1, 1 << 20)).expect("connects");
    let d = bf16_bytes(512, 9);
    let mut rec = gemm(0, 0, 0, &[&d]);
    rec.tensors[0].crc32 ^= 1;
    c.publish(rec.clone(), &[&d]).expect("publish");
    c.bye(1, 0).expect("bye");
    let s = finalize(h);
    assert_eq!(s.crc_mismatches, 1);
    assert_eq!(s.processes[0].crc_mismatches, 1);
    let f = &frames(&store, 0, 0)[0];
    assert_eq!(f.record, rec, "written as published");
    let bytes = f.tensor_bytes(0).expect("decodes");
    assert_eq!(bytes, d, "the blob holds the ring's bytes");
    assert_ne!(
        crc32fast::hash(&bytes),
        f.record.tensors[0].crc32,
        "a reader sees the mismatch"
    );
}

#[test]
fn two_processes_with_the_same_rank_share_its_segments() {
    let dir = TempDir::new("daemon-samerank");
    let h = start(dir.path());
    let store = h.store().to_path_buf();
    let mut a = TestClient::connect(h.socket(), hello(0, 1, 1 << 20)).expect("a");
    let mut b = TestClient::connect(h.socket(), hello(0, 1, 1 << 20)).expect("b");
    let d = bf16_bytes(256, 1);
    a.publish(gemm(0, 0, 0, &[&d]), &[&d]).expect("a step 0");
    a.publish(gemm(0, 1, 0, &[&d]), &[&d]).expect("a step 1");
    assert!(a.wait_drained(Duration::from_secs(5)));
    // The daemon finishes step 0 (a moved on, b never held it); then b writes step 0 late.
    let idx0 = index_path(&segment_path(&store, 0, 0));
    let t = std::time::Instant::now();
    while !idx0.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "step 0 is finished once its only holder moved on"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    b.publish(gemm(0, 0, 1, &[&d]), &[&d])
        .expect("b step 0, late");
    b.publish(gemm(0, 1, 1, &[&d]), &[&d]).expect("b step 1");
    a.bye(2, 0).expect("bye");
    b.bye(2, 0).expect("bye");
    let s = finalize(h);
    assert_eq!(s.records, 4);
    for step in [0, 1] {
        let mut seqs: Vec<u64> = frames(&store, 0, step)
            .iter()
            .map(|f| f.record.seq)
            .collect();
        seqs.sort();
        assert_eq!(seqs, vec![0, 1], "step {step} has both processes' records");
        let idx = read_index(&index_path(&segment_path(&store, 0, step))).expect("index");
        assert_eq!(idx.len(), 2);
    }
    assert!(
        !store.join(".reopen").join("0").exists(),
        "staging cleaned up"
    );
}
