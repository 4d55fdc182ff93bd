#!/usr/bin/env python3
"""Keeping the version matrix current: one command for every package it covers.

    python3 tests/gen/version_matrix.py missing    # releases on the registry the matrix lacks
    python3 tests/gen/version_matrix.py update     # write their cells, then run the tests

It asks the package registry (pip index versions) for the releases of torch, transformers,
megatron-core, DeepSpeed and verl, compares them with tests/fixtures/matrix/, and writes what
is missing with the generator each package has:

  torch          every minor from 2.4 on, newest patch     tests/gen/torch_matrix.py
  transformers   the newest 5.x and the last 4.x           tests/gen/make_config_matrix.py
  megatron-core, deepspeed, verl
                 the newest release                        tests/gen/framework_matrix.py, with
                                                           the recipe of that package's newest
                                                           cell, the version replaced

A new cell then meets the tests: test_torch_matrix reads every torch cell by itself;
test_framework_matrix fails on a cell folder it does not list (add it there once it reads);
test_config_matrix compares a new transformers release and fails on a difference not written
down. Needs python3 with venv and pip.
"""

from __future__ import annotations

import copy
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import framework_matrix  # noqa: E402
import make_config_matrix  # noqa: E402
import torch_matrix  # noqa: E402

MATRIX = torch_matrix.MATRIX
# Releases the pinned test venv and the base fixtures cover (tests/python-requirements.txt,
# fixtures/megatron, fixtures/mcore_dist): not written again as cells.
PINNED = {"deepspeed": "0.19.8", "verl": "0.9.1", "megatron-core": "0.12.2"}


# pip lists the releases this Python can install: megatron-core 0.19 needs Python 3.12.
INDEX_ARGS = {"megatron-core": ("--python-version", "3.12", "--only-binary=:all:")}


def newest(package, major=None):
    vs = torch_matrix.registry_versions(package, INDEX_ARGS.get(package, ()))
    if major is not None:
        vs = [v for v in vs if torch_matrix.vkey(v)[0] == major]
    return max(vs, key=torch_matrix.vkey) if vs else None


def cells_of(package):
    """{version: cell name} of a framework package's cells."""
    out = {}
    for cell in framework_matrix.CELLS:
        m = re.fullmatch(re.escape(package) + r"-(\d+\.\d+\.\d+)", cell)
        if m:
            out[m.group(1)] = cell
    return out


def missing():
    """[(package, version)] the registry has and the matrix lacks."""
    todo = [("torch", v) for v in torch_matrix.missing()]
    have = {d[len("transformers-"):] for d in os.listdir(MATRIX) if d.startswith("transformers-")}
    for v in (newest("transformers"), newest("transformers", 4)):
        if v and v not in have:
            todo.append(("transformers", v))
    for package in ("megatron-core", "deepspeed", "verl"):
        v = newest(package)
        if v and v != PINNED[package] and v not in cells_of(package):
            todo.append((package, v))
    return todo


def new_cell(package, version):
    """A cell for a new release: the recipe of the package's newest cell, version replaced."""
    old_version = max(cells_of(package), key=torch_matrix.vkey)
    spec = copy.deepcopy(framework_matrix.CELLS[cells_of(package)[old_version]])
    for key in ("steps", "overlay"):
        if key in spec:
            spec[key] = [[a.replace(f"{package}=={old_version}", f"{package}=={version}") for a in s]
                         if isinstance(s, list) else s.replace(f"{package}=={old_version}",
                                                               f"{package}=={version}")
                         for s in spec[key]]
    cell = f"{package}-{version}"
    framework_matrix.CELLS[cell] = spec
    return cell


def update():
    todo = missing()
    print("version_matrix: " + (", ".join(f"{p} {v}" for p, v in todo) or "nothing") + " to write",
          flush=True)
    for package, version in todo:
        if package == "torch":
            torch_matrix.generate(version)
        elif package == "transformers":
            make_config_matrix.generate(version)
        else:
            cell = new_cell(package, version)
            framework_matrix.run_cell(cell)
            print(f"version_matrix: wrote {cell}; list it in tests/unit/test_framework_matrix.c "
                  f"once it reads, and its recipe in tests/gen/framework_matrix.py", flush=True)


def main(argv):
    if argv == ["missing"]:
        for package, version in missing():
            print(package, version)
    elif argv == ["update"]:
        update()
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
