#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The reference for --dtype fp8 (block-wise FP8 on read), written by torch.

`reference_quantize(w)`: per 128 x 128 block of a 2-D weight (partial blocks at the edges)
    s = max(amax(|block|), 1e-10) / 448   (torch's amax and clamp give NaN for a block holding
                                           one)
    q = (w / s).clamp(-448, 448).to(torch.float8_e4m3fn)
which is what vLLM, SGLang and transformers read as `weight` (F8_E4M3) and `weight_scale_inv`
(F32, one per block; the name is DeepSeek-V3's: dequantized w = q * s). The floor on amax is
vLLM's (`per_token_group_quant_fp8`, vllm/model_executor/layers/quantization/utils/
fp8_utils.py: eps = 1e-10, `_absmax = max(max(|y|), eps)`, scale = _absmax / fp8_max,
q = clamp(y / scale)); SGLang's `sglang_per_token_group_quant_fp8` takes the same eps. Without
it, one fp32 subnormal among zeros gives amax / 448 = 0 and every zero of the block 0 / 0 = NaN;
with it every block of finite values dequantizes to finite values (an all-zero block: scale
1e-10 / 448, values 0).

Writes, for the C tests (tests/unit/test_fp8.c) to compare with bit for bit:
    tests/fixtures/fp8/edge_<fp32|bf16>/   a Hugging Face folder (safetensors.save_file) of weights
                                           reaching every branch: partial blocks, NaN of both signs,
                                           Inf, an all-zero block, subnormals, huge values
    tests/fixtures/fp8/expected_<case>.safetensors   the reference's values and scales of every
                                           weight ckfs quantizes in that case (the two edge folders,
                                           fsdp/qwen2_fsdp2_w2 (fp32 rank files) and
                                           fsdp/llama_bf16_fsdp2_w2 (bf16 rank files))

    .venv/bin/python tests/gen/make_fp8_expected.py      # needs build/ckfs (for --dtype auto)
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FIX, "fp8")
BLOCK = 128
AMAX_FLOOR = 1e-10  # vLLM's eps (per_token_group_quant_fp8), as an fp32 clamp on amax
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def reference_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w = w.float()
    rows, cols = w.shape
    br, bc = math.ceil(rows / BLOCK), math.ceil(cols / BLOCK)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    scales = torch.empty(br, bc, dtype=torch.float32)
    for i in range(br):
        for j in range(bc):
            b = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            s = b.abs().amax().clamp(min=AMAX_FLOOR) / 448
            scales[i, j] = s
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = (b / s).clamp(-448, 448).to(
                torch.float8_e4m3fn)
    return q, scales


def edge_weights(dtype) -> dict:
    """Weights that reach every branch of the quantizer."""
    g = torch.Generator().manual_seed(17)
    down = torch.randn(300, 200, generator=g) * 0.05
    down[0:128, 128:200] = 0                       # an all-zero (edge) block
    down[5, 7] = float("nan")
    down[200, 3] = -float("nan")
    down[130, 150] = float("inf")
    down[260, 10] = -float("inf")
    up = torch.randn(256, 128, generator=g)
    up[:128] *= 1e-40                              # subnormal fp32 (0 in bf16)
    up[128:, :64] *= 1e30
    up[128:, 64:] = torch.linspace(-3e38, 3e38, 128 * 64).reshape(128, 64)
    gate = torch.randn(1, 5, generator=g) * 2 ** -12
    q = torch.randn(130, 129, generator=g)
    # amax / 448 underflowing: one fp32 subnormal among zeros (0 in bf16), an all-zero block, a
    # block below the floor, a plain one
    o = torch.zeros(256, 256)
    o[3, 5] = 2.0 ** -149
    o[140, 200] = -1e-12
    o[128:, :128] = torch.randn(128, 128, generator=g)
    return {"model.layers.0.self_attn.o_proj.weight": o.to(dtype),"model.layers.0.mlp.down_proj.weight": down.to(dtype),
            "model.layers.0.mlp.up_proj.weight": up.to(dtype),
            "model.layers.0.mlp.gate_proj.weight": gate.to(dtype),
            "model.layers.0.self_attn.q_proj.weight": q.to(dtype),
            "model.norm.weight": torch.ones(64, dtype=dtype)}


def quantized(sd: dict) -> dict:
    out = {}
    for name, w in sd.items():
        module = name.rsplit(".", 1)[0]
        if w.dim() == 2 and name.endswith(".weight") and module.rsplit(".", 1)[-1] in PROJECTIONS:
            out[name], out[name + "_scale_inv"] = reference_quantize(w)
    return out


def as_stored(case: str) -> dict:
    """A checkpoint's weights as stored: `ckfs export --dtype auto` (equal to the original
    weights, tests/unit/test_layouts.c)."""
    ckfs = os.environ.get("CKFS_BIN", os.path.join(ROOT, "build", "ckfs"))
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([ckfs, "export", "-q", "--dtype", "auto", os.path.join(FIX, "fsdp", case),
                        os.path.join(tmp, "out")], check=True)
        return load_file(os.path.join(tmp, "out", "model.safetensors"))


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    config = os.path.join(FIX, "fsdp", "qwen2_fsdp2_w2", "huggingface", "config.json")
    for tag, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        d = os.path.join(OUT, f"edge_{tag}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        shutil.copy(config, os.path.join(d, "config.json"))
        sd = edge_weights(dtype)
        save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        save_file(quantized(sd), os.path.join(OUT, f"expected_edge_{tag}.safetensors"))
    for case in ("qwen2_fsdp2_w2", "llama_bf16_fsdp2_w2"):
        save_file(quantized(as_stored(case)), os.path.join(OUT, f"expected_{case}.safetensors"))
    print("wrote", OUT, file=sys.stderr)


if __name__ == "__main__":
    main()
