#!/usr/bin/env python3
"""Check the LoRA / VLM / fused-MoE fixtures against the rules their C reader must implement.

For every case written by make_lora_vlm_fixtures.py this loads the rank files, recombines each
DTensor in full precision (Shard(d): concatenation on d in rank order), applies the rename and
split rules below, rounds to bf16 (torch's round-to-nearest-even) and requires verl's merger
output to hold exactly that set of names, shapes and bytes. It also checks the side files
(adapter_config.json, config.json, processor files) and the fused LoRA oracle.

    /root/.cache/ckfs/venv/bin/python tests/gen/check_lora_vlm_fixtures.py
    /root/.cache/ckfs/venv/bin/python tests/gen/check_lora_vlm_fixtures.py --repeat-merge qwen2_vl_fsdp2_w2

--repeat-merge NAME runs verl's merger on that checkpoint twice more (hash seeds 1 and 2) and reports
whether every output file is byte-identical to the committed one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")

# Per model_type: prefix renames verl's merger output shows (first match wins, applied once).
PREFIX_RENAMES = {
    "qwen2_vl": [("model.language_model.", "model."), ("model.visual.", "visual.")],
    "qwen2_5_vl": [("model.language_model.", "model."), ("model.visual.", "visual.")],
    "gemma3": [("model.language_model.", "language_model.model."), ("model.vision_tower.", "vision_tower."),
               ("model.multi_modal_projector.", "multi_modal_projector.")],
}
# Per model_type: how a fused expert stack is written. Each entry: (suffix of the fused key,
# per-expert module prefix, [(output leaf, row slice of the expert matrix: "gate" | "up" | "all")]).
EXPERT_SPLITS = {
    "qwen3_moe": ("mlp.experts.", [("gate_up_proj", [("gate_proj.weight", "gate"), ("up_proj.weight", "up")]),
                                   ("down_proj", [("down_proj.weight", "all")])]),
    "mixtral": ("block_sparse_moe.experts.", [("gate_up_proj", [("w1.weight", "gate"), ("w3.weight", "up")]),
                                              ("down_proj", [("w2.weight", "all")])]),
}
OTHER_RENAMES = {"mixtral": [(".mlp.gate.weight", ".block_sparse_moe.gate.weight")]}


def load_ranks(ckpt, world):
    return [torch.load(os.path.join(ckpt, f"model_world_size_{world}_rank_{r}.pt"), map_location="cpu",
                       weights_only=False) for r in range(world)]


def recombine(sds):
    from torch.distributed.tensor import DTensor

    out, kinds = {}, {}
    for k, v in sds[0].items():
        if isinstance(v, DTensor):
            (pl,) = v.placements
            assert pl.is_shard(), (k, pl)
            out[k] = torch.cat([sd[k]._local_tensor for sd in sds], dim=pl.dim)
            kinds[k] = f"DTensor Shard({pl.dim})"
        else:
            assert all(torch.equal(sd[k], v) for sd in sds), k
            out[k] = v
            kinds[k] = "Tensor"
    return out, kinds


def read_safetensors(path):
    """(tensors, header key order, metadata, data offsets ascending in header order)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    meta = header.pop("__metadata__", None)
    order = list(header)
    offs = [header[k]["data_offsets"] for k in order]
    ascending = all(offs[i][1] == offs[i + 1][0] for i in range(len(offs) - 1)) and (not offs or offs[0][0] == 0)
    with safe_open(path, "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return tensors, order, meta, ascending, n


def lora_split(full):
    """verl's save_lora_adapter: (adapter {name: tensor}, base {name: tensor}) from the merged names."""
    adapter, base = {}, {}
    for k, v in full.items():
        if "lora_" in k:
            adapter[k.replace(".default.weight", ".weight")] = v
        else:
            base[k.replace("base_model.model.", "").replace(".base_layer.weight", ".weight")
                 .replace(".base_layer.bias", ".bias")] = v
    return adapter, base


def rename(key, model_type):
    for old, new in PREFIX_RENAMES.get(model_type, []):
        if key.startswith(old):
            return new + key[len(old):]
    for old, new in OTHER_RENAMES.get(model_type, []):
        if key.endswith(old):
            return key[: -len(old)] + new
    return key


def expected_tensors(base, model_type, tied):
    """Apply the output rules to HF in-memory names; values stay full precision."""
    out = {}
    split = EXPERT_SPLITS.get(model_type)
    for k, v in base.items():
        if tied and k == "lm_head.weight":
            continue
        if split and re.search(r"\.mlp\.experts\.(gate_up_proj|down_proj)$", k):
            module_prefix, rules = split
            layer = k[: k.index(".mlp.experts.")]
            fused = k.rsplit(".", 1)[1]
            for leaf, part in dict(rules)[fused]:
                for e in range(v.shape[0]):
                    m = v[e]
                    f = m.shape[0] // 2
                    sl = m[:f] if part == "gate" else m[f:] if part == "up" else m
                    out[f"{layer}.{module_prefix}{e}.{leaf}"] = sl
            continue
        out[rename(k, model_type)] = v
    return out


def check_tensors(name, got, want):
    assert set(got) == set(want), (name, sorted(set(got) ^ set(want))[:10])
    for k, v in want.items():
        g = got[k]
        assert g.dtype == torch.bfloat16, (name, k, g.dtype)
        assert list(g.shape) == list(v.shape), (name, k, g.shape, v.shape)
        assert torch.equal(g.view(torch.int16), v.contiguous().to(torch.bfloat16).view(torch.int16)), (name, k)


def check_lora_side(case, ckpt, expected, adapter_want):
    name = case["name"]
    lo = case["lora"]
    tensors, order, meta, ascending, _ = read_safetensors(os.path.join(expected, "lora_adapter",
                                                                       "adapter_model.safetensors"))
    assert meta is None and ascending and order == sorted(order), name
    check_tensors(name + " adapter", tensors, adapter_want)
    cfg = json.load(open(os.path.join(expected, "lora_adapter", "adapter_config.json")))
    has_meta = os.path.exists(os.path.join(ckpt, "lora_train_meta.json"))
    if has_meta:
        m = json.load(open(os.path.join(ckpt, "lora_train_meta.json")))
        assert m == {"r": lo["r"], "lora_alpha": lo["lora_alpha"], "task_type": "CAUSAL_LM"}, m
    assert cfg["r"] == lo["r"], (name, cfg["r"])
    assert cfg["lora_alpha"] == (lo["lora_alpha"] if has_meta else 0), (name, cfg["lora_alpha"])
    assert cfg["task_type"] == ("CAUSAL_LM" if has_meta else None), (name, cfg["task_type"])
    assert cfg["peft_type"] == "LORA" and cfg["use_rslora"] is False, name
    modules = {k.split(".")[-3] for k in adapter_want}
    assert sorted(cfg["target_modules"]) == sorted(modules), (name, cfg["target_modules"])


def check_fused_oracle(case, expected, full, tied):
    """fused_fp32 == base + (B @ A) * scale, with peft's scale (alpha/r, or alpha/sqrt(r) with rslora)."""
    lo = case["lora"]
    scale = lo["lora_alpha"] / (lo["r"] ** 0.5 if lo["use_rslora"] else lo["r"])
    base, _, _, _, _ = read_safetensors(os.path.join(expected, "base_fp32.safetensors"))
    fused, _, _, _, _ = read_safetensors(os.path.join(expected, "fused_fp32.safetensors"))
    assert set(base) == set(fused)
    if tied:
        assert "lm_head.weight" not in fused
    n_exact = n_close = 0
    for k, v in fused.items():
        mod = k[: -len(".weight")] if k.endswith(".weight") else None
        a = full.get(f"base_model.model.{mod}.lora_A.default.weight") if mod else None
        if a is None:
            assert torch.equal(v, base[k]), (case["name"], k)
            continue
        b = full[f"base_model.model.{mod}.lora_B.default.weight"]
        want = base[k] + (b @ a) * scale
        if torch.equal(v, want):
            n_exact += 1
        else:
            assert torch.allclose(v, want, rtol=0, atol=1e-6), (case["name"], k, (v - want).abs().max())
            n_close += 1
        assert not torch.equal(v, base[k]), (case["name"], k)
    return n_exact, n_close


def check_case(case, root):
    name = case["name"]
    ckpt = os.path.join(root, case["checkpoint"])
    expected = os.path.join(root, case["expected"])
    src_cfg = json.load(open(os.path.join(ckpt, "huggingface", "config.json")))
    model_type = src_cfg["model_type"]
    tied = bool(src_cfg.get("tie_word_embeddings"))
    sds = load_ranks(ckpt, case["world_size"])
    full, kinds = recombine(sds)
    notes = [f"{len(full)} rank keys ({', '.join(sorted(set(kinds.values())))})"]

    if case["kind"] == "lora":
        adapter_full, base_full = lora_split(full)
        if case["save_lora_only"]:
            assert all("lora_" in k for k in full), name
        check_lora_side(case, ckpt, expected, adapter_full)
        n_exact, n_close = check_fused_oracle(case, expected, full, tied)
        notes.append(f"adapter {len(adapter_full)} tensors; fused oracle: {n_exact} modules bit-exact "
                     f"to base + (B@A)*scale, {n_close} within 1e-6")
    else:
        base_full = full

    model_path = os.path.join(expected, "model.safetensors")
    if case["save_lora_only"]:
        assert not os.path.exists(model_path) and case["merger_exit"] == 1, name
        log = open(os.path.join(expected, "merger.log")).read()
        assert "RuntimeError: Incomplete Hugging Face model output at <target_dir>: no complete model weights" in log
        notes.append("merger exits 1 after writing lora_adapter/, config.json, generation_config.json, tokenizer")
    else:
        got, order, meta, ascending, hlen = read_safetensors(model_path)
        assert meta == {"format": "pt"} and ascending and order == sorted(order), name
        want = expected_tensors(base_full, model_type, tied)
        check_tensors(name, got, want)
        notes.append(f"model.safetensors: {len(got)} tensors, header {hlen} bytes, names sorted, bit-exact")

    out_cfg = json.load(open(os.path.join(expected, "config.json")))
    assert out_cfg["dtype"] == "bfloat16" and src_cfg["dtype"] == "float32", name
    for sub in ("text_config", "vision_config"):
        if sub in out_cfg:
            assert out_cfg[sub]["dtype"] == "bfloat16", (name, sub)
    assert "attn_implementation" in src_cfg and "attn_implementation" not in out_cfg, name
    for fn in os.listdir(expected):
        side = os.path.join(ckpt, "huggingface", fn)
        if fn != "config.json" and os.path.exists(side):
            assert open(side, "rb").read() == open(os.path.join(expected, fn), "rb").read(), (name, fn)
    return notes


def repeat_merge(case, root):
    ckpt = os.path.join(root, case["checkpoint"])
    expected = os.path.join(root, case["expected"])
    results = []
    for seed in ("1", "2"):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, PYTHONHASHSEED=seed, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                       CUDA_VISIBLE_DEVICES="")
            p = subprocess.run([sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
                                "--local_dir", ckpt, "--target_dir", tmp], env=env, capture_output=True, text=True)
            assert p.returncode == case["merger_exit"], p.stdout + p.stderr
            for fn in sorted(case["expected_files"]):
                same = open(os.path.join(tmp, fn), "rb").read() == open(os.path.join(expected, fn), "rb").read()
                results.append((seed, fn, same))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=FIXTURES)
    ap.add_argument("--repeat-merge", action="append", default=[], help="case to merge twice more and compare")
    args = ap.parse_args()
    manifest = json.load(open(os.path.join(args.root, "MANIFEST_lora_vlm.json")))
    failed = 0
    for case in manifest["cases"]:
        try:
            notes = check_case(case, args.root)
            print(f"ok   {case['name']}: " + "; ".join(notes))
        except AssertionError as e:
            failed += 1
            print(f"FAIL {case['name']}: {e!r}")
    for name in args.repeat_merge:
        case = next(c for c in manifest["cases"] if c["name"] == name)
        for seed, fn, same in repeat_merge(case, args.root):
            print(f"repeat {name} PYTHONHASHSEED={seed} {fn}: {'identical' if same else 'DIFFERENT'}")
    print(f"{len(manifest['cases']) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
