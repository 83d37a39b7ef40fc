#!/usr/bin/env bash
# Builds the CUDA 13 simulated stack into target/cuda13/<profile>/sim: libcudart.so.13,
# libcublas.so.13, libcublasLt.so.13, NCCL 2.30's libnccl.so.2 and libcuda.so.1 (CUDA 13
# signatures and layouts, cfg(sim_cuda13)). Usage: scripts/build-sim-cuda13.sh [--release]
set -euo pipefail
cd "$(dirname "$0")/.."
SIM_CUDA_MAJOR=13 CARGO_TARGET_DIR=target/cuda13 cargo build "$@" \
  -p sim-cudart -p sim-cublas -p sim-cublaslt -p sim-nccl -p sim-driver
