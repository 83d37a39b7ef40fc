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
# tests/integration/tests/it/torch_*.rs), this time on the real GPU:
#   ops.py       copies, GEMMs in fp32/fp16/bf16, FP8 _scaled_mm, linear backward: every tensor
#                torch saw must be captured byte for byte (the same check.py table), and its
#                NVTX ranges (NVTX 3, compiled into torch) must be on the records, a
#                range_start must mark a step under --step-rule nvtx:NAME, and a name no
#                range has must leave a warning in the store;
#   graph_probe.py  CUDA graphs: GEMMs, a copy and an all-reduce captured into torch.cuda.graph
#                and replayed with new inputs, then (with Triton) a matmul compiled with
#                torch.compile(mode="reduce-overhead"): every replay's tensors captured;
#   graphed_train.py  an MLP trained eagerly and with its whole step in a replayed CUDA graph:
#                `ttrace compare` must match them, and find a loss doubled inside the graph;
#                the graphed run's --perturb twin must be perturbed at every replay;
#   dist.py      (4+ GPUs) torchrun with NCCL: every collective's result captured, per rank;
#   megatron.py  the world-1 reference and its --perturb twin; with 4+ GPUs the tp=2 dp=2 run
#                must compare MATCH and the neighbour-shard bug must be found (exit 1);
#   jax_probe.py (when JAX with a GPU backend is installed) f32 and bf16 matmuls, whose
#                operands and outputs must be captured byte for byte (XLA's cuBLASLt calls,
#                reached through dlsym);
#   jax_step.py  a jitted step run as XLA's command buffer (a CUDA graph XLA builds): each
#                launch must be a gap naming the matmuls inside, never silence; with command
#                buffers off, every matmul must be a record.
# Exits 0 when everything passed or when there is no GPU to check on (saying so), 1 when a
# check failed.
#
#   scripts/gpu-check.sh                 # work directory: a fresh temporary one
#   GPU_CHECK_DIR=/tmp/gc scripts/gpu-check.sh
# On a GPU machine with no Rust toolchain or no package index (a lent, offline box):
#   GPU_CHECK_BIN_DIR=DIR   use DIR/ttrace and DIR/libttrace.so built elsewhere (x86-64
#                           Linux, glibc not newer than the GPU machine's) instead of cargo;
#   GPU_CHECK_PYTHON=PY     use PY's torch; without it a python3 that imports torch is used,
#                           and only where none does is a venv made with PyPI's torch.
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

if [ -n "${GPU_CHECK_BIN_DIR:-}" ]; then
  bin="$(cd "$GPU_CHECK_BIN_DIR" && pwd)"
else
  cargo build --release -q -p ttrace-cli -p ttrace-intercept
  bin="$target/release"
fi
ttrace="$bin/ttrace"
[ -x "$ttrace" ] || { echo "gpu-check: $ttrace is missing" >&2; exit 1; }
[ -f "$bin/libttrace.so" ] || { echo "gpu-check: $bin/libttrace.so is missing" >&2; exit 1; }
"$ttrace" --version

if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
  py="$GPU_CHECK_PYTHON"
elif [ ! -x "$work/venv/bin/python" ] && python3 -c 'import torch' 2>/dev/null; then
  # The machine's python3 already holds a torch (an image made for GPU work, often offline):
  # check that one, as its users run it.
  py=python3
elif [ ! -x "$work/venv/bin/python" ]; then
  python3 -m venv "$work/venv" || {
    echo "gpu-check: cannot create a venv (Debian/Ubuntu: apt-get install python3-venv)" >&2
    exit 1
  }
  "$work/venv/bin/pip" install -q --upgrade pip
  "$work/venv/bin/pip" install -q torch numpy
fi
py="${py:-$work/venv/bin/python}"
if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu-check: torch $("$py" -c 'import torch; print(torch.__version__)') sees no usable GPU: nothing to check."
  exit 0
fi
"$py" -c 'import torch; print("gpu-check: torch", torch.__version__, "CUDA", torch.version.cuda, "on", torch.cuda.get_device_name(0))'

failed=0
rm -rf "$work/store" "$work/expected" "$work/tensors"
if "$ttrace" run --out "$work/store" -- "$py" scripts/gpu-check/probe.py "$work/expected"; then
  "$ttrace" dump "$work/store" --tensors "$work/tensors" > "$work/records.jsonl"
  "$py" scripts/gpu-check/check.py "$work/expected" "$work/records.jsonl" "$work/tensors" || failed=1
else
  echo "gpu-check: FAIL: probe.py exited non-zero under ttrace run"; failed=1
fi

# The bare preload, as users start it: the first traced process starts the collector
# (ttraced, next to libttrace.so) and the store is final once its manifest says so.
echo "gpu-check: the bare preload: LD_PRELOAD=libttrace.so python probe.py"
rm -rf "$work/bare-store" "$work/bare-expected" "$work/bare-tensors"
if [ ! -x "$bin/ttraced" ]; then
  echo "gpu-check: FAIL: $bin/ttraced is missing (the bare preload starts it)"; failed=1
elif TTRACE_OUT="$work/bare-store" LD_PRELOAD="$bin/libttrace.so" \
  "$py" scripts/gpu-check/probe.py "$work/bare-expected"; then
  for _ in $(seq 300); do
    grep -q '"finalized": *true' "$work/bare-store/manifest.json" 2>/dev/null && break
    sleep 0.1
  done
  "$ttrace" dump "$work/bare-store" --tensors "$work/bare-tensors" > "$work/bare-records.jsonl"
  "$py" scripts/gpu-check/check.py "$work/bare-expected" "$work/bare-records.jsonl" \
    "$work/bare-tensors" || failed=1
else
  echo "gpu-check: FAIL: probe.py exited non-zero under the bare preload"; failed=1
fi

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

# JAX, when this python has it with a GPU backend: its GEMMs reach cuBLASLt through
# dlsym(handle, name) (ttrace's interposed dlsym); each operand and output must be captured.
# XLA's defaults autotune cuBLAS candidates on scratch buffers and often run the GEMM as a
# Triton kernel, which no library hook sees: these flags make its GEMMs cuBLASLt calls.
if "$py" -c 'import sys, jax; sys.exit(0 if jax.default_backend() == "gpu" else 1)' 2>/dev/null; then
  echo "gpu-check: scripts/gpu-check/jax_probe.py (JAX $("$py" -c 'import jax; print(jax.__version__)'))"
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_triton_gemm=false --xla_gpu_autotune_level=0" \
    check_script "$work/jax-store" "$work/jax" single -- "$py" scripts/gpu-check/jax_probe.py "$work/jax"
  # Counts the store's cublasLtMatmul records and its gaps naming ops captured inside a graph.
  jax_counts() {
    "$ttrace" dump "$1" | "$py" -c '
import json, sys
recs = [json.loads(l) for l in sys.stdin]
gemms = sum(r["api"] == "cublasLtMatmul" for r in recs)
nested = sum(r["op"]["family"] == "gap" and "ops captured from a stream" in r["op"].get("detail", "") for r in recs)
print(gemms, nested, sum(r["op"]["family"] == "gap" for r in recs))'
  }
  echo "gpu-check: scripts/gpu-check/jax_step.py: XLA command buffers"
  rm -rf "$work/jax-cb" "$work/jax-eager"
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_triton_gemm=false --xla_gpu_autotune_level=0" \
    "$ttrace" run -q --out "$work/jax-cb" -- "$py" scripts/gpu-check/jax_step.py 5 || failed=1
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer= --xla_gpu_enable_triton_gemm=false --xla_gpu_autotune_level=0" \
    "$ttrace" run -q --out "$work/jax-eager" -- "$py" scripts/gpu-check/jax_step.py 5 || failed=1
  g1=0 n1=0 g2=0 gaps2=0
  read -r g1 n1 _ < <(jax_counts "$work/jax-cb") || true
  read -r g2 _ gaps2 < <(jax_counts "$work/jax-eager") || true
  if [ "$g1" -gt 0 ] || [ "$n1" -gt 0 ]; then
    echo "gpu-check: PASS: command buffers: $g1 matmul records, $n1 gaps naming the ops inside graphs"
  else
    echo "gpu-check: FAIL: command buffers left neither matmul records nor gaps (silent)"; failed=1
  fi
  if [ "$g2" -ge 15 ] && [ "$gaps2" -eq 0 ]; then
    echo "gpu-check: PASS: command buffers off: $g2 matmul records, no gap"
  else
    echo "gpu-check: FAIL: command buffers off: $g2 matmul records (15 expected), $gaps2 gaps"; failed=1
  fi
else
  echo "gpu-check: JAX skipped: this python has no JAX with a GPU backend"
fi

ngpu=$(nvidia-smi -L | grep -c '^GPU ')
torchrun=("$py" -m torch.distributed.run)
echo "gpu-check: tests/torch/ops.py on the GPU"
TORCH_OPS_ON_GPU=1 check_script "$work/ops-store" "$work/ops" single -- \
  "$py" tests/torch/ops.py "$work/ops"
# torch's NVTX ranges (NVTX 3 inside torch) reach the records through NVTX's tool loader.
if "$py" -c '
import json, sys
paths = {tuple(json.loads(l).get("nvtx", [])) for l in open(sys.argv[1])}
want = {("copies",), ("gemms.float32",), ("gemms.float16",), ("gemms.bfloat16",)}
sys.exit(0 if want <= paths else 1)' "$work/ops-store.records.jsonl"; then
  echo "gpu-check: PASS: torch's NVTX ranges are on the records"
else
  echo "gpu-check: FAIL: torch's NVTX ranges (copies, gemms.*) are not on the records"; failed=1
fi
# A range torch starts (torch.cuda.nvtx.range_start, not nested) marks a step under
# `--step-rule nvtx:NAME`; a name no range has leaves step 0 and the store says so.
rm -rf "$work/ops-started" "$work/ops-misspelt"
TORCH_OPS_ON_GPU=1 "$ttrace" run -q --step-rule nvtx:from.float16 --out "$work/ops-started" -- \
  "$py" tests/torch/ops.py "$work/ops-started.out" || failed=1
"$ttrace" dump "$work/ops-started" > "$work/ops-started.records.jsonl" || failed=1
if "$py" -c '
import json, sys
steps = {}
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r.get("nvtx"):
        steps.setdefault(r["nvtx"][0], set()).add(r["step"])
sys.exit(0 if steps.get("copies") == {0} and steps.get("gemms.float16") == {1} else 1)' \
  "$work/ops-started.records.jsonl"; then
  echo "gpu-check: PASS: torch.cuda.nvtx.range_start marks a step"
else
  echo "gpu-check: FAIL: torch.cuda.nvtx.range_start did not mark step 1 at gemms.float16"; failed=1
fi
TORCH_OPS_ON_GPU=1 "$ttrace" run -q --step-rule nvtx:from.float32 --out "$work/ops-misspelt" -- \
  "$py" tests/torch/ops.py "$work/ops-misspelt.out" || failed=1
if "$ttrace" ls "$work/ops-misspelt" | grep -q "WARNING rank 0 .*no NVTX range or mark named .from.float32."; then
  echo "gpu-check: PASS: a step rule that never matched is said by the store"
else
  echo "gpu-check: FAIL: no warning in the store for a step rule that never matched"; failed=1
fi
echo "gpu-check: scripts/gpu-check/graph_probe.py: torch.cuda.graph replays"
check_script "$work/graph-store" "$work/graph" single -- \
  "$py" scripts/gpu-check/graph_probe.py "$work/graph"
if "$py" -c 'import triton' 2>/dev/null; then
  echo "gpu-check: scripts/gpu-check/graph_probe.py compile: torch.compile(mode=\"reduce-overhead\") replays"
  check_script "$work/compiled-store" "$work/compiled" single -- \
    "$py" scripts/gpu-check/graph_probe.py "$work/compiled" compile
else
  echo "gpu-check: torch.compile replays skipped: this python has no Triton"
fi
echo "gpu-check: scripts/gpu-check/graphed_train.py: eager vs graphed training, and a bug in the graph"
for m in eager graphed graphed-bug; do
  rm -rf "$work/gt-$m"
  "$ttrace" run -q --out "$work/gt-$m" -- "$py" scripts/gpu-check/graphed_train.py "$m" || {
    echo "gpu-check: FAIL: graphed_train.py $m exited non-zero under ttrace run"; failed=1; }
done
rc=0; "$ttrace" compare "$work/gt-eager" "$work/gt-graphed" || rc=$?
if [ "$rc" -eq 0 ]; then
  echo "gpu-check: PASS: the graphed training matches the eager one"
else
  echo "gpu-check: FAIL: the graphed training does not match the eager one (exit $rc)"; failed=1
fi
rc=0; "$ttrace" compare "$work/gt-eager" "$work/gt-graphed-bug" > "$work/gt-bug.txt" || rc=$?
if [ "$rc" -eq 1 ] && grep -q 'step 3' "$work/gt-bug.txt"; then
  echo "gpu-check: PASS: the loss doubled inside the graph is found in the first replayed step"
else
  cat "$work/gt-bug.txt"
  echo "gpu-check: FAIL: compare exited $rc on the bug inside the graph (1 at step 3 expected)"; failed=1
fi
# The graphed step's perturbed twin: the perturbation is recorded into the graph (a host node
# between copies to pinned memory and back), so every replay must be perturbed; compare must
# take its drift as a measurement (no "perturbed reference left ... GEMM outputs" warning).
rm -rf "$work/gt-graphed-perturbed"
TTRACE_LOG=info "$ttrace" run -q --perturb --out "$work/gt-graphed-perturbed" -- \
  "$py" scripts/gpu-check/graphed_train.py graphed 2> "$work/gt-perturb.err" || {
  cat "$work/gt-perturb.err"; echo "gpu-check: FAIL: graphed_train.py graphed exited non-zero under --perturb"; failed=1; }
grep 'perturbation (seed' "$work/gt-perturb.err" || true
rc=0; "$ttrace" compare "$work/gt-graphed" "$work/gt-eager" --perturbed "$work/gt-graphed-perturbed" \
  > "$work/gt-twin.txt" 2>&1 || rc=$?
if [ "$rc" -eq 0 ] && grep -q 'of them by replays of the' "$work/gt-perturb.err" &&
  ! grep -q 'perturbed reference left' "$work/gt-twin.txt"; then
  echo "gpu-check: PASS: the graphed twin is perturbed at every replay and compare measures its drift"
else
  cat "$work/gt-twin.txt"
  echo "gpu-check: FAIL: the graphed twin (compare exit $rc; its exit log and the report above)"; failed=1
fi
if [ "$ngpu" -ge 4 ]; then
  echo "gpu-check: tests/torch/dist.py, torchrun --nproc-per-node 4"
  check_script "$work/dist-store" "$work/dist" per-rank -- \
    "${torchrun[@]}" --standalone --nproc-per-node 4 tests/torch/dist.py "$work/dist"
else
  echo "gpu-check: tests/torch/dist.py skipped: it needs 4 GPUs, this machine has $ngpu"
fi

echo "gpu-check: tests/torch/megatron.py (fp32): reference, perturbed reference"
m=(tests/torch/megatron.py --precision fp32 --micro-batches 2)
rm -rf "$work/m-ref" "$work/m-ref-p" "$work/m-tp2dp2" "$work/m-bug"
"$ttrace" run --out "$work/m-ref" -- "$py" "${m[@]}" || failed=1
"$ttrace" run --out "$work/m-ref-p" --perturb -- "$py" "${m[@]}" || failed=1
if [ "$ngpu" -ge 4 ]; then
  tr=("${torchrun[@]}" --standalone --nproc-per-node 4)
  "$ttrace" run --out "$work/m-tp2dp2" -- "${tr[@]}" "${m[@]}" || failed=1
  "$ttrace" run --out "$work/m-bug" -- "${tr[@]}" "${m[@]}" --bug neighbour-shard || failed=1
  rc=0; "$ttrace" compare "$work/m-ref" "$work/m-tp2dp2" --perturbed "$work/m-ref-p" || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "gpu-check: PASS: the bug-free tp=2 dp=2 run matches the reference"
  elif [ "$rc" -eq 5 ]; then
    echo "gpu-check: FAIL: the bug-free tp=2 dp=2 run matches, but a capture lost data (exit 5)"; failed=1
  else
    echo "gpu-check: FAIL: the bug-free tp=2 dp=2 run does not match (exit $rc)"; failed=1
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
  rc=0; "$ttrace" compare "$work/m-ref" "$work/m-ref-p" || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "gpu-check: PASS: the reference matches its perturbed twin"
  elif [ "$rc" -eq 5 ]; then
    echo "gpu-check: FAIL: the reference matches its perturbed twin, but a capture lost data (exit 5)"; failed=1
  else
    echo "gpu-check: FAIL: the reference does not match its perturbed twin (exit $rc)"; failed=1
  fi
  echo "gpu-check: megatron.py tp=2 dp=2 skipped: it needs 4 GPUs, this machine has $ngpu"
fi
exit "$failed"
