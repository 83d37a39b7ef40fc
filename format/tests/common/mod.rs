//! Builds small stores with `SegmentWriter` for the reader and recovery tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ttrace_format::config::CaptureConfig;
use ttrace_format::dtype::DType;
use ttrace_format::record::{
    packed_strides, CollectiveKind, CollectiveOp, CopyDirection, GapOp, GapReason, GemmOp,
    MemcpyOp, Op, Record, Role, Tensor,
};
use ttrace_format::store::{Blob, CommEntry, Manifest, RankInfo, SegmentWriter};

/// A private scratch directory, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "ttrace-fmt-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        Scratch(d)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A small deterministic generator (xorshift64*), so failures reproduce.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Bytes that look like a tensor of `dtype` (smooth values compress like activations).
pub fn tensor_bytes(dtype: DType, elements: usize, salt: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(elements * dtype.size());
    for i in 0..elements {
        let v = ((i as f64 + salt as f64) * 0.37).sin() * 3.0;
        match dtype {
            DType::F32 => out.extend((v as f32).to_le_bytes()),
            DType::F16 => out.extend(half::f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend(half::bf16::from_f64(v).to_le_bytes()),
            DType::F8_E4M3 => out.push(float8::F8E4M3::from_f64(v).to_bits()),
            DType::F8_E5M2 => out.push(float8::F8E5M2::from_f64(v).to_bits()),
            DType::U8 => out.push((i as u64 ^ salt) as u8),
            DType::I32 => out.extend(((i as i64 - 7) as i32).to_le_bytes()),
            other => out.extend(std::iter::repeat_n(0u8, other.size())),
        }
    }
    out
}

fn tensor(role: Role, dtype: DType, shape: Vec<u64>, data: &[u8], captured: bool) -> Tensor {
    Tensor {
        role,
        dtype,
        strides: packed_strides(&shape),
        shape,
        ptr: 0x7f00_0000_0000,
        nbytes: data.len() as u64,
        captured,
        crc32: if captured { crc32fast::hash(data) } else { 0 },
    }
}

/// One record and the bytes of its captured tensors.
pub struct Made {
    pub record: Record,
    pub data: Vec<Vec<u8>>,
}

fn base(rank: u32, step: u64, seq: u64, api: &str, op: Op, tensors: Vec<Tensor>) -> Record {
    Record {
        rank,
        step,
        seq,
        api: api.into(),
        op,
        stream: 0x5000 + rank as u64,
        device: rank as i32,
        thread: 100 + rank as u64,
        nvtx: vec!["train".into(), format!("layers.{}.mlp", seq % 3)],
        kernels_before: vec![],
        tensors,
        t_call_ns: 1_000 + seq,
        t_done_ns: 2_000 + seq,
    }
}

/// The records of (rank, step): a BF16 GEMM, an FP8 all-reduce, an F16 GEMM with a size-capped
/// input, an E5M2 all-gather, a copy, and a gap, repeated to `n` records.
pub fn records(rank: u32, step: u64, n: u64, world: u32) -> Vec<Made> {
    let mut out = Vec::new();
    for seq in 0..n {
        let salt = seq * 31 + step * 7 + rank as u64;
        let made = match seq % 6 {
            0 | 2 => {
                let (dt, m, k, nn) = if seq % 6 == 0 {
                    (DType::BF16, 8u64, 16u64, 4u64)
                } else {
                    (DType::F16, 4, 8, 6)
                };
                let a = tensor_bytes(dt, (m * k) as usize, salt);
                let b = tensor_bytes(dt, (k * nn) as usize, salt + 1);
                let d = tensor_bytes(DType::F32, (m * nn) as usize, salt + 2);
                let b_captured = seq % 6 == 0;
                let mut tensors = vec![
                    tensor(Role::A, dt, vec![k, m], &a, true),
                    tensor(Role::B, dt, vec![nn, k], &b, b_captured),
                    tensor(Role::D, DType::F32, vec![nn, m], &d, true),
                ];
                if !b_captured {
                    tensors[1].crc32 = 0;
                }
                let op = Op::Gemm(Box::new(GemmOp {
                    c_type: 0,
                    d_type: 0,
                    ..GemmOp::plain(m, nn, k, if dt == DType::BF16 { 14 } else { 2 })
                }));
                let data = if b_captured {
                    vec![a, b, d]
                } else {
                    vec![a, d]
                };
                Made {
                    record: base(rank, step, seq, "cublasGemmEx", op, tensors),
                    data,
                }
            }
            1 | 3 => {
                let (dt, kind, api, code) = if seq % 6 == 1 {
                    (
                        DType::F8_E4M3,
                        CollectiveKind::AllReduce,
                        "ncclAllReduce",
                        10,
                    )
                } else {
                    (
                        DType::F8_E5M2,
                        CollectiveKind::AllGather,
                        "ncclAllGather",
                        11,
                    )
                };
                let count = 24u64;
                let input = tensor_bytes(dt, count as usize, salt);
                let outn = if kind == CollectiveKind::AllGather {
                    count * world as u64
                } else {
                    count
                };
                let output = tensor_bytes(dt, outn as usize, salt + 5);
                let op = Op::Collective(CollectiveOp {
                    kind,
                    count,
                    nccl_type: code,
                    redop: Some(0),
                    root_or_peer: None,
                    comm: 0xC0FFEE,
                    comm_rank: rank,
                    comm_size: world,
                    sendbuff: 0x1000,
                    recvbuff: 0x2000,
                    group: 0,
                    premul: None,
                });
                let tensors = vec![
                    tensor(Role::Input, dt, vec![count], &input, true),
                    tensor(Role::Output, dt, vec![outn], &output, true),
                ];
                Made {
                    record: base(rank, step, seq, api, op, tensors),
                    data: vec![input, output],
                }
            }
            4 => {
                let bytes = tensor_bytes(DType::U8, 100, salt);
                let op = Op::Memcpy(MemcpyOp {
                    direction: CopyDirection::HostToDevice,
                    kind: 1,
                    dst: 0x3000,
                    src: 0x4000,
                    width: 100,
                    height: 1,
                    dpitch: 100,
                    spitch: 100,
                });
                let tensors = vec![tensor(Role::Dst, DType::U8, vec![100], &bytes, true)];
                Made {
                    record: base(rank, step, seq, "cudaMemcpyAsync", op, tensors),
                    data: vec![bytes],
                }
            }
            _ => {
                let op = Op::Gap(GapOp {
                    reason: GapReason::RingFull,
                    skipped_api: "cublasGemmEx".into(),
                    bytes: 4096,
                    detail: "ring full".into(),
                });
                Made {
                    record: base(rank, step, seq, "cublasGemmEx", op, vec![]),
                    data: vec![],
                }
            }
        };
        out.push(made);
    }
    out
}

/// Writes (rank, step)'s records with `SegmentWriter`; `finish` writes the index.
pub fn write_segment(run: &Path, made: &[Made], rank: u32, step: u64, finish: bool) {
    let mut w = SegmentWriter::create(run, rank, step).expect("create segment");
    let mut scratch = Vec::new();
    for m in made {
        let captured: Vec<&Tensor> = m.record.tensors.iter().filter(|t| t.captured).collect();
        let blobs: Vec<Blob> = m
            .data
            .iter()
            .zip(captured)
            .map(|(d, t)| Blob::encode(d, t.dtype.size(), 3, &mut scratch).expect("encode"))
            .collect();
        w.append(&m.record, &blobs).expect("append");
    }
    if finish {
        w.finish().expect("finish");
    } else {
        w.flush().expect("flush");
    }
}

/// A whole store: `ranks` ranks x `steps` steps of `n` records, with a finalised manifest.
/// Returns every record by (rank, step).
pub fn write_store(run: &Path, ranks: u32, steps: u64, n: u64) -> BTreeMap<(u32, u64), Vec<Made>> {
    let mut all = BTreeMap::new();
    let mut infos = Vec::new();
    for rank in 0..ranks {
        let mut info = RankInfo {
            rank,
            pid: 4000 + rank,
            hostname: "node0".into(),
            local_rank: rank,
            world_size: ranks,
            records: 0,
            gaps: 0,
            bytes_raw: 0,
            bytes_stored: 0,
            clean_exit: true,
            taken: 0,
            unpublished: 0,
            unpublished_after: None,
            bytes_deduped: 0,
            warnings: Vec::new(),
        };
        for step in 0..steps {
            let made = records(rank, step, n, ranks);
            write_segment(run, &made, rank, step, true);
            info.records += made.len() as u64;
            info.gaps += made
                .iter()
                .filter(|m| matches!(m.record.op, Op::Gap(_)))
                .count() as u64;
            info.bytes_raw += made
                .iter()
                .flat_map(|m| &m.data)
                .map(|d| d.len() as u64)
                .sum::<u64>();
            all.insert((rank, step), made);
        }
        infos.push(info);
    }
    let m = Manifest {
        format_major: 1,
        format_minor: 0,
        run_id: "test-run".into(),
        created_unix_ns: 1,
        command: vec![
            "python".into(),
            "train.py".into(),
            "--tp".into(),
            "2".into(),
        ],
        cwd: "/work".into(),
        env: BTreeMap::from([
            ("RANK".into(), "0".into()),
            ("TTRACE_APIS".into(), "gemm".into()),
        ]),
        config: CaptureConfig::default(),
        ranks: infos,
        comms: vec![CommEntry {
            key: 0xC0FFEE,
            size: ranks,
            members: (0..ranks).map(Some).collect(),
            parent: None,
            color: None,
            api: "ncclCommInitRank".into(),
        }],
        finalized: true,
        exit_code: Some(0),
        job: None,
        lost: Vec::new(),
    };
    m.write(run).expect("manifest");
    all
}

/// Whether a seq hint names `seq`.
pub fn covers(hint: Option<ttrace_format::reader::SeqHint>, seq: u64) -> bool {
    use ttrace_format::reader::SeqHint;
    match hint {
        Some(SeqHint::Exact(s)) => s == seq,
        Some(SeqHint::Between(a, b)) => a <= seq && seq <= b,
        Some(SeqHint::AtLeast(a)) => seq >= a,
        Some(SeqHint::Unknown) | None => true,
    }
}
