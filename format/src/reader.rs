//! Reading a trace store: open a run directory, list its ranks and steps, and read records and
//! tensors from its segments, surviving what a crash or a bad disk leaves behind.
//!
//! A [`Store`] lists the segments (`RUN/rankNNNNN/stepNNNNNN.seg`) and reads the manifest
//! through [`Manifest::read`] (which refuses an unknown major version). A [`Segment`] is opened
//! through [`SegmentHeader::read`] (the same header and version check every reader uses), then
//! memory-mapped: frames are read in place, never loaded whole, and a record's tensors are
//! decoded one at a time.
//!
//! Recovery rules (docs/format.md, "Reading and recovery"):
//!
//! * The index (`.idx`) is used when it agrees with the segment (every entry inside the file,
//!   in order, and on a frame header with the same length and CRC). A missing index is rebuilt
//!   in memory by scanning; so is one that disagrees (reported as damaged). Bytes the index
//!   does not cover (after its last entry, or between entries) are scanned too.
//! * A frame whose body does not match its CRC is reported with its rank, step and seq (the
//!   seq from the index, else bracketed by the intact neighbours) and skipped; scanning resumes
//!   at the next intact frame, so every other record stays readable.
//! * A frame cut short by the end of the file is a torn tail, dropped with a warning.
//! * Checksums are verified when a record is read ([`Segment::read`]); metadata-only reads
//!   ([`Segment::read_meta`]) skip the body CRC for speed (listing a store).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::Serialize;

use crate::codec;
use crate::frame::{FrameHeader, SegmentHeader};
use crate::record::{Record, Tensor};
use crate::store::{
    index_path, parse_body, read_index, BlobRef, Frame, IndexEntry, Manifest, FRAME_HEADER_BYTES,
    FRAME_MAGIC, SEGMENT_HEADER_BYTES,
};
use crate::tensor::TensorData;
use crate::FormatError;

/// What kind of problem a reader met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IssueKind {
    /// A record whose bytes do not match their checksum or do not decode: skipped.
    CorruptRecord,
    /// The segment ends inside a record (its writer was killed): the partial record is dropped.
    TornTail,
    /// The segment has no index (its writer never closed it): rebuilt by scanning.
    MissingIndex,
    /// The index does not match the segment: rebuilt by scanning.
    DamagedIndex,
    /// A frame header is damaged but the index located its intact body.
    RecoveredByIndex,
    /// The segment's header (magic, version, or rank and step) is unusable or disagrees with its
    /// file name.
    BadHeader,
    /// A record claims another rank or step than its segment, or repeats a seq.
    Inconsistent,
    /// A tensor's bytes do not decode or do not match the record's CRC-32.
    BadTensor,
    /// Fewer intact records than the manifest counts.
    LostRecords,
    /// `manifest.json` is missing or unreadable: run details are unknown.
    BadManifest,
    /// A file or directory in the store that is not part of the format.
    Stray,
    /// A streamed tensor whose file was never completed (`streams/*.part`: its process or
    /// the collector died mid-stream): the tensor is lost, its bytes are never read.
    PartialStream,
}

impl IssueKind {
    /// Whether records or bytes were lost (as opposed to a structure a reader rebuilt).
    pub fn loses_data(self) -> bool {
        matches!(
            self,
            IssueKind::CorruptRecord
                | IssueKind::TornTail
                | IssueKind::BadHeader
                | IssueKind::BadTensor
                | IssueKind::LostRecords
                | IssueKind::PartialStream
        )
    }
}

/// What is known of the seq of a record that could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SeqHint {
    /// Known (read from the index or the record).
    Exact(u64),
    /// Between two intact neighbours (inclusive); `lo > hi` cannot happen.
    Between(u64, u64),
    /// After the last intact record.
    AtLeast(u64),
    /// Nothing to go by.
    Unknown,
}

impl fmt::Display for SeqHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SeqHint::Exact(s) => write!(f, "seq {s}"),
            SeqHint::Between(a, b) if a == b => write!(f, "seq {a}"),
            SeqHint::Between(a, b) => write!(f, "seq {a}..{b}"),
            SeqHint::AtLeast(a) => write!(f, "seq >= {a}"),
            SeqHint::Unknown => write!(f, "seq unknown"),
        }
    }
}

/// A problem found while reading, located as precisely as the data allows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Issue {
    pub kind: IssueKind,
    /// The file concerned.
    pub path: PathBuf,
    pub rank: Option<u32>,
    pub step: Option<u64>,
    pub seq: Option<SeqHint>,
    /// Byte offset in the file, when it applies.
    pub offset: Option<u64>,
    /// Bytes affected (skipped, dropped), when it applies.
    pub bytes: Option<u64>,
    /// What exactly is wrong and what the reader did about it.
    pub detail: String,
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut at = Vec::new();
        if let Some(r) = self.rank {
            at.push(format!("rank {r}"));
        }
        if let Some(s) = self.step {
            at.push(format!("step {s}"));
        }
        if let Some(q) = self.seq {
            at.push(q.to_string());
        }
        if !at.is_empty() {
            write!(f, "{}: ", at.join(" "))?;
        }
        let what = match self.kind {
            IssueKind::CorruptRecord => "corrupt record",
            IssueKind::TornTail => "torn tail",
            IssueKind::MissingIndex => "missing index",
            IssueKind::DamagedIndex => "damaged index",
            IssueKind::RecoveredByIndex => "damaged frame header",
            IssueKind::BadHeader => "bad segment header",
            IssueKind::Inconsistent => "inconsistent record",
            IssueKind::BadTensor => "bad tensor",
            IssueKind::LostRecords => "lost records",
            IssueKind::BadManifest => "manifest",
            IssueKind::Stray => "stray file",
            IssueKind::PartialStream => "partial streamed tensor",
        };
        write!(f, "{what}: {}", self.detail)?;
        match (self.offset, self.bytes) {
            (Some(o), Some(b)) => write!(f, " ({} at byte {o}, {b} bytes)", self.path.display()),
            (Some(o), None) => write!(f, " ({} at byte {o})", self.path.display()),
            _ => write!(f, " ({})", self.path.display()),
        }
    }
}

/// One segment file of a store, as listed (not opened).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentInfo {
    pub rank: u32,
    pub step: u64,
    pub path: PathBuf,
    /// Size of the segment file.
    pub bytes: u64,
    /// Whether an index file sits next to it.
    pub has_index: bool,
}

/// An opened store directory.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    manifest: Option<Manifest>,
    segments: Vec<SegmentInfo>,
    issues: Vec<Issue>,
    /// The stores of a set read as one (see [`crate::storeset`]); empty for one store.
    parts: Vec<PathBuf>,
    /// What opening each segment found (by rank and step), for opening it again without
    /// locating its frames again ([`Store::open_segment`]), within a budget.
    located: Mutex<LocatedCache>,
}

/// What opening segments found ([`Located`]), by rank and step, for opening them again:
/// within a byte budget when a reader sets one ([`Store::set_located_budget`]), the least
/// recently opened dropped first (a segment opened again after that is located again, as at
/// its first opening). Without one, every segment's is kept: a reader of a long trace sets
/// one, or it holds a frame table per segment of the whole trace (about 33 bytes a record).
struct LocatedCache {
    /// By (rank, step), least recently opened first.
    entries: lru::LruCache<(u32, u64), Arc<Located>>,
    bytes: u64,
    budget: Option<u64>,
}

impl Default for LocatedCache {
    fn default() -> LocatedCache {
        LocatedCache {
            entries: lru::LruCache::unbounded(),
            bytes: 0,
            budget: None,
        }
    }
}

impl std::fmt::Debug for LocatedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocatedCache")
            .field("segments", &self.entries.len())
            .field("bytes", &self.bytes)
            .field("budget", &self.budget)
            .finish()
    }
}

impl LocatedCache {
    /// What opening the segment of `key` found, marked as just used.
    fn get(&mut self, key: (u32, u64)) -> Option<Arc<Located>> {
        self.entries.get(&key).cloned()
    }

    /// Keeps `found` for `key`, dropping the least recently used past the budget.
    fn insert(&mut self, key: (u32, u64), found: Arc<Located>) {
        self.bytes += found.approx_bytes();
        if let Some(old) = self.entries.put(key, found) {
            self.bytes -= old.approx_bytes();
        }
        self.keep_within_budget();
    }

    fn keep_within_budget(&mut self) {
        let Some(budget) = self.budget else { return };
        while self.bytes > budget {
            let Some((_, oldest)) = self.entries.pop_lru() else {
                break;
            };
            self.bytes -= oldest.approx_bytes();
        }
    }
}

/// Parses `prefix` followed by decimal digits, then `suffix`.
fn numbered(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A store's manifest; a missing or unreadable one is an issue (the records stay readable),
/// an unknown major version an error.
fn read_manifest(root: &Path, issues: &mut Vec<Issue>) -> Result<Option<Manifest>, FormatError> {
    let detail = match Manifest::read(root) {
        Ok(m) => return Ok(Some(m)),
        Err(e @ FormatError::Version(_)) => return Err(e),
        Err(FormatError::File { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            "manifest.json is missing: the command, environment, ranks and communicators of the \
             run are unknown; the records are read from the segments (`ttrace fsck --repair` \
             rebuilds it)"
                .to_string()
        }
        Err(e) => format!(
            "unreadable ({e}); the records are read from the segments (`ttrace fsck --repair` \
             rebuilds it)"
        ),
    };
    issues.push(Issue {
        kind: IssueKind::BadManifest,
        path: crate::store::manifest_path(root),
        rank: None,
        step: None,
        seq: None,
        offset: None,
        bytes: None,
        detail,
    });
    Ok(None)
}

/// An entry of a store that is not part of it, ignored.
fn stray(path: PathBuf, rank: u32, detail: &str) -> Issue {
    Issue {
        kind: IssueKind::Stray,
        path,
        rank: Some(rank),
        step: None,
        seq: None,
        offset: None,
        bytes: None,
        detail: detail.into(),
    }
}

/// The segments of one rank directory; anything else in it but indexes is a stray issue.
fn list_rank_dir(
    dir: &Path,
    rank: u32,
    segments: &mut Vec<SegmentInfo>,
    issues: &mut Vec<Issue>,
) -> Result<(), FormatError> {
    for f in std::fs::read_dir(dir).map_err(|e| FormatError::at(dir, e))? {
        let f = f.map_err(|e| FormatError::at(dir, e))?;
        let fname = f.file_name();
        let Some(fname) = fname.to_str() else {
            continue;
        };
        let path = f.path();
        let regular = f.file_type().is_ok_and(|t| t.is_file());
        if !regular && !fname.ends_with(".idx") {
            issues.push(stray(
                path,
                rank,
                "not a regular file (a link, FIFO or device); not read",
            ));
            continue;
        }
        if let Some(step) = numbered(fname, "step", ".seg") {
            let bytes = f.metadata().map(|m| m.len()).unwrap_or(0);
            let has_index = std::fs::symlink_metadata(index_path(&path)).is_ok_and(|m| m.is_file());
            segments.push(SegmentInfo {
                rank,
                step,
                path,
                bytes,
                has_index,
            });
        } else if numbered(fname, "step", ".idx").is_some() || fname.ends_with(".idx.tmp") {
            // An index (or one a killed writer left half-written): read with its segment.
        } else {
            issues.push(stray(path, rank, "not a segment or an index; ignored"));
        }
    }
    Ok(())
}

impl Store {
    /// Opens a store: reads the manifest (refusing an unknown major version) and lists the
    /// segments. A missing or unreadable manifest is an [`Issue`], not an error, as long as
    /// segments are there: the records stay readable.
    pub fn open(root: &Path) -> Result<Store, FormatError> {
        let meta = std::fs::metadata(root).map_err(|e| FormatError::at(root, e))?;
        if !meta.is_dir() {
            return Err(FormatError::Invalid(format!(
                "{}: not a ttrace store (not a directory)",
                root.display()
            )));
        }
        let mut issues = Vec::new();
        let manifest = read_manifest(root, &mut issues)?;
        let mut segments = Vec::new();
        let entries = std::fs::read_dir(root).map_err(|e| FormatError::at(root, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| FormatError::at(root, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(rank) = numbered(name, "rank", "") else {
                continue;
            };
            let Ok(rank) = u32::try_from(rank) else {
                continue;
            };
            let dir = entry.path();
            // Not followed: a rank directory that is a symbolic link would lead the reader
            // (and `fsck --repair`) out of the store.
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                if entry.file_type().is_ok_and(|t| t.is_symlink()) {
                    issues.push(stray(
                        dir,
                        rank,
                        "a symbolic link, not a rank directory; not followed",
                    ));
                }
                continue;
            }
            list_rank_dir(&dir, rank, &mut segments, &mut issues)?;
        }
        if manifest.is_none() && segments.is_empty() {
            // A directory of the stores of one job's nodes: read as one store.
            let parts = crate::storeset::members(root);
            if !parts.is_empty() {
                return crate::storeset::open_set(root, &parts);
            }
            return Err(FormatError::Invalid(format!(
                "{}: not a ttrace store (no manifest.json and no rankNNNNN/stepNNNNNN.seg)",
                root.display()
            )));
        }
        segments.sort_by_key(|s| (s.rank, s.step));
        for path in crate::stream::partial_streams(root) {
            let bytes = std::fs::symlink_metadata(&path).map(|m| m.len()).ok();
            issues.push(Issue {
                kind: IssueKind::PartialStream,
                path,
                rank: None,
                step: None,
                seq: None,
                offset: None,
                bytes,
                detail: "a tensor streamed in chunks whose process or collector died before its \
                         last chunk: lost (its record was never stored)"
                    .into(),
            });
        }
        Ok(Store {
            root: root.to_path_buf(),
            manifest,
            segments,
            issues,
            parts: Vec::new(),
            located: Mutex::default(),
        })
    }

    /// A store of a set: `parts` read as one (see [`crate::storeset`]).
    pub(crate) fn from_parts(
        root: PathBuf,
        manifest: Option<Manifest>,
        segments: Vec<SegmentInfo>,
        issues: Vec<Issue>,
        parts: Vec<PathBuf>,
    ) -> Store {
        Store {
            root,
            manifest,
            segments,
            issues,
            parts,
            located: Mutex::default(),
        }
    }

    /// The stores read as one when this is a set of them (empty for a single store): their
    /// segments lie in them, not under [`Store::root`].
    pub fn parts(&self) -> &[PathBuf] {
        &self.parts
    }

    /// The store directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The manifest, when it was readable.
    pub fn manifest(&self) -> Option<&Manifest> {
        self.manifest.as_ref()
    }

    /// Problems found while opening (manifest, stray files).
    pub fn issues(&self) -> &[Issue] {
        &self.issues
    }

    /// Every segment, by rank then step.
    pub fn segments(&self) -> &[SegmentInfo] {
        &self.segments
    }

    /// Ranks that have at least one segment, ascending.
    pub fn ranks(&self) -> Vec<u32> {
        let mut r: Vec<u32> = self.segments.iter().map(|s| s.rank).collect();
        r.dedup();
        r
    }

    /// Steps of `rank`, ascending.
    pub fn steps(&self, rank: u32) -> Vec<u64> {
        self.segments
            .iter()
            .filter(|s| s.rank == rank)
            .map(|s| s.step)
            .collect()
    }

    /// The listed segment of (rank, step).
    pub fn segment_info(&self, rank: u32, step: u64) -> Option<&SegmentInfo> {
        self.segments
            .binary_search_by_key(&(rank, step), |s| (s.rank, s.step))
            .ok()
            .map(|i| &self.segments[i])
    }

    /// Opens the segment of (rank, step). Opened again (a reader that closed it to stay
    /// within its memory budget), it is mapped without locating its frames again: the frames,
    /// issues and index state found the first time are taken as they were, as long as the
    /// segment file and its index have the same lengths and modification times. Locating validates the index against every
    /// frame header, which touches a page per frame: for a reader that opens segments many
    /// times over, most of what opening costs (and, with a cold page cache, a read of the
    /// file).
    pub fn open_segment(&self, rank: u32, step: u64) -> Result<Segment, FormatError> {
        let info = self.segment_info(rank, step).ok_or_else(|| {
            FormatError::Invalid(format!(
                "{}: no segment for rank {rank} step {step}",
                self.root.display()
            ))
        })?;
        let key = (rank, step);
        let known = self.located().get(key);
        let (seg, found) = Segment::open_knowing(&info.path, Some(key), known.as_deref())?;
        if let Some(found) = found {
            self.located().insert(key, Arc::new(found));
        }
        Ok(seg)
    }

    /// Keeps what opening segments found (their frame tables, for opening them again) within
    /// about `bytes`, the least recently opened dropped first; by default all are kept.
    pub fn set_located_budget(&self, bytes: u64) {
        let mut located = self.located();
        located.budget = Some(bytes);
        located.keep_within_budget();
    }

    /// Bytes held by what opening segments found (estimated).
    pub fn located_bytes(&self) -> u64 {
        self.located().bytes
    }

    fn located(&self) -> std::sync::MutexGuard<'_, LocatedCache> {
        self.located.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The bytes of a segment: memory-mapped, or read when mapping is not possible.
enum Bytes {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    /// Drops the whole pages of `range` from the mapping (a file read into memory keeps its
    /// bytes).
    fn release(&self, range: std::ops::Range<usize>) {
        #[cfg(unix)]
        if let Bytes::Map(m) = self {
            let lo = range.start.next_multiple_of(RELEASE_ALIGN);
            let hi = range.end.min(m.len()) / RELEASE_ALIGN * RELEASE_ALIGN;
            if hi > lo {
                // SAFETY: the mapping is read-only, file-backed and never written through: a
                // page dropped here is read from the file again when next touched, with the
                // same bytes (segments are append-only while mapped: the mapping's contract
                // in `Segment::open_knowing`), so whatever refers into it sees no change.
                let _ = unsafe {
                    m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo)
                };
            }
        }
    }

    /// Tells the kernel how the mapping is about to be read (a file read into memory has no
    /// readahead to tune).
    fn advise(&self, reading: u8) {
        #[cfg(unix)]
        if let Bytes::Map(m) = self {
            let _ = m.advise(if reading == READING_METADATA {
                memmap2::Advice::Random
            } else {
                memmap2::Advice::Sequential
            });
        }
    }
}

/// Frame bodies at least this large are dropped from the process's mapping once read
/// ([`RecordView::release`]).
const RELEASE_BYTES: usize = 1 << 20;
/// What is dropped is aligned inward to this (a multiple of the page sizes in use), so that
/// the frames around keep their pages.
const RELEASE_ALIGN: usize = 64 << 10;

/// A segment's mapping as mapped: read ahead, nothing read yet.
const READING_FRESH: u8 = 0;
/// A segment's mapping read for its records' metadata alone (a frame header and the record at
/// the start of each body): no readahead, so that only those pages are read from disk.
const READING_METADATA: u8 = 1;
/// A segment's mapping read for its data: the kernel reads ahead, from then on (a record's
/// metadata read now and then, a reference checked before its target is read, does not turn
/// readahead off again).
const READING_DATA: u8 = 2;

/// Frames at least this large on average make a segment **sparse**: its metadata is read
/// without readahead. With readahead, touching each frame's header and record reads most of
/// the file from disk (a cold `ttrace ls` of a store of 2.6 MB frames read 65 % of its
/// bytes); without it, smaller frames would cost a synchronous read of a page each, slower
/// than reading them all ahead.
const SPARSE_FRAME_BYTES: u64 = 1 << 20;

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// Where one intact-looking frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FrameLoc {
    pub seq: u64,
    /// Offset of the frame header.
    pub offset: u64,
    /// Header plus body.
    pub frame_len: u64,
    /// CRC-32 its body must have.
    pub crc32: u32,
    /// Whether the body was already checked against `crc32` (frames found by scanning).
    pub verified: bool,
}

/// How a segment's frames were located.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexState {
    /// The index matched the segment and was used (bytes it did not cover were scanned).
    Used,
    /// There was no index: the segment was scanned.
    Missing,
    /// The index was unusable: the segment was scanned.
    Damaged,
}

/// What opening a segment found out (its frames, problems and index state), kept by its
/// [`Store`] for opening it again, with what identifies the files it was found in.
#[derive(Debug)]
struct Located {
    files: SegmentFiles,
    /// Shared with every opening (not copied per opening).
    frames: Arc<[FrameLoc]>,
    issues: Vec<Issue>,
    index: IndexState,
    good_end: u64,
    /// Which frames' bodies were checked against their CRC (shared with every opening).
    checked: Arc<[AtomicBool]>,
    sparse: bool,
}

impl Located {
    /// What holding it costs: its frame table and flags, its issues (estimated), the struct.
    fn approx_bytes(&self) -> u64 {
        (self.frames.len() * std::mem::size_of::<FrameLoc>()
            + self.checked.len() * std::mem::size_of::<AtomicBool>()
            + self.issues.len() * 256
            + std::mem::size_of::<Located>()) as u64
    }
}

/// What identifies a segment's files: what was found in them holds while they are the same.
#[derive(Debug, Clone, Copy, PartialEq)]
struct SegmentFiles {
    len: u64,
    modified: Option<std::time::SystemTime>,
    /// The index file's length and modification time (`None`: none, or unreadable).
    index: Option<(u64, std::time::SystemTime)>,
}

/// An opened segment: its frames located, its problems listed.
pub struct Segment {
    path: PathBuf,
    /// From the header.
    pub rank: u32,
    pub step: u64,
    data: Bytes,
    frames: Arc<[FrameLoc]>,
    issues: Vec<Issue>,
    index: IndexState,
    /// End of the last intact frame (where a torn tail starts).
    good_end: u64,
    /// Each frame's record and blobs once its body was checked against its CRC and parsed:
    /// a record is parsed (and its body checksummed) once, however many of its tensors are
    /// read, and references to it resolved.
    parsed: Vec<OnceLock<Parsed>>,
    /// Which frames' bodies were checked against their CRC, by this opening of the file or
    /// an earlier one of the same store ([`Store::open_segment`]): a body is checksummed
    /// once, however often its segment is closed and opened again.
    checked: Arc<[AtomicBool]>,
    /// Frames of [`SPARSE_FRAME_BYTES`] or more on average: reading metadata alone switches
    /// the mapping to no readahead, reading data back to readahead.
    sparse: bool,
    /// How the mapping is being read ([`READING_FRESH`], [`READING_METADATA`],
    /// [`READING_DATA`]).
    reading: AtomicU8,
    /// Whether [`RecordView::release`] drops large frames' pages ([`Segment::set_releasing`]).
    releasing: bool,
}

/// A frame body checked against its CRC and parsed.
struct Parsed {
    record: Record,
    blobs: Vec<BlobRef>,
}

impl fmt::Debug for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Segment")
            .field("path", &self.path)
            .field("rank", &self.rank)
            .field("step", &self.step)
            .field("frames", &self.frames.len())
            .field("issues", &self.issues)
            .field("index", &self.index)
            .finish()
    }
}

/// Why bytes at an offset are not an intact frame.
#[derive(Debug)]
enum Bad {
    /// The file ends inside the frame.
    Truncated,
    Magic,
    Crc,
    Parse(String),
}

impl fmt::Display for Bad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bad::Truncated => f.write_str("cut short by the end of the file"),
            Bad::Magic => f.write_str("no frame magic"),
            Bad::Crc => f.write_str("checksum mismatch"),
            Bad::Parse(w) => write!(f, "undecodable: {w}"),
        }
    }
}

/// Checks the frame at `pos` completely (header, CRC, record) and returns where it is.
fn check_frame(data: &[u8], pos: usize) -> Result<FrameLoc, Bad> {
    let hdr = FRAME_HEADER_BYTES as usize;
    let rest = data.len().saturating_sub(pos);
    if rest < hdr {
        // A header cut short still starts with (a prefix of) the magic.
        let n = rest.min(4);
        return Err(if data[pos..pos + n] == FRAME_MAGIC[..n] {
            Bad::Truncated
        } else {
            Bad::Magic
        });
    }
    let FrameHeader {
        body_len,
        crc32: crc,
    } = FrameHeader::parse(&data[pos..]).ok_or(Bad::Magic)?;
    if body_len > (rest - hdr) as u64 {
        return Err(Bad::Truncated);
    }
    let body = &data[pos + hdr..pos + hdr + body_len as usize];
    if crc32fast::hash(body) != crc {
        return Err(Bad::Crc);
    }
    let (record, _) = parse_body(pos as u64, body).map_err(|e| Bad::Parse(e.to_string()))?;
    Ok(FrameLoc {
        seq: record.seq,
        offset: pos as u64,
        frame_len: FRAME_HEADER_BYTES + body_len,
        crc32: crc,
        verified: true,
    })
}

/// Whether an index entry locates an intact body even though the frame header may be damaged.
fn check_by_index(data: &[u8], e: &IndexEntry) -> Option<FrameLoc> {
    let start = e.offset.checked_add(FRAME_HEADER_BYTES)?;
    let end = e.offset.checked_add(e.frame_len)?;
    if start > end || end > data.len() as u64 {
        return None;
    }
    let body = &data[start as usize..end as usize];
    if crc32fast::hash(body) != e.crc32 {
        return None;
    }
    let (record, _) = parse_body(e.offset, body).ok()?;
    (record.seq == e.seq).then_some(FrameLoc {
        seq: e.seq,
        offset: e.offset,
        frame_len: e.frame_len,
        crc32: e.crc32,
        verified: true,
    })
}

/// The next offset at or after `from` (and before `end`) where an intact frame starts.
fn find_next_frame(data: &[u8], from: usize, end: usize) -> Option<FrameLoc> {
    let end = end.min(data.len());
    let mut at = from;
    while at + 4 <= end {
        let rel = data[at..end].windows(4).position(|w| w == FRAME_MAGIC)?;
        let pos = at + rel;
        if let Ok(loc) = check_frame(data, pos) {
            if loc.offset + loc.frame_len <= end as u64 {
                return Some(loc);
            }
        }
        at = pos + 1;
    }
    None
}

impl Segment {
    /// Opens a segment file: checks its header and version, locates its frames through the
    /// index or by scanning (see the module documentation), and lists the problems met.
    pub fn open(path: &Path) -> Result<Segment, FormatError> {
        Segment::open_as(path, None)
    }

    /// [`Segment::open`], checking the header against the (rank, step) its name gives.
    pub fn open_as(path: &Path, named: Option<(u32, u64)>) -> Result<Segment, FormatError> {
        Segment::open_knowing(path, named, None).map(|(seg, _)| seg)
    }

    /// [`Segment::open_as`], taking the frames `known` found when the file was opened before
    /// if its files are still those (same lengths and modification times); otherwise locating them
    /// and returning what was found, for the next opening.
    fn open_knowing(
        path: &Path,
        named: Option<(u32, u64)>,
        known: Option<&Located>,
    ) -> Result<(Segment, Option<Located>), FormatError> {
        // The shared header and version check of every reader.
        let SegmentHeader { rank, step, .. } = SegmentHeader::read(path)?;
        let file = crate::store::open_regular(path)?;
        let modified = file.metadata().and_then(|m| m.modified()).ok();
        // The index too: one written since (a collector closing the segment) is read.
        let index_file = std::fs::metadata(index_path(path))
            .and_then(|m| Ok((m.len(), m.modified()?)))
            .ok();
        // SAFETY: the mapping is read-only and lives as long as this Segment. Segments are
        // append-only while a collector writes them (bytes past the length mapped here are not
        // seen); only `ttrace fsck --repair` shrinks one, and it drops its own mappings first
        // and refuses a store that is still being written. A file truncated under the mapping
        // by another program would fault on access — the documented hazard of reading files
        // that something else is cutting.
        let data = match unsafe { memmap2::Mmap::map(&file) } {
            Ok(m) => {
                #[cfg(unix)]
                let _ = m.advise(memmap2::Advice::Sequential);
                Bytes::Map(m)
            }
            Err(_) => Bytes::Owned(std::fs::read(path).map_err(|e| FormatError::at(path, e))?),
        };
        if (data.len() as u64) < SEGMENT_HEADER_BYTES {
            return Err(FormatError::Corrupt(format!(
                "{}: shorter than a segment header",
                path.display()
            )));
        }
        let files = SegmentFiles {
            len: data.len() as u64,
            modified,
            index: index_file,
        };
        let mut seg = Segment {
            path: path.to_path_buf(),
            rank,
            step,
            data,
            frames: Arc::new([]),
            issues: Vec::new(),
            index: IndexState::Used,
            good_end: SEGMENT_HEADER_BYTES,
            parsed: Vec::new(),
            checked: Arc::new([]),
            sparse: false,
            reading: AtomicU8::new(READING_FRESH),
            releasing: false,
        };
        if let Some(k) = known.filter(|k| k.files == files) {
            seg.adopt(k);
            return Ok((seg, None));
        }
        if let Some((r, s)) = named {
            if (r, s) != (rank, step) {
                seg.issue(
                    IssueKind::BadHeader,
                    None,
                    Some(0),
                    None,
                    format!(
                        "the header says rank {rank} step {step} but the file is named for \
                         rank {r} step {s}; the header's numbers are used"
                    ),
                );
            }
        }
        seg.locate();
        seg.check_records_belong();
        let found = Located {
            files,
            frames: Arc::clone(&seg.frames),
            issues: seg.issues.clone(),
            index: seg.index,
            good_end: seg.good_end,
            checked: seg.frames.iter().map(|_| AtomicBool::new(false)).collect(),
            sparse: seg.sparse,
        };
        seg.adopt(&found);
        Ok((seg, Some(found)))
    }

    /// Takes what locating the segment's frames found (now, or when its files were opened
    /// before), with nothing parsed yet by this opening.
    fn adopt(&mut self, k: &Located) {
        self.frames = Arc::clone(&k.frames);
        self.issues = k.issues.clone();
        self.index = k.index;
        self.good_end = k.good_end;
        self.parsed = k.frames.iter().map(|_| OnceLock::new()).collect();
        self.checked = Arc::clone(&k.checked);
        self.sparse = k.sparse;
    }

    fn issue(
        &mut self,
        kind: IssueKind,
        seq: Option<SeqHint>,
        offset: Option<u64>,
        bytes: Option<u64>,
        detail: String,
    ) {
        self.issues.push(Issue {
            kind,
            path: self.path.clone(),
            rank: Some(self.rank),
            step: Some(self.step),
            seq,
            offset,
            bytes,
            detail,
        });
    }

    /// Notes that the index cannot be trusted (`why`): the records are located by scanning.
    fn index_damaged(&mut self, why: impl std::fmt::Display) {
        self.index = IndexState::Damaged;
        self.issue(
            IssueKind::DamagedIndex,
            None,
            None,
            None,
            format!("{why}; located the records by scanning"),
        );
    }

    /// Fills `frames` from the index when it is usable, else by scanning.
    fn locate(&mut self) {
        let ipath = index_path(&self.path);
        let entries = match read_index(&ipath) {
            Ok(e) => Some(e),
            Err(FormatError::File { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                self.index = IndexState::Missing;
                self.issue(
                    IssueKind::MissingIndex,
                    None,
                    None,
                    None,
                    "no index (the segment was not closed: its collector stopped early); \
                     located the records by scanning"
                        .into(),
                );
                None
            }
            Err(e) => {
                self.index_damaged(e);
                None
            }
        };
        let len = self.data.len() as u64;
        if let Some(entries) = entries {
            // Validating the index touches every frame header: metadata reading.
            self.sparse = !entries.is_empty() && len / entries.len() as u64 >= SPARSE_FRAME_BYTES;
            self.set_reading(READING_METADATA);
            match self.validate_index(&entries) {
                Ok(valid) => {
                    // Entries past the end of the file: the segment lost its tail.
                    let lost = &entries[valid..];
                    let mut pos = SEGMENT_HEADER_BYTES;
                    let mut frames = Vec::with_capacity(valid);
                    for e in &entries[..valid] {
                        if e.offset > pos {
                            self.scan(pos, e.offset, &entries, &mut frames, Some(e.seq));
                        }
                        frames.push(FrameLoc {
                            seq: e.seq,
                            offset: e.offset,
                            frame_len: e.frame_len,
                            crc32: e.crc32,
                            verified: false,
                        });
                        pos = e.offset + e.frame_len;
                    }
                    self.good_end = pos;
                    if pos < len {
                        self.scan(pos, len, &entries, &mut frames, None);
                    }
                    if let Some(first) = lost.first() {
                        let seqs = match lost.last() {
                            Some(l) if l.seq != first.seq => SeqHint::Between(first.seq, l.seq),
                            _ => SeqHint::Exact(first.seq),
                        };
                        // The scan already reported a torn frame where the first lost one
                        // began: give it the seq the index knows instead of a second issue.
                        let torn = self.issues.iter_mut().find(|i| {
                            i.kind == IssueKind::TornTail && i.offset == Some(first.offset)
                        });
                        let detail = format!(
                            "the index lists {} record(s) that the file no longer holds \
                             (it was cut at byte {len})",
                            lost.len()
                        );
                        match torn {
                            Some(i) => {
                                i.seq = Some(seqs);
                                i.detail = format!("{}; {detail}", i.detail);
                            }
                            None => self.issue(
                                IssueKind::TornTail,
                                Some(seqs),
                                Some(first.offset),
                                Some(0),
                                detail,
                            ),
                        }
                    }
                    self.frames = frames.into();
                    return;
                }
                Err(why) => {
                    self.index_damaged(why);
                    let mut frames = Vec::new();
                    self.scan(SEGMENT_HEADER_BYTES, len, &entries, &mut frames, None);
                    self.frames = frames.into();
                    return;
                }
            }
        }
        let mut frames = Vec::new();
        self.scan(SEGMENT_HEADER_BYTES, len, &[], &mut frames, None);
        self.frames = frames.into();
    }

    /// Checks index entries against the segment. Returns how many leading entries are usable
    /// (the rest lie past the end of the file), or why the index cannot be trusted.
    fn validate_index(&self, entries: &[IndexEntry]) -> Result<usize, String> {
        let data = &self.data[..];
        let len = data.len() as u64;
        let mut prev_end = SEGMENT_HEADER_BYTES;
        let mut valid = entries.len();
        for (i, e) in entries.iter().enumerate() {
            let end = e
                .offset
                .checked_add(e.frame_len)
                .ok_or_else(|| format!("entry {i} overflows"))?;
            if e.offset < prev_end || e.frame_len < FRAME_HEADER_BYTES {
                return Err(format!(
                    "entry {i} (seq {}) overlaps its predecessor or is too short",
                    e.seq
                ));
            }
            if end > len {
                // Every later entry must be past the end too (a cut file), else the index is
                // simply wrong.
                if entries[i..]
                    .iter()
                    .all(|l| l.offset.saturating_add(l.frame_len) > len)
                {
                    valid = i;
                    break;
                }
                return Err(format!("entry {i} (seq {}) lies past the end", e.seq));
            }
            let o = e.offset as usize;
            if !e.matches(&data[o..o + FRAME_HEADER_BYTES as usize]) {
                return Err(format!(
                    "entry {i} (seq {}) does not match the frame header at byte {}",
                    e.seq, e.offset
                ));
            }
            prev_end = end;
        }
        Ok(valid)
    }

    /// Scans `[from, to)` for frames, appending intact ones to `frames` and reporting the
    /// rest. `hints` (a possibly damaged index) gives seqs of frames that cannot be read.
    ///
    /// `next_seq` is the seq of the (indexed) record at `to`, when the scan fills a gap.
    fn scan(
        &mut self,
        from: u64,
        to: u64,
        hints: &[IndexEntry],
        frames: &mut Vec<FrameLoc>,
        next_seq: Option<u64>,
    ) {
        let hint_at: HashMap<u64, &IndexEntry> = hints.iter().map(|e| (e.offset, e)).collect();
        let len = self.data.len() as u64;
        let mut pos = from;
        while pos < to {
            let checked = check_frame(&self.data, pos as usize);
            let bad = match checked {
                Ok(loc) if loc.offset + loc.frame_len <= to => {
                    frames.push(loc);
                    pos += loc.frame_len;
                    self.good_end = self.good_end.max(pos);
                    continue;
                }
                Ok(_) => Bad::Parse("overlaps an indexed record".into()),
                Err(b) => b,
            };
            // Damaged header, intact body: the index still knows where it ends.
            if let Some(loc) = hint_at
                .get(&pos)
                .and_then(|e| check_by_index(&self.data, e))
            {
                if loc.offset + loc.frame_len <= to {
                    self.issue(
                        IssueKind::RecoveredByIndex,
                        Some(SeqHint::Exact(loc.seq)),
                        Some(pos),
                        None,
                        format!("frame header {bad}; the record's body is intact and was read through the index"),
                    );
                    frames.push(loc);
                    pos += loc.frame_len;
                    self.good_end = self.good_end.max(pos);
                    continue;
                }
            }
            let next = find_next_frame(&self.data, pos as usize + 1, to as usize);
            // An indexed frame before the next intact header may have a damaged header and an
            // intact body: stop there, so the next pass recovers it through the index instead
            // of skipping (and misreporting) it.
            let next_indexed = hints
                .iter()
                .filter(|e| e.offset > pos && e.offset < next.map_or(to, |n| n.offset))
                .min_by_key(|e| e.offset);
            let skip_to = next_indexed.map_or(next.map_or(to, |n| n.offset), |e| e.offset);
            let prev_seq = frames.last().map(|f| f.seq);
            let resumes = next.is_some() || next_indexed.is_some() || next_seq.is_some();
            let following_seq = next_indexed
                .map(|e| e.seq)
                .or(next.map(|n| n.seq))
                .or(next_seq);
            let seq = match (hint_at.get(&pos), prev_seq, following_seq) {
                (Some(e), _, _) => SeqHint::Exact(e.seq),
                (None, Some(p), Some(n)) if n > p + 1 => SeqHint::Between(p + 1, n - 1),
                (None, None, Some(n)) if n > 0 => SeqHint::Between(0, n - 1),
                (None, Some(p), None) => SeqHint::AtLeast(p + 1),
                (None, None, None) => SeqHint::AtLeast(0),
                _ => SeqHint::Unknown,
            };
            let skipped = skip_to - pos;
            if next.is_none()
                && next_indexed.is_none()
                && to == len
                && matches!(bad, Bad::Truncated | Bad::Magic)
            {
                self.issue(
                    IssueKind::TornTail,
                    Some(seq),
                    Some(pos),
                    Some(skipped),
                    format!(
                        "the segment ends inside a record ({bad}; its writer was killed \
                         mid-record): {skipped} bytes dropped, every earlier record is intact"
                    ),
                );
            } else {
                self.issue(
                    IssueKind::CorruptRecord,
                    Some(seq),
                    Some(pos),
                    Some(skipped),
                    format!(
                        "{bad}; skipped {skipped} bytes, {}",
                        if resumes {
                            "reading resumed at the next intact record"
                        } else {
                            "no intact record follows"
                        }
                    ),
                );
            }
            pos = skip_to;
        }
    }

    /// Reports seqs that repeat within the segment.
    fn check_records_belong(&mut self) {
        let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
        for f in self.frames.iter() {
            *seen.entry(f.seq).or_default() += 1;
        }
        let dups: Vec<u64> = seen
            .iter()
            .filter(|(_, &n)| n > 1)
            .map(|(&s, _)| s)
            .collect();
        for s in dups {
            self.issue(
                IssueKind::Inconsistent,
                Some(SeqHint::Exact(s)),
                None,
                None,
                "several records carry this seq".into(),
            );
        }
    }

    /// The segment file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the segment file.
    pub fn file_len(&self) -> u64 {
        self.data.len() as u64
    }

    /// Where the intact frames end (a torn tail begins there).
    pub fn good_end(&self) -> u64 {
        self.good_end
    }

    /// How the frames were located.
    pub fn index_state(&self) -> IndexState {
        self.index
    }

    /// Problems met while opening (reads of single records can report more).
    pub fn issues(&self) -> &[Issue] {
        &self.issues
    }

    /// The located frames, in file order.
    pub fn frames(&self) -> &[FrameLoc] {
        &self.frames
    }

    /// Number of located frames.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether the segment holds no frame.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// The frame index of the record with `seq`.
    pub fn find_seq(&self, seq: u64) -> Option<usize> {
        // Frames are in seq order unless a segment was rewritten oddly; fall back to a scan.
        match self.frames.binary_search_by_key(&seq, |f| f.seq) {
            Ok(i) => Some(i),
            Err(_) => self.frames.iter().position(|f| f.seq == seq),
        }
    }

    /// Reads the record with `seq` (checking its CRC), `None` when no frame has it. Seqs
    /// come from the index when there is one; a record whose own seq disagrees is still found.
    pub fn read_seq(&self, seq: u64) -> Option<Result<RecordView<'_>, Box<Issue>>> {
        if let Some(i) = self.find_seq(seq) {
            match self.read(i) {
                Ok(v) if v.record.seq == seq => return Some(Ok(v)),
                Ok(_) => {}
                Err(e) => return Some(Err(e)),
            }
        }
        (0..self.frames.len()).find_map(|i| match self.read_meta(i) {
            Ok(v) if v.record.seq == seq => Some(self.read(i)),
            _ => None,
        })
    }

    /// [`Segment::read`] of the frame at `offset` whose record the caller already decoded
    /// (`known`, the [`RecordView::record`] of a [`Segment::read_meta`] of that frame, from the
    /// same file: frames never change once written): the frame is checked against its CRC as
    /// `read` checks it, and only its blob headers are decoded, not the record's metadata a
    /// second time (compare reads every record's metadata first, then the data of most: the
    /// second decoding was a twentieth of its time on small tensors). `None` when no frame
    /// starts at `offset` (the caller looks the record up by its seq then); [`Segment::read`]
    /// when the blobs do not fit `known`.
    pub fn read_at(
        &self,
        offset: u64,
        known: &Record,
    ) -> Option<Result<RecordView<'_>, Box<Issue>>> {
        // Frames are in file order unless a segment was rewritten oddly: fall back to a scan.
        let i = match self.frames.binary_search_by_key(&offset, |f| f.offset) {
            Ok(i) => i,
            Err(_) => self.frames.iter().position(|f| f.offset == offset)?,
        };
        self.set_reading(READING_DATA);
        let loc = self.frames[i];
        let body = self.body(&loc);
        if let Some(p) = self.parsed.get(i).and_then(OnceLock::get) {
            let (record, blobs) = (p.record.clone(), p.blobs.clone());
            return Some(Ok(self.view(
                loc.offset,
                loc.frame_len,
                record,
                body,
                blobs,
            )));
        }
        if !self.body_intact(i, &loc, body) {
            return Some(Err(self.corrupt_frame(&loc)));
        }
        let sizes_fit = |blobs: &[BlobRef]| {
            let captured = known.tensors.iter().filter(|t| t.captured);
            captured.zip(blobs).all(|(t, b)| t.nbytes == b.raw_len)
        };
        match crate::store::parse_blobs_of(loc.offset, body, known) {
            Ok(blobs) if sizes_fit(&blobs) => {
                if let Some(slot) = self.parsed.get(i) {
                    // Another thread may have parsed it meanwhile: the same bytes, the same
                    // result.
                    let _ = slot.set(Parsed {
                        record: known.clone(),
                        blobs: blobs.clone(),
                    });
                }
                Some(Ok(self.view(
                    loc.offset,
                    loc.frame_len,
                    known.clone(),
                    body,
                    blobs,
                )))
            }
            _ => Some(self.read(i)),
        }
    }

    /// An issue about frame `loc`.
    fn frame_issue(&self, kind: IssueKind, loc: &FrameLoc, detail: String) -> Box<Issue> {
        Box::new(Issue {
            kind,
            path: self.path.clone(),
            rank: Some(self.rank),
            step: Some(self.step),
            seq: Some(SeqHint::Exact(loc.seq)),
            offset: Some(loc.offset),
            bytes: Some(loc.frame_len),
            detail,
        })
    }

    /// Whether frame `i`'s `body` has its CRC: checked once (frames found by scanning were
    /// checked then), remembered for every opening of the file by the same store.
    fn body_intact(&self, i: usize, loc: &FrameLoc, body: &[u8]) -> bool {
        let checked = self.checked.get(i);
        if loc.verified || checked.is_some_and(|c| c.load(Ordering::Acquire)) {
            return true;
        }
        let intact = crc32fast::hash(body) == loc.crc32;
        if let (true, Some(c)) = (intact, checked) {
            c.store(true, Ordering::Release);
        }
        intact
    }

    /// The issue of a frame whose body does not have its CRC.
    fn corrupt_frame(&self, loc: &FrameLoc) -> Box<Issue> {
        self.frame_issue(
            IssueKind::CorruptRecord,
            loc,
            "checksum mismatch: the record's bytes were damaged on disk; it is skipped, the \
             other records are intact"
                .into(),
        )
    }

    /// Makes [`RecordView::release`] drop the pages of this segment's frames of 1 MiB or more
    /// from its mapping, for a reader that maps a segment larger than its memory budget: read
    /// through, the segment would otherwise stay mapped whole (resident, as the kernel counts a
    /// process's memory). Off by default: dropping pages costs the process's other threads a
    /// TLB flush, and pages read again a minor fault each.
    pub fn set_releasing(&mut self, on: bool) {
        self.releasing = on;
    }

    /// Drops the pages of `body` (a frame body of this segment's mapping) from the mapping.
    fn release_body(&self, body: &[u8]) {
        let base = self.data.as_ptr() as usize;
        let at = (body.as_ptr() as usize).wrapping_sub(base);
        if at < self.data.len() {
            self.data.release(at..at + body.len());
        }
    }

    /// Whether the segment's frames are large enough ([`SPARSE_FRAME_BYTES`] on average, by its
    /// index) that reading their metadata alone turns the kernel's readahead off, so that a
    /// listing (or compare's first pass over the records) reads a page or two of each frame
    /// from disk instead of the whole file; reading data turns it back on.
    pub fn sparse(&self) -> bool {
        self.sparse
    }

    /// Reads the mapping as `reading` says from now on, if the segment is sparse (others are
    /// always read ahead) and no data was read from it yet (data read once, it stays read
    /// ahead).
    fn set_reading(&self, reading: u8) {
        if !self.sparse {
            return;
        }
        let was = self.reading.load(Ordering::Acquire);
        if was == reading || was == READING_DATA {
            return;
        }
        if self.reading.swap(reading, Ordering::AcqRel) != reading {
            self.data.advise(reading);
        }
    }

    fn body(&self, loc: &FrameLoc) -> &[u8] {
        let s = (loc.offset + FRAME_HEADER_BYTES) as usize;
        &self.data[s..(loc.offset + loc.frame_len) as usize]
    }

    /// Reads frame `i`, checking its body against its CRC: a mismatch is a
    /// [`IssueKind::CorruptRecord`] naming rank, step and seq; every other frame stays
    /// readable.
    pub fn read(&self, i: usize) -> Result<RecordView<'_>, Box<Issue>> {
        self.read_inner(i, true)
    }

    /// Reads frame `i`'s record without checking the body's CRC (its metadata is still
    /// decoded and bounds-checked). For listing; use [`Segment::read`] for data.
    pub fn read_meta(&self, i: usize) -> Result<RecordView<'_>, Box<Issue>> {
        self.read_inner(i, false)
    }

    fn read_inner(&self, i: usize, verify: bool) -> Result<RecordView<'_>, Box<Issue>> {
        self.set_reading(if verify {
            READING_DATA
        } else {
            READING_METADATA
        });
        let loc = *self.frames.get(i).ok_or_else(|| {
            Box::new(Issue {
                kind: IssueKind::Inconsistent,
                path: self.path.clone(),
                rank: Some(self.rank),
                step: Some(self.step),
                seq: None,
                offset: None,
                bytes: None,
                detail: format!("no frame {i}: the segment holds {}", self.frames.len()),
            })
        })?;
        let body = self.body(&loc);
        if let Some(p) = self.parsed.get(i).and_then(OnceLock::get) {
            let (record, blobs) = (p.record.clone(), p.blobs.clone());
            return Ok(self.view(loc.offset, loc.frame_len, record, body, blobs));
        }
        if !verify && !loc.verified {
            // A metadata-only read still checks the body when its blob headers disagree with
            // the record (a damaged length would otherwise be reported as data).
            if let Ok((record, blobs)) = parse_body(loc.offset, body) {
                let captured = record.tensors.iter().filter(|t| t.captured);
                if captured.zip(&blobs).any(|(t, b)| t.nbytes != b.raw_len) {
                    return self.read_inner(i, true);
                }
                // Parsed once: what follows would parse the same bytes again (and keeps
                // nothing of an unchecked body).
                return Ok(self.view(loc.offset, loc.frame_len, record, body, blobs));
            }
        }
        if verify && !self.body_intact(i, &loc, body) {
            return Err(self.corrupt_frame(&loc));
        }
        let (record, blobs) = parse_body(loc.offset, body).map_err(|e| {
            self.frame_issue(IssueKind::CorruptRecord, &loc, format!("undecodable: {e}"))
        })?;
        if verify || loc.verified {
            if let Some(slot) = self.parsed.get(i) {
                // Another thread may have parsed it meanwhile: the same bytes, the same result.
                let _ = slot.set(Parsed {
                    record: record.clone(),
                    blobs: blobs.clone(),
                });
            }
        }
        // The record's own seq (under its CRC) wins over the index's (which no CRC covers):
        // `ttrace fsck` reports and rewrites such an index.
        Ok(self.view(loc.offset, loc.frame_len, record, body, blobs))
    }

    fn view<'a>(
        &'a self,
        offset: u64,
        frame_len: u64,
        record: Record,
        body: &'a [u8],
        blobs: Vec<BlobRef>,
    ) -> RecordView<'a> {
        let mut blob_of = Vec::with_capacity(record.tensors.len());
        let mut b = 0;
        for t in &record.tensors {
            if t.captured {
                blob_of.push(Some(b));
                b += 1;
            } else {
                blob_of.push(None);
            }
        }
        RecordView {
            offset,
            frame_len,
            segment: self,
            path: &self.path,
            record,
            body,
            blobs,
            blob_of,
        }
    }

    /// A frame of this segment's file ([`Segment::into_frames`]), as a view whose tensors
    /// resolve here (streamed tensors, references): the one resolving path of every reader.
    pub fn view_of<'a>(&'a self, frame: &'a Frame) -> RecordView<'a> {
        self.view(
            frame.offset,
            FRAME_HEADER_BYTES + frame.body.len() as u64,
            frame.record.clone(),
            &frame.body,
            frame.blobs.clone(),
        )
    }

    /// Decodes the blob a reference blob's `stored` bytes name into `out`: the referenced record is read (its CRC
    /// checked) and its tensor decoded (checked against its own record's CRC-32). A
    /// reference to a reference is refused (the collector never writes one), so resolution
    /// cannot loop.
    pub fn resolve_reference(
        &self,
        stored: &[u8],
        raw_len: u64,
        scratch: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<(), FormatError> {
        let r = crate::dedup::BlobReference::parse(stored)?;
        let seg = self;
        let by_offset = seg
            .frames
            .binary_search_by_key(&r.offset, |f| f.offset)
            .ok()
            .filter(|&i| seg.read_meta(i).is_ok_and(|v| v.record.seq == r.seq));
        let i = by_offset.or_else(|| seg.find_seq(r.seq)).ok_or_else(|| {
            FormatError::Corrupt(format!(
                "its bytes are those of tensor {} of seq {}, which is not in the segment \
                 (lost or damaged)",
                r.tensor, r.seq
            ))
        })?;
        let target = seg.read(i).map_err(|issue| {
            FormatError::Corrupt(format!(
                "its bytes are those of tensor {} of seq {}, which is damaged: {}",
                r.tensor, r.seq, issue.detail
            ))
        })?;
        let t = r.tensor as usize;
        if target.record.seq != r.seq || target.is_reference(t) {
            return Err(FormatError::Corrupt(format!(
                "its reference (seq {} tensor {}) does not name a stored blob",
                r.seq, r.tensor
            )));
        }
        target
            .tensor_bytes_into(t, scratch, out)
            .map_err(|e| FormatError::Corrupt(format!("the blob it references is bad: {e}")))?;
        // Read for the reference alone: a large target's pages leave the mapping.
        target.release();
        if out.len() as u64 != raw_len {
            return Err(FormatError::Corrupt(format!(
                "the blob it references has {} bytes, not {raw_len}",
                out.len()
            )));
        }
        Ok(())
    }

    /// Every located record in file order, each checked against its CRC.
    pub fn records(&self) -> impl Iterator<Item = Result<RecordView<'_>, Box<Issue>>> + '_ {
        (0..self.frames.len()).map(move |i| self.read(i))
    }

    /// [`Segment::records`] as owned frames that share this segment (their streamed tensors
    /// and references resolve through it): for callers that keep records past the loop.
    pub fn into_frames(self) -> impl Iterator<Item = Result<Frame, Box<Issue>>> {
        let seg = std::sync::Arc::new(self);
        (0..seg.frames.len()).map(move |i| {
            let v = seg.read(i)?;
            Ok(Frame {
                offset: v.offset,
                body: v.body.to_vec(),
                record: v.record,
                blobs: v.blobs,
                segment: Some(seg.clone()),
            })
        })
    }
}

/// A record read from a segment, with access to its tensors' bytes (decoded on demand).
pub struct RecordView<'a> {
    /// Offset of the frame in its segment.
    pub offset: u64,
    /// Header plus body.
    pub frame_len: u64,
    /// The segment it was read from (references to other blobs resolve in it).
    segment: &'a Segment,
    path: &'a Path,
    pub record: Record,
    body: &'a [u8],
    blobs: Vec<BlobRef>,
    /// The blob of each tensor (`None`: not captured).
    blob_of: Vec<Option<usize>>,
}

impl RecordView<'_> {
    /// Drops the pages of this record's frame from the process's mapping of its segment when
    /// the segment releases ([`Segment::set_releasing`]) and the body is 1 MiB or more: the
    /// page cache keeps them (reading them again costs minor page faults), but they stop
    /// counting in the process's resident memory. For readers that bound their memory
    /// (compare), once they have read what they wanted of the record.
    pub fn release(&self) {
        if self.segment.releasing && self.body.len() >= RELEASE_BYTES {
            self.segment.release_body(self.body);
        }
    }

    fn blob(&self, tensor: usize) -> Result<&BlobRef, FormatError> {
        let t = self.record.tensors.get(tensor).ok_or_else(|| {
            FormatError::Invalid(format!(
                "{}: the record has {} tensors, asked for {tensor}",
                self.name(),
                self.record.tensors.len()
            ))
        })?;
        self.blob_of[tensor]
            .and_then(|b| self.blobs.get(b))
            .ok_or_else(|| {
                FormatError::Invalid(format!(
                    "{}: tensor {tensor} ({:?}) was not captured (metadata only)",
                    self.name(),
                    t.role
                ))
            })
    }

    /// `rank R step S seq Q API` for messages.
    pub fn name(&self) -> String {
        let r = &self.record;
        format!("rank {} step {} seq {} {}", r.rank, r.step, r.seq, r.api)
    }

    /// Whether tensor `i` has stored bytes.
    pub fn is_captured(&self, tensor: usize) -> bool {
        self.blob_of.get(tensor).copied().flatten().is_some()
    }

    /// Bytes stored on disk for tensor `i` (compressed), if captured.
    pub fn stored_len(&self, tensor: usize) -> Option<u64> {
        let b = self.blob_of.get(tensor).copied().flatten()?;
        self.blobs.get(b).map(|b| self.blob_stored(b))
    }

    /// Stored bytes of a blob: a streamed tensor's are those of its stream file.
    fn blob_stored(&self, b: &BlobRef) -> u64 {
        if b.codec != codec::Codec::Streamed {
            return (b.end - b.start) as u64;
        }
        self.path.parent().and_then(Path::parent).map_or(0, |run| {
            crate::stream::stored_len(run, &self.body[b.start..b.end])
        })
    }

    /// Raw bytes of all captured tensors (as the daemon counts `bytes_raw`).
    pub fn raw_bytes(&self) -> u64 {
        self.blobs.iter().map(|b| b.raw_len).sum()
    }

    /// Stored bytes of all captured tensors (as the daemon counts `bytes_stored`).
    pub fn stored_bytes(&self) -> u64 {
        self.blobs.iter().map(|b| self.blob_stored(b)).sum()
    }

    /// Raw bytes of the captured tensors stored as references to an earlier blob of the
    /// segment (dedup, format 1.3; as the daemon counts `bytes_deduped`).
    pub fn deduped_bytes(&self) -> u64 {
        self.blobs
            .iter()
            .filter(|b| b.codec == codec::Codec::Reference)
            .map(|b| b.raw_len)
            .sum()
    }

    /// Whether tensor `i` is stored as a reference to an earlier blob of its segment.
    pub fn is_reference(&self, tensor: usize) -> bool {
        self.blob(tensor)
            .is_ok_and(|b| b.codec == codec::Codec::Reference)
    }

    /// Decodes tensor `i`'s bytes into `out` (reusing its capacity and `scratch`), checking
    /// the length against the record and the bytes against the record's CRC-32.
    pub fn tensor_bytes_into(
        &self,
        tensor: usize,
        scratch: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<(), FormatError> {
        let (b, stored) = self.stored_blob(tensor)?;
        if b.codec == codec::Codec::Streamed {
            // RUN/rankNNNNN/stepNNNNNN.seg: the run is two levels up.
            let run =
                self.path.parent().and_then(Path::parent).ok_or_else(|| {
                    self.corrupt(tensor, "a streamed tensor outside a store".into())
                })?;
            crate::stream::read_stream(run, stored, b.raw_len, scratch, out)
        } else if b.codec == codec::Codec::Reference {
            self.segment
                .resolve_reference(stored, b.raw_len, scratch, out)
        } else {
            codec::decode_into(
                stored,
                b.raw_len,
                b.elem_size as usize,
                b.codec,
                scratch,
                out,
            )
        }
        .map_err(|e| self.corrupt(tensor, e.to_string()))?;
        self.check_crc(tensor, crc32fast::hash(out))
    }

    /// Tensor `i`'s bytes handed to `sink` a block at a time as they are decoded
    /// ([`codec::decode_blocks`]: the whole tensor's bytes are never in one buffer), checked as
    /// [`RecordView::tensor_bytes_into`] checks them. The sink has been handed the bytes (or
    /// some of them) when the CRC-32 or a length turns out wrong: the caller drops what it
    /// made of them on an error. Streamed tensors and references to other blobs are decoded
    /// into `whole` first.
    pub fn tensor_blocks(
        &self,
        tensor: usize,
        scratch: &mut Vec<u8>,
        whole: &mut Vec<u8>,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<(), FormatError> {
        let (b, stored) = self.stored_blob(tensor)?;
        if matches!(b.codec, codec::Codec::Streamed | codec::Codec::Reference) {
            self.tensor_bytes_into(tensor, scratch, whole)?;
            whole.chunks(codec::BLOCK_BYTES).for_each(sink);
            return Ok(());
        }
        let mut crc = crc32fast::Hasher::new();
        codec::decode_blocks(
            stored,
            b.raw_len,
            b.elem_size as usize,
            b.codec,
            scratch,
            &mut |block: &[u8]| {
                crc.update(block);
                sink(block);
            },
        )
        .map_err(|e| self.corrupt(tensor, e.to_string()))?;
        self.check_crc(tensor, crc.finalize())
    }

    /// Tensor `i`'s blob and stored bytes, its length checked against the record's.
    fn stored_blob(&self, tensor: usize) -> Result<(BlobRef, &[u8]), FormatError> {
        let b = *self.blob(tensor)?;
        let t: &Tensor = &self.record.tensors[tensor];
        if b.raw_len != t.nbytes {
            return Err(self.corrupt(
                tensor,
                format!(
                    "stored {} bytes but the record says {}",
                    b.raw_len, t.nbytes
                ),
            ));
        }
        Ok((b, &self.body[b.start..b.end]))
    }

    /// Tensor `i`'s bytes, whose CRC-32 is `crc`, are the record's.
    fn check_crc(&self, tensor: usize, crc: u32) -> Result<(), FormatError> {
        let want = self.record.tensors[tensor].crc32;
        if crc != want {
            return Err(self.corrupt(
                tensor,
                format!("CRC-32 {crc:#010x} of the bytes, the record says {want:#010x}"),
            ));
        }
        Ok(())
    }

    /// Corruption of tensor `i`, named by segment, tensor and role.
    fn corrupt(&self, tensor: usize, why: String) -> FormatError {
        let role = self
            .record
            .tensors
            .get(tensor)
            .map_or_else(|| "?".to_string(), |t| format!("{:?}", t.role));
        FormatError::Corrupt(format!(
            "{}: tensor {tensor} ({role}) in {}: {why}",
            self.name(),
            self.path.display()
        ))
    }

    /// Tensor `i`'s bytes (packed row-major, little-endian, as the record's shape and dtype
    /// say).
    pub fn tensor_bytes(&self, tensor: usize) -> Result<Vec<u8>, FormatError> {
        let (mut scratch, mut out) = (Vec::new(), Vec::new());
        self.tensor_bytes_into(tensor, &mut scratch, &mut out)?;
        Ok(out)
    }

    /// Tensor `i` as typed values.
    pub fn tensor(&self, tensor: usize) -> Result<TensorData, FormatError> {
        let bytes = self.tensor_bytes(tensor)?;
        TensorData::from_le_bytes(self.record.tensors[tensor].dtype, &bytes)
    }

    /// Whether tensor `i` of this record and tensor `j` of `other` decode to the same bytes
    /// and pass the same check, known without decoding either: both stored in their frames
    /// (not streamed, not references) with the same codec, element size and length and
    /// equal stored bytes (decoding is a function of these), their records giving the same
    /// CRC-32, length and element type.
    pub fn same_stored(&self, i: usize, other: &RecordView<'_>, j: usize) -> bool {
        let (Ok(a), Ok(b)) = (self.blob(i), other.blob(j)) else {
            return false;
        };
        let (ta, tb) = (&self.record.tensors[i], &other.record.tensors[j]);
        !matches!(a.codec, codec::Codec::Streamed | codec::Codec::Reference)
            && (a.codec, a.elem_size, a.raw_len) == (b.codec, b.elem_size, b.raw_len)
            && (ta.crc32, ta.nbytes, ta.dtype) == (tb.crc32, tb.nbytes, tb.dtype)
            && self.body[a.start..a.end] == other.body[b.start..b.end]
    }

    /// The stored (compressed) bytes and codec of tensor `i`, as on disk.
    pub fn stored(&self, tensor: usize) -> Result<(codec::Codec, &[u8]), FormatError> {
        let b = self.blob(tensor)?;
        Ok((b.codec, &self.body[b.start..b.end]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What opening a segment of `frames` frames found.
    fn located(frames: u64) -> Arc<Located> {
        let frame = |seq| FrameLoc {
            seq,
            offset: 0,
            frame_len: 0,
            crc32: 0,
            verified: false,
        };
        Arc::new(Located {
            files: SegmentFiles {
                len: 0,
                modified: None,
                index: None,
            },
            frames: (0..frames).map(frame).collect(),
            issues: Vec::new(),
            index: IndexState::Used,
            good_end: 0,
            checked: (0..frames).map(|_| AtomicBool::new(false)).collect(),
            sparse: false,
        })
    }

    /// Past its budget the cache drops the least recently opened segments' tables first (an
    /// opening again counts as a use), never the one just kept, and counts what it holds.
    #[test]
    fn frame_tables_past_the_budget_go_least_recently_opened_first() {
        let one = located(100).approx_bytes();
        let mut cache = LocatedCache::default();
        for step in 0..3 {
            cache.insert((0, step), located(100));
        }
        assert_eq!(cache.bytes, 3 * one, "no budget: every table kept");
        assert!(cache.get((0, 0)).is_some()); // step 1 is now the least recently opened
        cache.budget = Some(2 * one);
        cache.keep_within_budget();
        assert!(cache.get((0, 1)).is_none());
        assert!(cache.get((0, 0)).is_some() && cache.get((0, 2)).is_some());
        // Kept again, a table replaces its older one: counted once.
        cache.insert((0, 2), located(100));
        assert_eq!(cache.bytes, 2 * one);
        cache.insert((0, 3), located(100));
        assert!(
            cache.get((0, 0)).is_none(),
            "the least recently opened went"
        );
        assert_eq!(cache.bytes, 2 * one);
        // A table larger than the whole budget is not kept: nothing is held past it.
        cache.insert((0, 4), located(1000));
        assert!(cache.bytes <= 2 * one && cache.get((0, 4)).is_none());
    }
}
