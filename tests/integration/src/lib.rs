//! Helpers shared by the integration tests: where cargo left the binaries and the simulated
//! libraries, and how to run a probe program, alone or under `simrun`.
//!
//! The tests use the binaries of the profile they were built with (`cargo test --release` uses
//! `target/release`), so run `cargo build --release` (or plain `cargo build` for the dev profile)
//! first: scripts/test.sh does.

pub mod abi_check;
pub mod c_build;

use std::path::PathBuf;
use std::process::{Command, Output};

/// `ttrace run --out STORE` on the simulated stack, cut off from the caller's environment (no
/// inherited LD_PRELOAD, collector, library path or perturbation); append options, `--` and
/// the command.
pub fn ttrace_run(store: &std::path::Path) -> Command {
    let mut cmd = Command::new(bin("ttrace"));
    cmd.env("LD_LIBRARY_PATH", sim_dir())
        .env_remove("TTRACE_LIB")
        .env_remove("TTRACE_DAEMON")
        .env_remove("TTRACE_PERTURB")
        .env_remove("LD_PRELOAD")
        .arg("run")
        .arg("--out")
        .arg(store);
    cmd
}

/// Traces the fixture trainer with `args` into `store` (`ttrace run --perturb` when
/// `perturb`; under `simrun` with `nproc` ranks when `nproc > 1`); panics with its output when
/// it fails.
pub fn trace_trainer<S: AsRef<std::ffi::OsStr>>(
    store: &std::path::Path,
    nproc: usize,
    perturb: bool,
    args: &[S],
) {
    let mut cmd = ttrace_run(store);
    if perturb {
        cmd.arg("--perturb");
    }
    cmd.arg("--");
    if nproc > 1 {
        cmd.arg(bin("simrun"))
            .args(["--nproc-per-node", &nproc.to_string(), "--"]);
    }
    let out = cmd
        .arg(bin("trainer"))
        .args(args)
        .output()
        .expect("ttrace run");
    let shown: Vec<String> = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    assert!(
        out.status.success(),
        "ttrace run -- trainer {}: {}\n{}",
        shown.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh directory under the system temp dir, removed when dropped (`.0` is its path), or
/// at the latest when the test process exits: fixtures kept in a `static` (built once, shared
/// by a binary's tests) are never dropped, and each such store left tens of MB in /tmp per run.
pub struct TempDir(pub PathBuf);

/// Every [`TempDir`] made by this process, removed at exit (those already dropped are gone).
static MADE: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

extern "C" fn remove_temp_dirs() {
    if let Ok(dirs) = MADE.lock() {
        for d in dirs.iter() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

impl TempDir {
    /// `ttrace-<tag>-<pid>-<n>`, empty.
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        static AT_EXIT: std::sync::Once = std::sync::Once::new();
        // SAFETY: registers a plain function; it runs once, at exit, on the exiting thread.
        AT_EXIT.call_once(|| unsafe {
            libc::atexit(remove_temp_dirs);
        });
        let d = std::env::temp_dir().join(format!(
            "ttrace-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("tempdir");
        if let Ok(mut made) = MADE.lock() {
            made.push(d.clone());
        }
        TempDir(d)
    }

    /// Its path.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `target/<profile>`: two levels above the test executable (`target/<profile>/deps/test-…`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    exe.ancestors()
        .nth(2)
        .expect("test executables live in target/<profile>/deps")
        .to_path_buf()
}

/// Copies the files under `from` (a store: its manifest and rank directories) into `to`.
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read dir").flatten() {
        let target = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

/// A binary built by this workspace, e.g. `bin("simrun")`. Panics with a hint when missing.
pub fn bin(name: &str) -> PathBuf {
    let p = profile_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: build the workspace first (cargo build --release)",
        p.display()
    );
    p
}

/// `target/<profile>/sim`, where the simulated libraries are linked under their real sonames.
pub fn sim_dir() -> PathBuf {
    let d = profile_dir().join("sim");
    assert!(
        d.join("libcudart.so.12").exists(),
        "{} has no simulated libraries: build the workspace first (cargo build --release)",
        d.display()
    );
    d
}

/// The simulated stack of CUDA `major`: `target/<profile>/sim` (12), or the CUDA 13 build in
/// `target/cuda13/<profile>/sim` (scripts/build-sim-cuda13.sh), `None` when that is not built.
pub fn sim_dir_for(major: u32) -> Option<PathBuf> {
    if major == 12 {
        return Some(sim_dir());
    }
    let profile = profile_dir();
    let name = profile.file_name()?.to_owned();
    let d = profile.parent()?.join("cuda13").join(name).join("sim");
    d.join("libcudart.so.13").exists().then_some(d)
}

/// A command for a workspace binary with the simulated stack on its library path.
pub fn command(name: &str) -> Command {
    let mut c = Command::new(bin(name));
    c.env("LD_LIBRARY_PATH", sim_dir());
    c
}

/// Runs `sim-probe ARGS` under `simrun --nproc-per-node N` and returns its output.
pub fn simrun_probe(nproc: usize, args: &[&str]) -> Output {
    let mut c = command("simrun");
    c.arg("--nproc-per-node")
        .arg(nproc.to_string())
        .arg("--")
        .arg(bin("sim-probe"))
        .args(args);
    c.output().expect("simrun starts")
}

/// Runs `sim-probe ARGS` as a single process and returns its output.
pub fn probe(args: &[&str]) -> Output {
    command("sim-probe")
        .args(args)
        .output()
        .expect("sim-probe starts")
}

/// Formats a finished process's output for an assertion message.
pub fn describe(out: &Output) -> String {
    format!(
        "status: {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn strs(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// The layouts with tp in {1, 2, 4}, dp in {1, 2}, pp in {1, 2}, world 2..=8, each plain and
/// with SP (tp > 1) and ZeRO-1 (dp > 1) on; the GEMM path and rank order vary along the way.
pub fn trainer_layouts() -> Vec<Vec<String>> {
    let mut v = Vec::new();
    for tp in [1, 2, 4] {
        for dp in [1, 2] {
            for pp in [1, 2] {
                let world = tp * dp * pp;
                if world == 1 || world > 8 {
                    continue;
                }
                for variant in [false, true] {
                    if variant && tp == 1 && dp == 1 {
                        continue;
                    }
                    let mut a = strs(&["--tp", &tp.to_string(), "--dp", &dp.to_string()]);
                    a.extend(strs(&["--pp", &pp.to_string()]));
                    if variant && tp > 1 {
                        a.push("--sp".into());
                    }
                    if variant && dp > 1 {
                        a.push("--zero1".into());
                    }
                    if v.len() % 2 == 1 {
                        a.extend(strs(&["--gemm", "lt"]));
                    }
                    if variant && dp > 1 && pp > 1 {
                        a.extend(strs(&["--order", "tp-pp-dp"]));
                    }
                    v.push(a);
                }
            }
        }
    }
    v
}
