//! `ttrace compare REF RUN`: line a distributed run up against a single-device reference and
//! name the first tensor that differs by more than round-off explains.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::progress::Progress;
use clap::Args;
use ttrace_compare::engine::compare_partition;
use ttrace_compare::partition::Partition;
use ttrace_compare::report::{text, CompareReport};
use ttrace_compare::{compare, layout, CompareOptions, DpScale};

/// Compare a distributed run with a trusted single-device reference run.
///
/// Both runs must train the same model on the same data from the same initial weights (the
/// reference with world size 1). Every GEMM of the run is aligned with its reference
/// counterpart (by op signatures and pipeline dataflow; no annotations), each rank's shard is
/// placed in the reference tensor (a slice, a replica, or a partial sum over a communicator),
/// and its error is measured as a relative Frobenius norm in units of the working precision's
/// epsilon (BF16's for FP8). Reductions are compared through the GEMM outputs they reduce.
/// The tolerance per tensor is an analytic round-off bound growing with depth, or, with
/// --perturbed, what a reference run with round-off-sized noise injected shows (make one with
/// `ttrace run --perturb -- CMD`). The first tensor beyond tolerance in execution order is
/// the verdict: local (the op's output is wrong given its own inputs) or upstream (its inputs
/// were already wrong: the bug is in uncaptured code before it).
///
/// Exit status: 0 match, 1 divergence, 2 error, 5 a match of a capture that lost data (gaps,
/// snapshots never published, unreadable records: said under the verdict; never clean).
///
/// Examples:
///
///   ttrace compare runs/ref runs/tp2dp2pp2
///
///   ttrace compare runs/ref runs/tp2 --perturbed runs/ref-perturbed --steps 0-1
///
///   ttrace compare runs/ref runs/tp2 --json report.json --html report.html
///
///   ttrace compare runs/ref runs/tp2 --partition 2/8 --json part2.json
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct CompareArgs {
    /// The reference store (world size 1).
    reference: PathBuf,
    /// The store of the run under test.
    run: PathBuf,
    /// Steps to compare: `0`, `0-2`, `0,3` (default: every step both runs have).
    #[arg(long, value_name = "STEPS")]
    steps: Option<String>,
    /// The run's layout, e.g. `tp=2,dp=2,pp=2,order=tp-dp-pp` (default: read from the
    /// communicator map; used for the report).
    #[arg(long, value_name = "LAYOUT")]
    layout: Option<String>,
    /// A perturbed reference run (`ttrace run --perturb`) to derive per-tensor tolerances.
    #[arg(long, value_name = "STORE")]
    perturbed: Option<PathBuf>,
    /// Overrides what a data-parallel gradient reduction must output, relative to the
    /// reference's gradient (otherwise decided from the next step's weight updates): 1
    /// (ncclAvg of mean-loss gradients), `dp` (summed, divided later in uncaptured code),
    /// `1/dp` (averaged sum-loss gradients), or a number.
    #[arg(long, value_name = "SCALE")]
    dp_reduction_scale: Option<String>,
    /// Memory budget, e.g. `512M`, `2G` (default 1G): segments are closed, the records'
    /// metadata dropped (read again when wanted) and the results past their share spilled to
    /// a temporary file in TMPDIR as the comparison moves on, so memory grows with the number
    /// of steps by a few hundred bytes a GEMM only. Past its shares a comparison is slower.
    #[arg(long, value_name = "BYTES")]
    memory: Option<String>,
    /// Write the full report as JSON to FILE (`-`: stdout, instead of the text).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write a self-contained HTML report (plot of error against tolerance) to FILE.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Compare only partition I of N (1 <= I <= N): a deterministic share of the steps, cut
    /// into N runs of about equal bytes. Writes a partial report (give --json); `ttrace
    /// report merge` joins the N partial reports into the run's verdict. Exit status 3: this
    /// share matched, 4: it diverged, 2: error.
    #[arg(long, value_name = "I/N")]
    partition: Option<String>,
}

/// Parses `0`, `0-2`, `0,3,5-6` into inclusive ranges (a range is a filter on the steps
/// the stores hold, never expanded).
fn parse_steps(s: &str) -> anyhow::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || anyhow::anyhow!("--steps: `{part}` is not a step or a range like 0-2");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u64, u64) = (
                    a.trim().parse().map_err(|_| bad())?,
                    b.trim().parse().map_err(|_| bad())?,
                );
                if a > b {
                    return Err(bad());
                }
                out.push((a, b));
            }
            None => {
                let v = part.parse().map_err(|_| bad())?;
                out.push((v, v));
            }
        }
    }
    if out.is_empty() {
        anyhow::bail!("--steps: `{s}` names no step");
    }
    Ok(out)
}

/// Parses a size: bytes, or a number with K, M, G or T (powers of 1024; `B`/`iB` after the
/// letter are accepted).
fn parse_bytes(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => anyhow::bail!("--memory: `{s}`: unknown unit `{c}` (K, M, G or T)"),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("--memory: `{s}` is not a size like 512M or 2G"))?;
    let bytes = v * (1u64 << shift) as f64;
    if !(bytes.is_finite() && bytes >= (16u64 << 20) as f64) {
        anyhow::bail!("--memory: `{s}`: at least 16M");
    }
    Ok(bytes as u64)
}

/// Refuses a report path inside one of the stores being read (`--html RUN/manifest.json`
/// would overwrite the store's manifest): reports go next to stores, never into them.
fn refuse_inside_stores(flag: &str, out: &Path, stores: &[&Path]) -> anyhow::Result<()> {
    if out.as_os_str() == "-" {
        return Ok(());
    }
    // The file may not exist yet: resolve the folder it goes into.
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Ok(folder) = parent.canonicalize() else {
        return Ok(()); // Writing will fail and say why.
    };
    for store in stores {
        if let Ok(store_dir) = store.canonicalize() {
            if folder.starts_with(&store_dir) {
                anyhow::bail!(
                    "{flag} {}: that is inside the store {}, which compare only reads; \
                     write the report elsewhere",
                    out.display(),
                    store.display()
                );
            }
        }
    }
    Ok(())
}

/// Runs the comparison; returns the exit status (0 match, 1 divergence).
pub fn main(args: CompareArgs) -> anyhow::Result<i32> {
    let mut stores = vec![args.reference.as_path(), args.run.as_path()];
    stores.extend(args.perturbed.as_deref());
    for (flag, out) in [("--html", &args.html), ("--json", &args.json)] {
        if let Some(out) = out {
            refuse_inside_stores(flag, out, &stores)?;
        }
    }
    let opts = CompareOptions {
        steps: args.steps.as_deref().map(parse_steps).transpose()?,
        layout: args
            .layout
            .as_deref()
            .map(layout::parse)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--layout: {e}"))?,
        perturbed: args.perturbed.clone(),
        dp_reduction_scale: args
            .dp_reduction_scale
            .as_deref()
            .map(DpScale::parse)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--dp-reduction-scale: {e}"))?,
        memory: args.memory.as_deref().map(parse_bytes).transpose()?,
    };
    let partition = args
        .partition
        .as_deref()
        .map(Partition::parse)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--partition: {e}"))?;
    if partition.is_some() && args.json.is_none() {
        anyhow::bail!(
            "--partition: give --json FILE: the partial report is what `ttrace report merge` \
             joins"
        );
    }
    let bar = Progress::items("comparing ops");
    let mut progress = |done, total| bar.set(done, total);
    let failed = |e: ttrace_compare::CompareError| {
        anyhow::anyhow!(text::escape_controls(&ttrace_compare::error_line(&e)))
    };
    let code = match partition {
        Some(part) => {
            let partial = compare_partition(&args.reference, &args.run, &opts, part, &mut progress)
                .map_err(failed)?;
            bar.finish();
            write_reports(&args, &partial.report, &partial, Some(&partial.label()))?;
            partial.exit_code()
        }
        None => {
            let report =
                compare(&args.reference, &args.run, &opts, &mut progress).map_err(failed)?;
            tracing::debug!("compare: report made");
            bar.finish();
            write_reports(&args, &report, &report, None)?;
            tracing::debug!("compare: reports written");
            report.exit_code()
        }
    };
    Ok(code)
}

/// Writes the HTML and JSON reports asked for and the text (unless the JSON goes to
/// stdout); `partial` names the partition of a partial report.
fn write_reports(
    args: &CompareArgs,
    report: &CompareReport,
    json: &impl serde::Serialize,
    partial: Option<&str>,
) -> anyhow::Result<()> {
    if let Some(p) = &args.html {
        crate::report_out::html(p, report)?;
    }
    let color = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut text_out = String::new();
    if let Some(label) = partial {
        text_out = format!(
            "PARTIAL {label}: what follows is this share only; `ttrace report merge` joins \
             every partition's JSON into the run's verdict\n"
        );
    }
    text_out.push_str(&text::render(report, color));
    match &args.json {
        Some(p) if p.as_os_str() == "-" => crate::report_out::json(p, json)?,
        Some(p) => {
            crate::report_out::json(p, json)?;
            write!(std::io::stdout().lock(), "{text_out}")?;
        }
        None => write!(std::io::stdout().lock(), "{text_out}")?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_never_written_into_a_store_being_read() {
        let dir = std::env::temp_dir().join(format!("ttrace-cmp-out-{}", std::process::id()));
        let store = dir.join("run");
        std::fs::create_dir_all(store.join("rank0")).expect("make a store folder");
        let inside = store.join("manifest.json");
        let err = refuse_inside_stores("--html", &inside, &[&store]).unwrap_err();
        assert!(err.to_string().contains("inside the store"), "{err}");
        let deeper = store.join("rank0/report.json");
        assert!(refuse_inside_stores("--json", &deeper, &[&store]).is_err());
        // Next to the store, or stdout, is fine.
        assert!(refuse_inside_stores("--html", &dir.join("r.html"), &[&store]).is_ok());
        assert!(refuse_inside_stores("--json", Path::new("-"), &[&store]).is_ok());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn steps_parse_as_lists_and_ranges() {
        assert_eq!(parse_steps("0-2,5").expect("valid"), vec![(0, 2), (5, 5)]);
        // A range as wide as u64 is a filter, not a list.
        assert_eq!(
            parse_steps("0-18446744073709551615").expect("valid"),
            vec![(0, u64::MAX)]
        );
        assert!(parse_steps("2-1").is_err());
        assert!(parse_steps("x").unwrap_err().to_string().contains("`x`"));
    }

    #[test]
    fn memory_budgets_parse_with_units() {
        assert_eq!(parse_bytes("512M").expect("valid"), 512 << 20);
        assert_eq!(parse_bytes("2GiB").expect("valid"), 2 << 30);
        assert_eq!(parse_bytes("1.5G").expect("valid"), 3 << 29);
        assert_eq!(parse_bytes("100000000").expect("valid"), 100_000_000);
        assert!(parse_bytes("1M").is_err(), "below the floor");
        assert!(parse_bytes("3X").unwrap_err().to_string().contains("unit"));
    }
}
