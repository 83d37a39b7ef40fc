#!/usr/bin/env python3
"""Fetch NVIDIA's CUDA, cuBLAS, NCCL and NVTX C headers from their PyPI wheels.

The ABI test (tests/integration/tests/it/abi.rs) and the C smoke program compile against NVIDIA's
own headers, on machines without a CUDA toolkit. The headers ship in the `nvidia-*-cu12` wheels;
this script extracts only their `nvidia/<lib>/include/` folders into a cache directory
(default: <repo>/.nvidia-headers, gitignored):

    <dest>/<lib>/include/...      one folder per wheel, e.g. cuda_runtime/include/cuda_runtime_api.h
    <dest>/nvtx/lib/libnvToolsExt.so.1   and one library: NVIDIA's NVTX v2 library (no GPU
                                  needed), which the NVTX tests run against (LIBRARIES below)
    <dest>/include-dirs.txt       the include folders, one per line, in -I order
    <dest>/manifest.json          wheel name, version, URL and PyPI's sha256 of each wheel

The cuBLAS and NCCL wheels are 300-600 MB and the headers a few hundred KB, so the wheels are
read in place: HTTP Range requests fetch the zip central directory and the header members only
(zipfile checks each member's CRC-32). A server that ignores Range gets a full download, checked
against PyPI's sha256. Stdlib only. Idempotent: a wheel already extracted at the pinned version
is skipped. Prints the include folders on stdout, one per line; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

# (PyPI name, pinned version). Order is the -I order.
WHEELS = [
    ("nvidia-cuda-runtime-cu12", "12.8.90"),  # cuda_runtime_api.h, driver_types.h, library_types.h
    ("nvidia-cuda-nvcc-cu12", "12.8.93"),  # crt/host_defines.h
    ("nvidia-cuda-cccl-cu12", "12.8.90"),  # nv/target (pulled in by cuda_fp16.h)
    ("nvidia-cuda-profiler-api-cu12", "12.8.90"),  # cuda_profiler_api.h (cudaProfilerStart/Stop)
    ("nvidia-cublas-cu12", "12.8.4.1"),  # cublas_v2.h, cublasLt.h
    ("nvidia-nccl-cu12", "2.27.5"),  # nccl.h
    ("nvidia-nvtx-cu12", "12.8.90"),  # nvToolsExt.h (NVTX v2 API) and nvtx3/
]

# CUDA 13 (what torch 2.15 is built with: cuda-toolkit 13.2.2, NCCL 2.30.7): `--cuda 13`.
# These wheels have no -cu13 suffix (NCCL's does) and put every header of the toolkit under one
# folder, nvidia/cu13/include, which the wheels share.
WHEELS_13 = [
    ("nvidia-cuda-runtime", "13.2.86"),
    ("nvidia-cuda-nvcc", "13.2.86"),
    ("nvidia-cuda-crt", "13.2.86"),  # crt/host_defines.h, crt/host_runtime.h (split out of nvcc in 13)
    ("nvidia-cuda-cccl", "13.2.86"),
    ("nvidia-cuda-profiler-api", "13.2.86"),
    ("nvidia-cublas", "13.4.1.3"),
    ("nvidia-nccl-cu13", "2.30.7"),
    ("nvidia-nvtx", "13.2.86"),
]

PYPI = "https://pypi.org/pypi"
USER_AGENT = "ttrace-fetch-nvidia-headers/1 (+stdlib urllib)"
TIMEOUT_S = 60
RETRIES = 4
BLOCK = 1 << 20  # Range request granularity: the central directory and headers are small.


def log(msg: str) -> None:
    print(f"fetch-nvidia-headers: {msg}", file=sys.stderr, flush=True)


def request(url: str, headers: dict[str, str] | None = None):
    """urlopen with retries on transient errors; returns the open response."""
    hdrs = {"User-Agent": USER_AGENT, **(headers or {})}
    last: Exception | None = None
    for attempt in range(RETRIES):
        try:
            return urllib.request.urlopen(urllib.request.Request(url, headers=hdrs), timeout=TIMEOUT_S)
        except urllib.error.HTTPError as e:
            if e.code < 500 and e.code != 429:
                raise
            last = e
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            last = e
        time.sleep(1.5 * (attempt + 1))
    assert last is not None
    raise last


def wheel_info(name: str, version: str) -> dict:
    """The manylinux x86_64 wheel of name==version, from PyPI's JSON API."""
    doc = f"{PYPI}/{name}/{version}/json"
    try:
        with request(doc) as r:
            files = json.load(r)["urls"]
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise
        # Some mirrors serve only the project-level document; it lists every release.
        doc = f"{PYPI}/{name}/json"
        with request(doc) as r:
            files = json.load(r)["releases"].get(version) or []
    wheels = [
        f
        for f in files
        if f["filename"].endswith(".whl") and "manylinux" in f["filename"] and f["filename"].endswith("x86_64.whl")
    ]
    if not wheels:
        raise SystemExit(f"fetch-nvidia-headers: PyPI has no manylinux x86_64 wheel of {name}=={version}")
    w = wheels[0]
    # Mirrors may give URLs relative to the JSON document.
    url = urllib.parse.urljoin(doc, w["url"])
    return {"filename": w["filename"], "url": url, "sha256": w["digests"]["sha256"], "size": w["size"]}


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over HTTP Range requests, with a block cache."""

    def __init__(self, url: str, size: int):
        super().__init__()
        self.url, self.size, self.pos = url, size, 0
        self.blocks: dict[int, bytes] = {}
        self.requests = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, off: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + off)
        return self.pos

    def _block(self, i: int) -> bytes:
        if i not in self.blocks:
            lo, hi = i * BLOCK, min(self.size, (i + 1) * BLOCK) - 1
            with request(self.url, {"Range": f"bytes={lo}-{hi}"}) as r:
                if r.status != 206:
                    raise RangeUnsupported(f"HTTP {r.status} to a Range request")
                data = r.read()
            if len(data) != hi - lo + 1:
                raise RangeUnsupported(f"asked for {hi - lo + 1} bytes, got {len(data)}")
            self.requests += 1
            self.blocks[i] = data
        return self.blocks[i]

    def readinto(self, b) -> int:
        n = min(len(b), self.size - self.pos)
        if n <= 0:
            return 0
        out = memoryview(b)
        done = 0
        while done < n:
            i, off = divmod(self.pos + done, BLOCK)
            chunk = self._block(i)[off : off + n - done]
            out[done : done + len(chunk)] = chunk
            done += len(chunk)
        self.pos += n
        return n


class RangeUnsupported(Exception):
    pass


def remote_size(url: str) -> int | None:
    """The file size from a 1-byte Range request, or None when the server ignores Range."""
    with request(url, {"Range": "bytes=0-0"}) as r:
        if r.status != 206:
            return None
        cr = r.headers.get("Content-Range", "")
        r.read()
    try:
        return int(cr.rsplit("/", 1)[1])
    except (IndexError, ValueError):
        return None


# Libraries taken from the wheels beside the headers: NVIDIA's NVTX v2 library, which loads an
# NVTX tool as libttrace.so must handle it (it runs without a GPU; tests/.../intercept_nvtx.rs).
LIBRARIES = ("nvidia/nvtx/lib/libnvToolsExt.so.1",)


def header_members(zf: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    """`nvidia/<lib>/include/**` files, and the [`LIBRARIES`] the wheel holds."""
    out = []
    for zi in zf.infolist():
        parts = zi.filename.split("/")
        if zi.is_dir():
            continue
        if (len(parts) >= 4 and parts[0] == "nvidia" and parts[2] == "include") or zi.filename in LIBRARIES:
            out.append(zi)
    return out


def extract(zf: zipfile.ZipFile, tmp: Path) -> list[str]:
    """Extracts the include members under tmp/<lib>/include (and the libraries under
    tmp/<lib>/lib); returns the <lib> names."""
    libs = set()
    members = header_members(zf)
    if not members:
        raise SystemExit("fetch-nvidia-headers: the wheel has no nvidia/*/include/ files")
    for zi in members:
        rel = Path(*zi.filename.split("/")[1:])  # <lib>/include/...
        if ".." in rel.parts:
            raise SystemExit(f"fetch-nvidia-headers: unsafe member name {zi.filename!r}")
        target = tmp / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(zi) as src, open(target, "wb") as dst:  # zipfile checks the CRC-32
            shutil.copyfileobj(src, dst)
        libs.add(rel.parts[0])
    return sorted(libs)


def fetch_wheel(info: dict, tmp: Path) -> tuple[list[str], str]:
    """Extracts the wheel's headers into tmp; returns (lib folders, how it was read)."""
    size = remote_size(info["url"])
    if size is not None:
        try:
            rf = RangeFile(info["url"], size)
            with zipfile.ZipFile(io.BufferedReader(rf, buffer_size=BLOCK)) as zf:
                libs = extract(zf, tmp)
            return libs, f"range requests ({rf.requests} x {BLOCK >> 10} KiB of {size >> 20} MiB)"
        except RangeUnsupported as e:
            log(f"range reads failed ({e}); downloading the whole wheel")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
    with tempfile.TemporaryFile() as f:
        h = hashlib.sha256()
        with request(info["url"]) as r:
            while chunk := r.read(BLOCK):
                h.update(chunk)
                f.write(chunk)
        if h.hexdigest() != info["sha256"]:
            raise SystemExit(f"fetch-nvidia-headers: sha256 mismatch for {info['filename']}")
        f.seek(0)
        with zipfile.ZipFile(f) as zf:
            libs = extract(zf, tmp)
    return libs, "full download, sha256 verified"


def main() -> int:
    repo = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", type=Path, default=repo / ".nvidia-headers", help="cache directory (default: %(default)s)")
    ap.add_argument("--force", action="store_true", help="fetch again even when present")
    ap.add_argument("--cuda", type=int, choices=(12, 13), default=12, help="CUDA major (default 12; 13 goes to DEST/cuda13 unless --dest is given)")
    args = ap.parse_args()
    wheels = WHEELS if args.cuda == 12 else WHEELS_13
    if args.cuda == 13 and args.dest == repo / ".nvidia-headers":
        args.dest = repo / ".nvidia-headers" / "cuda13"
    dest: Path = args.dest.resolve()
    dest.mkdir(parents=True, exist_ok=True)

    # Concurrent test binaries may run this at the same time: one fetches, the others wait.
    with open(dest / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest_path = dest / "manifest.json"
        manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
        for name, version in wheels:
            entry = manifest.get(name)
            if (
                not args.force
                and entry
                and entry.get("version") == version
                and all((dest / lib / "include").is_dir() for lib in entry.get("libs", []))
                # A cache made before LIBRARIES were taken is completed.
                and all((dest / Path(*m.split("/")[1:])).is_file() for m in LIBRARIES if m.split("/")[1] in entry.get("libs", []))
            ):
                continue
            info = wheel_info(name, version)
            log(f"{name}=={version}: {info['filename']}")
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=dest))
            try:
                libs, how = fetch_wheel(info, tmp)
                for lib in libs:
                    # Merged, not replaced: CUDA 13 wheels share the folder `cu13`.
                    shutil.copytree(tmp / lib, dest / lib, dirs_exist_ok=True)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            log(f"{name}=={version}: {', '.join(libs)} via {how}")
            manifest[name] = {"version": version, "libs": libs, **info}
            # Written after each wheel, so that an interrupted run resumes where it stopped.
            manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")

        dirs = []
        for name, _ in wheels:
            for lib in manifest[name]["libs"]:
                d = str(dest / lib / "include")
                if d not in dirs:
                    dirs.append(d)
        (dest / "include-dirs.txt").write_text("".join(d + "\n" for d in dirs))
    for d in dirs:
        print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
