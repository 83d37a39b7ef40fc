//! The user's default collector, for a process preloaded without `TTRACE_SOCKET`
//! (`LD_PRELOAD=libttrace.so torchrun ...`).
//!
//! The socket lives in a directory private to the user: `$XDG_RUNTIME_DIR/ttrace` (when that
//! directory is the user's), else `/tmp/ttrace-UID`; it is created `0700` and refused when
//! another user owns it or others can enter it (somebody else's socket there could receive
//! our tensors). When nobody listens, the first process takes `collector.lock` (flock: the
//! eight ranks of a node starting together start one collector), starts `ttraced --detach`
//! (found through `TTRACE_COLLECTOR`, next to libttrace.so, or on `PATH`), and every process
//! connects to it. The collector logs to `collector.log` in the same directory and exits by
//! itself once it has had no client for a while.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ttrace_proto::wire::Hello;

use crate::client::{Client, ConnectError, Welcome};
use crate::log;

/// File name of the socket in the private directory.
const SOCKET: &str = "collector.sock";
/// How long a process waits for the lock while another one starts the collector, and for a
/// collector it started to listen.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The directory of the user's collector, created `0700` and checked.
pub fn private_dir() -> Result<PathBuf, String> {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = match std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute() && owned_by(d, uid))
    {
        Some(base) => base.join("ttrace"),
        None => PathBuf::from(format!("/tmp/ttrace-{uid}")),
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    check_private(&dir, uid)?;
    Ok(dir)
}

fn owned_by(p: &Path, uid: u32) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_dir() && m.uid() == uid)
}

/// A directory (not a link to one) of `uid` that nobody else may enter.
fn check_private(dir: &Path, uid: u32) -> Result<(), String> {
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !m.is_dir() {
        return Err(format!(
            "{} is not a directory (a link or a file is in the way of the collector's socket)",
            dir.display()
        ));
    }
    if m.uid() != uid {
        return Err(format!(
            "{} belongs to uid {}, not to this user (uid {uid}): refusing to use a collector \
             socket there; set TTRACE_SOCKET or XDG_RUNTIME_DIR",
            dir.display(),
            m.uid()
        ));
    }
    if m.mode() & 0o077 != 0 {
        return Err(format!(
            "{} is accessible to other users (mode {:o}): refusing to use a collector socket \
             there; `chmod 700` it",
            dir.display(),
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Connects to the user's collector, starting one when nobody listens.
/// `answer_within` bounds each wait for the collector's answer to `Hello`.
pub fn connect(
    hello: &Hello,
    ring_fd: BorrowedFd<'_>,
    answer_within: Duration,
) -> Result<(Client, Welcome), String> {
    let dir = private_dir()?;
    let socket = dir.join(SOCKET);
    match Client::connect(&socket, hello.clone(), ring_fd, answer_within) {
        Err(ConnectError::NoListener(_)) => {}
        other => return other.map_err(|e| e.to_string()),
    }
    let _lock = lock(&dir.join("collector.lock"))?;
    // Another process may have started it while this one waited for the lock.
    match Client::connect(&socket, hello.clone(), ring_fd, answer_within) {
        Err(ConnectError::NoListener(_)) => {}
        other => return other.map_err(|e| e.to_string()),
    }
    start(&dir, &socket)?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        match Client::connect(&socket, hello.clone(), ring_fd, answer_within) {
            Err(ConnectError::NoListener(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(ConnectError::NoListener(e)) => {
                return Err(format!(
                    "the collector did not start listening within {START_TIMEOUT:?} ({e}); \
                     see {}",
                    dir.join("collector.log").display()
                ))
            }
            other => return other.map_err(|e| e.to_string()),
        }
    }
}

/// Holds `collector.lock` (released when the file is closed, also by a crash).
fn lock(path: &Path) -> Result<File, String> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(f);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(format!("cannot lock {}: {e}", path.display()));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{} stayed locked for {START_TIMEOUT:?} (another process is starting the \
                 collector)",
                path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts `ttraced --detach` on `socket` and reaps the starter (the collector itself forks
/// away into a session of its own).
fn start(dir: &Path, socket: &Path) -> Result<(), String> {
    let exe = find_ttraced()?;
    let log_path = dir.join("collector.log");
    let log_file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&log_path)
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let mut cmd = Command::new(&exe);
    cmd.arg("--socket").arg(socket).arg("--detach");
    for (var, flag) in [
        ("TTRACE_COLLECTOR_IDLE", "--idle-exit"),
        ("TTRACE_COLLECTOR_LINGER", "--job-linger"),
    ] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            cmd.arg(flag).arg(v);
        }
    }
    let status = cmd
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log_file))
        .status();
    match status {
        Ok(st) if !st.success() => {
            return Err(format!(
                "{} --detach failed ({st}); see {}",
                exe.display(),
                log_path.display()
            ))
        }
        Ok(_) => {}
        // The program ignores SIGCHLD or reaps every child itself: the starter is gone
        // either way, and the connect loop finds out whether the collector listens.
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {}
        Err(e) => return Err(format!("cannot start {}: {e}", exe.display())),
    }
    log::info(&format!(
        "started the collector {} on {}",
        exe.display(),
        socket.display()
    ));
    Ok(())
}

/// `ttraced`: `TTRACE_COLLECTOR`, else next to libttrace.so (or in `../bin` of it, as a
/// Python package installs it), else on `PATH`.
fn find_ttraced() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("TTRACE_COLLECTOR").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("TTRACE_COLLECTOR={} is not a file", p.display()))
        };
    }
    let mut tried = Vec::new();
    if let Some(lib_dir) = own_dir() {
        for c in [lib_dir.join("ttraced"), lib_dir.join("../bin/ttraced")] {
            if c.is_file() {
                return Ok(c);
            }
            tried.push(c);
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            let c = d.join("ttraced");
            if c.is_file() {
                return Ok(c);
            }
        }
    }
    Err(format!(
        "no ttraced found (looked at {} and on PATH); set TTRACE_COLLECTOR to its path",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// The directory libttrace.so was loaded from.
fn own_dir() -> Option<PathBuf> {
    crate::own_path()?.parent().map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_directory_others_can_enter_or_a_link_is_refused() {
        let base =
            std::env::temp_dir().join(format!("ttrace-collector-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).expect("mkdir");
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let open = base.join("open");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = check_private(&open, uid).expect_err("0777");
        assert!(e.contains("accessible to other users"), "{e}");
        let link = base.join("link");
        std::os::unix::fs::symlink(&open, &link).expect("symlink");
        assert!(check_private(&link, uid)
            .expect_err("link")
            .contains("not a directory"));
        let private = base.join("private");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&private)
            .expect("mkdir");
        check_private(&private, uid).expect("0700 and ours");
        let e = check_private(&private, uid + 1).expect_err("another uid");
        assert!(e.contains("belongs to uid"), "{e}");
        let _ = std::fs::remove_dir_all(&base);
    }
}
