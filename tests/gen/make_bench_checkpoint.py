#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write a large verl-FSDP2-style checkpoint for benchmarks (not a test fixture).

Real torch.save files of DTensor state dicts: W gloo CPU processes build a
1-D device mesh ("fsdp"), wrap each rank's Shard(0) piece of every weight of a
real model's shape in a DTensor (torch.distributed.tensor.DTensor.from_local
with the global shape and stride) and save their local state dicts as
model_world_size_W_rank_R.pt, next to fsdp_config.json and
huggingface/config.json (written by transformers' own config class, dtype
float32 as verl's fp32 actor saves it), the way verl's FSDP2 checkpoint
manager lays a checkpoint out. With tied embeddings lm_head.weight is the same
DTensor object as model.embed_tokens.weight, as FSDP2's state dict has it.

Shapes (--shape; all fp32, world size 8 unless --world says otherwise):
  qwen2.5-0.5b  Qwen2ForCausalLM, 494 M parameters, 1.98 GB of rank files
  qwen2.5-1.5b  Qwen2ForCausalLM, 1.54 G parameters, 6.17 GB
  qwen2.5-7b    Qwen2ForCausalLM, 7.62 G parameters, 30.5 GB, holes only
  llama3-70b    LlamaForCausalLM, 70.6 G parameters, 282 GB, holes only
  bench-600m    the earlier benchmark shape (hidden 1024, 48 layers, vocab
                32000, untied; world size 4 by default); --layers etc. apply

--lora R makes it a LoRA actor as verl saves one (PEFT names: base weights
under base_model.model. and .base_layer, lora_A [R, in] and lora_B [out, R]
of the attention and MLP projections, lora_train_meta.json), for the fused
first-read figure (tests/bench/bench_lora.sh).

Weights are seeded random values (each rank draws its own piece: no rank
ever holds a full tensor, so generation needs about the checkpoint's size in
memory). For the 7B and 70B shapes (or --holes) the files are written under
torch.serialization.skip_data: the pickles, zip records and storage sizes are
exactly torch's, but the tensor bytes are left as holes (sparse files: `du`
shows kilobytes), for metadata-only figures (mount to ready, inspect). Their
tensors are torch.empty and never touched, so no memory is committed.

    .venv/bin/python tests/gen/make_bench_checkpoint.py OUT [--shape qwen2.5-0.5b]
"""
import argparse
import io
import json
import os
import pickle
import sys
import tempfile
import time
import zipfile

os.environ.setdefault("USE_LIBUV", "0")  # Debian's torch build: no libuv TCP store
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402

# Published configs of the models whose shapes are used (config.json on the
# Hub); only shapes matter here, the values are random.
QWEN25 = dict(arch="Qwen2ForCausalLM", bias=True, rope_theta=1000000.0, eps=1e-6,
              max_pos=32768, bos=151643, eos=151643)
SHAPES = {
    "qwen2.5-0.5b": dict(QWEN25, hidden=896, layers=24, heads=14, kv_heads=2,
                         intermediate=4864, vocab=151936, tied=True, holes=False),
    "qwen2.5-1.5b": dict(QWEN25, hidden=1536, layers=28, heads=12, kv_heads=2,
                         intermediate=8960, vocab=151936, tied=True, holes=False),
    "qwen2.5-7b": dict(QWEN25, hidden=3584, layers=28, heads=28, kv_heads=4,
                       intermediate=18944, vocab=152064, tied=False, holes=True),
    "llama3-70b": dict(arch="LlamaForCausalLM", bias=False, rope_theta=500000.0,
                       eps=1e-5, max_pos=8192, bos=128000, eos=128001, hidden=8192,
                       layers=80, heads=64, kv_heads=8, intermediate=28672,
                       vocab=128256, tied=False, holes=True),
    "bench-600m": dict(arch="Qwen2ForCausalLM", bias=True, rope_theta=10000.0, eps=1e-6,
                       max_pos=4096, bos=1, eos=2, hidden=1024, layers=48, heads=16,
                       kv_heads=4, intermediate=2816, vocab=32000, tied=False,
                       holes=False, world=4),
}


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def peft_shapes(out, r):
    """The same keys as peft names them around a LoRA layer of rank r."""
    peft = []
    for name, shape in out:
        module, _, leaf = name.rpartition(".")
        if module.rpartition(".")[2] not in LORA_TARGETS:
            peft.append(("base_model.model." + name, shape))
            continue
        peft.append(("base_model.model.%s.base_layer.%s" % (module, leaf), shape))
        if leaf == "weight":
            peft.append(("base_model.model.%s.lora_A.default.weight" % module, (r, shape[1])))
            peft.append(("base_model.model.%s.lora_B.default.weight" % module, (shape[0], r)))
    return peft


def shapes(s):
    """(name, shape) of every state-dict key, in the model's module order."""
    h, i, v, L = s["hidden"], s["intermediate"], s["vocab"], s["layers"]
    kv = s["kv_heads"] * (h // s["heads"])
    out = [("model.embed_tokens.weight", (v, h))]
    for n in range(L):
        p = "model.layers.%d." % n
        for proj, rows in (("q_proj", h), ("k_proj", kv), ("v_proj", kv)):
            out.append((p + "self_attn.%s.weight" % proj, (rows, h)))
            if s["bias"]:
                out.append((p + "self_attn.%s.bias" % proj, (rows,)))
        out += [
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i)),
            (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,)),
        ]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return peft_shapes(out, s["lora"]) if s.get("lora") else out


def local_rows(n0, world, rank):
    """Rows of dim 0 that rank holds under Shard(0): torch.chunk semantics."""
    c = -(-n0 // world)
    return max(0, min(n0, (rank + 1) * c) - min(n0, rank * c))


class _Opaque:
    """Stands for any object in data.pkl: only the storage records matter."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


class _StorageScan(pickle.Unpickler):
    """Lists the storages a torch.save pickle refers to: (key, type name, numel)."""

    def __init__(self, f):
        super().__init__(f)
        self.storages = []

    def find_class(self, module, name):
        if module in ("builtins", "collections", "copyreg"):
            return super().find_class(module, name)
        return type(name, (_Opaque,), {})

    def persistent_load(self, pid):
        _, storage_type, key, _, numel = pid
        self.storages.append((key, storage_type.__name__, numel))
        return _Opaque()


def fill_mesh_storage(path, mesh_tensor):
    """skip_data leaves every storage's bytes as a hole, including the device
    mesh's small integer tensor that each DTensor's spec pickles (it says
    which rank sits where). Write that one back, as skip_data's documentation
    foresees ("populated in a separate pass"); the weights stay holes."""
    archive = os.path.splitext(os.path.basename(path))[0]
    with zipfile.ZipFile(path) as z:
        scan = _StorageScan(io.BytesIO(z.read(archive + "/data.pkl")))
    scan.load()
    small = [s for s in scan.storages if s[1] != "FloatStorage"]
    want = mesh_tensor.contiguous()
    if len(small) != 1 or small[0][2] != want.numel():
        raise SystemExit("%s: expected one mesh storage of %d elements, found %r"
                         % (path, want.numel(), small))
    offset = torch._C.PyTorchFileReader(path).get_record_offset("data/" + small[0][0])
    with open(path, "r+b") as f:
        os.pwrite(f.fileno(), want.numpy().tobytes(), offset)


def worker(rank, s, out, world, holes, store):
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    sd = {}
    for k, (name, shape) in enumerate(shapes(s)):
        if name.endswith("lm_head.weight") and s["tied"]:
            # one object, as FSDP2 has it
            sd[name] = sd[name.replace("lm_head.weight", "model.embed_tokens.weight")]
            continue
        local_shape = (local_rows(shape[0], world, rank),) + tuple(shape[1:])
        if holes:
            local = torch.empty(local_shape, dtype=torch.float32)  # never touched
        else:
            g = torch.Generator().manual_seed(1234 + 1000003 * k + rank)
            local = torch.randn(local_shape, generator=g, dtype=torch.float32).mul_(0.02)
        meta = torch.empty(shape, dtype=torch.float32, device="meta")  # global stride
        sd[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                      shape=meta.shape, stride=meta.stride())
    path = os.path.join(out, "model_world_size_%d_rank_%d.pt" % (world, rank))
    if holes:
        with torch.serialization.skip_data():
            torch.save(sd, path)
        fill_mesh_storage(path, mesh.mesh)
    else:
        torch.save(sd, path)
    del sd
    dist.barrier()
    dist.destroy_process_group()


def write_config(s, out):
    import transformers
    cls = transformers.LlamaConfig if s["arch"].startswith("Llama") else transformers.Qwen2Config
    kw = dict(
        architectures=[s["arch"]], hidden_size=s["hidden"],
        intermediate_size=s["intermediate"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
        vocab_size=s["vocab"], max_position_embeddings=s["max_pos"],
        rms_norm_eps=s["eps"], rope_theta=s["rope_theta"], hidden_act="silu",
        tie_word_embeddings=s["tied"], bos_token_id=s["bos"], eos_token_id=s["eos"],
        dtype=torch.float32,  # verl's actor is loaded as fp32 (verl-checkpoints.md)
    )
    if cls is transformers.LlamaConfig:
        kw.update(attention_bias=False, mlp_bias=False)
    cls(**kw).save_pretrained(os.path.join(out, "huggingface"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--world", type=int, help="ranks (default 8; bench-600m: 4)")
    ap.add_argument("--holes", action="store_true",
                    help="leave tensor bytes as holes (default for 7B and 70B)")
    for key in ("layers", "hidden", "intermediate", "heads", "kv-heads", "vocab"):
        ap.add_argument("--" + key, type=int, help="override the shape's " + key)
    ap.add_argument("--lora", type=int, metavar="R", help="a LoRA actor of rank R")
    a = ap.parse_args()
    s = dict(SHAPES[a.shape])
    for key in ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab"):
        if getattr(a, key) is not None:
            s[key] = getattr(a, key)
    s["lora"] = a.lora
    world = a.world or s.get("world", 8)
    holes = a.holes or s["holes"]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 2, "world_size": world}, f, indent=4)
    write_config(s, a.out)
    if a.lora:
        with open(os.path.join(a.out, "lora_train_meta.json"), "w") as f:
            json.dump({"r": a.lora, "lora_alpha": 2 * a.lora, "task_type": "CAUSAL_LM"}, f, indent=4)
    n = sum(int(torch.Size(shape).numel()) for name, shape in shapes(s)
            if not (name.endswith("lm_head.weight") and s["tied"]))
    print("%s: writing %d parameters (%.2f GB fp32%s) as %d rank files to %s"
          % (a.shape, n, n * 4 / 1e9, ", holes" if holes else "", world, a.out),
          file=sys.stderr)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(worker, args=(s, a.out, world, holes, os.path.join(tmp, "store")),
                           nprocs=world, start_method="fork")
    print("done in %.1f s" % (time.monotonic() - t0), file=sys.stderr)


if __name__ == "__main__":
    main()
