//! Step numbering (docs/format.md, "Step numbering"): which step each record belongs to.
//!
//! The tracer feeds records in host call order; [`Steps`] hands them back, in the same order,
//! with their step. Under the `auto` rule a record may be held back for a while: the records
//! from the first host-to-device copy or NCCL receive after a GEMM (the next batch arriving)
//! wait for the next GEMM, which decides whether they open a new step.
//!
//! `auto`: the **anchor** is the first GEMM (its signature: API, shape, transposes, types). A
//! later GEMM with the anchor's signature is a **candidate** recurrence when one of these holds:
//! * it reuses both of the anchor's operand buffers (A and B at the same addresses);
//! * one of its operands holds the bytes (same CRC-32) that operand held at the anchor's
//!   previous occurrence (the same weights, or the same input, again);
//! * since that previous occurrence, the anchor's operand bytes were read by another GEMM in
//!   another orientation (other operand slot or other transpose): the backward pass, which
//!   multiplies by the forward's operands transposed (`dX = dY·W`, `dW = dYᵀ·X`).
//!
//! A candidate is another micro-batch of the same step if an operand still holds the bytes it
//! held at the previous occurrence, and a new step (the optimizer ran) otherwise; except that
//! when exactly one operand held its bytes and the other moved only a little (relative change
//! of sampled elements under [`UPDATE_MAX_CHANGE`]), the moved one is weights the optimizer
//! updated and the held one an input fed again (one batch trained on repeatedly): a new step;
//! unless the held slot is known to hold the weights (it held its bytes before while the other
//! slot got clearly new values): then it is new data close to the last, a micro-batch.
//! New data replaces an operand's values; an optimizer nudges them. Addresses are
//! not required: PyTorch's caching allocator hands out fresh activation buffers (and fresh
//! low-precision weight casts) each iteration. Later layers of the anchor's shape in the same
//! forward pass are not candidates: their weights hold other bytes, and the anchor's operands
//! have not been through a backward yet; sharing one buffer with the anchor (an activation
//! buffer) is not enough. An operand whose bytes were not captured (inputs off, size cap)
//! counts as changed and gives no evidence; only the both-buffers condition then applies.
//!
//! Once two steps in a row had one shape in GEMM ordinals (each GEMM's place among the
//! process's GEMM calls, counted by its hook: the step's length, where the anchor's signature
//! falls, which of those recurred, where the backward read the anchor's bytes), the rule
//! follows it as a [`Period`]: it reads only the recurrences (whose bytes still decide new step
//! or micro-batch) and takes every other GEMM for another layer, unread; the hooks then leave
//! those out under `--steps` (prefilter.rs). A GEMM off the period breaks it, and the rule
//! reads every GEMM again.
//!
//! `nvtx:NAME` and `api`: a mark ([`Steps::mark`]) starts a new step, unless the current step
//! has no record yet (so a mark before the first captured op does not leave step 0 empty).

use std::collections::VecDeque;

use ttrace_proto::config::StepRule;

/// Micro-batch recurrences of the anchor in a run that stayed in step 0 from which on the
/// `auto` rule says it may have missed the steps.
pub const DOUBT_RECURRENCES: u64 = 3;

/// Records held back at most (count), before they are released into the current step.
pub const MAX_HELD: usize = 4096;

/// Consecutive steps of one shape (GEMMs a step, where the anchor's signature falls, which of
/// those recurred) after which the `auto` rule follows that shape as a [`Period`].
pub const PERIOD_AFTER: u32 = 2;

/// Periods a process may follow (each break, and the learning after it, takes one); then the
/// rule reads every GEMM to the end.
pub const MAX_PERIODS: u32 = 16;

/// Longest period followed, in GEMMs a step: a large model's step with many micro-batches
/// (80 layers of 12 GEMMs each, 32 micro-batches: 30,720). The hooks' history of GEMM calls
/// holds four of them (prefilter.rs), for the tracer falling behind the program.
pub const MAX_PERIOD_LEN: u64 = 1 << 16;

/// Elements of an operand kept to tell an optimizer's update from new data.
pub const SAMPLE_LEN: usize = 32;

/// Relative change (`‖now − before‖ / ‖before‖` over the sampled elements) below which an
/// operand counts as updated in place rather than replaced by new data (unless the other slot is
/// known to hold the weights, `Anchor::one_held`). Measured: SGD steps that halve a loss move
/// weights by 0.03-0.05 (tests/torch/megatron.py); the next micro-batch's activations at a
/// deep pipeline stage moved by 0.19-0.20 early on, and by under 0.1 at some later
/// recurrences (inferred from where the rule split them; the trainer, bf16, 8 layers, last
/// stage of pp=2); independent inputs are expected to move by about √2.
pub const UPDATE_MAX_CHANGE: f64 = 0.1;

/// Evenly spaced elements of an operand, as `f32`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    vals: [f32; SAMPLE_LEN],
    len: u8,
}

impl Sample {
    /// Up to [`SAMPLE_LEN`] evenly spaced elements of `n` read by `element` (by index).
    pub fn take(n: usize, element: impl Fn(usize) -> Option<f64>) -> Option<Sample> {
        let len = n.min(SAMPLE_LEN);
        if len == 0 {
            return None;
        }
        let mut vals = [0f32; SAMPLE_LEN];
        for (i, v) in vals.iter_mut().take(len).enumerate() {
            *v = element(i * n / len)? as f32;
        }
        Some(Sample {
            vals,
            len: len as u8,
        })
    }

    /// Whether `self` is `before` moved only a little (see [`UPDATE_MAX_CHANGE`]); `false`
    /// when the samples cannot be compared (other lengths, nothing finite, all zero before).
    #[cfg(test)]
    fn slightly_moved_from(&self, before: &Sample) -> bool {
        self.change_from(before)
            .is_some_and(|c| c < UPDATE_MAX_CHANGE)
    }

    /// `‖self − before‖ / ‖before‖` over the sampled elements; `None` when the samples cannot
    /// be compared (other lengths, nothing finite, all zero before).
    fn change_from(&self, before: &Sample) -> Option<f64> {
        if self.len != before.len {
            return None;
        }
        let (mut diff, mut norm) = (0f64, 0f64);
        for (&now, &was) in self.vals.iter().zip(&before.vals).take(self.len as usize) {
            if now.is_finite() && was.is_finite() {
                diff += (now as f64 - was as f64).powi(2);
                norm += (was as f64).powi(2);
            }
        }
        (norm > 0.0).then(|| (diff / norm).sqrt())
    }
}

/// One operand of a GEMM as the step rule sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Operand {
    /// Device address.
    pub ptr: u64,
    /// CRC-32 of its fingerprint (its bytes at fixed places, fingerprint.rs), when its bytes
    /// or fingerprint were captured.
    pub crc: Option<u32>,
    /// CRC-32 of its glimpse (fingerprint.rs), when its bytes, fingerprint or glimpse were
    /// captured: what tells the anchor's operand bytes read again by another GEMM.
    pub glimpse: Option<u32>,
    /// Bytes of the operand (packed): equal CRC-32s of different lengths are not the same
    /// bytes.
    pub len: u64,
    /// Whether the GEMM reads it transposed (its `transa`/`transb` is not `N`).
    pub trans: bool,
    /// Some of its fingerprint's elements, when its bytes were at hand.
    pub sample: Option<Sample>,
}

/// What the step rule needs to know about a record.
// Made and consumed once per record, never stored in bulk: boxing the samples would cost an
// allocation per GEMM for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Class {
    /// A GEMM: a hash of its signature, its A and B operands, and its ordinal among the
    /// process's GEMM calls as its hook counted them (`None`: a GEMM no hook saw called, a
    /// CUDA graph's replay).
    Gemm {
        sig: u64,
        a: Operand,
        b: Operand,
        ordinal: Option<u64>,
    },
    /// A host-to-device copy or an NCCL receive: the next batch may be arriving.
    Arrival,
    /// Anything else.
    Other,
}

/// What the hooks are told of the anchor (prefilter.rs): its signature, and the bytes and
/// orientation (transposed or not) of its operands A (0) and B (1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnchorShape {
    pub sig: u64,
    pub len: [u64; 2],
    pub trans: [bool; 2],
}

impl AnchorShape {
    /// Whether an operand of `len` bytes in operand `slot` (0: A, 1: B), read transposed
    /// when `trans`, of a GEMM without the anchor's signature can matter to the rule: only
    /// as the bytes of an anchor operand of its length read in another orientation
    /// ([`Anchor::observe`]).
    pub fn may_see(&self, slot: u8, trans: bool, len: u64) -> bool {
        (0..2u8).any(|of| self.may_be(of, slot, trans, len))
    }

    /// Whether such an operand can be the bytes of the anchor's operand `of` (0: A, 1: B) read
    /// in another orientation: of its length, in another slot or transpose. The one statement
    /// of what the rule compares ([`Anchor::observe`]) and the hooks keep ([`Self::may_see`]).
    fn may_be(&self, of: u8, slot: u8, trans: bool, len: u64) -> bool {
        let i = usize::from(of);
        self.len[i] == len && (of, self.trans[i]) != (slot, trans)
    }
}

#[derive(Debug)]
struct Anchor {
    sig: u64,
    /// The operands at the anchor's previous occurrence.
    a: Operand,
    b: Operand,
    /// Whether another GEMM read the bytes of `a` or `b` in another orientation since then.
    transposed_reuse: bool,
    /// The operand slot (0: A, 1: B) seen holding its bytes while the other one was replaced
    /// by clearly new values (moved by at least [`UPDATE_MAX_CHANGE`]): the weights, under
    /// which micro-batches of new data run.
    weights: Option<u8>,
}

impl Anchor {
    /// Notes a GEMM that is not a candidate: does it read the anchor's operand bytes in
    /// another orientation (slot or transpose)?
    /// Returns whether it does.
    fn observe(&mut self, a: Operand, b: Operand) -> bool {
        let shape = self.shape();
        let mut read = false;
        for (slot, op) in [(0u8, a), (1u8, b)] {
            let Some(glimpse) = op.glimpse else { continue };
            for (of, mine) in [(0u8, self.a), (1u8, self.b)] {
                read |= mine.glimpse == Some(glimpse) && shape.may_be(of, slot, op.trans, op.len);
            }
        }
        self.transposed_reuse |= read;
        read
    }

    fn shape(&self) -> AnchorShape {
        AnchorShape {
            sig: self.sig,
            len: [self.a.len, self.b.len],
            trans: [self.a.trans, self.b.trans],
        }
    }
}

/// Whether an operand's bytes were captured and kept their CRC-32.
fn same(now: Option<u32>, before: Option<u32>) -> bool {
    now.is_some() && now == before
}

/// How far `now`'s values moved from `before`'s (see [`Sample::change_from`]), when both
/// were sampled.
fn change(now: &Operand, before: &Operand) -> Option<f64> {
    match (&now.sample, &before.sample) {
        (Some(n), Some(b)) => n.change_from(b),
        _ => None,
    }
}

impl Anchor {
    /// A recurrence with operands `a` and `b`: whether it starts a new step (see
    /// [`Anchor::one_held`]). They become the anchor's previous occurrence.
    fn recur(&mut self, a: Operand, b: Operand) -> bool {
        let (same_a, same_b) = (same(a.crc, self.a.crc), same(b.crc, self.b.crc));
        let new_step = match (same_a, same_b) {
            (true, true) => false,
            // One operand held its bytes. Usually the weights, and the other is the next
            // micro-batch; but when the other only moved a little it was updated in place
            // (an optimizer step) and the unchanged one is an input fed again (one batch
            // trained on repeatedly).
            (true, false) => {
                let before = self.b;
                self.one_held(0, &b, &before)
            }
            (false, true) => {
                let before = self.a;
                self.one_held(1, &a, &before)
            }
            (false, false) => true,
        };
        self.a = a;
        self.b = b;
        self.transposed_reuse = false;
        new_step
    }

    /// A recurrence in which operand slot `held` kept its bytes and the other one is `now`
    /// (it was `before`): whether it starts a new step. Clearly new values in the other slot
    /// are the next micro-batch under the held weights (and teach which slot holds weights).
    /// Values that moved only a little are an optimizer's nudge of the other slot (one batch
    /// trained on repeatedly: the held one is that input), unless the held slot is already
    /// known as the weights: then they are new data that happens to resemble the last (deep
    /// activations of a model with a large common component do).
    fn one_held(&mut self, held: u8, now: &Operand, before: &Operand) -> bool {
        match change(now, before) {
            Some(c) if c >= UPDATE_MAX_CHANGE => {
                self.weights = Some(held);
                false
            }
            Some(_) => self.weights != Some(held),
            None => false,
        }
    }
}

/// The shape of one step in GEMM ordinals, as the `auto` rule learns it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct StepShape {
    /// Offsets from the step's first GEMM of the GEMMs of the anchor's signature.
    anchors: Vec<u64>,
    /// Of those, the anchor's recurrences: 0 (the step's start) and the micro-batches'.
    recurrences: Vec<u64>,
    /// Offsets of the GEMMs that read the anchor's operand bytes in another orientation (the
    /// backward pass).
    transposed: Vec<u64>,
}

/// A step shape that repeated ([`PERIOD_AFTER`] steps in a row): from [`Period::from`] on the
/// `auto` rule reads the operands only of the GEMMs where the anchor recurred, and takes the
/// others for other layers without reading them (docs/format.md, "Step numbering",
/// "Periods"). It is learned from the GEMMs of the anchor's signature alone, which every
/// capture feeds the rule whatever is selected, so every capture of a run learns the same
/// period at the same GEMM; the hooks then copy nothing of the other GEMMs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Period {
    /// The ordinal of the GEMM whose step offsets count from.
    pub origin: u64,
    /// The first ordinal the period applies to.
    pub from: u64,
    /// GEMMs a step.
    pub len: u64,
    /// The anchor's signature.
    pub sig: u64,
    /// Offsets of the GEMMs of the anchor's signature (sorted).
    pub anchors: Vec<u64>,
    /// Offsets of the recurrences (sorted; 0 starts a step).
    pub recurrences: Vec<u64>,
    /// Offsets of the GEMMs that read the anchor's operand bytes in another orientation.
    pub transposed: Vec<u64>,
}

impl Period {
    /// The offset within its step of the GEMM of `ordinal` (at least [`Period::from`]).
    pub fn offset(&self, ordinal: u64) -> u64 {
        ordinal.saturating_sub(self.origin) % self.len
    }

    /// Where the GEMM of `ordinal` (at or after [`Period::from`]) falls, of the anchor's
    /// signature (`anchor`) or not: `None` off the period, where it has a GEMM of the other
    /// kind (the program left its loop, or changed it: the period breaks there); else whether
    /// the rule reads its operands (a recurrence). The one statement of it for the rule, the
    /// hooks and the hooks' history (prefilter.rs).
    pub fn place(&self, anchor: bool, ordinal: u64) -> Option<bool> {
        let off = self.offset(ordinal);
        (self.anchors.binary_search(&off).is_ok() == anchor)
            .then(|| anchor && self.recurrences.binary_search(&off).is_ok())
    }
}

/// The step state of one process.
#[derive(Debug)]
pub struct Steps<T> {
    rule: StepRule,
    step: u64,
    /// Records emitted into the current step.
    in_step: u64,
    anchor: Option<Anchor>,
    /// Recurrences of the anchor taken for micro-batches of the current step.
    micro_batches: u64,
    /// Records from the first arrival after the last GEMM on, waiting for the next GEMM.
    held: VecDeque<T>,
    max_held: usize,
    /// Marks the rule applied (`nvtx:NAME`, `api`), whether or not they started a step.
    marks: u64,
    /// Learning a period (`auto`): the ordinal of the current step's first GEMM (`None`:
    /// nothing to learn from until the next step starts) and its shape so far.
    shape_from: Option<u64>,
    shape: StepShape,
    /// The last whole step's length and shape, and how many steps in a row had them.
    last_shape: Option<(u64, StepShape)>,
    repeats: u32,
    /// The period followed, if any, and how many were taken.
    period: Option<Period>,
    periods: u32,
    /// Recurrences the period placed whose bytes said otherwise (a step start whose operands
    /// kept their bytes, a micro-batch whose did not): the bytes decide.
    contradicted: u64,
    /// Periods broken by a GEMM where the period had none of its kind.
    broken: u32,
    /// Within a period, the ordinal of the last recurrence read.
    last_read: Option<u64>,
    /// The ordinal of the last GEMM fed that had one.
    last_ordinal: Option<u64>,
}

impl<T> Steps<T> {
    /// A fresh state at step 0.
    pub fn new(rule: StepRule) -> Steps<T> {
        Steps {
            rule,
            step: 0,
            in_step: 0,
            anchor: None,
            micro_batches: 0,
            held: VecDeque::new(),
            max_held: MAX_HELD,
            marks: 0,
            shape_from: None,
            shape: StepShape::default(),
            last_shape: None,
            repeats: 0,
            period: None,
            periods: 0,
            contradicted: 0,
            broken: 0,
            last_read: None,
            last_ordinal: None,
        }
    }

    /// Bounds the held-back records (tests use a small bound).
    pub fn with_max_held(mut self, n: usize) -> Steps<T> {
        self.max_held = n.max(1);
        self
    }

    /// The current step.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The anchor GEMM's signature and operands, once one was seen (`auto` only): other
    /// GEMMs' operands matter to the rule only as [`AnchorShape::may_see`] says.
    pub fn anchor(&self) -> Option<AnchorShape> {
        self.anchor.as_ref().map(Anchor::shape)
    }

    fn emit(&mut self, item: T, out: &mut impl FnMut(T, u64)) {
        self.in_step += 1;
        out(item, self.step);
    }

    fn release_held(&mut self, out: &mut impl FnMut(T, u64)) {
        while let Some(h) = self.held.pop_front() {
            self.emit(h, out);
        }
    }

    /// Feeds the next record; `out` receives every record whose step is decided, in order.
    pub fn push(&mut self, item: T, class: Class, out: &mut impl FnMut(T, u64)) {
        if self.rule != StepRule::Auto {
            self.emit(item, out);
            return;
        }
        match class {
            Class::Gemm { sig, a, b, ordinal } => {
                match self.decide(sig, a, b, ordinal) {
                    Some(true) => {
                        // The held records (the next batch arriving) open the new step with it.
                        self.step += 1;
                        self.in_step = 0;
                        self.micro_batches = 0;
                    }
                    Some(false) => self.micro_batches += 1,
                    None => {}
                }
                self.release_held(out);
                self.emit(item, out);
            }
            Class::Arrival | Class::Other if !self.held.is_empty() => {
                self.held.push_back(item);
                if self.held.len() >= self.max_held {
                    // Too much waiting: it stays in the current step.
                    self.release_held(out);
                }
            }
            Class::Arrival if self.anchor.is_some() => self.held.push_back(item),
            Class::Arrival | Class::Other => self.emit(item, out),
        }
    }

    /// The period followed, if any (the tracer tells the hooks, prefilter.rs).
    pub fn period(&self) -> Option<&Period> {
        self.period.as_ref()
    }

    /// A GEMM at `ordinal` that the rule did not see (its hook left it out) disagreed with the
    /// period (the hooks' signature history says so, prefilter.rs): the period ends there, as
    /// it would at that GEMM had it been fed.
    pub fn period_broken_at(&mut self, ordinal: u64) {
        if self.period.as_ref().is_some_and(|p| ordinal >= p.from) {
            self.break_period(Some(ordinal));
        }
    }

    /// Ends the period at the GEMM of `at` (`None`: one without an ordinal, after the last
    /// GEMM that had one). Nothing was observed while it was followed: whether the anchor's
    /// bytes were read in another orientation since its last recurrence is what the period
    /// says of the GEMMs in between (it held up to there), as the rule reading every GEMM
    /// would have seen.
    fn break_period(&mut self, at: Option<u64>) {
        let at = at.or(self.last_ordinal.map(|o| o + 1));
        let read = match (&self.period, self.last_read, at) {
            (Some(p), Some(last), Some(at)) => {
                let (from, to) = (p.offset(last), p.offset(at));
                (at.saturating_sub(last) >= p.len && !p.transposed.is_empty())
                    || p.transposed.iter().any(|&t| {
                        if from < to {
                            from < t && t < to
                        } else {
                            t > from || t < to
                        }
                    })
            }
            _ => false,
        };
        self.period = None;
        self.last_read = None;
        self.broken += 1;
        self.shape_from = None;
        self.last_shape = None;
        self.repeats = 0;
        if let Some(anchor) = &mut self.anchor {
            anchor.transposed_reuse = read;
        }
    }

    /// [`Steps::recurrence`], or within a period [`Steps::follow`]; learns the period.
    fn decide(&mut self, sig: u64, a: Operand, b: Operand, ordinal: Option<u64>) -> Option<bool> {
        let r = self.decide_at(sig, a, b, ordinal);
        self.last_ordinal = ordinal.or(self.last_ordinal);
        r
    }

    fn decide_at(
        &mut self,
        sig: u64,
        a: Operand,
        b: Operand,
        ordinal: Option<u64>,
    ) -> Option<bool> {
        if let Some(p) = &self.period {
            match ordinal {
                Some(o) if o >= p.from => match p.place(sig == p.sig, o) {
                    Some(reads) => return self.follow(o, reads, a, b),
                    None => self.break_period(Some(o)),
                },
                Some(_) => {}
                // A GEMM no hook counted (a graph's replay): the ordinals no longer say where
                // in its step a GEMM is.
                None => self.break_period(None),
            }
        }
        let first = self.anchor.is_none();
        let (r, read_transposed) = self.recurrence(sig, a, b);
        self.learn(first, sig, ordinal, r, read_transposed);
        r
    }

    /// Within the period: a recurrence where the period has one (`reads`; its bytes decide
    /// whether it starts a step), nothing elsewhere.
    fn follow(&mut self, ordinal: u64, reads: bool, a: Operand, b: Operand) -> Option<bool> {
        let starts = self.period.as_ref()?.offset(ordinal) == 0;
        let anchor = self.anchor.as_mut()?;
        if !reads {
            return None;
        }
        let new_step = anchor.recur(a, b);
        self.contradicted += u64::from(new_step != starts);
        self.last_read = Some(ordinal);
        Some(new_step)
    }

    /// Learns the shape of the steps from the GEMMs of the anchor's signature, and follows it
    /// as a period once [`PERIOD_AFTER`] steps in a row had it. (Ordinals fed out of order, by
    /// threads racing their GEMM calls, make shapes that do not repeat: no period.)
    /// `read_transposed`: the GEMM read the anchor's bytes in another orientation.
    fn learn(
        &mut self,
        first: bool,
        sig: u64,
        ordinal: Option<u64>,
        r: Option<bool>,
        read_transposed: bool,
    ) {
        let Some(o) = ordinal else {
            self.shape_from = None;
            self.repeats = 0;
            return;
        };
        let anchor_sig = self.anchor.as_ref().map_or(sig, |a| a.sig);
        match r {
            _ if first => self.start_shape(o),
            Some(true) => {
                if let Some(from) = self.shape_from {
                    let done = (o.saturating_sub(from), std::mem::take(&mut self.shape));
                    if self.last_shape.as_ref() == Some(&done) {
                        self.repeats += 1;
                    } else {
                        self.repeats = 1;
                        self.last_shape = Some(done);
                    }
                    self.take_period(o, anchor_sig);
                }
                self.start_shape(o);
            }
            Some(false) | None if sig == anchor_sig => {
                if let Some(from) = self.shape_from {
                    self.shape.anchors.push(o.saturating_sub(from));
                    if r.is_some() {
                        self.shape.recurrences.push(o.saturating_sub(from));
                    }
                }
            }
            _ => {}
        }
        if let (true, Some(from)) = (read_transposed, self.shape_from) {
            self.shape.transposed.push(o.saturating_sub(from));
        }
    }

    fn start_shape(&mut self, o: u64) {
        self.shape_from = Some(o);
        self.shape = StepShape {
            anchors: vec![0],
            recurrences: vec![0],
            transposed: Vec::new(),
        };
    }

    /// Follows the last shape as a period from the GEMM after `o` (which starts a step) when
    /// it repeated often enough.
    fn take_period(&mut self, o: u64, sig: u64) {
        let Some((len, shape)) = &self.last_shape else {
            return;
        };
        if self.repeats < PERIOD_AFTER
            || self.periods >= MAX_PERIODS
            || *len == 0
            || *len > MAX_PERIOD_LEN
        {
            return;
        }
        self.periods += 1;
        self.period = Some(Period {
            origin: o,
            from: o + 1,
            len: *len,
            sig,
            anchors: shape.anchors.clone(),
            recurrences: shape.recurrences.clone(),
            transposed: shape.transposed.clone(),
        });
    }

    /// A warning when a period's placement and the bytes disagreed (the bytes decided), or a
    /// period broke: what the rule did instead of reading every GEMM.
    pub fn period_note(&self) -> Option<String> {
        (self.contradicted > 0).then(|| {
            format!(
                "the auto step rule followed the period of the steps it learned (docs/format.md,                  \"Periods\"), and {} of the recurrences it placed read otherwise by their \
                 bytes (a step start whose operands kept their bytes, or a micro-batch whose \
                 did not); the bytes decided. If the steps look wrong, mark them \
                 (TTRACE_STEP_RULE=nvtx:NAME or api)",
                self.contradicted
            )
        })
    }

    /// Whether a GEMM recurs the anchor (`Some`: starting a new step or not), and records it
    /// as the anchor or a recurrence; `None` for the anchor itself and other GEMMs. With it,
    /// whether the GEMM read the anchor's operand bytes in another orientation.
    fn recurrence(&mut self, sig: u64, a: Operand, b: Operand) -> (Option<bool>, bool) {
        let Some(anchor) = &mut self.anchor else {
            self.anchor = Some(Anchor {
                sig,
                a,
                b,
                transposed_reuse: false,
                weights: None,
            });
            return (None, false);
        };
        if sig != anchor.sig {
            return (None, anchor.observe(a, b));
        }
        let unchanged = same(a.crc, anchor.a.crc) || same(b.crc, anchor.b.crc);
        let both_buffers = a.ptr == anchor.a.ptr && b.ptr == anchor.b.ptr;
        if !(unchanged || both_buffers || anchor.transposed_reuse) {
            // Another layer of the anchor's shape.
            return (None, anchor.observe(a, b));
        }
        (Some(anchor.recur(a, b)), false)
    }

    /// Whether the rule will read the fingerprints (CRC-32s and samples), not only the
    /// glimpses, of the operands of a GEMM of signature `sig` fed next, whose operands A and
    /// B are at `ptrs` with glimpses `glimpses`. Only a candidate recurrence (or the anchor
    /// itself) compares or keeps fingerprints ([`Steps::recurrence`]); another GEMM is only
    /// observed, by glimpses. A GEMM of the anchor's signature is a candidate only if an
    /// operand kept its bytes (then it kept its glimpse too), it reuses both buffers, or the
    /// anchor's bytes were read in another orientation since: when none of those can hold, the
    /// tracer leaves the fingerprints' CRC-32s uncomputed, and the rule decides the same.
    /// Within a period (`ordinal` at or after its start, agreeing with it) only a GEMM where
    /// the period has a recurrence.
    pub fn needs_fingerprints(
        &self,
        sig: u64,
        ptrs: [u64; 2],
        glimpses: [Option<u32>; 2],
        ordinal: Option<u64>,
    ) -> bool {
        if self.rule != StepRule::Auto {
            return false;
        }
        if let (Some(p), Some(o)) = (&self.period, ordinal) {
            if let Some(reads) = p.place(sig == p.sig, o).filter(|_| o >= p.from) {
                return reads;
            }
        }
        let Some(anchor) = &self.anchor else {
            return true;
        };
        let kept = |now: Option<u32>, before: Option<u32>| now.is_some() && now == before;
        sig == anchor.sig
            && (kept(glimpses[0], anchor.a.glimpse)
                || kept(glimpses[1], anchor.b.glimpse)
                || (ptrs[0] == anchor.a.ptr && ptrs[1] == anchor.b.ptr)
                || anchor.transposed_reuse)
    }

    /// A warning when the `auto` rule kept the whole run in step 0 although its first GEMM
    /// recurred as often as a training loop's would: a loop whose steps it could not tell
    /// apart (a frozen first layer, say) must not look like a one-step run.
    pub fn one_step_doubt(&self) -> Option<String> {
        (self.rule == StepRule::Auto && self.step == 0 && self.micro_batches >= DOUBT_RECURRENCES)
            .then(|| {
                format!(
                    "the auto step rule numbered the whole run step 0: its first GEMM recurred \
                     {} more times, each taken for a micro-batch (its operands kept their \
                     bytes). If this run trained several steps, mark them \
                     (TTRACE_STEP_RULE=nvtx:NAME with an NVTX range NAME around each step, \
                     e.g. PyTorch's torch.cuda.nvtx.range(\"NAME\"), or api with ttrace_step())",
                    self.micro_batches
                )
            })
    }

    /// A step mark: an NVTX range or mark named as the rule says (`nvtx:NAME`), or
    /// `ttrace_step()` (`api`). Ignored by the other rules.
    pub fn mark(&mut self, from_api: bool, nvtx_name: Option<&str>) {
        let applies = match &self.rule {
            StepRule::Api => from_api,
            StepRule::Nvtx(n) => nvtx_name == Some(n.as_str()),
            StepRule::Auto => false,
        };
        self.marks += u64::from(applies);
        if applies && self.in_step > 0 {
            self.step += 1;
            self.in_step = 0;
        }
    }

    /// A warning when a mark rule never saw its mark in a process that took records: the whole
    /// run is then step 0, which `--steps` and compare would take for a one-step run. `doubt`:
    /// the process took records and its rule's mark never came, not even before capture began
    /// (which the rule does not see: a mark there is a one-step run's). `seen` gives the NVTX
    /// names seen instead, outermost first, with their counts.
    pub fn unmarked_warning(
        &self,
        doubt: bool,
        seen: impl FnOnce() -> Vec<(String, u64)>,
    ) -> Option<String> {
        if self.marks > 0 || !doubt {
            return None;
        }
        match &self.rule {
            StepRule::Auto => None,
            StepRule::Api => Some(
                "TTRACE_STEP_RULE=api, but ttrace_step() was never called: the whole run is \
                 step 0"
                    .to_string(),
            ),
            StepRule::Nvtx(name) => {
                let seen = seen();
                let instead = if seen.is_empty() {
                    "no NVTX range or mark was seen at all".to_string()
                } else {
                    let names: Vec<String> = seen
                        .iter()
                        .take(5)
                        .map(|(n, c)| format!("`{n}` ({c})"))
                        .collect();
                    format!(
                        "the outermost names seen: {}{}",
                        names.join(", "),
                        if seen.len() > 5 { ", ..." } else { "" }
                    )
                };
                Some(format!(
                    "TTRACE_STEP_RULE=nvtx:{name}, but no NVTX range or mark named `{name}` was \
                     seen: the whole run is step 0 ({instead})"
                ))
            }
        }
    }

    /// A record of the current step that the rule never saw: a hook left it out before its
    /// ticket (prefilter.rs; under `nvtx:NAME` and `api` a record matters to the rule only as
    /// one of its step's). A mark after it starts a new step, as after the record itself.
    pub fn note_left_out(&mut self) {
        self.in_step += 1;
    }

    /// Releases everything held (end of the process) into the current step.
    pub fn flush(&mut self, out: &mut impl FnMut(T, u64)) {
        self.release_held(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(ptr: u64, crc: u32, trans: bool) -> Operand {
        Operand {
            ptr,
            crc: Some(crc),
            glimpse: Some(crc),
            len: 64,
            trans,
            sample: None,
        }
    }

    /// A forward GEMM of signature 7: A (weights, transposed) and B (activations).
    fn gemm(a: u64, a_crc: u32, b: u64, b_crc: u32) -> Class {
        Class::Gemm {
            sig: 7,
            a: op(a, a_crc, true),
            b: op(b, b_crc, false),
            ordinal: None,
        }
    }

    /// A backward GEMM (signature 8) reading `x` and `y` untransposed, as `dX = dY·W` and
    /// `dW = dYᵀ·X` read the forward's operands.
    fn backward(x: (u64, u32), y: (u64, u32)) -> Class {
        Class::Gemm {
            sig: 8,
            a: op(x.0, x.1, false),
            b: op(y.0, y.1, true),
            ordinal: None,
        }
    }

    fn run(rule: StepRule, items: &[(&'static str, Class)]) -> Vec<(&'static str, u64)> {
        let mut s = Steps::new(rule);
        let mut out = Vec::new();
        for &(name, class) in items {
            s.push(name, class, &mut |n, st| out.push((n, st)));
        }
        s.flush(&mut |n, st| out.push((n, st)));
        out
    }

    #[test]
    fn weights_that_change_start_a_step_from_the_batch_copy_on() {
        // Step 0: batch copy, forward GEMM (W=0x10 crc 1, x=0x20 crc 5), gradient all-reduce.
        // Step 1: batch copy, forward GEMM with updated W (crc 2) and a new batch (crc 6).
        let out = run(
            StepRule::Auto,
            &[
                ("h2d0", Class::Arrival),
                ("fwd0", gemm(0x10, 1, 0x20, 5)),
                ("allreduce0", Class::Other),
                ("h2d1", Class::Arrival),
                ("bcast1", Class::Other),
                ("fwd1", gemm(0x10, 2, 0x20, 6)),
                ("d2h1", Class::Other),
            ],
        );
        assert_eq!(
            out,
            vec![
                ("h2d0", 0),
                ("fwd0", 0),
                ("allreduce0", 0),
                ("h2d1", 1),
                ("bcast1", 1),
                ("fwd1", 1),
                ("d2h1", 1)
            ]
        );
    }

    #[test]
    fn micro_batches_with_unchanged_weights_stay_in_the_step() {
        let out = run(
            StepRule::Auto,
            &[
                ("fwd0", gemm(0x10, 1, 0x20, 5)),
                ("h2d", Class::Arrival),
                ("fwd0b", gemm(0x10, 1, 0x20, 9)),
                ("h2d", Class::Arrival),
                ("fwd1", gemm(0x10, 3, 0x20, 4)),
            ],
        );
        let steps: Vec<u64> = out.iter().map(|o| o.1).collect();
        assert_eq!(steps, vec![0, 0, 0, 1, 1]);
    }

    #[test]
    fn other_signatures_and_other_buffers_are_not_recurrences() {
        let other_sig = Class::Gemm {
            sig: 8,
            a: op(0x10, 9, true),
            b: op(0x20, 9, false),
            ordinal: None,
        };
        let out = run(
            StepRule::Auto,
            &[
                ("fwd", gemm(0x10, 1, 0x20, 5)),
                ("bwd", other_sig),
                ("elsewhere", gemm(0x30, 2, 0x40, 6)),
                // The next layer: same shape, the same activation buffer with new bytes, its
                // own weights.
                ("layer1", gemm(0x50, 3, 0x20, 7)),
                ("layer1_again", gemm(0x10, 4, 0x60, 8)),
            ],
        );
        assert!(out.iter().all(|o| o.1 == 0), "{out:?}");
    }

    #[test]
    fn uncaptured_operands_count_as_changed() {
        let blind = |ptr| Class::Gemm {
            sig: 7,
            a: Operand {
                ptr,
                crc: None,
                glimpse: None,
                len: 64,
                trans: true,
                sample: None,
            },
            b: Operand {
                ptr: 0x99,
                crc: None,
                glimpse: None,
                len: 64,
                trans: false,
                sample: None,
            },
            ordinal: None,
        };
        let out = run(StepRule::Auto, &[("a", blind(0x10)), ("b", blind(0x10))]);
        assert_eq!(out, vec![("a", 0), ("b", 1)]);
    }

    /// An operand at `ptr` with CRC `crc` whose elements are `value(i)` (1000 of them).
    fn valued(ptr: u64, crc: u32, trans: bool, value: impl Fn(usize) -> f64) -> Operand {
        Operand {
            sample: Sample::take(1000, |i| Some(value(i))),
            ..op(ptr, crc, trans)
        }
    }

    /// Weights of iteration `it`: fixed values an optimizer nudges by 0.1% a step.
    fn weights(it: u32) -> Operand {
        valued(0x10, 1 + it, true, move |i| {
            ((i * 7919 % 1000) as f64 / 500.0 - 1.0) * (1.0 + 0.001 * f64::from(it))
        })
    }

    /// Input batch number `n`: other values for each batch.
    fn batch(ptr: u64, n: u32) -> Operand {
        valued(ptr, 100 + n, false, move |i| {
            (((i as u64 + 1) * (u64::from(n) + 3) * 2654435761) % 1000) as f64 / 500.0 - 1.0
        })
    }

    fn forward(w: Operand, x: Operand) -> Class {
        Class::Gemm {
            sig: 7,
            a: w,
            b: x,
            ordinal: None,
        }
    }

    /// Overfitting one batch (a common first debugging run): the same input bytes every
    /// iteration, the weights updated in place. Each iteration is a step, not a micro-batch
    /// (the rule before sampling numbered the whole run as step 0).
    #[test]
    fn one_batch_trained_on_repeatedly_makes_one_step_per_iteration() {
        let x = batch(0x2000, 0);
        let mut items = Vec::new();
        for it in 0..3u32 {
            items.push(("fwd", forward(weights(it), x)));
            items.push(("other", Class::Other));
        }
        let steps: Vec<u64> = run(StepRule::Auto, &items).iter().map(|o| o.1).collect();
        assert_eq!(steps, [0, 0, 1, 1, 2, 2]);
    }

    /// The tracer samples only operands of GEMMs that may recur the anchor (tracer.rs,
    /// `may_recur_anchor`): the rule must decide alike when other GEMMs bring no samples.
    #[test]
    fn samples_of_gemms_of_other_signatures_change_no_step() {
        let sequence = |sampled: bool| {
            let mut items = Vec::new();
            for it in 0..3u32 {
                for mb in 0..2u32 {
                    let x = batch(0x2000 + u64::from(mb) * 0x100, 2 * it + mb);
                    items.push(("h2d", Class::Arrival));
                    items.push(("fwd", forward(weights(it), x)));
                    // The backward pass reads the forward's operands transposed (signature 8).
                    let (mut w, mut xt) = (weights(it), x);
                    (w.trans, xt.trans) = (false, true);
                    if !sampled {
                        (w.sample, xt.sample) = (None, None);
                    }
                    items.push((
                        "bwd",
                        Class::Gemm {
                            sig: 8,
                            a: xt,
                            b: w,
                            ordinal: None,
                        },
                    ));
                }
                items.push(("allreduce", Class::Other));
            }
            run(StepRule::Auto, &items)
        };
        let with = sequence(true);
        assert_eq!(with, sequence(false));
        let steps: Vec<u64> = with.iter().map(|o| o.1).collect();
        assert_eq!(steps.iter().max(), Some(&2), "three steps: {steps:?}");
    }

    /// Gradient accumulation with sampled operands: the weights hold their bytes over the
    /// micro-batches while new data replaces the input; the optimizer's nudge opens a step.
    #[test]
    fn new_data_under_unchanged_weights_is_a_micro_batch_and_a_nudge_a_step() {
        let mut items = Vec::new();
        for it in 0..2u32 {
            for mb in 0..2u32 {
                items.push(("h2d", Class::Arrival));
                items.push(("fwd", forward(weights(it), batch(0x2000, 2 * it + mb))));
            }
        }
        let steps: Vec<u64> = run(StepRule::Auto, &items).iter().map(|o| o.1).collect();
        assert_eq!(steps, [0, 0, 0, 0, 1, 1, 1, 1]);
    }

    /// Deep activations can resemble the last micro-batch's (a large common component): the
    /// input of a later pipeline stage moved by only a few percent between micro-batches in
    /// the trainer (bf16, 8 layers, pp=2, from step 4 on). Once the weights were seen held
    /// under clearly new data, such a small move under the same held weights is still a
    /// micro-batch, not an optimizer step (the rule before numbered 12-13 steps for 10).
    #[test]
    fn new_data_that_moves_little_under_known_weights_stays_a_micro_batch() {
        // Micro-batch inputs: a common component plus a small per-batch part; the first
        // step's second micro-batch differs clearly (its part is large), later ones barely.
        let input = |n: u32, spread: f64| {
            valued(0x3000, 500 + n, false, move |i| {
                let common = 5.0 + (i % 7) as f64;
                let own = (((i as u64 + 1) * (u64::from(n) + 3) * 2654435761) % 1000) as f64
                    / 500.0
                    - 1.0;
                common + spread * own
            })
        };
        let mut items = Vec::new();
        for it in 0..3u32 {
            for mb in 0..2u32 {
                let spread = if it == 0 { 10.0 } else { 0.05 };
                items.push(("recv", Class::Arrival));
                items.push(("fwd", forward(weights(it), input(2 * it + mb, spread))));
            }
        }
        let steps: Vec<u64> = run(StepRule::Auto, &items).iter().map(|o| o.1).collect();
        assert_eq!(steps, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
    }

    /// A frozen first layer: its weights never change, so every iteration looks like another
    /// micro-batch. The rule cannot see the steps, but it says so instead of staying silent.
    #[test]
    fn a_run_kept_in_step_0_by_many_recurrences_is_doubted_not_silent() {
        let frozen = weights(0);
        let run_of = |iterations: u32| {
            let mut s = Steps::new(StepRule::Auto);
            for it in 0..iterations {
                s.push((), forward(frozen, batch(0x2000, it)), &mut |_, _| {});
            }
            s
        };
        let doubt = run_of(4).one_step_doubt().expect("doubted");
        assert!(doubt.contains("3 more times"), "{doubt}");
        assert_eq!(
            run_of(3).one_step_doubt(),
            None,
            "two micro-batches: a plausible step"
        );
        // Steps were found: nothing to doubt.
        let mut s = Steps::new(StepRule::Auto);
        for it in 0..6u32 {
            s.push((), forward(weights(it), batch(0x2000, it)), &mut |_, _| {});
        }
        assert_eq!(s.step(), 5);
        assert_eq!(s.one_step_doubt(), None);
    }

    #[test]
    fn a_sample_moved_slightly_only_when_it_had_values_and_moved_little() {
        let s = |f: fn(usize) -> f64| Sample::take(100, |i| Some(f(i))).expect("sample");
        let base = s(|i| i as f64 + 1.0);
        assert!(s(|i| (i as f64 + 1.0) * 1.01).slightly_moved_from(&base));
        assert!(!s(|i| 100.0 - i as f64).slightly_moved_from(&base));
        // All zero before: any value is a replacement, not a nudge.
        assert!(!s(|_| 0.001).slightly_moved_from(&s(|_| 0.0)));
        // Non-finite elements are left out, not allowed to decide.
        assert!(s(|i| if i == 3 { f64::NAN } else { i as f64 + 1.0 }).slightly_moved_from(&base));
        // Operands of other sizes are not compared.
        let short = Sample::take(4, |i| Some(i as f64 + 1.0)).expect("sample");
        assert!(!short.slightly_moved_from(&base));
        assert_eq!(Sample::take(0, |_| Some(1.0)), None);
        assert_eq!(Sample::take(10, |_| None), None);
    }

    /// PyTorch: each iteration copies its batch into a fresh buffer, runs the forward GEMM on
    /// the persistent weights, the backward reads both operands transposed, the optimizer
    /// updates the weights in place.
    #[test]
    fn torch_fresh_activations_and_persistent_weights_make_one_step_per_iteration() {
        let mut items = Vec::new();
        for it in 0..3u32 {
            let x = (0x1000 + 0x100 * u64::from(it), 100 + it);
            let w = (0x10, 1 + it);
            items.push(("h2d", Class::Arrival));
            items.push(("fwd", gemm(w.0, w.1, x.0, x.1)));
            // The next layer, same shape: its own weights, the activation buffer of the
            // anchor (the caching allocator reused it).
            items.push(("fwd2", gemm(0x20, 50 + it, x.0, 200 + it)));
            items.push(("dgrad", backward(w, (0x3000, 300 + it))));
            items.push(("wgrad", backward(x, (0x3000, 300 + it))));
            items.push(("allreduce", Class::Other));
        }
        let out = run(StepRule::Auto, &items);
        let steps: Vec<u64> = out.iter().map(|o| o.1).collect();
        assert_eq!(
            steps,
            [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2]
        );
    }

    /// Mixed precision: the fp32 master weights are cast into a fresh bf16 buffer each
    /// iteration (nothing at the anchor's addresses again), with two micro-batches per step.
    #[test]
    fn torch_fresh_weight_casts_with_gradient_accumulation() {
        let mut items = Vec::new();
        for it in 0..3u32 {
            let w = (0x5000 + 0x100 * u64::from(it), 1 + it);
            for mb in 0..2u32 {
                let x = (0x9000 + 0x100 * u64::from(2 * it + mb), 100 + 2 * it + mb);
                items.push(("h2d", Class::Arrival));
                items.push(("fwd", gemm(w.0, w.1, x.0, x.1)));
                items.push(("wgrad", backward(x, (0x3000, 300 + it))));
                items.push(("dgrad", backward(w, (0x3000, 300 + it))));
            }
        }
        let out = run(StepRule::Auto, &items);
        let steps: Vec<u64> = out.iter().map(|o| o.1).collect();
        let want: Vec<u64> = (0..3).flat_map(|s| [s; 8]).collect();
        assert_eq!(steps, want);
    }

    /// A pipeline stage's 1F1B warm-up: two forwards before the first backward, fresh
    /// activation buffers, the first layer's input gradient never computed (only `dW` reads
    /// the anchor's input transposed).
    #[test]
    fn forwards_ahead_of_their_backwards_stay_in_the_step() {
        let mut items = Vec::new();
        for it in 0..2u32 {
            let w = (0x10, 1 + it);
            let xs = [
                (0x100 + u64::from(it), 10 + it),
                (0x200 + u64::from(it), 20 + it),
            ];
            items.push(("fwd", gemm(w.0, w.1, xs[0].0, xs[0].1)));
            items.push(("fwd", gemm(w.0, w.1, xs[1].0, xs[1].1)));
            for x in xs {
                items.push(("wgrad", backward(x, (0x3000, 300 + it))));
            }
        }
        let out = run(StepRule::Auto, &items);
        let steps: Vec<u64> = out.iter().map(|o| o.1).collect();
        assert_eq!(steps, [0, 0, 0, 0, 1, 1, 1, 1]);
    }

    /// A backward GEMM reading bytes whose CRC-32 equals an anchor operand's but of another
    /// length is no transposed reuse: only the same bytes are.
    #[test]
    fn equal_checksums_of_other_lengths_are_not_the_anchors_bytes() {
        let short = |ptr, crc| Operand {
            len: 32,
            ..op(ptr, crc, false)
        };
        let items = [
            ("fwd", gemm(0x10, 1, 0x100, 5)),
            // Fresh input buffer next time: only a transposed reuse makes it a candidate.
            (
                "bwd",
                Class::Gemm {
                    sig: 8,
                    a: short(0x10, 1),
                    b: short(0x200, 9),
                    ordinal: None,
                },
            ),
            ("fwd", gemm(0x10, 2, 0x300, 6)),
        ];
        let out = run(StepRule::Auto, &items);
        assert!(out.iter().all(|o| o.1 == 0), "{out:?}");
        // The same with the anchor's lengths is the backward pass: a new step.
        let items = [items[0], ("bwd", backward((0x10, 1), (0x200, 9))), items[2]];
        assert_eq!(run(StepRule::Auto, &items).last(), Some(&("fwd", 1)));
    }

    /// A backward GEMM whose operands were copied as glimpses only (no fingerprint: it cannot
    /// recur the anchor) is still the backward pass when a glimpse is the anchor's; the
    /// fingerprints never decide it, and a recurrence still needs them.
    #[test]
    fn a_backward_read_is_told_by_glimpses_alone() {
        // Operands over 1 MiB: the glimpse's CRC-32 is not the fingerprint's.
        let big = |ptr, crc: u32, trans| Operand {
            glimpse: Some(crc + 1000),
            len: 8 << 20,
            ..op(ptr, crc, trans)
        };
        // A fresh input buffer each time: only a read of the anchor's bytes in another
        // orientation makes the second forward a candidate.
        let fwd = |w: u32, x: u32| Class::Gemm {
            sig: 7,
            a: big(0x10, w, true),
            b: big(0x100 + u64::from(x), x, false),
            ordinal: None,
        };
        let glimpsed = |ptr, glimpse: u32, trans| Operand {
            crc: None,
            glimpse: Some(glimpse),
            ..big(ptr, 0, trans)
        };
        let bwd = |x_glimpse| Class::Gemm {
            sig: 8,
            a: glimpsed(0x200, 77, false),
            b: glimpsed(0x300, x_glimpse, true),
            ordinal: None,
        };
        // The anchor's input (fingerprint 5, glimpse 1005) read again: the next forward, with
        // new weights and a fresh batch, is a new step.
        let out = run(
            StepRule::Auto,
            &[("fwd", fwd(1, 5)), ("bwd", bwd(1005)), ("fwd", fwd(2, 6))],
        );
        assert_eq!(out.last(), Some(&("fwd", 1)));
        // A glimpse equal to the anchor's fingerprint (not its glimpse) is not its bytes.
        let out = run(
            StepRule::Auto,
            &[("fwd", fwd(1, 5)), ("bwd", bwd(5)), ("fwd", fwd(2, 6))],
        );
        assert!(out.iter().all(|o| o.1 == 0), "{out:?}");
    }

    /// Leaving a GEMM's fingerprints out where [`Steps::needs_fingerprints`] says the rule
    /// will not read them (glimpses kept) numbers every record as with them: over many
    /// seeded sequences of GEMMs of two signatures, few buffers, recurring bytes, bytes that
    /// changed outside the glimpse (a sparse update), both orientations, nudged samples.
    #[test]
    fn fingerprints_left_out_where_not_needed_change_no_step() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let sample = |v: f64| Sample::take(4, |i| Some(v + i as f64));
        for _ in 0..400 {
            let mut items = Vec::new();
            for _ in 0..(4 + next(40)) {
                let class = match next(6) {
                    0 => Class::Arrival,
                    1 => Class::Other,
                    _ => {
                        let sig = 7 + next(2);
                        let mut operand = || {
                            // Bytes are named by their CRC-32; a glimpse is a function of
                            // the bytes, shared by bytes that differ only between its pieces.
                            let crc = next(6) as u32;
                            let glimpse = crc / 2 + 100;
                            Operand {
                                ptr: 0x10 * (1 + next(3)),
                                crc: Some(crc),
                                glimpse: Some(glimpse),
                                len: 64,
                                trans: next(2) == 1,
                                sample: sample(
                                    next(3) as f64 * if next(2) == 0 { 1.0 } else { 1.05 },
                                ),
                            }
                        };
                        let (a, b) = (operand(), operand());
                        Class::Gemm {
                            sig,
                            a,
                            b,
                            ordinal: None,
                        }
                    }
                };
                items.push(class);
            }
            let (mut full, mut lean) = (Steps::new(StepRule::Auto), Steps::new(StepRule::Auto));
            let (mut want, mut got) = (Vec::new(), Vec::new());
            for (n, class) in items.iter().enumerate() {
                full.push(n, *class, &mut |n, s| want.push((n, s)));
                let class = match *class {
                    Class::Gemm {
                        sig,
                        a,
                        b,
                        ordinal: None,
                    } if !lean.needs_fingerprints(
                        sig,
                        [a.ptr, b.ptr],
                        [a.glimpse, b.glimpse],
                        None,
                    ) =>
                    {
                        let bare = |o: Operand| Operand {
                            crc: None,
                            sample: None,
                            ..o
                        };
                        Class::Gemm {
                            sig,
                            a: bare(a),
                            b: bare(b),
                            ordinal: None,
                        }
                    }
                    other => other,
                };
                lean.push(n, class, &mut |n, s| got.push((n, s)));
            }
            full.flush(&mut |n, s| want.push((n, s)));
            lean.flush(&mut |n, s| got.push((n, s)));
            assert_eq!(got, want, "{items:?}");
        }
    }

    #[test]
    fn layers_of_the_anchors_shape_before_the_backward_are_not_steps() {
        // Three layers of one shape, fresh buffers everywhere: no operand bytes recur and the
        // anchor's operands have not been read transposed yet.
        let out = run(
            StepRule::Auto,
            &[
                ("l0", gemm(0x10, 1, 0x100, 5)),
                ("h2d", Class::Arrival),
                ("l1", gemm(0x20, 2, 0x200, 6)),
                ("h2d", Class::Arrival),
                // Another GEMM reading the anchor's input the same way (a sibling projection
                // of the same input) is no backward.
                (
                    "kv",
                    Class::Gemm {
                        sig: 9,
                        a: op(0x30, 3, true),
                        b: op(0x100, 5, false),
                        ordinal: None,
                    },
                ),
                ("l2", gemm(0x40, 4, 0x300, 7)),
            ],
        );
        assert!(out.iter().all(|o| o.1 == 0), "{out:?}");
    }

    #[test]
    fn held_records_are_bounded() {
        let mut s = Steps::new(StepRule::Auto).with_max_held(2);
        let mut out = Vec::new();
        s.push(0, gemm(1, 1, 2, 2), &mut |n, st| out.push((n, st)));
        for i in 1..=3 {
            s.push(i, Class::Arrival, &mut |n, st| out.push((n, st)));
        }
        // Two held, released at the bound into step 0; the third is held again.
        assert_eq!(out, vec![(0, 0), (1, 0), (2, 0)]);
        s.push(4, gemm(1, 5, 2, 5), &mut |n, st| out.push((n, st)));
        assert_eq!(out[3..], [(3, 1), (4, 1)]);
    }

    #[test]
    fn a_mark_rule_that_never_saw_its_mark_says_so() {
        let seen = || vec![("forward".to_string(), 12), ("backward".to_string(), 3)];
        let s: Steps<u32> = Steps::new(StepRule::Nvtx("train_step".into()));
        let w = s.unmarked_warning(true, seen).expect("warned");
        assert!(w.contains("named `train_step`"), "{w}");
        assert!(w.contains("`forward` (12), `backward` (3)"), "{w}");
        let w = s.unmarked_warning(true, Vec::new).expect("warned");
        assert!(w.contains("no NVTX range or mark was seen at all"), "{w}");
        assert_eq!(
            s.unmarked_warning(false, seen),
            None,
            "no records, no doubt"
        );

        let mut s: Steps<u32> = Steps::new(StepRule::Nvtx("train_step".into()));
        s.mark(false, Some("train_step"));
        assert_eq!(
            s.unmarked_warning(true, seen),
            None,
            "one mark: a one-step run"
        );

        let mut s: Steps<u32> = Steps::new(StepRule::Api);
        assert!(s
            .unmarked_warning(true, seen)
            .unwrap()
            .contains("ttrace_step()"));
        s.mark(false, Some("train_step"));
        assert!(
            s.unmarked_warning(true, seen).is_some(),
            "an NVTX mark is not api's"
        );
        s.mark(true, None);
        assert_eq!(s.unmarked_warning(true, seen), None);

        // The mark came only before capture began (the tracer's `rule_marked()`): no doubt,
        // a one-step run.
        let s: Steps<u32> = Steps::new(StepRule::Nvtx("forward".into()));
        assert_eq!(s.unmarked_warning(false, seen), None);
        let s: Steps<u32> = Steps::new(StepRule::Api);
        assert_eq!(s.unmarked_warning(false, seen), None);

        let auto: Steps<u32> = Steps::new(StepRule::Auto);
        assert_eq!(auto.unmarked_warning(true, seen), None);
    }

    #[test]
    fn a_mark_after_records_left_out_starts_a_step_as_after_records() {
        let mut s: Steps<u32> = Steps::new(StepRule::Api);
        let mut out = Vec::new();
        s.mark(true, None);
        assert_eq!(s.step(), 0, "a mark before any record keeps step 0");
        s.note_left_out();
        s.mark(true, None);
        assert_eq!(s.step(), 1);
        s.mark(true, None);
        assert_eq!(s.step(), 1, "an empty step is not left");
        s.push(1, Class::Other, &mut |n, st| out.push((n, st)));
        s.note_left_out();
        s.mark(true, None);
        s.push(2, Class::Other, &mut |n, st| out.push((n, st)));
        assert_eq!(out, vec![(1, 1), (2, 2)]);
    }

    #[test]
    fn marks_start_steps_under_their_rule_only() {
        let mut s: Steps<u32> = Steps::new(StepRule::Nvtx("step".into()));
        let mut out = Vec::new();
        s.mark(false, Some("step"));
        s.push(1, Class::Other, &mut |n, st| out.push((n, st)));
        s.mark(false, Some("other"));
        s.mark(true, None);
        s.push(2, Class::Other, &mut |n, st| out.push((n, st)));
        s.mark(false, Some("step"));
        s.push(3, Class::Other, &mut |n, st| out.push((n, st)));
        assert_eq!(out, vec![(1, 0), (2, 0), (3, 1)]);

        let mut s: Steps<u32> = Steps::new(StepRule::Api);
        let mut out = Vec::new();
        s.push(1, Class::Other, &mut |n, st| out.push((n, st)));
        s.mark(false, Some("step"));
        s.push(2, Class::Other, &mut |n, st| out.push((n, st)));
        s.mark(true, None);
        s.push(3, Class::Other, &mut |n, st| out.push((n, st)));
        assert_eq!(out, vec![(1, 0), (2, 0), (3, 1)]);
    }

    /// What a training loop's GEMMs look like to the rule, numbered by ordinal: per step and
    /// micro-batch, a batch copy, the forward of two layers of the anchor's shape (weights
    /// W0, W1 held over the micro-batches), their backward (another signature, reading the
    /// forward's operands untransposed) and an all-reduce. `odd(step)` may change a step:
    /// `Eval` runs a forward pass only before it; `Skipped` leaves its weights unchanged (an
    /// optimizer step skipped, as a loss scaler does on overflow); `Extra` ends it with one
    /// more GEMM.
    fn training(steps: u32, odd: impl Fn(u32) -> Option<Odd>) -> Vec<Class> {
        let mut out = Vec::new();
        let mut ordinal = 0u64;
        let mut gemm = |out: &mut Vec<Class>, sig: u64, a: Operand, b: Operand| {
            out.push(Class::Gemm {
                sig,
                a,
                b,
                ordinal: Some(ordinal),
            });
            ordinal += 1;
        };
        let mut version = 0u32;
        for step in 0..steps {
            if odd(step) != Some(Odd::Skipped) {
                version = step;
            }
            if odd(step) == Some(Odd::Eval) {
                out.push(Class::Arrival);
                gemm(
                    &mut out,
                    7,
                    op(0x10, 1000 + version, true),
                    op(0x20, 90_000 + step, false),
                );
                gemm(
                    &mut out,
                    7,
                    op(0x30, 2000 + version, true),
                    op(0x40, 91_000 + step, false),
                );
            }
            for mb in 0..2 {
                let x = 5000 + 10 * step + mb;
                let (w0, w1) = (
                    op(0x10, 1000 + version, true),
                    op(0x30, 2000 + version, true),
                );
                // Fresh activation buffers each micro-batch, as a caching allocator hands out.
                let fresh = 0x1000 * u64::from(2 * step + mb);
                let (x0, x1) = (op(fresh, x, false), op(fresh + 0x40, x + 100_000, false));
                out.push(Class::Arrival);
                gemm(&mut out, 7, w0, x0);
                gemm(&mut out, 7, w1, x1);
                gemm(
                    &mut out,
                    8,
                    op(0x30, w1.crc.unwrap(), false),
                    op(0x50, x + 1, true),
                );
                gemm(
                    &mut out,
                    8,
                    op(0x10, w0.crc.unwrap(), false),
                    op(0x60, x + 2, true),
                );
                gemm(&mut out, 8, op(fresh, x, false), op(0x70, x + 3, true));
            }
            if odd(step) == Some(Odd::Extra) {
                gemm(&mut out, 9, op(0x80, 7, false), op(0x90, 8, false));
            }
            out.push(Class::Other);
        }
        out
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Odd {
        Eval,
        Skipped,
        /// One more GEMM (another signature) after the step's backward pass.
        Extra,
    }

    /// The steps of `items` fed to a fresh `auto` rule, in feeding order, and the rule.
    fn steps_of(items: &[Class]) -> (Vec<(usize, u64)>, Steps<usize>) {
        let mut s = Steps::new(StepRule::Auto);
        let mut out = Vec::new();
        for (n, class) in items.iter().enumerate() {
            s.push(n, *class, &mut |n, st| out.push((n, st)));
        }
        s.flush(&mut |n, st| out.push((n, st)));
        out.sort();
        (out, s)
    }

    /// `items` without ordinals: the rule reads every GEMM, as before it learned periods.
    fn unnumbered(items: &[Class]) -> Vec<Class> {
        items
            .iter()
            .map(|c| match *c {
                Class::Gemm { sig, a, b, .. } => Class::Gemm {
                    sig,
                    a,
                    b,
                    ordinal: None,
                },
                other => other,
            })
            .collect()
    }

    /// Feeds `items` as the hooks and the tracer do within a period: a GEMM the period does
    /// not read is left out by its hook (not fed) once the period is known, unless it
    /// disagrees with the period (the tracer, from the hooks' history, breaks the period at
    /// the first such GEMM it did not see). The steps of the records fed.
    fn steps_left_out(items: &[Class]) -> (Vec<(usize, u64)>, Steps<usize>) {
        let mut s = Steps::new(StepRule::Auto);
        let mut out = Vec::new();
        let mut broken_to = 0;
        for (n, class) in items.iter().enumerate() {
            if let (
                Class::Gemm {
                    sig,
                    ordinal: Some(o),
                    ..
                },
                Some(p),
            ) = (class, s.period())
            {
                if *o >= p.from {
                    match p.place(*sig == p.sig, *o) {
                        // A hook saw it disagree: it is fed, and breaks the period itself.
                        None if *o >= broken_to => broken_to = u64::MAX,
                        Some(false) if broken_to != u64::MAX => continue,
                        _ => {}
                    }
                }
            }
            if s.period().is_none() {
                broken_to = 0;
            }
            s.push(n, *class, &mut |n, st| out.push((n, st)));
        }
        s.flush(&mut |n, st| out.push((n, st)));
        out.sort();
        (out, s)
    }

    /// Feeds `items` as [`steps_left_out`] does and checks that every record fed gets the step
    /// `want` (every GEMM read) gives it; the lean rule and the records it got.
    fn assert_left_out_change_no_step(
        items: &[Class],
        want: &[(usize, u64)],
    ) -> (Vec<(usize, u64)>, Steps<usize>) {
        let (lean, rule) = steps_left_out(items);
        let fed: Vec<(usize, u64)> = want
            .iter()
            .copied()
            .filter(|(n, _)| lean.iter().any(|(m, _)| m == n))
            .collect();
        assert_eq!(lean, fed);
        (lean, rule)
    }

    /// The steps of `items` with their ordinals, checked to be those the rule gives them
    /// reading every GEMM (without ordinals); and the rule.
    fn numbered_as_every_gemm_read(items: &[Class]) -> (Vec<(usize, u64)>, Steps<usize>) {
        let (want, _) = steps_of(&unnumbered(items));
        let (full, rule) = steps_of(items);
        assert_eq!(full, want);
        (want, rule)
    }

    #[test]
    fn a_step_shape_that_repeats_is_followed_as_a_period_with_the_same_steps() {
        let items = training(12, |_| None);
        let (want, plain) = steps_of(&unnumbered(&items));
        assert!(plain.period().is_none());
        assert_eq!(want.last().map(|o| o.1), Some(11));
        let (full, rule) = steps_of(&items);
        assert_eq!(full, want);
        // Steps 0 and 1 had one shape: from the GEMM after step 2's first on, the period
        // (10 GEMMs a step; the anchor recurs at offsets 0 and 5).
        let p = rule.period().expect("a period");
        assert_eq!((p.origin, p.from, p.len), (20, 21, 10));
        assert_eq!(p.recurrences, vec![0, 5]);
        assert_eq!(p.anchors, vec![0, 1, 5, 6]);
        assert_eq!(rule.period_note(), None);
        // Left out by their hooks, the GEMMs the period does not read change no step.
        let (lean, _) = assert_left_out_change_no_step(&items, &want);
        assert!(
            lean.len() < want.len() - 50,
            "{} of {}",
            lean.len(),
            want.len()
        );
    }

    #[test]
    fn a_gemm_the_period_does_not_expect_breaks_it_and_the_rule_reads_every_gemm_again() {
        // An evaluation pass (a forward only) before step 6 moves every later GEMM off the
        // period: its second forward GEMM falls where the period has a backward one.
        let items = training(12, |s| (s == 6).then_some(Odd::Eval));
        let (want, rule) = numbered_as_every_gemm_read(&items);
        let (_, lean_rule) = assert_left_out_change_no_step(&items, &want);
        // Broken, and learned again after the evaluation.
        assert_eq!(rule.broken, 1);
        assert_eq!(lean_rule.broken, 1);
        assert!(rule.period().is_some_and(|p| p.from > 60));
    }

    #[test]
    fn a_period_broken_after_the_backward_pass_keeps_what_the_backward_read() {
        // Step 6 ends with one more GEMM, where the period has the next step's first: the
        // period breaks after the backward pass read the anchor's operands, which the rule
        // did not see. The next step still starts where the rule reading every GEMM starts it.
        let items = training(12, |s| (s == 6).then_some(Odd::Extra));
        let (want, rule) = numbered_as_every_gemm_read(&items);
        assert_eq!(want.last().map(|o| o.1), Some(11));
        assert_eq!(rule.broken, 1);
        assert_left_out_change_no_step(&items, &want);
    }

    #[test]
    fn within_a_period_the_bytes_decide_and_a_disagreement_is_said() {
        // Step 7's optimizer step was skipped: its weights kept their bytes, so the rule
        // takes it for more micro-batches of step 6, as without a period.
        let items = training(12, |s| (s == 7).then_some(Odd::Skipped));
        let (want, rule) = numbered_as_every_gemm_read(&items);
        assert_eq!(want.last().map(|o| o.1), Some(10));
        assert!(rule.period().is_some());
        assert!(rule
            .period_note()
            .is_some_and(|n| n.contains("1 of the recurrences")));
    }

    #[test]
    fn a_gemm_without_an_ordinal_breaks_the_period() {
        let mut items = training(12, |_| None);
        // A GEMM of a CUDA graph's replay, in step 5.
        let at = items.len() * 5 / 12;
        items.insert(
            at,
            Class::Gemm {
                sig: 9,
                a: op(0x98, 1, true),
                b: op(0x99, 2, false),
                ordinal: None,
            },
        );
        let before = items[..at]
            .iter()
            .rev()
            .find_map(|c| match c {
                Class::Gemm { ordinal, .. } => *ordinal,
                _ => None,
            })
            .expect("GEMMs before");
        let (out, rule) = steps_of(&items);
        assert_eq!(out, steps_of(&unnumbered(&items)).0);
        assert_eq!(rule.broken, 1);
        // The replays leave nothing to learn from until the next step starts: learned again,
        // after them.
        assert!(rule.period().is_some_and(|p| p.from > before + 1));
    }

    #[test]
    fn ordinals_out_of_order_are_taken_without_harm() {
        // Two threads racing their GEMM calls: ordinals reach the rule out of order (here,
        // neighbours swapped now and then, the same ordinal twice, and going back far).
        let items = training(12, |_| None);
        for shift in [1u64, 2, 3, 7] {
            let mut k = 0u64;
            let raced: Vec<Class> = items
                .iter()
                .map(|c| match *c {
                    Class::Gemm {
                        sig,
                        a,
                        b,
                        ordinal: Some(o),
                    } => {
                        k += 1;
                        let o = match k % shift {
                            0 => o.saturating_sub(shift * 3),
                            1 => o + 1,
                            _ => o,
                        };
                        Class::Gemm {
                            sig,
                            a,
                            b,
                            ordinal: Some(o),
                        }
                    }
                    other => other,
                })
                .collect();
            let (out, _) = steps_of(&raced);
            assert_eq!(out.len(), items.len());
        }
    }

    #[test]
    fn a_gemm_the_rule_did_not_see_breaks_the_period_where_it_was() {
        let items = training(6, |_| None);
        let (_, mut rule) = steps_of(&items[..items.len() / 2]);
        let from = rule.period().map(|p| p.from).expect("a period");
        rule.period_broken_at(from - 1);
        assert!(rule.period().is_some(), "before the period: nothing breaks");
        rule.period_broken_at(from + 3);
        assert!(rule.period().is_none());
    }
}
