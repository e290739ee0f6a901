#!/usr/bin/env python3
"""O_DIRECT read throughput of one file at several read sizes: what a disk gives the I/O lanes.

Each of THREADS threads reads SIZE bytes at a time for SECONDS, either at random aligned offsets
or walking its own contiguous stripe, with O_DIRECT (no page cache). Prints MiB/s and reads/s.
Needs nothing but Python.
    usage: python3 scripts/disk-probe.py FILE [--sizes 4,8,32,128,1024] [--threads 8] [--seconds 3]
"""
import argparse
import mmap
import os
import random
import threading
import time


def run(path, size, threads, seconds, sequential):
    fsize = os.path.getsize(path)
    blocks = fsize // size
    if blocks < threads:
        raise SystemExit(f"{path} is too small for {threads} threads of {size} B reads")
    done = [0] * threads
    stop = time.monotonic() + seconds

    def worker(t):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT needs
        rng = random.Random(t)
        stripe = blocks // threads
        i = 0
        try:
            while time.monotonic() < stop:
                if sequential:
                    b = t * stripe + (i % stripe)
                else:
                    b = rng.randrange(blocks)
                n = os.preadv(fd, [buf], b * size)
                if n != size:
                    raise SystemExit(f"short read: {n} of {size} B at block {b}")
                done[t] += 1
                i += 1
        finally:
            os.close(fd)

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.monotonic() - t0
    reads = sum(done)
    return reads * size / dt / 2**20, reads / dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--sizes", default="4,8,32,128,1024", help="read sizes in KiB")
    ap.add_argument("--threads", default="8")
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    print("| pattern | read KiB | threads | MiB/s | reads/s |")
    print("|---|---:|---:|---:|---:|")
    for threads in [int(t) for t in a.threads.split(",")]:
        for kib in [int(s) for s in a.sizes.split(",")]:
            for seq in (False, True):
                mib, rps = run(a.file, kib * 1024, threads, a.seconds, seq)
                pat = "sequential" if seq else "random"
                print(f"| {pat} | {kib} | {threads} | {mib:.0f} | {rps:.0f} |", flush=True)


if __name__ == "__main__":
    main()
