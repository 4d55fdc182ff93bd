#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""DeepSpeed's zero_to_fp32 conversion to safetensors, as the DeepSpeed benchmark's baseline.

    zero_to_fp32_export.py CKPT OUT [--dtype fp32|bf16] [--unchanged]

Runs deepspeed.utils.zero_to_fp32.convert_zero_checkpoint_to_state_dict(CKPT, OUT,
safe_serialization=True, dtype=...) of the installed DeepSpeed (0.19.8; the same code as the
zero_to_fp32.py copy in every checkpoint, whose --safe_serialization calls it). On a model with
tied embeddings that call fails (safetensors refuses the shared lm_head.weight /
model.embed_tokens.weight pair: "Some tensors share memory"), so by default one thing is
changed: the tied aliases zero_to_fp32 adds to its state dict (names whose tensor is an earlier
name's object) are dropped before the conversion writes it, which is what save_pretrained does
for a tied model. --unchanged runs it as shipped (and fails on tied models).
"""
import argparse
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--unchanged", action="store_true")
    a = ap.parse_args()
    import deepspeed.utils.zero_to_fp32 as z2f

    if not a.unchanged:
        reconstruct = z2f._get_fp32_state_dict_from_zero_checkpoint

        def without_aliases(ds_dir, exclude_frozen_parameters):
            sd = reconstruct(ds_dir, exclude_frozen_parameters)
            seen = set()
            for k in list(sd):
                if id(sd[k]) in seen:
                    del sd[k]  # a shared_params alias: its owner's tensor object
                else:
                    seen.add(id(sd[k]))
            return sd

        z2f._get_fp32_state_dict_from_zero_checkpoint = without_aliases
    try:
        z2f.convert_zero_checkpoint_to_state_dict(a.ckpt, a.out, safe_serialization=True,
                                                  dtype="float32" if a.dtype == "fp32" else "bfloat16")
    except Exception as e:  # noqa: BLE001 - reported as one line for the benchmark
        print("zero_to_fp32 failed: %s: %s" % (type(e).__name__, " ".join(str(e).split())[:300]),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
