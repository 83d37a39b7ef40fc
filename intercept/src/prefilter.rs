//! The capture settings applied before the snapshot work (docs/capture.md, "What filtering
//! saves"): an op whose record cannot belong to a selected step (`TTRACE_STEPS`) or rank
//! (`TTRACE_RANKS`) copies only what the step rule needs of it, and the tracer drops its record
//! as it drops any unselected record (counted).
//!
//! Steps are decided by the tracer thread, in ticket order, but a hook can bound the step of
//! the op it is about to snapshot. Only **counted** records can move the step: under `auto`,
//! GEMMs that may have the anchor's signature (every GEMM until the anchor is known, then the
//! anchor's signature only); under `nvtx:NAME` and `api`, the step marks. Each counted record
//! adds one to [`ENQUEUED`] just before it takes its ticket; the tracer adds one to [`FED`]
//! after it has taken one into the step rule (having stored the step it reached in [`STEP`]).
//! A record taking its ticket now therefore gets a step in
//!
//! `STEP ..= STEP + (ENQUEUED − FED) + 1` (the `+ 1` under `auto` only: the record itself may
//! be a recurrence, or held back until the next one),
//!
//! since each counted record moves the step by at most one. When no selected step lies in
//! that interval, the record is not wanted. Under `auto` the step rule needs the A and B
//! operands of the GEMMs that count and, of the others, those of the length of the anchor's A
//! or B (their CRC-32s and samples find recurrences and backward passes), so those are still
//! copied; nothing else is. Once the tracer's step is past the last selected
//! step, no later record can be wanted: capture stops ([`past_last_step`]).
//!
//! Within the step rule's period (steps.rs, [`Period`]) a GEMM's hook knows from its ordinal
//! whether the rule will read it: only a recurrence counts and keeps its operands; the hooks
//! check each GEMM against the period themselves ([`gemm_turn`]), and remember every GEMM's
//! signature ([`first_deviation`]), so that the tracer and the hooks stop following it at the
//! same GEMM.
//!
//! Two threads enqueuing at the same instant may see a count without the other's record; a
//! reduced snapshot whose record turns out to be wanted is then published as a `TracerFault`
//! gap in its place (it holds no shapes, and fingerprints for bytes) and capture stops with a
//! second one (tracer.rs), so a store never holds a silently thinned step.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use ttrace_proto::config::{CaptureConfig, RangeSet, StepRule};
use ttrace_proto::record::{GemmOp, Op, Role};

use crate::plan::TensorPlan;
use crate::steps::{AnchorShape, Period};

/// Counted records that took a ticket.
static ENQUEUED: AtomicU64 = AtomicU64::new(0);
/// Counted records the tracer has fed to the step rule.
static FED: AtomicU64 = AtomicU64::new(0);
/// The tracer's current step (stored before [`FED`] moves).
static STEP: AtomicU64 = AtomicU64::new(0);
/// The anchor's signature, the bytes of its A and B operands and their orientation (bit 0: A
/// read transposed, bit 1: B), once the tracer knows them (`ANCHOR_KNOWN`).
static ANCHOR: AtomicU64 = AtomicU64::new(0);
static ANCHOR_A: AtomicU64 = AtomicU64::new(0);
static ANCHOR_B: AtomicU64 = AtomicU64::new(0);
static ANCHOR_TRANS: AtomicU64 = AtomicU64::new(0);
static ANCHOR_KNOWN: AtomicBool = AtomicBool::new(false);

/// GEMM calls counted by their hooks under `auto` (each GEMM's ordinal, steps.rs's periods).
static GEMM_ORDINAL: AtomicU64 = AtomicU64::new(0);

/// GEMMs remembered by ordinal (`HISTORY[ordinal % HISTORY_LEN]`): 32 bits of the signature
/// ([`GRAPH_GEMM`] for a GEMM recorded into a CUDA graph) and the ordinal's low 32 bits plus
/// one (zero: never written, so the table needs no initialised pages). The hooks leave the
/// GEMMs a period does not read out of the tracer's sight; this is how the tracer, and a
/// hook that learns of a period late, still see every GEMM's kind. It holds four of the
/// longest periods (2 MiB, touched as the ordinals advance): a tracer that falls
/// further behind the program finds a GEMM it checks overwritten, and takes it as off the
/// period.
const HISTORY_LEN: usize = 4 * crate::steps::MAX_PERIOD_LEN as usize;
static HISTORY: [AtomicU64; HISTORY_LEN] = [const { AtomicU64::new(0) }; HISTORY_LEN];

/// The low half of a history entry for `ordinal`.
fn history_tag(ordinal: u64) -> u64 {
    u64::from((ordinal as u32).wrapping_add(1))
}

/// The signature bits of a GEMM recorded into a CUDA graph: its replays come without
/// ordinals, so a period breaks there.
const GRAPH_GEMM: u32 = u32::MAX;

/// The period the tracer follows, with the first ordinal at which one disagreed (each is
/// leaked: a process takes at most `steps::MAX_PERIODS`).
struct SharedPeriod {
    period: Period,
    /// The first ordinal from `period.from` on whose GEMM disagreed with it (`u64::MAX`: none
    /// yet), as far as the hooks looked.
    broken_at: AtomicU64,
    /// Ordinals below this were checked against the period.
    checked_to: AtomicU64,
}

static PERIOD: AtomicPtr<SharedPeriod> = AtomicPtr::new(std::ptr::null_mut());

fn sig_bits(sig: u64) -> u32 {
    // Not the graph marker: a real signature that folds to it is taken as its neighbour.
    ((sig ^ (sig >> 32)) as u32).min(GRAPH_GEMM - 1)
}

fn remember(ordinal: u64, bits: u32) {
    HISTORY[ordinal as usize % HISTORY_LEN].store(
        u64::from(bits) << 32 | history_tag(ordinal),
        Ordering::Release,
    );
}

/// Whether the GEMM at `ordinal` disagrees with `p` by the history (overwritten: taken as
/// disagreeing, the tracer having fallen a whole history behind).
fn deviates_in_history(p: &Period, ordinal: u64) -> bool {
    let v = HISTORY[ordinal as usize % HISTORY_LEN].load(Ordering::Acquire);
    if v & 0xffff_ffff != history_tag(ordinal) {
        return true;
    }
    let bits = (v >> 32) as u32;
    bits == GRAPH_GEMM || p.place(bits == sig_bits(p.sig), ordinal).is_none()
}

/// The first ordinal in `from..to` (at or after the period's start) whose GEMM disagrees with
/// `p` by the history.
pub(crate) fn first_deviation(p: &Period, from: u64, to: u64) -> Option<u64> {
    (from.max(p.from)..to).find(|&o| deviates_in_history(p, o))
}

/// A GEMM's hook under the `auto` rule, with its signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GemmTurn {
    /// Its ordinal among the process's GEMM calls.
    pub ordinal: u64,
    /// Within a period it agrees with: whether the rule reads its operands (`None`: no
    /// period, or one it breaks or has not reached).
    pub within: Option<bool>,
}

/// Counts a GEMM call (under the `auto` rule) and places it in the period followed, if any.
pub(crate) fn gemm_turn(sig: u64) -> GemmTurn {
    let ordinal = GEMM_ORDINAL.fetch_add(1, Ordering::AcqRel);
    let bits = sig_bits(sig);
    remember(ordinal, bits);
    let ptr = PERIOD.load(Ordering::Acquire);
    // SAFETY: a published period is leaked, never freed.
    let within = unsafe { ptr.as_ref() }.and_then(|shared| {
        let p = &shared.period;
        if ordinal < p.from || shared.broken_at.load(Ordering::Acquire) <= ordinal {
            return None;
        }
        // The GEMMs before this one that no hook checked against the period (it was
        // published after their calls): the history holds them.
        let checked = shared.checked_to.load(Ordering::Acquire);
        // Checked as the history is read, by the signature's bits: the tracer checks the GEMMs
        // it does not see in the history, and must find the same one off the period.
        let placed = p.place(bits == sig_bits(p.sig), ordinal);
        let disagrees =
            first_deviation(p, checked, ordinal).or(placed.is_none().then_some(ordinal));
        shared.checked_to.fetch_max(ordinal + 1, Ordering::AcqRel);
        if let Some(at) = disagrees {
            shared.broken_at.fetch_min(at, Ordering::AcqRel);
            return None;
        }
        placed
    });
    GemmTurn { ordinal, within }
}

/// A GEMM recorded into a CUDA graph (under the `auto` rule): it takes an ordinal, and breaks
/// a period (its replays have none).
pub(crate) fn note_graph_gemm() {
    let ordinal = GEMM_ORDINAL.fetch_add(1, Ordering::AcqRel);
    remember(ordinal, GRAPH_GEMM);
    let ptr = PERIOD.load(Ordering::Acquire);
    // SAFETY: a published period is leaked, never freed.
    if let Some(shared) = unsafe { ptr.as_ref() } {
        if ordinal >= shared.period.from {
            shared.broken_at.fetch_min(ordinal, Ordering::AcqRel);
        }
    }
}

/// The tracer's step rule follows `period` from now on (`None`: none).
pub(crate) fn note_period(period: Option<&Period>) {
    let new = period.map_or(std::ptr::null_mut(), |p| {
        Box::leak(Box::new(SharedPeriod {
            period: p.clone(),
            broken_at: AtomicU64::new(u64::MAX),
            checked_to: AtomicU64::new(p.from),
        })) as *mut SharedPeriod
    });
    PERIOD.store(new, Ordering::Release);
}

/// Whether the step bound is needed at all: steps are selected.
fn active(cfg: &CaptureConfig) -> bool {
    cfg.steps.is_some()
}

/// Whether a GEMM with signature `sig` (computed only when needed) counts (it may start a
/// step under `auto`).
pub(crate) fn counts_gemm(cfg: &CaptureConfig, sig: impl FnOnce() -> u64) -> bool {
    active(cfg)
        && cfg.step_rule == StepRule::Auto
        && (!ANCHOR_KNOWN.load(Ordering::Acquire) || ANCHOR.load(Ordering::Relaxed) == sig())
}

/// Whether a GEMM with signature `sig` (computed only when needed) may recur the anchor
/// under `auto`, whatever is selected: any GEMM before the anchor is known, then the anchor's
/// signature only. The step rule compares fingerprints only of such GEMMs' operands; of the
/// others, glimpses (fingerprint.rs). The tracer knows the anchor before any record whose hook
/// saw it, so a hook never glimpses what the rule will fingerprint.
pub(crate) fn may_recur_anchor(sig: impl FnOnce() -> u64) -> bool {
    !ANCHOR_KNOWN.load(Ordering::Acquire) || ANCHOR.load(Ordering::Relaxed) == sig()
}

/// Whether an op counts: a GEMM that may start a step (`sig`: its signature, computed only
/// when needed).
pub(crate) fn counts_op(cfg: &CaptureConfig, op: &Op, sig: impl FnOnce(&GemmOp) -> u64) -> bool {
    match op {
        Op::Gemm(g) => counts_gemm(cfg, || sig(g)),
        _ => false,
    }
}

/// Whether a step mark counts (the hooks push only marks the rule applies to).
pub(crate) fn counts_mark(cfg: &CaptureConfig) -> bool {
    active(cfg) && cfg.step_rule != StepRule::Auto
}

/// A counted record is about to take its ticket.
pub(crate) fn note_enqueued() {
    ENQUEUED.fetch_add(1, Ordering::AcqRel);
}

/// The tracer fed a counted record to the step rule and is now at `step`.
pub(crate) fn note_fed(step: u64) {
    STEP.store(step, Ordering::Release);
    FED.fetch_add(1, Ordering::AcqRel);
}

/// The tracer found the anchor (the first GEMM, told as soon as its snapshot leaves the FIFO,
/// `Tracer::tell_anchor_early`): from now on only GEMMs of its signature count,
/// and of the others only operands [`AnchorShape::may_see`] lets through matter to the rule.
pub(crate) fn note_anchor(anchor: AnchorShape) {
    ANCHOR.store(anchor.sig, Ordering::Relaxed);
    ANCHOR_A.store(anchor.len[0], Ordering::Relaxed);
    ANCHOR_B.store(anchor.len[1], Ordering::Relaxed);
    let trans = u64::from(anchor.trans[0]) | u64::from(anchor.trans[1]) << 1;
    ANCHOR_TRANS.store(trans, Ordering::Relaxed);
    ANCHOR_KNOWN.store(true, Ordering::Release);
}

/// The anchor the tracer noted, if any.
fn noted_anchor() -> Option<AnchorShape> {
    if !ANCHOR_KNOWN.load(Ordering::Acquire) {
        return None;
    }
    let trans = ANCHOR_TRANS.load(Ordering::Relaxed);
    Some(AnchorShape {
        sig: ANCHOR.load(Ordering::Relaxed),
        len: [
            ANCHOR_A.load(Ordering::Relaxed),
            ANCHOR_B.load(Ordering::Relaxed),
        ],
        trans: [trans & 1 != 0, trans & 2 != 0],
    })
}

/// The steps a record taking its ticket now can get (see the module's documentation).
fn step_bound(rule: &StepRule) -> (u64, u64) {
    let fed = FED.load(Ordering::Acquire);
    let step = STEP.load(Ordering::Acquire);
    let pending = ENQUEUED.load(Ordering::Acquire).saturating_sub(fed);
    let own = u64::from(*rule == StepRule::Auto);
    (step, step.saturating_add(pending).saturating_add(own))
}

/// Whether `set` holds a step in `lo..=hi`.
fn any_in(set: &RangeSet, lo: u64, hi: u64) -> bool {
    set.0.iter().any(|&(a, b)| a <= hi && lo <= b)
}

/// Whether a step after `step` can be selected (`false`: everything later is dropped).
pub(crate) fn past_last_step(cfg: &CaptureConfig, step: u64) -> bool {
    cfg.steps
        .as_ref()
        .is_some_and(|set| set.0.iter().all(|&(_, b)| b < step))
}

/// Whether the record of an op on `device`, taking its ticket now, may be wanted.
pub(crate) fn may_be_wanted(cfg: &CaptureConfig, device: i32) -> bool {
    if let (Some(ranks), Some(rank)) = (&cfg.ranks, crate::identity::settled_rank(device)) {
        if !ranks.contains(u64::from(rank)) {
            return false;
        }
    }
    match &cfg.steps {
        Some(set) => {
            let (lo, hi) = step_bound(&cfg.step_rule);
            any_in(set, lo, hi)
        }
        None => true,
    }
}

/// Whether an unwanted record (`plans` already reduced by [`keep_rule_inputs`]) can be left
/// out before it takes a ticket: under `auto`, a record that does not count and brings the
/// rule no bytes cannot move the step (the rule only holds such records back, to place them,
/// and this one is placed nowhere). Under `api` and `nvtx:NAME` every one: such a record
/// matters to the rule only because a mark starts a step only after a record, and the next
/// mark carries the count of records left out (`tracer::push_mark`).
pub(crate) fn needless(counted: bool, plans: &[TensorPlan]) -> bool {
    !counted && plans.iter().all(|t| !t.captured)
}

/// Leaves in `plans` only what the step rule needs of an unwanted record: under `auto`, a
/// GEMM's A and B operands (of a GEMM that is not `counted`, only those that could be an
/// anchor operand's bytes read in another orientation, [`AnchorShape::may_see`]: the rule
/// compares their bytes with the anchor's and nothing else; within a period, `turn`, only
/// those of a recurrence); nothing otherwise.
pub(crate) fn keep_rule_inputs(
    cfg: &CaptureConfig,
    op: &Op,
    counted: bool,
    turn: Option<GemmTurn>,
    plans: &mut [TensorPlan],
) {
    let Op::Gemm(g) = op else {
        return keep_operands(None, None, plans);
    };
    // Within a period the rule reads only the GEMMs where the anchor recurs.
    if cfg.step_rule != StepRule::Auto || turn.is_some_and(|t| t.within == Some(false)) {
        return keep_operands(None, None, plans);
    }
    let anchor = if counted { None } else { noted_anchor() };
    keep_operands(Some([g.transa != 0, g.transb != 0]), anchor, plans);
}

/// Leaves only A and B captured (of a GEMM whose operands are read transposed as `trans`
/// says; those `anchor` may see when given, with a pointer-array batch's arrays), or nothing
/// (`trans` is `None`: not a GEMM the rule reads).
fn keep_operands(trans: Option<[bool; 2]>, anchor: Option<AnchorShape>, plans: &mut [TensorPlan]) {
    let gemm = trans.is_some();
    let [trans_a, trans_b] = trans.unwrap_or_default();
    for t in plans.iter_mut() {
        let slot = match t.role {
            Role::A => Some((0, trans_a)),
            Role::B => Some((1, trans_b)),
            _ => None,
        };
        let operand = slot.is_some();
        let matters = match (anchor, slot) {
            (Some(a), Some((slot, trans))) => a.may_see(slot, trans, t.nbytes),
            _ => true,
        };
        // A pointer-array batch's arrays vouch for its operands (else the record is a gap,
        // which the step rule would see instead of the GEMM).
        let array = matches!(t.role, Role::ArrayA | Role::ArrayB | Role::ArrayC);
        if !(gemm && ((operand && matters) || array)) {
            t.captured = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_range_is_hit_by_any_overlapping_interval() {
        let set = RangeSet(vec![(2, 3), (7, 7)]);
        assert!(!any_in(&set, 0, 1));
        assert!(any_in(&set, 0, 2));
        assert!(any_in(&set, 3, 5));
        assert!(!any_in(&set, 4, 6));
        assert!(any_in(&set, 6, 9));
        assert!(!any_in(&set, 8, u64::MAX));
    }

    #[test]
    fn past_the_last_selected_step_nothing_is_wanted() {
        let cfg = CaptureConfig {
            steps: Some(RangeSet(vec![(0, 0), (4, 5)])),
            ..CaptureConfig::default()
        };
        assert!(!past_last_step(&cfg, 5));
        assert!(past_last_step(&cfg, 6));
        let all = CaptureConfig::default();
        assert!(!past_last_step(&all, 1_000_000));
    }

    #[test]
    fn unwanted_gemms_keep_their_operands_only() {
        use crate::plan::{vector, Vector, When};
        use ttrace_proto::dtype::DType;
        let plans = || {
            [Role::A, Role::B, Role::CIn, Role::D]
                .map(|r| {
                    vector(
                        r,
                        Vector::new(0x100, Some(DType::F32), 4),
                        When::After,
                        true,
                    )
                })
                .to_vec()
        };
        let anchor = |len: [u64; 2], trans: [bool; 2]| Some(AnchorShape { sig: 7, len, trans });
        let kept = |trans, anchor| {
            let mut p = plans();
            keep_operands(trans, anchor, &mut p);
            p.iter().map(|t| t.captured).collect::<Vec<bool>>()
        };
        let untransposed = Some([false, false]);
        assert_eq!(kept(untransposed, None), [true, true, false, false]);
        // Both 16-byte operands could be the anchor's transposed A read in another orientation.
        assert_eq!(
            kept(untransposed, anchor([16, 99], [true, false])),
            [true, true, false, false]
        );
        // In the anchor's own orientation an A operand cannot be evidence; as B it can (A's
        // bytes read in the other slot).
        assert_eq!(
            kept(untransposed, anchor([16, 99], [false, false])),
            [false, true, false, false]
        );
        // Operands of lengths the anchor's operands do not have cannot matter.
        assert_eq!(
            kept(untransposed, anchor([32, 99], [true, true])),
            [false; 4]
        );
        // Not a GEMM the rule reads: nothing.
        let mut p = plans();
        keep_operands(None, None, &mut p);
        assert!(p.iter().all(|t| !t.captured));
    }

    #[test]
    fn within_a_period_hooks_copy_only_recurrences_and_stop_at_the_first_gemm_off_it() {
        // The only test of this binary that counts GEMM calls.
        let base = GEMM_ORDINAL.load(Ordering::Acquire);
        // Four GEMMs a step: the anchor's signature (7) at offsets 0 and 2, read at 0.
        let period = Period {
            origin: base,
            from: base + 1,
            len: 4,
            sig: 7,
            anchors: vec![0, 2],
            recurrences: vec![0],
            transposed: vec![],
        };
        note_period(Some(&period));
        let turns: Vec<Option<bool>> = [7, 8, 7, 8, 7].map(|s| gemm_turn(s).within).to_vec();
        assert_eq!(
            turns,
            [None, Some(false), Some(false), Some(false), Some(true)],
            "before the period, then within it: only the recurrence is read"
        );
        // The anchor's signature where the period has another: off the period from there on,
        // for every later GEMM too.
        assert_eq!(gemm_turn(7).within, None);
        assert_eq!(gemm_turn(8).within, None);
        assert_eq!(first_deviation(&period, base, base + 7), Some(base + 5));
        note_period(None);

        // A period the hooks learn of late: the GEMMs called before they did are checked in
        // the history, and one off the period there stops the copying as well.
        let base = GEMM_ORDINAL.load(Ordering::Acquire);
        for s in [7, 8, 8] {
            gemm_turn(s);
        }
        let late = Period {
            origin: base,
            from: base,
            ..period
        };
        note_period(Some(&late));
        assert_eq!(gemm_turn(8).within, None, "offset 2 held another signature");
        note_period(None);
        let base = GEMM_ORDINAL.load(Ordering::Acquire);
        for s in [7, 8] {
            gemm_turn(s);
        }
        note_period(Some(&Period {
            origin: base,
            from: base,
            ..late
        }));
        assert_eq!(gemm_turn(7).within, Some(false), "all agreed: not read");
        note_period(None);
    }
}
