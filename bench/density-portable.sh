#!/usr/bin/env bash
# The real-guest density benchmark, each policy's harness side by side
# (bench/density-parallel.sh), from a bundle of bench/pack-portable.sh: for a bigger host
# where this checkout is but QEMU and the test guest are not (docs/benchmarks.md#density-on-16-cores).
#
#   bench/density-portable.sh BUNDLE.tar.xz OUT_DIR [memtide-bench options...]
#
# OUT_DIR is relative to the repository, as for density-parallel.sh.
# Run as root. The harness makes the domain's memory cgroup below its own; a cgroup v2
# cgroup that holds processes cannot hand the memory controller to its children, so on
# a cgroup v2 host where this shell's own cgroup is not the root, it first moves itself
# to the root.
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,12p "$0" >&2; exit 2; }
bundle=$(realpath "$1") out=$2
shift 2
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
tar -xJf "$bundle" -C "$dir"
export PATH="$dir/bin:$PATH" MEMTIDE_GUEST_DIR="$dir/guest" MEMTIDE_BENCH="$dir/bin/memtide-bench"
own=$(cat /proc/self/cgroup)
if [[ "$own" == 0::/?* && "$own" != *$'\n'* ]]; then
  echo "moving to the root cgroup from ${own#0::}" >&2
  echo $$ >/sys/fs/cgroup/cgroup.procs
fi
echo "$(nproc) CPUs, $(qemu-system-x86_64 --version | head -1), THP $(cat /sys/kernel/mm/transparent_hugepage/enabled)" >&2
bench/density-parallel.sh "$out" "$@"
