//! A store opened for comparison: its records' metadata, within a budget (read again when
//! dropped, [`crate::records`]), tensors decoded to `f32` on demand (FP8 operands multiplied
//! by their captured scales), bytes read counted.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use rayon::prelude::*;
use ttrace_format::dtype::DType;
use ttrace_format::reader::{Segment, Store};
use ttrace_format::record::{GapTally, Op, Record, Role};
use ttrace_format::store::Manifest;

use crate::decoded::{Checked, DecodedCache, Shared};
use crate::prefetch::{lock, TensorAt};
use crate::records::{read_segment, AtOpen, RecordCache, RecordRef, SegmentRecords, StepRecords};
use crate::widen::WholeElements;
pub use crate::widen::{to_f32, to_f32_into, F32Widening};
use crate::CompareError;

/// A tensor's values as `f32` with its stored shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Values {
    /// Stored (row-major) shape.
    pub shape: Vec<u64>,
    /// Elements, row-major; FP8 already multiplied by its scale. Shared with the decoded
    /// tensors kept ([`crate::decoded`]): `Arc::make_mut` before changing them.
    pub data: Shared,
    /// Stored element type.
    pub dtype: DType,
}

/// One opened store: a reader of it. [`RunTrace::reader`] makes another reader of the same
/// store for another thread, sharing its metadata, open segments, decoded tensors and count
/// of bytes read.
pub struct RunTrace {
    /// Where it is.
    pub path: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    store: Arc<Store>,
    /// Records by (rank, step), in seq order, with the offset of each one's frame (its data
    /// is read there without decoding its metadata again, [`Segment::read_at`]); kept within
    /// a budget ([`RunTrace::open_within`]).
    records: Arc<RecordCache>,
    /// Whether any record is a collective.
    has_collectives: bool,
    /// Communicators of more than one rank each (rank, step) calls collectives on, in order
    /// of first use.
    comms_used: Arc<BTreeMap<(u32, u64), Vec<u64>>>,
    /// What each (rank, step) holds that a comparison counts at its end, read when the store
    /// was opened: its records dropped since need not be read again for it.
    facts: Arc<BTreeMap<(u32, u64), SegmentFacts>>,
    /// Open segments; shared with the decoding ahead that reads them on the thread pool and
    /// with the other readers.
    segments: Arc<Mutex<OpenCache<Arc<Segment>>>>,
    /// Tensors decoded ahead of the walk ([`crate::prefetch`]) or read by it, kept for what
    /// reads them again; shared with the decoding ahead and the other readers.
    decoded: Arc<Mutex<DecodedCache>>,
    /// Bytes read by every reader.
    bytes_read: Arc<AtomicU64>,
    /// Buffers the walk decodes tensors with: (stored, decoded bytes).
    scratch: RefCell<(Vec<u8>, Vec<u8>)>,
    /// Which increments decoding ahead forms.
    increments_ahead: Cell<IncrementsAhead>,
    /// Increments formed by the last decoding ahead installed, by record (rank, step, seq),
    /// until the walk takes them ([`RunTrace::take_increment`]).
    increments: RefCell<HashMap<RecordAt, FormedIncrement>>,
    /// Records that could not be read.
    pub unreadable: Vec<String>,
}

/// What a segment holds that a comparison counts at its end ([`RunTrace::record_count`],
/// [`RunTrace::gaps`]).
#[derive(Debug, Default)]
struct SegmentFacts {
    records: u64,
    /// Its gap records, counted by reason (a capture may hold one per op).
    gaps: GapTally,
}

impl RunTrace {
    /// Opens the store at `path` and reads every record's metadata, all of it kept.
    pub fn open(path: &Path) -> Result<RunTrace, CompareError> {
        RunTrace::open_within(path, u64::MAX)
    }

    /// Opens the store at `path` and reads every record's metadata, keeping at most
    /// `metadata` bytes of it (estimated; the earliest steps'): the rest is read again when
    /// wanted ([`crate::records`]).
    pub fn open_within(path: &Path, metadata: u64) -> Result<RunTrace, CompareError> {
        let (store, manifest) = crate::model::store::open(path)?;
        // The segments' frame tables, kept by the store for opening them again, are
        // metadata too: they get an eighth of the share on top of it (a segment opened after
        // its table was dropped is located again).
        store.set_located_budget(located_budget(metadata));
        let keys: Vec<(u32, u64)> = store
            .ranks()
            .into_iter()
            .flat_map(|rank| store.steps(rank).into_iter().map(move |step| (rank, step)))
            .collect();
        // Segments are read on every core, then joined in their order.
        // Earliest steps first, every rank's: what the budget keeps is what the comparison
        // reads first. Read a batch at a time (each batch on every core), so that what is
        // held beyond the budget is one batch's.
        let mut keys = keys;
        keys.sort_by_key(|&(rank, step)| (step, rank));
        let batch = 4 * rayon::current_num_threads().max(1);
        let mut unreadable: BTreeMap<(u32, u64), Vec<String>> = BTreeMap::new();
        let mut comms_used = BTreeMap::new();
        let mut facts = BTreeMap::new();
        let mut has_collectives = false;
        let mut frames = BTreeMap::new();
        let mut kept = Vec::new();
        let mut kept_bytes = 0u64;
        for keys in keys.chunks(batch) {
            let read: Vec<_> = keys
                .par_iter()
                .map(|&key| read_segment(&store, path, key, usize::MAX))
                .collect();
            for (&key, read) in keys.iter().zip(read) {
                unreadable.insert(key, read.unreadable);
                let Some(recs) = read.records else {
                    continue;
                };
                let mut used: Vec<u64> = Vec::new();
                for c in recs.iter().filter_map(|(r, _)| collective(r)) {
                    has_collectives = true;
                    if c.comm_size > 1 && !used.contains(&c.comm) {
                        used.push(c.comm);
                    }
                }
                comms_used.insert(key, used);
                facts.insert(
                    key,
                    SegmentFacts {
                        records: recs.len() as u64,
                        gaps: {
                            let mut tally = GapTally::default();
                            for (r, _) in recs.iter() {
                                if let Op::Gap(g) = &r.op {
                                    tally.add(g);
                                }
                            }
                            tally
                        },
                    },
                );
                let n = recs.len();
                let recs = SegmentRecords::new(recs);
                let open = AtOpen {
                    frames: read.frames,
                    records: n,
                    bytes: recs.bytes(),
                };
                frames.insert(key, open);
                if kept_bytes.saturating_add(recs.bytes()) <= metadata {
                    kept_bytes += recs.bytes();
                    kept.push((key, recs));
                }
            }
        }
        // Said in (rank, step) order.
        let unreadable: Vec<String> = unreadable.into_values().flatten().collect();
        let store = Arc::new(store);
        let records = RecordCache::new(Arc::clone(&store), path, frames, kept, metadata);
        Ok(RunTrace {
            path: path.to_path_buf(),
            manifest,
            store,
            records: Arc::new(records),
            has_collectives,
            comms_used: Arc::new(comms_used),
            facts: Arc::new(facts),
            segments: Arc::new(Mutex::new(OpenCache::default())),
            decoded: Arc::new(Mutex::new(DecodedCache::new(u64::MAX))),
            bytes_read: Arc::new(AtomicU64::new(0)),
            scratch: RefCell::new((Vec::new(), Vec::new())),
            increments_ahead: Cell::new(IncrementsAhead::None),
            increments: RefCell::new(HashMap::new()),
            unreadable,
        })
    }

    /// Another reader of the same store, for another thread: it shares the metadata, the
    /// open segments (and their budget), the decoded tensors kept (and their budget) and the
    /// count of bytes read; its own are the buffers it decodes with and the increments
    /// decoding ahead forms for it (none until [`RunTrace::set_increments_ahead`]).
    pub fn reader(&self) -> RunTrace {
        RunTrace {
            path: self.path.clone(),
            manifest: self.manifest.clone(),
            store: Arc::clone(&self.store),
            records: Arc::clone(&self.records),
            has_collectives: self.has_collectives,
            comms_used: Arc::clone(&self.comms_used),
            facts: Arc::clone(&self.facts),
            segments: Arc::clone(&self.segments),
            decoded: Arc::clone(&self.decoded),
            bytes_read: Arc::clone(&self.bytes_read),
            scratch: RefCell::new((Vec::new(), Vec::new())),
            increments_ahead: Cell::new(IncrementsAhead::None),
            increments: RefCell::new(HashMap::new()),
            unreadable: self.unreadable.clone(),
        }
    }

    /// Ranks present.
    pub fn ranks(&self) -> Vec<u32> {
        let mut r: Vec<u32> = self.records.keys().map(|k| k.0).collect();
        r.dedup();
        r
    }

    /// The world size the run was launched with: the manifest's (ranks report it when they
    /// start), else the ranks present.
    pub fn world_size(&self) -> u32 {
        crate::model::comms::world_size(&self.manifest, &self.ranks())
    }

    /// Ranks of the world with no record in the store (not captured with `--ranks`, or lost).
    pub fn missing_ranks(&self) -> Vec<u32> {
        let present = self.ranks();
        (0..self.world_size())
            .filter(|r| !present.contains(r))
            .collect()
    }

    /// What the store's processes warned about their capture when they exited (the manifest's
    /// `ranks[].warnings`: a step rule that numbered the whole run step 0), prefixed with
    /// `store` (`reference`, `run`, `perturbed`) and the ranks that said it
    /// ([`warnings_by_text`]): steps the comparison lines up may not be the program's.
    pub fn capture_warnings(&self, store: &str) -> Vec<String> {
        let ranks = self
            .manifest
            .ranks
            .iter()
            .map(|r| (r.rank, r.warnings.as_slice()));
        warnings_by_text(store, ranks)
    }

    /// Whether the store holds collectives (captured with the `nccl` family and called).
    pub fn has_collectives(&self) -> bool {
        self.has_collectives
    }

    /// Whether inputs of ops were captured (not `ttrace run --no-inputs`).
    pub fn has_inputs(&self) -> bool {
        self.manifest.config.inputs
    }

    /// Steps present on every rank.
    pub fn steps(&self) -> Vec<u64> {
        let ranks = self.ranks();
        let mut steps: Vec<u64> = self.records.keys().map(|k| k.1).collect();
        steps.sort_unstable();
        steps.dedup();
        steps.retain(|s| ranks.iter().all(|r| self.records.contains((*r, *s))));
        steps
    }

    /// Records of `rank` in `step`, in seq order (read again if they were dropped).
    pub fn records(&self, rank: u32, step: u64) -> StepRecords {
        self.records.get((rank, step))
    }

    /// The (rank, step) of every segment, in that order.
    pub fn segment_keys(&self) -> Vec<(u32, u64)> {
        self.records.keys().collect()
    }

    /// How many records `rank` holds in `step` (that could be read when the store was opened).
    pub fn record_count(&self, rank: u32, step: u64) -> u64 {
        self.facts.get(&(rank, step)).map_or(0, |f| f.records)
    }

    /// The gap records of `rank` in `step` (what was not captured there), counted by reason.
    pub fn gaps(&self, rank: u32, step: u64) -> &GapTally {
        static NONE: GapTally = GapTally {
            by_reason: BTreeMap::new(),
            bytes: 0,
        };
        self.facts.get(&(rank, step)).map_or(&NONE, |f| &f.gaps)
    }

    /// Communicators (of more than one rank) that `rank` calls collectives on in `step`.
    pub fn comms_used(&self, rank: u32, step: u64) -> &[u64] {
        self.comms_used
            .get(&(rank, step))
            .map_or(&[], |v| v.as_slice())
    }

    /// The record `seq` of `rank` in `step` (without its kernel names:
    /// [`RunTrace::kernels_before`]).
    pub fn record(&self, rank: u32, step: u64, seq: u64) -> Option<RecordRef> {
        RecordRef::find(self.records(rank, step), seq)
    }

    /// The names of the kernels launched before the record `seq` of `rank` in `step`, read
    /// from its segment (the records held leave them out).
    pub fn kernels_before(&self, rank: u32, step: u64, seq: u64) -> Vec<String> {
        self.records.kernels_before((rank, step), seq)
    }

    /// Reads the records of every rank's segment of `step` that are not held
    /// ([`crate::records`]) on the decoding pool, in the background: a comparison whose
    /// records do not all fit their budget reads the next step's while it compares this one,
    /// instead of when it gets there (when two steps' records fit the budget).
    pub fn read_ahead(&self, step: u64) {
        if !self.records.two_steps_fit() {
            return;
        }
        let keys: Vec<(u32, u64)> = self
            .ranks()
            .into_iter()
            .map(|rank| (rank, step))
            .filter(|&key| self.records.contains(key) && !self.records.holds(key))
            .collect();
        if keys.is_empty() {
            return;
        }
        let records = Arc::clone(&self.records);
        let job = move || {
            for key in keys {
                records.get(key);
            }
        };
        match decode_pool() {
            Some(pool) => pool.spawn(job),
            None => rayon::spawn(job),
        }
    }

    /// Segments whose records were read again after they were dropped.
    pub fn metadata_reread(&self) -> u64 {
        self.records.reparsed()
    }

    /// Records read when the store was opened that could not be read again since (their
    /// segment changed or was removed): a line per segment, with how many of its records it
    /// left out of the comparison.
    pub fn late_unreadable(&self) -> Vec<(String, u64)> {
        self.records.late_unreadable()
    }

    /// Keeps at most `bytes` of segments open (mapped) at a time, the least recently read
    /// closed first (at least the one being read stays open): memory independent of the
    /// number of steps and ranks.
    pub fn set_mapping_budget(&self, bytes: u64) {
        lock(&self.segments).budget = bytes;
    }

    /// Keeps at most `bytes` of decoded tensors for what reads them again
    /// ([`crate::decoded`]), the least recently read dropped first.
    pub fn set_decoded_budget(&self, bytes: u64) {
        lock(&self.decoded).set_budget(bytes);
    }

    /// Drops the decoded tensors kept.
    pub fn release_decoded(&self) {
        lock(&self.decoded).clear();
    }

    /// Takes the decoded tensors kept and the open segments out of this store (readers
    /// included), for the caller to drop where it likes: what reads the store later decodes
    /// and opens again what it needs.
    pub fn shed(&self) -> Shed {
        let decoded = {
            let mut kept = lock(&self.decoded);
            // What is decoded after stays within the same budget.
            let empty = DecodedCache::new(kept.budget());
            std::mem::replace(&mut *kept, empty)
        };
        let segments = lock(&self.segments).take_all();
        Shed {
            _decoded: decoded,
            _segments: segments,
        }
    }

    /// The most bytes of segments that were open at once.
    pub fn peak_mapped(&self) -> u64 {
        lock(&self.segments).peak
    }

    /// Stored bytes decoded so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// Decodes `wants` in parallel ([`crate::prefetch::decode`]) for [`RunTrace::values`] to
    /// take ([`RunTrace::decode_ahead`], then [`RunTrace::install`]).
    pub fn prefetch(&self, wants: &[TensorAt]) {
        self.install(self.decode_ahead(wants));
    }

    /// Starts decoding `wants` (those not kept decoded already) on the thread pool while the
    /// caller goes on: their segments are opened here (within the mapping budget; a segment
    /// closed meanwhile stays mapped until its tensors are decoded), the values are kept by
    /// [`RunTrace::install`].
    pub fn decode_ahead(&self, wants: &[TensorAt]) -> Decoding {
        let (tx, rx) = mpsc::channel();
        let increments = self.increments_to_form(wants);
        let wants: Vec<TensorAt> = {
            let kept = lock(&self.decoded);
            wants
                .iter()
                .filter(|w| !kept.contains(w))
                .copied()
                .collect()
        };
        if wants.is_empty() {
            return Decoding { rx };
        }
        let mut segs = lock(&self.segments);
        let mut jobs: Vec<SegmentJob> = Vec::new();
        for (key, recs) in crate::prefetch::by_segment(&wants) {
            let size = self
                .store
                .segment_info(key.0, key.1)
                .map_or(0, |info| info.bytes);
            let opened = segs.get_or_open(key, size, |over| self.open_segment(key, over));
            // A segment that does not open is read (and its error reported) by the walk.
            if let Ok(seg) = opened {
                jobs.push((key, Arc::clone(seg), recs));
            }
        }
        drop(segs);
        let kept = Arc::clone(&self.decoded);
        let records = Arc::clone(&self.records);
        let job = move || {
            let open: Vec<crate::prefetch::SegmentWants> = jobs
                .iter()
                .map(|(key, seg, recs)| (*key, &**seg, recs.as_slice()))
                .collect();
            // A decoding that panics leaves its tensors to the walk (which reports them).
            let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let known = |key: (u32, u64), seq: u64| RecordRef::find(records.get(key), seq);
                let values = crate::prefetch::decode(&open, &kept, &known);
                let increments = form_increments(&increments, &values, &kept);
                DecodedAhead { values, increments }
            }));
            if let Ok(ahead) = decoded {
                let _ = tx.send(ahead);
            }
        };
        // The walk runs on a thread of the global pool: it waits for the decoding pool.
        let pool = decode_pool();
        let within = pool.map_or(rayon::current_thread_index(), |p| p.current_thread_index());
        if within.is_some() {
            // Called from a thread of the pool the job would go to: waiting there for it
            // could wait for itself, so it decodes now.
            job();
        } else {
            match pool {
                Some(pool) => pool.spawn(job),
                None => rayon::spawn(job),
            }
        }
        Decoding { rx }
    }

    /// Waits for `decoding` and keeps its values for [`RunTrace::values`] to take.
    pub fn install(&self, decoding: Decoding) {
        // What the window before formed and the walk did not take goes with it.
        let mut increments = self.increments.borrow_mut();
        increments.clear();
        if let Ok(ahead) = decoding.rx.recv() {
            let mut kept = lock(&self.decoded);
            for (at, v, checked) in ahead.values {
                kept.insert(at, v, checked);
            }
            increments.extend(ahead.increments);
        }
    }

    /// Makes decoding ahead form the increments `D - beta*C` of the accumulating GEMMs whose
    /// D it decodes (with `WithCancellation`, the digits each cancelled too), for
    /// [`crate::comparison::operand`] to take: off the walk, on the thread pool.
    pub fn set_increments_ahead(&self, form: IncrementsAhead) {
        self.increments_ahead.set(form);
        if form == IncrementsAhead::None {
            self.increments.borrow_mut().clear();
        }
    }

    /// The increment of `rec` formed while decoding ahead, when it was formed from the values
    /// `d` of its D and `c` of its C (the very buffers: what the walk would form from them).
    pub(crate) fn take_increment(
        &self,
        rec: &Record,
        d: &Shared,
        c: &Shared,
    ) -> Option<FormedIncrement> {
        let f = self
            .increments
            .borrow_mut()
            .remove(&(rec.rank, rec.step, rec.seq))?;
        (Arc::ptr_eq(&f.d, d) && Arc::ptr_eq(&f.c, c)).then_some(f)
    }

    /// The accumulating GEMMs among the records of `wants` whose D is wanted, and the
    /// tensors their increment is formed from (as [`RunTrace::values`] finds them).
    fn increments_to_form(&self, wants: &[TensorAt]) -> Vec<IncrementJob> {
        let form = self.increments_ahead.get();
        if form == IncrementsAhead::None {
            return Vec::new();
        }
        let mut jobs: Vec<IncrementJob> = Vec::new();
        let mut seen: std::collections::HashSet<RecordAt> = std::collections::HashSet::new();
        for &(rank, step, seq, index) in wants {
            let Some(rec) = self.record(rank, step, seq) else {
                continue;
            };
            let rec = &*rec;
            let Some(g) = gemm(rec).filter(|g| crate::comparison::accumulates(g)) else {
                continue;
            };
            let at_role = |role: Role| {
                let i = rec.tensors.iter().position(|t| t.role == role)?;
                let t = &rec.tensors[i];
                (t.captured && is_float(t.dtype))
                    .then_some(((rank, step, seq, i), (t.crc32, t.nbytes, t.dtype)))
            };
            let (Some(d), Some(c)) = (at_role(Role::D), at_role(Role::CIn)) else {
                continue;
            };
            if d.0 .3 != index || !seen.insert((rank, step, seq)) {
                continue;
            }
            jobs.push(IncrementJob {
                d,
                c,
                beta: g.beta.unwrap_or(0.0) as f32,
                cancellation: form == IncrementsAhead::WithCancellation,
            });
        }
        jobs
    }

    /// Opens the segment of (rank, step) for the cache of open segments; `over_budget`: it is
    /// larger than the cache's whole budget ([`OpenCache::get_or_open`]).
    fn open_segment(
        &self,
        (rank, step): (u32, u64),
        over_budget: bool,
    ) -> Result<Arc<Segment>, CompareError> {
        self.store
            .open_segment(rank, step)
            .map(|mut seg| {
                seg.set_releasing(over_budget);
                Arc::new(seg)
            })
            .map_err(|e| CompareError::Store {
                path: self.path.display().to_string(),
                source: e,
            })
    }

    /// The bytes of tensor `index` of the record `(rank, step, seq)`; `None` when it was not
    /// captured.
    pub fn bytes(
        &self,
        rank: u32,
        step: u64,
        seq: u64,
        index: usize,
    ) -> Result<Option<Vec<u8>>, CompareError> {
        let mut out = Vec::new();
        let captured =
            self.with_blocks((rank, step, seq, index), &mut |b| out.extend_from_slice(b))?;
        Ok(captured.then_some(out))
    }

    /// Hands the bytes of tensor `at` to `sink` a block at a time as they are decoded, with
    /// buffers reused from one tensor to the next (no allocation per tensor); `false` when it
    /// was not captured. On an error the sink may have had some of the bytes.
    fn with_blocks(
        &self,
        (rank, step, seq, index): TensorAt,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<bool, CompareError> {
        let size = self
            .store
            .segment_info(rank, step)
            .map_or(0, |info| info.bytes);
        // Held while the tensor is decoded, not the cache: other readers go on meanwhile.
        let seg = Arc::clone(
            lock(&self.segments).get_or_open((rank, step), size, |over| {
                self.open_segment((rank, step), over)
            })?,
        );
        let read = self
            .record(rank, step, seq)
            .and_then(|rec| seg.read_at(rec.frame(), &rec))
            .or_else(|| seg.read_seq(seq));
        let view = match read {
            Some(Ok(v)) => v,
            Some(Err(issue)) => return Err(CompareError::Record(issue.to_string())),
            None => {
                return Err(CompareError::Record(format!(
                    "{}: rank {rank} step {step}: no record with seq {seq}",
                    self.path.display()
                )))
            }
        };
        if !view.is_captured(index) {
            return Ok(false);
        }
        let mut buffers = self.scratch.borrow_mut();
        let (scratch, whole) = &mut *buffers;
        let mut handed = 0u64;
        view.tensor_blocks(index, scratch, whole, &mut |b: &[u8]| {
            handed += b.len() as u64;
            sink(b);
        })
        .map_err(|e| CompareError::Store {
            path: self.path.display().to_string(),
            source: e,
        })?;
        // Read: a large frame of a segment over the budget leaves the mapping.
        view.release();
        self.bytes_read.fetch_add(handed, Ordering::Relaxed);
        Ok(true)
    }

    /// Whether the tensor with `role` in `rec` holds one value throughout, element bytes
    /// compared as stored (`true` when it is absent, not captured or not floats, as for a
    /// tensor [`Self::values`] cannot read). Its bytes are read block by block and not kept;
    /// values already decoded are used instead. Block-scaled operands are judged on their
    /// dequantized values.
    pub fn holds_one_value(&self, rec: &Record, role: Role) -> Result<bool, CompareError> {
        let Some(index) = rec.tensors.iter().position(|t| t.role == role) else {
            return Ok(true);
        };
        let t = &rec.tensors[index];
        let block_scaled = rec
            .tensors
            .iter()
            .any(|s| matches!(s.role, Role::BlockScaleA | Role::BlockScaleB));
        let at = (rec.rank, rec.step, rec.seq, index);
        let kept = lock(&self.decoded).get(&at);
        // Sub-byte elements (FP4) are judged on values: equal bytes need not be equal elements.
        if block_scaled || kept.is_some() || t.dtype.size() == 0 {
            return Ok(match self.values(rec, role)? {
                Some(v) => v.data.iter().all(|x| x.to_bits() == v.data[0].to_bits()),
                None => true,
            });
        }
        if !is_float(t.dtype) {
            return Ok(true);
        }
        let size = t.dtype.size();
        let mut elements = WholeElements::new(size);
        let mut first: Option<Vec<u8>> = None;
        let mut one = true;
        let captured = self.with_blocks(at, &mut |b: &[u8]| {
            if one {
                elements.push(b, &mut |run| {
                    let first = first.get_or_insert_with(|| run[..size].to_vec());
                    one = one && run.chunks_exact(size).all(|e| e == first.as_slice());
                });
            }
        })?;
        Ok(!captured || one)
    }

    /// The values of the tensor with `role` in `rec`, FP8 operands scaled by their captured
    /// scale (`ScaleA` for `A`, `ScaleB` for `B`, `ScaleD`'s inverse is not applied: D is
    /// compared as stored), MXFP8 operands by their block scales (`BlockScaleA/B`). `None`
    /// when absent, not captured, or block-scaled in a layout not dequantized.
    pub fn values(&self, rec: &Record, role: Role) -> Result<Option<Values>, CompareError> {
        let Some(index) = rec.tensors.iter().position(|t| t.role == role) else {
            return Ok(None);
        };
        let t = &rec.tensors[index];
        if !is_float(t.dtype) {
            return Ok(None);
        }
        let at = (rec.rank, rec.step, rec.seq, index);
        let checked: Checked = (t.crc32, t.nbytes, t.dtype);
        let kept = lock(&self.decoded).get(&at);
        let mut data = match kept {
            Some((data, c)) if c == checked => {
                self.bytes_read.fetch_add(t.nbytes, Ordering::Relaxed);
                data
            }
            _ => {
                let n = usize::try_from(t.elements()).unwrap_or(0);
                let mut data = lock(&self.decoded).buffer(n);
                let mut wide = F32Widening::new(t.dtype, &mut data);
                if !self.with_blocks(at, &mut |b| wide.push(b))? {
                    return Ok(None);
                }
                wide.finish()?;
                let data = Arc::new(data);
                lock(&self.decoded).insert(at, Arc::clone(&data), checked);
                data
            }
        };
        // MXFP8 / NVFP4: dequantized by their block scales, or not compared at all.
        let block_role = match role {
            Role::A => Some(Role::BlockScaleA),
            Role::B => Some(Role::BlockScaleB),
            _ => None,
        };
        if let Some(si) = rec.tensors.iter().position(|s| Some(s.role) == block_role) {
            let scales = self.bytes(rec.rank, rec.step, rec.seq, si)?;
            let done = match (&rec.op, scales) {
                (ttrace_format::record::Op::Gemm(g), Some(sb)) => {
                    let sd = rec.tensors[si].dtype;
                    ttrace_format::blockscale::dequantize_operand(
                        Arc::make_mut(&mut data).as_mut_slice(),
                        g,
                        role == Role::A,
                        &sb,
                        sd,
                    )
                }
                _ => false,
            };
            return Ok(done.then(|| Values {
                shape: t.shape.clone(),
                data,
                dtype: t.dtype,
            }));
        }
        if matches!(t.dtype, DType::F8_E4M3 | DType::F8_E5M2) {
            let scale_role = match role {
                Role::A => Some(Role::ScaleA),
                Role::B => Some(Role::ScaleB),
                _ => None,
            };
            if let Some(sr) = scale_role {
                if let Some(s) = self.scalar(rec, sr)? {
                    for v in Arc::make_mut(&mut data).iter_mut() {
                        *v *= s;
                    }
                }
            }
        }
        Ok(Some(Values {
            shape: t.shape.clone(),
            data,
            dtype: t.dtype,
        }))
    }

    /// A captured one-element float tensor (a scale), as `f32`.
    pub fn scalar(&self, rec: &Record, role: Role) -> Result<Option<f32>, CompareError> {
        let Some(index) = rec.tensors.iter().position(|t| t.role == role) else {
            return Ok(None);
        };
        let t = &rec.tensors[index];
        let Some(bytes) = self.bytes(rec.rank, rec.step, rec.seq, index)? else {
            return Ok(None);
        };
        Ok(to_f32(t.dtype, &bytes)?.first().copied())
    }

    /// The communicator members (global ranks by communicator rank) of `comm`.
    pub fn comm_members(&self, comm: u64) -> Option<Vec<u32>> {
        crate::model::comms::members(&self.manifest, comm)
    }
}

/// The thread pool that decodes ahead of the walk, apart from the global pool that the walk's
/// own parallel loops (error sums, placement searches) run on: rayon's workers take the
/// tasks they can steal from each other before those injected from outside the pool, so on
/// one pool the walk's loops would wait for the whole window being decoded, and the walk and
/// the decoding would not overlap. As many threads as the global pool (`RAYON_NUM_THREADS`);
/// `None` when it cannot be made (the global pool decodes then).
fn decode_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| side_pool("ttrace-decode", "decoding on the global one"))
        .as_ref()
}

/// A pool of its own beside rayon's global one, as many threads (`RAYON_NUM_THREADS`), its
/// threads named `name-N`; `None` (logged with what happens `instead`) when it cannot be made.
pub(crate) fn side_pool(name: &'static str, instead: &str) -> Option<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(rayon::current_num_threads())
        .thread_name(move |i| format!("{name}-{i}"))
        .build()
        .map_err(|e| tracing::debug!("no {name} pool ({e}): {instead}"))
        .ok()
}

/// A record: (rank, step, seq).
type RecordAt = (u32, u64, u64);

/// Which increments `D - beta*C` of accumulating GEMMs decoding ahead forms
/// ([`RunTrace::set_increments_ahead`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncrementsAhead {
    /// None: the walk forms what it compares.
    #[default]
    None,
    /// The increments.
    Plain,
    /// The increments and the digits each cancelled (what a reference's tolerance needs).
    WithCancellation,
}

/// An increment `D - beta*C` formed while decoding ahead, and the values it was formed from.
pub(crate) struct FormedIncrement {
    d: Shared,
    c: Shared,
    /// `D - beta*C`.
    pub(crate) values: Shared,
    /// The digits it cancelled, when asked for ([`crate::comparison::increment`]).
    pub(crate) cancelled: Option<f64>,
}

/// An increment to form: where D and C are and what identifies their bytes.
struct IncrementJob {
    d: (TensorAt, Checked),
    c: (TensorAt, Checked),
    beta: f32,
    cancellation: bool,
}

/// What decoding ahead gives: the values decoded, the increments formed.
struct DecodedAhead {
    values: Vec<(TensorAt, Shared, Checked)>,
    increments: Vec<(RecordAt, FormedIncrement)>,
}

/// Forms the increments of `jobs` whose D and C were decoded in `values` (or are kept
/// decoded), in parallel.
fn form_increments(
    jobs: &[IncrementJob],
    values: &[(TensorAt, Shared, Checked)],
    kept: &Mutex<DecodedCache>,
) -> Vec<(RecordAt, FormedIncrement)> {
    if jobs.is_empty() {
        return Vec::new();
    }
    let index: HashMap<TensorAt, usize> =
        values.iter().enumerate().map(|(i, v)| (v.0, i)).collect();
    let find = |(at, checked): (TensorAt, Checked)| -> Option<Shared> {
        let (data, got) = match index.get(&at) {
            Some(&i) => (Arc::clone(&values[i].1), values[i].2),
            None => lock(kept).peek(&at)?,
        };
        (got == checked).then_some(data)
    };
    let inputs: Vec<(RecordAt, Shared, Shared, f32, bool)> = jobs
        .iter()
        .filter_map(|j| {
            let (d, c) = (find(j.d)?, find(j.c)?);
            let (rank, step, seq, _) = j.d.0;
            (d.len() == c.len()).then_some(((rank, step, seq), d, c, j.beta, j.cancellation))
        })
        .collect();
    inputs
        .into_par_iter()
        .map(|(at, d, c, beta, cancellation)| {
            let (values, cancelled) = crate::comparison::increment(beta, &d, &c, cancellation);
            let values = Arc::new(values);
            (
                at,
                FormedIncrement {
                    d,
                    c,
                    values,
                    cancelled,
                },
            )
        })
        .collect()
}

/// What [`RunTrace::shed`] took out of a store: dropping it frees the decoded tensors and
/// unmaps the segments (those no reader holds any more).
pub struct Shed {
    _decoded: DecodedCache,
    _segments: Vec<Arc<Segment>>,
}

/// An open segment and the tensors of its records to decode ahead.
type SegmentJob = ((u32, u64), Arc<Segment>, Vec<crate::prefetch::RecordWants>);

/// Tensors being decoded on the thread pool ([`RunTrace::decode_ahead`]).
pub struct Decoding {
    rx: mpsc::Receiver<DecodedAhead>,
}

/// Open segments (by rank and step), closed least recently read first once their bytes pass
/// a budget.
struct OpenCache<T> {
    /// Each with its bytes, least recently read first.
    open: lru::LruCache<(u32, u64), (T, u64)>,
    /// Bytes of the open segments.
    mapped: u64,
    /// The most that was open at once.
    peak: u64,
    budget: u64,
}

impl<T> Default for OpenCache<T> {
    fn default() -> OpenCache<T> {
        OpenCache {
            open: lru::LruCache::unbounded(),
            mapped: 0,
            peak: 0,
            budget: u64::MAX,
        }
    }
}

impl<T> OpenCache<T> {
    /// The segment `key` (of `size` bytes), opened with `open` when it is not open, after
    /// closing the least recently read ones that would pass the budget. `open` is told
    /// whether the segment alone is larger than the budget: closing segments cannot bound
    /// what it maps, so it should drop its large frames' pages as they are read
    /// ([`Segment::set_releasing`]), or reading it through would map it whole.
    fn get_or_open(
        &mut self,
        key: (u32, u64),
        size: u64,
        open: impl FnOnce(bool) -> Result<T, CompareError>,
    ) -> Result<&T, CompareError> {
        if !self.open.contains(&key) {
            while self.mapped.saturating_add(size) > self.budget {
                let Some((_, (_, bytes))) = self.open.pop_lru() else {
                    break;
                };
                self.mapped -= bytes;
            }
            let seg = open(size > self.budget)?;
            self.open.put(key, (seg, size));
            self.mapped += size;
            self.peak = self.peak.max(self.mapped);
        }
        match self.open.get(&key) {
            Some((seg, _)) => Ok(seg),
            None => Err(CompareError::Record(format!(
                "segment of rank {} step {} vanished from the cache",
                key.0, key.1
            ))),
        }
    }

    /// Closes every segment (their mappings go with the values handed back).
    fn take_all(&mut self) -> Vec<T> {
        self.mapped = 0;
        std::iter::from_fn(|| self.open.pop_lru().map(|(_, (seg, _))| seg)).collect()
    }
}

/// Floating-point dtypes (the ones compared numerically).
pub fn is_float(d: DType) -> bool {
    matches!(
        d,
        DType::F64 | DType::F32 | DType::F16 | DType::BF16 | DType::F8_E4M3 | DType::F8_E5M2
    )
}

/// The GEMM parameters of a record, if it is one.
pub fn gemm(rec: &Record) -> Option<&ttrace_format::record::GemmOp> {
    match &rec.op {
        Op::Gemm(g) => Some(g),
        _ => None,
    }
}

/// The collective parameters of a record, if it is one.
pub fn collective(rec: &Record) -> Option<&ttrace_format::record::CollectiveOp> {
    match &rec.op {
        Op::Collective(c) => Some(c),
        _ => None,
    }
}

/// Warnings said by a job's ranks at most this many lines per store in a report (the rest
/// counted; `ttrace ls` lists every one).
const CAPTURE_WARNING_LINES: usize = 8;

/// One line per distinct warning of `ranks` (rank, its warnings), in the order they first
/// come, naming every rank that said it (`rank 3`, `ranks 0-7`): a thousand ranks that
/// numbered their run alike are one line, not a thousand. At most
/// [`CAPTURE_WARNING_LINES`], then how many more.
fn warnings_by_text<'a>(
    store: &str,
    ranks: impl Iterator<Item = (u32, &'a [String])>,
) -> Vec<String> {
    let mut texts: Vec<(&str, std::collections::BTreeSet<u64>)> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for (rank, warnings) in ranks {
        for w in warnings {
            let i = *at.entry(w).or_insert_with(|| {
                texts.push((w, Default::default()));
                texts.len() - 1
            });
            texts[i].1.insert(u64::from(rank));
        }
    }
    let more = texts.len().saturating_sub(CAPTURE_WARNING_LINES);
    let mut lines: Vec<String> = texts
        .into_iter()
        .take(CAPTURE_WARNING_LINES)
        .map(|(w, ranks)| {
            let who = match ranks.len() {
                1 => "rank",
                _ => "ranks",
            };
            let ranks = ttrace_format::config::RangeSet::of_values(ranks);
            format!("{store} {who} {ranks} warned when captured: {w}")
        })
        .collect();
    if more > 0 {
        lines.push(format!(
            "{store}: {more} more warnings its ranks gave when captured (`ttrace ls` lists \
             every one)"
        ));
    }
    lines
}

/// The share of a store's metadata budget its located frame tables are kept within
/// ([`Store::set_located_budget`]): an eighth (about 33 bytes a record).
fn located_budget(metadata: u64) -> u64 {
    metadata / 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_warnings_are_one_line_per_text_naming_its_ranks() {
        let (same, other) = (vec!["step 0 only".to_string()], vec!["no mark".to_string()]);
        let ranks = [(0, &same), (1, &same), (2, &other), (3, &same), (5, &same)];
        assert_eq!(
            warnings_by_text("run", ranks.iter().map(|(r, w)| (*r, w.as_slice()))),
            [
                "run ranks 0-1,3,5 warned when captured: step 0 only",
                "run rank 2 warned when captured: no mark"
            ]
        );
        // Each rank its own text (counts of the names it saw): bounded, the rest counted.
        let many: Vec<Vec<String>> = (0..20).map(|r| vec![format!("saw `x` ({r})")]).collect();
        let lines = warnings_by_text(
            "run",
            many.iter()
                .enumerate()
                .map(|(r, w)| (r as u32, w.as_slice())),
        );
        assert_eq!(lines.len(), CAPTURE_WARNING_LINES + 1);
        assert!(
            lines[CAPTURE_WARNING_LINES].starts_with("run: 12 more"),
            "{lines:?}"
        );
    }

    /// Constant tensors are told by their stored bytes, block by block, whatever block the
    /// odd element lies in; values already decoded give the same answer; what cannot be read
    /// as floats (or was not captured) counts as constant, as before.
    #[test]
    fn a_tensor_holds_one_value_only_when_every_stored_element_is_the_same() {
        use ttrace_format::store::{Blob, SegmentWriter};
        let dir = std::env::temp_dir().join(format!("ttrace-one-value-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        crate::model::comms::tests::manifest(&[])
            .write_as(&dir, false)
            .expect("manifest");
        let n = 20_000usize; // 40 000 bytes: three 16 KiB blocks
        let bf16 = |odd: Option<usize>| -> Vec<u8> {
            (0..n)
                .flat_map(|i| {
                    let v = if Some(i) == odd { 2.5f32 } else { 0.75 };
                    half::bf16::from_f32(v).to_le_bytes()
                })
                .collect()
        };
        let tensors = [
            (bf16(None), DType::BF16, true),
            (bf16(Some(8192)), DType::BF16, true), // first element of the second block
            (bf16(Some(n - 1)), DType::BF16, true),
            (bf16(Some(0)), DType::BF16, true),
            (bf16(Some(5)), DType::I32, true),
            (bf16(Some(5)), DType::BF16, false),
        ];
        let mut seg = SegmentWriter::create(&dir, 0, 0).expect("create");
        for (seq, (data, dtype, captured)) in tensors.iter().enumerate() {
            let mut rec = Record::d2h_copy(0, 0, seq as u64, data);
            let t = &mut rec.tensors[0];
            t.dtype = *dtype;
            t.shape = vec![(data.len() / dtype.size()) as u64];
            t.captured = *captured;
            let blobs = if *captured {
                vec![Blob::encode(data, dtype.size(), 3, &mut Vec::new()).expect("encode")]
            } else {
                Vec::new()
            };
            seg.append(&rec, &blobs).expect("append");
        }
        seg.finish().expect("finish");
        let run = RunTrace::open(&dir).expect("open");
        let one = |seq: u64| {
            let rec = run.record(0, 0, seq).expect("record");
            run.holds_one_value(&rec, Role::Src).expect("reads")
        };
        let got: Vec<bool> = (0..6).map(one).collect();
        assert_eq!(got, [true, false, false, false, true, true]);
        // Decoded values kept from an earlier read say the same.
        for seq in 0..4 {
            let rec = run.record(0, 0, seq).expect("record");
            assert!(run.values(&rec, Role::Src).expect("values").is_some());
            assert_eq!(one(seq), got[seq as usize], "seq {seq} from decoded values");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A store of two ranks and six steps, five 64-byte copies a segment, in a new
    /// directory named after `name`.
    fn two_ranks_six_steps(name: &str) -> std::path::PathBuf {
        use ttrace_format::store::{Blob, SegmentWriter};
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        crate::model::comms::tests::manifest(&[])
            .write_as(&dir, false)
            .expect("manifest");
        for rank in 0..2u32 {
            for step in 0..6u64 {
                let mut seg = SegmentWriter::create(&dir, rank, step).expect("create");
                for seq in 0..5u64 {
                    let data: Vec<u8> = (0..64).map(|i| (i as u64 + seq + step) as u8).collect();
                    let rec = Record::d2h_copy(rank, step, seq, &data);
                    let blob = Blob::encode(&data, 1, 3, &mut Vec::new()).expect("encode");
                    seg.append(&rec, &[blob]).expect("append");
                }
                seg.finish().expect("finish");
            }
        }
        dir
    }

    /// Records dropped from the budget whose segment is gone when they are read again are not
    /// lost silently: the segment reads as empty, a line says how many records were left
    /// out, and the store's capture losses count it (a match is then never clean).
    #[test]
    fn records_that_cannot_be_read_again_are_said_and_counted() {
        let dir = two_ranks_six_steps("ttrace-meta-gone");
        let whole = RunTrace::open(&dir).expect("open");
        let one_segment = whole.records(0, 0).bytes();
        let bounded = RunTrace::open_within(&dir, 2 * one_segment).expect("open within");
        // Read again unchanged: nothing to say.
        assert_eq!(bounded.records(0, 4).len(), 5);
        assert!(bounded.late_unreadable().is_empty());
        for ext in ["seg", "idx"] {
            let _ = std::fs::remove_file(dir.join(format!("rank00001/step000005.{ext}")));
        }
        assert!(bounded.records(1, 5).is_empty(), "the segment is gone");
        let late = bounded.late_unreadable();
        assert_eq!(late.len(), 1, "{late:?}");
        assert!(
            late[0]
                .0
                .contains("rank 1 step 5: 5 of its 5 records no longer read"),
            "{late:?}"
        );
        assert_eq!(late[0].1, 5);
        // Counted as the records it left out, not as the one line that says so.
        let lost = crate::losses::CaptureLosses::of("run", &bounded, &[5]);
        assert_eq!(lost.unreadable, 5);
        assert!(!lost.is_empty());
        // The rank whose segment is still there reads as before.
        assert_eq!(&bounded.records(0, 5)[..], &whole.records(0, 5)[..]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Metadata over its budget is dropped, least recently read first, and read again the
    /// same: every (rank, step) gives the records (and frames) an unbounded opening gives,
    /// while what is held stays near the budget.
    #[test]
    fn records_over_the_metadata_budget_are_read_again_the_same() {
        let dir = two_ranks_six_steps("ttrace-meta-budget");
        let whole = RunTrace::open(&dir).expect("open");
        let one_segment = whole.records(0, 0).bytes();
        // Room for two segments' records of twelve.
        let bounded = RunTrace::open_within(&dir, 2 * one_segment).expect("open within");
        assert!(bounded.records.held_bytes() <= 2 * one_segment);
        for _pass in 0..2 {
            for (rank, step) in whole.segment_keys() {
                let (a, b) = (whole.records(rank, step), bounded.records(rank, step));
                assert_eq!(&a[..], &b[..], "rank {rank} step {step}");
                for seq in 0..5 {
                    let (x, y) = (
                        whole.record(rank, step, seq).expect("record"),
                        bounded.record(rank, step, seq).expect("record"),
                    );
                    assert_eq!((x.frame(), &*x), (y.frame(), &*y));
                }
                assert!(bounded.records.held_bytes() <= 2 * one_segment);
            }
        }
        // Ten segments were dropped at open; each pass reads every one again.
        assert_eq!(whole.metadata_reread(), 0);
        assert!(
            bounded.metadata_reread() >= 20,
            "{}",
            bounded.metadata_reread()
        );
        // The data is read through the records read again.
        let bytes = bounded.bytes(1, 5, 4, 0).expect("reads").expect("captured");
        assert_eq!(bytes, (0..64).map(|i| (i + 9) as u8).collect::<Vec<u8>>());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn increments_are_formed_ahead_only_from_the_values_their_record_names() {
        let bf16 = |crc: u32| (crc, 8, DType::BF16);
        let (d, c): (Shared, Shared) = (
            Arc::new(vec![3.0, 5.0, 7.0, 9.0]),
            Arc::new(vec![1.0, 1.0, 2.0, 2.0]),
        );
        let job = |seq: u64, c_crc: u32| IncrementJob {
            d: ((0, 1, seq, 0), bf16(1)),
            c: ((0, 1, seq, 1), bf16(c_crc)),
            beta: 2.0,
            cancellation: seq == 5,
        };
        let values = vec![
            ((0, 1, 5, 0), Arc::clone(&d), bf16(1)),
            ((0, 1, 5, 1), Arc::clone(&c), bf16(2)),
            ((0, 1, 6, 0), Arc::clone(&d), bf16(1)),
            ((0, 1, 6, 1), Arc::clone(&c), bf16(2)),
        ];
        // C of seq 7 is kept decoded from an earlier window; seq 6's record names other
        // bytes for its C than those decoded (another CRC-32): not formed.
        let kept = Mutex::new(DecodedCache::new(u64::MAX));
        lock(&kept).insert((0, 1, 7, 1), Arc::clone(&c), bf16(2));
        let mut jobs = vec![job(5, 2), job(6, 3), job(7, 2)];
        jobs[2].d = ((0, 1, 5, 0), bf16(1));
        let formed = form_increments(&jobs, &values, &kept);
        let at: Vec<RecordAt> = formed.iter().map(|f| f.0).collect();
        assert_eq!(at, vec![(0, 1, 5), (0, 1, 5)]);
        let f = &formed[0].1;
        assert_eq!(*f.values, vec![1.0, 3.0, 3.0, 5.0], "D - beta*C");
        let (_, want) = crate::comparison::increment(2.0, &d, &c, true);
        assert_eq!(f.cancelled, want, "what the walk would find");
        assert!(
            Arc::ptr_eq(&f.d, &d) && Arc::ptr_eq(&f.c, &c),
            "formed from those values"
        );
        assert_eq!(formed[1].1.cancelled, None, "not asked for");
    }

    #[test]
    fn open_segments_stay_within_their_budget_least_recently_read_closed_first() {
        let mut cache: OpenCache<u64> = OpenCache {
            budget: 250,
            ..OpenCache::default()
        };
        let mut opened = Vec::new();
        let mut get = |cache: &mut OpenCache<u64>, step: u64| {
            *cache
                .get_or_open((0, step), 100, |over| {
                    assert!(!over, "100 bytes fit a budget of 250");
                    opened.push(step);
                    Ok(step)
                })
                .expect("opens")
        };
        assert_eq!(get(&mut cache, 0), 0);
        assert_eq!(get(&mut cache, 1), 1);
        assert_eq!(get(&mut cache, 0), 0); // step 1 is now the least recently read
        assert_eq!(get(&mut cache, 2), 2); // closes step 1
        assert_eq!(get(&mut cache, 0), 0);
        assert_eq!(get(&mut cache, 1), 1); // reopened, closes step 2
        assert_eq!(opened, vec![0, 1, 2, 1]);
        assert!(cache.peak <= 250 && cache.mapped <= 250, "{}", cache.peak);
        // A segment larger than the budget still opens, alone, told that it is over the
        // budget (it releases its pages as it is read).
        let mut small: OpenCache<u64> = OpenCache {
            budget: 50,
            ..OpenCache::default()
        };
        for step in 0..3 {
            small
                .get_or_open((1, step), 100, |over| {
                    assert!(over, "100 bytes are over a budget of 50");
                    Ok(step)
                })
                .expect("opens");
            assert_eq!(small.open.len(), 1);
        }
    }
}
