//! One client's streamed tensors: chunks appended to their stream files as they arrive (the
//! ring slot of a chunk is released once its bytes are written), complete streams handed to
//! the record that names them.

use std::collections::HashMap;
use std::path::PathBuf;

use tracing::warn;
use ttrace_format::record::Record;
use ttrace_format::store::Blob;
use ttrace_format::stream::{self, StreamWriter, PARTIAL_SUFFIX};
use ttrace_format::wire::{Chunk, StreamRef};

/// A stream whose last chunk is in its file.
struct Complete {
    reference: String,
    total: u64,
    elem: u8,
    crc: u32,
}

/// The streams of one client.
pub(crate) struct Streams {
    run: PathBuf,
    client: u64,
    pid: u32,
    open: HashMap<u64, (StreamWriter, crc32fast::Hasher)>,
    complete: HashMap<u64, Complete>,
    /// Raw and stored bytes written (for the client's totals).
    pub(crate) bytes_raw: u64,
    pub(crate) bytes_stored: u64,
    /// Chunks whose bytes did not match the CRC-32 the producer computed.
    pub(crate) crc_mismatches: u64,
}

impl Streams {
    pub(crate) fn new(run: PathBuf, client: u64, pid: u32) -> Streams {
        Streams {
            run,
            client,
            pid,
            open: HashMap::new(),
            complete: HashMap::new(),
            bytes_raw: 0,
            bytes_stored: 0,
            crc_mismatches: 0,
        }
    }

    /// Appends a compressed chunk (`crc`: of its bytes in the ring). A stream that cannot be
    /// written is dropped (logged); its record then stores the tensor as metadata only.
    pub(crate) fn chunk(&mut self, c: &Chunk, blob: Blob, crc: u32) {
        if crc != c.crc32 {
            self.crc_mismatches += 1;
            warn!(
                stream = c.stream,
                chunk = c.index,
                "chunk bytes do not match the published crc32 ({crc:08x} in the ring, {:08x} published)",
                c.crc32
            );
        }
        if c.index == 0 {
            let name = stream::file_name(self.client, self.pid, c.stream);
            match StreamWriter::create(&self.run, &name, c.total, c.elem) {
                Ok(w) => {
                    if let Some((old, _)) =
                        self.open.insert(c.stream, (w, crc32fast::Hasher::new()))
                    {
                        old.abandon();
                    }
                }
                Err(e) => {
                    warn!(stream = c.stream, "cannot create a stream file: {e}");
                    return;
                }
            }
        }
        let Some((w, hasher)) = self.open.get_mut(&c.stream) else {
            // Its start failed (logged then) or never came.
            return;
        };
        let (raw, stored) = (blob.raw_len, blob.stored.len() as u64);
        if let Err(e) = w.append(c.index, c.offset, &blob) {
            warn!(
                stream = c.stream,
                "writing a stream: {e}; the tensor is lost"
            );
            if let Some((w, _)) = self.open.remove(&c.stream) {
                w.abandon();
            }
            return;
        }
        // The whole tensor's CRC-32 from the chunks' (checked against its record's).
        hasher.combine(&crc32fast::Hasher::new_with_initial_len(crc, raw));
        self.bytes_raw += raw;
        self.bytes_stored += stored;
        if w.is_complete() {
            let Some((w, hasher)) = self.open.remove(&c.stream) else {
                return;
            };
            match w.finish() {
                Ok(reference) => {
                    self.complete.insert(
                        c.stream,
                        Complete {
                            reference,
                            total: c.total,
                            elem: c.elem,
                            crc: hasher.finalize(),
                        },
                    );
                }
                Err(e) => warn!(
                    stream = c.stream,
                    "finishing a stream: {e}; the tensor is lost"
                ),
            }
        }
    }

    /// The producer gave the stream up: its file goes.
    pub(crate) fn abort(&mut self, id: u64) {
        if let Some((w, _)) = self.open.remove(&id) {
            w.abandon();
        }
        if let Some(c) = self.complete.remove(&id) {
            let _ = std::fs::remove_file(self.run.join(&c.reference));
        }
    }

    /// The blobs of a streamed record, one per captured tensor. A tensor whose stream is not
    /// complete (it could not be written) becomes metadata only, logged.
    pub(crate) fn blobs(&mut self, record: &mut Record, refs: &[StreamRef]) -> Vec<Blob> {
        let mut blobs = Vec::with_capacity(refs.len());
        for r in refs {
            let t = &mut record.tensors[r.tensor as usize];
            match self.complete.remove(&r.stream) {
                Some(c) if c.total == t.nbytes => {
                    if c.crc != t.crc32 {
                        self.crc_mismatches += 1;
                        warn!(
                            stream = r.stream,
                            "streamed tensor bytes do not match the record's crc32; kept as published"
                        );
                    }
                    blobs.push(stream::reference_blob(&c.reference, c.total, c.elem));
                }
                other => {
                    warn!(
                        stream = r.stream,
                        api = %record.api,
                        "a streamed tensor is not in the store ({}); kept as metadata only",
                        if other.is_some() { "its size differs" } else { "its stream is incomplete" }
                    );
                    if let Some(c) = other {
                        let _ = std::fs::remove_file(self.run.join(&c.reference));
                    }
                    t.captured = false;
                    t.crc32 = 0;
                }
            }
        }
        blobs
    }

    /// The client is gone: complete streams no record named (it died between its last chunk
    /// and its record) go back to `.part`, so that readers count them as lost; partial ones
    /// stay as they are.
    pub(crate) fn close(self) {
        for c in self.complete.values() {
            let done = self.run.join(&c.reference);
            let mut partial = done.clone().into_os_string();
            partial.push(PARTIAL_SUFFIX);
            let _ = std::fs::rename(&done, partial);
        }
    }
}
