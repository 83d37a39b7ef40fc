#!/usr/bin/env bash
# Makes (or reuses) the PyTorch venv the tests/torch scripts run in:
#   ${TTRACE_TORCH_VENVS:-~/.cache/ttrace-venvs}/torch-<VERSION>
# torch is installed from PyPI with --no-deps: none of NVIDIA's CUDA wheels (~2.5 GB) are
# needed, the simulated stack (target/<profile>/sim) and stub libraries generated at test time
# (scripts/torch-stubs.py) stand in for them. Only torch's pure-Python dependencies are added.
# Idempotent: a venv whose torch imports at VERSION is kept. Usage: scripts/torch-venv.sh VERSION
set -euo pipefail
version="${1:?usage: scripts/torch-venv.sh VERSION (e.g. 2.10.0)}"
root="${TTRACE_TORCH_VENVS:-$HOME/.cache/ttrace-venvs}"
venv="$root/torch-$version"
py="${PYTHON:-python3}"

have() {
  [ -x "$venv/bin/python" ] &&
    "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('torch').split('+')[0] != '$version')" 2>/dev/null
}

if have; then
  echo "torch-venv: $venv (torch $version) is ready" >&2
  exit 0
fi
mkdir -p "$root"
rm -rf "$venv.tmp"
"$py" -m venv "$venv.tmp"
pip=("$venv.tmp/bin/python" -m pip install --quiet --disable-pip-version-check)
# Wheels are cached by pip (~/.cache/pip), so a re-made venv downloads nothing.
"${pip[@]}" --no-deps "torch==$version"
"${pip[@]}" --no-warn-conflicts numpy typing_extensions sympy filelock networkx jinja2 fsspec
rm -rf "$venv"
mv "$venv.tmp" "$venv"
# A venv's scripts name their interpreter by absolute path: fix the moved ones.
sed -i "1s|^#!.*/torch-$version.tmp/bin/python|#!$venv/bin/python|" "$venv"/bin/* 2>/dev/null || true
echo "torch-venv: made $venv (torch $version)" >&2
