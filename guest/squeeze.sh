#!/usr/bin/env bash
# Runs one workload in a test guest and squeezes it with the balloon: boots a
# guest with a swap disk, a data disk and the guest agent, then for each
# stage balloons the guest to the stage's size, lets it settle for 2 report
# lines and averages the next LINES lines. Prints the report lines, a summary
# per stage and the guest's swap and refault counters (read with the guest
# agent).
#
#   guest/squeeze.sh WORKLOAD ARGS [STAGE_MIB...]
#
#   guest/squeeze.sh coldalloc --cold-mib+200+--hot-mib+32 384 160 384
#   guest/squeeze.sh filecache --set-mib+200 384 192 384
#   guest/squeeze.sh mix --phases+anon:120:20,file:80:20,idle:0:10   (no stages)
#
# ARGS use guest/init's convention ('+' between arguments). Without stages
# it prints the report lines of one minute (SECS) and quits.
# Environment: MEM_MIB (384), SWAP_MIB (256), DATA_MIB (512), LINES (10),
# SECS (60), MEMTIDE_GUEST_DIR.
set -euo pipefail

GUEST_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GUEST_DIR=${MEMTIDE_GUEST_DIR:-$(dirname "$GUEST_SRC")/target/guest}
if (($# < 2)); then
    echo "usage: guest/squeeze.sh WORKLOAD ARGS [STAGE_MIB...]" >&2
    exit 2
fi
WORKLOAD=$1
ARGS=$2
shift 2
STAGES=("$@")
MEM_MIB=${MEM_MIB:-384}
SWAP_MIB=${SWAP_MIB:-256}
DATA_MIB=${DATA_MIB:-512}
LINES=${LINES:-10}
SECS=${SECS:-60}

fail() {
    echo "squeeze: FAIL: $*" >&2
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
truncate -s "${DATA_MIB}M" "$tmp/data.img"
touch "$tmp/console.log"
# The command line documented in guest/README.md, with both disks and the agent.
qemu-system-x86_64 -accel tcg,tb-size=16 -cpu qemu64,+rdrand -m "$MEM_MIB" -smp 1 \
    -nodefaults -nographic -no-reboot \
    -kernel "$GUEST_DIR/vmlinuz" -initrd "$GUEST_DIR/initrd.img" \
    -append "console=ttyS0 no_timer_check panic=-1 quiet cryptomgr.notests ipv6.disable=1 memtide.workload=$WORKLOAD memtide.args=$ARGS" \
    -serial "file:$tmp/console.log" -qmp "unix:$tmp/qmp.sock,server=on,wait=off" \
    -device virtio-balloon-pci,id=balloon0,deflate-on-oom=on \
    -drive "if=none,id=swap,file=$tmp/swap.img,format=raw" -device virtio-blk-pci,drive=swap,serial=memtide-swap \
    -drive "if=none,id=data,file=$tmp/data.img,format=raw" -device virtio-blk-pci,drive=data,serial=memtide-data \
    -chardev "socket,id=qga0,path=$tmp/qga.sock,server=on,wait=off" \
    -device virtio-serial-pci -device virtserialport,chardev=qga0,name=org.qemu.guest_agent.0 \
    </dev/null &
qemu_pid=$!

# The workload's report lines so far, without the console's carriage returns.
reports() { grep -a "^$WORKLOAD t=" "$tmp/console.log" | tr -d '\r' || true; }

# Waits until there are $1 report lines.
wait_reports() {
    local deadline=$((SECONDS + 60 + 2 * $1))
    until (($(reports | wc -l) >= $1)); do
        kill -0 "$qemu_pid" 2>/dev/null || fail "QEMU exited"
        grep -aq "exited status" "$tmp/console.log" && fail "the workload exited"
        ((SECONDS < deadline)) || fail "only $(reports | wc -l) of $1 report lines"
        sleep 0.2
    done
}

# Talks to QEMU: "control balloon MIB" (waits until reached), "control quit";
# "control agent" prints the guest's swap, refault and memory counters, read
# with the guest agent.
control() {
    python3 - "$tmp" "$@" <<'EOF'
import base64, json, socket, sys, time

tmp, action = sys.argv[1], sys.argv[2]

def connect(path, greeting):
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    io = sock.makefile("rw")
    if greeting:
        io.readline()
    return io

def call(io, command, **arguments):
    io.write(json.dumps({"execute": command, "arguments": arguments}) + "\n")
    io.flush()
    while True:
        reply = json.loads(io.readline())
        if "error" in reply:
            sys.exit(f"squeeze: FAIL: {command}: {reply['error']}")
        if "return" in reply:  # anything else is an asynchronous event
            return reply["return"]

if action == "agent":
    agent = connect(f"{tmp}/qga.sock", greeting=False)
    # Drop replies left over from an earlier client, as the agent protocol asks.
    while call(agent, "guest-sync", id=4242) != 4242:
        pass
    fields = {}
    for path in ("/proc/vmstat", "/proc/meminfo"):
        handle = call(agent, "guest-file-open", path=path, mode="r")
        text = base64.b64decode(call(agent, "guest-file-read", handle=handle, count=65536)["buf-b64"]).decode()
        call(agent, "guest-file-close", handle=handle)
        fields.update(line.replace(":", "").split()[:2] for line in text.splitlines())
    keys = ("workingset_refault_file", "workingset_refault_anon", "pswpin", "pswpout",
            "MemAvailable", "Cached", "SwapFree", "Committed_AS")
    print("squeeze: guest agent: " + " ".join(f"{k}={fields[k]}" for k in keys))
    sys.exit()

qmp = connect(f"{tmp}/qmp.sock", greeting=True)
call(qmp, "qmp_capabilities")
if action == "quit":
    call(qmp, "quit")
    sys.exit()
target = int(sys.argv[3])
call(qmp, "balloon", value=target << 20)
started = time.monotonic()
while abs((actual := call(qmp, "query-balloon")["actual"] >> 20) - target) > 1:
    if time.monotonic() - started > 120:
        sys.exit(f"squeeze: FAIL: balloon stuck at {actual} MiB, target {target} MiB")
    time.sleep(0.2)
print(f"squeeze: balloon at {actual} MiB after {time.monotonic() - started:.1f} s")
EOF
}

# Mean of field $1 (and the sum of refaults, the last cold_resident_mib when
# present) over report lines $2.. $3.
summarize() {
    reports | sed -n "$2,$3p" | awk -v key="$1" '
        { for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
          sum += f[key]; n++; refaults += f["refaults"]; cold = f["cold_resident_mib"] }
        END { printf "mean %s=%.1f over %d lines", key, sum / n, n
              if ("refaults" in f) printf ", refaults=%d", refaults
              if (cold != "") printf ", last cold_resident_mib=%s", cold
              print "" }'
}

wait_reports 1
grep -a "memtide-guest:\|$WORKLOAD setup" "$tmp/console.log" | tr -d '\r'
if ((${#STAGES[@]} == 0)); then
    wait_reports "$SECS"
    reports
else
    for stage in "${STAGES[@]}"; do
        control balloon "$stage"
        first=$(($(reports | wc -l) + 3))
        wait_reports $((first + LINES - 1))
        reports | sed -n "$first,$((first + LINES - 1))p"
        echo "squeeze: guest at $stage MiB: $(summarize mib_per_s "$first" $((first + LINES - 1)))"
        control agent
    done
fi
control quit
wait "$qemu_pid" || fail "QEMU exited with status $? after quit"
qemu_pid=
