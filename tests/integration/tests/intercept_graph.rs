//! CUDA graphs under libttrace.so: ops captured into a graph (stream capture) are snapshotted
//! at every `cudaGraphLaunch`, each replay publishing its own record set with that replay's
//! bytes, byte-exact against a recomputation; what cannot be snapshotted is a gap per replay.

mod intercept_util;

use integration_tests::describe;
use intercept_util::*;
use ttrace_format::record::{CollectiveKind, Op, Role};

const REPLAYS: usize = 3;

/// `sim-probe traced graph-step N`: replay i's input on rank r (as the probe makes it).
fn input(rank: usize, replay: usize) -> Vec<u8> {
    sim_probe_input(rank, replay, 32 * 8)
}

/// The probe's `rank_f32(rank, 100 + replay, len)`: a fixed LCG, values in [-2, 2) as f32.
fn sim_probe_input(rank: usize, replay: usize, len: usize) -> Vec<u8> {
    let mut state = ((rank * 1000 + 100 + replay) as u64) + 1;
    let mut out = Vec::with_capacity(len * 4);
    for _ in 0..len {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let v = (((state >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0) * 2.0;
        out.extend_from_slice(&(v as f32).to_le_bytes());
    }
    out
}

#[test]
fn each_replay_of_a_captured_copy_gemm_and_all_reduce_is_a_record_set_with_its_bytes() {
    let run = traced(2, &["traced", "graph-step", &REPLAYS.to_string()], &[]);
    assert_ok(&run);
    assert_checksums(&run);
    for rank in 0..2u32 {
        let recs = run.of_rank(rank);
        assert!(
            recs.iter().all(|r| !matches!(r.record.op, Op::Gap(_))),
            "rank {rank}: no gap"
        );
        // The graph's three ops, in capture order, once per replay (the eager uploads of A
        // come before the first replay and are told apart by size: A is 16x32, B 32x8).
        let copies: Vec<&&Rec> = recs
            .iter()
            .filter(|r| {
                r.record.api == "cudaMemcpyAsync" && r.record.tensors[0].nbytes == 32 * 8 * 4
            })
            .collect();
        let gemms: Vec<&&Rec> = recs
            .iter()
            .filter(|r| r.record.api == "cublasGemmEx")
            .collect();
        let reduces: Vec<&&Rec> = recs
            .iter()
            .filter(|r| matches!(&r.record.op, Op::Collective(c) if c.kind == CollectiveKind::AllReduce))
            .collect();
        assert_eq!(copies.len(), REPLAYS, "rank {rank}: copies");
        assert_eq!(gemms.len(), REPLAYS, "rank {rank}: GEMMs");
        assert_eq!(reduces.len(), REPLAYS, "rank {rank}: all-reduces");
        for i in 0..REPLAYS {
            let want = input(rank as usize, i);
            assert_eq!(
                copies[i].tensor(Role::Dst).1,
                &want[..],
                "rank {rank} replay {i}: copy"
            );
            assert_eq!(
                gemms[i].tensor(Role::B).1,
                &want[..],
                "rank {rank} replay {i}: B"
            );
            assert_eq!(
                recompute(gemms[i]).0,
                gemms[i].tensor(Role::D).1,
                "rank {rank} replay {i}: D recomputes bitwise from the captured A and B"
            );
            // In place: the all-reduce's input is the GEMM's output of the same replay.
            assert_eq!(
                reduces[i].tensor(Role::Input).1,
                gemms[i].tensor(Role::D).1,
                "rank {rank} replay {i}: all-reduce input"
            );
            let seqs = [copies[i], gemms[i], reduces[i]].map(|r| (r.record.step, r.record.seq));
            assert!(
                seqs[0] < seqs[1] && seqs[1] < seqs[2],
                "capture order: {seqs:?}"
            );
        }
        // Each replay is its own record set: later replays come later.
        for w in gemms.windows(2) {
            assert!((w[0].record.step, w[0].record.seq) < (w[1].record.step, w[1].record.seq));
        }
    }
    // Every replay's all-reduce output is the ring-order sum of the ranks' captured inputs.
    let all: Vec<Rec> = run.records.clone();
    assert_eq!(check_all_reduces(&all), REPLAYS);
}

#[test]
fn a_replayed_op_larger_than_the_ring_is_metadata_at_each_replay() {
    // A ring too small for the GEMM's operands (A 2 KiB + B 1 KiB + D 512 B) but not for the
    // copy or the all-reduce: each replay still records the GEMM, its tensors marked not
    // captured, and captures the others.
    let run = traced(
        2,
        &["traced", "graph-step", "2"],
        &[("TTRACE_RING_BYTES", "3072")],
    );
    assert!(run.out.status.success(), "{}", describe(&run.out));
    assert_checksums(&run);
    for rank in 0..2u32 {
        let recs = run.of_rank(rank);
        let gemms: Vec<&&Rec> = recs
            .iter()
            .filter(|r| r.record.api == "cublasGemmEx")
            .collect();
        assert_eq!(gemms.len(), 2, "rank {rank}");
        for g in &gemms {
            assert!(
                g.record.tensors.iter().all(|t| !t.captured),
                "{:?}",
                g.record
            );
        }
        let reduces = recs
            .iter()
            .filter(|r| r.record.api == "ncclAllReduce")
            .count();
        assert_eq!(reduces, 2, "rank {rank}");
        for i in 0..2 {
            let want = input(rank as usize, i);
            assert!(
                recs.iter().any(|r| r.record.api == "cudaMemcpyAsync"
                    && r.bytes[0].as_deref() == Some(&want[..])),
                "rank {rank}: replay {i}'s copy is captured"
            );
        }
    }
}
