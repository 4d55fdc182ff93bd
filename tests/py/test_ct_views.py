"""--dtype w4a16 and nvfp4: compressed-tensors' pack-quantized INT4 and nvfp4-pack-quantized FP4
on read, against the library itself.

For each fixture (tests/fixtures/w4a16/: a verl FSDP2 Qwen2 with 128-multiple dims, and bf16
folders of edge groups for each scheme; tests/gen/make_w4a16_fixtures.py), `ckfs export --dtype
bf16` gives the weights (checked against verl's merger by the other tests), and compressed-tensors
0.20.1 in its own venv (tests/w4a16/setup-w4a16-venv.sh) quantizes and packs them with its own
functions (tests/w4a16/oracle.py: generate_gparam for NVFP4's global scale, calculate_qparams on
each group's min and max, then ModelCompressor's compress_model, or the compressor on bare
tensors), for llm-compressor's W4A16 and NVFP4A16 presets. Every tensor ckfs serves with `--dtype
w4a16` or `nvfp4` (export and mount) must be the same bytes, config.json's quantization_config the
same value as the library's update_config writes. transformers 5.19 with compressed-tensors must
load the folder with no key missing, hold exactly the library's dequantized weights (decompressed
on the CPU), and give logits close to the bf16 model's. Without the venv these tests FAIL, saying
so.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import FIXTURES, REPO, ckfs_bin, load_folder, run_ckfs

CACHE = Path(os.environ.get("CKFS_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ckfs"))
VENV = Path(os.environ.get("CKFS_W4A16_VENV", CACHE / "w4a16-venv"))
TOOLS = REPO / "tests" / "w4a16"
CASES = {"qwen2_fsdp2_w2": "--model", "edge_bf16": "--tensors", "edge_nvfp4_bf16": "--tensors"}
# each scheme's cases: the edge folders are each quantizer's
SCHEMES = {"w4a16": ("qwen2_fsdp2_w2", "edge_bf16"),
           "nvfp4": ("qwen2_fsdp2_w2", "edge_bf16", "edge_nvfp4_bf16")}
PARAMS = [(dt, c) for dt, cases in SCHEMES.items() for c in cases]
EXPECTED = FIXTURES / "w4a16" / "expected.json"


def venv_python() -> str:
    py = VENV / "bin" / "python"
    if not py.exists():
        pytest.fail(f"the W4A16 oracle venv is missing ({VENV}): run tests/w4a16/setup-w4a16-venv.sh",
                    pytrace=False)
    return str(py)


def in_venv(script: str, *args) -> str:
    r = subprocess.run([venv_python(), str(TOOLS / script), *map(str, args)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """(dtype, case) -> (ckfs's bf16 folder, the library's folder), made once per session."""
    root = tmp_path_factory.mktemp("ct-oracle")
    made = {}

    def get(dt, case):
        if (dt, case) not in made:
            bf16, ref = root / f"{case}-bf16", root / f"{dt}-{case}-ref"
            if not bf16.exists():
                run_ckfs("export", "-q", FIXTURES / "w4a16" / case, bf16)
            in_venv("oracle.py", bf16, ref, CASES[case], *(["--nvfp4"] if dt == "nvfp4" else []))
            made[dt, case] = bf16, ref
        return made[dt, case]

    return get


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.dim() else t


def assert_same(got_dir: Path, ref_dir: Path):
    got, want = load_folder(got_dir), load_folder(ref_dir)
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert (g.dtype, tuple(g.shape)) == (w.dtype, tuple(w.shape)), name
        assert torch.equal(bits(g), bits(w)), name
    return sum(n.endswith(".weight_packed") for n in want)


@pytest.mark.parametrize("dt,case", PARAMS)
def test_export_equals_compressed_tensors(dt, case, oracle, tmp_path):
    bf16, ref = oracle(dt, case)
    run_ckfs("export", "-q", "--dtype", dt, FIXTURES / "w4a16" / case, tmp_path / "out")
    assert assert_same(tmp_path / "out", ref) == (14 if case == "qwen2_fsdp2_w2" else 4)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg.get("torch_dtype", cfg.get("dtype")) == "bfloat16"
    if CASES[case] == "--model":
        # the whole config.json as the library's update_config leaves it
        assert cfg == json.loads((ref / "config.json").read_text())
    # the C tier (tests/cli/test_ct_views.sh) checks the same files by these hashes; after a
    # fixture is regenerated, CKFS_W4A16_RECORD=1 records the new ones
    expected = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}
    for f in ("model.safetensors", "config.json"):
        got = hashlib.sha256((tmp_path / "out" / f).read_bytes()).hexdigest()
        key = f"{dt}/{case}/{f}"
        if os.environ.get("CKFS_W4A16_RECORD") == "1":
            expected[key] = got
        assert expected.get(key) == got, f"{key}: not the recorded bytes"
    if os.environ.get("CKFS_W4A16_RECORD") == "1":
        EXPECTED.write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")


@pytest.mark.parametrize("dt", list(SCHEMES))
def test_mount_equals_export(dt, oracle, tmp_path):
    """A mount serves the export's bytes; with shards, each weight's other tensors stay in its
    shard, and the folder is still the library's tensors."""
    src = FIXTURES / "w4a16" / "qwen2_fsdp2_w2"
    _, ref = oracle(dt, "qwen2_fsdp2_w2")
    run_ckfs("export", "-q", "--dtype", dt, src, tmp_path / "out")
    run_ckfs("export", "-q", "--dtype", dt, "--max-shard-size", "100KB", src, tmp_path / "sharded")
    assert assert_same(tmp_path / "sharded", ref) == 14
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())["weight_map"]
    others = ("weight_scale", "weight_shape") if dt == "w4a16" else ("weight_scale", "weight_global_scale")
    for name, shard in index.items():
        if name.endswith(".weight_packed"):
            mod = name[:-len("weight_packed")]
            assert [index[mod + o] for o in others] == [shard, shard], name
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run_ckfs("mount", src, mnt, "--dtype", dt)
    try:
        for f in sorted(os.listdir(tmp_path / "out")):
            assert (mnt / f).read_bytes() == (tmp_path / "out" / f).read_bytes(), f
    finally:
        subprocess.run([ckfs_bin(), "umount", "-z", str(mnt)], capture_output=True, timeout=60)


@pytest.mark.parametrize("dt", list(SCHEMES))
def test_transformers_loads_the_mount(dt, oracle, tmp_path):
    """transformers with compressed-tensors reads quantization_config, decompresses every packed
    weight to the library's dequantized value, and its logits stay near the bf16 model's."""
    src = FIXTURES / "w4a16" / "qwen2_fsdp2_w2"
    bf16, _ = oracle(dt, "qwen2_fsdp2_w2")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run_ckfs("mount", src, mnt, "--dtype", dt)
    try:
        r = json.loads(in_venv("load_check.py", mnt, bf16).strip().splitlines()[-1])
    finally:
        subprocess.run([ckfs_bin(), "umount", "-z", str(mnt)], capture_output=True, timeout=60)
    print(f"\n{dt} vs bf16: weights' largest relative error {r['weight_rel']:.4f}; logits' relative "
          f"error {r['rel']:.4f} (Frobenius), max |diff| {r['max_diff']:.4f} of max |logit| "
          f"{r['max_logit']:.4f}")
    assert r["missing"] == [] and r["unexpected"] == [], r
    assert r["quant_method"] == "compressed-tensors"
    assert r["weights_equal"] == r["weights"] == 14, r
    # 4 bits in groups of 128 of Gaussian weights: the step is max|w| / 7.5, about 0.35 sigma, so
    # each weight moves by about 0.1 of its norm (0.113 here); FP4 in groups of 16 with FP8
    # scales: about 0.09. A wrong nibble order, scale or group gives 0.5 and more.
    assert r["weight_rel"] < 0.15, r
    # This tiny random model's logits are small and nearly flat (max |logit| about 2), so they
    # move by about 29% (relative); the bound is loose on purpose: what is exact is checked above.
    assert r["rel"] < 0.5, r
