//! What `ttrace check` found, as one screen of text or JSON.

use std::fmt;

use serde::Serialize;

use crate::check::nonfinite::NonFinite;

/// What kind of evidence a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// The first NaN or Inf (listed first: it is the most direct evidence).
    NonFinite,
    /// A collective's output is not what its group's inputs make.
    CollectiveMismatch,
    /// Members of a collective call disagree on its count, type, reduction or root, or a
    /// member never made the call.
    CollectiveShape,
    /// A send without its recv (or the reverse), or the bytes differ.
    PointToPoint,
    /// Tensors that must be identical across a replica group are not.
    ReplicaMismatch,
    /// A weight (or part of one) did not change when the optimizer stepped.
    StaleWeight,
    /// One layer calls a GEMM differently from the same GEMM of the other layers.
    LayerInconsistency,
}

impl FindingKind {
    /// A short name for text reports.
    pub fn label(self) -> &'static str {
        match self {
            FindingKind::CollectiveMismatch => "collective",
            FindingKind::CollectiveShape => "collective-shape",
            FindingKind::PointToPoint => "send/recv",
            FindingKind::ReplicaMismatch => "replica",
            FindingKind::LayerInconsistency => "layers",
            FindingKind::StaleWeight => "stale-weight",
            FindingKind::NonFinite => "non-finite",
        }
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    /// The step where it shows.
    pub step: u64,
    /// The ranks concerned (those that disagree, or the one that holds it).
    pub ranks: Vec<u32>,
    /// The op (`rank R step S seq Q API`), or the collective call.
    pub op: String,
    /// The innermost NVTX range (the module), when known.
    pub module: String,
    /// What is wrong, for people.
    pub detail: String,
}

/// Everything `ttrace check` found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Ranks and records read.
    pub ranks: usize,
    pub records: u64,
    /// Collective calls (and send/recv pairs) checked.
    pub collectives_checked: u64,
    /// Replica groups found (sets of global ranks) and weight operands compared across them.
    pub replica_groups: Vec<Vec<u32>>,
    pub weights_compared: u64,
    /// The first non-finite value, if any.
    pub nonfinite: Option<NonFinite>,
    /// Findings, earliest step first.
    pub findings: Vec<Finding>,
    /// What could not be read (skipped, not a finding about the training).
    pub unreadable: Vec<String>,
    /// Ranks of the world (per the manifest) that hold no records in the store: not captured
    /// (`ttrace run --ranks`) or lost. What needs them is not checked.
    pub missing_ranks: Vec<u32>,
    /// Send/recv transfers not checked because their peer is a missing rank.
    pub transfers_unchecked: u64,
    /// Weights were found but no rank holds them in two consecutive steps (`--steps 0,2`, or
    /// one step): stale weights were not looked for.
    pub stale_weights_unjudged: bool,
    /// Gap records (tensors not captured) by reason, as docs/format.md names them.
    pub gaps: std::collections::BTreeMap<String, u64>,
    /// Bytes the gaps would have captured, where known.
    pub gap_bytes: u64,
    /// Snapshots taken but never published (a process died holding them), every rank.
    pub unpublished: u64,
    /// Records the collector received but could not store (the manifest's `lost`).
    pub not_stored: u64,
}

impl Report {
    /// Whether anything was found (exit status 1).
    pub fn has_findings(&self) -> bool {
        !self.findings.is_empty()
    }

    /// Whether the capture lost data (gaps, unpublished snapshots, unreadable records): what
    /// it lost was not checked, so "no finding" is not a clean run.
    pub fn incomplete(&self) -> bool {
        !self.gaps.is_empty()
            || self.unpublished > 0
            || self.not_stored > 0
            || !self.unreadable.is_empty()
    }

    /// Exit status of `ttrace check`: 1 findings, else 5 an incomplete capture
    /// ([`crate::losses::EXIT_INCOMPLETE`]), else 0.
    pub fn exit_code(&self) -> i32 {
        if self.has_findings() {
            1
        } else if self.incomplete() {
            crate::losses::EXIT_INCOMPLETE
        } else {
            0
        }
    }

    /// Orders findings by step, then kind (a stable sort keeps each check's own order).
    /// Identical findings (the same evidence found through two groups or uses) are kept once.
    pub fn sort(&mut self) {
        let mut seen = std::collections::BTreeSet::new();
        self.findings.retain(|f| {
            seen.insert((
                f.kind,
                f.step,
                f.ranks.clone(),
                f.op.clone(),
                f.module.clone(),
                f.detail.clone(),
            ))
        });
        self.findings.sort_by_key(|f| (f.step, f.kind));
    }
}

/// Findings of one kind shown in full in text; the rest are counted.
const SHOWN_PER_KIND: usize = 3;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "checked {} records on {} ranks: {} collective calls, {} weight operands across {} replica groups",
            self.records,
            self.ranks,
            self.collectives_checked,
            self.weights_compared,
            self.replica_groups.len()
        )?;
        if self.findings.is_empty() {
            writeln!(f, "no finding")?;
        } else {
            writeln!(f, "{} findings:", self.findings.len())?;
            let mut kinds: Vec<FindingKind> = self.findings.iter().map(|x| x.kind).collect();
            kinds.sort();
            kinds.dedup();
            for kind in kinds {
                let of: Vec<&Finding> = self.findings.iter().filter(|x| x.kind == kind).collect();
                for x in of.iter().take(SHOWN_PER_KIND) {
                    // Names come from the traced program: no control characters.
                    let esc = crate::report::text::escape_controls;
                    let module = if x.module.is_empty() {
                        String::new()
                    } else {
                        format!(" [{}]", esc(&x.module))
                    };
                    writeln!(
                        f,
                        "  {:<16} step {} ranks {:?}: {}{module}\n    {}",
                        kind.label(),
                        x.step,
                        x.ranks,
                        esc(&x.op),
                        esc(&x.detail)
                    )?;
                }
                if of.len() > SHOWN_PER_KIND {
                    writeln!(
                        f,
                        "  ... and {} more {}",
                        of.len() - SHOWN_PER_KIND,
                        kind.label()
                    )?;
                }
            }
        }
        if !self.missing_ranks.is_empty() {
            writeln!(
                f,
                "not checked: ranks {:?} of the world hold no records (not captured, or lost); \
                 {} send/recv transfers with them and their replicas' weights were not checked",
                self.missing_ranks, self.transfers_unchecked
            )?;
        }
        if self.stale_weights_unjudged {
            writeln!(
                f,
                "not checked: stale weights (no rank holds its weights in two consecutive \
                 steps: capture two, e.g. --steps 0-1)"
            )?;
        }
        if !self.unreadable.is_empty() {
            writeln!(
                f,
                "{} records or tensors could not be read and were skipped (ttrace fsck RUN)",
                self.unreadable.len()
            )?;
        }
        if let Some(g) = crate::losses::describe_gaps(&self.gaps, self.gap_bytes) {
            writeln!(f, "INCOMPLETE CAPTURE: {g}: what they lost was not checked")?;
        }
        if self.unpublished > 0 {
            writeln!(
                f,
                "INCOMPLETE CAPTURE: {} snapshots were taken but never published (a process \
                 died): what they held was not checked",
                self.unpublished
            )?;
        }
        if self.not_stored > 0 {
            writeln!(
                f,
                "INCOMPLETE CAPTURE: {} records were received but could not be stored (the \
                 manifest's lost[]): what they held was not checked",
                self.not_stored
            )?;
        }
        Ok(())
    }
}
