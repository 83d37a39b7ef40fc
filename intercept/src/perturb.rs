//! The perturbed reference run (`TTRACE_PERTURB=<seed>`, `ttrace run --perturb`).
//!
//! TTrace estimates, per tensor, how far round-off moves a correct run by running the
//! reference twice: once as is, once with round-off-sized noise injected (docs/compare.md,
//! section 4). This module injects that noise with no change to the program:
//! after every GEMM whose output D is F32, F16 or BF16 (cuBLAS and cuBLASLt), the last
//! mantissa bit of each finite, nonzero element of D is flipped with probability 1/2, i.e.
//! D moves to an adjacent representable value (±1 ulp, the size of one rounding) in about half
//! its elements. The noise is a deterministic function of (seed, rank, per-process GEMM
//! counter), so the same seed reproduces the same run bit for bit, another seed gives another
//! draw. FP8 outputs (their scaling dominates), F64 and integer outputs are left alone.
//!
//! With the CUDA runtime API only (no device code of our own, which a real GPU would need
//! compiled): on the op's stream, the real `cudaMemcpyAsync`/`cudaMemcpy2DAsync` bring D
//! (packed, without the leading-dimension padding) into a page-locked staging buffer,
//! `cudaStreamSynchronize` waits for it, the host flips the bits, the same copies run back
//! and the stream is synchronised again (so the staging buffer can be reused). The snapshot of
//! D is enqueued afterwards, so the store holds the perturbed D the program goes on with. This
//! synchronises twice per GEMM: slow, and meant for a reference run only.
//!
//! Inside a stream capture (a CUDA graph: `torch.compile(mode="reduce-overhead")`, graphed
//! layers), where nothing may synchronise, the same round trip is recorded into the graph and
//! so runs at every replay: the copies to a staging buffer of the GEMM's own, a host node
//! (`cudaLaunchHostFunc`) that flips the bits, with the noise of the replay's own place in the
//! counter, and the copies back. A captured GEMM keeps its staging buffer for the life of the
//! process (a graph may be replayed at any time), up to [`GRAPH_STAGING_MAX`] bytes in all;
//! beyond, and on the legacy stream during another thread's capture (which cannot be asked),
//! a GEMM is left alone and counted; compare finds the outputs such a run left unperturbed
//! (`compare/src/twin.rs`). Two instances of one graph replayed at once would share the
//! staging buffers. A runtime error stops the perturbation for the rest of the run with one
//! log line; the hooked function's return value is never affected.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use cuda_abi::cudart::{cudaError_t, cudaStreamCaptureModeRelaxed, cudaStream_t};
use ttrace_proto::dtype::DType;
use ttrace_proto::record::Role;

use crate::cuda::{self, ErrScope};
use crate::plan::{self, Copy, Matrix, Source, When};
use crate::{identity, log, mode};

/// A SplitMix64 stream (Steele, Lea, Flood 2014): tiny, fast, and good enough for coin flips.
pub struct Noise(u64);

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Noise {
    /// The noise of the `call`-th perturbed GEMM of `rank` under `seed`.
    pub fn new(seed: u64, rank: u32, call: u64) -> Noise {
        let s = mix(seed ^ 0x7474_7261_6365_0001);
        let s = mix(s ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        Noise(mix(s ^ call.wrapping_mul(0xd1b5_4a32_d192_ed03)))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }
}

/// Whether the outputs of `dtype` are perturbed.
pub fn perturbable(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// Flips the last mantissa bit of each finite, nonzero element of `bytes` (packed
/// little-endian elements of `dtype`) where the noise says so (one bit per element, whether it
/// is finite or not, so the draw does not depend on the values). Returns how many elements
/// changed.
pub fn apply(dtype: DType, bytes: &mut [u8], noise: &mut Noise) -> u64 {
    // (element size, exponent mask, magnitude mask): all exponent bits set is Inf or NaN.
    let (es, exp, mag): (usize, u32, u32) = match dtype {
        DType::F32 => (4, 0x7f80_0000, 0x7fff_ffff),
        DType::F16 => (2, 0x7c00, 0x7fff),
        DType::BF16 => (2, 0x7f80, 0x7fff),
        _ => return 0,
    };
    let mut changed = 0;
    for chunk in bytes.chunks_mut(64 * es) {
        let coins = noise.next_u64();
        for (i, e) in chunk.chunks_exact_mut(es).enumerate() {
            if coins >> i & 1 == 0 {
                continue;
            }
            let v = if es == 4 {
                u32::from_le_bytes([e[0], e[1], e[2], e[3]])
            } else {
                u16::from_le_bytes([e[0], e[1]]) as u32
            };
            if v & exp == exp || v & mag == 0 {
                continue;
            }
            // Little-endian: the lowest mantissa bit is bit 0 of the first byte.
            e[0] ^= 1;
            changed += 1;
        }
    }
    changed
}

/// Whether the batch entries of `s` cover distinct bytes: one after the other, or side by side
/// within each row of the pitch (attention heads interleaved in one activation, as
/// `[seq, batch, heads * dim]` layouts give).
pub fn disjoint(s: &Source) -> bool {
    let (w, h, b) = (s.width, s.height, s.batch);
    b <= 1
        || h == 0
        || s.bstride >= s.spitch * (h - 1) + w
        || (s.bstride >= w && s.spitch >= s.bstride * (b - 1) + w)
}

/// GEMM outputs perturbed (eagerly, and by replays of CUDA graphs), GEMMs whose perturbation
/// was recorded into a graph, and GEMMs left alone (legacy stream during a capture, staging
/// budget, runtime errors), in this process.
static PERTURBED: AtomicU64 = AtomicU64::new(0);
static REPLAYED: AtomicU64 = AtomicU64::new(0);
static RECORDED: AtomicU64 = AtomicU64::new(0);
static SKIPPED: AtomicU64 = AtomicU64::new(0);
/// Page-locked bytes held by the staging buffers of perturbations recorded into graphs.
static GRAPH_STAGING: AtomicU64 = AtomicU64::new(0);
/// The most page-locked memory the perturbations recorded into graphs may hold.
pub const GRAPH_STAGING_MAX: u64 = 1 << 30;
static WARNED_BUDGET: AtomicBool = AtomicBool::new(false);
/// Perturbable GEMMs seen so far (the noise's call counter).
static CALLS: AtomicU64 = AtomicU64::new(0);
static WARNED_CAPTURE: AtomicBool = AtomicBool::new(false);
static AT_EXIT: AtomicBool = AtomicBool::new(false);

/// Page-locked staging buffers (address, capacity); one is taken out per perturbation, so no
/// lock is held across a CUDA call.
static POOL: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// Why a GEMM was left alone.
enum Skip {
    /// The stream cannot be asked whether it is being captured (the legacy stream during
    /// another thread's capture).
    Capturing,
    /// A graph's perturbation would pass [`GRAPH_STAGING_MAX`].
    Budget,
    /// A runtime call failed.
    Failed(&'static str, cudaError_t),
}

/// Perturbs the output `d` of a GEMM that was just launched on `stream` (if the run is
/// perturbed and `d` is F32, F16 or BF16).
pub fn gemm_output(stream: cudaStream_t, d: &Matrix) {
    if !mode::on(mode::PERTURB) {
        return;
    }
    let Some(seed) = mode::config().and_then(|c| c.perturb) else {
        return;
    };
    let t = plan::matrix(Role::D, d, When::After, false);
    if !perturbable(t.dtype) {
        return;
    }
    if !t.captured {
        return left_alone("a GEMM output that cannot be copied");
    }
    let s = t.source;
    if !disjoint(&s) {
        // Overlapping batch entries (a stride of 0 broadcasts one D): the noise would be
        // applied twice to the same bytes.
        return left_alone("a batched GEMM whose outputs overlap");
    }
    report_at_exit();
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let mut noise = Noise::new(seed, identity::rank(), call);
    let _err = ErrScope::new();
    // Staging allocation and synchronisation are illegal for this thread while another one
    // captures in global mode (and would invalidate that capture): relaxed mode for our calls.
    let old = cuda::exchange_capture_mode(cudaStreamCaptureModeRelaxed);
    let r = perturb(stream, &s, t.dtype, &mut noise);
    if let Ok(m) = old {
        let _ = cuda::exchange_capture_mode(m);
    }
    match r {
        Ok(Done::Now) => {
            PERTURBED.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Done::AtReplays) => {
            RECORDED.fetch_add(1, Ordering::Relaxed);
        }
        Err(Skip::Capturing) => {
            SKIPPED.fetch_add(1, Ordering::Relaxed);
            if !WARNED_CAPTURE.swap(true, Ordering::Relaxed) {
                log::warn(
                    "perturbation: a GEMM on the legacy stream while another thread captures a \
                     CUDA graph is not perturbed (the stream cannot be asked); the count is \
                     reported at exit",
                );
            }
        }
        Err(Skip::Budget) => {
            SKIPPED.fetch_add(1, Ordering::Relaxed);
            if !WARNED_BUDGET.swap(true, Ordering::Relaxed) {
                log::warn(&format!(
                    "perturbation: GEMMs captured into CUDA graphs hold {} MiB of staging \
                     memory: later ones are not perturbed; the count is reported at exit",
                    GRAPH_STAGING_MAX >> 20
                ));
            }
        }
        Err(Skip::Failed(what, code)) => {
            SKIPPED.fetch_add(1, Ordering::Relaxed);
            // Give up for good: one line, and the run goes on unperturbed from here.
            if mode::stop_perturbing() {
                log::error(&format!(
                    "perturbation stopped: {what} failed (cudaError {code}); the rest of the \
                     run is not perturbed"
                ));
            }
        }
    }
}

/// How a GEMM's output was perturbed.
enum Done {
    /// Now (the stream synchronised).
    Now,
    /// At every replay of the graph being captured.
    AtReplays,
}

/// A perturbed run's GEMM whose output is left alone (`what` it is): counted for the exit
/// line, so that a twin that left outputs alone says so.
pub fn left_alone(what: &str) {
    if !mode::on(mode::PERTURB) {
        return;
    }
    report_at_exit();
    SKIPPED.fetch_add(1, Ordering::Relaxed);
    log::debug(&format!("perturbation: {what} is left alone"));
}

/// Registers the exit line ([`report`]) once.
fn report_at_exit() {
    if !AT_EXIT.swap(true, Ordering::Relaxed) {
        // SAFETY: `report` is an extern "C" fn without arguments, registered once.
        unsafe { libc::atexit(report) };
    }
}

fn perturb(
    stream: cudaStream_t,
    s: &Source,
    dtype: DType,
    noise: &mut Noise,
) -> Result<Done, Skip> {
    match cuda::is_capturing(stream) {
        Ok(false) => {}
        Ok(true) => return recorded(stream, s, dtype).map(|()| Done::AtReplays),
        Err(_) => return Err(Skip::Capturing),
    }
    let len = s.bytes() as usize;
    let (buf, cap) = staging(len)?;
    let r = round_trip(stream, s, dtype, noise, buf, len);
    if r.is_ok() {
        // After a failure copies may still be in flight into it: it is not reused.
        POOL.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((buf as usize, cap));
    }
    r.map(|()| Done::Now)
}

/// The round trip of a GEMM captured into a graph, recorded on `stream` for every replay:
/// copies into a staging buffer of its own, a host node flipping the bits ([`replayed`]), the
/// copies back. Nothing here is ever freed: a graph may be replayed at any time.
fn recorded(stream: cudaStream_t, s: &Source, dtype: DType) -> Result<(), Skip> {
    let len = s.bytes();
    if GRAPH_STAGING.fetch_add(len, Ordering::Relaxed) + len > GRAPH_STAGING_MAX {
        GRAPH_STAGING.fetch_sub(len, Ordering::Relaxed);
        return Err(Skip::Budget);
    }
    let buf = cuda::malloc_host(len.max(1) as usize).map_err(|c| {
        GRAPH_STAGING.fetch_sub(len, Ordering::Relaxed);
        Skip::Failed("cudaMallocHost", c)
    })?;
    let copies = s.copies();
    for &c in &copies {
        crate::engine::enqueue(buf as usize, c, stream)
            .map_err(|e| Skip::Failed(copy_api(c, true), e))?;
    }
    let at = Box::into_raw(Box::new(Staged {
        buf: buf as usize,
        len: len as usize,
        dtype,
    }));
    cuda::launch_host_func(stream, replayed, at.cast())
        .map_err(|e| Skip::Failed("cudaLaunchHostFunc", e))?;
    for &c in &copies {
        copy_back(buf, c, stream).map_err(|e| Skip::Failed(copy_api(c, false), e))?;
    }
    Ok(())
}

/// A captured GEMM's staging buffer: `len` bytes of `dtype` at `buf`.
struct Staged {
    buf: usize,
    len: usize,
    dtype: DType,
}

/// The host node of a recorded perturbation: flips the bits of the replay's copy of D with
/// the noise of the next place in the counter (replays come in stream order).
unsafe extern "C" fn replayed(data: *mut c_void) {
    let _ = std::panic::catch_unwind(|| {
        if !mode::on(mode::PERTURB) {
            return;
        }
        let Some(seed) = mode::config().and_then(|c| c.perturb) else {
            return;
        };
        // SAFETY: `data` is the `Staged` that `recorded` leaked for this node.
        let st = unsafe { &*(data as *const Staged) };
        let call = CALLS.fetch_add(1, Ordering::Relaxed);
        let mut noise = Noise::new(seed, identity::rank(), call);
        // SAFETY: `st.buf` holds `st.len` bytes of our page-locked allocation; the graph's
        // copies into it completed before this node runs and the copies back start after it
        // returns (stream order).
        let bytes = unsafe { std::slice::from_raw_parts_mut(st.buf as *mut u8, st.len) };
        apply(st.dtype, bytes, &mut noise);
        REPLAYED.fetch_add(1, Ordering::Relaxed);
    });
}

/// A staging buffer of at least `len` bytes, taken out of the pool.
fn staging(len: usize) -> Result<(*mut u8, usize), Skip> {
    let pooled = POOL.lock().unwrap_or_else(|p| p.into_inner()).pop();
    if let Some((p, cap)) = pooled {
        if cap >= len {
            return Ok((p as *mut u8, cap));
        }
        // Too small: replaced by one twice as large as needed (a few growths per run). Our
        // stream was synchronised after its last use.
        let _ = cuda::free_host(p as *mut u8);
    }
    let cap = len.next_power_of_two().max(1 << 16);
    let p = cuda::malloc_host(cap).map_err(|c| Skip::Failed("cudaMallocHost", c))?;
    Ok((p, cap))
}

fn round_trip(
    stream: cudaStream_t,
    s: &Source,
    dtype: DType,
    noise: &mut Noise,
    buf: *mut u8,
    len: usize,
) -> Result<(), Skip> {
    let copies = s.copies();
    for &c in &copies {
        crate::engine::enqueue(buf as usize, c, stream)
            .map_err(|e| Skip::Failed(copy_api(c, true), e))?;
    }
    cuda::stream_synchronize(stream).map_err(|e| Skip::Failed("cudaStreamSynchronize", e))?;
    // SAFETY: `buf` holds at least `len` bytes of our page-locked allocation, taken out of the
    // pool by this thread alone; the copies that wrote it completed (the stream was
    // synchronised) and no other copy touches it until the next synchronisation below.
    let bytes = unsafe { std::slice::from_raw_parts_mut(buf, len) };
    apply(dtype, bytes, noise);
    for &c in &copies {
        copy_back(buf, c, stream).map_err(|e| Skip::Failed(copy_api(c, false), e))?;
    }
    cuda::stream_synchronize(stream).map_err(|e| Skip::Failed("cudaStreamSynchronize", e))
}

/// The runtime call that makes copy `c` (to the host, or back), for an error message.
fn copy_api(c: Copy, to_host: bool) -> &'static str {
    match (c, to_host) {
        (Copy::Linear { .. }, true) => "cudaMemcpyAsync (device to host)",
        (Copy::Linear { .. }, false) => "cudaMemcpyAsync (host to device)",
        (Copy::Pitched { .. }, true) => "cudaMemcpy2DAsync (device to host)",
        (Copy::Pitched { .. }, false) => "cudaMemcpy2DAsync (host to device)",
    }
}

/// Enqueues copy `c` backwards: from its place in `buf` to the device memory it was read from.
fn copy_back(buf: *mut u8, c: Copy, stream: cudaStream_t) -> Result<(), cudaError_t> {
    match c {
        Copy::Linear { dst, src, len } => {
            cuda::copy_back_linear(src, buf.wrapping_add(dst as usize), len, stream)
        }
        Copy::Pitched {
            dst,
            src,
            spitch,
            width,
            height,
        } => cuda::copy_back_pitched(
            src,
            spitch,
            buf.wrapping_add(dst as usize),
            width,
            height,
            stream,
        ),
    }
}

/// At exit: how many GEMM outputs were perturbed (`TTRACE_LOG=info`; a warning when some
/// were left alone).
extern "C" fn report() {
    let _ = std::panic::catch_unwind(|| {
        let (p, r, g, s) = (
            PERTURBED.load(Ordering::Relaxed),
            REPLAYED.load(Ordering::Relaxed),
            RECORDED.load(Ordering::Relaxed),
            SKIPPED.load(Ordering::Relaxed),
        );
        let seed = mode::config().and_then(|c| c.perturb).unwrap_or(0);
        let graphs = if g > 0 {
            format!(" ({r} of them by replays of the {g} GEMMs captured into CUDA graphs)")
        } else {
            String::new()
        };
        let msg = format!(
            "perturbation (seed {seed}): {} GEMM outputs perturbed{graphs}, {s} left alone",
            p + r
        );
        if s > 0 {
            log::warn(&msg);
        } else {
            log::info(&msg);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn about_half_the_elements_move_by_one_ulp() {
        let vals: Vec<f32> = (0..10_000).map(|i| (i as f32 - 5000.5) * 0.37).collect();
        let mut b = f32s(&vals);
        let n = apply(DType::F32, &mut b, &mut Noise::new(1, 0, 0));
        assert!((4_700..5_300).contains(&n), "{n} of 10000 changed");
        let mut seen = 0;
        for (x, y) in vals.iter().zip(b.chunks_exact(4)) {
            let y = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
            if y != *x {
                seen += 1;
                let d = (x.to_bits() as i64 - y.to_bits() as i64).abs();
                assert_eq!(d, 1, "{x} -> {y}: adjacent values");
                assert_eq!(x.signum(), y.signum());
            }
        }
        assert_eq!(seen, n);
    }

    #[test]
    fn non_finite_values_and_zeros_are_left_alone() {
        for (dtype, specials) in [
            (
                DType::F32,
                vec![0u32, 0x8000_0000, 0x7f80_0000, 0xff80_0000, 0x7fc0_0001],
            ),
            (DType::BF16, vec![0, 0x8000, 0x7f80, 0xff80, 0x7fc1]),
            (DType::F16, vec![0, 0x8000, 0x7c00, 0xfc00, 0x7e01]),
        ] {
            let es = dtype.size();
            let mut b: Vec<u8> = (0..640)
                .flat_map(|i| specials[i % specials.len()].to_le_bytes()[..es].to_vec())
                .collect();
            let before = b.clone();
            assert_eq!(apply(dtype, &mut b, &mut Noise::new(9, 1, 2)), 0);
            assert_eq!(b, before, "{dtype:?}");
        }
    }

    #[test]
    fn sixteen_bit_formats_flip_their_own_last_bit() {
        let vals: Vec<half::bf16> = (1..=256).map(|i| half::bf16::from_f32(i as f32)).collect();
        let mut b: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
        let n = apply(DType::BF16, &mut b, &mut Noise::new(3, 0, 0));
        assert!((80..180).contains(&n), "{n}");
        for (x, y) in vals.iter().zip(b.chunks_exact(2)) {
            let y = u16::from_le_bytes([y[0], y[1]]);
            assert!(y == x.to_bits() || (y ^ x.to_bits()) == 1);
        }
    }

    #[test]
    fn the_draw_depends_on_seed_rank_and_call_only() {
        let draw = |s, r, c| {
            let mut n = Noise::new(s, r, c);
            (0..4).map(|_| n.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draw(1, 0, 0), draw(1, 0, 0));
        for other in [draw(2, 0, 0), draw(1, 1, 0), draw(1, 0, 1)] {
            assert_ne!(draw(1, 0, 0), other);
        }
    }

    #[test]
    fn batch_entries_must_not_overlap() {
        let src = |spitch, width, height, batch, bstride| Source {
            src: 0x1000,
            spitch,
            width,
            height,
            batch,
            bstride,
        };
        // 16 heads of 16x16 bf16 blocks: packed, padded, interleaved in rows of 768 bytes.
        assert!(disjoint(&src(32, 32, 16, 16, 512)));
        assert!(disjoint(&src(64, 32, 16, 16, 1024)));
        assert!(disjoint(&src(512, 32, 16, 16, 32)));
        assert!(disjoint(&src(1536, 32, 16, 16, 96)));
        assert!(disjoint(&src(32, 32, 16, 1, 0)));
        // Broadcast (stride 0), and strides that make blocks overlap.
        assert!(!disjoint(&src(32, 32, 16, 2, 0)));
        assert!(!disjoint(&src(32, 32, 16, 2, 256)));
        assert!(!disjoint(&src(512, 32, 16, 17, 32)));
        assert!(!disjoint(&src(512, 32, 16, 2, 16)));
    }

    #[test]
    fn other_dtypes_are_not_perturbed() {
        assert!(perturbable(DType::BF16) && perturbable(DType::F16) && perturbable(DType::F32));
        for t in [
            DType::F64,
            DType::F8_E4M3,
            DType::F8_E5M2,
            DType::I32,
            DType::U8,
        ] {
            assert!(!perturbable(t));
            let mut b = vec![0x55u8; 64];
            assert_eq!(apply(t, &mut b, &mut Noise::new(1, 0, 0)), 0);
        }
    }
}
