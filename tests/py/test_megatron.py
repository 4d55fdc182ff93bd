"""Legacy Megatron per-rank checkpoints (tests/gen/make_megatron_fixtures.py, megatron-core 0.12.2).

`ckfs export --dtype auto` of each fixture holds exactly the original Hugging Face weights
(original/model.safetensors, bf16 stays bf16), loads in transformers, and gives logits identical
to the original model in bf16; `ckfs verify --against original/` passes (rank-file CRCs
included). `ckfs inspect --json` reports the layout and TP/PP/VPP/EP/ETP topology. MoE cases
(Qwen2-MoE with shared expert, Qwen3-MoE, Mixtral; expert parallel folders, experts split over
TP or whole with expert tensor parallel size 1) load through transformers' own per-expert
checkpoint conversion; the critic loads as Qwen2ForTokenClassification. verl's TP=2 EP=4 ETP=1
save, which lacks EP ranks 2 and 3, is refused naming them. `--raw-names` serves an unknown key
per rank.
"""

import gc
import json
import os
import shutil
import subprocess

import pytest
import torch

from conftest import FIXTURES, ckfs_bin, load_file, load_folder, run_ckfs, same_bits

MG = FIXTURES / "megatron"
CASES = {  # name: (tp, pp, vpp, layers per (vpp, pp) chunk, ep, etp (None: no experts), folders)
    "llama_tp2": (2, 1, 1, [4], 1, None, 2),
    "llama_tp2_te": (2, 1, 1, [4], 1, None, 2),  # Transformer Engine names; weights of llama_tp2
    "qwen2_tp2_pp2": (2, 2, 1, [2, 2], 1, None, 4),
    "qwen3_pp3_uneven": (1, 3, 1, [1, 2, 1], 1, None, 3),
    "llama_tied_pp2_vpp2": (1, 2, 2, [1, 1, 1, 1], 1, None, 2),
    "qwen2_moe_tp2_ep2": (2, 1, 1, [4], 2, 2, 4),
    "qwen2_moe_tp2_ep2_te": (2, 1, 1, [4], 2, 2, 4),  # TE GroupedMLP names; weights of qwen2_moe_tp2_ep2
    "qwen3_moe_pp2_ep2": (1, 2, 1, [2, 2], 2, 1, 4),
    "mixtral_tp2_ep2": (2, 1, 1, [4], 2, 2, 4),
    "qwen2_critic_tp2": (2, 1, 1, [4], 1, None, 2),
    "qwen3_moe_pp2": (1, 2, 1, [2, 2], 1, 1, 2),  # two-number folders read as TP_PP
    # expert tensor parallel size 1: experts whole, folders mp_rank_00_000 and mp_rank_01_001
    "qwen2_moe_tp2_ep2_etp1": (2, 1, 1, [4], 2, 1, 2),
    "mixtral_tp2_pp2_ep2_etp1": (2, 2, 1, [2, 2], 2, 1, 4),
    "qwen3_moe_tp2_etp1": (2, 1, 1, [4], 1, 1, 2),  # EP=1: both folders hold every expert
}
IDS = torch.tensor([[1, 17, 42, 7, 97, 5, 23, 64, 2, 50, 11, 96]])  # vocab 98


def logits_of(model):
    model.eval()
    with torch.no_grad():
        return model(input_ids=IDS).logits


def reference(name, tmp_path):
    """(original tensors, the original model in transformers, the loader of the served folder)."""
    import transformers

    src = MG / name
    original_dir = MG / name.removesuffix("_te") / "original"
    original = load_file(original_dir / "model.safetensors")
    cfg = transformers.AutoConfig.from_pretrained(str(src / "hf_config_and_tokenizer"))
    critic = "critic" in name
    moe = "moe" in name or "mixtral" in name
    # torch 2.8's grouped_mm has no CPU kernel: the per-expert loop
    extra = dict(experts_implementation="eager") if moe else {}
    if moe:
        # transformers 5 fuses experts in memory: load the original through from_pretrained
        ref_dir = tmp_path / "ref"
        shutil.copytree(src / "hf_config_and_tokenizer", ref_dir)
        shutil.copy(original_dir / "model.safetensors", ref_dir)
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(ref_dir), dtype=torch.bfloat16,
                                                                attn_implementation="eager", **extra)
    elif critic:
        # the value head [1, H] has no bias: the reference's score.bias is zero
        cfg.num_labels = 1
        ref = transformers.AutoModelForTokenClassification.from_config(
            cfg, attn_implementation="eager", dtype=torch.bfloat16)
        missing, unexpected = ref.load_state_dict(original, strict=False)
        assert not unexpected and missing == ["score.bias"], (missing, unexpected)
        with torch.no_grad():
            ref.score.bias.zero_()
    else:
        ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                            dtype=torch.bfloat16)
        missing, unexpected = ref.load_state_dict(original, strict=False)
        assert not unexpected and not [m for m in missing if m != "lm_head.weight"], (missing, unexpected)
        if cfg.tie_word_embeddings:
            ref.tie_weights()
    auto = transformers.AutoModelForTokenClassification if critic else transformers.AutoModelForCausalLM

    def load(folder):
        model = auto.from_pretrained(str(folder), dtype=torch.bfloat16, attn_implementation="eager",
                                     **extra)
        if critic:
            assert type(model).__name__ == "Qwen2ForTokenClassification"
            assert model.config.num_labels == 1
            assert torch.count_nonzero(model.score.bias) == 0  # missing, initialised to zero
        else:
            assert type(model).__name__ == cfg.architectures[0]
        return model

    return original, ref, load


@pytest.mark.parametrize("name", sorted(CASES))
def test_megatron_export(name, tmp_path):
    torch.set_num_threads(1)
    src = MG / name
    out = tmp_path / "out"
    run_ckfs("export", src, out, "--dtype", "auto")
    original, ref, load = reference(name, tmp_path)
    got = load_folder(out)
    assert set(got) == set(original)
    for k, v in original.items():
        assert v.dtype == torch.bfloat16
        assert same_bits(got[k], v), k

    want, logits = logits_of(ref), logits_of(load(out))
    assert torch.isfinite(want).all()
    assert torch.equal(logits, want)

    original_dir = MG / name.removesuffix("_te") / "original"
    verify = run_ckfs("verify", src, "--against", original_dir).stdout
    assert "values match exactly" in verify and "libzip agrees" in verify

    info = json.loads(run_ckfs("inspect", "--json", src).stdout)
    tp, pp, vpp, layers, ep, etp, folders = CASES[name]
    assert info["layout"] == "megatron"
    want_mg = {"tp": tp, "pp": pp, "vpp": vpp, "ep": ep, "stage_layers": layers}
    if etp is not None:
        want_mg["etp"] = etp
    assert info["megatron"] == want_mg
    assert info["world_size"] == folders == len(os.listdir(src / "model"))
    text = run_ckfs("inspect", src).stdout
    assert f"TP={tp} PP={pp} VPP={vpp} EP={ep}{f' ETP={etp}' if etp else ''}," in text


@pytest.mark.parametrize("name", ["qwen2_moe_tp2_ep2_te", "qwen3_moe_pp2_ep2", "mixtral_tp2_ep2",
                                  "qwen2_critic_tp2", "mixtral_tp2_pp2_ep2_etp1"])
def test_megatron_mount(name, tmp_path):
    """The FUSE mount of the MoE and critic cases: transformers loads it and gives the original
    model's logits exactly; every tensor read through the mount has the original bits."""
    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing: the mount tier cannot run on this machine", pytrace=False)
    torch.set_num_threads(1)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    p = subprocess.run([ckfs_bin(), "mount", "--dtype", "auto", str(MG / name), str(mnt)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr

    def check():  # its locals (mmaps of the mounted file) are gone when it returns
        original, ref, load = reference(name, tmp_path)
        got = load_folder(mnt)
        assert set(got) == set(original)
        for k, v in original.items():
            assert same_bits(got[k], v), k
        assert torch.equal(logits_of(load(mnt)), logits_of(ref))

    try:
        check()
    finally:
        gc.collect()
        u = subprocess.run([ckfs_bin(), "umount", str(mnt)], capture_output=True, text=True, timeout=60)
    assert u.returncode == 0, u.stderr


def test_megatron_raw_names(tmp_path):
    """An unknown key (an MLA projection in a Llama checkpoint) is refused by default and,
    with --raw-names, served once per TP rank under its own name with that rank's bytes."""
    src = tmp_path / "src"
    shutil.copytree(MG / "llama_tp2", src)
    key = "decoder.layers.0.self_attention.linear_kv_down_proj.weight"
    for t in range(2):
        path = src / "model" / f"mp_rank_{t:02d}" / "model.pt"
        rank = torch.load(path, weights_only=False)
        rank[0][key] = torch.full((4, 64), t + 1, dtype=torch.bfloat16)  # tell the ranks apart
        torch.save(rank, path)
    r = run_ckfs("export", src, tmp_path / "no", check=False)
    assert r.returncode != 0 and f"1 Megatron keys not understood" in r.stderr and key in r.stderr
    run_ckfs("export", src, tmp_path / "out", "--dtype", "auto", "--raw-names")
    got = load_folder(tmp_path / "out")
    original = load_file(MG / "llama_tp2" / "original" / "model.safetensors")
    assert set(got) == set(original) | {f"{key}.tp_rank_00", f"{key}.tp_rank_01"}
    for t in range(2):
        assert torch.equal(got[f"{key}.tp_rank_{t:02d}"], torch.full((4, 64), t + 1, dtype=torch.bfloat16))
    for k, v in original.items():
        assert same_bits(got[k], v), k
    assert "served raw, per rank (--raw-names)" in run_ckfs("inspect", src, "--raw-names").stdout


def test_megatron_etp1_missing_ep_ranks(tmp_path):
    """verl's TP=2 EP=4 save with expert tensor parallel size 1 (data-parallel rank 0 only: EP
    ranks 0 and 1) is refused with one line naming EP ranks 2 and 3, and nothing is written;
    with one EP rank's folder gone from the TP=2 EP=2 save, that rank is named."""
    out = tmp_path / "out"
    r = run_ckfs("export", MG / "qwen3_moe_tp2_ep4_etp1", out, check=False)
    assert r.returncode != 0 and not out.exists()
    assert r.stderr.count("\n") == 1, r.stderr
    assert "no rank folder holds the experts of EP ranks 2, 3: each folder holds 1 of config.json's 4" in r.stderr
    src = tmp_path / "src"
    shutil.copytree(MG / "qwen2_moe_tp2_ep2_etp1", src)
    shutil.rmtree(src / "model" / "mp_rank_01_001")
    r = run_ckfs("export", src, out, check=False)
    assert r.returncode != 0 and not out.exists()
    assert "no rank folder holds the experts of EP rank 1:" in r.stderr, r.stderr
