//! Streamed tensors (format 1.2): a tensor too large for one ring slot reaches the store in
//! chunks, each written as it arrives into a file of its own under `RUN/streams/`, so neither
//! side ever holds the whole tensor. The record's blob for such a tensor has codec
//! [`Codec::Streamed`] and names the file; readers resolve it transparently
//! ([`read_stream`]). docs/format.md specifies the layout.
//!
//! A stream is written as `NAME.tts.part` and renamed to `NAME.tts` once its last chunk is in
//! the file, before the record that references it is written: a `.part` file is a tensor whose
//! process (or collector) died mid-stream, lost and counted as such, never read as data.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::codec::{self, Codec};
use crate::store::{create_regular, open_regular, Blob, BLOB_HEADER_BYTES};
use crate::FormatError;

/// Directory of the stream files, relative to the run.
pub const STREAMS_DIR: &str = "streams";
/// Extension of a complete stream file.
pub const STREAM_EXT: &str = "tts";
/// Suffix of a stream file still being written (or abandoned by a crash).
pub const PARTIAL_SUFFIX: &str = ".part";
use crate::frame::{BlobHeader, ChunkHeader, StreamHeader};
pub use crate::frame::{CHUNK_HEADER_BYTES, CHUNK_MAGIC, STREAM_HEADER_BYTES, STREAM_MAGIC};
/// Largest chunk a reader accepts (raw bytes): bounds what a crafted header can make it
/// allocate. Writers use a quarter of the ring at most, and rings are at most 64 GiB.
pub const MAX_CHUNK_BYTES: u64 = 16 << 30;

/// The file name of stream `stream` of the traced process `pid` (collector client `client`).
pub fn file_name(client: u64, pid: u32, stream: u64) -> String {
    format!("c{client}-p{pid}-s{stream}.{STREAM_EXT}")
}

/// The path a [`Codec::Streamed`] blob names, relative to the run (`streams/NAME.tts`).
pub fn relative_path(name: &str) -> String {
    format!("{STREAMS_DIR}/{name}")
}

/// Checks a blob's reference (it comes from a file that may have been crafted): exactly
/// `streams/NAME.tts`, NAME without a path separator or a leading dot.
pub fn check_reference(rel: &str) -> Result<&str, FormatError> {
    let name = rel
        .strip_prefix(STREAMS_DIR)
        .and_then(|r| r.strip_prefix('/'))
        .filter(|n| {
            !n.is_empty()
                && !n.starts_with('.')
                && !n.contains('/')
                && !n.contains('\0')
                && n.ends_with(&format!(".{STREAM_EXT}"))
        });
    name.ok_or_else(|| {
        FormatError::Corrupt(format!(
            "streamed tensor reference {rel:?} is not {STREAMS_DIR}/NAME.{STREAM_EXT}"
        ))
    })
}

/// Writes one streamed tensor, chunk by chunk, in order.
pub struct StreamWriter {
    file: File,
    partial: PathBuf,
    done: PathBuf,
    name: String,
    total: u64,
    written: u64,
    next_index: u32,
}

impl StreamWriter {
    /// Creates `RUN/streams/NAME.part` for a tensor of `total` bytes of `elem`-byte elements.
    pub fn create(
        run: &Path,
        name: &str,
        total: u64,
        elem: u8,
    ) -> Result<StreamWriter, FormatError> {
        let dir = run.join(STREAMS_DIR);
        {
            use std::os::unix::fs::DirBuilderExt;
            // Private to the user who traced, like the rest of the store.
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(|e| FormatError::at(&dir, e))?;
        }
        let done = dir.join(name);
        let partial = dir.join(format!("{name}{PARTIAL_SUFFIX}"));
        let mut file = create_regular(&partial)?;
        file.write_all(&StreamHeader::current(elem, total).encode())
            .map_err(|e| FormatError::at(&partial, e))?;
        Ok(StreamWriter {
            file,
            partial,
            done,
            name: name.to_string(),
            total,
            written: 0,
            next_index: 0,
        })
    }

    /// Appends chunk `index`, the raw bytes at `offset` of the tensor, compressed as `blob`.
    /// Chunks come in order and tile the tensor; anything else is refused.
    pub fn append(&mut self, index: u32, offset: u64, blob: &Blob) -> Result<(), FormatError> {
        if index != self.next_index
            || offset != self.written
            || blob.raw_len == 0
            || blob.raw_len > MAX_CHUNK_BYTES
            || offset + blob.raw_len > self.total
        {
            return Err(FormatError::Invalid(format!(
                "{}: chunk {index} at {offset} of {} bytes does not follow chunk {} ending at {} \
                 of a {}-byte tensor",
                self.name, blob.raw_len, self.next_index, self.written, self.total
            )));
        }
        let bh = blob.header().encode();
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bh);
        crc.update(&blob.stored);
        let body_len = (BLOB_HEADER_BYTES + blob.stored.len()) as u64;
        let ch = ChunkHeader {
            index,
            offset,
            body_len,
            crc32: crc.finalize(),
        }
        .encode();
        let io = |e| FormatError::at(&self.partial, e);
        self.file.write_all(&ch).map_err(io)?;
        self.file.write_all(&bh).map_err(io)?;
        self.file.write_all(&blob.stored).map_err(io)?;
        self.next_index += 1;
        self.written += blob.raw_len;
        Ok(())
    }

    /// Whether every byte of the tensor was appended.
    pub fn is_complete(&self) -> bool {
        self.written == self.total
    }

    /// Bytes of the tensor appended so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Renames the complete file into place; returns the blob reference
    /// (`streams/NAME.tts`).
    pub fn finish(self) -> Result<String, FormatError> {
        if !self.is_complete() {
            return Err(FormatError::Invalid(format!(
                "{}: {} of {} bytes streamed",
                self.name, self.written, self.total
            )));
        }
        std::fs::rename(&self.partial, &self.done).map_err(|e| FormatError::at(&self.done, e))?;
        Ok(relative_path(&self.name))
    }

    /// Removes the file of a stream its producer abandoned (what it held is reported by the
    /// producer as a gap).
    pub fn abandon(self) {
        let _ = std::fs::remove_file(&self.partial);
    }
}

/// The blob of a streamed tensor in its record's frame.
pub fn reference_blob(reference: &str, raw_len: u64, elem: u8) -> Blob {
    Blob {
        codec: Codec::Streamed,
        elem_size: elem,
        raw_len,
        stored: reference.as_bytes().to_vec(),
    }
}

/// Reads the streamed tensor a [`Codec::Streamed`] blob of a store under `run` names
/// (`reference`, `raw_len` bytes) into `out`, checking every chunk: a missing, partial or
/// damaged file is an error, never short or wrong bytes.
pub fn read_stream(
    run: &Path,
    reference: &[u8],
    raw_len: u64,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<(), FormatError> {
    let rel = std::str::from_utf8(reference)
        .map_err(|_| FormatError::Corrupt("streamed tensor reference is not UTF-8".into()))?;
    let name = check_reference(rel)?;
    let path = run.join(STREAMS_DIR).join(name);
    let bad = |why: String| FormatError::Corrupt(format!("{}: {why}", path.display()));
    let mut f = std::io::BufReader::with_capacity(1 << 20, open_regular(&path)?);
    let io = |e| FormatError::at(&path, e);
    let mut h = [0u8; STREAM_HEADER_BYTES];
    f.read_exact(&mut h).map_err(io)?;
    let header = StreamHeader::parse(&h).ok_or_else(|| bad("not a ttrace stream file".into()))?;
    crate::frame::check_major(header.major, "stream", &path)?;
    let total = header.total;
    if total != raw_len {
        return Err(bad(format!(
            "holds a {total}-byte tensor, its record says {raw_len}"
        )));
    }
    out.clear();
    let mut chunk = Vec::new();
    let mut body = Vec::new();
    let mut index = 0u32;
    while (out.len() as u64) < total {
        let mut ch = [0u8; CHUNK_HEADER_BYTES];
        f.read_exact(&mut ch).map_err(|e| {
            bad(format!(
                "ends after {} of {total} bytes ({e}): a partial stream",
                out.len()
            ))
        })?;
        let at = out.len() as u64;
        let header = ChunkHeader::parse(&ch);
        let Some(ChunkHeader {
            body_len,
            crc32: crc,
            ..
        }) = header.filter(|c| c.index == index && c.offset == at)
        else {
            let found = header.map_or("no chunk magic".to_string(), |c| {
                format!("index {}, offset {}", c.index, c.offset)
            });
            return Err(bad(format!(
                "chunk {index} at {at} has a bad header ({found})"
            )));
        };
        if body_len < BLOB_HEADER_BYTES as u64 || body_len > MAX_CHUNK_BYTES + 4096 {
            return Err(bad(format!("chunk {index} claims {body_len} bytes")));
        }
        body.clear();
        (&mut f).take(body_len).read_to_end(&mut body).map_err(io)?;
        if body.len() as u64 != body_len {
            return Err(bad(format!("chunk {index} is truncated: a partial stream")));
        }
        if crc32fast::hash(&body) != crc {
            return Err(bad(format!("chunk {index} does not match its CRC-32")));
        }
        let blob = BlobHeader::parse(&body);
        let codec = Codec::from_u8(blob.codec)
            .filter(|c| !matches!(c, Codec::Streamed | Codec::Reference))
            .ok_or_else(|| bad(format!("chunk {index} has codec {}", blob.codec)))?;
        let (chunk_raw, stored) = (blob.raw_len, blob.stored_len);
        if stored != body_len - BLOB_HEADER_BYTES as u64 || chunk_raw == 0 || chunk_raw > total - at
        {
            return Err(bad(format!("chunk {index} has inconsistent lengths")));
        }
        codec::decode_into(
            &body[BLOB_HEADER_BYTES..],
            chunk_raw,
            blob.elem_size as usize,
            codec,
            scratch,
            &mut chunk,
        )
        .map_err(|e| bad(format!("chunk {index}: {e}")))?;
        out.extend_from_slice(&chunk);
        index += 1;
    }
    Ok(())
}

/// Bytes on disk of the stream a [`Codec::Streamed`] blob names (0 when it cannot be
/// found): what the tensor costs in the store.
pub fn stored_len(run: &Path, reference: &[u8]) -> u64 {
    std::str::from_utf8(reference)
        .ok()
        .and_then(|r| check_reference(r).ok())
        .and_then(|name| std::fs::symlink_metadata(run.join(STREAMS_DIR).join(name)).ok())
        .map_or(0, |m| m.len())
}

/// The stream files under `run` that were never completed (`streams/*.part`): tensors lost
/// mid-stream.
pub fn partial_streams(run: &Path) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(run.join(STREAMS_DIR)) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = dir
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(PARTIAL_SUFFIX))
        })
        .collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ttrace-stream-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("tmp dir");
        d
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn a_tensor_streamed_in_chunks_reads_back_whole() {
        let run = tmp("roundtrip");
        let bytes = pattern(10_000);
        let mut w = StreamWriter::create(&run, "c1-p2-s3.tts", 10_000, 2).expect("create");
        let mut scratch = Vec::new();
        for (i, c) in bytes.chunks(3000).enumerate() {
            let blob = Blob::encode(c, 2, 3, &mut scratch).expect("encode");
            w.append(i as u32, i as u64 * 3000, &blob).expect("append");
        }
        let rel = w.finish().expect("complete");
        assert_eq!(rel, "streams/c1-p2-s3.tts");
        let mut out = Vec::new();
        read_stream(&run, rel.as_bytes(), 10_000, &mut scratch, &mut out).expect("reads");
        assert_eq!(out, bytes);
        assert!(partial_streams(&run).is_empty());
        let _ = std::fs::remove_dir_all(&run);
    }

    #[test]
    fn chunks_out_of_order_or_past_the_end_are_refused() {
        let run = tmp("order");
        let mut w = StreamWriter::create(&run, "a.tts", 100, 1).expect("create");
        let blob = |n: usize| Blob {
            codec: Codec::Raw,
            elem_size: 1,
            raw_len: n as u64,
            stored: vec![1; n],
        };
        assert!(w.append(1, 0, &blob(10)).is_err(), "index 1 first");
        assert!(w.append(0, 10, &blob(10)).is_err(), "a hole");
        assert!(w.append(0, 0, &blob(101)).is_err(), "past the end");
        w.append(0, 0, &blob(60)).expect("in order");
        assert!(!w.is_complete());
        let _ = std::fs::remove_dir_all(&run);
    }

    #[test]
    fn a_partial_stream_is_listed_and_never_read_as_data() {
        let run = tmp("partial");
        let mut w = StreamWriter::create(&run, "x.tts", 100, 1).expect("create");
        let blob = Blob {
            codec: Codec::Raw,
            elem_size: 1,
            raw_len: 40,
            stored: vec![9; 40],
        };
        w.append(0, 0, &blob).expect("append");
        drop(w);
        assert_eq!(partial_streams(&run).len(), 1);
        // Even renamed into place by hand, the missing bytes are an error.
        std::fs::rename(run.join("streams/x.tts.part"), run.join("streams/x.tts")).expect("rename");
        let (mut s, mut out) = (Vec::new(), Vec::new());
        let e = read_stream(&run, b"streams/x.tts", 100, &mut s, &mut out).unwrap_err();
        assert!(e.to_string().contains("partial stream"), "{e}");
        let _ = std::fs::remove_dir_all(&run);
    }

    #[test]
    fn references_outside_the_streams_directory_are_refused() {
        for bad in [
            "../etc/passwd",
            "streams/../../x.tts",
            "streams/.hidden.tts",
            "streams/a/b.tts",
            "streams/x.seg",
            "other/x.tts",
        ] {
            assert!(check_reference(bad).is_err(), "{bad}");
        }
        assert_eq!(
            check_reference("streams/c1-p2-s3.tts").ok(),
            Some("c1-p2-s3.tts")
        );
    }
}
