//! The capture session of this process, started by its first captured op: the snapshot ring
//! (a `memfd`, mapped, page-locked with the real `cudaHostRegister`), the daemon connection
//! (`Hello` carrying the memfd) and the tracer thread. A failed start disables capture with one
//! log line; the program goes on untraced.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;
use std::time::Duration;

use ttrace_format::config::CaptureConfig;
use ttrace_format::ring::{self, Ring};
use ttrace_format::wire::{Hello, PROTOCOL_VERSION};

use crate::client::Client;
use crate::{cuda, identity, log, mode, tracer};

/// A running session.
pub struct Session {
    pub ring: &'static Ring,
    pub cfg: &'static CaptureConfig,
    /// The process that started it (a forked child must not use it).
    pub pid: u32,
}

static SESSION: OnceLock<Option<Session>> = OnceLock::new();
static RING: OnceLock<Ring> = OnceLock::new();

/// The session, started on first use (`None`: capture is off).
pub fn get() -> Option<&'static Session> {
    if mode::dead() {
        return None;
    }
    let s = SESSION
        .get_or_init(|| match start() {
            Ok(s) => Some(s),
            Err(e) => {
                if mode::disable() {
                    log::error(&format!("capture disabled: {e}"));
                }
                None
            }
        })
        .as_ref()?;
    (s.pid == std::process::id()).then_some(s)
}

/// The session if it was started (never starts one).
pub fn current() -> Option<&'static Session> {
    SESSION.get()?.as_ref()
}

fn start() -> Result<Session, String> {
    let cfg = mode::config().ok_or("no valid configuration")?;
    let socket = cfg.socket.as_deref().ok_or("TTRACE_SOCKET is not set")?;
    let capacity = (cfg.ring_bytes / ring::ALIGN * ring::ALIGN).max(ring::ALIGN * 2);
    let len = ring::mapping_bytes(capacity);

    // SAFETY: a NUL-terminated name; the fd is owned below.
    let fd = unsafe {
        libc::memfd_create(
            c"ttrace-ring".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: resizing our own memfd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(format!(
            "cannot size the {len}-byte ring: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: a shared read-write mapping of the whole memfd; it is never unmapped (the
    // daemon and in-flight DMA may use it until the process ends).
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(format!(
            "cannot map the {len}-byte ring: {}",
            std::io::Error::last_os_error()
        ));
    }
    let base = base.cast::<u8>();
    // SAFETY: a page-aligned writable mapping of mapping_bytes(capacity), alive for good.
    let ring = unsafe { Ring::create(base, capacity) }.map_err(|e| e.to_string())?;

    // Page-locking is an unsafe call during another thread's global-mode graph capture: make
    // it from relaxed mode, as the tracer does everything.
    let old = cuda::exchange_capture_mode(cuda_abi::cudart::cudaStreamCaptureModeRelaxed);
    let pinned = {
        let _e = cuda::ErrScope::new();
        cuda::host_register(base, len)
    };
    if let Ok(m) = old {
        let _ = cuda::exchange_capture_mode(m);
    }
    pinned.map_err(|code| {
        format!("cudaHostRegister of the snapshot ring failed (cudaError {code})")
    })?;

    let (exe, argv) = identity::exe_and_argv();
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        pid: std::process::id(),
        rank: identity::rank(),
        world_size: identity::world_size(),
        local_rank: identity::local_rank(),
        hostname: identity::hostname(),
        exe,
        argv,
        ring_capacity: capacity,
    };
    let (client, run_id) = Client::connect(socket, hello, fd.as_raw_fd())?;
    drop(fd); // the daemon holds its own; the mapping stays
    log::info(&format!(
        "capturing into run {run_id} (ring {capacity} bytes, rank {})",
        identity::rank()
    ));

    let ring: &'static Ring = {
        let _ = RING.set(ring);
        RING.get().ok_or("the ring was set twice")?
    };
    tracer::start(client, ring, cfg)?;
    // SAFETY: `on_exit` is an extern "C" fn without arguments, registered once, from the first
    // capturing call: after the runtime registered its own teardown, so ours runs first.
    unsafe { libc::atexit(on_exit) };
    Ok(Session {
        ring,
        cfg,
        pid: std::process::id(),
    })
}

/// At exit: the tracer publishes what was called so far (its snapshots complete on the
/// device meanwhile), sends `Bye`, and the process goes on exiting. A forked child inherits
/// the registration and does nothing.
extern "C" fn on_exit() {
    let _ = std::panic::catch_unwind(|| {
        if current().is_some_and(|s| s.pid == std::process::id()) {
            let wait = mode::config().map_or(10_000, |c| c.wait_ms.clamp(1_000, 30_000));
            tracer::shutdown(Duration::from_millis(wait));
        }
    });
}
