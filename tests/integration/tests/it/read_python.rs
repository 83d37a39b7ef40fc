//! An exported store loads in Python, equal to the captured bytes: safetensors files with the
//! `safetensors` package into numpy (every dtype, BF16 and FP8 included, through its raw
//! `deserialize`; the numpy-typed ones through `safetensors.numpy.load_file`) and into torch
//! when torch is installed; `.npy` files with `numpy.load`, widened BF16/FP8 checked against a
//! decoding written independently in numpy.
//!
//! Needs python3 with `safetensors` and `numpy`: when the interpreter lacks them, a virtual
//! environment is created under the target directory and they are installed from PyPI.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{write_store, Scratch};
use integration_tests::{bin, describe, profile_dir};

/// A python3 command that imports safetensors and numpy: the system one, else a virtual
/// environment under the target directory, else the system one with the packages installed
/// into a directory on PYTHONPATH (systems without the venv module).
fn python() -> Command {
    let has = |mut c: Command| {
        c.args(["-c", "import safetensors, numpy"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let with_path = |py: &Path, path: Option<&Path>| {
        let mut c = Command::new(py);
        if let Some(p) = path {
            c.env("PYTHONPATH", p);
        }
        c
    };
    if let Ok(p) = std::env::var("TTRACE_TEST_PYTHON") {
        return Command::new(p);
    }
    let system = PathBuf::from("python3");
    if has(with_path(&system, None)) {
        return with_path(&system, None);
    }
    let venv = profile_dir().join("pyvenv-read");
    let py = venv.join("bin/python");
    let site = profile_dir().join("pysite-read");
    for _ in 0..2 {
        if has(with_path(&py, None)) {
            return with_path(&py, None);
        }
        if has(with_path(&system, Some(&site))) {
            return with_path(&system, Some(&site));
        }
        let venv_ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .output()
            .is_ok_and(|o| o.status.success());
        let out = if venv_ok {
            Command::new(&py)
                .args(["-m", "pip", "install", "--quiet", "safetensors", "numpy"])
                .output()
        } else {
            Command::new(&system)
                .args(["-m", "pip", "install", "--quiet", "--target"])
                .arg(&site)
                .args(["safetensors", "numpy"])
                .output()
        }
        .expect("python3 runs (CI installs it)");
        assert!(
            out.status.success(),
            "pip install safetensors numpy: {}",
            describe(&out)
        );
    }
    panic!("safetensors and numpy installed but not importable");
}

const CHECK: &str = r#"
import json, sys, os
import numpy as np
from safetensors import deserialize
from safetensors.numpy import load_file

out, npy_out, np_out, expected_path = sys.argv[1:5]
expected = json.load(open(expected_path))
index = json.load(open(os.path.join(out, "index.json")))
try:
    import torch
    from safetensors.torch import load_file as torch_load
except ImportError:
    torch = None

NP = {"F64", "F32", "F16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL"}
files = sorted({e["file"] for e in index})
seen = 0
for f in files:
    path = os.path.join(out, f)
    raw = {k: v for k, v in deserialize(open(path, "rb").read())}
    for e in [e for e in index if e["file"] == f]:
        name, want = e["name"], expected[e["name"]]
        got = raw[name]
        assert got["dtype"] == want["dtype"], (name, got["dtype"], want["dtype"])
        assert list(got["shape"]) == want["shape"], (name, got["shape"])
        assert bytes(got["data"]) == bytes.fromhex(want["hex"]), name
        seen += 1
    # The numpy loader, for the dtypes numpy has (it refuses BF16/FP8 files, so per tensor).
    from safetensors import safe_open
    with safe_open(path, framework="np") as st:
        for name in st.keys():
            want = expected[name]
            if want["dtype"] in NP:
                a = st.get_tensor(name)
                assert a.tobytes() == bytes.fromhex(want["hex"]), name
                assert list(a.shape) == want["shape"], name
    if torch is not None:
        t = torch_load(path)
        for name, x in t.items():
            want = expected[name]
            b = x.contiguous().view(torch.uint8).numpy().tobytes() if x.numel() else b""
            assert b == bytes.fromhex(want["hex"]), ("torch", name)
        tdt = {str(x.dtype) for x in t.values()}
        assert {"torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2"} <= tdt, tdt

def bf16(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)

def fp8(b, e_bits, m_bits, bias, e4m3):
    b = b.astype(np.int64)
    s = np.where(b & 0x80, -1.0, 1.0)
    e = (b >> m_bits) & ((1 << e_bits) - 1)
    m = b & ((1 << m_bits) - 1)
    v = np.where(e == 0, m / 2.0**m_bits * 2.0**(1 - bias), (1 + m / 2.0**m_bits) * 2.0**(e - bias))
    top = (1 << e_bits) - 1
    if e4m3:
        v = np.where((e == top) & (m == (1 << m_bits) - 1), np.nan, v)
    else:
        v = np.where((e == top) & (m == 0), np.inf, np.where(e == top, np.nan, v))
    return (s * v).astype(np.float32)

npy_index = json.load(open(os.path.join(npy_out, "index.json")))
for e in npy_index:
    a = np.load(os.path.join(npy_out, e["file"]))
    want = expected[e["name"]]
    src = bytes.fromhex(want["hex"])
    assert list(a.shape) == want["shape"], e["name"]
    if want["dtype"] == "BF16":
        ref = bf16(np.frombuffer(src, np.uint16))
    elif want["dtype"] == "F8_E4M3":
        ref = fp8(np.frombuffer(src, np.uint8), 4, 3, 7, True)
    elif want["dtype"] == "F8_E5M2":
        ref = fp8(np.frombuffer(src, np.uint8), 5, 2, 15, False)
    else:
        assert a.tobytes() == src, e["name"]
        seen += 1
        continue
    assert a.dtype == np.float32, e["name"]
    assert np.array_equal(a.reshape(-1), ref, equal_nan=True), e["name"]
    seen += 1
# Files of numpy dtypes only load whole with safetensors.numpy.load_file.
np_index = json.load(open(os.path.join(np_out, "index.json")))
for f in sorted({e["file"] for e in np_index}):
    for name, a in load_file(os.path.join(np_out, f)).items():
        assert a.tobytes() == bytes.fromhex(expected[name]["hex"]), name
        seen += 1
print("OK", seen, "torch" if torch is not None else "no torch")
"#;

#[test]
fn exported_tensors_load_in_python_equal_to_the_captured_bytes() {
    let mut py = python();
    let dir = Scratch::new("read-python");
    let run = dir.path().join("run");
    let all = write_store(&run, 2, 1, 12);
    // What was captured, by export name.
    let mut expected = serde_json::Map::new();
    for made in all.values() {
        for m in made {
            let captured: Vec<usize> = m
                .record
                .tensors
                .iter()
                .enumerate()
                .filter(|(_, t)| t.captured)
                .map(|(i, _)| i)
                .collect();
            for (k, &t) in captured.iter().enumerate() {
                let tensor = &m.record.tensors[t];
                let r = &m.record;
                let name = format!(
                    "rank{}/step{}/seq{}/{}/{:?}@{}",
                    r.rank,
                    r.step,
                    r.seq,
                    r.api,
                    tensor.role,
                    r.nvtx.join("/")
                );
                let hex: String = m.data[k].iter().map(|b| format!("{b:02x}")).collect();
                expected.insert(
                    name,
                    serde_json::json!({"dtype": tensor.dtype.name(), "shape": tensor.shape, "hex": hex}),
                );
            }
        }
    }
    let exp = dir.path().join("expected.json");
    std::fs::write(&exp, serde_json::to_vec(&expected).expect("json")).expect("write");
    let st = dir.path().join("st");
    let npy = dir.path().join("npy");
    let np_only = dir.path().join("np");
    for (fmt, out, extra) in [
        ("safetensors", &st, &[][..]),
        ("npy", &npy, &["--widen"][..]),
        ("safetensors", &np_only, &["--roles", "D,Dst"][..]),
    ] {
        let mut c = Command::new(bin("ttrace"));
        c.args(["export"])
            .arg(&run)
            .args(["--format", fmt, "--out"])
            .arg(out);
        c.args(extra);
        let o = c.output().expect("ttrace");
        assert!(o.status.success(), "{}", describe(&o));
    }
    let out = py
        .args(["-c", CHECK])
        .arg(&st)
        .arg(&npy)
        .arg(&np_only)
        .arg(&exp)
        .output()
        .expect("python runs");
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let n: usize = stdout
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    // Results (D) and copies (Dst): 12 records per rank give 4 GEMMs and 2 copies.
    let np_only_count = 2 * (4 + 2);
    assert_eq!(
        n,
        2 * expected.len() + np_only_count,
        "every tensor checked in both formats: {stdout}"
    );
}
