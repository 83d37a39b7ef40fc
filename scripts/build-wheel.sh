#!/usr/bin/env bash
# Builds the `ttrace` Python wheel (python/pyproject.toml, maturin) into target/wheels: the
# native reader module plus the release `ttrace`, `ttraced` and `libttrace.so` (debug info
# stripped), which `pip install` puts inside the package; its console scripts run them.
# Needs maturin (installed into a private venv under target/ when missing). Honours
# CARGO_TARGET_DIR (relative to the repository, or absolute).
set -euo pipefail
cd "$(dirname "$0")/.."
target="$(realpath -m "${CARGO_TARGET_DIR:-target}")"

cargo build --release -p ttrace-cli -p ttraced -p ttrace-intercept
bin=python/ttrace/_bin
rm -rf "$bin"
mkdir -p "$bin"
for f in ttrace ttraced libttrace.so; do
  strip --strip-debug -o "$bin/$f" "$target/release/$f"
done

maturin=$(command -v maturin || true)
if [ -z "$maturin" ]; then
  if [ ! -x "$target/build-venv/bin/maturin" ]; then
    python3 -m venv "$target/build-venv"
    "$target/build-venv/bin/pip" install -q 'maturin>=1.5,<2'
  fi
  maturin="$target/build-venv/bin/maturin"
fi
rm -rf "$target/wheels"
"$maturin" build --release -m python/Cargo.toml --out "$target/wheels" "$@"
ls "$target"/wheels/*.whl
