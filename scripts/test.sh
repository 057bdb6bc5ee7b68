#!/usr/bin/env bash
# Runs every memtide test on a fresh Debian machine, installing what the tests need:
# QEMU (the end-to-end tests boot real guests under TCG), Debian's qemu-guest-agent (the
# agent client is tested against the real one, and the test guest carries it), the test
# guest (built from Debian's cloud kernel and busybox by guest/build.sh), cargo-nextest.
# Needs root: apt, and memory cgroups for the end-to-end tests. Changes no host-global
# setting: the tests create only their own cgroups, processes and temporary files.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v qemu-system-x86_64 >/dev/null || ! command -v qemu-ga >/dev/null; then
    apt-get update -qq # stale package lists fetch versions the mirror no longer has
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        qemu-system-x86 qemu-guest-agent >/dev/null
fi
command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest

guest/build.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# --run-ignored all: include the end-to-end tests that boot guests.
cargo nextest run --workspace --locked --run-ignored all
