#!/usr/bin/env bash
# Builds memtide's Debian package with cargo-deb: the binary (with the libvirt connector:
# it needs libvirt-dev to build, and the package depends on libvirt0), the systemd unit
# (contrib/systemd/memtide.service) and its tmpfiles.d entry (contrib/systemd/
# memtide.tmpfile), /etc/memtide/memtide.toml (contrib/memtide.toml, a conffile), the man
# page and shell completions (made by the binary from its command line definition), and
# the docs. Prints the package's path on its last line.
#
#   scripts/package.sh [OUT_DIR]                  # a release build, in target/debian
#   MEMTIDE_DEB_PROFILE=dev scripts/package.sh    # a debug build (what CI checks: faster)
#   MEMTIDE_DEB_MAINTAINER="Name <address>" scripts/package.sh   # the package's Maintainer
#       (Cargo.toml's says that memtide has no public address: memtide@localhost)
#
# Installs cargo-deb if missing. cargo-deb 3.8 packages a dev build with a warning that
# it may refuse in the future: hence the pinned version.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${MEMTIDE_DEB_PROFILE:-release}
OUT_DIR=${1:-${CARGO_TARGET_DIR:-target}/debian}
command -v cargo-deb >/dev/null || cargo install --locked cargo-deb --version "~3.8"

# The generated assets go beside the binary, where Cargo.toml's "target/release/"
# placeholder points for any profile.
bin_dir=${CARGO_TARGET_DIR:-target}/$([[ $PROFILE == dev ]] && echo debug || echo "$PROFILE")
cargo build -p memtide --locked --features libvirt --profile "$PROFILE" >&2
rm -rf "$bin_dir/man" && mkdir "$bin_dir/man"
"$bin_dir/memtide" man --out-dir "$bin_dir/man"
for shell in bash zsh fish; do
    "$bin_dir/memtide" completions "$shell" >"$bin_dir/memtide.$shell"
done
maintainer=()
[[ -n ${MEMTIDE_DEB_MAINTAINER:-} ]] && maintainer=(--maintainer "$MEMTIDE_DEB_MAINTAINER")
cargo deb -p memtide --locked --profile "$PROFILE" --strip --fast --no-build \
    "${maintainer[@]}" -o "$OUT_DIR" | tail -n1
