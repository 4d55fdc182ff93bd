"""Keys of wrapped modules (tests/fixtures/wrapped/, tests/gen/make_wrapped_fixtures.py).

Each folder holds the state dict of a wrapped module (DDP, torch.compile, activation
checkpointing, FSDP1) written by real torch code. Exported by ckfs, it must be the unwrapped
model: the same names and values as original/model.safetensors (the unwrapped model's own
state dict), and transformers must load it without missing or unexpected keys and give the
original model's logits.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from conftest import FIXTURES, run_ckfs

WRAPPED = FIXTURES / "wrapped"
SERVED = ["ddp_w2", "compiled_w1", "compiled_ddp_w2", "compiled_layers_w1",
          "checkpoint_wrapped_fsdp1_w2", "fsdp1_orig_params_w2", "fsdp1_full_state_dict_w2",
          "dcp_compiled", "hf_ddp"]


@pytest.mark.parametrize("name", SERVED)
def test_export_equals_unwrapped_model(name, tmp_path):
    run_ckfs("export", "-q", "--dtype", "fp32", WRAPPED / name, tmp_path / "out")
    got = load_file(tmp_path / "out" / "model.safetensors")
    want = load_file(WRAPPED / "original" / "model.safetensors")
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_transformers_loads_export(tmp_path):
    from transformers import AutoModelForCausalLM

    run_ckfs("export", "-q", "--dtype", "fp32", WRAPPED / "compiled_ddp_w2", tmp_path / "out")
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32,
                                                       output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ref = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    ref.load_state_dict(load_file(WRAPPED / "original" / "model.safetensors"))
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)


@pytest.mark.parametrize("name", ["refused_fsdp1_local_w2", "refused_fsdp1_flat_w2"])
def test_flat_parameters_refused(name, tmp_path):
    p = run_ckfs("export", WRAPPED / name, tmp_path / "out", check=False)
    assert p.returncode == 1
    assert "is an FSDP1 flat parameter" in p.stderr and "SHARDED_STATE_DICT" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
