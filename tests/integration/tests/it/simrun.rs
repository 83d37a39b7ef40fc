//! `simrun`: the environment each rank sees, exit-code propagation, the grace period, signal
//! forwarding and output prefixing. The ranks are `sh -c` scripts, so these tests need only the
//! `simrun` binary (build it first: `cargo build -p simrun`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use integration_tests::{bin, describe};

/// `simrun --nproc-per-node N [EXTRA...] -- sh -c SCRIPT`.
fn simrun_sh(n: u32, extra: &[&str], script: &str) -> Command {
    let mut c = Command::new(bin("simrun"));
    c.arg("--nproc-per-node")
        .arg(n.to_string())
        .args(extra)
        .args(["--", "sh", "-c", script]);
    c
}

/// Waits for `child` at most `limit`; kills it and panics when it takes longer.
fn wait_within(child: &mut Child, limit: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait for simrun") {
            return st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("simrun did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `cmd` to completion (at most `limit`), capturing its output.
fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("simrun starts");
    // Drain the pipes on threads so that a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut v).map(|_| v)
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut err, &mut v).map(|_| v)
    });
    let status = wait_within(&mut child, limit);
    Output {
        status,
        stdout: t_out.join().expect("reader").expect("read stdout"),
        stderr: t_err.join().expect("reader").expect("read stderr"),
    }
}

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn ranks_get_torchrun_environment_and_the_rest_passes_through() {
    let script = r#"echo "$RANK|$WORLD_SIZE|$LOCAL_RANK|$LOCAL_WORLD_SIZE|$GROUP_RANK|$MASTER_ADDR|$MASTER_PORT|$TORCHELASTIC_RUN_ID|$SIMRUN_TEST_FOO|$LD_PRELOAD""#;
    let mut cmd = simrun_sh(3, &[], script);
    cmd.env("SIMRUN_TEST_FOO", "bar baz")
        .env("LD_PRELOAD", "/nonexistent/libsimrun-test.so");
    let out = output_within(cmd, LIMIT);
    assert!(out.status.success(), "{}", describe(&out));

    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut by_rank: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for line in stdout.lines() {
        let f: Vec<String> = line.split('|').map(str::to_string).collect();
        assert_eq!(f.len(), 10, "line {line:?}");
        let rank: u32 = f[0].parse().expect("RANK is a number");
        assert!(
            by_rank.insert(rank, f).is_none(),
            "rank {rank} twice:\n{stdout}"
        );
    }
    assert_eq!(by_rank.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
    let port = by_rank[&0][6].clone();
    let port_num: u16 = port.parse().expect("MASTER_PORT is a port number");
    assert_ne!(port_num, 0);
    let run_id = by_rank[&0][7].clone();
    assert!(!run_id.is_empty(), "TORCHELASTIC_RUN_ID is set");
    for (rank, f) in &by_rank {
        let expect = [
            rank.to_string(),
            "3".into(),
            rank.to_string(),
            "3".into(),
            "0".into(),
            "127.0.0.1".into(),
            port.clone(),
            run_id.clone(),
            "bar baz".into(),
            "/nonexistent/libsimrun-test.so".into(),
        ];
        assert_eq!(f.as_slice(), expect.as_slice(), "rank {rank}");
    }
}

#[test]
fn explicit_master_port_and_run_id_are_used() {
    let cmd = simrun_sh(
        2,
        &["--master-port", "29517", "--run-id", "job-7"],
        r#"echo "$MASTER_PORT $TORCHELASTIC_RUN_ID""#,
    );
    let out = output_within(cmd, LIMIT);
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().collect::<Vec<_>>(), vec!["29517 job-7"; 2]);
}

#[test]
fn all_ranks_succeeding_exits_zero() {
    let out = output_within(simrun_sh(4, &[], "exit 0"), LIMIT);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

#[test]
fn the_first_failure_exit_code_wins() {
    // Rank 1 fails first with 7; rank 0 fails later with 9: simrun reports 7 (not the lowest
    // rank's code, not the last one's).
    let script = r#"if [ "$RANK" = 1 ]; then exit 7; fi; sleep 0.5; exit 9"#;
    let out = output_within(simrun_sh(2, &[], script), LIMIT);
    assert_eq!(out.status.code(), Some(7), "{}", describe(&out));
}

#[test]
fn a_single_failing_rank_sets_the_exit_code() {
    let script = r#"if [ "$RANK" = 2 ]; then exit 3; fi; exit 0"#;
    let out = output_within(simrun_sh(3, &[], script), LIMIT);
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
}

#[test]
fn a_rank_killed_by_a_signal_exits_128_plus_signo() {
    let script = r#"if [ "$RANK" = 1 ]; then kill -KILL $$; fi; exit 0"#;
    let out = output_within(simrun_sh(2, &[], script), LIMIT);
    assert_eq!(out.status.code(), Some(128 + 9), "{}", describe(&out));
}

#[test]
fn survivors_are_terminated_after_the_grace_period() {
    // Rank 0 would run for a minute; rank 1 fails at once.
    let script = r#"if [ "$RANK" = 1 ]; then exit 5; fi; exec sleep 60"#;
    let start = Instant::now();
    let out = output_within(simrun_sh(2, &["--grace-period", "0.3"], script), LIMIT);
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "took {:?}",
        start.elapsed()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("SIGTERM"), "{}", describe(&out));
}

#[test]
fn survivors_ignoring_sigterm_are_killed() {
    // Rank 0 ignores SIGTERM (the disposition survives exec), so only SIGKILL ends it.
    let script = r#"if [ "$RANK" = 1 ]; then exit 4; fi; trap '' TERM; exec sleep 60"#;
    let start = Instant::now();
    let cmd = simrun_sh(
        2,
        &["--grace-period", "0.2", "--kill-timeout", "0.3"],
        script,
    );
    let out = output_within(cmd, LIMIT);
    assert_eq!(out.status.code(), Some(4), "{}", describe(&out));
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "took {:?}",
        start.elapsed()
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("SIGKILL"));
}

#[test]
fn sigterm_is_forwarded_to_every_rank() {
    // Each rank traps SIGTERM, says so and exits 42. The wait loop polls with short sleeps
    // because sh runs a trap only between commands.
    let script = r#"trap 'echo "term $RANK"; exit 42' TERM; echo "ready $RANK"; while :; do sleep 0.05; done"#;
    let mut child = simrun_sh(2, &[], script)
        .stdout(Stdio::piped())
        .spawn()
        .expect("simrun starts");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut ready = 0;
    while ready < 2 {
        let line = lines
            .next()
            .expect("a rank prints `ready` before any signal")
            .expect("read");
        assert!(line.starts_with("ready "), "unexpected line {line:?}");
        ready += 1;
    }
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits");
    // SAFETY: kill(2) on our own child, which has not been reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = wait_within(&mut child, LIMIT);
    let mut rest: Vec<String> = lines.map(|l| l.expect("read")).collect();
    rest.sort();
    assert_eq!(rest, vec!["term 0", "term 1"], "both ranks got SIGTERM");
    assert_eq!(status.code(), Some(42));
}

#[test]
fn sigterm_kills_ranks_that_keep_the_default_action() {
    let mut child = simrun_sh(2, &[], "exec sleep 60")
        .spawn()
        .expect("simrun starts");
    // Let the ranks start (exec sleep) before signalling.
    std::thread::sleep(Duration::from_millis(300));
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits");
    // SAFETY: kill(2) on our own child, which has not been reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = wait_within(&mut child, LIMIT);
    assert_eq!(status.code(), Some(128 + 15), "a rank killed by SIGTERM");
}

#[test]
fn prefix_output_labels_every_line() {
    let cmd = simrun_sh(
        2,
        &["--prefix-output"],
        r#"echo "hello"; echo "second line"; echo "oops" >&2; printf 'no newline'"#,
    );
    let out = output_within(cmd, LIMIT);
    assert!(out.status.success(), "{}", describe(&out));
    let mut stdout: Vec<_> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    stdout.sort();
    assert_eq!(
        stdout,
        vec![
            "[rank 0] hello",
            "[rank 0] no newline",
            "[rank 0] second line",
            "[rank 1] hello",
            "[rank 1] no newline",
            "[rank 1] second line",
        ]
    );
    let mut stderr: Vec<_> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::to_string)
        .collect();
    stderr.sort();
    assert_eq!(stderr, vec!["[rank 0] oops", "[rank 1] oops"]);
}

#[test]
fn output_passes_through_unprefixed_by_default() {
    let out = output_within(simrun_sh(1, &[], "echo plain"), LIMIT);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "plain\n");
}

#[test]
fn a_missing_program_exits_127() {
    let mut c = Command::new(bin("simrun"));
    c.args([
        "--nproc-per-node",
        "2",
        "--",
        "/nonexistent/simrun-test-program",
    ]);
    let out = output_within(c, LIMIT);
    assert_eq!(out.status.code(), Some(127), "{}", describe(&out));
}

#[test]
fn a_leftover_background_process_does_not_hold_simrun() {
    // The rank exits at once but leaves a sleeper holding the output pipe.
    let start = Instant::now();
    let out = output_within(
        simrun_sh(1, &["--prefix-output"], "echo before; sleep 30 & exit 0"),
        LIMIT,
    );
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[rank 0] before\n");
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "took {:?}",
        start.elapsed()
    );
}
