#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write a large DeepSpeed ZeRO-3 checkpoint for benchmarks (not a test fixture).

Real DeepSpeed 0.19.8 files of a real transformers model's shape (default Qwen2.5-0.5B, tied
embeddings, bf16 training, world size 8), laid out as the HF Trainer's checkpoint-N/:
config.json beside `latest`, zero_to_fp32.py and global_step1/ with, per data-parallel rank,
zero_pp_rank_R_mp_rank_00_model_states.pt and bf16_zero_pp_rank_R_mp_rank_00_optim_states.pt
(fp32 master partitions and both Adam moments: 741 MB per rank, 5.9 GB in all for 0.5B).

Eight GPUs are not needed: the ranks run one after another, each in a process of its own on
torch's fake process group (torch.testing._internal.distributed.fake_pg, collectives are
no-ops), which deepspeed.init_distributed() then uses:

    deepspeed.zero.Init          the model is built partitioned, as ZeRO-3 builds it; every rank
                                 seeds torch alike, so the partitions of all ranks are pieces of
                                 one model (each rank initialises every full tensor and keeps its
                                 own ceil(numel/8) piece)
    deepspeed.initialize         ZeRO-3 with torch's AdamW ("torch_adam": true), bf16
    one optimizer step           torch's AdamW.step() on the fp32 partitions with zero gradients
                                 (a backward pass would all-gather through the fake group, which
                                 gathers nothing): it creates the Adam moments a real step
                                 creates, so the optimizer files have their real size
    engine.save_checkpoint       the files as DeepSpeed writes them (rank 0 also writes latest
                                 and the zero_to_fp32.py copy)

    DS_ACCELERATOR=cpu .venv/bin/python tests/gen/make_bench_deepspeed.py OUT [--shape qwen2.5-0.5b]
      [--world 8] [--layers N ...]

About 1-2 minutes per rank on 2 CPUs for 0.5B; 6 GB of disk.
"""
import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_bench_checkpoint import SHAPES  # noqa: E402  (the published shapes)

TAG = "global_step1"


def hf_config(s):
    import torch
    import transformers

    cls = transformers.LlamaConfig if s["arch"].startswith("Llama") else transformers.Qwen2Config
    kw = dict(architectures=[s["arch"]], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
              num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
              num_key_value_heads=s["kv_heads"], vocab_size=s["vocab"],
              max_position_embeddings=s["max_pos"], rms_norm_eps=s["eps"], rope_theta=s["rope_theta"],
              hidden_act="silu", tie_word_embeddings=s["tied"], bos_token_id=s["bos"],
              eos_token_id=s["eos"], dtype=torch.bfloat16)
    if cls is transformers.LlamaConfig:
        kw.update(attention_bias=False, mlp_bias=False)
    return cls(**kw)


def ds_config():
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.0, "torch_adam": True}},
        "steps_per_print": 1000000,
    }


def worker(rank, world, s, out):
    """One data-parallel rank, alone on the fake process group."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    import deepspeed
    from transformers import AutoModelForCausalLM

    deepspeed.init_distributed()
    cfg = ds_config()
    torch.manual_seed(0)  # every rank builds the same full tensors, then keeps its piece
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = AutoModelForCausalLM.from_config(hf_config(s), dtype=torch.bfloat16)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=cfg)
    # torch's AdamW over the fp32 partitions: ZeRO-3 hands them to it around each step
    zero, inner = engine.optimizer, engine.optimizer.optimizer
    zero._set_fp32_optimizer_param_groups()
    parts = [p for g in inner.param_groups for p in g["params"]]
    assert parts, "no fp32 partitions in the optimizer"
    for p in parts:
        p.grad = torch.zeros_like(p)
    inner.step()
    for p in parts:
        p.grad = None
    zero._clear_fp32_optimizer_param_groups()
    engine.save_checkpoint(out, tag=TAG)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # the worker of one rank
    for key in ("layers", "hidden", "intermediate", "heads", "kv-heads", "vocab"):
        ap.add_argument("--" + key, type=int, help="override the shape's " + key)
    a = ap.parse_args()
    s = dict(SHAPES[a.shape])
    for key in ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab"):
        if getattr(a, key) is not None:
            s[key] = getattr(a, key)
    if a.rank is not None:
        worker(a.rank, a.world, s, a.out)
        return
    os.makedirs(a.out, exist_ok=True)
    hf_config(s).save_pretrained(a.out)  # the Trainer's config.json beside latest
    t0 = time.monotonic()
    for r in range(a.world):
        t = time.monotonic()
        cmd = [sys.executable, os.path.abspath(__file__), a.out, "--shape", a.shape,
               "--world", str(a.world), "--rank", str(r)]
        for key in ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab"):
            if getattr(a, key) is not None:
                cmd += ["--" + key.replace("_", "-"), str(getattr(a, key))]
        subprocess.run(cmd, check=True)
        print("rank %d written in %.1f s" % (r, time.monotonic() - t), file=sys.stderr)
    with open(os.path.join(a.out, ".bench.json"), "w") as f:  # hidden: not a side file
        json.dump(dict(shape=a.shape, world=a.world, tag=TAG, **s), f, indent=1)
    print("done in %.1f s" % (time.monotonic() - t0), file=sys.stderr)


if __name__ == "__main__":
    main()
