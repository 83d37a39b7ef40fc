//! Shared by the intercept_* tests: run a `sim-probe traced ...` scenario under
//! `LD_PRELOAD=libttrace.so` with a real `ttraced` (the daemon library) on a private socket,
//! then read the store back: every record with the bytes of its captured tensors.

#![allow(dead_code, unused_imports)]

pub mod recompute;
pub use recompute::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use integration_tests::{bin, describe, profile_dir, sim_dir};
use ttrace_format::reader::Segment;
use ttrace_format::record::{GapReason, Op, Record, Role, Tensor};
use ttraced::{Config, Daemon, Summary};

pub use integration_tests::TempDir;

/// `target/<profile>/libttrace.so`.
pub fn libttrace() -> PathBuf {
    let p = profile_dir().join("libttrace.so");
    assert!(
        p.exists(),
        "{} is missing: cargo build --release -p ttrace-intercept",
        p.display()
    );
    p
}

/// A record read back from the store, with the bytes of each tensor (None: not captured).
#[derive(Debug, Clone)]
pub struct Rec {
    pub record: Record,
    pub bytes: Vec<Option<Vec<u8>>>,
}

impl Rec {
    /// The tensor of `role` and its bytes (panics when absent or not captured).
    pub fn tensor(&self, role: Role) -> (&Tensor, &[u8]) {
        let i = self
            .record
            .tensors
            .iter()
            .position(|t| t.role == role)
            .unwrap_or_else(|| panic!("{} has no {role:?}: {:?}", self.record.api, self.record));
        let b = self.bytes[i]
            .as_deref()
            .unwrap_or_else(|| panic!("{} {role:?} not captured", self.record.api));
        (&self.record.tensors[i], b)
    }

    /// Whether a tensor of `role` is present.
    pub fn has(&self, role: Role) -> bool {
        self.record.tensors.iter().any(|t| t.role == role)
    }
}

/// A traced run: the command's output, the daemon's summary, and the records in store order
/// (by rank, step, seq).
pub struct Run {
    pub out: Output,
    pub summary: Summary,
    pub records: Vec<Rec>,
    pub store: PathBuf,
    _dir: TempDir,
}

impl Run {
    /// Records of `rank`.
    pub fn of_rank(&self, rank: u32) -> Vec<&Rec> {
        self.records
            .iter()
            .filter(|r| r.record.rank == rank)
            .collect()
    }
}

/// The probe command (under simrun when `nproc > 1`).
pub fn probe_command(nproc: usize, args: &[&str]) -> Command {
    let mut c = if nproc > 1 {
        let mut c = Command::new(bin("simrun"));
        c.arg("--nproc-per-node")
            .arg(nproc.to_string())
            .arg("--")
            .arg(bin("sim-probe"));
        c
    } else {
        Command::new(bin("sim-probe"))
    };
    c.args(args).env("LD_LIBRARY_PATH", sim_dir());
    c
}

/// Runs `sim-probe ARGS` untraced.
pub fn untraced(nproc: usize, args: &[&str]) -> Output {
    probe_command(nproc, args).output().expect("probe starts")
}

/// Runs `sim-probe ARGS` traced, with `env` added, and reads the store.
pub fn traced(nproc: usize, args: &[&str], env: &[(&str, &str)]) -> Run {
    traced_with(nproc, args, |c| {
        for (k, v) in env {
            c.env(k, v);
        }
    })
}

/// Runs `sim-probe ARGS` traced, after `setup` adjusted the command, and reads the store.
pub fn traced_with(nproc: usize, args: &[&str], setup: impl FnOnce(&mut Command)) -> Run {
    let mut c = probe_command(nproc, args);
    setup(&mut c);
    traced_command(c)
}

/// Runs `c` traced (`LD_PRELOAD` and `TTRACE_SOCKET` added) with a daemon of its own, and
/// reads the store.
pub fn traced_command(c: Command) -> Run {
    traced_command_tagged(c, "intercept")
}

/// As [`traced_command`], with the daemon's directory (and so `TTRACE_SOCKET`) named after
/// `tag`: `<tmp>/ttrace-<tag>-<test pid>-<n>/sock/ttraced.sock`.
pub fn traced_command_tagged(c: Command, tag: &str) -> Run {
    traced_command_preloaded(c, tag, &libttrace().display().to_string())
}

/// The simulated stack of CUDA `major` for a C test program, or `None` (saying SKIP) when it
/// was not built.
pub fn sim_or_skip(major: u32) -> Option<std::path::PathBuf> {
    let sim = integration_tests::sim_dir_for(major);
    if sim.is_none() {
        eprintln!(
            "SKIP CUDA {major}: build its simulated stack (scripts/build-sim-cuda13.sh \
             --release; scripts/test.sh does)"
        );
    }
    sim
}

/// The CUDA majors a C test program runs against (12 and 13) with their simulated stacks,
/// those not built left out (saying SKIP).
pub fn cuda_sims() -> impl Iterator<Item = (u32, std::path::PathBuf)> {
    [12, 13]
        .into_iter()
        .filter_map(|major| sim_or_skip(major).map(|sim| (major, sim)))
}

/// Runs a C test program of tests/integration/c traced (daemon directory named after `tag`):
/// the run, checked to have ended well with intact checksums and the program's
/// `<program>: OK` line (its own checks passed). `what` names the case in failures.
pub fn run_c(c: Command, tag: &str, program: &str, what: &str) -> Run {
    let run = traced_command_tagged(c, tag);
    assert_ok(&run);
    assert_checksums(&run);
    let out = String::from_utf8_lossy(&run.out.stdout);
    assert!(out.contains(&format!("{program}: OK")), "{what}: {out}");
    run
}

/// [`run_c`], and the stream handle the program printed as `<program>: stream 0x...`.
pub fn run_c_program(c: Command, tag: &str, program: &str, what: &str) -> (Run, u64) {
    let run = run_c(c, tag, program, what);
    let out = String::from_utf8_lossy(&run.out.stdout).into_owned();
    let stream = out
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{program}: stream 0x")))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .unwrap_or_else(|| panic!("{what}: no stream in {out}"));
    (run, stream)
}

/// As [`traced_command_tagged`], with `LD_PRELOAD` set to `preload` (which names libttrace.so
/// among other libraries).
pub fn traced_command_preloaded(mut c: Command, tag: &str, preload: &str) -> Run {
    let dir = TempDir::new(tag);
    let mut cfg = Config::new(
        dir.path().join("sock/ttraced.sock"),
        dir.path().join("store"),
    );
    cfg.threads = 1;
    let h = Daemon::start(cfg).expect("daemon starts");
    c.env("LD_PRELOAD", preload)
        .env("TTRACE_SOCKET", h.socket());
    let out = c.output().expect("the command starts");
    let store = h.store().to_path_buf();
    let summary = h
        .finalize(out.status.code(), Duration::from_secs(20))
        .expect("finalize");
    let records = read_store(&store);
    Run {
        out,
        summary,
        records,
        store,
        _dir: dir,
    }
}

/// Every record of a store with its tensors' bytes, by rank, step, seq.
pub fn read_store(store: &Path) -> Vec<Rec> {
    let mut out = Vec::new();
    let Ok(ranks) = std::fs::read_dir(store) else {
        return out;
    };
    for rd in ranks.flatten() {
        if !rd.file_name().to_string_lossy().starts_with("rank") {
            continue;
        }
        for seg in std::fs::read_dir(rd.path()).expect("rank dir").flatten() {
            let p = seg.path();
            if p.extension().is_none_or(|e| e != "seg") {
                continue;
            }
            let r = Segment::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            if let Some(i) = r.issues().iter().find(|i| i.kind.loses_data()) {
                panic!("{}: {i}", p.display());
            }
            for f in r.into_frames() {
                let f = f.unwrap_or_else(|i| panic!("{}: {i:?}", p.display()));
                let mut k = 0;
                let bytes = f
                    .record
                    .tensors
                    .iter()
                    .map(|t| {
                        t.captured.then(|| {
                            k += 1;
                            f.tensor_bytes(k - 1).expect("blob decodes")
                        })
                    })
                    .collect();
                out.push(Rec {
                    record: f.record.clone(),
                    bytes,
                });
            }
        }
    }
    out.sort_by_key(|r| (r.record.rank, r.record.step, r.record.seq));
    out
}

/// Asserts the run succeeded, with its output in the message.
pub fn assert_ok(run: &Run) {
    assert!(run.out.status.success(), "{}", describe(&run.out));
}

/// Every tensor's bytes match its CRC-32 and the daemon saw no mismatch.
pub fn assert_checksums(run: &Run) {
    assert_eq!(run.summary.crc_mismatches, 0, "daemon CRC mismatches");
    for r in &run.records {
        for (t, b) in r.record.tensors.iter().zip(&r.bytes) {
            if let Some(b) = b {
                assert_eq!(
                    b.len() as u64,
                    t.nbytes,
                    "{} {:?} size",
                    r.record.api,
                    t.role
                );
                assert_eq!(
                    crc32fast::hash(b),
                    t.crc32,
                    "{} {:?} crc",
                    r.record.api,
                    t.role
                );
            }
        }
    }
}

/// The bytes of `sim-probe traced memcpy`'s copy number `salt` (tests/sim/probe/src/capture.rs).
pub fn pattern(salt: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            ((i as u32).wrapping_mul(31).wrapping_add(salt as u32 * 7) ^ (i as u32 >> 8)) as u8
        })
        .collect()
}

/// The simulator's dtype of a record's dtype.
pub fn sim_dtype(t: ttrace_format::dtype::DType) -> sim_kernels::dtype::DType {
    use sim_kernels::dtype::DType as S;
    use ttrace_format::dtype::DType as F;
    match t {
        F::F32 => S::F32,
        F::F64 => S::F64,
        F::F16 => S::F16,
        F::BF16 => S::BF16,
        F::F8_E4M3 => S::E4M3,
        F::F8_E5M2 => S::E5M2,
        F::I8 => S::I8,
        F::U8 => S::U8,
        F::I32 => S::I32,
        F::U32 => S::U32,
        F::I64 => S::I64,
        F::U64 => S::U64,
        other => panic!("no simulator dtype for {other:?}"),
    }
}

/// Stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A run's gap records, in order: (skipped API, reason, stream, detail).
pub fn gap_records(run: &Run) -> Vec<(&str, GapReason, u64, &str)> {
    run.records
        .iter()
        .filter_map(|r| match &r.record.op {
            Op::Gap(g) => Some((
                g.skipped_api.as_str(),
                g.reason,
                r.record.stream,
                g.detail.as_str(),
            )),
            _ => None,
        })
        .collect()
}
