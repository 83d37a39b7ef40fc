#!/usr/bin/env bash
# What the test command needs besides the Rust toolchain, installed when missing (apt-get, as
# root or through sudo; rustup for rustfmt and clippy). scripts/test.sh runs it first, so the
# README's test command works on a fresh machine that has only Rust; TTRACE_NO_INSTALL=1 skips
# it (then this script's list is what to install by hand).
#   gcc        the ABI tests and the C programs compile against NVIDIA's headers
#   binutils   readelf: the ABI tests read the simulated libraries' exports
#   python3    (with venv and pip) NVIDIA's headers and the torch wheels from PyPI, the Python
#              package's test venv
#   chromium   the compare HTML report test renders the report headless
set -euo pipefail

need() { command -v "$1" >/dev/null 2>&1; }

if need rustup; then
  for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
  done
fi

missing=()
need gcc || missing+=(gcc)
need python3 || missing+=(python3)
need readelf || missing+=(binutils)
need chromium || need chromium-browser || missing+=(chromium)
# Debian's python3 needs python3-venv for `python3 -m venv` with pip.
if ! need python3 || ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if need apt-get; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if need sudo; then SUDO="sudo"; else
      echo "the tests need: ${missing[*]} (not root and no sudo: install them, then rerun)" >&2
      exit 1
    fi
  fi
  echo "== installing what the tests need: ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
else
  echo "the tests need: ${missing[*]} (no apt-get here: install them, then rerun)" >&2
  exit 1
fi
