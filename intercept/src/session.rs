//! The capture session of this process, started by its first captured op: the snapshot ring
//! (a `memfd`, mapped, page-locked with the real `cudaHostRegister` as it is first used,
//! [`RingPin`]), the daemon connection
//! (`Hello` carrying the memfd) and the tracer thread. A failed start disables capture with one
//! log line; the program goes on untraced.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use ttrace_proto::config::CaptureConfig;
use ttrace_proto::ring::{self, Ring};
use ttrace_proto::wire::{Hello, PROTOCOL_VERSION};

use crate::client::Client;
use crate::{collector, cuda, identity, log, mode, stall, tracer};

/// A running session.
pub struct Session {
    pub ring: &'static Ring,
    pub cfg: &'static CaptureConfig,
    /// The process that started it (a forked child must not use it).
    pub pid: u32,
    /// How much of the ring is page-locked.
    pub pin: RingPin,
}

/// Bytes of the ring's data area page-locked when the session starts: the first part
/// ([`RingPin::part_end`]). Small, because locking costs every process that captures
/// anything, also one whose records are all outside `--steps` and whose snapshots are the step
/// rule's few fingerprints: 2 MiB cost about 1.2 ms of CPU per process on the simulator (eight
/// tiny processes under `--steps` outside the run: 50 ms against 38 ms with 256 KiB).
pub const FIRST_PIN_BYTES: u64 = 256 << 10;

/// Parts of [`FIRST_PIN_BYTES`] each the ring's front is locked in before the parts double:
/// what a run outside `--steps` holds in flight while the `auto` rule learns the steps (the
/// operands the rule reads, copied about a step ahead of the device: the ring's head passed
/// 0.5 MiB on the simulated tp2 dp2 pp2 job before the hooks were told the anchor early,
/// `Tracer::tell_anchor_early`, and 256 KiB in most processes since) then takes whole
/// 256 KiB parts, where doubling parts locked up to twice what was needed.
const LINEAR_PIN_PARTS: u64 = 4;

/// The page-locked front of the ring's data area. `cudaHostRegister` faults in and locks
/// every page it is given (a 1 GiB ring: about 0.3 s of a process's start on an H200, and 1 GiB
/// of locked memory whether snapshots ever need it or not), while a ring that keeps up with
/// its collector only reuses its first pages (ring.rs: an empty ring starts over). So the ring
/// is locked from its start, part by part, as slots first reach a part and before any copy
/// goes into it: [`FIRST_PIN_BYTES`], more parts of that size up to [`LINEAR_PIN_PARTS`] of
/// them, then parts that double while they end in the ring's first half, then the rest. Locked memory grows with what the capture uses: a full capture
/// of a small model locks tens of MiB (one that locked the rest once past a sixteenth of the ring cost the
/// simulated hidden-64 job 3.1x its untraced CPU instead of 2.2x). The price: slots never cross
/// a part's end, so the largest slot is half the ring, and a burst of large slots that cannot
/// wait for releases (an NCCL group) finds less room than in one unbroken ring.
pub struct RingPin {
    /// Address of the data area (page-aligned: the ring's header is one page).
    data: usize,
    capacity: u64,
    /// Bytes of the data area locked, from its start.
    locked: AtomicU64,
    /// Serialises registrations.
    grow: Mutex<()>,
}

impl RingPin {
    fn new(base: *mut u8, capacity: u64) -> RingPin {
        RingPin {
            data: base as usize + ring::HEADER_BYTES,
            capacity,
            locked: AtomicU64::new(0),
            grow: Mutex::new(()),
        }
    }

    /// Bytes of the data area page-locked so far.
    pub fn locked(&self) -> u64 {
        self.locked.load(Ordering::Acquire)
    }

    /// Page-locks the data area up to offset `end` at least, part by part, unless it already
    /// is.
    pub fn cover(&self, end: u64) -> Result<(), String> {
        self.cover_with(end, pin_ring)
    }

    /// [`Self::cover`], locking each new part with `pin` (address, bytes).
    fn cover_with(
        &self,
        end: u64,
        mut pin: impl FnMut(*mut u8, usize) -> Result<(), String>,
    ) -> Result<(), String> {
        if end <= self.locked() {
            return Ok(());
        }
        let _g = self.grow.lock().unwrap_or_else(|p| p.into_inner());
        let mut locked = self.locked();
        while locked < end.min(self.capacity) {
            let next = self.part_end(locked);
            pin(
                (self.data + locked as usize) as *mut u8,
                (next - locked) as usize,
            )?;
            locked = next;
            self.locked.store(locked, Ordering::Release);
        }
        Ok(())
    }

    /// Where the parts before the last end: every [`FIRST_PIN_BYTES`] up to
    /// [`LINEAR_PIN_PARTS`] of them, then doubling, while they end in the ring's first half
    /// (none when the first part would not).
    fn front_ends(&self) -> impl Iterator<Item = u64> {
        let front = self.capacity / 2;
        std::iter::successors(Some(FIRST_PIN_BYTES), |&e| {
            Some(if e < LINEAR_PIN_PARTS * FIRST_PIN_BYTES {
                e + FIRST_PIN_BYTES
            } else {
                e * 2
            })
        })
        .take_while(move |&e| e <= front)
    }

    /// The end of the registered part of the data area that holds offset `off`. A device copy
    /// must lie in one registration (across two, CUDA refuses it: `cudaErrorInvalidValue`,
    /// seen on an H200), so slots never cross a part's end (`Ring::reserve_within`).
    pub fn part_end(&self, off: u64) -> u64 {
        self.front_ends()
            .find(|&e| e > off)
            .unwrap_or(self.capacity)
    }

    /// Bytes of the largest part (the last): the largest slot the ring can hold.
    pub fn largest_part(&self) -> u64 {
        self.capacity - self.front_ends().last().unwrap_or(0)
    }
}

static SESSION: OnceLock<Option<Session>> = OnceLock::new();
static RING: OnceLock<Ring> = OnceLock::new();

/// The session, started on first use (`None`: capture is off). A forked child gets none: its
/// fork handler marked capture dead (lib.rs), which spares every hook a `getpid`.
pub fn get() -> Option<&'static Session> {
    if mode::dead() {
        return None;
    }
    SESSION
        .get_or_init(|| match start() {
            Ok(s) => Some(s),
            Err(e) => {
                if mode::disable() {
                    report_off(&e);
                }
                None
            }
        })
        .as_ref()
}

/// The session if it was started (never starts one).
pub fn current() -> Option<&'static Session> {
    SESSION.get()?.as_ref()
}

/// Says once why capture is off. Under `ttrace run` (`TTRACE_SOCKET`) every process logs it;
/// with the bare preload the line goes to stderr from each node's first local rank only (a
/// job's eight ranks fail alike), whatever `TTRACE_LOG` says, and the others log it.
fn report_off(why: &str) {
    let bare = mode::config().is_some_and(|c| c.socket.is_none());
    if bare && identity::local_rank() == 0 {
        announce(&format!(
            "capture off: {why} (the program runs untraced; TTRACE=0 silences this)"
        ));
    } else {
        log::error(&format!("capture disabled: {why}"));
    }
}

/// One line on stderr, whatever the log level.
pub(crate) fn announce(line: &str) {
    use std::io::Write;
    let line = format!("ttrace[{}]: {line}\n", std::process::id());
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// What the daemon learns about the job in `Hello`, besides the process.
fn job_hello(hello: &mut Hello, cfg: &CaptureConfig) -> Result<(), String> {
    let cwd = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
    hello.job = identity::job();
    hello.command = identity::job_command(&hello.job);
    hello.cwd = cwd.display().to_string();
    hello.out = std::env::var_os("TTRACE_OUT")
        .filter(|v| !v.is_empty())
        .map(|v| cwd.join(v).display().to_string());
    hello.level = match std::env::var("TTRACE_LEVEL") {
        Ok(v) if !v.trim().is_empty() => Some(v.trim().parse().map_err(|_| {
            format!("TTRACE_LEVEL={v}: expected a zstd level (an integer, e.g. -1000 or 3)")
        })?),
        _ => None,
    };
    hello.capture = Some(cfg.clone());
    hello.env = manifest_env();
    Ok(())
}

/// The environment for the manifest: every variable that is valid UTF-8, up to 256 KiB in
/// all (a Hello is at most 1 MiB), credentials redacted before they leave the process (names
/// in `TTRACE_ENV_ALLOW`, comma-separated, are kept).
fn manifest_env() -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let mut total = 0usize;
    for (k, v) in std::env::vars_os() {
        let (Ok(k), Ok(v)) = (k.into_string(), v.into_string()) else {
            continue;
        };
        total += k.len() + v.len();
        if total > 256 << 10 {
            break;
        }
        out.insert(k, v);
    }
    let allow: Vec<String> = std::env::var("TTRACE_ENV_ALLOW")
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
        .unwrap_or_default();
    ttrace_proto::secrets::redact_env(&mut out, &allow);
    out
}

/// The memory this process may use: the host's, or its cgroup's limit (v2 `memory.max`, v1
/// `memory.limit_in_bytes`) when lower. 0 when unknown (the ring then gets its minimum).
fn usable_memory() -> u64 {
    // SAFETY: sysconf only reads system constants.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let host = (pages.max(0) as u64).saturating_mul(page.max(0) as u64);
    [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .filter_map(|s| s.trim().parse::<u64>().ok())
    .fold(host, u64::min)
}

fn start() -> Result<Session, String> {
    let cfg = mode::config().ok_or("no valid configuration")?;
    let capacity = ring_capacity(cfg);
    let len = ring::mapping_bytes(capacity);
    let (fd, base) = map_ring_memfd(len)?;
    // SAFETY: a page-aligned writable mapping of mapping_bytes(capacity), alive for good.
    let ring = unsafe { Ring::create(base, capacity) }.map_err(|e| e.to_string())?;
    let pin = RingPin::new(base, capacity);
    pin.cover(FIRST_PIN_BYTES)?;
    let hello = process_hello(capacity, cfg)?;
    let client = connect_daemon(cfg, hello, fd)?;
    let ring: &'static Ring = {
        let _ = RING.set(ring);
        RING.get().ok_or("the ring was set twice")?
    };
    tracer::start(client, ring, cfg)?;
    crate::lookups::report();
    // SAFETY: `on_exit` is an extern "C" fn without arguments, registered once, from the first
    // capturing call: after the runtime registered its own teardown, so ours runs first.
    unsafe { libc::atexit(on_exit) };
    crate::fatal::install();
    Ok(Session {
        ring,
        cfg,
        pin,
        pid: std::process::id(),
    })
}

/// The ring's capacity: the configured size (0: sized to the memory this process may use,
/// shared by the node's local ranks), in whole slots of `ring::ALIGN`, at least two.
fn ring_capacity(cfg: &CaptureConfig) -> u64 {
    let bytes = match cfg.ring_bytes {
        0 => ttrace_proto::config::auto_ring_bytes(
            usable_memory(),
            identity::local_world_size() as u64,
        ),
        n => n,
    };
    (bytes / ring::ALIGN * ring::ALIGN).max(ring::ALIGN * 2)
}

/// A sealable memfd of `len` bytes (proto's one ring memfd), mapped shared read-write for
/// good: the descriptor (for the daemon) and the mapping's base.
fn map_ring_memfd(len: usize) -> Result<(OwnedFd, *mut u8), String> {
    let fd = ring::create_memfd(len as u64).map_err(|e| e.to_string())?;
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
    Ok((fd, base.cast::<u8>()))
}

/// Page-locks `len` bytes of the ring at `base` with the real `cudaHostRegister`, so snapshots
/// can be copied into them asynchronously.
fn pin_ring(base: *mut u8, len: usize) -> Result<(), String> {
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
    pinned
        .map_err(|code| format!("cudaHostRegister of the snapshot ring failed (cudaError {code})"))
}

/// The `Hello` this process introduces itself with: who it is, its job, its ring.
fn process_hello(capacity: u64, cfg: &CaptureConfig) -> Result<Hello, String> {
    let (exe, argv) = identity::exe_and_argv();
    let mut hello = Hello {
        protocol: PROTOCOL_VERSION,
        pid: std::process::id(),
        rank: identity::rank(),
        world_size: identity::world_size(),
        local_rank: identity::local_rank(),
        hostname: identity::hostname(),
        exe,
        argv,
        ring_capacity: capacity,
        ..Hello::default()
    };
    job_hello(&mut hello, cfg)?;
    Ok(hello)
}

/// Connects to the daemon (`TTRACE_SOCKET`) or the user's collector, handing it the ring's
/// memfd, and says where the records go.
fn connect_daemon(cfg: &CaptureConfig, hello: Hello, fd: OwnedFd) -> Result<Client, String> {
    let job_label = hello.job.label.clone();
    let capacity = hello.ring_capacity;
    // An unresponsive daemon delays the first captured call by at most the stall budget.
    let connecting = std::time::Instant::now();
    let within = stall::remaining(cfg.max_stall_ms);
    let connected = match cfg.socket.as_deref() {
        Some(socket) => {
            Client::connect(Path::new(socket), hello, fd.as_fd(), within).map_err(|e| e.to_string())
        }
        None => collector::connect(&hello, fd.as_fd(), within),
    };
    stall::charge(connecting.elapsed());
    let (client, welcome) = connected?;
    drop(fd); // the daemon holds its own; the mapping stays
    if cfg.socket.is_none() && welcome.first {
        announce(&format!(
            "capturing job {job_label} into {} (read it with `ttrace ls {}` when the job ends; \
             TTRACE=0 turns capture off)",
            welcome.store, welcome.store
        ));
    }
    log::info(&format!(
        "capturing into run {} at {} (ring {capacity} bytes, rank {})",
        welcome.run_id,
        welcome.store,
        identity::rank()
    ));
    Ok(client)
}

/// At exit: the tracer publishes what was called so far (its snapshots complete on the
/// device meanwhile), sends `Bye`, and the process goes on exiting. A forked child inherits
/// the registration and does nothing.
extern "C" fn on_exit() {
    let _ = std::panic::catch_unwind(|| {
        if current().is_some_and(|s| s.pid == std::process::id()) {
            crate::lookups::report();
            let wait = mode::config().map_or(10_000, |c| c.wait_ms.clamp(1_000, 30_000));
            tracer::shutdown(Duration::from_millis(wait));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// The ring is locked from its front, doubling, only as far as slots reach; a failed
    /// registration locks nothing more and says why.
    #[test]
    fn the_ring_is_page_locked_from_its_front_as_far_as_slots_reach() {
        const KIB: u64 = 1 << 10;
        assert_eq!(
            FIRST_PIN_BYTES,
            256 * KIB,
            "the parts below are of this first part"
        );
        let base = 0x7f00_0000_0000usize as *mut u8;
        let data = base as usize + ring::HEADER_BYTES;
        let pin = RingPin::new(base, 20 * MIB);
        let mut calls = Vec::new();
        let mut record = |p: *mut u8, len: usize| {
            calls.push(((p as usize - data) as u64 / KIB, len as u64 / KIB));
            Ok(())
        };
        pin.cover_with(64, &mut record).expect("first");
        assert_eq!(pin.locked(), FIRST_PIN_BYTES);
        // Already locked: nothing registered.
        pin.cover_with(FIRST_PIN_BYTES, &mut record)
            .expect("covered");
        // A slot ending at 700 KiB: two more parts of 256 KiB, not one of 512.
        pin.cover_with(700 * KIB, &mut record).expect("grow");
        assert_eq!(pin.locked(), 768 * KIB);
        // A slot ending at 3 MiB: ..1 MiB, then doubling: ..2 MiB, ..4 MiB.
        pin.cover_with(3 * MIB, &mut record).expect("grow");
        // Parts double while they end in the first half; the last runs to the end.
        pin.cover_with(20 * MIB, &mut record).expect("to the end");
        assert_eq!(
            calls,
            [
                (0, 256),
                (256, 256),
                (512, 256),
                (768, 256),
                (1024, 1024),
                (2048, 2048),
                (4096, 4096),
                (8192, 12 * 1024),
            ]
        );
        assert_eq!(pin.locked(), 20 * MIB);
        let ends: Vec<u64> = [0, 255, 256, 300, 700, 1024, 3000, 8192, 19000]
            .map(|k| pin.part_end(k * KIB) / KIB)
            .to_vec();
        assert_eq!(
            ends,
            [256, 256, 512, 512, 768, 2048, 4096, 20 * 1024, 20 * 1024]
        );
        assert_eq!(pin.largest_part(), 12 * MIB);
        // A ring of less than twice the first part is one part.
        let one = RingPin::new(base, 384 * KIB);
        assert_eq!(
            (one.part_end(0), one.largest_part()),
            (384 * KIB, 384 * KIB)
        );

        let small = RingPin::new(base, 4 * MIB);
        small.cover_with(1, |_, _| Ok(())).expect("first");
        let refused = small.cover_with(3 * MIB, |_, _| Err("out of pinned memory".into()));
        assert_eq!(refused, Err("out of pinned memory".to_string()));
        assert_eq!(
            small.locked(),
            FIRST_PIN_BYTES,
            "nothing more is taken as locked"
        );
    }
}
