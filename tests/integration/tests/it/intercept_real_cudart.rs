//! libttrace.so in front of NVIDIA's real `libcudart.so.12` on a machine without a GPU: the
//! program gets the runtime's own errors, unchanged, and does not crash, with capture off and
//! on (on: the session cannot page-lock its ring, so capture disables itself with one line).
//!
//! The runtime comes from the `nvidia-cuda-runtime-cu12==12.8.90` wheel, fetched with
//! `pip download` on the first run into `target/nvidia-cudart-12.8.90/` (never committed). No
//! network and no cache is a failure: the check is the point of the test.

use crate::intercept_util;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use integration_tests::{describe, profile_dir};
use intercept_util::*;

const WHEEL: &str = "nvidia-cuda-runtime-cu12==12.8.90";

/// A C program that calls hooked and unhooked runtime functions and prints their results and
/// the last-error state. Prototypes are spelled by hand: no headers needed.
const PROGRAM: &str = r#"
#include <stdio.h>
#include <stddef.h>
typedef int cudaError_t;
typedef void* cudaStream_t;
extern cudaError_t cudaGetDeviceCount(int*);
extern cudaError_t cudaMemcpy(void*, const void*, size_t, int);
extern cudaError_t cudaMemcpyAsync(void*, const void*, size_t, int, cudaStream_t);
extern cudaError_t cudaMemcpy2DAsync(void*, size_t, const void*, size_t, size_t, size_t, int, cudaStream_t);
extern cudaError_t cudaLaunchHostFunc(cudaStream_t, void (*)(void*), void*);
extern cudaError_t cudaPeekAtLastError(void);
extern cudaError_t cudaGetLastError(void);
extern const char* cudaGetErrorName(cudaError_t);
static void host_fn(void* p) { (void)p; }
int main(void) {
    int n = -1;
    char src[64] = {1}, dst[64];
    cudaError_t a = cudaGetDeviceCount(&n);
    cudaError_t b = cudaMemcpy(dst, src, 64, 4);
    cudaError_t c = cudaMemcpyAsync(dst, src, 64, 1, 0);
    cudaError_t d = cudaMemcpy2DAsync(dst, 16, src, 16, 8, 4, 2, 0);
    cudaError_t e = cudaLaunchHostFunc(0, host_fn, 0);
    cudaError_t peek = cudaPeekAtLastError();
    cudaError_t last = cudaGetLastError();
    printf("count=%d n=%d memcpy=%d async=%d 2d=%d hostfn=%d peek=%d last=%d (%s)\n",
           a, n, b, c, d, e, peek, last, cudaGetErrorName(a));
    return 0;
}
"#;

/// The real runtime, fetched once.
fn real_cudart() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = profile_dir()
            .parent()
            .expect("target dir")
            .join("nvidia-cudart-12.8.90");
        let lib = dir.join("libcudart.so.12");
        if lib.exists() {
            return dir;
        }
        std::fs::create_dir_all(&dir).expect("cache dir");
        let wheels = dir.join("wheel");
        let out = Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
            .args(["--platform", "manylinux2014_x86_64", "--python-version", "3.11", "-d"])
            .arg(&wheels)
            .arg(WHEEL)
            .output()
            .expect("python3 runs");
        assert!(out.status.success(), "pip download {WHEEL} failed:\n{}", describe(&out));
        let wheel = std::fs::read_dir(&wheels)
            .expect("wheel dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
            .expect("a wheel");
        // A wheel is a zip: extract the one library with Python's zipfile (CRC-checked).
        let script = format!(
            "import zipfile,shutil\nz=zipfile.ZipFile({wheel:?})\n\
             with z.open('nvidia/cuda_runtime/lib/libcudart.so.12') as s, open({lib:?},'wb') as d: shutil.copyfileobj(s,d)"
        );
        let out = Command::new("python3")
            .arg("-c")
            .arg(script)
            .output()
            .expect("python3 runs");
        assert!(out.status.success(), "extracting libcudart:\n{}", describe(&out));
        dir
    })
}

fn program() -> PathBuf {
    let dir = real_cudart();
    let src = dir.join("prog.c");
    let exe = dir.join("prog");
    std::fs::write(&src, PROGRAM).expect("write the program");
    let out = Command::new("gcc")
        .args(["-std=c11", "-O1", "-Wall", "-Werror"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(dir)
        .arg("-l:libcudart.so.12")
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .output()
        .expect("gcc runs");
    assert!(out.status.success(), "gcc:\n{}", describe(&out));
    exe
}

#[test]
fn nvidia_runtime_errors_pass_through_unchanged_without_a_gpu() {
    let exe = program();
    let plain = Command::new(&exe).output().expect("runs");
    assert!(plain.status.success(), "{}", describe(&plain));
    let line = String::from_utf8_lossy(&plain.stdout).into_owned();
    assert!(
        !line.contains("count=0 "),
        "no GPU here, the runtime must fail: {line}"
    );

    // Preloaded, capture off (TTRACE=0).
    let off = Command::new(&exe)
        .env("LD_PRELOAD", libttrace())
        .env("TTRACE", "0")
        .output()
        .expect("runs");
    assert!(off.status.success(), "{}", describe(&off));
    assert_eq!(off.stdout, plain.stdout);
    assert!(off.stderr.is_empty(), "{}", describe(&off));

    // Preloaded with a daemon: the ring cannot be page-locked without a driver.
    let dir = TempDir::new("real-cudart");
    let h = ttraced::Daemon::start(ttraced::Config::new(
        dir.path().join("sock/ttraced.sock"),
        dir.path().join("store"),
    ))
    .expect("daemon");
    let on = Command::new(&exe)
        .env("LD_PRELOAD", libttrace())
        .env("TTRACE_SOCKET", h.socket())
        .output()
        .expect("runs");
    let summary = h
        .finalize(Some(0), Duration::from_secs(5))
        .expect("finalize");
    assert!(on.status.success(), "{}", describe(&on));
    assert_eq!(on.stdout, plain.stdout, "{}", describe(&on));
    let err = stderr(&on);
    assert_eq!(err.lines().count(), 1, "one log line:\n{err}");
    assert!(
        err.contains("capture disabled") && err.contains("cudaHostRegister"),
        "{err}"
    );
    assert_eq!(summary.processes.len(), 0, "it never connected");
}

#[test]
fn the_library_needs_no_cuda_library() {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(libttrace())
        .output()
        .expect("readelf runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = text.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert!(!needed.is_empty(), "{text}");
    for l in needed {
        for lib in ["cudart", "cublas", "nccl", "nvToolsExt", "libcuda"] {
            assert!(!l.contains(lib), "DT_NEEDED on a CUDA library: {l}");
        }
    }
}
