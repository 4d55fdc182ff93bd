"""Every tensor ckfs exports equals the original (pre-sharding) weights cast by torch."""

import pytest
import torch

from conftest import TORCH_DTYPES, load_file, load_folder, original_path, same_bits

DTYPES = ["bf16", "fp32", "fp16", "auto"]


def expected_names(config, original):
    names = set(original)
    if config["tied"]:
        names.discard("lm_head.weight")  # verl (and ckfs) drop the tied alias
    return names


@pytest.mark.parametrize("dtype", DTYPES)
def test_export_equals_original(config, dtype, ckfs_export):
    original = load_file(original_path(config))
    out = ckfs_export(config) if dtype == "bf16" else ckfs_export(config, "--dtype", dtype)
    got = load_folder(out)
    want_names = expected_names(config, original)
    assert set(got) == want_names, (f"missing {sorted(want_names - set(got))}, "
                                    f"unexpected {sorted(set(got) - want_names)}")
    target = getattr(torch, TORCH_DTYPES.get(dtype, config["stored_dtype"]))
    bad = []
    for name in sorted(want_names):
        want = original[name].to(target)
        if not same_bits(got[name], want):
            bad.append(f"{name}: got {got[name].dtype} {list(got[name].shape)}, want {want.dtype} {list(want.shape)}")
    assert not bad, f"{len(bad)} tensors differ from original.to({target}):\n" + "\n".join(bad[:20])


def test_default_dtype_is_bf16(config, ckfs_export):
    for name, t in load_folder(ckfs_export(config)).items():
        assert t.dtype == torch.bfloat16, name
