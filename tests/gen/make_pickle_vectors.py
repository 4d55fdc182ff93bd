#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write the pickle test vectors used by tests/unit/test_pickle.c.

tests/fixtures/pickle/*.pkl are made by CPython's own pickler (and by torch
for the torch_* / dcp_* files); tests/corpus/pickle/*.pkl are hand-crafted
broken or edge-case streams. The expected trees and error messages are
written in C, in test_pickle.c, so a regenerated file that changes shape
makes the test fail rather than silently updating expectations.

Run from the repository root:

    /work/venvtest/v/bin/python tests/gen/make_pickle_vectors.py

Without torch the torch/DCP fixtures are left as they are. The checked-in
files were made with CPython 3.11 and torch 2.8: Python >= 3.12 pickles Enum
members as getattr(cls, name) instead of cls(value), and the DCP metadata
holds a random save_id, so regenerating may change bytes (not the shapes the
C test checks, except for the Enum member in objects_p*.pkl).
"""

import argparse
import collections
import enum
import io
import math
import os
import pickle
import struct
import sys
import tempfile
import warnings
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "pickle")
CORPUS = os.path.join(ROOT, "tests", "corpus", "pickle")


# ---- classes pickled by reference (module __main__) -----------------------

class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self):
        self.a = 1
        self.b = 2


class Outer:
    class Inner:
        def __init__(self):
            self.v = 7


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Shape(enum.Enum):
    """Pickles its members the way Python >= 3.12 pickles every Enum member."""
    CIRCLE = 1

    def __reduce_ex__(self, proto):
        return getattr, (self.__class__, self._name_)


class KwNew:
    """__getnewargs_ex__: NEWOBJ_EX under protocol 4, functools.partial below."""

    def __new__(cls, *args, **kwargs):
        return super().__new__(cls)

    def __getnewargs_ex__(self):
        return (1,), {"k": 2}


def make_thing(a, b):
    return None


class Reduced:
    def __reduce__(self):
        return make_thing, (1, 2), {"s": 3}


# ---- valid vectors --------------------------------------------------------

def plain_data():
    shared = [1, 2]
    return {
        "none": None,
        "true": True,
        "false": False,
        "ints": [0, 1, 255, 256, 65535, 65536, -1, -256, 2**31 - 1, -2**31,
                 2**31, -2**31 - 1, 2**63 - 1, -2**63],
        "big": [2**63, -2**63 - 1, 2**64, -(10**30), 2**2100],
        "floats": [0.0, -0.0, 1.5, -2.25e-300, 1e308, math.inf, -math.inf,
                   math.nan, math.pi],
        "str": ["", "hello", "h\u00e9llo \u2713 \u65e5\u672c \U0001f642",
                "a\x00b"],
        "bytes": [b"", b"abc", b"\x00\x7f\x80\xff"],
        "bytearray": [bytearray(b"\x00xy\xff"), bytearray()],
        "tuples": [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)],
        "set": {1, 2, 3},
        "frozenset": frozenset({4, 5}),
        "empty_set": set(),
        "nested": {"a": {"b": [1, [2, (3, {"c": None})]]}},
        "shared_a": shared,
        "shared_b": shared,
        "keys": {1: "one", -2: "minus two", (1, 2): "pair", None: "none"},
    }


def objects():
    return [
        Point(1, "x"),
        Slotted(),
        Outer.Inner(),
        Color.RED,
        Shape.CIRCLE,
        KwNew(),
        Reduced(),
        collections.OrderedDict([("x", 1), ("y", [2])]),
    ]


def self_referencing_list():
    lst = [1]
    lst.append(lst)
    return lst


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    print(f"{os.path.relpath(path, ROOT)}: {len(data)} bytes")


def pure_vectors():
    for proto in (2, 3, 4, 5):
        write(os.path.join(FIXTURES, f"plain_p{proto}.pkl"),
              pickle.dumps(plain_data(), protocol=proto))
    for proto in (2, 4):
        write(os.path.join(FIXTURES, f"objects_p{proto}.pkl"),
              pickle.dumps(objects(), protocol=proto))
    write(os.path.join(FIXTURES, "self_ref_list_p2.pkl"),
          pickle.dumps(self_referencing_list(), protocol=2))
    obj = Point(0, 0)
    obj.y = obj
    write(os.path.join(FIXTURES, "self_ref_object_p4.pkl"),
          pickle.dumps(obj, protocol=4))


def data_pkl(obj):
    buf = io.BytesIO()
    import torch
    torch.save(obj, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        return z.read("archive/data.pkl")


def torch_vectors():
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("torch not importable: torch/DCP fixtures left as they are")
        return
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    write(os.path.join(FIXTURES, "torch_state_dict.pkl"),
          data_pkl(model.state_dict()))

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store",
                                rank=0, world_size=1)
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import Shard, distribute_tensor
            import torch.distributed.checkpoint as dcp

            mesh = init_device_mesh("cpu", (1,))
            dt = distribute_tensor(torch.arange(4, dtype=torch.float32),
                                   mesh, [Shard(0)])
            write(os.path.join(FIXTURES, "torch_dtensor.pkl"),
                  data_pkl({"w": dt}))

            cwd = os.getcwd()
            os.chdir(tmp)  # checkpoint_id is pickled: keep it relative
            try:
                dcp.save({"w": torch.arange(6, dtype=torch.float32)
                          .reshape(2, 3), "step": 5}, checkpoint_id="dcp")
            finally:
                os.chdir(cwd)
            with open(os.path.join(tmp, "dcp", ".metadata"), "rb") as f:
                write(os.path.join(FIXTURES, "dcp_metadata.pkl"), f.read())
        finally:
            dist.destroy_process_group()


# ---- hand-crafted corpus --------------------------------------------------

P2 = b"\x80\x02"


def u32(n):
    return struct.pack("<I", n)


def u64(n):
    return struct.pack("<Q", n)


def uni(s):
    b = s.encode()
    return b"X" + u32(len(b)) + b


def corpus():
    c = {}
    c["empty"] = b""
    c["no_stop"] = P2 + b"N"
    c["trunc_proto"] = b"\x80"
    c["trunc_binint"] = P2 + b"J\x01\x02"
    c["trunc_binint2"] = P2 + b"M\x01"
    c["trunc_binfloat"] = P2 + b"G\x3f\xf0\x00"
    c["trunc_long1"] = P2 + b"\x8a\x05\x01\x02"
    c["trunc_long4"] = P2 + b"\x8b\x09\x00\x00"
    c["trunc_binunicode"] = P2 + b"X\x05\x00\x00\x00ab"
    c["trunc_short_binbytes"] = P2 + b"C\x04ab"
    c["trunc_binput"] = P2 + b"Nq"
    c["trunc_long_binget"] = P2 + b"Nq\x00j\x00\x00"
    c["trunc_global"] = P2 + b"ctorch\nSi"
    c["trunc_frame"] = b"\x80\x04\x95" + u64(100) + b"N."
    c["huge_binunicode"] = P2 + b"X\xff\xff\xff\xffabc"
    c["huge_binunicode8"] = b"\x80\x04\x8d" + u64(1 << 63) + b"abc"
    c["unknown_opcode"] = P2 + b"\xff."
    c["text_int"] = b"I42\n."
    c["text_list"] = P2 + b"(l."
    c["ext1"] = P2 + b"\x82\x01."
    c["next_buffer"] = b"\x80\x05\x97."
    c["proto6"] = b"\x80\x06N."
    c["memo_out_of_range"] = P2 + b"K\x01q\x00h\x09."
    c["memo_get_empty"] = P2 + b"j\x00\x00\x00\x00."
    c["huge_long_binput"] = P2 + b"Nr\xff\xff\xff\xff."
    c["underflow_reduce"] = P2 + b")R."
    c["underflow_reduce_mark"] = P2 + b"c__builtin__\nset\n()R."
    c["underflow_tuple3"] = P2 + b"K\x01K\x02\x87."
    c["underflow_setitem"] = P2 + b"}K\x01s."
    c["underflow_appends"] = P2 + b"(K\x01e."
    c["pop_mark_no_mark"] = P2 + b"N1."
    c["stop_empty"] = P2 + b"."
    c["stop_after_mark"] = P2 + b"N(."
    c["build_on_int"] = P2 + b"K\x01}b."
    c["setitems_odd"] = P2 + b"}(K\x01K\x02K\x03u."
    c["setitems_on_call"] = (P2 + b"cmod\nFactory\n)R(" + uni("k") +
                             b"K\x01u.")
    c["append_on_tuple"] = P2 + b")K\x01a."
    c["self_append"] = P2 + b"]q\x00h\x00a."
    c["nesting_bomb"] = P2 + b"]" * 300 + b"a" * 299 + b"."
    c["mark_bomb"] = P2 + b"(" * 5000 + b"."
    c["reduce_args_list"] = P2 + b"cmod\nf\n]R."
    c["stack_global_int"] = b"\x80\x04K\x01K\x02\x93."
    c["latin1_above_ff"] = (P2 + b"c_codecs\nencode\n" + uni("\u0100") +
                            uni("latin1") + b"\x86R.")
    c["negative_binstring"] = P2 + b"T\xff\xff\xff\xff."
    c["negative_long4"] = P2 + b"\x8b\xff\xff\xff\xff."
    c["global_nul"] = P2 + b"ctor\x00ch\nSize\n."
    # Valid hand-crafted streams: py2 strings, sparse memo, trailing bytes.
    c["ok_binstring"] = (P2 + b"(U\x03abcT\x02\x00\x00\x00de\x8c\x00"
                         b"t.")
    c["ok_sparse_memo"] = (P2 + b"K\x07r\xff\xff\xff\x000K\x08r\x00\x00\x80"
                           b"\x000j\xff\xff\xff\x00j\x00\x00\x80\x00\x86.")
    c["ok_trailing"] = P2 + b"K\x05.garbage\xff"
    c["ok_pop_bare_mark"] = P2 + b"K\x01(0."
    c["ok_dup_key_replace"] = (P2 + b"}(" + uni("a") + b"K\x01" + uni("b") +
                               b"K\x02" + uni("a") + b"K\x03u.")
    c["ok_frame_long1"] = (b"\x80\x04\x95" + u64(15) + b"\x8a\x00"
                           b"\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\xff"
                           b"\x86.")
    return c


def write_corpus():
    for name, data in corpus().items():
        write(os.path.join(CORPUS, name + ".pkl"), data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-torch", action="store_true",
                    help="skip the torch and DCP fixtures")
    args = ap.parse_args()
    sys.setrecursionlimit(10000)
    pure_vectors()
    if not args.no_torch:
        torch_vectors()
    write_corpus()


if __name__ == "__main__":
    main()
