#!/usr/bin/env bash
# Builds a kernel for memtide's test guest with idle page tracking
# (CONFIG_IDLE_PAGE_TRACKING), which none of Debian's kernel packages has (6.1 and
# 6.12, cloud and generic alike): a tinyconfig from Debian's linux-source-6.1 with the
# test guest's needs built in (virtio PCI, block, console and balloon; ext2 through ext4;
# swap; transparent huge pages; memory cgroups; idle page tracking and pagemap; NUMA
# from the firmware's ACPI SRAT, with page migration for move_pages(2) and
# /proc/PID/numa_maps, and no automatic NUMA balancing to move pages behind a test's
# back; PSI and zswap, lzo into zsmalloc, off until a test turns it on through
# /sys/module/zswap/parameters/enabled, for the compressed tier). It boots with guest/build.sh's initramfs, whose modules then fail to load harmlessly
# (their drivers are built in).
#
#   guest/build-idle-kernel.sh  -> ${MEMTIDE_GUEST_DIR:-<repo>/target/guest}/idle/{vmlinuz,initrd.img}
#
# initrd.img is a link to guest/build.sh's. Prints nothing on success; rebuilds only
# when this script or the linux-source-6.1 version changes. Needs Debian 12 and a C
# toolchain; installs flex, bison, bc and libelf-dev with apt-get if missing (root).
set -Eeuo pipefail
trap 'echo "build-idle-kernel.sh: error: line $LINENO failed: $BASH_COMMAND" >&2' ERR

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GUEST=${MEMTIDE_GUEST_DIR:-$REPO/target/guest}
OUT=$GUEST/idle
WORK=$OUT/work

die() {
    echo "build-idle-kernel.sh: error: $*" >&2
    exit 1
}

quietly() {
    local log
    log=$(mktemp)
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        die "failed: $*"
    fi
    rm -f "$log"
}

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9

version=$(apt-cache policy linux-source-6.1 | awk '$1 == "Candidate:" { print $2 }')
if [[ -z $version || $version == "(none)" ]]; then
    quietly apt-get update
    version=$(apt-cache policy linux-source-6.1 | awk '$1 == "Candidate:" { print $2 }')
fi
[[ -n $version && $version != "(none)" ]] || die "no candidate version for linux-source-6.1"
stamp=$( (echo "$version" && sha256sum <"${BASH_SOURCE[0]}") | sha256sum | cut -d' ' -f1)
if [[ -f $OUT/vmlinuz && $(cat "$OUT/stamp" 2>/dev/null) == "$stamp" ]]; then
    ln -sfn ../initrd.img "$OUT/initrd.img"
    exit 0
fi

missing=()
for tool in flex:flex bison:bison bc:bc gcc:gcc make:make; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
[[ -f /usr/include/libelf.h ]] || missing+=(libelf-dev) # objtool
if ((${#missing[@]})); then
    [[ $EUID -eq 0 ]] || die "missing ${missing[*]}; run as root or install them"
    quietly apt-get install -y --no-install-recommends "${missing[@]}"
fi

rm -rf "$WORK"
mkdir -p "$WORK/pkg"
(cd "$WORK" && quietly apt-get download -o APT::Sandbox::User=root "linux-source-6.1=$version")
dpkg-deb -x "$WORK"/linux-source-6.1_*.deb "$WORK/pkg"
tar -C "$WORK" -xaf "$WORK"/pkg/usr/src/linux-source-6.1.tar.xz
src=$WORK/linux-source-6.1
quietly make -C "$src" tinyconfig
options=(64BIT PRINTK TTY SERIAL_8250 SERIAL_8250_CONSOLE BLK_DEV_INITRD RD_GZIP
    BINFMT_ELF BINFMT_SCRIPT PROC_FS SYSFS DEVTMPFS TMPFS MULTIUSER FUTEX EPOLL SIGNALFD
    TIMERFD EVENTFD SHMEM AIO FILE_LOCKING POSIX_TIMERS PCI PCI_DIRECT VIRTIO_MENU VIRTIO
    VIRTIO_PCI VIRTIO_BLK VIRTIO_CONSOLE VIRTIO_BALLOON BLOCK EXT4_FS EXT4_USE_FOR_EXT2
    SWAP MMU TRANSPARENT_HUGEPAGE TRANSPARENT_HUGEPAGE_ALWAYS IDLE_PAGE_TRACKING
    PROC_PAGE_MONITOR CGROUPS MEMCG UNIX NET HW_RANDOM RTC_CLASS UNIX98_PTYS ELF_CORE
    SYSVIPC SMP ACPI NUMA X86_64_ACPI_NUMA ACPI_NUMA MIGRATION PSI CRYPTO ZSWAP ZPOOL
    ZSMALLOC ZSWAP_COMPRESSOR_DEFAULT_LZO ZSWAP_ZPOOL_DEFAULT_ZSMALLOC)
enable=()
for option in "${options[@]}"; do enable+=(-e "$option"); done
"$src/scripts/config" --file "$src/.config" "${enable[@]}" -d NUMA_BALANCING
quietly make -C "$src" olddefconfig
for option in IDLE_PAGE_TRACKING VIRTIO_PCI VIRTIO_BLK TRANSPARENT_HUGEPAGE MEMCG NUMA \
    ACPI_NUMA MIGRATION PSI ZSWAP ZSMALLOC CRYPTO_LZO; do
    grep -qx "CONFIG_$option=y" "$src/.config" || die "CONFIG_$option did not stay on"
done
quietly make -C "$src" -j"$(nproc)" bzImage
mv "$src/arch/x86/boot/bzImage" "$OUT/vmlinuz"
ln -sfn ../initrd.img "$OUT/initrd.img"
echo "$stamp" >"$OUT/stamp"
rm -rf "$WORK"
