//! Memory: allocation, pinning, memset and the memcpy family (with `_ptds`/`_ptsz` spellings).
//!
//! Copy semantics follow CUDA's "API synchronization behavior" rules:
//! * `cudaMemcpy` runs on the default stream and returns when the copy is done;
//! * `cudaMemcpyAsync` with pinned host memory (or device to device) returns at once and the
//!   bytes move when the stream reaches the copy, so the host must synchronise before reading;
//! * from pageable host memory the source is staged before the call returns;
//! * to pageable host memory the call returns only once the copy is done.

use core::ffi::{c_int, c_uint, c_void};

use cuda_abi::cudart::*;

use crate::heap::{HeapError, PointerKind};
use crate::streams::{MemcpyParams, NodeBody};
use crate::{errors, guard, out, rt, Runtime};

/// A host address the stream worker may use (device memory through its shadow mapping).
#[derive(Clone, Copy)]
struct Addr(*mut u8);
// SAFETY: an address; CUDA's stream-ordering contract makes the access race-free.
unsafe impl Send for Addr {}

impl Addr {
    /// The address (a method, so closures capture the whole `Send` wrapper).
    fn at(self, offset: usize) -> *mut u8 {
        self.0.wrapping_add(offset)
    }
}

/// One end of a copy, resolved.
#[derive(Clone, Copy)]
struct End {
    addr: Addr,
    /// Pageable host memory (neither device memory nor pinned).
    pageable: bool,
}

fn heap_error(e: HeapError) -> cudaError_t {
    match e {
        HeapError::OutOfMemory => cudaErrorMemoryAllocation,
        HeapError::NotAllocated => cudaErrorInvalidValue,
        HeapError::AlreadyRegistered => cudaErrorHostMemoryAlreadyRegistered,
        HeapError::NotRegistered => cudaErrorHostMemoryNotRegistered,
        HeapError::System => cudaErrorUnknown,
    }
}

/// Resolves a copy endpoint of `extent` bytes on the side the direction says.
fn end(
    r: &Runtime,
    ptr: *const c_void,
    extent: usize,
    device_side: bool,
) -> Result<End, cudaError_t> {
    if ptr.is_null() {
        return Err(cudaErrorInvalidValue);
    }
    if device_side {
        let a = r
            .heap
            .device_access(ptr, extent)
            .ok_or(cudaErrorInvalidValue)?;
        return Ok(End {
            addr: Addr(a),
            pageable: false,
        });
    }
    match r.heap.classify(ptr) {
        // A device pointer where the direction says host: CUDA rejects it.
        PointerKind::Device { .. } => Err(cudaErrorInvalidValue),
        // A copy must lie in the one registration it starts in: CUDA refuses one that runs on
        // into the next (seen on an H200: cudaErrorInvalidValue).
        PointerKind::Pinned { base, .. } if r.heap.registered(base) && refuse_registered(false) => {
            Err(cudaErrorInvalidValue)
        }
        PointerKind::Pinned { base, .. } if r.heap.pinned_holds(base, ptr, extent) => Ok(End {
            addr: Addr(ptr as *mut u8),
            pageable: false,
        }),
        PointerKind::Pinned { .. } => Err(cudaErrorInvalidValue),
        PointerKind::Pageable => Ok(End {
            addr: Addr(ptr as *mut u8),
            pageable: true,
        }),
    }
}

/// Fault injection for tests: with `SIM_CUDA_REFUSE_REGISTERED_COPY=K`, the K-th copy (from
/// 1, in this process) whose host end lies in registered memory is refused with
/// `cudaErrorInvalidValue`, as an H200 refused copies it could not take (docs/sim.md); with
/// `node:K`, the K-th `cudaGraphExecMemcpyNodeSetParams1D` that points a graph's copy node at
/// registered memory. Only registered memory counts, so the program's own copies (pageable
/// or `cudaMallocHost`) are never refused: the copies a tracer makes into a registered ring
/// are.
pub(crate) fn refuse_registered(node: bool) -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static WHICH: OnceLock<Option<(bool, u64)>> = OnceLock::new();
    static SEEN: AtomicU64 = AtomicU64::new(0);
    let Some((nodes, k)) = *WHICH.get_or_init(|| {
        let v = std::env::var("SIM_CUDA_REFUSE_REGISTERED_COPY").ok()?;
        let v = v.trim();
        match v.strip_prefix("node:") {
            Some(k) => Some((true, k.parse().ok()?)),
            None => Some((false, v.parse().ok()?)),
        }
    }) else {
        return false;
    };
    nodes == node && SEEN.fetch_add(1, Ordering::Relaxed) + 1 == k
}

/// Whether `p` lies in memory registered with `cudaHostRegister`.
pub(crate) fn is_registered(p: usize) -> Result<bool, cudaError_t> {
    let r = rt()?;
    Ok(match r.heap.classify(p as *const c_void) {
        PointerKind::Pinned { base, .. } => r.heap.registered(base),
        _ => false,
    })
}

/// A 2-D copy request (a 1-D copy is one row).
struct CopyRequest {
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
    /// Read the source during the call, whatever memory it is in (a pageable source always
    /// is): a batched copy with `cudaMemcpySrcAccessOrderDuringApiCall`.
    stage: bool,
}

impl CopyRequest {
    /// `count` contiguous bytes, the source read in stream order.
    fn linear(dst: *mut c_void, src: *const c_void, count: usize, kind: cudaMemcpyKind) -> Self {
        CopyRequest {
            dst,
            dpitch: count,
            src,
            spitch: count,
            width: count,
            height: 1,
            kind,
            stage: false,
        }
    }
}

/// How the call returns.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    /// `cudaMemcpy*`: on the default stream (legacy, or per-thread for `_ptds`), blocking.
    Sync { per_thread: bool },
    /// `cudaMemcpy*Async`: on the given stream.
    Async {
        stream: cudaStream_t,
        per_thread: bool,
    },
}

fn memcpy(req: CopyRequest, call: Call) -> Result<(), cudaError_t> {
    let r = rt()?;
    errors::sticky()?;
    if req.kind > cudaMemcpyDefault {
        return Err(cudaErrorInvalidMemcpyDirection);
    }
    if req.height > 1 && (req.width > req.dpitch || req.width > req.spitch) {
        return Err(cudaErrorInvalidPitchValue);
    }
    if req.width == 0 || req.height == 0 {
        return Ok(());
    }
    let extent = |pitch: usize| (req.height - 1) * pitch + req.width;
    let on_device = |p: *const c_void| matches!(r.heap.classify(p), PointerKind::Device { .. });
    let (dst_dev, src_dev) = match req.kind {
        cudaMemcpyHostToHost => (false, false),
        cudaMemcpyHostToDevice => (true, false),
        cudaMemcpyDeviceToHost => (false, true),
        cudaMemcpyDeviceToDevice => (true, true),
        _ => (on_device(req.dst), on_device(req.src)),
    };
    let dst = end(r, req.dst, extent(req.dpitch), dst_dev)?;
    let src = end(r, req.src, extent(req.spitch), src_dev)?;

    let (stream, blocking) = match call {
        Call::Sync { per_thread } => {
            r.check_capture_safe()?;
            (r.stream(std::ptr::null_mut(), per_thread)?, true)
        }
        // A copy into pageable memory cannot complete asynchronously.
        Call::Async { stream, per_thread } => (r.stream(stream, per_thread)?, dst.pageable),
    };

    let (width, height, dpitch, spitch) = (req.width, req.height, req.dpitch, req.spitch);
    let stage = src.pageable || req.stage;
    if !blocking && !stage && stream.capture().is_some() {
        // Between device and pinned memory: a memcpy node, which an instantiated graph can
        // redirect. (A pageable source is staged now: an opaque node.)
        let params = MemcpyParams::rows(
            req.dst as usize,
            dpitch,
            req.src as usize,
            spitch,
            width,
            height,
            req.kind,
        );
        return r.capture_node(&stream, cudaGraphNodeTypeMemcpy, NodeBody::Memcpy(params));
    }
    let op: crate::Op = if stage && !blocking {
        // Stage the source now: the caller may reuse it as soon as we return.
        let staged: Vec<Vec<u8>> = (0..height)
            .map(|i| {
                // SAFETY: the caller guarantees the source range is readable host memory.
                unsafe { std::slice::from_raw_parts(src.addr.0.add(i * spitch), width) }.to_vec()
            })
            .collect();
        let d = dst.addr;
        Box::new(move || {
            for (i, row) in staged.iter().enumerate() {
                // SAFETY: the destination range was validated (device) or is the caller's.
                unsafe { std::ptr::copy(row.as_ptr(), d.at(i * dpitch), width) };
            }
            Ok(())
        })
    } else {
        let (d, s) = (dst.addr, src.addr);
        Box::new(move || {
            for i in 0..height {
                // SAFETY: both ranges were validated or belong to the caller; `copy` allows
                // overlap as cudaMemcpy does not promise anything for it.
                unsafe { std::ptr::copy(s.at(i * spitch), d.at(i * dpitch), width) };
            }
            Ok(())
        })
    };
    if blocking {
        r.submit_and_wait(&stream, op)
    } else {
        r.submit(&stream, Vec::new(), op).map(|_| ())
    }
}

/// The bytes from the first to one past the last a memcpy node touches on the side whose row
/// and slice strides are `pitch` and `slice` (`None`: empty or overflowing).
fn node_extent(p: &MemcpyParams, pitch: usize, slice: usize) -> Option<usize> {
    let slices = p.depth.checked_sub(1)?.checked_mul(slice)?;
    let rows = p.height.checked_sub(1)?.checked_mul(pitch)?;
    slices.checked_add(rows)?.checked_add(p.width)
}

/// Which ends of a memcpy node the direction puts on the device (`cudaMemcpyDefault`: where
/// the pointers lie).
fn node_sides(r: &Runtime, p: &MemcpyParams) -> (bool, bool) {
    let on_device = |a: usize| {
        matches!(
            r.heap.classify(a as *const c_void),
            PointerKind::Device { .. }
        )
    };
    match p.kind {
        cudaMemcpyHostToHost => (false, false),
        cudaMemcpyHostToDevice => (true, false),
        cudaMemcpyDeviceToHost => (false, true),
        cudaMemcpyDeviceToDevice => (true, true),
        _ => (on_device(p.dst), on_device(p.src)),
    }
}

/// Checks a memcpy node's parameters when the node is added to a graph
/// (`cudaGraphAddMemcpyNode*`): a valid direction, a non-empty copy, and each end wholly in
/// memory the device reaches (one device allocation or one pinned range) on the side the
/// direction names; else `cudaErrorInvalidValue`, the one error CUDA documents for these
/// calls. Pageable host memory is refused: the simulated device cannot reach it, so a launch
/// could only fault. (No fault injection here: `end` counts the copies it refuses.)
pub(crate) fn check_memcpy_node(p: &MemcpyParams) -> Result<(), cudaError_t> {
    let r = rt()?;
    if p.kind > cudaMemcpyDefault || p.dst == 0 || p.src == 0 {
        return Err(cudaErrorInvalidValue);
    }
    if p.height > 1 && (p.width > p.dpitch || p.width > p.spitch) {
        return Err(cudaErrorInvalidValue);
    }
    let (dst_dev, src_dev) = node_sides(r, p);
    let reachable = |a: usize, extent: Option<usize>, device_side: bool| {
        let Some(extent) = extent.filter(|&e| e > 0) else {
            return false;
        };
        let host_side_device_pointer = !device_side
            && matches!(
                r.heap.classify(a as *const c_void),
                PointerKind::Device { .. }
            );
        !host_side_device_pointer && r.heap.device_access(a as *const c_void, extent).is_some()
    };
    if !reachable(p.dst, node_extent(p, p.dpitch, p.dslice), dst_dev)
        || !reachable(p.src, node_extent(p, p.spitch, p.sslice), src_dev)
    {
        return Err(cudaErrorInvalidValue);
    }
    Ok(())
}

/// The memcpy node `cudaGraphAddMemcpyNode` adds for `cudaMemcpy3D`-style parameters: pitched
/// pointers at positions (CUDA arrays are not simulated: `cudaErrorInvalidValue`), the extent's
/// width in bytes; each slice is `pitch * ysize` bytes after the one before, as in
/// [`cudaMemcpy3D`].
pub(crate) fn memcpy_node_3d(p: &cudaMemcpy3DParms) -> Result<MemcpyParams, cudaError_t> {
    if !p.srcArray.is_null() || !p.dstArray.is_null() {
        return Err(cudaErrorInvalidValue);
    }
    let e = p.extent;
    let at = |q: cudaPitchedPtr, pos: cudaPos| -> Option<(usize, usize)> {
        if q.pitch < e.width || q.ysize < e.height || q.ptr.is_null() {
            return None;
        }
        let slice = q.pitch.checked_mul(q.ysize)?;
        let offset = pos
            .z
            .checked_mul(slice)?
            .checked_add(pos.y.checked_mul(q.pitch)?)?
            .checked_add(pos.x)?;
        Some(((q.ptr as usize).checked_add(offset)?, slice))
    };
    let (dst, dslice) = at(p.dstPtr, p.dstPos).ok_or(cudaErrorInvalidValue)?;
    let (src, sslice) = at(p.srcPtr, p.srcPos).ok_or(cudaErrorInvalidValue)?;
    let params = MemcpyParams {
        dst,
        dpitch: p.dstPtr.pitch,
        src,
        spitch: p.srcPtr.pitch,
        width: e.width,
        height: e.height,
        kind: p.kind,
        depth: e.depth,
        dslice,
        sslice,
    };
    check_memcpy_node(&params)?;
    Ok(params)
}

/// Runs a memcpy node of a launched graph (on its stream's worker): its endpoints are resolved
/// now, as the device would find them.
pub(crate) fn run_memcpy_node(p: &MemcpyParams) -> Result<(), cudaError_t> {
    let r = rt()?;
    let (Some(dst_extent), Some(src_extent)) = (
        node_extent(p, p.dpitch, p.dslice),
        node_extent(p, p.spitch, p.sslice),
    ) else {
        // Nothing to copy (nodes are checked non-empty when added).
        return Ok(());
    };
    let (dst_dev, src_dev) = node_sides(r, p);
    let dst = end(r, p.dst as *const c_void, dst_extent, dst_dev)?;
    let src = end(r, p.src as *const c_void, src_extent, src_dev)?;
    if dst.pageable || src.pageable {
        // The device cannot reach pageable memory.
        return Err(cudaErrorIllegalAddress);
    }
    for z in 0..p.depth {
        for i in 0..p.height {
            // SAFETY: both ranges were resolved as device-accessible memory just now, and
            // every row of every slice lies within the extents resolved.
            unsafe {
                std::ptr::copy(
                    src.addr.at(z * p.sslice + i * p.spitch),
                    dst.addr.at(z * p.dslice + i * p.dpitch),
                    p.width,
                )
            };
        }
    }
    Ok(())
}

/// Whether `a` and `b` are the same kind of memory for a memcpy node (device memory of one
/// device, or pinned host memory): what `cudaGraphExecMemcpyNodeSetParams1D` may change.
pub(crate) fn same_memory_kind(a: usize, b: usize) -> Result<bool, cudaError_t> {
    let r = rt()?;
    let kind = |p: usize| match r.heap.classify(p as *const c_void) {
        PointerKind::Device { device, .. } => Some(device),
        PointerKind::Pinned { .. } => None,
        PointerKind::Pageable => Some(-1),
    };
    Ok(kind(a) == kind(b))
}

fn copy1d(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
    call: Call,
) -> cudaError_t {
    guard(|| memcpy(CopyRequest::linear(dst, src, count, kind), call))
}

#[allow(clippy::too_many_arguments)]
fn copy2d(
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
    call: Call,
) -> cudaError_t {
    guard(|| {
        memcpy(
            CopyRequest {
                dst,
                dpitch,
                src,
                spitch,
                width,
                height,
                kind,
                stage: false,
            },
            call,
        )
    })
}

const LEGACY: Call = Call::Sync { per_thread: false };
const PTDS: Call = Call::Sync { per_thread: true };
fn on(stream: cudaStream_t, per_thread: bool) -> Call {
    Call::Async { stream, per_thread }
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    copy1d(dst, src, count, kind, LEGACY)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy_ptds(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    copy1d(dst, src, count, kind, PTDS)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyAsync(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    copy1d(dst, src, count, kind, on(stream, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyAsync_ptsz(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    copy1d(dst, src, count, kind, on(stream, true))
}
/// A 3-D copy between pitched linear memory: each slice a 2-D copy, in order on one stream.
/// CUDA arrays are not simulated (`cudaErrorInvalidValue`, as for an array argument the
/// runtime cannot use).
fn copy3d(p: *const cudaMemcpy3DParms, call: Call) -> cudaError_t {
    guard(|| {
        if p.is_null() {
            return Err(cudaErrorInvalidValue);
        }
        // SAFETY: the caller passes a valid parameter block (checked non-null above).
        let p = unsafe { *p };
        let src = (p.srcArray, p.srcPos, p.srcPtr);
        let dst = (p.dstArray, p.dstPos, p.dstPtr);
        copy3d_between(src, dst, p.extent, p.kind, call)
    })
}

/// A 3-D copy between devices (`cudaMemcpy3DPeer*`): one between pitched device memory.
fn copy3d_peer(p: *const cudaMemcpy3DPeerParms, call: Call) -> cudaError_t {
    guard(|| {
        if p.is_null() {
            return Err(cudaErrorInvalidValue);
        }
        // SAFETY: the caller passes a valid parameter block (checked non-null above).
        let p = unsafe { *p };
        check_peer(p.dstDevice, p.srcDevice)?;
        let src = (p.srcArray, p.srcPos, p.srcPtr);
        let dst = (p.dstArray, p.dstPos, p.dstPtr);
        copy3d_between(src, dst, p.extent, cudaMemcpyDeviceToDevice, call)
    })
}

/// One end of a 3-D copy: a CUDA array (refused) or pitched memory, at a position.
type End3d = (cudaArray_t, cudaPos, cudaPitchedPtr);

fn copy3d_between(
    src: End3d,
    dst: End3d,
    e: cudaExtent,
    kind: cudaMemcpyKind,
    call: Call,
) -> Result<(), cudaError_t> {
    if !src.0.is_null() || !dst.0.is_null() {
        return Err(cudaErrorInvalidValue);
    }
    if e.width == 0 || e.height == 0 || e.depth == 0 {
        return Ok(());
    }
    let at = |q: cudaPitchedPtr, pos: cudaPos, slice: usize| -> Result<usize, cudaError_t> {
        if q.pitch < e.width || q.ysize < e.height {
            return Err(cudaErrorInvalidPitchValue);
        }
        let offset = (pos.z + slice) * q.pitch * q.ysize + pos.y * q.pitch + pos.x;
        Ok(q.ptr as usize + offset)
    };
    for slice in 0..e.depth {
        memcpy(
            CopyRequest {
                dst: at(dst.2, dst.1, slice)? as *mut c_void,
                dpitch: dst.2.pitch,
                src: at(src.2, src.1, slice)? as *const c_void,
                spitch: src.2.pitch,
                width: e.width,
                height: e.height,
                kind,
                stage: false,
            },
            call,
        )?;
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy3DPeer(p: *const cudaMemcpy3DPeerParms) -> cudaError_t {
    copy3d_peer(p, LEGACY)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy3DPeer_ptds(p: *const cudaMemcpy3DPeerParms) -> cudaError_t {
    copy3d_peer(p, PTDS)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy3DPeerAsync(
    p: *const cudaMemcpy3DPeerParms,
    stream: cudaStream_t,
) -> cudaError_t {
    copy3d_peer(p, on(stream, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy3DPeerAsync_ptsz(
    p: *const cudaMemcpy3DPeerParms,
    stream: cudaStream_t,
) -> cudaError_t {
    copy3d_peer(p, on(stream, true))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy3D(p: *const cudaMemcpy3DParms) -> cudaError_t {
    copy3d(p, LEGACY)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy3D_ptds(p: *const cudaMemcpy3DParms) -> cudaError_t {
    copy3d(p, PTDS)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy3DAsync(
    p: *const cudaMemcpy3DParms,
    stream: cudaStream_t,
) -> cudaError_t {
    copy3d(p, on(stream, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy3DAsync_ptsz(
    p: *const cudaMemcpy3DParms,
    stream: cudaStream_t,
) -> cudaError_t {
    copy3d(p, on(stream, true))
}

/// A batch of linear copies (`cudaMemcpyBatchAsync`, CUDA 12.8+): validated as CUDA validates
/// it (a stream that is not the legacy one, one attribute set per copy with a valid source
/// access order, every end resolvable: else `cudaErrorInvalidValue` and nothing enqueued, the
/// failing copy's index in `fail_idx`, `SIZE_MAX` when no copy is at fault), then each copy
/// as a `cudaMemcpyAsync` of kind `cudaMemcpyDefault` on the stream, its source read during
/// the call under `cudaMemcpySrcAccessOrderDuringApiCall`.
#[allow(clippy::too_many_arguments)]
fn copy_batch(
    dsts: *const *mut c_void,
    srcs: *const *const c_void,
    sizes: *const usize,
    count: usize,
    attrs: *const cudaMemcpyAttributes,
    attrs_idxs: *const usize,
    num_attrs: usize,
    fail_idx: *mut usize,
    stream: cudaStream_t,
    per_thread: bool,
) -> cudaError_t {
    copy_batch_on(
        (dsts, srcs, sizes, count),
        (attrs, attrs_idxs, num_attrs),
        fail_idx,
        stream,
        per_thread,
        false,
    )
}

/// [`copy_batch`], on the legacy default stream too when `legacy_ok` (a single copy with
/// attributes: CUDA documents no such restriction for it).
#[allow(clippy::type_complexity)]
fn copy_batch_on(
    (dsts, srcs, sizes, count): (
        *const *mut c_void,
        *const *const c_void,
        *const usize,
        usize,
    ),
    (attrs, attrs_idxs, num_attrs): (*const cudaMemcpyAttributes, *const usize, usize),
    fail_idx: *mut usize,
    stream: cudaStream_t,
    per_thread: bool,
    legacy_ok: bool,
) -> cudaError_t {
    let mut failed = usize::MAX;
    let r = guard(|| {
        let r = rt()?;
        errors::sticky()?;
        let arrays = [
            dsts as usize,
            srcs as usize,
            sizes as usize,
            attrs as usize,
            attrs_idxs as usize,
        ];
        if count == 0 || num_attrs == 0 || num_attrs > count || arrays.contains(&0) {
            return Err(cudaErrorInvalidValue);
        }
        if !legacy_ok && ((stream.is_null() && !per_thread) || stream == cudaStreamLegacy) {
            return Err(cudaErrorInvalidValue);
        }
        // SAFETY: the caller's arrays of `count` (copies) and `num_attrs` (attributes) entries,
        // checked non-null above.
        let (dsts, srcs, sizes, attrs, idxs) = unsafe {
            (
                std::slice::from_raw_parts(dsts, count),
                std::slice::from_raw_parts(srcs, count),
                std::slice::from_raw_parts(sizes, count),
                std::slice::from_raw_parts(attrs, num_attrs),
                std::slice::from_raw_parts(attrs_idxs, num_attrs),
            )
        };
        if idxs[0] != 0 || idxs.windows(2).any(|w| w[1] <= w[0]) || idxs[num_attrs - 1] >= count {
            return Err(cudaErrorInvalidValue);
        }
        let mut order = vec![cudaMemcpySrcAccessOrderInvalid; count];
        for (k, (a, &first)) in attrs.iter().zip(idxs).enumerate() {
            let last = idxs.get(k + 1).copied().unwrap_or(count);
            if !(cudaMemcpySrcAccessOrderStream..=cudaMemcpySrcAccessOrderAny)
                .contains(&a.srcAccessOrder)
            {
                failed = first;
                return Err(cudaErrorInvalidValue);
            }
            order[first..last].fill(a.srcAccessOrder);
        }
        let on_device = |p: *const c_void| matches!(r.heap.classify(p), PointerKind::Device { .. });
        for i in 0..count {
            if sizes[i] == 0 {
                continue;
            }
            let ends = end(r, dsts[i], sizes[i], on_device(dsts[i]))
                .and_then(|_| end(r, srcs[i], sizes[i], on_device(srcs[i])));
            if ends.is_err() {
                failed = i;
                return Err(cudaErrorInvalidValue);
            }
        }
        r.stream(stream, per_thread)?;
        for i in 0..count {
            let req = CopyRequest {
                stage: order[i] == cudaMemcpySrcAccessOrderDuringApiCall,
                ..CopyRequest::linear(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault)
            };
            memcpy(req, on(stream, per_thread))?;
        }
        Ok(())
    });
    if r != cudaSuccess && !fail_idx.is_null() {
        // SAFETY: the caller's out-pointer (non-null).
        unsafe { *fail_idx = failed };
    }
    r
}

/// `cudaMemcpyBatchAsync` as CUDA 12.8 declares it (with `failIdx`).
#[cfg(not(sim_cuda13))]
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyBatchAsync(
    dsts: *mut *mut c_void,
    srcs: *mut *mut c_void,
    sizes: *mut usize,
    count: usize,
    attrs: *mut cudaMemcpyAttributes,
    attrsIdxs: *mut usize,
    numAttrs: usize,
    failIdx: *mut usize,
    stream: cudaStream_t,
) -> cudaError_t {
    let srcs = srcs as *const *const c_void;
    copy_batch(
        dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, stream, false,
    )
}
#[cfg(not(sim_cuda13))]
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyBatchAsync_ptsz(
    dsts: *mut *mut c_void,
    srcs: *mut *mut c_void,
    sizes: *mut usize,
    count: usize,
    attrs: *mut cudaMemcpyAttributes,
    attrsIdxs: *mut usize,
    numAttrs: usize,
    failIdx: *mut usize,
    stream: cudaStream_t,
) -> cudaError_t {
    let srcs = srcs as *const *const c_void;
    copy_batch(
        dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, stream, true,
    )
}

/// A batch of 3-D copies (`cudaMemcpy3DBatchAsync`, CUDA 12.8+) between pointers (CUDA
/// arrays are not simulated: `cudaErrorInvalidValue`), validated as CUDA documents it (not the
/// legacy stream unless `legacy_ok`, `flags` 0, extents not 0, row lengths and layer heights 0
/// or at least the extent's, a valid source access order: else nothing enqueued and the failing
/// copy's index in `fail_idx`), then each copy slice by slice as `cudaMemcpy2DAsync`s of kind
/// `cudaMemcpyDefault` (an element is a byte between pointers).
fn copy_3d_batch(
    ops: *const cudaMemcpy3DBatchOp,
    n: usize,
    fail_idx: *mut usize,
    flags: u64,
    stream: cudaStream_t,
    (per_thread, legacy_ok): (bool, bool),
) -> cudaError_t {
    let mut failed = usize::MAX;
    let r = guard(|| {
        rt()?;
        errors::sticky()?;
        if n == 0 || ops.is_null() || flags != 0 {
            return Err(cudaErrorInvalidValue);
        }
        if !legacy_ok && ((stream.is_null() && !per_thread) || stream == cudaStreamLegacy) {
            return Err(cudaErrorInvalidValue);
        }
        // SAFETY: the caller's array of `n` operations (non-null).
        let ops = unsafe { std::slice::from_raw_parts(ops, n) };
        let mut plans = Vec::with_capacity(n);
        for (i, op) in ops.iter().enumerate() {
            let e = op.extent;
            let order = op.srcAccessOrder;
            let ends = op.src.pointer().zip(op.dst.pointer());
            let valid = |row: usize, layer: usize| {
                (row == 0 || row >= e.width) && (layer == 0 || layer >= e.height)
            };
            let ok = e.width > 0
                && e.height > 0
                && e.depth > 0
                && (cudaMemcpySrcAccessOrderStream..=cudaMemcpySrcAccessOrderAny).contains(&order)
                && ends.is_some_and(|(s, d)| valid(s.1, s.2) && valid(d.1, d.2));
            let Some((src, dst)) = ends.filter(|_| ok) else {
                failed = i;
                return Err(cudaErrorInvalidValue);
            };
            plans.push((src, dst, e, order == cudaMemcpySrcAccessOrderDuringApiCall));
        }
        for (src, dst, e, stage) in plans {
            let pitch = |row: usize| if row == 0 { e.width } else { row };
            let layer = |row: usize, height: usize| {
                pitch(row) * if height == 0 { e.height } else { height }
            };
            for z in 0..e.depth {
                let req = CopyRequest {
                    dst: dst
                        .0
                        .cast::<u8>()
                        .wrapping_add(z * layer(dst.1, dst.2))
                        .cast(),
                    dpitch: pitch(dst.1),
                    src: src
                        .0
                        .cast::<u8>()
                        .wrapping_add(z * layer(src.1, src.2))
                        .cast(),
                    spitch: pitch(src.1),
                    width: e.width,
                    height: e.height,
                    kind: cudaMemcpyDefault,
                    stage,
                };
                memcpy(req, on(stream, per_thread))?;
            }
        }
        Ok(())
    });
    if r != cudaSuccess && !fail_idx.is_null() {
        // SAFETY: the caller's out-pointer (non-null).
        unsafe { *fail_idx = failed };
    }
    r
}

/// `cudaMemcpy3DBatchAsync` as CUDA 12.8 declares it (with `failIdx`).
#[cfg(not(sim_cuda13))]
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy3DBatchAsync(
    numOps: usize,
    opList: *mut cudaMemcpy3DBatchOp,
    failIdx: *mut usize,
    flags: core::ffi::c_ulonglong,
    stream: cudaStream_t,
) -> cudaError_t {
    copy_3d_batch(opList, numOps, failIdx, flags, stream, (false, false))
}
#[cfg(not(sim_cuda13))]
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy3DBatchAsync_ptsz(
    numOps: usize,
    opList: *mut cudaMemcpy3DBatchOp,
    failIdx: *mut usize,
    flags: core::ffi::c_ulonglong,
    stream: cudaStream_t,
) -> cudaError_t {
    copy_3d_batch(opList, numOps, failIdx, flags, stream, (true, false))
}

/// `cudaMemcpy3DBatchAsync` as CUDA 13 declares it (`failIdx` gone).
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy3DBatchAsync(
    numOps: usize,
    opList: *mut cudaMemcpy3DBatchOp,
    flags: core::ffi::c_ulonglong,
    stream: cudaStream_t,
) -> cudaError_t {
    let none = std::ptr::null_mut();
    copy_3d_batch(opList, numOps, none, flags, stream, (false, false))
}
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy3DBatchAsync_ptsz(
    numOps: usize,
    opList: *mut cudaMemcpy3DBatchOp,
    flags: core::ffi::c_ulonglong,
    stream: cudaStream_t,
) -> cudaError_t {
    let none = std::ptr::null_mut();
    copy_3d_batch(opList, numOps, none, flags, stream, (true, false))
}

/// `cudaMemcpy3DWithAttributesAsync` (CUDA 13): one 3-D copy, as a batch of one.
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy3DWithAttributesAsync(
    op: *mut cudaMemcpy3DBatchOp,
    flags: core::ffi::c_ulonglong,
    stream: cudaStream_t,
) -> cudaError_t {
    copy_3d_batch(op, 1, std::ptr::null_mut(), flags, stream, (false, true))
}
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy3DWithAttributesAsync_ptsz(
    op: *mut cudaMemcpy3DBatchOp,
    flags: core::ffi::c_ulonglong,
    stream: cudaStream_t,
) -> cudaError_t {
    copy_3d_batch(op, 1, std::ptr::null_mut(), flags, stream, (true, true))
}

/// `cudaMemcpyWithAttributesAsync` (CUDA 13): one copy with its attributes, as a batch of one.
#[cfg(sim_cuda13)]
fn copy_with_attributes(
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
    attr: *mut cudaMemcpyAttributes,
    stream: cudaStream_t,
    per_thread: bool,
) -> cudaError_t {
    let (dsts, srcs, sizes, first) = ([dst], [src], [size], [0usize]);
    let none = std::ptr::null_mut();
    let (d, s, z, i) = (dsts.as_ptr(), srcs.as_ptr(), sizes.as_ptr(), first.as_ptr());
    copy_batch_on((d, s, z, 1), (attr, i, 1), none, stream, per_thread, true)
}

#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyWithAttributesAsync(
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
    attr: *mut cudaMemcpyAttributes,
    stream: cudaStream_t,
) -> cudaError_t {
    copy_with_attributes(dst, src, size, attr, stream, false)
}
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyWithAttributesAsync_ptsz(
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
    attr: *mut cudaMemcpyAttributes,
    stream: cudaStream_t,
) -> cudaError_t {
    copy_with_attributes(dst, src, size, attr, stream, true)
}

/// `cudaMemcpyBatchAsync` as CUDA 13 declares it (`failIdx` gone, const arrays).
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyBatchAsync(
    dsts: *const *mut c_void,
    srcs: *const *const c_void,
    sizes: *const usize,
    count: usize,
    attrs: *mut cudaMemcpyAttributes,
    attrsIdxs: *mut usize,
    numAttrs: usize,
    stream: cudaStream_t,
) -> cudaError_t {
    let none = std::ptr::null_mut();
    copy_batch(
        dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, none, stream, false,
    )
}
#[cfg(sim_cuda13)]
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyBatchAsync_ptsz(
    dsts: *const *mut c_void,
    srcs: *const *const c_void,
    sizes: *const usize,
    count: usize,
    attrs: *mut cudaMemcpyAttributes,
    attrsIdxs: *mut usize,
    numAttrs: usize,
    stream: cudaStream_t,
) -> cudaError_t {
    let none = std::ptr::null_mut();
    copy_batch(
        dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, none, stream, true,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy2D(
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    copy2d(dst, dpitch, src, spitch, width, height, kind, LEGACY)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy2D_ptds(
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    copy2d(dst, dpitch, src, spitch, width, height, kind, PTDS)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy2DAsync(
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    copy2d(
        dst,
        dpitch,
        src,
        spitch,
        width,
        height,
        kind,
        on(stream, false),
    )
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy2DAsync_ptsz(
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    copy2d(
        dst,
        dpitch,
        src,
        spitch,
        width,
        height,
        kind,
        on(stream, true),
    )
}

fn check_peer(dst_device: c_int, src_device: c_int) -> Result<(), cudaError_t> {
    let n = rt()?.device_count();
    if (0..n).contains(&dst_device) && (0..n).contains(&src_device) {
        Ok(())
    } else {
        Err(cudaErrorInvalidDevice)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyPeer(
    dst: *mut c_void,
    dst_device: c_int,
    src: *const c_void,
    src_device: c_int,
    count: usize,
) -> cudaError_t {
    match check_peer(dst_device, src_device) {
        Ok(()) => copy1d(dst, src, count, cudaMemcpyDeviceToDevice, LEGACY),
        Err(e) => errors::status(Err(e)),
    }
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyPeerAsync(
    dst: *mut c_void,
    dst_device: c_int,
    src: *const c_void,
    src_device: c_int,
    count: usize,
    stream: cudaStream_t,
) -> cudaError_t {
    match check_peer(dst_device, src_device) {
        Ok(()) => copy1d(dst, src, count, cudaMemcpyDeviceToDevice, on(stream, false)),
        Err(e) => errors::status(Err(e)),
    }
}

/// The bytes a memset sets: `depth` slices of `height` rows of `width` bytes, rows `pitch`
/// bytes apart, slices `slice` bytes apart (a 1-D memset is one row of one slice).
#[derive(Clone, Copy)]
struct Fill {
    width: usize,
    height: usize,
    depth: usize,
    pitch: usize,
    slice: usize,
}

impl Fill {
    fn linear(count: usize) -> Fill {
        Fill::rows(count, count, 1)
    }

    fn rows(pitch: usize, width: usize, height: usize) -> Fill {
        Fill {
            width,
            height,
            depth: 1,
            pitch,
            slice: pitch.saturating_mul(height),
        }
    }

    /// `cudaMemset3D`'s fill: slices are `pitch * ysize` bytes apart.
    fn pitched(p: cudaPitchedPtr, e: cudaExtent) -> Fill {
        Fill {
            width: e.width,
            height: e.height,
            depth: e.depth,
            pitch: p.pitch,
            slice: p.pitch.saturating_mul(p.ysize),
        }
    }

    /// The bytes from the first to one past the last written (`None`: overflow).
    fn extent(self) -> Option<usize> {
        let rows = self.depth.checked_sub(1)?.checked_mul(self.slice)?;
        let rows = rows.checked_add(self.height.checked_sub(1)?.checked_mul(self.pitch)?)?;
        rows.checked_add(self.width)
    }

    fn is_empty(self) -> bool {
        self.width == 0 || self.height == 0 || self.depth == 0
    }
}

fn memset(ptr: *mut c_void, value: c_int, fill: Fill, call: Call) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        errors::sticky()?;
        if fill.is_empty() {
            return Ok(());
        }
        // CUDA: a row wider than the pitch is invalid (2-D and 3-D memsets).
        if fill.height * fill.depth > 1 && fill.width > fill.pitch {
            return Err(cudaErrorInvalidValue);
        }
        let extent = fill.extent().ok_or(cudaErrorInvalidValue)?;
        let a = Addr(
            r.heap
                .device_access(ptr, extent)
                .ok_or(cudaErrorInvalidValue)?,
        );
        let stream = match call {
            Call::Sync { per_thread } => r.stream(std::ptr::null_mut(), per_thread)?,
            Call::Async { stream, per_thread } => r.stream(stream, per_thread)?,
        };
        // cudaMemset is asynchronous with respect to the host for device memory.
        let op: crate::Op = Box::new(move || {
            for z in 0..fill.depth {
                for y in 0..fill.height {
                    let row = z * fill.slice + y * fill.pitch;
                    // SAFETY: the whole extent was validated as device-accessible.
                    unsafe { std::ptr::write_bytes(a.at(row), value as u8, fill.width) };
                }
            }
            Ok(())
        });
        r.submit_as(&stream, Vec::new(), op, cudaGraphNodeTypeMemset)
            .map(|_| ())
    })
}

/// The work of a memset node (`cudaGraphAddMemsetNode`): `height` rows of `width` elements of
/// `elementSize` bytes (1, 2 or 4) set to `value`'s low bytes, rows `pitch` bytes apart (the
/// pitch is unused for one row). Checked when the node is added, as CUDA does: the element
/// size, a non-empty fill, a destination aligned to the element size, a pitch that holds a row
/// (and is a multiple of the element size), and the whole fill in one allocation the device
/// reaches; else `cudaErrorInvalidValue`. The destination is resolved again at each launch
/// (memory freed since is a fault, as on a device).
pub(crate) fn memset_node(p: &cudaMemsetParams) -> Result<crate::Op, cudaError_t> {
    let r = rt()?;
    let size = match p.elementSize {
        1 | 2 | 4 => p.elementSize as usize,
        _ => return Err(cudaErrorInvalidValue),
    };
    let dst = p.dst as usize;
    if dst == 0 || !dst.is_multiple_of(size) || p.width == 0 || p.height == 0 {
        return Err(cudaErrorInvalidValue);
    }
    let row = p.width.checked_mul(size).ok_or(cudaErrorInvalidValue)?;
    let pitch = if p.height == 1 { row } else { p.pitch };
    if pitch < row || !pitch.is_multiple_of(size) {
        return Err(cudaErrorInvalidValue);
    }
    let height = p.height;
    let extent = Fill::rows(pitch, row, height)
        .extent()
        .ok_or(cudaErrorInvalidValue)?;
    r.heap
        .device_access(p.dst, extent)
        .ok_or(cudaErrorInvalidValue)?;
    let value = p.value;
    Ok(Box::new(move || {
        let a = rt()?
            .heap
            .device_access(dst as *const c_void, extent)
            .ok_or(cudaErrorIllegalAddress)?;
        for y in 0..height {
            let at = a.wrapping_add(y * pitch);
            // SAFETY: the whole extent was resolved as device-accessible just now; the
            // destination and the pitch are multiples of the element size, so each element
            // is aligned for its type.
            unsafe {
                match size {
                    1 => std::ptr::write_bytes(at, value as u8, row),
                    2 => {
                        std::slice::from_raw_parts_mut(at.cast::<u16>(), row / 2).fill(value as u16)
                    }
                    _ => std::slice::from_raw_parts_mut(at.cast::<u32>(), row / 4).fill(value),
                }
            }
        }
        Ok(())
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cudaMemset(ptr: *mut c_void, value: c_int, count: usize) -> cudaError_t {
    memset(ptr, value, Fill::linear(count), LEGACY)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemset_ptds(
    ptr: *mut c_void,
    value: c_int,
    count: usize,
) -> cudaError_t {
    memset(ptr, value, Fill::linear(count), PTDS)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemsetAsync(
    ptr: *mut c_void,
    value: c_int,
    count: usize,
    stream: cudaStream_t,
) -> cudaError_t {
    memset(ptr, value, Fill::linear(count), on(stream, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemsetAsync_ptsz(
    ptr: *mut c_void,
    value: c_int,
    count: usize,
    stream: cudaStream_t,
) -> cudaError_t {
    memset(ptr, value, Fill::linear(count), on(stream, true))
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemset2D(
    ptr: *mut c_void,
    pitch: usize,
    value: c_int,
    width: usize,
    height: usize,
) -> cudaError_t {
    memset(ptr, value, Fill::rows(pitch, width, height), LEGACY)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemset2D_ptds(
    ptr: *mut c_void,
    pitch: usize,
    value: c_int,
    width: usize,
    height: usize,
) -> cudaError_t {
    memset(ptr, value, Fill::rows(pitch, width, height), PTDS)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemset2DAsync(
    ptr: *mut c_void,
    pitch: usize,
    value: c_int,
    width: usize,
    height: usize,
    stream: cudaStream_t,
) -> cudaError_t {
    let fill = Fill::rows(pitch, width, height);
    memset(ptr, value, fill, on(stream, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemset2DAsync_ptsz(
    ptr: *mut c_void,
    pitch: usize,
    value: c_int,
    width: usize,
    height: usize,
    stream: cudaStream_t,
) -> cudaError_t {
    let fill = Fill::rows(pitch, width, height);
    memset(ptr, value, fill, on(stream, true))
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemset3D(
    p: cudaPitchedPtr,
    value: c_int,
    extent: cudaExtent,
) -> cudaError_t {
    memset(p.ptr, value, Fill::pitched(p, extent), LEGACY)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemset3D_ptds(
    p: cudaPitchedPtr,
    value: c_int,
    extent: cudaExtent,
) -> cudaError_t {
    memset(p.ptr, value, Fill::pitched(p, extent), PTDS)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemset3DAsync(
    p: cudaPitchedPtr,
    value: c_int,
    extent: cudaExtent,
    stream: cudaStream_t,
) -> cudaError_t {
    memset(p.ptr, value, Fill::pitched(p, extent), on(stream, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemset3DAsync_ptsz(
    p: cudaPitchedPtr,
    value: c_int,
    extent: cudaExtent,
    stream: cudaStream_t,
) -> cudaError_t {
    memset(p.ptr, value, Fill::pitched(p, extent), on(stream, true))
}

/// A `__device__` or `__constant__` variable registered by `__cudaRegisterVar`: its size, its
/// initial bytes, and its storage on each device that used it.
struct Symbol {
    size: usize,
    initial: Vec<u8>,
    on_device: std::collections::BTreeMap<i32, usize>,
}

/// Registered variables by the address of their host shadow (what the program passes as
/// `symbol`).
fn symbols() -> &'static std::sync::Mutex<std::collections::HashMap<usize, Symbol>> {
    static SYMBOLS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<usize, Symbol>>,
    > = std::sync::OnceLock::new();
    SYMBOLS.get_or_init(Default::default)
}

/// Registers the variable whose host shadow is `host_var` (`size` bytes, read now as its
/// initial value).
pub(crate) fn register_symbol(host_var: *const c_void, size: usize) {
    if host_var.is_null() {
        return;
    }
    // SAFETY: the registration names a host variable of `size` bytes.
    let initial = unsafe { std::slice::from_raw_parts(host_var.cast::<u8>(), size) }.to_vec();
    let mut m = symbols().lock().unwrap_or_else(|p| p.into_inner());
    m.entry(host_var as usize).or_insert(Symbol {
        size,
        initial,
        on_device: Default::default(),
    });
}

/// The storage of `symbol` on the current device (made and initialised at its first use there)
/// and its size; `cudaErrorInvalidSymbol` for an address no variable was registered at.
fn symbol_storage(r: &Runtime, symbol: *const c_void) -> Result<(usize, usize), cudaError_t> {
    let device = r.current_device();
    let mut m = symbols().lock().unwrap_or_else(|p| p.into_inner());
    let s = m
        .get_mut(&(symbol as usize))
        .ok_or(cudaErrorInvalidSymbol)?;
    if let Some(&p) = s.on_device.get(&device) {
        return Ok((p, s.size));
    }
    r.activate(device);
    let p = r.heap.alloc(s.size.max(1), device).map_err(heap_error)?;
    let at = r
        .heap
        .device_access(p, s.size.max(1))
        .ok_or(cudaErrorInvalidValue)?;
    // SAFETY: where the fresh device allocation of at least `size` bytes lives in this
    // process, written before any stream can use it.
    unsafe { std::ptr::copy_nonoverlapping(s.initial.as_ptr(), at.cast::<u8>(), s.size) };
    let p = p as usize;
    s.on_device.insert(device, p);
    Ok((p, s.size))
}

/// A copy to (`to` true) or from `symbol` at `offset`, `count` bytes, as `cudaMemcpy` or
/// `cudaMemcpyAsync` does it; `host` is the other end.
fn symbol_copy(
    symbol: *const c_void,
    host: *mut c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    to: bool,
    call: Call,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let allowed = if to {
            [
                cudaMemcpyHostToDevice,
                cudaMemcpyDeviceToDevice,
                cudaMemcpyDefault,
            ]
        } else {
            [
                cudaMemcpyDeviceToHost,
                cudaMemcpyDeviceToDevice,
                cudaMemcpyDefault,
            ]
        };
        if !allowed.contains(&kind) {
            return Err(cudaErrorInvalidMemcpyDirection);
        }
        let (p, size) = symbol_storage(r, symbol)?;
        if offset.checked_add(count).is_none_or(|end| end > size) {
            return Err(cudaErrorInvalidValue);
        }
        let at = (p + offset) as *mut c_void;
        let (dst, src) = if to {
            (at, host.cast_const())
        } else {
            (host, at.cast_const())
        };
        memcpy(CopyRequest::linear(dst, src, count, kind), call)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetSymbolAddress(
    dev_ptr: *mut *mut c_void,
    symbol: *const c_void,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let (p, _) = symbol_storage(r, symbol)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(dev_ptr, p as *mut c_void) }
    })
}
#[no_mangle]
pub unsafe extern "C" fn cudaGetSymbolSize(size: *mut usize, symbol: *const c_void) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let (_, n) = symbol_storage(r, symbol)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(size, n) }
    })
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyToSymbol(
    symbol: *const c_void,
    src: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    symbol_copy(symbol, src.cast_mut(), count, offset, kind, true, LEGACY)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyToSymbol_ptds(
    symbol: *const c_void,
    src: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    symbol_copy(symbol, src.cast_mut(), count, offset, kind, true, PTDS)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyToSymbolAsync(
    symbol: *const c_void,
    src: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    symbol_copy(
        symbol,
        src.cast_mut(),
        count,
        offset,
        kind,
        true,
        on(stream, false),
    )
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyToSymbolAsync_ptsz(
    symbol: *const c_void,
    src: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    symbol_copy(
        symbol,
        src.cast_mut(),
        count,
        offset,
        kind,
        true,
        on(stream, true),
    )
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyFromSymbol(
    dst: *mut c_void,
    symbol: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    symbol_copy(symbol, dst, count, offset, kind, false, LEGACY)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyFromSymbol_ptds(
    dst: *mut c_void,
    symbol: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    symbol_copy(symbol, dst, count, offset, kind, false, PTDS)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyFromSymbolAsync(
    dst: *mut c_void,
    symbol: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    symbol_copy(symbol, dst, count, offset, kind, false, on(stream, false))
}
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyFromSymbolAsync_ptsz(
    dst: *mut c_void,
    symbol: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    symbol_copy(symbol, dst, count, offset, kind, false, on(stream, true))
}

/// A CUDA array: rows of `width` elements of `elem` bytes, `height` of them, kept as packed
/// device memory at `base` (its handle is an address of its own, not device memory).
#[derive(Clone, Copy)]
struct ArrayStore {
    base: usize,
    elem: usize,
    width: usize,
    height: usize,
}

impl ArrayStore {
    fn pitch(&self) -> usize {
        self.width * self.elem
    }

    /// The device address of byte `w_offset` of row `h_offset`, for `bytes` running on
    /// linearly (`rows` rows of `row` bytes when 2-D): inside the array, else
    /// `cudaErrorInvalidValue`.
    fn at(
        &self,
        w_offset: usize,
        h_offset: usize,
        row: usize,
        rows: usize,
    ) -> Result<usize, cudaError_t> {
        let inside = w_offset.checked_add(row).is_some_and(|e| e <= self.pitch())
            && h_offset.checked_add(rows).is_some_and(|e| e <= self.height);
        if inside {
            Ok(self.base + h_offset * self.pitch() + w_offset)
        } else {
            Err(cudaErrorInvalidValue)
        }
    }

    /// As [`ArrayStore::at`] for `count` bytes from (`w_offset`, `h_offset`), across rows.
    fn linear(&self, w_offset: usize, h_offset: usize, count: usize) -> Result<usize, cudaError_t> {
        let start = h_offset
            .checked_mul(self.pitch())
            .and_then(|s| s.checked_add(w_offset))
            .filter(|_| w_offset < self.pitch());
        match start {
            Some(s)
                if s.checked_add(count)
                    .is_some_and(|e| e <= self.pitch() * self.height) =>
            {
                Ok(self.base + s)
            }
            _ => Err(cudaErrorInvalidValue),
        }
    }
}

fn arrays() -> &'static std::sync::Mutex<std::collections::HashMap<usize, ArrayStore>> {
    static ARRAYS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<usize, ArrayStore>>,
    > = std::sync::OnceLock::new();
    ARRAYS.get_or_init(Default::default)
}

fn array(a: cudaArray_const_t) -> Result<ArrayStore, cudaError_t> {
    let arrays = arrays().lock().unwrap_or_else(|p| p.into_inner());
    arrays
        .get(&(a as usize))
        .copied()
        .ok_or(cudaErrorInvalidResourceHandle)
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocArray(
    array: *mut cudaArray_t,
    desc: *const cudaChannelFormatDesc,
    width: usize,
    height: usize,
    flags: c_uint,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        if array.is_null() || desc.is_null() || width == 0 || flags != 0 {
            return Err(cudaErrorInvalidValue);
        }
        // SAFETY: the caller's descriptor (non-null).
        let d = unsafe { *desc };
        let bits = [d.x, d.y, d.z, d.w];
        if bits.iter().any(|&b| b < 0 || b % 8 != 0) || bits.iter().sum::<c_int>() == 0 {
            return Err(cudaErrorInvalidChannelDescriptor);
        }
        let elem = bits.iter().sum::<c_int>() as usize / 8;
        let height = height.max(1);
        r.check_capture_safe()?;
        r.activate(r.current_device());
        let base = r
            .heap
            .alloc(width * elem * height, r.current_device())
            .map_err(heap_error)?;
        let handle = Box::into_raw(Box::new(0u8)) as usize;
        let store = ArrayStore {
            base: base as usize,
            elem,
            width,
            height,
        };
        arrays()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(handle, store);
        // SAFETY: out-pointer from the caller.
        unsafe { out(array, handle as cudaArray_t) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeArray(array: cudaArray_t) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        if array.is_null() {
            return Ok(());
        }
        let store = arrays()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(array as usize))
            .ok_or(cudaErrorInvalidResourceHandle)?;
        // SAFETY: the handle was made by Box::into_raw in cudaMallocArray and is freed once
        // (removed from the table above).
        drop(unsafe { Box::from_raw(array.cast::<u8>()) });
        r.synchronize_device(r.current_device());
        r.heap.free(store.base as *mut c_void).map_err(heap_error)
    })
}

/// A copy into, out of or between CUDA arrays, as the 2-D copy between their device memory
/// and the other end it amounts to.
#[allow(clippy::too_many_arguments)]
fn array_copy(
    dst: Result<(usize, usize), cudaError_t>,
    src: Result<(usize, usize), cudaError_t>,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
    call: Call,
) -> cudaError_t {
    guard(|| {
        let ((dst, dpitch), (src, spitch)) = (dst?, src?);
        memcpy(
            CopyRequest {
                dst: dst as *mut c_void,
                dpitch,
                src: src as *const c_void,
                spitch,
                width,
                height,
                kind,
                stage: false,
            },
            call,
        )
    })
}

/// An array end of a 2-D copy: its address at the offsets, and its pitch.
fn array_2d(
    a: cudaArray_const_t,
    w: usize,
    h: usize,
    width: usize,
    height: usize,
) -> Result<(usize, usize), cudaError_t> {
    let store = array(a)?;
    Ok((store.at(w, h, width, height)?, store.pitch()))
}

/// An array end of a linear copy of `count` bytes.
fn array_1d(
    a: cudaArray_const_t,
    w: usize,
    h: usize,
    count: usize,
) -> Result<(usize, usize), cudaError_t> {
    Ok((array(a)?.linear(w, h, count)?, count))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpy2DToArray(
    dst: cudaArray_t,
    wOffset: usize,
    hOffset: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    array_copy(
        array_2d(dst, wOffset, hOffset, width, height),
        Ok((src as usize, spitch)),
        width,
        height,
        kind,
        LEGACY,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpy2DToArray_ptds(
    dst: cudaArray_t,
    wOffset: usize,
    hOffset: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    array_copy(
        array_2d(dst, wOffset, hOffset, width, height),
        Ok((src as usize, spitch)),
        width,
        height,
        kind,
        PTDS,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpy2DToArrayAsync(
    dst: cudaArray_t,
    wOffset: usize,
    hOffset: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    array_copy(
        array_2d(dst, wOffset, hOffset, width, height),
        Ok((src as usize, spitch)),
        width,
        height,
        kind,
        on(stream, false),
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpy2DToArrayAsync_ptsz(
    dst: cudaArray_t,
    wOffset: usize,
    hOffset: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    array_copy(
        array_2d(dst, wOffset, hOffset, width, height),
        Ok((src as usize, spitch)),
        width,
        height,
        kind,
        on(stream, true),
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpy2DFromArray(
    dst: *mut c_void,
    dpitch: usize,
    src: cudaArray_const_t,
    wOffset: usize,
    hOffset: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    array_copy(
        Ok((dst as usize, dpitch)),
        array_2d(src, wOffset, hOffset, width, height),
        width,
        height,
        kind,
        LEGACY,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpy2DFromArray_ptds(
    dst: *mut c_void,
    dpitch: usize,
    src: cudaArray_const_t,
    wOffset: usize,
    hOffset: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    array_copy(
        Ok((dst as usize, dpitch)),
        array_2d(src, wOffset, hOffset, width, height),
        width,
        height,
        kind,
        PTDS,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpy2DFromArrayAsync(
    dst: *mut c_void,
    dpitch: usize,
    src: cudaArray_const_t,
    wOffset: usize,
    hOffset: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    array_copy(
        Ok((dst as usize, dpitch)),
        array_2d(src, wOffset, hOffset, width, height),
        width,
        height,
        kind,
        on(stream, false),
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpy2DFromArrayAsync_ptsz(
    dst: *mut c_void,
    dpitch: usize,
    src: cudaArray_const_t,
    wOffset: usize,
    hOffset: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    array_copy(
        Ok((dst as usize, dpitch)),
        array_2d(src, wOffset, hOffset, width, height),
        width,
        height,
        kind,
        on(stream, true),
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpy2DArrayToArray(
    dst: cudaArray_t,
    wOffsetDst: usize,
    hOffsetDst: usize,
    src: cudaArray_const_t,
    wOffsetSrc: usize,
    hOffsetSrc: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    array_copy(
        array_2d(dst, wOffsetDst, hOffsetDst, width, height),
        array_2d(src, wOffsetSrc, hOffsetSrc, width, height),
        width,
        height,
        kind,
        LEGACY,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpy2DArrayToArray_ptds(
    dst: cudaArray_t,
    wOffsetDst: usize,
    hOffsetDst: usize,
    src: cudaArray_const_t,
    wOffsetSrc: usize,
    hOffsetSrc: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    array_copy(
        array_2d(dst, wOffsetDst, hOffsetDst, width, height),
        array_2d(src, wOffsetSrc, hOffsetSrc, width, height),
        width,
        height,
        kind,
        PTDS,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpyToArray(
    dst: cudaArray_t,
    wOffset: usize,
    hOffset: usize,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    array_copy(
        array_1d(dst, wOffset, hOffset, count),
        Ok((src as usize, count)),
        count,
        1,
        kind,
        LEGACY,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpyToArray_ptds(
    dst: cudaArray_t,
    wOffset: usize,
    hOffset: usize,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    array_copy(
        array_1d(dst, wOffset, hOffset, count),
        Ok((src as usize, count)),
        count,
        1,
        kind,
        PTDS,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpyToArrayAsync(
    dst: cudaArray_t,
    wOffset: usize,
    hOffset: usize,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    array_copy(
        array_1d(dst, wOffset, hOffset, count),
        Ok((src as usize, count)),
        count,
        1,
        kind,
        on(stream, false),
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpyToArrayAsync_ptsz(
    dst: cudaArray_t,
    wOffset: usize,
    hOffset: usize,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    array_copy(
        array_1d(dst, wOffset, hOffset, count),
        Ok((src as usize, count)),
        count,
        1,
        kind,
        on(stream, true),
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpyFromArray(
    dst: *mut c_void,
    src: cudaArray_const_t,
    wOffset: usize,
    hOffset: usize,
    count: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    array_copy(
        Ok((dst as usize, count)),
        array_1d(src, wOffset, hOffset, count),
        count,
        1,
        kind,
        LEGACY,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpyFromArray_ptds(
    dst: *mut c_void,
    src: cudaArray_const_t,
    wOffset: usize,
    hOffset: usize,
    count: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    array_copy(
        Ok((dst as usize, count)),
        array_1d(src, wOffset, hOffset, count),
        count,
        1,
        kind,
        PTDS,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpyFromArrayAsync(
    dst: *mut c_void,
    src: cudaArray_const_t,
    wOffset: usize,
    hOffset: usize,
    count: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    array_copy(
        Ok((dst as usize, count)),
        array_1d(src, wOffset, hOffset, count),
        count,
        1,
        kind,
        on(stream, false),
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpyFromArrayAsync_ptsz(
    dst: *mut c_void,
    src: cudaArray_const_t,
    wOffset: usize,
    hOffset: usize,
    count: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> cudaError_t {
    array_copy(
        Ok((dst as usize, count)),
        array_1d(src, wOffset, hOffset, count),
        count,
        1,
        kind,
        on(stream, true),
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpyArrayToArray(
    dst: cudaArray_t,
    wOffsetDst: usize,
    hOffsetDst: usize,
    src: cudaArray_const_t,
    wOffsetSrc: usize,
    hOffsetSrc: usize,
    count: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    array_copy(
        array_1d(dst, wOffsetDst, hOffsetDst, count),
        array_1d(src, wOffsetSrc, hOffsetSrc, count),
        count,
        1,
        kind,
        LEGACY,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cudaMemcpyArrayToArray_ptds(
    dst: cudaArray_t,
    wOffsetDst: usize,
    hOffsetDst: usize,
    src: cudaArray_const_t,
    wOffsetSrc: usize,
    hOffsetSrc: usize,
    count: usize,
    kind: cudaMemcpyKind,
) -> cudaError_t {
    array_copy(
        array_1d(dst, wOffsetDst, hOffsetDst, count),
        array_1d(src, wOffsetSrc, hOffsetSrc, count),
        count,
        1,
        kind,
        PTDS,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(dev_ptr: *mut *mut c_void, size: usize) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        r.check_capture_safe()?;
        r.activate(r.current_device());
        let p = r.heap.alloc(size, r.current_device()).map_err(heap_error)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(dev_ptr, p) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaFree(dev_ptr: *mut c_void) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        if dev_ptr.is_null() {
            // cudaFree(0) is the classic "initialise the context" idiom.
            return Ok(());
        }
        r.check_capture_safe()?;
        let PointerKind::Device { base, device } = r.heap.classify(dev_ptr) else {
            return Err(cudaErrorInvalidValue);
        };
        if base != dev_ptr as usize {
            return Err(cudaErrorInvalidValue);
        }
        // cudaFree synchronises the device before releasing memory.
        r.synchronize_device(device);
        r.heap.free(dev_ptr).map_err(heap_error)
    })
}

fn malloc_async(
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: cudaStream_t,
    per_thread: bool,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        r.stream(stream, per_thread)?;
        // Memory is handed out at once; stream order makes its first use safe.
        let p = r.heap.alloc(size, r.current_device()).map_err(heap_error)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(dev_ptr, p) }
    })
}

fn free_async(dev_ptr: *mut c_void, stream: cudaStream_t, per_thread: bool) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let s = r.stream(stream, per_thread)?;
        if r.heap.alloc_size(dev_ptr).is_none() {
            return Err(cudaErrorInvalidValue);
        }
        let p = Addr(dev_ptr.cast());
        // The memory stays valid until the stream reaches the free.
        let op: crate::Op = Box::new(move || {
            let _ = rt().map(|r| r.heap.free(p.at(0).cast()));
            Ok(())
        });
        r.submit(&s, Vec::new(), op).map(|_| ())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocAsync(
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: cudaStream_t,
) -> cudaError_t {
    malloc_async(dev_ptr, size, stream, false)
}
#[no_mangle]
pub unsafe extern "C" fn cudaMallocAsync_ptsz(
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: cudaStream_t,
) -> cudaError_t {
    malloc_async(dev_ptr, size, stream, true)
}
#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync(dev_ptr: *mut c_void, stream: cudaStream_t) -> cudaError_t {
    free_async(dev_ptr, stream, false)
}
#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync_ptsz(
    dev_ptr: *mut c_void,
    stream: cudaStream_t,
) -> cudaError_t {
    free_async(dev_ptr, stream, true)
}

/// Page-aligned anonymous memory for pinned allocations.
fn map_pages(size: usize) -> Result<*mut c_void, cudaError_t> {
    // SAFETY: anonymous private mapping; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size.max(1),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(cudaErrorMemoryAllocation)
    } else {
        Ok(p)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cudaHostAlloc(
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        if flags & !0xf != 0 {
            return Err(cudaErrorInvalidValue);
        }
        r.check_capture_safe()?;
        let p = map_pages(size)?;
        r.heap
            .pin(p, size.max(1), r.current_device(), true)
            .map_err(heap_error)?;
        // SAFETY: out-pointer from the caller.
        unsafe { out(ptr, p) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> cudaError_t {
    // SAFETY: forwarded unchanged.
    unsafe { cudaHostAlloc(ptr, size, cudaHostAllocDefault) }
}

#[no_mangle]
pub unsafe extern "C" fn cudaFreeHost(ptr: *mut c_void) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        if ptr.is_null() {
            return Ok(());
        }
        r.check_capture_safe()?;
        match r.heap.classify(ptr) {
            PointerKind::Pinned { base, .. } if base == ptr as usize => {}
            _ => return Err(cudaErrorInvalidValue),
        }
        // Freeing pinned memory synchronises: in-flight copies may still target it.
        r.synchronize_device(r.current_device());
        let range = r.heap.unpin(ptr).map_err(heap_error)?;
        if !range.owned {
            // Registered memory belongs to the caller; put the registration back.
            let _ = r.heap.pin(ptr, range.size, range.device, false);
            return Err(cudaErrorInvalidValue);
        }
        // SAFETY: the mapping was made by cudaHostAlloc with this size.
        unsafe { libc::munmap(ptr, range.size) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaHostRegister(
    ptr: *mut c_void,
    size: usize,
    flags: c_uint,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        if ptr.is_null() || size == 0 || flags & !0xf != 0 {
            return Err(cudaErrorInvalidValue);
        }
        r.check_capture_safe()?;
        r.heap
            .pin(ptr, size, r.current_device(), false)
            .map_err(heap_error)?;
        fault_in(ptr, size, flags & cudaHostRegisterReadOnly != 0);
        Ok(())
    })
}

/// Faults in every page of a registered range, as page-locking does on a GPU (the driver pins
/// the pages, so the call costs their first touch, and later copies none). Best effort: a
/// kernel without `MADV_POPULATE_*` (before Linux 5.14) leaves them to fault on first use.
fn fault_in(ptr: *mut c_void, size: usize, read_only: bool) {
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
    let start = ptr as usize / page * page;
    let len = (ptr as usize + size).div_ceil(page) * page - start;
    let advice = if read_only {
        libc::MADV_POPULATE_READ
    } else {
        libc::MADV_POPULATE_WRITE
    };
    // SAFETY: the range covers the caller's registered memory, rounded out to whole pages of
    // the same mappings; populating changes no byte of it.
    unsafe { libc::madvise(start as *mut c_void, len, advice) };
}

#[no_mangle]
pub unsafe extern "C" fn cudaHostUnregister(ptr: *mut c_void) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let range = r.heap.unpin(ptr).map_err(heap_error)?;
        if range.owned {
            let _ = r.heap.pin(ptr, range.size, range.device, true);
            return Err(cudaErrorHostMemoryNotRegistered);
        }
        // Unregistering synchronises, like freeing pinned memory.
        r.synchronize_device(r.current_device());
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaHostGetDevicePointer(
    p_device: *mut *mut c_void,
    p_host: *mut c_void,
    flags: c_uint,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        if flags != 0 {
            return Err(cudaErrorInvalidValue);
        }
        match r.heap.classify(p_host) {
            // Unified addressing: the device sees pinned memory at the same address.
            // SAFETY: out-pointer from the caller.
            PointerKind::Pinned { .. } => unsafe { out(p_device, p_host) },
            _ => Err(cudaErrorInvalidValue),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaPointerGetAttributes(
    attributes: *mut cudaPointerAttributes,
    ptr: *const c_void,
) -> cudaError_t {
    guard(|| {
        let r = rt()?;
        let (type_, device, devicePointer, hostPointer) = match r.heap.classify(ptr) {
            PointerKind::Device { device, .. } => (
                cudaMemoryTypeDevice,
                device,
                ptr as *mut c_void,
                std::ptr::null_mut(),
            ),
            PointerKind::Pinned { device, .. } => (
                cudaMemoryTypeHost,
                device,
                ptr as *mut c_void,
                ptr as *mut c_void,
            ),
            // CUDA 11+ reports unregistered memory as success with type Unregistered.
            PointerKind::Pageable => (
                cudaMemoryTypeUnregistered,
                -2,
                std::ptr::null_mut(),
                ptr as *mut c_void,
            ),
        };
        let a = cudaPointerAttributes {
            type_,
            device,
            devicePointer,
            hostPointer,
            // CUDA 13's struct ends in `long reserved[8]`, written as zeros.
            #[cfg(sim_cuda13)]
            reserved: [0; 8],
        };
        // SAFETY: out-pointer from the caller.
        unsafe { out(attributes, a) }
    })
}
