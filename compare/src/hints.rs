//! Placement memory: where shards of a kind of tensor sat before (tried first next time),
//! and what the current step has learnt about how its tensors are judged (see [`Memory`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::layout::LayoutSummary;
use crate::numerics::{self, Placement};

/// A kind of tensor on a rank: (rank, role slot, shard shape, reference shape, kind).
pub(crate) type HintKey = (u32, usize, Vec<u64>, Vec<u64>, String);

/// A kind of group sum: (communicator, first rank of the group, shard shape, reference shape,
/// kind). Each group sits at its own slice.
pub(crate) type SumKey = (u64, u32, Vec<u64>, Vec<u64>, String);

/// Placements that fitted a group sum cleanly before, by kind of sum.
pub(crate) type SumHints = BTreeMap<SumKey, Vec<(Placement, f32)>>;

/// Where group sums sat: where to look first, and where to judge a kind of sum that never
/// fitted cleanly once the verdict is settled.
#[derive(Default)]
pub(crate) struct SumMemory {
    /// Placements that fitted a kind of sum cleanly: tried first (kept across steps, as
    /// [`Memory::hints`] are).
    pub(crate) clean: SumHints,
    /// The first place found for a kind of sum that fitted loosely, in any step: after the
    /// verdict (quick) such a sum is judged there without a search (as [`Memory::provisional`]
    /// is for single shards).
    pub(crate) provisional: BTreeMap<SumKey, (Placement, f32)>,
}

impl SumMemory {
    /// The places to try for `key`: its clean ones; once the verdict is settled (`quick`),
    /// its provisional one when it has no clean one.
    pub(crate) fn places(&self, key: &SumKey, quick: bool) -> &[(Placement, f32)] {
        match (self.clean.get(key), self.provisional.get(key)) {
            (Some(known), _) => known,
            (None, Some(p)) if quick => std::slice::from_ref(p),
            _ => &[],
        }
    }

    /// Whether a sum of `key` fitted cleanly before.
    pub(crate) fn knows(&self, key: &SumKey) -> bool {
        self.clean.contains_key(key)
    }

    /// Remembers where a sum of `key` fitted: a clean fit (within `accept`) as where to look
    /// first, a loose one as its provisional place when it has none yet.
    pub(crate) fn placed(&mut self, key: SumKey, fit: &numerics::Fit, accept: f64) {
        if fit.err.rel <= accept {
            remember(self.clean.entry(key).or_default(), fit);
        } else {
            self.provisional
                .entry(key)
                .or_insert_with(|| (fit.placement.clone(), fit.scale));
        }
    }
}

/// Keeps the last few distinct placements that fitted (several ops share a key).
pub(crate) fn remember(known: &mut Vec<(Placement, f32)>, f: &numerics::Fit) {
    if let Some(i) = known
        .iter()
        .position(|(p, s)| *p == f.placement && *s == f.scale)
    {
        let k = known.remove(i);
        known.insert(0, k);
    } else {
        known.insert(0, (f.placement.clone(), f.scale));
        known.truncate(4);
    }
}

/// Placements that fitted before, per kind of tensor: tried first next time.
///
/// The hints are only where to look first: a hint is kept only when it fits clearly or
/// every other placement is far worse (the place a search would find), so they are carried
/// from step to step. What decides how a tensor is judged (whether a misfit is a divergence
/// or a partial sum, which rank a free slice belongs to, whether the verdict is settled) is
/// learnt anew in every step ([`Memory::start_step`]), so that a step is judged the same
/// whether it is compared alone (a partition) or after the others. The provisional places
/// are carried too: they are used only after the verdict, whose tensors' numbers may differ
/// between a partition and the whole run anyway (a diverged shard fits no place well), and
/// searching every kind of diverged tensor again in every step was half of compare's
/// placement work on a run with a bug.
#[derive(Default)]
pub(crate) struct Memory {
    /// Placements that fitted a kind of tensor whole, per rank.
    pub(crate) hints: BTreeMap<HintKey, Vec<(Placement, f32)>>,
    /// Where group sums sat.
    pub(crate) sums: SumMemory,
    /// Kinds placed whole and clearly in this step (a misfit is then a divergence, not a
    /// missing sum).
    pub(crate) placed_whole: BTreeSet<HintKey>,
    /// Kinds that were partial results earlier in this step (go straight to the group sums).
    pub(crate) needs_sum: BTreeSet<HintKey>,
    /// The first place found for a kind that fitted loosely, in any step (reused, without a
    /// search, once the verdict is settled, while the kind has no clean place).
    pub(crate) provisional: BTreeMap<HintKey, (Placement, f32)>,
    /// Where each rank's shards cleanly sat: (rank, slices of a cut) → slice → times.
    pub(crate) usual: Usual,
}

impl Memory {
    /// Forgets what judged the previous step's tensors; keeps where to look first.
    pub(crate) fn start_step(&mut self) {
        self.placed_whole.clear();
        self.needs_sum.clear();
        self.usual.clear();
    }

    /// The placements that fitted `key` before, most recent first.
    pub(crate) fn known(&self, key: &HintKey) -> &[(Placement, f32)] {
        self.hints.get(key).map_or(&[][..], |v| v.as_slice())
    }

    /// A clean fit of `key`: where to look first next time, a kind placed whole in this
    /// step, and one more clean placement of the rank at each slice of its cuts.
    pub(crate) fn placed_clean(&mut self, key: &HintKey, fit: &numerics::Fit) {
        remember(self.hints.entry(key.clone()).or_default(), fit);
        self.placed_whole.insert(key.clone());
        for cut in fit.placement.dims.iter().flat_map(|d| d.cuts.iter()) {
            *self
                .usual
                .entry((key.0, cut.parts))
                .or_default()
                .entry(cut.chunk)
                .or_default() += 1;
        }
    }

    /// A loose fit of `key`: the first one is kept as its provisional place.
    pub(crate) fn placed_loosely(&mut self, key: &HintKey, fit: &numerics::Fit) {
        self.provisional
            .entry(key.clone())
            .or_insert_with(|| (fit.placement.clone(), fit.scale));
    }

    /// How much `rank` belongs at `p` in `layout` (see [`slice_affinity`]).
    pub(crate) fn affinity(&self, layout: &LayoutSummary, rank: u32, p: &Placement) -> u32 {
        slice_affinity(&self.usual, layout, rank, p)
    }
}

/// (rank, slices of a cut) → which slice → how many clean placements put it there.
pub(crate) type Usual = BTreeMap<(u32, u64), BTreeMap<u64, u32>>;

/// How much `rank` belongs at placement `p`: for every cut of `p`, the clean placements of
/// the rank's earlier shards in the step at that slice, plus one when the rank's tensor- or
/// data-parallel coordinate in the layout is that slice's index.
pub(crate) fn slice_affinity(
    usual: &Usual,
    layout: &LayoutSummary,
    rank: u32,
    p: &Placement,
) -> u32 {
    let (tp, dp, _) = crate::layout::coords(layout, rank);
    let mut a = 0;
    for cut in p.dims.iter().flat_map(|d| d.cuts.iter()) {
        a += 2 * usual
            .get(&(rank, cut.parts))
            .and_then(|m| m.get(&cut.chunk))
            .copied()
            .unwrap_or(0);
        let coord = if cut.parts == u64::from(layout.tp) {
            tp
        } else {
            dp
        };
        a += u32::from(u64::from(coord) == cut.chunk);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::{Fit, ShardError};
    use crate::placement::tests::half;

    fn fit(chunk: u64, scale: f32) -> Fit {
        Fit {
            placement: half(chunk),
            scale,
            err: ShardError {
                rel: 0.0,
                norm_ratio: 1.0,
                ref_sq: 1.0,
                worst_row: None,
            },
        }
    }

    fn key(rank: u32) -> HintKey {
        (rank, 0, vec![2], vec![4], "cublasGemmEx".into())
    }

    #[test]
    fn the_latest_place_is_tried_first_and_only_four_are_kept() {
        let mut known = Vec::new();
        for (chunk, scale) in [(0, 1.0), (1, 1.0), (0, 2.0), (1, 2.0), (0, 4.0)] {
            remember(&mut known, &fit(chunk, scale));
        }
        assert_eq!(known.len(), 4);
        assert_eq!(known[0], (half(0), 4.0));
        assert!(!known.contains(&(half(0), 1.0)), "the oldest is forgotten");
        // A place seen again moves to the front instead of being repeated.
        remember(&mut known, &fit(1, 1.0));
        assert_eq!(known[0], (half(1), 1.0));
        assert_eq!(known.len(), 4);
    }

    #[test]
    fn a_new_step_forgets_how_tensors_were_judged_but_not_where_they_sat() {
        let mut mem = Memory::default();
        mem.placed_clean(&key(1), &fit(1, 1.0));
        mem.needs_sum.insert(key(2));
        mem.placed_loosely(&key(3), &fit(0, 1.0));
        assert!(mem.placed_whole.contains(&key(1)));
        mem.start_step();
        assert_eq!(mem.known(&key(1)), &[(half(1), 1.0)][..]);
        assert!(mem.placed_whole.is_empty() && mem.needs_sum.is_empty());
        assert!(mem.usual.is_empty());
        // Used only after the verdict: carried.
        assert_eq!(mem.provisional.get(&key(3)), Some(&(half(0), 1.0)));
    }

    #[test]
    fn a_rank_belongs_where_its_shards_sat_cleanly_and_where_its_coordinate_points() {
        let layout = crate::layout::parse("tp=2,dp=1").expect("a layout");
        let mut mem = Memory::default();
        // Rank 1's tensor-parallel coordinate is 1: one point for the second half.
        assert_eq!(mem.affinity(&layout, 1, &half(1)), 1);
        assert_eq!(mem.affinity(&layout, 1, &half(0)), 0);
        // Each clean placement of its shards at the first half counts two.
        mem.placed_clean(&key(1), &fit(0, 1.0));
        mem.placed_clean(&key(1), &fit(0, 1.0));
        assert_eq!(mem.affinity(&layout, 1, &half(0)), 4);
        // A loose fit says nothing about where the rank belongs.
        mem.placed_loosely(&key(1), &fit(1, 1.0));
        assert_eq!(mem.affinity(&layout, 1, &half(1)), 1);
    }
}
