#!/usr/bin/env python3
"""Check a q4_0 GGUF file from ckfs against gguf-py's own quantizer (run in the GGUF oracle venv).

    python tests/gguf/q4_0_check.py BF16.gguf Q4_0.gguf

BF16.gguf is the converter's bf16 file of the same checkpoint (the values the weights have in the
exported folder). For every tensor of Q4_0.gguf: its type is the one docs/gguf.md gives (Q4_0 for
2-D weights whose rows are whole blocks, Q8_0 for the output matrix: output.weight, or
token_embd.weight when tied; F32 for norms and 1-D tensors, F16 for rows that are not whole
blocks), and its bytes are gguf.quants.quantize(values, type), bit for bit. Key-values must be the bf16 file's but for general.file_type (2). Prints one line per tensor;
exit status 1 on any difference.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(sys.executable).resolve().parents[1] / "llama.cpp" / "gguf-py"))
sys.path.insert(0, str(Path(sys.prefix) / "llama.cpp" / "gguf-py"))
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402


def fields(r):
    return {k: (f.types, [bytes(p) for p in f.parts]) for k, f in r.fields.items()}


def main():
    ref = gguf.GGUFReader(sys.argv[1])
    got = gguf.GGUFReader(sys.argv[2])
    bad = 0
    fr, fg = fields(ref), fields(got)
    for k in fr:
        if k in ("general.file_type", "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"):
            continue
        if fr[k] != fg.get(k):
            print(f"key {k}: differs")
            bad += 1
    if int(got.fields["general.file_type"].parts[-1][0]) != 2:
        print("general.file_type is not 2 (MOSTLY_Q4_0)")
        bad += 1
    if [t.name for t in ref.tensors] != [t.name for t in got.tensors]:
        print("tensor names or order differ")
        return 1
    # The output matrix stays Q8_0; a tied model's is token_embd.
    names = [t.name for t in ref.tensors]
    output = "output.weight" if "output.weight" in names else "token_embd.weight"
    for a, b in zip(ref.tensors, got.tensors):
        values = gguf.quants.dequantize(a.data, a.tensor_type).reshape(
            [int(n) for n in reversed(a.shape)])
        if a.tensor_type == T.F32:
            want_type = T.F32
        elif a.name == output:
            want_type = T.Q8_0
        else:
            want_type = T.Q4_0
        if want_type != T.F32 and values.shape[-1] % 32:
            want_type = T.F16
        want = gguf.quants.quantize(values.astype(np.float32), want_type)
        same = b.tensor_type == want_type and bytes(np.ascontiguousarray(b.data).view(np.uint8)) == \
            bytes(np.ascontiguousarray(want).view(np.uint8))
        print(f"{b.name:28s} {b.tensor_type.name:5s} {'bit-exact' if same else 'DIFFERS'}")
        bad += not same
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
