//! `ttrace compare` uses every core (tensors decoded ahead in parallel,
//! blocked parallel sums, parallel placement screening) and its report does not depend on
//! it. One thread, the default pool, an odd pool of three, and a memory budget so small that
//! tensors are decoded a few ops at a time, segments are closed and the records' metadata is
//! dropped and read again as the walk goes, all give the same JSON report (every number, the
//! verdict, the first divergence), the same text and the same exit status; so does the library called from a thread of a caller's
//! own one-thread pool. A comparison far larger than its budget spills its results to a
//! temporary file and reports the same as one that holds them.
//!
//! The run is tp=2 dp=2 in BF16 with a row-parallel reduction left out (a divergence in step
//! 0), over 3 steps with a perturbed reference: placements, partial sums, data-parallel
//! reductions and their scale decided from the weight updates are all exercised.

use std::path::Path;
use std::process::{Command, Output};

use integration_tests::{bin, trace_trainer, TempDir};
use serde_json::Value;

const MODEL: &[&str] = &[
    "--precision",
    "bf16",
    "--layers",
    "2",
    "--micro-batches",
    "2",
    "--steps",
    "3",
];

/// `ttrace compare` of the stores in `root` with `threads` rayon threads (`None`: the
/// default) and `--memory` when given; the report is written to `json`.
fn compare(root: &Path, threads: Option<usize>, memory: Option<&str>, json: &Path) -> Output {
    let mut cmd = Command::new(bin("ttrace"));
    cmd.arg("compare")
        .arg(root.join("ref"))
        .arg(root.join("run"))
        .arg("--perturbed")
        .arg(root.join("ref-perturbed"))
        .arg("--json")
        .arg(json);
    if let Some(m) = memory {
        cmd.args(["--memory", m]);
    }
    match threads {
        Some(n) => cmd.env("RAYON_NUM_THREADS", n.to_string()),
        None => cmd.env_remove("RAYON_NUM_THREADS"),
    };
    cmd.env("TTRACE_LOG", "ttrace_compare::engine=debug");
    cmd.output().expect("run ttrace compare")
}

/// The report without what measures the machine (elapsed time).
fn report(json: &Path) -> Value {
    let mut v: Value =
        serde_json::from_slice(&std::fs::read(json).expect("report written")).expect("JSON");
    if let Some(stats) = v.get_mut("stats").and_then(Value::as_object_mut) {
        stats.remove("elapsed_s");
    }
    v
}

/// The text without the line that says how long it took.
fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.starts_with("compared "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_report_is_the_same_whatever_the_threads_and_the_memory_budget() {
    let dir = TempDir::new("compare-threads");
    let root = dir.0.clone();
    trace_trainer(&root.join("ref"), 1, false, MODEL);
    trace_trainer(&root.join("ref-perturbed"), 1, true, MODEL);
    let layout = [
        "--tp",
        "2",
        "--dp",
        "2",
        "--bug",
        "tp-row-parallel-no-reduce",
    ];
    trace_trainer(&root.join("run"), 4, false, &[MODEL, &layout].concat());

    let base_json = root.join("default.json");
    let base = compare(&root, None, None, &base_json);
    assert_eq!(
        base.status.code(),
        Some(1),
        "the bug is a divergence: {}",
        String::from_utf8_lossy(&base.stderr)
    );
    let want = report(&base_json);
    assert_eq!(want["verdict"], "divergence");
    assert!(
        want["first_divergence"].is_object(),
        "a first divergence is reported: {want}"
    );
    let compared = want["stats"]["tensors_compared"].as_u64().unwrap_or(0);
    assert!(compared > 100, "{compared} tensors compared");

    for (threads, memory) in [(Some(1), None), (Some(3), None), (None, Some("16M"))] {
        let json = root.join(format!("t{threads:?}-m{memory:?}.json"));
        let got = compare(&root, threads, memory, &json);
        if memory.is_some() {
            // The records' metadata did not fit its share of the budget: records dropped
            // were read again (said in the debug log), and the report is still the same.
            let log = String::from_utf8_lossy(&got.stderr);
            let reread = log
                .lines()
                .find(|l| l.contains("records were read again"))
                .unwrap_or_else(|| panic!("no metadata line in the debug log: {log}"));
            assert!(
                !reread.contains("run=0 "),
                "the run's records fit the budget, nothing read again: {reread}"
            );
        }
        let what = format!("RAYON_NUM_THREADS={threads:?} --memory {memory:?}");
        assert_eq!(got.status.code(), base.status.code(), "{what}: exit status");
        assert_eq!(text(&got), text(&base), "{what}: text report");
        // Equal as JSON values: every number to the last bit (they print exactly).
        assert!(report(&json) == want, "{what}: the JSON report differs");
    }

    // Called from a thread of a caller's own one-thread pool, compare runs there (its
    // decoding ahead on its own pool, never on the caller's, which would wait for itself):
    // the same report, no deadlock.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a pool");
    let opts = ttrace_compare::CompareOptions {
        perturbed: Some(root.join("ref-perturbed")),
        ..Default::default()
    };
    let lib = pool
        .install(|| {
            ttrace_compare::compare(&root.join("ref"), &root.join("run"), &opts, &mut |_, _| {})
        })
        .expect("compares");
    let mut got = serde_json::to_value(&lib).expect("serializes");
    if let Some(stats) = got.get_mut("stats").and_then(Value::as_object_mut) {
        stats.remove("elapsed_s");
    }
    assert!(got == want, "inside a one-thread pool: the report differs");
}

/// The JSON report (without its elapsed time), the text (without its timing line) and the
/// HTML page (without the line that says how long it took) of `ttrace compare` over the
/// stores in `root`, under `--memory` when given, with its debug log.
fn reports(root: &Path, memory: Option<&str>, name: &str) -> (Value, String, String, String) {
    reports_in(root, memory, name, None)
}

/// [`reports`], with `TMPDIR` (where results are spilled) set to `tmpdir` when given.
fn reports_in(
    root: &Path,
    memory: Option<&str>,
    name: &str,
    tmpdir: Option<&Path>,
) -> (Value, String, String, String) {
    let json = root.join(format!("{name}.json"));
    let html = root.join(format!("{name}.html"));
    let mut cmd = Command::new(bin("ttrace"));
    cmd.arg("compare")
        .arg(root.join("ref"))
        .arg(root.join("run"))
        .arg("--json")
        .arg(&json)
        .arg("--html")
        .arg(&html)
        .env("TTRACE_LOG", "warn,ttrace_compare::engine=debug");
    if let Some(m) = memory {
        cmd.args(["--memory", m]);
    }
    if let Some(t) = tmpdir {
        cmd.env("TMPDIR", t);
    }
    let out = cmd.output().expect("run ttrace compare");
    assert_eq!(
        out.status.code(),
        Some(1),
        "a divergence: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = std::fs::read_to_string(&html).expect("the page written");
    let page = page
        .lines()
        .filter(|l| !l.contains("class=\"counts\""))
        .map(|l| {
            // The embedded report's elapsed time.
            match l.find("\"elapsed_s\":") {
                Some(i) => l[..i].to_string(),
                None => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    (
        report(&json),
        text(&out),
        page,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A comparison of many records and tensors (a small model over 12 steps, tp=2 dp=2 pp=2)
/// under a budget far below what its records' metadata and its results take: the metadata is
/// dropped and read again, the results are spilled to a temporary file as the walk goes and
/// read back for the report; the JSON report, the text and the HTML page are the same as
/// with everything held (the default budget), the divergence localized the same.
#[test]
fn a_comparison_larger_than_its_budget_spills_its_results_and_reports_the_same() {
    let dir = TempDir::new("compare-spill");
    let root = dir.0.clone();
    let small = [
        "--precision",
        "bf16",
        "--micro-batches",
        "2",
        "--hidden",
        "32",
        "--vocab",
        "64",
        "--seq",
        "16",
        "--steps",
        "12",
    ];
    trace_trainer(&root.join("ref"), 1, false, &small);
    let layout = [
        "--tp",
        "2",
        "--dp",
        "2",
        "--pp",
        "2",
        "--bug",
        "tp-row-parallel-no-reduce",
    ];
    trace_trainer(&root.join("run"), 8, false, &[&small[..], &layout].concat());

    let (want, want_text, want_page, log) = reports(&root, None, "default");
    assert!(
        log.contains("spilled=false"),
        "the default budget holds the results: {log}"
    );
    assert!(want["first_divergence"].is_object(), "{want}");
    let compared = want["stats"]["tensors_compared"].as_u64().unwrap_or(0);
    assert!(compared > 3000, "{compared} tensors compared");

    let (got, got_text, got_page, log) = reports(&root, Some("16M"), "tight");
    assert!(
        log.contains("spilled=true"),
        "the results were not spilled under 16M: {log}"
    );
    let reread = log
        .lines()
        .find(|l| l.contains("records were read again"))
        .unwrap_or_else(|| panic!("no metadata line in the debug log: {log}"));
    assert!(!reread.contains("run=0 "), "nothing read again: {reread}");
    assert!(got == want, "the JSON report differs under 16M");
    assert_eq!(got_text, want_text, "the text differs under 16M");
    assert_eq!(got_page, want_page, "the HTML page differs under 16M");

    // No temporary file can be made: nothing is lost, the results are held in memory and a
    // warning says so.
    let nowhere = root.join("no-such-dir");
    let (got, got_text, _, log) = reports_in(&root, Some("16M"), "no-tmp", Some(&nowhere));
    assert!(
        log.contains("could not be written to a temporary file"),
        "no warning: {log}"
    );
    assert!(log.contains("spilled=false"), "{log}");
    assert!(got == want, "the JSON report differs without a TMPDIR");
    assert_eq!(got_text, want_text, "the text differs without a TMPDIR");
}
