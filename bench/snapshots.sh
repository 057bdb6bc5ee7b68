#!/usr/bin/env bash
# VM memory snapshots on a real test guest, through the release daemon and CLI: save
# throughput beside the disk's own write bandwidth, downtime, hibernation and wake-up,
# clones, and a memory-writing guest's first 10 s after an eager and a lazy restore.
# Writes bench/results/snapshots.json (see docs/snapshots.md). Needs QEMU and the test
# guest (scripts/test.sh installs and builds both). Extra arguments go to the harness.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p memtide -p memtide-bench --bin memtide --bin snapshot-bench
exec target/release/snapshot-bench "$@"
