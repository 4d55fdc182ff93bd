#!/usr/bin/env python3
"""Generate the GGUF view's checkpoints (tests/fixtures/gguf/): tiny models with a SentencePiece
tokenizer, saved as verl saves an FSDP2 actor.

llama.cpp's converter identifies BPE tokenizers by a hash of their output, so the toy tokenizers
of the other fixtures are refused by it; a SentencePiece tokenizer.model takes its SentencePiece
path without that check. The model is trained here, offline, by the real `sentencepiece` package
(in the GGUF oracle venv, tests/gguf/setup-gguf-venv.sh), on a small fixed text, one thread
(deterministic). The weights are built by real transformers and sharded by real FSDP2 through
verl's own FSDPCheckpointManager (make_fixtures.py's workers), in the main venv:

    tests/gguf/setup-gguf-venv.sh
    ~/.cache/ckfs/venv/bin/python tests/gen/make_gguf_fixtures.py       # ~40 s
    ~/.cache/ckfs/venv/bin/python tests/gen/make_gguf_fixtures.py qwen3_fsdp2_w2   # one case

Outputs: tests/fixtures/gguf/<case>/ (the checkpoint, huggingface/ holding config.json,
generation_config.json, tokenizer.model, tokenizer_config.json, special_tokens_map.json) and
tests/fixtures/gguf/tokenizer.model. The expected GGUF files are not written here: tests/py/test_gguf.py
runs the converter on `ckfs export`'s folder and records their sha256 (tests/fixtures/gguf/expected.json).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

os.environ["CKFS_GEN_REEXEC"] = "1"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(REPO, "tests", "fixtures", "gguf")
sys.path.insert(0, HERE)
CACHE = os.environ.get("CKFS_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ckfs")
GGUF_PYTHON = os.environ.get("CKFS_GGUF_PYTHON", os.path.join(CACHE, "gguf-venv", "bin", "python"))

SP_VOCAB = 320
# Rows of 64 and 128 values: multiples of the 32-value blocks of Q8_0 and Q4_0. Head dim 16 with
# 4 query heads and 2 KV heads exercises the converter's Q/K permutation on both.
SHAPE = dict(vocab_size=SP_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
# (name, architecture, tied, what the tokenizer files add: None, a chat template in
# tokenizer_config.json ("config", as transformers 4 saves it) or in chat_template.jinja ("jinja", as
# transformers 5 saves it), or "decoder": tokenizer_config.json's added_tokens_decoder as LlamaTokenizer
# writes it for its special tokens, plus the two user-defined ones and one plain added token over
# the last piece (which the converter replaces, its U+2581 made spaces))
CASES = [("llama_fsdp2_w2", "llama", False, None), ("qwen2_fsdp2_w2", "qwen2", False, "config"),
         ("llama_tied_fsdp2_w2", "llama", True, "jinja"), ("mistral_fsdp2_w2", "mistral", False, "decoder"),
         ("qwen3_fsdp2_w2", "qwen3", False, "jinja")]
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
                 "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")
MODEL_CLASS = dict(llama="LlamaForCausalLM", qwen2="Qwen2ForCausalLM", mistral="MistralForCausalLM",
                   qwen3="Qwen3ForCausalLM")

TEXT = """the model is good. hello world! a checkpoint is a merge of shards.
verl saves one shard per rank; a mount shows the merged model as a folder.
llama.cpp loads gguf files: a header, key-values, tensor infos and aligned data.
tensors are converted on read, block by block, with bounded memory.
"""

TRAIN_SP = r"""
import sys, sentencepiece as spm
text, prefix, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
spm.SentencePieceTrainer.train(input=text, model_prefix=prefix, vocab_size=vocab, model_type="unigram",
    character_coverage=1.0, num_threads=1, byte_fallback=True, hard_vocab_limit=False,
    user_defined_symbols=["<|im_start|>", "<|im_end|>"], minloglevel=2)
"""


def train_tokenizer(tmp):
    # relative paths: the model records its trainer's input and prefix, so these must not
    # carry the temporary folder's random name (the file is byte-reproducible this way)
    with open(os.path.join(tmp, "text.txt"), "w") as f:
        f.write(TEXT * 4)
    subprocess.run([GGUF_PYTHON, "-c", TRAIN_SP, "text.txt", "sp", str(SP_VOCAB)], check=True, cwd=tmp)
    return os.path.join(tmp, "sp.model")


class SentencePieceFiles:
    """What LlamaTokenizer.save_pretrained writes for this model, without needing sentencepiece in
    the main venv: the model file itself and the two JSON files naming its special tokens."""

    def __init__(self, model, chat=None):
        self.model = model
        self.chat = chat

    def save_pretrained(self, d):
        shutil.copyfile(self.model, os.path.join(d, "tokenizer.model"))
        special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
        with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
            json.dump(special, f, indent=2)
        config = dict(special, add_bos_token=True, add_eos_token=False, model_max_length=128,
                      tokenizer_class="LlamaTokenizer", clean_up_tokenization_spaces=False, legacy=True)
        if self.chat == "decoder":
            entry = dict(lstrip=False, normalized=False, rstrip=False, single_word=False)
            config["added_tokens_decoder"] = {
                "0": dict(entry, content="<unk>", special=True), "1": dict(entry, content="<s>", special=True),
                "2": dict(entry, content="</s>", special=True),
                "3": dict(entry, content="<|im_start|>", special=False),
                "4": dict(entry, content="<|im_end|>", special=False),
                str(SP_VOCAB - 1): dict(entry, content="\u2581hello\u2581world", normalized=True, special=False)}
        if self.chat == "config":
            config["chat_template"] = CHAT_TEMPLATE
        elif self.chat == "jinja":
            with open(os.path.join(d, "chat_template.jinja"), "w") as f:
                f.write(CHAT_TEMPLATE)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(config, f, indent=2)


def hf_config(mf_hf_config):
    """make_fixtures.hf_config knows Llama and Qwen2; Mistral and Qwen3 the same way, by their own
    transformers config classes (Qwen3 with head_dim given: its class's default is 128)."""

    def make(spec):
        from transformers import MistralConfig, Qwen3Config

        m = dict(spec["model"])
        arch = m.pop("arch")
        if arch not in ("mistral", "qwen3"):
            return mf_hf_config(spec)
        cls, extra = (MistralConfig, dict(sliding_window=None)) if arch == "mistral" else \
            (Qwen3Config, dict(head_dim=m["hidden_size"] // m["num_attention_heads"], use_sliding_window=False))
        c = cls(max_position_embeddings=128, tie_word_embeddings=spec["tied"], bos_token_id=1, eos_token_id=2,
                pad_token_id=0, rms_norm_eps=1e-6, rope_theta=10000.0, **extra, **m)
        c.architectures = [spec["model_class"]]
        return c

    return make


def main():
    import make_fixtures as mf

    mf.SPECIAL_F32_BITS = []  # no planted edge values: the weights should generate sensibly
    os.makedirs(OUT, exist_ok=True)
    tmp_root = tempfile.mkdtemp(prefix="ckfs-gguf-fixtures-")
    try:
        sp = train_tokenizer(tmp_root)
        shutil.copyfile(sp, os.path.join(OUT, "tokenizer.model"))
        mf.hf_config = hf_config(mf.hf_config)
        import verl.utils.tokenizer as vt
        only = sys.argv[1:]
        for name, arch, tied, chat in CASES:
            if only and name not in only:
                continue
            mf.build_tokenizer = lambda: SentencePieceFiles(sp, chat)
            # verl's manager saves the tokenizer it was given into huggingface/; loading this one
            # through transformers needs sentencepiece, which the main venv lacks (the forked
            # ranks inherit this stand-in, which writes the same files).
            vt.hf_tokenizer = lambda path, **kw: SentencePieceFiles(sp, chat)
            spec = mf.cfg(name, dict(SHAPE, arch=arch), 2, 2, tied=tied, model_class=MODEL_CLASS[arch],
                          desc=f"{arch} FSDP2 W=2 with a SentencePiece tokenizer (GGUF view)")
            ckpt = os.path.join(OUT, name)
            shutil.rmtree(ckpt, ignore_errors=True)
            tmp = os.path.join(tmp_root, name)
            srcdir = os.path.join(tmp, "src")
            os.makedirs(srcdir)
            mf.prepare_source(spec, srcdir)
            mf.run_ranks(spec, srcdir, ckpt, tmp)
            mf.log(f"[{name}] written")
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)


if __name__ == "__main__":
    main()
