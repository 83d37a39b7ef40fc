#!/usr/bin/env bash
# Capture throughput and compression of ttraced, end to end, on this machine.
#
# A producer (daemon/examples/loadgen.rs, standing in for libttrace.so) copies realistic BF16
# activations (normal, sigma 0.01-10) into a snapshot ring and publishes them to an in-process
# ttraced, which checks their CRC-32, shuffles and compresses them and writes segment files.
# Printed: end-to-end GB/s next to a plain memcpy of the same bytes, the stored ratio, CPU
# seconds per GB (and the ceiling that implies on idle cores), and compression alone on one
# thread: plain zstd vs the format's Blob::encode vs ttraced's encoder at several levels.
#
#   scripts/bench-capture.sh                      # 2 GiB, default level and threads
#   scripts/bench-capture.sh --level 1 --total-mib 4096 --dir /dev/shm
#   scripts/bench-capture.sh --dtype f32
#
# Options are loadgen's (`loadgen bench --help`). The store goes to the temp directory (a real
# disk here, fsync included) unless --dir says otherwise, and is removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
cargo build --release -q -p ttraced --example loadgen
exec "$target/release/examples/loadgen" bench "$@"
