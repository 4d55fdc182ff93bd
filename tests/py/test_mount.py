"""Real clients on a real mount: safetensors.safe_open, transformers.from_pretrained and cp -r.

Every fixture is mounted once per session (`ckfs mount`, which returns when the folder is
ready) and unmounted at the end. Mounting needs FUSE: as root here, as in CI.
"""

import filecmp
import json
import os
import shutil
import struct
import subprocess
import threading

import pytest
import torch

from conftest import (ckfs_bin, ckpt_dir, load_file, load_folder, original_path, run_ckfs, same_bits,
                      weight_files)
from test_readers import exported_logits, prompt_ids, reference_logits


class _Mounts:
    def __init__(self, root):
        self.root = root
        self.lock = threading.Lock()
        self.points = {}

    def get(self, config):
        with self.lock:
            if config["name"] in self.points:
                return self.points[config["name"]]
            mnt = self.root / config["name"]
            mnt.mkdir()
            p = subprocess.run([ckfs_bin(), "mount", str(ckpt_dir(config)), str(mnt)],
                               capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, f"ckfs mount failed: {p.stderr}"
            self.points[config["name"]] = mnt
            return mnt

    def close(self):
        for mnt in self.points.values():
            subprocess.run([ckfs_bin(), "umount", str(mnt)], capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def mounted(tmp_path_factory):
    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing: the mount tier cannot run on this machine", pytrace=False)
    mounts = _Mounts(tmp_path_factory.mktemp("mnt"))
    yield mounts.get
    mounts.close()


def test_mount_equals_export(config, mounted, ckfs_export):
    mnt, out = mounted(config), ckfs_export(config)
    assert sorted(os.listdir(mnt)) == sorted(os.listdir(out))
    for fn in os.listdir(out):
        assert filecmp.cmp(mnt / fn, out / fn, shallow=False), fn


def test_mount_safe_open_equals_original(config, mounted):
    """Every tensor read through safe_open on the mount equals the original weight cast to bf16."""
    got = load_folder(mounted(config))
    want = load_file(original_path(config))
    if config["tied"]:
        want.pop("lm_head.weight")
    assert set(got) == set(want)
    for k, v in want.items():
        assert same_bits(got[k], v.to(torch.bfloat16)), k


def test_mount_transformers_logits(config, mounted):
    torch.set_num_threads(1)
    ids = prompt_ids(config)
    assert torch.equal(exported_logits(config, mounted(config), ids), reference_logits(config, ids))


def test_mount_cp_copy(config, mounted, tmp_path):
    """cp -r of the mount is an ordinary folder with the same bytes and the same logits."""
    mnt = mounted(config)
    copy = tmp_path / "copy"
    shutil.copytree(mnt, copy)
    for fn in os.listdir(mnt):
        assert filecmp.cmp(mnt / fn, copy / fn, shallow=False), fn
    assert weight_files(copy) == weight_files(mnt)
    torch.set_num_threads(1)
    ids = prompt_ids(config)
    assert torch.equal(exported_logits(config, copy, ids), reference_logits(config, ids))


def test_mount_stream_recycles_and_counts_sources(tmp_path):
    """A streaming read in page-sized requests (readahead off, so each slice is served in two
    pieces): the bytes equal the export, the daemon filled each slice once and read each fp32
    source byte once (source_bytes_read is twice the bf16 tensor bytes), and slices whose bytes
    were all served gave their buffers to later fills, so the cache held no more than the design
    allows whatever the timing: the read-ahead window, the current slice, one slice per FUSE
    thread that has replied but not yet released its slice, and the shorter last slice (which
    cannot take a full slice's buffer). Nothing else bounds it: read-ahead workers run as far
    ahead as the window lets them, and a busy machine lets them (docs/mount.md)."""
    config = {"name": "llama_tied_fsdp2_w4"}
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    page, slice_size, window, threads = 4096, 8192, 2, 2
    subprocess.run([ckfs_bin(), "mount", str(ckpt_dir(config)), str(mnt), "--dtype", "bf16",
                    "-o", f"slice_size={slice_size},readahead={window},threads={threads}"],
                   check=True, timeout=120)
    try:
        fd = os.open(mnt / "model.safetensors", os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            parts = []
            while part := os.pread(fd, page, page * len(parts)):
                parts.append(part)
        finally:
            os.close(fd)
        data = b"".join(parts)
        stats = json.loads(subprocess.run([ckfs_bin(), "stats", "--json", str(mnt)], check=True,
                                          capture_output=True, text=True).stdout)
    finally:
        subprocess.run([ckfs_bin(), "umount", str(mnt)], capture_output=True, timeout=60)
    run_ckfs("export", ckpt_dir(config), tmp_path / "out", "--dtype", "bf16")
    assert data == (tmp_path / "out" / "model.safetensors").read_bytes()
    header_len = struct.unpack("<Q", data[:8])[0]
    tensor_bytes = len(data) - 8 - header_len
    want = load_file(original_path(config))
    want.pop("lm_head.weight")  # tied: served once as embed_tokens
    assert tensor_bytes == sum(v.numel() * 2 for v in want.values())
    assert stats["source_bytes_read"] == 2 * tensor_bytes, stats
    n_slices = -(-len(data) // slice_size)
    assert stats["fills"] == n_slices, stats
    assert stats["evictions"] == 0 and stats["bytes_cached"] <= stats["budget"], stats
    bound = window + 1 + threads + 1
    assert n_slices > 2 * bound  # else the bound says nothing
    assert stats["slices_cached"] == stats["fills"] - stats["recycled"], stats
    assert stats["slices_cached"] <= bound, stats


def test_mount_odirect_overlapping_reads_fill_each_slice_once(tmp_path):
    """O_DIRECT readers (fastsafetensors, the Run:ai streamer) bypass the kernel's page cache and
    may ask for the same bytes twice: fastsafetensors' threads round their ranges out to the
    direct-I/O block, so neighbouring ranges overlap. Here, with read-ahead off and slices of two
    pages, the first page of every slice is read twice, then the second pages: the bytes equal
    the export, and every slice is filled once (each fp32 source byte read once). Counting
    O_DIRECT replies as served made a slice look done (handed to the page cache in full) after
    its first page was read twice, its buffer went to the next fill, and its second page read
    the sources again: 2 fills a slice (issue #24, found by fastsafetensors: 1.05x the rank
    files of the 0.5B bench checkpoint read)."""
    import mmap

    config = {"name": "llama_tied_fsdp2_w4"}
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    page, slice_size = 4096, 8192
    subprocess.run([ckfs_bin(), "mount", str(ckpt_dir(config)), str(mnt), "--dtype", "bf16",
                    "-o", f"slice_size={slice_size},readahead=0,threads=2"], check=True, timeout=120)
    try:
        size = os.path.getsize(mnt / "model.safetensors")
        n_slices = -(-size // slice_size)
        buf = mmap.mmap(-1, page)  # page-aligned, as O_DIRECT wants
        data = bytearray(size)
        fd = os.open(mnt / "model.safetensors", os.O_RDONLY | os.O_DIRECT)
        try:
            for off in [s * slice_size for s in range(n_slices) for _ in range(2)] + \
                       [s * slice_size + page for s in range(n_slices) if s * slice_size + page < size]:
                n = os.preadv(fd, [buf], off)
                assert n == min(page, size - off), (off, n)
                data[off:off + n] = buf[:n]
        finally:
            os.close(fd)
        stats = json.loads(subprocess.run([ckfs_bin(), "stats", "--json", str(mnt)], check=True,
                                          capture_output=True, text=True).stdout)
    finally:
        subprocess.run([ckfs_bin(), "umount", str(mnt)], capture_output=True, timeout=60)
    run_ckfs("export", ckpt_dir(config), tmp_path / "out", "--dtype", "bf16")
    want = (tmp_path / "out" / "model.safetensors").read_bytes()
    assert bytes(data) == want
    assert n_slices > 8, n_slices
    tensor_bytes = size - 8 - struct.unpack("<Q", want[:8])[0]
    assert stats["fills"] == n_slices, stats
    assert stats["source_bytes_read"] == 2 * tensor_bytes, stats


def test_mount_readahead_skips_slices_the_kernel_has(tmp_path):
    """Two readers of one file, as tensor-parallel ranks are: A reads from the third slice to the
    end, then B reads from the start. B's reads are sequential, so read-ahead opens a window over
    the slices A already got; the kernel's page cache holds them (keep_cache: B reads them from
    there), while the small cache has recycled them. Read-ahead must leave them alone: every
    source byte is read once (source_bytes_read is twice the bf16 tensor bytes) and the skipped
    slices are counted. Both readers see the export's bytes."""
    config = {"name": "llama_tied_fsdp2_w4"}
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    page, slice_size = 4096, 8192
    subprocess.run([ckfs_bin(), "mount", str(ckpt_dir(config)), str(mnt), "--dtype", "bf16",
                    "--cache-size", "64KiB", "-o", f"slice_size={slice_size},readahead=4,threads=2"],
                   check=True, timeout=120)

    def read_from(start):
        fd = os.open(mnt / "model.safetensors", os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            parts = []
            while part := os.pread(fd, page, start + page * len(parts)):
                parts.append(part)
            return b"".join(parts)
        finally:
            os.close(fd)

    try:
        a = read_from(2 * slice_size)
        b = read_from(0)
        stats = json.loads(subprocess.run([ckfs_bin(), "stats", "--json", str(mnt)], check=True,
                                          capture_output=True, text=True).stdout)
    finally:
        subprocess.run([ckfs_bin(), "umount", str(mnt)], capture_output=True, timeout=60)
    run_ckfs("export", ckpt_dir(config), tmp_path / "out", "--dtype", "bf16")
    want = (tmp_path / "out" / "model.safetensors").read_bytes()
    assert len(want) > 16 * slice_size  # else the small cache would still hold A's first slices
    assert b == want and a == want[2 * slice_size:]
    tensor_bytes = len(want) - 8 - struct.unpack("<Q", want[:8])[0]
    assert stats["source_bytes_read"] == 2 * tensor_bytes, stats
    assert stats["readahead_skipped"] > 0, stats
