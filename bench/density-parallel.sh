#!/usr/bin/env bash
# The real-guest density benchmark (docs/benchmarks.md#density-on-real-guests) with each
# policy in a harness of its own, all side by side, then merged into one results file:
# for a host with more cores than all the runs' guests together, where the four runs one
# after the other would take half an hour. Each harness makes its own solo runs, against
# which its policy's windows are measured (the merged file keeps each one's).
#
#   bench/density-parallel.sh [OUT_DIR] [memtide-bench options...]
#
# OUT_DIR (default target/density-parallel; relative to the repository) gets density.json
# and density.svg, merged from the harnesses that succeeded; their own results, logs and
# per-run files are in OUT_DIR/harnesses/. Not --quiet-wait-s: the harnesses would wait
# for each other's guests. Environment: MEMTIDE_BENCH (the harness, default
# target/bench/release/memtide-bench), SCENARIO (default bench/scenarios/density.toml),
# POLICIES (default "none mom proxmox memtide"). Exits 1 if a harness failed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/density-parallel
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  out=$1
  shift
fi
bench=${MEMTIDE_BENCH:-target/bench/release/memtide-bench}
scenario=${SCENARIO:-bench/scenarios/density.toml}
name=$(basename "$scenario" .toml)
read -r -a policies <<<"${POLICIES:-none mom proxmox memtide}"
work="$out/harnesses"
mkdir -p "$work"
pids=()
# Interrupted: each harness tears its guests down on SIGTERM; nothing is merged.
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait; exit 130' INT TERM
for p in "${policies[@]}"; do
  rm -f "$work/$p/$name.json"
  "$bench" "$scenario" --policies "$p" --out "$work/$p" --work-dir "$work/$p-runs" "$@" \
    >"$work/$p.log" 2>&1 &
  pids+=($!)
done
rc=0
results=()
for i in "${!pids[@]}"; do
  p=${policies[$i]}
  if wait "${pids[$i]}" && [ -f "$work/$p/$name.json" ]; then
    results+=("$work/$p/$name.json")
  else
    rc=1
    echo "$p: failed (see $work/$p.log)" >&2
  fi
done
[ ${#results[@]} -gt 0 ] || { echo "no harness succeeded" >&2; exit 1; }
"$bench" "$scenario" --out "$out" --merge "${results[@]}" || rc=1
exit $rc
