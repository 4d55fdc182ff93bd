#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""State dicts of wrapped modules, written by real torch code: the wrapper
names ckfs removes (src/model/names.c) and the flat parameters it refuses.

One tiny transformers LlamaForCausalLM (1 layer, hidden 8, vocab 32, GQA),
seeded, is wrapped the ways training code wraps it, and each wrapped
module's state dict is saved as a verl FSDP actor folder
(model_world_size_W_rank_R.pt, fsdp_config.json, huggingface/config.json),
as a DCP folder or as a safetensors folder:

    ddp_w2                      DDP on gloo, ddp.state_dict() on each rank: "module." on every key
    compiled_w1                 torch.compile(model).state_dict(): "_orig_mod." in front
    compiled_ddp_w2             torch.compile(DDP(model)): "_orig_mod.module."
    compiled_layers_w1          each decoder layer compiled on its own: "model.layers.0._orig_mod."
    checkpoint_wrapped_fsdp1_w2 FSDP1 + apply_activation_checkpointing, the parameters taken
                                inside summon_full_params: "._checkpoint_wrapped_module." (FSDP
                                strips its own names there, not the checkpoint wrapper's)
    fsdp1_orig_params_w2        FSDP1 NO_SHARD with use_orig_params=True, named_parameters():
                                "_fsdp_wrapped_module." at the root and in each wrapped layer
    fsdp1_full_state_dict_w2    FSDP1 FULL_SHARD, state_dict() without a state_dict_type context
                                (FULL_STATE_DICT on every rank): clean names, whole plain tensors
                                on both ranks
    refused_fsdp1_local_w2      FSDP1 LOCAL_STATE_DICT: "_flat_param" ShardedTensors
    refused_fsdp1_flat_w2       FSDP1 (use_orig_params=False) named_parameters(): the flat
                                parameters themselves, "_fsdp_wrapped_module._flat_param"
    dcp_compiled                torch.distributed.checkpoint.save({"model": compiled.state_dict()})
    hf_ddp                      safetensors save_file(ddp.state_dict()) with config.json

original/model.safetensors holds the unwrapped model's state dict: every served
folder must equal it tensor for tensor (tests/unit/test_names.c).

    .venv/bin/python tests/gen/make_wrapped_fixtures.py      # ~30 s

Re-running with the pinned packages writes the same bytes, except
dcp_compiled/.metadata (torch records a random save id and the temporary
folder the checkpoint was saved to).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("USE_LIBUV", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "wrapped")


def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # values independent of transformers' init
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


def folder(name: str, world: int | None, fsdp_version: int = 0) -> str:
    """A checkpoint folder with huggingface/config.json (and fsdp_config.json
    when world is given); FSDP_version 0 is what verl writes for a model
    that is neither FSDP1 nor FSDP2."""
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(os.path.join(path, "huggingface"))
    tiny_model().config.to_json_file(os.path.join(path, "huggingface", "config.json"))
    if world is not None:
        with open(os.path.join(path, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": fsdp_version, "world_size": world}, f, indent=4)
    return path


def save_rank(name: str, world: int, rank: int, sd: dict) -> None:
    sd = {k: v.detach().clone() if isinstance(v, torch.Tensor) and not hasattr(v, "local_shards") else v
          for k, v in sd.items()}
    torch.save(sd, os.path.join(OUT, name, f"model_world_size_{world}_rank_{rank}.pt"))


def single_process() -> None:
    from safetensors.torch import save_file

    os.makedirs(os.path.join(OUT, "original"), exist_ok=True)
    save_file({k: v.contiguous() for k, v in tiny_model().state_dict().items()},
              os.path.join(OUT, "original", "model.safetensors"), metadata={"format": "pt"})
    folder("compiled_w1", 1)
    save_rank("compiled_w1", 1, 0, torch.compile(tiny_model()).state_dict())
    folder("compiled_layers_w1", 1)
    model = tiny_model()
    for i, layer in enumerate(model.model.layers):
        model.model.layers[i] = torch.compile(layer)
    save_rank("compiled_layers_w1", 1, 0, model.state_dict())

    import torch.distributed.checkpoint as dcp

    path = folder("dcp_compiled", None)
    # Saved elsewhere and copied: .metadata records the folder it was
    # saved to, which should not be this checkout's path.
    tmp = tempfile.mkdtemp(prefix="ckfs-wrapped-")
    dcp.save({"model": torch.compile(tiny_model()).state_dict()}, checkpoint_id=tmp, no_dist=True)
    for f in os.listdir(tmp):
        shutil.copy(os.path.join(tmp, f), path)
    shutil.rmtree(tmp)


def _worker(rank: int, world: int, port: int) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy, StateDictType
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    layers = ModuleWrapPolicy({LlamaDecoderLayer})
    cpu = torch.device("cpu")

    ddp = DDP(tiny_model())
    save_rank("ddp_w2", world, rank, ddp.state_dict())
    if rank == 0:
        from safetensors.torch import save_file

        path = folder("hf_ddp", None)
        shutil.move(os.path.join(path, "huggingface", "config.json"), os.path.join(path, "config.json"))
        os.rmdir(os.path.join(path, "huggingface"))
        save_file({k: v.contiguous() for k, v in ddp.state_dict().items()},
                  os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    save_rank("compiled_ddp_w2", world, rank, torch.compile(DDP(tiny_model())).state_dict())

    model = tiny_model()
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, LlamaDecoderLayer))
    fsdp = FSDP(model, auto_wrap_policy=layers, device_id=cpu)
    with FSDP.summon_full_params(fsdp):
        save_rank("checkpoint_wrapped_fsdp1_w2", world, rank, dict(fsdp.named_parameters()))

    fsdp = FSDP(tiny_model(), auto_wrap_policy=layers, device_id=cpu, use_orig_params=True,
                sharding_strategy=ShardingStrategy.NO_SHARD)
    save_rank("fsdp1_orig_params_w2", world, rank, dict(fsdp.named_parameters()))

    fsdp = FSDP(tiny_model(), auto_wrap_policy=layers, device_id=cpu)
    save_rank("fsdp1_full_state_dict_w2", world, rank, fsdp.state_dict())
    with FSDP.state_dict_type(fsdp, StateDictType.LOCAL_STATE_DICT):
        torch.save(fsdp.state_dict(), os.path.join(OUT, "refused_fsdp1_local_w2",
                                                    f"model_world_size_{world}_rank_{rank}.pt"))
    save_rank("refused_fsdp1_flat_w2", world, rank, dict(fsdp.named_parameters()))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    single_process()
    for name in ("ddp_w2", "compiled_ddp_w2", "checkpoint_wrapped_fsdp1_w2", "fsdp1_orig_params_w2",
                 "fsdp1_full_state_dict_w2", "refused_fsdp1_local_w2", "refused_fsdp1_flat_w2"):
        folder(name, 2, fsdp_version=1 if "fsdp1" in name else 0)
    mp.spawn(_worker, args=(2, 29527), nprocs=2, join=True)
    for name in sorted(os.listdir(OUT)):
        print("wrapped:", name)
    print("torch", torch.__version__, file=sys.stderr)


if __name__ == "__main__":
    main()
