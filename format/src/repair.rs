//! The repair policy of a whole store (`ttrace fsck`): which issues a repair can fix, when a
//! store must not be repaired (its collector may still write it), and in which order the
//! repairs of [`crate::recover`] run so that each one sees what the previous ones fixed.

use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::reader::{Issue, IssueKind, Segment, SegmentInfo, Store};
use crate::recover::{
    check_counts, check_segment, lost_found_dir, rebuild_index, rebuild_manifest,
    repair_frame_headers, repair_header, set_aside_headerless, truncate_tail,
    write_rebuilt_manifest, SegmentCheck,
};
use crate::store::{index_path, manifest_path};
use crate::FormatError;

/// How recently a segment of a store that is not finalized must have been written for the
/// store to count as live (its collector may still be writing it).
const LIVE_WITHIN: Duration = Duration::from_secs(60);

/// Everything one check of a store found.
pub struct StoreCheck {
    /// Each segment that opened, checked.
    pub checks: Vec<SegmentCheck>,
    /// Every issue: the store's own (manifest, listing), each segment's, the record counts'
    /// against the manifest, then segments whose header could not be read.
    pub issues: Vec<Issue>,
    /// Segments that did not open (index into [`Store::segments`]), with why.
    unopened: Vec<(usize, FormatError)>,
}

impl StoreCheck {
    /// Intact records in the segments that opened.
    pub fn records(&self) -> u64 {
        self.checks.iter().map(|c| c.records).sum()
    }

    /// Whether a repair can fix at least one of the issues.
    pub fn repairable(&self) -> bool {
        self.issues.iter().any(|i| repairable(i.kind))
    }
}

/// Whether a repair can fix an issue of this kind (corrupt records in the middle of a
/// segment cannot: readers skip them and every other record reads).
pub fn repairable(kind: IssueKind) -> bool {
    matches!(
        kind,
        IssueKind::MissingIndex
            | IssueKind::DamagedIndex
            | IssueKind::RecoveredByIndex
            | IssueKind::TornTail
            | IssueKind::BadManifest
            | IssueKind::BadHeader
    )
}

/// An issue as a segment whose header cannot be read reports it.
fn header_issue(info: &SegmentInfo, e: &FormatError) -> Issue {
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

/// Checks every segment of `store` (`deep`: every tensor decompressed against its CRC-32,
/// else records against their checksums only); `progress` counts the segment bytes done.
pub fn check_store(store: &Store, deep: bool, progress: &mut dyn FnMut(u64)) -> StoreCheck {
    let mut checks = Vec::new();
    let mut unopened = Vec::new();
    let mut header_issues = Vec::new();
    for (k, info) in store.segments().iter().enumerate() {
        match Segment::open_as(&info.path, Some((info.rank, info.step))) {
            Ok(seg) => checks.push(check_segment(&seg, deep, progress)),
            Err(e) => {
                header_issues.push(header_issue(info, &e));
                unopened.push((k, e));
                progress(info.bytes);
            }
        }
    }
    let mut issues = store.issues().to_vec();
    issues.extend(checks.iter().flat_map(|c| c.issues.iter().cloned()));
    issues.extend(check_counts(store, &checks));
    issues.extend(header_issues);
    StoreCheck {
        checks,
        issues,
        unopened,
    }
}

/// `Some(seconds since its newest segment was written)` when `store` looks live: not
/// finalized, and a segment written less than a minute ago.
pub fn looks_live(store: &Store) -> Option<u64> {
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
    (age < LIVE_WITHIN).then_some(age.as_secs())
}

/// Repairs what `found` (a check of `store`, the store at `run`) says can be repaired, in
/// order: segment headers first (a restored header makes its segment checkable), torn tails,
/// then from a fresh look frame headers, indexes and a missing manifest. Returns one line
/// per repair. Nothing intact is deleted: cut bytes go to `RUN/lost+found/`.
pub fn repair_store(
    run: &Path,
    store: &Store,
    found: &StoreCheck,
) -> Result<Vec<String>, FormatError> {
    let mut repairs = Vec::new();
    let lost_found = lost_found_dir(run);
    for (k, e) in &found.unopened {
        let info = &store.segments()[*k];
        if !matches!(e, FormatError::Corrupt(_)) {
            continue;
        }
        if repair_header(run, &info.path, info.rank, info.step)? {
            repairs.push(format!(
                "{}: restored the segment header (old one saved in {})",
                info.path.display(),
                lost_found.display()
            ));
        } else if set_aside_headerless(run, &info.path)? {
            repairs.push(format!(
                "{}: removed (shorter than a segment header: it held no record)",
                info.path.display()
            ));
        }
    }
    for c in &found.checks {
        if let Some(at) = c.torn_at {
            let cut = truncate_tail(run, &c.path, at)?;
            repairs.push(format!(
                "{}: cut the torn tail ({cut} bytes from byte {at}, saved in {})",
                c.path.display(),
                lost_found.display()
            ));
        }
    }
    // Indexes and the manifest from a fresh look (cut tails, restored headers).
    let fresh = Store::open(run)?;
    let again = check_store(&fresh, false, &mut |_| {});
    for c in &again.checks {
        let n = repair_frame_headers(run, c)?;
        if n > 0 {
            repairs.push(format!(
                "{}: restored {n} damaged frame header(s) from the index",
                c.path.display()
            ));
        }
        if rebuild_index(c)? {
            repairs.push(format!(
                "{}: wrote its index ({} records)",
                index_path(&c.path).display(),
                c.records
            ));
        }
    }
    if fresh.manifest().is_none() {
        let m = rebuild_manifest(&fresh, &again.checks);
        write_rebuilt_manifest(run, &m)?;
        repairs.push(format!(
            "{}: rebuilt from the segments ({} ranks, {} communicators; command and \
             environment {})",
            manifest_path(run).display(),
            m.ranks.len(),
            m.comms.len(),
            if m.command.is_empty() {
                "unknown"
            } else {
                "salvaged"
            }
        ));
    }
    Ok(repairs)
}
