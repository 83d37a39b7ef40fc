//! Checking and repairing a store (`ttrace fsck`): verify every record and tensor, rebuild
//! missing or damaged indexes, cut torn tails, restore a segment header whose magic was
//! damaged, and rewrite a missing or damaged manifest from the segments.
//!
//! Repairs never delete an intact record: bytes cut from a segment (a torn tail, a replaced
//! header) are first saved under `RUN/lost+found/`, and a damaged manifest is kept as
//! `manifest.json.damaged` before it is replaced. Corrupt records in the middle of a segment
//! stay where they are (readers skip and report them); the index written for such a segment
//! lists the intact records only.

use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::CaptureConfig;
use crate::frame::{FrameHeader, SegmentHeader};
use crate::reader::{FrameLoc, Issue, IssueKind, RecordView, Segment, SeqHint, Store};
use crate::record::Op;
use crate::store::{
    index_path, manifest_path, read_index, write_index, CommEntry, IndexEntry, Manifest, RankInfo,
    FORMAT_MAJOR, FORMAT_MINOR, FRAME_HEADER_BYTES, FRAME_MAGIC, SEGMENT_HEADER_BYTES,
};
use crate::FormatError;

/// Where repairs put the bytes they cut.
pub fn lost_found_dir(run: &Path) -> PathBuf {
    run.join("lost+found")
}

/// What checking one segment found.
#[derive(Debug, Clone, Serialize)]
pub struct SegmentCheck {
    pub rank: u32,
    pub step: u64,
    pub path: PathBuf,
    /// Records read intact.
    pub records: u64,
    pub gaps: u64,
    /// Raw and stored bytes of the intact records' tensors.
    pub bytes_raw: u64,
    pub bytes_stored: u64,
    /// Raw bytes stored as references to an earlier blob (dedup).
    pub bytes_deduped: u64,
    /// Every problem, from opening and from reading each record (and, deep, each tensor).
    pub issues: Vec<Issue>,
    /// The index the segment should have (every located frame), when the one on disk differs.
    #[serde(skip)]
    pub index_wanted: Option<Vec<IndexEntry>>,
    /// Where a torn tail starts, when there is one to cut.
    pub torn_at: Option<u64>,
    /// Frames whose damaged header the index recovered: (offset, body length, CRC) to write
    /// back.
    pub headers_wanted: Vec<(u64, u64, u32)>,
    /// Communicator members seen in collective records: key -> (size, comm rank -> rank).
    #[serde(skip)]
    pub comms: HashMap<u64, (u32, BTreeMap<u32, u32>)>,
    /// Earliest call time seen.
    #[serde(skip)]
    pub first_call_ns: Option<u64>,
}

/// Reads every record of `seg` (checking each CRC) and, when `deep`, decodes every captured
/// tensor and checks it against the record's length and CRC-32. `progress` receives the bytes
/// of each frame as it is done.
pub fn check_segment(seg: &Segment, deep: bool, progress: &mut dyn FnMut(u64)) -> SegmentCheck {
    let mut c = SegmentCheck::empty(seg);
    let (mut scratch, mut out) = (Vec::new(), Vec::new());
    // The seq of each frame for the index: the record's own when it reads.
    let mut seqs: Vec<u64> = seg.frames().iter().map(|f| f.seq).collect();
    for (i, loc) in seg.frames().iter().enumerate() {
        progress(loc.frame_len);
        let view = match seg.read(i) {
            Ok(v) => v,
            Err(issue) => {
                c.issues.push(*issue);
                continue;
            }
        };
        seqs[i] = c.check_placement(seg, loc, &view);
        c.count(&view);
        if deep {
            c.check_tensors(seg, &view, &mut scratch, &mut out);
        }
    }
    c.want_index(seg, &seqs);
    c.want_headers(seg);
    c.want_torn_tail_cut(seg);
    c
}

impl SegmentCheck {
    /// A check of `seg` that has read nothing yet: the issues found opening it.
    fn empty(seg: &Segment) -> SegmentCheck {
        SegmentCheck {
            rank: seg.rank,
            step: seg.step,
            path: seg.path().to_path_buf(),
            records: 0,
            gaps: 0,
            bytes_raw: 0,
            bytes_stored: 0,
            bytes_deduped: 0,
            issues: seg.issues().to_vec(),
            index_wanted: None,
            torn_at: None,
            headers_wanted: Vec::new(),
            comms: HashMap::new(),
            first_call_ns: None,
        }
    }

    /// An issue of kind `kind` about the record `view` of `seg`.
    fn record_issue(
        &self,
        seg: &Segment,
        view: &RecordView,
        kind: IssueKind,
        detail: String,
    ) -> Issue {
        Issue {
            kind,
            path: self.path.clone(),
            rank: Some(seg.rank),
            step: Some(seg.step),
            seq: Some(SeqHint::Exact(view.record.seq)),
            offset: Some(view.offset),
            bytes: None,
            detail,
        }
    }

    /// Checks that the record read at `loc` is where the index and the segment's name put it.
    /// Returns the seq the index should give it (the record's own).
    fn check_placement(&mut self, seg: &Segment, loc: &FrameLoc, view: &RecordView) -> u64 {
        let r = &view.record;
        if r.seq != loc.seq {
            let detail = format!("the index says seq {} for this record", loc.seq);
            let issue = self.record_issue(seg, view, IssueKind::DamagedIndex, detail);
            self.issues.push(issue);
        }
        if (r.rank, r.step) != (seg.rank, seg.step) {
            let detail = format!(
                "the record says rank {} step {}, its segment is rank {} step {}",
                r.rank, r.step, seg.rank, seg.step
            );
            let issue = self.record_issue(seg, view, IssueKind::Inconsistent, detail);
            self.issues.push(issue);
        }
        r.seq
    }

    /// Adds an intact record to the counts, the first call time and the communicators seen.
    fn count(&mut self, view: &RecordView) {
        let r = &view.record;
        self.records += 1;
        self.bytes_raw += view.raw_bytes();
        self.bytes_stored += view.stored_bytes();
        self.bytes_deduped += view.deduped_bytes();
        self.first_call_ns = Some(
            self.first_call_ns
                .map_or(r.t_call_ns, |t| t.min(r.t_call_ns)),
        );
        match &r.op {
            Op::Gap(_) => self.gaps += 1,
            Op::Collective(op) => {
                let e = self
                    .comms
                    .entry(op.comm)
                    .or_insert_with(|| (op.comm_size, BTreeMap::new()));
                e.1.insert(op.comm_rank, r.rank);
            }
            _ => {}
        }
    }

    /// Decodes every captured tensor of the record, checking its length and CRC-32.
    fn check_tensors(
        &mut self,
        seg: &Segment,
        view: &RecordView,
        scratch: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) {
        for t in 0..view.record.tensors.len() {
            if !view.is_captured(t) {
                continue;
            }
            if let Err(e) = view.tensor_bytes_into(t, scratch, out) {
                let issue = self.record_issue(seg, view, IssueKind::BadTensor, e.to_string());
                self.issues.push(issue);
            }
        }
    }

    /// Wants the index rewritten when the one on disk is not every located frame with the
    /// seq its record gives (`seqs`).
    fn want_index(&mut self, seg: &Segment, seqs: &[u64]) {
        let wanted: Vec<IndexEntry> = seg
            .frames()
            .iter()
            .zip(seqs)
            .map(|(f, &seq)| IndexEntry {
                seq,
                offset: f.offset,
                frame_len: f.frame_len,
                crc32: f.crc32,
            })
            .collect();
        if read_index(&index_path(seg.path())).ok().as_ref() != Some(&wanted) {
            self.index_wanted = Some(wanted);
        }
    }

    /// Wants written back the frame headers that only the index could locate.
    fn want_headers(&mut self, seg: &Segment) {
        for i in &self.issues {
            if i.kind != IssueKind::RecoveredByIndex {
                continue;
            }
            if let Some(f) = seg.frames().iter().find(|f| Some(f.offset) == i.offset) {
                self.headers_wanted
                    .push((f.offset, f.frame_len - FRAME_HEADER_BYTES, f.crc32));
            }
        }
    }

    /// Wants a torn tail cut where the last intact frame ends.
    fn want_torn_tail_cut(&mut self, seg: &Segment) {
        let torn = self
            .issues
            .iter()
            .any(|i| i.kind == IssueKind::TornTail && i.bytes.is_some_and(|b| b > 0));
        if torn && seg.good_end() < seg.file_len() {
            self.torn_at = Some(seg.good_end());
        }
    }
}

/// Writes the index `check` found wanting. Returns whether it wrote one.
pub fn rebuild_index(check: &SegmentCheck) -> Result<bool, FormatError> {
    match &check.index_wanted {
        Some(entries) => {
            write_index(&index_path(&check.path), entries)?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Writes back the frame headers `check` found damaged (their bodies intact, located by the
/// index), saving the damaged ones under `lost+found/`. Returns how many it wrote.
pub fn repair_frame_headers(run: &Path, check: &SegmentCheck) -> Result<usize, FormatError> {
    if check.headers_wanted.is_empty() {
        return Ok(0);
    }
    let path = &check.path;
    let io = |e| FormatError::at(path, e);
    let mut f = open_segment_rw(path)?;
    for &(offset, body_len, crc) in &check.headers_wanted {
        let mut old = [0u8; FRAME_HEADER_BYTES as usize];
        f.seek(SeekFrom::Start(offset)).map_err(io)?;
        f.read_exact(&mut old).map_err(io)?;
        save_lost(run, &lost_name(run, path, "frame-header", offset), &old)?;
        let h = FrameHeader {
            body_len,
            crc32: crc,
        }
        .encode();
        f.seek(SeekFrom::Start(offset)).map_err(io)?;
        f.write_all(&h).map_err(io)?;
    }
    f.sync_all().map_err(io)?;
    Ok(check.headers_wanted.len())
}

/// Opens a segment for repair: a regular file, never through a symbolic link (a crafted store
/// must not make `fsck --repair` write outside it).
fn open_segment_rw(path: &Path) -> Result<std::fs::File, FormatError> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(crate::store::NOFOLLOW_NONBLOCK)
        .open(path)
        .map_err(|e| FormatError::at(path, e))?;
    if !f
        .metadata()
        .map_err(|e| FormatError::at(path, e))?
        .is_file()
    {
        return Err(FormatError::Corrupt(format!(
            "{}: not a regular file; not repaired",
            path.display()
        )));
    }
    Ok(f)
}

/// A name under `lost+found/` for bytes cut from `path` at `offset`.
fn lost_name(run: &Path, path: &Path, what: &str, offset: u64) -> PathBuf {
    let rel = path.strip_prefix(run).unwrap_or(path);
    let flat: String = rel
        .to_string_lossy()
        .chars()
        .map(|c| if c == '/' { '_' } else { c })
        .collect();
    lost_found_dir(run).join(format!("{flat}.{what}@{offset}"))
}

/// Saves `path`'s bytes from `offset` to the end under `lost+found/`, then truncates the file
/// there and syncs it. The caller must hold no mapping of the file (drop its [`Segment`]).
/// Returns the bytes cut.
pub fn truncate_tail(run: &Path, path: &Path, offset: u64) -> Result<u64, FormatError> {
    let io = |e| FormatError::at(path, e);
    let mut f = open_segment_rw(path)?;
    let len = f.metadata().map_err(io)?.len();
    if offset >= len {
        return Ok(0);
    }
    let mut tail = Vec::new();
    f.seek(SeekFrom::Start(offset)).map_err(io)?;
    f.read_to_end(&mut tail).map_err(io)?;
    save_lost(run, &lost_name(run, path, "tail", offset), &tail)?;
    f.set_len(offset).map_err(io)?;
    f.sync_all().map_err(io)?;
    Ok(len - offset)
}

fn save_lost(run: &Path, to: &Path, bytes: &[u8]) -> Result<(), FormatError> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = lost_found_dir(run);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // Written into only when it is a real directory of the store, not a link out.
            if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
                return Err(FormatError::Corrupt(format!(
                    "{}: not a directory; nothing saved there",
                    dir.display()
                )));
            }
        }
        Err(e) => return Err(FormatError::at(&dir, e)),
    }
    let mut f = crate::store::create_regular(to)?;
    f.write_all(bytes).map_err(|e| FormatError::at(to, e))?;
    f.sync_all().map_err(|e| FormatError::at(to, e))
}

/// Sets aside a segment file too short to hold even its header (a disk that filled as it was
/// created): its bytes, if any, are saved under `lost+found/` and the file is removed, so the
/// store stops reporting a segment none of whose records can exist. Returns whether it did.
pub fn set_aside_headerless(run: &Path, path: &Path) -> Result<bool, FormatError> {
    let mut f = open_segment_rw(path)?;
    let len = f.metadata().map_err(|e| FormatError::at(path, e))?.len();
    if len >= SEGMENT_HEADER_BYTES {
        return Ok(false);
    }
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)
        .map_err(|e| FormatError::at(path, e))?;
    if !bytes.is_empty() {
        save_lost(run, &lost_name(run, path, "headerless", 0), &bytes)?;
    }
    std::fs::remove_file(path).map_err(|e| FormatError::at(path, e))?;
    Ok(true)
}

/// Restores the header of a segment whose magic is damaged, from the rank and step its file
/// name gives, when the bytes after the header still scan as frames. The old header is saved
/// under `lost+found/`. Returns whether it rewrote the header. A header that carries the magic
/// and another major version is never touched (a newer format is not damage).
pub fn repair_header(run: &Path, path: &Path, rank: u32, step: u64) -> Result<bool, FormatError> {
    let io = |e| FormatError::at(path, e);
    let mut f = open_segment_rw(path)?;
    let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
    if f.read_exact(&mut h).is_err() || SegmentHeader::parse(&h).is_some() {
        return Ok(false);
    }
    // Evidence that this is a segment: a frame magic right after the header.
    let mut first = [0u8; 4];
    if f.read_exact(&mut first).is_err() || first != FRAME_MAGIC {
        return Ok(false);
    }
    save_lost(run, &lost_name(run, path, "header", 0), &h)?;
    f.seek(SeekFrom::Start(0)).map_err(io)?;
    f.write_all(&SegmentHeader::current(rank, step).encode())
        .map_err(io)?;
    f.sync_all().map_err(io)?;
    Ok(true)
}

/// Builds a manifest from what the segments hold, keeping whatever a damaged
/// `manifest.json` still says (its fields are salvaged one by one). Unknown details stay empty:
/// `command`, `cwd` and `env` (unless salvaged), `pid` 0, `hostname` empty, `clean_exit` and
/// `finalized` false. The `run_id` starts with `recovered:`.
pub fn rebuild_manifest(store: &Store, checks: &[SegmentCheck]) -> Manifest {
    let old: Option<serde_json::Value> = std::fs::read(manifest_path(store.root()))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    fn field<T: serde::de::DeserializeOwned>(v: &Option<serde_json::Value>, k: &str) -> Option<T> {
        v.as_ref()
            .and_then(|v| v.get(k))
            .and_then(|f| serde_json::from_value(f.clone()).ok())
    }
    let old_ranks: Vec<RankInfo> = field(&old, "ranks").unwrap_or_default();
    let mut ranks: BTreeMap<u32, RankInfo> = BTreeMap::new();
    let mut comms: BTreeMap<u64, (u32, BTreeMap<u32, u32>)> = BTreeMap::new();
    let mut first = None::<u64>;
    for c in checks {
        let r = ranks.entry(c.rank).or_insert_with(|| {
            let known = old_ranks.iter().find(|o| o.rank == c.rank);
            RankInfo {
                rank: c.rank,
                pid: known.map_or(0, |k| k.pid),
                hostname: known.map(|k| k.hostname.clone()).unwrap_or_default(),
                local_rank: known.map_or(0, |k| k.local_rank),
                world_size: known.map_or(0, |k| k.world_size),
                records: 0,
                gaps: 0,
                bytes_raw: 0,
                bytes_stored: 0,
                clean_exit: false,
                taken: known.map_or(0, |k| k.taken),
                unpublished: known.map_or(0, |k| k.unpublished),
                unpublished_after: known.and_then(|k| k.unpublished_after),
                bytes_deduped: 0,
                warnings: known.map(|k| k.warnings.clone()).unwrap_or_default(),
            }
        });
        r.records += c.records;
        r.gaps += c.gaps;
        r.bytes_raw += c.bytes_raw;
        r.bytes_stored += c.bytes_stored;
        r.bytes_deduped += c.bytes_deduped;
        for (key, (size, members)) in &c.comms {
            let e = comms
                .entry(*key)
                .or_insert_with(|| (*size, BTreeMap::new()));
            e.1.extend(members.iter().map(|(a, b)| (*a, *b)));
        }
        if let Some(t) = c.first_call_ns {
            first = Some(first.map_or(t, |f| f.min(t)));
        }
    }
    let old_comms: Vec<CommEntry> = field(&old, "comms").unwrap_or_default();
    let mut comm_list: Vec<CommEntry> = comms
        .into_iter()
        .map(|(key, (size, members))| {
            let known = old_comms.iter().find(|o| o.key == key);
            let mut m: Vec<Option<u32>> = known
                .map(|k| k.members.clone())
                .unwrap_or_else(|| vec![None; size as usize]);
            m.resize(size.max(m.len() as u32) as usize, None);
            for (cr, gr) in members {
                if let Some(slot) = m.get_mut(cr as usize) {
                    *slot = Some(gr);
                }
            }
            CommEntry {
                key,
                size,
                members: m,
                parent: known.and_then(|k| k.parent),
                color: known.and_then(|k| k.color),
                api: known
                    .map(|k| k.api.clone())
                    .unwrap_or_else(|| "unknown (recovered from records)".into()),
            }
        })
        .collect();
    // Communicators the damaged manifest knew that no surviving record used.
    for o in old_comms {
        if !comm_list.iter().any(|c| c.key == o.key) {
            comm_list.push(o);
        }
    }
    let world = comm_list
        .iter()
        .map(|c| c.size)
        .chain(ranks.keys().map(|r| r + 1))
        .max()
        .unwrap_or(0);
    for r in ranks.values_mut() {
        if r.world_size == 0 {
            r.world_size = world;
        }
    }
    let run_id: String = field(&old, "run_id").unwrap_or_else(|| {
        store
            .root()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    Manifest {
        format_major: FORMAT_MAJOR,
        format_minor: FORMAT_MINOR,
        run_id: if run_id.starts_with("recovered:") {
            run_id
        } else {
            format!("recovered:{run_id}")
        },
        created_unix_ns: field(&old, "created_unix_ns").or(first).unwrap_or(0),
        command: field(&old, "command").unwrap_or_default(),
        cwd: field(&old, "cwd").unwrap_or_default(),
        env: field(&old, "env").unwrap_or_default(),
        config: field::<CaptureConfig>(&old, "config").unwrap_or_default(),
        ranks: ranks.into_values().collect(),
        comms: comm_list,
        finalized: false,
        exit_code: field(&old, "exit_code"),
        job: field(&old, "job"),
        lost: field(&old, "lost").unwrap_or_default(),
    }
}

/// Writes `m` as the store's manifest, keeping an existing (damaged) one as
/// `manifest.json.damaged`.
pub fn write_rebuilt_manifest(run: &Path, m: &Manifest) -> Result<(), FormatError> {
    let path = manifest_path(run);
    if path.exists() {
        let keep = run.join("manifest.json.damaged");
        std::fs::rename(&path, &keep).map_err(|e| FormatError::at(&keep, e))?;
    }
    m.write(run)
}

/// Compares the manifest's per-rank record counts with what the segments hold (a finalised
/// manifest counts every record written; fewer intact ones means records were lost, e.g. a
/// segment cut exactly at a record boundary, which the segment alone cannot show).
pub fn check_counts(store: &Store, checks: &[SegmentCheck]) -> Vec<Issue> {
    let Some(m) = store.manifest() else {
        return Vec::new();
    };
    let mut found: BTreeMap<u32, u64> = BTreeMap::new();
    for c in checks {
        *found.entry(c.rank).or_default() += c.records;
    }
    let mut out = Vec::new();
    if !m.finalized {
        return out;
    }
    // Two processes can carry one rank: compare per rank.
    let mut listed: BTreeMap<u32, u64> = BTreeMap::new();
    for r in &m.ranks {
        *listed.entry(r.rank).or_default() += r.records;
    }
    // Losses the collector saw and reported (a full disk, a failed write): the store is
    // incomplete, and the per-rank shortfalls they explain are not reported again.
    let reported = m.lost_records();
    if reported > 0 {
        let causes: Vec<String> = m
            .lost
            .iter()
            .map(|l| format!("{} ({} records)", l.cause, l.records))
            .collect();
        out.push(Issue {
            kind: IssueKind::LostRecords,
            path: manifest_path(store.root()),
            rank: None,
            step: None,
            seq: None,
            offset: None,
            bytes: None,
            detail: format!(
                "incomplete trace: the collector could not store {reported} records: {}",
                causes.join("; ")
            ),
        });
    }
    let shortfall: u64 = listed
        .iter()
        .map(|(rank, &n)| n.saturating_sub(found.get(rank).copied().unwrap_or(0)))
        .sum();
    if shortfall <= reported {
        return out;
    }
    for (&rank, &records) in &listed {
        let have = found.get(&rank).copied().unwrap_or(0);
        if have < records {
            out.push(Issue {
                kind: IssueKind::LostRecords,
                path: manifest_path(store.root()),
                rank: Some(rank),
                step: None,
                seq: None,
                offset: None,
                bytes: None,
                detail: format!(
                    "the manifest counts {} records for this rank, the segments hold {have} \
                     intact ones: {} lost",
                    records,
                    records - have
                ),
            });
        }
    }
    out
}
