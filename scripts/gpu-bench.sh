#!/usr/bin/env bash
# What tracing costs a training step on a real GPU, as ratios against the untraced step time
# measured in the same script (scripts/gpu-check/overhead.py: a bf16 MLP, forward, backward,
# SGD; its median step time after the first):
#   1. hidden 2048, 2048 tokens (~280 MB captured a step): untraced and everything traced
#      (what `--steps` saves, and that it keeps the selected step exact, is
#      scripts/gpu-check/steps-cost.sh);
#   2. hidden 4096, 4096 tokens (~1.1 GB a step, over the default ring): the default, then one
#      knob at a time (zstd level 1, 16 compression threads, a 1 GiB ring, no dedup), to show
#      which stage bounds the capture rate.
# Each traced run prints the store summary (raw and stored bytes, dedup). Exits 0 when there
# is no GPU (saying so). Binaries: GPU_CHECK_BIN_DIR as in scripts/gpu-check.sh, else cargo.
#   3. with GPU_BENCH_BASE_BIN_DIR=DIR (another build's ttrace, ttraced, libttrace.so): the
#      hidden-4096 model traced by that build and by this one, alternating, on the same GPU,
#      so that a change of the capture path is measured against what it replaces.
# GPU_BENCH_ONLY=3 runs only section 3 (and the untraced baseline it needs).
#
#   scripts/gpu-bench.sh
#   GPU_CHECK_BIN_DIR=.gpubin scripts/gpu-bench.sh      # on an offline GPU box
#   GPU_CHECK_BIN_DIR=.gpubin GPU_BENCH_BASE_BIN_DIR=.gpubin-old GPU_BENCH_ONLY=3 scripts/gpu-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "gpu-bench: no GPU here: nothing to measure."
  exit 0
fi
if [ -n "${GPU_CHECK_BIN_DIR:-}" ]; then
  bin="$(cd "$GPU_CHECK_BIN_DIR" && pwd)"
else
  cargo build --release -q -p ttrace-cli -p ttrace-intercept
  bin="${CARGO_TARGET_DIR:-target}/release"
fi
py="${GPU_CHECK_PYTHON:-python3}"
work="$(mktemp -d -t ttrace-gpu-bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT
export PYTHONUNBUFFERED=1

# Median later-step time in ms of overhead.py with ARGS, untraced or under `ttrace run OPTS`.
step_ms() { sed -n 's/.*median later step \([0-9.]*\) ms.*/\1/p'; }
plain() { "$py" scripts/gpu-check/overhead.py "$@" | step_ms; }
row() { # LABEL BASE_MS MS
  awk -v l="$1" -v b="$2" -v t="$3" 'BEGIN { printf "  %-34s %9.2f ms  %7.1fx\n", l, t, t / b }'
}
run_case() { # LABEL BASE_MS "OPTS" MODEL_ARGS...   (the build in $bin)
  run_with "$bin" "$@"
}
run_with() { # BIN_DIR LABEL BASE_MS "OPTS" MODEL_ARGS...
  local dir="$1" label="$2" base="$3" opts="$4"; shift 4
  rm -rf "$work/store"
  local out ms
  # shellcheck disable=SC2086 # OPTS is a list of options
  out=$("$dir/ttrace" run --out "$work/store" $opts -- "$py" scripts/gpu-check/overhead.py "$@" 2>&1)
  ms=$(echo "$out" | step_ms)
  row "$label" "$base" "$ms"
  echo "$out" | grep -E '^  (ranks|tensors|dedup|time) ' | sed 's/^/      /'
}

"$py" -c 'import torch; print("gpu-bench: torch", torch.__version__, "on", torch.cuda.get_device_name(0))'
if [ "${GPU_BENCH_ONLY:-}" != 3 ]; then
echo "== 1. hidden 2048, 2048 tokens, 4 layers, 8 steps"
m1=(--hidden 2048 --tokens 2048 --steps 8)
base=$(plain "${m1[@]}")
row "untraced" "$base" "$base"
run_case "traced, every step" "$base" "" "${m1[@]}"

echo "== 2. hidden 4096, 4096 tokens, 4 layers, 4 steps"
m2=(--hidden 4096 --tokens 4096 --steps 4)
base=$(plain "${m2[@]}")
row "untraced" "$base" "$base"
run_case "traced (defaults)" "$base" "" "${m2[@]}"
run_case "traced, --level 1" "$base" "--level 1" "${m2[@]}"
run_case "traced, --threads 16" "$base" "--threads 16" "${m2[@]}"
run_case "traced, --ring-bytes 1G" "$base" "--ring-bytes 1G" "${m2[@]}"
run_case "traced, --no-dedup" "$base" "--no-dedup" "${m2[@]}"
fi

if [ -n "${GPU_BENCH_BASE_BIN_DIR:-}" ]; then
  other="$(cd "$GPU_BENCH_BASE_BIN_DIR" && pwd)"
  echo "== 3. this build ($bin) against another ($other), hidden 4096, 4096 tokens, 4 steps"
  m3=(--hidden 4096 --tokens 4096 --steps 4)
  base=$(plain "${m3[@]}")
  row "untraced" "$base" "$base"
  for round in 1 2; do
    run_with "$other" "other build, defaults ($round)" "$base" "" "${m3[@]}"
    run_case "this build, defaults ($round)" "$base" "" "${m3[@]}"
  done
  run_with "$other" "other build, --ring-bytes 1G" "$base" "--ring-bytes 1G" "${m3[@]}"
  run_case "this build, --ring-bytes 1G" "$base" "--ring-bytes 1G" "${m3[@]}"
fi
