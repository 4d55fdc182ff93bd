#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write tests/corpus/checkpoints/: whole checkpoints that are broken in one way.

Each case is a verl FSDP actor folder (model_world_size_W_rank_R.pt,
fsdp_config.json, huggingface/config.json) that ckfs must refuse with one
exact code and message, asserted in tests/unit/test_corpus.c. Cases are
named <category>_<what>:

    zip_*    the rank file's zip container: truncated at each structure
             boundary, offsets and counts that lie, zip64 lies, deflate bombs
    pkl_*    data.pkl: memo index out of range, truncation, a forbidden
             global, deep nesting, huge declared lengths, storage ids that
             disagree with their records, placements and meshes that lie
    model_*  real torch files that disagree with each other: shapes, dtypes,
             keys, world sizes, meshes, ranks, overlapping shards; keys of
             wrapped modules that clash or are FSDP1 flat parameters; plain
             (non-DTensor) multi-rank checkpoints and HSDP replica ranks
             that are missing or disagree
    cfg_*    fsdp_config.json and huggingface/config.json (values, duplicate
             keys, and what Python's json refuses: a NUL and what follows
             it, a second value, raw control characters, non-UTF-8, a BOM)
    fs_*     the folder itself: zero-byte and directory rank files, symlink
             loops, symlinks leading outside the checkpoint; rank file names
             that are zero-padded, signed, suffixed or overflowing, and two
             files for one rank
    ok_*     valid controls (the unbroken base, symlinks that stay inside)
    dcp_*    torch.distributed.checkpoint folders: .metadata truncated,
             items past the end of the .distcp file, overlapping, missing
             chunks and storage entries, two keys of one name once torch
             wrapper names are removed
    hf_*     Hugging Face safetensors whose header lies: offsets past the
             end, overlapping tensors, a bad dtype, a huge header length;
             headers and indexes safetensors 0.7 refuses (NUL padding, ...);
             two keys of one name once wrapper names are removed
    megatron_* legacy Megatron rank folders: a TP rank missing, TP sizes
             that disagree
    lora_*   LoRA actors saved by verl's engine (tests/fixtures/lora/):
             PEFT tensors ckfs does not read (DoRA, a second adapter, a
             lora_A without its lora_B, modules_to_save copies, names outside
             the PEFT model) and lora_train_meta.json values verl would not
             write
    names_*  names held in memory (tests/fixtures/moe_fsdp/, vlm/) under a
             model_type whose save_pretrained form ckfs has not checked, and
             fused expert stacks without their other half
    mesh_*, spec_* torch 2.15 rank files (tests/fixtures/matrix) whose
             DeviceMesh or DTensorSpec holds what ckfs must not guess at: a
             field it does not know, a layout past the rank map, a rank map
             that contradicts the file's coordinate, a shard order other
             than the placements'
    deepspeed_* DeepSpeed ZeRO checkpoints (checkpoint-N/ layout): rank
             files missing, extra, doubled or from another run; partitions
             that disagree with param_shapes or group_paddings; zero_stage
             lost; DeepSpeed objects where dicts, tensors or the stage
             belong; tensor-parallel, pipeline and MoE files; `latest`
             naming no folder; a truncated optimizer file

The FSDP cases are verl FSDP actor folders; the dcp_*, hf_*, megatron_* and
deepspeed_* cases start from the committed fixtures of those layouts
(layout_cases).
Everything starts from real bytes: the base checkpoint and every
"wrong but real" variant are written by torch.save of DTensors on a gloo
process group (2 ranks, 1-D mesh "fsdp", Shard(0)), exactly the objects
FSDP2 saves; the broken cases then change as few bytes as possible (in
place where the length allows, else by re-zipping the records with
Python's zipfile). _outside/ holds files the fs_symlink_* cases point at:
it is outside each case's checkpoint folder.

    .venv/bin/python tests/gen/make_broken_checkpoints.py   # ~10 s
    .venv/bin/python tests/gen/make_broken_checkpoints.py layouts  # only those
    .venv/bin/python tests/gen/make_broken_checkpoints.py deepspeed  # only deepspeed_*
    .venv/bin/python tests/gen/make_broken_checkpoints.py matrix  # only mesh_*, spec_*
    (CKFS_BROKEN_OUT=DIR writes the cases elsewhere, e.g. to compare)

Outputs are committed, so the C tests never need Python. Re-running with
torch 2.8 writes the same bytes, except in zip_legacy_torch's rank file,
whose legacy storage keys are memory addresses (only its first bytes
matter to the tests), and dcp_wrapper_name_twins/.metadata, which records
a random save id and the temporary folder it was saved to.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import sys
import tempfile
import zipfile
import zlib

os.environ.setdefault("USE_LIBUV", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.environ.get("CKFS_BROKEN_OUT") or os.path.join(ROOT, "tests", "corpus", "checkpoints")
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float32",
          "tie_word_embeddings": False}
R0 = "model_world_size_2_rank_0.pt"
R1 = "model_world_size_2_rank_1.pt"

# ---------------------------------------------------------------------------
# Real torch files


def make_state_dict(variant: str, rank: int, world: int, mesh) -> dict:
    """What one rank saves: DTensors sharded Shard(0) over the mesh, built
    with DTensor.from_local so a rank can be made to disagree."""
    from torch.distributed.tensor import DTensor, Shard

    g = torch.Generator().manual_seed(3)
    emb = torch.randn(10 if variant == "wide" else 8, 4, generator=g)
    norm = torch.randn(4, generator=g)
    dtype = torch.bfloat16 if variant == "bf16" else torch.float32
    full = {"model.embed_tokens.weight": emb.to(dtype), "model.norm.weight": norm.to(dtype)}
    if variant == "nonutf8":  # pickle writes str as UTF-8 with surrogatepass
        full = {"model.embed_tokens.w\udcffeight": full["model.embed_tokens.weight"],
                "model.norm.weight": full["model.norm.weight"]}
    if variant == "extra_key" and rank == 1:
        full["model.extra.weight"] = torch.randn(6, 4, generator=g)
    if variant == "control_key" and rank == 1:  # a name that would write to a terminal
        full["model.layers.0.\n\x1b[31mevil\u009b.weight"] = torch.randn(6, 4, generator=g)
    if variant == "reserved_key":  # the safetensors header's own key
        full["__metadata__"] = full.pop("model.norm.weight")
    if variant == "empty_key":
        full[""] = full.pop("model.norm.weight")
    if variant == "renamed_key" and rank == 1:
        full["model.norm.bias"] = full.pop("model.norm.weight")
    sd = {}
    for k, v in full.items():
        local = v.chunk(world, 0)[rank].clone()
        if variant == "bad_local" and rank == 1 and k == "model.embed_tokens.weight":
            local = v[4:7].clone()  # 3 rows where Shard(0) of 8 rows gives 4
        sd[k] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                   shape=v.shape, stride=v.stride())
    return sd


def _worker(rank: int, world: int, port: int, variants: list, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    for variant in variants:
        os.makedirs(os.path.join(out, variant), exist_ok=True)
        sd = make_state_dict(variant, rank, world, mesh)
        torch.save(sd, os.path.join(out, variant, f"model_world_size_{world}_rank_{rank}.pt"))
    # FSDP1-style ShardedTensor: rows [4r, 4r + 4) of an 8x4 tensor.
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard as STShard
    from torch.distributed._shard.sharded_tensor import init_from_local_shards

    full = torch.arange(32, dtype=torch.float32).reshape(8, 4)
    md = ShardMetadata(shard_offsets=[4 * rank, 0], shard_sizes=[4, 4], placement=f"rank:{rank}/cpu")
    st = init_from_local_shards([STShard(full[4 * rank:4 * rank + 4].clone(), md)], [8, 4])
    os.makedirs(os.path.join(out, "sharded"), exist_ok=True)
    torch.save({"model.embed_tokens.weight": st},
               os.path.join(out, "sharded", f"model_world_size_{world}_rank_{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def _hsdp_worker(rank: int, world: int, port: int, variants: list, out: str) -> None:
    """HSDP as FSDP saves it: a ("ddp", "fsdp") (2, 2) mesh, placements
    (Replicate(), Shard(0)); ranks 2 and 3 hold replica 1's copies."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ddp", "fsdp"))
    fsdp_rank = rank % 2
    for variant in variants:
        g = torch.Generator().manual_seed(3)
        rows = 10 if variant == "hsdp_wide" and rank == 3 else 8
        full = {"model.embed_tokens.weight": torch.randn(rows, 4, generator=g),
                "model.norm.weight": torch.randn(4, generator=g)}
        sd = {k: DTensor.from_local(v.chunk(2, 0)[fsdp_rank].clone(), mesh, [Replicate(), Shard(0)],
                                    run_check=False, shape=v.shape, stride=v.stride())
              for k, v in full.items()}
        os.makedirs(os.path.join(out, variant), exist_ok=True)
        torch.save(sd, os.path.join(out, variant, f"model_world_size_{world}_rank_{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def plain_state_dict(variant: str, rank: int) -> dict:
    """What every rank of a plain (non-DTensor) multi-rank checkpoint saves
    (DDP, FSDP1's FULL_STATE_DICT on every rank): whole tensors, the same
    on each rank unless the variant makes rank 1 disagree."""
    g = torch.Generator().manual_seed(5)
    sd = {"model.embed_tokens.weight": torch.randn(8, 4, generator=g),
          "model.norm.weight": torch.randn(4, generator=g)}
    if rank == 1 and variant == "plain_wide":
        sd["model.norm.weight"] = torch.randn(6, generator=g)
    if rank == 1 and variant == "plain_bf16":
        sd["model.norm.weight"] = sd["model.norm.weight"].bfloat16()
    if rank == 1 and variant == "plain_key_missing":
        del sd["model.norm.weight"]
    return sd


def real_files() -> dict:
    """variant -> [rank 0 bytes, rank 1 bytes], plus world-size-1 files."""
    variants = ["base", "wide", "bf16", "extra_key", "renamed_key", "bad_local", "nonutf8",
                "control_key", "reserved_key", "empty_key"]
    tmp = tempfile.mkdtemp(prefix="ckfs-broken-")
    try:
        mp.spawn(_worker, args=(2, 29631, variants, tmp), nprocs=2, join=True)
        files = {}
        for v in variants + ["sharded"]:
            files[v] = [open(os.path.join(tmp, v, f"model_world_size_2_rank_{r}.pt"), "rb").read()
                        for r in range(2)]
        hsdp = ["hsdp", "hsdp_wide"]
        mp.spawn(_hsdp_worker, args=(4, 29633, hsdp, tmp), nprocs=4, join=True)
        for v in hsdp:
            files[v] = [open(os.path.join(tmp, v, f"model_world_size_4_rank_{r}.pt"), "rb").read()
                        for r in range(4)]
        # Rank 1 of the base, written by the pre-1.6 (non-zip) serializer.
        sd = torch.load(io.BytesIO(files["base"][1]), weights_only=False)
        buf = io.BytesIO()
        torch.save(sd, buf, _use_new_zipfile_serialization=False)
        files["legacy"] = buf.getvalue()

        def save1(obj):
            b = io.BytesIO()
            torch.save(obj, b)
            return b.getvalue()

        for v in ["plain", "plain_wide", "plain_bf16", "plain_key_missing"]:
            files[v] = [save1(plain_state_dict(v, r)) for r in range(2)]
        # Two world-size-1 files holding different weights.
        g = torch.Generator().manual_seed(9)
        files["w1_a"] = save1({"model.norm.weight": torch.randn(4, generator=g)})
        files["w1_b"] = save1({"model.norm.weight": torch.randn(4, generator=g)})
        # Keys of wrapped modules that become one name once the wrapper
        # names are removed (torch.compile's _orig_mod, DDP's module.).
        files["w1_wrapped_twins"] = save1({"model.embed_tokens.weight": torch.randn(8, 4, generator=g),
                                           "model.norm.weight": torch.randn(4, generator=g),
                                           "_orig_mod.model.norm.weight": torch.randn(4, generator=g)})
        files["w1_ddp_twins"] = save1({"module.model.norm.weight": torch.randn(4, generator=g),
                                       "module._checkpoint_wrapped_module.model.norm.weight":
                                           torch.randn(4, generator=g)})
        files["w1_only_wrapper"] = save1({"model.norm.weight": torch.randn(4, generator=g),
                                          "_orig_mod": torch.randn(4, generator=g)})
        files["w1_empty"] = save1({})
        files["w1_list"] = save1([torch.ones(2)])
        # A real tensor of 2^62 float32 elements (2^64 bytes): one stored
        # element expanded (stride 0) to 2^31 x 2^31.
        files["w1_overflow"] = save1({"model.big.weight": torch.ones(1).expand(2 ** 31, 2 ** 31)})
        return files
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------
# Zip surgery on real files


def layout(b: bytes) -> dict:
    """Offsets of every structure of a zip: EOCD, zip64 records, central
    directory entries and where each record's local header and data are."""
    eocd = b.rfind(b"PK\x05\x06")
    loc = eocd - 20 if eocd >= 20 and b[eocd - 20:eocd - 16] == b"PK\x06\x07" else None
    z64 = struct.unpack_from("<Q", b, loc + 8)[0] if loc is not None else None
    count, cd_size, cd_off = struct.unpack_from("<HII", b, eocd + 10)
    if z64 is not None:
        count, cd_size, cd_off = struct.unpack_from("<QQQ", b, z64 + 32)
    entries, p = {}, cd_off
    for _ in range(count):
        assert b[p:p + 4] == b"PK\x01\x02"
        nlen, xlen, clen = struct.unpack_from("<HHH", b, p + 28)
        csize, usize = struct.unpack_from("<II", b, p + 20)
        lho = struct.unpack_from("<I", b, p + 42)[0]
        name = b[p + 46:p + 46 + nlen].decode()
        lnlen, lxlen = struct.unpack_from("<HH", b, lho + 26)
        short = name.split("/", 1)[1]
        entries[short] = dict(name=name, cd=p, lho=lho, data=lho + 30 + lnlen + lxlen,
                              size=usize, csize=csize)
        p += 46 + nlen + xlen + clen
    return dict(eocd=eocd, loc=loc, z64=z64, cd_off=cd_off, cd_size=cd_size, count=count,
                entries=entries)


def patch(b: bytes, off: int, new: bytes) -> bytes:
    return b[:off] + new + b[off + len(new):]


def put(b: bytes, off: int, fmt: str, *vals) -> bytes:
    return patch(b, off, struct.pack(fmt, *vals))


def rezip(b: bytes, replace: dict | None = None, deflate: tuple = ()) -> bytes:
    """The same records in the same order through Python's zipfile, with
    some contents replaced and some records deflated."""
    replace = replace or {}
    src = zipfile.ZipFile(io.BytesIO(b))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            short = info.filename.split("/", 1)[1]
            data = replace.get(short, src.read(info.filename))
            method = zipfile.ZIP_DEFLATED if short in deflate else zipfile.ZIP_STORED
            dst.writestr(zipfile.ZipInfo(info.filename, date_time=(2025, 1, 1, 0, 0, 0)), data,
                         compress_type=method)
    return out.getvalue()


def pickle_of(b: bytes) -> bytes:
    z = zipfile.ZipFile(io.BytesIO(b))
    return z.read([n for n in z.namelist() if n.endswith("/data.pkl")][0])


def pkl_patch(b: bytes, old: bytes, new: bytes, nth: int = 0) -> bytes:
    """Replace the nth occurrence of old in data.pkl; in place when the
    length is unchanged (the zip keeps torch's exact framing), else by
    re-zipping."""
    pkl = pickle_of(b)
    at = -1
    for _ in range(nth + 1):
        at = pkl.find(old, at + 1)
        assert at >= 0, (old, nth)
    new_pkl = pkl[:at] + new + pkl[at + len(old):]
    if len(new) == len(old):
        return patch(b, layout(b)["entries"]["data.pkl"]["data"] + at, new)
    return rezip(b, {"data.pkl": new_pkl})


# ---------------------------------------------------------------------------
# Case folders


def case(name: str, ranks: dict, fsdp_config=None, config=None, world: int = 2) -> str:
    """Write a case: ranks maps file names to bytes (or to a callable that
    makes the entry itself); fsdp_config/config are text, a dict, or False
    for none."""
    path = os.path.join(OUT, name)
    os.makedirs(os.path.join(path, "huggingface"))
    if fsdp_config is not False:
        text = fsdp_config if isinstance(fsdp_config, str) else json.dumps(
            fsdp_config or {"FSDP_version": 2, "world_size": world}, indent=4)
        with open(os.path.join(path, "fsdp_config.json"), "w") as f:
            f.write(text)
    if config is not False:
        text = config if isinstance(config, str) else json.dumps(config or CONFIG, indent=2)
        with open(os.path.join(path, "huggingface", "config.json"), "w") as f:
            f.write(text)
    for fname, data in ranks.items():
        if callable(data):
            data(os.path.join(path, fname))
        else:
            with open(os.path.join(path, fname), "wb") as f:
                f.write(data)
    return path


def symlink(target: str):
    return lambda p: os.symlink(target, p)


def main() -> None:
    files = real_files()
    r0, r1 = files["base"]
    L = layout(r1)
    E = L["entries"]
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)

    def broken(name, data, rank=1):
        case(name, {R0: data if rank == 0 else r0, R1: data if rank == 1 else r1})

    case("ok_base", {R0: r0, R1: r1})

    # ---- zip container ----
    broken("zip_empty_file", b"")
    broken("zip_not_a_zip", b"this is not a torch checkpoint\n")
    broken("zip_legacy_torch", files["legacy"])
    broken("zip_trunc_local_header", r1[:20])
    broken("zip_trunc_data_pkl", r1[:E["data.pkl"]["data"] + 100])
    broken("zip_trunc_storage", r1[:E["data/0"]["data"] + 10])
    broken("zip_trunc_central_dir", r1[:L["cd_off"] + 50])
    broken("zip_trunc_zip64_eocd", r1[:L["z64"] + 20])
    broken("zip_trunc_zip64_locator", r1[:L["loc"] + 10])
    broken("zip_trunc_eocd", r1[:L["eocd"] + 10])
    # The central directory offset moved, in the end record and the zip64 one.
    moved = put(put(r1, L["eocd"] + 16, "<I", L["cd_off"] - 8), L["z64"] + 48, "<Q", L["cd_off"] - 8)
    broken("zip_cd_offset_shifted", moved)
    past = put(put(r1, L["eocd"] + 16, "<I", 0xFFFFFFFF), L["z64"] + 48, "<Q", 1 << 40)
    broken("zip_cd_offset_past_end", past)
    broken("zip_cd_bad_signature", patch(r1, E["data/1"]["cd"], b"PK\x01\x03"))
    broken("zip_local_offset_shifted", put(r1, E["data/0"]["cd"] + 42, "<I", E["data/0"]["lho"] + 1))
    broken("zip_local_offset_in_cd", put(r1, E["data/0"]["cd"] + 42, "<I", L["cd_off"] + 4))
    broken("zip_local_name_differs", patch(r1, E["data/0"]["lho"] + 30 + len(E["data/0"]["name"]) - 1, b"7"))
    big = put(r1, E["data/0"]["cd"] + 20, "<II", 1 << 20, 1 << 20)
    broken("zip_record_past_end", big)
    grown = put(r1, E["data/1"]["cd"] + 20, "<II", E["data/1"]["size"] + 100, E["data/1"]["size"] + 100)
    broken("zip_records_overlap", grown)
    dup = E["data/2"]
    d = patch(r1, dup["cd"] + 46 + len(dup["name"]) - 1, b"1")
    d = patch(d, dup["lho"] + 30 + len(dup["name"]) - 1, b"1")
    broken("zip_duplicate_name", d)
    broken("zip_no_data_pkl", patch(patch(r1, E["data.pkl"]["cd"] + 46 + len(E["data.pkl"]["name"]) - 1, b"x"),
                                    E["data.pkl"]["lho"] + 30 + len(E["data.pkl"]["name"]) - 1, b"x"))
    gone = E["data/0"]
    g = patch(r1, gone["cd"] + 46 + len(gone["name"]) - 1, b"9")
    g = patch(g, gone["lho"] + 30 + len(gone["name"]) - 1, b"9")
    broken("zip_storage_missing", g)
    m = put(put(r1, E["data/0"]["cd"] + 10, "<H", 14), E["data/0"]["lho"] + 8, "<H", 14)
    broken("zip_method_lzma", m)
    broken("zip_encrypted", put(r1, E["data/0"]["cd"] + 8, "<H", 1))
    broken("zip_multi_disk", put(r1, L["eocd"] + 4, "<H", 1))
    # zip64 lies: the classic record saturated, the zip64 one lying.
    sat = put(r1, L["eocd"] + 8, "<HH", 0xFFFF, 0xFFFF)
    broken("zip64_count_lie", put(sat, L["z64"] + 24, "<QQ", 1000, 1000))
    broken("zip64_count_huge", put(sat, L["z64"] + 24, "<QQ", 1 << 40, 1 << 40))
    broken("zip64_disagree", put(r1, L["z64"] + 24, "<QQ", L["count"] + 1, L["count"] + 1))
    broken("zip64_cd_size_huge", put(put(r1, L["eocd"] + 12, "<I", 0xFFFFFFFF), L["z64"] + 40, "<Q", 1 << 40))
    broken("zip64_locator_past_end", put(r1, L["loc"] + 8, "<Q", 1 << 40))
    broken("zip64_bad_signature", patch(r1, L["z64"], b"PK\x06\x07"))
    # Deflate: a record declaring 3 GiB, a bomb lying about its size, a corrupt stream.
    defl = rezip(r1, deflate=("data.pkl",))
    D = layout(defl)["entries"]["data.pkl"]
    broken("zip_deflate_huge_size", put(defl, D["cd"] + 24, "<I", 3 << 30))
    bomb = rezip(r1, {"data.pkl": pickle_of(r1) + bytes(8 << 20)}, deflate=("data.pkl",))
    B = layout(bomb)["entries"]["data.pkl"]
    broken("zip_deflate_bomb", put(bomb, B["cd"] + 24, "<I", len(pickle_of(r1))))
    broken("zip_deflate_corrupt", patch(defl, D["data"] + 40, bytes(b ^ 0xFF for b in defl[D["data"] + 40:D["data"] + 48])))
    broken("zip_storage_deflated", rezip(r1, deflate=("data/0",)))
    broken("zip_big_endian", rezip(r1, {"byteorder": b"big"}))

    # ---- data.pkl ----
    # BINGET 27 (collections.OrderedDict) -> 250: past every memo slot.
    broken("pkl_memo_out_of_range", pkl_patch(r1, b"h\x1b)R", b"h\xfa)R"))
    pkl = pickle_of(r1)
    broken("pkl_truncated", rezip(r1, {"data.pkl": pkl[:600]}))
    broken("pkl_forbidden_global", pkl_patch(r1, b"ctorch._utils\n_rebuild_tensor_v2\n", b"cos\nsystem\n"))
    nest = b"\x80\x02}X\x01\x00\x00\x00w" + b"]" * 100000 + b"a" * 99999 + b"s."
    broken("pkl_deep_nesting", rezip(r1, {"data.pkl": nest}))
    # BINUNICODE '_local_tensor' declaring 2^31 - 1 bytes.
    broken("pkl_huge_string", pkl_patch(r1, b"X\x0d\x00\x00\x00_local_tensor", b"X\xff\xff\xff\x7f_local_tensor"))
    # The first storage id's numel (16 floats) made smaller and larger.
    broken("pkl_storage_smaller_than_view", pkl_patch(r1, b"K\x10t", b"K\x08t"))
    broken("pkl_storage_larger_than_record", pkl_patch(r1, b"K\x10t", b"K\xc8t"))
    # Shard(dim=0) -> Shard(dim=5) for a 2-d tensor.
    at = pkl.find(b"X\x03\x00\x00\x00dimq") + 10  # BINUNICODE 'dim', BINPUT n, BININT1 0
    assert pkl[at:at + 2] == b"K\x00"
    broken("pkl_shard_dim_out_of_range", pkl_patch(r1, pkl[at - 10:at + 2], pkl[at - 10:at] + b"K\x05"))
    broken("pkl_not_a_dict", files["w1_list"])

    # ---- real torch files that disagree ----
    case("model_shape_mismatch", {R0: r0, R1: files["wide"][1]})
    case("model_dtype_mismatch", {R0: r0, R1: files["bf16"][1]})
    case("model_extra_key", {R0: files["extra_key"][0], R1: files["extra_key"][1]})
    case("model_renamed_key", {R0: files["renamed_key"][0], R1: files["renamed_key"][1]})
    case("model_bad_local_shape", {R0: files["bad_local"][0], R1: files["bad_local"][1]})
    case("model_non_utf8_key", {R0: files["nonutf8"][0], R1: files["nonutf8"][1]})
    case("model_control_chars_key", {R0: files["control_key"][0], R1: files["control_key"][1]})
    case("model_reserved_name", {R0: files["reserved_key"][0], R1: files["reserved_key"][1]})
    case("model_empty_name", {R0: files["empty_key"][0], R1: files["empty_key"][1]})
    case("model_missing_rank", {R0: r0})
    case("model_world_size_disagree", {R0: r0, R1: r1}, fsdp_config={"FSDP_version": 2, "world_size": 4})
    case("model_mesh_size_mismatch", {f"model_world_size_3_rank_{r}.pt": d for r, d in enumerate([r0, r1, r1])},
         world=3)
    case("model_rank_copy", {R0: r0, R1: r0})
    case("model_ranks_swapped", {R0: r1, R1: r0})
    case("model_sharded_overlap", {R0: files["sharded"][0], R1: files["sharded"][0]})
    case("model_rank_out_of_range", {R0: r0, R1: r1, "model_world_size_2_rank_5.pt": r1})
    case("model_mixed_world_sizes", {R0: r0, R1: r1, "model_world_size_4_rank_0.pt": r0}, fsdp_config=False)
    # Rank 0's device mesh names rank 7 (the IntStorage holding [0, 1]).
    mesh_rec = layout(r0)["entries"]["data/1"]
    case("model_mesh_rank_out_of_range", {R0: put(r0, mesh_rec["data"] + 4, "<i", 7), R1: r1})
    case("model_empty_state_dict", {"model_world_size_1_rank_0.pt": files["w1_empty"]}, world=1)
    case("model_shape_overflow", {"model_world_size_1_rank_0.pt": files["w1_overflow"]}, world=1)
    # Plain (non-DTensor) entries of a multi-rank checkpoint: verl loads every
    # rank and refuses copies that differ, so every rank must be there and agree.
    plain = files["plain"]
    case("model_plain_missing_rank", {R0: plain[0]})
    case("model_plain_shape_mismatch", {R0: plain[0], R1: files["plain_wide"][1]})
    case("model_plain_dtype_mismatch", {R0: plain[0], R1: files["plain_bf16"][1]})
    case("model_plain_key_missing", {R0: plain[0], R1: files["plain_key_missing"][1]})
    # Wrapper names (src/model/names.c): two keys of one name, a key of
    # wrapper names only, FSDP1's flat parameters (a real FSDP1 file from
    # tests/gen/make_wrapped_fixtures.py).
    w1 = "model_world_size_1_rank_0.pt"
    case("model_wrapper_name_twins", {w1: files["w1_wrapped_twins"]}, world=1)
    case("model_wrapper_name_twins_ddp", {w1: files["w1_ddp_twins"]}, world=1)
    case("model_wrapper_name_only", {w1: files["w1_only_wrapper"]}, world=1)
    flat = os.path.join(FIX, "wrapped", "refused_fsdp1_flat_w2")
    case("model_fsdp1_flat_param", {R0: open(os.path.join(flat, R0), "rb").read(),
                                    R1: open(os.path.join(flat, R1), "rb").read()})
    # HSDP: replica 1's ranks (2 and 3) are not merged, but a checkpoint
    # without them is incomplete, and what they hold must agree.
    hsdp = {f"model_world_size_4_rank_{r}.pt": d for r, d in enumerate(files["hsdp"])}
    case("model_hsdp_replica_missing", {k: v for k, v in hsdp.items() if not k.endswith("_3.pt")}, world=4)
    case("model_hsdp_replica_shape_mismatch", dict(hsdp, **{"model_world_size_4_rank_3.pt": files["hsdp_wide"][3]}),
         world=4)

    # ---- rank file names: one rank, one file, one spelling ----
    w1 = "model_world_size_1_rank_0.pt"
    case("fs_rank_name_zero_padded_twin", {w1: files["w1_a"], "model_world_size_1_rank_00.pt": files["w1_b"]},
         world=1)
    case("fs_world_size_zero_padded_twin", {w1: files["w1_a"], "model_world_size_01_rank_0.pt": files["w1_b"]},
         world=1)
    case("fs_rank_name_plus_sign_twin", {R0: r0, R1: r1, "model_world_size_2_rank_+1.pt": r0})
    case("fs_rank_name_zero_padded", {R0: r0, "model_world_size_2_rank_01.pt": r1})
    case("fs_rank_name_negative", {R0: r0, R1: r1, "model_world_size_2_rank_-1.pt": r0})
    case("fs_rank_name_copy_suffix", {R0: r0, R1: r1, "model_world_size_2_rank_1 (1).pt": r0})
    case("fs_rank_number_overflow", {R0: r0, R1: r1, "model_world_size_2_rank_99999999999999999999.pt": r1})
    case("fs_world_size_overflow", {"model_world_size_99999999999999999999_rank_0.pt": r0}, fsdp_config=False)
    case("fs_world_size_zero", {"model_world_size_0_rank_0.pt": r0}, fsdp_config=False)

    # ---- config files ----
    case("cfg_fsdp_malformed", {R0: r0, R1: r1}, fsdp_config='{\n    "FSDP_version": 2,\n    "world_size": 2,\n')
    case("cfg_fsdp_not_object", {R0: r0, R1: r1}, fsdp_config="[2]\n")
    case("cfg_fsdp_world_size_zero", {R0: r0, R1: r1}, fsdp_config={"FSDP_version": 2, "world_size": 0})
    case("cfg_fsdp_world_size_huge", {R0: r0, R1: r1}, fsdp_config={"FSDP_version": 2, "world_size": 10 ** 12})
    case("cfg_fsdp_world_size_string", {R0: r0, R1: r1}, fsdp_config={"FSDP_version": 2, "world_size": "2"})
    case("cfg_fsdp_world_size_fraction", {R0: r0, R1: r1}, fsdp_config={"FSDP_version": 2, "world_size": 2.5})
    case("cfg_hf_config_malformed", {R0: r0, R1: r1}, config='{"model_type": "llama", "torch_dtype": }\n')
    case("cfg_hf_config_not_object", {R0: r0, R1: r1}, config='"llama"\n')
    case("cfg_hf_config_missing", {R0: r0, R1: r1}, config=False)
    # Duplicate keys: cJSON would take the first, Python's json (verl,
    # transformers) the last; refused wherever they are.
    case("cfg_fsdp_duplicate_key", {R0: r0, R1: r1},
         fsdp_config='{"FSDP_version": 2, "world_size": 2, "world_size": 4}\n')
    case("cfg_hf_config_duplicate_key", {R0: r0, R1: r1},
         config='{"model_type": "llama", "tie_word_embeddings": false, "torch_dtype": "float32",\n'
                ' "tie_word_embeddings": true}\n')
    # A truthy string: Python (verl's tie rule, transformers) would tie,
    # a reader that wants a JSON boolean would not.
    case("cfg_hf_config_tie_not_bool", {R0: r0, R1: r1},
         config={**CONFIG, "tie_word_embeddings": "true"})
    case("cfg_hf_config_nested_duplicate_key", {R0: r0, R1: r1},
         config='{"model_type": "llama", "torch_dtype": "float32",\n'
                ' "rope_scaling": {"factor": 2.0, "type": "linear", "factor": 4.0}}\n')
    # Read whole, as Python's json reads them: a C reader stopping at a NUL
    # would take world size 2 or an untied model, Python refuses the file.
    fsdp_text = json.dumps({"FSDP_version": 2, "world_size": 2}, indent=4)
    case("cfg_fsdp_nul_junk", {R0: r0, R1: r1}, fsdp_config=fsdp_text + '\0{"world_size": 9}')
    case("cfg_fsdp_trailing_data", {R0: r0, R1: r1},
         fsdp_config=fsdp_text + '\n{"FSDP_version": 2, "world_size": 4}\n')
    cfg_text = json.dumps(CONFIG, indent=2)
    case("cfg_hf_config_nul_junk", {R0: r0, R1: r1}, config=cfg_text + '\0{"tie_word_embeddings": true}')
    case("cfg_hf_config_control_char", {R0: r0, R1: r1},
         config=cfg_text.replace('"llama"', '"lla\tma"'))
    for name, data in (("cfg_hf_config_not_utf8", cfg_text.encode().replace(b'"llama"', b'"llam\xe4"')),
                       ("cfg_hf_config_bom", b"\xef\xbb\xbf" + cfg_text.encode())):
        p = case(name, {R0: r0, R1: r1}, config=False)
        with open(os.path.join(p, "huggingface", "config.json"), "wb") as f:
            f.write(data)

    # ---- the folder ----
    case("fs_zero_byte_rank", {R0: r0, R1: b""})
    case("fs_rank_is_directory", {R0: r0, R1: lambda p: (os.mkdir(p), open(os.path.join(p, "keep"), "w").close())})
    case("fs_symlink_loop", {R0: r0, R1: symlink(R1)})
    case("fs_fsdp_config_is_directory", {R0: r0, R1: r1},
         fsdp_config=False)
    os.mkdir(os.path.join(OUT, "fs_fsdp_config_is_directory", "fsdp_config.json"))
    open(os.path.join(OUT, "fs_fsdp_config_is_directory", "fsdp_config.json", "keep"), "w").close()
    # Symlinks leading outside the checkpoint (into ../_outside/), refused
    # unless follow_symlinks; the same files reached by links that stay
    # inside are fine.
    out = os.path.join(OUT, "_outside")
    os.makedirs(os.path.join(out, "huggingface"))
    with open(os.path.join(out, R1), "wb") as f:
        f.write(r1)
    with open(os.path.join(out, "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 2, "world_size": 2}, f, indent=4)
    with open(os.path.join(out, "huggingface", "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    with open(os.path.join(out, "huggingface", "tokenizer.json"), "w") as f:
        f.write('{"outside": true}\n')
    case("fs_symlink_outside_rank", {R0: r0, R1: symlink("../_outside/" + R1)})
    case("fs_symlink_outside_fsdp_config", {R0: r0, R1: r1}, fsdp_config=False)
    os.symlink("../_outside/fsdp_config.json", os.path.join(OUT, "fs_symlink_outside_fsdp_config", "fsdp_config.json"))
    p = case("fs_symlink_outside_huggingface", {R0: r0, R1: r1}, config=False)
    os.rmdir(os.path.join(p, "huggingface"))
    os.symlink("../_outside/huggingface", os.path.join(p, "huggingface"))
    p = case("fs_symlink_outside_side_file", {R0: r0, R1: r1})
    os.symlink("../../_outside/huggingface/tokenizer.json", os.path.join(p, "huggingface", "tokenizer.json"))
    p = case("fs_symlink_absolute_side_file", {R0: r0, R1: r1})
    os.symlink("/etc/passwd", os.path.join(p, "huggingface", "tokenizer.json"))
    p = case("fs_dangling_side_file", {R0: r0, R1: r1})
    os.symlink("missing.json", os.path.join(p, "huggingface", "tokenizer.json"))
    p = case("ok_symlinks_inside", {R0: r0, R1: symlink("shards/" + R1)})
    os.makedirs(os.path.join(p, "shards"))
    with open(os.path.join(p, "shards", R1), "wb") as f:
        f.write(r1)
    with open(os.path.join(p, "tokenizer.json"), "w") as f:
        f.write('{"inside": true}\n')
    os.symlink("../tokenizer.json", os.path.join(p, "huggingface", "tokenizer.json"))

    layout_cases()
    n = len([d for d in os.listdir(OUT) if not d.startswith("_")])
    print(f"{n} cases in {os.path.relpath(OUT, ROOT)}", file=sys.stderr)


# ---------------------------------------------------------------------------
# Other layouts: DCP, Hugging Face safetensors, Megatron. Each starts from a
# committed fixture written by real torch / safetensors / megatron-core code
# (tests/gen/make_dcp_fixtures.py, make_megatron_fixtures.py).

FIX = os.path.join(ROOT, "tests", "fixtures")


def _fresh(name: str) -> str:
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def dcp_case(name: str, md_bytes: bytes, distcp: bytes | None) -> None:
    """A DCP folder: .metadata, __0_0.distcp (None: absent) and the
    fixture's huggingface/ side files."""
    src = os.path.join(FIX, "dcp", "qwen2_plain_nodist")
    path = _fresh(name)
    shutil.copytree(os.path.join(src, "huggingface"), os.path.join(path, "huggingface"))
    with open(os.path.join(path, ".metadata"), "wb") as f:
        f.write(md_bytes)
    if distcp is not None:
        with open(os.path.join(path, "__0_0.distcp"), "wb") as f:
            f.write(distcp)


def dcp_cases() -> None:
    """From qwen2_plain_nodist (saved by torch.distributed.checkpoint.save):
    the real .metadata, or torch's own Metadata object changed in one place
    and pickled again (protocol 4, as torch writes it). The .distcp file is
    cut after the first item (model.embed_tokens.weight, 40105 bytes) to
    keep the corpus small; cases about that tensor fail before the rest
    is needed."""
    import copy
    import pickle

    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    src = os.path.join(FIX, "dcp", "qwen2_plain_nodist")
    raw = open(os.path.join(src, ".metadata"), "rb").read()
    distcp = open(os.path.join(src, "__0_0.distcp"), "rb").read()
    md = pickle.loads(raw)
    first = list(md.state_dict_metadata)[0]  # model.embed_tokens.weight
    (idx0, info0), = [(k, v) for k, v in md.storage_data.items() if k.fqn == first]
    cut = distcp[:info0.offset + info0.length]

    def dump(m) -> bytes:
        return pickle.dumps(m, protocol=4)

    # .metadata cut in half: the pickle ends inside state_dict_metadata.
    dcp_case("dcp_metadata_truncated", raw[:len(raw) // 2], cut)
    # The file ends after the first item: the second tensor's item (named
    # by storage_data) lies past the end of the .distcp file.
    dcp_case("dcp_distcp_truncated", raw, cut)
    # storage_data sends the first item past the end of the file.
    m = copy.deepcopy(md)
    m.storage_data[idx0] = _StorageInfo(info0.relative_path, len(cut) + 4096, info0.length,
                                        info0.transform_descriptors)
    dcp_case("dcp_item_past_end", dump(m), cut)
    # Two chunks of the first tensor at the same place: overlapping.
    m = copy.deepcopy(md)
    tsm = m.state_dict_metadata[first]
    tsm.chunks.append(ChunkStorageMetadata(offsets=tsm.chunks[0].offsets, sizes=tsm.chunks[0].sizes))
    dcp_case("dcp_chunks_overlap", dump(m), cut)
    # The global shape has twice the rows of its one chunk: the chunk of
    # the other half is missing (as if a rank's chunk were dropped).
    m = copy.deepcopy(md)
    tsm = m.state_dict_metadata[first]
    tsm.size = torch.Size([tsm.size[0] * 2] + list(tsm.size[1:]))
    dcp_case("dcp_chunk_missing", dump(m), cut)
    # A chunk with no storage_data entry.
    m = copy.deepcopy(md)
    del m.storage_data[idx0]
    dcp_case("dcp_storage_entry_missing", dump(m), cut)
    # Saved by torch.distributed.checkpoint.save itself: keys of a
    # compiled and a plain module mixed, one name once _orig_mod. goes.
    import torch.distributed.checkpoint as dcp

    path = _fresh("dcp_wrapper_name_twins")
    shutil.copytree(os.path.join(src, "huggingface"), os.path.join(path, "huggingface"))
    g = torch.Generator().manual_seed(21)
    tmp = tempfile.mkdtemp(prefix="ckfs-broken-")  # .metadata records where it was saved
    dcp.save({"model": {"model.norm.weight": torch.randn(4, generator=g),
                        "_orig_mod.model.norm.weight": torch.randn(4, generator=g)}},
             checkpoint_id=tmp, no_dist=True)
    for f in os.listdir(tmp):
        shutil.copy(os.path.join(tmp, f), path)
    shutil.rmtree(tmp)


def hf_cases() -> None:
    """A small model.safetensors written by safetensors.torch.save_file from
    two tensors of the qwen2_single fixture, then its header changed in
    place (same length, so the data stays where it was)."""
    from safetensors.torch import load_file, save_file

    src = os.path.join(FIX, "hf", "qwen2_single")
    full = load_file(os.path.join(src, "model.safetensors"))
    small = {k: full[k] for k in ("model.norm.weight", "model.layers.0.input_layernorm.weight")}
    tmp = tempfile.mkdtemp()
    save_file(small, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    base = open(os.path.join(tmp, "model.safetensors"), "rb").read()
    shutil.rmtree(tmp)
    hlen = struct.unpack("<Q", base[:8])[0]
    header = json.loads(base[8:8 + hlen])

    def with_header(h: dict) -> bytes:
        text = json.dumps(h, separators=(",", ":")).encode()
        assert len(text) <= hlen, "the changed header must fit in place"
        return base[:8] + text + b" " * (hlen - len(text)) + base[8 + hlen:]

    def hf_case(name: str, data: bytes) -> None:
        path = _fresh(name)
        shutil.copy(os.path.join(src, "config.json"), os.path.join(path, "config.json"))
        with open(os.path.join(path, "model.safetensors"), "wb") as f:
            f.write(data)

    names = sorted(k for k in header if k != "__metadata__")
    last = max(names, key=lambda k: header[k]["data_offsets"][1])
    h = copy_json(header)
    h[last]["data_offsets"][1] += 256
    hf_case("hf_offsets_past_end", with_header(h))
    h = copy_json(header)
    other = [k for k in names if k != last][0]
    h[last]["data_offsets"] = list(h[other]["data_offsets"])
    hf_case("hf_tensors_overlap", with_header(h))
    h = copy_json(header)
    h[names[0]]["dtype"] = "X9"
    hf_case("hf_bad_dtype", with_header(h))
    hf_case("hf_header_len_huge", struct.pack("<Q", 1 << 40) + base[8:])
    # save_file of a state dict holding a compiled module's key beside the
    # plain one: one name once _orig_mod. goes.
    tmp = tempfile.mkdtemp()
    save_file({"model.norm.weight": small["model.norm.weight"],
               "_orig_mod.model.norm.weight": small["model.layers.0.input_layernorm.weight"]},
              os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    hf_case("hf_wrapper_name_twins", open(os.path.join(tmp, "model.safetensors"), "rb").read())
    shutil.rmtree(tmp)

    # What safetensors 0.7 refuses and a laxer reader would accept. The
    # header text is rewritten (its length may change; the data does not
    # move relative to the data start).
    def with_text(text: bytes) -> bytes:
        text += b" " * (-(8 + len(text)) % 8)
        return struct.pack("<Q", len(text)) + text + base[8 + hlen:]

    compact = json.dumps(header, separators=(",", ":")).encode()
    end = header[last]["data_offsets"][1]
    first = min(names, key=lambda k: header[k]["data_offsets"][0])
    hf_case("hf_offsets_float", with_text(compact.replace(b",%d]" % end, b",%d.0]" % end)))
    hf_case("hf_offsets_exponent", with_text(compact.replace(b",%d]" % end, b",%de0]" % end)))
    hf_case("hf_offsets_negative_zero", with_text(compact.replace(b'"data_offsets":[0,', b'"data_offsets":[-0,')))
    dim = header[first]["shape"][0]
    hf_case("hf_shape_float", with_text(compact.replace(b'"shape":[%d]' % dim, b'"shape":[%d.0]' % dim, 1)))
    hf_case("hf_number_leading_zero", with_text(compact.replace(b",%d]" % end, b",0%d]" % end)))
    hf_case("hf_header_leading_space", with_text(b" " + compact))
    hf_case("hf_header_not_utf8", with_text(compact.replace(b'"format"', b'"form\xffat"')))
    h = copy_json(header)
    h["__metadata__"] = "pt"
    hf_case("hf_metadata_not_object", with_text(json.dumps(h, separators=(",", ":")).encode()))
    h = copy_json(header)
    h["__metadata__"] = {"format": 1}
    hf_case("hf_metadata_value_not_string", with_text(json.dumps(h, separators=(",", ":")).encode()))
    entry = json.dumps(header[first], separators=(",", ":")).encode()
    hf_case("hf_duplicate_tensor_key", with_text(compact[:-1] + b',"%s":%s}' % (first.encode(), entry)))
    # Padding: spaces (and JSON whitespace) after the value, as save_file
    # writes it; NULs are refused by safetensors 0.7 ("trailing characters").
    nul = compact + b"\0" * (8 - (8 + len(compact)) % 8)
    hf_case("hf_header_nul_padding", struct.pack("<Q", len(nul)) + nul + base[8 + hlen:])
    hf_case("hf_header_control_char", with_text(compact.replace(b'"format"', b'"for\x01mat"')))
    # The weights behind a symlink that leads outside the checkpoint: refused
    # before a byte of the target is read (it would say "bad header length").
    path = _fresh("hf_symlink_outside_weights")
    shutil.copy(os.path.join(src, "config.json"), os.path.join(path, "config.json"))
    os.symlink("../_outside/model_world_size_2_rank_1.pt", os.path.join(path, "model.safetensors"))

    # A sharded folder: two shards of one tensor each (save_file) and the
    # index as transformers writes it; then index and shards disagree.
    shards = {"model-00001-of-00002.safetensors": "model.layers.0.input_layernorm.weight",
              "model-00002-of-00002.safetensors": "model.norm.weight"}
    blobs = {}
    for fname, key in shards.items():
        tmp = tempfile.mkdtemp()
        save_file({key: full[key]}, os.path.join(tmp, fname), metadata={"format": "pt"})
        blobs[fname] = open(os.path.join(tmp, fname), "rb").read()
        shutil.rmtree(tmp)
    index = {"metadata": {"total_size": sum(full[k].numel() * 4 for k in shards.values())},
             "weight_map": {k: f for f, k in shards.items()}}

    def sharded_case(name: str, idx, blobs_=blobs, link=None) -> None:
        path = _fresh(name)
        shutil.copy(os.path.join(src, "config.json"), os.path.join(path, "config.json"))
        for fname, data in blobs_.items():
            with open(os.path.join(path, fname), "wb") as f:
                f.write(data)
        text = idx if isinstance(idx, str) else json.dumps(idx, indent=2, sort_keys=True) + "\n"
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            f.write(text)
        if link:
            os.remove(os.path.join(path, link))
            os.symlink("../_outside/model_world_size_2_rank_1.pt", os.path.join(path, link))

    i = copy_json(index)
    i["weight_map"]["model.phantom.weight"] = "model-00001-of-00002.safetensors"
    sharded_case("hf_index_tensor_missing", i)
    i = copy_json(index)
    i["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"
    sharded_case("hf_index_wrong_shard", i)
    # A shard holding a tensor the index does not name (loaders that list
    # the shard would load it, loaders that follow the index would not).
    tmp = tempfile.mkdtemp()
    two = "model-00001-of-00002.safetensors"
    save_file({k: full[k] for k in shards.values()}, os.path.join(tmp, two), metadata={"format": "pt"})
    sharded_case("hf_index_tensor_not_indexed",
                 {"metadata": {}, "weight_map": {"model.norm.weight": two}},
                 blobs_={two: open(os.path.join(tmp, two), "rb").read()})
    shutil.rmtree(tmp)
    i = copy_json(index)
    i["weight_map"]["model.norm.weight"] = "../hf_index_wrong_shard/model-00002-of-00002.safetensors"
    sharded_case("hf_index_shard_path", i)
    text = json.dumps(index, indent=2, sort_keys=True)
    dup = text.replace('"weight_map": {', '"weight_map": {\n    "model.norm.weight": '
                       '"model-00001-of-00002.safetensors",', 1)
    sharded_case("hf_index_duplicate_key", dup + "\n")
    sharded_case("hf_index_nul_junk", text + "\n\0" + '{"weight_map": {}}')
    sharded_case("hf_index_symlink_outside_shard", index, link="model-00002-of-00002.safetensors")


def copy_json(h: dict) -> dict:
    return json.loads(json.dumps(h))


def megatron_cases() -> None:
    """From llama_tp2 (megatron-core 0.12.2 GPTModel, TP 2): one TP rank's
    folder missing, and rank 1 replaced by the fixture generator's
    tp_mismatch_rank1.pt (a real rank file of a TP 4 model)."""
    src = os.path.join(FIX, "megatron", "llama_tp2")

    def mg_case(name: str, ranks: dict) -> None:
        path = _fresh(name)
        shutil.copytree(os.path.join(src, "hf_config_and_tokenizer"),
                        os.path.join(path, "hf_config_and_tokenizer"))
        for rank, data_path in ranks.items():
            os.makedirs(os.path.join(path, "model", rank))
            shutil.copy(data_path, os.path.join(path, "model", rank, "model.pt"))

    r0 = os.path.join(src, "model", "mp_rank_00", "model.pt")
    r1 = os.path.join(src, "model", "mp_rank_01", "model.pt")
    mg_case("megatron_missing_tp_rank", {"mp_rank_01": r1})
    mg_case("megatron_tp_size_mismatch",
            {"mp_rank_00": r0, "mp_rank_01": os.path.join(FIX, "megatron", "broken", "tp_mismatch_rank1.pt")})


def pkl_rename(b: bytes, old: str, new: str, nth: int = 0) -> bytes:
    """A rank file with the nth state-dict key `old` (a pickled BINUNICODE
    string, as torch.save writes keys) renamed to `new`."""
    enc = lambda k: b"X" + struct.pack("<I", len(k.encode())) + k.encode()  # noqa: E731
    return pkl_patch(b, enc(old), enc(new), nth)


def fsdp_fixture_case(name: str, fixture: str, ranks=None, meta=None, config_edit=None) -> None:
    """A copy of a committed verl FSDP fixture (rank files, fsdp_config.json,
    huggingface/config.json, lora_train_meta.json): ranks maps a rank file
    name to a function of its bytes; meta replaces lora_train_meta.json's
    text; config_edit changes config.json's dict."""
    src = os.path.join(FIX, fixture)
    path = _fresh(name)
    os.makedirs(os.path.join(path, "huggingface"))
    for fn in sorted(os.listdir(src)):
        if fn.startswith("model_world_size_") or fn in ("fsdp_config.json", "lora_train_meta.json"):
            data = open(os.path.join(src, fn), "rb").read()
            if ranks and fn in ranks:
                data = ranks[fn](data)
            if fn == "lora_train_meta.json" and meta is not None:
                data = meta.encode()
            with open(os.path.join(path, fn), "wb") as f:
                f.write(data)
    cfg = json.load(open(os.path.join(src, "huggingface", "config.json")))
    if config_edit:
        config_edit(cfg)
    with open(os.path.join(path, "huggingface", "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def both(fn):
    """The same change to both rank files of a world-size-2 fixture."""
    return {R0: fn, R1: fn}


def lora_cases() -> None:
    """From lora/lora_qwen2_fsdp2_w2_loraonly (verl's engine, save_lora_only:
    28 adapter tensors, 32 KB per rank), keys renamed in both rank files."""
    only = "lora/lora_qwen2_fsdp2_w2_loraonly"
    q = "base_model.model.model.layers.0.self_attn.q_proj."
    fsdp_fixture_case("lora_dora_magnitude", only, both(
        lambda b: pkl_rename(b, q + "lora_A.default.weight", q + "lora_magnitude_vector.default.weight")))
    fsdp_fixture_case("lora_second_adapter", only, both(
        lambda b: pkl_rename(b, q + "lora_A.default.weight", q + "lora_A.second.weight")))
    fsdp_fixture_case("lora_embedding", only, both(
        lambda b: pkl_rename(b, q + "lora_A.default.weight", q + "lora_embedding_A.default")))
    fsdp_fixture_case("lora_b_missing", only, both(
        lambda b: pkl_rename(b, q + "lora_B.default.weight", q + "lorX_B.default.weight")))
    fsdp_fixture_case("lora_modules_to_save", only, both(
        lambda b: pkl_rename(b, q + "lora_B.default.weight", q + "modules_to_save.default.weight")))
    fsdp_fixture_case("lora_outside_peft_model", only, both(
        lambda b: pkl_rename(b, q + "lora_A.default.weight",
                             "model.layers.0.self_attn.q_proj.lora_A.default.weight")))
    meta = {"r": 8, "lora_alpha": 16, "task_type": "CAUSAL_LM"}

    def meta_case(name, **change):
        fsdp_fixture_case(name, only, meta=json.dumps(dict(meta, **change), indent=4))
    meta_case("lora_meta_r_fraction", r=8.5)
    meta_case("lora_meta_r_mismatch", r=16)
    meta_case("lora_meta_alpha_string", lora_alpha="16")
    meta_case("lora_meta_task_type_number", task_type=1)
    fsdp_fixture_case("lora_meta_malformed", only, meta='{\n    "r": 8,\n')
    fsdp_fixture_case("lora_meta_duplicate_key", only, meta='{"r": 8, "lora_alpha": 16, "r": 4}')
    fsdp_fixture_case("lora_meta_not_object", only, meta='[8, 16]')
    fsdp_fixture_case("lora_meta_trailing_data", only, meta=json.dumps(meta) + '\n{"r": 16}\n')


def names_cases() -> None:
    """From moe_fsdp/qwen3_moe_fsdp2_w2 (verl's engine, transformers 5
    fused experts, 135 KB per rank)."""
    moe = "moe_fsdp/qwen3_moe_fsdp2_w2"
    # phimoe: transformers converts its experts, and renames its router too
    # (left out of ckfs's table, tests/gen/make_experts_table.py)
    fsdp_fixture_case("names_experts_unknown_model_type", moe,
                      config_edit=lambda c: c.update(model_type="phimoe"))
    fsdp_fixture_case("names_experts_dense_model_type", moe,
                      config_edit=lambda c: c.update(model_type="qwen3"))
    fsdp_fixture_case("names_experts_down_missing", moe, both(
        lambda b: pkl_rename(b, "model.layers.0.mlp.experts.down_proj", "model.layers.0.mlp.experts.dowX_proj")))
    fsdp_fixture_case("names_experts_bias", moe, both(
        lambda b: pkl_rename(b, "model.layers.0.mlp.experts.down_proj",
                             "model.layers.0.mlp.experts.down_proj_bias")))
    # a vision-language model's in-memory prefix under a text-only type, and
    # one the qwen2_vl rule does not know
    fsdp_fixture_case("names_vlm_unknown_model_type", moe, both(
        lambda b: pkl_rename(b, "model.norm.weight", "model.language_model.norm.weight")))
    fsdp_fixture_case("names_vlm_outside_rule", moe, both(
        lambda b: pkl_rename(b, "model.norm.weight", "model.vision_model.norm.weight")),
        config_edit=lambda c: c.update(model_type="qwen3_vl_moe"))


# ---------------------------------------------------------------------------
# DeepSpeed ZeRO checkpoints, from the fixtures written by real DeepSpeed
# 0.19.8 (tests/gen/make_deepspeed_fixtures.py).

DSF = os.path.join(FIX, "deepspeed")
STEP = "global_step2"


def ds_case(name: str, base: str, edit) -> str:
    """A copy of DeepSpeed fixture `base` as the HF Trainer lays a checkpoint
    out (latest, global_step2/, config.json beside them; the fixture's
    oracle/ and zero_to_*.py copies left out), then edit(path of
    global_step2) breaks it in one place."""
    path = _fresh(name)
    src = os.path.join(DSF, base)
    shutil.copy(os.path.join(src, "latest"), path)
    shutil.copytree(os.path.join(src, STEP), os.path.join(path, STEP))
    cfg = os.path.join(src, "config.json")
    shutil.copy(cfg if os.path.exists(cfg) else os.path.join(src, "oracle", "config.json"), path)
    edit(os.path.join(path, STEP))
    return path


def ds_file(step: str, name: str) -> str:
    return os.path.join(step, name)


def ds_optim(rank: int) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def ds_model(rank: int) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt"


def pkl_patch_after(b: bytes, anchor: bytes, old: bytes, new: bytes, skip: bytes = b"") -> bytes:
    """Replace the first `old` after `anchor` (and after `skip` past it) in
    data.pkl, in place (same length)."""
    assert len(old) == len(new)
    pkl = pickle_of(b)
    at = pkl.index(anchor)
    if skip:
        at = pkl.index(skip, at)
    at = pkl.index(old, at)
    return patch(b, layout(b)["entries"]["data.pkl"]["data"] + at, new)


def rewrite(path: str, fn) -> None:
    with open(path, "rb") as f:
        b = f.read()
    with open(path, "wb") as f:
        f.write(fn(b))


def opaque_class(module: str, name: str):
    """A class pickled as module.name (a DeepSpeed-looking class ckfs cannot
    know): instances pickle as NEWOBJ + BUILD with their __dict__."""
    import importlib

    cls = type(name, (), {})
    cls.__module__ = module
    cls.__qualname__ = name
    setattr(importlib.import_module(module), name, cls)
    return cls


def resave(path: str, fn) -> None:
    """torch.load the real file (DeepSpeed's classes imported), change the
    object in one place, torch.save it again."""
    obj = torch.load(path, weights_only=False)
    fn(obj)
    torch.save(obj, path)


def deepspeed_cases() -> None:
    """Real DeepSpeed checkpoints broken in one place: files missing, extra
    or from another checkpoint; partitions that disagree with param_shapes
    or group_paddings; DeepSpeed objects where dicts or tensors belong;
    files ckfs does not read; a `latest` naming no folder."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    z3, z2 = "z3_w3_tied_fp32", "z2_w3_tied_fp32"

    # -- files missing, extra, or from another checkpoint
    ds_case("deepspeed_missing_optim_rank", z3, lambda s: os.remove(ds_file(s, ds_optim(2))))
    ds_case("deepspeed_missing_model_rank", z3, lambda s: os.remove(ds_file(s, ds_model(1))))
    ds_case("deepspeed_missing_model_states", z2,
            lambda s: os.remove(ds_file(s, "mp_rank_00_model_states.pt")))
    ds_case("deepspeed_rank_out_of_range", z3,
            lambda s: shutil.copy(ds_file(s, ds_optim(2)), ds_file(s, ds_optim(3))))
    ds_case("deepspeed_two_files_one_rank", z3,
            lambda s: shutil.copy(ds_file(s, ds_optim(1)), ds_file(s, "bf16_" + ds_optim(1))))
    # an overwritten checkpoint: rank 2's file from a world size 4 run
    ds_case("deepspeed_rank_of_other_checkpoint", z3,
            lambda s: shutil.copy(os.path.join(DSF, "z3_w4_bf16", STEP, "bf16_" + ds_optim(2)),
                                  ds_file(s, ds_optim(2))))
    ds_case("deepspeed_latest_names_missing_folder", z3,
            lambda s: open(os.path.join(os.path.dirname(s), "latest"), "w").write("global_step3"))

    # -- files ckfs does not read (real torch files under those names)
    ds_case("deepspeed_tensor_parallel_file", z3,
            lambda s: shutil.copy(ds_file(s, ds_optim(0)),
                                  ds_file(s, "zero_pp_rank_0_mp_rank_01_optim_states.pt")))
    ds_case("deepspeed_pipeline_layer_file", z2,
            lambda s: shutil.copy(ds_file(s, "mp_rank_00_model_states.pt"),
                                  ds_file(s, "layer_01-model_states.pt")))
    ds_case("deepspeed_moe_expert_file", z2,
            lambda s: shutil.copy(ds_file(s, ds_optim(0)),
                                  ds_file(s, "expp_rank_0_mp_rank_00_optim_states.pt")))

    # -- partitions against param_shapes and group_paddings
    def size1(n):  # a 1-d size tuple: BININT2 n, TUPLE1 (a storage id's numel ends in TUPLE)
        return struct.pack("<BH", 0x4D, n) + b"\x85"
    # rank 1's fp32_flat_groups[0] pickled 4 elements short
    ds_case("deepspeed_partition_short", z3, lambda s: rewrite(
        ds_file(s, ds_optim(1)), lambda b: pkl_patch_after(b, b"fp32_flat_groups", size1(5240),
                                                           size1(5236))))
    # param_shapes says model.norm.weight has 31 elements (ZeRO-2), 35 (ZeRO-3, every rank)
    size32, size31, size35 = b"K\x20\x85", b"K\x1f\x85", b"K\x23\x85"
    ds_case("deepspeed_param_shapes_disagree", z2, lambda s: rewrite(
        ds_file(s, "mp_rank_00_model_states.pt"),
        lambda b: pkl_patch_after(b, b"param_shapes", size32, size31, skip=b"model.norm.weight")))

    def z3_shapes(s):
        for r in range(3):
            rewrite(ds_file(s, ds_model(r)), lambda b: pkl_patch_after(
                b, b"param_shapes", size32, size35, skip=b"model.norm.weight"))
    ds_case("deepspeed_param_shapes_disagree_zero3", z3, z3_shapes)
    # rank 1's model states of another model than rank 0's
    ds_case("deepspeed_model_states_ranks_differ", z3, lambda s: rewrite(
        ds_file(s, ds_model(1)),
        lambda b: pkl_patch_after(b, b"param_shapes", size32, size35, skip=b"model.norm.weight")))
    # rank 2 says none of its partition is padding
    ds_case("deepspeed_group_paddings_wrong", z2, lambda s: rewrite(
        ds_file(s, ds_optim(2)), lambda b: pkl_patch_after(b, b"group_paddings", b"K\x04",
                                                           b"K\x00")))
    # a frozen parameter's ZeRO-3 fragment one element short
    ds_case("deepspeed_frozen_fragment_short", "z3_w3_frozen_subgroups_fp32", lambda s: rewrite(
        ds_file(s, ds_model(1)), lambda b: pkl_patch_after(
            b, b"frozen_param_fragments", size1(1035), size1(1034))))

    # -- zero_stage and BF16_Optimizer
    def drop_key(key):
        return lambda o: o["optimizer_state_dict"].pop(key)

    def every_optim(s, fn):
        for f in sorted(os.listdir(s)):
            if f.endswith("_optim_states.pt"):
                resave(ds_file(s, f), fn)
    # ZeRO-2 files without zero_stage: read as BF16_Optimizer, whose
    # partitions would keep the padding that these dropped
    ds_case("deepspeed_zero_stage_removed", z2, lambda s: every_optim(s, drop_key("zero_stage")))
    ds_case("deepspeed_bf16opt_no_group_paddings", "bf16opt_w3_tied",
            lambda s: every_optim(s, drop_key("group_paddings")))

    # -- DeepSpeed objects where a dict, a tensor or a stage belongs
    state_cls = opaque_class("deepspeed.runtime.zero.stage3", "ZeroOptimizerState")
    group_cls = opaque_class("deepspeed.runtime.zero.stage3", "FlatGroup")
    stage_cls = opaque_class("deepspeed.runtime.zero.config", "ZeroStage")

    def wrap(cls, **attrs):
        o = cls()
        o.__dict__.update(attrs)
        return o

    def opaque_state(o):
        o["optimizer_state_dict"] = wrap(state_cls, **o["optimizer_state_dict"])

    def opaque_group(o):
        g = o["optimizer_state_dict"]["fp32_flat_groups"]
        g[0] = wrap(group_cls, tensor=g[0])

    def opaque_stage(o):
        o["optimizer_state_dict"]["zero_stage"] = wrap(stage_cls, value=3)
    ds_case("deepspeed_opaque_optimizer_state", z3, lambda s: resave(ds_file(s, ds_optim(0)),
                                                                     opaque_state))
    ds_case("deepspeed_opaque_flat_group", z3, lambda s: resave(ds_file(s, ds_optim(0)),
                                                                opaque_group))
    ds_case("deepspeed_opaque_zero_stage", z3, lambda s: resave(ds_file(s, ds_optim(0)),
                                                                opaque_stage))
    # PEFT (LoRA) names: a parameter renamed in the model states (in module
    # and in param_shapes), ZeRO-2, and on every ZeRO-3 rank
    def renamed(old, new):
        return lambda b: pkl_rename(pkl_rename(b, old, new), old, new)
    def peft_model(s):
        """Names as a PeftModel's: every one under base_model.model., layer
        0's q_proj a LoRA-adapted layer whose pair (r 32) takes the names of
        its o_proj and gate_proj, so that the names alone make a LoRA actor
        ckfs's verl rules would split."""
        f = ds_file(s, "mp_rank_00_model_states.pt")
        lay = "model.layers.0."
        peft = {lay + "self_attn.q_proj.weight": lay + "self_attn.q_proj.base_layer.weight",
                lay + "self_attn.o_proj.weight": lay + "self_attn.q_proj.lora_A.default.weight",
                lay + "mlp.gate_proj.weight": lay + "self_attn.q_proj.lora_B.default.weight"}
        for n in list(torch.load(f, weights_only=False)["module"]):
            new = "base_model.model." + peft.get(n, n)
            for _ in range(1 if n == "lm_head.weight" else 2):  # module, param_shapes
                rewrite(f, lambda b: pkl_rename(b, n, new))
    ds_case("deepspeed_peft_base_model_name", z2, peft_model)

    def lora_name(s):
        for r in range(3):
            rewrite(ds_file(s, ds_model(r)), renamed(
                "model.layers.1.self_attn.q_proj.weight",
                "model.layers.1.self_attn.q_proj.lora_A.default.weight"))
    ds_case("deepspeed_peft_lora_name", z3, lora_name)
    # rank 2's optimizer file cut inside its fp32 partition
    def cut(s):
        f = ds_file(s, ds_optim(2))
        b = open(f, "rb").read()
        open(f, "wb").write(b[:len(b) // 2])
    ds_case("deepspeed_optim_file_truncated", z3, cut)


def matrix_cases() -> None:
    """torch 2.15 rank files (tests/fixtures/matrix) whose DeviceMesh or
    DTensorSpec says something ckfs must not guess at."""
    base = "matrix/torch-2.15.0/"
    ranks = [f"model_world_size_4_rank_{r}.pt" for r in range(4)]
    every = lambda fn: {r: fn for r in ranks}  # noqa: E731
    # A field no release ckfs knows writes (a newer torch's, say).
    fsdp_fixture_case("mesh_unknown_field", base + "hsdp", every(
        lambda b: pkl_patch(b, b"_preserve_rank_order", b"_preserve_rank_ordex")))
    # A layout whose first axis strides past the 4-rank map: (2:5),(2:1).
    fsdp_fixture_case("mesh_layout_past_rank_map", base + "hsdp", every(
        lambda b: pkl_patch_after(b, b"_FlatLayout", b"K\x02\x85", b"K\x05\x85", skip=b"stride")))
    # Ranks 0 and 1 swapped in the rank map: rank 0's file says it is at
    # (0, 0), the map puts it at (0, 1).
    swap = struct.pack("<4i", 1, 0, 2, 3)
    fsdp_fixture_case("mesh_rank_map_swapped", base + "hsdp", every(
        lambda b: rezip(b, {"data/1": swap})))
    # Shard(0) on mesh dim 1 said to be applied on mesh dim 0.
    fsdp_fixture_case("spec_shard_order_not_default", base + "hsdp", every(
        lambda b: pkl_patch_after(b, b"shard_order", b"K\x00K\x01\x85", b"K\x00K\x00\x85")))
    # _StridedShard placements that the spec says are not a shard order.
    fsdp_fixture_case("spec_strided_not_order", base + "fsdp2_tp", every(
        lambda b: pkl_patch_after(b, b"use_strided_shard_as_shard_order", b"\x88", b"\x89")))


def layout_cases() -> None:
    matrix_cases()
    dcp_cases()
    hf_cases()
    megatron_cases()
    lora_cases()
    names_cases()
    deepspeed_cases()


if __name__ == "__main__":
    # "layouts": write only the DCP / HF / Megatron cases, leaving the
    # others (and their bytes) as they are.
    if sys.argv[1:] == ["layouts"]:
        layout_cases()
    elif sys.argv[1:] == ["deepspeed"]:
        deepspeed_cases()
    elif sys.argv[1:] == ["matrix"]:
        matrix_cases()
    else:
        main()
