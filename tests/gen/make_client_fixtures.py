#!/usr/bin/env python3
"""Generate the client tier's checkpoints (tests/fixtures/clients/): models an inference server can run.

The other fixtures have attention heads of 8-16 values, which vLLM's CPU attention refuses (head
sizes 32, 64, 80, 96, 112, 128 only). These are the same real checkpoints, written by the same
generators, with one shape that vLLM serves: hidden 64, 2 attention heads of 32 (1 KV head, GQA;
2 for Megatron, whose TP 2 needs a query group per rank), MLP 128, 2 layers (3 for PP 3), vocab
301 (300 for Megatron: megatron-core wants it divisible by TP). Each part calls its generator's
own functions with that shape:

    ~/.cache/ckfs/venv/bin/python tests/gen/make_client_fixtures.py       # all parts (~3-4 min)
    ~/.cache/ckfs/venv/bin/python tests/gen/make_client_fixtures.py --only fsdp,run
    ~/.cache/ckfs/venv/bin/python tests/gen/make_client_fixtures.py --fp8 DIR   # the FP8 case, into DIR

    part       generator (venv)                              reference written beside it
    fsdp       make_fixtures.py (main venv: torch 2.8,        expected/qwen2_fsdp2_w2/: verl 0.9.1's merger
               verl 0.9.1): qwen2_fsdp2_w2, FSDP2 W=2,
               verl's FSDPCheckpointManager
    lora       make_lora_vlm_fixtures.py (main venv): verl's  expected_lora/lora_qwen2_fsdp2_w2/: verl's
               FSDPEngine, LoRA r=8 on attention + MLP,       merger output and peft's merge_and_unload()
               3 AdamW steps, FSDP2 W=2                       (fused_fp32.safetensors)
    run        make_run_fixtures.py (main venv): a training   run/expected_latest_actor/: verl's merger on
               loop saving 3 steps (keep 2) through verl's    global_step_3/actor (what latest/ names)
               FSDPCheckpointManager, tracker file
    deepspeed  make_deepspeed_fixtures.py (main venv:         deepspeed/<case>/oracle/: DeepSpeed's own
               DeepSpeed 0.19.8): the HF Trainer with ZeRO-3  zero_to_fp32 (get_fp32_state_dict_from_
               on 3 ranks, bf16, tied: checkpoint-2/          zero_checkpoint) and the live fp32 masters
    megatron   make_megatron_fixtures.py, in the venv of      megatron/<case>/original/: the HF weights the
               framework_matrix.py megatron-core-0.14.0       ranks were cut from (see that generator);
               (re-executed there): Qwen2 TP 2 x PP 3         no reference tool runs on the CPU

Outputs: tests/fixtures/clients/{fsdp,original,expected,lora,expected_lora,run,deepspeed,megatron}/
and the generators' manifests there, plus clients/MANIFEST_clients.json: what each case is, which
options serve it and where its reference is (tests/clients/ reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

# make_fixtures.py re-executes itself on import for byte-reproducible pickles; the cases here
# borrow its functions, so they are reproducible in tensors, not in DeviceMesh _hash integers.
os.environ["CKFS_GEN_REEXEC"] = "1"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(REPO, "tests", "fixtures", "clients")
sys.path.insert(0, HERE)
CACHE = os.environ.get("CKFS_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ckfs")
MEGATRON_PYTHON = os.environ.get("CKFS_MEGATRON_PYTHON",
                                 os.path.join(CACHE, "megatron-core-0.14.0-venv", "bin", "python"))

SHAPE = dict(vocab_size=301, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1)
PARTS = ["fsdp", "lora", "run", "deepspeed", "megatron"]

# What the client tier runs: case -> source, ckfs options, reference folder (config.json and
# the weights), and how the reference's tensors compare with the mount's (bit for bit at the
# dtype given).
CASES = {
    "fsdp2": dict(kind="verl FSDP2 actor (W=2)", src="fsdp/qwen2_fsdp2_w2", options=[],
                  reference="expected/qwen2_fsdp2_w2", reference_tool="verl 0.9.1 model_merger",
                  compare_options=[]),
    "fsdp2_shards": dict(kind="verl FSDP2 actor, --max-shard-size 100KB", src="fsdp/qwen2_fsdp2_w2",
                         options=["--max-shard-size", "100KB"], reference="expected/qwen2_fsdp2_w2",
                         reference_tool="verl 0.9.1 model_merger", compare_options=["--max-shard-size", "100KB"]),
    "megatron": dict(kind="Megatron TP2 x PP3 (Qwen2)", src="megatron/qwen2_tp2_pp3", options=[],
                     reference="megatron/qwen2_tp2_pp3/original",
                     reference_config="megatron/qwen2_tp2_pp3/hf_config_and_tokenizer/config.json",
                     reference_tool="the HF weights the ranks were cut from (no merger runs on the CPU)",
                     compare_options=[]),
    "deepspeed_z3": dict(kind="DeepSpeed ZeRO-3 HF Trainer checkpoint (W=3, bf16, tied)",
                         src="deepspeed/trainer_z3_w3_bf16_tied", options=[],
                         reference="deepspeed/trainer_z3_w3_bf16_tied/oracle",
                         reference_weights="zero_to_fp32.safetensors",
                         reference_tool="DeepSpeed 0.19.8 zero_to_fp32", compare_options=["--dtype", "fp32"]),
    "lora_fuse": dict(kind="verl LoRA actor, --lora=fuse", src="lora/lora_qwen2_fsdp2_w2",
                      options=["--lora=fuse"], reference="expected_lora/lora_qwen2_fsdp2_w2",
                      reference_weights="fused_fp32.safetensors",
                      reference_tool="verl 0.9.1 model_merger + peft merge_and_unload",
                      compare_options=["--lora=fuse", "--dtype", "fp32"]),
    "run_latest": dict(kind="whole-run mount, latest/actor", src="run/fsdp_ppo", subdir="latest/actor",
                       options=[], reference="run/expected_latest_actor", reference_tool="verl 0.9.1 model_merger",
                       compare_options=[]),
}


def log(*a):
    print(*a, flush=True)


def no_planted_values():
    """make_fixtures.fill_weights plants fp32 edge values (65504, ties, subnormals) at the start of
    every tensor to test rounding; in lm_head's first row they make token 0 win every greedy step,
    which would hide a wrong weight from a generation test. The client fixtures leave them out."""
    import make_fixtures as mf

    mf.SPECIAL_F32_BITS = []


def part_fsdp():
    import make_fixtures as mf

    no_planted_values()

    shape = dict(SHAPE, arch="qwen2")
    mf.CONFIGS = [mf.cfg("qwen2_fsdp2_w2", shape, 2, 2, desc="FSDP2 fully_shard + verl placement fn, W=2, "
                         "2 attention heads of 32 (vLLM's CPU attention)")]
    sys.argv = [sys.argv[0], "--out", OUT]
    mf.main()


def part_lora():
    import make_lora_vlm_fixtures as ml

    shape = dict(SHAPE, arch="qwen2")
    spec = ml.lora_case("lora_qwen2_fsdp2_w2", shape, "fsdp2", 2, False, 8, 16, ml.ATTN_MLP,
                        desc="FSDP2 W=2, Qwen2 untied, 2 heads of 32, LoRA r=8 alpha=16 on attention+MLP, "
                             "3 AdamW steps")
    ml.CASES = [spec]
    sys.argv = [sys.argv[0], "--out", OUT]
    ml.main()


def part_run():
    import make_fixtures as mf
    import make_run_fixtures as mr

    no_planted_values()
    mr.MODEL = dict(SHAPE)
    run = os.path.join(OUT, "run", "fsdp_ppo")
    shutil.rmtree(os.path.join(OUT, "run"), ignore_errors=True)
    mr.write_run(run, steps=3, keep=2, critic=False, tracker=True)
    with open(os.path.join(run, mr.TRACKER)) as f:
        latest = f.read().strip()
    # verl's rotation removes global_step_1/actor and leaves global_step_1/ empty; git keeps no
    # empty folder, so none is kept here either
    for step in os.listdir(run):
        if os.path.isdir(os.path.join(run, step)) and not os.listdir(os.path.join(run, step)):
            os.rmdir(os.path.join(run, step))
    assert sorted(os.listdir(run)) == ["global_step_2", "global_step_3", mr.TRACKER], os.listdir(run)
    ref = os.path.join(OUT, "run", "expected_latest_actor")
    tmp = tempfile.mkdtemp()
    try:
        target = os.path.join(tmp, "merged")
        p = subprocess.run(mf.merger_cmd(os.path.join(run, f"global_step_{latest}", "actor"), target),
                           env=mf.merger_env(), cwd=REPO, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"verl's merger failed on the run's latest actor:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
        os.makedirs(ref)
        for fn in ("model.safetensors", "config.json", "generation_config.json"):
            if os.path.exists(os.path.join(target, fn)):
                shutil.copy2(os.path.join(target, fn), os.path.join(ref, fn))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"[run] fsdp_ppo: steps 2 and 3 kept, tracker {latest}; verl's merger on global_step_{latest}/actor "
        f"-> run/expected_latest_actor")


def part_deepspeed():
    import make_deepspeed_fixtures as md

    md.TINY = dict(SHAPE)
    spec = dict(md.BY_NAME["trainer_z3_w3_bf16_tied"])
    spec["desc"] = spec["desc"] + "; 2 heads of 32 (vLLM's CPU attention)"
    os.makedirs(os.path.join(OUT, "deepspeed"), exist_ok=True)
    md.make_case(spec, os.path.join(OUT, "deepspeed"))


def part_megatron():
    if os.environ.get("CKFS_CLIENTS_MEGATRON") != "1":
        # megatron-core is not in the main venv: re-run this part in the framework matrix's venv
        if not os.path.exists(MEGATRON_PYTHON):
            raise SystemExit(f"{MEGATRON_PYTHON} is missing: python3 tests/gen/framework_matrix.py "
                             "megatron-core-0.14.0 makes it (or set CKFS_MEGATRON_PYTHON)")
        env = dict(os.environ, CKFS_CLIENTS_MEGATRON="1")
        subprocess.run([MEGATRON_PYTHON, os.path.abspath(__file__), "--only", "megatron"], env=env, check=True)
        return
    # read by make_megatron_fixtures on import, in this process and in its spawned ranks
    os.environ["CKFS_MEGATRON_COMMON"] = json.dumps(dict(
        SHAPE, vocab_size=300, num_hidden_layers=3, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0))
    import make_megatron_fixtures as mm

    # hf_model draws weights with initializer_range 0.02 (the transformers default): on a model this
    # small every prompt then greedy-decodes to one token, which would hide a wrong weight from
    # the generation test; 0.15 gives varied tokens
    hf_model = mm.hf_model
    mm.hf_model = lambda arch, tied, seed, init=0.02, value=False: hf_model(arch, tied, seed, init=0.15, value=value)
    mm.OUT = os.path.join(OUT, "megatron")
    os.makedirs(mm.OUT, exist_ok=True)
    case = ("qwen2_tp2_pp3", "Qwen2ForCausalLM", 2, 3, 1, None, False)
    tmp = tempfile.mkdtemp()
    try:
        entry = mm.make_case(0, case, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with open(os.path.join(mm.OUT, "MANIFEST.json"), "w") as f:
        json.dump(dict(generator="tests/gen/make_megatron_fixtures.py via tests/gen/make_client_fixtures.py",
                       versions={"torch": mm.torch.__version__, "megatron-core": mm.mcore_version()},
                       cases=[entry]), f, indent=1)
        f.write("\n")


# The FP8 case: vLLM's CPU block-FP8 path wants the q, k and v projections in whole 128-row blocks
# and no bias (its kernel takes a float32 bias only, Qwen2's is bf16), so a Llama with heads of
# 128. At about 5 MB of fp32 rank files it is written where the client tier runs (--fp8 DIR, 20 s),
# not committed.
FP8_NAME = "llama_fp8_fsdp2_w2"
FP8_SHAPE = dict(arch="llama", vocab_size=301, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=128)
FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
              "modules_to_not_convert": ["lm_head", "model.embed_tokens"]}


def fp8_case(out):
    """DIR/fsdp/<name>/ (verl FSDP2, W=2), DIR/expected/<name>/ (verl's merger) and
    DIR/fp8_reference/: the FP8 folder as the reference quantizer of tests/gen/make_fp8_expected.py
    writes it from the original fp32 weights (q/k/v/o/gate/up/down: float8_e4m3fn values and fp32
    scales per 128 x 128 block), verl's merger output for every other tensor, and verl's
    config.json with the quantization_config ckfs declares (vLLM, SGLang and transformers read it)."""
    import make_fixtures as mf
    import make_fp8_expected as fe
    from safetensors.torch import load_file, save_file

    no_planted_values()
    mf.CONFIGS = [mf.cfg(FP8_NAME, FP8_SHAPE, 2, 2, desc="FSDP2 W=2, Llama with 2 heads of 128 and one KV head "
                         "(128-row q/k/v blocks, no bias: what vLLM's CPU block-FP8 path takes)")]
    sys.argv = [sys.argv[0], "--out", out]
    mf.main()
    original = load_file(os.path.join(out, "original", FP8_NAME + ".safetensors"))
    merged = load_file(os.path.join(out, "expected", FP8_NAME, "model.safetensors"))
    ref = dict(merged)
    ref.update(fe.quantized(original))
    d = os.path.join(out, "fp8_reference")
    os.makedirs(d, exist_ok=True)
    save_file(ref, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "expected", FP8_NAME, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = FP8_CONFIG
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    log(f"[{FP8_NAME}] reference FP8 folder: {sum(1 for k in ref if k.endswith('_scale_inv'))} weights quantized "
        f"-> {d}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated parts: " + ",".join(PARTS))
    ap.add_argument("--fp8", metavar="DIR", help="write only the FP8 case, into DIR (the client tier's work folder)")
    a = ap.parse_args()
    if a.fp8:
        fp8_case(a.fp8)
        return 0
    parts = a.only.split(",") if a.only else PARTS
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise SystemExit(f"unknown part(s) {bad}; parts: {PARTS}")
    os.makedirs(OUT, exist_ok=True)
    for p in parts:
        log(f"== {p}")
        globals()["part_" + p]()
    # what the client tier does not read: the fp32 originals (expected/ is verl's output of them)
    # and the LoRA base (the fused weights are the reference)
    for path in (os.path.join(OUT, "original"),
                 os.path.join(OUT, "expected_lora", "lora_qwen2_fsdp2_w2", "base_fp32.safetensors")):
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    if os.environ.get("CKFS_CLIENTS_MEGATRON") != "1":
        with open(os.path.join(OUT, "MANIFEST_clients.json"), "w") as f:
            json.dump(dict(generator="tests/gen/make_client_fixtures.py", shape=SHAPE, cases=CASES), f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
