//! How the daemon turns a tensor's bytes into a stored blob: the format's byte shuffle and
//! zstd (`Codec::ShuffleZstd`, or `Codec::Zstd` for 1-byte elements, `Codec::Raw` at level 0)
//! — the same blobs `Blob::encode` makes — with two changes for speed, none for readers:
//!
//! * each compression thread keeps one zstd context, configured once, instead of creating
//!   one per tensor;
//! * literals are always entropy-coded, also at zstd's negative ("fast") levels. Float
//!   activations compress through Huffman coding of their shuffled exponent bytes, not through
//!   matches, so a strongly negative level (which mostly skips the match search) with
//!   Huffman-coded literals keeps the ratio of level 1 at about twice its speed; see
//!   [`crate::DEFAULT_LEVEL`] and scripts/bench-capture.sh;
//! * the shuffle is `ttrace_format::codec::shuffle`, which moves words, not bytes, for 2- and
//!   4-byte elements.

use ttrace_format::codec::Codec;
use ttrace_format::store::Blob;
use ttrace_format::FormatError;
use zstd::zstd_safe::{CParameter, ParamSwitch};

/// A compression thread's reusable state: makes blobs at one zstd level.
pub struct Encoder {
    level: i32,
    ctx: Option<zstd::bulk::Compressor<'static>>,
    scratch: Vec<u8>,
}

impl Encoder {
    /// An encoder for zstd `level` (0: store raw).
    pub fn new(level: i32) -> Encoder {
        Encoder {
            level,
            ctx: None,
            scratch: Vec::new(),
        }
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

    /// The blob of `raw`, whose elements are `elem` bytes wide.
    pub fn encode(&mut self, raw: &[u8], elem: usize) -> Result<Blob, FormatError> {
        let codec = if self.level == 0 {
            Codec::Raw
        } else if elem > 1 {
            Codec::ShuffleZstd
        } else {
            Codec::Zstd
        };
        let stored = match codec {
            Codec::Raw => raw.to_vec(),
            Codec::Zstd => self.ctx()?.compress(raw).map_err(FormatError::Io)?,
            Codec::ShuffleZstd => {
                let mut scratch = std::mem::take(&mut self.scratch);
                ttrace_format::codec::shuffle(raw, elem, &mut scratch);
                let out = self.ctx()?.compress(&scratch).map_err(FormatError::Io);
                self.scratch = scratch;
                out?
            }
        };
        // Do not keep a huge tensor's worth of scratch forever.
        if self.scratch.capacity() > 64 << 20 {
            self.scratch = Vec::new();
        }
        Ok(Blob {
            codec,
            elem_size: elem as u8,
            raw_len: raw.len() as u64,
            stored,
        })
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
                }
            }
        }
    }

    fn half_like(i: u32) -> u16 {
        let x = i.wrapping_mul(2_654_435_761);
        (0x3c00 | (x >> 22) & 0x3ff) as u16 ^ ((x & 1) << 15) as u16
    }
}
