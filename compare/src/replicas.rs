//! Replica drift: weights that the members of a communicator hold bitwise identically (those
//! of data-parallel replicas, tensor-parallel replicated parameters) must stay identical in
//! every later step; replicated activations are not held to it (they do not persist, below).
//! Replicas that drift apart, e.g. one replica applying a slightly different update, may each
//! stay within tolerance of the reference (in BF16 the drift hides below its resolution), so
//! the per-tensor comparison alone would let them pass.
//!
//! Data-driven, no layout convention: for each compared GEMM operand (A or B; outputs are
//! not replicated by construction) and each communicator of two or more ranks all holding
//! that operand, the first step where they all hold it decides: bitwise identical (same
//! CRC-32) and not a constant tensor (a zero-initialised buffer is identical everywhere by
//! accident) makes it a replicated tensor of that group; every later step's copies must then
//! share one CRC, when the tensor persists from step to step (most values within 12.5% of
//! the last identical copy's and correlated with them, [`crate::check::persistent::persists`]:
//! a weight moved by its updates; an activation computed from new data that happened to agree
//! is not held to it). The ranks blamed are those outside the majority; with no majority (two
//! replicas), those whose copy is farther from the reference.

use std::collections::{BTreeMap, HashSet};

use rayon::prelude::*;

use serde::{Deserialize, Serialize};
use ttrace_format::record::{Record, Role};

use crate::report::{TensorComparison, TensorList};
use crate::trace::RunTrace;
use crate::CompareError;

/// Replicas of a tensor that stopped being identical.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaDrift {
    /// Index into the report's `tensors` of the first comparison where they differ.
    pub tensor: u64,
    /// The step where they differ first.
    pub step: u64,
    /// The last step where they were identical.
    pub identical_in: u64,
    /// The communicator's members (global ranks) holding the replicas.
    pub group: Vec<u32>,
    /// The ranks whose copy differs (see the module doc for how they are chosen).
    pub ranks: Vec<u32>,
    /// GEMM API and operand, e.g. `cublasGemmEx A`.
    pub operand: String,
    /// NVTX path of the op, when recorded.
    pub nvtx: Option<String>,
}

/// A compared operand's identity across steps: the reference GEMM's ordinal among those of its
/// signature in its step ([`ordinals`]), API, role, shape.
type Kind = (u64, String, String, Vec<u64>);

/// What is known of one (group, kind): the step it was found identical in, once found.
#[derive(Clone, Copy)]
enum State {
    /// Identical (and not constant) in the comparison at this index of `tensors`.
    Replicated(usize),
    /// Not a replicated tensor of this group (differed or constant when first seen), or
    /// already reported.
    Settled,
}

/// Finds replica drift among the compared `tensors` (in execution order) of `run`, given the
/// reference GEMMs' ordinals by signature ([`signature_ordinals`]). Read a step at a time
/// (the tensors come step after step): what is held is one step's operands and what is
/// known of each (group, kind), whatever the number of steps.
pub fn drift(
    ordinal: &BTreeMap<(u64, u64), u64>,
    run: &RunTrace,
    tensors: &TensorList,
) -> Result<Vec<ReplicaDrift>, CompareError> {
    let groups = groups(run);
    let mut walk = Drift {
        run,
        tensors,
        groups: &groups,
        state: BTreeMap::new(),
        first: HashSet::new(),
        found: Vec::new(),
    };
    let mut step: Vec<(usize, TensorComparison)> = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let t = t.map_err(CompareError::Results)?;
        if step.first().is_some_and(|(_, s)| s.step != t.step) {
            // The next step's records, read while this one's copies are looked at.
            run.read_ahead(t.step);
            walk.step(&std::mem::take(&mut step), ordinal)?;
        }
        // Only GEMM operands can be replicated tensors.
        if operand_kind(&t, ordinal).is_some() {
            step.push((i, t.into_owned()));
        }
    }
    walk.step(&step, ordinal)?;
    Ok(walk.found)
}

/// [`drift`] as it goes.
struct Drift<'a> {
    run: &'a RunTrace,
    tensors: &'a TensorList,
    groups: &'a [Vec<u32>],
    state: BTreeMap<(usize, Kind), State>,
    /// The (group, kind)s whose first occurrence was seen.
    first: HashSet<(usize, Kind)>,
    found: Vec<ReplicaDrift>,
}

impl Drift<'_> {
    /// Takes in one step's compared operands (index in the report, comparison), in order.
    fn step(
        &mut self,
        step: &[(usize, TensorComparison)],
        ordinal: &BTreeMap<(u64, u64), u64>,
    ) -> Result<(), CompareError> {
        let seen = occurrences(self.run, step, self.groups, ordinal);
        let constants = first_constants(self.run, step, &seen, &mut self.first)?;
        for (o, occ) in seen.iter().enumerate() {
            let (i, t) = (occ.tensor, &step[occ.at].1);
            let copies = &occ.copies;
            let key = (occ.group, occ.kind.clone());
            match self.state.get(&key).copied() {
                // First seen: replicated when its copies agree and are not one value
                // throughout.
                None => {
                    let replicated = constants[o] == Some(false);
                    self.state.insert(
                        key,
                        if replicated {
                            State::Replicated(i)
                        } else {
                            State::Settled
                        },
                    );
                }
                Some(State::Replicated(since)) => {
                    if copies.iter().all(|c| c.1 == copies[0].1) {
                        self.state.insert(key, State::Replicated(i));
                        continue;
                    }
                    self.state.insert(key, State::Settled);
                    let before = self.tensors.read(since).map_err(CompareError::Results)?;
                    // Only a tensor that persists from step to step (a weight moved by its
                    // updates) must stay replicated; one replaced by new data each step (an
                    // activation that happened to agree) need not.
                    if !persists(self.run, &before, t, occ.role, copies[0].0)? {
                        continue;
                    }
                    self.found.push(ReplicaDrift {
                        tensor: i as u64,
                        step: t.step,
                        identical_in: before.step,
                        group: self.groups[occ.group].clone(),
                        ranks: blame(copies, t),
                        operand: format!("{} {}", t.api, t.role),
                        nvtx: t.nvtx.clone(),
                    });
                }
                Some(State::Settled) => {}
            }
        }
        Ok(())
    }
}

/// A compared GEMM operand's role and identity across steps; `None` for other tensors.
fn operand_kind(t: &TensorComparison, ordinal: &BTreeMap<(u64, u64), u64>) -> Option<(Role, Kind)> {
    let role = match t.role.as_str() {
        "A" => Role::A,
        "B" => Role::B,
        _ => return None,
    };
    let &n = ordinal.get(&(t.step, t.ref_seq))?;
    Some((role, (n, t.api.clone(), t.role.clone(), t.shape.clone())))
}

/// A compared GEMM operand's copies on the members of one replica group.
struct Occurrence {
    /// Index into the report's comparisons.
    tensor: usize,
    /// Index into the step's operands.
    at: usize,
    role: Role,
    kind: Kind,
    /// Index into the groups.
    group: usize,
    /// (rank, CRC-32) of each member's copy.
    copies: Vec<(u32, u32)>,
}

/// Every operand of a step (index in the report, comparison) on every group whose members all
/// captured it, in execution order (comparisons, then groups): what [`drift`] walks, from
/// checksums alone.
fn occurrences(
    run: &RunTrace,
    step: &[(usize, TensorComparison)],
    groups: &[Vec<u32>],
    ordinal: &BTreeMap<(u64, u64), u64>,
) -> Vec<Occurrence> {
    let mut out = Vec::new();
    for (at, (i, t)) in step.iter().enumerate() {
        let Some((role, kind)) = operand_kind(t, ordinal) else {
            continue;
        };
        for (g, members) in groups.iter().enumerate() {
            if let Some(copies) = copies(run, t, role, members) {
                out.push(Occurrence {
                    tensor: *i,
                    at,
                    role,
                    kind: kind.clone(),
                    group: g,
                    copies,
                });
            }
        }
    }
    out
}

/// By occurrence: for the first of its group and kind (none in `first`, which it adds to)
/// whose copies agree, whether that copy is [`constant`] (`None` for the others). The only
/// tests that read tensor values there, made on every thread of the pool (each reads its
/// tensors whole), since which occurrences they are follows from checksums alone.
fn first_constants(
    run: &RunTrace,
    step: &[(usize, TensorComparison)],
    seen: &[Occurrence],
    first: &mut HashSet<(usize, Kind)>,
) -> Result<Vec<Option<bool>>, CompareError> {
    let wanted: Vec<usize> = (0..seen.len())
        .filter(|&o| {
            let occ = &seen[o];
            first.insert((occ.group, occ.kind.clone()))
                && occ.copies.iter().all(|c| c.1 == occ.copies[0].1)
        })
        .collect();
    // A reader per thread: a store's reader is not shared between threads.
    let threads = rayon::current_num_threads().max(1);
    let share = wanted.len().div_ceil(threads).max(1);
    let shares: Vec<(RunTrace, &[usize])> =
        wanted.chunks(share).map(|c| (run.reader(), c)).collect();
    let tested: Vec<Result<Vec<(usize, bool)>, CompareError>> = shares
        .into_par_iter()
        .map(|(reader, share)| {
            share
                .iter()
                .map(|&o| {
                    let occ = &seen[o];
                    let t = &step[occ.at].1;
                    let one = constant(&reader, t, occ.role, occ.copies[0].0)?;
                    Ok((o, one))
                })
                .collect()
        })
        .collect();
    let mut out = vec![None; seen.len()];
    for t in tested {
        for (o, one) in t? {
            out[o] = Some(one);
        }
    }
    Ok(out)
}

/// Adds each reference GEMM of `step` (`recs`: the reference's records there) to `out`, by
/// (step, seq): how many GEMMs of its signature (API, m, n, k, transposes) ran before it in
/// its step. A seq is no identity across steps: steps hold different other ops (the first
/// one, say, a framework's uploads of the initial weights), and a seq-keyed operand would be
/// new in every step whose seqs moved.
pub(crate) fn signature_ordinals(step: u64, recs: &[Record], out: &mut BTreeMap<(u64, u64), u64>) {
    let mut seen: BTreeMap<(&str, [u64; 5]), u64> = BTreeMap::new();
    for r in recs {
        let Some(g) = crate::trace::gemm(r) else {
            continue;
        };
        let sig = (
            r.api.as_str(),
            [g.m, g.n, g.k, u64::from(g.transa), u64::from(g.transb)],
        );
        let n = seen.entry(sig).or_default();
        out.insert((step, r.seq), *n);
        *n += 1;
    }
}

/// Communicators of two or more ranks (global ranks, sorted, deduplicated).
fn groups(run: &RunTrace) -> Vec<Vec<u32>> {
    crate::model::comms::groups(&run.manifest)
}

/// `(rank, CRC-32)` of the operand on every member of `members`, when every member holds it
/// captured in this comparison (`None` otherwise).
fn copies(
    run: &RunTrace,
    t: &TensorComparison,
    role: Role,
    members: &[u32],
) -> Option<Vec<(u32, u32)>> {
    members
        .iter()
        .map(|&m| {
            let held = t.ranks.iter().find(|r| r.rank == m)?;
            let rec = run.record(m, t.step, held.seq)?;
            let tensor = rec.tensors.iter().find(|x| x.role == role)?;
            tensor.captured.then_some((m, tensor.crc32))
        })
        .collect()
}

/// Whether the operand on `rank` in comparison `now` kept its values from comparison `before`
/// (see [`crate::check::persistent::persists`]).
fn persists(
    run: &RunTrace,
    before: &TensorComparison,
    now: &TensorComparison,
    role: Role,
    rank: u32,
) -> Result<bool, CompareError> {
    let values = |t: &TensorComparison| -> Result<Option<crate::decoded::Shared>, CompareError> {
        let Some(held) = t.ranks.iter().find(|r| r.rank == rank) else {
            return Ok(None);
        };
        let Some(rec) = run.record(rank, t.step, held.seq) else {
            return Ok(None);
        };
        Ok(run.values(&rec, role)?.map(|v| v.data))
    };
    Ok(match (values(before)?, values(now)?) {
        (Some(a), Some(b)) => crate::check::persistent::persists(&a, &b),
        _ => false,
    })
}

/// Whether the operand on `rank` holds one value throughout (or cannot be read as floats).
fn constant(
    run: &RunTrace,
    t: &TensorComparison,
    role: Role,
    rank: u32,
) -> Result<bool, CompareError> {
    let Some(held) = t.ranks.iter().find(|r| r.rank == rank) else {
        return Ok(true);
    };
    let Some(rec) = run.record(rank, t.step, held.seq) else {
        return Ok(true);
    };
    run.holds_one_value(&rec, role)
}

/// The ranks outside the most common CRC; without a strict majority, the copies farthest
/// from the reference (by the comparison's per-rank error).
fn blame(copies: &[(u32, u32)], t: &TensorComparison) -> Vec<u32> {
    let mut classes: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (rank, crc) in copies {
        classes.entry(*crc).or_default().push(*rank);
    }
    let error = |ranks: &[u32]| -> f64 {
        ranks
            .iter()
            .filter_map(|r| t.ranks.iter().find(|e| e.rank == *r))
            .map(|e| e.error_eps)
            .fold(0.0, f64::max)
    };
    let biggest = classes.values().map(Vec::len).max().unwrap_or(0);
    let majority: Vec<&Vec<u32>> = classes.values().filter(|c| c.len() == biggest).collect();
    // Tied: the class nearest the reference is taken as right.
    let keep: Vec<u32> = majority
        .into_iter()
        .min_by(|a, b| error(a).total_cmp(&error(b)))
        .cloned()
        .unwrap_or_default();
    let mut out: Vec<u32> = copies
        .iter()
        .map(|c| c.0)
        .filter(|r| !keep.contains(r))
        .collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Merge, RankError};

    fn cmp(errors: &[(u32, f64)]) -> TensorComparison {
        TensorComparison {
            position: 0,
            step: 1,
            ref_seq: 3,
            api: "cublasGemmEx".into(),
            role: "A".into(),
            nvtx: None,
            shape: vec![4, 4],
            dtype: "F32".into(),
            merge: Merge::Replicated,
            ranks: errors
                .iter()
                .map(|&(rank, error_eps)| RankError {
                    rank,
                    seq: 3,
                    error_eps,
                })
                .collect(),
            error_eps: 0.0,
            worst_row: None,
            norm_ratio: 1.0,
            tolerance_eps: 4.0,
            tolerance_source: "analytic".into(),
            diverged: false,
        }
    }

    #[test]
    fn the_minority_replica_is_blamed() {
        let t = cmp(&[(0, 0.5), (2, 0.5), (4, 0.1)]);
        assert_eq!(blame(&[(0, 7), (2, 7), (4, 9)], &t), vec![4]);
    }

    #[test]
    fn with_two_replicas_the_one_farther_from_the_reference_is_blamed() {
        let t = cmp(&[(0, 0.4), (2, 1.9)]);
        assert_eq!(blame(&[(0, 7), (2, 9)], &t), vec![2]);
        let t = cmp(&[(0, 2.5), (2, 0.3)]);
        assert_eq!(blame(&[(0, 7), (2, 9)], &t), vec![0]);
    }
}
