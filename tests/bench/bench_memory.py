#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The daemon's memory against its cache size, under readers (issue 41).

    bench_memory.py ACTOR EXPECTED [--ckfs BIN[=LABEL]]... [--caches 64MiB,256MiB,1GiB]
                    [--patterns random,strided,sequential] [--threads 16]
                    [--seconds 20] [--runs 1] [--direct] [--json OUT]

For each binary, cache size and pattern: a fresh `ckfs mount --cache-size`
of ACTOR, THREADS reader threads for SECONDS, the daemon's RssAnon sampled
every 0.25 s from /proc, then `ckfs stats`. EXPECTED is the same model's
model.safetensors exported by ckfs (every 8th read is compared with it:
a difference fails the run). Patterns:

  random      preads of 1 B to 4 MiB at random offsets (the issue's)
  strided     thread r of T reads the r-th of T row blocks of every tensor in
              1 MiB preads, as a tensor-parallel worker loads its shard
  sequential  thread r reads the r-th of T parts of the file front to back
              in 1 MiB preads, again and again

--direct opens with O_DIRECT, so that every read reaches the daemon (without
it the kernel's page cache answers repeats, as it would a server). Prints a
row per run: throughput, RssAnon at ready, its peak and last sample, the
slice buffers' peak (stats' slice_memory), evictions and fills; with
--runs N, each on fresh mounts N times, the binaries interleaved, and the
medians of throughput and of the peaks (the spread of throughput after
the row). With --json the runs as a list. Standard library only; run as root (mounts).
"""
import argparse
import json
import mmap
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

MIB = 1 << 20
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_size(text):
    for unit, mult in UNITS.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * mult)
    return int(text)


def rss_anon(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no RssAnon for pid {pid}")


def stats(mnt):
    return json.loads(os.getxattr(mnt, "user.ckfs.stats"))


def tensor_ranges(path):
    """(begin, end) of every tensor's bytes in a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    base = 8 + n
    return [(base + v["data_offsets"][0], base + v["data_offsets"][1])
            for k, v in header.items() if k != "__metadata__"]


def plan(pattern, rank, threads, size, tensors, rng):
    """An endless stream of (offset, length) for reader `rank`."""
    if pattern == "random":
        while True:
            n = rng.randint(1, 4 * MIB)
            yield rng.randrange(0, size - n + 1), n
    elif pattern == "strided":
        while True:
            for b, e in tensors:
                part = (e - b) // threads
                lo, hi = b + rank * part, b + (rank + 1) * part
                for off in range(lo, hi, MIB):
                    yield off, min(MIB, hi - off)
    elif pattern == "sequential":
        part = size // threads
        lo, hi = rank * part, (rank + 1) * part if rank + 1 < threads else size
        while True:
            for off in range(lo, hi, MIB):
                yield off, min(MIB, hi - off)
    else:
        raise SystemExit(f"bench_memory: no pattern {pattern!r}")


def readers(path, expected, pattern, threads, seconds, direct, tensors):
    size = os.path.getsize(path)
    stop = time.monotonic() + seconds
    done = [0] * threads
    errors = []

    def reader(rank):
        rng = random.Random(rank)
        flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
        fd, efd = os.open(path, flags), os.open(expected, os.O_RDONLY)
        buf = mmap.mmap(-1, 4 * MIB + 4096)  # page aligned, for O_DIRECT
        try:
            for k, (off, n) in enumerate(plan(pattern, rank, threads, size, tensors, rng)):
                if time.monotonic() > stop or errors:
                    return
                if direct:  # whole pages: O_DIRECT on FUSE is not aligned, but keep it kind
                    got = os.preadv(fd, [memoryview(buf)[:n]], off)
                    data = buf[:got]
                else:
                    data = os.pread(fd, n, off)
                if len(data) != min(n, size - off):
                    errors.append(f"{path}: short read at {off} ({len(data)} of {n})")
                elif k % 8 == 0 and data != os.pread(efd, n, off):
                    errors.append(f"{path}: bytes at {off} (+{n}) differ from {expected}")
                done[rank] += len(data)
        except OSError as e:
            errors.append(f"{path}: {e}")
        finally:
            os.close(fd)
            os.close(efd)
            buf.close()

    ts = [threading.Thread(target=reader, args=(r,)) for r in range(threads)]
    for t in ts:
        t.start()
    return ts, done, errors


def run_one(ckfs, actor, expected, cache, pattern, threads, seconds, direct, work, extra=()):
    """One mount and its readers: a dict of the figures (errors: a list)."""
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([ckfs, "mount", "--cache-size", str(cache), *extra,
                    actor, mnt], check=True)
    try:
        st = stats(mnt)
        pid = st["pid"]
        at_ready = rss_anon(pid)
        path = os.path.join(mnt, "model.safetensors")
        tensors = tensor_ranges(expected)
        t0 = time.monotonic()
        ts, done, errors = readers(path, expected, pattern, threads, seconds, direct, tensors)
        peak = last = at_ready
        peak_slices = 0
        while any(t.is_alive() for t in ts):
            time.sleep(0.25)
            last = rss_anon(pid)
            peak = max(peak, last)
            peak_slices = max(peak_slices, stats(mnt).get("slice_memory", 0))
        wall = time.monotonic() - t0
        last = rss_anon(pid)
        peak = max(peak, last)
        st = stats(mnt)
        peak_slices = max(peak_slices, st.get("slice_memory", 0))
    finally:
        subprocess.run([ckfs, "umount", mnt], check=False)
    return dict(cache=cache, pattern=pattern, threads=threads, seconds=round(wall, 1),
                gbps=round(sum(done) / wall / 1e9, 3), rss_anon_ready=at_ready,
                rss_anon_peak=peak, rss_anon_last=last, slice_memory_peak=peak_slices,
                slice_size=st["slice_size"], evictions=st["evictions"], fills=st["fills"],
                recycled=st["recycled"], errors=errors)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("actor")
    ap.add_argument("expected")
    ap.add_argument("--ckfs", action="append", help="BIN[=LABEL] (default build/ckfs)")
    ap.add_argument("--caches", default="64MiB,256MiB,1GiB")
    ap.add_argument("--patterns", default="random,strided,sequential")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--direct", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    bins = [b.partition("=") for b in (a.ckfs or ["build/ckfs"])]
    rows, failed = [], False
    print(f"{'ckfs':<10} {'cache':>7} {'pattern':<10} {'GB/s':>6} {'anon@ready':>10} "
          f"{'anon peak':>9} {'anon last':>9} {'slices pk':>9} {'evict':>6} {'fills':>6}")
    mb = lambda v: f"{v / MIB:.0f}M"  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="ckfs-bench-memory.") as work:
        for cache in (parse_size(c) for c in a.caches.split(",")):
            for pattern in a.patterns.split(","):
                runs = {label or path: [] for path, _, label in bins}
                for _ in range(a.runs):
                    for path, _, label in bins:
                        r = run_one(os.path.abspath(path), a.actor, a.expected, cache, pattern,
                                    a.threads, a.seconds, a.direct, work)
                        r["ckfs"] = label or path
                        rows.append(r)
                        runs[r["ckfs"]].append(r)
                        for e in r["errors"]:
                            print("  ERROR", e)
                            failed = True
                for name, rs in runs.items():
                    med = lambda k: statistics.median(x[k] for x in rs)  # noqa: E731
                    spread = (f"  ({min(x['gbps'] for x in rs):.2f}-{max(x['gbps'] for x in rs):.2f})"
                              if len(rs) > 1 else "")
                    print(f"{name:<10} {mb(cache):>7} {pattern:<10} {med('gbps'):>6.2f} "
                          f"{mb(med('rss_anon_ready')):>10} {mb(med('rss_anon_peak')):>9} "
                          f"{mb(med('rss_anon_last')):>9} {mb(med('slice_memory_peak')):>9} "
                          f"{med('evictions'):>6.0f} {med('fills'):>6.0f}{spread}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
