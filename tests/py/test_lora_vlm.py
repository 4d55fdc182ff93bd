"""LoRA actors, vision-language models and fused-expert LLMs saved by verl 0.9.1's own engine
(tests/gen/make_lora_vlm_fixtures.py), through a real mount, against verl's real merger output
(tests/fixtures/expected_{lora,vlm,moe}/) and peft's merge_and_unload:

- the files verl writes are served byte for byte (weights, adapter weights, side files), and the
  rendered ones load to what verl's load to: config.json through transformers, adapter_config.json
  through peft's LoraConfig (target_modules as a set: verl lists a Python set);
- vision-language models load with AutoModelForImageTextToText, no key missing or unexpected;
- --lora=fuse equals merge_and_unload: fp32 bit for bit, bf16 the same, and the logits of the fused
  mount equal those of peft's merged model;
- an adapter saved alone is served as the adapter folder peft loads; with --base, as a model.

The C tier checks the bytes too (tests/unit/test_lora_vlm.c); this tier adds the real loaders.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from conftest import FIXTURES, ckfs_bin, load_file, load_folder, run_ckfs, same_bits

LORA = ["lora_qwen2_fsdp2_w2", "lora_llama_fsdp1_w3", "lora_qwen2_fsdp2_w2_nometa",
        "lora_qwen2_fsdp2_w2_rslora"]
VLM = ["qwen2_vl_fsdp2_w2", "qwen2_5_vl_fsdp2_w2", "qwen3_vl_fsdp2_w2", "qwen3_vl_moe_fsdp2_w2",
       "gemma3_fsdp2_w2"]
MOE = ["qwen3_moe_fsdp2_w2", "mixtral_fsdp2_w2"] + [f"{a}_fsdp2_w2" for a in (
    "deepseek_v3", "deepseek_v3_qproj", "glm4_moe", "gpt_oss", "qwen3_next", "llama4_text", "qwen2_moe",
    "olmoe", "minimax")]
ONLY = "lora_qwen2_fsdp2_w2_loraonly"
KIND = {**{c: "lora" for c in LORA + [ONLY]}, **{c: "vlm" for c in VLM},
        **{c: "moe" for c in MOE}}
# What the checkpoint does not record, as the fixture was trained (make_lora_vlm_fixtures.py).
AS_TRAINED = {"lora_qwen2_fsdp2_w2_nometa": ["--lora-alpha", "12"],
              "lora_qwen2_fsdp2_w2_rslora": ["--rslora"]}
# verl's output files that are not the model's (the fixture's oracles and log).
NOT_SERVED = {"merger.log", "base_fp32.safetensors", "fused_fp32.safetensors"}


def ckpt(case: str) -> Path:
    return FIXTURES / {"lora": "lora", "vlm": "vlm", "moe": "moe_fsdp"}[KIND[case]] / case


def expected(case: str) -> Path:
    return FIXTURES / f"expected_{KIND[case]}" / case


def files_under(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


class _Mounts:
    """One mount per (case, options), made on first use and unmounted at the end."""

    def __init__(self, root: Path):
        self.root, self.lock, self.points = root, threading.Lock(), {}

    def get(self, case: str, *opts: str) -> Path:
        key = (case, *opts)
        with self.lock:
            if key not in self.points:
                mnt = self.root / f"m{len(self.points)}"
                mnt.mkdir()
                # verl's merger wrote expected/ with the venv's transformers: imitate that one
                import transformers

                tv = ("--transformers-version", transformers.__version__)
                p = subprocess.run([ckfs_bin(), "mount", str(ckpt(case)), str(mnt), *tv, *opts],
                                   capture_output=True, text=True, timeout=120)
                assert p.returncode == 0, f"ckfs mount failed: {p.stderr}"
                self.points[key] = mnt
            return self.points[key]

    def close(self):
        for mnt in self.points.values():
            # -z: a model loaded from the mount may still hold a mapping
            subprocess.run([ckfs_bin(), "umount", "-z", str(mnt)], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def mounted(tmp_path_factory):
    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing: the mount tier cannot run on this machine", pytrace=False)
    mounts = _Mounts(tmp_path_factory.mktemp("mnt"))
    yield mounts.get
    mounts.close()


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """--base for the adapter saved alone: the source model the actor was loaded from."""
    d = tmp_path_factory.mktemp("base")
    shutil.copy(ckpt(ONLY) / "huggingface" / "config.json", d / "config.json")
    shutil.copy(expected(ONLY) / "base_fp32.safetensors", d / "model.safetensors")
    return d


# ------------------------------------------------------------------------------------------
# As verl's merger writes them
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", LORA + VLM + MOE)
def test_files_as_verl_writes_them(case, mounted):
    mnt, want = mounted(case), expected(case)
    verl = files_under(want) - NOT_SERVED
    if KIND[case] == "lora":
        # the LoRA fixtures keep verl's weights only; its side files are the checkpoint's
        verl |= {f for f in os.listdir(ckpt(case) / "huggingface")}
    assert files_under(mnt) == verl
    for name in sorted(verl - {"config.json", "lora_adapter/adapter_config.json"}):
        src = want / name if (want / name).exists() else ckpt(case) / "huggingface" / name
        assert (mnt / name).read_bytes() == src.read_bytes(), name


@pytest.mark.parametrize("case", LORA + VLM + MOE)
def test_config_loads_as_verls(case, mounted):
    import transformers

    mnt = mounted(case)
    assert json.loads((mnt / "config.json").read_text()) == json.loads((expected(case) / "config.json").read_text())
    got = transformers.AutoConfig.from_pretrained(str(mnt)).to_dict()
    want = transformers.AutoConfig.from_pretrained(str(expected(case))).to_dict()
    for d in (got, want):
        d.pop("_name_or_path")
    assert got == want


def lora_config_dict(d: Path) -> dict:
    from peft import LoraConfig

    cfg = LoraConfig.from_pretrained(str(d)).to_dict()
    cfg["target_modules"] = set(cfg["target_modules"])
    return cfg


@pytest.mark.parametrize("case", LORA)
def test_adapter_config_loads_as_verls(case, mounted):
    got = lora_config_dict(mounted(case) / "lora_adapter")
    want = lora_config_dict(expected(case) / "lora_adapter")
    assert got == want


def test_missing_meta_warns_as_verl(tmp_path):
    p = run_ckfs("export", ckpt("lora_qwen2_fsdp2_w2_nometa"), tmp_path / "out")
    assert "lora_alpha is not recorded: 0 in adapter_config.json, as verl writes it" in p.stderr
    assert json.loads((tmp_path / "out" / "lora_adapter" / "adapter_config.json").read_text())["lora_alpha"] == 0


@pytest.mark.parametrize("case", VLM)
def test_vlm_loads_with_image_text_to_text(case, mounted):
    import transformers

    model, info = transformers.AutoModelForImageTextToText.from_pretrained(
        str(mounted(case)), dtype=torch.bfloat16, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    sd = load_folder(expected(case))
    for name, p in model.state_dict().items():
        if name in sd:
            assert torch.equal(p, sd[name]), name


# ------------------------------------------------------------------------------------------
# LoRA fused on read
# ------------------------------------------------------------------------------------------
def fused_opts(case, base_dir):
    """What fusing needs beyond the checkpoint: lora_alpha or rsLoRA as trained, the base."""
    return ["--base", str(base_dir)] if case == ONLY else AS_TRAINED.get(case, [])


@pytest.mark.parametrize("case", LORA + [ONLY])
def test_fused_equals_merge_and_unload(case, mounted, base_dir):
    """fp32: bit for bit (ckfs sums over r in order with fused multiply-adds, as torch does
    here; the issue's bound is 1e-6 relative); bf16: the same bits as the oracle cast."""
    opts = fused_opts(case, base_dir)
    oracle = load_file(expected(case) / "fused_fp32.safetensors")
    fp32 = load_folder(mounted(case, "--lora=fuse", "--dtype", "fp32", *opts))
    bf16 = load_folder(mounted(case, "--lora=fuse", *opts))
    assert set(fp32) == set(oracle) == set(bf16)
    for k, w in oracle.items():
        rel = ((fp32[k].double() - w.double()).abs() / w.double().abs().clamp_min(1e-30)).max().item()
        assert rel <= 1e-6, (k, rel)
        assert same_bits(fp32[k], w), k
        assert same_bits(bf16[k], w.to(torch.bfloat16)), k


@pytest.mark.parametrize("case", LORA + [ONLY])
def test_fused_logits_equal_peft_merged(case, mounted, base_dir, tmp_path):
    """transformers on the fused mount against peft: the base, the adapter ckfs serves in fp32
    (adapter mode), merge_and_unload, bf16."""
    import transformers
    from peft import PeftModel

    torch.set_num_threads(1)
    opts = fused_opts(case, base_dir)
    base = tmp_path / "base"
    base.mkdir()
    shutil.copy(ckpt(case) / "huggingface" / "config.json", base / "config.json")
    shutil.copy(expected(case) / "base_fp32.safetensors", base / "model.safetensors")
    adapter = mounted(case, "--dtype", "fp32", *opts) / "lora_adapter"
    ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4]])
    model = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    merged_dir = tmp_path / "merged"
    PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().save_pretrained(str(merged_dir))

    def logits(d):  # both loaded the same way, so buffers (rotary inv_freq) match too
        m = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.bfloat16,
                                                              attn_implementation="eager").eval()
        with torch.no_grad():
            return m(input_ids=ids).logits
    want, got = logits(merged_dir), logits(mounted(case, "--lora=fuse", *opts))
    assert torch.isfinite(want).all()
    assert torch.equal(got, want), f"max |diff| {(got.float() - want.float()).abs().max()}"


# ------------------------------------------------------------------------------------------
# An adapter saved alone
# ------------------------------------------------------------------------------------------
def test_adapter_alone_is_an_adapter_folder(mounted):
    mnt = mounted(ONLY)
    assert sorted(os.listdir(mnt)) == ["adapter_config.json", "adapter_model.safetensors"]
    want = expected(ONLY) / "lora_adapter"
    assert (mnt / "adapter_model.safetensors").read_bytes() == (want / "adapter_model.safetensors").read_bytes()
    assert lora_config_dict(mnt) == lora_config_dict(want)


def test_adapter_alone_with_base(mounted, base_dir):
    for mode in ("adapter", "base"):
        mnt = mounted(ONLY, f"--lora={mode}", "--base", str(base_dir))
        got = load_folder(mnt)
        base = load_file(base_dir / "model.safetensors")
        assert set(got) == set(base)
        for k, w in base.items():
            assert same_bits(got[k], w.to(torch.bfloat16)), k
        assert (mnt / "lora_adapter").exists() == (mode == "adapter")


# ------------------------------------------------------------------------------------------
# The fused-MoE cases written and merged again with transformers 5.23.0
# (make_lora_vlm_fixtures.py --transformers 5.23.0): every file verl's merger wrote, config.json
# included, byte for byte from `ckfs export --transformers-version 5.23`.
# ------------------------------------------------------------------------------------------
TF523 = FIXTURES / "transformers-5.23.0"


@pytest.mark.parametrize("case", sorted(p.name for p in (TF523 / "moe_fsdp").iterdir()))
def test_moe_as_verl_merges_with_transformers_5_23(case, tmp_path):
    want = TF523 / "expected_moe" / case
    run_ckfs("export", "-q", "--transformers-version", "5.23", TF523 / "moe_fsdp" / case, tmp_path / "out")
    assert files_under(tmp_path / "out") == files_under(want) - NOT_SERVED
    for name in sorted(files_under(want) - NOT_SERVED):
        assert (tmp_path / "out" / name).read_bytes() == (want / name).read_bytes(), name
