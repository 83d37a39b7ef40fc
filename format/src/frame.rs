//! The fixed-size headers of the store's files, each written and parsed here and nowhere else
//! (docs/format.md is their specification):
//!
//! ```text
//! segment header (64)  magic "TTRSEG\r\n" | major u16 | minor u16 | rank u32 | step u64 | 0 (40)
//! frame header (24)    magic "TTRF" | flags u32 (0) | body_len u64 | crc32(body) u32 | 0 u32
//! blob header (24)     codec u8 | elem_size u8 | 0 u16 | 0 u32 | raw_len u64 | stored_len u64
//! index header (16)    magic "TTRIDX\r\n" | major u16 | minor u16 | entries u32
//! index entry (32)     seq u64 | offset u64 | frame_len u64 | crc32 u32 | 0 u32
//! stream header (64)   magic "TTRSTM\r\n" | major u16 | minor u16 | elem u8 | 0 (3) | total u64 | 0 (40)
//! chunk header (32)    magic "TTRC" | index u32 | offset u64 | body_len u64 | crc32(body) u32 | 0 u32
//! ```
//!
//! All integers are little-endian. Parsers take a slice at least as long as their header
//! (callers check the length first: what is missing is theirs to report, as a torn tail or a
//! short file) and check only the magic; versions are checked by [`check_major`].

use std::path::Path;

use crate::FormatError;

/// Major version: a reader refuses a store with another one.
pub const FORMAT_MAJOR: u16 = 1;
/// Minor version: additions a reader of the same major may ignore.
pub const FORMAT_MINOR: u16 = 7;

/// First bytes of a segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"TTRSEG\r\n";
/// First bytes of an index file.
pub const INDEX_MAGIC: [u8; 8] = *b"TTRIDX\r\n";
/// First bytes of every frame.
pub const FRAME_MAGIC: [u8; 4] = *b"TTRF";
/// First bytes of a stream file.
pub const STREAM_MAGIC: [u8; 8] = *b"TTRSTM\r\n";
/// First bytes of a stream's chunk.
pub const CHUNK_MAGIC: [u8; 4] = *b"TTRC";
/// Bytes of a segment header.
pub const SEGMENT_HEADER_BYTES: u64 = 64;
/// Bytes of a frame header.
pub const FRAME_HEADER_BYTES: u64 = 24;
/// Bytes of a blob header.
pub const BLOB_HEADER_BYTES: usize = 24;
/// Bytes of an index file's header.
pub const INDEX_HEADER_BYTES: usize = 16;
/// Bytes of an index entry.
pub const INDEX_ENTRY_BYTES: usize = 32;
/// Bytes of a stream file's header.
pub const STREAM_HEADER_BYTES: usize = 64;
/// Bytes of a chunk header.
pub const CHUNK_HEADER_BYTES: usize = 32;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
    b[at..at + bytes.len()].copy_from_slice(bytes);
}

/// Refuses a file (`what` at `path`) of another major version than this reader's.
pub fn check_major(major: u16, what: &str, path: &Path) -> Result<(), FormatError> {
    if major == FORMAT_MAJOR {
        return Ok(());
    }
    Err(FormatError::Version(format!(
        "{}: {what} major version {major}, this ttrace reads {FORMAT_MAJOR}",
        path.display()
    )))
}

/// The header of a segment: which (rank, step) its frames belong to, in which version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub major: u16,
    pub minor: u16,
    pub rank: u32,
    pub step: u64,
}

impl SegmentHeader {
    /// The header this version writes for (rank, step).
    pub fn current(rank: u32, step: u64) -> SegmentHeader {
        SegmentHeader {
            major: FORMAT_MAJOR,
            minor: FORMAT_MINOR,
            rank,
            step,
        }
    }

    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES as usize] {
        let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
        put(&mut h, 0, &SEGMENT_MAGIC);
        put(&mut h, 8, &self.major.to_le_bytes());
        put(&mut h, 10, &self.minor.to_le_bytes());
        put(&mut h, 12, &self.rank.to_le_bytes());
        put(&mut h, 16, &self.step.to_le_bytes());
        h
    }

    /// The header at the start of `h`, or `None` without the segment magic.
    pub fn parse(h: &[u8]) -> Option<SegmentHeader> {
        (h[..8] == SEGMENT_MAGIC).then(|| SegmentHeader {
            major: u16_at(h, 8),
            minor: u16_at(h, 10),
            rank: u32_at(h, 12),
            step: u64_at(h, 16),
        })
    }

    /// The header of the segment file at `path`, checked: a file too short, without the magic
    /// or of another major version is refused (every reader opens segments through this).
    pub fn read(path: &Path) -> Result<SegmentHeader, FormatError> {
        use std::io::Read;
        let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
        crate::store::open_regular(path)?
            .read_exact(&mut h)
            .map_err(|_| {
                FormatError::Corrupt(format!("{}: shorter than a segment header", path.display()))
            })?;
        let header = SegmentHeader::parse(&h).ok_or_else(|| {
            FormatError::Corrupt(format!("{}: not a ttrace segment", path.display()))
        })?;
        check_major(header.major, "segment", path)?;
        Ok(header)
    }
}

/// The header of a frame: the length and CRC-32 of the body that follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub body_len: u64,
    pub crc32: u32,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; FRAME_HEADER_BYTES as usize] {
        let mut h = [0u8; FRAME_HEADER_BYTES as usize];
        put(&mut h, 0, &FRAME_MAGIC);
        put(&mut h, 8, &self.body_len.to_le_bytes());
        put(&mut h, 16, &self.crc32.to_le_bytes());
        h
    }

    /// The header at the start of `h`, or `None` without the frame magic.
    pub fn parse(h: &[u8]) -> Option<FrameHeader> {
        (h[..4] == FRAME_MAGIC).then(|| FrameHeader {
            body_len: u64_at(h, 8),
            crc32: u32_at(h, 16),
        })
    }

    /// Bytes of the whole frame, header included.
    pub fn frame_len(&self) -> u64 {
        FRAME_HEADER_BYTES + self.body_len
    }
}

/// The header of a blob (one captured tensor's stored bytes, inside a frame body or a chunk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobHeader {
    /// The codec's number ([`crate::codec::Codec::from_u8`]): unknown ones are the reader's
    /// to report.
    pub codec: u8,
    pub elem_size: u8,
    pub raw_len: u64,
    pub stored_len: u64,
}

impl BlobHeader {
    pub fn encode(&self) -> [u8; BLOB_HEADER_BYTES] {
        let mut h = [0u8; BLOB_HEADER_BYTES];
        h[0] = self.codec;
        h[1] = self.elem_size;
        put(&mut h, 8, &self.raw_len.to_le_bytes());
        put(&mut h, 16, &self.stored_len.to_le_bytes());
        h
    }

    /// The header at the start of `h` (a blob header has no magic).
    pub fn parse(h: &[u8]) -> BlobHeader {
        BlobHeader {
            codec: h[0],
            elem_size: h[1],
            raw_len: u64_at(h, 8),
            stored_len: u64_at(h, 16),
        }
    }
}

/// The header of an index file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexHeader {
    pub major: u16,
    pub minor: u16,
    pub entries: u32,
}

impl IndexHeader {
    pub fn encode(&self) -> [u8; INDEX_HEADER_BYTES] {
        let mut h = [0u8; INDEX_HEADER_BYTES];
        put(&mut h, 0, &INDEX_MAGIC);
        put(&mut h, 8, &self.major.to_le_bytes());
        put(&mut h, 10, &self.minor.to_le_bytes());
        put(&mut h, 12, &self.entries.to_le_bytes());
        h
    }

    /// The header at the start of `h`, or `None` without the index magic.
    pub fn parse(h: &[u8]) -> Option<IndexHeader> {
        (h[..8] == INDEX_MAGIC).then(|| IndexHeader {
            major: u16_at(h, 8),
            minor: u16_at(h, 10),
            entries: u32_at(h, 12),
        })
    }
}

/// One entry of a segment's index: where the frame of a seq is, and its body's CRC-32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub seq: u64,
    pub offset: u64,
    pub frame_len: u64,
    pub crc32: u32,
}

impl IndexEntry {
    pub fn encode(&self) -> [u8; INDEX_ENTRY_BYTES] {
        let mut h = [0u8; INDEX_ENTRY_BYTES];
        put(&mut h, 0, &self.seq.to_le_bytes());
        put(&mut h, 8, &self.offset.to_le_bytes());
        put(&mut h, 16, &self.frame_len.to_le_bytes());
        put(&mut h, 24, &self.crc32.to_le_bytes());
        h
    }

    pub fn parse(h: &[u8]) -> IndexEntry {
        IndexEntry {
            seq: u64_at(h, 0),
            offset: u64_at(h, 8),
            frame_len: u64_at(h, 16),
            crc32: u32_at(h, 24),
        }
    }

    /// Whether the frame header `h` (at this entry's offset) agrees with the entry.
    pub fn matches(&self, h: &[u8]) -> bool {
        FrameHeader::parse(h)
            .is_some_and(|f| f.frame_len() == self.frame_len && f.crc32 == self.crc32)
    }
}

/// The header of a stream file (one large tensor's chunks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamHeader {
    pub major: u16,
    pub minor: u16,
    /// Bytes per element of the tensor.
    pub elem: u8,
    /// Raw bytes of the whole tensor.
    pub total: u64,
}

impl StreamHeader {
    /// The header this version writes.
    pub fn current(elem: u8, total: u64) -> StreamHeader {
        StreamHeader {
            major: FORMAT_MAJOR,
            minor: FORMAT_MINOR,
            elem,
            total,
        }
    }

    pub fn encode(&self) -> [u8; STREAM_HEADER_BYTES] {
        let mut h = [0u8; STREAM_HEADER_BYTES];
        put(&mut h, 0, &STREAM_MAGIC);
        put(&mut h, 8, &self.major.to_le_bytes());
        put(&mut h, 10, &self.minor.to_le_bytes());
        h[12] = self.elem;
        put(&mut h, 16, &self.total.to_le_bytes());
        h
    }

    /// The header at the start of `h`, or `None` without the stream magic.
    pub fn parse(h: &[u8]) -> Option<StreamHeader> {
        (h[..8] == STREAM_MAGIC).then(|| StreamHeader {
            major: u16_at(h, 8),
            minor: u16_at(h, 10),
            elem: h[12],
            total: u64_at(h, 16),
        })
    }
}

/// The header of one chunk of a stream: which piece of the tensor its body (a blob) holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub index: u32,
    /// Where the chunk's raw bytes start in the tensor.
    pub offset: u64,
    pub body_len: u64,
    pub crc32: u32,
}

impl ChunkHeader {
    pub fn encode(&self) -> [u8; CHUNK_HEADER_BYTES] {
        let mut h = [0u8; CHUNK_HEADER_BYTES];
        put(&mut h, 0, &CHUNK_MAGIC);
        put(&mut h, 4, &self.index.to_le_bytes());
        put(&mut h, 8, &self.offset.to_le_bytes());
        put(&mut h, 16, &self.body_len.to_le_bytes());
        put(&mut h, 24, &self.crc32.to_le_bytes());
        h
    }

    /// The header at the start of `h`, or `None` without the chunk magic.
    pub fn parse(h: &[u8]) -> Option<ChunkHeader> {
        (h[..4] == CHUNK_MAGIC).then(|| ChunkHeader {
            index: u32_at(h, 4),
            offset: u64_at(h, 8),
            body_len: u64_at(h, 16),
            crc32: u32_at(h, 24),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layouts docs/format.md specifies, byte for byte: a reader written from the
    /// specification alone must read what these write.
    #[test]
    fn headers_are_laid_out_as_the_specification_says() {
        let s = SegmentHeader::current(3, 0x0102_0304_0506_0708).encode();
        assert_eq!(&s[..8], b"TTRSEG\r\n");
        assert_eq!(&s[8..12], &[1, 0, 7, 0]);
        assert_eq!(&s[12..16], &[3, 0, 0, 0]);
        assert_eq!(&s[16..24], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert!(s[24..].iter().all(|&b| b == 0));

        let f = FrameHeader {
            body_len: 0x1234,
            crc32: 0xdead_beef,
        }
        .encode();
        assert_eq!(&f[..8], b"TTRF\0\0\0\0");
        assert_eq!(&f[8..16], &[0x34, 0x12, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&f[16..24], &[0xef, 0xbe, 0xad, 0xde, 0, 0, 0, 0]);

        let b = BlobHeader {
            codec: 3,
            elem_size: 2,
            raw_len: 10,
            stored_len: 7,
        }
        .encode();
        assert_eq!(&b[..8], &[3, 2, 0, 0, 0, 0, 0, 0]);
        assert_eq!(b[8], 10);
        assert_eq!(b[16], 7);

        let e = IndexEntry {
            seq: 5,
            offset: 64,
            frame_len: 100,
            crc32: 9,
        }
        .encode();
        assert_eq!((e[0], e[8], e[16], e[24]), (5, 64, 100, 9));

        let c = ChunkHeader {
            index: 2,
            offset: 4096,
            body_len: 30,
            crc32: 1,
        }
        .encode();
        assert_eq!(&c[..4], b"TTRC");
        assert_eq!(
            (c[4], c[8..16].to_vec(), c[16], c[24]),
            (2, 4096u64.to_le_bytes().to_vec(), 30, 1)
        );
    }

    #[test]
    fn every_header_reads_back_what_was_written_and_refuses_a_wrong_magic() {
        let s = SegmentHeader::current(7, 9);
        assert_eq!(SegmentHeader::parse(&s.encode()), Some(s));
        let f = FrameHeader {
            body_len: u64::MAX,
            crc32: 1,
        };
        assert_eq!(FrameHeader::parse(&f.encode()), Some(f));
        let b = BlobHeader {
            codec: 1,
            elem_size: 4,
            raw_len: 1 << 40,
            stored_len: 3,
        };
        assert_eq!(BlobHeader::parse(&b.encode()), b);
        let i = IndexHeader {
            major: FORMAT_MAJOR,
            minor: FORMAT_MINOR,
            entries: 12,
        };
        assert_eq!(IndexHeader::parse(&i.encode()), Some(i));
        let e = IndexEntry {
            seq: 1,
            offset: 2,
            frame_len: 3 + FRAME_HEADER_BYTES,
            crc32: 4,
        };
        assert_eq!(IndexEntry::parse(&e.encode()), e);
        let st = StreamHeader::current(2, 1 << 33);
        assert_eq!(StreamHeader::parse(&st.encode()), Some(st));
        let c = ChunkHeader {
            index: 1,
            offset: 2,
            body_len: 3,
            crc32: 4,
        };
        assert_eq!(ChunkHeader::parse(&c.encode()), Some(c));

        assert_eq!(SegmentHeader::parse(&[0u8; 64]), None);
        assert_eq!(FrameHeader::parse(&[0u8; 24]), None);
        assert_eq!(IndexHeader::parse(&[0u8; 16]), None);
        assert_eq!(StreamHeader::parse(&[0u8; 64]), None);
        assert_eq!(ChunkHeader::parse(&[0u8; 32]), None);
    }

    #[test]
    fn an_index_entry_matches_only_the_frame_header_it_describes() {
        let h = FrameHeader {
            body_len: 10,
            crc32: 77,
        }
        .encode();
        let e = IndexEntry {
            seq: 0,
            offset: 64,
            frame_len: FRAME_HEADER_BYTES + 10,
            crc32: 77,
        };
        assert!(e.matches(&h));
        assert!(!IndexEntry { crc32: 78, ..e }.matches(&h));
        assert!(!IndexEntry {
            frame_len: e.frame_len + 1,
            ..e
        }
        .matches(&h));
        let mut bad = h;
        bad[0] = b'X';
        assert!(!e.matches(&bad));
    }
}
