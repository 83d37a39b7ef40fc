//! Gradient finalisation and the optimizer step, in Megatron's order of effects:
//! tied-embedding grads summed between the first and last stage, sequence-parallel norm grads
//! all-reduced over TP, DP grads averaged bucket by bucket (all-reduce, or reduce-scatter under
//! ZeRO-1), then Adam on fp32 master weights (the whole stage, or this DP rank's shard of each
//! bucket), the model weights cast from the masters, and under ZeRO-1 the updated model
//! weights all-gathered bucket by bucket.

use anyhow::Result;

use crate::bugs::Bug;
use crate::cli::AdamConfig;
use crate::comm::Op;
use crate::cuda::{f32_mut, load, store, Buf};
use crate::layers::Ctx;
use crate::model::Stage;

/// Adam (decoupled weight decay) on one contiguous range, in f32.
#[allow(clippy::too_many_arguments)]
pub fn adam(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    a: &AdamConfig,
    t: usize,
    decay: bool,
) {
    let bc1 = 1.0 - a.beta1.powi(t as i32);
    let bc2 = 1.0 - a.beta2.powi(t as i32);
    for i in 0..p.len() {
        if decay && a.weight_decay != 0.0 {
            p[i] -= a.lr * a.weight_decay * p[i];
        }
        m[i] = a.beta1 * m[i] + (1.0 - a.beta1) * g[i];
        v[i] = a.beta2 * v[i] + (1.0 - a.beta2) * g[i] * g[i];
        let mhat = m[i] / bc1;
        let vhat = v[i] / bc2;
        p[i] -= a.lr * mhat / (vhat.sqrt() + a.eps);
    }
}

/// Where Adam reads a parameter's grad: its own offset, except under `bucket-offset-swap`,
/// where the optimizer's index into the DP grad buffer swaps layer 0's two norm weights.
fn grad_offset(c: &Ctx, st: &Stage, i: usize) -> usize {
    let p = &st.params;
    if c.bug(Bug::BucketOffsetSwap) && c.cfg.layout.dp > 1 {
        let a = p.find("layers.0.input_norm.weight");
        let b = p.find("layers.0.post_attention_norm.weight");
        if let (Some(a), Some(b)) = (a, b) {
            if i == a {
                return p.range(b).0;
            }
            if i == b {
                return p.range(a).0;
            }
        }
    }
    p.range(i).0
}

fn tied_embedding_allreduce(c: &Ctx, st: &Stage) -> Result<()> {
    if c.cfg.layout.pp == 1 || !c.cfg.model.tied || c.bug(Bug::TiedEmbeddingGradUnreduced) {
        return Ok(());
    }
    if let Some(i) = st.params.find("embedding.word_embeddings.weight") {
        let _r = c.nvtx.range("embedding");
        let (o, n) = st.params.range(i);
        let g = st.flat.grad.slice(o, n);
        c.topo.embedding.all_reduce(g, g, Op::Sum, c.s)?;
    }
    Ok(())
}

/// Finalises the grads and takes one optimizer step (`step` counts from 0).
pub fn step(c: &Ctx, st: &Stage, step: usize) -> Result<()> {
    let _outer = c.nvtx.range("optimizer");
    let l = c.cfg.layout;
    let flat = st.flat;
    let specs = &st.params.specs;
    let late_tied = c.bug(Bug::TiedEmbeddingReduceAfterZeroRs);
    if !late_tied {
        tied_embedding_allreduce(c, st)?;
    }
    if l.sp {
        for (i, p) in specs.iter().enumerate() {
            if !p.seq_parallel || (c.bug(Bug::SpNormGradUnreduced) && p.module == "final_norm") {
                continue;
            }
            let _r = c.nvtx.range(&p.module);
            let (o, n) = st.params.range(i);
            let g = flat.grad.slice(o, n);
            c.topo.tp.all_reduce(g, g, Op::Sum, c.s)?;
        }
    }
    let dp_op = if c.bug(Bug::DpGradSum) {
        Op::Sum
    } else {
        Op::Avg
    };
    let me = c.topo.me.dp;
    for (bi, b) in st.params.flat.buckets.iter().enumerate() {
        if !c.topo.dp.active() {
            break;
        }
        let _r = c.nvtx.range(&format!("ddp.bucket{bi}"));
        let all = flat.grad.slice(b.start, b.end - b.start);
        if l.zero1 {
            let (lo, hi) = b.shard(me, l.dp);
            // In place: this rank's block of the bucket receives the reduced shard.
            c.topo
                .dp
                .reduce_scatter(all, flat.grad.slice(lo, hi - lo), dp_op, c.s)?;
        } else {
            c.topo.dp.all_reduce(all, all, dp_op, c.s)?;
        }
    }
    if late_tied {
        tied_embedding_allreduce(c, st)?;
    }
    // Adam over the elements this rank owns.
    let t = step + 1;
    let adam_cfg = c.cfg.adam;
    let skip = c.bug(Bug::Zero1SkipShard) && me == l.dp - 1 && c.topo.last_stage();
    // Per module: (param offset, grad offset, length, decay) of each owned range.
    type Ranges = Vec<(usize, usize, usize, bool)>;
    let mut by_module: Vec<(String, Ranges)> = Vec::new();
    for (bi, b) in st.params.flat.buckets.iter().enumerate() {
        let (lo, hi) = if l.zero1 {
            b.shard(me, l.dp)
        } else {
            (b.start, b.end)
        };
        if skip && bi == 0 {
            continue;
        }
        for &i in &b.params {
            let (o, n) = st.params.range(i);
            let (s, e) = (o.max(lo), (o + n).min(hi));
            if s >= e {
                continue;
            }
            let go = grad_offset(c, st, i) + (s - o);
            let r = (s, go, e - s, specs[i].decay);
            match by_module.iter_mut().find(|(m, _)| *m == specs[i].module) {
                Some((_, v)) => v.push(r),
                None => by_module.push((specs[i].module.clone(), vec![r])),
            }
        }
    }
    for (module, rs) in by_module {
        let _r = c.nvtx.range(&module);
        for (po, go, n, decay) in rs {
            let (p, g, m, v, w) = (
                flat.master.slice(po, n),
                flat.grad.slice(go, n),
                flat.exp_avg.slice(po, n),
                flat.exp_avg_sq.slice(po, n),
                flat.model.slice(po, n),
            );
            c.s.kernel(move || {
                // SAFETY: stream order; the five ranges belong to different buffers.
                unsafe {
                    let p = f32_mut(p);
                    adam(p, &load(g), f32_mut(m), f32_mut(v), &adam_cfg, t, decay);
                    store(w, p);
                }
            })?;
        }
    }
    if l.zero1 && c.topo.dp.active() {
        for (bi, b) in st.params.flat.buckets.iter().enumerate() {
            let _r = c.nvtx.range(&format!("ddp.bucket{bi}"));
            let (lo, hi) = b.shard(me, l.dp);
            c.topo.dp.all_gather(
                flat.model.slice(lo, hi - lo),
                flat.model.slice(b.start, b.end - b.start),
                c.s,
            )?;
        }
    }
    Ok(())
}

/// Gathers the fp32 master weights over DP (ZeRO-1 keeps only shards), for the dump.
pub fn gather_masters(c: &Ctx, st: &Stage) -> Result<()> {
    let l = c.cfg.layout;
    if !(l.zero1 && c.topo.dp.active()) {
        return Ok(());
    }
    let _r = c.nvtx.range("dump");
    for b in &st.params.flat.buckets {
        let (lo, hi) = b.shard(c.topo.me.dp, l.dp);
        let m: Buf = st.flat.master;
        c.topo
            .dp
            .all_gather(m.slice(lo, hi - lo), m.slice(b.start, b.end - b.start), c.s)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adam_first_step_is_bias_corrected() {
        let a = AdamConfig {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-3,
            weight_decay: 0.0,
        };
        let (mut p, mut m, mut v) = (vec![1.0f32, 1.0], vec![0.0; 2], vec![0.0; 2]);
        adam(&mut p, &[0.01, -0.0005], &mut m, &mut v, &a, 1, true);
        // Bias correction makes m_hat = g and v_hat = g^2: the step is lr * g / (|g| + eps).
        let want = |g: f32| 1.0 - 0.1 * g / (g.abs() + 1e-3);
        assert!((p[0] - want(0.01)).abs() < 1e-6 && (p[1] - want(-0.0005)).abs() < 1e-6);
        // A gradient twice as large moves the small element twice as far (eps dominates).
        let (mut q, mut m2, mut v2) = (vec![1.0f32], vec![0.0], vec![0.0]);
        adam(&mut q, &[-0.001], &mut m2, &mut v2, &a, 1, true);
        assert!((1.0 - q[0]) / (1.0 - p[1]) > 1.3);
    }
}
