#!/usr/bin/env bash
# The Python package end to end: builds the wheel (scripts/build-wheel.sh), checks its
# platform tag with auditwheel, installs it into a fresh venv with its dependencies from PyPI,
# and runs python/tests against the installed package and its installed `ttrace` CLI (the
# stores are traced with that CLI from the fixture trainer on the simulated stack).
set -euo pipefail
cd "$(dirname "$0")/.."
# CARGO_TARGET_DIR relative to the repository, or absolute.
target="$(realpath -m "${CARGO_TARGET_DIR:-target}")"

scripts/build-wheel.sh
wheel=$(ls "$target"/wheels/ttrace-*.whl)
venv="$target/py-test-venv"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "$wheel" pytest auditwheel
echo "== auditwheel"
"$venv/bin/auditwheel" show "$wheel"
echo "== pytest (installed package)"
TTRACE_TEST_BIN="$target/release" "$venv/bin/python" -m pytest -q python/tests
