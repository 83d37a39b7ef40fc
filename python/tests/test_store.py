"""The installed `ttrace` package against the installed `ttrace` CLI, on stores traced with
that CLI from the fixture trainer on the simulated CUDA stack (scripts/test-python.sh sets
TTRACE_TEST_BIN to the directory holding `trainer`, `simrun` and `sim/`).

Every tensor read from Python equals `ttrace export`'s bytes; record metadata equals
`ttrace show --json`; compare and check reports equal the CLI's JSON; BF16 and FP8 come back
bit-exact; errors carry the CLI's messages."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ttrace

BIN = Path(os.environ.get("TTRACE_TEST_BIN", "target/release")).resolve()
VENV_BIN = Path(sys.executable).parent


def installed_ttrace() -> str:
    exe = VENV_BIN / "ttrace"
    assert exe.exists(), f"the wheel's console script is missing: {exe}"
    return str(exe)


def sim_env() -> dict:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(BIN / "sim")
    for k in ("TTRACE_LIB", "TTRACE_DAEMON", "TTRACE_PERTURB", "LD_PRELOAD", "TTRACE_SOCKET"):
        env.pop(k, None)
    return env


def traced(out: Path, *cmd: str) -> Path:
    proc = subprocess.run(
        [installed_ttrace(), "run", "--quiet", "--out", str(out), "--", *cmd],
        env=sim_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="session")
def stores(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("stores")
    trainer, simrun = str(BIN / "trainer"), str(BIN / "simrun")
    model = ["--steps", "2", "--precision", "bf16"]
    return {
        "ref": traced(root / "ref", trainer, *model),
        "run": traced(
            root / "run",
            simrun, "--nproc-per-node", "4", "--",
            trainer, "--tp", "2", "--dp", "2", *model, "--bug", "tp-row-parallel-no-reduce",
        ),
        "fp8": traced(root / "fp8", trainer, "--steps", "1", "--precision", "fp8"),
    }


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([installed_ttrace(), *args], capture_output=True, text=True)


def read_safetensors(path: Path) -> dict:
    """name -> (dtype, shape, bytes), by the format's definition (8-byte header length,
    JSON header, data)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        out[name] = (h["dtype"], h["shape"], data[a:b])
    return out


@pytest.mark.parametrize("which", ["run", "fp8"])
def test_every_tensor_equals_the_export(stores, tmp_path, which):
    store = ttrace.open(stores[which])
    out = tmp_path / "export"
    p = cli("export", str(stores[which]), "--format", "safetensors", "--out", str(out))
    assert p.returncode == 0, p.stderr
    index = json.loads((out / "index.json").read_text())
    entries = index["tensors"] if isinstance(index, dict) else index
    files = {}
    checked = 0
    for e in entries:
        f = out / e["file"]
        if f not in files:
            files[f] = read_safetensors(f)
        dtype, shape, raw = files[f][e["name"]]
        rec = store.record(e["rank"], e["step"], e["seq"])
        t = rec.tensor(e["tensor"]) if "tensor" in e else rec.tensor(e["role"])
        got = rec.numpy(t.index)
        assert got.dtype == ttrace.numpy_dtype(dtype)
        assert list(got.shape) == list(shape) == t.shape
        assert got.tobytes() == raw, f"{rec} {t}"
        checked += 1
    assert checked > 50


def test_record_metadata_equals_show_json(stores):
    store = ttrace.open(stores["run"])
    for rank in store.ranks:
        for step in store.steps(rank):
            p = cli("show", str(stores["run"]), "--rank", str(rank), "--step", str(step), "--json")
            assert p.returncode == 0, p.stderr
            shown = json.loads(p.stdout)["records"]
            mine = store.records(rank, step)
            assert len(mine) == len(shown)
            for r, s in zip(mine, shown):
                for t in s["tensors"]:
                    t.pop("stats", None)
                meta = json.loads(json.dumps(r.meta))
                for t in meta["tensors"]:
                    t.pop("strides", None)
                    t.pop("ptr", None)
                for t in s["tensors"]:
                    t.pop("strides", None)
                    t.pop("ptr", None)
                common = {k: meta[k] for k in s if k in meta}
                assert common == s, f"{r}"


def test_bf16_and_fp8_come_back_bit_exact(stores):
    import ml_dtypes

    for which, want in (("run", ml_dtypes.bfloat16), ("fp8", ml_dtypes.float8_e4m3fn)):
        store = ttrace.open(stores[which])
        found = False
        for rec in store:
            for t in rec.tensors:
                if t.captured and ttrace.numpy_dtype(t.dtype) == np.dtype(want):
                    v = rec.numpy(t.index)
                    assert v.dtype == np.dtype(want)
                    assert v.view(np.uint8).tobytes() == rec.bytes(t.index).tobytes()
                    found = True
                    break
            if found:
                break
        assert found, f"no {want} tensor in {which}"


def test_store_overview_matches_the_manifest(stores):
    store = ttrace.open(stores["run"])
    m = store.manifest
    assert m is not None and m["finalized"]
    assert store.ranks == sorted({r["rank"] for r in m["ranks"]}) == [0, 1, 2, 3]
    assert store.steps(0) == [0, 1]
    assert len(store.comms) == len(m["comms"]) and store.comms
    assert store.issues == []
    assert store.gaps() == []
    total = sum(r["records"] for r in m["ranks"])
    assert sum(1 for _ in store) == total


def test_compare_and_check_equal_the_cli_json(stores, tmp_path):
    rep = ttrace.compare(stores["ref"], stores["run"])
    j = tmp_path / "c.json"
    p = cli("compare", str(stores["ref"]), str(stores["run"]), "--json", str(j))
    assert p.returncode == rep.code == 1, p.stderr
    cli_data = json.loads(j.read_text())
    # Wall time is the one field two runs of the same comparison do not share.
    for d in (rep.data, cli_data):
        d["stats"].pop("elapsed_s")
    assert rep.data == cli_data
    assert rep.verdict == rep.data["verdict"]
    assert "<iframe" in rep._repr_html_() and rep.html and "<html" in rep.html.lower()

    chk = ttrace.check(stores["run"])
    j2 = tmp_path / "k.json"
    p = cli("check", str(stores["run"]), "--json", str(j2))
    assert p.returncode == chk.code
    assert chk.data == json.loads(j2.read_text())


def test_a_match_of_a_capture_that_lost_data_is_a_report_not_clean(stores, tmp_path):
    # The simulator refuses one snapshot copy into the ring: a copy_refused gap in the run.
    trainer = str(BIN / "trainer")
    env = sim_env()
    env["SIM_CUDA_REFUSE_REGISTERED_COPY"] = "20"
    out = tmp_path / "lossy"
    proc = subprocess.run(
        [installed_ttrace(), "run", "--quiet", "--out", str(out), "--", trainer,
         "--steps", "2", "--precision", "bf16"],
        env=env, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    rep = ttrace.compare(stores["ref"], out)
    assert rep.code == 5 and rep.verdict == "match" and not rep.complete
    assert rep["capture_losses"][0]["gaps"] == {"copy_refused": 1}
    chk = ttrace.check(out)
    assert chk.code == 5 and chk.verdict == "incomplete" and not chk.complete
    assert ttrace.compare(stores["ref"], stores["ref"]).complete


def test_errors_carry_the_cli_messages(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ttrace.TraceError) as e:
        ttrace.open(missing)
    assert str(missing) in str(e.value)
    with pytest.raises(ttrace.TraceError) as e:
        ttrace.compare(missing, missing)
    p = cli("compare", str(missing), str(missing))
    assert p.returncode == 2
    assert str(e.value) in p.stderr


def test_torch_tensors_when_torch_is_importable(stores):
    torch = pytest.importorskip("torch")
    store = ttrace.open(stores["run"])
    rec = next(r for r in store if r.api.lower().find("gemm") >= 0 or "Matmul" in r.api)
    t = next(t for t in rec.tensors if t.captured)
    x = rec.torch(t.index)
    want = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}
    if t.dtype in want:
        assert x.dtype == want[t.dtype]
    assert list(x.shape) == t.shape
    assert x.view(torch.uint8).numpy().tobytes() == rec.bytes(t.index).tobytes()


def test_the_package_ships_its_executables():
    lib = ttrace.lib_path()
    assert lib.name == "libttrace.so" and lib.stat().st_size > 0
    assert ttrace.cli_path().parent == lib.parent
    p = subprocess.run([sys.executable, "-m", "ttrace", "lib"], capture_output=True, text=True)
    assert p.stdout.strip() == str(lib)
    assert shutil.which("ttraced", path=str(VENV_BIN))


REPO = Path(__file__).resolve().parents[2]


def test_a_torch_script_traced_with_the_installed_ttrace_reads_back_byte_exact(tmp_path):
    """Real PyTorch (the torch 2.10 venv of tests/torch, when scripts/torch-venv.sh made it)
    traced by the wheel's `ttrace run`: every tensor torch saw is a captured tensor read
    from Python."""
    venvs = Path(os.environ.get("TTRACE_TORCH_VENVS", Path.home() / ".cache/ttrace-venvs"))
    py = venvs / "torch-2.10.0" / "bin" / "python"
    if not py.exists():
        pytest.skip(f"no torch 2.10.0 venv at {py.parent.parent} (scripts/torch-venv.sh 2.10.0)")
    torch_dir = subprocess.run(
        [str(py), "-c", "import os, importlib.util as u; print(os.path.dirname(u.find_spec('torch').origin))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    stubs = tmp_path / "stubs"
    subprocess.run(
        ["python3", str(REPO / "scripts/torch-stubs.py"), "--torch-lib", f"{torch_dir}/lib",
         "--out", str(stubs)],
        check=True, capture_output=True,
    )
    env = sim_env()
    env["LD_LIBRARY_PATH"] = f"{BIN / 'sim'}:{stubs}"
    out, store = tmp_path / "out", tmp_path / "store"
    proc = subprocess.run(
        [installed_ttrace(), "run", "--quiet", "--out", str(store), "--",
         str(py), str(REPO / "tests/torch/ops.py"), str(out)],
        env=env, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    captured = set()
    for rec in ttrace.open(store):
        for t in rec.tensors:
            if t.captured:
                captured.add(rec.bytes(t.index).tobytes())
    listed = json.loads((out / "torch.json").read_text())
    assert len(listed) > 20
    for t in listed:
        raw = (out / (t["name"] + ".bin")).read_bytes()
        assert raw in captured, f"{t['name']} ({t['dtype']} {t['shape']}) was not captured"
