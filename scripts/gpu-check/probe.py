"""A small PyTorch workload for scripts/gpu-check.sh, run under `ttrace run`.

Runs the ops ttrace captures — a host-to-device copy, an FP32 matmul, nn.Linear with bias, a
batched matmul, a BF16 GEMM, an NCCL all-reduce at world size 1 — and saves every input and
output it produced (raw bytes + dtype + shape) to OUT, so check.py can compare them with what
ttrace captured. It knows nothing of ttrace.
"""

import json
import os
import sys

import torch
import torch.distributed as dist


class Saved:
    """Tensors saved for check.py: OUT/NAME.bin (raw bytes) each, listed with dtype and shape
    in OUT/expected.json (graph_probe.py saves through it too)."""

    def __init__(self, out):
        os.makedirs(out, exist_ok=True)
        self.out = out
        self.meta = {}

    def save(self, name, t):
        t = t.detach().contiguous().cpu()
        with open(os.path.join(self.out, name + ".bin"), "wb") as f:
            f.write(t.view(torch.uint8).numpy().tobytes())
        self.meta[name] = {"dtype": str(t.dtype), "shape": list(t.shape), "nbytes": t.numel() * t.element_size()}

    def write(self):
        """Writes expected.json; returns how many tensors were saved."""
        with open(os.path.join(self.out, "expected.json"), "w") as f:
            json.dump(self.meta, f, indent=1)
        return len(self.meta)


def main(out):
    saved = Saved(out)
    save = saved.save

    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    torch.backends.cuda.matmul.allow_tf32 = False

    host = torch.randn(256, 512)
    x = host.to(dev)  # cudaMemcpyAsync host -> device
    torch.cuda.synchronize()
    save("h2d_input", host)

    w = torch.randn(512, 384, device=dev)
    y = x @ w  # FP32 GEMM
    save("matmul_A", x)
    save("matmul_B", w)
    save("matmul_out", y)

    lin = torch.nn.Linear(512, 128, bias=True).to(dev)
    with torch.no_grad():
        z = lin(x)  # GEMM with a bias (cuBLASLt epilogue or addmm)
    save("linear_weight", lin.weight)
    save("linear_bias", lin.bias)
    save("linear_out", z)

    a = torch.randn(8, 64, 96, device=dev)
    b = torch.randn(8, 96, 32, device=dev)
    c = torch.bmm(a, b)  # strided batched GEMM
    save("bmm_A", a)
    save("bmm_B", b)
    save("bmm_out", c)

    xa = torch.randn(192, 256, device=dev, dtype=torch.bfloat16)
    xb = torch.randn(256, 320, device=dev, dtype=torch.bfloat16)
    xc = xa @ xb  # BF16 GEMM
    save("bf16_A", xa)
    save("bf16_B", xb)
    save("bf16_out", xc)

    init = "file://" + os.path.join(out, "pg-init")
    dist.init_process_group("nccl", init_method=init, rank=0, world_size=1)
    t = torch.arange(4096, device=dev, dtype=torch.float32) * 0.5
    save("allreduce_in", t)
    dist.all_reduce(t)  # world size 1: the output equals the input
    torch.cuda.synchronize()
    save("allreduce_out", t)
    dist.destroy_process_group()

    torch.cuda.synchronize()
    print(f"probe: saved {saved.write()} tensors to {out}")


if __name__ == "__main__":
    main(sys.argv[1])
