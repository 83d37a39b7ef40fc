//! `traced gemm-ptrarrays`: pointer-array batched GEMMs (`cublasGemmBatchedEx`,
//! `cublas{S,D,H}gemmBatched`) whose arrays of matrix addresses are built on the host and
//! uploaded, as frameworks do, then three whose arrays the tracer must not trust:
//!
//! 1. `ex`: GemmBatchedEx f32, batch 3, B transposed, A with padded rows, beta 0.5; the three
//!    arrays in one buffer uploaded by one `cudaMemcpy`.
//! 2. `s`: SgemmBatched, batch 2, beta 0; each array uploaded from pinned memory by its own
//!    `cudaMemcpyAsync`.
//! 3. `d`: DgemmBatched, batch 2, A transposed, beta 0.25; one pageable `cudaMemcpyAsync`.
//! 4. `h`: HgemmBatched, batch 4, beta 0; one `cudaMemcpy`.
//! 5. `rewritten`: uploaded, then one byte of an A address rewritten on the device by
//!    `cudaMemsetAsync` (recorded, but not followed by the tracer's upload tracking): the op
//!    reads another matrix.
//! 6. `pinned-late`: uploaded from pinned memory while the stream is held by a host function;
//!    the program rewrites the pinned array (swaps two A addresses) before the copy runs.
//! 7. `device-built`: the arrays reach their place by a device-to-device copy.
//!
//! Cases 1-4 print `ptrarrays CASE A=.. B=.. C=.. D=..`: the operands as the program knows
//! them, packed per batch entry (`[batch, cols, rows]`, leading-dimension padding dropped), C
//! before the op and D after it (hex). The tests compare these with what was captured.

use core::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use cuda_dyn::abi::cublas::*;
use cuda_dyn::abi::cudart::*;
use cuda_dyn::abi::library_types::*;
use cuda_dyn::cublas::*;
use cuda_dyn::cudart::*;
use sim_kernels::dtype::DType;

use crate::capture::{pinned, values, Rng};
use crate::support::{ck, stream, DevBuf};

/// Fails unless the cuBLAS call succeeded.
macro_rules! bl {
    ($e:expr) => {{
        // SAFETY: a cuBLAS call with arguments prepared by the probe.
        let code = unsafe { $e };
        if code != CUBLAS_STATUS_SUCCESS {
            return Err(format!("{} returned status {code}", stringify!($e)));
        }
    }};
}

/// One operand of a batch: `rows x cols` column-major with leading dimension `ld`.
#[derive(Clone, Copy)]
struct Shape {
    rows: usize,
    cols: usize,
    ld: usize,
}

/// A batch's matrices of one operand: one allocation each, and their host bytes.
struct Entries {
    shape: Shape,
    dtype: DType,
    dev: Vec<DevBuf>,
    host: Vec<Vec<u8>>,
}

impl Entries {
    fn new(dtype: DType, shape: Shape, batch: usize, rng: &mut Rng) -> Result<Entries, String> {
        let mut dev = Vec::new();
        let mut host = Vec::new();
        for _ in 0..batch {
            let h = values(dtype, shape.ld * shape.cols, rng);
            dev.push(DevBuf::from_host(&h)?);
            host.push(h);
        }
        Ok(Entries {
            shape,
            dtype,
            dev,
            host,
        })
    }

    fn ptrs(&self) -> Vec<u64> {
        self.dev.iter().map(|d| d.ptr as u64).collect()
    }

    /// The entries packed as the tracer stores them, from `bytes` (one per entry).
    fn packed(&self, bytes: &[Vec<u8>]) -> Vec<u8> {
        let es = self.dtype.size();
        let Shape { rows, cols, ld } = self.shape;
        let mut out = Vec::new();
        for b in bytes {
            for c in 0..cols {
                out.extend_from_slice(&b[c * ld * es..(c * ld + rows) * es]);
            }
        }
        out
    }

    /// The entries' bytes as they are on the device now.
    fn read(&self) -> Result<Vec<Vec<u8>>, String> {
        self.dev.iter().map(DevBuf::read).collect()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn le(ptrs: &[u64]) -> Vec<u8> {
    ptrs.iter().flat_map(|p| p.to_le_bytes()).collect()
}

/// Prints what a captured case must hold (after the op finished).
fn report(
    case: &str,
    [a, b, c]: [&Entries; 3],
    c_before: &[Vec<u8>],
    s: cudaStream_t,
) -> Result<(), String> {
    ck!(cudaStreamSynchronize(s));
    println!(
        "ptrarrays {case} A={} B={} C={} D={}",
        hex(&a.packed(&a.host)),
        hex(&b.packed(&b.host)),
        hex(&c.packed(c_before)),
        hex(&c.packed(&c.read()?))
    );
    Ok(())
}

/// A host function that holds its stream until [`RELEASE`] is set.
unsafe extern "C" fn hold(_: *mut c_void) {
    while !RELEASE.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
}

static RELEASE: AtomicBool = AtomicBool::new(false);

fn shape(rows: usize, cols: usize, ld: usize) -> Shape {
    Shape { rows, cols, ld }
}

/// Entry point.
pub fn run() -> Result<(), String> {
    let s = stream()?;
    let mut h: cublasHandle_t = std::ptr::null_mut();
    bl!(cublasCreate_v2(&mut h));
    bl!(cublasSetStream_v2(h, s));
    let mut rng = Rng(13);
    captured(h, s, &mut rng)?;
    distrusted(h, s, &mut rng)?;
    ck!(cudaStreamSynchronize(s));
    bl!(cublasDestroy_v2(h));
    println!("traced gemm-ptrarrays OK");
    Ok(())
}

/// Cases 1-4.
fn captured(h: cublasHandle_t, s: cudaStream_t, rng: &mut Rng) -> Result<(), String> {
    // 1. GemmBatchedEx f32: m=3 n=2 k=4, A 3x4 (ld 4), B^T stored 2x4, C 3x2.
    let f = DType::F32;
    let (a, b, c) = (
        Entries::new(f, shape(3, 4, 4), 3, rng)?,
        Entries::new(f, shape(2, 4, 2), 3, rng)?,
        Entries::new(f, shape(3, 2, 3), 3, rng)?,
    );
    let arrays = DevBuf::from_host(&le(&[a.ptrs(), b.ptrs(), c.ptrs()].concat()))?;
    let c0 = c.host.clone();
    let (alpha, beta) = (1.5f32, 0.5f32);
    bl!(cublasGemmBatchedEx(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_T,
        3,
        2,
        4,
        (&alpha as *const f32).cast(),
        arrays.ptr.cast(),
        CUDA_R_32F,
        4,
        arrays.at(24).cast(),
        CUDA_R_32F,
        2,
        (&beta as *const f32).cast(),
        arrays.at(48).cast(),
        CUDA_R_32F,
        3,
        3,
        CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT
    ));
    report("ex", [&a, &b, &c], &c0, s)?;

    // 2. SgemmBatched: m=2 n=3 k=2, arrays from pinned memory, one async copy each.
    let (a, b, c) = (
        Entries::new(f, shape(2, 2, 2), 2, rng)?,
        Entries::new(f, shape(2, 3, 2), 2, rng)?,
        Entries::new(f, shape(2, 3, 2), 2, rng)?,
    );
    let mut bufs = Vec::new();
    for e in [&a, &b, &c] {
        let host = pinned(&le(&e.ptrs()))?;
        let d = DevBuf::new(16)?;
        ck!(cudaMemcpyAsync(
            d.ptr,
            host.cast(),
            16,
            cudaMemcpyHostToDevice,
            s
        ));
        bufs.push((d, host));
    }
    let c0 = c.host.clone();
    let (alpha, beta) = (1.0f32, 0.0f32);
    bl!(cublasSgemmBatched(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        2,
        3,
        2,
        &alpha,
        bufs[0].0.ptr.cast(),
        2,
        bufs[1].0.ptr.cast(),
        2,
        &beta,
        bufs[2].0.ptr.cast(),
        2,
        2
    ));
    report("s", [&a, &b, &c], &c0, s)?;
    for (_, host) in bufs {
        ck!(cudaFreeHost(host.cast()));
    }

    // 3. DgemmBatched: m=3 n=3 k=2, A^T stored 2x3, beta 0.25; one pageable async copy.
    let d64 = DType::F64;
    let (a, b, c) = (
        Entries::new(d64, shape(2, 3, 2), 2, rng)?,
        Entries::new(d64, shape(2, 3, 2), 2, rng)?,
        Entries::new(d64, shape(3, 3, 3), 2, rng)?,
    );
    let host = le(&[a.ptrs(), b.ptrs(), c.ptrs()].concat());
    let arrays = DevBuf::upload(&host, s)?;
    let c0 = c.host.clone();
    let (alpha, beta) = (2.0f64, 0.25f64);
    bl!(cublasDgemmBatched(
        h,
        CUBLAS_OP_T,
        CUBLAS_OP_N,
        3,
        3,
        2,
        &alpha,
        arrays.ptr.cast(),
        2,
        arrays.at(16).cast(),
        2,
        &beta,
        arrays.at(32).cast(),
        3,
        2
    ));
    report("d", [&a, &b, &c], &c0, s)?;

    // 4. HgemmBatched: m=2 n=2 k=3, batch 4.
    let f16 = DType::F16;
    let (a, b, c) = (
        Entries::new(f16, shape(2, 3, 2), 4, rng)?,
        Entries::new(f16, shape(3, 2, 3), 4, rng)?,
        Entries::new(f16, shape(2, 2, 2), 4, rng)?,
    );
    let arrays = DevBuf::from_host(&le(&[a.ptrs(), b.ptrs(), c.ptrs()].concat()))?;
    let c0 = c.host.clone();
    let (alpha, beta) = (half_bits(1.0), half_bits(0.0));
    bl!(cublasHgemmBatched(
        h,
        CUBLAS_OP_N,
        CUBLAS_OP_N,
        2,
        2,
        3,
        (&alpha as *const u16).cast(),
        arrays.ptr.cast(),
        2,
        arrays.at(32).cast(),
        3,
        (&beta as *const u16).cast(),
        arrays.at(64).cast(),
        2,
        4
    ));
    report("h", [&a, &b, &c], &c0, s)?;
    Ok(())
}

fn half_bits(v: f64) -> u16 {
    let mut b = [0u8; 2];
    DType::F16.store(&mut b, 0, v);
    u16::from_le_bytes(b)
}

/// A 2-entry f32 batch (m=n=k=2) whose A entries lie in one buffer, 0x100 bytes apart from
/// another valid matrix: `(buffer, [A0, A1], A1 + 0x100, B, C)`.
struct Distrusted {
    _abuf: DevBuf,
    a: [u64; 2],
    b: Entries,
    c: Entries,
}

impl Distrusted {
    fn new(rng: &mut Rng) -> Result<Distrusted, String> {
        let abuf = DevBuf::from_host(&values(DType::F32, 2048, rng))?;
        let base = abuf.ptr as u64;
        // An A1 whose address has bit 8 clear, so that setting it moves A1 by 0x100 bytes.
        let a1 = if (base + 0x1000) & 0x100 == 0 {
            base + 0x1000
        } else {
            base + 0x1100
        };
        Ok(Distrusted {
            _abuf: abuf,
            a: [base, a1],
            b: Entries::new(DType::F32, shape(2, 2, 2), 2, rng)?,
            c: Entries::new(DType::F32, shape(2, 2, 2), 2, rng)?,
        })
    }

    fn arrays(&self) -> Vec<u8> {
        le(&[self.a.to_vec(), self.b.ptrs(), self.c.ptrs()].concat())
    }

    /// GemmBatchedEx over the arrays at `arrays`.
    fn gemm(&self, h: cublasHandle_t, arrays: &DevBuf) -> Result<(), String> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        bl!(cublasGemmBatchedEx(
            h,
            CUBLAS_OP_N,
            CUBLAS_OP_N,
            2,
            2,
            2,
            (&alpha as *const f32).cast(),
            arrays.ptr.cast(),
            CUDA_R_32F,
            2,
            arrays.at(16).cast(),
            CUDA_R_32F,
            2,
            (&beta as *const f32).cast(),
            arrays.at(32).cast(),
            CUDA_R_32F,
            2,
            2,
            CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT
        ));
        Ok(())
    }
}

/// Cases 5-7: arrays the tracer must not take at their uploaded word.
fn distrusted(h: cublasHandle_t, s: cudaStream_t, rng: &mut Rng) -> Result<(), String> {
    // 5. One byte of A1's address rewritten on the device (bit 8 set: A1 + 0x100).
    let x = Distrusted::new(rng)?;
    let arrays = DevBuf::from_host(&x.arrays())?;
    let byte = ((x.a[1] >> 8) & 0xff) | 1;
    ck!(cudaMemsetAsync(arrays.at(8 + 1), byte as i32, 1, s));
    x.gemm(h, &arrays)?;
    ck!(cudaStreamSynchronize(s));

    // 6. The pinned source rewritten (A0 and A1 swapped) before its copy ran.
    let x = Distrusted::new(rng)?;
    let bytes = x.arrays();
    let host = pinned(&bytes)?;
    let arrays = DevBuf::new(bytes.len())?;
    RELEASE.store(false, Ordering::Release);
    ck!(cudaLaunchHostFunc(s, Some(hold), std::ptr::null_mut()));
    ck!(cudaMemcpyAsync(
        arrays.ptr,
        host.cast_const().cast(),
        bytes.len(),
        cudaMemcpyHostToDevice,
        s
    ));
    // SAFETY: the pinned buffer holds `bytes.len()` bytes; the copy has not run yet (the
    // stream is held), which is the point.
    unsafe {
        std::ptr::copy_nonoverlapping(x.a[1].to_le_bytes().as_ptr(), host, 8);
        std::ptr::copy_nonoverlapping(x.a[0].to_le_bytes().as_ptr(), host.add(8), 8);
    }
    x.gemm(h, &arrays)?;
    RELEASE.store(true, Ordering::Release);
    ck!(cudaStreamSynchronize(s));
    ck!(cudaFreeHost(host.cast()));

    // 7. The arrays put in place by a device-to-device copy.
    let x = Distrusted::new(rng)?;
    let staged = DevBuf::from_host(&x.arrays())?;
    let arrays = DevBuf::new(staged.bytes)?;
    ck!(cudaMemcpyAsync(
        arrays.ptr,
        staged.ptr,
        staged.bytes,
        cudaMemcpyDeviceToDevice,
        s
    ));
    x.gemm(h, &arrays)?;
    ck!(cudaStreamSynchronize(s));
    Ok(())
}

/// `traced uploads [N] [BYTES]`: N synchronous host-to-device copies of BYTES (default 20000 of
/// 1024) into one buffer, timed; prints `uploads N BYTES NS_PER_COPY`. For
/// scripts/bench-uploads.sh: what remembering small uploads (uploads.rs) costs a copy.
pub fn uploads(args: &[String]) -> Result<(), String> {
    let arg = |i: usize, d: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let (n, bytes) = (arg(1, 20_000), arg(2, 1024));
    let host: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
    let dev = DevBuf::new(bytes)?;
    let t = std::time::Instant::now();
    for _ in 0..n {
        ck!(cudaMemcpy(
            dev.ptr,
            host.as_ptr().cast(),
            bytes,
            cudaMemcpyHostToDevice
        ));
    }
    let ns = t.elapsed().as_nanos() as f64 / n.max(1) as f64;
    println!("uploads {n} {bytes} {ns:.0}");
    Ok(())
}
