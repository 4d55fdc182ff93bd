# SPDX-License-Identifier: MIT
"""Shared by the client scripts (each runs in its own venv, so this uses the standard library only).

A client is given a spec file (JSON, written by tests/clients/run_clients.py):

    {"cases": [{"name": ..., "kind": ..., "mount": DIR, "reference": DIR, "reference_tool": ...}, ...],
     "result": PATH}

`mount` is a folder served by ckfs (a mount point, or a folder inside one), `reference` a folder
with the same model written by the reference tool (config.json and model.safetensors, or shards
and model.safetensors.index.json). The client writes one record per case to `result`:

    {"name": ..., "ok": bool, "checked": "one line saying what was compared", ...}

and prints the same line, so the tier's log says what each client checked.
"""

from __future__ import annotations

import json
import os
import struct
import sys


def load_spec():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} SPEC.json")
    with open(sys.argv[1]) as f:
        return json.load(f)


def write_result(spec, records):
    with open(spec["result"], "w") as f:
        json.dump(records, f, indent=1)
        f.write("\n")


def weight_files(folder):
    """The safetensors files of a model folder, as a loader finds them: the index's files when
    model.safetensors.index.json is there, else model.safetensors."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(folder, fn) for fn in files]
    return [os.path.join(folder, "model.safetensors")]


def raw_tensors(path):
    """{name: (dtype, shape, bytes)} of one safetensors file, read with plain file reads (the
    reference side of a comparison: no loader under test in the way)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            begin, end = meta["data_offsets"]
            f.seek(base + begin)
            out[name] = (meta["dtype"], list(meta["shape"]), f.read(end - begin))
    return out


def folder_raw_tensors(folder):
    out = {}
    for path in weight_files(folder):
        for k, v in raw_tensors(path).items():
            if k in out:
                raise ValueError(f"{folder}: tensor {k} in two files")
            out[k] = v
    return out


# torch dtype name -> safetensors dtype name (what the loaders under test hand back)
TORCH_TO_ST = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64", "int64": "I64",
               "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
               "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def torch_raw(t):
    """(dtype, shape, bytes) of a torch tensor, to compare with raw_tensors()."""
    import torch

    dt = TORCH_TO_ST[str(t.dtype).replace("torch.", "")]
    c = t.detach().to("cpu").contiguous()
    data = c.view(torch.uint8).numpy().tobytes() if c.numel() else b""
    return dt, list(c.shape), data


def compare_tensors(got, want):
    """Differences between two {name: (dtype, shape, bytes)} maps, as short strings (empty: equal
    bit for bit)."""
    diffs = []
    for k in sorted(set(got) | set(want)):
        if k not in got:
            diffs.append(f"{k}: missing")
        elif k not in want:
            diffs.append(f"{k}: not in the reference")
        elif got[k][:2] != want[k][:2]:
            diffs.append(f"{k}: {got[k][0]}{got[k][1]} vs reference {want[k][0]}{want[k][1]}")
        elif got[k][2] != want[k][2]:
            diffs.append(f"{k}: bytes differ")
    return diffs


def say(*a):
    print(*a, flush=True)
