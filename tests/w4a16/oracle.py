# SPDX-License-Identifier: MIT
"""compressed-tensors' own W4A16 or NVFP4A16 of a bf16 folder: what llm-compressor saves for the
scheme (targets ["Linear"], ignore ["lm_head"]), run in the W4A16 venv (setup-w4a16-venv.sh).

    python oracle.py BF16_DIR OUT_DIR [--model] [--nvfp4]

Each weight's group scales come from the library's calculate_qparams on the group's min and max
(compute_dynamic_scales_and_zp, what llm-compressor's min-max observer feeds it); with --nvfp4
(the NVFP4A16 preset) after the weight's global scale, the library's generate_gparam on the whole
weight's min and max, both in the weight's dtype as the observer sees it. Then the library's
ModelCompressor compresses (quantize + pack_to_int32, or quantize_and_pack_fp4) and writes
quantization_config into config.json. With --model the folder is loaded as a transformers model (every nn.Linear but
lm_head quantized, as apply_quantization_config finds them); without, the weights file is read
as tensors and each 2-D `*.weight` of a linear projection is quantized by the same functions
(folders transformers cannot build, such as the edge fixture). OUT_DIR gets model.safetensors
(the compressed state dict) and config.json.
"""
import json
import os
import shutil
import sys

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from compressed_tensors.quantization import (QuantizationConfig, QuantizationScheme,
                                             QuantizationStatus, apply_quantization_config)
from compressed_tensors.quantization.lifecycle.forward import quantize
from compressed_tensors.quantization.quant_scheme import NVFP4A16, W4A16
from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp, generate_gparam
from safetensors.torch import load_file, save_file

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
NVFP4 = "--nvfp4" in sys.argv[3:]
PRESET, FORMAT = (NVFP4A16, "nvfp4-pack-quantized") if NVFP4 else (W4A16, "pack-quantized")


def config():
    return QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], **PRESET)},
                              ignore=["lm_head"])


def qparams(w, args, module):
    """The weight's scales (and NVFP4's global scale, else None) as the min-max observer has them."""
    gs = generate_gparam(*torch.aminmax(w)) if NVFP4 else None
    scale, zp = compute_dynamic_scales_and_zp(w, args, module, global_scale=gs)
    return scale, zp, gs


def from_model(src, out):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    apply_quantization_config(model, config())
    for _, m in model.named_modules():
        scheme = getattr(m, "quantization_scheme", None)
        if scheme is None or scheme.weights is None:
            continue
        scale, _, gs = qparams(m.weight.data, scheme.weights, m)
        m.weight_scale.data.copy_(scale)
        if gs is not None:
            m.weight_global_scale.data.copy_(gs)
        m.quantization_status = QuantizationStatus.FROZEN
    mc = ModelCompressor.from_pretrained_model(model, quantization_format=FORMAT)
    mc.compress_model(model)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(src, "config.json"), os.path.join(out, "config.json"))
    mc.update_config(out)


def from_tensors(src, out):
    scheme = QuantizationScheme(targets=["Linear"], **PRESET)
    args = scheme.weights
    sd = load_file(os.path.join(src, "model.safetensors"))
    res = {}
    for name, w in sd.items():
        module = name.rsplit(".", 1)[0]
        if w.dim() == 2 and name.endswith(".weight") and module.rsplit(".", 1)[-1] in PROJECTIONS:
            scale, zp, gs = qparams(w, args, None)
            if NVFP4:
                sd_mod = NVFP4PackedCompressor.compress(
                    {"weight": w, "weight_scale": scale, "weight_global_scale": gs, "weight_zero_point": zp},
                    scheme)
                res.update({f"{module}.{k}": v for k, v in sd_mod.items()})
                continue
            q = quantize(x=w, scale=scale, zero_point=zp, args=args, dtype=torch.int8)
            res[module + ".weight_packed"] = pack_to_int32(q, 4)
            res[module + ".weight_scale"] = scale
            res[module + ".weight_shape"] = torch.tensor(w.shape)
        else:
            res[name] = w
    save_file(res, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    (from_model if "--model" in sys.argv[3:] else from_tensors)(src, out)


if __name__ == "__main__":
    main()
