//! The compression pool: a few worker threads shared by every client, each with its own
//! [`Encoder`] (zstd context and shuffle buffer), and the spare blob buffers they reuse.

use std::sync::Arc;
use std::thread::JoinHandle;

use std::sync::Mutex;
use tracing::warn;

use crate::encode::Encoder;
use crate::handoff::{self, lock, QueueSender};

/// A unit of work; it gets the worker's encoder.
pub(crate) type Job = Box<dyn FnOnce(&mut Encoder) + Send>;

/// Spare buffers kept for reuse, at most.
const SPARE_BUFFERS: usize = 64;
/// Bytes of spare buffers kept, at most.
const SPARE_TOTAL_BYTES: usize = 64 << 20;
/// Larger buffers are not kept (a huge tensor's buffer would pin its memory for small ones).
const SPARE_MAX_BYTES: usize = 16 << 20;

/// Stored-blob buffers handed back by the writers once written, for the encoders to fill
/// again: a fresh multi-megabyte buffer per tensor costs a page fault (and a page clearing)
/// per 4 KiB, a good part of what compressing it costs; a small one costs an allocation on
/// the compression thread and a free on the writer's, per tensor.
/// (std's lock: it sleeps after a short spin where parking_lot's yields the core, and every
/// compression thread and writer takes this one.)
#[derive(Default)]
pub(crate) struct Spare {
    bufs: Mutex<SpareBufs>,
}

#[derive(Default)]
struct SpareBufs {
    bufs: Vec<Vec<u8>>,
    /// Their capacities, summed.
    bytes: usize,
}

impl Spare {
    /// A buffer to fill (empty; possibly with capacity).
    pub(crate) fn take(&self) -> Vec<u8> {
        let mut s = lock(&self.bufs);
        let buf = s.bufs.pop().unwrap_or_default();
        s.bytes -= buf.capacity();
        buf
    }

    /// Keeps `buf` for reuse, unless enough are kept or it is too large or too small to
    /// matter.
    pub(crate) fn give(&self, mut buf: Vec<u8>) {
        if !(4 << 10..=SPARE_MAX_BYTES).contains(&buf.capacity()) {
            return;
        }
        buf.clear();
        let mut s = lock(&self.bufs);
        if s.bufs.len() < SPARE_BUFFERS && s.bytes + buf.capacity() <= SPARE_TOTAL_BYTES {
            s.bytes += buf.capacity();
            s.bufs.push(buf);
        }
    }
}

/// Worker threads fed by one FIFO queue.
pub(crate) struct Pool {
    tx: QueueSender<Job>,
    workers: Vec<JoinHandle<()>>,
    level: i32,
    spare: Arc<Spare>,
    /// How large the pieces of a large tensor are (`crate::pieces`; 0: never cut).
    piece_bytes: u64,
}

impl Pool {
    /// Starts `threads` workers (at least one) compressing at zstd `level`.
    pub(crate) fn new(threads: usize, level: i32) -> Pool {
        let (tx, rx) = handoff::queue::<Job>(usize::MAX);
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
                        while let Ok(job) = rx.recv() {
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

    /// Queues jobs, waking the workers once for all of them. When no worker could be
    /// started, runs them on the caller's thread.
    pub(crate) fn submit_all(&self, jobs: Vec<Job>) {
        if self.workers.is_empty() {
            return self.run_here(jobs);
        }
        if let Err(jobs) = self.tx.send_all(jobs) {
            // Every worker is gone (they only end by panicking): run the jobs here rather
            // than lose them.
            self.run_here(jobs);
        }
    }

    /// Runs `jobs` on the caller's thread, with one encoder for all of them.
    fn run_here(&self, jobs: Vec<Job>) {
        let mut encoder = Encoder::new(self.level).with_spare(self.spare.clone());
        for job in jobs {
            job(&mut encoder);
        }
    }
}
