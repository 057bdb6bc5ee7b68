#!/usr/bin/env bash
# Boots the test guest with its console on this terminal, for humans.
# (The test harness builds its own QEMU command line from guest/README.md.)
#
#   guest/run-guest.sh [WORKLOAD [ARGS]]    e.g. guest/run-guest.sh memknobs 200:30,100:30
#
# WORKLOAD defaults to sh, a shell on the console. ARGS use the kernel command
# line convention of guest/init: '+' between arguments, no spaces.
# Environment: MEM_MIB (default 384), SWAP_MIB (default 256; 0 = no swap disk),
# MEMTIDE_GUEST_DIR. Quit with Ctrl-A X; QMP listens on the socket printed.
set -euo pipefail

GUEST_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GUEST_DIR=${MEMTIDE_GUEST_DIR:-$(dirname "$GUEST_SRC")/target/guest}
WORKLOAD=${1:-sh}
ARGS=${2:-}
MEM_MIB=${MEM_MIB:-384}
SWAP_MIB=${SWAP_MIB:-256}

"$GUEST_SRC/build.sh"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

swap=()
if ((SWAP_MIB > 0)); then
    truncate -s "${SWAP_MIB}M" "$tmp/swap.img"
    swap=(-drive "if=none,id=swap,file=$tmp/swap.img,format=raw" -device "virtio-blk-pci,drive=swap")
fi

echo "run-guest: QMP socket $tmp/qmp.sock; quit with Ctrl-A X" >&2
qemu-system-x86_64 -accel tcg,tb-size=16 -cpu qemu64,+rdrand -m "$MEM_MIB" -smp 1 \
    -nodefaults -nographic -no-reboot \
    -kernel "$GUEST_DIR/vmlinuz" -initrd "$GUEST_DIR/initrd.img" \
    -append "console=ttyS0 no_timer_check panic=-1 quiet cryptomgr.notests ipv6.disable=1 memtide.workload=$WORKLOAD memtide.args=$ARGS" \
    -serial mon:stdio -qmp "unix:$tmp/qmp.sock,server=on,wait=off" \
    -device virtio-balloon-pci,id=balloon0,deflate-on-oom=on \
    "${swap[@]}"
