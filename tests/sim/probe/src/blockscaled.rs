//! `traced gemm-blockscaled [corrupt]`: an MXFP8 `cublasLtMatmul` (E4M3 A^T and B with
//! VEC32_UE8M0 block scales in cuBLASLt's tiled layout, D in BF16). With `corrupt`, one of A's
//! scales is rewritten on the device (`cudaMemsetAsync`, which no copy hook sees) after its
//! upload: a silent bug inside the GEMM's inputs. Prints `blockscaled A=.. SA=.. B=.. SB=..
//! D=..` (hex, as uploaded and as computed) for the tests.

use cuda_dyn::abi::cublas::*;
use cuda_dyn::abi::cublaslt::*;
use cuda_dyn::abi::library_types::*;
use cuda_dyn::cublaslt::*;
use cuda_dyn::cudart::*;
use sim_kernels::dtype::DType;

use crate::capture::{desc, layout, set, up, values, Rng};
use crate::support::{ck, stream, DevBuf};

/// Fails unless the cuBLASLt call succeeded.
macro_rules! bl {
    ($e:expr) => {{
        // SAFETY: a cuBLASLt call with arguments prepared by the probe.
        let code = unsafe { $e };
        if code != CUBLAS_STATUS_SUCCESS {
            return Err(format!("{} returned status {code}", stringify!($e)));
        }
    }};
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// UE8M0 scales for an operand with `outer` rows of `k` values: every byte of the tiled
/// buffer (padding included) a power of two near 1.
fn scales(outer: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let len = outer.div_ceil(128) * 128 * k.div_ceil(32).div_ceil(4) * 4;
    (0..len)
        .map(|_| (124.0 + (rng.next() + 1.0) * 3.5) as u8)
        .collect()
}

/// Entry point.
pub fn run(args: &[String]) -> Result<(), String> {
    let corrupt = args.get(1).is_some_and(|a| a == "corrupt");
    let s = stream()?;
    let mut rng = Rng(29);
    let (m, n, k) = (8usize, 4usize, 64usize);
    let (ha, hb) = (
        values(DType::E4M3, k * m, &mut rng),
        values(DType::E4M3, k * n, &mut rng),
    );
    let (hsa, hsb) = (scales(m, k, &mut rng), scales(n, k, &mut rng));
    let (a, b, sa, sb) = (up(&ha)?, up(&hb)?, up(&hsa)?, up(&hsb)?);
    if corrupt {
        // Row 3's second K-block of A (tile offset 3 * 16 + 1): 16 times larger.
        ck!(cudaMemsetAsync(
            sa.at(3 * 16 + 1),
            (hsa[49] + 4) as i32,
            1,
            s
        ));
    }
    let dbuf = DevBuf::new(m * n * 2)?;
    let mut lt: cublasLtHandle_t = std::ptr::null_mut();
    bl!(cublasLtCreate(&mut lt));
    let d = desc(CUBLAS_COMPUTE_32F, CUDA_R_32F)?;
    set(d, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T as i32)?;
    set(
        d,
        CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
        CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0,
    )?;
    set(
        d,
        CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
        CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0,
    )?;
    set(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, sa.ptr as u64)?;
    set(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, sb.ptr as u64)?;
    let la = layout(CUDA_R_8F_E4M3, k as u64, m as u64, k as i64, 1, 0)?;
    let lb = layout(CUDA_R_8F_E4M3, k as u64, n as u64, k as i64, 1, 0)?;
    let ld = layout(CUDA_R_16BF, m as u64, n as u64, m as i64, 1, 0)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    bl!(cublasLtMatmul(
        lt,
        d,
        (&alpha as *const f32).cast(),
        a.ptr,
        la,
        b.ptr,
        lb,
        (&beta as *const f32).cast(),
        dbuf.ptr,
        ld,
        dbuf.ptr,
        ld,
        std::ptr::null(),
        std::ptr::null_mut(),
        0,
        s
    ));
    let out = dbuf.download(s)?;
    bl!(cublasLtDestroy(lt));
    println!(
        "blockscaled A={} SA={} B={} SB={} D={}",
        hex(&ha),
        hex(&hsa),
        hex(&hb),
        hex(&hsb),
        hex(&out)
    );
    ck!(cudaStreamSynchronize(s));
    println!("traced gemm-blockscaled OK");
    Ok(())
}
