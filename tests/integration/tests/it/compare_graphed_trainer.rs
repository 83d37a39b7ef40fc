//! `ttrace run` and `ttrace compare` on a trainer whose forward and backward passes are
//! replayed from a CUDA graph (`trainer --cuda-graph`: captured once, launched every step):
//! the graphed run holds the same records as the eager run of the same layout, passes
//! `ttrace check`, compares MATCH against an eager single-device reference, and a bug inside a
//! graphed layer is found at the same op as in the eager run.

use std::path::Path;
use std::process::Command;

use integration_tests::{bin, trace_trainer, TempDir};
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
    let json = dir.join(format!("{run}.json"));
    let out = Command::new(bin("ttrace"))
        .arg("compare")
        .arg(dir.join("ref"))
        .arg(dir.join(run))
        .arg("--perturbed")
        .arg(dir.join("ref-perturbed"))
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
