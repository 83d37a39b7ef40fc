//! FP8 with per-tensor delayed scaling, as Transformer Engine's default recipe does it.
//!
//! Each FP8 linear has three scaling slots: its input (E4M3), its weight (E4M3) and its output
//! gradient (E5M2). A slot keeps a short amax history; a tensor is quantised as
//! `q = fp8(x * scale)` with `scale = fp8_max / max(history)`, and the GEMM gets `1 / scale` as
//! its operand scale. Quantisation records the tensor's amax; after each forward (backward)
//! pass of a micro-batch the recorded amaxes are all-reduced (max) over the stage's TP x DP
//! group, Megatron's amax-reduction group, then pushed into the histories and the scales
//! recomputed, so every shard of a tensor is quantised exactly as the unsharded tensor would be
//! in the reference. A slot's first use (no history yet) calibrates from the current tensor's
//! reduced amax. Under sequence parallelism the input is quantised per sequence shard and
//! all-gathered as FP8 bytes, which is only right because all shards share the scale.

use anyhow::Result;
use float8::{F8E4M3, F8E5M2};

use crate::comm::{Comm, Op};
use crate::cuda::{bytes_mut, f32_mut, load, Arena, Buf, DType, Stream};

/// Largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;
/// Largest finite E5M2 value.
pub const E5M2_MAX: f32 = 57344.0;

/// Role of a scaling slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Forward input (E4M3).
    Input = 0,
    /// Weight (E4M3).
    Weight = 1,
    /// Output gradient (E5M2).
    Grad = 2,
}

impl Kind {
    /// FP8 type of the role.
    pub fn dtype(self) -> DType {
        match self {
            Kind::Input | Kind::Weight => DType::E4M3,
            Kind::Grad => DType::E5M2,
        }
    }
    fn max(self) -> f32 {
        match self {
            Kind::Input | Kind::Weight => E4M3_MAX,
            Kind::Grad => E5M2_MAX,
        }
    }
}

/// A quantised tensor: FP8 bytes (row-major `[rows, cols]`), optionally its transpose, and the
/// inverse scale it was quantised with (device f32), which the GEMM takes.
#[derive(Debug, Clone, Copy)]
pub struct Quantized {
    /// `[rows, cols]`.
    pub data: Buf,
    /// `[cols, rows]`, when requested.
    pub transposed: Option<Buf>,
    /// `1 / scale`.
    pub scale_inv: Buf,
}

/// The delayed-scaling state of a stage.
pub struct Fp8State {
    amax: Buf,
    history: Buf,
    scale: Buf,
    kinds: Vec<Kind>,
    calibrated: Vec<bool>,
    len: usize,
    /// Reduce amaxes over the group (false under `fp8-amax-unreduced`).
    pub reduce: bool,
}

/// The scale for an amax, `fp8_max / amax` (margin 0); none for a zero or non-finite amax
/// (Transformer Engine keeps the previous scale then).
fn scale_for(kind: Kind, amax: f32) -> Option<f32> {
    (amax > 0.0 && amax.is_finite()).then(|| kind.max() / amax)
}

fn to_fp8(kind: Kind, v: f32) -> u8 {
    match kind {
        Kind::Input | Kind::Weight => F8E4M3::from_f32(v).to_bits(),
        Kind::Grad => F8E5M2::from_f32(v).to_bits(),
    }
}

impl Fp8State {
    /// State for `linears` FP8 linears with a history of `len` amaxes.
    pub fn new(arena: &mut Arena, linears: usize, len: usize, reduce: bool) -> Result<Fp8State> {
        let n = 3 * linears;
        let kinds = (0..n)
            .map(|i| [Kind::Input, Kind::Weight, Kind::Grad][i % 3])
            .collect();
        Ok(Fp8State {
            amax: arena.alloc(n.max(1), DType::F32)?,
            history: arena.alloc((n * len).max(1), DType::F32)?,
            scale: arena.alloc(n.max(1), DType::F32)?,
            kinds,
            calibrated: vec![false; n],
            len,
            reduce,
        })
    }

    /// Slot of `kind` of FP8 linear `linear`.
    pub fn slot(linear: usize, kind: Kind) -> usize {
        3 * linear + kind as usize
    }

    /// Quantises `x` (`rows x cols`, f32 or bf16) into `out` (and `out_t`) with the slot's
    /// scale, recording its amax. `scale_inv` receives the inverse scale used.
    #[allow(clippy::too_many_arguments)]
    pub fn quantize(
        &mut self,
        s: Stream,
        group: &Comm,
        slot: usize,
        x: Buf,
        cols: usize,
        out: Buf,
        out_t: Option<Buf>,
        scale_inv: Buf,
    ) -> Result<Quantized> {
        let kind = self.kinds[slot];
        let amax = self.amax.slice(slot, 1);
        let scale = self.scale.slice(slot, 1);
        if !self.calibrated[slot] {
            // First use: no history, so scale from this tensor's (reduced) amax.
            s.kernel(move || {
                // SAFETY: stream order; distinct buffers.
                unsafe {
                    let m = load(x).iter().fold(0f32, |a, v| a.max(v.abs()));
                    f32_mut(amax)[0] = m;
                }
            })?;
            if self.reduce {
                group.all_reduce(amax, amax, Op::Max, s)?;
            }
            let hist = self.history.slice(slot * self.len, self.len);
            s.kernel(move || {
                // SAFETY: stream order; distinct buffers.
                unsafe {
                    let m = f32_mut(amax)[0];
                    let h = f32_mut(hist);
                    h.fill(0.0);
                    h[0] = m;
                    f32_mut(scale)[0] = scale_for(kind, m).unwrap_or(1.0);
                }
            })?;
            self.calibrated[slot] = true;
        }
        let dt = kind.dtype();
        let (out, out_t) = (out.cast(dt), out_t.map(|b| b.cast(dt)));
        s.kernel(move || {
            // SAFETY: stream order; distinct buffers.
            unsafe {
                let v = load(x);
                let sc = f32_mut(scale)[0];
                let q = bytes_mut(out);
                let mut m = 0f32;
                for (d, &xv) in q.iter_mut().zip(&v) {
                    m = m.max(xv.abs());
                    *d = to_fp8(kind, xv * sc);
                }
                if let Some(t) = out_t {
                    let rows = v.len() / cols;
                    let qt = bytes_mut(t);
                    for r in 0..rows {
                        for c in 0..cols {
                            qt[c * rows + r] = q[r * cols + c];
                        }
                    }
                }
                f32_mut(amax)[0] = m;
                f32_mut(scale_inv)[0] = 1.0 / sc;
            }
        })?;
        Ok(Quantized {
            data: out,
            transposed: out_t,
            scale_inv,
        })
    }

    /// End of a pass: reduces the recorded amaxes over the group and updates the histories
    /// and scales of the slots of `kinds`.
    pub fn update(&mut self, s: Stream, group: &Comm, kinds: &[Kind]) -> Result<()> {
        if self.kinds.is_empty() {
            return Ok(());
        }
        if self.reduce {
            group.all_reduce(self.amax, self.amax, Op::Max, s)?;
        }
        let slots: Vec<(usize, Kind)> = self
            .kinds
            .iter()
            .enumerate()
            .filter(|(i, k)| kinds.contains(k) && self.calibrated[*i])
            .map(|(i, k)| (i, *k))
            .collect();
        let (amax, history, scale, len) = (self.amax, self.history, self.scale, self.len);
        s.kernel(move || {
            // SAFETY: stream order; distinct buffers.
            unsafe {
                let a = f32_mut(amax);
                let h = f32_mut(history);
                let sc = f32_mut(scale);
                for &(i, kind) in &slots {
                    let hist = &mut h[i * len..(i + 1) * len];
                    hist.rotate_right(1);
                    hist[0] = a[i];
                    let m = hist.iter().fold(0f32, |x, &y| x.max(y));
                    if let Some(v) = scale_for(kind, m) {
                        sc[i] = v;
                    }
                }
            }
        })
    }
}
