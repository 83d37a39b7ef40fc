//! `LD_PRELOAD=libttrace.so CMD` on its own, without `ttrace run`: the first traced process
//! starts the user's collector (one for eight ranks starting together), each job gets a store
//! of its own under `ttrace-runs/` of its working directory (or `TTRACE_OUT`), finalised once
//! the job is gone; what it holds equals what `ttrace run` captures for the same command.
//! Jobs started together stay apart; a collector killed mid-run leaves the job running
//! untraced and the store readable; a stale socket or lock is replaced; a socket directory
//! another user could enter is refused with one line, and `TTRACE=0` is a pure pass-through.

use crate::intercept_util;

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use integration_tests::{bin, describe, sim_dir, ttrace_run, TempDir};
use intercept_util::{libttrace, read_store, Rec};
use ttrace_format::store::Manifest;

/// A sandbox for one test: its own working directory and `XDG_RUNTIME_DIR` (so its own
/// collector), short linger and idle times.
struct Sandbox {
    dir: TempDir,
}

impl Sandbox {
    fn new(tag: &str) -> Sandbox {
        let dir = TempDir::new(tag);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir.path().join("xdg"))
            .expect("xdg dir");
        Sandbox { dir }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The collector's directory.
    fn collector_dir(&self) -> PathBuf {
        self.root().join("xdg/ttrace")
    }

    /// `CMD` with the bare preload, in the sandbox, cut off from the caller's job variables.
    fn bare(&self, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new(bin(program));
        c.args(args)
            .current_dir(self.root())
            .env("LD_PRELOAD", libttrace())
            .env("LD_LIBRARY_PATH", sim_dir())
            .env("XDG_RUNTIME_DIR", self.root().join("xdg"))
            .env("TTRACE_COLLECTOR_LINGER", "0.3")
            .env("TTRACE_COLLECTOR_IDLE", "2");
        for v in [
            "TTRACE",
            "TTRACE_SOCKET",
            "TTRACE_JOB",
            "TTRACE_OUT",
            "TTRACE_LIB",
            "TTRACE_DAEMON",
            "TTRACE_COLLECTOR",
            "TTRACE_PERTURB",
            "TTRACE_STEPS",
            "TTRACE_APIS",
            "SLURM_JOB_ID",
            "PMIX_NAMESPACE",
            "OMPI_MCA_ess_base_jobid",
            "TORCHELASTIC_RUN_ID",
            "RANK",
            "WORLD_SIZE",
        ] {
            c.env_remove(v);
        }
        c
    }

    /// The job stores under `ttrace-runs/`.
    fn stores(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(self.root().join("ttrace-runs"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Waits until `n` stores exist and all are finalised; returns them.
    fn finalized_stores(&self, n: usize) -> Vec<PathBuf> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let stores = self.stores();
            let done = stores
                .iter()
                .filter(|s| Manifest::read(s).is_ok_and(|m| m.finalized))
                .count();
            if stores.len() == n && done == n {
                return stores;
            }
            assert!(
                Instant::now() < deadline,
                "expected {n} finalised stores, have {stores:?} ({done} finalised); collector log:\n{}",
                self.collector_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn collector_log(&self) -> String {
        std::fs::read_to_string(self.collector_dir().join("collector.log")).unwrap_or_default()
    }

    /// The pids of the collectors started so far (from their log lines).
    fn collector_pids(&self) -> Vec<i32> {
        self.collector_log()
            .lines()
            .filter_map(|l| {
                l.split("collector (pid ")
                    .nth(1)?
                    .split(')')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect()
    }

    /// Waits for every collector started in the sandbox to exit (they do, once idle).
    fn wait_collectors_gone(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for pid in self.collector_pids() {
            while Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid) {
                assert!(
                    Instant::now() < deadline,
                    "collector {pid} did not exit when idle"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(true)
}

fn run(mut c: impl std::borrow::BorrowMut<Command>) -> Output {
    c.borrow_mut().output().expect("the command starts")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn losses(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with("step "))
        .map(String::from)
        .collect()
}

/// What must be equal between two captures of one command: every record's position, API,
/// parameters (communicator keys and buffer addresses aside: ids are random per run, and
/// addresses move with the address space), NVTX ranges, kernels, tensor metadata and bytes.
fn comparable(r: &Rec) -> serde_json::Value {
    let mut op = serde_json::to_value(&r.record.op).expect("op");
    strip_run_specific(&mut op);
    let tensors: Vec<serde_json::Value> = r
        .record
        .tensors
        .iter()
        .zip(&r.bytes)
        .map(|(t, b)| {
            serde_json::json!({
                "role": format!("{:?}", t.role), "dtype": format!("{:?}", t.dtype),
                "shape": t.shape, "strides": t.strides, "nbytes": t.nbytes,
                "captured": t.captured, "crc32": t.crc32,
                "bytes": b.as_ref().map(|b| crc32fast::hash(b)),
            })
        })
        .collect();
    // An unnamed kernel is `fn@ADDRESS`: the address moves with the executable's mapping.
    let kernels: Vec<&str> = r
        .record
        .kernels_before
        .iter()
        .map(|k| k.split("@0x").next().unwrap_or(k))
        .collect();
    serde_json::json!({
        "rank": r.record.rank, "step": r.record.step, "seq": r.record.seq,
        "api": r.record.api, "op": op, "nvtx": r.record.nvtx,
        "kernels": kernels, "tensors": tensors,
    })
}

fn strip_run_specific(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.retain(|k, _| {
                !matches!(k.as_str(), "comm" | "src" | "dst" | "sendbuff" | "recvbuff")
            });
            m.values_mut().for_each(strip_run_specific);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_run_specific),
        _ => {}
    }
}

/// Communicators as sets of member lists (keys differ between runs).
fn comm_members(store: &Path) -> Vec<Vec<Option<u32>>> {
    let mut v: Vec<Vec<Option<u32>>> = Manifest::read(store)
        .expect("manifest")
        .comms
        .into_iter()
        .map(|c| c.members)
        .collect();
    v.sort();
    v
}

#[test]
fn the_bare_preload_on_the_trainer_leaves_one_finalized_store() {
    let sb = Sandbox::new("bare-world1");
    let plain = run(Command::new(bin("trainer"))
        .args(["--steps", "2"])
        .env("LD_LIBRARY_PATH", sim_dir()));
    let out = run(sb.bare("trainer", &["--steps", "2"]));
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(losses(&out), losses(&plain), "tracing changed the training");
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr:\n{err}");
    assert!(
        lines[0].contains("capturing job") && lines[0].contains("ttrace ls"),
        "{err}"
    );
    let stores = sb.finalized_stores(1);
    let m = Manifest::read(&stores[0]).expect("manifest");
    let job = m.job.expect("the manifest names the job");
    assert_eq!(job.source, "process", "{job:?}");
    assert!(lines[0].contains(&stores[0].display().to_string()), "{err}");
    assert_eq!(m.cwd, sb.root().display().to_string());
    assert!(
        m.command.iter().any(|a| a.ends_with("trainer")),
        "{:?}",
        m.command
    );
    assert_eq!(m.ranks.len(), 1);
    assert!(
        m.ranks[0].records > 0 && m.ranks[0].clean_exit,
        "{:?}",
        m.ranks
    );
    let recs = read_store(&stores[0]);
    assert_eq!(recs.len() as u64, m.ranks[0].records);
    // The collector keeps its directory private and goes away once idle.
    let mode = std::fs::metadata(sb.collector_dir())
        .expect("dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    assert_eq!(sb.collector_pids().len(), 1, "{}", sb.collector_log());
    sb.wait_collectors_gone();
    assert!(
        !sb.collector_dir().join("collector.sock").exists(),
        "socket removed at exit"
    );
}

#[test]
fn ttrace_variables_work_with_the_bare_preload_and_the_manifest_records_them() {
    let sb = Sandbox::new("bare-vars");
    let out = run(sb
        .bare("trainer", &["--steps", "3"])
        .env("TTRACE_OUT", "runs/mine")
        .env("TTRACE_APIS", "gemm")
        .env("TTRACE_STEPS", "1")
        .env("TTRACE_INPUTS", "0")
        .env("TTRACE_LEVEL", "3"));
    assert!(out.status.success(), "{}", describe(&out));
    let store = sb.root().join("runs/mine");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !Manifest::read(&store).is_ok_and(|m| m.finalized) {
        assert!(Instant::now() < deadline, "{}", sb.collector_log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        sb.stores().is_empty(),
        "TTRACE_OUT replaces the default place"
    );
    let m = Manifest::read(&store).expect("manifest");
    assert_eq!(m.config.families, vec![ttrace_format::config::Family::Gemm]);
    assert_eq!(
        m.config.steps.as_ref().map(|s| s.to_string()).as_deref(),
        Some("1")
    );
    assert!(!m.config.inputs);
    let recs = read_store(&store);
    assert!(!recs.is_empty());
    for r in &recs {
        assert_eq!(r.record.step, 1, "{}", r.record.api);
        assert!(
            r.record.api.to_lowercase().contains("gemm"),
            "{}",
            r.record.api
        );
    }
    // A bad value turns capture off with one line naming it; the program is untouched.
    let sb2 = Sandbox::new("bare-badvar");
    let out = run(sb2
        .bare("trainer", &["--steps", "1"])
        .env("TTRACE_LEVEL", "fast"));
    assert!(out.status.success(), "{}", describe(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("capture off") && err.contains("TTRACE_LEVEL=fast"),
        "{err}"
    );
    assert!(sb2.stores().is_empty());
}

#[test]
fn eight_ranks_under_simrun_equal_what_ttrace_run_captures_with_the_same_verdicts() {
    let layout = [
        "--tp",
        "2",
        "--dp",
        "2",
        "--pp",
        "2",
        "--steps",
        "2",
        "--precision",
        "bf16",
        "--bug",
        "tp-row-parallel-no-reduce",
    ];
    let sb = Sandbox::new("bare-8ranks");
    let mut args = vec!["--nproc-per-node", "8", "--"];
    let trainer = bin("trainer").display().to_string();
    args.push(&trainer);
    args.extend(layout);
    let out = run(sb.bare("simrun", &args));
    assert!(out.status.success(), "{}", describe(&out));
    let announced = stderr(&out)
        .lines()
        .filter(|l| l.contains("capturing job"))
        .count();
    assert_eq!(announced, 1, "one line per job and node:\n{}", stderr(&out));
    let bare = sb.finalized_stores(1).remove(0);
    assert_eq!(
        sb.collector_pids().len(),
        1,
        "eight ranks start one collector"
    );

    let wrapped = sb.root().join("wrapped");
    let w = run(ttrace_run(&wrapped)
        .arg("--")
        .arg(bin("simrun"))
        .args(&args[..]));
    assert!(w.status.success(), "{}", describe(&w));
    assert_eq!(losses(&w), losses(&out));

    let (a, b) = (read_store(&bare), read_store(&wrapped));
    assert_eq!(a.len(), b.len(), "record counts");
    assert!(a.len() > 100);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(comparable(x), comparable(y));
    }
    assert_eq!(comm_members(&bare), comm_members(&wrapped));
    let mb = Manifest::read(&bare).expect("manifest");
    assert_eq!(mb.job.expect("job").source, "torchrun");
    assert!(mb.ranks.iter().all(|r| r.clean_exit) && mb.ranks.len() == 8);

    // check and compare (against a world-1 reference) judge both stores alike.
    let check = |s: &Path| {
        let o = run(Command::new(bin("ttrace")).arg("check").arg(s));
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).lines().count(),
        )
    };
    assert_eq!(check(&bare), check(&wrapped));
    let reference = sb.root().join("reference");
    let r = run(ttrace_run(&reference).arg("--").arg(bin("trainer")).args([
        "--steps",
        "2",
        "--precision",
        "bf16",
    ]));
    assert!(r.status.success(), "{}", describe(&r));
    let compare = |s: &Path| {
        let o = run(Command::new(bin("ttrace"))
            .arg("compare")
            .arg(&reference)
            .arg(s)
            .args(["--json", "-"]));
        let v: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&o)));
        (
            o.status.code(),
            v["verdict"].clone(),
            v["first_divergence"]["position"].clone(),
        )
    };
    let (cb, cw) = (compare(&bare), compare(&wrapped));
    assert_eq!(cb.0, Some(1), "the bug is found: {cb:?}");
    assert_eq!(cb, cw);
    sb.wait_collectors_gone();
}

#[test]
fn two_jobs_started_together_get_two_separate_stores() {
    let sb = Sandbox::new("bare-2jobs");
    let trainer = bin("trainer").display().to_string();
    let job = |seed: &str| {
        sb.bare(
            "simrun",
            &[
                "--nproc-per-node",
                "2",
                "--",
                &trainer,
                "--tp",
                "2",
                "--steps",
                "2",
                "--seed",
                seed,
            ],
        )
        .spawn()
        .expect("simrun starts")
    };
    let (a, b) = (job("1"), job("2"));
    let (a, b) = (
        a.wait_with_output().expect("job 1"),
        b.wait_with_output().expect("job 2"),
    );
    assert!(
        a.status.success() && b.status.success(),
        "{}\n{}",
        describe(&a),
        describe(&b)
    );
    let stores = sb.finalized_stores(2);
    assert_eq!(sb.collector_pids().len(), 1, "{}", sb.collector_log());
    let mut jobs = Vec::new();
    for s in &stores {
        let m = Manifest::read(s).expect("manifest");
        let ranks: Vec<u32> = m.ranks.iter().map(|r| r.rank).collect();
        assert_eq!(ranks, vec![0, 1], "{}: {:?}", s.display(), m.ranks);
        assert!(m.ranks.iter().all(|r| r.clean_exit && r.gaps == 0));
        jobs.push(m.job.expect("job").id);
        let c = run(Command::new(bin("ttrace")).arg("check").arg(s));
        assert_eq!(c.status.code(), Some(0), "{}", describe(&c));
    }
    assert_ne!(jobs[0], jobs[1]);
    // Each store holds one job's training: the two seeds give different first uploads.
    let first_bytes = |s: &Path| {
        read_store(s)
            .into_iter()
            .find_map(|r| r.bytes.into_iter().flatten().next())
    };
    assert_ne!(first_bytes(&stores[0]), first_bytes(&stores[1]));
    sb.wait_collectors_gone();
}

#[test]
fn a_collector_killed_mid_run_leaves_the_job_untraced_and_the_store_readable() {
    let sb = Sandbox::new("bare-kill");
    let child = sb
        .bare("trainer", &["--steps", "40"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("trainer starts");
    // Wait for records to reach the store, then kill the collector.
    let deadline = Instant::now() + Duration::from_secs(30);
    let store = loop {
        if let Some(s) = sb.stores().into_iter().next() {
            let seg = s.join("rank00000/step000000.seg");
            if std::fs::metadata(&seg).is_ok_and(|m| m.len() > 4096) {
                break s;
            }
        }
        assert!(Instant::now() < deadline, "{}", sb.collector_log());
        std::thread::sleep(Duration::from_millis(5));
    };
    let pid = sb.collector_pids()[0];
    // SAFETY: kill on a pid this test's collector logged.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let out = child.wait_with_output().expect("trainer ends");
    assert!(out.status.success(), "the job goes on: {}", describe(&out));
    assert_eq!(losses(&out).len(), 40);
    let m = Manifest::read(&store).expect("the manifest is readable");
    assert!(!m.finalized);
    let ls = run(Command::new(bin("ttrace")).arg("ls").arg(&store));
    assert!(ls.status.success(), "{}", describe(&ls));
    // What reached the disk reads back (the tolerant reader: the last frame may be cut).
    let r = ttrace_format::reader::Store::open(&store).expect("the store opens");
    let seg = r.open_segment(0, 0).expect("the first segment opens");
    let good = seg.records().filter(|v| v.is_ok()).count();
    assert!(good > 0, "{:?}", seg.issues());
}

#[test]
fn a_stale_socket_and_lock_of_a_crashed_collector_are_replaced() {
    let sb = Sandbox::new("bare-stale");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(sb.collector_dir())
        .expect("dir");
    // A socket file nobody listens on, as a SIGKILLed collector leaves it, and its lock.
    drop(
        std::os::unix::net::UnixListener::bind(sb.collector_dir().join("collector.sock"))
            .expect("bind"),
    );
    std::fs::write(sb.collector_dir().join("collector.lock"), b"").expect("lock file");
    let out = run(sb.bare("trainer", &["--steps", "1"]));
    assert!(out.status.success(), "{}", describe(&out));
    assert!(stderr(&out).contains("capturing job"), "{}", describe(&out));
    let s = sb.finalized_stores(1);
    assert!(!read_store(&s[0]).is_empty());
    sb.wait_collectors_gone();
}

#[test]
fn a_socket_directory_others_can_enter_is_refused_with_one_line() {
    let sb = Sandbox::new("bare-foreign");
    let dir = sb.collector_dir();
    std::fs::create_dir(&dir).expect("dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let out = run(sb.bare("trainer", &["--steps", "1"]));
    assert!(out.status.success(), "{}", describe(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("capture off") && err.contains("accessible to other users"),
        "{err}"
    );
    assert!(sb.stores().is_empty() && sb.collector_pids().is_empty());

    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped: another user's directory needs root to create (chown)");
        return;
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).expect("chown to nobody");
    let out = run(sb.bare("trainer", &["--steps", "1"]));
    assert!(out.status.success(), "{}", describe(&out));
    let err = stderr(&out);
    assert!(
        err.contains("capture off") && err.contains("belongs to uid 65534"),
        "{err}"
    );
    assert!(sb.stores().is_empty());
}

#[test]
fn ttrace_0_is_a_pure_pass_through() {
    let sb = Sandbox::new("bare-off");
    let plain = run(Command::new(bin("trainer"))
        .args(["--steps", "1"])
        .env("LD_LIBRARY_PATH", sim_dir()));
    let out = run(sb.bare("trainer", &["--steps", "1"]).env("TTRACE", "0"));
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(out.stdout, plain.stdout);
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    assert!(!sb.collector_dir().exists(), "no collector was started");
    assert!(sb.stores().is_empty());
}
