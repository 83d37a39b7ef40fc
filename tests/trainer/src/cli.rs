//! Command line and the validated run configuration.
//!
//! Everything a run depends on is here: model sizes, the parallel layout, precision, GEMM path,
//! optimizer hyperparameters, the injected bug. [`Args::config`] checks the layout against the
//! sizes and the world size and returns a [`Config`]; every violation is a [`UsageError`] (exit
//! code 2).

use std::fmt;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::bugs::Bug;

const LONG_ABOUT: &str = "\
A small GPT trained the way Megatron-LM trains it, on the CUDA ABI (cuda-dyn: cudart, cuBLAS,
cuBLASLt, NCCL, NVTX resolved at run time), for testing ttrace. Run it alone for the world-size-1
reference, or under simrun/torchrun for tensor (--tp, with --sp), data (--dp, with --zero1) and
pipeline (--pp) parallelism; world size = tp x dp x pp, from RANK/WORLD_SIZE/LOCAL_RANK.

The model: token and learned position embeddings (vocab-parallel), --layers pre-norm blocks
(LayerNorm or RMSNorm, causal multi-head attention, GELU MLP; no biases in linears), a final
norm, an LM head (untied, or tied to the embedding with --tie-embeddings), cross-entropy over all
tokens of the global batch. Weights come from --seed in canonical (unsharded) form and are
sliced per rank, so every layout computes the same function as the reference up to round-off.

Data: a seeded token stream. A step is --micro-batches micro-batches of --micro-batch-size
sequences (global, for any --dp; each DP rank takes its contiguous slice).

Output: one line per step, `step <n> loss <value>` (the global-batch mean loss, printed by the
first rank (tp=0, dp=0) of the last pipeline stage after the DP all-reduce). --dump DIR writes
the losses and the final fp32 master weights as shards of canonical tensors (the format is in
DIR/README).

An option given twice takes its last value.

Silent bugs: --list-bugs shows the catalogue, --explain-bug NAME where one lives, --bug NAME
injects it. A bug refused in a layout where it cannot act is a usage error.";

const AFTER_HELP: &str = "\
Examples:
  trainer --steps 3                                       # world-1 reference, fp32
  simrun --nproc-per-node 8 -- trainer --tp 2 --dp 2 --pp 2 --sp --zero1 --precision bf16
  simrun --nproc-per-node 4 -- trainer --tp 2 --pp 2 --tie-embeddings --bug tied-embedding-grad-unreduced
  trainer --list-bugs --json
  trainer --explain-bug pp-stale-activation --pp 2 --json";

/// Numeric precision of parameters, activations and GEMMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Precision {
    /// Everything in fp32 (FP32 compute, no TF32).
    Fp32,
    /// bf16 parameters and activations; fp32 main grads, master weights and Adam.
    Bf16,
    /// As bf16, and the linears of the blocks in FP8 (E4M3 forward, E5M2 grads) on cuBLASLt
    /// with per-tensor delayed scaling.
    Fp8,
}

impl Precision {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp8 => "fp8",
        }
    }
}

/// Which library runs the GEMMs (FP8 GEMMs always run on cuBLASLt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GemmPath {
    /// `cublasGemmEx` and `cublasGemmStridedBatchedEx`.
    Cublas,
    /// `cublasLtMatmul` (strided batches through layout attributes).
    Lt,
}

/// Normalization layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NormKind {
    /// LayerNorm with weight and bias.
    Layernorm,
    /// RMSNorm with weight only.
    Rmsnorm,
}

/// A parallel dimension, for `--order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    /// Tensor parallel.
    Tp,
    /// Data parallel.
    Dp,
    /// Pipeline parallel.
    Pp,
}

/// The order in which global ranks enumerate the parallel dimensions, fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Order(pub [Dim; 3]);

impl Order {
    /// Parses `tp-dp-pp` (any permutation of the three names).
    pub fn parse(s: &str) -> Result<Order, String> {
        let dims: Vec<Dim> = s
            .split('-')
            .map(|p| match p {
                "tp" => Ok(Dim::Tp),
                "dp" => Ok(Dim::Dp),
                "pp" => Ok(Dim::Pp),
                _ => Err(format!("unknown dimension `{p}` in --order `{s}`")),
            })
            .collect::<Result<_, _>>()?;
        match dims.as_slice() {
            [a, b, c] if a != b && b != c && a != c => Ok(Order([*a, *b, *c])),
            _ => Err(format!(
                "--order `{s}` must name tp, dp and pp once each, fastest first (e.g. tp-dp-pp)"
            )),
        }
    }
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = |d: Dim| match d {
            Dim::Tp => "tp",
            Dim::Dp => "dp",
            Dim::Pp => "pp",
        };
        write!(f, "{}-{}-{}", n(self.0[0]), n(self.0[1]), n(self.0[2]))
    }
}

/// `trainer` command line.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "trainer",
    version,
    about = "A Megatron-style GPT fixture on the CUDA ABI, with injectable silent bugs.",
    long_about = LONG_ABOUT,
    after_help = AFTER_HELP,
    args_override_self = true
)]
pub struct Args {
    /// Vocabulary size.
    #[arg(long, default_value_t = 128)]
    pub vocab: usize,
    /// Hidden size.
    #[arg(long, default_value_t = 64)]
    pub hidden: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Transformer layers.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Sequence length.
    #[arg(long, default_value_t = 16)]
    pub seq: usize,
    /// MLP hidden size.
    #[arg(long, default_value_t = 128)]
    pub ffn: usize,
    /// Normalization layer.
    #[arg(long, value_enum, default_value_t = NormKind::Layernorm)]
    pub norm: NormKind,
    /// Tie the LM head to the word embedding.
    #[arg(long)]
    pub tie_embeddings: bool,

    /// Training steps (0: only initialise, e.g. to --dump the initial weights).
    #[arg(long, default_value_t = 2)]
    pub steps: usize,
    /// Micro-batches per step (gradient accumulation).
    #[arg(long, default_value_t = 2)]
    pub micro_batches: usize,
    /// Sequences per micro-batch, over all DP ranks.
    #[arg(long, default_value_t = 4)]
    pub micro_batch_size: usize,
    /// Prompt positions at the start of every sequence: inputs without loss (label -1).
    #[arg(long, default_value_t = 0)]
    pub prompt_len: usize,
    /// Seed of the weights and of the token stream.
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,

    /// Tensor-parallel size.
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// Data-parallel size.
    #[arg(long, default_value_t = 1)]
    pub dp: usize,
    /// Pipeline-parallel size.
    #[arg(long, default_value_t = 1)]
    pub pp: usize,
    /// Sequence parallelism in the norm regions (needs --tp > 1).
    #[arg(long)]
    pub sp: bool,
    /// ZeRO-1: reduce-scatter gradients, shard master weights and Adam state over DP.
    #[arg(long)]
    pub zero1: bool,
    /// Rank order, fastest-varying dimension first (Megatron's default is tp-dp-pp).
    #[arg(long, default_value = "tp-dp-pp", value_parser = Order::parse)]
    pub order: Order,

    /// Precision recipe.
    #[arg(long, value_enum, default_value_t = Precision::Fp32)]
    pub precision: Precision,
    /// GEMM library for the non-FP8 GEMMs.
    #[arg(long, value_enum, default_value_t = GemmPath::Cublas)]
    pub gemm: GemmPath,
    /// FP8 amax history length (delayed scaling).
    #[arg(long, default_value_t = 4)]
    pub amax_history: usize,

    /// Adam learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f32,
    /// Adam beta1.
    #[arg(long, default_value_t = 0.9)]
    pub adam_beta1: f32,
    /// Adam beta2.
    #[arg(long, default_value_t = 0.95)]
    pub adam_beta2: f32,
    /// Adam epsilon. Large on purpose: with a tiny epsilon Adam's first steps are sign descent,
    /// which is blind to a gradient's scale (hiding scaling bugs) and flips whole updates on
    /// round-off-sized changes of near-zero gradients; 1e-3 (about the median gradient of the
    /// default model) keeps the update a smooth function of the gradient.
    #[arg(long, default_value_t = 1e-3)]
    pub adam_eps: f32,
    /// Decoupled weight decay (AdamW) on matrices (not on norms).
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f32,
    /// DP gradient bucket size, in elements.
    #[arg(long, default_value_t = 16384)]
    pub bucket_size: usize,

    /// Inject a silent bug from the catalogue (--list-bugs).
    #[arg(long, value_name = "NAME")]
    pub bug: Option<String>,
    /// Test fixture, not a catalogue bug: from step STEP (default 0) on, global rank 0 writes
    /// +Inf into element 0 of the input of `layers.LAYER.mlp.fc1` (forward, every
    /// micro-batch), by an elementwise kernel just before that GEMM. The layer must live on
    /// rank 0's pipeline stage.
    #[arg(long, value_name = "LAYER[:STEP]", value_parser = parse_inject_inf)]
    pub inject_inf: Option<(usize, usize)>,
    /// Do not push NVTX ranges.
    #[arg(long)]
    pub no_nvtx: bool,
    /// Capture each step's forward and backward passes (every micro-batch, every layer) into
    /// a CUDA graph once, and replay it at every step, as `torch.cuda.graph` /
    /// `make_graphed_callables` do. Data loading and the optimizer stay eager.
    #[arg(long)]
    pub cuda_graph: bool,
    /// Write the losses and the final master weights to DIR.
    #[arg(long, value_name = "DIR")]
    pub dump: Option<PathBuf>,

    /// Print the bug catalogue and exit.
    #[arg(long)]
    pub list_bugs: bool,
    /// Print where a bug lives (for the layout given by the other options) and exit.
    #[arg(long, value_name = "NAME")]
    pub explain_bug: Option<String>,
    /// Machine-readable output for --list-bugs and --explain-bug.
    #[arg(long)]
    pub json: bool,
}

/// Parses `--inject-inf LAYER[:STEP]`.
fn parse_inject_inf(s: &str) -> Result<(usize, usize), String> {
    let (layer, step) = s.split_once(':').unwrap_or((s, "0"));
    let num = |v: &str| {
        v.parse::<usize>()
            .map_err(|e| format!("`{v}` in `{s}`: {e} (expected LAYER[:STEP])"))
    };
    Ok((num(layer)?, num(step)?))
}

/// A usage error: reported with exit code 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Model sizes.
#[derive(Debug, Clone, Copy)]
pub struct ModelDims {
    /// Vocabulary size.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Layers.
    pub layers: usize,
    /// Sequence length.
    pub seq: usize,
    /// MLP hidden size.
    pub ffn: usize,
    /// Normalization.
    pub norm: NormKind,
    /// Tied embeddings.
    pub tied: bool,
}

impl ModelDims {
    /// Size of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

/// The parallel layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Tensor-parallel size.
    pub tp: usize,
    /// Data-parallel size.
    pub dp: usize,
    /// Pipeline-parallel size.
    pub pp: usize,
    /// Sequence parallelism.
    pub sp: bool,
    /// ZeRO-1.
    pub zero1: bool,
    /// Rank order.
    pub order: Order,
}

impl Layout {
    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.tp * self.dp * self.pp
    }
}

/// A validated run configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Model sizes.
    pub model: ModelDims,
    /// Parallel layout.
    pub layout: Layout,
    /// Steps.
    pub steps: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Global micro-batch size (sequences).
    pub micro_batch_size: usize,
    /// Prompt positions per sequence (no loss).
    pub prompt_len: usize,
    /// Seed.
    pub seed: u64,
    /// Precision recipe.
    pub precision: Precision,
    /// GEMM library.
    pub gemm: GemmPath,
    /// FP8 amax history length.
    pub amax_history: usize,
    /// Adam hyperparameters.
    pub adam: AdamConfig,
    /// DP bucket size in elements.
    pub bucket_size: usize,
    /// Injected bug.
    pub bug: Option<Bug>,
    /// `--inject-inf`: (layer, first step).
    pub inject_inf: Option<(usize, usize)>,
    /// Push NVTX ranges.
    pub nvtx: bool,
    /// `--cuda-graph`: replay the forward/backward passes from a CUDA graph.
    pub cuda_graph: bool,
    /// Dump directory.
    pub dump: Option<PathBuf>,
}

/// Adam hyperparameters.
#[derive(Debug, Clone, Copy)]
pub struct AdamConfig {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
}

impl Config {
    /// Sequences per micro-batch on one DP rank.
    pub fn local_batch(&self) -> usize {
        self.micro_batch_size / self.layout.dp
    }
    /// Tokens of one local micro-batch (sequence x local batch).
    pub fn tokens(&self) -> usize {
        self.model.seq * self.local_batch()
    }
    /// Layers per pipeline stage.
    pub fn layers_per_stage(&self) -> usize {
        self.model.layers / self.layout.pp
    }
}

fn need(ok: bool, msg: impl FnOnce() -> String) -> Result<(), UsageError> {
    if ok {
        Ok(())
    } else {
        Err(UsageError(msg()))
    }
}

impl Args {
    /// The model sizes and layout given on the command line, checked against each other (not
    /// against the world size: see [`Args::config`]).
    pub fn config(&self) -> Result<Config, UsageError> {
        let (tp, dp, pp) = (self.tp, self.dp, self.pp);
        for (name, v) in [
            ("--vocab", self.vocab),
            ("--hidden", self.hidden),
            ("--heads", self.heads),
            ("--layers", self.layers),
            ("--seq", self.seq),
            ("--ffn", self.ffn),
            ("--micro-batches", self.micro_batches),
            ("--micro-batch-size", self.micro_batch_size),
            ("--tp", tp),
            ("--dp", dp),
            ("--pp", pp),
            ("--amax-history", self.amax_history),
            ("--bucket-size", self.bucket_size),
        ] {
            need(v > 0, || format!("{name} must be at least 1"))?;
        }
        need(self.hidden.is_multiple_of(self.heads), || {
            format!(
                "--hidden {} is not divisible by --heads {}",
                self.hidden, self.heads
            )
        })?;
        need(self.heads.is_multiple_of(tp), || {
            format!(
                "--heads {} is not divisible by --tp {tp} (attention heads are split across TP)",
                self.heads
            )
        })?;
        need(self.ffn.is_multiple_of(tp), || {
            format!("--ffn {} is not divisible by --tp {tp}", self.ffn)
        })?;
        need(self.vocab.is_multiple_of(tp), || {
            format!(
                "--vocab {} is not divisible by --tp {tp} (vocab-parallel embedding)",
                self.vocab
            )
        })?;
        need(self.layers.is_multiple_of(pp), || {
            format!("--layers {} is not divisible by --pp {pp}", self.layers)
        })?;
        need(self.micro_batch_size.is_multiple_of(dp), || {
            format!(
                "--micro-batch-size {} is not divisible by --dp {dp}",
                self.micro_batch_size
            )
        })?;
        need(self.prompt_len < self.seq, || {
            format!(
                "--prompt-len {} leaves no labelled position in --seq {}",
                self.prompt_len, self.seq
            )
        })?;
        need(!self.sp || tp > 1, || {
            "--sp needs --tp > 1 (sequence parallelism shards across the TP group)".into()
        })?;
        need(!self.sp || self.seq.is_multiple_of(tp), || {
            format!(
                "--seq {} is not divisible by --tp {tp} (needed by --sp)",
                self.seq
            )
        })?;
        if self.precision == Precision::Fp8 {
            // cuBLASLt's FP8 kernels need 16-aligned dimensions.
            let tokens = self.seq * (self.micro_batch_size / dp);
            for (what, v) in [
                ("--hidden", self.hidden),
                ("--hidden/--tp", self.hidden / tp),
                ("--ffn/--tp", self.ffn / tp),
                (
                    "tokens per micro-batch (--seq x --micro-batch-size / --dp)",
                    tokens,
                ),
            ] {
                need(v.is_multiple_of(16), || {
                    format!("--precision fp8 needs {what} = {v} to be a multiple of 16")
                })?;
            }
        }
        let bug = match &self.bug {
            None => None,
            Some(name) => Some(
                Bug::from_name(name)
                    .ok_or_else(|| UsageError(format!("unknown bug `{name}`; see --list-bugs")))?,
            ),
        };
        let cfg = Config {
            model: ModelDims {
                vocab: self.vocab,
                hidden: self.hidden,
                heads: self.heads,
                layers: self.layers,
                seq: self.seq,
                ffn: self.ffn,
                norm: self.norm,
                tied: self.tie_embeddings,
            },
            layout: Layout {
                tp,
                dp,
                pp,
                sp: self.sp,
                zero1: self.zero1,
                order: self.order,
            },
            steps: self.steps,
            micro_batches: self.micro_batches,
            micro_batch_size: self.micro_batch_size,
            prompt_len: self.prompt_len,
            seed: self.seed,
            precision: self.precision,
            gemm: self.gemm,
            amax_history: self.amax_history,
            adam: AdamConfig {
                lr: self.lr,
                beta1: self.adam_beta1,
                beta2: self.adam_beta2,
                eps: self.adam_eps,
                weight_decay: self.weight_decay,
            },
            bucket_size: self.bucket_size,
            bug,
            inject_inf: self.inject_inf,
            nvtx: !self.no_nvtx,
            cuda_graph: self.cuda_graph,
            dump: self.dump.clone(),
        };
        if self.cuda_graph && self.inject_inf.is_some() {
            // The injection starts at a step; a graph replays the same work at every step.
            return Err(UsageError(
                "--inject-inf cannot be combined with --cuda-graph".into(),
            ));
        }
        if let Some((layer, _)) = self.inject_inf {
            need(layer < self.layers, || {
                format!("--inject-inf {layer}: the model has {} layers", self.layers)
            })?;
        }
        if let Some(b) = bug {
            need(b.active(&cfg), || {
                format!(
                    "bug `{}` cannot act in this layout: it needs {} (see --list-bugs)",
                    b.name(),
                    b.requires()
                )
            })?;
        }
        Ok(cfg)
    }
}
