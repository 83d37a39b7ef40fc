//! End to end: `ttrace run` preloads libttrace.so (found next to the ttrace binary) into a
//! two-rank job under simrun; both ranks' GEMMs and all-reduces land in the store, with zero
//! gaps, bytes matching their checksums, and the communicator joined in the manifest.

use std::collections::BTreeMap;
use std::process::Command;

use integration_tests::{bin, describe, profile_dir, sim_dir};
use ttrace_format::reader::Segment;
use ttrace_format::record::{CollectiveKind, Op, Role};
use ttrace_format::store::{segment_path, Frame, Manifest};

fn all_frames(store: &std::path::Path, rank: u32) -> Vec<Frame> {
    let mut out = Vec::new();
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
        for f in r.into_frames() {
            out.push(f.expect("intact frame"));
        }
    }
    out
}

#[test]
fn a_two_rank_ksplit_job_is_captured_completely() {
    assert!(
        profile_dir().join("libttrace.so").exists(),
        "libttrace.so is not built next to ttrace (cargo build --release -p ttrace-intercept)"
    );
    let (dir, mut c) = fresh_run("ksplit");
    let out = c
        .arg("--")
        .arg(bin("simrun"))
        .args(["--nproc-per-node", "2", "--"])
        .arg(bin("sim-probe"))
        .arg("ksplit")
        .output()
        .expect("ttrace runs");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let store = dir.join("store");
    let m = Manifest::read(&store).expect("manifest");
    assert!(m.finalized, "{}", describe(&out));
    assert_eq!(
        m.ranks
            .iter()
            .map(|r| (r.rank, r.gaps, r.clean_exit))
            .collect::<Vec<_>>(),
        vec![(0, 0, true), (1, 0, true)],
        "{}",
        describe(&out)
    );
    assert!(
        m.comms.iter().any(|c| c.members == vec![Some(0), Some(1)]),
        "the world communicator is joined: {:?}",
        m.comms
    );

    let mut outputs: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
    for rank in [0u32, 1] {
        let frames = all_frames(&store, rank);
        let gemms = frames
            .iter()
            .filter(|f| matches!(f.record.op, Op::Gemm(_)))
            .count();
        assert!(gemms >= 2, "rank {rank}: {gemms} GEMMs captured");
        assert!(
            frames.iter().all(|f| !matches!(f.record.op, Op::Gap(_))),
            "no gaps"
        );
        for f in &frames {
            let captured: Vec<_> = f.record.tensors.iter().filter(|t| t.captured).collect();
            for (i, t) in captured.iter().enumerate() {
                let bytes = f.tensor_bytes(i).expect("decodes");
                assert_eq!(bytes.len() as u64, t.nbytes);
                assert_eq!(
                    crc32fast::hash(&bytes),
                    t.crc32,
                    "rank {rank} {} seq {} tensor {i}",
                    f.record.api,
                    f.record.seq
                );
            }
            if let Op::Collective(c) = &f.record.op {
                if c.kind == CollectiveKind::AllReduce {
                    let o = f
                        .record
                        .tensors
                        .iter()
                        .filter(|t| t.captured)
                        .position(|t| t.role == Role::Output)
                        .expect("an all-reduce captures its output");
                    outputs
                        .entry(rank)
                        .or_default()
                        .push(f.tensor_bytes(o).expect("decodes"));
                }
            }
        }
    }
    assert!(!outputs[&0].is_empty());
    assert_eq!(
        outputs[&0], outputs[&1],
        "all-reduce results agree across ranks"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("gaps 0"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory for `tag`, and `ttrace run --out store` to run in it with the library
/// found next to ttrace (options and `-- CMD` still to add).
fn fresh_run(tag: &str) -> (std::path::PathBuf, Command) {
    let dir = std::env::temp_dir().join(format!("ttrace-e2e-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let mut c = Command::new(bin("ttrace"));
    c.current_dir(&dir)
        .env("LD_LIBRARY_PATH", sim_dir())
        .env_remove("TTRACE_LIB")
        .env_remove("TTRACE_DAEMON")
        .env_remove("LD_PRELOAD")
        .args(["run", "--out", "store"]);
    (dir, c)
}

/// `ttrace run OPTS -- sim-probe traced gemm` in a fresh directory, with `env` set, and what
/// `ttrace ls` then says of the store.
fn run_probe(tag: &str, opts: &[&str], env: &[(&str, &str)]) -> (std::process::Output, String) {
    let (dir, mut c) = fresh_run(tag);
    c.args(opts)
        .arg("--")
        .arg(bin("sim-probe"))
        .args(["traced", "gemm"]);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("ttrace runs");
    let ls = Command::new(bin("ttrace"))
        .arg("ls")
        .arg(dir.join("store"))
        .output()
        .expect("ttrace ls");
    let _ = std::fs::remove_dir_all(&dir);
    (out, String::from_utf8_lossy(&ls.stdout).into_owned())
}

/// Nothing is lost silently, not even by `ttrace run -q`: a capture with gap records (here a
/// snapshot copy the runtime refused) is called INCOMPLETE in the summary, with the gaps by
/// reason, as compare and check call it; the exit code stays the command's, and `--strict`
/// turns it into 74. The same run without the refusal is clean under --strict.
#[test]
fn a_run_whose_capture_has_gaps_says_so_and_strict_fails_it() {
    let refuse = [("SIM_CUDA_REFUSE_REGISTERED_COPY", "3")];
    let (out, ls) = run_probe("gaps", &[], &refuse);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let line = "INCOMPLETE 1 gap record: ops or tensors not captured (copy_refused 1;";
    assert!(err.contains(line), "{err}");
    assert!(ls.contains(line), "ttrace ls says the same: {ls}");
    let (out, _) = run_probe("gaps-strict", &["-q", "--strict"], &refuse);
    assert_eq!(out.status.code(), Some(74), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("INCOMPLETE 1 gap record"),
        "-q still says it: {err}"
    );
    let (out, ls) = run_probe("clean-strict", &["-q", "--strict"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("INCOMPLETE"),
        "{}",
        describe(&out)
    );
    assert!(!ls.contains("INCOMPLETE"), "{ls}");
}
