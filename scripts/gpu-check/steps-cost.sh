#!/usr/bin/env bash
# What `--steps` saves on a real GPU (docs/capture.md, "What filtering saves"), and that it
# changes nothing it keeps. scripts/gpu-check/overhead.py (a bf16 MLP, one batch trained on
# repeatedly) runs untraced, traced with every step, with --steps 0 (capture stops after the
# first step) and with --steps outside the run; each line gives the median later step time (and
# that of the last half of the steps) and the job's CPU; then untraced and outside the run again
# over 60 steps, past what the snapshot ring absorbs. Then step 5 of a `--steps 5` capture must
# equal step 5 of a full capture:
# every record's step, seq, op, tensors and CRC-32s (addresses, threads and times aside).
#
#   scripts/gpu-check/steps-cost.sh [BIN_DIR]   # BIN_DIR: ttrace and libttrace.so
#                                               # (default target/release)
#   GPU_CHECK_PYTHON=PY                         # a python whose torch sees the GPU
set -uo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/release}"
py="${GPU_CHECK_PYTHON:-python3}"
steps=8
work="$(mktemp -d -t ttrace-steps-cost.XXXXXX)"
trap 'rm -rf "$work"' EXIT
TIMEFORMAT="%R s wall, %U s user, %S s sys"
"$py" -c 'import torch; print("steps-cost: torch", torch.__version__, "on", torch.cuda.get_device_name(0))' || exit 1

one() { # label, then the command
  local label="$1"
  shift
  { time "$@" >"$work/out" 2>"$work/err"; } 2>"$work/time"
  printf '%-22s %s | %s\n' "$label" "$(grep -h 'overhead.py' "$work/out" "$work/err" | sed 's/.*: first/first/')" "$(cat "$work/time")"
  grep -h 'capture stops\|records outside' "$work/err" | head -2 | sed 's/^/    /'
}
plain=("$py" scripts/gpu-check/overhead.py --steps "$steps")
traced() { # store, ttrace run options...
  local store="$1"
  shift
  rm -rf "$store"
  TTRACE_LOG=info "$bin/ttrace" run -q --out "$store" "$@" -- "${plain[@]}"
}
one "untraced" "${plain[@]}"
one "traced, every step" traced "$work/full"
one "traced, --steps 0" traced "$work/zero" --steps 0
one "traced, --steps 1000" traced "$work/none" --steps 1000
one "untraced (again)" "${plain[@]}"
# Long enough for the ring to fill: under --steps the first steps' snapshots are absorbed by
# it, and only the later ones show whether the tracer keeps up (on an H200, 4 ms a step for the
# first ten, then 25 ms, before glimpses: docs/capture.md "What filtering saves").
long=("$py" scripts/gpu-check/overhead.py --steps 60)
one "untraced, 60 steps" "${long[@]}"
rm -rf "$work/none60"
one "--steps 1000, 60 steps" env TTRACE_LOG=info "$bin/ttrace" run -q --out "$work/none60" --steps 1000 -- "${long[@]}"

traced "$work/five" --steps 5 >/dev/null 2>&1
"$bin/ttrace" dump --step 5 "$work/full" >"$work/full.jsonl" 2>/dev/null
"$bin/ttrace" dump "$work/five" >"$work/five.jsonl" 2>/dev/null
python3 - "$work/full.jsonl" "$work/five.jsonl" <<'PY'
import json, sys

SKIP = {"ptr", "stream", "dst", "src", "sendbuff", "recvbuff", "comm", "thread",
        "t_call_ns", "t_done_ns"}

def strip(v):
    if isinstance(v, str) and v.startswith("fn@0x"):
        return "fn@"  # a kernel without a registered name: its relocated address
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if k not in SKIP}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v

def load(path):
    recs = [strip(json.loads(line)) for line in open(path)]
    return sorted(recs, key=lambda r: (r["rank"], r["step"], r["seq"]))

full, five = load(sys.argv[1]), load(sys.argv[2])
same = full == five and len(full) > 0
print(f"steps-cost: step 5 of --steps 5: {len(five)} records, full capture's step 5: "
      f"{len(full)}: {'IDENTICAL' if same else 'DIFFERENT'}")
if not same:
    for i, (a, b) in enumerate(zip(full, five)):
        if a != b:
            print(f"  first difference at {i}:\n  full {a}\n  --steps 5 {b}")
            break
sys.exit(0 if same else 1)
PY
