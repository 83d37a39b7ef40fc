#!/usr/bin/env bash
# Real PyTorch on a real GPU, traced by `ttrace run`, checked against what PyTorch computed.
#
# On a machine with an NVIDIA GPU: builds ttrace and libttrace.so, makes a venv with PyPI's
# torch (its Linux wheels are CUDA 12 builds), runs scripts/gpu-check/probe.py under
# `ttrace run` (a host-to-device copy, an FP32 matmul, nn.Linear with bias, bmm, a BF16 GEMM,
# an NCCL all-reduce at world size 1; the probe saves every input and output), dumps the store
# with `ttrace dump`, and prints a PASS/FAIL table (scripts/gpu-check/check.py): each saved
# tensor must be found, byte for byte, among the captured ones; every captured tensor must
# match its CRC-32; no gaps. Exits 0 when everything passed or when there is no GPU to check
# on (saying so), 1 when a check failed.
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
"$py" scripts/gpu-check/check.py "$work/expected" "$work/records.jsonl" "$work/tensors"
