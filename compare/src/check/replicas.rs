//! Replica consistency: tensors a group must hold identically, compared bitwise (through the
//! CRC-32s the tracer recorded).
//!
//! * Outputs of all-reduce, all-gather and broadcast: every member receives the same bytes.
//! * GEMM weights across data-parallel replicas. Heuristic (no layout is recorded): on each
//!   rank, a GEMM is identified within its step by its NVTX module (innermost range), API, shape and transposes;
//!   when a GEMM recurs within a step (micro-batches, or forward and backward of the same
//!   module) and one operand keeps the same bytes while the other changes, that operand is a
//!   weight. A communicator's members form a replica group when, in some step, most of the
//!   weights they have in common are bitwise equal (data-parallel replicas; tensor-parallel
//!   shards never are, pipeline stages have no GEMM in common). In a replica group every
//!   common weight must be equal in every step; those that are not are findings, naming the
//!   ranks outside the majority (the steps before the first that showed the group to be
//!   replicas: one finding per step, for the first [`BEFORE_KEPT`] of them). With one
//!   micro-batch, weights are found by persistence across steps instead ([`persistent`]).
//!   Checked step by step: a step's weights are compared when the next step is read.
//! * In groups that are not weight replicas (tensor parallel): a replicated activation (the
//!   same GEMM of every layer sees identical inputs on all members) that stops agreeing from
//!   one layer on (a missing reduction upstream), and weight shards that differ yet share
//!   aligned 16-byte blocks (sliced from overlapping ranges); identical FP8 activations used
//!   with different scales on different members.
//! * In weight-replica groups: activations that are identical everywhere (the replicas read
//!   the same data).

use std::collections::{BTreeMap, BTreeSet};

use ttrace_format::record::{CollectiveKind, Op, Role};
use ttrace_format::store::Manifest;

use ttrace_format::dtype::DType;
use ttrace_format::reader::Store;

use crate::check::collectives::coll;
use crate::check::load::{Rec, Trace};
use crate::check::persistent;
use crate::check::report::{Finding, FindingKind};

/// What the replica checks found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Replica groups found (global ranks).
    pub groups: Vec<Vec<u32>>,
    /// Weight operands compared (one per group member and weight).
    pub compared: u64,
    pub findings: Vec<Finding>,
    /// Weights were found, but no rank holds them in two consecutive steps: whether the
    /// optimizer updated them (stale weights) was not judged.
    pub stale_unjudged: bool,
}

/// A GEMM's identity within a step on one rank: NVTX path, API, m, n, k, transposes, the
/// operand (A or B), and its occurrence among GEMMs of the same signature.
type WeightKey = (u64, String, String, [u64; 5], &'static str);

/// The ranks whose value is not the most common one (ties: the lowest value wins).
fn minority(values: &[(u32, u32)]) -> Vec<u32> {
    let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
    for (_, v) in values {
        *counts.entry(*v).or_default() += 1;
    }
    let top = counts
        .iter()
        .max_by_key(|(v, c)| (**c, std::cmp::Reverse(**v)))
        .map(|(v, _)| *v)
        .unwrap_or(0);
    values
        .iter()
        .filter(|(_, v)| *v != top)
        .map(|(r, _)| *r)
        .collect()
}

/// One rank's GEMMs used once in a step, by signature.
type Singles = BTreeMap<persistent::Signature, persistent::Single>;

/// The replica checks, fed step by step: collective calls as they complete
/// ([`Replicas::received`]), each step's records ([`Replicas::step`]). What is kept is bounded
/// whatever the number of steps: the step read last (its single-use GEMMs wait for the next
/// step, which decides which of them read weights), each rank's weights of its first two
/// consecutive steps (stale weights are judged there), each single-use signature's decision, and per
/// candidate group its counts and findings. A step's weights are compared across the groups
/// once the step after it is read ([`Group::step`]); what a group's findings mean is decided
/// at the end ([`Replicas::finish`]), when it is known whether some step showed it to be a
/// data-parallel replica group.
pub struct Replicas {
    /// The store the records come from (weights' bytes are read back from it).
    store: std::sync::Arc<Store>,
    /// Calls whose members received different outputs, by call key.
    received: BTreeMap<(u64, usize), Finding>,
    /// The candidate replica groups: the comm map's groups whose every member is in the store.
    groups: Vec<Group>,
    /// The step read last, not compared yet.
    held: Option<HeldStep>,
    /// Per rank and single-use signature: which operand is a weight (`None`: neither), decided
    /// on the first two consecutive steps holding the signature ([`persistent`]).
    decided: BTreeMap<u32, BTreeMap<persistent::Signature, Option<usize>>>,
    /// Per rank: the first of the first two consecutive steps it has weights in, and its
    /// weights of those two steps ([`frozen_weights`]); until such a pair is seen, the last
    /// step it had weights in.
    first_two: BTreeMap<u32, (u64, BTreeMap<WeightKey, Weight>)>,
}

/// A step's weights found by recurrence and its single-use GEMMs, by rank.
struct HeldStep {
    step: u64,
    weights: BTreeMap<u32, BTreeMap<WeightKey, Weight>>,
    singles: BTreeMap<u32, Singles>,
}

impl Replicas {
    /// The replica checks of the store `store` (whose ranks are `ranks`), with the candidate
    /// groups of `manifest`'s comm map.
    pub fn new(store: std::sync::Arc<Store>, manifest: &Manifest, ranks: &[u32]) -> Replicas {
        let groups = crate::model::comms::groups(manifest)
            .into_iter()
            .filter(|members| members.iter().all(|m| ranks.contains(m)))
            .map(Group::new)
            .collect();
        Replicas {
            store,
            received: BTreeMap::new(),
            groups,
            held: None,
            decided: BTreeMap::new(),
            first_two: BTreeMap::new(),
        }
    }

    /// Members of an all-reduce, all-gather or broadcast must receive identical bytes.
    pub fn received(&mut self, (comm, n): (u64, usize), recs: &[&Rec]) {
        let Some(c0) = recs.first().and_then(|r| coll(r)) else {
            return;
        };
        if !matches!(
            c0.kind,
            CollectiveKind::AllReduce | CollectiveKind::AllGather | CollectiveKind::Broadcast
        ) || recs.len() != c0.comm_size as usize
        {
            return;
        }
        let crcs: Vec<(u32, u32)> = recs
            .iter()
            .filter_map(|r| {
                let i = r.find(Role::Output)?;
                let t = &r.record.tensors[i];
                t.captured.then_some((r.record.rank, t.crc32))
            })
            .collect();
        if crcs.len() != recs.len() {
            return;
        }
        let bad = minority(&crcs);
        if !bad.is_empty() {
            self.received.insert(
                (comm, n),
                Finding {
                    kind: FindingKind::ReplicaMismatch,
                    step: recs[0].record.step,
                    ranks: bad.clone(),
                    op: format!("{:?} #{n} on comm {comm:#x}", c0.kind),
                    module: recs[0].record.nvtx.last().cloned().unwrap_or_default(),
                    detail: format!(
                        "members received different outputs: ranks {bad:?} differ from the others of {:?}",
                        crcs.iter().map(|(r, _)| *r).collect::<Vec<_>>()
                    ),
                },
            );
        }
    }

    /// Takes the weight operands and single-use GEMMs of the records of `trace` (one step's,
    /// as [`super::load::stream`] gives them; a whole trace is taken step by step), and
    /// compares the step before across the groups.
    pub fn step(&mut self, trace: &Trace) {
        let mut steps: BTreeMap<u64, HeldStep> = BTreeMap::new();
        for &rank in &trace.ranks {
            let recs: Vec<&Rec> = trace.of_rank(rank).collect();
            if recs.is_empty() {
                continue;
            }
            for (key, w) in rank_weights(&recs) {
                held_step(&mut steps, key.0)
                    .weights
                    .entry(rank)
                    .or_default()
                    .insert(key, w);
            }
            for (sig, by_step) in persistent::singles(&recs) {
                for (step, single) in by_step {
                    held_step(&mut steps, step)
                        .singles
                        .entry(rank)
                        .or_default()
                        .insert(sig.clone(), single);
                }
            }
        }
        for (_, next) in steps {
            self.push(next);
        }
    }

    /// Holds `next`, after deciding the single-use signatures it and the step held before
    /// share (when consecutive) and comparing that step.
    fn push(&mut self, next: HeldStep) {
        if let Some(held) = self.held.take() {
            if held.step + 1 == next.step {
                self.decide(&held, &next);
            }
            self.compare(held);
        }
        self.held = Some(next);
    }

    /// Decides, rank by rank, the single-use signatures `a` and the step after it `b` both
    /// hold and that no earlier pair decided ([`persistent::weight_operands`]).
    fn decide(&mut self, a: &HeldStep, b: &HeldStep) {
        for (&rank, sa) in &a.singles {
            let Some(sb) = b.singles.get(&rank) else {
                continue;
            };
            let decided = self.decided.entry(rank).or_default();
            let pairs: BTreeMap<persistent::Signature, BTreeMap<u64, persistent::Single>> = sa
                .iter()
                .filter(|(sig, _)| !decided.contains_key(*sig))
                .filter_map(|(sig, ua)| {
                    let ub = sb.get(sig)?;
                    Some((
                        sig.clone(),
                        BTreeMap::from([(a.step, ua.clone()), (b.step, ub.clone())]),
                    ))
                })
                .collect();
            let weights = persistent::weight_operands(&self.store, &pairs);
            for sig in pairs.into_keys() {
                let op = weights.get(&sig).copied();
                decided.insert(sig, op);
            }
        }
    }

    /// Compares a step's weights (those found by recurrence, and the single-use GEMMs' decided
    /// to be weights) across the groups, and keeps each rank's first two consecutive steps'.
    fn compare(&mut self, held: HeldStep) {
        let HeldStep {
            step,
            mut weights,
            singles,
        } = held;
        let no_decisions = BTreeMap::new();
        for (rank, singles) in &singles {
            let found = weights.entry(*rank).or_default();
            let decided = self.decided.get(rank).unwrap_or(&no_decisions);
            persistent_weights(step, singles, decided, found);
        }
        let empty = BTreeMap::new();
        for g in &mut self.groups {
            let maps: Vec<&BTreeMap<WeightKey, Weight>> = g
                .members
                .iter()
                .map(|m| weights.get(m).unwrap_or(&empty))
                .collect();
            g.step(&self.store, &maps);
        }
        for (rank, map) in weights.into_iter().filter(|(_, m)| !m.is_empty()) {
            match self.first_two.get_mut(&rank) {
                None => {
                    self.first_two.insert(rank, (step, map));
                }
                Some((s0, kept)) if *s0 + 1 == step => kept.extend(map),
                // No step after the kept one was captured (`--steps 0,2,3`), or this rank
                // had no weights in it: start over from this step, so that the first two
                // consecutive steps are the ones judged.
                Some((s0, kept)) if !kept.keys().any(|k| k.0 == *s0 + 1) => {
                    *s0 = step;
                    *kept = map;
                }
                Some(_) => {}
            }
        }
    }

    /// What the checks found: the calls' received outputs in key order, stale weights, then
    /// per group, in the comm map's order, what its weights showed.
    pub fn finish(mut self) -> Outcome {
        if let Some(held) = self.held.take() {
            self.compare(held);
        }
        let mut out = Outcome {
            findings: std::mem::take(&mut self.received).into_values().collect(),
            ..Outcome::default()
        };
        out.stale_unjudged = !self.first_two.is_empty()
            && !self
                .first_two
                .values()
                .any(|(s0, kept)| kept.keys().any(|k| k.0 == s0 + 1));
        let first_two: BTreeMap<u32, BTreeMap<WeightKey, Weight>> = self
            .first_two
            .into_iter()
            .map(|(rank, (_, map))| (rank, map))
            .collect();
        frozen_weights(&self.store, &first_two, &mut out);
        for g in self.groups {
            g.finish(&mut out);
        }
        out
    }
}

/// The held step `step` of `steps`, made when first needed.
fn held_step(steps: &mut BTreeMap<u64, HeldStep>, step: u64) -> &mut HeldStep {
    steps.entry(step).or_insert_with(|| HeldStep {
        step,
        weights: BTreeMap::new(),
        singles: BTreeMap::new(),
    })
}

/// Steps before a group is shown to be a replica group whose differing weights are kept as
/// findings ([`Group::before`]).
const BEFORE_KEPT: usize = 4;

/// A candidate replica group (a communicator's members, every one in the store), as its
/// steps are compared: what its weights say if it is a data-parallel replica group (some
/// step where most of its members' common weights agree), and what they say if it is not.
struct Group {
    members: Vec<u32>,
    /// Some step showed it to be a replica group.
    replica: bool,
    /// Weight operands compared, counted if it is one.
    compared: u64,
    /// Weights that differ across the replicas, if it is one: one finding per weight from the
    /// first step that showed it to be one, one per step before it ([`Group::before`]).
    as_replicas: Vec<Finding>,
    /// Steps before the first that showed it to be a replica group, where weights differed:
    /// the first [`BEFORE_KEPT`] as findings, and how many more. A group that is not one
    /// (tensor-parallel shards differ in every weight of every step) keeps no more than that.
    before: (Vec<Finding>, u64),
    /// Activation operands compared across it, equal ones, and the first equal one (step,
    /// module, op), for [`identical_data`].
    identical: (usize, usize, Option<(u64, String, String)>),
    /// Diverging activations and overlapping shards, if it is not one.
    otherwise: Vec<Finding>,
    /// The shards of its first step with common weights were checked for overlaps.
    shards_checked: bool,
}

impl Group {
    fn new(members: Vec<u32>) -> Group {
        Group {
            members,
            replica: false,
            compared: 0,
            as_replicas: Vec::new(),
            before: (Vec::new(), 0),
            identical: (0, 0, None),
            otherwise: Vec::new(),
            shards_checked: false,
        }
    }

    /// Compares one step's weights of the members (`maps`, in member order).
    fn step(&mut self, store: &Store, maps: &[&BTreeMap<WeightKey, Weight>]) {
        let Some(first) = maps.first() else { return };
        let common: Vec<&WeightKey> = first
            .keys()
            .filter(|k| maps.iter().all(|m| m.contains_key(*k)))
            .collect();
        if common.is_empty() {
            return;
        }
        // Replica group: in some step, most common weights agree on every member.
        let agree = common
            .iter()
            .filter(|k| {
                maps.iter()
                    .all(|m| m.get(**k).map(|v| v.crc) == first.get(**k).map(|v| v.crc))
            })
            .count();
        if common.len() >= 2 && agree * 2 > common.len() {
            self.replica = true;
        }
        identical_data(maps, &common, &mut self.identical);
        self.compared += (maps.len() * common.len()) as u64;
        // Each differing weight: its key, the ranks outside the majority, and its name.
        let differing = common.iter().filter_map(|k| {
            let vals: Vec<(u32, u32)> = self
                .members
                .iter()
                .zip(maps)
                .filter_map(|(r, m)| m.get(*k).map(|v| (*r, v.crc)))
                .collect();
            let bad = minority(&vals);
            let name = bad
                .first()
                .and_then(|b| self.members.iter().position(|m| m == b))
                .and_then(|i| maps[i].get(*k))
                .map(|v| v.name(&k.2))
                .unwrap_or_default();
            (!bad.is_empty()).then_some((*k, bad, name))
        });
        if self.replica {
            for (k, bad, name) in differing {
                self.as_replicas.push(Finding {
                    kind: FindingKind::ReplicaMismatch,
                    step: k.0,
                    ranks: bad.clone(),
                    op: name,
                    module: k.1.clone(),
                    detail: format!(
                        "GEMM weight operand {} differs across replicas {:?}: ranks {bad:?} hold other bytes than the rest",
                        k.4, self.members
                    ),
                });
            }
        } else {
            // Not (yet) shown to be a replica group: one finding for the step, kept only
            // if some later step shows it to be one.
            let (mut count, mut ranks, mut first) = (0usize, BTreeSet::new(), None);
            for (k, bad, name) in differing {
                count += 1;
                ranks.extend(bad);
                first.get_or_insert((k, name));
            }
            if let Some((k, name)) = first {
                if self.before.0.len() < BEFORE_KEPT {
                    self.before.0.push(Finding {
                        kind: FindingKind::ReplicaMismatch,
                        step: k.0,
                        ranks: ranks.into_iter().collect(),
                        op: name,
                        module: k.1.clone(),
                        detail: format!(
                            "{count} of the {} GEMM weight operands the replicas {:?} have in common differ in this step, before a later step showed them to agree (the first: operand {} of this op)",
                            common.len(),
                            self.members,
                            k.4
                        ),
                    });
                } else {
                    self.before.1 += 1;
                }
            }
        }
        // What it says of a group that is not a replica group: moot once it is one.
        if !self.replica {
            let mut out = Outcome::default();
            diverging_activations(&self.members, maps, &common, &mut out);
            if !std::mem::replace(&mut self.shards_checked, true) {
                overlapping_shards(store, &self.members, maps, &common, &mut out);
            }
            self.otherwise.extend(out.findings);
        }
    }

    /// Its findings, by what some step showed it to be.
    fn finish(self, out: &mut Outcome) {
        if !self.replica {
            out.findings.extend(self.otherwise);
            return;
        }
        let (equal, all, first) = self.identical;
        if all >= 4 && equal == all {
            let (step, module, name) = first.unwrap_or_default();
            out.findings.push(Finding {
                kind: FindingKind::ReplicaMismatch,
                step,
                ranks: self.members.clone(),
                op: name,
                module,
                detail: format!(
                    "data-parallel replicas {:?} hold the same weights and also saw bitwise identical activations in all {all} GEMMs compared: they trained on the same data",
                    self.members
                ),
            });
        }
        let (mut before, more) = self.before;
        if let (Some(last), true) = (before.last_mut(), more > 0) {
            last.detail.push_str(&format!(
                "; weights differed in {more} more steps after this one"
            ));
        }
        out.groups.push(self.members);
        out.compared += self.compared;
        out.findings.extend(before);
        out.findings.extend(self.as_replicas);
    }
}

/// A weight operand of one rank: its CRC, the first record using it, and the activation
/// operand (CRC when captured, seq) of each use in call order.
#[derive(Debug, Clone)]
struct Weight {
    crc: u32,
    /// Rank, step and seq of the first record using it (which names it, [`Weight::name`]),
    /// and the operand's tensor index.
    at: (u32, u64, u64, usize),
    acts: Vec<(Option<u32>, u64)>,
    /// The CRC of the activation's FP8 scale in each use (`None`: not FP8).
    act_scales: Vec<Option<u32>>,
}

impl Weight {
    /// The name of the record that first used it (`rank R step S seq Q API`, as
    /// [`Rec::name`] says it), given its API (the weight's key holds it).
    fn name(&self, api: &str) -> String {
        let (rank, step, seq, _) = self.at;
        format!("rank {rank} step {step} seq {seq} {api}")
    }
}

/// One use of a GEMM signature: CRCs of A and B, the record's seq, the tensor indexes of A
/// and B, and the CRCs of the FP8 scales of A and B.
type Use = (Option<u32>, Option<u32>, u64, [usize; 2], [Option<u32>; 2]);

/// Picks one operand's CRC out of a [`Use`].
type UseCrc = fn(&Use) -> Option<u32>;

/// Weight operands of each rank.
fn rank_weights(recs: &[&Rec]) -> BTreeMap<WeightKey, Weight> {
    let mut sigs: BTreeMap<(u64, String, String, [u64; 5]), Vec<Use>> = BTreeMap::new();
    for r in recs {
        let Op::Gemm(g) = &r.record.op else { continue };
        let crc = |role| {
            r.find(role).and_then(|i| {
                let t = &r.record.tensors[i];
                t.captured.then_some(t.crc32)
            })
        };
        sigs.entry((
            r.record.step,
            // The module (innermost range): outer ranges name the micro-batch.
            r.record.nvtx.last().cloned().unwrap_or_default(),
            r.record.api.clone(),
            [g.m, g.n, g.k, g.transa as u64, g.transb as u64],
        ))
        .or_default()
        .push((
            crc(Role::A),
            crc(Role::B),
            r.record.seq,
            [r.find(Role::A).unwrap_or(0), r.find(Role::B).unwrap_or(0)],
            [crc(Role::ScaleA), crc(Role::ScaleB)],
        ));
    }
    let mut weights = BTreeMap::new();
    for ((step, nvtx, api, shape), occ) in sigs {
        if occ.len() < 2 {
            continue;
        }
        let same = |f: fn(&Use) -> Option<u32>| {
            let first = f(&occ[0])?;
            occ.iter().all(|o| f(o) == Some(first)).then_some(first)
        };
        let (a, b) = (same(|o| o.0), same(|o| o.1));
        let (role, crc, other): (&'static str, u32, UseCrc) = match (a, b) {
            (Some(a), None) => ("A", a, |o| o.1),
            (None, Some(b)) => ("B", b, |o| o.0),
            _ => continue,
        };
        let acts = occ.iter().map(|o| (other(o), o.2)).collect();
        let act_scales = occ.iter().map(|o| o.4[usize::from(role == "A")]).collect();
        weights.insert(
            (step, nvtx, api, shape, role),
            Weight {
                crc,
                at: (
                    recs.first().map_or(0, |r| r.record.rank),
                    step,
                    occ[0].2,
                    occ[0].3[usize::from(role == "B")],
                ),
                acts,
                act_scales,
            },
        );
    }
    weights
}

/// Adds to `found` (one rank's weights of `step`) the weights found by persistence across
/// steps ([`persistent`]: GEMMs used once per step, as with one micro-batch) among that step's
/// single-use GEMMs `singles`, by the signatures' decisions `decided`; a weight found by
/// recurrence within the step keeps its place.
fn persistent_weights(
    step: u64,
    singles: &Singles,
    decided: &BTreeMap<persistent::Signature, Option<usize>>,
    found: &mut BTreeMap<WeightKey, Weight>,
) {
    for (sig, single) in singles {
        let Some(&Some(op)) = decided.get(sig) else {
            continue;
        };
        let role: &'static str = if op == 0 { "A" } else { "B" };
        let Some(weight) = single.operands[op] else {
            continue;
        };
        let Some(w_crc) = weight.crc else { continue };
        let activation = single.operands[1 - op].and_then(|a| a.crc);
        // The activation's scale: B's for a weight A, A's for a weight B.
        let act_scale = single.scales[1 - op];
        let (rank, _, seq) = single.at;
        let key = (step, sig.0.clone(), sig.1.clone(), sig.2, role);
        found.entry(key).or_insert_with(|| Weight {
            crc: w_crc,
            at: (rank, step, seq, weight.index),
            acts: vec![(activation, seq)],
            act_scales: vec![act_scale],
        });
    }
}

/// Activation operands across a group that is not a weight-replica group (e.g. tensor
/// parallel): GEMMs of one kind (same step, API, shape, operand and use) either see the same
/// activation on every member (column-parallel inputs are replicated across TP) or not; a
/// module (layer numbers aside, see [`module_kind`]) of a kind whose earlier instances agreed but which itself disagrees is where a
/// replicated activation diverged (a missing reduction upstream).
fn diverging_activations(
    members: &[u32],
    maps: &[&BTreeMap<WeightKey, Weight>],
    common: &[&WeightKey],
    out: &mut Outcome,
) {
    // (step, API, module kind, shape, operand, use) -> (seq, module, agrees, name)
    type Kind = (u64, String, String, [u64; 5], &'static str, usize);
    let mut kinds: BTreeMap<Kind, Vec<(u64, String, bool, String)>> = BTreeMap::new();
    let mut scale_findings: Vec<Finding> = Vec::new();
    for k in common {
        let uses = maps[0].get(*k).map_or(0, |w| w.acts.len());
        for u in 0..uses {
            let acts: Vec<Option<u32>> = maps
                .iter()
                .map(|m| m.get(*k).and_then(|w| w.acts.get(u)).and_then(|a| a.0))
                .collect();
            let Some(Some(first)) = acts.first().copied() else {
                continue;
            };
            if acts.iter().any(|a| a.is_none()) {
                continue;
            }
            let agrees = acts.iter().all(|a| *a == Some(first));
            let scales: Vec<Option<u32>> = maps
                .iter()
                .map(|m| {
                    m.get(*k)
                        .and_then(|w| w.act_scales.get(u).copied().flatten())
                })
                .collect();
            if agrees
                && scales.iter().all(Option::is_some)
                && scales.iter().any(|c| *c != scales[0])
            {
                let name = maps[0].get(*k).map(|w| w.name(&k.2)).unwrap_or_default();
                scale_findings.push(Finding {
                    kind: FindingKind::ReplicaMismatch,
                    step: k.0,
                    ranks: members.to_vec(),
                    op: name,
                    module: k.1.clone(),
                    detail: format!(
                        "ranks {members:?} multiply bitwise identical FP8 activations by different scales: the same bytes mean different values (scales or amaxes not reduced across the group)"
                    ),
                });
            }
            let (seq, name) = maps[0]
                .get(*k)
                .map(|w| (w.acts[u].1, w.name(&k.2)))
                .unwrap_or_default();
            kinds
                .entry((k.0, k.2.clone(), module_kind(&k.1), k.3, k.4, u))
                .or_default()
                .push((seq, k.1.clone(), agrees, name));
        }
    }
    // Earliest divergence first (in call order on the first member).
    let mut found: Vec<(u64, Finding)> = Vec::new();
    for ((step, ..), mut inst) in kinds {
        // In call order; instances of one kind are the layers of the module.
        inst.sort();
        let Some(first_agree) = inst.iter().position(|i| i.2) else {
            continue;
        };
        if let Some((seq, module, _, name)) = inst[first_agree..].iter().find(|i| !i.2) {
            found.push((*seq, Finding {
                kind: FindingKind::ReplicaMismatch,
                step,
                ranks: members.to_vec(),
                op: name.clone(),
                module: module.clone(),
                detail: format!(
                    "the activation operand of {module} differs across ranks {members:?}, while the same GEMM of earlier modules ({}) saw identical activations on all of them: a replicated activation diverged upstream (e.g. a skipped all-reduce)",
                    inst[first_agree].1
                ),
            }));
        }
    }
    found.sort_by_key(|f| (f.1.step, f.0));
    out.findings.extend(found.into_iter().map(|f| f.1));
    // One per module is enough.
    scale_findings.dedup_by(|a, b| a.module == b.module && a.step == b.step);
    out.findings.extend(scale_findings);
}

/// Bytes of a weight operand, read back from the store (`None`: unreadable).
fn weight_bytes(store: &Store, w: &Weight) -> Option<Vec<u8>> {
    weight_data(store, w).map(|d| d.0)
}

/// Bytes and element type of a weight operand, read back from the store.
fn weight_data(store: &Store, w: &Weight) -> Option<(Vec<u8>, DType)> {
    let (rank, step, seq, tensor) = w.at;
    let seg = store.open_segment(rank, step).ok()?;
    let view = seg.read_seq(seq)?.ok()?;
    let dtype = view.record.tensors.get(tensor)?.dtype;
    Some((view.tensor_bytes(tensor).ok()?, dtype))
}

/// Bytes per block compared between shards.
const BLOCK: usize = 16;

/// Tensor-parallel shards of one weight partition it: two members' shards that differ as a
/// whole yet share aligned 16-byte blocks (not constant ones) were sliced from overlapping
/// ranges (a wrong shard offset). Checked on the first step each weight appears.
fn overlapping_shards(
    store: &Store,
    members: &[u32],
    maps: &[&BTreeMap<WeightKey, Weight>],
    common: &[&WeightKey],
    out: &mut Outcome,
) {
    let Some(first_step) = common.iter().map(|k| k.0).min() else {
        return;
    };
    for k in common.iter().filter(|k| k.0 == first_step) {
        let ws: Vec<&Weight> = maps.iter().filter_map(|m| m.get(*k)).collect();
        if ws.len() != members.len() {
            continue;
        }
        if ws.iter().all(|w| w.crc == ws[0].crc) {
            continue;
        }
        // Each member's blocks once, not once per pair.
        let blocks: Vec<Option<Vec<[u8; BLOCK]>>> = ws
            .iter()
            .map(|w| weight_bytes(store, w).map(|b| distinct_blocks(&b)))
            .collect();
        'pairs: for i in 0..ws.len() {
            for j in i + 1..ws.len() {
                if ws[i].crc == ws[j].crc {
                    continue;
                }
                let (Some(ba), Some(bb)) = (&blocks[i], &blocks[j]) else {
                    continue;
                };
                let shared = shared_blocks(ba, bb);
                if shared > 0 {
                    out.findings.push(Finding {
                        kind: FindingKind::ReplicaMismatch,
                        step: k.0,
                        ranks: vec![members[i], members[j]],
                        op: ws[j].name(&k.2),
                        module: k.1.clone(),
                        detail: format!(
                            "the shards of weight operand {} on ranks {} and {} differ but share {shared} of {} blocks of {BLOCK} bytes: they were sliced from overlapping ranges (wrong shard offset)",
                            k.4,
                            members[i],
                            members[j],
                            ba.len()
                        ),
                    });
                    break 'pairs;
                }
            }
        }
    }
}

/// The distinct aligned [`BLOCK`]-byte blocks of `x` that are not constant, sorted.
fn distinct_blocks(x: &[u8]) -> Vec<[u8; BLOCK]> {
    let mut blocks: Vec<[u8; BLOCK]> = x
        .chunks_exact(BLOCK)
        .filter(|c| c.iter().any(|v| *v != c[0]))
        .map(|c| {
            let mut block = [0u8; BLOCK];
            block.copy_from_slice(c);
            block
        })
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    blocks
}

/// How many blocks two sorted lists of distinct blocks share.
fn shared_blocks(a: &[[u8; BLOCK]], b: &[[u8; BLOCK]]) -> usize {
    let (mut i, mut j, mut shared) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                shared += 1;
                i += 1;
                j += 1;
            }
        }
    }
    shared
}

/// What stayed the same of a weight between two steps, by aligned [`BLOCK`]-byte blocks
/// (constant blocks left out: they say nothing of an update).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Unchanged {
    /// Blocks compared (not constant).
    blocks: usize,
    /// Of them, blocks with the same bytes in both steps.
    same: usize,
    /// The longest range of consecutive unchanged blocks (constant ones inside it skipped):
    /// its byte offsets, start and end, and its blocks.
    run: (usize, usize, usize),
}

/// Chance, below which a range of unchanged blocks is not the rounding of small updates: see
/// [`Unchanged::stale`].
const STALE_CHANCE: f64 = 1e-6;

/// The largest share of a weight's other blocks left unchanged for an unchanged range in it
/// to be a stale weight ([`Unchanged::stale`]): the median weight's bound ([`frozen_weights`]).
const REST_KEPT_MAX: f64 = 0.05;

impl Unchanged {
    /// Compares the blocks of `a` and `b` (equal lengths).
    fn of(a: &[u8], b: &[u8]) -> Unchanged {
        let mut u = Unchanged {
            blocks: 0,
            same: 0,
            run: (0, 0, 0),
        };
        let mut current: Option<(usize, usize)> = None; // (start offset, blocks)
        for (i, (x, y)) in a.chunks_exact(BLOCK).zip(b.chunks_exact(BLOCK)).enumerate() {
            if x.iter().all(|v| *v == x[0]) {
                continue;
            }
            u.blocks += 1;
            if x != y {
                current = None;
                continue;
            }
            u.same += 1;
            let (start, len) = current.map_or((i * BLOCK, 1), |(s, n)| (s, n + 1));
            current = Some((start, len));
            if len > u.run.2 {
                u.run = (start, (i + 1) * BLOCK, len);
            }
        }
        u
    }

    /// The share of blocks unchanged.
    fn fraction(&self) -> f64 {
        self.same as f64 / self.blocks.max(1) as f64
    }

    /// The share of the blocks outside the longest unchanged range that are unchanged.
    fn rest_fraction(&self) -> f64 {
        let rest = self.blocks - self.run.2;
        if rest == 0 {
            return 0.0;
        }
        (self.same - self.run.2) as f64 / rest as f64
    }

    /// Whether part of the weight was not updated: a quarter or more of its blocks form one
    /// range of unchanged blocks that the rest of the weight cannot explain. In BF16 an
    /// update smaller than half a unit in the last place leaves an element as it was, so a
    /// weight of small updates keeps many blocks, scattered (each kept with about the rest's
    /// share `q`); a skipped optimizer shard leaves a contiguous range (the flat buffer's
    /// shard) while the rest moves as every weight does. With `n` blocks, scattered ones make
    /// a range of `L` or more about `n (1 - q) q^L` times: below [`STALE_CHANCE`] it is not
    /// chance. Small updates need not be scattered, though: a fused QKV weight's Q and K rows
    /// get far smaller gradients than its V rows at initialisation, so with a small learning
    /// rate in BF16 they stay whole while V moves (27-59% of a shard in one range, 10-46% of
    /// the rest kept, on the fixture at `--lr 1e-4`). So the rest must also have moved as a
    /// weight's elements do when updated ([`REST_KEPT_MAX`]; a skipped ZeRO-1 shard's weight
    /// keeps at most 0.1% of the rest on the fixture, at every size, precision and rate tried).
    fn stale(&self) -> bool {
        let (n, len) = (self.blocks as f64, self.run.2 as f64);
        let q = self.rest_fraction();
        self.run.2 > 0
            && len * 4.0 >= n
            && q <= REST_KEPT_MAX
            && n * (1.0 - q) * q.powf(len) < STALE_CHANCE
    }
}

/// Weights must change when the optimizer steps: between the first two consecutive steps of each rank,
/// a weight with a quarter or more of its aligned 16-byte blocks (not constant ones) unchanged
/// in one range the rest of the weight does not explain ([`Unchanged::stale`]), while the
/// median weight kept fewer than 5% of its blocks, did not update there (a skipped optimizer
/// shard). A run where most weights stay (a zero learning rate, a step the loss scaler
/// skipped) reports nothing; FP8 weights (requantised each step onto few values) are not
/// compared.
fn frozen_weights(
    store: &Store,
    per_rank: &BTreeMap<u32, BTreeMap<WeightKey, Weight>>,
    out: &mut Outcome,
) {
    // (module, operand) -> (ranks, detail, op, step)
    type Stale = (Vec<u32>, String, String, u64);
    let mut found: BTreeMap<(String, &'static str), Stale> = BTreeMap::new();
    for (&rank, map) in per_rank {
        let Some(s0) = map.keys().map(|k| k.0).min() else {
            continue;
        };
        let mut fracs: Vec<(Unchanged, &WeightKey, &Weight)> = Vec::new();
        for (k, w0) in map.iter().filter(|(k, _)| k.0 == s0) {
            let next = (s0 + 1, k.1.clone(), k.2.clone(), k.3, k.4);
            let Some(w1) = map.get(&next) else { continue };
            let (Some((a, dtype)), Some((b, _))) = (weight_data(store, w0), weight_data(store, w1))
            else {
                continue;
            };
            // FP8 weights are requantised every step with few values: most blocks may stay.
            if a.len() != b.len() || a.len() < BLOCK * 8 || dtype.size() < 2 {
                continue;
            }
            let u = Unchanged::of(&a, &b);
            if u.blocks > 0 {
                fracs.push((u, k, w1));
            }
        }
        if fracs.len() < 3 {
            continue;
        }
        let mut sorted: Vec<f64> = fracs.iter().map(|f| f.0.fraction()).collect();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        if median >= 0.05 {
            continue;
        }
        for (u, k, w1) in fracs.into_iter().filter(|f| f.0.stale()) {
            let e = found.entry((k.1.clone(), k.4)).or_insert_with(|| {
                let detail = if u.run.2 == u.blocks {
                    format!(
                        "every block of weight operand {} is unchanged between steps {s0} and {} (the median weight kept {:.1}% of its blocks): this weight was not updated",
                        k.4,
                        s0 + 1,
                        median * 100.0
                    )
                } else {
                    format!(
                        "{:.0}% of weight operand {}'s blocks, in one range (bytes {}..{}), are unchanged between steps {s0} and {}, against {:.1}% of the rest of it (the median weight: {:.1}%): part of this weight was not updated",
                        u.run.2 as f64 * 100.0 / u.blocks as f64,
                        k.4,
                        u.run.0,
                        u.run.1,
                        s0 + 1,
                        u.rest_fraction() * 100.0,
                        median * 100.0
                    )
                };
                (
                    Vec::new(),
                    detail,
                    w1.name(&k.2),
                    s0 + 1,
                )
            });
            e.0.push(rank);
        }
    }
    for ((module, _), (mut ranks, detail, op, step)) in found {
        ranks.sort_unstable();
        ranks.dedup();
        out.findings.push(Finding {
            kind: FindingKind::StaleWeight,
            step,
            ranks,
            op,
            module,
            detail,
        });
    }
}

/// A module's kind: its name with layer numbers replaced (`layers.3.mlp.fc1` ->
/// `layers.#.mlp.fc1`), so that the same module of different layers compares.
pub fn module_kind(module: &str) -> String {
    module
        .split('.')
        .map(|p| {
            if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                "#"
            } else {
                p
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// Data-parallel replicas must train on different data: when every activation operand of
/// their common GEMMs is bitwise equal across the group, they read the same samples. Counts,
/// over one step's common weights (`common`, of the members' `maps`), the activations
/// compared and the equal ones, and keeps the first equal one (step, module, op), into
/// `counts`; [`Group::finish`] judges the sums.
fn identical_data(
    maps: &[&BTreeMap<WeightKey, Weight>],
    common: &[&WeightKey],
    counts: &mut (usize, usize, Option<(u64, String, String)>),
) {
    let (equal, all, first) = counts;
    for k in common {
        let Some(w0) = maps[0].get(*k) else { continue };
        for (u, (a0, _)) in w0.acts.iter().enumerate() {
            let Some(a0) = a0 else { continue };
            *all += 1;
            if maps
                .iter()
                .all(|m| m.get(*k).and_then(|w| w.acts.get(u)).and_then(|a| a.0) == Some(*a0))
            {
                *equal += 1;
                first.get_or_insert((k.0, k.1.clone(), w0.name(&k.2)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_share_the_distinct_non_constant_blocks_they_both_hold() {
        let block = |v: u8| [v, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
        let constant = [7u8; BLOCK];
        // a: blocks 0, 1, 1 (again), a constant one, 2; b: 2, 3, the constant one, 0.
        let a: Vec<u8> = [block(0), block(1), block(1), constant, block(2)]
            .concat()
            .into_iter()
            .chain([9u8; 5]) // a partial block at the end is left out
            .collect();
        let b: Vec<u8> = [block(2), block(3), constant, block(0)].concat();
        let (ba, bb) = (distinct_blocks(&a), distinct_blocks(&b));
        assert_eq!(ba, vec![block(0), block(1), block(2)]);
        assert_eq!(bb.len(), 3);
        assert_eq!(shared_blocks(&ba, &bb), 2);
        assert_eq!(shared_blocks(&bb, &ba), 2);
        assert_eq!(shared_blocks(&ba, &[]), 0);
        assert_eq!(
            shared_blocks(&distinct_blocks(&[constant].concat()), &ba),
            0
        );
    }

    #[test]
    fn module_kinds_drop_layer_numbers() {
        assert_eq!(module_kind("layers.12.mlp.fc1"), "layers.#.mlp.fc1");
        assert_eq!(module_kind("head"), "head");
    }

    /// BF16 bytes of `n` weights of magnitude about 0.02 (a deterministic sequence), moved by
    /// `update(i)`.
    fn bf16_weights(n: usize, update: impl Fn(usize) -> f32) -> Vec<u8> {
        let mut x = 0x2545_f491u32;
        (0..n)
            .flat_map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let w = (x as f32 / u32::MAX as f32 - 0.5) * 0.04;
                half::bf16::from_f32(w + update(i)).to_le_bytes()
            })
            .collect()
    }

    /// An update of relative size about `scale` with a sign and size that vary by element.
    fn small(i: usize, scale: f32) -> f32 {
        scale * 0.02 * (1.0 + (i % 7) as f32) / 4.0 * if i.is_multiple_of(3) { -1.0 } else { 1.0 }
    }

    #[test]
    fn small_updates_that_bf16_rounds_away_are_not_a_stale_weight() {
        let before = bf16_weights(4096, |_| 0.0);
        // Updates below half a BF16 unit for most elements: many blocks keep their bytes,
        // scattered over the weight (the old rule, a quarter of the blocks, called it stale).
        let after = bf16_weights(4096, |i| small(i, 0.0001));
        let u = Unchanged::of(&before, &after);
        assert!(u.fraction() >= 0.25, "{u:?}");
        assert!(!u.stale(), "{u:?}");
    }

    #[test]
    fn a_contiguous_range_not_updated_is_a_stale_weight() {
        let before = bf16_weights(4096, |_| 0.0);
        // Elements 1024..2560 (a skipped shard of the flat buffer) keep their values; the
        // rest moves as weights do.
        let skipped = |i: usize| (1024..2560).contains(&i);
        let after = bf16_weights(4096, |i| if skipped(i) { 0.0 } else { small(i, 0.5) });
        let u = Unchanged::of(&before, &after);
        assert!(u.stale(), "{u:?}");
        assert_eq!((u.run.0, u.run.1), (1024 * 2, 2560 * 2), "{u:?}");
        // Not when the rest's updates are small enough to keep many of its blocks: a section
        // of small gradients (a fused QKV weight's Q and K rows) keeps a range just as well.
        let after = bf16_weights(4096, |i| if skipped(i) { 0.0 } else { small(i, 0.0002) });
        let u = Unchanged::of(&before, &after);
        assert!(u.rest_fraction() > 0.2, "{u:?}");
        assert!(!u.stale(), "{u:?}");
        // A range of a tenth of the weight is not enough.
        let after = bf16_weights(4096, |i| {
            if (0..400).contains(&i) {
                0.0
            } else {
                small(i, 0.5)
            }
        });
        assert!(!Unchanged::of(&before, &after).stale());
    }

    #[test]
    fn constant_blocks_neither_count_nor_break_an_unchanged_range() {
        let mut before = bf16_weights(1024, |_| 0.0);
        let mut after = bf16_weights(1024, |i| if i < 512 { 0.0 } else { small(i, 0.5) });
        // A block of zeros in the middle of the unchanged half, and one in the rest.
        for at in [256 * 2, 768 * 2] {
            before[at..at + BLOCK].fill(0);
            after[at..at + BLOCK].fill(0);
        }
        let u = Unchanged::of(&before, &after);
        assert_eq!(u.blocks, 1024 * 2 / BLOCK - 2);
        assert_eq!(u.run, (0, 512 * 2, 512 * 2 / BLOCK - 1), "{u:?}");
        assert!(u.stale());
        // A weight not updated at all: one range, nothing else to explain it.
        let all = Unchanged::of(&before, &before);
        assert_eq!((all.same, all.run.2), (all.blocks, all.blocks));
        assert!(all.stale());
    }

    /// A weight operand of CRC `crc`, read with an activation of CRC `act`.
    fn weight(crc: u32, act: u32) -> Weight {
        Weight {
            crc,
            at: (0, 0, 0, 0),
            acts: vec![(Some(act), 0)],
            act_scales: vec![None],
        }
    }

    /// One step's weights of one rank (data-parallel: each reads its own data): modules
    /// `a`, `b`, `c` with CRCs `crcs`.
    fn step_weights(step: u64, rank: u32, crcs: [u32; 3]) -> BTreeMap<WeightKey, Weight> {
        ["a", "b", "c"]
            .into_iter()
            .zip(crcs)
            .map(|(module, crc)| {
                let key = (
                    step,
                    module.to_string(),
                    "cublasGemmEx".to_string(),
                    [4, 4, 4, 0, 0],
                    "A",
                );
                (key, weight(crc, 100 + rank))
            })
            .collect()
    }

    /// A store of one record (the weights' records are not in it: no shard is read).
    fn empty_store() -> (std::path::PathBuf, Store) {
        let dir = std::env::temp_dir().join(format!(
            "ttrace-replicas-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut seg = ttrace_format::store::SegmentWriter::create(&dir, 0, 0).expect("create");
        let rec = ttrace_format::record::Record::d2h_copy(0, 0, 0, &[0u8; 4]);
        seg.append(&rec, &[]).expect("append");
        seg.finish().expect("finish");
        let store = Store::open(&dir).expect("a store of one segment");
        (dir, store)
    }

    #[test]
    fn a_group_shown_to_be_replicas_in_a_later_step_reports_each_earlier_step_once() {
        let (dir, store) = empty_store();
        let mut g = Group::new(vec![0, 1]);
        // Step 0: every weight differs on rank 1; nothing says yet that these are replicas.
        g.step(
            &store,
            &[
                &step_weights(0, 0, [1, 2, 3]),
                &step_weights(0, 1, [7, 8, 9]),
            ],
        );
        assert!(!g.replica);
        // Step 1: two of three agree: a replica group, whose third weight differs.
        g.step(
            &store,
            &[
                &step_weights(1, 0, [1, 2, 3]),
                &step_weights(1, 1, [1, 2, 4]),
            ],
        );
        assert!(g.replica);
        let mut out = Outcome::default();
        g.finish(&mut out);
        assert_eq!(out.groups, vec![vec![0, 1]]);
        assert_eq!(out.compared, 2 * 3 * 2);
        let found: Vec<(u64, &str, Vec<u32>)> = out
            .findings
            .iter()
            .map(|f| (f.step, f.module.as_str(), f.ranks.clone()))
            .collect();
        assert_eq!(found, vec![(0, "a", vec![1]), (1, "c", vec![1])]);
        assert!(out.findings[0]
            .detail
            .starts_with("3 of the 3 GEMM weight operands"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_group_never_shown_to_be_replicas_keeps_a_bounded_account_and_reports_none_of_it() {
        let (dir, store) = empty_store();
        let mut g = Group::new(vec![0, 1]);
        // Tensor-parallel shards: every weight differs in every step.
        for step in 0..10 {
            g.step(
                &store,
                &[
                    &step_weights(step, 0, [1, 2, 3]),
                    &step_weights(step, 1, [7, 8, 9]),
                ],
            );
        }
        assert!(!g.replica);
        assert_eq!(
            (g.before.0.len(), g.before.1),
            (BEFORE_KEPT, 10 - BEFORE_KEPT as u64)
        );
        assert!(g.as_replicas.is_empty());
        let mut out = Outcome::default();
        g.finish(&mut out);
        assert!(out.groups.is_empty());
        assert!(out.findings.is_empty(), "{:?}", out.findings);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_minority_is_who_differs_from_the_most_common_value() {
        assert_eq!(minority(&[(0, 7), (1, 7), (2, 9)]), vec![2]);
        assert!(minority(&[(0, 7), (1, 7)]).is_empty());
        assert_eq!(minority(&[(0, 5), (1, 7)]), vec![1]);
    }
}
