"""CUDA graphs on a real GPU, for scripts/gpu-check.sh: what ttrace must capture at every replay.

A program that captures work into a CUDA graph once and replays it (torch.cuda.graph,
torch.compile(mode="reduce-overhead"), graphed Megatron/TE layers) makes its GEMMs, copies and
collectives API calls only while the graph is captured; each replay is one cudaGraphLaunch.
ttrace snapshots the graph's ops at every replay (docs/capture.md, "CUDA graphs"). This probe
captures an FP32 and a BF16 GEMM and a device-to-device copy into one graph (and, in a second
graph, an NCCL all-reduce at world size 1), replays each with new inputs written into the
static buffers before every replay, and saves each replay's inputs and outputs as probe.py
does (NAME.bin plus expected.json): check.py must find every one among the captured tensors,
so a replay that was not snapshotted fails by name. With `compile`, the same for a matmul
compiled with torch.compile(mode="reduce-overhead") (CUDA graph trees), called with new
inputs.

Usage: graph_probe.py OUT_DIR [compile]
"""

import os
import sys

import torch
import torch.distributed as dist

from probe import Saved

REPLAYS = 3


def main(out, mode):
    saved = Saved(out)
    save = saved.save

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda:0")
    gen = torch.Generator().manual_seed(1)

    def host(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=gen).to(dtype)

    if mode == "compile":
        mm = torch.compile(lambda a, b: a @ b, mode="reduce-overhead")
        w = host(512, 384).to(dev)
        save("compiled_B", w)
        for i in range(REPLAYS + 2):  # the first calls warm up and record the graph
            a = host(256, 512).to(dev)
            y = mm(a, w)
            torch.cuda.synchronize()
            if i >= 2:
                save(f"compiled{i}_A", a)
                save(f"compiled{i}_out", y.clone())
    else:
        x = host(256, 512).to(dev)
        w = host(512, 384).to(dev)
        xa = host(192, 256, dtype=torch.bfloat16).to(dev)
        xb = host(256, 320, dtype=torch.bfloat16).to(dev)
        # Warm up on a side stream (cuBLAS handles and workspaces exist before the capture).
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                y = x @ w
                z = xa @ xb
                c = y.clone()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x @ w  # FP32 GEMM
            z = xa @ xb  # BF16 GEMM
            c = y.clone()  # device-to-device copy
        save("graph_B", w)
        save("graph_bf16_B", xb)
        for i in range(REPLAYS):
            x.copy_(host(256, 512))
            xa.copy_(host(192, 256, dtype=torch.bfloat16))
            g.replay()
            torch.cuda.synchronize()
            save(f"replay{i}_A", x)
            save(f"replay{i}_out", y)
            save(f"replay{i}_bf16_A", xa)
            save(f"replay{i}_bf16_out", z)
            save(f"replay{i}_clone", c)
        init = "file://" + os.path.join(out, "pg-init")
        dist.init_process_group("nccl", init_method=init, rank=0, world_size=1)
        t = torch.zeros(4096, device=dev)
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            dist.all_reduce(t)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2):
            dist.all_reduce(t)  # world size 1: the output equals the input
        for i in range(REPLAYS):
            t.copy_(host(4096) + i)
            g2.replay()
            torch.cuda.synchronize()
            save(f"replay{i}_allreduce", t)
        dist.destroy_process_group()
    print(f"graph_probe: {torch.cuda.get_device_name(0)}: saved {saved.write()} tensors to {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "graph")
