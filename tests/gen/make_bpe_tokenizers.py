#!/usr/bin/env python3
"""Rebuild real byte-level BPE tokenizers (tests/fixtures/gguf_bpe/) from the vocab-only GGUF files
that llama.cpp vendors in the llama-cpp-python 0.3.36 source package (models/ggml-vocab-*.gguf,
written by convert_hf_to_gguf.py from the models' own tokenizer.json).

Each GGUF holds the model's tokens, token types and merges; the pre-tokenizer, normalizer and
decoder are those of the model's own tokenizer.json (Qwen1.5/2: NFC, one Split regex, ByteLevel).
The result is checked by the converter itself: its get_vocab_base_pre must name the tokenizer as
the GGUF does (tokenizer.ggml.pre), which it does only when the tokenizer's output on its check
text is the original's.

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36    # the sdist, 77 MB
    ~/.cache/ckfs/gguf-venv/bin/python tests/gen/make_bpe_tokenizers.py llama_cpp_python-0.3.36.tar.gz

Outputs tests/fixtures/gguf_bpe/<name>.tokenizer.json.gz (gzip -n, 9) and
<name>.tokenizer_config.json.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "fixtures", "gguf_bpe")

# The pre-tokenizer of Qwen1.5/Qwen2/Qwen2.5's tokenizer.json.
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Llama 3's: digits by up to three.
LLAMA3_REGEX = QWEN2_REGEX.replace(r"\p{N}|", r"\p{N}{1,3}|")
BOS = "<|begin_of_text|>"
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
CASES = {
    "qwen2": dict(
        normalizer={"type": "NFC"},
        pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
            BYTE_LEVEL]},
        post_processor=BYTE_LEVEL, decoder=BYTE_LEVEL,
        config={"add_bos_token": False, "add_prefix_space": False, "bos_token": None,
                "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
                "model_max_length": 32768, "pad_token": "<|endoftext|>", "split_special_tokens": False,
                "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}),
    "llama-bpe": dict(
        normalizer=None,
        pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        post_processor={"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": BOS, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {BOS: {"id": BOS, "ids": [128000], "tokens": [BOS]}}}]},
        decoder={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        ignore_merges=True,
        config={"bos_token": BOS, "clean_up_tokenization_spaces": True, "eos_token": "<|end_of_text|>",
                "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
                "tokenizer_class": "PreTrainedTokenizerFast"}),
}


def build(gguf_path: str, spec: dict) -> tuple[dict, dict]:
    import gguf

    r = gguf.GGUFReader(gguf_path)
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    vocab, added = {}, []
    for i, (t, ty) in enumerate(zip(toks, types)):
        if ty == gguf.TokenType.NORMAL:
            vocab[t] = i
        elif ty == gguf.TokenType.CONTROL:
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True})
        elif t != f"[PAD{i}]":  # [PADn]: ids the model has beyond the tokenizer
            raise SystemExit(f"{gguf_path}: token {i} of type {ty}")
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": spec["normalizer"], "pre_tokenizer": spec["pre_tokenizer"],
           "post_processor": spec["post_processor"], "decoder": spec["decoder"],
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                     "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": spec.get("ignore_merges", False), "vocab": vocab, "merges": merges}}
    cfg = {"added_tokens_decoder": {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                      "single_word", "special")} for a in added}}
    cfg.update(spec["config"])
    if "tokenizer.chat_template" in r.fields:
        cfg["chat_template"] = r.fields["tokenizer.chat_template"].contents()
    return tok, cfg


def check(name: str, tok: dict, cfg: dict, want: str) -> None:
    """The converter's own hash check must name the rebuilt tokenizer as the GGUF does."""
    sys.path.insert(0, os.path.join(os.path.dirname(sys.executable), "..", "llama.cpp"))
    from transformers import AutoTokenizer
    from conversion.base import TextModel

    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False)
        got = TextModel.get_vocab_base_pre(None, AutoTokenizer.from_pretrained(d))
    if got != want:
        raise SystemExit(f"{name}: the converter names it {got!r}, not {want!r}")
    print(f"{name}: get_vocab_base_pre -> {got!r}")


def main() -> None:
    sdist = sys.argv[1]
    os.makedirs(OUT, exist_ok=True)
    with tarfile.open(sdist) as tf, tempfile.TemporaryDirectory() as d:
        for name, spec in CASES.items():
            member = f"llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-{name}.gguf"
            path = os.path.join(d, f"{name}.gguf")
            with open(path, "wb") as f:
                f.write(tf.extractfile(member).read())
            tok, cfg = build(path, spec)
            import gguf
            want = gguf.GGUFReader(path).fields["tokenizer.ggml.pre"].contents()
            check(name, tok, cfg, want)
            raw = json.dumps(tok, ensure_ascii=False, indent=2).encode()
            buf = io.BytesIO()
            with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0, filename="") as g:
                g.write(raw)
            with open(os.path.join(OUT, f"{name}.tokenizer.json.gz"), "wb") as f:
                f.write(buf.getvalue())
            with open(os.path.join(OUT, f"{name}.tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump(cfg, f, ensure_ascii=False, indent=2)
                f.write("\n")
            print(f"{name}: {len(raw)} bytes, {len(buf.getvalue())} gzipped")


if __name__ == "__main__":
    main()
