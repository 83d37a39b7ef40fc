#!/usr/bin/env bash
# The test command (README.md): formatting, lints, a release build (which leaves the simulated
# CUDA stack in target/release/sim/), then every test against that build.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== rustfmt"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets --release -- -D warnings
echo "== build"
cargo build --workspace --release
echo "== tests"
# The integration tests run the binaries and libraries of the profile they were built with.
cargo test --workspace --release -- --test-threads="${TEST_THREADS:-2}"
echo "== python package"
# The wheel built, installed into a fresh venv and tested from Python (needs PyPI).
scripts/test-python.sh
