#!/usr/bin/env python3
# Does ballooning split QEMU's transparent huge pages under a guest's later allocations,
# what does that cost a TCG guest, and does MADV_COLLAPSE (process_madvise, Linux >= 6.1)
# bring it back? One 512 MiB test guest (guest/build.sh) whose memknobs writes 32 MiB for
# 45 s, then 192 MiB; with an argument, its balloon goes 512 -> 128 -> 512 MiB before the
# 192 MiB phase (as the overcommit benchmark's low-phase guests are). Prints memknobs'
# rate in that phase, QEMU's AnonHugePages, then both after MADV_COLLAPSE over guest RAM.
# Run as root (process_madvise on another process), nothing else on the host:
#   python3 bench/thp-balloon.py; python3 bench/thp-balloon.py balloon
import ctypes, json, os, re, socket, subprocess, sys, tempfile, time
G = os.environ.get("MEMTIDE_GUEST_DIR", "target/guest"); D = tempfile.mkdtemp()
qmp_path = f"{D}/qmp.sock"; serial = f"{D}/serial"
for p in (qmp_path, serial):
    try: os.remove(p)
    except FileNotFoundError: pass
q = subprocess.Popen(["qemu-system-x86_64", "-accel", "tcg,tb-size=16", "-cpu", "qemu64,+rdrand",
    "-m", "512", "-smp", "1", "-nodefaults", "-display", "none", "-no-reboot",
    "-kernel", f"{G}/vmlinuz", "-initrd", f"{G}/initrd.img", "-append",
    "console=ttyS0 no_timer_check panic=-1 quiet cryptomgr.notests ipv6.disable=1 memtide.workload=memknobs memtide.args=32:45,192:1000000",
    "-serial", f"file:{serial}", "-qmp", f"unix:{qmp_path},server=on,wait=off",
    "-device", "virtio-balloon-pci,id=balloon0"], stdin=subprocess.DEVNULL)
try:
    for _ in range(100):
        if os.path.exists(qmp_path): break
        time.sleep(0.1)
    s = socket.socket(socket.AF_UNIX); s.connect(qmp_path); f = s.makefile("rw")
    def cmd(name, args=None):
        f.write(json.dumps({"execute": name, **({"arguments": args} if args else {})}) + "\n"); f.flush()
        while True:
            r = json.loads(f.readline())
            if "return" in r or "error" in r: return r
    json.loads(f.readline()); cmd("qmp_capabilities")
    def rate(secs):
        """Mean of memknobs' per-second report lines over the next secs."""
        start = len(open(serial, errors="replace").read().splitlines()); time.sleep(secs)
        lines = open(serial, errors="replace").read().splitlines()[start:]
        v = [float(m.group(1)) for l in lines if (m := re.search(r"mib_per_s=([0-9.]+)", l))]
        return sum(v) / len(v) if v else float("nan")
    def anon_huge():
        t = open(f"/proc/{q.pid}/smaps_rollup").read()
        return int(re.search(r"AnonHugePages:\s+(\d+)", t).group(1)) // 1024
    balloon = len(sys.argv) > 1
    time.sleep(20)
    if balloon:
        cmd("balloon", {"value": 128 << 20}); time.sleep(12)
        cmd("balloon", {"value": 512 << 20}); time.sleep(8)
    else:
        time.sleep(20)
    time.sleep(10)  # the 192 MiB phase begins at 45 s of the workload
    print("balloon" if balloon else "control", "192 MiB phase:", round(rate(25)), "MiB/s, AnonHugePages", anon_huge(), "MiB", flush=True)
    maps = open(f"/proc/{q.pid}/maps").read().splitlines()
    ram = [l for l in maps if (lambda a, b: b - a == 512 << 20)(*[int(x, 16) for x in l.split()[0].split("-")])]
    lo, hi = [int(x, 16) for x in ram[0].split()[0].split("-")]
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(434, q.pid, 0)
    class iovec(ctypes.Structure): _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    t0 = time.time(); done = 0
    for off in range(0, hi - lo, 2 << 20):
        v = iovec(lo + off, 2 << 20)
        if libc.syscall(440, pidfd, ctypes.byref(v), 1, 25, 0) > 0: done += 1
    print(f"MADV_COLLAPSE: {done} of {(hi-lo)>>21} in {time.time()-t0:.2f} s", flush=True)
    print("after collapse:", round(rate(25)), "MiB/s, AnonHugePages", anon_huge(), "MiB", flush=True)
finally:
    q.kill(); q.wait()
