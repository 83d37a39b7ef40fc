//! Tensor bytes on disk: byte-shuffled by element size, then zstd.
//!
//! Shuffling groups the k-th byte of every element together (all high bytes, then all low
//! bytes, ...). Exponent bytes of neighbouring BF16/FP32 activations are similar, so zstd
//! compresses the shuffled stream far better than the raw one.
//!
//! [`Codec::ShufflePlanes`] (format 1.1) goes one step further: each byte plane is stored on
//! its own, zstd-compressed or raw, whichever a sample of it says. The low (mantissa) bytes of
//! floats are close to random: compressing them costs as much CPU as compressing the exponent
//! plane and saves almost nothing, so they are stored as they are.

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
    /// Shuffled by element size, then each byte plane raw or zstd (format 1.1): see
    /// [`encode_planes`].
    ShufflePlanes = 3,
    /// The bytes are in a stream file of the store, in chunks (format 1.2); the stored bytes
    /// name the file (`streams/NAME.tts`): see [`crate::stream`]. Decoded by the store reader,
    /// which knows the run directory.
    Streamed = 4,
    /// The bytes are those of an earlier blob of the same segment (format 1.3, dedup): the
    /// stored bytes say which (see [`crate::dedup`]). Resolved by the store reader.
    Reference = 5,
    /// The tensor cut into pieces, each a blob of codec 0-3 of its own (format 1.4): see
    /// [`join_pieces`]. The capture daemon compresses the pieces of a large tensor in parallel.
    Pieces = 6,
}

impl Codec {
    /// The codec of a stored code, `None` for one this version does not know.
    pub fn from_u8(v: u8) -> Option<Codec> {
        match v {
            0 => Some(Codec::Raw),
            1 => Some(Codec::Zstd),
            2 => Some(Codec::ShuffleZstd),
            3 => Some(Codec::ShufflePlanes),
            4 => Some(Codec::Streamed),
            5 => Some(Codec::Reference),
            6 => Some(Codec::Pieces),
            _ => None,
        }
    }
}

/// Groups byte `b` of every `elem`-byte element together. A trailing partial element is
/// copied unchanged. 2- and 4-byte elements (BF16/F16 and F32: the bulk of captured bytes)
/// move 16 bytes at a time (SSE2), near memory speed; a byte-at-a-time loop costs as much as
/// the compression that follows.
pub fn shuffle(src: &[u8], elem: usize, dst: &mut Vec<u8>) {
    if elem <= 1 {
        dst.clear();
        dst.extend_from_slice(src);
        return;
    }
    let n = src.len() / elem;
    // Every byte is written below: a reused buffer of the right length (a compression
    // thread's scratch, tensor after tensor of one size) needs no zero fill first.
    if dst.len() != src.len() {
        dst.clear();
        dst.resize(src.len(), 0);
    }
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

/// 2-byte elements: the even bytes, then the odd ones.
fn shuffle2(src: &[u8], planes: &mut [u8], n: usize) {
    let (p0, p1) = planes.split_at_mut(n);
    deinterleave(&src[..2 * n], p0, p1);
}

/// 4-byte elements: split into even and odd bytes (bytes 0 and 2, bytes 1 and 3 of each
/// element), then each of those again, a block at a time through the stack.
fn shuffle4(src: &[u8], planes: &mut [u8], n: usize) {
    const BLOCK: usize = 4096;
    let (p0, r) = planes.split_at_mut(n);
    let (p1, r) = r.split_at_mut(n);
    let (p2, p3) = r.split_at_mut(n);
    let (mut even, mut odd) = ([0u8; 2 * BLOCK], [0u8; 2 * BLOCK]);
    let mut at = 0;
    while at < n {
        let k = BLOCK.min(n - at);
        let (e, o) = (&mut even[..2 * k], &mut odd[..2 * k]);
        deinterleave(&src[4 * at..4 * (at + k)], e, o);
        deinterleave(e, &mut p0[at..at + k], &mut p2[at..at + k]);
        deinterleave(o, &mut p1[at..at + k], &mut p3[at..at + k]);
        at += k;
    }
}

/// Splits `src` into its even bytes (`even`) and its odd bytes (`odd`); `src` is twice as
/// long as each.
fn deinterleave(src: &[u8], even: &mut [u8], odd: &mut [u8]) {
    let k = even.len().min(odd.len()).min(src.len() / 2);
    #[cfg(target_arch = "x86_64")]
    let done = deinterleave_sse2(&src[..2 * k], &mut even[..k], &mut odd[..k]);
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for i in done..k {
        even[i] = src[2 * i];
        odd[i] = src[2 * i + 1];
    }
}

/// [`deinterleave`] 16 output bytes at a time with SSE2 (every x86_64 has it): the shuffle
/// runs near memory speed instead of costing a good part of what compression costs. Returns
/// how many bytes of each output it wrote (a multiple of 16; the caller does the rest).
#[cfg(target_arch = "x86_64")]
fn deinterleave_sse2(src: &[u8], even: &mut [u8], odd: &mut [u8]) -> usize {
    use std::arch::x86_64::{
        __m128i, _mm_and_si128, _mm_loadu_si128, _mm_packus_epi16, _mm_set1_epi16, _mm_srli_epi16,
        _mm_storeu_si128,
    };
    let blocks = even.len().min(odd.len()).min(src.len() / 2) / 16;
    for i in 0..blocks {
        // SAFETY: SSE2 is part of the x86_64 baseline. Block `i` reads `src[32i..32i + 32]`
        // and writes `even[16i..16i + 16]` and `odd[16i..16i + 16]`, all in bounds since
        // `16 * blocks` is at most the length of each output and half that of `src`; the
        // unaligned load and store intrinsics accept any address.
        unsafe {
            let mask = _mm_set1_epi16(0x00ff);
            let a = _mm_loadu_si128(src.as_ptr().add(32 * i) as *const __m128i);
            let b = _mm_loadu_si128(src.as_ptr().add(32 * i + 16) as *const __m128i);
            // Little-endian 16-bit lanes: the low byte is the even one.
            let lo = _mm_packus_epi16(_mm_and_si128(a, mask), _mm_and_si128(b, mask));
            let hi = _mm_packus_epi16(_mm_srli_epi16::<8>(a), _mm_srli_epi16::<8>(b));
            _mm_storeu_si128(even.as_mut_ptr().add(16 * i) as *mut __m128i, lo);
            _mm_storeu_si128(odd.as_mut_ptr().add(16 * i) as *mut __m128i, hi);
        }
    }
    blocks * 16
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
    let planes: Vec<&[u8]> = src[..n * elem].chunks_exact(n.max(1)).take(elem).collect();
    if n > 0 {
        interleave(&planes, 0, &mut dst[..n * elem]);
    }
    dst[n * elem..].copy_from_slice(&src[n * elem..]);
}

/// Puts elements back together from their byte planes (`planes[b]` holds byte `b` of every
/// element) into `out`: as many elements as `out` holds, from element `at` on. The common
/// element sizes get loops the compiler vectorizes (zipped planes, no index arithmetic):
/// reading a store is bound by this and zstd.
fn interleave(planes: &[&[u8]], at: usize, out: &mut [u8]) {
    let n = out.len() / planes.len().max(1);
    let plane = |b: usize| &planes[b][at..at + n];
    match planes.len() {
        1 => out.copy_from_slice(plane(0)),
        2 => {
            for ((o, &a), &b) in out.chunks_exact_mut(2).zip(plane(0)).zip(plane(1)) {
                o.copy_from_slice(&[a, b]);
            }
        }
        4 => {
            for ((((o, &a), &b), &c), &d) in out
                .chunks_exact_mut(4)
                .zip(plane(0))
                .zip(plane(1))
                .zip(plane(2))
                .zip(plane(3))
            {
                o.copy_from_slice(&[a, b, c, d]);
            }
        }
        elem => {
            for b in 0..elem {
                for (o, &v) in out.chunks_exact_mut(elem).zip(plane(b)) {
                    o[b] = v;
                }
            }
        }
    }
}

/// Bytes [`decode_blocks`] hands over at a time, at most: small enough to stay in the
/// first-level cache while the caller reads them (a checksum, then a conversion).
pub const BLOCK_BYTES: usize = 16 << 10;

/// Decodes a blob of codec 0-3 or 6 as [`decode_into`] does, handing its `raw_len` bytes to
/// `sink` in order, a block of at most [`BLOCK_BYTES`] at a time, instead of into one buffer:
/// raw byte planes are read where they are stored and put back together a block at a time,
/// so the whole tensor's bytes never exist at once (only zstd's output, in `scratch`). Blocks
/// hold whole elements except where a piece ([`Codec::Pieces`]) or the blob ends; the sink
/// may have been handed some blocks when an error comes.
pub fn decode_blocks(
    stored: &[u8],
    raw_len: u64,
    elem: usize,
    codec: Codec,
    scratch: &mut Vec<u8>,
    sink: &mut dyn FnMut(&[u8]),
) -> Result<(), FormatError> {
    let mut handed = 0u64;
    let sink = &mut |b: &[u8]| {
        handed += b.len() as u64;
        sink(b);
    };
    let e = elem.max(1);
    match codec {
        Codec::Raw => stored.chunks(BLOCK_BYTES).for_each(sink),
        Codec::Zstd => {
            zstd_bounded(stored, raw_len, scratch)?;
            scratch.chunks(BLOCK_BYTES).for_each(sink);
        }
        Codec::ShuffleZstd => {
            zstd_bounded(stored, raw_len, scratch)?;
            if scratch.len() as u64 != raw_len {
                return Err(FormatError::Corrupt(format!(
                    "blob decodes to {} bytes, header says {raw_len}",
                    scratch.len()
                )));
            }
            let n = scratch.len() / e;
            let (planes, tail) = scratch.split_at(n * e);
            let planes: Vec<&[u8]> = planes.chunks_exact(n.max(1)).take(e).collect();
            interleave_blocks(&planes, n, tail, sink);
        }
        Codec::ShufflePlanes => {
            let (table, tail) = plane_table(stored, raw_len, e)?;
            let n = (raw_len / e as u64) as usize;
            // The compressed planes decoded one after the other; the raw ones read in place.
            scratch.clear();
            let mut ends = Vec::with_capacity(table.len());
            for &(mode, plane) in &table {
                if mode == PLANE_ZSTD {
                    zstd_append(plane, n as u64, scratch)?;
                    if scratch.len() - ends.last().copied().unwrap_or(0) != n {
                        return Err(FormatError::Corrupt(format!(
                            "plane blob: plane decodes to {} bytes, expected {n}",
                            scratch.len() - ends.last().copied().unwrap_or(0)
                        )));
                    }
                    ends.push(scratch.len());
                }
            }
            let mut decoded = scratch.chunks_exact(n.max(1));
            let planes: Vec<&[u8]> = table
                .iter()
                .map(|&(mode, plane)| match mode {
                    PLANE_ZSTD => decoded.next().unwrap_or(&[]),
                    _ => plane,
                })
                .collect();
            interleave_blocks(&planes, n, tail, sink);
        }
        Codec::Pieces => {
            for (codec, raw, bytes) in piece_table(stored, raw_len)? {
                decode_blocks(bytes, raw, elem, codec, scratch, sink)?;
            }
        }
        Codec::Streamed | Codec::Reference => {
            return Err(FormatError::Invalid(format!(
                "a blob of codec {codec:?} is read through its store (reader::RecordView)"
            )))
        }
    }
    if handed != raw_len {
        return Err(FormatError::Corrupt(format!(
            "blob decodes to {handed} bytes, header says {raw_len}"
        )));
    }
    Ok(())
}

/// Hands `n` elements, put together from their byte `planes`, to `sink` a block at a time,
/// then the partial element `tail`.
fn interleave_blocks(planes: &[&[u8]], n: usize, tail: &[u8], sink: &mut dyn FnMut(&[u8])) {
    let mut block = [0u8; BLOCK_BYTES];
    let elem = planes.len().max(1);
    let per_block = (BLOCK_BYTES / elem).max(1);
    let mut at = 0;
    while at < n {
        let k = per_block.min(n - at);
        let out = &mut block[..k * elem];
        interleave(planes, at, out);
        sink(out);
        at += k;
    }
    if !tail.is_empty() {
        sink(tail);
    }
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
        Codec::ShufflePlanes => {
            let mut ctx = zstd::bulk::Compressor::new(level).map_err(FormatError::Io)?;
            let mut out = Vec::new();
            encode_planes(raw, elem, &mut ctx, scratch, &mut out)?;
            Ok(out)
        }
        Codec::Reference => Err(FormatError::Invalid(
            "a reference is made from an earlier blob (dedup::BlobReference)".into(),
        )),
        Codec::Streamed => Err(FormatError::Invalid(
            "a streamed tensor is written chunk by chunk (stream::StreamWriter)".into(),
        )),
        Codec::Pieces => Err(FormatError::Invalid(
            "a blob of pieces is joined from blobs encoded apart (codec::join_pieces)".into(),
        )),
    }
}

/// Bytes of a [`Codec::Pieces`] blob's header: the piece count (`u32`) and 4 zero bytes.
pub const PIECES_HEADER_BYTES: usize = 8;
/// Bytes of one entry of a [`Codec::Pieces`] blob's piece table.
pub const PIECE_ENTRY_BYTES: usize = 24;

/// The stored bytes of a [`Codec::Pieces`] blob made of `pieces`: consecutive parts of one
/// tensor, each `(codec, raw_len, stored bytes)` with a codec of 0-3 and the tensor's element
/// size, encoded apart (so that several threads can compress one large tensor).
///
/// Layout: `count u32`, 4 zero bytes, then per piece `codec u8`, 7 zero bytes, `raw_len u64`,
/// `stored_len u64`, then the pieces' stored bytes in order. The tensor is the pieces' decoded
/// bytes one after the other; a piece's `raw_len` is a whole number of elements except for
/// the last piece's.
pub fn join_pieces(pieces: &[(Codec, u64, &[u8])], out: &mut Vec<u8>) -> Result<(), FormatError> {
    out.clear();
    let count = u32::try_from(pieces.len())
        .map_err(|_| FormatError::Invalid(format!("{} pieces", pieces.len())))?;
    let body: usize = pieces.iter().map(|p| p.2.len()).sum();
    out.reserve(PIECES_HEADER_BYTES + pieces.len() * PIECE_ENTRY_BYTES + body);
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    for &(codec, raw_len, stored) in pieces {
        if !matches!(
            codec,
            Codec::Raw | Codec::Zstd | Codec::ShuffleZstd | Codec::ShufflePlanes
        ) {
            return Err(FormatError::Invalid(format!(
                "a piece cannot have codec {codec:?}"
            )));
        }
        out.push(codec as u8);
        out.extend_from_slice(&[0; 7]);
        out.extend_from_slice(&raw_len.to_le_bytes());
        out.extend_from_slice(&(stored.len() as u64).to_le_bytes());
    }
    for p in pieces {
        out.extend_from_slice(p.2);
    }
    Ok(())
}

/// Decodes a [`Codec::Pieces`] blob of `raw_len` bytes into `out`. Every length is checked
/// against the blob and `raw_len` before anything is allocated from it.
fn decode_pieces(
    stored: &[u8],
    raw_len: u64,
    elem: usize,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<(), FormatError> {
    let pieces = piece_table(stored, raw_len)?;
    out.clear();
    out.reserve_exact(raw_len as usize);
    let mut piece = Vec::new();
    for (codec, raw, bytes) in pieces {
        decode_into(bytes, raw, elem, codec, scratch, &mut piece)?;
        out.extend_from_slice(&piece);
    }
    Ok(())
}

/// One piece of a [`Codec::Pieces`] blob: its codec, raw length and stored bytes.
type Piece<'a> = (Codec, u64, &'a [u8]);

/// One plane of a [`Codec::ShufflePlanes`] blob: its mode and stored bytes.
type Plane<'a> = (u8, &'a [u8]);

/// A [`Codec::Pieces`] blob's pieces, `(codec, raw_len, stored bytes)`, every length checked
/// against the blob and `raw_len`.
fn piece_table(stored: &[u8], raw_len: u64) -> Result<Vec<Piece<'_>>, FormatError> {
    let bad = |why: String| FormatError::Corrupt(format!("blob of pieces: {why}"));
    let head = stored
        .get(..PIECES_HEADER_BYTES)
        .ok_or_else(|| bad(format!("{} bytes cannot hold its header", stored.len())))?;
    let count = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let table_len = count
        .checked_mul(PIECE_ENTRY_BYTES)
        .filter(|&t| t <= stored.len() - PIECES_HEADER_BYTES)
        .ok_or_else(|| bad(format!("a table of {count} pieces runs past the blob")))?;
    let (table, data) = stored[PIECES_HEADER_BYTES..].split_at(table_len);
    let mut pieces = Vec::with_capacity(count);
    let (mut at, mut raw_total) = (0usize, 0u64);
    for (i, entry) in table.chunks_exact(PIECE_ENTRY_BYTES).enumerate() {
        let codec = match Codec::from_u8(entry[0]) {
            Some(c @ (Codec::Raw | Codec::Zstd | Codec::ShuffleZstd | Codec::ShufflePlanes)) => c,
            _ => return Err(bad(format!("piece {i} has codec {}", entry[0]))),
        };
        let raw = u64::from_le_bytes(entry[8..16].try_into().expect("8 bytes"));
        let len = u64::from_le_bytes(entry[16..24].try_into().expect("8 bytes"));
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| at.checked_add(l))
            .filter(|&end| end <= data.len())
            .ok_or_else(|| bad(format!("piece {i} of {len} bytes runs past the blob")))?;
        raw_total = raw_total
            .checked_add(raw)
            .filter(|&t| t <= raw_len)
            .ok_or_else(|| {
                bad(format!(
                    "pieces hold more than the {raw_len} bytes of the blob"
                ))
            })?;
        pieces.push((codec, raw, &data[at..end]));
        at = end;
    }
    if raw_total != raw_len || at != data.len() {
        return Err(bad(format!(
            "pieces hold {raw_total} bytes in {at} stored, the blob {raw_len} in {}",
            data.len()
        )));
    }
    Ok(pieces)
}

/// Bytes of one entry of a [`Codec::ShufflePlanes`] blob's plane table.
pub const PLANE_ENTRY_BYTES: usize = 16;
/// Plane stored as it is.
pub const PLANE_RAW: u8 = 0;
/// Plane stored zstd-compressed (one zstd frame, content size declared).
pub const PLANE_ZSTD: u8 = 1;

/// A plane is compressed only when a sample of it shrinks below this fraction (in 1/64ths:
/// 58/64 = 0.906): saving less is not worth compressing it on the capture path.
const KEEP_64THS: usize = 58;
/// Planes up to this size are compressed whole and kept raw if that did not pay.
const SAMPLE_ALL: usize = 256 << 10;
/// Larger planes are judged by compressing this many pieces of [`SAMPLE_PIECE`] bytes spread
/// over the plane.
const SAMPLE_PIECES: usize = 4;
const SAMPLE_PIECE: usize = 16 << 10;

/// The [`Codec::ShufflePlanes`] encoding of `raw` (elements of `elem` bytes) into `out`
/// (cleared first), compressing with `ctx`; `scratch` holds the shuffled bytes. (At zstd's
/// negative levels literals are stored raw unless the context enables their compression,
/// as the capture daemon's does: without it a float's exponent plane does not shrink.)
///
/// Layout: a table of `elem` entries of [`PLANE_ENTRY_BYTES`] (`mode u8` — [`PLANE_RAW`] or
/// [`PLANE_ZSTD`] — 7 zero bytes, `stored_len u64`), then each plane's stored bytes in plane
/// order (plane `b` holds byte `b` of every element: `raw_len / elem` bytes before encoding),
/// then the trailing partial element (`raw_len % elem` bytes) as it is. An element size of 0
/// counts as 1.
pub fn encode_planes(
    raw: &[u8],
    elem: usize,
    ctx: &mut zstd::bulk::Compressor<'_>,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<(), FormatError> {
    let e = elem.max(1);
    let n = raw.len() / e;
    let src: &[u8] = if e == 1 {
        raw
    } else {
        shuffle(raw, e, scratch);
        scratch
    };
    let bound = zstd::zstd_safe::compress_bound(n);
    out.clear();
    out.reserve(e * PLANE_ENTRY_BYTES + e * bound.max(n) + (raw.len() - n * e));
    out.resize(e * PLANE_ENTRY_BYTES, 0);
    let mut sample = Vec::new();
    for b in 0..e {
        let plane = &src[b * n..(b + 1) * n];
        let start = out.len();
        let mut mode = PLANE_RAW;
        if worth_compressing(ctx, plane, &mut sample)? {
            out.reserve(bound);
            let mut cursor = std::io::Cursor::new(&mut *out);
            cursor.set_position(start as u64);
            let len = ctx
                .compress_to_buffer(plane, &mut cursor)
                .map_err(FormatError::Io)?;
            if len * 64 < plane.len() * KEEP_64THS {
                mode = PLANE_ZSTD;
            } else {
                out.truncate(start);
            }
        }
        if mode == PLANE_RAW {
            out.extend_from_slice(plane);
        }
        let len = (out.len() - start) as u64;
        let entry = &mut out[b * PLANE_ENTRY_BYTES..(b + 1) * PLANE_ENTRY_BYTES];
        entry[0] = mode;
        entry[8..16].copy_from_slice(&len.to_le_bytes());
    }
    out.extend_from_slice(&raw[n * e..]);
    Ok(())
}

/// Whether compressing `plane` looks worth it, from a sample (small planes: always try).
fn worth_compressing(
    ctx: &mut zstd::bulk::Compressor<'_>,
    plane: &[u8],
    buf: &mut Vec<u8>,
) -> Result<bool, FormatError> {
    if plane.len() <= SAMPLE_ALL {
        return Ok(!plane.is_empty());
    }
    let stride = plane.len() / SAMPLE_PIECES;
    let mut stored = 0usize;
    for i in 0..SAMPLE_PIECES {
        let piece = &plane[i * stride..i * stride + SAMPLE_PIECE];
        buf.clear();
        buf.reserve(zstd::zstd_safe::compress_bound(piece.len()));
        stored += ctx
            .compress_to_buffer(piece, &mut *buf)
            .map_err(FormatError::Io)?;
    }
    Ok(stored * 64 < SAMPLE_PIECES * SAMPLE_PIECE * KEEP_64THS)
}

/// Decodes a blob of `raw_len` bytes.
pub fn decode(
    stored: &[u8],
    raw_len: usize,
    elem: usize,
    codec: Codec,
    scratch: &mut Vec<u8>,
) -> Result<Vec<u8>, FormatError> {
    // Through `decode_into`: a crafted header's `raw_len` must not size an allocation.
    let mut out = Vec::new();
    decode_into(stored, raw_len as u64, elem, codec, scratch, &mut out)?;
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
        Codec::ShufflePlanes => {
            decode_planes(stored, raw_len, elem, scratch)?;
            unshuffle(scratch, elem.max(1), out);
        }
        Codec::Streamed => {
            return Err(FormatError::Invalid(
                "a streamed tensor is read through its store (reader::RecordView)".into(),
            ))
        }
        Codec::Reference => {
            return Err(FormatError::Invalid(
                "a reference to another blob is resolved by its segment (reader::RecordView)"
                    .into(),
            ))
        }
        Codec::Pieces => decode_pieces(stored, raw_len, elem, scratch, out)?,
    }
    if out.len() as u64 != raw_len {
        return Err(wrong(out.len() as u64));
    }
    Ok(())
}

/// Decodes a [`Codec::ShufflePlanes`] blob into its shuffled bytes (planes, then the partial
/// element) in `out`. Every length is checked against the blob before anything is allocated
/// from it.
fn decode_planes(
    stored: &[u8],
    raw_len: u64,
    elem: usize,
    out: &mut Vec<u8>,
) -> Result<(), FormatError> {
    let bad = |why: String| FormatError::Corrupt(format!("plane blob: {why}"));
    let e = elem.max(1);
    let n = raw_len / e as u64;
    let (planes, tail) = plane_table(stored, raw_len, e)?;
    out.clear();
    // Room for every plane at once (appending one would otherwise move the ones before it),
    // when the stored bytes can back the claim (each plane is checked again as it decodes).
    let most = zstd_most(stored.len() as u64, e as u64);
    if let Ok(total) = usize::try_from(raw_len).map(|t| t.min(most as usize)) {
        out.reserve(total);
    }
    for (mode, plane) in planes {
        if mode == PLANE_RAW {
            out.extend_from_slice(plane);
        } else {
            // zstd_append refuses a claim the stored bytes cannot back, before allocating;
            // each plane is decoded in place after the ones before it (no copy).
            let before = out.len();
            zstd_append(plane, n, out)?;
            let got = out.len() - before;
            if got as u64 != n {
                return Err(bad(format!("plane decodes to {got} bytes, expected {n}")));
            }
        }
    }
    out.extend_from_slice(tail);
    Ok(())
}

/// A [`Codec::ShufflePlanes`] blob's planes, `(mode, stored bytes)`, and its trailing partial
/// element, every length checked against the blob.
fn plane_table(
    stored: &[u8],
    raw_len: u64,
    e: usize,
) -> Result<(Vec<Plane<'_>>, &[u8]), FormatError> {
    let bad = |why: String| FormatError::Corrupt(format!("plane blob: {why}"));
    let n = raw_len / e as u64;
    let tail = (raw_len % e as u64) as usize;
    let table_len = e * PLANE_ENTRY_BYTES;
    if stored.len() < table_len + tail {
        return Err(bad(format!(
            "{} bytes cannot hold a table of {e} planes",
            stored.len()
        )));
    }
    let (table, data) = stored.split_at(table_len);
    let mut planes = Vec::with_capacity(e);
    let mut at = 0usize;
    for entry in table.chunks_exact(PLANE_ENTRY_BYTES) {
        let len = u64::from_le_bytes(entry[8..16].try_into().expect("8 bytes"));
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| at.checked_add(l))
            .filter(|&end| end <= data.len())
            .ok_or_else(|| bad(format!("plane of {len} bytes runs past the blob")))?;
        let plane = &data[at..end];
        match entry[0] {
            PLANE_RAW if len == n => {}
            PLANE_RAW => return Err(bad(format!("raw plane of {len} bytes, expected {n}"))),
            PLANE_ZSTD => {}
            m => return Err(bad(format!("unknown plane mode {m}"))),
        }
        planes.push((entry[0], plane));
        at = end;
    }
    if data.len() - at != tail {
        return Err(bad(format!(
            "{} bytes after the planes, expected {tail}",
            data.len() - at
        )));
    }
    Ok((planes, &data[at..]))
}

/// The most bytes `stored` bytes of zstd can decode to, in `frames` frames: a block expands at
/// most 128 KiB from 4 bytes (an RLE block), and each frame may hold one more partial block.
fn zstd_most(stored: u64, frames: u64) -> u64 {
    stored
        .saturating_mul(1 << 15)
        .saturating_add(frames.saturating_mul(1 << 17))
}

/// zstd-decodes `stored` into `out`, expecting exactly `raw_len` bytes.
fn zstd_bounded(stored: &[u8], raw_len: u64, out: &mut Vec<u8>) -> Result<(), FormatError> {
    out.clear();
    zstd_append(stored, raw_len, out)
}

/// [`zstd_bounded`] after the bytes `out` holds already (the caller checks how many came).
fn zstd_append(stored: &[u8], raw_len: u64, out: &mut Vec<u8>) -> Result<(), FormatError> {
    use std::io::Read;
    let corrupt = |e: std::io::Error| FormatError::Corrupt(format!("zstd: {e}"));
    // The frame header of a one-shot compression carries the content size: when it does and
    // agrees, decode in one call into an exactly sized buffer (the fast path).
    let declared = zstd::zstd_safe::get_frame_content_size(stored)
        .ok()
        .flatten();
    // A larger claim is a lie, refused before it can size an allocation.
    let most = zstd_most(stored.len() as u64, 1);
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
        // One decompression context per thread: creating one per tensor was a tenth of the
        // time of reading a store.
        thread_local! {
            static DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
                const { std::cell::RefCell::new(None) };
        }
        return DCTX.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.is_none() {
                *slot = Some(zstd::bulk::Decompressor::new().map_err(FormatError::Io)?);
            }
            match slot.as_mut() {
                Some(d) => {
                    let at = out.len() as u64;
                    let mut after = std::io::Cursor::new(&mut *out);
                    after.set_position(at);
                    d.decompress_to_buffer(stored, &mut after)
                        .map(|_| ())
                        .map_err(corrupt)
                }
                None => Err(FormatError::Corrupt(
                    "zstd: no decompression context".into(),
                )),
            }
        });
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
    /// A crafted blob header claiming an enormous decoded size is corruption, not
    /// an allocation of that size.
    #[test]
    fn a_huge_claimed_size_is_not_allocated() {
        let stored = zstd::bulk::compress(&[7u8; 100], 1).expect("compress");
        for codec in [
            Codec::Zstd,
            Codec::ShuffleZstd,
            Codec::ShufflePlanes,
            Codec::Raw,
        ] {
            let r = decode(&stored, 1 << 50, 2, codec, &mut Vec::new());
            assert!(r.is_err(), "{codec:?}");
        }
    }

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

    /// The definition: byte `b` of element `i` goes to `b * n + i`.
    fn shuffle_bytewise(src: &[u8], elem: usize) -> Vec<u8> {
        if elem <= 1 {
            return src.to_vec();
        }
        let n = src.len() / elem;
        let mut out = Vec::with_capacity(src.len());
        for b in 0..elem {
            out.extend(src[..n * elem].iter().skip(b).step_by(elem));
        }
        out.extend_from_slice(&src[n * elem..]);
        out
    }

    #[test]
    fn the_fast_shuffle_matches_the_definition() {
        let src: Vec<u8> = (0..70_003u32).map(|i| (i * 7 + i / 3) as u8).collect();
        for elem in 1..=9 {
            for len in [
                0, 1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 64, 127, 128, 129, 999, 1000, 16_384,
                16_387, 32_768, 70_003,
            ] {
                let mut fast = Vec::new();
                shuffle(&src[..len], elem, &mut fast);
                assert_eq!(
                    fast,
                    shuffle_bytewise(&src[..len], elem),
                    "elem {elem} len {len}"
                );
            }
        }
    }

    #[test]
    fn every_codec_round_trips() {
        let raw: Vec<u8> = (0..4096u32)
            .flat_map(|i| ((i % 97) as f32).to_le_bytes())
            .collect();
        let mut scratch = Vec::new();
        for codec in [
            Codec::Raw,
            Codec::Zstd,
            Codec::ShuffleZstd,
            Codec::ShufflePlanes,
        ] {
            let stored = encode(&raw, 4, codec, 3, &mut scratch).expect("encodes");
            let back = decode(&stored, raw.len(), 4, codec, &mut scratch).expect("decodes");
            assert_eq!(back, raw, "{codec:?}");
        }
    }

    #[test]
    fn decode_into_matches_decode_and_bounds_lies() {
        let raw: Vec<u8> = (0..3001u32).map(|i| (i % 251) as u8).collect();
        let (mut scratch, mut out) = (Vec::new(), Vec::new());
        for codec in [
            Codec::Raw,
            Codec::Zstd,
            Codec::ShuffleZstd,
            Codec::ShufflePlanes,
        ] {
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

    /// BF16-like values: a few distinct high (sign + exponent) bytes, random low bytes.
    fn bf16_like(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                [(x >> 24) as u8, 0x3c + (x >> 60) as u8 % 3]
            })
            .collect()
    }

    fn plane_modes(stored: &[u8], elem: usize) -> Vec<u8> {
        stored[..elem * PLANE_ENTRY_BYTES]
            .chunks_exact(PLANE_ENTRY_BYTES)
            .map(|e| e[0])
            .collect()
    }

    #[test]
    fn planes_keep_random_bytes_raw_and_compress_the_rest() {
        let mut ctx = zstd::bulk::Compressor::new(1).expect("context");
        let (mut scratch, mut out, mut back) = (Vec::new(), Vec::new(), Vec::new());
        // Small (compressed whole, then judged) and large (judged by samples) tensors.
        for n in [5000, 400_000] {
            let raw = bf16_like(n, 7);
            encode_planes(&raw, 2, &mut ctx, &mut scratch, &mut out).expect("encodes");
            assert_eq!(plane_modes(&out, 2), vec![PLANE_RAW, PLANE_ZSTD], "n {n}");
            assert!(out.len() < raw.len() * 7 / 10, "n {n}: {} bytes", out.len());
            decode_into(
                &out,
                raw.len() as u64,
                2,
                Codec::ShufflePlanes,
                &mut scratch,
                &mut back,
            )
            .expect("decodes");
            assert_eq!(back, raw, "n {n}");
        }
    }

    #[test]
    fn planes_round_trip_every_element_size_and_tail() {
        let mut ctx = zstd::bulk::Compressor::new(1).expect("context");
        let (mut scratch, mut out, mut back) = (Vec::new(), Vec::new(), Vec::new());
        let mixed: Vec<u8> = bf16_like(150_000, 3)
            .iter()
            .enumerate()
            .map(|(i, &b)| if i % 3 == 0 { 0 } else { b })
            .collect();
        for elem in 0..=9 {
            for len in [0, 1, 2, 3, 17, 1000, 1001, 299_999, 300_000] {
                let raw = &mixed[..len];
                encode_planes(raw, elem, &mut ctx, &mut scratch, &mut out).expect("encodes");
                decode_into(
                    &out,
                    len as u64,
                    elem,
                    Codec::ShufflePlanes,
                    &mut scratch,
                    &mut back,
                )
                .expect("decodes");
                assert_eq!(back, raw, "elem {elem} len {len}");
            }
        }
    }

    #[test]
    fn damaged_plane_blobs_are_reported() {
        let mut ctx = zstd::bulk::Compressor::new(1).expect("context");
        let (mut scratch, mut out) = (Vec::new(), Vec::new());
        let raw = bf16_like(3001, 5);
        let mut good = Vec::new();
        encode_planes(&raw[..6001], 2, &mut ctx, &mut scratch, &mut good).expect("encodes");
        let len = 6001u64;
        let decode = |stored: &[u8], raw_len: u64, out: &mut Vec<u8>| {
            decode_into(
                stored,
                raw_len,
                2,
                Codec::ShufflePlanes,
                &mut Vec::new(),
                out,
            )
        };
        decode(&good, len, &mut out).expect("the intact blob decodes");
        for lie in [0, len - 1, len + 1, len + 2, u64::MAX] {
            assert!(decode(&good, lie, &mut out).is_err(), "raw_len {lie}");
        }
        assert!(decode(&good[..20], len, &mut out).is_err(), "short table");
        assert!(
            decode(&good[..good.len() - 1], len, &mut out).is_err(),
            "cut tail"
        );
        let mut bad_mode = good.clone();
        bad_mode[0] = 7;
        assert!(decode(&bad_mode, len, &mut out).is_err(), "unknown mode");
        let mut bad_len = good.clone();
        bad_len[8] ^= 1;
        assert!(decode(&bad_len, len, &mut out).is_err(), "plane length");
        let mut huge = good.clone();
        huge[PLANE_ENTRY_BYTES + 8..PLANE_ENTRY_BYTES + 16]
            .copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&huge, len, &mut out).is_err(), "huge plane");
        let mut flipped = good.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0x55;
        let r = decode(&flipped, len, &mut out);
        assert!(
            r.is_err() || out != raw[..6001],
            "a damaged zstd plane went unnoticed"
        );
    }

    /// A large tensor compressed as pieces (by several threads) reads back as the tensor,
    /// whatever codec each piece got.
    #[test]
    fn a_blob_of_pieces_decodes_to_the_tensor() {
        let raw: Vec<u8> = (0..30_001u32).map(|i| (i * 7 / 13) as u8).collect();
        let elem = 2;
        let mut ctx = zstd::bulk::Compressor::new(1).expect("context");
        let cuts = [0usize, 10_000, 20_000, raw.len()];
        let mut stored = Vec::new();
        for (k, w) in cuts.windows(2).enumerate() {
            let part = &raw[w[0]..w[1]];
            let mut bytes = Vec::new();
            let codec = match k {
                0 => {
                    bytes.extend_from_slice(part);
                    Codec::Raw
                }
                1 => {
                    encode_planes(part, elem, &mut ctx, &mut Vec::new(), &mut bytes)
                        .expect("planes");
                    Codec::ShufflePlanes
                }
                _ => {
                    bytes = zstd::bulk::compress(part, 1).expect("zstd");
                    Codec::Zstd
                }
            };
            stored.push((codec, part.len() as u64, bytes));
        }
        let pieces: Vec<(Codec, u64, &[u8])> =
            stored.iter().map(|p| (p.0, p.1, &p.2[..])).collect();
        let mut blob = Vec::new();
        join_pieces(&pieces, &mut blob).expect("joins");
        let back = decode(&blob, raw.len(), elem, Codec::Pieces, &mut Vec::new()).expect("reads");
        assert_eq!(back, raw);
    }

    /// `stored` decoded by [`decode_blocks`]: the bytes handed over, and each block's length.
    fn by_blocks(
        stored: &[u8],
        raw_len: u64,
        elem: usize,
        codec: Codec,
    ) -> Result<(Vec<u8>, Vec<usize>), FormatError> {
        let (mut bytes, mut lens) = (Vec::new(), Vec::new());
        decode_blocks(
            stored,
            raw_len,
            elem,
            codec,
            &mut Vec::new(),
            &mut |b: &[u8]| {
                bytes.extend_from_slice(b);
                lens.push(b.len());
            },
        )?;
        Ok((bytes, lens))
    }

    /// Blocks carry the bytes decode_into gives, in order, in cache-sized blocks of whole
    /// elements (the partial element of the blob comes last, alone), for every codec, element
    /// size and length; a length that lies is refused as decode_into refuses it.
    #[test]
    fn blocks_hand_over_the_bytes_decode_into_gives() {
        let mut ctx = zstd::bulk::Compressor::new(1).expect("context");
        let mixed: Vec<u8> = bf16_like(40_000, 9)
            .iter()
            .enumerate()
            .map(|(i, &b)| if i % 5 == 0 { 0 } else { b })
            .collect();
        let (mut scratch, mut whole) = (Vec::new(), Vec::new());
        for elem in 0..=9 {
            for len in [
                0,
                1,
                3,
                1000,
                1001,
                BLOCK_BYTES - 1,
                BLOCK_BYTES * 2 + 7,
                80_000,
            ] {
                let raw = &mixed[..len];
                let e = elem.max(1);
                for codec in [
                    Codec::Raw,
                    Codec::Zstd,
                    Codec::ShuffleZstd,
                    Codec::ShufflePlanes,
                ] {
                    let stored = match codec {
                        Codec::ShufflePlanes => {
                            let mut out = Vec::new();
                            encode_planes(raw, elem, &mut ctx, &mut scratch, &mut out)
                                .expect("encodes");
                            out
                        }
                        _ => encode(raw, e, codec, 1, &mut scratch).expect("encodes"),
                    };
                    let what = format!("{codec:?} elem {elem} len {len}");
                    decode_into(&stored, len as u64, e, codec, &mut scratch, &mut whole)
                        .expect("decodes");
                    let (bytes, lens) = by_blocks(&stored, len as u64, e, codec).expect(&what);
                    assert_eq!(bytes, whole, "{what}");
                    assert!(lens.iter().all(|&l| l <= BLOCK_BYTES), "{what}");
                    let shuffled = matches!(codec, Codec::ShuffleZstd | Codec::ShufflePlanes);
                    if shuffled && len >= e {
                        let (last, body) = lens.split_last().expect("blocks");
                        let tail = len % e;
                        assert!(body.iter().all(|l| l % e == 0), "{what}: {lens:?}");
                        assert!(tail == 0 || *last == tail, "{what}: {lens:?}");
                    }
                    for lie in [len as u64 + 1, len as u64 + e as u64, u64::MAX] {
                        assert!(
                            by_blocks(&stored, lie, e, codec).is_err(),
                            "{what}: raw_len {lie} accepted"
                        );
                    }
                    if len > 0 {
                        assert!(
                            by_blocks(&stored, len as u64 - 1, e, codec).is_err(),
                            "{what}: a shorter raw_len accepted"
                        );
                    }
                }
            }
        }
        // Pieces of different codecs, one after the other.
        let raw = &mixed[..50_001];
        let mut parts = Vec::new();
        for (k, w) in [0usize, 20_000, 40_000, raw.len()].windows(2).enumerate() {
            let part = &raw[w[0]..w[1]];
            let codec = [Codec::ShufflePlanes, Codec::Raw, Codec::ShuffleZstd][k];
            let bytes = match codec {
                Codec::ShufflePlanes => {
                    let mut out = Vec::new();
                    encode_planes(part, 2, &mut ctx, &mut scratch, &mut out).expect("planes");
                    out
                }
                _ => encode(part, 2, codec, 1, &mut scratch).expect("encodes"),
            };
            parts.push((codec, part.len() as u64, bytes));
        }
        let pieces: Vec<(Codec, u64, &[u8])> = parts.iter().map(|p| (p.0, p.1, &p.2[..])).collect();
        let mut blob = Vec::new();
        join_pieces(&pieces, &mut blob).expect("joins");
        let (bytes, _) = by_blocks(&blob, raw.len() as u64, 2, Codec::Pieces).expect("reads");
        assert_eq!(bytes, raw);
        assert!(by_blocks(&blob, raw.len() as u64 + 1, 2, Codec::Pieces).is_err());
        assert!(by_blocks(b"x", 1, 1, Codec::Streamed).is_err());
    }

    /// A damaged piece table is corruption, named as such, never a panic or a huge allocation.
    #[test]
    fn a_damaged_blob_of_pieces_is_reported() {
        let part = [5u8; 64];
        let mut blob = Vec::new();
        join_pieces(
            &[(Codec::Raw, 64, &part), (Codec::Raw, 64, &part)],
            &mut blob,
        )
        .expect("joins");
        let read = |b: &[u8], raw: usize| decode(b, raw, 1, Codec::Pieces, &mut Vec::new());
        assert_eq!(read(&blob, 128).expect("intact"), vec![5u8; 128]);
        let mut cases: Vec<(Vec<u8>, usize, &str)> = vec![
            (blob[..4].to_vec(), 128, "header"),
            (blob.clone(), 127, "more than"),
            (blob.clone(), 129, "pieces hold 128"),
            (blob[..blob.len() - 1].to_vec(), 128, "runs past"),
        ];
        let mut huge = blob.clone();
        huge[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        cases.push((huge, 128, "table of"));
        let mut nested = blob.clone();
        nested[PIECES_HEADER_BYTES] = Codec::Pieces as u8;
        cases.push((nested, 128, "codec 6"));
        let mut long = blob.clone();
        long[PIECES_HEADER_BYTES + 8..PIECES_HEADER_BYTES + 16]
            .copy_from_slice(&u64::MAX.to_le_bytes());
        cases.push((long, 128, "more than"));
        for (bytes, raw, why) in cases {
            match read(&bytes, raw) {
                Err(FormatError::Corrupt(m)) => assert!(m.contains(why), "{why}: {m}"),
                other => panic!("{why}: {other:?}"),
            }
        }
        assert!(join_pieces(&[(Codec::Streamed, 1, &[0u8][..])], &mut blob).is_err());
    }
}
