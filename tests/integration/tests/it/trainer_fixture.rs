//! The fixture trainer (`tests/trainer`): every parallel layout agrees with the world-size-1
//! reference up to round-off, every catalogue bug moves the weights far beyond it, the CLI
//! describes itself, and the NVTX ranges name the modules `--explain-bug` points at.
//!
//! Needs the workspace built (`trainer`, `simrun`, the simulated libraries) and, for the NVTX
//! test, gcc. Runs take a fraction of a second each; the whole file a minute or so on 2 cores.
//!
//! # How runs are compared
//! Each run dumps its final fp32 master weights (`--dump`); the test assembles every canonical
//! tensor from the ranks' shards (checking that replicas agree bitwise) and measures, per
//! tensor, the relative Frobenius error of the *training update*:
//! `‖w − w_ref‖ / ‖w_ref − w_init‖`, in units of the precision's machine epsilon (BF16's for
//! FP8 recipes, as TTrace and Megatron-LM do). Relative to the update rather than to the
//! weight, because norm weights start at 1 and move by ~1e-3: relative to the weight, even a
//! bug confined to them would hide below one BF16 epsilon. `w_init` comes from a `--steps 0`
//! run. With the trainer's Adam (epsilon 1e-3, about the median gradient) the update is
//! close to linear in the gradient, so this is essentially the gradients' relative error.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use integration_tests::{bin, command, describe, profile_dir, trainer_layouts};

/// FP32 machine epsilon, 2^-23.
const EPS_F32: f64 = 1.0 / 8_388_608.0;
/// BF16 machine epsilon, 2^-7.
const EPS_BF16: f64 = 1.0 / 128.0;

/// The configuration every comparison uses besides the layout: the default model, three steps
/// (step 1 and 2 see Adam's state), and an 8-token prompt without loss in each sequence (so
/// that loss masking is exercised, and gradients differ along the sequence).
const BASE: &[&str] = &["--steps", "3", "--prompt-len", "8"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Prec {
    Fp32,
    Bf16,
    Fp8,
}

impl Prec {
    fn name(self) -> &'static str {
        match self {
            Prec::Fp32 => "fp32",
            Prec::Bf16 => "bf16",
            Prec::Fp8 => "fp8",
        }
    }

    /// Machine epsilon the errors are expressed in (FP8 recipes use BF16's: their
    /// accumulation and storage are BF16/FP32).
    fn eps(self) -> f64 {
        match self {
            Prec::Fp32 => EPS_F32,
            _ => EPS_BF16,
        }
    }

    /// Tolerance on a tensor's update-relative error, in units of [`Prec::eps`].
    ///
    /// * BF16: 8 ε = 2^-4. Megatron-LM's gradient gate (TTrace's theorem 5.3 as implemented:
    ///   `4 · 1.03^(L+1−l) · ε` at its most permissive l = 0, L = 32) is 10.6 ε; our net is 4
    ///   layers deep, so the same formula gives at most 4 · 1.03^5 ≈ 4.6 ε, doubled for the two
    ///   round-off terms (reference and candidate each err). Observed over all layouts: ≤ 1.7 ε.
    /// * FP32: the same formula would give ~9 ε, but in FP32 the inputs are exact and what is
    ///   left is accumulation order under cancellation: a norm weight's grad sums 128 token
    ///   contributions of both signs (|Σ| ≪ Σ|·|), so a ~√k·u reordering error is amplified
    ///   by the cancellation ratio. 2048 ε = 2^-12 allows a 30x cancellation on top of
    ///   √128 · u; observed: ≤ 360 ε (norm weights), ≤ 6 ε for matrices.
    /// * FP8 (in BF16 ε): E4M3 activations and E5M2 gradients carry unit roundoffs of 2^-4 and
    ///   2^-3; reference and candidate quantise inputs that differ by BF16 round-off, so a few
    ///   percent of elements land one FP8 step apart. 64 ε_BF16 = 0.5 = 4 u(E5M2); observed:
    ///   ≤ 25 ε_BF16 (0.19).
    fn weight_tol(self) -> f64 {
        match self {
            Prec::Fp32 => 2048.0,
            Prec::Bf16 => 8.0,
            Prec::Fp8 => 64.0,
        }
    }

    /// Tolerance on each step's loss, relative. The loss is a mean over 256 labelled tokens
    /// per step in FP32 from (for BF16/FP8) BF16 logits; its round-off is far below one ε of
    /// the logits: FP32 16 ε (observed ≤ 1 ε), BF16 2^-12 (observed 5.6e-5), FP8 2^-10
    /// (observed 1.7e-4).
    fn loss_tol(self) -> f64 {
        match self {
            Prec::Fp32 => 16.0 * EPS_F32,
            Prec::Bf16 => 1.0 / 4096.0,
            Prec::Fp8 => 1.0 / 1024.0,
        }
    }
}

/// A canonical tensor assembled from a dump.
struct Tensor {
    data: Vec<f32>,
    /// Largest difference between two replicas of one element (0 when they agree bitwise).
    replica_diff: f32,
}

/// A finished run: the per-step losses from stdout and the dumped weights.
struct Run {
    losses: Vec<f64>,
    weights: HashMap<String, Tensor>,
}

/// A scratch directory for one run, emptied.
fn scratch(name: &str) -> PathBuf {
    let d = profile_dir().join("trainer-tests").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create a scratch directory");
    d
}

fn world_of(args: &[String]) -> usize {
    ["--tp", "--dp", "--pp"]
        .iter()
        .map(|flag| {
            args.iter()
                .rposition(|a| a == flag)
                .and_then(|i| args.get(i + 1))
                .map_or(1, |v| v.parse::<usize>().expect("a size"))
        })
        .product()
}

/// The trainer with `args`: alone for one rank, under simrun for more.
fn trainer_cmd(args: &[String]) -> Command {
    let world = world_of(args);
    let mut c = if world == 1 {
        command("trainer")
    } else {
        let mut c = command("simrun");
        c.arg("--nproc-per-node")
            .arg(world.to_string())
            .arg("--")
            .arg(bin("trainer"));
        c
    };
    c.args(args);
    c
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Runs the trainer, dumping into a fresh directory `name`; panics unless it succeeds.
fn run(name: &str, args: &[String]) -> Run {
    let dir = scratch(name);
    let out = trainer_cmd(args)
        .arg("--dump")
        .arg(&dir)
        .output()
        .expect("the trainer starts");
    assert!(
        out.status.success(),
        "trainer {args:?} failed\n{}",
        describe(&out)
    );
    let losses = parse_losses(&String::from_utf8_lossy(&out.stdout));
    let steps = args
        .iter()
        .rposition(|a| a == "--steps")
        .map_or(2, |i| args[i + 1].parse().expect("steps"));
    assert_eq!(
        losses.len(),
        steps,
        "one loss line per step\n{}",
        describe(&out)
    );
    let file = std::fs::read_to_string(dir.join("losses.txt")).unwrap_or_default();
    assert_eq!(
        parse_losses(&file),
        losses,
        "losses.txt repeats stdout ({args:?})"
    );
    Run {
        losses,
        weights: read_dump(&dir),
    }
}

fn parse_losses(text: &str) -> Vec<f64> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["step", _, "loss", v] => v.parse().ok(),
                _ => None,
            }
        })
        .collect()
}

/// Assembles every canonical tensor from the `weights.rank*.{tsv,f32}` files (format in the
/// trainer's `dump` module), checking that every element is covered.
fn read_dump(dir: &Path) -> HashMap<String, Tensor> {
    let mut out: HashMap<String, (Vec<Option<f32>>, f32)> = HashMap::new();
    let mut ranks = 0;
    for entry in std::fs::read_dir(dir).expect("read the dump") {
        let p = entry.expect("entry").path();
        if p.extension().is_none_or(|e| e != "tsv") {
            continue;
        }
        ranks += 1;
        let bin_path = p.with_extension("f32");
        let bytes = std::fs::read(&bin_path).expect("read the values");
        let vals: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        for line in std::fs::read_to_string(&p).expect("read the index").lines() {
            if line.starts_with('#') {
                continue;
            }
            let f: Vec<&str> = line.split('\t').collect();
            assert_eq!(f.len(), 6, "index line `{line}`");
            let shape: Vec<usize> = f[1].split('x').map(|v| v.parse().expect("dim")).collect();
            let range = |s: &str| -> (usize, usize) {
                let (a, b) = s.split_once(':').expect("a:b");
                (a.parse().expect("start"), b.parse().expect("end"))
            };
            let (r0, r1) = range(f[2]);
            let cols = shape.get(1).copied().unwrap_or(1);
            let (c0, c1) = if f[3] == "-" { (0, 1) } else { range(f[3]) };
            let off: usize = f[4].parse::<usize>().expect("offset") / 4;
            let count: usize = f[5].parse().expect("count");
            assert_eq!(count, (r1 - r0) * (c1 - c0), "block size of {}", f[0]);
            let numel: usize = shape.iter().product();
            let (t, diff) = out
                .entry(f[0].to_string())
                .or_insert_with(|| (vec![None; numel], 0.0));
            let mut k = off;
            for r in r0..r1 {
                for c in c0..c1 {
                    let v = vals[k];
                    k += 1;
                    let slot = &mut t[r * cols + c];
                    if let Some(old) = *slot {
                        *diff = diff.max((old - v).abs());
                    }
                    *slot = Some(v);
                }
            }
        }
    }
    assert!(ranks > 0, "no weights in {}", dir.display());
    out.into_iter()
        .map(|(name, (t, replica_diff))| {
            let data = t
                .into_iter()
                .map(|v| v.unwrap_or_else(|| panic!("{name}: an element no rank holds")))
                .collect();
            (name, Tensor { data, replica_diff })
        })
        .collect()
}

/// Per tensor: update-relative error in units of `eps`.
fn errors(reference: &Run, init: &Run, cand: &Run, eps: f64) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = reference
        .weights
        .iter()
        .map(|(name, r)| {
            let c = cand
                .weights
                .get(name)
                .unwrap_or_else(|| panic!("{name} missing from the candidate"));
            let i = &init.weights[name];
            let (mut num, mut den) = (0f64, 0f64);
            for k in 0..r.data.len() {
                num += (c.data[k] as f64 - r.data[k] as f64).powi(2);
                den += (r.data[k] as f64 - i.data[k] as f64).powi(2);
            }
            (name.clone(), num.sqrt() / den.sqrt().max(1e-30) / eps)
        })
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v
}

fn loss_delta(reference: &Run, cand: &Run) -> f64 {
    reference
        .losses
        .iter()
        .zip(&cand.losses)
        .map(|(r, c)| ((c - r) / r).abs())
        .fold(0.0, f64::max)
}

fn with(base: &[&str], prec: Prec, extra: &[String]) -> Vec<String> {
    let mut a = strings(base);
    a.extend(strings(&["--precision", prec.name()]));
    a.extend(extra.iter().cloned());
    a
}

/// Compares every layout in `layouts` against the world-1 reference of `model` args.
fn check_layouts(tag: &str, prec: Prec, model: &[&str], layouts: &[Vec<String>]) {
    let mut base = BASE.to_vec();
    base.extend_from_slice(model);
    let reference = run(&format!("{tag}-ref"), &with(&base, prec, &[]));
    let mut init_args = with(&base, prec, &[]);
    init_args.extend(strings(&["--steps", "0"]));
    let init = run(&format!("{tag}-init"), &init_args);
    let mut failures = Vec::new();
    for (i, layout) in layouts.iter().enumerate() {
        let cand = run(&format!("{tag}-{i}"), &with(&base, prec, layout));
        let errs = errors(&reference, &init, &cand, prec.eps());
        let (worst, worst_err) = errs[0].clone();
        let ld = loss_delta(&reference, &cand);
        let split: f32 = cand
            .weights
            .values()
            .map(|t| t.replica_diff)
            .fold(0.0, f32::max);
        eprintln!(
            "{} {:50} worst {worst:40} {worst_err:8.2} eps (tol {}), loss delta {ld:.2e}",
            prec.name(),
            layout.join(" "),
            prec.weight_tol()
        );
        if worst_err > prec.weight_tol() {
            failures.push(format!(
                "{layout:?}: {worst} is {worst_err:.1} eps off (tolerance {})",
                prec.weight_tol()
            ));
        }
        if ld > prec.loss_tol() {
            failures.push(format!(
                "{layout:?}: loss differs by {ld:.2e} (relative; tolerance {:.2e}): {:?} vs {:?}",
                prec.loss_tol(),
                cand.losses,
                reference.losses
            ));
        }
        if split != 0.0 {
            failures.push(format!("{layout:?}: replicas disagree by up to {split:e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_layout_matches_the_reference_in_fp32() {
    check_layouts("fp32", Prec::Fp32, &[], &trainer_layouts());
}

#[test]
fn every_layout_matches_the_reference_in_bf16() {
    check_layouts("bf16", Prec::Bf16, &[], &trainer_layouts());
}

#[test]
fn every_layout_matches_the_reference_in_fp8() {
    check_layouts("fp8", Prec::Fp8, &[], &trainer_layouts());
}

#[test]
fn tied_embeddings_and_rmsnorm_match_the_reference() {
    let l = [
        strings(&["--tp", "2", "--dp", "2", "--pp", "2", "--sp", "--zero1"]),
        strings(&["--tp", "4", "--pp", "2", "--sp", "--gemm", "lt"]),
        strings(&["--dp", "2", "--pp", "2", "--zero1", "--order", "pp-dp-tp"]),
    ];
    let model = ["--tie-embeddings", "--norm", "rmsnorm", "--seed", "7"];
    for prec in [Prec::Fp32, Prec::Bf16, Prec::Fp8] {
        check_layouts(&format!("tied-{}", prec.name()), prec, &model, &l);
    }
}

/// Each bug: a layout where it acts, the precision it is pinned in, extra model options.
const BUG_CASES: &[(&str, &str, Prec, &str)] = &[
    ("tp-row-parallel-no-reduce", "--tp 2", Prec::Fp32, ""),
    ("tp-row-parallel-avg", "--tp 2", Prec::Fp32, ""),
    ("sp-norm-grad-unreduced", "--tp 2 --sp", Prec::Fp32, ""),
    ("norm-grad-scaled-by-tp", "--tp 2", Prec::Fp32, ""),
    ("dp-grad-sum", "--dp 2", Prec::Fp32, ""),
    ("bucket-offset-swap", "--dp 2", Prec::Fp32, ""),
    ("tp-column-shard-offset", "--tp 2", Prec::Fp32, ""),
    ("attention-softmax-scale-local", "--tp 2", Prec::Fp32, ""),
    ("pp-stale-activation", "--pp 2", Prec::Fp32, ""),
    ("loss-not-divided-by-microbatches", "--pp 2", Prec::Fp32, ""),
    (
        "tied-embedding-grad-unreduced",
        "--tp 2 --pp 2",
        Prec::Fp32,
        "--tie-embeddings",
    ),
    (
        "tied-embedding-reduce-after-zero-rs",
        "--dp 2 --pp 2 --zero1",
        Prec::Fp32,
        "--tie-embeddings",
    ),
    ("fp8-amax-unreduced", "--tp 2 --sp", Prec::Fp8, ""),
    ("zero1-skip-shard", "--dp 2 --zero1", Prec::Fp32, ""),
    ("grad-accum-overwrite", "--pp 2", Prec::Fp32, ""),
    ("dp-data-slice-overlap", "--dp 2", Prec::Fp32, ""),
];

fn split(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// Every bug in the catalogue, in a layout where it acts, runs to the end, keeps a plausible
/// loss and moves some tensor at least 10x past the tolerance. Prints the table the report
/// quotes (`cargo test -- --nocapture`).
#[test]
fn every_bug_moves_the_weights_beyond_round_off() {
    let listed = command("trainer")
        .args(["--list-bugs", "--json"])
        .output()
        .expect("trainer starts");
    let listing = String::from_utf8_lossy(&listed.stdout).to_string();
    for (bug, ..) in BUG_CASES {
        assert!(
            listing.contains(&format!("\"name\": \"{bug}\"")),
            "{bug} is not in --list-bugs"
        );
    }
    assert_eq!(
        listing.matches("\"name\":").count(),
        BUG_CASES.len(),
        "every listed bug has a case here"
    );
    let mut refs: HashMap<(Prec, String), (Run, Run)> = HashMap::new();
    let mut table = vec![format!(
        "{:38} {:24} {:5} {:>9} {:>8}  {}",
        "bug", "layout", "prec", "loss d%", "err/tol", "worst tensor"
    )];
    let mut failures = Vec::new();
    let mut subtle = 0;
    for (i, (bug, layout, prec, model)) in BUG_CASES.iter().enumerate() {
        let mut base = strings(BASE);
        base.extend(split(model));
        let key = (*prec, model.to_string());
        if !refs.contains_key(&key) {
            let tag = format!("bugref-{}-{}", prec.name(), refs.len());
            let r = run(&tag, &with(&[], *prec, &base));
            let mut ia = with(&[], *prec, &base);
            ia.extend(strings(&["--steps", "0"]));
            let init = run(&format!("{tag}-init"), &ia);
            refs.insert(key.clone(), (r, init));
        }
        let (reference, init) = &refs[&key];
        let mut args = with(&[], *prec, &base);
        args.extend(split(layout));
        args.extend(strings(&["--bug", bug]));
        let cand = run(&format!("bug-{i}"), &args);
        let errs = errors(reference, init, &cand, prec.eps());
        let (worst, e) = &errs[0];
        let ratio = e / prec.weight_tol();
        let ld = loss_delta(reference, &cand);
        subtle += usize::from(ld < 0.01);
        table.push(format!(
            "{bug:38} {layout:24} {:5} {:>9.3} {ratio:>8.1}  {worst}",
            prec.name(),
            100.0 * ld
        ));
        if ratio < 10.0 {
            failures.push(format!("{bug}: worst error only {ratio:.1}x the tolerance"));
        }
        if cand.losses.iter().any(|l| !l.is_finite()) || ld > 0.05 {
            failures.push(format!(
                "{bug}: the loss is not plausible ({:?} vs {:?})",
                cand.losses, reference.losses
            ));
        }
    }
    eprintln!("{}", table.join("\n"));
    // Silent and several subtle: the loss stays within 1% of the reference over the steps.
    if subtle < 4 {
        failures.push(format!("only {subtle} bugs keep the loss within 1%"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn json_field<'a>(json: &'a str, key: &str) -> &'a str {
    let k = format!("\"{key}\": ");
    let at = json
        .find(&k)
        .unwrap_or_else(|| panic!("no {key} in {json}"));
    let rest = &json[at + k.len()..];
    if let Some(s) = rest.strip_prefix('"') {
        &s[..s.find('"').expect("closing quote")]
    } else {
        let end = rest.find([',', '}']).expect("value end");
        rest[..end].trim()
    }
}

/// Compiles the NVTX logger: an `LD_PRELOAD` library that appends every push (`push NAME`) and
/// pop to `$NVTX_LOG_DIR/nvtx.<RANK>.log` and forwards to the real NVTX.
fn nvtx_logger() -> PathBuf {
    let dir = profile_dir().join("trainer-tests");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let src = dir.join("nvtxlog.c");
    let so = dir.join("libnvtxlog.so");
    std::fs::write(
        &src,
        r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
static FILE *out;
static FILE *logf_(void) {
    if (!out) {
        const char *d = getenv("NVTX_LOG_DIR"), *r = getenv("RANK");
        char p[4096];
        if (!d) return NULL;
        snprintf(p, sizeof p, "%s/nvtx.%s.log", d, r ? r : "0");
        out = fopen(p, "w");
    }
    return out;
}
int nvtxRangePushA(const char *m) {
    FILE *f = logf_();
    if (f) { fprintf(f, "push %s\n", m); fflush(f); }
    int (*real)(const char *) = (int (*)(const char *))dlsym(RTLD_NEXT, "nvtxRangePushA");
    return real ? real(m) : 0;
}
int nvtxRangePop(void) {
    FILE *f = logf_();
    if (f) { fprintf(f, "pop\n"); fflush(f); }
    int (*real)(void) = (int (*)(void))dlsym(RTLD_NEXT, "nvtxRangePop");
    return real ? real() : 0;
}
"#,
    )
    .expect("write the logger source");
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
        .arg(&so)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("gcc runs");
    assert!(out.status.success(), "gcc failed\n{}", describe(&out));
    so
}

/// The NVTX paths (outer/inner/...) each rank pushed, from the logger's files.
fn nvtx_paths(dir: &Path) -> Vec<HashMap<String, usize>> {
    let mut ranks = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read logs") {
        let p = entry.expect("entry").path();
        if !p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("nvtx."))
        {
            continue;
        }
        let mut stack: Vec<String> = Vec::new();
        let mut paths: HashMap<String, usize> = HashMap::new();
        for line in std::fs::read_to_string(&p).expect("read log").lines() {
            if let Some(name) = line.strip_prefix("push ") {
                stack.push(name.to_string());
                *paths.entry(stack.join("/")).or_default() += 1;
            } else {
                assert!(stack.pop().is_some(), "pop without push in {}", p.display());
            }
        }
        assert!(stack.is_empty(), "ranges left open in {}", p.display());
        ranks.push(paths);
    }
    ranks
}

/// `--explain-bug` names a module range that the buggy run really pushes inside the named
/// pass's outer range (`forward.mb<k>`, `backward.mb<k>`, `optimizer`), and the healthy
/// ranges follow Megatron's module paths with global layer numbers.
#[test]
fn nvtx_ranges_name_the_modules_explain_bug_points_at() {
    let so = nvtx_logger();
    let logs = |name: &str, args: &[String]| {
        let dir = scratch(name);
        let out = trainer_cmd(args)
            .env("LD_PRELOAD", &so)
            .env("NVTX_LOG_DIR", &dir)
            .output()
            .expect("trainer starts");
        assert!(out.status.success(), "{args:?}\n{}", describe(&out));
        nvtx_paths(&dir)
    };
    // A healthy pp=2 run: stage 0 holds layers 0-1 and the embedding, stage 1 layers 2-3 and
    // the head; every module range sits inside a pass.
    let args = strings(&["--pp", "2", "--tp", "2", "--sp", "--steps", "1"]);
    let ranks = logs("nvtx-healthy", &args);
    assert_eq!(ranks.len(), 4);
    let all: Vec<&String> = ranks.iter().flat_map(|r| r.keys()).collect();
    for module in [
        "embedding",
        "layers.0.input_norm",
        "layers.1.attention.qkv",
        "layers.2.attention.core",
        "layers.3.attention.proj",
        "layers.3.post_attention_norm",
        "layers.2.mlp.fc1",
        "layers.3.mlp.fc2",
        "final_norm",
        "output_layer",
        "loss",
    ] {
        for pass in ["forward.mb0", "forward.mb1", "backward.mb1"] {
            let path = format!("{pass}/{module}");
            assert!(all.iter().any(|p| **p == path), "nobody pushed {path}");
        }
    }
    let stage1: Vec<&HashMap<String, usize>> = ranks
        .iter()
        .filter(|r| r.contains_key("forward.mb0/final_norm"))
        .collect();
    assert_eq!(stage1.len(), 2, "two ranks run the last stage");
    for r in stage1 {
        assert!(!r
            .keys()
            .any(|p| p.contains("layers.0.") || p.contains("layers.1.")));
        assert!(r.contains_key("backward.mb0/layers.2.input_norm"));
    }
    let quiet = logs("nvtx-off", &strings(&["--no-nvtx", "--steps", "1"]));
    assert!(
        quiet.iter().all(|r| r.is_empty()),
        "--no-nvtx pushes nothing"
    );

    for (bug, layout, prec, model) in BUG_CASES {
        let mut args = strings(&["--steps", "2", "--prompt-len", "8", "--precision"]);
        args.push(prec.name().into());
        args.extend(split(model));
        args.extend(split(layout));
        let explained = command("trainer")
            .args(&args)
            .args(["--explain-bug", bug, "--json"])
            .output()
            .expect("trainer starts");
        assert!(explained.status.success(), "{}", describe(&explained));
        let json = String::from_utf8_lossy(&explained.stdout).to_string();
        assert_eq!(
            json_field(&json, "active"),
            "true",
            "{bug} in {layout}: {json}"
        );
        let module = json_field(&json, "module");
        let pass = json_field(&json, "pass");
        let step: usize = json_field(&json, "step").parse().expect("step");
        assert_eq!(step, 0, "{bug} acts from the first step");
        let outer = match (pass, json_field(&json, "micro_batch")) {
            ("optimizer", "null") => "optimizer".to_string(),
            ("forward" | "backward", mb) => format!("{pass}.mb{mb}"),
            other => panic!("{bug}: unexpected pass/micro-batch {other:?}"),
        };
        args.extend(strings(&["--bug", bug]));
        let ranks = logs(&format!("nvtx-{bug}"), &args);
        let path = format!("{outer}/{module}");
        assert!(
            ranks.iter().any(|r| r.contains_key(&path)),
            "{bug}: no rank pushed {path} (explain: {json})"
        );
    }
}

#[test]
fn command_line_help_listing_and_usage_errors() {
    let help = command("trainer").arg("--help").output().expect("starts");
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--tp",
        "--dp",
        "--pp",
        "--sp",
        "--zero1",
        "--order",
        "--precision",
        "--gemm",
        "--bug",
        "--list-bugs",
        "--explain-bug",
        "--dump",
        "--no-nvtx",
        "--tie-embeddings",
        "--micro-batches",
    ] {
        assert!(text.contains(flag), "--help does not mention {flag}");
    }
    let list = command("trainer")
        .arg("--list-bugs")
        .output()
        .expect("starts");
    assert!(list.status.success());
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.matches("active in:").count() >= 12, "{text}");

    let usage = |args: &[&str], needle: &str| {
        let out = trainer_cmd(&strings(args)).output().expect("starts");
        assert_eq!(out.status.code(), Some(2), "{args:?}\n{}", describe(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: `{needle}` not in\n{err}");
    };
    usage(
        &["--heads", "4", "--tp", "3", "--steps", "1"],
        "not divisible by --tp 3",
    );
    usage(&["--bug", "no-such-bug"], "unknown bug");
    usage(&["--bug", "dp-grad-sum"], "cannot act in this layout");
    usage(&["--sp"], "--sp needs --tp > 1");
    usage(&["--order", "tp-tp-dp"], "--order");
    // A layout the world size cannot hold: the lone process is a world of one.
    let out = command("trainer")
        .args(["--tp", "2"])
        .output()
        .expect("starts");
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("WORLD_SIZE is 1"));
}

/// The 8-rank layout of the default model, 2 steps: timed for the report (not asserted).
#[test]
fn eight_ranks_two_steps_timing() {
    let args = strings(&[
        "--tp", "2", "--dp", "2", "--pp", "2", "--sp", "--zero1", "--steps", "2",
    ]);
    let start = Instant::now();
    let out: Output = trainer_cmd(&args).output().expect("starts");
    let took = start.elapsed();
    assert!(out.status.success(), "{}", describe(&out));
    eprintln!("tp=2 dp=2 pp=2 (sp, zero1), 2 steps: {took:.2?}");
}
