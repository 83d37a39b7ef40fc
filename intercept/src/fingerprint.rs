//! The step rule's evidence of a GEMM operand's bytes (docs/format.md, "Step numbering"): a
//! **fingerprint**, the whole operand when it is at most [`WHOLE_MAX`] bytes, else its packed
//! bytes at [`PIECES`] fixed places of [`PIECE`] bytes spread evenly over it; its CRC-32 and a
//! value sample taken from it. And a **glimpse**: the same pieces, but the whole operand only up
//! to [`GLIMPSE_WHOLE_MAX`] (1 MiB); its CRC-32 alone.
//!
//! Why whole up to 64 MiB: a sample misses updates that touch few elements, and those are
//! common, not exotic: a converged bf16 model trained with a small learning rate changes only
//! the elements whose update is over half an ulp (on an H200, a bf16 MLP under SGD lr 1e-3
//! kept a 4 KiB sample of every 8 MiB weight unchanged for steps on end, and the rule numbered
//! the whole run step 0). Whole evidence costs what the rule cost before fingerprints.
//!
//! Why a glimpse is enough elsewhere: only a GEMM that may recur the anchor asks "did these
//! bytes change since last time?", which needs the fingerprint. Any other GEMM matters to the
//! rule only as a reader of the anchor's operand bytes in another orientation (the backward
//! pass), which asks "are these the very bytes the anchor read?": no update lies between the
//! two reads, and other tensors of the same length differ at 4096 places. Those operands are
//! copied as glimpses: on an H200, the whole 8 MiB operands of a bf16 MLP's backward GEMMs
//! were most of what `--steps` outside the run still copied to the host.
//!
//! Both are functions of the packed bytes only, so they are the same whether the operand was
//! captured whole (the tracer reads the pieces out of the captured bytes) or only its pieces
//! were copied (one pitched device copy, for an op whose record is not stored: prefilter.rs,
//! `--no-inputs`): the steps of a run are numbered alike whatever is selected. Pure
//! arithmetic.

use ttrace_proto::dtype::DType;
use ttrace_proto::tensor::element_f64;

use std::collections::BTreeMap;

use crate::steps::{Sample, SAMPLE_LEN};

/// Pieces of the fingerprint of an operand over [`WHOLE_MAX`].
pub const PIECES: u64 = 4096;
/// Bytes of one piece (a multiple of every element size).
pub const PIECE: u64 = 256;
/// Operands of at most this many bytes are their own fingerprint.
pub const WHOLE_MAX: u64 = 64 << 20;
/// Operands of at most this many bytes (the pieces' own size) are their own glimpse.
pub const GLIMPSE_WHOLE_MAX: u64 = PIECES * PIECE;
/// Piece starts are multiples of this (so that pieces hold whole elements).
const PIECE_ALIGN: u64 = 16;

/// Where an operand's fingerprint lies in its packed bytes: `count` pieces of `width` bytes,
/// `stride` bytes apart from offset 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub stride: u64,
    pub width: u64,
    pub count: u64,
}

impl Layout {
    /// The fingerprint of an operand of `len` packed bytes.
    pub fn of(len: u64) -> Layout {
        Layout::sampled(len, WHOLE_MAX, PIECES, PIECE)
    }

    /// The glimpse of an operand of `len` bytes: its fingerprint's pieces, but whole only up
    /// to [`GLIMPSE_WHOLE_MAX`]. The same as [`Layout::of`] up to that size and over
    /// [`WHOLE_MAX`].
    pub fn glimpse(len: u64) -> Layout {
        Layout::sampled(len, GLIMPSE_WHOLE_MAX, PIECES, PIECE)
    }

    /// The fingerprint of `len` bytes: whole up to `whole_max` (at least `pieces * piece`),
    /// else `pieces` pieces of `piece` bytes spread from start to end.
    fn sampled(len: u64, whole_max: u64, pieces: u64, piece: u64) -> Layout {
        if len <= whole_max.max(pieces * piece) {
            return Layout {
                stride: len,
                width: len,
                count: u64::from(len > 0),
            };
        }
        // The last piece ends at most PIECE_ALIGN - 1 bytes before the end; `stride >= piece`
        // since `len > pieces * piece`.
        let stride = (len - piece) / (pieces - 1) / PIECE_ALIGN * PIECE_ALIGN;
        Layout {
            stride,
            width: piece,
            count: pieces,
        }
    }

    /// Bytes of the fingerprint.
    pub fn bytes(&self) -> u64 {
        self.width * self.count
    }

    /// Copies the fingerprint's bytes out of the operand's packed bytes `packed` (its whole
    /// length); `None` when they are too short.
    pub fn gather(&self, packed: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(self.bytes() as usize);
        for i in 0..self.count {
            let at = (i * self.stride) as usize;
            out.extend_from_slice(packed.get(at..at + self.width as usize)?);
        }
        Some(out)
    }

    /// Copies into `fp` (the fingerprint, [`Layout::bytes`] long) whatever of it lies in the
    /// packed bytes `offset..offset + chunk.len()`: how a tensor streamed in chunks gets its
    /// fingerprint.
    pub fn gather_chunk(&self, fp: &mut [u8], offset: u64, chunk: &[u8]) {
        let end = offset + chunk.len() as u64;
        for i in 0..self.count {
            let (start, stop) = (i * self.stride, i * self.stride + self.width);
            let (from, to) = (start.max(offset), stop.min(end));
            if from >= to {
                continue;
            }
            let dst = (i * self.width + (from - start)) as usize;
            let src = (from - offset) as usize;
            let n = (to - from) as usize;
            if let (Some(d), Some(s)) = (fp.get_mut(dst..dst + n), chunk.get(src..src + n)) {
                d.copy_from_slice(s);
            }
        }
    }
}

/// What the step rule reads of an operand: the CRC-32 of its fingerprint and a sample of the
/// fingerprint's values, or of its glimpse alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evidence {
    /// CRC-32 of the fingerprint (`None`: only the glimpse was copied).
    pub crc: Option<u32>,
    /// CRC-32 of the glimpse (`None`: not computed, the rule cannot read it: an operand
    /// captured whole whose GEMM can neither recur the anchor nor read its bytes).
    pub glimpse: Option<u32>,
    pub sample: Option<Sample>,
}

impl Evidence {
    /// The evidence of a fingerprint `fp` ([`Layout::of`]) of an operand of `len` bytes of
    /// `dtype`, with a sample only when `sampled` (the rule reads samples only of a GEMM that
    /// may recur the anchor: sampling every operand cost the tracer as much as their CRC-32s).
    pub fn read(fp: &[u8], len: u64, dtype: DType, sampled: bool) -> Evidence {
        Evidence::read_glimpsed(fp, dtype, sampled, glimpse_crc(fp, len))
    }

    /// [`Evidence::read`] of a fingerprint whose own glimpse's CRC-32 is known: `glimpse`
    /// ([`glimpse_crc`]).
    pub fn read_glimpsed(fp: &[u8], dtype: DType, sampled: bool, glimpse: Option<u32>) -> Evidence {
        let n = fp.len() / dtype.size().max(1);
        let crc = crc32fast::hash(fp);
        Evidence {
            crc: Some(crc),
            // A fingerprint that is not the glimpse's pieces is the whole operand.
            glimpse: Some(glimpse.unwrap_or(crc)),
            sample: sampled
                .then(|| Sample::take(n, |i| element_f64(dtype, fp, i)))
                .flatten(),
        }
    }

    /// The evidence of a fingerprint of which the rule will read only the glimpse, `glimpse`
    /// its CRC-32 (a GEMM that the rule will not take for a recurrence: steps.rs,
    /// `Steps::needs_fingerprints`): the fingerprint's own CRC-32 is not computed.
    pub fn glimpsed(glimpse: u32) -> Evidence {
        Evidence {
            crc: None,
            glimpse: Some(glimpse),
            sample: None,
        }
    }

    /// The evidence of a glimpse `glimpse` ([`Layout::glimpse`]) alone.
    pub fn of_glimpse(glimpse: &[u8]) -> Evidence {
        Evidence {
            crc: None,
            glimpse: Some(crc32fast::hash(glimpse)),
            sample: None,
        }
    }

    /// The evidence of an operand whose packed bytes `packed` are all at hand; `crc`: their
    /// CRC-32 when the caller computed it already (a captured tensor's). With a sample only
    /// when `sampled` (see [`Evidence::read`]), with the glimpse only when `glimpsed` (its
    /// own 1 MiB gather and CRC-32 for an operand over 1 MiB: not for every GEMM operand of a
    /// full capture, only those the rule can compare).
    pub fn read_packed(
        packed: &[u8],
        dtype: DType,
        crc: Option<u32>,
        sampled: bool,
        glimpsed: bool,
    ) -> Option<Evidence> {
        let len = packed.len() as u64;
        let layout = Layout::of(len);
        if layout.count <= 1 {
            // Its own fingerprint: read in place, its CRC-32 not computed twice. The tracer
            // must keep up with the program, or records it could have dropped get snapshotted.
            let n = packed.len() / dtype.size().max(1);
            let crc = crc.unwrap_or_else(|| crc32fast::hash(packed));
            return Some(Evidence {
                crc: Some(crc),
                glimpse: glimpsed.then(|| glimpse_crc(packed, len).unwrap_or(crc)),
                sample: sampled
                    .then(|| Sample::take(n, |i| element_f64(dtype, packed, i)))
                    .flatten(),
            });
        }
        Some(Evidence::read(&layout.gather(packed)?, len, dtype, sampled))
    }
}

/// The CRC-32 of the glimpse of an operand of `len` bytes whose packed bytes (or fingerprint,
/// the same up to 64 MiB) are `packed`, when it is not the whole operand nor its fingerprint
/// (`None`: it is the CRC-32 of those).
pub fn glimpse_crc(packed: &[u8], len: u64) -> Option<u32> {
    let glimpse = Layout::glimpse(len);
    if glimpse.count <= 1 || glimpse == Layout::of(len) || packed.len() as u64 != len {
        return None;
    }
    glimpse.gather(packed).map(|g| crc32fast::hash(&g))
}

/// A streamed tensor's evidence gathered as its chunks pass, holding only what the evidence
/// reads: an operand that is its own fingerprint keeps the bytes of its sampled elements (its
/// CRC-32 is the stream's, computed anyway) and its glimpse's pieces when that is not the
/// whole operand, a larger one its pieces. Most streamed tensors are never a GEMM operand:
/// holding them whole (up to 64 MiB) would cost a copy each.
pub enum StreamedEvidence {
    /// The bytes (by offset) of the elements `Sample::take` reads, for elements of `elem`
    /// bytes (and for the packed FP4 type, whose element `j` is byte `j / 2`), and the
    /// glimpse's pieces of an operand over [`GLIMPSE_WHOLE_MAX`].
    Sampled {
        total: u64,
        elem: u64,
        bytes: BTreeMap<u64, u8>,
        glimpse: Option<(Layout, Vec<u8>)>,
    },
    /// The pieces of an operand of `total` bytes, over [`WHOLE_MAX`] (its glimpse too).
    Pieces {
        total: u64,
        layout: Layout,
        fp: Vec<u8>,
    },
}

impl StreamedEvidence {
    /// For a tensor of `total` bytes in elements of `elem` bytes.
    pub fn new(total: u64, elem: u64) -> StreamedEvidence {
        let layout = Layout::of(total);
        if layout.count > 1 {
            return StreamedEvidence::Pieces {
                total,
                layout,
                fp: vec![0; layout.bytes() as usize],
            };
        }
        let glimpse = Layout::glimpse(total);
        StreamedEvidence::Sampled {
            total,
            elem: elem.max(1),
            bytes: BTreeMap::new(),
            glimpse: (glimpse.count > 1).then(|| (glimpse, vec![0; glimpse.bytes() as usize])),
        }
    }

    /// Takes what it needs from the chunk `chunk` at byte `offset` of the tensor.
    pub fn chunk(&mut self, offset: u64, chunk: &[u8]) {
        match self {
            StreamedEvidence::Pieces { layout, fp, .. } => layout.gather_chunk(fp, offset, chunk),
            StreamedEvidence::Sampled {
                total,
                elem,
                bytes,
                glimpse,
            } => {
                let end = offset + chunk.len() as u64;
                for j in sampled(*total / *elem) {
                    let j = j as u64;
                    let wanted = (j * *elem..(j + 1) * *elem).chain(std::iter::once(j / 2));
                    for at in wanted.filter(|at| (offset..end).contains(at)) {
                        bytes.insert(at, chunk[(at - offset) as usize]);
                    }
                }
                if let Some((layout, pieces)) = glimpse {
                    layout.gather_chunk(pieces, offset, chunk);
                }
            }
        }
    }

    /// The evidence, `crc` being the whole tensor's CRC-32: the same as
    /// [`Evidence::read_packed`] of the whole tensor.
    pub fn evidence(&self, dtype: DType, crc: u32) -> Evidence {
        match self {
            StreamedEvidence::Pieces { total, fp, .. } => Evidence::read(fp, *total, dtype, true),
            StreamedEvidence::Sampled {
                total,
                bytes,
                glimpse,
                ..
            } => {
                let size = dtype.size().max(1) as u64;
                let element = |j: usize| {
                    let j = j as u64;
                    if dtype == DType::F4_E2M1X2 {
                        return element_f64(dtype, &[*bytes.get(&(j / 2))?], (j % 2) as usize);
                    }
                    let held: Option<Vec<u8>> = (j * size..(j + 1) * size)
                        .map(|at| bytes.get(&at).copied())
                        .collect();
                    element_f64(dtype, &held?, 0)
                };
                Evidence {
                    crc: Some(crc),
                    glimpse: Some(
                        glimpse
                            .as_ref()
                            .map_or(crc, |(_, pieces)| crc32fast::hash(pieces)),
                    ),
                    sample: Sample::take((*total / size) as usize, element),
                }
            }
        }
    }
}

/// The element indices `Sample::take` reads of `n` elements.
fn sampled(n: u64) -> impl Iterator<Item = usize> {
    let n = n as usize;
    let len = n.min(SAMPLE_LEN);
    (0..len).map(move |i| i * n / len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small pieces, so that the sampling is tested on small buffers.
    fn small(len: u64) -> Layout {
        Layout::sampled(len, 4096, 64, 64)
    }

    #[test]
    fn operands_up_to_64_mib_are_their_own_fingerprint() {
        for len in [1000, 8 << 20, WHOLE_MAX] {
            let l = Layout::of(len);
            assert_eq!((l.count, l.width, l.bytes()), (1, len, len));
        }
        let l = Layout::of(1000);
        let bytes: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        assert_eq!(l.gather(&bytes).as_deref(), Some(&bytes[..]));
        assert_eq!(Layout::of(0).bytes(), 0);
    }

    #[test]
    fn a_glimpse_is_the_fingerprint_up_to_1_mib_and_over_64_mib_and_pieces_between() {
        for len in [0, 1000, GLIMPSE_WHOLE_MAX, WHOLE_MAX + 1, (1 << 30) + 6] {
            assert_eq!(Layout::glimpse(len), Layout::of(len), "{len}");
        }
        for len in [GLIMPSE_WHOLE_MAX + 1, 8 << 20, WHOLE_MAX] {
            let g = Layout::glimpse(len);
            assert_eq!((g.count, g.width), (PIECES, PIECE), "{len}");
            assert!(g.stride.is_multiple_of(PIECE_ALIGN) && g.stride >= PIECE);
            assert!((g.count - 1) * g.stride + g.width <= len);
            assert_eq!(Layout::of(len).count, 1);
        }
    }

    /// The glimpse copied alone (a pitched copy of its pieces) has the CRC-32 that the
    /// evidence of the whole operand, or of its fingerprint, gives it; and it tells the
    /// operand's bytes apart at its pieces only, where the fingerprint sees every byte.
    #[test]
    fn a_glimpse_copied_alone_matches_the_one_read_from_the_whole_operand() {
        let len = GLIMPSE_WHOLE_MAX as usize * 3 + 100;
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7919 % 251) as u8).collect();
        let g = Layout::glimpse(len as u64);
        let alone = Evidence::of_glimpse(&g.gather(&bytes).expect("gathered"));
        let whole =
            Evidence::read_packed(&bytes, DType::BF16, None, false, true).expect("evidence");
        assert_eq!(alone.crc, None);
        assert_eq!(alone.glimpse, whole.glimpse);
        assert_ne!(whole.crc, whole.glimpse);
        let fp = Layout::of(len as u64).gather(&bytes).expect("whole");
        assert_eq!(Evidence::read(&fp, len as u64, DType::BF16, false), whole);
        // A byte between the glimpse's pieces: the fingerprint changes, the glimpse does not.
        let mut between = bytes.clone();
        between[(g.width + 1) as usize] ^= 1;
        let other =
            Evidence::read_packed(&between, DType::BF16, None, false, true).expect("evidence");
        assert_ne!(other.crc, whole.crc);
        assert_eq!(other.glimpse, whole.glimpse);
        // A byte inside a piece changes both.
        let mut inside = bytes.clone();
        inside[(7 * g.stride + 3) as usize] ^= 1;
        let other =
            Evidence::read_packed(&inside, DType::BF16, None, false, true).expect("evidence");
        assert_ne!(other.glimpse, whole.glimpse);
        // Up to 1 MiB the glimpse is the whole operand, its CRC-32 the fingerprint's.
        // Not asked for (no GEMM the rule compares it with): not computed.
        let unread = Evidence::read_packed(&bytes, DType::BF16, None, false, false);
        assert_eq!(unread.map(|e| (e.crc, e.glimpse)), Some((whole.crc, None)));
        let small = Evidence::read_packed(&bytes[..1000], DType::BF16, None, false, true);
        assert_eq!(small.map(|e| e.glimpse), small.map(|e| e.crc));
    }

    /// A streamed tensor's evidence, whatever its chunking and type, equals the evidence of
    /// the whole tensor: the step rule numbers a streamed operand as a captured one.
    #[test]
    fn streamed_evidence_equals_the_whole_tensors() {
        let small: Vec<u8> = (0..50_000u32).map(|i| (i * 7919 % 251) as u8).collect();
        // Over 1 MiB: the glimpse's pieces are gathered from the chunks too.
        let large: Vec<u8> = (0..(GLIMPSE_WHOLE_MAX as u32 * 2 + 4))
            .map(|i| (i * 7919 % 251) as u8)
            .collect();
        let cases = [
            (&small, [1000usize, 4093, 50_000]),
            (&large, [65_536, 300_007, large.len()]),
        ];
        for (bytes, chunks) in cases {
            let crc = crc32fast::hash(bytes);
            for dtype in [DType::BF16, DType::F32, DType::F8_E4M3, DType::F4_E2M1X2] {
                for chunk in chunks {
                    let mut s = StreamedEvidence::new(bytes.len() as u64, dtype.size() as u64);
                    for (k, c) in bytes.chunks(chunk).enumerate() {
                        s.chunk((k * chunk) as u64, c);
                    }
                    assert_eq!(
                        Some(s.evidence(dtype, crc)),
                        Evidence::read_packed(bytes, dtype, None, true, true),
                        "{dtype:?} in chunks of {chunk}"
                    );
                }
            }
        }
    }

    #[test]
    fn large_operands_are_sampled_in_aligned_pieces_spread_to_the_end() {
        for len in [WHOLE_MAX + 1, WHOLE_MAX + 20_480, 1 << 28, (1 << 30) + 6] {
            let l = Layout::of(len);
            assert_eq!((l.count, l.width), (PIECES, PIECE));
            assert!(
                l.stride >= PIECE && l.stride.is_multiple_of(PIECE_ALIGN),
                "{len}: {l:?}"
            );
            let last_end = (l.count - 1) * l.stride + l.width;
            assert!(last_end <= len, "{len}: {l:?}");
            // Spread over the whole operand, not bunched at its start.
            assert!(len - last_end < PIECES * PIECE_ALIGN, "{len}: {l:?}");
        }
    }

    /// The same fingerprint from the whole operand and from any chunking of it, and from the
    /// pieces alone: what makes a reduced snapshot's evidence equal a full capture's.
    #[test]
    fn a_fingerprint_is_the_same_however_the_bytes_arrive() {
        let len = 100_000u64;
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7919 % 251) as u8).collect();
        let l = small(len);
        assert_eq!(l.count, 64);
        let whole = l.gather(&bytes).expect("gathered");
        for chunk in [1000usize, 4096, 33_333, 100_000] {
            let mut fp = vec![0u8; l.bytes() as usize];
            for (k, c) in bytes.chunks(chunk).enumerate() {
                l.gather_chunk(&mut fp, (k * chunk) as u64, c);
            }
            assert_eq!(fp, whole, "chunks of {chunk}");
        }
        // What one pitched copy of `count` rows of `width` bytes, `stride` apart, brings.
        let pitched: Vec<u8> = (0..l.count)
            .flat_map(|i| {
                let at = (i * l.stride) as usize;
                bytes[at..at + l.width as usize].to_vec()
            })
            .collect();
        assert_eq!(pitched, whole);
    }

    #[test]
    fn a_change_inside_a_piece_changes_the_evidence_and_one_between_pieces_does_not() {
        let len = 100_000usize;
        let bytes: Vec<u8> = (0..len).map(|i| (i % 200) as u8).collect();
        let l = small(len as u64);
        let evidence =
            |b: &[u8]| Evidence::read(&l.gather(b).expect("gathered"), len as u64, DType::U8, true);
        let before = evidence(&bytes);
        let mut inside = bytes.clone();
        inside[(5 * l.stride + 3) as usize] ^= 1;
        assert_ne!(evidence(&inside), before);
        let mut between = bytes.clone();
        between[(5 * l.stride + l.width + 1) as usize] ^= 1;
        assert_eq!(evidence(&between), before);
        // Up to 64 MiB the evidence is of the whole operand: any changed byte changes it.
        let mut one = bytes.clone();
        one[(5 * l.stride + l.width + 1) as usize] ^= 1;
        assert_ne!(
            Evidence::read_packed(&one, DType::U8, None, true, true),
            Evidence::read_packed(&bytes, DType::U8, None, true, true)
        );
        // Read in place, with the caller's CRC-32: the same evidence as the fingerprint's.
        let whole = Layout::of(bytes.len() as u64);
        assert_eq!(
            Evidence::read_packed(
                &bytes,
                DType::BF16,
                Some(crc32fast::hash(&bytes)),
                true,
                true
            ),
            Some(Evidence::read(
                &whole.gather(&bytes).expect("whole"),
                bytes.len() as u64,
                DType::BF16,
                true
            ))
        );
    }
}
