"""A block-FP8 release (DeepSeek-V3/R1's, Kimi-K2's) served in a float dtype (issue 36).

- tests/fixtures/fp8_release/deepseek_v3_tiny/release (tests/gen/make_fp8_release_fixtures.py:
  quantized by transformers' own Fp8Quantize op, two shards and an index), exported with
  --dtype bf16: every tensor bit for bit what the venv's transformers' Fp8Dequantize makes of it,
  live; the scales gone; config.json without quantization_config, still loaded by
  transformers as the same model otherwise. Without --dtype: every tensor as stored.
- Partial edge blocks, NaN, Inf, zero blocks and subnormals (the FP8 values and scales of
  tests/fixtures/fp8/expected_edge_*.safetensors, DeepSeek's layout written by the torch
  reference quantizer of tests/gen/make_fp8_expected.py): bf16, fp16 and fp32 each equal, bit
  for bit, DeepSeek's fp8_cast_bf16.py arithmetic in torch, f32(v) * scale of its 128 x 128
  block, then the dtype (its weight_dequant kernel computes the same on a GPU).

transformers 5.10.4's own from_pretrained of the release on the CPU fails inside its dequantizing
loader ("Undefined Operation encountered!" on the experts), so the op is called directly.
"""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from conftest import FIXTURES, run_ckfs

RELEASE = FIXTURES / "fp8_release" / "deepseek_v3_tiny" / "release"


def bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32) if t.element_size() == 4 \
        else t.view(torch.int8)


def release_tensors():
    out = {}
    for f in sorted(RELEASE.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_release_bf16_is_transformers_dequantize(tmp_path):
    from types import SimpleNamespace

    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    deq = Fp8Dequantize(SimpleNamespace(quantization_config=FineGrainedFP8Config(weight_block_size=(128, 128))))
    run_ckfs("export", "-q", "--dtype", "bf16", RELEASE, tmp_path / "out")
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    src = release_tensors()
    scales = {k for k in src if k.endswith(".weight_scale_inv")}
    assert set(got) == set(src) - scales and scales
    for name, t in got.items():
        s = src.get(name + "_scale_inv")
        want = deq._dequantize_one(src[name], s, output_dtype=torch.bfloat16) if s is not None else src[name]
        assert t.dtype == torch.bfloat16 and torch.equal(bits(t), bits(want)), name
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    ref = json.loads((RELEASE / "config.json").read_text())
    assert "quantization_config" not in cfg and ref.pop("quantization_config")
    assert cfg == {**ref, "dtype": "bfloat16"} or cfg == ref


def test_release_as_stored_without_dtype(tmp_path):
    run_ckfs("export", "-q", RELEASE, tmp_path / "out")
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    src = release_tensors()
    assert set(got) == set(src)
    for name, t in got.items():
        assert t.dtype == src[name].dtype and torch.equal(bits(t), bits(src[name])), name
    assert "quantization_config" in json.loads((tmp_path / "out" / "config.json").read_text())


def deepseek_dequant(w, s, dtype):
    """fp8_cast_bf16.py's weight_dequant: f32(v) * the scale of its 128 x 128 block."""
    rows, cols = w.shape
    grid = s.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
    return (w.to(torch.float32) * grid).to(dtype)


@pytest.mark.parametrize("case", ["edge_fp32", "edge_bf16"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_partial_blocks_as_deepseek_computes(case, dtype, tmp_path):
    src = tmp_path / "release"
    src.mkdir()
    shutil.copy(FIXTURES / "fp8" / case / "config.json", src / "config.json")
    shutil.copy(FIXTURES / "fp8" / f"expected_{case}.safetensors", src / "model.safetensors")
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    run_ckfs("export", "-q", "--dtype", dtype, src, tmp_path / "out")
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    stored = load_file(str(src / "model.safetensors"))
    partial = 0
    for name, t in got.items():
        s = stored.get(name + "_scale_inv")
        if s is None:
            continue
        want = deepseek_dequant(stored[name], s, torch_dtype)
        partial += stored[name].shape[0] % 128 != 0 or stored[name].shape[1] % 128 != 0
        assert torch.equal(bits(t), bits(want)), name
    assert partial > 0, "no weight with partial edge blocks"
