# SPDX-License-Identifier: MIT
"""transformers (5.19, with compressed-tensors 0.20.1) loads a W4A16 or NVFP4A16 folder: run in the
W4A16 venv.

    python load_check.py QUANT_DIR BF16_DIR

Loads QUANT_DIR as transformers does a compressed-tensors checkpoint (its quantization_config
read by the CompressedTensorsHfQuantizer, the packed weights decompressed on the CPU), with no key
missing or unexpected, and BF16_DIR as the plain model; runs both on the same ids and prints one
JSON line: the logits' relative error (Frobenius), their max |diff|, the max |logit|, how many
decompressed weights equal the library's dequantize of the served tensors (W4A16's q * s; NVFP4's
own decompress), and the largest relative error (Frobenius) of a dequantized weight against the
bf16 one.
"""
import json
import sys

import torch
import transformers
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
from compressed_tensors.quantization import QuantizationScheme
from compressed_tensors.quantization.quant_scheme import NVFP4A16
from safetensors.torch import load_file


def dequantized(served, mod):
    """The library's dequantized weight of a served module."""
    if mod + ".weight_global_scale" in served:
        parts = {k: served[f"{mod}.{k}"] for k in ("weight_packed", "weight_scale", "weight_global_scale")}
        return NVFP4PackedCompressor.decompress(parts, QuantizationScheme(targets=["Linear"], **NVFP4A16))["weight"]
    q = unpack_from_int32(served[mod + ".weight_packed"], 4, torch.Size(served[mod + ".weight_shape"].tolist()))
    s = served[mod + ".weight_scale"]
    return (q.to(torch.bfloat16).unflatten(-1, (-1, 128)) * s.unsqueeze(-1)).flatten(-2)


def main():
    w4, bf16 = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        w4, dtype=torch.bfloat16, output_loading_info=True)
    ref = transformers.AutoModelForCausalLM.from_pretrained(bf16, dtype=torch.bfloat16)
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4, 6, 8]])
    with torch.no_grad():
        a, b = model(input_ids=ids).logits.float(), ref(input_ids=ids).logits.float()
    # the weights transformers holds: q * s of the served bytes
    served = load_file(f"{w4}/model.safetensors")
    sd = model.state_dict()
    plain = ref.state_dict()
    held, weight_rel = 0, 0.0
    for name, packed in served.items():
        if not name.endswith(".weight_packed"):
            continue
        mod = name[:-len(".weight_packed")]
        want = dequantized(served, mod)
        key = mod + ".weight"
        held += key in sd and torch.equal(sd[key], want)
        w = plain[key].float()
        weight_rel = max(weight_rel, ((want.float() - w).norm() / w.norm()).item())
    print(json.dumps({
        "missing": list(info["missing_keys"]), "unexpected": list(info["unexpected_keys"]),
        "quant_method": model.config.quantization_config.quant_method
        if hasattr(model.config.quantization_config, "quant_method")
        else model.config.quantization_config["quant_method"],
        "rel": ((a - b).norm() / b.norm()).item(), "max_diff": (a - b).abs().max().item(),
        "max_logit": b.abs().max().item(),
        "weight_rel": weight_rel, "weights_equal": held, "weights": sum(n.endswith(".weight_packed") for n in served)}))


if __name__ == "__main__":
    main()
