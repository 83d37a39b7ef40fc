//! The compression pool: a few worker threads shared by every client, each with its own
//! [`Encoder`] (zstd context and shuffle buffer).

use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Sender};
use tracing::warn;

use crate::encode::Encoder;

/// A unit of work; it gets the worker's encoder.
pub(crate) type Job = Box<dyn FnOnce(&mut Encoder) + Send>;

/// Worker threads fed by one FIFO queue.
pub(crate) struct Pool {
    tx: Sender<Job>,
    workers: Vec<JoinHandle<()>>,
    level: i32,
}

impl Pool {
    /// Starts `threads` workers (at least one) compressing at zstd `level`.
    pub(crate) fn new(threads: usize, level: i32) -> Pool {
        let (tx, rx) = unbounded::<Job>();
        let workers = (0..threads.max(1))
            .filter_map(|i| {
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("ttraced-zstd-{i}"))
                    .spawn(move || {
                        let mut encoder = Encoder::new(level);
                        for job in rx {
                            job(&mut encoder);
                        }
                    })
                    .map_err(|e| warn!("cannot start compression thread {i}: {e}"))
                    .ok()
            })
            .collect();
        Pool { tx, workers, level }
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
