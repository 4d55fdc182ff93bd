"""deepseek2 (DeepSeek-V3's multi-head latent attention and MoE) against llama.cpp's own converter.

The fixture is a real FSDP2 checkpoint of a tiny DeepseekV3ForCausalLM (tests/fixtures/moe_fsdp/
deepseek_v3_fsdp2_w2: q_lora_rank 16, kv_lora_rank 16, 4 heads, one dense layer then 4 routed experts
and a shared expert, e_score_correction_bias). `ckfs export` writes its Hugging Face folder, the real
Qwen2 tokenizer is grafted on as test_gguf_bpe does (DeepseekV2Model.set_vocab takes the GPT-2 path
for any tokenizer the converter recognizes), and config.json gets DeepSeek-V3's own scoring_func
"sigmoid" and topk_method "noaux_tc" (which transformers' DeepseekV3 runs whatever they say: without
scoring_func llama.cpp would route by softmax, so ckfs refuses that). The unmodified converter's file
and ckfs's (export and mount) must be the same bytes: kv_b_proj split per head into attn_k_b (each
head's key rows transposed, read strided) and attn_v_b, head_count_kv 1, the MLA key-values.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO, ckfs_bin, run_ckfs
from test_gguf import VENV, oracle_python, refused, same_generation
from test_gguf_bpe import assert_mount_q8_0, convert, graft_tokenizer

CASE = FIXTURES / "moe_fsdp" / "deepseek_v3_fsdp2_w2"
# q_proj without q LoRA (DeepSeek-V2-Lite's shape); key and value heads of 32: attn_k_b and attn_v_b
# rows of whole q8_0 blocks, so the strided read is checked quantized too
QPROJ = FIXTURES / "moe_fsdp" / "deepseek_v3_qproj_fsdp2_w2"
# converter's --outtype: ckfs's --dtype
OUTTYPES = {"bf16": "bf16", "f16": "fp16", "q8_0": "q8_0"}
# DeepSeek-V3's config.json has them; transformers' DeepseekV3Config keeps them as given
V3_ROUTING = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}


def folder(root: Path, name: str = "ds", case: Path = CASE, **change) -> Path:
    """The case's exported folder with the Qwen2 tokenizer and config.json changed (None: removed)."""
    hf = root / name
    run_ckfs("export", "-q", case, hf)
    graft_tokenizer(hf, "qwen2")
    cfg = dict(json.loads((hf / "config.json").read_text()), **V3_ROUTING, **change)
    (hf / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k not in change or v is not None},
                                               indent=2))
    return hf


def converted(hf: Path, outtype: str, root: Path) -> Path:
    out = root / f"{hf.name}-{outtype}.gguf"
    r = convert(hf, outtype, out)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def export(hf: Path, dtype: str, out: Path) -> bytes:
    run_ckfs("export", "-q", "--format", "gguf", "--dtype", dtype, "--model-name", "tiny", hf, out)
    return (out / "model.gguf").read_bytes()


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-ds2")
    hf = folder(root)
    return hf, {t: converted(hf, t, root) for t in OUTTYPES}


@pytest.mark.parametrize("outtype", list(OUTTYPES))
def test_deepseek2_byte_identical(outtype, deepseek, tmp_path):
    hf, refs = deepseek
    got, want = export(hf, OUTTYPES[outtype], tmp_path / "out"), refs[outtype].read_bytes()
    assert len(got) == len(want)
    assert got == want, f"first difference at byte {next(i for i in range(len(got)) if got[i] != want[i])}"


@pytest.fixture(scope="module")
def qproj(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-ds2-qproj")
    hf = folder(root, "qproj", QPROJ)
    return hf, {t: converted(hf, t, root) for t in OUTTYPES}


def tensor_ranges(path: Path) -> dict:
    """name -> (offset in the file, bytes) of path's tensors, by gguf-py."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import gguf; print(json.dumps({t.name: "
            "[int(t.data_offset), int(t.n_bytes), t.tensor_type.name] for t in gguf.GGUFReader(sys.argv[2]).tensors}))")
    r = subprocess.run([oracle_python(), "-c", code, VENV / "llama.cpp" / "gguf-py", path], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_deepseek2_qproj_byte_identical(qproj, tmp_path):
    """The q_proj fixture: attn_q, no q_lora_rank key; bf16, f16, q8_0 (attn_k_b and attn_v_b as
    Q8_0 blocks, not the f16 fallback) export, a q8_0 mount, and q4_0 (Q4_0 blocks) against gguf-py."""
    hf, refs = qproj
    assert json.loads((hf / "config.json").read_text())["q_lora_rank"] is None
    for outtype in OUTTYPES:
        assert export(hf, OUTTYPES[outtype], tmp_path / outtype) == refs[outtype].read_bytes(), outtype
    assert_mount_q8_0(hf, refs["q8_0"], tmp_path)
    types = {k: v[2] for k, v in tensor_ranges(refs["q8_0"]).items()}
    assert types["blk.0.attn_k_b.weight"] == types["blk.0.attn_v_b.weight"] == "Q8_0", types
    assert "blk.0.attn_q.weight" in types and "blk.0.attn_q_a.weight" not in types
    export(hf, "q4_0", tmp_path / "q4_0")
    r = subprocess.run([oracle_python(), REPO / "tests" / "gguf" / "q4_0_check.py", refs["bf16"],
                        tmp_path / "q4_0" / "model.gguf"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_deepseek2_split_ranges_from_mount(qproj, tmp_path):
    """The split tensors read from a q8_0 mount in random small ranges (a row, a block, a head cut
    anywhere): the strided attn_k_b and the row-mapped attn_v_b serve any range as the whole file."""
    hf, refs = qproj
    want = refs["q8_0"].read_bytes()
    spans = [v[:2] for k, v in tensor_ranges(refs["q8_0"]).items() if "attn_k_b" in k or "attn_v_b" in k]
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run_ckfs("mount", "--format", "gguf", "--dtype", "q8_0", "--model-name", "tiny", hf, mnt)
    try:
        rng = random.Random(36)
        with open(mnt / "model.gguf", "rb", buffering=0) as f:
            for _ in range(300):
                start, size = rng.choice(spans)
                off = start + rng.randrange(size)
                n = rng.randrange(1, 200)
                assert os.pread(f.fileno(), n, off) == want[off:off + n], (off, n)
    finally:
        subprocess.run([ckfs_bin(), "umount", "-z", str(mnt)], capture_output=True, timeout=60)


def test_deepseek2_mount_byte_identical(deepseek, tmp_path):
    hf, refs = deepseek
    assert_mount_q8_0(hf, refs["q8_0"], tmp_path)


def test_deepseek2_q4_0_matches_gguf_py(deepseek, tmp_path):
    """q4_0 (which the converter does not write): every tensor, the split ones included, is gguf-py's
    quantizer of the bf16 file's values, by docs/gguf.md's type rule."""
    hf, refs = deepseek
    export(hf, "q4_0", tmp_path / "out")
    r = subprocess.run([oracle_python(), REPO / "tests" / "gguf" / "q4_0_check.py", refs["bf16"],
                        tmp_path / "out" / "model.gguf"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


# DeepSeek-V3's own YaRN (its config.json's rope_scaling, as transformers 5 writes it), with a
# 32-position original context for the fixture's 128
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 32,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


@pytest.mark.parametrize("change", [{"num_hidden_layers": 1}, {"tie_word_embeddings": True},
                                    {"rope_parameters": YARN}], ids=["mtp", "tied", "yarn"])
def test_deepseek2_variants(change, tmp_path):
    """What the converter drops, ckfs drops: layers past num_hidden_layers (here layer 1, the MoE
    one, read as an MTP layer) and, when tie_word_embeddings, lm_head (token_embd then serves).
    YaRN: TextModel's rope scaling keys and DeepseekV2Model's log multiplier (0.1 * mscale_all_dim)."""
    hf = folder(tmp_path, **change)
    ref = converted(hf, "bf16", tmp_path)
    assert export(hf, "bf16", tmp_path / "out") == ref.read_bytes()


def test_llama_cpp_generates_from_deepseek2_mount(deepseek, tmp_path):
    """llama.cpp loads the mounted q8_0 deepseek2 file (MLA, experts, exp_probs_b, sigmoid gating)
    and greedy-decodes the same 24 tokens as from the converter's (test_gguf.same_generation)."""
    hf, refs = deepseek
    same_generation(refs["q8_0"], hf, "q8_0", tmp_path)


def test_deepseek2_refusals(deepseek, tmp_path):
    """One line each, naming config.json: what llama.cpp would run otherwise than transformers,
    keys whose transformers default the converter would write, the V2-Lite shape (not served),
    a kv_b_proj whose rows are not num_key_value_heads heads (the converter's assertion too), and
    the other DeepSeek architectures the converter's class takes."""
    hf, _ = deepseek
    cfg = json.loads((hf / "config.json").read_text())
    d = tmp_path / "src"
    shutil.copytree(hf, d)
    for change, word in [(dict(scoring_func=None), "scoring_func missing"),
                         (dict(scoring_func="softmax"), "scoring_func other than sigmoid"),
                         (dict(rope_interleave=False), "rope_interleave false"),
                         (dict(q_lora_rank=None), "q_lora_rank is missing"),
                         (dict(kv_lora_rank=None), "kv_lora_rank is missing"),
                         (dict(n_group=None), "n_group is missing"),
                         (dict(topk_group=2), "topk_group is out of range"),
                         (dict(routed_scaling_factor=None), "routed_scaling_factor is missing"),
                         (dict(num_key_value_heads=2), "not 2 heads of 12 rows"),
                         (dict(num_experts=4), "key num_experts"),
                         (dict(rope_parameters=dict(YARN, mscale=0.5)), "YaRN mscale other than mscale_all_dim"),
                         (dict(rope_parameters={k: v for k, v in YARN.items() if k != "mscale"}),
                          "YaRN mscale other than mscale_all_dim"),
                         (dict(rope_parameters=dict(YARN, truncate=False)), "YaRN parameter the converter"),
                         (dict(rope_parameters=dict(YARN, rope_type="longrope")), "rope scaling other than"),
                         (dict(architectures=["DeepseekV2ForCausalLM"]), "architecture DeepseekV2ForCausalLM")]:
        c = dict(cfg, **change)
        (d / "config.json").write_text(json.dumps({k: v for k, v in c.items() if v is not None}))
        line = refused(d)
        assert word in line, (change, line)
        assert "config.json" in line or "kv_b_proj" in line, line
    c = dict(cfg, num_key_value_heads=2)
    (d / "config.json").write_text(json.dumps(c))
    r = convert(d, "bf16", tmp_path / "never.gguf")
    assert r.returncode != 0 and "AssertionError" in r.stderr
