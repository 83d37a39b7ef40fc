//! How large a difference round-off can explain, per tensor (docs/tolerance.md).
//!
//! Errors are measured in units of the working precision's machine epsilon (BF16's for FP8
//! recipes, as TTrace and Megatron-LM do). The analytic bound grows geometrically with the
//! depth of the op in the step (TTrace's Theorem 5.3 as Megatron-LM implements it:
//! `k · C^depth · ε`); a tensor stored in a narrower type than the working precision (FP8
//! operands) gets that type's epsilon instead. A perturbed reference (`ttrace run
//! --perturb`) measures, per tensor, how far one rounding-sized disturbance per GEMM output
//! moves it; the tolerance is the larger of the two.

use ttrace_format::dtype::DType;

use crate::trace::{gemm, RunTrace};

/// The working precision of a run, from its GEMMs' operand types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// FP32 operands.
    Fp32,
    /// FP16 operands.
    Fp16,
    /// BF16 operands.
    Bf16,
    /// FP8 operands (accumulated and stored in BF16/FP32).
    Fp8,
}

/// `cudaDataType_t` values of the operand types that decide the precision.
const CUDA_R_16F: u32 = 2;
const CUDA_R_16BF: u32 = 14;
const CUDA_R_8F_E4M3: u32 = 28;
const CUDA_R_8F_E5M2: u32 = 29;

impl Precision {
    /// The narrowest operand type over the reference's GEMMs in `steps`.
    pub fn of(reff: &RunTrace, rank: u32, steps: &[u64]) -> Precision {
        let mut p = Precision::Fp32;
        for &s in steps {
            for r in reff.records(rank, s) {
                if let Some(g) = gemm(r) {
                    for t in [g.a_type, g.b_type] {
                        let q = match t {
                            CUDA_R_8F_E4M3 | CUDA_R_8F_E5M2 => Precision::Fp8,
                            CUDA_R_16BF => Precision::Bf16,
                            CUDA_R_16F => Precision::Fp16,
                            _ => Precision::Fp32,
                        };
                        if q.rank() > p.rank() {
                            p = q;
                        }
                    }
                }
            }
        }
        p
    }

    /// Narrowness: fp32 < fp16 < bf16 < fp8.
    pub fn order(self) -> u8 {
        self.rank()
    }

    fn rank(self) -> u8 {
        match self {
            Precision::Fp32 => 0,
            Precision::Fp16 => 1,
            Precision::Bf16 => 2,
            Precision::Fp8 => 3,
        }
    }

    /// `fp32`, `fp16`, `bf16`, `fp8`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Fp8 => "fp8",
        }
    }

    /// Machine epsilon the errors are measured in (BF16's for FP8 recipes).
    pub fn epsilon(self) -> f64 {
        match self {
            Precision::Fp32 => epsilon(DType::F32),
            Precision::Fp16 => epsilon(DType::F16),
            Precision::Bf16 | Precision::Fp8 => epsilon(DType::BF16),
        }
    }
}

/// Machine epsilon of a float type (`2^(1-t)`, t significand bits).
pub fn epsilon(d: DType) -> f64 {
    2f64.powi(match d {
        DType::F64 => -52,
        DType::F32 => -23,
        DType::F16 => -10,
        DType::BF16 => -7,
        DType::F8_E4M3 => -3,
        DType::F8_E5M2 => -2,
        _ => 0,
    })
}

/// Unit roundoff (half of epsilon).
pub fn unit_roundoff(d: DType) -> f64 {
    epsilon(d) / 2.0
}

/// A tolerance in epsilon, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// In units of the working precision's epsilon.
    pub value: f64,
    /// `analytic` or `perturbed`.
    pub source: &'static str,
}

/// The analytic constant k (Megatron-LM uses 4; "2–8 are common").
pub const K: f64 = 4.0;
/// Growth per GEMM of depth.
pub const C_PER_GEMM: f64 = 1.01;
/// Depth is capped: beyond it the perturbed reference is the better estimate.
pub const MAX_GROWTH: f64 = 16.0;
/// Multiplier on the perturbed reference's error (two round-off terms and a margin).
pub const ALPHA: f64 = 4.0;

/// How much the analytic bound grows after `updates` optimizer steps: the run's and the
/// reference's weights each take one rounding per update, independently, so they drift
/// apart as a random walk, `sqrt(1 + updates)` times one step's difference. (Measured on
/// the fixture trainer, 300 bug-free FP32 steps: the largest error grows as about
/// `step^0.35`, inside this bound.) Used only without a perturbed reference, whose own drift
/// over the same steps measures the growth.
pub fn step_growth(updates: u64) -> f64 {
    (1.0 + updates as f64).sqrt()
}

/// The tolerance, in epsilon of `precision`, of a tensor of type `dtype` at `depth` (GEMMs
/// before its op in the step) after `updates` optimizer steps of drift (0 when a perturbed
/// reference measures it), given the perturbed reference's relative error on it.
pub fn tolerance(
    precision: Precision,
    dtype: DType,
    depth: u64,
    updates: u64,
    perturbed: Option<f64>,
) -> Tolerance {
    let eps = precision.epsilon();
    let growth = C_PER_GEMM.powf(depth as f64).min(MAX_GROWTH) * step_growth(updates);
    // A tensor stored narrower than the working precision (FP8) rounds at its own epsilon,
    // but only the elements whose inputs straddle a rounding boundary differ between two
    // runs, so the whole-tensor error is an eighth of that epsilon.
    let own = (epsilon(dtype) / eps / 8.0).max(1.0);
    let analytic = K * growth * own;
    match perturbed {
        Some(r) if ALPHA * r / eps > analytic => Tolerance {
            value: ALPHA * r / eps,
            source: "perturbed",
        },
        _ => Tolerance {
            value: analytic,
            source: "analytic",
        },
    }
}

/// Every term of a tensor's tolerance, with where each comes from.
#[derive(Debug, Clone, Copy)]
pub struct Terms {
    /// The working precision (errors are in its epsilon).
    pub precision: Precision,
    /// The tensor's stored type.
    pub dtype: DType,
    /// Reference GEMMs before the op in its step.
    pub depth: u64,
    /// Optimizer steps of drift to allow for ([`step_growth`]); 0 with a perturbed reference.
    pub updates: u64,
    /// The perturbed reference's relative error on the tensor, when there is one.
    pub perturbed: Option<f64>,
    /// For an increment `D - beta*C`: `‖beta*C‖ / ‖D - beta*C‖`, the digits it cancelled.
    pub cancelled: Option<f64>,
    /// For an op's output: the summed errors (in epsilon) of its inputs.
    pub input_error: Option<f64>,
}

impl Terms {
    /// The tolerance: the larger of the analytic and the perturbed estimates ([`tolerance`]);
    /// an increment adds `4 · u_D / ε · cancelled` (it loses the digits C and D share); an
    /// output adds twice its inputs' errors when that is at least a quarter of the rest
    /// (inputs within their tolerance carry that much difference into the product).
    pub fn tolerance(&self) -> Tolerance {
        let eps = self.precision.epsilon();
        let mut tol = tolerance(
            self.precision,
            self.dtype,
            self.depth,
            self.updates,
            self.perturbed,
        );
        if let Some(c) = self.cancelled {
            tol.value += 4.0 * unit_roundoff(self.dtype) / eps * c;
        }
        if let Some(e) = self.input_error {
            if 2.0 * e > 0.5 * tol.value {
                tol = Tolerance {
                    value: tol.value + 2.0 * e,
                    source: "analytic + inputs' errors",
                };
            }
        }
        tol
    }
}

/// The tolerance of a reduction compared through the GEMM output it reduces: twice that
/// output's (one more rounding, in the storage type, per summand).
pub fn reduced(gemm_output: Option<f64>) -> Tolerance {
    Tolerance {
        value: gemm_output.unwrap_or(2.0 * K) * 2.0,
        source: "analytic (reduced GEMM output)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epsilons_are_the_textbook_ones() {
        assert_eq!(epsilon(DType::BF16), 0.0078125);
        assert_eq!(epsilon(DType::F32), 1.1920928955078125e-7);
        assert_eq!(Precision::Fp8.epsilon(), epsilon(DType::BF16));
    }

    #[test]
    fn tolerance_grows_with_depth_and_is_capped() {
        let t0 = tolerance(Precision::Bf16, DType::BF16, 0, 0, None).value;
        let t50 = tolerance(Precision::Bf16, DType::BF16, 50, 0, None).value;
        let t5000 = tolerance(Precision::Bf16, DType::BF16, 5000, 0, None).value;
        assert_eq!(t0, K);
        assert!(t50 > t0 && t5000 == K * MAX_GROWTH);
    }

    #[test]
    fn a_sensitive_tensor_takes_the_perturbed_estimate() {
        let t = tolerance(Precision::Bf16, DType::BF16, 0, 0, Some(0.5));
        assert_eq!(t.source, "perturbed");
        assert!((t.value - ALPHA * 0.5 / 0.0078125).abs() < 1e-9);
        let t = tolerance(Precision::Bf16, DType::BF16, 0, 0, Some(1e-6));
        assert_eq!(t.source, "analytic");
    }

    #[test]
    fn without_a_perturbed_reference_the_bound_grows_like_a_random_walk_over_steps() {
        let t0 = tolerance(Precision::Fp32, DType::F32, 3, 0, None).value;
        let t99 = tolerance(Precision::Fp32, DType::F32, 3, 99, None).value;
        assert!((t99 / t0 - 10.0).abs() < 1e-9);
        // The perturbed estimate is taken as measured, whatever the step.
        let p = tolerance(Precision::Fp32, DType::F32, 3, 0, Some(1e-3));
        assert_eq!(p.source, "perturbed");
    }

    #[test]
    fn terms_add_cancellation_and_inputs_errors() {
        let base = Terms {
            precision: Precision::Bf16,
            dtype: DType::BF16,
            depth: 0,
            updates: 0,
            perturbed: None,
            cancelled: None,
            input_error: None,
        };
        assert_eq!(base.tolerance().value, K);
        let inc = Terms {
            cancelled: Some(10.0),
            ..base
        };
        // 4 u / eps = 2 per unit of cancellation.
        assert!((inc.tolerance().value - (K + 20.0)).abs() < 1e-9);
        let small = Terms {
            input_error: Some(0.5),
            ..base
        };
        assert_eq!(small.tolerance().value, K);
        let large = Terms {
            input_error: Some(3.0),
            ..base
        };
        let t = large.tolerance();
        assert_eq!((t.value, t.source), (K + 6.0, "analytic + inputs' errors"));
        assert_eq!(reduced(Some(5.0)).value, 10.0);
    }

    #[test]
    fn fp8_operands_are_judged_at_their_own_epsilon() {
        let t = tolerance(Precision::Fp8, DType::F8_E4M3, 0, 0, None).value;
        assert_eq!(t, K * 2.0);
    }
}
