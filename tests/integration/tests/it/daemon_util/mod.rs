//! Shared by the daemon_* tests: a private temporary directory, a daemon on it, records with
//! known bytes, and reading a store back.

#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use ttrace_format::dtype::DType;
use ttrace_format::reader::Segment;
use ttrace_format::record::{
    packed_strides, CollectiveKind, CollectiveOp, GapOp, GapReason, GemmOp, Op, Record, Role,
    Tensor,
};
use ttrace_format::store::{segment_path, Frame};
use ttraced::{Config, Daemon, Handle};

pub use integration_tests::TempDir;

/// A daemon on `dir/sock/ttraced.sock` writing `dir/store`, two compression threads.
pub fn start(dir: &Path) -> Handle {
    let mut c = Config::new(dir.join("sock").join("ttraced.sock"), dir.join("store"));
    c.threads = 2;
    c.level = 3;
    Daemon::start(c).expect("daemon starts")
}

/// Deterministic bytes that look like BF16 activations (varied mantissas, few exponents).
pub fn bf16_bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let exp = 120 + (x >> 29) as u16; // 2^-7 .. 2^0
            let v: u16 = ((x & 1) as u16) << 15 | exp << 7 | ((x >> 8) & 0x7f) as u16;
            v.to_le_bytes()
        })
        .collect()
}

pub fn tensor(role: Role, dtype: DType, data: &[u8]) -> Tensor {
    let shape = vec![(data.len() / dtype.size()) as u64];
    Tensor {
        role,
        dtype,
        strides: packed_strides(&shape),
        shape,
        ptr: 0x7f00_0000_0000,
        nbytes: data.len() as u64,
        captured: true,
        crc32: crc32fast::hash(data),
    }
}

fn base(rank: u32, step: u64, seq: u64, api: &str, op: Op, tensors: Vec<Tensor>) -> Record {
    Record {
        rank,
        step,
        seq,
        api: api.into(),
        op,
        stream: 0x55,
        device: 0,
        thread: 1234,
        nvtx: vec!["train".into()],
        kernels_before: vec!["fill_kernel".into()],
        tensors,
        t_call_ns: 1_000 + seq,
        t_done_ns: 2_000 + seq,
    }
}

/// A GEMM record whose captured tensors are `data` (A, B, D in BF16).
pub fn gemm(rank: u32, step: u64, seq: u64, data: &[&[u8]]) -> Record {
    let roles = [Role::A, Role::B, Role::D];
    let tensors = data
        .iter()
        .zip(roles)
        .map(|(d, r)| tensor(r, DType::BF16, d))
        .collect();
    let op = Op::Gemm(Box::new(GemmOp::plain(4, 4, 4, 14)));
    base(rank, step, seq, "cublasGemmEx", op, tensors)
}

/// An all-reduce record in F32 with input and output.
pub fn allreduce(rank: u32, step: u64, seq: u64, comm: u64, input: &[u8], output: &[u8]) -> Record {
    let op = Op::Collective(CollectiveOp {
        kind: CollectiveKind::AllReduce,
        count: (input.len() / 4) as u64,
        nccl_type: 7,
        redop: Some(0),
        root_or_peer: None,
        comm,
        comm_rank: rank,
        comm_size: 2,
        sendbuff: 0x1000,
        recvbuff: 0x2000,
        group: 0,
        premul: None,
    });
    let tensors = vec![
        tensor(Role::Input, DType::F32, input),
        tensor(Role::Output, DType::F32, output),
    ];
    base(rank, step, seq, "ncclAllReduce", op, tensors)
}

/// A gap record (no bytes).
pub fn gap(rank: u32, step: u64, seq: u64) -> Record {
    let op = Op::Gap(GapOp {
        reason: GapReason::RingFull,
        skipped_api: "cublasGemmEx".into(),
        bytes: 1 << 20,
        detail: "test".into(),
    });
    base(rank, step, seq, "cublasGemmEx", op, vec![])
}

/// Every frame of the segment of (rank, step), failing on any scan issue.
pub fn frames(store: &Path, rank: u32, step: u64) -> Vec<Frame> {
    let path = segment_path(store, rank, step);
    let r = Segment::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!((r.rank, r.step), (rank, step));
    if let Some(i) = r.issues().iter().find(|i| i.kind.loses_data()) {
        panic!("{}: {i}", path.display());
    }
    let mut out = Vec::new();
    for f in r.into_frames() {
        out.push(f.unwrap_or_else(|i| panic!("{}: {i:?}", path.display())));
    }
    out
}

/// Waits for the daemon to finish with the connected clients, then finalises.
pub fn finalize(h: Handle) -> ttraced::Summary {
    h.finalize(Some(0), Duration::from_secs(5))
        .expect("finalize")
}
