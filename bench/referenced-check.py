#!/usr/bin/env python3
"""How much of a buffer read all over, again and again, host-side access sampling
sees touched, the way memtide samples a TCG guest's QEMU: write 1 to
/proc/PID/clear_refs, wait, sum `Referenced` of the buffer's mapping in /proc/PID/smaps
(crates/memtide-adapters/src/qmp/vm.rs, AccessSampler). Once in transparent huge pages,
once in 4 KiB pages. Prints one JSON object per sample.

Clearing the accessed bits flushes no TLB, and a CPU sets a page's accessed bit only when
it walks the page tables: a reader that keeps its core and whose buffer fits its TLB in
2 MiB entries can go unseen (docs/benchmarks.md#density-on-16-cores).

    bench/referenced-check.py [--mib 192] [--samples 6] [--interval-s 2] [--cpu N]
                              [--soft-dirty] [--write]

Run as root (clear_refs). --cpu pins the reader to that CPU (default: the last one) and
this process to the first. --soft-dirty also writes 4 to clear_refs after each 1:
clearing soft-dirty bits flushes the TLB (and write-protects every page, so a writer
faults once per page per sample), as memtide's sampler does where guest RAM holds huge
pages. --write writes the buffer in the loop instead of reading it. Each sample also
gives the loop's speed (MiB/s): what the write faults cost.
"""
import argparse
import ctypes
import json
import mmap
import os
import re
import signal
import sys
import time

MIB = 1 << 20


def reader(mib, huge, write, passes, ready):
    """Map `mib` MiB (2 MiB-aligned, huge pages asked for or refused), write it once, then
    read (or write) all of it in a loop, counting passes in `passes`; report the mapping's
    address on `ready`."""
    size = mib * MIB
    buf = mmap.mmap(-1, size + 2 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    start = (base + 2 * MIB - 1) & ~(2 * MIB - 1)
    off = start - base
    buf.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE, off, size)
    ctypes.memset(start, 1, size)
    os.write(ready, f"{start}\n".encode())
    scratch = ctypes.create_string_buffer(MIB)
    while True:
        for chunk in range(start, start + size, MIB):
            if write:
                ctypes.memmove(chunk, scratch, MIB)
            else:
                ctypes.memmove(scratch, chunk, MIB)
        passes.value += 1


def mapping_fields(pid, addr):
    """Rss, Referenced and AnonHugePages (MiB) of the mapping holding `addr`."""
    text = open(f"/proc/{pid}/smaps").read()
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", block)
        if m and int(m.group(1), 16) <= addr < int(m.group(2), 16):
            field = lambda k: int(re.search(rf"^{k}:\s+(\d+) kB", block, re.M).group(1)) // 1024
            return {"rss_mib": field("Rss"), "referenced_mib": field("Referenced"),
                    "anon_huge_mib": field("AnonHugePages")}
    raise SystemExit(f"no mapping at {addr:#x} in /proc/{pid}/smaps")


def run(args, huge):
    r, w = os.pipe()
    shared = mmap.mmap(-1, 8, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    passes = ctypes.c_uint64.from_buffer(shared)
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.sched_setaffinity(0, {args.cpu})
        reader(args.mib, huge, args.write, passes, w)
    os.close(w)
    addr = int(os.fdopen(r).readline())
    try:
        time.sleep(args.interval_s)
        for n in range(args.samples):
            before = passes.value
            for value in ("1", "4") if args.soft_dirty else ("1",):
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write(value)
            time.sleep(args.interval_s)
            sample = {"huge_pages": huge, "soft_dirty": args.soft_dirty, "write": args.write,
                      "sample": n, "mib": args.mib,
                      "mib_per_s": round((passes.value - before) * args.mib / args.interval_s),
                      **mapping_fields(pid, addr)}
            print(json.dumps(sample), flush=True)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=192)
    p.add_argument("--samples", type=int, default=6)
    p.add_argument("--interval-s", type=float, default=2.0)
    p.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    p.add_argument("--soft-dirty", action="store_true")
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    for huge in (True, False):
        run(args, huge)


if __name__ == "__main__":
    sys.exit(main())
