#!/usr/bin/env python3
"""What each transformers release writes for a checkpoint's config.json, as verl's merger does.

verl's merger re-serialises the checkpoint's huggingface/config.json through transformers
(AutoConfig.from_pretrained, the dtype set to the output dtype, save_pretrained), so the bytes
of the merged config.json depend on the transformers release the merger runs with. This script
records them, for the configs of the committed fixtures, with each release named below, each
in its own venv (transformers, accelerate and torch 2.8, whose wheels torch_matrix.py keeps):

    python3 tests/gen/make_config_matrix.py            # every release in RELEASES
    python3 tests/gen/make_config_matrix.py 5.23.0     # one

Output: tests/fixtures/matrix/transformers-<version>/<fixture>/config.json (what the merger
with that release writes), <fixture>/loaded.json (the keys whose values differ when that release
loads ckfs's config.json and its own: `ckfs export --transformers-version <release>`, with
$CKFS_BIN or build/ckfs, makes ckfs's; for 4.x, which ckfs does not imitate, its default), and
tests/fixtures/matrix/transformers-<version>/versions.json (the release, Python). The venv is
a folder of its own under ~/.cache/ckfs (transformers-venv.*), removed after each release. tests/py/test_config_matrix.py
compares ckfs's config.json with each release's (docs/formats.md "config.json by transformers
release").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
MATRIX = os.path.join(FIXTURES, "matrix")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_cache import CACHE, scratch_venv  # noqa: E402

# The last 4.x, the release the test venv pins, the newest.
RELEASES = ["4.57.6", "5.10.4", "5.23.0"]
# Checkpoint configs as training runs saved them (the fixture folders' huggingface/).
CONFIGS = {
    "llama_tied": "fsdp/llama_tied_fsdp2_w4/huggingface",
    "qwen2": "fsdp/qwen2_fsdp2_w2/huggingface",
    "qwen2_critic": "fsdp/qwen2_critic_fsdp2_w2/huggingface",
    "qwen2_vl": "vlm/qwen2_vl_fsdp2_w2/huggingface",
    "qwen3_moe": "moe_fsdp/qwen3_moe_fsdp2_w2/huggingface",
}

# Run inside the venv: verl's merger's steps (verl/model_merger/base_model_merger.py) without
# the weights: AutoConfig.from_pretrained, a bf16 shell model of the config's auto class built
# with empty weights, save_pretrained (which writes config.json); the weight files are removed.
INNER = r"""
import json, os, sys, torch
from accelerate import init_empty_weights
import transformers as T
src, out = sys.argv[1], sys.argv[2]
cfg = T.AutoConfig.from_pretrained(src)
arch = (cfg.architectures or [""])[0]
auto = (T.AutoModelForTokenClassification if "ForTokenClassification" in arch else
        T.AutoModelForImageTextToText if hasattr(cfg, "vision_config") else
        T.AutoModelForCausalLM)
with init_empty_weights():
    model = auto.from_config(cfg, torch_dtype=torch.bfloat16)
model.to_empty(device="cpu")
model.save_pretrained(out, state_dict=model.state_dict())
for f in os.listdir(out):
    if f != "config.json":
        os.remove(os.path.join(out, f))
# Does this release read ckfs's config.json (argv[3]) as it reads its own?
theirs = T.AutoConfig.from_pretrained(out).to_dict()
ours = T.AutoConfig.from_pretrained(sys.argv[3]).to_dict()
differ = sorted(k for k in set(theirs) | set(ours)
                if k != "transformers_version" and theirs.get(k, "-") != ours.get(k, "-"))
with open(os.path.join(out, "loaded.json"), "w") as f:
    json.dump({"keys_that_load_differently": differ}, f, indent=1)
    f.write("\n")
"""
# The torch the shells are built with, from the wheels tests/gen/torch_matrix.py keeps.
TORCH = "torch==2.8.0"
WHEELS = os.path.join(CACHE, "wheels")
CKFS = os.environ.get("CKFS_BIN", os.path.join(REPO, "build", "ckfs"))


def ckfs_release_args(version):
    """--transformers-version for the releases ckfs imitates (5.x), none (the default) else."""
    return ["--transformers-version", version] if version.startswith("5.") else []


def generate(version):
    venv = scratch_venv("transformers-venv")
    py = os.path.join(venv, "bin", "python")
    out_root = os.path.join(MATRIX, f"transformers-{version}")
    try:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "-q", "--disable-pip-version-check", "install",
                        "--find-links", WHEELS, TORCH, "accelerate==1.15.0",
                        f"transformers=={version}"], check=True)
        shutil.rmtree(out_root, ignore_errors=True)
        for name, rel in CONFIGS.items():
            src = os.path.join(FIXTURES, rel)
            if not os.path.isdir(src):
                raise SystemExit(f"make_config_matrix: {src} is missing")
            out = os.path.join(out_root, name)
            os.makedirs(out)
            ours = os.path.join(CACHE, "config-matrix-export")
            shutil.rmtree(ours, ignore_errors=True)
            subprocess.run([CKFS, "export", os.path.dirname(src), ours, "--dtype", "bf16"]
                           + ckfs_release_args(version), check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            subprocess.run([py, "-c", INNER, src, out, ours], check=True,
                           env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error"))
            shutil.rmtree(ours)
        with open(os.path.join(out_root, "versions.json"), "w") as f:
            json.dump({"transformers": version, "torch": TORCH, "python": sys.version.split()[0],
                       "configs": CONFIGS}, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"transformers {version}: {len(CONFIGS)} configs written", flush=True)
    finally:
        shutil.rmtree(venv, ignore_errors=True)


if __name__ == "__main__":
    for v in sys.argv[1:] or RELEASES:
        generate(v)
