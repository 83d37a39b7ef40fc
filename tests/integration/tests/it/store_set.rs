//! several stores, one run. The nodes of one job each write their own
//! store (`srun ttrace run --out runs/job/node$SLURM_NODEID -- ...`); a directory of them is
//! read as one store by ls, show, export, check and compare.
//!
//! Two nodes are emulated by splitting a traced tp2 run by rank, as two collectors would
//! have written it: each store holds its own rank's segments, its manifest lists its own rank
//! and knows only its own rank's communicator members, and both environments name the same
//! Slurm job (each node's `ttrace run` has its own run id). Read as a set, the run gives the
//! same listing, export, check and compare verdict as the single store. A set of stores of
//! two jobs, with a rank in two stores, or with a node's store missing is refused (exit 2, one
//! line naming it); `ttrace fsck` repairs one store at a time and refuses a set.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use integration_tests::{bin, copy_dir, trace_trainer, TempDir};
use serde_json::Value;

const MODEL: &[&str] = &[
    "--precision",
    "fp32",
    "--layers",
    "2",
    "--micro-batches",
    "2",
    "--steps",
    "2",
];

/// The trainer with this file's model and `extra` flags, traced into `store`.
fn trace(store: &Path, nproc: usize, extra: &[&str]) {
    trace_trainer(store, nproc, false, &[MODEL, extra].concat());
}

/// Writes `node` as the store the node running `rank` would have written: that rank's
/// segments, a manifest with that rank, the communicator members of that rank only, and
/// the Slurm job `job` in its environment.
fn node_store(whole: &Path, node: &Path, rank: u32, job: &str) {
    let rank_dir = format!("rank{rank:05}");
    copy_dir(&whole.join(&rank_dir), &node.join(&rank_dir));
    let mut m: Value =
        serde_json::from_slice(&std::fs::read(whole.join("manifest.json")).expect("manifest"))
            .expect("json");
    m["ranks"] = Value::Array(
        m["ranks"]
            .as_array()
            .expect("ranks")
            .iter()
            .filter(|r| r["rank"] == rank)
            .cloned()
            .collect(),
    );
    for c in m["comms"].as_array_mut().expect("comms") {
        for member in c["members"].as_array_mut().expect("members") {
            if *member != rank {
                *member = Value::Null;
            }
        }
    }
    m["env"]["SLURM_JOB_ID"] = job.into();
    m["env"]["SLURM_STEP_ID"] = "0".into();
    // Each node's collector names its own run.
    m["run_id"] = format!("node{rank}-{}", m["run_id"].as_str().expect("id")).into();
    std::fs::write(node.join("manifest.json"), m.to_string()).expect("write manifest");
}

struct Stores {
    _dir: TempDir,
    root: PathBuf,
}

impl Stores {
    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

/// A reference, a tp2 run with a bug, and that run split into the set `job/` (node0, node1).
fn stores() -> &'static Stores {
    static S: OnceLock<Stores> = OnceLock::new();
    S.get_or_init(|| {
        let dir = TempDir::new("store-set");
        let root = dir.0.clone();
        trace(&root.join("ref"), 1, &[]);
        let whole = root.join("tp2");
        trace(&whole, 2, &["--tp", "2", "--bug", "tp-row-parallel-avg"]);
        node_store(&whole, &root.join("job/node0"), 0, "4242");
        node_store(&whole, &root.join("job/node1"), 1, "4242");
        Stores { _dir: dir, root }
    })
}

fn ttrace(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(bin("ttrace"))
        .args(args)
        .output()
        .expect("run ttrace")
}

fn os(s: &str) -> &std::ffi::OsStr {
    s.as_ref()
}

fn json_of(o: &Output) -> Value {
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("JSON on stdout")
}

#[test]
fn a_directory_of_one_jobs_stores_reads_as_the_whole_run() {
    let s = stores();
    let (whole, set) = (s.path("tp2"), s.path("job"));

    // ls: the same ranks, steps and records; the set's stores named.
    let ls = |p: &Path| json_of(&ttrace(&[os("ls"), p.as_os_str(), os("--json")]));
    let (a, b) = (ls(&whole), ls(&set));
    for key in ["ranks", "steps"] {
        assert_eq!(a[key], b[key], "ls {key}");
    }
    assert_eq!(
        b["stores"].as_array().map(Vec::len),
        Some(2),
        "{}",
        b["stores"]
    );
    let text = ttrace(&[os("ls"), set.as_os_str()]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("set of   2 stores"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );

    // show: a record of the second node.
    let show = |p: &Path| {
        let o = ttrace(&[
            os("show"),
            p.as_os_str(),
            os("--rank"),
            os("1"),
            os("--step"),
            os("1"),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(show(&whole), show(&set));

    // export: the same files, the same bytes.
    let out_whole = s.path("export-whole");
    let out_set = s.path("export-set");
    for (p, out) in [(&whole, &out_whole), (&set, &out_set)] {
        let o = ttrace(&[
            os("export"),
            p.as_os_str(),
            os("--format"),
            os("safetensors"),
            os("--out"),
            out.as_os_str(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let files = |d: &Path| {
        let mut v: Vec<(String, Vec<u8>)> = Vec::new();
        let mut stack = vec![d.to_path_buf()];
        while let Some(p) = stack.pop() {
            for e in std::fs::read_dir(&p).expect("dir").flatten() {
                if e.file_type().expect("type").is_dir() {
                    stack.push(e.path());
                } else {
                    let rel = e.path().strip_prefix(d).expect("rel").display().to_string();
                    v.push((rel, std::fs::read(e.path()).expect("read")));
                }
            }
        }
        v.sort();
        v
    };
    let (fw, fs) = (files(&out_whole), files(&out_set));
    assert!(!fw.is_empty());
    assert_eq!(
        fw.iter().map(|f| &f.0).collect::<Vec<_>>(),
        fs.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    // The same tensors, bytes and metadata; only the run id differs (each node's collector
    // named its own run; the set carries the first store's).
    for ((name, a), (_, b)) in fw.iter().zip(&fs) {
        if name.ends_with(".safetensors") {
            let (ha, da) = safetensors_parts(a);
            let (hb, db) = safetensors_parts(b);
            assert_eq!(ha, hb, "{name}: header");
            assert!(da == db, "{name}: tensor bytes differ");
        }
    }

    // check and compare: the same findings and verdict.
    let check = |p: &Path| {
        json_of(&ttrace(&[
            os("check"),
            p.as_os_str(),
            os("--json"),
            os("-"),
        ]))
    };
    let (a, b) = (check(&whole), check(&set));
    assert_eq!(a["findings"], b["findings"], "check");
    let compare = |p: &Path| {
        json_of(&ttrace(&[
            os("compare"),
            s.path("ref").as_os_str(),
            p.as_os_str(),
            os("--json"),
            os("-"),
        ]))
    };
    let (a, b) = (compare(&whole), compare(&set));
    assert_eq!(a["verdict"], "divergence");
    for key in [
        "verdict",
        "first_divergence",
        "tensors",
        "layout",
        "replica_drift",
    ] {
        assert_eq!(a[key], b[key], "compare {key}");
    }
}

/// A safetensors file's header (without `ttrace.run_id`) and its data.
fn safetensors_parts(bytes: &[u8]) -> (Value, &[u8]) {
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).expect("header");
    if let Some(m) = header["__metadata__"].as_object_mut() {
        m.remove("ttrace.run_id");
    }
    (header, &bytes[8 + n..])
}

fn refused(o: &Output, says: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    for s in says {
        assert!(err.contains(s), "`{s}` in: {err}");
    }
}

#[test]
fn sets_that_are_not_one_whole_job_are_refused_naming_the_problem() {
    let s = stores();
    let whole = s.path("tp2");
    let ls = |p: &Path| ttrace(&[os("ls"), p.as_os_str()]);

    // Another job's node.
    let mixed = s.path("mixed");
    node_store(&whole, &mixed.join("node0"), 0, "4242");
    node_store(&whole, &mixed.join("node1"), 1, "9999");
    refused(
        &ls(&mixed),
        &["slurm job 9999.0", "slurm job 4242.0", "one job"],
    );

    // A rank in two stores.
    let twice = s.path("twice");
    node_store(&whole, &twice.join("a"), 0, "4242");
    node_store(&whole, &twice.join("b"), 0, "4242");
    node_store(&whole, &twice.join("c"), 1, "4242");
    refused(&ls(&twice), &["rank 0 is in both"]);

    // A node's store missing.
    let half = s.path("half");
    node_store(&whole, &half.join("node1"), 1, "4242");
    refused(&ls(&half), &["ranks 0 of the world's 2", "in no store"]);
    let o = ttrace(&[os("compare"), s.path("ref").as_os_str(), half.as_os_str()]);
    refused(&o, &["in no store"]);

    // fsck works on one store of a set, never on the set.
    refused(
        &ttrace(&[os("fsck"), s.path("job").as_os_str()]),
        &["one store at a time"],
    );
    let o = ttrace(&[os("fsck"), s.path("job/node1").as_os_str()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
