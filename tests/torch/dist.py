"""torch.distributed with the NCCL backend on the simulated CUDA stack, for ttrace's tests.

Launched by `torchrun --nproc-per-node 4`. Each rank binds its device, initialises the default
group with init_process_group("nccl", device_id=...) (eager NCCL init) and runs: all_reduce SUM,
AVG and MAX (synchronous and async_op=True), all_gather_into_tensor, reduce_scatter_tensor,
broadcast, send/recv, batch_isend_irecv, all_to_all_single, a collective on a new_group of the
even ranks and one on a split_group of {0,1} / {2,3}. Inputs are made on the host (the simulated
device runs no kernels) and every result is copied back; each rank checks its results against
the host-computed expectation (integers-valued floats: exact in any order) and saves the raw
bytes to OUT/rank<r>/<index>_<label>.bin with OUT/rank<r>/torch.json, so the test can compare
them with what ttrace captured.

Usage: torchrun --nproc-per-node 4 dist.py OUT
"""

import json
import os
import sys

os.environ.setdefault("TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_WARNING", "false")

import torch
import torch.distributed as dist

OUT = sys.argv[1]
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL = int(os.environ["LOCAL_RANK"])
DEV = torch.device("cuda", LOCAL)
saved = []


def save(label, t):
    t = t.detach().cpu().contiguous()
    name = f"{len(saved):03d}_{label}"
    saved.append((name, t.view(torch.uint8).numpy().copy().reshape(-1), str(t.dtype), list(t.shape)))


def host(r, n=8, base=0.0):
    """Rank r's input: small integers, so sums are exact in any order."""
    return torch.arange(n, dtype=torch.float32) + 10.0 * r + base


def check(label, got, want):
    got = got.cpu()
    assert torch.equal(got, want), f"rank {RANK} {label}: {got} != {want}"
    save(label, got)


def all_reduces():
    for op, name in ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.MAX, "max"), (dist.ReduceOp.AVG, "avg")):
        for asynchronous in (False, True):
            t = host(RANK).to(DEV)
            work = dist.all_reduce(t, op=op, async_op=asynchronous)
            if asynchronous:
                work.wait()
            ins = torch.stack([host(r) for r in range(WORLD)])
            want = {"sum": ins.sum(0), "max": ins.max(0).values, "avg": ins.sum(0) / WORLD}[name]
            check(f"all_reduce_{name}_{'async' if asynchronous else 'sync'}", t, want)


def gathers():
    out = torch.empty(WORLD * 8, dtype=torch.float32).to(DEV)
    dist.all_gather_into_tensor(out, host(RANK).to(DEV))
    check("all_gather_into_tensor", out, torch.cat([host(r) for r in range(WORLD)]))
    full = [host(r, n=8 * WORLD) for r in range(WORLD)]
    out = torch.empty(8, dtype=torch.float32).to(DEV)
    dist.reduce_scatter_tensor(out, full[RANK].to(DEV))
    check("reduce_scatter_tensor", out, torch.stack(full).sum(0)[8 * RANK : 8 * RANK + 8])
    t = (host(RANK) if RANK == 1 else torch.empty(8)).to(DEV)
    dist.broadcast(t, src=1)
    check("broadcast", t, host(1))


def point_to_point():
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    if RANK % 2 == 0:
        dist.send(host(RANK, base=0.5).to(DEV), dst=nxt)
        t = torch.empty(8).to(DEV)
        dist.recv(t, src=prv)
    else:
        t = torch.empty(8).to(DEV)
        dist.recv(t, src=prv)
        dist.send(host(RANK, base=0.5).to(DEV), dst=nxt)
    check("send_recv", t, host(prv, base=0.5))
    recv = torch.empty(8).to(DEV)
    ops = [
        dist.P2POp(dist.isend, host(RANK, base=0.25).to(DEV), nxt),
        dist.P2POp(dist.irecv, recv, prv),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check("batch_isend_irecv", recv, host(prv, base=0.25))
    inp = host(RANK, n=4 * WORLD).to(DEV)
    out = torch.empty(4 * WORLD).to(DEV)
    dist.all_to_all_single(out, inp)
    want = torch.cat([host(r, n=4 * WORLD)[4 * RANK : 4 * RANK + 4] for r in range(WORLD)])
    check("all_to_all_single", out, want)


def groups():
    evens = dist.new_group([r for r in range(WORLD) if r % 2 == 0])
    if RANK % 2 == 0:
        t = host(RANK).to(DEV)
        dist.all_reduce(t, group=evens)
        check("new_group_even_sum", t, sum(host(r) for r in range(WORLD) if r % 2 == 0))
    halves = dist.split_group(split_ranks=[[0, 1], [2, 3]])
    t = host(RANK).to(DEV)
    dist.all_reduce(t, group=halves)
    mine = [0, 1] if RANK < 2 else [2, 3]
    check("split_group_sum", t, sum(host(r) for r in mine))


def main():
    torch.cuda.set_device(DEV)
    dist.init_process_group("nccl", device_id=DEV)
    all_reduces()
    gathers()
    point_to_point()
    groups()
    out = os.path.join(OUT, f"rank{RANK}")
    os.makedirs(out, exist_ok=True)
    for n, r, _, _ in saved:
        r.tofile(os.path.join(out, n + ".bin"))
    with open(os.path.join(out, "torch.json"), "w") as f:
        json.dump([{"name": n, "dtype": d, "shape": s} for n, _, d, s in saved], f, indent=1)
    dist.destroy_process_group()
    print(f"rank {RANK}: saved {len(saved)} tensors", flush=True)


if __name__ == "__main__":
    main()
