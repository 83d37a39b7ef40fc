#!/usr/bin/env bash
# README's main command: ttrace end to end on a machine without a GPU. Builds everything, then,
# on the simulated CUDA stack (target/release/sim):
#   1. traces the fixture trainer's world-size-1 reference run, and the same run with
#      round-off-sized noise injected (`ttrace run --perturb`: per-tensor tolerances);
#   2. traces a tp=2, dp=2, pp=2 run of the same training with a silent bug injected (one
#      layer's row-parallel attention projection skips its TP reduction: the loss stays within
#      a fraction of a percent of the correct one), with the bare `LD_PRELOAD=libttrace.so`
#      (the user's collector starts by itself and writes the job's store);
#   3. lists what was captured and shows an op table;
#   4. runs `ttrace check` on the distributed run (no reference needed);
#   5. runs `ttrace compare` of the distributed run against the reference: the verdict names
#      the first tensor beyond round-off, where the bug lies, and writes JSON and HTML reports.
# Output goes to ./ttrace-demo (removed and rewritten on every run).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --workspace --release
T=target/release
export LD_LIBRARY_PATH="$PWD/$T/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
out=ttrace-demo
rm -rf "$out"
mkdir -p "$out"

model=(--precision bf16 --micro-batches 2 --steps 3)
layout=(--tp 2 --dp 2 --pp 2)
bug=tp-row-parallel-no-reduce

echo "== 1. reference run (world size 1), traced; and a perturbed reference for tolerances"
"$T/ttrace" run --out "$out/reference" -- "$T/trainer" "${model[@]}"
"$T/ttrace" run --perturb --out "$out/reference-perturbed" -- "$T/trainer" "${model[@]}"

echo
echo "== 2. tp=2 dp=2 pp=2, bug '$bug' injected, traced with the bare preload"
"$T/trainer" --explain-bug "$bug" "${layout[@]}"
echo "LD_PRELOAD=$T/libttrace.so TTRACE_OUT=$out/distributed simrun --nproc-per-node 8 -- trainer ..."
LD_PRELOAD="$PWD/$T/libttrace.so" TTRACE_OUT="$out/distributed" \
  "$T/simrun" --nproc-per-node 8 -- "$T/trainer" "${model[@]}" "${layout[@]}" --bug "$bug"
# The collector finalises the job's store once every rank has left.
for _ in $(seq 100); do
  grep -q '"finalized": true' "$out/distributed/manifest.json" 2>/dev/null && break
  sleep 0.1
done

echo
echo "== 3. what was captured"
"$T/ttrace" ls "$out/distributed"
"$T/ttrace" show "$out/distributed" --rank 0 --step 0 | head -25

if "$T/ttrace" check --help >/dev/null 2>&1; then
  echo
  echo "== 4. ttrace check (no reference)"
  set +e
  "$T/ttrace" check "$out/distributed"
  code=$?
  set -e
  echo "ttrace check exited $code (0: nothing found, 1: findings, 2: error, 5: nothing found but the capture lost data)"
fi

echo
echo "== 5. ttrace compare (against the reference)"
set +e
"$T/ttrace" compare "$out/reference" "$out/distributed" --perturbed "$out/reference-perturbed" \
  --json "$out/compare.json" --html "$out/compare.html"
code=$?
set -e
echo "ttrace compare exited $code (0: match, 1: divergence, 2: error, 5: a match of a capture that lost data); reports: $out/compare.json, $out/compare.html"
