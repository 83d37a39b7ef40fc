//! Shared by the reliability_* tests: `ttrace run` in a scratch directory, a producer
//! (examples/loadgen, which speaks the protocol like libttrace.so), small file systems that
//! fill up, and counting what a store really holds.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use integration_tests::{bin, profile_dir};
use ttrace_format::reader::{Segment, Store};
use ttrace_format::store::Manifest;

#[allow(unused_imports)]
pub use integration_tests::{describe, TempDir};

/// The library `ttrace run` preloads: libttrace.so when built, else an inert stand-in.
pub fn preload_lib() -> PathBuf {
    let real = profile_dir().join("libttrace.so");
    if real.exists() {
        real
    } else {
        integration_tests::sim_dir().join("libnvToolsExt.so.1")
    }
}

/// `ttrace` in `dir`, cut off from the caller's ttrace environment.
pub fn ttrace(dir: &Path) -> Command {
    let mut c = Command::new(bin("ttrace"));
    c.current_dir(dir)
        .env("TTRACE_LIB", preload_lib())
        .env("LD_LIBRARY_PATH", integration_tests::sim_dir())
        .env_remove("TTRACE_DAEMON")
        .env_remove("TTRACE_PERTURB")
        .env_remove("LD_PRELOAD");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TTRACE_") && k != "TTRACE_LOG" {
            c.env_remove(k);
        }
    }
    c.env("TTRACE_LIB", preload_lib());
    c
}

/// examples/loadgen of the daemon crate.
pub fn loadgen() -> PathBuf {
    let p = profile_dir().join("examples").join("loadgen");
    assert!(
        p.exists(),
        "{} is missing: cargo build --release --examples -p ttraced",
        p.display()
    );
    p
}

/// Records a reader finds intact in the store (0 when it cannot be opened).
pub fn intact_records(store: &Path) -> u64 {
    let Ok(st) = Store::open(store) else {
        return 0;
    };
    let mut n = 0;
    for info in st.segments() {
        let Ok(seg) = Segment::open(&info.path) else {
            continue;
        };
        n += seg.records().filter(Result::is_ok).count() as u64;
    }
    n
}

/// Records the manifest reports lost.
pub fn reported_lost(store: &Path) -> u64 {
    Manifest::read(store).map_or(0, |m| m.lost_records())
}

/// A small file system mounted on a scratch directory (unmounted when dropped).
pub struct SmallFs {
    pub mount: PathBuf,
    image: Option<PathBuf>,
    _dir: TempDir,
}

impl SmallFs {
    /// A tmpfs of `size` (e.g. "3m"); `None` (with a line saying the test is skipped) where
    /// this machine does not let the test mount one (not root, no CAP_SYS_ADMIN).
    pub fn tmpfs(size: &str) -> Option<SmallFs> {
        let dir = TempDir::new("tmpfs");
        let mount = dir.path().join("m");
        std::fs::create_dir(&mount).expect("mount point");
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(&mount)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("SKIPPED: cannot mount a tmpfs here (needs root)");
            return None;
        }
        Some(SmallFs {
            mount,
            image: None,
            _dir: dir,
        })
    }

    /// A loop-mounted ext4 of `mib` MiB (where direct I/O is taken); `None` with a line
    /// saying the test is skipped where that is not possible.
    pub fn ext4(mib: u64) -> Option<SmallFs> {
        let dir = TempDir::new("ext4");
        let image = dir.path().join("fs.img");
        let mount = dir.path().join("m");
        std::fs::create_dir(&mount).expect("mount point");
        let f = std::fs::File::create(&image).expect("image");
        f.set_len(mib << 20).expect("image size");
        let made = Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&image)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            && Command::new("mount")
                .args(["-o", "loop"])
                .arg(&image)
                .arg(&mount)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        if !made {
            eprintln!("SKIPPED: cannot loop-mount an ext4 image here (needs root and mkfs.ext4)");
            return None;
        }
        Some(SmallFs {
            mount,
            image: Some(image),
            _dir: dir,
        })
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        if let Some(i) = &self.image {
            let _ = std::fs::remove_file(i);
        }
    }
}

/// Waits for `child` at most `limit` (a guard against a hang, not a timing assertion).
pub fn wait_at_most(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return st;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("the process did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `cmd` to its end with a hang guard; returns its output.
pub fn output_within(cmd: &mut Command, limit: Duration) -> std::process::Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let out = std::thread::scope(|s| {
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let o = s.spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = stdout {
                let _ = std::io::Read::read_to_end(&mut r, &mut v);
            }
            v
        });
        let e = s.spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = stderr {
                let _ = std::io::Read::read_to_end(&mut r, &mut v);
            }
            v
        });
        let status = wait_at_most(&mut child, limit);
        std::process::Output {
            status,
            stdout: o.join().unwrap_or_default(),
            stderr: e.join().unwrap_or_default(),
        }
    });
    out
}

/// Limits the size of the files `cmd` writes to `bytes` (`RLIMIT_FSIZE`, the soft limit: a
/// child may lift it for itself): a full disk without root, wherever the test runs. A write
/// past it fails with `EFBIG` instead of killing the writer (`SIGXFSZ` ignored).
pub fn file_size_limit(cmd: &mut Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only async-signal-safe calls (setrlimit, signal).
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: libc::RLIM_INFINITY,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
}
