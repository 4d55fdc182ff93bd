#!/usr/bin/env python3
"""Generate legacy Megatron per-rank checkpoints (verl 2025-04 .. 2025-06 layout, verl-checkpoints.md 3.1(b)).

    .venv/bin/pip install --no-deps megatron-core==0.12.2    # pinned in tests/python-requirements.txt
    .venv/bin/python tests/gen/make_megatron_fixtures.py      # ~90 s on 2 cores
    .venv/bin/python tests/gen/make_megatron_fixtures.py --broken-only   # broken/, llama_tp2_te/
    .venv/bin/python tests/gen/make_megatron_fixtures.py --self-check    # Megatron forward
        # of TP=2 Llama/Qwen2/Qwen3 filled like the fixtures vs transformers' logits

Layout written per case (tests/fixtures/megatron/<case>/):
    model/mp_rank_{tp:02d}/model.pt            (PP = 1)
    model/mp_rank_{tp:02d}_{pp:03d}/model.pt   (PP > 1)
        torch.save of a Python LIST, one model.state_dict() per virtual-pipeline chunk
    hf_config_and_tokenizer/config.json        the HF config (save_pretrained)
    original/model.safetensors                 the HF model's weights (ground truth), bf16

What is REAL and what is reproduced:
  * REAL (megatron-core 0.12.2 on CPU, gloo, one process per TP x PP rank):
    parallel_state.initialize_model_parallel(tp, pp, virtual_pipeline_model_parallel_size),
    GPTModel built with the local (non Transformer-Engine) layer spec and
    use_cpu_initialization=True, uneven PP through num_layers_in_{first,last}_pipeline_stage,
    VPP chunks through set_virtual_pipeline_model_parallel_rank; the saved object is exactly
    [m.state_dict() for m in model_chunks] (key names, local layer numbering, TP-local shapes,
    _extra_state entries, which stage holds embedding/output layer) via torch.save.
  * REPRODUCED here (not Megatron code): the VALUES. Each rank's parameters are overwritten in
    place with slices of the HF model following the documented mcore TP layout (QKV grouped per
    query group [q r*d; k d; v d], fc1 per rank [gate_tp; up_tp], column-parallel on dim 0,
    row-parallel linear_proj/linear_fc2 on dim 1, vocab-parallel embedding/output on dim 0,
    norms replicated). The global layer of each local layer is Megatron's own
    layer.layer_number - 1. verl's hf->mcore loader did the same thing.
  * llama_tp2_te/ renames llama_tp2's keys to Transformer Engine's (see make_te_variant).
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

# name, architecture, tp, pp, vpp, first/last stage layers (None = even), tied
CASES = [
    ("llama_tp2", "LlamaForCausalLM", 2, 1, 1, None, False),
    ("qwen2_tp2_pp2", "Qwen2ForCausalLM", 2, 2, 1, None, False),
    ("qwen3_pp3_uneven", "Qwen3ForCausalLM", 1, 3, 1, (1, 1), False),
    ("llama_tied_pp2_vpp2", "LlamaForCausalLM", 1, 2, 2, None, True),
]


def hf_model(arch, tied, seed, init=0.02):
    import transformers
    cls = getattr(transformers, arch)
    cfg_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    cfg = cfg_cls(**COMMON, tie_word_embeddings=tied, torch_dtype="bfloat16", architectures=[arch],
                  initializer_range=init)
    torch.manual_seed(seed)
    model = cls(cfg).to(torch.bfloat16)
    # non-trivial norms so a swapped norm is caught
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if "norm" in n else 0.0))
    return model


def local_value(key, global_layer, sd, arch, tp, tp_rank, shape):
    """The TP-local value of Megatron key (local layer index already mapped to global_layer)."""
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
    raise KeyError(key)


def worker(rank, case, port, sd_path, outdir, self_check=False):
    name, arch, tp, pp, vpp, uneven, tied = case
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(tp * pp))
    dist.init_process_group("gloo", rank=rank, world_size=tp * pp)
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    if tied and pp > 1:
        # LanguageModule.setup_embeddings_and_output_layer moves the shared output weight to
        # CUDA before its all-reduce; on this CPU-only run it stays on CPU (gloo reduces it).
        torch.Tensor.cuda = lambda self, *a, **k: self
    ps.initialize_model_parallel(tp, pp, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None)
    extra = {}
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
    spec = get_gpt_layer_local_spec(qk_layernorm=qwen3, normalization="RMSNorm")
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
                val = local_value(key, g, hf_sd, arch, tp, tp_rank, tuple(p.shape))
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
    sub = f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    path = os.path.join(outdir, "model", sub)
    os.makedirs(path, exist_ok=True)
    torch.save([c.state_dict() for c in chunks], os.path.join(path, "model.pt"))
    dist.barrier()
    dist.destroy_process_group()


def make_broken():
    """Broken rank files derived from llama_tp2 (the unit test swaps them in):
    broken/tp_mismatch_rank1.pt  rank 1 with every TP-sharded tensor halved, i.e. the local
                                 shapes a TP=4 rank would hold
    broken/unknown_key_rank0.pt  rank 0 plus a MoE router key ckfs does not map
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
    extra[0]["decoder.layers.0.mlp.router.weight"] = torch.zeros(4, 64, dtype=torch.bfloat16)
    torch.save(extra, os.path.join(bdir, "unknown_key_rank0.pt"))
    torch.save(r0[0], os.path.join(bdir, "dict_rank0.pt"))


def self_check():
    """TP=2 PP=1 of each architecture: Megatron's forward vs transformers' (bf16, so close,
    not equal; a wrong layout gives unrelated logits)."""
    ids = torch.tensor([[1, 17, 42, 7, 97, 5, 23, 64, 2, 50, 11, 96]])
    ok = True
    for i, arch in enumerate(["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]):
        tmp = tempfile.mkdtemp()
        model = hf_model(arch, False, 2000 + i, init=0.15)  # big weights: every layer matters
        sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        torch.save(sd, os.path.join(tmp, "sd.pt"))
        case = ("check", arch, 2, 1, 1, None, False)
        mp.spawn(worker, args=(case, 29700 + i, os.path.join(tmp, "sd.pt"), tmp, True), nprocs=2, join=True)
        got = torch.load(os.path.join(tmp, "megatron_logits.pt"))
        with torch.no_grad():
            want = model(input_ids=ids).logits.float()
        diff = (got - want).abs().max().item()
        scale = want.abs().max().item()
        good = diff < 0.1 * scale  # bf16 runs: ~3% apart; a wrong layout: ~100%
        ok &= good
        print(f"self-check {arch} TP=2: max |megatron - transformers| = {diff:.4f} "
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


def main():
    from safetensors.torch import save_file
    if sys.argv[1:] == ["--broken-only"]:
        make_broken()
        make_te_variant()
        return 0
    if sys.argv[1:] == ["--self-check"]:
        return self_check()
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    manifest = []
    tmp = tempfile.mkdtemp()
    for i, case in enumerate(CASES):
        name, arch, tp, pp, vpp, uneven, tied = case
        model = hf_model(arch, tied, 1000 + i)
        outdir = os.path.join(OUT, name)
        os.makedirs(os.path.join(outdir, "original"))
        model.config.save_pretrained(os.path.join(outdir, "hf_config_and_tokenizer"))
        sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        if tied:
            sd.pop("lm_head.weight", None)
        save_file(sd, os.path.join(outdir, "original", "model.safetensors"), metadata={"format": "pt"})
        sd_path = os.path.join(tmp, name + ".pt")
        torch.save(sd, sd_path)
        mp.spawn(worker, args=(case, 29600 + i, sd_path, outdir), nprocs=tp * pp, join=True)
        manifest.append(dict(name=name, architecture=arch, tp=tp, pp=pp, vpp=vpp,
                             stage_layers=list(uneven) if uneven else None, tied=tied,
                             tensors=list(sd.keys())))
        print(f"{name}: {arch} tp={tp} pp={pp} vpp={vpp} tied={tied}")
    shutil.rmtree(tmp)
    make_broken()
    make_te_variant()
    manifest.append(dict(name="llama_tp2_te", architecture="LlamaForCausalLM", tp=2, pp=1, vpp=1,
                         stage_layers=None, tied=False, original="llama_tp2",
                         note="llama_tp2 renamed to Transformer Engine keys (make_te_variant)"))
    with open(os.path.join(OUT, "MANIFEST.json"), "w") as f:
        json.dump(dict(generator="tests/gen/make_megatron_fixtures.py",
                       versions={"torch": torch.__version__, "megatron-core": "0.12.2"},
                       cases=manifest), f, indent=1)
    print("NOTE: key names, shapes, stage/VPP split and the list-of-state-dicts file come from "
          "megatron-core 0.12.2; the values are HF weights sliced by this script per the "
          "documented TP layout (see the module docstring).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
