#!/usr/bin/env python3
"""The torch version matrix: one folder of real checkpoints per torch release.

    python3 tests/gen/torch_matrix.py missing          # releases on the registry not in the matrix
    python3 tests/gen/torch_matrix.py update           # write the cells of those releases
    python3 tests/gen/torch_matrix.py generate 2.13.0  # (re)write one release's cells

For each release: a venv of its own (~/.cache/ckfs/matrix-venv.*) with that torch and safetensors only,
its wheels kept in ~/.cache/ckfs/wheels so a second run downloads nothing, then
tests/gen/make_torch_matrix.py writes tests/fixtures/matrix/torch-<version>/; the venv is
removed after each release, so the disk holds one at a time (~4-5 GB with torch's CUDA
libraries, which `import torch` loads even on a CPU-only machine). The matrix covers the newest
patch release of every minor from MIN_RELEASE on. Needs only python3 with venv and pip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MATRIX = os.path.join(REPO, "tests", "fixtures", "matrix")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_cache import CACHE, locked, scratch_venv  # noqa: E402

WHEELS = os.path.join(CACHE, "wheels")
MIN_RELEASE = (2, 4)  # the oldest torch verl and plain FSDP2 users still run
HELPERS = ["safetensors==0.7.0", "packaging==25.0", "numpy==2.2.6"]  # the truth file's writer


def vkey(v):
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def registry_versions(package, extra=()):
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package, *extra],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"Available versions:\s*(.*)", out)
    if not m:
        raise SystemExit(f"torch_matrix: no version list from the registry for {package}")
    return [v.strip() for v in m.group(1).split(",") if re.fullmatch(r"\d+\.\d+\.\d+", v.strip())]


def wanted(versions):
    """The newest patch release of each minor from MIN_RELEASE on."""
    best = {}
    for v in versions:
        k = vkey(v)
        if k[:2] >= MIN_RELEASE and (k[:2] not in best or k > vkey(best[k[:2]])):
            best[k[:2]] = v
    return [best[k] for k in sorted(best)]


def present():
    if not os.path.isdir(MATRIX):
        return set()
    return {d[len("torch-"):] for d in os.listdir(MATRIX)
            if d.startswith("torch-") and os.path.exists(os.path.join(MATRIX, d, "cells.json"))}


def missing():
    have = present()
    return [v for v in wanted(registry_versions("torch")) if v not in have]


def run(cmd, **kw):
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def generate(version):
    t0 = time.time()
    os.makedirs(WHEELS, exist_ok=True)
    venv = scratch_venv("matrix-venv")
    pkgs = [f"torch=={version}"] + HELPERS
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "-q", "--disable-pip-version-check"]
    try:
        run([sys.executable, "-m", "venv", venv])
        with locked(WHEELS):  # one download into the shared wheels at a time
            run(pip + ["download", "-d", WHEELS, "--find-links", WHEELS] + pkgs)
        t1 = time.time()
        run(pip + ["install", "--no-index", "--find-links", WHEELS] + pkgs)
        t2 = time.time()
        out = os.path.join(MATRIX, f"torch-{version}")
        run([os.path.join(venv, "bin", "python"), os.path.join(REPO, "tests", "gen", "make_torch_matrix.py"),
             out], env=dict(os.environ, PYTHONHASHSEED="0"))
        t3 = time.time()
    finally:
        if os.environ.get("CKFS_MATRIX_KEEP_VENV") != "1":  # kept only to debug a release
            shutil.rmtree(venv, ignore_errors=True)
    print(f"torch {version}: download {t1 - t0:.0f} s, install {t2 - t1:.0f} s, "
          f"cells {t3 - t2:.0f} s, total {time.time() - t0:.0f} s", flush=True)


def main(argv):
    if not argv or argv[0] not in ("missing", "update", "generate"):
        raise SystemExit(__doc__)
    if argv[0] == "missing":
        for v in missing():
            print(v)
    elif argv[0] == "update":
        todo = missing()
        print("torch_matrix: " + (", ".join(todo) if todo else "nothing") + " to write", flush=True)
        for v in todo:
            generate(v)
    else:
        for v in argv[1:] or wanted(registry_versions("torch")):
            generate(v)


if __name__ == "__main__":
    main(sys.argv[1:])
