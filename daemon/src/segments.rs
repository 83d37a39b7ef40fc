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

use std::collections::HashMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Sender};
use parking_lot::{Condvar, Mutex};
use tracing::{debug, error, warn};
use ttrace_format::record::Record;
use ttrace_format::store::{
    index_path, rank_dir, segment_path, Blob, SegmentReader, SegmentWriter,
};
use ttrace_format::FormatError;

type Key = (u32, u64);

enum State {
    /// Never opened by this daemon.
    Absent,
    Open {
        writer: SegmentWriter,
        holders: usize,
        /// Where a reopened segment is staged until it is finished.
        staged: Option<PathBuf>,
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

/// Work for the finisher thread.
type FinishJob = (Key, SegmentWriter, Option<PathBuf>, Arc<Slot>);

impl SegRef {
    /// Appends a record; returns where its frame ends in the segment.
    pub(crate) fn append(&self, record: &Record, blobs: &[Blob]) -> Result<u64, FormatError> {
        match &mut self.entry.entry.lock().state {
            State::Open { writer, .. } => {
                writer.append(record, blobs)?;
                Ok(writer.len())
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

    /// Hands buffered frames to the kernel; false when that failed (logged).
    pub(crate) fn flush(&self) -> bool {
        if let State::Open { writer, .. } = &mut self.entry.entry.lock().state {
            if let Err(e) = writer.flush() {
                error!("flush of rank {} step {}: {e}", self.key.0, self.key.1);
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
    map: Mutex<HashMap<Key, Arc<Slot>>>,
    reopened: AtomicU64,
    finisher: Mutex<Option<(Sender<FinishJob>, JoinHandle<()>)>>,
}

impl Segments {
    pub(crate) fn new(store: PathBuf) -> Segments {
        let (tx, rx) = unbounded::<FinishJob>();
        let dir = store.clone();
        let finisher = std::thread::Builder::new()
            .name("ttraced-finish".into())
            .spawn(move || {
                for (key, writer, staged, slot) in rx {
                    finish(&dir, key, writer, staged);
                    slot.entry.lock().state = State::Finished;
                    slot.finished.notify_all();
                }
            })
            .map_err(|e| warn!("no finisher thread ({e}): segments finish inline"))
            .ok()
            .map(|h| (tx, h));
        Segments {
            store,
            map: Mutex::new(HashMap::new()),
            reopened: AtomicU64::new(0),
            finisher: Mutex::new(finisher),
        }
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
                    let reopen = !matches!(e.state, State::Absent);
                    match self.open(rank, step, reopen) {
                        Ok((writer, staged)) => {
                            e.state = State::Open {
                                writer,
                                holders: 1,
                                staged,
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
        private_dir(&rank_dir(&staged, rank))?;
        let mut w = SegmentWriter::create_direct(&staged, rank, step)?;
        let old = segment_path(&self.store, rank, step);
        let mut copied = 0u64;
        match SegmentReader::open(&old) {
            Ok(mut r) => {
                while let Some(f) = r.next_frame() {
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
                        Err(issue) => warn!("{}: {issue:?} while reopening", old.display()),
                    }
                }
            }
            Err(e) => warn!(
                "{}: cannot read the segment to reopen it: {e}",
                old.display()
            ),
        }
        warn!(
            rank,
            step, copied, "a record arrived for a finished segment: reopened it"
        );
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
        let State::Open { writer, staged, .. } = std::mem::replace(&mut e.state, State::Finishing)
        else {
            return;
        };
        drop(e);
        let job = (seg.key, writer, staged, seg.entry.clone());
        let queued = match &*self.finisher.lock() {
            Some((tx, _)) => tx.send(job).map_err(|e| e.into_inner()),
            None => Err(job),
        };
        if let Err((key, writer, staged, slot)) = queued {
            finish(&self.store, key, writer, staged);
            slot.entry.lock().state = State::Finished;
            slot.finished.notify_all();
        }
    }

    /// Waits for the background finishes, then finishes every segment still open (clients
    /// that never let go).
    pub(crate) fn finish_all(&self) {
        if let Some((tx, worker)) = self.finisher.lock().take() {
            drop(tx);
            let _ = worker.join();
        }
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
            if let State::Open { writer, staged, .. } =
                std::mem::replace(&mut e.state, State::Finished)
            {
                warn!(
                    rank = key.0,
                    step = key.1,
                    "segment still open at the end: finishing it"
                );
                finish(&self.store, key, writer, staged);
            }
        }
    }
}

fn finish(store: &Path, key: Key, writer: SegmentWriter, staged: Option<PathBuf>) {
    let records = writer.records();
    if let Err(e) = writer.finish() {
        error!("finishing rank {} step {}: {e}", key.0, key.1);
        return;
    }
    debug!(rank = key.0, step = key.1, records, "segment finished");
    if let Some(staged) = staged {
        let from = segment_path(&staged, key.0, key.1);
        let to = segment_path(store, key.0, key.1);
        let moved = std::fs::rename(&from, &to)
            .and_then(|()| std::fs::rename(index_path(&from), index_path(&to)));
        match moved {
            Ok(()) => {
                let _ = std::fs::remove_dir_all(&staged);
            }
            Err(e) => error!(
                "moving the reopened segment {} over {}: {e} (it stays staged)",
                from.display(),
                to.display()
            ),
        }
    }
}

fn private_dir(dir: &Path) -> Result<(), FormatError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| FormatError::at(dir, e))
}
