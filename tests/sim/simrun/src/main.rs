//! `simrun`: a single-node, torchrun-like launcher for tests on the simulated CUDA stack.
//!
//! It starts N copies of a command with the environment torchrun gives its workers (RANK,
//! WORLD_SIZE, MASTER_ADDR, ...), passes everything else through unchanged (LD_PRELOAD
//! included, so a tracer reaches every rank), forwards SIGINT/SIGTERM, and turns the ranks'
//! outcomes into one exit code the way a shell would. See `simrun --help`.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;

const LONG_ABOUT: &str = "\
Starts N copies (ranks) of CMD on this machine, the way `torchrun --standalone
--nproc-per-node N` does, for tests of distributed programs on the simulated CUDA stack.

Each rank gets, on top of simrun's own environment (passed through unchanged, LD_PRELOAD
included):
  RANK, LOCAL_RANK                 0..N-1
  WORLD_SIZE, LOCAL_WORLD_SIZE     N
  GROUP_RANK=0, GROUP_WORLD_SIZE=1, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME=default
  MASTER_ADDR, MASTER_PORT         the rendezvous address (a free port by default, so that
                                   concurrent runs do not collide)
  TORCHELASTIC_RUN_ID              --run-id, or a fresh id per run
  TORCHELASTIC_RESTART_COUNT=0, TORCHELASTIC_MAX_RESTARTS=0

Failures: when a rank fails (nonzero exit or death by a signal), simrun waits up to
--grace-period seconds for the others to end on their own (a peer of a dead rank usually fails
by itself, e.g. with an NCCL error), then sends SIGTERM to the survivors and SIGKILL after
--kill-timeout more seconds.

Signals: SIGINT and SIGTERM received by simrun are forwarded to every running rank; a second
one kills them with SIGKILL.

Exit status: 0 when every rank exited 0; otherwise the status of the first rank that failed,
as a shell reports it (its exit code, or 128+signal number when a signal killed it). If simrun
was interrupted and every rank still exited 0, it exits 128+signal number. 127 when CMD cannot
be started.";

const AFTER_HELP: &str = "\
Examples:
  simrun --nproc-per-node 2 -- sim-probe allreduce
  simrun --nproc-per-node 4 --prefix-output -- sh -c 'echo $RANK of $WORLD_SIZE'
  LD_PRELOAD=libttrace.so simrun --nproc-per-node 2 --master-port 29500 -- python train.py";

/// Command-line arguments.
#[derive(Parser, Debug)]
#[command(
    name = "simrun",
    version,
    about = "Start N ranks of a command with torchrun's environment (single node).",
    long_about = LONG_ABOUT,
    after_help = AFTER_HELP
)]
struct Args {
    /// Number of ranks to start.
    #[arg(
        long = "nproc-per-node",
        visible_alias = "nproc_per_node",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=4096)
    )]
    nproc_per_node: u32,

    /// MASTER_PORT given to every rank [default: a free port, chosen per run].
    #[arg(long = "master-port", visible_alias = "master_port", value_name = "PORT",
          value_parser = clap::value_parser!(u16).range(1..))]
    master_port: Option<u16>,

    /// MASTER_ADDR given to every rank.
    #[arg(
        long = "master-addr",
        visible_alias = "master_addr",
        value_name = "ADDR",
        default_value = "127.0.0.1"
    )]
    master_addr: String,

    /// TORCHELASTIC_RUN_ID given to every rank [default: a fresh id per run].
    #[arg(long = "run-id", visible_alias = "run_id", value_name = "ID")]
    run_id: Option<String>,

    /// Prefix each line a rank writes to stdout/stderr with `[rank R] ` (default: pass through).
    #[arg(long = "prefix-output")]
    prefix_output: bool,

    /// Seconds to wait, after the first rank failed, for the others to end by themselves.
    #[arg(long = "grace-period", value_name = "SECONDS", default_value = "10",
          value_parser = parse_seconds)]
    grace_period: Duration,

    /// Seconds between the SIGTERM and the SIGKILL sent to ranks that outlived the grace period.
    #[arg(long = "kill-timeout", value_name = "SECONDS", default_value = "5",
          value_parser = parse_seconds)]
    kill_timeout: Duration,

    /// The program to start and its arguments (after `--`).
    #[arg(
        value_name = "CMD",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

/// Parses a non-negative number of seconds (fractions allowed).
fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|e| format!("`{s}` is not a number of seconds: {e}"))?;
    Duration::try_from_secs_f64(secs).map_err(|e| format!("`{s}`: {e}"))
}

/// Number of SIGINT/SIGTERM received so far (written by the signal handler).
static SIGNALS_RECEIVED: AtomicUsize = AtomicUsize::new(0);
/// The last signal received.
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only atomics here: async-signal-safe. The main loop does the forwarding.
    LAST_SIGNAL.store(sig, Ordering::SeqCst);
    SIGNALS_RECEIVED.fetch_add(1, Ordering::SeqCst);
}

/// Catches SIGINT and SIGTERM. Caught signals revert to their default action across `exec`, so
/// the ranks start with the usual dispositions.
fn install_signal_handlers() -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid starting point; the handler only touches
        // atomics, and SA_RESTART keeps the main loop's syscalls from failing with EINTR.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A free TCP port on the loopback interface. Another process could take it before rank 0
/// binds it; torchrun has the same window.
fn free_port() -> std::io::Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
}

/// The exit status as a shell reports it: the exit code, or 128 + the signal number.
fn shell_code(st: ExitStatus) -> u8 {
    match (st.code(), st.signal()) {
        (Some(c), _) => (c & 0xff) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        (None, None) => 1,
    }
}

/// Describes how a rank ended, for simrun's messages.
fn describe(st: ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s} (status {})", shell_code(st)),
        (None, None) => format!("{st}"),
    }
}

/// One started rank.
struct Rank {
    rank: u32,
    child: Child,
    status: Option<ExitStatus>,
}

impl Rank {
    /// Sends `sig` if the rank has not been reaped yet (so its pid cannot have been reused).
    fn signal(&self, sig: libc::c_int) {
        if self.status.is_none() {
            let Ok(pid) = libc::pid_t::try_from(self.child.id()) else {
                return;
            };
            // SAFETY: kill(2) on our own unreaped child; errors (already exited) are harmless.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }
}

/// Copies `src` to our stdout or stderr line by line, each line prefixed with `[rank R] `.
/// A whole line is written under the stream's lock, so ranks' lines never interleave.
fn prefix_lines(
    rank: u32,
    src: impl Read + Send + 'static,
    to_stderr: bool,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!(
            "rank{rank}-{}",
            if to_stderr { "err" } else { "out" }
        ))
        .spawn(move || {
            let mut reader = BufReader::new(src);
            let prefix = format!("[rank {rank}] ");
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if line.last() != Some(&b'\n') {
                    line.push(b'\n');
                }
                let mut buf = Vec::with_capacity(prefix.len() + line.len());
                buf.extend_from_slice(prefix.as_bytes());
                buf.extend_from_slice(&line);
                // Write errors (our stdout closed) are ignored: keep draining so the rank
                // never blocks on a full pipe.
                let _ = if to_stderr {
                    std::io::stderr().lock().write_all(&buf)
                } else {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&buf).and_then(|()| out.flush())
                };
            }
        })
}

/// Starts rank `rank` of `args.command`.
fn spawn_rank(
    args: &Args,
    rank: u32,
    port: u16,
    run_id: &str,
    pumps: &mut Vec<JoinHandle<()>>,
) -> std::io::Result<Child> {
    let n = args.nproc_per_node.to_string();
    let r = rank.to_string();
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("RANK", &r)
        .env("LOCAL_RANK", &r)
        .env("ROLE_RANK", &r)
        .env("WORLD_SIZE", &n)
        .env("LOCAL_WORLD_SIZE", &n)
        .env("ROLE_WORLD_SIZE", &n)
        .env("GROUP_RANK", "0")
        .env("GROUP_WORLD_SIZE", "1")
        .env("ROLE_NAME", "default")
        .env("MASTER_ADDR", &args.master_addr)
        .env("MASTER_PORT", port.to_string())
        .env("TORCHELASTIC_RUN_ID", run_id)
        .env("TORCHELASTIC_RESTART_COUNT", "0")
        .env("TORCHELASTIC_MAX_RESTARTS", "0");
    if args.prefix_output {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let mut child = cmd.spawn()?;
    if let Some(out) = child.stdout.take() {
        pumps.push(prefix_lines(rank, out, false)?);
    }
    if let Some(err) = child.stderr.take() {
        pumps.push(prefix_lines(rank, err, true)?);
    }
    Ok(child)
}

/// Runs the ranks to completion and returns simrun's exit code.
fn run(args: &Args) -> u8 {
    if let Err(e) = install_signal_handlers() {
        eprintln!("simrun: cannot install signal handlers: {e}");
        return 1;
    }
    let port = match args.master_port {
        Some(p) => p,
        None => match free_port() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("simrun: cannot find a free port: {e}");
                return 1;
            }
        },
    };
    let run_id = args.run_id.clone().unwrap_or_else(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("simrun-{}-{nanos:x}", std::process::id())
    });

    let mut ranks: Vec<Rank> = Vec::new();
    let mut pumps = Vec::new();
    for rank in 0..args.nproc_per_node {
        match spawn_rank(args, rank, port, &run_id, &mut pumps) {
            Ok(child) => ranks.push(Rank {
                rank,
                child,
                status: None,
            }),
            Err(e) => {
                eprintln!(
                    "simrun: cannot start rank {rank} ({}): {e}",
                    args.command[0].to_string_lossy()
                );
                for r in &mut ranks {
                    r.signal(libc::SIGKILL);
                    let _ = r.child.wait();
                }
                return 127;
            }
        }
    }

    let mut first_failure: Option<(u32, ExitStatus)> = None;
    let mut term_at: Option<Instant> = None;
    let mut kill_at: Option<Instant> = None;
    let mut signals_seen = 0;
    let mut interrupted: Option<i32> = None;
    loop {
        let received = SIGNALS_RECEIVED.load(Ordering::SeqCst);
        if received > signals_seen {
            let sig = LAST_SIGNAL.load(Ordering::SeqCst);
            // The first signal is forwarded as is; any later one means "now".
            let fwd = if signals_seen == 0 {
                sig
            } else {
                libc::SIGKILL
            };
            signals_seen = received;
            interrupted = Some(sig);
            for r in &ranks {
                r.signal(fwd);
            }
        }

        for r in &mut ranks {
            if r.status.is_some() {
                continue;
            }
            match r.child.try_wait() {
                Ok(Some(st)) => {
                    r.status = Some(st);
                    if !st.success() && first_failure.is_none() {
                        first_failure = Some((r.rank, st));
                        eprintln!(
                            "simrun: rank {} failed with {}; waiting up to {:?} for the others",
                            r.rank,
                            describe(st),
                            args.grace_period
                        );
                        term_at = Some(Instant::now() + args.grace_period);
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    // Cannot happen for our own child; treat it as a failed rank.
                    eprintln!("simrun: cannot wait for rank {}: {e}", r.rank);
                    let st = ExitStatus::from_raw(1 << 8);
                    r.status = Some(st);
                    first_failure.get_or_insert((r.rank, st));
                    term_at.get_or_insert(Instant::now() + args.grace_period);
                }
            }
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            break;
        }

        let now = Instant::now();
        if term_at.is_some_and(|t| now >= t) {
            term_at = None;
            eprintln!("simrun: grace period over; sending SIGTERM to the remaining ranks");
            for r in &ranks {
                r.signal(libc::SIGTERM);
            }
            kill_at = Some(now + args.kill_timeout);
        }
        if kill_at.is_some_and(|t| now >= t) {
            kill_at = None;
            eprintln!("simrun: sending SIGKILL to the remaining ranks");
            for r in &ranks {
                r.signal(libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    // The pipes close when the ranks and anything they started that inherited them are gone.
    // A background process a rank left behind may hold them open for long: give the copies a
    // moment to drain what the ranks wrote, then leave.
    let drain_until = Instant::now() + Duration::from_secs(2);
    while !pumps.iter().all(JoinHandle::is_finished) && Instant::now() < drain_until {
        std::thread::sleep(Duration::from_millis(10));
    }
    match (first_failure, interrupted) {
        (Some((_, st)), _) => shell_code(st),
        (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
        (None, None) => 0,
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    ExitCode::from(run(&args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_codes() {
        assert_eq!(shell_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(shell_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(shell_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
        assert_eq!(shell_code(ExitStatus::from_raw(libc::SIGTERM)), 143);
    }

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds("0.25"), Ok(Duration::from_millis(250)));
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("soon").is_err());
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Args::command().debug_assert();
        let a = Args::try_parse_from(["simrun", "--nproc-per-node", "2", "--", "prog", "-x"])
            .expect("parses");
        assert_eq!(a.nproc_per_node, 2);
        assert_eq!(
            a.command,
            vec![OsString::from("prog"), OsString::from("-x")]
        );
        assert!(Args::try_parse_from(["simrun", "--nproc-per-node", "0", "--", "p"]).is_err());
    }
}
