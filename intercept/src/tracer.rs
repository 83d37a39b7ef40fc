//! The tracer thread and the FIFO that feeds it.
//!
//! Every captured op, gap, step mark and communicator takes a **ticket** (a number in host
//! call order) when it is called; ring slots are reserved in ticket order. The hook (or the
//! outermost `ncclGroupEnd`) hands the finished entry in under its ticket; the tracer takes
//! tickets strictly in order (napping while they gather: a hook does not wake it per entry),
//! waits for each snapshot's event (`cudaEventQuery`, then sleeping in `cudaEventSynchronize`
//! on a blocking-sync event, the last one queued on the same stream when there is one: one
//! wake-up per batch; this thread waits, the device and the program's threads never do),
//! computes the CRC-32s, assigns step and seq, and sends
//! `Publish` (batched: written when the tracer is about to wait, [`Client::flush`]). The daemon
//! releases each published slot, which frees ring space for the hooks.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ttrace_proto::config::{CaptureConfig, StepRule};
use ttrace_proto::record::{
    CollectiveKind, CopyDirection, GapOp, GapReason, GemmOp, Op, Record, Role, Tensor,
};
use ttrace_proto::ring::{Ring, Slot};
use ttrace_proto::wire::{Chunk, ClientMsg, CommInfo, StreamRef};

use crate::client::Client;
use crate::cuda::{self, Event};
use crate::fingerprint::{Evidence, Layout, StreamedEvidence};
use crate::steps::{AnchorShape, Class, Operand, Steps};

/// Where an op ran and who called it, noted at call time.
#[derive(Debug, Clone)]
pub struct Meta {
    pub api: &'static str,
    pub op: Op,
    pub stream: u64,
    pub device: i32,
    pub thread: u64,
    /// The NVTX ranges open around the call, outermost first.
    pub nvtx: Arc<[String]>,
    /// Names shared with the thread's list (converted when the record is published).
    pub kernels_before: Vec<Arc<str>>,
    pub t_call_ns: u64,
    /// A GEMM's ordinal among the process's GEMM calls, as its hook counted them (the `auto`
    /// step rule's periods, steps.rs); `None` for other ops and a graph's replayed GEMMs.
    pub gemm_ordinal: Option<u64>,
}

/// Per-tensor facts of a record, inline: a record has a handful of tensors, and most records
/// outside `--steps` are dropped after the tracer read them (no allocation for them).
pub type PerTensor<T> = smallvec::SmallVec<[T; 6]>;

/// A snapshot whose copies are enqueued.
#[derive(Debug)]
pub struct Captured {
    pub meta: Meta,
    /// The record's tensors (`crc32` filled by the tracer).
    pub tensors: Vec<Tensor>,
    /// Where each captured tensor was copied in the slot (`None`: not captured).
    pub offsets: PerTensor<Option<u64>>,
    pub slot: Option<Slot>,
    /// Completes after the op and every copy.
    pub event: Option<Event>,
    /// Per tensor, the stream its bytes went through in chunks (then `slot` is `None`).
    pub streams: Vec<Option<u64>>,
    /// Reduced to what the step rule needs: the hook found its step or rank unselected
    /// (prefilter.rs).
    pub prefiltered: bool,
    /// Tensors (by index) whose captured bytes must equal these for the record to stand: the
    /// device pointer arrays of a pointer-array batch against the host bytes its operands were
    /// located by (uploads.rs). A difference turns the record into a gap.
    pub expect: Vec<(usize, std::sync::Arc<[u8]>)>,
    /// Tensors (by index) copied for the step rule only (`--no-inputs`): read here, then
    /// published metadata only.
    pub rule_only: PerTensor<usize>,
    /// Per tensor (or empty), the fingerprint its slot space holds instead of its bytes: of
    /// a tensor in `rule_only` (fingerprint.rs).
    pub fingerprints: PerTensor<Option<Layout>>,
}

/// One chunk of a streamed tensor, copied into `slot` (at offset 0) on the op's stream.
#[derive(Debug)]
pub struct ChunkEntry {
    pub stream: u64,
    pub index: u32,
    /// Where the chunk starts in the tensor.
    pub offset: u64,
    pub len: u64,
    /// Bytes of the tensor.
    pub total: u64,
    pub elem: u8,
    pub slot: Slot,
    /// Completes after the chunk's copies.
    pub event: Event,
}

/// What a ticket stands for.
#[derive(Debug)]
pub enum Entry {
    Capture(Box<Captured>),
    /// A gap record (`meta.op` is `Op::Gap`).
    Gap(Box<Meta>),
    /// Nothing to publish (the call failed, or the entry was abandoned); the slot's copies, if
    /// any, complete with the event.
    Skip {
        slot: Option<Slot>,
        event: Option<Event>,
    },
    Comm(CommInfo),
    /// A chunk of a streamed tensor: published as soon as its copies completed.
    Chunk(Box<ChunkEntry>),
    /// A stream given up before its last chunk.
    StreamAbort(u64),
    /// A step mark: `ttrace_step()` or an NVTX range or mark with this name.
    Mark {
        api: bool,
        name: Option<String>,
        /// Records the hooks had left out before their ticket when the mark took its own
        /// ([`note_needless`]): the rule learns from it whether the step so far held records
        /// it never saw.
        left_out: u64,
    },
}

struct Fifo {
    entries: Mutex<Queue>,
    cv: Condvar,
}

/// The FIFO's state, under its lock.
struct Queue {
    /// Entries by ticket from `base` on (`None`: not handed in yet), with whether the ticket
    /// is counted (prefilter.rs). The tracer takes tickets in order, so a window over the
    /// tickets handed in and not taken yet is all the map it needs (no allocation per entry).
    window: VecDeque<Option<(Entry, bool)>>,
    /// The ticket of `window[0]`: the next the tracer takes.
    base: u64,
    /// How the tracer sleeps on the condition variable, if it does.
    sleep: Sleep,
    /// Entries handed in so far (a nap that brought none is followed by a deep sleep).
    pushed: u64,
}

impl Queue {
    /// Files entry `e` under ticket `n`.
    fn insert(&mut self, n: u64, e: Entry, counted: bool) {
        // The tracer never passes a ticket that was not handed in: `n >= base`.
        debug_assert!(n >= self.base, "ticket {n} handed in twice");
        let at = n.saturating_sub(self.base) as usize;
        if at >= self.window.len() {
            self.window.resize_with(at + 1, || None);
        }
        self.window[at] = Some((e, counted));
        self.pushed += 1;
    }

    /// Takes ticket `n`'s entry if it was handed in (`n` is the tracer's next ticket).
    fn take(&mut self, n: u64) -> Option<(Entry, bool)> {
        debug_assert_eq!(n, self.base, "tickets are taken in order");
        if !matches!(self.window.front(), Some(Some(_))) {
            return None;
        }
        self.base += 1;
        let e = self.window.pop_front().flatten();
        if self.window.is_empty() && self.window.capacity() > WINDOW_KEPT {
            // A burst is over: give its memory back.
            self.window.shrink_to(WINDOW_KEPT);
        }
        e
    }

    /// The event recorded last, among the entries handed in, on `ev`'s stream, other than
    /// `ev` (`None` while a streamed tensor's chunk is queued: chunks are published one by one
    /// so that the next can take their space).
    fn later_on_lane(&self, ev: Event) -> Option<Event> {
        let mut later = None;
        for (e, _) in self.window.iter().rev().flatten() {
            let on = match e {
                Entry::Capture(c) => c.event,
                Entry::Skip { event, .. } => *event,
                Entry::Chunk(_) => return None,
                _ => None,
            };
            if let Some(on) = on.filter(|o| o.lane == ev.lane && o.device == ev.device) {
                if later.is_none() && on.raw != ev.raw {
                    later = Some(on);
                }
            }
        }
        later
    }
}

/// How the tracer sleeps on the FIFO's condition variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sleep {
    Awake,
    /// For at most [`NAP`], after taking entries: the program is capturing, the hooks do not
    /// wake it (a wake-up per record is a system call and two context switches).
    Nap,
    /// Until a hook wakes it: the last nap brought nothing.
    Deep,
}

/// How long the tracer lets entries gather before it takes them, while the program captures:
/// it then waits once for the device to complete the batch ([`Queue::later_on_lane`]) instead
/// of once per record. Hooks waiting for ring space and the exit drain wake it at once.
const NAP: Duration = Duration::from_millis(2);

/// Entries queued after which a hook wakes a napping tracer anyway.
const NAP_ENTRIES: usize = 512;

/// Entries the FIFO's window keeps room for once emptied.
const WINDOW_KEPT: usize = 1024;

static FIFO: Fifo = Fifo {
    entries: Mutex::new(Queue {
        window: VecDeque::new(),
        base: 0,
        sleep: Sleep::Awake,
        pushed: 0,
    }),
    cv: Condvar::new(),
};
static NEXT: AtomicU64 = AtomicU64::new(0);
/// Tickets handed to the tracer (pushed or dropped): with [`NEXT`], how many are out.
static PUT: AtomicU64 = AtomicU64::new(0);

/// Whether every ticket taken so far was handed to the tracer: no thread holds one (no op
/// between its reservation and its record, no NCCL group or graph replay holding its first),
/// so every slot in use will be released without waiting for the program.
pub(crate) fn no_ticket_out() -> bool {
    // PUT first: a ticket counted in PUT was taken before, so NEXT read after covers it.
    let put = PUT.load(Ordering::Acquire);
    NEXT.load(Ordering::Acquire) == put
}
/// A hook waits for ring space: the tracer releases skipped slots as it goes, not only before
/// it waits.
static SPACE_WANTED: AtomicBool = AtomicBool::new(false);
/// The ticket the tracer waits for (`u64::MAX` before it starts and once it stopped).
static AT: AtomicU64 = AtomicU64::new(u64::MAX);
/// The tracer thread has stopped: nothing will take entries any more.
static STOPPED: AtomicBool = AtomicBool::new(false);
/// Exit: the tracer drains up to this ticket, then says goodbye.
static DRAIN_TO: AtomicU64 = AtomicU64::new(u64::MAX);
static DRAIN_DEADLINE: Mutex<Option<Instant>> = Mutex::new(None);
static FINISHED: Mutex<bool> = Mutex::new(false);
static FINISHED_CV: Condvar = Condvar::new();
static RUNNING: AtomicBool = AtomicBool::new(false);
/// The process is dying of a signal: the drain publishes what it can but says no `Bye`, so
/// the store records a crash.
static DYING: AtomicBool = AtomicBool::new(false);

/// A place in host call order. Dropped without [`Ticket::push`] (a panic), it becomes a skip,
/// so the tracer never waits for it forever.
#[derive(Debug)]
pub struct Ticket {
    n: u64,
    done: bool,
    /// A record that may move the step (prefilter.rs).
    counted: bool,
}

impl Ticket {
    /// The next ticket.
    pub fn take() -> Ticket {
        Ticket::take_counted(false)
    }

    /// The next ticket, for a record that may move the step when `counted` (prefilter.rs: it
    /// is counted just before its ticket is taken).
    pub fn take_counted(counted: bool) -> Ticket {
        if counted {
            crate::prefilter::note_enqueued();
        }
        Ticket {
            n: NEXT.fetch_add(1, Ordering::AcqRel),
            done: false,
            counted,
        }
    }

    /// Its number.
    pub fn number(&self) -> u64 {
        self.n
    }

    /// Hands the entry to the tracer.
    pub fn push(mut self, e: Entry) {
        self.done = true;
        put(self.n, e, self.counted);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            put(
                self.n,
                Entry::Skip {
                    slot: None,
                    event: None,
                },
                self.counted,
            );
        }
    }
}

/// Times the tracer yields its core (querying the event after each) before it sleeps on an
/// event that is not ready: a snapshot's copies are often a few microseconds from done, and a
/// sleep costs two context switches and the wake-up of the device's completion. Measured on
/// the simulator (hidden-64 trainer, `--steps` outside the run): a third fewer context switches,
/// 8% less CPU; more yields did no better.
const YIELDS_BEFORE_SLEEP: usize = 2;

/// The ring whose header counts the snapshots taken (set when the tracer starts).
static COUNTED: std::sync::OnceLock<&'static Ring> = std::sync::OnceLock::new();

/// Unwanted records the hooks left out before their ticket (prefilter::needless).
static NEEDLESS: AtomicU64 = AtomicU64::new(0);

/// A hook left out an unwanted record that the step rule does not need: it counts as taken
/// and dropped, as if the tracer had dropped it (the store's accounting is unchanged).
pub(crate) fn note_needless() {
    NEEDLESS.fetch_add(1, Ordering::Release);
    if let Some(r) = COUNTED.get() {
        r.note_taken();
        r.note_dropped();
    }
}

fn put(n: u64, e: Entry, counted: bool) {
    PUT.fetch_add(1, Ordering::AcqRel);
    if matches!(e, Entry::Capture(_) | Entry::Gap(_)) {
        // Taken: from here on the daemon accounts for it (published, dropped or lost).
        if let Some(r) = COUNTED.get() {
            r.note_taken();
        }
    }
    let wake = {
        let mut q = FIFO.entries.lock().unwrap_or_else(|p| p.into_inner());
        q.insert(n, e, counted);
        // Read under the lock the tracer holds until it sleeps: no wake-up is lost.
        match q.sleep {
            Sleep::Awake => false,
            Sleep::Nap => q.window.len() >= NAP_ENTRIES,
            Sleep::Deep => true,
        }
    };
    if wake {
        FIFO.cv.notify_all();
    }
}

/// A hook waits for ring space that only the tracer can free (by publishing or skipping what
/// it holds): it must not nap meanwhile.
pub fn nudge() {
    SPACE_WANTED.store(true, Ordering::Release);
    let asleep = FIFO.entries.lock().unwrap_or_else(|p| p.into_inner()).sleep != Sleep::Awake;
    if asleep {
        FIFO.cv.notify_all();
    }
}

/// End of the last slot the tracer published (the daemon owes releases up to it).
static PUBLISHED_END: AtomicU64 = AtomicU64::new(0);

/// Whether the daemon holds published slots it has not released yet: a producer waiting for
/// space then waits on the daemon (as opposed to the device or the tracer).
pub fn daemon_owes(ring: &Ring) -> bool {
    PUBLISHED_END.load(Ordering::Acquire) > ring.tail()
}

/// The ticket the tracer is waiting for (`u64::MAX` when it is not waiting: not started yet,
/// or stopped, see [`stopped`]).
pub fn waiting_for() -> u64 {
    AT.load(Ordering::Acquire)
}

/// Whether the tracer thread has stopped (a process that has not started it yet has not).
pub fn stopped() -> bool {
    STOPPED.load(Ordering::Acquire)
}

/// Pushes an entry under a fresh ticket.
pub fn push(e: Entry) {
    Ticket::take().push(e);
}

/// Whether the step rule's own mark (`nvtx:NAME`'s range or mark, `api`'s `ttrace_step()`)
/// came at all, before capture began included: the warning at exit is for a run that never
/// saw it.
static RULE_MARKED: AtomicBool = AtomicBool::new(false);

/// The program made the step rule's own mark.
pub(crate) fn note_rule_mark() {
    RULE_MARKED.store(true, Ordering::Relaxed);
}

/// Whether the program made the step rule's own mark ([`note_rule_mark`]).
pub(crate) fn rule_marked() -> bool {
    RULE_MARKED.load(Ordering::Relaxed)
}

/// Pushes a step mark under a fresh ticket (counted when steps are selected), with the
/// count of records left out so far. A record left out before the mark in program order (or
/// by a thread the program synchronised with) is in that count: its hook added to it before
/// the mark read it.
pub fn push_mark(cfg: &CaptureConfig, api: bool, name: Option<String>) {
    let left_out = NEEDLESS.load(Ordering::Acquire);
    Ticket::take_counted(crate::prefilter::counts_mark(cfg)).push(Entry::Mark {
        api,
        name,
        left_out,
    });
}

/// Wall-clock nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Waits for ticket `n` (`None`: the process is exiting and the drain is over); the entry and
/// whether it is counted. `before_sleeping` runs (outside the FIFO's lock) before the thread
/// first sleeps for it. The thread naps ([`NAP`]) while entries keep coming, and sleeps until
/// a hook wakes it once a nap brought none.
fn take(n: u64, mut before_sleeping: impl FnMut()) -> Option<(Entry, bool)> {
    AT.store(n, Ordering::Release);
    let mut q = FIFO.entries.lock().unwrap_or_else(|p| p.into_inner());
    let mut first = true;
    let mut deep = false;
    loop {
        if let Some(e) = q.take(n) {
            return Some(e);
        }
        if draining_over(n) {
            return None;
        }
        // Before the first sleep, and when a hook waiting for ring space woke it: the space
        // of skipped slots goes back to the hooks.
        if std::mem::take(&mut first) || SPACE_WANTED.swap(false, Ordering::AcqRel) {
            drop(q);
            before_sleeping();
            q = FIFO.entries.lock().unwrap_or_else(|p| p.into_inner());
            continue;
        }
        let pushed = q.pushed;
        let (sleep, timeout) = if deep {
            (Sleep::Deep, Duration::from_millis(50))
        } else {
            (Sleep::Nap, NAP)
        };
        q.sleep = sleep;
        q = FIFO
            .cv
            .wait_timeout(q, timeout)
            .unwrap_or_else(|p| p.into_inner())
            .0;
        q.sleep = Sleep::Awake;
        deep = q.pushed == pushed;
    }
}

fn draining_over(n: u64) -> bool {
    let to = DRAIN_TO.load(Ordering::Acquire);
    to != u64::MAX && (n >= to || drain_deadline_passed())
}

fn drain_deadline_passed() -> bool {
    DRAIN_DEADLINE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_some_and(|d| Instant::now() >= d)
}

/// On a fatal signal: [`shutdown`] without `Bye` (the process did not exit normally).
pub fn shutdown_dying(grace: Duration) {
    DYING.store(true, Ordering::Release);
    shutdown(grace);
}

/// At exit: lets the tracer publish everything called so far (bounded by `grace`), send `Bye`,
/// and waits for it.
pub fn shutdown(grace: Duration) {
    if !RUNNING.load(Ordering::Acquire) {
        return;
    }
    *DRAIN_DEADLINE.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + grace);
    DRAIN_TO.store(NEXT.load(Ordering::Acquire), Ordering::Release);
    FIFO.cv.notify_all();
    let mut done = FINISHED.lock().unwrap_or_else(|p| p.into_inner());
    let until = Instant::now() + grace + Duration::from_millis(500);
    while !*done {
        let now = Instant::now();
        if now >= until {
            break;
        }
        done = FINISHED_CV
            .wait_timeout(done, until - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// A slot's stored tensors' offsets (inline: a record has a handful of tensors, and the
/// tracer reads thousands of slots whose records are dropped).
type PackedOffsets = smallvec::SmallVec<[u64; 8]>;

/// The step rule's evidence by tensor ([`Tracer::read_slot`]).
type EvidenceByTensor = smallvec::SmallVec<[Option<Evidence>; 6]>;

/// A record waiting for its step.
struct Pending {
    record: Record,
    /// Its API and NVTX ranges, set when it is published.
    later: Later,
    slot: Option<Slot>,
    /// The streams of its streamed tensors.
    streams: Vec<StreamRef>,
    /// Reduced by the hook: its bytes must not be published as a selected record's.
    prefiltered: bool,
    /// The step rule got evidence of its GEMM operands.
    evidence: bool,
    /// That evidence was glimpses alone (fingerprint.rs): no operand's fingerprint.
    glimpses: bool,
}

/// A stream's progress as its chunks are published.
#[derive(Default)]
struct StreamState {
    crc: crc32fast::Hasher,
    bytes: u64,
    failed: bool,
    /// The tensor's fingerprint as its chunks bring it (fingerprint.rs).
    fingerprint: Option<StreamedEvidence>,
}

/// Starts the tracer thread.
pub fn start(
    client: Client,
    ring: &'static Ring,
    cfg: &'static CaptureConfig,
) -> Result<(), String> {
    RUNNING.store(true, Ordering::Release);
    let _ = COUNTED.set(ring);
    std::thread::Builder::new()
        .name("ttrace-tracer".into())
        .spawn(move || {
            crate::fatal::tracer_thread();
            let mut t = Tracer {
                client,
                ring,
                cfg,
                steps: Steps::new(cfg.step_rule.clone()),
                seq: HashMap::new(),
                streams: HashMap::new(),
                records: 0,
                gaps: 0,
                published_end: 0,
                to_release: 0,
                unpublished: BTreeMap::new(),
                broken: false,
                anchor_noted: false,
                anchor_told: None,
                period_noted: None,
                checked_to: 0,
                stopped_capture: false,
                dropped: 0,
                reduced: 0,
                reduced_copies: 0,
                reduced_glimpses: 0,
                decided: Vec::new(),
                left_out_seen: 0,
            };
            t.run();
            *FINISHED.lock().unwrap_or_else(|p| p.into_inner()) = true;
            FINISHED_CV.notify_all();
        })
        .map(|_| ())
        .map_err(|e| {
            RUNNING.store(false, Ordering::Release);
            format!("cannot start the tracer thread: {e}")
        })
}

struct Tracer {
    client: Client,
    ring: &'static Ring,
    cfg: &'static CaptureConfig,
    steps: Steps<Pending>,
    seq: HashMap<(u32, u64), u64>,
    streams: HashMap<u64, StreamState>,
    records: u64,
    gaps: u64,
    /// End of the last slot published (the daemon releases up to it).
    published_end: u64,
    /// Slots the daemon will never see (skipped, dropped by the step filter): released by the
    /// tracer once the daemon has released everything published before them.
    to_release: u64,
    /// Slots of records fed to the step rule and not published yet, by start (with a count):
    /// a skipped slot after one of them is released only up to it.
    unpublished: BTreeMap<u64, u32>,
    broken: bool,
    /// The anchor's signature was handed to the hooks (prefilter.rs).
    anchor_noted: bool,
    /// The anchor the hooks were told before the rule fed it ([`Tracer::tell_anchor_early`]).
    anchor_told: Option<AnchorShape>,
    /// The start of the period handed to the hooks (prefilter.rs), and the ordinal below
    /// which the GEMMs the rule did not see were checked against it.
    period_noted: Option<u64>,
    checked_to: u64,
    /// Capture stopped: no selected step is left.
    stopped_capture: bool,
    /// Records dropped as unselected, and of those, the ones the hooks had reduced.
    dropped: u64,
    reduced: u64,
    /// Of the reduced ones, those whose GEMM operands' fingerprints were copied for the rule.
    reduced_copies: u64,
    /// Of those, the ones whose operands were copied as glimpses alone.
    reduced_glimpses: u64,
    /// The records the step rule decided, as it hands them back (empty between records).
    decided: Vec<(Pending, u64)>,
    /// Records the hooks had left out when the last mark took its ticket.
    left_out_seen: u64,
}

impl Tracer {
    fn run(&mut self) {
        // Tracer work must never invalidate a program's global-mode graph capture.
        let _ = cuda::exchange_capture_mode(cuda_abi::cudart::cudaStreamCaptureModeRelaxed);
        let mut n = 0u64;
        loop {
            let next = take(n, || self.before_waiting());
            let Some((e, counted)) = next else { break };
            n += 1;
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle(e)));
            if r.is_err() {
                crate::fault("ttrace", "the tracer thread panicked".into());
            }
            if counted {
                self.fed_counted();
            }
            if self.broken {
                break;
            }
            if SPACE_WANTED.swap(false, Ordering::AcqRel) {
                // Else released before the thread waits: one release (a system call) per batch.
                self.release_skipped();
            }
        }
        if !self.broken {
            let mut out = Vec::new();
            self.steps.flush(&mut |p, s| out.push((p, s)));
            for (p, s) in out {
                self.publish(p, s);
            }
            // Said on stderr, and kept in the store (the manifest's `ranks[].warnings`): a run
            // numbered as one step must not pass for a one-step run when read later.
            let took = self.records + self.gaps + self.dropped + NEEDLESS.load(Ordering::Relaxed);
            let warnings: Vec<String> = [
                self.steps.one_step_doubt(),
                self.steps.period_note(),
                self.steps
                    .unmarked_warning(took > 0 && !rule_marked(), crate::hooks::nvtx::names_seen),
            ]
            .into_iter()
            .flatten()
            .collect();
            for w in &warnings {
                crate::log::warn(w);
            }
            let refused = crate::engine::refused_copies();
            if refused > 0 {
                crate::log::warn(&format!(
                    "{refused} snapshot copies were refused by the CUDA runtime: their tensors \
                     are recorded without their bytes (metadata only)"
                ));
            }
            let needless = NEEDLESS.load(Ordering::Relaxed);
            if self.dropped + needless > 0 {
                crate::log::info(&format!(
                    "{} records outside TTRACE_STEPS/TTRACE_RANKS dropped: {needless} left out \
                     by their hooks (nothing in them for the step rule), {} reduced to what \
                     the step rule needs before their snapshot ({} with operand fingerprints \
                     for it, {} of them glimpses alone), {} snapshotted in full",
                    self.dropped + needless,
                    self.reduced,
                    self.reduced_copies,
                    self.reduced_glimpses,
                    self.dropped - self.reduced
                ));
            }
            if !DYING.load(Ordering::Acquire) {
                let bye = ClientMsg::Bye {
                    records: self.records,
                    gaps: self.gaps,
                    warnings,
                };
                let _ = self.client.send(&bye);
            }
        }
        // What was published reaches the daemon, also when the process is dying.
        self.flush();
        STOPPED.store(true, Ordering::Release);
        AT.store(u64::MAX, Ordering::Release);
    }

    fn handle(&mut self, e: Entry) {
        match e {
            Entry::Capture(c) => {
                self.tell_anchor_early(&c);
                self.captured(*c)
            }
            Entry::Gap(meta) => {
                let rec = record(*meta, Vec::new());
                self.feed(rec, None, Vec::new(), Class::Other, false);
            }
            Entry::Skip { slot, event } => {
                if let Some(ev) = event {
                    let _ = self.wait(ev, true);
                }
                if let Some(s) = slot {
                    self.skip_slot(s);
                }
            }
            Entry::Comm(info) => self.send(&ClientMsg::Comm(info)),
            Entry::Chunk(c) => self.chunk(*c),
            Entry::StreamAbort(id) => {
                if self.streams.remove(&id).is_some() {
                    self.send(&ClientMsg::StreamAbort { stream: id });
                }
            }
            Entry::Mark {
                api,
                name,
                left_out,
            } => {
                // Records left out since the last mark belong to the step it ends, as they
                // would had they taken tickets (prefilter::needless).
                if left_out > self.left_out_seen {
                    self.steps.note_left_out();
                    self.left_out_seen = left_out;
                }
                self.steps.mark(api, name.as_deref())
            }
        }
    }

    /// Under `auto` with steps selected, tells the hooks the anchor (the first GEMM: its
    /// signature, operand lengths and orientations) as soon as its snapshot is taken from the
    /// FIFO, before waiting for its copies: the hooks of the GEMMs enqueued after it then copy
    /// only the operands the rule can read (those of the anchor's signature, and operands of
    /// the anchor's lengths), where they copied every GEMM's until the rule had fed the anchor.
    /// The host runs ahead of the device by about a step, so while the rule learned the
    /// steps a run outside `--steps` held every GEMM's operands of a step in flight (the ring
    /// locked that far). Hooks that see it took their tickets after the anchor's, so the rule
    /// knows the anchor before their records, as when it was told after feeding it; an anchor
    /// that turns out otherwise (the first GEMM's snapshot failed) is a fault.
    fn tell_anchor_early(&mut self, c: &Captured) {
        if self.anchor_noted
            || self.anchor_told.is_some()
            || self.cfg.step_rule != StepRule::Auto
            || self.cfg.steps.is_none()
            || self.steps.anchor().is_some()
        {
            return;
        }
        let (Op::Gemm(g), Some(sig)) = (&c.meta.op, op_sig(c.meta.api, &c.meta.op)) else {
            return;
        };
        let len = |role| {
            c.tensors
                .iter()
                .find(|t| t.role == role)
                .map_or(0, |t| t.nbytes)
        };
        let told = AnchorShape {
            sig,
            len: [len(Role::A), len(Role::B)],
            trans: [g.transa != 0, g.transb != 0],
        };
        crate::prefilter::note_anchor(told);
        self.anchor_told = Some(told);
    }

    /// Waits for an event; `Err` with the runtime's error when the op or a copy failed.
    /// The tracer thread sleeps in `cudaEventSynchronize` (a blocking-sync event: one wake-up
    /// when it completes, where polling woke up every few microseconds); during the exit drain
    /// it polls, so that the drain's deadline holds. With `batch`, it sleeps on the last event
    /// queued on the same stream instead ([`Tracer::sleep_on_batch`]).
    fn wait(&mut self, ev: Event, batch: bool) -> Result<(), u32> {
        let mut pause = Duration::from_micros(20);
        let mut batch = batch;
        loop {
            let mut r = cuda::event_query(ev.handle());
            if r == cuda_abi::cudart::cudaErrorNotReady {
                // The daemon gets what is published, and the hooks the space let go, while
                // the device works.
                self.before_waiting();
                r = cuda::event_query(ev.handle());
            }
            if r == cuda_abi::cudart::cudaErrorNotReady
                && std::mem::take(&mut batch)
                && DRAIN_TO.load(Ordering::Acquire) == u64::MAX
                && self.sleep_on_batch(ev)
            {
                r = cuda::event_query(ev.handle());
            }
            for _ in 0..YIELDS_BEFORE_SLEEP {
                if r != cuda_abi::cudart::cudaErrorNotReady {
                    break;
                }
                std::thread::yield_now();
                r = cuda::event_query(ev.handle());
            }
            if r == cuda_abi::cudart::cudaErrorNotReady
                && DRAIN_TO.load(Ordering::Acquire) == u64::MAX
            {
                // Any answer but success is taken from the query (the op's error, or a
                // runtime without the call: polling then).
                r = match cuda::event_synchronize(ev.handle()) {
                    cuda_abi::cudart::cudaSuccess => cuda_abi::cudart::cudaSuccess,
                    _ => cuda::event_query(ev.handle()),
                };
            }
            match r {
                cuda_abi::cudart::cudaSuccess => {
                    cuda::event_put(ev);
                    return Ok(());
                }
                cuda_abi::cudart::cudaErrorNotReady => {}
                e => return Err(e),
            }
            if drain_deadline_passed() {
                return Err(cuda_abi::cudart::cudaErrorNotReady);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// Sleeps until the last event queued on `ev`'s stream completes, which completes after
    /// `ev`: one wake-up for every record up to it. `false` when there is none, when that
    /// wait failed, or when the ring is over half full (the records before the last may
    /// complete well before it, and their space is wanted). The caller still queries `ev`.
    fn sleep_on_batch(&mut self, ev: Event) -> bool {
        let in_use = self.ring.head().saturating_sub(self.ring.tail());
        if in_use > self.ring.capacity() / 2 {
            return false;
        }
        let later = FIFO
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .later_on_lane(ev);
        // The later event belongs to an entry the tracer has not taken: nothing returns it
        // to the pool (or records it again) before this thread is done waiting on it.
        later.is_some_and(|l| cuda::event_synchronize(l.handle()) == cuda_abi::cudart::cudaSuccess)
    }

    /// A snapshot whose copies were enqueued: waits for them, reads its bytes (CRC-32s, the
    /// step rule's evidence) and feeds its record to the step rule.
    fn captured(&mut self, mut c: Captured) {
        if !self.snapshot_completed(&c) {
            return;
        }
        let Some(slot) = c.slot else {
            return self.captured_streamed(c);
        };
        // SAFETY: the slot belongs to the tracer until it is published; its copies completed.
        let bytes = unsafe { self.ring.slot_bytes(&slot) };
        let sig = op_sig(c.meta.api, &c.meta.op);
        let (packed, kept, evidence) = self.read_slot(&mut c, bytes, sig);
        let stored = |i: usize, t: &Tensor| t.captured && !c.rule_only.contains(&i);
        let held = |i: usize, want: &[u8]| {
            let t = &c.tensors[i];
            let at = (0..i).filter(|&j| stored(j, &c.tensors[j])).count();
            t.captured
                && t.nbytes == want.len() as u64
                && bytes.get(packed[at] as usize..packed[at] as usize + want.len()) == Some(want)
        };
        let bad = unmet(&c.expect, &c.tensors, held);
        if !bad.is_empty() {
            let why = arrays_differ(&c.meta.op, &c.tensors, &bad);
            self.skip_slot(slot);
            return self.replaced(c.meta, &c.tensors, why, c.prefiltered);
        }
        let class = classify(&c.meta.op, sig, c.meta.gemm_ordinal, &c.tensors, &evidence);
        for &i in &c.rule_only {
            // Read for the rule; stored as metadata, as inputs are under `--no-inputs`.
            if let Some(t) = c.tensors.get_mut(i) {
                (t.captured, t.crc32) = (false, 0);
            }
        }
        let rec = record(c.meta, c.tensors);
        if kept == 0 {
            self.skip_slot(slot);
            self.feed(rec, None, Vec::new(), class, c.prefiltered);
        } else {
            self.feed(rec, Some(slot), Vec::new(), class, c.prefiltered);
        }
    }

    /// Waits for a snapshot's op and copies; `false` when it cannot be published (a fault
    /// was recorded and its slot let go, or the exit drain ran out of time).
    fn snapshot_completed(&mut self, c: &Captured) -> bool {
        let Some(ev) = c.event else { return true };
        let Err(code) = self.wait(ev, true) else {
            return true;
        };
        if code == cuda_abi::cudart::cudaErrorNotReady {
            // The exit drain ran out of time: the device is still busy with it.
            crate::log::warn(&format!(
                "{}: snapshot still in flight at exit, not published",
                c.meta.api
            ));
            self.broken = true;
            return false;
        }
        let detail = format!(
            "the op or its snapshot copies did not complete on the device (cudaError {code})"
        );
        crate::fault(c.meta.api, detail);
        if let Some(s) = c.slot {
            self.skip_slot(s);
        }
        false
    }

    /// A snapshot without a slot: its tensors were streamed in chunks (or it holds no bytes).
    fn captured_streamed(&mut self, mut c: Captured) {
        let (streams, evidence) = self.streamed(&mut c.tensors, &c.streams);
        // Streamed bytes are gone by now: their CRC-32 stands for them.
        let held = |i: usize, want: &[u8]| {
            let t = &c.tensors[i];
            t.captured && t.nbytes == want.len() as u64 && t.crc32 == crc32fast::hash(want)
        };
        let bad = unmet(&c.expect, &c.tensors, held);
        if !bad.is_empty() {
            let why = arrays_differ(&c.meta.op, &c.tensors, &bad);
            for r in &streams {
                self.send(&ClientMsg::StreamAbort { stream: r.stream });
            }
            return self.replaced(c.meta, &c.tensors, why, c.prefiltered);
        }
        let sig = op_sig(c.meta.api, &c.meta.op);
        let class = classify(&c.meta.op, sig, c.meta.gemm_ordinal, &c.tensors, &evidence);
        let rec = record(c.meta, c.tensors);
        self.feed(rec, None, streams, class, c.prefiltered)
    }

    /// Reads a completed slot: moves the stored tensors to the offsets the daemon computes
    /// from the captured tensors (a tensor whose copy could not be enqueued was dropped from
    /// it), fills their CRC-32s and takes the step rule's evidence. Returns the stored
    /// tensors' offsets, how many there are, and the evidence by tensor.
    fn read_slot(
        &self,
        c: &mut Captured,
        bytes: &mut [u8],
        sig: Option<u64>,
    ) -> (PackedOffsets, usize, EvidenceByTensor) {
        // Where `tensor_offsets` (the daemon's reading) puts the stored tensors: each at the
        // aligned end of the one before.
        let mut end = 0u64;
        let packed: PackedOffsets = c
            .tensors
            .iter()
            .enumerate()
            .filter(|(i, t)| t.captured && !c.rule_only.contains(i))
            .map(|(_, t)| ttrace_proto::ring::pack(&mut end, t.nbytes))
            .collect();
        let mut k = 0;
        // Only the auto step rule reads values; the others are told steps by marks.
        let gemm = matches!(c.meta.op, Op::Gemm(_)) && self.cfg.step_rule == StepRule::Auto;
        let sampled = gemm && self.may_recur_anchor(sig);
        let mut evidence: EvidenceByTensor = smallvec::smallvec![None; c.tensors.len()];
        let glimpses = if sampled {
            self.glimpses_first(c, bytes, sig)
        } else {
            None
        };
        // In tensor order: a tensor is read where it was copied before any later one moves
        // down over it (each moves only to before its own place).
        for (i, ((t, off), ev)) in c
            .tensors
            .iter_mut()
            .zip(&c.offsets)
            .zip(&mut evidence)
            .enumerate()
        {
            let Some(from) = *off else { continue };
            if !t.captured {
                continue;
            }
            if let Some(Some(fp)) = c.fingerprints.get(i) {
                // Only its fingerprint, or its glimpse, was copied (for the rule: never
                // stored).
                let at = from as usize;
                if gemm {
                    let full = *fp == Layout::of(t.nbytes);
                    *ev = bytes.get(at..at + fp.bytes() as usize).map(|held| {
                        match glimpses.as_ref().and_then(|g| g.get(i).copied().flatten()) {
                            // The rule reads only the glimpse of this GEMM's operands.
                            Some(Glimpsed::Only(g)) => Evidence::glimpsed(g),
                            Some(Glimpsed::Known(g)) => {
                                Evidence::read_glimpsed(held, t.dtype, sampled, Some(g))
                            }
                            None if full => Evidence::read(held, t.nbytes, t.dtype, sampled),
                            None => Evidence::of_glimpse(held),
                        }
                    });
                }
                continue;
            }
            let (from, len) = (from as usize, t.nbytes as usize);
            let at = if c.rule_only.contains(&i) {
                from
            } else {
                let to = packed[k] as usize;
                if from != to {
                    bytes.copy_within(from..from + len, to);
                }
                k += 1;
                to
            };
            let held = &bytes[at..at + len];
            t.crc32 = crc32fast::hash(held);
            if let (true, Some(slot)) = (gemm, operand_slot(t.role)) {
                // The glimpse only where the rule can compare it: a GEMM that may recur the
                // anchor, or an operand that may be the anchor's bytes read again.
                let glimpsed = sampled
                    || self
                        .steps
                        .anchor()
                        .is_some_and(|a| a.may_see(slot, transposed(&c.meta.op, slot), t.nbytes));
                *ev = Evidence::read_packed(held, t.dtype, Some(t.crc32), sampled, glimpsed);
            }
        }
        (packed, k, evidence)
    }

    /// For a GEMM that may recur the anchor whose A and B were copied as fingerprints only
    /// (a reduced record): their glimpses' CRC-32s, read before the slot's bytes move, and
    /// whether the rule will read more than them ([`Steps::needs_fingerprints`]; it is fed
    /// this record next). Hashing whole 8 MiB operands of every forward GEMM kept the tracer
    /// from keeping up with an H200 under `--steps`. `None` when the glimpses are the
    /// fingerprints (operands up to 1 MiB or over 64 MiB) or another operand is at hand whole.
    fn glimpses_first(
        &self,
        c: &Captured,
        bytes: &[u8],
        sig: Option<u64>,
    ) -> Option<PerTensor<Option<Glimpsed>>> {
        let sig = sig?;
        let mut glimpses: PerTensor<Option<Glimpsed>> = PerTensor::new();
        let (mut ptrs, mut seen) = ([0u64; 2], [None; 2]);
        for (i, t) in c.tensors.iter().enumerate() {
            let Some(slot) = operand_slot(t.role).map(usize::from) else {
                glimpses.push(None);
                continue;
            };
            ptrs[slot] = t.ptr;
            if !t.captured {
                glimpses.push(None);
                continue;
            }
            let fp = c.fingerprints.get(i).copied().flatten()?;
            let from = c.offsets.get(i).copied().flatten()? as usize;
            if fp != Layout::of(t.nbytes) {
                return None;
            }
            let held = bytes.get(from..from + fp.bytes() as usize)?;
            let glimpse = crate::fingerprint::glimpse_crc(held, t.nbytes)?;
            seen[slot] = Some(glimpse);
            glimpses.push(Some(Glimpsed::Known(glimpse)));
        }
        if self
            .steps
            .needs_fingerprints(sig, ptrs, seen, c.meta.gemm_ordinal)
        {
            return Some(glimpses);
        }
        for g in glimpses.iter_mut().flatten() {
            if let Glimpsed::Known(v) = *g {
                *g = Glimpsed::Only(v);
            }
        }
        Some(glimpses)
    }

    /// Whether the step rule may read the samples of this op's operands: a GEMM with the
    /// anchor's signature, or any GEMM before the anchor is known (the rule only compares
    /// other GEMMs' CRC-32s with the anchor's, steps.rs). Records reach the rule in the order
    /// they are read here, so the anchor known now is the one the rule will hold.
    fn may_recur_anchor(&self, sig: Option<u64>) -> bool {
        match (sig, self.steps.anchor()) {
            (Some(sig), Some(anchor)) => sig == anchor.sig,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// Feeds a gap in place of a record whose snapshot cannot stand (`why`), its bytes
    /// already let go.
    fn replaced(&mut self, meta: Meta, tensors: &[Tensor], why: String, prefiltered: bool) {
        let bytes = tensors
            .iter()
            .filter(|t| t.captured)
            .map(|t| t.nbytes)
            .sum();
        let gap = gap_meta(meta, GapReason::ShapeUnknown, bytes, why);
        let class = classify(&gap.op, None, None, &[], &[]);
        self.feed(
            record(gap, Vec::new()),
            None,
            Vec::new(),
            class,
            prefiltered,
        );
    }

    /// Publishes a chunk of a streamed tensor once its copies completed, and adds it to the
    /// stream's CRC-32.
    fn chunk(&mut self, c: ChunkEntry) {
        let stream = c.stream;
        if let Err(code) = self.wait(c.event, false) {
            if code == cuda_abi::cudart::cudaErrorNotReady {
                crate::log::warn(
                    "a streamed tensor's chunk still in flight at exit, not published",
                );
                self.broken = true;
                return;
            }
            crate::fault(
                "ttrace",
                format!(
                    "a streamed tensor's chunk did not complete on the device (cudaError {code})"
                ),
            );
            self.skip_slot(c.slot);
            self.streams.entry(stream).or_default().failed = true;
            return;
        }
        // SAFETY: the slot belongs to the tracer until it is published; its copies completed.
        let bytes = unsafe { self.ring.slot_bytes(&c.slot) };
        let crc32 = crc32fast::hash(&bytes[..c.len as usize]);
        let st = self.streams.entry(stream).or_default();
        if st.failed {
            self.skip_slot(c.slot);
            return;
        }
        // The stream's CRC-32 from the chunk's (one pass over the bytes, not two).
        st.crc
            .combine(&crc32fast::Hasher::new_with_initial_len(crc32, c.len));
        st.fingerprint
            .get_or_insert_with(|| StreamedEvidence::new(c.total, u64::from(c.elem)))
            .chunk(c.offset, &bytes[..c.len as usize]);
        st.bytes += c.len;
        self.published_end = self.published_end.max(c.slot.end);
        PUBLISHED_END.fetch_max(c.slot.end, Ordering::AcqRel);
        self.send(&ClientMsg::Chunk(Chunk {
            stream,
            index: c.index,
            offset: c.offset,
            len: c.len,
            total: c.total,
            elem: c.elem,
            crc32,
            slot: c.slot,
        }));
    }

    /// Resolves a record's streamed tensors: complete ones get the CRC-32 of all their
    /// chunks (and the step rule's evidence from their fingerprint, by tensor), the others are
    /// metadata only (their stream is dropped by the daemon).
    fn streamed(
        &mut self,
        tensors: &mut [Tensor],
        streams: &[Option<u64>],
    ) -> (Vec<StreamRef>, Vec<Option<Evidence>>) {
        let mut refs = Vec::new();
        let mut evidence = vec![None; tensors.len()];
        for (i, (t, s)) in tensors.iter_mut().zip(streams).enumerate() {
            let Some(id) = *s else { continue };
            let st = self.streams.remove(&id).unwrap_or_default();
            if t.captured && !st.failed && st.bytes == t.nbytes {
                t.crc32 = st.crc.finalize();
                evidence[i] = st
                    .fingerprint
                    .as_ref()
                    .map(|f| f.evidence(t.dtype, t.crc32));
                refs.push(StreamRef {
                    tensor: i as u32,
                    stream: id,
                });
            } else {
                t.captured = false;
                t.crc32 = 0;
                if st.bytes > 0 {
                    self.send(&ClientMsg::StreamAbort { stream: id });
                }
            }
        }
        (refs, evidence)
    }

    fn feed(
        &mut self,
        (mut record, later): (Record, Later),
        slot: Option<Slot>,
        streams: Vec<StreamRef>,
        class: Class,
        prefiltered: bool,
    ) {
        if !prefiltered {
            // A reduced record is dropped (or becomes a gap, stamped then): no clock read.
            record.t_done_ns = now_ns();
        }
        if let Some(s) = slot {
            *self.unpublished.entry(s.pos).or_default() += 1;
        }
        if let Class::Gemm {
            ordinal: Some(o), ..
        } = class
        {
            self.check_period_to(o);
        }
        // Kept between records (an allocation per record otherwise).
        let mut out = std::mem::take(&mut self.decided);
        self.steps.push(
            Pending {
                record,
                later,
                slot,
                streams,
                prefiltered,
                evidence: matches!(class, Class::Gemm { a, b, .. } if a.glimpse.is_some() || b.glimpse.is_some()),
                glimpses: matches!(class, Class::Gemm { a, b, .. }
                    if (a.glimpse.is_some() || b.glimpse.is_some()) && a.crc.is_none() && b.crc.is_none()),
            },
            class,
            &mut |p, s| out.push((p, s)),
        );
        if !self.anchor_noted {
            if let Some(anchor) = self.steps.anchor() {
                self.anchor_noted = true;
                if self.anchor_told.is_some_and(|told| told != anchor) {
                    // The first GEMM's snapshot did not reach the rule: the hooks after it
                    // left out the operands of GEMMs of another signature, this one's.
                    crate::prefilter::note_anchor(anchor);
                    crate::fault(
                        "ttrace",
                        "the auto step rule's anchor is not the first GEMM (its snapshot \
                         failed): the operands the rule reads were left out by the hooks \
                         before it knew, so steps could be numbered wrong"
                            .into(),
                    );
                } else if self.anchor_told.is_none() {
                    crate::prefilter::note_anchor(anchor);
                }
            }
        }
        let period = self.steps.period();
        if period.map(|p| p.origin) != self.period_noted {
            crate::prefilter::note_period(period);
            match period {
                Some(p) => crate::log::info(&format!(
                    "the auto step rule follows the steps' period from step {}: {} GEMMs a \
                     step, the operands of {} of them read",
                    self.steps.step(),
                    p.len,
                    p.recurrences.len()
                )),
                None => crate::log::info(&format!(
                    "the auto step rule's period broke in step {}: every GEMM is read again",
                    self.steps.step()
                )),
            }
            self.period_noted = period.map(|p| p.origin);
            self.checked_to = period.map_or(0, |p| p.from);
        }
        for (p, s) in out.drain(..) {
            self.publish(p, s);
        }
        self.decided = out;
    }

    /// Within a period, checks the GEMMs before ordinal `o` that the rule did not see (their
    /// hooks left them out) against it, by the hooks' history: the period breaks at the first
    /// that disagrees, as it would have had the rule seen it (prefilter.rs).
    fn check_period_to(&mut self, o: u64) {
        let Some(p) = self.steps.period() else { return };
        if o <= self.checked_to {
            return;
        }
        let at = crate::prefilter::first_deviation(p, self.checked_to, o);
        self.checked_to = o + 1;
        if let Some(at) = at {
            self.steps.period_broken_at(at);
        }
    }

    /// A counted record went through the step rule: tells the hooks the step reached, and
    /// stops capture once no selected step is left.
    fn fed_counted(&mut self) {
        let step = self.steps.step();
        crate::prefilter::note_fed(step);
        if !self.stopped_capture && crate::prefilter::past_last_step(self.cfg, step) {
            self.stopped_capture = true;
            crate::mode::stop_capture();
            crate::log::info(&format!(
                "capture stops at step {step}: no later step is selected (TTRACE_STEPS={}); \
                 the program runs untraced from here on",
                self.cfg
                    .steps
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            ));
        }
    }

    /// Whether a record of `rank` at `step` is selected (`TTRACE_STEPS`, `TTRACE_RANKS`).
    fn selected(&self, rank: u32, step: u64) -> bool {
        let cfg = self.cfg;
        cfg.steps.as_ref().is_none_or(|set| set.contains(step))
            && cfg
                .ranks
                .as_ref()
                .is_none_or(|set| set.contains(u64::from(rank)))
    }

    fn publish(&mut self, mut p: Pending, step: u64) {
        if let Some(s) = p.slot {
            if let Some(n) = self.unpublished.get_mut(&s.pos) {
                *n -= 1;
                if *n == 0 {
                    self.unpublished.remove(&s.pos);
                }
            }
        }
        if self.broken {
            return;
        }
        // A process driving several devices is several ranks (identity::rank_of_device).
        let rank = crate::identity::rank_of_device(p.record.device);
        if !self.selected(rank, step) {
            if let Some(s) = p.slot {
                self.skip_slot(s);
            }
            for r in &p.streams {
                self.send(&ClientMsg::StreamAbort { stream: r.stream });
            }
            self.ring.note_dropped();
            self.dropped += 1;
            self.reduced += u64::from(p.prefiltered);
            self.reduced_copies += u64::from(p.prefiltered && p.evidence);
            self.reduced_glimpses += u64::from(p.prefiltered && p.glimpses);
            return;
        }
        if p.prefiltered {
            // Its hook raced another thread's step mark or GEMM (prefilter.rs): its snapshot
            // holds only what the step rule reads (no shapes, fingerprints for bytes), so a gap
            // stands in its place and capture stops: the store says the step is incomplete.
            let detail = format!(
                "{}: snapshot reduced by the step filter, but the record belongs to selected \
                 step {step}",
                p.later.api
            );
            if let Some(s) = p.slot.take() {
                self.skip_slot(s);
            }
            for r in std::mem::take(&mut p.streams) {
                self.send(&ClientMsg::StreamAbort { stream: r.stream });
            }
            let bytes = p.record.tensors.iter().map(|t| t.nbytes).sum();
            p.record.op = Op::gap(
                GapReason::TracerFault,
                p.later.api.to_string(),
                bytes,
                detail.clone(),
            );
            p.record.tensors.clear();
            p.record.t_done_ns = now_ns();
            crate::fault("ttrace", detail);
        }
        let mut record = p.record;
        record.api = p.later.api.to_string();
        record.nvtx = p.later.nvtx.to_vec();
        record.kernels_before = p.later.kernels.iter().map(|k| k.to_string()).collect();
        for t in record.tensors.iter_mut() {
            // The hooks leave the strides of the packed bytes to here (engine::tensor_of).
            if t.strides.len() != t.shape.len() {
                t.strides = ttrace_proto::record::packed_strides(&t.shape);
            }
        }
        record.rank = rank;
        let seq = self.seq.entry((record.rank, step)).or_insert(0);
        record.step = step;
        record.seq = *seq;
        *seq += 1;
        if matches!(record.op, Op::Gap(_)) {
            self.gaps += 1;
        } else {
            self.records += 1;
        }
        if let Some(s) = p.slot {
            self.published_end = self.published_end.max(s.end);
            PUBLISHED_END.fetch_max(s.end, Ordering::AcqRel);
        }
        let msg = if p.streams.is_empty() {
            ClientMsg::Publish {
                record: Box::new(record),
                slot: p.slot,
            }
        } else {
            ClientMsg::PublishStreamed {
                record: Box::new(record),
                streams: p.streams,
            }
        };
        self.send(&msg);
    }

    fn send(&mut self, msg: &ClientMsg) {
        if self.broken {
            return;
        }
        if let Err(e) = self.client.queue(msg) {
            if crate::mode::disable() {
                crate::log::error(&format!(
                    "capture disabled: the daemon connection failed: {e}"
                ));
            }
            self.broken = true;
        }
    }

    /// Before the thread waits (for the device or the FIFO): hands the daemon the messages
    /// batched and the hooks the ring space of skipped slots.
    fn before_waiting(&mut self) {
        self.release_skipped();
        self.flush();
    }

    /// Writes the messages the connection batched ([`Client::flush`]).
    fn flush(&mut self) {
        if self.broken {
            return;
        }
        if let Err(e) = self.client.flush() {
            if crate::mode::disable() {
                crate::log::error(&format!(
                    "capture disabled: the daemon connection failed: {e}"
                ));
            }
            self.broken = true;
        }
    }

    fn skip_slot(&mut self, s: Slot) {
        self.to_release = self.to_release.max(s.end);
    }

    /// Releases skipped slots once the daemon released everything published before them
    /// (releasing is cumulative: earlier published slots must be done with), and never past
    /// a slot whose record the step rule still holds back. Nothing when the ring's tail is at
    /// the limit already: a release is a futex wake (a system call), and this runs each time
    /// the thread is about to wait.
    fn release_skipped(&mut self) {
        let limit = match self.unpublished.keys().next() {
            Some(&held) => held.min(self.to_release),
            None => self.to_release,
        };
        let tail = self.ring.tail();
        if limit > self.published_end && tail >= self.published_end && limit > tail {
            self.ring.release_to(limit);
        }
    }
}

/// The tensors (by index) of `expect` ([`Captured::expect`]) that do not hold what they must
/// (`held(index, bytes)` says whether one does). None when the record stores no other bytes
/// (metadata only: nothing to vouch for).
fn unmet(
    expect: &[(usize, std::sync::Arc<[u8]>)],
    tensors: &[Tensor],
    mut held: impl FnMut(usize, &[u8]) -> bool,
) -> Vec<usize> {
    let other = |i: usize| !expect.iter().any(|(e, _)| *e == i);
    let stored = tensors
        .iter()
        .enumerate()
        .any(|(i, t)| t.captured && other(i));
    if !stored {
        return Vec::new();
    }
    expect
        .iter()
        .filter(|(i, want)| !held(*i, want))
        .map(|(i, _)| *i)
        .collect()
}

/// Why a pointer-array batch's record cannot stand: the arrays `bad` of `tensors` differ.
fn arrays_differ(op: &Op, tensors: &[Tensor], bad: &[usize]) -> String {
    let roles: Vec<String> = bad
        .iter()
        .map(|&i| format!("{:?}", tensors[i].role))
        .collect();
    let shape = match op {
        Op::Gemm(g) => format!("m={} n={} k={} batch={}: ", g.m, g.n, g.k, g.batch),
        _ => String::new(),
    };
    format!(
        "{shape}pointer-array batch: the device pointer array ({}) the op read differs from \
         the bytes uploaded to it from the host, or could not be taken (rewritten on the device \
         after the upload, or its pinned host source changed before the copy ran): the \
         matrices at the uploaded addresses may not be the op's",
        roles.join(", ")
    )
}

/// A record from its metadata and tensors (rank, step and seq are set at publication), with
/// what only a published record needs ([`Later`]).
fn record(meta: Meta, tensors: Vec<Tensor>) -> (Record, Later) {
    let later = Later {
        api: meta.api,
        nvtx: meta.nvtx,
        kernels: meta.kernels_before,
    };
    let record = Record {
        rank: 0,
        step: 0,
        seq: 0,
        api: String::new(),
        op: meta.op,
        stream: meta.stream,
        device: meta.device,
        thread: meta.thread,
        nvtx: Vec::new(),
        kernels_before: Vec::new(),
        tensors,
        t_call_ns: meta.t_call_ns,
        t_done_ns: 0,
    };
    (record, later)
}

/// A record's fields that are filled in when it is published: the many records dropped
/// outside `--steps`/`--ranks` never allocate them.
struct Later {
    api: &'static str,
    nvtx: Arc<[String]>,
    kernels: Vec<Arc<str>>,
}

/// The operand slot of a GEMM tensor's role (0: A, 1: B).
fn operand_slot(role: Role) -> Option<u8> {
    match role {
        Role::A => Some(0),
        Role::B => Some(1),
        _ => None,
    }
}

/// Whether a GEMM reads operand `slot` (0: A, 1: B) transposed (cuBLAS's `CUBLAS_OP_N` is 0).
fn transposed(op: &Op, slot: u8) -> bool {
    match op {
        Op::Gemm(g) => (if slot == 0 { g.transa } else { g.transb }) != 0,
        _ => false,
    }
}

/// A fingerprint's glimpse read ahead ([`Tracer::glimpses_first`]).
#[derive(Debug, Clone, Copy)]
enum Glimpsed {
    /// Its CRC-32; the fingerprint's is wanted too.
    Known(u32),
    /// Its CRC-32, all the rule will read of the operand.
    Only(u32),
}

/// The signature of a record's op if it is a GEMM ([`gemm_sig`]), computed once per record
/// for what reads it.
fn op_sig(api: &str, op: &Op) -> Option<u64> {
    match op {
        Op::Gemm(g) => Some(gemm_sig(api, g)),
        _ => None,
    }
}

/// What the step rule needs of a record, `sig` its op's signature ([`op_sig`]). `evidence`
/// (by tensor, or empty) holds the fingerprints' CRC-32s and samples of the GEMM operands
/// whose bytes were at hand.
fn classify(
    op: &Op,
    sig: Option<u64>,
    ordinal: Option<u64>,
    tensors: &[Tensor],
    evidence: &[Option<Evidence>],
) -> Class {
    match (op, sig) {
        (Op::Gemm(g), Some(sig)) => {
            // cuBLAS's CUBLAS_OP_N is 0; T and C read the operand transposed.
            let operand = |role, trans: u32| {
                let found = tensors.iter().position(|t| t.role == role);
                let ev = found.and_then(|i| evidence.get(i).copied().flatten());
                Operand {
                    ptr: found.map_or(0, |i| tensors[i].ptr),
                    crc: ev.and_then(|e| e.crc),
                    glimpse: ev.and_then(|e| e.glimpse),
                    len: found.map_or(0, |i| tensors[i].nbytes),
                    trans: trans != 0,
                    sample: ev.and_then(|e| e.sample),
                }
            };
            Class::Gemm {
                sig,
                a: operand(Role::A, g.transa),
                b: operand(Role::B, g.transb),
                ordinal,
            }
        }
        (Op::Memcpy(m), _) if m.direction == CopyDirection::HostToDevice => Class::Arrival,
        (Op::Collective(c), _) if c.kind == CollectiveKind::Recv => Class::Arrival,
        _ => Class::Other,
    }
}

/// The step rule's signature of a GEMM: API, shape, transposes and types. Compared within
/// the process only (never stored), and computed for every GEMM by its hook and again by the
/// tracer: a fast hash (std's SipHash was the largest of libttrace's own costs in a GEMM hook
/// under `--steps` outside the run, on the simulator).
pub(crate) fn gemm_sig(api: &str, g: &GemmOp) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    (api, g.m, g.n, g.k, g.batch, g.transa, g.transb).hash(&mut h);
    (g.a_type, g.b_type, g.c_type, g.d_type, g.compute_type).hash(&mut h);
    h.finish()
}

/// A gap's metadata.
pub fn gap_meta(base: Meta, reason: GapReason, bytes: u64, detail: String) -> Meta {
    let api = base.api;
    Meta {
        op: Op::Gap(GapOp {
            reason,
            skipped_api: api.to_string(),
            bytes,
            detail,
        }),
        ..base
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use ttrace_proto::dtype::DType;

    fn tensor(role: Role, captured: bool) -> Tensor {
        Tensor {
            role,
            dtype: DType::U64,
            shape: vec![2],
            strides: vec![1],
            ptr: 0x1000,
            nbytes: 16,
            captured,
            crc32: 0,
        }
    }

    fn event(raw: usize, device: i32, lane: u64) -> Event {
        Event { raw, device, lane }
    }

    fn skip(ev: Event) -> Entry {
        Entry::Skip {
            slot: None,
            event: Some(ev),
        }
    }

    #[test]
    fn a_gemm_signature_tells_apart_every_field_it_covers_and_ignores_the_rest() {
        let base = GemmOp::plain(64, 32, 96, 14);
        let sig = |api: &str, g: &GemmOp| gemm_sig(api, g);
        let s = sig("cublasGemmEx", &base);
        let variants: [(&str, GemmOp); 12] = [
            (
                "cublasGemmEx",
                GemmOp {
                    m: 65,
                    ..base.clone()
                },
            ),
            (
                "cublasGemmEx",
                GemmOp {
                    n: 33,
                    ..base.clone()
                },
            ),
            (
                "cublasGemmEx",
                GemmOp {
                    k: 97,
                    ..base.clone()
                },
            ),
            (
                "cublasGemmEx",
                GemmOp {
                    batch: 2,
                    ..base.clone()
                },
            ),
            (
                "cublasGemmEx",
                GemmOp {
                    transa: 1,
                    ..base.clone()
                },
            ),
            (
                "cublasGemmEx",
                GemmOp {
                    transb: 1,
                    ..base.clone()
                },
            ),
            (
                "cublasGemmEx",
                GemmOp {
                    a_type: 0,
                    ..base.clone()
                },
            ),
            (
                "cublasGemmEx",
                GemmOp {
                    b_type: 0,
                    ..base.clone()
                },
            ),
            (
                "cublasGemmEx",
                GemmOp {
                    c_type: 0,
                    ..base.clone()
                },
            ),
            (
                "cublasGemmEx",
                GemmOp {
                    d_type: 0,
                    ..base.clone()
                },
            ),
            (
                "cublasGemmEx",
                GemmOp {
                    compute_type: 0,
                    ..base.clone()
                },
            ),
            ("cublasLtMatmul", base.clone()),
        ];
        let mut seen = vec![s];
        for (api, g) in &variants {
            let v = sig(api, g);
            assert!(!seen.contains(&v), "{api} {g:?} collides");
            seen.push(v);
        }
        // Pointers, leading dimensions and scalars are not part of it.
        let moved = GemmOp {
            lda: 128,
            alpha: Some(2.0),
            beta: None,
            algo: 3,
            ..base.clone()
        };
        assert_eq!(sig("cublasGemmEx", &moved), s);
        // The API's bytes count, not only its length.
        assert_ne!(sig("cublasGemmEy", &base), s);
    }

    fn queue() -> Queue {
        Queue {
            window: VecDeque::new(),
            base: 0,
            sleep: Sleep::Awake,
            pushed: 0,
        }
    }

    /// Tickets come out in order whatever order they are handed in, and only once the next
    /// one is there.
    #[test]
    fn the_window_hands_out_tickets_in_order() {
        let mut q = queue();
        q.insert(2, Entry::StreamAbort(2), false);
        q.insert(1, Entry::StreamAbort(1), true);
        assert!(q.take(0).is_none(), "ticket 0 is not handed in yet");
        q.insert(0, Entry::StreamAbort(0), false);
        for n in 0..3 {
            match q.take(n) {
                Some((Entry::StreamAbort(id), counted)) => {
                    assert_eq!((id, counted), (n, n == 1));
                }
                other => panic!("ticket {n}: {other:?}"),
            }
        }
        assert!(q.take(3).is_none());
        assert_eq!(q.pushed, 3);
    }

    /// The tracer waits once for a batch on the last event of the same stream and device,
    /// never on another stream's, and not while a streamed tensor's chunk is queued.
    #[test]
    fn a_batch_waits_on_the_last_event_of_its_stream() {
        let waited = event(1, 0, 7);
        let mut q = queue();
        q.insert(0, skip(event(2, 0, 7)), false);
        q.insert(1, skip(event(3, 0, 7)), false);
        q.insert(2, skip(event(4, 0, 8)), false); // another stream
        q.insert(3, skip(event(5, 1, 7)), false); // another device
        q.insert(4, Entry::StreamAbort(9), false);
        assert_eq!(q.later_on_lane(waited).map(|e| e.raw), Some(3));
        assert_eq!(
            q.later_on_lane(event(6, 0, 9)),
            None,
            "nothing on its stream"
        );
        let slot = Slot {
            pos: 0,
            len: 64,
            end: 64,
        };
        let chunk = ChunkEntry {
            stream: 1,
            index: 0,
            offset: 0,
            len: 64,
            total: 128,
            elem: 1,
            slot,
            event: event(10, 0, 7),
        };
        q.insert(5, Entry::Chunk(Box::new(chunk)), false);
        assert_eq!(
            q.later_on_lane(waited),
            None,
            "a chunk is waited for on its own"
        );
    }

    #[test]
    fn an_array_that_differs_or_is_missing_is_unmet_unless_nothing_else_is_stored() {
        let want: Arc<[u8]> = Arc::from(vec![1u8; 16]);
        let expect = vec![(1, want.clone())];
        let tensors = [tensor(Role::A, true), tensor(Role::ArrayA, true)];
        assert!(unmet(&expect, &tensors, |_, w| w == &*want).is_empty());
        assert_eq!(unmet(&expect, &tensors, |_, _| false), vec![1]);
        // Metadata only (a size cap took everything): nothing to vouch for.
        let bare = [tensor(Role::A, false), tensor(Role::ArrayA, false)];
        assert!(unmet(&expect, &bare, |_, _| false).is_empty());
    }
}
