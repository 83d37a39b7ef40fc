//! A row-parallel linear layer in miniature (`simrun --nproc-per-node W -- sim-probe ksplit`):
//! every rank multiplies its K-slice of A and B with `cublasGemmEx`, the partial products are
//! summed with `ncclAllReduce`, and the result is compared with the unsharded GEMM. On a GPU the
//! two differ in the last bits (a different accumulation order, and for BF16 extra roundings in
//! the all-reduce) while both stay within the analytic round-off bound; the simulated stack must
//! reproduce exactly that, or a tolerance model tested on it means nothing.

use core::ffi::{c_int, c_void};

use cuda_dyn::abi::cublas::*;
use cuda_dyn::abi::library_types::*;
use cuda_dyn::abi::nccl::*;
use cuda_dyn::cublas::*;
use cuda_dyn::nccl::*;
use sim_kernels::dtype::DType;

use crate::support::{ck, job, nc, stream, world, DevBuf};

const M: usize = 48;
const N: usize = 40;
const K: usize = 768;

/// Deterministic values in [-1, 1), the same on every rank.
fn values(seed: u64, count: usize, t: DType) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..count)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t.round((x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
        })
        .collect()
}

fn encode(t: DType, v: &[f64]) -> Vec<u8> {
    let mut b = vec![0u8; v.len() * t.size()];
    for (i, &x) in v.iter().enumerate() {
        t.store(&mut b, i, x);
    }
    b
}

/// `C = A·B` (column-major, no transposes) with `cublasGemmEx` on `A[:, k0..k0+kn]`,
/// `B[k0..k0+kn, :]`, inputs in `t_in`, output in `t_out`, FP32 compute.
#[allow(clippy::too_many_arguments)]
fn gemm(
    h: cublasHandle_t,
    a: &DevBuf,
    b: &DevBuf,
    c: &DevBuf,
    t_in: DType,
    t_out: DType,
    k0: usize,
    kn: usize,
) -> Result<(), String> {
    let (alpha, beta) = (1f32, 0f32);
    let cuda = |t: DType| {
        if t == DType::BF16 {
            CUDA_R_16BF
        } else {
            CUDA_R_32F
        }
    };
    // SAFETY: the buffers hold the matrices the dimensions describe.
    let status = unsafe {
        cublasGemmEx(
            h,
            CUBLAS_OP_N,
            CUBLAS_OP_N,
            M as c_int,
            N as c_int,
            kn as c_int,
            (&alpha as *const f32).cast(),
            a.at(k0 * M * t_in.size()),
            cuda(t_in),
            M as c_int,
            b.at(k0 * t_in.size()),
            cuda(t_in),
            K as c_int,
            (&beta as *const f32).cast(),
            c.ptr,
            cuda(t_out),
            M as c_int,
            CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT,
        )
    };
    if status != CUBLAS_STATUS_SUCCESS {
        return Err(format!("cublasGemmEx returned status {status}"));
    }
    Ok(())
}

pub fn ksplit(_: &[String]) -> Result<(), String> {
    let j = job()?;
    if !K.is_multiple_of(j.n) {
        return Err(format!(
            "K = {K} is not divisible by the world size {}",
            j.n
        ));
    }
    let comm = world(&j)?;
    let s = stream()?;
    let mut h: cublasHandle_t = std::ptr::null_mut();
    // SAFETY: out-pointer to a local handle.
    if unsafe { cublasCreate_v2(&mut h) } != CUBLAS_STATUS_SUCCESS {
        return Err("cublasCreate_v2 failed".into());
    }
    // SAFETY: a live handle and stream.
    if unsafe { cublasSetStream_v2(h, s) } != CUBLAS_STATUS_SUCCESS {
        return Err("cublasSetStream_v2 failed".into());
    }
    let mut report = Vec::new();
    for (t_in, t_out, nccl_t) in [
        (DType::F32, DType::F32, ncclFloat32),
        (DType::BF16, DType::BF16, ncclBfloat16),
    ] {
        let a = values(1, M * K, t_in);
        let b = values(2, K * N, t_in);
        // f64 reference and the magnitudes |A||B| the bound scales with.
        let mut exact = vec![0f64; M * N];
        let mut mag = vec![0f64; M * N];
        for col in 0..N {
            for row in 0..M {
                for kk in 0..K {
                    let p = a[kk * M + row] * b[col * K + kk];
                    exact[col * M + row] += p;
                    mag[col * M + row] += p.abs();
                }
            }
        }
        let (da, db) = (
            DevBuf::from_host(&encode(t_in, &a))?,
            DevBuf::from_host(&encode(t_in, &b))?,
        );
        let full = DevBuf::new(M * N * t_out.size())?;
        let part = DevBuf::new(M * N * t_out.size())?;
        gemm(h, &da, &db, &full, t_in, t_out, 0, K)?;
        let ks = K / j.n;
        gemm(h, &da, &db, &part, t_in, t_out, j.rank * ks, ks)?;
        nc!(ncclAllReduce(
            part.ptr as *const c_void,
            part.ptr,
            M * N,
            nccl_t,
            ncclSum,
            comm,
            s
        ));
        ck!(cuda_dyn::cudart::cudaStreamSynchronize(s));
        let (full_b, tp_b) = (full.read()?, part.read()?);
        let decode =
            |bytes: &[u8]| -> Vec<f64> { (0..M * N).map(|i| t_out.load(bytes, i)).collect() };
        let (full_v, tp_v) = (decode(&full_b), decode(&tp_b));

        // Deterministic bound (Higham §3.5) for each GEMM: gamma_k |A||B| in FP32 accumulation,
        // plus one rounding to the output type per partial result and per all-reduce hop.
        let u32_ = f32::EPSILON as f64 / 2.0;
        let u_out = t_out.epsilon() / 2.0;
        let gamma = K as f64 * u32_ / (1.0 - K as f64 * u32_);
        let mut worst = [0f64; 2];
        for i in 0..M * N {
            let acc = gamma * mag[i];
            let full_bound = acc + u_out * (exact[i].abs() + acc);
            let tp_bound = acc + (j.n as f64 + 1.0) * u_out * (mag[i] + acc) + f64::MIN_POSITIVE;
            let (ef, et) = ((full_v[i] - exact[i]).abs(), (tp_v[i] - exact[i]).abs());
            if ef > full_bound + f64::MIN_POSITIVE {
                return Err(format!(
                    "{t_out:?}: unsharded GEMM element {i} is off by {ef:e}, bound {full_bound:e}"
                ));
            }
            if et > tp_bound {
                return Err(format!(
                    "{t_out:?}: sharded GEMM + all-reduce element {i} is off by {et:e}, bound {tp_bound:e}"
                ));
            }
            worst[0] = worst[0].max(ef / full_bound.max(f64::MIN_POSITIVE));
            worst[1] = worst[1].max(et / tp_bound);
        }
        let differing = full_b
            .chunks(t_out.size())
            .zip(tp_b.chunks(t_out.size()))
            .filter(|(x, y)| x != y)
            .count();
        if differing == 0 {
            return Err(format!(
                "{t_out:?}: the K-sharded GEMM + all-reduce is bitwise equal to the unsharded GEMM: \
                 the simulated stack hides round-off differences a GPU shows"
            ));
        }
        report.push(format!(
            "{t_out:?}: {differing}/{} elements differ bitwise; worst error / bound: unsharded {:.2e}, sharded {:.2e}",
            M * N,
            worst[0],
            worst[1]
        ));
    }
    if j.rank == 0 {
        for line in report {
            println!("ksplit W={}: {line}", j.n);
        }
    }
    // SAFETY: handles created above; all work has completed.
    unsafe {
        cublasDestroy_v2(h);
        ncclCommDestroy(comm);
    }
    Ok(())
}
