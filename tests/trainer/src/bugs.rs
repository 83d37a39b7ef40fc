//! The catalogue of injectable silent bugs.
//!
//! Each bug is modelled on a real one (a variant names the upstream issue where there is one,
//! e.g. Megatron-LM #1446): one code site, one module, one pass, from one step on; it never
//! crashes and keeps the loss plausible. A bug acts only in the layouts where its code path runs ([`Bug::active`]); the
//! world-size-1 reference never carries one. [`Bug::location`] says where it lives in NVTX
//! terms, so that a localisation test can check a tool's verdict against it.

use crate::cli::{Config, Precision};

/// An injectable bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// A row-parallel output (attention projection of one layer) is not all-reduced (or
    /// reduce-scattered under SP): each TP rank continues with its partial sum.
    TpRowParallelNoReduce,
    /// The same row-parallel reduction done with `ncclAvg` instead of `ncclSum`: the partial
    /// sums are averaged (the output is the TP size times too small).
    TpRowParallelAvg,
    /// Under SP, the final norm's weight grads are not all-reduced across TP (Megatron #1446).
    SpNormGradUnreduced,
    /// A norm weight grad is multiplied by the TP size in the backward (Megatron #1528).
    NormGradScaledByTp,
    /// DP gradients are summed instead of averaged.
    DpGradSum,
    /// The optimizer's view of the DP grad buffer swaps two equally sized parameters.
    BucketOffsetSwap,
    /// A column-parallel weight shard (fc1 of layer 0) is sliced at the wrong row offset.
    TpColumnShardOffset,
    /// The attention softmax scale uses the TP-local projection size per head.
    AttentionSoftmaxScaleLocal,
    /// A pipeline stage sends the previous micro-batch's activation.
    PpStaleActivation,
    /// The loss gradient is not divided by the number of micro-batches.
    LossNotDividedByMicrobatches,
    /// Tied-embedding grads are not all-reduced between the first and last stage (Megatron #844).
    TiedEmbeddingGradUnreduced,
    /// The tied-embedding all-reduce runs after the ZeRO-1 reduce-scatter (Megatron #844).
    TiedEmbeddingReduceAfterZeroRs,
    /// FP8 amaxes are not reduced across the TP group.
    Fp8AmaxUnreduced,
    /// ZeRO-1: the last DP rank's optimizer skips its shard of one bucket (Megatron #565).
    Zero1SkipShard,
    /// A weight-gradient GEMM overwrites instead of accumulating over micro-batches.
    GradAccumOverwrite,
    /// Every DP rank reads the first DP slice of each micro-batch.
    DpDataSliceOverlap,
}

/// Pass in which a bug lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// Forward of a micro-batch.
    Forward,
    /// Backward of a micro-batch.
    Backward,
    /// Gradient finalisation and optimizer step.
    Optimizer,
}

impl Pass {
    /// Lower-case name, as in the NVTX outer ranges.
    pub fn name(self) -> &'static str {
        match self {
            Pass::Forward => "forward",
            Pass::Backward => "backward",
            Pass::Optimizer => "optimizer",
        }
    }
}

/// Where a bug lives, for a given configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// Module path exactly as pushed to NVTX (an inner range).
    pub module: String,
    /// Pass (the outer NVTX range's prefix).
    pub pass: Pass,
    /// First step at which the bug acts.
    pub step: usize,
    /// First micro-batch (forward/backward bugs).
    pub micro_batch: Option<usize>,
    /// What goes wrong there.
    pub detail: String,
}

impl Bug {
    /// Every bug, in catalogue order.
    pub const ALL: [Bug; 16] = [
        Bug::TpRowParallelNoReduce,
        Bug::TpRowParallelAvg,
        Bug::SpNormGradUnreduced,
        Bug::NormGradScaledByTp,
        Bug::DpGradSum,
        Bug::BucketOffsetSwap,
        Bug::TpColumnShardOffset,
        Bug::AttentionSoftmaxScaleLocal,
        Bug::PpStaleActivation,
        Bug::LossNotDividedByMicrobatches,
        Bug::TiedEmbeddingGradUnreduced,
        Bug::TiedEmbeddingReduceAfterZeroRs,
        Bug::Fp8AmaxUnreduced,
        Bug::Zero1SkipShard,
        Bug::GradAccumOverwrite,
        Bug::DpDataSliceOverlap,
    ];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Bug::TpRowParallelNoReduce => "tp-row-parallel-no-reduce",
            Bug::TpRowParallelAvg => "tp-row-parallel-avg",
            Bug::SpNormGradUnreduced => "sp-norm-grad-unreduced",
            Bug::NormGradScaledByTp => "norm-grad-scaled-by-tp",
            Bug::DpGradSum => "dp-grad-sum",
            Bug::BucketOffsetSwap => "bucket-offset-swap",
            Bug::TpColumnShardOffset => "tp-column-shard-offset",
            Bug::AttentionSoftmaxScaleLocal => "attention-softmax-scale-local",
            Bug::PpStaleActivation => "pp-stale-activation",
            Bug::LossNotDividedByMicrobatches => "loss-not-divided-by-microbatches",
            Bug::TiedEmbeddingGradUnreduced => "tied-embedding-grad-unreduced",
            Bug::TiedEmbeddingReduceAfterZeroRs => "tied-embedding-reduce-after-zero-rs",
            Bug::Fp8AmaxUnreduced => "fp8-amax-unreduced",
            Bug::Zero1SkipShard => "zero1-skip-shard",
            Bug::GradAccumOverwrite => "grad-accum-overwrite",
            Bug::DpDataSliceOverlap => "dp-data-slice-overlap",
        }
    }

    /// The bug named `name`.
    pub fn from_name(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|b| b.name() == name)
    }

    /// One-line description, with the real bug it is modelled on.
    pub fn summary(self) -> &'static str {
        match self {
            Bug::TpRowParallelNoReduce => {
                "the attention projection (row-parallel) of one layer skips its TP all-reduce \
                 (reduce-scatter under SP): each rank keeps its partial sum"
            }
            Bug::TpRowParallelAvg => {
                "the attention projection (row-parallel) of one layer all-reduces \
                 (reduce-scatters under SP) with ncclAvg instead of ncclSum"
            }
            Bug::SpNormGradUnreduced => {
                "under SP the final norm's weight/bias grads are not all-reduced across TP, so \
                 the TP replicas drift apart (Megatron-LM #1446)"
            }
            Bug::NormGradScaledByTp => {
                "one input norm's weight grad comes out TP-size times too large (Megatron-LM \
                 #1528)"
            }
            Bug::DpGradSum => "the DP gradient all-reduce sums instead of averaging",
            Bug::BucketOffsetSwap => {
                "the optimizer's index into the DP grad buffer swaps two equally sized \
                 parameters (layer 0's two norm weights)"
            }
            Bug::TpColumnShardOffset => {
                "TP ranks > 0 slice layer 0's fc1 weight (column-parallel) half a shard too \
                 early"
            }
            Bug::AttentionSoftmaxScaleLocal => {
                "the last layer's softmax scale is 1/sqrt(local projection size / heads) \
                 instead of 1/sqrt(head dim)"
            }
            Bug::PpStaleActivation => {
                "the first pipeline stage sends the previous micro-batch's activation from \
                 micro-batch 1 on"
            }
            Bug::LossNotDividedByMicrobatches => {
                "the loss gradient is not divided by the number of micro-batches (the reported \
                 loss is)"
            }
            Bug::TiedEmbeddingGradUnreduced => {
                "tied word-embedding grads are not all-reduced between the first and last \
                 pipeline stage (Megatron-LM #844-like)"
            }
            Bug::TiedEmbeddingReduceAfterZeroRs => {
                "the tied-embedding all-reduce runs after the ZeRO-1 reduce-scatter, adding \
                 partitions that do not line up (Megatron-LM #844)"
            }
            Bug::Fp8AmaxUnreduced => {
                "FP8 amaxes are not reduced across TP, so sequence-parallel shards are quantised \
                 with different scales and all-gathered as if they shared one"
            }
            Bug::Zero1SkipShard => {
                "ZeRO-1: the last DP rank's optimizer skips its shard of the first gradient \
                 bucket, whose parameters never update (Megatron-LM #565-like)"
            }
            Bug::GradAccumOverwrite => {
                "the last layer's fc2 weight-gradient GEMM overwrites (beta=0) instead of \
                 accumulating over micro-batches"
            }
            Bug::DpDataSliceOverlap => {
                "every DP rank reads the first DP slice of each micro-batch instead of its own"
            }
        }
    }

    /// The layouts in which the bug can act, in words.
    pub fn requires(self) -> &'static str {
        match self {
            Bug::TpRowParallelNoReduce
            | Bug::TpRowParallelAvg
            | Bug::NormGradScaledByTp
            | Bug::TpColumnShardOffset
            | Bug::AttentionSoftmaxScaleLocal => "tp >= 2",
            Bug::SpNormGradUnreduced => "tp >= 2 with --sp",
            Bug::DpGradSum | Bug::BucketOffsetSwap | Bug::DpDataSliceOverlap => "dp >= 2",
            Bug::PpStaleActivation => "pp >= 2 and micro-batches >= 2",
            Bug::LossNotDividedByMicrobatches | Bug::GradAccumOverwrite => "micro-batches >= 2",
            Bug::TiedEmbeddingGradUnreduced => "pp >= 2 with --tie-embeddings",
            Bug::TiedEmbeddingReduceAfterZeroRs => {
                "pp >= 2, dp >= 2 with --zero1 and --tie-embeddings"
            }
            Bug::Fp8AmaxUnreduced => "--precision fp8, tp >= 2 with --sp",
            Bug::Zero1SkipShard => "dp >= 2 with --zero1",
        }
    }

    /// The layout requirements as (key, value) pairs for JSON: minimum sizes and flags.
    pub fn requirements(self) -> Vec<(&'static str, String)> {
        let mut r: Vec<(&'static str, String)> = Vec::new();
        let text = self.requires();
        for (key, pat) in [
            ("tp_min", "tp >= 2"),
            ("dp_min", "dp >= 2"),
            ("pp_min", "pp >= 2"),
            ("micro_batches_min", "micro-batches >= 2"),
        ] {
            if text.contains(pat) {
                r.push((key, "2".into()));
            }
        }
        for (key, pat) in [
            ("sp", "--sp"),
            ("zero1", "--zero1"),
            ("tie_embeddings", "--tie-embeddings"),
        ] {
            if text.contains(pat) {
                r.push((key, "true".into()));
            }
        }
        if text.contains("fp8") {
            r.push(("precision", "\"fp8\"".into()));
        }
        r
    }

    /// Whether the bug acts in this configuration.
    pub fn active(self, c: &Config) -> bool {
        let l = &c.layout;
        match self {
            Bug::TpRowParallelNoReduce
            | Bug::TpRowParallelAvg
            | Bug::NormGradScaledByTp
            | Bug::TpColumnShardOffset
            | Bug::AttentionSoftmaxScaleLocal => l.tp >= 2,
            Bug::SpNormGradUnreduced => l.tp >= 2 && l.sp,
            Bug::DpGradSum | Bug::BucketOffsetSwap | Bug::DpDataSliceOverlap => l.dp >= 2,
            Bug::PpStaleActivation => l.pp >= 2 && c.micro_batches >= 2,
            Bug::LossNotDividedByMicrobatches | Bug::GradAccumOverwrite => c.micro_batches >= 2,
            Bug::TiedEmbeddingGradUnreduced => l.pp >= 2 && c.model.tied,
            Bug::TiedEmbeddingReduceAfterZeroRs => {
                l.pp >= 2 && l.dp >= 2 && l.zero1 && c.model.tied
            }
            Bug::Fp8AmaxUnreduced => c.precision == Precision::Fp8 && l.tp >= 2 && l.sp,
            Bug::Zero1SkipShard => l.dp >= 2 && l.zero1,
        }
    }

    /// The global layer index a layer-specific bug acts in.
    pub fn layer(self, c: &Config) -> usize {
        let last = c.model.layers - 1;
        match self {
            Bug::TpRowParallelNoReduce | Bug::TpRowParallelAvg => 1.min(last),
            Bug::NormGradScaledByTp | Bug::AttentionSoftmaxScaleLocal | Bug::GradAccumOverwrite => {
                last
            }
            _ => 0,
        }
    }

    /// Where the bug lives in this configuration (NVTX module path, pass, first step and
    /// micro-batch).
    pub fn location(self, c: &Config) -> Location {
        let l = self.layer(c);
        let (module, pass, step, mb, detail): (String, Pass, usize, Option<usize>, String) =
            match self {
                Bug::TpRowParallelNoReduce => (
                    format!("layers.{l}.attention.proj"),
                    Pass::Forward,
                    0,
                    Some(0),
                    "the row-parallel GEMM's partial output is used without the TP reduction"
                        .into(),
                ),
                Bug::TpRowParallelAvg => (
                    format!("layers.{l}.attention.proj"),
                    Pass::Forward,
                    0,
                    Some(0),
                    "the row-parallel GEMM's partial outputs are averaged over TP, not summed"
                        .into(),
                ),
                Bug::SpNormGradUnreduced => (
                    "final_norm".into(),
                    Pass::Optimizer,
                    0,
                    None,
                    "final_norm's grads skip the sequence-parallel all-reduce over TP".into(),
                ),
                Bug::NormGradScaledByTp => (
                    format!("layers.{l}.input_norm"),
                    Pass::Backward,
                    0,
                    Some(0),
                    "the norm's weight grad is multiplied by the TP size".into(),
                ),
                Bug::DpGradSum => (
                    "ddp.bucket0".into(),
                    Pass::Optimizer,
                    0,
                    None,
                    "the DP all-reduce of every bucket uses ncclSum instead of ncclAvg".into(),
                ),
                Bug::BucketOffsetSwap => (
                    "layers.0.input_norm".into(),
                    Pass::Optimizer,
                    0,
                    None,
                    "Adam reads layers.0.input_norm.weight's grad from \
                     layers.0.post_attention_norm.weight's slot and vice versa"
                        .into(),
                ),
                Bug::TpColumnShardOffset => (
                    "layers.0.mlp.fc1".into(),
                    Pass::Forward,
                    0,
                    Some(0),
                    "TP ranks > 0 hold rows shifted by half a shard of the canonical fc1 weight"
                        .into(),
                ),
                Bug::AttentionSoftmaxScaleLocal => (
                    format!("layers.{l}.attention.core"),
                    Pass::Forward,
                    0,
                    Some(0),
                    format!(
                        "softmax scale 1/sqrt(head_dim / tp) = 1/sqrt({}) instead of 1/sqrt({})",
                        c.model.head_dim() / c.layout.tp.max(1),
                        c.model.head_dim()
                    ),
                ),
                Bug::PpStaleActivation => (
                    // Stage 1's first layer (for pp = 1, where the bug cannot act, as if pp = 2).
                    format!("layers.{}.input_norm", c.model.layers / c.layout.pp.max(2)),
                    Pass::Forward,
                    0,
                    Some(1),
                    "stage 1 receives micro-batch 0's activation again for micro-batch 1 (and \
                     k-1's for k); the wrong tensor enters its first module"
                        .into(),
                ),
                Bug::LossNotDividedByMicrobatches => (
                    "loss".into(),
                    Pass::Backward,
                    0,
                    Some(0),
                    format!(
                        "the logits' gradient is {} times too large",
                        c.micro_batches
                    ),
                ),
                Bug::TiedEmbeddingGradUnreduced => (
                    "embedding".into(),
                    Pass::Optimizer,
                    0,
                    None,
                    "the word-embedding grads of the first and last stage are not summed".into(),
                ),
                Bug::TiedEmbeddingReduceAfterZeroRs => (
                    "embedding".into(),
                    Pass::Optimizer,
                    0,
                    None,
                    "the embedding all-reduce adds DP-reduced shards to unreduced partitions"
                        .into(),
                ),
                Bug::Fp8AmaxUnreduced => (
                    "layers.0.attention.qkv".into(),
                    Pass::Forward,
                    0,
                    Some(0),
                    "each TP rank scales its sequence shard with its own amax; the FP8 \
                     all-gather then mixes scales"
                        .into(),
                ),
                Bug::Zero1SkipShard => (
                    crate::params::zero1_skip_module(c),
                    Pass::Optimizer,
                    0,
                    None,
                    "the last DP rank does not update its shard of gradient bucket 0 (the \
                     module named holds the shard's first parameter)"
                        .into(),
                ),
                Bug::GradAccumOverwrite => (
                    format!("layers.{l}.mlp.fc2"),
                    Pass::Backward,
                    0,
                    Some(1),
                    "the weight-gradient GEMM of micro-batch >= 1 uses beta = 0".into(),
                ),
                Bug::DpDataSliceOverlap => (
                    "embedding".into(),
                    Pass::Forward,
                    0,
                    Some(0),
                    "DP ranks > 0 look up the tokens of DP rank 0".into(),
                ),
            };
        Location {
            module,
            pass,
            step,
            micro_batch: mb,
            detail,
        }
    }
}

/// Escapes a string for JSON.
pub fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// `--list-bugs` output.
pub fn list(json: bool) -> String {
    if json {
        let items: Vec<String> = Bug::ALL
            .iter()
            .map(|b| {
                let req: Vec<String> = b
                    .requirements()
                    .iter()
                    .map(|(k, v)| format!("{}: {v}", json_str(k)))
                    .collect();
                format!(
                    "  {{\"name\": {}, \"summary\": {}, \"active_in\": {}, \"requires\": {{{}}}}}",
                    json_str(b.name()),
                    json_str(b.summary()),
                    json_str(b.requires()),
                    req.join(", ")
                )
            })
            .collect();
        format!("[\n{}\n]\n", items.join(",\n"))
    } else {
        let mut o = String::new();
        for b in Bug::ALL {
            o.push_str(&format!(
                "{}\n    {}\n    active in: {}\n",
                b.name(),
                b.summary(),
                b.requires()
            ));
        }
        o
    }
}

/// `--explain-bug` output for a configuration.
pub fn explain(b: Bug, c: &Config, json: bool) -> String {
    let loc = b.location(c);
    let active = b.active(c);
    if json {
        format!(
            "{{\"name\": {}, \"module\": {}, \"pass\": {}, \"step\": {}, \"micro_batch\": {}, \
             \"active\": {active}, \"active_in\": {}, \"detail\": {}}}\n",
            json_str(b.name()),
            json_str(&loc.module),
            json_str(loc.pass.name()),
            loc.step,
            loc.micro_batch
                .map_or_else(|| "null".to_string(), |m| m.to_string()),
            json_str(b.requires()),
            json_str(&loc.detail)
        )
    } else {
        let mb = loc
            .micro_batch
            .map_or_else(String::new, |m| format!(", micro-batch {m}"));
        format!(
            "{}: {}\n  module: {}\n  pass:   {}\n  from:   step {}{mb}\n  what:   {}\n  active in: {}{}\n",
            b.name(),
            b.summary(),
            loc.module,
            loc.pass.name(),
            loc.step,
            loc.detail,
            b.requires(),
            if active {
                ""
            } else {
                " (not in this layout)"
            }
        )
    }
}
