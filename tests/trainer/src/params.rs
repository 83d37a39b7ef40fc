//! Parameters of a pipeline stage: canonical names and shapes, TP shards, and the flat buffers
//! (model weights, fp32 master weights, fp32 main grads, Adam moments) laid out as Megatron's
//! DDP lays out its grad buffer: parameters in reverse order, cut into buckets, each bucket
//! padded to a multiple of the DP size so that ZeRO-1 can reduce-scatter it.

use std::collections::HashMap;

use anyhow::Result;

use crate::bugs::Bug;
use crate::cli::{Config, NormKind};
use crate::init::Init;

/// How a tensor is split across TP ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Every TP rank holds the whole tensor.
    Replicated,
    /// Rows (dim 0: output features, vocabulary) are split.
    Rows,
    /// Columns (dim 1: input features) are split.
    Cols,
}

/// A parameter of the stage.
#[derive(Debug, Clone)]
pub struct ParamSpec {
    /// Canonical name (the reference's; a tied copy uses the embedding's name).
    pub name: String,
    /// NVTX module path of the module owning it.
    pub module: String,
    /// Canonical shape: `[n]` or `[rows, cols]`.
    pub shape: Vec<usize>,
    /// TP split.
    pub split: Split,
    /// Initialisation.
    pub init: Init,
    /// Grads need an all-reduce over TP under sequence parallelism (norms).
    pub seq_parallel: bool,
    /// Weight decay applies.
    pub decay: bool,
    /// The last stage's copy of the tied word embedding (pp > 1).
    pub tied_copy: bool,
}

impl ParamSpec {
    fn rows(&self) -> usize {
        self.shape[0]
    }
    fn cols(&self) -> usize {
        self.shape.get(1).copied().unwrap_or(1)
    }
}

/// A TP shard of a canonical tensor: rows `r0..r1`, columns `c0..c1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// First row.
    pub r0: usize,
    /// End row.
    pub r1: usize,
    /// First column.
    pub c0: usize,
    /// End column.
    pub c1: usize,
}

impl Shard {
    /// Elements.
    pub fn numel(&self) -> usize {
        (self.r1 - self.r0) * (self.c1 - self.c0)
    }
    /// Extracts the shard from a row-major `rows x cols` tensor.
    pub fn extract(&self, full: &[f32], cols: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.numel());
        for r in self.r0..self.r1 {
            out.extend_from_slice(&full[r * cols + self.c0..r * cols + self.c1]);
        }
        out
    }
}

fn norm_specs(c: &Config, module: &str, out: &mut Vec<ParamSpec>) {
    let h = c.model.hidden;
    out.push(ParamSpec {
        name: format!("{module}.weight"),
        module: module.into(),
        shape: vec![h],
        split: Split::Replicated,
        init: Init::Ones,
        seq_parallel: true,
        decay: false,
        tied_copy: false,
    });
    if c.model.norm == NormKind::Layernorm {
        out.push(ParamSpec {
            name: format!("{module}.bias"),
            module: module.into(),
            shape: vec![h],
            split: Split::Replicated,
            init: Init::Zeros,
            seq_parallel: true,
            decay: false,
            tied_copy: false,
        });
    }
}

fn matrix(module: String, rows: usize, cols: usize, split: Split, std: f32) -> ParamSpec {
    ParamSpec {
        name: format!("{module}.weight"),
        module,
        shape: vec![rows, cols],
        split,
        init: Init::Normal(std),
        seq_parallel: false,
        decay: true,
        tied_copy: false,
    }
}

/// The parameters of pipeline stage `stage`, in registration (forward) order.
pub fn stage_specs(c: &Config, stage: usize) -> Vec<ParamSpec> {
    let m = &c.model;
    let (h, f, v) = (m.hidden, m.ffn, m.vocab);
    // Megatron's init: N(0, 0.02), output projections scaled by 1/sqrt(2 L).
    let std = 0.02f32;
    let out_std = std / (2.0 * m.layers as f32).sqrt();
    let mut out = Vec::new();
    let first = stage == 0;
    let last = stage == c.layout.pp - 1;
    if first {
        out.push(matrix("embedding".into(), v, h, Split::Rows, std));
        out[0].name = "embedding.word_embeddings.weight".into();
        let mut pos = matrix("embedding".into(), m.seq, h, Split::Replicated, std);
        pos.name = "embedding.position_embeddings.weight".into();
        out.push(pos);
    }
    let per = c.layers_per_stage();
    for l in stage * per..(stage + 1) * per {
        let p = format!("layers.{l}");
        norm_specs(c, &format!("{p}.input_norm"), &mut out);
        out.push(matrix(
            format!("{p}.attention.qkv"),
            3 * h,
            h,
            Split::Rows,
            std,
        ));
        out.push(matrix(
            format!("{p}.attention.proj"),
            h,
            h,
            Split::Cols,
            out_std,
        ));
        norm_specs(c, &format!("{p}.post_attention_norm"), &mut out);
        out.push(matrix(format!("{p}.mlp.fc1"), f, h, Split::Rows, std));
        out.push(matrix(format!("{p}.mlp.fc2"), h, f, Split::Cols, out_std));
    }
    if last {
        norm_specs(c, "final_norm", &mut out);
        if !m.tied {
            out.push(matrix("output_layer".into(), v, h, Split::Rows, std));
        } else if !first {
            let mut w = matrix("output_layer".into(), v, h, Split::Rows, std);
            w.name = "embedding.word_embeddings.weight".into();
            w.tied_copy = true;
            out.push(w);
        }
    }
    out
}

/// The shard of `p` that TP rank `r` of `tp` holds. `load` is the rows the rank actually
/// loads, which differ from the nominal shard under `tp-column-shard-offset`.
pub fn shard(p: &ParamSpec, r: usize, tp: usize, bug: Option<Bug>) -> (Shard, Shard) {
    let (rows, cols) = (p.rows(), p.cols());
    let nominal = match p.split {
        Split::Replicated => Shard {
            r0: 0,
            r1: rows,
            c0: 0,
            c1: cols,
        },
        Split::Rows => Shard {
            r0: r * rows / tp,
            r1: (r + 1) * rows / tp,
            c0: 0,
            c1: cols,
        },
        Split::Cols => Shard {
            r0: 0,
            r1: rows,
            c0: r * cols / tp,
            c1: (r + 1) * cols / tp,
        },
    };
    let mut load = nominal;
    if bug == Some(Bug::TpColumnShardOffset) && p.name == "layers.0.mlp.fc1.weight" && r > 0 {
        // The offset bug: half a shard too early.
        let half = (nominal.r1 - nominal.r0) / 2;
        load.r0 -= half;
        load.r1 -= half;
    }
    (nominal, load)
}

/// A DP bucket of the flat buffers.
#[derive(Debug, Clone)]
pub struct Bucket {
    /// First element.
    pub start: usize,
    /// End (padded to a multiple of the DP size).
    pub end: usize,
    /// Parameters in it (indices into the stage's specs).
    pub params: Vec<usize>,
}

impl Bucket {
    /// Elements of the DP rank `r`'s shard (ZeRO-1).
    pub fn shard(&self, r: usize, dp: usize) -> (usize, usize) {
        let n = (self.end - self.start) / dp;
        (self.start + r * n, self.start + (r + 1) * n)
    }
}

/// Offsets of each parameter in the flat buffers and the DP buckets.
#[derive(Debug, Clone)]
pub struct FlatLayout {
    /// Offset of each parameter (indexed like the specs).
    pub offset: Vec<usize>,
    /// Local element count of each parameter.
    pub numel: Vec<usize>,
    /// Buckets, in reduction order (the last parameters first).
    pub buckets: Vec<Bucket>,
    /// Total elements (with padding).
    pub total: usize,
}

impl FlatLayout {
    /// Lays out parameters of `numel` elements in reverse order, in buckets of at least
    /// `bucket_size` elements (a parameter never straddles two), each padded to a multiple of
    /// `dp`.
    pub fn new(numel: &[usize], bucket_size: usize, dp: usize) -> FlatLayout {
        let mut offset = vec![0; numel.len()];
        let mut buckets = Vec::new();
        let mut pos = 0;
        let mut cur = Bucket {
            start: 0,
            end: 0,
            params: Vec::new(),
        };
        for i in (0..numel.len()).rev() {
            offset[i] = pos;
            pos += numel[i];
            cur.params.push(i);
            if pos - cur.start >= bucket_size || i == 0 {
                pos = pos.div_ceil(dp) * dp;
                cur.end = pos;
                buckets.push(std::mem::replace(
                    &mut cur,
                    Bucket {
                        start: pos,
                        end: pos,
                        params: Vec::new(),
                    },
                ));
            }
        }
        FlatLayout {
            offset,
            numel: numel.to_vec(),
            buckets,
            total: pos,
        }
    }
}

/// The stage's parameters: specs, shards and layout.
#[derive(Debug, Clone)]
pub struct StageParams {
    /// Specs in registration order.
    pub specs: Vec<ParamSpec>,
    /// Nominal shard of each (what the rank believes it holds; the dump labels).
    pub shards: Vec<Shard>,
    /// Rows/columns each actually loads from the canonical tensor.
    pub loads: Vec<Shard>,
    /// Flat layout.
    pub flat: FlatLayout,
    index: HashMap<String, usize>,
}

impl StageParams {
    /// The parameters of `stage` as TP rank `tp_rank` holds them.
    pub fn new(c: &Config, stage: usize, tp_rank: usize) -> StageParams {
        let specs = stage_specs(c, stage);
        let tp = c.layout.tp;
        let (shards, loads): (Vec<Shard>, Vec<Shard>) =
            specs.iter().map(|p| shard(p, tp_rank, tp, c.bug)).unzip();
        let numel: Vec<usize> = shards.iter().map(Shard::numel).collect();
        let flat = FlatLayout::new(&numel, c.bucket_size, c.layout.dp);
        // Lookup by module-qualified role: the module path plus the last name component
        // (`weight`/`bias`), so that a tied copy is found as `output_layer.weight`.
        let index = specs
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let leaf = p.name.rsplit('.').next().unwrap_or("weight");
                (format!("{}.{leaf}", p.module), i)
            })
            .chain(specs.iter().enumerate().map(|(i, p)| (p.name.clone(), i)))
            .collect();
        StageParams {
            specs,
            shards,
            loads,
            flat,
            index,
        }
    }

    /// Index of the parameter `module.leaf` (e.g. `layers.0.mlp.fc1.weight`) or canonical name.
    pub fn find(&self, key: &str) -> Option<usize> {
        self.index.get(key).copied()
    }

    /// Index of `key`, which must exist.
    pub fn get(&self, key: &str) -> Result<usize> {
        self.find(key)
            .ok_or_else(|| anyhow::anyhow!("no parameter `{key}` on this stage"))
    }

    /// The (offset, numel) of parameter `i`.
    pub fn range(&self, i: usize) -> (usize, usize) {
        (self.flat.offset[i], self.flat.numel[i])
    }
}

/// The module `zero1-skip-shard` leaves stale: the first parameter (lowest offset) overlapping
/// the last DP rank's shard of bucket 0 on the last stage.
pub fn zero1_skip_module(c: &Config) -> String {
    let sp = StageParams::new(c, c.layout.pp - 1, 0);
    let b = &sp.flat.buckets[0];
    let (lo, hi) = b.shard(c.layout.dp - 1, c.layout.dp);
    b.params
        .iter()
        .filter(|&&i| {
            let (o, n) = sp.range(i);
            o < hi && o + n > lo
        })
        .min_by_key(|&&i| sp.range(i).0.max(lo))
        .map_or_else(|| "none".into(), |&i| sp.specs[i].module.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_parameter_once_in_reverse_order() {
        let numel = [10, 7, 3, 20, 5];
        let l = FlatLayout::new(&numel, 12, 4);
        let mut seen: Vec<usize> = l.buckets.iter().flat_map(|b| b.params.clone()).collect();
        assert_eq!(seen, vec![4, 3, 2, 1, 0]);
        seen.sort();
        for b in &l.buckets {
            assert_eq!((b.end - b.start) % 4, 0);
            for &i in &b.params {
                assert!(l.offset[i] >= b.start && l.offset[i] + numel[i] <= b.end);
            }
        }
        assert_eq!(l.total, l.buckets.last().map_or(0, |b| b.end));
    }
}
