//! `ttrace compare` on real PyTorch: tests/torch/megatron.py, a Megatron-style tensor + data
//! parallel model in plain torch.distributed (sequence-parallel all-gather and reduce-scatter,
//! column- and row-parallel F.linear, the row-parallel all-reduce, data-parallel gradient
//! sums), traced by `ttrace run` on the simulated stack: a world-1 reference (and its
//! `--perturb` twin, for tolerances) against `torchrun --nproc-per-node 4` (tp=2 dp=2).
//!
//! Asserted, in FP32 and BF16: the bug-free run compares clean (exit 0); every injected bug is
//! a divergence (exit 1) whose first tensor beyond tolerance is the op (and role, step, cause)
//! where the bug shows first and the ranks it lives on; every store holds one step per
//! training iteration on every rank (the `auto` step rule on fresh torch allocations, with two
//! micro-batches of gradient accumulation per step). Each
//! precision is one test; its reference is shared by its cases. torch 2.15 (CUDA 13) runs the
//! bug-free case and three bugs in BF16. Skips (passing, with a SKIP
//! line) without the torch venv. The detection matrix is printed (`--nocapture`) and written
//! down in docs/compare.md.

use crate::torch_util;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use integration_tests::{bin, describe, TempDir};
use serde_json::Value;
use torch_util::{find, Torch};
use ttrace_format::reader::Store;
use ttrace_format::record::Op;

/// Training iterations of every run.
const STEPS: u64 = 3;

/// Micro-batches per step (weight gradients accumulate): a micro-batch is not a step.
const MICRO_BATCHES: usize = 2;

/// The model's GEMMs in the order one micro-batch runs them (tests/torch/megatron.py).
const GEMMS: [&str; 11] = [
    "fc1.fwd",
    "fc2.fwd",
    "fc3.fwd",
    "fc4.fwd",
    "fc4.wgrad",
    "fc4.dgrad",
    "fc3.wgrad",
    "fc3.dgrad",
    "fc2.wgrad",
    "fc2.dgrad",
    "fc1.wgrad",
];

/// Where a bug must be found: the first tensor beyond tolerance.
struct Expect {
    bug: &'static str,
    step: u64,
    /// The reference op: a GEMM of [`GEMMS`], or `ncclAllReduce` (compared through the GEMM it
    /// reduces, `reduces`).
    op: &'static str,
    role: &'static str,
    cause: &'static str,
    /// The op this divergence is compared through or lies after: for a collective, the GEMM
    /// it reduces; for an upstream cause, the last good tensor's op (`None`: not asserted).
    after: Option<&'static str>,
    /// The rank sets that may hold it (the bug's ranks).
    ranks: &'static [&'static [u32]],
}

const ALL: &[u32] = &[0, 1, 2, 3];

const BUGS: &[Expect] = &[
    // fc4's partial sums are never summed: the output and so the loss gradient are wrong; the
    // bug lies between fc4's (correct, partial) output and the backward's first GEMM.
    Expect {
        bug: "no-row-allreduce",
        step: 0,
        op: "fc4.wgrad",
        role: "B",
        cause: "upstream",
        after: Some("fc4.fwd"),
        ranks: &[ALL],
    },
    Expect {
        bug: "neighbour-shard",
        step: 0,
        op: "fc1.fwd",
        role: "A",
        cause: "upstream",
        after: None,
        ranks: &[&[1]],
    },
    // Both TP groups average; either may be reported first.
    Expect {
        bug: "avg-not-sum",
        step: 0,
        op: "ncclAllReduce",
        role: "Output",
        cause: "local",
        after: Some("fc4.fwd"),
        ranks: &[&[0, 1], &[2, 3]],
    },
    Expect {
        bug: "grad-scaled-twice",
        step: 0,
        op: "fc4.wgrad",
        role: "B",
        cause: "upstream",
        after: None,
        ranks: &[ALL],
    },
    // fc4's weight gradient stays a per-replica partial: the next step's fc4 weights differ.
    Expect {
        bug: "no-dp-allreduce",
        step: 1,
        op: "fc4.fwd",
        role: "A",
        cause: "upstream",
        after: None,
        ranks: &[ALL],
    },
    // Rank 3 gathers the wrong token chunk: its TP group's block-1 input is wrong.
    Expect {
        bug: "wrong-sp-chunk",
        step: 0,
        op: "fc1.fwd",
        role: "B",
        cause: "upstream",
        after: None,
        ranks: &[&[2, 3]],
    },
];

fn paths(v: &[&str]) -> Vec<PathBuf> {
    v.iter().map(PathBuf::from).collect()
}

/// Runs the model under `ttrace run OPTIONS` (world 1 with python, or torchrun with 4 ranks).
fn trace(torch: &Torch, store: &Path, options: &[&str], world: u32, model: &[&str]) {
    let mut args = if world == 1 {
        Vec::new()
    } else {
        paths(&["--standalone", "--nproc-per-node=4"])
    };
    args.push(Torch::script("megatron.py"));
    args.extend(paths(model));
    let args: Vec<&Path> = args.iter().map(PathBuf::as_path).collect();
    let program = if world == 1 {
        &torch.python
    } else {
        &torch.torchrun
    };
    let out = torch.traced_with(store, options, program, &args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "ttrace run {options:?} megatron.py {model:?}: {}",
        describe(&out)
    );
}

/// Traced runs in flight at once: a run spends much of its time waiting (interpreter start-up,
/// rendezvous, the collector), so a few side by side shorten the test on two cores.
const PARALLEL_RUNS: usize = 3;

/// One traced run to make.
struct Job {
    store: PathBuf,
    options: Vec<&'static str>,
    world: u32,
    model: Vec<String>,
}

impl Job {
    fn new(store: &Path, options: &[&'static str], world: u32, model: &[&str]) -> Job {
        Job {
            store: store.to_path_buf(),
            options: options.to_vec(),
            world,
            model: model.iter().map(|a| a.to_string()).collect(),
        }
    }
}

/// Makes every run, `PARALLEL_RUNS` at a time.
fn trace_all(torch: &Torch, jobs: &[Job]) {
    for batch in jobs.chunks(PARALLEL_RUNS) {
        std::thread::scope(|s| {
            for j in batch {
                s.spawn(move || {
                    let model: Vec<&str> = j.model.iter().map(String::as_str).collect();
                    trace(torch, &j.store, &j.options, j.world, &model);
                });
            }
        });
    }
}

/// Every rank of `store` holds steps 0..STEPS, and the name of each reference GEMM by
/// (step, seq).
fn steps_and_gemms(store: &Path) -> BTreeMap<(u64, u64), &'static str> {
    steps_and_gemms_of(store, MICRO_BATCHES)
}

/// [`steps_and_gemms`] of a run made with `micro_batches` micro-batches per step.
fn steps_and_gemms_of(store: &Path, micro_batches: usize) -> BTreeMap<(u64, u64), &'static str> {
    let s = Store::open(store).expect("store opens");
    let mut names = BTreeMap::new();
    for rank in s.ranks() {
        assert_eq!(
            s.steps(rank),
            (0..STEPS).collect::<Vec<_>>(),
            "{} rank {rank}: one step per training iteration",
            store.display()
        );
        if rank != 0 {
            continue;
        }
        for step in 0..STEPS {
            let seg = s.open_segment(rank, step).expect("segment");
            let gemms: Vec<u64> = (0..seg.len())
                .map(|i| seg.read_meta(i).expect("record").record)
                .filter(|r| matches!(r.op, Op::Gemm(_)))
                .map(|r| r.seq)
                .collect();
            assert_eq!(
                gemms.len(),
                GEMMS.len() * micro_batches,
                "step {step}: GEMMs {gemms:?}"
            );
            for (seq, name) in gemms.into_iter().zip(GEMMS.iter().cycle()) {
                names.insert((step, seq), *name);
            }
        }
    }
    names
}

/// What `ttrace compare` said: its exit status and JSON report.
fn compare(reference: &Path, perturbed: &Path, run: &Path) -> (i32, Value) {
    let json = run.with_extension("json");
    let out = Command::new(bin("ttrace"))
        .arg("compare")
        .arg(reference)
        .arg(run)
        .arg("--perturbed")
        .arg(perturbed)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("ttrace compare runs");
    let code = out.status.code().unwrap_or(-1);
    assert!(code == 0 || code == 1, "ttrace compare: {}", describe(&out));
    let report = serde_json::from_slice(&std::fs::read(&json).expect("json report"))
        .expect("the report is JSON");
    (code, report)
}

/// The first divergence as the test names it.
#[derive(Debug)]
struct Found {
    step: u64,
    op: String,
    role: String,
    cause: String,
    after: Option<String>,
    ranks: Vec<u32>,
    margin: f64,
}

fn first_divergence(report: &Value, names: &BTreeMap<(u64, u64), &'static str>) -> Found {
    let fd = &report["first_divergence"];
    let tensors = report["tensors"].as_array().expect("tensors");
    let tensor = |i: &Value| &tensors[i.as_u64().expect("a tensor index") as usize];
    let name = |t: &Value| {
        let api = t["api"].as_str().expect("api");
        let key = (
            t["step"].as_u64().expect("step"),
            t["ref_seq"].as_u64().expect("ref_seq"),
        );
        if api.starts_with("nccl") {
            // A reduction is compared through the GEMM it reduces.
            return (api.to_string(), names.get(&key).map(|n| n.to_string()));
        }
        (names.get(&key).map_or("?", |n| n).to_string(), None)
    };
    let t = tensor(&fd["tensor"]);
    let (op, reduces) = name(t);
    let after = reduces.or_else(|| {
        (!fd["last_good"].is_null()).then(|| {
            let (op, _) = name(tensor(&fd["last_good"]));
            op
        })
    });
    Found {
        step: fd["step"].as_u64().expect("step"),
        op,
        role: t["role"].as_str().unwrap_or_default().to_string(),
        cause: fd["cause"].as_str().unwrap_or_default().to_string(),
        after,
        ranks: fd["ranks"]
            .as_array()
            .expect("ranks")
            .iter()
            .map(|r| r["rank"].as_u64().or(r.as_u64()).expect("rank") as u32)
            .collect(),
        margin: t["error_eps"].as_f64().unwrap_or(0.0) / t["tolerance_eps"].as_f64().unwrap_or(1.0),
    }
}

/// The largest error/tolerance of any compared tensor.
fn largest_margin(report: &Value) -> f64 {
    let tensors = report["tensors"].as_array().expect("tensors");
    tensors
        .iter()
        .filter_map(|t| Some(t["error_eps"].as_f64()? / t["tolerance_eps"].as_f64()?))
        .fold(0.0, f64::max)
}

/// The detection matrix of one torch version and precision, over the bugs `bugs` picks.
fn matrix(version: &'static str, precision: &str, bugs: impl Fn(&str) -> bool) {
    let Some(torch) = find(version) else { return };
    let start = std::time::Instant::now();
    let tmp = TempDir::new(&format!("torch-compare-{version}-{precision}"));
    let micro_batches = MICRO_BATCHES.to_string();
    let model = [
        "--precision",
        precision,
        "--steps",
        "3",
        "--micro-batches",
        &micro_batches,
    ];
    let (reference, perturbed) = (tmp.path().join("ref"), tmp.path().join("ref-perturbed"));
    let clean = tmp.path().join("clean");
    let picked: Vec<&Expect> = BUGS.iter().filter(|e| bugs(e.bug)).collect();
    let mut jobs = vec![
        Job::new(&reference, &[], 1, &model),
        Job::new(&perturbed, &["--perturb"], 1, &model),
        Job::new(&clean, &[], 4, &model),
    ];
    for e in &picked {
        let mut args = model.to_vec();
        args.extend(["--bug", e.bug]);
        jobs.push(Job::new(&tmp.path().join(e.bug), &[], 4, &args));
    }
    trace_all(&torch, &jobs);
    let names = steps_and_gemms(&reference);
    steps_and_gemms(&perturbed);
    steps_and_gemms(&clean);
    let (code, report) = compare(&reference, &perturbed, &clean);
    assert_eq!(
        code, 0,
        "torch {version} {precision}: false alarm on the bug-free run: {:#}",
        report["first_divergence"]
    );
    eprintln!(
        "MATRIX torch {version} {precision} bug-free: MATCH, largest error/tolerance {:.2}, \
         data-parallel reduction scale {}",
        largest_margin(&report),
        report["dp_reduction"]["detail"]
    );
    // The model sums gradients of a loss averaged over the global batch: its reduction
    // outputs the reference's gradient, decided from the data with no option.
    assert_eq!(
        report["dp_reduction"]["scale"], 1.0,
        "{}",
        report["dp_reduction"]
    );

    let mut failures = Vec::new();
    for e in &picked {
        let run = tmp.path().join(e.bug);
        steps_and_gemms(&run);
        let (code, report) = compare(&reference, &perturbed, &run);
        if code != 1 {
            failures.push(format!("{}: missed (exit {code})", e.bug));
            continue;
        }
        let f = first_divergence(&report, &names);
        eprintln!(
            "MATRIX torch {version} {precision} {}: DIVERGENCE step {} {} {} ({}{}) ranks {:?}, {:.1}x over tolerance",
            e.bug,
            f.step,
            f.op,
            f.role,
            f.cause,
            f.after.as_deref().map(|a| format!(", after {a}")).unwrap_or_default(),
            f.ranks,
            f.margin
        );
        let localized = f.step == e.step
            && f.op == e.op
            && f.role == e.role
            && f.cause == e.cause
            && (e.after.is_none() || f.after.as_deref() == e.after)
            && e.ranks.contains(&f.ranks.as_slice());
        if !localized {
            failures.push(format!("{}: found {f:?}", e.bug));
        }
    }
    eprintln!(
        "torch {version} {precision}: {} runs traced and compared in {:.0} s",
        picked.len() + 3,
        start.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "torch {version} {precision}: {failures:#?}"
    );
}

#[test]
fn torch_2_10_megatron_fp32_every_bug_detected_and_localized_no_false_alarm() {
    matrix("2.10.0", "fp32", |_| true);
}

#[test]
fn torch_2_10_megatron_bf16_every_bug_detected_and_localized_no_false_alarm() {
    matrix("2.10.0", "bf16", |_| true);
}

/// CUDA 13 (scripts/build-sim-cuda13.sh): the bug-free run and one bug of each kind of
/// verdict (a wrong shard read upstream, a wrong reduction op, a weight that went wrong in the
/// previous step), to keep the suite lean; torch 2.10 runs them all.
#[test]
fn torch_2_15_cuda_13_megatron_bf16_bugs_detected_and_localized_no_false_alarm() {
    matrix("2.15.0", "bf16", |bug| {
        ["neighbour-shard", "avg-not-sum", "no-dp-allreduce"].contains(&bug)
    });
}

/// Overfitting one batch (the same input bytes every step, as a first debugging run does):
/// each training iteration is still a step on every rank, at world 1 and tp=2 dp=2. The step
/// rule once took the unchanged input for unchanged weights and numbered the whole run step 0
/// (with one micro-batch a step; with more, consecutive micro-batches hold other rows).
#[test]
fn torch_2_10_one_batch_trained_on_repeatedly_is_one_step_per_iteration() {
    let Some(torch) = find("2.10.0") else { return };
    let tmp = TempDir::new("torch-same-batch");
    let model = ["--same-batch", "--micro-batches", "1"];
    let (single, tp2dp2) = (tmp.path().join("world1"), tmp.path().join("tp2dp2"));
    trace_all(
        &torch,
        &[
            Job::new(&single, &[], 1, &model),
            Job::new(&tp2dp2, &[], 4, &model),
        ],
    );
    steps_and_gemms_of(&single, 1);
    steps_and_gemms_of(&tp2dp2, 1);
}
