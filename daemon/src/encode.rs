//! How the daemon turns a tensor's bytes into a stored blob: the format's byte shuffle, then
//! each byte plane zstd-compressed or stored raw (`Codec::ShufflePlanes`; `Codec::Raw` at
//! level 0; `Blob::encode` makes `Codec::ShuffleZstd` blobs, which every reader reads too), with
//! these choices for speed:
//!
//! * each compression thread keeps one zstd context, configured once, instead of creating
//!   one per tensor;
//! * literals are always entropy-coded, also at zstd's negative ("fast") levels. Float
//!   activations compress through Huffman coding of their shuffled exponent bytes, not through
//!   matches, so a strongly negative level (which mostly skips the match search) with
//!   Huffman-coded literals keeps the ratio of level 1 at about twice its speed; see
//!   [`crate::DEFAULT_LEVEL`] and scripts/bench-capture.sh;
//! * the shuffle is `ttrace_format::codec::shuffle`, which moves words, not bytes, for 2- and
//!   4-byte elements;
//! * byte planes that do not compress (the mantissa bytes of floats, close to random) are
//!   stored as they are, judged from a sample, instead of costing as much CPU as the exponent
//!   plane for a 1% gain.

use std::sync::Arc;

use ttrace_format::codec::Codec;
use ttrace_format::store::Blob;
use ttrace_format::FormatError;
use zstd::zstd_safe::{CParameter, ParamSwitch};

use crate::pool::Spare;

/// A compression thread's reusable state: makes blobs at one zstd level.
pub struct Encoder {
    level: i32,
    ctx: Option<zstd::bulk::Compressor<'static>>,
    scratch: Vec<u8>,
    /// Where blob buffers come from, when the daemon recycles them.
    spare: Option<Arc<Spare>>,
}

impl Encoder {
    /// An encoder for zstd `level` (0: store raw).
    pub fn new(level: i32) -> Encoder {
        Encoder {
            level,
            ctx: None,
            scratch: Vec::new(),
            spare: None,
        }
    }

    /// Takes the buffers of new blobs from `spare`.
    pub(crate) fn with_spare(mut self, spare: Arc<Spare>) -> Encoder {
        self.spare = Some(spare);
        self
    }

    fn ctx(&mut self) -> Result<&mut zstd::bulk::Compressor<'static>, FormatError> {
        if self.ctx.is_none() {
            let mut c = zstd::bulk::Compressor::new(self.level).map_err(FormatError::Io)?;
            c.set_parameter(CParameter::LiteralCompressionMode(ParamSwitch::Enable))
                .map_err(FormatError::Io)?;
            self.ctx = Some(c);
        }
        self.ctx
            .as_mut()
            .ok_or_else(|| FormatError::Invalid("no zstd context".into()))
    }

    /// Hands a spent blob buffer back for reuse (when the daemon recycles them).
    pub(crate) fn recycle(&self, buf: Vec<u8>) {
        if let Some(s) = &self.spare {
            s.give(buf);
        }
    }

    /// The blob of `raw`, whose elements are `elem` bytes wide.
    pub fn encode(&mut self, raw: &[u8], elem: usize) -> Result<Blob, FormatError> {
        let mut stored = self.spare.as_ref().map(|s| s.take()).unwrap_or_default();
        if self.level == 0 {
            return Ok(raw_blob(raw, elem, stored));
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let done =
            ttrace_format::codec::encode_planes(raw, elem, self.ctx()?, &mut scratch, &mut stored);
        // Do not keep a huge tensor's worth of scratch forever.
        if scratch.capacity() <= 64 << 20 {
            self.scratch = scratch;
        }
        done?;
        if stored.len() >= raw.len() {
            // A tiny tensor (or incompressible bytes): the plane table alone would make it
            // larger than it is.
            stored.clear();
            return Ok(raw_blob(raw, elem, stored));
        }
        Ok(Blob {
            codec: Codec::ShufflePlanes,
            elem_size: elem as u8,
            raw_len: raw.len() as u64,
            stored,
        })
    }
}

/// `raw` stored as it is (`Codec::Raw`), appended to `stored`.
fn raw_blob(raw: &[u8], elem: usize, mut stored: Vec<u8>) -> Blob {
    stored.extend_from_slice(raw);
    Blob {
        codec: Codec::Raw,
        elem_size: elem as u8,
        raw_len: raw.len() as u64,
        stored,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_decode_with_the_formats_codec() {
        let raw: Vec<u8> = (0..50_000u32)
            .flat_map(|i| half_like(i).to_le_bytes())
            .collect();
        for level in [0, 1, 3, -100] {
            let mut e = Encoder::new(level);
            for elem in [1, 2, 4] {
                let blob = e.encode(&raw, elem).expect("encodes");
                let back = ttrace_format::codec::decode(
                    &blob.stored,
                    raw.len(),
                    elem,
                    blob.codec,
                    &mut Vec::new(),
                )
                .expect("decodes");
                assert_eq!(back, raw, "level {level} elem {elem}");
                if level != 0 {
                    assert!(blob.stored.len() < raw.len(), "compresses at level {level}");
                    assert_eq!(blob.codec, Codec::ShufflePlanes);
                }
            }
        }
    }

    /// A tiny tensor is never stored larger than its bytes.
    #[test]
    fn tiny_tensors_are_not_stored_larger_than_raw() {
        let mut e = Encoder::new(crate::DEFAULT_LEVEL);
        for n in [0usize, 1, 2, 4, 8, 30, 64] {
            let raw: Vec<u8> = (0..n as u32).map(|i| (i * 37 + 11) as u8).collect();
            let blob = e.encode(&raw, 2).expect("encodes");
            assert!(
                blob.stored.len() <= raw.len(),
                "{n} bytes stored as {}",
                blob.stored.len()
            );
            let back =
                ttrace_format::codec::decode(&blob.stored, n, 2, blob.codec, &mut Vec::new())
                    .expect("decodes");
            assert_eq!(back, raw);
        }
    }

    #[test]
    fn random_mantissa_bytes_are_stored_raw() {
        // Activations: random low (mantissa) bytes, a few distinct high bytes.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let raw: Vec<u8> = (0..300_000)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                [(x >> 24) as u8, 0x3c + (x >> 60) as u8 % 4]
            })
            .collect();
        let blob = Encoder::new(crate::DEFAULT_LEVEL)
            .encode(&raw, 2)
            .expect("encodes");
        let modes: Vec<u8> = blob.stored[..2 * ttrace_format::codec::PLANE_ENTRY_BYTES]
            .chunks_exact(ttrace_format::codec::PLANE_ENTRY_BYTES)
            .map(|e| e[0])
            .collect();
        assert_eq!(
            modes,
            [
                ttrace_format::codec::PLANE_RAW,
                ttrace_format::codec::PLANE_ZSTD
            ]
        );
        // 2 bits per high byte: about 0.5 + 0.125 of the raw size.
        assert!(blob.stored.len() < raw.len() * 2 / 3);
    }

    fn half_like(i: u32) -> u16 {
        let x = i.wrapping_mul(2_654_435_761);
        (0x3c00 | (x >> 22) & 0x3ff) as u16 ^ ((x & 1) << 15) as u16
    }
}
