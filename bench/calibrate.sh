#!/usr/bin/env bash
# Calibration: the simulator against the real guests. Each bench/calibration/SCENARIO.toml
# mirrors bench/scenarios/SCENARIO.toml (same guests, workloads, domain limit and policies,
# the guest base and workload rates measured in bench/results/SCENARIO.json); this runs it
# under the policies of the real results and compares each policy's throughput relative
# to `none`, real against simulated. Writes bench/results/calibration.json.
#
#   bench/calibrate.sh [SCENARIO...]   (default: converge overcommit)
#
# Ratios: converge — the mean over the VMs of throughput ÷ the same VM's at full memory
# (the real baseline runs at full size, so the simulated `none` runs without start_mib);
# overcommit — total throughput ÷ the unmanaged total.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p memtide
memtide="$target/release/memtide"
out=target/calibration
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(converge overcommit)
entries=()
for s in "${scenarios[@]}"; do
  real="bench/results/$s.json"
  sim="bench/calibration/$s.toml"
  mapfile -t policies < <(jq -r '.order[] | select(. != "none")' "$real")
  # Policy files are named relative to the real scenario file.
  args=()
  for p in "${policies[@]}"; do
    case "$p" in *.policy) args+=("bench/scenarios/$p") ;; *) args+=("$p") ;; esac
  done
  rm -rf "$out/$s" "$out/$s-full"
  "$memtide" sim "$sim" --compare "${args[@]}" --out "$out/$s" >/dev/null
  grep -v '^start_mib' "$sim" > "$out/$s-full.toml"
  "$memtide" sim "$out/$s-full.toml" --policy none --out "$out/$s-full" >/dev/null
  names=$(printf '%s\n' "${policies[@]}" | jq -R . | jq -s .)
  files=$(printf '%s\n' "${args[@]}" | jq -R . | jq -s .)
  entries+=("$(jq -n --arg s "$s" --argjson names "$names" --argjson files "$files" \
    --slurpfile real "$real" --slurpfile sim "$out/$s/compare.json" \
    --slurpfile full "$out/$s-full/summary.json" '
    def per_vm_ratio(run): [run.per_vm[] as $v
        | ($full[0].per_vm[] | select(.name == $v.name).throughput_mib_s) as $b
        | $v.throughput_mib_s / $b] | add / length;
    def round3: . * 1000 | round / 1000;
    {($s): [range(0; $names | length) as $i | $names[$i] as $p | $files[$i] as $f
      | (if $s == "overcommit"
           then {real: ($real[0].policies[$p].total_throughput / $real[0].policies.none.total_throughput),
                 sim: ($sim[0].policies[$f].total_throughput / $full[0].total_throughput)}
           else {real: $real[0].policies[$p].throughput_ratio,
                 sim: per_vm_ratio($sim[0].policies[$f])} end) as $r
      | {key: $p, value: {real_ratio: ($r.real | round3), sim_ratio: ($r.sim | round3),
                          sim_over_real: ($r.sim / $r.real | round3),
                          within_20pct: (($r.sim / $r.real - 1) | fabs <= 0.2)}}]
      | from_entries}')")
done
printf '%s\n' "${entries[@]}" | jq -s --arg cmd "bench/calibrate.sh ${scenarios[*]}" \
  '{command: $cmd, scenarios: add}' > bench/results/calibration.json
cat bench/results/calibration.json
