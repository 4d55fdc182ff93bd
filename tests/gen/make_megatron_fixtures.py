#!/usr/bin/env python3
"""Generate legacy Megatron per-rank checkpoints (verl 2025-04 .. 2025-06 layout, verl-checkpoints.md 3.1(b)).

    .venv/bin/pip install --no-deps megatron-core==0.12.2    # generators only (no test imports it), so not in tests/python-requirements.txt
    .venv/bin/python tests/gen/make_megatron_fixtures.py      # ~5 min on 2 cores
    .venv/bin/python tests/gen/make_megatron_fixtures.py --moe-only      # MoE and critic cases only
    .venv/bin/python tests/gen/make_megatron_fixtures.py --broken-only   # broken/, *_te/
    .venv/bin/python tests/gen/make_megatron_fixtures.py --only a,b      # the named cases only
    python3 tests/gen/framework_matrix.py megatron-core-0.19.2  # version matrix (issue #21), 0.14.0 too:
        # a venv with that release, then --version-matrix here (MATRIX_CASES into
        # tests/fixtures/matrix/megatron-core-<version>/megatron/) and in make_mcore_dist_fixtures.py
    .venv/bin/python tests/gen/make_megatron_fixtures.py --self-check    # Megatron forward
        # of TP=2 Llama/Qwen2/Qwen3 and TP=2 EP=2 Qwen2-MoE/Mixtral (expert tensor parallel
        # size TP and 1) filled like the fixtures vs transformers' logits (2026-11-29: all five
        # within bf16 noise, ~3% of max |logit|; 2026-12-01 with ETP=1 on the same MoE models:
        # Qwen2-MoE 0.086, Mixtral 0.125 of max |logit| 4.75 and 4.19, all seven OK)

Layout written per case (tests/fixtures/megatron/<case>/):
    model/mp_rank_{tp:02d}/model.pt            (PP = 1)
    model/mp_rank_{tp:02d}_{pp:03d}/model.pt   (PP > 1)
    ..._{ep:03d}                               appended when EP > 1 (Megatron's get_checkpoint_name)
        torch.save of a Python LIST, one model.state_dict() per virtual-pipeline chunk
    hf_config_and_tokenizer/config.json        the HF config (save_pretrained)
    original/model.safetensors                 the HF model's weights (ground truth), bf16; for
                                               the MoE/critic cases the file save_pretrained wrote
                                               (transformers 5 writes experts per expert)

What is REAL and what is reproduced:
  * REAL (megatron-core 0.12.2 on CPU, gloo, one process per TP x PP rank):
    parallel_state.initialize_model_parallel(tp, pp, virtual_pipeline_model_parallel_size),
    GPTModel built with the local (non Transformer-Engine) layer spec and
    use_cpu_initialization=True, uneven PP through num_layers_in_{first,last}_pipeline_stage,
    VPP chunks through set_virtual_pipeline_model_parallel_rank; the saved object is exactly
    [m.state_dict() for m in model_chunks] (key names, local layer numbering, TP-local shapes,
    _extra_state entries, which stage holds embedding/output layer) via torch.save.
    MoE (MOE_CASES): initialize_model_parallel(..., expert_model_parallel_size=EP) with
    world = TP x PP x EP (dense data parallel = EP, expert data parallel = 1, so every process
    holds a distinct (TP, PP, EP) shard and saves it), num_moe_experts / moe_ffn_hidden_size /
    moe_shared_expert_intermediate_size, local spec with moe_grouped_gemm=False (SequentialMLP:
    mlp.experts.local_experts.{i}.*), the shared-expert gate switched on in the spec as verl's
    Qwen2MoE initializer does; expert i of a rank is Megatron's local_expert_indices[i], its
    expert-TP rank get_expert_tensor_parallel_rank() (asserted equal to the TP rank).
    Cases with an etp (expert_tensor_parallel_size, passed to initialize_model_parallel and
    TransformerConfig): world = PP x lcm(TP, ETP x EP), the smallest both grids divide, and only
    data-parallel rank 0 saves, as verl's MegatronCheckpointManager.save_checkpoint does
    (`mpu.get_data_parallel_rank() == 0`, verl 644aaa76b). With megatron-core's default order
    tp-cp-ep-dp-pp, process s of a stage is TP rank s % TP and, at ETP = 1, EP rank s % EP, so
    data-parallel rank 0 (s < TP) writes mp_rank_{t}[_{p}]_{t % EP}: TP2 EP2 gives
    mp_rank_00_000 and mp_rank_01_001 with each EP rank's experts whole; TP2 EP4 gives the
    same two folders and EP ranks 2 and 3 are never saved (qwen3_moe_tp2_ep4_etp1, refused).
    The older cases (no etp) save from every process, which verl did not: its DP-rank-0 rule
    writes only EP rank 0 when ETP = TP.
  * REPRODUCED here (not Megatron code): the VALUES. Each rank's parameters are overwritten in
    place with slices of the HF model following the documented mcore TP layout (QKV grouped per
    query group [q r*d; k d; v d], fc1 per rank [gate_tp; up_tp], column-parallel on dim 0,
    row-parallel linear_proj/linear_fc2 on dim 1, vocab-parallel embedding/output on dim 0,
    norms replicated). The global layer of each local layer is Megatron's own
    layer.layer_number - 1. verl's hf->mcore loader did the same thing. Experts: fc1 per rank
    [gate_e rows; up_e rows] and fc2 columns over the expert-TP ranks (TP, or whole at ETP = 1);
    router and shared-expert gate replicated; Mixtral's w1 = gate, w3 = up, w2 = down.
  * The self-check does not cover ETP = 1 at EP = 1 (qwen3_moe_tp2_etp1): megatron-core
    0.12.2's RowParallelLinear turns explicit expert communication off when both expert TP and
    EP are 1 and then all-reduces each expert's output over the dense TP group, doubling it
    (every token 1.5-3.3 off at TP=2); the saved layout is unaffected.
  * llama_tp2_te/ renames llama_tp2's keys to Transformer Engine's (see make_te_variant);
    qwen2_moe_tp2_ep2_te/ renames qwen2_moe_tp2_ep2's to verl's TE spec with TEGroupedMLP
    experts (make_te_moe_variant).
  * The critic (qwen2_critic_tp2): the output layer is replaced, after GPTModel is built, by a
    torch.nn.Linear(H, 1, bias=False), as verl's init_mcore_model(value=True) does with its
    LinearForLastLayer (a torch.nn.Linear subclass: same state-dict key and shape); values from
    a Qwen2ForTokenClassification (num_labels 1) whose score.bias is zeroed and left out of
    original/ (Megatron's head has none); its config.json names Qwen2ForCausalLM, as a
    critic's base config does.
  * MoE runs set sequence_parallel=True for TransformerConfig's TP x EP check and switch it
    off before building: the local spec's torch norms refuse it. The state dict is unchanged.
  * Deviations from verl: the local layer spec names the norms input_layernorm /
    pre_mlp_layernorm instead of TE's fused linear_qkv.layer_norm_weight /
    linear_fc1.layer_norm_weight (ckfs reads both); _extra_state values are None here
    (TE stores BytesIO); no optimizer/rng files; for the tied PP>1 case Tensor.cuda is a no-op
    (Megatron moves the shared output weight to CUDA for its all-reduce); megatron-core asserts
    vocab % TP == 0, so the vocabulary (98) is divisible by TP here.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("USE_LIBUV", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import warnings  # noqa: E402

warnings.filterwarnings("ignore")

import torch  # noqa: E402

torch.set_num_threads(1)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "megatron")

COMMON = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, vocab_size=98,  # megatron-core asserts vocab % tp == 0 (VocabParallelEmbedding)
              max_position_embeddings=64,
              rms_norm_eps=1e-6, rope_theta=10000.0)
# tests/gen/make_client_fixtures.py writes its cases with another shape; ranks are spawned
# processes that import this module anew, so that shape comes through the environment.
if os.environ.get("CKFS_MEGATRON_COMMON"):
    COMMON = json.loads(os.environ["CKFS_MEGATRON_COMMON"])

# name, architecture, tp, pp, vpp, first/last stage layers (None = even), tied
CASES = [
    ("llama_tp2", "LlamaForCausalLM", 2, 1, 1, None, False),
    ("qwen2_tp2_pp2", "Qwen2ForCausalLM", 2, 2, 1, None, False),
    ("qwen3_pp3_uneven", "Qwen3ForCausalLM", 1, 3, 1, (1, 1), False),
    ("llama_tied_pp2_vpp2", "LlamaForCausalLM", 1, 2, 2, None, True),
]

# MoE / critic cases: name, architecture, tp, pp, vpp, uneven, tied, ep, value head[, etp]
# etp: expert_tensor_parallel_size, omitted = TP (megatron-core's default)
MOE_CASES = [
    ("qwen2_moe_tp2_ep2", "Qwen2MoeForCausalLM", 2, 1, 1, None, False, 2, False),
    ("qwen3_moe_pp2_ep2", "Qwen3MoeForCausalLM", 1, 2, 1, None, False, 2, False),
    ("mixtral_tp2_ep2", "MixtralForCausalLM", 2, 1, 1, None, False, 2, False),
    ("qwen2_critic_tp2", "Qwen2ForCausalLM", 2, 1, 1, None, False, 1, True),
    # MoE without EP: mp_rank_TT_PPP names, the other reading of two-number folders
    ("qwen3_moe_pp2", "Qwen3MoeForCausalLM", 1, 2, 1, None, False, 1, False),
    # Expert tensor parallel size 1: each expert whole on its EP rank, saved as verl does (see
    # the docstring): mp_rank_00_000 and mp_rank_01_001 only (TP rank t holds EP rank t % EP)
    ("qwen2_moe_tp2_ep2_etp1", "Qwen2MoeForCausalLM", 2, 1, 1, None, False, 2, False, 1),
    # ... with PP=2: mp_rank_TT_PPP_EEE, (0, p, 0) and (1, p, 1)
    ("mixtral_tp2_pp2_ep2_etp1", "MixtralForCausalLM", 2, 2, 1, None, False, 2, False, 1),
    # ... EP=1: mp_rank_00 and mp_rank_01 both hold every expert whole
    ("qwen3_moe_tp2_etp1", "Qwen3MoeForCausalLM", 2, 1, 1, None, False, 1, False, 1),
    # ... EP=4 over TP=2: world 4, data parallel 2; data-parallel rank 0 (TP ranks 0, 1) holds
    # EP ranks 0 and 1 only, so EP ranks 2 and 3's experts are never saved (ckfs refuses it)
    ("qwen3_moe_tp2_ep4_etp1", "Qwen3MoeForCausalLM", 2, 1, 1, None, False, 4, False, 1),
]
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64)


def norm_case(case):
    """(name, arch, tp, pp, vpp, uneven, tied, ep, value, etp) for both case tables; etp None
    means expert tensor parallel size = TP."""
    return tuple(case) + (1, False, None)[len(case) - 7:]


def world_of(tp, pp, ep, etp):
    """Processes of a case. etp None: TP x PP x EP (dense data parallel = EP, expert data parallel
    1), every process saves its (TP, PP, EP) shard. etp given: the smallest world both the dense
    (TP x PP) and the expert (ETP x EP x PP) grids divide, and only data-parallel rank 0 saves,
    as verl's MegatronCheckpointManager does."""
    if etp is None:
        return tp * pp * ep
    import math
    return pp * math.lcm(tp, etp * ep)


def hf_model(arch, tied, seed, init=0.02, value=False):
    """The random HF model. value: the ForTokenClassification model (num_labels 1) of arch, whose
    config still names the causal-LM class (verl's critic keeps the base model's config)."""
    import transformers
    cfg_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    extra = {}
    if arch.startswith("Qwen2Moe"):
        extra = dict(MOE, decoder_sparse_step=1)
    elif arch.startswith("Qwen3Moe"):
        extra = dict(MOE, decoder_sparse_step=1)
        extra.pop("shared_expert_intermediate_size")
    elif arch.startswith("Mixtral"):
        extra = dict(num_local_experts=MOE["num_experts"], num_experts_per_tok=2)
    cfg = cfg_cls(**COMMON, **extra, tie_word_embeddings=tied, torch_dtype="bfloat16",
                  architectures=[arch], initializer_range=init)
    if value:
        cfg.num_labels = 1
    cls = getattr(transformers, arch.replace("ForCausalLM", "ForTokenClassification") if value else arch)
    torch.manual_seed(seed)
    model = cls(cfg).to(torch.bfloat16)
    # non-trivial norms so a swapped norm is caught
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if "norm" in n else 0.0))
        if value:
            model.score.bias.zero_()  # Megatron's value head has no bias (see critic note)
    return model


def hf_names(arch):
    """HF names as save_pretrained writes them (transformers 5 fuses experts in memory and
    unfuses them on save): router, expert gate/up/down, shared expert, shared-expert gate."""
    if arch.startswith("Mixtral"):
        return dict(router="block_sparse_moe.gate.weight",
                    expert="block_sparse_moe.experts.{e}.{w}.weight",
                    parts=dict(gate="w1", up="w3", down="w2"))
    return dict(router="mlp.gate.weight", expert="mlp.experts.{e}.{w}.weight",
                parts=dict(gate="gate_proj", up="up_proj", down="down_proj"))


def local_value(key, global_layer, sd, arch, tp, tp_rank, shape, experts=None, etp=None):
    """The TP-local value of Megatron key (local layer index already mapped to global_layer).
    experts: Megatron's local_expert_indices of the layer (global expert of local expert i);
    etp: (expert tensor parallel size, rank) of this process for expert weights."""
    nh, nkv, d = COMMON["num_attention_heads"], COMMON["num_key_value_heads"], COMMON["head_dim"]
    r = nh // nkv
    pre = f"model.layers.{global_layer}."

    def rows(t):
        n = t.shape[0] // tp
        return t[tp_rank * n:(tp_rank + 1) * n]

    def cols(t):
        n = t.shape[1] // tp
        return t[:, tp_rank * n:(tp_rank + 1) * n]

    if key == "embedding.word_embeddings.weight":
        return rows(sd["model.embed_tokens.weight"])
    if key == "output_layer.weight" and "score.weight" in sd:
        return sd["score.weight"]  # value head [1, H], replicated over TP
    if key == "output_layer.weight":
        return rows(sd["lm_head.weight"] if "lm_head.weight" in sd else sd["model.embed_tokens.weight"])
    if key == "decoder.final_layernorm.weight":
        return sd["model.norm.weight"]
    tail = key.split(".", 3)[3]
    if tail == "input_layernorm.weight":
        return sd[pre + "input_layernorm.weight"]
    if tail == "pre_mlp_layernorm.weight":
        return sd[pre + "post_attention_layernorm.weight"]
    if tail == "self_attention.q_layernorm.weight":
        return sd[pre + "self_attn.q_norm.weight"]
    if tail == "self_attention.k_layernorm.weight":
        return sd[pre + "self_attn.k_norm.weight"]
    if tail in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = tail.rsplit(".", 1)[1]
        q = sd[pre + "self_attn.q_proj." + kind]
        k = sd[pre + "self_attn.k_proj." + kind]
        v = sd[pre + "self_attn.v_proj." + kind]
        gp = nkv // tp
        parts = []
        for g in range(tp_rank * gp, (tp_rank + 1) * gp):
            parts += [q[g * r * d:(g + 1) * r * d], k[g * d:(g + 1) * d], v[g * d:(g + 1) * d]]
        return torch.cat(parts, 0)
    if tail == "self_attention.linear_proj.weight":
        return cols(sd[pre + "self_attn.o_proj.weight"])
    if tail == "mlp.linear_fc1.weight":
        return torch.cat([rows(sd[pre + "mlp.gate_proj.weight"]), rows(sd[pre + "mlp.up_proj.weight"])], 0)
    if tail == "mlp.linear_fc2.weight":
        return cols(sd[pre + "mlp.down_proj.weight"])
    names = hf_names(arch)
    if tail == "mlp.router.weight":
        return sd[pre + names["router"]]
    if tail == "mlp.shared_experts.gate_weight":
        return sd[pre + "mlp.shared_expert_gate.weight"]
    if tail == "mlp.shared_experts.linear_fc1.weight":
        return torch.cat([rows(sd[pre + "mlp.shared_expert.gate_proj.weight"]),
                          rows(sd[pre + "mlp.shared_expert.up_proj.weight"])], 0)
    if tail == "mlp.shared_experts.linear_fc2.weight":
        return cols(sd[pre + "mlp.shared_expert.down_proj.weight"])
    if tail.startswith("mlp.experts.local_experts."):
        # SequentialMLP: expert i of this EP rank is global expert experts[i]; expert tensor
        # parallelism (ETP, = TP by default, 1 = whole) shards it like a dense MLP over ETP ranks.
        n_etp, etp_rank = etp
        i, what = tail.split(".")[3], tail.split(".", 4)[4]
        e = experts[int(i)]
        w = {p: pre + names["expert"].format(e=e, w=names["parts"][p]) for p in ("gate", "up", "down")}

        def erows(t):
            n = t.shape[0] // n_etp
            return t[etp_rank * n:(etp_rank + 1) * n]

        if what == "linear_fc1.weight":
            return torch.cat([erows(sd[w["gate"]]), erows(sd[w["up"]])], 0)
        if what == "linear_fc2.weight":
            n = sd[w["down"]].shape[1] // n_etp
            return sd[w["down"]][:, etp_rank * n:(etp_rank + 1) * n]
    raise KeyError(key)


def worker(rank, case, port, sd_path, outdir, self_check=False):
    name, arch, tp, pp, vpp, uneven, tied, ep, value, etp = norm_case(case)
    world = world_of(tp, pp, ep, etp)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    if tied and pp > 1:
        # LanguageModule.setup_embeddings_and_output_layer moves the shared output weight to
        # CUDA before its all-reduce; on this CPU-only run it stays on CPU (gloo reduces it).
        torch.Tensor.cuda = lambda self, *a, **k: self
    ps.initialize_model_parallel(tp, pp, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
                                 expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
    extra = {}
    moe = "Moe" in arch or arch.startswith("Mixtral")
    if moe:
        # all layers MoE, SequentialMLP experts (local spec, moe_grouped_gemm=False)
        extra.update(num_moe_experts=MOE["num_experts"], moe_router_topk=MOE["num_experts_per_tok"],
                     moe_ffn_hidden_size=(COMMON["intermediate_size"] if arch.startswith("Mixtral")
                                          else MOE["moe_intermediate_size"]),
                     moe_grouped_gemm=False, expert_model_parallel_size=ep,
                     expert_tensor_parallel_size=etp,
                     # TransformerConfig requires it for TP x EP (verl sets it whenever TP > 1);
                     # switched off again below: the torch norms of the local spec refuse it
                     # (TE's norms support it). It does not change the state dict.
                     sequence_parallel=tp > 1)
        if arch.startswith("Qwen2Moe"):
            extra["moe_shared_expert_intermediate_size"] = MOE["shared_expert_intermediate_size"]
        if self_check:
            # routing as transformers does it (forward only; no state-dict change): Qwen2-MoE
            # (norm_topk_prob false) takes softmax over all experts, then top-k; Mixtral top-k
            # logits, then softmax (Megatron's default)
            extra.update(moe_router_load_balancing_type="none",
                         moe_router_pre_softmax=arch.startswith("Qwen2Moe"))
    if uneven:
        extra = dict(num_layers_in_first_pipeline_stage=uneven[0], num_layers_in_last_pipeline_stage=uneven[1])
    qwen3 = arch.startswith("Qwen3")
    cfg = TransformerConfig(
        num_layers=COMMON["num_hidden_layers"], hidden_size=COMMON["hidden_size"],
        num_attention_heads=COMMON["num_attention_heads"], num_query_groups=COMMON["num_key_value_heads"],
        kv_channels=COMMON["head_dim"], ffn_hidden_size=COMMON["intermediate_size"],
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        use_cpu_initialization=True, normalization="RMSNorm", gated_linear_unit=True,
        add_bias_linear=False, add_qkv_bias=arch.startswith("Qwen2"), qk_layernorm=qwen3,
        layernorm_epsilon=COMMON["rms_norm_eps"], params_dtype=torch.bfloat16, bf16=True, activation_func=torch.nn.functional.silu,
        pipeline_dtype=torch.bfloat16, **extra)
    cfg.sequence_parallel = False
    spec = get_gpt_layer_local_spec(num_experts=MOE["num_experts"] if moe else None, moe_grouped_gemm=False,
                                    qk_layernorm=qwen3, normalization="RMSNorm")
    if arch.startswith("Qwen2Moe"):
        # verl's Qwen2MoEModel initializer turns the shared-expert gate on the same way
        spec.submodules.mlp.submodules.shared_experts.params["gate"] = True
    hf_sd = torch.load(sd_path)
    tp_rank, pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    chunks = []
    for v in range(vpp):
        if vpp > 1:
            ps.set_virtual_pipeline_model_parallel_rank(v)
        m = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=COMMON["vocab_size"],
                     max_sequence_length=COMMON["max_position_embeddings"],
                     pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
                     share_embeddings_and_output_weights=tied, position_embedding_type="rope")
        if value and m.post_process:
            # verl's critic (init_mcore_model(value=True)) replaces the output layer by
            # LinearForLastLayer, a torch.nn.Linear(hidden, 1, bias=False) subclass: same state dict
            m.output_layer = torch.nn.Linear(COMMON["hidden_size"], 1, bias=False, dtype=torch.bfloat16)
        glob = {}
        for j, layer in enumerate(m.decoder.layers):
            glob[j] = layer.layer_number - 1
        with torch.no_grad():
            for key, p in m.state_dict(keep_vars=True).items():
                if key.endswith("_extra_state") or p is None:
                    continue
                if key.startswith("decoder.layers."):
                    j = int(key.split(".")[2])
                    g = glob[j]
                else:
                    g = None
                experts = etp_of = None
                if ".mlp.experts." in key:
                    experts = m.decoder.layers[int(key.split(".")[2])].mlp.local_expert_indices
                    etp_of = (ps.get_expert_tensor_parallel_world_size(),
                              ps.get_expert_tensor_parallel_rank())
                    assert etp_of[0] == (etp or tp), (etp_of, etp, tp)
                val = local_value(key, g, hf_sd, arch, tp, tp_rank, tuple(p.shape), experts, etp_of)
                assert tuple(val.shape) == tuple(p.shape), (key, val.shape, p.shape)
                p.copy_(val)
        # verl wraps every chunk in Float16Module (bf16 everywhere, norms included); its
        # state_dict() is the inner module's, so the keys do not change.
        chunks.append(Float16Module(cfg, m))
    if self_check:
        # CPU run: RotaryEmbedding moves inv_freq to torch.cuda.current_device().
        torch.cuda.current_device = lambda: "cpu"
        # ... and forks the CUDA RNG tracker for dropout (eval mode: no dropout).
        import contextlib
        from megatron.core import tensor_parallel
        tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
        chunks[0].eval()
        # Megatron's own forward on the filled TP shards must give the HF model's logits: this
        # checks the value layout reproduced above (QKV groups, [gate; up], row/column split).
        ids = torch.tensor([[1, 17, 42, 7, 97, 5, 23, 64, 2, 50, 11, 96]])
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        mask = torch.triu(torch.ones(1, 1, ids.shape[1], ids.shape[1], dtype=torch.bool), 1)
        with torch.no_grad():
            out = chunks[0].module(ids, pos, mask, runtime_gather_output=True)
        if rank == 0:
            torch.save(out.float(), os.path.join(outdir, "megatron_logits.pt"))
        dist.barrier()
        dist.destroy_process_group()
        return
    # verl/Megatron get_checkpoint_name: "_{ep:03d}" appended when EP > 1 (so PP = 1, EP > 1
    # gives mp_rank_TT_EEE, the same shape of name as mp_rank_TT_PPP)
    sub = f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    if ep > 1:
        sub += f"_{ps.get_expert_model_parallel_rank():03d}"
    # etp given: verl's save_checkpoint writes model.pt on data-parallel rank 0 only
    if etp is None or ps.get_data_parallel_rank() == 0:
        path = os.path.join(outdir, "model", sub)
        os.makedirs(path, exist_ok=True)
        torch.save([c.state_dict() for c in chunks], os.path.join(path, "model.pt"))
    dist.barrier()
    dist.destroy_process_group()


def make_broken():
    """Broken rank files derived from llama_tp2 (the unit test swaps them in):
    broken/tp_mismatch_rank1.pt  rank 1 with every TP-sharded tensor halved, i.e. the local
                                 shapes a TP=4 rank would hold
    broken/unknown_key_rank0.pt  rank 0 plus an MLA key ckfs does not map
    broken/dict_rank0.pt         rank 0's state dict saved bare (not in a list)"""
    bdir = os.path.join(OUT, "broken")
    os.makedirs(bdir, exist_ok=True)
    src = os.path.join(OUT, "llama_tp2", "model")
    r1 = torch.load(os.path.join(src, "mp_rank_01", "model.pt"), weights_only=False)
    half = []
    for sd in r1:
        out = {}
        for k, v in sd.items():
            if v is None or "layernorm" in k or "norm" in k:
                out[k] = v
            elif "linear_proj" in k or "linear_fc2" in k:
                out[k] = v[:, : v.shape[1] // 2].clone()
            else:
                out[k] = v[: v.shape[0] // 2].clone()
        half.append(out)
    torch.save(half, os.path.join(bdir, "tp_mismatch_rank1.pt"))
    r0 = torch.load(os.path.join(src, "mp_rank_00", "model.pt"), weights_only=False)
    extra = [dict(r0[0])]
    extra[0]["decoder.layers.0.self_attention.linear_kv_down_proj.weight"] = torch.zeros(4, 64, dtype=torch.bfloat16)
    torch.save(extra, os.path.join(bdir, "unknown_key_rank0.pt"))
    torch.save(r0[0], os.path.join(bdir, "dict_rank0.pt"))


def self_check():
    """TP=2 PP=1 of each architecture: Megatron's forward vs transformers' (bf16, so close,
    not equal; a wrong layout gives unrelated logits)."""
    ids = torch.tensor([[1, 17, 42, 7, 97, 5, 23, 64, 2, 50, 11, 96]])
    ok = True
    from safetensors.torch import load_file
    # architecture, EP, expert tensor parallel size (None = TP), seed. The ETP=1 runs take the
    # weights of the ETP=TP run of their architecture: both layouts on one model. (With another
    # Mixtral seed, 2006, one token of twelve was 1.3 off: its top-2 router margin is 0.02 in one
    # layer, so the bf16 rounding of whole vs TP-split experts flips its routing.)
    runs = [("LlamaForCausalLM", 1, None, 2000), ("Qwen2ForCausalLM", 1, None, 2001),
            ("Qwen3ForCausalLM", 1, None, 2002), ("Qwen2MoeForCausalLM", 2, None, 2003),
            ("MixtralForCausalLM", 2, None, 2004),
            ("Qwen2MoeForCausalLM", 2, 1, 2003), ("MixtralForCausalLM", 2, 1, 2004)]
    for i, (arch, ep, etp, seed) in enumerate(runs):
        tmp = tempfile.mkdtemp()
        model = hf_model(arch, False, seed, init=0.15)  # big weights: every layer matters
        if ep > 1:  # experts per expert, as save_pretrained writes them
            model.save_pretrained(os.path.join(tmp, "hf"))
            sd = load_file(os.path.join(tmp, "hf", "model.safetensors"))
            model.config._experts_implementation = "eager"  # no grouped_mm on CPU
            model = type(model).from_pretrained(os.path.join(tmp, "hf"), dtype=torch.bfloat16,
                                                experts_implementation="eager")
        else:
            sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        torch.save(sd, os.path.join(tmp, "sd.pt"))
        case = ("check", arch, 2, 1, 1, None, False, ep, False, etp)
        mp.spawn(worker, args=(case, 29700 + i, os.path.join(tmp, "sd.pt"), tmp, True),
                 nprocs=world_of(2, 1, ep, etp), join=True)
        got = torch.load(os.path.join(tmp, "megatron_logits.pt"))
        with torch.no_grad():
            want = model(input_ids=ids).logits.float()
        diff = (got - want).abs().max().item()
        scale = want.abs().max().item()
        good = diff < 0.1 * scale  # bf16 runs: ~3% apart; a wrong layout: ~100%
        ok &= good
        print(f"self-check {arch} TP=2 EP={ep} ETP={etp or 2}: max |megatron - transformers| = {diff:.4f} "
              f"(max |logit| {scale:.3f}) {'OK' if good else 'MISMATCH'}")
        shutil.rmtree(tmp)
    return 0 if ok else 1


def make_te_variant():
    """llama_tp2_te/: llama_tp2's rank files with Transformer Engine names (REPRODUCED: TE needs
    CUDA, so these are renamed, not built by TE). The fused norms become
    self_attention.linear_qkv.layer_norm_weight / mlp.linear_fc1.layer_norm_weight (placed before
    the fused weight, as TE's LayerNormLinear registers them), and _extra_state entries hold what
    TE's get_extra_state returns: io.BytesIO (TE < 1.x) on linear_proj / linear_fc2 /
    core_attention, an empty uint8 tensor (newer TE) on linear_qkv / linear_fc1. Ground truth is
    llama_tp2/original."""
    import io
    src, dst = os.path.join(OUT, "llama_tp2"), os.path.join(OUT, "llama_tp2_te")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(os.path.join(src, "hf_config_and_tokenizer"), os.path.join(dst, "hf_config_and_tokenizer"))
    for sub in sorted(os.listdir(os.path.join(src, "model"))):
        chunks = torch.load(os.path.join(src, "model", sub, "model.pt"), weights_only=False)
        out = []
        for sd in chunks:
            te = {}
            pending = {}
            for k, v in sd.items():
                if k.endswith(".input_layernorm.weight"):
                    pending[k.replace("input_layernorm.weight", "self_attention.linear_qkv.weight")] = (
                        k.replace("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"), v)
                    continue
                if k.endswith(".pre_mlp_layernorm.weight"):
                    pending[k.replace("pre_mlp_layernorm.weight", "mlp.linear_fc1.weight")] = (
                        k.replace("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"), v)
                    continue
                if k in pending:
                    nk, nv = pending.pop(k)
                    te[nk] = nv
                if k.endswith("._extra_state"):
                    v = (torch.empty(0, dtype=torch.uint8) if ("linear_qkv" in k or "linear_fc1" in k)
                         else io.BytesIO(b""))
                te[k] = v
                if k.endswith("self_attention.linear_proj._extra_state"):
                    te[k.replace("linear_proj", "core_attention")] = io.BytesIO(b"")
            assert not pending, pending
            out.append(te)
        os.makedirs(os.path.join(dst, "model", sub))
        torch.save(out, os.path.join(dst, "model", sub, "model.pt"))


def make_te_moe_variant():
    """qwen2_moe_tp2_ep2_te/: qwen2_moe_tp2_ep2's rank files with the names of verl's Transformer
    Engine spec (REPRODUCED by renaming: TE needs CUDA). verl sets moe_grouped_gemm=True, so the
    experts are TEGroupedMLP: mlp.experts.local_experts.{i}.linear_fc{1,2}.weight becomes
    mlp.experts.linear_fc{1,2}.weight{i} (TEGroupedLinear registers one weight{i} per local expert),
    with one mlp.experts.linear_fc{1,2}._extra_state; input_layernorm.weight becomes
    self_attention.linear_qkv.layer_norm_weight (fused TELayerNormColumnParallelLinear); the MoE
    pre_mlp_layernorm stays separate (TE's MoE spec does not fuse it). Ground truth is
    qwen2_moe_tp2_ep2/original."""
    src, dst = os.path.join(OUT, "qwen2_moe_tp2_ep2"), os.path.join(OUT, "qwen2_moe_tp2_ep2_te")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(os.path.join(src, "hf_config_and_tokenizer"), os.path.join(dst, "hf_config_and_tokenizer"))
    for sub in sorted(os.listdir(os.path.join(src, "model"))):
        chunks = torch.load(os.path.join(src, "model", sub, "model.pt"), weights_only=False)
        out = []
        for sd in chunks:
            te = {}
            pending = {}
            grouped = {}  # decoder.layers.J.mlp.experts.linear_fcF -> [weight0, weight1, ...]
            for k, v in sd.items():
                if k.endswith(".input_layernorm.weight"):
                    pending[k.replace("input_layernorm.weight", "self_attention.linear_qkv.weight")] = (
                        k.replace("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"), v)
                    continue
                if k in pending:
                    nk, nv = pending.pop(k)
                    te[nk] = nv
                parts = k.split(".")
                if ".mlp.experts.local_experts." in k:
                    if parts[8] == "weight":
                        grouped.setdefault(".".join(parts[:5] + [parts[7]]), []).append(v)
                    continue
                if grouped and ".mlp.experts." not in k:
                    for lin, ws in grouped.items():
                        for i, w in enumerate(ws):
                            te[f"{lin}.weight{i}"] = w
                        te[f"{lin}._extra_state"] = torch.empty(0, dtype=torch.uint8)
                    grouped = {}
                te[k] = v
            assert not grouped
            assert not pending, pending
            out.append(te)
        os.makedirs(os.path.join(dst, "model", sub))
        torch.save(out, os.path.join(dst, "model", sub, "model.pt"))


def make_case(i, case, tmp):
    """Write one case; returns its MANIFEST entry."""
    from safetensors.torch import load_file, save_file
    name, arch, tp, pp, vpp, uneven, tied, ep, value, etp = norm_case(case)
    model = hf_model(arch, tied, 1000 + i, value=value)
    outdir = os.path.join(OUT, name)
    shutil.rmtree(outdir, ignore_errors=True)
    os.makedirs(os.path.join(outdir, "original"))
    if len(case) == 7:  # the dense cases: the in-memory state dict is what save_pretrained writes
        model.config.save_pretrained(os.path.join(outdir, "hf_config_and_tokenizer"))
        sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        if tied:
            sd.pop("lm_head.weight", None)
    else:
        # transformers 5 holds MoE experts fused ([E, 2F, H]) and writes them per expert on
        # save_pretrained: the ground truth is the file save_pretrained wrote.
        hf = os.path.join(tmp, name + "_hf")
        model.save_pretrained(hf)
        sd = load_file(os.path.join(hf, "model.safetensors"))
        cfg = model.config
        if value:
            # Megatron's value head has no bias; verl's critic config is the base model's
            sd.pop("score.bias")
            cfg.architectures, cfg.num_labels = [arch], 2
        cfg.save_pretrained(os.path.join(outdir, "hf_config_and_tokenizer"))
    save_file(sd, os.path.join(outdir, "original", "model.safetensors"), metadata={"format": "pt"})
    sd_path = os.path.join(tmp, name + ".pt")
    torch.save(sd, sd_path)
    mp.spawn(worker, args=(case, 29600 + i, sd_path, outdir), nprocs=world_of(tp, pp, ep, etp), join=True)
    print(f"{name}: {arch} tp={tp} pp={pp} vpp={vpp} ep={ep} etp={etp or tp} tied={tied} value={value} "
          f"folders={sorted(os.listdir(os.path.join(outdir, 'model')))}")
    entry = dict(name=name, architecture=arch, tp=tp, pp=pp, vpp=vpp,
                 stage_layers=list(uneven) if uneven else None, tied=tied)
    if len(case) > 7:
        entry.update(ep=ep, value_head=value)
    if etp is not None:
        entry.update(etp=etp, folders=sorted(os.listdir(os.path.join(outdir, "model"))))
    entry["tensors"] = list(sd.keys())
    return entry


def make_moe_broken():
    """broken/qwen2_moe_dense_rank.pt: rank (TP 0, EP 1) of qwen2_moe_tp2_ep2 with its expert
    keys dropped (a rank file from a dense run among MoE ranks)."""
    src = os.path.join(OUT, "qwen2_moe_tp2_ep2", "model", "mp_rank_00_001", "model.pt")
    chunks = torch.load(src, weights_only=False)
    out = [{k: v for k, v in sd.items() if ".experts." not in k} for sd in chunks]
    torch.save(out, os.path.join(OUT, "broken", "qwen2_moe_dense_rank.pt"))


def mcore_version():
    from importlib.metadata import version
    return version("megatron-core")


# The megatron-core version matrix (issue #21): this case, written by another megatron-core
# release, goes to tests/fixtures/matrix/megatron-core-<version>/megatron/<case>/ (TP and PP
# together: mp_rank_TT_PPP folders, stage split, TP layout); make_mcore_dist_fixtures.py
# --version-matrix writes the torch_dist cases of the same cell.
MATRIX_CASES = ["qwen2_tp2_pp2"]


def matrix_dir(kind):
    return os.path.join(ROOT, "tests", "fixtures", "matrix", f"megatron-core-{mcore_version()}", kind)


def write_manifest(entries):
    path = os.path.join(OUT, "MANIFEST.json")
    cases = []
    if os.path.exists(path):
        with open(path) as f:
            cases = json.load(f)["cases"]
    names = {e["name"] for e in entries}
    cases = [c for c in cases if c["name"] not in names] + entries
    with open(path, "w") as f:
        json.dump(dict(generator="tests/gen/make_megatron_fixtures.py",
                       versions={"torch": torch.__version__, "megatron-core": mcore_version()},
                       cases=cases), f, indent=1)


def main():
    if sys.argv[1:] == ["--broken-only"]:
        make_broken()
        make_te_variant()
        make_moe_broken()
        make_te_moe_variant()
        return 0
    if sys.argv[1:] == ["--self-check"]:
        return self_check()
    if sys.argv[1:] == ["--version-matrix"]:
        global OUT
        OUT = matrix_dir("megatron")
        print(f"version matrix: megatron-core {mcore_version()}, torch {torch.__version__} -> {OUT}")
        shutil.rmtree(OUT, ignore_errors=True)
        sys.argv[1:] = ["--only", ",".join(MATRIX_CASES)]
    if sys.argv[1:2] == ["--only"] and len(sys.argv) == 3:
        # regenerate the named cases only (comma-separated), the others and broken/ untouched
        names = sys.argv[2].split(",")
        tables = [(0, CASES), (len(CASES), MOE_CASES)]
        todo = [(base + i, c) for base, table in tables for i, c in enumerate(table) if c[0] in names]
        assert len(todo) == len(names), f"unknown case in {names}"
        tmp = tempfile.mkdtemp()
        write_manifest([make_case(i, c, tmp) for i, c in todo])
        shutil.rmtree(tmp)
        return 0
    moe_only = sys.argv[1:] == ["--moe-only"]
    if not moe_only and os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT, exist_ok=True)
    manifest = []
    tmp = tempfile.mkdtemp()
    if not moe_only:
        for i, case in enumerate(CASES):
            manifest.append(make_case(i, case, tmp))
    for i, case in enumerate(MOE_CASES):
        manifest.append(make_case(len(CASES) + i, case, tmp))
    shutil.rmtree(tmp)
    if not moe_only:
        make_broken()
        make_te_variant()
        manifest.append(dict(name="llama_tp2_te", architecture="LlamaForCausalLM", tp=2, pp=1, vpp=1,
                             stage_layers=None, tied=False, original="llama_tp2",
                             note="llama_tp2 renamed to Transformer Engine keys (make_te_variant)"))
    make_moe_broken()
    make_te_moe_variant()
    manifest.append(dict(name="qwen2_moe_tp2_ep2_te", architecture="Qwen2MoeForCausalLM", tp=2, pp=1,
                         vpp=1, ep=2, stage_layers=None, tied=False, original="qwen2_moe_tp2_ep2",
                         note="qwen2_moe_tp2_ep2 renamed to TE GroupedMLP keys (make_te_moe_variant)"))
    write_manifest(manifest)
    print("NOTE: key names, shapes, stage/VPP/EP split and the list-of-state-dicts file come from "
          "megatron-core 0.12.2; the values are HF weights sliced by this script per the "
          "documented TP layout (see the module docstring).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
