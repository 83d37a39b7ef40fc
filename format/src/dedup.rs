//! Tensor bytes stored once per segment (format 1.3): a blob of [`Codec::Reference`] says
//! "the same bytes as tensor T of the record with seq Q at offset O of this segment".
//!
//! The collector writes one when a tensor's bytes equal those of a blob it already wrote into
//! the same (rank, step) segment (same length and CRC-32, confirmed by a BLAKE3 digest of the
//! bytes). Readers resolve it through the segment ([`crate::reader::RecordView`]) and check the
//! bytes they return against the *referencing* record's CRC-32, so a damaged or missing
//! referenced blob makes the referencing tensor bad, never wrong.

use crate::codec::Codec;
use crate::store::Blob;
use crate::FormatError;

/// Stored bytes of a reference blob.
pub const REFERENCE_BYTES: usize = 24;

/// Where a referenced blob is: a tensor of an earlier record of the same segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobReference {
    /// The referenced record's seq.
    pub seq: u64,
    /// Offset of the referenced record's frame in the segment (a hint: a segment rewritten by
    /// a reopen or a repair may have moved it; the seq then finds it).
    pub offset: u64,
    /// Index of the referenced tensor in that record's `tensors`.
    pub tensor: u32,
}

impl BlobReference {
    /// The blob that stands for a tensor of `raw_len` bytes, `elem` bytes per element.
    pub fn to_blob(&self, elem: u8, raw_len: u64) -> Blob {
        let mut stored = Vec::with_capacity(REFERENCE_BYTES);
        stored.extend_from_slice(&self.seq.to_le_bytes());
        stored.extend_from_slice(&self.offset.to_le_bytes());
        stored.extend_from_slice(&self.tensor.to_le_bytes());
        stored.extend_from_slice(&[0; 4]);
        Blob {
            codec: Codec::Reference,
            elem_size: elem,
            raw_len,
            stored,
        }
    }

    /// Reads a reference blob's stored bytes.
    pub fn parse(stored: &[u8]) -> Result<BlobReference, FormatError> {
        if stored.len() != REFERENCE_BYTES {
            return Err(FormatError::Corrupt(format!(
                "a reference blob of {} bytes (it has {REFERENCE_BYTES})",
                stored.len()
            )));
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&stored[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let mut t = [0u8; 4];
        t.copy_from_slice(&stored[16..20]);
        Ok(BlobReference {
            seq: u64_at(0),
            offset: u64_at(8),
            tensor: u32::from_le_bytes(t),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_round_trips_through_its_blob() {
        let r = BlobReference {
            seq: 7,
            offset: 4096,
            tensor: 2,
        };
        let b = r.to_blob(2, 1 << 20);
        assert_eq!(b.codec, Codec::Reference);
        assert_eq!(b.stored.len(), REFERENCE_BYTES);
        assert_eq!(BlobReference::parse(&b.stored).expect("parses"), r);
        assert!(BlobReference::parse(&b.stored[..20]).is_err());
    }
}
