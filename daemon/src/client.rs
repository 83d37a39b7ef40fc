//! One traced process: its connection (reader thread) and its writer thread.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::File;
use std::io::{BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvError, RecvTimeoutError};
use memmap2::MmapMut;
use parking_lot::Mutex;
use tracing::{debug, info, warn};
use ttrace_format::record::{GapTally, Op, Record};
use ttrace_format::ring::{self, Ring, Slot};
use ttrace_format::store::{Blob, RankInfo};
use ttrace_format::wire::{
    self, Chunk, ClientMsg, DaemonMsg, Hello, StreamRef, MAX_FRAME, PROTOCOL_VERSION,
};

use crate::dedup::Digest;
use crate::encode::Encoder;
use crate::handoff::{self, OnceReceiver, QueueReceiver, QueueSender};
use crate::pieces::{self, Encoded, PieceSet};
use crate::pool::Job;
use crate::segments::{self, SegRef};
use crate::streams::Streams;
use crate::{ProcessSummary, Route, Routed, Shared};
use ttrace_format::fdpass;

/// How long a new connection may take to say `Hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest `Hello` frame accepted (it carries a command line).
const MAX_HELLO: usize = 1 << 20;
/// Batches of records queued between a client's reader and writer (their bytes stay in the
/// ring until written, so the ring bounds the memory too).
const QUEUE: usize = 64;
/// Most messages the reader hands its writer at once. It hands over what it has whenever it
/// is about to read the socket again (the producer batches its messages too), so the writer
/// wakes once per batch, not once per record.
const BATCH: usize = 64;
/// Segments one client holds open at most (each is a descriptor and a write buffer).
const MAX_HELD: usize = 16;
/// Largest ring a client may hand over (the `--ring-bytes` limit of `ttrace run`).
const MAX_RING: u64 = 64 << 30;
/// Largest message after `Hello` (a record's metadata is a few KiB; its tensors travel in the
/// ring).
const MAX_MESSAGE: usize = 1 << 20;
/// Strings (NVTX ranges, kernel names) and tensors one record may carry.
const MAX_RECORD_STRINGS: usize = 4096;
const MAX_RECORD_TENSORS: usize = 256;
/// Dimensions of one tensor.
const MAX_DIMS: usize = 32;
/// Ranks of one communicator (larger sizes are refused: the comm map is sized by them).
const MAX_COMM_SIZE: u32 = 1 << 17;
/// Communicator registrations one client may send.
const MAX_COMMS: u64 = 1 << 16;
/// Metadata bytes (estimated) of one client's records waiting for its writer: beyond it the
/// reader stops reading the socket until the writer catches up.
const MAX_QUEUED_META: u64 = 64 << 20;

/// Why a client was dropped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    #[error("refused: {0}")]
    Refused(String),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// What the daemon knows about one connection.
pub(crate) struct ClientState {
    pub(crate) id: u64,
    /// A clone of the connection, to disconnect it when the run ends.
    conn: Mutex<Option<UnixStream>>,
    info: Mutex<Info>,
    /// The reader saw the end of the connection (or dropped it).
    closed: AtomicBool,
    /// Reader and writer are both done.
    done: AtomicBool,
    /// The daemon cut the connection at the end of the run (the process outlived it).
    cut: AtomicBool,
    /// The store its records go to, from its `Hello` until it is done.
    store: Mutex<Option<Arc<Shared>>>,
}

#[derive(Default)]
struct Info {
    hello: Option<Hello>,
    last_rank: Option<u32>,
    records: u64,
    /// Its gap records, by reason.
    gap_tally: GapTally,
    steps: BTreeSet<(u32, u64)>,
    bytes_raw: u64,
    bytes_stored: u64,
    /// Raw bytes stored as references to identical bytes stored earlier (dedup).
    bytes_deduped: u64,
    crc_mismatches: u64,
    clean_exit: bool,
    error: Option<String>,
    /// Records it published (received here, stored or not).
    published: u64,
    /// (step, seq) of the last one.
    last_published: Option<(u64, u64)>,
    /// Its ring header's count of snapshots taken, and of those dropped on purpose, when it
    /// left.
    taken: u64,
    dropped: u64,
    /// What it warned about its capture when it said `Bye`.
    warnings: Vec<String>,
}

impl Info {
    /// Snapshots taken and neither published nor dropped: lost with the process.
    fn unpublished(&self) -> u64 {
        self.taken
            .saturating_sub(self.dropped)
            .saturating_sub(self.published)
    }
}

impl ClientState {
    pub(crate) fn new(id: u64, conn: Option<UnixStream>) -> ClientState {
        ClientState {
            id,
            conn: Mutex::new(conn),
            info: Mutex::new(Info::default()),
            closed: AtomicBool::new(false),
            done: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            store: Mutex::new(None),
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    pub(crate) fn is_connection_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Disconnects a process still connected when the run ends.
    pub(crate) fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        self.disconnect();
    }

    /// Shuts the connection down: the reader sees the end of the stream.
    pub(crate) fn disconnect(&self) {
        if let Some(c) = self.conn.lock().take() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    pub(crate) fn was_dropped(&self) -> bool {
        self.info.lock().error.is_some()
    }

    /// The manifest's entry (none for a connection that never said a valid `Hello`).
    pub(crate) fn rank_info(&self) -> Option<RankInfo> {
        let i = self.info.lock();
        let h = i.hello.as_ref()?;
        Some(RankInfo {
            rank: i.last_rank.unwrap_or(h.rank),
            pid: h.pid,
            hostname: h.hostname.clone(),
            local_rank: h.local_rank,
            world_size: h.world_size,
            records: i.records,
            gaps: i.gap_tally.count(),
            bytes_raw: i.bytes_raw,
            bytes_stored: i.bytes_stored,
            clean_exit: i.clean_exit,
            taken: i.taken,
            unpublished: i.unpublished(),
            unpublished_after: i.last_published.filter(|_| i.unpublished() > 0),
            bytes_deduped: i.bytes_deduped,
            warnings: i.warnings.clone(),
        })
    }

    pub(crate) fn summary(&self) -> Option<ProcessSummary> {
        let i = self.info.lock();
        let h = i.hello.as_ref()?;
        Some(ProcessSummary {
            rank: i.last_rank.unwrap_or(h.rank),
            pid: h.pid,
            hostname: h.hostname.clone(),
            records: i.records,
            steps: i
                .steps
                .iter()
                .map(|&(_, s)| s)
                .collect::<BTreeSet<_>>()
                .len() as u64,
            gaps: i.gap_tally.count(),
            gap_tally: i.gap_tally.clone(),
            bytes_raw: i.bytes_raw,
            bytes_stored: i.bytes_stored,
            bytes_deduped: i.bytes_deduped,
            crc_mismatches: i.crc_mismatches,
            clean_exit: i.clean_exit,
            outlived_run: self.cut.load(Ordering::Acquire),
            unpublished: i.unpublished(),
            unpublished_after: i.last_published.filter(|_| i.unpublished() > 0),
            error: i.error.clone(),
            warnings: i.warnings.clone(),
        })
    }
}

/// A client's ring as the daemon maps it.
pub(crate) struct ClientRing {
    ring: Ring,
    /// What the compression jobs of its tensors compressed, to skip repeats.
    compressed: pieces::Compressed,
    // Keeps the mapping `ring` points into alive.
    _map: MmapMut,
}

impl ClientRing {
    /// Maps the memfd a client sent and checks it holds a ring of `capacity` data bytes.
    fn map(fd: OwnedFd, capacity: u64) -> Result<ClientRing, String> {
        // Bounded before anything is sized from it (0 would divide by zero in the ring, a
        // huge one overflow the mapping size).
        if !(2 * ring::ALIGN..=MAX_RING).contains(&capacity)
            || !capacity.is_multiple_of(ring::ALIGN)
        {
            return Err(format!(
                "ring capacity {capacity} is not a multiple of {} between {} and {MAX_RING}",
                ring::ALIGN,
                2 * ring::ALIGN
            ));
        }
        // A ring that could shrink under the daemon's mapping would make its reads fault
        // (SIGBUS): refuse one that cannot be sealed.
        fdpass::seal_shrink(&fd)
            .map_err(|e| format!("the ring memfd cannot be sealed against shrinking: {e}"))?;
        let file = File::from(fd);
        let len = file
            .metadata()
            .map_err(|e| format!("cannot stat the ring: {e}"))?
            .len();
        let want = ring::mapping_bytes(capacity) as u64;
        if len < want {
            return Err(format!(
                "ring memfd of {len} bytes is smaller than the {want} bytes its Hello announces"
            ));
        }
        // SAFETY: a shared mapping of the client's memfd. Its size was checked above and the
        // memfd is sealed against shrinking; the contents are
        // shared with the producer, which only writes slots it owns under the ring protocol.
        let mut map = unsafe {
            memmap2::MmapOptions::new()
                .len(want as usize)
                .map_mut(&file)
        }
        .map_err(|e| format!("cannot map the ring: {e}"))?;
        // SAFETY: `map` is page aligned, `want` bytes long, and lives as long as the ring view
        // (both are fields of the returned value).
        let ring = unsafe { Ring::open(map.as_mut_ptr(), map.len()) }
            .map_err(|e| format!("not a ttrace ring: {e}"))?;
        if ring.capacity() != capacity {
            return Err(format!(
                "ring header says {} data bytes, Hello says {capacity}",
                ring.capacity()
            ));
        }
        Ok(ClientRing {
            ring,
            compressed: pieces::Compressed::default(),
            _map: map,
        })
    }

    /// The bytes at `offset..offset + len` of a slot.
    ///
    /// # Safety
    /// The daemon owns `slot` (received in a `Publish`, validated, not yet released) and the
    /// range lies inside it.
    unsafe fn bytes(&self, slot: &Slot, offset: u64, len: u64) -> &[u8] {
        // SAFETY: per the caller's contract.
        let all = unsafe { self.ring.slot_bytes(slot) };
        &all[offset as usize..(offset + len) as usize]
    }
}

/// A record on its way from the reader to the writer.
struct Pending {
    /// Its metadata's memory (see [`Budget`]).
    meta: u64,
    record: Box<Record>,
    slot: Option<Slot>,
    /// Per captured tensor: its place in the slot, element size, and the compression result.
    tensors: Vec<(u64, u64, usize, Awaited)>,
    /// For a record whose tensors were streamed: the stream of each captured tensor (then
    /// `slot` is `None` and `tensors` empty).
    streams: Vec<StreamRef>,
}

/// A compression result on its way from the pool, received ahead of its turn when the writer
/// waits for a later one first (see [`Work::wait_last`]).
struct Awaited {
    rx: OnceReceiver<Encoded>,
    got: Option<Result<Encoded, RecvError>>,
}

impl Awaited {
    fn new(rx: OnceReceiver<Encoded>) -> Awaited {
        Awaited { rx, got: None }
    }

    /// Waits for the result, keeping it.
    fn wait(&mut self) {
        if self.got.is_none() {
            self.got = Some(self.rx.recv());
        }
    }

    /// The result (an error: the job was lost, a worker panicked).
    fn take(&mut self) -> Result<Encoded, RecvError> {
        self.got.take().unwrap_or_else(|| self.rx.recv())
    }
}

/// What the reader hands the writer, in the client's order (ring slots are released in it).
enum Work {
    Record(Pending),
    /// A chunk of a streamed tensor and its compression.
    Chunk(Box<Chunk>, Awaited),
    /// The producer gave a stream up.
    Abort(u64),
}

/// A batch with at most this many tensor bytes is written once all of it is compressed
/// ([`Work::wait_last`]); a larger one record by record, each as soon as its tensors are, so
/// that the ring slots of its first records are released while the rest are compressed.
const WAIT_LAST_MAX_BYTES: u64 = 1 << 20;

impl Work {
    /// Tensor bytes to compress.
    fn bytes(&self) -> u64 {
        match self {
            Work::Record(p) => p.tensors.iter().map(|t| t.1).sum(),
            Work::Chunk(c, _) => c.len,
            Work::Abort(_) => 0,
        }
    }

    /// Waits for the compression of the last tensor of a small `batch` (at most
    /// [`WAIT_LAST_MAX_BYTES`]). The pool runs its jobs in the order they came, so the
    /// earlier ones are done (or nearly) by then: the writer sleeps once for a batch of small
    /// records instead of once per record.
    fn wait_last(batch: &mut [Work]) {
        if batch.iter().map(Work::bytes).sum::<u64>() > WAIT_LAST_MAX_BYTES {
            return;
        }
        let last = batch.iter_mut().rev().find_map(|w| match w {
            Work::Record(p) => p.tensors.last_mut().map(|t| &mut t.3),
            Work::Chunk(_, a) => Some(a),
            Work::Abort(_) => None,
        });
        if let Some(a) = last {
            a.wait();
        }
    }
}

/// The reader's side of the queue to the writer: messages gathered into batches, with the
/// compression jobs of their tensors.
struct Batcher<'a> {
    tx: &'a QueueSender<Vec<Work>>,
    pool: &'a crate::pool::Pool,
    items: Vec<Work>,
    /// Submitted to the pool together, before the batch goes to the writer (which waits for
    /// them).
    jobs: Vec<Job>,
}

impl Batcher<'_> {
    fn push(&mut self, w: Work) -> Result<(), ClientError> {
        self.items.push(w);
        if self.items.len() >= BATCH {
            self.send()?;
        }
        Ok(())
    }

    /// Hands what was gathered to the pool and the writer.
    fn send(&mut self) -> Result<(), ClientError> {
        if !self.jobs.is_empty() {
            self.pool.submit_all(std::mem::take(&mut self.jobs));
        }
        if self.items.is_empty() {
            return Ok(());
        }
        self.tx
            .send(std::mem::replace(
                &mut self.items,
                Vec::with_capacity(BATCH),
            ))
            .map_err(|_| ClientError::Protocol("writer stopped".into()))
    }
}

/// Serves one connection until it ends; records what happened in `state`.
pub(crate) fn serve(router: Arc<dyn Route>, state: Arc<ClientState>, stream: UnixStream) {
    let result = session(&*router, &state, stream);
    state.closed.store(true, Ordering::Release);
    {
        let mut i = state.info.lock();
        match result {
            Ok(clean) => i.clean_exit = clean,
            Err(e) => {
                let rank = i.last_rank.or(i.hello.as_ref().map(|h| h.rank));
                warn!(client = state.id, ?rank, "dropping client: {e}");
                i.error = Some(e.to_string());
            }
        }
        if let Some(h) = &i.hello {
            info!(
                client = state.id,
                pid = h.pid,
                rank = i.last_rank.unwrap_or(h.rank),
                records = i.records,
                clean = i.clean_exit,
                "client left"
            );
        }
    }
    state.disconnect();
    // The store keeps the client (for its manifest entry); the client lets go of the store.
    if let Some(shared) = state.store.lock().take() {
        if let Err(e) = shared.write_manifest(false, None) {
            warn!("updating the manifest: {e}");
        }
    }
    state.done.store(true, Ordering::Release);
}

fn refuse(stream: &mut UnixStream, reason: String) -> ClientError {
    if let Ok(frame) = wire::encode(&DaemonMsg::Refused {
        reason: reason.clone(),
    }) {
        let _ = stream.write_all(&frame);
    }
    ClientError::Refused(reason)
}

/// Warnings of a client kept (`Bye`), and characters of each.
const MAX_WARNINGS: usize = 8;
const MAX_WARNING_CHARS: usize = 2000;

/// Runs the session; `Ok(true)` when the client said `Bye`, `Ok(false)` at EOF without it.
fn session(
    router: &dyn Route,
    state: &Arc<ClientState>,
    mut stream: UnixStream,
) -> Result<bool, ClientError> {
    let Some(Connected { shared, ring, pid }) = handshake(router, state, &mut stream)? else {
        return Ok(false);
    };
    let (tx, rx) = handoff::queue::<Vec<Work>>(QUEUE);
    let budget = Arc::new(Budget::default());
    let writer = {
        let (shared, state, ring) = (shared.clone(), state.clone(), ring.clone());
        let budget = budget.clone();
        std::thread::Builder::new()
            .name(format!("ttraced-write-{}", state.id))
            .spawn(move || write_loop(&shared, &state, &ring, rx, &budget, pid))?
    };
    let mut seen = Seen::default();
    let outcome = read_messages(&shared, state, &ring, &stream, &tx, &budget, &mut seen);
    drop(tx);
    if writer.join().is_err() {
        warn!(client = state.id, "the writer thread panicked");
    }
    // The producer is gone (or said goodbye): its ring header says what it had taken.
    let mut i = state.info.lock();
    i.published = seen.published;
    i.last_published = seen.last_published;
    i.taken = ring.ring.taken();
    i.dropped = ring.ring.dropped();
    if i.unpublished() > 0 {
        warn!(
            client = state.id,
            taken = i.taken,
            published = seen.published,
            lost = i.unpublished(),
            "the process left with snapshots it had not published"
        );
    }
    outcome
}

/// A connection past its handshake: its store, its ring, its process id.
struct Connected {
    shared: Arc<Shared>,
    ring: Arc<ClientRing>,
    pid: u32,
}

/// The connection's first exchange: the peer runs as this daemon's user, its `Hello` speaks
/// this protocol and brings a ring that maps; the router gives it a store; `Welcome` says
/// which. `None`: the peer left before saying hello.
fn handshake(
    router: &dyn Route,
    state: &Arc<ClientState>,
    stream: &mut UnixStream,
) -> Result<Option<Connected>, ClientError> {
    let cred = ttrace_format::peer::peer_cred(stream)?;
    if cred.uid != router.uid() {
        return Err(refuse(
            stream,
            format!(
                "peer pid {} runs as uid {}, this daemon as uid {}",
                cred.pid,
                cred.uid,
                router.uid()
            ),
        ));
    }
    let Some((hello, fd)) = read_hello(stream)? else {
        return Ok(None);
    };
    if hello.protocol != PROTOCOL_VERSION {
        return Err(refuse(
            stream,
            format!(
                "protocol version {} (this ttraced speaks {PROTOCOL_VERSION})",
                hello.protocol
            ),
        ));
    }
    let Some(fd) = fd else {
        return Err(refuse(stream, "Hello came without a ring fd".into()));
    };
    let ring = match ClientRing::map(fd, hello.ring_capacity) {
        Ok(r) => Arc::new(r),
        Err(why) => return Err(refuse(stream, why)),
    };
    let Routed { shared, first } = match router.route(&hello, state) {
        Ok(r) => r,
        Err(why) => return Err(refuse(stream, why)),
    };
    *state.store.lock() = Some(shared.clone());
    info!(client = state.id, pid = hello.pid, rank = hello.rank, host = %hello.hostname,
          job = %hello.job.id, store = %shared.store.display(),
          ring = hello.ring_capacity, "client connected");
    let pid = hello.pid;
    state.info.lock().hello = Some(hello);
    wire::write_msg(
        stream,
        &DaemonMsg::Welcome {
            run_id: shared.run.run_id.clone(),
            store: shared.store.display().to_string(),
            first,
        },
    )
    .map_err(|e| ClientError::Protocol(e.to_string()))?;
    Ok(Some(Connected { shared, ring, pid }))
}

/// What a connection's messages said, for the accounting at its end.
#[derive(Default)]
struct Seen {
    published: u64,
    /// (step, seq) of the last record published.
    last_published: Option<(u64, u64)>,
    comms: u64,
}

/// Reads the producer's messages until it says goodbye (`Ok(true)`), leaves (`Ok(false)`:
/// a crash like any other) or breaks the protocol; records and chunks go to the writer, in
/// batches. What was read before a crash or a protocol error is stored all the same.
fn read_messages(
    shared: &Arc<Shared>,
    state: &Arc<ClientState>,
    ring: &Arc<ClientRing>,
    stream: &UnixStream,
    tx: &QueueSender<Vec<Work>>,
    budget: &Budget,
    seen: &mut Seen,
) -> Result<bool, ClientError> {
    let mut batch = Batcher {
        tx,
        pool: &shared.pool,
        items: Vec::with_capacity(BATCH),
        jobs: Vec::new(),
    };
    let outcome = read_loop(shared, state, ring, stream, &mut batch, budget, seen);
    let sent = batch.send();
    outcome.and_then(|clean| sent.map(|()| clean))
}

/// [`read_messages`]' loop.
fn read_loop(
    shared: &Arc<Shared>,
    state: &Arc<ClientState>,
    ring: &Arc<ClientRing>,
    stream: &UnixStream,
    batch: &mut Batcher,
    budget: &Budget,
    seen: &mut Seen,
) -> Result<bool, ClientError> {
    let mut reader = BufReader::with_capacity(64 << 10, stream);
    let mut frames = wire::FrameReader::default();
    let mut last_end = 0u64;
    loop {
        // About to read the socket (the buffer is empty): hand the writer what was read.
        if reader.buffer().is_empty() {
            batch.send()?;
        }
        let msg = match frames.read_limited::<ClientMsg>(&mut reader, MAX_MESSAGE) {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(false),
            Err(ttrace_format::FormatError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                // Died mid-frame: a crash like any other.
                return Ok(false);
            }
            Err(e) => return Err(ClientError::Protocol(e.to_string())),
        };
        match msg {
            ClientMsg::Publish { record, slot } => {
                seen.published += 1;
                seen.last_published = Some((record.step, record.seq));
                let p = prepare(shared, ring, record, slot, &mut last_end, &mut batch.jobs)?;
                take_budget(budget, p.meta, batch)?;
                shared.records_received.fetch_add(1, Ordering::Relaxed);
                batch.push(Work::Record(p))?;
            }
            ClientMsg::PublishStreamed { record, streams } => {
                seen.published += 1;
                seen.last_published = Some((record.step, record.seq));
                let p = prepare_streamed(record, streams)?;
                take_budget(budget, p.meta, batch)?;
                shared.records_received.fetch_add(1, Ordering::Relaxed);
                batch.push(Work::Record(p))?;
            }
            ClientMsg::Chunk(c) => {
                let w = prepare_chunk(shared, ring, c, &mut last_end, &mut batch.jobs)?;
                batch.push(w)?;
            }
            ClientMsg::StreamAbort { stream } => batch.push(Work::Abort(stream))?,
            ClientMsg::Comm(c) => {
                seen.comms += 1;
                check_comm(&c, seen.comms).map_err(ClientError::Protocol)?;
                shared.register_comm(&c);
            }
            ClientMsg::Bye {
                records,
                gaps,
                warnings,
            } => {
                debug!(client = state.id, records, gaps, "bye");
                // Bounded: a client's words, kept in the manifest.
                state.info.lock().warnings = warnings
                    .into_iter()
                    .take(MAX_WARNINGS)
                    .map(|w| w.chars().take(MAX_WARNING_CHARS).collect())
                    .collect();
                return Ok(true);
            }
            ClientMsg::Hello(_) => return Err(ClientError::Protocol("a second Hello".into())),
        }
    }
}

/// Metadata bytes of a client's records between its reader and its writer (see
/// [`MAX_QUEUED_META`]).
#[derive(Default)]
struct Budget {
    queued: Mutex<u64>,
    freed: parking_lot::Condvar,
}

/// Takes `n` bytes of the budget; when they do not fit now, hands the writer the batch first
/// (its records are counted in the budget: the writer must get them to free it).
fn take_budget(budget: &Budget, n: u64, batch: &mut Batcher) -> Result<(), ClientError> {
    if !budget.try_take(n) {
        batch.send()?;
        budget.take(n);
    }
    Ok(())
}

impl Budget {
    /// Takes `n` bytes if they fit now.
    fn try_take(&self, n: u64) -> bool {
        let mut q = self.queued.lock();
        let fits = *q == 0 || *q + n <= MAX_QUEUED_META;
        if fits {
            *q += n;
        }
        fits
    }

    /// Waits until `n` more bytes fit (a single record always fits an empty queue).
    fn take(&self, n: u64) {
        let mut q = self.queued.lock();
        while *q > 0 && *q + n > MAX_QUEUED_META {
            self.freed.wait(&mut q);
        }
        *q += n;
    }

    fn give(&self, n: u64) {
        let mut q = self.queued.lock();
        *q = q.saturating_sub(n);
        self.freed.notify_all();
    }
}

/// Refuses a communicator registration that would size the comm map from a hostile number.
fn check_comm(c: &wire::CommInfo, count: u64) -> Result<(), String> {
    if count > MAX_COMMS {
        return Err(format!("more than {MAX_COMMS} communicator registrations"));
    }
    if c.size == 0 || c.size > MAX_COMM_SIZE || c.rank >= c.size || c.api.len() > 256 {
        return Err(format!(
            "communicator {:#x}: rank {} of size {} (sizes 1..={MAX_COMM_SIZE})",
            c.key, c.rank, c.size
        ));
    }
    Ok(())
}

/// The memory a record's metadata takes (strings and vectors), estimated; refuses records
/// beyond the per-record bounds.
fn record_meta_bytes(r: &Record) -> Result<u64, String> {
    let strings = r.nvtx.len() + r.kernels_before.len();
    if strings > MAX_RECORD_STRINGS {
        return Err(format!(
            "{strings} NVTX ranges and kernel names (at most {MAX_RECORD_STRINGS})"
        ));
    }
    if r.tensors.len() > MAX_RECORD_TENSORS {
        return Err(format!(
            "{} tensors (at most {MAX_RECORD_TENSORS})",
            r.tensors.len()
        ));
    }
    if let Some(t) = r
        .tensors
        .iter()
        .find(|t| t.shape.len() > MAX_DIMS || t.strides.len() > MAX_DIMS)
    {
        return Err(format!(
            "a tensor of {} dimensions (at most {MAX_DIMS})",
            t.shape.len().max(t.strides.len())
        ));
    }
    let text: usize = r
        .nvtx
        .iter()
        .chain(&r.kernels_before)
        .map(|s| s.len() + 24)
        .sum();
    Ok((512 + text + r.api.len() + r.tensors.len() * 600) as u64)
}

/// Reads the `Hello` frame with `recvmsg`, collecting the ring fd that rides along.
fn read_hello(stream: &UnixStream) -> Result<Option<(Hello, Option<OwnedFd>)>, ClientError> {
    stream.set_read_timeout(Some(HELLO_TIMEOUT))?;
    let mut fds = Vec::new();
    let mut len = [0u8; 4];
    if !fdpass::read_exact_with_fds(stream, &mut len, &mut fds)? {
        return Ok(None);
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_HELLO.min(MAX_FRAME) {
        return Err(ClientError::Protocol(format!(
            "first frame of {len} bytes is too large for a Hello"
        )));
    }
    let mut body = vec![0u8; len];
    if !fdpass::read_exact_with_fds(stream, &mut body, &mut fds)? && len > 0 {
        return Err(ClientError::Protocol(
            "connection closed inside Hello".into(),
        ));
    }
    stream.set_read_timeout(None)?;
    let hello = match wire::decode::<ClientMsg>(&body) {
        Ok(ClientMsg::Hello(h)) => h,
        Ok(_) => {
            return Err(ClientError::Protocol(
                "the first message is not Hello".into(),
            ))
        }
        Err(e) => return Err(ClientError::Protocol(e.to_string())),
    };
    if fds.len() > 1 {
        return Err(ClientError::Protocol(format!(
            "Hello came with {} descriptors, expected one",
            fds.len()
        )));
    }
    Ok(Some((hello, fds.pop())))
}

/// Checks a `Publish` and queues the compression of its tensors.
fn prepare(
    shared: &Arc<Shared>,
    ring: &Arc<ClientRing>,
    record: Box<Record>,
    slot: Option<Slot>,
    last_end: &mut u64,
    jobs: &mut Vec<Job>,
) -> Result<Pending, ClientError> {
    let captured: Vec<(u64, usize)> = record
        .tensors
        .iter()
        .filter(|t| t.captured)
        .map(|t| (t.nbytes, t.dtype.size()))
        .collect();
    let sizes: Vec<u64> = captured.iter().map(|c| c.0).collect();
    let (offsets, total) = checked_offsets(&sizes).ok_or_else(|| {
        ClientError::Protocol(format!(
            "record rank {} step {} seq {}: tensor sizes overflow",
            record.rank, record.step, record.seq
        ))
    })?;
    let bad = |why: String| {
        ClientError::Protocol(format!(
            "record rank {} step {} seq {} ({}): {why}",
            record.rank, record.step, record.seq, record.api
        ))
    };
    let meta = record_meta_bytes(&record).map_err(bad)?;
    match &slot {
        None if total > 0 => return Err(bad(format!("{total} captured bytes but no slot"))),
        None => {}
        Some(s) => {
            ring.ring.validate(s).map_err(|e| bad(e.to_string()))?;
            if s.pos < *last_end {
                return Err(bad(format!(
                    "slot at {} overlaps the previous one (ending at {last_end}): slots must be published in the order they were reserved",
                    s.pos
                )));
            }
            if total > s.len {
                return Err(bad(format!(
                    "captured tensors need {total} bytes, the slot has {}",
                    s.len
                )));
            }
            *last_end = s.end;
        }
    }
    let mut tensors = Vec::with_capacity(captured.len());
    let dedup = shared
        .run
        .capture
        .dedup
        .then_some((record.rank, record.step));
    for (i, &(nbytes, elem)) in captured.iter().enumerate() {
        let result = match slot {
            Some(s) => {
                let at = (s, offsets[i], nbytes);
                submit_tensor(shared, ring, at, elem, dedup, jobs)
            }
            None => {
                let (tx, rx) = handoff::oneshot::<Encoded>();
                tx.send(pieces::encode(
                    &[],
                    elem,
                    &mut Encoder::new(shared.level),
                    false,
                ));
                rx
            }
        };
        tensors.push((offsets[i], nbytes, elem, Awaited::new(result)));
    }
    Ok(Pending {
        meta,
        record,
        slot,
        tensors,
        streams: Vec::new(),
    })
}

/// Checks a `PublishStreamed`: every captured tensor is named by exactly one stream.
fn prepare_streamed(record: Box<Record>, streams: Vec<StreamRef>) -> Result<Pending, ClientError> {
    let bad = |why: String| {
        ClientError::Protocol(format!(
            "streamed record rank {} step {} seq {} ({}): {why}",
            record.rank, record.step, record.seq, record.api
        ))
    };
    let meta = record_meta_bytes(&record).map_err(bad)?;
    let captured: Vec<u32> = (0..record.tensors.len() as u32)
        .filter(|&i| record.tensors[i as usize].captured)
        .collect();
    let named: Vec<u32> = streams.iter().map(|s| s.tensor).collect();
    if named != captured {
        return Err(bad(format!(
            "streams name tensors {named:?}, the captured ones are {captured:?}"
        )));
    }
    Ok(Pending {
        meta,
        record,
        slot: None,
        tensors: Vec::new(),
        streams,
    })
}

/// Checks a chunk of a streamed tensor and queues its compression.
fn prepare_chunk(
    shared: &Arc<Shared>,
    ring: &Arc<ClientRing>,
    c: Chunk,
    last_end: &mut u64,
    jobs: &mut Vec<Job>,
) -> Result<Work, ClientError> {
    let bad = |why: String| {
        ClientError::Protocol(format!("chunk {} of stream {}: {why}", c.index, c.stream))
    };
    ring.ring
        .validate(&c.slot)
        .map_err(|e| bad(e.to_string()))?;
    if c.slot.pos < *last_end {
        return Err(bad(format!(
            "slot at {} overlaps the previous one (ending at {last_end})",
            c.slot.pos
        )));
    }
    let fits = c.len > 0
        && c.len <= c.slot.len
        && c.offset.checked_add(c.len).is_some_and(|e| e <= c.total);
    if !fits {
        return Err(bad(format!(
            "{} bytes at {} of a {}-byte tensor in a {}-byte slot",
            c.len, c.offset, c.total, c.slot.len
        )));
    }
    *last_end = c.slot.end;
    let result = submit_tensor(
        shared,
        ring,
        (c.slot, 0, c.len),
        c.elem as usize,
        None,
        jobs,
    );
    Ok(Work::Chunk(Box::new(c), Awaited::new(result)))
}

/// Adds to `jobs` (for the pool) the compression of the tensor at `offset..offset + nbytes`
/// of `slot`, in pieces ([`pieces::cut`]) that the pool's threads compress at the same time;
/// its result (joined by the last piece's job) arrives on the returned channel. `dedup`: the
/// segment (rank, step) whose repeated bytes are stored once; a tensor of one piece that
/// repeats one compressed for it before is not compressed again ([`pieces::Compressed`]).
fn submit_tensor(
    shared: &Arc<Shared>,
    ring: &Arc<ClientRing>,
    (slot, offset, nbytes): (Slot, u64, u64),
    elem: usize,
    dedup: Option<(u32, u64)>,
    jobs: &mut Vec<Job>,
) -> OnceReceiver<Encoded> {
    let cut = pieces::cut(nbytes, elem, shared.pool.piece_bytes());
    let once = dedup.filter(|_| cut.len() == 1);
    let (set, rx) = PieceSet::new(cut, elem, dedup.is_some());
    for (i, &(at, len)) in set.pieces.iter().enumerate() {
        let (set, ring) = (set.clone(), ring.clone());
        jobs.push(Box::new(move |enc: &mut Encoder| {
            // SAFETY: the slot was validated and is released only by this client's writer
            // after it has received the tensor's result (sent once every piece is done); the
            // piece lies inside the tensor, which lies inside the slot (checked by the caller).
            let bytes = unsafe { ring.bytes(&slot, offset + at, len) };
            let e = match once {
                Some(key) => pieces::encode_once(bytes, elem, enc, &ring.compressed, key),
                None => pieces::encode(bytes, elem, enc, dedup.is_some()),
            };
            set.done(i, e, |buf| enc.recycle(buf));
        }));
    }
    rx
}

/// `ring::tensor_offsets` without overflow on hostile sizes.
fn checked_offsets(sizes: &[u64]) -> Option<(Vec<u64>, u64)> {
    let mut at = 0u64;
    for &s in sizes {
        at = at.checked_add(s)?.checked_add(ring::ALIGN)?;
    }
    Some(ring::tensor_offsets(sizes))
}

/// Appends one chunk, compressed by the pool, to its stream.
fn write_chunk(streams: &mut Streams, c: &Chunk, mut result: Awaited, ring: &ClientRing) {
    let enc = result.take().unwrap_or_else(|_| {
        // A job was lost (a worker panicked): store the bytes raw, here.
        // SAFETY: as in `prepare_chunk`: the slot is ours until released after this.
        raw_encoded(unsafe { ring.bytes(&c.slot, 0, c.len) }, c.elem as usize)
    });
    streams.chunk(c, enc.blob, enc.crc);
}

/// `bytes` stored raw, with their CRC-32 (when a compression job was lost).
fn raw_encoded(bytes: &[u8], elem: usize) -> Encoded {
    Encoded {
        blob: pieces::raw_blob(bytes, elem),
        crc: crc32fast::hash(bytes),
        digest: None,
    }
}

/// A record on its way into the store: its ring slot (if it has one) waits for its frame to
/// reach the kernel, and only then does it count as stored for its process.
struct Unreleased {
    /// Its segment (`None`: a chunk, written straight to its stream file).
    key: Option<(u32, u64)>,
    /// Where its frame ends in that segment.
    frame_end: u64,
    slot_end: Option<u64>,
    /// The segment writer took it.
    written: bool,
}

/// Releases, in order, the slots of records whose frames are in the kernel (a segment this
/// client no longer holds was flushed before it let go), and returns how many of them were
/// stored. Segment writers buffer frames: a slot released before its frame left the buffer
/// would be lost if the daemon died. With `all` (a flush failed: those frames are lost
/// anyway), releases every slot, so that the producer is never stalled by a failing disk;
/// the records whose frames did not reach the kernel do not count as stored. `broken` are the
/// segments this client let go of although their last flush failed.
fn release_written(
    held: &BTreeMap<(u32, u64), SegRef>,
    waiting: &mut VecDeque<Unreleased>,
    ring: &ClientRing,
    all: bool,
    broken: &BTreeSet<(u32, u64)>,
) -> u64 {
    let mut upto = None;
    let mut stored = 0;
    while let Some(w) = waiting.front() {
        let handed = match w.key {
            None => true,
            Some(key) => match held.get(&key) {
                Some(seg) => seg.handed().is_none_or(|h| h >= w.frame_end),
                None => !broken.contains(&key),
            },
        };
        if !(handed || all) {
            break;
        }
        stored += u64::from(w.written && handed);
        if let Some(end) = w.slot_end {
            upto = Some(end);
        }
        waiting.pop_front();
    }
    if let Some(end) = upto {
        ring.ring.release_to(end);
    }
    stored
}

/// In publish order: collects a record's compressed tensors, appends it to its segment,
/// releases its slot once the frame is in the kernel. A step change finishes the client's
/// segments of earlier steps.
fn write_loop(
    shared: &Shared,
    state: &ClientState,
    ring: &ClientRing,
    rx: QueueReceiver<Vec<Work>>,
    budget: &Budget,
    pid: u32,
) {
    let mut w = Writer {
        shared,
        state,
        ring,
        losses: shared.segments.losses(),
        held: BTreeMap::new(),
        waiting: VecDeque::new(),
        broken: BTreeSet::new(),
        streams: Streams::new(shared.store.clone(), state.id, pid),
    };
    // When the frames written since the last flush began to wait for it.
    let mut unflushed: Option<Instant> = None;
    loop {
        let next = match unflushed {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(since) => rx.recv_timeout(FLUSH_AFTER.saturating_sub(since.elapsed())),
        };
        let mut batch = match next {
            Ok(batch) => batch,
            Err(RecvTimeoutError::Timeout) => {
                w.settle(true, true);
                unflushed = None;
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        Work::wait_last(&mut batch);
        let mut flushed = true;
        for work in batch {
            flushed &= match work {
                Work::Record(p) => {
                    budget.give(p.meta);
                    w.record(p)
                }
                Work::Chunk(c, result) => w.chunk(&c, result),
                Work::Abort(id) => {
                    w.streams.abort(id);
                    true
                }
            };
        }
        // Flush when nothing else is queued and the oldest unflushed frame has waited
        // FLUSH_AFTER: the slots of what was written wait for it, and a trickle of small
        // records then costs one write per batch instead of one per record.
        let since = *unflushed.get_or_insert_with(Instant::now);
        let idle = rx.is_empty() && since.elapsed() >= FLUSH_AFTER;
        w.settle(idle, flushed);
        if idle {
            unflushed = None;
        }
    }
    w.settle(true, true);
    let Writer { streams, held, .. } = w;
    streams.close();
    for (_, s) in held {
        debug!(
            rank = s.key().0,
            step = s.key().1,
            "client done with segment"
        );
        shared.segments.release(s);
    }
}

/// The longest a written frame waits for the writer to hand it to the kernel (and so for its
/// ring slot to be released) while records keep trickling in.
const FLUSH_AFTER: Duration = Duration::from_millis(2);

/// The state of one client's writer thread.
struct Writer<'a> {
    shared: &'a Shared,
    state: &'a ClientState,
    ring: &'a ClientRing,
    losses: &'a segments::Losses,
    /// The segments it holds open.
    held: BTreeMap<(u32, u64), SegRef>,
    /// Slots waiting for their frames to reach the kernel, in order.
    waiting: VecDeque<Unreleased>,
    /// Segments it let go of although their last flush failed.
    broken: BTreeSet<(u32, u64)>,
    streams: Streams,
}

impl Writer<'_> {
    /// Flushes the held segments (when `idle`), then releases the slots whose frames are in
    /// the kernel (every waiting slot when a flush failed: see [`release_written`]) and
    /// counts the records stored.
    fn settle(&mut self, idle: bool, mut flushed: bool) {
        if idle {
            for seg in self.held.values() {
                flushed &= seg.flush(self.losses);
            }
        }
        let stored = release_written(
            &self.held,
            &mut self.waiting,
            self.ring,
            !flushed,
            &self.broken,
        );
        self.state.info.lock().records += stored;
    }

    /// Appends a chunk to its stream file. Returns whether every flush succeeded.
    fn chunk(&mut self, c: &Chunk, result: Awaited) -> bool {
        write_chunk(&mut self.streams, c, result, self.ring);
        // Written unbuffered: in the kernel once `write_chunk` returns. Records before the
        // chunk may still sit in a segment's buffer: its slot is released after theirs.
        self.waiting.push_back(Unreleased {
            key: None,
            frame_end: 0,
            slot_end: Some(c.slot.end),
            written: false,
        });
        let mut i = self.state.info.lock();
        i.bytes_raw += std::mem::take(&mut self.streams.bytes_raw);
        i.bytes_stored += std::mem::take(&mut self.streams.bytes_stored);
        i.crc_mismatches += std::mem::take(&mut self.streams.crc_mismatches);
        true
    }

    /// Appends a record to its segment. Returns whether every flush succeeded.
    fn record(&mut self, mut p: Pending) -> bool {
        let streamed = !p.streams.is_empty();
        let (mut blobs, digests, mismatches) = if streamed {
            let blobs = self.streams.blobs(&mut p.record, &p.streams);
            let n = blobs.len();
            (blobs, vec![None; n], 0)
        } else {
            self.collect(&mut p)
        };
        let rec = &p.record;
        let key = (rec.rank, rec.step);
        self.losses.given();
        let flushed = self.hold(key);
        let (ring, level) = (self.ring, self.shared.level);
        let mut compress = |i: usize, blob: &mut Blob| {
            // A repeat its segment does not hold after all: compressed here, from the ring.
            let (Some((off, nbytes, elem, _)), Some(s)) = (p.tensors.get(i), &p.slot) else {
                return false;
            };
            // SAFETY: as in `prepare`: the slot is ours until released after this.
            let bytes = unsafe { ring.bytes(s, *off, *nbytes) };
            *blob = pieces::encode(bytes, *elem, &mut Encoder::new(level), false).blob;
            true
        };
        let written = self
            .held
            .get(&key)
            .map(|seg| seg.append(rec, &mut blobs, &digests, self.losses, &mut compress));
        self.waiting.push_back(Unreleased {
            key: Some(key),
            // A record that could not be written has nothing to wait for.
            frame_end: match &written {
                Some(Ok((end, _))) => *end,
                _ => 0,
            },
            slot_end: p.slot.as_ref().map(|s| s.end),
            written: matches!(written, Some(Ok(_))),
        });
        // Streamed tensors' bytes were counted as their chunks were written.
        let (raw, stored) = if streamed {
            (0, 0)
        } else {
            (
                blobs.iter().map(|b| b.raw_len).sum(),
                blobs.iter().map(|b| b.stored.len() as u64).sum::<u64>(),
            )
        };
        for b in blobs {
            self.shared.pool.recycle(b.stored);
        }
        // A record not written is counted when its segment is finished (module `segments`:
        // what is not in the file is lost), logged once per cause.
        if let Some(Ok((_, deduped))) = written {
            let mut i = self.state.info.lock();
            i.bytes_deduped += deduped;
            if let Op::Gap(g) = &rec.op {
                i.gap_tally.add(g);
            }
            i.steps.insert(key);
            i.last_rank = Some(rec.rank);
            i.bytes_raw += raw;
            i.bytes_stored += stored;
            i.crc_mismatches += mismatches;
            self.shared.records_written.fetch_add(1, Ordering::Relaxed);
        }
        // A failed write may leave earlier frames stuck in the writer's buffer.
        flushed && !matches!(written, Some(Err(_)))
    }

    /// The compressed tensors of a record from the ring, their digests (for dedup) and how
    /// many did not match the record's CRC-32.
    fn collect(&self, p: &mut Pending) -> (Vec<Blob>, Vec<Option<Digest>>, u64) {
        let rec = &p.record;
        let mut blobs = Vec::with_capacity(p.tensors.len());
        let mut digests = Vec::with_capacity(p.tensors.len());
        let mut mismatches = 0u64;
        let expected = rec.tensors.iter().filter(|t| t.captured).map(|t| t.crc32);
        for (i, ((off, nbytes, elem, result), expected)) in
            p.tensors.iter_mut().zip(expected).enumerate()
        {
            let enc = match (result.take(), &p.slot) {
                (Ok(e), _) => e,
                // A job was lost (a worker panicked): store the bytes raw, here.
                (Err(_), Some(s)) => {
                    // SAFETY: as in `prepare`: the slot is ours until released after this.
                    raw_encoded(unsafe { self.ring.bytes(s, *off, *nbytes) }, *elem)
                }
                (Err(_), None) => raw_encoded(&[], *elem),
            };
            if enc.crc != expected {
                mismatches += 1;
                warn!(
                    rank = rec.rank,
                    step = rec.step,
                    seq = rec.seq,
                    tensor = i,
                    "tensor bytes do not match the record's crc32 ({:08x} in the ring, {expected:08x} published); kept as published",
                    enc.crc,
                );
            }
            // Only bytes that match their record are deduplicated: a reference must read back
            // as the record says.
            digests.push(enc.digest.filter(|_| enc.crc == expected));
            blobs.push(enc.blob);
        }
        (blobs, digests, mismatches)
    }

    /// Makes sure the segment of `key` is held. A new one means the client moved on: its
    /// segments of earlier steps are let go (flushed first: the slots of their last records
    /// may still wait for it), and so are the oldest ones beyond [`MAX_HELD`] (steps that go
    /// down, several ranks: a client cannot hold descriptors without bound). Returns whether
    /// every flush succeeded.
    fn hold(&mut self, key: (u32, u64)) -> bool {
        let std::collections::btree_map::Entry::Vacant(slot) = self.held.entry(key) else {
            return true;
        };
        match self.shared.segments.acquire(key.0, key.1) {
            Ok(s) => {
                slot.insert(s);
            }
            // Counted (and logged once per cause) by the loss ledger.
            Err(e) => self
                .losses
                .add(&segments::cause("creating a segment", &e), 1),
        }
        let mut older: Vec<(u32, u64)> = self
            .held
            .keys()
            .filter(|k| k.1 < key.1 && **k != key)
            .copied()
            .collect();
        if self.held.len() > MAX_HELD {
            let mut rest: Vec<(u32, u64)> = self
                .held
                .keys()
                .filter(|k| **k != key && !older.contains(k))
                .copied()
                .collect();
            rest.sort_by_key(|k| k.1);
            older.extend(rest.into_iter().take(self.held.len() - MAX_HELD));
        }
        let mut flushed = true;
        for k in older {
            if let Some(s) = self.held.remove(&k) {
                if !s.flush(self.losses) {
                    flushed = false;
                    self.broken.insert(k);
                }
                self.shared.segments.release(s);
            }
        }
        flushed
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use ttrace_format::reader::Segment;
    use ttrace_format::record::Record;
    use ttrace_format::store::segment_path;

    use crate::test_client::{hello, TestClient};

    fn copy_record(seq: u64, bytes: &[u8]) -> Record {
        Record::d2h_copy(0, 0, seq, bytes)
    }

    /// The daemon releases a slot only once its record's frame is in the kernel: when the
    /// ring is drained, every record is in the segment file, before the segment is finished
    /// (a daemon killed at that moment would have lost nothing).
    #[test]
    fn a_released_slot_is_already_in_the_segment_file() {
        let dir = std::env::temp_dir().join(format!("ttraced-release-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = dir.join("store");
        let h = crate::Daemon::start(crate::Config::new(dir.join("sock/s"), &store))
            .expect("daemon starts");
        let mut c = TestClient::connect(h.socket(), hello(0, 1, 1 << 20)).expect("connects");
        c.wait = Duration::from_secs(20);
        let mut n = 0u64;
        for round in 0..3 {
            // Bursts of small records (the queue rarely empties) and a few large ones.
            for i in 0..200u64 {
                let len = if i % 50 == 49 {
                    300_000
                } else {
                    3000 + i as usize
                };
                let bytes: Vec<u8> = (0..len).map(|j| (j as u64 * 7 + i + round) as u8).collect();
                c.publish(copy_record(n, &bytes), &[&bytes])
                    .expect("publishes");
                n += 1;
            }
            assert!(c.wait_drained(Duration::from_secs(20)), "the ring drains");
            let seg: PathBuf = segment_path(&store, 0, 0);
            let r = Segment::open(&seg).expect("the segment exists");
            assert!(
                r.issues().iter().all(|i| !i.kind.loses_data()),
                "{:?}",
                r.issues()
            );
            let mut seen = 0u64;
            for f in r.records() {
                assert_eq!(f.expect("intact frame").record.seq, seen);
                seen += 1;
            }
            assert_eq!(seen, n, "round {round}: records in the file once released");
        }
        c.bye(n, 0).expect("bye");
        let s = h
            .finalize(Some(0), Duration::from_secs(10))
            .expect("finalizes");
        assert_eq!(s.records, n);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
