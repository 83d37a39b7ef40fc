"""JAX on a real GPU, for scripts/gpu-check.sh: a framework that links no CUDA library.

JAX's XLA plugin dlopens cuBLAS, cuBLASLt, NCCL and the runtime and takes every entry point
with dlsym(handle, name), which LD_PRELOAD interposition alone never sees (a traced JAX matmul
once left an empty store); ttrace's interposed dlsym hands it the hooks. Runs a bf16 and an
f32 matmul (x @ w, with row-major operands) and saves the operands and results as probe.py does
(NAME.bin plus expected.json), so that check.py can look each one up among the captured
tensors. XLA's own copies go through the driver API, which ttrace does not hook: the uploads
are not expected among the captured tensors, only the GEMMs' operands and outputs.

Usage: jax_probe.py OUT_DIR
"""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np


def main(out):
    os.makedirs(out, exist_ok=True)
    saved = {}

    def save(name, a):
        a = np.ascontiguousarray(np.asarray(a))
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(a.tobytes())
        saved[name] = {"dtype": str(a.dtype), "shape": list(a.shape), "nbytes": a.nbytes}

    rng = np.random.default_rng(0)
    for dtype, name in ((jnp.float32, "f32"), (jnp.bfloat16, "bf16")):
        x = jnp.asarray(rng.standard_normal((96, 64)), dtype=dtype)
        w = jnp.asarray(rng.standard_normal((64, 48)), dtype=dtype)
        y = jnp.matmul(x, w, precision=jax.lax.Precision.HIGHEST).block_until_ready()
        save(f"jax_{name}_x", x)
        save(f"jax_{name}_w", w)
        save(f"jax_{name}_out", y)
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(saved, f, indent=1)
    print(f"jax_probe: {jax.devices()[0]}: saved {len(saved)} tensors to {out}")


if __name__ == "__main__":
    main(sys.argv[1])
