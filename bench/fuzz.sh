#!/usr/bin/env bash
# Fuzzing every parser of untrusted input (issue #16 item 4): runs each cargo-fuzz target
# of fuzz/ (bodies in crates/memtide-fuzz) for SECONDS, one after the other, from a
# corpus seeded with the captured files (fuzz/seeds/), and records each in
# bench/results/fuzz.json: {"targets": {NAME: {"seconds", "crashes", "execs",
# "max_rss_mib", "command", "commit"}}, "limits", "goal_met" (every target fuzzed for 30
# minutes without a crash)}. A run of some targets replaces only their entries, so the
# half-hour runs can be spread over several sittings (the machine has two cores).
#
#   bench/fuzz.sh [SECONDS] [TARGET...]   (default: 1800 s each, every target)
#
# A crash, a hang (an input running past -timeout) and unbounded allocation (past
# -rss_limit_mb in all, or one allocation past -malloc_limit_mb) all end a target's run
# with a reproducer in fuzz/artifacts/TARGET/ and count as a crash. Needs a nightly
# toolchain (cargo-fuzz builds with sanitizers); installs cargo-fuzz when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-1800}
shift || true
targets=("$@")
rss_limit_mb=2048
malloc_limit_mb=512
timeout_s=10
max_len=65536
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
mapfile -t every < <(cd fuzz && cargo +nightly fuzz list)
[ ${#targets[@]} -gt 0 ] || targets=("${every[@]}")
cargo run -q -p memtide-fuzz --bin fuzz-seeds -- fuzz/corpus
logs=fuzz/logs
mkdir -p "$logs"
# Reproducers of failures in target $1's artifacts: libFuzzer's crash-, leak-, timeout- and
# oom- files. Its slow-unit- files are reports, not failures (an input that took
# -report_slow_units seconds: seen once for an input that runs in 0.05 s, while the
# fuzzer at nice 19 waited for a busy CPU); a hang past -timeout is a timeout- file.
failures() {
  find "fuzz/artifacts/$1" -maxdepth 1 -type f \
    \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l
}
results=()
for t in "${targets[@]}"; do
  mkdir -p "fuzz/artifacts/$t"
  before=$(failures "$t")
  start=$(date +%s)
  # The code fuzzed: the tree as cargo-fuzz builds it now (later commits are not in it).
  commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates fuzz || echo '+changes')"
  # -a: debug assertions (integer overflow checks) on.
  rc=0
  (cd fuzz && cargo +nightly fuzz run -a "$t" "corpus/$t" -- \
    -max_total_time="$seconds" -rss_limit_mb=$rss_limit_mb -malloc_limit_mb=$malloc_limit_mb \
    -timeout=$timeout_s -max_len=$max_len -print_final_stats=1) >"$logs/$t.log" 2>&1 || rc=$?
  # Seconds fuzzed, as libFuzzer counts them (the build before is not counted).
  elapsed=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$logs/$t.log" | tail -1)
  elapsed=${elapsed:-$(($(date +%s) - start))}
  found=$(($(failures "$t") - before))
  # A failure that left no reproducer (a build failure) still counts.
  [ "$rc" -eq 0 ] || [ "$found" -gt 0 ] || found=1
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t.log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$logs/$t.log" | tail -1)
  echo "$t: ${elapsed} s, ${execs:-?} execs, peak RSS ${rss:-?} MiB, crashes $found (log $logs/$t.log)"
  results+=("$t" "$elapsed" "$found" "${execs:-null}" "${rss:-null}" "$commit")
done
python3 - "bench/fuzz.sh $seconds $*" "$rss_limit_mb" "$malloc_limit_mb" "$timeout_s" \
  "$max_len" "${every[*]}" "${results[@]}" <<'PY'
import json, os, sys
command, rss, malloc, timeout, max_len, every, *rows = sys.argv[1:]
path = "bench/results/fuzz.json"
limits = {"rss_limit_mb": int(rss), "malloc_limit_mb": int(malloc),
          "timeout_s": int(timeout), "max_len": int(max_len)}
old = json.load(open(path)) if os.path.exists(path) else {}
# Entries of earlier runs are kept when they ran under the same limits (those of the
# first format carry the run's command and commit at the top level).
targets = {}
if old.get("limits") == limits:
    for name, t in old.get("targets", {}).items():
        t.setdefault("command", old.get("command"))
        t.setdefault("commit", old.get("commit"))
        targets[name] = t
for i in range(0, len(rows), 6):
    name, seconds, crashes, execs, peak, commit = rows[i:i + 6]
    targets[name] = {"seconds": int(seconds), "crashes": int(crashes),
                     "execs": json.loads(execs), "max_rss_mib": json.loads(peak),
                     "command": command.strip(), "commit": commit}
# Issue #16's goal: 30 minutes per target without a crash, hang or unbounded allocation.
goal_s = 1800
met = all(name in targets and targets[name]["seconds"] >= goal_s
          and targets[name]["crashes"] == 0 for name in every.split())
with open(path, "w") as f:
    json.dump({"goal_s_per_target": goal_s, "goal_met": met, "limits": limits,
               "targets": dict(sorted(targets.items()))}, f, indent=2)
    f.write("\n")
PY
echo "bench/results/fuzz.json written"
