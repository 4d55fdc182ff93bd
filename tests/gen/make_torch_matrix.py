#!/usr/bin/env python3
"""One torch release's cells of the version matrix (run by tests/gen/torch_matrix.py).

Runs inside a venv that holds one torch release (plus safetensors) and nothing else, and
writes the same tiny Llama-shaped model in every way that release can save it:

    fsdp1      FSDP1 (FullyShardedDataParallel) without a device mesh, SHARDED_STATE_DICT:
               ShardedTensor values, saved per rank as verl names them
    fsdp2      FSDP2 fully_shard on a 1-D mesh of 4 with verl's placement rule (the first
               dim divisible by the mesh size, else Shard(0)): DTensors, verl's file names
    hsdp       FSDP2 on a 2-D (2, 2) mesh ("dp_replicate", "dp_shard"): (Replicate(), Shard(d))
    fsdp2_tp   tensor parallel over "tp" (colwise/rowwise linears, embeddings and norms),
               then FSDP2 over "dp" on a (2, 2) mesh: _StridedShard where torch has it
    dcp        torch.distributed.checkpoint.save of the FSDP2 model's state dict, {"model": sd}
    plain      torch.save of the full state dict, model_world_size_1_rank_0.pt

Every cell holds huggingface/config.json (the model's config, as transformers writes it for
these sizes); rank-file cells also hold verl's fsdp_config.json. The truth, the full state dict
before sharding, is original/model.safetensors beside the cells (original_tp/ for fsdp2_tp,
whose vocab is 132: FSDP2 over TP needs even shards before torch 2.6). cells.json records, per cell, the
DeviceMesh / DTensorSpec attributes this release pickles, or why the cell cannot be written.

    python make_torch_matrix.py OUT_DIR

World size 4 over gloo on the CPU (file:// rendezvous); every rank builds the same weights from
a fixed seed, so each shard is what a broadcast from rank 0 gives.
"""

from __future__ import annotations

import json
import os
import pickletools
import re
import shutil
import sys
import tempfile
import traceback
import zipfile

os.environ.setdefault("USE_LIBUV", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import warnings  # noqa: E402

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

WORLD = 4
# Vocab 131 (prime) and 48-wide MLPs: Shard(0) pieces are uneven at 4 ranks (33/33/33/32),
# verl's rule picks Shard(1) for some, k/v_proj have 16 rows (1 KV head of 16).
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 32,
    "intermediate_size": 48,
    "max_position_embeddings": 64,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "dtype": "float32",
    "vocab_size": 131,
}
CELLS = ["fsdp1", "fsdp2", "hsdp", "fsdp2_tp", "dcp", "plain"]


class RMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, hd = c["hidden_size"], c["head_dim"]
        self.q_proj = nn.Linear(h, c["num_attention_heads"] * hd, bias=False)
        self.k_proj = nn.Linear(h, c["num_key_value_heads"] * hd, bias=False)
        self.v_proj = nn.Linear(h, c["num_key_value_heads"] * hd, bias=False)
        self.o_proj = nn.Linear(c["num_attention_heads"] * hd, h, bias=False)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"])


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"])


class LlamaShaped(nn.Module):
    """The parameter names and shapes of transformers' LlamaForCausalLM; no forward needed."""

    def __init__(self, c):
        super().__init__()
        self.model = Body(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)


# FSDP2 over TP needs even shards before torch 2.6: that cell's vocab is 132 (4 x 33).
TP_CONFIG = dict(CONFIG, vocab_size=132)
TRUTH = {"fsdp2_tp": ("original_tp", TP_CONFIG)}  # the other cells: ("original", CONFIG)


def build_model(config=CONFIG):
    """The same weights on every rank and in every release: values from a fixed generator,
    norms away from 1 so that a replicated norm cannot pass for ones."""
    model = LlamaShaped(config)
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02 + (1.0 if "norm" in name else 0.0))
    return model


def verl_placement(fsdp_size):
    """verl's FSDP2 rule (verl/utils/fsdp_utils.py get_shard_placement_fn): Shard on the first
    dim whose size the mesh divides, else Shard(0)."""
    from torch.distributed.tensor import Shard

    def fn(param):
        for i, n in enumerate(param.shape):
            if n % fsdp_size == 0:
                return Shard(i)
        return Shard(0)

    return fn


def fully_shard_fn():
    try:
        from torch.distributed.fsdp import fully_shard  # 2.6+
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard  # 2.4, 2.5
    return fully_shard


def shard_fsdp2(model, mesh, placement_fn=None):
    fully_shard = fully_shard_fn()
    kw = {"shard_placement_fn": placement_fn} if placement_fn else {}
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    return model


def save_ranks(sd, cell_dir, rank, world, fsdp_version):
    torch.save(sd, os.path.join(cell_dir, f"model_world_size_{world}_rank_{rank}.pt"))
    if rank == 0:
        with open(os.path.join(cell_dir, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": fsdp_version, "world_size": world}, f, indent=4)


def cell_fsdp1(rank, cell_dir):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType

    # CPU: device_id=cpu (torch asks for an accelerator otherwise), no sync_module_states.
    model = FSDP(build_model(), device_id=torch.device("cpu"), sync_module_states=False,
                 use_orig_params=False)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        sd = model.state_dict()
    save_ranks(sd, cell_dir, rank, WORLD, 1)


def cell_fsdp2(rank, cell_dir):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("fsdp",))
    fully_shard = fully_shard_fn()
    import inspect

    fn = verl_placement(WORLD) if "shard_placement_fn" in inspect.signature(fully_shard).parameters else None
    model = shard_fsdp2(build_model(), mesh, fn)
    save_ranks(model.state_dict(), cell_dir, rank, WORLD, 2)


def cell_hsdp(rank, cell_dir):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    model = shard_fsdp2(build_model(), mesh)
    save_ranks(model.state_dict(), cell_dir, rank, WORLD, 2)


def cell_fsdp2_tp(rank, cell_dir):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    try:
        from torch.distributed.tensor import Replicate, distribute_tensor
    except ImportError:
        from torch.distributed._tensor import Replicate, distribute_tensor
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp = mesh["tp"]
    model = build_model(TP_CONFIG)
    plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[p + n] = ColwiseParallel()
        for n in ("self_attn.o_proj", "mlp.down_proj"):
            plan[p + n] = RowwiseParallel()
    parallelize_module(model, tp, plan)
    # Norms stay whole on every TP rank (what SequenceParallel does to their weights).
    for mod in model.modules():
        if isinstance(mod, RMSNorm):
            mod.weight = nn.Parameter(distribute_tensor(mod.weight.data, tp, [Replicate()]))
    model = shard_fsdp2(model, mesh["dp"])
    save_ranks(model.state_dict(), cell_dir, rank, WORLD, 2)


def cell_dcp(rank, cell_dir):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("fsdp",))
    model = shard_fsdp2(build_model(), mesh)
    dcp.save({"model": model.state_dict()}, checkpoint_id=cell_dir)


def cell_plain(rank, cell_dir):
    if rank == 0:
        save_ranks(build_model().state_dict(), cell_dir, 0, 1, 1)
        os.remove(os.path.join(cell_dir, "fsdp_config.json"))


def worker(rank, out, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        for cell in CELLS:
            cell_dir = os.path.join(out, cell)
            err = None
            try:
                globals()["cell_" + cell](rank, cell_dir)
            except Exception as e:  # recorded: the cell cannot be written by this release
                err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()
                if rank == 0:
                    traceback.print_exc()
            if rank == 0 and err:
                with open(os.path.join(cell_dir, "ERROR"), "w") as f:
                    f.write(err + "\n")
            dist.barrier()
    finally:
        dist.destroy_process_group()


def pickled_classes(path):
    """The torch.distributed classes a rank file's data.pkl names (GLOBAL and STACK_GLOBAL)
    and the private attribute names it holds: what this release pickles."""
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    classes, strings = set(), []
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            classes.add(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
            classes.add(strings[-2] + "." + strings[-1])
        elif "UNICODE" in op.name:
            strings.append(arg)
    fields = sorted({s for s in strings if re.fullmatch(r"_[a-z][a-z_]*", s)})
    return sorted(c for c in classes if "distributed" in c), fields


def describe(out):
    cells = {}
    for cell in CELLS:
        d = os.path.join(out, cell)
        rec = {}
        if os.path.exists(os.path.join(d, "ERROR")):
            with open(os.path.join(d, "ERROR")) as f:
                rec["cannot"] = f.read().strip()
            shutil.rmtree(d)
        else:
            files = sorted(os.listdir(d))
            rec["files"] = files
            pt = [f for f in files if f.endswith(".pt")]
            if pt:
                rec["classes"], rec["fields"] = pickled_classes(os.path.join(d, pt[0]))
            truth, config = TRUTH.get(cell, ("original", CONFIG))
            rec["truth"] = truth
            hf = os.path.join(d, "huggingface")
            os.makedirs(hf, exist_ok=True)
            with open(os.path.join(hf, "config.json"), "w") as f:
                json.dump(dict(config, transformers_version="5.10.4"), f, indent=2, sort_keys=True)
                f.write("\n")
        cells[cell] = rec
    return cells


def main():
    out = os.path.abspath(sys.argv[1])
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    for cell in CELLS:
        os.makedirs(os.path.join(out, cell))
    from safetensors.torch import save_file

    for truth, config in [("original", CONFIG)] + list(TRUTH.values()):
        os.makedirs(os.path.join(out, truth))
        save_file(build_model(config).state_dict(), os.path.join(out, truth, "model.safetensors"))
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(out, os.path.join(tmp, "store")), nprocs=WORLD, join=True)
    record = {"torch": torch.__version__, "python": sys.version.split()[0], "cells": describe(out)}
    with open(os.path.join(out, "cells.json"), "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    for cell, rec in record["cells"].items():
        print(f"torch {torch.__version__} {cell}: " + ("cannot: " + rec["cannot"] if "cannot" in rec else "written"))


if __name__ == "__main__":
    main()
