//! Step numbering (docs/format.md, "Step numbering"): which step each record belongs to.
//!
//! The tracer feeds records in host call order; [`Steps`] hands them back, in the same order,
//! with their step. Under the `auto` rule a record may be held back for a while: the records
//! from the first host-to-device copy or NCCL receive after a GEMM (the next batch arriving)
//! wait for the next GEMM, which decides whether they open a new step.
//!
//! `auto`: the **anchor** is the first GEMM (its signature: API, shape, transposes, types). A
//! later GEMM with the anchor's signature that reuses both of the anchor's operand buffers (A
//! and B at the same addresses) is a recurrence: if an operand still holds the bytes it held at
//! the previous recurrence (same CRC-32), it is another micro-batch of the same step; if both
//! changed, the optimizer ran and a new step begins. Both buffers, because later layers of the
//! same shape usually share the anchor's activation buffer while their weights live elsewhere:
//! one shared buffer with new bytes says nothing about the step. An operand whose bytes were
//! not captured (inputs off, size cap) counts as changed.
//!
//! `nvtx:NAME` and `api`: a mark ([`Steps::mark`]) starts a new step, unless the current step
//! has no record yet (so a mark before the first captured op does not leave step 0 empty).

use std::collections::VecDeque;

use ttrace_format::config::StepRule;

/// Records held back at most (count), before they are released into the current step.
pub const MAX_HELD: usize = 4096;

/// One operand of a GEMM as the step rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    /// Device address.
    pub ptr: u64,
    /// CRC-32 of its bytes, when captured.
    pub crc: Option<u32>,
}

/// What the step rule needs to know about a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A GEMM: a hash of its signature and its A and B operands.
    Gemm { sig: u64, a: Operand, b: Operand },
    /// A host-to-device copy or an NCCL receive: the next batch may be arriving.
    Arrival,
    /// Anything else.
    Other,
}

#[derive(Debug)]
struct Anchor {
    sig: u64,
    a_ptr: u64,
    b_ptr: u64,
    /// CRCs at the previous occurrence of the anchor's buffers.
    a_crc: Option<u32>,
    b_crc: Option<u32>,
}

/// The step state of one process.
#[derive(Debug)]
pub struct Steps<T> {
    rule: StepRule,
    step: u64,
    /// Records emitted into the current step.
    in_step: u64,
    anchor: Option<Anchor>,
    /// Records from the first arrival after the last GEMM on, waiting for the next GEMM.
    held: VecDeque<T>,
    max_held: usize,
}

impl<T> Steps<T> {
    /// A fresh state at step 0.
    pub fn new(rule: StepRule) -> Steps<T> {
        Steps {
            rule,
            step: 0,
            in_step: 0,
            anchor: None,
            held: VecDeque::new(),
            max_held: MAX_HELD,
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
            Class::Gemm { sig, a, b } => {
                let new_step = self.recurrence(sig, a, b);
                if new_step {
                    // The held records (the next batch arriving) open the new step with it.
                    self.step += 1;
                    self.in_step = 0;
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

    /// Whether a GEMM starts a new step (and records it as the anchor or a recurrence).
    fn recurrence(&mut self, sig: u64, a: Operand, b: Operand) -> bool {
        let Some(anchor) = &mut self.anchor else {
            self.anchor = Some(Anchor {
                sig,
                a_ptr: a.ptr,
                b_ptr: b.ptr,
                a_crc: a.crc,
                b_crc: b.crc,
            });
            return false;
        };
        if sig != anchor.sig || a.ptr != anchor.a_ptr || b.ptr != anchor.b_ptr {
            return false;
        }
        let same = |now: Option<u32>, before: Option<u32>| now.is_some() && now == before;
        let unchanged = same(a.crc, anchor.a_crc) || same(b.crc, anchor.b_crc);
        anchor.a_crc = a.crc;
        anchor.b_crc = b.crc;
        !unchanged
    }

    /// A step mark: an NVTX range or mark named as the rule says (`nvtx:NAME`), or
    /// `ttrace_step()` (`api`). Ignored by the other rules.
    pub fn mark(&mut self, from_api: bool, nvtx_name: Option<&str>) {
        let applies = match &self.rule {
            StepRule::Api => from_api,
            StepRule::Nvtx(n) => nvtx_name == Some(n.as_str()),
            StepRule::Auto => false,
        };
        if applies && self.in_step > 0 {
            self.step += 1;
            self.in_step = 0;
        }
    }

    /// Releases everything held (end of the process) into the current step.
    pub fn flush(&mut self, out: &mut impl FnMut(T, u64)) {
        self.release_held(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemm(a: u64, a_crc: u32, b: u64, b_crc: u32) -> Class {
        Class::Gemm {
            sig: 7,
            a: Operand {
                ptr: a,
                crc: Some(a_crc),
            },
            b: Operand {
                ptr: b,
                crc: Some(b_crc),
            },
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
            a: Operand {
                ptr: 0x10,
                crc: Some(9),
            },
            b: Operand {
                ptr: 0x20,
                crc: Some(9),
            },
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
            a: Operand { ptr, crc: None },
            b: Operand {
                ptr: 0x99,
                crc: None,
            },
        };
        let out = run(StepRule::Auto, &[("a", blind(0x10)), ("b", blind(0x10))]);
        assert_eq!(out, vec![("a", 0), ("b", 1)]);
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
}
