//! include/ttrace.h from C: a program using its macros runs untraced (the weak references are
//! null) and, traced with `TTRACE_STEP_RULE=api`, its `TTRACE_STEP()` starts a step and
//! `TTRACE_PAUSE()`/`TTRACE_RESUME()` leave out the copies between them.

use crate::intercept_util;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use integration_tests::abi_check::repo_root;
use integration_tests::{describe, profile_dir, sim_dir};
use intercept_util::*;
use ttrace_format::record::Op;

const PROGRAM: &str = r#"
#include <stdio.h>
#include <stddef.h>
#include "ttrace.h"
typedef int cudaError_t;
extern cudaError_t cudaMalloc(void**, size_t);
extern cudaError_t cudaMemcpy(void*, const void*, size_t, int);
static int copy(void* d, int v) {
    char h[256];
    for (int i = 0; i < 256; i++) h[i] = (char)(v + i);
    return cudaMemcpy(d, h, sizeof h, 1);
}
int main(void) {
    void* d = 0;
    int bad = cudaMalloc(&d, 256);
    bad |= copy(d, 1);
    TTRACE_STEP();
    bad |= copy(d, 2);
    TTRACE_PAUSE();
    bad |= copy(d, 3);
    TTRACE_RESUME();
    bad |= copy(d, 4);
    printf("c api %s\n", bad ? "FAILED" : "OK");
    return bad != 0;
}
"#;

fn program() -> PathBuf {
    let dir = profile_dir().join("intercept-c-api");
    std::fs::create_dir_all(&dir).expect("dir");
    let (src, exe) = (dir.join("api.c"), dir.join("api"));
    std::fs::write(&src, PROGRAM).expect("write");
    let sim = sim_dir();
    let out = Command::new("gcc")
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(repo_root().join("include"))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&sim)
        .arg("-l:libcudart.so.12")
        .arg(format!("-Wl,-rpath,{}", sim.display()))
        .output()
        .expect("gcc runs");
    assert!(out.status.success(), "gcc:\n{}", describe(&out));
    exe
}

#[test]
fn the_header_marks_steps_and_pauses_capture() {
    let exe = program();
    let plain = Command::new(&exe).output().expect("runs");
    assert!(plain.status.success(), "{}", describe(&plain));
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "c api OK\n");

    let dir = TempDir::new("c-api");
    let h = ttraced::Daemon::start(ttraced::Config::new(
        dir.path().join("sock/ttraced.sock"),
        dir.path().join("store"),
    ))
    .expect("daemon");
    let out = Command::new(&exe)
        .env("LD_PRELOAD", libttrace())
        .env("TTRACE_SOCKET", h.socket())
        .env("TTRACE_STEP_RULE", "api")
        .output()
        .expect("runs");
    let store = h.store().to_path_buf();
    h.finalize(Some(0), Duration::from_secs(10))
        .expect("finalize");
    assert!(out.status.success(), "{}", describe(&out));
    let recs = read_store(&store);
    let got: Vec<(u64, u8)> = recs
        .iter()
        .map(|r| {
            assert!(matches!(r.record.op, Op::Memcpy(_)));
            (r.record.step, r.bytes[0].as_ref().expect("captured")[0])
        })
        .collect();
    // Copy 3 ran while paused.
    assert_eq!(got, vec![(0, 1), (1, 2), (1, 4)]);
}
