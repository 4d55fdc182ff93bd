#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A block-FP8 release as DeepSeek-V3/R1 and Kimi-K2 ship, tiny, and its bf16 oracle.

    .venv/bin/python tests/gen/make_fp8_release_fixtures.py

Writes tests/fixtures/fp8_release/deepseek_v3_tiny/:

  release/   the checkpoint: a DeepSeek-V3-shaped model (transformers 5.10.4's
             DeepseekV3ForCausalLM: MLA, layer 0 dense, layer 1 with 4 routed
             experts and a shared one), saved by save_pretrained in bf16 (so the
             names are the release's: experts one by one), then every linear
             projection weight quantized by transformers' own FineGrainedFP8
             quantizer op (Fp8Quantize, 128 x 128 blocks: F8_E4M3 values and a
             weight_scale_inv F32 per block; a weight whose shape the blocks do not
             divide is left bf16, as that op leaves it), written by
             huggingface_hub's save_torch_state_dict in two shards with
             model.safetensors.index.json; config.json is save_pretrained's with
             DeepSeek-V3's quantization_config ({"activation_scheme": "dynamic",
             "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}).
  expected/  model.safetensors: every tensor as fp8_cast_bf16.py leaves it, each
             quantized weight dequantized to bf16 by transformers' own
             Fp8Dequantize op (float32 product, then bf16), the scales dropped.

Weights are seeded (zlib.crc32 of the name), so the files are the same on every
run with the same packages.
"""
import json
import os
import shutil
import sys
import tempfile
import zlib

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "fixtures", "fp8_release", "deepseek_v3_tiny")
PROJECTIONS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj",
               "up_proj", "down_proj")
QUANT = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
         "weight_block_size": [128, 128]}


def model():
    import transformers

    c = transformers.DeepseekV3Config(
        vocab_size=512, hidden_size=256, intermediate_size=384, moe_intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4,
        n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
        q_lora_rank=128, kv_lora_rank=128, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=128,
        max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        pad_token_id=0)
    c.architectures = ["DeepseekV3ForCausalLM"]
    m = transformers.AutoModelForCausalLM.from_config(c, dtype=torch.bfloat16)
    with torch.no_grad():
        for name, p in m.named_parameters():
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            t = torch.randn(p.shape, generator=g, dtype=torch.float32)
            p.copy_((1.0 + 0.1 * t if "norm" in name else 0.05 * t).to(p.dtype))
    return m


def quantizer():
    from types import SimpleNamespace

    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize, Fp8Quantize

    q = SimpleNamespace(quantization_config=FineGrainedFP8Config(weight_block_size=(128, 128)))
    return Fp8Quantize(q), Fp8Dequantize(q)


def main():
    from huggingface_hub import save_torch_state_dict
    from safetensors.torch import load_file, save_file

    quant, dequant = quantizer()
    shutil.rmtree(OUT, ignore_errors=True)
    release, expected = os.path.join(OUT, "release"), os.path.join(OUT, "expected")
    os.makedirs(expected)
    os.makedirs(release)
    with tempfile.TemporaryDirectory() as tmp:
        model().save_pretrained(tmp)  # bf16, the release's names
        sd = load_file(os.path.join(tmp, "model.safetensors"))
        out = {}
        for name, t in sd.items():
            module = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
            out.update(quant._quantize_one(name, t) if module in PROJECTIONS else {name: t})
        save_torch_state_dict(out, release, max_shard_size="1MB")
        cfg = json.load(open(os.path.join(tmp, "config.json")))
        cfg["quantization_config"] = QUANT
        with open(os.path.join(release, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")
    n_q = sum(1 for k in out if k.endswith("_scale_inv"))
    want = {}
    for name, t in out.items():
        if name.endswith("_scale_inv"):
            continue
        s = out.get(name + "_scale_inv")
        want[name] = dequant._dequantize_one(t, s, output_dtype=torch.bfloat16) if s is not None else t
    save_file(want, os.path.join(expected, "model.safetensors"))
    import transformers

    print(f"transformers {transformers.__version__}: {len(out)} tensors, {n_q} weights in FP8, "
          f"left bf16: {[k for k, v in want.items() if k.rsplit('.', 2)[-2] in PROJECTIONS and k + '_scale_inv' not in out]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
