"""torch.distributed.checkpoint and Hugging Face input folders (tests/gen/make_dcp_fixtures.py).

`ckfs export` of each DCP fixture (default --dtype bf16) loads in transformers and gives logits
equal to the original model cast to bf16; every tensor equals torch's own cast of the original;
--dtype auto equals torch's dcp_to_torch_save bit for bit. HF folders round-trip the same way.
The MANIFEST of conftest.py lists FSDP fixtures only, so these tests have their own list.
"""

import json

import pytest
import torch

from conftest import FIXTURES, load_file, load_folder, run_ckfs, same_bits

DCP = FIXTURES / "dcp"
HF = FIXTURES / "hf"
DCP_NAMES = ["qwen2_fsdp2_w2_optim", "qwen2_tied_fsdp2_w3", "qwen2_plain_nodist"]
HF_NAMES = ["qwen2_single", "qwen2_sharded"]
IDS = torch.tensor([[1, 17, 42, 7, 300, 5, 123, 64, 2, 250, 11, 99]])  # vocab 301


def export(tmp_path, src, *opts):
    out = tmp_path / ("out" + "_".join(o.strip("-") for o in opts))
    run_ckfs("export", src, out, *opts)
    return out


def reference_logits(config_dir, original):
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(str(config_dir))
    # Built in bf16 (not cast afterwards, which would also round the fp32 rotary inv_freq buffer
    # that from_pretrained(dtype=bf16) keeps in fp32).
    model = transformers.Qwen2ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.bfloat16)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    sd = {k: v.to(torch.bfloat16) for k, v in original.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and not [m for m in missing if m != "lm_head.weight"], (missing, unexpected)
    model.eval()
    with torch.no_grad():
        return model(input_ids=IDS).logits


def exported_logits(d):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.bfloat16,
                                                              attn_implementation="eager")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    model.eval()
    with torch.no_grad():
        return model(input_ids=IDS).logits


@pytest.mark.parametrize("name", DCP_NAMES)
def test_dcp_logits(name, tmp_path):
    torch.set_num_threads(1)
    out = export(tmp_path, DCP / name)
    original = load_file(DCP / f"{name}.original.safetensors")
    got = load_folder(out)
    tied = json.loads((DCP / name / "huggingface" / "config.json").read_text()).get("tie_word_embeddings")
    want_keys = set(original) - ({"lm_head.weight"} if tied else set())
    assert set(got) == want_keys
    for k in want_keys:
        assert same_bits(got[k], original[k].to(torch.bfloat16)), k
    want = reference_logits(DCP / name / "huggingface", original)
    logits = exported_logits(out)
    assert torch.isfinite(want).all()
    assert torch.equal(logits, want), f"logits differ (max abs diff {(logits.float() - want.float()).abs().max()})"


@pytest.mark.parametrize("name", DCP_NAMES)
def test_dcp_auto_equals_dcp_to_torch_save(name, tmp_path):
    out = export(tmp_path, DCP / name, "--dtype", "auto")
    oracle = load_file(DCP / f"{name}.dcp_to_torch_save.safetensors")
    got = load_folder(out)
    assert set(got) <= set(oracle) and len(oracle) - len(got) in (0, 1)
    for k, v in got.items():
        assert same_bits(v, oracle[k]), k
    inspect = json.loads(run_ckfs("inspect", "--json", DCP / name).stdout)
    assert inspect["layout"] == "dcp"


@pytest.mark.parametrize("name", HF_NAMES)
def test_hf_folder(name, tmp_path):
    torch.set_num_threads(1)
    src = HF / name
    out = export(tmp_path, src, "--dtype", "auto")
    assert load_folder(out).keys() == load_folder(src).keys()
    if name == "qwen2_single":
        assert (out / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    want = load_folder(src)
    for k, v in load_folder(out).items():
        assert same_bits(v, want[k]), k
    resharded = export(tmp_path, src, "--max-shard-size", "50KB")
    assert (resharded / "model.safetensors.index.json").exists()
    assert torch.equal(exported_logits(resharded), reference_logits(src, want))
    inspect = json.loads(run_ckfs("inspect", "--json", src).stdout)
    assert inspect["layout"] == "hf"
