#!/usr/bin/env bash
# Tensors larger than the ring (docs/capture.md), with default settings (256 MiB ring, 64 GiB
# --max-tensor-bytes): a 1 GiB host-to-device copy (then its 1 GiB copy back) and a 1 GiB
# in-place all-reduce on 2 ranks, on the simulated stack, untraced and traced. Prints wall
# time of each (best of N), the ratio, and what the store holds (records, gaps, fsck). The
# traced bytes are checked by the readers (every tensor's CRC-32, by `ttrace fsck`).
#
#   scripts/bench-big.sh                 # 1 GiB, best of 2
#   BYTES=268435456 RUNS=3 scripts/bench-big.sh
#
# The store goes to the temp directory (TMPDIR, a real disk here) and is removed afterwards.
# The machine may be shared: the load average is printed next to the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
bytes="${BYTES:-1073741824}"
runs="${RUNS:-2}"
cargo build --release -q --workspace
export LD_LIBRARY_PATH="$target/release/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

best() { # best wall time of $runs runs of "$@", in seconds
  local b=""
  for _ in $(seq "$runs"); do
    rm -rf "$work/run"
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null
    t1=$(date +%s.%N)
    b=$(awk -v a="$b" -v t0="$t0" -v t1="$t1" 'BEGIN { d = t1 - t0; if (a == "" || d < a) print d; else print a }')
  done
  echo "$b"
}

report() { # name plain traced
  awk -v n="$1" -v p="$2" -v t="$3" 'BEGIN {
    printf "  %-28s untraced %7.2f s   traced %7.2f s   ratio %.2fx\n", n, p, t, t / p }'
  "$target/release/ttrace" ls "$work/run" | awk '/^rank/ { on = 1; next } on && NF == 0 { exit } on'
  if "$target/release/ttrace" fsck "$work/run" >/dev/null 2>&1; then
    echo "  fsck: clean (every tensor's bytes match its CRC-32)"
  else
    echo "  fsck: NOT CLEAN"; "$target/release/ttrace" fsck "$work/run" || true
  fi
}

echo "== $((bytes >> 20)) MiB tensors through a 256 MiB ring (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
copy=("$target/release/sim-probe" big copy "$bytes")
plain=$(best "${copy[@]}")
traced=$(best "$target/release/ttrace" run -q --out "$work/run" -- "${copy[@]}")
report "H2D copy + D2H copy back" "$plain" "$traced"

ar=("$target/release/simrun" --nproc-per-node 2 -- "$target/release/sim-probe" big allreduce "$bytes")
plain=$(best "${ar[@]}")
traced=$(best "$target/release/ttrace" run -q --out "$work/run" -- "${ar[@]}")
report "in-place all-reduce, 2 ranks" "$plain" "$traced"
