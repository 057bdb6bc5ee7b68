#!/usr/bin/env bash
# `mom` against `none` on the built-in scenarios (same seed), as text tables; the full
# reports (summary.json, compare.json, SVG plots) go to bench/results/compare-SCENARIO/.
#
#   bench/sim-compare.sh [SCENARIO...]   (default: memknobs-32 mixed-8 quick)
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release -p memtide-sim --example compare
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(memknobs-32 mixed-8 quick)
for s in "${scenarios[@]}"; do
  echo "== $s"
  "$target/release/examples/compare" "$s" --out "bench/results/compare-$s" | grep -v '^reports written'
done | tee bench/results/sim-compare.txt
