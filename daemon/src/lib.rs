//! `ttraced`: the collector that files the snapshots of traced processes into a trace store.
//!
//! One daemon serves every traced process of a node. Each process (`libttrace.so`) connects to
//! the daemon's Unix socket, says `Hello` and hands over its snapshot ring (a memfd, passed with
//! `SCM_RIGHTS`); from then on it sends `Comm` registrations and one `Publish` per snapshot (the
//! record's metadata and the ring slot holding its tensors' bytes). See `ttrace_format::wire`
//! and `ttrace_format::ring` for the contracts, docs/format.md for the store.
//!
//! For each client the daemon runs a *reader* thread (socket → validated work) and a *writer*
//! thread (in publish order: wait for the tensors' compression, append the record to the
//! `(rank, step)` segment, release the ring slot). Compression (byte shuffle + zstd,
//! [`ttrace_format::store::Blob::encode`]) runs on a small pool shared by all clients, so one
//! fast rank is not limited to one core; the writer keeps publish order, so slots are released
//! in the order they were reserved.
//!
//! Segments are written with `O_DIRECT` where the file system allows it
//! (`SegmentWriter::create_direct`): at capture rates the page cache costs a copy into fresh
//! pages plus a write-back that competes with compression for the cores. Frames are handed to
//! the kernel when the writer's buffer fills and whenever a client's queue runs empty, and
//! fsynced when the segment is finished, at the rank's next step. A ring slot is released only
//! once its record's frame is in the kernel: until then the bytes stay in the client's ring,
//! so a daemon killed at any moment has lost nothing it released.
//!
//! Robustness rules:
//! * a peer with another uid is refused (`SO_PEERCRED`); the socket is `0600` in a `0700`
//!   directory and the store is `0700`;
//! * a malformed message (wrong protocol version, oversized frame, undecodable CBOR, a slot
//!   outside the ring, out of order, or too small for the record's tensors) drops that client
//!   only — everything it published before is still written — and never stops the daemon;
//! * a client that vanishes without `Bye` (crash, SIGKILL) keeps everything it published (the
//!   daemon holds its own mapping of the ring) and is marked `clean_exit = false`;
//! * paths are built from numbers only (rank, step), never from client strings.
//!
//! **Checksum mismatches.** Before writing, the daemon computes the CRC-32 of each captured
//! tensor's bytes in the ring and compares it with the record's `crc32` (computed by the
//! producer when the copy completed). On a mismatch the record is still written, unchanged:
//! its blob holds the bytes the ring held and its `crc32` stays the producer's, so the
//! disagreement is visible to any reader that checks a tensor against its checksum (the
//! record is thereby flagged in the store itself). The daemon logs a warning naming rank,
//! step, seq and tensor, and counts mismatches per process in its [`Summary`].

mod client;
pub mod collector;
mod dedup;
pub mod encode;
mod handoff;
mod pieces;
pub use pieces::PIECE_BYTES as DEFAULT_PIECE_BYTES;
mod pool;
mod segments;
pub mod store_dir;
mod streams;
pub mod test_client;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tracing::{debug, info, warn};
use ttrace_format::config::CaptureConfig;
use ttrace_format::record::GapTally;
use ttrace_format::store::{CommEntry, Manifest, RankInfo, FORMAT_MAJOR, FORMAT_MINOR};
use ttrace_format::wire::{CommInfo, Hello, JobInfo};
use ttrace_format::FormatError;

use crate::client::ClientState;
pub use crate::encode::Encoder;
use crate::pool::Pool;
use crate::segments::Segments;

/// zstd level used when none is configured: -1000, one of zstd's fast levels, with literals
/// still Huffman-coded (see [`encode`]). Float activations compress through the entropy of
/// their shuffled exponent bytes, not through repeated strings, so on BF16 activations this
/// level stores as small as level 1 (1.49x vs 1.46x) at about twice its speed (the exponent
/// plane: 10% faster than level -100, 4x level 3), and level 3 (1.41x) is both larger and
/// several times slower. scripts/bench-capture.sh prints the comparison.
pub const DEFAULT_LEVEL: i32 = -1000;

/// Errors of starting, running and finalising the daemon.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O error on a named path.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Another daemon answers on the socket path.
    #[error("{0}: another ttraced is already listening there")]
    InUse(PathBuf),
    /// The store directory already holds a run.
    #[error("{0}: the directory already holds a trace (manifest.json exists); choose a new one")]
    StoreInUse(PathBuf),
    /// Writing the store failed.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The store directory cannot be taken (not empty, locked by another writer, ...).
    #[error(transparent)]
    StoreDir(#[from] store_dir::StoreDirError),
    /// A configuration value is unusable.
    #[error("{0}")]
    Config(String),
}

impl Error {
    fn at(path: &Path, source: io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// What the manifest says about the run besides what the daemon sees: the command, where and
/// with which environment it ran, and the capture configuration it was given.
#[derive(Debug, Clone, Default)]
pub struct RunInfo {
    /// Unique id of the run (see [`new_run_id`]).
    pub run_id: String,
    /// The traced command (empty for a standalone daemon).
    pub command: Vec<String>,
    /// Its working directory.
    pub cwd: String,
    /// Its environment.
    pub env: BTreeMap<String, String>,
    /// The capture configuration exported to the traced processes.
    pub capture: CaptureConfig,
    /// The job whose store this is, when its processes named one.
    pub job: Option<JobInfo>,
}

/// How to run a daemon.
#[derive(Debug, Clone)]
pub struct Config {
    /// Unix socket to listen on (its directory is created `0700` when missing).
    pub socket: PathBuf,
    /// The store directory (created `0700`; must not hold a run yet).
    pub store: PathBuf,
    /// zstd level (0 stores raw bytes; negative levels are zstd's fast modes).
    pub level: i32,
    /// Compression threads shared by all clients (at least 1).
    pub threads: usize,
    /// Tensors larger than this are compressed in pieces of this size on several threads at
    /// once (format codec 6); 0: every tensor whole, on one thread.
    pub piece_bytes: u64,
    /// Run description written to the manifest.
    pub run: RunInfo,
}

impl Config {
    /// A configuration with the default level and thread count and a fresh run id.
    pub fn new(socket: impl Into<PathBuf>, store: impl Into<PathBuf>) -> Config {
        Config {
            socket: socket.into(),
            store: store.into(),
            level: DEFAULT_LEVEL,
            threads: default_threads(),
            piece_bytes: pieces::PIECE_BYTES,
            run: RunInfo {
                run_id: new_run_id(),
                ..RunInfo::default()
            },
        }
    }
}

/// Compression threads by default: the machine's cores, at most 8.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(1, 8))
}

/// A fresh run id: 16 hex digits from the clock, the pid and the process's random hash keys.
pub fn new_run_id() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(unix_ns() as u128);
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Per traced process: what the daemon received from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSummary {
    /// Global rank of its records (the last one seen; its `Hello` rank when it sent none).
    pub rank: u32,
    pub pid: u32,
    pub hostname: String,
    /// Records written to the store (gaps included).
    pub records: u64,
    /// Distinct steps among them.
    pub steps: u64,
    /// Gap records among them (`gap_tally.count()`).
    pub gaps: u64,
    /// Those gaps by reason, and the bytes they would have captured.
    pub gap_tally: GapTally,
    /// Tensor bytes before and after compression.
    pub bytes_raw: u64,
    pub bytes_stored: u64,
    /// Raw tensor bytes stored as references to identical bytes stored earlier in their
    /// segment (dedup): `bytes_raw - bytes_deduped` raw bytes were compressed and stored.
    pub bytes_deduped: u64,
    /// Tensors whose ring bytes did not match the record's checksum (records kept, see the
    /// crate documentation).
    pub crc_mismatches: u64,
    /// Whether it said `Bye`.
    pub clean_exit: bool,
    /// It was still connected when the run ended and the daemon disconnected it.
    pub outlived_run: bool,
    /// Snapshots it had taken and not published when it ended (lost with it), and the
    /// (step, seq) of its last published record.
    pub unpublished: u64,
    pub unpublished_after: Option<(u64, u64)>,
    /// Why the daemon dropped it, if it did.
    pub error: Option<String>,
    /// What it warned about its capture when it exited (its step rule numbered the whole run
    /// step 0), as the manifest keeps it.
    pub warnings: Vec<String>,
}

/// What [`Handle::finalize`] returns.
#[derive(Debug, Clone)]
pub struct Summary {
    pub run_id: String,
    pub store: PathBuf,
    /// Traced processes, by rank.
    pub processes: Vec<ProcessSummary>,
    /// Distinct ranks.
    pub ranks: usize,
    /// Distinct step numbers over all ranks.
    pub steps: u64,
    /// Distinct (rank, step) pairs, i.e. segments.
    pub segments: u64,
    /// Records stored: received and in the store (see [`Summary::lost`]).
    pub records: u64,
    /// Records received but not stored, by cause (the store is incomplete when not empty).
    pub lost: Vec<ttrace_format::store::Loss>,
    /// Gap records, every process (`gap_tally.count()`).
    pub gaps: u64,
    /// The gaps by reason, over every process.
    pub gap_tally: GapTally,
    pub bytes_raw: u64,
    pub bytes_stored: u64,
    /// Raw tensor bytes stored as references (dedup; see [`ProcessSummary::bytes_deduped`]).
    pub bytes_deduped: u64,
    pub crc_mismatches: u64,
    /// Communicators registered.
    pub comms: usize,
    /// Connections refused (wrong uid, protocol, unusable ring) or dropped for a protocol
    /// error.
    pub dropped_clients: usize,
    /// From [`Daemon::start`] to the end of [`Handle::finalize`].
    pub elapsed: Duration,
}

/// A snapshot of the daemon's progress (for a progress bar while finalising).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Clients still connected or still writing.
    pub clients_active: usize,
    /// Records received and records written so far.
    pub records_received: u64,
    pub records_written: u64,
}

/// State shared by the accept loop, the client threads and the handle.
pub(crate) struct Shared {
    pub(crate) store: PathBuf,
    pub(crate) level: i32,
    pub(crate) run: RunInfo,
    pub(crate) created_unix_ns: u64,
    pub(crate) pool: Arc<Pool>,
    pub(crate) segments: Segments,
    pub(crate) clients: Mutex<Vec<Arc<ClientState>>>,
    /// The job the store belongs to (set by the first process that names one).
    job: Mutex<Option<JobInfo>>,
    pub(crate) comms: Mutex<BTreeMap<u64, CommEntry>>,
    /// Held while the manifest is written; the number of changes ([`Shared::manifest_changes`])
    /// the manifest on disk holds.
    manifest_lock: Mutex<u64>,
    /// Changes asked to be written so far (each [`Shared::write_manifest`] call is one).
    manifest_changes: AtomicU64,
    pub(crate) records_received: AtomicU64,
    pub(crate) records_written: AtomicU64,
    stopping: AtomicBool,
    /// Set by [`Monitor::hurry`]: stop waiting for clients to leave.
    hurry: AtomicBool,
}

impl Shared {
    /// Joins a communicator registration into the comm map.
    pub(crate) fn register_comm(&self, c: &CommInfo) {
        let mut comms = self.comms.lock();
        let e = comms.entry(c.key).or_insert_with(|| CommEntry {
            key: c.key,
            size: c.size,
            members: vec![None; c.size as usize],
            parent: c.parent,
            color: c.color,
            api: c.api.clone(),
        });
        if e.size != c.size {
            warn!(
                comm = c.key,
                "communicator registered with sizes {} and {}; keeping the larger", e.size, c.size
            );
            e.size = e.size.max(c.size);
            e.members.resize(e.size as usize, None);
        }
        match e.members.get_mut(c.rank as usize) {
            Some(slot @ None) => *slot = Some(c.global_rank),
            Some(Some(g)) if *g != c.global_rank => warn!(
                comm = c.key,
                "communicator rank {} claimed by global ranks {} and {}", c.rank, g, c.global_rank
            ),
            Some(Some(_)) => {}
            None => warn!(
                comm = c.key,
                "communicator rank {} outside its size {}", c.rank, c.size
            ),
        }
    }

    /// Rewrites the manifest from the current state, which holds the caller's change. A
    /// write that began after the call holds the change too: a caller that waited for such a
    /// write returns at once (the eight ranks of a node joining together cost one or two
    /// writes, not eight). The first and the finalised manifest are fsynced; the updates in
    /// between (processes joining and leaving) are atomic but not fsynced: each survives a
    /// crash of any process, and power-loss durability of an unfinished run is not promised
    /// (docs/guarantees.md), so they need not cost two fsyncs each.
    pub(crate) fn write_manifest(
        &self,
        finalized: bool,
        exit_code: Option<i32>,
    ) -> Result<(), FormatError> {
        let mine = self.manifest_changes.fetch_add(1, Ordering::SeqCst) + 1;
        let mut written = self.manifest_lock.lock();
        if !finalized && *written >= mine {
            return Ok(());
        }
        // Every change counted up to here is in the state read below.
        let covers = self.manifest_changes.load(Ordering::SeqCst);
        let mut ranks: Vec<RankInfo> = self
            .clients
            .lock()
            .iter()
            .filter_map(|c| c.rank_info())
            .collect();
        ranks.sort_by_key(|r| (r.rank, r.pid));
        let comms = self.comms.lock().values().cloned().collect();
        Manifest {
            format_major: FORMAT_MAJOR,
            format_minor: FORMAT_MINOR,
            run_id: self.run.run_id.clone(),
            created_unix_ns: self.created_unix_ns,
            command: self.run.command.clone(),
            cwd: self.run.cwd.clone(),
            env: self.run.env.clone(),
            config: self.run.capture.clone(),
            ranks,
            comms,
            finalized,
            exit_code,
            job: self.job.lock().clone(),
            lost: self.segments.lost(),
        }
        .write_as(&self.store, finalized || covers == 1)?;
        *written = covers;
        Ok(())
    }

    /// Creates the store directory (`0700`; it must not hold a run yet) and writes its
    /// initial manifest.
    pub(crate) fn create(
        store: PathBuf,
        level: i32,
        run: RunInfo,
        pool: Arc<Pool>,
    ) -> Result<Arc<Shared>, Error> {
        let segments = Segments::create(store.clone())?;
        let shared = Arc::new(Shared {
            job: Mutex::new(run.job.clone()),
            segments,
            store,
            level,
            run,
            created_unix_ns: unix_ns(),
            pool,
            clients: Mutex::new(Vec::new()),
            comms: Mutex::new(BTreeMap::new()),
            manifest_lock: Mutex::new(0),
            manifest_changes: AtomicU64::new(0),
            records_received: AtomicU64::new(0),
            records_written: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            hurry: AtomicBool::new(false),
        });
        if let Err(e) = shared.write_manifest(false, None) {
            if let Ok(s) = Arc::try_unwrap(shared) {
                s.segments.abandon();
            }
            return Err(e.into());
        }
        Ok(shared)
    }

    /// Whether every client that joined the store is done (reader and writer).
    pub(crate) fn all_clients_done(&self) -> bool {
        self.clients.lock().iter().all(|c| c.is_done())
    }

    /// Whether every rank of the job's world (the largest world size its processes
    /// announced) is here and every process left with `Bye`: nothing more is coming.
    pub(crate) fn every_rank_said_bye(&self) -> bool {
        let ranks: Vec<RankInfo> = self
            .clients
            .lock()
            .iter()
            .filter_map(|c| c.rank_info())
            .collect();
        let world = ranks.iter().map(|r| r.world_size).max().unwrap_or(0);
        let seen: BTreeSet<u32> = ranks.iter().map(|r| r.rank).collect();
        world > 0
            && ranks.iter().all(|r| r.clean_exit)
            && seen.len() == world as usize
            && seen.iter().all(|&r| r < world)
    }

    /// Closes every segment and writes the finalised manifest.
    pub(crate) fn finish(&self, exit_code: Option<i32>) -> Result<(), FormatError> {
        self.segments.finish_all();
        self.write_manifest(true, exit_code)
    }
}

/// Where a connection's records go, decided once its `Hello` is read.
pub(crate) trait Route: Send + Sync {
    /// The uid every peer must have.
    fn uid(&self) -> u32;
    /// Whether the daemon stopped accepting.
    fn stopping(&self) -> bool;
    /// A connection was accepted (before it said anything).
    fn accepted(&self, state: &Arc<ClientState>);
    /// The store the process that said `hello` writes into (`Err`: refused, with the reason
    /// the process is told).
    fn route(&self, hello: &Hello, state: &Arc<ClientState>) -> Result<Routed, String>;
}

/// What [`Route::route`] decided.
pub(crate) struct Routed {
    pub(crate) shared: Arc<Shared>,
    /// The first process of its job here.
    pub(crate) first: bool,
}

/// A daemon with one store: every process of one job writes into it; a process of another
/// job is refused (two jobs' ranks would share segments).
struct FixedStore {
    shared: Arc<Shared>,
    uid: u32,
}

impl Route for FixedStore {
    fn uid(&self) -> u32 {
        self.uid
    }

    fn stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::Acquire)
    }

    fn accepted(&self, state: &Arc<ClientState>) {
        self.shared.clients.lock().push(state.clone());
    }

    fn route(&self, hello: &Hello, _: &Arc<ClientState>) -> Result<Routed, String> {
        let id = &hello.job.id;
        let mut job = self.shared.job.lock();
        let first = job.is_none();
        match job.as_ref().map(|j| j.id.as_str()) {
            _ if id.is_empty() => {}
            None => *job = Some(hello.job.clone()),
            Some(owner) if owner == id => {}
            Some(owner) => {
                return Err(format!(
                    "this ttraced writes the store {} of job `{owner}`; job `{id}` needs a \
                     collector of its own (unset TTRACE_SOCKET: libttrace.so then starts one \
                     that keeps one store per job)",
                    self.shared.store.display()
                ))
            }
        }
        Ok(Routed {
            shared: self.shared.clone(),
            first,
        })
    }
}

/// Refuses zero compression threads and a zstd level zstd does not have.
pub(crate) fn check_settings(threads: usize, level: i32) -> Result<(), Error> {
    if threads == 0 {
        return Err(Error::Config("--threads must be at least 1".into()));
    }
    check_level(level).map_err(Error::Config)
}

/// Whether zstd has `level` (the message says its range).
pub(crate) fn check_level(level: i32) -> Result<(), String> {
    let levels = zstd::zstd_safe::min_c_level()..=zstd::zstd_safe::max_c_level();
    if levels.contains(&level) {
        return Ok(());
    }
    Err(format!(
        "zstd level {level} is outside {}..={}",
        levels.start(),
        levels.end()
    ))
}

/// The daemon.
pub struct Daemon;

impl Daemon {
    /// Creates the store, writes the initial manifest, binds the socket and starts serving.
    pub fn start(config: Config) -> Result<Handle, Error> {
        check_settings(config.threads, config.level)?;
        // The socket first: a daemon already listening there must not cost a store.
        let listener = bind_private(&config.socket)?;
        let pool =
            Arc::new(Pool::new(config.threads, config.level).with_piece_bytes(config.piece_bytes));
        let shared = match Shared::create(config.store.clone(), config.level, config.run, pool) {
            Ok(s) => s,
            Err(e) => {
                remove_own_socket(&config.socket);
                return Err(e);
            }
        };
        let uid = rustix::process::getuid().as_raw();
        let router: Arc<dyn Route> = Arc::new(FixedStore {
            shared: shared.clone(),
            uid,
        });
        let threads = Arc::new(Mutex::new(Vec::new()));
        let accept = {
            let threads = threads.clone();
            std::thread::Builder::new()
                .name("ttraced-accept".into())
                .spawn(move || accept_loop(listener, router, threads, None))
                .map_err(|e| Error::at(&config.socket, e))?
        };
        info!(socket = %config.socket.display(), store = %config.store.display(),
              level = config.level, threads = config.threads, "ttraced listening");
        Ok(Handle {
            shared,
            accept: Some(accept),
            threads,
            socket: config.socket,
            started: Instant::now(),
        })
    }
}

pub(crate) type ClientThreads = Arc<Mutex<Vec<JoinHandle<()>>>>;

/// Accepts connections until the router says it is stopping; each is served on a thread of
/// its own. `live` counts the connections being served.
pub(crate) fn accept_loop(
    listener: UnixListener,
    router: Arc<dyn Route>,
    threads: ClientThreads,
    live: Option<Arc<std::sync::atomic::AtomicUsize>>,
) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut next_id = 0u64;
    loop {
        if router.stopping() {
            break;
        }
        // Wait for a connection at most 100 ms at a time, so a stop request is seen even when
        // nobody can connect (e.g. the socket file was removed).
        let mut pfd = [PollFd::new(&listener, PollFlags::IN)];
        let tick = Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        // An error (EINTR) is a tick like a timeout: the loop looks again.
        if !matches!(poll(&mut pfd, Some(&tick)), Ok(n) if n > 0) {
            continue;
        }
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if router.stopping() {
            break;
        }
        next_id += 1;
        let state = Arc::new(ClientState::new(next_id, stream.try_clone().ok()));
        router.accepted(&state);
        let r = router.clone();
        let live = live.clone();
        if let Some(n) = &live {
            n.fetch_add(1, Ordering::AcqRel);
        }
        match std::thread::Builder::new()
            .name(format!("ttraced-client-{next_id}"))
            .spawn(move || {
                client::serve(r, state, stream);
                if let Some(n) = live {
                    n.fetch_sub(1, Ordering::AcqRel);
                }
            }) {
            Ok(h) => {
                let mut t = threads.lock();
                // Reap finished threads so a long-lived daemon does not accumulate handles.
                t.retain(|h| !h.is_finished());
                t.push(h);
            }
            Err(e) => warn!("cannot start a client thread: {e}"),
        }
    }
    debug!("accept loop ended");
}

/// A view of a running daemon's progress.
#[derive(Clone)]
pub struct Monitor {
    shared: Arc<Shared>,
}

impl Monitor {
    /// Current progress.
    pub fn progress(&self) -> Progress {
        Progress {
            clients_active: self
                .shared
                .clients
                .lock()
                .iter()
                .filter(|c| !c.is_done())
                .count(),
            records_received: self.shared.records_received.load(Ordering::Relaxed),
            records_written: self.shared.records_written.load(Ordering::Relaxed),
        }
    }

    /// Makes a running [`Handle::finalize`] stop waiting for connected clients (they are
    /// disconnected at once; what they published is still written).
    pub fn hurry(&self) {
        self.shared.hurry.store(true, Ordering::Release);
    }
}

/// A running daemon. Call [`Handle::finalize`] when the traced command is done; dropping the
/// handle without it stops accepting and disconnects clients but leaves the manifest
/// unfinalised.
pub struct Handle {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    threads: ClientThreads,
    socket: PathBuf,
    started: Instant,
}

impl Handle {
    /// The socket clients connect to (`TTRACE_SOCKET`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The store directory.
    pub fn store(&self) -> &Path {
        &self.shared.store
    }

    /// The run id written to the manifest and sent to clients in `Welcome`.
    pub fn run_id(&self) -> &str {
        &self.shared.run.run_id
    }

    /// Current progress.
    pub fn progress(&self) -> Progress {
        self.monitor().progress()
    }

    /// A cheap, cloneable view of the daemon's progress that outlives a moved handle (e.g.
    /// to draw a progress bar while another thread runs [`Handle::finalize`]).
    pub fn monitor(&self) -> Monitor {
        Monitor {
            shared: self.shared.clone(),
        }
    }

    fn stop_accepting(&mut self) {
        if let Some(accept) = self.accept.take() {
            self.shared.stopping.store(true, Ordering::Release);
            let _ = accept.join();
            remove_own_socket(&self.socket);
        }
    }

    /// Ends the run: stops accepting, waits up to `wait` for connected clients to leave
    /// (then disconnects the rest, which count as crashed), writes everything they published,
    /// closes every segment, writes the finalised manifest with `exit_code`, and returns the
    /// summary.
    pub fn finalize(mut self, exit_code: Option<i32>, wait: Duration) -> Result<Summary, Error> {
        self.stop_accepting();
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline
            && !self.shared.hurry.load(Ordering::Acquire)
            && self
                .shared
                .clients
                .lock()
                .iter()
                .any(|c| !c.is_connection_closed())
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let lingering: Vec<Arc<ClientState>> = self
            .shared
            .clients
            .lock()
            .iter()
            .filter(|c| !c.is_connection_closed())
            .cloned()
            .collect();
        for c in &lingering {
            warn!(
                client = c.id,
                "still connected after {wait:?}: disconnecting it (kept as an unclean exit)"
            );
            c.cut();
        }
        let handles: Vec<JoinHandle<()>> = std::mem::take(&mut *self.threads.lock());
        for h in handles {
            let _ = h.join();
        }
        self.shared.finish(exit_code)?;
        Ok(self.summary())
    }

    fn summary(&self) -> Summary {
        let mut processes: Vec<ProcessSummary> = self
            .shared
            .clients
            .lock()
            .iter()
            .filter_map(|c| c.summary())
            .collect();
        processes.sort_by_key(|p| (p.rank, p.pid));
        let dropped_clients = self
            .shared
            .clients
            .lock()
            .iter()
            .filter(|c| c.was_dropped())
            .count();
        let ranks: BTreeSet<u32> = processes.iter().map(|p| p.rank).collect();
        let gap_tally = processes.iter().fold(GapTally::default(), |mut t, p| {
            t.merge(&p.gap_tally);
            t
        });
        Summary {
            run_id: self.shared.run.run_id.clone(),
            store: self.shared.store.clone(),
            ranks: ranks.len(),
            steps: self.shared.segments.steps(),
            segments: self.shared.segments.count(),
            records: self
                .shared
                .records_received
                .load(Ordering::Relaxed)
                .saturating_sub(self.shared.segments.lost().iter().map(|l| l.records).sum()),
            lost: self.shared.segments.lost(),
            gaps: gap_tally.count(),
            gap_tally,
            bytes_raw: processes.iter().map(|p| p.bytes_raw).sum(),
            bytes_stored: processes.iter().map(|p| p.bytes_stored).sum(),
            bytes_deduped: processes.iter().map(|p| p.bytes_deduped).sum(),
            crc_mismatches: processes.iter().map(|p| p.crc_mismatches).sum(),
            comms: self.shared.comms.lock().len(),
            dropped_clients,
            processes,
            elapsed: self.started.elapsed(),
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if self.accept.is_some() {
            self.stop_accepting();
            for c in self.shared.clients.lock().iter() {
                c.disconnect();
            }
        }
    }
}

/// Creates `dir` (and missing parents) with mode `0700`, or tightens an existing one to it.
pub fn make_private_dir(dir: &Path) -> Result<(), Error> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::at(dir, e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| Error::at(dir, e))
}

/// Binds `socket`, mode `0600`. Its directory is created `0700` when missing; an existing
/// directory that others can enter is only warned about (the peer uid check is the gate). A
/// stale socket (nobody answers) is replaced; a live one is an error, and so is any other
/// kind of file at that path (it is never deleted).
pub(crate) fn bind_private(socket: &Path) -> Result<UnixListener, Error> {
    use std::os::unix::fs::FileTypeExt;
    let dir = match socket.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.exists() {
        make_private_dir(&dir)?;
    } else if let Ok(m) = std::fs::metadata(&dir) {
        if m.permissions().mode() & 0o077 != 0 {
            warn!(dir = %dir.display(),
                  "the socket's directory is accessible to others; peers are still checked by uid");
        }
    }
    match std::fs::symlink_metadata(socket) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(socket).is_ok() {
                return Err(Error::InUse(socket.to_path_buf()));
            }
            std::fs::remove_file(socket).map_err(|e| Error::at(socket, e))?;
        }
        Ok(_) => {
            return Err(Error::at(
                socket,
                io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "exists and is not a socket; it is left alone",
                ),
            ))
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(socket).map_err(|e| Error::at(socket, e))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::at(socket, e))?;
    Ok(listener)
}

/// Removes the daemon's socket file, and only a socket (whatever replaced it stays).
pub(crate) fn remove_own_socket(socket: &Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(socket).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(socket);
    }
}
