//! Tensor bytes on disk: byte-shuffled by element size, then zstd.
//!
//! Shuffling groups the k-th byte of every element together (all high bytes, then all low
//! bytes, ...). Exponent bytes of neighbouring BF16/FP32 activations are similar, so zstd
//! compresses the shuffled stream far better than the raw one.

use crate::FormatError;

/// How a blob's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Codec {
    /// As captured.
    Raw = 0,
    /// zstd of the raw bytes.
    Zstd = 1,
    /// zstd of the bytes shuffled by element size.
    ShuffleZstd = 2,
}

impl Codec {
    pub fn from_u8(v: u8) -> Option<Codec> {
        match v {
            0 => Some(Codec::Raw),
            1 => Some(Codec::Zstd),
            2 => Some(Codec::ShuffleZstd),
            _ => None,
        }
    }
}

/// Groups byte `b` of every `elem`-byte element together. A trailing partial element is
/// copied unchanged.
pub fn shuffle(src: &[u8], elem: usize, dst: &mut Vec<u8>) {
    dst.clear();
    dst.reserve(src.len());
    if elem <= 1 {
        dst.extend_from_slice(src);
        return;
    }
    let n = src.len() / elem;
    for b in 0..elem {
        dst.extend(src[..n * elem].iter().skip(b).step_by(elem));
    }
    dst.extend_from_slice(&src[n * elem..]);
}

/// Inverse of [`shuffle`].
pub fn unshuffle(src: &[u8], elem: usize, dst: &mut Vec<u8>) {
    dst.clear();
    if elem <= 1 {
        dst.extend_from_slice(src);
        return;
    }
    let n = src.len() / elem;
    dst.resize(src.len(), 0);
    // The common element sizes get loops the compiler vectorizes (zipped planes, no index
    // arithmetic): reading a store is bound by this and zstd.
    match elem {
        2 => {
            let (p0, p1) = src[..2 * n].split_at(n);
            for ((o, &a), &b) in dst.chunks_exact_mut(2).zip(p0).zip(p1) {
                o.copy_from_slice(&[a, b]);
            }
        }
        4 => {
            let (p01, p23) = src[..4 * n].split_at(2 * n);
            let (p0, p1) = p01.split_at(n);
            let (p2, p3) = p23.split_at(n);
            for ((((o, &a), &b), &c), &d) in dst.chunks_exact_mut(4).zip(p0).zip(p1).zip(p2).zip(p3)
            {
                o.copy_from_slice(&[a, b, c, d]);
            }
        }
        _ => {
            for b in 0..elem {
                let plane = &src[b * n..(b + 1) * n];
                for (o, &v) in dst.chunks_exact_mut(elem).zip(plane) {
                    o[b] = v;
                }
            }
        }
    }
    dst[n * elem..].copy_from_slice(&src[n * elem..]);
}

/// Encodes `raw` with `codec` at zstd `level`; `scratch` is reused between calls.
pub fn encode(
    raw: &[u8],
    elem: usize,
    codec: Codec,
    level: i32,
    scratch: &mut Vec<u8>,
) -> Result<Vec<u8>, FormatError> {
    match codec {
        Codec::Raw => Ok(raw.to_vec()),
        Codec::Zstd => zstd::bulk::compress(raw, level).map_err(FormatError::Io),
        Codec::ShuffleZstd => {
            shuffle(raw, elem, scratch);
            zstd::bulk::compress(scratch, level).map_err(FormatError::Io)
        }
    }
}

/// Decodes a blob of `raw_len` bytes.
pub fn decode(
    stored: &[u8],
    raw_len: usize,
    elem: usize,
    codec: Codec,
    scratch: &mut Vec<u8>,
) -> Result<Vec<u8>, FormatError> {
    let out = match codec {
        Codec::Raw => stored.to_vec(),
        Codec::Zstd => zstd::bulk::decompress(stored, raw_len).map_err(FormatError::Io)?,
        Codec::ShuffleZstd => {
            *scratch = zstd::bulk::decompress(stored, raw_len).map_err(FormatError::Io)?;
            let mut out = Vec::new();
            unshuffle(scratch, elem, &mut out);
            out
        }
    };
    if out.len() != raw_len {
        return Err(FormatError::Corrupt(format!(
            "blob decodes to {} bytes, header says {raw_len}",
            out.len()
        )));
    }
    Ok(out)
}

/// Decodes a blob of `raw_len` bytes into `out` (cleared first), reusing `scratch` and
/// `out`'s capacity between calls. Safe on untrusted input: the decoded size is bounded by
/// `raw_len` (a frame header's claim is never used to allocate more than the data yields), and
/// any other length is reported as corruption.
pub fn decode_into(
    stored: &[u8],
    raw_len: u64,
    elem: usize,
    codec: Codec,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<(), FormatError> {
    let wrong = |got: u64| {
        FormatError::Corrupt(format!(
            "blob decodes to {got} bytes, header says {raw_len}"
        ))
    };
    out.clear();
    match codec {
        Codec::Raw => {
            if stored.len() as u64 != raw_len {
                return Err(wrong(stored.len() as u64));
            }
            out.extend_from_slice(stored);
        }
        Codec::Zstd => zstd_bounded(stored, raw_len, out)?,
        Codec::ShuffleZstd => {
            zstd_bounded(stored, raw_len, scratch)?;
            unshuffle(scratch, elem, out);
        }
    }
    if out.len() as u64 != raw_len {
        return Err(wrong(out.len() as u64));
    }
    Ok(())
}

/// zstd-decodes `stored` into `out`, expecting exactly `raw_len` bytes.
fn zstd_bounded(stored: &[u8], raw_len: u64, out: &mut Vec<u8>) -> Result<(), FormatError> {
    use std::io::Read;
    out.clear();
    let corrupt = |e: std::io::Error| FormatError::Corrupt(format!("zstd: {e}"));
    // The frame header of a one-shot compression carries the content size: when it does and
    // agrees, decode in one call into an exactly sized buffer (the fast path).
    let declared = zstd::zstd_safe::get_frame_content_size(stored)
        .ok()
        .flatten();
    // A zstd block expands at most 128 KiB from 4 bytes (an RLE block): a larger claim is a
    // lie, refused before it can size an allocation.
    let most = (stored.len() as u64)
        .saturating_mul(1 << 15)
        .saturating_add(1 << 17);
    if raw_len > most {
        return Err(FormatError::Corrupt(format!(
            "blob claims {raw_len} bytes from {} stored",
            stored.len()
        )));
    }
    if declared == Some(raw_len) {
        let n = usize::try_from(raw_len)
            .map_err(|_| FormatError::Corrupt(format!("blob of {raw_len} bytes")))?;
        out.reserve_exact(n);
        let mut d = zstd::bulk::Decompressor::new().map_err(FormatError::Io)?;
        d.decompress_to_buffer(stored, out).map_err(corrupt)?;
        return Ok(());
    }
    // Otherwise stream, never reading past one byte more than promised.
    let dec = zstd::stream::read::Decoder::with_buffer(stored).map_err(corrupt)?;
    dec.take(raw_len.saturating_add(1))
        .read_to_end(out)
        .map_err(corrupt)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffle_round_trips_with_a_partial_tail() {
        let src: Vec<u8> = (0..23).collect();
        for elem in [1, 2, 4, 8] {
            let (mut s, mut u) = (Vec::new(), Vec::new());
            shuffle(&src, elem, &mut s);
            unshuffle(&s, elem, &mut u);
            assert_eq!(u, src, "elem {elem}");
        }
        let mut s = Vec::new();
        shuffle(&[1, 2, 3, 4], 2, &mut s);
        assert_eq!(s, vec![1, 3, 2, 4]);
    }

    #[test]
    fn every_codec_round_trips() {
        let raw: Vec<u8> = (0..4096u32)
            .flat_map(|i| ((i % 97) as f32).to_le_bytes())
            .collect();
        let mut scratch = Vec::new();
        for codec in [Codec::Raw, Codec::Zstd, Codec::ShuffleZstd] {
            let stored = encode(&raw, 4, codec, 3, &mut scratch).expect("encodes");
            let back = decode(&stored, raw.len(), 4, codec, &mut scratch).expect("decodes");
            assert_eq!(back, raw, "{codec:?}");
        }
    }

    #[test]
    fn decode_into_matches_decode_and_bounds_lies() {
        let raw: Vec<u8> = (0..3001u32).map(|i| (i % 251) as u8).collect();
        let (mut scratch, mut out) = (Vec::new(), Vec::new());
        for codec in [Codec::Raw, Codec::Zstd, Codec::ShuffleZstd] {
            let stored = encode(&raw, 2, codec, 3, &mut scratch).expect("encodes");
            decode_into(&stored, raw.len() as u64, 2, codec, &mut scratch, &mut out)
                .expect("decodes");
            assert_eq!(out, raw, "{codec:?}");
            for lie in [0, raw.len() as u64 - 1, raw.len() as u64 + 1, u64::MAX] {
                assert!(
                    decode_into(&stored, lie, 2, codec, &mut scratch, &mut out).is_err(),
                    "{codec:?} accepted raw_len {lie}"
                );
            }
        }
        assert!(decode_into(b"not zstd", 8, 1, Codec::Zstd, &mut scratch, &mut out).is_err());
    }

    #[test]
    fn a_wrong_length_is_reported_not_trusted() {
        let mut scratch = Vec::new();
        let stored = encode(&[1, 2, 3, 4], 1, Codec::Zstd, 1, &mut scratch).expect("encodes");
        assert!(decode(&stored, 5, 1, Codec::Zstd, &mut scratch).is_err());
    }
}
