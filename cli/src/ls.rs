//! `ttrace ls RUN`: what a store holds.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use serde::Serialize;
use serde_json::json;
use ttrace_format::config::{RangeSet, StepRule};
use ttrace_format::reader::{Issue, Store};
use ttrace_format::record::{GapTally, Op};
use ttrace_format::store::{CommEntry, Manifest};

use crate::progress::Progress;
use crate::reading::{open_store, print_table, warn};
use crate::units::human;

/// List a store: ranks, steps, record counts, bytes raw and compressed, gaps, the
/// communicator map (which global ranks form each communicator), and the command and
/// environment the run was made with.
///
/// Counts come from the records themselves (their metadata: fast, through the indexes);
/// `ttrace fsck` verifies every byte.
///
/// Examples:
///
///   ttrace ls runs/tp2
///
///   ttrace ls runs/tp2 --json | jq '.ranks[] | {rank, records}'
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct LsArgs {
    /// The store (a directory written by `ttrace run`).
    run: PathBuf,
    /// Print the whole environment (by default: the variables that shape a distributed run).
    #[arg(long)]
    env: bool,
    /// Machine-readable output (one JSON object on stdout).
    #[arg(long)]
    json: bool,
}

/// Per-rank totals.
#[derive(Default, Serialize)]
struct RankSum {
    rank: u32,
    steps: Vec<u64>,
    records: u64,
    gaps: u64,
    /// Its gaps by reason (JSON `gap_reasons`, `gap_bytes`).
    #[serde(flatten)]
    gap_tally: GapTally,
    bytes_raw: u64,
    bytes_stored: u64,
    /// Raw bytes of its tensors stored as references to identical bytes (dedup, 1.3).
    bytes_deduped: u64,
    /// From the manifest, when known.
    pid: Option<u32>,
    hostname: Option<String>,
    clean_exit: Option<bool>,
    /// Snapshots the process had taken but not published when it died (manifest 1.2), and
    /// the (step, seq) of its last published record.
    unpublished: u64,
    unpublished_after: Option<(u64, u64)>,
    /// `None` when the store holds the rank's records; otherwise why it does not: `not
    /// captured` (outside `ttrace run --ranks`) or `missing` (listed with records by the
    /// manifest, absent from the store).
    absent: Option<String>,
}

/// Per-step totals.
#[derive(Default, Serialize)]
struct StepSum {
    step: u64,
    ranks: Vec<u32>,
    records: u64,
    gaps: u64,
    bytes_raw: u64,
    bytes_stored: u64,
}

/// Variables shown without `--env`: the ones that shape a distributed run.
fn interesting(k: &str) -> bool {
    const PREFIXES: [&str; 8] = [
        "TTRACE_", "NCCL_", "CUDA_", "CUBLAS", "TORCH", "PYTORCH_", "OMP_", "SLURM_",
    ];
    const NAMES: [&str; 7] = [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "LD_PRELOAD",
    ];
    PREFIXES.iter().any(|p| k.starts_with(p)) || NAMES.contains(&k)
}

/// Text from the traced program (command line, environment, host names) with its control
/// characters escaped: it must not drive the terminal.
fn esc(s: &str) -> String {
    ttrace_compare::report::text::escape_controls(s)
}

/// Runs `ttrace ls`.
pub fn main(a: LsArgs) -> anyhow::Result<()> {
    let store = open_store("ls", &a.run)?;
    let mut l = read_segments(&store);
    let manifest = store.manifest();
    if let Some(m) = manifest {
        add_manifest(&mut l.ranks, m);
    }
    let comms = merged_comms(manifest, std::mem::take(&mut l.seen_comms));
    if a.json {
        return print_json(&a, &store, &l, &comms);
    }
    for i in &l.issues {
        warn("ls", i);
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    print_header(&mut out, &a, manifest, store.parts())?;
    print_tables(&mut out, &l, &comms)?;
    let n_issues = store.issues().len() + l.issues.len();
    if n_issues > 0 {
        writeln!(out)?;
        writeln!(
            out,
            "{n_issues} problem(s) reported above; `ttrace fsck {}` checks every byte",
            a.run.display()
        )?;
    }
    Ok(())
}

/// What the segments hold, per rank and per step.
#[derive(Default)]
struct Listing {
    ranks: BTreeMap<u32, RankSum>,
    steps: BTreeMap<u64, StepSum>,
    issues: Vec<Issue>,
    /// Communicators as the records show them: key -> (size, comm rank -> global rank).
    seen_comms: BTreeMap<u64, (u32, BTreeMap<u32, u32>)>,
}

/// Reads every record's metadata (fast, through the indexes).
fn read_segments(store: &Store) -> Listing {
    let total: u64 = store.segments().iter().map(|s| s.bytes).sum();
    let progress = Progress::bytes(total, "reading");
    let mut ranks: BTreeMap<u32, RankSum> = BTreeMap::new();
    let mut steps: BTreeMap<u64, StepSum> = BTreeMap::new();
    let mut issues: Vec<Issue> = Vec::new();
    let mut seen_comms: BTreeMap<u64, (u32, BTreeMap<u32, u32>)> = BTreeMap::new();
    for info in store.segments() {
        let seg = match store.open_segment(info.rank, info.step) {
            Ok(s) => s,
            Err(e) => {
                progress.println(&format!("ttrace ls: warning: {e}"));
                progress.inc(info.bytes);
                continue;
            }
        };
        issues.extend(seg.issues().iter().cloned());
        let r = ranks.entry(info.rank).or_default();
        r.rank = info.rank;
        r.steps.push(info.step);
        let s = steps.entry(info.step).or_default();
        s.step = info.step;
        s.ranks.push(info.rank);
        for i in 0..seg.len() {
            let v = match seg.read_meta(i) {
                Ok(v) => v,
                Err(issue) => {
                    issues.push(*issue);
                    continue;
                }
            };
            r.records += 1;
            s.records += 1;
            let (raw, stored) = (v.raw_bytes(), v.stored_bytes());
            r.bytes_raw += raw;
            r.bytes_stored += stored;
            r.bytes_deduped += v.deduped_bytes();
            s.bytes_raw += raw;
            s.bytes_stored += stored;
            match &v.record.op {
                Op::Gap(g) => {
                    r.gaps += 1;
                    s.gaps += 1;
                    r.gap_tally.add(g);
                }
                Op::Collective(c) => {
                    seen_comms
                        .entry(c.comm)
                        .or_insert_with(|| (c.comm_size, BTreeMap::new()))
                        .1
                        .insert(c.comm_rank, v.record.rank);
                }
                _ => {}
            }
        }
        progress.inc(info.bytes);
    }
    progress.finish();
    Listing {
        ranks,
        steps,
        issues,
        seen_comms,
    }
}

/// Adds the manifest's view of the ranks: pid, host, exit, and the ranks of the world the
/// store holds nothing of (not captured, or missing).
fn add_manifest(ranks: &mut BTreeMap<u32, RankSum>, m: &Manifest) {
    for ri in &m.ranks {
        let r = ranks.entry(ri.rank).or_default();
        r.rank = ri.rank;
        r.pid = Some(ri.pid);
        r.hostname = Some(ri.hostname.clone());
        r.clean_exit = Some(r.clean_exit.unwrap_or(true) && ri.clean_exit);
        r.unpublished += ri.unpublished;
        r.unpublished_after = r.unpublished_after.max(ri.unpublished_after);
        if r.steps.is_empty() && ri.records > 0 {
            r.absent = Some(format!("missing ({} records listed)", ri.records));
        }
    }
    // Ranks of the world the store holds nothing of (`--ranks`, or lost before start).
    let world = m
        .ranks
        .iter()
        .map(|r| r.world_size)
        .chain(m.comms.iter().map(|c| c.size))
        .max()
        .unwrap_or(0);
    for rank in 0..world {
        let captured = m
            .config
            .ranks
            .as_ref()
            .is_none_or(|set| set.contains(u64::from(rank)));
        ranks.entry(rank).or_insert_with(|| RankSum {
            rank,
            absent: Some(if captured { "missing" } else { "not captured" }.into()),
            ..RankSum::default()
        });
    }
}

/// The manifest's communicators, completed by what the records show (a run whose daemon
/// died may not have written them).
fn merged_comms(
    manifest: Option<&Manifest>,
    seen_comms: BTreeMap<u64, (u32, BTreeMap<u32, u32>)>,
) -> Vec<CommEntry> {
    let mut comms: Vec<CommEntry> = manifest.map(|m| m.comms.clone()).unwrap_or_default();
    for (key, (size, members)) in seen_comms {
        if let Some(c) = comms.iter_mut().find(|c| c.key == key) {
            for (cr, gr) in members {
                if let Some(slot) = c.members.get_mut(cr as usize) {
                    slot.get_or_insert(gr);
                }
            }
        } else {
            let mut m = vec![None; size as usize];
            for (cr, gr) in members {
                if let Some(slot) = m.get_mut(cr as usize) {
                    *slot = Some(gr);
                }
            }
            comms.push(CommEntry {
                key,
                size,
                members: m,
                parent: None,
                color: None,
                api: "(from records)".into(),
            });
        }
    }
    comms
}

/// `ttrace ls --json`.
fn print_json(a: &LsArgs, store: &Store, l: &Listing, comms: &[CommEntry]) -> anyhow::Result<()> {
    let manifest = store.manifest();
    let (ranks, steps, issues) = (&l.ranks, &l.steps, &l.issues);
    let v = json!({
        "run": a.run,
        "stores": store.parts(),
        "run_id": manifest.map(|m| m.run_id.clone()),
        "finalized": manifest.map(|m| m.finalized),
        "exit_code": manifest.and_then(|m| m.exit_code),
        "lost": manifest.map(|m| m.lost.clone()),
        "job": manifest.and_then(|m| m.job.clone()),
        "created_unix_ns": manifest.map(|m| m.created_unix_ns),
        "command": manifest.map(|m| m.command.clone()),
        "cwd": manifest.map(|m| m.cwd.clone()),
        "env": manifest.map(|m| m.env.clone()),
        "config": manifest.map(|m| m.config.clone()),
        "ranks": ranks.values().collect::<Vec<_>>(),
        "steps": steps.values().collect::<Vec<_>>(),
        "comms": comms,
        "issues": store.issues().iter().chain(issues).collect::<Vec<_>>(),
    });
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    serde_json::to_writer_pretty(&mut out, &v)?;
    writeln!(out)?;
    Ok(())
}

/// The store, the run and how it was captured.
fn print_header(
    out: &mut impl Write,
    a: &LsArgs,
    manifest: Option<&Manifest>,
    parts: &[std::path::PathBuf],
) -> anyhow::Result<()> {
    writeln!(out, "store    {}", esc(&a.run.display().to_string()))?;
    if !parts.is_empty() {
        // One job's nodes, each with its own store, read as one.
        let names: Vec<String> = parts
            .iter()
            .map(|p| esc(&p.display().to_string()))
            .collect();
        writeln!(out, "set of   {} stores: {}", parts.len(), names.join(", "))?;
    }
    match manifest {
        Some(m) => {
            let state = if m.finalized {
                match m.exit_code {
                    Some(c) => format!("finalized, exit code {c}"),
                    None => "finalized".into(),
                }
            } else {
                "NOT finalized (the collector stopped early; the segments are readable)".into()
            };
            writeln!(out, "run      {} ({state})", m.run_id)?;
            for l in &m.lost {
                writeln!(out, "INCOMPLETE {} records lost: {}", l.records, l.cause)?;
            }
            for r in m.ranks.iter().filter(|r| r.unpublished > 0) {
                let after = r.unpublished_after.map_or_else(
                    || "before its first record".into(),
                    |(step, seq)| format!("after step {step} seq {seq}"),
                );
                writeln!(
                    out,
                    "INCOMPLETE {} records lost: rank {} (pid {}) had taken them and not \
                     published them when it ended ({} taken), {after}",
                    r.unpublished, r.rank, r.pid, r.taken
                )?;
            }
            let ranks = m
                .ranks
                .iter()
                .map(|r| (r.rank, r.pid, r.warnings.as_slice()));
            for line in warning_lines(ranks, usize::MAX) {
                writeln!(out, "{line}")?;
            }
            if let Some(j) = &m.job {
                writeln!(
                    out,
                    "job      {} ({}: {})",
                    esc(&j.label),
                    j.source,
                    esc(&j.id)
                )?;
            }
            if m.created_unix_ns > 0 {
                let when =
                    std::time::UNIX_EPOCH + std::time::Duration::from_nanos(m.created_unix_ns);
                writeln!(out, "created  {}", humantime::format_rfc3339_seconds(when))?;
            }
            if m.command.is_empty() {
                writeln!(
                    out,
                    "command  (unknown: the manifest was rebuilt from the segments)"
                )?;
            } else {
                writeln!(out, "command  {}", esc(&shell_words(&m.command)))?;
                writeln!(out, "cwd      {}", esc(&m.cwd))?;
            }
            let c = &m.config;
            let fams: Vec<&str> = c.families.iter().map(|f| f.name()).collect();
            let all = |r: &Option<RangeSet>| r.as_ref().map_or("all".into(), |r| r.to_string());
            writeln!(
                out,
                "capture  apis={} steps={} ranks={} max-tensor={} inputs={} kernels={} step-rule={}{}",
                fams.join(","),
                all(&c.steps),
                all(&c.ranks),
                human(c.max_tensor_bytes),
                c.inputs,
                c.kernels,
                match &c.step_rule {
                    StepRule::Auto => "auto".to_string(),
                    StepRule::Nvtx(n) => format!("nvtx:{n}"),
                    StepRule::Api => "api".to_string(),
                },
                // A perturbed reference run (ttrace run --perturb).
                c.perturb.map_or(String::new(), |s| format!(" perturb={s}"))
            )?;
            let shown: Vec<(&String, &String)> = m
                .env
                .iter()
                .filter(|(k, _)| a.env || interesting(k))
                .collect();
            if a.env {
                writeln!(out, "environment ({} variables)", m.env.len())?;
            } else {
                writeln!(
                    out,
                    "environment ({} variables; {} shown, --env for all)",
                    m.env.len(),
                    shown.len()
                )?;
            }
            for (k, v) in shown {
                writeln!(out, "  {}={}", esc(k), esc(v))?;
            }
        }
        None => writeln!(out, "run      (manifest.json missing or unreadable)")?,
    }
    Ok(())
}

/// The line that calls a store with gap records incomplete, as `ttrace run`, `compare` and
/// `check` do (`None` without gaps).
fn gaps_note<'a>(ranks: impl Iterator<Item = &'a RankSum>) -> Option<String> {
    let tally = ranks.fold(GapTally::default(), |mut t, r| {
        t.merge(&r.gap_tally);
        t
    });
    gaps_line(&tally)
}

/// `INCOMPLETE 3 gap records: ops or tensors not captured (copy_refused 2, ring_full 1; 4.00
/// KiB not captured)`: how `ttrace ls` and `ttrace run` call a capture with gaps incomplete
/// (`None` without gaps).
pub(crate) fn gaps_line(tally: &GapTally) -> Option<String> {
    let count = tally.count();
    (count > 0).then(|| {
        format!(
            "INCOMPLETE {count} gap record{}: ops or tensors not captured ({}{})",
            if count == 1 { "" } else { "s" },
            tally.reasons(),
            if tally.bytes > 0 {
                format!("; {} not captured", human(tally.bytes))
            } else {
                String::new()
            }
        )
    })
}

/// How a rank's process ended, with the snapshots it took down with it.
fn exit_cell(r: &RankSum) -> String {
    let how = match (&r.absent, r.clean_exit) {
        (Some(why), _) => return why.clone(),
        (None, Some(true)) => "clean",
        (None, Some(false)) => "crashed",
        (None, None) => "-",
    };
    match (r.unpublished, r.unpublished_after) {
        (0, _) => how.into(),
        (n, Some((step, seq))) => format!("{how}, {n} lost after step {step} seq {seq}"),
        (n, None) => format!("{how}, {n} lost before its first record"),
    }
}

/// The rank, step and communicator tables.
fn print_tables(out: &mut impl Write, l: &Listing, comms: &[CommEntry]) -> anyhow::Result<()> {
    let (ranks, steps) = (&l.ranks, &l.steps);
    writeln!(out)?;
    let mut rows = vec![[
        "rank", "pid", "host", "steps", "records", "gaps", "raw", "stored", "ratio", "exit",
    ]
    .map(String::from)
    .to_vec()];
    for r in ranks.values() {
        rows.push(vec![
            r.rank.to_string(),
            r.pid.map_or("-".into(), |p| p.to_string()),
            r.hostname.as_deref().map_or_else(|| "-".into(), esc),
            steps_set(&r.steps),
            r.records.to_string(),
            if r.gap_tally.count() == 0 {
                r.gaps.to_string()
            } else {
                format!("{} ({})", r.gaps, r.gap_tally.reasons())
            },
            human(r.bytes_raw),
            human(r.bytes_stored),
            ratio(r.bytes_raw, r.bytes_stored),
            exit_cell(r),
        ]);
    }
    print_table(out, &rows)?;
    let raw: u64 = ranks.values().map(|r| r.bytes_raw).sum();
    let deduped: u64 = ranks.values().map(|r| r.bytes_deduped).sum();
    writeln!(out, "dedup    {}", dedup_note(raw, deduped))?;
    if let Some(line) = gaps_note(ranks.values()) {
        writeln!(out, "{line}")?;
    }
    writeln!(out)?;
    let mut rows = vec![["step", "ranks", "records", "gaps", "raw", "stored"]
        .map(String::from)
        .to_vec()];
    for s in steps.values() {
        rows.push(vec![
            s.step.to_string(),
            steps_set(&s.ranks.iter().map(|&r| r as u64).collect::<Vec<_>>()),
            s.records.to_string(),
            s.gaps.to_string(),
            human(s.bytes_raw),
            human(s.bytes_stored),
        ]);
    }
    print_table(out, &rows)?;
    writeln!(out)?;
    if comms.is_empty() {
        writeln!(out, "communicators: none")?;
    } else {
        writeln!(
            out,
            "communicators (members: the global rank of each communicator rank)"
        )?;
        let mut rows = vec![["key", "size", "created by", "parent/color", "members"]
            .map(String::from)
            .to_vec()];
        for c in comms {
            let members: Vec<String> = c
                .members
                .iter()
                .map(|m| m.map_or("?".into(), |r| r.to_string()))
                .collect();
            rows.push(vec![
                format!("{:#018x}", c.key),
                c.size.to_string(),
                c.api.clone(),
                match (c.parent, c.color) {
                    (Some(p), Some(col)) => format!("{p:#x}/{col}"),
                    (Some(p), None) => format!("{p:#x}"),
                    _ => "-".into(),
                },
                format!("[{}]", members.join(", ")),
            ]);
        }
        print_table(out, &rows)?;
    }
    Ok(())
}

/// What processes warned about their capture when they exited (`ranks[].warnings`: a step
/// rule that numbered the whole run step 0), one line per rank and warning, `WARNING rank R
/// (pid P): ...`; at most `most` lines, then how many more there are. The warnings quote the
/// program's NVTX names: their control characters are escaped.
pub(crate) fn warning_lines<'a>(
    ranks: impl Iterator<Item = (u32, u32, &'a [String])>,
    most: usize,
) -> Vec<String> {
    let all: Vec<String> = ranks
        .flat_map(|(rank, pid, ws)| {
            ws.iter()
                .map(move |w| format!("WARNING rank {rank} (pid {pid}): {}", esc(w)))
        })
        .collect();
    let more = all.len().saturating_sub(most);
    let mut lines: Vec<String> = all.into_iter().take(most).collect();
    if more > 0 {
        lines.push(format!(
            "WARNING ... and {more} more (`ttrace ls STORE` lists every one)"
        ));
    }
    lines
}

/// `0-3,7` from a list (`-` when empty).
fn steps_set(v: &[u64]) -> String {
    let set: BTreeSet<u64> = v.iter().copied().collect();
    if set.is_empty() {
        return "-".into();
    }
    RangeSet::of_values(set).to_string()
}

/// The dedup ratio of a store: tensor bytes its records reference over the bytes stored once
/// (before compression), e.g. `2.00x (8.0 MiB of tensors, 4.0 MiB stored once)`.
pub(crate) fn dedup_note(raw: u64, deduped: u64) -> String {
    let distinct = raw.saturating_sub(deduped);
    let r = if distinct == 0 {
        1.0
    } else {
        raw as f64 / distinct as f64
    };
    format!(
        "{r:.2}x ({} of tensors, {} stored once)",
        human(raw),
        human(distinct)
    )
}

fn ratio(raw: u64, stored: u64) -> String {
    if stored == 0 {
        "-".into()
    } else {
        format!("{:.1}x", raw as f64 / stored as f64)
    }
}

/// A command line as a shell would read it back.
fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_and_words_print_compactly() {
        assert_eq!(steps_set(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(steps_set(&[]), "-");
        assert_eq!(
            shell_words(&["python".into(), "a b".into(), "it's".into()]),
            r"python 'a b' 'it'\''s'"
        );
    }

    #[test]
    fn warnings_are_listed_per_rank_up_to_a_bound() {
        let w = |s: &str| vec![s.to_string()];
        let (a, b, none) = (w("step 0 only"), w("no mark"), Vec::new());
        let ranks = || {
            [(0, 10, &a), (1, 11, &none), (2, 12, &b)]
                .into_iter()
                .map(|(r, p, ws)| (r, p, ws.as_slice()))
        };
        assert_eq!(
            warning_lines(ranks(), usize::MAX),
            [
                "WARNING rank 0 (pid 10): step 0 only",
                "WARNING rank 2 (pid 12): no mark"
            ]
        );
        let bounded = warning_lines(ranks(), 1);
        assert_eq!(bounded.len(), 2);
        assert!(bounded[1].contains("1 more"), "{bounded:?}");
        // A program's NVTX name quoted in a warning does not drive the terminal.
        let hostile = w("no NVTX range named `\x1b[2J`");
        let lines = warning_lines([(3, 13, hostile.as_slice())].into_iter(), usize::MAX);
        assert!(!lines[0].contains('\x1b'), "{lines:?}");
    }
}
