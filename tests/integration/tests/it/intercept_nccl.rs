//! NCCL under libttrace.so, three ranks: every collective's captured output is what the
//! simulated NCCL computes from the captured inputs (ring-order reductions, gathers,
//! broadcasts, point-to-point), in-place inputs are taken before the op, snapshots of grouped
//! calls see the group's results (they run after the outermost ncclGroupEnd), and the
//! communicators (world and a split) are joined in the manifest.

use crate::intercept_util;

use intercept_util::*;
use sim_kernels::reduce::{allreduce_first_rank, reduce_chain, ReduceOp};
use ttrace_format::record::{CollectiveKind, CollectiveOp, Op, Role};
use ttrace_format::store::Manifest;

const N: usize = 3;

fn coll(r: &Rec) -> &CollectiveOp {
    match &r.record.op {
        Op::Collective(c) => c,
        other => panic!("{other:?}"),
    }
}

/// The all-reduce (sum, ring order) of the inputs, ordered by communicator rank.
fn allreduce(inputs: &[&[u8]], t: ttrace_format::dtype::DType) -> Vec<u8> {
    let dt = sim_dtype(t);
    let es = dt.size();
    let count = inputs[0].len() / es;
    let mut out = vec![0u8; inputs[0].len()];
    for e in 0..count {
        let one: Vec<&[u8]> = inputs.iter().map(|i| &i[e * es..(e + 1) * es]).collect();
        let first = allreduce_first_rank(e, count, inputs.len());
        reduce_chain(
            dt,
            ReduceOp::Sum,
            &one,
            first,
            &mut out[e * es..(e + 1) * es],
        );
    }
    out
}

#[test]
fn collectives_outputs_follow_from_their_captured_inputs() {
    let run = traced(N, &["traced", "nccl"], &[]);
    assert_ok(&run);
    assert_checksums(&run);
    // Per rank, the collective records in call order.
    let per_rank: Vec<Vec<&Rec>> = (0..N as u32)
        .map(|rank| {
            run.of_rank(rank)
                .into_iter()
                .filter(|r| matches!(r.record.op, Op::Collective(_)))
                .collect()
        })
        .collect();
    use CollectiveKind::*;
    let kinds: Vec<CollectiveKind> = per_rank[0].iter().map(|r| coll(r).kind).collect();
    assert_eq!(
        kinds,
        [
            AllReduce,
            AllReduce,
            AllReduce,
            AllReduce,
            AllGather,
            ReduceScatter,
            Broadcast,
            Broadcast,
            Send,
            Recv,
            AllReduce
        ]
    );
    for rank in &per_rank {
        assert_eq!(rank.len(), kinds.len());
    }
    let op = |i: usize| -> Vec<&Rec> {
        // The records of op `i`, ordered by communicator rank.
        let mut v: Vec<&Rec> = per_rank.iter().map(|r| r[i]).collect();
        v.sort_by_key(|r| coll(r).comm_rank);
        v
    };
    // All-reduces: out of place, in place (bf16), the two grouped ones, the split's.
    for i in [0, 1, 2, 3, 10] {
        let recs = op(i);
        let inputs: Vec<&[u8]> = recs.iter().map(|r| r.tensor(Role::Input).1).collect();
        let dtype = recs[0].tensor(Role::Input).0.dtype;
        let want = allreduce(&inputs, dtype);
        for r in &recs {
            assert!(
                r.tensor(Role::Output).1 == &want[..],
                "all-reduce #{i} rank {}: output is not the sum of the captured inputs",
                r.record.rank
            );
        }
    }
    // In place: the input was taken before the op (it differs from the output).
    for r in op(1) {
        assert_eq!(coll(r).sendbuff, coll(r).recvbuff);
        assert_ne!(r.tensor(Role::Input).1, r.tensor(Role::Output).1);
    }
    // The grouped pair shares a group number; ungrouped ops have none.
    for rank in &per_rank {
        let (g2, g3) = (coll(rank[2]).group, coll(rank[3]).group);
        assert!(g2 != 0 && g2 == g3, "{g2} {g3}");
        assert_eq!(coll(rank[0]).group, 0);
        assert!(coll(rank[8]).group != 0 && coll(rank[8]).group == coll(rank[9]).group);
    }
    // All-gather: the concatenation of the inputs by rank.
    let recs = op(4);
    let cat: Vec<u8> = recs
        .iter()
        .flat_map(|r| r.tensor(Role::Input).1.to_vec())
        .collect();
    for r in &recs {
        assert_eq!(r.tensor(Role::Output).1, &cat[..]);
        assert_eq!(r.tensor(Role::Output).0.shape, vec![100 * N as u64]);
    }
    // Reduce-scatter: block b of the sum, reduced from rank b+1 on.
    let recs = op(5);
    let es = 4;
    for (b, r) in recs.iter().enumerate() {
        let blocks: Vec<&[u8]> = recs
            .iter()
            .map(|x| &x.tensor(Role::Input).1[b * 100 * es..(b + 1) * 100 * es])
            .collect();
        let mut want = vec![0u8; 100 * es];
        reduce_chain(
            sim_dtype(ttrace_format::dtype::DType::F32),
            ReduceOp::Sum,
            &blocks,
            (b + 1) % N,
            &mut want,
        );
        assert_eq!(
            r.tensor(Role::Output).1,
            &want[..],
            "reduce-scatter block {b}"
        );
    }
    // Broadcast from 0, and the in-place ncclBcast from the last rank.
    for (i, root) in [(6, 0usize), (7, N - 1)] {
        let recs = op(i);
        let src = recs[root].tensor(Role::Input).1.to_vec();
        for (c, r) in recs.iter().enumerate() {
            assert_eq!(r.has(Role::Input), c == root, "only the root has an input");
            assert_eq!(r.tensor(Role::Output).1, &src[..]);
        }
    }
    assert_eq!(op(7)[0].record.api, "ncclBcast");
    // The ring of sends and receives.
    let (sends, recvs) = (op(8), op(9));
    for (c, recv) in recvs.iter().enumerate() {
        let from = (c + N - 1) % N;
        assert_eq!(coll(recv).root_or_peer, Some(from as i32));
        assert_eq!(
            recv.tensor(Role::Output).1,
            sends[from].tensor(Role::Input).1
        );
    }
    // Communicators: the world in rank order; the split with keys reversing the order.
    let world = coll(per_rank[0][0]).comm;
    let split = coll(per_rank[0][10]).comm;
    assert_ne!(world, split);
    for (g, rank) in per_rank.iter().enumerate() {
        assert_eq!(coll(rank[0]).comm, world);
        assert_eq!(coll(rank[10]).comm, split);
        assert_eq!(coll(rank[0]).comm_rank, g as u32);
        assert_eq!(coll(rank[10]).comm_rank, (N - 1 - g) as u32);
    }
    let m = Manifest::read(&run.store).expect("manifest");
    let world_entry = m
        .comms
        .iter()
        .find(|c| c.key == world)
        .expect("world comm registered");
    assert_eq!(
        world_entry.members,
        (0..N as u32).map(Some).collect::<Vec<_>>()
    );
    let split_entry = m
        .comms
        .iter()
        .find(|c| c.key == split)
        .expect("split registered");
    assert_eq!(
        split_entry.members,
        (0..N as u32).rev().map(Some).collect::<Vec<_>>()
    );
    assert_eq!(split_entry.parent, Some(world));
    assert_eq!(run.summary.gaps, 0);
}

/// A PMPI-style NCCL wrapper (tests/integration/c/nccl_pmpi.c: it takes `ncclAllReduce`,
/// `ncclGroupStart` and `ncclGroupEnd` and reaches NCCL through the profiling names
/// `pnccl*`) preloaded beside libttrace.so, in either order: ttrace records each all-reduce of
/// tests/integration/c/nccl_groups.c once, under `ncclAllReduce`, with its output, the grouped
/// one in a group and its snapshot taken after the group ran; the wrapper counts every call.
/// Before the profiling names were hooked, the wrapper loaded first made NCCL silent.
#[test]
fn a_pmpi_style_wrapper_calling_nccls_profiling_names_is_captured_once_in_either_order() {
    use integration_tests::c_build::compile_c;
    let sim = integration_tests::sim_dir();
    let wrap = integration_tests::c_build::compile_preload_c("nccl_pmpi.c", "nccl_pmpi");
    let exe = compile_c(
        "nccl_groups.c",
        "nccl_groups12",
        12,
        &sim,
        &["libcudart.so.12", "libnccl.so.2"],
    );
    let input: Vec<u8> = (0..8)
        .flat_map(|i| (0.5f32 * i as f32 - 1.0).to_le_bytes())
        .collect();
    let ttrace = libttrace().display().to_string();
    let wrap = wrap.display().to_string();
    for preload in [format!("{wrap}:{ttrace}"), format!("{ttrace}:{wrap}")] {
        let mut cmd = std::process::Command::new(&exe);
        cmd.env_remove("LD_LIBRARY_PATH");
        let run = traced_command_preloaded(cmd, "nccl-pmpi", &preload);
        assert_ok(&run);
        assert_checksums(&run);
        let err = String::from_utf8_lossy(&run.out.stderr);
        assert!(
            err.contains("nccl_pmpi: 4 calls"),
            "LD_PRELOAD={preload}: the wrapper saw every call: {err}"
        );
        let colls: Vec<&Rec> = run
            .records
            .iter()
            .filter(|r| matches!(r.record.op, Op::Collective(_)))
            .collect();
        let apis: Vec<&str> = colls.iter().map(|r| r.record.api.as_str()).collect();
        assert_eq!(
            apis,
            ["ncclAllReduce", "ncclAllReduce"],
            "LD_PRELOAD={preload}: each all-reduce once, under NCCL's name"
        );
        assert_eq!(coll(colls[0]).group, 0, "LD_PRELOAD={preload}");
        assert_ne!(
            coll(colls[1]).group,
            0,
            "LD_PRELOAD={preload}: the grouped one"
        );
        for r in &colls {
            assert_eq!(
                r.tensor(Role::Output).1,
                &input[..],
                "LD_PRELOAD={preload}: a one-rank sum is its input"
            );
        }
        assert_eq!(
            run.summary.gaps, 0,
            "LD_PRELOAD={preload}: {:?}",
            run.summary
        );
    }
}
