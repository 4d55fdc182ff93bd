"""Megatron checkpoints of DeepSeek-V3 and GLM-4.5 (tests/gen/make_megatron_frontier_fixtures.py,
megatron-core 0.19.2): MLA, shared experts, expert bias, dense first layer, an MTP layer.

Each case is mounted with `ckfs mount` (bf16, the default); the mount holds exactly the original
weights in bf16 (e_score_correction_bias is fp32 there, holding bf16 values) and the MTP layer
under DeepSeek-V3's names (original/, two shards), transformers loads the mount (its MTP
layer left aside, as for DeepSeek's own release) and its logits equal those of the original
weights loaded the same way.
"""

import shutil

import pytest
import torch

from conftest import FIXTURES, load_folder, same_bits
from test_mcore_dist import mount  # noqa: F401  (the fixture)

FR = FIXTURES / "megatron_frontier"
CASES = {  # name: config folder, ground truth case
    "deepseek_v3_tp2_ep2": ("hf_config_and_tokenizer", "deepseek_v3_tp2_ep2"),
    "deepseek_v3_pp2_ep2": ("hf_config_and_tokenizer", "deepseek_v3_pp2_ep2"),
    "deepseek_v3_tp2_ep2_te": ("hf_config_and_tokenizer", "deepseek_v3_tp2_ep2"),
    "deepseek_v3_tp2_ep2_etp1": ("hf_config_and_tokenizer", "deepseek_v3_tp2_ep2_etp1"),
    "glm4_moe_tp2_ep2": ("hf_config_and_tokenizer", "glm4_moe_tp2_ep2"),
    "deepseek_v3_tp2_ep2_dist": ("huggingface", "deepseek_v3_tp2_ep2_dist"),
    "glm4_moe_tp2_pp2_dist": ("huggingface", "glm4_moe_tp2_pp2_dist"),
}
IDS = torch.tensor([[1, 17, 42, 7, 97, 5, 23, 64, 2, 50, 11, 96]])  # vocab 98


def logits_from(folder):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.bfloat16, attn_implementation="eager", experts_implementation="eager")
    model.eval()
    with torch.no_grad():
        return type(model).__name__, model(input_ids=IDS).logits


@pytest.mark.parametrize("name", sorted(CASES))
def test_megatron_frontier_mount(name, mount, tmp_path):  # noqa: F811
    torch.set_num_threads(1)
    cfg_dir, truth = CASES[name]
    ref_dir = tmp_path / "reference"
    shutil.copytree(FR / truth / "original", ref_dir)
    shutil.copy(FR / name / cfg_dir / "config.json", ref_dir / "config.json")
    original = load_folder(ref_dir)
    mnt = mount(FR / name)
    got = load_folder(mnt)
    assert set(got) == set(original)
    for k, v in original.items():
        assert v.dtype == torch.bfloat16 or k.endswith("e_score_correction_bias"), k
        assert same_bits(got[k], v.to(torch.bfloat16)), k
    assert "model.layers.3.shared_head.head.weight" in got  # the MTP layer, DeepSeek's names
    arch, want = logits_from(ref_dir)
    arch_got, logits = logits_from(mnt)
    assert arch_got == arch
    assert torch.isfinite(want).all()
    assert torch.equal(logits, want)
