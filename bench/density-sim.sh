#!/usr/bin/env bash
# The density benchmark in the simulator (docs/benchmarks.md#density): the built-in
# `density` queue (or SCENARIO) under none (static partitioning), mom, proxmox, esx and
# memtide, every reserve of the sweep; writes bench/results/density-sim.json (with the
# command and commit) and prints the table.
#
#   bench/density-sim.sh [SCENARIO]
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release -p memtide
scenario=${1:-density}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$target/release/memtide" sim "$scenario" --density --compare none mom proxmox esx memtide --out "$out"
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo '+changes')"
python3 - "$out/density.json" "$commit" "bench/density-sim.sh $*" >bench/results/density-sim.json <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
report["commit"], report["command"] = sys.argv[2], sys.argv[3].strip()
print(json.dumps(report, indent=2))
PY
echo "bench/results/density-sim.json written"
