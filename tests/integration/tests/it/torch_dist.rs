//! Real PyTorch distributed: `torchrun --nproc-per-node 4` with the NCCL backend on the
//! simulated stack, traced by `ttrace run` (tests/torch/dist.py): all_reduce SUM/AVG/MAX sync
//! and async, all_gather_into_tensor, reduce_scatter_tensor, broadcast, send/recv,
//! batch_isend_irecv, all_to_all_single, new_group and split_group.
//!
//! Asserted: exit status and every tensor each rank saw are the same traced and untraced (and
//! each rank checked its results against host arithmetic); every result is byte-equal to a
//! captured copy and to the captured output of its collective on that rank; the store knows
//! the world communicator and the three sub-communicators with the right members; no gap;
//! `ttrace check` has nothing to say. Skips (passing, with a SKIP line) without the venv.

use crate::torch_util;

use std::collections::BTreeSet;

use integration_tests::{describe, TempDir};
use torch_util::{captured_as, check_is_silent, export, find, saved, Torch};
use ttrace_format::store::Manifest;

/// The NCCL API whose output holds a result with this label.
fn collective_of(label: &str) -> &'static [&'static str] {
    match label {
        l if l.starts_with("all_reduce") => &["ncclAllReduce"],
        "new_group_even_sum" | "split_group_sum" => &["ncclAllReduce"],
        "all_gather_into_tensor" => &["ncclAllGather"],
        "reduce_scatter_tensor" => &["ncclReduceScatter"],
        "broadcast" => &["ncclBcast", "ncclBroadcast"],
        "send_recv" | "batch_isend_irecv" => &["ncclRecv"],
        _ => &[],
    }
}

/// How the traced run is launched.
#[derive(Clone, Copy, PartialEq)]
enum Launch {
    /// `ttrace run -- torchrun ...`.
    Wrapped,
    /// `LD_PRELOAD=libttrace.so torchrun ...` (the collector starts by itself).
    Bare,
}

fn dist(version: &'static str, launch: Launch) {
    let Some(torch) = find(version) else { return };
    let tmp = TempDir::new(&format!("torch-dist-{version}"));
    let script = Torch::script("dist.py");
    let (plain_out, traced_out) = (tmp.path().join("plain"), tmp.path().join("traced"));
    let store = tmp.path().join("store");
    let nproc = std::path::Path::new("--nproc-per-node=4");
    // A rendezvous on a free port of its own: tests run side by side.
    let standalone = std::path::Path::new("--standalone");

    let plain = torch.plain(&torch.torchrun, &[standalone, nproc, &script, &plain_out]);
    assert_eq!(
        plain.status.code(),
        Some(0),
        "untraced run: {}",
        describe(&plain)
    );
    let args = [standalone, nproc, script.as_path(), traced_out.as_path()];
    let traced = match launch {
        Launch::Wrapped => torch.traced(&store, &torch.torchrun, &args),
        Launch::Bare => torch.bare(&store, &torch.torchrun, &args),
    };
    assert_eq!(
        traced.status.code(),
        Some(0),
        "traced run: {}",
        describe(&traced)
    );

    let m = Manifest::read(&store).expect("manifest");
    assert!(m.finalized);
    if launch == Launch::Bare {
        let job = m.job.as_ref().expect("a collector's store names its job");
        assert_eq!(
            job.source, "torchrun",
            "torchrun's ranks are its job: {job:?}"
        );
    }
    let ranks: Vec<(u32, u64)> = m.ranks.iter().map(|r| (r.rank, r.gaps)).collect();
    assert_eq!(
        ranks,
        vec![(0, 0), (1, 0), (2, 0), (3, 0)],
        "{}",
        describe(&traced)
    );
    let comms: BTreeSet<Vec<Option<u32>>> = m.comms.iter().map(|c| c.members.clone()).collect();
    for want in [vec![0, 1, 2, 3], vec![0, 2], vec![0, 1], vec![2, 3]] {
        let want: Vec<Option<u32>> = want.into_iter().map(Some).collect();
        assert!(
            comms.contains(&want),
            "communicator {want:?} missing: {comms:?}"
        );
    }

    let cap = export(&store, &tmp.path().join("export"));
    for rank in 0..4u32 {
        let seen = saved(&traced_out.join(format!("rank{rank}")));
        assert_eq!(
            seen,
            saved(&plain_out.join(format!("rank{rank}"))),
            "rank {rank}: tracing changed what torch computed"
        );
        assert!(seen.len() >= 13, "rank {rank}: {} tensors", seen.len());
        for t in &seen {
            assert!(
                captured_as(&cap, rank, &t.bytes, |api, role| api
                    .starts_with("cudaMemcpy")
                    && (role == "Src" || role == "Dst")),
                "rank {rank} {}: no captured copy has torch's bytes",
                t.name
            );
            let apis = collective_of(t.label());
            if !apis.is_empty() {
                assert!(
                    captured_as(&cap, rank, &t.bytes, |api, role| apis.contains(&api)
                        && role == "Output"),
                    "rank {rank} {}: no captured {apis:?} output has torch's bytes",
                    t.name
                );
            }
            if t.label() == "all_to_all_single" {
                // NCCL < 2.28: one receive per peer, each quarter of the result a captured
                // ncclRecv. NCCL 2.28+ (torch 2.15): one ncclAlltoAll.
                let as_recvs = t.bytes.chunks(t.bytes.len() / 4).all(|chunk| {
                    captured_as(&cap, rank, chunk, |api, role| {
                        api == "ncclRecv" && role == "Output"
                    })
                });
                let as_alltoall = captured_as(&cap, rank, &t.bytes, |api, role| {
                    api == "ncclAlltoAll" && role == "Output"
                });
                assert!(
                    as_recvs || as_alltoall,
                    "rank {rank}: all_to_all_single was captured neither as its receives nor \
                     as an ncclAlltoAll"
                );
            }
        }
    }
    check_is_silent(&store);
}

#[test]
fn torch_2_10_cuda_12_torchrun_nccl_is_captured_byte_exact() {
    dist("2.10.0", Launch::Wrapped);
}

#[test]
fn torch_2_10_bare_preload_under_torchrun_is_captured_byte_exact() {
    dist("2.10.0", Launch::Bare);
}

#[test]
fn torch_2_15_cuda_13_torchrun_nccl_is_captured_byte_exact() {
    dist("2.15.0", Launch::Wrapped);
}
