#!/usr/bin/env python3
"""Generate stub libraries for the CUDA libraries a PyPI torch wheel links but ttrace's
simulated stack does not provide (cuDNN, cuFFT, cuSPARSE, cuSPARSELt, cuRAND, cuFile, NVSHMEM,
CUPTI, nvJitLink, cuSOLVER, NVRTC).

torch's shared libraries name these in DT_NEEDED and Python loads extensions with RTLD_NOW, so
every symbol torch imports from them must exist for `import torch` to succeed, although the
copy / cuBLAS / cuBLASLt / NCCL paths that ttrace traces never call them. NVIDIA's wheels for
them are ~2.5 GB; instead this script reads the undefined dynamic symbols (with their version
nodes) of torch's own ELF files with `readelf`, and builds, with `gcc`, one library per soname
that defines exactly those symbols under those version nodes. Nothing here is NVIDIA's code:
each stub function writes one line to stderr naming itself and returns a non-zero status (for
the few that return strings, a static string), so a call that does happen is visible.

Usage:
    scripts/torch-stubs.py --torch-lib VENV/lib/python3.X/site-packages/torch/lib --out DIR

Libraries the simulated stack provides (cudart, cublas, cublasLt, nccl, nvToolsExt, cuda) are
skipped. Idempotent: a stub whose C source is unchanged is not rebuilt. Prints DIR.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

# Sonames the simulated stack (target/<profile>/sim) provides; never stubbed.
SIMULATED = re.compile(r"^lib(cudart|cublas|cublasLt|nccl|nvToolsExt|cuda)\.so\.\d+$")
# Sonames that are NVIDIA libraries (stub candidates) rather than system libraries.
NVIDIA = re.compile(
    r"^lib(cudnn|cufft|cusparse|cusparseLt|curand|cufile|nvshmem_host|cupti|nvJitLink|"
    r"cusolver|nvrtc|cudart|cublas|cublasLt|nccl|nvToolsExt|cuda)\.so\.\d+$"
)
# Unversioned imports are attributed to a library by prefix (longest first).
PREFIXES = [
    ("cusparseLt", "libcusparseLt.so"),
    ("cusparse", "libcusparse.so"),
    ("cusolver", "libcusolver.so"),
    ("cudnn", "libcudnn.so"),
    ("cufft", "libcufft.so"),
    ("curand", "libcurand.so"),
    ("cuFile", "libcufile.so"),
    ("nvshmem", "libnvshmem_host.so"),
    ("cupti", "libcupti.so"),
    ("Cupti", "libcupti.so"),
    ("nvJitLink", "libnvJitLink.so"),
    ("nvrtc", "libnvrtc.so"),
]
# Version nodes that are not the soname itself.
VERSION_NODES = {"NVSHMEM": "libnvshmem_host.so"}


def log(msg: str) -> None:
    print(f"torch-stubs: {msg}", file=sys.stderr, flush=True)


def elf_files(torch_lib: Path) -> list[Path]:
    """torch's shared objects: torch/lib/*.so* and torch/_C*.so (and other extension modules)."""
    files = sorted(p for p in torch_lib.glob("*.so*") if p.is_file())
    files += sorted(p for p in torch_lib.parent.glob("*.so") if p.is_file())
    return files


def needed(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "-dW", str(path)], capture_output=True, text=True, check=True)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out.stdout)


def undefined(path: Path) -> list[tuple[str, str, str | None]]:
    """(name, type FUNC/OBJECT/NOTYPE, version node or None) of each undefined dynamic symbol."""
    out = subprocess.run(
        ["readelf", "-W", "--dyn-syms", str(path)], capture_output=True, text=True, check=True
    )
    syms = []
    for line in out.stdout.splitlines():
        cols = line.split()
        if len(cols) < 8 or cols[6] != "UND" or not cols[7]:
            continue
        name, kind = cols[7], cols[3]
        version = None
        if "@" in name:
            name, _, version = name.partition("@")
            version = version.lstrip("@")
        syms.append((name, kind, version))
    return syms


def collect(torch_lib: Path) -> dict[str, dict[str, tuple[str, str | None]]]:
    """soname -> {symbol: (type, version node)} for every stubbed library torch imports from."""
    stems = {}  # "libcudnn.so" -> "libcudnn.so.9"
    for f in elf_files(torch_lib):
        for soname in needed(f):
            if NVIDIA.match(soname) and not SIMULATED.match(soname):
                stems[soname.rsplit(".", 1)[0]] = soname
    # Libraries torch dlopens (not in DT_NEEDED) but whose symbols it imports, e.g. libnvrtc via
    # libcaffe2_nvrtc, are in DT_NEEDED of that file and so already found above.
    libs: dict[str, dict[str, tuple[str, str | None]]] = defaultdict(dict)
    for f in elf_files(torch_lib):
        for name, kind, version in undefined(f):
            soname = None
            if version:
                stem = VERSION_NODES.get(version, version.rsplit(".", 1)[0])
                soname = stems.get(stem)
            else:
                for prefix, stem in PREFIXES:
                    if name.startswith(prefix):
                        soname = stems.get(stem)
                        break
            if soname is None:
                continue
            libs[soname][name] = (kind, version)
    for soname in stems.values():
        libs.setdefault(soname, {})
    return libs


def c_source(soname: str, syms: dict[str, tuple[str, str | None]]) -> str:
    lines = [
        f"/* Generated by scripts/torch-stubs.py: stub {soname} for torch's imports. */",
        "#include <stdio.h>",
        "static int stub_called(const char *name) {",
        f'  fprintf(stderr, "ttrace torch stub: %s called ({soname} is a stub)\\n", name);',
        "  return 1; /* a non-zero status: every NVIDIA library's first error code */",
        "}",
    ]
    for name, (kind, _) in sorted(syms.items()):
        if kind == "OBJECT":
            lines.append(f"char {name}[64];")
        elif re.search(r"Get(Error)?(String|Name)$", name):
            lines.append(f'const char *{name}(void) {{ stub_called("{name}"); return "{soname} stub"; }}')
        else:
            lines.append(f'int {name}(void) {{ return stub_called("{name}"); }}')
    return "\n".join(lines) + "\n"


def version_script(soname: str, syms: dict[str, tuple[str, str | None]]) -> str | None:
    """A version script putting each symbol under the node torch imports it with."""
    nodes: dict[str, list[str]] = defaultdict(list)
    for name, (_, version) in syms.items():
        if version:
            nodes[version].append(name)
    if not nodes:
        return None
    unversioned = sorted(n for n, (_, v) in syms.items() if not v)
    parts = []
    for i, (node, names) in enumerate(sorted(nodes.items())):
        body = "".join(f"  {n};\n" for n in sorted(names + (unversioned if i == 0 else [])))
        parts.append(f"{node} {{\n global:\n{body}" + (" local: *;\n" if i == 0 else "") + "};\n")
    return "".join(parts)


def build(out: Path, soname: str, syms: dict[str, tuple[str, str | None]]) -> None:
    src = c_source(soname, syms)
    c_path = out / f"{soname}.c"
    so_path = out / soname
    if so_path.exists() and c_path.exists() and c_path.read_text() == src:
        return
    c_path.write_text(src)
    cmd = ["gcc", "-shared", "-fPIC", "-O0", "-o", str(so_path), str(c_path), f"-Wl,-soname,{soname}"]
    vs = version_script(soname, syms)
    if vs:
        vs_path = out / f"{soname}.map"
        vs_path.write_text(vs)
        cmd.append(f"-Wl,--version-script={vs_path}")
    subprocess.run(cmd, check=True)
    log(f"{soname}: {len(syms)} symbols")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--torch-lib", required=True, type=Path, help="site-packages/torch/lib")
    ap.add_argument("--out", required=True, type=Path, help="folder for the stub libraries")
    args = ap.parse_args()
    if not (args.torch_lib / "libtorch_cuda.so").exists():
        log(f"{args.torch_lib} has no libtorch_cuda.so: not a CUDA build of torch")
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for soname, syms in sorted(collect(args.torch_lib).items()):
        build(args.out, soname, syms)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
