#!/usr/bin/env bash
# Runs every memtide test on a fresh Debian machine, installing what the tests need:
# QEMU (the end-to-end tests boot real guests under TCG), Debian's qemu-guest-agent (the
# agent client is tested against the real one, and the test guest carries it), the test
# guest (built from Debian's cloud kernel and busybox by guest/build.sh), libvirt (its
# C library to build the libvirt connector, its daemon for the libvirt end-to-end test,
# which starts one of its own as user nobody), tmux (`memtide top` is driven in it),
# cargo-nextest, for the Debian package cargo-deb and systemd's systemd-analyze
# (scripts/package-test.sh, with iproute2 and logrotate for `logrotate -d`), flex, bison,
# bc and libelf-dev (guest/build-idle-kernel.sh compiles a kernel),
# promtool (the live /metrics, the alert rules and the dashboard's queries are checked
# with it), unpacked from Debian's prometheus package into target/tools rather than
# installed: installing it would enable a Prometheus server, and python3-venv for
# kubernetes-validate (the KubeVirt manifest against the Kubernetes API schema).
# reclaim_e2e also uses ldd, objcopy and mke2fs (libc-bin, binutils, e2fsprogs: there
# wherever Rust builds on Debian) to carry memtide's binary into the guest.
# Needs root: apt, and memory cgroups for the end-to-end tests. Changes no host-global
# setting: the tests create only their own cgroups, processes and temporary files.
set -euo pipefail
cd "$(dirname "$0")/.."

# Also what guest/build-idle-kernel.sh (gcc, make, flex, bison, bc, libelf-dev) and
# scripts/package-test.sh (systemd, iproute2, logrotate) would install: the kernel is built
# beside the package test, and two apt-get at once fail on dpkg's lock.
if ! command -v qemu-system-x86_64 >/dev/null || ! command -v qemu-ga >/dev/null ||
    ! command -v libvirtd >/dev/null || ! command -v virsh >/dev/null ||
    ! command -v tmux >/dev/null || ! python3 -c 'import ensurepip' 2>/dev/null ||
    ! pkg-config --exists libvirt libvirt-qemu 2>/dev/null ||
    ! command -v gcc >/dev/null || ! command -v make >/dev/null ||
    ! command -v flex >/dev/null || ! command -v bison >/dev/null ||
    ! command -v bc >/dev/null || [ ! -f /usr/include/libelf.h ] ||
    ! command -v systemd-analyze >/dev/null || ! command -v ip >/dev/null ||
    ! command -v logrotate >/dev/null; then
    apt-get update -qq # stale package lists fetch versions the mirror no longer has
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        qemu-system-x86 qemu-guest-agent pkg-config libvirt-dev tmux python3-venv \
        libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients \
        gcc make flex bison bc libelf-dev systemd iproute2 logrotate >/dev/null
fi
command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest
if ! command -v promtool >/dev/null; then
    tools="$PWD/target/tools"
    if [ ! -x "$tools/usr/bin/promtool" ]; then
        mkdir -p "$tools"
        (cd "$tools" && apt-get download -qq prometheus && dpkg-deb -x prometheus_*.deb . &&
            rm prometheus_*.deb)
    fi
    export PATH="$tools/usr/bin:$PATH"
fi

guest/build.sh
# damon_e2e's guest: Debian's 6.12 kernel has DAMON (target/guest/linux-6.12).
MEMTIDE_GUEST_KERNEL=6.12 guest/build.sh
# QEMU 10 beside 7.2, for the mapped-ram snapshot test (docs/snapshots.md).
scripts/newer-qemu.sh
# access_e2e's, place_e2e's and zswap_e2e's guest kernel: none of Debian's has idle page
# tracking or zswap (cached once built). Compiling it takes minutes: it runs in a process
# group of its own beside the lints and builds below (which leave a core idle now and
# then), is awaited before the tests, and is stopped if anything before them fails.
kernel_log=$(mktemp)
setsid --wait guest/build-idle-kernel.sh >"$kernel_log" 2>&1 &
kernel=$!
trap 'kill -- -"$kernel" "$kernel" 2>/dev/null; rm -f "$kernel_log"' EXIT
cargo fmt --all --check
scripts/rust-version.sh
# The libvirt connector is a cargo feature (it links against libvirt): lint and test
# with it, and lint the crates it touches without it too.
cargo clippy --workspace --all-targets --locked --features memtide/libvirt -- -D warnings
cargo clippy -p memtide -p memtide-adapters --all-targets --locked -- -D warnings
# The Debian package: built, its unit checked by systemd-analyze, its binary started as
# the unit would start it (in namespaces of its own: nothing on the host changes).
scripts/package-test.sh
# The alert rules: valid, and each alert fires on its fixture and not on its neighbours.
promtool check rules contrib/prometheus/memtide-alerts.yml
promtool test rules contrib/prometheus/memtide-alerts.test.yml
# The Grafana dashboard's PromQL: every panel query and query variable, Grafana's
# variables filled in, parsed by promtool as recording rules.
scripts/check-dashboard.py contrib/grafana/memtide.json
# The KubeVirt manifest against the Kubernetes API schema (kubernetes-validate, from PyPI,
# in a virtual environment of its own under target/tools).
venv=target/tools/venv
[ -x "$venv/bin/kubernetes-validate" ] ||
    { python3 -m venv "$venv" && "$venv/bin/pip" install -q kubernetes-validate==1.37.0; }
"$venv/bin/kubernetes-validate" --strict --quiet contrib/kubevirt/memtide-daemonset.yaml
wait "$kernel" || { cat "$kernel_log" >&2; exit 1; }
trap 'rm -f "$kernel_log"' EXIT # its pid may be another process's from now on
# --run-ignored all: include the end-to-end tests that boot guests; not the one that
# rewrites the committed recording (run by hand when the model or the format changes).
cargo nextest run --workspace --locked --features memtide/libvirt --run-ignored all \
    -E 'not test(=regenerate_the_committed_recording)'
