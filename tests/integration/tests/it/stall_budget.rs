//! A stopped daemon delays a traced program by at most its stall budget
//! (`TTRACE_MAX_STALL_MS`): with the collector frozen (SIGSTOP) mid-run, the program runs to
//! its end without it; a process that starts while the collector is frozen gives up waiting
//! for its answer and runs untraced. Without the budget, each op would wait `TTRACE_WAIT_MS`
//! for ring space the frozen daemon never frees.

use crate::intercept_util;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use integration_tests::{bin, describe, sim_dir, TempDir};
use intercept_util::libttrace;

fn signal(pid: u32, sig: i32) {
    // SAFETY: a signal to a child of this test.
    unsafe { libc::kill(pid as i32, sig) };
}

/// Waits for `child`; if it has not ended after `limit`, resumes the daemon (so nothing
/// stays frozen) and fails.
fn wait_bounded(child: Child, limit: Duration, daemon: u32) -> Output {
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => {
            let _ = waiter.join();
            out.expect("wait")
        }
        Err(_) => {
            signal(daemon, libc::SIGCONT);
            panic!("the program was still waiting on the frozen daemon after {limit:?}");
        }
    }
}

fn traced_trainer(socket: &Path, steps: &str) -> Command {
    let mut c = Command::new(bin("trainer"));
    c.args(["--steps", steps])
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("LD_PRELOAD", libttrace())
        .env("TTRACE_SOCKET", socket)
        .env("TTRACE_RING_BYTES", "1048576")
        .env("TTRACE_WAIT_MS", "300")
        .env("TTRACE_MAX_STALL_MS", "2000")
        .env_remove("TTRACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

#[test]
fn a_frozen_daemon_delays_the_program_by_at_most_the_stall_budget() {
    let dir = TempDir::new("stall");
    let socket = dir.path().join("s/ttraced.sock");
    let store = dir.path().join("store");
    let mut daemon = Command::new(bin("ttraced"))
        .arg("--socket")
        .arg(&socket)
        .arg("--store")
        .arg(&store)
        .arg("--wait")
        .arg("1")
        .stderr(Stdio::null())
        .spawn()
        .expect("ttraced starts");
    let pid = daemon.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(Instant::now() < deadline, "ttraced did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Frozen mid-run: the program finishes on its own.
    let trainer = traced_trainer(&socket, "40")
        .spawn()
        .expect("trainer starts");
    let seg = store.join("rank00000/step000000.seg");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::metadata(&seg).is_ok_and(|m| m.len() > 4096) {
        assert!(Instant::now() < deadline, "nothing reached the store");
        std::thread::sleep(Duration::from_millis(5));
    }
    signal(pid, libc::SIGSTOP);
    let out = wait_bounded(trainer, Duration::from_secs(120), pid);
    assert!(out.status.success(), "{}", describe(&out));
    let steps = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("step "))
        .count();
    assert_eq!(steps, 40, "{}", describe(&out));

    // A process starting while the daemon is frozen does not wait for its answer for long.
    let late = traced_trainer(&socket, "1")
        .spawn()
        .expect("trainer starts");
    let out = wait_bounded(late, Duration::from_secs(60), pid);
    assert!(out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("capture disabled") && err.contains("no answer"),
        "{err}"
    );

    signal(pid, libc::SIGCONT);
    signal(pid, libc::SIGTERM);
    let st = daemon.wait().expect("ttraced ends");
    assert!(st.success(), "ttraced {st}");
}
