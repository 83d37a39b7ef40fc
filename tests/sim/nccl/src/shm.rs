//! The shared-memory segment of a communicator: bootstrap, barriers, staging slots, mailboxes,
//! waiting and liveness.
//!
//! Every rank of a communicator maps the same file (in `/dev/shm`, named from the key derived
//! from the unique id). Layout, all offsets fixed by `(nranks, slot_bytes, mbox_bytes)` which the
//! creator writes in the header:
//!
//! * [`Header`]: magic, sizes, the join counter, the abort flag, the futex word every waiter
//!   sleeps on (`epoch`) and the barrier counters;
//! * one [`RankEntry`] per rank: its pid (0 until it joined), device, split colour/key, and the
//!   descriptor of its current collective (to catch ranks that disagree);
//! * one [`MboxHeader`] per ordered pair of ranks: byte counters of a ring buffer;
//! * data: one input slot of `slot_bytes` per rank, one shared output slot of `slot_bytes`, and
//!   one mailbox ring of `mbox_bytes` per ordered pair. The file is sparse: untouched pages cost
//!   nothing.
//!
//! Creation is race-free and replaces stale files of crashed runs: the creator builds the file
//! under a temporary name, takes a shared `flock` and `link`s it into place; a rank that opens an
//! existing file and can take an *exclusive* lock knows no live process holds it, so it is stale
//! and is unlinked. Once all ranks joined, the last one unlinks the name: the memory lives on in
//! the mappings and goes away with the last of them, so nothing is left behind even when a
//! program exits without destroying its communicators.
//!
//! Waiting: all state changes bump `epoch` and wake its futex (not `FUTEX_PRIVATE`, so it works
//! across processes on the shared mapping). A waiter re-checks its condition, the abort flag,
//! the liveness of the registered peers (`kill(pid, 0)`, zombies count as dead) and a deadline,
//! sleeping at most [`WAIT_SLICE`] at a time: a dead peer is noticed within a fraction of a
//! second and nothing blocks forever.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

/// Longest single futex sleep; liveness and the deadline are checked in between.
pub const WAIT_SLICE: Duration = Duration::from_millis(50);
/// How often a waiter checks that its peers are alive.
const LIVENESS_PERIOD: Duration = Duration::from_millis(100);
/// Marks a fully initialised segment ("SIMNCCL" + layout version).
const MAGIC: u64 = u64::from_le_bytes(*b"SIMNCCL\x01");
/// Default size of a rank's staging slot (and of the shared output slot).
pub const DEFAULT_SLOT_BYTES: usize = 256 << 10;
/// Default size of a point-to-point mailbox ring.
pub const DEFAULT_MBOX_BYTES: usize = 64 << 10;

/// Why a wait or a transfer failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fail {
    /// A registered peer process is gone.
    PeerDead { rank: usize, pid: u32 },
    /// Some rank flagged the communicator as failed (or aborted it).
    Aborted,
    /// The deadline (`SIM_NCCL_TIMEOUT`) passed.
    Timeout(&'static str),
    /// The ranks disagree about an operation (count, type, root, sizes).
    Mismatch(String),
    /// A buffer is not device-accessible: the kernel faults.
    BadPointer(&'static str),
    /// A system call failed.
    System(String),
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fail::PeerDead { rank, pid } => {
                write!(
                    f,
                    "rank {rank} (pid {pid}) exited while this rank waited for it"
                )
            }
            Fail::Aborted => write!(f, "the communicator was aborted by a peer"),
            Fail::Timeout(what) => write!(f, "timed out waiting for {what} (SIM_NCCL_TIMEOUT)"),
            Fail::Mismatch(s) => write!(f, "ranks disagree: {s}"),
            Fail::BadPointer(which) => write!(f, "{which} is not a device-accessible buffer"),
            Fail::System(s) => write!(f, "system error: {s}"),
        }
    }
}

/// The timeout of every wait: `SIM_NCCL_TIMEOUT` seconds (default 300).
pub fn timeout() -> Duration {
    let secs = std::env::var("SIM_NCCL_TIMEOUT")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(300.0);
    Duration::from_secs_f64(secs)
}

fn env_bytes(name: &str, default: usize, min: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(default)
        .max(min)
}

/// Staging slot size: `SIM_NCCL_SLOT_BYTES` (tests make it small to exercise chunking).
pub fn slot_bytes_from_env() -> usize {
    // A multiple of 64 so that every dtype and every per-rank block stays aligned.
    env_bytes("SIM_NCCL_SLOT_BYTES", DEFAULT_SLOT_BYTES, 1024) / 64 * 64
}

/// Mailbox size: `SIM_NCCL_MBOX_BYTES`.
pub fn mbox_bytes_from_env() -> usize {
    env_bytes("SIM_NCCL_MBOX_BYTES", DEFAULT_MBOX_BYTES, 64) / 8 * 8
}

/// The segment header, at offset 0.
#[repr(C)]
pub struct Header {
    magic: AtomicU64,
    nranks: AtomicU32,
    creator_pid: AtomicU32,
    slot_bytes: AtomicU64,
    mbox_bytes: AtomicU64,
    /// Ranks that registered.
    arrived: AtomicU32,
    /// 1 once every rank registered (and the name was unlinked).
    ready: AtomicU32,
    /// Nonzero once some rank declared the communicator failed.
    abort: AtomicU32,
    /// The futex word: bumped on every state change.
    epoch: AtomicU32,
    /// Threads sleeping on `epoch` (so that a bump without sleepers makes no system call).
    waiters: AtomicU32,
    _pad: u32,
    /// Arrivals at collective barriers (monotonic).
    pub coll_bar: AtomicU64,
    /// Arrivals at `ncclCommSplit` barriers (monotonic; separate from the data path).
    pub split_bar: AtomicU64,
}

/// Per-rank bootstrap and bookkeeping entry.
#[repr(C)]
pub struct RankEntry {
    /// The rank's process, 0 until it joined.
    pub pid: AtomicU32,
    /// Its CUDA device.
    pub device: AtomicI32,
    /// Colour and key of its current `ncclCommSplit`.
    pub split_color: AtomicI32,
    pub split_key: AtomicI32,
    /// Descriptor of its current collective (see `exec.rs`).
    pub desc: [AtomicU64; 4],
    _pad: [u64; 2],
}

/// Counters of one mailbox ring; each on its own cache line.
#[repr(C)]
pub struct MboxHeader {
    /// Bytes written so far (by the sender only).
    pub head: AtomicU64,
    _pad0: [u64; 7],
    /// Bytes consumed so far (by the receiver only).
    pub tail: AtomicU64,
    _pad1: [u64; 7],
}

const HEADER_BYTES: usize = 256;
const ENTRY_BYTES: usize = std::mem::size_of::<RankEntry>();
const MBOX_HEADER_BYTES: usize = std::mem::size_of::<MboxHeader>();

/// Offsets of a segment's parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub nranks: usize,
    pub slot_bytes: usize,
    pub mbox_bytes: usize,
    entries: usize,
    mbox_headers: usize,
    slots: usize,
    out: usize,
    mboxes: usize,
    pub total: usize,
}

impl Layout {
    /// The layout for these sizes.
    pub fn new(nranks: usize, slot_bytes: usize, mbox_bytes: usize) -> Layout {
        let align = |x: usize, a: usize| x.div_ceil(a) * a;
        let entries = HEADER_BYTES;
        let mbox_headers = align(entries + nranks * ENTRY_BYTES, 128);
        let slots = align(mbox_headers + nranks * nranks * MBOX_HEADER_BYTES, 4096);
        let out = slots + nranks * slot_bytes;
        let mboxes = align(out + slot_bytes, 4096);
        let total = align(mboxes + nranks * nranks * mbox_bytes, 4096);
        Layout {
            nranks,
            slot_bytes,
            mbox_bytes,
            entries,
            mbox_headers,
            slots,
            out,
            mboxes,
            total,
        }
    }
}

/// A mapped segment. The mapping stays valid until drop; the file name is unlinked once every
/// rank joined.
pub struct Segment {
    base: *mut u8,
    pub layout: Layout,
    path: PathBuf,
    /// Keeps the shared `flock` that marks the file as live until it is unlinked.
    file: std::sync::Mutex<Option<File>>,
    /// Pid of this process (pids of peers equal to it are never "dead").
    my_pid: u32,
}

// SAFETY: the mapping is shared memory whose every concurrently accessed part is an atomic or is
// handed over through barriers; the raw pointer itself is only an address.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: base/total describe the mapping made in `map`, unmapped once here.
        unsafe {
            libc::munmap(self.base.cast(), self.layout.total);
        }
    }
}

fn errno_string(what: &str, path: &Path) -> String {
    format!("{what} {}: {}", path.display(), io::Error::last_os_error())
}

fn cpath(p: &Path) -> Result<CString, Fail> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| Fail::System(format!("bad path {}", p.display())))
}

/// Directory of the segments: `SIM_NCCL_SHM_DIR`, else `/dev/shm`, else the temp directory.
pub fn shm_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SIM_NCCL_SHM_DIR") {
        return PathBuf::from(d);
    }
    let d = PathBuf::from("/dev/shm");
    if d.is_dir() {
        d
    } else {
        std::env::temp_dir()
    }
}

/// Whether `fd` still is the file at `path` (it was not unlinked or replaced).
fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    }
}

fn flock(file: &File, op: libc::c_int) -> bool {
    // SAFETY: flock on an open descriptor.
    unsafe { libc::flock(file.as_raw_fd(), op) == 0 }
}

/// Whether process `pid` exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: signal 0 only checks existence and permission.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EPERM) {
        return false;
    }
    // A zombie (exited, not yet reaped) still answers kill(pid, 0).
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => match stat.rfind(')') {
            Some(i) => !matches!(stat[i + 1..].trim_start().chars().next(), Some('Z' | 'X')),
            None => true,
        },
        // No /proc: trust kill().
        Err(_) => true,
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT (shared, not PRIVATE: other processes wake it) on a 4-byte aligned word
    // of a shared mapping; it returns at once if the word no longer holds `expected`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a word of the shared mapping.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Outcome of opening a segment file.
enum Opened {
    Ready(Segment),
    Retry,
}

impl Segment {
    /// Opens the segment of `key` for a communicator of `nranks`, creating it (with sizes from
    /// the environment) if no live one exists. Retries until `deadline` while an old segment of
    /// the same name is being retired.
    pub fn open(key: &[u8; 16], nranks: usize, deadline: Instant) -> Result<Segment, Fail> {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        let dir = shm_dir();
        let path = dir.join(format!("simnccl-{hex}"));
        loop {
            let opened = match File::options().read(true).write(true).open(&path) {
                Ok(f) => Self::attach(f, &path, nranks)?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => Self::create(&dir, &path, nranks)?,
                Err(e) => return Err(Fail::System(format!("open {}: {e}", path.display()))),
            };
            match opened {
                Opened::Ready(s) => return Ok(s),
                Opened::Retry => {
                    if Instant::now() > deadline {
                        return Err(Fail::Timeout("the communicator's shared segment"));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    fn map(file: &File, len: usize, path: &Path) -> Result<*mut u8, Fail> {
        // SAFETY: a shared read/write mapping of `len` bytes of an open file at least that long.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Fail::System(errno_string("mmap", path)));
        }
        Ok(p.cast())
    }

    fn create(dir: &Path, path: &Path, nranks: usize) -> Result<Opened, Fail> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let my_pid = std::process::id();
        let tmp = dir.join(format!(
            "{}.{my_pid}.{}.tmp",
            path.file_name()
                .and_then(|s| s.to_str())
                .unwrap_or("simnccl"),
            COUNTER.fetch_add(1, Relaxed)
        ));
        let ctmp = cpath(&tmp)?;
        // SAFETY: open with a NUL-terminated path; the descriptor is owned by `file` below.
        let fd = unsafe {
            libc::open(
                ctmp.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(Fail::System(errno_string("create", &tmp)));
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        // A reduce-scatter stages one element of every rank's block per window at least.
        let slot = slot_bytes_from_env().max(nranks * 64);
        let layout = Layout::new(nranks, slot, mbox_bytes_from_env());
        let cleanup = |file: File| {
            drop(file);
            let _ = std::fs::remove_file(&tmp);
        };
        if let Err(e) = file.set_len(layout.total as u64) {
            cleanup(file);
            return Err(Fail::System(format!("size {}: {e}", tmp.display())));
        }
        let base = match Self::map(&file, layout.total, &tmp) {
            Ok(b) => b,
            Err(e) => {
                cleanup(file);
                return Err(e);
            }
        };
        let seg = Segment {
            base,
            layout,
            path: path.to_path_buf(),
            file: std::sync::Mutex::new(None),
            my_pid,
        };
        let h = seg.header();
        h.nranks.store(nranks as u32, Relaxed);
        h.creator_pid.store(my_pid, Relaxed);
        h.slot_bytes.store(layout.slot_bytes as u64, Relaxed);
        h.mbox_bytes.store(layout.mbox_bytes as u64, Relaxed);
        h.magic.store(MAGIC, Release);
        // The lock marks the file live before anyone can see it under its final name.
        flock(&file, libc::LOCK_SH);
        let cfinal = cpath(path)?;
        // SAFETY: link/unlink with NUL-terminated paths.
        let linked = unsafe { libc::link(ctmp.as_ptr(), cfinal.as_ptr()) } == 0;
        let link_err = io::Error::last_os_error();
        let _ = std::fs::remove_file(&tmp);
        if linked {
            *seg.file.lock().unwrap_or_else(|e| e.into_inner()) = Some(file);
            return Ok(Opened::Ready(seg));
        }
        drop(file);
        if link_err.raw_os_error() == Some(libc::EEXIST) {
            // Another rank created it first: join that one.
            return Ok(Opened::Retry);
        }
        Err(Fail::System(format!("link {}: {link_err}", path.display())))
    }

    fn attach(file: File, path: &Path, nranks: usize) -> Result<Opened, Fail> {
        if flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            // Nobody holds it: a leftover of a crashed run. Retire it unless it was already
            // replaced under our feet.
            if same_file(&file, path) {
                let _ = std::fs::remove_file(path);
            }
            return Ok(Opened::Retry);
        }
        // Blocks only while another rank checks staleness.
        flock(&file, libc::LOCK_SH);
        if !same_file(&file, path) {
            return Ok(Opened::Retry);
        }
        let len = file
            .metadata()
            .map_err(|e| Fail::System(format!("stat {}: {e}", path.display())))?
            .len() as usize;
        if len < HEADER_BYTES {
            return Ok(Opened::Retry);
        }
        let base = Self::map(&file, HEADER_BYTES, path)?;
        // SAFETY: the first HEADER_BYTES of the file are mapped; Header fits in them.
        let h = unsafe { &*(base as *const Header) };
        let (magic, n, slot, mbox, arrived) = (
            h.magic.load(Acquire),
            h.nranks.load(Relaxed) as usize,
            h.slot_bytes.load(Relaxed) as usize,
            h.mbox_bytes.load(Relaxed) as usize,
            h.arrived.load(Acquire) as usize,
        );
        // SAFETY: unmapping the header-only mapping made above.
        unsafe { libc::munmap(base.cast(), HEADER_BYTES) };
        if magic != MAGIC {
            return Ok(Opened::Retry);
        }
        if n != nranks {
            return Err(Fail::Mismatch(format!(
                "this rank says the communicator has {nranks} ranks, another says {n}"
            )));
        }
        if arrived >= n {
            // A complete communicator that is about to retire its name: wait for a fresh one.
            return Ok(Opened::Retry);
        }
        let layout = Layout::new(n, slot, mbox);
        if len < layout.total {
            return Err(Fail::System(format!("{} is truncated", path.display())));
        }
        let base = Self::map(&file, layout.total, path)?;
        Ok(Opened::Ready(Segment {
            base,
            layout,
            path: path.to_path_buf(),
            file: std::sync::Mutex::new(Some(file)),
            my_pid: std::process::id(),
        }))
    }

    /// The header.
    pub fn header(&self) -> &Header {
        // SAFETY: the header lies at offset 0 of the mapping, which outlives `self`.
        unsafe { &*(self.base as *const Header) }
    }

    /// The entry of `rank`.
    pub fn entry(&self, rank: usize) -> &RankEntry {
        assert!(rank < self.layout.nranks);
        // SAFETY: entries are laid out in the mapping at `entries`, one per rank.
        unsafe { &*(self.base.add(self.layout.entries + rank * ENTRY_BYTES) as *const RankEntry) }
    }

    /// The counters of the mailbox `from -> to`.
    pub fn mbox(&self, from: usize, to: usize) -> &MboxHeader {
        let n = self.layout.nranks;
        assert!(from < n && to < n);
        let off = self.layout.mbox_headers + (from * n + to) * MBOX_HEADER_BYTES;
        // SAFETY: inside the mapping, aligned to 128.
        unsafe { &*(self.base.add(off) as *const MboxHeader) }
    }

    /// The ring of the mailbox `from -> to` (`mbox_bytes` long).
    pub fn mbox_data(&self, from: usize, to: usize) -> *mut u8 {
        let n = self.layout.nranks;
        assert!(from < n && to < n);
        // SAFETY: inside the mapping.
        unsafe {
            self.base
                .add(self.layout.mboxes + (from * n + to) * self.layout.mbox_bytes)
        }
    }

    /// The input staging slot of `rank` (`slot_bytes` long).
    pub fn in_slot(&self, rank: usize) -> *mut u8 {
        assert!(rank < self.layout.nranks);
        // SAFETY: inside the mapping.
        unsafe {
            self.base
                .add(self.layout.slots + rank * self.layout.slot_bytes)
        }
    }

    /// The shared output slot (`slot_bytes` long).
    pub fn out_slot(&self) -> *mut u8 {
        // SAFETY: inside the mapping.
        unsafe { self.base.add(self.layout.out) }
    }

    /// Registers `rank` (this process, `device`). The last rank to register retires the file
    /// name and marks the segment ready.
    pub fn register(&self, rank: usize, device: i32) -> Result<(), Fail> {
        let e = self.entry(rank);
        if let Err(other) = e.pid.compare_exchange(0, self.my_pid, AcqRel, Acquire) {
            return Err(Fail::Mismatch(format!(
                "rank {rank} was already claimed by pid {other}"
            )));
        }
        e.device.store(device, Relaxed);
        let h = self.header();
        let before = h.arrived.fetch_add(1, AcqRel) as usize;
        if before + 1 == self.layout.nranks {
            self.retire_name();
            h.ready.store(1, Release);
        }
        self.bump();
        Ok(())
    }

    /// Unlinks the file name (every rank has it mapped) and drops the liveness lock.
    fn retire_name(&self) {
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(file) = f.as_ref() {
            if same_file(file, &self.path) {
                let _ = std::fs::remove_file(&self.path);
            }
        }
        *f = None;
    }

    /// Whether every rank registered.
    pub fn is_ready(&self) -> bool {
        self.header().ready.load(Acquire) != 0
    }

    /// Called once the segment is ready: the name is gone, the lock is no longer needed.
    pub fn release_file(&self) {
        *self.file.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Marks the communicator failed for every rank and wakes them all.
    pub fn set_abort(&self) {
        self.header().abort.store(1, SeqCst);
        self.bump();
    }

    /// Whether some rank marked the communicator failed.
    pub fn aborted(&self) -> bool {
        self.header().abort.load(Acquire) != 0
    }

    /// Publishes a state change: bumps the futex word and wakes sleepers.
    pub fn bump(&self) {
        let h = self.header();
        h.epoch.fetch_add(1, SeqCst);
        if h.waiters.load(SeqCst) > 0 {
            futex_wake_all(&h.epoch);
        }
    }

    /// The first registered peer (another process) that is no longer alive.
    pub fn dead_peer(&self) -> Option<Fail> {
        (0..self.layout.nranks).find_map(|r| {
            let pid = self.entry(r).pid.load(Acquire);
            (pid != 0 && pid != self.my_pid && !pid_alive(pid))
                .then_some(Fail::PeerDead { rank: r, pid })
        })
    }

    /// Blocks until `cond` holds (it is re-evaluated after every state change), failing on
    /// abort, on a dead peer, on `cond`'s own error, or after [`timeout`]. `what` names the
    /// wait in the timeout error.
    pub fn wait_until(
        &self,
        what: &'static str,
        mut cond: impl FnMut() -> Result<bool, Fail>,
    ) -> Result<(), Fail> {
        if cond()? {
            return Ok(());
        }
        let h = self.header();
        let start = Instant::now();
        let deadline = start + timeout();
        let mut last_check = start;
        // A few yields first: on a loaded machine the peer is often about to run.
        for _ in 0..4 {
            std::thread::yield_now();
            if cond()? {
                return Ok(());
            }
        }
        loop {
            if self.aborted() {
                return Err(Fail::Aborted);
            }
            let now = Instant::now();
            if now.duration_since(last_check) >= LIVENESS_PERIOD {
                last_check = now;
                if let Some(f) = self.dead_peer() {
                    return Err(f);
                }
                if now > deadline {
                    return Err(Fail::Timeout(what));
                }
            }
            // Register as a sleeper before the last check, so that a bump in between either is
            // seen by the check or changes the word and makes the futex return at once.
            h.waiters.fetch_add(1, SeqCst);
            let e = h.epoch.load(SeqCst);
            let done = cond();
            if !matches!(done, Ok(false)) {
                h.waiters.fetch_sub(1, SeqCst);
                return done.map(|_| ());
            }
            futex_wait(&h.epoch, e, WAIT_SLICE);
            h.waiters.fetch_sub(1, SeqCst);
            if cond()? {
                return Ok(());
            }
        }
    }

    /// Arrives at barrier number `index` (0-based, counted by the caller) of `counter` and waits
    /// until all ranks arrived.
    pub fn barrier(&self, counter: &AtomicU64, index: u64, what: &'static str) -> Result<(), Fail> {
        counter.fetch_add(1, SeqCst);
        self.bump();
        let target = (index + 1) * self.layout.nranks as u64;
        self.wait_until(what, || Ok(counter.load(Acquire) >= target))
    }

    /// Writes `src` into the mailbox `from -> to` (from the sender's side), waiting for room.
    pub fn mbox_write(&self, from: usize, to: usize, mut src: &[u8]) -> Result<(), Fail> {
        let mb = self.mbox(from, to);
        let cap = self.layout.mbox_bytes as u64;
        let data = self.mbox_data(from, to);
        while !src.is_empty() {
            self.wait_until("a receiver to drain its mailbox", || {
                Ok(mb.head.load(Relaxed) - mb.tail.load(Acquire) < cap)
            })?;
            let head = mb.head.load(Relaxed);
            let room = (cap - (head - mb.tail.load(Acquire))) as usize;
            let pos = (head % cap) as usize;
            let k = room.min(src.len()).min(cap as usize - pos);
            // SAFETY: [pos, pos+k) lies in the ring and is free (the receiver consumed it);
            // only this sender writes this ring.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), data.add(pos), k) };
            mb.head.store(head + k as u64, Release);
            self.bump();
            src = &src[k..];
        }
        Ok(())
    }

    /// Reads exactly `dst.len()` bytes from the mailbox `from -> to` (receiver's side).
    pub fn mbox_read(&self, from: usize, to: usize, mut dst: &mut [u8]) -> Result<(), Fail> {
        let mb = self.mbox(from, to);
        let cap = self.layout.mbox_bytes as u64;
        let data = self.mbox_data(from, to);
        while !dst.is_empty() {
            self.wait_until("a sender to fill its mailbox", || {
                Ok(mb.head.load(Acquire) > mb.tail.load(Relaxed))
            })?;
            let tail = mb.tail.load(Relaxed);
            let avail = (mb.head.load(Acquire) - tail) as usize;
            let pos = (tail % cap) as usize;
            let k = avail.min(dst.len()).min(cap as usize - pos);
            // SAFETY: [pos, pos+k) holds bytes the sender published with `head`.
            unsafe { std::ptr::copy_nonoverlapping(data.add(pos), dst.as_mut_ptr(), k) };
            mb.tail.store(tail + k as u64, Release);
            self.bump();
            dst = &mut dst[k..];
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Serialises the tests of this crate that change the process environment; every test that
    /// waits holds it, so that no test sees another's short `SIM_NCCL_TIMEOUT`.
    pub(crate) static ENV: Mutex<()> = Mutex::new(());

    pub(crate) fn lock_env() -> std::sync::MutexGuard<'static, ()> {
        let g = ENV.lock().unwrap_or_else(|e| e.into_inner());
        // Remove the directories of earlier test runs (their processes are gone).
        if let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(pid) = name.strip_prefix("simnccl-test-") {
                    if pid.parse().is_ok_and(|p: u32| !pid_alive(p)) {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
        }
        let d = std::env::temp_dir().join(format!("simnccl-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::env::set_var("SIM_NCCL_SHM_DIR", d);
        for v in [
            "SIM_NCCL_TIMEOUT",
            "SIM_NCCL_MBOX_BYTES",
            "SIM_NCCL_SLOT_BYTES",
        ] {
            std::env::remove_var(v);
        }
        g
    }

    fn key(tag: u8) -> [u8; 16] {
        let mut k = [0u8; 16];
        k[0] = tag;
        k[1..5].copy_from_slice(&std::process::id().to_le_bytes());
        k
    }

    fn open_n(tag: u8, n: usize) -> Vec<Arc<Segment>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let segs: Vec<Arc<Segment>> = (0..n)
            .map(|_| Arc::new(Segment::open(&key(tag), n, deadline).unwrap()))
            .collect();
        for (r, s) in segs.iter().enumerate() {
            s.register(r, 0).unwrap();
        }
        segs
    }

    #[test]
    fn ranks_share_one_segment_and_the_name_is_retired_when_complete() {
        let _g = lock_env();
        {
            let k = key(1);
            let deadline = Instant::now() + Duration::from_secs(10);
            let a = Segment::open(&k, 2, deadline).unwrap();
            let b = Segment::open(&k, 2, deadline).unwrap();
            assert!(a.path.exists());
            a.register(0, 0).unwrap();
            assert!(!b.is_ready());
            assert!(a.register(0, 0).is_err(), "a rank is claimed once");
            b.register(1, 0).unwrap();
            assert!(a.is_ready() && b.is_ready());
            assert!(!a.path.exists(), "the name goes once everyone mapped it");
            // Both views are the same memory.
            // SAFETY: slot 0 is at least 1 KiB long.
            unsafe { *a.in_slot(0) = 42 };
            // SAFETY: as above.
            assert_eq!(unsafe { *b.in_slot(0) }, 42);
        }
    }

    #[test]
    fn a_stale_file_of_a_dead_run_is_replaced() {
        let _g = lock_env();
        {
            let k = key(2);
            let deadline = Instant::now() + Duration::from_secs(10);
            // A "crashed" run: one rank of two registered, then its process went away (the
            // lock goes with the last descriptor).
            let old = Segment::open(&k, 2, deadline).unwrap();
            old.register(0, 0).unwrap();
            old.release_file();
            drop(old);
            let fresh = Segment::open(&k, 2, deadline).unwrap();
            assert_eq!(fresh.header().arrived.load(SeqCst), 0, "a fresh segment");
            // A live one is joined, not replaced.
            let again = Segment::open(&k, 2, deadline).unwrap();
            fresh.register(0, 0).unwrap();
            assert_eq!(again.header().arrived.load(SeqCst), 1);
            // A mismatched size is refused.
            let third = Segment::open(&k, 3, deadline);
            assert!(matches!(third, Err(Fail::Mismatch(_))), "{:?}", third.err());
        }
    }

    #[test]
    fn barriers_and_mailboxes_work_across_threads() {
        let _g = lock_env();
        std::env::set_var("SIM_NCCL_MBOX_BYTES", "64");
        let segs = open_n(3, 3);
        let n = segs.len();
        // Each rank sends 1000 bytes (more than the 64-byte ring) to its successor while
        // receiving from its predecessor, all concurrently.
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let s = segs[r].clone();
                std::thread::spawn(move || {
                    let msg: Vec<u8> = (0..1000).map(|i| (i * 7 + r) as u8).collect();
                    let s2 = s.clone();
                    let sender = std::thread::spawn(move || s2.mbox_write(r, (r + 1) % n, &msg));
                    let mut got = vec![0u8; 1000];
                    let prev = (r + n - 1) % n;
                    s.mbox_read(prev, r, &mut got).unwrap();
                    sender.join().unwrap().unwrap();
                    assert!(got
                        .iter()
                        .enumerate()
                        .all(|(i, b)| *b == (i * 7 + prev) as u8));
                    for k in 0..50 {
                        s.barrier(&s.header().coll_bar, k, "test barrier").unwrap();
                        // After barrier k every rank has arrived k+1 times.
                        assert!(s.header().coll_bar.load(SeqCst) >= (k + 1) * n as u64);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn waits_fail_on_abort_on_dead_peers_and_on_timeout() {
        let _g = lock_env();
        let segs = open_n(4, 2);
        // Abort: a waiter wakes up and fails.
        let s = segs[0].clone();
        let t = std::thread::spawn(move || s.barrier(&s.header().split_bar, 0, "abort test"));
        std::thread::sleep(Duration::from_millis(20));
        segs[1].set_abort();
        assert_eq!(t.join().unwrap(), Err(Fail::Aborted));

        // A dead peer: register a pid that no longer exists as rank 1 of a fresh segment.
        let segs = {
            let deadline = Instant::now() + Duration::from_secs(10);
            let s = Segment::open(&key(5), 2, deadline).unwrap();
            s.register(0, 0).unwrap();
            s
        };
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        segs.entry(1).pid.store(dead, SeqCst);
        let t0 = Instant::now();
        let r = segs.wait_until("nothing", || Ok(false));
        assert_eq!(r, Err(Fail::PeerDead { rank: 1, pid: dead }));
        assert!(t0.elapsed() < Duration::from_secs(2));

        // The deadline.
        std::env::set_var("SIM_NCCL_TIMEOUT", "0.2");
        let r = {
            let deadline = Instant::now() + Duration::from_secs(10);
            let s = Segment::open(&key(6), 2, deadline).unwrap();
            s.register(0, 0).unwrap();
            s.wait_until("the test", || Ok(false))
        };
        std::env::remove_var("SIM_NCCL_TIMEOUT");
        assert_eq!(r, Err(Fail::Timeout("the test")));
    }

    #[test]
    fn zombies_count_as_dead() {
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not reaped yet: a zombie once it exited.
        let t0 = Instant::now();
        while pid_alive(pid) {
            assert!(t0.elapsed() < Duration::from_secs(5), "child never exited");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(pid_alive(std::process::id()));
        drop(child);
    }
}
