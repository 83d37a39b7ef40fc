//! Deduplicated tensors (format 1.3): a blob that references an earlier blob of its segment
//! reads back as that blob's bytes, checked against the referencing record's CRC-32; a damaged
//! or missing referenced blob makes the referencing tensor bad, never wrong.

use std::path::Path;

use ttrace_format::dedup::BlobReference;
use ttrace_format::reader::Segment;
use ttrace_format::record::Record;
use ttrace_format::store::{segment_path, Blob, SegmentWriter, SEGMENT_HEADER_BYTES};

fn bytes(n: usize, salt: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13 ^ salt) as u8)
        .collect()
}

/// seq 0 stores `w`; seq 1 references it (same bytes); seq 2 references it although its own
/// bytes differ (a reference that lies); seq 3 references a seq that is not there.
fn write(run: &Path, w: &[u8], other: &[u8]) {
    let mut s = SegmentWriter::create(run, 0, 0).expect("create");
    let first = SEGMENT_HEADER_BYTES;
    let blob = Blob::encode(w, 1, 3, &mut Vec::new()).expect("encode");
    s.append(&Record::d2h_copy(0, 0, 0, w), &[blob])
        .expect("append");
    let to_first = BlobReference {
        seq: 0,
        offset: first,
        tensor: 0,
    };
    let refs = [
        (1, w, to_first),
        (2, other, to_first),
        (
            3,
            w,
            BlobReference {
                seq: 9,
                offset: 1 << 20,
                tensor: 0,
            },
        ),
    ];
    for (seq, data, r) in refs {
        let blob = r.to_blob(1, data.len() as u64);
        s.append(&Record::d2h_copy(0, 0, seq, data), &[blob])
            .expect("append");
    }
    s.finish().expect("finish");
}

#[test]
fn a_reference_reads_back_as_the_bytes_it_names() {
    let dir = tempdir("resolve");
    let (w, other) = (bytes(10_000, 1), bytes(10_000, 2));
    write(&dir, &w, &other);
    let seg = Segment::open(&segment_path(&dir, 0, 0)).expect("open");
    let read = |seq| {
        let i = seg.find_seq(seq).expect("seq present");
        seg.read(i).expect("intact record").tensor_bytes(0)
    };
    assert_eq!(read(0).expect("original"), w);
    let v = seg.read(seg.find_seq(1).expect("seq 1")).expect("intact");
    assert!(v.is_reference(0));
    assert_eq!(v.deduped_bytes(), w.len() as u64);
    assert_eq!(
        v.stored_bytes(),
        ttrace_format::dedup::REFERENCE_BYTES as u64
    );
    assert_eq!(read(1).expect("referenced bytes"), w);
    // The referenced bytes do not match the referencing record: bad, not wrong.
    let e = read(2).expect_err("bytes of another tensor are never returned");
    assert!(e.to_string().contains("CRC-32"), "{e}");
    let e = read(3).expect_err("a reference to nothing is an error");
    assert!(e.to_string().contains("not in the segment"), "{e}");
}

#[test]
fn owned_frames_resolve_references_too() {
    let dir = tempdir("frames");
    let (w, other) = (bytes(10_000, 1), bytes(10_000, 2));
    write(&dir, &w, &other);
    let seg = Segment::open(&segment_path(&dir, 0, 0)).expect("open");
    let mut read = Vec::new();
    for f in seg.into_frames() {
        let f = f.expect("intact frame");
        read.push((f.record.seq, f.tensor_bytes(0)));
    }
    assert_eq!(read.len(), 4);
    assert_eq!(read[0].1.as_ref().expect("seq 0"), &w);
    assert_eq!(read[1].1.as_ref().expect("seq 1"), &w);
    assert!(
        read[2].1.is_err(),
        "seq 2 references bytes that are not its own"
    );
    assert!(read[3].1.is_err(), "seq 3 references nothing");
}

#[test]
fn owned_frames_share_one_opened_segment_for_all_references() {
    let dir = tempdir("once");
    let (w, other) = (bytes(10_000, 1), bytes(10_000, 2));
    write(&dir, &w, &other);
    let path = segment_path(&dir, 0, 0);
    let frames: Vec<_> = Segment::open(&path)
        .expect("open")
        .into_frames()
        .map(|f| f.expect("intact frame"))
        .collect();
    assert_eq!(frames[1].tensor_bytes(0).expect("seq 1 resolves"), w);
    let shared = |a: usize, b: usize| {
        std::sync::Arc::ptr_eq(
            frames[a].segment.as_ref().expect("set by the reader"),
            frames[b].segment.as_ref().expect("set by the reader"),
        )
    };
    assert!(shared(0, 1) && shared(1, 3), "one segment for all frames");
    // The segment is not opened again per reference: gone from the directory, it still
    // resolves through the reader that already has it.
    std::fs::remove_file(&path).expect("remove");
    assert_eq!(frames[1].tensor_bytes(0).expect("still resolves"), w);
    assert!(frames[2].tensor_bytes(0).is_err(), "seq 2 is still bad");
}

#[test]
fn a_damaged_referenced_blob_makes_the_referencing_tensor_bad() {
    let dir = tempdir("damaged");
    let (w, other) = (bytes(10_000, 1), bytes(10_000, 2));
    write(&dir, &w, &other);
    let path = segment_path(&dir, 0, 0);
    let f0 = Segment::open(&path).expect("open").frames()[0];
    let mut data = std::fs::read(&path).expect("read");
    // A byte of seq 0's tensor (the end of its frame).
    data[(f0.offset + f0.frame_len) as usize - 10] ^= 0x40;
    std::fs::write(&path, &data).expect("write");
    let seg = Segment::open(&path).expect("open");
    let v = seg
        .read(seg.find_seq(1).expect("seq 1"))
        .expect("seq 1 itself is intact");
    let e = v
        .tensor_bytes(0)
        .expect_err("its bytes are lost with seq 0");
    assert!(e.to_string().contains("damaged"), "{e}");
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ttrace-dedup-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}
