#!/usr/bin/env bash
# The compare benchmark, on the simulated CUDA stack, as ratios against baselines run
# in the same script. For each configuration of the fixture trainer:
#   1. produces the demo's three runs, timing each: the world-size-1 reference, a perturbed
#      reference (`ttrace run --perturb`) and a tp=2 dp=2 pp=2 run with a silent bug
#      (tp-row-parallel-no-reduce);
#   2. times `ttrace compare REF RUN --perturbed PREF --memory $MEMORY --json report.json`
#      (median of RUNS, peak RSS the largest of them) and takes the bytes it compared from
#      the report's stats.bytes_compared;
#   3. baseline "read": the same three stores read and decompressed, every captured tensor
#      CRC-checked, nothing else (compare/examples/read_all.rs; on every core, like compare);
#   4. baseline "numpy": the stores exported (`ttrace export --format npy --widen`, timed
#      apart), then numpy.load + numpy.allclose over every pair of tensors a user could line up
#      by hand (same step, NVTX path, API, role and occurrence, equal shapes) in
#      scripts/bench_compare_numpy.py; it says how many of the run's tensors it could pair.
#      numpy comes from a venv in target/bench-venv, made on first use (pip install numpy
#      safetensors); without a registry this baseline is skipped with a message.
#   5. the same three runs over LONG_STEPS (default 10) steps instead of 3, compared the same
#      way: how the time grows with the steps, and the peak RSS then.
# The bars, each printed as met or NOT met: compare >= 0.5x the read+decompress
# rate; >= 2x numpy's; LONG_STEPS steps cost <= 1.1 x (LONG_STEPS/3) the time of 3; peak RSS
# <= --memory; and comparing the demo's runs takes less time than producing them.
#
#   scripts/bench-compare.sh                      # the demo's size, then a bigger model
#   scripts/bench-compare.sh --hidden 128 --steps 5   # one configuration: the demo's + these
#                                                      # trainer options (trainer --help)
#
# Environment: BASELINE=PATH another build's ttrace, timed on the same stores in the same run
# (compare's time and GB/s of both, for before/after numbers on a loaded machine);
# RUNS (default 3) timed runs per measurement; MEMORY (default 1G) compare's
# --memory; LONG_STEPS (default 10; 0 skips step 5); KEEP=1 keeps the stores and
# exports under target/bench-compare. The machine is shared: the script prints the load
# average; wall-clock numbers mean little when it is well above the number of cores.
set -euo pipefail
cd "$(dirname "$0")/.."
# CARGO_TARGET_DIR relative to the repository, or absolute.
target="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
T="$target/release"
RUNS="${RUNS:-3}"
MEMORY="${MEMORY:-1G}"
LONG_STEPS="${LONG_STEPS:-10}"
work="$target/bench-compare"

cargo build --release -q --workspace
# Separate build: --example would leave the workspace's binaries out.
cargo build --release -q -p ttrace-compare --example read_all
export LD_LIBRARY_PATH="$T/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

demo=(--precision bf16 --micro-batches 2 --steps 3)
layout=(--tp 2 --dp 2 --pp 2)
bug=tp-row-parallel-no-reduce
if [ $# -gt 0 ]; then
  configs=("$*")
else
  configs=("" "--hidden 256 --layers 8 --ffn 512")
fi

# numpy baseline: a venv with numpy and safetensors, made once.
venv="$target/bench-venv"
py=""
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import numpy, safetensors' 2>/dev/null; then
  py="$venv/bin/python"
else
  echo "making $venv (pip install numpy safetensors) for the numpy baseline..."
  if python3 -m venv "$venv" >/dev/null 2>&1 &&
    "$venv/bin/pip" install -q numpy safetensors >"$target/bench-venv.log" 2>&1; then
    py="$venv/bin/python"
  else
    echo "bench-compare: cannot make the numpy venv (no python3-venv, or pip cannot reach the" >&2
    echo "  registry: see $target/bench-venv.log); the numpy baseline is skipped" >&2
  fi
fi

now() { date +%s.%N; }
# seconds since $1
since() { awk -v t0="$1" -v t1="$(now)" 'BEGIN { printf "%.3f", t1 - t0 }'; }
# median of the numbers given
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# the value after KEY in the line on stdin
field() { awk -v k="$1" '{ for (i = 1; i < NF; i++) if ($i == k) { print $(i + 1); exit } }'; }

# the memory budget in KiB (as /usr/bin/time reports peak RSS)
budget_kib=$(awk -v m="$MEMORY" 'BEGIN {
  u = toupper(substr(m, length(m))); v = m + 0
  f = (u == "K") ? 1 : (u == "M") ? 1024 : (u == "G") ? 1048576 : (u == "T") ? 1073741824 : 1 / 1024
  printf "%d", v * f }')

# produce DIR STEPS: the reference, the perturbed reference and the distributed run with the
# bug, over STEPS steps; sets p_ref, p_pert, p_run (seconds)
produce() {
  local dir=$1 steps=$2 t0
  mkdir -p "$dir"
  t0=$(now)
  "$T/ttrace" run -q --out "$dir/ref" -- "$T/trainer" "${model[@]}" --steps "$steps" >/dev/null
  p_ref=$(since "$t0")
  t0=$(now)
  "$T/ttrace" run -q --perturb --out "$dir/ref-perturbed" -- \
    "$T/trainer" "${model[@]}" --steps "$steps" >/dev/null
  p_pert=$(since "$t0")
  t0=$(now)
  "$T/ttrace" run -q --out "$dir/run" -- "$T/simrun" --nproc-per-node 8 -- \
    "$T/trainer" "${model[@]}" --steps "$steps" "${layout[@]}" --bug "$bug" >/dev/null
  p_run=$(since "$t0")
  cat "$dir"/*/rank*/*.seg >/dev/null # page cache warm for everyone
}

# time_compare DIR [soft]: RUNS timed comparisons; sets c_s (median seconds) and c_rss
# (largest peak RSS, KiB); DIR/report.json is the last report. When compare fails (exit 2):
# exits, or with soft sets c_s to "" and c_err to its message and returns.
time_compare() {
  local dir=$1 soft=${2:-} t0 code times=() rss=0 r
  c_err=""
  for _ in $(seq "$RUNS"); do
    t0=$(now)
    code=0
    /usr/bin/time -o "$dir/rss" -f '%M' "${ttrace_bin:-$T/ttrace}" compare "$dir/ref" "$dir/run" \
      --perturbed "$dir/ref-perturbed" --memory "$MEMORY" --json "$dir/report.json" \
      >/dev/null 2>"$dir/compare.err" || code=$?
    times+=("$(since "$t0")")
    if [ "$code" -gt 1 ]; then
      cat "$dir/compare.err" >&2
      if [ -n "$soft" ]; then
        c_s="" c_rss=0 c_err=$(head -n 1 "$dir/compare.err")
        return
      fi
      echo "bench-compare: ttrace compare failed (exit $code)" >&2
      exit 1
    fi
    r=$(tail -n 1 "$dir/rss")
    [ "$r" -gt "$rss" ] && rss=$r
  done
  c_s=$(median "${times[@]}")
  c_rss=$rss
}

summary=()
for config in "${configs[@]}"; do
  # shellcheck disable=SC2206 # the configuration is a list of trainer options
  extra=($config)
  model=("${demo[@]}" "${extra[@]}")
  echo
  echo "== ${model[*]} (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
  rm -rf "$work"
  mkdir -p "$work"

  produce "$work" 3
  stores=("$work/ref" "$work/ref-perturbed" "$work/run")
  time_compare "$work"
  read -r c_bytes c_tensors verdict < <(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
print(r["stats"]["bytes_compared"], r["stats"]["tensors_compared"], r["verdict"])' "$work/report.json")

  b_s=""
  if [ -n "${BASELINE:-}" ]; then
    saved=("$c_s" "$c_rss")
    cp "$work/report.json" "$work/report-this.json"
    ttrace_bin=$BASELINE time_compare "$work"
    b_s=$c_s b_rss=$c_rss
    c_s=${saved[0]} c_rss=${saved[1]}
    b_same=$(python3 -c '
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for r in (a, b):
    r["stats"].pop("elapsed_s", None)
print("the same report" if a == b else "a DIFFERENT report")' "$work/report-this.json" "$work/report.json")
  fi

  times=()
  for _ in $(seq "$RUNS"); do
    t0=$(now)
    line=$("$T/examples/read_all" "${stores[@]}" | grep '^total:')
    times+=("$(since "$t0")")
  done
  r_s=$(median "${times[@]}")
  r_bytes=$(field raw_bytes <<<"$line")
  r_stored=$(field stored_bytes <<<"$line")

  n_s="" n_bytes="" n_line=""
  if [ -n "$py" ]; then
    t0=$(now)
    for s in ref ref-perturbed run; do
      "$T/ttrace" export "$work/$s" --format npy --widen --out "$work/npy-$s" >/dev/null
    done
    e_s=$(since "$t0")
    # The exports' GBs are still being written back: numpy is timed after, not during.
    sync
    times=()
    for _ in $(seq "$RUNS"); do
      out=$("$py" scripts/bench_compare_numpy.py "$work/npy-ref" "$work/npy-run" "$work/npy-ref-perturbed")
      n_line=$(grep '^numpy:' <<<"$out")
      times+=("$(field seconds <<<"$n_line")")
    done
    n_s=$(median "${times[@]}")
    n_bytes=$(field trace_bytes <<<"$n_line")
  fi

  l_s="" l_rss=""
  if [ "$LONG_STEPS" -gt 0 ]; then
    saved=("$p_ref" "$p_pert" "$p_run" "$c_s" "$c_rss")
    produce "$work/long" "$LONG_STEPS"
    # A capture the comparison refuses (exit 2) is reported, not fatal: the other bars stand.
    time_compare "$work/long" soft
    l_s=$c_s l_rss=$c_rss l_err=$c_err
    l_verdict=""
    if [ -n "$l_s" ]; then
      l_verdict=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["verdict"])' \
        "$work/long/report.json")
    fi
    p_ref=${saved[0]} p_pert=${saved[1]} p_run=${saved[2]} c_s=${saved[3]} c_rss=${saved[4]}
  fi

  awk -v pr="$p_ref" -v pp="$p_pert" -v pd="$p_run" -v c="$c_s" -v cb="$c_bytes" \
    -v ct="$c_tensors" -v v="$verdict" -v r="$r_s" -v rb="$r_bytes" -v rs="$r_stored" \
    -v n="$n_s" -v nb="$n_bytes" -v e="${e_s:-}" -v runs="$RUNS" -v rss="$c_rss" \
    -v budget="$budget_kib" -v mem="$MEMORY" -v ls="$l_s" -v lrss="$l_rss" -v lsteps="$LONG_STEPS" \
    -v lv="${l_verdict:-}" -v lerr="${l_err:-}" -v bs="$b_s" -v brss="${b_rss:-0}" \
    -v bsame="${b_same:-}" -v bpath="${BASELINE:-}" 'BEGIN {
    prod = pr + pp + pd
    printf "  production   reference %.2f s + perturbed reference %.2f s + distributed %.2f s = %.2f s\n", pr, pp, pd, prod
    printf "  compare      %.2f s (median of %d): %s, %d tensors, %.1f MB compared: %.3f GB/s\n", c, runs, v, ct, cb / 1e6, cb / c / 1e9
    printf "  peak RSS     %.0f MB (--memory %s = %.0f MB): %s\n", rss / 1024, mem, budget / 1024, (rss <= budget) ? "met" : "NOT met"
    if (bs != "")
      printf "  baseline     %s: %.2f s (median of %d), %.3f GB/s, peak RSS %.0f MB: this build takes %.2fx its time, %s\n", bpath, bs, runs, cb / bs / 1e9, brss / 1024, c / bs, bsame
    printf "  bar          compare/production = %.2f: %s\n", c / prod, (c < prod) ? "met (< 1)" : "NOT met (>= 1)"
    printf "  read only    %.1f MB decoded (%.1f MB stored) in %.3f s: %.3f GB/s; compare takes %.1fx its time, runs at %.3fx its GB/s\n", rb / 1e6, rs / 1e6, r, rb / r / 1e9, c / r, (cb / c) / (rb / r)
    if (n != "")
      printf "  numpy        %.1f MB (trace bytes) loaded + allclose in %.3f s: %.3f GB/s; compare runs at %.3fx its GB/s (npy export of the stores, not counted: %.2f s)\n", nb / 1e6, n, nb / n / 1e9, (cb / c) / (nb / n), e
    else
      printf "  numpy        skipped (no venv)\n"
    if (n != "")
      printf "  bar          compare >= 2x numpy: %.2fx: %s\n", (cb / c) / (nb / n), ((cb / c) / (nb / n) >= 2) ? "met" : "NOT met"
    printf "  bar          compare >= 0.5x read+decompress: %.2fx: %s\n", (cb / c) / (rb / r), ((cb / c) / (rb / r) >= 0.5) ? "met" : "NOT met"
    if (lerr != "")
      printf "  %d steps     NOT measured: compare refused the %d-step stores: %s\n", lsteps, lsteps, lerr
    if (ls != "") {
      bar = 1.1 * lsteps / 3
      printf "  %d steps     %.2f s (%s), %.2fx the time of 3 steps (bar <= %.2f: %s); peak RSS %.0f MB: %s\n", lsteps, ls, lv, ls / c, bar, (ls / c <= bar) ? "met" : "NOT met", lrss / 1024, (lrss <= budget) ? "met" : "NOT met"
    }
  }'
  if [ -n "$n_line" ]; then
    grep -v '^numpy:' <<<"$out" | tail -n +2 | sed 's/^ */               /'
  fi
  summary+=("$(awk -v name="${config:-demo}" -v pr="$p_ref" -v pp="$p_pert" -v pd="$p_run" \
    -v c="$c_s" -v cb="$c_bytes" -v r="$r_s" -v rb="$r_bytes" -v n="$n_s" -v nb="$n_bytes" 'BEGIN {
    prod = pr + pp + pd
    ng = (n != "") ? sprintf("%.3f", nb / n / 1e9) : "-"
    printf "%-34s %5.2f %5.2f %5.2f %6.2f %7.2f %7.2f %8.1f %8.3f %8.3f %8s %8.1f\n", name, pr, pp, pd, prod, c, c / prod, cb / 1e6, cb / c / 1e9, rb / r / 1e9, ng, c / r }')")
  [ "${KEEP:-0}" = 1 ] || rm -rf "$work"
done

echo
echo "== summary (seconds; GB/s of trace bytes: compare's stats.bytes_compared, read's decoded bytes, numpy's loaded tensors)"
printf "%-34s %5s %5s %5s %6s %7s %7s %8s %8s %8s %8s %8s\n" configuration ref pert dist prod compare cmp/prd "MB cmp" "cmp GB/s" "rd GB/s" "np GB/s" cmp/read
printf '%s\n' "${summary[@]}"
