//! `ttrace fsck RUN [--repair]`: check every byte of a store and repair what a crash or a
//! bad disk left.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::bail;
use clap::Args;
use serde_json::json;
use ttrace_format::reader::{Issue, IssueKind, Segment, Store};
use ttrace_format::recover::{
    check_counts, check_segment, lost_found_dir, rebuild_index, rebuild_manifest,
    repair_frame_headers, repair_header, set_aside_headerless, truncate_tail,
    write_rebuilt_manifest, SegmentCheck,
};
use ttrace_format::FormatError;

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

/// An issue as a segment whose header cannot be read reports it.
fn header_issue(info: &ttrace_format::reader::SegmentInfo, e: &FormatError) -> Issue {
    Issue {
        kind: IssueKind::BadHeader,
        path: info.path.clone(),
        rank: Some(info.rank),
        step: Some(info.step),
        seq: None,
        offset: Some(0),
        bytes: None,
        detail: format!("{e}; none of its records can be read"),
    }
}

/// Everything one pass found.
struct Pass {
    store_issues: Vec<Issue>,
    checks: Vec<SegmentCheck>,
    /// Segments that did not open, with why.
    unopened: Vec<(usize, FormatError)>,
    count_issues: Vec<Issue>,
}

impl Pass {
    fn issues(&self) -> Vec<&Issue> {
        let mut v: Vec<&Issue> = self.store_issues.iter().collect();
        v.extend(self.checks.iter().flat_map(|c| &c.issues));
        v.extend(&self.count_issues);
        v
    }
}

fn check_all(store: &Store, deep: bool, unopened_issues: &mut Vec<Issue>) -> Pass {
    let total: u64 = store.segments().iter().map(|s| s.bytes).sum();
    let progress = Progress::bytes(total, "checking");
    let mut checks = Vec::new();
    let mut unopened = Vec::new();
    for (k, info) in store.segments().iter().enumerate() {
        match Segment::open_as(&info.path, Some((info.rank, info.step))) {
            Ok(seg) => checks.push(check_segment(&seg, deep, &mut |n| progress.inc(n))),
            Err(e) => {
                unopened_issues.push(header_issue(info, &e));
                unopened.push((k, e));
                progress.inc(info.bytes);
            }
        }
    }
    progress.finish();
    let count_issues = check_counts(store, &checks);
    Pass {
        store_issues: store.issues().to_vec(),
        checks,
        unopened,
        count_issues,
    }
}

/// Refuses to repair a store whose collector may still be writing it.
fn looks_live(store: &Store) -> Option<u64> {
    if store.manifest().is_some_and(|m| m.finalized) {
        return None;
    }
    let newest = store
        .segments()
        .iter()
        .filter_map(|s| std::fs::metadata(&s.path).and_then(|m| m.modified()).ok())
        .max()?;
    let age = SystemTime::now()
        .duration_since(newest)
        .unwrap_or(Duration::ZERO);
    (age < Duration::from_secs(60)).then_some(age.as_secs())
}

/// Whether `--repair` can fix an issue of this kind.
fn repairable(k: IssueKind) -> bool {
    matches!(
        k,
        IssueKind::MissingIndex
            | IssueKind::DamagedIndex
            | IssueKind::RecoveredByIndex
            | IssueKind::TornTail
            | IssueKind::BadManifest
            | IssueKind::BadHeader
    )
}

/// Runs `ttrace fsck`; returns the exit status.
pub fn main(a: FsckArgs) -> anyhow::Result<i32> {
    let store = Store::open(&a.run)?;
    if let Some(part) = store.parts().first() {
        // Repairs write into a store; a set's folder is not one.
        anyhow::bail!(
            "{}: a set of {} stores (one job's nodes); fsck checks and repairs one store at \
             a time, e.g. {}",
            a.run.display(),
            store.parts().len(),
            part.display()
        );
    }
    let mut unopened_issues = Vec::new();
    let pass = check_all(&store, !a.quick, &mut unopened_issues);
    let mut found: Vec<Issue> = pass.issues().into_iter().cloned().collect();
    found.extend(unopened_issues.iter().cloned());
    let mut repairs: Vec<String> = Vec::new();
    let mut after: Option<Vec<Issue>> = None;
    if a.repair && found.iter().any(|i| repairable(i.kind)) {
        if let Some(age) = looks_live(&store) {
            if !a.force {
                bail!(
                    "{}: the run is not finalized and a segment was written {age} s ago: its \
                     collector may still be writing. Stop it first, or pass --force.",
                    a.run.display()
                );
            }
        }
        // Headers first: a restored header makes its segment checkable.
        for (k, e) in &pass.unopened {
            let info = &store.segments()[*k];
            if matches!(e, FormatError::Corrupt(_))
                && repair_header(&a.run, &info.path, info.rank, info.step)?
            {
                repairs.push(format!(
                    "{}: restored the segment header (old one saved in {})",
                    info.path.display(),
                    lost_found_dir(&a.run).display()
                ));
            } else if matches!(e, FormatError::Corrupt(_))
                && set_aside_headerless(&a.run, &info.path)?
            {
                repairs.push(format!(
                    "{}: removed (shorter than a segment header: it held no record)",
                    info.path.display()
                ));
            }
        }
        for c in &pass.checks {
            if let Some(at) = c.torn_at {
                let cut = truncate_tail(&a.run, &c.path, at)?;
                repairs.push(format!(
                    "{}: cut the torn tail ({cut} bytes from byte {at}, saved in {})",
                    c.path.display(),
                    lost_found_dir(&a.run).display()
                ));
            }
        }
        // Indexes and the manifest from a fresh look (cut tails, restored headers).
        let store2 = Store::open(&a.run)?;
        let mut ignored = Vec::new();
        let pass2 = check_all(&store2, false, &mut ignored);
        for c in &pass2.checks {
            let n = repair_frame_headers(&a.run, c)?;
            if n > 0 {
                repairs.push(format!(
                    "{}: restored {n} damaged frame header(s) from the index",
                    c.path.display()
                ));
            }
            if rebuild_index(c)? {
                repairs.push(format!(
                    "{}: wrote its index ({} records)",
                    ttrace_format::store::index_path(&c.path).display(),
                    c.records
                ));
            }
        }
        if store2.manifest().is_none() {
            let m = rebuild_manifest(&store2, &pass2.checks);
            write_rebuilt_manifest(&a.run, &m)?;
            repairs.push(format!(
                "{}: rebuilt from the segments ({} ranks, {} communicators; command and \
                 environment {})",
                ttrace_format::store::manifest_path(&a.run).display(),
                m.ranks.len(),
                m.comms.len(),
                if m.command.is_empty() {
                    "unknown"
                } else {
                    "salvaged"
                }
            ));
        }
        // What is left.
        let store3 = Store::open(&a.run)?;
        let mut unopened3 = Vec::new();
        let pass3 = check_all(&store3, !a.quick, &mut unopened3);
        let mut left: Vec<Issue> = pass3.issues().into_iter().cloned().collect();
        left.extend(unopened3);
        after = Some(left);
    }
    let records: u64 = pass.checks.iter().map(|c| c.records).sum();
    let remaining = after.as_ref().unwrap_or(&found);
    let code = if remaining.is_empty() { 0 } else { 1 };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if a.json {
        let v = json!({
            "store": a.run,
            "segments": store.segments().len(),
            "records_intact": records,
            "issues": found,
            "repairs": repairs,
            "remaining": after,
            "clean": code == 0,
        });
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
        return Ok(code);
    }
    for i in &found {
        writeln!(
            out,
            "{}{i}",
            if i.kind.loses_data() {
                "ERROR "
            } else {
                "warn  "
            }
        )?;
    }
    for r in &repairs {
        writeln!(out, "fixed {r}")?;
    }
    let lost = found.iter().filter(|i| i.kind.loses_data()).count();
    writeln!(
        out,
        "{}: {} segments, {records} intact records; {} problem(s) found ({lost} losing data){}",
        a.run.display(),
        store.segments().len(),
        found.len(),
        match &after {
            Some(left) => format!(
                ", {} left after repair (damaged records cannot be repaired: they are skipped, \
                 every other record reads)",
                left.len()
            ),
            None if found.iter().any(|i| repairable(i.kind)) => {
                ", run with --repair to fix what can be fixed".into()
            }
            None if !found.is_empty() => {
                " (damaged records cannot be repaired: they are skipped, every other record reads)"
                    .into()
            }
            None => String::new(),
        }
    )?;
    if let Some(left) = &after {
        for i in left {
            writeln!(out, "left  {i}")?;
        }
    }
    Ok(code)
}
