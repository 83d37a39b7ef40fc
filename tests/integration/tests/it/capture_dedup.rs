//! Dedup (format 1.3): the fixture trainer reads each weight in several GEMMs
//! of a step (forward, backward, each micro-batch). Traced with dedup (the default) and with
//! `--no-dedup`, every tensor reads back with the same bytes, the deduplicated store is smaller
//! by exactly the stored bytes of the repeats, `ttrace ls` and `ttrace run` report the ratio,
//! and a damaged referenced blob makes the tensors that reference it bad, never wrong.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::Command;

use integration_tests::{bin, describe, sim_dir, ttrace_run, TempDir};
use ttrace_format::dedup::{BlobReference, REFERENCE_BYTES};
use ttrace_format::reader::Store;
use ttrace_format::store::{segment_path, Manifest};

/// Captured tensors by (rank, step, seq, tensor index): bytes, stored length, reference.
type Tensors = BTreeMap<(u32, u64, u64, usize), (Vec<u8>, u64, Option<BlobReference>)>;

fn traced_trainer(store: &Path, extra: &[&str]) -> std::process::Output {
    let out = ttrace_run(store)
        .args(extra)
        .arg("--")
        .arg(bin("trainer"))
        .args(["--steps", "2", "--micro-batches", "2"])
        .env("LD_LIBRARY_PATH", sim_dir())
        .output()
        .expect("ttrace runs");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    out
}

fn read_all(store: &Path) -> Tensors {
    let s = Store::open(store).expect("store opens");
    let mut out = BTreeMap::new();
    for info in s.segments() {
        let seg = s.open_segment(info.rank, info.step).expect("segment");
        for v in seg.records() {
            let v = v.expect("intact record");
            for t in 0..v.record.tensors.len() {
                if !v.is_captured(t) {
                    continue;
                }
                let bytes = v.tensor_bytes(t).expect("tensor reads back");
                let reference = v
                    .is_reference(t)
                    .then(|| BlobReference::parse(v.stored(t).expect("blob").1).expect("ref"));
                let stored = v.stored_len(t).expect("stored");
                let r = &v.record;
                out.insert((r.rank, r.step, r.seq, t), (bytes, stored, reference));
            }
        }
    }
    out
}

/// Raw and stored bytes that dedup saves, from a store written without it: every tensor whose
/// bytes occurred before in its (rank, step), in write order, that is worth a reference.
fn expected_savings(plain: &Tensors) -> (u64, u64) {
    let mut seen: HashSet<(u32, u64, &[u8])> = HashSet::new();
    let (mut raw, mut stored) = (0, 0);
    for ((rank, step, _, _), (bytes, len, _)) in plain {
        let repeat = !seen.insert((*rank, *step, bytes.as_slice()));
        if repeat && bytes.len() >= 256 && *len > REFERENCE_BYTES as u64 {
            raw += bytes.len() as u64;
            stored += len - REFERENCE_BYTES as u64;
        }
    }
    (raw, stored)
}

fn ls(store: &Path) -> String {
    let out = Command::new(bin("ttrace"))
        .arg("ls")
        .arg(store)
        .output()
        .expect("ttrace ls runs");
    assert!(out.status.success(), "{}", describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn dedup_line(text: &str) -> String {
    text.lines()
        .find(|l| l.trim_start().starts_with("dedup"))
        .unwrap_or_else(|| panic!("no dedup line in:\n{text}"))
        .to_string()
}

/// Every file under `dir` (relative path -> bytes).
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let rel = p
                    .strip_prefix(dir)
                    .expect("under dir")
                    .display()
                    .to_string();
                out.insert(rel, std::fs::read(&p).expect("file"));
            }
        }
    }
    out
}

fn export_npy(store: &Path, out: &Path) -> BTreeMap<String, Vec<u8>> {
    let o = Command::new(bin("ttrace"))
        .arg("export")
        .arg(store)
        .args(["--format", "npy", "--out"])
        .arg(out)
        .output()
        .expect("ttrace export runs");
    assert!(o.status.success(), "{}", describe(&o));
    files(out)
}

fn segments_bytes(store: &Path) -> u64 {
    let s = Store::open(store).expect("store opens");
    s.segments().iter().map(|i| i.bytes).sum()
}

#[test]
fn repeated_weights_are_stored_once_and_read_back_exactly() {
    let dir = TempDir::new("dedup");
    let (on, off) = (dir.path().join("on"), dir.path().join("off"));
    let run_on = traced_trainer(&on, &[]);
    traced_trainer(&off, &["--no-dedup"]);
    let (a, b) = (read_all(&on), read_all(&off));
    // The same tensors, byte for byte.
    assert_eq!(a.len(), b.len());
    for (k, (bytes, _, _)) in &b {
        assert_eq!(&a.get(k).expect("same tensor in both").0, bytes, "{k:?}");
        assert!(b[k].2.is_none(), "--no-dedup wrote a reference at {k:?}");
    }
    // Smaller by exactly the repeats' stored bytes (less their references).
    let (raw_saved, stored_saved) = expected_savings(&b);
    assert!(
        raw_saved > 0,
        "the trainer repeats weights: nothing to dedup?"
    );
    let stored = |t: &Tensors| t.values().map(|v| v.1).sum::<u64>();
    assert_eq!(stored(&a), stored(&b) - stored_saved);
    let refs: u64 = a
        .values()
        .filter(|v| v.2.is_some())
        .map(|v| v.0.len() as u64)
        .sum();
    assert_eq!(refs, raw_saved);
    let (ma, mb) = (
        Manifest::read(&on).expect("manifest"),
        Manifest::read(&off).expect("manifest"),
    );
    let deduped: u64 = ma.ranks.iter().map(|r| r.bytes_deduped).sum();
    assert_eq!(deduped, raw_saved);
    assert_eq!(mb.ranks.iter().map(|r| r.bytes_deduped).sum::<u64>(), 0);
    assert_eq!(
        ma.ranks.iter().map(|r| r.bytes_stored).sum::<u64>(),
        stored(&a)
    );
    assert!(segments_bytes(&on) < segments_bytes(&off));
    // A reference names an earlier record of its segment, never a reference, at the offset
    // of that record's frame (readers fall back to its seq, which would hide a wrong offset).
    let store = Store::open(&on).expect("store");
    let mut frame_at = BTreeMap::new();
    for i in store.segments() {
        let seg = store.open_segment(i.rank, i.step).expect("segment");
        for f in seg.frames() {
            frame_at.insert((i.rank, i.step, f.seq), f.offset);
        }
    }
    for ((rank, step, seq, _), (_, _, r)) in &a {
        if let Some(r) = r {
            assert!(r.seq <= *seq, "rank {rank} step {step} seq {seq} -> {r:?}");
            assert_eq!(frame_at[&(*rank, *step, r.seq)], r.offset, "{r:?}");
            let target = &a[&(*rank, *step, r.seq, r.tensor as usize)];
            assert!(target.2.is_none());
        }
    }
    // Reported by `ttrace run` and `ttrace ls`.
    let raw: u64 = a.values().map(|v| v.0.len() as u64).sum();
    let ratio = format!("{:.2}x", raw as f64 / (raw - raw_saved) as f64);
    assert!(
        dedup_line(&String::from_utf8_lossy(&run_on.stderr)).contains(&ratio)
            || dedup_line(&String::from_utf8_lossy(&run_on.stdout)).contains(&ratio),
        "{}",
        describe(&run_on)
    );
    assert!(dedup_line(&ls(&on)).contains(&ratio), "{}", ls(&on));
    assert!(dedup_line(&ls(&off)).contains("1.00x"), "{}", ls(&off));
    // `ttrace export` writes the same files from both stores.
    let (xa, xb) = (
        export_npy(&on, &dir.path().join("x-on")),
        export_npy(&off, &dir.path().join("x-off")),
    );
    assert!(xa.len() > 10, "{} files exported", xa.len());
    assert!(xa == xb, "exports differ");
}

#[test]
fn a_damaged_referenced_blob_makes_its_references_bad_not_wrong() {
    let dir = TempDir::new("dedup-damaged");
    let store = dir.path().join("store");
    traced_trainer(&store, &[]);
    let a = read_all(&store);
    let (&(rank, step, seq, t), (_, _, r)) = a
        .iter()
        .find(|(_, v)| v.2.is_some())
        .expect("a reference in the store");
    let r = r.expect("reference");
    // Damage the referenced record's frame (its last byte: inside its last blob).
    let path = segment_path(&store, rank, step);
    let (off, len) = {
        let s = Store::open(&store).expect("store");
        let seg = s.open_segment(rank, step).expect("segment");
        let f = seg.frames()[seg.find_seq(r.seq).expect("target")];
        (f.offset, f.frame_len)
    };
    let mut data = std::fs::read(&path).expect("segment");
    data[(off + len) as usize - 1] ^= 0x10;
    std::fs::write(&path, &data).expect("write");
    let s = Store::open(&store).expect("store");
    let seg = s.open_segment(rank, step).expect("segment");
    let v = seg
        .read(seg.find_seq(seq).expect("referencing record"))
        .expect("the referencing record itself is intact");
    let e = v.tensor_bytes(t).expect_err("its bytes are lost");
    assert!(e.to_string().contains("damaged"), "{e}");
    // fsck reports the damaged record and the bad tensors that referenced it.
    let out = Command::new(bin("ttrace"))
        .args(["fsck", "--json"])
        .arg(&store)
        .output()
        .expect("fsck runs");
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\"corrupt_record\""), "{text}");
    assert!(text.contains("\"bad_tensor\""), "{text}");
    // `ttrace dump` marks those tensors and dumps the rest of the store.
    let out = Command::new(bin("ttrace"))
        .arg("dump")
        .arg(&store)
        .output()
        .expect("dump runs");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let intact: usize = s
        .segments()
        .iter()
        .map(|i| {
            let seg = s.open_segment(i.rank, i.step).expect("segment");
            seg.records().filter(Result::is_ok).count()
        })
        .sum();
    assert_eq!(lines.len(), intact, "every intact record is dumped");
    let bad = lines
        .iter()
        .find(|l| l["rank"] == rank && l["step"] == step && l["seq"] == seq)
        .expect("the referencing record is dumped");
    assert_eq!(bad["tensors"][t]["crc_ok"], false, "{bad}");
    assert!(bad["tensors"][t]["error"].is_string(), "{bad}");
}
