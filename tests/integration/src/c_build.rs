//! Building the C test programs of tests/integration/c: gcc against NVIDIA's headers (fetched
//! from PyPI, never committed), linked by soname to the simulated libraries, as a program
//! built against NVIDIA's libraries would be.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use crate::abi_check::{fetch_headers_for, repo_root};
use crate::{describe, profile_dir};

/// The CUDA 12 libraries a program using the runtime, cuBLAS, cuBLASLt, NCCL and NVTX links.
pub const CUDA12_SONAMES: [&str; 5] = [
    "libcudart.so.12",
    "libcublas.so.12",
    "libcublasLt.so.12",
    "libnccl.so.2",
    "libnvToolsExt.so.1",
];

/// Compiles `tests/integration/c/<source>` with gcc (C11, warnings as errors) against CUDA
/// `major`'s headers into `target/<profile>/c-<exe>/<exe>`, linked to the libraries `sonames`
/// found in `sim` (`-l:NAME` links that exact file; its SONAME becomes the DT_NEEDED entry),
/// with `sim` as the run path. Panics with gcc's output when it fails.
pub fn compile_c(source: &str, exe: &str, major: u32, sim: &Path, sonames: &[&str]) -> PathBuf {
    let include = fetch_headers_for(major).unwrap_or_else(|e| panic!("NVIDIA's headers: {e}"));
    let dir = profile_dir().join(format!("c-{exe}"));
    std::fs::create_dir_all(&dir).expect("create the output directory");
    let out_exe = dir.join(exe);
    let mut cc = Command::new("gcc");
    cc.args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror"]);
    for d in &include {
        cc.arg("-I").arg(d);
    }
    cc.arg(repo_root().join("tests/integration/c").join(source))
        .arg("-L")
        .arg(sim);
    for so in sonames {
        cc.arg(format!("-l:{so}"));
    }
    cc.arg(format!("-Wl,-rpath,{}", sim.display())).arg("-lm");
    build_once(cc, source, &out_exe);
    out_exe
}

/// Compiles `tests/integration/c/<source>` with gcc (C11, warnings as errors) against CUDA 12's
/// headers into the shared library `target/<profile>/c-<name>/lib<name>.so`, to be preloaded
/// beside libttrace.so (a profiler-style wrapper; its CUDA symbols resolve at run time). Panics
/// with gcc's output when it fails.
pub fn compile_preload_c(source: &str, name: &str) -> PathBuf {
    let include = fetch_headers_for(12).unwrap_or_else(|e| panic!("NVIDIA's headers: {e}"));
    let dir = profile_dir().join(format!("c-{name}"));
    std::fs::create_dir_all(&dir).expect("create the output directory");
    let lib = dir.join(format!("lib{name}.so"));
    let mut cc = Command::new("gcc");
    cc.args([
        "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
    ]);
    for d in &include {
        cc.arg("-I").arg(d);
    }
    cc.arg(repo_root().join("tests/integration/c").join(source));
    build_once(cc, source, &lib);
    lib
}

/// Runs `cc` (all but its `-o`) to make `out`, once per process and output, and so that a
/// program is never run while it is being written: tests running side by side that build the
/// same program share one build (the others wait for it), and the output is written under
/// another name and renamed into place, so a process of another `cargo test` run that executes the
/// old file is not refused with ETXTBSY ("text file busy") while gcc writes the new one.
/// Panics with gcc's output when it fails, or when the same output is asked for with other
/// arguments (two tests would then overwrite each other's program).
fn build_once(mut cc: Command, source: &str, out: &Path) {
    type Builds = Mutex<HashMap<PathBuf, (String, Arc<OnceLock<()>>)>>;
    static BUILDS: OnceLock<Builds> = OnceLock::new();
    let args = format!("{cc:?}");
    let once = {
        let mut builds = BUILDS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (built_with, once) = builds
            .entry(out.to_path_buf())
            .or_insert_with(|| (args.clone(), Arc::new(OnceLock::new())));
        assert_eq!(
            *built_with,
            args,
            "{} is built twice with different arguments",
            out.display()
        );
        once.clone()
    };
    once.get_or_init(|| {
        let partial = out.with_extension(format!("partial-{}", std::process::id()));
        let result = cc.arg("-o").arg(&partial).output().expect("gcc runs");
        assert!(
            result.status.success(),
            "gcc failed on {source}:\n{}",
            describe(&result)
        );
        std::fs::rename(&partial, out)
            .unwrap_or_else(|e| panic!("renaming {} into place: {e}", partial.display()));
    });
}
