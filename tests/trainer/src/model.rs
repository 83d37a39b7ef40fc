//! The model part of one pipeline stage: embedding (first stage), transformer blocks, final
//! norm, LM head and vocab-parallel cross-entropy (last stage), with the per-micro-batch
//! activations the backward needs. Every module pushes its NVTX range (Megatron module paths,
//! global layer numbers).

use anyhow::Result;

use crate::attention::Attention;
use crate::bugs::Bug;
use crate::cli::NormKind;
use crate::comm::Op;
use crate::cuda::{Arena, Buf, DType};
use crate::fp8::Fp8State;
use crate::layers::{Ctx, Dims, Fp8Saved, Linear, Parallel, Scratch};
use crate::params::StageParams;

/// Flat parameter buffers of the stage (all in the layout of [`StageParams::flat`]).
#[derive(Debug, Clone, Copy)]
pub struct Flat {
    /// Model weights (activation dtype).
    pub model: Buf,
    /// fp32 master weights.
    pub master: Buf,
    /// fp32 main grads.
    pub grad: Buf,
    /// Adam first moments.
    pub exp_avg: Buf,
    /// Adam second moments.
    pub exp_avg_sq: Buf,
}

/// A norm module's weights and grads.
#[derive(Debug, Clone)]
pub struct Norm {
    /// NVTX module path.
    pub module: String,
    /// Weight `[h]` (model dtype).
    pub w: Buf,
    /// Bias (LayerNorm).
    pub b: Option<Buf>,
    /// Weight grad.
    pub gw: Buf,
    /// Bias grad.
    pub gb: Option<Buf>,
}

/// A transformer block's modules.
pub struct Block {
    /// Global layer index.
    pub layer: usize,
    /// Input norm.
    pub norm1: Norm,
    /// Fused QKV (column-parallel).
    pub qkv: Linear,
    /// Attention output projection (row-parallel).
    pub proj: Linear,
    /// Post-attention norm.
    pub norm2: Norm,
    /// MLP up-projection (column-parallel).
    pub fc1: Linear,
    /// MLP down-projection (row-parallel).
    pub fc2: Linear,
}

/// Activations of one block for one micro-batch.
pub struct BlockActs {
    /// Block input `[ts, h]`.
    pub x: Buf,
    /// Input-norm output `[ts, h]` and stats.
    pub ln1: Buf,
    st1: Buf,
    qkv: Buf,
    probs: Buf,
    ctx: Buf,
    /// After the attention residual `[ts, h]`.
    x1: Buf,
    ln2: Buf,
    st2: Buf,
    h1: Buf,
    a1: Buf,
    f8: [Option<Fp8Saved>; 4],
}

/// Activations of one micro-batch on this stage.
pub struct MbActs {
    /// Input token ids `[t]` (first stage).
    pub tokens: Buf,
    /// Labels `[t]` (last stage).
    pub labels: Buf,
    emb_full: Buf,
    /// Per block.
    pub blocks: Vec<BlockActs>,
    /// Stage output `[ts, h]` (sent to the next stage, or the final norm's input).
    pub out: Buf,
    lnf: Buf,
    stf: Buf,
    logits: Buf,
    max: Buf,
    pred: Buf,
    sum_exp: Buf,
    /// Grad of the stage output `[ts, h]` (received from the next stage).
    pub dout: Buf,
    /// Grad of the stage input `[ts, h]` (sent to the previous stage).
    pub dinput: Buf,
}

/// Backward scratch.
struct Grads {
    g1: Buf,
    g2: Buf,
    dx1: Buf,
    dln: Buf,
    dctx: Buf,
    dqkv: Buf,
    dp: Buf,
    da1: Buf,
    dlogits: Buf,
    zeros: Buf,
    scores: Buf,
}

/// One stage's model.
pub struct Stage {
    /// Parameters.
    pub params: StageParams,
    /// Flat buffers.
    pub flat: Flat,
    /// Blocks.
    pub blocks: Vec<Block>,
    /// Final norm (last stage).
    pub final_norm: Option<Norm>,
    /// LM head (last stage).
    pub head: Option<Linear>,
    /// Word embedding weight and grad (first stage).
    pub word: Option<(Buf, Buf)>,
    /// Position embedding weight and grad (first stage).
    pub pos: Option<(Buf, Buf)>,
    /// Per micro-batch activations.
    pub acts: Vec<MbActs>,
    /// FP8 scaling state.
    pub fp8: Fp8State,
    /// Running loss of the step (last stage; f32 `[1]`).
    pub loss: Buf,
    sc: Scratch,
    gr: Grads,
    /// Forward passes of micro-batch 0 so far: the step, for `--inject-inf`.
    fwd_steps: usize,
}

impl Stage {
    /// Builds the stage's parameter views and allocates its buffers.
    pub fn new(c: &Ctx, arena: &mut Arena, params: StageParams) -> Result<Stage> {
        let d = c.d;
        let total = params.flat.total.max(1);
        let flat = Flat {
            model: arena.alloc(total, d.act)?,
            master: arena.alloc(total, DType::F32)?,
            grad: arena.alloc(total, DType::F32)?,
            exp_avg: arena.alloc(total, DType::F32)?,
            exp_avg_sq: arena.alloc(total, DType::F32)?,
        };
        let view = |key: &str| -> Result<(Buf, Buf)> {
            let i = params.get(key)?;
            let (o, n) = params.range(i);
            Ok((flat.model.slice(o, n), flat.grad.slice(o, n)))
        };
        let norm = |module: &str| -> Result<Norm> {
            let (w, gw) = view(&format!("{module}.weight"))?;
            let (b, gb) = if c.cfg.model.norm == NormKind::Layernorm {
                let (b, gb) = view(&format!("{module}.bias"))?;
                (Some(b), Some(gb))
            } else {
                (None, None)
            };
            Ok(Norm {
                module: module.into(),
                w,
                b,
                gw,
                gb,
            })
        };
        let fp8 = c.fp8();
        let mut fp8_count = 0;
        let mut linear =
            |arena: &mut Arena, module: String, par, out, inp, f8: bool| -> Result<Linear> {
                let (w, gw) = view(&format!("{module}.weight"))?;
                let (fp8i, wq) = if f8 {
                    fp8_count += 1;
                    (
                        Some(fp8_count - 1),
                        Some((
                            arena.alloc(out * inp, DType::E4M3)?,
                            arena.alloc(out * inp, DType::E4M3)?,
                            arena.alloc(1, DType::F32)?,
                        )),
                    )
                } else {
                    (None, None)
                };
                Ok(Linear {
                    module,
                    par,
                    w,
                    gw,
                    out,
                    inp,
                    fp8: fp8i,
                    wq,
                })
            };
        let per = c.cfg.layers_per_stage();
        let stage = c.topo.me.pp;
        let mut blocks = Vec::new();
        for l in stage * per..(stage + 1) * per {
            let p = format!("layers.{l}");
            blocks.push(Block {
                layer: l,
                norm1: norm(&format!("{p}.input_norm"))?,
                qkv: linear(
                    arena,
                    format!("{p}.attention.qkv"),
                    Parallel::Column,
                    3 * d.hl,
                    d.h,
                    fp8,
                )?,
                proj: linear(
                    arena,
                    format!("{p}.attention.proj"),
                    Parallel::Row,
                    d.h,
                    d.hl,
                    fp8,
                )?,
                norm2: norm(&format!("{p}.post_attention_norm"))?,
                fc1: linear(
                    arena,
                    format!("{p}.mlp.fc1"),
                    Parallel::Column,
                    d.fl,
                    d.h,
                    fp8,
                )?,
                fc2: linear(arena, format!("{p}.mlp.fc2"), Parallel::Row, d.h, d.fl, fp8)?,
            });
        }
        let first = c.topo.first_stage();
        let last = c.topo.last_stage();
        let word = if first {
            Some(view("embedding.word_embeddings.weight")?)
        } else {
            None
        };
        let pos = if first {
            Some(view("embedding.position_embeddings.weight")?)
        } else {
            None
        };
        let (final_norm, head) = if last {
            // The LM head: its own weight, the tied copy, or (pp = 1) the embedding itself.
            let key = if params.find("output_layer.weight").is_some() {
                "output_layer.weight"
            } else {
                "embedding.word_embeddings.weight"
            };
            let (w, gw) = view(key)?;
            (
                Some(norm("final_norm")?),
                Some(Linear {
                    module: "output_layer".into(),
                    par: Parallel::Column,
                    w,
                    gw,
                    out: d.vl,
                    inp: d.h,
                    fp8: None,
                    wq: None,
                }),
            )
        } else {
            (None, None)
        };
        let mut acts = Vec::new();
        for _ in 0..c.cfg.micro_batches {
            acts.push(MbActs::new(c, arena, blocks.len(), fp8)?);
        }
        let reduce_amax = !c.bug(Bug::Fp8AmaxUnreduced);
        let fp8_state = Fp8State::new(arena, fp8_count, c.cfg.amax_history, reduce_amax)?;
        let heads = d.b * d.np * d.s * d.s;
        let gr = Grads {
            g1: arena.alloc(d.ts * d.h, d.act)?,
            g2: arena.alloc(d.ts * d.h, d.act)?,
            dx1: arena.alloc(d.ts * d.h, d.act)?,
            dln: arena.alloc(d.ts * d.h, d.act)?,
            dctx: arena.alloc(d.t * d.hl, d.act)?,
            dqkv: arena.alloc(d.t * 3 * d.hl, d.act)?,
            dp: arena.alloc(heads, d.act)?,
            da1: arena.alloc(d.t * d.fl, d.act)?,
            dlogits: arena.alloc(if last { d.t * d.vl } else { 1 }, d.act)?,
            zeros: arena.alloc(d.ts * d.h, d.act)?,
            scores: arena.alloc(heads, d.act)?,
        };
        Ok(Stage {
            sc: Scratch::new(arena, &d)?,
            loss: arena.alloc(1, DType::F32)?,
            params,
            flat,
            blocks,
            final_norm,
            head,
            word,
            pos,
            acts,
            fp8: fp8_state,
            gr,
            fwd_steps: 0,
        })
    }

    /// Forward of micro-batch `mb` (its input is in `acts[mb].blocks[0].x` on later stages;
    /// the first stage embeds `acts[mb].tokens`). The last stage adds the micro-batch's loss
    /// to [`Stage::loss`].
    pub fn forward(&mut self, c: &Ctx, mb: usize) -> Result<()> {
        let d = c.d;
        let _outer = c.nvtx.range(&format!("forward.mb{mb}"));
        if mb == 0 {
            self.fwd_steps += 1;
        }
        if let (Some((w, _)), Some((pos, _))) = (self.word, self.pos) {
            let _r = c.nvtx.range("embedding");
            let a = &self.acts[mb];
            let target = if c.sp() { a.emb_full } else { a.blocks[0].x };
            c.k.embedding_fwd(a.tokens, w, c.topo.me.tp * d.vl, target)?;
            c.topo.tp.all_reduce(target, target, Op::Sum, c.s)?;
            c.k.add_positions(target, pos, d.b, d.h)?;
            if c.sp() {
                // Scatter to the sequence-parallel region: keep this rank's chunk.
                let n = d.ts * d.h;
                c.s.copy(a.blocks[0].x, target.slice(c.topo.tp.rank * n, n))?;
            }
        }
        for i in 0..self.blocks.len() {
            self.block_forward(c, mb, i)?;
        }
        if let (Some(fnorm), Some(head)) = (&self.final_norm, &self.head) {
            let a = &self.acts[mb];
            {
                let _r = c.nvtx.range("final_norm");
                c.k.norm_fwd(a.out, fnorm.w, fnorm.b, a.lnf, a.stf)?;
            }
            {
                let _r = c.nvtx.range("output_layer");
                head.forward(
                    c,
                    &mut self.fp8,
                    &self.sc,
                    a.lnf,
                    a.logits,
                    None,
                    Some(Op::Sum),
                )?;
            }
            let _r = c.nvtx.range("loss");
            let tp = &c.topo.tp;
            c.k.row_max(a.logits, a.max)?;
            tp.all_reduce(a.max, a.max, Op::Max, c.s)?;
            let v0 = c.topo.me.tp * d.vl;
            c.k.ce_partials(a.logits, a.max, a.labels, v0, a.pred, a.sum_exp)?;
            tp.all_reduce(a.pred, a.pred, Op::Sum, c.s)?;
            tp.all_reduce(a.sum_exp, a.sum_exp, Op::Sum, c.s)?;
            let m = c.cfg.micro_batches as f32;
            c.k.ce_loss(
                a.logits,
                a.max,
                a.pred,
                a.sum_exp,
                a.labels,
                v0,
                1.0 / m,
                self.loss,
            )?;
        }
        if c.fp8() {
            let _r = c.nvtx.range("fp8.amax_reduction");
            self.fp8.update(
                c.s,
                &c.topo.amax,
                &[crate::fp8::Kind::Input, crate::fp8::Kind::Weight],
            )?;
        }
        Ok(())
    }

    fn block_forward(&mut self, c: &Ctx, mb: usize, i: usize) -> Result<()> {
        let d = c.d;
        let blk = &self.blocks[i];
        let a = &self.acts[mb].blocks[i];
        let next_x = if i + 1 < self.blocks.len() {
            self.acts[mb].blocks[i + 1].x
        } else {
            self.acts[mb].out
        };
        let l = blk.layer;
        let bug_layer = c.cfg.bug.map(|b| b.layer(c.cfg));
        {
            let _r = c.nvtx.range(&blk.norm1.module);
            c.k.norm_fwd(a.x, blk.norm1.w, blk.norm1.b, a.ln1, a.st1)?;
        }
        {
            let _r = c.nvtx.range(&blk.qkv.module);
            if mb == 0 {
                // FP8 weights are quantised (and cached) on the first micro-batch of a step.
                blk.qkv.quantize_weight(c, &mut self.fp8)?;
            }
            blk.qkv.forward(
                c,
                &mut self.fp8,
                &self.sc,
                a.ln1,
                a.qkv,
                a.f8[0],
                Some(Op::Sum),
            )?;
        }
        {
            let _r = c.nvtx.range(&format!("layers.{l}.attention.core"));
            let mut hn = d.hn as f32;
            if c.bug(Bug::AttentionSoftmaxScaleLocal) && bug_layer == Some(l) {
                // The projection size per head computed from the TP-local hidden size.
                hn = (d.hl / c.cfg.model.heads) as f32;
            }
            let att = Attention {
                qkv: a.qkv,
                probs: a.probs,
                ctx: a.ctx,
                scale: 1.0 / hn.sqrt(),
            };
            att.forward(c, self.gr.scores)?;
        }
        {
            let _r = c.nvtx.range(&blk.proj.module);
            let reduce = if bug_layer != Some(l) {
                Some(Op::Sum)
            } else if c.bug(Bug::TpRowParallelNoReduce) {
                None
            } else if c.bug(Bug::TpRowParallelAvg) {
                Some(Op::Avg)
            } else {
                Some(Op::Sum)
            };
            if mb == 0 {
                blk.proj.quantize_weight(c, &mut self.fp8)?;
            }
            blk.proj
                .forward(c, &mut self.fp8, &self.sc, a.ctx, a.x1, a.f8[1], reduce)?;
            // Residual (Megatron's bias-dropout-add, without bias or dropout).
            c.k.add(a.x1, a.x, a.x1)?;
        }
        {
            let _r = c.nvtx.range(&blk.norm2.module);
            c.k.norm_fwd(a.x1, blk.norm2.w, blk.norm2.b, a.ln2, a.st2)?;
        }
        {
            let _r = c.nvtx.range(&blk.fc1.module);
            if let Some((layer, from)) = c.cfg.inject_inf {
                // `fwd_steps` was counted up by this step's micro-batch 0.
                if c.topo.rank == 0 && layer == l && self.fwd_steps > from {
                    c.k.set_inf(a.ln2)?;
                }
            }
            if mb == 0 {
                // FP8 weights are quantised (and cached) on the first micro-batch of a step.
                blk.fc1.quantize_weight(c, &mut self.fp8)?;
            }
            blk.fc1.forward(
                c,
                &mut self.fp8,
                &self.sc,
                a.ln2,
                a.h1,
                a.f8[2],
                Some(Op::Sum),
            )?;
            c.k.gelu_fwd(a.h1, a.a1)?;
        }
        {
            let _r = c.nvtx.range(&blk.fc2.module);
            if mb == 0 {
                blk.fc2.quantize_weight(c, &mut self.fp8)?;
            }
            blk.fc2.forward(
                c,
                &mut self.fp8,
                &self.sc,
                a.a1,
                next_x,
                a.f8[3],
                Some(Op::Sum),
            )?;
            c.k.add(next_x, a.x1, next_x)?;
        }
        Ok(())
    }

    /// Backward of micro-batch `mb`: from the loss (last stage) or `acts[mb].dout`, down to
    /// the embedding grads (first stage) or `acts[mb].dinput`.
    pub fn backward(&mut self, c: &Ctx, mb: usize) -> Result<()> {
        let d = c.d;
        let _outer = c.nvtx.range(&format!("backward.mb{mb}"));
        let mut g = self.acts[mb].dout;
        if let (Some(fnorm), Some(head)) = (&self.final_norm, &self.head) {
            let a = &self.acts[mb];
            {
                let _r = c.nvtx.range("loss");
                let m = c.cfg.micro_batches as f32;
                // Mean over the global batch's labelled tokens: every rank's micro-batch has the
                // same number, and DP averages.
                let valid = (d.s - c.cfg.prompt_len) * d.b;
                let mut scale = 1.0 / (valid as f32 * m);
                if c.bug(Bug::LossNotDividedByMicrobatches) {
                    scale *= m;
                }
                let v0 = c.topo.me.tp * d.vl;
                c.k.ce_grad(
                    a.logits,
                    a.max,
                    a.sum_exp,
                    a.labels,
                    v0,
                    scale,
                    self.gr.dlogits,
                )?;
            }
            {
                let _r = c.nvtx.range("output_layer");
                head.backward(
                    c,
                    &mut self.fp8,
                    &self.sc,
                    self.gr.dlogits,
                    a.lnf,
                    self.gr.dln,
                    None,
                    true,
                )?;
            }
            let _r = c.nvtx.range("final_norm");
            c.k.norm_bwd(
                self.gr.dln,
                a.out,
                fnorm.w,
                a.stf,
                self.gr.zeros,
                self.gr.g1,
                fnorm.gw,
                fnorm.gb,
                1.0,
            )?;
            g = self.gr.g1;
        }
        for i in (0..self.blocks.len()).rev() {
            let out = if i == 0 {
                self.acts[mb].dinput
            } else if g == self.gr.g1 {
                self.gr.g2
            } else {
                self.gr.g1
            };
            self.block_backward(c, mb, i, g, out)?;
            g = out;
        }
        if let (Some((_, gword)), Some((_, gpos))) = (self.word, self.pos) {
            let _r = c.nvtx.range("embedding");
            let a = &self.acts[mb];
            // Backward of the scatter to the sequence-parallel region: all-gather.
            let full = if c.sp() {
                let full = a.emb_full;
                c.topo.tp.all_gather(g, full, c.s)?;
                full
            } else {
                g
            };
            let v0 = c.topo.me.tp * d.vl;
            c.k.embedding_bwd(a.tokens, full, v0, gword, Some(gpos), d.b)?;
        }
        if c.fp8() {
            let _r = c.nvtx.range("fp8.amax_reduction");
            self.fp8
                .update(c.s, &c.topo.amax, &[crate::fp8::Kind::Grad])?;
        }
        Ok(())
    }

    fn block_backward(&mut self, c: &Ctx, mb: usize, i: usize, g: Buf, out: Buf) -> Result<()> {
        let d = c.d;
        let blk = &self.blocks[i];
        let a = &self.acts[mb].blocks[i];
        let gr = &self.gr;
        let l = blk.layer;
        let bug_layer = c.cfg.bug.map(|b| b.layer(c.cfg));
        {
            let _r = c.nvtx.range(&blk.fc2.module);
            let accumulate = !(c.bug(Bug::GradAccumOverwrite) && bug_layer == Some(l) && mb > 0);
            blk.fc2.backward(
                c,
                &mut self.fp8,
                &self.sc,
                g,
                a.a1,
                gr.da1,
                a.f8[3],
                accumulate,
            )?;
        }
        {
            let _r = c.nvtx.range(&blk.fc1.module);
            c.k.gelu_bwd(gr.da1, a.h1, gr.da1)?;
            blk.fc1.backward(
                c,
                &mut self.fp8,
                &self.sc,
                gr.da1,
                a.ln2,
                gr.dln,
                a.f8[2],
                true,
            )?;
        }
        {
            let _r = c.nvtx.range(&blk.norm2.module);
            let n = &blk.norm2;
            c.k.norm_bwd(gr.dln, a.x1, n.w, a.st2, g, gr.dx1, n.gw, n.gb, 1.0)?;
        }
        {
            let _r = c.nvtx.range(&blk.proj.module);
            blk.proj.backward(
                c,
                &mut self.fp8,
                &self.sc,
                gr.dx1,
                a.ctx,
                gr.dctx,
                a.f8[1],
                true,
            )?;
        }
        {
            let _r = c.nvtx.range(&format!("layers.{l}.attention.core"));
            let mut hn = d.hn as f32;
            if c.bug(Bug::AttentionSoftmaxScaleLocal) && bug_layer == Some(l) {
                hn = (d.hl / c.cfg.model.heads) as f32;
            }
            let att = Attention {
                qkv: a.qkv,
                probs: a.probs,
                ctx: a.ctx,
                scale: 1.0 / hn.sqrt(),
            };
            att.backward(c, gr.dctx, gr.dqkv, gr.dp)?;
        }
        {
            let _r = c.nvtx.range(&blk.qkv.module);
            blk.qkv.backward(
                c,
                &mut self.fp8,
                &self.sc,
                gr.dqkv,
                a.ln1,
                gr.dln,
                a.f8[0],
                true,
            )?;
        }
        {
            let _r = c.nvtx.range(&blk.norm1.module);
            let n = &blk.norm1;
            let scale = if c.bug(Bug::NormGradScaledByTp) && bug_layer == Some(l) {
                c.cfg.layout.tp as f32
            } else {
                1.0
            };
            c.k.norm_bwd(gr.dln, a.x, n.w, a.st1, gr.dx1, out, n.gw, n.gb, scale)?;
        }
        Ok(())
    }
}

impl MbActs {
    fn new(c: &Ctx, arena: &mut Arena, blocks: usize, fp8: bool) -> Result<MbActs> {
        let d: Dims = c.d;
        let act = d.act;
        let first = c.topo.first_stage();
        let last = c.topo.last_stage();
        let mut bl = Vec::new();
        for _ in 0..blocks {
            let f8 = if fp8 {
                [
                    Some(Fp8Saved::new(arena, d.h, d.t)?),
                    Some(Fp8Saved::new(arena, d.hl, d.t)?),
                    Some(Fp8Saved::new(arena, d.h, d.t)?),
                    Some(Fp8Saved::new(arena, d.fl, d.t)?),
                ]
            } else {
                [None; 4]
            };
            bl.push(BlockActs {
                x: arena.alloc(d.ts * d.h, act)?,
                ln1: arena.alloc(d.ts * d.h, act)?,
                st1: arena.alloc(2 * d.ts, DType::F32)?,
                qkv: arena.alloc(d.t * 3 * d.hl, act)?,
                probs: arena.alloc(d.b * d.np * d.s * d.s, act)?,
                ctx: arena.alloc(d.t * d.hl, act)?,
                x1: arena.alloc(d.ts * d.h, act)?,
                ln2: arena.alloc(d.ts * d.h, act)?,
                st2: arena.alloc(2 * d.ts, DType::F32)?,
                h1: arena.alloc(d.t * d.fl, act)?,
                a1: arena.alloc(d.t * d.fl, act)?,
                f8,
            });
        }
        let lt = |n: usize| if last { n } else { 1 };
        Ok(MbActs {
            tokens: arena.alloc(if first { d.t } else { 1 }, DType::I32)?,
            labels: arena.alloc(lt(d.t), DType::I32)?,
            emb_full: arena.alloc(if first { d.t * d.h } else { 1 }, act)?,
            blocks: bl,
            out: arena.alloc(d.ts * d.h, act)?,
            lnf: arena.alloc(lt(d.ts * d.h), act)?,
            stf: arena.alloc(lt(2 * d.ts), DType::F32)?,
            logits: arena.alloc(lt(d.t * d.vl), act)?,
            max: arena.alloc(lt(d.t), DType::F32)?,
            pred: arena.alloc(lt(d.t), DType::F32)?,
            sum_exp: arena.alloc(lt(d.t), DType::F32)?,
            dout: arena.alloc(d.ts * d.h, act)?,
            dinput: arena.alloc(d.ts * d.h, act)?,
        })
    }
}
