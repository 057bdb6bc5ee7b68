#!/usr/bin/env python3
# Why overcommit's guests run slower after memtide gave them memory back (docs/benchmarks.md,
# "overcommit"): two 384 MiB test guests (guest/build.sh) with 128 MiB of guest swap run
# memknobs 32:40,200:forever side by side. Guest T's balloon goes to 128 MiB in the 32 MiB
# phase; guest C is left alone. When the 200 MiB phase begins, T gets its memory back:
#   steps    176, then 330, then 357 MiB, 3 report lines apart (what memtide did in the
#            overcommit run: the guest swaps while it writes its buffer)
#   early    384 MiB two lines before the phase (no swap)
#   control  T's balloon is never moved
#   at:MIB   MIB at once as the phase begins (no swap if MIB covers the phase)
# Over report lines 55-115 it prints memknobs' rate per second of QEMU CPU time of T over C
# ("efficiency": the CPU each got cancels, so other work on the host matters little).
# Options: KERNEL_ARGS (added to both guests' command line), --collapse (then MADV_COLLAPSE
# over T's guest RAM, Linux >= 6.1, run as root, and a second window), --domain=MIB (both
# QEMUs in a cgroup v1 memory domain whose limit is set, once T's balloon has moved, to
# their usage plus MIB, as the overcommit benchmark's domain stands near its limit; needs
# --host-swap-mib=N, a swap file of N MiB enabled for the run and removed after it: a
# change of the host's settings, made only when asked).
#   python3 bench/swap-layout.py steps [--collapse] [--domain=MIB --host-swap-mib=N] [KERNEL_ARGS]
import ctypes, json, os, re, socket, subprocess, sys, tempfile, time

G = os.environ.get("MEMTIDE_GUEST_DIR", "target/guest")
mode, *rest = sys.argv[1:]
collapse = "--collapse" in rest
opt = {a.split("=")[0]: int(a.split("=")[1]) for a in rest if a.startswith(("--domain=", "--host-swap-mib="))}
extra = " ".join(a for a in rest if not a.startswith("--"))
assert ("--domain" in opt) == ("--host-swap-mib" in opt), "--domain needs --host-swap-mib"
assert mode in ("steps", "early", "control") or mode.startswith("at:"), __doc__
D = tempfile.mkdtemp()


def boot(name):
    swap = f"{D}/{name}.swap"
    subprocess.run(["truncate", "-s", "128M", swap], check=True)
    qmp, serial = f"{D}/{name}.qmp", f"{D}/{name}.serial"
    p = subprocess.Popen(["qemu-system-x86_64", "-accel", "tcg,tb-size=16", "-cpu", "qemu64,+rdrand",
        "-m", "384", "-smp", "1", "-nodefaults", "-display", "none", "-no-reboot",
        "-kernel", f"{G}/vmlinuz", "-initrd", f"{G}/initrd.img", "-append",
        "console=ttyS0 no_timer_check panic=-1 quiet cryptomgr.notests ipv6.disable=1 "
        f"memtide.workload=memknobs memtide.args=32:40,200:1000000 {extra}",
        "-serial", f"file:{serial}", "-qmp", f"unix:{qmp},server=on,wait=off",
        "-device", "virtio-balloon-pci,id=balloon0,deflate-on-oom=on",
        "-drive", f"if=none,id=swap,file={swap},format=raw", "-device", "virtio-blk-pci,drive=swap,serial=swap"],
        stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return p, qmp, serial


def monitor(path):
    for _ in range(100):
        if os.path.exists(path):
            break
        time.sleep(0.1)
    s = socket.socket(socket.AF_UNIX); s.connect(path); f = s.makefile("rw")
    def cmd(name, args=None):
        f.write(json.dumps({"execute": name, **({"arguments": args} if args else {})}) + "\n"); f.flush()
        while True:
            r = json.loads(f.readline())
            if "return" in r or "error" in r:
                return r
    json.loads(f.readline()); cmd("qmp_capabilities")
    return cmd


def rates(serial):
    text = open(serial, errors="replace").read()
    return [float(m.group(1)) for m in re.finditer(r"mib_per_s=([0-9.]+)", text)]


def cpu_ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def huge_mib(pid):
    return int(re.search(r"AnonHugePages:\s+(\d+)", open(f"/proc/{pid}/smaps_rollup").read()).group(1)) // 1024


def vmstat(*keys):
    v = dict(l.split() for l in open("/proc/vmstat"))
    return [int(v[k]) for k in keys]


CG = f"/sys/fs/cgroup/memory/swap-layout-{os.getpid()}"
SWAP = f"/var/tmp/swap-layout-{os.getpid()}.swap"
if "--domain" in opt:
    os.mkdir(CG)
    subprocess.run(["dd", "if=/dev/zero", f"of={SWAP}", "bs=1M", f"count={opt['--host-swap-mib']}", "status=none"], check=True)
    os.chmod(SWAP, 0o600)
    subprocess.run(["mkswap", "-q", SWAP], check=True)
    subprocess.run(["swapon", SWAP], check=True)
(qt, qmp_t, ser_t), (qc, qmp_c, ser_c) = boot("T"), boot("C")
try:
    if "--domain" in opt:
        for p in (qt, qc):
            open(f"{CG}/cgroup.procs", "w").write(str(p.pid))
    balloon = monitor(qmp_t)
    monitor(qmp_c)
    def line(n):
        """Wait for T's n-th report line (the guests' own clock paces the phases)."""
        while len(rates(ser_t)) < n:
            time.sleep(0.05)
    def efficiency(lines):
        k_t, k_c, c0 = len(rates(ser_t)), len(rates(ser_c)), (cpu_ticks(qt.pid), cpu_ticks(qc.pid))
        line(k_t + lines)
        c1 = (cpu_ticks(qt.pid), cpu_ticks(qc.pid))
        r_t, r_c = rates(ser_t)[k_t:], rates(ser_c)[k_c:]
        e_t = sum(r_t) / len(r_t) / (c1[0] - c0[0])
        e_c = sum(r_c) / len(r_c) / (c1[1] - c0[1])
        print(f"MiB/s per CPU tick: T {e_t:.0f}, C {e_c:.0f}", flush=True)
        return e_t / e_c, sum(r_t) / len(r_t), sum(r_c) / len(r_c)
    line(5)
    if mode != "control":
        balloon("balloon", {"value": 128 << 20})
    line(38)
    if mode == "early":
        balloon("balloon", {"value": 384 << 20})
    line(40)
    if mode.startswith("at:"):
        balloon("balloon", {"value": int(mode[3:]) << 20})
    if mode == "steps":
        for n, mib in ((40, 176), (43, 330), (46, 357)):
            line(n); balloon("balloon", {"value": mib << 20})
    if "--domain" in opt:
        line(50)
        usage = int(open(f"{CG}/memory.usage_in_bytes").read())
        open(f"{CG}/memory.limit_in_bytes", "w").write(str(usage + (opt["--domain"] << 20)))
        print(f"domain limit {usage // 2**20} + {opt['--domain']} MiB", flush=True)
    line(55)
    swap0 = vmstat("pswpin", "pswpout")
    e, r_t, r_c = efficiency(60)
    if "--domain" in opt:
        swap1 = vmstat("pswpin", "pswpout")
        stat = dict(l.split() for l in open(f"{CG}/memory.stat"))
        print(f"host swap-ins {swap1[0] - swap0[0]}, swap-outs {swap1[1] - swap0[1]} over the window; "
              f"domain usage {int(open(f'{CG}/memory.usage_in_bytes').read()) >> 20} MiB, "
              f"swap {int(stat['swap']) >> 20} MiB, failcnt {open(f'{CG}/memory.failcnt').read().strip()}", flush=True)
    print(f"{mode} {extra}: efficiency T/C {e:.3f} (T {r_t:.0f}, C {r_c:.0f} MiB/s); "
          f"AnonHugePages T {huge_mib(qt.pid)} C {huge_mib(qc.pid)} MiB", flush=True)
    if collapse:
        maps = open(f"/proc/{qt.pid}/maps").read().splitlines()
        lo, hi = next((a, b) for a, b in ([int(x, 16) for x in l.split()[0].split("-")] for l in maps)
                      if b - a == 384 << 20)
        libc = ctypes.CDLL(None, use_errno=True)
        pidfd = libc.syscall(434, qt.pid, 0)  # pidfd_open
        class iovec(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
        for off in range(0, hi - lo, 2 << 20):  # process_madvise(MADV_COLLAPSE = 25)
            libc.syscall(440, pidfd, ctypes.byref(iovec(lo + off, 2 << 20)), 1, 25, 0)
        line(len(rates(ser_t)) + 5)
        e, r_t, r_c = efficiency(60)
        print(f"after MADV_COLLAPSE (AnonHugePages T {huge_mib(qt.pid)} MiB): efficiency T/C {e:.3f} "
              f"(T {r_t:.0f}, C {r_c:.0f} MiB/s)", flush=True)
finally:
    for p in (qt, qc):
        p.kill(); p.wait()
    if "--domain" in opt:
        subprocess.run(["swapoff", SWAP])
        os.remove(SWAP)
        os.rmdir(CG)
