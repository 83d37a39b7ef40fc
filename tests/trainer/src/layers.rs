//! Tensor-parallel linear layers (column- and row-parallel, with sequence parallelism) and the
//! shared context every module runs with.
//!
//! Activations are row-major `[tokens, features]` with tokens sequence-first. Under sequence
//! parallelism the norm regions hold `[tokens / tp, h]` (a contiguous chunk of the sequence);
//! a column-parallel linear all-gathers its input first and a row-parallel linear
//! reduce-scatters its output; without SP the column-parallel backward all-reduces its input
//! grad and the row-parallel forward all-reduces its output.

use anyhow::Result;

use crate::bugs::Bug;
use crate::cli::{Config, Precision};
use crate::comm::{Op, Topology};
use crate::cuda::{Arena, Buf, DType, Stream};
use crate::fp8::{Fp8State, Kind, Quantized};
use crate::gemm::{Blas, Gemm, Mat};
use crate::kernels::Kernels;
use crate::nvtx::Nvtx;

/// Local sizes of the model on this rank.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    /// Hidden size.
    pub h: usize,
    /// Hidden size per TP rank.
    pub hl: usize,
    /// Heads per TP rank.
    pub np: usize,
    /// Head dimension.
    pub hn: usize,
    /// MLP size per TP rank.
    pub fl: usize,
    /// Vocabulary per TP rank.
    pub vl: usize,
    /// Sequence length.
    pub s: usize,
    /// Local batch.
    pub b: usize,
    /// Tokens of a local micro-batch.
    pub t: usize,
    /// Rows of the norm regions (`t / tp` under SP).
    pub ts: usize,
    /// Activation type.
    pub act: DType,
}

impl Dims {
    /// The sizes for a configuration.
    pub fn new(c: &Config) -> Dims {
        let m = &c.model;
        let tp = c.layout.tp;
        let t = c.tokens();
        Dims {
            h: m.hidden,
            hl: m.hidden / tp,
            np: m.heads / tp,
            hn: m.head_dim(),
            fl: m.ffn / tp,
            vl: m.vocab / tp,
            s: m.seq,
            b: c.local_batch(),
            t,
            ts: if c.layout.sp { t / tp } else { t },
            act: match c.precision {
                Precision::Fp32 => DType::F32,
                _ => DType::BF16,
            },
        }
    }
}

/// What every module needs: configuration, topology, stream, kernels, BLAS, NVTX.
pub struct Ctx<'a> {
    /// Configuration.
    pub cfg: &'a Config,
    /// Topology and communicators.
    pub topo: &'a Topology,
    /// The rank's stream.
    pub s: Stream,
    /// Kernels on the stream.
    pub k: Kernels,
    /// GEMMs on the stream.
    pub blas: &'a Blas,
    /// NVTX ranges.
    pub nvtx: Nvtx,
    /// Local sizes.
    pub d: Dims,
}

impl Ctx<'_> {
    /// Whether sequence parallelism is on.
    pub fn sp(&self) -> bool {
        self.cfg.layout.sp
    }
    /// Whether `b` is the injected bug.
    pub fn bug(&self, b: Bug) -> bool {
        self.cfg.bug == Some(b)
    }
    /// Whether the FP8 recipe is on.
    pub fn fp8(&self) -> bool {
        self.cfg.precision == Precision::Fp8
    }
}

/// Scratch buffers shared by all layers (the stream orders their reuse).
pub struct Scratch {
    /// `[t, h]`: an all-gathered input, or a row-parallel partial output.
    pub full: Buf,
    /// `[t, h]`: a second full-size buffer (output gradients gathered under SP).
    pub full2: Buf,
    /// FP8 bytes, large enough for any `[t, max(h, ffn/tp, 3h/tp)]` tensor.
    pub q1: Buf,
    /// FP8 bytes (transposes).
    pub q2: Buf,
    /// FP8 bytes of a local SP shard before its all-gather.
    pub q3: Buf,
    /// Inverse scale of the gradient quantisation.
    pub g_sinv: Buf,
}

impl Scratch {
    /// Scratch for these sizes.
    pub fn new(arena: &mut Arena, d: &Dims) -> Result<Scratch> {
        let wide = d.h.max(d.fl).max(3 * d.hl);
        Ok(Scratch {
            full: arena.alloc(d.t * d.h, d.act)?,
            full2: arena.alloc(d.t * d.h, d.act)?,
            q1: arena.alloc(d.t * wide, DType::E4M3)?,
            q2: arena.alloc(d.t * wide, DType::E4M3)?,
            q3: arena.alloc(d.t * wide, DType::E4M3)?,
            g_sinv: arena.alloc(1, DType::F32)?,
        })
    }
}

/// TP role of a linear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parallel {
    /// Output features split; input replicated (all-gathered under SP).
    Column,
    /// Input features split; output partial, reduced over TP.
    Row,
}

/// A linear layer `y = x W^T` (no bias) and its parameter views.
#[derive(Debug, Clone)]
pub struct Linear {
    /// NVTX module path.
    pub module: String,
    /// TP role.
    pub par: Parallel,
    /// Local weight `[out, in]` (model dtype).
    pub w: Buf,
    /// Local fp32 main grad `[out, in]`.
    pub gw: Buf,
    /// Local output features.
    pub out: usize,
    /// Local input features.
    pub inp: usize,
    /// FP8 linear index (slots in [`Fp8State`]), when the linear runs in FP8.
    pub fp8: Option<usize>,
    /// FP8 weight cache: `[out, in]`, `[in, out]` and the inverse scale.
    pub wq: Option<(Buf, Buf, Buf)>,
}

/// What a linear's forward saves for its FP8 backward: the transposed quantised input.
#[derive(Debug, Clone, Copy)]
pub struct Fp8Saved {
    /// `[in, t]` E4M3.
    pub xt: Buf,
    /// Its inverse scale.
    pub sinv: Buf,
}

impl Fp8Saved {
    /// Buffers for an input of `inp x t`.
    pub fn new(arena: &mut Arena, inp: usize, t: usize) -> Result<Fp8Saved> {
        Ok(Fp8Saved {
            xt: arena.alloc(inp * t, DType::E4M3)?,
            sinv: arena.alloc(1, DType::F32)?,
        })
    }
}

impl Linear {
    /// Quantises the weight into its cache (first micro-batch of a step).
    pub fn quantize_weight(&self, c: &Ctx, f8: &mut Fp8State) -> Result<()> {
        let (Some(li), Some((wq, wqt, sinv))) = (self.fp8, self.wq) else {
            return Ok(());
        };
        f8.quantize(
            c.s,
            &c.topo.amax,
            Fp8State::slot(li, Kind::Weight),
            self.w,
            self.inp,
            wq,
            Some(wqt),
            sinv,
        )?;
        Ok(())
    }

    /// Forward. `x` is `[rows, in]`: for a column-parallel linear under SP the local sequence
    /// shard (`ts` rows, all-gathered here), otherwise `t` rows. Writes `y` `[t, out]` for a
    /// column-parallel linear; a row-parallel one writes its reduced output into `y`
    /// (`[ts, h]`), using `scratch.full` for the partial sum under SP, reduced with `reduce`
    /// (`ncclSum`; `None` skips the TP reduction: the `tp-row-parallel-no-reduce` bug, `Avg`
    /// the `tp-row-parallel-avg` bug).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        c: &Ctx,
        f8: &mut Fp8State,
        sc: &Scratch,
        x: Buf,
        y: Buf,
        saved: Option<Fp8Saved>,
        reduce: Option<Op>,
    ) -> Result<()> {
        let d = c.d;
        let gather = self.par == Parallel::Column && c.sp();
        // The GEMM's output: the final buffer, or the partial-sum scratch under SP.
        let row_sp = self.par == Parallel::Row && c.sp();
        let out = if row_sp {
            sc.full.slice(0, d.t * self.out)
        } else {
            y
        };
        if let (Some(li), Some((wq, _, wsinv)), Some(sv)) = (self.fp8, self.wq, saved) {
            // FP8: quantise the local input, all-gather the bytes under SP.
            let rows = x.len / self.inp;
            let local = if gather {
                sc.q3.slice(0, rows * self.inp)
            } else {
                sc.q1.slice(0, d.t * self.inp)
            };
            let q = f8.quantize(
                c.s,
                &c.topo.amax,
                Fp8State::slot(li, Kind::Input),
                x,
                self.inp,
                local,
                None,
                sv.sinv,
            )?;
            let full = if gather {
                let full = sc.q1.slice(0, d.t * self.inp).cast(DType::E4M3);
                c.topo.tp.all_gather(q.data, full, c.s)?;
                full
            } else {
                q.data
            };
            transpose_bytes(c.s, full, d.t, self.inp, sv.xt)?;
            let mut g = Gemm::new(
                true,
                false,
                self.out,
                d.t,
                self.inp,
                Mat::new(wq.cast(DType::E4M3), self.inp),
                Mat::new(full, self.inp),
                Mat::new(out, self.out),
            );
            g.scale_a = Some(wsinv);
            g.scale_b = Some(sv.sinv);
            c.blas.run(&g)?;
        } else {
            let input = if gather {
                let full = sc.full.slice(0, d.t * self.inp);
                c.topo.tp.all_gather(x, full, c.s)?;
                full
            } else {
                x
            };
            c.blas.run(&Gemm::new(
                true,
                false,
                self.out,
                d.t,
                self.inp,
                Mat::new(self.w, self.inp),
                Mat::new(input, self.inp),
                Mat::new(out, self.out),
            ))?;
        }
        if self.par == Parallel::Row {
            match reduce {
                None => {
                    if row_sp {
                        // Keep this rank's sequence chunk of its own partial sum.
                        let chunk = d.ts * self.out;
                        c.s.copy(y, out.slice(c.topo.tp.rank * chunk, chunk))?;
                    }
                }
                Some(op) if row_sp => c.topo.tp.reduce_scatter(out, y, op, c.s)?,
                Some(op) => c.topo.tp.all_reduce(y, y, op, c.s)?,
            }
        }
        Ok(())
    }

    /// Backward. `dy` is the output grad: for a row-parallel linear `[ts, h]` (all-gathered
    /// here under SP), for a column-parallel one `[t, out]`. `x` is the forward input as
    /// passed to [`Linear::forward`]. Writes the input grad into `dx` (`[ts, in]` for a
    /// column-parallel linear, reduced over TP; `[t, in]` for a row-parallel one) and
    /// accumulates the weight grad (overwrites it when `accumulate` is false).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        c: &Ctx,
        f8: &mut Fp8State,
        sc: &Scratch,
        dy: Buf,
        x: Buf,
        dx: Buf,
        saved: Option<Fp8Saved>,
        accumulate: bool,
    ) -> Result<()> {
        let d = c.d;
        let row_sp = self.par == Parallel::Row && c.sp();
        // Under FP8 the row-parallel output grad is quantised per sequence shard and gathered
        // as FP8 bytes (Transformer Engine gathers grad_output with its quantizer).
        let fp8_gather = row_sp && self.fp8.is_some();
        let dy_full = if row_sp && !fp8_gather {
            let full = sc.full2.slice(0, d.t * self.out);
            c.topo.tp.all_gather(dy, full, c.s)?;
            full
        } else {
            dy
        };
        // Column-parallel input grads are partial sums: computed into scratch, then reduced.
        let col_sp = self.par == Parallel::Column && c.sp();
        let dx_full = if col_sp {
            sc.full.slice(0, d.t * self.inp)
        } else {
            dx
        };
        let beta = if accumulate { 1.0 } else { 0.0 };
        if let (Some(li), Some((_, wqt, wsinv)), Some(sv)) = (self.fp8, self.wq, saved) {
            let gq = sc.q2.slice(0, d.t * self.out);
            let gqt = sc.q3.slice(0, d.t * self.out);
            let slot = Fp8State::slot(li, Kind::Grad);
            let q: Quantized = if fp8_gather {
                let local = sc.q1.slice(0, d.ts * self.out);
                let q = f8.quantize(
                    c.s,
                    &c.topo.amax,
                    slot,
                    dy,
                    self.out,
                    local,
                    None,
                    sc.g_sinv,
                )?;
                let full = gq.cast(DType::E5M2);
                c.topo.tp.all_gather(q.data, full, c.s)?;
                let t = gqt.cast(DType::E5M2);
                transpose_bytes(c.s, full, d.t, self.out, t)?;
                Quantized {
                    data: full,
                    transposed: Some(t),
                    scale_inv: q.scale_inv,
                }
            } else {
                f8.quantize(
                    c.s,
                    &c.topo.amax,
                    slot,
                    dy_full,
                    self.out,
                    gq,
                    Some(gqt),
                    sc.g_sinv,
                )?
            };
            let gqt = q.transposed.unwrap_or(gqt);
            let mut g = Gemm::new(
                true,
                false,
                self.inp,
                d.t,
                self.out,
                Mat::new(wqt.cast(DType::E4M3), self.out),
                Mat::new(q.data, self.out),
                Mat::new(dx_full, self.inp),
            );
            g.scale_a = Some(wsinv);
            g.scale_b = Some(q.scale_inv);
            c.blas.run(&g)?;
            let mut g = Gemm::new(
                true,
                false,
                self.inp,
                self.out,
                d.t,
                Mat::new(sv.xt.cast(DType::E4M3), d.t),
                Mat::new(gqt, d.t),
                Mat::new(self.gw, self.inp),
            );
            g.beta = beta;
            g.scale_a = Some(sv.sinv);
            g.scale_b = Some(q.scale_inv);
            c.blas.run(&g)?;
        } else {
            c.blas.run(&Gemm::new(
                false,
                false,
                self.inp,
                d.t,
                self.out,
                Mat::new(self.w, self.inp),
                Mat::new(dy_full, self.out),
                Mat::new(dx_full, self.inp),
            ))?;
            // The weight grad needs the whole input: re-gather the SP shard (Megatron does the
            // same rather than keep the gathered copy alive).
            let input = if col_sp {
                let full = sc.full2.slice(0, d.t * self.inp);
                c.topo.tp.all_gather(x, full, c.s)?;
                full
            } else {
                x
            };
            let mut g = Gemm::new(
                false,
                true,
                self.inp,
                self.out,
                d.t,
                Mat::new(input, self.inp),
                Mat::new(dy_full, self.out),
                Mat::new(self.gw, self.inp),
            );
            g.beta = beta;
            c.blas.run(&g)?;
        }
        if self.par == Parallel::Column {
            if col_sp {
                c.topo.tp.reduce_scatter(dx_full, dx, Op::Sum, c.s)?;
            } else {
                c.topo.tp.all_reduce(dx, dx, Op::Sum, c.s)?;
            }
        }
        Ok(())
    }
}

/// Transposes row-major `[rows, cols]` bytes into `[cols, rows]` (Transformer Engine's
/// cast-transpose, applied after the all-gather).
pub fn transpose_bytes(s: Stream, src: Buf, rows: usize, cols: usize, dst: Buf) -> Result<()> {
    s.kernel(move || {
        // SAFETY: stream order; distinct buffers.
        unsafe {
            let a = crate::cuda::bytes_mut(src).to_vec();
            let b = crate::cuda::bytes_mut(dst);
            for r in 0..rows {
                for c in 0..cols {
                    b[c * rows + r] = a[r * cols + c];
                }
            }
        }
    })
}
