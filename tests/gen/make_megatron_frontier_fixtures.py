#!/usr/bin/env python3
"""Megatron checkpoints of the frontier MoE layers (issue #36): DeepSeek-V3 (multi-head latent
attention, shared experts, expert bias, first layers dense, multi-token prediction) and GLM-4.5
(grouped attention with qkv bias and q/k norm, partial rotary, ungated shared experts, first
layer dense, MTP), in both of verl's Megatron layouts.

    python3 tests/gen/framework_matrix.py megatron-core-0.19.2   # makes the venv (once), or:
    PY=~/.cache/ckfs/megatron-core-0.19.2-venv/bin/python
    nice $PY tests/gen/make_megatron_frontier_fixtures.py          # every case, ~4 min on 2 cores
    nice $PY tests/gen/make_megatron_frontier_fixtures.py CASE ... # some cases
    nice $PY tests/gen/make_megatron_frontier_fixtures.py --self-check
        # Megatron's own forward on the filled TP x EP shards against transformers' logits of the
        # same weights; 2026-12-06: DeepSeek-V3 TP=2 EP=2 and GLM-4.5 TP=2 EP=2 both within bf16
        # noise (see the printed figures), a wrong layout gives unrelated logits

Written per case (tests/fixtures/megatron_frontier/<case>/):
  legacy:  model/mp_rank_TT[_PPP][_EEE]/model.pt      torch.save([model.state_dict()])
           hf_config_and_tokenizer/config.json
  dist:    dist_ckpt/ (torch_dist: .metadata, __*_*.distcp, common.pt, metadata.json)
           huggingface/config.json
  both:    original/  the ground truth as DeepSeek ships it, two shards and an index:
             model-00001-of-00002.safetensors  the HF model's weights as save_pretrained
               writes them (e_score_correction_bias in fp32, as DeepSeek's release and
               Megatron's expert_bias hold it)
             model-00002-of-00002.safetensors  the MTP layer under DeepSeek-V3's names:
               model.layers.{L}.{enorm,hnorm,eh_proj,shared_head.norm}.weight, the layer's
               self_attn/mlp/norms, and embed_tokens / shared_head.head (copies of the
               model's embedding and output layer, which Megatron's MTP shares),
               L = num_hidden_layers
  deepseek_v3_tp2_ep2_te/  deepseek_v3_tp2_ep2's rank files as Transformer Engine's MLA spec
           names and cuts them (REPRODUCED: TE needs CUDA): q/kv down projections whole on
           every TP rank (TELinear, parallel_mode "duplicated"), q_a/kv_a norms fused into the
           up projections (linear_q_up_proj.layer_norm_weight, linear_kv_up_proj.
           layer_norm_weight), the dense layer's pre-MLP norm into mlp.linear_fc1.
           layer_norm_weight; its original/ is deepseek_v3_tp2_ep2's

What is REAL and what is reproduced:
  * REAL (megatron-core 0.19.2, torch 2.8, transformers 5.10.4, CPU, gloo, one process per
    rank): parallel_state with TP x EP (x PP), GPTModel from get_gpt_decoder_block_spec (local
    spec: dense first layer(s) from moe_layer_freq, SequentialMLP experts, shared experts, the
    router's persistent expert_bias), the MTP block from get_gpt_mtp_block_spec, MLA from
    MLATransformerConfig, wrapped in Float16Module as verl does; the saved objects are exactly
    [state_dict()] (legacy, mp_rank_* as Megatron's get_checkpoint_name names them) and
    dist_checkpointing.save(sharded_state_dict(), torch_dist) with every byte megatron-core's.
  * Stand-in: the local spec's core attention (DotProductAttention) does not take MLA's
    k_channels / v_channels; SDPA below (parameter-free: no state-dict entry) replaces it.
  * REPRODUCED (not Megatron code): the VALUES, HF weights sliced per the mcore TP layout:
    column-parallel (q/kv down and up projections: the local spec builds ColumnParallelLinear,
    so they are split over TP; TE's duplicated TELinear would keep them whole), row-parallel
    linear_proj / linear_fc2, fc1 as per-rank [gate; up], GLM's qkv per query group, MTP's
    eh_proj split on its rows. Norms replicated (fp32 in Megatron; bf16 after Float16Module,
    as verl saves them); expert_bias stays fp32 (Megatron keeps it so), filled with
    bf16-exact values.
  * Patches because this run has no GPU: torch.cuda.current_device returns "cpu";
    torch.cuda.synchronize and, at PP > 1, Tensor.cuda are no-ops (the last stage's MTP keeps
    a copy of the embedding, all-reduced with the first stage's); sequence_parallel is set while TransformerConfig checks
    TP x EP and cleared before building (no state-dict change).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_megatron_fixtures as mg  # noqa: E402  (sets env, threads, warnings)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

ROOT = mg.ROOT
OUT = os.path.join(ROOT, "tests", "fixtures", "megatron_frontier")

H, V, L = 64, 98, 3
MOE = dict(n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
           n_group=1, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True,
           routed_scaling_factor=2.5, num_nextn_predict_layers=1)
DEEPSEEK = dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
                qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
GLM = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=True,
           use_qk_norm=True, partial_rotary_factor=0.5)

# name, model, layout, tp, pp, ep, etp (expert tensor parallel size; None = TP, megatron-core's
# default). With ETP = 1 (verl's DeepSeek recipes) world = PP x lcm(TP, EP) and only data-parallel
# rank 0 saves, as verl's MegatronCheckpointManager does: TP2 EP2 gives mp_rank_00_000 and
# mp_rank_01_001 (make_megatron_fixtures.py explains the pairing). Without q_lora_rank
# (DeepSeek-V2-Lite, Moonlight) megatron-core 0.19.2 builds linear_q_proj only as Transformer
# Engine's fused norm + linear when qk_layernorm is on, so the local spec cannot write one here,
# and ckfs refuses that key.
CASES = [
    ("deepseek_v3_tp2_ep2", "deepseek_v3", "legacy", 2, 1, 2, None),
    ("deepseek_v3_pp2_ep2", "deepseek_v3", "legacy", 1, 2, 2, None),
    ("glm4_moe_tp2_ep2", "glm4_moe", "legacy", 2, 1, 2, None),
    ("deepseek_v3_tp2_ep2_dist", "deepseek_v3", "dist", 2, 1, 2, None),
    ("glm4_moe_tp2_pp2_dist", "glm4_moe", "dist", 2, 2, 1, None),
    ("deepseek_v3_tp2_ep2_etp1", "deepseek_v3", "legacy", 2, 1, 2, 1),
]


def world_of(tp, pp, ep, etp):
    return tp * pp * ep if etp is None else pp * math.lcm(tp, etp * ep)


def hf_config(model, layers=L):
    import transformers
    common = dict(hidden_size=H, intermediate_size=96, num_hidden_layers=layers, vocab_size=V,
                  max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  rope_scaling=None, torch_dtype="bfloat16", **MOE)
    if model == "deepseek_v3":
        return transformers.DeepseekV3Config(**common, **DEEPSEEK, architectures=["DeepseekV3ForCausalLM"])
    return transformers.Glm4MoeConfig(**common, **GLM, architectures=["Glm4MoeForCausalLM"])


def hf_model(cfg, seed, init=0.02):
    """The random HF model, bf16; norms, biases and the router's correction bias non-trivial."""
    import transformers
    cfg.initializer_range = init
    cls = transformers.DeepseekV3ForCausalLM if cfg.model_type == "deepseek_v3" else transformers.Glm4MoeForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for n, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "norm" in n or n.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if "norm" in n else 0.0))
            elif n.endswith("e_score_correction_bias"):
                p.copy_((torch.randn_like(p.float()) * 0.1).to(p.dtype))
    return model


def saved_weights(model, d):
    """The tensors save_pretrained writes (experts per expert, as transformers 5 saves them)."""
    from safetensors.torch import load_file
    model.save_pretrained(d)
    return load_file(os.path.join(d, "model.safetensors"))


def mtp_weights(cfg, sd, seed, d):
    """The MTP layer under DeepSeek-V3's HF names: a layer L+1 of a model one layer deeper
    (so a MoE layer as the real releases have), its enorm/hnorm/eh_proj/shared_head.norm, and
    the model's own embedding and output layer."""
    import copy
    deeper = copy.deepcopy(cfg)
    deeper.num_hidden_layers = L + 1
    donor = saved_weights(hf_model(deeper, seed), d)
    pre = f"model.layers.{L}."
    out = {k: v for k, v in donor.items() if k.startswith(pre)}
    g = torch.Generator().manual_seed(seed)
    for n in ("enorm", "hnorm", "shared_head.norm"):
        out[pre + n + ".weight"] = (torch.randn(H, generator=g) * 0.5 + 1.0).to(torch.bfloat16)
    out[pre + "eh_proj.weight"] = (torch.randn(H, 2 * H, generator=g) * 0.02).to(torch.bfloat16)
    out[pre + "embed_tokens.weight"] = sd["model.embed_tokens.weight"].clone()
    out[pre + "shared_head.head.weight"] = sd["lm_head.weight"].clone()
    return out


def fp32_bias(sd):
    """e_score_correction_bias in fp32, as DeepSeek's release and Megatron's expert_bias hold it."""
    return {k: v.float() if k.endswith("e_score_correction_bias") else v for k, v in sd.items()}


def write_original(d, sd, mtp):
    """original/: the model's weights and the MTP layer as two shards with an index."""
    from safetensors.torch import save_file
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map = {}
    for name, part in zip(names, (sd, mtp)):
        save_file(part, os.path.join(d, name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    size = sum(v.numel() * v.element_size() for part in (sd, mtp) for v in part.values())
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)


def make_te_variant():
    """deepseek_v3_tp2_ep2_te/ from deepseek_v3_tp2_ep2/ (see the docstring)."""
    src, dst = os.path.join(OUT, "deepseek_v3_tp2_ep2"), os.path.join(OUT, "deepseek_v3_tp2_ep2_te")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(os.path.join(src, "hf_config_and_tokenizer"), os.path.join(dst, "hf_config_and_tokenizer"))
    from safetensors.torch import load_file
    orig = load_file(os.path.join(src, "original", "model-00001-of-00002.safetensors"))
    orig.update(load_file(os.path.join(src, "original", "model-00002-of-00002.safetensors")))
    fused = {"self_attention.q_layernorm.weight": "self_attention.linear_q_up_proj.layer_norm_weight",
             "self_attention.kv_layernorm.weight": "self_attention.linear_kv_up_proj.layer_norm_weight"}
    whole = {"self_attention.linear_q_down_proj.weight": "self_attn.q_a_proj.weight",
             "self_attention.linear_kv_down_proj.weight": "self_attn.kv_a_proj_with_mqa.weight"}
    for sub in sorted(os.listdir(os.path.join(src, "model"))):
        sd = torch.load(os.path.join(src, "model", sub, "model.pt"), weights_only=False)[0]
        out = {}
        for k, v in sd.items():
            pre = tail = hf_layer = None
            if k.startswith("decoder.layers."):
                pre, tail = ".".join(k.split(".")[:3]) + ".", k.split(".", 3)[3]
                hf_layer = int(k.split(".")[2])
            elif k.startswith("mtp.layers."):
                pre, tail = ".".join(k.split(".")[:4]) + ".", k.split(".", 4)[4]
                hf_layer = L + int(k.split(".")[2])
            if tail in whole:
                v = orig[f"model.layers.{hf_layer}.{whole[tail]}"].clone()
            elif tail in fused:
                k = pre + fused[tail]
            elif tail == "pre_mlp_layernorm.weight" and pre + "mlp.linear_fc1.weight" in sd:
                k = pre + "mlp.linear_fc1.layer_norm_weight"
            out[k] = v
        os.makedirs(os.path.join(dst, "model", sub))
        torch.save([out], os.path.join(dst, "model", sub, "model.pt"))


def local_value(key, sd, model, tp, tp_rank, experts=None, glob=None, etp=None):
    """The TP-local value of Megatron key. glob maps a decoder key's local layer to its global
    one; mtp.layers.i.* take HF layer L + i. experts: global expert of each local expert; etp:
    (expert tensor parallel size, rank) of this process, which cut the experts."""
    def rows(t):
        n = t.shape[0] // tp
        return t[tp_rank * n:(tp_rank + 1) * n]

    def cols(t):
        n = t.shape[1] // tp
        return t[:, tp_rank * n:(tp_rank + 1) * n]

    if key == "embedding.word_embeddings.weight":
        return rows(sd["model.embed_tokens.weight"])
    if key == "output_layer.weight":
        return rows(sd["lm_head.weight"])
    if key == "decoder.final_layernorm.weight":
        return sd["model.norm.weight"]
    parts = key.split(".")
    if parts[0] == "mtp":
        pre = f"model.layers.{L + int(parts[2])}."
        tail = ".".join(parts[3:])
        if tail in ("enorm.weight", "hnorm.weight"):
            return sd[pre + tail]
        if tail == "final_layernorm.weight":
            return sd[pre + "shared_head.norm.weight"]
        if tail == "eh_proj.weight":
            return rows(sd[pre + "eh_proj.weight"])
        tail = tail.split(".", 1)[1]  # after mtp_model_layer
    else:
        pre = f"model.layers.{glob[int(parts[2])]}."
        tail = ".".join(parts[3:])
    attn = {"self_attention.linear_q_down_proj.weight": ("self_attn.q_a_proj.weight", rows),
            "self_attention.linear_q_up_proj.weight": ("self_attn.q_b_proj.weight", rows),
            "self_attention.linear_q_proj.weight": ("self_attn.q_proj.weight", rows),
            "self_attention.linear_kv_down_proj.weight": ("self_attn.kv_a_proj_with_mqa.weight", rows),
            "self_attention.linear_kv_up_proj.weight": ("self_attn.kv_b_proj.weight", rows),
            "self_attention.linear_proj.weight": ("self_attn.o_proj.weight", cols),
            "mlp.linear_fc2.weight": ("mlp.down_proj.weight", cols),
            "mlp.shared_experts.linear_fc2.weight": ("mlp.shared_experts.down_proj.weight", cols),
            "input_layernorm.weight": ("input_layernorm.weight", None),
            "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight", None),
            "mlp.router.weight": ("mlp.gate.weight", None),
            "mlp.router.expert_bias": ("mlp.gate.e_score_correction_bias", None),
            "self_attention.q_layernorm.weight": (
                "self_attn.q_a_layernorm.weight" if model == "deepseek_v3" else "self_attn.q_norm.weight", None),
            "self_attention.kv_layernorm.weight": ("self_attn.kv_a_layernorm.weight", None),
            "self_attention.k_layernorm.weight": ("self_attn.k_norm.weight", None)}
    if tail in attn:
        name, cut = attn[tail]
        return cut(sd[pre + name]) if cut else sd[pre + name]
    if tail in ("mlp.linear_fc1.weight", "mlp.shared_experts.linear_fc1.weight"):
        m = pre + ("mlp." if "shared" not in tail else "mlp.shared_experts.")
        return torch.cat([rows(sd[m + "gate_proj.weight"]), rows(sd[m + "up_proj.weight"])], 0)
    if tail in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = tail.rsplit(".", 1)[1]
        nh, nkv, d = GLM["num_attention_heads"], GLM["num_key_value_heads"], GLM["head_dim"]
        r = nh // nkv
        q, k, v = (sd[pre + f"self_attn.{x}_proj.{kind}"] for x in "qkv")
        out = []
        for g in range(tp_rank * nkv // tp, (tp_rank + 1) * nkv // tp):
            out += [q[g * r * d:(g + 1) * r * d], k[g * d:(g + 1) * d], v[g * d:(g + 1) * d]]
        return torch.cat(out, 0)
    if tail.startswith("mlp.experts.local_experts."):
        i, what = tail.split(".")[3], tail.split(".", 4)[4]
        e = pre + f"mlp.experts.{experts[int(i)]}."
        n, r = etp
        if what == "linear_fc1.weight":
            g, u = sd[e + "gate_proj.weight"], sd[e + "up_proj.weight"]
            k = g.shape[0] // n
            return torch.cat([g[r * k:(r + 1) * k], u[r * k:(r + 1) * k]], 0)
        if what == "linear_fc2.weight":
            w = sd[e + "down_proj.weight"]
            k = w.shape[1] // n
            return w[:, r * k:(r + 1) * k]
    raise KeyError(key)


class SDPA(torch.nn.Module):
    """Causal softmax attention without parameters, standing in for the local spec's
    DotProductAttention, which does not take MLA's k_channels / v_channels. q, k: [s, b, n, dk],
    v: [s, b, n, dv] -> [s, b, n * dv]."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                 softmax_scale=None, k_channels=None, v_channels=None, cp_comm_type=None, pg_collection=None,
                 **kwargs):
        super().__init__()
        self.scale = softmax_scale

    def forward(self, q, k, v, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        q, k, v = (x.permute(1, 2, 0, 3) for x in (q, k, v))  # [b, n, s, d]
        o = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                             is_causal=True, scale=self.scale)
        o = o.to(v.dtype).permute(2, 0, 1, 3)
        return o.reshape(o.shape[0], o.shape[1], -1)


def mcore_config(model, tp, pp, ep, etp, check):
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig
    common = dict(
        num_layers=L, hidden_size=H, ffn_hidden_size=96, num_attention_heads=4,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
        use_cpu_initialization=True, normalization="RMSNorm", gated_linear_unit=True, add_bias_linear=False,
        layernorm_epsilon=1e-6, params_dtype=torch.bfloat16, bf16=True, pipeline_dtype=torch.bfloat16,
        activation_func=torch.nn.functional.silu, qk_layernorm=True,
        num_moe_experts=MOE["n_routed_experts"], moe_ffn_hidden_size=MOE["moe_intermediate_size"],
        moe_shared_expert_intermediate_size=MOE["n_shared_experts"] * MOE["moe_intermediate_size"],
        moe_layer_freq=[0] * MOE["first_k_dense_replace"] + [1] * (L - MOE["first_k_dense_replace"]),
        moe_router_topk=MOE["num_experts_per_tok"], moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True, moe_router_topk_scaling_factor=MOE["routed_scaling_factor"],
        moe_grouped_gemm=False, mtp_num_layers=MOE["num_nextn_predict_layers"],
        sequence_parallel=tp > 1 and ep > 1)
    if pp > 1:  # 3 layers over 2 stages: the dense one alone, then two MoE layers and MTP
        common["num_layers_in_first_pipeline_stage"] = 1
    if check:
        common.update(moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0)
    if model == "deepseek_v3":
        return MLATransformerConfig(
            **common, q_lora_rank=DEEPSEEK["q_lora_rank"],
            kv_lora_rank=DEEPSEEK["kv_lora_rank"], qk_head_dim=DEEPSEEK["qk_nope_head_dim"],
            qk_pos_emb_head_dim=DEEPSEEK["qk_rope_head_dim"], v_head_dim=DEEPSEEK["v_head_dim"],
            rope_type="rope", rotary_base=10000)
    return TransformerConfig(**common, num_query_groups=GLM["num_key_value_heads"], kv_channels=GLM["head_dim"],
                             add_qkv_bias=True)


def worker(rank, case, port, sd_path, outdir, check=False):
    name, model, layout, tp, pp, ep, etp = case
    world = world_of(tp, pp, ep, etp)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    if pp > 1:  # the MTP stage's copy of the embedding goes to CUDA for its all-reduce
        torch.Tensor.cuda = lambda self, *a, **k: self
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer.module import Float16Module

    ps.initialize_model_parallel(tp, pp, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
    cfg = mcore_config(model, tp, pp, ep, etp, check)
    cfg.sequence_parallel = False
    spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization="RMSNorm")
    if model == "deepseek_v3":
        for ls in spec.layer_specs:
            ls.submodules.self_attention.submodules.core_attention = SDPA
    last = ps.is_pipeline_last_stage()
    mtp = get_gpt_mtp_block_spec(cfg, spec, use_transformer_engine=False) if last else None
    m = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=V, max_sequence_length=64,
                 pre_process=ps.is_pipeline_first_stage(), post_process=last,
                 share_embeddings_and_output_weights=False, position_embedding_type="rope",
                 rotary_percent=1.0 if model == "deepseek_v3" else GLM["partial_rotary_factor"],
                 mtp_block_spec=mtp)
    hf_sd = torch.load(sd_path)
    tp_rank = ps.get_tensor_model_parallel_rank()
    glob = {j: layer.layer_number - 1 for j, layer in enumerate(m.decoder.layers)}
    with torch.no_grad():
        for key, p in m.state_dict(keep_vars=True).items():
            if key.endswith("_extra_state") or p is None:
                continue
            experts = etp_of = None
            if ".mlp.experts." in key:
                mod = m.get_submodule(key.split(".mlp.experts.")[0] + ".mlp")
                experts = mod.local_expert_indices
                etp_of = (ps.get_expert_tensor_parallel_world_size(), ps.get_expert_tensor_parallel_rank())
                assert etp_of[0] == (etp or tp), (etp_of, etp, tp)
            val = local_value(key, hf_sd, model, tp, tp_rank, experts, glob, etp_of)
            assert tuple(val.shape) == tuple(p.shape), (key, val.shape, p.shape)
            p.copy_(val)
    chunk = Float16Module(cfg, m)
    if check:
        from megatron.core import tensor_parallel
        import contextlib
        tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
        chunk.eval()
        ids = torch.tensor([[1, 17, 42, 7, 97, 5, 23, 64, 2, 50, 11, 96]])
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        mask = torch.triu(torch.ones(1, 1, ids.shape[1], ids.shape[1], dtype=torch.bool), 1)
        # The MTP block and its loss need labels; the main logits do not depend on them.
        m.mtp_process = False
        cfg.mtp_num_layers = None
        with torch.no_grad():
            out = m(ids, pos, mask, runtime_gather_output=True)
        if rank == 0:
            torch.save(out.float(), os.path.join(outdir, "megatron_logits.pt"))
    elif layout == "legacy" and (etp is None or ps.get_data_parallel_rank() == 0):
        sub = f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{ps.get_pipeline_model_parallel_rank():03d}"
        if ep > 1:
            sub += f"_{ps.get_expert_model_parallel_rank():03d}"
        path = os.path.join(outdir, "model", sub)
        os.makedirs(path, exist_ok=True)
        torch.save([chunk.state_dict()], os.path.join(path, "model.pt"))
    elif layout == "dist":
        from megatron.core import dist_checkpointing
        from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
        d = os.path.join(outdir, "dist_ckpt")
        if rank == 0:
            os.makedirs(d, exist_ok=True)
        dist.barrier()
        dist_checkpointing.save({"model": chunk.sharded_state_dict()}, d,
                                sharded_strategy=get_default_save_sharded_strategy("torch_dist"))
    dist.barrier()
    dist.destroy_process_group()


def make_case(i, case, tmp):
    name, model, layout, tp, pp, ep, etp = case
    outdir = os.path.join(OUT, name)
    shutil.rmtree(outdir, ignore_errors=True)
    os.makedirs(os.path.join(outdir, "original"))
    cfg = hf_config(model)
    hfm = hf_model(cfg, 3600 + i)
    sd = fp32_bias(saved_weights(hfm, os.path.join(tmp, name + "_hf")))
    mtp = fp32_bias(mtp_weights(cfg, sd, 3700 + i, os.path.join(tmp, name + "_mtp")))
    write_original(os.path.join(outdir, "original"), sd, mtp)
    hfm.config.save_pretrained(os.path.join(outdir, "hf_config_and_tokenizer" if layout == "legacy" else "huggingface"))
    sd_path = os.path.join(tmp, name + ".pt")
    torch.save({**sd, **mtp}, sd_path)
    mp.spawn(worker, args=(case, 29900 + i, sd_path, outdir), nprocs=world_of(tp, pp, ep, etp), join=True)
    return dict(name=name, model_type=model, layout=layout, tp=tp, pp=pp, ep=ep, etp=etp,
                tensors=sorted(sd), mtp_tensors=sorted(mtp))


def self_check():
    """TP=2 EP=2 of each model (DeepSeek-V3 also at expert tensor parallel size 1, the same
    weights): Megatron's forward vs transformers' (bf16: close, not equal)."""
    ok = True
    ids = torch.tensor([[1, 17, 42, 7, 97, 5, 23, 64, 2, 50, 11, 96]])
    for i, (model, etp) in enumerate((("deepseek_v3", None), ("glm4_moe", None), ("deepseek_v3", 1))):
        tmp = tempfile.mkdtemp()
        cfg = hf_config(model)
        seed = 4000 + (0 if model == "deepseek_v3" else 1)
        hfm = hf_model(cfg, seed, init=0.15)
        sd = saved_weights(hfm, os.path.join(tmp, "hf"))
        sd.update(mtp_weights(cfg, sd, seed + 100, os.path.join(tmp, "mtp")))
        torch.save(sd, os.path.join(tmp, "sd.pt"))
        case = ("check", model, "legacy", 2, 1, 2, etp)
        mp.spawn(worker, args=(case, 29960 + i, os.path.join(tmp, "sd.pt"), tmp, True),
                 nprocs=world_of(2, 1, 2, etp), join=True)
        got = torch.load(os.path.join(tmp, "megatron_logits.pt"))
        ref = type(hfm).from_pretrained(os.path.join(tmp, "hf"), dtype=torch.bfloat16,
                                        experts_implementation="eager", attn_implementation="eager")
        with torch.no_grad():
            want = ref(input_ids=ids).logits.float()
        diff = (got - want).abs().max().item()
        scale = want.abs().max().item()
        good = diff < 0.1 * scale
        ok &= good
        print(f"self-check {model} TP=2 EP=2 ETP={etp or 2}: max |megatron - transformers| = {diff:.4f} "
              f"(max |logit| {scale:.3f}) {'OK' if good else 'MISMATCH'}", flush=True)
        shutil.rmtree(tmp)
    return 0 if ok else 1


def main():
    args = sys.argv[1:]
    if args == ["--self-check"]:
        return self_check()
    import megatron.core
    os.makedirs(OUT, exist_ok=True)
    manifest_path = os.path.join(OUT, "MANIFEST.json")
    cases = []
    if args and os.path.exists(manifest_path):
        with open(manifest_path) as f:
            cases = [c for c in json.load(f)["cases"] if c["name"] not in args]
    tmp = tempfile.mkdtemp()
    for i, case in enumerate(CASES):
        if args and case[0] not in args:
            continue
        cases.append(make_case(i, case, tmp))
        print(f"{case[0]}: written", flush=True)
    if not args or "deepseek_v3_tp2_ep2" in args:
        make_te_variant()
    shutil.rmtree(tmp)
    import transformers
    order = [c[0] for c in CASES]
    with open(manifest_path, "w") as f:
        json.dump(dict(generator="tests/gen/make_megatron_frontier_fixtures.py",
                       versions={"torch": torch.__version__, "megatron-core": megatron.core.__version__,
                                 "transformers": transformers.__version__},
                       cases=sorted(cases, key=lambda c: order.index(c["name"]))), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
