//! `ttrace fsck RUN [--repair]`: check every byte of a store and repair what a crash or a
//! bad disk left.

use std::io::Write;
use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use serde::Serialize;
use ttrace_format::reader::{Issue, Store};
use ttrace_format::repair::{check_store, looks_live, repair_store, repairable, StoreCheck};

use crate::progress::Progress;

/// Check a store: every record against its checksum, every tensor against its CRC-32, the
/// indexes against the segments, the manifest's record counts against what is there.
///
/// With --repair: rebuild missing or damaged indexes, cut torn tails (the partial last record
/// of a segment whose writer was killed), restore a segment header whose magic was damaged,
/// and rewrite a missing or damaged manifest from the segments (keeping the damaged one as
/// manifest.json.damaged). Never deletes an intact record: cut bytes are saved under
/// RUN/lost+found/. Corrupt records in the middle of a segment stay (readers skip them and
/// report their rank, step and seq).
///
/// Exit status: 0 clean (or everything repaired), 1 problems remain, 2 the check failed.
///
/// Examples:
///
///   ttrace fsck runs/tp2
///
///   ttrace fsck runs/crashed --repair
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct FsckArgs {
    /// The store.
    run: PathBuf,
    /// Repair what can be repaired.
    #[arg(long)]
    repair: bool,
    /// Check records against their checksums only (skip decompressing every tensor).
    #[arg(long)]
    quick: bool,
    /// Repair even a store that looks like it is still being written.
    #[arg(long)]
    force: bool,
    /// Machine-readable report (one JSON object on stdout).
    #[arg(long)]
    json: bool,
}

/// What `ttrace fsck` found and did (its `--json` output).
#[derive(Serialize)]
struct FsckReport {
    store: PathBuf,
    segments: usize,
    records_intact: u64,
    /// Everything the first check found.
    issues: Vec<Issue>,
    /// One line per repair made.
    repairs: Vec<String>,
    /// What a check after the repairs still found (`None`: no repair was attempted).
    remaining: Option<Vec<Issue>>,
    clean: bool,
}

/// Checks `store` with a progress bar.
fn check(store: &Store, deep: bool) -> StoreCheck {
    let total: u64 = store.segments().iter().map(|s| s.bytes).sum();
    let progress = Progress::bytes(total, "checking");
    let found = check_store(store, deep, &mut |n| progress.inc(n));
    progress.finish();
    found
}

/// Runs `ttrace fsck`; returns the exit status.
pub fn main(a: FsckArgs) -> anyhow::Result<i32> {
    let store = Store::open(&a.run)?;
    if let Some(part) = store.parts().first() {
        // Repairs write into a store; a set's folder is not one.
        bail!(
            "{}: a set of {} stores (one job's nodes); fsck checks and repairs one store at \
             a time, e.g. {}",
            a.run.display(),
            store.parts().len(),
            part.display()
        );
    }
    let found = check(&store, !a.quick);
    let mut report = FsckReport {
        store: a.run.clone(),
        segments: store.segments().len(),
        records_intact: found.records(),
        issues: found.issues.clone(),
        repairs: Vec::new(),
        remaining: None,
        clean: false,
    };
    if a.repair && found.repairable() {
        if let Some(age) = looks_live(&store) {
            if !a.force {
                bail!(
                    "{}: the run is not finalized and a segment was written {age} s ago: its \
                     collector may still be writing. Stop it first, or pass --force.",
                    a.run.display()
                );
            }
        }
        report.repairs = repair_store(&a.run, &store, &found)?;
        report.remaining = Some(check(&Store::open(&a.run)?, !a.quick).issues);
    }
    report.clean = report
        .remaining
        .as_ref()
        .unwrap_or(&report.issues)
        .is_empty();
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        write_text(&mut out, &report)?;
    }
    Ok(if report.clean { 0 } else { 1 })
}

/// The report as lines: each issue (ERROR when it lost data), each repair, a summary, and what
/// is left after repairs.
fn write_text(out: &mut impl Write, r: &FsckReport) -> std::io::Result<()> {
    for i in &r.issues {
        let level = if i.kind.loses_data() {
            "ERROR "
        } else {
            "warn  "
        };
        writeln!(out, "{level}{i}")?;
    }
    for line in &r.repairs {
        writeln!(out, "fixed {line}")?;
    }
    let lost = r.issues.iter().filter(|i| i.kind.loses_data()).count();
    let unrepairable = "damaged records cannot be repaired: they are skipped, every other \
                        record reads";
    let tail = match &r.remaining {
        Some(left) => format!(", {} left after repair ({unrepairable})", left.len()),
        None if r.issues.iter().any(|i| repairable(i.kind)) => {
            ", run with --repair to fix what can be fixed".into()
        }
        None if !r.issues.is_empty() => format!(" ({unrepairable})"),
        None => String::new(),
    };
    writeln!(
        out,
        "{}: {} segments, {} intact records; {} problem(s) found ({lost} losing data){tail}",
        r.store.display(),
        r.segments,
        r.records_intact,
        r.issues.len(),
    )?;
    for i in r.remaining.iter().flatten() {
        writeln!(out, "left  {i}")?;
    }
    Ok(())
}
