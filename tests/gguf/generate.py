#!/usr/bin/env python3
"""Greedy generation with llama.cpp (llama-cpp-python, in ~/.cache/ckfs/gguf-runtime-venv).

    python tests/gguf/generate.py MODEL.gguf [MODEL.gguf ...]

Loads each file, evaluates the same prompt and decodes 24 tokens greedily (top-k 1, one thread, so
the result is deterministic), then prints one JSON line per file: its path and the tokens. The
caller compares them.
"""

import json
import sys

from llama_cpp import Llama

PROMPT = "hello world! a checkpoint is"

for path in sys.argv[1:]:
    llm = Llama(model_path=path, n_ctx=128, n_threads=1, n_batch=32, seed=0, verbose=False)
    tokens = llm.tokenize(PROMPT.encode())
    out = []
    for tok in llm.generate(tokens, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
        out.append(int(tok))
        if len(out) == 24:
            break
    print(json.dumps({"path": path, "prompt": tokens, "tokens": out, "text": llm.detokenize(out).decode(errors="replace")}))
