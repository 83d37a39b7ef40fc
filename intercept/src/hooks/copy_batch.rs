//! `cudaMemcpyBatchAsync` (CUDA 12.8+): a batch of linear copies on one stream, each captured
//! as the `cudaMemcpyAsync` of kind `cudaMemcpyDefault` it amounts to (one record per copy, in
//! the batch's order, its direction told from where its ends lie). `cudaMemcpy3DBatchAsync`
//! and CUDA 13's `cudaMemcpy3DWithAttributesAsync`: 3-D copies, not captured (as
//! `cudaMemcpy3D`'s): an `unsupported` gap naming the API and the copies' elements.
//!
//! CUDA 13 dropped the `failIdx` out-parameter that CUDA 12.8 has before the stream, and
//! libcudart.so.13 exports the new signature under the same name. One export serves both: it
//! is declared with CUDA 12.8's nine parameters and reads the eighth as the stream when the
//! program's runtime is CUDA 13 ([`cuda::runtime_major`]); the real function gets the nine
//! values as they came (CUDA 13's reads eight of them). `cudaMemcpy3DBatchAsync` likewise lost
//! its `failIdx` (third of five parameters).

use core::ffi::{c_ulonglong, c_void};

use cuda_abi::cudart::*;

use super::cudart::{self, Geometry};
use crate::cuda::{self, MISSING};
use crate::engine;
use crate::real;
use crate::{mode, thread, uploads};

/// The copies of a batch as the program listed them (`dsts`, `srcs`, `sizes`: `count` each).
#[derive(Clone, Copy)]
struct Batch {
    dsts: *const *mut c_void,
    srcs: *const *const c_void,
    sizes: *const usize,
    count: usize,
}

impl Batch {
    /// Each copy's geometry (empty when an array is null: the real call then fails).
    fn copies(&self) -> Vec<Geometry> {
        if self.count == 0 || self.dsts.is_null() || self.srcs.is_null() || self.sizes.is_null() {
            return Vec::new();
        }
        // SAFETY: the program's three arrays of `count` entries (non-null), which the real
        // call reads as well.
        let (dsts, srcs, sizes) = unsafe {
            (
                std::slice::from_raw_parts(self.dsts, self.count),
                std::slice::from_raw_parts(self.srcs, self.count),
                std::slice::from_raw_parts(self.sizes, self.count),
            )
        };
        (0..self.count)
            .map(|i| Geometry::linear(dsts[i], srcs[i], sizes[i]))
            .collect()
    }
}

/// The stream of a call whose eighth and ninth values are `failIdx` and `stream` as CUDA 12.8
/// passes them: CUDA 13 passes the stream eighth.
fn stream_of(eighth: *mut usize, ninth: cudaStream_t) -> cudaStream_t {
    if cuda::runtime_major() >= 13 {
        eighth.cast()
    } else {
        ninth
    }
}

/// Runs a batch: each copy captured (snapshots planned before the call, completed after it)
/// when copies are, else the real call alone; the uploads remembered for GEMM pointer arrays
/// are forgotten where the batch wrote.
fn run_batch(
    api: &'static str,
    batch: Batch,
    stream: impl FnOnce() -> cudaStream_t,
    real: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    let capture = !mode::off(mode::MEMCPY);
    if !capture && !mode::on(mode::GEMM) {
        return real();
    }
    let copies = crate::catch(|| batch.copies()).unwrap_or_default();
    let forget = |r: cudaError_t| {
        if r == cudaSuccess && mode::on(mode::GEMM) {
            let _ = crate::catch(|| {
                copies
                    .iter()
                    .for_each(|g| uploads::forget(g.dst as u64, g.width as u64))
            });
        }
    };
    if !capture {
        let r = real();
        forget(r);
        return r;
    }
    let stream = stream();
    crate::around(
        || {
            let _held = Holding;
            let kind = cudaMemcpyDefault;
            let mut begun = Vec::with_capacity(copies.len());
            // The copies streamed in chunks first: a download's chunks are taken before the
            // call, and must not wait behind the tickets the others hold until it.
            let streamed = |g: &&Geometry| engine::is_streamed_size(g.width as u64);
            let (large, small): (Vec<&Geometry>, Vec<&Geometry>) =
                copies.iter().partition(streamed);
            for g in large.into_iter().chain(small) {
                let Some(f) = cudart::call(api, *g, kind, None, stream).and_then(engine::begin)
                else {
                    continue;
                };
                if let Some(n) = f.ticket() {
                    let _ = thread::with(|t| t.holding = Some(t.holding.map_or(n, |h| h.min(n))));
                }
                begun.push(f);
            }
            Some(begun)
        },
        || {
            let r = real();
            forget(r);
            r
        },
        |begun, r| {
            // Streamed copies take their tickets and chunks now: after the others are handed
            // in, which the tracer must get past first.
            let (streamed, plain): (Vec<_>, Vec<_>) =
                begun.into_iter().partition(engine::InFlight::is_streamed);
            for f in plain.into_iter().chain(streamed) {
                engine::finish(f, r == cudaSuccess);
            }
        },
    )
}

/// Clears the thread's [`thread::ThreadState::holding`] when the batch's snapshots are all
/// begun (or planning them panicked): from then on its reservations are its own streamed
/// chunks, after the others are handed in.
struct Holding;

impl Drop for Holding {
    fn drop(&mut self) {
        let _ = thread::with(|t| t.holding = None);
    }
}

/// One `cudaMemcpyBatchAsync` spelling: `name(C signature as CUDA 12.8 declares it) => the
/// stream a 0 means`.
macro_rules! batch_copy_hook {
    ($(#[$m:meta])* $name:ident (
        dsts: $dt:ty, srcs: $st:ty, sizes: $zt:ty, count: $ct:ty, attrs: $at:ty,
        attrsIdxs: $it:ty, numAttrs: $nt:ty, failIdx: $ft:ty, stream: $sst:ty $(,)?
    ) => $stream:path) => {
        $(#[$m])*
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            dsts: $dt, srcs: $st, sizes: $zt, count: $ct, attrs: $at,
            attrsIdxs: $it, numAttrs: $nt, failIdx: $ft, stream: $sst,
        ) -> cudaError_t {
            let Some(real) = real::real_of!(
                $name,
                fn($dt, $st, $zt, $ct, $at, $it, $nt, $ft, $sst) -> cudaError_t,
                Cudart
            ) else {
                return MISSING;
            };
            let batch = Batch {
                dsts: dsts.cast_const(),
                srcs: srcs.cast_const().cast(),
                sizes: sizes.cast_const(),
                count,
            };
            // SAFETY: the program's nine values, forwarded unchanged (CUDA 13's function
            // reads the first eight: a caller-cleaned C call passes a ninth harmlessly).
            let run = || unsafe {
                real(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, stream)
            };
            let on = || $stream(stream_of(failIdx, stream));
            run_batch(stringify!($name), batch, on, run)
        }
    };
}

/// The stream as given (`cudaMemcpyBatchAsync` refuses the legacy default stream).
fn as_given(s: cudaStream_t) -> cudaStream_t {
    s
}

batch_copy_hook! {
    /// `cudaError_t cudaMemcpyBatchAsync(void** dsts, void** srcs, size_t* sizes, size_t
    /// count, struct cudaMemcpyAttributes* attrs, size_t* attrsIdxs, size_t numAttrs, size_t*
    /// failIdx, cudaStream_t stream)` (CUDA 12.8; CUDA 13: no `failIdx`, const arrays).
    cudaMemcpyBatchAsync(
        dsts: *mut *mut c_void,
        srcs: *mut *mut c_void,
        sizes: *mut usize,
        count: usize,
        attrs: *mut cudaMemcpyAttributes,
        attrsIdxs: *mut usize,
        numAttrs: usize,
        failIdx: *mut usize,
        stream: cudaStream_t,
    ) => as_given
}

batch_copy_hook! {
    /// `cudaMemcpyBatchAsync` for code built with `--default-stream per-thread`.
    cudaMemcpyBatchAsync_ptsz(
        dsts: *mut *mut c_void,
        srcs: *mut *mut c_void,
        sizes: *mut usize,
        count: usize,
        attrs: *mut cudaMemcpyAttributes,
        attrsIdxs: *mut usize,
        numAttrs: usize,
        failIdx: *mut usize,
        stream: cudaStream_t,
    ) => cudart::per_thread
}

/// A batch of 3-D copies (`cudaMemcpy3DBatchAsync`, `cudaMemcpy3DWithAttributesAsync`): not
/// captured ([`cudart::uncaptured`]): one gap naming the copies and their elements (bytes
/// between pointers; a CUDA array's elements may be wider).
fn uncaptured_3d_batch(
    api: &'static str,
    ops: *const cudaMemcpy3DBatchOp,
    n: usize,
    stream: impl FnOnce() -> cudaStream_t,
    real: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    let what = || {
        if ops.is_null() {
            return None;
        }
        // SAFETY: the program's array of `n` operations (non-null), which the real call reads.
        let ops = unsafe { std::slice::from_raw_parts(ops, n) };
        let elements = ops.iter().fold(0u64, |sum, op| {
            sum.saturating_add(cudart::elements(op.extent))
        });
        let arrays = ops
            .iter()
            .any(|op| op.src.pointer().is_none() || op.dst.pointer().is_none());
        let arrays = if arrays {
            ", CUDA arrays among the ends"
        } else {
            ""
        };
        let detail =
            format!("3-D copies are not captured ({n} in the call, {elements} elements{arrays})");
        Some((elements, detail))
    };
    cudart::uncaptured(api, stream, what, real)
}

/// One `cudaMemcpy3DBatchAsync` spelling (CUDA 12.8's signature; CUDA 13's has no `failIdx`,
/// so its `flags` come third and its stream fourth) `=> the stream a 0 means`.
macro_rules! batch_3d_hook {
    ($(#[$m:meta])* $name:ident (
        numOps: usize, opList: *mut cudaMemcpy3DBatchOp, failIdx: *mut usize,
        flags: c_ulonglong, stream: cudaStream_t $(,)?
    ) => $stream:path) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            numOps: usize,
            opList: *mut cudaMemcpy3DBatchOp,
            failIdx: *mut usize,
            flags: c_ulonglong,
            stream: cudaStream_t,
        ) -> cudaError_t {
            let Some(real) = real::real_of!(
                $name,
                fn(usize, *mut cudaMemcpy3DBatchOp, *mut usize, c_ulonglong, cudaStream_t)
                    -> cudaError_t,
                Cudart
            ) else {
                return MISSING;
            };
            // CUDA 13 passes the stream fourth.
            let on = || {
                $stream(if cuda::runtime_major() >= 13 {
                    flags as usize as cudaStream_t
                } else {
                    stream
                })
            };
            // SAFETY: the program's five values, forwarded unchanged (CUDA 13's function
            // reads the first four).
            let run = || unsafe { real(numOps, opList, failIdx, flags, stream) };
            uncaptured_3d_batch(stringify!($name), opList, numOps, on, run)
        }
    };
}

batch_3d_hook! {
    /// `cudaError_t cudaMemcpy3DBatchAsync(size_t numOps, struct cudaMemcpy3DBatchOp* opList,
    /// size_t* failIdx, unsigned long long flags, cudaStream_t stream)` (CUDA 12.8).
    cudaMemcpy3DBatchAsync(
        numOps: usize,
        opList: *mut cudaMemcpy3DBatchOp,
        failIdx: *mut usize,
        flags: c_ulonglong,
        stream: cudaStream_t,
    ) => as_given
}

batch_3d_hook! {
    /// `cudaMemcpy3DBatchAsync` for code built with `--default-stream per-thread`.
    cudaMemcpy3DBatchAsync_ptsz(
        numOps: usize,
        opList: *mut cudaMemcpy3DBatchOp,
        failIdx: *mut usize,
        flags: c_ulonglong,
        stream: cudaStream_t,
    ) => cudart::per_thread
}

/// One `cudaMemcpy3DWithAttributesAsync` spelling (CUDA 13) `=> the stream a 0 means`.
macro_rules! one_3d_hook {
    ($(#[$m:meta])* $name:ident (
        op: *mut cudaMemcpy3DBatchOp, flags: c_ulonglong, stream: cudaStream_t $(,)?
    ) => $stream:path) => {
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            op: *mut cudaMemcpy3DBatchOp,
            flags: c_ulonglong,
            stream: cudaStream_t,
        ) -> cudaError_t {
            let Some(real) = real::real_of!(
                $name,
                fn(*mut cudaMemcpy3DBatchOp, c_ulonglong, cudaStream_t) -> cudaError_t,
                Cudart
            ) else {
                return MISSING;
            };
            // SAFETY: the program's arguments, forwarded unchanged.
            let run = || unsafe { real(op, flags, stream) };
            uncaptured_3d_batch(stringify!($name), op, 1, || $stream(stream), run)
        }
    };
}

one_3d_hook! {
    /// `cudaError_t cudaMemcpy3DWithAttributesAsync(struct cudaMemcpy3DBatchOp* op, unsigned
    /// long long flags, cudaStream_t stream)` (CUDA 13).
    cudaMemcpy3DWithAttributesAsync(
        op: *mut cudaMemcpy3DBatchOp,
        flags: c_ulonglong,
        stream: cudaStream_t,
    ) => as_given
}

one_3d_hook! {
    /// `cudaMemcpy3DWithAttributesAsync` for code built with `--default-stream per-thread`.
    cudaMemcpy3DWithAttributesAsync_ptsz(
        op: *mut cudaMemcpy3DBatchOp,
        flags: c_ulonglong,
        stream: cudaStream_t,
    ) => cudart::per_thread
}
