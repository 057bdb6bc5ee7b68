#!/usr/bin/env bash
# A newer QEMU beside the system's 7.2, for the tests and the benchmark of `mapped-ram`
# (QEMU >= 9.0; docs/snapshots.md): Debian bookworm-backports' qemu-system-x86 and the
# packages holding its firmware, fetched with apt-get against a source list of their own
# (the host's apt state is not touched) and unpacked by dpkg -x under target/qemu10/root.
# Its binary: target/qemu10/root/usr/bin/qemu-system-x86_64, firmware (-L):
# target/qemu10/root/usr/share/qemu.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$PWD/target/qemu10
[ -x "$dir/root/usr/bin/qemu-system-x86_64" ] && [ -f "$dir/stamp" ] && exit 0
rm -rf "$dir"
mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" "$dir/debs" "$dir/root"
echo "deb http://deb.debian.org/debian bookworm-backports main" > "$dir/apt/sources.list"
apt=(-o "Dir::Etc::sourcelist=$dir/apt/sources.list" -o Dir::Etc::sourceparts=-
     -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt/cache")
apt-get "${apt[@]}" update
# Whatever version backports carries now (older ones leave the archive; 10.0.2 when
# this was written): the packages of one source build, so one version for the three.
(cd "$dir/debs" && apt-get "${apt[@]}" download qemu-system-x86/bookworm-backports \
    qemu-system-common/bookworm-backports qemu-system-data/bookworm-backports \
    seabios/bookworm-backports)
for deb in "$dir"/debs/*.deb; do dpkg -x "$deb" "$dir/root"; done
"$dir/root/usr/bin/qemu-system-x86_64" --version
dpkg-deb -f "$dir"/debs/qemu-system-x86_*.deb Version > "$dir/stamp"
