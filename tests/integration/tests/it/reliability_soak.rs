//! The reliability soak: the fixture trainer (two DP ranks, a tiny model) traced for 500 steps
//! while faults are injected — the collector stopped and continued (SIGSTOP/SIGCONT of
//! `ttrace run`, which embeds it), the disk filling up (a small tmpfs, where the machine lets
//! the test mount one), a rank killed once the disk is full — and nothing that was reported stored is missing:
//! records received = records readable + records reported lost, exactly, and the summary's
//! stored count is what a reader finds.
//!
//! `TTRACE_SOAK_STEPS=N` runs a longer (or shorter) soak.

use crate::reliability_util;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use integration_tests::{bin, sim_dir};
use reliability_util::*;
use ttrace_format::store::Manifest;

/// Pids of the processes below `root` whose command line mentions `name`.
fn descendants(root: u32, name: &str) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command (which may hold spaces) close with ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let ppid: u32 = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        parent_of.push((pid, ppid));
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found
        .into_iter()
        .filter(|&p| {
            p != root
                && std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(name))
        })
        .collect()
}

/// Bytes free for an unprivileged writer on the filesystem of `path` (`statvfs`).
fn free_bytes(path: &Path) -> u64 {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return u64::MAX;
    };
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: a NUL-terminated path and an out-pointer to a zeroed statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return u64::MAX;
    }
    // SAFETY: statvfs succeeded and filled it.
    let st = unsafe { st.assume_init() };
    st.f_bavail * st.f_frsize
}

/// The value of `var` in a process's environment.
fn env_of(pid: u32, var: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{var}=")).map(String::from)
    })
}

/// The number after `key` in `text` (e.g. "records 9802").
fn number_after(text: &str, key: &str) -> Option<u64> {
    let at = text.find(key)? + key.len();
    text[at..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[test]
fn a_faulty_500_step_run_loses_nothing_it_reported_stored() {
    let steps: u64 = std::env::var("TTRACE_SOAK_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let dir = TempDir::new("rel-soak");
    // About 0.3 MiB stored per step: a 16 MiB tmpfs fills around step 50, when the
    // collector keeps up.
    let fs = SmallFs::tmpfs("16m");
    let store = match &fs {
        Some(fs) => fs.mount.join("st"),
        None => {
            eprintln!("no tmpfs: the writes fail under a file-size limit instead of a full disk");
            dir.path().join("st")
        }
    };
    // Rank 1 is killed once the disk is full, after the collector's stop, or at `kill_at` at
    // the latest: the trainer (a millisecond a step) runs ahead of a collector stopped for
    // 300 ms, so killing at a fixed step of the trainer could come before the collector had
    // written enough to fill the disk (the run then lost no write, which it is here to do).
    let (stop_at, kill_at) = (steps / 10, steps * 4 / 5);
    let disk_full = || match &fs {
        Some(fs) => free_bytes(&fs.mount) < 1 << 20,
        // The file-size limit fails every segment's writes from the first step on.
        None => true,
    };
    let mut cmd = ttrace(dir.path());
    // The trainer's processes lift the soft file-size limit (set below without a tmpfs) for
    // themselves: only the collector's writes are to fail.
    let script = format!(
        "ulimit -f unlimited; exec {} --nproc-per-node 2 -- {} --dp 2 --steps {steps} \
         --layers 1 --hidden 16 --heads 2 --ffn 32 --seq 8 --vocab 32 --micro-batch-size 2",
        bin("simrun").display(),
        bin("trainer").display()
    );
    cmd.args(["run", "--linger", "5", "--out"])
        .arg(&store)
        .args(["--", "sh", "-c", &script])
        .env("LD_LIBRARY_PATH", sim_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if fs.is_none() {
        file_size_limit(&mut cmd, 96 << 10);
    }
    let mut child = cmd.spawn().expect("ttrace starts");
    let pid = child.id();
    let stderr = child.stderr.take().expect("stderr");
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
        s
    });
    let mut killed = false;
    for line in BufReader::new(child.stdout.take().expect("stdout")).lines() {
        let Ok(line) = line else { break };
        let Some(step) = number_after(&line, "step ") else {
            continue;
        };
        if step == stop_at {
            // The collector stalls: the ranks wait for ring space (or record gaps).
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
            std::thread::sleep(Duration::from_millis(300));
            // SAFETY: as above.
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
        if !killed && ((step > stop_at && disk_full()) || step >= kill_at) {
            let rank1 = descendants(pid, "trainer")
                .into_iter()
                .find(|&p| env_of(p, "RANK").as_deref() == Some("1"));
            if let Some(p) = rank1 {
                // SAFETY: kill(2) on a process of the test's own tree.
                unsafe { libc::kill(p as i32, libc::SIGKILL) };
                killed = true;
            }
        }
    }
    let status = wait_at_most(&mut child, Duration::from_secs(600));
    let stderr = err_reader.join().expect("stderr");
    assert_ne!(status.code(), Some(125), "ttrace itself failed: {stderr}");
    assert!(killed, "rank 1 was killed mid-run: {stderr}");

    let m = Manifest::read(&store).expect("the final manifest is written");
    assert!(m.finalized, "{stderr}");
    let lost = m.lost_records();
    assert!(lost > 0, "writes failed: {stderr}");
    let readable = intact_records(&store);
    let stored = number_after(&stderr, ", records ").expect("the summary's records");
    let received = match number_after(&stderr, "INCOMPLETE ") {
        Some(l) => {
            assert_eq!(l, lost, "the summary's losses are the manifest's: {stderr}");
            let of = stderr.split("INCOMPLETE ").nth(1).expect("line");
            number_after(of, " of ").expect("received")
        }
        None => stored,
    };
    assert_eq!(
        readable, stored,
        "every record reported stored is readable: {stderr}"
    );
    assert_eq!(
        readable + lost,
        received,
        "received = readable + reported lost: {stderr}"
    );
    assert!(
        m.ranks.iter().any(|r| r.rank == 1 && !r.clean_exit),
        "the killed rank is marked: {:?}",
        m.ranks
    );
    assert!(Path::new(&store).join("manifest.json").exists());
    eprintln!(
        "soak: {steps} steps, rank 1 killed at step {kill_at}, collector stopped at step \
         {stop_at}: received {received} = readable {readable} + lost {lost}, exit {status:?}"
    );
}
