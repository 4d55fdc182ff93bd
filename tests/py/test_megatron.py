"""Legacy Megatron per-rank checkpoints (tests/gen/make_megatron_fixtures.py, megatron-core 0.12.2).

`ckfs export --dtype auto` of each fixture holds exactly the original Hugging Face weights
(original/model.safetensors, bf16 stays bf16), loads in transformers, and gives logits identical
to the original model in bf16; `ckfs verify --against original/` passes (rank-file CRCs
included). `ckfs inspect --json` reports the layout and TP/PP/VPP topology.
"""

import json

import pytest
import torch

from conftest import FIXTURES, load_file, load_folder, run_ckfs, same_bits

MG = FIXTURES / "megatron"
CASES = {  # name: (tp, pp, vpp, layers per (vpp, pp) chunk)
    "llama_tp2": (2, 1, 1, [4]),
    "llama_tp2_te": (2, 1, 1, [4]),  # Transformer Engine names; weights of llama_tp2
    "qwen2_tp2_pp2": (2, 2, 1, [2, 2]),
    "qwen3_pp3_uneven": (1, 3, 1, [1, 2, 1]),
    "llama_tied_pp2_vpp2": (1, 2, 2, [1, 1, 1, 1]),
}
IDS = torch.tensor([[1, 17, 42, 7, 97, 5, 23, 64, 2, 50, 11, 96]])  # vocab 98


def logits_of(model):
    model.eval()
    with torch.no_grad():
        return model(input_ids=IDS).logits


@pytest.mark.parametrize("name", sorted(CASES))
def test_megatron_export(name, tmp_path):
    import transformers

    torch.set_num_threads(1)
    src = MG / name
    out = tmp_path / "out"
    run_ckfs("export", src, out, "--dtype", "auto")
    original_dir = MG / name.removesuffix("_te") / "original"
    original = load_file(original_dir / "model.safetensors")
    got = load_folder(out)
    assert set(got) == set(original)
    for k, v in original.items():
        assert v.dtype == torch.bfloat16
        assert same_bits(got[k], v), k

    cfg = transformers.AutoConfig.from_pretrained(str(src / "hf_config_and_tokenizer"))
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                        dtype=torch.bfloat16)
    missing, unexpected = ref.load_state_dict(original, strict=False)
    assert not unexpected and not [m for m in missing if m != "lm_head.weight"], (missing, unexpected)
    if cfg.tie_word_embeddings:
        ref.tie_weights()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16,
                                                              attn_implementation="eager")
    assert type(model).__name__ == cfg.architectures[0]
    want, logits = logits_of(ref), logits_of(model)
    assert torch.isfinite(want).all()
    assert torch.equal(logits, want)

    verify = run_ckfs("verify", src, "--against", original_dir).stdout
    assert "values match exactly" in verify and "libzip agrees" in verify

    info = json.loads(run_ckfs("inspect", "--json", src).stdout)
    tp, pp, vpp, layers = CASES[name]
    assert info["layout"] == "megatron"
    assert info["megatron"] == {"tp": tp, "pp": pp, "vpp": vpp, "stage_layers": layers}
    assert info["world_size"] == tp * pp
