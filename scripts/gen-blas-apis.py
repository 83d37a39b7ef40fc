#!/usr/bin/env python3
"""Generate the files of the two cuBLAS APIs beside `_v2` that ttrace records as gaps: for
each, libttrace.so's gap hooks and the simulator's exports of the routines it does not compute.

* `xt`, cuBLAS-XT (`cublasXt.h`): BLAS-3 spread over several devices, on host or device
  matrices, with streams and copies of its own. Each successful call of a routine that moves
  matrices records an `unsupported` gap naming it. XT's one `void*` is the CPU routine of
  `cublasXtSetCpuRoutine`, a function, not data.
* `legacy`, the legacy API (`cublas.h`: the handle-less `cublasSgemm`, `cublasSdot`, ... that
  libcublas still exports). Its handle is cuBLAS's own, its stream the one
  `cublasSetKernelStream` set, and a call reports failure only through `cublasGetError`, which
  clears it: each call of a routine that moves tensor data records a gap whatever its outcome.
  Names the `_v2` API shares (cublasSetVector, ...; declared in cublas_api.h, next to
  cublas.h) are hooked already and left out.

A routine moves tensor data when a parameter points to numbers (float, double, cuComplex,
cuDoubleComplex), the rule tests/integration/tests/it/intercept_census.rs checks the built
library against. Signatures are translated by scripts/gen-sim-unsupported.py's translation; the
ABI checks compile the files against the headers again. The simulator's hand-written functions
(tests/sim/cublas/src/xt.rs, legacy.rs) are left out of `sim`.

    python3 scripts/gen-blas-apis.py xt hooks .nvidia-headers/cublas/include/cublasXt.h \\
        > intercept/src/hooks/cublasxt_routines.rs
    python3 scripts/gen-blas-apis.py xt sim .nvidia-headers/cublas/include/cublasXt.h \\
        > tests/sim/cublas/src/xt_unsupported.rs
    python3 scripts/gen-blas-apis.py legacy hooks .nvidia-headers/cublas/include/cublas.h \\
        > intercept/src/hooks/cublas_legacy.rs
    python3 scripts/gen-blas-apis.py legacy sim .nvidia-headers/cublas/include/cublas.h \\
        > tests/sim/cublas/src/legacy_unsupported.rs
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("gen_sim_unsupported", HERE / "gen-sim-unsupported.py")
sim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sim)
sim.SCALARS["char"] = "c_char"

DATA = re.compile(r"\b(float|double|cuComplex|cuDoubleComplex)\s*(const\s*)?\*")
DECL = re.compile(r"(\w+)\s+CUBLASWINAPI\s+(cublas\w+)\s*\(([^;]*?)\)\s*;")
RETURNS = {
    "void": "()",
    "float": "f32",
    "double": "f64",
    "int": "c_int",
    "cuComplex": "cuComplex",
    "cuDoubleComplex": "cuDoubleComplex",
    "cublasStatus_t": "cublasStatus_t",
}

# Per API: the hook file's documentation, imports and macro; the simulator file's documentation,
# hand-written module and imports.
FAMILIES = {
    "xt": {
        "header": "cublasXt.h",
        "hooks_doc": [
            "The cuBLAS-XT routines (BLAS-3 over several devices, on host or device matrices):",
            "not captured; each successful call records an `unsupported` gap naming it, so that",
            "no such call is a silent hole. A failed call moved nothing and records none.",
        ],
        "hooks_use": ["use super::cublas::{gap_without_stream, xt_gap, MISSING};"],
        "macro": "xt_gap",
        "what": "not captured (a gap).",
        "sim_doc": [
            "The cuBLAS-XT routines the simulator does not compute (tests/sim/cublas/src/xt.rs",
            "computes the others): each checks its handle and returns",
            "`CUBLAS_STATUS_NOT_SUPPORTED` (`CUBLAS_STATUS_NOT_INITIALIZED` for a null handle).",
        ],
        "hand": "xt.rs",
        "ffi": None,
    },
    "legacy": {
        "header": "cublas.h",
        "hooks_doc": [
            "The legacy cuBLAS API (no handle; the stream `cublasSetKernelStream` set): not",
            "captured. Each call of a routine that moves tensor data records an `unsupported` gap",
            "naming it, whatever its outcome (only `cublasGetError`, which clears it, would say).",
        ],
        "hooks_use": ["use super::cublas::legacy_gap;"],
        "macro": "legacy_gap",
        "what": "(legacy API): not captured (a gap).",
        "sim_doc": [
            "The legacy cuBLAS routines the simulator does not compute (tests/sim/cublas/src/",
            "legacy.rs computes the others): each leaves `CUBLAS_STATUS_NOT_SUPPORTED` for",
            "`cublasGetError` and returns zero.",
        ],
        "hand": "legacy.rs",
        "ffi": "use core::ffi::{c_char, c_int};",
    },
}


def data_movers(family: str, header: pathlib.Path) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(name, Rust return type, parameters) of the routines of `family` that move tensor data,
    in name order."""
    text = header.read_text()
    shared: set[str] = set()
    if family == "legacy":
        shared = set(re.findall(r"\b(cublas\w+)\s*\(", header.with_name("cublas_api.h").read_text()))
    out = []
    for ret, name, params in DECL.findall(text):
        ret = "cublasStatus_t" if ret == "cublasStatus" else ret
        if family == "xt" and not name.startswith("cublasXt"):
            continue
        if name in shared or ret not in RETURNS:
            continue
        if not any(DATA.search(p) for p in params.split(",")):
            continue
        _, ps = sim.declaration(text, name)
        if family == "xt":
            assert ret == "cublasStatus_t" and ps and ps[0][1] == "cublasXtHandle_t", name
        out.append((name, RETURNS[ret], ps))
    return sorted(out)


def header_lines(doc: list[str], header: str) -> None:
    print(f"//! Generated by scripts/gen-blas-apis.py from NVIDIA's `{header}`: do not edit.")
    print("//!")
    for line in doc:
        print(f"//! {line}")
    print("#![allow(clippy::too_many_arguments)]")
    print()


def hooks(family: str, header: pathlib.Path) -> None:
    f = FAMILIES[family]
    header_lines(f["hooks_doc"], f["header"])
    if f["ffi"]:
        print(f["ffi"])
        print()
    print("use cuda_abi::cublas::*;")
    if family == "xt":
        print("use ttrace_proto::record::GapReason;")
    print()
    for line in f["hooks_use"]:
        print(line)
    print("use crate::{mode, real};")
    for name, ret, params in data_movers(family, header):
        args = "".join(f"        {sim.snake(p)}: {t},\n" for p, t in params)
        tail = "=> Unsupported" if family == "xt" else f"-> {ret}"
        print()
        print(f"{f['macro']}! {{")
        print(f"    /// `{name}` {f['what']}" if family == "legacy" else f"    /// `{name}`: {f['what']}")
        print(f"    {name}(\n{args}    ) {tail}")
        print("}")


def simulated(family: str, header: pathlib.Path) -> None:
    f = FAMILIES[family]
    hand_file = HERE.parent / "tests/sim/cublas/src" / f["hand"]
    hand = set(re.findall(r"\bfn (cublas\w+)\s*\(", hand_file.read_text()))
    header_lines(f["sim_doc"], f["header"])
    if f["ffi"]:
        print(f["ffi"])
        print()
    print("use cuda_abi::cublas::*;")
    print()
    print(f"use crate::{family}::unsupported;")
    for name, ret, params in data_movers(family, header):
        if name in hand:
            continue
        args = "".join(f"    _{sim.snake(p)}: {t},\n" for p, t in params)
        call = f'unsupported("{name}")'
        if family == "xt":
            # The handle is checked: keep its name.
            h = sim.snake(params[0][0])
            args = args.replace(f"    _{h}:", f"    {h}:", 1)
            call = f'unsupported("{name}", {h})'
        ret = "" if ret == "()" else f" -> {ret}"
        print()
        print("#[no_mangle]")
        print(f"pub unsafe extern \"C\" fn {name}(\n{args}){ret} {{")
        print(f"    {call}")
        print("}")


def main() -> int:
    if len(sys.argv) != 4 or sys.argv[1] not in FAMILIES or sys.argv[2] not in ("hooks", "sim"):
        print(__doc__, file=sys.stderr)
        return 2
    family, header = sys.argv[1], pathlib.Path(sys.argv[3])
    (hooks if sys.argv[2] == "hooks" else simulated)(family, header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
