//! Writes a synthetic store of a given size for reading benchmarks (scripts/bench-read.sh),
//! and extracts a store's compressed tensor bytes as one zstd stream (what `zstd -d` is timed
//! on).
//!
//! ```text
//! synth_store write DIR MIB [RANKS STEPS LEVEL]   a store of about MIB MiB on disk
//! synth_store zst DIR FILE                         every zstd blob of DIR, concatenated
//! ```
//!
//! Tensors look like training data: BF16 activations and F32 results with a per-tensor scale,
//! normal-ish values (sum of uniforms), so they compress like real ones (the exponent bytes
//! well, the mantissa bytes hardly).

use std::io::Write;
use std::path::Path;

use ttrace_format::codec::Codec;
use ttrace_format::dtype::DType;
use ttrace_format::reader::Store;
use ttrace_format::record::{packed_strides, GemmOp, Op, Record, Role, Tensor};
use ttrace_format::store::{Blob, Manifest, SegmentWriter, FORMAT_MAJOR, FORMAT_MINOR};

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Roughly N(0, 1): a sum of four uniforms, centred and scaled.
    fn normal(&mut self) -> f32 {
        let r = self.next();
        let u = |s: u32| ((r >> s) & 0xffff) as f32 / 65535.0;
        (u(0) + u(16) + u(32) + u(48) - 2.0) * 1.732
    }
}

fn values(dtype: DType, n: usize, scale: f32, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size());
    for _ in 0..n {
        let v = rng.normal() * scale;
        match dtype {
            DType::BF16 => out.extend(half::bf16::from_f32(v).to_le_bytes()),
            _ => out.extend(v.to_le_bytes()),
        }
    }
    out
}

fn tensor(role: Role, dtype: DType, shape: Vec<u64>, data: &[u8]) -> Tensor {
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

fn write(dir: &Path, mib: u64, ranks: u32, steps: u64, level: i32) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let per_segment = (mib << 20) / (ranks as u64 * steps);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut scratch = Vec::new();
    for rank in 0..ranks {
        for step in 0..steps {
            let mut w = SegmentWriter::create(dir, rank, step).map_err(std::io::Error::other)?;
            let mut written = 0u64;
            let mut seq = 0u64;
            while written < per_segment {
                // A GEMM of a 1024-wide layer: A [k=1024, m] BF16, B [n, k] BF16, D [n, m] F32.
                let (m, k, n) = (1024u64, 1024u64, 256 << (seq % 3));
                let a = values(DType::BF16, (m * k) as usize, 0.02, &mut rng);
                let b = values(DType::BF16, (k * n) as usize, 1.0, &mut rng);
                let d = values(DType::F32, (m * n) as usize, 0.6, &mut rng);
                let tensors = vec![
                    tensor(Role::A, DType::BF16, vec![k, m], &a),
                    tensor(Role::B, DType::BF16, vec![n, k], &b),
                    tensor(Role::D, DType::F32, vec![n, m], &d),
                ];
                let blobs = [(&a, 2), (&b, 2), (&d, 4)]
                    .iter()
                    .map(|(x, e)| Blob::encode(x, *e, level, &mut scratch))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(std::io::Error::other)?;
                let record = Record {
                    rank,
                    step,
                    seq,
                    api: "cublasLtMatmul".into(),
                    op: Op::Gemm(Box::new(GemmOp {
                        transa: 1,
                        lda: k,
                        c_type: 0,
                        d_type: 0,
                        ..GemmOp::plain(m, n, k, 14)
                    })),
                    stream: 0x1000,
                    device: rank as i32,
                    thread: 1,
                    nvtx: vec!["forward".into(), format!("layers.{}.mlp.fc1", seq / 3)],
                    kernels_before: vec![],
                    tensors,
                    t_call_ns: seq,
                    t_done_ns: seq + 1,
                };
                written += w.append(&record, &blobs).map_err(std::io::Error::other)?;
                seq += 1;
            }
            w.finish().map_err(std::io::Error::other)?;
        }
    }
    let manifest = Manifest {
        format_major: FORMAT_MAJOR,
        format_minor: FORMAT_MINOR,
        run_id: "synthetic".into(),
        created_unix_ns: 0,
        command: vec!["synth_store".into(), "write".into()],
        cwd: String::new(),
        env: Default::default(),
        config: Default::default(),
        ranks: Vec::new(),
        comms: Vec::new(),
        finalized: true,
        exit_code: Some(0),
        job: None,
        lost: Vec::new(),
    };
    manifest.write(dir).map_err(std::io::Error::other)
}

/// Concatenates every zstd-coded blob of the store (a valid multi-frame zstd stream).
fn zst(dir: &Path, file: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let store = Store::open(dir)?;
    let mut out = std::io::BufWriter::new(std::fs::File::create(file)?);
    let (mut blobs, mut bytes) = (0u64, 0u64);
    for info in store.segments() {
        let seg = store.open_segment(info.rank, info.step)?;
        for i in 0..seg.len() {
            let v = seg.read(i).map_err(|e| e.to_string())?;
            for t in 0..v.record.tensors.len() {
                if !v.is_captured(t) {
                    continue;
                }
                let (codec, stored) = v.stored(t)?;
                if codec != Codec::Raw {
                    out.write_all(stored)?;
                    blobs += 1;
                    bytes += stored.len() as u64;
                }
            }
        }
    }
    out.flush()?;
    eprintln!("{blobs} blobs, {bytes} bytes");
    Ok(())
}

/// Decodes every tensor of the store (checksums included), timing the phases.
fn decode(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let store = Store::open(dir)?;
    let (mut scratch, mut out) = (Vec::new(), Vec::new());
    let t0 = std::time::Instant::now();
    let mut bytes = 0u64;
    for info in store.segments() {
        let seg = store.open_segment(info.rank, info.step)?;
        for i in 0..seg.len() {
            let v = seg.read(i).map_err(|e| e.to_string())?;
            for t in 0..v.record.tensors.len() {
                v.tensor_bytes_into(t, &mut scratch, &mut out)?;
                bytes += out.len() as u64;
            }
        }
    }
    let s = t0.elapsed().as_secs_f64();
    eprintln!(
        "decoded {bytes} bytes in {s:.3} s: {:.0} MB/s",
        bytes as f64 / s / 1e6
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    let usage = "usage: synth_store write DIR MIB [RANKS STEPS LEVEL] | synth_store zst DIR FILE";
    match a.get(1).map(String::as_str) {
        Some("write") if a.len() >= 4 => {
            let num = |i: usize, d: u64| a.get(i).and_then(|v| v.parse().ok()).unwrap_or(d);
            write(
                Path::new(&a[2]),
                a[3].parse()?,
                num(4, 4) as u32,
                num(5, 4),
                num(6, 1) as i32,
            )?;
            Ok(())
        }
        Some("zst") if a.len() == 4 => zst(Path::new(&a[2]), Path::new(&a[3])),
        Some("decode") if a.len() == 3 => decode(Path::new(&a[2])),
        _ => Err(usage.into()),
    }
}
