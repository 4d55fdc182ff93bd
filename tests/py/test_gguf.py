"""The GGUF view (--format gguf) against llama.cpp's own converter and quantizer.

For each fixture (tests/fixtures/gguf/: Llama, tied Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Qwen2-MoE, saved by verl's FSDP2
manager with a SentencePiece tokenizer; chat templates in tokenizer_config.json or chat_template.jinja), `ckfs export` writes the Hugging Face folder, the unmodified
convert_hf_to_gguf.py of the llama-cpp-python 0.3.36 source package converts it, and ckfs's
model.gguf (from `export --format gguf` and from a mount) must be the same bytes. q4_0, which the
converter does not write, is checked tensor by tensor against gguf-py's quantizer. The converter
runs in its own venv (tests/gguf/setup-gguf-venv.sh); without it these tests FAIL, saying so.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO, ckfs_bin, run_ckfs

CASES = ["llama_fsdp2_w2", "qwen2_fsdp2_w2", "llama_tied_fsdp2_w2", "mistral_fsdp2_w2", "qwen3_fsdp2_w2"]
# The MoE actors (tests/gen/make_gguf_moe_fixtures.py): the converter reads their tokenizer as BPE only,
# so both sides take the SentencePiece path by a test switch (tests/gguf/convert_spm.py,
# CKFS_GGUF_TEST_MOE_SPM); the experts, router, shared expert and key-values are the converter's own.
MOE_CASES = ["qwen3_moe_fsdp2_w2", "qwen2_moe_fsdp2_w2"]
MOE_SPM = "CKFS_GGUF_TEST_MOE_SPM"
OUTTYPES = {"bf16": "bf16", "f16": "fp16", "q8_0": "q8_0"}  # converter's --outtype: ckfs's --dtype
CACHE = Path(os.environ.get("CKFS_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ckfs"))
VENV = Path(os.environ.get("CKFS_GGUF_VENV", CACHE / "gguf-venv"))
EXPECTED = FIXTURES / "gguf" / "expected.json"


@pytest.fixture(autouse=True)
def moe_spm(request, monkeypatch):
    """ckfs takes the MoE cases' SentencePiece path as the converter wrapper does."""
    case = request.node.callspec.params.get("case") if hasattr(request.node, "callspec") else None
    if case in MOE_CASES:
        monkeypatch.setenv(MOE_SPM, "1")


def oracle_python() -> str:
    py = VENV / "bin" / "python"
    if not (py.exists() and (VENV / "llama.cpp" / "convert_hf_to_gguf.py").exists()):
        pytest.fail(f"the GGUF oracle venv is missing ({VENV}): run tests/gguf/setup-gguf-venv.sh",
                    pytrace=False)
    return str(py)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(case, outtype) -> the converter's file, made once per session."""
    root = tmp_path_factory.mktemp("gguf-oracle")
    made = {}

    def get(case, outtype):
        if (case, outtype) not in made:
            hf = root / case
            if not hf.exists():
                run_ckfs("export", "-q", FIXTURES / "gguf" / case, hf)
            out = root / f"{case}-{outtype}.gguf"
            script = REPO / "tests" / "gguf" / "convert_spm.py" if case in MOE_CASES else \
                VENV / "llama.cpp" / "convert_hf_to_gguf.py"
            r = subprocess.run([oracle_python(), script, hf,
                                "--outtype", outtype, "--outfile", out, "--model-name", "tiny"],
                               capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, r.stderr[-3000:]
            made[(case, outtype)] = out
        return made[(case, outtype)]

    return get


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("outtype", list(OUTTYPES))
@pytest.mark.parametrize("case", CASES + MOE_CASES)
def test_export_byte_identical(case, outtype, converted, tmp_path):
    ref = converted(case, outtype)
    run_ckfs("export", "-q", "--format", "gguf", "--dtype", OUTTYPES[outtype], "--model-name", "tiny",
             FIXTURES / "gguf" / case, tmp_path / "out")
    assert sorted(os.listdir(tmp_path / "out")) == ["model.gguf"]
    got = (tmp_path / "out" / "model.gguf").read_bytes()
    want = ref.read_bytes()
    assert len(got) == len(want)
    assert got == want, f"first difference at byte {next(i for i in range(len(got)) if got[i] != want[i])}"
    # the C tier (tests/cli/test_gguf.sh) checks the same files by these hashes; after a fixture
    # is regenerated, CKFS_GGUF_RECORD=1 records the converter's new ones
    expected = json.loads(EXPECTED.read_text())
    if os.environ.get("CKFS_GGUF_RECORD") == "1":
        expected[f"{case}/{outtype}"] = sha256(ref)
        EXPECTED.write_text(json.dumps(expected, indent=2) + "\n")
    assert expected.get(f"{case}/{outtype}") == sha256(ref), "tests/fixtures/gguf/expected.json"


@pytest.mark.parametrize("case,outtype", [("llama_fsdp2_w2", "q8_0"), ("qwen3_fsdp2_w2", "bf16"),
                                          ("qwen3_moe_fsdp2_w2", "q8_0"), ("qwen2_moe_fsdp2_w2", "f16")])
def test_mount_byte_identical(case, outtype, converted, tmp_path):
    """The mount's model.gguf: whole, and read in random small ranges (rows, blocks and padding
    cut anywhere)."""
    want = converted(case, outtype).read_bytes()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run_ckfs("mount", "--format", "gguf", "--dtype", OUTTYPES[outtype], "--model-name", "tiny",
             FIXTURES / "gguf" / case, mnt)
    try:
        assert sorted(os.listdir(mnt)) == ["model.gguf"]
        assert (mnt / "model.gguf").read_bytes() == want
        rng = random.Random(27)
        with open(mnt / "model.gguf", "rb", buffering=0) as f:
            for _ in range(200):
                off = rng.randrange(len(want))
                n = rng.randrange(1, 300)
                os.lseek(f.fileno(), off, os.SEEK_SET)
                assert os.pread(f.fileno(), n, off) == want[off:off + n], (off, n)
    finally:
        subprocess.run([ckfs_bin(), "umount", "-z", str(mnt)], capture_output=True, timeout=60)


@pytest.mark.parametrize("case", CASES + MOE_CASES)
def test_q4_0_matches_gguf_py(case, converted, tmp_path):
    """q4_0: every tensor is gguf.quants.quantize of the exported folder's values (the converter's
    bf16 file holds them exactly), with the types docs/gguf.md gives; and the checker can fail: a
    q8_0 file is not taken for q4_0."""
    ref = converted(case, "bf16")
    run_ckfs("export", "-q", "--format", "gguf", "--dtype", "q4_0", "--model-name", "tiny",
             FIXTURES / "gguf" / case, tmp_path / "q4")
    check = [oracle_python(), REPO / "tests" / "gguf" / "q4_0_check.py", ref]
    r = subprocess.run(check + [tmp_path / "q4" / "model.gguf"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Q4_0  bit-exact" in r.stdout
    r = subprocess.run(check + [converted(case, "q8_0")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "DIFFERS" in r.stdout


def refused(src, *opts):
    r = run_ckfs("export", "--format", "gguf", *opts, src, Path(src).parent / "never", check=False)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def copy_case(tmp_path, case="llama_fsdp2_w2") -> Path:
    import shutil

    d = tmp_path / "src"
    shutil.copytree(FIXTURES / "gguf" / case, d)
    return d


def test_refusals(tmp_path):
    """What ckfs does not reproduce is refused with one line naming it; hostile tokenizer files
    never crash it."""
    d = copy_case(tmp_path)
    hf = d / "huggingface"
    model = (hf / "tokenizer.model").read_bytes()
    for name, data in [("truncated", model[: len(model) // 2]), ("garbage", os.urandom(4096)),
                       ("empty", b""), ("huge varint", b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"),
                       ("bad type", b"\x0a\x05\x0a\x01a\x18\x09")]:
        (hf / "tokenizer.model").write_bytes(data)
        line = refused(d)
        assert "tokenizer.model" in line, (name, line)
    (hf / "tokenizer.model").write_bytes(model)
    (hf / "tokenizer.json").write_text("{}")
    assert "tokenizer.json" in refused(d)
    (hf / "tokenizer.json").unlink()
    cfg = json.loads((hf / "config.json").read_text())
    for key, value, word in [("architectures", ["GPT2LMHeadModel"], "architecture"),
                             ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}, "rope"),
                             ("num_local_experts", 8, "num_local_experts")]:
        (hf / "config.json").write_text(json.dumps(dict(cfg, **{key: value})))
        assert word in refused(d)
    (hf / "config.json").write_text(json.dumps(cfg))
    (hf / "tokenizer.model").unlink()
    assert "tokenizer.model" in refused(d)
    # options
    for opts, word in [(["--dtype", "fp8"], "--dtype"), (["--max-shard-size", "1MB"], "--max-shard-size")]:
        r = run_ckfs("export", "--format", "gguf", *opts, FIXTURES / "gguf" / "llama_fsdp2_w2",
                     tmp_path / "x", check=False)
        assert r.returncode == 2 and word in r.stderr, r.stderr
    r = run_ckfs("export", "--dtype", "q8_0", FIXTURES / "gguf" / "llama_fsdp2_w2", tmp_path / "x", check=False)
    assert r.returncode == 2 and "--format gguf" in r.stderr
    r = run_ckfs("inspect", "--dtype", "q4_0", FIXTURES / "gguf" / "llama_fsdp2_w2", check=False)
    assert r.returncode == 2 and "GGUF" in r.stderr


def test_moe_refusals(tmp_path, monkeypatch):
    """MoE: every architecture but Qwen2-MoE, Qwen3-MoE and DeepSeek-V3 refused by name; what
    llama.cpp would run otherwise than transformers (norm_topk_prob, dense layers, DeepSeek-V3
    without scoring_func: test_gguf_deepseek2.py) and incomplete experts refused in one line; without
    the test switch, the BPE-only tokenizer path."""
    import shutil

    from safetensors.torch import load_file, save_file

    moe = FIXTURES / "moe_fsdp"
    for case in ["mixtral_fsdp2_w2", "olmoe_fsdp2_w2", "qwen3_next_fsdp2_w2", "glm4_moe_fsdp2_w2"]:
        arch = json.loads((moe / case / "huggingface" / "config.json").read_text())["architectures"][0]
        assert f"architecture {arch}" in refused(moe / case)
    # served, but transformers' config.json has no scoring_func: llama.cpp would route by softmax
    assert "scoring_func missing" in refused(moe / "deepseek_v3_fsdp2_w2")
    assert "tokenizer from tokenizer.json (byte-level BPE) only" in refused(FIXTURES / "gguf" / "qwen3_moe_fsdp2_w2")
    monkeypatch.setenv(MOE_SPM, "1")
    assert "norm_topk_prob false" in refused(moe / "qwen3_moe_fsdp2_w2")  # as verl's test model has it
    for case, key, value, word in [
            ("qwen3_moe_fsdp2_w2", "decoder_sparse_step", 2, "decoder_sparse_step"),
            ("qwen3_moe_fsdp2_w2", "mlp_only_layers", [0], "mlp_only_layers"),
            ("qwen3_moe_fsdp2_w2", "moe_intermediate_size", None, "moe_intermediate_size is missing"),
            ("qwen2_moe_fsdp2_w2", "norm_topk_prob", True, "norm_topk_prob true"),
            ("qwen2_moe_fsdp2_w2", "shared_expert_intermediate_size", None, "shared_expert_intermediate_size"),
            ("qwen2_moe_fsdp2_w2", "n_group", 1, "key n_group")]:
        d = tmp_path / f"{case}-{key}"
        shutil.copytree(FIXTURES / "gguf" / case, d)
        cfg_path = d / "huggingface" / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg[key] = value
        cfg_path.write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
        assert word in refused(d), (case, key)
    # one expert's weight missing from a Hugging Face folder
    hf = tmp_path / "hf"
    run_ckfs("export", "-q", FIXTURES / "gguf" / "qwen3_moe_fsdp2_w2", hf)
    sd = {k: v.clone() for k, v in load_file(hf / "model.safetensors").items()}  # not the mapped file's
    name = "model.layers.1.mlp.experts.2.up_proj.weight"
    up = sd.pop(name)
    save_file(sd, hf / "model.safetensors", metadata={"format": "pt"})
    assert "layer 1 has 8 of its 9 expert weights" in refused(hf)
    # and of another shape than expert 0's
    sd[name] = up[: up.shape[0] // 2].contiguous()
    save_file(sd, hf / "model.safetensors", metadata={"format": "pt"})
    assert f"tensor {name}: not the 2-D shape of its layer's expert 0" in refused(hf)


RUNTIME = Path(os.environ.get("CKFS_GGUF_RUNTIME_VENV", CACHE / "gguf-runtime-venv"))


@pytest.mark.parametrize("case,outtype", [("llama_fsdp2_w2", "q8_0"), ("qwen2_fsdp2_w2", "bf16"),
                                          ("qwen3_fsdp2_w2", "f16")])
def test_llama_cpp_generates_from_mount(case, outtype, converted, tmp_path):
    """llama.cpp itself (llama-cpp-python 0.3.36, built from source) loads the mount's model.gguf and
    greedy-decodes the same tokens as from the converter's file. Building the runtime compiles
    llama.cpp (tests/gguf/setup-gguf-venv.sh --runtime, 13 minutes on 2 busy CPUs): without it this FAILS,
    unless CKFS_GGUF_NO_RUNTIME=1 says to skip it (reported as skipped, never as passed)."""
    ref = converted(case, outtype)
    same_generation(ref, FIXTURES / "gguf" / case, outtype, tmp_path)


def runtime_python() -> Path:
    py = RUNTIME / "bin" / "python"
    if not (RUNTIME / ".ckfs-stamp").exists():  # (written once the build has finished)
        if os.environ.get("CKFS_GGUF_NO_RUNTIME") == "1":
            pytest.skip(f"llama.cpp runtime venv missing ({RUNTIME}); CKFS_GGUF_NO_RUNTIME=1")
        pytest.fail(f"the llama.cpp runtime venv is missing ({RUNTIME}): run "
                    "tests/gguf/setup-gguf-venv.sh --runtime, or set CKFS_GGUF_NO_RUNTIME=1", pytrace=False)
    return py


def same_generation(ref, src, outtype, tmp_path):
    """llama.cpp decodes the same 24 tokens from src's mounted model.gguf as from ref."""
    py = runtime_python()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run_ckfs("mount", "--format", "gguf", "--dtype", OUTTYPES[outtype], "--model-name", "tiny", src, mnt)
    try:
        r = subprocess.run([str(py), REPO / "tests" / "gguf" / "generate.py", ref, mnt / "model.gguf"],
                           capture_output=True, text=True, timeout=600)
    finally:
        subprocess.run([ckfs_bin(), "umount", "-z", str(mnt)], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = (json.loads(line) for line in r.stdout.strip().splitlines())
    assert len(a["tokens"]) == 24, a
    assert a["tokens"] == b["tokens"], (a, b)


def test_nan_and_inf_blocks_match_llama_cpp(converted, tmp_path):
    """Poisoned weights (NaN of both signs, +-Inf in a block, a whole block NaN) give the bytes
    llama.cpp's converter and gguf-py's quantizer write: numpy's max propagates NaN, so a Q8_0 or
    Q4_0 block with a NaN gets a NaN scale (f16 0x7e00) and zero quants; with an Inf, an Inf scale.
    ckfs once skipped the NaN (finite scale, the NaN gone) and cast NaN to an integer."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    hf = tmp_path / "hf"
    run_ckfs("export", "-q", FIXTURES / "gguf" / "llama_fsdp2_w2", hf)
    shutil.copytree(hf, tmp_path / "poisoned")
    path = tmp_path / "poisoned" / "model.safetensors"
    sd = load_file(path)
    name = next(k for k in sorted(sd) if k.endswith("mlp.down_proj.weight"))
    w = sd[name].clone()
    w[0, 3] = float("nan")
    w[1, 40] = -float("nan")
    w[2, 0] = float("inf")
    w[3, 5] = -float("inf")
    w[4, 0:32] = float("nan")
    sd[name] = w
    save_file(sd, path, metadata={"format": "pt"})
    def convert(outtype):
        out = tmp_path / f"oracle-{outtype}.gguf"
        r = subprocess.run([oracle_python(), VENV / "llama.cpp" / "convert_hf_to_gguf.py", tmp_path / "poisoned",
                            "--outtype", outtype, "--outfile", out, "--model-name", "tiny"],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return out

    oracle = convert("q8_0")
    run_ckfs("export", "-q", "--format", "gguf", "--dtype", "q8_0", "--model-name", "tiny",
             tmp_path / "poisoned", tmp_path / "q8")
    assert (tmp_path / "q8" / "model.gguf").read_bytes() == oracle.read_bytes()
    # q4_0 against gguf-py's quantizer, on the poisoned values (the bf16 conversion holds them)
    ref = convert("bf16")
    run_ckfs("export", "-q", "--format", "gguf", "--dtype", "q4_0", "--model-name", "tiny",
             tmp_path / "poisoned", tmp_path / "q4")
    r = subprocess.run([oracle_python(), REPO / "tests" / "gguf" / "q4_0_check.py", ref,
                        tmp_path / "q4" / "model.gguf"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Q4_0  bit-exact" in r.stdout, r.stdout + r.stderr
    assert torch.isnan(w).any()


@pytest.mark.parametrize("case", ["qwen3_moe", "qwen2_moe"])
def test_llama_cpp_runs_moe_from_mount(case, tmp_path, monkeypatch):
    """llama.cpp runs a Qwen MoE from the mount: the fixtures' 53 pieces hold no byte tokens, which
    llama.cpp's SentencePiece vocabulary needs, so a 320-token model is made here by transformers
    (hidden 64, expert width 32: every stack Q8_0; Qwen3-MoE with 8 experts, Qwen2-MoE 4 and a shared
    expert), seeded, with the fixtures' tokenizer; export and converter byte for byte in q8_0, then
    the same greedy tokens from the mount's file as from the converter's."""
    import torch
    import transformers

    monkeypatch.setenv(MOE_SPM, "1")
    torch.manual_seed(39)
    dims = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, moe_intermediate_size=32,
                num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if case == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(head_dim=16, num_experts=8, norm_topk_prob=True, **dims)
        config.architectures = ["Qwen3MoeForCausalLM"]
    else:
        config = transformers.Qwen2MoeConfig(num_experts=4, shared_expert_intermediate_size=64, **dims)
        config.architectures = ["Qwen2MoeForCausalLM"]
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.05 * torch.randn_like(p))
    hf = tmp_path / case
    model.to(torch.bfloat16).save_pretrained(hf)
    src = FIXTURES / "gguf" / "qwen3_moe_fsdp2_w2" / "huggingface"
    for f in ["tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"]:
        (hf / f).write_bytes((src / f).read_bytes())
    ref = tmp_path / "ref.gguf"
    r = subprocess.run([oracle_python(), REPO / "tests" / "gguf" / "convert_spm.py", hf, "--outtype", "q8_0",
                        "--outfile", ref, "--model-name", "tiny"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run_ckfs("export", "-q", "--format", "gguf", "--dtype", "q8_0", "--model-name", "tiny", hf, tmp_path / "out")
    assert (tmp_path / "out" / "model.gguf").read_bytes() == ref.read_bytes()
    same_generation(ref, hf, "q8_0", tmp_path)
