//! CUDA runtime hooks: the copies (every spelling, incl. the per-thread default stream ones)
//! and kernel launches (their names only).
//!
//! A copy's snapshot is the bytes that ended up on the device (`Dst`) or that left it (`Src`
//! of a device-to-host copy), copied from the device side on the op's stream after the op.
//! `cudaMemcpyDefault` is resolved with the real `cudaPointerGetAttributes`; host-to-host copies
//! are not snapshotted. Synchronous copies run on the legacy default stream (`_ptds`: the
//! per-thread one), so their snapshot does too: it is ordered after them as they are.

use core::ffi::{c_int, c_void};

use cuda_abi::cudart::*;
use ttrace_proto::record::{CopyDirection, GapReason, MemcpyOp, Op, Role};

use crate::cuda::{self, ErrScope, MISSING};
use crate::engine::{self, Call};
use crate::real;
use crate::{mode, plan, thread, uploads};

/// A copy's geometry: `height` rows of `width` bytes.
#[derive(Clone, Copy)]
pub(super) struct Geometry {
    pub(super) dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    pub(super) width: usize,
    height: usize,
}

impl Geometry {
    pub(super) fn linear(dst: *mut c_void, src: *const c_void, count: usize) -> Geometry {
        Geometry {
            dst,
            dpitch: count,
            src,
            spitch: count,
            width: count,
            height: 1,
        }
    }
}

/// The legacy default stream, as synchronous copies use it (recorded as 0).
pub(super) const LEGACY: cudaStream_t = core::ptr::null_mut();

/// The stream a `_ptsz`/`_ptds` call means by 0.
pub(super) fn per_thread(s: cudaStream_t) -> cudaStream_t {
    if s.is_null() {
        cudaStreamPerThread
    } else {
        s
    }
}

fn direction(kind: cudaMemcpyKind, g: &Geometry) -> Option<CopyDirection> {
    Some(match kind {
        cudaMemcpyHostToHost => CopyDirection::HostToHost,
        cudaMemcpyHostToDevice => CopyDirection::HostToDevice,
        cudaMemcpyDeviceToHost => CopyDirection::DeviceToHost,
        cudaMemcpyDeviceToDevice => CopyDirection::DeviceToDevice,
        cudaMemcpyDefault => {
            let _e = ErrScope::new();
            let d = cuda::is_device_memory(g.dst).ok()?;
            let s = cuda::is_device_memory(g.src).ok()?;
            match (s, d) {
                (false, false) => CopyDirection::HostToHost,
                (false, true) => CopyDirection::HostToDevice,
                (true, false) => CopyDirection::DeviceToHost,
                (true, true) => CopyDirection::DeviceToDevice,
            }
        }
        _ => return None,
    })
}

/// The snapshot plan of a copy (`None`: nothing to snapshot).
pub(super) fn call(
    api: &'static str,
    g: Geometry,
    kind: cudaMemcpyKind,
    dir: Option<CopyDirection>,
    stream: cudaStream_t,
) -> Option<Call> {
    if g.width == 0 || g.height == 0 {
        return None;
    }
    // A copy the hook cannot plan is a gap, not a record without its bytes (recorded only if
    // the call succeeds: a copy with a null end or an invalid kind fails and moves nothing).
    let gap = |detail: &str| {
        Some(Call {
            api,
            op: Op::gap(
                GapReason::Unsupported,
                api,
                (g.width as u64).saturating_mul(g.height as u64),
                detail,
            ),
            stream,
            stream_id: stream as u64,
            device: None,
            tensors: Vec::new(),
        })
    };
    if g.dst.is_null() || g.src.is_null() {
        // One that succeeds had an end the hook could not resolve (a variable whose address
        // the runtime did not give).
        return gap("the copy's device address could not be resolved");
    }
    let Some(dir) = dir.or_else(|| direction(kind, &g)) else {
        // cudaMemcpyDefault (or the driver's unified cuMemcpy) whose ends the runtime could
        // not classify.
        return gap("the copy's direction could not be resolved from where its ends lie");
    };
    if dir == CopyDirection::HostToHost {
        return None;
    }
    let (w, h) = (g.width as u64, g.height as u64);
    let t = if dir == CopyDirection::DeviceToHost {
        // Before the copy, which does not change it: done when the copy is, so also when a
        // copy into pageable memory returns complete and the program changes the source at
        // once from a stream that does not wait for the copy's.
        plan::TensorPlan {
            when: plan::When::Before,
            ..plan::bytes(Role::Src, g.src as u64, w, h, g.spitch as u64)
        }
    } else {
        plan::bytes(Role::Dst, g.dst as u64, w, h, g.dpitch as u64)
    };
    Some(Call {
        api,
        op: Op::Memcpy(MemcpyOp {
            direction: dir,
            kind,
            dst: g.dst as u64,
            src: g.src as u64,
            width: w,
            height: h,
            dpitch: g.dpitch as u64,
            spitch: g.spitch as u64,
        }),
        stream,
        stream_id: stream as u64,
        device: None,
        tensors: vec![t],
    })
}

/// The capturing path of every copy hook.
fn capture(
    api: &'static str,
    g: Geometry,
    kind: cudaMemcpyKind,
    dir: Option<CopyDirection>,
    stream: cudaStream_t,
    real: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    capture_as(api, g, kind, dir, stream, real, cudaSuccess)
}

/// [`capture`] for a copy made by another library's entry point (cuBLAS's
/// `cublasSetMatrix` family), whose status type is its own: `ok` is its success.
pub(super) fn capture_as<R: Copy + PartialEq>(
    api: &'static str,
    g: Geometry,
    kind: cudaMemcpyKind,
    dir: Option<CopyDirection>,
    stream: cudaStream_t,
    real: impl FnOnce() -> R,
    ok: R,
) -> R {
    let dir = dir.or_else(|| direction(kind, &g));
    crate::around(
        || {
            let mut f = engine::begin(call(api, g, kind, dir, stream)?)?;
            if complete_at_return(api, dir) {
                f.complete_at_return();
            }
            Some(f)
        },
        || tracked(&g, dir, real, ok),
        |f, r| engine::finish(f, r == ok),
    )
}

/// Whether a copy's snapshot must be done when the copy returns: a synchronous upload (no
/// `Async` in the name), whose destination is snapshotted after it. A download's source is
/// snapshotted before it (done when the download is); a copy between device buffers does not
/// synchronise the host in CUDA, so the program cannot rely on its completion either.
fn complete_at_return(api: &str, dir: Option<CopyDirection>) -> bool {
    !api.contains("Async") && dir == Some(CopyDirection::HostToDevice)
}

/// The path of a copy hook while copies are not captured: a small upload is still remembered
/// when GEMMs are captured (their pointer arrays, uploads.rs). Only an explicit
/// `cudaMemcpyHostToDevice` is looked at (resolving `cudaMemcpyDefault` costs a runtime call).
fn pass_through(
    g: impl FnOnce() -> Geometry,
    kind: cudaMemcpyKind,
    real: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    if kind == cudaMemcpyHostToDevice && mode::on(mode::GEMM) {
        tracked(&g(), Some(CopyDirection::HostToDevice), real, cudaSuccess)
    } else {
        real()
    }
}

/// Whether the source of a copy the program calls host-to-device is host memory the tracer
/// may read (a kind that lies about a device source must not fault here).
fn host_readable(p: *const c_void) -> bool {
    let _e = ErrScope::new();
    cuda::is_device_memory(p) == Ok(false)
}

/// Runs a copy, keeping [`uploads`] up to date: the host bytes of a small linear upload are
/// remembered (as they are at the call, what the copy takes); any other write to the device
/// the hooks see forgets what was remembered of its range.
pub(super) fn tracked<R: PartialEq>(
    g: &Geometry,
    dir: Option<CopyDirection>,
    real: impl FnOnce() -> R,
    ok: R,
) -> R {
    let to_device = matches!(
        dir,
        Some(CopyDirection::HostToDevice | CopyDirection::DeviceToDevice)
    );
    if !to_device || !mode::on(mode::GEMM) || g.dst.is_null() {
        return real();
    }
    // Outside `around`'s guard: a panic here must not reach the program (crate::catch).
    let host = crate::catch(|| {
        let upload = dir == Some(CopyDirection::HostToDevice)
            && g.height == 1
            && uploads::wanted(g.width)
            && !g.src.is_null()
            && host_readable(g.src);
        upload.then(|| {
            // SAFETY: the copy's host source: `width` readable bytes, per cudaMemcpy's
            // contract (the real call reads them too).
            unsafe { std::slice::from_raw_parts(g.src.cast::<u8>(), g.width) }.to_vec()
        })
    })
    .flatten();
    let r = real();
    if r == ok {
        let extent = g.dpitch.saturating_mul(g.height.saturating_sub(1)) + g.width;
        let _ = crate::catch(|| match host {
            Some(bytes) => uploads::remember(g.dst as u64, bytes),
            None => uploads::forget(g.dst as u64, extent as u64),
        });
    }
    r
}

/// The path of a copy hook while copies are not captured, for the spellings whose uploads are
/// not remembered (pitched and peer copies): the real call alone.
fn direct(
    _: impl FnOnce() -> Geometry,
    _: cudaMemcpyKind,
    real: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    real()
}

/// A pitched copy's geometry.
pub(super) fn pitched(
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
) -> Geometry {
    Geometry {
        dst,
        dpitch,
        src,
        spitch,
        width,
        height,
    }
}

/// One `cudaMemcpy*` entry point: `name(C signature) => (geometry, kind, direction when the
/// kind does not say it, stream, path while copies are not captured)`. The real function,
/// looked up under the hook's name, is called exactly once with the program's arguments.
macro_rules! copy_hook {
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? )
        => ($g:expr, $kind:expr, $dir:expr, $stream:expr, $off:ident)) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> cudaError_t {
            let Some(real) = real::real_of!($name, fn($($t),*) -> cudaError_t, Cudart) else {
                return MISSING;
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            let run = || unsafe { real($($a),*) };
            if mode::off(mode::MEMCPY) {
                // The geometry only if the path reads it (a symbol's costs a runtime call).
                return $off(|| $g, $kind, run);
            }
            capture(stringify!($name), $g, $kind, $dir, $stream, run)
        }
    };
}

/// The device address of byte `offset` of the `__device__`/`__constant__` variable `symbol`
/// (null when the runtime knows no such variable: the real call then fails as well, and
/// nothing is captured).
fn symbol_at(symbol: *const c_void, offset: usize) -> *mut c_void {
    let _e = ErrScope::new();
    let Some(f) = real::cudaGetSymbolAddress() else {
        return core::ptr::null_mut();
    };
    let mut p: *mut c_void = core::ptr::null_mut();
    // SAFETY: an out-pointer to a local and the program's symbol, as the copy passes it.
    if unsafe { f(&mut p, symbol) } != cudaSuccess || p.is_null() {
        return core::ptr::null_mut();
    }
    p.cast::<u8>().wrapping_add(offset).cast()
}

copy_hook! {
    /// `cudaError_t cudaMemcpyToSymbol(const void* symbol, const void* src, size_t count,
    /// size_t offset, cudaMemcpyKind kind)`: a copy to the variable's device address.
    cudaMemcpyToSymbol(symbol: *const c_void, src: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind)
    => (Geometry::linear(symbol_at(symbol, offset), src, count), kind, None, LEGACY, direct)
}

copy_hook! {
    /// `cudaMemcpyToSymbol` for code built with `--default-stream per-thread`.
    cudaMemcpyToSymbol_ptds(symbol: *const c_void, src: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind)
    => (Geometry::linear(symbol_at(symbol, offset), src, count), kind, None, cudaStreamPerThread, direct)
}

copy_hook! {
    /// `cudaError_t cudaMemcpyToSymbolAsync(const void* symbol, const void* src, size_t count,
    /// size_t offset, cudaMemcpyKind kind, cudaStream_t stream)`.
    cudaMemcpyToSymbolAsync(symbol: *const c_void, src: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind, stream: cudaStream_t)
    => (Geometry::linear(symbol_at(symbol, offset), src, count), kind, None, stream, direct)
}

copy_hook! {
    /// `cudaMemcpyToSymbolAsync` for code built with `--default-stream per-thread`.
    cudaMemcpyToSymbolAsync_ptsz(symbol: *const c_void, src: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind, stream: cudaStream_t)
    => (Geometry::linear(symbol_at(symbol, offset), src, count), kind, None, per_thread(stream), direct)
}

copy_hook! {
    /// `cudaError_t cudaMemcpyFromSymbol(void* dst, const void* symbol, size_t count, size_t
    /// offset, cudaMemcpyKind kind)`: a copy from the variable's device address.
    cudaMemcpyFromSymbol(dst: *mut c_void, symbol: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind)
    => (Geometry::linear(dst, symbol_at(symbol, offset), count), kind, None, LEGACY, direct)
}

copy_hook! {
    /// `cudaMemcpyFromSymbol` for code built with `--default-stream per-thread`.
    cudaMemcpyFromSymbol_ptds(dst: *mut c_void, symbol: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind)
    => (Geometry::linear(dst, symbol_at(symbol, offset), count), kind, None, cudaStreamPerThread, direct)
}

copy_hook! {
    /// `cudaError_t cudaMemcpyFromSymbolAsync(void* dst, const void* symbol, size_t count,
    /// size_t offset, cudaMemcpyKind kind, cudaStream_t stream)`.
    cudaMemcpyFromSymbolAsync(dst: *mut c_void, symbol: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind, stream: cudaStream_t)
    => (Geometry::linear(dst, symbol_at(symbol, offset), count), kind, None, stream, direct)
}

copy_hook! {
    /// `cudaMemcpyFromSymbolAsync` for code built with `--default-stream per-thread`.
    cudaMemcpyFromSymbolAsync_ptsz(dst: *mut c_void, symbol: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind, stream: cudaStream_t)
    => (Geometry::linear(dst, symbol_at(symbol, offset), count), kind, None, per_thread(stream), direct)
}

/// The parameter block of a 3-D copy (`cudaMemcpy3D*`, `cudaMemcpy3DPeer*`): what its gap
/// says of it.
trait ThreeD: Copy {
    fn extent(&self) -> cudaExtent;
    /// The direction as the record's detail names it.
    fn kind(&self) -> String;
    /// Whether an end is a CUDA array.
    fn arrays(&self) -> bool;
}

impl ThreeD for cudaMemcpy3DParms {
    fn extent(&self) -> cudaExtent {
        self.extent
    }
    fn kind(&self) -> String {
        format!("kind {}", self.kind)
    }
    fn arrays(&self) -> bool {
        !self.srcArray.is_null() || !self.dstArray.is_null()
    }
}

impl ThreeD for cudaMemcpy3DPeerParms {
    fn extent(&self) -> cudaExtent {
        self.extent
    }
    fn kind(&self) -> String {
        format!("device {} to device {}", self.srcDevice, self.dstDevice)
    }
    fn arrays(&self) -> bool {
        !self.srcArray.is_null() || !self.dstArray.is_null()
    }
}

/// An entry point ttrace does not capture: an `unsupported` gap naming `api`, with the bytes
/// and detail `what` tells (`None`: nothing to record), on the stream `stream` tells, once the
/// real call succeeded. Both are asked only while copies are captured: a hook that does not
/// capture is a mode load and the real call.
pub(super) fn uncaptured(
    api: &'static str,
    stream: impl FnOnce() -> cudaStream_t,
    what: impl FnOnce() -> Option<(u64, String)>,
    real: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    if mode::off(mode::MEMCPY) {
        return real();
    }
    let gap = || {
        let (bytes, detail) = what()?;
        Some(Op::gap(GapReason::Unsupported, api, bytes, detail))
    };
    crate::around_metadata(api, stream(), gap, real, |r| r == cudaSuccess)
}

/// The elements (bytes, between linear memory) of a 3-D extent.
pub(super) fn elements(e: cudaExtent) -> u64 {
    (e.width as u64)
        .saturating_mul(e.height as u64)
        .saturating_mul(e.depth as u64)
}

/// A 3-D copy (`cudaMemcpy3D`, `cudaMemcpy3DPeer` and their spellings): not captured
/// ([`uncaptured`]). Training frameworks do not move tensors this way; the gap says so if one
/// does.
fn uncaptured_3d<P: ThreeD>(
    api: &'static str,
    p: *const P,
    stream: impl FnOnce() -> cudaStream_t,
    real: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    let what = || {
        // SAFETY: the program's parameter block, which the real call reads too (non-null; a
        // null one fails the call, and nothing is recorded).
        let q = unsafe { p.as_ref() }.copied()?;
        let e = q.extent();
        let arrays = if q.arrays() {
            ", a CUDA array at one end"
        } else {
            ""
        };
        let detail = format!(
            "3-D copies are not captured (extent {} x {} x {} bytes, {}{arrays})",
            e.width,
            e.height,
            e.depth,
            q.kind()
        );
        Some((elements(e), detail))
    };
    uncaptured(api, stream, what, real)
}

/// One `cudaMemcpy3D*` entry point: `name(C signature) => stream`.
macro_rules! copy_3d_hook {
    ($(#[$m:meta])* $name:ident ( p: *const $parms:ty $(, $a:ident : $t:ty)* $(,)? )
        => $stream:expr) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name(p: *const $parms $(, $a: $t)*) -> cudaError_t {
            let Some(real) =
                real::real_of!($name, fn(*const $parms $(, $t)*) -> cudaError_t, Cudart)
            else {
                return MISSING;
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            uncaptured_3d(stringify!($name), p, || $stream, || unsafe { real(p $(, $a)*) })
        }
    };
}

copy_3d_hook! {
    /// `cudaError_t cudaMemcpy3D(const struct cudaMemcpy3DParms* p)`.
    cudaMemcpy3D(p: *const cudaMemcpy3DParms) => LEGACY
}

copy_3d_hook! {
    /// `cudaMemcpy3D` for code built with `--default-stream per-thread`.
    cudaMemcpy3D_ptds(p: *const cudaMemcpy3DParms) => cudaStreamPerThread
}

copy_3d_hook! {
    /// `cudaError_t cudaMemcpy3DAsync(const struct cudaMemcpy3DParms* p, cudaStream_t stream)`.
    cudaMemcpy3DAsync(p: *const cudaMemcpy3DParms, stream: cudaStream_t) => stream
}

copy_3d_hook! {
    /// `cudaMemcpy3DAsync` for code built with `--default-stream per-thread`.
    cudaMemcpy3DAsync_ptsz(p: *const cudaMemcpy3DParms, stream: cudaStream_t) => per_thread(stream)
}

/// A copy into, out of or between CUDA arrays (texture memory, not the linear memory tensors
/// live in): not captured ([`uncaptured`]).
fn uncaptured_array(
    api: &'static str,
    bytes: usize,
    kind: cudaMemcpyKind,
    how: &'static str,
    stream: impl FnOnce() -> cudaStream_t,
    real: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    let what = || {
        let detail =
            format!("copies {how} CUDA arrays are not captured ({bytes} bytes, kind {kind})");
        Some((bytes as u64, detail))
    };
    uncaptured(api, stream, what, real)
}

/// One CUDA-array copy entry point: `name(C signature) => (bytes, kind, "to" | "from" |
/// "between", stream)`.
macro_rules! array_copy_hook {
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? )
        => ($bytes:expr, $kind:expr, $how:literal, $stream:expr)) => {
        $(#[$m])*
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> cudaError_t {
            let Some(real) = real::real_of!($name, fn($($t),*) -> cudaError_t, Cudart) else {
                return MISSING;
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            let run = || unsafe { real($($a),*) };
            uncaptured_array(stringify!($name), $bytes, $kind, $how, || $stream, run)
        }
    };
}

array_copy_hook! {
    /// `cudaError_t cudaMemcpy2DToArray(cudaArray_t dst, size_t wOffset, size_t hOffset, const
    /// void* src, size_t spitch, size_t width, size_t height, cudaMemcpyKind kind)`.
    cudaMemcpy2DToArray(
        dst: cudaArray_t,
        wOffset: usize,
        hOffset: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
    ) => (width * height, kind, "to", LEGACY)
}

array_copy_hook! {
    /// `cudaMemcpy2DToArray` for code built with `--default-stream per-thread`.
    cudaMemcpy2DToArray_ptds(
        dst: cudaArray_t,
        wOffset: usize,
        hOffset: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
    ) => (width * height, kind, "to", cudaStreamPerThread)
}

array_copy_hook! {
    /// `cudaMemcpy2DToArray` on `stream` (`cudaError_t cudaMemcpy2DToArrayAsync(..., cudaStream_t stream)`).
    cudaMemcpy2DToArrayAsync(
        dst: cudaArray_t,
        wOffset: usize,
        hOffset: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) => (width * height, kind, "to", stream)
}

array_copy_hook! {
    /// `cudaMemcpy2DToArrayAsync` for code built with `--default-stream per-thread`.
    cudaMemcpy2DToArrayAsync_ptsz(
        dst: cudaArray_t,
        wOffset: usize,
        hOffset: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) => (width * height, kind, "to", per_thread(stream))
}

array_copy_hook! {
    /// `cudaError_t cudaMemcpy2DFromArray(void* dst, size_t dpitch, cudaArray_const_t src, size_t
    /// wOffset, size_t hOffset, size_t width, size_t height, cudaMemcpyKind kind)`.
    cudaMemcpy2DFromArray(
        dst: *mut c_void,
        dpitch: usize,
        src: cudaArray_const_t,
        wOffset: usize,
        hOffset: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
    ) => (width * height, kind, "from", LEGACY)
}

array_copy_hook! {
    /// `cudaMemcpy2DFromArray` for code built with `--default-stream per-thread`.
    cudaMemcpy2DFromArray_ptds(
        dst: *mut c_void,
        dpitch: usize,
        src: cudaArray_const_t,
        wOffset: usize,
        hOffset: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
    ) => (width * height, kind, "from", cudaStreamPerThread)
}

array_copy_hook! {
    /// `cudaMemcpy2DFromArray` on `stream` (`cudaError_t cudaMemcpy2DFromArrayAsync(..., cudaStream_t stream)`).
    cudaMemcpy2DFromArrayAsync(
        dst: *mut c_void,
        dpitch: usize,
        src: cudaArray_const_t,
        wOffset: usize,
        hOffset: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) => (width * height, kind, "from", stream)
}

array_copy_hook! {
    /// `cudaMemcpy2DFromArrayAsync` for code built with `--default-stream per-thread`.
    cudaMemcpy2DFromArrayAsync_ptsz(
        dst: *mut c_void,
        dpitch: usize,
        src: cudaArray_const_t,
        wOffset: usize,
        hOffset: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) => (width * height, kind, "from", per_thread(stream))
}

array_copy_hook! {
    /// `cudaError_t cudaMemcpy2DArrayToArray(cudaArray_t dst, size_t wOffsetDst, size_t
    /// hOffsetDst, cudaArray_const_t src, size_t wOffsetSrc, size_t hOffsetSrc, size_t width,
    /// size_t height, cudaMemcpyKind kind)`.
    cudaMemcpy2DArrayToArray(
        dst: cudaArray_t,
        wOffsetDst: usize,
        hOffsetDst: usize,
        src: cudaArray_const_t,
        wOffsetSrc: usize,
        hOffsetSrc: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
    ) => (width * height, kind, "between", LEGACY)
}

array_copy_hook! {
    /// `cudaMemcpy2DArrayToArray` for code built with `--default-stream per-thread`.
    cudaMemcpy2DArrayToArray_ptds(
        dst: cudaArray_t,
        wOffsetDst: usize,
        hOffsetDst: usize,
        src: cudaArray_const_t,
        wOffsetSrc: usize,
        hOffsetSrc: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
    ) => (width * height, kind, "between", cudaStreamPerThread)
}

array_copy_hook! {
    /// `cudaError_t cudaMemcpyToArray(cudaArray_t dst, size_t wOffset, size_t hOffset, const
    /// void* src, size_t count, cudaMemcpyKind kind)` (deprecated).
    cudaMemcpyToArray(
        dst: cudaArray_t,
        wOffset: usize,
        hOffset: usize,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
    ) => (count, kind, "to", LEGACY)
}

array_copy_hook! {
    /// `cudaMemcpyToArray` for code built with `--default-stream per-thread`.
    cudaMemcpyToArray_ptds(
        dst: cudaArray_t,
        wOffset: usize,
        hOffset: usize,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
    ) => (count, kind, "to", cudaStreamPerThread)
}

array_copy_hook! {
    /// `cudaMemcpyToArray` on `stream` (`cudaError_t cudaMemcpyToArrayAsync(..., cudaStream_t stream)`).
    cudaMemcpyToArrayAsync(
        dst: cudaArray_t,
        wOffset: usize,
        hOffset: usize,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) => (count, kind, "to", stream)
}

array_copy_hook! {
    /// `cudaMemcpyToArrayAsync` for code built with `--default-stream per-thread`.
    cudaMemcpyToArrayAsync_ptsz(
        dst: cudaArray_t,
        wOffset: usize,
        hOffset: usize,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) => (count, kind, "to", per_thread(stream))
}

array_copy_hook! {
    /// `cudaError_t cudaMemcpyFromArray(void* dst, cudaArray_const_t src, size_t wOffset, size_t
    /// hOffset, size_t count, cudaMemcpyKind kind)` (deprecated).
    cudaMemcpyFromArray(
        dst: *mut c_void,
        src: cudaArray_const_t,
        wOffset: usize,
        hOffset: usize,
        count: usize,
        kind: cudaMemcpyKind,
    ) => (count, kind, "from", LEGACY)
}

array_copy_hook! {
    /// `cudaMemcpyFromArray` for code built with `--default-stream per-thread`.
    cudaMemcpyFromArray_ptds(
        dst: *mut c_void,
        src: cudaArray_const_t,
        wOffset: usize,
        hOffset: usize,
        count: usize,
        kind: cudaMemcpyKind,
    ) => (count, kind, "from", cudaStreamPerThread)
}

array_copy_hook! {
    /// `cudaMemcpyFromArray` on `stream` (`cudaError_t cudaMemcpyFromArrayAsync(..., cudaStream_t stream)`).
    cudaMemcpyFromArrayAsync(
        dst: *mut c_void,
        src: cudaArray_const_t,
        wOffset: usize,
        hOffset: usize,
        count: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) => (count, kind, "from", stream)
}

array_copy_hook! {
    /// `cudaMemcpyFromArrayAsync` for code built with `--default-stream per-thread`.
    cudaMemcpyFromArrayAsync_ptsz(
        dst: *mut c_void,
        src: cudaArray_const_t,
        wOffset: usize,
        hOffset: usize,
        count: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) => (count, kind, "from", per_thread(stream))
}

array_copy_hook! {
    /// `cudaError_t cudaMemcpyArrayToArray(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst,
    /// cudaArray_const_t src, size_t wOffsetSrc, size_t hOffsetSrc, size_t count, cudaMemcpyKind
    /// kind)` (deprecated).
    cudaMemcpyArrayToArray(
        dst: cudaArray_t,
        wOffsetDst: usize,
        hOffsetDst: usize,
        src: cudaArray_const_t,
        wOffsetSrc: usize,
        hOffsetSrc: usize,
        count: usize,
        kind: cudaMemcpyKind,
    ) => (count, kind, "between", LEGACY)
}

array_copy_hook! {
    /// `cudaMemcpyArrayToArray` for code built with `--default-stream per-thread`.
    cudaMemcpyArrayToArray_ptds(
        dst: cudaArray_t,
        wOffsetDst: usize,
        hOffsetDst: usize,
        src: cudaArray_const_t,
        wOffsetSrc: usize,
        hOffsetSrc: usize,
        count: usize,
        kind: cudaMemcpyKind,
    ) => (count, kind, "between", cudaStreamPerThread)
}

copy_3d_hook! {
    /// `cudaError_t cudaMemcpy3DPeer(const struct cudaMemcpy3DPeerParms* p)`.
    cudaMemcpy3DPeer(p: *const cudaMemcpy3DPeerParms) => LEGACY
}

copy_3d_hook! {
    /// `cudaMemcpy3DPeer` for code built with `--default-stream per-thread`.
    cudaMemcpy3DPeer_ptds(p: *const cudaMemcpy3DPeerParms) => cudaStreamPerThread
}

copy_3d_hook! {
    /// `cudaError_t cudaMemcpy3DPeerAsync(const struct cudaMemcpy3DPeerParms* p,
    /// cudaStream_t stream)`.
    cudaMemcpy3DPeerAsync(p: *const cudaMemcpy3DPeerParms, stream: cudaStream_t) => stream
}

copy_3d_hook! {
    /// `cudaMemcpy3DPeerAsync` for code built with `--default-stream per-thread`.
    cudaMemcpy3DPeerAsync_ptsz(p: *const cudaMemcpy3DPeerParms, stream: cudaStream_t)
    => per_thread(stream)
}

copy_hook! {
    /// `cudaError_t cudaMemcpyWithAttributesAsync(void* dst, const void* src, size_t size,
    /// struct cudaMemcpyAttributes* attr, cudaStream_t stream)` (CUDA 13): a copy whose
    /// direction its ends tell, as `cudaMemcpyDefault`'s.
    cudaMemcpyWithAttributesAsync(
        dst: *mut c_void,
        src: *const c_void,
        size: usize,
        attr: *mut cudaMemcpyAttributes,
        stream: cudaStream_t,
    ) => (Geometry::linear(dst, src, size), cudaMemcpyDefault, None, stream, direct)
}

copy_hook! {
    /// `cudaMemcpyWithAttributesAsync` for code built with `--default-stream per-thread`.
    cudaMemcpyWithAttributesAsync_ptsz(
        dst: *mut c_void,
        src: *const c_void,
        size: usize,
        attr: *mut cudaMemcpyAttributes,
        stream: cudaStream_t,
    ) => (Geometry::linear(dst, src, size), cudaMemcpyDefault, None, per_thread(stream), direct)
}

copy_hook! {
    /// `cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind)`.
    cudaMemcpy(dst: *mut c_void, src: *const c_void, count: usize, kind: cudaMemcpyKind)
    => (Geometry::linear(dst, src, count), kind, None, LEGACY, pass_through)
}

copy_hook! {
    /// `cudaMemcpy` for code built with `--default-stream per-thread`.
    cudaMemcpy_ptds(dst: *mut c_void, src: *const c_void, count: usize, kind: cudaMemcpyKind)
    => (Geometry::linear(dst, src, count), kind, None, cudaStreamPerThread, pass_through)
}

copy_hook! {
    /// `cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind
    /// kind, cudaStream_t stream)`.
    cudaMemcpyAsync(
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) => (Geometry::linear(dst, src, count), kind, None, stream, pass_through)
}

copy_hook! {
    /// `cudaMemcpyAsync` for code built with `--default-stream per-thread`.
    cudaMemcpyAsync_ptsz(
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) => (Geometry::linear(dst, src, count), kind, None, per_thread(stream), pass_through)
}

copy_hook! {
    /// `cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch,
    /// size_t width, size_t height, cudaMemcpyKind kind)`.
    cudaMemcpy2D(
        dst: *mut c_void,
        dpitch: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
    ) => (pitched(dst, dpitch, src, spitch, width, height), kind, None, LEGACY, direct)
}

copy_hook! {
    /// `cudaMemcpy2D` for code built with `--default-stream per-thread`.
    cudaMemcpy2D_ptds(
        dst: *mut c_void,
        dpitch: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
    ) => (
        pitched(dst, dpitch, src, spitch, width, height),
        kind,
        None,
        cudaStreamPerThread,
        direct
    )
}

copy_hook! {
    /// `cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
    /// size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t stream)`.
    cudaMemcpy2DAsync(
        dst: *mut c_void,
        dpitch: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) => (pitched(dst, dpitch, src, spitch, width, height), kind, None, stream, direct)
}

copy_hook! {
    /// `cudaMemcpy2DAsync` for code built with `--default-stream per-thread`.
    cudaMemcpy2DAsync_ptsz(
        dst: *mut c_void,
        dpitch: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
        stream: cudaStream_t,
    ) => (
        pitched(dst, dpitch, src, spitch, width, height),
        kind,
        None,
        per_thread(stream),
        direct
    )
}

copy_hook! {
    /// `cudaError_t cudaMemcpyPeer(void* dst, int dstDevice, const void* src, int srcDevice,
    /// size_t count)`: recorded as a device-to-device copy (kind 3).
    cudaMemcpyPeer(
        dst: *mut c_void,
        dstDevice: c_int,
        src: *const c_void,
        srcDevice: c_int,
        count: usize,
    ) => (
        Geometry::linear(dst, src, count),
        cudaMemcpyDeviceToDevice,
        Some(CopyDirection::DeviceToDevice),
        LEGACY,
        direct
    )
}

copy_hook! {
    /// `cudaError_t cudaMemcpyPeerAsync(void* dst, int dstDevice, const void* src, int
    /// srcDevice, size_t count, cudaStream_t stream)`.
    cudaMemcpyPeerAsync(
        dst: *mut c_void,
        dstDevice: c_int,
        src: *const c_void,
        srcDevice: c_int,
        count: usize,
        stream: cudaStream_t,
    ) => (
        Geometry::linear(dst, src, count),
        cudaMemcpyDeviceToDevice,
        Some(CopyDirection::DeviceToDevice),
        stream,
        direct
    )
}

/// The name of the function at `addr`: its dynamic symbol, else `fn@0x...`.
fn symbol_name(addr: usize) -> String {
    let mut info = core::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads `addr` as a number and fills `info`.
    let ok = unsafe { libc::dladdr(addr as *const c_void, info.as_mut_ptr()) } != 0;
    if ok {
        // SAFETY: dladdr succeeded and filled the struct.
        let info = unsafe { info.assume_init() };
        if !info.dli_sname.is_null() && info.dli_saddr as usize == addr {
            // SAFETY: dladdr's symbol names are NUL-terminated and static.
            return unsafe { super::c_string(info.dli_sname) };
        }
    }
    format!("fn@{addr:#x}")
}

/// Notes a kernel or host-function launch on this thread.
fn launched(addr: usize) {
    let Some(_g) = thread::Guard::enter() else {
        return;
    };
    let _ = crate::catch(|| thread::with(|t| t.launched(addr, || symbol_name(addr))));
}

/// One launch entry point: `name(C signature) => address of the launched function`. The
/// function's name joins the next captured op's `kernels_before`; the real function, looked
/// up under the hook's name, is called exactly once with the program's arguments.
macro_rules! launch_hook {
    ($(#[$m:meta])* $name:ident ( $($a:ident : $t:ty),* $(,)? ) => $addr:expr) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> cudaError_t {
            let Some(real) = real::real_of!($name, fn($($t),*) -> cudaError_t, Cudart) else {
                return MISSING;
            };
            if !mode::off(mode::KERNELS) {
                launched($addr);
            }
            // SAFETY: the program's arguments, forwarded unchanged.
            unsafe { real($($a),*) }
        }
    };
}

launch_hook! {
    /// `cudaError_t cudaLaunchKernel(const void* func, dim3 gridDim, dim3 blockDim, void**
    /// args, size_t sharedMem, cudaStream_t stream)`.
    cudaLaunchKernel(
        func: *const c_void,
        gridDim: dim3,
        blockDim: dim3,
        args: *mut *mut c_void,
        sharedMem: usize,
        stream: cudaStream_t,
    ) => func as usize
}

launch_hook! {
    /// `cudaLaunchKernel` for code built with `--default-stream per-thread`.
    cudaLaunchKernel_ptsz(
        func: *const c_void,
        gridDim: dim3,
        blockDim: dim3,
        args: *mut *mut c_void,
        sharedMem: usize,
        stream: cudaStream_t,
    ) => func as usize
}

launch_hook! {
    /// `cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData)`.
    cudaLaunchHostFunc(stream: cudaStream_t, fn_: cudaHostFn_t, userData: *mut c_void)
    => fn_.map_or(0, |f| f as usize)
}

launch_hook! {
    /// `cudaLaunchHostFunc` for code built with `--default-stream per-thread`.
    cudaLaunchHostFunc_ptsz(stream: cudaStream_t, fn_: cudaHostFn_t, userData: *mut c_void)
    => fn_.map_or(0, |f| f as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A default-kind copy whose ends the runtime cannot classify (here: no runtime at all) is
    /// planned as a gap naming it, never dropped; a host-to-host copy moves no device data.
    #[test]
    fn a_copy_whose_direction_cannot_be_resolved_is_a_gap() {
        let (mut dst, src) = ([0u8; 16], [1u8; 16]);
        let g = Geometry::linear(dst.as_mut_ptr().cast(), src.as_ptr().cast(), 16);
        let c = call("cuMemcpy", g, cudaMemcpyDefault, None, LEGACY).expect("planned");
        let Op::Gap(gap) = c.op else {
            panic!("not a gap: {:?}", c.op)
        };
        assert_eq!((gap.skipped_api.as_str(), gap.bytes), ("cuMemcpy", 16));
        assert!(gap.detail.contains("direction"), "{}", gap.detail);
        assert!(call("cudaMemcpy", g, cudaMemcpyHostToHost, None, LEGACY).is_none());
    }
}
