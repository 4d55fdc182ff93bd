"""Real clients on a real mount: safetensors.safe_open, transformers.from_pretrained and cp -r.

Every fixture is mounted once per session (`ckfs mount`, which returns when the folder is
ready) and unmounted at the end. Mounting needs FUSE: as root here, as in CI.
"""

import filecmp
import os
import shutil
import subprocess
import threading

import pytest
import torch

from conftest import ckfs_bin, ckpt_dir, load_file, load_folder, original_path, same_bits, weight_files
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
