#!/usr/bin/env python3
"""Generate real verl 0.9.1 FSDP checkpoints of LoRA actors, vision-language models and fused-MoE LLMs.

Every checkpoint here is written by verl's own FSDPEngine (verl/workers/engine/fsdp/transformer_impl.py)
and its FSDPCheckpointManager, running on the CPU over gloo; every expected output is written by verl's
own merger (`python -m verl.model_merger merge --backend fsdp`). Packages: tests/python-requirements.txt
plus torchvision 0.23.0 (the build matching torch 2.8.0, which the VLM processors import), installed
without dependencies:

    /root/.cache/ckfs/venv/bin/pip install --no-deps torchvision==0.23.0
    /root/.cache/ckfs/venv/bin/python tests/gen/make_lora_vlm_fixtures.py               # all cases
    /root/.cache/ckfs/venv/bin/python tests/gen/make_lora_vlm_fixtures.py --only qwen2_vl_fsdp2_w2
    /root/.cache/ckfs/venv/bin/python tests/gen/make_lora_vlm_fixtures.py --list

Each case is regenerated alone with --only NAME (repeatable); the manifest keeps the other records.
The fused-MoE cases are also written with transformers 5.23.0 (verl 0.9.1 unchanged; the release put
ahead of the venv's, from the cache) into their own root:

    .../python tests/gen/make_lora_vlm_fixtures.py --transformers 5.23.0 \
        --out tests/fixtures/transformers-5.23.0 --only deepseek_v3_fsdp2_w2 ...

Outputs (relative to tests/fixtures/):
    lora/<case>/, vlm/<case>/, moe_fsdp/<case>/   the actor checkpoint folder exactly as verl wrote it:
                      model_world_size_W_rank_R.pt, optim_world_size_W_rank_R.pt,
                      extra_state_world_size_W_rank_R.pt, fsdp_config.json, huggingface/,
                      lora_train_meta.json (LoRA, unless the case removes it)
    expected_lora/<case>/   verl merger output (model.safetensors, config.json,
                      lora_adapter/adapter_model.safetensors, lora_adapter/adapter_config.json),
                      merger.log (its stdout+stderr, paths replaced), and the fused oracles:
                      base_fp32.safetensors  the frozen base weights (HF names, fp32)
                      fused_fp32.safetensors peft merge_and_unload() of base + the trained adapter (fp32)
    expected_vlm/<case>/, expected_moe/<case>/   verl merger output: model.safetensors, config.json,
                      generation_config.json, processor / tokenizer files, merger.log
    MANIFEST_lora_vlm.json  one record per case: model, engine settings, per-tensor rank layout,
                      merger result

How verl is run, and what is patched (all forced by the CPU; nothing changes what is saved):
  * verl has no CPU platform: a platform subclassing verl's CUDA platform whose device is "cpu"
    (current_device() = torch.device("cpu"), communication backend gloo) is installed with
    verl.plugin.platform.set_platform before the engine module is imported.
  * FSDP1 with sync_module_states=True refuses CPU modules in
    torch.distributed.fsdp._init_utils._check_module_states_for_sync_module_states: no-op (the gloo
    broadcast it guards works on CPU).
  * verl.utils.profiler.performance._get_current_mem_info calls torch.cuda.mem_get_info: returns zeros.
  * load_fsdp_model_to_gpu (called by FSDPEngine.save_checkpoint) builds the device "cpu:cpu" for
    FSDP1: no-op (the model already lives on the CPU).
  * HFModelConfig asks transformers for flash_attention_2: override_config sets attn_implementation
    "sdpa". verl's checkpoint manager serialises it: huggingface/config.json says
    "attn_implementation": "sdpa" where a GPU run says "flash_attention_2"; the merger drops the key.
  * use_remove_padding=False and use_torch_compile=False (flash-attn varlen patches and inductor are
    GPU-only); they change no saved tensor.
  * Training steps: verl's forward_backward_batch needs its rollout TensorDict; here each step calls
    the wrapped module directly under bf16 autocast exactly as FSDPEngineWithLMHead.forward_step
    does, takes a next-token cross-entropy loss, and then calls verl's own engine.optimizer_step()
    (grad clipping + AdamW) and engine.lr_scheduler_step(). Only LoRA cases train (peft starts every
    lora_B at zero, so an untrained adapter fuses to the base); VLM and MoE cases save the seeded
    initial weights.
  * use_rslora: verl 0.9.1's engine builds LoraConfig(task_type, r, lora_alpha, target_modules,
    target_parameters, exclude_modules, bias) and has no rslora switch; the rslora case wraps
    peft.LoraConfig inside transformer_impl to add use_rslora=True (the only way such a
    checkpoint exists with verl 0.9.1).
  * no lora_train_meta.json case: verl 0.9.1 always writes it for a peft model; the file is
    removed after saving, as checkpoints from verl before PR #5326 lack it.
  * verl 0.9.1's FSDP engine writes no lora_adapter/ folder inside the checkpoint (the legacy
    fsdp_workers.py that wrote one is gone); only the merger writes lora_adapter/.
  * Weights: the "pretrained" source folder is written in fp32 from seeded values (stable crc32
    seeds, independent of the rank and of torch's RNG), so fp32 master weights do not sit on bf16
    values and the merger's rounding is exercised. Spawned ranks seed torch from the case name.
  * Rank files record the tensors' location as "cpu" (on GPUs FSDP2 files say "cuda:N").

Not patched, and so kept as verl 0.9.1 does it: verl's hf_processor() supports no Gemma3Processor
("Unsupported processor type", caught, processor None), so the Gemma 3 checkpoint and merger output
carry the tokenizer files but no processor_config.json.

Reproducibility: tensors and every file other than model_*.pt / optim_*.pt are identical on every
run. Those two also pickle cached hash integers of DeviceMesh / DTensorSpec (plus the zip's
.data/serialization_id), which depend on the heap layout: the same command run twice in the same
environment rewrote them byte-identically (checked with --only qwen3_moe_fsdp2_w2), while another
command line or an edited generator changes those integers only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib


def transformers_overlay(version):
    """A folder holding transformers VERSION and the packages it requires newer than the venv's
    (pip --target, in the cache), put ahead of the venv on PYTHONPATH: verl 0.9.1 pins
    transformers < 5.11, so a later release can only be run beside it this way."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gen_cache import CACHE, cached

    def build(tmp):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--target", tmp, f"transformers=={version}"], check=True)
        for d in os.listdir(tmp):  # the venv's own torch, verl and numpy stay in charge
            if re.match(r"(torch|numpy|verl)[-_.]", d) or d in ("torch", "numpy", "verl"):
                shutil.rmtree(os.path.join(tmp, d))
    return cached(os.path.join(CACHE, f"transformers-{version}-overlay"), f"transformers=={version}", build)


# Byte-reproducible rank files need a fixed hash seed (DeviceMesh/DTensorSpec pickle a cached hash)
# and no address randomisation; re-exec once like make_fixtures.py does.
if os.environ.get("CKFS_GEN_REEXEC") != "1":
    env = dict(os.environ, PYTHONHASHSEED="0", CKFS_GEN_REEXEC="1")
    if "--transformers" in sys.argv[:-1]:
        overlay = transformers_overlay(sys.argv[sys.argv.index("--transformers") + 1])
        env["PYTHONPATH"] = overlay + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable] + sys.argv
    setarch = shutil.which("setarch")
    if setarch and subprocess.run([setarch, os.uname().machine, "-R", "true"],
                                  stderr=subprocess.DEVNULL).returncode == 0:
        argv = [setarch, os.uname().machine, "-R"] + argv
    os.execve(argv[0], argv, env)

for _k, _v in dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", USE_LIBUV="0", TOKENIZERS_PARALLELISM="false",
                   OMP_NUM_THREADS="1", VERL_LOGGING_LEVEL="WARN", HF_HUB_DISABLE_PROGRESS_BARS="1",
                   TRANSFORMERS_VERBOSITY="error", TORCH_CPP_LOG_LEVEL="ERROR", CUDA_VISIBLE_DEVICES="").items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402

torch.set_num_threads(1)

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
MANIFEST = "MANIFEST_lora_vlm.json"

# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------
# Vocab sizes are primes, so never divisible by a world size (uneven Shard(0) of the embeddings).
# Expert widths keep 2*F != hidden, so a transposed expert stack cannot pass for the right one.
QWEN2 = dict(arch="qwen2", vocab_size=131, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
LLAMA = dict(arch="llama", vocab_size=127, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
ATTN_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
VLM_VOCAB = 53


def lora_case(name, model, strategy, world, tied, r, alpha, targets, meta=True, rslora=False, lora_only=False,
              desc=""):
    return dict(name=name, kind="lora", model=model, strategy=strategy, world_size=world, tied=tied,
                lora=dict(r=r, lora_alpha=alpha, target_modules=targets, use_rslora=rslora),
                keep_meta=meta, save_lora_only=lora_only, train_steps=3, description=desc)


def vlm_case(name, arch, tied, desc=""):
    return dict(name=name, kind="vlm", model=dict(arch=arch), strategy="fsdp2", world_size=2, tied=tied,
                lora=None, keep_meta=True, save_lora_only=False, train_steps=0, description=desc)


def moe_case(name, arch, desc="", attn="sdpa"):
    return dict(name=name, kind="moe", model=dict(arch=arch), strategy="fsdp2", world_size=2, tied=False,
                lora=None, keep_meta=True, save_lora_only=False, train_steps=0, description=desc, attn=attn)


CASES = [
    lora_case("lora_qwen2_fsdp2_w2", QWEN2, "fsdp2", 2, True, 8, 16, ATTN_MLP,
              desc="FSDP2 W=2, Qwen2 with tied embeddings, LoRA r=8 alpha=16 on attention+MLP, "
                   "3 AdamW steps, lora_train_meta.json as verl 0.9.1 writes it"),
    lora_case("lora_llama_fsdp1_w3", LLAMA, "fsdp", 3, False, 8, 32, "all-linear",
              desc="FSDP1 W=3 (LoRA lambda wrap policy), Llama untied, LoRA r=8 alpha=32 target 'all-linear' "
                   "(verl's default), 3 AdamW steps"),
    lora_case("lora_qwen2_fsdp2_w2_nometa", QWEN2, "fsdp2", 2, False, 4, 12, ATTN_MLP, meta=False,
              desc="FSDP2 W=2, Qwen2 untied, LoRA r=4 alpha=12; lora_train_meta.json removed (pre-#5326 "
                   "checkpoint): verl's merger then writes lora_alpha=0"),
    lora_case("lora_qwen2_fsdp2_w2_rslora", QWEN2, "fsdp2", 2, False, 8, 16, ATTN_MLP, rslora=True,
              desc="FSDP2 W=2, LoRA r=8 alpha=16 with use_rslora=True (scale alpha/sqrt(r)); verl records "
                   "no rslora flag anywhere"),
    lora_case("lora_qwen2_fsdp2_w2_loraonly", QWEN2, "fsdp2", 2, False, 8, 16, ATTN_MLP, lora_only=True,
              desc="FSDP2 W=2, checkpoint.save_lora_only=True: rank files hold only lora_A/lora_B"),
    vlm_case("qwen2_vl_fsdp2_w2", "qwen2_vl", False, desc="Qwen2-VL tiny, FSDP2 W=2"),
    vlm_case("qwen2_5_vl_fsdp2_w2", "qwen2_5_vl", True, desc="Qwen2.5-VL tiny, tied embeddings, FSDP2 W=2"),
    vlm_case("qwen3_vl_fsdp2_w2", "qwen3_vl", False, desc="Qwen3-VL tiny (deepstack merger), FSDP2 W=2"),
    vlm_case("qwen3_vl_moe_fsdp2_w2", "qwen3_vl_moe", False,
             desc="Qwen3-VL-MoE tiny, 3 fused experts per layer, FSDP2 W=2"),
    vlm_case("gemma3_fsdp2_w2", "gemma3", True, desc="Gemma 3 tiny (SigLIP tower), tied embeddings, FSDP2 W=2"),
    moe_case("qwen3_moe_fsdp2_w2", "qwen3_moe",
             desc="Qwen3-MoE tiny, 3 experts (uneven Shard(0) of the fused stacks), FSDP2 W=2"),
    moe_case("mixtral_fsdp2_w2", "mixtral", desc="Mixtral tiny, 4 experts, FSDP2 W=2"),
    # The fused-expert architectures of issue 36: how each is saved comes from transformers'
    # conversion mapping (tests/gen/make_experts_table.py), checked here against verl's merger.
    moe_case("deepseek_v3_fsdp2_w2", "deepseek_v3",
             desc="DeepSeek-V3 tiny: MLA (q and kv LoRA ranks), layer 0 dense (first_k_dense_replace=1), "
                  "layer 1 with 4 routed experts, a shared expert and e_score_correction_bias, FSDP2 W=2"),
    moe_case("deepseek_v3_qproj_fsdp2_w2", "deepseek_v3_qproj",
             desc="DeepSeek-V3 tiny without q LoRA (q_proj, V2-Lite's shape), qk_nope_head_dim and "
                  "kv_lora_rank 32, layer 0 dense, layer 1 with 4 routed experts, FSDP2 W=2"),
    moe_case("glm4_moe_fsdp2_w2", "glm4_moe",
             desc="GLM-4.5 tiny: layer 0 dense, layer 1 with 4 routed experts and a shared expert, q/k norm, "
                  "FSDP2 W=2"),
    moe_case("gpt_oss_fsdp2_w2", "gpt_oss", attn="eager",
             desc="gpt-oss tiny: 4 experts with interleaved gate_up_proj [E, H, 2I] and expert biases, "
                  "attention sinks, sliding and full layers, FSDP2 W=2 (eager attention on the CPU)"),
    moe_case("qwen3_next_fsdp2_w2", "qwen3_next",
             desc="Qwen3-Next tiny: a gated DeltaNet layer and a full-attention layer, 4 experts and a "
                  "gated shared expert each, FSDP2 W=2"),
    moe_case("llama4_text_fsdp2_w2", "llama4_text",
             desc="Llama 4 text tiny: fused experts under feed_forward with a shared expert, FSDP2 W=2"),
    moe_case("qwen2_moe_fsdp2_w2", "qwen2_moe",
             desc="Qwen2-MoE tiny: 4 experts and a gated shared expert, FSDP2 W=2"),
    moe_case("olmoe_fsdp2_w2", "olmoe", desc="OLMoE tiny: 4 experts, FSDP2 W=2"),
    moe_case("minimax_fsdp2_w2", "minimax",
             desc="MiniMax-Text tiny: a lightning (linear) attention layer and a full one, 4 experts "
                  "under block_sparse_moe on disk, FSDP2 W=2"),
]
KIND_DIRS = {"lora": ("lora", "expected_lora"), "vlm": ("vlm", "expected_vlm"), "moe": ("moe_fsdp", "expected_moe")}

TOKENIZER_WORDS = ["hello", "world", "the", "a", "model", "checkpoint", "merge", "shard", "tensor",
                   "verl", "fsdp", "user", "assistant", "system", "is", "good", "!", "?", ".", ","]
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]
# VLM tokenizers also carry the vision placeholders; ids are fixed by this order.
VISION_SPECIAL = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
                  "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' ' + message['content'] "
                 "+ ' <|im_end|> ' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|> assistant ' }}"
                 "{% endif %}")


def log(*a):
    print(*a, flush=True)


def stable_seed(*parts) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


def token_id(tok):
    return (SPECIAL + VISION_SPECIAL + TOKENIZER_WORDS).index(tok)


# --------------------------------------------------------------------------------------------
# Source folder: what verl's actor is loaded from
# --------------------------------------------------------------------------------------------
def build_tokenizer(vision: bool, gemma: bool = False):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = SPECIAL + (VISION_SPECIAL if vision else [])
    vocab = {w: i for i, w in enumerate(specials + TOKENIZER_WORDS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    kw = dict(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
              additional_special_tokens=specials[4:], model_max_length=128)
    if gemma:
        kw["extra_special_tokens"] = {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                                      "eoi_token": "<end_of_image>"}
    tok = PreTrainedTokenizerFast(**kw)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_processor(arch):
    import transformers

    if arch == "gemma3":
        return transformers.Gemma3Processor(
            image_processor=transformers.Gemma3ImageProcessor(size={"height": 28, "width": 28}),
            tokenizer=build_tokenizer(True, gemma=True), chat_template=CHAT_TEMPLATE, image_seq_length=4)
    proc = {"qwen2_vl": transformers.Qwen2VLProcessor, "qwen2_5_vl": transformers.Qwen2_5_VLProcessor,
            "qwen3_vl": transformers.Qwen3VLProcessor, "qwen3_vl_moe": transformers.Qwen3VLProcessor}[arch]
    video = transformers.Qwen3VLVideoProcessor if arch.startswith("qwen3") else transformers.Qwen2VLVideoProcessor
    image_kw = dict(patch_size=16) if arch.startswith("qwen3") else {}
    return proc(image_processor=transformers.Qwen2VLImageProcessor(**image_kw), tokenizer=build_tokenizer(True),
                video_processor=video(**image_kw), chat_template=CHAT_TEMPLATE)


def text_dims(**extra):
    d = dict(vocab_size=VLM_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6)
    d.update(extra)
    return d


def vision_ids():
    return dict(image_token_id=token_id("<|image_pad|>"), video_token_id=token_id("<|video_pad|>"),
                vision_start_token_id=token_id("<|vision_start|>"), vision_end_token_id=token_id("<|vision_end|>"))


def hf_config(spec):
    import transformers

    m = dict(spec["model"])
    arch = m.pop("arch")
    tied = spec["tied"]
    mrope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}
    mrope3 = dict(mrope, mrope_interleaved=True)
    qwen3_vision = dict(depth=2, hidden_size=16, intermediate_size=32, out_hidden_size=32, num_heads=2,
                        patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                        deepstack_visual_indexes=[0], in_channels=3)
    if arch in ("qwen2", "llama"):
        cls = transformers.Qwen2Config if arch == "qwen2" else transformers.LlamaConfig
        extra = dict(use_sliding_window=False) if arch == "qwen2" else {}
        c = cls(max_position_embeddings=128, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2,
                pad_token_id=0, rms_norm_eps=1e-6, rope_theta=10000.0, **extra, **m)
        c.architectures = ["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"]
        return c
    if arch == "qwen2_vl":
        c = transformers.Qwen2VLConfig(
            text_config=text_dims(rope_parameters=mrope, tie_word_embeddings=tied),
            vision_config=dict(depth=2, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14,
                               spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
            tie_word_embeddings=tied, **vision_ids())
        c.architectures = ["Qwen2VLForConditionalGeneration"]
    elif arch == "qwen2_5_vl":
        c = transformers.Qwen2_5_VLConfig(
            text_config=text_dims(rope_parameters=mrope, tie_word_embeddings=tied),
            vision_config=dict(depth=2, hidden_size=16, intermediate_size=32, out_hidden_size=32, num_heads=2,
                               patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                               fullatt_block_indexes=[1], in_channels=3),
            tie_word_embeddings=tied, **vision_ids())
        c.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    elif arch == "qwen3_vl":
        c = transformers.Qwen3VLConfig(text_config=text_dims(head_dim=8, rope_parameters=mrope3),
                                       vision_config=qwen3_vision, tie_word_embeddings=tied, **vision_ids())
        c.architectures = ["Qwen3VLForConditionalGeneration"]
    elif arch == "qwen3_vl_moe":
        c = transformers.Qwen3VLMoeConfig(
            text_config=text_dims(head_dim=8, rope_parameters=mrope3, num_experts=3, num_experts_per_tok=2,
                                  moe_intermediate_size=8, decoder_sparse_step=1, mlp_only_layers=[]),
            vision_config=qwen3_vision, tie_word_embeddings=tied, **vision_ids())
        c.architectures = ["Qwen3VLMoeForConditionalGeneration"]
    elif arch == "gemma3":
        c = transformers.Gemma3Config(
            text_config=text_dims(head_dim=8, query_pre_attn_scalar=8, sliding_window=16,
                                  layer_types=["sliding_attention", "full_attention"]),
            vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                               image_size=28, patch_size=14, vision_use_head=False),
            mm_tokens_per_image=4, boi_token_index=token_id("<start_of_image>"),
            eoi_token_index=token_id("<end_of_image>"), image_token_index=token_id("<image_soft_token>"),
            tie_word_embeddings=tied)
        c.architectures = ["Gemma3ForConditionalGeneration"]
    elif arch == "qwen3_moe":
        c = transformers.Qwen3MoeConfig(**text_dims(head_dim=8, num_experts=3, num_experts_per_tok=2,
                                                    moe_intermediate_size=8, decoder_sparse_step=1,
                                                    mlp_only_layers=[], tie_word_embeddings=False,
                                                    bos_token_id=1, eos_token_id=2, pad_token_id=0))
        c.architectures = ["Qwen3MoeForCausalLM"]
    elif arch == "mixtral":
        c = transformers.MixtralConfig(**text_dims(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                                                   tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                                                   pad_token_id=0))
        c.architectures = ["MixtralForCausalLM"]
    elif arch in MOE_CONFIGS:
        cls_name, arch_name, extra = MOE_CONFIGS[arch]
        c = getattr(transformers, cls_name)(**text_dims(**extra, tie_word_embeddings=False, bos_token_id=1,
                                                        eos_token_id=2, pad_token_id=0))
        c.architectures = [arch_name]
    else:
        raise ValueError(arch)
    return c


# config class, architecture, the arguments beyond text_dims(): 4 experts of width 8, 2 layers.
MOE_CONFIGS = {
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(moe_intermediate_size=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                         n_group=1, topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16,
                         qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, num_key_value_heads=4)),
    # DeepSeek-V2-Lite's attention shape (q_proj, no q LoRA) with heads wide enough for whole q8_0
    # blocks in the GGUF view's split kv_b_proj (tests/py/test_gguf_deepseek2.py)
    "deepseek_v3_qproj": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                          dict(moe_intermediate_size=8, n_routed_experts=4, n_shared_experts=1,
                               num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                               kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=32,
                               v_head_dim=32, num_key_value_heads=4)),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                 dict(moe_intermediate_size=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                      n_group=1, topk_group=1, first_k_dense_replace=1, use_qk_norm=True)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(intermediate_size=8, num_local_experts=4, num_experts_per_tok=2, head_dim=8,
                     sliding_window=8, layer_types=["sliding_attention", "full_attention"])),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   dict(head_dim=8, moe_intermediate_size=8, shared_expert_intermediate_size=8, num_experts=4,
                        num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
                        linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
                        linear_num_key_heads=2, linear_num_value_heads=4,
                        layer_types=["linear_attention", "full_attention"])),
    "llama4_text": ("Llama4TextConfig", "Llama4ForCausalLM",
                    dict(head_dim=8, intermediate_size=8, intermediate_size_mlp=64, num_local_experts=4,
                         num_experts_per_tok=1, interleave_moe_layer_step=1, attention_chunk_size=16)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(moe_intermediate_size=8, shared_expert_intermediate_size=16, num_experts=4,
                       num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[])),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(intermediate_size=8, num_experts=4, num_experts_per_tok=2)),
    "minimax": ("MiniMaxConfig", "MiniMaxForCausalLM",
                dict(head_dim=8, intermediate_size=8, num_local_experts=4, num_experts_per_tok=2, block_size=16,
                     layer_types=["linear_attention", "full_attention"])),
}


def model_class(spec):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if spec["kind"] == "vlm" else AutoModelForCausalLM


def fill_weights(model, key: str):
    """Overwrite every parameter with seeded fp32 values (independent of rank and torch's init RNG)."""
    with torch.no_grad():
        for pname, p in model.named_parameters():  # tied parameters appear once
            g = torch.Generator().manual_seed(stable_seed(key, pname))
            t = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in pname:
                t = 1.0 + 0.1 * t
            elif pname.endswith(".bias"):
                t = 0.02 * t
            else:
                t = 0.05 * t
            p.copy_(t.to(p.dtype))


def prepare_source(spec, srcdir):
    """Write the 'pretrained' HF folder verl loads (fp32 weights, generation config, tokenizer/processor)."""
    from transformers import GenerationConfig

    c = hf_config(spec)
    model = model_class(spec).from_config(c, dtype=torch.float32)
    fill_weights(model, spec["name"])
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, do_sample=True,
                                               temperature=0.7, top_p=0.8, max_new_tokens=16)
    model.save_pretrained(srcdir)
    if spec["kind"] == "vlm":
        build_processor(spec["model"]["arch"]).save_pretrained(srcdir)
    else:
        build_tokenizer(False).save_pretrained(srcdir)
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------------------------
# CPU patches (see the module docstring), installed in every rank before verl's engine is imported
# --------------------------------------------------------------------------------------------
def install_cpu_patches(spec):
    import torch.distributed.fsdp._init_utils as fsdp_init_utils
    from verl.plugin.platform import set_platform
    from verl.plugin.platform.platform_cuda import PlatformCUDA

    class CPUPlatform(PlatformCUDA):
        @property
        def device_name(self):
            return "cpu"

        def is_available(self):
            return False

        def current_device(self):
            return torch.device("cpu")

        def set_device(self, device_index):
            pass

        def communication_backend_name(self):
            return "gloo"

    set_platform(CPUPlatform())
    fsdp_init_utils._check_module_states_for_sync_module_states = lambda *a, **k: None

    import verl.utils.profiler.performance as perf

    perf._get_current_mem_info = lambda unit="GB", precision=2: ("0", "0", "0", "0")

    import verl.workers.engine.fsdp.transformer_impl as impl

    impl.load_fsdp_model_to_gpu = lambda model: None
    if spec["lora"] and spec["lora"]["use_rslora"]:
        import peft

        def lora_config_with_rslora(**kw):
            return peft.LoraConfig(use_rslora=True, **kw)

        impl.LoraConfig = lora_config_with_rslora
    return impl


# --------------------------------------------------------------------------------------------
# One rank of the "training job"
# --------------------------------------------------------------------------------------------
def worker(rank, spec, srcdir, outdir, store, infodir):
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=spec["world_size"])
    try:
        _worker(rank, spec, srcdir, outdir, infodir)
    finally:
        dist.destroy_process_group()


def engine_configs(spec, srcdir):
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig

    lora = spec["lora"] or {}
    model_config = HFModelConfig(path=srcdir, override_config={"attn_implementation": spec.get("attn", "sdpa")},
                                 use_remove_padding=False, lora_rank=lora.get("r", 0),
                                 lora_alpha=lora.get("lora_alpha", 16),
                                 target_modules=lora.get("target_modules", "all-linear"))
    engine_config = FSDPEngineConfig(strategy=spec["strategy"], use_torch_compile=False, use_dynamic_bsz=False,
                                     micro_batch_size_per_gpu=2)
    optimizer_config = FSDPOptimizerConfig(lr=1e-2, clip_grad=1.0, total_training_steps=10)
    checkpoint_config = CheckpointConfig(save_contents=["model", "optimizer", "extra"],
                                         load_contents=["model", "optimizer", "extra"],
                                         save_lora_only=spec["save_lora_only"])
    return model_config, engine_config, optimizer_config, checkpoint_config


def train_steps(engine, spec, rank):
    """Real optimizer steps: forward as FSDPEngineWithLMHead.forward_step runs it, then verl's optimizer_step."""
    import torch.nn.functional as F

    losses = []
    with engine.train_mode():
        for step in range(spec["train_steps"]):
            engine.optimizer_zero_grad()
            g = torch.Generator().manual_seed(stable_seed("batch", spec["name"], rank, step))
            ids = torch.randint(4, len(SPECIAL) + len(TOKENIZER_WORDS), (2, 12), generator=g)
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                out = engine.module(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
                loss = F.cross_entropy(out.logits[:, :-1].float().reshape(-1, out.logits.shape[-1]),
                                       ids[:, 1:].reshape(-1))
            loss.backward()
            engine.optimizer_step()
            engine.lr_scheduler_step()
            losses.append(float(loss))
    return losses


def _worker(rank, spec, srcdir, outdir, infodir):
    import random

    import numpy as np

    impl = install_cpu_patches(spec)
    torch.manual_seed(stable_seed("init", spec["name"]))
    np.random.seed(stable_seed("np", spec["name"], rank))
    random.seed(stable_seed("py", spec["name"], rank))

    engine = impl.FSDPEngineWithLMHead(*engine_configs(spec, srcdir))
    engine.initialize()
    losses = train_steps(engine, spec, rank) if spec["train_steps"] else []

    torch.manual_seed(stable_seed("rng", spec["name"], rank))  # what lands in extra_state's rng
    engine.save_checkpoint(local_path=outdir, global_step=spec["train_steps"], max_ckpt_to_keep=None)
    dist.barrier()

    sd = torch.load(os.path.join(outdir, f"model_world_size_{spec['world_size']}_rank_{rank}.pt"),
                    map_location="cpu", weights_only=False)
    info = dict(key_order=list(sd), tensors={k: describe_value(v) for k, v in sd.items()}, losses=losses,
                fsdp_module=type(engine.module).__name__)
    with open(os.path.join(infodir, f"rank{rank}.json"), "w") as f:
        json.dump(info, f)


def describe_value(v):
    from torch.distributed.tensor import DTensor

    def tinfo(t):
        return dict(shape=list(t.shape), stride=list(t.stride()), storage_offset=t.storage_offset(),
                    storage_bytes=t.untyped_storage().nbytes(), dtype=str(t.dtype).replace("torch.", ""))

    if isinstance(v, DTensor):
        return dict(kind="DTensor", global_shape=list(v.shape), placements=[repr(p) for p in v.placements],
                    mesh_dim_names=list(v.device_mesh.mesh_dim_names or []), local=tinfo(v._local_tensor))
    return dict(kind="Tensor", global_shape=list(v.shape), local=tinfo(v))


def run_ranks(spec, srcdir, outdir, tmp):
    infodir = os.path.join(tmp, "info")
    os.makedirs(infodir, exist_ok=True)
    mp.start_processes(worker, args=(spec, srcdir, outdir, os.path.join(tmp, "store"), infodir),
                       nprocs=spec["world_size"], start_method="fork", join=True)
    return [json.load(open(os.path.join(infodir, f"rank{r}.json"))) for r in range(spec["world_size"])]


# --------------------------------------------------------------------------------------------
# Recombining rank files (fp32) and the LoRA oracle
# --------------------------------------------------------------------------------------------
def recombine(ckpt, world):
    """Full-precision state dict from the rank files: DTensor Shard(d) -> cat on d, plain -> rank 0."""
    from torch.distributed.tensor import DTensor

    sds = [torch.load(os.path.join(ckpt, f"model_world_size_{world}_rank_{r}.pt"), map_location="cpu",
                      weights_only=False) for r in range(world)]
    out = {}
    for k, v in sds[0].items():
        if isinstance(v, DTensor):
            (pl,) = v.placements
            if pl.is_shard():
                out[k] = torch.cat([sd[k]._local_tensor for sd in sds], dim=pl.dim).contiguous()
            else:
                out[k] = v._local_tensor.clone()
        else:
            out[k] = v.clone()
    return out


def peft_config_of(spec):
    from peft import LoraConfig, TaskType

    lo = spec["lora"]
    return LoraConfig(task_type=TaskType.CAUSAL_LM, r=lo["r"], lora_alpha=lo["lora_alpha"],
                      target_modules=lo["target_modules"], bias="none", use_rslora=lo["use_rslora"])


def lora_oracles(spec, srcdir, ckpt, expected, source_sd):
    """base_fp32 / fused_fp32: peft merge_and_unload() on the same fp32 weights the rank files hold."""
    from peft import get_peft_model
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    full = recombine(ckpt, spec["world_size"])
    config = AutoConfig.from_pretrained(srcdir)
    base = AutoModelForCausalLM.from_pretrained(srcdir, config=config, dtype=torch.float32)
    peft_model = get_peft_model(base, peft_config_of(spec))
    res = peft_model.load_state_dict(full, strict=not spec["save_lora_only"])
    if spec["save_lora_only"]:
        assert not res.unexpected_keys, res.unexpected_keys
        assert all("lora_" not in k for k in res.missing_keys), res.missing_keys
    else:
        # the frozen base in the rank files is the source, bit for bit
        for k, v in full.items():
            if "lora_" in k:
                continue
            hf = k.replace("base_model.model.", "").replace(".base_layer.", ".")
            assert torch.equal(v, source_sd[hf]), k
    lora_b = [v for k, v in full.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b), "training left a lora_B at zero"
    base_sd = {k: v.clone() for k, v in source_sd.items()}
    fused_sd = {k: v.detach().clone().contiguous() for k, v in peft_model.merge_and_unload().state_dict().items()}
    if config.tie_word_embeddings:  # same rule as verl's drop_tied_target_keys; safetensors refuses aliases
        base_sd.pop("lm_head.weight", None)
        fused_sd.pop("lm_head.weight", None)
    assert set(base_sd) == set(fused_sd)
    save_file(base_sd, os.path.join(expected, "base_fp32.safetensors"))
    save_file(fused_sd, os.path.join(expected, "fused_fp32.safetensors"))
    changed = sorted(k for k in fused_sd if not torch.equal(fused_sd[k], base_sd[k]))
    return dict(scale=spec["lora"]["lora_alpha"] / (spec["lora"]["r"] ** 0.5 if spec["lora"]["use_rslora"]
                                                    else spec["lora"]["r"]),
                fused_differs_from_base=changed)


# --------------------------------------------------------------------------------------------
# verl's merger
# --------------------------------------------------------------------------------------------
def merger_env(hash_seed="0"):
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONHASHSEED=hash_seed, CUDA_VISIBLE_DEVICES="",
               TOKENIZERS_PARALLELISM="false")
    env.pop("CKFS_GEN_REEXEC", None)
    return env


def run_merger(ckpt, target, hash_seed="0"):
    cmd = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", ckpt,
           "--target_dir", target]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=merger_env(hash_seed), cwd=REPO,
                       text=True)
    return p.returncode, p.stdout


LORA_KEEP = {"model.safetensors", "config.json"}  # plus lora_adapter/ (what the brief of these fixtures asks)
KEEP_FILES = {"model.safetensors", "model.safetensors.index.json", "config.json", "generation_config.json",
              "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "processor_config.json",
              "preprocessor_config.json", "video_preprocessor_config.json", "special_tokens_map.json"}


def collect_expected(spec, target, expected, merger_log, rc):
    os.makedirs(expected, exist_ok=True)
    kept = []
    if os.path.isdir(target):
        for fn in sorted(os.listdir(target)):
            src = os.path.join(target, fn)
            keep = fn in LORA_KEEP if spec["kind"] == "lora" else (fn in KEEP_FILES or fn.endswith(".safetensors"))
            if keep:
                shutil.copy2(src, os.path.join(expected, fn))
                kept.append(fn)
        lora_dir = os.path.join(target, "lora_adapter")
        if os.path.isdir(lora_dir):
            os.makedirs(os.path.join(expected, "lora_adapter"), exist_ok=True)
            for fn in ("adapter_model.safetensors", "adapter_config.json"):
                shutil.copy2(os.path.join(lora_dir, fn), os.path.join(expected, "lora_adapter", fn))
                kept.append("lora_adapter/" + fn)
        written = sorted(os.path.relpath(os.path.join(dp, f), target) for dp, _, fs in os.walk(target) for f in fs)
    else:
        written = []
    with open(os.path.join(expected, "merger.log"), "w") as f:
        f.write(f"exit status {rc}\n")
        f.write(merger_log)
    return kept, written


def sanitize_log(text, ckpt, target, out_root):
    text = text.replace(os.path.abspath(ckpt), "<local_dir>").replace(os.path.abspath(target), "<target_dir>")
    text = text.replace(os.path.abspath(out_root) + os.sep, "tests/fixtures/")
    text = re.sub(r"/[^\s'\"]*/site-packages/", "<site-packages>/", text)
    # drop what changes from run to run: tqdm progress lines, time-stamped library warnings
    keep = [ln for ln in text.replace("\r", "\n").splitlines()
            if ln.strip() and "it/s]" not in ln and "?it/s" not in ln
            and not re.match(r"^(\[\d{4}-\d\d-\d\d |WARNING:\d{4}-)", ln)]
    return "\n".join(keep) + "\n"


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------
def layout_record(ranks):
    out = {}
    for key in ranks[0]["key_order"]:
        r0 = ranks[0]["tensors"][key]
        ent = dict(kind=r0["kind"], global_shape=r0["global_shape"], dtype=r0["local"]["dtype"])
        if r0["kind"] == "DTensor":
            ent["placements"] = r0["placements"]
        ent["local_shapes"] = [r["tensors"][key]["local"]["shape"] for r in ranks]
        out[key] = ent
    return out


def tree_size(path):
    return sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(path) for f in fs)


def generate(spec, out_root, tmp_root):
    name = spec["name"]
    ckdir, exdir = KIND_DIRS[spec["kind"]]
    ckpt = os.path.join(out_root, ckdir, name)
    expected = os.path.join(out_root, exdir, name)
    shutil.rmtree(ckpt, ignore_errors=True)
    shutil.rmtree(expected, ignore_errors=True)
    tmp = os.path.join(tmp_root, name)
    srcdir = os.path.join(tmp, "src")
    os.makedirs(srcdir)
    t0 = time.time()
    source_sd = prepare_source(spec, srcdir)
    ranks = run_ranks(spec, srcdir, ckpt, tmp)
    removed = []
    if not spec["keep_meta"]:
        os.remove(os.path.join(ckpt, "lora_train_meta.json"))
        removed.append("lora_train_meta.json")
    log(f"[{name}] verl FSDPEngine ({spec['strategy']}, W={spec['world_size']}) saved in {time.time() - t0:.1f}s"
        + (f", losses rank0 {['%.4f' % x for x in ranks[0]['losses']]}" if ranks[0]["losses"] else ""))

    target = os.path.join(tmp, "merged")
    rc, text = run_merger(ckpt, target)
    text = sanitize_log(text, ckpt, target, out_root)
    kept, written = collect_expected(spec, target, expected, text, rc)
    last = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or [""]
    rec = dict(name=name, kind=spec["kind"], description=spec["description"], strategy=spec["strategy"],
               fsdp_version=1 if spec["strategy"] == "fsdp" else 2, world_size=spec["world_size"],
               fsdp_module=ranks[0]["fsdp_module"], tied=spec["tied"], model=spec["model"],
               architectures=hf_config(spec).architectures, lora=spec["lora"], save_lora_only=spec["save_lora_only"],
               train_steps=spec["train_steps"], train_losses_rank0=ranks[0]["losses"],
               files_removed_after_save=removed, checkpoint=f"{ckdir}/{name}", expected=f"{exdir}/{name}",
               checkpoint_files=sorted(os.path.relpath(os.path.join(dp, f), ckpt)
                                       for dp, _, fs in os.walk(ckpt) for f in fs),
               merger_exit=rc, merger_last_line=last[0], merger_wrote=written, expected_files=kept,
               tensors=layout_record(ranks))
    if spec["kind"] == "lora":
        rec["oracle"] = lora_oracles(spec, srcdir, ckpt, expected, source_sd)
    log(f"[{name}] merger exit {rc}: {last[0][:160]}")
    log(f"[{name}] checkpoint {tree_size(ckpt) / 1e6:.2f} MB, expected {tree_size(expected) / 1e6:.2f} MB")
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", help="generate only this case (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--out", default=FIXTURES, help="fixtures root (default tests/fixtures)")
    ap.add_argument("--transformers", metavar="VERSION",
                    help="run verl and its merger with this transformers release instead of the venv's "
                         "(e.g. 5.23.0, into --out tests/fixtures/transformers-5.23.0)")
    args = ap.parse_args()
    if args.list:
        for c in CASES:
            print(f"{c['name']:32s} {c['kind']:5s} {c['description']}")
        return
    unknown = set(args.only or []) - {c["name"] for c in CASES}
    if unknown:
        raise SystemExit(f"unknown case(s): {sorted(unknown)}")

    import peft
    import safetensors
    import transformers
    import verl

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, verl {verl.__version__}, "
        f"peft {peft.__version__}, safetensors {safetensors.__version__}")
    manifest_path = os.path.join(args.out, MANIFEST)
    by_name = {}
    if os.path.exists(manifest_path):
        by_name = {c["name"]: c for c in json.load(open(manifest_path)).get("cases", [])}
    tmp_root = tempfile.mkdtemp(prefix="ckfs-lora-vlm-")
    try:
        for spec in CASES:
            if args.only and spec["name"] not in args.only:
                continue
            by_name[spec["name"]] = generate(spec, args.out, tmp_root)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    manifest = dict(generator="tests/gen/make_lora_vlm_fixtures.py",
                    versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                                  verl=verl.__version__, peft=peft.__version__, safetensors=safetensors.__version__,
                                  python=sys.version.split()[0]),
                    merge_command="python -m verl.model_merger merge --backend fsdp --local_dir DIR --target_dir OUT",
                    cases=[by_name[c["name"]] for c in CASES if c["name"] in by_name])
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    log(f"wrote {manifest_path}")


if __name__ == "__main__":
    main()
