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
//! A collective call's tensors are read when that call is checked and dropped after
//! ([`load::Trace::with_bytes`]): memory holds every record's metadata, not the trace's
//! bytes (on the large benchmark config, 283 MB peak over 3 steps and 883 MB over 10 before;
//! 52 and 61 MB after, the same report); GEMM
//! operands are compared through their recorded CRC-32s (a differing CRC is a differing
//! tensor; bytes are decoded to look for non-finite values, and re-read for the weights of
//! the first step when shards are compared).

pub mod collectives;
pub mod layers;
pub mod load;
pub mod nonfinite;
pub mod persistent;
pub mod replicas;
pub mod report;

use std::path::Path;

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

/// Runs every check on the store at `run` (opened through [`crate::model`], the analysis
/// model compare shares). `progress` is called with (records read, records
/// in the store) as segments are read.
pub fn check_store(run: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<Report, CheckError> {
    let (store, manifest) = crate::model::store::open(run)?;
    let store = std::sync::Arc::new(store);
    let trace = load::load(&store, progress)?;
    let mut report = Report {
        ranks: trace.ranks.len(),
        records: trace.records.len() as u64,
        ..Report::default()
    };
    let world = crate::model::comms::world_size(&manifest, &trace.ranks);
    report.missing_ranks = (0..world).filter(|r| !trace.ranks.contains(r)).collect();
    let coll = collectives::check(&trace, &manifest);
    report.collectives_checked = coll.checked;
    report.transfers_unchecked = coll.peer_missing;
    report.findings.extend(coll.findings);
    let rep = replicas::check(&trace, &manifest, &store);
    report.replica_groups = rep.groups;
    report.weights_compared = rep.compared;
    report.findings.extend(rep.findings);
    report.findings.extend(layers::check(&trace));
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
    report.unreadable.extend(trace.late_unreadable());
    let lost = crate::losses::CaptureLosses::counted(
        trace.records.iter().map(|r| &r.record.op),
        &manifest,
    );
    (report.gaps, report.gap_bytes) = (lost.gaps, lost.gap_bytes);
    (report.unpublished, report.not_stored) = (lost.unpublished, lost.not_stored);
    report.sort();
    Ok(report)
}
