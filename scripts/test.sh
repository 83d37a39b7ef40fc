#!/usr/bin/env bash
# The test command (README.md): formatting, lints, the docs' links, a release build (which
# leaves the simulated CUDA stack in target/release/sim/), then every test against that build.
set -euo pipefail
cd "$(dirname "$0")/.."

# What a fresh machine lacks besides Rust (gcc, binutils, python3-venv, chromium, rustfmt,
# clippy), installed when missing; TTRACE_NO_INSTALL=1 skips this.
if [ "${TTRACE_NO_INSTALL:-0}" != 1 ]; then
  scripts/install-test-deps.sh
fi

echo "== rustfmt"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets --release -- -D warnings
echo "== docs"
# Every intra-doc link resolves (a renamed or removed item leaves none dangling).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q
echo "== build"
cargo build --workspace --release
echo "== build (CUDA 13 simulated stack, target/cuda13)"
scripts/build-sim-cuda13.sh --release
echo "== torch venvs"
# PyPI torch wheels (installed --no-deps, cached under ~/.cache/ttrace-venvs) for the
# tests/torch scripts; the torch_* tests skip, saying so, when a venv could not be made.
for v in ${TTRACE_TORCH_VERSIONS:-2.10.0 2.15.0}; do
  scripts/torch-venv.sh "$v" || echo "warning: no torch $v venv; the torch_* tests will skip it" >&2
done
echo "== tests"
# The integration tests run the binaries and libraries of the profile they were built with.
cargo test --workspace --release -- --test-threads="${TEST_THREADS:-2}"
echo "== python package"
# The wheel built, installed into a fresh venv and tested from Python (needs PyPI).
scripts/test-python.sh
