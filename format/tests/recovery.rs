//! A store read back after what crashes and bad disks do: the last record cut at every byte
//! offset, random bit flips, a removed or garbled manifest, a corrupted index, a damaged
//! segment header. Each case gives a clear message, every intact record stays readable, and
//! the repairs of `ttrace fsck --repair` restore a clean store without losing an intact record.

mod common;

use std::path::Path;

use common::{covers, write_segment, write_store, Made, Rng, Scratch};
use ttrace_format::reader::{IndexState, Issue, IssueKind, Segment, SeqHint, Store};
use ttrace_format::recover::{
    check_counts, check_segment, rebuild_index, rebuild_manifest, repair_frame_headers,
    repair_header, truncate_tail, write_rebuilt_manifest,
};
use ttrace_format::store::{index_path, manifest_path, read_index, segment_path, Manifest};
use ttrace_format::FormatError;

/// Asserts every record of `seg` whose seq is not in `lost` reads back equal to `made`
/// (metadata and every tensor's bytes), and returns the seqs that read.
fn assert_intact(seg: &Segment, made: &[Made], lost: &[u64]) -> Vec<u64> {
    let mut read = Vec::new();
    for m in made {
        let seq = m.record.seq;
        match seg.read_seq(seq) {
            Some(Ok(v)) => {
                assert_eq!(v.record, m.record, "seq {seq}: metadata differs");
                let mut blob = 0;
                for (t, tensor) in v.record.tensors.iter().enumerate() {
                    if !tensor.captured {
                        continue;
                    }
                    let bytes = v
                        .tensor_bytes(t)
                        .expect("an intact record's tensor decodes");
                    assert_eq!(bytes, m.data[blob], "seq {seq} tensor {t}: bytes differ");
                    blob += 1;
                }
                read.push(seq);
            }
            Some(Err(issue)) => {
                assert!(
                    lost.contains(&seq),
                    "seq {seq} unreadable but not damaged: {issue}"
                );
                assert!(
                    covers(issue.seq, seq),
                    "the error names another seq: {issue}"
                );
            }
            None => assert!(lost.contains(&seq), "seq {seq} missing but not damaged"),
        }
    }
    read
}

/// Every issue must be a sentence naming its file.
fn assert_clear(issues: &[Issue]) {
    for i in issues {
        let s = i.to_string();
        let names_file = s.contains(".seg") || s.contains(".json") || s.contains(".idx");
        assert!(s.len() > 20 && names_file, "unclear: {s}");
    }
}

/// Frame offsets of a segment written by `write_segment` (from its index).
fn offsets(seg: &Path) -> Vec<(u64, u64)> {
    read_index(&index_path(seg))
        .expect("index")
        .iter()
        .map(|e| (e.offset, e.frame_len))
        .collect()
}

#[test]
fn the_last_record_cut_at_every_byte_offset() {
    let dir = Scratch::new("torn");
    let run = dir.path();
    let made = common::records(1, 0, 5, 2);
    write_segment(run, &made, 1, 0, true);
    let seg_path = segment_path(run, 1, 0);
    let orig = std::fs::read(&seg_path).expect("segment");
    let orig_idx = std::fs::read(index_path(&seg_path)).expect("index");
    let frames = offsets(&seg_path);
    let (last_off, last_len) = frames[frames.len() - 1];
    assert_eq!(last_off + last_len, orig.len() as u64);
    let last_seq = made.len() as u64 - 1;
    for with_index in [true, false] {
        for cut in last_off..orig.len() as u64 {
            std::fs::write(&seg_path, &orig[..cut as usize]).expect("cut");
            if with_index {
                std::fs::write(index_path(&seg_path), &orig_idx).expect("index");
            } else {
                let _ = std::fs::remove_file(index_path(&seg_path));
            }
            let seg = Segment::open(&seg_path).expect("a cut segment still opens");
            let read = assert_intact(&seg, &made, &[last_seq]);
            assert_eq!(
                read.len() as u64,
                last_seq,
                "cut at {cut}: every earlier record reads"
            );
            let torn: Vec<&Issue> = seg
                .issues()
                .iter()
                .filter(|i| i.kind == IssueKind::TornTail)
                .collect();
            if with_index || cut > last_off {
                assert_eq!(
                    torn.len(),
                    1,
                    "cut at {cut}, index {with_index}: {:?}",
                    seg.issues()
                );
                assert!(covers(torn[0].seq, last_seq), "{}", torn[0]);
                assert!(torn[0].to_string().contains("torn tail"), "{}", torn[0]);
                if with_index {
                    assert_eq!(torn[0].seq, Some(SeqHint::Exact(last_seq)), "{}", torn[0]);
                }
            } else {
                assert!(
                    torn.is_empty(),
                    "a clean cut between records is a shorter segment"
                );
            }
            assert!(
                !seg.issues()
                    .iter()
                    .any(|i| i.kind == IssueKind::CorruptRecord),
                "a cut is not corruption: {:?}",
                seg.issues()
            );
            assert_clear(seg.issues());
            // fsck --repair: cut the partial record (saved aside), rewrite the index.
            let check = check_segment(&seg, true, &mut |_| {});
            assert_eq!(check.records, last_seq);
            drop(seg);
            if let Some(at) = check.torn_at {
                assert_eq!(at, last_off);
                assert_eq!(
                    truncate_tail(run, &seg_path, at).expect("truncate"),
                    cut - at
                );
            }
            rebuild_index(&check).expect("index");
            let seg = Segment::open(&seg_path).expect("repaired");
            assert!(seg.issues().is_empty(), "after repair: {:?}", seg.issues());
            assert_eq!(seg.index_state(), IndexState::Used);
            assert_eq!(
                assert_intact(&seg, &made, &[last_seq]).len() as u64,
                last_seq
            );
        }
    }
    // What was cut is kept aside, never deleted.
    let saved = std::fs::read_dir(run.join("lost+found"))
        .expect("lost+found")
        .count();
    assert!(saved > 0);
}

#[test]
fn random_bit_flips_lose_only_the_records_they_hit() {
    let dir = Scratch::new("flips");
    let run = dir.path();
    let made = common::records(0, 3, 12, 2);
    write_segment(run, &made, 0, 3, true);
    let seg_path = segment_path(run, 0, 3);
    let orig = std::fs::read(&seg_path).expect("segment");
    let orig_idx = std::fs::read(index_path(&seg_path)).expect("index");
    let frames = offsets(&seg_path);
    let mut rng = Rng(0x7415_c0de);
    let (mut lost_reported, mut saved_by_index, mut headers_fixed) = (0, 0, 0);
    for trial in 0..300 {
        let mut bytes = orig.clone();
        let flips = 1 + rng.below(3);
        let mut hit = Vec::new();
        for _ in 0..flips {
            // Frames only: a damaged segment header is its own test.
            let at = 64 + rng.below(orig.len() as u64 - 64);
            bytes[at as usize] ^= 1 << rng.below(8);
            let i = frames
                .iter()
                .position(|&(o, l)| o <= at && at < o + l)
                .expect("every byte after the header is in a frame");
            hit.push(i as u64);
        }
        std::fs::write(&seg_path, &bytes).expect("flip");
        for with_index in [true, false] {
            if with_index {
                std::fs::write(index_path(&seg_path), &orig_idx).expect("index");
            } else {
                let _ = std::fs::remove_file(index_path(&seg_path));
            }
            let seg = Segment::open(&seg_path).expect("a damaged segment still opens");
            let read = assert_intact(&seg, &made, &hit);
            for s in 0..made.len() as u64 {
                if !hit.contains(&s) {
                    assert!(
                        read.contains(&s),
                        "trial {trial}: intact seq {s} not readable"
                    );
                }
            }
            // Each lost record is reported with a seq that names it.
            let check = check_segment(&seg, true, &mut |_| {});
            for &s in &hit {
                if read.contains(&s) {
                    // The flip hit a field no reader depends on, or the index saved the body.
                    saved_by_index += check
                        .issues
                        .iter()
                        .filter(|i| i.kind == IssueKind::RecoveredByIndex)
                        .count();
                    continue;
                }
                lost_reported += 1;
                assert!(
                    check
                        .issues
                        .iter()
                        .any(|i| i.kind.loses_data() && covers(i.seq, s)),
                    "trial {trial} (index {with_index}): lost seq {s} is not reported: {:?}",
                    check.issues
                );
            }
            assert_clear(&check.issues);
            // With the index fsck writes (intact records only), the same records read and
            // the lost ones are still reported by seq.
            rebuild_index(&check).expect("index");
            drop(seg);
            let seg = Segment::open(&seg_path).expect("reopens");
            let again = assert_intact(&seg, &made, &hit);
            assert_eq!(
                again, read,
                "trial {trial}: the rebuilt index changes nothing"
            );
            let recheck = check_segment(&seg, true, &mut |_| {});
            for &s in hit.iter().filter(|s| !read.contains(s)) {
                assert!(
                    recheck
                        .issues
                        .iter()
                        .any(|i| i.kind.loses_data() && covers(i.seq, s)),
                    "trial {trial}: after the index rebuild, lost seq {s} is not reported: {:?}",
                    recheck.issues
                );
            }
            assert!(recheck.index_wanted.is_none(), "the rebuilt index is final");
            // Frame headers the index saved are written back: then the index matches again.
            drop(seg);
            if repair_frame_headers(run, &recheck).expect("headers") > 0 {
                let seg = Segment::open(&seg_path).expect("reopens");
                assert_eq!(seg.index_state(), IndexState::Used, "{:?}", seg.issues());
                assert_eq!(assert_intact(&seg, &made, &hit), read);
                headers_fixed += 1;
            }
            std::fs::write(&seg_path, &bytes).expect("undo the header repair");
        }
    }
    // The flips mostly land in bodies (lost, reported); a few in frame headers, where the
    // index still finds the intact body.
    assert!(lost_reported > 400, "{lost_reported}");
    assert!(saved_by_index > 0, "{saved_by_index}");
    assert!(headers_fixed > 0, "{headers_fixed}");
}

#[test]
fn a_corrupted_index_is_rebuilt_by_scanning() {
    let dir = Scratch::new("index");
    let run = dir.path();
    let made = common::records(2, 1, 9, 4);
    write_segment(run, &made, 2, 1, true);
    let seg_path = segment_path(run, 2, 1);
    let idx_path = index_path(&seg_path);
    let orig = std::fs::read(&idx_path).expect("index");
    let orig_entries = read_index(&idx_path).expect("index");
    let mut rng = Rng(99);
    let mut damaged_cases = 0;
    for case in 0..200 {
        let mut idx = orig.clone();
        match case % 5 {
            0 => idx.truncate(rng.below(idx.len() as u64) as usize),
            1 => {
                let at = rng.below(idx.len() as u64) as usize;
                idx[at] ^= 1 << rng.below(8);
            }
            2 => idx.extend([0u8; 32]),
            3 => {
                for b in idx.iter_mut().skip(16) {
                    *b = rng.next() as u8;
                }
            }
            _ => {
                // Entries swapped.
                let (a, b) = (16, 16 + 32);
                let tmp: Vec<u8> = idx[a..a + 32].to_vec();
                idx.copy_within(b..b + 32, a);
                idx[b..b + 32].copy_from_slice(&tmp);
            }
        }
        std::fs::write(&idx_path, &idx).expect("index");
        let seg = Segment::open(&seg_path).expect("opens whatever the index says");
        let read = assert_intact(&seg, &made, &[]);
        assert_eq!(read.len(), made.len(), "case {case}: {:?}", seg.issues());
        if seg.index_state() == IndexState::Damaged {
            damaged_cases += 1;
            assert!(seg
                .issues()
                .iter()
                .any(|i| i.kind == IssueKind::DamagedIndex && i.to_string().contains("scanning")));
        }
        assert_clear(seg.issues());
        let check = check_segment(&seg, false, &mut |_| {});
        rebuild_index(&check).expect("rewrite");
        // Reserved bytes and the minor version are not checked; everything else is restored.
        assert_eq!(
            read_index(&idx_path).expect("index"),
            orig_entries,
            "case {case}: rebuilt"
        );
    }
    assert!(
        damaged_cases > 100,
        "most cases damage the index: {damaged_cases}"
    );
}

#[test]
fn a_store_without_its_manifest_reads_and_gets_one_back() {
    let dir = Scratch::new("manifest");
    let run = dir.path();
    let all = write_store(run, 2, 2, 7);
    let orig = Manifest::read(run).expect("manifest");
    for damage in ["remove", "garble", "half"] {
        let text = std::fs::read(manifest_path(run)).expect("manifest");
        match damage {
            "remove" => std::fs::remove_file(manifest_path(run)).expect("rm"),
            "garble" => std::fs::write(manifest_path(run), b"\x00\x01 not json").expect("w"),
            _ => std::fs::write(manifest_path(run), &text[..text.len() / 2]).expect("w"),
        }
        let store = Store::open(run).expect("opens without a manifest");
        assert!(store.manifest().is_none());
        let msg = store.issues()[0].to_string();
        assert!(
            msg.contains("manifest") && msg.contains("fsck --repair"),
            "{msg}"
        );
        assert_eq!(store.ranks(), vec![0, 1]);
        let mut checks = Vec::new();
        for ((rank, step), made) in &all {
            let seg = store.open_segment(*rank, *step).expect("segment");
            assert_eq!(assert_intact(&seg, made, &[]).len(), made.len());
            checks.push(check_segment(&seg, true, &mut |_| {}));
        }
        let m = rebuild_manifest(&store, &checks);
        assert!(m.run_id.starts_with("recovered:"));
        for (r, o) in m.ranks.iter().zip(&orig.ranks) {
            assert_eq!(
                (r.rank, r.records, r.gaps, r.bytes_raw),
                (o.rank, o.records, o.gaps, o.bytes_raw),
                "{damage}"
            );
        }
        assert_eq!(m.comms.len(), 1);
        assert_eq!(
            m.comms[0].members,
            vec![Some(0), Some(1)],
            "communicator rebuilt"
        );
        write_rebuilt_manifest(run, &m).expect("write");
        let back = Store::open(run).expect("reopen");
        assert!(back.issues().is_empty(), "{:?}", back.issues());
        assert_eq!(back.manifest(), Some(&m));
        if damage != "remove" {
            assert!(
                run.join("manifest.json.damaged").exists(),
                "the damaged one is kept"
            );
        }
        // Put the original back for the next case.
        orig.write(run).expect("restore");
    }
}

#[test]
fn unknown_major_versions_are_refused_by_name() {
    let dir = Scratch::new("version");
    let run = dir.path();
    let all = write_store(run, 1, 2, 3);
    // A newer segment: refused with both versions named, the other segment still reads.
    let seg0 = segment_path(run, 0, 0);
    let mut b = std::fs::read(&seg0).expect("segment");
    b[8] = 2;
    std::fs::write(&seg0, &b).expect("write");
    let store = Store::open(run).expect("store");
    match store.open_segment(0, 0) {
        Err(FormatError::Version(m)) => {
            assert!(
                m.contains("step000000.seg")
                    && m.contains("major version 2")
                    && m.contains("reads 1"),
                "{m}"
            )
        }
        other => panic!("a v2 segment must be refused: {other:?}"),
    }
    let seg1 = store.open_segment(0, 1).expect("the v1 segment");
    assert_eq!(assert_intact(&seg1, &all[&(0, 1)], &[]).len(), 3);
    // fsck --repair never "repairs" a newer version.
    assert!(!repair_header(run, &seg0, 0, 0).expect("no-op"));
    // A newer manifest: the whole store is refused.
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(manifest_path(run)).expect("m")).expect("json");
    v["format_major"] = 3.into();
    std::fs::write(manifest_path(run), serde_json::to_vec(&v).expect("json")).expect("w");
    match Store::open(run) {
        Err(FormatError::Version(m)) => assert!(m.contains("manifest.json") && m.contains("3")),
        other => panic!("a v3 manifest must be refused: {other:?}"),
    }
}

#[test]
fn a_damaged_segment_magic_is_restored_from_the_file_name() {
    let dir = Scratch::new("header");
    let run = dir.path();
    let all = write_store(run, 1, 1, 4);
    let seg = segment_path(run, 0, 0);
    let mut b = std::fs::read(&seg).expect("segment");
    b[2] ^= 0x10;
    std::fs::write(&seg, &b).expect("write");
    let err = Segment::open(&seg).expect_err("a bad magic is refused");
    assert!(err.to_string().contains("not a ttrace segment"), "{err}");
    assert!(repair_header(run, &seg, 0, 0).expect("repair"));
    let s = Segment::open(&seg).expect("restored");
    assert_eq!(assert_intact(&s, &all[&(0, 0)], &[]).len(), 4);
    assert!(run.join("lost+found").read_dir().expect("saved").count() == 1);
}

#[test]
fn a_segment_cut_between_records_shows_against_the_manifest() {
    let dir = Scratch::new("counts");
    let run = dir.path();
    write_store(run, 1, 1, 6);
    let seg_path = segment_path(run, 0, 0);
    let frames = offsets(&seg_path);
    let b = std::fs::read(&seg_path).expect("segment");
    std::fs::write(&seg_path, &b[..frames[5].0 as usize]).expect("cut");
    std::fs::remove_file(index_path(&seg_path)).expect("rm index");
    let store = Store::open(run).expect("store");
    let seg = store.open_segment(0, 0).expect("segment");
    let checks = vec![check_segment(&seg, false, &mut |_| {})];
    let issues = check_counts(&store, &checks);
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert_eq!(issues[0].kind, IssueKind::LostRecords);
    assert!(issues[0].to_string().contains("1 lost"), "{}", issues[0]);
}

#[test]
fn an_unindexed_segment_being_written_reads_up_to_its_last_whole_record() {
    // The daemon flushes frames as it goes and writes the index at the step's end: a reader
    // meanwhile (or after a crash) sees frames and no index.
    let dir = Scratch::new("live");
    let run = dir.path();
    let made = common::records(0, 0, 8, 1);
    write_segment(run, &made, 0, 0, false);
    let seg = Segment::open(&segment_path(run, 0, 0)).expect("opens");
    assert_eq!(seg.index_state(), IndexState::Missing);
    assert_eq!(seg.issues().len(), 1);
    assert!(seg.issues()[0].to_string().contains("scanning"));
    assert_eq!(assert_intact(&seg, &made, &[]).len(), 8);
}

#[test]
fn a_damaged_header_right_after_a_lost_record_is_still_recovered_by_the_index() {
    // Record 1 loses its body; record 2 only its header magic. Skipping from the damaged
    // record 1 to the next intact header would jump over record 2, whose body the index still
    // locates: it must read back, and only record 1 is lost.
    let dir = Scratch::new("header-after-loss");
    let run = dir.path();
    let made = common::records(0, 4, 5, 1);
    write_segment(run, &made, 0, 4, true);
    let seg_path = segment_path(run, 0, 4);
    let frames = offsets(&seg_path);
    let mut bytes = std::fs::read(&seg_path).expect("segment");
    let (o1, l1) = frames[1];
    bytes[(o1 + l1 / 2) as usize] ^= 0x40;
    bytes[frames[2].0 as usize] ^= 0xff;
    std::fs::write(&seg_path, &bytes).expect("damage");
    let seg = Segment::open(&seg_path).expect("a damaged segment still opens");
    let read = assert_intact(&seg, &made, &[1]);
    assert_eq!(read, vec![0, 2, 3, 4], "every record but seq 1 reads back");
    let check = check_segment(&seg, true, &mut |_| {});
    assert!(
        check
            .issues
            .iter()
            .any(|i| i.kind == IssueKind::RecoveredByIndex && covers(i.seq, 2)),
        "{:?}",
        check.issues
    );
    assert!(
        check
            .issues
            .iter()
            .any(|i| i.kind.loses_data() && covers(i.seq, 1)),
        "{:?}",
        check.issues
    );
}
