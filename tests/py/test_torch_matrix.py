"""The torch version matrix through the CLI and real readers (tests/gen/torch_matrix.py).

Every cell any torch release from 2.4 on could write (tests/fixtures/matrix/torch-*/) is
exported by `ckfs export`, in its stored dtype and in bf16, and read back with safetensors:
the tensors must equal the weights the cell was cut from, and bf16 must equal torch's own
`.to(torch.bfloat16)` of them. tests/unit/test_torch_matrix.c checks the same cells through
the library; this is the command users run.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import FIXTURES, run_ckfs

MATRIX = FIXTURES / "matrix"


def cells():
    for rel in sorted(MATRIX.glob("torch-*")):
        record = json.loads((rel / "cells.json").read_text())
        for cell, rec in record["cells"].items():
            if "cannot" not in rec:
                yield pytest.param(rel, cell, rec["truth"], id=f"{rel.name}-{cell}")


def test_every_release_present():
    releases = [p.name for p in MATRIX.glob("torch-*")]
    assert len(releases) >= 12, releases


@pytest.mark.parametrize("rel,cell,truth", list(cells()))
def test_export_equals_original(tmp_path, rel, cell, truth):
    want = load_file(str(rel / truth / "model.safetensors"))
    for dtype in ("auto", "bf16"):
        out = tmp_path / dtype
        run_ckfs("export", rel / cell, out, "--dtype", dtype)
        got = load_file(str(out / "model.safetensors"))
        assert sorted(got) == sorted(want)
        for name, t in want.items():
            ref = t if dtype == "auto" else t.to(torch.bfloat16)
            assert got[name].dtype == ref.dtype, name
            assert torch.equal(got[name], ref), f"{rel.name} {cell} --dtype {dtype}: {name} differs"
