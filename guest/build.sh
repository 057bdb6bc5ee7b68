#!/usr/bin/env bash
# Builds memtide's test guest: the Debian cloud kernel plus a busybox initramfs
# holding the virtio modules, guest/init and the static workloads.
#
#   guest/build.sh      -> ${MEMTIDE_GUEST_DIR:-<repo>/target/guest}/{vmlinuz,initrd.img}
#   MEMTIDE_GUEST_KERNEL=6.12 guest/build.sh
#                       -> ${MEMTIDE_GUEST_DIR:-<repo>/target/guest}/linux-6.12/{vmlinuz,initrd.img}
#
# MEMTIDE_GUEST_KERNEL picks the kernel: 6.1 (the default), Debian 12's own behind
# linux-image-cloud-amd64, or 6.12, from bookworm's linux-image-6.12-cloud-amd64, for
# DAMON (CONFIG_DAMON_VADDR, CONFIG_DAMON_SYSFS), which none of the 6.1 kernels has.
# Prints nothing on success. Rebuilds only when an input changes: this script,
# guest/init, the workload sources or the Debian package versions. Downloaded
# packages (debs/) and the cargo build (cargo/) are kept under the guest dir between
# runs, shared by both kernels; each kernel has its own lock, stamp and work dir.
# Needs Debian 12 with apt and a Rust toolchain; installs cpio/kmod/... with
# apt-get if they are missing (which needs root).
set -Eeuo pipefail # -E: the ERR trap also reports failures inside functions

GUEST_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$GUEST_SRC")
GUEST=${MEMTIDE_GUEST_DIR:-$REPO/target/guest}
DEBS=$GUEST/debs
TARGET=x86_64-unknown-linux-gnu

die() {
    echo "build.sh: error: $*" >&2
    exit 1
}
trap 'echo "build.sh: error: line $LINENO failed: $BASH_COMMAND" >&2' ERR

# KERNEL_META: the package that depends on the current kernel package (whose name
# changes with each ABI bump), KERNEL_NAMES: what that kernel package's name matches
# (an ERE; passed through ENVIRON: awk -v would treat its backslashes as escapes).
# zram (swap on compressed RAM, memtide.zram=MiB) needs its compressors loaded first.
case ${MEMTIDE_GUEST_KERNEL:-6.1} in
6.1)
    OUT=$GUEST
    KERNEL_META=linux-image-cloud-amd64
    KERNEL_NAMES='^linux-image-6\.1\..*-cloud-amd64$'
    zram_compressors=(lzo-rle) # its default, through the crypto API
    ;;
6.12)
    # A directory of its own inside the 6.1 guest's (tests: guest_dir()/linux-6.12).
    OUT=$GUEST/linux-6.12
    KERNEL_META=linux-image-6.12-cloud-amd64
    KERNEL_NAMES='^linux-image-6\.12\..*-cloud-amd64$'
    # 6.12's zram compresses with backends of its own, not the crypto API: lz4 by
    # default (Debian builds no lzo backend), and the module needs lz4 and lz4hc.
    zram_compressors=(lz4_compress lz4hc_compress)
    ;;
*) die "MEMTIDE_GUEST_KERNEL=$MEMTIDE_GUEST_KERNEL: not one this script builds (6.1 or 6.12)" ;;
esac
WORK=$OUT/work
# Load order for guest/init: each module after its dependencies (checked
# against modinfo below). Swap itself is built into the kernel, and so are some
# of these in 6.12 (virtio_pci, virtio_console, ...): those are left out.
MODULES=(virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci
    virtio_balloon virtio_blk virtio_console virtio_mem
    zsmalloc "${zram_compressors[@]}" zram)

# Runs a chatty command, showing its output only if it fails.
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

# Installs the package providing a host tool, only when the tool is missing.
need() {
    command -v "$1" >/dev/null && return
    [[ $EUID -eq 0 ]] || die "'$1' is missing; run as root or install package $2"
    quietly apt-get install -y --no-install-recommends "$2"
}

kernel_package() {
    apt-cache depends "$KERNEL_META" 2>/dev/null |
        names=$KERNEL_NAMES awk '$1 == "Depends:" && $2 ~ ENVIRON["names"] { print $2; exit }'
}

# Prints "PACKAGE=VERSION" (candidate version) for each package.
candidates() {
    apt-cache policy "$@" | awk '/^[^ ]/ { pkg = $1; sub(/:$/, "", pkg) }
        $1 == "Candidate:" && $2 != "(none)" { print pkg "=" $2 }'
}

# Downloads package $1 at version $2 into $DEBS (once) and prints its path. Both
# kernels' builds share $DEBS: their kernel packages have different names, so neither
# deletes the other's, and busybox-static's version is the same for both.
fetch() {
    local deb="$DEBS/${1}_${2//:/%3a}_amd64.deb"
    if [[ ! -f $deb ]]; then
        rm -f "$DEBS/${1}_"*.deb # an older version
        # Sandbox::User=root: as root, apt's _apt user could not write here.
        (cd "$DEBS" && quietly apt-get download -o APT::Sandbox::User=root "$1=$2") ||
            die "cannot download $1=$2 (stale package lists? run apt-get update)"
        [[ -f $deb ]] || die "apt-get download $1=$2 did not produce $deb"
    fi
    echo "$deb"
}

# Copies kernel module $1 (possibly compressed) to $2 uncompressed, since
# busybox insmod cannot load compressed modules.
install_module() {
    case $1 in
    *.ko) cp "$1" "$2" ;;
    *.ko.xz) need xz xz-utils && xz -dc "$1" >"$2" ;;
    *.ko.zst) need zstd zstd && zstd -qdc "$1" >"$2" ;;
    *) die "unexpected module file $1" ;;
    esac
}

build_workloads() {
    local target_dir=$GUEST/cargo bin name
    command -v cargo >/dev/null || die "cargo is missing (install Rust, e.g. with rustup)"
    # Static so they run without a libc in the initramfs; no debug info to
    # keep the initrd small. Own target dir: these flags would otherwise
    # invalidate the workspace's normal builds. Shared by both kernels' builds
    # (the same binaries; cargo locks it while it builds).
    quietly env RUSTFLAGS='-C target-feature=+crt-static' \
        CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
        cargo build --release --manifest-path "$REPO/Cargo.toml" -p memtide-workloads --bins \
        --target "$TARGET" --target-dir "$target_dir"
    for bin in "$GUEST_SRC"/workloads/src/bin/*; do
        name=$(basename "$bin" .rs)
        cp "$target_dir/$TARGET/release/$name" "$WORK/root/bin/$name"
        ldd "$WORK/root/bin/$name" 2>&1 | grep -qE 'statically linked|not a dynamic executable' ||
            die "workload $name is not statically linked"
    done
}

# The real QEMU guest agent from Debian, with the shared libraries it links against,
# copied from this host at the same paths: the host is Debian 12, as the agent expects.
install_agent() {
    local bin lib
    bin=$(command -v qemu-ga)
    cp "$bin" "$WORK/root/bin/qemu-ga"
    for lib in $(ldd "$bin" | awk '$2 == "=>" { print $3 } $1 ~ /^\/.*ld-linux/ { print $1 }'); do
        mkdir -p "$WORK/root$(dirname "$lib")"
        cp -L "$lib" "$WORK/root$lib"
    done
}

mkdir -p "$OUT" "$DEBS"
# Tests may build concurrently: one build at a time, the others then find it done.
# (Per kernel; the two kernels' builds share $DEBS, locked while fetching below.)
exec 9>"$OUT/.lock"
flock 9

# (apt-cache is slow where its cache file is disabled, as in Docker images:
# call it twice only.)
kernel_pkg=$(kernel_package || true)
if [[ -z $kernel_pkg ]]; then
    # Fresh machines (e.g. containers) come without package lists.
    quietly apt-get update
    kernel_pkg=$(kernel_package)
    [[ -n $kernel_pkg ]] || die "cannot resolve the kernel package behind $KERNEL_META"
fi
mapfile -t packages < <(candidates "$kernel_pkg" busybox-static)
[[ ${#packages[@]} -eq 2 ]] || die "no candidate version for $kernel_pkg or busybox-static"

need qemu-ga qemu-guest-agent
stamp=$(
    cd "$GUEST_SRC"
    echo "${packages[@]}"
    qemu-ga --version
    find build.sh init workloads -type f | LC_ALL=C sort | xargs sha256sum
)
stamp=$(sha256sum <<<"$stamp" | cut -d' ' -f1)
if [[ -f $OUT/vmlinuz && -f $OUT/initrd.img && $(cat "$OUT/stamp" 2>/dev/null) == "$stamp" ]]; then
    exit 0
fi

rm -rf "$WORK"
mkdir -p "$WORK/pkg" "$WORK/root"/{bin,dev,proc,sys,tmp,lib/modules}
# Locked: the other kernel's build may be fetching busybox-static into $DEBS.
exec 8>"$DEBS/.lock"
flock 8
for package in "${packages[@]}"; do
    deb=$(fetch "${package%%=*}" "${package#*=}")
    dpkg-deb -x "$deb" "$WORK/pkg"
done
exec 8>&-

cp "$WORK/pkg/bin/busybox" "$WORK/root/bin/busybox"
applets=$("$WORK/root/bin/busybox" --list-full)
for applet in $applets; do
    mkdir -p "$WORK/root/$(dirname "$applet")"
    [[ -e $WORK/root/$applet ]] || ln -s /bin/busybox "$WORK/root/$applet"
done

need modinfo kmod
moddir=$(echo "$WORK"/pkg/lib/modules/*)
loaded=,
for module in "${MODULES[@]}"; do
    # Built in (modules.builtin lists them as kernel/PATH/NAME.ko): nothing to load.
    # (A dependency on it never appears in modinfo's depends.)
    if grep -q "/$module\.ko\$" "$moddir/modules.builtin"; then
        continue
    fi
    file=$(find "$moddir/kernel" -name "$module.ko" -o -name "$module.ko.xz" -o -name "$module.ko.zst")
    [[ -n $file ]] || die "module $module not found in $kernel_pkg"
    ko=$WORK/root/lib/modules/$module.ko
    install_module "$file" "$ko"
    deps=$(modinfo -F depends "$ko")
    for dep in ${deps//,/ }; do
        [[ $loaded == *,$dep,* ]] || die "module $module needs $dep, which is not loaded before it"
    done
    loaded+=$module,
    echo "$module" >>"$WORK/root/lib/modules/load-order"
done

install -m 755 "$GUEST_SRC/init" "$WORK/root/init"
build_workloads
install_agent

need cpio cpio
(cd "$WORK/root" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) | gzip -9 >"$WORK/initrd.img"
mv "$WORK"/pkg/boot/vmlinuz-* "$OUT/vmlinuz"
mv "$WORK/initrd.img" "$OUT/initrd.img"
echo "$stamp" >"$OUT/stamp"
rm -rf "$WORK"
