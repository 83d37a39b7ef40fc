//! `ttrace ls / show / stats / export / fsck` on stores written with `SegmentWriter`: clean
//! ones (every command's text and `--json` output agree with what was written), damaged ones
//! (a torn tail, a flipped bit, a lost index, a lost manifest: clear messages, every intact
//! record still listed and exported, `fsck --repair` fixes what can be fixed), and refusals
//! (an unknown major version, dtypes .npy cannot hold).

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::{write_store, Scratch};
use integration_tests::{bin, describe};
use serde_json::Value;
use ttrace_format::store::{index_path, manifest_path, read_index, segment_path};

fn ttrace(args: &[&str], run: &Path) -> Output {
    let out = Command::new(bin("ttrace"))
        .args(
            args.iter()
                .map(|a| a.replace("RUN", &run.display().to_string())),
        )
        .env_remove("TTRACE_LOG")
        .output()
        .expect("ttrace starts");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("panicked"),
        "ttrace {args:?} panicked: {}",
        describe(&out)
    );
    assert!(
        matches!(out.status.code(), Some(0..=2)),
        "ttrace {args:?}: {}",
        describe(&out)
    );
    out
}

fn json(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(0), "{}", describe(out));
    any_json(out)
}

/// The JSON of a command whose exit status says something else (fsck: 1 = problems left).
fn any_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(out)))
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_clean_store_lists_shows_exports_and_checks() {
    let dir = Scratch::new("read-clean");
    let run = dir.path().join("run");
    let all = write_store(&run, 2, 2, 8);

    let ls = json(&ttrace(&["ls", "RUN", "--json"], &run));
    assert_eq!(
        ls["command"],
        serde_json::json!(["python", "train.py", "--tp", "2"])
    );
    assert_eq!(ls["finalized"], true);
    let ranks = ls["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 2);
    for r in ranks {
        assert_eq!(r["records"], 16);
        assert_eq!(r["gaps"], 2);
        assert_eq!(r["steps"], serde_json::json!([0, 1]));
        assert_eq!(r["gap_reasons"]["ring_full"], 2);
        let raw: u64 = all
            .iter()
            .filter(|((rank, _), _)| *rank as u64 == r["rank"].as_u64().expect("rank"))
            .flat_map(|(_, made)| made.iter().flat_map(|m| &m.data))
            .map(|d| d.len() as u64)
            .sum();
        assert_eq!(r["bytes_raw"], raw);
        assert!(r["bytes_stored"].as_u64().expect("stored") > 0);
    }
    assert_eq!(ls["comms"][0]["members"], serde_json::json!([0, 1]));
    assert_eq!(ls["env"]["RANK"], "0");
    assert!(ls["issues"].as_array().expect("issues").is_empty());

    let ls = ttrace(&["ls", "RUN"], &run);
    let t = text(&ls);
    for want in [
        "python train.py --tp 2",
        "TTRACE_APIS=gemm",
        "ring_full 2",
        "[0, 1]",
    ] {
        assert!(t.contains(want), "ls shows {want}: {t}");
    }
    assert!(
        stderr(&ls).is_empty(),
        "a clean store has no warnings: {}",
        stderr(&ls)
    );

    // show: the table and the numbers behind it.
    let show = json(&ttrace(
        &["show", "RUN", "--rank", "1", "--step", "0", "--json"],
        &run,
    ));
    let recs = show["records"].as_array().expect("records");
    assert_eq!(recs.len(), 8);
    let made = &all[&(1, 0)];
    let ar = &recs[1];
    assert_eq!(ar["api"], "ncclAllReduce");
    assert_eq!(ar["tensors"][0]["dtype"], "F8_E4M3");
    let want = ttrace_format::tensor::stats(ttrace_format::dtype::DType::F8_E4M3, &made[1].data[0])
        .expect("stats");
    let got = &ar["tensors"][0]["stats"];
    assert_eq!(got["min"].as_f64(), want.min);
    assert_eq!(got["max"].as_f64(), want.max);
    assert_eq!(got["absmax"].as_f64(), want.absmax);
    assert_eq!(got["nan"], 0);
    assert!(
        recs[2]["tensors"][1]["stats"].is_null(),
        "uncaptured B has no stats"
    );
    assert_eq!(recs[2]["tensors"][1]["captured"], false);
    let t = text(&ttrace(
        &["show", "RUN", "--rank", "1", "--step", "0"],
        &run,
    ));
    for want in [
        "ncclAllGather",
        "train/layers.0.mlp",
        "c0ffee 1/2",
        "F8_E5M2",
        "gap:ring_full",
    ] {
        assert!(t.contains(want), "show has {want}: {t}");
    }
    let one = ttrace(
        &["show", "RUN", "--rank", "1", "--step", "0", "--seq", "3"],
        &run,
    );
    let t = text(&one);
    assert!(
        t.contains("ncclAllGather") && t.contains("Output F8_E5M2 [48]"),
        "{t}"
    );
    let one = json(&ttrace(
        &[
            "show", "RUN", "--rank", "1", "--step", "0", "--seq", "0", "--json",
        ],
        &run,
    ));
    assert_eq!(one["seq"], 0);
    let first = half::bf16::from_le_bytes([made[0].data[0][0], made[0].data[0][1]]).to_f64();
    assert_eq!(one["tensors"][0]["preview"][0][0].as_f64(), Some(first));
    let missing = ttrace(
        &["show", "RUN", "--rank", "1", "--step", "0", "--seq", "99"],
        &run,
    );
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        stderr(&missing).contains("no record with seq 99"),
        "{}",
        stderr(&missing)
    );
    let missing = ttrace(&["show", "RUN", "--rank", "7", "--step", "0"], &run);
    assert!(
        stderr(&missing).contains("no records of rank 7"),
        "{}",
        stderr(&missing)
    );

    // stats
    let st = json(&ttrace(
        &["stats", "RUN", "--json", "--apis", "gemm", "--roles", "D"],
        &run,
    ));
    let segs = st["segments"].as_array().expect("segments");
    assert_eq!(segs.len(), 4);
    for s in segs {
        assert_eq!((s["nan"].as_u64(), s["inf"].as_u64()), (Some(0), Some(0)));
        // Filtered to GEMM results: 3 GEMMs of 8 records (seq 0, 2, 6), one D each.
        assert_eq!(s["tensors"], 3);
    }

    // fsck
    let fsck = ttrace(&["fsck", "RUN"], &run);
    assert_eq!(fsck.status.code(), Some(0), "{}", describe(&fsck));
    assert!(text(&fsck).contains("0 problem(s)"), "{}", text(&fsck));
    let f = json(&ttrace(&["fsck", "RUN", "--json"], &run));
    assert_eq!(f["clean"], true);
    assert_eq!(f["records_intact"], 32);

    // export: safetensors (one file per rank and step) and the index of what was written.
    let out = dir.path().join("st");
    let ex = json(&ttrace(
        &[
            "export",
            "RUN",
            "--format",
            "safetensors",
            "--out",
            out.to_str().expect("utf8"),
            "--json",
        ],
        &run,
    ));
    let captured: usize = all
        .values()
        .flat_map(|m| m.iter().map(|m| m.data.len()))
        .sum();
    assert_eq!(ex["tensors"], captured as u64);
    assert_eq!(ex["files"], 4);
    let index: Vec<Value> =
        serde_json::from_slice(&std::fs::read(out.join("index.json")).expect("index"))
            .expect("json");
    assert_eq!(index.len(), captured);
    let names: Vec<&str> = index
        .iter()
        .map(|e| e["name"].as_str().expect("name"))
        .collect();
    assert!(
        names.contains(&"rank1/step0/seq1/ncclAllReduce/Input@train/layers.1.mlp"),
        "{names:?}"
    );
    // Refuses to write into a non-empty directory unless told.
    let again = ttrace(
        &[
            "export",
            "RUN",
            "--format",
            "safetensors",
            "--out",
            out.to_str().expect("utf8"),
        ],
        &run,
    );
    assert_eq!(again.status.code(), Some(2));
    assert!(stderr(&again).contains("--force"), "{}", stderr(&again));
}

/// Parses a `.npy` v1 file: (descr, shape, data).
fn read_npy(path: &Path) -> (String, Vec<u64>, Vec<u8>) {
    let b = std::fs::read(path).expect("npy");
    assert_eq!(&b[..8], b"\x93NUMPY\x01\x00");
    let hl = u16::from_le_bytes([b[8], b[9]]) as usize;
    let h = String::from_utf8_lossy(&b[10..10 + hl]).into_owned();
    let descr = h
        .split("'descr': '")
        .nth(1)
        .and_then(|s| s.split('\'').next())
        .expect("descr");
    let shape = h
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .expect("shape")
        .split(',')
        .filter_map(|d| d.trim().parse().ok())
        .collect();
    (descr.to_string(), shape, b[10 + hl..].to_vec())
}

#[test]
fn npy_refuses_what_numpy_cannot_hold_unless_widened() {
    let dir = Scratch::new("read-npy");
    let run = dir.path().join("run");
    let all = write_store(&run, 1, 1, 6);
    let out = dir.path().join("npy");
    let o = out.to_str().expect("utf8");
    let refused = ttrace(&["export", "RUN", "--format", "npy", "--out", o], &run);
    assert_eq!(refused.status.code(), Some(2));
    let e = stderr(&refused);
    assert!(
        e.contains("cannot hold") && e.contains("BF16") && e.contains("--widen"),
        "a clear refusal: {e}"
    );
    assert!(!out.exists(), "nothing written before refusing");
    // F32 and U8 only: no widening needed.
    json(&ttrace(
        &[
            "export", "RUN", "--format", "npy", "--out", o, "--roles", "D,Dst", "--json",
        ],
        &run,
    ));
    let (descr, shape, data) =
        read_npy(&out.join("rank00000/step000000/seq000000.cublasGemmEx.D.npy"));
    assert_eq!((descr.as_str(), shape), ("<f4", vec![4, 8]));
    assert_eq!(data, all[&(0, 0)][0].data[2]);
    // Widened: BF16 and FP8 as float32, value for value.
    let wide = dir.path().join("wide");
    json(&ttrace(
        &[
            "export",
            "RUN",
            "--format",
            "npy",
            "--widen",
            "--apis",
            "ncclAllReduce,cublasGemmEx",
            "--out",
            wide.to_str().expect("utf8"),
            "--json",
        ],
        &run,
    ));
    let (descr, shape, data) =
        read_npy(&wide.join("rank00000/step000000/seq000001.ncclAllReduce.Input.npy"));
    assert_eq!((descr.as_str(), shape), ("<f4", vec![24]));
    let src = &all[&(0, 0)][1].data[0];
    for (i, c) in data.chunks_exact(4).enumerate() {
        let got = f32::from_le_bytes(c.try_into().expect("4"));
        assert_eq!(
            got,
            float8::F8E4M3::from_bits(src[i]).to_f32(),
            "element {i}"
        );
    }
    let (descr, _, data) =
        read_npy(&wide.join("rank00000/step000000/seq000000.cublasGemmEx.A.npy"));
    assert_eq!(descr, "<f4");
    let src = &all[&(0, 0)][0].data[0];
    for (i, c) in data.chunks_exact(4).enumerate() {
        let bits = u16::from_le_bytes([src[2 * i], src[2 * i + 1]]);
        assert_eq!(
            f32::from_le_bytes(c.try_into().expect("4")).to_bits(),
            (bits as u32) << 16
        );
    }
}

#[test]
fn a_damaged_store_reads_reports_and_repairs() {
    let dir = Scratch::new("read-damaged");
    let run = dir.path().join("run");
    let all = write_store(&run, 2, 2, 8);
    // rank 0 step 0: killed mid-record (torn tail, no index).
    let s00 = segment_path(&run, 0, 0);
    let len = std::fs::metadata(&s00).expect("seg").len();
    let last = read_index(&index_path(&s00)).expect("index")[7];
    std::fs::OpenOptions::new()
        .write(true)
        .open(&s00)
        .and_then(|f| f.set_len(last.offset + 30))
        .expect("cut");
    assert!(last.offset + 30 < len);
    std::fs::remove_file(index_path(&s00)).expect("rm index");
    // rank 1 step 1: a bit flipped inside seq 3 (index kept).
    let s11 = segment_path(&run, 1, 1);
    let e3 = read_index(&index_path(&s11)).expect("index")[3];
    let mut b = std::fs::read(&s11).expect("seg");
    b[(e3.offset + e3.frame_len / 2) as usize] ^= 0x20;
    std::fs::write(&s11, &b).expect("flip");
    // rank 1 step 0: index garbled.
    std::fs::write(index_path(&segment_path(&run, 1, 0)), b"TTRIDX\r\n garbage").expect("idx");
    // and the manifest gone.
    std::fs::remove_file(manifest_path(&run)).expect("rm manifest");

    let ls = ttrace(&["ls", "RUN", "--json"], &run);
    let v = json(&ls);
    let recs: Vec<u64> = v["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| r["records"].as_u64().expect("n"))
        .collect();
    assert_eq!(recs, vec![15, 15], "every intact record is listed");
    let kinds: Vec<&str> = v["issues"]
        .as_array()
        .expect("issues")
        .iter()
        .map(|i| i["kind"].as_str().expect("kind"))
        .collect();
    for k in [
        "bad_manifest",
        "missing_index",
        "torn_tail",
        "damaged_index",
        "corrupt_record",
    ] {
        assert!(kinds.contains(&k), "{k} in {kinds:?}");
    }
    let ls = ttrace(&["ls", "RUN"], &run);
    let e = stderr(&ls);
    assert!(
        e.contains("rank 1 step 1 seq 3: corrupt record")
            && e.contains("rank 0 step 0 seq >= 7: torn tail"),
        "warnings name rank, step and seq: {e}"
    );
    assert_eq!(ls.status.code(), Some(0));

    let show = ttrace(&["show", "RUN", "--rank", "1", "--step", "1"], &run);
    assert!(text(&show).contains("UNREADABLE"), "{}", text(&show));
    assert!(stderr(&show).contains("seq 3"), "{}", stderr(&show));
    let seq3 = ttrace(
        &["show", "RUN", "--rank", "1", "--step", "1", "--seq", "3"],
        &run,
    );
    assert_eq!(seq3.status.code(), Some(2));
    assert!(
        stderr(&seq3).contains("checksum mismatch"),
        "{}",
        stderr(&seq3)
    );
    json(&ttrace(
        &[
            "show", "RUN", "--rank", "1", "--step", "1", "--seq", "4", "--json",
        ],
        &run,
    ));

    // Export: everything intact, the damaged record skipped with a warning.
    let out = dir.path().join("st");
    let ex = ttrace(
        &[
            "export",
            "RUN",
            "--format",
            "safetensors",
            "--out",
            out.to_str().expect("utf8"),
            "--json",
        ],
        &run,
    );
    let v = json(&ex);
    let captured = |rank: u32, step: u64, skip: &[u64]| -> u64 {
        all[&(rank, step)]
            .iter()
            .filter(|m| !skip.contains(&m.record.seq))
            .map(|m| m.data.len() as u64)
            .sum()
    };
    let want =
        captured(0, 0, &[7]) + captured(0, 1, &[]) + captured(1, 0, &[]) + captured(1, 1, &[3]);
    assert_eq!(v["tensors"], want);
    assert!(!v["warnings"].as_array().expect("w").is_empty());

    // fsck: reports, then repairs what it can, never losing a record.
    let f = ttrace(&["fsck", "RUN"], &run);
    assert_eq!(f.status.code(), Some(1));
    let t = text(&f);
    assert!(t.contains("--repair"), "{t}");
    let f = ttrace(&["fsck", "RUN", "--repair", "--force"], &run);
    let t = text(&f);
    assert_eq!(
        f.status.code(),
        Some(1),
        "the flipped record stays lost: {t}"
    );
    for want in [
        "cut the torn tail",
        "wrote its index",
        "manifest.json: rebuilt",
        "left after repair",
    ] {
        assert!(t.contains(want), "{want}: {t}");
    }
    let f = ttrace(&["fsck", "RUN", "--json"], &run);
    assert_eq!(f.status.code(), Some(1));
    let f = any_json(&f);
    let left: Vec<&str> = f["issues"]
        .as_array()
        .expect("issues")
        .iter()
        .map(|i| i["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(
        left,
        vec!["corrupt_record"],
        "only the unrepairable record remains"
    );
    assert_eq!(f["records_intact"], 30);
    let ls = json(&ttrace(&["ls", "RUN", "--json"], &run));
    assert!(ls["run_id"].as_str().expect("id").starts_with("recovered:"));
    assert_eq!(ls["comms"][0]["members"], serde_json::json!([0, 1]));
    assert!(
        run.join("lost+found")
            .read_dir()
            .expect("lost+found")
            .count()
            >= 1
    );
}

#[test]
fn an_unknown_major_version_is_refused_by_every_command() {
    let dir = Scratch::new("read-version");
    let run = dir.path().join("run");
    write_store(&run, 1, 1, 3);
    let mut v: Value =
        serde_json::from_slice(&std::fs::read(manifest_path(&run)).expect("m")).expect("json");
    v["format_major"] = 2.into();
    std::fs::write(manifest_path(&run), serde_json::to_vec(&v).expect("json")).expect("w");
    let out = dir.path().join("x");
    let o = out.to_str().expect("utf8");
    for args in [
        vec!["ls", "RUN"],
        vec!["show", "RUN", "--rank", "0", "--step", "0"],
        vec!["stats", "RUN"],
        vec!["export", "RUN", "--format", "safetensors", "--out", o],
        vec!["fsck", "RUN", "--repair"],
    ] {
        let r = ttrace(&args, &run);
        assert_eq!(r.status.code(), Some(2), "{args:?}");
        let e = stderr(&r);
        assert!(
            e.contains("manifest.json") && e.contains("major version 2, this ttrace reads 1"),
            "{args:?}: {e}"
        );
    }
    assert!(!out.exists());
}
