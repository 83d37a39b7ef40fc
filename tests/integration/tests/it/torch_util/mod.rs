//! Shared by the `torch_*` tests: finding a PyTorch venv, its stub libraries, running the
//! `tests/torch` scripts plain and under `ttrace run` on the simulated stack, reading back what
//! torch saved and what ttrace exported.
//!
//! The venvs are made by `scripts/torch-venv.sh` (scripts/test.sh and .ci/run call it):
//! `~/.cache/ttrace-venvs/torch-<version>` unless `TTRACE_TORCH_VENVS` names another folder.
//! A test whose venv is absent prints a SKIP line naming the command that makes it and passes.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use integration_tests::sim_dir_for;
use integration_tests::{abi_check::repo_root, bin, describe, profile_dir};

/// A torch venv and the stub libraries generated for its wheel.
pub struct Torch {
    /// The simulated stack it runs on (CUDA 12 or 13).
    pub sim: PathBuf,
    pub version: &'static str,
    /// The CUDA major its wheel is built for (torch 2.10: 12; torch 2.15: 13).
    pub cuda_major: u32,
    pub python: PathBuf,
    pub torchrun: PathBuf,
    pub stubs: PathBuf,
}

/// The folder holding the venvs.
pub fn venvs_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TTRACE_TORCH_VENVS") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache/ttrace-venvs")
}

/// The venv of torch `version` with its stubs generated, or `None` (after printing why) when
/// the venv is absent.
pub fn find(version: &'static str) -> Option<Torch> {
    let venv = venvs_dir().join(format!("torch-{version}"));
    let python = venv.join("bin/python");
    if !python.exists() {
        eprintln!(
            "SKIP: no torch {version} venv at {} (make it with scripts/torch-venv.sh {version}; \
             scripts/test.sh and .ci/run do)",
            venv.display()
        );
        return None;
    }
    let site = Command::new(&python)
        .args([
            "-c",
            "import os, importlib.util as u; print(os.path.dirname(u.find_spec('torch').origin))",
        ])
        .output()
        .expect("the venv's python runs");
    assert!(
        site.status.success(),
        "torch is not importable from {}: {}",
        venv.display(),
        describe(&site)
    );
    let torch_dir = PathBuf::from(String::from_utf8_lossy(&site.stdout).trim());
    // Generated at test time from the wheel's own imports (never committed).
    let stubs = profile_dir().join(format!("torch-stubs/torch-{version}"));
    let gen = Command::new("python3")
        .arg(repo_root().join("scripts/torch-stubs.py"))
        .arg("--torch-lib")
        .arg(torch_dir.join("lib"))
        .arg("--out")
        .arg(&stubs)
        .output()
        .expect("python3 runs scripts/torch-stubs.py");
    assert!(
        gen.status.success(),
        "torch-stubs.py failed: {}",
        describe(&gen)
    );
    let cuda_major = if version.starts_with("2.10.") { 12 } else { 13 };
    let Some(sim) = sim_dir_for(cuda_major) else {
        eprintln!(
            "SKIP: torch {version} needs the CUDA {cuda_major} simulated stack: build it with \
             scripts/build-sim-cuda13.sh --release (scripts/test.sh does)"
        );
        return None;
    };
    Some(Torch {
        sim,
        version,
        cuda_major,
        torchrun: venv.join("bin/torchrun"),
        python,
        stubs,
    })
}

impl Torch {
    /// A script of tests/torch.
    pub fn script(name: &str) -> PathBuf {
        repo_root().join("tests/torch").join(name)
    }

    fn library_path(&self) -> String {
        format!("{}:{}", self.sim.display(), self.stubs.display())
    }

    /// `program ARGS` on the simulated stack, without tracing.
    pub fn plain(&self, program: &Path, args: &[&Path]) -> Output {
        let mut c = Command::new(program);
        c.args(args)
            .env("LD_LIBRARY_PATH", self.library_path())
            .env_remove("LD_PRELOAD")
            .env_remove("TTRACE_SOCKET");
        c.output().expect("the program runs")
    }

    /// `LD_PRELOAD=libttrace.so TTRACE_OUT=STORE program ARGS` on the simulated stack, no
    /// wrapper: the job's first traced process starts a collector (in a private
    /// `XDG_RUNTIME_DIR` next to the store), which finalises the store once the job is gone;
    /// returns once it is.
    pub fn bare(&self, store: &Path, program: &Path, args: &[&Path]) -> Output {
        use std::os::unix::fs::DirBuilderExt;
        let xdg = store.with_extension("xdg");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&xdg)
            .expect("collector dir");
        let mut c = Command::new(program);
        c.args(args)
            .env("LD_LIBRARY_PATH", self.library_path())
            .env("LD_PRELOAD", profile_dir().join("libttrace.so"))
            .env("TTRACE_OUT", store)
            .env("XDG_RUNTIME_DIR", &xdg)
            .env("TTRACE_COLLECTOR_LINGER", "0.5")
            .env("TTRACE_COLLECTOR_IDLE", "2")
            .env_remove("TTRACE")
            .env_remove("TTRACE_SOCKET")
            .env_remove("TTRACE_JOB")
            .env_remove("TTRACE_PERTURB");
        let out = c.output().expect("the program runs");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !ttrace_format::store::Manifest::read(store).is_ok_and(|m| m.finalized) {
            assert!(
                std::time::Instant::now() < deadline,
                "the collector did not finalise {}: {}",
                store.display(),
                describe(&out)
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        out
    }

    /// `ttrace run --out STORE -- program ARGS` on the simulated stack.
    pub fn traced(&self, store: &Path, program: &Path, args: &[&Path]) -> Output {
        self.traced_with(store, &[], program, args)
    }

    /// `ttrace run OPTIONS --out STORE -- program ARGS` on the simulated stack.
    pub fn traced_with(
        &self,
        store: &Path,
        options: &[&str],
        program: &Path,
        args: &[&Path],
    ) -> Output {
        let mut c = Command::new(bin("ttrace"));
        c.env("LD_LIBRARY_PATH", self.library_path())
            .env_remove("TTRACE_LIB")
            .env_remove("TTRACE_DAEMON")
            .env_remove("TTRACE_PERTURB")
            .env_remove("LD_PRELOAD")
            // Info level: libttrace.so names the CUDA runtime it attached to.
            .env("TTRACE_LOG", "info")
            .arg("run")
            .args(options)
            .arg("--out")
            .arg(store)
            .arg("--")
            .arg(program)
            .args(args);
        c.output().expect("ttrace runs")
    }
}

/// One tensor as torch saw it: its name (`<index>_<label>`) and raw bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct Saved {
    pub name: String,
    pub bytes: Vec<u8>,
}

impl Saved {
    /// The label (the name without its index).
    pub fn label(&self) -> &str {
        self.name.split_once('_').map_or(&self.name, |(_, l)| l)
    }
}

/// What a script saved in `dir` (torch.json and the `.bin` files), in order.
pub fn saved(dir: &Path) -> Vec<Saved> {
    let index = std::fs::read_to_string(dir.join("torch.json"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join("torch.json").display()));
    let list: Vec<serde_json::Value> = serde_json::from_str(&index).expect("torch.json is JSON");
    list.iter()
        .map(|e| {
            let name = e["name"].as_str().expect("name").to_string();
            let bytes = std::fs::read(dir.join(format!("{name}.bin"))).expect("tensor bytes");
            Saved { name, bytes }
        })
        .collect()
}

/// One exported tensor.
#[derive(Debug)]
pub struct Captured {
    pub rank: u32,
    pub api: String,
    pub role: String,
    pub bytes: Vec<u8>,
}

/// `ttrace export STORE --format safetensors` read back: every captured tensor.
pub fn export(store: &Path, out: &Path) -> Vec<Captured> {
    let o = Command::new(bin("ttrace"))
        .arg("export")
        .arg(store)
        .args(["--format", "safetensors", "--out"])
        .arg(out)
        .output()
        .expect("ttrace export runs");
    assert!(o.status.success(), "ttrace export: {}", describe(&o));
    let mut all = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(out)
        .expect("export dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    for f in files {
        all.extend(read_safetensors(&f));
    }
    all
}

/// Parses a safetensors file (8-byte little-endian header length, JSON header, data); tensor
/// names are `rank<r>/step<s>/seq<q>/<api>/<role>[@nvtx]`.
fn read_safetensors(path: &Path) -> Vec<Captured> {
    let data = std::fs::read(path).expect("safetensors file");
    let n = u64::from_le_bytes(data[..8].try_into().expect("8 bytes")) as usize;
    let header: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&data[8..8 + n]).expect("safetensors header");
    let body = &data[8 + n..];
    let mut out = Vec::new();
    for (name, v) in header {
        if name == "__metadata__" {
            continue;
        }
        let offs = v["data_offsets"].as_array().expect("data_offsets");
        let (a, b) = (
            offs[0].as_u64().expect("start") as usize,
            offs[1].as_u64().expect("end") as usize,
        );
        let path_part = name.split('@').next().unwrap_or(&name);
        let parts: Vec<&str> = path_part.split('/').collect();
        assert!(parts.len() >= 5, "unexpected tensor name {name}");
        out.push(Captured {
            rank: parts[0].trim_start_matches("rank").parse().expect("rank"),
            api: parts[3].to_string(),
            role: parts[4].to_string(),
            bytes: body[a..b].to_vec(),
        });
    }
    out
}

/// Whether some captured tensor of `rank` whose API and role satisfy `pick` has exactly `bytes`.
pub fn captured_as(
    cap: &[Captured],
    rank: u32,
    bytes: &[u8],
    pick: impl Fn(&str, &str) -> bool,
) -> bool {
    cap.iter()
        .any(|c| c.rank == rank && pick(&c.api, &c.role) && c.bytes == bytes)
}

/// Asserts `ttrace check STORE` exits 0 and reports no finding.
pub fn check_is_silent(store: &Path) {
    let o = Command::new(bin("ttrace"))
        .arg("check")
        .arg(store)
        .output()
        .expect("ttrace check runs");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && text.contains("no finding"),
        "ttrace check is not silent: {}",
        describe(&o)
    );
}
