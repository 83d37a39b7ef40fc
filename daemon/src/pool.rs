//! The compression pool: a few worker threads shared by every client, each with its own
//! [`Encoder`] (zstd context and shuffle buffer), and the spare blob buffers they reuse.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Sender};
use parking_lot::Mutex;
use tracing::warn;

use crate::encode::Encoder;

/// A unit of work; it gets the worker's encoder.
pub(crate) type Job = Box<dyn FnOnce(&mut Encoder) + Send>;

/// Spare buffers kept for reuse.
const SPARE_BUFFERS: usize = 8;
/// Larger buffers are not kept (a huge tensor's buffer would pin its memory for small ones).
const SPARE_MAX_BYTES: usize = 16 << 20;

/// Stored-blob buffers handed back by the writers once written, for the encoders to fill
/// again: a fresh multi-megabyte buffer per tensor costs a page fault (and a page clearing)
/// per 4 KiB, a good part of what compressing it costs.
#[derive(Default)]
pub(crate) struct Spare {
    bufs: Mutex<Vec<Vec<u8>>>,
}

impl Spare {
    /// A buffer to fill (empty; possibly with capacity).
    pub(crate) fn take(&self) -> Vec<u8> {
        self.bufs.lock().pop().unwrap_or_default()
    }

    /// Keeps `buf` for reuse, unless enough are kept or it is too large or too small to
    /// matter.
    pub(crate) fn give(&self, mut buf: Vec<u8>) {
        if !(64 << 10..=SPARE_MAX_BYTES).contains(&buf.capacity()) {
            return;
        }
        buf.clear();
        let mut bufs = self.bufs.lock();
        if bufs.len() < SPARE_BUFFERS {
            bufs.push(buf);
        }
    }
}

/// Worker threads fed by one FIFO queue.
pub(crate) struct Pool {
    tx: Sender<Job>,
    workers: Vec<JoinHandle<()>>,
    level: i32,
    spare: Arc<Spare>,
    /// How large the pieces of a large tensor are (`crate::pieces`; 0: never cut).
    piece_bytes: u64,
}

impl Pool {
    /// Starts `threads` workers (at least one) compressing at zstd `level`.
    pub(crate) fn new(threads: usize, level: i32) -> Pool {
        let (tx, rx) = unbounded::<Job>();
        let spare = Arc::new(Spare::default());
        // More compression threads than this only cost memory (each has a zstd context).
        let workers = (0..threads.clamp(1, 256))
            .filter_map(|i| {
                let rx = rx.clone();
                let spare = spare.clone();
                std::thread::Builder::new()
                    .name(format!("ttraced-zstd-{i}"))
                    .spawn(move || {
                        let mut encoder = Encoder::new(level).with_spare(spare);
                        for job in rx {
                            job(&mut encoder);
                        }
                    })
                    .map_err(|e| warn!("cannot start compression thread {i}: {e}"))
                    .ok()
            })
            .collect();
        Pool {
            tx,
            workers,
            level,
            spare,
            piece_bytes: crate::pieces::PIECE_BYTES,
        }
    }

    /// The same pool cutting large tensors into pieces of `bytes` (0: never).
    pub(crate) fn with_piece_bytes(mut self, bytes: u64) -> Pool {
        self.piece_bytes = bytes;
        self
    }

    /// The size of the pieces large tensors are cut into (0: never cut).
    pub(crate) fn piece_bytes(&self) -> u64 {
        self.piece_bytes
    }

    /// Hands a written blob's buffer back for reuse.
    pub(crate) fn recycle(&self, buf: Vec<u8>) {
        self.spare.give(buf);
    }

    /// Queues a job. When no worker could be started, runs it on the caller's thread.
    pub(crate) fn submit(&self, job: Job) {
        if self.workers.is_empty() {
            job(&mut Encoder::new(self.level));
            return;
        }
        if let Err(e) = self.tx.send(job) {
            // Every worker is gone (they only end by panicking): run the job here rather than
            // lose it.
            (e.into_inner())(&mut Encoder::new(self.level));
        }
    }
}
