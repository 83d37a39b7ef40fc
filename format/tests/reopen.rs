//! Opening a segment again through its store (`Store::open_segment`, as compare does when it
//! closed the segment to stay within its memory budget): what the first opening found (frames,
//! issues, index state) is taken again without locating the frames again, as long as the file
//! and its index are the files it was found in; a segment whose files changed is located afresh.

mod common;

use std::io::Write;

use common::{write_store, Scratch};
use ttrace_format::reader::{IssueKind, Segment, Store};
use ttrace_format::store::{index_path, segment_path};

/// Every record's seq and first tensor's bytes, read through `seg`.
fn contents(seg: &Segment) -> Vec<(u64, Option<Vec<u8>>)> {
    (0..seg.len())
        .map(|i| {
            let v = seg.read(i).expect("an intact frame");
            let first = (0..v.record.tensors.len())
                .find(|&t| v.record.tensors[t].captured)
                .map(|t| v.tensor_bytes(t).expect("decodes"));
            (v.record.seq, first)
        })
        .collect()
}

#[test]
fn a_segment_opened_again_by_its_store_is_not_located_again_until_its_files_change() {
    let dir = Scratch::new("reopen");
    let run = dir.path();
    write_store(run, 1, 1, 12);
    let seg_path = segment_path(run, 0, 0);
    let idx_path = index_path(&seg_path);
    let store = Store::open(run).expect("store");
    let first = store.open_segment(0, 0).expect("first opening");
    assert!(first.issues().is_empty(), "{:?}", first.issues());
    let read_first = contents(&first);
    drop(first);

    // The index's bytes replaced behind the reader's back, its length and modification time
    // kept: a fresh opening finds it damaged (and scans the segment) ...
    let idx = std::fs::read(&idx_path).expect("index bytes");
    let when = std::fs::metadata(&idx_path)
        .and_then(|m| m.modified())
        .expect("index mtime");
    let f = std::fs::File::create(&idx_path).expect("rewrite the index");
    (&f).write_all(&vec![0xA5; idx.len()]).expect("garbage");
    f.set_modified(when).expect("keep its mtime");
    drop(f);
    let fresh = Segment::open(&seg_path).expect("a segment with a damaged index opens");
    let damaged = |s: &Segment| s.issues().iter().any(|i| i.kind == IssueKind::DamagedIndex);
    assert!(damaged(&fresh), "{:?}", fresh.issues());
    // ... but the store, opening the same files again, takes what it found before: the same
    // records, and no new issue (it did not read the index again).
    let again = store.open_segment(0, 0).expect("opened again");
    assert!(again.issues().is_empty(), "{:?}", again.issues());
    assert_eq!(contents(&again), read_first);
    drop(again);

    // Once the index file changes (its mtime), it is read again.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&idx_path)
        .expect("open the index");
    f.set_modified(when + std::time::Duration::from_secs(1))
        .expect("touch the index");
    drop(f);
    let touched = store
        .open_segment(0, 0)
        .expect("opened after the index changed");
    assert!(damaged(&touched), "{:?}", touched.issues());
    assert_eq!(contents(&touched), read_first, "found by scanning");
    drop(touched);

    // The index restored: used again; then the segment itself grows (a torn frame
    // appended): located afresh.
    std::fs::write(&idx_path, &idx).expect("restore the index");
    let restored = store.open_segment(0, 0).expect("opened with its index");
    assert!(restored.issues().is_empty(), "{:?}", restored.issues());
    drop(restored);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&seg_path)
        .expect("open for append");
    f.write_all(b"TTRF half a frame").expect("append");
    drop(f);
    let changed = store.open_segment(0, 0).expect("opened after the change");
    let kinds: Vec<IssueKind> = changed.issues().iter().map(|i| i.kind).collect();
    assert!(kinds.contains(&IssueKind::TornTail), "{kinds:?}");
    assert_eq!(
        contents(&changed),
        read_first,
        "the intact records are still read"
    );
}

#[test]
fn a_damaged_record_is_still_refused_when_its_segment_is_opened_again() {
    let dir = Scratch::new("reopen-damaged");
    let run = dir.path();
    write_store(run, 1, 1, 6);
    let seg_path = segment_path(run, 0, 0);
    let store = Store::open(run).expect("store");
    // Located, nothing read yet: no body has been checked.
    let seg = store.open_segment(0, 0).expect("first opening");
    let (offset, len) = (0..seg.len())
        .map(|i| seg.read_meta(i).expect("metadata"))
        .find(|v| v.record.tensors.iter().any(|t| t.captured))
        .map(|v| (v.offset, v.frame_len))
        .expect("a record with data");
    drop(seg);
    // The last byte of its stored data flipped in place: same length.
    let mut bytes = std::fs::read(&seg_path).expect("segment bytes");
    bytes[(offset + len - 1) as usize] ^= 0x40;
    std::fs::write(&seg_path, &bytes).expect("damage");
    let again = store.open_segment(0, 0).expect("opened again");
    let i = (0..again.len())
        .find(|&i| again.read_meta(i).is_ok_and(|v| v.offset == offset))
        .expect("the frame");
    match again.read(i) {
        Ok(_) => panic!("a frame whose CRC no longer holds was read"),
        Err(issue) => assert_eq!(issue.kind, IssueKind::CorruptRecord, "{issue}"),
    }
}

/// `n` bytes that zstd cannot shrink (xorshift).
fn incompressible(n: usize, mut x: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes segment (0, 0) of `run`: four copies of 1.5 MiB that do not compress (frames over
/// the sparse and release thresholds).
fn write_large_frames(run: &std::path::Path) -> Vec<common::Made> {
    let mut made = common::records(0, 0, 5, 1);
    made.retain(|m| matches!(m.record.op, ttrace_format::record::Op::Memcpy(_)));
    let template = made.pop().expect("a copy record");
    let big: Vec<common::Made> = (0..4u64)
        .map(|i| {
            let bytes = incompressible(3 << 19, 0x9E37_79B9_7F4A_7C15 ^ i);
            let mut record = template.record.clone();
            record.seq = i;
            record.tensors[0].nbytes = bytes.len() as u64;
            record.tensors[0].shape = vec![bytes.len() as u64];
            record.tensors[0].crc32 = crc32fast::hash(&bytes);
            common::Made {
                record,
                data: vec![bytes],
            }
        })
        .collect();
    common::write_segment(run, &big, 0, 0, true);
    big
}

#[test]
fn a_segment_of_large_frames_reads_the_same_records_for_its_metadata_as_for_its_data() {
    let dir = Scratch::new("sparse");
    let run = dir.path();
    let big = write_large_frames(run);
    let seg = Segment::open(&segment_path(run, 0, 0)).expect("segment");
    assert!(seg.sparse(), "frames of 1.5 MiB make a sparse segment");
    assert_eq!(seg.len(), big.len());
    // Metadata and data reads in turn (each switches the kernel's readahead): the same records.
    for (i, m) in big.iter().enumerate() {
        let meta = seg.read_meta(i).expect("metadata");
        assert_eq!(meta.record, m.record, "frame {i}");
        let full = seg.read(i).expect("an intact frame");
        assert_eq!(full.record, m.record, "frame {i}");
        assert_eq!(
            full.tensor_bytes(0).expect("decodes"),
            m.data[0],
            "frame {i}"
        );
        let again = seg.read_meta(i).expect("metadata again");
        assert_eq!(again.record, m.record, "frame {i}");
    }

    // Small frames (the common records): read ahead whatever is read.
    let small = Scratch::new("not-sparse");
    write_store(small.path(), 1, 1, 12);
    let seg = Segment::open(&segment_path(small.path(), 0, 0)).expect("segment");
    assert!(!seg.sparse(), "frames of a few KiB");
}

/// KiB of `path`'s mappings resident in this process (`/proc/self/smaps`).
#[cfg(target_os = "linux")]
fn mapped_kib(path: &std::path::Path) -> u64 {
    let path = path.canonicalize().expect("canonical path");
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
    let mut inside = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header line: `start-end perms offset dev inode [path]`.
            inside = line.ends_with(path.to_str().expect("utf-8 path"));
        } else if inside && first == "Rss:" {
            kib += line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    kib
}

#[cfg(target_os = "linux")]
#[test]
fn a_releasing_segment_drops_its_large_frames_pages_once_read_and_a_default_one_keeps_them() {
    let dir = Scratch::new("release");
    let run = dir.path();
    let big = write_large_frames(run);
    let path = segment_path(run, 0, 0);
    for releasing in [false, true] {
        let mut seg = Segment::open(&path).expect("segment");
        seg.set_releasing(releasing);
        for (i, m) in big.iter().enumerate() {
            let v = seg.read(i).expect("an intact frame");
            assert_eq!(v.tensor_bytes(0).expect("decodes"), m.data[0], "frame {i}");
            v.release();
        }
        // 6 MiB were read through the mapping.
        let kib = mapped_kib(&path);
        if releasing {
            // What is left: each frame's first and last partial 64 KiB, the headers.
            assert!(kib < 1024, "{kib} KiB still mapped after release");
            // Read again, the same bytes (from the page cache).
            for (i, m) in big.iter().enumerate() {
                let v = seg.read(i).expect("an intact frame");
                assert_eq!(v.tensor_bytes(0).expect("decodes"), m.data[0], "frame {i}");
            }
        } else {
            assert!(kib >= 5 * 1024, "only {kib} KiB mapped after reading 6 MiB");
        }
    }
}

#[test]
fn what_openings_found_is_kept_within_its_budget_the_least_recently_opened_dropped() {
    let dir = Scratch::new("reopen-budget");
    let run = dir.path();
    write_store(run, 1, 3, 12);
    let store = Store::open(run).expect("store");
    for step in 0..3 {
        drop(store.open_segment(0, step).expect("opens"));
    }
    let all = store.located_bytes();
    assert!(all > 0, "kept by default");
    // Room for about one segment's: the two opened before the last are dropped.
    store.set_located_budget(all / 3 + 1);
    assert!(
        store.located_bytes() <= all / 3 + 1,
        "{}",
        store.located_bytes()
    );
    // Which ones: the index of every segment replaced by garbage of the same length and
    // modification time. A segment whose opening is still kept is opened as found before
    // (no issue); one whose was dropped is located again and finds its index damaged. The
    // records read the same either way.
    for step in 0..3 {
        let idx_path = index_path(&segment_path(run, 0, step));
        let len = std::fs::metadata(&idx_path).expect("index").len();
        let when = std::fs::metadata(&idx_path)
            .and_then(|m| m.modified())
            .expect("mtime");
        let f = std::fs::File::create(&idx_path).expect("rewrite the index");
        (&f).write_all(&vec![0xA5; len as usize]).expect("garbage");
        f.set_modified(when).expect("keep its mtime");
    }
    let damaged = |step: u64| {
        let seg = store.open_segment(0, step).expect("opens");
        assert_eq!(seg.len(), 12);
        seg.issues()
            .iter()
            .any(|i| i.kind == IssueKind::DamagedIndex)
    };
    assert!(!damaged(2), "the last opened is kept");
    assert!(damaged(0) && damaged(1), "the others were located again");
}
