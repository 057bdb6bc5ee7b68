#!/usr/bin/env bash
# Builds memtide's Debian package with cargo-deb and checks it, without installing it and
# without touching the host:
#   (a) dpkg-deb --info/--contents: /etc/memtide/memtide.toml is a conffile, the binary
#       and the systemd unit are in it (with what the unit's ExecStart names), its
#       Maintainer is MEMTIDE_DEB_MAINTAINER or Cargo.toml's, it depends
#       on libvirt0 (the libvirt connector is built in), its tmpfiles.d entry makes
#       /run/memtide/qmp (systemd-tmpfiles --root) and the postinst applies it, and the
#       maintainer scripts neither enable nor start the unit; /etc/logrotate.d/memtide
#       is a conffile that rotates the unit's event log and `logrotate -d` accepts; the
#       unit's drop-ins for opt-in features are among the examples, none installed
#       where systemd would read it;
#   (b) the unit, extracted, alone and with each of those drop-ins (and both):
#       `systemd-analyze verify` is clean and `systemd-analyze security --offline=true`
#       rates its exposure at most 4.0 (each exposure printed);
#   (c) the extracted binary, started as the unit would start it (its ExecStart with
#       --dry-run --ticks 3, its UMask, its CapabilityBoundingSet, no new privileges)
#       with the shipped configuration, inside a private mount and network namespace:
#       tmpfs over /run/memtide, /var/lib/memtide and /var/log/memtide (the unit's
#       Runtime/State/LogsDirectory), every other mount read-only (ProtectSystem=strict,
#       as far as a mount namespace can tell), its own loopback: check-config and run
#       must exit 0, and the event log must appear in /var/log/memtide.
# Prints `package-test: N passed, 0 failed` at the end; stops at the first failure with
# what failed. Needs root (namespaces, mounts) on Debian; installs cargo-deb, systemd
# (for systemd-analyze), iproute2 and logrotate if they are missing. The mount points it needs are
# created (and removed afterwards) only where missing; nothing is mounted outside its
# own namespace. The package is left in target/package-test/ ($CARGO_TARGET_DIR's if set).
#
#   scripts/package-test.sh
#   MEMTIDE_DEB_PROFILE=release scripts/package-test.sh   # package a release build
#   MEMTIDE_DEB_MAINTAINER="Name <address>" scripts/package-test.sh   # and stamp it
set -euo pipefail
cd "$(dirname "$0")/.."

MAX_EXPOSURE=4.0
# Debug build by default: CI has built the workspace in the dev profile already, so this
# costs a relink of memtide, where a release build would compile everything again (the
# binary is stripped, so the package is small either way); MEMTIDE_DEB_PROFILE=release
# packages a release build.
PROFILE=${MEMTIDE_DEB_PROFILE:-dev}
OUT_DIR=${CARGO_TARGET_DIR:-target}/package-test

passed=0
fail() {
    echo "package-test: FAIL: $*" >&2
    echo "package-test: $passed passed, 1 failed" >&2
    exit 1
}
pass() {
    passed=$((passed + 1))
    echo "package-test: ok $passed - $*"
}

[[ $(id -u) -eq 0 ]] || fail "needs root (mount and network namespaces, tmpfs mounts)"

missing=()
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v ip >/dev/null || missing+=(iproute2)
command -v logrotate >/dev/null || missing+=(logrotate)
if ((${#missing[@]})); then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi
for tool in dpkg-deb unshare setpriv timeout; do
    command -v "$tool" >/dev/null || fail "$tool is missing (dpkg, util-linux, coreutils)"
done

tmp=$(mktemp -d)
created=()
cleanup() {
    local d
    for d in "${created[@]}"; do rmdir "$d" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

# --- build ---------------------------------------------------------------------------
rm -rf "$OUT_DIR"
echo "package-test: building the package (scripts/package.sh, profile $PROFILE)"
deb=$(MEMTIDE_DEB_PROFILE=$PROFILE scripts/package.sh "$OUT_DIR" | tail -n1) ||
    fail "scripts/package.sh (profile $PROFILE) failed (above)"
[[ -f $deb ]] || fail "scripts/package.sh did not name a package it wrote (got: '$deb')"
echo "package-test: $deb"

# --- (a) metadata and contents -------------------------------------------------------
dpkg-deb --info "$deb" >"$tmp/info" || fail "dpkg-deb --info $deb failed"
conffiles=$(dpkg-deb --info "$deb" conffiles 2>/dev/null) ||
    fail "the package declares no conffiles (dpkg-deb --info $deb conffiles)"
grep -qx /etc/memtide/memtide.toml <<<"$conffiles" ||
    fail "/etc/memtide/memtide.toml is not a declared conffile; conffiles: $conffiles"
pass "/etc/memtide/memtide.toml is a declared conffile"

dpkg-deb --contents "$deb" >"$tmp/contents" || fail "dpkg-deb --contents $deb failed"
# "-rwxr-xr-x 0/0 SIZE DATE TIME ./usr/bin/memtide": the mode and the path.
entry() { awk -v p="./$1" '$NF == p { print $1 }' "$tmp/contents"; }
[[ $(entry usr/bin/memtide) == -rwx* ]] ||
    fail "no executable ./usr/bin/memtide in the package"
[[ $(entry etc/memtide/memtide.toml) == -* ]] ||
    fail "no ./etc/memtide/memtide.toml in the package"
unit_path=
for p in usr/lib/systemd/system/memtide.service lib/systemd/system/memtide.service; do
    [[ $(entry "$p") == -* ]] && unit_path=$p
done
[[ -n $unit_path ]] ||
    fail "no memtide.service under ./usr/lib/systemd/system or ./lib/systemd/system"
pass "the binary (usr/bin/memtide), the configuration and the unit ($unit_path) are in the package"

for p in usr/share/man/man1/memtide.1 usr/share/man/man1/memtide-run.1 \
    usr/share/man/man1/memtide-snapshot-save.1 usr/share/bash-completion/completions/memtide \
    usr/share/zsh/vendor-completions/_memtide usr/share/fish/vendor_completions.d/memtide.fish; do
    [[ $(entry "$p") == -* || $(entry "$p.gz") == -* ]] || fail "no ./$p in the package"
done
pass "the man pages (memtide.1 and the subcommands') and the bash, zsh and fish completions are in the package"

# The Maintainer field: MEMTIDE_DEB_MAINTAINER when given, else Cargo.toml's, which says
# that memtide has no public address; never the placeholder identity it once had.
maintainer=$(sed -n 's/^ *Maintainer: //p' "$tmp/info")
expected=${MEMTIDE_DEB_MAINTAINER:-memtide developers <memtide@localhost>}
[[ $maintainer == "$expected" ]] ||
    fail "the package's Maintainer is '$maintainer', not '$expected'"
pass "Maintainer: $maintainer"

# The libvirt connector is in the binary: the package depends on the library it links.
depends=$(sed -n 's/^ *Depends: //p' "$tmp/info")
grep -qE '(^|, )libvirt0( |,|$)' <<<"$depends" ||
    fail "the package does not depend on libvirt0 (built without the libvirt feature?): Depends: $depends"
pass "the package depends on libvirt0 (the libvirt connector is built in)"

root=$tmp/root
mkdir "$root"
dpkg-deb -x "$deb" "$root" || fail "dpkg-deb -x $deb failed"
# /run/memtide/qmp is made at boot and on installation (systemd-tmpfiles), so that VMs
# started before memtide can put their sockets there.
tmpfiles=usr/lib/tmpfiles.d/memtide.conf
[[ -f $root/$tmpfiles ]] || fail "no ./$tmpfiles in the package"
grep -q "systemd-tmpfiles --create memtide.conf" <<<"$(dpkg-deb --info "$deb" postinst 2>/dev/null)" ||
    fail "the postinst does not apply $tmpfiles"
mkdir "$tmp/tmpfiles-root"
systemd-tmpfiles --create --root="$tmp/tmpfiles-root" "$root/$tmpfiles" >&2 ||
    fail "systemd-tmpfiles --create $tmpfiles failed (above)"
[[ $(stat -c %a "$tmp/tmpfiles-root/run/memtide/qmp" 2>/dev/null) == 755 ]] ||
    fail "systemd-tmpfiles did not make /run/memtide/qmp (mode 0755) from $tmpfiles"
pass "$tmpfiles makes /run/memtide/qmp, and the postinst applies it"
unit=$root/$unit_path
# The value of a [Service] setting in the unit (the last one given).
unit_value() { sed -n "s/^$1=//p" "$unit" | tail -n1; }
read -r -a exec_start <<<"$(unit_value ExecStart)"
((${#exec_start[@]})) || fail "the unit has no ExecStart="
# ExecStart as it runs from the extracted tree: each absolute path the package holds is
# taken from there.
sandboxed_exec=()
for word in "${exec_start[@]}"; do
    if [[ $word == /* ]]; then
        [[ -e $root$word ]] || fail "the unit's ExecStart names $word, which the package does not hold"
        word=$root$word
    fi
    sandboxed_exec+=("$word")
done
pass "the unit's ExecStart (${exec_start[*]}) names files the package holds"

scripts=""
for s in preinst postinst prerm postrm; do
    scripts+=$(dpkg-deb --info "$deb" "$s" 2>/dev/null || true)$'\n'
done
# Only try-restart (on upgrade, if it runs) is allowed; deb-systemd-helper enable only
# where the operator had enabled it (below `if ... was-enabled`).
if grep -nE 'deb-systemd-invoke +(start|restart)|systemctl [^;|&]*(start|enable)' <<<"$scripts" >&2; then
    fail "the maintainer scripts start or enable memtide.service (lines above)"
fi
awk '/was-enabled/ { guarded = 1 } /^[[:space:]]*fi[[:space:]]*$/ { guarded = 0 }
     /deb-systemd-helper +enable/ && !guarded { print; bad = 1 } END { exit bad }' \
    <<<"$scripts" >&2 || fail "the maintainer scripts enable memtide.service unconditionally (above)"
pass "the maintainer scripts neither enable nor start memtide.service"

# logrotate: the event log where the unit's LogsDirectory= puts it, reopened on SIGHUP
# (systemctl kill, so that a configuration being edited fails no rotation).
logrotate_conf=etc/logrotate.d/memtide
[[ -f $root/$logrotate_conf ]] || fail "no ./$logrotate_conf in the package"
grep -qx "/$logrotate_conf" <<<"$conffiles" ||
    fail "/$logrotate_conf is not a declared conffile; conffiles: $conffiles"
logs_dir=$(sed -n 's/^LogsDirectory=//p' "$root/$unit_path" | tail -n1)
grep -q "^/var/log/$logs_dir/events.jsonl {" "$root/$logrotate_conf" ||
    fail "$logrotate_conf does not rotate /var/log/$logs_dir/events.jsonl (the unit's LogsDirectory=$logs_dir)"
grep -q "systemctl kill --kill-whom=main --signal=HUP memtide.service" "$root/$logrotate_conf" ||
    fail "$logrotate_conf does not make memtide reopen its log (SIGHUP by systemctl kill)"
# -d: debug, nothing rotated; its own state file, so the host's is neither read nor written.
if ! logrotate -d --state "$tmp/logrotate.state" "$root/$logrotate_conf" >"$tmp/logrotate.out" 2>&1 ||
    grep -q '^error' "$tmp/logrotate.out"; then
    cat "$tmp/logrotate.out" >&2
    fail "logrotate -d $logrotate_conf does not accept it (above)"
fi
pass "/$logrotate_conf: a conffile rotating /var/log/$logs_dir/events.jsonl, accepted by logrotate -d"

# The unit's drop-ins for opt-in features: examples only. systemd reads drop-ins from
# /etc, /run and /usr/lib (and /lib) systemd/system; the package puts none there.
dropin_dir=usr/share/doc/memtide/examples/memtide.service.d
dropins=(reclaim.conf tiering-place.conf)
for d in "${dropins[@]}"; do
    [[ -f $root/$dropin_dir/$d ]] || fail "no ./$dropin_dir/$d in the package"
done
if grep -E '\./(etc|run|usr/lib|lib)/systemd/system/[^ ]*\.d/' "$tmp/contents" >&2; then
    fail "the package installs a drop-in where systemd reads it (above)"
fi
pass "the drop-ins ${dropins[*]} are examples in /$dropin_dir, none enabled"

# --- (b) the unit --------------------------------------------------------------------
# `systemd-analyze verify --root=` (systemd 252) resolves every path inside the root:
# sysinit.target and the other default dependencies, the binary of ExecReload. An
# extracted package has none of those, so the unit is verified from a copy whose
# ExecStart and ExecReload name the extracted binary instead of /usr/bin/memtide. Both verify and
# security read the drop-ins in memtide.service.d/ beside the unit they are given: the
# unit is checked alone, with each drop-in the package ships, and with all of them.
# check_unit NAME [DROPIN...]
units_checked=0
check_unit() {
    local name=$1 dir d exposure
    shift
    units_checked=$((units_checked + 1))
    dir=$tmp/unit-$units_checked
    mkdir -p "$dir/memtide.service.d"
    sed -e "s|^ExecStart=${exec_start[0]}|ExecStart=$root${exec_start[0]}|" \
        -e "s|^ExecReload=${exec_start[0]}|ExecReload=$root${exec_start[0]}|" "$unit" >"$dir/memtide.service"
    for d in "$@"; do cp "$root/$dropin_dir/$d" "$dir/memtide.service.d/"; done
    if ! SYSTEMD_COLORS=0 systemd-analyze verify "$dir/memtide.service" >"$dir/verify.out" 2>&1 ||
        grep -q memtide "$dir/verify.out"; then
        cat "$dir/verify.out" >&2
        fail "systemd-analyze verify memtide.service ($name) is not clean (above)"
    fi
    pass "systemd-analyze verify memtide.service ($name): clean"

    SYSTEMD_COLORS=0 systemd-analyze security --offline=true "$dir/memtide.service" >"$dir/security.out" 2>&1 || {
        cat "$dir/security.out" >&2
        fail "systemd-analyze security --offline=true ($name) failed (above)"
    }
    exposure=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$dir/security.out")
    [[ -n $exposure ]] || {
        tail -n5 "$dir/security.out" >&2
        fail "no overall exposure level in systemd-analyze security's output ($name)"
    }
    awk -v e="$exposure" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(e <= m) }' || {
        grep '✗' "$dir/security.out" >&2 || true
        fail "memtide.service's exposure ($name) is $exposure, above $MAX_EXPOSURE (the settings that cost, above)"
    }
    pass "systemd-analyze security ($name): exposure $exposure (at most $MAX_EXPOSURE)"
}
check_unit "the unit alone"
for d in "${dropins[@]}"; do
    check_unit "with $d" "$d"
done
check_unit "with every drop-in" "${dropins[@]}"

# --- (c) the daemon, as the unit starts it -------------------------------------------
state_dirs=(/run/memtide /var/lib/memtide /var/log/memtide)
for d in "${state_dirs[@]}"; do
    if [[ ! -e $d ]]; then
        mkdir "$d"
        created+=("$d")
    fi
done
umask_value=$(unit_value UMask)
# CapabilityBoundingSet=CAP_A CAP_B -> setpriv's -all,+a,+b
bounding=-all
for cap in $(unit_value CapabilityBoundingSet); do
    cap=${cap,,}
    bounding+=",+${cap#cap_}"
done

# in_sandbox EXPECTED_FILE CMD...: run CMD as the unit would, in private mount and
# network namespaces; then require EXPECTED_FILE (if not "") to exist there.
in_sandbox() {
    # shellcheck disable=SC2016 # the script is expanded by the inner bash
    unshare --mount --net --fork -- bash -euo pipefail -c '
        umask_value=$1 bounding=$2 expect=$3
        shift 3
        # ProtectSystem=strict: every mount read-only but the API file systems.
        findmnt -rn -o TARGET | while read -r m; do
            case $m in /proc | /proc/* | /sys | /sys/* | /dev | /dev/*) continue ;; esac
            mount -o remount,bind,ro "$m" 2>/dev/null || true
        done
        # RuntimeDirectory= (0755), StateDirectory= and LogsDirectory= (0700).
        mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run/memtide
        mount -t tmpfs -o mode=0700,nosuid,nodev tmpfs /var/lib/memtide
        mount -t tmpfs -o mode=0700,nosuid,nodev tmpfs /var/log/memtide
        ip link set lo up
        umask "${umask_value:-0022}"
        set +e
        timeout 120 setpriv --bounding-set "$bounding" --inh-caps=-all --no-new-privs -- "$@"
        rc=$?
        set -e
        if [[ $rc -eq 0 && -n $expect && ! -e $expect ]]; then
            echo "$expect was not written" >&2
            exit 97
        fi
        exit "$rc"
    ' sandbox "$umask_value" "$bounding" "$1" "${@:2}"
}

config=$root/etc/memtide/memtide.toml
in_sandbox "" "$root/usr/bin/memtide" check-config "$config" >"$tmp/check.out" 2>&1 || {
    cat "$tmp/check.out" >&2
    fail "memtide check-config $config exited non-zero (above)"
}
pass "memtide check-config with the shipped /etc/memtide/memtide.toml"

in_sandbox /var/log/memtide/events.jsonl "${sandboxed_exec[@]}" --dry-run --ticks 3 \
    >"$tmp/run.out" 2>&1 || {
    rc=$?
    cat "$tmp/run.out" >&2
    fail "'${exec_start[*]} --dry-run --ticks 3' (the unit's ExecStart, from the package) exited $rc (above)"
}
pass "memtide run as the unit starts it (--dry-run --ticks 3, umask ${umask_value:-0022}, capabilities $bounding): exit 0, event log written"

echo "package-test: $passed passed, 0 failed"
