//! `ttrace compare` and `ttrace check` on fixture2 (`tests/integration/c/fixture2.c`,
//! docs/fixture2.md), a tensor + data parallel MLP written
//! in C against NVIDIA's headers with conventions unlike the Rust trainer: summed loss with
//! the gradients divided on the host after an `ncclAvg` data-parallel reduction, one
//! micro-batch, weights stored transposed, cuBLASLt for one layer and cuBLAS for the other.
//! Everything is traced by the real `ttrace run` under simrun, tp=2 dp=2 against a world-1
//! reference, in FP32 and BF16.
//!
//! * Detection matrix: every catalogue bug gives exit 1, and the verdict names the op and
//!   rank(s) where the bug first shows in captured data (or, for a bug in uncaptured host
//!   code, the first captured op after it).
//! * No false alarm: bug-free runs match, also when captured with `--ranks`, `--apis`,
//!   `--steps` and `--no-inputs` (such a store is compared on what it holds, or compare exits
//!   2 saying what it needs).
//! * Replicas with one micro-batch: check finds the data-parallel weights and reports a
//!   replica whose update differs; compare reports the same drift in BF16, where each replica
//!   stays within tolerance of the reference.
//!
//! The fixture's data-parallel reduction averages summed-loss gradients, so its output is
//! 1/dp of the reference's weight gradient, restored by the host's division: compare decides
//! that scale from the next step's weight updates, with no option. About a minute on 2 cores
//! (30 traced runs of a few seconds).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use integration_tests::c_build::{compile_c, CUDA12_SONAMES};
use integration_tests::{bin, describe, profile_dir, sim_dir, ttrace_run};
use serde_json::Value;

const STEPS: &str = "3";

/// Compiles fixture2 once per test binary with gcc against NVIDIA's headers, linked to the
/// simulated libraries by soname.
pub(crate) fn fixture2() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| compile_c("fixture2.c", "fixture2", 12, &sim_dir(), &CUDA12_SONAMES))
}

/// Traces `fixture2 --precision P --steps 3 ARGS` with `ttrace run OPTS` (4 ranks under
/// simrun, tp=2 dp=2, unless `reference`).
fn trace(store: &Path, precision: &str, reference: bool, opts: &[&str], args: &[&str]) {
    let mut cmd = ttrace_run(store);
    cmd.args(opts).arg("--");
    if !reference {
        cmd.arg(bin("simrun"))
            .args(["--nproc-per-node", "4", "--grace-period", "5", "--"]);
    }
    cmd.arg(fixture2())
        .args(["--precision", precision, "--steps", STEPS]);
    if !reference {
        cmd.args(["--tp", "2", "--dp", "2"]);
    }
    let out = cmd.args(args).output().expect("ttrace run");
    assert!(
        out.status.success(),
        "ttrace run {opts:?} -- fixture2 {args:?}:\n{}",
        describe(&out)
    );
}

/// A reference and its perturbed twin, in a directory also used for the runs
/// (`target/<profile>/fixture2-stores/<precision>`, emptied when the first test of a process
/// needs it: the stores are shared by the tests and outlive them, so not in the system temp).
struct Stores {
    dir: PathBuf,
    reference: PathBuf,
    perturbed: PathBuf,
}

/// The stores of `precision`, made once per test binary.
fn stores(precision: &str) -> Arc<Stores> {
    static ALL: Mutex<BTreeMap<String, Arc<Stores>>> = Mutex::new(BTreeMap::new());
    // Held while the stores are made: two tests must not make (and empty) them at once.
    let mut all = ALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(s) = all.get(precision) {
        return s.clone();
    }
    let dir = profile_dir().join("fixture2-stores").join(precision);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the stores' directory");
    let reference = dir.join("ref");
    let perturbed = dir.join("ref-perturbed");
    trace(&reference, precision, true, &[], &[]);
    trace(&perturbed, precision, true, &["--perturb"], &[]);
    let s = Arc::new(Stores {
        dir,
        reference,
        perturbed,
    });
    all.insert(precision.to_string(), s.clone());
    s
}

/// A tp=2 dp=2 run of `precision` with `bug` (`none`: bug-free), captured with `opts`.
fn run(precision: &str, bug: &str, opts: &[&str]) -> (Arc<Stores>, PathBuf) {
    let s = stores(precision);
    let tag: String = opts
        .join("")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let store = s.dir.join(format!("{bug}-{tag}"));
    // One test traces a store; another wanting the same one waits for it.
    static TRACING: Mutex<()> = Mutex::new(());
    let _one = TRACING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !store.exists() {
        trace(&store, precision, false, opts, &["--bug", bug]);
    }
    (s, store)
}

/// `ttrace compare` of `run` against the reference: exit code, text and JSON report.
fn compare(s: &Stores, run: &Path, extra: &[&str]) -> (i32, String, Value) {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let json = run.with_extension(format!("{n}.json"));
    let out = Command::new(bin("ttrace"))
        .arg("compare")
        .arg(&s.reference)
        .arg(run)
        .arg("--perturbed")
        .arg(&s.perturbed)
        .arg("--json")
        .arg(&json)
        .args(extra)
        .output()
        .expect("ttrace compare");
    let code = out.status.code().unwrap_or(-1);
    let report = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (code, text, report)
}

/// `ttrace check` of `run`: exit code and JSON report.
fn check(run: &Path) -> (i32, Value) {
    let out = Command::new(bin("ttrace"))
        .arg("check")
        .arg(run)
        .args(["--json", "-"])
        .output()
        .expect("ttrace check");
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("check JSON: {e}\n{}", describe(&out)));
    (out.status.code().unwrap_or(-1), report)
}

/// Where a verdict points: step, NVTX range, API, ranks and cause of the first divergence,
/// or of the first replica drift when no tensor left its tolerance.
#[derive(Debug)]
struct Verdict {
    step: u64,
    nvtx: String,
    api: String,
    ranks: Vec<u64>,
    cause: String,
    explanation: String,
}

fn verdict(report: &Value) -> Option<Verdict> {
    let ranks = |v: &Value| -> Vec<u64> {
        v.as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    };
    let d = &report["first_divergence"];
    if !d.is_null() {
        let t = &report["tensors"][d["tensor"].as_u64()? as usize];
        return Some(Verdict {
            step: d["step"].as_u64()?,
            nvtx: t["nvtx"].as_str().unwrap_or_default().to_string(),
            api: t["api"].as_str().unwrap_or_default().to_string(),
            ranks: ranks(&d["ranks"]),
            cause: d["cause"].as_str().unwrap_or_default().to_string(),
            explanation: d["explanation"].as_str().unwrap_or_default().to_string(),
        });
    }
    let r = report["replica_drift"].get(0)?;
    Some(Verdict {
        step: r["step"].as_u64()?,
        nvtx: r["nvtx"].as_str().unwrap_or_default().to_string(),
        api: r["operand"].as_str().unwrap_or_default().to_string(),
        ranks: ranks(&r["ranks"]),
        cause: "replica drift".into(),
        explanation: String::new(),
    })
}

/// Whether the verdict lies where `bug` first shows in captured data (docs/fixture2.md).
fn localized(bug: &str, v: &Verdict) -> bool {
    let all = |ranks: &[u64]| !ranks.is_empty() && ranks.iter().all(|r| *r < 4);
    match bug {
        // fc2's partial outputs are never reduced: fc2's shards do not combine, every rank.
        "tp-allreduce-missing" => v.step == 0 && v.nvtx == "forward.fc2" && all(&v.ranks),
        // A LOCAL divergence at the TP all-reduce itself.
        "tp-allreduce-avg" => {
            v.step == 0 && v.nvtx == "forward.fc2" && v.api == "ncclAllReduce" && v.cause == "local"
        }
        // Rank 1's W1 operand, as fc1 reads it in step 0.
        "neighbour-shard" => v.step == 0 && v.nvtx == "forward.fc1" && v.ranks == [1],
        // The host update is uncaptured: the first later step's ops, on every rank.
        "grad-divided-twice" => v.step >= 1 && all(&v.ranks),
        // DP replica 1 (ranks 2 and 3): its weights in the next step's forward.
        "replica-drift" => {
            v.step == 1
                && v.nvtx.starts_with("forward.")
                && !v.ranks.is_empty()
                && v.ranks.iter().all(|r| *r == 2 || *r == 3)
        }
        // Rank 3's fc1 reads W1 untransposed: that GEMM has no counterpart (other
        // transposes); the first op on rank 3 reading its output is the verdict, and its
        // explanation names rank 3's unaligned fc1 GEMM (seq 3) that ran in between.
        "wrong-transpose" => {
            v.step == 0
                && v.nvtx == "forward.fc2"
                && v.ranks == [3]
                && v.explanation.contains("no counterpart")
                && v.explanation.contains("rank 3 step 0 seq 3: cublasGemmEx")
        }
        // A LOCAL divergence at the DP gradient reduction.
        "dp-sum" => {
            v.step == 0 && v.nvtx == "optimizer" && v.api == "ncclAllReduce" && v.cause == "local"
        }
        other => panic!("no expectation for bug {other}"),
    }
}

/// The catalogue, from `fixture2 --list-bugs`.
fn bugs() -> Vec<String> {
    let out = Command::new(fixture2())
        .arg("--list-bugs")
        .env("LD_LIBRARY_PATH", sim_dir())
        .output()
        .expect("fixture2 --list-bugs");
    assert!(out.status.success(), "{}", describe(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn matrix(precision: &str) {
    let bugs = bugs();
    assert!(bugs.len() >= 5, "the catalogue lists {bugs:?}");
    let (mut detected, mut placed) = (0, 0);
    let mut failures = Vec::new();
    for bug in &bugs {
        let (s, store) = run(precision, bug, &[]);
        let (code, text, report) = compare(&s, &store, &[]);
        let v = verdict(&report);
        let ok = v.as_ref().is_some_and(|v| localized(bug, v));
        println!("{precision} {bug:22} exit {code} {v:?} localized: {ok}");
        if code == 1 {
            detected += 1;
        } else {
            failures.push(format!("{bug}: not detected (exit {code}):\n{text}"));
        }
        if ok {
            placed += 1;
        } else if code == 1 {
            failures.push(format!(
                "{bug}: detected but not localized ({v:?}):\n{text}"
            ));
        }
    }
    println!(
        "{precision}: {detected}/{} detected, {placed} localized",
        bugs.len()
    );
    assert_eq!(detected, bugs.len(), "{}", failures.join("\n"));
    assert!(
        placed * 100 >= bugs.len() * 95,
        "{placed}/{} localized:\n{}",
        bugs.len(),
        failures.join("\n")
    );
}

#[test]
fn every_bug_is_detected_and_localized_in_fp32() {
    matrix("fp32");
}

#[test]
fn every_bug_is_detected_and_localized_in_bf16() {
    matrix("bf16");
}

#[test]
fn bug_free_runs_match_and_check_clean_with_one_micro_batch() {
    for precision in ["fp32", "bf16"] {
        let (s, store) = run(precision, "none", &[]);
        let (code, text, report) = compare(&s, &store, &[]);
        assert_eq!(code, 0, "{precision}: {text}");
        assert_eq!(report["replica_drift"], Value::Array(vec![]), "{text}");
        let (code, rep) = check(&store);
        assert_eq!(code, 0, "{precision}: check found {}", rep["findings"]);
        // One micro-batch: the weights are found by persistence across steps.
        assert_eq!(
            rep["replica_groups"],
            serde_json::json!([[0, 2], [1, 3]]),
            "{precision}: the data-parallel groups are found"
        );
        assert!(rep["weights_compared"].as_u64().unwrap_or(0) > 0, "{rep}");
    }
}

/// The scale and basis of the data-parallel reduction decision in a report.
fn dp_decision(report: &Value) -> (f64, String) {
    let d = &report["dp_reduction"];
    (
        d["scale"].as_f64().unwrap_or(f64::NAN),
        d["basis"].as_str().unwrap_or_default().to_string(),
    )
}

/// The fixture averages sum-loss gradients and divides by the local batch on the host: its
/// reduction outputs half the reference's gradient. compare reads that from the next step's
/// weight updates (no option), holds a sum there to it (a LOCAL divergence with norm ratio
/// 2, although a sum's output is the reference's gradient), and leaves a host that divides
/// twice to the weights it moves (no convention explains the update it needs).
#[test]
fn the_data_parallel_scale_is_decided_from_the_weight_updates() {
    for precision in ["fp32", "bf16"] {
        let (s, clean) = run(precision, "none", &[]);
        let (code, text, report) = compare(&s, &clean, &[]);
        assert_eq!(code, 0, "{precision}: {text}");
        assert_eq!(dp_decision(&report), (0.5, "updates".into()), "{text}");

        let (_, sum) = run(precision, "dp-sum", &[]);
        let (code, text, report) = compare(&s, &sum, &[]);
        assert_eq!(code, 1, "{precision}: {text}");
        assert_eq!(dp_decision(&report), (0.5, "updates".into()), "{text}");
        let d = &report["first_divergence"];
        let t = &report["tensors"][d["tensor"].as_u64().unwrap_or(u64::MAX) as usize];
        assert_eq!(
            (t["api"].as_str(), d["cause"].as_str()),
            (Some("ncclAllReduce"), Some("local")),
            "{precision}: {text}"
        );
        let ratio = t["norm_ratio"].as_f64().unwrap_or(0.0);
        assert!(
            (ratio - 2.0).abs() < 0.05,
            "{precision}: norm ratio {ratio}"
        );

        let (_, twice) = run(precision, "grad-divided-twice", &[]);
        let (code, text, report) = compare(&s, &twice, &[]);
        assert_eq!(code, 1, "{precision}: {text}");
        assert_eq!(
            dp_decision(&report),
            (0.5, "outputs_after_illegal_updates".into()),
            "{text}"
        );

        // The option still overrides: declared 1, the clean run's reduction is half of it.
        let (code, text, report) = compare(&s, &clean, &["--dp-reduction-scale", "1"]);
        assert_eq!(code, 1, "{precision}: {text}");
        assert_eq!(dp_decision(&report), (1.0, "option".into()), "{text}");
        let d = &report["first_divergence"];
        let t = &report["tensors"][d["tensor"].as_u64().unwrap_or(u64::MAX) as usize];
        assert_eq!(t["nvtx"], "optimizer", "{text}");
    }
    // Without captured operands (`--no-inputs`) no update is seen: the scale the outputs agree
    // on is taken, and said.
    let (s, store) = run("bf16", "none", &["--no-inputs"]);
    let (code, text, report) = compare(&s, &store, &[]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(dp_decision(&report), (0.5, "outputs".into()), "{text}");
    assert!(
        text.contains("data-parallel reductions held to scale"),
        "{text}"
    );
}

#[test]
fn partial_captures_of_bug_free_runs_are_never_a_divergence() {
    let captures: [&[&str]; 6] = [
        &["--ranks", "0,1"],
        &["--ranks", "0,2"],
        &["--apis", "gemm,nccl"],
        &["--apis", "gemm"],
        &["--steps", "1-2"],
        &["--no-inputs"],
    ];
    for opts in captures {
        let (s, store) = run("bf16", "none", opts);
        let (code, text, _) = compare(&s, &store, &[]);
        if opts == ["--apis", "gemm"] {
            // No collective, no communicator use: the layout must be given.
            assert_eq!(code, 2, "{opts:?}: {text}");
            assert!(text.contains("--layout"), "{opts:?}: {text}");
            let (code, text, _) = compare(&s, &store, &["--layout", "tp=2,dp=2"]);
            assert_eq!(code, 0, "{opts:?} --layout tp=2,dp=2: {text}");
        } else {
            assert_eq!(code, 0, "{opts:?}: {text}");
        }
        let (code, rep) = check(&store);
        assert_eq!(code, 0, "{opts:?}: check found {}", rep["findings"]);
    }
}

#[test]
fn replica_drift_is_caught_by_check_and_compare_in_fp32_and_bf16() {
    for precision in ["fp32", "bf16"] {
        let (s, store) = run(precision, "replica-drift", &[]);
        let (code, rep) = check(&store);
        assert_eq!(code, 1, "{precision}: {rep}");
        let drift: Vec<&Value> = rep["findings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["kind"] == "replica_mismatch")
            .collect();
        assert!(!drift.is_empty(), "{precision}: {rep}");
        for f in &drift {
            // Replicas {0, 2} and {1, 3}; identical until the first update.
            assert!(f["step"].as_u64() >= Some(1), "{f}");
            assert!(f["detail"].as_str().unwrap_or("").contains("weight"), "{f}");
        }
        let html = s.dir.join("replica-drift.html");
        let html_arg = html.to_string_lossy().into_owned();
        let (code, text, report) = compare(&s, &store, &["--html", &html_arg]);
        assert_eq!(code, 1, "{precision}: {text}");
        let page = std::fs::read_to_string(&html).expect("the HTML report");
        if precision == "bf16" {
            // Each replica stays within tolerance of the reference: the drift is the verdict.
            assert!(report["first_divergence"].is_null(), "{text}");
            assert!(
                page.contains("Replicas drifted apart"),
                "the HTML names the drift"
            );
        }
        let first = &report["replica_drift"][0];
        assert_eq!(first["step"], 1, "{text}");
        assert_eq!(first["identical_in"], 0, "{text}");
        let ranks = first["ranks"].as_array().expect("ranks");
        assert!(
            !ranks.is_empty() && ranks.iter().all(|r| r == 2 || r == 3),
            "the drifting replica is DP replica 1 (ranks 2, 3): {first}"
        );
        assert!(text.contains("replicas drifted apart"), "{text}");
    }
}

/// Replica drift is found when step 0 holds ops the later steps do not (a framework's set-up
/// copies, here `--init-copies 1`): an operand's identity across steps is not its seq.
#[test]
fn replica_drift_is_caught_when_the_first_step_holds_set_up_copies() {
    let precision = "bf16";
    let dir = profile_dir().join("fixture2-stores").join("init-copies");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the stores' directory");
    let s = Stores {
        reference: dir.join("ref"),
        perturbed: dir.join("ref-perturbed"),
        dir,
    };
    let args = ["--init-copies", "1"];
    trace(&s.reference, precision, true, &[], &args);
    trace(&s.perturbed, precision, true, &["--perturb"], &args);
    let store = s.dir.join("replica-drift");
    trace(
        &store,
        precision,
        false,
        &[],
        &[&args[..], &["--bug", "replica-drift"]].concat(),
    );
    let (code, text, report) = compare(&s, &store, &[]);
    assert_eq!(code, 1, "{text}");
    let first = &report["replica_drift"][0];
    assert_eq!(first["step"], 1, "{text}");
    assert_eq!(first["identical_in"], 0, "{text}");
    let clean = s.dir.join("none");
    trace(
        &clean,
        precision,
        false,
        &[],
        &[&args[..], &["--bug", "none"]].concat(),
    );
    let (code, text, report) = compare(&s, &clean, &[]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(report["replica_drift"], Value::Array(vec![]), "{text}");
}
