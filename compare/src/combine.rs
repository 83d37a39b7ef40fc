//! Shard combination: how the run's shards of one reference tensor make the reference.
//! Slices must tile it ([`cover`]: surplus shards claiming one slice are judged at the free
//! ones, the rank whose place the slice is first); partial results must sum to it over a
//! communicator's groups ([`sum_groups`]); a partial result whose partners were not
//! captured cannot be judged ([`partners_missing`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::hints::{SumKey, SumMemory};
use crate::model::comms;
use crate::numerics::{self, Placement};
use crate::placement::{Placed, Shard};
use crate::trace::{RunTrace, Values};

/// How the shards of a tensor were put together to compare with the reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Merge {
    /// Every rank holds the whole tensor (each is compared with the reference).
    Replicated,
    /// Each rank holds a slice along `dim` (of the reference's row-major shape), viewed as
    /// `[outer, parts, inner]` along that dimension: `outer` > 1 means interleaved slices
    /// (DP batches in a sequence-first layout).
    Slice {
        /// Dimension of the reference's stored shape.
        dim: usize,
        /// Number of slices the dimension is cut into.
        parts: u64,
        /// Leading blocks of the dimension (1: contiguous slices).
        outer: u64,
    },
    /// The reference tensor is the sum of the shards of a communicator's members (partial
    /// results before a reduction), possibly also sliced.
    Sum {
        /// Ranks summed per group.
        group_size: u32,
    },
}

/// Whether a communicator `rank` belongs to (by the manifest's map) has members the store
/// holds no records of in `step`.
pub(crate) fn partners_missing(run: &RunTrace, rank: u32, step: u64) -> bool {
    comms::partners_missing(&run.manifest, rank, |m| !run.records(m, step).is_empty())
}

/// Shards must tile the reference: when several ranks claim the same slice while another
/// slice is claimed by nobody (two data-parallel ranks reading the same batch), the surplus
/// shards are judged at the unclaimed slices instead. Among shards that fit a free slice
/// equally (identical shards), the one with the larger `affinity` for it takes it: the rank
/// whose place in the layout is that slice, so that the blame falls on the rank whose shard
/// is wrong for its place.
pub(crate) fn cover(
    results: &mut [Shard],
    place_of: &mut [Placed],
    vals: &BTreeMap<(u32, u64), Values>,
    ref_vals: &Values,
    affinity: &dyn Fn(u32, &Placement) -> u32,
) {
    let Some(first) = place_of.first() else {
        return;
    };
    let structure = |p: &Placement| -> Vec<Vec<(u64, u64)>> {
        p.dims
            .iter()
            .map(|d| d.cuts.iter().map(|c| (c.parts, c.outer)).collect())
            .collect()
    };
    let shape = structure(&first.2);
    if place_of.iter().any(|p| structure(&p.2) != shape) {
        return;
    }
    // Every slice of that structure: the product of the chunks of every cut.
    let mut all: Vec<Placement> = vec![first.2.clone()];
    for (d, dim) in first.2.dims.iter().enumerate() {
        for (c, cut) in dim.cuts.iter().enumerate() {
            let mut next = Vec::new();
            for p in &all {
                for chunk in 0..cut.parts {
                    let mut q = p.clone();
                    q.dims[d].cuts[c].chunk = chunk;
                    next.push(q);
                }
            }
            all = next;
        }
    }
    let slices = all.len();
    if slices < 2 || !place_of.len().is_multiple_of(slices) {
        return;
    }
    let per_slice = place_of.len() / slices;
    let claims = |p: &Placement, place_of: &[Placed]| place_of.iter().filter(|q| q.2 == *p).count();
    let mut unclaimed: Vec<Placement> = all
        .iter()
        .filter(|p| claims(p, place_of) < per_slice)
        .cloned()
        .collect();
    while let Some(free) = unclaimed.pop() {
        // The surplus shard that fits the free slice best takes it.
        let surplus: Vec<usize> = (0..place_of.len())
            .filter(|&i| claims(&place_of[i].2, place_of) > per_slice)
            .collect();
        let best = surplus
            .iter()
            .filter_map(|&i| {
                let (rank, seq, _, scale) = &place_of[i];
                let x = vals.get(&(*rank, *seq))?;
                let f = numerics::full_fit(x, ref_vals, free.clone(), *scale);
                Some((i, f))
            })
            .min_by(|a, b| {
                // Equal fits within round-off of the comparison itself are ties.
                let (x, y) = (a.1.err.rel, b.1.err.rel);
                if (x - y).abs() <= 1e-9 * x.abs().max(y.abs()) {
                    let aff = |i: usize| affinity(place_of[i].0, &free);
                    aff(b.0).cmp(&aff(a.0))
                } else {
                    x.total_cmp(&y)
                }
            });
        let Some((i, f)) = best else { break };
        place_of[i].2 = free.clone();
        if let Some(r) = results
            .iter_mut()
            .find(|r| r.rank == place_of[i].0 && r.seq == place_of[i].1)
        {
            r.err = f.err;
        }
        if claims(&free, place_of) < per_slice {
            unclaimed.push(free);
        }
    }
}

/// How much better a group sum must fit than the shards placed alone to be taken: half
/// their worst error (a sum that only matches as badly explains nothing).
const SUM_MUST_HALVE: f64 = 0.5;

/// What a search for group sums reads: the shards, their values and the reference.
pub(crate) struct SumSearch<'a> {
    /// The shards' (rank, seq).
    pub(crate) shards: &'a [(u32, u64)],
    /// Their values, by (rank, seq).
    pub(crate) vals: &'a BTreeMap<(u32, u64), Values>,
    /// The reference tensor.
    pub(crate) ref_vals: &'a Values,
    /// Scales a sum may be divided by.
    pub(crate) scales: &'a [f32],
    /// The largest error at which a sum's placement is remembered.
    pub(crate) accept: f64,
    /// What distinguishes this kind of GEMM ([`crate::placement::kind_of`]).
    pub(crate) kind: &'a str,
    /// The verdict is settled: a sum is placed as cheaply as a single shard is then
    /// ([`numerics::place_with`]): a kind of sum that fits none of its known places is judged
    /// at the best of them, not searched for (after a divergence almost every sum fails, and
    /// its search was a sixth of compare's work).
    pub(crate) quick: bool,
}

/// The best group sum found: (group size, (each shard's error, where each sits)).
pub(crate) type SumFit = (u32, (Vec<Shard>, Vec<Placed>));

/// Tries the reference as the sum of a communicator's members' shards (row-parallel partial
/// outputs, data-parallel weight gradients): returns the group size and the shards' errors
/// against it, when that fits better than any single-shard placement (`current`).
pub(crate) fn sum_groups(
    run: &RunTrace,
    step: u64,
    s: &SumSearch<'_>,
    current: &[Shard],
    hints: &mut SumMemory,
) -> Option<SumFit> {
    let current_worst = current.iter().map(|s| s.err.rel).fold(0f64, f64::max);
    let mut best: Option<(f64, u32, Vec<Shard>, Vec<Placed>)> = None;
    for comm in candidate_comms(run, step, s, hints) {
        let Some(groups) = comms::sibling_groups(&run.manifest, comm, s.shards.iter().map(|x| x.0))
        else {
            continue;
        };
        let Some((results, places)) = fit_groups(comm, &groups, s, hints) else {
            continue;
        };
        if results.len() != s.shards.len() {
            continue;
        }
        let worst = results.iter().map(|s| s.err.rel).fold(0f64, f64::max);
        if worst < current_worst * SUM_MUST_HALVE && best.as_ref().is_none_or(|b| worst < b.0) {
            let size = groups.first().map_or(1, |g| g.len()) as u32;
            best = Some((worst, size, results, places));
        }
        if worst <= s.accept {
            break;
        }
    }
    best.map(|(_, size, r, p)| (size, (r, p)))
}

/// The sum-hint key of a group: (communicator, first rank of the group, shard shape,
/// reference shape, kind).
fn sum_key(comm: u64, first_rank: u32, shape: &[u64], s: &SumSearch<'_>) -> SumKey {
    (
        comm,
        first_rank,
        shape.to_vec(),
        s.ref_vals.shape.clone(),
        s.kind.to_string(),
    )
}

/// The communicators whose groups may hold the partial results, the one that fitted this
/// kind of tensor before first ([`known_first`]).
fn candidate_comms(run: &RunTrace, step: u64, s: &SumSearch<'_>, hints: &SumMemory) -> Vec<u64> {
    // Communicators the shards' ranks use in this step.
    let mut found: Vec<u64> = Vec::new();
    for &(rank, _) in s.shards {
        for &c in run.comms_used(rank, step) {
            if !found.contains(&c) {
                found.push(c);
            }
        }
    }
    // Collectives not captured (`--apis gemm`): every communicator of the manifest's map the
    // ranks belong to is a candidate group.
    if found.is_empty() {
        for c in &run.manifest.comms {
            let holds = s.shards.iter().any(|&(r, _)| c.members.contains(&Some(r)));
            if c.size > 1 && holds && !found.contains(&c.key) {
                found.push(c.key);
            }
        }
    }
    let first_rank = s.shards.iter().map(|x| x.0).min().unwrap_or(0);
    let shape = s
        .vals
        .values()
        .next()
        .map(|v| v.shape.clone())
        .unwrap_or_default();
    let known = |c: u64| hints.knows(&sum_key(c, first_rank, &shape, s));
    known_first(found, known, s.quick)
}

/// The communicators in the order their groups are tried: those known to hold this kind of
/// partial result first. Once the verdict is settled (`quick`), a known one is the only one
/// tried. Before, a sum that does not fit there is searched in the others too: two GEMMs
/// [`crate::placement::kind_of`] cannot tell apart may be partial over different
/// communicators (tensor- vs data-parallel), and taking the known group's misfit for a
/// divergence would report a bug in a correct run.
fn known_first(mut comms: Vec<u64>, known: impl Fn(u64) -> bool, quick: bool) -> Vec<u64> {
    comms.sort_by_key(|&c| !known(c));
    if quick && comms.first().is_some_and(|&c| known(c)) {
        comms.truncate(1);
    }
    comms
}

/// The sum of the shards of `group`'s members (`None`: a member's shard is missing or of
/// another shape).
fn group_sum(group: &[u32], s: &SumSearch<'_>) -> Option<Values> {
    let seq_of: BTreeMap<u32, u64> = s.shards.iter().copied().collect();
    let members: Vec<&Values> = group
        .iter()
        .map(|rank| seq_of.get(rank).and_then(|seq| s.vals.get(&(*rank, *seq))))
        .collect::<Option<_>>()?;
    let (first, rest) = members.split_first()?;
    if rest.iter().any(|v| v.shape != first.shape) {
        return None;
    }
    // In member order, element by element: ((m0 + m1) + m2) + ..., the first two added
    // into a new buffer (no copy of the first to add into).
    let data: Vec<f32> = match rest.split_first() {
        None => return Some((*first).clone()),
        Some((second, more)) => {
            let mut acc: Vec<f32> = first
                .data
                .iter()
                .zip(second.data.iter())
                .map(|(a, b)| a + b)
                .collect();
            // A longer first shard keeps its tail as it is (as adding into its copy did).
            acc.extend_from_slice(first.data.get(acc.len()..).unwrap_or(&[]));
            for v in more {
                for (a, b) in acc.iter_mut().zip(v.data.iter()) {
                    *a += *b;
                }
            }
            acc
        }
    };
    Some(Values {
        shape: first.shape.clone(),
        data: std::sync::Arc::new(data),
        dtype: first.dtype,
    })
}

/// Each group's sum placed in the reference; every member's shard takes its group's error.
/// `None` when a group has no sum or no placement.
fn fit_groups(
    comm: u64,
    groups: &[Vec<u32>],
    s: &SumSearch<'_>,
    hints: &mut SumMemory,
) -> Option<(Vec<Shard>, Vec<Placed>)> {
    let seq_of: BTreeMap<u32, u64> = s.shards.iter().copied().collect();
    let mut results = Vec::new();
    let mut places = Vec::new();
    for g in groups {
        let sum = group_sum(g, s)?;
        let key = sum_key(comm, g.first().copied().unwrap_or(0), &sum.shape, s);
        let known = hints.places(&key, s.quick);
        let f = numerics::place_with(&sum, s.ref_vals, known, s.scales, s.accept, s.quick)?;
        hints.placed(key, &f, s.accept);
        for rank in g {
            let seq = *seq_of.get(rank)?;
            results.push(Shard {
                rank: *rank,
                seq,
                err: f.err,
            });
            places.push((*rank, seq, f.placement.clone(), f.scale));
        }
    }
    Some((results, places))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::tests::{half, values};

    #[test]
    fn identical_shards_blame_the_rank_whose_place_they_do_not_fit() {
        let reference = values(&[1.0, 2.0, 3.0, 4.0]);
        // Rank 1 loaded rank 0's half: both fit the first half exactly.
        let vals: BTreeMap<(u32, u64), Values> = [
            ((0, 10), values(&[1.0, 2.0])),
            ((1, 10), values(&[1.0, 2.0])),
        ]
        .into_iter()
        .collect();
        let fit = |rank: u32| Shard {
            rank,
            seq: 10,
            err: numerics::full_fit(&vals[&(rank, 10)], &reference, half(0), 1.0).err,
        };
        let mut results = vec![fit(0), fit(1)];
        let mut place_of: Vec<Placed> = vec![(0, 10, half(0), 1.0), (1, 10, half(0), 1.0)];
        // Rank 1's place is the second half.
        let affinity =
            |rank: u32, p: &Placement| u32::from(u64::from(rank) == p.dims[0].cuts[0].chunk);
        cover(&mut results, &mut place_of, &vals, &reference, &affinity);
        assert_eq!(place_of[1].2, half(1));
        assert!(results[0].err.rel < 1e-9, "rank 0 holds its own half");
        assert!(results[1].err.rel > 0.1, "rank 1 is judged at its place");
    }

    fn search<'a>(
        shards: &'a [(u32, u64)],
        vals: &'a BTreeMap<(u32, u64), Values>,
        reference: &'a Values,
    ) -> SumSearch<'a> {
        SumSearch {
            shards,
            vals,
            ref_vals: reference,
            scales: &[1.0],
            accept: 0.02,
            kind: "cublasGemmEx",
            quick: false,
        }
    }

    #[test]
    fn row_parallel_partial_outputs_sum_to_the_reference_over_their_group() {
        let reference = values(&[1.0, 2.0, 3.0, 4.0]);
        // Each rank multiplied half of the inner dimension: partial results.
        let vals: BTreeMap<(u32, u64), Values> = [
            ((0, 7), values(&[0.25, 1.5, 1.0, 4.0])),
            ((1, 7), values(&[0.75, 0.5, 2.0, 0.0])),
        ]
        .into_iter()
        .collect();
        let shards = [(0, 7), (1, 7)];
        let s = search(&shards, &vals, &reference);
        let sum = group_sum(&[0, 1], &s).expect("both partials are there");
        assert_eq!(sum.data, reference.data);
        let mut hints = SumMemory::default();
        let (results, places) = fit_groups(0xa, &[vec![0, 1]], &s, &mut hints).expect("fits");
        assert!(results.iter().all(|r| r.err.rel < 1e-12));
        assert_eq!(places.len(), 2);
        assert_eq!(
            hints.clean.len(),
            1,
            "a clean sum is remembered for its group"
        );
        assert!(hints.provisional.is_empty());
    }

    #[test]
    fn after_the_verdict_a_sum_that_fits_none_of_its_known_places_is_judged_there() {
        let reference = values(&[1.0, 2.0, 3.0, 4.0]);
        // The group's sum is the second half, but this kind of sum sat at the first before.
        let vals: BTreeMap<(u32, u64), Values> =
            [((0, 7), values(&[1.0, 3.0])), ((1, 7), values(&[2.0, 1.0]))]
                .into_iter()
                .collect();
        let shards = [(0, 7), (1, 7)];
        let mut s = search(&shards, &vals, &reference);
        let key = sum_key(0xa, 0, &[2], &s);
        let known = || SumMemory {
            clean: [(key.clone(), vec![(half(0), 1.0)])].into(),
            ..SumMemory::default()
        };
        // Before it, the sum is searched for: it sits exactly at the second half.
        let (results, places) = fit_groups(0xa, &[vec![0, 1]], &s, &mut known()).expect("fits");
        assert_eq!(places[0].2, half(1));
        assert!(results[0].err.rel < 1e-12);
        // After it (the tensors only feed the worst-tensor table), no search: the known place.
        s.quick = true;
        let (results, places) = fit_groups(0xa, &[vec![0, 1]], &s, &mut known()).expect("fits");
        assert_eq!(places[0].2, half(0));
        assert!(results[0].err.rel > 0.1);
    }

    #[test]
    fn a_sum_that_fitted_only_loosely_is_judged_at_that_place_after_the_verdict() {
        let reference = values(&[1.0, 2.0, 3.0, 4.0]);
        // The group's sum is the second half, a third off: it fits there loosely.
        let loose: BTreeMap<(u32, u64), Values> =
            [((0, 7), values(&[2.0, 3.0])), ((1, 7), values(&[2.0, 2.0]))]
                .into_iter()
                .collect();
        let shards = [(0, 7), (1, 7)];
        let mut s = search(&shards, &loose, &reference);
        let mut memory = SumMemory::default();
        let (results, places) = fit_groups(0xa, &[vec![0, 1]], &s, &mut memory).expect("fits");
        assert_eq!(places[0].2, half(1));
        assert!(results[0].err.rel > s.accept);
        assert!(
            memory.clean.is_empty(),
            "a loose fit is no place to look first"
        );
        let key = sum_key(0xa, 0, &[2], &s);
        assert_eq!(memory.provisional.get(&key), Some(&(half(1), 1.0)));
        // A later sum of that kind that would fit the first half exactly: after the verdict
        // it is judged at the provisional place (in this step or any later one), before it
        // searched for.
        let exact_first: BTreeMap<(u32, u64), Values> =
            [((0, 7), values(&[0.5, 1.0])), ((1, 7), values(&[0.5, 1.0]))]
                .into_iter()
                .collect();
        s.vals = &exact_first;
        s.quick = true;
        let (results, places) = fit_groups(0xa, &[vec![0, 1]], &s, &mut memory).expect("fits");
        assert_eq!(places[0].2, half(1));
        assert!(results[0].err.rel > 0.1);
        s.quick = false;
        let (results, places) = fit_groups(0xa, &[vec![0, 1]], &s, &mut memory).expect("fits");
        assert_eq!(places[0].2, half(0));
        assert!(results[0].err.rel < 1e-12);
    }

    #[test]
    fn a_known_group_is_tried_first_and_alone_only_after_the_verdict() {
        // 0xb held this kind of partial result before; 0xa and 0xc did not.
        let known = |c: u64| c == 0xb;
        assert_eq!(
            known_first(vec![0xa, 0xb, 0xc], known, false),
            [0xb, 0xa, 0xc]
        );
        assert_eq!(known_first(vec![0xa, 0xb, 0xc], known, true), [0xb]);
        assert_eq!(known_first(vec![0xa, 0xc], known, true), [0xa, 0xc]);
    }

    #[test]
    fn a_group_missing_a_members_shard_has_no_sum() {
        let reference = values(&[1.0, 2.0]);
        let vals: BTreeMap<(u32, u64), Values> =
            [((0, 7), values(&[1.0, 2.0]))].into_iter().collect();
        let shards = [(0, 7)];
        let s = search(&shards, &vals, &reference);
        assert!(group_sum(&[0, 1], &s).is_none());
        let other_shape: BTreeMap<(u32, u64), Values> =
            [((0, 7), values(&[1.0, 2.0])), ((1, 7), values(&[1.0]))]
                .into_iter()
                .collect();
        let shards = [(0, 7), (1, 7)];
        assert!(group_sum(&[0, 1], &search(&shards, &other_shape, &reference)).is_none());
    }

    #[test]
    fn slices_that_already_tile_the_reference_stay_where_they_are() {
        let reference = values(&[1.0, 2.0, 3.0, 4.0]);
        let vals: BTreeMap<(u32, u64), Values> = [
            ((0, 10), values(&[1.0, 2.0])),
            ((1, 10), values(&[3.0, 4.0])),
        ]
        .into_iter()
        .collect();
        let fit = |rank: u32, chunk: u64| Shard {
            rank,
            seq: 10,
            err: numerics::full_fit(&vals[&(rank, 10)], &reference, half(chunk), 1.0).err,
        };
        let mut results = vec![fit(0, 0), fit(1, 1)];
        let mut place_of: Vec<Placed> = vec![(0, 10, half(0), 1.0), (1, 10, half(1), 1.0)];
        cover(&mut results, &mut place_of, &vals, &reference, &|_, _| 0);
        assert_eq!(
            (place_of[0].2.clone(), place_of[1].2.clone()),
            (half(0), half(1))
        );
        assert!(results.iter().all(|r| r.err.rel < 1e-12));
    }
}
