//! Sleeping until the traced command exits or a signal arrives for it (`ttrace run`), without
//! waking up every few milliseconds: a pidfd (readable once the child exited, Linux 5.3+) and a
//! self-pipe the signal handler writes a byte into, polled together. Where the kernel has no
//! pidfd the caller polls.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

/// The self-pipe's write end, for the signal handler (-1: none).
static WAKE_WRITE: AtomicI32 = AtomicI32::new(-1);
/// The self-pipe's read end.
static WAKE_READ: OnceLock<OwnedFd> = OnceLock::new();

/// Makes the self-pipe (non-blocking at both ends, close-on-exec: the command does not
/// inherit it). Without it [`wake`] does nothing and [`ChildWaiter::new`] gives `None`.
pub fn install() {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if r != 0 {
        return;
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    if WAKE_READ.set(read).is_ok() {
        // The write end lives as long as the process (the handler may run at any time).
        WAKE_WRITE.store(std::os::fd::IntoRawFd::into_raw_fd(write), Ordering::SeqCst);
    }
}

/// Wakes [`ChildWaiter::wait`]. Async-signal-safe: one `write` of one byte (a full pipe
/// already holds a wake-up), `errno` preserved.
pub fn wake() {
    let fd = WAKE_WRITE.load(Ordering::SeqCst);
    if fd < 0 {
        return;
    }
    // SAFETY: errno is thread-local; it is restored so the interrupted code sees its own.
    unsafe {
        let errno = *libc::__errno_location();
        let byte = 1u8;
        let _ = libc::write(fd, (&byte as *const u8).cast(), 1);
        *libc::__errno_location() = errno;
    }
}

/// Sleeps until a child exits or [`wake`] is called.
pub struct ChildWaiter {
    pidfd: OwnedFd,
}

impl ChildWaiter {
    /// For child `pid` (not reaped yet); `None` without a pidfd or a self-pipe.
    pub fn new(pid: u32) -> Option<ChildWaiter> {
        WAKE_READ.get()?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: the descriptor was just returned by the kernel and is owned by nobody else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Some(ChildWaiter { pidfd })
    }

    /// Sleeps until the child exited or a signal handler called [`wake`] (then the wake-ups
    /// are consumed). May return early (EINTR); the caller checks both.
    pub fn wait(&self) {
        let Some(wake) = WAKE_READ.get() else { return };
        let mut fds = [
            libc::pollfd {
                fd: self.pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll reads and writes the two pollfd entries it is given.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n > 0 && fds[1].revents != 0 {
            let mut buf = [0u8; 64];
            // SAFETY: reads at most buf.len() bytes into buf; the pipe is non-blocking.
            while unsafe { libc::read(wake.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
        }
    }
}
