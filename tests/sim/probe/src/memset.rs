//! `traced memset`: every `cudaMemset*` spelling, in a fixed order the capture test
//! (tests/integration/tests/it/intercept_memset.rs) expects, each result read back and checked:
//!
//! 1. an upload of [`pattern`] 1 (4096 bytes) into `a`, then `cudaMemsetAsync(a, 0, 4096)`
//!    on the probe's stream;
//! 2. `cudaMemset2D` of 40 x 10 bytes at pitch 64 to 0xab (legacy stream);
//! 3. `cudaMemset` of a fresh buffer to 0, then `cudaMemset3DAsync_ptsz` of 40 x 10 x 2 bytes (pitch 64, 12 rows a slice) to 0x1234
//!    (the byte 0x34) on stream 0, i.e. the per-thread default stream;
//! 4. `cudaMemset_ptds(a, 7, 0)`: nothing written (not recorded);
//! 5. `cudaMemset` on a host pointer: an error, returned to the program (not recorded);
//! 6. a `cublasSgemm_v2` whose A is the zeroed `a` (its D is zero: checked);
//!
//! then the last line prints the error code of 5, which the test compares untraced.
//!
//! `traced memset-graph`: a `cudaMemsetAsync` of 256 bytes to 0x5a captured into a CUDA graph
//! and the graph launched twice, a download after each launch checking the bytes.

use core::ffi::c_int;

use cuda_dyn::abi::cublas::*;
use cuda_dyn::abi::cudart::*;
use cuda_dyn::cublas::*;
use cuda_dyn::cudart::*;

use crate::capture::pattern;
use crate::support::{ck, stream, DevBuf};

/// Rows of a slice of the 3-D memset's allocation (more than the 10 it sets).
const YSIZE: usize = 12;

pub fn run() -> Result<(), String> {
    let s = stream()?;
    // 1. Zero an uploaded buffer.
    let a = DevBuf::upload(&pattern(1, 4096), s)?;
    ck!(cudaMemsetAsync(a.ptr, 0, 4096, s));
    if a.download(s)? != vec![0u8; 4096] {
        return Err("cudaMemsetAsync left nonzero bytes".into());
    }
    // 2. Pitched 2-D: the padding keeps the uploaded bytes.
    let before = pattern(2, 64 * 10);
    let b = DevBuf::upload(&before, s)?;
    ck!(cudaStreamSynchronize(s));
    ck!(cudaMemset2D(b.ptr, 64, 0xab, 40, 10));
    let got = b.read()?;
    for (i, (&g, &w)) in got.iter().zip(&before).enumerate() {
        let want = if i % 64 < 40 { 0xab } else { w };
        if g != want {
            return Err(format!("cudaMemset2D: byte {i} is {g:#x}, not {want:#x}"));
        }
    }
    // 3. 3-D on the per-thread default stream: the low byte of the value is set.
    let c = DevBuf::new(64 * YSIZE * 2)?;
    ck!(cudaMemset(c.ptr, 0, c.bytes));
    let p = cudaPitchedPtr {
        ptr: c.ptr,
        pitch: 64,
        xsize: 40,
        ysize: YSIZE,
    };
    let e = cudaExtent {
        width: 40,
        height: 10,
        depth: 2,
    };
    ck!(cudaMemset3DAsync_ptsz(p, 0x1234, e, std::ptr::null_mut()));
    ck!(cudaStreamSynchronize(cudaStreamPerThread));
    let got = c.read()?;
    let set = |i: usize| i % 64 < 40 && (i / 64) % YSIZE < 10;
    let wrong = (0..got.len()).find(|&i| got[i] != if set(i) { 0x34 } else { 0 });
    if let Some(i) = wrong {
        return Err(format!("cudaMemset3DAsync_ptsz: byte {i} is {:#x}", got[i]));
    }
    // 4. Nothing to set.
    ck!(cudaMemset_ptds(a.ptr, 7, 0));
    // 5. Not device memory: the runtime's error reaches the program.
    let mut host = vec![1u8; 16];
    // SAFETY: an invalid call the runtime refuses.
    let refused = unsafe { cudaMemset(host.as_mut_ptr().cast(), 0, host.len()) };
    if refused == cudaSuccess {
        return Err("cudaMemset of host memory succeeded".into());
    }
    // SAFETY: clears the error just made.
    unsafe { cudaGetLastError() };
    // 6. A GEMM reads the zeroed buffer as its A (4 x 4 f32), B is ones: D is zero.
    zero_gemm(&a, s)?;
    ck!(cudaDeviceSynchronize());
    println!("traced memset OK (host memset: {refused})");
    Ok(())
}

/// `traced memset-graph` (see the module's documentation).
pub fn graph() -> Result<(), String> {
    let s = stream()?;
    let a = DevBuf::upload(&pattern(1, 4096), s)?;
    ck!(cudaStreamSynchronize(s));
    ck!(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    ck!(cudaMemsetAsync(a.ptr, 0x5a, 256, s));
    let mut g: cudaGraph_t = std::ptr::null_mut();
    ck!(cudaStreamEndCapture(s, &mut g));
    let mut exec: cudaGraphExec_t = std::ptr::null_mut();
    ck!(cudaGraphInstantiate(&mut exec, g, 0));
    for launch in 0..2 {
        ck!(cudaGraphLaunch(exec, s));
        let got = a.download(s)?;
        if got[..256].iter().any(|&b| b != 0x5a) || got[256..] != pattern(1, 4096)[256..] {
            return Err(format!(
                "launch {launch}: the graph's memset set other bytes"
            ));
        }
    }
    ck!(cudaGraphExecDestroy(exec));
    ck!(cudaGraphDestroy(g));
    println!("traced memset-graph OK");
    Ok(())
}

/// `D = A B` with the zeroed `a` as A (4 x 4, f32).
fn zero_gemm(a: &DevBuf, s: cudaStream_t) -> Result<(), String> {
    let ones: Vec<u8> = (0..16).flat_map(|_| 1f32.to_le_bytes()).collect();
    let b = DevBuf::upload(&ones, s)?;
    let d = DevBuf::upload(&ones, s)?;
    let mut h: cublasHandle_t = std::ptr::null_mut();
    let (alpha, beta) = (1f32, 0f32);
    let n = 4 as c_int;
    // SAFETY: a fresh handle, device buffers of 16 f32 each, host scalars.
    let status = unsafe {
        let mut st = cublasCreate_v2(&mut h);
        if st == CUBLAS_STATUS_SUCCESS {
            st = cublasSetStream_v2(h, s);
        }
        if st == CUBLAS_STATUS_SUCCESS {
            st = cublasSgemm_v2(
                h,
                CUBLAS_OP_N,
                CUBLAS_OP_N,
                n,
                n,
                n,
                &alpha,
                a.ptr.cast(),
                n,
                b.ptr.cast(),
                n,
                &beta,
                d.ptr.cast(),
                n,
            );
        }
        st
    };
    if status != CUBLAS_STATUS_SUCCESS {
        return Err(format!("cublasSgemm_v2 returned {status}"));
    }
    if d.download(s)?.iter().any(|&x| x != 0) {
        return Err("the GEMM of a zeroed A is not zero".into());
    }
    // SAFETY: the handle made above.
    unsafe { cublasDestroy_v2(h) };
    Ok(())
}
