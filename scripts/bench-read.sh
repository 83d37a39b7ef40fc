#!/usr/bin/env bash
# Reading speed: `ttrace export` of a store of about 1 GiB on disk against `zstd -d` of the same
# compressed bytes (every zstd blob of the store, concatenated into one .zst stream).
#
#   scripts/bench-read.sh [MIB]            (default 1024; env: RUNS=5, JOBS=, OUT=/dev/shm/...)
#
# Both write their output to the same place (OUT: tmpfs when there is one, so the disk's
# write-back does not decide the race); each is run RUNS times on a warm page cache and the
# best time counts. The goal: export at no less than half the speed of `zstd -d`.
set -euo pipefail
cd "$(dirname "$0")/.."

MIB="${1:-1024}"
RUNS="${RUNS:-5}"
TARGET="${CARGO_TARGET_DIR:-target}"
WORK="$TARGET/bench-read"

if ! command -v zstd >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq zstd
fi

# Two builds: target selection flags (--example) would leave the ttrace binary out.
cargo build --release -q -p ttrace-cli --bin ttrace
cargo build --release -q -p ttrace-format --example synth_store
TTRACE="$TARGET/release/ttrace"
SYNTH="$TARGET/release/examples/synth_store"

STORE="$WORK/store-$MIB"
if [ ! -f "$STORE/.complete" ]; then
  rm -rf "$STORE"
  echo "writing a synthetic store of $MIB MiB (BF16/F32 GEMM operands, zstd level 1)..."
  "$SYNTH" write "$STORE" "$MIB" 4 4 1
  touch "$STORE/.complete"
fi
ZST="$WORK/blobs-$MIB.zst"
[ -f "$ZST" ] || "$SYNTH" zst "$STORE" "$ZST"

if [ -z "${OUT:-}" ]; then
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then OUT="/dev/shm/ttrace-bench-read-$$"; else OUT="$WORK/out"; fi
fi
trap 'rm -rf "$OUT"' EXIT

# Warm the page cache: both read the same bytes from memory.
cat "$STORE"/rank*/*.seg "$ZST" >/dev/null

# best SECONDS of RUNS runs of a command (the output directory emptied before each)
best() {
  local best=""
  for _ in $(seq "$RUNS"); do
    rm -rf "$OUT"; mkdir -p "$OUT"
    local t0 t1
    t0=$(date +%s.%N)
    if ! "$@" >/dev/null 2>"$WORK/last.err"; then
      echo "failed: $*" >&2
      cat "$WORK/last.err" >&2
      exit 1
    fi
    t1=$(date +%s.%N)
    local dt
    dt=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", b - a }')
    if [ -z "$best" ] || awk -v d="$dt" -v b="$best" 'BEGIN { exit !(d < b) }'; then best=$dt; fi
  done
  echo "$best"
}

stored=$(stat -c %s "$ZST")
raw=$(du -sb "$STORE" | cut -f1)
echo "store: $STORE ($((raw >> 20)) MiB on disk), zstd stream: $((stored >> 20)) MiB"

t_zstd_file=$(best zstd -q -d -f "$ZST" -o "$OUT/blobs.raw")
t_zstd_null=$(best sh -c "zstd -q -d -c '$ZST' >/dev/null")
t_export=$(best "$TTRACE" export "$STORE" --format safetensors --out "$OUT/x" ${JOBS:+--jobs "$JOBS"})
t_export1=$(best "$TTRACE" export "$STORE" --format safetensors --out "$OUT/x" --jobs 1)

rate() { awk -v s="$stored" -v t="$1" 'BEGIN { printf "%.0f", s / t / 1e6 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
printf '%-42s %7.3f s  %5s MB/s compressed in\n' "zstd -d (to a file in OUT)" "$t_zstd_file" "$(rate "$t_zstd_file")"
printf '%-42s %7.3f s  %5s MB/s\n' "zstd -d (to /dev/null)" "$t_zstd_null" "$(rate "$t_zstd_null")"
printf '%-42s %7.3f s  %5s MB/s  = %s x zstd -d to a file, %s x to /dev/null\n' "ttrace export safetensors (${JOBS:-all} jobs)" "$t_export" "$(rate "$t_export")" "$(ratio "$t_zstd_file" "$t_export")" "$(ratio "$t_zstd_null" "$t_export")"
printf '%-42s %7.3f s  %5s MB/s  = %s x zstd -d to a file, %s x to /dev/null\n' "ttrace export safetensors (1 job)" "$t_export1" "$(rate "$t_export1")" "$(ratio "$t_zstd_file" "$t_export1")" "$(ratio "$t_zstd_null" "$t_export1")"
if awk -v e="$t_export" -v z="$t_zstd_file" 'BEGIN { exit !(e <= 2 * z) }'; then
  echo "PASS: export runs at no less than half the speed of zstd -d"
else
  echo "FAIL: export is slower than half the speed of zstd -d"
  exit 1
fi
