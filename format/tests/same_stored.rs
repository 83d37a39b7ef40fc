//! `RecordView::same_stored`: two tensors are known to decode to the same checked bytes,
//! without decoding either, only when everything decoding and its check read is equal (codec,
//! element size, length, stored bytes, the records' CRC-32 and type). `ttrace compare` then
//! decodes such a tensor once (data-parallel replicas of a weight).

use ttrace_format::dedup::BlobReference;
use ttrace_format::reader::Segment;
use ttrace_format::record::Record;
use ttrace_format::store::{segment_path, Blob, SegmentWriter, SEGMENT_HEADER_BYTES};

fn bytes(n: usize, salt: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13 ^ salt) as u8)
        .collect()
}

#[test]
fn tensors_are_the_same_stored_only_when_everything_decoding_reads_is_equal() {
    let dir = std::env::temp_dir().join(format!("ttrace-same-stored-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let (w, other) = (bytes(10_000, 1), bytes(10_000, 2));
    let blob = |data: &[u8], elem: usize, level: i32| {
        Blob::encode(data, elem, level, &mut Vec::new()).expect("encode")
    };
    let mut s = SegmentWriter::create(&dir, 0, 0).expect("create");
    let rec = |seq: u64, data: &[u8]| Record::d2h_copy(0, 0, seq, data);
    // seq 0 and 1: the same bytes stored alike.
    s.append(&rec(0, &w), &[blob(&w, 1, 3)]).expect("append");
    s.append(&rec(1, &w), &[blob(&w, 1, 3)]).expect("append");
    // seq 2: the same bytes stored raw (another codec); seq 3: other bytes.
    s.append(&rec(2, &w), &[blob(&w, 1, 0)]).expect("append");
    s.append(&rec(3, &other), &[blob(&other, 1, 3)])
        .expect("append");
    // seq 4: seq 0's stored bytes under a record whose CRC-32 is another's (a bad tensor).
    s.append(&rec(4, &other), &[blob(&w, 1, 3)])
        .expect("append");
    // seq 5: a reference to seq 0 (resolved by the reader, never taken as stored bytes).
    let r = BlobReference {
        seq: 0,
        offset: SEGMENT_HEADER_BYTES,
        tensor: 0,
    };
    s.append(&rec(5, &w), &[r.to_blob(1, w.len() as u64)])
        .expect("append");
    s.finish().expect("finish");

    let seg = Segment::open(&segment_path(&dir, 0, 0)).expect("open");
    let view = |seq| {
        seg.read(seg.find_seq(seq).expect("seq present"))
            .expect("intact")
    };
    let first = view(0);
    assert!(first.same_stored(0, &view(1), 0), "identical blobs");
    assert!(view(1).same_stored(0, &first, 0), "either way round");
    for (seq, why) in [
        (2, "another codec"),
        (3, "other bytes"),
        (4, "the record's CRC-32 differs"),
        (5, "a reference"),
    ] {
        assert!(!first.same_stored(0, &view(seq), 0), "seq {seq}: {why}");
        assert!(!view(seq).same_stored(0, &first, 0), "seq {seq}: {why}");
    }
    // What same_stored says without decoding, decoding says too.
    assert_eq!(
        first.tensor_bytes(0).expect("decodes"),
        view(1).tensor_bytes(0).expect("decodes")
    );
    assert!(view(4).tensor_bytes(0).is_err(), "its CRC-32 is checked");
    let _ = std::fs::remove_dir_all(&dir);
}
