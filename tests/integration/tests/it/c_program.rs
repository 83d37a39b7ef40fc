//! The C smoke program (`tests/integration/c/smoke.c`), written only against NVIDIA's headers:
//! compiled with gcc against the fetched headers, linked to the simulated libraries by soname
//! (as to NVIDIA's), and run as two ranks under `simrun`. Needs the workspace built (the
//! simulated libraries and `simrun`), gcc, and the headers (fetched on the first run).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use integration_tests::c_build::{compile_c, CUDA12_SONAMES};
use integration_tests::{bin, describe, profile_dir, sim_dir};

/// Compiles the program once per test binary; returns the executable.
fn smoke_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| compile_c("smoke.c", "smoke", 12, &sim_dir(), &CUDA12_SONAMES))
}

/// Runs `cmd` with a time limit (SIGTERM, then SIGKILL, when it runs over) and returns its
/// output, read from files so that no pipe can fill up.
fn run_limited(mut cmd: Command, name: &str, limit: Duration) -> Output {
    let dir = profile_dir().join("c-smoke");
    let (out_path, err_path) = (
        dir.join(format!("{name}.out")),
        dir.join(format!("{name}.err")),
    );
    let out_f = std::fs::File::create(&out_path).expect("create stdout file");
    let err_f = std::fs::File::create(&err_path).expect("create stderr file");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out_f)
        .stderr(err_f)
        .spawn()
        .expect("the program starts");
    let start = Instant::now();
    let mut termed = false;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        let elapsed = start.elapsed();
        if elapsed > limit && !termed {
            let pid = libc::pid_t::try_from(child.id()).expect("pid fits");
            // SAFETY: kill(2) on our own unreaped child; simrun forwards it to the ranks.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            termed = true;
        }
        if elapsed > limit + Duration::from_secs(10) {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = Output {
        status,
        stdout: std::fs::read(&out_path).expect("read stdout"),
        stderr: std::fs::read(&err_path).expect("read stderr"),
    };
    assert!(!termed, "{name} ran over {limit:?}:\n{}", describe(&out));
    out
}

#[test]
fn links_the_simulated_libraries_by_soname() {
    let exe = smoke_exe();
    let out = Command::new("readelf")
        .arg("-d")
        .arg(exe)
        .output()
        .expect("readelf runs");
    assert!(out.status.success(), "{}", describe(&out));
    let dynamic = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = dynamic
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next())
        .collect();
    for so in CUDA12_SONAMES {
        assert!(needed.contains(&so), "DT_NEEDED lacks {so}: {needed:?}");
    }
    // Nothing by path or by an unversioned development name.
    for n in &needed {
        assert!(!n.contains('/') && !n.ends_with(".so"), "DT_NEEDED {n}");
    }
    let sim = sim_dir();
    assert!(
        dynamic
            .lines()
            .any(|l| (l.contains("(RUNPATH)") || l.contains("(RPATH)"))
                && l.contains(&*sim.to_string_lossy())),
        "no run path to {}:\n{dynamic}",
        sim.display()
    );
}

#[test]
fn runs_as_two_ranks_under_simrun() {
    let exe = smoke_exe();
    let mut cmd = Command::new(bin("simrun"));
    cmd.args(["--nproc-per-node", "2", "--grace-period", "5", "--"])
        .arg(exe)
        // The run path finds the libraries; no library path, no preloads from the caller.
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD")
        .env_remove("NCCL_COMM_ID");
    let out = run_limited(cmd, "two-ranks", Duration::from_secs(120));
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for rank in 0..2 {
        for what in [
            format!("smoke: rank {rank}: cublasGemmEx bf16"),
            format!("smoke: rank {rank}: cublasLtMatmul FP8 E4M3 TN"),
            format!("smoke: rank {rank}: ncclAllReduce sum over 2 ranks ok"),
            format!("smoke: rank {rank} of 2 OK"),
        ] {
            assert!(
                stdout.contains(&what),
                "missing `{what}`:\n{}",
                describe(&out)
            );
        }
    }
}

#[test]
fn runs_as_a_single_process() {
    let exe = smoke_exe();
    let mut cmd = Command::new(exe);
    for v in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NCCL_COMM_ID",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
    ] {
        cmd.env_remove(v);
    }
    let out = run_limited(cmd, "single", Duration::from_secs(60));
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("smoke: rank 0 of 1 OK"),
        "{}",
        describe(&out)
    );
}
