//! `ttrace`, the command-line front end: `ttrace run` traces a command into a store; `ls`,
//! `show`, `stats`, `export`, `fsck` read it; `check` and `compare` judge it.

// The commands' doc comments are their `--help` text, written for a terminal: `<redacted>`
// and `<UTC time>` there are words, not HTML.
#![allow(rustdoc::invalid_html_tags)]

/// mimalloc: compare allocates and frees many buffers from every thread, and glibc's malloc
/// spent a tenth of the demo comparison in its arenas (`_int_free`, `malloc_consolidate`);
/// with mimalloc the demo compares in 0.88x the time, the large benchmark config in 0.96-0.99x
/// (docs/compare.md, section 6). Transparent huge pages are off (the `no_thp` feature): their
/// compaction stalls made some comparisons slower, not faster.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod allocator;
mod check;
mod child_wait;
mod compare;
mod dump;
mod export;
mod fsck;
mod ls;
mod progress;
mod reading;
mod report;
mod report_out;
mod run;
mod show;
mod units;

use clap::{Parser, Subcommand};

/// Find silent bugs in distributed training by tracing what the GPUs computed.
///
/// `ttrace run -- CMD` runs CMD with libttrace.so preloaded into every process it starts.
/// Each process snapshots the tensors of its CUDA memcpys, cuBLAS/cuBLASLt GEMMs and NCCL
/// collectives and streams them to a collector (ttraced, embedded in `ttrace run`), which files
/// them by rank and step into a trace store (a directory; format in docs/format.md).
///
/// Examples:
///
///   ttrace run -- torchrun --nproc-per-node 8 train.py
///
///   ttrace run --steps 0-1 --apis gemm,nccl --out runs/tp2 -- python train.py --tp 2
///
///   ttraced --socket /tmp/tt/s --store runs/all &  ttrace run --daemon /tmp/tt/s -- CMD
#[derive(Parser, Debug)]
#[command(name = "ttrace", version, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    Run(run::RunArgs),
    Dump(dump::DumpArgs),
    Ls(ls::LsArgs),
    Show(show::ShowArgs),
    Stats(show::StatsArgs),
    Export(export::ExportArgs),
    Fsck(fsck::FsckArgs),
    Check(check::CheckArgs),
    Compare(compare::CompareArgs),
    Report(report::ReportArgs),
}

/// An error and its causes on one line, each said once: a cause whose text the message before
/// it already contains (`{path}: {source}` over `source`) is not repeated.
pub(crate) fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Exit status of a reading command: 0, or 2 with the error on stderr (a closed stdout pipe,
/// `ttrace ls RUN | head`, is not an error).
fn status(cmd: &str, r: anyhow::Result<i32>) -> i32 {
    match r {
        Ok(code) => code,
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            0
        }
        Err(e) => {
            eprintln!("ttrace {cmd}: {}", error_chain(&e));
            2
        }
    }
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TTRACE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Run(args) => run::main(args),
        Command::Dump(args) => match dump::main(args) {
            Ok(()) => 0,
            // `ttrace dump RUN | head`: the reader left, which is fine.
            Err(e)
                if e.downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
            {
                0
            }
            Err(e) => {
                eprintln!("ttrace dump: {e:#}");
                2
            }
        },
        Command::Ls(a) => status("ls", ls::main(a).map(|()| 0)),
        Command::Show(a) => status("show", show::main(a).map(|()| 0)),
        Command::Stats(a) => status("stats", show::stats_main(a).map(|()| 0)),
        Command::Export(a) => status("export", export::main(a).map(|()| 0)),
        Command::Fsck(a) => status("fsck", fsck::main(a)),
        Command::Check(a) => status("check", check::main(a)),
        Command::Compare(a) => status("compare", compare::main(a)),
        Command::Report(a) => status("report merge", report::main(a)),
    };
    allocator::keep_freed_memory_until_exit();
    std::process::exit(code);
}
