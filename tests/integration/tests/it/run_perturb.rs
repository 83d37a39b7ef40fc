//! `ttrace run --perturb[=SEED]`: a perturbed reference run with no code change. The fixture
//! trainer (BF16, world 1) is traced plainly and perturbed: tracing alone changes no bit of
//! its losses, the perturbation moves them by round-off only; every GEMM output in the
//! perturbed store is its own inputs' exact result moved by ±1 ulp in about half its elements
//! (so the store holds the D the program went on with); a seed reproduces its run bit for bit
//! and another seed draws other noise; the program's exit code is untouched; the manifest and
//! `ttrace ls` say the store is perturbed. GEMMs captured into a CUDA graph are perturbed at
//! every replay, alike.

use crate::intercept_util;

use std::path::Path;
use std::process::{Command, Output};

use integration_tests::{bin, describe, sim_dir};
use intercept_util::*;
use ttrace_format::dtype::DType;
use ttrace_format::record::{Op, Role};
use ttrace_format::store::Manifest;

const TRAINER: &[&str] = &[
    "--precision",
    "bf16",
    "--tp",
    "1",
    "--steps",
    "2",
    "--micro-batches",
    "2",
];

fn trainer(extra: &[&str], dump: &Path) -> Command {
    let mut c = Command::new(bin("trainer"));
    c.args(TRAINER)
        .args(extra)
        .arg("--dump")
        .arg(dump)
        .env("LD_LIBRARY_PATH", sim_dir());
    c
}

/// `ttrace run [PERTURB] --out DIR/store -- trainer ... --dump DIR/dump`.
fn ttrace_run(dir: &Path, perturb: Option<&str>, extra: &[&str]) -> Output {
    let mut c = Command::new(bin("ttrace"));
    c.env("LD_LIBRARY_PATH", sim_dir())
        .env_remove("TTRACE_LIB")
        .env_remove("TTRACE_DAEMON")
        .env_remove("TTRACE_PERTURB")
        .env_remove("LD_PRELOAD")
        .arg("run")
        .args(perturb)
        .arg("--out")
        .arg(dir.join("store"))
        .arg("--")
        .arg(bin("trainer"))
        .args(TRAINER)
        .args(extra)
        .arg("--dump")
        .arg(dir.join("dump"));
    c.output().expect("ttrace runs")
}

/// A traced trainer run: its output, losses and store.
struct Traced {
    out: Output,
    losses: Vec<f64>,
    records: Vec<Rec>,
    manifest: Manifest,
    _dir: TempDir,
}

fn trainer_run(perturb: Option<&str>, extra: &[&str]) -> Traced {
    let dir = TempDir::new("perturb");
    let out = ttrace_run(dir.path(), perturb, extra);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let losses = losses(&dir.path().join("dump"));
    let store = dir.path().join("store");
    let manifest = Manifest::read(&store).expect("manifest");
    Traced {
        out,
        losses,
        records: read_store(&store),
        manifest,
        _dir: dir,
    }
}

fn losses(dump: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(dump.join("losses.txt")).expect("losses.txt");
    text.lines()
        .map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("loss line `{l}`"))
        })
        .collect()
}

fn gemms(run: &Traced) -> Vec<&Rec> {
    run.records
        .iter()
        .filter(|r| matches!(r.record.op, Op::Gemm(_)))
        .collect()
}

/// The elements of two equally long D buffers: (elements, how many differ), asserting that
/// every difference is one step to an adjacent value of the same sign.
fn ulp_diff(dtype: DType, a: &[u8], b: &[u8], what: &str) -> (usize, usize) {
    assert_eq!(a.len(), b.len(), "{what}: sizes");
    let es = dtype.size();
    let bits = |e: &[u8]| -> i64 {
        if es == 4 {
            u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as i64
        } else {
            u16::from_le_bytes([e[0], e[1]]) as i64
        }
    };
    let sign = (es * 8 - 1) as u32;
    let mut changed = 0;
    for (i, (x, y)) in a.chunks_exact(es).zip(b.chunks_exact(es)).enumerate() {
        let (x, y) = (bits(x), bits(y));
        if x != y {
            changed += 1;
            assert_eq!(
                (x - y).abs(),
                1,
                "{what}: element {i} moved from {x:#x} to {y:#x}, not to an adjacent value"
            );
            assert_eq!(x >> sign, y >> sign, "{what}: element {i} changed sign");
        }
    }
    (a.len() / es, changed)
}

/// Over the GEMMs `gemms` of a perturbed store: (elements of their D, how many of them moved),
/// each D compared with its inputs' exact product, every difference one ulp to an adjacent
/// value of the same sign ([`ulp_diff`]); with `every`, each D of 8 elements or more moved.
fn moved_by_noise(gemms: &[&Rec], every: bool) -> (usize, usize) {
    let (mut total, mut moved) = (0, 0);
    for r in gemms {
        let (d_t, d) = r.tensor(Role::D);
        assert!(matches!(d_t.dtype, DType::BF16 | DType::F32 | DType::F16));
        let what = format!(
            "seq {} step {} {}",
            r.record.seq, r.record.step, r.record.api
        );
        let (n, c) = ulp_diff(d_t.dtype, &recompute(r).0, d, &what);
        assert!(!every || c > 0 || n < 8, "{what}: D not perturbed");
        total += n;
        moved += c;
    }
    (total, moved)
}

/// Every record's captured bytes, in store order.
fn tensors(run: &Traced) -> Vec<Vec<Option<Vec<u8>>>> {
    run.records.iter().map(|r| r.bytes.clone()).collect()
}

#[test]
fn a_perturbed_reference_run_moves_every_gemm_output_by_one_ulp() {
    let dump = TempDir::new("perturb-plain");
    let plain = trainer(&[], dump.path()).output().expect("trainer runs");
    assert!(plain.status.success(), "{}", describe(&plain));
    let plain_losses = losses(dump.path());
    assert_eq!(plain_losses.len(), 2);

    let unperturbed = trainer_run(None, &[]);
    let p1 = trainer_run(Some("--perturb"), &[]);
    let p1_again = trainer_run(Some("--perturb=1"), &[]);
    let p2 = trainer_run(Some("--perturb=2"), &[]);

    // (1) Tracing alone changes nothing; the perturbation changes the losses by round-off.
    assert_eq!(
        unperturbed.losses, plain_losses,
        "tracing changed the losses"
    );
    for run in [&p1, &p2] {
        assert_ne!(run.losses, plain_losses, "the perturbation changed no loss");
        for (p, q) in run.losses.iter().zip(&plain_losses) {
            let rel = (p - q).abs() / q.abs();
            assert!(rel < 1e-2, "loss {p} vs {q}: relative difference {rel:.2e}");
            eprintln!("loss {q} -> {p}: relative difference {rel:.2e}");
        }
    }

    // The manifest, `ttrace ls` and the summary say which store is perturbed.
    assert_eq!(unperturbed.manifest.config.perturb, None);
    assert_eq!(p1.manifest.config.perturb, Some(1));
    assert_eq!(p2.manifest.config.perturb, Some(2));
    let summary = String::from_utf8_lossy(&p1.out.stderr);
    assert!(
        summary.contains("perturb   seed 1")
            && summary.contains("perturbed GEMM outputs stored")
            && summary.contains("--perturbed /"),
        "{summary}"
    );
    assert!(!String::from_utf8_lossy(&unperturbed.out.stderr).contains("perturb   seed"));
    let ls = Command::new(bin("ttrace"))
        .arg("ls")
        .arg(p2._dir.path().join("store"))
        .output()
        .expect("ttrace ls");
    assert!(
        String::from_utf8_lossy(&ls.stdout).contains("perturb=2"),
        "{}",
        describe(&ls)
    );

    // (2) The first GEMM has the same inputs in both runs: its perturbed D is the plain one
    // moved by one ulp in about half its elements.
    let (g0, q0) = (gemms(&unperturbed), gemms(&p1));
    assert_eq!(g0.len(), q0.len(), "the same GEMMs");
    assert!(g0.len() > 100, "{} GEMMs", g0.len());
    for role in [Role::A, Role::B] {
        assert_eq!(
            g0[0].tensor(role).1,
            q0[0].tensor(role).1,
            "first GEMM's {role:?}"
        );
    }
    let (d_t, d_plain) = g0[0].tensor(Role::D);
    let (n, changed) = ulp_diff(d_t.dtype, d_plain, q0[0].tensor(Role::D).1, "first GEMM");
    let frac = changed as f64 / n as f64;
    assert!(
        (0.4..0.6).contains(&frac),
        "{changed} of {n} elements moved"
    );

    // Every GEMM of the perturbed store: D is its captured inputs' exact result (the
    // simulator's, recomputed) moved by one ulp in about half its elements; its inputs are
    // the perturbed outputs the program went on with.
    let (total, moved) = moved_by_noise(&q0, true);
    let frac = moved as f64 / total as f64;
    assert!(
        (0.45..0.55).contains(&frac),
        "{moved} of {total} elements moved"
    );
    // The unperturbed store recomputes exactly (the comparison above can fail).
    for r in g0.iter().take(20) {
        assert!(
            recompute(r).0 == r.tensor(Role::D).1,
            "seq {}",
            r.record.seq
        );
    }

    // (3) The same seed gives the same tensors, bit for bit; another seed other ones.
    assert!(
        tensors(&p1) == tensors(&p1_again),
        "the same seed gave other tensors"
    );
    assert_eq!(p1.losses, p1_again.losses);
    let (q2, mut differ) = (gemms(&p2), 0);
    for (a, b) in q0.iter().zip(&q2) {
        differ += usize::from(a.tensor(Role::D).1 != b.tensor(Role::D).1);
    }
    assert_eq!(
        differ,
        q0.len(),
        "another seed must move every GEMM output otherwise"
    );
}

#[test]
fn the_cublaslt_path_is_perturbed_too() {
    let run = trainer_run(Some("--perturb=7"), &["--gemm", "lt"]);
    let g = gemms(&run);
    assert!(g.iter().all(|r| r.record.api == "cublasLtMatmul"));
    let (total, moved) = moved_by_noise(&g, false);
    let frac = moved as f64 / total as f64;
    assert!(
        (0.45..0.55).contains(&frac),
        "{moved} of {total} elements moved over {} matmuls",
        g.len()
    );
}

#[test]
fn a_bad_seed_is_refused_naming_the_option() {
    let out = Command::new(bin("ttrace"))
        .args(["run", "--perturb=x", "--", "true"])
        .output()
        .expect("ttrace runs");
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--perturb"));
    let out = Command::new(bin("ttrace"))
        .env("TTRACE_PERTURB", "-3")
        .args(["run", "--", "true"])
        .output()
        .expect("ttrace runs");
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TTRACE_PERTURB"));
}

#[test]
fn libttrace_refuses_a_bad_seed_naming_the_variable_and_stays_out_of_the_way() {
    let run = intercept_util::traced(1, &["gemm-cublas", "--sim"], &[("TTRACE_PERTURB", "x")]);
    // Untraced and unperturbed: the probe's exact checks pass.
    assert_ok(&run);
    let err = String::from_utf8_lossy(&run.out.stderr);
    assert!(err.contains("TTRACE_PERTURB=x"), "{err}");
    assert!(run.records.is_empty());
}

#[test]
fn the_environment_variable_is_the_option() {
    let dir = TempDir::new("perturb-env");
    let mut c = Command::new(bin("ttrace"));
    c.env("LD_LIBRARY_PATH", sim_dir())
        .env_remove("TTRACE_LIB")
        .env_remove("TTRACE_DAEMON")
        .env_remove("LD_PRELOAD")
        .env("TTRACE_PERTURB", "11")
        .args(["run", "--out"])
        .arg(dir.path().join("store"))
        .arg("--")
        .arg(bin("sim-probe"))
        .args(["traced", "gemm"]);
    let out = c.output().expect("ttrace runs");
    let m = Manifest::read(&dir.path().join("store")).expect("manifest");
    assert_eq!(m.config.perturb, Some(11), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("perturb   seed 11"));
}

/// Under `TTRACE_PERTURB` straight (no `ttrace run`), as a launcher would pass it on.
fn perturbed_probe(args: &[&str]) -> Run {
    intercept_util::traced(1, args, &[("TTRACE_PERTURB", "5")])
}

#[test]
fn gemms_captured_into_a_graph_are_perturbed_at_every_replay() {
    // The trainer's forward and backward passes captured once, replayed every micro-batch.
    let graphed = ["--cuda-graph"];
    let plain = trainer_run(None, &graphed);
    let p3 = trainer_run(Some("--perturb=3"), &graphed);
    let p3_again = trainer_run(Some("--perturb=3"), &graphed);
    let (g, q) = (gemms(&plain), gemms(&p3));
    assert_eq!(g.len(), q.len(), "the same GEMMs");
    assert!(g.len() > 100, "{} GEMMs", g.len());
    // Every replayed GEMM's stored D is its inputs' exact result moved by one ulp in about
    // half its elements, with the noise of its own replay.
    let (total, moved) = moved_by_noise(&q, true);
    let frac = moved as f64 / total as f64;
    assert!(
        (0.45..0.55).contains(&frac),
        "{moved} of {total} elements moved"
    );
    assert_ne!(p3.losses, plain.losses, "the perturbation changed no loss");
    // The same seed, the same run bit for bit.
    assert!(
        tensors(&p3) == tensors(&p3_again),
        "the same seed gave other tensors"
    );
}

#[test]
fn failing_gemms_return_their_codes_and_are_not_touched() {
    // Invalid arguments, missing handles and the like: the same codes as untraced.
    let plain = untraced(1, &["traced", "errors"]);
    assert!(plain.status.success(), "{}", describe(&plain));
    let run = perturbed_probe(&["traced", "errors"]);
    assert_ok(&run);
    assert_eq!(
        run.out.stdout, plain.stdout,
        "the calls returned other codes"
    );
    // The probe's own checks of GEMM results see the noise (they compare exactly).
    let checked = perturbed_probe(&["gemm-cublas", "--sim"]);
    assert!(
        String::from_utf8_lossy(&checked.out.stdout).contains("differs")
            || String::from_utf8_lossy(&checked.out.stderr).contains("differs"),
        "{}",
        describe(&checked.out)
    );
}
