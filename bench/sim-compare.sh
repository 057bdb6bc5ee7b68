#!/usr/bin/env bash
# `none`, `mom` and `memtide` on the built-in scenarios (same seed), as text tables; the
# full reports (summary.json, compare.json, SVG plots) go to bench/results/compare-SCENARIO/.
#
#   bench/sim-compare.sh [SCENARIO...]   (default: memknobs-32 mixed-8 quick)
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release -p memtide
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(memknobs-32 mixed-8 quick)
for s in "${scenarios[@]}"; do
  echo "== $s"
  "$target/release/memtide" sim "$s" --compare none mom memtide --out "bench/results/compare-$s" |
    grep -v '^compare.json and one report'
done | tee bench/results/sim-compare.txt
