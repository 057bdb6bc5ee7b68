#!/usr/bin/env bash
# `none`, `mom`, `proxmox`, `esx` and `memtide` on the built-in scenarios (same seed), as
# text tables, without and then with deflate-on-oom in the guests' balloons (OOM kills
# with it are counted as "N (+D)", D the rescues), then with free page reporting in them (as
# KubeVirt configures its VMs: freed memory goes back to the host under every policy,
# none included); the full reports (summary.json,
# compare.json, SVG plots) go to bench/results/compare-SCENARIO/.
#
#   bench/sim-compare.sh [SCENARIO...]   (default: every built-in scenario)
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release -p memtide
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] ||
  scenarios=(memknobs-32 mixed-8 quick fleet-1000 no-overcommit burst cloud-mix small-vms periodic)
policies=(none mom proxmox esx memtide)
{
  echo "# commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo '+changes')"
  for s in "${scenarios[@]}"; do
    echo "== $s"
    "$target/release/memtide" sim "$s" --compare "${policies[@]}" --out "bench/results/compare-$s" 2>/dev/null
    echo "== $s, deflate-on-oom"
    "$target/release/memtide" sim "$s" --compare "${policies[@]}" --deflate-on-oom 2>/dev/null
    echo "== $s, free page reporting"
    "$target/release/memtide" sim "$s" --compare "${policies[@]}" --free-page-reporting 2>/dev/null
  done
} | tee bench/results/sim-compare.txt
