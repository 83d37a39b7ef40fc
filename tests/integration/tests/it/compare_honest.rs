//! `ttrace compare` on situations our own fixture does not produce by itself, and
//! honesty when it cannot judge.
//!
//! * A tensor-parallel partial-sum all-reduce done with `ncclAvg` is a LOCAL divergence at
//!   that collective (the average is not a legal gradient scale).
//! * Bug-free runs captured with `ttrace run --ranks`, `--apis gemm`, `--steps`,
//!   `--no-inputs`, or missing ranks, never DIVERGE: what cannot be judged is listed as not
//!   comparable, or the command exits 2 saying why; a bug in such a capture is still caught.
//! * Stores that cannot be compared exit 2 with one line naming the difference: REF and RUN
//!   swapped, different models (either order), different precisions, a `--perturbed` of
//!   another precision, world size, model or command, a `--layout` the communicators
//!   contradict; `--steps` ranges are filters; a missing store is named once.
//! * A long bug-free run without `--perturbed` stays quiet; a bug in it is still caught.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use integration_tests::{bin, ttrace_run, TempDir};
use serde_json::Value;

/// Traces `trainer args` with `ttrace run OPTS` (under simrun when `nproc` > 1).
fn trace<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(
    store: &Path,
    nproc: usize,
    opts: &[&str],
    args: &[S],
) {
    let mut cmd = ttrace_run(store);
    cmd.args(opts).arg("--");
    if nproc > 1 {
        cmd.arg(bin("simrun"))
            .args(["--nproc-per-node", &nproc.to_string(), "--"]);
    }
    let out = cmd
        .arg(bin("trainer"))
        .args(args)
        .output()
        .expect("ttrace run");
    assert!(
        out.status.success(),
        "ttrace run {opts:?} -- trainer {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const MODEL: &[&str] = &[
    "--precision",
    "bf16",
    "--micro-batches",
    "2",
    "--steps",
    "3",
];

fn with(extra: &[&str]) -> Vec<String> {
    MODEL.iter().chain(extra).map(|s| s.to_string()).collect()
}

/// The shared stores: a BF16 reference, its perturbed twin, and a few other runs.
struct Stores {
    _dir: TempDir,
    root: PathBuf,
}

impl Stores {
    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

fn stores() -> &'static Stores {
    static S: OnceLock<Stores> = OnceLock::new();
    S.get_or_init(|| {
        let dir = TempDir::new("compare-honest");
        let root = dir.0.clone();
        trace(&root.join("ref"), 1, &[], MODEL);
        trace(&root.join("ref-perturbed"), 1, &["--perturb"], MODEL);
        trace(
            &root.join("tp2dp2"),
            4,
            &[],
            &with(&["--tp", "2", "--dp", "2"]),
        );
        Stores { _dir: dir, root }
    })
}

fn compare(args: &[&Path], extra: &[&str]) -> (Output, Option<Value>) {
    let dir = TempDir::new("compare-honest-json");
    let json = dir.0.join("r.json");
    let out = Command::new(bin("ttrace"))
        .arg("compare")
        .args(args)
        .args(extra)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("ttrace compare");
    let report = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    (out, report)
}

/// `ttrace check STORE`.
fn check(store: &Path) -> Output {
    Command::new(bin("ttrace"))
        .arg("check")
        .arg(store)
        .output()
        .expect("ttrace check")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Exit 2 with one line on stderr that holds every one of `says`.
fn refused(o: &Output, says: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{}", text(o));
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    for s in says {
        assert!(err.contains(s), "{s:?} not in {err}");
    }
}

#[test]
fn a_tensor_parallel_partial_sum_averaged_is_local_at_the_collective() {
    let s = stores();
    let dir = TempDir::new("compare-avg");
    let run = dir.0.join("run");
    trace(
        &run,
        2,
        &[],
        &with(&["--tp", "2", "--bug", "tp-row-parallel-avg"]),
    );
    let (o, r) = compare(
        &[&s.path("ref"), &run],
        &[
            "--perturbed",
            s.path("ref-perturbed").to_str().expect("utf-8"),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r = r.expect("json");
    let d = &r["first_divergence"];
    let t = &r["tensors"][d["tensor"].as_u64().expect("index") as usize];
    assert_eq!(d["cause"], "local", "{}", text(&o));
    assert_eq!(t["api"], "ncclAllReduce", "{}", text(&o));
    assert_eq!(d["module"], "layers.1.attention.proj", "{}", text(&o));
    assert!(
        d["explanation"].as_str().unwrap_or("").contains("ncclAvg"),
        "{}",
        text(&o)
    );
}

#[test]
fn partial_captures_of_a_bug_free_run_never_diverge() {
    let s = stores();
    let dir = TempDir::new("compare-partial");
    let tp2dp2 = with(&["--tp", "2", "--dp", "2"]);
    let pert = s.path("ref-perturbed");
    let pert = ["--perturbed", pert.to_str().expect("utf-8")];
    for (name, opts, layout, not_comparable) in [
        ("ranks01", vec!["--ranks", "0,1"], None, true),
        ("ranks02", vec!["--ranks", "0,2"], None, true),
        ("gemm", vec!["--apis", "gemm"], Some("tp=2,dp=2"), false),
        ("steps", vec!["--steps", "1-2"], None, false),
        ("noinputs", vec!["--no-inputs"], None, true),
    ] {
        let run = dir.0.join(name);
        trace(&run, 4, &opts, &tp2dp2);
        let mut extra: Vec<&str> = pert.to_vec();
        if let Some(l) = layout {
            // Without collectives the layout cannot be read: exit 2 saying so.
            let (o, _) = compare(&[&s.path("ref"), &run], &extra);
            refused(&o, &["no collectives", "--layout"]);
            extra.extend(["--layout", l]);
        }
        let (o, r) = compare(&[&s.path("ref"), &run], &extra);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", text(&o));
        let r = r.expect("json");
        let (tp, dp) = (r["layout"]["tp"].as_u64(), r["layout"]["dp"].as_u64());
        assert_eq!((tp, dp), (Some(2), Some(2)), "{name}: {}", r["layout"]);
        let listed = r["not_comparable"]
            .as_array()
            .is_some_and(|a| !a.is_empty());
        assert_eq!(listed, not_comparable, "{name}: {}", text(&o));
        if listed {
            assert!(text(&o).contains("not comparable"), "{name}: {}", text(&o));
        }
    }
    // A bug in a partial capture is still caught.
    let run = dir.0.join("bug");
    trace(
        &run,
        4,
        &["--ranks", "0,1"],
        &with(&["--tp", "2", "--dp", "2", "--bug", "tp-column-shard-offset"]),
    );
    let (o, r) = compare(&[&s.path("ref"), &run], &pert);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let d = &r.expect("json")["first_divergence"];
    assert_eq!(d["module"], "layers.0.mlp.fc1", "{}", text(&o));
}

/// Nothing is lost silently: a bug-free run whose capture lost tensors (a snapshot copy the
/// runtime refused in each process) still matches in what was captured, but compare says what
/// was lost under the verdict and exits 5, never 0; `ttrace check` the same. The complete
/// capture of the same run exits 0.
#[test]
fn a_match_of_a_capture_that_lost_data_is_never_clean() {
    let s = stores();
    let dir = TempDir::new("compare-lossy");
    let run = dir.0.join("run");
    let out = ttrace_run(&run)
        .env("SIM_CUDA_REFUSE_REGISTERED_COPY", "40")
        .arg("--")
        .arg(bin("simrun"))
        .args(["--nproc-per-node", "2", "--"])
        .arg(bin("trainer"))
        .args(with(&["--tp", "2"]))
        .output()
        .expect("ttrace run");
    assert!(out.status.success(), "{}", text(&out));
    let pert = s.path("ref-perturbed");
    let perturbed = ["--perturbed", pert.to_str().expect("utf-8")];
    let (o, r) = compare(&[&s.path("ref"), &run], &perturbed);
    assert_eq!(o.status.code(), Some(5), "{}", text(&o));
    let r = r.expect("a JSON report");
    assert_eq!(r["verdict"], "match", "{}", text(&o));
    let losses = r["capture_losses"].as_array().expect("capture_losses");
    assert_eq!(losses.len(), 1, "{losses:?}");
    assert_eq!(losses[0]["store"], "run");
    assert_eq!(losses[0]["gaps"]["copy_refused"], 2, "one per process");
    assert!(text(&o).contains("INCOMPLETE CAPTURE"), "{}", text(&o));
    let c = check(&run);
    assert_eq!(c.status.code(), Some(5), "{}", text(&c));
    assert!(
        text(&c).contains("INCOMPLETE CAPTURE: 2 gaps (copy_refused 2"),
        "{}",
        text(&c)
    );
    // The same run captured whole is clean.
    let (o, r) = compare(&[&s.path("ref"), &s.path("tp2dp2")], &perturbed);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(
        r.expect("a JSON report")["capture_losses"],
        serde_json::json!([])
    );
}

#[test]
fn a_store_missing_ranks_is_not_a_divergence() {
    let s = stores();
    let dir = TempDir::new("compare-missing");
    let run = dir.0.join("run");
    trace(&run, 4, &[], &with(&["--tp", "2", "--dp", "2"]));
    std::fs::remove_dir_all(run.join("rank00003")).expect("remove rank 3");
    let (o, _) = compare(&[&s.path("ref"), &run], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("not comparable"), "{}", text(&o));
    // check: no findings made of the missing rank, and it says what it did not check.
    let c = check(&run);
    assert_eq!(c.status.code(), Some(0), "{}", text(&c));
    assert!(text(&c).contains("ranks [3]"), "{}", text(&c));
    // ls: the missing rank is not shown as clean.
    let l = Command::new(bin("ttrace"))
        .arg("ls")
        .arg(&run)
        .output()
        .expect("ttrace ls");
    let row = String::from_utf8_lossy(&l.stdout)
        .lines()
        .find(|l| l.starts_with("3 "))
        .map(str::to_string)
        .unwrap_or_default();
    assert!(row.contains("missing") && !row.contains("clean"), "{row}");
}

#[test]
fn check_and_ls_are_honest_about_a_pipeline_rank_not_captured() {
    let dir = TempDir::new("check-pp-ranks");
    let run = dir.0.join("run");
    trace(
        &run,
        4,
        &["--ranks", "0-2"],
        &with(&["--pp", "2", "--dp", "2"]),
    );
    let c = check(&run);
    // Rank 3's sends and receives are not captured: not a send/recv finding.
    assert_eq!(c.status.code(), Some(0), "{}", text(&c));
    assert!(text(&c).contains("no finding"), "{}", text(&c));
    assert!(text(&c).contains("not checked: ranks [3]"), "{}", text(&c));
    let l = Command::new(bin("ttrace"))
        .arg("ls")
        .arg(&run)
        .output()
        .expect("ttrace ls");
    let out = String::from_utf8_lossy(&l.stdout);
    assert!(
        out.lines()
            .any(|l| l.starts_with("3 ") && l.contains("not captured")),
        "{out}"
    );
}

#[test]
fn stores_that_cannot_be_compared_exit_2_naming_the_difference() {
    let s = stores();
    let dir = TempDir::new("compare-invalid");
    let (reff, pert, tp2dp2) = (s.path("ref"), s.path("ref-perturbed"), s.path("tp2dp2"));
    let layers3 = dir.0.join("layers3");
    trace(&layers3, 1, &[], &with(&["--layers", "3"]));
    let fp32 = dir.0.join("fp32");
    trace(
        &fp32,
        1,
        &[],
        &[
            "--precision",
            "fp32",
            "--micro-batches",
            "2",
            "--steps",
            "3",
        ],
    );
    let seed = dir.0.join("seed");
    trace(&seed, 1, &["--perturb"], &with(&["--seed", "9"]));

    let (o, _) = compare(&[&tp2dp2, &reff], &[]);
    refused(&o, &["swapped"]);
    for (a, b) in [(&reff, &layers3), (&layers3, &reff)] {
        let (o, _) = compare(&[a, b], &[]);
        refused(&o, &["different models"]);
    }
    let (o, _) = compare(&[&reff, &fp32], &[]);
    refused(&o, &["bf16", "fp32", "precision"]);
    let p = |x: &Path| ["--perturbed".to_string(), x.display().to_string()];
    for (other, says) in [
        (&fp32, "fp32"),
        (&tp2dp2, "ranks"),
        (&layers3, "another model"),
        (&seed, "--seed"),
    ] {
        let args = p(other);
        let (o, _) = compare(&[&reff, &tp2dp2], &[&args[0], &args[1]]);
        refused(&o, &["--perturbed", says]);
    }
    let (o, _) = compare(&[&reff, &tp2dp2], &["--layout", "tp=4,dp=1"]);
    refused(&o, &["--layout", "tp=4", "tp=2"]);
    let (o, _) = compare(&[&reff, &tp2dp2], &["--layout", "tp=2,dp=4"]);
    refused(&o, &["8 ranks", "4"]);
    // Ranges are filters on the steps the stores hold.
    for steps in ["0-18446744073709551615", "0-4000000000"] {
        let args = p(&pert);
        let (o, r) = compare(&[&reff, &tp2dp2], &["--steps", steps, &args[0], &args[1]]);
        assert_eq!(o.status.code(), Some(0), "{steps}: {}", text(&o));
        assert_eq!(r.expect("json")["steps"], serde_json::json!([0, 1, 2]));
    }
    let (o, _) = compare(&[&reff, &tp2dp2], &["--steps", "7"]);
    refused(&o, &["step 7"]);
    // A missing store is named once.
    let missing = dir.0.join("no-such-store");
    let (o, _) = compare(&[&missing, &tp2dp2], &[]);
    refused(&o, &["no-such-store"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("no-such-store").count(), 1, "{err}");
}

#[test]
fn control_characters_in_names_are_escaped() {
    let s = stores();
    let dir = TempDir::new("compare-escape");
    let evil = dir.0.join("run\u{1b}[2J\u{1b}]0;title\u{7}");
    std::fs::create_dir_all(&evil).expect("mkdir");
    // A copy of a store under a name that would clear the screen and set the title.
    let cp = Command::new("cp")
        .arg("-r")
        .arg(s.path("tp2dp2"))
        .arg(evil.join("store"))
        .status()
        .expect("cp");
    assert!(cp.success());
    let (o, _) = compare(&[&s.path("ref"), &evil.join("store")], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{out:?}");
    assert!(out.contains("\\u{1b}[2J"), "{out}");
}

/// A long run, small model: `steps` steps of one micro-batch.
fn long_model(precision: &str, layers: &str) -> Vec<String> {
    [
        "--precision",
        precision,
        "--layers",
        layers,
        "--hidden",
        "32",
        "--heads",
        "2",
        "--ffn",
        "64",
        "--seq",
        "8",
        "--vocab",
        "32",
        "--micro-batches",
        "1",
        "--steps",
        "300",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn three_hundred_bug_free_steps_without_a_perturbed_reference_stay_quiet() {
    for (precision, layers) in [("fp32", "2"), ("bf16", "1")] {
        let dir = TempDir::new("compare-long");
        let m = long_model(precision, layers);
        let reff = dir.0.join("ref");
        trace(&reff, 1, &[], &m);
        let run = dir.0.join("run");
        let mut args = m.clone();
        args.extend(["--tp".to_string(), "2".to_string()]);
        trace(&run, 2, &[], &args);
        let (o, r) = compare(&[&reff, &run], &[]);
        assert_eq!(o.status.code(), Some(0), "{precision}: {}", text(&o));
        assert_eq!(
            r.expect("json")["steps"].as_array().map(Vec::len),
            Some(300)
        );
        // A bug in the same long run is still caught, where it is.
        let bug = dir.0.join("bug");
        args.extend([
            "--bug".to_string(),
            "attention-softmax-scale-local".to_string(),
        ]);
        trace(&bug, 2, &[], &args);
        let (o, r) = compare(&[&reff, &bug], &[]);
        assert_eq!(o.status.code(), Some(1), "{precision}: {}", text(&o));
        let d = &r.expect("json")["first_divergence"];
        assert_eq!(d["step"], 0, "{}", text(&o));
        let module = d["module"].as_str().unwrap_or_default();
        assert!(module.ends_with("attention.core"), "{}", text(&o));
    }
}

#[test]
fn the_data_parallel_reduction_scale_is_an_explicit_option() {
    let s = stores();
    let pert = s.path("ref-perturbed");
    let pert = pert.to_str().expect("utf-8");
    // Decided from the data: the trainer's Adam updates do not follow the gradient's scale,
    // so its data-parallel reduction is held to the reference's gradient.
    let (o, r) = compare(&[&s.path("ref"), &s.path("tp2dp2")], &["--perturbed", pert]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let d = &r.expect("json")["dp_reduction"];
    assert_eq!(d["basis"], "scale_invariant_updates", "{d}");
    assert_eq!(d["scale"], 1.0, "{d}");
    // The fixture averages mean-loss gradients: declared as summed (`dp`), its reduction is
    // half of what is declared, and said so at that collective.
    let (o, r) = compare(
        &[&s.path("ref"), &s.path("tp2dp2")],
        &["--perturbed", pert, "--dp-reduction-scale", "dp"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let d = &r.expect("json")["first_divergence"];
    assert_eq!(d["module"], "ddp.bucket0", "{}", text(&o));
    let (o, _) = compare(
        &[&s.path("ref"), &s.path("tp2dp2")],
        &["--dp-reduction-scale", "many"],
    );
    refused(&o, &["--dp-reduction-scale"]);
}
