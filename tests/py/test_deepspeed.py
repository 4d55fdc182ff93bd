"""DeepSpeed ZeRO checkpoints (tests/gen/make_deepspeed_fixtures.py, DeepSpeed 0.19.8) against
DeepSpeed's own zero_to_fp32, run live here.

For a ZeRO-1 (frozen parameters), a ZeRO-2 (round-robin gradients), a ZeRO-3 and the HF Trainer's
ZeRO-3 checkpoint-N/: `ckfs export --dtype fp32` holds exactly what
get_fp32_state_dict_from_zero_checkpoint returns (same names, the tied alias dropped as the
config ties it, same bits), and the default export is torch's .to(torch.bfloat16) of it. The
Trainer case is also mounted: the weights read through the mount with safetensors are the same,
and transformers loads the mount with the logits of the model zero_to_fp32's state dict makes;
reading the whole weight file reads exactly the fp32 masters' bytes from the checkpoint.
"""

import gc
import json
import os
import subprocess

import pytest
import torch

from conftest import FIXTURES, ckfs_bin, load_file, load_folder, run_ckfs, same_bits

DS = FIXTURES / "deepspeed"
LIVE_CASES = {"z1_w3_frozen_fp32": 1, "z2_w3_rr_fp32": 2, "z3_w3_frozen_subgroups_fp32": 3,
              "trainer_z3_w3_bf16_tied": 3}  # case: ZeRO stage
IDS = torch.tensor([[1, 17, 42, 7, 96, 5, 23, 64, 2, 50, 11, 90]])  # vocab 97


def zero_to_fp32(case):
    """DeepSpeed's own reconstruction of the case (its `latest` tag), as torch tensors; the
    tied aliases of shared_params dropped when config.json ties the embeddings, as
    save_pretrained would (they are the owner's tensor object)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    sd = get_fp32_state_dict_from_zero_checkpoint(str(DS / case))
    cfg = json.loads(config_path(case).read_text())
    if cfg.get("tie_word_embeddings"):
        sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    return sd


def config_path(case):
    own = DS / case / "config.json"
    return own if own.exists() else DS / case / "oracle" / "config.json"


def config_args(case):
    return [] if (DS / case / "config.json").exists() else ["--config", str(config_path(case))]


@pytest.mark.parametrize("case", sorted(LIVE_CASES))
def test_export_is_zero_to_fp32(case, tmp_path):
    want = zero_to_fp32(case)
    run_ckfs("export", "-q", "--dtype", "fp32", *config_args(case), DS / case, tmp_path / "fp32")
    run_ckfs("export", "-q", *config_args(case), DS / case, tmp_path / "bf16")
    fp32, bf16 = load_folder(tmp_path / "fp32"), load_folder(tmp_path / "bf16")
    assert set(fp32) == set(want)
    assert set(bf16) == set(want)
    for k, v in want.items():
        assert v.dtype == torch.float32, k
        assert same_bits(fp32[k], v.contiguous()), k
        assert same_bits(bf16[k], v.to(torch.bfloat16)), k
    info = json.loads(run_ckfs("inspect", "--json", *config_args(case), DS / case).stdout)
    assert info["layout"] == "deepspeed"
    assert info["deepspeed"]["tag"] == "global_step2"
    assert info["deepspeed"]["zero_stage"] == LIVE_CASES[case]


@pytest.fixture
def mount(tmp_path):
    points = []

    def do(src, *args):
        mnt = tmp_path / f"mnt{len(points)}"
        mnt.mkdir()
        p = subprocess.run([ckfs_bin(), "mount", *args, str(src), str(mnt)], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, f"ckfs mount failed: {p.stderr}"
        points.append(mnt)
        return mnt

    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing: the mount tier cannot run on this machine", pytrace=False)
    yield do
    gc.collect()  # a failed test's models may still map the mount's files
    for mnt in points:
        if subprocess.run([ckfs_bin(), "umount", str(mnt)], capture_output=True, timeout=60).returncode:
            subprocess.run([ckfs_bin(), "umount", "-z", str(mnt)], capture_output=True, timeout=60)


def test_trainer_checkpoint_mount(mount):
    """The HF Trainer's ZeRO-3 checkpoint-N/ (no weights file in it): mounted as it is, read with
    safetensors and loaded by transformers, whose logits equal those of the model with
    zero_to_fp32's state dict, in bf16."""
    import transformers

    torch.set_num_threads(1)
    case = "trainer_z3_w3_bf16_tied"
    want = zero_to_fp32(case)
    mnt = mount(DS / case)
    got = load_folder(mnt)
    assert set(got) == set(want)
    for k, v in want.items():
        assert same_bits(got[k], v.to(torch.bfloat16)), k
    for side in ("config.json", "tokenizer.json", "generation_config.json"):
        assert (mnt / side).is_file()
    # Lazily: the whole file read, and exactly the fp32 masters' bytes read from the checkpoint
    # (ZeRO-3 pads all 26 of its tensors here: no padding, no Adam moment, no byte twice).
    stats = json.loads(run_ckfs("stats", "--json", mnt).stdout)
    assert stats["source_bytes_read"] == 4 * sum(v.numel() for v in want.values())
    model = transformers.AutoModelForCausalLM.from_pretrained(str(mnt), dtype=torch.bfloat16,
                                                              attn_implementation="eager")
    cfg = transformers.AutoConfig.from_pretrained(str(DS / case))
    ref = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16,
                                                        attn_implementation="eager")
    missing, unexpected = ref.load_state_dict({k: v.to(torch.bfloat16) for k, v in want.items()},
                                              strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied: it is the embedding
    ref.tie_weights()
    model.eval()
    ref.eval()
    with torch.no_grad():
        a, b = model(input_ids=IDS).logits, ref(input_ids=IDS).logits
    assert torch.isfinite(b).all()
    assert torch.equal(a, b)
    del model
