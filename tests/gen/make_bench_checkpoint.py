#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write a large verl-FSDP2-style checkpoint for benchmarks (not a test fixture).

Real torch.save files of DTensor state dicts: four gloo CPU processes build a
1-D device mesh ("fsdp"), shard every weight of a Qwen2-shaped model with
torch.distributed.tensor.distribute_tensor(..., [Shard(0)]) and save their
local state dicts as model_world_size_4_rank_R.pt, next to fsdp_config.json
and huggingface/config.json, the way verl's FSDP2 checkpoint manager lays a
checkpoint out. Weights are seeded random fp32 (every rank computes the same
full tensor, so no data moves between processes).

    .venv/bin/python tests/gen/make_bench_checkpoint.py OUT [--layers 48]

The default shape (hidden 1024, 48 layers, vocab 32000) is about 603 M
parameters: 2.4 GB of fp32 shards, a 1.2 GB bf16 model.safetensors.
"""
import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("USE_LIBUV", "0")  # Debian's torch build: no libuv TCP store
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard, distribute_tensor  # noqa: E402

WORLD = 4


def shapes(a):
    h, i, v, L = a.hidden, a.intermediate, a.vocab, a.layers
    kv = a.kv_heads * (h // a.heads)
    out = [("model.embed_tokens.weight", (v, h))]
    for n in range(L):
        p = "model.layers.%d." % n
        out += [
            (p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.q_proj.bias", (h,)),
            (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i)),
            (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,)),
        ]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return out


def worker(rank, a, store):
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("fsdp",))
    sd = {}
    for k, (name, shape) in enumerate(shapes(a)):
        g = torch.Generator().manual_seed(1234 + k)  # same full tensor on every rank
        full = torch.randn(shape, generator=g, dtype=torch.float32) * 0.02
        dt = distribute_tensor(full, mesh, [Shard(0)], src_data_rank=None)
        # Own the local shard (a chunk of dim 0 is a view of the full storage,
        # which torch.save would write whole).
        sd[name] = DTensor.from_local(dt.to_local().clone(), mesh, [Shard(0)],
                                      run_check=False, shape=dt.shape, stride=dt.stride())
        del full, dt
    torch.save(sd, os.path.join(a.out, "model_world_size_%d_rank_%d.pt" % (WORLD, rank)))
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=2816)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    a = ap.parse_args()
    os.makedirs(os.path.join(a.out, "huggingface"), exist_ok=True)
    with open(os.path.join(a.out, "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 2, "world_size": WORLD}, f, indent=4)
    cfg = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": a.hidden, "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads, "vocab_size": a.vocab,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2,
    }
    with open(os.path.join(a.out, "huggingface", "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    n = sum(int(torch.Size(s).numel()) for _, s in shapes(a))
    print("writing %d parameters (%.2f GB fp32) to %s" % (n, n * 4 / 1e9, a.out), file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(worker, args=(a, os.path.join(tmp, "store")), nprocs=WORLD,
                           start_method="fork")


if __name__ == "__main__":
    main()
