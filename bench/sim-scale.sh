#!/usr/bin/env bash
# The simulator's scale figure: the built-in fleet-1000 scenario (1000 VMs, 3600
# one-second ticks), release build, pinned to one core. Prints one JSON object per run:
# the model alone (sampled through the backends, no engine), then the full loop with the
# engine under `none`, `mom` and `memtide`. Writes them to bench/results/sim-scale.json.
#
#   bench/sim-scale.sh [CORE]        (CORE: the CPU to pin to, default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
core=${1:-1}
target=${CARGO_TARGET_DIR:-target}
cargo build --release -p memtide-sim --example scale
bin="$target/release/examples/scale"
out=bench/results/sim-scale.json
{
  echo "["
  for mode in model none mom memtide; do
    taskset -c "$core" "$bin" fleet-1000 "$mode"
    [ "$mode" = memtide ] || echo ","
  done
  echo "]"
} | tee "$out"
