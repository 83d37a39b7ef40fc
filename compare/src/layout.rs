//! The run's parallel layout, read from its communicator map when the user does not give it.
//!
//! Pipeline size: the point-to-point communicator's size. Tensor parallel: the communicator
//! whose collectives most often sit between GEMMs of the forward and backward passes (the
//! TP all-reduces and SP gathers). Data parallel: what is left of the world. The rank order
//! (fastest-varying first) from the rank strides of those groups.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use ttrace_format::record::{CollectiveKind, Record};

use crate::align::Alignment;
use crate::trace::{collective, gemm, RunTrace};

/// The parallel layout of the compared run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutSummary {
    /// Tensor-parallel size.
    pub tp: u32,
    /// Data-parallel size.
    pub dp: u32,
    /// Pipeline-parallel size.
    pub pp: u32,
    /// Rank order, fastest-varying first (e.g. `tp-dp-pp`).
    pub order: String,
    /// True when read from the communicator map, false when given with `--layout`.
    pub discovered: bool,
}

/// Parses `tp=2,dp=2,pp=2[,order=tp-dp-pp]`.
pub fn parse(s: &str) -> Result<LayoutSummary, String> {
    let mut l = LayoutSummary {
        tp: 1,
        dp: 1,
        pp: 1,
        order: "tp-dp-pp".into(),
        discovered: false,
    };
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}`: expected KEY=VALUE (e.g. tp=2)"))?;
        let num = || {
            v.parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("`{part}`: {k} must be a positive integer"))
        };
        match k {
            "tp" => l.tp = num()?,
            "dp" => l.dp = num()?,
            "pp" => l.pp = num()?,
            "order" => {
                let mut dims: Vec<&str> = v.split('-').collect();
                dims.sort_unstable();
                if dims != ["dp", "pp", "tp"] {
                    return Err(format!(
                        "`{part}`: order must name tp, dp and pp once each (e.g. tp-dp-pp)"
                    ));
                }
                l.order = v.to_string();
            }
            _ => return Err(format!("`{part}`: unknown key `{k}` (tp, dp, pp, order)")),
        }
    }
    Ok(l)
}

/// What the layout is read from, gathered a segment at a time ([`LayoutEvidence::observe`]):
/// the point-to-point communicators (one per pipeline) and, per communicator, the
/// collectives on GEMM buffers between two GEMMs of a step.
#[derive(Debug, Default)]
pub struct LayoutEvidence {
    p2p: BTreeSet<u64>,
    /// Communicator -> (its size, collectives between GEMMs), point-to-point ones included
    /// (left out when the layout is concluded).
    between: BTreeMap<u64, (u32, u64)>,
}

impl LayoutEvidence {
    /// Takes in one segment's records (a rank's step, in seq order).
    pub fn observe(&mut self, recs: &[Record]) {
        self.p2p.extend(
            recs.iter()
                .filter_map(collective)
                .filter(|c| matches!(c.kind, CollectiveKind::Send | CollectiveKind::Recv))
                .map(|c| c.comm),
        );
        let first = recs.iter().position(|r| gemm(r).is_some());
        let last = recs.iter().rposition(|r| gemm(r).is_some());
        let (Some(first), Some(last)) = (first, last) else {
            return;
        };
        // Buffers GEMMs read or wrote in this step: a TP collective reduces a GEMM output
        // or gathers a GEMM input (an FP8 amax reduction, also between GEMMs, does neither).
        let ranges: Vec<(u64, u64)> = recs
            .iter()
            .filter(|r| gemm(r).is_some())
            .flat_map(|r| r.tensors.iter().map(|t| (t.ptr, t.ptr + t.nbytes)))
            .collect();
        let touches = |lo: u64, hi: u64| ranges.iter().any(|&(a, b)| a < hi && lo < b);
        for r in &recs[first..last] {
            if let Some(c) = collective(r) {
                let bytes: u64 = r.tensors.iter().map(|t| t.nbytes).max().unwrap_or(0);
                let gemm_buffer = touches(c.sendbuff, c.sendbuff + bytes)
                    || touches(c.recvbuff, c.recvbuff + bytes);
                if gemm_buffer && c.comm_size > 1 {
                    self.between.entry(c.comm).or_insert((c.comm_size, 0)).1 += 1;
                }
            }
        }
    }

    /// The evidence of every segment of `run`.
    pub fn of(run: &RunTrace) -> LayoutEvidence {
        let mut e = LayoutEvidence::default();
        for (rank, step) in run.segment_keys() {
            e.observe(&run.records(rank, step));
        }
        e
    }
}

/// The layout of `run`, from its communicators and alignment.
pub fn discover(run: &RunTrace, al: &Alignment) -> LayoutSummary {
    conclude(run, al, LayoutEvidence::of(run))
}

/// The layout of `run`, from the evidence of every one of its segments and its alignment.
pub fn conclude(run: &RunTrace, al: &Alignment, evidence: LayoutEvidence) -> LayoutSummary {
    let world = run.world_size();
    let pp = al.pp.max(1);
    let LayoutEvidence { p2p, mut between } = evidence;
    between.retain(|comm, _| !p2p.contains(comm));
    let tp_comm = between
        .iter()
        .max_by_key(|(_, (_, n))| *n)
        .map(|(k, v)| (*k, v.0));
    let tp = tp_comm.map_or(1, |t| t.1);
    let dp = (world / (tp * pp).max(1)).max(1);
    let stride = |comm: Option<u64>| -> Option<u32> {
        let m = run.comm_members(comm?)?;
        (m.len() > 1).then(|| m[1].abs_diff(m[0]))
    };
    let tp_stride = if tp > 1 {
        stride(tp_comm.map(|t| t.0))
    } else {
        None
    };
    let pp_stride = if pp > 1 { stride(al.p2p_comm) } else { None };
    // DP's stride is whichever of 1, tp, tp*pp... the other two leave.
    let mut dims: Vec<(&str, u32)> = vec![
        ("tp", tp_stride.unwrap_or(if tp > 1 { 1 } else { 0 })),
        ("pp", pp_stride.unwrap_or(u32::MAX)),
    ];
    let dp_stride = {
        let used: Vec<u32> = dims.iter().map(|d| d.1).collect();
        [1, tp, tp * dp, tp * pp, pp, dp * pp]
            .into_iter()
            .find(|s| !used.contains(s))
            .unwrap_or(u32::MAX - 1)
    };
    dims.push(("dp", if dp > 1 { dp_stride } else { u32::MAX - 1 }));
    dims.sort_by_key(|d| d.1);
    LayoutSummary {
        tp,
        dp,
        pp,
        order: dims.iter().map(|d| d.0).collect::<Vec<_>>().join("-"),
        discovered: true,
    }
}

/// Checks a layout given with `--layout` against what the run's trace says: the world
/// size the ranks reported, the pipeline's point-to-point communicator, and, when the trace
/// holds collectives on GEMM buffers, the size of the tensor-parallel communicator. Returns
/// one line naming the difference.
pub fn validate(
    given: &LayoutSummary,
    run: &RunTrace,
    al: &Alignment,
    evidence: LayoutEvidence,
) -> Result<(), String> {
    let world = run.world_size();
    let product = given.tp * given.dp * given.pp;
    if product != world {
        return Err(format!(
            "--layout tp={} dp={} pp={} has {product} ranks but {} ran on {world}",
            given.tp,
            given.dp,
            given.pp,
            run.path.display()
        ));
    }
    if al.pp > 1 && al.pp != given.pp {
        return Err(format!(
            "--layout says pp={} but {}'s send/recv communicator has {} ranks (pp={})",
            given.pp,
            run.path.display(),
            al.pp,
            al.pp
        ));
    }
    if run.has_collectives() {
        let found = conclude(run, al, evidence);
        if found.tp > 1 && found.tp != given.tp {
            return Err(format!(
                "--layout says tp={} but {}'s collectives between GEMMs run on communicators \
                 of {} ranks (tp={})",
                given.tp,
                run.path.display(),
                found.tp,
                found.tp
            ));
        }
    }
    Ok(())
}

/// A rank's `(tp, dp, pp)` coordinates in `layout`.
pub fn coords(layout: &LayoutSummary, rank: u32) -> (u32, u32, u32) {
    let mut rest = rank;
    let (mut t, mut d, mut p) = (0, 0, 0);
    for dim in layout.order.split('-') {
        let (size, slot) = match dim {
            "tp" => (layout.tp, &mut t),
            "dp" => (layout.dp, &mut d),
            _ => (layout.pp, &mut p),
        };
        *slot = rest % size.max(1);
        rest /= size.max(1);
    }
    (t, d, p)
}

/// Whether `members` form a data-parallel group of `layout`: more than one rank, differing
/// only in their data-parallel coordinate.
pub fn is_dp_group(layout: &LayoutSummary, members: &[u32]) -> bool {
    layout.dp > 1 && varies_only_in(layout, members, 1)
}

/// Whether `members` form a tensor-parallel group of `layout`: more than one rank, differing
/// only in their tensor-parallel coordinate.
pub fn is_tp_group(layout: &LayoutSummary, members: &[u32]) -> bool {
    layout.tp > 1 && varies_only_in(layout, members, 0)
}

/// More than one member, all with the same coordinates but for `axis` (0 tp, 1 dp, 2 pp).
fn varies_only_in(layout: &LayoutSummary, members: &[u32], axis: usize) -> bool {
    let others = |rank: u32| {
        let (t, d, p) = coords(layout, rank);
        let mut c = [t, d, p];
        c[axis] = 0;
        c
    };
    match members.split_first() {
        Some((&first, rest)) if !rest.is_empty() => {
            rest.iter().all(|&m| others(m) == others(first))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_follow_the_order() {
        let l = parse("tp=2,dp=2,pp=2,order=tp-dp-pp").expect("valid");
        assert_eq!(coords(&l, 5), (1, 0, 1));
        assert!(is_dp_group(&l, &[1, 3]));
        assert!(!is_dp_group(&l, &[0, 1]));
        let l = parse("tp=2,dp=2,pp=2,order=tp-pp-dp").expect("valid");
        assert_eq!(coords(&l, 5), (1, 1, 0));
        assert!(is_dp_group(&l, &[1, 5]));
    }

    #[test]
    fn layouts_parse_and_bad_ones_say_why() {
        let l = parse("tp=2,dp=4,pp=2,order=tp-pp-dp").expect("valid");
        assert_eq!((l.tp, l.dp, l.pp, l.order.as_str()), (2, 4, 2, "tp-pp-dp"));
        assert!(parse("tp=0").unwrap_err().contains("positive"));
        assert!(parse("cp=2").unwrap_err().contains("unknown key"));
        assert!(parse("order=tp-tp-pp").unwrap_err().contains("once each"));
        assert!(parse("tp2").unwrap_err().contains("KEY=VALUE"));
    }
}
