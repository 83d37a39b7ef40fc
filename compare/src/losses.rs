//! What a store's capture lost: gap records (tensors that were not captured, by reason),
//! snapshots a process took but never published (it died with them) and records that cannot
//! be read. Nothing is lost silently: a comparison or a check of a store that lost data says
//! so, and never exits as clean (`ttrace compare` exits 5 instead of 0 on such a match,
//! `ttrace check` 5 instead of 0 with no finding).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use ttrace_format::record::GapTally;
use ttrace_format::store::Manifest;

use crate::trace::RunTrace;

/// Exit status of `ttrace compare` (a match) and `ttrace check` (no finding) when a store
/// lost data: what was compared is fine, but not everything was there to compare.
pub const EXIT_INCOMPLETE: i32 = 5;

/// What one store's capture lost: gaps in the steps looked at; the other counts store-wide
/// (the manifest and the reader do not file them by step).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureLosses {
    /// Which store: `reference`, `run` or `perturbed`.
    pub store: String,
    /// The store's directory as given.
    pub path: String,
    /// Gap records in the steps looked at, by reason (as docs/format.md names them).
    pub gaps: BTreeMap<String, u64>,
    /// Bytes the gaps would have captured, where the tracer knew them.
    pub gap_bytes: u64,
    /// Snapshots taken but never published, over every rank (a process died holding them;
    /// the manifest's `unpublished`).
    pub unpublished: u64,
    /// Records that could not be read (damaged on disk; each is also a warning).
    pub unreadable: u64,
    /// Records the collector received but could not store (the manifest's `lost`: a full
    /// disk, a write error).
    #[serde(default)]
    pub not_stored: u64,
}

impl CaptureLosses {
    /// What `t` (the `store` of the comparison) lost in `steps`.
    pub fn of(store: &str, t: &RunTrace, steps: &[u64]) -> CaptureLosses {
        let ranks = t.ranks();
        // Counted by reason when the store was opened.
        let mut gaps = GapTally::default();
        for &rank in &ranks {
            for &step in steps {
                gaps.merge(t.gaps(rank, step));
            }
        }
        CaptureLosses {
            store: store.to_string(),
            path: t.path.display().to_string(),
            // What could not be read at opening, and what was read then but not since.
            unreadable: t.unreadable.len() as u64
                + t.late_unreadable().iter().map(|(_, n)| n).sum::<u64>(),
            ..CaptureLosses::counted(&gaps, &t.manifest)
        }
    }

    /// The gaps counted in `gaps` and the manifest's store-wide counts (snapshots never
    /// published, records not stored); no name, path or unreadable records.
    pub fn counted(gaps: &GapTally, manifest: &Manifest) -> CaptureLosses {
        CaptureLosses {
            gaps: gaps
                .by_reason
                .iter()
                .map(|(r, n)| (r.to_string(), *n))
                .collect(),
            gap_bytes: gaps.bytes,
            unpublished: manifest.ranks.iter().map(|r| r.unpublished).sum(),
            not_stored: manifest.lost.iter().map(|l| l.records).sum(),
            ..CaptureLosses::default()
        }
    }

    /// Nothing was lost.
    pub fn is_empty(&self) -> bool {
        self.gaps.is_empty()
            && self.unpublished == 0
            && self.unreadable == 0
            && self.not_stored == 0
    }

    /// `run: 3 gaps (copy_refused 2, ring_full 1, 1.5 MB), 4 snapshots never published`.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = describe_gaps(&self.gaps, self.gap_bytes)
            .into_iter()
            .collect();
        if self.unpublished > 0 {
            parts.push(format!(
                "{} snapshot{} taken but never published (a process died)",
                self.unpublished,
                if self.unpublished == 1 { "" } else { "s" }
            ));
        }
        if self.unreadable > 0 {
            parts.push(format!("{} unreadable records", self.unreadable));
        }
        if self.not_stored > 0 {
            parts.push(format!(
                "{} records received but not stored (the manifest's lost[])",
                self.not_stored
            ));
        }
        format!("{} {}: {}", self.store, self.path, parts.join("; "))
    }
}

/// The losses of each store that lost something, in the order given.
pub fn of_stores(stores: &[(&str, &RunTrace)], steps: &[u64]) -> Vec<CaptureLosses> {
    stores
        .iter()
        .map(|(name, t)| CaptureLosses::of(name, t, steps))
        .filter(|l| !l.is_empty())
        .collect()
}

/// `3 gaps (copy_refused 2, ring_full 1, 4096 bytes not captured)`; `None` without gaps.
pub fn describe_gaps(gaps: &BTreeMap<String, u64>, bytes: u64) -> Option<String> {
    let count: u64 = gaps.values().sum();
    (count > 0).then(|| {
        let reasons: Vec<String> = gaps.iter().map(|(r, n)| format!("{r} {n}")).collect();
        format!(
            "{count} gap{} ({}, {bytes} bytes not captured)",
            if count == 1 { "" } else { "s" },
            reasons.join(", "),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_that_lost_nothing_says_nothing_and_one_that_did_says_what() {
        let none = CaptureLosses {
            store: "run".into(),
            path: "runs/tp2".into(),
            ..CaptureLosses::default()
        };
        assert!(none.is_empty());
        let lost = CaptureLosses {
            gaps: BTreeMap::from([("copy_refused".to_string(), 2), ("ring_full".into(), 1)]),
            gap_bytes: 4096,
            unpublished: 1,
            ..none.clone()
        };
        assert!(!lost.is_empty());
        assert_eq!(
            lost.describe(),
            "run runs/tp2: 3 gaps (copy_refused 2, ring_full 1, 4096 bytes not captured); \
             1 snapshot taken but never published (a process died)"
        );
    }
}
