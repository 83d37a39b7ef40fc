#!/usr/bin/env bash
# What remembering the host bytes of small uploads costs (intercept/src/uploads.rs: the
# pointer arrays of batched GEMMs are found there). N synchronous 1 KiB host-to-device copies
# on the simulated stack, ns per copy as the program times them (best of RUNS), in one run:
#   plain          untraced
#   pass-through   traced with --apis nccl (copy hooks pass straight through)
#   remembered     traced with --apis gemm (copies not captured, their bytes remembered)
#   captured       traced with every API (each copy also snapshotted and stored)
# and the ratios of the traced ones to plain. The machine may be shared: the load average is
# printed next to the numbers.
#
#   scripts/bench-uploads.sh             # 20000 copies of 1024 bytes, best of 3
#   N=50000 BYTES=65536 RUNS=5 scripts/bench-uploads.sh
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
n="${N:-20000}"
bytes="${BYTES:-1024}"
runs="${RUNS:-3}"
cargo build --release -q --workspace
export LD_LIBRARY_PATH="$target/release/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
probe="$target/release/sim-probe"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

best() { # best ns per copy of $runs runs of "$@"
  local b=""
  for _ in $(seq "$runs"); do
    rm -rf "$work/run"
    local ns
    ns=$("$@" 2>/dev/null | awk '/^uploads /{print $4}')
    if [ -z "$b" ] || [ "$ns" -lt "$b" ]; then b="$ns"; fi
  done
  echo "$b"
}

traced() { "$target/release/ttrace" run -q --out "$work/run" "$@" -- "$probe" traced uploads "$n" "$bytes"; }

plain=$(best "$probe" traced uploads "$n" "$bytes")
pass=$(best traced --apis nccl)
memo=$(best traced --apis gemm)
full=$(best traced)
ratio() { awk -v a="$1" -v b="$plain" 'BEGIN{printf "%.2fx", a / b}'; }
echo "uploads: $n copies of $bytes bytes, ns per copy (best of $runs), load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '  %-13s %8s\n' plain "$plain"
printf '  %-13s %8s  %s\n' pass-through "$pass" "$(ratio "$pass")"
printf '  %-13s %8s  %s\n' remembered "$memo" "$(ratio "$memo")"
printf '  %-13s %8s  %s\n' captured "$full" "$(ratio "$full")"
