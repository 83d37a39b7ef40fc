//! Reliability of the store: a full disk, a removed store, existing and shared directories, two
//! writers, crafted stores. Each test asserts what ttrace promises (docs/guarantees.md).
//!
//! Disk-full tests mount a small tmpfs or loop-mounted ext4 (root only); elsewhere they print
//! SKIPPED and pass.

use crate::reliability_util;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use reliability_util::*;
use ttrace_format::store::Manifest;

const LIMIT: Duration = Duration::from_secs(120);

/// `ttrace run [opts] --out STORE -- sh -c SCRIPT` in `dir`, with `$LG` the producer.
fn run_script(dir: &Path, store: &Path, opts: &[&str], script: &str) -> Output {
    let mut c = ttrace(dir);
    c.arg("run")
        .args(opts)
        .arg("--out")
        .arg(store)
        .args(["--", "sh", "-c", script])
        .env("LG", loadgen());
    output_within(&mut c, LIMIT)
}

/// The promise under a full disk: the command's exit code, "INCOMPLETE" said, the manifest
/// finalized with the losses, and published = readable + reported lost, exactly.
fn assert_accounted(out: &Output, store: &Path, published: u64) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{}", describe(out));
    let m = Manifest::read(store).expect("the final manifest fits (space reserve)");
    assert!(m.finalized, "{}", describe(out));
    let (readable, lost) = (intact_records(store), m.lost_records());
    assert!(
        lost > 0,
        "the disk filled: records were lost ({})",
        describe(out)
    );
    assert_eq!(
        readable + lost,
        published,
        "published = readable + reported lost ({})",
        describe(out)
    );
    assert!(stderr.contains("INCOMPLETE"), "{stderr}");
    // The per-process counts claim only records that reached the kernel.
    let claimed: u64 = m.ranks.iter().map(|r| r.records).sum();
    assert!(
        claimed <= readable,
        "{claimed} claimed, {readable} readable"
    );
    assert!(
        stderr.matches("records are being lost").count() <= m.lost.len(),
        "one error line per cause, not per record: {stderr}"
    );
}

/// Disk full on tmpfs (page-cache path); one WARN per cause, never one per record.
#[test]
fn a_full_tmpfs_is_reported_and_every_record_accounted_for() {
    let Some(fs) = SmallFs::tmpfs("3m") else {
        return;
    };
    let dir = TempDir::new("rel-tmpfs");
    let store = fs.mount.join("st");
    let out = run_script(
        dir.path(),
        &store,
        &[],
        "$LG publish --records 400 --per-step 50 --elems 8192",
    );
    assert_accounted(&out, &store, 400);
    // Nothing half-written left behind; `ls` and `fsck` say the trace is incomplete.
    for leftover in [".manifest.json.tmp", ".reopen", ".reserve"] {
        assert!(!store.join(leftover).exists(), "{leftover} left behind");
    }
    let st = store.to_str().expect("utf-8");
    let ls = ttrace_cmd(dir.path(), &["ls", st]);
    assert!(
        String::from_utf8_lossy(&ls.stdout).contains("INCOMPLETE"),
        "{}",
        describe(&ls)
    );
    let fsck = ttrace_cmd(dir.path(), &["fsck", st]);
    assert_eq!(fsck.status.code(), Some(1), "{}", describe(&fsck));
    assert!(
        String::from_utf8_lossy(&fsck.stdout).contains("incomplete trace"),
        "{}",
        describe(&fsck)
    );
    // --strict: the command succeeded but the trace is incomplete.
    let store2 = fs.mount.join("st2");
    std::fs::remove_dir_all(&store).expect("room again");
    let out = run_script(
        dir.path(),
        &store2,
        &["--strict"],
        "$LG publish --records 400 --per-step 50 --elems 8192",
    );
    assert_eq!(out.status.code(), Some(74), "{}", describe(&out));
    // A failing command keeps its own code under --strict.
    std::fs::remove_dir_all(&store2).expect("room again");
    let out = run_script(
        dir.path(),
        &fs.mount.join("st3"),
        &["--strict"],
        "$LG publish --records 400 --per-step 50 --elems 8192; exit 3",
    );
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
}

/// A full disk without root: a file-size limit (`RLIMIT_FSIZE`, write errors `EFBIG`) makes
/// every segment's writes fail past 256 KiB, wherever the test runs.
#[test]
fn failed_writes_under_a_file_size_limit_are_accounted_for() {
    let dir = TempDir::new("rel-fsize");
    let store = dir.path().join("st");
    let mut c = ttrace(dir.path());
    c.args(["run", "--out"])
        .arg(&store)
        .args(["--", "sh", "-c"])
        // The producer lifts the (soft) limit for itself: its ring is a 4 MiB memfd.
        .arg("ulimit -f unlimited; $LG publish --rank 0 --records 200 --per-step 50 --elems 8192")
        .env("LG", loadgen());
    file_size_limit(&mut c, 256 << 10);
    let out = output_within(&mut c, LIMIT);
    assert_accounted(&out, &store, 200);
}

/// Disk full on ext4 (the O_DIRECT path), two ranks.
#[test]
fn a_full_ext4_is_reported_and_every_record_accounted_for() {
    let Some(fs) = SmallFs::ext4(8) else {
        return;
    };
    let dir = TempDir::new("rel-ext4");
    let store = fs.mount.join("st");
    let out = run_script(
        dir.path(),
        &store,
        &[],
        "$LG publish --rank 0 --records 400 --per-step 50 --elems 8192 & \
         $LG publish --rank 1 --records 400 --per-step 50 --elems 8192; wait",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches("published 400").count(), 2, "{stdout}");
    assert_accounted(&out, &store, 800);
}

/// The store directory removed during the run is not silently re-created, and the run
/// says the trace is incomplete.
#[test]
fn a_store_removed_during_the_run_is_reported() {
    let dir = TempDir::new("rel-removed");
    let store = dir.path().join("st");
    let script = format!(
        "$LG publish --records 60 --per-step 10 && \
         while [ -e {0} ]; do rm -rf {0} 2>/dev/null; done && \
         $LG publish --rank 1 --records 30 --per-step 10",
        store.display()
    );
    let out = run_script(dir.path(), &store, &[], &script);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        !store.exists(),
        "the store was re-created: {}",
        describe(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("INCOMPLETE"), "{stderr}");
    assert!(
        stderr.contains("removed or replaced during the run"),
        "{stderr}"
    );
    let out = run_script(dir.path(), &store, &["--strict"], &script);
    assert_eq!(out.status.code(), Some(74), "{}", describe(&out));
}

/// An existing directory is never chmod-ed; a non-empty one (`.` included) is refused.
#[test]
fn existing_directories_keep_their_mode_and_must_be_empty() {
    let dir = TempDir::new("rel-existing");
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let out = run_script(dir.path(), &shared, &[], "$LG publish --records 5");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let mode = std::fs::metadata(&shared)
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o1777, "the directory's mode was changed");
    assert_eq!(intact_records(&shared), 5);

    let full = dir.path().join("full");
    std::fs::create_dir(&full).expect("mkdir");
    std::fs::write(full.join("notes.txt"), "mine").expect("write");
    for (cwd, out_dir) in [(dir.path(), full.clone()), (&*full, full.join("."))] {
        let out = run_script(cwd, &out_dir, &[], "$LG publish --records 5");
        assert_eq!(out.status.code(), Some(125), "{}", describe(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("not empty"), "{stderr}");
        let names: Vec<_> = std::fs::read_dir(&full).expect("ls").collect();
        assert_eq!(names.len(), 1, "nothing added to a refused directory");
    }
    // A finished store is not written into again.
    let out = run_script(dir.path(), &shared, &[], "$LG publish --records 5");
    assert_eq!(out.status.code(), Some(125), "{}", describe(&out));
    assert_eq!(intact_records(&shared), 5);
}

/// Two `ttrace run --out SAME` at once: exactly one writes the store, the other is
/// refused, and the store holds the winner's records only.
#[test]
fn two_runs_into_one_store_never_both_write_it() {
    let dir = TempDir::new("rel-two");
    for round in 0..15 {
        let store = dir.path().join(format!("st{round}"));
        let start = |rank: &str| {
            let mut c = ttrace(dir.path());
            c.args(["run", "-q", "--out"])
                .arg(&store)
                .arg("--")
                .arg(loadgen())
                .args([
                    "publish",
                    "--records",
                    "20",
                    "--per-step",
                    "5",
                    "--rank",
                    rank,
                ])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped());
            c.spawn().expect("starts")
        };
        let (mut a, mut b) = (start("0"), start("1"));
        let (sa, sb) = (wait_at_most(&mut a, LIMIT), wait_at_most(&mut b, LIMIT));
        let ok = [sa, sb].iter().filter(|s| s.code() == Some(0)).count();
        assert_eq!(ok, 1, "round {round}: {sa:?} {sb:?}");
        let m = Manifest::read(&store).expect("the winner's manifest");
        assert!(m.finalized);
        assert_eq!(m.ranks.len(), 1, "round {round}: one run's processes only");
        assert_eq!(intact_records(&store), 20, "round {round}");
        assert_eq!(m.lost_records(), 0);
    }
}

/// A small good store to damage.
fn good_store(dir: &Path, name: &str) -> std::path::PathBuf {
    let store = dir.join(name);
    let out = run_script(dir, &store, &[], "$LG publish --records 30 --per-step 10");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    store
}

fn ttrace_cmd(dir: &Path, args: &[&str]) -> Output {
    let mut c = ttrace(dir);
    c.args(args);
    output_within(&mut c, LIMIT)
}

/// A crafted store. A FIFO as segment or manifest does not hang the readers; an index
/// linked to /dev/zero is not read; `fsck --repair` never writes outside the store.
#[test]
fn a_crafted_store_neither_hangs_readers_nor_leads_repair_outside() {
    let dir = TempDir::new("rel-crafted");
    let d = dir.path();
    // FIFOs.
    let st = good_store(d, "fifo");
    let seg = st.join("rank00000/step000001.seg");
    std::fs::remove_file(&seg).expect("rm");
    let mkfifo = |p: &Path| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    };
    mkfifo(&seg);
    let st_s = st.to_str().expect("utf-8");
    for args in [
        vec!["ls", st_s],
        vec!["fsck", st_s],
        vec!["stats", st_s],
        vec!["check", st_s],
    ] {
        ttrace_cmd(d, &args); // returns (the guard panics on a hang)
    }
    std::fs::remove_file(st.join("manifest.json")).expect("rm");
    mkfifo(&st.join("manifest.json"));
    for args in [vec!["ls", st_s], vec!["fsck", st_s]] {
        ttrace_cmd(d, &args);
    }

    // An index that is a link to an endless device.
    let st = good_store(d, "zero");
    let idx = st.join("rank00000/step000000.idx");
    std::fs::remove_file(&idx).expect("rm");
    std::os::unix::fs::symlink("/dev/zero", &idx).expect("symlink");
    let out = ttrace_cmd(d, &["ls", st.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));

    // A segment with a torn tail outside the store, reached through a linked rank directory
    // and through a linked segment: repair leaves it alone and writes nothing outside.
    let st = good_store(d, "links");
    let outside = d.join("outside");
    std::fs::create_dir(&outside).expect("mkdir");
    let victim = outside.join("step000000.seg");
    let mut bytes = std::fs::read(st.join("rank00000/step000000.seg")).expect("read");
    bytes.truncate(bytes.len() - 7);
    std::fs::write(&victim, &bytes).expect("write");
    std::os::unix::fs::symlink(&outside, st.join("rank00007")).expect("symlink");
    std::fs::remove_file(st.join("rank00000/step000002.seg")).expect("rm");
    std::os::unix::fs::symlink(&victim, st.join("rank00000/step000002.seg")).expect("symlink");
    let _ = ttrace_cmd(d, &["fsck", "--repair", st.to_str().expect("utf-8")]);
    assert_eq!(
        std::fs::read(&victim).expect("still there"),
        bytes,
        "a file outside the store was changed"
    );
    let names: Vec<String> = std::fs::read_dir(&outside)
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        vec!["step000000.seg".to_string()],
        "nothing written outside"
    );
}

/// `fsck --repair` removes a segment too short for its header (left by a disk
/// that filled as it was created), and creates `lost+found/` private.
#[test]
fn repair_removes_headerless_segments_and_keeps_lost_found_private() {
    let dir = TempDir::new("rel-repair");
    let st = good_store(dir.path(), "st");
    std::fs::write(st.join("rank00000/step000099.seg"), b"").expect("empty segment");
    let seg = st.join("rank00000/step000001.seg");
    let mut bytes = std::fs::read(&seg).expect("read");
    bytes.truncate(bytes.len() - 5);
    std::fs::write(&seg, &bytes).expect("torn tail");
    let s = st.to_str().expect("utf-8");
    let out = ttrace_cmd(dir.path(), &["fsck", "--repair", "--force", s]);
    // 1: the record cut with the torn tail stays reported as lost.
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(!st.join("rank00000/step000099.seg").exists());
    let mode = std::fs::metadata(st.join("lost+found"))
        .expect("lost+found")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    let out = ttrace_cmd(dir.path(), &["fsck", s]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("step 99"), "{stdout}");
}

/// `ttrace export` on a full disk (a file-size limit: writes past it fail with `EFBIG`):
/// a segment whose files cannot be written leaves none of them behind (no truncated `.npy`,
/// none the index does not list), says so, and what was exported is whole.
#[test]
fn an_export_that_cannot_write_a_segment_leaves_none_of_its_files() {
    let dir = TempDir::new("rel-export");
    let store = dir.path().join("st");
    let made = run_script(
        dir.path(),
        &store,
        &[],
        "$LG publish --rank 0 --records 40 --per-step 20 --elems 8192",
    );
    assert_eq!(made.status.code(), Some(0), "{}", describe(&made));
    let out = dir.path().join("npy");
    let mut c = ttrace(dir.path());
    c.args(["export"])
        .arg(&store)
        .args(["--format", "npy", "--widen", "--json", "--out"])
        .arg(&out);
    // Each tensor's file (8192 elements) is larger than this: every write fails.
    file_size_limit(&mut c, 16 << 10);
    let ex = output_within(&mut c, LIMIT);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&ex.stdout),
        String::from_utf8_lossy(&ex.stderr)
    );
    assert!(
        said.contains("nothing exported from it"),
        "{}",
        describe(&ex)
    );
    let mut left = Vec::new();
    let mut walk = vec![out.clone()];
    while let Some(d) = walk.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk.push(p);
            } else if p.extension().is_some_and(|x| x == "npy") {
                left.push(p);
            }
        }
    }
    assert!(left.is_empty(), "files of failed segments left: {left:?}");
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("index.json")).expect("index"))
            .expect("json");
    assert_eq!(index.as_array().map(Vec::len), Some(0), "{index}");
}
