"""Compares what ttrace captured with what the probe saved (scripts/gpu-check.sh).

Usage: check.py EXPECTED_DIR RECORDS_JSONL TENSORS_DIR [RANK]

EXPECTED_DIR holds NAME.bin files with expected.json (probe.py: {name: {dtype, shape}}) or
torch.json (tests/torch/*.py: [{name, dtype, shape}]); with RANK, only that rank's captured
tensors count (tests/torch/dist.py saves each rank's tensors apart). RECORDS_JSONL and TENSORS_DIR
come from `ttrace dump RUN --tensors TENSORS_DIR > RECORDS_JSONL`. A saved tensor passes when
some captured tensor holds exactly its bytes (packed tensors are stored byte for byte: a
row-major torch tensor is the column-major matrix cuBLAS sees, so no reordering is needed).
Also checked: every captured tensor matches its CRC-32, and the store has no gap records.
Prints a PASS/FAIL table; exits 1 if anything failed.
"""

import json
import os
import sys


def load_expected(expected_dir):
    """{name: {dtype, shape}} from probe.py's expected.json or tests/torch's torch.json."""
    path = os.path.join(expected_dir, "expected.json")
    if os.path.exists(path):
        return json.load(open(path))
    listed = json.load(open(os.path.join(expected_dir, "torch.json")))
    return {t["name"]: {"dtype": t["dtype"], "shape": t["shape"]} for t in listed}


def main(expected_dir, records_path, tensors_dir, rank=None):
    expected = load_expected(expected_dir)
    records = [json.loads(line) for line in open(records_path) if line.strip()]
    if rank is not None:
        records = [r for r in records if r["rank"] == int(rank)]
    by_size = {}
    crc_bad = []
    gaps = []
    for r in records:
        if r["op"]["family"] == "gap":
            gaps.append(f'{r["api"]}: {r["op"].get("reason")} {r["op"].get("detail", "")}')
        for t in r["tensors"]:
            if not t["captured"]:
                continue
            if not t.get("crc_ok", False):
                crc_bad.append(f'rank {r["rank"]} step {r["step"]} seq {r["seq"]} {t["role"]}')
            by_size.setdefault(t["nbytes"], []).append((r, t))
    cache = {}

    def captured_bytes(t):
        f = t["file"]
        if f not in cache:
            cache[f] = open(os.path.join(tensors_dir, f), "rb").read()
        return cache[f]

    rows = []
    failed = 0
    for name, meta in expected.items():
        want = open(os.path.join(expected_dir, name + ".bin"), "rb").read()
        hits = [
            f'{r["api"]} {t["role"]} {t["dtype"]}{t["shape"]} (rank {r["rank"]} step {r["step"]} seq {r["seq"]})'
            for r, t in by_size.get(len(want), [])
            if captured_bytes(t) == want
        ]
        # Name the GEMM or collective that saw the tensor before a copy that carried it.
        hits.sort(key=lambda h: h.startswith(("cudaMemcpy", "cuMemcpy")))
        hit = "; ".join(hits[:2]) if hits else None
        if hit is None:
            failed += 1
            close = len(by_size.get(len(want), []))
            hit = f"no captured tensor has these bytes ({close} of the same size)"
        rows.append((name, f'{meta["dtype"].replace("torch.", "")}{meta["shape"]}', "PASS" if "no captured" not in hit else "FAIL", hit))
    rows.append(("checksums", f"{sum(len(v) for v in by_size.values())} tensors", "PASS" if not crc_bad else "FAIL", "; ".join(crc_bad[:3]) or "every tensor matches its crc32"))
    rows.append(("gaps", f"{len(records)} records", "PASS" if not gaps else "FAIL", "; ".join(gaps[:3]) or "none"))
    failed += bool(crc_bad) + bool(gaps)
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    print(f'{"tensor":<{w0}}  {"saved as":<{w1}}  result  captured as')
    for n, d, res, how in rows:
        print(f"{n:<{w0}}  {d:<{w1}}  {res:<6}  {how}")
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
