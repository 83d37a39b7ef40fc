#!/usr/bin/env bash
# Reading a store's tensors from Python (the installed wheel: ttrace.open + Record.numpy on
# every captured tensor) against `ttrace export` of the same store (safetensors, into a
# tmpfs), in one run on the same machine. Prints both rates and their ratio (bar: >= 0.8).
# Uses the venv scripts/test-python.sh leaves in target/py-test-venv (run that first).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/py-test-venv
[ -x "$venv/bin/ttrace" ] || { echo "run scripts/test-python.sh first" >&2; exit 1; }
T=$PWD/target/release
work=$(mktemp -d /dev/shm/ttrace-bench-py.XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$work"' EXIT
export LD_LIBRARY_PATH="$T/sim"
"$venv/bin/ttrace" run --quiet --out "$work/store" -- "$T/simrun" --nproc-per-node 4 -- \
  "$T/trainer" --tp 2 --dp 2 --hidden 256 --layers 8 --ffn 512 --steps 3 --precision bf16
"$venv/bin/python" - "$work" <<'PY'
import os, subprocess, sys, time
import ttrace
work = sys.argv[1]
store = os.path.join(work, "store")
cli = str(ttrace.cli_path())

def export_once(i):
    out = os.path.join(work, f"export{i}")
    t = time.perf_counter()
    subprocess.run([cli, "export", store, "--format", "safetensors", "--out", out],
                   check=True, capture_output=True)
    dt = time.perf_counter() - t
    subprocess.run(["rm", "-rf", out], check=True)
    return dt

def python_once():
    t = time.perf_counter()
    s = ttrace.open(store)
    total = 0
    for rec in s:
        for x in rec.tensors:
            if x.captured:
                total += rec.numpy(x.index).nbytes
    return time.perf_counter() - t, total

runs = 3
exp = min(export_once(i) for i in range(runs))
py = [python_once() for _ in range(runs)]
pyt = min(t for t, _ in py)
nbytes = py[0][1]
gb = nbytes / 1e9
print(f"store: {gb:.3f} GB of captured tensors")
print(f"ttrace export (safetensors, tmpfs): {exp:.3f} s = {gb/exp:.2f} GB/s (best of {runs})")
print(f"python ttrace.open + numpy():       {pyt:.3f} s = {gb/pyt:.2f} GB/s (best of {runs})")
print(f"python / export speed: {exp/pyt:.2f}x (bar >= 0.8x)")
PY
