#!/usr/bin/env bash
# The memtide daemon against the hostile endpoints of issue #18, next to one honest real
# guest: builds the release binaries and writes bench/results/hostile.json (see
# docs/security.md). Needs QEMU and the test guest (scripts/test.sh installs and builds
# both); changes no host-global setting. Extra arguments go to the harness, e.g.
# `--cases agent_trickle,qmp_hung --run-s 20`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p memtide -p memtide-bench --bin memtide --bin hostile-guests
exec target/release/hostile-guests "$@"
