#!/usr/bin/env python3
"""Generate tests/sim/cublas/src/unsupported.rs: the cuBLAS entry points the simulator does not
compute (level-1/2/3 BLAS other than the GEMMs, complex types, batched LAPACK-like helpers)
but that programs import, PyTorch among them, so they must exist with NVIDIA's signatures.

Each generated function validates its handle like every simulated entry point and then
returns CUBLAS_STATUS_NOT_SUPPORTED. The signatures are translated from NVIDIA's
cublas_api.h (fetched by scripts/fetch-nvidia-headers.py; never committed), and the ABI check
(tests/integration/tests/it/abi.rs) compiles the generated Rust signatures against that header
again, so a translation error fails CI. Run after changing NAMES:

    python3 scripts/gen-sim-unsupported.py .nvidia-headers/cublas/include/cublas_api.h \
        > tests/sim/cublas/src/unsupported.rs
"""

from __future__ import annotations

import pathlib
import re
import sys

# The symbols (as exported: `_v2` names) PyTorch 2.10/2.15 import that the simulator lacks.
NAMES = """
cublasCaxpy_v2 cublasCcopy_v2 cublasCdotc_v2 cublasCdotu_v2 cublasCgelsBatched cublasCgemmBatched
cublasCgemmStridedBatched cublasCgemm_v2 cublasCgemv_v2 cublasCgeqrfBatched cublasCgerc_v2
cublasCgeru_v2 cublasCgetrfBatched cublasCgetrsBatched cublasChemm_v2 cublasChemv_v2
cublasCher2_v2 cublasCher2k_v2 cublasCher_v2 cublasCherk_v2 cublasCrot_v2 cublasCrotg_v2
cublasCscal_v2 cublasCsrot_v2 cublasCsscal_v2 cublasCswap_v2 cublasCsymm_v2 cublasCsymv_v2
cublasCsyr2_v2 cublasCsyr2k_v2 cublasCsyr_v2 cublasCsyrk_v2 cublasCtrmm_v2 cublasCtrmv_v2
cublasCtrsmBatched cublasCtrsm_v2 cublasCtrsv_v2 cublasDasum_v2 cublasDaxpy_v2 cublasDcopy_v2
cublasDdot_v2 cublasDgelsBatched 
cublasDgeqrfBatched cublasDger_v2 cublasDgetrfBatched cublasDgetrsBatched cublasDnrm2_v2
cublasDotEx cublasDrot_v2 cublasDrotg_v2 cublasDrotm_v2 cublasDrotmg_v2 cublasDscal_v2
cublasDswap_v2 cublasDsymm_v2 cublasDsymv_v2 cublasDsyr2_v2 cublasDsyr2k_v2 cublasDsyr_v2
cublasDsyrk_v2 cublasDtrmm_v2 cublasDtrmv_v2 cublasDtrsmBatched cublasDtrsm_v2 cublasDtrsv_v2
cublasDzasum_v2 cublasDznrm2_v2 cublasIcamax_v2
cublasIcamin_v2 cublasIdamax_v2 cublasIdamin_v2 cublasIsamax_v2 cublasIsamin_v2 cublasIzamax_v2
cublasIzamin_v2 cublasSasum_v2 cublasScasum_v2 cublasScnrm2_v2 cublasScopy_v2
cublasSgelsBatched
cublasSgeqrfBatched cublasSger_v2 cublasSgetrfBatched
cublasSgetrsBatched cublasSnrm2_v2 cublasSrot_v2 cublasSrotg_v2 cublasSrotm_v2 cublasSrotmg_v2
cublasSswap_v2 cublasSsymm_v2 cublasSsymv_v2 cublasSsyr2_v2 cublasSsyr2k_v2
cublasSsyr_v2 cublasSsyrk_v2 cublasStrmm_v2 cublasStrmv_v2 cublasStrsmBatched cublasStrsm_v2
cublasStrsv_v2 cublasZaxpy_v2 cublasZcopy_v2 cublasZdotc_v2 cublasZdotu_v2 cublasZdrot_v2
cublasZdscal_v2 cublasZgelsBatched cublasZgemmBatched cublasZgemmStridedBatched cublasZgemm_v2
cublasZgemv_v2 cublasZgeqrfBatched cublasZgerc_v2 cublasZgeru_v2 cublasZgetrfBatched
cublasZgetrsBatched cublasZhemm_v2 cublasZhemv_v2 cublasZher2_v2 cublasZher2k_v2 cublasZher_v2
cublasZherk_v2 cublasZrot_v2 cublasZrotg_v2 cublasZscal_v2 cublasZswap_v2 cublasZsymm_v2
cublasZsymv_v2 cublasZsyr2_v2 cublasZsyr2k_v2 cublasZsyr_v2 cublasZsyrk_v2 cublasZtrmm_v2
cublasZtrmv_v2 cublasZtrsmBatched cublasZtrsm_v2 cublasZtrsv_v2
"""
# Entry points libttrace.so hooks (as gaps) that no program of the tests computes: they exist so
# that every hook can be called on the simulated stack (tests/integration/tests/it/intercept_abi.rs).
HOOKED = """
cublasCgemm3mBatched cublasCgemmBatched_64 cublasZgemmBatched_64 cublasCgemm3mBatched_64
cublasSgemmGroupedBatched cublasDgemmGroupedBatched cublasSgemmGroupedBatched_64
cublasDgemmGroupedBatched_64 cublasGemmGroupedBatchedEx cublasGemmGroupedBatchedEx_64
cublasSgemvBatched cublasDgemvBatched cublasCgemvBatched cublasZgemvBatched cublasHSHgemvBatched
cublasHSSgemvBatched cublasTSTgemvBatched cublasTSSgemvBatched cublasSgemvBatched_64
cublasDgemvBatched_64 cublasCgemvBatched_64 cublasZgemvBatched_64 cublasHSHgemvBatched_64
cublasHSSgemvBatched_64 cublasTSTgemvBatched_64 cublasTSSgemvBatched_64 cublasCgemm3m
cublasZgemm3m cublasCgemm_v2_64 cublasCgemm3m_64 cublasZgemm_v2_64 cublasZgemm3m_64
cublasCgemm3mStridedBatched cublasCgemmStridedBatched_64 cublasZgemmStridedBatched_64
cublasCgemm3mStridedBatched_64 cublasCgemmEx cublasCgemm3mEx cublasCgemmEx_64 cublasCgemm3mEx_64
cublasSgemvStridedBatched cublasDgemvStridedBatched cublasCgemvStridedBatched
cublasZgemvStridedBatched cublasHSHgemvStridedBatched cublasHSSgemvStridedBatched
cublasTSTgemvStridedBatched cublasTSSgemvStridedBatched cublasSgemvStridedBatched_64
cublasDgemvStridedBatched_64 cublasCgemvStridedBatched_64 cublasZgemvStridedBatched_64
cublasHSHgemvStridedBatched_64 cublasHSSgemvStridedBatched_64 cublasTSTgemvStridedBatched_64
cublasTSSgemvStridedBatched_64 cublasCgemv_v2_64 cublasZgemv_v2_64
"""
NAMES = (NAMES + HOOKED).split()
# Every cuBLAS routine libttrace.so records as a gap (scripts/gen-blas-gaps.py), so that each hook
# can be called on the simulated stack, except those the simulator computes (written by hand in
# the crate's other modules).
_REPO = pathlib.Path(__file__).resolve().parent.parent
_HAND = set()
for _f in (_REPO / "tests/sim/cublas/src").glob("*.rs"):
    if _f.name != "unsupported.rs":
        _HAND |= set(re.findall(r"\bfn (cublas\w+)\s*\(", _f.read_text()))
_ROUTINES = _REPO / "intercept/src/hooks/cublas_routines.rs"
if _ROUTINES.exists():
    NAMES += sorted(set(re.findall(r"^    (cublas\w+)\($", _ROUTINES.read_text(), re.M)) - set(NAMES))
NAMES = [n for n in NAMES if n not in _HAND]

SCALARS = {
    "int": "c_int",
    "int64_t": "i64",
    "c_longlong": "c_longlong",
    "size_t": "usize",
    "float": "f32",
    "double": "f64",
    "void": "c_void",
    "cuComplex": "cuComplex",
    "cuDoubleComplex": "cuDoubleComplex",
    "uchar": "u8",
    "schar": "i8",
}


def rust_type(ctype: str) -> str:
    """`const float* const A[]` style C parameter types to Rust raw pointers."""
    t = ctype.strip()
    array = t.endswith("[]")
    if array:
        t = t[:-2].strip()
    # Tokens: qualifiers and stars, read right to left.
    t = re.sub(r"\blong long int\b|\blong long\b", "c_longlong", t)
    t = re.sub(r"\bunsigned char\b", "uchar", t)
    t = re.sub(r"\bsigned char\b", "schar", t)
    toks = re.findall(r"\*|const|[A-Za-z_][A-Za-z_0-9]*", t)
    base = [x for x in toks if x not in ("*", "const")]
    if len(base) != 1:
        raise ValueError(f"cannot translate {ctype!r}")
    name = base[0]
    rust = SCALARS.get(name, name)
    # Walk: each '*' wraps; a 'const' before the base or right after it qualifies the pointee.
    idx = toks.index(name)
    pointee_const = "const" in toks[:idx] or (idx + 1 < len(toks) and toks[idx + 1] == "const")
    rest = toks[idx + 1 :]
    if rest and rest[0] == "const":
        rest = rest[1:]
    cur = rust
    cur_const = pointee_const
    i = 0
    levels = []
    while i < len(rest):
        if rest[i] == "*":
            c = i + 1 < len(rest) and rest[i + 1] == "const"
            levels.append(c)
            i += 2 if c else 1
        else:
            i += 1
    for c in levels:
        cur = f"*{'const' if cur_const else 'mut'} {cur}"
        cur_const = c
    if array:
        # `T x[]` is a pointer parameter; `T const x[]` can't occur in cuBLAS.
        cur = f"*{'const' if cur_const else 'mut'} {cur}"
    return cur


def declaration(header: str, name: str) -> tuple[str, list[tuple[str, str]]]:
    m = re.search(r"(\w+)\s+CUBLASWINAPI\s+" + re.escape(name) + r"\s*\(([^;]*?)\)\s*;", header)
    if not m:
        raise SystemExit(f"{name}: no declaration in the header")
    ret, params = m.group(1), m.group(2)
    out = []
    for p in params.split(","):
        p = " ".join(p.split())
        if p in ("", "void"):
            continue
        pm = re.match(r"(.*?)([A-Za-z_]\w*)\s*(\[\])?$", p)
        if not pm:
            raise SystemExit(f"{name}: cannot parse parameter {p!r}")
        ctype = pm.group(1) + ("[]" if pm.group(3) else "")
        out.append((pm.group(2), rust_type(ctype)))
    return ret, out


def snake(s: str) -> str:
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", s).lower()
    return "r#" + s if s in ("type", "ref", "in", "fn", "mod", "match") else s


def main() -> int:
    header = open(sys.argv[1]).read()
    print("//! Generated by scripts/gen-sim-unsupported.py from NVIDIA's `cublas_api.h`: do not edit.")
    print("//!")
    print("//! cuBLAS entry points the simulator does not compute (non-GEMM BLAS, complex types,")
    print("//! batched factorisations). They exist with NVIDIA's signatures so that programs that")
    print("//! import them (PyTorch does) load; each checks its handle and returns")
    print("//! `CUBLAS_STATUS_NOT_SUPPORTED` (`CUBLAS_STATUS_NOT_INITIALIZED` for a bad handle).")
    print("#![allow(clippy::too_many_arguments)]")
    print()
    print("use core::ffi::{c_int, c_longlong, c_void};")
    print()
    decls = {name: declaration(header, name) for name in NAMES}
    print("use cuda_abi::cublas::*;")
    # Only when a signature takes a stream (an unused import fails clippy -D warnings).
    if any(t == "cudaStream_t" for _, ps in decls.values() for _, t in ps):
        print("use cuda_abi::cudart::cudaStream_t;")
    print("use cuda_abi::library_types::*;")
    print()
    print("use crate::unsupported_call;")
    for name in NAMES:
        ret, params = decls[name]
        assert ret == "cublasStatus_t", name
        handle = next((p for p, t in params if t == "cublasHandle_t"), None)
        print()
        print("#[no_mangle]")
        args = "".join(f"    _{snake(p)}: {t},\n" for p, t in params)
        args = args.replace(f"    _{snake(handle)}:", f"    {snake(handle)}:") if handle else args
        print(f"pub unsafe extern \"C\" fn {name}(\n{args}) -> cublasStatus_t {{")
        h = f"Some({snake(handle)})" if handle else "None"
        print(f"    unsupported_call(\"{name}\", {h})")
        print("}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
