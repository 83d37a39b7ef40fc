//! Core attention (Megatron's `core_attention`): causal softmax attention over the heads of
//! this TP rank, with strided-batched GEMMs for the scores and the context.
//!
//! The fused QKV output is `[t, 3 * hl]` with each head's q, k, v adjacent (`[np, 3, hn]` per
//! token, Megatron's layout), tokens sequence-first. For batch entry `z = b * np + n` (local
//! sequence b, head n) the head's Q, K and V are column-major `[hn, s]` matrices with leading
//! dimension `b_local * 3 * hl` starting `z * 3 * hn` elements in, so one strided batch of
//! `b_local * np` GEMMs covers them all. Scores and probabilities are stored as column-major
//! `[s_k, s_q]` matrices (one column per query), the context as `[t, hl]`.

use anyhow::Result;

use crate::cuda::Buf;
use crate::gemm::{Gemm, Mat};
use crate::layers::Ctx;

/// Buffers of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct Attention {
    /// Fused QKV `[t, 3 hl]`.
    pub qkv: Buf,
    /// Softmax probabilities `[b np, s, s]` (saved for the backward).
    pub probs: Buf,
    /// Context `[t, hl]`.
    pub ctx: Buf,
    /// Softmax scale.
    pub scale: f32,
}

fn batched(
    c: &Ctx,
    (ta, tb): (bool, bool),
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    a: Mat,
    b: Mat,
    d: Mat,
) -> Result<()> {
    let mut g = Gemm::new(ta, tb, m, n, k, a, b, d);
    g.batch = c.d.b * c.d.np;
    g.alpha = alpha;
    c.blas.run(&g)
}

impl Attention {
    fn head_mat(&self, c: &Ctx, buf: Buf, which: usize) -> Mat {
        let d = c.d;
        Mat::batched(buf.from(which * d.hn), d.b * 3 * d.hl, 3 * d.hn)
    }

    /// Forward: scores (scaled), causal softmax, context. `scores` is scratch of
    /// `[b np, s, s]`.
    pub fn forward(&self, c: &Ctx, scores: Buf) -> Result<()> {
        let d = c.d;
        let ss = d.s * d.s;
        // scores[z][j][i] = scale * sum_d K[d, j] Q[d, i]
        batched(
            c,
            (true, false),
            (d.s, d.s, d.hn),
            self.scale,
            self.head_mat(c, self.qkv, 1),
            self.head_mat(c, self.qkv, 0),
            Mat::batched(scores, d.s, ss),
        )?;
        c.k.softmax_fwd(scores, self.probs, d.s)?;
        // ctx[z][d, i] = sum_j V[d, j] P[j, i]
        batched(
            c,
            (false, false),
            (d.hn, d.s, d.s),
            1.0,
            self.head_mat(c, self.qkv, 2),
            Mat::batched(self.probs, d.s, ss),
            Mat::batched(self.ctx, d.b * d.hl, d.hn),
        )
    }

    /// Backward: from `dctx` `[t, hl]` to `dqkv` `[t, 3 hl]`; `dp` is scratch of
    /// `[b np, s, s]`.
    pub fn backward(&self, c: &Ctx, dctx: Buf, dqkv: Buf, dp: Buf) -> Result<()> {
        let d = c.d;
        let ss = d.s * d.s;
        let dctx_m = Mat::batched(dctx, d.b * d.hl, d.hn);
        let probs = Mat::batched(self.probs, d.s, ss);
        let dpm = Mat::batched(dp, d.s, ss);
        // dP[z][j, i] = sum_d V[d, j] dctx[d, i]
        batched(
            c,
            (true, false),
            (d.s, d.s, d.hn),
            1.0,
            self.head_mat(c, self.qkv, 2),
            dctx_m,
            dpm,
        )?;
        // dV[d, j] = sum_i dctx[d, i] P[j, i]
        batched(
            c,
            (false, true),
            (d.hn, d.s, d.s),
            1.0,
            dctx_m,
            probs,
            self.head_mat(c, dqkv, 2),
        )?;
        c.k.softmax_bwd(dp, self.probs, dp, d.s)?;
        // dQ[d, i] = scale * sum_j K[d, j] dS[j, i]
        batched(
            c,
            (false, false),
            (d.hn, d.s, d.s),
            self.scale,
            self.head_mat(c, self.qkv, 1),
            dpm,
            self.head_mat(c, dqkv, 0),
        )?;
        // dK[d, j] = scale * sum_i Q[d, i] dS[j, i]
        batched(
            c,
            (false, true),
            (d.hn, d.s, d.s),
            self.scale,
            self.head_mat(c, self.qkv, 0),
            dpm,
            self.head_mat(c, dqkv, 1),
        )
    }
}
