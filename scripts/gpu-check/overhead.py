"""Tracing overhead on a real GPU: a bf16 MLP trained for a few steps, timed per step.

Run it plain and under `ttrace run` (all steps, or `--steps 0` so later steps are filtered
out) and compare the printed per-step times: the ratio is what tracing costs a training step
of this size. Usage: python overhead.py [--hidden H] [--tokens T] [--layers L] [--steps N]
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    layers = [torch.nn.Linear(a.hidden, a.hidden, bias=False, device=dev, dtype=torch.bfloat16)
              for _ in range(a.layers)]
    params = [p for l in layers for p in l.parameters()]
    opt = torch.optim.SGD(params, lr=1e-3)
    x = torch.randn(a.tokens, a.hidden, device=dev, dtype=torch.bfloat16)
    times = []
    for _ in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        h = x
        for l in layers:
            h = torch.relu(l(h))
        loss = h.float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_host = loss.item()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    steady = sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0]
    # A traced run's early steps may be absorbed by the snapshot ring; its last half shows
    # what the tracer keeps up with.
    half = sorted(times[len(times) // 2:])
    late = half[len(half) // 2]
    print(f"overhead.py: hidden {a.hidden} tokens {a.tokens} layers {a.layers}: first step "
          f"{times[0]*1e3:.1f} ms, median later step {steady*1e3:.2f} ms, median of the last "
          f"half {late*1e3:.2f} ms, loss {loss_host:.6f}")


if __name__ == "__main__":
    main()
