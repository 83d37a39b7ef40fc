//! Driver API copies and memsets under libttrace.so: a program written only against NVIDIA's
//! headers (tests/integration/c/driver_copies.c) moves tensors with `cuMemcpy*` and sets
//! memory with `cuMemsetD*`, linking the driver, taking every entry point with
//! `dlsym(handle, name)` from a privately opened `libcuda.so.1` (as JAX's XLA plugin does), or
//! by base name from the driver's `cuGetProcAddress` (both ABIs, as NVIDIA's Python bindings
//! do) or the runtime's `cudaGetDriverEntryPoint[ByVersion]`: the same records each way. Each
//! copy is captured under the driver's API name with its direction, stream and bytes; a memset
//! of one repeated byte is a `memset` record; a 32-bit pattern of unequal bytes, and a 2-D
//! memset, are gaps naming them. Nothing else is recorded. Built with per-thread default
//! streams (tests/integration/c/driver_copies_ptds.c), the same program calls the `_ptds` and
//! `_ptsz` spellings: the same records under those names, the synchronous ones on the calling
//! thread's default stream.

use crate::intercept_util;

use integration_tests::c_build::compile_c;
use intercept_util::*;
use ttrace_format::record::{CopyDirection, GapReason, Op};

fn f32_bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(f32::to_le_bytes).collect()
}

/// A record as the test compares it: API, what it is, stream, bytes.
#[derive(Debug, PartialEq)]
enum Seen {
    Copy(String, CopyDirection, u64, Vec<u8>),
    Memset(String, u8, u64, u64),
    Gap(String, GapReason, u64, u64),
}

/// The program's output and records when run traced in `mode`: what it printed as its stream,
/// what was recorded, and the run's gap count.
fn run_mode(exe: &std::path::Path, what: &str, mode: &str) -> (u64, Vec<Seen>, u64) {
    let mut cmd = std::process::Command::new(exe);
    cmd.arg(mode).env_remove("LD_LIBRARY_PATH");
    let (run, s) = run_c_program(
        cmd,
        "driver-copies-c",
        "driver_copies",
        &format!("{what} {mode}"),
    );
    let seen: Vec<Seen> = run
        .records
        .iter()
        .map(|r| {
            let api = r.record.api.clone();
            let stream = r.record.stream;
            match &r.record.op {
                Op::Memcpy(m) => Seen::Copy(
                    api,
                    m.direction,
                    stream,
                    r.bytes.first().cloned().flatten().unwrap_or_default(),
                ),
                Op::Memset(m) => Seen::Memset(api, m.value, m.width, stream),
                Op::Gap(g) => Seen::Gap(g.skipped_api.clone(), g.reason, g.bytes, stream),
                other => panic!("{what} {mode}: unexpected {other:?}"),
            }
        })
        .collect();
    (s, seen, run.summary.gaps)
}

/// What driver_copies.c records: its async calls on stream `s`, its synchronous ones on
/// `sync` (0: the legacy default stream), each API named as `name` spells it.
fn expected(s: u64, sync: u64, name: impl Fn(&str) -> String) -> Vec<Seen> {
    let a = f32_bytes((0..64).map(|i| i as f32 * 0.25));
    let b = f32_bytes((0..64).map(|i| 100.0 - i as f32));
    let words = f32_bytes((0..64).map(|i| if i < 16 { 1.0 } else { 0.0 }));
    let mut last = a.clone();
    last[..8].fill(0x11);
    let mut rows = b[..128].to_vec();
    rows[..16].fill(0x22);
    rows[64..80].fill(0x22);
    use CopyDirection::*;
    let c = |api: &str, d, st, bytes: &[u8]| Seen::Copy(name(api), d, st, bytes.to_vec());
    vec![
        c("cuMemcpyHtoD_v2", HostToDevice, sync, &a),
        c("cuMemcpyHtoDAsync_v2", HostToDevice, s, &b),
        c("cuMemcpyDtoDAsync_v2", DeviceToDevice, s, &b),
        Seen::Memset(name("cuMemsetD32Async"), 0, 256, s),
        Seen::Gap(name("cuMemsetD32Async"), GapReason::Unsupported, 64, s),
        c("cuMemcpyDtoHAsync_v2", DeviceToHost, s, &b),
        c("cuMemcpyDtoH_v2", DeviceToHost, sync, &words),
        c("cuMemcpyDtoH_v2", DeviceToHost, sync, &a),
        c("cuMemcpy", DeviceToDevice, sync, &a),
        Seen::Memset(name("cuMemsetD8_v2"), 0x11, 8, sync),
        c("cuMemcpyDtoH_v2", DeviceToHost, sync, &last),
        Seen::Gap(name("cuMemsetD2D8Async"), GapReason::Unsupported, 32, s),
        c("cuMemcpyDtoH_v2", DeviceToHost, sync, &rows),
    ]
}

#[test]
fn driver_copies_and_memsets_are_captured_however_the_program_finds_the_driver() {
    for (major, sim) in cuda_sims() {
        let cudart = format!("libcudart.so.{major}");
        let exe = compile_c(
            "driver_copies.c",
            &format!("driver_copies{major}"),
            major,
            &sim,
            &[&cudart, "libcuda.so.1"],
        );
        for mode in [
            "linked",
            "dlsym",
            "proc",
            "proc_v1",
            "entry",
            "entry_version",
        ] {
            if mode == "dlsym" && !cfg!(target_arch = "x86_64") {
                continue; // dlsym is interposed on x86-64 only
            }
            let what = format!("CUDA {major}");
            let (s, seen, gaps) = run_mode(&exe, &what, mode);
            assert_eq!(seen, expected(s, 0, str::to_owned), "{what} {mode}");
            assert_eq!(gaps, 2, "{what} {mode}");
        }
    }
}

/// The per-thread default stream's spelling of a driver entry point: `_ptsz` for the
/// asynchronous ones, `_ptds` for the others (cuda.h's `__CUDA_API_PTSZ`/`__CUDA_API_PTDS`).
fn per_thread_spelling(api: &str) -> String {
    if api.contains("Async") {
        format!("{api}_ptsz")
    } else {
        format!("{api}_ptds")
    }
}

#[test]
fn a_program_built_with_per_thread_default_streams_is_captured_under_its_spellings() {
    for (major, sim) in cuda_sims() {
        let cudart = format!("libcudart.so.{major}");
        let exe = compile_c(
            "driver_copies_ptds.c",
            &format!("driver_copies_ptds{major}"),
            major,
            &sim,
            &[&cudart, "libcuda.so.1"],
        );
        let what = format!("CUDA {major} per-thread");
        let mut sync_streams = Vec::new();
        for mode in ["linked", "proc", "entry", "entry_version"] {
            let (s, seen, gaps) = run_mode(&exe, &what, mode);
            // The synchronous calls' stream: the calling thread's default stream, whatever
            // handle the store gives it, the same for each of them and not the legacy one.
            let sync = match seen.first() {
                Some(Seen::Copy(_, _, st, _)) => *st,
                other => panic!("{what} {mode}: first record {other:?}"),
            };
            assert_ne!(sync, 0, "{what} {mode}: on the legacy default stream");
            assert_ne!(sync, s, "{what} {mode}");
            assert_eq!(
                seen,
                expected(s, sync, per_thread_spelling),
                "{what} {mode}"
            );
            assert_eq!(gaps, 2, "{what} {mode}");
            sync_streams.push(sync);
        }
        sync_streams.dedup();
        assert_eq!(sync_streams.len(), 1, "{what}: {sync_streams:?}");
    }
}
