//! `ttrace report merge PART.json...`: join the partial reports of `ttrace compare
//! --partition I/N` into the report of the whole run.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use ttrace_compare::partition;
use ttrace_compare::report::text;

/// Work with compare reports.
#[derive(Args, Debug)]
pub struct ReportArgs {
    #[command(subcommand)]
    command: ReportCommand,
}

#[derive(Subcommand, Debug)]
enum ReportCommand {
    Merge(MergeArgs),
}

/// Join the partial reports of `ttrace compare --partition I/N` into the run's report.
///
/// Every partition's JSON report is needed (any order). The result is the verdict, text,
/// JSON and HTML one whole `ttrace compare` gives: the first divergence in run order across
/// the partitions, counts summed, the worst tensors over all. The stores the partitions
/// compared are read again (their metadata, and the few tensors replica drift looks at), at
/// the absolute paths the partial reports hold.
///
/// Exit status: 0 match, 1 divergence, 2 error (partials of different runs or options,
/// overlapping or missing partitions, another ttrace version), with one line naming the file.
///
/// Example:
///
///   ttrace report merge part-*.json --json report.json --html report.html
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct MergeArgs {
    /// The partial reports (`ttrace compare --partition I/N --json FILE`).
    #[arg(required = true, value_name = "PART.json")]
    parts: Vec<PathBuf>,
    /// Write the merged report as JSON to FILE (`-`: stdout, instead of the text).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write a self-contained HTML report to FILE.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

/// Runs `ttrace report ...`; returns the exit status.
pub fn main(args: ReportArgs) -> anyhow::Result<i32> {
    match args.command {
        ReportCommand::Merge(m) => merge(m),
    }
}

fn merge(args: MergeArgs) -> anyhow::Result<i32> {
    let mut parts = Vec::with_capacity(args.parts.len());
    for path in &args.parts {
        let part = partition::open(path)
            .map_err(|e| anyhow::anyhow!(text::escape_controls(&e.to_string())))?;
        parts.push(part);
    }
    let report = partition::merge(parts)
        .map_err(|e| anyhow::anyhow!(text::escape_controls(&ttrace_compare::error_line(&e))))?;
    if let Some(p) = &args.html {
        crate::report_out::html(p, &report)?;
    }
    let color = std::io::IsTerminal::is_terminal(&std::io::stdout());
    match &args.json {
        Some(p) if p.as_os_str() == "-" => crate::report_out::json(p, &report)?,
        Some(p) => {
            crate::report_out::json(p, &report)?;
            write!(std::io::stdout().lock(), "{}", text::render(&report, color))?;
        }
        None => write!(std::io::stdout().lock(), "{}", text::render(&report, color))?,
    }
    Ok(report.exit_code())
}
