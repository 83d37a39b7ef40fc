//! `driver-copies`: the driver API's allocation, copies and memsets (`cuMemAlloc_v2`,
//! `cuMemcpy*`, `cuMemsetD8/D16/D32`, synchronous and on a stream the runtime created) move the
//! bytes CUDA documents: every byte is read back and checked, including 16- and 32-bit patterns
//! that are not byte-uniform, memsets that stop at their last element, and the alignment
//! `cuMemsetD16`/`cuMemsetD32` require (`CUDA_ERROR_INVALID_VALUE` otherwise).

use cuda_dyn::abi::cudart::*;
use cuda_dyn::abi::driver::*;
use cuda_dyn::cudart::*;
use cuda_dyn::driver::*;

use crate::support::{ck, cstr};

/// Bytes of each buffer.
const N: usize = 4096;

/// `cuGetErrorName` of a result, with its number.
fn cu_error(code: CUresult) -> String {
    let mut p = std::ptr::null();
    // SAFETY: a valid out-pointer; the name is a static string.
    unsafe { cuGetErrorName(code, &mut p) };
    format!("{} ({code})", cstr(p))
}

/// Fails with the call and its `CUresult` unless it returned `CUDA_SUCCESS`.
macro_rules! cu {
    ($e:expr) => {{
        // SAFETY: a driver call with arguments prepared by the probe.
        let code = unsafe { $e };
        if code != CUDA_SUCCESS {
            return Err(format!("{} returned {}", stringify!($e), cu_error(code)));
        }
    }};
}

/// Fails unless the call returned `want`.
macro_rules! cu_is {
    ($e:expr, $want:expr) => {{
        // SAFETY: a driver call with arguments prepared by the probe.
        let code = unsafe { $e };
        if code != $want {
            return Err(format!(
                "{} returned {}, not {}",
                stringify!($e),
                cu_error(code),
                cu_error($want)
            ));
        }
    }};
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..N)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The bytes of device buffer `d`, read with `cuMemcpyDtoH_v2`.
fn read(d: CUdeviceptr) -> Result<Vec<u8>, String> {
    let mut v = vec![0u8; N];
    cu!(cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), d, N));
    Ok(v)
}

fn expect(what: &str, got: &[u8], want: &[u8]) -> Result<(), String> {
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None if got.len() == want.len() => Ok(()),
        None => Err(format!("{what}: {} bytes, not {}", got.len(), want.len())),
        Some(i) => Err(format!(
            "{what}: byte {i} is {:#04x}, not {:#04x}",
            got[i], want[i]
        )),
    }
}

/// `want` with `[off, off + count * W)` filled by the little-endian element `elem`.
fn filled<const W: usize>(want: &[u8], off: usize, elem: [u8; W], count: usize) -> Vec<u8> {
    let mut v = want.to_vec();
    for c in v[off..off + count * W].chunks_exact_mut(W) {
        c.copy_from_slice(&elem);
    }
    v
}

fn host_addr<T>(p: *const T) -> CUdeviceptr {
    p as usize as CUdeviceptr
}

pub fn driver_copies(_args: &[String]) -> Result<(), String> {
    let (mut a, mut b): (CUdeviceptr, CUdeviceptr) = (0, 0);
    cu!(cuMemAlloc_v2(&mut a, N));
    cu!(cuMemAlloc_v2(&mut b, N));
    cu_is!(cuMemAlloc_v2(&mut b, 0), CUDA_ERROR_INVALID_VALUE);
    if a == 0 || b == 0 || a == b {
        return Err(format!("cuMemAlloc_v2 gave {a:#x} and {b:#x}"));
    }

    // Synchronous copies: HtoD, DtoD, DtoH.
    let p1 = pattern(1);
    cu!(cuMemcpyHtoD_v2(a, p1.as_ptr().cast(), N));
    cu!(cuMemcpyDtoD_v2(b, a, N));
    expect("cuMemcpyHtoD_v2 + cuMemcpyDtoD_v2", &read(b)?, &p1)?;

    // Unified cuMemcpy: the direction from where the ends lie.
    let p2 = pattern(2);
    cu!(cuMemcpy(a, host_addr(p2.as_ptr()), N));
    cu!(cuMemcpy(b, a, N));
    let mut back = vec![0u8; N];
    cu!(cuMemcpy(host_addr(back.as_mut_ptr()), b, N));
    expect("cuMemcpy host -> device -> device -> host", &back, &p2)?;

    // Stream-ordered copies on a runtime stream.
    let mut s: cudaStream_t = std::ptr::null_mut();
    ck!(cudaStreamCreate(&mut s));
    let p3 = pattern(3);
    let mut back = vec![0u8; N];
    cu!(cuMemcpyHtoDAsync_v2(a, p3.as_ptr().cast(), N, s));
    cu!(cuMemcpyDtoDAsync_v2(b, a, N, s));
    cu!(cuMemcpyDtoHAsync_v2(back.as_mut_ptr().cast(), b, N, s));
    ck!(cudaStreamSynchronize(s));
    expect("cuMemcpy{HtoD,DtoD,DtoH}Async_v2", &back, &p3)?;

    let p4 = pattern(4);
    let mut back = vec![0u8; N];
    cu!(cuMemcpyAsync(a, host_addr(p4.as_ptr()), N, s));
    cu!(cuMemcpyAsync(b, a, N, s));
    cu!(cuMemcpyAsync(host_addr(back.as_mut_ptr()), b, N, s));
    ck!(cudaStreamSynchronize(s));
    expect("cuMemcpyAsync host -> device -> device -> host", &back, &p4)?;

    // hStream 0: the legacy default stream, which a synchronous copy waits for.
    let p5 = pattern(5);
    cu!(cuMemcpyHtoDAsync_v2(
        a,
        p5.as_ptr().cast(),
        N,
        std::ptr::null_mut()
    ));
    expect("cuMemcpyHtoDAsync_v2 on stream 0", &read(a)?, &p5)?;

    // Synchronous memsets: D8 everywhere, then D16 and D32 patterns inside, their ends kept.
    cu!(cuMemsetD8_v2(a, 0x5a, N));
    let mut want = vec![0x5au8; N];
    expect("cuMemsetD8_v2", &read(a)?, &want)?;
    cu!(cuMemsetD16_v2(a + 2, 0xbeef, 100));
    want = filled(&want, 2, 0xbeefu16.to_le_bytes(), 100);
    expect("cuMemsetD16_v2", &read(a)?, &want)?;
    cu!(cuMemsetD32_v2(a + 1024, 0x1234_5678, 300));
    want = filled(&want, 1024, 0x1234_5678u32.to_le_bytes(), 300);
    expect("cuMemsetD32_v2", &read(a)?, &want)?;
    cu!(cuMemsetD8_v2(a + 3, 0xc3, 5));
    want = filled(&want, 3, [0xc3], 5);
    expect("cuMemsetD8_v2 (5 bytes at offset 3)", &read(a)?, &want)?;

    // Alignment: D16 needs 2 bytes, D32 needs 4; nothing is written when refused.
    cu_is!(cuMemsetD16_v2(a + 1, 0xffff, 4), CUDA_ERROR_INVALID_VALUE);
    cu_is!(
        cuMemsetD32_v2(a + 2, 0xffff_ffff, 4),
        CUDA_ERROR_INVALID_VALUE
    );
    cu_is!(
        cuMemsetD32Async(a + 6, 0xffff_ffff, 4, s),
        CUDA_ERROR_INVALID_VALUE
    );
    // Past the allocation, or not device memory at all.
    cu_is!(
        cuMemsetD32_v2(a + N as CUdeviceptr - 4, 0, 2),
        CUDA_ERROR_INVALID_VALUE
    );
    let mut host = [0u32; 4];
    cu_is!(
        cuMemsetD32_v2(host_addr(host.as_mut_ptr()), 0, 4),
        CUDA_ERROR_INVALID_VALUE
    );
    ck!(cudaStreamSynchronize(s));
    expect("refused memsets", &read(a)?, &want)?;

    // Pinned host memory: a synchronous memset is complete when it returns (read at once).
    let mut pinned: *mut core::ffi::c_void = std::ptr::null_mut();
    ck!(cudaMallocHost(&mut pinned, 64));
    cu!(cuMemsetD8_v2(host_addr(pinned), 0, 64));
    cu!(cuMemsetD32_v2(host_addr(pinned) + 4, 0x0a0b_0c0d, 3));
    cu!(cuMemsetD16_v2(host_addr(pinned) + 32, 0x7f80, 5));
    // SAFETY: 64 bytes of pinned host memory, no work pending on them.
    let got = unsafe { std::slice::from_raw_parts(pinned.cast::<u8>(), 64) }.to_vec();
    let mut want_pinned = filled(&[0u8; 64], 4, 0x0a0b_0c0du32.to_le_bytes(), 3);
    want_pinned = filled(&want_pinned, 32, 0x7f80u16.to_le_bytes(), 5);
    expect(
        "synchronous memsets of pinned host memory",
        &got,
        &want_pinned,
    )?;
    ck!(cudaFreeHost(pinned));

    // Stream-ordered memsets on the runtime stream.
    cu!(cuMemsetD8Async(b, 0x11, N, s));
    cu!(cuMemsetD16Async(b + 6, 0xa55a, 7, s));
    cu!(cuMemsetD32Async(b + 64, 0xdead_beef, 33, s));
    cu!(cuMemsetD16Async(b + 1000, 0x0102, 0, s));
    let mut back = vec![0u8; N];
    cu!(cuMemcpyDtoHAsync_v2(back.as_mut_ptr().cast(), b, N, s));
    ck!(cudaStreamSynchronize(s));
    let mut want = vec![0x11u8; N];
    want = filled(&want, 6, 0xa55au16.to_le_bytes(), 7);
    want = filled(&want, 64, 0xdead_beefu32.to_le_bytes(), 33);
    expect("cuMemsetD{8,16,32}Async", &back, &want)?;

    ck!(cudaStreamDestroy(s));
    cu!(cuMemFree_v2(a));
    cu!(cuMemFree_v2(b));
    cu_is!(cuMemFree_v2(a + 8), CUDA_ERROR_INVALID_VALUE);
    println!("driver-copies OK");
    Ok(())
}
