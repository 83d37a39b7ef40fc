//! The trace store on disk (docs/format.md is the specification; this module is its code).
//!
//! ```text
//! RUN/manifest.json                 run, command, environment, configuration, ranks, communicators
//! RUN/rank00003/step000002.seg      records of rank 3 at step 2: a header, then frames
//! RUN/rank00003/step000002.idx      seq -> frame offset (rebuilt by scanning when missing)
//! ```
//!
//! A segment is its header, then frames; a frame is its header, then a body:
//! `meta_len u32 | CBOR Record | one blob per captured tensor`; a blob is its header, then its
//! stored bytes (the codecs are in [`crate::codec`]). The headers are [`crate::frame`]'s.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::OFlags;
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::codec::{self, Codec};
use crate::config::CaptureConfig;
use crate::record::Record;
use crate::FormatError;

use crate::frame::{BlobHeader, FrameHeader, IndexHeader, SegmentHeader, INDEX_HEADER_BYTES};
pub use crate::frame::{
    IndexEntry, BLOB_HEADER_BYTES, FORMAT_MAJOR, FORMAT_MINOR, FRAME_HEADER_BYTES, FRAME_MAGIC,
    INDEX_ENTRY_BYTES, INDEX_MAGIC, SEGMENT_HEADER_BYTES, SEGMENT_MAGIC,
};
/// Open flags of a store's files: the last component is never followed, a FIFO never blocks
/// the open, the descriptor is not inherited across exec.
pub(crate) const NOFOLLOW_NONBLOCK: i32 = OFlags::NOFOLLOW
    .union(OFlags::NONBLOCK)
    .union(OFlags::CLOEXEC)
    .bits() as i32;
/// What `open` says for a symbolic link under `O_NOFOLLOW`.
const ELOOP: i32 = Errno::LOOP.raw_os_error();

/// Largest record metadata (CBOR) a frame may carry.
pub const MAX_META_BYTES: usize = 1 << 20;

/// Opens a file of a store for reading, refusing anything but a regular file: a store may come
/// from elsewhere (a received tarball), and a FIFO would hang its reader, a device feed it
/// without end, a symbolic link lead it outside the store. The last component is not
/// followed; the open does not block (a FIFO is seen for what it is before anything waits).
pub fn open_regular(path: &Path) -> Result<File, FormatError> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(NOFOLLOW_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(ELOOP) => FormatError::Corrupt(format!(
                "{}: a symbolic link, not a file of the store; not followed",
                path.display()
            )),
            _ => FormatError::at(path, e),
        })?;
    let m = f.metadata().map_err(|e| FormatError::at(path, e))?;
    if !m.is_file() {
        return Err(FormatError::Corrupt(format!(
            "{}: not a regular file ({:?}); not read",
            path.display(),
            m.file_type()
        )));
    }
    Ok(f)
}

/// Opens (creating or truncating) a file of a store for writing, never through a symbolic
/// link and never anything but a regular file, mode `0600` when created.
pub fn create_regular(path: &Path) -> Result<File, FormatError> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(NOFOLLOW_NONBLOCK)
        .open(path)
        .map_err(|e| FormatError::at(path, e))?;
    let m = f.metadata().map_err(|e| FormatError::at(path, e))?;
    if !m.is_file() {
        return Err(FormatError::Corrupt(format!(
            "{}: not a regular file; not written",
            path.display()
        )));
    }
    Ok(f)
}

/// `RUN/manifest.json`.
pub fn manifest_path(run: &Path) -> PathBuf {
    run.join("manifest.json")
}
/// `RUN/rankNNNNN`.
pub fn rank_dir(run: &Path, rank: u32) -> PathBuf {
    run.join(format!("rank{rank:05}"))
}
/// `RUN/rankNNNNN/stepNNNNNN.seg`.
pub fn segment_path(run: &Path, rank: u32, step: u64) -> PathBuf {
    rank_dir(run, rank).join(format!("step{step:06}.seg"))
}
/// The index next to a segment.
pub fn index_path(segment: &Path) -> PathBuf {
    segment.with_extension("idx")
}

/// One traced process, as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: u32,
    pub pid: u32,
    pub hostname: String,
    pub local_rank: u32,
    pub world_size: u32,
    pub records: u64,
    pub gaps: u64,
    pub bytes_raw: u64,
    pub bytes_stored: u64,
    /// False when the process vanished without saying goodbye (crash, SIGKILL).
    pub clean_exit: bool,
    /// (1.2) Snapshots the process had taken (handed to its tracer) by the time it left, as
    /// its ring header says; 0 in older stores.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub taken: u64,
    /// (1.2) Of those, the ones it had neither published nor chosen to drop when it died: lost
    /// with the process (a crash, SIGKILL, an exit drain that ran out of time). Taken =
    /// published + dropped (outside `--steps`) + unpublished.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unpublished: u64,
    /// (1.2) The (step, seq) of the last record it published: the unpublished ones came after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unpublished_after: Option<(u64, u64)>,
    /// (1.3) Raw bytes of its captured tensors stored as references to identical bytes stored
    /// earlier in the same segment (dedup); 0 in older stores.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_deduped: u64,
    /// (1.7) What the process warned about its capture when it exited: its step rule
    /// numbered the whole run step 0 (`auto` doubting a loop it could not split, a mark rule
    /// that never saw its mark); empty in older stores.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One communicator: which global rank holds each of its ranks (`None`: never registered,
/// e.g. a member that was not traced).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommEntry {
    pub key: u64,
    pub size: u32,
    pub members: Vec<Option<u32>>,
    pub parent: Option<u64>,
    pub color: Option<i32>,
    pub api: String,
}

/// `RUN/manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_major: u16,
    pub format_minor: u16,
    pub run_id: String,
    pub created_unix_ns: u64,
    pub command: Vec<String>,
    pub cwd: String,
    /// The environment the command ran with (secrets are the user's business: `ttrace run`
    /// records what it was given).
    pub env: BTreeMap<String, String>,
    pub config: CaptureConfig,
    pub ranks: Vec<RankInfo>,
    pub comms: Vec<CommEntry>,
    /// Written by the daemon when the run ended and every segment was closed.
    pub finalized: bool,
    pub exit_code: Option<i32>,
    /// The job the run belongs to, as its processes named it (see `wire::JobInfo`); absent
    /// from manifests written before jobs existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<crate::wire::JobInfo>,
    /// Records the collector received but could not store, by cause (a full disk, a write
    /// or fsync error, the store removed during the run). Empty for a complete trace: a store
    /// whose manifest lists losses is *incomplete* (`ttrace ls`, `ttrace fsck`, the run's
    /// summary say so). Absent in stores written before this field existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<Loss>,
}

/// Records lost for one cause (see [`Manifest::lost`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loss {
    /// What went wrong, e.g. `write: No space left on device (os error 28)`.
    pub cause: String,
    /// Records received for the store that are not in it because of this cause.
    pub records: u64,
}

impl Manifest {
    /// Records lost over all causes (0: the trace is complete as far as the collector knows).
    pub fn lost_records(&self) -> u64 {
        self.lost.iter().map(|l| l.records).sum()
    }
}

impl Manifest {
    /// Writes atomically (temporary file, fsync, rename, fsync of the directory).
    pub fn write(&self, run: &Path) -> Result<(), FormatError> {
        self.write_as(run, true)
    }

    /// Writes atomically (temporary file, rename); with `durable`, fsyncs the file before the
    /// rename and the directory after it (else a crash of any process still leaves the old or
    /// the new manifest whole, but a power loss may leave the old one).
    pub fn write_as(&self, run: &Path, durable: bool) -> Result<(), FormatError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = manifest_path(run);
        let tmp = run.join(".manifest.json.tmp");
        let body =
            serde_json::to_vec_pretty(self).map_err(|e| FormatError::Invalid(e.to_string()))?;
        // 0600: the manifest records the command's environment (credentials redacted, but
        // the rest is still the user's business).
        let written = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(&body)?;
                if durable {
                    f.sync_all()?;
                }
                Ok(())
            })
            .map_err(|e| FormatError::at(&tmp, e))
            .and_then(|()| std::fs::rename(&tmp, &path).map_err(|e| FormatError::at(&path, e)));
        if written.is_err() {
            // A full disk must not leave a half-written temporary behind.
            let _ = std::fs::remove_file(&tmp);
        }
        written?;
        if durable {
            if let Ok(d) = File::open(run) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }

    /// Reads and version-checks `RUN/manifest.json`.
    pub fn read(run: &Path) -> Result<Manifest, FormatError> {
        let path = manifest_path(run);
        let mut body = Vec::new();
        open_regular(&path)?
            .read_to_end(&mut body)
            .map_err(|e| FormatError::at(&path, e))?;
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| FormatError::Corrupt(format!("{}: not JSON: {e}", path.display())))?;
        let major = v.get("format_major").and_then(|m| m.as_u64());
        if major != Some(FORMAT_MAJOR as u64) {
            return Err(FormatError::Version(format!(
                "{}: format major version {}, this ttrace reads {FORMAT_MAJOR}",
                path.display(),
                major.map_or_else(|| "missing".to_string(), |m| m.to_string())
            )));
        }
        serde_json::from_value(v)
            .map_err(|e| FormatError::Corrupt(format!("{}: {e}", path.display())))
    }
}

/// A tensor's bytes as they go into a frame.
pub struct Blob {
    pub codec: Codec,
    pub elem_size: u8,
    pub raw_len: u64,
    pub stored: Vec<u8>,
}

impl Blob {
    /// Compresses `raw` (byte-shuffled by `elem_size`, zstd `level`; level 0 stores raw).
    /// The capture daemon writes [`Codec::ShufflePlanes`] instead (`codec::encode_planes`).
    pub fn encode(
        raw: &[u8],
        elem_size: usize,
        level: i32,
        scratch: &mut Vec<u8>,
    ) -> Result<Blob, FormatError> {
        let codec = if level == 0 {
            Codec::Raw
        } else if elem_size > 1 {
            Codec::ShuffleZstd
        } else {
            Codec::Zstd
        };
        Ok(Blob {
            codec,
            elem_size: elem_size as u8,
            raw_len: raw.len() as u64,
            stored: codec::encode(raw, elem_size, codec, level, scratch)?,
        })
    }

    /// The header written before its stored bytes.
    pub fn header(&self) -> BlobHeader {
        BlobHeader {
            codec: self.codec as u8,
            elem_size: self.elem_size,
            raw_len: self.raw_len,
            stored_len: self.stored.len() as u64,
        }
    }
}

/// Appends frames to one segment.
pub struct SegmentWriter {
    path: PathBuf,
    file: Sink,
    offset: u64,
    index: Vec<IndexEntry>,
    /// The record being appended, encoded (kept: no allocation per record).
    meta: Vec<u8>,
}

/// How a segment writer reaches its file.
enum Sink {
    /// Through the page cache.
    Buffered(BufWriter<File>),
    /// Around it: see [`DirectFile`].
    Direct(DirectFile),
}

impl Sink {
    fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::Buffered(f) => f.write_all(data),
            Sink::Direct(d) => d.write_all(data),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::Buffered(f) => f.flush(),
            Sink::Direct(d) => d.flush(),
        }
    }

    fn file(&self) -> &File {
        match self {
            Sink::Buffered(f) => f.get_ref(),
            Sink::Direct(d) => &d.plain,
        }
    }
}

/// Alignment of `O_DIRECT` transfers (buffer address, length and file offset).
const DIRECT_ALIGN: usize = 4096;
/// Bytes a direct writer gathers before writing them out.
const DIRECT_BUF: usize = 4 << 20;
/// A flush writes directly only when it has at least this much to write; less (a trickle of
/// small records) goes through the page cache, where it costs no wait for the device.
const DIRECT_FLUSH_MIN: usize = 512 << 10;

/// Direct-write buffers of segments that were finished, kept for the next ones: a fresh
/// buffer costs a page fault and a page clearing per 4 KiB as it fills, and a capture opens a
/// segment per rank and step.
static SPARE_DIRECT: std::sync::Mutex<Vec<memmap2::MmapMut>> = std::sync::Mutex::new(Vec::new());
/// Buffers kept in [`SPARE_DIRECT`] at most.
const SPARE_DIRECT_BUFS: usize = 8;

/// A [`DirectFile`]'s buffer, [`DIRECT_BUF`] bytes, handed back to [`SPARE_DIRECT`] when
/// dropped.
struct DirectBuf(Option<memmap2::MmapMut>);

impl DirectBuf {
    /// A spare buffer, or a new one.
    fn take() -> std::io::Result<DirectBuf> {
        let spare = SPARE_DIRECT.lock().ok().and_then(|mut v| v.pop());
        match spare {
            Some(m) => Ok(DirectBuf(Some(m))),
            None => memmap2::MmapMut::map_anon(DIRECT_BUF).map(|m| DirectBuf(Some(m))),
        }
    }
}

impl std::ops::Deref for DirectBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }
}

impl std::ops::DerefMut for DirectBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().unwrap_or(&mut [])
    }
}

impl Drop for DirectBuf {
    fn drop(&mut self) {
        if let (Some(m), Ok(mut spare)) = (self.0.take(), SPARE_DIRECT.lock()) {
            if spare.len() < SPARE_DIRECT_BUFS {
                spare.push(m);
            }
        }
    }
}

/// A segment written with `O_DIRECT`: frames are gathered in an aligned buffer and written
/// to the device in large aligned blocks, without passing through the page cache. Through the
/// page cache, a fast capture pays twice for every byte (the copy into fresh cache pages, then
/// the write-back) and the write-back competes with compression for the CPU; direct writes
/// move the bytes to the device from the buffer itself.
///
/// [`DirectFile::flush`] hands everything gathered to the kernel, so a crash of the writer
/// loses nothing flushed and the file always ends exactly at the last frame (never with
/// padding): the aligned part directly when there is a lot of it, the rest (the last,
/// partial block, or all of a small amount) through a second, ordinary descriptor of the same
/// file. A block that went through the page cache is completed through it too, so a direct
/// write never overlaps cached pages (which would make it wait for their write-back). A file
/// system that refuses direct writes gets them all through the ordinary descriptor.
struct DirectFile {
    direct: File,
    plain: File,
    buf: DirectBuf,
    /// File offset of `buf[0]`, a multiple of [`DIRECT_ALIGN`].
    at: u64,
    /// Bytes of `buf` in use.
    len: usize,
    /// Leading bytes of `buf` already written through the page cache.
    cached: usize,
    /// Direct writes work on this file.
    direct_ok: bool,
}

impl DirectFile {
    /// Opens `path` (already created, empty, through `plain`) for direct writes; `None` when
    /// the file system does not do `O_DIRECT`.
    fn open(path: &Path, plain: File) -> Option<DirectFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let fs = rustix::fs::fstatfs(&plain).ok()?;
        // tmpfs and ramfs are the page cache: a direct write there is one more copy.
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        const RAMFS_MAGIC: i64 = 0x8584_58f6;
        if matches!(fs.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC) {
            return None;
        }
        let direct = OpenOptions::new()
            .write(true)
            .custom_flags(OFlags::DIRECT.bits() as i32)
            .open(path)
            .ok()?;
        let buf = DirectBuf::take().ok()?;
        Some(DirectFile {
            direct,
            plain,
            buf,
            at: 0,
            len: 0,
            cached: 0,
            direct_ok: true,
        })
    }

    fn write_all(&mut self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            let k = (DIRECT_BUF - self.len).min(data.len());
            self.buf[self.len..self.len + k].copy_from_slice(&data[..k]);
            self.len += k;
            data = &data[k..];
            if self.len == DIRECT_BUF {
                self.write_out(DIRECT_BUF)?;
            }
        }
        Ok(())
    }

    /// Writes the first `k` bytes of the buffer (a multiple of [`DIRECT_ALIGN`]) at `at`,
    /// directly except for blocks already (partly) in the page cache, and drops them from the
    /// buffer.
    fn write_out(&mut self, k: usize) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let cached_end = self.cached.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
        let split = cached_end.min(k);
        if split > self.cached {
            self.plain
                .write_all_at(&self.buf[self.cached..split], self.at + self.cached as u64)?;
        }
        if k > split {
            let (data, pos) = (&self.buf[split..k], self.at + split as u64);
            if self.direct_ok {
                match self.direct.write_all_at(data, pos) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(Errno::INVAL.raw_os_error()) => {
                        // The file system takes O_DIRECT opens but not the writes (or wants
                        // another alignment): write through the page cache from now on.
                        self.direct_ok = false;
                        self.plain.write_all_at(data, pos)?;
                    }
                    Err(e) => return Err(e),
                }
            } else {
                self.plain.write_all_at(data, pos)?;
            }
        }
        self.drop_front(k);
        Ok(())
    }

    /// Forgets the first `k` bytes of the buffer (written), keeping `buf[0]` at `at`.
    fn drop_front(&mut self, k: usize) {
        self.buf.copy_within(k..self.len, 0);
        self.at += k as u64;
        self.len -= k;
        self.cached = self.cached.saturating_sub(k);
    }

    /// Hands everything gathered to the kernel.
    fn flush(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let aligned = self.len / DIRECT_ALIGN * DIRECT_ALIGN;
        if self.direct_ok && aligned >= self.cached + DIRECT_FLUSH_MIN {
            self.write_out(aligned)?;
        }
        if self.len > self.cached {
            self.plain.write_all_at(
                &self.buf[self.cached..self.len],
                self.at + self.cached as u64,
            )?;
            self.cached = self.len;
        }
        // Whole blocks now in the page cache need not stay in the buffer.
        let done = self.cached / DIRECT_ALIGN * DIRECT_ALIGN;
        if done > 0 {
            self.drop_front(done);
        }
        Ok(())
    }
}

impl Drop for DirectFile {
    /// Like a `BufWriter`, hands what it gathered to the kernel when dropped unflushed.
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

impl SegmentWriter {
    /// Creates the segment (and its rank directory) and writes its header.
    pub fn create(run: &Path, rank: u32, step: u64) -> Result<SegmentWriter, FormatError> {
        SegmentWriter::create_with(run, rank, step, false)
    }

    /// Like [`SegmentWriter::create`], but writes with `O_DIRECT` where the file system
    /// allows it (the capture daemon: see [`DirectFile`]); same file contents.
    pub fn create_direct(run: &Path, rank: u32, step: u64) -> Result<SegmentWriter, FormatError> {
        SegmentWriter::create_with(run, rank, step, true)
    }

    fn create_with(
        run: &Path,
        rank: u32,
        step: u64,
        direct: bool,
    ) -> Result<SegmentWriter, FormatError> {
        let path = segment_path(run, rank, step);
        let dir = rank_dir(run, rank);
        std::fs::create_dir_all(&dir).map_err(|e| FormatError::at(&dir, e))?;
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| FormatError::at(&path, e))?;
        let mut file = if direct {
            match f.try_clone().ok().and_then(|p| DirectFile::open(&path, p)) {
                Some(d) => Sink::Direct(d),
                None => Sink::Buffered(BufWriter::with_capacity(1 << 20, f)),
            }
        } else {
            Sink::Buffered(BufWriter::with_capacity(1 << 20, f))
        };
        file.write_all(&SegmentHeader::current(rank, step).encode())
            .map_err(|e| FormatError::at(&path, e))?;
        Ok(SegmentWriter {
            path,
            file,
            offset: SEGMENT_HEADER_BYTES,
            index: Vec::new(),
            meta: Vec::new(),
        })
    }

    /// Appends one record with its blobs (one per captured tensor, in order). Returns the
    /// bytes written.
    pub fn append(&mut self, record: &Record, blobs: &[Blob]) -> Result<u64, FormatError> {
        self.meta.clear();
        ciborium::into_writer(record, &mut self.meta)
            .map_err(|e| FormatError::Invalid(format!("encode record: {e}")))?;
        let meta = &self.meta;
        let body_len = 4
            + meta.len()
            + blobs
                .iter()
                .map(|b| BLOB_HEADER_BYTES + b.stored.len())
                .sum::<usize>();
        let mut crc = crc32fast::Hasher::new();
        let meta_len = (meta.len() as u32).to_le_bytes();
        crc.update(&meta_len);
        crc.update(meta);
        let mut headers = Vec::with_capacity(blobs.len());
        for b in blobs {
            let h = b.header().encode();
            crc.update(&h);
            crc.update(&b.stored);
            headers.push(h);
        }
        let crc = crc.finalize();
        let fh = FrameHeader {
            body_len: body_len as u64,
            crc32: crc,
        }
        .encode();
        let io = |e| FormatError::at(&self.path, e);
        self.file.write_all(&fh).map_err(io)?;
        self.file.write_all(&meta_len).map_err(io)?;
        self.file.write_all(meta).map_err(io)?;
        for (h, b) in headers.iter().zip(blobs) {
            self.file.write_all(h).map_err(io)?;
            self.file.write_all(&b.stored).map_err(io)?;
        }
        let frame_len = FRAME_HEADER_BYTES + body_len as u64;
        self.index.push(IndexEntry {
            seq: record.seq,
            offset: self.offset,
            frame_len,
            crc32: crc,
        });
        self.offset += frame_len;
        Ok(frame_len)
    }

    /// Bytes of the segment appended so far (header included): the end of the last frame.
    pub fn len(&self) -> u64 {
        self.offset
    }

    /// Always false: a segment holds at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Bytes of the segment already handed to the kernel (they survive a crash of this
    /// process); the rest, up to [`SegmentWriter::len`], waits in this writer's buffer until
    /// it fills or [`SegmentWriter::flush`].
    pub fn handed(&self) -> u64 {
        match &self.file {
            // After a failed append the buffer may also hold the start of the frame that
            // failed (not counted in `offset`): then less is known to be in the kernel, never
            // more.
            Sink::Buffered(f) => self.offset.saturating_sub(f.buffer().len() as u64),
            Sink::Direct(d) => d.at + d.cached as u64,
        }
    }

    /// Pushes buffered frames to the kernel (a crash of this process then loses nothing).
    pub fn flush(&mut self) -> Result<(), FormatError> {
        self.file
            .flush()
            .map_err(|e| FormatError::at(&self.path, e))
    }

    /// Flushes and fsyncs the segment (step end).
    pub fn sync(&mut self) -> Result<(), FormatError> {
        self.flush()?;
        self.file
            .file()
            .sync_data()
            .map_err(|e| FormatError::at(&self.path, e))
    }

    /// Syncs the segment and writes its index.
    pub fn finish(mut self) -> Result<(), FormatError> {
        self.sync()?;
        write_index(&index_path(&self.path), &self.index)
    }

    /// Device and inode of the segment file as this writer holds it open: compared with the
    /// path's, it tells whether the file is still where readers look for it (the store may
    /// have been removed or replaced under a running collector).
    pub fn file_id(&self) -> std::io::Result<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let m = self.file.file().metadata()?;
        Ok((m.dev(), m.ino()))
    }

    /// The segment's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Frames written so far.
    pub fn records(&self) -> usize {
        self.index.len()
    }
}

/// Writes an index file atomically.
pub fn write_index(path: &Path, entries: &[IndexEntry]) -> Result<(), FormatError> {
    let mut buf = Vec::with_capacity(INDEX_HEADER_BYTES + entries.len() * INDEX_ENTRY_BYTES);
    let header = IndexHeader {
        major: FORMAT_MAJOR,
        minor: FORMAT_MINOR,
        entries: entries.len() as u32,
    };
    buf.extend_from_slice(&header.encode());
    for e in entries {
        buf.extend_from_slice(&e.encode());
    }
    let tmp = path.with_extension("idx.tmp");
    let written = create_regular(&tmp)
        .and_then(|mut f| f.write_all(&buf).map_err(|e| FormatError::at(&tmp, e)))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| FormatError::at(path, e)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Reads an index file.
pub fn read_index(path: &Path) -> Result<Vec<IndexEntry>, FormatError> {
    let mut buf = Vec::new();
    open_regular(path)?
        .read_to_end(&mut buf)
        .map_err(|e| FormatError::at(path, e))?;
    let bad = |why: &str| FormatError::Corrupt(format!("{}: {why}", path.display()));
    let header = (buf.len() >= INDEX_HEADER_BYTES)
        .then(|| IndexHeader::parse(&buf))
        .flatten()
        .ok_or_else(|| bad("not a ttrace index"))?;
    crate::frame::check_major(header.major, "index", path)?;
    let n = header.entries as usize;
    if buf.len() != INDEX_HEADER_BYTES + n * INDEX_ENTRY_BYTES {
        return Err(bad("entry count does not match the file size"));
    }
    Ok(buf[INDEX_HEADER_BYTES..]
        .chunks_exact(INDEX_ENTRY_BYTES)
        .map(IndexEntry::parse)
        .collect())
}

/// Where a blob's bytes sit inside a frame body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobRef {
    pub codec: Codec,
    pub elem_size: u8,
    pub raw_len: u64,
    /// Range of the stored bytes in the body.
    pub start: usize,
    pub end: usize,
}

/// A decoded frame.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Offset of the frame header in the segment.
    pub offset: u64,
    pub record: Record,
    pub body: Vec<u8>,
    pub blobs: Vec<BlobRef>,
    /// The segment it was read from ([`crate::reader::Segment::into_frames`], shared by all its
    /// frames): streamed tensors and references resolve through it.
    pub segment: Option<Arc<crate::reader::Segment>>,
}

impl Frame {
    /// The raw bytes of the `i`-th captured tensor. A streamed tensor or a reference (format
    /// 1.2, 1.3) is read through its segment ([`crate::reader::RecordView`]), which checks the
    /// bytes against the record's length and CRC-32.
    pub fn tensor_bytes(&self, i: usize) -> Result<Vec<u8>, FormatError> {
        let b = self.blobs.get(i).ok_or_else(|| {
            FormatError::Invalid(format!(
                "record has {} captured tensors, asked for {i}",
                self.blobs.len()
            ))
        })?;
        if matches!(b.codec, Codec::Streamed | Codec::Reference) {
            let seg = self.segment.as_deref().ok_or_else(|| {
                FormatError::Invalid(
                    "a streamed or deduplicated tensor read outside its segment".into(),
                )
            })?;
            let tensor = self
                .record
                .tensors
                .iter()
                .enumerate()
                .filter(|(_, t)| t.captured)
                .nth(i)
                .map(|(t, _)| t)
                .ok_or_else(|| FormatError::Corrupt(format!("no captured tensor {i}")))?;
            return seg.view_of(self).tensor_bytes(tensor);
        }
        codec::decode(
            &self.body[b.start..b.end],
            b.raw_len as usize,
            b.elem_size as usize,
            b.codec,
            &mut Vec::new(),
        )
    }

    /// Decodes a body (already checked against its CRC).
    pub fn parse(offset: u64, body: Vec<u8>) -> Result<Frame, FormatError> {
        let (record, blobs) = parse_body(offset, &body)?;
        Ok(Frame {
            offset,
            record,
            body,
            blobs,
            segment: None,
        })
    }
}

/// Decodes a frame body in place (already checked against its CRC): the record and where each
/// blob's stored bytes sit in `body`. `offset` (of the frame in its segment) only names the
/// frame in errors.
pub fn parse_body(offset: u64, body: &[u8]) -> Result<(Record, Vec<BlobRef>), FormatError> {
    let (meta, blobs) = split_body(offset, body)?;
    let record =
        decode_record(meta).map_err(|e| corrupt_at(offset, format!("record metadata: {e}")))?;
    check_blobs(offset, &record, &blobs)?;
    Ok((record, blobs))
}

/// A record's metadata from its CBOR: decoded with minicbor's serde decoder (about twice
/// ciborium's speed on records: a comparison reads every record's at least once, and
/// again those dropped from its budget), and by ciborium, which wrote it, when that fails.
/// Both read serde's data model from the same CBOR, so a record that either reads is the same
/// record (checked field by field on every kind of record in the tests). Records only
/// ciborium reads are counted ([`slow_decodes`]) and the first is logged (debug): a change
/// that sends them all there halves the speed without changing a result.
pub fn decode_record(meta: &[u8]) -> Result<Record, ciborium::de::Error<std::io::Error>> {
    minicbor_serde::from_slice(meta).or_else(|fast| {
        if SLOW_DECODES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
            tracing::debug!("a record's metadata is read by the slower CBOR decoder: {fast}");
        }
        ciborium::from_reader(meta)
    })
}

/// Records whose metadata [`decode_record`] read with ciborium (the faster decoder refused
/// them), in this process.
static SLOW_DECODES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many records [`decode_record`] read with the slower decoder in this process.
pub fn slow_decodes() -> u64 {
    SLOW_DECODES.load(std::sync::atomic::Ordering::Relaxed)
}

/// [`parse_body`] of a frame whose record is already known (`record`, decoded from this very
/// body before): where its blobs sit, without decoding the record's metadata again, checked
/// against the record as `parse_body` checks them.
pub fn parse_blobs_of(
    offset: u64,
    body: &[u8],
    record: &Record,
) -> Result<Vec<BlobRef>, FormatError> {
    let (_, blobs) = split_body(offset, body)?;
    check_blobs(offset, record, &blobs)?;
    Ok(blobs)
}

fn corrupt_at(offset: u64, why: String) -> FormatError {
    FormatError::Corrupt(format!("frame at {offset}: {why}"))
}

/// A frame body's record metadata (CBOR, not decoded) and its blobs.
fn split_body(offset: u64, body: &[u8]) -> Result<(&[u8], Vec<BlobRef>), FormatError> {
    let bad = |why: String| corrupt_at(offset, why);
    if body.len() < 4 {
        return Err(bad("body shorter than its metadata length".into()));
    }
    let meta_len = u32::from_le_bytes(body[..4].try_into().expect("4 bytes")) as usize;
    // The collector takes no message over 1 MiB, so no record it wrote has more metadata; a
    // larger one is a crafted frame that would cost many times its size to decode.
    if meta_len > MAX_META_BYTES {
        return Err(bad(format!(
            "{meta_len} bytes of record metadata (at most {MAX_META_BYTES})"
        )));
    }
    let meta_end = 4usize
        .checked_add(meta_len)
        .filter(|&e| e <= body.len())
        .ok_or_else(|| bad("metadata runs past the body".into()))?;
    let mut blobs = Vec::new();
    let mut at = meta_end;
    while at < body.len() {
        if at + BLOB_HEADER_BYTES > body.len() {
            return Err(bad("truncated blob header".into()));
        }
        let h = BlobHeader::parse(&body[at..at + BLOB_HEADER_BYTES]);
        let codec =
            Codec::from_u8(h.codec).ok_or_else(|| bad(format!("unknown codec {}", h.codec)))?;
        let start = at + BLOB_HEADER_BYTES;
        let end = usize::try_from(h.stored_len)
            .ok()
            .and_then(|s| start.checked_add(s))
            .filter(|&e| e <= body.len())
            .ok_or_else(|| bad("blob runs past the body".into()))?;
        blobs.push(BlobRef {
            codec,
            elem_size: h.elem_size,
            raw_len: h.raw_len,
            start,
            end,
        });
        at = end;
    }
    Ok((&body[4..meta_end], blobs))
}

/// The record has one blob per captured tensor.
fn check_blobs(offset: u64, record: &Record, blobs: &[BlobRef]) -> Result<(), FormatError> {
    let captured = record.tensors.iter().filter(|t| t.captured).count();
    if captured != blobs.len() {
        return Err(corrupt_at(
            offset,
            format!("{captured} captured tensors but {} blobs", blobs.len()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memcpy_record(seq: u64, bytes: &[u8]) -> Record {
        Record::d2h_copy(1, 2, seq, bytes)
    }

    /// Every kind of record, with the floats ciborium writes in half, single and double
    /// precision, read by the faster decoder exactly as written (and as ciborium reads it).
    #[test]
    fn record_metadata_decodes_the_same_by_either_decoder() {
        use crate::record::{CollectiveKind, CollectiveOp, GapReason, GemmOp, MemsetOp, Op};
        let mut records = vec![memcpy_record(0, &[1, 2, 3, 4])];
        for (seq, alpha, beta) in [
            (1, Some(1.0), Some(0.0)),
            (2, Some(0.1), None),
            (3, Some(-0.5f32 as f64), Some(1e300)),
            (4, None, Some(f64::MIN_POSITIVE)),
        ] {
            let mut r = memcpy_record(seq, &[]);
            r.api = "cublasGemmEx".into();
            let mut g = GemmOp::plain(64, 128, 32, 14);
            g.alpha = alpha;
            g.beta = beta;
            g.transa = 1;
            r.op = Op::Gemm(Box::new(g));
            r.nvtx = vec!["forward.mb0".into(), "layers.0 ∑ attn".into()];
            r.kernels_before = vec!["ampere_bf16_s1688gemm".into()];
            records.push(r);
        }
        let mut r = memcpy_record(5, &[9; 16]);
        r.api = "ncclAllReduce".into();
        r.op = Op::Collective(CollectiveOp {
            kind: CollectiveKind::AllReduce,
            count: 4,
            nccl_type: 7,
            redop: Some(0),
            root_or_peer: Some(-1),
            comm: u64::MAX,
            comm_rank: 1,
            comm_size: 2,
            sendbuff: 0x7f00_0000_0000,
            recvbuff: 0x7f00_0000_1000,
            group: 3,
            premul: Some(crate::record::PreMulSum {
                nccl_type: 7,
                residence: 1,
                factor: Some(0.125),
            }),
        });
        records.push(r);
        let mut r = memcpy_record(6, &[]);
        r.op = Op::Memset(MemsetOp {
            dst: 1 << 40,
            value: 0xff,
            width: 4096,
            height: 1,
            depth: 1,
            pitch: 0,
            slice_pitch: 0,
        });
        records.push(r);
        let mut r = memcpy_record(7, &[]);
        r.op = Op::gap(GapReason::RingFull, "cudaMemcpyAsync", 1 << 30, "ring full");
        records.push(r);
        for r in &records {
            let mut cbor = Vec::new();
            ciborium::into_writer(r, &mut cbor).expect("encode");
            let fast: Record = minicbor_serde::from_slice(&cbor).expect("minicbor decodes it");
            assert_eq!(&fast, r, "seq {}", r.seq);
            assert_eq!(&decode_record(&cbor).expect("decodes"), r);
            let slow: Record = ciborium::from_reader(&cbor[..]).expect("ciborium decodes it");
            assert_eq!(&slow, r);
        }
        // Not a record: an error from either, never a record.
        assert!(decode_record(&[0xa1, 0x61, b'x', 0x01]).is_err());
    }

    fn scratch_dir(name: &str) -> PathBuf {
        // Under the build's target directory, on the same (disk) file system as the build:
        // the temp directory may be a tmpfs, where the direct path is not taken.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target")
            .join(format!("store-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// A direct writer's file is byte for byte the buffered writer's, at every flush (a
    /// crash of the writer then loses nothing flushed) and after finishing, for frames
    /// smaller and larger than its buffer.
    #[test]
    fn direct_and_buffered_segments_are_identical() {
        let dir = scratch_dir("direct");
        let (a, b) = (dir.join("buffered"), dir.join("direct"));
        let mut buffered = SegmentWriter::create(&a, 1, 2).expect("create");
        let mut direct = SegmentWriter::create_direct(&b, 1, 2).expect("create");
        // Small and large frames, flushed or not: each path of the direct writer (direct,
        // through the page cache, a partly cached block completed) at buffer boundaries.
        let mut sizes = vec![
            0usize,
            1,
            100,
            4095,
            4096,
            70_000,
            5 << 20,
            3,
            9 << 20,
            12_345,
        ];
        let mut x = 0x9e37_79b9u64;
        for _ in 0..120 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let pick = [10, 3000, 70_000, 700_000, 1_500_000][(x % 5) as usize];
            sizes.push(pick + (x >> 40) as usize % 5000);
        }
        for (seq, &n) in sizes.iter().enumerate() {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 31 + seq) as u8).collect();
            let rec = memcpy_record(seq as u64, &bytes);
            let blob = Blob {
                codec: Codec::Raw,
                elem_size: 1,
                raw_len: n as u64,
                stored: bytes,
            };
            let x = buffered
                .append(&rec, std::slice::from_ref(&blob))
                .expect("append");
            let y = direct.append(&rec, &[blob]).expect("append");
            assert_eq!(x, y);
            if seq % 3 != 1 {
                buffered.flush().expect("flush");
                direct.flush().expect("flush");
            }
            if seq % 3 != 1 && (seq < 10 || seq % 7 == 0) {
                let (pa, pb) = (segment_path(&a, 1, 2), segment_path(&b, 1, 2));
                let (fa, fb) = (
                    std::fs::read(&pa).expect("read"),
                    std::fs::read(&pb).expect("read"),
                );
                assert_eq!(fa.len(), fb.len(), "after record {seq}");
                assert!(fa == fb, "contents differ after record {seq}");
            }
        }
        buffered.finish().expect("finish");
        direct.finish().expect("finish");
        for p in [segment_path(&a, 1, 2), index_path(&segment_path(&a, 1, 2))] {
            let q = b.join(p.strip_prefix(&a).expect("under a"));
            assert!(
                std::fs::read(&p).expect("read") == std::fs::read(&q).expect("read"),
                "{} differs",
                q.display()
            );
        }
        let seg = crate::reader::Segment::open(&segment_path(&b, 1, 2)).expect("open");
        assert!(seg.issues().is_empty(), "{:?}", seg.issues());
        let mut seqs = Vec::new();
        for f in seg.into_frames() {
            let f = f.expect("intact frame");
            assert_eq!(f.tensor_bytes(0).expect("bytes").len(), sizes[seqs.len()]);
            seqs.push(f.record.seq);
        }
        assert_eq!(seqs, (0..sizes.len() as u64).collect::<Vec<_>>());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A direct writer takes the buffer a finished one handed back: its file holds its own
    /// frames only, byte for byte what the buffered writer writes, never bytes the buffer
    /// held for the earlier segment.
    #[test]
    fn a_reused_direct_buffer_writes_only_its_own_frames() {
        let dir = scratch_dir("reuse");
        let blob_of = |bytes: Vec<u8>| Blob {
            codec: Codec::Raw,
            elem_size: 1,
            raw_len: bytes.len() as u64,
            stored: bytes,
        };
        let mut first = SegmentWriter::create_direct(&dir, 1, 2).expect("create");
        for seq in 0..3u64 {
            let bytes = vec![0xee; 1_500_000];
            let rec = memcpy_record(seq, &bytes);
            first.append(&rec, &[blob_of(bytes)]).expect("append");
        }
        first.finish().expect("finish");
        let (a, b) = (dir.join("buffered"), dir.join("direct"));
        let mut buffered = SegmentWriter::create(&a, 1, 3).expect("create");
        let mut direct = SegmentWriter::create_direct(&b, 1, 3).expect("create");
        for seq in 0..5u64 {
            let bytes = vec![seq as u8; 3000];
            let rec = memcpy_record(seq, &bytes);
            buffered
                .append(&rec, &[blob_of(bytes.clone())])
                .expect("append");
            direct.append(&rec, &[blob_of(bytes)]).expect("append");
            if seq % 2 == 0 {
                buffered.flush().expect("flush");
                direct.flush().expect("flush");
            }
        }
        buffered.finish().expect("finish");
        direct.finish().expect("finish");
        let (pa, pb) = (segment_path(&a, 1, 3), segment_path(&b, 1, 3));
        assert!(
            std::fs::read(pa).expect("read") == std::fs::read(pb).expect("read"),
            "the reused buffer's segment differs from the buffered one"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A direct writer dropped without `finish` (its owner died) still leaves every frame
    /// appended before in the file.
    #[test]
    fn a_dropped_direct_writer_keeps_its_frames() {
        let dir = scratch_dir("dropped");
        let mut w = SegmentWriter::create_direct(&dir, 1, 2).expect("create");
        for seq in 0..3u64 {
            let bytes = vec![seq as u8; 10_000];
            let rec = memcpy_record(seq, &bytes);
            let blob = Blob {
                codec: Codec::Raw,
                elem_size: 1,
                raw_len: bytes.len() as u64,
                stored: bytes,
            };
            w.append(&rec, &[blob]).expect("append");
        }
        drop(w);
        let seg = crate::reader::Segment::open(&segment_path(&dir, 1, 2)).expect("open");
        // No index (the writer never finished), every frame intact.
        assert!(
            seg.issues().iter().all(|i| !i.kind.loses_data()),
            "{:?}",
            seg.issues()
        );
        let seqs: Vec<u64> = seg
            .into_frames()
            .map(|f| f.expect("intact frame").record.seq)
            .collect();
        assert_eq!(seqs, [0, 1, 2]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
