#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write frontier-MoE-shaped checkpoints for metadata benchmarks (not a test fixture).

qwen3-235b (default): a Qwen3-235B-A22B-shaped verl FSDP2 actor at world size
  64 (94 layers, 128 experts per layer, every expert's gate_proj, up_proj and
  down_proj a separate tensor, as transformers 4.x's Qwen3MoeForCausalLM holds
  them: 36,945 keys; 235 G parameters, 940 GB of fp32 rank files), laid out
  as make_bench_checkpoint.py lays out the dense shapes: fsdp_config.json,
  huggingface/config.json (transformers' Qwen3MoeConfig), and
  model_world_size_64_rank_R.pt, each a torch.save of the rank's state dict
  of DTensors (1-D mesh "fsdp", Shard(0), global shape and stride).

World size 64 without 64 processes: torch's fake process group
(torch.testing._internal.distributed.fake_pg.FakeStore, backend "fake") lets
one process play rank R; a forked child per rank builds the device mesh as
rank R, wraps torch.empty local pieces in DTensors and saves them under
torch.serialization.skip_data, so the pickles, zip records and storage sizes
are exactly torch's while the tensor bytes are left as holes (sparse files:
`du` shows megabytes). The device mesh's integer tensor is written back, as
make_bench_checkpoint.py does. Memory: the untouched torch.empty pieces are
never committed (about 14.7 GB of address space per rank, no RAM).

deepseek-v3-671b (--shape): a DeepSeek-V3-shaped actor (61 layers, the
  first 3 dense, 256 routed experts and a shared one per MoE layer, MLA with
  q and kv LoRA ranks; 671 G parameters, 2.7 TB of fp32 rank files) as
  transformers 5 holds it, each MoE layer's experts fused into
  mlp.experts.gate_up_proj [256, 4096, 7168] and down_proj [256, 7168, 2048]
  (967 keys), which ckfs splits into 44,544 per-expert tensors as
  save_pretrained does.

--layers and --experts make smaller models of the same form (for trying the
benchmark quickly); --jobs runs that many ranks at once.

    .venv/bin/python tests/gen/make_bench_moe.py OUT [--shape S] [--world 64] [--jobs 2]
"""
import argparse
import json
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_bench_checkpoint as dense  # noqa: E402  (sets env; fill_mesh_storage)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402

# Qwen3-235B-A22B's published config.json (shapes only matter).
QWEN3_235B = dict(hidden=4096, layers=94, heads=64, kv_heads=4, head_dim=128,
                  intermediate=12288, moe_intermediate=1536, experts=128, top_k=8,
                  vocab=151936, rope_theta=1000000.0, eps=1e-6, max_pos=40960,
                  bos=151643, eos=151645)


def qwen3_moe_shapes(s):
    """(name, shape) of every key of Qwen3MoeForCausalLM's state dict, in module order."""
    h, hd, E, F = s["hidden"], s["head_dim"], s["experts"], s["moe_intermediate"]
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    out = [("model.embed_tokens.weight", (s["vocab"], h))]
    for n in range(s["layers"]):
        p = "model.layers.%d." % n
        out += [(p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q)),
                (p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,)),
                (p + "mlp.gate.weight", (E, h))]
        for e in range(E):
            x = p + "mlp.experts.%d." % e
            out += [(x + "gate_proj.weight", (F, h)), (x + "up_proj.weight", (F, h)),
                    (x + "down_proj.weight", (h, F))]
        out += [(p + "input_layernorm.weight", (h,)),
                (p + "post_attention_layernorm.weight", (h,))]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (s["vocab"], h))]
    return out


# DeepSeek-V3's published config.json (shapes only matter).
DEEPSEEK_V3_671B = dict(hidden=7168, layers=61, heads=128, intermediate=18432,
                        moe_intermediate=2048, experts=256, shared=1, top_k=8, dense=3,
                        q_lora=1536, kv_lora=512, rope_dim=64, nope_dim=128, v_dim=128,
                        vocab=129280, rope_theta=10000.0, eps=1e-6, max_pos=163840, bos=0,
                        eos=1)


def deepseek_v3_shapes(s):
    """(name, shape) of every key of transformers 5's DeepseekV3ForCausalLM state dict."""
    h, E, F, H = s["hidden"], s["experts"], s["moe_intermediate"], s["heads"]
    qk = s["nope_dim"] + s["rope_dim"]
    out = [("model.embed_tokens.weight", (s["vocab"], h))]
    for n in range(s["layers"]):
        p = "model.layers.%d." % n
        out += [(p + "self_attn.q_a_proj.weight", (s["q_lora"], h)),
                (p + "self_attn.q_a_layernorm.weight", (s["q_lora"],)),
                (p + "self_attn.q_b_proj.weight", (H * qk, s["q_lora"])),
                (p + "self_attn.kv_a_proj_with_mqa.weight", (s["kv_lora"] + s["rope_dim"], h)),
                (p + "self_attn.kv_a_layernorm.weight", (s["kv_lora"],)),
                (p + "self_attn.kv_b_proj.weight", (H * (s["nope_dim"] + s["v_dim"]), s["kv_lora"])),
                (p + "self_attn.o_proj.weight", (h, H * s["v_dim"]))]
        if n < s["dense"]:
            I = s["intermediate"]
            out += [(p + "mlp.gate_proj.weight", (I, h)), (p + "mlp.up_proj.weight", (I, h)),
                    (p + "mlp.down_proj.weight", (h, I))]
        else:
            S = F * s["shared"]
            out += [(p + "mlp.gate.weight", (E, h)), (p + "mlp.gate.e_score_correction_bias", (E,)),
                    (p + "mlp.experts.gate_up_proj", (E, 2 * F, h)),
                    (p + "mlp.experts.down_proj", (E, h, F)),
                    (p + "mlp.shared_experts.gate_proj.weight", (S, h)),
                    (p + "mlp.shared_experts.up_proj.weight", (S, h)),
                    (p + "mlp.shared_experts.down_proj.weight", (h, S))]
        out += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (s["vocab"], h))]
    return out


def write_deepseek_config(s, out):
    import transformers
    transformers.DeepseekV3Config(
        architectures=["DeepseekV3ForCausalLM"], hidden_size=s["hidden"],
        intermediate_size=s["intermediate"], moe_intermediate_size=s["moe_intermediate"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
        num_key_value_heads=s["heads"], n_shared_experts=s["shared"], n_routed_experts=s["experts"],
        routed_scaling_factor=2.5, kv_lora_rank=s["kv_lora"], q_lora_rank=s["q_lora"],
        qk_rope_head_dim=s["rope_dim"], v_head_dim=s["v_dim"], qk_nope_head_dim=s["nope_dim"],
        n_group=8, topk_group=4, num_experts_per_tok=s["top_k"], first_k_dense_replace=s["dense"],
        norm_topk_prob=True, vocab_size=s["vocab"], max_position_embeddings=s["max_pos"],
        rms_norm_eps=s["eps"], tie_word_embeddings=False, bos_token_id=s["bos"],
        eos_token_id=s["eos"], dtype=torch.float32,
    ).save_pretrained(os.path.join(out, "huggingface"))


def write_rank(args):
    """One rank's file, in a forked child: rank of world on the fake process group."""
    rank, world, out, keys = args
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    sd = {}
    for name, shape in keys:
        local_shape = (dense.local_rows(shape[0], world, rank),) + tuple(shape[1:])
        local = torch.empty(local_shape, dtype=torch.float32)  # never touched
        meta = torch.empty(shape, dtype=torch.float32, device="meta")  # global stride
        sd[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                      shape=meta.shape, stride=meta.stride())
    path = os.path.join(out, "model_world_size_%d_rank_%d.pt" % (world, rank))
    with torch.serialization.skip_data():
        torch.save(sd, path + ".tmp")
    dense.fill_mesh_storage(path + ".tmp", mesh.mesh)
    os.rename(path + ".tmp", path)
    dist.destroy_process_group()
    return rank


def write_config(s, out):
    import transformers
    transformers.Qwen3MoeConfig(
        architectures=["Qwen3MoeForCausalLM"], hidden_size=s["hidden"],
        intermediate_size=s["intermediate"], moe_intermediate_size=s["moe_intermediate"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"], num_experts=s["experts"],
        num_experts_per_tok=s["top_k"], decoder_sparse_step=1, mlp_only_layers=[],
        norm_topk_prob=True, vocab_size=s["vocab"], max_position_embeddings=s["max_pos"],
        rms_norm_eps=s["eps"], rope_theta=s["rope_theta"], hidden_act="silu",
        tie_word_embeddings=False, bos_token_id=s["bos"], eos_token_id=s["eos"],
        dtype=torch.float32,  # verl's actor is fp32
    ).save_pretrained(os.path.join(out, "huggingface"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=["qwen3-235b", "deepseek-v3-671b"], default="qwen3-235b")
    ap.add_argument("--world", type=int, default=64)
    ap.add_argument("--layers", type=int, help="override 94 layers")
    ap.add_argument("--experts", type=int, help="override 128 experts per layer")
    ap.add_argument("--jobs", type=int, default=2, help="ranks written at once")
    a = ap.parse_args()
    deepseek = a.shape == "deepseek-v3-671b"
    s = dict(DEEPSEEK_V3_671B if deepseek else QWEN3_235B)
    if a.layers:
        s["layers"] = a.layers
    if a.experts:
        s["experts"] = a.experts
    keys = deepseek_v3_shapes(s) if deepseek else qwen3_moe_shapes(s)
    n = sum(int(torch.Size(shape).numel()) for _, shape in keys)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 2, "world_size": a.world}, f, indent=4)
    (write_deepseek_config if deepseek else write_config)(s, a.out)
    print(a.shape + ": %d keys, %d parameters (%.0f GB fp32, holes) as %d rank files to %s"
          % (len(keys), n, n * 4 / 1e9, a.world, a.out), file=sys.stderr)
    t0 = time.monotonic()
    todo = [r for r in range(a.world) if not os.path.exists(
        os.path.join(a.out, "model_world_size_%d_rank_%d.pt" % (a.world, r)))]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(a.jobs, maxtasksperchild=1) as pool:
        for r in pool.imap_unordered(write_rank, [(r, a.world, a.out, keys) for r in todo]):
            print("rank %d written (%.0f s)" % (r, time.monotonic() - t0), file=sys.stderr)
    print("done in %.1f s" % (time.monotonic() - t0), file=sys.stderr)


if __name__ == "__main__":
    main()
