#!/usr/bin/env bash
# The memtide daemon managing 500 VMs at once, each a QEMU monitor and a guest agent
# served by the harness on unix sockets, for 10 minutes: writes
# bench/results/load-500.json (CPU per VM per tick, peak RSS, late ticks). Needs no QEMU
# and changes no host-global setting. Extra arguments go to the harness, e.g.
# `--vms 100 --run-s 60`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p memtide -p memtide-bench --bin memtide --bin load-test
exec target/release/load-test "$@"
