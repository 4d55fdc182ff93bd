#!/usr/bin/env python3
"""Generate Megatron-Core dist_checkpointing (torch_dist) checkpoints in verl's layouts
(verl-checkpoints.md 3.1(c) "v1" and 3.1(d) "HEAD", 3.2).

    .venv/bin/pip install --no-deps megatron-core==0.12.2    # generators only (no test imports it), so not in tests/python-requirements.txt
    nice -n 10 .venv/bin/python tests/gen/make_mcore_dist_fixtures.py    # ~6 min on 2 cores
    nice -n 10 .venv/bin/python tests/gen/make_mcore_dist_fixtures.py qwen3_moe_ep2   # some cases
    python3 tests/gen/framework_matrix.py megatron-core-0.19.2   # version matrix (0.14.0 too): a
        # venv with that release, then --version-matrix (MATRIX_CASES into
        # tests/fixtures/matrix/megatron-core-<version>/mcore_dist/) here and in
        # make_megatron_fixtures.py; megatron-core >= 0.14 needs psutil for its writer

Cases: Qwen2 TP=2 (qkv bias), Llama PP=3 uneven (1, 2, 1 layers), tied Qwen3 TP=2 PP=2 (q/k
norm), Llama PP=2 VPP=2 (HEAD layout), and MoE with expert parallelism 2 (every layer MoE,
4 experts, top-2): Qwen3-MoE, Qwen2-MoE TP=2 (shared expert + its gate), Mixtral PP=2 (HEAD).

Layout written per case (tests/fixtures/mcore_dist/<case>/):
  v1:   dist_ckpt/            metadata.json, common.pt, .metadata, __R_0.distcp (torch_dist)
        huggingface/config.json
  HEAD: ckpt_contents.json    schema 2, contents.model = model/dist_ckpt (format
                              megatron_dist_checkpoint), as verl's _build_checkpoint_manifest
                              writes it for use_dist_checkpointing=True, use_mbridge=False
        model/dist_ckpt/      (model shards only)
        model/huggingface/config.json   (no weights)
  original/model.safetensors  the HF model's weights (ground truth), bf16, with the names
                              save_pretrained writes (per-expert names for MoE)

What is REAL and what is reproduced:
  * REAL (megatron-core 0.12.2 on CPU, gloo, one process per TP x PP x EP rank): parallel_state,
    GPTModel with the local layer spec and use_cpu_initialization=True (uneven PP through
    num_layers_in_{first,last}_pipeline_stage, VPP chunks through
    set_virtual_pipeline_model_parallel_rank), each chunk's model.sharded_state_dict() under
    "model" / "model{v}" as verl's _build_model_sharded_state_dict builds it, verl's rng_state
    ShardedObject (v1 cases: dist_ckpt holds it too), and
    MoE through the local spec's SequentialMLP (moe_grouped_gemm=False; its sharded keys
    mlp.experts.experts.linear_fc{1,2}.weight with an expert axis are those of verl's
    TEGroupedMLP), Qwen2-MoE's shared-expert gate switched on as verl's initializer does, and
    dist_checkpointing.save(state, dir, get_default_save_sharded_strategy("torch_dist")):
    every byte of dist_ckpt/ (sharded keys with the prepended layer axis, chunk offsets,
    apply_swiglu_sharded_factory's fc1 fragments, .metadata, .distcp items, common.pt,
    metadata.json) is megatron-core's and torch.distributed.checkpoint's.
  * REPRODUCED (not Megatron code): the VALUES, filled with make_megatron_fixtures.local_value
    (HF weights sliced per the documented mcore TP/EP layout, see that module's docstring;
    hf_model, COMMON and MOE come from there too).
  * Patches, all because this run has no GPU:
      - sequence_parallel is set while TransformerConfig validates TP x EP and cleared before
        the model is built (the local spec's torch norms refuse it; no state-dict change);
      - torch.Tensor.cuda is a no-op for the tied PP > 1 case (LanguageModule moves the shared
        output weight to CUDA before its all-reduce), as in make_megatron_fixtures.py;
      - torch.cuda.synchronize is a no-op (filesystem_async.py calls it before writing, even
        for CPU tensors);
      - torch.cuda.current_device returns "cpu" (async_utils.py sync_all_async_calls places the
        all-reduced "still writing" flag on it; the save itself is synchronous here);
      - megatron-core 0.12.2's filesystem_async calls torch's private _write_item without the
        serialization_format argument torch 2.8 added; such a call gets
        SerializationFormat.TORCH_SAVE, torch's own FileSystemWriter default (items are
        torch.save archives, formats.md 5.3). Calls that pass every argument (a
        megatron-core that knows it) and torch releases without it are left alone.
  * Deviations from verl: local layer spec (input_layernorm / pre_mlp_layernorm instead of TE's
    fused layer_norm_weight keys; no _extra_state ShardedObjects); no optimizer/lr_scheduler
    entries (verl's v1 dist_ckpt also holds them; ckfs skips every key outside the model);
    no FullyParallelSaveStrategyWrapper (DP = 1, or DP = EP replicas for MoE, deduplicated by
    torch_dist itself); no transformer_config.json or tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_megatron_fixtures as mg  # noqa: E402  (sets env, threads, warnings)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

OUT = os.path.join(mg.ROOT, "tests", "fixtures", "mcore_dist")
COMMON = mg.COMMON

# name, architecture, tp, pp, vpp, first/last stage layers (None = even), tied, layout, ep
CASES = [
    ("qwen2_tp2", "Qwen2ForCausalLM", 2, 1, 1, None, False, "v1", 1),
    ("llama_pp3_uneven", "LlamaForCausalLM", 1, 3, 1, (1, 1), False, "v1", 1),
    ("qwen3_tp2_pp2_tied", "Qwen3ForCausalLM", 2, 2, 1, None, True, "v1", 1),
    ("llama_pp2_vpp2_head", "LlamaForCausalLM", 1, 2, 2, None, False, "head", 1),
    # MoE, every layer: SequentialMLP experts (local spec). Its sharded keys are the ones
    # TEGroupedMLP writes (experts.py: "interchangable with SequentialMLP's").
    ("qwen3_moe_ep2", "Qwen3MoeForCausalLM", 1, 1, 1, None, False, "v1", 2),
    ("qwen2_moe_tp2_ep2", "Qwen2MoeForCausalLM", 2, 1, 1, None, False, "v1", 2),
    ("mixtral_pp2_ep2", "MixtralForCausalLM", 1, 2, 1, None, False, "head", 2),
]


# The megatron-core version matrix (issue #21): these cases, written by another megatron-core
# release, go to tests/fixtures/matrix/megatron-core-<version>/mcore_dist/<case>/: TP 2 (v1
# layout), uneven PP 3, and MoE at EP 2 (the expert axis of the sharded keys).
MATRIX_CASES = ["qwen2_tp2", "llama_pp3_uneven", "qwen3_moe_ep2"]


def dist_dir(outdir, layout):
    return os.path.join(outdir, "dist_ckpt" if layout == "v1" else os.path.join("model", "dist_ckpt"))


def worker(rank, case, port, sd_path, outdir):
    name, arch, tp, pp, vpp, uneven, tied, layout, ep = case
    # EP > 1: data parallel = EP for the dense part (replicas, written once by torch_dist)
    world = tp * pp * ep
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    torch.cuda.synchronize = lambda *a, **k: None  # see the docstring
    torch.cuda.current_device = lambda: "cpu"
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    import inspect
    from torch.distributed.checkpoint.filesystem import _write_item
    params = inspect.signature(_write_item).parameters
    if "serialization_format" in params:  # torch >= 2.7; megatron-core may predate it
        from torch.distributed.checkpoint.filesystem import SerializationFormat

        def write_item(*a, **k):
            if len(a) + len(k) < len(params):
                k["serialization_format"] = SerializationFormat.TORCH_SAVE
            return _write_item(*a, **k)
        filesystem_async._write_item = write_item
    if tied and pp > 1:
        torch.Tensor.cuda = lambda self, *a, **k: self
    ps.initialize_model_parallel(tp, pp, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
                                 expert_model_parallel_size=ep)
    extra = {}
    moe = "Moe" in arch or arch.startswith("Mixtral")
    if moe:
        extra.update(num_moe_experts=mg.MOE["num_experts"], moe_router_topk=mg.MOE["num_experts_per_tok"],
                     moe_ffn_hidden_size=(COMMON["intermediate_size"] if arch.startswith("Mixtral")
                                          else mg.MOE["moe_intermediate_size"]),
                     moe_grouped_gemm=False, expert_model_parallel_size=ep,
                     # required by TransformerConfig for TP x EP; switched off below (the local
                     # spec's torch norms refuse it); it does not change the state dict
                     sequence_parallel=tp > 1)
        if arch.startswith("Qwen2Moe"):
            extra["moe_shared_expert_intermediate_size"] = mg.MOE["shared_expert_intermediate_size"]
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
        layernorm_epsilon=COMMON["rms_norm_eps"], params_dtype=torch.bfloat16, bf16=True,
        activation_func=torch.nn.functional.silu, pipeline_dtype=torch.bfloat16, **extra)
    cfg.sequence_parallel = False
    spec = get_gpt_layer_local_spec(num_experts=mg.MOE["num_experts"] if moe else None,
                                    moe_grouped_gemm=False, qk_layernorm=qwen3, normalization="RMSNorm")
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
        glob = {j: layer.layer_number - 1 for j, layer in enumerate(m.decoder.layers)}
        with torch.no_grad():
            for key, p in m.state_dict(keep_vars=True).items():
                if key.endswith("_extra_state") or p is None:
                    continue
                g = glob[int(key.split(".")[2])] if key.startswith("decoder.layers.") else None
                experts = etp = None
                if ".mlp.experts." in key:
                    experts = m.decoder.layers[int(key.split(".")[2])].mlp.local_expert_indices
                    # (expert tensor parallel size, rank), as local_value takes it
                    etp = (ps.get_expert_tensor_parallel_world_size(), ps.get_expert_tensor_parallel_rank())
                val = mg.local_value(key, g, hf_sd, arch, tp, tp_rank, tuple(p.shape), experts, etp)
                assert tuple(val.shape) == tuple(p.shape), (key, val.shape, p.shape)
                p.copy_(val)
        chunks.append(Float16Module(cfg, m))
    # verl's _build_model_sharded_state_dict: one entry per VPP chunk, the VPP rank set while
    # each chunk computes its global layer offsets.
    state = {}
    for v, c in enumerate(chunks):
        if vpp > 1:
            ps.set_virtual_pipeline_model_parallel_rank(v)
        state[f"model{v}" if vpp > 1 else "model"] = c.sharded_state_dict()
    if layout == "v1":
        # verl's get_rng_state(use_dist_ckpt=True): a ShardedObject per (pp, tp) rank
        state["rng_state"] = ShardedObject("rng_state", [{"torch_rng_state": torch.get_rng_state()}],
                                           (pp, tp), (pp_rank, tp_rank),
                                           replica_id=ps.get_data_parallel_rank(with_context_parallel=True))
    d = dist_dir(outdir, layout)
    if rank == 0:
        os.makedirs(d, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(state, d, sharded_strategy=get_default_save_sharded_strategy("torch_dist"))
    dist.barrier()
    dist.destroy_process_group()


def head_manifest(arch, world):
    """ckpt_contents.json as verl's _build_checkpoint_manifest writes it for
    use_dist_checkpointing=True, use_mbridge=False, save_contents [model] (json.dump, indent=2,
    sort_keys=True)."""
    return {
        "schema_version": 2, "framework": "megatron", "role": "actor", "arch": arch,
        "global_step": 1, "world_size": world,
        "backend": {"has_bridge": False, "use_dist_checkpointing": True, "peft": False},
        "save_contents": ["model"],
        "contents": {"model": {"path": "model/dist_ckpt", "format": "megatron_dist_checkpoint",
                               "backend": "dist_checkpointing"}},
        "directories": {"model/dist_ckpt": "Megatron dist_checkpointing shards for model weights "
                                           "(or PEFT adapter shards when mbridge is enabled)."},
        "saved_any_dist_ckpt": True,
    }


def main():
    from safetensors.torch import load_file, save_file
    global OUT
    only = sys.argv[1:]  # case names to (re)generate; all when empty
    if only == ["--version-matrix"]:
        OUT = mg.matrix_dir("mcore_dist")
        print(f"version matrix: megatron-core {mg.mcore_version()}, torch {torch.__version__} -> {OUT}")
        shutil.rmtree(OUT, ignore_errors=True)
        only = MATRIX_CASES
    os.makedirs(OUT, exist_ok=True)
    manifest = []
    tmp = tempfile.mkdtemp()
    if only and os.path.exists(os.path.join(OUT, "MANIFEST.json")):
        with open(os.path.join(OUT, "MANIFEST.json")) as f:
            manifest = [c for c in json.load(f)["cases"] if c["name"] not in only]
    for i, case in enumerate(CASES):
        name, arch, tp, pp, vpp, uneven, tied, layout, ep = case
        if only and name not in only:
            continue
        shutil.rmtree(os.path.join(OUT, name), ignore_errors=True)
        model = mg.hf_model(arch, tied, 3000 + i)
        outdir = os.path.join(OUT, name)
        os.makedirs(os.path.join(outdir, "original"))
        hf = os.path.join(outdir, "huggingface" if layout == "v1" else os.path.join("model", "huggingface"))
        model.config.save_pretrained(hf)
        # the names save_pretrained writes (transformers 5 fuses MoE experts in memory and
        # unfuses them on save), i.e. what verl's merger and ckfs emit
        model.save_pretrained(os.path.join(tmp, name + "_hf"))
        sd = load_file(os.path.join(tmp, name + "_hf", "model.safetensors"))
        if tied:
            sd.pop("lm_head.weight", None)
        save_file(sd, os.path.join(outdir, "original", "model.safetensors"), metadata={"format": "pt"})
        sd_path = os.path.join(tmp, name + ".pt")
        torch.save(sd, sd_path)
        mp.spawn(worker, args=(case, 29800 + i, sd_path, outdir), nprocs=tp * pp * ep, join=True)
        if layout == "head":
            with open(os.path.join(outdir, "ckpt_contents.json"), "w") as f:
                json.dump(head_manifest(arch, tp * pp * ep), f, indent=2, sort_keys=True)
        files = sorted(os.listdir(dist_dir(outdir, layout)))
        manifest.append(dict(name=name, architecture=arch, layout=layout, tp=tp, pp=pp, vpp=vpp, ep=ep,
                             stage_layers=list(uneven) if uneven else None, tied=tied,
                             dist_ckpt_files=files, tensors=list(sd.keys())))
        print(f"{name}: {arch} {layout} tp={tp} pp={pp} vpp={vpp} ep={ep} tied={tied} files={files}")
    shutil.rmtree(tmp)
    with open(os.path.join(OUT, "MANIFEST.json"), "w") as f:
        json.dump(dict(generator="tests/gen/make_mcore_dist_fixtures.py",
                       versions={"torch": torch.__version__, "megatron-core": mg.mcore_version()},
                       cases=sorted(manifest, key=lambda c: [x[0] for x in CASES].index(c["name"]))),
                  f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
