#!/usr/bin/env python3
"""Read the DeepSpeed fixtures without torch or DeepSpeed and check them against their oracles.

An independent second reader of tests/fixtures/deepspeed/<case>/ (written by
make_deepspeed_fixtures.py): zipfile + pickle + numpy only, the way a C reader must do it.
The .pt files are opened as zip archives, data.pkl is unpickled with a class table that allows
only the globals listed below (anything else is an error naming the file and the global), and
tensors are numpy views of the raw storage bytes (shape, stride and storage offset as pickled).
Then every fp32 weight is reassembled from the flat partitions by the rules written in
RULES below and compared bit for bit with oracle/zero_to_fp32.safetensors and
oracle/live_fp32.safetensors (read with a small safetensors parser, also numpy only).

    .venv/bin/python tests/gen/check_deepspeed_fixtures.py [--layout] [CASE...]  # one line a case
    .venv/bin/python tests/gen/check_deepspeed_fixtures.py --dump CASE           # object graphs
    .venv/bin/python tests/gen/check_deepspeed_fixtures.py --root tests/fixtures/matrix/deepspeed-0.16.9

Needs numpy only (the venv of tests/setup-venv.sh has it). Exits non-zero on the first
mismatch, naming the case and the tensor.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import pickle
import re
import struct
import sys
import zipfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "deepspeed")

RULES = """
stage 1/2 (zero_stage 1 or 2): for each param group g: flat = concatenation over ranks (file order
  0..ws-1) of optimizer_state_dict.single_partition_of_fp32_groups[g]; walk model_states
  param_shapes[g] in order: tensor = flat[off : off+numel], off += numel + param_alignment_paddings[g][i].
  len(flat) == off (no tail padding is saved).
BF16_Optimizer (no zero_stage key): the same walk, but each rank's partition keeps its padding:
  flat = concatenation of single_partition_of_fp32_groups[g] over ranks, the tail padding is
  group_paddings[g] of the last rank; len(flat) - sum(group_paddings) == sum(numel).
stage 3: per rank r: vec_r = concatenation of optimizer_state_dict.fp32_flat_groups (all sub-groups);
  param_shapes = the list of OrderedDicts merged in order; for each param: part = ceil(numel/ws);
  tensor = concat_r(vec_r[off : off+part])[:numel]; off += part. len(vec_r) == off for every r.
frozen: stage 2: frozen_param_fragments[name] is the whole tensor (module dtype); stage 3:
  concat over ranks of frozen_param_fragments[name] (each ceil(numel/ws)) [:numel]; stage 1 and
  BF16_Optimizer: frozen_param_shapes/fragments are None (the module entry holds the frozen values).
tied: shared_params (rank 0's model_states) alias -> owner; the alias is the owner's tensor.
"""


# --------------------------------------------------------------------------------------------
# torch.save archives through pickle + numpy
# --------------------------------------------------------------------------------------------
STORAGE_DTYPES = {
    "FloatStorage": np.dtype("<f4"), "BFloat16Storage": np.dtype("<u2"), "HalfStorage": np.dtype("<f2"),
    "DoubleStorage": np.dtype("<f8"), "LongStorage": np.dtype("<i8"), "IntStorage": np.dtype("<i4"),
    "BoolStorage": np.dtype("?"), "ByteStorage": np.dtype("u1"),
}


class Tensor:
    """A pickled tensor: the numpy view of its storage plus what was pickled about it."""

    def __init__(self, storage, offset, size, stride, requires_grad):
        self.storage, self.offset, self.shape, self.stride = storage, offset, tuple(size), tuple(stride)
        self.requires_grad = requires_grad
        self.dtype = storage.kind
        itemsize = storage.array.dtype.itemsize
        numel = math.prod(self.shape)
        if numel:
            self.array = np.lib.stride_tricks.as_strided(storage.array[offset:], self.shape,
                                                         [s * itemsize for s in self.stride])
        else:
            self.array = np.zeros(self.shape, storage.array.dtype)

    @property
    def numel(self):
        return math.prod(self.shape)

    def flat(self):
        return np.ascontiguousarray(self.array).reshape(-1)

    def __repr__(self):
        return (f"Tensor({self.dtype}, shape={list(self.shape)}, stride={list(self.stride)}, "
                f"storage={self.storage.key}[{self.storage.numel}], offset={self.offset}"
                f"{', requires_grad' if self.requires_grad else ''})")


class Storage:
    def __init__(self, kind, key, numel, raw):
        self.kind, self.key, self.numel = kind, key, numel
        self.array = np.frombuffer(raw, STORAGE_DTYPES[kind], count=numel)


class Opaque:
    """A non-torch object (DeepSpeed's LossScaler, fragment_address, ZeroStageEnum)."""

    def __init__(self, cls, args=(), state=None):
        self.cls, self.args, self.state = cls, args, state

    def __setstate__(self, state):
        self.state = state

    def __repr__(self):
        inner = self.args if self.args else self.state
        return f"{self.cls}{inner!r}"


def opaque_class(qualname):
    class Stub(Opaque):
        def __new__(cls, *args):
            o = object.__new__(cls)
            Opaque.__init__(o, qualname, args)
            return o

        def __init__(self, *args):
            pass
    Stub.__name__ = qualname
    return Stub


def rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks, metadata=None):
    return Tensor(storage, offset, size, stride, requires_grad)


def rebuild_from_type_v2(func, new_type, args, state):
    return func(*args)


class TorchSize(tuple):
    pass


ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor_v2,
    ("torch._tensor", "_rebuild_from_type_v2"): rebuild_from_type_v2,
    ("torch", "Tensor"): "Tensor",
    ("torch", "Size"): TorchSize,
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"): opaque_class("ZeroStageEnum"),
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"): opaque_class("LossScaler"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"): opaque_class("fragment_address"),
    # DeepSpeed 0.16's model states hold sparse_tensor_module_names, a set (protocol 2 spells
    # it __builtin__.set, REDUCE of a list)
    ("__builtin__", "set"): set,
}
for _k in STORAGE_DTYPES:
    ALLOWED[("torch", _k)] = _k


class Archive:
    """One torch.save zip: its records, the unpickled object and the globals it named."""

    def __init__(self, path):
        self.path = path
        self.zip = zipfile.ZipFile(path)
        names = self.zip.namelist()
        self.root = names[0].split("/")[0]
        self.records = [n[len(self.root) + 1:] for n in names]
        self.globals = []
        self.storages = {}
        with self.zip.open(f"{self.root}/data.pkl") as f:
            self.pickle_bytes = f.read()
        self.obj = self._unpickle()

    def _unpickle(self):
        archive = self

        class U(pickle.Unpickler):
            def find_class(self, module, name):
                if (module, name) not in ALLOWED:
                    raise ValueError(f"'{archive.path}': pickle global {module}.{name} not allowed")
                if f"{module}.{name}" not in archive.globals:
                    archive.globals.append(f"{module}.{name}")
                return ALLOWED[(module, name)]

            def persistent_load(self, pid):
                tag, kind, key, location, numel = pid
                assert tag == "storage", pid
                if key not in archive.storages:
                    raw = archive.zip.read(f"{archive.root}/data/{key}")
                    assert len(raw) == numel * STORAGE_DTYPES[kind].itemsize, (archive.path, key)
                    archive.storages[key] = Storage(kind, key, numel, raw)
                return archive.storages[key]

        import io
        return U(io.BytesIO(self.pickle_bytes)).load()

    def protocol(self):
        return self.pickle_bytes[1] if self.pickle_bytes[0] == 0x80 else None


# --------------------------------------------------------------------------------------------
# safetensors (numpy)
# --------------------------------------------------------------------------------------------
ST_DTYPES = {"F32": np.dtype("<f4"), "BF16": np.dtype("<u2"), "F16": np.dtype("<f2")}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = collections.OrderedDict()
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        arr = np.frombuffer(data[8 + n + a:8 + n + b], ST_DTYPES[v["dtype"]]).reshape(v["shape"])
        out[k] = (v["dtype"], arr)
    return out


# --------------------------------------------------------------------------------------------
# Reassembly by the rules
# --------------------------------------------------------------------------------------------
def natural_key(s):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def dtype_name(kind):
    return {"FloatStorage": "F32", "BFloat16Storage": "BF16", "HalfStorage": "F16"}[kind]


class Checkpoint:
    def __init__(self, root):
        self.root = root
        with open(os.path.join(root, "latest")) as f:
            self.tag = f.read().strip()
        tagdir = os.path.join(root, self.tag)
        files = sorted(os.listdir(tagdir), key=natural_key)
        self.optim = [Archive(os.path.join(tagdir, f)) for f in files if f.endswith("_optim_states.pt")]
        self.models = [Archive(os.path.join(tagdir, f)) for f in files if f.endswith("_model_states.pt")]
        osd = self.optim[0].obj["optimizer_state_dict"]
        self.stage = osd["zero_stage"].args[0] if "zero_stage" in osd else None  # None: BF16_Optimizer
        self.ws = len(self.optim)
        self.m0 = self.models[0].obj

    def trainable(self):
        if self.stage == 3:
            return self._stage3()
        return self._stage12()

    def _stage12(self):
        out = collections.OrderedDict()
        for g, shapes in enumerate(self.m0["param_shapes"]):
            parts = [a.obj["optimizer_state_dict"]["single_partition_of_fp32_groups"][g] for a in self.optim]
            flat = np.concatenate([p.flat() for p in parts])
            osd0 = self.optim[0].obj["optimizer_state_dict"]
            pads = osd0.get("param_alignment_paddings", [[0] * len(shapes)] * (g + 1))[g]
            off = 0
            for i, (name, shape) in enumerate(shapes.items()):
                n = math.prod(shape)
                out[name] = ("F32", flat[off:off + n].reshape(shape))
                off += n + pads[i]
            if self.stage is None:  # BF16_Optimizer: padded partitions
                tail = sum(a.obj["optimizer_state_dict"]["group_paddings"][g] for a in self.optim)
                assert off == len(flat) - tail, (off, len(flat), tail)
            else:
                assert off == len(flat), (off, len(flat))
        return out

    def _stage3(self):
        out = collections.OrderedDict()
        vecs = [np.concatenate([t.flat() for t in a.obj["optimizer_state_dict"]["fp32_flat_groups"]])
                for a in self.optim]
        off = 0
        for shapes in self.m0["param_shapes"]:
            for name, shape in shapes.items():
                n = math.prod(shape)
                part = -(-n // self.ws)
                full = np.concatenate([v[off:off + part] for v in vecs])[:n]
                out[name] = ("F32", full.reshape(shape))
                off += part
        assert all(len(v) == off for v in vecs), (off, [len(v) for v in vecs])
        return out

    def frozen(self):
        shapes = self.m0.get("frozen_param_shapes")
        out = collections.OrderedDict()
        if not shapes:
            return out
        for name, shape in shapes.items():
            n = math.prod(shape)
            if self.stage == 3:
                frags = [m.obj["frozen_param_fragments"][name] for m in self.models]
                assert all(f.numel == -(-n // self.ws) for f in frags), name
                full = np.concatenate([f.flat() for f in frags])[:n]
                out[name] = (dtype_name(frags[0].dtype), full.reshape(shape))
            else:
                t = self.m0["frozen_param_fragments"][name]
                out[name] = (dtype_name(t.dtype), t.flat().reshape(shape))
        return out

    def merged(self):
        """What zero_to_fp32 returns, in its order: buffers, frozen, trainable, then aliases."""
        out = collections.OrderedDict()
        for b in self.m0["buffer_names"]:
            t = self.m0["module"][b]
            out[b] = (dtype_name(t.dtype), t.flat().reshape(t.shape))
        out.update(self.frozen())
        out.update(self.trainable())
        for alias, owner in self.m0["shared_params"].items():
            out[alias] = out[owner]
        return out


def bits(arr):
    a = np.ascontiguousarray(arr)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def same(a, b):
    return a[0] == b[0] and a[1].shape == b[1].shape and np.array_equal(bits(a[1]), bits(b[1]))


def bf16_of_f32(x):
    """fp32 -> bf16 bits, round to nearest even (torch's .to(bfloat16) for finite values)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


# --------------------------------------------------------------------------------------------
# Checks per case
# --------------------------------------------------------------------------------------------
def check_case(name):
    root = os.path.join(FIXTURES, name)
    with open(os.path.join(root, "oracle", "case.json")) as f:
        rec = json.load(f)
    ck = Checkpoint(root)
    merged = ck.merged()
    live = read_safetensors(os.path.join(root, "oracle", "live_fp32.safetensors"))
    aliases = set(ck.m0["shared_params"])
    notes = []
    z2f_path = os.path.join(root, "oracle", "zero_to_fp32.safetensors")
    if os.path.exists(z2f_path):
        z2f = read_safetensors(z2f_path)
        want = [k for k in merged if k not in aliases]
        # safetensors sorts its header; zero_to_fp32's own order is recorded in case.json
        assert rec["zero_to_fp32"]["keys"] == want, (name, "key order", rec["zero_to_fp32"]["keys"], want)
        assert sorted(z2f) == sorted(want), (name, "keys", sorted(z2f), sorted(want))
        for k in want:
            assert same(merged[k], z2f[k]), (name, k, "differs from zero_to_fp32")
        notes.append(f"z2f {len(want)} tensors bit-exact, same order")
    else:
        assert ck.stage is None, (name, "z2f refused a zero checkpoint")
        notes.append("z2f refused (no zero_stage)")
    for k, v in live.items():
        if k in merged:
            assert same(merged[k], v), (name, k, "differs from live")
        else:
            assert ck.m0.get("frozen_param_shapes") is None, (name, k)
            m = ck.m0["module"][k]  # ZeRO-1 / BF16_Optimizer frozen params: the module value
            assert same((dtype_name(m.dtype), m.flat().reshape(m.shape)), v), (name, k, "module")
    missing = [k for k in live if k not in merged]
    notes.append(f"live {len(live)} tensors bit-exact" + (f" ({len(missing)} frozen from module)" if missing else ""))
    notes += check_module(ck, merged)
    return notes


def check_module(ck, merged):
    """ZeRO-1/2 and BF16_Optimizer: module weights are the masters rounded to the module dtype.
    ZeRO-3: every parameter is a 0-element placeholder."""
    module = ck.m0["module"]
    if ck.stage == 3:
        for m in ck.models:
            for k, t in m.obj["module"].items():
                assert t.numel == 0 and t.shape == (0,), (k, t)
        return ["zero3 module: placeholders"]
    trainable = ck.trainable()
    storages = set()
    for k, (_, arr) in trainable.items():
        t = module[k]
        storages.add(t.storage.key)
        if t.dtype == "BFloat16Storage":
            assert np.array_equal(t.flat(), bf16_of_f32(arr.reshape(-1))), k
        else:
            assert np.array_equal(bits(t.flat()), bits(arr.reshape(-1))), k
    return [f"module = master in {module[next(iter(trainable))].dtype[:-7]}, {len(storages)} storage(s)"]


def layout_checks(name):
    """The partition, padding and alignment rules, checked on the files; returns a summary."""
    root = os.path.join(FIXTURES, name)
    ck = Checkpoint(root)
    ws, m0 = ck.ws, ck.m0
    osds = [a.obj["optimizer_state_dict"] for a in ck.optim]
    lines = [f"stage={ck.stage} ws={ws} files={[os.path.basename(a.path) for a in ck.models + ck.optim]}"]
    if ck.stage in (1, 2, None):
        for g, shapes in enumerate(m0["param_shapes"]):
            numel = sum(math.prod(s) for s in shapes.values())
            pads = osds[0].get("param_alignment_paddings", [[0] * len(shapes)] * (g + 1))[g]
            aligned = -(-(numel + sum(pads)) // (2 * ws)) * (2 * ws)
            part = aligned // ws
            parts = [o["single_partition_of_fp32_groups"][g] for o in osds]
            gp = [o["group_paddings"][g] for o in osds]
            # padding: the tail of the aligned buffer, taken from the last rank(s)
            want_pad = [max(0, min(part, (r + 1) * part - (numel + sum(pads)))) for r in range(ws)]
            assert gp == want_pad, (name, g, gp, want_pad)
            if ck.stage is None:
                assert all(t.numel == part for t in parts), (name, [t.numel for t in parts], part)
            else:
                assert [t.numel for t in parts] == [part - p for p in gp], (name, [t.numel for t in parts])
            assert all(t.storage.numel == part and t.offset == 0 for t in parts), name
            pad_values = np.concatenate([t.storage.array[t.numel:] for t in parts if t.storage.numel > t.numel]
                                        or [np.zeros(0, np.float32)])
            # module: views of one bit16 flat storage per group at the flat offsets of param_shapes
            off, mod_storage = 0, None
            for i, (n, shape) in enumerate(shapes.items()):
                t = m0["module"][n]
                assert t.offset == off and t.shape == tuple(shape), (name, n, t.offset, off)
                mod_storage = mod_storage or t.storage
                assert t.storage is mod_storage, (name, n)
                off += math.prod(shape) + pads[i]
            assert mod_storage.numel == aligned, (name, mod_storage.numel, aligned)
            # param_slice_mappings: (numel, start) of each param's piece inside the rank's partition
            psm_ok = True
            for r, o in enumerate(osds):
                if "param_slice_mappings" not in o:
                    continue
                off = 0
                for i, (n, shape) in enumerate(shapes.items()):
                    lo, hi = max(off, r * part), min(off + math.prod(shape), (r + 1) * part)
                    fa = o["param_slice_mappings"][g].get(n)
                    if hi > lo:
                        psm_ok &= fa is not None and fa.state == {"numel": hi - lo, "start": lo - r * part}
                    else:
                        psm_ok &= fa is None
                    off += math.prod(shape) + pads[i]
            lines.append(f"group {g}: {len(shapes)} params, numel {numel}, aligned {aligned} (2*ws={2 * ws}), "
                         f"partition {part}, saved lengths {[t.numel for t in parts]}, group_paddings {gp}, "
                         f"storage numel {[t.storage.numel for t in parts]}, padding values "
                         f"{'all zero' if not pad_values.any() else 'NONZERO'} ({pad_values.size}), module storage "
                         f"{mod_storage.kind}[{mod_storage.numel}], param_slice_mappings "
                         f"{'match' if psm_ok else 'DO NOT MATCH'} the flat layout")
    else:
        for sg, t in enumerate(osds[0]["fp32_flat_groups"]):
            shapes = m0["param_shapes"][sg] if len(m0["param_shapes"]) > sg else None
            want = sum(-(-math.prod(s) // ws) for s in shapes.values()) if shapes is not None else None
            lens = [o["fp32_flat_groups"][sg].numel for o in osds]
            assert lens == [want] * ws, (name, sg, lens, want)
            lines.append(f"sub-group {sg}: {len(shapes)} params, per-rank length {want}, storage numel "
                         f"{[o['fp32_flat_groups'][sg].storage.numel for o in osds]}, requires_grad "
                         f"{[o['fp32_flat_groups'][sg].requires_grad for o in osds]}")
        # padding elements of the last ranks: zero?
        vecs = [np.concatenate([t.flat() for t in o["fp32_flat_groups"]]) for o in osds]
        off, padvals = 0, []
        for shapes in m0["param_shapes"]:
            for s in shapes.values():
                n = math.prod(s)
                part = -(-n // ws)
                for r in range(ws):
                    lo = r * part
                    if lo + part > n:
                        padvals.append(vecs[r][off + max(0, n - lo):off + part])
                off += part
        padvals = np.concatenate(padvals) if padvals else np.zeros(0)
        lines.append(f"per-param padding elements: {padvals.size}, {'all zero' if not padvals.any() else 'NONZERO'}")
        for m in ck.models:
            for n, f in (m.obj["frozen_param_fragments"] or {}).items():
                numel = math.prod(m0["frozen_param_shapes"][n])
                assert f.numel == -(-numel // ws) and f.shape == (f.numel,), (name, n)
        sp = [m.obj["shared_params"] for m in ck.models]
        lines.append(f"shared_params per rank: {sp}")
    return lines


def round_robin(names, ws):
    """DeepSpeed's _round_robin_reorder: bucket i % ws, buckets in order, each in module order."""
    return [n for b in range(ws) for i, n in enumerate(names) if i % ws == b]


def _shape(m0, name):
    return next(s[name] for s in m0["param_shapes"] if name in s)


def order_checks(name):
    """Where the flat order comes from, and what the Trainer's model.safetensors holds."""
    root = os.path.join(FIXTURES, name)
    ck = Checkpoint(root)
    with open(os.path.join(root, "oracle", "case.json")) as f:
        spec = json.load(f)["case"]
    m0, lines = ck.m0, []
    module_names = list(m0["module"])
    aliases = set(m0["shared_params"])
    frozen = set(m0["frozen_param_shapes"] or {})
    flat_names = [n for shapes in m0["param_shapes"] for n in shapes]
    trainable_in_module_order = [n for n in module_names if n not in aliases and n in flat_names]
    if spec["round_robin_gradients"]:
        assert len(m0["param_shapes"]) == 1
        assert flat_names == round_robin(trainable_in_module_order, ck.ws), name
        lines.append(f"param_shapes = round_robin(module order, {ck.ws})")
    elif spec["trainer"]:
        groups = [list(s) for s in m0["param_shapes"]]
        assert sorted(sum(groups, [])) == sorted(trainable_in_module_order)
        for g in groups:
            assert g == [n for n in trainable_in_module_order if n in g], name
        nd = groups[1] if len(groups) > 1 else []
        assert all(n.endswith(".bias") or "norm" in n for n in nd), nd
        assert not any(n.endswith(".bias") or "norm" in n for n in groups[0]), groups[0]
        lines.append(f"param_shapes: {len(groups)} groups (weight decay: {len(groups[0])} params, none: "
                     f"{len(nd)} = biases and norms), each in module order")
    else:
        assert flat_names == trainable_in_module_order, name
        lines.append("param_shapes = trainable params in module (state_dict) order, aliases left out")
    if frozen:
        assert list(m0["frozen_param_shapes"]) == [n for n in module_names if n in frozen], name
        lines.append("frozen_param_shapes: frozen params in module order")
    st = os.path.join(root, "model.safetensors")
    if os.path.exists(st):
        hf = read_safetensors(st)
        for k, (dt, arr) in hf.items():
            t = m0["module"][k]
            assert dt == dtype_name(t.dtype) and np.array_equal(bits(arr.reshape(-1)), t.flat()), k
        lines.append(f"model.safetensors = the {len(hf)} module tensors of the model states "
                     f"({'tied alias dropped' if aliases and not (aliases & set(hf)) else 'all names'})")
    if ck.stage == 3 and spec["sub_group_size"]:
        # sub-groups: params in order, closed when the summed partition numel reaches the size
        want, cur, acc = [], [], 0
        for n in flat_names:
            cur.append(n)
            acc += -(-math.prod(_shape(m0, n)) // ck.ws)
            if acc >= spec["sub_group_size"] or n == flat_names[-1]:
                want.append(cur)
                cur, acc = [], 0
        assert [list(s) for s in m0["param_shapes"]] == want, name
        lines.append(f"sub-groups split where the summed ceil(numel/ws) reaches {spec['sub_group_size']}: "
                     f"{[len(g) for g in want]} params")
    if ck.stage == 3:
        kinds = {m0["module"][k].dtype for k in module_names}
        lines.append(f"zero3 placeholders: {sorted(kinds)}")
    return lines


def dump(name):
    ck = Checkpoint(os.path.join(FIXTURES, name))

    def show(o, ind="  ", depth=0):
        if isinstance(o, dict):
            print(f"{type(o).__name__}({len(o)})")
            for k, v in o.items():
                print(f"{ind * (depth + 1)}{k!r}: ", end="")
                show(v, ind, depth + 1)
        elif isinstance(o, (list, tuple)) and not isinstance(o, TorchSize) and o and \
                any(isinstance(x, (dict, list, Tensor)) for x in o):
            print(f"{type(o).__name__}[{len(o)}]")
            for i, v in enumerate(o):
                print(f"{ind * (depth + 1)}[{i}] ", end="")
                show(v, ind, depth + 1)
        else:
            s = repr(o)
            print(s if len(s) < 160 else s[:157] + "...")

    for a in ck.models + ck.optim:
        print(f"== {os.path.relpath(a.path, FIXTURES)} (protocol {a.protocol()}, root {a.root})")
        print(f"   globals: {a.globals}")
        print(f"   records: {a.records}")
        show(a.obj)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", help="print the object graphs of one case")
    ap.add_argument("--layout", action="store_true", help="also check and print the partition layout")
    ap.add_argument("--root", help="the folder of the cases (default tests/fixtures/deepspeed; "
                                   "e.g. tests/fixtures/matrix/deepspeed-0.16.9)")
    ap.add_argument("cases", nargs="*")
    a = ap.parse_args()
    if a.root:
        global FIXTURES
        FIXTURES = os.path.abspath(a.root)
    if a.dump:
        dump(a.dump)
        return 0
    names = a.cases or sorted(d for d in os.listdir(FIXTURES) if os.path.isdir(os.path.join(FIXTURES, d)))
    for n in names:
        print(f"{n}: " + "; ".join(check_case(n)), flush=True)
        if a.layout:
            for line in layout_checks(n) + order_checks(n):
                print("    " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
