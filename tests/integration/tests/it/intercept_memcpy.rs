//! Copies under libttrace.so: every spelling is recorded with its direction, stream and the
//! exact bytes that reached (or left) the device; kernel launches are named in the next op.

use crate::intercept_util;

use intercept_util::*;
use ttrace_format::record::{CopyDirection, GapReason, Op, Role};

#[test]
fn every_copy_spelling_is_captured_with_its_bytes() {
    let run = traced(1, &["traced", "memcpy"], &[]);
    assert_ok(&run);
    assert_checksums(&run);
    let copies: Vec<&Rec> = run
        .records
        .iter()
        .filter(|r| matches!(r.record.op, Op::Memcpy(_)))
        .collect();
    let summary: Vec<(String, CopyDirection, u32, u64)> = copies
        .iter()
        .map(|r| {
            let Op::Memcpy(m) = &r.record.op else {
                unreachable!()
            };
            (r.record.api.clone(), m.direction, m.kind, r.record.stream)
        })
        .collect();
    let s = copies[0].record.stream;
    assert_ne!(s, 0, "the probe's own stream");
    use CopyDirection::*;
    assert_eq!(
        summary,
        vec![
            ("cudaMemcpyAsync".into(), HostToDevice, 1, s),
            ("cudaMemcpyAsync".into(), DeviceToHost, 2, s),
            ("cudaMemcpy".into(), HostToDevice, 4, 0),
            ("cudaMemcpy2DAsync".into(), HostToDevice, 1, s),
            ("cudaMemcpyAsync_ptsz".into(), DeviceToDevice, 3, 2),
            ("cudaMemcpyPeer".into(), DeviceToDevice, 3, 0),
        ],
        "host-to-host copies are not recorded; the default kind is resolved"
    );
    let p1 = pattern(1, 4096);
    assert_eq!(copies[0].tensor(Role::Dst).1, &p1[..]);
    assert_eq!(
        copies[1].tensor(Role::Src).1,
        &p1[..],
        "device-to-host: the source"
    );
    assert_eq!(copies[2].tensor(Role::Dst).1, &pattern(2, 1000)[..]);
    let (t, b) = copies[3].tensor(Role::Dst);
    assert_eq!(
        t.shape,
        vec![10, 40],
        "a pitched copy is packed: height x width"
    );
    let p3 = pattern(3, 480);
    let want: Vec<u8> = (0..10)
        .flat_map(|r| p3[r * 48..r * 48 + 40].to_vec())
        .collect();
    assert_eq!(b, &want[..]);
    assert_eq!(copies[4].tensor(Role::Dst).1, &p1[..]);
    assert_eq!(
        copies[5].tensor(Role::Dst).1,
        &p1[..],
        "the peer copy on device 1"
    );
    // The two host functions launched before the device-to-host copy.
    let k = &copies[1].record.kernels_before;
    assert_eq!(k.len(), 2, "{k:?}");
    assert!(
        k.iter()
            .all(|n| n.contains("traced_marker") || n.starts_with("fn@0x")),
        "{k:?}"
    );
    assert!(copies[2].record.kernels_before.is_empty());
    // Everything in step 0, seq in call order.
    for (i, r) in run.records.iter().enumerate() {
        assert_eq!((r.record.step, r.record.seq), (0, i as u64));
    }
    assert_eq!(run.summary.gaps, 0);
}

/// Copy `i` of thread `t` of `sim-probe traced threads` (tests/sim/probe/src/capture.rs).
fn thread_copy(t: usize, i: usize) -> (u8, usize) {
    ((t * 50 + i) as u8, 1000 + (i * 37 + t * 11) % 3000)
}

#[test]
fn concurrent_threads_through_a_small_ring_lose_nothing_and_keep_their_order() {
    // 4 threads x 200 copies of 1-4 KB through a 64 KiB ring: reservations, tickets and the
    // daemon's releases interleave; every copy must arrive, in each thread's order.
    let run = traced(1, &["traced", "threads"], &[("TTRACE_RING_BYTES", "65536")]);
    assert_ok(&run);
    assert_checksums(&run);
    assert_eq!(run.summary.gaps, 0);
    let mut by_thread: std::collections::BTreeMap<u64, Vec<&Rec>> = Default::default();
    for r in &run.records {
        by_thread.entry(r.record.thread).or_default().push(r);
    }
    assert_eq!(by_thread.len(), 4);
    let mut seen = std::collections::BTreeSet::new();
    for recs in by_thread.values() {
        assert_eq!(recs.len(), 200);
        let first = recs[0].tensor(Role::Dst).1;
        let t = (0..4)
            .find(|&t| {
                let (salt, len) = thread_copy(t, 0);
                first == &pattern(salt, len)[..]
            })
            .expect("the first copy of some thread");
        assert!(seen.insert(t));
        for (i, r) in recs.iter().enumerate() {
            let (salt, len) = thread_copy(t, i);
            assert!(
                r.tensor(Role::Dst).1 == &pattern(salt, len)[..],
                "thread {t} copy {i}"
            );
        }
    }
}

/// A synchronous `cudaMemcpy` returns with its copy done, so a program may change the bytes at
/// once from a stream that does not wait for the legacy default stream (here, an in-place
/// all-reduce of the uploaded buffer on a `cudaStreamNonBlocking` stream). The snapshot is
/// done by then too: with the simulator's legacy streams running every operation 20 ms late
/// (`SIM_CUDA_LEGACY_DELAY_US`), each upload is still captured with the bytes it made, not the
/// all-reduce's result.
#[test]
fn a_synchronous_copy_is_captured_as_made_when_other_streams_change_its_bytes_at_once() {
    let args = ["collectives", "single-process"];
    let crcs = |run: &Run| -> Vec<(u32, u64, Vec<u32>)> {
        run.records
            .iter()
            .map(|r| {
                let crcs = r.record.tensors.iter().map(|t| t.crc32).collect();
                (r.record.rank, r.record.seq, crcs)
            })
            .collect()
    };
    let plain = traced(1, &args, &[]);
    assert_ok(&plain);
    let late = traced(1, &args, &[("SIM_CUDA_LEGACY_DELAY_US", "20000")]);
    assert_ok(&late);
    assert_checksums(&late);
    let (mut want, mut got) = (crcs(&plain), crcs(&late));
    want.sort();
    got.sort();
    assert!(want.len() >= 16, "{} records", want.len());
    assert_eq!(got, want, "the uploads' bytes as the program made them");
}

/// The same for a synchronous download and upload of one buffer, each followed at once by a
/// memset of that buffer on a non-blocking stream (sim-probe `traced memcpy-then-overwrite`):
/// the download's source is captured as it was read, the upload's destination as written.
#[test]
fn synchronous_copies_are_captured_as_made_when_the_buffer_is_overwritten_at_once() {
    let run = traced(
        1,
        &["traced", "memcpy-then-overwrite"],
        &[("SIM_CUDA_LEGACY_DELAY_US", "20000")],
    );
    assert_ok(&run);
    assert_checksums(&run);
    let n = 4096usize;
    let first: Vec<u8> = (0..n).map(|i| (1 + i % 200) as u8).collect();
    let second: Vec<u8> = (0..n).map(|i| (101 + i % 100) as u8).collect();
    let copies: Vec<(CopyDirection, &[u8])> = run
        .records
        .iter()
        .filter_map(|r| {
            let Op::Memcpy(m) = &r.record.op else {
                return None;
            };
            Some((m.direction, r.bytes.first()?.as_deref()?))
        })
        .collect();
    use CopyDirection::*;
    assert_eq!(
        copies,
        vec![
            (HostToDevice, &first[..]),
            (DeviceToHost, &first[..]),
            (HostToDevice, &second[..]),
        ]
    );
}

/// The gap records of a run, in call order: the API each names, its reason and bytes.
fn gaps_of(run: &Run) -> Vec<(&str, GapReason, u64)> {
    run.records
        .iter()
        .filter_map(|r| match &r.record.op {
            Op::Gap(g) => Some((g.skipped_api.as_str(), g.reason, g.bytes)),
            _ => None,
        })
        .collect()
}

/// 3-D copies (`cudaMemcpy3D*`, and between devices `cudaMemcpy3DPeer*`) are not captured:
/// each is an `unsupported` gap naming its API and bytes, in call order, and the program's
/// copies are unchanged (the probe checks the bytes it reads back). Nothing is lost silently.
#[test]
fn three_d_copies_are_gaps_naming_their_api_and_bytes() {
    let run = traced(1, &["traced", "memcpy3d"], &[]);
    assert_ok(&run);
    let out = String::from_utf8_lossy(&run.out.stdout);
    assert!(out.contains("traced memcpy3d OK"), "{out}");
    use GapReason::Unsupported;
    assert_eq!(
        gaps_of(&run),
        vec![
            ("cudaMemcpy3D", Unsupported, 10 * 3 * 2),
            ("cudaMemcpy3DAsync", Unsupported, 32 * 5 * 3),
            ("cudaMemcpy3DPeer", Unsupported, 32 * 5 * 3),
            ("cudaMemcpy3DPeerAsync", Unsupported, 32 * 5 * 3),
        ]
    );
    assert_eq!(run.summary.gaps, 4);
}

/// Copies into, between and out of CUDA arrays (sim-probe `traced memcpy-array`, which checks
/// the bytes it reads back) are `unsupported` gaps naming their API and bytes, in call order:
/// arrays are texture memory, not where tensors live, and the gap says so if a program does
/// move data through them. Nothing is lost silently.
#[test]
fn copies_of_cuda_arrays_are_gaps_naming_their_api_and_bytes() {
    let run = traced(1, &["traced", "memcpy-array"], &[]);
    assert_ok(&run);
    let out = String::from_utf8_lossy(&run.out.stdout);
    assert!(out.contains("traced memcpy-array OK"), "{out}");
    use GapReason::Unsupported;
    assert_eq!(
        gaps_of(&run),
        vec![
            ("cudaMemcpyToArray", Unsupported, 256),
            ("cudaMemcpy2DToArray", Unsupported, 40 * 3),
            ("cudaMemcpy2DArrayToArray", Unsupported, 64 * 4),
            ("cudaMemcpy2DFromArrayAsync", Unsupported, 64 * 4),
            ("cudaMemcpyToArray", Unsupported, 100),
            ("cudaMemcpyFromArray", Unsupported, 100),
        ]
    );
    assert_eq!(run.summary.gaps, 6);
}

/// Copies to and from a `__device__` variable (sim-probe `traced memcpy-symbol`: registered as
/// nvcc's start-up code does, written at offsets 8 and 48, read back whole) are captured as
/// copies at the variable's device address, with the bytes they moved.
#[test]
fn copies_to_and_from_a_device_variable_are_captured_with_their_bytes() {
    let run = traced(1, &["traced", "memcpy-symbol"], &[]);
    assert_ok(&run);
    assert_checksums(&run);
    let first: Vec<u8> = (0..32).map(|i| 101 + i as u8).collect();
    let second: Vec<u8> = (0..16).map(|i| 201 + i as u8).collect();
    let mut whole: Vec<u8> = (1..=64).collect();
    whole[8..40].copy_from_slice(&first);
    whole[48..64].copy_from_slice(&second);
    let copies: Vec<(&str, CopyDirection, &[u8], u64)> = run
        .records
        .iter()
        .filter_map(|r| {
            let Op::Memcpy(m) = &r.record.op else {
                return None;
            };
            let device_end = if m.direction == CopyDirection::HostToDevice {
                m.dst
            } else {
                m.src
            };
            Some((
                r.record.api.as_str(),
                m.direction,
                r.bytes.first()?.as_deref()?,
                device_end,
            ))
        })
        .collect();
    use CopyDirection::*;
    let summary: Vec<(&str, CopyDirection, &[u8])> =
        copies.iter().map(|c| (c.0, c.1, c.2)).collect();
    assert_eq!(
        summary,
        vec![
            ("cudaMemcpyToSymbol", HostToDevice, &first[..]),
            ("cudaMemcpyToSymbolAsync", HostToDevice, &second[..]),
            ("cudaMemcpyFromSymbol", DeviceToHost, &whole[..]),
        ]
    );
    // At the variable's device address and the offsets given.
    let base = copies[2].3;
    assert_eq!((copies[0].3 - base, copies[1].3 - base), (8, 48));
    // The refused copy (an unregistered symbol: no address to resolve) left no record.
    assert_eq!(run.records.len(), 3, "records besides the three copies");
}

/// f32 values as little-endian bytes.
fn f32_bytes(n: usize, f: impl Fn(usize) -> f32) -> Vec<u8> {
    (0..n).flat_map(|j| f(j).to_le_bytes()).collect()
}

/// `cudaMemcpyBatchAsync`, whose signature CUDA 13 changed (tests/integration/c/batch.c,
/// compiled against the CUDA 12.8 and the CUDA 13 headers): every copy of a batch is a record
/// of its own, in the batch's order, with its direction, the program's stream and the bytes it
/// moved (a pageable source read during the call and overwritten at once included); a batch
/// the runtime refuses records nothing, and the program sees the runtime's own error and
/// failure index. CUDA 13's `cudaMemcpyWithAttributesAsync` is a copy like the others;
/// `cudaMemcpy3DBatchAsync` (whose `failIdx` CUDA 13 dropped too) and CUDA 13's
/// `cudaMemcpy3DWithAttributesAsync` are gaps. Also
/// with a 16 KiB ring (where, on CUDA 13, the refused batch's snapshots begin while the daemon
/// still holds the slots of the copies before it: they wait for its releases, where a hook
/// that gave up at once, since the tracer waits for the batch's own first ticket, recorded a
/// ring_full gap), where the 16 KiB copies are streamed in chunks
/// (a download's before the call, while the batch's other snapshots are begun): the same
/// records, nothing lost, no stall.
#[test]
fn batched_copies_are_captured_copy_by_copy_on_cuda_12_and_cuda_13() {
    use integration_tests::c_build::compile_c;
    for (major, ring) in [
        (12, None),
        (13, None),
        (12, Some("16384")),
        (13, Some("16384")),
    ] {
        let Some(sim) = sim_or_skip(major) else {
            continue;
        };
        let cudart = format!("libcudart.so.{major}");
        let exe = compile_c("batch.c", &format!("batch{major}"), major, &sim, &[&cudart]);
        let mut cmd = std::process::Command::new(&exe);
        cmd.env_remove("LD_LIBRARY_PATH");
        if let Some(bytes) = ring {
            cmd.env("TTRACE_RING_BYTES", bytes)
                .env("TTRACE_WAIT_MS", "60000");
        }
        let started = std::time::Instant::now();
        let (run, handle) = run_c_program(cmd, "batch-c", "batch", &format!("CUDA {major}"));
        let took = started.elapsed();
        let batched: Vec<(CopyDirection, u64, &[u8])> = run
            .records
            .iter()
            .filter(|r| r.record.api == "cudaMemcpyBatchAsync")
            .map(|r| {
                let Op::Memcpy(m) = &r.record.op else {
                    panic!("CUDA {major}, ring {ring:?}: not a copy: {:?}", r.record)
                };
                let bytes = r.bytes.first().and_then(|b| b.as_deref()).unwrap_or(&[]);
                (m.direction, r.record.stream, bytes)
            })
            .collect();
        let a = f32_bytes(4096, |j| j as f32 * 0.5 - 3.0);
        let b = f32_bytes(48, |j| 100.0 + j as f32);
        let d = f32_bytes(1000, |j| (j % 13) as f32 - 6.0);
        use CopyDirection::*;
        let want: [(CopyDirection, &[u8]); 5] = [
            (HostToDevice, &b),
            (HostToDevice, &a),
            (DeviceToDevice, &d),
            (DeviceToHost, &a),
            (DeviceToHost, &d),
        ];
        let shape = |v: &[(CopyDirection, u64, &[u8])]| -> Vec<(CopyDirection, u64, usize)> {
            v.iter().map(|c| (c.0, c.1, c.2.len())).collect()
        };
        // A batch's copies streamed in chunks (over half the ring) are recorded after its
        // others: they take their records' places when their last chunk is in.
        let streamed = |bytes: &[u8]| ring.is_some() && bytes.len() > 8192;
        let mut wanted: Vec<(CopyDirection, u64, &[u8])> = Vec::new();
        for batch in [&want[..3], &want[3..]] {
            let (late, first): (Vec<_>, Vec<_>) = batch.iter().partition(|w| streamed(w.1));
            wanted.extend(
                first
                    .iter()
                    .chain(&late)
                    .map(|&&(dir, bytes)| (dir, handle, bytes)),
            );
        }
        assert_eq!(
            shape(&batched),
            shape(&wanted),
            "CUDA {major}, ring {ring:?}"
        );
        for (i, (got, want)) in batched.iter().zip(&wanted).enumerate() {
            assert!(
                got.2 == want.2,
                "CUDA {major}: copy {i} has other bytes than it moved"
            );
        }
        if major >= 13 {
            let with_attributes: Vec<(CopyDirection, u64, &[u8])> = run
                .records
                .iter()
                .filter(|r| r.record.api == "cudaMemcpyWithAttributesAsync")
                .filter_map(|r| {
                    let Op::Memcpy(m) = &r.record.op else {
                        return None;
                    };
                    Some((m.direction, r.record.stream, r.bytes.first()?.as_deref()?))
                })
                .collect();
            assert_eq!(
                with_attributes,
                vec![(HostToDevice, handle, &a[..4000])],
                "CUDA {major}, ring {ring:?}: cudaMemcpyWithAttributesAsync"
            );
        }
        // The 3-D copies are gaps naming their API and elements, on the program's stream.
        let gaps: Vec<(&str, GapReason, u64, u64)> = run
            .records
            .iter()
            .filter_map(|r| match &r.record.op {
                Op::Gap(g) => Some((g.skipped_api.as_str(), g.reason, g.bytes, r.record.stream)),
                _ => None,
            })
            .collect();
        let mut want_gaps = vec![(
            "cudaMemcpy3DBatchAsync",
            GapReason::Unsupported,
            160,
            handle,
        )];
        if major >= 13 {
            want_gaps.push((
                "cudaMemcpy3DWithAttributesAsync",
                GapReason::Unsupported,
                80,
                handle,
            ));
        }
        assert_eq!(gaps, want_gaps, "CUDA {major}, ring {ring:?}");
        // A wait on space the batch itself holds would last TTRACE_WAIT_MS (then a gap).
        assert!(took.as_secs() < 30, "CUDA {major}, ring {ring:?}: {took:?}");
    }
}
