//! CUDA graphs under libttrace.so: ops captured into a graph (stream capture) are snapshotted
//! at every `cudaGraphLaunch`, each replay publishing its own record set with that replay's
//! bytes, byte-exact against a recomputation; what cannot be snapshotted is a gap per replay.
//! Driven by `sim-probe traced graph-step` (two ranks) and by tests/integration/c/graph.c,
//! compiled against NVIDIA's CUDA 12 and CUDA 13 headers and linked to the simulated stack of
//! that major by soname.

use crate::intercept_util;

use std::path::PathBuf;
use std::process::Command;

use integration_tests::c_build::compile_c;
use integration_tests::describe;
use intercept_util::*;
use ttrace_format::record::{CollectiveKind, CopyDirection, GapReason, Op, Role};

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

/// The C program `exe ARGS`, on the simulated stack its sonames link (not
/// `LD_LIBRARY_PATH`'s).
fn c_command(exe: &std::path::Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(args).env_remove("LD_LIBRARY_PATH");
    cmd
}

/// Compiles tests/integration/c/graph.c against CUDA `major`'s headers, linked by soname to
/// the simulated libraries in `sim`.
fn graph_c(major: u32, sim: &std::path::Path) -> PathBuf {
    let cudart = format!("libcudart.so.{major}");
    let cublas = format!("libcublas.so.{major}");
    compile_c(
        "graph.c",
        &format!("graph{major}"),
        major,
        sim,
        &[&cudart, &cublas, "libnccl.so.2", "libcuda.so.1"],
    )
}

/// graph.c's `graph_input(i, j)` as f32 bytes.
fn c_input(replay: usize) -> Vec<u8> {
    (0..16 * 4)
        .flat_map(|j| ((((j * 5 + replay * 3) % 7) as f32 - 3.0) * 0.5).to_le_bytes())
        .collect()
}

#[test]
fn a_c_program_replaying_a_graph_is_captured_on_cuda_12_and_cuda_13_however_instantiated() {
    // "destroy-early": the graph destroyed right after instantiation, as PyTorch does; the
    // runtime then refuses to redirect its nodes, so ttrace must keep it alive. "driver": the
    // same through the driver API (cuStreamEndCapture, cuGraphInstantiate, cuGraphLaunch).
    for (major, spelling) in [
        (12, None),
        (13, None),
        (12, Some("params")),
        (13, Some("params")),
        (12, Some("destroy-early")),
        (13, Some("destroy-early")),
        (12, Some("driver")),
        (13, Some("driver")),
    ] {
        let Some(sim) = sim_or_skip(major) else {
            continue;
        };
        let exe = graph_c(major, &sim);
        let mut args = vec!["3"];
        args.extend(spelling);
        let run = run_c(
            c_command(&exe, &args),
            "graph-c",
            "graph",
            &format!("CUDA {major}"),
        );
        let graph_ops: Vec<&Rec> = run
            .records
            .iter()
            .filter(|r| match &r.record.op {
                Op::Memcpy(m) => m.width == 16 * 4 * 4,
                Op::Gemm(_) | Op::Collective(_) => true,
                _ => false,
            })
            .collect();
        let apis: Vec<&str> = graph_ops.iter().map(|r| r.record.api.as_str()).collect();
        assert_eq!(
            apis,
            ["cudaMemcpyAsync", "cublasGemmEx", "ncclAllReduce"].repeat(3),
            "CUDA {major}"
        );
        for (i, set) in graph_ops.chunks(3).enumerate() {
            let (copy, gemm, reduce) = (set[0], set[1], set[2]);
            let want = c_input(i);
            assert_eq!(
                copy.tensor(Role::Dst).1,
                &want[..],
                "CUDA {major} replay {i}"
            );
            assert_eq!(gemm.tensor(Role::B).1, &want[..], "CUDA {major} replay {i}");
            assert_eq!(
                recompute(gemm).0,
                gemm.tensor(Role::D).1,
                "CUDA {major} replay {i}"
            );
            let d = gemm.tensor(Role::D).1;
            assert_eq!(reduce.tensor(Role::Input).1, d, "CUDA {major} replay {i}");
            // One rank: the sum is the input.
            assert_eq!(reduce.tensor(Role::Output).1, d, "CUDA {major} replay {i}");
        }
    }
}

#[test]
fn replays_of_an_instance_updated_with_cuda_graph_exec_update_are_gaps_naming_it() {
    let run = traced(1, &["traced", "graph-update"], &[]);
    assert_ok(&run);
    let graph_ops: Vec<(String, Option<String>)> = run
        .records
        .iter()
        .filter(|r| match &r.record.op {
            Op::Gap(_) | Op::Gemm(_) => true,
            // The graph's copy (A's upload is a synchronous cudaMemcpy).
            Op::Memcpy(m) => {
                r.record.api == "cudaMemcpyAsync"
                    && m.direction == CopyDirection::HostToDevice
                    && m.width == 256
            }
            _ => false,
        })
        .map(|r| {
            let gap = match &r.record.op {
                Op::Gap(g) => Some(g.detail.clone()),
                _ => None,
            };
            (r.record.api.clone(), gap)
        })
        .collect();
    // The first launch (captured), then the updated launch (gaps).
    let apis: Vec<&str> = graph_ops.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(
        apis,
        ["cudaMemcpyAsync", "cublasSgemm_v2"].repeat(2),
        "{graph_ops:?}"
    );
    assert!(
        graph_ops[..2].iter().all(|(_, g)| g.is_none()),
        "{graph_ops:?}"
    );
    for (_, g) in &graph_ops[2..] {
        assert!(
            g.as_deref()
                .is_some_and(|d| d.contains("cudaGraphExecUpdate")),
            "{graph_ops:?}"
        );
    }
}

/// A graph built node by node (tests/integration/c/graph_nodes.c: copy, memset and empty nodes,
/// `cudaGraphAdd*Node`) runs copies no hook sees: each launch of its instance is a
/// `graph_capture` gap naming its copy and memset nodes, on the launch stream, so the run never
/// reports itself clean; the program's bytes are unchanged (it checks them). A graph the same
/// program captures from a stream is snapshotted at its replay as before (a record, no gap).
#[test]
fn launches_of_a_graph_built_node_by_node_are_gaps_naming_its_nodes() {
    for (major, sim) in cuda_sims() {
        let cudart = format!("libcudart.so.{major}");
        let exe = compile_c(
            "graph_nodes.c",
            &format!("graph_nodes{major}"),
            major,
            &sim,
            &[&cudart],
        );
        let run = run_c(
            c_command(&exe, &[]),
            "graph-nodes-c",
            "graph_nodes",
            &format!("CUDA {major}"),
        );
        let out = String::from_utf8_lossy(&run.out.stdout);
        let s = out
            .lines()
            .find_map(|l| l.strip_prefix("graph_nodes: stream 0x"))
            .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
            .unwrap_or_else(|| panic!("CUDA {major}: no stream in {out}"));
        let gaps = gap_records(&run);
        assert_eq!(gaps.len(), 2, "CUDA {major}: one gap per launch: {gaps:?}");
        for g in &gaps {
            assert_eq!(
                (g.0, g.1, g.2),
                ("cudaGraphLaunch", GapReason::GraphCapture, s),
                "CUDA {major}"
            );
            assert!(
                g.3.contains("3 copy, 1 memset and 0 child-graph nodes"),
                "CUDA {major}: {}",
                g.3
            );
        }
        // The captured graph's replay: its upload, with the bytes of that launch.
        let want: Vec<u8> = (0..64).flat_map(|i| (-(i as f32)).to_le_bytes()).collect();
        let replayed = run.records.iter().any(|r| {
            r.record.api == "cudaMemcpyAsync"
                && r.record.stream == s
                && r.bytes.first().and_then(|b| b.as_deref()) == Some(&want[..])
        });
        assert!(
            replayed,
            "CUDA {major}: the captured graph's copy is captured"
        );
        assert_eq!(run.summary.gaps, 2, "CUDA {major}");
    }
}

/// XLA's command buffers: a cuBLAS call captured from a stream through the driver API becomes
/// a child-graph node of another graph (`cuGraphCreate`, `cuGraphAddChildGraphNode`), which
/// the driver instantiates and launches. The child's nodes are not the ones the tracer can
/// redirect, so each `cuGraphLaunch` is a `graph_capture` gap naming the child-graph node and
/// the ops captured into it, on the launch stream; before the driver's graph calls were
/// hooked such launches left nothing.
/// The program checks its own results (tracing changes none).
#[test]
fn driver_launches_of_a_captured_graph_nested_as_a_child_are_gaps() {
    for (major, sim) in cuda_sims() {
        let exe = graph_c(major, &sim);
        let run = run_c(
            c_command(&exe, &["3", "driver-child"]),
            "graph-c-child",
            "graph",
            &format!("CUDA {major}"),
        );
        let gaps = gap_records(&run);
        assert_eq!(gaps.len(), 3, "CUDA {major}: one gap per launch: {gaps:?}");
        for g in &gaps {
            assert_eq!(
                (g.0, g.1),
                ("cuGraphLaunch", GapReason::GraphCapture),
                "CUDA {major}"
            );
            // The gap names what the child holds: the ops its hooks saw being captured.
            assert!(
                g.3.contains("1 child-graph nodes")
                    && g.3.contains(
                        "3 ops captured from a stream (cudaMemcpyAsync ×1, cublasGemmEx ×1, \
                         ncclAllReduce ×1)"
                    ),
                "CUDA {major}: {}",
                g.3
            );
        }
        // Nothing of the graph's ops is passed off as captured.
        assert!(
            !run.records
                .iter()
                .any(|r| matches!(r.record.op, Op::Gemm(_))),
            "CUDA {major}: a GEMM record from a launch no hook snapshotted"
        );
    }
}

/// A graph holding a conditional node (tests/integration/c/graph_cond.c, CUDA 13: an `if`
/// node whose body uploads a buffer): the body runs at each launch, and no hook sees inside
/// it, so each launch is a `graph_capture` gap naming the conditional node, never silence; in
/// a captured graph (a conditional node added during the capture, as torch.cond does, and a
/// child graph of ops captured elsewhere) the captured ops are still snapshotted at each
/// replay, the gap beside them naming both.
#[test]
fn launches_of_a_graph_with_a_conditional_node_are_gaps_naming_it() {
    let Some(sim) = sim_or_skip(13) else {
        return;
    };
    let exe = compile_c(
        "graph_cond.c",
        "graph_cond13",
        13,
        &sim,
        &["libcudart.so.13"],
    );
    let run = run_c(
        c_command(&exe, &[]),
        "graph-cond-c",
        "graph_cond",
        "CUDA 13",
    );
    let gaps = gap_records(&run);
    assert_eq!(gaps.len(), 4, "one gap per launch: {gaps:?}");
    for g in &gaps {
        assert_eq!((g.0, g.1), ("cudaGraphLaunch", GapReason::GraphCapture));
        assert!(
            g.3.contains("1 conditional (if/while/switch) nodes"),
            "{}",
            g.3
        );
    }
    // The graph built node by node, then the captured one, whose upload is snapshotted at
    // each replay (its record before the gap).
    assert!(gaps[..2].iter().all(|g| g.3.contains("did not capture")));
    assert!(gaps[2..]
        .iter()
        .all(|g| g.3.contains("a captured CUDA graph")));
    // Its child graph's upload, captured into a graph of its own, is named there too.
    assert!(
        gaps[2..].iter().all(|g| g
            .3
            .contains("1 ops captured from a stream (cudaMemcpyAsync ×1)")),
        "{gaps:?}"
    );
    let order: Vec<&str> = run
        .records
        .iter()
        .filter(|r| r.record.stream != 0)
        .map(|r| match &r.record.op {
            Op::Gap(_) => "gap",
            _ => r.record.api.as_str(),
        })
        .collect();
    assert_eq!(
        order,
        [
            "gap",
            "cudaMemcpyAsync",
            "gap",
            "cudaMemcpyAsync",
            "cudaMemcpyAsync",
            "gap",
            "cudaMemcpyAsync",
            "gap"
        ]
    );
    let replayed: Vec<&[u8]> = run
        .records
        .iter()
        .filter(|r| r.record.api == "cudaMemcpyAsync")
        .filter_map(|r| r.bytes.first().and_then(|b| b.as_deref()))
        .collect();
    let want = |launch: usize| -> Vec<u8> {
        (0..256)
            .flat_map(|i| ((i + 10 * launch) as f32).to_le_bytes())
            .collect()
    };
    assert_eq!(replayed.len(), 4);
    assert_eq!(replayed[2], &want(0)[..]);
    assert_eq!(replayed[3], &want(1)[..]);
}
