//! Driver API entry points that move data and that ttrace does not capture: each records an
//! `unsupported` gap naming it once the call succeeded, so that nothing is lost silently. The
//! 2-D, 3-D, array, peer, batch and attribute copies and the 2-D memsets
//! (`cuMemcpy2D_v2`, `cuMemcpy3D_v2`, `cuMemcpyHtoA_v2`, `cuMemcpyPeer`, `cuMemcpyBatchAsync`,
//! `cuMemsetD2D8_v2`, ...): frameworks move tensors with the linear copies and memsets
//! ([`driver`](super::driver)), and a gap says so if one does not. Each hook calls the real
//! function once with the program's arguments and returns what it returned; the gap is on the
//! call's stream (`hStream`, else the legacy default stream; for the `_ptds`/`_ptsz` spellings of
//! a program built with per-thread default streams, that thread's default stream), with the
//! bytes moved where the
//! arguments say them (`ByteCount`, a 2-D copy's `WidthInBytes * Height`, a 2-D memset's
//! `Width * Height` elements), else 0.

use core::ffi::{c_uchar, c_uint, c_ulonglong, c_ushort, c_void};

use cuda_abi::cudart::cudaStream_t;
use cuda_abi::driver::*;
use ttrace_proto::record::{GapReason, Op};

use super::cudart::{per_thread, LEGACY};
use super::driver::{MISSING, SUCCESS};
use crate::{mode, real};

/// A copy of `count` bytes between contexts, into, out of or between CUDA arrays, or with
/// attributes (`how`: "between contexts (peer copies)", "to CUDA arrays", ...).
fn counted(count: usize, how: &str) -> (u64, String) {
    (
        count as u64,
        format!("copies {how} are not captured ({count} bytes)"),
    )
}

/// A 2-D copy: `WidthInBytes * Height` bytes, read from the program's parameter block (which
/// the real call reads too; null: 0 bytes, and the call fails, so nothing is recorded).
fn copy_2d(p: *const CUDA_MEMCPY2D) -> (u64, String) {
    // SAFETY: the program's parameter block, valid for the call when non-null.
    let Some(c) = (unsafe { p.as_ref() }).copied() else {
        return (0, "2-D copies are not captured".into());
    };
    let bytes = (c.WidthInBytes as u64).saturating_mul(c.Height as u64);
    let detail = format!(
        "2-D copies are not captured ({} x {} bytes, memory types {} to {})",
        c.WidthInBytes, c.Height, c.srcMemoryType, c.dstMemoryType
    );
    (bytes, detail)
}

/// A 3-D copy (`what`: "3-D copies", "3-D copies between contexts"): the parameter block is
/// not read, so the bytes are not said.
fn copy_3d(what: &str) -> (u64, String) {
    (
        0,
        format!("{what} are not captured (extent in the parameter block, not read)"),
    )
}

/// A batch of `n` copies (`what`: "batch copies", "3-D batch copies").
fn batch(what: &str, n: usize) -> (u64, String) {
    (0, format!("{what} are not captured ({n} copies)"))
}

/// A 2-D memset of `width * height` elements of `size` bytes with the pattern `value`.
fn memset_2d(value: u32, size: u64, width: usize, height: usize) -> (u64, String) {
    let bytes = (width as u64)
        .saturating_mul(height as u64)
        .saturating_mul(size);
    let detail = format!(
        "2-D memsets are not captured ({width} x {height} elements of the {}-bit pattern \
         {value:#x})",
        size * 8
    );
    (bytes, detail)
}

/// One driver entry point recorded as a gap: `name(C signature) => (what, stream)`, `what`
/// the `(bytes, detail)` of the gap (evaluated before the call, only when copies are traced).
/// The real function, looked up under the hook's name, is called exactly once with the
/// program's arguments, and its result returned.
macro_rules! cu_gap {
    // `name / name_ptds(...)`: also the per-thread default stream spelling, on that thread's
    // default stream where the other is on the legacy one (`per_thread` of the stream).
    ($(#[$m:meta])* $name:ident / $per_thread:ident ( $($a:ident : $t:ty),* $(,)? )
        => ($what:expr, $stream:expr)) => {
        cu_gap! { $(#[$m])* $name($($a: $t),*) => ($what, $stream) }
        cu_gap! {
            #[doc = concat!(
                "`",
                stringify!($name),
                "` of a program built with per-thread default streams.",
            )]
            $per_thread($($a: $t),*) => ($what, per_thread($stream))
        }
    };
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? ) => ($what:expr, $stream:expr)) => {
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
            let op = || {
                let (bytes, detail): (u64, String) = $what;
                Some(Op::gap(GapReason::Unsupported, stringify!($name), bytes, detail))
            };
            crate::around_metadata(stringify!($name), stream, op, run, |r| r == SUCCESS)
        }
    };
}

cu_gap! {
    /// `CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
    /// CUcontext srcContext, size_t ByteCount)`.
    cuMemcpyPeer / cuMemcpyPeer_ptds(
        dstDevice: CUdeviceptr,
        dstContext: CUcontext,
        srcDevice: CUdeviceptr,
        srcContext: CUcontext,
        ByteCount: usize,
    ) => (counted(ByteCount, "between contexts (peer copies)"), LEGACY)
}

cu_gap! {
    /// `CUresult cuMemcpyDtoA_v2(CUarray dstArray, size_t dstOffset, CUdeviceptr srcDevice, size_t
    /// ByteCount)`.
    cuMemcpyDtoA_v2 / cuMemcpyDtoA_v2_ptds(
        dstArray: CUarray,
        dstOffset: usize,
        srcDevice: CUdeviceptr,
        ByteCount: usize,
    ) => (counted(ByteCount, "to CUDA arrays"), LEGACY)
}

cu_gap! {
    /// `CUresult cuMemcpyAtoD_v2(CUdeviceptr dstDevice, CUarray srcArray, size_t srcOffset, size_t
    /// ByteCount)`.
    cuMemcpyAtoD_v2 / cuMemcpyAtoD_v2_ptds(
        dstDevice: CUdeviceptr,
        srcArray: CUarray,
        srcOffset: usize,
        ByteCount: usize,
    ) => (counted(ByteCount, "from CUDA arrays"), LEGACY)
}

cu_gap! {
    /// `CUresult cuMemcpyHtoA_v2(CUarray dstArray, size_t dstOffset, const void *srcHost, size_t
    /// ByteCount)`.
    cuMemcpyHtoA_v2 / cuMemcpyHtoA_v2_ptds(
        dstArray: CUarray,
        dstOffset: usize,
        srcHost: *const c_void,
        ByteCount: usize,
    ) => (counted(ByteCount, "to CUDA arrays"), LEGACY)
}

cu_gap! {
    /// `CUresult cuMemcpyAtoH_v2(void *dstHost, CUarray srcArray, size_t srcOffset, size_t
    /// ByteCount)`.
    cuMemcpyAtoH_v2 / cuMemcpyAtoH_v2_ptds(
        dstHost: *mut c_void,
        srcArray: CUarray,
        srcOffset: usize,
        ByteCount: usize,
    ) => (counted(ByteCount, "from CUDA arrays"), LEGACY)
}

cu_gap! {
    /// `CUresult cuMemcpyAtoA_v2(CUarray dstArray, size_t dstOffset, CUarray srcArray, size_t
    /// srcOffset, size_t ByteCount)`.
    cuMemcpyAtoA_v2 / cuMemcpyAtoA_v2_ptds(
        dstArray: CUarray,
        dstOffset: usize,
        srcArray: CUarray,
        srcOffset: usize,
        ByteCount: usize,
    ) => (counted(ByteCount, "between CUDA arrays"), LEGACY)
}

cu_gap! {
    /// `CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy)`.
    cuMemcpy2D_v2 / cuMemcpy2D_v2_ptds(pCopy: *const CUDA_MEMCPY2D)
        => (copy_2d(pCopy), LEGACY)
}

cu_gap! {
    /// `CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *pCopy)`.
    cuMemcpy2DUnaligned_v2 / cuMemcpy2DUnaligned_v2_ptds(pCopy: *const CUDA_MEMCPY2D)
        => (copy_2d(pCopy), LEGACY)
}

cu_gap! {
    /// `CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *pCopy)`.
    cuMemcpy3D_v2 / cuMemcpy3D_v2_ptds(pCopy: *const CUDA_MEMCPY3D)
        => (copy_3d("3-D copies"), LEGACY)
}

cu_gap! {
    /// `CUresult cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER *pCopy)`.
    cuMemcpy3DPeer / cuMemcpy3DPeer_ptds(pCopy: *const CUDA_MEMCPY3D_PEER)
        => (copy_3d("3-D copies between contexts"), LEGACY)
}

cu_gap! {
    /// `CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr
    /// srcDevice, CUcontext srcContext, size_t ByteCount, CUstream hStream)`.
    cuMemcpyPeerAsync / cuMemcpyPeerAsync_ptsz(
        dstDevice: CUdeviceptr,
        dstContext: CUcontext,
        srcDevice: CUdeviceptr,
        srcContext: CUcontext,
        ByteCount: usize,
        hStream: CUstream,
    ) => (counted(ByteCount, "between contexts (peer copies)"), hStream)
}

cu_gap! {
    /// `CUresult cuMemcpyHtoAAsync_v2(CUarray dstArray, size_t dstOffset, const void *srcHost,
    /// size_t ByteCount, CUstream hStream)`.
    cuMemcpyHtoAAsync_v2 / cuMemcpyHtoAAsync_v2_ptsz(
        dstArray: CUarray,
        dstOffset: usize,
        srcHost: *const c_void,
        ByteCount: usize,
        hStream: CUstream,
    ) => (counted(ByteCount, "to CUDA arrays"), hStream)
}

cu_gap! {
    /// `CUresult cuMemcpyAtoHAsync_v2(void *dstHost, CUarray srcArray, size_t srcOffset, size_t
    /// ByteCount, CUstream hStream)`.
    cuMemcpyAtoHAsync_v2 / cuMemcpyAtoHAsync_v2_ptsz(
        dstHost: *mut c_void,
        srcArray: CUarray,
        srcOffset: usize,
        ByteCount: usize,
        hStream: CUstream,
    ) => (counted(ByteCount, "from CUDA arrays"), hStream)
}

cu_gap! {
    /// `CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream)`.
    cuMemcpy2DAsync_v2 / cuMemcpy2DAsync_v2_ptsz(pCopy: *const CUDA_MEMCPY2D, hStream: CUstream)
        => (copy_2d(pCopy), hStream)
}

cu_gap! {
    /// `CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *pCopy, CUstream hStream)`.
    cuMemcpy3DAsync_v2 / cuMemcpy3DAsync_v2_ptsz(pCopy: *const CUDA_MEMCPY3D, hStream: CUstream)
        => (copy_3d("3-D copies"), hStream)
}

cu_gap! {
    /// `CUresult cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream)`.
    cuMemcpy3DPeerAsync / cuMemcpy3DPeerAsync_ptsz(
        pCopy: *const CUDA_MEMCPY3D_PEER,
        hStream: CUstream,
    ) => (copy_3d("3-D copies between contexts"), hStream)
}

cu_gap! {
    /// `CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t
    /// count, CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, size_t *failIdx,
    /// CUstream hStream)`. CUDA 12 (CUDA 13 names it `_v2`, with other parameters).
    cuMemcpyBatchAsync / cuMemcpyBatchAsync_ptsz(
        dsts: *mut CUdeviceptr,
        srcs: *mut CUdeviceptr,
        sizes: *mut usize,
        count: usize,
        attrs: *mut CUmemcpyAttributes,
        attrsIdxs: *mut usize,
        numAttrs: usize,
        failIdx: *mut usize,
        hStream: CUstream,
    ) => (batch("batch copies", count), hStream)
}

cu_gap! {
    /// `CUresult cuMemcpy3DBatchAsync(size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, size_t
    /// *failIdx, unsigned long long flags, CUstream hStream)`. CUDA 12 (CUDA 13 names it `_v2`,
    /// with other parameters).
    cuMemcpy3DBatchAsync / cuMemcpy3DBatchAsync_ptsz(
        numOps: usize,
        opList: *mut CUDA_MEMCPY3D_BATCH_OP,
        failIdx: *mut usize,
        flags: c_ulonglong,
        hStream: CUstream,
    ) => (batch("3-D batch copies", numOps), hStream)
}

cu_gap! {
    /// `CUresult cuMemsetD2D8_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t
    /// Width, size_t Height)`.
    cuMemsetD2D8_v2 / cuMemsetD2D8_v2_ptds(
        dstDevice: CUdeviceptr,
        dstPitch: usize,
        uc: c_uchar,
        Width: usize,
        Height: usize,
    ) => (memset_2d(u32::from(uc), 1, Width, Height), LEGACY)
}

cu_gap! {
    /// `CUresult cuMemsetD2D16_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t
    /// Width, size_t Height)`.
    cuMemsetD2D16_v2 / cuMemsetD2D16_v2_ptds(
        dstDevice: CUdeviceptr,
        dstPitch: usize,
        us: c_ushort,
        Width: usize,
        Height: usize,
    ) => (memset_2d(u32::from(us), 2, Width, Height), LEGACY)
}

cu_gap! {
    /// `CUresult cuMemsetD2D32_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t
    /// Width, size_t Height)`.
    cuMemsetD2D32_v2 / cuMemsetD2D32_v2_ptds(
        dstDevice: CUdeviceptr,
        dstPitch: usize,
        ui: c_uint,
        Width: usize,
        Height: usize,
    ) => (memset_2d(ui, 4, Width, Height), LEGACY)
}

cu_gap! {
    /// `CUresult cuMemsetD2D8Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t
    /// Width, size_t Height, CUstream hStream)`.
    cuMemsetD2D8Async / cuMemsetD2D8Async_ptsz(
        dstDevice: CUdeviceptr,
        dstPitch: usize,
        uc: c_uchar,
        Width: usize,
        Height: usize,
        hStream: CUstream,
    ) => (memset_2d(u32::from(uc), 1, Width, Height), hStream)
}

cu_gap! {
    /// `CUresult cuMemsetD2D16Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us,
    /// size_t Width, size_t Height, CUstream hStream)`.
    cuMemsetD2D16Async / cuMemsetD2D16Async_ptsz(
        dstDevice: CUdeviceptr,
        dstPitch: usize,
        us: c_ushort,
        Width: usize,
        Height: usize,
        hStream: CUstream,
    ) => (memset_2d(u32::from(us), 2, Width, Height), hStream)
}

cu_gap! {
    /// `CUresult cuMemsetD2D32Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t
    /// Width, size_t Height, CUstream hStream)`.
    cuMemsetD2D32Async / cuMemsetD2D32Async_ptsz(
        dstDevice: CUdeviceptr,
        dstPitch: usize,
        ui: c_uint,
        Width: usize,
        Height: usize,
        hStream: CUstream,
    ) => (memset_2d(ui, 4, Width, Height), hStream)
}

cu_gap! {
    /// `CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t
    /// count, CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, CUstream hStream)`.
    /// CUDA 13.
    cuMemcpyBatchAsync_v2 / cuMemcpyBatchAsync_v2_ptsz(
        dsts: *mut CUdeviceptr,
        srcs: *mut CUdeviceptr,
        sizes: *mut usize,
        count: usize,
        attrs: *mut CUmemcpyAttributes,
        attrsIdxs: *mut usize,
        numAttrs: usize,
        hStream: CUstream,
    ) => (batch("batch copies", count), hStream)
}

cu_gap! {
    /// `CUresult cuMemcpy3DBatchAsync_v2(size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, unsigned
    /// long long flags, CUstream hStream)`. CUDA 13.
    cuMemcpy3DBatchAsync_v2 / cuMemcpy3DBatchAsync_v2_ptsz(
        numOps: usize,
        opList: *mut CUDA_MEMCPY3D_BATCH_OP,
        flags: c_ulonglong,
        hStream: CUstream,
    ) => (batch("3-D batch copies", numOps), hStream)
}

cu_gap! {
    /// `CUresult cuMemcpyWithAttributesAsync(CUdeviceptr dst, CUdeviceptr src, size_t size,
    /// CUmemcpyAttributes *attr, CUstream hStream)`. CUDA 13.
    cuMemcpyWithAttributesAsync / cuMemcpyWithAttributesAsync_ptsz(
        dst: CUdeviceptr,
        src: CUdeviceptr,
        size: usize,
        attr: *mut CUmemcpyAttributes,
        hStream: CUstream,
    ) => (counted(size, "with attributes"), hStream)
}

cu_gap! {
    /// `CUresult cuMemcpy3DWithAttributesAsync(CUDA_MEMCPY3D_BATCH_OP *op, unsigned long long
    /// flags, CUstream hStream)`. CUDA 13.
    cuMemcpy3DWithAttributesAsync / cuMemcpy3DWithAttributesAsync_ptsz(
        op: *mut CUDA_MEMCPY3D_BATCH_OP,
        flags: c_ulonglong,
        hStream: CUstream,
    ) => (copy_3d("3-D copies with attributes"), hStream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_say_the_bytes_the_arguments_give() {
        let c = CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: 2,
            srcHost: core::ptr::null(),
            srcDevice: 0x1000,
            srcArray: core::ptr::null_mut(),
            srcPitch: 512,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: 1,
            dstHost: core::ptr::null_mut(),
            dstDevice: 0,
            dstArray: core::ptr::null_mut(),
            dstPitch: 256,
            WidthInBytes: 200,
            Height: 3,
        };
        let (bytes, detail) = copy_2d(&c);
        assert_eq!(bytes, 600);
        assert!(detail.contains("200 x 3 bytes"), "{detail}");
        assert_eq!(copy_2d(core::ptr::null()).0, 0);
        assert_eq!(memset_2d(0x3f80, 2, 10, 4).0, 80);
        assert_eq!(counted(64, "to CUDA arrays").0, 64);
        assert_eq!(batch("batch copies", 5).0, 0);
        let Op::Gap(g) = Op::gap(GapReason::Unsupported, "cuMemcpy2D_v2", 600, detail) else {
            panic!("a gap")
        };
        assert_eq!((g.skipped_api.as_str(), g.bytes), ("cuMemcpy2D_v2", 600));
        assert!(matches!(g.reason, GapReason::Unsupported));
    }
}
