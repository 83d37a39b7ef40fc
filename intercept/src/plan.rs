//! What to snapshot of an op: its tensors, their shapes as stored (packed), where their bytes
//! are on the device, and which copies bring them into a ring slot. Pure arithmetic; the
//! engine executes the plan.

use std::sync::Arc;

use smallvec::{smallvec, SmallVec};

use ttrace_proto::dtype::DType;
use ttrace_proto::record::Role;

/// When a tensor is copied relative to the op on its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Before the op: an input the op overwrites (GEMM C with beta != 0, an in-place
    /// collective's send buffer).
    Before,
    /// After the op: outputs, and inputs the op leaves alone.
    After,
}

/// Where a tensor's bytes are: `batch` blocks `bstride` bytes apart, each `height` rows of
/// `width` bytes, `spitch` bytes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    pub src: u64,
    pub spitch: u64,
    pub width: u64,
    pub height: u64,
    pub batch: u64,
    pub bstride: u64,
}

impl Source {
    /// `len` contiguous bytes at `src`.
    pub fn linear(src: u64, len: u64) -> Source {
        Source {
            src,
            spitch: len,
            width: len,
            height: 1,
            batch: 1,
            bstride: 0,
        }
    }

    /// Packed bytes.
    pub fn bytes(&self) -> u64 {
        self.width * self.height * self.batch
    }

    /// Whether the packed bytes lie at one address, in order: [`Source::copies`] is one linear
    /// copy (told without building the list).
    pub fn is_contiguous(&self) -> bool {
        let (w, h, b) = (self.width, self.height, self.batch);
        w > 0 && h > 0 && b > 0 && (h == 1 || self.spitch == w) && (b == 1 || self.bstride == w * h)
    }

    /// The copies that pack the source into a buffer: as few as the layout allows (one linear
    /// copy when it is contiguous, one pitched copy when the blocks follow each other at the
    /// row pitch, else one pitched copy per block).
    pub fn copies(&self) -> Vec<Copy> {
        let (w, h, b) = (self.width, self.height, self.batch);
        if w == 0 || h == 0 || b == 0 {
            return Vec::new();
        }
        let rows_packed = h == 1 || self.spitch == w;
        let blocks_packed = b == 1 || self.bstride == w * h;
        if rows_packed && blocks_packed {
            return vec![Copy::Linear {
                dst: 0,
                src: self.src,
                len: w * h * b,
            }];
        }
        let rows_follow = b == 1 || self.bstride == self.spitch * h;
        if rows_follow {
            return vec![Copy::Pitched {
                dst: 0,
                src: self.src,
                spitch: self.spitch,
                width: w,
                height: h * b,
            }];
        }
        (0..b)
            .map(|i| {
                let src = self.src.wrapping_add(i * self.bstride);
                let dst = i * w * h;
                if rows_packed {
                    Copy::Linear {
                        dst,
                        src,
                        len: w * h,
                    }
                } else {
                    Copy::Pitched {
                        dst,
                        src,
                        spitch: self.spitch,
                        width: w,
                        height: h,
                    }
                }
            })
            .collect()
    }

    /// The copies that bring packed bytes `start..start + len` into a buffer of `len` bytes
    /// (`dst` relative to `start`): how a tensor larger than a ring slot is taken in chunks.
    /// Whole rows of a block become one copy; a range that starts or ends inside a row copies
    /// that part of the row on its own.
    pub fn copies_range(&self, start: u64, len: u64) -> Vec<Copy> {
        let (w, h, b) = (self.width, self.height, self.batch);
        let end = start.saturating_add(len).min(self.bytes());
        if w == 0 || h == 0 || b == 0 || start >= end {
            return Vec::new();
        }
        let block = w * h;
        let contiguous = (h == 1 || self.spitch == w) && (b == 1 || self.bstride == block);
        if contiguous {
            return vec![Copy::Linear {
                dst: 0,
                src: self.src.wrapping_add(start),
                len: end - start,
            }];
        }
        let mut out = Vec::new();
        let mut at = start;
        while at < end {
            let (blk, in_block) = (at / block, at % block);
            let (row, col) = (in_block / w, in_block % w);
            let row_src = self
                .src
                .wrapping_add(blk * self.bstride)
                .wrapping_add(row * self.spitch);
            let dst = at - start;
            if col != 0 || end - at < w {
                // Part of one row.
                let n = (w - col).min(end - at);
                out.push(Copy::Linear {
                    dst,
                    src: row_src.wrapping_add(col),
                    len: n,
                });
                at += n;
                continue;
            }
            let rows = (h - row).min((end - at) / w);
            out.push(if rows == 1 || self.spitch == w {
                Copy::Linear {
                    dst,
                    src: row_src,
                    len: rows * w,
                }
            } else {
                Copy::Pitched {
                    dst,
                    src: row_src,
                    spitch: self.spitch,
                    width: w,
                    height: rows,
                }
            });
            at += rows * w;
        }
        out
    }
}

/// One copy into a tensor's place in the slot (`dst` relative to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copy {
    Linear {
        dst: u64,
        src: u64,
        len: u64,
    },
    Pitched {
        dst: u64,
        src: u64,
        spitch: u64,
        width: u64,
        height: u64,
    },
}

/// A tensor's shape, inline up to four dimensions.
pub type Shape = SmallVec<[u64; 4]>;

/// A tensor of an op and how to snapshot it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorPlan {
    pub role: Role,
    pub dtype: DType,
    /// Row-major shape of the packed bytes (inline: every GEMM hook plans four tensors, and
    /// most of them are never published).
    pub shape: Shape,
    /// The address the op used.
    pub ptr: u64,
    /// Packed bytes.
    pub nbytes: u64,
    /// Whether its bytes will be copied.
    pub captured: bool,
    /// An op input (subject to `TTRACE_INPUTS`).
    pub input: bool,
    pub when: When,
    pub source: Source,
    /// A pointer-array batch: where each batch entry starts (replacing `source.src +
    /// i * source.bstride`).
    pub blocks: Option<Arc<[u64]>>,
    /// The bytes the tensor must hold for the record to stand (a pointer array as the hook
    /// read it from the host, uploads.rs): the tracer compares.
    pub expect: Option<Arc<[u8]>>,
    /// Copied for the step rule only (an input under `--no-inputs`): the tracer reads it and
    /// publishes the record with it metadata only.
    pub rule_only: bool,
}

impl TensorPlan {
    /// The copies that pack the tensor into a buffer ([`Source::copies`], per batch entry at
    /// its own address for a pointer-array batch).
    pub fn copies(&self) -> Vec<Copy> {
        match &self.blocks {
            None => self.source.copies(),
            Some(_) => self.copies_range(0, self.source.bytes()),
        }
    }

    /// The copies of packed bytes `start..start + len` ([`Source::copies_range`], per batch
    /// entry at its own address for a pointer-array batch).
    pub fn copies_range(&self, start: u64, len: u64) -> Vec<Copy> {
        let Some(blocks) = &self.blocks else {
            return self.source.copies_range(start, len);
        };
        let block = self.source.width * self.source.height;
        let end = start.saturating_add(len).min(self.source.bytes());
        let mut out = Vec::new();
        let mut at = start;
        while at < end && block > 0 {
            let i = at / block;
            let Some(&src) = blocks.get(i as usize) else {
                break;
            };
            let one = Source {
                src,
                batch: 1,
                bstride: 0,
                ..self.source
            };
            let (from, to) = (at - i * block, (end - i * block).min(block));
            let dst = at - start;
            out.extend(
                one.copies_range(from, to - from)
                    .into_iter()
                    .map(|c| match c {
                        Copy::Linear { dst: d, src, len } => Copy::Linear {
                            dst: d + dst,
                            src,
                            len,
                        },
                        Copy::Pitched {
                            dst: d,
                            src,
                            spitch,
                            width,
                            height,
                        } => Copy::Pitched {
                            dst: d + dst,
                            src,
                            spitch,
                            width,
                            height,
                        },
                    }),
            );
            at = i * block + to;
        }
        out
    }

    /// A tensor whose bytes cannot be taken (unknown type, bad layout): metadata only.
    fn metadata(role: Role, dtype: DType, shape: Shape, ptr: u64, input: bool) -> TensorPlan {
        TensorPlan::copied(
            role,
            dtype,
            shape,
            ptr,
            input,
            When::After,
            Source::linear(ptr, 0),
        )
    }

    /// A tensor whose bytes `source` copies (none when it is empty: metadata only).
    fn copied(
        role: Role,
        dtype: DType,
        shape: Shape,
        ptr: u64,
        input: bool,
        when: When,
        source: Source,
    ) -> TensorPlan {
        TensorPlan {
            role,
            dtype,
            shape,
            ptr,
            nbytes: source.bytes(),
            captured: source.bytes() > 0,
            input,
            when,
            source,
            blocks: None,
            expect: None,
            rule_only: false,
        }
    }
}

/// A matrix operand as cuBLAS describes it: column-major `rows x cols` with leading dimension
/// `ld` (elements), `batch` matrices `stride` elements apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Matrix {
    pub ptr: u64,
    /// `cudaDataType_t`, raw.
    pub dtype: u32,
    pub rows: u64,
    pub cols: u64,
    pub ld: u64,
    pub batch: u64,
    pub stride: i64,
    /// Whether the API is batched (shape `[batch, cols, rows]` instead of `[cols, rows]`).
    pub batched: bool,
}

/// The tensor of a matrix operand, packed without leading-dimension padding.
pub fn matrix(role: Role, m: &Matrix, when: When, input: bool) -> TensorPlan {
    let shape = if m.batched {
        smallvec![m.batch, m.cols, m.rows]
    } else {
        smallvec![m.cols, m.rows]
    };
    let Some(dtype) = DType::from_cuda(m.dtype) else {
        return TensorPlan::metadata(role, DType::U8, shape, m.ptr, input);
    };
    // Packed FP4 holds two values per byte: rows, leading dimension and stride count values,
    // the stored shape bytes (an odd one has no byte layout: metadata only).
    let per = dtype.values_per_element() as u64;
    let mut shape = shape;
    if let Some(rows) = shape.last_mut() {
        *rows = m.rows.div_ceil(per);
    }
    let es = dtype.size() as u64;
    let valid = m.ptr != 0
        && m.ld >= m.rows.max(1)
        && m.stride >= 0
        && m.batch >= 1
        && [m.rows, m.ld, m.stride as u64].iter().all(|v| v % per == 0);
    if !valid {
        return TensorPlan::metadata(role, dtype, shape, m.ptr, input);
    }
    let source = Source {
        src: m.ptr,
        spitch: m.ld / per * es,
        width: m.rows / per * es,
        height: m.cols,
        batch: m.batch,
        bstride: m.stride as u64 / per * es,
    };
    TensorPlan::copied(role, dtype, shape, m.ptr, input, when, source)
}

/// The tensor of a pointer-array batch's operand: `m.batch` matrices of `m`'s shape, entry
/// `i` at `blocks[i]` (packed as a strided batch would be: `[batch, cols, rows]`). Metadata
/// only when an address is null or the count disagrees.
pub fn matrix_at(
    role: Role,
    m: &Matrix,
    blocks: Arc<[u64]>,
    when: When,
    input: bool,
) -> TensorPlan {
    let first = blocks.first().copied().unwrap_or(0);
    let at = Matrix {
        ptr: first,
        stride: 0,
        batched: true,
        ..*m
    };
    let mut t = matrix(role, &at, when, input);
    if blocks.len() as u64 != m.batch || blocks.contains(&0) {
        t.captured = false;
        t.nbytes = 0;
    }
    if t.captured {
        t.blocks = Some(blocks);
    }
    t
}

/// A vector operand: `len` elements of `dtype` (`None`: a type the tracer cannot size), `batch`
/// of them `stride` elements apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vector {
    pub ptr: u64,
    pub dtype: Option<DType>,
    pub len: u64,
    pub batch: u64,
    pub stride: u64,
}

impl Vector {
    /// One vector of `len` elements.
    pub fn new(ptr: u64, dtype: Option<DType>, len: u64) -> Vector {
        Vector {
            ptr,
            dtype,
            len,
            batch: 1,
            stride: 0,
        }
    }

    /// `batch` vectors `stride` elements apart.
    pub fn batched(self, batch: u64, stride: u64) -> Vector {
        Vector {
            batch,
            stride,
            ..self
        }
    }
}

/// The tensor of a vector operand, packed (shape `[len]`, or `[batch, len]` when
/// `batch > 1`).
pub fn vector(role: Role, v: Vector, when: When, input: bool) -> TensorPlan {
    let Vector {
        ptr,
        dtype,
        len,
        batch,
        stride,
    } = v;
    let shape = if batch > 1 {
        smallvec![batch, len]
    } else {
        smallvec![len]
    };
    let Some(dtype) = dtype else {
        return TensorPlan::metadata(role, DType::U8, shape, ptr, input);
    };
    if ptr == 0 {
        return TensorPlan::metadata(role, dtype, shape, ptr, input);
    }
    let es = dtype.size() as u64;
    let source = if batch > 1 {
        Source {
            src: ptr,
            spitch: len * es,
            width: len * es,
            height: 1,
            batch,
            bstride: stride * es,
        }
    } else {
        Source::linear(ptr, len * es)
    };
    TensorPlan::copied(role, dtype, shape, ptr, input, when, source)
}

/// Bytes of a copy: `height` rows of `width` bytes, `pitch` apart (shape `[width]` for one
/// row, else `[height, width]`), dtype `U8`.
pub fn bytes(role: Role, ptr: u64, width: u64, height: u64, pitch: u64) -> TensorPlan {
    let shape = if height == 1 {
        smallvec![width]
    } else {
        smallvec![height, width]
    };
    let source = Source {
        src: ptr,
        spitch: pitch,
        width,
        height,
        batch: 1,
        bstride: 0,
    };
    TensorPlan {
        role,
        dtype: DType::U8,
        shape,
        ptr,
        nbytes: source.bytes(),
        captured: ptr != 0 && source.bytes() > 0 && pitch >= width,
        input: false,
        when: When::After,
        source,
        blocks: None,
        expect: None,
        rule_only: false,
    }
}

/// Whether two byte ranges overlap.
pub fn overlaps(a: u64, a_len: u64, b: u64, b_len: u64) -> bool {
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `is_contiguous` says what `copies` would build, for every small layout.
    #[test]
    fn a_source_is_contiguous_exactly_when_it_is_one_linear_copy() {
        for (width, height, batch) in [(0, 1, 1), (4, 0, 1), (4, 2, 0), (4, 1, 1), (4, 3, 2)] {
            for spitch in [width, width + 4] {
                for bstride in [0, width * height, spitch * height, spitch * height + 8] {
                    let s = Source {
                        src: 0x100,
                        spitch,
                        width,
                        height,
                        batch,
                        bstride,
                    };
                    let one_linear = matches!(s.copies()[..], [Copy::Linear { .. }]);
                    assert_eq!(s.is_contiguous(), one_linear, "{s:?}");
                }
            }
        }
    }

    #[test]
    fn a_padded_matrix_is_one_pitched_copy_and_packs_its_rows() {
        let m = Matrix {
            ptr: 0x1000,
            dtype: 14, // BF16
            rows: 3,
            cols: 4,
            ld: 8,
            batch: 1,
            stride: 0,
            batched: false,
        };
        let t = matrix(Role::A, &m, When::After, true);
        assert_eq!(t.shape.as_slice(), [4, 3]);
        assert_eq!(t.nbytes, 24);
        assert_eq!(
            t.source.copies(),
            vec![Copy::Pitched {
                dst: 0,
                src: 0x1000,
                spitch: 16,
                width: 6,
                height: 4
            }]
        );
    }

    #[test]
    fn batches_are_one_copy_when_contiguous_and_one_per_matrix_otherwise() {
        let base = Matrix {
            ptr: 0x1000,
            dtype: 0, // F32
            rows: 2,
            cols: 3,
            ld: 2,
            batch: 4,
            stride: 6,
            batched: true,
        };
        let t = matrix(Role::B, &base, When::After, true);
        assert_eq!(t.shape.as_slice(), [4, 3, 2]);
        assert_eq!(
            t.source.copies(),
            vec![Copy::Linear {
                dst: 0,
                src: 0x1000,
                len: 96
            }]
        );
        // Padded rows, matrices back to back: one pitched copy over all rows.
        let padded = Matrix {
            ld: 4,
            stride: 12,
            ..base
        };
        assert_eq!(
            matrix(Role::B, &padded, When::After, true).source.copies(),
            vec![Copy::Pitched {
                dst: 0,
                src: 0x1000,
                spitch: 16,
                width: 8,
                height: 12
            }]
        );
        // Stride 0 (one matrix broadcast over the batch): one copy per entry.
        let broadcast = Matrix { stride: 0, ..base };
        let c = matrix(Role::B, &broadcast, When::After, true)
            .source
            .copies();
        assert_eq!(c.len(), 4);
        assert_eq!(
            c[3],
            Copy::Linear {
                dst: 72,
                src: 0x1000,
                len: 24
            }
        );
    }

    #[test]
    fn packed_fp4_is_taken_as_bytes_of_two_values() {
        let m = Matrix {
            ptr: 0x1000,
            dtype: 33, // CUDA_R_4F_E2M1
            rows: 64,
            cols: 3,
            ld: 96,
            batch: 1,
            stride: 0,
            batched: false,
        };
        let t = matrix(Role::A, &m, When::After, true);
        assert_eq!(
            (t.dtype, t.shape.to_vec(), t.nbytes),
            (DType::F4_E2M1X2, vec![3, 32], 96)
        );
        assert_eq!(
            t.source.copies(),
            vec![Copy::Pitched {
                dst: 0,
                src: 0x1000,
                spitch: 48,
                width: 32,
                height: 3
            }]
        );
        // An odd leading dimension splits a byte between columns: metadata only.
        assert!(!matrix(Role::A, &Matrix { ld: 65, ..m }, When::After, true).captured);
    }

    #[test]
    fn unusable_operands_are_metadata_only() {
        let bad_ld = Matrix {
            ptr: 0x1000,
            dtype: 0,
            rows: 4,
            cols: 4,
            ld: 2,
            batch: 1,
            stride: 0,
            batched: false,
        };
        assert!(!matrix(Role::A, &bad_ld, When::After, true).captured);
        let complex = Matrix {
            dtype: 4,
            ld: 4,
            ..bad_ld
        };
        let t = matrix(Role::A, &complex, When::After, true);
        assert!(!t.captured && t.nbytes == 0);
        assert!(
            !vector(
                Role::Input,
                Vector::new(0, Some(DType::F32), 4),
                When::After,
                true
            )
            .captured
        );
    }

    /// Packs `src` (a fake device memory) the way the copies say, into `len` bytes.
    fn run_copies(mem: &[u8], copies: &[Copy], len: u64) -> Vec<u8> {
        let mut out = vec![0u8; len as usize];
        for c in copies {
            match *c {
                Copy::Linear { dst, src, len } => out[dst as usize..(dst + len) as usize]
                    .copy_from_slice(&mem[src as usize..(src + len) as usize]),
                Copy::Pitched {
                    dst,
                    src,
                    spitch,
                    width,
                    height,
                } => {
                    for r in 0..height {
                        let (d, s) = ((dst + r * width) as usize, (src + r * spitch) as usize);
                        out[d..d + width as usize].copy_from_slice(&mem[s..s + width as usize]);
                    }
                }
            }
        }
        out
    }

    /// Chunks of any size, cut anywhere, reassemble into exactly the packed tensor, for
    /// contiguous, pitched and strided-batch layouts.
    #[test]
    fn any_chunking_of_a_source_reassembles_the_packed_bytes() {
        let mem: Vec<u8> = (0..4096u32).map(|i| (i * 13 + i / 7) as u8).collect();
        let layouts = [
            Source::linear(5, 1000),
            Source {
                src: 3,
                spitch: 48,
                width: 40,
                height: 20,
                batch: 1,
                bstride: 0,
            },
            Source {
                src: 0,
                spitch: 16,
                width: 10,
                height: 6,
                batch: 5,
                bstride: 200,
            },
            Source {
                src: 64,
                spitch: 12,
                width: 12,
                height: 4,
                batch: 3,
                bstride: 0,
            },
        ];
        for src in layouts {
            let whole = run_copies(&mem, &src.copies(), src.bytes());
            for chunk in [1u64, 7, 10, 33, 64, 128, 999, 5000] {
                let mut got = Vec::new();
                let mut at = 0;
                while at < src.bytes() {
                    let len = chunk.min(src.bytes() - at);
                    got.extend(run_copies(&mem, &src.copies_range(at, len), len));
                    at += len;
                }
                assert_eq!(got, whole, "{src:?} in chunks of {chunk}");
            }
        }
    }

    /// A pointer-array batch packs each entry from its own address, whole or in chunks.
    #[test]
    fn a_pointer_array_batch_packs_each_entry_from_its_address() {
        let mem: Vec<u8> = (0..4096u32).map(|i| (i * 7 + i / 5) as u8).collect();
        let m = Matrix {
            ptr: 0,
            dtype: 0, // F32
            rows: 3,
            cols: 2,
            ld: 5,
            batch: 3,
            stride: 0,
            batched: true,
        };
        let blocks: Arc<[u64]> = Arc::from(vec![2000u64, 100, 3000]);
        let t = matrix_at(Role::A, &m, blocks.clone(), When::After, true);
        assert!(t.captured);
        assert_eq!(t.shape.as_slice(), [3, 2, 3]);
        assert_eq!(t.nbytes, 3 * 2 * 12);
        let mut want = Vec::new();
        for b in blocks.iter() {
            for col in 0..2u64 {
                let s = (b + col * 20) as usize;
                want.extend_from_slice(&mem[s..s + 12]);
            }
        }
        assert_eq!(run_copies(&mem, &t.copies(), t.nbytes), want);
        for chunk in [1u64, 5, 12, 24, 25, 100] {
            let mut got = Vec::new();
            let mut at = 0;
            while at < t.nbytes {
                let len = chunk.min(t.nbytes - at);
                got.extend(run_copies(&mem, &t.copies_range(at, len), len));
                at += len;
            }
            assert_eq!(got, want, "chunks of {chunk}");
        }
        let null: Arc<[u64]> = Arc::from(vec![2000u64, 0, 3000]);
        assert!(!matrix_at(Role::A, &m, null, When::After, true).captured);
        let short: Arc<[u64]> = Arc::from(vec![2000u64]);
        assert!(!matrix_at(Role::A, &m, short, When::After, true).captured);
    }

    #[test]
    fn ranges_overlap_only_when_they_share_a_byte() {
        assert!(overlaps(0, 10, 9, 1));
        assert!(!overlaps(0, 10, 10, 5));
        assert!(!overlaps(0, 0, 0, 5));
    }
}
