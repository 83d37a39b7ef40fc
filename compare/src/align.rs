//! Which reference GEMM each GEMM of the run is, without framework knowledge.
//!
//! 1. **Pipeline stages** come from the communicator the run's send/recv ops use: a rank's
//!    stage is its rank in it. Without point-to-point ops there is one stage.
//! 2. **Segments**: a rank's GEMMs in a step are cut at its send/recv ops. A segment followed
//!    by a send to the next stage (or preceded by a receive from the previous one) is a
//!    forward segment; one preceded by a receive from the next stage (or followed by a send to
//!    the previous one) is backward; the last stage runs a micro-batch's forward and backward
//!    back to back, so its segments are both. With more micro-batches than stages (1F1B),
//!    the first stage's backward of micro-batch k and forward of micro-batch k + pp run back
//!    to back with no send or receive between them: such a segment is split by the lengths
//!    of the stage's pure backward and forward segments. The k-th segment of a kind is
//!    micro-batch k.
//! 3. **Offsets**: the reference runs micro-batch after micro-batch, each the same sequence of
//!    `P` GEMMs: every stage's forward, then every stage's backward in reverse. So stage s's
//!    forward starts at the sum of the forward lengths of the stages before it, and its
//!    backward ends where the backward of the stages before it begins. With one stage, the
//!    whole step is one segment.
//! 4. Inside a segment, the GEMMs are aligned with the reference window by Needleman–Wunsch
//!    over op signatures (API, transposes, types, and dimensions equal to or a divisor of the
//!    reference's: TP, SP and DP shrink dimensions by the group sizes), so a GEMM the run
//!    adds or lacks costs a gap instead of shifting everything after it.
//!
//! Collectives have no counterpart in a single-device run; they are compared through the
//! GEMM outputs they reduce (see [`crate::engine`]).

use std::collections::BTreeMap;

use ttrace_format::record::{CollectiveKind, GemmOp, Record};

use crate::trace::{collective, gemm, RunTrace};

/// A run op's counterpart in the reference: `(step, seq)` of a reference record.
pub type RefOp = (u64, u64);

/// The alignment of a run with its reference.
#[derive(Debug, Default)]
pub struct Alignment {
    /// `(rank, step, seq)` of a run GEMM → its reference op.
    pub of_run: BTreeMap<(u32, u64, u64), RefOp>,
    /// Reference op → the run ops `(rank, seq)` that are its shards.
    pub of_ref: BTreeMap<RefOp, Vec<(u32, u64)>>,
    /// Pipeline stage of each rank.
    pub stage: BTreeMap<u32, u32>,
    /// Pipeline size.
    pub pp: u32,
    /// The communicator of the point-to-point ops, when there is one.
    pub p2p_comm: Option<u64>,
    /// Micro-batch of each aligned reference op, when the run's segments told it.
    pub micro_batch: BTreeMap<RefOp, u32>,
    /// Run GEMMs without a counterpart, and why alignment was partial.
    pub warnings: Vec<String>,
    /// Run GEMMs with no counterpart.
    pub unaligned: u64,
}

/// Whether a run GEMM can be a shard of a reference GEMM: same transposes and types, each
/// dimension equal to or a divisor of the reference's.
pub fn compatible(run: (&str, &GemmOp), reff: (&str, &GemmOp)) -> bool {
    // The API may differ (a reference on cuBLAS, a run on cuBLASLt): the math may not.
    let (_, r) = run;
    let (_, f) = reff;
    let divides = |x: u64, y: u64| x == y || (x > 0 && y.is_multiple_of(x));
    r.transa == f.transa
        && r.transb == f.transb
        && r.a_type == f.a_type
        && r.b_type == f.b_type
        && r.d_type == f.d_type
        && divides(r.m, f.m)
        && divides(r.n, f.n)
        && divides(r.k, f.k)
        && divides(r.batch.max(1), f.batch.max(1))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Forward,
    Backward,
    Both,
    Whole,
    /// A backward then a forward with no point-to-point op between them: the first stage of
    /// a 1F1B schedule with more micro-batches than stages (its backward of micro-batch k
    /// sends nothing back, its forward of micro-batch k + pp receives nothing), split by the
    /// lengths of its pure segments ([`split_mixed`]).
    BackwardForward,
}

#[derive(Debug)]
struct Segment {
    kind: Kind,
    /// Indices into the rank's records of the step.
    gemms: Vec<usize>,
}

fn is_p2p(r: &Record) -> Option<(CollectiveKind, u64, i32)> {
    let c = collective(r)?;
    match c.kind {
        CollectiveKind::Send | CollectiveKind::Recv => Some((c.kind, c.comm, c.root_or_peer?)),
        _ => None,
    }
}

/// Cuts a rank's step into segments and names their kind.
fn segments(recs: &[Record], stage: u32, pp: u32) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut before: Option<(CollectiveKind, i32)> = None;
    let last = pp.saturating_sub(1) as i32;
    let s = stage as i32;
    let classify = |before: Option<(CollectiveKind, i32)>, after: Option<(CollectiveKind, i32)>| {
        if pp <= 1 {
            return Kind::Whole;
        }
        if s == last {
            return Kind::Both;
        }
        if matches!(before, Some((CollectiveKind::Recv, p)) if p == s + 1)
            && matches!(after, Some((CollectiveKind::Send, p)) if p == s + 1)
        {
            return Kind::BackwardForward;
        }
        let fwd = matches!(after, Some((CollectiveKind::Send, p)) if p == s + 1)
            || matches!(before, Some((CollectiveKind::Recv, p)) if p == s - 1);
        let bwd = matches!(before, Some((CollectiveKind::Recv, p)) if p == s + 1)
            || matches!(after, Some((CollectiveKind::Send, p)) if p == s - 1);
        match (fwd, bwd) {
            (true, false) => Kind::Forward,
            (false, true) => Kind::Backward,
            // Stage 0 after its last receive of the step: backward.
            _ if before.is_some() => Kind::Backward,
            _ => Kind::Forward,
        }
    };
    for (i, r) in recs.iter().enumerate() {
        if let Some((kind, _, peer)) = is_p2p(r) {
            if !current.is_empty() {
                out.push(Segment {
                    kind: classify(before, Some((kind, peer))),
                    gemms: std::mem::take(&mut current),
                });
            }
            before = Some((kind, peer));
        } else if gemm(r).is_some() {
            current.push(i);
        }
    }
    if !current.is_empty() {
        out.push(Segment {
            kind: classify(before, None),
            gemms: current,
        });
    }
    out
}

/// Splits each backward-then-forward segment into its backward (the first `bwd` GEMMs) and
/// its forward (the last `fwd`), the lengths of the stage's pure segments; one whose length
/// is not their sum is taken as a backward, as the segments around it cannot tell more.
fn split_mixed(segs: Vec<Segment>, bwd: Option<usize>, fwd: Option<usize>) -> Vec<Segment> {
    let mut out = Vec::with_capacity(segs.len() + 1);
    for seg in segs {
        match (seg.kind, bwd, fwd) {
            (Kind::BackwardForward, Some(b), Some(f)) if seg.gemms.len() == b + f => {
                let (back, forth) = seg.gemms.split_at(b);
                out.push(Segment {
                    kind: Kind::Backward,
                    gemms: back.to_vec(),
                });
                out.push(Segment {
                    kind: Kind::Forward,
                    gemms: forth.to_vec(),
                });
            }
            (Kind::BackwardForward, ..) => out.push(Segment {
                kind: Kind::Backward,
                gemms: seg.gemms,
            }),
            _ => out.push(seg),
        }
    }
    out
}

/// Needleman–Wunsch of `run` against `reff` (signatures compatible or not): returns the
/// aligned pairs (indices into each). Matches score 2, gaps −1; incompatible pairs never
/// match.
pub fn needleman_wunsch<T, U>(
    run: &[T],
    reff: &[U],
    ok: impl Fn(&T, &U) -> bool,
) -> Vec<(usize, usize)> {
    let (n, m) = (run.len(), reff.len());
    if n == m && run.iter().zip(reff).all(|(a, b)| ok(a, b)) {
        return (0..n).map(|i| (i, i)).collect();
    }
    const GAP: i64 = -1;
    const MATCH: i64 = 2;
    let w = m + 1;
    let mut score = vec![0i64; (n + 1) * w];
    for i in 1..=n {
        score[i * w] = GAP * i as i64;
    }
    for (j, s) in score.iter_mut().enumerate().take(m + 1).skip(1) {
        *s = GAP * j as i64;
    }
    for i in 1..=n {
        for j in 1..=m {
            let diag = if ok(&run[i - 1], &reff[j - 1]) {
                score[(i - 1) * w + j - 1] + MATCH
            } else {
                i64::MIN / 2
            };
            let up = score[(i - 1) * w + j] + GAP;
            let left = score[i * w + j - 1] + GAP;
            score[i * w + j] = diag.max(up).max(left);
        }
    }
    let mut pairs = Vec::new();
    let (mut i, mut j) = (n, m);
    while i > 0 && j > 0 {
        let here = score[i * w + j];
        if ok(&run[i - 1], &reff[j - 1]) && here == score[(i - 1) * w + j - 1] + MATCH {
            pairs.push((i - 1, j - 1));
            i -= 1;
            j -= 1;
        } else if here == score[(i - 1) * w + j] + GAP {
            i -= 1;
        } else {
            j -= 1;
        }
    }
    pairs.reverse();
    pairs
}

/// Each rank's pipeline stage: its rank in the communicator its send/recv ops use (0
/// without point-to-point ops); the pipeline size and communicator.
fn stages(run: &RunTrace, ranks: &[u32], al: &mut Alignment) {
    for &rank in ranks {
        // The rank's steps in order, read until the first point-to-point op.
        let p2p = run
            .segment_keys()
            .into_iter()
            .filter(|&(r, _)| r == rank)
            .find_map(|(r, step)| {
                run.records(r, step)
                    .iter()
                    .find_map(|r| collective(r).filter(|_| is_p2p(r).is_some()).cloned())
            });
        match p2p {
            Some(c) => {
                al.stage.insert(rank, c.comm_rank);
                al.pp = al.pp.max(c.comm_size);
                al.p2p_comm.get_or_insert(c.comm);
            }
            None => {
                al.stage.insert(rank, 0);
            }
        }
    }
}

/// Per stage, the GEMMs of a forward and of a backward segment (from the first rank of each
/// stage), and the micro-batches per step (forward segments of a pipelined rank).
#[allow(clippy::type_complexity)]
fn segment_lengths(
    per_rank: &BTreeMap<u32, Vec<Segment>>,
    al: &Alignment,
) -> (BTreeMap<u32, usize>, BTreeMap<u32, usize>, usize) {
    let mut fwd_len: BTreeMap<u32, usize> = BTreeMap::new();
    let mut bwd_len: BTreeMap<u32, usize> = BTreeMap::new();
    let mut micro_batches = 1usize;
    for (&r, segs) in per_rank {
        let st = al.stage[&r];
        for s in segs {
            match s.kind {
                Kind::Forward => {
                    fwd_len.entry(st).or_insert(s.gemms.len());
                }
                Kind::Backward => {
                    bwd_len.entry(st).or_insert(s.gemms.len());
                }
                _ => {}
            }
        }
        let n = segs
            .iter()
            .filter(|s| matches!(s.kind, Kind::Forward | Kind::Both))
            .count();
        if al.pp > 1 {
            micro_batches = micro_batches.max(n);
        }
    }
    (fwd_len, bwd_len, micro_batches)
}

impl Alignment {
    /// An alignment of no step yet, knowing the run's pipeline stages.
    pub fn start(run: &RunTrace) -> Alignment {
        let mut al = Alignment {
            pp: 1,
            ..Alignment::default()
        };
        stages(run, &run.ranks(), &mut al);
        al
    }

    /// Aligns every GEMM of `run` in `step` with `reff` (rank 0 of the reference). Steps
    /// are aligned apart from each other, in any order.
    pub fn align_step(&mut self, reff: &RunTrace, run: &RunTrace, step: u64) {
        let al = self;
        let ref_rank = reff.ranks().first().copied().unwrap_or(0);
        let ranks = run.ranks();
        let ref_recs = reff.records(ref_rank, step);
        let ref_gemms: Vec<usize> = (0..ref_recs.len())
            .filter(|&i| gemm(&ref_recs[i]).is_some())
            .collect();
        // Each rank's records read once: the segments' GEMM indices point into them (records
        // read again after the metadata budget dropped them may be fewer).
        let recs_of: BTreeMap<u32, _> = ranks.iter().map(|&r| (r, run.records(r, step))).collect();
        let per_rank: BTreeMap<u32, Vec<Segment>> = recs_of
            .iter()
            .map(|(&r, recs)| {
                let st = al.stage.get(&r).copied().unwrap_or(0);
                (r, segments(recs, st, al.pp))
            })
            .collect();

        // The pure segments' lengths split the mixed ones; then the micro-batches are counted.
        let (fwd_len, bwd_len, _) = segment_lengths(&per_rank, al);
        let per_rank: BTreeMap<u32, Vec<Segment>> = per_rank
            .into_iter()
            .map(|(r, segs)| {
                let st = al.stage.get(&r).copied().unwrap_or(0);
                let (b, f) = (bwd_len.get(&st).copied(), fwd_len.get(&st).copied());
                (r, split_mixed(segs, b, f))
            })
            .collect();
        let (fwd_len, bwd_len, micro_batches) = segment_lengths(&per_rank, al);
        let total = ref_gemms.len();
        if al.pp > 1 && !total.is_multiple_of(micro_batches) {
            al.warnings.push(format!(
                "step {step}: the reference has {total} GEMMs, not a multiple of the run's \
                 {micro_batches} micro-batches; alignment is partial"
            ));
        }
        let period = if al.pp > 1 {
            total / micro_batches.max(1)
        } else {
            total
        };
        let last = al.pp.saturating_sub(1);
        let f_before =
            |s: u32| -> usize { (0..s).map(|t| fwd_len.get(&t).copied().unwrap_or(0)).sum() };
        let b_through =
            |s: u32| -> usize { (0..=s).map(|t| bwd_len.get(&t).copied().unwrap_or(0)).sum() };

        for (&rank, segs) in &per_rank {
            let st = al.stage[&rank];
            let recs = &recs_of[&rank];
            let mut count: BTreeMap<u8, usize> = BTreeMap::new();
            for seg in segs {
                let key = match seg.kind {
                    Kind::Forward => 0,
                    // (split_mixed left none mixed)
                    Kind::Backward | Kind::BackwardForward => 1,
                    Kind::Both => 2,
                    Kind::Whole => 3,
                };
                let unit = *count.entry(key).and_modify(|c| *c += 1).or_insert(0);
                let (start, len) = match seg.kind {
                    Kind::Whole => (0, total),
                    Kind::Forward => (unit * period + f_before(st), seg.gemms.len()),
                    Kind::Both => (unit * period + f_before(last), seg.gemms.len()),
                    Kind::Backward | Kind::BackwardForward => {
                        let end = (unit + 1) * period;
                        (end.saturating_sub(b_through(st)), seg.gemms.len())
                    }
                };
                let window: Vec<usize> = ref_gemms.iter().skip(start).take(len).copied().collect();
                let pairs = needleman_wunsch(&seg.gemms, &window, |&ri, &fi| {
                    match (gemm(&recs[ri]), gemm(&ref_recs[fi])) {
                        (Some(a), Some(b)) => {
                            compatible((&recs[ri].api, a), (&ref_recs[fi].api, b))
                        }
                        _ => false,
                    }
                });
                if pairs.len() < seg.gemms.len() {
                    al.unaligned += (seg.gemms.len() - pairs.len()) as u64;
                    al.warnings.push(format!(
                        "rank {rank} step {step}: {} of {} GEMMs in a segment have no \
                         counterpart in the reference",
                        seg.gemms.len() - pairs.len(),
                        seg.gemms.len()
                    ));
                }
                for (a, b) in pairs {
                    let r = &recs[seg.gemms[a]];
                    let f = &ref_recs[window[b]];
                    let key = (step, f.seq);
                    al.of_run.insert((rank, step, r.seq), key);
                    al.of_ref.entry(key).or_default().push((rank, r.seq));
                    if al.pp > 1 || seg.kind == Kind::Whole {
                        let mb = if seg.kind == Kind::Whole {
                            // One stage: micro-batches are not told apart by p2p ops.
                            continue;
                        } else {
                            unit as u32
                        };
                        al.micro_batch.insert(key, mb);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mixed_segment_splits_by_the_stage_s_pure_lengths_or_stays_a_backward() {
        let mixed = || {
            vec![Segment {
                kind: Kind::BackwardForward,
                gemms: (0..5).collect(),
            }]
        };
        let split = split_mixed(mixed(), Some(3), Some(2));
        let got: Vec<(Kind, Vec<usize>)> = split.into_iter().map(|s| (s.kind, s.gemms)).collect();
        assert_eq!(
            got,
            vec![(Kind::Backward, vec![0, 1, 2]), (Kind::Forward, vec![3, 4])]
        );
        for (b, f) in [(Some(3), Some(3)), (None, Some(2)), (Some(3), None)] {
            let kept = split_mixed(mixed(), b, f);
            assert_eq!(kept.len(), 1);
            assert_eq!(kept[0].kind, Kind::Backward);
        }
    }
    use ttrace_format::record::{CollectiveOp, Op};

    /// A GEMM record (shape irrelevant here).
    fn g(seq: u64) -> Record {
        let mut r = Record::d2h_copy(0, 0, seq, &[]);
        r.api = "cublasGemmEx".into();
        r.op = Op::Gemm(Box::new(GemmOp::plain(8, 8, 8, 14)));
        r
    }

    /// A send (`to`) or receive (`from`) with a pipeline peer.
    fn p2p(seq: u64, kind: CollectiveKind, peer: i32) -> Record {
        let mut r = Record::d2h_copy(0, 0, seq, &[]);
        r.api = "ncclSend".into();
        r.op = Op::Collective(CollectiveOp {
            kind,
            count: 1,
            nccl_type: cuda_abi::nccl::ncclFloat32,
            redop: None,
            root_or_peer: Some(peer),
            comm: 1,
            comm_rank: 0,
            comm_size: 2,
            sendbuff: 0,
            recvbuff: 0,
            group: 0,
            premul: None,
        });
        r
    }

    fn kinds(recs: &[Record], stage: u32, pp: u32) -> Vec<(Kind, usize)> {
        segments(recs, stage, pp)
            .into_iter()
            .map(|s| (s.kind, s.gemms.len()))
            .collect()
    }

    #[test]
    fn a_first_stage_under_1f1b_has_forwards_then_backwards() {
        // F0 send F1 send | recv B0 | recv B1.
        use CollectiveKind::{Recv, Send};
        let recs = vec![
            g(0),
            g(1),
            p2p(2, Send, 1),
            g(3),
            g(4),
            p2p(5, Send, 1),
            p2p(6, Recv, 1),
            g(7),
            g(8),
            g(9),
            p2p(10, Recv, 1),
            g(11),
            g(12),
            g(13),
        ];
        assert_eq!(
            kinds(&recs, 0, 2),
            vec![
                (Kind::Forward, 2),
                (Kind::Forward, 2),
                (Kind::Backward, 3),
                (Kind::Backward, 3)
            ]
        );
    }

    #[test]
    fn the_last_stage_runs_forward_and_backward_back_to_back() {
        use CollectiveKind::{Recv, Send};
        let recs = vec![
            p2p(0, Recv, 0),
            g(1),
            g(2),
            g(3),
            p2p(4, Send, 0),
            p2p(5, Recv, 0),
            g(6),
            g(7),
            g(8),
            p2p(9, Send, 0),
        ];
        assert_eq!(kinds(&recs, 1, 2), vec![(Kind::Both, 3), (Kind::Both, 3)]);
    }

    #[test]
    fn without_a_pipeline_the_step_is_one_segment() {
        let recs: Vec<Record> = (0..5).map(g).collect();
        assert_eq!(kinds(&recs, 0, 1), vec![(Kind::Whole, 5)]);
    }

    #[test]
    fn shards_are_compatible_when_every_dimension_divides() {
        let full = g(0);
        let mut shard = g(1);
        if let Op::Gemm(s) = &mut shard.op {
            s.n = 4;
        }
        let (Some(f), Some(h)) = (gemm(&full), gemm(&shard)) else {
            panic!("gemms")
        };
        assert!(compatible(("cublasLtMatmul", h), ("cublasGemmEx", f)));
        let mut other = h.clone();
        other.n = 3;
        assert!(!compatible(("x", &other), ("x", f)), "3 does not divide 8");
        other.n = 4;
        other.transa = 1;
        assert!(
            !compatible(("x", &other), ("x", f)),
            "transposes must agree"
        );
    }

    #[test]
    fn needleman_wunsch_skips_an_extra_op() {
        let run = [1, 2, 9, 3, 4];
        let reff = [1, 2, 3, 4];
        let pairs = needleman_wunsch(&run, &reff, |a, b| a == b);
        assert_eq!(pairs, vec![(0, 0), (1, 1), (3, 2), (4, 3)]);
    }

    #[test]
    fn needleman_wunsch_is_positional_when_everything_matches() {
        let run = [5, 5, 5];
        let pairs = needleman_wunsch(&run, &run, |a, b| a == b);
        assert_eq!(pairs, vec![(0, 0), (1, 1), (2, 2)]);
    }
}
