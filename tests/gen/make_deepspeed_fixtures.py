#!/usr/bin/env python3
"""Generate real DeepSpeed ZeRO checkpoints (DeepSpeed 0.19.8, pinned) of tiny transformers models.

Every checkpoint here is written by DeepSpeed itself, after real training steps on the CPU:

    DS_ACCELERATOR=cpu          DeepSpeed's CPU accelerator as shipped; without oneCCL installed it
                                picks the gloo backend (deepspeed.init_distributed() with defaults)
    torch.multiprocessing.spawn one process per data-parallel rank (RANK, LOCAL_RANK, WORLD_SIZE,
                                MASTER_ADDR, MASTER_PORT in the environment, as a launcher sets them)
    deepspeed.initialize        the optimizer is torch's AdamW, chosen through the config:
                                "optimizer": {"type": "AdamW", "params": {"torch_adam": true, ...}}
    engine.backward/step        2 steps on seeded random tokens (different data on every rank),
                                so the fp32 masters are real Adam updates of the initial weights
    engine.save_checkpoint(dir) the files exactly as DeepSpeed lays them out (tag global_step2):
                                latest, zero_to_fp32.py, zero_to_torch.py, global_step2/*.pt

The first run builds DeepSpeed's small CPU communication op (deepspeed_shm_comm) with g++ into
~/.cache/torch_extensions (a minute, once). The HF Trainer cases run transformers' Trainer with
TrainingArguments(deepspeed=<config dict>) in the same spawned processes; it saves checkpoint-N/
(config.json, generation_config.json, tokenizer files, trainer state, and DeepSpeed's
global_stepN/ + latest + zero_to_fp32.py) exactly as a GPU run would.

What is patched (nothing in the files themselves):
  * HF Trainer cases only: TrainingArguments.__post_init__ refuses bf16=True unless use_cpu=True
    or is_torch_bf16_gpu_available(); use_cpu=True would take the run off DeepSpeed, so the
    generator makes transformers.training_args.is_torch_bf16_gpu_available return True in the
    worker processes. The computation itself is DeepSpeed's bf16 path on the CPU.
  * HF Trainer cases only, configured rather than patched: transformers gives a DeepSpeed run
    no distributed backend, and on a machine without GPUs accelerate then counts one process
    (DeepSpeed still trains on all ranks, but the Trainer neither shards the data nor names its
    rng_state_<r>.pth files per rank). configure_accelerate_state() makes accelerate's
    PartialState(backend="gloo") in DeepSpeed mode first and TrainingArguments reuses it through
    accelerator_config={"use_configured_state": True}; then "train_batch_size": "auto" works too.
  * Nothing else: DeepSpeed, torch and transformers run unmodified.

Oracles, in <case>/oracle/ (not part of what DeepSpeed wrote):
  zero_to_fp32.safetensors   DeepSpeed's own get_fp32_state_dict_from_zero_checkpoint(<case dir>)
                             (the zero_to_fp32.py of the installed package, i.e. the same code as
                             the copy in the folder), tensors made contiguous, in its key order,
                             saved with safetensors.torch.save_file(metadata={"format": "pt"}).
                             Tied weights: z2f returns the alias (e.g. lm_head.weight) as the same
                             tensor object as its owner; save_file refuses shared tensors, so every
                             alias of shared_params is dropped and the owner kept, which is what
                             save_pretrained writes for a model with tie_word_embeddings=true
                             (model.embed_tokens.weight only). Missing when z2f refuses the
                             checkpoint; then zero_to_fp32.error.txt holds its exception line.
  live_fp32.safetensors      the fp32 masters gathered in the training processes right before
                             engine.save_checkpoint (every rank takes part; see live_fp32()):
                             ZeRO-1/2: each rank's in-memory fp32 partition, all-gathered and cut
                             at the offsets the optimizer used to flatten the group
                             (round_robin_bit16_offsets); ZeRO-3 and BF16_Optimizer:
                             deepspeed.utils.safe_get_full_fp32_param. Frozen parameters have no
                             master: their module value (gathered with GatheredParameters under
                             ZeRO-3), dtype kept. Keys in named_parameters() order, tied aliases
                             dropped as above. case.json "live_views" also compares, in the
                             training processes, safe_get_full_fp32_param and the module weights
                             (must equal the masters cast to the module dtype).
  config.json                the model's config (save_pretrained), dtype = the module dtype.
  case.json                  what the case is, the files written, the comparison of the two
                             oracles (bit for bit, per tensor) and what
                             convert_zero_checkpoint_to_fp32_state_dict(safe_serialization=True)
                             did with the folder.

What the oracles showed (DeepSpeed 0.19.8), recorded per case in case.json:
  * the two oracles agree bit for bit on every tensor zero_to_fp32 returns, in every case;
  * ZeRO-1 saves no frozen_param_* (None), so zero_to_fp32 leaves frozen parameters out
    (z1_w3_frozen_fp32: 10 names only in live_fp32);
  * BF16_Optimizer checkpoints (bf16opt_*) are refused by zero_to_fp32 ("... is not a zero
    checkpoint": no zero_stage key); only live_fp32 exists there;
  * with round_robin_gradients (z2_w3_rr_fp32) safe_get_full_fp32_param returns wrong slices for
    most parameters, and the param_slice_mappings saved in the optim files are wrong the same way:
    DeepSpeed links the fp32 fragments in module order while the flat buffer is in round-robin
    order. zero_to_fp32 (which follows param_shapes) and the module weights are right;
  * convert_zero_checkpoint_to_fp32_state_dict(safe_serialization=True) fails on tied models
    (safetensors refuses the shared lm_head.weight / model.embed_tokens.weight pair).

tests/gen/check_deepspeed_fixtures.py reads the committed files again with numpy only and
checks the reassembly rules against both oracles.

Run (from the repository root, with the venv of tests/setup-venv.sh):

    DS_ACCELERATOR=cpu .venv/bin/python tests/gen/make_deepspeed_fixtures.py             # all
    DS_ACCELERATOR=cpu .venv/bin/python tests/gen/make_deepspeed_fixtures.py --only z2_w3_tied_fp32
    .venv/bin/python tests/gen/make_deepspeed_fixtures.py --list

Version matrix (issue #21): with another DeepSpeed release installed, --version-matrix writes
MATRIX_CASES (ZeRO-1 bf16, ZeRO-2 and ZeRO-3 at 3 ranks tied, BF16_Optimizer) into
tests/fixtures/matrix/deepspeed-<version>/<case>/ with the same oracles, that release's
zero_to_fp32 among them. One command makes the venv with the cell's pins and runs it:

    python3 tests/gen/framework_matrix.py deepspeed-0.16.9   # torch 2.6.0, transformers 4.57.6

(DeepSpeed 0.16.9: 23-193 s per case, 5-7 minutes for the four on the shared 2 cores; its
optimizer does not record round_robin_bit16_offsets, so live_fp32() packs the group's
parameters end to end as 0.16's flatten does. A second run through framework_matrix.py
rewrote every file byte for byte but the uninitialised per-parameter padding of ZeRO-3's last
rank, never read, with its zip record, and the order of a set in a recorded error message.)

(DS_ACCELERATOR is set to cpu by the script when unset.) Each case is regenerated alone: its
folder tests/fixtures/deepspeed/<case>/ is replaced and nothing else is touched. About 30-60 s
per case on 2 cores, 8 minutes for all. Training is deterministic (seeded data and weights, one thread): a rerun
of z1_w2_fp32 reproduced its whole folder byte for byte.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
import warnings
import zlib

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("USE_LIBUV", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import torch  # noqa: E402

torch.set_num_threads(1)

import torch.multiprocessing as mp  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "fixtures", "deepspeed")
STEPS = 2
MICRO_BATCH = 2
SEQ = 12

# Vocab 97 is prime: no world size divides it, so the embedding's ZeRO-3 partitions and the
# flat buffers' ends are uneven. Hidden 32 with 4 heads of 8, 2 KV heads (GQA), 2 layers.
TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)

# Frozen parameter sets (requires_grad=False before deepspeed.initialize).
FROZEN_EMBED_AND_LAYER0 = ["model.embed_tokens.weight", "model.layers.0.*"]


def case(name, arch, world, stage, dtype, desc, tied=False, frozen=(), rr=False, sub_group_size=None,
         grad_accum_fp32=False, trainer=False):
    return dict(name=name, arch=arch, world=world, stage=stage, dtype=dtype, tied=tied, frozen=list(frozen),
                round_robin_gradients=rr, sub_group_size=sub_group_size, grad_accum_fp32=grad_accum_fp32,
                trainer=trainer, desc=desc)


CASES = [
    case("z1_w2_fp32", "qwen2", 2, 1, "float32",
         "ZeRO-1, 2 ranks, fp32 training, untied Qwen2: one mp_rank_00_model_states.pt, fp32 module weights"),
    case("z1_w3_frozen_fp32", "llama", 3, 1, "float32",
         "ZeRO-1, 3 ranks, embed_tokens and layer 0 frozen: ZeRO-1 saves no frozen_param_* "
         "(None), so zero_to_fp32 leaves the frozen params out", frozen=FROZEN_EMBED_AND_LAYER0),
    case("z2_w3_tied_fp32", "qwen2", 3, 2, "float32",
         "ZeRO-2, 3 ranks (uneven partitions, tail padding on the last rank), tied embeddings",
         tied=True),
    case("z2_w4_frozen_fp32", "llama", 4, 2, "float32",
         "ZeRO-2, 4 ranks, embed_tokens and layer 0 frozen: frozen_param_fragments hold the whole "
         "frozen tensors", frozen=FROZEN_EMBED_AND_LAYER0),
    case("z2_w3_rr_fp32", "llama", 3, 2, "float32",
         "ZeRO-2, 3 ranks, round_robin_gradients=true: the flat buffer (and param_shapes) order is "
         "a round-robin shuffle of the module order; safe_get_full_fp32_param and the saved "
         "param_slice_mappings are wrong here (DeepSpeed 0.19.8)", rr=True),
    case("z3_w2_fp32", "llama", 2, 3, "float32",
         "ZeRO-3, 2 ranks, untied Llama: one model_states file per rank with empty placeholders"),
    case("z3_w3_tied_fp32", "qwen2", 3, 3, "float32",
         "ZeRO-3, 3 ranks, tied embeddings: per-parameter partitions of ceil(numel/3) with padding",
         tied=True),
    case("z3_w3_frozen_subgroups_fp32", "llama", 3, 3, "float32",
         "ZeRO-3, 3 ranks, embed_tokens and layer 0 frozen (partitioned frozen fragments, padded), "
         "sub_group_size 800 (counted in partition elements): several fp32 sub-groups, one "
         "param_shapes dict each", frozen=FROZEN_EMBED_AND_LAYER0, sub_group_size=800),
    case("z1_w2_bf16", "qwen2", 2, 1, "bfloat16",
         "ZeRO-1 with bf16 (grad accumulation in bf16): DeepSpeedZeroOptimizer, files bf16_zero_pp_*"),
    case("z2_w3_tied_bf16", "qwen2", 3, 2, "bfloat16",
         "ZeRO-2 with bf16, 3 ranks, tied: bf16 module weights, fp32 masters in the optim files",
         tied=True),
    case("z3_w4_bf16", "llama", 4, 3, "bfloat16",
         "ZeRO-3 with bf16, 4 ranks (every numel divides by 4: no per-parameter padding): "
         "empty bf16 placeholders in the model states, fp32 partitions in bf16_zero_pp_* files"),
    case("bf16opt_w2", "qwen2", 2, 1, "bfloat16",
         "ZeRO-1 + bf16 + data_types.grad_accum_dtype=fp32: DeepSpeed picks BF16_Optimizer, whose "
         "optim files have no zero_stage, so zero_to_fp32 refuses them", grad_accum_fp32=True),
    case("bf16opt_w3_tied", "qwen2", 3, 1, "bfloat16",
         "BF16_Optimizer, 3 ranks, tied: padded fp32 partitions of equal length on every rank",
         tied=True, grad_accum_fp32=True),
    case("trainer_z2_w2_bf16", "qwen2", 2, 2, "bfloat16",
         "HF Trainer (bf16=True) with ZeRO-2 on 2 ranks: checkpoint-2/ with config, tokenizer, "
         "model.safetensors (bf16 module weights) beside global_step2/; two param groups "
         "(weight decay / none)", trainer=True),
    case("trainer_z3_w3_bf16_tied", "qwen2", 3, 3, "bfloat16",
         "HF Trainer (bf16=True) with ZeRO-3 on 3 ranks, tied: from_pretrained under zero.Init, "
         "checkpoint-2/ without weights file beside global_step2/", tied=True, trainer=True),
]
BY_NAME = {c["name"]: c for c in CASES}

# The DeepSpeed version matrix (issue #21): these cases, written by another DeepSpeed release,
# go to tests/fixtures/matrix/deepspeed-<version>/<case>/ with the same oracles (that release's
# zero_to_fp32, the live masters). One per partition layout: ZeRO-1 with bf16 (bf16_ file
# names), ZeRO-2 and ZeRO-3 at 3 ranks with tied embeddings (uneven partitions, tail and
# per-parameter padding), BF16_Optimizer (padded partitions, no zero_stage).
MATRIX_CASES = ["z1_w2_bf16", "z2_w3_tied_fp32", "z3_w3_tied_fp32", "bf16opt_w3_tied"]
MATRIX = os.path.join(REPO, "tests", "fixtures", "matrix")


def log(*a):
    print(*a, flush=True)


def stable_seed(*parts) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


def torch_dtype(spec):
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[spec["dtype"]]


# --------------------------------------------------------------------------------------------
# Model, tokenizer, data
# --------------------------------------------------------------------------------------------
def hf_config(spec):
    from transformers import LlamaConfig, Qwen2Config

    extra = dict(use_sliding_window=False) if spec["arch"] == "qwen2" else {}
    cls = Qwen2Config if spec["arch"] == "qwen2" else LlamaConfig
    c = cls(max_position_embeddings=64, tie_word_embeddings=spec["tied"], bos_token_id=1, eos_token_id=2,
            pad_token_id=0, rms_norm_eps=1e-6, rope_theta=10000.0, **extra, **TINY)
    c.architectures = ["Qwen2ForCausalLM" if spec["arch"] == "qwen2" else "LlamaForCausalLM"]
    c.dtype = spec["dtype"]
    return c


def seed_weights(model, name):
    """The same weights in every process, independent of torch's init RNG."""
    with torch.no_grad():
        for pname, p in model.named_parameters():  # tied parameters appear once
            g = torch.Generator().manual_seed(stable_seed(name, pname))
            t = torch.randn(p.shape, generator=g, dtype=torch.float32)
            t = 1.0 + 0.1 * t if "norm" in pname else (0.02 if pname.endswith(".bias") else 0.05) * t
            p.copy_(t.to(p.dtype))


def build_model(spec):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(hf_config(spec), dtype=torch.float32)
    seed_weights(model, spec["name"])
    freeze(model, spec["frozen"])
    return model


def is_frozen_name(name, patterns):
    return any(name == p or (p.endswith(".*") and name.startswith(p[:-1])) for p in patterns)


def freeze(model, patterns):
    for n, p in model.named_parameters():
        if is_frozen_name(n, patterns):
            p.requires_grad_(False)


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(TINY["vocab_size"] - 4)]
    tk = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", model_max_length=64)


def batch(spec, rank, step):
    g = torch.Generator().manual_seed(stable_seed(spec["name"], "data", rank, step))
    return torch.randint(3, TINY["vocab_size"], (MICRO_BATCH, SEQ), generator=g)


# --------------------------------------------------------------------------------------------
# DeepSpeed config
# --------------------------------------------------------------------------------------------
def ds_config(spec):
    zero = {"stage": spec["stage"]}
    if spec["round_robin_gradients"]:
        zero["round_robin_gradients"] = True
    if spec["sub_group_size"]:
        zero["sub_group_size"] = spec["sub_group_size"]
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.01, "torch_adam": True}},
        "zero_optimization": zero,
        "steps_per_print": 1000,
        "wall_clock_breakdown": False,
    }
    if spec["dtype"] == "bfloat16":
        cfg["bf16"] = {"enabled": True}
    if spec["grad_accum_fp32"]:
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    return cfg


def trainer_ds_config(spec):
    """What a user passes to TrainingArguments(deepspeed=...): "auto" where the Trainer fills in."""
    return {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": spec["stage"]},
        "steps_per_print": 1000,
    }


# --------------------------------------------------------------------------------------------
# Workers
# --------------------------------------------------------------------------------------------
def set_dist_env(rank, world, port):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def live_fp32(engine, tied_aliases):
    """The fp32 masters as the training processes hold them, right before saving.

    Every rank must call (the gathers are collectives). Returns (masters, report), both on
    every rank: masters is name -> fp32 tensor (frozen parameters: their module value, dtype
    kept); report says how the other live views compare with it.

    ZeRO-1/2: every rank's in-memory fp32 partition (optimizer.single_partition_of_fp32_groups,
    padded, equal lengths) is all-gathered and cut at the offsets the optimizer computed when it
    flattened the group (round_robin_bit16_groups / round_robin_bit16_offsets), i.e. the
    engine's own layout, not the checkpoint's param_shapes. ZeRO-3 and BF16_Optimizer:
    deepspeed.utils.safe_get_full_fp32_param (the engine's own gather). For ZeRO-1/2 the report
    also compares safe_get_full_fp32_param, which DeepSpeed 0.19.8 gets wrong with
    round_robin_gradients (it links the fp32 fragments in module order, the flat buffer is in
    round-robin order)."""
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.utils import safe_get_full_fp32_param

    model, opt = engine.module, engine.optimizer
    named = [(n, p) for n, p in model.named_parameters() if n not in tied_aliases]
    masters = {}
    if hasattr(opt, "round_robin_bit16_groups"):  # DeepSpeedZeroOptimizer: ZeRO-1/2
        for i, group in enumerate(opt.round_robin_bit16_groups):
            part = opt.single_partition_of_fp32_groups[i].detach()
            pg = opt.real_dp_process_group[i]
            pieces = [torch.empty_like(part) for _ in range(dist.get_world_size(group=pg))]
            dist.all_gather(pieces, part, group=pg)
            full = torch.cat(pieces)
            # the offsets the optimizer flattened the group at: DeepSpeed 0.19 records them
            # (round_robin_bit16_offsets, with parameter_alignment paddings); older releases
            # (0.16) pack the parameters end to end, padding only the group's tail
            if hasattr(opt, "round_robin_bit16_offsets"):
                offsets = opt.round_robin_bit16_offsets[i]
            else:
                offsets = [sum(q.numel() for q in group[:k]) for k in range(len(group))]
            for p, off in zip(group, offsets):
                masters[id(p)] = full[off:off + p.numel()].view(p.shape).clone()
    api = {}
    for n, p in named:
        if p.requires_grad:
            t = safe_get_full_fp32_param(p)
            assert t is not None, f"{n}: no fp32 master"
            api[id(p)] = t.detach().cpu().clone()
    if not masters:
        masters = dict(api)
    out, api_differs, module_vs_master = {}, [], []
    for n, p in named:
        if p.requires_grad:
            out[n] = masters[id(p)].contiguous()
            if not torch.equal(api[id(p)], out[n]):
                api_differs.append(n)
        if hasattr(p, "ds_id"):
            with deepspeed.zero.GatheredParameters([p]):
                value = p.detach().cpu().clone()
        else:
            value = p.detach().cpu().clone()
        if not p.requires_grad:
            out[n] = value.contiguous()
        elif not torch.equal(value, out[n].to(value.dtype)):
            module_vs_master.append(n)
    report = dict(safe_get_full_fp32_param_differs=api_differs,
                  module_not_equal_to_master_cast=module_vs_master)
    return out, report


def tied_alias_names(model):
    """Second and later names of parameters that appear under several names."""
    seen, aliases = set(), []
    for n, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            aliases.append(n)
        seen.add(id(p))
    return aliases


def ds_worker(rank, spec, ckpt_dir, oracle_dir, port):
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    set_dist_env(rank, spec["world"], port)
    import deepspeed

    deepspeed.init_distributed()
    model = build_model(spec)
    aliases = tied_alias_names(model)
    engine, _, _, _ = deepspeed.initialize(model=model, config=ds_config(spec),
                                           model_parameters=[p for p in model.parameters() if p.requires_grad])
    for step in range(STEPS):
        ids = batch(spec, rank, step)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    live, report = live_fp32(engine, aliases)
    engine.save_checkpoint(ckpt_dir)
    if rank == 0:
        save_live(oracle_dir, live, report)
        hf_config(spec).save_pretrained(oracle_dir)
    deepspeed.comm.barrier()


def save_live(oracle_dir, live, report):
    from safetensors.torch import save_file

    save_file(live, os.path.join(oracle_dir, "live_fp32.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(oracle_dir, "live_report.json"), "w") as f:
        json.dump(report, f)


def patch_trainer_bf16_check():
    """transformers refuses bf16=True when no GPU supports it; DeepSpeed's CPU path does bf16."""
    import transformers.training_args as ta

    ta.is_torch_bf16_gpu_available = lambda *a, **k: True


def configure_accelerate_state():
    """accelerate's state for a DeepSpeed run on gloo, made before TrainingArguments.

    transformers gives a DeepSpeed run no backend, and accelerate then counts one process on a
    machine without GPUs (DeepSpeed itself still runs on all ranks): the Trainer would neither
    shard the data nor name its per-rank files as a multi-GPU run does. A PartialState made
    with backend="gloo" in DeepSpeed mode, reused through accelerator_config
    {"use_configured_state": true} (public options of both libraries), counts every rank."""
    from accelerate import PartialState

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    PartialState(backend="gloo")
    del os.environ["ACCELERATE_USE_DEEPSPEED"]


def trainer_worker(rank, spec, run_dir, oracle_dir, port):
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    set_dist_env(rank, spec["world"], port)
    patch_trainer_bf16_check()
    configure_accelerate_state()
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    args = TrainingArguments(output_dir=run_dir, deepspeed=trainer_ds_config(spec), bf16=True,
                             per_device_train_batch_size=MICRO_BATCH, max_steps=STEPS, learning_rate=1e-2,
                             weight_decay=0.01, adam_beta2=0.95, lr_scheduler_type="constant",
                             save_strategy="steps", save_steps=STEPS, logging_steps=1000, report_to=[],
                             use_cpu=False, accelerator_config={"use_configured_state": True}, seed=0,
                             data_seed=0, dataloader_num_workers=0, disable_tqdm=True,
                             remove_unused_columns=False)
    src = os.path.join(os.path.dirname(run_dir), "source_model")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    loaded_under_zero_init = all(hasattr(p, "ds_id") for p in model.parameters())
    freeze(model, spec["frozen"])
    aliases = tied_alias_names(model)
    data = [dict(input_ids=ids, labels=ids) for r in range(spec["world"]) for s in range(STEPS)
            for ids in batch(spec, r, s)]
    captured = {}

    class CapturingTrainer(Trainer):
        """Gathers the fp32 masters right before the Trainer saves its checkpoint."""

        def _save_checkpoint(self, model, trial):
            captured["live"] = live_fp32(self.model_wrapped, aliases)
            return super()._save_checkpoint(model, trial)

    tr = CapturingTrainer(model=model, args=args, train_dataset=data, processing_class=build_tokenizer())
    tr.train()
    if rank == 0:
        live, report = captured["live"]
        report["from_pretrained_under_zero_init"] = loaded_under_zero_init
        save_live(oracle_dir, live, report)


def spawn(fn, spec, *args):
    port = free_port()
    mp.spawn(fn, args=(spec, *args, port), nprocs=spec["world"], join=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------
# Oracles and records
# --------------------------------------------------------------------------------------------
def z2f_oracle(ckpt_dir, oracle_dir):
    """DeepSpeed's zero_to_fp32 on the folder: (state dict without aliases, aliases, error)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import save_file

    try:
        sd = get_fp32_state_dict_from_zero_checkpoint(ckpt_dir)
    except Exception as e:  # noqa: BLE001 (recorded: the refusal is a fact of the format)
        msg = f"{type(e).__name__}: {e}".replace(ckpt_dir, "<case>")
        with open(os.path.join(oracle_dir, "zero_to_fp32.error.txt"), "w") as f:
            f.write(msg + "\n")
        return None, [], msg
    keep, aliases, seen = {}, [], {}
    for k, v in sd.items():
        if id(v) in seen:
            aliases.append([k, seen[id(v)]])
            continue
        seen[id(v)] = k
        keep[k] = v.contiguous()
    save_file(keep, os.path.join(oracle_dir, "zero_to_fp32.safetensors"), metadata={"format": "pt"})
    return keep, aliases, None


def z2f_convert_behaviour(ckpt_dir):
    """What convert_zero_checkpoint_to_fp32_state_dict(safe_serialization=True) does here."""
    from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict
    from safetensors import safe_open

    out = tempfile.mkdtemp(prefix="ckfs-z2f-")
    try:
        convert_zero_checkpoint_to_fp32_state_dict(ckpt_dir, out, safe_serialization=True)
        files = sorted(os.listdir(out))
        keys = []
        for fn in files:
            if fn.endswith(".safetensors"):
                with safe_open(os.path.join(out, fn), "pt") as f:
                    keys += list(f.keys())
        return dict(ok=True, files=files, keys=keys)
    except Exception as e:  # noqa: BLE001
        return dict(ok=False, error=f"{type(e).__name__}: {' '.join(str(e).split())}")
    finally:
        shutil.rmtree(out, ignore_errors=True)


def compare(z2f, live, frozen_patterns):
    """Per tensor: equal bit for bit, or why not."""
    rows, all_equal = [], True
    for k in live:
        if z2f is None:
            break
        if k not in z2f:
            rows.append(dict(name=k, result="missing from zero_to_fp32",
                             frozen=is_frozen_name(k, frozen_patterns)))
            all_equal = False
            continue
        a, b = z2f[k], live[k]
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1).view(torch.uint8)
                                                                          if a.numel() else a,
                                                                          b.view(-1).view(torch.uint8)
                                                                          if b.numel() else b)
        if not same:
            all_equal = False
            rows.append(dict(name=k, result="differs", z2f_dtype=str(a.dtype), live_dtype=str(b.dtype)))
    extra = [k for k in (z2f or {}) if k not in live]
    if extra:
        all_equal = False
        rows.append(dict(name=extra, result="only in zero_to_fp32"))
    return all_equal, rows


def file_list(root):
    out = []
    for d, _, fs in os.walk(root):
        for f in sorted(fs):
            p = os.path.join(d, f)
            out.append([os.path.relpath(p, root), os.path.getsize(p)])
    return sorted(out)


def make_case(spec, out=OUT):
    import deepspeed
    import safetensors
    import transformers
    from safetensors.torch import load_file

    name = spec["name"]
    dst = os.path.join(out, name)
    work = tempfile.mkdtemp(prefix=f"ckfs-ds-{name}-")
    try:
        oracle = os.path.join(work, "oracle")
        os.makedirs(oracle)
        if spec["trainer"]:
            src = os.path.join(work, "source_model")
            m = build_model(spec)
            m.save_pretrained(src)
            build_tokenizer().save_pretrained(src)
            run_dir = os.path.join(work, "run")
            spawn(trainer_worker, spec, run_dir, oracle)
            # the case folder is the Trainer's checkpoint-N/ itself
            ckpt = os.path.join(work, "case")
            shutil.move(os.path.join(run_dir, f"checkpoint-{STEPS}"), ckpt)
            shutil.copy(os.path.join(ckpt, "config.json"), os.path.join(oracle, "config.json"))
        else:
            ckpt = os.path.join(work, "case")
            spawn(ds_worker, spec, ckpt, oracle)
        z2f, aliases, err = z2f_oracle(ckpt, oracle)
        live = load_file(os.path.join(oracle, "live_fp32.safetensors"))
        with open(os.path.join(oracle, "live_report.json")) as f:
            live_report = json.load(f)
        os.remove(os.path.join(oracle, "live_report.json"))
        equal, diffs = compare(z2f, live, spec["frozen"])
        common_equal = not any(d["result"] != "missing from zero_to_fp32" for d in diffs)
        record = dict(
            generator="tests/gen/make_deepspeed_fixtures.py",
            versions=dict(deepspeed=deepspeed.__version__, torch=torch.__version__,
                          transformers=transformers.__version__, safetensors=safetensors.__version__,
                          python=sys.version.split()[0]),
            case=spec,
            ds_config=ds_config(spec) if not spec["trainer"] else trainer_ds_config(spec),
            steps=STEPS,
            zero_to_fp32=dict(error=err, tied_aliases_dropped=aliases,
                              keys=list(z2f) if z2f is not None else None),
            live_keys=list(live),
            live_views=live_report,
            oracles_equal_bit_for_bit=equal if z2f is not None else None,
            oracle_differences=diffs,
            oracles_equal_on_common_keys=common_equal if z2f is not None else None,
            convert_safetensors=z2f_convert_behaviour(ckpt) if z2f is not None else None,
        )
        shutil.move(oracle, os.path.join(ckpt, "oracle"))
        record["files"] = file_list(ckpt)
        with open(os.path.join(ckpt, "oracle", "case.json"), "w") as f:
            json.dump(record, f, indent=1, default=str)
            f.write("\n")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.move(ckpt, dst)
        total = sum(s for _, s in record["files"])
        log(f"[{name}] {total // 1024} KiB, oracles equal: {record['oracles_equal_bit_for_bit']}"
            f" (on common keys: {record['oracles_equal_on_common_keys']})"
            f"{'' if err is None else ', zero_to_fp32: ' + err}, live views: {live_report}")
        for d in diffs:
            log(f"[{name}]   {d}")
        return record
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    ap.add_argument("--version-matrix", action="store_true",
                    help="write MATRIX_CASES (or --only) with the installed DeepSpeed into "
                         "tests/fixtures/matrix/deepspeed-<version>/")
    a = ap.parse_args()
    if a.list:
        for c in CASES:
            print(f"{c['name']:32} {c['desc']}{'  [matrix]' if c['name'] in MATRIX_CASES else ''}")
        return 0
    out = OUT
    names = a.only.split(",") if a.only else [c["name"] for c in CASES]
    if a.version_matrix:
        import deepspeed

        out = os.path.join(MATRIX, f"deepspeed-{deepspeed.__version__}")
        names = a.only.split(",") if a.only else MATRIX_CASES
        log(f"version matrix: DeepSpeed {deepspeed.__version__}, torch {torch.__version__} -> {out}")
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        sys.exit(f"make_deepspeed_fixtures: unknown case(s) {unknown}; --list shows them")
    os.makedirs(out, exist_ok=True)
    failed = []
    for n in names:
        t0 = time.monotonic()
        try:
            make_case(BY_NAME[n], out)
        except Exception:  # noqa: BLE001 (report every case, then fail)
            traceback.print_exc()
            failed.append(n)
        log(f"[{n}] {time.monotonic() - t0:.0f} s")
    if failed:
        sys.exit(f"make_deepspeed_fixtures: failed: {failed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
