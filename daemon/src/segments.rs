//! The open segments of a store, one per (rank, step), shared by the clients that write them.
//!
//! Usually one process writes a rank, and a segment is finished (fsync + index) when that
//! process moves on to the next step. Two processes can carry the same rank (a launcher and
//! its worker both tracing, processes that learn their rank late), so a segment is held by
//! every client writing it and finished when the last one lets go. A record for a segment that
//! was already finished (a slow process of the same rank) reopens it: the old frames are
//! copied into a staged segment under `STORE/.reopen/N/`, the new ones appended, and the
//! staged files renamed over the old ones when it is finished again — the old segment stays
//! readable until then.
//!
//! Finishing (fsync, index) runs on a background thread, so a rank's next step is not held
//! up by the previous one's fsync; a segment being finished cannot be reopened until it is.
//!
//! **Losses.** A record is stored only once it is in the file where readers look for it. The
//! first write, flush or fsync error of a segment *breaks* it: later records for it are not
//! written, and when it is finished the daemon counts the intact frames actually in the file
//! (a scan; only ever done for a broken segment) — every record given to the segment and not
//! among them is lost. The same holds for a segment whose file is no longer at its path (the
//! store was removed during the run), and records for a segment that could not be created are
//! lost one by one. [`Losses`] sums them by cause for the manifest and the summary, and logs
//! each cause once, not once per record.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Sender};
use parking_lot::{Condvar, Mutex};
use tracing::{debug, error, warn};
use ttrace_format::reader::Segment;
use ttrace_format::record::Record;
use ttrace_format::store::{index_path, rank_dir, segment_path, Blob, Loss, SegmentWriter};
use ttrace_format::FormatError;

use crate::dedup::{Digest, Seen};
use crate::store_dir::StoreDir;

type Key = (u32, u64);

// One per segment, behind its own lock: boxing the open writer would buy nothing.
#[allow(clippy::large_enum_variant)]
enum State {
    /// Never opened by this daemon.
    Absent,
    Open {
        writer: SegmentWriter,
        holders: usize,
        /// Where a reopened segment is staged until it is finished.
        staged: Option<PathBuf>,
        /// Records given to this writer (written or not): what the file should hold.
        given: u64,
        /// The first error that broke the writer (see the module documentation).
        broken: Option<String>,
        /// The blobs written into it by this writer, for dedup (a reopened segment starts
        /// afresh: its copied frames are not referenced).
        seen: Box<Seen>,
    },
    /// Handed to the finisher thread.
    Finishing,
    Finished,
    /// Could not be created; records for it are counted as lost in the log.
    Failed,
}

/// One segment's state behind its own lock.
pub(crate) struct Entry {
    state: State,
}

/// An entry and the condition variable signalled when it leaves `Finishing`.
pub(crate) struct Slot {
    entry: Mutex<Entry>,
    finished: Condvar,
}

/// A client's hold on an open segment.
pub(crate) struct SegRef {
    key: Key,
    entry: Arc<Slot>,
}

/// A writer on its way to being finished.
struct Closing {
    key: Key,
    writer: SegmentWriter,
    staged: Option<PathBuf>,
    given: u64,
    broken: Option<String>,
}

/// Work for the finisher thread.
type FinishJob = (Closing, Arc<Slot>);

/// Records lost, by cause (see the module documentation).
#[derive(Default)]
pub(crate) struct Losses {
    /// Records lost per cause (0 for a cause seen that has cost nothing so far, e.g. an index
    /// that could not be written: readers scan instead).
    by_cause: Mutex<BTreeMap<String, u64>>,
    /// Records given to the store (to a segment, or lost for want of one).
    given: AtomicU64,
}

impl Losses {
    /// Notes a cause the first time it occurs (one log line per cause), before any record is
    /// counted against it.
    pub(crate) fn note(&self, cause: &str) {
        let mut m = self.by_cause.lock();
        if !m.contains_key(cause) {
            warn!("store: {cause}");
            m.insert(cause.to_string(), 0);
        }
    }

    /// Counts a record given to the store (whatever becomes of it).
    pub(crate) fn given(&self) {
        self.given.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `n` records lost to `cause`; the first records a cause costs are logged (once
    /// per cause).
    pub(crate) fn add(&self, cause: &str, n: u64) {
        if n == 0 {
            self.note(cause);
            return;
        }
        let mut m = self.by_cause.lock();
        let count = m.entry(cause.to_string()).or_default();
        if *count == 0 {
            error!("records are being lost: {cause}");
        }
        *count += n;
    }

    /// Causes that cost records, for the manifest.
    pub(crate) fn list(&self) -> Vec<Loss> {
        self.by_cause
            .lock()
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(c, &n)| Loss {
                cause: c.clone(),
                records: n,
            })
            .collect()
    }
}

/// What went wrong, without the path (so that a full disk is one cause, not one per segment).
pub(crate) fn cause(what: &str, e: &FormatError) -> String {
    match e {
        FormatError::File { source, .. } => format!("{what}: {source}"),
        other => format!("{what}: {other}"),
    }
}

impl SegRef {
    /// Appends a record; returns where its frame ends in the segment and the raw bytes of
    /// its blobs replaced by references to identical bytes stored before in the segment (a
    /// blob with a digest in `digests` is deduplicated: see module `dedup`). A broken segment
    /// takes no more records (they are lost with the others: see the module documentation).
    /// A repeat blob (`pieces::Compressed`) that the segment does not hold the bytes of is
    /// made a real blob by `compress` (given its index); where it cannot be (its bytes are no
    /// longer at hand) the record is not written and is counted lost, the segment unharmed.
    pub(crate) fn append(
        &self,
        record: &Record,
        blobs: &mut [Blob],
        digests: &[Option<Digest>],
        losses: &Losses,
        compress: &mut dyn FnMut(usize, &mut Blob) -> bool,
    ) -> Result<(u64, u64), FormatError> {
        match &mut self.entry.entry.lock().state {
            State::Open {
                writer,
                given,
                broken,
                seen,
                ..
            } => {
                *given += 1;
                if let Some(b) = broken {
                    return Err(FormatError::Invalid(b.clone()));
                }
                let deduped = seen.dedup(record, writer.len(), blobs, digests);
                for (i, b) in blobs.iter_mut().enumerate() {
                    if crate::pieces::is_repeat(b) && !compress(i, b) {
                        let c = format!(
                            "record seq {}: tensor {i} repeats bytes its segment does not hold, \
                             and its own bytes are no longer at hand",
                            record.seq
                        );
                        losses.note(&c);
                        return Err(FormatError::Invalid(c));
                    }
                }
                let saved = deduped.bytes;
                match writer.append(record, blobs) {
                    Ok(_) => {
                        seen.keep(deduped);
                        Ok((writer.len(), saved))
                    }
                    Err(e) => {
                        let c = cause("writing a segment", &e);
                        losses.note(&c);
                        *broken = Some(c);
                        Err(e)
                    }
                }
            }
            _ => Err(FormatError::Invalid(format!(
                "segment rank {} step {} is not open",
                self.key.0, self.key.1
            ))),
        }
    }

    /// End of the frames of this segment that are in the kernel (see
    /// `SegmentWriter::handed`); `None` when the segment is not open.
    pub(crate) fn handed(&self) -> Option<u64> {
        match &self.entry.entry.lock().state {
            State::Open { writer, .. } => Some(writer.handed()),
            _ => None,
        }
    }

    /// Hands buffered frames to the kernel; false when that failed or the segment is broken
    /// (the cause is logged once, by [`Losses::note`]).
    pub(crate) fn flush(&self, losses: &Losses) -> bool {
        if let State::Open { writer, broken, .. } = &mut self.entry.entry.lock().state {
            if broken.is_some() {
                return false;
            }
            if let Err(e) = writer.flush() {
                let c = cause("writing a segment", &e);
                losses.note(&c);
                *broken = Some(c);
                return false;
            }
        }
        true
    }

    /// The segment's (rank, step).
    pub(crate) fn key(&self) -> Key {
        self.key
    }
}

/// Every segment the daemon opened.
pub(crate) struct Segments {
    store: PathBuf,
    /// The store directory's lock and space reserve, held while the store is written.
    dir: StoreDir,
    map: Mutex<HashMap<Key, Arc<Slot>>>,
    reopened: AtomicU64,
    finisher: Mutex<Option<(Sender<FinishJob>, JoinHandle<()>)>>,
    losses: Arc<Losses>,
}

/// Segments waiting for the finisher at most.
const MAX_FINISHING: usize = 32;

/// The cause of the records lost with a store removed under the collector.
const STORE_REMOVED: &str =
    "the store directory was removed or replaced during the run: its records are gone";

impl Segments {
    /// Takes possession of the store directory (see [`StoreDir::create`]: a new or empty
    /// directory, locked for this writer) and starts the finisher.
    pub(crate) fn create(store: PathBuf) -> Result<Segments, crate::store_dir::StoreDirError> {
        let dir = StoreDir::create(&store)?;
        // Bounded: a segment waiting to be finished still holds its descriptors and buffer, so
        // clients that hand segments over faster than they are fsynced wait for the finisher.
        let (tx, rx) = bounded::<FinishJob>(MAX_FINISHING);
        let losses = Arc::new(Losses::default());
        let (root, lost) = (store.clone(), losses.clone());
        let finisher = std::thread::Builder::new()
            .name("ttraced-finish".into())
            .spawn(move || {
                for (closing, slot) in rx {
                    finish(&root, closing, &lost);
                    slot.entry.lock().state = State::Finished;
                    slot.finished.notify_all();
                }
            })
            .map_err(|e| warn!("no finisher thread ({e}): segments finish inline"))
            .ok()
            .map(|h| (tx, h));
        Ok(Segments {
            store,
            dir,
            map: Mutex::new(HashMap::new()),
            reopened: AtomicU64::new(0),
            finisher: Mutex::new(finisher),
            losses,
        })
    }

    /// Gives the store directory back (nothing was stored: see [`StoreDir::abandon`]).
    pub(crate) fn abandon(self) {
        if let Some((tx, worker)) = self.finisher.lock().take() {
            drop(tx);
            let _ = worker.join();
        }
        self.dir.abandon();
    }

    /// The loss ledger of this store.
    pub(crate) fn losses(&self) -> &Losses {
        &self.losses
    }

    /// Records lost so far, by cause (for the manifest).
    pub(crate) fn lost(&self) -> Vec<Loss> {
        self.losses.list()
    }

    /// Segments opened so far.
    pub(crate) fn count(&self) -> u64 {
        self.map.lock().len() as u64
    }

    /// Distinct step numbers among the segments opened.
    pub(crate) fn steps(&self) -> u64 {
        let steps: std::collections::BTreeSet<u64> = self.map.lock().keys().map(|k| k.1).collect();
        steps.len() as u64
    }

    /// Takes a hold on the segment of (rank, step), creating or reopening it.
    pub(crate) fn acquire(&self, rank: u32, step: u64) -> Result<SegRef, FormatError> {
        let key = (rank, step);
        let entry = self
            .map
            .lock()
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Slot {
                    entry: Mutex::new(Entry {
                        state: State::Absent,
                    }),
                    finished: Condvar::new(),
                })
            })
            .clone();
        {
            let mut e = entry.entry.lock();
            while matches!(e.state, State::Finishing) {
                entry.finished.wait(&mut e);
            }
            match &mut e.state {
                State::Open { holders, .. } => *holders += 1,
                State::Absent | State::Finished | State::Failed | State::Finishing => {
                    let reopen = matches!(e.state, State::Finished);
                    match self.open(rank, step, reopen) {
                        Ok((writer, staged)) => {
                            e.state = State::Open {
                                writer,
                                holders: 1,
                                staged,
                                given: 0,
                                broken: None,
                                seen: Box::default(),
                            }
                        }
                        Err(err) => {
                            e.state = State::Failed;
                            return Err(err);
                        }
                    }
                }
            }
        }
        Ok(SegRef { key, entry })
    }

    fn open(
        &self,
        rank: u32,
        step: u64,
        reopen: bool,
    ) -> Result<(SegmentWriter, Option<PathBuf>), FormatError> {
        let dir = rank_dir(&self.store, rank);
        private_dir(&dir)?;
        if !reopen {
            match SegmentWriter::create_direct(&self.store, rank, step) {
                Ok(w) => return Ok((w, None)),
                // A segment left by an earlier writer of this store: keep its frames.
                Err(FormatError::File { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        self.reopen(rank, step)
    }

    fn reopen(
        &self,
        rank: u32,
        step: u64,
    ) -> Result<(SegmentWriter, Option<PathBuf>), FormatError> {
        let n = self.reopened.fetch_add(1, Ordering::Relaxed);
        let staged = self.store.join(".reopen").join(n.to_string());
        for d in [
            self.store.join(".reopen"),
            staged.clone(),
            rank_dir(&staged, rank),
        ] {
            private_dir(&d)?;
        }
        let mut w = SegmentWriter::create_direct(&staged, rank, step)?;
        let old = segment_path(&self.store, rank, step);
        let mut copied = 0u64;
        match Segment::open(&old) {
            Ok(seg) => {
                for issue in seg.issues().iter().filter(|i| i.kind.loses_data()) {
                    warn!("{}: {issue} while reopening", old.display());
                }
                for f in seg.into_frames() {
                    match f {
                        Ok(frame) => {
                            let blobs: Vec<Blob> = frame
                                .blobs
                                .iter()
                                .map(|b| Blob {
                                    codec: b.codec,
                                    elem_size: b.elem_size,
                                    raw_len: b.raw_len,
                                    stored: frame.body[b.start..b.end].to_vec(),
                                })
                                .collect();
                            w.append(&frame.record, &blobs)?;
                            copied += 1;
                        }
                        Err(issue) => warn!("{}: {issue} while reopening", old.display()),
                    }
                }
            }
            Err(e) => warn!(
                "{}: cannot read the segment to reopen it: {e}",
                old.display()
            ),
        }
        if n == 0 {
            warn!(
                rank,
                step,
                copied,
                "a record arrived for a finished segment: reopened it (further reopens are \
                 logged at debug level)"
            );
        } else {
            debug!(rank, step, copied, "reopened a finished segment");
        }
        Ok((w, Some(staged)))
    }

    /// Lets go of a hold; the last one has the segment finished (fsync + index) in the
    /// background.
    pub(crate) fn release(&self, seg: SegRef) {
        let mut e = seg.entry.entry.lock();
        let last = match &mut e.state {
            State::Open { holders, .. } => {
                *holders -= 1;
                *holders == 0
            }
            _ => false,
        };
        if !last {
            return;
        }
        let State::Open {
            writer,
            staged,
            given,
            broken,
            ..
        } = std::mem::replace(&mut e.state, State::Finishing)
        else {
            return;
        };
        drop(e);
        let closing = Closing {
            key: seg.key,
            writer,
            staged,
            given,
            broken,
        };
        let job = (closing, seg.entry.clone());
        let queued = match &*self.finisher.lock() {
            Some((tx, _)) => tx.send(job).map_err(|e| e.into_inner()),
            None => Err(job),
        };
        if let Err((closing, slot)) = queued {
            finish(&self.store, closing, &self.losses);
            slot.entry.lock().state = State::Finished;
            slot.finished.notify_all();
        }
    }

    /// Waits for the background finishes, then finishes every segment still open (clients
    /// that never let go). The space reserve is freed first: what remains to write (indexes,
    /// the final manifest) says what was stored and lost, and must fit on a full disk.
    pub(crate) fn finish_all(&self) {
        if let Some((tx, worker)) = self.finisher.lock().take() {
            drop(tx);
            let _ = worker.join();
        }
        self.dir.free_reserve();
        let entries: Vec<(Key, Arc<Slot>)> = self
            .map
            .lock()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        for (key, entry) in entries {
            let mut e = entry.entry.lock();
            if !matches!(e.state, State::Open { .. }) {
                continue;
            }
            if let State::Open {
                writer,
                staged,
                given,
                broken,
                ..
            } = std::mem::replace(&mut e.state, State::Finished)
            {
                warn!(
                    rank = key.0,
                    step = key.1,
                    "segment still open at the end: finishing it"
                );
                let closing = Closing {
                    key,
                    writer,
                    staged,
                    given,
                    broken,
                };
                finish(&self.store, closing, &self.losses);
            }
        }
        let _ = std::fs::remove_dir(self.store.join(".reopen"));
        if !self.dir.still_there() {
            // Whatever was stored went with the directory.
            let lost: u64 = self.losses.list().iter().map(|l| l.records).sum();
            let given = self.losses.given.load(Ordering::Relaxed);
            self.losses.add(STORE_REMOVED, given.saturating_sub(lost));
        }
    }
}

/// Finishes a segment (fsync, index; a reopened one replaces the old file) and settles its
/// account: a broken segment, or one whose file left the store, counts the records that are
/// not in the file as lost.
fn finish(store: &Path, c: Closing, losses: &Losses) {
    let Closing {
        key,
        writer,
        staged,
        given,
        mut broken,
    } = c;
    let path = writer.path().to_path_buf();
    let id = writer.file_id().ok();
    if broken.is_none() {
        if let Err(e) = writer.finish() {
            let c = cause("finishing a segment", &e);
            losses.note(&c);
            broken = Some(c);
        }
    } else {
        // Whatever is still buffered goes out (or fails) as the writer is dropped.
        drop(writer);
    }
    let final_path = segment_path(store, key.0, key.1);
    if let Some(b) = broken {
        // The index may not describe the file: readers scan without one.
        let _ = std::fs::remove_file(index_path(&path));
        let kept = match staged {
            // The staged copy is incomplete: the old segment stays as it was, and every
            // record given to this writer is lost.
            Some(staged) => {
                let _ = std::fs::remove_dir_all(&staged);
                0
            }
            None => intact_frames(&path),
        };
        if kept == 0 && headerless(&path) {
            let _ = std::fs::remove_file(&path);
        }
        losses.add(&b, given.saturating_sub(kept));
        return;
    }
    if let Some(staged) = staged {
        let from = segment_path(&staged, key.0, key.1);
        let moved = std::fs::rename(&from, &final_path)
            .and_then(|()| std::fs::rename(index_path(&from), index_path(&final_path)));
        match moved {
            Ok(()) => {
                let _ = std::fs::remove_dir_all(&staged);
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&staged);
                losses.add(&format!("replacing a reopened segment: {e}"), given);
                return;
            }
        }
    } else if id.is_some() && file_id(&final_path) != id {
        // The file we wrote is not the one readers find: the store (or the segment) was
        // removed or replaced during the run.
        losses.add(
            "the segment's file left the store during the run (was the store directory \
             removed?)",
            given.saturating_sub(intact_frames(&final_path)),
        );
        return;
    }
    debug!(
        rank = key.0,
        step = key.1,
        records = given,
        "segment finished"
    );
}

/// Device and inode of `path`, `None` when it is missing.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// A segment file without even its header (a full disk at its creation): nothing to keep.
fn headerless(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .is_ok_and(|m| m.is_file() && m.len() < ttrace_format::store::SEGMENT_HEADER_BYTES)
}

/// Intact frames of the segment at `path` (0 when it is missing or unreadable).
fn intact_frames(path: &Path) -> u64 {
    let Ok(seg) = Segment::open(path) else {
        return 0;
    };
    seg.records().filter(Result::is_ok).count() as u64
}

/// Creates a rank directory inside the store, never the store itself: a store directory
/// removed during the run must show up as lost records, not be silently re-created.
fn private_dir(dir: &Path) -> Result<(), FormatError> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(FormatError::at(dir, e)),
    }
}
