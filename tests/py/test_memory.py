"""A mount's memory stays within its cache size (issue 41).

A checkpoint written by real torch (tests/gen/make_bench_checkpoint.py,
bench-600m cut to 2 layers on 2 ranks: 352 MB of fp32 rank files, a
176 MB model.safetensors) is mounted with a 32 MiB cache and 4 FUSE
threads, and 8 threads take O_DIRECT random preads of 1 B to 4 MiB for
12 s (every read reaches the daemon; every 8th is compared with the
exported file). The daemon's RssAnon, sampled every 0.25 s, must stay
within the bound docs/mount.md states ("Memory"): RssAnon at ready + the
cache + 4 slices kept for the next fills + the slices pinned and filled
beyond the budget when the cache is smaller than what the threads pin at
once + 2 MiB per thread. Before the fix the same run reached hundreds of
MB (glibc kept the freed slices: src/cache/slice_mem.h).

Not a timing: a resource bound, with the margin of the per-thread term.
The sanitizer builds of tiers 2 and 3 (build-asan, build-tsan) run the
same readers when they are there; their allocators keep freed memory on
purpose (ASan's quarantine, TSan's), so for them the check is the cache's
own count of slice memory (stats' slice_memory) against the same bound,
not RssAnon, which is printed.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, ckfs_bin, run_ckfs

sys.path.insert(0, str(REPO / "tests" / "bench"))
import bench_memory  # noqa: E402

MIB = 1 << 20
CACHE = 32 * MIB
SLICE = 4 * MIB         # the default slice size
THREADS = 4             # FUSE workers (--threads)
PREFETCH = 4            # read-ahead workers: min(threads, max(4, CPUs))
KEPT = 4                # slices kept beyond the budget (CACHE_SPARES)
PER_THREAD = 2 * MIB    # a worker's read window and libfuse buffer
READERS, SECONDS = 8, 12


def slice_bound():
    """Slice memory: the cache, the kept slices, and what the threads pin or
    fill at once beyond the budget (2 slices a FUSE read, 1 a read-ahead)."""
    pinned = 2 * THREADS + PREFETCH
    over = max(0, pinned - CACHE // SLICE)
    return CACHE + (KEPT + over) * SLICE


def anon_bound(at_ready):
    return at_ready + slice_bound() + PER_THREAD * (THREADS + PREFETCH)


@pytest.fixture(scope="module")
def actor(tmp_path_factory):
    out = tmp_path_factory.mktemp("memory")
    subprocess.run([sys.executable, str(REPO / "tests" / "gen" / "make_bench_checkpoint.py"),
                    str(out / "actor"), "--shape", "bench-600m", "--layers", "2", "--world", "2"],
                   check=True, capture_output=True, timeout=600)
    run_ckfs("export", "-q", out / "actor", out / "merged")
    return out


BUILDS = {"release": None, "asan": REPO / "build-asan" / "ckfs", "tsan": REPO / "build-tsan" / "ckfs"}


@pytest.mark.parametrize("build", list(BUILDS))
def test_rss_within_cache(actor, build, tmp_path):
    path = BUILDS[build] or Path(ckfs_bin())
    if not path.exists():
        pytest.skip(f"{path} is not built (tiers 2 and 3 build it)")
    expected = actor / "merged" / "model.safetensors"
    r = bench_memory.run_one(str(path), str(actor / "actor"), str(expected), CACHE, "random",
                             READERS, SECONDS, True, str(tmp_path),
                             extra=["--threads", str(THREADS)])
    print(f"{build}: RssAnon {r['rss_anon_ready'] / MIB:.0f} MiB at ready, peak "
          f"{r['rss_anon_peak'] / MIB:.0f} MiB (bound {anon_bound(r['rss_anon_ready']) / MIB:.0f}); "
          f"slice memory peak {r['slice_memory_peak'] / MIB:.0f} MiB (bound "
          f"{slice_bound() / MIB:.0f}); {r['fills']} fills, {r['evictions']} evictions, "
          f"{r['gbps']} GB/s")
    assert not r["errors"], r["errors"]
    assert r["evictions"] > 10 * CACHE // SLICE, "the readers did not make the cache evict"
    assert r["slice_memory_peak"] <= slice_bound(), r
    if build == "release":
        assert r["rss_anon_peak"] <= anon_bound(r["rss_anon_ready"]), r
