#!/usr/bin/env bash
# README's main command. Builds the workspace, then runs a 4-rank job on the simulated CUDA
# stack (no GPU needed): GEMMs through cuBLAS and cuBLASLt (fp32, bf16, fp8) and NCCL collectives
# across processes, each checked against an f64 reference. When the capture path lands, this
# script traces the fixture trainer and compares it against its reference run.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --workspace --release
sim=target/release/sim
export LD_LIBRARY_PATH="$sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== simulated stack in $sim:"
for lib in "$sim"/*; do
  printf '   %-22s SONAME %s\n' "$(basename "$lib")" "$(readelf -d "$lib" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')"
done

run() {
  echo "== $*"
  "$@"
}
run target/release/sim-probe stale-read
run target/release/sim-probe stream-order
for p in $(target/release/sim-probe 2>&1 | awk '/^  (gemm|collectives)/ {print $1}'); do
  case "$p" in
    collectives*) run target/release/simrun --nproc-per-node 4 -- target/release/sim-probe "$p" ;;
    *) run target/release/sim-probe "$p" ;;
  esac
done
echo "== all checks passed"
