//! One tensor's compression, in pieces: a tensor larger than [`PIECE_BYTES`] is cut into
//! pieces that the pool's threads compress at the same time, and joined into one blob of
//! [`Codec::Pieces`] once all are done.
//!
//! Why: a record's ring slot is released only when all its tensors are stored. Compressed
//! whole, a record of three 32 MiB tensors kept three threads busy and the others idle while
//! its slot (and with a 256 MiB ring, most of the ring) stayed taken: on a real GPU the
//! capture rate was bound by that, not by the number of threads (scripts/gpu-bench.sh). In pieces
//! the same record is spread over every compression thread.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use ttrace_format::codec::{self, Codec};
use ttrace_format::store::Blob;

use crate::dedup::{self, Digest};
use crate::encode::Encoder;
use crate::handoff::{oneshot, OnceReceiver, OnceSender};

/// Tensors are cut into pieces of this many bytes (the last one shorter). Large enough that
/// the per-piece costs (a zstd frame, a table entry, a job) are negligible, small enough that
/// a 32 MiB tensor keeps 8 threads busy.
pub const PIECE_BYTES: u64 = 4 << 20;

/// What compressing one tensor (or one piece of it) produced.
pub(crate) struct Encoded {
    pub(crate) blob: Blob,
    /// CRC-32 of the bytes in the ring.
    pub(crate) crc: u32,
    /// Their BLAKE3 digest, when the job deduplicates (module `dedup`).
    pub(crate) digest: Option<Digest>,
}

/// The pieces of a tensor of `nbytes` bytes with elements of `elem` bytes, at most `piece`
/// bytes each (0: one piece): `(offset, len)` in the tensor, each a whole number of elements
/// except the last.
pub(crate) fn cut(nbytes: u64, elem: usize, piece: u64) -> Vec<(u64, u64)> {
    let elem = (elem.max(1)) as u64;
    let size = (piece / elem).max(1) * elem;
    if piece == 0 || nbytes <= size {
        return vec![(0, nbytes)];
    }
    (0..nbytes.div_ceil(size))
        .map(|i| (i * size, size.min(nbytes - i * size)))
        .collect()
}

/// Compresses `bytes` (a whole tensor or a piece of one).
pub(crate) fn encode(bytes: &[u8], elem: usize, enc: &mut Encoder, with_digest: bool) -> Encoded {
    Encoded {
        blob: compress(bytes, elem, enc),
        crc: crc32fast::hash(bytes),
        digest: with_digest.then(|| *blake3::hash(bytes).as_bytes()),
    }
}

/// The blob of `bytes`, raw when compression fails.
fn compress(bytes: &[u8], elem: usize, enc: &mut Encoder) -> Blob {
    enc.encode(bytes, elem).unwrap_or_else(|e| {
        tracing::warn!("compression failed ({e}); storing the tensor raw");
        raw_blob(bytes, elem)
    })
}

/// Segments (rank, step) a client's [`Compressed`] remembers: a client writes one step at a
/// time, a few when it carries several ranks.
const RECENT_SEGMENTS: usize = 8;

/// The digests of the whole tensors a client's jobs compressed, for its most recent segments
/// (rank, step). A tensor whose digest is there repeats bytes its segment is about to hold,
/// and the segment's dedup (module `dedup`) will store it as a reference: its job hashes it
/// and does not compress it (36% of the bytes of a small trainer's step are such repeats: a
/// weight read by several GEMMs). It hands in a [`repeat_blob`] instead, which the writer
/// turns into a reference or, where the segment does not hold the bytes after all (their
/// record failed its CRC-32 check, was lost, or is later in the segment: jobs run in
/// parallel), compresses after all (`SegRef::append`).
#[derive(Default)]
pub(crate) struct Compressed {
    recent: Mutex<VecDeque<SegmentDigests>>,
}

/// The digests compressed for one segment.
struct SegmentDigests {
    /// (rank, step).
    key: (u32, u64),
    digests: HashSet<Digest>,
}

impl Compressed {
    /// Whether `digest` was compressed before for the segment `key`; remembers it if not.
    fn seen_before(&self, key: (u32, u64), digest: Digest) -> bool {
        let mut recent = self.recent.lock();
        if let Some(seg) = recent.iter_mut().find(|s| s.key == key) {
            return !seg.digests.insert(digest);
        }
        if recent.len() >= RECENT_SEGMENTS {
            recent.pop_front();
        }
        recent.push_back(SegmentDigests {
            key,
            digests: HashSet::from([digest]),
        });
        false
    }
}

/// Compresses a whole tensor for the segment `key` unless its bytes were compressed for that
/// segment before ([`Compressed`]): then its blob is a [`repeat_blob`].
pub(crate) fn encode_once(
    bytes: &[u8],
    elem: usize,
    enc: &mut Encoder,
    compressed: &Compressed,
    key: (u32, u64),
) -> Encoded {
    if bytes.len() < dedup::MIN_DEDUP_BYTES {
        return encode(bytes, elem, enc, true);
    }
    let digest = *blake3::hash(bytes).as_bytes();
    let blob = if compressed.seen_before(key, digest) {
        repeat_blob(bytes.len() as u64, elem)
    } else {
        compress(bytes, elem, enc)
    };
    Encoded {
        blob,
        crc: crc32fast::hash(bytes),
        digest: Some(digest),
    }
}

/// The blob of a tensor of `len` bytes its job did not compress ([`Compressed`]): raw with no
/// bytes, which no real blob of `len > 0` bytes is. It never reaches a file.
pub(crate) fn repeat_blob(len: u64, elem: usize) -> Blob {
    Blob {
        codec: Codec::Raw,
        elem_size: elem as u8,
        raw_len: len,
        stored: Vec::new(),
    }
}

/// Whether `blob` is a [`repeat_blob`].
pub(crate) fn is_repeat(blob: &Blob) -> bool {
    blob.codec == Codec::Raw && blob.stored.is_empty() && blob.raw_len > 0
}

/// `bytes` stored as they are.
pub(crate) fn raw_blob(bytes: &[u8], elem: usize) -> Blob {
    Blob {
        codec: Codec::Raw,
        elem_size: elem as u8,
        raw_len: bytes.len() as u64,
        stored: bytes.to_vec(),
    }
}

/// A tensor being compressed in pieces: each piece's job hands its result in with
/// [`PieceSet::done`], and the job that hands in the last one joins them (on the pool, not on
/// the writer's thread: joining copies the stored bytes) and sends the tensor's result. When
/// a job is lost (a worker panicked) or the pieces cannot be joined, the set is dropped
/// unsent and the receiver sees the channel closed: the writer then stores the tensor's bytes
/// raw from the ring (client.rs), so nothing is lost either way.
pub(crate) struct PieceSet {
    /// Per piece: its offset and length in the tensor.
    pub(crate) pieces: Vec<(u64, u64)>,
    elem: usize,
    /// Whether the pieces carry digests (the tensor is deduplicated).
    dedup: bool,
    results: Mutex<Vec<Option<Encoded>>>,
    left: AtomicUsize,
    tx: OnceSender<Encoded>,
}

impl PieceSet {
    /// The set of `pieces` (from [`cut`]) of a tensor, and where its joined result arrives.
    pub(crate) fn new(
        pieces: Vec<(u64, u64)>,
        elem: usize,
        dedup: bool,
    ) -> (Arc<PieceSet>, OnceReceiver<Encoded>) {
        let (tx, rx) = oneshot();
        let n = pieces.len();
        let set = PieceSet {
            pieces,
            elem,
            dedup,
            results: Mutex::new((0..n).map(|_| None).collect()),
            left: AtomicUsize::new(n),
            tx,
        };
        (Arc::new(set), rx)
    }

    /// Hands in piece `i`'s result; the last one in joins all and sends the tensor's.
    /// Spent piece buffers go to `recycle`.
    pub(crate) fn done(&self, i: usize, e: Encoded, recycle: impl FnMut(Vec<u8>)) {
        self.results.lock()[i] = Some(e);
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let done: Vec<(u64, Encoded)> = std::mem::take(&mut *self.results.lock())
            .into_iter()
            .zip(&self.pieces)
            .filter_map(|(e, &(_, len))| e.map(|e| (len, e)))
            .collect();
        match join(done, self.elem, self.dedup, recycle) {
            Ok(e) => self.tx.send(e),
            Err(e) => tracing::warn!("cannot join a tensor's pieces ({e}); storing it raw"),
        }
    }
}

/// The tensor's blob, CRC-32 and digest from its pieces' (in order). Fails only for a
/// piece of a codec a blob of pieces cannot hold (`Encoder` makes none).
fn join(
    mut done: Vec<(u64, Encoded)>,
    elem: usize,
    dedup: bool,
    mut recycle: impl FnMut(Vec<u8>),
) -> Result<Encoded, ttrace_format::FormatError> {
    if done.len() == 1 {
        let (len, mut e) = done.pop().expect("one piece");
        // A tensor of one piece deduplicates by the digest of its bytes.
        e.digest = e.digest.filter(|_| len as usize >= dedup::MIN_DEDUP_BYTES);
        return Ok(e);
    }
    let mut crc = crc32fast::Hasher::new();
    let mut digests = blake3::Hasher::new();
    for (len, e) in &done {
        crc.combine(&crc32fast::Hasher::new_with_initial_len(e.crc, *len));
        if let Some(d) = e.digest {
            digests.update(&d);
        }
    }
    let digest = (dedup && done.iter().all(|(_, e)| e.digest.is_some()))
        .then(|| *digests.finalize().as_bytes());
    let raw_len: u64 = done.iter().map(|(len, _)| len).sum();
    let blob = join_blobs(&done, raw_len, elem)?;
    for (_, e) in done {
        recycle(e.blob.stored);
    }
    Ok(Encoded {
        blob,
        crc: crc.finalize(),
        digest,
    })
}

/// One blob of the pieces' blobs: their bytes one after the other when all are raw, else a
/// [`Codec::Pieces`] blob.
fn join_blobs(
    done: &[(u64, Encoded)],
    raw_len: u64,
    elem: usize,
) -> Result<Blob, ttrace_format::FormatError> {
    let mut stored = Vec::new();
    let codec = if done.iter().all(|(_, e)| e.blob.codec == Codec::Raw) {
        stored.reserve_exact(raw_len as usize);
        for (_, e) in done {
            stored.extend_from_slice(&e.blob.stored);
        }
        Codec::Raw
    } else {
        let pieces: Vec<(Codec, u64, &[u8])> = done
            .iter()
            .map(|(len, e)| (e.blob.codec, *len, &e.blob.stored[..]))
            .collect();
        codec::join_pieces(&pieces, &mut stored)?;
        Codec::Pieces
    };
    Ok(Blob {
        codec,
        elem_size: elem as u8,
        raw_len,
        stored,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compresses `raw` as the pool would, piece by piece (in reverse order: the last piece
    /// in is not the last piece of the tensor), and returns the joined result.
    fn compressed(raw: &[u8], elem: usize, level: i32, dedup: bool) -> Encoded {
        let mut enc = Encoder::new(level);
        let (set, rx) = PieceSet::new(cut(raw.len() as u64, elem, PIECE_BYTES), elem, dedup);
        for (i, &(at, len)) in set.pieces.iter().enumerate().rev() {
            let bytes = &raw[at as usize..(at + len) as usize];
            set.done(i, encode(bytes, elem, &mut enc, dedup), drop);
        }
        rx.recv().expect("joined")
    }

    fn floats(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32)
            .flat_map(|i| {
                (((i ^ seed).wrapping_mul(2_654_435_761) >> 12) as f32 / 1e6).to_le_bytes()
            })
            .collect()
    }

    #[test]
    fn a_repeat_in_the_same_segment_is_hashed_not_compressed() {
        let w = floats(4096, 7);
        let mut enc = Encoder::new(crate::DEFAULT_LEVEL);
        let seen = Compressed::default();
        let first = encode_once(&w, 4, &mut enc, &seen, (0, 3));
        assert!(!is_repeat(&first.blob));
        assert!(first.blob.stored.len() < w.len(), "compressed");
        // The same bytes for the same segment: hashed only, with the same CRC-32 and digest.
        let again = encode_once(&w, 4, &mut enc, &seen, (0, 3));
        assert!(is_repeat(&again.blob));
        assert_eq!(again.blob.raw_len, w.len() as u64);
        assert_eq!((again.crc, again.digest), (first.crc, first.digest));
        assert_eq!(again.digest, Some(*blake3::hash(&w).as_bytes()));
        // Another segment (rank or step) holds no copy of them: compressed again.
        for key in [(1, 3), (0, 4)] {
            assert!(!is_repeat(&encode_once(&w, 4, &mut enc, &seen, key).blob));
        }
        // Other bytes, and tensors too small to deduplicate, are compressed.
        let other = floats(4096, 8);
        assert!(!is_repeat(
            &encode_once(&other, 4, &mut enc, &seen, (0, 3)).blob
        ));
        let tiny = &w[..dedup::MIN_DEDUP_BYTES - 4];
        for _ in 0..2 {
            assert!(!is_repeat(
                &encode_once(tiny, 4, &mut enc, &seen, (0, 3)).blob
            ));
        }
        // An empty tensor is never taken for a repeat.
        assert!(!is_repeat(&encode(&[], 4, &mut enc, true).blob));
    }

    #[test]
    fn pieces_are_whole_elements_and_cover_the_tensor() {
        for (n, elem) in [
            (0u64, 4usize),
            (5, 4),
            (PIECE_BYTES, 2),
            (3 * PIECE_BYTES + 7, 6),
        ] {
            let p = cut(n, elem, PIECE_BYTES);
            assert_eq!(p.iter().map(|x| x.1).sum::<u64>(), n, "{n} {elem}");
            assert!(p.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
            assert!(p[..p.len() - 1].iter().all(|x| x.1 % elem as u64 == 0));
            assert!(p.iter().all(|x| x.1 <= PIECE_BYTES));
        }
        assert_eq!(cut(PIECE_BYTES + 1, 1, PIECE_BYTES).len(), 2);
        assert_eq!(cut(10 * PIECE_BYTES, 2, 0), [(0, 10 * PIECE_BYTES)]);
    }

    /// A large tensor compressed in pieces reads back as the tensor, with the CRC-32 of the
    /// whole; a small one is one ordinary blob.
    #[test]
    fn a_large_tensor_joins_into_one_blob_with_the_whole_crc() {
        let raw = floats((PIECE_BYTES as usize * 5 / 2) / 4 + 3, 1);
        let e = compressed(&raw, 4, crate::DEFAULT_LEVEL, false);
        assert_eq!(e.blob.codec, Codec::Pieces);
        assert_eq!(e.crc, crc32fast::hash(&raw));
        assert!(e.blob.stored.len() < raw.len());
        let back = codec::decode(&e.blob.stored, raw.len(), 4, e.blob.codec, &mut Vec::new())
            .expect("decodes");
        assert_eq!(back, raw);
        let small = compressed(&raw[..4096], 4, crate::DEFAULT_LEVEL, false);
        assert_eq!(small.blob.codec, Codec::ShufflePlanes);
    }

    /// Identical large tensors get the same digest (so dedup stores them once), different
    /// ones different digests; a tensor below the dedup minimum gets none.
    #[test]
    fn digests_of_pieces_tell_tensors_apart() {
        let a = floats(PIECE_BYTES as usize / 2 + 100, 1);
        let mut b = a.clone();
        let last = b.len() - 1;
        b[last] ^= 1;
        let digest = |raw: &[u8]| compressed(raw, 4, 0, true).digest;
        assert!(digest(&a).is_some());
        assert_eq!(digest(&a), digest(&a.clone()));
        assert_ne!(digest(&a), digest(&b));
        assert_eq!(digest(&a[..100]), None);
        assert_eq!(compressed(&a, 4, 0, false).digest, None);
        // Stored raw (level 0): the pieces' bytes one after the other, no table.
        let raw = compressed(&a, 4, 0, true);
        assert_eq!((raw.blob.codec, raw.blob.stored == a), (Codec::Raw, true));
    }

    /// A piece whose job was lost (its worker panicked, dropping its share of the set) leaves
    /// the tensor's channel closed, so the writer stores the tensor from the ring instead of
    /// waiting forever.
    #[test]
    fn a_lost_piece_closes_the_channel() {
        let raw = floats(PIECE_BYTES as usize / 2 + 10, 2);
        let (set, rx) = PieceSet::new(cut(raw.len() as u64, 4, PIECE_BYTES), 4, false);
        let mut enc = Encoder::new(crate::DEFAULT_LEVEL);
        let (at, len) = set.pieces[0];
        set.done(
            0,
            encode(&raw[at as usize..(at + len) as usize], 4, &mut enc, false),
            drop,
        );
        drop(set); // piece 1's job is gone
        assert!(rx.recv().is_err());
    }

    /// Pieces that cannot be joined are not sent half-joined: the channel closes and the
    /// writer stores the tensor raw from the ring.
    #[test]
    fn pieces_that_cannot_be_joined_close_the_channel() {
        let (set, rx) = PieceSet::new(vec![(0, 4), (4, 4)], 1, false);
        let odd = |codec| Encoded {
            blob: Blob {
                codec,
                elem_size: 1,
                raw_len: 4,
                stored: vec![0; 4],
            },
            crc: 0,
            digest: None,
        };
        set.done(0, odd(Codec::Zstd), drop);
        set.done(1, odd(Codec::Streamed), drop);
        drop(set);
        assert!(rx.recv().is_err());
    }
}
