#!/usr/bin/env bash
# A self-contained bundle for running the real-guest benchmarks on a machine where this
# checkout is but nothing is installed and nothing can be fetched (a lent bigger host):
# the release harness, this host's QEMU with its TCG module, the firmware a test guest
# boots with and the libraries QEMU needs beyond glibc, and the built test guest. Unpack
# it anywhere and put its bin/ first on PATH: bin/qemu-system-x86_64 runs the bundled
# QEMU on the bundled libraries and firmware (docs/benchmarks.md#density-on-16-cores).
#
#   bench/pack-portable.sh OUT.tar.xz [SONAME...]
#
# SONAMEs (libgnutls.so.30, ...) are left out: libraries the target has already, to keep
# the bundle small. The target needs a glibc at least as new as this host's (the harness
# also uses its libgcc_s). Needs target/bench/release/memtide-bench and target/guest (the
# benchmarks' own build: docs/benchmarks.md). OUT is relative to the caller's directory.
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,14p "$0" >&2; exit 2; }
out=$(realpath -m "$1")
shift
cd "$(dirname "$0")/.."
bench=target/bench/release/memtide-bench
[ -x "$bench" ] || { echo "no $bench: build it first (docs/benchmarks.md)" >&2; exit 1; }
[ -f target/guest/vmlinuz ] || { echo "no target/guest: build the test guest first" >&2; exit 1; }
qemu=$(command -v qemu-system-x86_64) || { echo "no qemu-system-x86_64" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir"/{bin,lib,qemu,modules,share,guest}
strip -o "$dir/bin/memtide-bench" "$bench"
cp "$qemu" "$dir/qemu/"
# Debian builds TCG as a loadable module.
cp /usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so "$dir/modules/"
# What a -kernel boot with -nodefaults reads: SeaBIOS and the Linux boot option ROMs.
for f in bios-256k.bin linuxboot.bin linuxboot_dma.bin kvmvapic.bin; do
  found=
  for d in /usr/share/qemu /usr/share/seabios; do
    [ -e "$d/$f" ] && { found=$d/$f; break; }
  done
  [ -n "$found" ] || { echo "no $f in /usr/share/qemu nor /usr/share/seabios" >&2; exit 1; }
  cp -L "$found" "$dir/share/"
done
skip=" libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 $* "
for f in "$dir/qemu/qemu-system-x86_64" "$dir/modules/accel-tcg-x86_64.so"; do
  ldd "$f" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$skip" == *" $name "* ]] || cp -L "$path" "$dir/lib/$name"
done
cp target/guest/vmlinuz target/guest/initrd.img target/guest/stamp "$dir/guest/"
cat >"$dir/bin/qemu-system-x86_64" <<'EOF'
#!/bin/sh
# The bundled QEMU, on the bundled libraries, TCG module and firmware.
d=$(dirname "$(readlink -f "$0")")/..
LD_LIBRARY_PATH="$d/lib" QEMU_MODULE_DIR="$d/modules" exec "$d/qemu/qemu-system-x86_64" -L "$d/share" "$@"
EOF
chmod +x "$dir/bin/qemu-system-x86_64"
# Every library QEMU and its module and libraries need must be in the bundle, glibc's,
# or named.
for f in "$dir"/qemu/* "$dir"/modules/* "$dir"/lib/*; do
  for n in $(readelf -d "$f" | awk '/NEEDED/ {gsub(/[][]/, "", $5); print $5}'); do
    [ -e "$dir/lib/$n" ] || [[ "$skip ld-linux-x86-64.so.2 " == *" $n "* ]] ||
      { echo "$(basename "$f") needs $n, neither bundled nor named" >&2; exit 1; }
  done
done
tar -cf - -C "$dir" . | xz -9 -T0 >"$out.tmp"
mv "$out.tmp" "$out"
echo "$out: $(du -h "$out" | cut -f1)"
