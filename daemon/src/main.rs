//! `ttraced`: a standalone trace collector. With `--store DIR` it writes one job into one
//! store (`ttrace run` embeds the same daemon); without it, it is the collector that keeps
//! every job in a store of its own, the one `libttrace.so` starts by itself when it is
//! preloaded without `TTRACE_SOCKET`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

/// Collect ttrace snapshots into trace stores until SIGINT, SIGTERM or SIGHUP.
///
/// Exits 1 when records were lost (a store is then incomplete; its manifest.json says why).
///
/// With --store DIR every traced process writes into that one store, and a process of
/// another job is refused. Without --store, ttraced is a collector: each job (named by its
/// launcher's environment: TTRACE_JOB, Slurm, MPI, torchrun, else the launching process) gets
/// a store of its own, at the job's TTRACE_OUT or under its working directory in
/// ttrace-runs/<UTC time>-<job>, finalised --job-linger seconds after its last process left.
/// libttrace.so starts such a collector by itself when it is preloaded without TTRACE_SOCKET.
///
/// Traced processes find the daemon through TTRACE_SOCKET (`ttrace run --daemon SOCKET -- CMD`
/// sets it). On SIGINT/SIGTERM the daemon stops accepting, waits for connected processes to
/// leave (up to --wait seconds), writes what they published, and finalises the manifests.
///
/// Examples:
///
///   ttraced --socket /tmp/t/ttraced.sock --store runs/one
///
///   ttraced --socket "$XDG_RUNTIME_DIR/ttrace/collector.sock" --idle-exit 0
#[derive(Parser, Debug)]
#[command(name = "ttraced", version, verbatim_doc_comment)]
struct Args {
    /// Unix socket to listen on (its directory is created 0700 when missing).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Store directory for the run (created 0700; must not hold a run already). Without it,
    /// ttraced is a collector with one store per job.
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
    /// zstd level of the stored tensors (0 = raw; negative = zstd's fast modes, literals still
    /// Huffman-coded).
    #[arg(long, value_name = "N", default_value_t = ttraced::DEFAULT_LEVEL, allow_negative_numbers = true)]
    level: i32,
    /// Compression threads shared by all clients, 1..=256 [default: the cores, at most 8].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=256))]
    threads: Option<u64>,
    /// Seconds to wait for connected processes to leave once asked to stop (at most a week).
    #[arg(long, value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(0..=7 * 24 * 3600))]
    wait: u64,
    /// Collector: seconds a job's store stays open after its last process left.
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0, value_parser = seconds)]
    job_linger: f64,
    /// Collector: exit after this many seconds without any client or open job (0: never).
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0, value_parser = seconds)]
    idle_exit: f64,
    /// Collector: detach from the launching job (a session of its own, standard input and
    /// output on /dev/null, inherited descriptors closed). libttrace.so starts it so, with
    /// standard error going to the collector's log file.
    #[arg(long, conflicts_with = "store")]
    detach: bool,
}

/// A number of seconds between 0 and a day.
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=86_400.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "`{s}` is not a number of seconds between 0 and 86400"
        )),
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: std::ffi::c_int) {
    // Async-signal-safe: an atomic store only.
    STOP.store(true, Ordering::SeqCst);
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let ready = if args.detach { detach() } else { None };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TTRACE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // HUP too: a daemon started from a shell that goes away finalises its stores instead of
    // dying with them unfinalised.
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let handler = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler is async-signal-safe: it only stores to an atomic.
        unsafe { sigaction(sig, &handler) }
            .with_context(|| format!("cannot install a handler for {sig}"))?;
    }
    match &args.store {
        Some(store) => one_store(&args, store),
        None => collector(&args, ready),
    }
}

/// Detaches from the launching job: forks, and the starter (the process libttrace.so waits
/// for) exits once the collector listens (status 0) or failed to start (1). The collector
/// runs in a new session (no terminal signals), with standard input and output on
/// /dev/null and every inherited descriptor above standard error closed (a pipe that the
/// job's caller waits on must not stay open in a long-lived collector). Returns the pipe
/// end on which to say "listening".
fn detach() -> Option<std::fs::File> {
    use nix::unistd::{fork, ForkResult};
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let (read_end, write_end) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).ok()?;
    let (read_end, write_end) = (
        std::fs::File::from(read_end),
        std::fs::File::from(write_end),
    );
    // SAFETY: fork in a process that has not started any thread yet.
    match unsafe { fork() } {
        Err(_) => return None,
        Ok(ForkResult::Child) => {}
        Ok(ForkResult::Parent { .. }) => {
            drop(write_end);
            let mut byte = [0u8; 1];
            let ok = matches!((&read_end).read(&mut byte), Ok(1));
            // Nothing is buffered or registered yet (logging starts after detach), so exit()
            // ends the starter as _exit would.
            std::process::exit(if ok { 0 } else { 1 });
        }
    }
    drop(read_end);
    // In a fresh child (not a group leader) setsid cannot fail.
    let _ = rustix::process::setsid();
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let _ = rustix::stdio::dup2_stdin(&null);
        let _ = rustix::stdio::dup2_stdout(&null);
    }
    close_inherited(write_end.as_raw_fd() as u32);
    Some(write_end)
}

/// Closes every descriptor above standard error but `keep`. Neither rustix nor nix has
/// close_range(2): closing descriptors this process does not own is outside what a safe API
/// can offer.
fn close_inherited(keep: u32) {
    for (lo, hi) in [(3u32, keep.saturating_sub(1)), (keep + 1, u32::MAX)] {
        if lo > hi {
            continue;
        }
        // SAFETY: closes descriptors this process inherited and does not use.
        let rc = unsafe { libc::syscall(libc::SYS_close_range, lo, hi, 0u32) };
        if rc != 0 {
            for fd in lo..hi.min(4096) {
                // SAFETY: as above, one at a time where close_range is missing.
                unsafe { libc::close(fd as libc::c_int) };
            }
        }
    }
}

fn one_store(args: &Args, store: &std::path::Path) -> anyhow::Result<()> {
    let mut config = ttraced::Config::new(&args.socket, store);
    config.level = args.level;
    if let Some(t) = args.threads {
        config.threads = t as usize;
    }
    config.run.cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    let handle = ttraced::Daemon::start(config).context("starting ttraced")?;
    eprintln!(
        "ttraced: run {} listening on {} (store {}); SIGINT or SIGTERM ends the run",
        handle.run_id(),
        handle.socket().display(),
        handle.store().display()
    );
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("ttraced: finalising");
    let s = handle
        .finalize(None, Duration::from_secs(args.wait))
        .context("finalising the store")?;
    eprintln!(
        "ttraced: {} processes, {} ranks, {} records ({} gaps), {} bytes raw, {} stored, in {:.1}s",
        s.processes.len(),
        s.ranks,
        s.records,
        s.gaps,
        s.bytes_raw,
        s.bytes_stored,
        s.elapsed.as_secs_f64()
    );
    if s.gaps > 0 {
        eprintln!(
            "ttraced: {} gaps (ops or tensors not captured): {}",
            s.gaps,
            s.gap_tally.reasons()
        );
    }
    let lost: u64 = s.lost.iter().map(|l| l.records).sum();
    if lost > 0 {
        for l in &s.lost {
            eprintln!("ttraced: {} records lost: {}", l.records, l.cause);
        }
        anyhow::bail!("the trace is incomplete: {lost} records could not be stored");
    }
    Ok(())
}

fn collector(args: &Args, ready: Option<std::fs::File>) -> anyhow::Result<()> {
    let mut config = ttraced::collector::CollectorConfig::new(&args.socket);
    config.level = args.level;
    if let Some(t) = args.threads {
        config.threads = t as usize;
    }
    config.job_linger = Duration::from_secs_f64(args.job_linger);
    config.idle_exit = (args.idle_exit > 0.0).then(|| Duration::from_secs_f64(args.idle_exit));
    let mut c = ttraced::collector::Collector::start(config).context("starting the collector")?;
    if let Some(mut r) = ready {
        use std::io::Write;
        let _ = r.write_all(b"1");
    }
    eprintln!(
        "ttraced: collector (pid {}) listening on {}; one store per job",
        std::process::id(),
        c.socket().display()
    );
    c.serve(&STOP);
    let stores = c.shutdown(Duration::from_secs(args.wait));
    let mut incomplete = 0;
    for s in &stores {
        let state = match (s.finalized, s.lost_records) {
            (false, _) => "NOT finalised".to_string(),
            (true, 0) => "finalised".to_string(),
            (true, n) => format!("finalised, INCOMPLETE: {n} records lost"),
        };
        eprintln!("ttraced: job {}: {} ({state})", s.job, s.store.display());
        incomplete += usize::from(!s.finalized || s.lost_records > 0);
    }
    if incomplete > 0 {
        anyhow::bail!("{incomplete} job stores are incomplete (their manifests say why)");
    }
    Ok(())
}
