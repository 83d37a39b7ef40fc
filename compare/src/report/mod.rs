//! What `ttrace compare` found, as data: the text, JSON and HTML reports are views of a
//! [`CompareReport`]. JSON is `serde_json` of this type (stable field names: CI parses it).

pub mod html;
mod tensors;
pub mod text;

use serde::{Deserialize, Serialize};

// Domain types the report shows, owned by their modules.
pub use crate::combine::Merge;
pub use crate::layout::LayoutSummary;
pub(crate) use tensors::Listed;
pub use tensors::TensorList;

/// Floats that may be NaN or infinite (an error against a non-finite tensor) are written as
/// JSON numbers when finite and as the strings `"NaN"`, `"inf"`, `"-inf"` otherwise: JSON has
/// no non-finite numbers, and `null` would not read back as a float.
pub mod float {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `v`.
    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else if v.is_nan() {
            s.serialize_str("NaN")
        } else if *v > 0.0 {
            s.serialize_str("inf")
        } else {
            s.serialize_str("-inf")
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Num(f64),
        Text(String),
    }

    /// Reads a number or one of the three strings.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Num(v) => Ok(v),
            Repr::Text(t) => match t.as_str() {
                "NaN" => Ok(f64::NAN),
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                other => Err(serde::de::Error::custom(format!(
                    "expected a number, \"NaN\", \"inf\" or \"-inf\", got \"{other}\""
                ))),
            },
        }
    }
}

/// The outcome of comparing a run against a reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every compared tensor is within its tolerance.
    Match,
    /// At least one tensor is beyond its tolerance; see [`CompareReport::first_divergence`].
    Divergence,
}

/// One store taking part in the comparison.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The store's directory as given.
    pub path: String,
    /// The run id from the manifest.
    pub run_id: String,
    /// The traced command line.
    pub command: String,
    /// Number of ranks in the store.
    pub world_size: u32,
}

/// The error of one rank's shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankError {
    /// Global rank.
    pub rank: u32,
    /// The op's seq on that rank.
    pub seq: u64,
    /// Relative Frobenius error of the shard against its part of the reference, in epsilon.
    #[serde(with = "float")]
    pub error_eps: f64,
}

/// The worst slice (row) of a compared tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorstRow {
    /// Rank holding it.
    pub rank: u32,
    /// Row index in the reference's stored shape (leading dimensions flattened).
    pub row: u64,
    /// Relative error of that row, in epsilon.
    #[serde(with = "float")]
    pub error_eps: f64,
}

/// One reference tensor compared with its counterparts in the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorComparison {
    /// Position along the reference's op sequence over all compared steps (x axis of the
    /// plot; equal for the tensors of one op).
    pub position: u64,
    /// Training step.
    pub step: u64,
    /// The reference op's seq in its step.
    pub ref_seq: u64,
    /// API of the op (`cublasGemmEx`, ...).
    pub api: String,
    /// Role of the tensor in the op (`A`, `B`, `D`, ...).
    pub role: String,
    /// NVTX path of the reference op (`forward.mb0/layers.1.mlp.fc1`), when named.
    pub nvtx: Option<String>,
    /// Reference's stored shape.
    pub shape: Vec<u64>,
    /// Element type (safetensors name).
    pub dtype: String,
    /// How the shards were merged.
    pub merge: Merge,
    /// Per rank: which op and how far its shard is off.
    pub ranks: Vec<RankError>,
    /// Relative Frobenius error over all shards, in epsilon.
    #[serde(with = "float")]
    pub error_eps: f64,
    /// Worst row over all shards.
    pub worst_row: Option<WorstRow>,
    /// ‖run‖ / ‖reference‖ (a ratio of exactly 2 or TP reads as a scaling bug).
    #[serde(with = "float")]
    pub norm_ratio: f64,
    /// The tolerance in epsilon.
    #[serde(with = "float")]
    pub tolerance_eps: f64,
    /// Where the tolerance came from (`analytic`, `perturbed`).
    pub tolerance_source: String,
    /// `error_eps > tolerance_eps` (or a worst row beyond its own bound).
    pub diverged: bool,
}

/// Whether the first divergence was made by its op or came in with its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The op's output is wrong given its own captured inputs, or its inputs are right and
    /// its output is not.
    Local,
    /// The tensor was already wrong when the op read it: the bug lies between the last good
    /// tensor and this op.
    Upstream,
}

/// The first tensor beyond tolerance, and what it means.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    /// Index into [`CompareReport::tensors`].
    pub tensor: usize,
    /// Local or upstream.
    pub cause: Cause,
    /// Why, in one or two sentences an engineer understands without docs.
    pub explanation: String,
    /// Index into [`CompareReport::tensors`] of the last tensor within tolerance before it.
    pub last_good: Option<usize>,
    /// Kernels launched (uncaptured) between the last good tensor and this op, on the
    /// diverging rank, when launches were logged.
    pub kernels_between: Vec<String>,
    /// Ranks whose shard diverged.
    pub ranks: Vec<u32>,
    /// Training step.
    pub step: u64,
    /// Micro-batch, when the NVTX path names one (`forward.mb1`) or the alignment knows it.
    pub micro_batch: Option<u32>,
    /// Pass: `forward`, `backward` or `optimizer`, when known.
    pub pass: Option<String>,
    /// The module (NVTX path below the pass), when named.
    pub module: Option<String>,
    /// The op by position: `rank 3 step 0 seq 17: cublasGemmEx m=64 n=128 k=64`.
    pub position: String,
}

/// Tensors that could not be judged for one reason (never counted as a divergence).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotComparable {
    /// Why: what the store lacks.
    pub reason: String,
    /// How many tensors.
    pub tensors: u64,
    /// The first such op, by position.
    pub first: String,
}

/// Totals for the run of `ttrace compare`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompareStats {
    /// Ops of the reference considered.
    pub reference_ops: u64,
    /// Reference GEMMs with at least one counterpart in the run.
    #[serde(default)]
    pub reference_gemms_aligned: u64,
    /// Ops of the run aligned with a reference op.
    pub aligned_ops: u64,
    /// Ops of the run with no counterpart in the reference (collectives are compared through
    /// the buffers they share with GEMMs).
    pub unaligned_ops: u64,
    /// Tensors compared.
    pub tensors_compared: u64,
    /// Stored bytes of the run's and reference's tensors read and compared.
    pub bytes_compared: u64,
    /// Wall time of the comparison.
    pub elapsed_s: f64,
}

/// Everything `ttrace compare` found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareReport {
    /// The trusted reference.
    pub reference: RunSummary,
    /// The run under test.
    pub run: RunSummary,
    /// The perturbed reference, when one gave tolerances.
    pub perturbed: Option<RunSummary>,
    /// The run's layout.
    pub layout: LayoutSummary,
    /// Working precision (`fp32`, `bf16`, `fp8`), from the GEMMs' types.
    pub precision: String,
    /// Epsilon of the working precision (BF16's for FP8 recipes).
    pub epsilon: f64,
    /// Steps compared.
    pub steps: Vec<u64>,
    /// Match or divergence.
    pub verdict: Verdict,
    /// The first tensor beyond tolerance in execution order.
    pub first_divergence: Option<Divergence>,
    /// Every compared tensor, in the reference's execution order (in memory, or spilled to
    /// a temporary file for a comparison of many: [`TensorList`]).
    pub tensors: TensorList,
    /// Indices into `tensors` of the worst ones (by error / tolerance), worst first.
    pub worst: Vec<usize>,
    /// Things the comparison could not use (unreadable records, ops with no counterpart).
    pub warnings: Vec<String>,
    /// Tensors the store does not hold enough of to judge (a partial capture), by reason.
    #[serde(default)]
    pub not_comparable: Vec<NotComparable>,
    /// Replicated tensors whose replicas stopped being bitwise identical (each copy may be
    /// within tolerance of the reference); any makes the verdict a divergence.
    #[serde(default)]
    pub replica_drift: Vec<crate::replicas::ReplicaDrift>,
    /// The scale data-parallel reductions' outputs were held to, and what decided it
    /// (`None`: no data-parallel group).
    #[serde(default)]
    pub dp_reduction: Option<crate::gradscale::Decision>,
    /// Steps whose perturbed reference shows round-off turned into a jump of a few elements
    /// (its largest per step), and the least tolerance that step's tensors were held to
    /// (docs/compare.md, section 4).
    #[serde(default)]
    pub roundoff_jumps: Vec<RoundoffJump>,
    /// Steps in which round-off alone moved some tensor by at least
    /// [`crate::tolerance::CHAOTIC`] of its size (the perturbed reference's largest relative
    /// error of the step, where it is that large): tolerances there are as wide, and a
    /// divergence there may be round-off one perturbed reference did not happen to show
    /// (docs/compare.md, section 4).
    #[serde(default)]
    pub chaotic_steps: Vec<ChaoticStep>,
    /// What the stores' captures lost in the compared steps (gaps, snapshots never
    /// published, unreadable records), per store that lost anything: a match of an
    /// incomplete capture exits [`crate::losses::EXIT_INCOMPLETE`], not 0.
    #[serde(default)]
    pub capture_losses: Vec<crate::losses::CaptureLosses>,
    /// Totals.
    pub stats: CompareStats,
}

/// The largest round-off jump of a step: a tensor whose perturbed reference differs from the
/// reference in a handful of elements (`tolerance::PerturbedError::is_jump`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundoffJump {
    pub step: u64,
    /// The reference tensor: its NVTX path (or API and seq) and role.
    pub tensor: String,
    /// The perturbed reference's error on it, in epsilon.
    pub error_eps: f64,
    /// The share of that difference in its 10 largest elements.
    pub top_share: f64,
    /// The tensor's elements.
    pub elements: u64,
    /// The least tolerance every tensor of the step was held to, in epsilon.
    pub floor_eps: f64,
}

/// A step in which the training amplified round-off to a good fraction of a tensor: the
/// perturbed reference's largest relative error of the step ([`CompareReport::chaotic_steps`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChaoticStep {
    pub step: u64,
    /// The reference tensor: its NVTX path (or API and seq) and role.
    pub tensor: String,
    /// The perturbed reference's relative error on it (1: as large as the tensor).
    pub relative_error: f64,
}

impl CompareReport {
    /// Exit code of `ttrace compare`: 0 match, 1 divergence, 5 a match of a capture that
    /// lost data ([`crate::losses::EXIT_INCOMPLETE`]: never clean).
    pub fn exit_code(&self) -> i32 {
        match self.verdict {
            Verdict::Match if !self.capture_losses.is_empty() => crate::losses::EXIT_INCOMPLETE,
            Verdict::Match => 0,
            Verdict::Divergence => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_errors_survive_a_json_round_trip() {
        let r = RankError {
            rank: 1,
            seq: 2,
            error_eps: f64::NAN,
        };
        let text = serde_json::to_string(&r).expect("serialize");
        assert!(text.contains("\"NaN\""), "{text}");
        let back: RankError = serde_json::from_str(&text).expect("deserialize");
        assert!(back.error_eps.is_nan());
        let w = WorstRow {
            rank: 0,
            row: 3,
            error_eps: f64::INFINITY,
        };
        let back: WorstRow =
            serde_json::from_str(&serde_json::to_string(&w).expect("serialize")).expect("back");
        assert_eq!(back.error_eps, f64::INFINITY);
        let bad = serde_json::from_str::<RankError>(r#"{"rank":1,"seq":2,"error_eps":"lots"}"#);
        assert!(bad.unwrap_err().to_string().contains("lots"));
    }
}
