//! ttrace's integration tests, one test binary (linked once; `cargo test -p integration-tests
//! --test it MODULE::` runs one file's tests). Each module is one area's spec: abi*, sim_*
//! (the simulated CUDA stack), intercept_* (libttrace.so), daemon_* (ttraced), capture_*,
//! run_*, read_*, check_*, compare_*, reliability_*, torch_* (real PyTorch wheels).

#[path = "../../../../format/tests/common/mod.rs"]
mod common;
mod daemon_util;
mod intercept_util;
mod reliability_util;
mod torch_util;

mod abi;
mod abi_cuda13;
mod bare_preload;
mod c_program;
mod capture_crash;
mod capture_dedup;
mod capture_prefilter;
mod capture_streamed;
mod capture_trainer;
mod check_trainer;
mod compare_fixture2;
mod compare_graphed_trainer;
mod compare_honest;
mod compare_html;
mod compare_partition;
mod compare_threads;
mod compare_trainer;
mod daemon_crash;
mod daemon_jobs;
mod daemon_robustness;
mod daemon_store;
mod intercept_abi;
mod intercept_backpressure;
mod intercept_blas_routines;
mod intercept_blockscaled;
mod intercept_c_api;
mod intercept_census;
mod intercept_driver;
mod intercept_gemm;
mod intercept_gemm_more;
mod intercept_graph;
mod intercept_memcpy;
mod intercept_memset;
mod intercept_nccl;
mod intercept_nccl_identity;
mod intercept_nvtx;
mod intercept_private_libs;
mod intercept_ptrarrays;
mod intercept_real_cudart;
mod intercept_robustness;
mod intercept_steps;
mod intercept_trainer;
mod read_cli;
mod read_python;
mod read_trainer;
mod reliability_run;
mod reliability_soak;
mod reliability_store;
mod reliability_wire;
mod run_cli;
mod run_e2e;
mod run_perturb;
mod sim_blas_more;
mod sim_driver;
mod sim_gemm;
mod sim_graph_nodes;
mod sim_nccl;
mod sim_runtime;
mod sim_sharded;
mod simrun;
mod stall_budget;
mod store_set;
mod torch_compare;
mod torch_dist;
mod torch_ops;
mod trainer_fixture;
