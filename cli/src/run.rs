//! `ttrace run`: trace a command into a store.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use clap::Args;
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use ttrace_format::config::{CaptureConfig, Family, RangeSet, StepRule};
use ttraced::{Config, Daemon, Summary};

use crate::progress::Progress;
use crate::units::{human, parse_bytes};

/// Exit code of `ttrace run` when it fails before or around the command (as `env` and
/// `timeout` use 125 for their own failures).
const EXIT_TTRACE: i32 = 125;
/// Exit code of `ttrace run --strict` when the command succeeded but the trace is incomplete
/// (see [`incomplete`]): sysexits' `EX_IOERR`.
const EXIT_INCOMPLETE: i32 = 74;
/// Signals a scheduler or a terminal sends that `ttrace run` forwards to the command (Slurm
/// sends USR1/USR2 ahead of a time limit, HUP when the session ends).
const FORWARDED: [Signal; 6] = [
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGTERM,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Trace a command: run it with libttrace.so preloaded and collect its snapshots into a store.
///
/// Every process CMD starts (torchrun workers, MPI ranks, helpers) inherits the library and
/// the capture settings through its environment; a process that never calls CUDA is not
/// affected. When CMD exits, ttrace waits for the traced processes' last snapshots, closes the
/// store and prints a summary. It exits with CMD's exit code (128+N if a signal N killed it);
/// 125 means ttrace itself failed, 126/127 that CMD could not be executed / found, 2 that an
/// option was malformed.
///
/// A trace is *incomplete* when the collector could not store every record it received (a
/// full disk, a failed write; the summary and manifest.json say how many and why), could not
/// finalize the store, a process ended with snapshots it never published (it crashed), or the
/// store holds gap records (ops or tensors that were not captured: a full ring, a copy the
/// runtime refused, an entry point ttrace does not capture; `ttrace ls` lists them by rank and
/// reason). The summary says which, also under -q, as `ttrace compare` and `ttrace check` do
/// (they never call such a capture clean). ttrace still exits with CMD's code; with --strict,
/// a CMD that exited 0 over an incomplete trace makes ttrace exit 74 instead.
///
/// SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1 and SIGUSR2 sent to ttrace are forwarded to CMD
/// (a Ctrl-C at the terminal already reaches CMD and is not sent twice); ttrace itself keeps
/// running until CMD exits, then finalizes the store.
///
/// TTRACE_* variables inherited from the shell do not reach CMD: the options below (whose
/// defaults they do not change) set them. One line names each one ignored.
///
/// The manifest records CMD's environment with the values of credential-looking variables
/// (*SECRET*, *TOKEN*, *PASSWORD*, *_KEY, ...) and URL passwords replaced by <redacted>;
/// --env-allow keeps named ones.
///
/// The store (default ttrace-runs/<UTC time>-<id>) holds manifest.json (command, working
/// directory, environment, capture settings, ranks, communicators) and one segment per rank
/// and step; see docs/format.md.
///
/// Examples:
///
///   ttrace run -- torchrun --nproc-per-node 2 train.py
///
///   ttrace run --steps 0-3 --apis gemm,nccl --no-kernels --out runs/ref -- python train.py
///
///   ttrace run --step-rule nvtx:train_step --max-tensor-bytes 64M -- ./train
///
///   ttrace run --out ref -- ./train  &&  ttrace run --perturb --out ref-perturbed -- ./train
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct RunArgs {
    /// Store directory for this run [default: ttrace-runs/<UTC time>-<id>].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Send the snapshots to a running ttraced (its --socket) instead of an embedded
    /// collector; the store is then that daemon's.
    #[arg(long, value_name = "SOCKET", env = "TTRACE_DAEMON")]
    daemon: Option<PathBuf>,
    /// Families of calls to capture: memcpy, gemm, nccl (comma-separated).
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "memcpy,gemm,nccl"
    )]
    apis: Vec<Family>,
    /// Steps to capture, e.g. 0-3,7 [default: all].
    #[arg(long, value_name = "RANGES")]
    steps: Option<RangeSet>,
    /// Global ranks to capture, e.g. 0,2-3 [default: all].
    #[arg(long, value_name = "RANGES")]
    ranks: Option<RangeSet>,
    /// Tensors larger than this keep their metadata only (K, M, G suffixes).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, default_value = "64G")]
    max_tensor_bytes: u64,
    /// Do not capture op inputs (GEMM A/B/C, collective inputs): outputs only.
    #[arg(long)]
    no_inputs: bool,
    /// Do not record kernel launch names between captured ops.
    #[arg(long)]
    no_kernels: bool,
    /// Store every tensor's bytes, also when its (rank, step) already holds the same bytes
    /// (by default they are stored once and referenced: docs/format.md, codec 5).
    #[arg(long)]
    no_dedup: bool,
    /// Snapshot ring per traced process (pinned host memory), 64K..=64G, or `auto`: 1/64 of
    /// the memory the process may use (host or cgroup limit) divided among the node's ranks,
    /// 256M..=1G. A larger ring keeps more capture work in flight (faster on large tensors).
    #[arg(long, value_name = "BYTES", value_parser = parse_ring_bytes, default_value = "auto")]
    ring_bytes: u64,
    /// How long a capture waits for ring space before recording a gap instead (at most an
    /// hour).
    #[arg(long, value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    wait_ms: u64,
    /// The most each traced process waits on the collector over its whole run (ring space,
    /// its first connection); once spent, an op that does not fit at once is recorded as a
    /// gap, so a stalled collector delays the job by at most this.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    max_stall_ms: u64,
    /// How steps are numbered: auto (no code change), nvtx:NAME (an NVTX range pushed or
    /// started, or a mark, named NAME starts a step: PyTorch's torch.cuda.nvtx.range("NAME")
    /// around each iteration), api (ttrace_step() from include/ttrace.h). A process that never
    /// saw its mark says so at exit.
    #[arg(long, value_name = "RULE", default_value = "auto")]
    step_rule: StepRule,
    /// Make this a perturbed reference run, for tolerances: every F32/F16/BF16 GEMM output
    /// (cuBLAS, cuBLASLt) gets round-off-sized noise, its last mantissa bit flipped in about
    /// half its elements (±1 ulp, one rounding's worth; drawn from SEED, the rank and the call
    /// number, so a seed reproduces its run bit for bit). Run the reference command twice,
    /// plainly and with --perturb, then `ttrace compare REF RUN --perturbed PERTURBED_REF`
    /// measures per tensor how much such a disturbance grows through the network and sets the
    /// tolerance from it. Slow (each GEMM waits for its output); for a reference run, not a
    /// run under test. [default SEED: 1]
    #[arg(
        long,
        value_name = "SEED",
        env = "TTRACE_PERTURB",
        value_parser = parse_seed,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "1"
    )]
    perturb: Option<u64>,
    /// zstd level of stored tensors: 0 stores raw bytes, 1..22 trade speed for size, negative
    /// levels are zstd's fast modes [default: -1000; float mantissa planes are stored raw and
    /// the rest zstd-compressed, about as small as level 1 on float activations and faster].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    level: Option<i32>,
    /// Compression threads of the embedded collector, 1..=256 [default: the cores, at most 8].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=256))]
    threads: Option<u64>,
    /// Seconds to wait, once CMD has exited, for traced processes it left running (at most a
    /// week).
    #[arg(long, value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(0..=7 * 24 * 3600))]
    linger: u64,
    /// Exit 74 when CMD exited 0 but the trace is incomplete (records lost, store not
    /// finalized, snapshots never published, gap records).
    #[arg(long)]
    strict: bool,
    /// Environment variables to record verbatim in the manifest although their names look
    /// like credentials (comma-separated names).
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    env_allow: Vec<String>,
    /// Print no summary.
    #[arg(long, short)]
    quiet: bool,
    /// The command to trace, with its arguments (put `--` before it).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<OsString>,
}

/// A `--perturb` seed (also read from `TTRACE_PERTURB`, hence the variable in the message).
fn parse_seed(s: &str) -> Result<u64, String> {
    s.trim().parse().map_err(|_| {
        format!(
            "`{s}` is not a seed: expected an unsigned 64-bit number (--perturb=SEED or \
             TTRACE_PERTURB=SEED)"
        )
    })
}

/// A ring size: the pinned memory a traced process sets aside, so bounded both ways.
/// A ring size, or `auto` (0: each process sizes its own, `config::auto_ring_bytes`).
fn parse_ring_bytes(s: &str) -> Result<u64, String> {
    if s.trim() == "auto" {
        return Ok(0);
    }
    let n = parse_bytes(s)?;
    if !(64 << 10..=64 << 30).contains(&n) {
        return Err(format!("{s}: a ring holds between 64K and 64G"));
    }
    Ok(n)
}

/// Runs `ttrace run`; returns the process exit code.
pub fn main(args: RunArgs) -> i32 {
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ttrace run: {}", crate::error_chain(&e));
            EXIT_TTRACE
        }
    }
}

/// The capture configuration the options describe (each already parsed by clap into its
/// model type; `TTRACE_LOG` is not part of it: it goes to the command as the user set it).
fn capture_config(a: &RunArgs) -> anyhow::Result<CaptureConfig> {
    let mut families = a.apis.clone();
    families.sort();
    families.dedup();
    if families.is_empty() {
        bail!("--apis: nothing to capture (memcpy, gemm, nccl)");
    }
    Ok(CaptureConfig {
        socket: None,
        families,
        steps: a.steps.clone(),
        ranks: a.ranks.clone(),
        max_tensor_bytes: a.max_tensor_bytes,
        inputs: !a.no_inputs,
        kernels: !a.no_kernels,
        ring_bytes: a.ring_bytes,
        wait_ms: a.wait_ms,
        max_stall_ms: a.max_stall_ms,
        step_rule: a.step_rule.clone(),
        perturb: a.perturb,
        dedup: !a.no_dedup,
    })
}

/// libttrace.so: `TTRACE_LIB`, else next to this executable.
fn find_lib() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("TTRACE_LIB").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("TTRACE_LIB={} does not name a file", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("cannot locate the ttrace executable")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let lib = dir.join("libttrace.so");
    if !lib.is_file() {
        bail!(
            "libttrace.so is not next to {} — build it (cargo build --release -p \
             ttrace-intercept) or point TTRACE_LIB at it",
            exe.display()
        );
    }
    Ok(lib)
}

// Signals received (written by the handler; only atomics there): a count of all, and per
// signal number those to forward.
static SIGNALS: AtomicUsize = AtomicUsize::new(0);
static PENDING: [AtomicUsize; 32] = [const { AtomicUsize::new(0) }; 32];

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // A terminal's Ctrl-C (si_code SI_KERNEL) went to the whole foreground process group, CMD
    // included: forwarding it would deliver it twice. Signals sent to ttrace itself (kill,
    // a scheduler) are forwarded.
    let code = if info.is_null() {
        libc::SI_USER
    } else {
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        unsafe { (*info).si_code }
    };
    if code != libc::SI_KERNEL {
        if let Some(p) = PENDING.get(sig as usize) {
            p.fetch_add(1, Ordering::SeqCst);
        }
    }
    SIGNALS.fetch_add(1, Ordering::SeqCst);
    crate::child_wait::wake();
}

fn install_signal_handlers() -> anyhow::Result<()> {
    crate::child_wait::install();
    // SigHandler::SigAction adds SA_SIGINFO.
    let handler = SigAction::new(
        SigHandler::SigAction(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in FORWARDED {
        // SAFETY: the handler is async-signal-safe: it only touches atomics. The child gets
        // default dispositions back at exec.
        unsafe { sigaction(sig, &handler) }.with_context(|| format!("cannot handle {sig}"))?;
    }
    Ok(())
}

/// The exit code a shell would report.
fn shell_code(st: ExitStatus) -> i32 {
    match (st.code(), st.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => EXIT_TTRACE,
    }
}

/// Where the collector listens: a fresh `0700` directory under `$XDG_RUNTIME_DIR` or `/tmp`.
fn socket_dir(id: &str) -> anyhow::Result<PathBuf> {
    let name = format!("ttrace-{id}");
    let mut bases = Vec::new();
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        bases.push(PathBuf::from(x));
    }
    bases.push(std::env::temp_dir());
    bases.push(PathBuf::from("/tmp"));
    let mut last = None;
    for base in bases {
        let dir = base.join(&name);
        // sun_path holds 108 bytes.
        if dir.join("ttraced.sock").as_os_str().len() >= 100 || !base.is_dir() {
            continue;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) => last = Some(anyhow::anyhow!("{}: {e}", dir.display())),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no directory for the collector's socket")))
}

/// `ttrace-runs/20250102T030405Z-1a2b3c` under the current directory.
fn default_out(run_id: &str) -> PathBuf {
    let ts: String = humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect();
    PathBuf::from("ttrace-runs").join(format!("{ts}-{}", &run_id[..6.min(run_id.len())]))
}

enum Collector {
    Embedded {
        handle: ttraced::Handle,
        sock_dir: PathBuf,
        /// `--out` existed before (an empty directory the user made).
        out_existed: bool,
    },
    Joined(PathBuf),
}

fn run(args: RunArgs) -> anyhow::Result<i32> {
    let mut capture = capture_config(&args)?;
    let lib = find_lib()?;
    let command: Vec<String> = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let ignored = inherited_ttrace_vars();
    warn_ignored(&ignored);
    install_signal_handlers()?;

    // Every process of the command is one job, whatever launcher sits in between (a daemon
    // keeps jobs apart by this name).
    let job = ttraced::new_run_id();
    let collector = match &args.daemon {
        Some(sock) => join_daemon(&args, sock)?,
        None => start_collector(&args, &mut capture, &lib, &command, &cwd, &job)?,
    };
    if let Collector::Joined(sock) = &collector {
        capture.socket = Some(sock.display().to_string());
    }
    let env = child_env(&lib, &capture, &job);

    let started = Instant::now();
    let (code, how, ran) = run_command(&args.command, &ignored, &env)?;
    let cmd_time = started.elapsed();

    match collector {
        Collector::Joined(sock) => {
            if !args.quiet {
                eprintln!(
                    "ttrace: `{}` {how}; its snapshots went to the ttraced at {}",
                    command.join(" "),
                    sock.display()
                );
                if let Some(seed) = capture.perturb {
                    eprint!("{}", perturb_note(seed, None, "PERTURBED_REF"));
                }
            }
            Ok(code)
        }
        Collector::Embedded {
            handle,
            sock_dir,
            out_existed,
        } => {
            let ended = CommandEnd {
                code,
                how,
                ran,
                time: cmd_time,
            };
            let r = finish_embedded(&args, &capture, handle, out_existed, &command, &cwd, ended);
            let _ = std::fs::remove_dir(&sock_dir);
            r
        }
    }
}

/// How the traced command ended.
struct CommandEnd {
    /// Its exit code as a shell reports it.
    code: i32,
    /// In words ("exited with status 0").
    how: String,
    /// Whether it started at all.
    ran: bool,
    time: Duration,
}

/// Says which inherited `TTRACE_*` variables are ignored, and the option to use instead.
fn warn_ignored(ignored: &[OsString]) {
    for k in ignored {
        let k = k.to_string_lossy();
        let option = match k.as_ref() {
            "TTRACE_APIS" => "; use --apis",
            "TTRACE_STEPS" => "; use --steps",
            "TTRACE_RANKS" => "; use --ranks",
            "TTRACE_MAX_TENSOR_BYTES" => "; use --max-tensor-bytes",
            "TTRACE_INPUTS" => "; use --no-inputs",
            "TTRACE_KERNELS" => "; use --no-kernels",
            "TTRACE_DEDUP" => "; use --no-dedup",
            "TTRACE_RING_BYTES" => "; use --ring-bytes",
            "TTRACE_WAIT_MS" => "; use --wait-ms",
            "TTRACE_STEP_RULE" => "; use --step-rule",
            _ => "",
        };
        eprintln!(
            "ttrace run: ignoring {k} from the environment: ttrace run's options set the \
             capture{option}"
        );
    }
}

/// Runs the command with the traced environment `env` (less the `ignored` variables),
/// forwarding signals; returns its exit code, how it ended, and whether it started.
fn run_command(
    command: &[OsString],
    ignored: &[OsString],
    env: &BTreeMap<String, String>,
) -> anyhow::Result<(i32, String, bool)> {
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]);
    for k in ignored {
        cmd.env_remove(k);
    }
    // `TTRACE=0` in the shell would make the library a pass-through: `ttrace run` means capture.
    cmd.env_remove("TTRACE");
    let spawned = cmd
        .envs(
            env.iter()
                .filter(|(k, _)| k.starts_with("TTRACE_") || *k == "LD_PRELOAD"),
        )
        .spawn();
    Ok(match spawned {
        Ok(child) => {
            let st = wait_forwarding(child)?;
            (shell_code(st), describe(st), true)
        }
        Err(e) => {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => 127,
                std::io::ErrorKind::PermissionDenied => 126,
                _ => EXIT_TTRACE,
            };
            eprintln!(
                "ttrace run: cannot execute {}: {e}",
                command[0].to_string_lossy()
            );
            (code, format!("not started ({e})"), false)
        }
    })
}

/// Finalizes the embedded collector's store once the command ended, prints the summary, and
/// returns ttrace run's exit code.
fn finish_embedded(
    args: &RunArgs,
    capture: &CaptureConfig,
    handle: ttraced::Handle,
    out_existed: bool,
    command: &[String],
    cwd: &Path,
    end: CommandEnd,
) -> anyhow::Result<i32> {
    let store = handle.store().to_path_buf();
    let summary = finalize(handle, end.code, Duration::from_secs(args.linger));
    let summary = match summary {
        Ok(s) => s,
        Err(e) => {
            // The command's own exit code is what the caller needs most; the trace's
            // failure is said, and --strict turns it into 74.
            eprintln!(
                "ttrace run: the trace is INCOMPLETE: {}",
                crate::error_chain(&e)
            );
            return Ok(strict_code(args, end.code, true));
        }
    };
    if !end.ran && summary.processes.is_empty() {
        // Nothing ran, nothing was stored: leave no store behind, so that the same
        // --out works once the command is fixed.
        abandon_store(&store, out_existed);
        return Ok(end.code);
    }
    if !args.quiet {
        eprint!("{}", render(&summary, command, &end.how, end.time, cwd));
        if let Some(seed) = capture.perturb {
            let store = summary.store.strip_prefix(cwd).unwrap_or(&summary.store);
            let stored = perturbed_outputs(&summary.store);
            eprint!(
                "{}",
                perturb_note(seed, stored, &store.display().to_string())
            );
        }
    } else if incomplete(&summary) {
        eprint!("{}", render_lost(&summary));
    }
    Ok(strict_code(args, end.code, incomplete(&summary)))
}

/// Whether a finalized trace is incomplete: records received and not stored, snapshots a
/// process took and never published, or gap records (what was not captured). The same losses
/// make `ttrace compare` and `ttrace check` exit 5 rather than call a capture clean.
fn incomplete(s: &Summary) -> bool {
    !s.lost.is_empty() || s.processes.iter().any(|p| p.unpublished > 0) || s.gaps > 0
}

/// `ttrace run`'s exit code: the command's, unless `--strict` and the command succeeded over
/// an incomplete trace.
fn strict_code(args: &RunArgs, code: i32, incomplete: bool) -> i32 {
    if args.strict && incomplete && code == 0 {
        EXIT_INCOMPLETE
    } else {
        code
    }
}

/// Removes the files of a store that never held a record (the manifest, the lock), and the
/// directory when `ttrace run` created it. Anything else in it stays.
fn abandon_store(store: &Path, existed: bool) {
    let _ = std::fs::remove_file(ttrace_format::store::manifest_path(store));
    let _ = std::fs::remove_file(store.join(ttraced::store_dir::LOCK_FILE));
    let _ = std::fs::remove_file(store.join(ttraced::store_dir::RESERVE_FILE));
    if !existed {
        let _ = std::fs::remove_dir(store);
    }
}

/// `TTRACE_*` variables in ttrace's own environment that must not reach the command: the
/// capture settings come from the options (and are recorded in the manifest as such). The
/// ones ttrace run reads itself (`TTRACE_LIB`, `TTRACE_DAEMON`, `TTRACE_PERTURB`, `TTRACE_LOG`)
/// are applied, not ignored.
fn inherited_ttrace_vars() -> Vec<OsString> {
    const APPLIED: [&str; 4] = [
        "TTRACE_LIB",
        "TTRACE_DAEMON",
        "TTRACE_PERTURB",
        "TTRACE_LOG",
    ];
    std::env::vars_os()
        .map(|(k, _)| k)
        .filter(|k| {
            use std::os::unix::ffi::OsStrExt;
            k.as_bytes().starts_with(b"TTRACE_") && !APPLIED.iter().any(|a| k == a)
        })
        .collect()
}

/// `--daemon SOCKET`: checks the socket and the options that belong to the daemon.
fn join_daemon(args: &RunArgs, sock: &Path) -> anyhow::Result<Collector> {
    if args.out.is_some() || args.level.is_some() || args.threads.is_some() {
        bail!("--out, --level and --threads belong to the daemon when --daemon is given");
    }
    let meta = std::fs::metadata(sock)
        .with_context(|| format!("--daemon {}: no such socket", sock.display()))?;
    if !meta.file_type().is_socket() {
        bail!("--daemon {}: not a socket", sock.display());
    }
    Ok(Collector::Joined(std::path::absolute(sock)?))
}

/// Starts the embedded collector on a fresh socket and the store.
fn start_collector(
    args: &RunArgs,
    capture: &mut CaptureConfig,
    lib: &Path,
    command: &[String],
    cwd: &Path,
    job: &str,
) -> anyhow::Result<Collector> {
    let run_id = job.to_string();
    let out = args.out.clone().unwrap_or_else(|| default_out(&run_id));
    let out = std::path::absolute(&out)?;
    let out_existed = std::fs::symlink_metadata(&out).is_ok();
    let sock_dir = socket_dir(&run_id[..12.min(run_id.len())])?;
    let mut config = Config::new(sock_dir.join("ttraced.sock"), &out);
    config.run.run_id = run_id;
    if let Some(l) = args.level {
        config.level = l;
    }
    if let Some(t) = args.threads {
        config.threads = t as usize;
    }
    capture.socket = Some(config.socket.display().to_string());
    config.run.command = command.to_vec();
    config.run.cwd = cwd.display().to_string();
    let mut env = child_env(lib, capture, job);
    ttrace_format::secrets::redact_env(&mut env, &args.env_allow);
    config.run.env = env;
    config.run.capture = capture.clone();
    config.run.job = Some(ttrace_format::wire::JobInfo {
        id: format!("ttrace:{job}"),
        label: job.to_string(),
        source: "TTRACE_JOB".into(),
    });
    match Daemon::start(config) {
        Ok(handle) => Ok(Collector::Embedded {
            handle,
            sock_dir,
            out_existed,
        }),
        Err(e) => {
            let _ = std::fs::remove_dir(&sock_dir);
            Err(e).context("starting the collector")
        }
    }
}

/// What the traced processes get on top of ttrace's own environment: `LD_PRELOAD` (appended
/// to an existing one) and the capture settings, less the inherited `TTRACE_*` variables
/// ttrace run does not apply ([`inherited_ttrace_vars`]), plus `TTRACE_JOB`: every process
/// the command starts is this one job.
fn child_env(lib: &Path, capture: &CaptureConfig, job: &str) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let lib = lib.display().to_string();
    let preload = match env.get("LD_PRELOAD").filter(|p| !p.trim().is_empty()) {
        Some(p) if p.split([':', ' ']).any(|x| x == lib) => p.clone(),
        Some(p) => format!("{p}:{lib}"),
        None => lib,
    };
    env.insert("LD_PRELOAD".into(), preload);
    for k in inherited_ttrace_vars() {
        env.remove(&*k.to_string_lossy());
    }
    env.remove("TTRACE");
    env.extend(capture.to_vars());
    env.insert("TTRACE_JOB".into(), job.to_string());
    env
}

fn describe(st: ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => format!("ended with {st}"),
    }
}

/// Waits for the command, forwarding the signals sent to ttrace ([`FORWARDED`]).
fn wait_forwarding(mut child: Child) -> anyhow::Result<ExitStatus> {
    use nix::unistd::Pid;
    // Sleeps until the command exits or a signal comes (else wakes up every 10 ms).
    let waiter = crate::child_wait::ChildWaiter::new(child.id());
    let mut forwarded = [0usize; 32];
    loop {
        if let Some(st) = child.try_wait().context("waiting for the command")? {
            return Ok(st);
        }
        for sig in FORWARDED {
            let n = sig as usize;
            let want = PENDING[n].load(Ordering::SeqCst);
            while forwarded[n] < want {
                forwarded[n] += 1;
                // Our own child, not yet reaped (try_wait said it runs), so the pid cannot
                // have been reused.
                let _ = nix::sys::signal::kill(Pid::from_raw(child.id() as i32), sig);
            }
        }
        match &waiter {
            Some(w) => w.wait(),
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Finalises the embedded collector, with a progress line when it takes a moment. A signal
/// during the wait for lingering processes cuts the wait short.
fn finalize(handle: ttraced::Handle, code: i32, linger: Duration) -> anyhow::Result<Summary> {
    let monitor = handle.monitor();
    let signals_before = SIGNALS.load(Ordering::SeqCst);
    let worker = std::thread::spawn(move || handle.finalize(Some(code), linger));
    let started = Instant::now();
    let mut bar: Option<Progress> = None;
    while !worker.is_finished() {
        std::thread::sleep(Duration::from_millis(50));
        if SIGNALS.load(Ordering::SeqCst) > signals_before {
            monitor.hurry();
        }
        if started.elapsed() < Duration::from_millis(500) {
            continue;
        }
        let p = monitor.progress();
        let b = bar.get_or_insert_with(Progress::spinner);
        b.message(format!(
            "finalising the store: {}/{} records written, {} processes still connected",
            p.records_written, p.records_received, p.clients_active
        ));
    }
    if let Some(b) = bar {
        b.finish();
    }
    match worker.join() {
        Ok(r) => r.context("finalising the store"),
        Err(_) => bail!("the collector panicked while finalising"),
    }
}

/// GEMM records of the store whose output was perturbed (F32, F16 or BF16 D), from the
/// records' metadata; `None` when the store cannot be read.
fn perturbed_outputs(store: &Path) -> Option<u64> {
    use ttrace_format::dtype::DType;
    use ttrace_format::record::{Op, Role};
    let st = ttrace_format::reader::Store::open(store).ok()?;
    let mut n = 0;
    for info in st.segments() {
        let seg = st.open_segment(info.rank, info.step).ok()?;
        for i in 0..seg.len() {
            let Ok(r) = seg.read_meta(i) else { continue };
            let perturbed = matches!(r.record.op, Op::Gemm(_))
                && r.record.tensors.iter().any(|t| {
                    t.role == Role::D && matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16)
                });
            n += u64::from(perturbed);
        }
    }
    Some(n)
}

/// The summary lines of a perturbed reference run.
fn perturb_note(seed: u64, stored: Option<u64>, store: &str) -> String {
    let n = stored.map_or(String::new(), |n| {
        format!("; {n} perturbed GEMM outputs stored")
    });
    format!(
        "  perturb   seed {seed}: F32/F16/BF16 GEMM outputs moved by ±1 ulp in about half their \
         elements{n}\n            a perturbed reference: ttrace compare REF RUN --perturbed \
         {store}\n"
    )
}

/// How a traced process ended, for the summary.
fn exit_note(p: &ttraced::ProcessSummary) -> String {
    match (&p.error, p.clean_exit, p.outlived_run) {
        (Some(e), _, _) => format!("dropped: {e}"),
        (None, true, _) => "clean".into(),
        (None, false, true) => "still running after --linger: disconnected".into(),
        (None, false, false) => "ended without goodbye (crashed?)".into(),
    }
}

/// The lines of the summary that say the trace is incomplete, and what processes warned about
/// their step numbering (empty when neither).
fn render_lost(s: &Summary) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let lost: u64 = s.lost.iter().map(|l| l.records).sum();
    if lost > 0 {
        let _ = writeln!(
            o,
            "  INCOMPLETE {lost} of {} records received could not be stored:",
            s.records + lost
        );
        for l in &s.lost {
            let _ = writeln!(o, "            {} records: {}", l.records, l.cause);
        }
    }
    for p in s.processes.iter().filter(|p| p.unpublished > 0) {
        let after = p.unpublished_after.map_or_else(
            || "before its first record".into(),
            |(step, seq)| format!("after step {step} seq {seq}"),
        );
        let _ = writeln!(
            o,
            "  INCOMPLETE rank {} (pid {}) ended with {} snapshots taken and not published, {after}",
            p.rank, p.pid, p.unpublished
        );
    }
    if let Some(line) = crate::ls::gaps_line(&s.gap_tally) {
        let _ = writeln!(o, "  {line}; `ttrace ls` lists them by rank");
    }
    let ranks = s
        .processes
        .iter()
        .map(|p| (p.rank, p.pid, p.warnings.as_slice()));
    for line in crate::ls::warning_lines(ranks, 3) {
        let _ = writeln!(o, "  {line}");
    }
    o
}

/// The summary printed after a run.
fn render(s: &Summary, command: &[String], how: &str, cmd: Duration, cwd: &Path) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let store = s.store.strip_prefix(cwd).unwrap_or(&s.store);
    let _ = writeln!(o, "ttrace: `{}` {how}", command.join(" "));
    let _ = writeln!(o, "  store     {}", store.display());
    let _ = writeln!(
        o,
        "  ranks     {} ({} processes{}), steps {}, records {}, gaps {}",
        s.ranks,
        s.processes.len(),
        if s.dropped_clients > 0 {
            format!(", {} dropped", s.dropped_clients)
        } else {
            String::new()
        },
        s.steps,
        s.records,
        s.gaps
    );
    let ratio = if s.bytes_stored > 0 {
        s.bytes_raw as f64 / s.bytes_stored as f64
    } else {
        1.0
    };
    let _ = writeln!(
        o,
        "  tensors   {} raw, {} stored (ratio {ratio:.2}x){}",
        human(s.bytes_raw),
        human(s.bytes_stored),
        if s.crc_mismatches > 0 {
            format!(", {} CHECKSUM MISMATCHES", s.crc_mismatches)
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        o,
        "  dedup     {}",
        crate::ls::dedup_note(s.bytes_raw, s.bytes_deduped)
    );
    o.push_str(&render_lost(s));
    if s.processes.is_empty() {
        let _ = writeln!(
            o,
            "  no traced process connected: did the command call CUDA? (TTRACE_LOG=info shows \
             what libttrace.so does)"
        );
    }
    let _ = writeln!(
        o,
        "  time      {:.2}s (command {:.2}s)",
        s.elapsed.as_secs_f64(),
        cmd.as_secs_f64()
    );
    if s.processes.len() > 1 && s.processes.len() <= 16 {
        let _ = writeln!(
            o,
            "  {:>5} {:>8} {:>6} {:>8} {:>5} {:>11} {:>11}  exit",
            "rank", "pid", "steps", "records", "gaps", "raw", "stored"
        );
        for p in &s.processes {
            let _ = writeln!(
                o,
                "  {:>5} {:>8} {:>6} {:>8} {:>5} {:>11} {:>11}  {}",
                p.rank,
                p.pid,
                p.steps,
                p.records,
                p.gaps,
                human(p.bytes_raw),
                human(p.bytes_stored),
                exit_note(p)
            );
        }
    } else {
        for p in s
            .processes
            .iter()
            .filter(|p| p.error.is_some() || !p.clean_exit)
        {
            let _ = writeln!(o, "  rank {} pid {}: {}", p.rank, p.pid, exit_note(p));
        }
    }
    o
}
