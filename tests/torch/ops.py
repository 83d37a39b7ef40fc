"""Single-process PyTorch ops on the simulated CUDA stack, for ttrace's torch tests.

Runs copies (H2D pageable and pinned non_blocking, D2H, D2D clone) in an NVTX range "copies",
mm / addmm / F.linear with and without bias / bmm / baddbmm in fp32, fp16 and bf16 (each
dtype in a range "gemms.<dtype>", and a start/end range "from.float16" from the fp16 GEMMs
to the end of them), torch._scaled_mm in FP8 and a linear
backward with an explicit gradient. Every tensor is made on the host (the simulated device runs
no kernels: element-wise work is host work), moved to the device by a copy, and every result is
copied back. What torch saw is saved as raw bytes, OUT/<index>_<label>.bin, with OUT/torch.json
listing name, dtype and shape, so the test can compare them byte for byte with what ttrace
captured (tests/integration/tests/it/torch_ops.rs).

Finally a kernel launch (`torch.ones` on the device fills with a kernel; `torch.zeros` would
be a memset) must raise torch's RuntimeError naming "no kernel image", and a GEMM after it
must still work. On a real GPU (`TORCH_OPS_ON_GPU=1`, scripts/gpu-check.sh) the launch must
instead succeed: tracing never stops a kernel from running.

Usage: python ops.py OUT [EXIT_CODE]   (exits with EXIT_CODE, default 0, after saving: the test
checks that tracing leaves a program's exit status unchanged)
"""

import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

OUT = sys.argv[1]
DEV = torch.device("cuda", 0)
saved = []  # (name, numpy uint8 bytes, dtype str, shape)


def save(label, t):
    """Records tensor `t` (host copy) as torch sees it."""
    t = t.detach()
    if t.is_cuda:
        t = t.cpu()
    t = t.contiguous()
    raw = t.view(torch.uint8).numpy().copy() if t.numel() else np.zeros(0, np.uint8)
    name = f"{len(saved):03d}_{label}"
    saved.append((name, raw.reshape(-1), str(t.dtype).replace("torch.", ""), list(t.shape)))


def host(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 0.5).to(dtype)


def copies():
    a = host((64, 48), torch.float32, 1)
    d = a.to(DEV)  # H2D from pageable memory
    save("h2d_pageable", d)
    p = host((33, 17), torch.float32, 2).pin_memory()
    dp = p.to(DEV, non_blocking=True)  # H2D from pinned memory, asynchronous
    torch.cuda.synchronize()
    save("h2d_pinned", dp)
    c = d.clone()  # D2D
    save("d2d_clone", c)
    back = torch.empty_like(a).pin_memory()
    back.copy_(d, non_blocking=True)  # D2H into pinned memory
    torch.cuda.synchronize()
    save("d2h_pinned", back)
    assert torch.equal(back, a), "D2H copy differs from the source"


def gemms(dtype):
    tag = str(dtype).replace("torch.", "")
    a = host((16, 32), dtype, 10).to(DEV)
    b = host((32, 24), dtype, 11).to(DEV)
    bias = host((24,), dtype, 12).to(DEV)
    c = host((16, 24), dtype, 13).to(DEV)
    w = host((24, 32), dtype, 14).to(DEV)
    save(f"mm_{tag}", torch.mm(a, b))
    save(f"addmm_{tag}", torch.addmm(c, a, b, beta=1.0, alpha=1.0))
    save(f"linear_bias_{tag}", F.linear(a, w, bias))
    save(f"linear_{tag}", F.linear(a, w))
    x = host((3, 8, 16), dtype, 15).to(DEV)
    y = host((3, 16, 12), dtype, 16).to(DEV)
    z = host((3, 8, 12), dtype, 17).to(DEV)
    save(f"bmm_{tag}", torch.bmm(x, y))
    save(f"baddbmm_{tag}", torch.baddbmm(z, x, y))


def scaled_mm():
    a = host((16, 32), torch.float32, 20).to(torch.float8_e4m3fn).to(DEV)
    # _scaled_mm wants b column-major: a (32, 16) row-major tensor, transposed.
    b = host((16, 32), torch.float32, 21).to(torch.float8_e4m3fn).to(DEV).t()
    sa = torch.tensor(0.5).to(DEV)
    sb = torch.tensor(2.0).to(DEV)
    out = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    save("scaled_mm_e4m3_bf16", out)


def linear_backward():
    x = host((8, 16), torch.float32, 30).to(DEV).requires_grad_(True)
    w = host((12, 16), torch.float32, 31).to(DEV).requires_grad_(True)
    y = F.linear(x, w)
    save("bwd_forward", y)
    gy = host((8, 12), torch.float32, 32).to(DEV)
    y.backward(gy)
    save("bwd_grad_input", x.grad)
    save("bwd_grad_weight", w.grad)


def kernel_refused():
    if os.environ.get("TORCH_OPS_ON_GPU") == "1":
        ones = torch.ones(4, device=DEV).cpu()
        assert torch.equal(ones, torch.ones(4)), f"a kernel on the real GPU gave {ones}"
        print("kernel launch ran on the real GPU", flush=True)
    else:
        _kernel_refused_by_simulator()
    a = host((4, 4), torch.float32, 40).to(DEV)
    save("after_refusal_mm", a @ a)


def _kernel_refused_by_simulator():
    try:
        torch.ones(4, device=DEV)
    except RuntimeError as e:
        msg = str(e)
        assert "no kernel image" in msg, msg
        print("kernel launch refused:", msg.splitlines()[0], flush=True)
    else:
        raise AssertionError("a kernel launch succeeded on the simulated device")


def main():
    os.makedirs(OUT, exist_ok=True)
    # NVTX ranges (NVTX 3 inside torch: they reach a tool only through NVTX's loader), which
    # the test finds on the records of the ops inside them.
    with torch.cuda.nvtx.range("copies"):
        copies()
    started = None
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        if dt == torch.float16:
            # A start/end range (not nested), from here to the end of the GEMMs.
            started = torch.cuda.nvtx.range_start("from.float16")
        with torch.cuda.nvtx.range("gemms." + str(dt).replace("torch.", "")):
            gemms(dt)
    torch.cuda.nvtx.range_end(started)
    scaled_mm()
    linear_backward()
    kernel_refused()
    for n, r, _, _ in saved:
        r.tofile(os.path.join(OUT, n + ".bin"))
    with open(os.path.join(OUT, "torch.json"), "w") as f:
        json.dump([{"name": n, "dtype": d, "shape": s} for n, _, d, s in saved], f, indent=1)
    print(f"saved {len(saved)} tensors", flush=True)
    sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)


if __name__ == "__main__":
    main()
