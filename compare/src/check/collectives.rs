//! Collective semantics across ranks: each call's output against its group's inputs.
//!
//! Calls are grouped per communicator by call order: the n-th collective a member makes on a
//! communicator belongs to call n (NCCL requires every member to issue its collectives on a
//! communicator in the same order). Send and recv are matched per (communicator, sender,
//! receiver) by order. Members come from the manifest's comm map; a member that is in the
//! store but never made a call is reported as missing.
//!
//! Reductions are not reproduced bitwise (NCCL's ring order depends on its algorithm and
//! channel count): the exact reduction is computed in f64 from the captured inputs and the
//! output must lie within [`reduction_bound`] of it (a term of
//! [`crate::tolerance`]). Gathers, broadcasts and transfers move
//! bytes and are checked bitwise.

use std::collections::{BTreeMap, BTreeSet};

use ttrace_format::dtype::DType;
use ttrace_format::record::{CollectiveKind, CollectiveOp, Op, Role};
use ttrace_format::store::Manifest;
use ttrace_format::tensor::TensorData;

use crate::check::load::{Rec, Trace};
use crate::check::report::{Finding, FindingKind};
pub use crate::tolerance::reduction_bound;
use crate::tolerance::ReductionBound;

/// What the collective checks found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Calls and send/recv pairs checked.
    pub checked: u64,
    pub findings: Vec<Finding>,
    /// Send/recv transfers not checked: their peer's rank holds no records in the store.
    pub peer_missing: u64,
}

/// `ncclRedOp_t` values the check understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Red {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

fn red(op: Option<u32>) -> Option<Red> {
    use cuda_abi::nccl as n;
    Some(match op? {
        n::ncclSum => Red::Sum,
        n::ncclProd => Red::Prod,
        n::ncclMax => Red::Max,
        n::ncclMin => Red::Min,
        n::ncclAvg => Red::Avg,
        // PreMulSum handles: their factor is the record's `premul` (see `premul_factors`).
        _ => return None,
    })
}

/// A reduction as the check reproduces it: the op, and a PreMulSum's factors (one per member).
#[derive(Debug, Clone, Copy)]
struct Reduction<'a> {
    op: Red,
    factors: Option<&'a [f64]>,
}

/// The first element of `out` (from `out_off`) that the reduction of `inputs` (from `in_off`,
/// `len` elements) does not explain: (index, got, exact, bound). `factors` (a PreMulSum, one
/// per input) multiply each input before a sum, one more rounding each.
fn check_reduction(
    dtype: DType,
    Reduction { op, factors }: Reduction<'_>,
    inputs: &[TensorData],
    in_off: usize,
    out: &TensorData,
    out_off: usize,
    len: usize,
) -> Option<(usize, f64, f64, f64)> {
    let n = inputs.len();
    let extra = usize::from(factors.is_some());
    // A block of elements at a time, widened to f64 once per tensor (the type matched once
    // per block, not per element) into buffers reused across blocks: the same values as
    // `get_f64`, in the same order, for a bounded cost in memory.
    let (sum_bound, avg_bound, prod_bound) = (
        ReductionBound::new(dtype, n.saturating_sub(1) + extra),
        ReductionBound::new(dtype, n + 1),
        ReductionBound::new(dtype, n.saturating_sub(1)),
    );
    let mut xs_block: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut got_block: Vec<f64> = Vec::new();
    for start in (0..len).step_by(REDUCTION_BLOCK) {
        let block = REDUCTION_BLOCK.min(len - start);
        for (i, (t, xs)) in inputs.iter().zip(&mut xs_block).enumerate() {
            let f = factors.and_then(|f| f.get(i).copied()).unwrap_or(1.0);
            f64_range(t, in_off + start, block, xs);
            xs.iter_mut().for_each(|x| *x *= f);
        }
        f64_range(out, out_off + start, block, &mut got_block);
        for (k, &got) in got_block.iter().enumerate() {
            let xs = xs_block.iter().map(|v| v[k]);
            let abs_sum: f64 = xs.clone().map(f64::abs).sum();
            let (want, bound) = match op {
                Red::Sum => (xs.sum(), sum_bound.at(abs_sum)),
                Red::Avg => (xs.sum::<f64>() / n as f64, avg_bound.at(abs_sum) / n as f64),
                Red::Prod => {
                    let p: f64 = xs.product();
                    (p, prod_bound.at(p.abs()))
                }
                Red::Max => (xs.fold(f64::NEG_INFINITY, f64::max), 0.0),
                Red::Min => (xs.fold(f64::INFINITY, f64::min), 0.0),
            };
            let ok = if want.is_nan() || abs_sum.is_nan() {
                got.is_nan()
            } else if want.is_infinite() {
                got == want
            } else {
                got.is_finite() && (got - want).abs() <= bound
            };
            if !ok {
                return Some((start + k, got, want, bound));
            }
        }
    }
    None
}

/// Elements checked per block by [`check_reduction`].
const REDUCTION_BLOCK: usize = 4096;

/// Elements `off..off + len` of `t` as f64, into `out` (cleared first): as
/// [`TensorData::get_f64`] reads them, NaN past the end.
fn f64_range(t: &TensorData, off: usize, len: usize, out: &mut Vec<f64>) {
    fn widen<T: Copy>(v: &[T], off: usize, len: usize, out: &mut Vec<f64>, f: impl Fn(T) -> f64) {
        out.extend((off..off + len).map(|i| v.get(i).map_or(f64::NAN, |&x| f(x))));
    }
    out.clear();
    match t {
        TensorData::F32(v) => widen(v, off, len, out, f64::from),
        TensorData::BF16(v) => widen(v, off, len, out, |x| x.to_f64()),
        TensorData::F16(v) => widen(v, off, len, out, |x| x.to_f64()),
        TensorData::F64(v) => widen(v, off, len, out, |x| x),
        _ => out.extend((off..off + len).map(|i| t.get_f64(i).unwrap_or(f64::NAN))),
    }
}

/// The collective parameters of a record.
pub fn coll(r: &Rec) -> Option<&CollectiveOp> {
    match &r.record.op {
        Op::Collective(c) => Some(c),
        _ => None,
    }
}

fn module(r: &Rec) -> String {
    r.record.nvtx.last().cloned().unwrap_or_default()
}

/// A call's description: `all_reduce #N on comm K (step S)`.
fn call_name(c: &CollectiveOp, n: usize, step: u64) -> String {
    format!("{:?} #{n} on comm {:#x} (step {step})", c.kind, c.comm)
}

/// Decoded tensor `role` of `r` (None: not captured or undecodable).
fn data(r: &Rec, role: Role) -> Option<TensorData> {
    let i = r.find(role)?;
    let bytes = r.bytes.get(i)?.as_deref()?;
    TensorData::from_le_bytes(r.record.tensors[i].dtype, bytes).ok()
}

/// A collective call: its key (communicator, call number) and its members' records by
/// communicator rank.
pub type Call = ((u64, usize), Vec<Rec>);

/// Collective calls (not send/recv) grouped by communicator and call number (the n-th call a
/// rank makes on a communicator is call n of every member), from records handed over step by
/// step ([`CallGroups::add`]): a call is handed back as soon as every
/// member of its communicator that is in the store has made it (no later record can join
/// it), so that only calls still waiting for a member are held; a call waiting only for
/// members whose ranks' records are all read (a rank that stopped early) is handed back as
/// the steps end ([`CallGroups::ended`]); the others come at the end
/// ([`CallGroups::finish`]), in key order.
#[derive(Debug, Default)]
pub struct CallGroups {
    counters: BTreeMap<(u64, u32), usize>,
    /// Calls still waiting for a member: their records, and the communicator ranks among them
    /// that count towards completion ([`CallGroups::add`]): distinct ones, so that two
    /// records claiming one communicator rank (a communicator set up wrong) do not stand for
    /// a member that has not made the call.
    pending: BTreeMap<(u64, usize), (Vec<Rec>, BTreeSet<u32>)>,
    /// The communicator ranks of each communicator of the comm map whose global rank is
    /// known and not in the store: the only members a call is complete without.
    absent: BTreeMap<u64, BTreeSet<u32>>,
    /// The global rank of each communicator rank of each communicator of the comm map.
    members: BTreeMap<u64, Vec<Option<u32>>>,
    /// The last step of each rank of the store ([`CallGroups::with_last_steps`]).
    last_step: BTreeMap<u32, u64>,
}

impl CallGroups {
    /// Grouping for a store holding `ranks`, whose comm map is `manifest`'s.
    pub fn new(manifest: &Manifest, ranks: &[u32]) -> CallGroups {
        let absent = manifest
            .comms
            .iter()
            .map(|e| {
                let absent = (0u32..)
                    .zip(&e.members)
                    .filter(|(_, g)| g.is_some_and(|g| !ranks.contains(&g)))
                    .map(|(comm_rank, _)| comm_rank);
                (e.key, absent.collect())
            })
            .collect();
        CallGroups {
            absent,
            members: manifest
                .comms
                .iter()
                .map(|e| (e.key, e.members.clone()))
                .collect(),
            ..CallGroups::default()
        }
    }

    /// Knowing the last step each rank of the store has (`last_step`), for
    /// [`CallGroups::ended`].
    pub fn with_last_steps(mut self, last_step: BTreeMap<u32, u64>) -> CallGroups {
        self.last_step = last_step;
        self
    }

    /// Whether communicator rank `comm_rank` of `comm` is a rank of the store whose last step
    /// is `step` or before: it has no record left once every rank's records up to `step` are
    /// in ([`CallGroups::ended`]).
    fn rank_ended(&self, comm: u64, comm_rank: u32, step: u64) -> bool {
        self.members
            .get(&comm)
            .and_then(|m| m.get(comm_rank as usize).copied().flatten())
            .and_then(|g| self.last_step.get(&g))
            .is_some_and(|&last| last <= step)
    }

    /// The calls that can no longer complete once every rank's records up to `step` are in
    /// (handed back, by key, as [`CallGroups::finish`] would at the end): those whose missing
    /// members are all ranks of known global rank whose last step is `step` or before (a
    /// rank that stopped early; its records are all read). A crashed rank's communicators
    /// would otherwise hold every later call of the run's survivors to the end. A member of
    /// unknown rank (a rank left out of the capture by `--ranks`, a store of one node of
    /// several), or of a communicator the map does not list, is still waited for: those calls
    /// come at the end.
    pub fn ended(&mut self, step: u64) -> Vec<Call> {
        // A call can only end at some rank's last step: no scan of the calls otherwise.
        if !self.last_step.values().any(|&last| last == step) {
            return Vec::new();
        }
        let done: Vec<(u64, usize)> = self
            .pending
            .iter()
            .filter(|(&(comm, _), (recs, _))| {
                let size = recs.first().and_then(coll).map_or(0, |c| c.comm_size);
                let made: BTreeSet<u32> = recs
                    .iter()
                    .filter_map(|r| coll(r).map(|c| c.comm_rank))
                    .collect();
                let absent = self.absent.get(&comm);
                (0..size)
                    .filter(|cr| !made.contains(cr) && !absent.is_some_and(|a| a.contains(cr)))
                    .all(|cr| self.rank_ended(comm, cr, step))
            })
            .map(|(&key, _)| key)
            .collect();
        done.into_iter()
            .filter_map(|key| {
                let (recs, _) = self.pending.remove(&key)?;
                Some(into_call(key, recs))
            })
            .collect()
    }

    /// Adds `r` when it is a collective call (not a send or recv; records of a rank come in
    /// call order); returns the call it completes, if it does: every communicator rank of
    /// the call (each counted once, whatever number of records claim it) has made it but
    /// those the comm map places on a rank the store does not hold
    /// (a member whose rank is unknown is waited for; so is every member of a communicator
    /// the map does not list).
    pub fn add(&mut self, r: Rec) -> Option<Call> {
        let c = coll(&r)?;
        if matches!(c.kind, CollectiveKind::Send | CollectiveKind::Recv) {
            return None;
        }
        let (comm, comm_rank, size) = (c.comm, c.comm_rank, c.comm_size);
        let n = self.counters.entry((comm, r.record.rank)).or_default();
        let key = (comm, *n);
        *n += 1;
        let absent = self.absent.get(&comm);
        let is_absent = |cr: u32| absent.is_some_and(|a| a.contains(&cr));
        let (recs, made) = self.pending.entry(key).or_default();
        if !is_absent(comm_rank) {
            made.insert(comm_rank);
        }
        recs.push(r);
        let size = recs.first().and_then(coll).map_or(size, |c| c.comm_size);
        let needed = size as usize - absent.map_or(0, |a| a.range(..size).count());
        if made.len() < needed.max(1) {
            return None;
        }
        let (recs, _) = self.pending.remove(&key)?;
        Some(into_call(key, recs))
    }

    /// The calls that were never completed, by key.
    pub fn finish(self) -> Vec<Call> {
        self.pending
            .into_iter()
            .map(|(key, (recs, _))| into_call(key, recs))
            .collect()
    }
}

/// Call `key` of its members' records `recs`, put in communicator-rank order.
fn into_call(key: (u64, usize), mut recs: Vec<Rec>) -> Call {
    recs.sort_by_key(|r| coll(r).map_or(0, |c| c.comm_rank));
    (key, recs)
}

/// The collective checks, fed step by step: calls as they complete ([`Collectives::call`]),
/// sends and recvs as they come ([`Collectives::transfer`]); what they found, in the order a
/// check of the whole trace finds it ([`Collectives::finish`]).
#[derive(Debug, Default)]
pub struct Collectives {
    /// Findings of each call, by key.
    calls: BTreeMap<(u64, usize), Vec<Finding>>,
    paths: BTreeMap<(u64, u32, u32), Path>,
    checked: u64,
    peer_missing: u64,
}

/// The transfers of one path (communicator, sender, receiver) not checked yet, and what its
/// checked ones found.
#[derive(Debug, Default)]
struct Path {
    sends: std::collections::VecDeque<Rec>,
    recvs: std::collections::VecDeque<Rec>,
    /// Index of the next transfer to check.
    next: usize,
    /// Both ends are ranks of the store (otherwise the path's transfers are only counted).
    held: bool,
    /// Whether the path has a send (paths of sends are said before recv-only ones).
    has_send: bool,
    /// Sends checked in step `seen_step` (the step of the last send checked), by the CRC-32
    /// and length of their bytes ([`stale_send`]): a send repeats only one of its own step.
    seen: BTreeMap<(u32, usize), (usize, Rec)>,
    seen_step: Option<u64>,
    stale: Vec<Finding>,
    pairs: Vec<Finding>,
}

impl Collectives {
    /// Checks one call (its members' records, by communicator rank).
    pub fn call(&mut self, trace: &Trace, manifest: &Manifest, call: &Call) {
        self.add_call(call.0, call_outcome(trace, manifest, call));
    }

    /// Adds what checking call `key` found ([`call_outcome`], which calls may run side by
    /// side).
    pub fn add_call(&mut self, key: (u64, usize), out: Outcome) {
        self.checked += out.checked;
        if !out.findings.is_empty() {
            self.calls.entry(key).or_default().extend(out.findings);
        }
    }

    /// Takes a record of the trace in call order: a send or recv is checked as a transfer
    /// ([`Collectives::transfer`]), a collective call joins `groups`, and the call it
    /// completes is returned, to be checked ([`call_outcome`]); other records are dropped.
    pub fn feed(
        &mut self,
        groups: &mut CallGroups,
        trace: &Trace,
        manifest: &Manifest,
        r: Rec,
    ) -> Option<Call> {
        let c = coll(&r)?;
        if matches!(c.kind, CollectiveKind::Send | CollectiveKind::Recv) {
            self.transfer(trace, manifest, r);
            return None;
        }
        groups.add(r)
    }

    /// Adds `r` when it is a send or a recv, and checks the transfers whose both ends have
    /// come (a path's in order).
    pub fn transfer(&mut self, trace: &Trace, manifest: &Manifest, r: Rec) {
        let Some(c) = coll(&r) else { return };
        let peer = c.root_or_peer.unwrap_or(-1).max(0) as u32;
        let (key, send) = match c.kind {
            CollectiveKind::Send => ((c.comm, c.comm_rank, peer), true),
            CollectiveKind::Recv => ((c.comm, peer, c.comm_rank), false),
            _ => return,
        };
        let path = self.paths.entry(key).or_insert_with(|| Path {
            held: path_held(trace, manifest, key),
            ..Path::default()
        });
        path.has_send |= send;
        // A transfer whose other end was not captured (or was lost) cannot be matched.
        if !path.held {
            self.peer_missing += 1;
            return;
        }
        if send {
            path.sends.push_back(r);
        } else {
            path.recvs.push_back(r);
        }
        while !path.sends.is_empty() && !path.recvs.is_empty() {
            let (s, r) = (path.sends.pop_front(), path.recvs.pop_front());
            self.checked += u64::from(path.check(trace, key, s, r));
        }
    }

    /// Checks, once every rank's records up to `step` are in, the transfers whose other end
    /// can no longer come (its rank has no step left: it stopped early), as [`Self::finish`]
    /// would at the end, in the path's order: a survivor's sends to a crashed peer are not
    /// held for the rest of the run.
    pub fn ended(&mut self, trace: &Trace, groups: &CallGroups, step: u64) {
        for (&key, path) in self.paths.iter_mut() {
            let (comm, from, to) = key;
            let waiting = if !path.sends.is_empty() {
                groups.rank_ended(comm, to, step)
            } else if !path.recvs.is_empty() {
                groups.rank_ended(comm, from, step)
            } else {
                false
            };
            if path.held && waiting {
                self.checked += path.drain(trace, key);
            }
        }
    }

    /// What the checks found: the calls' in key order (the calls never completed checked
    /// now), then the transfers' by path (sends' paths first), each path's stale sends
    /// before its pairs.
    pub fn finish(mut self, trace: &Trace, manifest: &Manifest, left: Vec<Call>) -> Outcome {
        for call in &left {
            self.call(trace, manifest, call);
        }
        let mut out = Outcome {
            checked: self.checked,
            peer_missing: self.peer_missing,
            findings: self.calls.into_values().flatten().collect(),
        };
        let mut paths: Vec<((u64, u32, u32), Path)> = self.paths.into_iter().collect();
        // Sends' paths first, then recv-only ones, each in key order.
        paths.sort_by_key(|(key, p)| (!p.has_send, *key));
        for (key, mut path) in paths {
            if !path.held {
                continue;
            }
            out.checked += path.drain(trace, key);
            out.findings.extend(path.stale);
            out.findings.extend(path.pairs);
        }
        out
    }
}

impl Path {
    /// Checks every transfer of the path not checked yet, in order, an end missing where one
    /// of its sides ran out; how many pairs were checked.
    fn drain(&mut self, trace: &Trace, key: (u64, u32, u32)) -> u64 {
        let mut checked = 0;
        while !self.sends.is_empty() || !self.recvs.is_empty() {
            let (s, r) = (self.sends.pop_front(), self.recvs.pop_front());
            checked += u64::from(self.check(trace, key, s, r));
        }
        checked
    }

    /// Checks the next transfer of the path (send `s`, recv `r`; one may be missing): a
    /// stale send, then the pair. Whether the pair was checked.
    fn check(
        &mut self,
        trace: &Trace,
        key: (u64, u32, u32),
        s: Option<Rec>,
        r: Option<Rec>,
    ) -> bool {
        let i = self.next;
        self.next += 1;
        // Each transfer's bytes read once.
        let (s_read, r_read) = (
            s.as_ref().map(|s| trace.with_bytes(s)),
            r.as_ref().map(|r| trace.with_bytes(r)),
        );
        let (s_read, r_read) = (s_read.as_deref(), r_read.as_deref());
        let mut seen_at = None;
        if let Some(sr) = s_read {
            if self.seen_step != Some(sr.record.step) {
                self.seen.clear();
                self.seen_step = Some(sr.record.step);
            }
            let (at, finding) = stale_send(trace, key, &self.seen, i, sr);
            self.stale.extend(finding);
            seen_at = at;
        }
        let (checked, finding) = check_pair(key, i, s_read, r_read);
        self.pairs.extend(finding);
        if let (Some(at), Some(s)) = (seen_at, s) {
            self.seen.insert(at, (i, s));
        }
        checked
    }
}

/// `calls` cut, in order, into runs whose members' captured tensors hold at most `most`
/// bytes (a call larger than that alone).
pub fn batches(calls: &[Call], most: u64) -> Vec<&[Call]> {
    let bytes = |c: &Call| -> u64 {
        c.1.iter()
            .flat_map(|r| &r.record.tensors)
            .filter(|t| t.captured)
            .map(|t| t.nbytes)
            .sum()
    };
    let mut out = Vec::new();
    let (mut start, mut held) = (0, 0u64);
    for (i, c) in calls.iter().enumerate() {
        let b = bytes(c);
        if i > start && held + b > most {
            out.push(&calls[start..i]);
            (start, held) = (i, 0);
        }
        held += b;
    }
    if start < calls.len() {
        out.push(&calls[start..]);
    }
    out
}

/// What checking one call (its members' records, by communicator rank) finds.
pub fn call_outcome(trace: &Trace, manifest: &Manifest, (key, recs): &Call) -> Outcome {
    let recs: Vec<&Rec> = recs.iter().collect();
    let mut out = Outcome::default();
    check_call(trace, manifest, key.0, key.1, &recs, &mut out);
    out
}

/// Whether both ends of a send/recv path are ranks of the store.
fn path_held(trace: &Trace, manifest: &Manifest, (comm, from, to): (u64, u32, u32)) -> bool {
    let held = |comm_rank: u32| {
        manifest
            .comms
            .iter()
            .find(|e| e.key == comm)
            .and_then(|e| e.members.get(comm_rank as usize).copied().flatten())
            .is_some_and(|g| trace.ranks.contains(&g))
    };
    held(from) && held(to)
}

/// Runs the collective checks on the whole trace at once.
pub fn check(trace: &Trace, manifest: &Manifest) -> Outcome {
    let mut groups = CallGroups::new(manifest, &trace.ranks);
    let mut checks = Collectives::default();
    for r in &trace.records {
        if let Some(call) = checks.feed(&mut groups, trace, manifest, r.clone()) {
            checks.call(trace, manifest, &call);
        }
    }
    checks.finish(trace, manifest, groups.finish())
}

/// Whether send `i` of a path (`s`, its bytes read) repeats the bytes of an earlier send of
/// the same step on the path (`seen`: the step's earlier sends by CRC-32 and length of their
/// bytes, the latest of each; a match is compared byte for byte): a stale buffer (each
/// micro-batch's activation or gradient is different). Returns where `s` goes in `seen`
/// (`None`: no bytes, or a constant tensor) and the finding.
fn stale_send(
    trace: &Trace,
    (comm, from, to): (u64, u32, u32),
    seen: &BTreeMap<(u32, usize), (usize, Rec)>,
    i: usize,
    s: &Rec,
) -> (Option<(u32, usize)>, Option<Finding>) {
    let Some(b) = s.bytes_of(Role::Input) else {
        return (None, None);
    };
    let es = s
        .find(Role::Input)
        .map_or(1, |t| s.record.tensors[t].dtype.size());
    let constant = b.chunks(es).all(|c| c == &b[..es.min(b.len())]);
    if constant {
        return (None, None);
    }
    let at = (crc32fast::hash(b), b.len());
    let finding = seen
        .get(&at)
        .filter(|(_, earlier)| {
            trace
                .with_bytes(earlier)
                .bytes_of(Role::Input)
                .is_some_and(|e| e == b)
        })
        .map(|&(j, _)| Finding {
            kind: FindingKind::PointToPoint,
            step: s.record.step,
            ranks: vec![s.record.rank],
            op: s.name(),
            module: module(s),
            detail: format!(
                "transfer #{i} from comm rank {from} to {to} on comm {comm:#x} sends the same bytes as transfer #{j} of the same step: a stale buffer"
            ),
        });
    (Some(at), finding)
}

/// Transfer `i` of a path: send `s` and recv `r` (their bytes read). Whether the pair was
/// checked (both ends there), and what is wrong with it.
fn check_pair(
    (comm, from, to): (u64, u32, u32),
    i: usize,
    s: Option<&Rec>,
    r: Option<&Rec>,
) -> (bool, Option<Finding>) {
    let (Some(s), Some(r)) = (s, r) else {
        let (have, lacks) = match (s, r) {
            (Some(s), None) => (s, "no matching recv"),
            (None, Some(r)) => (r, "no matching send"),
            _ => return (false, None),
        };
        let finding = Finding {
            kind: FindingKind::PointToPoint,
            step: have.record.step,
            ranks: vec![have.record.rank],
            op: have.name(),
            module: module(have),
            detail: format!(
                "transfer #{i} from comm rank {from} to {to} on comm {comm:#x}: {lacks}"
            ),
        };
        return (false, Some(finding));
    };
    let (Some(cs), Some(cr)) = (coll(s), coll(r)) else {
        return (true, None);
    };
    let finding = |detail: String| Finding {
        kind: FindingKind::PointToPoint,
        step: r.record.step,
        ranks: vec![s.record.rank, r.record.rank],
        op: format!("{} -> {}", s.name(), r.name()),
        module: module(r),
        detail,
    };
    if cs.count != cr.count || cs.nccl_type != cr.nccl_type {
        return (
            true,
            Some(finding(format!(
                "send of {} elements of type {} received as {} of type {}",
                cs.count, cs.nccl_type, cr.count, cr.nccl_type
            ))),
        );
    }
    let (Some(a), Some(b)) = (s.bytes_of(Role::Input), r.bytes_of(Role::Output)) else {
        return (true, None);
    };
    if a == b {
        return (true, None);
    }
    let at = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0);
    (
        true,
        Some(finding(format!(
            "the received bytes differ from the sent ones (first at byte {at})"
        ))),
    )
}

/// Checks one collective call (its members' records, by communicator rank).
fn check_call(
    trace: &Trace,
    manifest: &Manifest,
    comm: u64,
    n: usize,
    recs: &[&Rec],
    out: &mut Outcome,
) {
    let Some(c0) = recs.first().and_then(|r| coll(r)) else {
        return;
    };
    let step = recs.iter().map(|r| r.record.step).min().unwrap_or(0);
    let name = call_name(c0, n, step);
    let shape_finding = |ranks: Vec<u32>, detail: String| Finding {
        kind: FindingKind::CollectiveShape,
        step,
        ranks,
        op: name.clone(),
        module: module(recs[0]),
        detail,
    };
    // Missing members: in the comm map and in the store, but absent from this call.
    let present: Vec<u32> = recs.iter().map(|r| r.record.rank).collect();
    if let Some(entry) = manifest.comms.iter().find(|e| e.key == comm) {
        let missing: Vec<u32> = entry
            .members
            .iter()
            .flatten()
            .copied()
            .filter(|g| trace.ranks.contains(g) && !present.contains(g))
            .collect();
        if !missing.is_empty() {
            out.findings.push(shape_finding(
                missing.clone(),
                format!("ranks {missing:?} never made this call (members present: {present:?})"),
            ));
            return;
        }
    }
    if recs.len() != c0.comm_size as usize {
        // Members that were not traced: nothing to compare against.
        return;
    }
    for r in &recs[1..] {
        let Some(c) = coll(r) else { return };
        if c.kind != c0.kind
            || c.count != c0.count
            || c.nccl_type != c0.nccl_type
            || !same_reduction(c, c0)
            || c.root_or_peer != c0.root_or_peer
        {
            out.findings.push(shape_finding(
                vec![recs[0].record.rank, r.record.rank],
                format!(
                    "members disagree: rank {} calls {:?} count {} type {} op {:?} root {:?}; rank {} calls {:?} count {} type {} op {:?} root {:?}",
                    recs[0].record.rank, c0.kind, c0.count, c0.nccl_type, c0.redop, c0.root_or_peer,
                    r.record.rank, c.kind, c.count, c.nccl_type, c.redop, c.root_or_peer
                ),
            ));
            return;
        }
    }
    out.checked += 1;
    // The members' bytes, read for this call only.
    let loaded: Vec<std::borrow::Cow<'_, Rec>> = recs.iter().map(|r| trace.with_bytes(r)).collect();
    let recs: Vec<&Rec> = loaded.iter().map(|r| r.as_ref()).collect();
    let recs = recs.as_slice();
    let verdict = match c0.kind {
        CollectiveKind::AllReduce | CollectiveKind::Reduce | CollectiveKind::ReduceScatter => {
            reduction_mismatch(c0, recs)
        }
        CollectiveKind::AllGather => gather_mismatch(recs),
        CollectiveKind::Broadcast => broadcast_mismatch(c0, recs),
        CollectiveKind::AllToAll | CollectiveKind::Gather | CollectiveKind::Scatter => {
            exchange_mismatch(c0, recs)
        }
        CollectiveKind::Send | CollectiveKind::Recv => None,
    };
    if let Some((ranks, detail)) = verdict {
        out.findings.push(Finding {
            kind: FindingKind::CollectiveMismatch,
            step,
            ranks,
            op: name,
            module: module(recs[0]),
            detail,
        });
    }
}

/// The PreMulSum factor of each member (its host value, or its captured `Alpha` scalar);
/// `None` when one is unknown.
fn premul_factors(recs: &[&Rec]) -> Option<Vec<f64>> {
    recs.iter()
        .map(|r| {
            let p = coll(r)?.premul?;
            p.factor.or_else(|| data(r, Role::Alpha)?.get_f64(0))
        })
        .collect()
}

/// Whether two members reduce alike: the same built-in op, or both a PreMulSum (whose handles
/// are per communicator and member, and whose factors may differ per member).
fn same_reduction(a: &CollectiveOp, b: &CollectiveOp) -> bool {
    match (a.premul, b.premul) {
        (Some(_), Some(_)) => true,
        (None, None) => a.redop == b.redop,
        _ => false,
    }
}

/// The members whose reduction output the captured inputs do not explain, and why.
fn reduction_mismatch(c0: &CollectiveOp, recs: &[&Rec]) -> Option<(Vec<u32>, String)> {
    let factors = match c0.premul {
        Some(_) => Some(premul_factors(recs)?),
        None => None,
    };
    let op = if factors.is_some() {
        Red::Sum
    } else {
        red(c0.redop)?
    };
    let inputs: Vec<TensorData> = recs
        .iter()
        .map(|r| data(r, Role::Input))
        .collect::<Option<_>>()?;
    let dtype = inputs[0].dtype();
    let count = c0.count as usize;
    let mut bad = Vec::new();
    let mut first = None;
    for (i, r) in recs.iter().enumerate() {
        let root = c0.root_or_peer.unwrap_or(0).max(0) as usize;
        if c0.kind == CollectiveKind::Reduce && i != root {
            continue;
        }
        let Some(o) = data(r, Role::Output) else {
            continue;
        };
        let in_off = if c0.kind == CollectiveKind::ReduceScatter {
            i * count
        } else {
            0
        };
        if let Some(m) = check_reduction(
            dtype,
            Reduction {
                op,
                factors: factors.as_deref(),
            },
            &inputs,
            in_off,
            &o,
            0,
            count,
        ) {
            bad.push(r.record.rank);
            first.get_or_insert(m);
        }
    }
    let (e, got, want, bound) = first?;
    Some((
        bad,
        format!(
            "output element {e} is {got:e}; the {} of the {} inputs is {want:e} (allowed difference {bound:e} for {})",
            if factors.is_some() { "PreMulSum".to_string() } else { format!("{op:?}") },
            recs.len(),
            dtype.name()
        ),
    ))
}

/// The members whose all-gather output is not the inputs in communicator rank order.
fn gather_mismatch(recs: &[&Rec]) -> Option<(Vec<u32>, String)> {
    let inputs: Vec<&[u8]> = recs
        .iter()
        .map(|r| r.bytes_of(Role::Input))
        .collect::<Option<_>>()?;
    let want: Vec<u8> = inputs.concat();
    let bad: Vec<u32> = recs
        .iter()
        .filter(|r| {
            r.bytes_of(Role::Output)
                .is_some_and(|o| o != want.as_slice())
        })
        .map(|r| r.record.rank)
        .collect();
    (!bad.is_empty()).then(|| {
        (
            bad,
            "the gathered output is not the members' inputs in communicator rank order".to_string(),
        )
    })
}

/// The members whose all-to-all, gather or scatter output does not hold the blocks the
/// members' inputs sent them: all-to-all output block `r` of member `p` is input block `p` of
/// member `r`; gather output block `r` (root) is member `r`'s input; scatter output of member
/// `r` is block `r` of the root's input.
fn exchange_mismatch(c0: &CollectiveOp, recs: &[&Rec]) -> Option<(Vec<u32>, String)> {
    let es = ttrace_format::dtype::DType::from_nccl(c0.nccl_type)?.size();
    let block = c0.count as usize * es;
    let root = c0.root_or_peer.unwrap_or(0).max(0) as usize;
    let input = |r: usize| recs.get(r).and_then(|x| x.bytes_of(Role::Input));
    let block_of = |b: &[u8], i: usize| b.get(i * block..(i + 1) * block).map(<[u8]>::to_vec);
    let mut bad = Vec::new();
    for (p, rec) in recs.iter().enumerate() {
        let Some(out) = rec.bytes_of(Role::Output) else {
            continue;
        };
        let want: Option<Vec<u8>> = match c0.kind {
            CollectiveKind::AllToAll => (0..recs.len())
                .map(|r| input(r).and_then(|b| block_of(b, p)))
                .collect::<Option<Vec<_>>>()
                .map(|v| v.concat()),
            CollectiveKind::Gather if p == root => (0..recs.len())
                .map(|r| input(r).map(<[u8]>::to_vec))
                .collect::<Option<Vec<_>>>()
                .map(|v| v.concat()),
            CollectiveKind::Scatter => input(root).and_then(|b| block_of(b, p)),
            _ => None,
        };
        if want.is_some_and(|w| w != out) {
            bad.push(rec.record.rank);
        }
    }
    (!bad.is_empty()).then(|| {
        (
            bad,
            format!(
                "the {:?} output does not hold the blocks the members' inputs sent (communicator rank order)",
                c0.kind
            ),
        )
    })
}

/// The members whose broadcast output is not the root's input.
fn broadcast_mismatch(c0: &CollectiveOp, recs: &[&Rec]) -> Option<(Vec<u32>, String)> {
    let root = c0.root_or_peer.unwrap_or(0).max(0) as usize;
    let want = recs.get(root).and_then(|r| r.bytes_of(Role::Input))?;
    let bad: Vec<u32> = recs
        .iter()
        .filter(|r| r.bytes_of(Role::Output).is_some_and(|o| o != want))
        .map(|r| r.record.rank)
        .collect();
    (!bad.is_empty()).then(|| {
        (
            bad,
            format!("the received bytes differ from the root's (comm rank {root})"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ttrace_format::record::{packed_strides, Record, Tensor};

    const COMM: u64 = 0xc0;

    fn tensor(role: Role, bytes: &[u8]) -> Tensor {
        let shape = vec![(bytes.len() / 4) as u64];
        Tensor {
            role,
            dtype: DType::F32,
            strides: packed_strides(&shape),
            shape,
            ptr: 0,
            nbytes: bytes.len() as u64,
            captured: true,
            crc32: 0,
        }
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// A collective record of global rank `rank` (= communicator rank) on a comm of 2.
    fn rec(rank: u32, kind: CollectiveKind, peer: Option<i32>, tensors: &[(Role, Vec<u8>)]) -> Rec {
        let count = tensors.first().map_or(0, |t| t.1.len() / 4) as u64;
        Rec {
            record: Record {
                rank,
                step: 0,
                seq: 0,
                api: "ncclAllReduce".into(),
                op: Op::Collective(CollectiveOp {
                    kind,
                    count,
                    nccl_type: cuda_abi::nccl::ncclFloat32,
                    redop: (kind == CollectiveKind::AllReduce).then_some(cuda_abi::nccl::ncclSum),
                    root_or_peer: peer,
                    comm: COMM,
                    comm_rank: rank,
                    comm_size: 2,
                    sendbuff: 0,
                    recvbuff: 0,
                    group: 0,
                    premul: None,
                }),
                stream: 0,
                device: 0,
                thread: 0,
                nvtx: vec!["layers.0.attention.proj".into()],
                kernels_before: vec![],
                tensors: tensors.iter().map(|(r, b)| tensor(*r, b)).collect(),
                t_call_ns: 0,
                t_done_ns: 0,
            },
            bytes: tensors.iter().map(|(_, b)| Some(b.clone())).collect(),
            frame: None,
        }
    }

    /// The comm map of ranks 0 and 1 on `COMM`, and a trace of those ranks without records
    /// (records are fed one by one).
    fn two_ranks() -> (Manifest, Trace) {
        let trace = Trace {
            ranks: vec![0, 1],
            ..Trace::default()
        };
        (
            crate::model::comms::tests::manifest(&[(COMM, vec![Some(0), Some(1)])]),
            trace,
        )
    }

    /// A send of `v` from rank 0 to rank 1.
    fn send(v: &[f32]) -> Rec {
        rec(0, CollectiveKind::Send, Some(1), &[(Role::Input, f32s(v))])
    }

    /// A recv of `v` by rank 1 from rank 0.
    fn recv(v: &[f32]) -> Rec {
        rec(1, CollectiveKind::Recv, Some(0), &[(Role::Output, f32s(v))])
    }

    fn details(o: &Outcome) -> Vec<String> {
        o.findings.iter().map(|f| f.detail.clone()).collect()
    }

    fn run(records: Vec<Rec>) -> Outcome {
        let (manifest, mut trace) = two_ranks();
        trace.records = records;
        check(&trace, &manifest)
    }

    fn all_reduce(rank: u32, input: &[f32], output: &[f32]) -> Rec {
        rec(
            rank,
            CollectiveKind::AllReduce,
            None,
            &[(Role::Input, f32s(input)), (Role::Output, f32s(output))],
        )
    }

    #[test]
    fn a_call_is_handed_back_once_every_member_in_the_store_made_it() {
        // Ranks 0 and 1 in the comm map and the store: a call completes with its second
        // member; the calls ranks make in turn are numbered per rank.
        let manifest = crate::model::comms::tests::manifest(&[(COMM, vec![Some(0), Some(1)])]);
        let mut groups = CallGroups::new(&manifest, &[0, 1]);
        assert!(groups.add(all_reduce(0, &[1.0], &[2.0])).is_none());
        assert!(groups.add(all_reduce(0, &[1.0], &[2.0])).is_none());
        let (key, recs) = groups
            .add(all_reduce(1, &[1.0], &[2.0]))
            .expect("call 0 has both members");
        assert_eq!(key, (COMM, 0));
        assert_eq!(recs.len(), 2);
        // Call 1 waits for rank 1; a send is no call.
        let send = rec(
            0,
            CollectiveKind::Send,
            Some(1),
            &[(Role::Input, f32s(&[1.0]))],
        );
        assert!(groups.add(send).is_none());
        let left = groups.finish();
        assert_eq!(left.len(), 1);
        assert_eq!((left[0].0, left[0].1.len()), ((COMM, 1), 1));
        // Rank 1 not in the store: rank 0 alone completes each call.
        let mut alone = CallGroups::new(&manifest, &[0]);
        assert!(alone.add(all_reduce(0, &[1.0], &[1.0])).is_some());
    }

    #[test]
    fn a_call_waiting_only_for_a_rank_that_stopped_is_handed_back_when_its_last_step_is_read() {
        let manifest = crate::model::comms::tests::manifest(&[(COMM, vec![Some(0), Some(1)])]);
        // Rank 1's last step is 3, rank 0's 9.
        let mut groups =
            CallGroups::new(&manifest, &[0, 1]).with_last_steps(BTreeMap::from([(0, 9), (1, 3)]));
        assert!(groups.add(all_reduce(0, &[1.0], &[2.0])).is_none());
        // Step 2 read: rank 1 may still make the call.
        assert!(groups.ended(2).is_empty());
        // Step 3 read: rank 1 has no record left; the call is handed back as finish would.
        let ended = groups.ended(3);
        assert_eq!(ended.len(), 1);
        assert_eq!((ended[0].0, ended[0].1.len()), ((COMM, 0), 1));
        assert!(groups.finish().is_empty());
        // A member whose last step is not known (no segment of its rank) is waited for to
        // the end.
        let mut groups =
            CallGroups::new(&manifest, &[0, 1]).with_last_steps(BTreeMap::from([(1, 9)]));
        assert!(groups.add(all_reduce(1, &[1.0], &[2.0])).is_none());
        assert!(groups.ended(9).is_empty());
        assert_eq!(groups.finish().len(), 1);
        // A member of unknown global rank is waited for too.
        let unknown = crate::model::comms::tests::manifest(&[(COMM, vec![Some(0), None])]);
        let mut groups =
            CallGroups::new(&unknown, &[0, 1]).with_last_steps(BTreeMap::from([(0, 0), (1, 0)]));
        assert!(groups.add(all_reduce(0, &[1.0], &[2.0])).is_none());
        assert!(groups.ended(0).is_empty());
        // Communicator ranks are not global ranks: comm rank 0 is rank 1 and comm rank 1 is
        // rank 0, which stopped after step 3; rank 1 (comm rank 0) made the call.
        let swapped = crate::model::comms::tests::manifest(&[(COMM, vec![Some(1), Some(0)])]);
        let mut groups =
            CallGroups::new(&swapped, &[0, 1]).with_last_steps(BTreeMap::from([(0, 3), (1, 9)]));
        let mut by_rank_1 = all_reduce(0, &[1.0], &[2.0]);
        by_rank_1.record.rank = 1;
        assert!(groups.add(by_rank_1).is_none());
        assert_eq!(
            groups.ended(3).len(),
            1,
            "waits only for rank 0, which has ended"
        );
    }

    #[test]
    fn calls_are_cut_into_batches_of_at_most_so_many_bytes() {
        // Each call: two members of 8 bytes in and 8 out: 32 bytes.
        let call = |n: usize| {
            (
                (COMM, n),
                vec![
                    all_reduce(0, &[1.0, 2.0], &[2.0, 4.0]),
                    all_reduce(1, &[1.0, 2.0], &[2.0, 4.0]),
                ],
            )
        };
        let calls: Vec<Call> = (0..5).map(call).collect();
        let sizes = |most| {
            batches(&calls, most)
                .iter()
                .map(|b| b.len())
                .collect::<Vec<_>>()
        };
        assert_eq!(sizes(64), vec![2, 2, 1]);
        assert_eq!(sizes(1 << 20), vec![5]);
        assert_eq!(
            sizes(1),
            vec![1, 1, 1, 1, 1],
            "a call larger than the bound goes alone"
        );
        assert!(batches(&[], 64).is_empty());
    }

    #[test]
    fn sends_to_a_peer_that_stopped_are_checked_when_its_last_step_is_read_with_the_same_findings()
    {
        // Rank 1 stopped after step 3: rank 0's sends to it (two of the same bytes: the second
        // stale) never find their recvs. Checked as step 3 ends, they say what the end says.
        let (manifest, trace) = two_ranks();
        let records = vec![send(&[1.0, 2.0]), send(&[1.0, 2.0]), send(&[4.0, 2.0])];
        let groups =
            CallGroups::new(&manifest, &[0, 1]).with_last_steps(BTreeMap::from([(0, 9), (1, 3)]));
        let mut checks = Collectives::default();
        for r in records.clone() {
            checks.transfer(&trace, &manifest, r);
        }
        checks.ended(&trace, &groups, 2);
        assert_eq!(
            checks.paths[&(COMM, 0, 1)].sends.len(),
            3,
            "rank 1 may still receive"
        );
        checks.ended(&trace, &groups, 3);
        assert!(
            checks.paths[&(COMM, 0, 1)].sends.is_empty(),
            "none held past rank 1's end"
        );
        let early = checks.finish(&trace, &manifest, Vec::new());
        let whole = run(records);
        assert_eq!(details(&early), details(&whole));
        assert_eq!(early.checked, whole.checked);
        assert!(!early.findings.is_empty());
    }

    #[test]
    fn transfers_are_checked_as_their_ends_come_with_the_same_findings() {
        // Two sends of the same bytes in a step (the second stale), then their recvs, the
        // second received wrong: the same findings fed record by record in this order as
        // checked whole with the two ranks' records interleaved (each rank's in its order).
        let (manifest, trace) = two_ranks();
        let records = vec![
            send(&[1.0, 2.0]),
            send(&[1.0, 2.0]),
            recv(&[1.0, 2.0]),
            recv(&[1.0, 3.0]),
        ];
        let mut checks = Collectives::default();
        for r in records.clone() {
            checks.transfer(&trace, &manifest, r);
        }
        let fed = checks.finish(&trace, &manifest, Vec::new());
        let interleaved = [0, 2, 1, 3].map(|i| records[i].clone());
        let whole = run(interleaved.into());
        assert_eq!(details(&fed), details(&whole));
        assert_eq!(fed.checked, 2);
        assert_eq!(fed.findings.len(), 2, "{:?}", details(&fed));
        assert!(fed.findings[0].detail.contains("stale buffer"));
        assert!(fed.findings[1].detail.contains("differ from the sent ones"));
    }

    #[test]
    fn transfers_are_paired_in_order_whichever_end_comes_first_and_repeats_are_per_step() {
        let (manifest, trace) = two_ranks();
        let at = |mut r: Rec, step: u64| {
            r.record.step = step;
            r
        };
        let send = |v: &[f32], step| at(send(v), step);
        let recv = |v: &[f32], step| at(recv(v), step);
        // The recvs come first; the same bytes are sent once in step 0 and once in step 1
        // (each micro-batch of its own step: not a stale buffer), the second received wrong.
        let records = vec![
            recv(&[1.0, 2.0], 0),
            recv(&[1.0, 3.0], 1),
            send(&[1.0, 2.0], 0),
            send(&[1.0, 2.0], 1),
        ];
        let mut checks = Collectives::default();
        let mut groups = CallGroups::new(&manifest, &trace.ranks);
        for r in records {
            assert!(checks.feed(&mut groups, &trace, &manifest, r).is_none());
        }
        let out = checks.finish(&trace, &manifest, groups.finish());
        let details: Vec<&str> = out.findings.iter().map(|f| f.detail.as_str()).collect();
        assert_eq!(out.checked, 2);
        assert_eq!(details.len(), 1, "{details:?}");
        assert!(
            details[0].starts_with("the received bytes differ"),
            "{details:?}"
        );
        assert_eq!(out.findings[0].step, 1);
    }

    #[test]
    fn two_records_claiming_one_communicator_rank_do_not_complete_a_call() {
        // Ranks 0 and 2 both say they are communicator rank 0 of a communicator of 2 (set up
        // wrong): the call still waits for communicator rank 1, and takes all three records
        // when it comes, instead of completing without it and leaving rank 1's call alone.
        let manifest =
            crate::model::comms::tests::manifest(&[(COMM, vec![Some(0), Some(1), Some(2)])]);
        let mut groups = CallGroups::new(&manifest, &[0, 1, 2]);
        let mut claims_zero = all_reduce(2, &[1.0], &[2.0]);
        if let Op::Collective(c) = &mut claims_zero.record.op {
            c.comm_rank = 0;
        }
        assert!(groups.add(all_reduce(0, &[1.0], &[2.0])).is_none());
        assert!(
            groups.add(claims_zero).is_none(),
            "communicator rank 1 has not made the call"
        );
        let (key, recs) = groups
            .add(all_reduce(1, &[1.0], &[2.0]))
            .expect("every communicator rank made it");
        assert_eq!((key, recs.len()), ((COMM, 0), 3));
        assert!(groups.finish().is_empty());
    }

    #[test]
    fn a_call_waits_for_a_member_whose_rank_the_comm_map_does_not_know() {
        // Comm rank 1 has no known global rank: rank 1's record joins the call before it is
        // checked, as in a whole-trace grouping, instead of making a call of its own.
        let manifest = crate::model::comms::tests::manifest(&[(COMM, vec![Some(0), None])]);
        let mut groups = CallGroups::new(&manifest, &[0, 1]);
        assert!(groups.add(all_reduce(0, &[1.0], &[2.0])).is_none());
        let (key, recs) = groups
            .add(all_reduce(1, &[1.0], &[2.0]))
            .expect("complete with both members");
        assert_eq!((key, recs.len()), ((COMM, 0), 2));
        assert!(groups.finish().is_empty());
        // A communicator the map does not list waits for every member too.
        let mut unlisted = CallGroups::new(&crate::model::comms::tests::manifest(&[]), &[0]);
        assert!(unlisted.add(all_reduce(0, &[1.0], &[2.0])).is_none());
        assert_eq!(unlisted.finish().len(), 1);
    }

    #[test]
    fn all_reduces_that_reduce_pass_and_others_are_named() {
        let ok = run(vec![
            all_reduce(0, &[1.0, 2.0], &[4.0, 2.5]),
            all_reduce(1, &[3.0, 0.5], &[4.0, 2.5]),
        ]);
        assert_eq!((ok.checked, ok.findings.len()), (1, 0));
        let bad = run(vec![
            all_reduce(0, &[1.0, 2.0], &[4.0, 2.5]),
            all_reduce(1, &[3.0, 0.5], &[4.0, 2.0]),
        ]);
        assert_eq!(bad.findings.len(), 1);
        assert_eq!(bad.findings[0].kind, FindingKind::CollectiveMismatch);
        assert_eq!(bad.findings[0].ranks, vec![1]);
    }

    #[test]
    fn all_to_all_and_scatter_outputs_must_hold_the_blocks_sent() {
        let with_count = |mut r: Rec| {
            if let Op::Collective(c) = &mut r.record.op {
                c.count = 1;
            }
            r
        };
        let a2a = |rank, inp: &[f32], out: &[f32]| {
            with_count(rec(
                rank,
                CollectiveKind::AllToAll,
                None,
                &[(Role::Input, f32s(inp)), (Role::Output, f32s(out))],
            ))
        };
        // Rank 0 sends [1 to 0, 2 to 1], rank 1 sends [3 to 0, 4 to 1].
        let ok = run(vec![
            a2a(0, &[1.0, 2.0], &[1.0, 3.0]),
            a2a(1, &[3.0, 4.0], &[2.0, 4.0]),
        ]);
        assert_eq!((ok.checked, ok.findings.len()), (1, 0));
        let bad = run(vec![
            a2a(0, &[1.0, 2.0], &[1.0, 3.0]),
            a2a(1, &[3.0, 4.0], &[4.0, 2.0]),
        ]);
        assert_eq!(bad.findings.len(), 1);
        assert_eq!(bad.findings[0].ranks, vec![1]);

        let scatter = |rank, tensors: &[(Role, Vec<u8>)]| {
            with_count(rec(rank, CollectiveKind::Scatter, Some(0), tensors))
        };
        let root = || {
            scatter(
                0,
                &[
                    (Role::Input, f32s(&[5.0, 6.0])),
                    (Role::Output, f32s(&[5.0])),
                ],
            )
        };
        let ok = run(vec![root(), scatter(1, &[(Role::Output, f32s(&[6.0]))])]);
        assert_eq!(ok.findings.len(), 0);
        let bad = run(vec![root(), scatter(1, &[(Role::Output, f32s(&[5.0]))])]);
        assert_eq!(bad.findings[0].ranks, vec![1]);
    }

    #[test]
    fn a_member_that_never_calls_is_missing() {
        let out = run(vec![all_reduce(0, &[1.0], &[1.0])]);
        assert_eq!(out.findings.len(), 1);
        assert_eq!(out.findings[0].kind, FindingKind::CollectiveShape);
        assert_eq!(out.findings[0].ranks, vec![1]);
    }

    #[test]
    fn sends_match_their_recvs_byte_for_byte() {
        let send = |v: &[f32]| rec(0, CollectiveKind::Send, Some(1), &[(Role::Input, f32s(v))]);
        let recv = |v: &[f32]| rec(1, CollectiveKind::Recv, Some(0), &[(Role::Output, f32s(v))]);
        let ok = run(vec![send(&[1.0, 2.0]), recv(&[1.0, 2.0])]);
        assert_eq!((ok.checked, ok.findings.len()), (1, 0));
        let bad = run(vec![send(&[1.0, 2.0]), recv(&[1.0, 3.0])]);
        assert_eq!(bad.findings.len(), 1);
        assert_eq!(bad.findings[0].kind, FindingKind::PointToPoint);
        let lone = run(vec![send(&[1.0])]);
        assert_eq!(lone.findings.len(), 1);
        assert!(lone.findings[0].detail.contains("no matching recv"));
    }

    #[test]
    fn reductions_within_round_off_pass_and_wrong_ones_fail() {
        let inputs = vec![
            TensorData::F32(vec![1.0, 1e-8, 3.0]),
            TensorData::F32(vec![2.0, 1.0, f32::INFINITY]),
        ];
        let good = TensorData::F32(vec![3.0, 1.0, f32::INFINITY]);
        assert_eq!(
            check_reduction(
                DType::F32,
                Reduction {
                    op: Red::Sum,
                    factors: None
                },
                &inputs,
                0,
                &good,
                0,
                3
            ),
            None
        );
        let bad = TensorData::F32(vec![3.0, 1.0 + 2f32.powi(-20), f32::INFINITY]);
        let m = check_reduction(
            DType::F32,
            Reduction {
                op: Red::Sum,
                factors: None,
            },
            &inputs,
            0,
            &bad,
            0,
            3,
        );
        assert_eq!(m.map(|m| m.0), Some(1));
        let avg = TensorData::F32(vec![1.5, 0.5, f32::INFINITY]);
        assert_eq!(
            check_reduction(
                DType::F32,
                Reduction {
                    op: Red::Avg,
                    factors: None
                },
                &inputs,
                0,
                &avg,
                0,
                3
            ),
            None
        );
    }

    /// Checked a block at a time, the reduction finds the element that is wrong wherever it
    /// lies against the blocks (last of one, first of the next, in a short last block), with
    /// offsets into the inputs and the output (a reduce-scatter's share) and BF16 inputs
    /// widened block by block: the index is the element's, counted from the offset.
    #[test]
    fn a_wrong_element_is_found_wherever_it_lies_against_the_blocks() {
        let len = 2 * REDUCTION_BLOCK + 37;
        let (in_off, out_off) = (5, 3);
        let value = |i: usize| ((i % 251) as f32) * 0.25 - 31.0;
        let inputs: Vec<TensorData> = (0..2)
            .map(|m| {
                TensorData::BF16(
                    (0..in_off + len)
                        .map(|i| half::bf16::from_f32(value(i) + m as f32))
                        .collect(),
                )
            })
            .collect();
        let sum = |i: usize| -> f32 {
            inputs
                .iter()
                .map(|t| t.get_f64(in_off + i).unwrap_or(f64::NAN) as f32)
                .sum()
        };
        let sum_op = Reduction {
            op: Red::Sum,
            factors: None,
        };
        let output = |wrong: Option<usize>| {
            let mut v: Vec<f32> = vec![0.0; out_off];
            v.extend((0..len).map(|i| sum(i) + if Some(i) == wrong { 1.0 } else { 0.0 }));
            TensorData::F32(v)
        };
        let check = |out: &TensorData| {
            check_reduction(DType::BF16, sum_op, &inputs, in_off, out, out_off, len).map(|m| m.0)
        };
        assert_eq!(check(&output(None)), None);
        for wrong in [
            0,
            REDUCTION_BLOCK - 1,
            REDUCTION_BLOCK,
            2 * REDUCTION_BLOCK - 1,
            2 * REDUCTION_BLOCK,
            len - 1,
        ] {
            assert_eq!(check(&output(Some(wrong))), Some(wrong), "wrong at {wrong}");
        }
        // An output shorter than `len`: its missing elements read as NaN, a mismatch at the
        // first of them.
        let TensorData::F32(mut short) = output(None) else {
            unreachable!("an f32 output")
        };
        short.truncate(out_off + REDUCTION_BLOCK + 1);
        assert_eq!(check(&TensorData::F32(short)), Some(REDUCTION_BLOCK + 1));
    }

    #[test]
    fn a_premulsum_output_is_the_sum_of_the_inputs_times_their_factors() {
        let inputs = vec![
            TensorData::F32(vec![1.0, 4.0]),
            TensorData::F32(vec![3.0, -2.0]),
        ];
        let factors = [0.5, 0.5];
        let good = TensorData::F32(vec![2.0, 1.0]);
        assert_eq!(
            check_reduction(
                DType::F32,
                Reduction {
                    op: Red::Sum,
                    factors: Some(&factors),
                },
                &inputs,
                0,
                &good,
                0,
                2
            ),
            None
        );
        // The plain sum (the factor forgotten) is a mismatch.
        let unscaled = TensorData::F32(vec![4.0, 2.0]);
        let m = check_reduction(
            DType::F32,
            Reduction {
                op: Red::Sum,
                factors: Some(&factors),
            },
            &inputs,
            0,
            &unscaled,
            0,
            2,
        );
        assert_eq!(m.map(|m| (m.0, m.2)), Some((0, 2.0)));
    }
}
