//! The kernels a tracer does not see: normalization, GELU, softmax, embedding, cross-entropy,
//! residual adds and casts, each a host function on the rank's stream (`cudaLaunchHostFunc`)
//! that reaches device memory through `device_access` only.
//!
//! Every kernel loads its inputs into f32 (from f32 or bf16), computes in f32 (f64 for long
//! sums) and stores its outputs rounded to the buffer's type, as mixed-precision kernels do.
//! The math lives in plain functions over slices (tested below); the `enqueue_*` wrappers
//! capture buffers by value and run the math when the stream reaches them.

use anyhow::Result;

use crate::cuda::{f32_mut, i32s, load, store, Buf, Stream};

/// Epsilon of LayerNorm and RMSNorm.
pub const NORM_EPS: f32 = 1e-5;

/// Row-wise normalization: returns the output and per-row `(mean, rstd)` (mean 0 for RMSNorm).
pub fn norm_forward(
    x: &[f32],
    h: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let rows = x.len() / h;
    let mut y = vec![0f32; x.len()];
    let mut stats = vec![0f32; 2 * rows];
    for r in 0..rows {
        let xr = &x[r * h..(r + 1) * h];
        let (mean, var) = if beta.is_some() {
            let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / h as f64;
            let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / h as f64;
            (mean as f32, var as f32)
        } else {
            let ms = xr.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / h as f64;
            (0.0, ms as f32)
        };
        let rstd = 1.0 / (var + NORM_EPS).sqrt();
        stats[2 * r] = mean;
        stats[2 * r + 1] = rstd;
        let yr = &mut y[r * h..(r + 1) * h];
        for i in 0..h {
            let xhat = (xr[i] - mean) * rstd;
            yr[i] = xhat * gamma[i] + beta.map_or(0.0, |b| b[i]);
        }
    }
    (y, stats)
}

/// Backward of [`norm_forward`]: returns `dx` and adds the weight (and bias) grads into
/// `dgamma` (`dbeta`), the weight grad multiplied by `gamma_grad_scale`.
#[allow(clippy::too_many_arguments)]
pub fn norm_backward(
    dy: &[f32],
    x: &[f32],
    h: usize,
    gamma: &[f32],
    stats: &[f32],
    dgamma: &mut [f32],
    dbeta: Option<&mut [f32]>,
    gamma_grad_scale: f32,
) -> Vec<f32> {
    let rows = x.len() / h;
    let layer = dbeta.is_some();
    let mut dx = vec![0f32; x.len()];
    let mut dg = vec![0f64; h];
    let mut db = vec![0f64; h];
    let mut xhat = vec![0f32; h];
    let mut dxhat = vec![0f32; h];
    for r in 0..rows {
        let (mean, rstd) = (stats[2 * r], stats[2 * r + 1]);
        let (xr, dyr) = (&x[r * h..(r + 1) * h], &dy[r * h..(r + 1) * h]);
        let (mut s1, mut s2) = (0f64, 0f64);
        for i in 0..h {
            xhat[i] = (xr[i] - mean) * rstd;
            dxhat[i] = dyr[i] * gamma[i];
            s1 += dxhat[i] as f64;
            s2 += (dxhat[i] * xhat[i]) as f64;
            dg[i] += (dyr[i] * xhat[i]) as f64;
            db[i] += dyr[i] as f64;
        }
        let (m1, m2) = ((s1 / h as f64) as f32, (s2 / h as f64) as f32);
        let dxr = &mut dx[r * h..(r + 1) * h];
        for i in 0..h {
            let centred = if layer { dxhat[i] - m1 } else { dxhat[i] };
            dxr[i] = rstd * (centred - xhat[i] * m2);
        }
    }
    for i in 0..h {
        dgamma[i] += dg[i] as f32 * gamma_grad_scale;
    }
    if let Some(dbeta) = dbeta {
        for i in 0..h {
            dbeta[i] += db[i] as f32;
        }
    }
    dx
}

const GELU_C: f32 = 0.797_884_6; // sqrt(2/pi)
const GELU_A: f32 = 0.044_715;

/// GELU, tanh form.
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (GELU_C * (x + GELU_A * x * x * x)).tanh())
}

/// Derivative of [`gelu`].
pub fn gelu_grad(x: f32) -> f32 {
    let t = (GELU_C * (x + GELU_A * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * x * x)
}

/// Causal softmax over score columns: `scores` holds `batch` column-major `[s_k, s_q]`
/// matrices; column `i` (query i) is normalised over keys `j <= i`, later keys get 0.
pub fn causal_softmax(scores: &[f32], s: usize) -> Vec<f32> {
    let mut p = vec![0f32; scores.len()];
    let batch = scores.len() / (s * s);
    for z in 0..batch {
        for i in 0..s {
            let base = z * s * s + i * s;
            let col = &scores[base..base + i + 1];
            let mx = col.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f64;
            for j in 0..=i {
                let e = (col[j] - mx).exp();
                p[base + j] = e;
                sum += e as f64;
            }
            let inv = (1.0 / sum) as f32;
            for v in &mut p[base..=base + i] {
                *v *= inv;
            }
        }
    }
    p
}

/// Backward of [`causal_softmax`]: `dS = P * (dP - sum_j P dP)` per column.
pub fn causal_softmax_backward(dp: &[f32], p: &[f32], s: usize) -> Vec<f32> {
    let mut ds = vec![0f32; p.len()];
    for ((dcol, pcol), out) in dp.chunks(s).zip(p.chunks(s)).zip(ds.chunks_mut(s)) {
        let dot: f64 = dcol.iter().zip(pcol).map(|(&a, &b)| (a * b) as f64).sum();
        let dot = dot as f32;
        for j in 0..s {
            out[j] = pcol[j] * (dcol[j] - dot);
        }
    }
    ds
}

/// The cross-entropy of one micro-batch, from vocab-parallel pieces already reduced over TP.
pub struct CrossEntropy<'a> {
    /// Local logits `[T, Vl]`.
    pub logits: &'a [f32],
    /// Global row maxima `[T]`.
    pub max: &'a [f32],
    /// Global sums of `exp(logit - max)` `[T]`.
    pub sum_exp: &'a [f32],
    /// Global target logits minus max `[T]`.
    pub predicted: &'a [f32],
    /// Labels `[T]`.
    pub labels: &'a [i32],
    /// First vocabulary id of this rank's shard.
    pub v0: usize,
}

impl CrossEntropy<'_> {
    /// Mean loss over the micro-batch's tokens that have a label (`ln(sum_exp) - predicted`;
    /// label -1 marks a prompt token without loss).
    pub fn loss(&self) -> f64 {
        let valid = || (0..self.labels.len()).filter(|&r| self.labels[r] >= 0);
        let total: f64 = valid()
            .map(|r| (self.sum_exp[r].ln() - self.predicted[r]) as f64)
            .sum();
        total / valid().count().max(1) as f64
    }

    /// `d loss / d logits` (local shard of `vl` columns) scaled by `grad_scale`.
    pub fn grad(&self, vl: usize, grad_scale: f32) -> Vec<f32> {
        let mut d = vec![0f32; self.logits.len()];
        for r in 0..self.labels.len() {
            if self.labels[r] < 0 {
                continue;
            }
            let se = self.sum_exp[r];
            let row = &self.logits[r * vl..(r + 1) * vl];
            let dr = &mut d[r * vl..(r + 1) * vl];
            for v in 0..vl {
                dr[v] = (row[v] - self.max[r]).exp() / se * grad_scale;
            }
            let lab = self.labels[r] as usize;
            if (self.v0..self.v0 + vl).contains(&lab) {
                dr[lab - self.v0] -= grad_scale;
            }
        }
        d
    }
}

/// Elementwise kernels, enqueued on a stream.
#[derive(Debug, Clone, Copy)]
pub struct Kernels {
    /// The stream they run on.
    pub s: Stream,
}

impl Kernels {
    /// `y = norm(x)` with weight (and bias for LayerNorm); writes per-row stats.
    pub fn norm_fwd(
        &self,
        x: Buf,
        gamma: Buf,
        beta: Option<Buf>,
        y: Buf,
        stats: Buf,
    ) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: the kernel runs in stream order; its buffers are distinct.
            unsafe {
                let g = load(gamma);
                let b = beta.map(|b| load(b));
                let (out, st) = norm_forward(&load(x), g.len(), &g, b.as_deref());
                store(y, &out);
                store(stats, &st);
            }
        })
    }

    /// `dx = dres + norm_backward(dy)`; accumulates the weight/bias grads (fp32).
    #[allow(clippy::too_many_arguments)]
    pub fn norm_bwd(
        &self,
        dy: Buf,
        x: Buf,
        gamma: Buf,
        stats: Buf,
        dres: Buf,
        dx: Buf,
        dgamma: Buf,
        dbeta: Option<Buf>,
        gamma_grad_scale: f32,
    ) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order; distinct buffers (dres may equal dx: it is loaded first).
            unsafe {
                let g = load(gamma);
                let h = g.len();
                let mut out = norm_backward(
                    &load(dy),
                    &load(x),
                    h,
                    &g,
                    &load(stats),
                    f32_mut(dgamma),
                    dbeta.map(|b| f32_mut(b)),
                    gamma_grad_scale,
                );
                for (o, r) in out.iter_mut().zip(load(dres)) {
                    *o += r;
                }
                store(dx, &out);
            }
        })
    }

    /// `out = a + b`.
    pub fn add(&self, a: Buf, b: Buf, out: Buf) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order; `out` may alias `a` or `b` (both are loaded first).
            unsafe {
                let mut va = load(a);
                for (x, y) in va.iter_mut().zip(load(b)) {
                    *x += y;
                }
                store(out, &va);
            }
        })
    }

    /// `y = gelu(x)`.
    pub fn gelu_fwd(&self, x: Buf, y: Buf) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order.
            unsafe {
                let v: Vec<f32> = load(x).into_iter().map(gelu).collect();
                store(y, &v);
            }
        })
    }

    /// `dx = dy * gelu'(x)`.
    pub fn gelu_bwd(&self, dy: Buf, x: Buf, dx: Buf) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order; `dx` may alias `dy`.
            unsafe {
                let v: Vec<f32> = load(dy)
                    .into_iter()
                    .zip(load(x))
                    .map(|(g, x)| g * gelu_grad(x))
                    .collect();
                store(dx, &v);
            }
        })
    }

    /// Causal softmax of `[batch][s_k][s_q]` scores into `probs`.
    pub fn softmax_fwd(&self, scores: Buf, probs: Buf, s: usize) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order.
            unsafe { store(probs, &causal_softmax(&load(scores), s)) }
        })
    }

    /// Softmax backward into `ds` (may alias `dp`).
    pub fn softmax_bwd(&self, dp: Buf, probs: Buf, ds: Buf, s: usize) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order.
            unsafe { store(ds, &causal_softmax_backward(&load(dp), &load(probs), s)) }
        })
    }

    /// Vocab-parallel lookup: `out[t] = W[tok - v0]` for tokens of this shard, else 0.
    pub fn embedding_fwd(&self, tokens: Buf, w: Buf, v0: usize, out: Buf) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order.
            unsafe {
                let wv = load(w);
                let toks = i32s(tokens);
                let h = out.len / toks.len();
                let vl = wv.len() / h;
                let mut o = vec![0f32; out.len];
                for (t, &tok) in toks.iter().enumerate() {
                    let id = tok as usize;
                    if (v0..v0 + vl).contains(&id) {
                        let r = id - v0;
                        o[t * h..(t + 1) * h].copy_from_slice(&wv[r * h..(r + 1) * h]);
                    }
                }
                store(out, &o);
            }
        })
    }

    /// Adds position embeddings: row `t` (hidden size `h`) gets `pos[t / batch]`
    /// (sequence-first rows).
    pub fn add_positions(&self, x: Buf, pos: Buf, batch: usize, h: usize) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order.
            unsafe {
                let p = load(pos);
                let mut v = load(x);
                add_positions_in(&mut v, &p, batch, h);
                store(x, &v);
            }
        })
    }

    /// Embedding backward: scatter-adds rows of `dout` into the word-embedding grad (tokens of
    /// this shard) and into the position-embedding grad (when given).
    pub fn embedding_bwd(
        &self,
        tokens: Buf,
        dout: Buf,
        v0: usize,
        dword: Buf,
        dpos: Option<Buf>,
        batch: usize,
    ) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order; the grad buffers are distinct.
            unsafe {
                let d = load(dout);
                let toks = i32s(tokens);
                let h = d.len() / toks.len();
                let gw = f32_mut(dword);
                let vl = gw.len() / h;
                for (t, &tok) in toks.iter().enumerate() {
                    let id = tok as usize;
                    if (v0..v0 + vl).contains(&id) {
                        let r = id - v0;
                        for (g, x) in gw[r * h..(r + 1) * h].iter_mut().zip(&d[t * h..]) {
                            *g += x;
                        }
                    }
                }
                if let Some(dpos) = dpos {
                    let gp = f32_mut(dpos);
                    for t in 0..toks.len() {
                        let p = t / batch;
                        for (g, x) in gp[p * h..(p + 1) * h].iter_mut().zip(&d[t * h..]) {
                            *g += x;
                        }
                    }
                }
            }
        })
    }

    /// Row maxima of local logits `[T, Vl]` into `max [T]` (f32).
    pub fn row_max(&self, logits: Buf, max: Buf) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order.
            unsafe {
                let l = load(logits);
                let vl = l.len() / max.len;
                let m: Vec<f32> = l
                    .chunks(vl)
                    .map(|r| r.iter().copied().fold(f32::NEG_INFINITY, f32::max))
                    .collect();
                store(max, &m);
            }
        })
    }

    /// Local pieces of the vocab-parallel cross-entropy: the target logit minus the global max
    /// (0 when the target is on another shard) and the sum of `exp(logit - max)`.
    pub fn ce_partials(
        &self,
        logits: Buf,
        max: Buf,
        labels: Buf,
        v0: usize,
        predicted: Buf,
        sum_exp: Buf,
    ) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order.
            unsafe {
                let l = load(logits);
                let m = load(max);
                let labs = i32s(labels);
                let vl = l.len() / m.len();
                let mut pred = vec![0f32; m.len()];
                let mut se = vec![0f32; m.len()];
                for r in 0..m.len() {
                    let row = &l[r * vl..(r + 1) * vl];
                    se[r] = row.iter().map(|&x| ((x - m[r]).exp()) as f64).sum::<f64>() as f32;
                    if let Ok(lab) = usize::try_from(labs[r]) {
                        if (v0..v0 + vl).contains(&lab) {
                            pred[r] = row[lab - v0] - m[r];
                        }
                    }
                }
                store(predicted, &pred);
                store(sum_exp, &se);
            }
        })
    }

    /// Loss of a micro-batch: adds `mean loss * loss_scale` to `loss[0]`.
    #[allow(clippy::too_many_arguments)]
    pub fn ce_loss(
        &self,
        logits: Buf,
        max: Buf,
        predicted: Buf,
        sum_exp: Buf,
        labels: Buf,
        v0: usize,
        loss_scale: f32,
        loss: Buf,
    ) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order; distinct buffers.
            unsafe {
                let (l, m, p, se) = (load(logits), load(max), load(predicted), load(sum_exp));
                let ce = CrossEntropy {
                    logits: &l,
                    max: &m,
                    sum_exp: &se,
                    predicted: &p,
                    labels: i32s(labels),
                    v0,
                };
                f32_mut(loss)[0] += (ce.loss() * loss_scale as f64) as f32;
            }
        })
    }

    /// Logits gradient of a micro-batch: `dlogits = (softmax - onehot) * grad_scale`.
    #[allow(clippy::too_many_arguments)]
    pub fn ce_grad(
        &self,
        logits: Buf,
        max: Buf,
        sum_exp: Buf,
        labels: Buf,
        v0: usize,
        grad_scale: f32,
        dlogits: Buf,
    ) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order; distinct buffers.
            unsafe {
                let (l, m, se) = (load(logits), load(max), load(sum_exp));
                let ce = CrossEntropy {
                    logits: &l,
                    max: &m,
                    sum_exp: &se,
                    predicted: &[],
                    labels: i32s(labels),
                    v0,
                };
                store(dlogits, &ce.grad(l.len() / m.len(), grad_scale));
            }
        })
    }

    /// `dst = src` converted between float types (f32/bf16).
    pub fn cast(&self, src: Buf, dst: Buf) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order; distinct buffers.
            unsafe { store(dst, &load(src)) }
        })
    }

    /// Sets element 0 of `b` to +Inf (the `--inject-inf` fixture).
    pub fn set_inf(&self, b: Buf) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order.
            unsafe {
                let mut v = load(b);
                if let Some(x) = v.first_mut() {
                    *x = f32::INFINITY;
                }
                store(b, &v);
            }
        })
    }

    /// Multiplies an f32 buffer by `factor` in place.
    pub fn scale(&self, b: Buf, factor: f32) -> Result<()> {
        self.s.kernel(move || {
            // SAFETY: stream order.
            unsafe {
                for v in f32_mut(b) {
                    *v *= factor;
                }
            }
        })
    }
}

/// Adds `pos[t / batch]` to row `t` of `x` (rows of `h` elements).
pub fn add_positions_in(x: &mut [f32], pos: &[f32], batch: usize, h: usize) {
    for (t, row) in x.chunks_mut(h).enumerate() {
        let p = t / batch;
        for (v, e) in row.iter_mut().zip(&pos[p * h..(p + 1) * h]) {
            *v += e;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::SplitMix;

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut g = SplitMix::new(seed, &[]);
        (0..n).map(|_| g.normal() as f32).collect()
    }

    fn dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
    }

    /// Central difference of `f` along coordinate `i` of `x`.
    fn fd(f: &dyn Fn(&[f32]) -> f64, x: &[f32], i: usize) -> f64 {
        let h = 1e-2f32;
        let (mut a, mut b) = (x.to_vec(), x.to_vec());
        a[i] += h;
        b[i] -= h;
        (f(&a) - f(&b)) / (2.0 * h as f64)
    }

    #[test]
    fn norm_backward_matches_finite_differences() {
        let h = 8;
        let x = rand(3 * h, 1);
        let gamma: Vec<f32> = rand(h, 2).iter().map(|v| 1.0 + 0.3 * v).collect();
        let beta = rand(h, 3);
        let r = rand(3 * h, 4);
        for layer in [true, false] {
            let b = layer.then_some(beta.as_slice());
            let loss = |xv: &[f32]| dot(&norm_forward(xv, h, &gamma, b).0, &r);
            let loss_g = |g: &[f32]| dot(&norm_forward(&x, h, g, b).0, &r);
            let (_, stats) = norm_forward(&x, h, &gamma, b);
            let mut dg = vec![0f32; h];
            let mut db = vec![0f32; h];
            let dx = norm_backward(
                &r,
                &x,
                h,
                &gamma,
                &stats,
                &mut dg,
                layer.then_some(db.as_mut_slice()),
                1.0,
            );
            for (i, got) in dx.iter().enumerate() {
                let want = fd(&loss, &x, i);
                assert!((*got as f64 - want).abs() < 2e-3, "dx[{i}] {got} vs {want}");
            }
            for i in 0..h {
                let want = fd(&loss_g, &gamma, i);
                assert!((dg[i] as f64 - want).abs() < 2e-3, "dgamma[{i}]");
                if layer {
                    let want: f64 = (0..3).map(|row| r[row * h + i] as f64).sum();
                    assert!((db[i] as f64 - want).abs() < 1e-4, "dbeta[{i}]");
                }
            }
        }
    }

    #[test]
    fn gelu_and_softmax_backward_match_finite_differences() {
        for x in [-3.0f32, -0.5, 0.0, 0.7, 2.5] {
            let want = (gelu(x + 1e-3) - gelu(x - 1e-3)) as f64 / 2e-3;
            assert!((gelu_grad(x) as f64 - want).abs() < 1e-3, "gelu'({x})");
        }
        let s = 4;
        let scores = rand(2 * s * s, 5);
        let r = rand(2 * s * s, 6);
        let p = causal_softmax(&scores, s);
        // Causal: query i sees keys 0..=i, each column sums to 1.
        for z in 0..2 {
            for i in 0..s {
                let col = &p[z * s * s + i * s..z * s * s + (i + 1) * s];
                assert!(col[i + 1..].iter().all(|&v| v == 0.0));
                assert!((col.iter().sum::<f32>() - 1.0).abs() < 1e-6);
            }
        }
        let loss = |sc: &[f32]| dot(&causal_softmax(sc, s), &r);
        let ds = causal_softmax_backward(&r, &p, s);
        for (i, got) in ds.iter().enumerate() {
            let want = fd(&loss, &scores, i);
            assert!((*got as f64 - want).abs() < 1e-3, "dS[{i}] {got} vs {want}");
        }
    }

    #[test]
    fn cross_entropy_gradient_matches_finite_differences() {
        let (t, v) = (3, 5);
        let logits = rand(t * v, 7);
        let labels = [1i32, -1, 4];
        let pieces = |l: &[f32]| {
            let max: Vec<f32> = l
                .chunks(v)
                .map(|r| r.iter().copied().fold(f32::NEG_INFINITY, f32::max))
                .collect();
            let se: Vec<f32> = l
                .chunks(v)
                .zip(&max)
                .map(|(r, m)| r.iter().map(|x| (x - m).exp()).sum())
                .collect();
            let pred: Vec<f32> = (0..t)
                .map(|i| match usize::try_from(labels[i]) {
                    Ok(lab) => l[i * v + lab] - max[i],
                    Err(_) => 0.0,
                })
                .collect();
            (max, se, pred)
        };
        let loss = |l: &[f32]| {
            let (max, se, pred) = pieces(l);
            CrossEntropy {
                logits: l,
                max: &max,
                sum_exp: &se,
                predicted: &pred,
                labels: &labels,
                v0: 0,
            }
            .loss()
        };
        let (max, se, pred) = pieces(&logits);
        let ce = CrossEntropy {
            logits: &logits,
            max: &max,
            sum_exp: &se,
            predicted: &pred,
            labels: &labels,
            v0: 0,
        };
        // Two labelled tokens: the mean's gradient is 1/2 per token.
        let g = ce.grad(v, 0.5);
        for (i, got) in g.iter().enumerate() {
            let want = fd(&loss, &logits, i);
            assert!(
                (*got as f64 - want).abs() < 1e-3,
                "dlogits[{i}] {got} vs {want}"
            );
        }
        assert!(
            g[v..2 * v].iter().all(|&x| x == 0.0),
            "a prompt token has no gradient"
        );
    }
}
