#!/usr/bin/env bash
# Soak: the memtide daemon (release build, policy memtide with the host declared short,
# so it probes and moves the balloons all the time) managing two 384 MiB test guests
# whose working sets change every 90 to 120 s, for SOAK_S seconds (default 7200, the
# 2 h target of issue #16). Every 10 s it samples the daemon's RSS
# (/proc/PID/status VmRSS), its open descriptors (/proc/PID/fd) and which VMs it
# manages (`memtide status --json`); a daemon that exits is counted and started again.
# Writes bench/results/soak.json (or $SOAK_OUT) and the samples beside it (.csv).
#
#   bench/soak.sh                 # 2 h
#   SOAK_S=1200 bench/soak.sh     # 20 min
#
# Needs QEMU (TCG is enough) and the test guest (guest/build.sh, run here). Changes no
# host-global setting; the guests and the daemon run as children of this script and are
# stopped when it ends; everything else lives in a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SOAK_S=${SOAK_S:-7200}
OUT=${SOAK_OUT:-$REPO/bench/results/soak.json}
SAMPLE_S=10
GUEST_DIR=${MEMTIDE_GUEST_DIR:-$REPO/target/guest}

cargo build --release --locked -p memtide --bin memtide
guest/build.sh
MEMTIDE=$REPO/target/release/memtide

tmp=$(mktemp -d)
pids=()
daemon=
cleanup() {
    [[ -n $daemon ]] && kill "$daemon" 2>/dev/null || true
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

# boot NAME MEMKNOBS_PATTERN: a 384 MiB guest with a balloon, a swap disk, the guest
# agent and QMP, running memknobs through the pattern's phases (MiB:seconds) forever.
boot() {
    truncate -s 128M "$tmp/$1.swap.img"
    qemu-system-x86_64 -accel tcg,tb-size=16 -cpu qemu64,+rdrand -m 384 -smp 1 \
        -nodefaults -display none -no-reboot \
        -kernel "$GUEST_DIR/vmlinuz" -initrd "$GUEST_DIR/initrd.img" \
        -append "console=ttyS0 no_timer_check panic=-1 quiet cryptomgr.notests ipv6.disable=1 memtide.workload=memknobs memtide.args=$2" \
        -serial "file:$tmp/$1.serial" -qmp "unix:$tmp/$1.qmp,server=on,wait=off" \
        -device virtio-balloon-pci,id=balloon0,deflate-on-oom=on \
        -drive "if=none,id=swap,file=$tmp/$1.swap.img,format=raw" \
        -device virtio-blk-pci,drive=swap,serial=memtide-swap \
        -chardev "socket,id=qga0,path=$tmp/$1.qga,server=on,wait=off" \
        -device virtio-serial-pci -device virtserialport,chardev=qga0,name=org.qemu.guest_agent.0 \
        </dev/null >"$tmp/$1.qemu.log" 2>&1 &
    pids+=($!)
}
boot a 200:120,80:120,260:120
boot b 60:90,180:90
for g in a b; do
    for _ in $(seq 300); do
        grep -q "memtide-guest: ready" "$tmp/$g.serial" 2>/dev/null && break
        sleep 1
    done
    grep -q "memtide-guest: ready" "$tmp/$g.serial" || {
        echo "soak: guest $g did not boot" >&2
        tail "$tmp/$g.serial" >&2
        exit 1
    }
done

cat >"$tmp/memtide.toml" <<EOF
interval_s = 2
policy = "memtide"
[daemon]
socket = "$tmp/memtide.sock"
event_log = "$tmp/events.jsonl"
state_file = "$tmp/state.json"
http = ""
[discovery]
qmp_glob = []
[engine]
ksm_control = false
# The host declared short: memtide probes at full speed and the balloons keep moving.
[memtide]
ample_free = 1.01
short_free = 1.01
[[vm]]
name = "a"
qmp = "$tmp/a.qmp"
agent = "$tmp/a.qga"
[[vm]]
name = "b"
qmp = "$tmp/b.qmp"
agent = "$tmp/b.qga"
EOF
start_daemon() {
    MEMTIDE_LOG=warn "$MEMTIDE" run --config "$tmp/memtide.toml" 2>>"$tmp/daemon.log" >/dev/null &
    daemon=$!
}
start_daemon
sleep 20 # connected, first ticks made

csv=${OUT%.json}.csv
echo "t_s,rss_kib,fds,managed,vms,a_mib,b_mib" >"$csv"
exits=0
start=$(date +%s)
while :; do
    now=$(date +%s)
    if ! kill -0 "$daemon" 2>/dev/null; then
        exits=$((exits + 1))
        echo "soak: the daemon exited at $((now - start)) s; its log:" >&2
        tail -20 "$tmp/daemon.log" >&2
        start_daemon
        sleep 5
        continue
    fi
    rss=$(awk '$1 == "VmRSS:" { print $2 }' "/proc/$daemon/status")
    fds=$(find "/proc/$daemon/fd" -mindepth 1 -maxdepth 1 | wc -l)
    # managed VMs (sampled, given a reason), and a's and b's balloon sizes (MiB, -1: none)
    seen=$("$MEMTIDE" status --json --socket "$tmp/memtide.sock" 2>/dev/null | jq -r '
        [.decision.vms[]?] as $v
        | def size($n): ($v | map(select(.name == $n))[0].actual // -1048576) / 1048576 | floor;
        "\([$v[] | select(.state == "managed" and .reason != null)] | length),2,\(size("a")),\(size("b"))"' ||
        echo "0,2,-1,-1")
    echo "$((now - start)),$rss,$fds,$seen" >>"$csv"
    ((now - start >= SOAK_S)) && break
    sleep "$SAMPLE_S"
done
status=$("$MEMTIDE" status --json --socket "$tmp/memtide.sock")

jq -n --rawfile csv "$csv" \
    --arg command "SOAK_S=$SOAK_S bench/soak.sh" \
    --arg commit "$(git rev-parse --short HEAD)" \
    --argjson exits "$exits" \
    --argjson status "$status" \
    --argjson events "$(wc -l <"$tmp/events.jsonl")" '
    ($csv | split("\n") | .[1:] | map(select(. != "") | split(",") | map(tonumber))) as $s
    | {
        command: $command,
        commit: $commit,
        duration_s: ($s[-1][0]),
        samples: ($s | length),
        daemon_exits: $exits,
        rss_mib_start: ($s[0][1] / 1024 | . * 10 | round / 10),
        rss_mib_end: ($s[-1][1] / 1024 | . * 10 | round / 10),
        rss_mib_max: ($s | map(.[1]) | max / 1024 | . * 10 | round / 10),
        fds_start: $s[0][2],
        fds_end: $s[-1][2],
        fds_max: ($s | map(.[2]) | max),
        vms_managed_share: (($s | map(.[3]) | add) / ($s | map(.[4]) | add) | . * 1000 | round / 1000),
        balloon_mib_range: {
            a: [($s | map(.[5]) | map(select(. >= 0)) | min), ($s | map(.[5]) | max)],
            b: [($s | map(.[6]) | map(select(. >= 0)) | min), ($s | map(.[6]) | max)]
        },
        ticks: $status.counters.ticks,
        actions: $status.counters.actions,
        event_log_lines: $events,
        guests: "two 384 MiB test guests under TCG, memknobs 200:120,80:120,260:120 and 60:90,180:90 (MiB:s, repeated)"
    }' >"$OUT"
cat "$OUT"
