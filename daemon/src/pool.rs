//! The compression pool: a few worker threads shared by every client, each with its own
//! scratch buffer for the byte shuffle.

use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Sender};
use tracing::warn;

/// A unit of work; it gets the worker's scratch buffer.
pub(crate) type Job = Box<dyn FnOnce(&mut Vec<u8>) + Send>;

/// Worker threads fed by one FIFO queue.
pub(crate) struct Pool {
    tx: Sender<Job>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Starts `threads` workers (at least one).
    pub(crate) fn new(threads: usize) -> Pool {
        let (tx, rx) = unbounded::<Job>();
        let workers = (0..threads.max(1))
            .filter_map(|i| {
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("ttraced-zstd-{i}"))
                    .spawn(move || {
                        let mut scratch = Vec::new();
                        for job in rx {
                            job(&mut scratch);
                            // Do not keep a huge tensor's worth of scratch forever.
                            if scratch.capacity() > 64 << 20 {
                                scratch = Vec::new();
                            }
                        }
                    })
                    .map_err(|e| warn!("cannot start compression thread {i}: {e}"))
                    .ok()
            })
            .collect();
        Pool { tx, workers }
    }

    /// Queues a job. When no worker could be started, runs it on the caller's thread.
    pub(crate) fn submit(&self, job: Job) {
        if self.workers.is_empty() {
            job(&mut Vec::new());
            return;
        }
        if let Err(e) = self.tx.send(job) {
            // Unreachable while the pool lives (it holds a receiver through its workers);
            // run the job here rather than lose it.
            (e.into_inner())(&mut Vec::new());
        }
    }
}
