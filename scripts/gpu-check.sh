#!/usr/bin/env bash
# Real PyTorch on a real GPU, traced by `ttrace run`, checked against what PyTorch computed.
#
# On a machine with an NVIDIA GPU: builds ttrace and libttrace.so, makes a venv with PyPI's
# torch (its Linux wheels are CUDA 12 builds), runs scripts/gpu-check/probe.py under
# `ttrace run` (a host-to-device copy, an FP32 matmul, nn.Linear with bias, bmm, a BF16 GEMM,
# an NCCL all-reduce at world size 1; the probe saves every input and output), dumps the store
# with `ttrace dump`, and prints a PASS/FAIL table (scripts/gpu-check/check.py): each saved
# tensor must be found, byte for byte, among the captured ones; every captured tensor must
# match its CRC-32; no gaps. Then the scripts the simulated-stack tests run (tests/torch, see
# tests/integration/tests/torch_*.rs), this time on the real GPU:
#   ops.py       copies, GEMMs in fp32/fp16/bf16, FP8 _scaled_mm, linear backward: every tensor
#                torch saw must be captured byte for byte (the same check.py table);
#   dist.py      (4+ GPUs) torchrun with NCCL: every collective's result captured, per rank;
#   megatron.py  the world-1 reference and its --perturb twin; with 4+ GPUs the tp=2 dp=2 run
#                must compare MATCH and the neighbour-shard bug must be found (exit 1).
# Exits 0 when everything passed or when there is no GPU to check on (saying so), 1 when a
# check failed.
#
#   scripts/gpu-check.sh                 # work directory: a fresh temporary one
#   GPU_CHECK_DIR=/tmp/gc scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu-check: no GPU here (nvidia-smi is not installed): nothing to check."
  exit 0
fi
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "gpu-check: no GPU here (nvidia-smi lists no device): nothing to check."
  exit 0
fi
nvidia-smi -L

work="${GPU_CHECK_DIR:-$(mktemp -d -t ttrace-gpu-check.XXXXXX)}"
mkdir -p "$work"
target="${CARGO_TARGET_DIR:-target}"
echo "gpu-check: working in $work"

cargo build --release -q -p ttrace-cli -p ttrace-intercept
ttrace="$target/release/ttrace"
[ -f "$target/release/libttrace.so" ] || { echo "gpu-check: libttrace.so was not built" >&2; exit 1; }

if [ ! -x "$work/venv/bin/python" ]; then
  python3 -m venv "$work/venv" || {
    echo "gpu-check: cannot create a venv (Debian/Ubuntu: apt-get install python3-venv)" >&2
    exit 1
  }
  "$work/venv/bin/pip" install -q --upgrade pip
  "$work/venv/bin/pip" install -q torch numpy
fi
py="$work/venv/bin/python"
if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu-check: torch $("$py" -c 'import torch; print(torch.__version__)') sees no usable GPU: nothing to check."
  exit 0
fi
"$py" -c 'import torch; print("gpu-check: torch", torch.__version__, "CUDA", torch.version.cuda, "on", torch.cuda.get_device_name(0))'

rm -rf "$work/store" "$work/expected" "$work/tensors"
"$ttrace" run --out "$work/store" -- "$py" scripts/gpu-check/probe.py "$work/expected"
"$ttrace" dump "$work/store" --tensors "$work/tensors" > "$work/records.jsonl"
failed=0
"$py" scripts/gpu-check/check.py "$work/expected" "$work/records.jsonl" "$work/tensors" || failed=1

# Captures the command after `--` into store $1 and checks what the script saved in $2
# (per rank when $3 is "per-rank") against the captured tensors.
check_script() {
  local store="$1" saved="$2" mode="$3"; shift 4
  rm -rf "$store" "$saved" "$store.tensors"
  if ! "$ttrace" run --out "$store" -- "$@"; then
    echo "gpu-check: FAIL: $* exited non-zero under ttrace run"; failed=1; return
  fi
  "$ttrace" dump "$store" --tensors "$store.tensors" > "$store.records.jsonl"
  if [ "$mode" = per-rank ]; then
    for d in "$saved"/rank*; do
      echo "gpu-check: ${d##*/}"
      "$py" scripts/gpu-check/check.py "$d" "$store.records.jsonl" "$store.tensors" "${d##*/rank}" || failed=1
    done
  else
    "$py" scripts/gpu-check/check.py "$saved" "$store.records.jsonl" "$store.tensors" || failed=1
  fi
}

ngpu=$(nvidia-smi -L | grep -c '^GPU ')
torchrun="$work/venv/bin/torchrun"
echo "gpu-check: tests/torch/ops.py on the GPU"
TTRACE_TORCH_REAL_GPU=1 check_script "$work/ops-store" "$work/ops" single -- \
  "$py" tests/torch/ops.py "$work/ops"
if [ "$ngpu" -ge 4 ]; then
  echo "gpu-check: tests/torch/dist.py, torchrun --nproc-per-node 4"
  check_script "$work/dist-store" "$work/dist" per-rank -- \
    "$torchrun" --standalone --nproc-per-node 4 tests/torch/dist.py "$work/dist"
else
  echo "gpu-check: tests/torch/dist.py skipped: it needs 4 GPUs, this machine has $ngpu"
fi

echo "gpu-check: tests/torch/megatron.py (fp32): reference, perturbed reference"
m=(tests/torch/megatron.py --precision fp32 --micro-batches 2)
rm -rf "$work/m-ref" "$work/m-ref-p" "$work/m-tp2dp2" "$work/m-bug"
"$ttrace" run --out "$work/m-ref" -- "$py" "${m[@]}" || failed=1
"$ttrace" run --out "$work/m-ref-p" --perturb -- "$py" "${m[@]}" || failed=1
if [ "$ngpu" -ge 4 ]; then
  tr=("$torchrun" --standalone --nproc-per-node 4)
  "$ttrace" run --out "$work/m-tp2dp2" -- "${tr[@]}" "${m[@]}" || failed=1
  "$ttrace" run --out "$work/m-bug" -- "${tr[@]}" "${m[@]}" --bug neighbour-shard || failed=1
  if "$ttrace" compare "$work/m-ref" "$work/m-tp2dp2" --perturbed "$work/m-ref-p"; then
    echo "gpu-check: PASS: the bug-free tp=2 dp=2 run matches the reference"
  else
    echo "gpu-check: FAIL: the bug-free tp=2 dp=2 run does not match"; failed=1
  fi
  rc=0; "$ttrace" compare "$work/m-ref" "$work/m-bug" --perturbed "$work/m-ref-p" || rc=$?
  if [ "$rc" -eq 1 ]; then
    echo "gpu-check: PASS: the neighbour-shard bug is found"
  else
    echo "gpu-check: FAIL: compare exited $rc on the neighbour-shard bug (1 expected)"; failed=1
  fi
else
  # One GPU: the reference against its own perturbed twin must match (tolerances hold on the
  # real cuBLAS), which is what a user's first compare on one GPU does.
  if "$ttrace" compare "$work/m-ref" "$work/m-ref-p"; then
    echo "gpu-check: PASS: the reference matches its perturbed twin"
  else
    echo "gpu-check: FAIL: the reference does not match its perturbed twin"; failed=1
  fi
  echo "gpu-check: megatron.py tp=2 dp=2 skipped: it needs 4 GPUs, this machine has $ngpu"
fi
exit "$failed"
