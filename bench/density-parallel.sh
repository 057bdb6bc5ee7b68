#!/usr/bin/env bash
# The real-guest density benchmark (docs/benchmarks.md#density-on-real-guests) with each
# policy in a harness of its own, all side by side, then merged into one results file:
# for a host with more cores than all the runs' guests together, where the four runs one
# after the other would take half an hour. Each harness makes its own solo runs, against
# which its policy's windows are measured (the merged file keeps each one's).
#
#   bench/density-parallel.sh [OUT_DIR] [memtide-bench options...]
#
# OUT_DIR (default bench/results) gets density.json and density.svg; the harnesses'
# own results, logs and per-run files are in OUT_DIR/density-parallel/. Environment:
# MEMTIDE_BENCH (the harness, default target/bench/release/memtide-bench), SCENARIO
# (default bench/scenarios/density.toml), POLICIES (default "none mom proxmox memtide").
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results}
shift || true
bench=${MEMTIDE_BENCH:-target/bench/release/memtide-bench}
scenario=${SCENARIO:-bench/scenarios/density.toml}
read -r -a policies <<<"${POLICIES:-none mom proxmox memtide}"
work="$out/density-parallel"
mkdir -p "$work"
pids=()
for p in "${policies[@]}"; do
  "$bench" "$scenario" --policies "$p" --out "$work/$p" --work-dir "$work/$p-runs" "$@" \
    >"$work/$p.log" 2>&1 &
  pids+=($!)
done
# Interrupted: each harness tears its guests down on SIGTERM.
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait' INT TERM
rc=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { rc=1; echo "${policies[$i]}: failed (see $work/${policies[$i]}.log)" >&2; }
done
name=$(basename "$scenario" .toml)
results=()
for p in "${policies[@]}"; do
  [ -f "$work/$p/$name.json" ] && results+=("$work/$p/$name.json")
done
[ ${#results[@]} -gt 0 ] || { echo "no harness wrote results" >&2; exit 1; }
"$bench" "$scenario" --out "$out" --merge "${results[@]}"
exit $rc
