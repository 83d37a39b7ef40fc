//! `sim-probe`: test programs that drive the CUDA ABI through `cuda-dyn` (so they run on the
//! simulated stack or a real one) and check their results. Each subcommand exits 0 when every
//! check passed, 1 with a message naming the failed check otherwise.

use std::process::ExitCode;

mod big;
mod blas_more;
mod blockscaled;
mod capture;
mod collectives;
mod driver_copies;
mod gemm;
mod ksplit;
mod memset;
mod ptrarrays;
mod streams;
mod support;

/// A probe: gets the arguments after its name.
type Probe = fn(&[String]) -> Result<(), String>;

/// Every subcommand, with a one-line description.
const PROBES: &[(&str, &str, Probe)] = &[
    // (name, what it checks, entry point): one line per probe.
    (
        "gemm-cublas",
        "cuBLAS GEMMs vs f64 within round-off; statuses, streams (--sim: bitwise)",
        gemm::cublas,
    ),
    (
        "gemm-lt",
        "cuBLASLt matmuls, epilogues, FP8 scales/amax, descriptors (--sim: bitwise)",
        gemm::lt,
    ),
    (
        "gemm-fault",
        "a GEMM on device-inaccessible memory faults on its stream",
        gemm::fault,
    ),
    (
        "stale-read",
        "a host read before synchronising sees stale data",
        streams::stale_read,
    ),
    (
        "stream-order",
        "events and legacy-stream rules order streams, nothing else",
        streams::stream_order,
    ),
    (
        "pageable-copies",
        "pageable copies stage or block; pointer attributes; a copy lies in one registration",
        streams::pageable_copies,
    ),
    (
        "capture",
        "stream capture, its thread-mode rules, graph replay",
        streams::capture,
    ),
    (
        "graph-nodes",
        "captured graph nodes and redirecting an instance's memcpy node",
        streams::graph_nodes,
    ),
    (
        "graph-build",
        "a graph built node by node: copies, memsets, empty and child nodes in order",
        streams::graph_build,
    ),
    (
        "device-deref",
        "a host read of a device pointer faults (expect SIGSEGV)",
        streams::device_deref,
    ),
    (
        "errors",
        "last error, device queries, invalid frees",
        streams::errors,
    ),
    (
        "collectives",
        "NCCL collectives, groups, splits, peer death",
        collectives::collectives,
    ),
    (
        "traced",
        "programs for the capture tests: memcpy|memset|gemm|nccl|graph|errors|steps",
        capture::traced,
    ),
    (
        "big",
        "programs for streamed capture and crash accounting: copy|allreduce BYTES, crash HOW",
        big::big,
    ),
    (
        "blas-more",
        "cuBLAS helper copies, f32 axpy/scal/dot/geam, cuBLASLt matrix transform",
        blas_more::blas_more,
    ),
    (
        "driver-copies",
        "driver API cuMemAlloc/cuMemcpy*/cuMemsetD8/D16/D32, sync and on a stream, byte for byte",
        driver_copies::driver_copies,
    ),
    (
        "ksplit",
        "K-sharded GEMM + all-reduce: within round-off, never bitwise equal (simrun)",
        ksplit::ksplit,
    ),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(name) = args.first() else {
        eprintln!("usage: sim-probe PROBE [ARGS...]\nprobes:");
        for (n, what, _) in PROBES {
            eprintln!("  {n:<24} {what}");
        }
        return ExitCode::from(2);
    };
    let Some((_, _, run)) = PROBES.iter().find(|(n, _, _)| n == name) else {
        eprintln!("sim-probe: unknown probe `{name}` (run without arguments for the list)");
        return ExitCode::from(2);
    };
    match run(&args[1..]) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("sim-probe {name}: FAILED: {msg}");
            ExitCode::from(1)
        }
    }
}
