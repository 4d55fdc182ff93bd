#!/usr/bin/env python3
"""Generate the GGUF view's MoE checkpoints (tests/fixtures/gguf/qwen3_moe_fsdp2_w2, qwen2_moe_fsdp2_w2)
from the verl FSDP2 actors of tests/fixtures/moe_fsdp/ (written by real transformers, FSDP2 and verl's
FSDPCheckpointManager, tests/gen/make_lora_vlm_fixtures.py), with their tokenizer replaced:

  * the rank files (model_*, extra_state_*) and fsdp_config.json are copied as they are (no optimizer
    state: the GGUF view never reads it);
  * huggingface/ gets the SentencePiece tokenizer of the other GGUF fixtures (tests/fixtures/gguf/
    tokenizer.model, as make_gguf_fixtures.py saves it, chat template in chat_template.jinja) in place
    of the toy BPE tokenizer.json, which llama.cpp's converter refuses by its hash. vocab_size stays 53:
    the converter (and ckfs) keep the first 53 pieces;
  * Qwen3-MoE's config.json says norm_topk_prob true, as Qwen3-30B-A3B's does: llama.cpp's qwen3moe
    always renormalizes the chosen experts' weights, so ckfs refuses false (docs/gguf.md). The key
    changes no weight.

    python3 tests/gen/make_gguf_moe_fixtures.py      # any Python 3, no packages, < 1 s
"""

from __future__ import annotations

import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SRC = os.path.join(REPO, "tests", "fixtures", "moe_fsdp")
OUT = os.path.join(REPO, "tests", "fixtures", "gguf")
CASES = {"qwen3_moe_fsdp2_w2": dict(norm_topk_prob=True), "qwen2_moe_fsdp2_w2": {}}


def main():
    sys.path.insert(0, HERE)
    from make_gguf_fixtures import SentencePieceFiles

    for name, config_edits in CASES.items():
        src, dst = os.path.join(SRC, name), os.path.join(OUT, name)
        shutil.rmtree(dst, ignore_errors=True)
        os.makedirs(os.path.join(dst, "huggingface"))
        for f in sorted(os.listdir(src)):
            if f.startswith(("model_", "extra_state_")) or f == "fsdp_config.json":
                shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
        for f in ("config.json", "generation_config.json"):
            shutil.copyfile(os.path.join(src, "huggingface", f), os.path.join(dst, "huggingface", f))
        path = os.path.join(dst, "huggingface", "config.json")
        with open(path) as f:
            config = json.load(f)
        config.update(config_edits)
        with open(path, "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
            f.write("\n")
        SentencePieceFiles(os.path.join(OUT, "tokenizer.model"), "jinja").save_pretrained(
            os.path.join(dst, "huggingface"))
        print(f"[{name}] written")


if __name__ == "__main__":
    main()
