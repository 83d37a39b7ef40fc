//! `ttrace check RUN`: find silent bugs in one distributed trace, without a reference run.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use ttrace_compare::check::check_store;

use crate::progress::Progress;

/// Check a distributed trace for silent bugs, without a reference run.
///
/// Collectives: every all-reduce, reduce and reduce-scatter output must be the reduction of
/// its group's captured inputs (computed in f64, within the round-off of n-1 additions in the
/// tensor's type: NCCL's order is not reproduced), every all-gather the concatenation of the
/// inputs, every broadcast the root's bytes, every send its matching recv's bytes; members
/// must agree on count, type, reduction and root, and none may be missing. Replicas: members
/// of an all-reduce, all-gather or broadcast must receive identical bytes, and GEMM weights
/// must be bitwise identical across data-parallel replicas (found from the comm map). And the
/// first NaN or Inf in execution order: its rank, op, NVTX module, and whether it came in
/// through the op's inputs or was produced by it.
///
/// Exit status: 0 no finding, 1 findings, 2 the check failed, 5 no finding in a capture that
/// lost data (gaps, snapshots never published, unreadable records: what they lost was not
/// checked; never clean).
///
/// Examples:
///
///   ttrace check runs/tp2dp2
///
///   ttrace check runs/tp2dp2 --json report.json
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct CheckArgs {
    /// The store.
    run: PathBuf,
    /// Also write the full report as JSON to FILE (`-` for stdout, instead of the text).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// Runs the check; returns the exit status (0 clean, 1 findings, 5 incomplete capture).
pub fn main(args: CheckArgs) -> anyhow::Result<i32> {
    let bar = Progress::items("reading records");
    let report = check_store(&args.run, &mut |done, total| bar.set(done, total)).map_err(|e| {
        anyhow::anyhow!(ttrace_compare::report::text::escape_controls(
            &ttrace_compare::error_line(&e)
        ))
    })?;
    bar.finish();
    match &args.json {
        Some(p) if p.as_os_str() == "-" => crate::report_out::json(p, &report)?,
        Some(p) => {
            crate::report_out::json(p, &report)?;
            write!(std::io::stdout().lock(), "{report}")?;
        }
        None => write!(std::io::stdout().lock(), "{report}")?,
    }
    Ok(report.exit_code())
}
