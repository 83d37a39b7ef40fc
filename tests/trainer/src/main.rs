//! `trainer`: a small Megatron-style GPT on the CUDA ABI, the fixture ttrace is tested against.
//!
//! It knows nothing of ttrace. Device work goes through `cuda-dyn` only: GEMMs on cuBLAS or
//! cuBLASLt, collectives and pipeline transfers on NCCL, weights and batches uploaded with
//! `cudaMemcpyAsync` from pinned memory, the loss downloaded; normalization, softmax, GELU,
//! embedding, cross-entropy and Adam run as host functions on the stream (the kernels a tracer
//! does not see), reaching device memory through the simulated runtime's `device_access`.
//! Modules (one job each): [`cli`] options and configuration, [`bugs`] the silent-bug catalogue,
//! [`cuda`] runtime wrappers, [`comm`] topology and NCCL groups, [`data`] the token stream,
//! [`init`] canonical weights, [`params`] parameter shards and flat buffers, [`gemm`] BLAS
//! calls, [`kernels`] host-function kernels, [`fp8`] delayed scaling, [`layers`] TP/SP
//! linears, [`attention`] core attention, [`model`] a pipeline stage, [`schedule`] 1F1B,
//! [`optimizer`] grad finalisation and Adam, [`dump`] the output files, [`train`] a run.
//!
//! Exit codes: 0 success, 1 runtime failure, 2 usage error (bad layout, unknown bug, ...).

use std::process::ExitCode;

use clap::Parser;

pub mod attention;
pub mod bugs;
pub mod cli;
pub mod comm;
pub mod cuda;
pub mod data;
pub mod dump;
pub mod fp8;
pub mod gemm;
pub mod init;
pub mod kernels;
pub mod layers;
pub mod model;
pub mod nvtx;
pub mod optimizer;
pub mod params;
pub mod schedule;
pub mod train;

fn usage(msg: &str) -> ExitCode {
    eprintln!("trainer: error: {msg}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args = cli::Args::parse();
    if args.list_bugs {
        print!("{}", bugs::list(args.json));
        return ExitCode::SUCCESS;
    }
    let cfg = match args.config() {
        Ok(c) => c,
        Err(e) => return usage(&e.0),
    };
    if let Some(name) = &args.explain_bug {
        return match bugs::Bug::from_name(name) {
            Some(b) => {
                print!("{}", bugs::explain(b, &cfg, args.json));
                ExitCode::SUCCESS
            }
            None => usage(&format!("unknown bug `{name}`; see --list-bugs")),
        };
    }
    match train::run(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<cli::UsageError>() {
            Some(u) => usage(&u.0),
            None => {
                eprintln!(
                    "trainer: rank {}: {e:#}",
                    std::env::var("RANK").unwrap_or_else(|_| "0".into())
                );
                ExitCode::from(1)
            }
        },
    }
}
