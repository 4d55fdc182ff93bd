"""Shared helpers for the Python test tier.

The tier compares the C tool (`ckfs`, path from $CKFS_BIN, default <repo>/build/ckfs) with
verl's real merger, with the original weights and with real readers.  Fixtures come from
tests/gen/make_fixtures.py and are listed in tests/fixtures/MANIFEST.json; every test that takes
a `config` argument runs once per configuration.

    .venv/bin/python -m pytest -q tests/py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
MANIFEST_PATH = FIXTURES / "MANIFEST.json"
MANIFEST = json.loads(MANIFEST_PATH.read_text()) if MANIFEST_PATH.exists() else {"configs": []}
CONFIGS = MANIFEST["configs"]
BY_NAME = {c["name"]: c for c in CONFIGS}
CKFS_TIMEOUT = 300


def pytest_generate_tests(metafunc):
    if "config" in metafunc.fixturenames:
        if not CONFIGS:
            raise pytest.UsageError(f"{MANIFEST_PATH} is missing: run tests/gen/make_fixtures.py")
        metafunc.parametrize("config", CONFIGS, ids=[c["name"] for c in CONFIGS])


# ------------------------------------------------------------------------------------------
# Running ckfs
# ------------------------------------------------------------------------------------------
def ckfs_bin() -> str:
    p = Path(os.environ.get("CKFS_BIN", REPO / "build" / "ckfs"))
    if not (p.is_file() and os.access(p, os.X_OK)):
        pytest.fail(f"ckfs binary not found or not executable at {p}; build it "
                    f"(cmake -B build && cmake --build build) or set CKFS_BIN", pytrace=False)
    return str(p)


def run_ckfs(*args, check=True) -> subprocess.CompletedProcess:
    cmd = [ckfs_bin(), *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=CKFS_TIMEOUT)
    if check and p.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {p.returncode}\nstdout: {p.stdout[-2000:]}\n"
                    f"stderr: {p.stderr[-2000:]}", pytrace=False)
    return p


def ckpt_dir(config) -> Path:
    return FIXTURES / "fsdp" / config["name"]


def expected_dir(config) -> Path:
    """Committed verl output for this config (its twin's for checkpoints verl refuses)."""
    return FIXTURES / "expected" / config["expected"]


def original_path(config) -> Path:
    return FIXTURES / "original" / (config["name"] + ".safetensors")


class _ExportCache:
    def __init__(self, root: Path):
        self.root = root
        self.lock = threading.Lock()
        self.done = {}

    def get(self, config, *opts) -> Path:
        key = (config["name"], *opts)
        with self.lock:
            if key in self.done:
                return self.done[key]
        out = self.root / ("_".join(k.strip("-").replace("/", "_") for k in key))
        if out.exists():
            shutil.rmtree(out)
        run_ckfs("export", ckpt_dir(config), out, *opts)
        with self.lock:
            self.done[key] = out
        return out


@pytest.fixture(scope="session")
def ckfs_export(tmp_path_factory):
    """ckfs_export(config, *options) -> directory written by `ckfs export` (cached per session)."""
    cache = _ExportCache(tmp_path_factory.mktemp("ckfs-export"))
    return cache.get


# ------------------------------------------------------------------------------------------
# Running verl's merger live
# ------------------------------------------------------------------------------------------
def merger_env():
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONHASHSEED="0", CUDA_VISIBLE_DEVICES="",
               TOKENIZERS_PARALLELISM="false", VERL_LOGGING_LEVEL="WARN")
    return env


def verl_cli(local_dir, target_dir):
    return [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(local_dir),
            "--target_dir", str(target_dir)]


def sharded_tensor_cli(local_dir, target_dir):
    return [sys.executable, str(REPO / "tests" / "gen" / "merge_sharded_tensor.py"), "merge", "--backend", "fsdp",
            "--local_dir", str(local_dir), "--target_dir", str(target_dir)]


def oracle_cmd(config, target):
    """The command that produced expected/<name>: verl's CLI, or for ShardedTensor checkpoints
    (which verl cannot load) tests/gen/merge_sharded_tensor.py (verl's merger + a relaxed loader)."""
    if "merge_sharded_tensor.py" in config.get("merge_command", ""):
        return sharded_tensor_cli(ckpt_dir(config), target)
    return verl_cli(ckpt_dir(config), target)


class _Live:
    """Runs every configuration's oracle once, in parallel, the first time one is asked for."""

    def __init__(self, root: Path):
        self.root = root
        self.results = None
        self.lock = threading.Lock()

    def _run(self, name, cmd, target):
        p = subprocess.run(cmd, capture_output=True, text=True, env=merger_env(), cwd=REPO, timeout=900)
        return name, (p.returncode, target, p.stdout[-3000:] + p.stderr[-3000:])

    def get(self, key):
        with self.lock:
            if self.results is None:
                jobs = []
                for c in CONFIGS:
                    if c["expected"] == c["name"]:
                        t = self.root / c["name"]
                        jobs.append((("oracle", c["name"]), oracle_cmd(c, t), t))
                    if c["verl_merger"] != "ok":
                        t = self.root / (c["name"] + "_verl_cli")
                        jobs.append((("verl_cli", c["name"]), verl_cli(ckpt_dir(c), t), t))
                workers = max(1, min(4, os.cpu_count() or 1))
                with ThreadPoolExecutor(max_workers=workers) as ex:
                    self.results = dict(ex.map(lambda j: self._run(*j), jobs))
        return self.results[key]


@pytest.fixture(scope="session")
def verl_live(tmp_path_factory):
    """verl_live(kind, name) -> (returncode, target_dir, output tail); kind 'oracle' | 'verl_cli'."""
    live = _Live(tmp_path_factory.mktemp("verl-live"))
    return lambda kind, name: live.get((kind, name))


# ------------------------------------------------------------------------------------------
# Reading safetensors folders
# ------------------------------------------------------------------------------------------
def weight_files(d: Path) -> list[str]:
    """Weight files of a HF folder, as named by its index (or the single model.safetensors)."""
    idx = d / "model.safetensors.index.json"
    if idx.exists():
        return sorted(set(json.loads(idx.read_text())["weight_map"].values()))
    assert (d / "model.safetensors").exists(), f"{d}: neither model.safetensors nor an index"
    return ["model.safetensors"]


def load_folder(d: Path) -> dict:
    from safetensors import safe_open

    out = {}
    for fn in weight_files(d):
        with safe_open(str(d / fn), framework="pt") as f:
            for k in f.keys():
                assert k not in out, f"{k} appears in two weight files"
                out[k] = f.get_tensor(k)
    return out


def load_file(path: Path) -> dict:
    from safetensors.torch import load_file as lf

    return lf(str(path))


def same_bits(a, b) -> bool:
    """Equal dtype, shape and bit patterns (distinguishes -0.0 from 0.0 and NaN payloads)."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(view), b.contiguous().view(view))


def json_without_version(path: Path) -> dict:
    d = json.loads(Path(path).read_text())
    d.pop("transformers_version", None)
    return d


TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
