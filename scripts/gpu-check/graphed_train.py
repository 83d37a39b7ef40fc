"""Training with a CUDA graph on a real GPU, for scripts/gpu-check.sh: compare across eager and
graphed runs.

A small MLP (Linear-ReLU-Linear, FP32, MSE loss, SGD) trains STEPS steps on fixed batches, as
in PyTorch's whole-network capture example (docs "CUDA Graphs"):
  eager        every step run eagerly;
  graphed      three warm-up steps eagerly on a side stream, then the whole step (forward,
               backward, optimizer) captured once into a torch.cuda.graph and replayed for the
               remaining steps, each batch copied into the static input first;
  graphed-bug  the same, with the loss doubled inside the captured step only (every gradient of
               the replayed steps twice what it should be: the "gradient scaled twice" bug).
The replays run the kernels the eager steps run, so `ttrace compare eager graphed` must match,
and `ttrace compare eager graphed-bug` must name a tensor of the first replayed step.

Usage: graphed_train.py MODE [STEPS]
"""

import sys

import torch

WARMUP = 3


def main(mode, steps):
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda:0")
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 128)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.MSELoss()
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 256, generator=gen), torch.randn(64, 128, generator=gen)) for _ in range(steps)]
    static_x = torch.zeros(64, 256, device=dev)
    static_y = torch.zeros(64, 128, device=dev)

    def step(scale=1.0):
        loss = loss_fn(model(static_x), static_y) * scale
        loss.backward()
        opt.step()
        return loss

    losses = []
    if mode == "eager":
        for x, y in batches:
            static_x.copy_(x)
            static_y.copy_(y)
            opt.zero_grad(set_to_none=True)
            losses.append(step().clone())
    else:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for x, y in batches[:WARMUP]:
                static_x.copy_(x)
                static_y.copy_(y)
                opt.zero_grad(set_to_none=True)
                losses.append(step().clone())
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            static_loss = step(2.0 if mode == "graphed-bug" else 1.0)
        for x, y in batches[WARMUP:]:
            static_x.copy_(x)
            static_y.copy_(y)
            g.replay()
            losses.append(static_loss.clone())
    torch.cuda.synchronize()
    print(f"graphed_train {mode}: losses " + " ".join(f"{l.item():.6f}" for l in losses))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6)
