//! `ttrace run` and `ttrace compare` on a trainer whose forward and backward passes are
//! replayed from a CUDA graph (`trainer --cuda-graph`: captured once, launched every step):
//! the graphed run holds the same records as the eager run of the same layout, passes
//! `ttrace check`, compares MATCH against an eager single-device reference, and a bug inside a
//! graphed layer is found at the same op as in the eager run. A graphed reference's perturbed
//! twin is perturbed at every replay, so its drift is a measurement; a twin that is not (the
//! reference's bytes) is found in the data, and the drift over the steps is modelled.

use std::path::Path;
use std::process::Command;

use integration_tests::{bin, copy_dir, trace_trainer, TempDir};
use serde_json::Value;

/// Model flags shared by the reference and the runs (no NVTX: replayed ops run no API call,
/// so their records carry no NVTX range, and positions are compared instead).
const MODEL: &[&str] = &["--micro-batches", "2", "--steps", "3", "--no-nvtx"];

/// The trainer with this file's model and `extra` flags, traced into `store`.
fn trace(store: &Path, nproc: usize, extra: &[&str], perturb: bool) {
    trace_trainer(store, nproc, perturb, &[MODEL, extra].concat());
}

/// `ttrace compare REF RUN --perturbed P --json`: (exit code, report).
fn compare(dir: &Path, run: &str) -> (i32, Value) {
    compare_with(dir, "ref", "ref-perturbed", run)
}

/// `ttrace compare REFERENCE RUN --perturbed PERTURBED --json`: (exit code, report).
fn compare_with(dir: &Path, reference: &str, perturbed: &str, run: &str) -> (i32, Value) {
    let json = dir.join(format!("{run}-vs-{perturbed}.json"));
    let out = Command::new(bin("ttrace"))
        .arg("compare")
        .arg(dir.join(reference))
        .arg(dir.join(run))
        .arg("--perturbed")
        .arg(dir.join(perturbed))
        .arg("--json")
        .arg(&json)
        .output()
        .expect("ttrace compare");
    let code = out.status.code().unwrap_or(-1);
    assert!(
        code == 0 || code == 1,
        "compare {run} exited {code}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report = serde_json::from_slice(&std::fs::read(&json).expect("report")).expect("json");
    (code, report)
}

/// `ttrace ls --json STORE`: per rank, (records, gaps, steps).
fn summary(store: &Path) -> Vec<(u64, u64, Value)> {
    let out = Command::new(bin("ttrace"))
        .arg("ls")
        .arg(store)
        .arg("--json")
        .output()
        .expect("ttrace ls");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("ls json");
    v["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| {
            let n = |k: &str| r[k].as_u64().unwrap_or(u64::MAX);
            (n("records"), n("gaps"), r["steps"].clone())
        })
        .collect()
}

#[test]
fn a_graphed_run_compares_like_the_eager_one_and_a_bug_in_a_graphed_layer_is_found() {
    let dir = TempDir::new("compare-graphed");
    let d = &dir.0;
    trace(&d.join("ref"), 1, &[], false);
    trace(&d.join("ref-perturbed"), 1, &[], true);
    let layout = ["--tp", "2", "--dp", "2"];
    let bug = ["--bug", "tp-row-parallel-no-reduce"];
    let graphed = ["--cuda-graph"];
    trace(&d.join("eager"), 4, &layout, false);
    trace(
        &d.join("graphed"),
        4,
        &[&layout[..], &graphed].concat(),
        false,
    );
    trace(
        &d.join("eager-bug"),
        4,
        &[&layout[..], &bug].concat(),
        false,
    );
    trace(
        &d.join("graphed-bug"),
        4,
        &[&layout[..], &bug, &graphed].concat(),
        false,
    );

    // The replays hold what the eager run holds: same records, no gap.
    let (e, g) = (summary(&d.join("eager")), summary(&d.join("graphed")));
    assert_eq!(g.len(), 4);
    assert_eq!(g, e, "per rank (records, gaps, steps): graphed vs eager");
    assert!(g.iter().all(|(_, gaps, _)| *gaps == 0), "{g:?}");

    // `ttrace check` (no reference) reads the replays like eager records.
    let check = |run: &str| {
        let out = Command::new(bin("ttrace"))
            .arg("check")
            .arg(d.join(run))
            .output()
            .expect("ttrace check");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (eager_check, graphed_check) = (check("eager"), check("graphed"));
    assert_eq!(eager_check.0, Some(0), "{}", eager_check.1);
    assert_eq!(graphed_check.0, Some(0), "{}", graphed_check.1);

    let (code, report) = compare(d, "graphed");
    assert_eq!(
        code, 0,
        "bug-free graphed run: {}",
        report["first_divergence"]
    );
    // An eager twin perturbed every GEMM: its drift is the measurement, no step term.
    assert!(twin_warning(&report).is_none(), "{}", report["warnings"]);
    let growths = step_growths(&report);
    assert!(growths.iter().all(|&g| g == 1.0), "{growths:?}");
    // A twin without the last step (ran fewer steps under the same command line, or died):
    // there the drift is modelled.
    let short = d.join("short-perturbed");
    copy_dir(&d.join("ref-perturbed"), &short);
    for rank in std::fs::read_dir(&short).expect("store").flatten() {
        for f in std::fs::read_dir(rank.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if f.file_name().to_string_lossy().starts_with("step000002.") {
                std::fs::remove_file(f.path()).expect("remove step 2");
            }
        }
    }
    let (code, report) = compare_with(d, "ref", "short-perturbed", "graphed");
    assert_eq!(code, 0, "{}", report["first_divergence"]);
    let named = warning(&report, "holds no records of 1 reference step(s) (2)");
    assert!(named.is_some(), "{}", report["warnings"]);
    let expected = (3f64.sqrt() * 1e9).round() / 1e9;
    let growths = step_growths(&report);
    assert!(growths.iter().all(|&g| g == expected), "{growths:?}");

    let (ecode, ereport) = compare(d, "eager-bug");
    let (gcode, greport) = compare(d, "graphed-bug");
    assert_eq!(ecode, 1);
    assert_eq!(gcode, 1, "the bug inside the graphed layer is found");
    let pos = |r: &Value| {
        r["first_divergence"]["position"]
            .as_str()
            .map(str::to_string)
    };
    assert!(pos(&greport).is_some(), "{}", greport["first_divergence"]);
    assert_eq!(
        pos(&greport),
        pos(&ereport),
        "found at the same op as eagerly"
    );
}

/// The report's warning that the perturbed reference left GEMM outputs unperturbed.
fn twin_warning(report: &Value) -> Option<String> {
    warning(report, "the perturbed reference left")
}

/// The report's warning that says `text`, if any.
fn warning(report: &Value, text: &str) -> Option<String> {
    report["warnings"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find(|w| w.contains(text))
        .map(str::to_string)
}

/// For each reference operand (A or B: no increment's cancellation, no inputs' errors) of
/// step 2 whose tolerance is the analytic bound alone, its
/// tolerance over that of the same tensor (reference seq and role) in step 1 (at least one;
/// step 0 also holds the first uploads, so its seqs are others).
fn step_growths(report: &Value) -> Vec<f64> {
    let tensors = report["tensors"].as_array().expect("tensors");
    let key = |t: &Value| {
        (
            t["ref_seq"].as_u64(),
            t["role"].as_str().map(str::to_string),
        )
    };
    let analytic =
        |t: &&Value| t["tolerance_source"] == "analytic" && (t["role"] == "A" || t["role"] == "B");
    let growths: Vec<f64> = tensors
        .iter()
        .filter(|t| t["step"] == 2)
        .filter(analytic)
        .filter_map(|t| {
            let first = tensors
                .iter()
                .filter(|f| f["step"] == 1)
                .filter(analytic)
                .find(|f| key(f) == key(t))?;
            Some(t["tolerance_eps"].as_f64()? / first["tolerance_eps"].as_f64()?)
        })
        .map(|g| (g * 1e9).round() / 1e9)
        .collect();
    assert!(
        !growths.is_empty(),
        "no analytic tolerance in steps 1 and 2"
    );
    growths
}

#[test]
fn a_graphed_twin_is_perturbed_at_every_replay_and_an_unperturbed_one_is_found() {
    let dir = TempDir::new("compare-graphed-twin");
    let d = &dir.0;
    let graphed = ["--cuda-graph"];
    trace(&d.join("gref"), 1, &graphed, false);
    trace(&d.join("gref-perturbed"), 1, &graphed, true);
    trace(&d.join("run"), 2, &["--tp", "2", "--cuda-graph"], false);
    // The twin's GEMMs replay from its graph, perturbed: its drift is the measurement.
    let (code, report) = compare_with(d, "gref", "gref-perturbed", "run");
    assert_eq!(code, 0, "bug-free: {}", report["first_divergence"]);
    assert!(twin_warning(&report).is_none(), "{}", report["warnings"]);
    let growths = step_growths(&report);
    assert!(growths.iter().all(|&g| g == 1.0), "{growths:?}");

    // A twin that is the reference bit for bit (unperturbed replays, as before graphs were
    // perturbed, or the wrong store given): found in the data, the drift modelled.
    copy_dir(&d.join("gref"), &d.join("copy"));
    let (code, report) = compare_with(d, "gref", "copy", "run");
    assert_eq!(code, 0, "bug-free: {}", report["first_divergence"]);
    let w = twin_warning(&report).expect("the report says the twin was not perturbed");
    let counts: Vec<u64> = w
        .split(' ')
        .skip_while(|&x| x != "left")
        .take(4)
        .filter_map(|x| x.parse().ok())
        .collect();
    assert!(
        counts.len() == 2 && counts[0] == counts[1] && counts[0] > 0,
        "every GEMM output left alone: {w}"
    );
    assert!(w.contains("the first in step 0"), "{w}");
    let said = warning(&report, "was not run with ttrace run --perturb");
    assert!(said.is_some(), "{}", report["warnings"]);
    // So the drift over the steps is modelled, as without a twin: sqrt(1 + step).
    let expected = ((3f64 / 2.0).sqrt() * 1e9).round() / 1e9;
    let growths = step_growths(&report);
    assert!(growths.iter().all(|&g| g == expected), "{growths:?}");
}

/// Under sequence parallelism the graphed passes all-gather and reduce-scatter on the
/// tensor-parallel communicator, and the optimizer all-reduces the norms' gradients on it
/// eagerly right after each launch. Graphed collectives take their places in the
/// communicator's order at the launch call, so the eager ones issued after it run after
/// them (they took earlier places while the replay was still queued: the run hung).
#[test]
fn a_graphed_sequence_parallel_run_shares_its_communicator_with_eager_collectives() {
    let dir = TempDir::new("compare-graphed-sp");
    let d = &dir.0;
    trace(&d.join("ref"), 1, &[], false);
    trace(&d.join("ref-perturbed"), 1, &[], true);
    trace(
        &d.join("run"),
        2,
        &["--tp", "2", "--sp", "--cuda-graph"],
        false,
    );
    let check = Command::new(bin("ttrace"))
        .arg("check")
        .arg(d.join("run"))
        .output()
        .expect("ttrace check");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let (code, report) = compare(d, "run");
    assert_eq!(code, 0, "bug-free: {}", report["first_divergence"]);
}
