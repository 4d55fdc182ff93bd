#!/usr/bin/env python3
"""Generate real torch.distributed.checkpoint (DCP) folders and Hugging Face folders.

Everything is written by the real libraries pinned in tests/python-requirements.txt (torch
2.8, transformers 5.10.4, safetensors 0.7.0): transformers builds tiny Qwen2 models from
configs, FSDP2 (`fully_shard`) shards them over a gloo CPU process group, and
`torch.distributed.checkpoint.save` writes the folders, exactly as training scripts do:

    dcp.save({"model": get_model_state_dict(model)[, "optim": get_optimizer_state_dict(...)]},
             checkpoint_id=dir)

The oracle for every DCP folder is torch's own converter,
`torch.distributed.checkpoint.format_utils.dcp_to_torch_save`, whose model tensors are stored
as safetensors next to the folder.

    .venv/bin/python tests/gen/make_dcp_fixtures.py        # everything (~30 s on 2 cores)

Outputs (relative to tests/fixtures/):
    dcp/<name>/                          .metadata, __R_0.distcp, huggingface/config.json
    dcp/<name>.original.safetensors      the model's full state dict before sharding
    dcp/<name>.dcp_to_torch_save.safetensors
                                         dcp_to_torch_save's output: the tensors under "model"
                                         (or every tensor of a plain save), in state-dict order
    dcp/MANIFEST.json                    one record per folder (what it holds, key order)
    dcp/broken/<case>.metadata           qwen2_plain_nodist's Metadata with one thing wrong,
                                         pickled as DCP writes it (pickle.dump); the unit test
                                         copies the folder and swaps its .metadata for one
    hf/qwen2_single/                     save_pretrained: model.safetensors + config.json
    hf/qwen2_sharded/                    the same model, save_pretrained(max_shard_size="60KB"):
                                         4 shards + model.safetensors.index.json

Deviations from a GPU run: gloo on CPU, so local tensors are saved with location "cpu"; every
rank builds bit-identical weights from stable seeds before fully_shard, so the shards are what
a broadcast from rank 0 would give; optimizer gradients are synthetic and SGD steps at lr=0 so
the weights stay equal to the originals while the momentum buffers are real.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import warnings
import zlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("USE_LIBUV", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import torch  # noqa: E402

torch.set_num_threads(1)

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
DCP = os.path.join(FIXTURES, "dcp")
HF = os.path.join(FIXTURES, "hf")

# Vocab 301 = 7 * 43: not divisible by 2 or 3, so Shard(0) pieces are uneven (151/150 and
# 101/101/99); k/v_proj have 32 rows (2 KV heads of 16): 11/11/10 at world size 3.
QWEN2 = dict(vocab_size=301, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)

CONFIGS = [
    dict(name="qwen2_fsdp2_w2_optim", world=2, tied=False, dtype="float32", optim=True,
         desc="FSDP2 fully_shard on a 1-D gloo mesh of 2, saved as {'model': ..., 'optim': ...}: "
              "the optimizer's tensors and its param_groups (bytes entries) must be ignored"),
    dict(name="qwen2_tied_fsdp2_w3", world=3, tied=True, dtype="float32", optim=False,
         desc="FSDP2 on a mesh of 3 with uneven Shard(0) pieces and tied embeddings (both keys "
              "saved; lm_head.weight is dropped by the tie rule)"),
    dict(name="qwen2_plain_nodist", world=1, tied=False, dtype="bfloat16", optim=False,
         desc="a plain bf16 model.state_dict() saved by one process with no_dist=True: FQNs are "
              "the state-dict keys themselves (no 'model' prefix)"),
]


def log(*a):
    print(*a, flush=True)


def stable_seed(*parts) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


def hf_config(tied):
    from transformers import Qwen2Config

    c = Qwen2Config(max_position_embeddings=128, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2,
                    pad_token_id=0, rms_norm_eps=1e-6, rope_theta=10000.0, use_sliding_window=False, **QWEN2)
    c.architectures = ["Qwen2ForCausalLM"]
    return c


def build_model(name, tied, dtype):
    """The same seeded weights in every process (independent of torch's init RNG)."""
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM(hf_config(tied)).to(dtype)
    with torch.no_grad():
        for pname, p in model.named_parameters():  # tied parameters appear once
            g = torch.Generator().manual_seed(stable_seed(name, pname))
            t = torch.randn(p.shape, generator=g, dtype=torch.float32)
            t = 1.0 + 0.1 * t if "norm" in pname else (0.02 if pname.endswith(".bias") else 0.05) * t
            p.copy_(t.to(dtype))
    model.config.dtype = dtype
    return model


def torch_dtype(spec):
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[spec["dtype"]]


def worker(rank, spec, outdir, store):
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=spec["world"])
    try:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (spec["world"],), mesh_dim_names=("fsdp",))
        model = build_model(spec["name"], spec["tied"], torch_dtype(spec))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        state = {"model": get_model_state_dict(model)}
        if spec["optim"]:
            opt = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9)
            for p in model.parameters():
                p.grad = p.detach().abs() * 0.5 + 1e-3
            opt.step()  # lr 0: weights unchanged, momentum buffers real
            opt.zero_grad(set_to_none=True)
            state["optim"] = get_optimizer_state_dict(model, opt)
        dcp.save(state, checkpoint_id=outdir)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def save_side(ckpt, tied):
    hf = os.path.join(ckpt, "huggingface")
    os.makedirs(hf, exist_ok=True)
    c = hf_config(tied)
    c.save_pretrained(hf)


def make_dcp(spec, tmp_root):
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    name = spec["name"]
    dtype = torch_dtype(spec)
    ckpt = os.path.join(DCP, name)
    shutil.rmtree(ckpt, ignore_errors=True)
    tmp = os.path.join(tmp_root, name)
    os.makedirs(tmp)
    # Write into a neutral temporary path (StorageMeta records it), then move.
    work = os.path.join(tmp, "ckpt")
    model = build_model(name, spec["tied"], dtype)
    original = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if spec["world"] == 1:
        import torch.distributed.checkpoint as dcp

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(model.state_dict(), checkpoint_id=work, no_dist=True)
    else:
        mp.start_processes(worker, args=(spec, work, os.path.join(tmp, "store")), nprocs=spec["world"],
                           start_method="fork", join=True)
    shutil.copytree(work, ckpt)
    save_side(ckpt, spec["tied"])

    # The original weights (tied: one storage under both keys; save_file refuses shared storage).
    orig_out = {k: v.clone() for k, v in original.items()}
    save_file(orig_out, os.path.join(DCP, name + ".original.safetensors"), metadata={"format": "pt"})

    # The oracle: torch's own DCP -> torch.save conversion.
    pt = os.path.join(tmp, "full.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(work, pt)
    full = torch.load(pt, map_location="cpu", weights_only=False)
    sd = full["model"] if "model" in full and isinstance(full["model"], dict) else full
    tensors = {k: v.clone().contiguous() for k, v in sd.items() if isinstance(v, torch.Tensor)}
    save_file(tensors, os.path.join(DCP, name + ".dcp_to_torch_save.safetensors"), metadata={"format": "pt"})

    # Sanity: the oracle equals the original model's state dict.
    assert list(tensors) == list(original), (name, list(tensors)[:4], list(original)[:4])
    for k, v in original.items():
        assert tensors[k].dtype == v.dtype and torch.equal(tensors[k], v), (name, k)

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    md = FileSystemReader(work).read_metadata()
    n_bytes = sum(isinstance(v, BytesStorageMetadata) for v in md.state_dict_metadata.values())
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(ckpt) for f in fs)
    log(f"[{name}] W={spec['world']} {len(md.state_dict_metadata)} entries ({n_bytes} bytes entries), "
        f"{len(md.storage_data)} items, files {sorted(f for f in os.listdir(ckpt) if f.endswith('.distcp'))}, "
        f"{size / 1e6:.2f} MB")
    return dict(name=name, world_size=spec["world"], tied=spec["tied"], stored_dtype=spec["dtype"],
                description=spec["desc"], top_level_keys=sorted({p[0] for p in (md.planner_data or {}).values()}),
                entries=len(md.state_dict_metadata), bytes_entries=n_bytes, items=len(md.storage_data),
                model_keys=list(original), config=QWEN2)


def make_broken():
    """Real Metadata objects, edited, written the way FileSystemWriter writes .metadata."""
    import dataclasses
    import pickle

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorProperties

    src = os.path.join(DCP, "qwen2_plain_nodist")
    out = os.path.join(DCP, "broken")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    victim = "model.layers.1.mlp.down_proj.weight"

    def edit(case, fn):
        md = FileSystemReader(src).read_metadata()
        md.storage_meta = None  # no writer path recorded
        fn(md)
        with open(os.path.join(out, case + ".metadata"), "wb") as f:
            pickle.dump(md, f)

    def key_of(md):
        return next(k for k in md.storage_data if k.fqn == victim)

    def missing_entry(md):
        del md.storage_data[key_of(md)]

    def dotdot(md):
        k = key_of(md)
        md.storage_data[k] = dataclasses.replace(md.storage_data[k], relative_path="../__0_0.distcp")

    def transform(md):
        k = key_of(md)
        md.storage_data[k] = dataclasses.replace(md.storage_data[k], transform_descriptors=["stream.zstd/1"])

    def dtype_mismatch(md):
        t = md.state_dict_metadata[victim]
        p = t.properties
        t.properties = TensorProperties(dtype=torch.float16, layout=p.layout, requires_grad=p.requires_grad,
                                        memory_format=p.memory_format, pin_memory=p.pin_memory)

    for case, fn in [("missing_entry", missing_entry), ("dotdot", dotdot), ("transform", transform),
                     ("dtype_mismatch", dtype_mismatch)]:
        edit(case, fn)
    log(f"[dcp/broken] {sorted(os.listdir(out))}")


def make_hf():
    specs = [("qwen2_single", None), ("qwen2_sharded", "60KB")]
    out = []
    for name, shard in specs:
        d = os.path.join(HF, name)
        shutil.rmtree(d, ignore_errors=True)
        model = build_model("hf_qwen2", False, torch.bfloat16)  # same weights in both folders
        kw = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(d, **kw)
        files = sorted(os.listdir(d))
        log(f"[hf/{name}] {files}")
        out.append(dict(name=name, max_shard_size=shard, files=files, model_keys=list(model.state_dict())))
    return out


def main():
    import safetensors
    import transformers

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"safetensors {safetensors.__version__}")
    os.makedirs(DCP, exist_ok=True)
    os.makedirs(HF, exist_ok=True)
    tmp_root = tempfile.mkdtemp(prefix="ckfs-dcp-")
    try:
        records = [make_dcp(spec, tmp_root) for spec in CONFIGS]
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    make_broken()
    hf = make_hf()
    manifest = dict(generator="tests/gen/make_dcp_fixtures.py",
                    versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                                  safetensors=safetensors.__version__, python=sys.version.split()[0]),
                    dcp=records, hf=hf)
    with open(os.path.join(DCP, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
