//! A store's record metadata, by segment (rank, step): parsed when first read and kept
//! within a budget, the least recently read segment's records dropped first and parsed again
//! when read again. A store's metadata grows with its steps (about a kilobyte a record) and
//! a comparison reads a few steps at a time, so what it holds of them need not grow with the
//! trace.

use std::collections::BTreeMap;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ttrace_format::reader::Store;
use ttrace_format::record::{Op, Record};

use crate::prefetch::lock;

/// The records of one segment in seq order, with the offset of each one's frame.
#[derive(Debug, Default)]
pub struct SegmentRecords {
    records: Vec<Record>,
    frames: Vec<u64>,
    /// What holding them costs, estimated ([`approx_bytes`]).
    bytes: u64,
}

impl SegmentRecords {
    /// Records in seq order with the offsets of their frames, without the names of the
    /// kernels launched before each op: recorded by default and often long (template
    /// instantiations), they can outweigh the rest of a record, and a comparison reads them
    /// for its first divergence only ([`RecordCache::kernels_before`]).
    pub fn new(mut read: Vec<(Record, u64)>) -> SegmentRecords {
        read.sort_by_key(|(r, _)| r.seq);
        for (r, _) in &mut read {
            r.kernels_before = Vec::new();
        }
        let bytes = read.iter().map(|(r, _)| approx_bytes(r)).sum();
        let (records, frames) = read.into_iter().unzip();
        SegmentRecords {
            records,
            frames,
            bytes,
        }
    }

    /// What holding them costs, estimated ([`approx_bytes`]).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The index of the record `seq`.
    fn find(&self, seq: u64) -> Option<usize> {
        // Records are sorted by seq (and dense in practice): look where it should be first.
        match self.records.get(seq as usize) {
            Some(r) if r.seq == seq => Some(seq as usize),
            _ => self.records.binary_search_by_key(&seq, |r| r.seq).ok(),
        }
    }
}

impl Deref for SegmentRecords {
    type Target = [Record];
    fn deref(&self) -> &[Record] {
        &self.records
    }
}

/// One segment's records, shared: they stay in memory while held, whatever the budget.
pub type StepRecords = Arc<SegmentRecords>;

/// One record of a [`StepRecords`] (which it holds).
#[derive(Debug, Clone)]
pub struct RecordRef {
    records: StepRecords,
    index: usize,
}

impl RecordRef {
    /// The record `seq` of `records`.
    pub fn find(records: StepRecords, seq: u64) -> Option<RecordRef> {
        let index = records.find(seq)?;
        Some(RecordRef { records, index })
    }

    /// The offset of its frame in its segment.
    pub fn frame(&self) -> u64 {
        self.records.frames[self.index]
    }
}

impl Deref for RecordRef {
    type Target = Record;
    fn deref(&self) -> &Record {
        &self.records.records[self.index]
    }
}

/// Every segment's records of a store, kept within a budget.
pub struct RecordCache {
    store: Arc<Store>,
    path: PathBuf,
    /// Frames each segment had when the store was opened, and how many of them were records
    /// read then: read again, a segment is read that far only (a segment still being
    /// written has more frames since, which the comparison, aligned on the first reading,
    /// does not know), and must give as many records.
    at_open: BTreeMap<(u32, u64), AtOpen>,
    held: Mutex<Held>,
    /// Segments read again short of what they held at opening (changed or removed since), by
    /// (rank, step): the line that says so and how many records it left out (the most of
    /// its readings). Those records are missing from the comparison, so they are said and
    /// counted with what else could not be read.
    late: Mutex<BTreeMap<(u32, u64), (String, u64)>>,
    /// The records of the largest step (every rank's), [`largest_step`].
    largest_step: u64,
}

/// A segment as the store's opening found it.
#[derive(Debug, Clone, Copy)]
pub struct AtOpen {
    /// Its frames then.
    pub frames: usize,
    /// The records read from them.
    pub records: usize,
    /// What holding those records costs ([`SegmentRecords::bytes`]).
    pub bytes: u64,
}

/// What a [`RecordCache`] holds.
struct Held {
    /// Records by segment, least recently read first.
    loaded: lru::LruCache<(u32, u64), StepRecords>,
    bytes: u64,
    budget: u64,
    /// Segments parsed again after they were dropped.
    reparsed: u64,
}

impl Held {
    /// Drops the least recently read segments' records until at most `bytes` are held.
    fn drop_past(&mut self, bytes: u64) {
        while self.bytes > bytes {
            let Some((_, dropped)) = self.loaded.pop_lru() else {
                break;
            };
            self.bytes -= dropped.bytes;
        }
    }
}

impl RecordCache {
    /// The records of a store whose segments were as `at_open` says when it was opened
    /// (every segment present, by (rank, step)), holding `kept` (records read then) and at
    /// most `budget` bytes of records from now on.
    pub fn new(
        store: Arc<Store>,
        path: &Path,
        at_open: BTreeMap<(u32, u64), AtOpen>,
        kept: Vec<((u32, u64), SegmentRecords)>,
        budget: u64,
    ) -> RecordCache {
        // One step's records at least, every rank's: the walk reads a step's ranks in turn,
        // op after op; below that, the least recently read segment is always the one about
        // to be read again, and each record looked up would parse its segment anew.
        let largest_step = largest_step(&at_open);
        let mut held = Held {
            loaded: lru::LruCache::unbounded(),
            bytes: 0,
            budget: budget.max(largest_step),
            reparsed: 0,
        };
        // The records read at opening, least recently read first in the order given.
        for (key, recs) in kept {
            held.bytes += recs.bytes;
            held.loaded.put(key, Arc::new(recs));
        }
        RecordCache {
            store,
            path: path.to_path_buf(),
            at_open,
            held: Mutex::new(held),
            late: Mutex::default(),
            largest_step,
        }
    }

    /// The segments present, by (rank, step).
    pub fn keys(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.at_open.keys().copied()
    }

    /// Whether the store has a segment for `key`.
    pub fn contains(&self, key: (u32, u64)) -> bool {
        self.at_open.contains_key(&key)
    }

    /// Whether the records of two steps (the largest) fit the budget together: only then is
    /// the next step read ahead, which would otherwise drop the step being compared.
    pub fn two_steps_fit(&self) -> bool {
        self.largest_step.saturating_mul(2) <= lock(&self.held).budget
    }

    /// Whether the records of segment `key` are held now (reading them would parse nothing).
    pub fn holds(&self, key: (u32, u64)) -> bool {
        lock(&self.held).loaded.contains(&key)
    }

    /// The records of segment `key` (none when it is absent or no longer opens).
    pub fn get(&self, key: (u32, u64)) -> StepRecords {
        {
            let mut held = lock(&self.held);
            if let Some(recs) = held.loaded.get(&key) {
                return Arc::clone(recs);
            }
        }
        let Some(&open) = self.at_open.get(&key) else {
            return StepRecords::default();
        };
        // Parsed outside the lock: the other readers go on meanwhile.
        let recs = Arc::new(SegmentRecords::new(self.read_again(key, open)));
        let mut held = lock(&self.held);
        held.reparsed += 1;
        if let Some(kept) = held.loaded.get(&key) {
            return Arc::clone(kept); // Another reader parsed it meanwhile.
        }
        let room = held.budget.saturating_sub(recs.bytes);
        held.drop_past(room);
        held.bytes += recs.bytes;
        held.loaded.put(key, Arc::clone(&recs));
        recs
    }

    /// The records of segment `key` read again up to its frames at opening, what could not be
    /// read that was then noted ([`RecordCache::late_unreadable`]).
    fn read_again(&self, key: (u32, u64), open: AtOpen) -> Vec<(Record, u64)> {
        let read = read_segment(&self.store, &self.path, key, open.frames);
        let recs = read.records.unwrap_or_default();
        if recs.len() < open.records {
            let why = match read.unreadable.as_slice() {
                [] => String::new(),
                lines => format!(": {}", lines.join("; ")),
            };
            let lost = (open.records - recs.len()) as u64;
            let line = format!(
                "{}: rank {} step {}: {lost} of its {} records no longer read (the segment \
                 changed since the comparison opened it), left out{why}",
                self.path.display(),
                key.0,
                key.1,
                open.records
            );
            // Read again more than once, a segment counts once, with its most records lost.
            let mut late = lock(&self.late);
            if late.get(&key).is_none_or(|(_, n)| *n < lost) {
                late.insert(key, (line, lost));
            }
        }
        recs
    }

    /// What could not be read again that was read when the store was opened: a line per
    /// segment, with how many of its records it left out.
    pub fn late_unreadable(&self) -> Vec<(String, u64)> {
        lock(&self.late).values().cloned().collect()
    }

    /// The names of the kernels launched before the record `seq` of segment `key` (which the
    /// records held leave out, [`SegmentRecords::new`]), read from the segment again.
    pub fn kernels_before(&self, key: (u32, u64), seq: u64) -> Vec<String> {
        let Some(&open) = self.at_open.get(&key) else {
            return Vec::new();
        };
        self.read_again(key, open)
            .into_iter()
            .find(|(r, _)| r.seq == seq)
            .map(|(r, _)| r.kernels_before)
            .unwrap_or_default()
    }

    /// Segments parsed again since the store was opened (their records had been dropped).
    pub fn reparsed(&self) -> u64 {
        lock(&self.held).reparsed
    }

    /// Bytes of records held now (estimated).
    pub fn held_bytes(&self) -> u64 {
        lock(&self.held).bytes
    }
}

/// The records of the largest step (every rank's segment of it), in bytes.
fn largest_step(at_open: &BTreeMap<(u32, u64), AtOpen>) -> u64 {
    let mut per_step: BTreeMap<u64, u64> = BTreeMap::new();
    for (&(_, step), open) in at_open {
        *per_step.entry(step).or_default() += open.bytes;
    }
    per_step.values().copied().max().unwrap_or(0)
}

/// What holding `r` in memory costs, estimated from its parts (the struct, its strings and
/// vectors' heap blocks; allocator overhead left out): within a few tens of percent, enough to
/// bound the metadata a comparison holds.
pub fn approx_bytes(r: &Record) -> u64 {
    const STRING: usize = std::mem::size_of::<String>();
    let strings = |v: &[String]| v.iter().map(|s| STRING + s.len()).sum::<usize>();
    let op = match &r.op {
        Op::Gemm(_) => std::mem::size_of::<ttrace_format::record::GemmOp>(),
        Op::Gap(g) => g.skipped_api.len() + g.detail.len(),
        _ => 0,
    };
    let tensors: usize = r
        .tensors
        .iter()
        .map(|t| {
            std::mem::size_of::<ttrace_format::record::Tensor>()
                + 8 * (t.shape.len() + t.strides.len())
        })
        .sum();
    (std::mem::size_of::<Record>()
        + std::mem::size_of::<u64>()
        + r.api.len()
        + strings(&r.nvtx)
        + strings(&r.kernels_before)
        + op
        + tensors) as u64
}

/// A segment's records as read: `None` when the segment does not open; what could not be
/// read, a line each; how many frames it has.
pub struct ReadRecords {
    /// Every record read with the offset of its frame (`None`: the segment does not open).
    pub records: Option<Vec<(Record, u64)>>,
    /// What could not be read (or opened), a line each.
    pub unreadable: Vec<String>,
    /// The segment's frames.
    pub frames: usize,
}

/// Every record's metadata of the segment of `key` (rank, step) in file order, its first
/// `limit` frames at most, with the offset of each one's frame.
pub fn read_segment(
    store: &Store,
    path: &Path,
    (rank, step): (u32, u64),
    limit: usize,
) -> ReadRecords {
    let seg = match store.open_segment(rank, step) {
        Ok(s) => s,
        Err(e) => {
            return ReadRecords {
                records: None,
                unreadable: vec![format!("{}: rank {rank} step {step}: {e}", path.display())],
                frames: 0,
            }
        }
    };
    let frames = seg.len().min(limit);
    let mut records = Vec::with_capacity(frames);
    let mut unreadable = Vec::new();
    for i in 0..frames {
        match seg.read_meta(i) {
            Ok(v) => records.push((v.record, v.offset)),
            Err(issue) => unreadable.push(issue.to_string()),
        }
    }
    ReadRecords {
        records: Some(records),
        unreadable,
        frames,
    }
}
