//! `ttrace compare --partition I/N` and `ttrace report merge` give what one whole
//! `ttrace compare` gives.
//!
//! For N = 1, 2 and 4 the partitions run as separate processes (at the same time), their
//! partial JSON reports are merged, and the merged verdict, exit status, first divergence
//! (step, op, role, ranks, cause, explanation), the tensors up to it, replica drift and text
//! equal the whole run's: on a bug-free run, a bug that diverges in step 0 (a row-parallel all-reduce
//! averaging) and one that first shows in step 1 (a norm-weight gradient scaled by TP, seen
//! when the next forward reads the weight), where with N = 4 the divergent step opens a
//! partition and its last good tensor lies in another. A partition's own exit status (3: its
//! share matched, 4: it diverged) never reads as a clean run. Merging refuses, with exit 2
//! and one line naming the file: partials of different runs, of different N, overlapping or
//! missing partitions, a partial of another ttrace version, and a whole-run report.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use integration_tests::{bin, trace_trainer, TempDir};
use serde_json::Value;

const MODEL: &[&str] = &[
    "--precision",
    "fp32",
    "--layers",
    "2",
    "--micro-batches",
    "2",
    "--steps",
    "4",
];

/// The trainer with this file's model and `extra` flags, traced into `store`.
fn trace(store: &Path, nproc: usize, perturb: bool, extra: &[&str]) {
    trace_trainer(store, nproc, perturb, &[MODEL, extra].concat());
}

/// A reference, its perturbed twin and tp2 runs (bug-free and with bugs), made once.
struct Stores {
    _dir: TempDir,
    root: PathBuf,
}

impl Stores {
    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

const RUNS: &[(&str, Option<&str>)] = &[
    ("none", None),
    ("row-avg", Some("tp-row-parallel-avg")),
    ("norm-grad", Some("norm-grad-scaled-by-tp")),
];

fn stores() -> &'static Stores {
    static S: OnceLock<Stores> = OnceLock::new();
    S.get_or_init(|| {
        let dir = TempDir::new("compare-partition");
        let root = dir.0.clone();
        trace(&root.join("ref"), 1, false, &[]);
        trace(&root.join("ref-perturbed"), 1, true, &[]);
        // Adam with a tiny epsilon: round-off jumps (docs/compare.md, section 4).
        let tiny = ["--adam-eps", "1e-8"];
        trace(&root.join("tiny-eps/ref"), 1, false, &tiny);
        trace(&root.join("tiny-eps/ref-perturbed"), 1, true, &tiny);
        trace(
            &root.join("tiny-eps/none"),
            2,
            false,
            &[&tiny[..], &["--tp", "2"]].concat(),
        );
        for (name, bug) in RUNS {
            let mut extra = vec!["--tp", "2"];
            if let Some(b) = bug {
                extra.extend(["--bug", b]);
            }
            trace(&root.join(name), 2, false, &extra);
        }
        Stores { _dir: dir, root }
    })
}

fn ttrace(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(bin("ttrace"))
        .args(args)
        .output()
        .expect("run ttrace")
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).expect("report written")).expect("JSON report")
}

/// The text without the line that says how long it took.
fn text_without_timing(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.starts_with("compared "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `ttrace compare REF RUN --perturbed P [--partition I/N] --json OUT`; a run `SET/NAME`
/// is compared with `SET/ref` and `SET/ref-perturbed`.
fn compare_cmd(run: &str, partition: Option<(u32, u32)>, out: &Path) -> Command {
    let s = stores();
    let set = run
        .rsplit_once('/')
        .map_or(String::new(), |(set, _)| format!("{set}/"));
    let mut cmd = Command::new(bin("ttrace"));
    cmd.arg("compare")
        .arg(s.path(&format!("{set}ref")))
        .arg(s.path(run))
        .arg("--perturbed")
        .arg(s.path(&format!("{set}ref-perturbed")))
        .arg("--json")
        .arg(out);
    if let Some((i, n)) = partition {
        cmd.args(["--partition", &format!("{i}/{n}")]);
    }
    cmd
}

/// Runs the N partitions of `run` as separate processes at once; returns their reports'
/// paths and exit statuses.
fn partitions(run: &str, n: u32, dir: &Path) -> Vec<(PathBuf, i32)> {
    let children: Vec<(PathBuf, std::process::Child)> = (1..=n)
        .map(|i| {
            let out = dir.join(format!("{}-{i}of{n}.json", run.replace('/', "_")));
            let child = compare_cmd(run, Some((i, n)), &out)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn a partition");
            (out, child)
        })
        .collect();
    children
        .into_iter()
        .map(|(out, child)| {
            let o = child.wait_with_output().expect("partition ran");
            let c = code(&o);
            assert!(
                c == 3 || c == 4,
                "a partition exits 3 or 4, not {c}: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(
                String::from_utf8_lossy(&o.stdout).starts_with("PARTIAL "),
                "a partition's text says it is partial"
            );
            (out, c)
        })
        .collect()
}

fn merge(parts: &[PathBuf], out: &Path) -> Output {
    let mut args: Vec<&std::ffi::OsStr> = vec!["report".as_ref(), "merge".as_ref()];
    args.extend(parts.iter().map(|p| p.as_os_str()));
    args.extend(["--json".as_ref(), out.as_os_str()]);
    ttrace(&args)
}

/// What each partition of a split compared and how it exited: (its steps, exit status).
type Shares = Vec<(Vec<u64>, i32)>;

/// Partitions merged give the whole run's verdict, first divergence, tensors and text;
/// returns the whole run's report and, for N = 4, each partition's share and exit status.
fn merged_equals_whole(run: &str) -> (Value, Shares) {
    let dir = TempDir::new("partition-reports");
    let whole_json = dir.0.join(format!("{}.json", run.replace('/', "_")));
    let whole = compare_cmd(run, None, &whole_json)
        .output()
        .expect("ttrace compare");
    assert!(
        code(&whole) == 0 || code(&whole) == 1,
        "{}",
        String::from_utf8_lossy(&whole.stderr)
    );
    let want = read_json(&whole_json);
    let mut shares = Vec::new();
    for n in [1, 2, 4] {
        let parts = partitions(run, n, &dir.0);
        // Every step once, the steps of a partition contiguous and in order.
        let mut covered = Vec::new();
        shares.clear();
        for (p, c) in &parts {
            let r = read_json(p);
            let mine: Vec<u64> = r["partition"]["covered"]
                .as_array()
                .expect("covered")
                .iter()
                .filter_map(Value::as_u64)
                .collect();
            let diverged = r["verdict"] == "divergence";
            assert_eq!(
                *c == 4,
                diverged,
                "{}: exit status follows its share",
                p.display()
            );
            shares.push((mine.clone(), *c));
            covered.extend(mine);
        }
        assert_eq!(
            Value::from(covered),
            want["steps"],
            "N={n} covers every step once"
        );
        let out = dir
            .0
            .join(format!("{}-merged{n}.json", run.replace('/', "_")));
        let m = merge(
            &parts.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
            &out,
        );
        assert_eq!(
            code(&m),
            code(&whole),
            "N={n}: {}",
            String::from_utf8_lossy(&m.stderr)
        );
        let got = read_json(&out);
        for key in [
            "verdict",
            "first_divergence",
            "roundoff_jumps",
            "chaotic_steps",
            "replica_drift",
            "not_comparable",
            "warnings",
            "steps",
            "reference",
            "run",
            "perturbed",
        ] {
            assert_eq!(
                got[key], want[key],
                "N={n}: {key} differs from the whole run's"
            );
        }
        // The same tensors in the same order; every number up to the first divergence
        // (after it, a diverged shard's best place can differ: see docs/compare.md 9).
        let ids = |r: &Value| -> Vec<Value> {
            r["tensors"]
                .as_array()
                .expect("tensors")
                .iter()
                .map(|t| {
                    Value::from(vec![
                        t["step"].clone(),
                        t["ref_seq"].clone(),
                        t["role"].clone(),
                    ])
                })
                .collect()
        };
        assert_eq!(ids(&got), ids(&want), "N={n}: tensors");
        let upto = want["first_divergence"]["tensor"]
            .as_u64()
            .map_or(usize::MAX, |i| i as usize + 1);
        let head = |r: &Value| -> Vec<Value> {
            r["tensors"]
                .as_array()
                .expect("tensors")
                .iter()
                .take(upto)
                .cloned()
                .collect()
        };
        assert_eq!(
            head(&got),
            head(&want),
            "N={n}: tensors up to the first divergence"
        );
        assert_eq!(
            got["stats"]["bytes_compared"], want["stats"]["bytes_compared"],
            "N={n}: the partitions read what one run reads"
        );
        let (tm, tw) = (text_without_timing(&m), text_without_timing(&whole));
        if want["verdict"] == "match" {
            assert_eq!(tm, tw, "N={n}");
        } else {
            // The verdict and the first divergence's block.
            let block = |t: &str| t.lines().take(6).collect::<Vec<_>>().join("\n");
            assert_eq!(block(&tm), block(&tw), "N={n}");
        }
    }
    (want, shares)
}

#[test]
fn partitions_of_a_bug_free_run_merge_to_match() {
    let (want, shares) = merged_equals_whole("none");
    assert_eq!(want["verdict"], "match");
    assert!(shares.iter().all(|(_, c)| *c == 3), "{shares:?}");
}

/// Each step's round-off jumps are found in that step alone, so the partitions' floors are
/// the whole run's.
#[test]
fn round_off_jumps_are_the_same_in_partitions_and_the_whole_run() {
    let (want, shares) = merged_equals_whole("tiny-eps/none");
    assert_eq!(want["verdict"], "match");
    assert!(
        !want["roundoff_jumps"].as_array().expect("jumps").is_empty(),
        "{}",
        want["warnings"]
    );
    assert!(shares.iter().all(|(_, c)| *c == 3), "{shares:?}");
}

#[test]
fn a_bug_in_step_0_is_the_merged_first_divergence() {
    let (want, _) = merged_equals_whole("row-avg");
    let d = &want["first_divergence"];
    assert_eq!(d["step"], 0, "{d}");
    assert_eq!(d["cause"], "local", "{d}");
    let t = &want["tensors"][d["tensor"].as_u64().expect("index") as usize];
    assert_eq!(t["api"], "ncclAllReduce", "{t}");
}

#[test]
fn a_bug_first_seen_in_a_later_step_is_found_across_a_partition_boundary() {
    let (want, shares) = merged_equals_whole("norm-grad");
    let d = &want["first_divergence"];
    let step = d["step"].as_u64().expect("step");
    assert!(step >= 1, "{d}");
    // With 4 partitions of 4 equal steps, the partitions before that step's saw nothing:
    // the merged verdict comes from a later partition than the first.
    assert_eq!(shares.len(), 4);
    let owner = shares
        .iter()
        .position(|(steps, _)| steps.contains(&step))
        .expect("a partition compared that step");
    assert!(owner >= 1, "{shares:?}");
    assert!(shares[..owner].iter().all(|(_, c)| *c == 3), "{shares:?}");
    assert_eq!(shares[owner].1, 4, "{shares:?}");
}

/// The exit status and the one line a refused merge prints.
fn refused(o: &Output, says: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(code(o), 2, "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    for s in says {
        assert!(err.contains(s), "`{s}` in: {err}");
    }
}

#[test]
fn merges_of_partials_that_do_not_make_one_run_exit_2_naming_the_file() {
    let dir = TempDir::new("partition-refusals");
    let part = |run: &str, i: u32, n: u32| -> PathBuf {
        let out = dir
            .0
            .join(format!("{}-{i}of{n}.json", run.replace('/', "_")));
        let o = compare_cmd(run, Some((i, n)), &out)
            .output()
            .expect("compare");
        assert!(
            code(&o) == 3 || code(&o) == 4,
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    };
    let (a1, a2) = (part("none", 1, 2), part("none", 2, 2));
    let merged = dir.0.join("m.json");
    let s = |p: &PathBuf| p.display().to_string();

    // Another run's partition.
    let other = part("row-avg", 2, 2);
    refused(
        &merge(&[a1.clone(), other.clone()], &merged),
        &[&s(&other), "different runs"],
    );
    // A partition of another split.
    let quarter = part("none", 2, 4);
    refused(
        &merge(&[a1.clone(), quarter.clone()], &merged),
        &[&s(&quarter), "one of 2"],
    );
    // The same partition twice.
    let copy = dir.0.join("copy.json");
    std::fs::copy(&a1, &copy).expect("copy");
    refused(
        &merge(&[a1.clone(), copy.clone(), a2.clone()], &merged),
        &[&s(&copy), "1/2 is also in", &s(&a1)],
    );
    // A partition missing: its steps are named.
    refused(
        &merge(std::slice::from_ref(&a1), &merged),
        &["not covered", "partition 2/2 missing"],
    );
    // Another version's partial.
    let mut old = read_json(&a2);
    old["partition"]["version"] = "0.0.1".into();
    let old_path = dir.0.join("old.json");
    std::fs::write(&old_path, old.to_string()).expect("write");
    refused(
        &merge(&[a1.clone(), old_path.clone()], &merged),
        &[&s(&old_path), "ttrace 0.0.1"],
    );
    // One whose fields this version does not read: still refused as another version's.
    old["partition"]
        .as_object_mut()
        .expect("an object")
        .remove("units");
    old["partition"]["schema"] = 1.into();
    std::fs::write(&old_path, old.to_string()).expect("write");
    refused(
        &merge(&[a1.clone(), old_path.clone()], &merged),
        &[&s(&old_path), "ttrace 0.0.1", "partial schema 1"],
    );
    // Partitions that held data-parallel reductions to different scales.
    let decided = |path: &PathBuf, scale: f64, name: &str| -> PathBuf {
        let mut v = read_json(path);
        v["dp_reduction"] = serde_json::json!({
            "scale": scale, "basis": "outputs", "detail": format!("{scale} from the outputs"),
        });
        let out = dir.0.join(name);
        std::fs::write(&out, v.to_string()).expect("write");
        out
    };
    let (sum, mean) = (
        decided(&a1, 1.0, "sum.json"),
        decided(&a2, 0.5, "mean.json"),
    );
    refused(
        &merge(&[sum, mean], &merged),
        &["partition 2 decided", "--dp-reduction-scale"],
    );
    // A whole-run report.
    let whole = dir.0.join("whole.json");
    let o = compare_cmd("none", None, &whole).output().expect("compare");
    assert_eq!(code(&o), 0);
    refused(
        &merge(&[whole.clone(), a2.clone()], &merged),
        &[&s(&whole), "whole-run report"],
    );
    assert!(!merged.exists(), "a refused merge writes nothing");
    // The pair itself merges.
    assert_eq!(code(&merge(&[a2.clone(), a1.clone()], &merged)), 0);

    // A merge holds one partition's comparisons at a time: each is read again when the merge
    // comes to it, and a partial that changed since it was opened is refused, naming it.
    let a2_copy = dir.0.join("a2.json");
    std::fs::copy(&a2, &a2_copy).expect("copy");
    let opened = [&a1, &a2_copy].map(|p| ttrace_compare::partition::open(p).expect("opens"));
    let mut shorter = read_json(&a2_copy);
    for path in [&["tensors"][..], &["partition", "pending"][..]] {
        let list = path.iter().fold(&mut shorter, |v, k| &mut v[*k]);
        list.as_array_mut().expect("a list").pop();
    }
    std::fs::write(&a2_copy, shorter.to_string()).expect("write");
    let Err(e) = ttrace_compare::partition::merge(opened.into()) else {
        panic!("a partial that changed since it was opened is merged");
    };
    let e = e.to_string();
    assert!(
        e.contains(&s(&a2_copy)) && e.contains("changed while"),
        "{e}"
    );

    // A partition needs somewhere to write its partial report, and a valid I/N.
    let s = stores();
    let o = ttrace(&[
        "compare".as_ref(),
        s.path("ref").as_os_str(),
        s.path("none").as_os_str(),
        "--partition".as_ref(),
        "1/2".as_ref(),
    ]);
    refused(&o, &["--json"]);
    let o = ttrace(&[
        "compare".as_ref(),
        s.path("ref").as_os_str(),
        s.path("none").as_os_str(),
        "--partition".as_ref(),
        "3/2".as_ref(),
        "--json".as_ref(),
        dir.0.join("x.json").as_os_str(),
    ]);
    refused(&o, &["--partition", "3/2"]);
}
