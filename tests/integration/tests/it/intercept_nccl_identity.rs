//! NCCL identity under libttrace.so: communicators made by `ncclCommShrink` get one key on
//! every survivor (the daemon's map joins them), PreMulSum all-reduces carry their factor (host
//! or device) and `ttrace check` applies it, `ncclGroupSimulateEnd` closes a group without
//! leaving later groups' snapshots pending, and one process driving four devices is four
//! ranks, each named by its device's communicator rank.

use crate::intercept_util;

use std::collections::BTreeSet;

use intercept_util::*;
use ttrace_format::record::{CollectiveKind, CollectiveOp, Op, Role};
use ttrace_format::store::Manifest;

const N: usize = 3;

fn coll(r: &Rec) -> &CollectiveOp {
    match &r.record.op {
        Op::Collective(c) => c,
        other => panic!("{other:?}"),
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Asserts `out` is the sum over members of `factor * input`, within f32 round-off.
fn assert_scaled_sum(name: &str, inputs: &[Vec<f32>], factors: &[f64], out: &[f32]) {
    for (e, got) in out.iter().enumerate() {
        let terms: Vec<f64> = inputs
            .iter()
            .zip(factors)
            .map(|(x, f)| f * x[e] as f64)
            .collect();
        let want: f64 = terms.iter().sum();
        let scale: f64 = terms.iter().map(|t| t.abs()).sum();
        assert!(
            (*got as f64 - want).abs() <= 4.0 * f32::EPSILON as f64 * scale,
            "{name}: element {e} is {got}, want {want}"
        );
    }
}

#[test]
fn shrink_premulsum_and_simulated_groups_are_recorded_as_nccl_runs_them() {
    let run = traced(N, &["traced", "nccl-extra"], &[]);
    assert_ok(&run);
    assert_checksums(&run);
    assert_eq!(run.summary.gaps, 0);
    let per_rank: Vec<Vec<&Rec>> = (0..N as u32)
        .map(|rank| {
            run.of_rank(rank)
                .into_iter()
                .filter(|r| matches!(r.record.op, Op::Collective(_)))
                .collect()
        })
        .collect();
    // The simulated group's all-reduce never ran: no record. The last rank does not shrink.
    for (g, recs) in per_rank.iter().enumerate() {
        let want = if g + 1 < N { 4 } else { 3 };
        assert_eq!(recs.len(), want, "rank {g}: {recs:?}");
        assert!(recs
            .iter()
            .all(|r| coll(r).kind == CollectiveKind::AllReduce));
    }
    let op =
        |i: usize, members: usize| -> Vec<&Rec> { (0..members).map(|g| per_rank[g][i]).collect() };
    // PreMulSum: the host factor is recorded as a value, the device one as a captured scalar.
    let host = op(0, N);
    for r in &host {
        let p = coll(r).premul.expect("PreMulSum recorded");
        assert_eq!(p.factor, Some(0.5));
        assert!(!r.has(Role::Alpha));
    }
    let dev = op(1, N);
    for r in &dev {
        let p = coll(r).premul.expect("PreMulSum recorded");
        assert_eq!(p.factor, None);
        assert_eq!(f32s(r.tensor(Role::Alpha).1), vec![0.25]);
    }
    for (name, recs, f) in [
        ("host PreMulSum", &host, 0.5),
        ("device PreMulSum", &dev, 0.25),
    ] {
        let inputs: Vec<Vec<f32>> = recs.iter().map(|r| f32s(r.tensor(Role::Input).1)).collect();
        for r in recs.iter() {
            assert_scaled_sum(name, &inputs, &[f; N], &f32s(r.tensor(Role::Output).1));
        }
    }
    // The group after the simulated one completed: its snapshot holds the sum.
    let grouped = op(2, N);
    let inputs: Vec<Vec<f32>> = grouped
        .iter()
        .map(|r| f32s(r.tensor(Role::Input).1))
        .collect();
    for r in &grouped {
        assert!(coll(r).group != 0 && coll(r).premul.is_none());
        assert_scaled_sum(
            "grouped",
            &inputs,
            &[1.0; N],
            &f32s(r.tensor(Role::Output).1),
        );
    }
    // The shrunk communicator: one key on both survivors, joined in the manifest.
    let shrunk = op(3, N - 1);
    let world = coll(host[0]).comm;
    let key = coll(shrunk[0]).comm;
    assert_ne!(key, world);
    for (g, r) in shrunk.iter().enumerate() {
        let c = coll(r);
        assert_eq!(
            (c.comm, c.comm_rank, c.comm_size),
            (key, g as u32, (N - 1) as u32)
        );
    }
    let m = Manifest::read(&run.store).expect("manifest");
    let entry = m
        .comms
        .iter()
        .find(|c| c.key == key)
        .expect("shrunk comm registered");
    assert_eq!(entry.members, vec![Some(0), Some(1)]);
    assert_eq!(entry.parent, Some(world));
    assert_eq!(entry.api, "ncclCommShrink");
    // `ttrace check` applies the factors: every call checked, nothing found.
    let report = ttrace_compare::check::check_store(&run.store, &mut |_, _| {}).expect("check");
    assert!(report.findings.is_empty(), "{:?}", report.findings);
    assert_eq!(report.collectives_checked, 4);
}

#[test]
fn one_process_driving_four_devices_is_four_ranks() {
    // `collectives single-process`: ncclCommInitAll over 4 devices, then ncclCommInitRank per
    // device in a group; an in-place bf16 all-reduce on each set.
    let run = traced(1, &["collectives", "single-process"], &[]);
    assert_ok(&run);
    assert_checksums(&run);
    let ranks: BTreeSet<u32> = run.records.iter().map(|r| r.record.rank).collect();
    assert_eq!(ranks, (0..4).collect(), "one rank per device");
    for r in &run.records {
        assert_eq!(r.record.device as u32, r.record.rank, "{:?}", r.record.api);
    }
    let m = Manifest::read(&run.store).expect("manifest");
    let mut comms = Vec::new();
    for rank in 0..4u32 {
        let colls: Vec<&Rec> = run
            .of_rank(rank)
            .into_iter()
            .filter(|r| matches!(r.record.op, Op::Collective(_)))
            .collect();
        assert_eq!(colls.len(), 2, "rank {rank}");
        // Seq counts each rank's own ops from 0.
        let seqs: Vec<u64> = run.of_rank(rank).iter().map(|r| r.record.seq).collect();
        assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
        for r in &colls {
            assert_eq!(coll(r).comm_rank, rank);
        }
        comms.push([coll(colls[0]).comm, coll(colls[1]).comm]);
    }
    for set in 0..2 {
        let key = comms[0][set];
        assert!(comms.iter().all(|c| c[set] == key));
        let entry = m
            .comms
            .iter()
            .find(|c| c.key == key)
            .expect("comm registered");
        assert_eq!(entry.members, (0..4).map(Some).collect::<Vec<_>>());
    }
    let report = ttrace_compare::check::check_store(&run.store, &mut |_, _| {}).expect("check");
    assert!(report.findings.is_empty(), "{:?}", report.findings);
    assert_eq!(report.collectives_checked, 2);
}

#[test]
fn a_thread_per_device_is_a_rank_per_device() {
    // `traced nccl-threads`: 4 threads, each on its device, join one communicator with
    // ncclCommInitRank (rank = device) and all-reduce 64 floats.
    let run = traced(1, &["traced", "nccl-threads"], &[]);
    assert_ok(&run);
    assert_checksums(&run);
    let ranks: BTreeSet<u32> = run.records.iter().map(|r| r.record.rank).collect();
    assert_eq!(ranks, (0..4).collect(), "one rank per device");
    let colls: Vec<&Rec> = run
        .records
        .iter()
        .filter(|r| matches!(r.record.op, Op::Collective(_)))
        .collect();
    assert_eq!(colls.len(), 4);
    let inputs: Vec<Vec<f32>> = colls
        .iter()
        .map(|r| f32s(r.tensor(Role::Input).1))
        .collect();
    for r in &colls {
        assert_eq!(coll(r).comm_rank, r.record.rank);
        assert_eq!(r.record.device as u32, r.record.rank);
        assert_scaled_sum(
            "all-reduce",
            &inputs,
            &[1.0; 4],
            &f32s(r.tensor(Role::Output).1),
        );
    }
    let m = Manifest::read(&run.store).expect("manifest");
    let entry = m
        .comms
        .iter()
        .find(|c| c.key == coll(colls[0]).comm)
        .expect("comm registered");
    assert_eq!(entry.members, (0..4).map(Some).collect::<Vec<_>>());
}
