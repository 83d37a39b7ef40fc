//! How large a difference round-off can explain, per tensor (docs/compare.md, section 4).
//!
//! Errors are measured in units of the working precision's machine epsilon (BF16's for FP8
//! recipes, as TTrace and Megatron-LM do). The analytic bound grows geometrically with the
//! depth of the op in the step (TTrace's Theorem 5.3 as Megatron-LM implements it:
//! `k · C^depth · ε`); a tensor stored in a narrower type than the working precision (FP8
//! operands) gets that type's epsilon instead. A perturbed reference (`ttrace run
//! --perturb`) measures, per tensor, how far one rounding-sized disturbance per GEMM output
//! moves it; the tolerance is the larger of the two.
//!
//! Every term of a tolerance is here, each with its source: the analytic bound and its
//! growth over depth and steps ([`tolerance`], [`step_growth`]), the perturbed estimate
//! ([`perturbed_error`]) and the floor a round-off jump sets for its step ([`jump_floor`]),
//! what an increment `D - beta*C` cancels and what an op's inputs
//! carry into its output ([`Terms`], [`Terms::for_tensor`]), a reduction compared through
//! the GEMM output it reduces ([`reduced`]), the thresholds placement trusts
//! ([`Tolerance::hint_limits`], [`Tolerance::sum_accept`]), the round-off bound of a GEMM
//! recomputed in f64 ([`recomputed_excess`]) and of a collective's reduction in any order
//! ([`reduction_bound`], used by `ttrace check`).

use ttrace_format::dtype::DType;
use ttrace_format::record::{Record, Role};

use crate::model::dtypes;
pub use crate::model::dtypes::{epsilon, unit_roundoff};
use crate::trace::{gemm, RunTrace, Values};
use crate::CompareError;

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

impl Precision {
    /// The narrowest operand type over the GEMMs of `recs`.
    pub fn of_records(recs: &[Record]) -> Precision {
        let mut p = Precision::Fp32;
        for g in recs.iter().filter_map(gemm) {
            for t in [g.a_type, g.b_type] {
                let q = match dtypes::of_cuda(t) {
                    Some(DType::F8_E4M3 | DType::F8_E5M2) => Precision::Fp8,
                    Some(DType::BF16) => Precision::Bf16,
                    Some(DType::F16) => Precision::Fp16,
                    _ => Precision::Fp32,
                };
                p = p.narrower(q);
            }
        }
        p
    }

    /// The narrower of the two.
    pub fn narrower(self, other: Precision) -> Precision {
        if other.rank() > self.rank() {
            other
        } else {
            self
        }
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

/// A tolerance in epsilon, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// In units of the working precision's epsilon.
    pub value: f64,
    /// `analytic` or `perturbed`.
    pub source: &'static str,
}

impl Tolerance {
    /// Whether a relative error `rel` lies beyond this tolerance (in epsilon `eps`).
    pub fn exceeded_by(self, rel: f64, eps: f64) -> bool {
        rel / eps > self.value
    }

    /// The relative errors placement trusts for a tensor of this tolerance stored as
    /// `dtype`: (accept, trust). A remembered place is taken without a search up to
    /// `accept`, a quarter of the tolerance and at most [`placement_accept`] (a wrong slice
    /// of a loosely tolerated tensor, FP8, must not pass as round-off); a remembered place
    /// that drifted above it but stays within the tolerance (`trust`) is re-validated
    /// against the other places instead of searched again.
    pub fn hint_limits(self, eps: f64, dtype: DType) -> (f64, f64) {
        let trust = self.value * eps;
        ((0.25 * trust).min(placement_accept(dtype)), trust)
    }

    /// The relative error up to which a group sum's placement is remembered: the tolerance,
    /// at most [`placement_accept`].
    pub fn sum_accept(self, eps: f64, dtype: DType) -> f64 {
        (self.value * eps).min(placement_accept(dtype))
    }
}

/// The largest relative error at which a remembered placement is taken without a search:
/// well below what a wrong slice gives (O(1)), above what rounding to the tensor's own type
/// gives (FP8 differs by a good fraction of its epsilon).
pub fn placement_accept(d: DType) -> f64 {
    (0.5 * epsilon(d)).max(0.02)
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

/// A compared tensor, as its tolerance sees it.
#[derive(Debug, Clone, Copy)]
pub struct TensorAt {
    /// The working precision.
    pub precision: Precision,
    /// The tensor's stored type.
    pub dtype: DType,
    /// Reference GEMMs before the op in its step.
    pub depth: u64,
    /// The step (optimizer updates before it).
    pub step: u64,
    /// Whether a perturbed reference was given.
    pub perturbed_reference: bool,
    /// Whether that reference's own drift over the steps measures this tensor's: it holds
    /// this step and was perturbed up to it ([`crate::twin`]). Otherwise the steps' drift is
    /// modelled.
    pub drift_measured: bool,
    /// For an increment `D - beta*C` (an accumulating GEMM's output): the digits cancelled,
    /// `‖beta*C‖ / ‖D - beta*C‖`.
    pub increment: Option<f64>,
    /// For an op's output: the summed errors (in epsilon) of its inputs.
    pub output_of: Option<f64>,
}

impl TensorAt {
    /// Whether the perturbed reference's error on this tensor is a term: not for an
    /// increment (it loses the digits C and D share, and a perturbed run's 1-ulp change of
    /// C says nothing more about it).
    pub fn reads_perturbed(&self) -> bool {
        self.perturbed_reference && self.increment.is_none()
    }
}

impl Terms {
    /// The terms of a tensor's tolerance, given the perturbed reference's relative error on
    /// it (`perturbed`, read only when [`TensorAt::reads_perturbed`]). Without a perturbed
    /// reference, or with one whose perturbation did not reach this step's GEMMs, the drift
    /// over the steps is modelled ([`step_growth`]); otherwise its own drift measures it.
    pub fn for_tensor(at: TensorAt, perturbed: Option<f64>) -> Terms {
        Terms {
            precision: at.precision,
            dtype: at.dtype,
            depth: at.depth,
            updates: if at.perturbed_reference && at.drift_measured {
                0
            } else {
                at.step
            },
            perturbed: perturbed.filter(|_| at.reads_perturbed()),
            cancelled: at.increment,
            input_error: at.output_of,
        }
    }

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

/// The perturbed reference's error on one tensor ([`perturbed_error`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerturbedError {
    /// Its relative error against the reference.
    pub rel: f64,
    /// The share of its squared difference in its [`JUMP_ELEMENTS`] largest elements,
    /// measured when it could be a jump ([`PerturbedError::is_jump`]), else 0.
    pub top_share: f64,
    /// The tensor's elements.
    pub elements: usize,
}

impl PerturbedError {
    /// Whether round-off turned into a jump here: at least [`JUMP_MIN_EPS`] epsilon of
    /// difference, at least [`JUMP_SHARE`] of it in a handful of elements of a tensor of
    /// [`JUMP_MIN_ELEMENTS`] or more. One rounding-sized disturbance per GEMM output moves
    /// most elements a little; a few elements far is a discrete event that a rounding
    /// triggered (Adam's update near `|g| ~ eps`, a routing or threshold decision), which
    /// can happen in any tensor of the step, in the run too (docs/compare.md, section 4).
    pub fn is_jump(&self) -> bool {
        self.top_share >= JUMP_SHARE
    }
}

/// The perturbed reference's relative error on a tensor from which its step is chaotic:
/// round-off alone moved the tensor by half its size. [`ALPHA`] times that, the tolerance it
/// sets, is beyond the distance of two unrelated tensors of one norm (`sqrt(2)`), so such a
/// tensor is judged on little more than its norm, and one perturbed reference bounds the
/// step's other tensors no better than a round-off jump does (a training that amplifies
/// round-off this far does so unevenly: a high learning rate over many steps).
pub const CHAOTIC: f64 = 0.5;

/// Elements whose share of a difference says whether it is a jump.
pub const JUMP_ELEMENTS: usize = 10;
/// The share of the squared difference those elements must hold.
pub const JUMP_SHARE: f64 = 0.9;
/// Smaller tensors are not judged for jumps (a handful of elements is much of them).
pub const JUMP_MIN_ELEMENTS: usize = 1024;
/// A difference below this many epsilon is round-off-sized, not a jump.
pub const JUMP_MIN_EPS: f64 = 2.0;
/// The source of a tolerance raised to its step's jump ([`jump_floor`]).
pub const JUMP_SOURCE: &str = "perturbed (round-off jump in the step)";

/// The least tolerance, in epsilon, of every tensor of a step whose perturbed reference shows
/// a jump of `jump_eps` epsilon ([`PerturbedError::is_jump`]): [`ALPHA`] times it, as the
/// perturbed estimate of the tensor that showed it. Where such a jump lands is chance,
/// different in the run and in the perturbed reference, so its size, not its place, bounds
/// what round-off explains in that step.
pub fn jump_floor(jump_eps: f64) -> f64 {
    ALPHA * jump_eps
}

/// The perturbed reference's error on the tensor `role` of `rec` (its record of the
/// reference's op), against the reference's values; `None` when it has no such tensor or
/// another shape. How concentrated it is is measured when the relative error is at least
/// `jump_min_rel` (a cost of one more pass, so only where it could be a jump).
pub fn perturbed_error(
    pert: &RunTrace,
    rec: &Record,
    role: Role,
    ref_vals: &Values,
    jump_min_rel: f64,
) -> Result<Option<PerturbedError>, CompareError> {
    let Some(v) = pert.values(rec, role)? else {
        return Ok(None);
    };
    if v.shape != ref_vals.shape {
        return Ok(None);
    }
    let rel = crate::kernels::rel_error(&v.data, &ref_vals.data);
    let elements = v.data.len();
    let could_be_a_jump = rel.is_finite() && rel >= jump_min_rel && elements >= JUMP_MIN_ELEMENTS;
    // Each element's difference relative to its own size, at least the tensor's typical one
    // (the median magnitude: outliers do not move it, elements near zero do not blow up).
    let typical = could_be_a_jump
        .then(|| crate::kernels::median_magnitude(&ref_vals.data))
        .flatten()
        .filter(|m| *m > 0.0);
    let top_share = typical.map_or(0.0, |m| {
        crate::kernels::top_share(&v.data, &ref_vals.data, JUMP_ELEMENTS, f64::from(m))
    });
    Ok(Some(PerturbedError {
        rel,
        top_share,
        elements,
    }))
}

/// How far above its round-off bound a GEMM output `got` (stored as `dtype`) lies from its
/// recomputation in f64 (`exact`, with `abs` the sums of the products' magnitudes), over
/// `k` products each: the largest of `|got - exact| / (u (1 + sqrt k) abs + u |exact|)`
/// (accumulation in any blocking, then one rounding to `dtype`).
pub fn recomputed_excess(dtype: DType, k: u64, exact: &[f64], abs: &[f64], got: &[f32]) -> f64 {
    let u = unit_roundoff(dtype);
    let k = k as f64;
    exact
        .iter()
        .zip(abs)
        .zip(got)
        .map(|((e, s), &v)| {
            (f64::from(v) - e).abs() / (u * (1.0 + k.sqrt()) * s + u * e.abs() + f64::MIN_POSITIVE)
        })
        .fold(0f64, f64::max)
}

/// How many times its round-off bound a recomputed GEMM output may be off before the GEMM
/// itself is named ([`recomputed_excess`]).
pub const RECOMPUTE_MARGIN: f64 = 4.0;

/// The largest difference allowed between a reduction of `n` values computed in `dtype` in
/// any order and the exact one, given `abs_sum` (the sum of the values' magnitudes):
/// `k` roundings (k = n-1 additions, one more per division for an average) of partial sums
/// each at most `abs_sum` in magnitude: `gamma_k * abs_sum + k * smallest`, with
/// `gamma_k = k u / (1 - k u)` (Higham's bound for recursive summation in any order).
pub fn reduction_bound(dtype: DType, k: usize, abs_sum: f64) -> f64 {
    ReductionBound::new(dtype, k).at(abs_sum)
}

/// [`reduction_bound`] of one type and number of roundings, its constants worked out once for
/// the many elements of a reduction checked against it.
#[derive(Debug, Clone, Copy)]
pub enum ReductionBound {
    /// Exact (an integer type): no difference allowed.
    Exact,
    /// So many roundings the bound is unbounded.
    Unbounded,
    /// `gamma_k` and `k * smallest`.
    Scaled { gamma: f64, floor: f64 },
}

impl ReductionBound {
    /// The bound of `k` roundings in `dtype`.
    pub fn new(dtype: DType, k: usize) -> ReductionBound {
        let Some((u, tiny)) = dtypes::roundoff(dtype) else {
            return ReductionBound::Exact;
        };
        let ku = k as f64 * u;
        if ku >= 1.0 {
            return ReductionBound::Unbounded;
        }
        ReductionBound::Scaled {
            gamma: ku / (1.0 - ku),
            floor: k as f64 * tiny,
        }
    }

    /// The bound given `abs_sum`: the same number [`reduction_bound`] gives.
    pub fn at(self, abs_sum: f64) -> f64 {
        match self {
            ReductionBound::Exact => 0.0,
            ReductionBound::Unbounded => f64::INFINITY,
            ReductionBound::Scaled { gamma, floor } => gamma * abs_sum + floor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_recipes_are_measured_in_bf16_epsilons() {
        // The epsilons themselves are model::dtypes' (tested there).
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

    fn at(step: u64) -> TensorAt {
        TensorAt {
            precision: Precision::Fp32,
            dtype: DType::F32,
            depth: 0,
            step,
            perturbed_reference: false,
            drift_measured: false,
            increment: None,
            output_of: None,
        }
    }

    #[test]
    fn without_a_perturbed_reference_the_steps_drift_is_a_term_and_with_one_it_is_measured() {
        assert_eq!(Terms::for_tensor(at(99), None).tolerance().value, K * 10.0);
        let measured = TensorAt {
            perturbed_reference: true,
            drift_measured: true,
            ..at(99)
        };
        assert_eq!(Terms::for_tensor(measured, None).tolerance().value, K);
        // A twin its perturbation did not reach by this step (CUDA graph replays): modelled.
        let unmeasured = TensorAt {
            drift_measured: false,
            ..measured
        };
        assert_eq!(
            Terms::for_tensor(unmeasured, None).tolerance().value,
            K * 10.0
        );
        // Its error on the tensor still counts where it is the larger.
        let t = Terms::for_tensor(unmeasured, Some(1.0)).tolerance();
        assert_eq!(t.source, "perturbed");
    }

    #[test]
    fn an_increment_ignores_the_perturbed_estimate_and_pays_for_what_it_cancelled() {
        let inc = TensorAt {
            perturbed_reference: true,
            increment: Some(0.0),
            ..at(0)
        };
        assert!(!inc.reads_perturbed());
        let t = Terms::for_tensor(inc, Some(1.0)).tolerance();
        assert_eq!((t.value, t.source), (K, "analytic"));
        let plain = TensorAt {
            perturbed_reference: true,
            ..at(0)
        };
        assert_eq!(
            Terms::for_tensor(plain, Some(1.0)).tolerance().source,
            "perturbed"
        );
    }

    #[test]
    fn placement_trusts_a_quarter_of_the_tolerance_and_never_a_wrong_fp8_slice() {
        let tol = Tolerance {
            value: 4.0,
            source: "analytic",
        };
        let eps = epsilon(DType::BF16);
        let (accept, trust) = tol.hint_limits(eps, DType::BF16);
        assert_eq!((accept, trust), (eps, 4.0 * eps));
        // FP8's own epsilon is large: acceptance stops at half of it.
        let loose = Tolerance {
            value: 400.0,
            source: "perturbed",
        };
        assert_eq!(loose.hint_limits(eps, DType::F8_E4M3).0, 0.0625);
        assert_eq!(loose.sum_accept(eps, DType::BF16), 0.02);
        assert!(tol.exceeded_by(4.1 * eps, eps) && !tol.exceeded_by(3.9 * eps, eps));
    }

    #[test]
    fn a_recomputed_gemm_output_within_round_off_is_below_the_margin() {
        let exact = [1.0, -2.0];
        let abs = [3.0, 4.0];
        let u = unit_roundoff(DType::BF16);
        let close = [(1.0 + u) as f32, -2.0];
        assert!(recomputed_excess(DType::BF16, 4, &exact, &abs, &close) < RECOMPUTE_MARGIN);
        let wrong = [1.5f32, -2.0];
        assert!(recomputed_excess(DType::BF16, 4, &exact, &abs, &wrong) > RECOMPUTE_MARGIN);
    }

    #[test]
    fn a_reduction_bound_covers_every_summation_order_and_integers_are_exact() {
        // bf16: 1 + 2^-8 rounds to 1 (ties to even) in one order and is exact in f64.
        let b = reduction_bound(DType::BF16, 1, 1.0 + 2f64.powi(-8));
        assert!(b >= 2f64.powi(-8) && b < 2f64.powi(-7));
        assert_eq!(reduction_bound(DType::I32, 7, 100.0), 0.0);
        assert_eq!(reduction_bound(DType::F8_E4M3, 16, 1.0), f64::INFINITY);
    }

    #[test]
    fn a_jump_is_a_difference_of_a_few_elements_that_sets_its_steps_floor() {
        let e = |share| PerturbedError {
            rel: 1e-5,
            top_share: share,
            elements: 4096,
        };
        assert!(e(0.95).is_jump());
        assert!(
            !e(0.5).is_jump(),
            "spread over the tensor: round-off as usual"
        );
        // ALPHA times the jump, in epsilon, as the perturbed estimate of that tensor.
        assert!((jump_floor(8.0) - ALPHA * 8.0).abs() < 1e-9);
    }
}
