#!/usr/bin/env python3
"""Baseline C of the compare benchmark (scripts/bench-compare.sh): what a user without ttrace
compare would do with `ttrace export --format npy --widen`: load the reference's tensors and
each rank's tensors of the distributed run, pair them naively and call numpy.allclose on each
pair of equal shapes.

    bench_compare_numpy.py REF_EXPORT RUN_EXPORT [PERTURBED_EXPORT] [--rtol R] [--atol A]

A pair is (same step, same NVTX path, same API, same role, same occurrence of that key in
the rank's step): what lines ops up across ranks without knowing the layout. A run tensor
whose reference counterpart has another shape (a TP shard, a DP slice of the batch) cannot be
compared without a placement search; the output says how many could be paired at all. The
perturbed reference, when given, is loaded and compared with the reference pair by pair, as
the run is (how large round-off is).

Only the loading (numpy.load) and the allclose calls are timed; reading index.json is not.
Prints `key value` pairs on one line starting with `numpy:` for the script, after a readable
summary.
"""

import argparse
import json
import os
import sys
import time
from collections import defaultdict

import numpy as np

FLOATS = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}


def float_tensors(export_dir):
    """The index entries of the floating-point tensors, each with its pairing key and the
    size it had in the trace (before --widen)."""
    with open(os.path.join(export_dir, "index.json"), encoding="utf-8") as f:
        index = json.load(f)
    out = []
    seen = defaultdict(int)
    for t in sorted(
        (t for t in index if t["dtype"] in FLOATS),
        key=lambda t: (t["rank"], t["step"], t["seq"], t["role"]),
    ):
        op = (t["step"], "/".join(t["nvtx"]), t["api"], t["role"])
        n = seen[(t["rank"],) + op]
        seen[(t["rank"],) + op] += 1
        elems = 1
        for d in t["shape"]:
            elems *= d
        out.append(
            {
                "path": os.path.join(export_dir, t["file"]),
                "rank": t["rank"],
                "key": op + (n,),
                "shape": tuple(t["shape"]),
                "trace_bytes": elems * FLOATS[t["dtype"]],
            }
        )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref")
    ap.add_argument("run")
    ap.add_argument("perturbed", nargs="?")
    ap.add_argument("--rtol", type=float, default=1e-2, help="numpy.allclose rtol (BF16-sized)")
    ap.add_argument("--atol", type=float, default=1e-3, help="numpy.allclose atol")
    a = ap.parse_args()

    ref = float_tensors(a.ref)
    run = float_tensors(a.run)
    pert = float_tensors(a.perturbed) if a.perturbed else []
    if len({t["rank"] for t in ref}) > 1:
        sys.exit(f"{a.ref}: the reference must have one rank")

    trace_bytes = loaded_bytes = 0
    pairs = close = 0
    paired_run = sharded_run = missing_run = 0
    t0 = time.perf_counter()
    ref_arrays = {}
    for t in ref:
        x = np.load(t["path"])
        ref_arrays[t["key"]] = x
        trace_bytes += t["trace_bytes"]
        loaded_bytes += x.nbytes
    for t in pert:
        x = np.load(t["path"])
        trace_bytes += t["trace_bytes"]
        loaded_bytes += x.nbytes
        r = ref_arrays.get(t["key"])
        if r is not None and r.shape == x.shape:
            pairs += 1
            close += bool(np.allclose(x, r, rtol=a.rtol, atol=a.atol))
    for t in run:
        x = np.load(t["path"])
        trace_bytes += t["trace_bytes"]
        loaded_bytes += x.nbytes
        r = ref_arrays.get(t["key"])
        if r is None:
            missing_run += 1
        elif r.shape != x.shape:
            sharded_run += 1
        else:
            paired_run += 1
            pairs += 1
            close += bool(np.allclose(x, r, rtol=a.rtol, atol=a.atol))
    seconds = time.perf_counter() - t0

    n = max(len(run), 1)
    print(
        f"  numpy: {len(ref) + len(pert) + len(run)} float tensors loaded "
        f"({trace_bytes / 1e6:.1f} MB in the trace, {loaded_bytes / 1e6:.1f} MB as float32 npy), "
        f"{pairs} allclose calls in {seconds:.3f} s"
    )
    print(
        f"  run tensors paired with the reference: {paired_run}/{len(run)} "
        f"({100 * paired_run / n:.1f}%); other shape (shards, batch slices): {sharded_run} "
        f"({100 * sharded_run / n:.1f}%); no counterpart by step/NVTX/API/role/occurrence: "
        f"{missing_run} ({100 * missing_run / n:.1f}%)"
    )
    print(
        f"  allclose(rtol={a.rtol:g}, atol={a.atol:g}) true for {close}/{pairs} pairs "
        f"(says nothing about which tensor a bug broke first)"
    )
    print(
        f"numpy: seconds {seconds:.6f} trace_bytes {trace_bytes} loaded_bytes {loaded_bytes} "
        f"pairs {pairs} close {close} run_tensors {len(run)} paired_run {paired_run} "
        f"sharded_run {sharded_run} missing_run {missing_run}"
    )


if __name__ == "__main__":
    main()
