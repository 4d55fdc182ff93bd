#!/usr/bin/env python3
"""Edge-case checkpoints written by real torch, for the reader's corner cases.

verl's fixtures (make_fixtures.py) cover what FSDP produces; these cover what
a torch.save file may legally hold and FSDP happens not to: views with a
storage offset, transposed and expanded (zero-stride) views sharing one
storage, a neg-bit view, every stored dtype ckfs supports, 0-d and empty
tensors, nn.Parameter, and DTensors with _StridedShard on a 2-D mesh (the
FSDP2 + TP layout); plain tensors saved on every rank, with copies that
agree and copies that differ in values (metadata agrees: only `ckfs
verify` can tell). Each is laid out as a verl FSDP actor folder, and the
logical tensors are saved next to it as the expected values.

    .venv/bin/python tests/gen/make_edge_fixtures.py

Outputs (relative to tests/fixtures/edge/):
    <name>/                       model_world_size_W_rank_R.pt, fsdp_config.json,
                                  huggingface/config.json
    <name>.expected.safetensors   the logical (dense, contiguous) tensors
"""

from __future__ import annotations

import json
import os
import shutil
import sys

os.environ.setdefault("USE_LIBUV", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "edge")
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float32",
          "tie_word_embeddings": False}


def folder(name: str, world_size: int) -> str:
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(os.path.join(path, "huggingface"))
    with open(os.path.join(path, "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 2, "world_size": world_size}, f, indent=4)
    with open(os.path.join(path, "huggingface", "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    return path


def expected(name: str, sd: dict) -> None:
    dense = {k: (v.resolve_neg() if v.is_neg() else v).detach().clone().contiguous() for k, v in sd.items()}
    save_file(dense, os.path.join(OUT, f"{name}.expected.safetensors"), metadata={"format": "pt"})


def plain_views() -> None:
    """World size 1, plain tensors of every kind a torch.save may hold."""
    g = torch.Generator().manual_seed(7)
    base = torch.randn(6, 5, generator=g)
    other = torch.randn(4, 3, generator=g)
    sd = {
        "base": base,                                  # shares its storage with the next three
        "transposed": base.t(),                        # strides (1, 5)
        "rows_2_4": base[2:4],                         # storage offset 10
        "column_3": base[:, 3],                        # offset 3, stride 5
        "expanded": other[1:2].expand(5, 3),           # zero stride on dim 0
        "negated": torch._neg_view(other),             # neg bit set
        "param": torch.nn.Parameter(torch.randn(3, 7, generator=g)),
        "scalar": torch.tensor(3.25),
        "empty": torch.zeros(0, 4),
        "f64": torch.randn(3, 3, generator=g, dtype=torch.float64),
        "f16": torch.randn(5, 2, generator=g).half(),
        "bf16": torch.randn(2, 5, generator=g).bfloat16(),
        "i64": torch.randint(-2**40, 2**40, (7,), generator=g, dtype=torch.int64),
        "i32": torch.randint(-2**30, 2**30, (2, 3), generator=g, dtype=torch.int32),
        "i16": torch.randint(-2**15, 2**15, (9,), generator=g, dtype=torch.int16),
        "i8": torch.randint(-128, 128, (11,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 256, (13,), generator=g, dtype=torch.uint8),
        "bool": torch.randint(0, 2, (3, 3), generator=g).bool(),
        "f8_e4m3": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
        "f8_e5m2": torch.randn(4, 4, generator=g).to(torch.float8_e5m2),
    }
    assert sd["negated"].is_neg(), "torch no longer keeps the neg bit on this view"
    path = folder("plain_views_w1", 1)
    torch.save(sd, os.path.join(path, "model_world_size_1_rank_0.pt"))
    expected("plain_views_w1", sd)
    print("edge: plain_views_w1 (views, shared storage, neg bit, every dtype)")


def plain_copies() -> None:
    """Plain (non-DTensor) tensors saved whole on every rank, as DDP or
    FSDP1's FULL_STATE_DICT on every rank write them: the same values on
    each rank (plain_copies_w2, with a NaN, a 0-d tensor, bf16 and int64),
    and checkpoints whose copies differ in values only, which verl's merger
    refuses and `ckfs verify` must too (copies_differ_*): one element of a
    matrix on rank 1 of 2, a 0-d tensor on rank 2 of 3."""
    g = torch.Generator().manual_seed(13)
    sd = {
        "model.embed_tokens.weight": torch.randn(6, 4, generator=g),
        "model.norm.weight": torch.tensor([1.0, float("nan"), -0.0, 2.5]),
        "model.step": torch.tensor(7.0),
        "model.half.weight": torch.randn(3, 2, generator=g).bfloat16(),
        "model.position_ids": torch.arange(5, dtype=torch.int64),
    }
    cases = {
        "plain_copies_w2": (2, {}),
        "copies_differ_w2": (2, {1: ("model.embed_tokens.weight", (4, 2), 0.5)}),
        "copies_differ_scalar_w3": (3, {2: ("model.step", (), 8.0)}),
    }
    for name, (world, changes) in cases.items():
        path = folder(name, world)
        for rank in range(world):
            local = {k: v.clone() for k, v in sd.items()}
            if rank in changes:
                key, index, value = changes[rank]
                local[key][index] = value
            torch.save(local, os.path.join(path, f"model_world_size_{world}_rank_{rank}.pt"))
    expected("plain_copies_w2", sd)
    print("edge: plain_copies_w2, copies_differ_w2, copies_differ_scalar_w3 (plain tensors on every rank)")


def _hsdp_copies_worker(rank: int, world: int, port: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ddp", "fsdp"))
    g = torch.Generator().manual_seed(17)
    weight = torch.randn(6, 4, generator=g)
    buffer = torch.randn(5, generator=g)
    if rank == 3:  # replica 1's copy of the plain buffer differs
        buffer[2] += 1.0
    sd = {"model.layers.0.mlp.weight": distribute_tensor(weight, mesh, [Replicate(), Shard(0)]),
          "model.rotary.inv_freq": buffer}
    torch.save(sd, os.path.join(OUT, "copies_differ_hsdp_2x2", f"model_world_size_{world}_rank_{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def hsdp_copies() -> None:
    folder("copies_differ_hsdp_2x2", 4)
    mp.spawn(_hsdp_copies_worker, args=(4, 29521), nprocs=4, join=True)
    print("edge: copies_differ_hsdp_2x2 (HSDP; replica rank 3's plain buffer differs)")


def refused() -> None:
    """Checkpoints ckfs must refuse with an error naming the key."""
    path = folder("refused_value_w1", 1)
    torch.save({"weight": torch.ones(2, 2), "step": 5}, os.path.join(path, "model_world_size_1_rank_0.pt"))
    path = folder("refused_quantized_w1", 1)
    q = torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8)
    torch.save({"weight": torch.ones(2, 2), "qweight": q}, os.path.join(path, "model_world_size_1_rank_0.pt"))
    print("edge: refused_value_w1, refused_quantized_w1 (values ckfs cannot serve)")


def _partial_worker(rank: int, world: int, port: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    t = DTensor.from_local(torch.full((3, 2), float(rank + 1)), mesh, [Partial()])
    path = os.path.join(OUT, "refused_partial_w2")
    torch.save({"weight": t}, os.path.join(path, f"model_world_size_{world}_rank_{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def partial() -> None:
    folder("refused_partial_w2", 2)
    mp.spawn(_partial_worker, args=(2, 29519), nprocs=2, join=True)
    print("edge: refused_partial_w2 (a Partial() DTensor: unreduced values)")


def _strided_worker(rank: int, world: int, port: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    g = torch.Generator().manual_seed(11)
    full = {
        "strided_even": torch.randn(16, 6, generator=g),
        "strided_uneven": torch.randn(11, 5, generator=g),
        "tp_cols_dp_rows": torch.randn(10, 7, generator=g),
        "replicated_tp": torch.randn(9, 4, generator=g),
    }
    placements = {
        # FSDP2 on top of TP: the dp dim shards what tp already sharded.
        "strided_even": [_StridedShard(0, split_factor=2), Shard(0)],
        "strided_uneven": [_StridedShard(0, split_factor=2), Shard(0)],
        "tp_cols_dp_rows": [Shard(0), Shard(1)],
        "replicated_tp": [Shard(0), Replicate()],
    }
    sd = {k: distribute_tensor(full[k], mesh, placements[k]) for k in full}
    for k, v in sd.items():  # the layout must round-trip through torch itself
        assert torch.equal(v.full_tensor(), full[k]), k
    path = os.path.join(OUT, "strided_2x2")
    torch.save(sd, os.path.join(path, f"model_world_size_{world}_rank_{rank}.pt"))
    if rank == 0:
        expected("strided_2x2", full)
    dist.barrier()
    dist.destroy_process_group()


def strided() -> None:
    folder("strided_2x2", 4)
    mp.spawn(_strided_worker, args=(4, 29517), nprocs=4, join=True)
    print("edge: strided_2x2 (2-D mesh: _StridedShard + Shard, Shard(0)+Shard(1), Replicate)")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    plain_views()
    strided()
    refused()
    partial()
    plain_copies()
    hsdp_copies()
    print("torch", torch.__version__, file=sys.stderr)
