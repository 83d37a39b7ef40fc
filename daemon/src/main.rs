//! `ttraced`: a standalone trace collector. `ttrace run` embeds the same daemon; run this one
//! when several commands (or several `ttrace run --daemon SOCKET`) should trace into one store.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

/// Collect ttrace snapshots into a trace store until SIGINT, SIGTERM or SIGHUP.
///
/// Exits 1 when records were lost (the store is then incomplete; manifest.json says why).
///
/// Traced processes find the daemon through TTRACE_SOCKET (`ttrace run --daemon SOCKET -- CMD`
/// sets it). On SIGINT/SIGTERM the daemon stops accepting, waits for connected processes to
/// leave (up to --wait seconds), writes what they published, and finalises the manifest.
#[derive(Parser, Debug)]
#[command(name = "ttraced", version)]
struct Args {
    /// Unix socket to listen on (its directory is created 0700 when missing).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Store directory for the run (created 0700; must not hold a run already).
    #[arg(long, value_name = "DIR")]
    store: PathBuf,
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
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Async-signal-safe: an atomic store only.
    STOP.store(true, Ordering::SeqCst);
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TTRACE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    // HUP too: a daemon started from a shell that goes away finalises its store instead of
    // dying with it unfinalised.
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installs a handler that only stores to an atomic; a zeroed sigaction with
        // an empty mask is a valid argument.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            anyhow::bail!("cannot install a handler for signal {sig}");
        }
    }
    let mut config = ttraced::Config::new(&args.socket, &args.store);
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
    let lost: u64 = s.lost.iter().map(|l| l.records).sum();
    if lost > 0 {
        for l in &s.lost {
            eprintln!("ttraced: {} records lost: {}", l.records, l.cause);
        }
        anyhow::bail!("the trace is incomplete: {lost} records could not be stored");
    }
    Ok(())
}
