#!/usr/bin/env python3
"""convert_hf_to_gguf.py with one change: the Qwen MoE classes read tokenizer.model (the SentencePiece
path of Llama, Qwen2 and Qwen3) instead of tokenizer.json (run in the GGUF oracle venv).

    python tests/gguf/convert_spm.py HF_DIR --outtype T --outfile OUT --model-name NAME

The converter's Qwen2MoeModel (and Qwen3MoeModel, its subclass) reads a tokenizer only as GPT-2 BPE,
known by the hash of its output, which the GGUF view does not reproduce yet; its tensors and key-values
are what the tests check. Everything else is the unmodified converter, run as its own __main__; ckfs
takes the same path only with CKFS_GGUF_TEST_MOE_SPM=1 (tests only).
"""

import runpy
import sys
from pathlib import Path

LLAMA_CPP = Path(sys.prefix) / "llama.cpp"
sys.path.insert(0, str(LLAMA_CPP / "gguf-py"))
sys.path.insert(0, str(LLAMA_CPP))

from conversion import base, qwen  # noqa: E402

qwen.Qwen2MoeModel.set_vocab = base.TextModel._set_vocab_sentencepiece
sys.argv = [str(LLAMA_CPP / "convert_hf_to_gguf.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
