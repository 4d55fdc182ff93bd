"""--dtype fp8: block-wise FP8 on read, against the reference quantizer in torch
(tests/gen/make_fp8_expected.py, which also writes the bytes tests/unit/test_fp8.c checks).

The reference: per 128 x 128 block (partial at the edges) s = max(amax(|block|), 1e-10) / 448
(vLLM's floor), q = (w / s).clamp(-448, 448).to(torch.float8_e4m3fn); the served values and
`<name>_scale_inv` must equal it bit for bit, for fp32 and bf16 sources, NaN / Inf / zero blocks,
subnormals and edge blocks included. transformers must load the folder from the mount (on the CPU
it dequantizes) with no key missing, to the reference's dequantized weights, and its logits must
be the bf16 model's within FP8's error (the figure is printed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import FIXTURES, ckfs_bin, load_folder, run_ckfs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gen"))
from make_fp8_expected import BLOCK, edge_weights, reference_quantize  # noqa: E402


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_quantized(got: dict, plain: dict):
    """Every 2-D projection weight of `plain` (as stored) is served quantized as the reference."""
    n = 0
    for name, w in plain.items():
        if f"{name}_scale_inv" not in got:
            continue
        q, s = reference_quantize(w)
        assert got[name].dtype == torch.float8_e4m3fn, name
        assert torch.equal(bits(got[name]), bits(q)), name
        assert torch.equal(bits(got[f"{name}_scale_inv"]), bits(s)), name
        n += 1
    assert n > 0
    return n


def hf_folder(path, weights: dict):
    from safetensors.torch import save_file

    path.mkdir()
    shutil.copy(FIXTURES / "fsdp" / "qwen2_fsdp2_w2" / "huggingface" / "config.json", path / "config.json")
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_edge_blocks_bit_identical(dtype, tmp_path):
    src = hf_folder(tmp_path / "src", edge_weights(dtype))
    run_ckfs("export", "--dtype", "fp8", src, tmp_path / "out")
    got = load_folder(tmp_path / "out")
    assert assert_quantized(got, edge_weights(dtype)) == 5
    assert got["model.norm.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize("case", ["qwen2_fsdp2_w2", "llama_bf16_fsdp2_w2", "llama_tied_fsdp2_w4"])
def test_checkpoint_bit_identical_through_mount(case, tmp_path):
    """An FSDP checkpoint (fp32 or bf16 rank files) through a mount: every quantized weight as
    the reference makes it from the stored values (`--dtype auto`), the rest bf16."""
    src = FIXTURES / "fsdp" / case
    run_ckfs("export", "--dtype", "auto", src, tmp_path / "plain")
    plain = load_folder(tmp_path / "plain")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run_ckfs("mount", src, mnt, "--dtype", "fp8")
    try:
        got = load_folder(mnt)
        assert_quantized(got, plain)
        for name, t in got.items():
            if t.dtype != torch.float8_e4m3fn and not name.endswith("_scale_inv"):
                assert t.dtype == torch.bfloat16, name
        cfg = json.loads((mnt / "config.json").read_text())
        q = cfg["quantization_config"]
        assert (q["quant_method"], q["fmt"], q["activation_scheme"], q["weight_block_size"]) == \
            ("fp8", "e4m3", "dynamic", [128, 128])
        assert "lm_head" in q["modules_to_not_convert"]
        assert cfg.get("torch_dtype", cfg.get("dtype")) == "bfloat16"
    finally:
        subprocess.run([ckfs_bin(), "umount", "-z", str(mnt)], capture_output=True, timeout=60)


def dequantized(q, s):
    rows, cols = q.shape
    full = s.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return q.float() * full


def test_transformers_loads_the_mount(tmp_path):
    """transformers reads quantization_config and the scales (dequantizing on the CPU): no key
    missing, each weight the reference's dequantized value, logits close to bf16's."""
    import transformers

    torch.set_num_threads(1)
    src = FIXTURES / "fsdp" / "qwen2_fsdp2_w2"
    run_ckfs("export", src, tmp_path / "bf16")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run_ckfs("mount", src, mnt, "--dtype", "fp8")
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4, 6, 8]])
    try:
        fp8, info = transformers.AutoModelForCausalLM.from_pretrained(
            str(mnt), dtype=torch.bfloat16, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        served = load_folder(mnt)
        sd = fp8.state_dict()
        for name in served:
            if name.endswith("_scale_inv"):
                w = name[:-len("_scale_inv")]
                want = dequantized(served[w], served[name]).to(torch.bfloat16)
                assert torch.equal(sd[w], want), w
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "bf16"), dtype=torch.bfloat16)
        with torch.no_grad():
            a, b = fp8(input_ids=ids).logits.float(), ref(input_ids=ids).logits.float()
        rel = ((a - b).norm() / b.norm()).item()
        print(f"\nfp8 vs bf16 logits: relative error {rel:.4f} (Frobenius), max |diff| "
              f"{(a - b).abs().max().item():.4f} of max |logit| {b.abs().max().item():.4f}")
        # e4m3 keeps 3 mantissa bits: weights within 1/16 relative; this tiny random model's
        # logits move by about 6%. A wrong scale or a misread block moves them by far more.
        assert rel < 0.15
    finally:
        subprocess.run([ckfs_bin(), "umount", "-z", str(mnt)], capture_output=True, timeout=60)


def test_refusals(tmp_path):
    src = hf_folder(tmp_path / "src", edge_weights(torch.float32))
    run_ckfs("export", "--dtype", "fp8", src, tmp_path / "fp8")
    # an already block-quantized folder: as stored when no dtype is asked (or auto), never
    # quantized again (tests/py/test_fp8_release.py: dequantized to a float dtype)
    run_ckfs("export", tmp_path / "fp8", tmp_path / "x")
    run_ckfs("export", "--dtype", "auto", tmp_path / "fp8", tmp_path / "asis")
    stored = load_folder(tmp_path / "fp8")
    for d in ("x", "asis"):
        got = load_folder(tmp_path / d)
        assert set(got) == set(stored)
        for k, v in stored.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k
    p = run_ckfs("export", "--dtype", "fp8", tmp_path / "fp8", tmp_path / "again", check=False)
    assert p.returncode == 1 and "already quantized" in p.stderr and "--dtype auto" in p.stderr
    # a model with no linear weight to quantize, and a bad pattern
    only_norm = hf_folder(tmp_path / "norm", {"model.norm.weight": torch.ones(8)})
    p = run_ckfs("export", "--dtype", "fp8", only_norm, tmp_path / "y", check=False)
    assert p.returncode == 1 and "found no linear weight" in p.stderr
    p = run_ckfs("export", "--dtype", "fp8", "--quant-skip", "(", src, tmp_path / "z", check=False)
    assert p.returncode == 1 and "is not a regular expression" in p.stderr
    # --quant-skip leaves what it matches in bf16 (here by its former name)
    run_ckfs("export", "--dtype", "fp8", "--fp8-skip", "down_proj", src, tmp_path / "skip")
    got = load_folder(tmp_path / "skip")
    assert got["model.layers.0.mlp.down_proj.weight"].dtype == torch.bfloat16
    assert "model.layers.0.mlp.down_proj.weight_scale_inv" not in got
    assert got["model.layers.0.mlp.up_proj.weight"].dtype == torch.float8_e4m3fn
    q = json.loads((tmp_path / "skip" / "config.json").read_text())["quantization_config"]
    assert "model.layers.0.mlp.down_proj" in q["modules_to_not_convert"]


@pytest.mark.parametrize("case,cls", [
    ("moe_fsdp/qwen3_moe_fsdp2_w2", "AutoModelForCausalLM"),
    ("moe_fsdp/mixtral_fsdp2_w2", "AutoModelForCausalLM"),
    ("vlm/qwen2_5_vl_fsdp2_w2", "AutoModelForImageTextToText"),
    ("vlm/gemma3_fsdp2_w2", "AutoModelForImageTextToText"),
    ("vlm/qwen3_vl_moe_fsdp2_w2", "AutoModelForImageTextToText"),
    ("lora/lora_qwen2_fsdp2_w2", "AutoModelForCausalLM"),
])
def test_other_models_load(case, cls, tmp_path):
    """Experts written per expert (Qwen3-MoE, Mixtral's block_sparse_moe), vision-language
    models (the vision tower left bf16, modules listed under the names transformers holds
    them by), fused experts kept fused (left bf16), a LoRA fused then quantized: transformers
    loads each with no key missing or unexpected, every weight within FP8's error of bf16."""
    import transformers

    torch.set_num_threads(1)
    src = FIXTURES / case
    run_ckfs("export", "--dtype", "fp8", "--lora=fuse", src, tmp_path / "fp8")
    run_ckfs("export", "--lora=fuse", src, tmp_path / "bf16")
    auto = getattr(transformers, cls)
    model, info = auto.from_pretrained(str(tmp_path / "fp8"), dtype=torch.bfloat16, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ref = auto.from_pretrained(str(tmp_path / "bf16"), dtype=torch.bfloat16).state_dict()
    got = model.state_dict()
    for k, w in ref.items():
        err = ((got[k].float() - w.float()).norm() / w.float().norm().clamp_min(1e-12)).item()
        assert err < 0.05, (k, err)  # e4m3: 3 mantissa bits, 1/16 at worst per element


def test_scales_in_their_weights_shard(tmp_path):
    """With --max-shard-size each weight's scales are in its shard, whatever the limit."""
    for limit in ("20KB", "50KB", "100KB"):
        out = tmp_path / limit
        run_ckfs("export", "--dtype", "fp8", "--max-shard-size", limit, FIXTURES / "fsdp" / "qwen2_fsdp2_w2", out)
        wm = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
        scales = [k for k in wm if k.endswith("_scale_inv")]
        assert scales and all(wm[k] == wm[k[:-len("_scale_inv")]] for k in scales), limit
        assert len(set(wm.values())) > 1
