//! `ttrace check`: silent bugs found in one distributed trace, without a reference run.
//!
//! Three kinds of evidence (each in its own module):
//!
//! * [`collectives`]: every collective's output is determined by its group's inputs. Calls
//!   are grouped per communicator by call order (the n-th collective on a communicator on each
//!   member; send/recv pairs by the n-th transfer between two communicator ranks), membership
//!   from the manifest's comm map. Reductions are checked against the f64 reduction of the
//!   captured inputs within a bound of round-off (see [`crate::tolerance::reduction_bound`]); NCCL's
//!   ring order is not reproduced, so the check is a tolerance, not bitwise. Gathers,
//!   broadcasts and point-to-point transfers are bitwise.
//! * [`replicas`]: tensors every member must hold identically (the outputs of all-reduce and
//!   all-gather; GEMM weight operands across data-parallel replicas) are compared bitwise;
//!   tensor-parallel groups are checked for diverging replicated activations and overlapping
//!   weight shards.
//! * [`layers`]: the same GEMM of every layer accumulates (or overwrites) alike.
//! * [`nonfinite`]: the first NaN or Inf in execution order, and whether it came in through
//!   the op's inputs or was produced by it.
//!
//! The store is read a step at a time ([`load::stream`], every rank's segment of the step at
//! once, on every core) and each check keeps what it needs of a step's records, not the
//! records: memory holds one step's records, the calls and transfers still waiting for a
//! member, the last step's weight operands (each rank's first two steps' too) and the
//! findings (on the hidden-32 trainer over 160 steps 21 MB, over 600 steps 31 MB, where
//! holding every record took 167 MB at 160; the same report). The calls a step
//! completes are checked side by side ([`collectives::batches`]). A collective call's tensors are read when that call is checked and dropped after
//! ([`load::Trace::with_bytes`]); GEMM operands are compared through their recorded CRC-32s
//! (a differing CRC is a differing tensor; bytes are decoded to look for non-finite values,
//! and re-read for the weights of the first step when shards are compared).

pub mod collectives;
pub mod layers;
pub mod load;
pub mod nonfinite;
pub mod persistent;
pub mod replicas;
pub mod report;

use std::path::Path;

use rayon::prelude::*;

use ttrace_format::FormatError;

use crate::model::store::OpenError;

pub use report::{Finding, FindingKind, Report};

/// Errors of `ttrace check` (as opposed to findings, which are in the [`Report`]).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The store could not be read.
    #[error("{0}")]
    Format(#[from] FormatError),
    /// The store has no manifest (run `ttrace fsck --repair` first).
    #[error("{0}: no readable manifest (try `ttrace fsck --repair`)")]
    NoManifest(String),
}

impl From<OpenError> for CheckError {
    fn from(e: OpenError) -> CheckError {
        match e {
            OpenError::Store { source, .. } => CheckError::Format(source),
            OpenError::NoManifest(path) => CheckError::NoManifest(path),
        }
    }
}

/// What the store keeps of the segments it opened, for opening them again
/// ([`ttrace_format::reader::Store::set_located_budget`]): about 33 bytes a record, so the
/// segments of a quarter of a million records.
const LOCATED_BYTES: u64 = 8 << 20;

/// The most bytes of collective tensors read for calls checked side by side: a gradient
/// bucket's all-reduce reads every member's input and output, so calls are not all checked at
/// once on a machine of many cores.
const CALL_BYTES: u64 = 512 << 20;

/// Runs every check on the store at `run` (opened through [`crate::model`], the analysis
/// model compare shares), a step at a time ([`load::stream`]): memory holds one step's
/// records, the calls and transfers still waiting for a member, and what the replica checks
/// keep ([`replicas::Replicas`]), not the trace's records. `progress` is called with (records read, records in
/// the store) as segments are read.
pub fn check_store(run: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<Report, CheckError> {
    let (store, manifest) = crate::model::store::open(run)?;
    // The segments' frame tables kept for opening them again (a call's bytes are read from
    // its segment, mostly of the step being read): within a bound, not one per segment of
    // the trace.
    store.set_located_budget(LOCATED_BYTES);
    let store = std::sync::Arc::new(store);
    let ranks = store.ranks();
    // A rank that stopped early is waited for no longer than its last step.
    let last_steps = ranks
        .iter()
        .filter_map(|&rank| store.steps(rank).into_iter().max().map(|s| (rank, s)))
        .collect();
    let mut calls = collectives::CallGroups::new(&manifest, &ranks).with_last_steps(last_steps);
    let mut coll = collectives::Collectives::default();
    let mut rep = replicas::Replicas::new(store.clone(), &manifest, &ranks);
    let mut layer_findings = Vec::new();
    let mut gaps = ttrace_format::record::GapTally::default();
    let mut records = 0u64;
    let trace = load::stream(&store, progress, &mut |step: &mut load::Trace| {
        records += step.records.len() as u64;
        layer_findings.extend(layers::check(step));
        rep.step(step);
        for r in &step.records {
            if let ttrace_format::record::Op::Gap(g) = &r.record.op {
                gaps.add(g);
            }
        }
        // The collectives are kept until their call or transfer is checked; the rest go.
        let mut complete = Vec::new();
        for r in std::mem::take(&mut step.records) {
            complete.extend(coll.feed(&mut calls, step, &manifest, r));
        }
        if let Some(s) = step.step {
            complete.extend(calls.ended(s));
            coll.ended(step, &calls, s);
        }
        // The calls the step completed, checked side by side (each reads its members' bytes
        // again), in batches of at most CALL_BYTES of them.
        let step: &load::Trace = step;
        for batch in collectives::batches(&complete, CALL_BYTES) {
            let outcomes: Vec<collectives::Outcome> = batch
                .par_iter()
                .map(|call| collectives::call_outcome(step, &manifest, call))
                .collect();
            for (call, out) in batch.iter().zip(outcomes) {
                coll.add_call(call.0, out);
                let members: Vec<&load::Rec> = call.1.iter().collect();
                rep.received(call.0, &members);
            }
        }
    })?;
    let left = calls.finish();
    for (key, recs) in &left {
        let members: Vec<&load::Rec> = recs.iter().collect();
        rep.received(*key, &members);
    }
    let coll = coll.finish(&trace, &manifest, left);
    let rep = rep.finish();
    let mut report = Report {
        ranks: trace.ranks.len(),
        records,
        ..Report::default()
    };
    let world = crate::model::comms::world_size(&manifest, &trace.ranks);
    report.missing_ranks = (0..world).filter(|r| !trace.ranks.contains(r)).collect();
    report.collectives_checked = coll.checked;
    report.transfers_unchecked = coll.peer_missing;
    report.findings.extend(coll.findings);
    report.replica_groups = rep.groups;
    report.weights_compared = rep.compared;
    report.stale_weights_unjudged = rep.stale_unjudged;
    report.findings.extend(rep.findings);
    report.findings.extend(layer_findings);
    report.nonfinite = trace.first_nonfinite.clone();
    if let Some(nf) = &trace.first_nonfinite {
        report.findings.push(nf.to_finding());
    }
    for issue in store.issues() {
        if issue.kind.loses_data() {
            report.unreadable.push(issue.to_string());
        }
    }
    report.unreadable.extend(trace.unreadable.iter().cloned());
    // A collective tensor that did not decode when read is said again when its call is
    // checked (its bytes are read again): said once.
    for line in trace.late_unreadable() {
        if !report.unreadable.contains(&line) {
            report.unreadable.push(line);
        }
    }
    let lost = crate::losses::CaptureLosses::counted(&gaps, &manifest);
    (report.gaps, report.gap_bytes) = (lost.gaps, lost.gap_bytes);
    (report.unpublished, report.not_stored) = (lost.unpublished, lost.not_stored);
    report.sort();
    Ok(report)
}
