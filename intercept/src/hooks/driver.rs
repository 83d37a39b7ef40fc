//! Driver API hooks (`libcuda.so`): the linear copies and memsets, as frameworks that bypass
//! the runtime make them (JAX's XLA plugin copies only through the driver, with entry points
//! taken by `dlsym`, which the interposed `dlsym` redirects here). A copy is captured as the
//! runtime's copy of the same direction is ([`capture_as`]: a download's source before it, an
//! upload's destination after it, a synchronous upload's snapshot done when it returns), under
//! the driver's API name; a memset of one repeated byte (`cuMemsetD8`, or `D16`/`D32` with a
//! pattern whose bytes are equal: zeroing) is a `memset` record like `cudaMemset`'s, and a
//! 16- or 32-bit pattern of unequal bytes, which a `memset` record cannot say, an `unsupported`
//! gap naming it. The synchronous spellings use the legacy default stream. Each hook comes
//! with its per-thread default stream spelling (`cuMemcpyHtoD_v2_ptds`,
//! `cuMemcpyHtoDAsync_v2_ptsz`: `name / name_ptds(...)` in the macros), which a program built
//! with `CUDA_API_PER_THREAD_DEFAULT_STREAM` calls: on the calling thread's default stream.
//!
//! The driver's other copies and memsets (2-D, 3-D, array, peer, batch and attribute copies,
//! 2-D memsets) are gaps ([`driver_gaps`](super::driver_gaps)). Programs that take these
//! functions from `cuGetProcAddress` or `cudaGetDriverEntryPoint` are handed the hooks
//! ([`entry_points`](super::entry_points)).

use core::ffi::{c_uchar, c_uint, c_ushort, c_void};

use cuda_abi::cudart::{
    cudaMemcpyDefault, cudaMemcpyDeviceToDevice, cudaMemcpyDeviceToHost, cudaMemcpyHostToDevice,
    cudaMemcpyKind, cudaStream_t,
};
use cuda_abi::driver::*;
use ttrace_proto::record::{GapReason, MemsetOp, Op};

use super::cudart::{capture_as, per_thread, Geometry, LEGACY};
use crate::{mode, real};

/// What a hook returns when the real function is missing (`CUDA_ERROR_NOT_FOUND`).
pub(super) const MISSING: CUresult = 500;
/// `CUDA_SUCCESS`.
pub(super) const SUCCESS: CUresult = 0;

/// A linear copy of `count` bytes.
fn linear(dst: u64, src: u64, count: usize) -> Geometry {
    Geometry::linear(dst as *mut c_void, src as *const c_void, count)
}

/// One driver copy: `name(C signature) => (geometry, kind, stream)`. The real function,
/// looked up under the hook's name, is called exactly once with the program's arguments.
macro_rules! cu_copy_hook {
    // `name / name_ptxx(...)`: also the per-thread default stream spelling (`per_thread` of
    // the stream: the thread's default stream where the other uses the legacy one).
    ($(#[$m:meta])* $name:ident / $per_thread:ident ( $($a:ident : $t:ty),* $(,)? )
        => ($g:expr, $kind:expr, $stream:expr)) => {
        cu_copy_hook! { $(#[$m])* $name($($a: $t),*) => ($g, $kind, $stream) }
        cu_copy_hook! {
            #[doc = concat!(
                "`",
                stringify!($name),
                "` of a program built with per-thread default streams.",
            )]
            $per_thread($($a: $t),*) => ($g, $kind, per_thread($stream))
        }
    };
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? )
        => ($g:expr, $kind:expr, $stream:expr)) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            let Some(real) = real::real_of!($name, fn($($t),*) -> CUresult, Driver) else {
                return MISSING;
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            let run = || unsafe { real($($a),*) };
            if mode::off(mode::MEMCPY) {
                return run();
            }
            let kind: cudaMemcpyKind = $kind;
            let stream: cudaStream_t = $stream;
            capture_as(stringify!($name), $g, kind, None, stream, run, SUCCESS)
        }
    };
}

cu_copy_hook! {
    /// `CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)`: unified
    /// addressing, the direction from where the ends lie.
    cuMemcpy / cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, ByteCount: usize)
        => (linear(dst, src, ByteCount), cudaMemcpyDefault, LEGACY)
}

cu_copy_hook! {
    /// `CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream
    /// hStream)`.
    cuMemcpyAsync / cuMemcpyAsync_ptsz(
        dst: CUdeviceptr,
        src: CUdeviceptr,
        ByteCount: usize,
        hStream: CUstream,
    ) => (linear(dst, src, ByteCount), cudaMemcpyDefault, hStream)
}

cu_copy_hook! {
    /// `CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount)`.
    cuMemcpyHtoD_v2 / cuMemcpyHtoD_v2_ptds(
        dstDevice: CUdeviceptr,
        srcHost: *const c_void,
        ByteCount: usize,
    ) => (linear(dstDevice, srcHost as u64, ByteCount), cudaMemcpyHostToDevice, LEGACY)
}

cu_copy_hook! {
    /// `CUresult cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount)`.
    cuMemcpyDtoH_v2 / cuMemcpyDtoH_v2_ptds(
        dstHost: *mut c_void,
        srcDevice: CUdeviceptr,
        ByteCount: usize,
    ) => (linear(dstHost as u64, srcDevice, ByteCount), cudaMemcpyDeviceToHost, LEGACY)
}

cu_copy_hook! {
    /// `CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t
    /// ByteCount)`.
    cuMemcpyDtoD_v2 / cuMemcpyDtoD_v2_ptds(
        dstDevice: CUdeviceptr,
        srcDevice: CUdeviceptr,
        ByteCount: usize,
    ) => (linear(dstDevice, srcDevice, ByteCount), cudaMemcpyDeviceToDevice, LEGACY)
}

cu_copy_hook! {
    /// `CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost, size_t
    /// ByteCount, CUstream hStream)`.
    cuMemcpyHtoDAsync_v2 / cuMemcpyHtoDAsync_v2_ptsz(
        dstDevice: CUdeviceptr,
        srcHost: *const c_void,
        ByteCount: usize,
        hStream: CUstream,
    ) => (linear(dstDevice, srcHost as u64, ByteCount), cudaMemcpyHostToDevice, hStream)
}

cu_copy_hook! {
    /// `CUresult cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount,
    /// CUstream hStream)`.
    cuMemcpyDtoHAsync_v2 / cuMemcpyDtoHAsync_v2_ptsz(
        dstHost: *mut c_void,
        srcDevice: CUdeviceptr,
        ByteCount: usize,
        hStream: CUstream,
    ) => (linear(dstHost as u64, srcDevice, ByteCount), cudaMemcpyDeviceToHost, hStream)
}

cu_copy_hook! {
    /// `CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t
    /// ByteCount, CUstream hStream)`.
    cuMemcpyDtoDAsync_v2 / cuMemcpyDtoDAsync_v2_ptsz(
        dstDevice: CUdeviceptr,
        srcDevice: CUdeviceptr,
        ByteCount: usize,
        hStream: CUstream,
    ) => (linear(dstDevice, srcDevice, ByteCount), cudaMemcpyDeviceToDevice, hStream)
}

/// What a driver memset of `n` elements of `pattern` (`size` bytes each, little-endian) at
/// `dst` is recorded as: a `memset` record when every byte of the pattern is the same, else a
/// gap naming `api` (`None`: nothing written).
fn memset_op(api: &str, dst: CUdeviceptr, pattern: u32, size: u64, n: usize) -> Option<Op> {
    let bytes = (n as u64).saturating_mul(size);
    if bytes == 0 {
        return None;
    }
    let b = pattern.to_le_bytes();
    let uniform = b[..size as usize].iter().all(|&x| x == b[0]);
    Some(if uniform {
        Op::Memset(MemsetOp {
            dst,
            value: b[0],
            width: bytes,
            height: 1,
            depth: 1,
            pitch: bytes,
            slice_pitch: bytes,
        })
    } else {
        Op::gap(
            GapReason::Unsupported,
            api,
            bytes,
            format!(
                "{n} elements of the {}-bit pattern {pattern:#x}: a memset record holds one \
                 repeated byte",
                size * 8
            ),
        )
    })
}

/// One driver memset: `name(C signature) => (dst, pattern, element bytes, count, stream)`.
macro_rules! cu_memset_hook {
    // `name / name_ptxx(...)`: also the per-thread default stream spelling, as `cu_copy_hook!`.
    ($(#[$m:meta])* $name:ident / $per_thread:ident ( $($a:ident : $t:ty),* $(,)? )
        => ($dst:expr, $pattern:expr, $size:expr, $n:expr, $stream:expr)) => {
        cu_memset_hook! { $(#[$m])* $name($($a: $t),*) => ($dst, $pattern, $size, $n, $stream) }
        cu_memset_hook! {
            #[doc = concat!(
                "`",
                stringify!($name),
                "` of a program built with per-thread default streams.",
            )]
            $per_thread($($a: $t),*) => ($dst, $pattern, $size, $n, per_thread($stream))
        }
    };
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? )
        => ($dst:expr, $pattern:expr, $size:expr, $n:expr, $stream:expr)) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            let Some(real) = real::real_of!($name, fn($($t),*) -> CUresult, Driver) else {
                return MISSING;
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            let run = || unsafe { real($($a),*) };
            if mode::off(mode::MEMCPY) {
                return run();
            }
            let stream: cudaStream_t = $stream;
            crate::around_metadata(
                stringify!($name),
                stream,
                || memset_op(stringify!($name), $dst, u32::from($pattern), $size, $n),
                run,
                |r| r == SUCCESS,
            )
        }
    };
}

cu_memset_hook! {
    /// `CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)`.
    cuMemsetD8_v2 / cuMemsetD8_v2_ptds(dstDevice: CUdeviceptr, uc: c_uchar, N: usize)
        => (dstDevice, uc, 1, N, LEGACY)
}

cu_memset_hook! {
    /// `CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N)`.
    cuMemsetD16_v2 / cuMemsetD16_v2_ptds(dstDevice: CUdeviceptr, us: c_ushort, N: usize)
        => (dstDevice, us, 2, N, LEGACY)
}

cu_memset_hook! {
    /// `CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)`.
    cuMemsetD32_v2 / cuMemsetD32_v2_ptds(dstDevice: CUdeviceptr, ui: c_uint, N: usize)
        => (dstDevice, ui, 4, N, LEGACY)
}

cu_memset_hook! {
    /// `CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream
    /// hStream)`.
    cuMemsetD8Async / cuMemsetD8Async_ptsz(
        dstDevice: CUdeviceptr,
        uc: c_uchar,
        N: usize,
        hStream: CUstream,
    ) => (dstDevice, uc, 1, N, hStream)
}

cu_memset_hook! {
    /// `CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream
    /// hStream)`.
    cuMemsetD16Async / cuMemsetD16Async_ptsz(
        dstDevice: CUdeviceptr,
        us: c_ushort,
        N: usize,
        hStream: CUstream,
    ) => (dstDevice, us, 2, N, hStream)
}

cu_memset_hook! {
    /// `CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream
    /// hStream)`.
    cuMemsetD32Async / cuMemsetD32Async_ptsz(
        dstDevice: CUdeviceptr,
        ui: c_uint,
        N: usize,
        hStream: CUstream,
    ) => (dstDevice, ui, 4, N, hStream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memset_of_one_repeated_byte_is_a_record_and_any_other_pattern_a_gap() {
        let Some(Op::Memset(m)) = memset_op("cuMemsetD32Async", 0x1000, 0, 4, 8) else {
            panic!("zeroing is a memset")
        };
        assert_eq!((m.value, m.width, m.height), (0, 32, 1));
        let Some(Op::Memset(m)) = memset_op("cuMemsetD16_v2", 0x1000, 0x7f7f, 2, 3) else {
            panic!("a repeated byte is a memset")
        };
        assert_eq!((m.value, m.width), (0x7f, 6));
        let Some(Op::Gap(g)) = memset_op("cuMemsetD32_v2", 0x1000, 0x3f80_0000, 4, 5) else {
            panic!("1.0f is not one repeated byte")
        };
        assert_eq!((g.skipped_api.as_str(), g.bytes), ("cuMemsetD32_v2", 20));
        assert!(memset_op("cuMemsetD8_v2", 0x1000, 7, 1, 0).is_none());
    }
}
