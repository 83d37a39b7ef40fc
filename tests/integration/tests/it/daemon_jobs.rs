//! Jobs kept apart and sockets trusted only when they should be: a one-store daemon refuses a
//! second job (its ranks would share segments), a collector gives each job its own store; a
//! daemon never deletes a file at its socket path that is not a socket; a process never hands
//! its snapshot ring to a listener running as another user.

use crate::intercept_util;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use integration_tests::{bin, describe, sim_dir, TempDir};
use intercept_util::{libttrace, read_store};
use ttrace_format::store::Manifest;

/// A child killed (and reaped) when dropped.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ttraced(args: &[&str], socket: &Path) -> KillOnDrop {
    let child = Command::new(bin("ttraced"))
        .args(args)
        .arg("--socket")
        .arg(socket)
        .stderr(Stdio::null())
        .spawn()
        .expect("ttraced starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(Instant::now() < deadline, "ttraced did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    KillOnDrop(child)
}

/// `ttrace run --daemon SOCKET -- trainer --steps 1 --seed SEED` in `cwd`.
fn joined(socket: &Path, cwd: &Path, seed: &str) -> Output {
    Command::new(bin("ttrace"))
        .current_dir(cwd)
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("TTRACE_LIB", libttrace())
        .env_remove("LD_PRELOAD")
        .env_remove("TTRACE_DAEMON")
        .args(["run", "--quiet", "--daemon"])
        .arg(socket)
        .arg("--")
        .arg(bin("trainer"))
        .args(["--steps", "1", "--seed", seed])
        .output()
        .expect("ttrace run starts")
}

fn stop(mut d: KillOnDrop) {
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(d.0.id() as i32, libc::SIGTERM) };
    let st = d.0.wait().expect("ttraced ends");
    assert!(st.success(), "ttraced {st}");
}

#[test]
fn a_one_store_daemon_refuses_a_second_job_and_a_collector_keeps_jobs_apart() {
    let dir = TempDir::new("jobs");
    let store = dir.path().join("one");
    let d = ttraced(
        &["--store", store.to_str().expect("utf-8")],
        &dir.path().join("s/one.sock"),
    );
    let first = joined(&dir.path().join("s/one.sock"), dir.path(), "1");
    assert!(first.status.success(), "{}", describe(&first));
    let second = joined(&dir.path().join("s/one.sock"), dir.path(), "2");
    assert!(
        second.status.success(),
        "the job runs on: {}",
        describe(&second)
    );
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("refused") && err.contains("of job"), "{err}");
    stop(d);
    let m = Manifest::read(&store).expect("manifest");
    assert!(m.finalized);
    assert_eq!(m.ranks.len(), 1, "only the first job's rank: {:?}", m.ranks);
    assert!(m.job.expect("job").id.starts_with("ttrace:"));

    // The same two jobs through a collector: a store each, under their working directory.
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&cwd).expect("cwd");
    let sock = dir.path().join("s/collector.sock");
    let c = ttraced(&["--job-linger", "0.2", "--idle-exit", "0"], &sock);
    for seed in ["1", "2"] {
        let o = joined(&sock, &cwd, seed);
        assert!(o.status.success(), "{}", describe(&o));
        assert!(o.stderr.is_empty() || !String::from_utf8_lossy(&o.stderr).contains("refused"));
    }
    stop(c);
    let stores: Vec<_> = std::fs::read_dir(cwd.join("ttrace-runs"))
        .expect("stores")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(stores.len(), 2, "{stores:?}");
    let mut ids = Vec::new();
    for s in &stores {
        let m = Manifest::read(s).expect("manifest");
        assert!(
            m.finalized && m.ranks.len() == 1 && m.ranks[0].clean_exit,
            "{m:?}"
        );
        assert!(!read_store(s).is_empty());
        ids.push(m.job.expect("job").id);
    }
    assert_ne!(ids[0], ids[1]);
}

#[test]
fn ttraced_never_deletes_a_file_that_is_not_its_socket() {
    let dir = TempDir::new("not-a-socket");
    let file = dir.path().join("precious");
    std::fs::write(&file, b"keep me").expect("write");
    for args in [vec!["--store", "st"], vec![]] {
        let o = Command::new(bin("ttraced"))
            .current_dir(dir.path())
            .args(&args)
            .arg("--socket")
            .arg(&file)
            .output()
            .expect("ttraced starts");
        assert!(!o.status.success(), "{}", describe(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("not a socket"),
            "{}",
            describe(&o)
        );
        assert_eq!(std::fs::read(&file).expect("still there"), b"keep me");
    }
}

#[test]
fn a_listener_of_another_user_never_receives_the_ring() {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped: an impostor of another uid needs root to start");
        return;
    }
    let dir = TempDir::new("impostor");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let sock = dir.path().join("ttraced.sock");
    let got = dir.path().join("got");
    // The impostor: uid 65534, listens, records whether anybody sent it anything.
    let script = format!(
        "import os,socket\nos.setgid(65534)\nos.setuid(65534)\ns=socket.socket(socket.AF_UNIX)\n\
         s.bind({sock:?})\ns.listen(8)\nc,_=s.accept()\nd=c.recv(65536)\n\
         open({got:?},'w').write(str(len(d)))\n",
        sock = sock.display().to_string(),
        got = got.display().to_string()
    );
    let imp = Command::new("python3")
        .arg("-c")
        .arg(script)
        .spawn()
        .expect("python3 starts");
    let _imp = KillOnDrop(imp);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "the impostor did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = Command::new(bin("trainer"))
        .args(["--steps", "1"])
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("LD_PRELOAD", libttrace())
        .env("TTRACE_SOCKET", &sock)
        .output()
        .expect("trainer starts");
    assert!(o.status.success(), "{}", describe(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("runs as uid 65534"), "{err}");
    // The impostor saw a connection with nothing on it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !got.exists() {
        assert!(
            Instant::now() < deadline,
            "the impostor never saw the connection close"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(std::fs::read_to_string(&got).expect("got"), "0");
}
