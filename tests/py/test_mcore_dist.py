"""Megatron-Core dist_checkpointing (torch_dist) folders in verl's layouts
(tests/gen/make_mcore_dist_fixtures.py, megatron-core 0.12.2).

Each fixture is mounted with `ckfs mount`; the mount holds exactly the original Hugging Face
weights (original/model.safetensors, bf16 stays bf16), transformers loads it from the mount and
its logits equal the original model's in bf16. `ckfs inspect --json` reports the layout and the
ranks that saved it. SRC may be the dist_ckpt folder itself with --config.
"""

import gc
import json
import os
import shutil
import subprocess

import pytest
import torch

from conftest import FIXTURES, ckfs_bin, load_file, load_folder, run_ckfs, same_bits

MD = FIXTURES / "mcore_dist"
CASES = {  # name: (ranks that saved it, config folder relative to the case)
    "qwen2_tp2": (2, "huggingface"),
    "llama_pp3_uneven": (3, "huggingface"),
    "qwen3_tp2_pp2_tied": (4, "huggingface"),
    "llama_pp2_vpp2_head": (2, "model/huggingface"),
    "qwen3_moe_ep2": (2, "huggingface"),
    "qwen2_moe_tp2_ep2": (4, "huggingface"),
    "mixtral_pp2_ep2": (4, "model/huggingface"),
}
IDS = torch.tensor([[1, 17, 42, 7, 97, 5, 23, 64, 2, 50, 11, 96]])  # vocab 98


def logits_of(model):
    model.eval()
    with torch.no_grad():
        return model(input_ids=IDS).logits


def moe_args(name):
    # torch's grouped_mm has no CPU kernel: transformers' eager expert loop instead
    return dict(experts_implementation="eager") if "moe" in name or "mixtral" in name else {}


def reference(name, tmp_path):
    """The original model: config.json + original/model.safetensors loaded by from_pretrained
    (transformers 5 fuses MoE experts on load, as it does from the mount)."""
    import transformers

    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    shutil.copy(MD / name / CASES[name][1] / "config.json", ref_dir / "config.json")
    os.symlink(MD / name / "original" / "model.safetensors", ref_dir / "model.safetensors")
    cfg = transformers.AutoConfig.from_pretrained(str(ref_dir))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(ref_dir), dtype=torch.bfloat16,
                                                            attn_implementation="eager", **moe_args(name))
    original = load_file(MD / name / "original" / "model.safetensors")
    return cfg, original, ref


@pytest.fixture
def mount(tmp_path):
    points = []

    def do(src, *args):
        mnt = tmp_path / f"mnt{len(points)}"
        mnt.mkdir()
        p = subprocess.run([ckfs_bin(), "mount", *args, str(src), str(mnt)], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, f"ckfs mount failed: {p.stderr}"
        points.append(mnt)
        return mnt

    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing: the mount tier cannot run on this machine", pytrace=False)
    yield do
    gc.collect()  # a failed test's models may still map the mount's files
    for mnt in points:
        if subprocess.run([ckfs_bin(), "umount", str(mnt)], capture_output=True, timeout=60).returncode:
            subprocess.run([ckfs_bin(), "umount", "-z", str(mnt)], capture_output=True, timeout=60)


@pytest.mark.parametrize("name", sorted(CASES))
def test_mcore_dist_mount(name, mount, tmp_path):
    import transformers

    torch.set_num_threads(1)
    cfg, original, ref = reference(name, tmp_path)
    mnt = mount(MD / name)
    got = load_folder(mnt)
    assert set(got) == set(original)
    for k, v in original.items():
        assert v.dtype == torch.bfloat16
        assert same_bits(got[k], v), k
    model = transformers.AutoModelForCausalLM.from_pretrained(str(mnt), dtype=torch.bfloat16,
                                                              attn_implementation="eager",
                                                              **moe_args(name))
    assert type(model).__name__ == cfg.architectures[0]
    want, logits = logits_of(ref), logits_of(model)
    assert torch.isfinite(want).all()
    assert torch.equal(logits, want)

    info = json.loads(run_ckfs("inspect", "--json", MD / name).stdout)
    assert info["layout"] == "megatron-dist"
    assert info["world_size"] == CASES[name][0]
    assert info["tie_word_embeddings"] == cfg.tie_word_embeddings


def test_mcore_dist_bare_folder_with_config(mount):
    """SRC = dist_ckpt/ itself, config.json through --config."""
    name = "qwen2_tp2"
    original = load_file(MD / name / "original" / "model.safetensors")
    mnt = mount(MD / name / "dist_ckpt", "--config", str(MD / name / "huggingface"))
    got = load_folder(mnt)
    assert set(got) == set(original)
    for k, v in original.items():
        assert same_bits(got[k], v), k
