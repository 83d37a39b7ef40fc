//! Reading a store `ttrace run` made of the fixture trainer (tp=2, dp=2, BF16): `ls` counts
//! what the manifest counts, `fsck` finds it clean, `show` names the trainer's NVTX ranges, and
//! `export` writes every captured tensor with the bytes the tracer checksummed. Then the same
//! store after a crash: the last segment of a rank cut mid-record and its index gone still
//! reads, and `fsck --repair` leaves it clean.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use integration_tests::{bin, describe, profile_dir, sim_dir};
use serde_json::Value;
use ttrace_format::store::{index_path, segment_path, Manifest};

fn ttrace(args: &[&str]) -> Output {
    let out = Command::new(bin("ttrace"))
        .args(args)
        .env("LD_LIBRARY_PATH", sim_dir())
        .env_remove("TTRACE_LIB")
        .env_remove("TTRACE_DAEMON")
        .env_remove("LD_PRELOAD")
        .output()
        .expect("ttrace starts");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("panicked"),
        "{}",
        describe(&out)
    );
    out
}

fn json(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(0), "{}", describe(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(out)))
}

/// A safetensors file's tensors: name -> (dtype, shape, bytes).
type Tensors = BTreeMap<String, (String, Vec<u64>, Vec<u8>)>;

/// Tensors of a safetensors file, parsed by hand (8-byte header length, JSON header, data).
fn safetensors(path: &Path) -> Tensors {
    let b = std::fs::read(path).expect("file");
    let n = u64::from_le_bytes(b[..8].try_into().expect("8")) as usize;
    let h: Value = serde_json::from_slice(&b[8..8 + n]).expect("header");
    let data = &b[8 + n..];
    let mut out = BTreeMap::new();
    for (k, v) in h.as_object().expect("object") {
        if k == "__metadata__" {
            continue;
        }
        let off: Vec<usize> = v["data_offsets"]
            .as_array()
            .expect("offsets")
            .iter()
            .map(|x| x.as_u64().expect("u64") as usize)
            .collect();
        let shape = v["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|x| x.as_u64().expect("u64"))
            .collect();
        out.insert(
            k.clone(),
            (
                v["dtype"].as_str().expect("dtype").to_string(),
                shape,
                data[off[0]..off[1]].to_vec(),
            ),
        );
    }
    out
}

#[test]
fn a_traced_training_run_reads_back_whole() {
    assert!(
        profile_dir().join("libttrace.so").exists(),
        "libttrace.so is not built next to ttrace (cargo build --release)"
    );
    let dir = std::env::temp_dir().join(format!("ttrace-read-trainer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let store = dir.join("store");
    let s = store.to_str().expect("utf8");
    let simrun = bin("simrun");
    let trainer = bin("trainer");
    let run = ttrace(&[
        "run",
        "--out",
        s,
        "--",
        simrun.to_str().expect("utf8"),
        "--nproc-per-node",
        "4",
        "--",
        trainer.to_str().expect("utf8"),
        "--precision",
        "bf16",
        "--tp",
        "2",
        "--dp",
        "2",
        "--steps",
        "2",
    ]);
    assert_eq!(run.status.code(), Some(0), "{}", describe(&run));
    let m = Manifest::read(&store).expect("manifest");

    // ls agrees with the manifest the collector wrote.
    let ls = json(&ttrace(&["ls", s, "--json"]));
    assert_eq!(ls["finalized"], true);
    let ranks = ls["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 4);
    for r in ranks {
        let rank = r["rank"].as_u64().expect("rank") as u32;
        let mi = m
            .ranks
            .iter()
            .find(|x| x.rank == rank)
            .expect("in the manifest");
        assert_eq!(r["records"], mi.records, "rank {rank}");
        assert_eq!(r["bytes_raw"], mi.bytes_raw, "rank {rank}");
        assert_eq!(r["bytes_stored"], mi.bytes_stored, "rank {rank}");
        assert_eq!(
            r["steps"].as_array().expect("steps").len(),
            2,
            "rank {rank}"
        );
    }
    assert!(!ls["comms"].as_array().expect("comms").is_empty());
    let fsck = ttrace(&["fsck", s]);
    assert_eq!(fsck.status.code(), Some(0), "{}", describe(&fsck));

    // show: the trainer's NVTX ranges and finite statistics.
    let show = json(&ttrace(&[
        "show", s, "--rank", "1", "--step", "1", "--json",
    ]));
    let recs = show["records"].as_array().expect("records");
    assert!(recs.iter().any(|r| r["nvtx"].as_array().is_some_and(|n| n
        .iter()
        .any(|x| x.as_str().is_some_and(|x| x.contains("mlp"))))));
    let stats = json(&ttrace(&["stats", s, "--json"]));
    for seg in stats["segments"].as_array().expect("segments") {
        assert_eq!(seg["nan"], 0, "a healthy run: {seg}");
    }

    // export: every captured tensor, bytes matching the tracer's checksum.
    let out = dir.join("st");
    let ex = json(&ttrace(&[
        "export",
        s,
        "--format",
        "safetensors",
        "--out",
        out.to_str().expect("utf8"),
        "--json",
    ]));
    let index: Vec<Value> =
        serde_json::from_slice(&std::fs::read(out.join("index.json")).expect("index"))
            .expect("json");
    assert_eq!(ex["tensors"].as_u64(), Some(index.len() as u64));
    assert!(index.len() > 50, "{} tensors", index.len());
    let mut files: BTreeMap<String, Tensors> = BTreeMap::new();
    for e in &index {
        let file = e["file"].as_str().expect("file").to_string();
        let tensors = files
            .entry(file.clone())
            .or_insert_with(|| safetensors(&out.join(&file)));
        let (dtype, shape, bytes) = &tensors[e["name"].as_str().expect("name")];
        assert_eq!(dtype, e["dtype"].as_str().expect("dtype"));
        assert_eq!(Value::from(shape.clone()), e["shape"]);
        assert_eq!(
            Some(crc32fast::hash(bytes) as u64),
            e["crc32"].as_u64(),
            "{}",
            e["name"]
        );
    }

    // A crash: rank 3's last segment cut mid-record, its index lost.
    let last_step = 1;
    let seg = segment_path(&store, 3, last_step);
    let len = std::fs::metadata(&seg).expect("segment").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .and_then(|f| f.set_len(len - 7))
        .expect("cut");
    std::fs::remove_file(index_path(&seg)).expect("rm index");
    let ls = json(&ttrace(&["ls", s, "--json"]));
    let r3 = ls["ranks"].as_array().expect("ranks")[3]["records"]
        .as_u64()
        .expect("n");
    let m3 = m
        .ranks
        .iter()
        .find(|x| x.rank == 3)
        .expect("rank 3")
        .records;
    assert_eq!(r3, m3 - 1, "only the torn record is missing");
    let fsck = ttrace(&["fsck", s]);
    assert_eq!(fsck.status.code(), Some(1));
    let t = String::from_utf8_lossy(&fsck.stdout);
    assert!(t.contains("torn tail") && t.contains("1 lost"), "{t}");
    let fix = ttrace(&["fsck", s, "--repair"]);
    assert!(
        String::from_utf8_lossy(&fix.stdout).contains("cut the torn tail"),
        "{}",
        describe(&fix)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
