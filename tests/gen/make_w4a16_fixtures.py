#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Generate the W4A16 view's checkpoints (tests/fixtures/w4a16/).

`--dtype w4a16` quantizes linear weights in groups of 128 along the input dim, so every linear
layer's input dim must be a multiple of 128; the other fixtures' (64, 96) are not (they are the
refusal's cases). Written here, in the main venv:

    qwen2_fsdp2_w2/   a tiny Qwen2 (hidden 128, intermediate 256, vocab 256), weights built by real
                      transformers and sharded by real FSDP2 through verl's own FSDPCheckpointManager
                      (make_fixtures.py's workers), fp32; without make_fixtures' planted edge
                      values, which make token 0 win every greedy step (the client tier's vLLM
                      check generates from it; edge_bf16 has the edges)
    edge_bf16/        a Hugging Face folder (safetensors.save_file) of bf16 weights that reach the
                      quantizer's edges: an all-zero group (scale 0 -> the bf16 eps), subnormal
                      groups (scale underflowing to 0), quotients that are exact .5 ties, -absmax
                      (-7.5 -> -8), huge values, a single non-zero per group
    edge_nvfp4_bf16/  the same for --dtype nvfp4 (groups of 16, a global scale per weight): values
                      on each E2M1 rounding boundary (.25, .75, 1.25, 1.75, 2.5, 3.5, 5) and beside
                      them, small negatives rounding to -0, an all-zero weight (global scale
                      overflowing to Inf -> 1), a subnormal weight, groups whose e4m3 scale
                      is subnormal or underflows to 0 (-> 0.125), a weight near the bf16 maximum

    ~/.cache/ckfs/venv/bin/python tests/gen/make_w4a16_fixtures.py       # ~30 s

The expected bytes are not written here: tests/py/test_ct_views.py quantizes and packs `ckfs export
--dtype bf16`'s weights with compressed-tensors itself.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

os.environ["CKFS_GEN_REEXEC"] = "1"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(REPO, "tests", "fixtures", "w4a16")
sys.path.insert(0, HERE)

SHAPE = dict(arch="qwen2", vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)


def edge_weights():
    import torch

    g = torch.Generator().manual_seed(29)
    down = torch.randn(128, 256, generator=g) * 0.05
    down[0, 0:128] = 0                                  # all zero: scale 0 -> eps
    down[1, 0:128] = 1e-40                              # subnormal (bf16 keeps it): absmax / 7.5 -> 0
    down[1, 128:256] = 0
    down[1, 200] = 2.0 ** -133                          # one bf16 subnormal
    down[2, 0:128] = torch.linspace(-7.5, 7.5, 128)     # absmax 7.5: scale 1, quotients on .5 ties
    down[3, 0:128] = torch.arange(128) % 16 - 8.0       # -8 .. 7: -absmax 8 -> scale 16/15
    down[3, 128:256] = 3e38 * torch.linspace(-1, 1, 128)  # huge values
    down[4, 0:128] = 0
    down[4, 5] = -3.0                                   # one value: -7.5 exactly -> -8
    down[5, 0:128] = 0
    down[5, 9] = 3.0                                    # one value: +7.5 -> clamp 7
    up = torch.randn(256, 128, generator=g)
    up[0] = (torch.arange(128) - 64.0) / 8              # quotients near ties after bf16 rounding
    gate = torch.randn(256, 128, generator=g) * 2.0 ** -126
    sd = {"model.layers.0.mlp.down_proj.weight": down, "model.layers.0.mlp.up_proj.weight": up,
          "model.layers.0.mlp.gate_proj.weight": gate,
          "model.layers.0.self_attn.q_proj.weight": torch.randn(128, 128, generator=g),
          "model.norm.weight": torch.ones(128), "lm_head.weight": torch.randn(64, 128, generator=g)}
    return {k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()}


def nvfp4_edge_weights():
    import torch

    g = torch.Generator().manual_seed(31)
    grid = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    down = torch.randn(128, 256, generator=g) * 0.05
    # absmax 6 per group: scale g * 1 exactly, so each value lands on its boundary (and beside it)
    for r, off in enumerate((0.0, 2.0 ** -7, -(2.0 ** -7))):
        row = torch.cat([grid + off, -(grid + off)])
        row[7], row[15] = 6.0, -6.0
        down[r, :] = row.repeat(16)
    down[3, :] = torch.randn(256, generator=g) * 1e-3
    down[3, 0:16] = -1e-6                                # small negatives: -0 nibbles (8)
    down[3, 16:32] = 0                                   # an all-zero group: scale 0 -> 0.125
    down[4, :] = 0
    down[4, 3] = 1e-30                                   # a group whose e4m3 scale underflows
    for k in range(16):                                  # e4m3 subnormal scales (below 2^-6)
        down[5, 16 * k:16 * k + 16] = torch.linspace(-1, 1, 16) * (2.0 ** -17) * (k + 1)
    up = torch.zeros(256, 128)                           # all zero: global scale Inf -> 1
    gate = torch.randn(256, 128, generator=g) * 2.0 ** -130  # subnormal: max clamped to 2^-126
    q = torch.randn(128, 128, generator=g) * 1e37        # near bf16's max: a tiny global scale
    sd = {"model.layers.0.mlp.down_proj.weight": down, "model.layers.0.mlp.up_proj.weight": up,
          "model.layers.0.mlp.gate_proj.weight": gate, "model.layers.0.self_attn.q_proj.weight": q,
          "model.norm.weight": torch.ones(128), "lm_head.weight": torch.randn(64, 128, generator=g)}
    return {k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()}


def write_edge(name="edge_bf16", weights=None):
    from safetensors.torch import save_file

    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cfg = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=128, intermediate_size=256,
               num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
               tie_word_embeddings=False, torch_dtype="bfloat16")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    save_file((weights or edge_weights)(), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def main():
    import make_fixtures as mf

    mf.SPECIAL_F32_BITS = []
    os.makedirs(OUT, exist_ok=True)
    write_edge()
    write_edge("edge_nvfp4_bf16", nvfp4_edge_weights)
    name = "qwen2_fsdp2_w2"
    spec = mf.cfg(name, SHAPE, 2, 2, desc="qwen2 FSDP2 W=2 with 128-multiple dims (W4A16 view)")
    ckpt = os.path.join(OUT, name)
    shutil.rmtree(ckpt, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix="ckfs-w4a16-fixtures-")
    try:
        srcdir = os.path.join(tmp, "src")
        os.makedirs(srcdir)
        mf.prepare_source(spec, srcdir)
        mf.run_ranks(spec, srcdir, ckpt, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mf.log(f"[{name}] written")


if __name__ == "__main__":
    main()
