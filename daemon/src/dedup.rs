//! Identical tensor bytes stored once per segment (format 1.3, docs/format.md "Codec 5").
//!
//! A segment's [`Seen`] remembers every blob written into it by length, CRC-32 and BLAKE3
//! digest of the ring bytes (computed by the compression job, which has them). A later tensor
//! with the same length and CRC-32 is a candidate; only an equal digest makes it a duplicate
//! (CRC-32 alone collides far too easily to decide that bytes are equal). The duplicate's blob
//! is replaced by a reference to the earlier one before the record is written.

use std::collections::HashMap;

use ttrace_format::codec::Codec;
use ttrace_format::dedup::{BlobReference, REFERENCE_BYTES};
use ttrace_format::record::Record;
use ttrace_format::store::Blob;

/// BLAKE3 digest of a tensor's bytes; of a tensor compressed in pieces, the BLAKE3 digest
/// of its pieces' digests (`pieces::TensorJob::join`: equal bytes, equal digests).
pub(crate) type Digest = [u8; 32];

/// Tensors smaller than this are not hashed: their reference would save next to nothing.
pub(crate) const MIN_DEDUP_BYTES: usize = 256;

/// The digest of `bytes`, when worth deduplicating (as `pieces::encode` + `join` make it for
/// a tensor of one piece).
#[cfg(test)]
pub(crate) fn digest(bytes: &[u8]) -> Option<Digest> {
    (bytes.len() >= MIN_DEDUP_BYTES).then(|| *blake3::hash(bytes).as_bytes())
}

/// The blobs written into one segment, by (CRC-32, length).
#[derive(Default)]
pub(crate) struct Seen {
    by_key: HashMap<(u32, u64), Vec<(Digest, BlobReference)>>,
}

/// What [`Seen::dedup`] changed in a record, to be confirmed once its frame is written.
pub(crate) struct Deduped {
    /// The record's blobs not seen before: remembered by [`Seen::keep`].
    fresh: Vec<((u32, u64), Digest, BlobReference)>,
    /// Raw bytes replaced by references.
    pub(crate) bytes: u64,
}

impl Seen {
    /// Replaces each blob of `record` whose bytes were stored before in the segment (or in
    /// this record) by a reference to them. `digests[i]` is blob `i`'s digest (`None`: not to
    /// be deduplicated); `offset` is where the record's frame will start.
    pub(crate) fn dedup(
        &self,
        record: &Record,
        offset: u64,
        blobs: &mut [Blob],
        digests: &[Option<Digest>],
    ) -> Deduped {
        let mut out = Deduped {
            fresh: Vec::new(),
            bytes: 0,
        };
        let captured = record
            .tensors
            .iter()
            .enumerate()
            .filter(|(_, t)| t.captured);
        for ((blob, digest), (tensor, t)) in blobs.iter_mut().zip(digests).zip(captured) {
            let Some(digest) = digest else { continue };
            if matches!(blob.codec, Codec::Streamed | Codec::Reference) || blob.raw_len != t.nbytes
            {
                continue;
            }
            let key = (t.crc32, blob.raw_len);
            let earlier = self
                .by_key
                .get(&key)
                .into_iter()
                .flatten()
                .map(|(d, r)| (d, r))
                .chain(
                    out.fresh
                        .iter()
                        .filter(|f| f.0 == key)
                        .map(|f| (&f.1, &f.2)),
                )
                .find(|(d, _)| *d == digest)
                .map(|(_, r)| *r);
            match earlier {
                // A repeat's job did not compress it: its reference is all there is.
                Some(r)
                    if blob.stored.len() > REFERENCE_BYTES || crate::pieces::is_repeat(blob) =>
                {
                    *blob = r.to_blob(blob.elem_size, blob.raw_len);
                    out.bytes += t.nbytes;
                }
                Some(_) => {}
                None => out.fresh.push((
                    key,
                    *digest,
                    BlobReference {
                        seq: record.seq,
                        offset,
                        tensor: tensor as u32,
                    },
                )),
            }
        }
        out
    }

    /// Remembers the blobs of a record whose frame was written.
    pub(crate) fn keep(&mut self, d: Deduped) {
        for (key, digest, r) in d.fresh {
            self.by_key.entry(key).or_default().push((digest, r));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(bytes: &[u8]) -> Blob {
        Blob {
            codec: Codec::Raw,
            elem_size: 1,
            raw_len: bytes.len() as u64,
            stored: bytes.to_vec(),
        }
    }

    #[test]
    fn equal_bytes_become_references_and_equal_crcs_alone_do_not() {
        let w: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut seen = Seen::default();
        let r0 = Record::d2h_copy(0, 0, 0, &w);
        let mut b0 = [blob(&w)];
        let d0 = seen.dedup(&r0, 64, &mut b0, &[digest(&w)]);
        assert_eq!(d0.bytes, 0);
        seen.keep(d0);
        // The same bytes again: a reference to seq 0 at offset 64.
        let r1 = Record::d2h_copy(0, 0, 1, &w);
        let mut b1 = [blob(&w)];
        let d1 = seen.dedup(&r1, 9000, &mut b1, &[digest(&w)]);
        assert_eq!(d1.bytes, w.len() as u64);
        assert_eq!(b1[0].codec, Codec::Reference);
        let r = BlobReference::parse(&b1[0].stored).expect("a reference");
        assert_eq!((r.seq, r.offset, r.tensor), (0, 64, 0));
        // Same length and CRC-32 but other bytes (a forged collision): stored, not referenced.
        let other: Vec<u8> = w.iter().map(|b| b ^ 1).collect();
        let mut r2 = Record::d2h_copy(0, 0, 2, &other);
        r2.tensors[0].crc32 = r0.tensors[0].crc32;
        let mut b2 = [blob(&other)];
        let d2 = seen.dedup(&r2, 20000, &mut b2, &[digest(&other)]);
        assert_eq!(d2.bytes, 0);
        assert_eq!(b2[0].codec, Codec::Raw);
    }

    #[test]
    fn a_repeat_its_job_did_not_compress_becomes_a_reference_even_when_tiny() {
        // Zeros compress below the size of a reference; a repeat has no bytes to keep.
        let w = vec![0u8; 4096];
        let mut seen = Seen::default();
        let r0 = Record::d2h_copy(0, 0, 0, &w);
        let small = Blob {
            codec: Codec::ShufflePlanes,
            elem_size: 1,
            raw_len: w.len() as u64,
            stored: vec![0; 8],
        };
        let d0 = seen.dedup(&r0, 64, &mut [small], &[digest(&w)]);
        seen.keep(d0);
        let r1 = Record::d2h_copy(0, 0, 1, &w);
        let mut b1 = [crate::pieces::repeat_blob(w.len() as u64, 1)];
        let d1 = seen.dedup(&r1, 9000, &mut b1, &[digest(&w)]);
        assert_eq!(b1[0].codec, Codec::Reference);
        assert_eq!(d1.bytes, w.len() as u64);
        // Bytes the segment does not hold stay a repeat: the writer compresses them.
        let other = vec![1u8; 4096];
        let r2 = Record::d2h_copy(0, 0, 2, &other);
        let mut b2 = [crate::pieces::repeat_blob(other.len() as u64, 1)];
        seen.dedup(&r2, 20000, &mut b2, &[digest(&other)]);
        assert!(crate::pieces::is_repeat(&b2[0]));
    }
}
