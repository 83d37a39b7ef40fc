"""A jitted JAX step big enough for XLA's command buffers, for scripts/gpu-check.sh.

Three f32 matmuls with tanh between them, called STEPS times. With XLA's defaults the step
runs as a CUDA graph built by XLA (each cuBLAS call captured from a stream, then nested as a
child-graph node, launched with cuGraphLaunch): ttrace cannot snapshot inside such a graph and
must say so, one `graph_capture` gap per launch naming the captured ops. With
XLA_FLAGS=--xla_gpu_enable_command_buffer= the matmuls are eager cuBLASLt calls, each
captured. On an H200 (JAX 0.11): 5 gaps naming 3 ops each, then 15 `cublasLtMatmul` records.

Usage: jax_step.py [STEPS]
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def step(x, w1, w2, w3):
    h = jnp.tanh(x @ w1)
    h = jnp.tanh(h @ w2) + 0.5 * h
    y = h @ w3
    return y, jnp.sum(y * y)


def main(steps):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((256, 512)), jnp.float32)
    ws = [
        jnp.asarray(rng.standard_normal(s) * 0.05, jnp.float32)
        for s in ((512, 512), (512, 512), (512, 128))
    ]
    for i in range(steps):
        _, loss = step(x + i, *ws)
        loss.block_until_ready()
    print(f"jax_step: {jax.devices()[0]}: loss {float(loss):.4f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
