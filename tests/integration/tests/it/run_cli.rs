//! `ttrace run`: exit codes, signal forwarding, the embedded collector, joining a standalone
//! ttraced. A producer stands in for libttrace.so (examples/loadgen speaks the protocol and
//! finds the collector through TTRACE_SOCKET, as the library does); commands that make no CUDA
//! call only need *a* loadable library to preload.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use integration_tests::{bin, describe, profile_dir};
use ttrace_format::reader::Segment;
use ttrace_format::store::{segment_path, Manifest};

/// A private scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "ttrace-run-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The library `ttrace run` preloads: libttrace.so when built, else a stand-in that is just
/// as inert in processes that never call CUDA (the simulated NVTX library).
fn preload_lib() -> PathBuf {
    let real = profile_dir().join("libttrace.so");
    if real.exists() {
        real
    } else {
        integration_tests::sim_dir().join("libnvToolsExt.so.1")
    }
}

fn ttrace(dir: &Path) -> Command {
    let mut c = Command::new(bin("ttrace"));
    c.current_dir(dir)
        .env("TTRACE_LIB", preload_lib())
        .env("LD_LIBRARY_PATH", integration_tests::sim_dir())
        .env_remove("TTRACE_DAEMON")
        .env_remove("LD_PRELOAD");
    c
}

/// A child killed (and reaped) when dropped, so a failing test leaves no daemon behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn loadgen() -> PathBuf {
    let p = profile_dir().join("examples").join("loadgen");
    assert!(
        p.exists(),
        "{} is missing: cargo build --release --examples -p ttraced",
        p.display()
    );
    p
}

fn records_in(store: &Path, rank: u32) -> u64 {
    let mut n = 0;
    for step in 0.. {
        let seg = segment_path(store, rank, step);
        if !seg.exists() {
            break;
        }
        let r = Segment::open(&seg).expect("segment");
        assert!(
            r.issues().iter().all(|i| !i.kind.loses_data()),
            "{:?}",
            r.issues()
        );
        for f in r.records() {
            f.expect("intact frame");
            n += 1;
        }
    }
    n
}

#[test]
fn the_exit_code_is_the_commands_and_the_manifest_records_the_run() {
    let s = Scratch::new("exit");
    let out = ttrace(&s.0)
        .args([
            "run", "--out", "store", "--steps", "0-3", "--", "sh", "-c", "exit 3",
        ])
        .output()
        .expect("ttrace runs");
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("exited with 3"), "{stderr}");
    let m = Manifest::read(&s.0.join("store")).expect("manifest");
    assert!(m.finalized);
    assert_eq!(m.exit_code, Some(3));
    assert_eq!(m.command, vec!["sh", "-c", "exit 3"]);
    assert_eq!(
        Path::new(&m.cwd),
        s.0.canonicalize().expect("canonical").as_path()
    );
    assert!(m.env["LD_PRELOAD"].ends_with(&preload_lib().display().to_string()));
    assert_eq!(m.env["TTRACE_STEPS"], "0-3");
    assert!(m.env.contains_key("TTRACE_SOCKET"));
    assert_eq!(
        m.config.steps.as_ref().map(|r| r.to_string()),
        Some("0-3".into())
    );
    assert!(m.ranks.is_empty(), "no process made a CUDA call");
}

#[test]
fn death_by_a_signal_is_128_plus_its_number() {
    let s = Scratch::new("sig");
    let out = ttrace(&s.0)
        .args(["run", "--out", "st", "--", "sh", "-c", "kill -9 $$"])
        .output()
        .expect("ttrace runs");
    assert_eq!(out.status.code(), Some(137), "{}", describe(&out));
}

#[test]
fn a_missing_command_or_library_is_reported() {
    let s = Scratch::new("missing");
    let out = ttrace(&s.0)
        .args(["run", "--out", "st", "--", "/nonexistent/cmd"])
        .output()
        .expect("ttrace runs");
    assert_eq!(out.status.code(), Some(127), "{}", describe(&out));
    let out = ttrace(&s.0)
        .env("TTRACE_LIB", "/nonexistent/libttrace.so")
        .args(["run", "--", "true"])
        .output()
        .expect("ttrace runs");
    assert_eq!(out.status.code(), Some(125), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TTRACE_LIB"));
    let out = ttrace(&s.0)
        .args(["run", "--steps", "3-1", "--", "true"])
        .output()
        .expect("ttrace runs");
    // A malformed option is a usage error, as for every other option.
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--steps"));
}

/// Starts `ttrace run -- CMD` with CMD printing `ready` once it is set up, waits for that.
fn started(dir: &Path, out: &str, script: &str) -> std::process::Child {
    let mut child = ttrace(dir)
        .args(["run", "--out", out, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("ttrace starts");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().expect("stdout"))
        .read_line(&mut line)
        .expect("reads");
    assert_eq!(line.trim(), "ready");
    child
}

fn wait_at_most(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return st;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("ttrace did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_and_sigint_are_forwarded_to_the_command() {
    let s = Scratch::new("fwd");
    // The command turns SIGTERM into exit 42.
    let mut child = started(
        &s.0,
        "st1",
        "trap 'exit 42' TERM; echo ready; while :; do sleep 0.05; done",
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = wait_at_most(&mut child, Duration::from_secs(20));
    assert_eq!(st.code(), Some(42), "{st:?}");
    // A command with default dispositions dies of the forwarded SIGINT: 128 + 2.
    let mut child = started(&s.0, "st2", "echo ready; exec sleep 30");
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let st = wait_at_most(&mut child, Duration::from_secs(20));
    assert_eq!(st.code(), Some(130), "{st:?}");
}

#[test]
fn processes_under_a_launcher_are_traced_into_the_embedded_store() {
    let s = Scratch::new("embedded");
    let out: Output = ttrace(&s.0)
        .args(["run", "--out", "store", "--"])
        .arg(bin("simrun"))
        .args(["--nproc-per-node", "2", "--"])
        .arg(loadgen())
        .args(["publish", "--records", "25", "--per-step", "10"])
        .output()
        .expect("ttrace runs");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let store = s.0.join("store");
    for rank in [0, 1] {
        assert_eq!(records_in(&store, rank), 25, "rank {rank}");
    }
    let m = Manifest::read(&store).expect("manifest");
    assert!(m.finalized);
    assert_eq!(
        m.ranks
            .iter()
            .map(|r| (r.rank, r.records, r.clean_exit))
            .collect::<Vec<_>>(),
        vec![(0, 25, true), (1, 25, true)]
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ranks     2 (2 processes), steps 3, records 50, gaps 0"),
        "{stderr}"
    );
    assert!(stderr.contains("ratio"), "{stderr}");
}

#[test]
fn ttrace_run_joins_a_standalone_ttraced() {
    let s = Scratch::new("joined");
    let socket = s.0.join("sock").join("d.sock");
    let store = s.0.join("store");
    let mut daemon = KillOnDrop(
        Command::new(bin("ttraced"))
            .arg("--socket")
            .arg(&socket)
            .arg("--store")
            .arg(&store)
            .arg("--threads")
            .arg("1")
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("ttraced starts"),
    );
    let t = Instant::now();
    while !socket.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "ttraced never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for rank in ["0", "1"] {
        let out = ttrace(&s.0)
            .env("TTRACE_DAEMON", &socket)
            .args(["run", "--"])
            .arg(loadgen())
            .args(["publish", "--records", "12", "--rank", rank])
            .output()
            .expect("ttrace runs");
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("went to the ttraced"));
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(daemon.0.id() as i32, libc::SIGTERM) };
    let st = wait_at_most(&mut daemon.0, Duration::from_secs(20));
    assert!(st.success(), "{st:?}");
    assert_eq!((records_in(&store, 0), records_in(&store, 1)), (12, 12));
    let m = Manifest::read(&store).expect("manifest");
    assert!(m.finalized && m.ranks.len() == 2);
    assert!(!socket.exists(), "ttraced removes its socket");
}
