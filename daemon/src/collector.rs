//! The per-user collector: one `ttraced` that serves every traced job of its user on this
//! node and keeps each job in a store of its own.
//!
//! `libttrace.so` loaded without `TTRACE_SOCKET` connects to the user's collector socket and,
//! when nobody listens there, starts this collector itself (see intercept/src/collector.rs).
//! Each process says which job it belongs to in its `Hello` (`wire::JobInfo`, derived from the
//! launcher's environment); the first process of a job creates the job's store (`TTRACE_OUT`,
//! else `CWD/ttrace-runs/<UTC time>-<job label>`), later ones join it. Once every process of
//! a job has left and none has joined for the *linger* time, the job's store is finalised (at
//! once when every rank of its world said `Bye`); a process of the same job arriving later
//! starts a new store. The collector exits on its own
//! once it has had no client for the *idle* time, after finalising every store.

use std::collections::HashMap;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use tracing::{info, warn};
use ttrace_format::wire::Hello;

use crate::client::ClientState;
use crate::pool::Pool;
use crate::{
    accept_loop, bind_private, check_settings, new_run_id, ClientThreads, Error, Route, Routed,
    RunInfo, Shared,
};

/// How a collector runs.
#[derive(Debug, Clone)]
pub struct CollectorConfig {
    /// Unix socket to listen on; its directory must be private to this user.
    pub socket: PathBuf,
    /// Default zstd level (a job may ask for another with `TTRACE_LEVEL`).
    pub level: i32,
    /// Compression threads shared by all jobs.
    pub threads: usize,
    /// How long a job's store stays open after its last process left.
    pub job_linger: Duration,
    /// Exit after this long without any client or open job (`None`: run until stopped).
    pub idle_exit: Option<Duration>,
}

impl CollectorConfig {
    /// Defaults: the daemon's level and threads, 2 s linger, exit after 60 s idle.
    pub fn new(socket: impl Into<PathBuf>) -> CollectorConfig {
        CollectorConfig {
            socket: socket.into(),
            level: crate::DEFAULT_LEVEL,
            threads: crate::default_threads(),
            job_linger: Duration::from_secs(2),
            idle_exit: Some(Duration::from_secs(60)),
        }
    }
}

/// One finalised (or abandoned) job store, for the collector's log and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStore {
    /// The job's identity (`JobInfo::id`).
    pub job: String,
    pub store: PathBuf,
    /// Whether its manifest was finalised.
    pub finalized: bool,
    /// Records the collector received for it but could not store.
    pub lost_records: u64,
}

/// An open job.
struct Job {
    shared: Arc<Shared>,
    /// Since when every process of the job is done (`None`: some are still connected).
    idle_since: Option<Instant>,
}

/// The jobs a collector serves, keyed by job id.
struct Jobs {
    uid: u32,
    level: i32,
    pool: Arc<Pool>,
    open: Mutex<HashMap<String, Job>>,
    stopping: AtomicBool,
}

impl Jobs {
    /// The store directory of a new job: the job's own choice (absolute), else a fresh
    /// directory under its working directory.
    fn store_for(&self, hello: &Hello) -> Result<PathBuf, String> {
        if let Some(out) = &hello.out {
            let p = PathBuf::from(out);
            if !p.is_absolute() {
                return Err(format!("TTRACE_OUT {out} is not an absolute path"));
            }
            return Ok(p);
        }
        let cwd = Path::new(&hello.cwd);
        if !cwd.is_absolute() {
            return Err(format!(
                "the process's working directory `{}` is not absolute; set TTRACE_OUT",
                hello.cwd
            ));
        }
        let base = cwd.join("ttrace-runs").join(format!(
            "{}-{}",
            utc_stamp(),
            file_safe(&hello.job.label)
        ));
        let mut p = base.clone();
        let mut n = 1;
        while p.exists() {
            n += 1;
            p = PathBuf::from(format!("{}-{n}", base.display()));
        }
        Ok(p)
    }

    fn open_job(&self, hello: &Hello) -> Result<Arc<Shared>, String> {
        let store = self.store_for(hello)?;
        if let Some(parent) = store.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        let run = RunInfo {
            run_id: new_run_id(),
            command: hello.command.clone(),
            cwd: hello.cwd.clone(),
            env: hello.env.clone(),
            capture: hello.capture.clone().unwrap_or_default(),
            job: Some(hello.job.clone()).filter(|j| !j.id.is_empty()),
        };
        let level = hello.level.unwrap_or(self.level);
        crate::check_level(level).map_err(|e| format!("TTRACE_LEVEL: {e}"))?;
        let shared = Shared::create(store, level, run, self.pool.clone())
            .map_err(|e| format!("cannot create the job's store: {e}"))?;
        info!(job = %hello.job.id, store = %shared.store.display(), "new job");
        Ok(shared)
    }

    /// Finalises the jobs whose processes are all gone for `linger` (every job when
    /// `all`); returns them.
    fn close_idle(&self, linger: Duration, all: bool) -> Vec<JobStore> {
        let now = Instant::now();
        let mut done = Vec::new();
        {
            let mut open = self.open.lock();
            let mut keys = Vec::new();
            for (k, j) in open.iter_mut() {
                if all {
                    keys.push(k.clone());
                } else if j.shared.all_clients_done() {
                    let since = *j.idle_since.get_or_insert(now);
                    if now.duration_since(since) >= linger || j.shared.every_rank_said_bye() {
                        keys.push(k.clone());
                    }
                } else {
                    j.idle_since = None;
                }
            }
            for k in keys {
                if let Some(j) = open.remove(&k) {
                    done.push((k, j.shared));
                }
            }
        }
        done.into_iter()
            .map(|(job, shared)| {
                let finalized = match shared.finish(None) {
                    Ok(()) => true,
                    Err(e) => {
                        warn!(job = %job, store = %shared.store.display(), "finalising: {e}");
                        false
                    }
                };
                let lost_records = shared.segments.lost().iter().map(|l| l.records).sum();
                info!(job = %job, store = %shared.store.display(), lost_records, "job finished");
                JobStore {
                    job,
                    store: shared.store.clone(),
                    finalized,
                    lost_records,
                }
            })
            .collect()
    }
}

impl Route for Jobs {
    fn uid(&self) -> u32 {
        self.uid
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    fn accepted(&self, _: &Arc<ClientState>) {}

    fn route(&self, hello: &Hello, state: &Arc<ClientState>) -> Result<Routed, String> {
        // A process that names no job (an older client) is a job of its own.
        let key = if hello.job.id.is_empty() {
            format!("pid:{}", hello.pid)
        } else {
            hello.job.id.clone()
        };
        // Store creation happens under the lock: two ranks of a new job arriving together
        // must not create two stores.
        let mut open = self.open.lock();
        if let Some(j) = open.get_mut(&key) {
            j.idle_since = None;
            j.shared.clients.lock().push(state.clone());
            return Ok(Routed {
                shared: j.shared.clone(),
                first: false,
            });
        }
        let shared = self.open_job(hello)?;
        shared.clients.lock().push(state.clone());
        open.insert(
            key,
            Job {
                shared: shared.clone(),
                idle_since: None,
            },
        );
        Ok(Routed {
            shared,
            first: true,
        })
    }
}

/// A running collector.
pub struct Collector {
    jobs: Arc<Jobs>,
    config: CollectorConfig,
    accept: Option<JoinHandle<()>>,
    threads: ClientThreads,
    /// Connections being served.
    live: Arc<AtomicUsize>,
    finished: Vec<JobStore>,
}

impl Collector {
    /// Binds the socket and starts accepting.
    pub fn start(config: CollectorConfig) -> Result<Collector, Error> {
        check_settings(config.threads, config.level)?;
        let listener: UnixListener = bind_private(&config.socket)?;
        let jobs = Arc::new(Jobs {
            uid: rustix::process::getuid().as_raw(),
            level: config.level,
            pool: Arc::new(Pool::new(config.threads, config.level)),
            open: Mutex::new(HashMap::new()),
            stopping: AtomicBool::new(false),
        });
        let threads: ClientThreads = Arc::new(Mutex::new(Vec::new()));
        let live = Arc::new(AtomicUsize::new(0));
        let accept = {
            let (router, threads, live): (Arc<dyn Route>, _, _) =
                (jobs.clone(), threads.clone(), live.clone());
            std::thread::Builder::new()
                .name("ttraced-accept".into())
                .spawn(move || accept_loop(listener, router, threads, Some(live)))
                .map_err(|e| Error::Io {
                    path: config.socket.clone(),
                    source: e,
                })?
        };
        info!(socket = %config.socket.display(), "collector listening");
        Ok(Collector {
            jobs,
            config,
            accept: Some(accept),
            threads,
            live,
            finished: Vec::new(),
        })
    }

    /// The socket it listens on.
    pub fn socket(&self) -> &Path {
        &self.config.socket
    }

    /// Jobs open right now.
    pub fn open_jobs(&self) -> usize {
        self.jobs.open.lock().len()
    }

    /// Finalises idle jobs until `stop` is set or, with an idle limit, until nothing has
    /// been connected and no job open for that long.
    pub fn serve(&mut self, stop: &AtomicBool) {
        let mut idle_since: Option<Instant> = None;
        while !stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(50));
            let closed = self.jobs.close_idle(self.config.job_linger, false);
            self.finished.extend(closed);
            let idle = self.live.load(Ordering::Acquire) == 0 && self.open_jobs() == 0;
            if !idle {
                idle_since = None;
                continue;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            if self
                .config
                .idle_exit
                .is_some_and(|limit| since.elapsed() >= limit)
            {
                info!("no client for {:?}: exiting", since.elapsed());
                break;
            }
        }
    }

    /// Stops accepting (and removes the socket), waits up to `wait` for connected processes
    /// to leave (then disconnects them), finalises every open job and returns every store
    /// this collector wrote.
    pub fn shutdown(mut self, wait: Duration) -> Vec<JobStore> {
        self.stop_accepting();
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline && self.live.load(Ordering::Acquire) > 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
        for j in self.jobs.open.lock().values() {
            for c in j.shared.clients.lock().iter() {
                if !c.is_connection_closed() {
                    warn!(
                        client = c.id,
                        "still connected at shutdown: disconnecting it"
                    );
                    c.cut();
                }
            }
        }
        let handles: Vec<JoinHandle<()>> = std::mem::take(&mut *self.threads.lock());
        for h in handles {
            let _ = h.join();
        }
        let closed = self.jobs.close_idle(Duration::ZERO, true);
        self.finished.extend(closed);
        std::mem::take(&mut self.finished)
    }

    fn stop_accepting(&mut self) {
        if let Some(accept) = self.accept.take() {
            self.jobs.stopping.store(true, Ordering::Release);
            let _ = accept.join();
            crate::remove_own_socket(&self.config.socket);
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop_accepting();
    }
}

/// `20250102T030405Z`: the UTC time, in a file name.
fn utc_stamp() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect()
}

/// Keeps letters, digits, `.`, `_` and `-` of `label` (at most 48 of them); `job` when none
/// is left. A label is the job's own string: it never names another directory.
fn file_safe(label: &str) -> String {
    let s: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
    let s = s.trim_start_matches('.').to_string();
    if s.is_empty() {
        "job".into()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_become_plain_file_names() {
        assert_eq!(file_safe("slurm-1234.0"), "slurm-1234.0");
        assert_eq!(file_safe("../../etc/passwd"), "_.._etc_passwd");
        assert_eq!(file_safe(".."), "job");
        assert_eq!(file_safe(""), "job");
        assert_eq!(file_safe(&"x".repeat(100)).len(), 48);
    }
}
