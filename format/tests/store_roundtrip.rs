//! A segment written by `SegmentWriter` reads back record for record and byte for byte, and a
//! torn or corrupted frame is reported without hiding the intact ones.

use ttrace_format::dtype::DType;
use ttrace_format::reader::{IssueKind, Segment};
use ttrace_format::record::{
    packed_strides, CollectiveKind, CollectiveOp, Op, Record, Role, Tensor,
};
use ttrace_format::store::{index_path, read_index, segment_path, Blob, SegmentWriter};

fn record(seq: u64, data: &[u8]) -> Record {
    let shape = vec![(data.len() / 2) as u64];
    Record {
        rank: 3,
        step: 2,
        seq,
        api: "ncclAllReduce".into(),
        op: Op::Collective(CollectiveOp {
            kind: CollectiveKind::AllReduce,
            count: shape[0],
            nccl_type: 9,
            redop: Some(0),
            root_or_peer: None,
            comm: 42,
            comm_rank: 1,
            comm_size: 2,
            sendbuff: 0x1000,
            recvbuff: 0x1000,
            group: 0,
            premul: None,
        }),
        stream: 7,
        device: 1,
        thread: 99,
        nvtx: vec!["backward.mb0".into(), "layers.1.mlp.fc2".into()],
        kernels_before: vec![],
        tensors: vec![Tensor {
            role: Role::Output,
            dtype: DType::BF16,
            strides: packed_strides(&shape),
            shape,
            ptr: 0x1000,
            nbytes: data.len() as u64,
            captured: true,
            crc32: crc32fast::hash(data),
        }],
        t_call_ns: 1,
        t_done_ns: 2,
    }
}

fn write(dir: &std::path::Path, n: u64) -> Vec<Vec<u8>> {
    let mut w = SegmentWriter::create(dir, 3, 2).expect("create");
    let mut scratch = Vec::new();
    let mut datas = Vec::new();
    for seq in 0..n {
        let data: Vec<u8> = (0..1000u32)
            .flat_map(|i| ((i * (seq as u32 + 1)) as u16).to_le_bytes())
            .collect();
        let blob = Blob::encode(&data, 2, 3, &mut scratch).expect("encode");
        w.append(&record(seq, &data), &[blob]).expect("append");
        datas.push(data);
    }
    w.finish().expect("finish");
    datas
}

#[test]
fn records_and_bytes_round_trip() {
    let dir = tempdir();
    let datas = write(&dir, 5);
    let seg = segment_path(&dir, 3, 2);
    let r = Segment::open(&seg).expect("open");
    assert_eq!((r.rank, r.step), (3, 2));
    assert!(r.issues().is_empty(), "{:?}", r.issues());
    let mut n = 0;
    for f in r.into_frames() {
        let f = f.expect("intact frame");
        assert_eq!(f.record, record(n, &datas[n as usize]));
        assert_eq!(f.tensor_bytes(0).expect("decodes"), datas[n as usize]);
        n += 1;
    }
    assert_eq!(n, 5);
    let idx = read_index(&index_path(&seg)).expect("index");
    assert_eq!(
        idx.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
}

#[test]
fn a_torn_tail_and_a_corrupt_middle_frame_are_reported_and_the_rest_reads() {
    let dir = tempdir();
    write(&dir, 4);
    let seg = segment_path(&dir, 3, 2);
    let idx = read_index(&index_path(&seg)).expect("index");
    let mut bytes = std::fs::read(&seg).expect("read");
    // Flip a byte inside frame 1's body, and cut frame 3 in half.
    let mid = (idx[1].offset + idx[1].frame_len / 2) as usize;
    bytes[mid] ^= 0x55;
    bytes.truncate((idx[3].offset + idx[3].frame_len / 2) as usize);
    std::fs::write(&seg, &bytes).expect("write");
    let r = Segment::open(&seg).expect("open");
    let found: Vec<_> = r.issues().iter().map(|i| (i.kind, i.offset)).collect();
    assert_eq!(found, vec![(IssueKind::TornTail, Some(idx[3].offset))]);
    let mut good = Vec::new();
    let mut issues = Vec::new();
    for f in r.into_frames() {
        match f {
            Ok(f) => good.push(f.record.seq),
            Err(i) => issues.push((i.kind, i.offset)),
        }
    }
    assert_eq!(good, vec![0, 2]);
    assert_eq!(
        issues,
        vec![(IssueKind::CorruptRecord, Some(idx[1].offset))]
    );
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "ttrace-format-test-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&d).expect("tempdir");
    d
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed) * 1000
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as u64)
}
