#!/usr/bin/env bash
# Reading at scale, on the simulated CUDA stack: what reading a store costs in disk reads and
# resident memory when its frames and segments are large. Produces the fixture trainer at
# hidden 1024 (frames of ~2.6 MB, segments of 330-390 MB): a world-size-1 reference and a
# tp=2 run of it (about a minute), then reports, each against BASELINE (another build's
# `ttrace`, run in the same script on the same stores) when it is given:
#   1. a cold `ttrace ls` of the reference: bytes read from disk (its files' pages dropped from
#      the page cache first with posix_fadvise(DONTNEED), which needs no root), and the time;
#   2. a cold `ttrace compare REF RUN`: bytes read from disk, time, and when its first pass
#      over the records ended ("stores prepared", from its debug log);
#   3. `ttrace compare REF RUN --memory M` for M in 1G and 128M: peak resident memory, split
#      into the mapped files' share and anonymous memory (/proc/PID/status, sampled every
#      5 ms), and the time;
#   4. `ttrace check RUN`: peak resident memory (the same split) and time;
#   5. many records: the trainer at hidden 32 (small tensors, many records: about a thousand a
#      step over tp2 dp2 pp2), a reference and a run of FEW_STEPS (4), MANY_STEPS (40) and
#      LONG_STEPS (160) steps; compare's peak resident memory and time under `--memory 64M`
#      and 1G for each, and what it grows by per step and per thousand records from MANY to
#      LONG (what a budget "whatever the number of steps" must hold). Under 64M the budgeted
#      shares (segments, decoded tensors, records' metadata, results) are full at 40 steps,
#      so that growth is what no budget bounds; under 1G it includes the shares filling.
# Reports of the two builds are compared (JSON minus elapsed time) and said to be the same or
# not.
#
#   scripts/bench-scale.sh
#   BASELINE=/path/to/old/ttrace scripts/bench-scale.sh
#
# Environment: BASELINE as above; KEEP=1 keeps the stores under target/bench-scale (and reuses
# them on the next run); FEW_STEPS, MANY_STEPS, LONG_STEPS (section 5).
set -euo pipefail
cd "$(dirname "$0")/.."
# CARGO_TARGET_DIR relative to the repository, or absolute.
target="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
T="$target/release"
work="$target/bench-scale"
cargo build --release -q --workspace
export LD_LIBRARY_PATH="$T/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

model=(--hidden 1024 --ffn 4096 --heads 8 --layers 2 --seq 128 --micro-batch-size 4 --steps 2
  --precision bf16)
if [ ! -f "$work/ref/manifest.json" ] || [ ! -f "$work/run/manifest.json" ]; then
  rm -rf "$work"
  mkdir -p "$work"
  echo "producing the stores (trainer ${model[*]})..."
  "$T/ttrace" run -q --out "$work/ref" -- "$T/trainer" "${model[@]}" >/dev/null
  "$T/ttrace" run -q --out "$work/run" -- "$T/simrun" --nproc-per-node 2 -- \
    "$T/trainer" "${model[@]}" --tp 2 >/dev/null
fi
# Section 5's stores: a thousand records a step, tensors of a few KB.
small=(--precision bf16 --micro-batches 2 --hidden 32 --vocab 64 --seq 16)
few="${FEW_STEPS:-4}" many="${MANY_STEPS:-40}" long="${LONG_STEPS:-160}"
for n in "$few" "$many" "$long"; do
  if [ ! -f "$work/small-ref$n/manifest.json" ] || [ ! -f "$work/small-run$n/manifest.json" ]; then
    rm -rf "$work/small-ref$n" "$work/small-run$n"
    echo "producing the stores of section 5 (trainer ${small[*]} --steps $n)..."
    "$T/ttrace" run -q --out "$work/small-ref$n" -- "$T/trainer" "${small[@]}" --steps "$n" \
      >/dev/null
    "$T/ttrace" run -q --out "$work/small-run$n" -- "$T/simrun" --nproc-per-node 8 -- \
      "$T/trainer" "${small[@]}" --steps "$n" --tp 2 --dp 2 --pp 2 >/dev/null
  fi
done
builds=("this:$T/ttrace")
[ -n "${BASELINE:-}" ] && builds+=("baseline:$BASELINE")

python3 - "$work" "$few" "$many" "$long" "${builds[@]}" <<'EOF'
import json, os, re, resource, subprocess, sys, time

work, few, many, long = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
builds = [b.split(":", 1) for b in sys.argv[5:]]
ref, run = os.path.join(work, "ref"), os.path.join(work, "run")


def drop_cache(*stores):
    """Drops the stores' files from the page cache; returns their bytes."""
    total = 0
    for s in stores:
        for root, _, files in os.walk(s):
            for f in files:
                fd = os.open(os.path.join(root, f), os.O_RDONLY)
                total += os.fstat(fd).st_size
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
    return total


def cold(cmd, stores, env=None):
    """Runs cmd on cold stores: (MB read from disk, seconds, stderr)."""
    drop_cache(*stores)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.time()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       env=env)
    wall = time.time() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_inblock - before.ru_inblock) * 512 / 1e6, wall, p.stderr


def peaks(cmd):
    """Runs cmd: (peak VmRSS, its mapped-file and anonymous shares at that peak, in MB; s)."""
    t = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    best = (0, 0, 0)
    while p.poll() is None:
        try:
            s = open(f"/proc/{p.pid}/status").read()
            v = [int(re.search(k + r":\s+(\d+)", s).group(1)) for k in ("VmRSS", "RssFile", "RssAnon")]
            best = max(best, tuple(v))
        except (OSError, AttributeError):
            pass
        time.sleep(0.005)
    return tuple(x / 1024 for x in best), time.time() - t


def same(paths):
    reps = []
    for p in paths:
        r = json.load(open(p))
        r.get("stats", {}).pop("elapsed_s", None)
        reps.append(r)
    return "the same report" if all(r == reps[0] for r in reps) else "DIFFERENT reports"


print(f"stores: reference {drop_cache(ref) / 1e6:.0f} MB, run {drop_cache(run) / 1e6:.0f} MB")
print("1. cold `ttrace ls REF`")
for name, tt in builds:
    mb, s, _ = cold([tt, "ls", ref], [ref])
    print(f"   {name:9s} {mb:8.1f} MB read from disk, {s:.2f} s")
print("2. cold `ttrace compare REF RUN`")
env = dict(os.environ, TTRACE_LOG="ttrace_compare::engine=debug")
outs = []
for name, tt in builds:
    out = os.path.join(work, f"cold-{name}.json")
    mb, s, err = cold([tt, "compare", ref, run, "--json", out], [ref, run], env)
    prep = re.search(r"stores prepared seconds=([0-9.]+)", err)
    print(f"   {name:9s} {mb:8.1f} MB read from disk, {s:.2f} s; first pass over the records "
          f"{float(prep.group(1)) if prep else float('nan'):.2f} s")
    outs.append(out)
print(f"   {same(outs)}")
for mem in ("1G", "128M"):
    print(f"3. `ttrace compare REF RUN --memory {mem}` (peak RSS; mapped files + anonymous)")
    outs = []
    for name, tt in builds:
        out = os.path.join(work, f"mem{mem}-{name}.json")
        (rss, f, a), s = peaks([tt, "compare", ref, run, "--memory", mem, "--json", out])
        print(f"   {name:9s} {rss:6.0f} MB ({f:.0f} + {a:.0f}), {s:.2f} s")
        outs.append(out)
    print(f"   {same(outs)}")
print("4. `ttrace check RUN` (peak RSS; mapped files + anonymous)")
outs = []
for name, tt in builds:
    out = os.path.join(work, f"check-{name}.json")
    (rss, f, a), s = peaks([tt, "check", run, "--json", out])
    print(f"   {name:9s} {rss:6.0f} MB ({f:.0f} + {a:.0f}), {s:.2f} s")
    outs.append(out)
print(f"   {same(outs)}")


def records(store):
    return sum(r["records"] for r in json.load(open(os.path.join(store, "manifest.json")))["ranks"])


stores = {n: (os.path.join(work, f"small-ref{n}"), os.path.join(work, f"small-run{n}"))
          for n in (few, many, long)}
count = {n: records(r) + records(u) for n, (r, u) in stores.items()}
print(f"5. many records: `ttrace compare REF RUN --memory M`, {few}, {many} and {long} steps "
      f"({count[few]}, {count[many]} and {count[long]} records; peak RSS, time)")
for mem, budget in (("64M", 64), ("1G", 1024)):
    for name, tt in builds:
        got = {}
        for n, (r, u) in stores.items():
            out = os.path.join(work, f"small{n}-{mem}-{name}.json")
            got[n] = peaks([tt, "compare", r, u, "--memory", mem, "--json", out])
        at = ", ".join(f"{got[n][0][0]:.0f} MB {got[n][1]:.2f} s" for n in (few, many, long))
        (r1, _, _), _ = got[many]
        (r2, _, _), _ = got[long]
        per_step = (r2 - r1) / (long - many)
        per_k = (r2 - r1) / ((count[long] - count[many]) / 1000)
        print(f"   --memory {mem:4s} {name:9s} {at}; from {many} to {long} steps "
              f"{per_step:.3f} MB a step, {per_k:.3f} MB a thousand records; within --memory "
              f"at {long}: {'yes' if r2 <= budget else 'NO'}")
    if len(builds) > 1:
        for n in (many, long):
            reports = [os.path.join(work, f"small{n}-{mem}-{b}.json") for b, _ in builds]
            print(f"   {n} steps: {same(reports)}")
EOF
[ "${KEEP:-0}" = 1 ] || rm -rf "$work"
