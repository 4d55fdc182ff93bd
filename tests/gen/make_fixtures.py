#!/usr/bin/env python3
"""Generate real verl FSDP checkpoints, their originals and verl's merged output.

Everything here is produced by the real libraries pinned in tests/python-requirements.txt:
transformers builds tiny models from configs, torch shards them with FSDP1 / FSDP2 over a gloo
CPU process group, verl's own FSDPCheckpointManager.save_checkpoint writes the per-rank files,
and verl's own merger (`python -m verl.model_merger merge --backend fsdp`) writes the expected
Hugging Face folders.

    .venv/bin/python tests/gen/make_fixtures.py            # everything (about 2-3 min on 2 cores)
    .venv/bin/python tests/gen/make_fixtures.py --only qwen2_fsdp2_w2 --only qwen2_hsdp_2x4
    python3 tests/gen/framework_matrix.py verl-0.5.0   # version matrix (issue #21): that verl
        # release (and transformers 4.57.6, which it needs) installed --no-deps into an overlay
        # on the venv's path, then --version-matrix here: MATRIX_CONFIGS saved by its own
        # FSDPCheckpointManager and merged by its own merger into tests/fixtures/matrix/verl-<v>/

Outputs (relative to tests/fixtures/):
    fsdp/<name>/                 the checkpoint (model/extra[/optim]_world_size_W_rank_R.pt,
                                 fsdp_config.json, huggingface/)
    original/<name>.safetensors  the HF model's full state dict before sharding (stored dtype)
    expected/<name>/             verl merger output: model.safetensors, config.json,
                                 generation_config.json
    MANIFEST.json                one record per configuration, with the layout torch produced

Where the generator deviates from a GPU run of verl it says so in a comment and prints a line
starting with "NOTE".  Deviations (all forced by running on CPU with gloo):
  * FSDP1 is built with sync_module_states=False (torch refuses sync_module_states on CPU
    modules); every rank instead builds bit-identical weights from stable seeds, so the shards
    are what a broadcast from rank 0 would give.
  * verl's fsdp2_load_full_state_dict moves the model to get_device_id(), which needs an
    accelerator; the same call sequence (set_model_state_dict with broadcast_from_rank0) is
    made here with the CPU device.
  * Local tensors are saved with location "cpu" (on GPUs FSDP2 files say "cuda:N").
  * Gradients for the one optimizer checkpoint are synthetic (0.5*|p| + 1e-3) and the step is
    taken at lr=0 (first warm-up step), so the weights stay equal to the originals while the
    AdamW state (step, exp_avg, exp_avg_sq) is real.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import pickletools
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib

# Byte-reproducible rank files: DeviceMesh and DTensorSpec pickle a cached `_hash`, computed
# with hash() over strings (PYTHONHASHSEED) and torch.dtype objects (hashed by address, so
# ASLR).  Re-exec once with a fixed hash seed and, where `setarch -R` works, without address
# randomisation; the same command line then rewrites byte-identical files (other arguments,
# e.g. --only or --layout, shift the heap and so those integers).  Otherwise only the `_hash`
# integers (and the zip's serialization_id, a checksum of the records) change between runs;
# tensors are identical either way.
if os.environ.get("CKFS_GEN_REEXEC") != "1":
    env = dict(os.environ, PYTHONHASHSEED="0", CKFS_GEN_REEXEC="1")
    argv = [sys.executable] + sys.argv
    setarch = shutil.which("setarch")
    if setarch and subprocess.run([setarch, os.uname().machine, "-R", "true"],
                                  stderr=subprocess.DEVNULL).returncode == 0:
        argv = [setarch, os.uname().machine, "-R"] + argv
    os.execve(argv[0], argv, env)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("USE_LIBUV", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VERL_LOGGING_LEVEL", "WARN")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import torch  # noqa: E402

# No OpenMP pool in the parent: workers are forked from it.
torch.set_num_threads(1)

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")

# --------------------------------------------------------------------------------------------
# Configurations
# --------------------------------------------------------------------------------------------
# Model shapes.  Vocab sizes are chosen NOT divisible by any world size used (1003 = 17*59,
# 515 = 5*103), so FSDP1 chunks are uneven and verl's FSDP2 placement fn picks Shard(1) for
# the embeddings whenever 64 % F == 0.
QWEN2 = dict(arch="qwen2", vocab_size=1003, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
LLAMA = dict(arch="llama", vocab_size=515, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)


def cfg(name, base, fsdp, world, mesh=None, names=("fsdp",), tied=False, dtype="float32", desc="",
        model_class=None, placement_fn=True, optim=False, nocfg_of=None, config_arch=None, **overrides):
    model = dict(base)
    model.update(overrides)
    if mesh is None and names is not None:
        mesh = (world,)
    return dict(name=name, model=model, fsdp_version=fsdp, world_size=world,
                mesh_shape=list(mesh) if mesh else None, mesh_dim_names=list(names) if names else None,
                tied=tied, dtype=dtype, description=desc,
                model_class=model_class or ("Qwen2ForCausalLM" if base["arch"] == "qwen2" else "LlamaForCausalLM"),
                placement_fn=placement_fn, optim=optim, nocfg_of=nocfg_of, config_arch=config_arch)


CONFIGS = [
    cfg("qwen2_fsdp1_w1", QWEN2, 1, 1,
        desc="FSDP1 world size 1 with a 1-element ('fsdp',) mesh: FSDP switches to NO_SHARD, "
             "the state dict holds plain tensors"),
    cfg("qwen2_fsdp1_w2", QWEN2, 1, 2,
        desc="FSDP1 + 1-D device mesh ('fsdp',): DTensor Shard(0), odd vocab (502/501 rows)"),
    cfg("llama_tied_fsdp1_w3", LLAMA, 1, 3, tied=True,
        desc="FSDP1 W=3, tied embeddings (separate DTensors under both keys), uneven chunks"),
    cfg("qwen2_fsdp1_w8", QWEN2, 1, 8, num_key_value_heads=1, head_dim=12,
        desc="FSDP1 W=8, head_dim 12 and 1 KV head: k/v_proj have 12 rows, chunk 2, so ranks 6 "
             "and 7 hold empty shards"),
    cfg("llama_fsdp1_sharded_w2", LLAMA, 1, 2, mesh=None, names=None,
        desc="FSDP1 without a device mesh (older verl): SHARDED_STATE_DICT gives ShardedTensor values"),
    cfg("qwen2_fsdp1_hsdp_2x2", QWEN2, 1, 4, mesh=(2, 2), names=("ddp", "fsdp"),
        desc="FSDP1 HYBRID_SHARD on a ('ddp','fsdp') (2,2) mesh: DTensor (Replicate(), Shard(0))"),
    cfg("qwen2_fsdp2_w2", QWEN2, 2, 2, optim=True,
        desc="FSDP2 fully_shard + verl placement fn, W=2: embed/lm_head [1003,64] -> Shard(1); "
             "also carries real optimizer files"),
    cfg("qwen2_fsdp2_w3", QWEN2, 2, 3, intermediate_size=96,
        desc="FSDP2 W=3: uneven Shard(0) (padded storages) and down_proj [64,96] -> Shard(1)"),
    cfg("llama_tied_fsdp2_w4", LLAMA, 2, 4, tied=True, num_key_value_heads=1,
        desc="FSDP2 W=4, tied embeddings (one DTensor object under both keys), 515 rows -> Shard(1)"),
    cfg("qwen2_fsdp2_w8", QWEN2, 2, 8, num_key_value_heads=1, head_dim=12,
        desc="FSDP2 W=8, head_dim 12, 1 KV head: k/v_proj [12,64] -> Shard(1), their biases [12] "
             "-> Shard(0) with empty shards on ranks 6-7"),
    cfg("qwen2_hsdp_2x4", QWEN2, 2, 8, mesh=(2, 4), names=("ddp", "fsdp"),
        desc="FSDP2 HSDP on a ('ddp','fsdp') (2,4) mesh: placements (Replicate(), Shard(d))"),
    cfg("qwen2_critic_fsdp2_w2", QWEN2, 2, 2, model_class="Qwen2ForTokenClassification", num_labels=1,
        desc="critic: Qwen2ForTokenClassification, num_labels=1 (score.weight [1,64] -> Shard(1)), "
             "no lm_head"),
    cfg("qwen2_critic_lmcfg_fsdp1_w2", QWEN2, 1, 2, model_class="Qwen2ForTokenClassification", num_labels=1,
        config_arch="Qwen2ForCausalLM",
        desc="critic as verl really saves it: Qwen2ForTokenClassification weights (score.weight [1,64], "
             "score.bias [1]: rank 1 holds empty shards) but config.json still says Qwen2ForCausalLM (verl "
             "only sets num_labels), so verl's merger builds a causal-LM shell and writes score.* anyway"),
    cfg("llama_bf16_fsdp2_w2", LLAMA, 2, 2, dtype="bfloat16",
        desc="FSDP2 W=2 with bf16 master parameters (like verl's ref model)"),
    cfg("llama_fsdp2_w3_noplacement", LLAMA, 2, 3, placement_fn=False,
        desc="FSDP2 W=3 with torch's default placement (Shard(0) everywhere), which is what "
             "verl 0.9.1's engine passes (it no longer sets shard_placement_fn)"),
    cfg("qwen2_fsdp1_w2_nocfg", QWEN2, 1, 2, nocfg_of="qwen2_fsdp1_w2",
        desc="legacy checkpoint: identical to qwen2_fsdp1_w2 minus fsdp_config.json; verl's merger "
             "refuses it, the expected output is qwen2_fsdp1_w2's"),
]

# The verl version matrix (issue #21): this configuration saved by an older verl release's own
# FSDPCheckpointManager and merged by its own merger, into
# tests/fixtures/matrix/verl-<version>/{fsdp,original,expected}/ (tests/gen/framework_matrix.py
# puts the release on PYTHONPATH). FSDP2 with torch's default placement (Shard(0)), which the
# workers of verl 0.5.0 and of 0.8.0 on pass; 0.5.0 has no get_shard_placement_fn.
MATRIX_CONFIGS = ["llama_fsdp2_w3_noplacement"]

TOKENIZER_WORDS = ["hello", "world", "the", "a", "model", "checkpoint", "merge", "shard", "tensor",
                   "verl", "fsdp", "user", "assistant", "system", "is", "good", "!", "?", ".", ","]
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' ' + message['content'] "
                 "+ ' <|im_end|> ' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|> assistant ' }}"
                 "{% endif %}")
PROMPT = "<s> hello world the model is good <|im_end|> tensor shard merge ."


def log(*a):
    print(*a, flush=True)


# --------------------------------------------------------------------------------------------
# Deterministic weights
# --------------------------------------------------------------------------------------------
def stable_seed(*parts) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


# fp32 bit patterns planted at the start of every tensor: exact bf16 ties (to even / odd, both
# signs), values that round up into the next binade, a subnormal, -0.0 and fp16 edge values.
SPECIAL_F32_BITS = [0x3F808000, 0x3F818000, 0xBF808000, 0xBF818000, 0x3F80FFFF, 0x3F7FFFFF,
                    0x00008000, 0x80000000, 0x477FE000, 0x33000001, 0x3C808000, 0xBC018000]


def special_values():
    return torch.tensor(struct.unpack("<%df" % len(SPECIAL_F32_BITS),
                                      struct.pack("<%dI" % len(SPECIAL_F32_BITS), *SPECIAL_F32_BITS)))


def fill_weights(model, key: str, dtype):
    """Overwrite every parameter with seeded values (independent of torch's init RNG)."""
    specials = special_values()
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
            flat = t.view(-1)
            n = min(flat.numel(), specials.numel())
            # 65504-ish values only in 2-D weights' first row, never in norms (keeps logits finite)
            sv = specials[:n].clone()
            if "norm" in pname:
                sv = sv.clamp(-2, 2)
            flat[:n] = sv
            p.copy_(t.to(dtype))


# --------------------------------------------------------------------------------------------
# Tokenizer and source model folder (what verl's actor would be loaded from)
# --------------------------------------------------------------------------------------------
def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIAL + TOKENIZER_WORDS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                  pad_token="<pad>", additional_special_tokens=["<|im_start|>", "<|im_end|>"],
                                  model_max_length=128)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def hf_config(spec):
    from transformers import LlamaConfig, Qwen2Config

    m = dict(spec["model"])
    arch = m.pop("arch")
    cls = Qwen2Config if arch == "qwen2" else LlamaConfig
    extra = {}
    if arch == "qwen2":
        extra.update(use_sliding_window=False)
    c = cls(max_position_embeddings=128, tie_word_embeddings=spec["tied"], bos_token_id=1, eos_token_id=2,
            pad_token_id=0, rms_norm_eps=1e-6, rope_theta=10000.0, **extra, **m)
    # A config loaded from a hub model names its causal-LM class; verl's critic keeps that
    # config and only sets num_labels, but here the critic names its own class (see MANIFEST).
    c.architectures = [spec["model_class"]]
    return c


def model_cls(spec):
    import transformers

    return getattr(transformers, spec["model_class"])


def torch_dtype(spec):
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[spec["dtype"]]


def prepare_source(spec, srcdir):
    """Build the 'pretrained' HF folder verl would load, plus the original state dict."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    c = hf_config(spec)
    model = model_cls(spec)(c).to(torch_dtype(spec))
    fill_weights(model, spec["name"] if not spec["nocfg_of"] else spec["nocfg_of"], torch_dtype(spec))
    if model.can_generate():
        model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, do_sample=True,
                                                   temperature=0.7, top_p=0.8, max_new_tokens=16)
    model.config.dtype = torch_dtype(spec)
    model.save_pretrained(srcdir)
    if spec["config_arch"]:
        # verl's critic: AutoConfig of the causal-LM checkpoint + num_labels=1, architectures untouched
        from transformers import AutoConfig

        c2 = AutoConfig.from_pretrained(srcdir)
        c2.architectures = [spec["config_arch"]]
        c2.save_pretrained(srcdir)
    build_tokenizer().save_pretrained(srcdir)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    return sd, save_file


# --------------------------------------------------------------------------------------------
# Worker: one rank of a sharded "training job" that saves a verl checkpoint
# --------------------------------------------------------------------------------------------
def describe_value(v):
    from torch.distributed.tensor import DTensor

    def tinfo(t):
        st = t.untyped_storage()
        return dict(shape=list(t.shape), stride=list(t.stride()), storage_offset=t.storage_offset(),
                    storage_bytes=st.nbytes(), dtype=str(t.dtype).replace("torch.", ""), device=str(t.device),
                    contiguous=t.is_contiguous())

    if isinstance(v, DTensor):
        m = v.device_mesh
        return dict(kind="DTensor", global_shape=list(v.shape), placements=[repr(p) for p in v.placements],
                    mesh_shape=list(m.mesh.shape), mesh_dim_names=list(m.mesh_dim_names or []),
                    coordinate=m.get_coordinate(), local=tinfo(v._local_tensor))
    if type(v).__name__ == "ShardedTensor":
        return dict(kind="ShardedTensor", global_shape=list(v.size()),
                    local_shards=[dict(offsets=list(s.metadata.shard_offsets), sizes=list(s.metadata.shard_sizes),
                                       **tinfo(s.tensor)) for s in v.local_shards()],
                    all_shards=[dict(offsets=list(s.shard_offsets), sizes=list(s.shard_sizes),
                                     placement=str(s.placement)) for s in v.metadata().shards_metadata])
    if isinstance(v, torch.Tensor):
        return dict(kind="Tensor", global_shape=list(v.shape), local=tinfo(v))
    return dict(kind=type(v).__name__)


def worker(rank, spec, srcdir, outdir, store, infodir):
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    W = spec["world_size"]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=W)
    try:
        _worker(rank, spec, srcdir, outdir, infodir)
    finally:
        dist.destroy_process_group()


def _worker(rank, spec, srcdir, outdir, infodir):
    from omegaconf import DictConfig
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoConfig
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.fsdp_utils import apply_fsdp2, get_fsdp_wrap_policy
    from verl.utils.tokenizer import hf_tokenizer

    W = spec["world_size"]
    dtype = torch_dtype(spec)

    # verl: create_device_mesh(world_size, fsdp_size)  (verl/workers/engine/fsdp/utils.py)
    mesh = None
    if spec["mesh_shape"] is not None:
        mesh = init_device_mesh("cpu", mesh_shape=tuple(spec["mesh_shape"]), mesh_dim_names=spec["mesh_dim_names"])

    # verl: AutoModelForCausalLM.from_pretrained(local_path, torch_dtype=fp32 (actor) | bf16 (ref))
    config = AutoConfig.from_pretrained(srcdir)
    model = model_cls(spec).from_pretrained(srcdir, config=config, dtype=dtype)
    # Every rank refills the weights from the same stable seeds (see module docstring).
    fill_weights(model, spec["name"] if not spec["nocfg_of"] else spec["nocfg_of"], dtype)
    tokenizer = hf_tokenizer(srcdir)

    if spec["fsdp_version"] == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision, ShardingStrategy

        strategy = ShardingStrategy.HYBRID_SHARD if mesh is not None and mesh.ndim == 2 else ShardingStrategy.FULL_SHARD
        # verl (transformer_impl._build_fsdp_module): FSDP(module, param_init_fn=init_fn,
        #   auto_wrap_policy=..., device_id=get_device_id(), sharding_strategy=...,
        #   mixed_precision=MixedPrecision(bf16, fp32, fp32), sync_module_states=True,
        #   device_mesh=self.device_mesh, forward_prefetch=False, use_orig_params=False)
        # CPU: device_id=cpu and sync_module_states=False (torch refuses it for CPU modules).
        model = FSDP(model, auto_wrap_policy=get_fsdp_wrap_policy(model, config={}, is_lora=False),
                     device_id=torch.device("cpu"), sharding_strategy=strategy,
                     mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                    buffer_dtype=torch.float32),
                     sync_module_states=False, device_mesh=mesh, forward_prefetch=False, use_orig_params=False)
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.fsdp import MixedPrecisionPolicy

        fsdp_kwargs = {
            "mesh": mesh,
            "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                              cast_forward_inputs=True),
            "offload_policy": None,
            "reshard_after_forward": True,
        }
        if spec["placement_fn"]:
            # verl (fsdp_workers.py of 0.6.1 and 0.7.1 passes it; verl.utils.fsdp_utils defines
            # it from 0.6.1 on, verl 0.5.0 has none, so it is imported only here)
            from verl.utils.fsdp_utils import get_shard_placement_fn

            fsdp_kwargs["shard_placement_fn"] = get_shard_placement_fn(fsdp_size=mesh.shape[-1])
        full_state = model.state_dict()
        apply_fsdp2(model, fsdp_kwargs, {})
        # verl's fsdp2_load_full_state_dict, with the CPU in place of get_device_id()
        set_model_state_dict(model, full_state if rank == 0 else {},
                             options=StateDictOptions(full_state_dict=True, cpu_offload=False,
                                                      broadcast_from_rank0=True))
        for _, buf in sorted(model.named_buffers(), key=lambda x: x[0]):
            dist.broadcast(buf, src=0)

    optimizer = lr_scheduler = None
    save_contents = ["model", "extra"]
    # verl builds an AdamW + LambdaLR warm-up schedule for every actor; extra_state holds the
    # scheduler state even when the optimizer file is not written.
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.999), weight_decay=0.01)
    lr_scheduler = get_constant_schedule_with_warmup(optimizer=optimizer, num_warmup_steps=5)
    if spec["optim"]:
        save_contents.append("optimizer")
        for p in model.parameters():
            p.grad = p.detach().abs() * 0.5 + 1e-3
        optimizer.step()  # lr is 0 at warm-up step 0: weights unchanged, AdamW state real
        optimizer.zero_grad(set_to_none=True)
    lr_scheduler.step()

    # what lands in extra_state's rng (torch, numpy, random)
    import random

    import numpy as np

    torch.manual_seed(stable_seed("rng", spec["name"], rank))
    np.random.seed(stable_seed("np", spec["name"], rank))
    random.seed(stable_seed("py", spec["name"], rank))
    mgr = FSDPCheckpointManager(model=model, optimizer=optimizer, lr_scheduler=lr_scheduler,
                                processing_class=tokenizer,
                                checkpoint_config=DictConfig({"save_contents": save_contents,
                                                              "load_contents": save_contents}))
    mgr.save_checkpoint(local_path=outdir, global_step=1, max_ckpt_to_keep=None)
    dist.barrier()

    sd = torch.load(os.path.join(outdir, f"model_world_size_{W}_rank_{rank}.pt"), map_location="cpu",
                    weights_only=False)
    info = {k: describe_value(v) for k, v in sd.items()}
    keys = list(sd)
    shared = [[a, b] for i, a in enumerate(keys) for b in keys[i + 1:] if sd[a] is sd[b]]

    def storage_ptr(v):
        t = getattr(v, "_local_tensor", v)
        if type(v).__name__ == "ShardedTensor":
            t = v.local_shards()[0].tensor if v.local_shards() else None
        return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) and t.numel() else None

    ptrs = {k: storage_ptr(v) for k, v in sd.items()}
    shared_storage = [[a, b] for i, a in enumerate(keys) for b in keys[i + 1:]
                      if ptrs[a] is not None and ptrs[a] == ptrs[b]]
    with open(os.path.join(infodir, f"rank{rank}.json"), "w") as f:
        json.dump(dict(tensors=info, key_order=keys, same_object=shared, same_storage=shared_storage), f)


# --------------------------------------------------------------------------------------------
# Pickle inspection (what a C reader will meet)
# --------------------------------------------------------------------------------------------
def pickle_globals(path):
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        pkl = [n for n in names if n.endswith("/data.pkl")][0]
        data = z.read(pkl)
        globals_, proto = set(), None
        for op, arg, _ in pickletools.genops(io.BytesIO(data)):
            if op.name == "PROTO":
                proto = arg
            if op.name in ("GLOBAL", "STACK_GLOBAL", "INST"):
                globals_.add(arg if arg else op.name)
        # STACK_GLOBAL carries its names on the stack; recover them from the string ops before it
        ops = list(pickletools.genops(io.BytesIO(data)))
        strs = []
        for op, arg, _ in ops:
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
                strs.append(arg)
            if op.name == "STACK_GLOBAL" and len(strs) >= 2:
                globals_.add(f"{strs[-2]} {strs[-1]}")
        globals_.discard("STACK_GLOBAL")
        return dict(archive_root=pkl.split("/")[0], protocol=proto, globals=sorted(globals_),
                    records=[n.split("/", 1)[1] for n in names][:8] + (["..."] if len(names) > 8 else []))


def device_mesh_state(path):
    """Attributes of the pickled DeviceMesh (first DTensor), loaded without a process group."""
    sd = torch.load(path, map_location="cpu", weights_only=False)
    from torch.distributed.tensor import DTensor

    for v in sd.values():
        if isinstance(v, DTensor):
            m = v.device_mesh
            d = {}
            for k, val in sorted(vars(m).items()):
                if isinstance(val, torch.Tensor):
                    d[k] = f"Tensor(dtype={val.dtype}, shape={list(val.shape)}, values={val.flatten().tolist()})"
                else:
                    d[k] = repr(val)
            return d
    return None


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------
def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def summarize_layout(spec, ranks):
    """Condense per-rank info into MANIFEST form: per tensor, global shape + placements + locals."""
    out = {}
    for key in ranks[0]["key_order"]:
        r0 = ranks[0]["tensors"][key]
        ent = dict(kind=r0["kind"], global_shape=r0["global_shape"])
        if r0["kind"] == "DTensor":
            ent["placements"] = r0["placements"]
        if r0["kind"] in ("DTensor", "Tensor"):
            ent["dtype"] = r0["local"]["dtype"]
            ent["locals"] = [[r["tensors"][key]["local"][f] for f in ("shape", "stride", "storage_offset",
                                                                       "storage_bytes")] for r in ranks]
        else:
            ent["dtype"] = r0["local_shards"][0]["dtype"] if r0["local_shards"] else None
            ent["locals"] = [[[s["offsets"], s["shape"], s["stride"], s["storage_offset"], s["storage_bytes"]]
                              for s in r["tensors"][key]["local_shards"]] for r in ranks]
        out[key] = ent
    return out


def print_layout(name, layout):
    log(f"  layout of {name}:  key: kind placements global -> per rank local shape/stride/offset/storage-bytes")
    for key, e in layout.items():
        pl = ",".join(e.get("placements", [])) or "-"
        notes = []
        if e["kind"] in ("DTensor", "Tensor"):
            loc = e["locals"]
            esz = 2 if e["dtype"] == "bfloat16" else 4
            for r, (shape, stride, off, sb) in enumerate(loc):
                numel = 1
                for s in shape:
                    numel *= s
                flags = []
                if numel == 0:
                    flags.append("EMPTY")
                if sb != numel * esz:
                    flags.append(f"storage {sb // esz} elems")
                if off:
                    flags.append(f"off {off}")
                exp = [1] * len(shape)
                for i in range(len(shape) - 2, -1, -1):
                    exp[i] = exp[i + 1] * shape[i + 1]
                if shape and stride != exp and numel > 0:
                    flags.append(f"stride {stride}")
                notes.append(f"r{r}:{'x'.join(map(str, shape)) or 'scalar'}" + (f"[{' '.join(flags)}]" if flags else ""))
        else:
            notes = [f"r{r}:" + ";".join(f"@{s[0]}:{'x'.join(map(str, s[1]))}" for s in sh) for r, sh in enumerate(e["locals"])]
        log(f"    {key:45s} {e['kind'][:7]:7s} {pl:28s} {str(e['global_shape']):11s} " + " ".join(notes))


def run_ranks(spec, srcdir, outdir, tmp):
    store = os.path.join(tmp, "store")
    infodir = os.path.join(tmp, "info")
    os.makedirs(infodir, exist_ok=True)
    mp.start_processes(worker, args=(spec, srcdir, outdir, store, infodir), nprocs=spec["world_size"],
                       start_method="fork", join=True)
    return [json.load(open(os.path.join(infodir, f"rank{r}.json"))) for r in range(spec["world_size"])]


def merger_cmd(local_dir, target_dir):
    return [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", local_dir,
            "--target_dir", target_dir]


def helper_cmd(local_dir, target_dir):
    return [sys.executable, os.path.join(REPO, "tests", "gen", "merge_sharded_tensor.py"), "merge", "--backend",
            "fsdp", "--local_dir", local_dir, "--target_dir", target_dir]


def run_jobs(jobs, njobs):
    """Run (name, kind, cmd, target) jobs, njobs at a time; {(name, kind): (rc, seconds, log lines)}."""
    pending, running, results = list(jobs), [], {}
    while pending or running:
        while pending and len(running) < njobs:
            name, kind, cmd, target = pending.pop(0)
            logf = open(target + ".log", "w")
            p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=merger_env(), cwd=REPO)
            running.append((p, name, kind, target, logf, time.time()))
        time.sleep(0.1)
        for item in list(running):
            p, name, kind, target, logf, t0 = item
            if p.poll() is not None:
                logf.close()
                running.remove(item)
                results[(name, kind)] = (p.returncode, time.time() - t0,
                                         open(target + ".log").read().strip().splitlines())
    return results


def merger_env():
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONHASHSEED="0", CUDA_VISIBLE_DEVICES="",
               TOKENIZERS_PARALLELISM="false")
    return env


def check_expected(name, original, expected_dir, tied):
    """The verl output must equal the original cast to bf16 (sanity check of the fixture)."""
    from safetensors import safe_open

    files = sorted(f for f in os.listdir(expected_dir) if f.endswith(".safetensors"))
    got = {}
    for fn in files:
        with safe_open(os.path.join(expected_dir, fn), framework="pt") as f:
            for k in f.keys():
                got[k] = f.get_tensor(k)
    want = dict(original)
    if tied:
        want.pop("lm_head.weight", None)
    assert set(got) == set(want), (name, sorted(set(got) ^ set(want)))
    for k, v in want.items():
        assert got[k].dtype == torch.bfloat16 and torch.equal(got[k], v.to(torch.bfloat16)), (name, k)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", help="generate only these configurations (repeatable)")
    ap.add_argument("--out", default=FIXTURES, help="fixtures root (default tests/fixtures)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel verl merger runs")
    ap.add_argument("--layout", action="store_true", help="print the full per-tensor layout of every config")
    ap.add_argument("--version-matrix", action="store_true",
                    help="MATRIX_CONFIGS with the verl on the path into tests/fixtures/matrix/verl-<version>/")
    args = ap.parse_args()

    import safetensors
    import transformers
    import verl

    if args.version_matrix:
        args.out = os.path.join(FIXTURES, "matrix", f"verl-{verl.__version__}")
        args.only = args.only or MATRIX_CONFIGS
        log(f"version matrix: verl {verl.__version__} from {os.path.dirname(verl.__file__)} -> {args.out}")

    t_start = time.time()
    specs = [s for s in CONFIGS if not args.only or s["name"] in args.only]
    for sub in ("fsdp", "original", "expected"):
        os.makedirs(os.path.join(args.out, sub), exist_ok=True)
    manifest_path = os.path.join(args.out, "MANIFEST.json")
    manifest = {"configs": []}
    if os.path.exists(manifest_path):
        manifest = json.load(open(manifest_path))
    by_name = {c["name"]: c for c in manifest.get("configs", [])}

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, verl {verl.__version__}, "
        f"safetensors {safetensors.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}")
    log("NOTE: CPU/gloo run: FSDP1 sync_module_states=False (identical seeded weights on every rank), "
        "FSDP2 full-state load via set_model_state_dict on CPU, locations saved as 'cpu'")

    merges = []  # (spec, ckpt_dir, target_dir)
    tmp_root = tempfile.mkdtemp(prefix="ckfs-fixtures-")
    try:
        for spec in specs:
            name = spec["name"]
            t0 = time.time()
            ckpt = os.path.join(args.out, "fsdp", name)
            shutil.rmtree(ckpt, ignore_errors=True)
            tmp = os.path.join(tmp_root, name)
            srcdir = os.path.join(tmp, "src")
            os.makedirs(srcdir)

            original, save_file = prepare_source(spec, srcdir)
            save_file(original, os.path.join(args.out, "original", name + ".safetensors"))

            if spec["fsdp_version"] == 1 and spec["mesh_shape"] is None:
                log(f"NOTE: {name}: FSDP1 without device_mesh -> torch {torch.__version__} still produces "
                    "ShardedTensor under SHARDED_STATE_DICT")
            ranks = run_ranks(spec, srcdir, ckpt, tmp)
            # verl's manager has no 'global_step' files inside actor/; nothing else to remove
            if spec["nocfg_of"]:
                os.remove(os.path.join(ckpt, "fsdp_config.json"))
            layout = summarize_layout(spec, ranks)
            rec = dict(name=name, model_class=spec["model_class"],
                       config_architectures=[spec["config_arch"] or spec["model_class"]],
                       architecture=spec["model"]["arch"],
                       world_size=spec["world_size"], fsdp_version=spec["fsdp_version"],
                       mesh_shape=spec["mesh_shape"], mesh_dim_names=spec["mesh_dim_names"],
                       tied=spec["tied"], stored_dtype=spec["dtype"],
                       shard_placement_fn="verl get_shard_placement_fn" if (spec["fsdp_version"] == 2 and
                                                                            spec["placement_fn"]) else
                       ("torch default (Shard(0))" if spec["fsdp_version"] == 2 else None),
                       has_fsdp_config=not spec["nocfg_of"], has_optimizer=spec["optim"],
                       model_config={k: v for k, v in spec["model"].items()},
                       description=spec["description"],
                       same_object_keys=ranks[0]["same_object"],
                       same_storage_keys=ranks[0]["same_storage"],
                       pickle=pickle_globals(os.path.join(ckpt, f"model_world_size_{spec['world_size']}_rank_0.pt")),
                       tensors=layout)
            if spec["fsdp_version"] == 2 or spec["mesh_shape"] not in (None, [1]):
                rec["device_mesh_attributes"] = device_mesh_state(
                    os.path.join(ckpt, f"model_world_size_{spec['world_size']}_rank_0.pt"))
            by_name[name] = rec
            size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(ckpt) for f in fs)
            log(f"[{name}] sharded W={spec['world_size']} FSDP{spec['fsdp_version']} in {time.time() - t0:.1f}s, "
                f"{size / 1e6:.2f} MB")
            summary_lines(name, layout, ranks, args.layout)
            target = os.path.join(tmp, "merged")
            merges.append((spec, ckpt, target, original))

        # ---- verl's merger, the oracle --------------------------------------------------------
        jobs = []  # (name, kind, cmd, target)
        for spec, ckpt, target, _ in merges:
            jobs.append((spec["name"], "verl", merger_cmd(ckpt, target), target))
            if spec["fsdp_version"] == 1 and spec["mesh_shape"] is None:
                jobs.append((spec["name"], "helper", helper_cmd(ckpt, target + "_helper"), target + "_helper"))
        log(f"running verl's merger: {len(jobs)} runs, {args.jobs} at a time")
        results = run_jobs(jobs, args.jobs)

        for spec, ckpt, target, original in merges:
            name = spec["name"]
            rc, dt, logtail = results[(name, "verl")]
            rec = by_name[name]
            exp = os.path.join(args.out, "expected", name)
            shutil.rmtree(exp, ignore_errors=True)
            rec["merge_command"] = "python -m verl.model_merger merge --backend fsdp --local_dir DIR --target_dir OUT"
            if rc == 0:
                rec["verl_merger"] = "ok"
                source = target
            else:
                err = next((ln for ln in reversed(logtail) if "Error" in ln), logtail[-1] if logtail else "")
                err = err.replace(os.path.abspath(args.out) + os.sep, "tests/fixtures/").replace(tmp_root, "<tmp>")
                rec["verl_merger"] = f"fails (exit {rc}): {err.strip()}"
                log(f"[{name}] verl merger FAILED as recorded (exit {rc}): {err.strip()}")
                source = None
                if (name, "helper") in results:
                    hrc, dt, htail = results[(name, "helper")]
                    if hrc != 0:
                        raise SystemExit(f"{name}: merge_sharded_tensor.py failed:\n" + "\n".join(htail[-20:]))
                    rec["merge_command"] = ("python tests/gen/merge_sharded_tensor.py merge --backend fsdp "
                                            "--local_dir DIR --target_dir OUT")
                    source = target + "_helper"
                elif not spec["nocfg_of"]:
                    raise SystemExit(f"verl merger failed on {name}:\n" + "\n".join(logtail[-20:]))
            if source is None:
                rec["expected"] = spec["nocfg_of"]
                continue
            os.makedirs(exp)
            for fn in sorted(os.listdir(source)):
                if fn.endswith(".safetensors") or fn in ("model.safetensors.index.json", "config.json",
                                                         "generation_config.json"):
                    shutil.copy2(os.path.join(source, fn), os.path.join(exp, fn))
            check_expected(name, original, exp, spec["tied"])
            rec["expected"] = name
            log(f"[{name}] {'verl merger' if source == target else 'merge_sharded_tensor.py'} ok in {dt:.1f}s "
                f"-> expected/{name} ({', '.join(sorted(os.listdir(exp)))}); equals original.to(bf16)")
        order = [c["name"] for c in CONFIGS]
        manifest = {
            "generator": "tests/gen/make_fixtures.py",
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "verl": verl.__version__, "safetensors": safetensors.__version__,
                         "python": sys.version.split()[0]},
            "prompt": PROMPT,
            "configs": [by_name[n] for n in order if n in by_name],
        }
        with open(manifest_path, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=False)
            f.write("\n")
        log(f"wrote {manifest_path}; total {time.time() - t_start:.1f}s")
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)


def summary_lines(name, layout, ranks, full):
    kinds = sorted({e["kind"] for e in layout.values()})
    pl = {}
    empty, padded, strided, offs = [], [], [], []
    for key, e in layout.items():
        pl.setdefault(",".join(e.get("placements", [])) or e["kind"], []).append(key)
        if e["kind"] in ("DTensor", "Tensor"):
            esz = 2 if e["dtype"] == "bfloat16" else 4
            for r, (shape, stride, off, sb) in enumerate(e["locals"]):
                numel = 1
                for s in shape:
                    numel *= s
                if numel == 0:
                    empty.append(f"{key}@r{r}")
                if sb != numel * esz:
                    padded.append(f"{key}@r{r}:{'x'.join(map(str, shape))} in {sb // esz}")
                if off:
                    offs.append(f"{key}@r{r}:{off}")
                exp = [1] * len(shape)
                for i in range(len(shape) - 2, -1, -1):
                    exp[i] = exp[i + 1] * shape[i + 1]
                if numel and stride != exp:
                    strided.append(f"{key}@r{r}:{stride}")
    log(f"  value kinds: {kinds}; same-object keys: {ranks[0]['same_object']}; "
        f"keys sharing a storage: {ranks[0]['same_storage']}")
    for p, keys in sorted(pl.items()):
        log(f"  {p}: {len(keys)} tensors" + (f" e.g. {[k for k in keys if 'layers.1.' not in k][:6]}"
                                               if p not in ("(Shard(dim=0),)",) else ""))
    log(f"  empty local shards: {empty[:12]}{' ...' if len(empty) > 12 else ''}")
    log(f"  storage larger than local tensor: {padded[:8]}{' ...(%d)' % len(padded) if len(padded) > 8 else ''}")
    log(f"  nonzero storage offsets: {offs[:8]}{' ...(%d)' % len(offs) if len(offs) > 8 else ''}")
    log(f"  non-contiguous strides: {strided[:8]}{' ...(%d)' % len(strided) if len(strided) > 8 else ''}")
    if full:
        print_layout(name, layout)


if __name__ == "__main__":
    main()
