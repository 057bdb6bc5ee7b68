#!/usr/bin/env bash
# Smoke test of the test guest: boots one 384 MiB guest (with a swap disk)
# running memknobs, balloons it down to 256 MiB over QMP, reads the balloon's
# guest stats, and reports timings, QEMU's RSS and memknobs' throughput
# before and after ballooning.
#
#   guest/smoke.sh [PATTERN]    memknobs pattern, default 240:3600: fits in
#                               384 MiB but not in 256 MiB, so it ends up swapping
set -euo pipefail

GUEST_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GUEST_DIR=${MEMTIDE_GUEST_DIR:-$(dirname "$GUEST_SRC")/target/guest}
PATTERN=${1:-240:3600}
MEM_MIB=384
BALLOON_MIB=256
SWAP_MIB=256
LINE_SECS=8 # memknobs reporting time to sample before and after ballooning

fail() {
    echo "smoke: FAIL: $*" >&2
    [[ -f ${tmp:-}/console.log ]] && tail -n 20 "$tmp/console.log" >&2
    exit 1
}

"$GUEST_SRC/build.sh"

tmp=$(mktemp -d)
qemu_pid=
cleanup() {
    [[ -n $qemu_pid ]] && kill "$qemu_pid" 2>/dev/null && wait "$qemu_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

truncate -s "${SWAP_MIB}M" "$tmp/swap.img"
touch "$tmp/console.log" # exists before QEMU creates it, for wait_lines
started=$(date +%s.%N)
# The command line documented in guest/README.md.
qemu-system-x86_64 -accel tcg,tb-size=16 -cpu qemu64,+rdrand -m "$MEM_MIB" -smp 1 \
    -nodefaults -nographic -no-reboot \
    -kernel "$GUEST_DIR/vmlinuz" -initrd "$GUEST_DIR/initrd.img" \
    -append "console=ttyS0 no_timer_check panic=-1 quiet cryptomgr.notests ipv6.disable=1 memtide.workload=memknobs memtide.args=$PATTERN" \
    -serial "file:$tmp/console.log" -qmp "unix:$tmp/qmp.sock,server=on,wait=off" \
    -device virtio-balloon-pci,id=balloon0,deflate-on-oom=on \
    -drive "if=none,id=swap,file=$tmp/swap.img,format=raw" -device virtio-blk-pci,drive=swap \
    </dev/null &
qemu_pid=$!

seconds_since() { echo "$(date +%s.%N) $1" | awk '{ printf "%.1f", $1 - $2 }'; }
# QEMU's resident memory and CPU time so far.
usage() {
    echo "QEMU RSS $(awk '$1 == "VmRSS:" { print int($2 / 1024) }' "/proc/$qemu_pid/status") MiB," \
        "CPU $(awk -v hz="$(getconf CLK_TCK)" '{ printf "%.1f", ($14 + $15) / hz }' "/proc/$qemu_pid/stat") s"
}

# Waits until the console has at least $2 lines containing $1 (not anchored:
# SeaBIOS leaves escape codes at the start of the first line).
wait_lines() {
    local deadline=$((SECONDS + $3))
    until (($(grep -c "$1" "$tmp/console.log" 2>/dev/null) >= $2)); do
        kill -0 "$qemu_pid" 2>/dev/null || fail "QEMU exited while waiting for '$1'"
        ((SECONDS < deadline)) || fail "no '$1' on the console after $3 s"
        sleep 0.1
    done
}

# QMP client, run as "qmp balloon MIB" (balloon to MIB, wait until reached,
# then enable and print the guest stats) or "qmp quit".
qmp() {
    python3 - "$tmp/qmp.sock" "$@" <<'EOF'
import json, socket, sys, time

sock_path, action = sys.argv[1], sys.argv[2]
sock = socket.socket(socket.AF_UNIX)
sock.connect(sock_path)
qmp_io = sock.makefile("rw")
BALLOON = "/machine/peripheral/balloon0"

def qmp(command, **arguments):
    qmp_io.write(json.dumps({"execute": command, "arguments": arguments}) + "\n")
    qmp_io.flush()
    while True:
        reply = json.loads(qmp_io.readline())
        if "error" in reply:
            sys.exit(f"smoke: FAIL: {command}: {reply['error']}")
        if "return" in reply:  # anything else is an asynchronous event
            return reply["return"]

def actual_mib():
    return qmp("query-balloon")["actual"] / 2**20

qmp_io.readline()  # greeting
qmp("qmp_capabilities")
if action == "quit":
    qmp("quit")
    sys.exit()

target_mib = int(sys.argv[3])
print(f"smoke: query-balloon actual={actual_mib():.0f} MiB")
qmp("balloon", value=target_mib << 20)
started = time.monotonic()
while actual_mib() > target_mib:
    if time.monotonic() - started > 120:
        sys.exit(f"smoke: FAIL: balloon stuck at {actual_mib():.0f} MiB, target {target_mib} MiB")
    time.sleep(0.1)
print(f"smoke: balloon reached {actual_mib():.2f} MiB in {time.monotonic() - started:.1f} s")

enabled = time.time()
qmp("qom-set", path=BALLOON, property="guest-stats-polling-interval", value=1)
# The driver's first stats date from its probe at boot: wait for fresh ones.
while (stats := qmp("qom-get", path=BALLOON, property="guest-stats"))["last-update"] < enabled:
    time.sleep(0.2)
print("smoke: guest-stats " + json.dumps(stats))
EOF
}

wait_lines 'memtide-guest: ready' 1 120
echo "smoke: guest ready $(seconds_since "$started") s after QEMU start; $(usage)"
before=$(grep -c 'memknobs t=' "$tmp/console.log" || true)
wait_lines 'memknobs t=' $((before + LINE_SECS)) 60
echo "smoke: memknobs before ballooning:"
grep 'memknobs t=' "$tmp/console.log" | tail -n "$LINE_SECS"
echo "smoke: before ballooning: $(usage)"

qmp balloon "$BALLOON_MIB"

echo "smoke: after ballooning: $(usage)"
before=$(grep -c 'memknobs t=' "$tmp/console.log" || true)
wait_lines 'memknobs t=' $((before + LINE_SECS)) 120
echo "smoke: memknobs after ballooning:"
grep 'memknobs t=' "$tmp/console.log" | tail -n "$LINE_SECS"
qmp quit
wait "$qemu_pid" || fail "QEMU exited with status $? after quit"
qemu_pid=
echo "smoke: PASS"
