"""ttrace from Python: read trace stores captured by ``libttrace.so`` and run ``compare`` and
``check`` on them.

>>> import ttrace
>>> run = ttrace.open("ttrace-runs/20261124T101500Z-torchrun-abc-r0")
>>> run.ranks, run.steps(0)
([0, 1, 2, 3], [0, 1])
>>> rec = run.records(rank=0, step=0)[5]
>>> rec.api, [t.role for t in rec.tensors]
('cublasGemmEx', ['A', 'B', 'C', 'D'])
>>> d = rec.numpy("D")             # exact dtype: ml_dtypes.bfloat16 for BF16
>>> report = ttrace.compare("runs/ref", run.path, perturbed="runs/ref-p")
>>> report.verdict, report.code
('divergence', 1)
>>> report                        # in Jupyter: the HTML report

Reading goes through ttrace's own Rust reader (``ttrace._native``); ``compare`` and ``check``
run the ``ttrace`` command this package ships, so their results are exactly the CLI's JSON.
Errors are :class:`TraceError` with the CLI's messages.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from ._native import Store as _NativeStore
from ._native import TraceError, __version__

__all__ = [
    "Record",
    "Report",
    "Store",
    "Tensor",
    "TraceError",
    "check",
    "cli_path",
    "compare",
    "lib_path",
    "numpy_dtype",
    "open",
    "__version__",
]

_PLAIN = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U64": np.uint64,
    "U32": np.uint32,
    "U16": np.uint16,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
_TORCH = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a ttrace dtype name (``"BF16"``, ``"F8_E4M3"``, ...); BF16 and FP8
    come from ``ml_dtypes`` and are bit-exact."""
    if name in _PLAIN:
        return np.dtype(_PLAIN[name])
    if name in _ML_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, _ML_DTYPES[name]))
    raise TraceError(f"unknown dtype {name!r}")


_HERE = Path(__file__).resolve().parent


def _bundled(name: str) -> Optional[Path]:
    p = _HERE / "_bin" / name
    return p if p.is_file() else None


def cli_path() -> Path:
    """The ``ttrace`` executable: the one shipped in this package, else ``TTRACE_CLI``, else
    ``ttrace`` on ``PATH`` (a console script of this package is skipped: it is a shim)."""
    p = _bundled("ttrace")
    if p is not None:
        return p
    env = os.environ.get("TTRACE_CLI")
    if env:
        return Path(env)
    import shutil

    found = shutil.which("ttrace")
    if found is None:
        raise TraceError("no ttrace executable: install the ttrace wheel or set TTRACE_CLI")
    return Path(found)


def lib_path() -> Path:
    """``libttrace.so`` as shipped in this package: ``LD_PRELOAD=$(python -m ttrace lib) CMD``."""
    p = _bundled("libttrace.so")
    if p is None:
        raise TraceError("this ttrace package ships no libttrace.so (a development install?)")
    return p


class Tensor:
    """One tensor of a record: its metadata; the values come from :meth:`Record.numpy`."""

    __slots__ = ("index", "role", "dtype", "shape", "strides", "nbytes", "captured", "crc32",
                 "stored_bytes", "ptr")

    def __init__(self, index: int, meta: Dict[str, Any]):
        self.index: int = index
        self.role: str = meta["role"]
        self.dtype: str = meta["dtype"]
        self.shape: List[int] = list(meta["shape"])
        self.strides: List[int] = list(meta.get("strides", []))
        self.nbytes: int = meta["nbytes"]
        self.captured: bool = meta["captured"]
        self.crc32: int = meta["crc32"]
        self.stored_bytes: Optional[int] = meta.get("stored_bytes")
        self.ptr: int = meta.get("ptr", 0)

    def __repr__(self) -> str:
        state = "" if self.captured else ", metadata only"
        return f"Tensor({self.role} {self.dtype}{self.shape}{state})"


class Record:
    """One captured op (a copy, a GEMM, a collective) or a gap, with its tensors."""

    def __init__(self, store: "Store", meta: Dict[str, Any]):
        self._store = store
        #: The record as ``ttrace show --json`` prints it (tensors with ``stored_bytes``).
        self.meta: Dict[str, Any] = meta
        self.rank: int = meta["rank"]
        self.step: int = meta["step"]
        self.seq: int = meta["seq"]
        self.api: str = meta["api"]
        #: The op's family and parameters (``op["family"]``: memcpy, gemm, collective, gap...).
        self.op: Dict[str, Any] = meta["op"]
        self.nvtx: List[str] = meta.get("nvtx", [])
        self.kernels_before: List[str] = meta.get("kernels_before", [])
        self.stream: int = meta.get("stream", 0)
        self.device: int = meta.get("device", 0)
        self.tensors: List[Tensor] = [Tensor(i, t) for i, t in enumerate(meta["tensors"])]

    @property
    def is_gap(self) -> bool:
        """Whether this record stands for something that was not captured (and why: ``op``)."""
        return self.op.get("family") == "gap"

    def tensor(self, which: Union[int, str]) -> Tensor:
        """A tensor by index or role (``"A"``, ``"D"``, ``"Send"``, ...)."""
        if isinstance(which, int):
            return self.tensors[which]
        for t in self.tensors:
            if t.role == which:
                return t
        raise TraceError(f"{self}: no tensor with role {which!r}")

    def bytes(self, which: Union[int, str]) -> np.ndarray:
        """A tensor's stored bytes, decoded and checked against its CRC-32 (``uint8``)."""
        t = self.tensor(which)
        return self._store._native.tensor_bytes(self.rank, self.step, self.seq, t.index)

    def numpy(self, which: Union[int, str]) -> np.ndarray:
        """A tensor's values in its exact dtype and stored shape (GEMM operands column-major
        as cuBLAS holds them: a rows x cols matrix has shape ``[cols, rows]``)."""
        t = self.tensor(which)
        return self.bytes(t.index).view(numpy_dtype(t.dtype)).reshape(t.shape)

    def torch(self, which: Union[int, str]):
        """A tensor's values as a ``torch.Tensor`` (CPU), dtype exact (BF16/FP8 included)."""
        import torch

        t = self.tensor(which)
        raw = torch.from_numpy(self.bytes(t.index))
        return raw.view(getattr(torch, _TORCH[t.dtype])).reshape(t.shape)

    def __repr__(self) -> str:
        return f"Record(rank {self.rank} step {self.step} seq {self.seq} {self.api})"


class Store:
    """A trace store (a run directory written by ``ttraced``)."""

    def __init__(self, path: Union[str, os.PathLike]):
        self.path = Path(path)
        self._native = _NativeStore(os.fspath(path))
        text = self._native.manifest_json()
        #: manifest.json (command, environment, capture settings, ranks, communicators, job).
        self.manifest: Optional[Dict[str, Any]] = json.loads(text) if text else None

    @property
    def ranks(self) -> List[int]:
        """Ranks with at least one segment."""
        return list(self._native.ranks())

    def steps(self, rank: int) -> List[int]:
        """Steps of ``rank``."""
        return list(self._native.steps(rank))

    @property
    def comms(self) -> List[Dict[str, Any]]:
        """Communicators (key, size, members: the global rank of each communicator rank)."""
        return list((self.manifest or {}).get("comms", []))

    @property
    def issues(self) -> List[Dict[str, Any]]:
        """What the reader found damaged or missing when it opened the store."""
        return json.loads(self._native.issues_json())

    def records(self, rank: int, step: int) -> List[Record]:
        """The records of one rank and step, in seq order (gaps included)."""
        recs, _issues = self._native.records_json(rank, step)
        return [Record(self, m) for m in json.loads(recs)]

    def record(self, rank: int, step: int, seq: int) -> Record:
        """One record."""
        for r in self.records(rank, step):
            if r.seq == seq:
                return r
        raise TraceError(f"{self.path}: no record rank {rank} step {step} seq {seq}")

    def __iter__(self) -> Iterator[Record]:
        """Every record, by rank, step and seq."""
        for rank in self.ranks:
            for step in self.steps(rank):
                yield from self.records(rank, step)

    def gaps(self) -> List[Record]:
        """Every gap record: what was not captured, and why."""
        return [r for r in self if r.is_gap]

    def __repr__(self) -> str:
        return f"ttrace.Store({str(self.path)!r}, ranks={self.ranks})"


def open(path: Union[str, os.PathLike]) -> Store:  # noqa: A001 - mirrors the CLI's wording
    """Opens a trace store."""
    return Store(path)


class Report:
    """A ``compare`` or ``check`` report: the CLI's JSON (``data``), its exit code (0: match or
    nothing found, 1: divergence or findings, 5: a match or nothing found in a capture that
    lost data) and, for compare, the HTML report."""

    def __init__(self, kind: str, code: int, data: Dict[str, Any], html: Optional[str]):
        self.kind = kind
        self.code = code
        self.data = data
        self.html = html

    @property
    def verdict(self) -> Any:
        """compare: the verdict; check: whether anything was found ("findings", "clean", or
        "incomplete" when nothing was found in a capture that lost data)."""
        if "verdict" in self.data:
            return self.data["verdict"]
        return {1: "findings", 5: "incomplete"}.get(self.code, "clean")

    @property
    def complete(self) -> bool:
        """Whether the stores lost nothing (gaps, snapshots never published, records not
        stored or unreadable): a match of an incomplete capture covers only what was
        captured (exit code 5)."""
        return self.code != 5

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def to_json(self) -> str:
        """The report as the CLI writes it with ``--json``."""
        return json.dumps(self.data, indent=2)

    def _repr_html_(self) -> str:
        if self.html is not None:
            import html as _html

            # The report is a whole page with its own script: an iframe keeps it apart.
            return (
                '<iframe style="width:100%;height:640px;border:0" srcdoc="'
                + _html.escape(self.html, quote=True)
                + '"></iframe>'
            )
        import html as _html

        return "<pre>" + _html.escape(self.to_json()) + "</pre>"

    def __repr__(self) -> str:
        return f"ttrace.Report({self.kind}, verdict={self.verdict!r}, code={self.code})"


def _run_cli(args: Sequence[str], kind: str, json_path: Path, html_path: Optional[Path]) -> Report:
    proc = subprocess.run([os.fspath(cli_path()), *args], capture_output=True, text=True)
    # 5: a match (or nothing found) in a capture that lost data: a report like the others.
    if proc.returncode not in (0, 1, 5) or not json_path.exists():
        msg = proc.stderr.strip() or f"ttrace {kind} exited {proc.returncode}"
        if msg.startswith("error: "):
            msg = msg[len("error: "):]
        raise TraceError(msg)
    data = json.loads(json_path.read_text())
    html = html_path.read_text() if html_path is not None and html_path.exists() else None
    return Report(kind, proc.returncode, data, html)


def compare(
    reference: Union[str, os.PathLike],
    run: Union[str, os.PathLike],
    *,
    perturbed: Optional[Union[str, os.PathLike]] = None,
    steps: Optional[str] = None,
    layout: Optional[str] = None,
    html: bool = True,
) -> Report:
    """``ttrace compare REFERENCE RUN``: the first tensor beyond round-off, and where the bug
    lies. ``steps`` (``"0-2"``) and ``layout`` (``"tp=2,dp=2"``) as on the command line."""
    with tempfile.TemporaryDirectory(prefix="ttrace-") as tmp:
        j, h = Path(tmp) / "report.json", Path(tmp) / "report.html"
        args = ["compare", os.fspath(reference), os.fspath(run), "--json", os.fspath(j)]
        if html:
            args += ["--html", os.fspath(h)]
        if perturbed is not None:
            args += ["--perturbed", os.fspath(perturbed)]
        if steps is not None:
            args += ["--steps", steps]
        if layout is not None:
            args += ["--layout", layout]
        return _run_cli(args, "compare", j, h if html else None)


def check(run: Union[str, os.PathLike]) -> Report:
    """``ttrace check RUN``: collective semantics, replica consistency and the first NaN/Inf,
    without a reference."""
    with tempfile.TemporaryDirectory(prefix="ttrace-") as tmp:
        j = Path(tmp) / "check.json"
        return _run_cli(["check", os.fspath(run), "--json", os.fspath(j)], "check", j, None)
