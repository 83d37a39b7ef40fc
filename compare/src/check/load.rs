//! Reading a store for the checks, a step at a time ([`stream`]; [`load`] reads it whole):
//! each record's metadata (with where its frame is), and the first non-finite value of each
//! rank (found while reading, so that GEMM tensors are decoded once and never held).
//! Collective tensors are decoded while the store is read (a tensor that does not decode is
//! said then), but their bytes are not held: a check reads a call's bytes again when it
//! checks that call ([`Trace::with_bytes`]), so that memory does not grow with the trace (a
//! whole run's collectives, gradient buckets included, do not fit in memory at scale).
//! Segments are opened through the store the loader compare shares opened
//! ([`crate::model::store::open`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use ttrace_format::reader::{RecordView, Segment, Store};
use ttrace_format::record::{Op, Record, Role};
use ttrace_format::FormatError;

use crate::check::nonfinite::{self, NonFinite};
use crate::prefetch::lock;

/// The segments a [`Trace`] read collective bytes from, oldest first, with their sizes: the
/// current step's, up to [`OPEN_BYTES`] of them. A call's members are in one segment per rank,
/// so with one segment open the calls reopened a segment for nearly every member: on the
/// hidden-32 tp2 dp2 pp2 trainer a fifth of the check's time went to opening and unmapping
/// them. Large frames leave the mapping once read (`Segment::set_releasing`), so what stays
/// resident is the small frames of the segments held.
type OpenSegments = std::collections::VecDeque<((u32, u64), Arc<Segment>, u64)>;

/// The most bytes of segment files a [`Trace`] holds open for collective bytes (at least one
/// segment, whatever its size).
const OPEN_BYTES: u64 = 64 << 20;

/// One record, with the bytes the collective checks need when they are held.
#[derive(Debug, Clone)]
pub struct Rec {
    /// The record's metadata.
    pub record: Record,
    /// Bytes of each tensor, when held (`None`, or no entry: not captured, not a collective,
    /// or not held: [`Trace::with_bytes`] reads them from the store by `frame`).
    pub bytes: Vec<Option<Vec<u8>>>,
    /// Where the record's frame is in its segment, when it was read from a store.
    pub frame: Option<u64>,
}

impl Rec {
    /// The index of the first tensor with `role`.
    pub fn find(&self, role: Role) -> Option<usize> {
        self.record.tensors.iter().position(|t| t.role == role)
    }

    /// The bytes of the tensor with `role`, when captured.
    pub fn bytes_of(&self, role: Role) -> Option<&[u8]> {
        self.find(role)
            .and_then(|i| self.bytes.get(i))
            .and_then(|b| b.as_deref())
    }

    /// `rank R step S seq Q API [nvtx]` for messages.
    pub fn name(&self) -> String {
        let r = &self.record;
        format!("rank {} step {} seq {} {}", r.rank, r.step, r.seq, r.api)
    }
}

/// A store read for checking.
#[derive(Debug, Default)]
pub struct Trace {
    /// Ranks present.
    pub ranks: Vec<u32>,
    /// Readable records, by rank, then step, then seq: every one ([`load`]), or those of the
    /// step being read ([`stream`]; none once it is done).
    pub records: Vec<Rec>,
    /// The step being read ([`stream`]; `None` for a whole trace, [`load`]).
    pub step: Option<u64>,
    /// The earliest non-finite value (by step, then call time) over all ranks.
    pub first_nonfinite: Option<NonFinite>,
    /// Records or tensors that could not be read (they are skipped).
    pub unreadable: Vec<String>,
    /// The store the records were read from: collective bytes are read from it again.
    pub source: Option<Arc<Store>>,
    /// The segments collective bytes were last read from ([`OpenSegments`]).
    pub(crate) open: Mutex<OpenSegments>,
    /// What could not be read again (a segment changed since): said with the rest.
    pub(crate) late_unreadable: Mutex<BTreeSet<String>>,
}

impl Trace {
    /// `rec` with its collective tensors' bytes: as held, or read from the store. A check
    /// holds a call's bytes while it checks it, and no more.
    pub fn with_bytes<'r>(&self, rec: &'r Rec) -> Cow<'r, Rec> {
        let held = rec.bytes.iter().any(Option::is_some);
        let (Some(store), Some(frame), false) = (&self.source, rec.frame, held) else {
            return Cow::Borrowed(rec);
        };
        if !matches!(rec.record.op, Op::Collective(_)) {
            return Cow::Borrowed(rec);
        }
        let key = (rec.record.rank, rec.record.step);
        let held = lock(&self.open)
            .iter()
            .find(|(k, _, _)| *k == key)
            .map(|(_, seg, _)| Arc::clone(seg));
        // Opened without the lock: the calls checked side by side do not wait on each
        // other's openings.
        let seg = match held {
            Some(seg) => seg,
            None => match store.open_segment(key.0, key.1) {
                Ok(mut seg) => {
                    seg.set_releasing(true);
                    let seg = Arc::new(seg);
                    let size = store.segment_info(key.0, key.1).map_or(0, |i| i.bytes);
                    let mut open = lock(&self.open);
                    // Calls complete in their step, mostly: the segments of steps before this
                    // one go (a call completed late, of an earlier step, leaves the rest).
                    open.retain(|(k, _, _)| k.1 >= key.1);
                    while !open.is_empty()
                        && open.iter().map(|o| o.2).sum::<u64>() + size > OPEN_BYTES
                    {
                        open.pop_front();
                    }
                    // Another call may have opened it meanwhile: one of them is held.
                    if !open.iter().any(|(k, _, _)| *k == key) {
                        open.push_back((key, Arc::clone(&seg), size));
                    }
                    seg
                }
                Err(e) => {
                    self.note_late(format!("rank {} step {}: {e}", key.0, key.1));
                    return Cow::Borrowed(rec);
                }
            },
        };
        let view = match seg.read_at(frame, &rec.record) {
            Some(Ok(v)) => v,
            Some(Err(issue)) => {
                self.note_late(issue.to_string());
                return Cow::Borrowed(rec);
            }
            None => {
                self.note_late(format!("{}: its frame is no longer there", rec.name()));
                return Cow::Borrowed(rec);
            }
        };
        let mut late = Vec::new();
        let bytes = collective_bytes(&view, &mut late);
        view.release();
        for line in late {
            self.note_late(line);
        }
        Cow::Owned(Rec {
            record: rec.record.clone(),
            bytes,
            frame: rec.frame,
        })
    }

    fn note_late(&self, line: String) {
        lock(&self.late_unreadable).insert(line);
    }

    /// What could not be read when read again for a check ([`Trace::with_bytes`]).
    pub fn late_unreadable(&self) -> Vec<String> {
        lock(&self.late_unreadable).iter().cloned().collect()
    }

    /// Records of `rank`, in call order.
    pub fn of_rank(&self, rank: u32) -> impl Iterator<Item = &Rec> {
        self.records.iter().filter(move |r| r.record.rank == rank)
    }
}

/// Reads `store` whole; `progress(done, total)` counts records. [`stream`] reads it a step at
/// a time instead, as `ttrace check` does.
pub fn load(store: &Arc<Store>, progress: &mut dyn FnMut(u64, u64)) -> Result<Trace, FormatError> {
    let mut records = Vec::new();
    let mut trace = stream(store, progress, &mut |step: &mut Trace| {
        records.append(&mut step.records);
    })?;
    // Rank by rank, then step by step, as the store lists its segments.
    records.sort_by_key(|r| (r.record.rank, r.record.step));
    trace.records = records;
    Ok(trace)
}

/// Reads `store` one step at a time: `each_step` is handed the trace with that step's
/// records (every rank's, rank by rank, each in call order), which are dropped after it, so
/// that memory holds one step's records, not the trace's. Steps come in order; a rank
/// without the step has none in it. The trace returned holds no records: what could not be
/// read, in the store's order (rank by rank, then step by step), and the first non-finite
/// value. `progress(done, total)` counts records.
pub fn stream(
    store: &Arc<Store>,
    progress: &mut dyn FnMut(u64, u64),
    each_step: &mut dyn FnMut(&mut Trace),
) -> Result<Trace, FormatError> {
    let total: u64 = store
        .manifest()
        .map_or(0, |m| m.ranks.iter().map(|r| r.records).sum());
    let mut trace = Trace {
        ranks: store.ranks(),
        source: Some(Arc::clone(store)),
        ..Trace::default()
    };
    let steps: BTreeSet<u64> = trace
        .ranks
        .iter()
        .flat_map(|&rank| store.steps(rank))
        .collect();
    // What could not be read, said in the store's order whatever the order of reading.
    let mut unreadable: BTreeMap<(u32, u64), Vec<String>> = BTreeMap::new();
    let mut firsts: BTreeMap<u32, NonFinite> = BTreeMap::new();
    let mut done = 0u64;
    for step in steps {
        let ranks: Vec<u32> = trace
            .ranks
            .iter()
            .copied()
            .filter(|&rank| store.segment_info(rank, step).is_some())
            .collect();
        // Every rank's segment of the step read at once, on every core; joined in rank order.
        let read: Vec<RankStep> = ranks
            .par_iter()
            .map(|&rank| read_rank_step(store, rank, step, !firsts.contains_key(&rank)))
            .collect();
        for (&rank, r) in ranks.iter().zip(read) {
            done += r.read;
            if !r.unreadable.is_empty() {
                unreadable.insert((rank, step), r.unreadable);
            }
            if let Some(nf) = r.first_nonfinite {
                firsts.entry(rank).or_insert(nf);
            }
            trace.records.extend(r.records);
        }
        progress(done, total.max(done));
        trace.step = Some(step);
        each_step(&mut trace);
        trace.records = Vec::new();
        trace.step = None;
    }
    progress(done, total.max(done));
    trace.unreadable = unreadable.into_values().flatten().collect();
    // Call times are host times (the host runs ahead of the device): a collective called
    // early receives a NaN made later on another rank. So within a step, a value that a
    // collective "produced" ranks after one that arose locally; then call time decides.
    trace.first_nonfinite = firsts
        .into_values()
        .min_by_key(|n| (n.step, n.via_collective(), n.t_call_ns, n.rank));
    Ok(trace)
}

/// One rank's segment of one step, read ([`read_rank_step`]).
struct RankStep {
    records: Vec<Rec>,
    /// What could not be read, in order.
    unreadable: Vec<String>,
    /// The first non-finite value of its records, when looked for.
    first_nonfinite: Option<NonFinite>,
    /// Records read (readable or not).
    read: u64,
}

/// Reads the segment of (`rank`, `step`): its records, what could not be read, and, when
/// `scan` (the rank has none yet), the first non-finite value.
fn read_rank_step(store: &Store, rank: u32, step: u64, mut scan: bool) -> RankStep {
    let mut out = RankStep {
        records: Vec::new(),
        unreadable: Vec::new(),
        first_nonfinite: None,
        read: 0,
    };
    let mut seg = match store.open_segment(rank, step) {
        Ok(seg) => seg,
        Err(e) => {
            out.unreadable.push(format!("rank {rank} step {step}: {e}"));
            return out;
        }
    };
    // Read through once, in order: large frames leave the mapping as they are read, so that
    // a segment larger than memory is not mapped (resident) whole.
    seg.set_releasing(true);
    let mut buffers = nonfinite::ScanBuffers::default();
    for view in seg.records() {
        out.read += 1;
        let view = match view {
            Ok(v) => v,
            Err(issue) => {
                out.unreadable.push(issue.to_string());
                continue;
            }
        };
        if scan {
            match nonfinite::scan(&view, &mut buffers) {
                Ok(Some(nf)) => {
                    out.first_nonfinite = Some(nf);
                    scan = false;
                }
                Ok(None) => {}
                Err(e) => out.unreadable.push(e.to_string()),
            }
        }
        out.records
            .push(keep(&view, &mut buffers, &mut out.unreadable));
        view.release();
    }
    out
}

/// The record and where its frame is; a collective's tensors are decoded (into `buffers`,
/// checked against their CRC-32s, what does not decode said) but not held.
fn keep(
    view: &RecordView<'_>,
    buffers: &mut nonfinite::ScanBuffers,
    unreadable: &mut Vec<String>,
) -> Rec {
    if matches!(view.record.op, Op::Collective(_)) {
        for i in 0..view.record.tensors.len() {
            // What the non-finite scan decoded was checked there.
            if !view.is_captured(i) || buffers.checked(view, i) {
                continue;
            }
            if let Err(e) = buffers.decode(view, i) {
                unreadable.push(e.to_string());
            }
        }
    }
    let mut record = view.record.clone();
    // No check reads the kernels launched before an op, and their names (recorded by default,
    // often long template instantiations) can outweigh the rest of a record (a collective's
    // is held until its call or transfer is checked).
    record.kernels_before = Vec::new();
    Rec {
        record,
        // None held (an empty list reads as `None` for every tensor): a list of `None`s
        // would cost a hundred bytes a record.
        bytes: Vec::new(),
        frame: Some(view.offset),
    }
}

/// A collective record's tensors' bytes (`None`: not captured, or not decodable: said in
/// `unreadable`).
fn collective_bytes(view: &RecordView<'_>, unreadable: &mut Vec<String>) -> Vec<Option<Vec<u8>>> {
    (0..view.record.tensors.len())
        .map(|i| {
            if !view.is_captured(i) {
                return None;
            }
            view.tensor_bytes(i)
                .map_err(|e| unreadable.push(e.to_string()))
                .ok()
        })
        .collect()
}
