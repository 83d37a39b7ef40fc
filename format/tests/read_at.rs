//! Reading a record's data with its metadata already decoded (`Segment::read_at`, as compare
//! does after reading every record's metadata when it opens a store): the same record and
//! bytes as a full read, the frame still checked against its CRC, and a known record that does
//! not fit the frame read again in full.

mod common;

use common::{write_segment, Scratch};
use ttrace_format::reader::{IssueKind, Segment};
use ttrace_format::store::segment_path;

/// Every tensor's bytes of a view, in order.
fn all_bytes(v: &ttrace_format::reader::RecordView<'_>) -> Vec<Vec<u8>> {
    (0..v.record.tensors.len())
        .filter(|&t| v.record.tensors[t].captured)
        .map(|t| v.tensor_bytes(t).expect("an intact tensor decodes"))
        .collect()
}

#[test]
fn a_record_read_at_its_frame_with_known_metadata_is_the_full_read() {
    let dir = Scratch::new("read-at");
    let run = dir.path();
    let made = common::records(0, 2, 12, 2);
    write_segment(run, &made, 0, 2, true);
    let seg = Segment::open(&segment_path(run, 0, 2)).expect("segment");
    assert_eq!(seg.len(), made.len());
    for (i, m) in made.iter().enumerate() {
        let meta = seg.read_meta(i).expect("metadata");
        let known = meta.record.clone();
        let at = seg
            .read_at(meta.offset, &known)
            .expect("a frame starts there")
            .expect("an intact frame");
        let full = seg.read(i).expect("an intact frame");
        assert_eq!(at.record, full.record, "frame {i}");
        assert_eq!(at.offset, full.offset, "frame {i}");
        assert_eq!(all_bytes(&at), all_bytes(&full), "frame {i}");
        assert_eq!(all_bytes(&at), m.data, "frame {i}: the bytes written");
    }
    // No frame starts inside another.
    let first = seg.read_meta(0).expect("metadata");
    assert!(seg.read_at(first.offset + 1, &first.record).is_none());
}

#[test]
fn a_damaged_frame_is_refused_although_its_metadata_was_known() {
    let dir = Scratch::new("read-at-damaged");
    let run = dir.path();
    let made = common::records(0, 2, 6, 2);
    write_segment(run, &made, 0, 2, true);
    let path = segment_path(run, 0, 2);
    let seg = Segment::open(&path).expect("segment");
    let known: Vec<_> = (0..seg.len())
        .map(|i| {
            let v = seg.read_meta(i).expect("metadata");
            (v.offset, v.frame_len, v.record)
        })
        .collect();
    drop(seg);
    // The last byte of a frame with a tensor: stored data, after the metadata.
    let (offset, len, _) = known
        .iter()
        .find(|(_, _, r)| r.tensors.iter().any(|t| t.captured))
        .expect("a record with data")
        .clone();
    let mut bytes = std::fs::read(&path).expect("segment bytes");
    bytes[(offset + len - 1) as usize] ^= 0x40;
    std::fs::write(&path, &bytes).expect("damage");
    let seg = Segment::open(&path).expect("a damaged segment still opens");
    let (_, _, record) = known.iter().find(|(o, _, _)| *o == offset).expect("it");
    match seg.read_at(offset, record).expect("the frame is there") {
        Ok(_) => panic!("a frame whose CRC no longer holds was read"),
        Err(issue) => assert_eq!(issue.kind, IssueKind::CorruptRecord, "{issue}"),
    }
}

#[test]
fn a_known_record_that_does_not_fit_the_frame_is_read_again_in_full() {
    let dir = Scratch::new("read-at-mismatch");
    let run = dir.path();
    let made = common::records(0, 2, 12, 2);
    write_segment(run, &made, 0, 2, true);
    let seg = Segment::open(&segment_path(run, 0, 2)).expect("segment");
    let views: Vec<_> = (0..seg.len())
        .map(|i| seg.read_meta(i).expect("metadata"))
        .collect();
    let sizes = |r: &ttrace_format::record::Record| -> Vec<u64> {
        r.tensors
            .iter()
            .filter(|t| t.captured)
            .map(|t| t.nbytes)
            .collect()
    };
    let pairs = || (0..views.len()).flat_map(|a| (0..views.len()).map(move |b| (a, b)));
    // Two frames with as many captured tensors, of other sizes; and two with other numbers.
    let same_count = pairs()
        .find(|&(a, b)| {
            let (x, y) = (sizes(&views[a].record), sizes(&views[b].record));
            x.len() == y.len() && x != y
        })
        .expect("records with as many tensors of other sizes");
    let other_count = pairs()
        .find(|&(a, b)| sizes(&views[a].record).len() != sizes(&views[b].record).len())
        .expect("records with other numbers of tensors");
    for (a, b) in [same_count, other_count] {
        let v = seg
            .read_at(views[a].offset, &views[b].record)
            .expect("a frame starts there")
            .expect("an intact frame");
        assert_eq!(
            v.record, views[a].record,
            "frame {a} read with frame {b}'s record: its own record, not the wrong one"
        );
        assert_eq!(all_bytes(&v), made[a].data);
    }
}
