#!/usr/bin/env python3
"""The framework version matrix (issue #21): DeepSpeed, megatron-core and verl releases other than
the pinned ones write a few of their fixtures again, into tests/fixtures/matrix/<cell>/.

    python3 tests/gen/framework_matrix.py --list              # the cells and their pins
    python3 tests/gen/framework_matrix.py deepspeed-0.16.9    # (re)write one cell
    python3 tests/gen/framework_matrix.py all                 # every cell

For each cell: a venv ~/.cache/ckfs/<cell>-venv with the cell's pinned packages (made once;
torch's wheels are looked for in ~/.cache/ckfs/wheels first, where tests/gen/torch_matrix.py
keeps them, then fetched from the package registry), then the cell's generators run in it with
--version-matrix, each printing where it writes; the time each took is printed at the end.
verl cells instead use the venv of tests/setup-venv.sh ($CKFS_VENV, default ~/.cache/ckfs/venv)
with the release installed --no-deps into ~/.cache/ckfs/<cell>-overlay, first on PYTHONPATH.
Needs python3 with venv and pip, and the cell's Python (python3.11, python3.12: on PATH, or
~/.pyenv/versions/3.12.*).

The generators' --version-matrix option is documented in each of them:
  make_deepspeed_fixtures.py   MATRIX_CASES -> matrix/deepspeed-<version>/<case>/, with that
                               release's zero_to_fp32 and the live fp32 masters as oracles
  make_megatron_fixtures.py    MATRIX_CASES -> matrix/megatron-core-<version>/megatron/<case>/
  make_mcore_dist_fixtures.py  MATRIX_CASES -> matrix/megatron-core-<version>/mcore_dist/<case>/
The megatron-core-0.19.2 cell also runs make_megatron_frontier_fixtures.py (no option): MLA and
MTP need that release, so its fixtures (tests/fixtures/megatron_frontier/) are written there only.
  make_fixtures.py             MATRIX_CONFIGS -> matrix/verl-<version>/{fsdp,original,expected}/,
                               saved by that verl's FSDPCheckpointManager, merged by its merger
tests/unit/test_framework_matrix.c reads every cell (and fails on one it does not list).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEN = os.path.join(REPO, "tests", "gen")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_cache import CACHE, cached  # noqa: E402

WHEELS = os.path.join(CACHE, "wheels")

# pip steps per cell, in order; "--no-deps" / "--no-build-isolation" apply to their step.
# DeepSpeed is an sdist whose setup.py imports torch: built without isolation after torch.
CELLS = {
    "deepspeed-0.16.9": dict(
        python="python3.11",
        steps=[
            ["torch==2.6.0", "numpy==2.2.6", "safetensors==0.7.0", "setuptools", "wheel"],
            ["--no-build-isolation", "deepspeed==0.16.9", "transformers==4.57.6",
             "huggingface_hub==0.36.2", "tokenizers==0.22.2", "hjson==3.1.0", "ninja==1.13.2",
             "py-cpuinfo==9.0.0", "einops==0.8.2", "msgpack==1.2.4", "psutil==7.2.2",
             "pydantic==2.14.4", "tqdm==4.70.1", "packaging==25.0"],
        ],
        env={"DS_ACCELERATOR": "cpu"},
        generators=[["make_deepspeed_fixtures.py", "--version-matrix"]],
    ),
    "megatron-core-0.14.0": dict(
        python="python3.11",
        steps=[
            # psutil: megatron-core's async checkpoint writer needs it (not among its requirements)
            ["torch==2.6.0", "numpy==1.26.4", "safetensors==0.7.0", "transformers==4.57.6",
             "huggingface_hub==0.36.2", "tokenizers==0.22.2", "packaging==25.0", "psutil==7.2.2"],
            ["--no-deps", "megatron-core==0.14.0"],
        ],
        env={},
        generators=[["make_megatron_fixtures.py", "--version-matrix"],
                    ["make_mcore_dist_fixtures.py", "--version-matrix"]],
    ),
    "megatron-core-0.19.2": dict(
        python="python3.12",  # megatron-core 0.19 requires Python >= 3.12 and torch >= 2.6
        steps=[
            ["torch==2.8.0", "numpy==2.2.6", "safetensors==0.7.0", "transformers==5.10.4",
             "huggingface_hub==1.33.0", "tokenizers==0.22.2", "packaging==25.0", "psutil==7.2.2"],
            ["--no-deps", "megatron-core==0.19.2"],
        ],
        env={},
        generators=[["make_megatron_fixtures.py", "--version-matrix"],
                    ["make_mcore_dist_fixtures.py", "--version-matrix"],
                    # MLA, DeepSeek/GLM shared experts, MTP: tests/fixtures/megatron_frontier/
                    ["make_megatron_frontier_fixtures.py"]],
    ),
}

# verl releases: the venv of tests/setup-venv.sh (torch 2.8.0; verl 0.9.1's dependencies) with the
# release's own code and transformers 4.57.6 (verl 0.5-0.8 do not import, or wrap a model, with
# transformers 5) installed --no-deps into an overlay folder put first on PYTHONPATH; with it
# huggingface_hub < 1 (transformers 4 checks it), and datasets 4.8.5 (5.x imports what only
# huggingface_hub 1.x has; verl >= 0.6 imports datasets with its checkpoint manager).
VERL_OVERLAY = ["transformers==4.57.6", "huggingface_hub==0.36.2", "datasets==4.8.5"]
for _v in ("0.5.0", "0.6.1", "0.7.1", "0.8.0"):
    CELLS[f"verl-{_v}"] = dict(overlay=[f"verl=={_v}"] + VERL_OVERLAY, env={},
                               generators=[["make_fixtures.py", "--version-matrix"]])


def project_venv():
    venv = os.environ.get("CKFS_VENV", os.path.join(CACHE, "venv"))
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        sys.exit(f"framework_matrix: no venv at {venv}: run tests/setup-venv.sh (CKFS_VENV={venv})")
    return py


def overlay_of(cell):
    """(python, overlay folder) of a verl cell, the overlay installed once."""
    py = project_venv()
    spec = CELLS[cell]

    def build(over):
        print(f"framework_matrix: {cell}: pip install --target {over} --no-deps {' '.join(spec['overlay'])}",
              flush=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--target", over] + spec["overlay"], check=True)

    return py, cached(os.path.join(CACHE, f"{cell}-overlay"), repr(spec["overlay"]), build)


def find_python(name):
    """name (python3.12) on PATH if it runs, else pyenv's copy of it."""
    import glob

    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    cands = [shutil.which(name)] + sorted(glob.glob(os.path.join(root, "versions", name[6:] + ".*", "bin", name)))
    for c in cands:
        if c and subprocess.run([c, "-c", "import venv"], capture_output=True).returncode == 0:
            return c
    return None


def venv_of(cell):
    spec = CELLS[cell]
    base = find_python(spec["python"])
    if not base:
        sys.exit(f"framework_matrix: {cell} needs {spec['python']} on PATH")

    def build(venv):
        subprocess.run([base, "-m", "venv", venv], check=True)
        for step in spec["steps"]:
            cmd = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q",
                   "--disable-pip-version-check"]
            if os.path.isdir(WHEELS):
                cmd += ["--find-links", WHEELS]
            print(f"framework_matrix: {cell}: pip install {' '.join(step)}", flush=True)
            subprocess.run(cmd + step, check=True)

    venv = cached(os.path.join(CACHE, f"{cell}-venv"), repr(spec["steps"]), build)
    return os.path.join(venv, "bin", "python")


def run_cell(cell):
    spec = CELLS[cell]
    env = dict(os.environ, **spec["env"])
    if "overlay" in spec:
        py, over = overlay_of(cell)
        env["PYTHONPATH"] = over
    else:
        py = venv_of(cell)
        # DeepSpeed builds its CPU op into the extensions folder: one per venv, not shared
        # across torch releases
        env["TORCH_EXTENSIONS_DIR"] = os.path.join(os.path.dirname(os.path.dirname(py)), "torch_extensions")
    times = []
    for gen in spec["generators"]:
        t0 = time.monotonic()
        subprocess.run(["nice", "-n", "10", py, os.path.join(GEN, gen[0])] + gen[1:], check=True, cwd=REPO,
                       env=env)
        times.append((gen[0], time.monotonic() - t0))
    return times


def main():
    args = sys.argv[1:]
    if not args or args == ["--list"]:
        for cell, spec in CELLS.items():
            if "overlay" in spec:
                print(f"{cell:24} the tests/setup-venv.sh venv + --no-deps overlay: {' '.join(spec['overlay'])}")
            else:
                print(f"{cell:24} {spec['python']}: " + " | ".join(" ".join(s) for s in spec["steps"]))
        return 0
    cells = list(CELLS) if args == ["all"] else args
    unknown = [c for c in cells if c not in CELLS]
    if unknown:
        sys.exit(f"framework_matrix: unknown cell(s) {unknown}; --list shows them")
    report = []
    for cell in cells:
        report += [(cell, g, t) for g, t in run_cell(cell)]
    for cell, g, t in report:
        print(f"framework_matrix: {cell}: {g} {t:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
