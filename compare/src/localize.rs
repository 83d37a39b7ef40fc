//! Localization: the first tensor beyond its tolerance, in the reference's execution order,
//! is the verdict; it is blamed on the ranks whose shard diverged, and its cause decided:
//! LOCAL (the op's inputs matched, its output did not: the op, its scalars, or a reduction)
//! or UPSTREAM (an input was already wrong: the bug lies between the last good tensor and the
//! op, in code ttrace does not capture).

use ttrace_format::dtype::DType;
use ttrace_format::record::{Record, Role};

use crate::align::Alignment;
use crate::comparison::{Pending, Position};
use crate::numerics;
use crate::report::{Cause, Divergence, TensorComparison};
use crate::tolerance;
use crate::trace::{collective, gemm, RunTrace};
use crate::CompareError;

/// Splits an NVTX path `forward.mb1/layers.0.mlp.fc1` into pass, micro-batch and module.
pub fn split_nvtx(path: &str) -> (Option<String>, Option<u32>, Option<String>) {
    let mut parts = path.splitn(2, '/');
    let head = parts.next().unwrap_or("");
    let module = parts.next().map(str::to_string);
    let (pass, mb) = match head.split_once('.') {
        Some((p, m)) => (p, m.strip_prefix("mb").and_then(|n| n.parse().ok())),
        None => (head, None),
    };
    let pass = matches!(pass, "forward" | "backward" | "optimizer").then(|| pass.to_string());
    match pass {
        Some(p) => (Some(p), mb, module),
        None => (None, None, Some(path.to_string())),
    }
}

/// The first divergence `p` (the comparison at index `i` of the report), with the last good
/// tensor of an earlier op before it ([`last_good`]: its index and comparison) when there is
/// one.
pub(crate) type Diverged<'a> = (usize, &'a Pending, Option<(usize, &'a TensorComparison)>);

/// Names the first divergence and decides whether its op made it.
pub(crate) fn localize(
    reff: &RunTrace,
    ref_rank: u32,
    run: &RunTrace,
    (i, p, good): Diverged,
    al: &Alignment,
) -> Result<Divergence, CompareError> {
    let t = &p.cmp;
    let (diverged_ranks, blamed) = blame(t);
    let (rank, seq) = blamed
        .or_else(|| p.shards.first().copied())
        .unwrap_or_default();
    let step = t.step;
    let run_rec = run.record(rank, step, seq);
    let run_rec = run_rec.as_deref();
    let last_good = good.map(|(j, _)| j);
    let (pass, nvtx_mb, module) = t.nvtx.as_deref().map_or((None, None, None), split_nvtx);
    let micro_batch = nvtx_mb.or_else(|| al.micro_batch.get(&p.ref_op).copied());
    let position = match run_rec {
        Some(r) => describe(r),
        None => format!("rank {rank} step {step} seq {seq}"),
    };
    let ratio_hint = scale_hint(t.norm_ratio);
    let (cause, explanation) = if let Some(note) = &p.param_note {
        (Cause::Local, format!("{note}{ratio_hint}"))
    } else if p.is_collective {
        (
            Cause::Local,
            wrong_reduction(t, run_rec.and_then(collective), &ratio_hint),
        )
    } else if t.role == "D" {
        let why = local_gemm_reason(reff, ref_rank, run, p, rank, seq)?;
        (Cause::Local, format!("{why}{ratio_hint}"))
    } else {
        let before = unaligned_before(run, al, rank, step, seq);
        (
            Cause::Upstream,
            upstream(t, good.map(|(_, g)| g), &ratio_hint, &before),
        )
    };
    Ok(Divergence {
        tensor: i,
        cause,
        explanation,
        last_good,
        kernels_between: match run_rec {
            Some(_) => run.kernels_before(rank, step, seq),
            None => Vec::new(),
        },
        ranks: diverged_ranks,
        step,
        micro_batch,
        pass,
        module,
        position,
    })
}

/// The ranks whose shard is beyond the tolerance, and the (rank, seq) of the worst of them.
pub(crate) fn blame(t: &TensorComparison) -> (Vec<u32>, Option<(u32, u64)>) {
    let beyond = || t.ranks.iter().filter(|r| r.error_eps > t.tolerance_eps);
    let ranks = beyond().map(|r| r.rank).collect();
    let worst = beyond()
        .max_by(|a, b| a.error_eps.total_cmp(&b.error_eps))
        .map(|r| (r.rank, r.seq));
    (ranks, worst)
}

/// The last comparison before the `i`-th (in execution order) within tolerance that belongs
/// to an earlier op (the op's own other inputs say nothing about where its diverged input came
/// from), given each comparison's key and whether it diverged.
pub(crate) fn last_good(
    i: usize,
    key: impl Fn(usize) -> Position,
    diverged: impl Fn(usize) -> bool,
) -> Option<usize> {
    let op = |j: usize| {
        let k = key(j);
        (k.0, k.1)
    };
    (0..i).rev().find(|&j| !diverged(j) && op(j) != op(i))
}

/// Why a reduction's output diverged while the GEMM output it reduces matched; names an
/// average (`ncclAvg`) over the group where the reference's result is the sum.
pub(crate) fn wrong_reduction(
    t: &TensorComparison,
    c: Option<&ttrace_format::record::CollectiveOp>,
    ratio_hint: &str,
) -> String {
    let op_hint = c
        .filter(|c| {
            c.redop == Some(cuda_abi::nccl::ncclAvg)
                && (t.norm_ratio * c.comm_size as f64 - 1.0).abs() < 0.05
        })
        .map(|c| {
            format!(
                "; it averages (ncclAvg) over {} ranks where the reference's result is their \
                 sum",
                c.comm_size
            )
        })
        .unwrap_or_default();
    format!(
        "the {} output differs from the reference while the GEMM output it reduces \
         matched: the reduction itself is wrong (op, group, or scaling){ratio_hint}{op_hint}",
        t.api
    )
}

/// Why an op's input diverged: it was already wrong when read, the bug lies between the last
/// good tensor and the op; `unaligned` names GEMMs in between without a counterpart.
pub(crate) fn upstream(
    t: &TensorComparison,
    last_good: Option<&TensorComparison>,
    ratio_hint: &str,
    unaligned: &str,
) -> String {
    let prev = last_good.map(|g| {
        format!(
            "{} {} of {}",
            g.role,
            g.api,
            g.nvtx
                .clone()
                .unwrap_or_else(|| format!("step {} seq {}", g.step, g.ref_seq))
        )
    });
    format!(
        "input {} of this {} was already wrong when the op read it: the bug lies between the \
         last good tensor{} and this op, in code ttrace does not capture (kernels, host-side \
         copies, or a missing collective){ratio_hint}{unaligned}",
        t.role,
        t.api,
        prev.map(|s| format!(" ({s})")).unwrap_or_default(),
    )
}

/// A note naming the GEMMs of `rank` that ran after its previous aligned GEMM and before
/// `seq` yet have no counterpart in the reference (the alignment left them out: other
/// transposes, shapes or types than the reference's, or a call the reference does not make):
/// the likeliest culprits of an upstream divergence on that rank.
pub(crate) fn unaligned_before(
    run: &RunTrace,
    al: &Alignment,
    rank: u32,
    step: u64,
    seq: u64,
) -> String {
    let mut found: Vec<String> = Vec::new();
    for r in run.records(rank, step).iter().rev().filter(|r| r.seq < seq) {
        let Some(g) = gemm(r) else { continue };
        if al.of_run.contains_key(&(rank, step, r.seq)) {
            break;
        }
        found.push(format!(
            "{} transa={} transb={}",
            describe(r),
            g.transa,
            g.transb
        ));
    }
    if found.is_empty() {
        return String::new();
    }
    found.reverse();
    format!(
        "; in between, {} no counterpart in the reference (left unaligned: other \
         parameters than the reference's GEMMs, or calls the reference does not make): {}",
        if found.len() == 1 {
            "this GEMM has"
        } else {
            "these GEMMs have"
        },
        found.join(", ")
    )
}

/// `rank 3 step 0 seq 17: cublasGemmEx m=64 n=128 k=64`.
pub fn describe(r: &Record) -> String {
    match gemm(r) {
        Some(g) => format!(
            "rank {} step {} seq {}: {} m={} n={} k={}{}",
            r.rank,
            r.step,
            r.seq,
            r.api,
            g.m,
            g.n,
            g.k,
            if g.batch > 1 {
                format!(" batch={}", g.batch)
            } else {
                String::new()
            }
        ),
        None => match collective(r) {
            Some(c) => format!(
                "rank {} step {} seq {}: {} count={} ({} of {})",
                r.rank, r.step, r.seq, r.api, c.count, c.comm_rank, c.comm_size
            ),
            None => format!("rank {} step {} seq {}: {}", r.rank, r.step, r.seq, r.api),
        },
    }
}

/// A hint when the norm ratio reads as a scaling bug.
pub(crate) fn scale_hint(ratio: f64) -> String {
    for k in [2.0f64, 3.0, 4.0, 8.0, 0.5, 0.25, 0.125] {
        if (ratio / k - 1.0).abs() < 0.02 {
            return format!("; run/reference norm = {ratio:.2}: the tensor looks scaled by {k}");
        }
    }
    String::new()
}

/// Why a GEMM's output diverged although its inputs matched.
pub(crate) fn local_gemm_reason(
    reff: &RunTrace,
    ref_rank: u32,
    run: &RunTrace,
    p: &Pending,
    rank: u32,
    seq: u64,
) -> Result<String, CompareError> {
    let step = p.cmp.step;
    let Some(rec) = run.record(rank, step, seq) else {
        return Ok("the GEMM's output diverges while its inputs match".into());
    };
    let rec = &*rec;
    let Some(g) = gemm(rec) else {
        return Ok("the op's output diverges while its inputs match".into());
    };
    let ref_rec = reff.record(ref_rank, p.ref_op.0, p.ref_op.1);
    let ref_g = ref_rec.as_deref().and_then(gemm);
    if let Some(f) = ref_g {
        if g.beta != f.beta || g.alpha != f.alpha {
            return Ok(format!(
                "rank {rank} called the GEMM with alpha={:?} beta={:?} where the reference used \
                 alpha={:?} beta={:?}{}",
                g.alpha,
                g.beta,
                f.alpha,
                f.beta,
                if g.beta == Some(0.0) && f.beta.is_some_and(|b| b != 0.0) {
                    " (it overwrites instead of accumulating)"
                } else {
                    ""
                }
            ));
        }
        if g.epilogue != f.epilogue {
            return Ok(format!(
                "rank {rank} ran the GEMM with epilogue {} where the reference used {}",
                g.epilogue, f.epilogue
            ));
        }
    }
    // Recompute from the rank's own inputs.
    let a = run.values(rec, Role::A)?;
    let b = run.values(rec, Role::B)?;
    let c = run.values(rec, Role::CIn)?;
    let d = run.values(rec, Role::D)?;
    if let (Some(a), Some(b), Some(d)) = (a, b, d) {
        let alpha = g.alpha.unwrap_or(1.0);
        let beta = g.beta.unwrap_or(0.0);
        if d.dtype != DType::F8_E4M3 && d.dtype != DType::F8_E5M2 {
            if let Some((exact, abs)) = numerics::gemm_f64(
                g,
                &a.data,
                &b.data,
                c.as_ref().map(|c| c.data.as_slice()),
                alpha,
                beta,
            ) {
                let worst = tolerance::recomputed_excess(d.dtype, g.k, &exact, &abs, &d.data);
                if worst > tolerance::RECOMPUTE_MARGIN {
                    return Ok(format!(
                        "rank {rank}'s GEMM output does not follow from its own captured inputs \
                         ({worst:.0}x the round-off bound when recomputed in f64): the GEMM itself \
                         or something writing its output buffer is wrong"
                    ));
                }
            }
        }
    }
    Ok(
        "every rank's GEMM output follows from its own inputs (recomputed in f64), and the \
         inputs match the reference, yet the output does not: the shards do not combine into \
         the reference's result (a wrong shard layout, or a reduction added or missing)"
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::combine::Merge;
    use crate::report::RankError;

    fn compared(role: &str, errors: &[(u32, f64)], tolerance: f64) -> TensorComparison {
        let error_eps = errors.iter().map(|e| e.1).fold(0f64, f64::max);
        TensorComparison {
            position: 0,
            step: 3,
            ref_seq: 10,
            api: "cublasGemmEx".into(),
            role: role.into(),
            nvtx: Some("forward.mb0/layers.0.mlp.fc1".into()),
            shape: vec![4, 4],
            dtype: "F32".into(),
            merge: Merge::Replicated,
            ranks: errors
                .iter()
                .map(|&(rank, error_eps)| RankError {
                    rank,
                    seq: 100 + u64::from(rank),
                    error_eps,
                })
                .collect(),
            error_eps,
            worst_row: None,
            norm_ratio: 1.0,
            tolerance_eps: tolerance,
            tolerance_source: "analytic".into(),
            diverged: error_eps > tolerance,
        }
    }

    fn pending(key: (u64, u64, u32), cmp: TensorComparison) -> Pending {
        Pending {
            key,
            shards: cmp.ranks.iter().map(|r| (r.rank, r.seq)).collect(),
            ref_op: (key.0, key.1),
            cmp,
            is_collective: false,
            param_note: None,
        }
    }

    #[test]
    fn the_blame_falls_on_the_ranks_beyond_tolerance_the_worst_named_first() {
        let t = compared("D", &[(0, 1.0), (1, 90.0), (2, 400.0), (3, 2.0)], 4.0);
        let (ranks, worst) = blame(&t);
        assert_eq!(ranks, vec![1, 2]);
        assert_eq!(worst, Some((2, 102)));
        let (ranks, worst) = blame(&compared("D", &[(0, 1.0)], 4.0));
        assert!(ranks.is_empty() && worst.is_none());
    }

    #[test]
    fn the_last_good_tensor_is_of_an_earlier_op_not_the_ops_own_other_input() {
        let list = [
            pending((0, 1, 2), compared("D", &[(0, 1.0)], 4.0)),
            pending((0, 2, 0), compared("A", &[(0, 1.0)], 4.0)),
            pending((0, 2, 1), compared("B", &[(0, 50.0)], 4.0)),
        ];
        let (key, diverged) = (|j: usize| list[j].key, |j: usize| list[j].cmp.diverged);
        assert_eq!(last_good(2, key, diverged), Some(0));
        assert_eq!(last_good(0, key, diverged), None);
    }

    #[test]
    fn an_average_where_the_reference_sums_is_named() {
        let mut t = compared("Output", &[(0, 500.0), (1, 500.0)], 8.0);
        t.api = "ncclAllReduce".into();
        t.norm_ratio = 0.5;
        let avg = ttrace_format::record::CollectiveOp {
            kind: ttrace_format::record::CollectiveKind::AllReduce,
            count: 16,
            nccl_type: cuda_abi::nccl::ncclFloat32,
            redop: Some(cuda_abi::nccl::ncclAvg),
            root_or_peer: None,
            comm: 1,
            comm_rank: 0,
            comm_size: 2,
            sendbuff: 0,
            recvbuff: 0,
            group: 0,
            premul: None,
        };
        let why = wrong_reduction(&t, Some(&avg), "");
        assert!(why.contains("the reduction itself is wrong"), "{why}");
        assert!(why.contains("averages (ncclAvg) over 2 ranks"), "{why}");
        let sum = ttrace_format::record::CollectiveOp {
            redop: Some(cuda_abi::nccl::ncclSum),
            ..avg
        };
        assert!(!wrong_reduction(&t, Some(&sum), "").contains("ncclAvg"));
    }

    #[test]
    fn an_upstream_divergence_names_the_last_good_tensor() {
        let good = compared("D", &[(0, 1.0)], 4.0);
        let bad = compared("A", &[(0, 50.0)], 4.0);
        let why = upstream(&bad, Some(&good), "", "");
        assert!(
            why.contains("(D cublasGemmEx of forward.mb0/layers.0.mlp.fc1)"),
            "{why}"
        );
        assert!(why.starts_with("input A of this cublasGemmEx was already wrong"));
    }

    #[test]
    fn a_norm_ratio_near_a_power_of_two_reads_as_a_scaling_bug() {
        assert!(scale_hint(2.01).contains("scaled by 2"));
        assert!(scale_hint(0.125).contains("scaled by 0.125"));
        assert_eq!(scale_hint(1.3), "");
    }

    #[test]
    fn nvtx_paths_split_into_pass_micro_batch_and_module() {
        assert_eq!(
            split_nvtx("backward.mb1/layers.0.mlp.fc1"),
            (
                Some("backward".into()),
                Some(1),
                Some("layers.0.mlp.fc1".into())
            )
        );
        // A range that is not a pass is the module.
        assert_eq!(
            split_nvtx("my_block"),
            (None, None, Some("my_block".into()))
        );
    }
}
