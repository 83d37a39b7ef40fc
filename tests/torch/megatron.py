"""A Megatron-style tensor + data parallel model in plain torch.distributed, for `ttrace compare`.

Two MLP blocks, `y = x + fc2(gelu(fc1(x)))`, trained for STEPS steps with SGD on a fixed global
batch per step, optionally in micro-batches whose weight gradients accumulate on the device
(the same data, micro-batches and initial weights at any world size):

* block 1 is sequence parallel: each tensor-parallel rank holds a chunk of the tokens, an
  all-gather makes the block's input, fc1 is column-parallel (its output features split over
  TP), fc2 row-parallel (its input features split), and a reduce-scatter sums fc2's partial
  outputs and hands each TP rank its chunk back;
* block 2 is plain tensor parallel: an all-gather rebuilds the full input, fc3 column-parallel,
  fc4 row-parallel with the all-reduce of its partial outputs;
* the backward mirrors it (the column-parallel input gradient's all-reduce, the all-gather that
  undoes the reduce-scatter), and each weight gradient is summed over the data-parallel group
  (the loss is divided by the global token count, so the sum is the reference's gradient);
* the loss is summed over the data-parallel group (a one-element all-reduce).

The simulated device runs GEMMs and collectives but no kernels, so element-wise work (GELU, the
residual, the loss, SGD) is host work with real copies to and from the device, as a program on
a GPU would do it in kernels. Weights are persistent device tensors updated in place by a copy
(fp32), or cast from fp32 master weights into fresh bf16 tensors every step (bf16).

World 1 is the reference (tp=1, dp=1); `torchrun --nproc-per-node 4` runs tp=2 dp=2 (TP groups
{0,1} {2,3}, DP groups {0,2} {1,3}).

Bugs (`--bug`), each silent (the run finishes, the loss looks plausible):
  no-row-allreduce  block 2 skips fc4's all-reduce: each TP rank keeps its partial sum
  neighbour-shard   global rank 1 loads TP rank 0's shard of fc1 (a wrong shard offset)
  avg-not-sum       fc4's all-reduce averages where a sum is due (ncclAvg)
  grad-scaled-twice the loss gradient is divided by the DP size once more
  no-dp-allreduce   fc4's weight gradient is never summed over the DP group
  wrong-sp-chunk    global rank 3 contributes TP rank 0's token chunk to block 1's all-gather

Usage: megatron.py --precision fp32|bf16 [--bug NAME] [--steps N] [--micro-batches M]
       (world 1 directly, or under torchrun --nproc-per-node 4)
"""

import argparse
import os

os.environ.setdefault("TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_WARNING", "false")

import torch
import torch.distributed as dist
import torch.nn.functional as F

TOKENS, HIDDEN, FFN = 32, 48, 128
LR = 0.02
BUGS = ("no-row-allreduce", "neighbour-shard", "avg-not-sum", "grad-scaled-twice",
        "no-dp-allreduce", "wrong-sp-chunk")


class Layout:
    """Where this process sits: rank r has tp rank r % tp and dp rank r // tp."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.tp = 2 if self.world == 4 else 1
        self.dp = self.world // self.tp
        assert self.tp * self.dp == self.world, f"world {self.world}: only 1 and 4 are laid out"
        self.tp_rank, self.dp_rank = self.rank % self.tp, self.rank // self.tp
        self.dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        self.tp_group = self.dp_group = None

    def init(self):
        torch.cuda.set_device(self.dev)
        if self.world == 1:
            return
        dist.init_process_group("nccl", device_id=self.dev)
        # Every rank creates every group, in the same order.
        for g in range(self.dp):
            grp = dist.new_group([g * self.tp + t for t in range(self.tp)])
            if g == self.dp_rank:
                self.tp_group = grp
        for t in range(self.tp):
            grp = dist.new_group([g * self.tp + t for g in range(self.dp)])
            if t == self.tp_rank:
                self.dp_group = grp

    def rows(self, n, parts, index):
        size = n // parts
        return slice(index * size, (index + 1) * size)


def full_weights():
    """The canonical fp32 weights, the same at every world size."""
    g = torch.Generator().manual_seed(1234)
    w = lambda o, i: torch.randn(o, i, generator=g) / i**0.5
    return {"fc1": w(FFN, HIDDEN), "fc2": w(HIDDEN, FFN), "fc3": w(FFN, HIDDEN), "fc4": w(HIDDEN, FFN)}


def batch(step):
    """Step `step`'s global batch: inputs and targets, [TOKENS, HIDDEN] each."""
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(TOKENS, HIDDEN, generator=g), torch.randn(TOKENS, HIDDEN, generator=g) * 0.5


def gelu_grad(h):
    """d gelu(h) / dh, erf form (host)."""
    cdf = 0.5 * (1.0 + torch.erf(h / 2**0.5))
    pdf = torch.exp(-0.5 * h * h) / (2 * torch.pi) ** 0.5
    return cdf + h * pdf


class Model:
    def __init__(self, lay, dtype, bug):
        self.lay, self.dtype, self.bug = lay, dtype, bug
        full = full_weights()
        tp, t = lay.tp, lay.tp_rank
        col = lambda w, i: w[lay.rows(w.shape[0], tp, i)].clone()
        row = lambda w: w[:, lay.rows(w.shape[1], tp, t)].clone()
        fc1_shard = 0 if (bug == "neighbour-shard" and lay.rank == 1) else t
        # fp32 master weights on the host; SGD updates them.
        self.master = {"fc1": col(full["fc1"], fc1_shard), "fc2": row(full["fc2"]),
                       "fc3": col(full["fc3"], t), "fc4": row(full["fc4"])}
        self.dev_w = {k: v.to(lay.dev) for k, v in self.master.items()} if dtype == torch.float32 else None

    def weights(self):
        """The device weights of this step: the persistent fp32 tensors, or fresh bf16 casts."""
        if self.dev_w is not None:
            return self.dev_w
        return {k: v.to(self.dtype).to(self.lay.dev) for k, v in self.master.items()}

    def to_dev(self, t):
        return t.to(self.dtype).to(self.lay.dev)

    def all_gather_tp(self, chunk):
        if self.lay.tp == 1:
            return chunk
        out = torch.empty((chunk.shape[0] * self.lay.tp,) + tuple(chunk.shape[1:]), dtype=chunk.dtype, device=chunk.device)
        dist.all_gather_into_tensor(out, chunk, group=self.lay.tp_group)
        return out

    def all_reduce_tp(self, t, op=dist.ReduceOp.SUM):
        if self.lay.tp > 1:
            dist.all_reduce(t, op=op, group=self.lay.tp_group)
        return t

    def reduce_scatter_tp(self, t):
        if self.lay.tp == 1:
            return t
        out = torch.empty((t.shape[0] // self.lay.tp,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        dist.reduce_scatter_tensor(out, t, group=self.lay.tp_group)
        return out

    def micro_batch(self, w, x_dp, target, grads):
        """Forward and backward of one micro-batch (this DP rank's rows); weight gradients
        accumulate into `grads` on the device. Returns the micro-batch's share of the loss."""
        lay, bug = self.lay, self.bug
        n_local = x_dp.shape[0]
        chunk_of = lambda i: lay.rows(n_local, lay.tp, i)
        sp = 0 if (bug == "wrong-sp-chunk" and lay.rank == 3) else lay.tp_rank
        host = lambda t: t.cpu().float()

        # Block 1, sequence parallel.
        x1 = self.all_gather_tp(self.to_dev(x_dp[chunk_of(sp)]))
        h1 = F.linear(x1, w["fc1"])
        h1_h = host(h1)
        g1 = self.to_dev(F.gelu(h1_h))
        y1 = self.reduce_scatter_tp(F.linear(g1, w["fc2"]))
        z_chunk = x_dp[chunk_of(lay.tp_rank)] + host(y1)
        # Block 2, tensor parallel.
        x2 = self.all_gather_tp(self.to_dev(z_chunk))
        h2 = F.linear(x2, w["fc3"])
        h2_h = host(h2)
        g2 = self.to_dev(F.gelu(h2_h))
        y2 = F.linear(g2, w["fc4"])
        if bug != "no-row-allreduce":
            self.all_reduce_tp(y2, dist.ReduceOp.AVG if bug == "avg-not-sum" else dist.ReduceOp.SUM)
        out = host(x2) + host(y2)

        # Loss: squared error summed over the global batch's tokens / TOKENS.
        diff = out - target
        loss = (diff * diff).sum().item() / TOKENS
        dy_h = 2.0 * diff / TOKENS
        if bug == "grad-scaled-twice":
            dy_h = dy_h / lay.dp
        dy = self.to_dev(dy_h)

        def weight_grad(name, a, b):
            # The first micro-batch writes the gradient, later ones accumulate (beta = 1).
            if name in grads:
                grads[name].addmm_(a, b)
            else:
                grads[name] = torch.mm(a, b)

        # Block 2 backward: fc4 (row-parallel), GELU, fc3 (column-parallel).
        weight_grad("fc4", dy.t(), g2)
        dg2 = torch.mm(dy, w["fc4"])
        dh2 = self.to_dev(host(dg2) * gelu_grad(h2_h))
        weight_grad("fc3", dh2.t(), x2)
        dx2 = self.all_reduce_tp(torch.mm(dh2, w["fc3"]))
        # The residual and the all-gather's backward: this TP rank's token chunk.
        dz_chunk = host(dx2)[chunk_of(lay.tp_rank)] + dy_h[chunk_of(lay.tp_rank)]
        # Block 1 backward: the reduce-scatter's backward is an all-gather.
        dy1 = self.all_gather_tp(self.to_dev(dz_chunk))
        weight_grad("fc2", dy1.t(), g1)
        dg1 = torch.mm(dy1, w["fc2"])
        dh1 = self.to_dev(host(dg1) * gelu_grad(h1_h))
        weight_grad("fc1", dh1.t(), x1)
        return loss

    def step(self, s, micro_batches, same_batch=False):
        lay = self.lay
        x_all, target_all = batch(0 if same_batch else s)
        w = self.weights()
        grads, loss = {}, 0.0
        per_mb = TOKENS // micro_batches
        for m in range(micro_batches):
            # Micro-batch m is rows [m * per_mb, (m + 1) * per_mb) of the global batch; this
            # DP rank takes its slice of them.
            rows = slice(m * per_mb, (m + 1) * per_mb)
            mine = lay.rows(per_mb, lay.dp, lay.dp_rank)
            loss += self.micro_batch(w, x_all[rows][mine], target_all[rows][mine], grads)

        # Data-parallel gradient sums, then SGD on the host.
        for name in ("fc1", "fc2", "fc3", "fc4"):
            if lay.dp > 1 and not (self.bug == "no-dp-allreduce" and name == "fc4"):
                dist.all_reduce(grads[name], group=lay.dp_group)
        loss_dev = torch.tensor([loss]).to(lay.dev)
        if lay.dp > 1:
            dist.all_reduce(loss_dev, op=dist.ReduceOp.SUM, group=lay.dp_group)
        for name, gr in grads.items():
            self.master[name] -= LR * gr.cpu().float()
            if self.dev_w is not None:
                self.dev_w[name].copy_(self.master[name])
        return loss_dev.item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--bug", choices=BUGS)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--micro-batches", type=int, default=1, help="gradient accumulation")
    p.add_argument("--same-batch", action="store_true", help="train on step 0's batch every step")
    a = p.parse_args()
    lay = Layout()
    lay.init()
    dtype = torch.float32 if a.precision == "fp32" else torch.bfloat16
    model = Model(lay, dtype, a.bug)
    for s in range(a.steps):
        loss = model.step(s, a.micro_batches, a.same_batch)
        if lay.rank == 0:
            print(f"step {s}: loss {loss:.6f}", flush=True)
    torch.cuda.synchronize()
    if lay.world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
