//! How the daemon turns a tensor's bytes into a stored blob: the format's byte shuffle and
//! zstd (`Codec::ShuffleZstd`, or `Codec::Zstd` for 1-byte elements, `Codec::Raw` at level 0)
//! — the same blobs `Blob::encode` makes — with three changes for speed, none for readers:
//!
//! * each compression thread keeps one zstd context, configured once, instead of creating
//!   one per tensor;
//! * literals are always entropy-coded, also at zstd's negative ("fast") levels. Float
//!   activations compress through Huffman coding of their shuffled exponent bytes, not through
//!   matches, so a strongly negative level (which mostly skips the match search) with
//!   Huffman-coded literals keeps the ratio of level 1 at about twice its speed; see
//!   [`crate::DEFAULT_LEVEL`] and scripts/bench-capture.sh;
//! * the shuffle moves words, not bytes, for 2- and 4-byte elements (output identical to
//!   `ttrace_format::codec::shuffle`, which a test checks).

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
                shuffle(raw, elem, &mut scratch);
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

/// `ttrace_format::codec::shuffle`, with word-at-a-time paths for 2- and 4-byte elements
/// (BF16/F16 and F32: the bulk of captured bytes) that run near memory speed, where the
/// byte-at-a-time loop spends as long as the compression itself.
pub(crate) fn shuffle(src: &[u8], elem: usize, dst: &mut Vec<u8>) {
    dst.clear();
    if elem <= 1 {
        dst.extend_from_slice(src);
        return;
    }
    let n = src.len() / elem;
    dst.resize(src.len(), 0);
    let (planes, tail) = dst.split_at_mut(n * elem);
    match elem {
        2 => shuffle2(&src[..2 * n], planes, n),
        4 => shuffle4(&src[..4 * n], planes, n),
        _ => {
            for (i, e) in src[..n * elem].chunks_exact(elem).enumerate() {
                for (b, &v) in e.iter().enumerate() {
                    planes[b * n + i] = v;
                }
            }
        }
    }
    tail.copy_from_slice(&src[n * elem..]);
}

/// 2-byte elements: four at a time from one little-endian `u64`.
fn shuffle2(src: &[u8], planes: &mut [u8], n: usize) {
    let (p0, p1) = planes.split_at_mut(n);
    let words = src.chunks_exact(8);
    let rest = n - words.len() * 4;
    for ((w, a), b) in words
        .zip(p0.chunks_exact_mut(4))
        .zip(p1.chunks_exact_mut(4))
    {
        let Some(w) = w.first_chunk::<8>() else {
            continue;
        };
        let x = u64::from_le_bytes(*w);
        // Gather bytes 0, 2, 4, 6 (and 1, 3, 5, 7 from x >> 8) into the low 32 bits.
        let gather = |x: u64| {
            (x & 0xff) | (x >> 8 & 0xff00) | (x >> 16 & 0xff_0000) | (x >> 24 & 0xff00_0000)
        };
        a.copy_from_slice(&(gather(x) as u32).to_le_bytes());
        b.copy_from_slice(&(gather(x >> 8) as u32).to_le_bytes());
    }
    for i in n - rest..n {
        p0[i] = src[2 * i];
        p1[i] = src[2 * i + 1];
    }
}

/// 4-byte elements: two at a time from one little-endian `u64`.
fn shuffle4(src: &[u8], planes: &mut [u8], n: usize) {
    let (p0, r) = planes.split_at_mut(n);
    let (p1, r) = r.split_at_mut(n);
    let (p2, p3) = r.split_at_mut(n);
    let words = src.chunks_exact(8);
    let rest = n - words.len() * 2;
    for ((((w, a), b), c), d) in words
        .zip(p0.chunks_exact_mut(2))
        .zip(p1.chunks_exact_mut(2))
        .zip(p2.chunks_exact_mut(2))
        .zip(p3.chunks_exact_mut(2))
    {
        let Some(w) = w.first_chunk::<8>() else {
            continue;
        };
        a.copy_from_slice(&[w[0], w[4]]);
        b.copy_from_slice(&[w[1], w[5]]);
        c.copy_from_slice(&[w[2], w[6]]);
        d.copy_from_slice(&[w[3], w[7]]);
    }
    for i in n - rest..n {
        p0[i] = src[4 * i];
        p1[i] = src[4 * i + 1];
        p2[i] = src[4 * i + 2];
        p3[i] = src[4 * i + 3];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_shuffle_matches_the_formats() {
        let src: Vec<u8> = (0..1000u32).map(|i| (i * 7 + i / 3) as u8).collect();
        for elem in 1..=9 {
            for len in [
                0, 1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 64, 127, 128, 129, 999, 1000,
            ] {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                shuffle(&src[..len], elem, &mut a);
                ttrace_format::codec::shuffle(&src[..len], elem, &mut b);
                assert_eq!(a, b, "elem {elem} len {len}");
            }
        }
    }

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
