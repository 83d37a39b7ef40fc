//! The step rule's evidence of a GEMM operand's bytes (docs/format.md, "Step numbering"): a
//! **fingerprint**, the whole operand when it is at most [`WHOLE_MAX`] bytes, else its packed
//! bytes at [`PIECES`] fixed places of [`PIECE`] bytes spread evenly over it; its CRC-32 and a
//! value sample taken from it.
//!
//! Why whole up to 64 MiB: a sample misses updates that touch few elements, and those are
//! common, not exotic: a converged bf16 model trained with a small learning rate changes only
//! the elements whose update is over half an ulp (on an H200, a bf16 MLP under SGD lr 1e-3
//! kept a 4 KiB sample of every 8 MiB weight unchanged for steps on end, and the rule numbered
//! the whole run step 0). Whole evidence costs what the rule cost before fingerprints.
//!
//! The fingerprint is a function of the packed bytes only, so it is the same whether the
//! operand was captured whole (the tracer reads the pieces out of the captured bytes) or only
//! its pieces were copied (one pitched device copy, for an op whose record is not stored:
//! prefilter.rs, `--no-inputs`): the steps of a run are numbered alike whatever is selected.
//! Pure arithmetic.

use ttrace_proto::dtype::DType;
use ttrace_proto::tensor::element_f64;

use crate::steps::Sample;

/// Pieces of the fingerprint of an operand over [`WHOLE_MAX`].
pub const PIECES: u64 = 4096;
/// Bytes of one piece (a multiple of every element size).
pub const PIECE: u64 = 256;
/// Operands of at most this many bytes are their own fingerprint.
pub const WHOLE_MAX: u64 = 64 << 20;
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
/// fingerprint's values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evidence {
    pub crc: u32,
    pub sample: Option<Sample>,
}

impl Evidence {
    /// The evidence of a fingerprint `fp` of elements of `dtype`.
    pub fn of(fp: &[u8], dtype: DType) -> Evidence {
        let n = fp.len() / dtype.size().max(1);
        Evidence {
            crc: crc32fast::hash(fp),
            sample: Sample::take(n, |i| element_f64(dtype, fp, i)),
        }
    }

    /// The evidence of an operand whose packed bytes `packed` are all at hand; `crc`: their
    /// CRC-32 when the caller computed it already (a captured tensor's).
    pub fn of_packed(packed: &[u8], dtype: DType, crc: Option<u32>) -> Option<Evidence> {
        let layout = Layout::of(packed.len() as u64);
        if layout.count <= 1 {
            // Its own fingerprint: read in place, its CRC-32 not computed twice. The tracer
            // must keep up with the program, or records it could have dropped get snapshotted.
            let n = packed.len() / dtype.size().max(1);
            return Some(Evidence {
                crc: crc.unwrap_or_else(|| crc32fast::hash(packed)),
                sample: Sample::take(n, |i| element_f64(dtype, packed, i)),
            });
        }
        Some(Evidence::of(&layout.gather(packed)?, dtype))
    }
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
        let evidence = |b: &[u8]| Evidence::of(&l.gather(b).expect("gathered"), DType::U8);
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
            Evidence::of_packed(&one, DType::U8, None),
            Evidence::of_packed(&bytes, DType::U8, None)
        );
        // Read in place, with the caller's CRC-32: the same evidence as the fingerprint's.
        let whole = Layout::of(bytes.len() as u64);
        assert_eq!(
            Evidence::of_packed(&bytes, DType::BF16, Some(crc32fast::hash(&bytes))),
            Some(Evidence::of(
                &whole.gather(&bytes).expect("whole"),
                DType::BF16
            ))
        );
    }
}
