"""ckfs diff against torch (issue #26, item 1).

The oracle: each step's tensors rebuilt by torch from the rank files themselves (FSDP2 DTensor
shards concatenated along their Shard dim, plain tensors from rank 0; a LoRA actor's keys named
as verl's merger names them), then the statistics computed by torch in float64:
max |B - A|, ||B - A|| / ||A||, A.B / (||A|| ||B||), the changed elements, byte identity; per
layer and in total from the same tensors. ckfs diff's figures must agree within float64
accumulation noise (its order: 8 interleaved lanes per window, docs/formats.md "ckfs diff");
identity, counts and maxima exactly. Megatron rank files are not rebuilt here: the Megatron run
is compared against torch on `ckfs export --dtype auto` of each step, whose values
test_megatron.py checks against the original weights.

Every pair of consecutive steps of every run fixture is compared: the verl LoRA run (base
frozen), the verl FSDP run with frozen layers, the plain runs (everything changes) and the
Megatron run; then --dtype bf16 against torch's cast, a checkpoint against verl's own merger
output, names and shapes on one side only, and the SVG.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, run_ckfs
from safetensors.torch import load_file

HISTORY = FIXTURES / "history"
RUNS = [HISTORY / "lora_run", HISTORY / "frozen_run", FIXTURES / "run" / "fsdp_ppo",
        FIXTURES / "run" / "fsdp_grpo", FIXTURES / "run" / "megatron"]
MANIFEST = json.loads((FIXTURES / "MANIFEST_history.json").read_text())
RTOL = 1e-9  # float64 sums in another order: ~1e-15 relative here


# ------------------------------------------------------------------------------------------
# The oracle's tensors
# ------------------------------------------------------------------------------------------
def rank_files(role: Path):
    files = sorted(role.glob("model_world_size_*_rank_*.pt"),
                   key=lambda p: int(re.search(r"rank_(\d+)", p.name).group(1)))
    return [torch.load(f, map_location="cpu", weights_only=False) for f in files]


def merged_names(key: str):
    """verl's merger's name for a rank-file key: (folder path, served name)."""
    if key.startswith("base_model.model."):
        if ".lora_" in key:
            return "lora_adapter/" + key.replace(".default", "")
        return key[len("base_model.model."):].replace(".base_layer.", ".")
    return key


def recombine(role: Path) -> dict[str, torch.Tensor]:
    """fp32 (as stored) tensors of an FSDP role folder, named as ckfs serves them."""
    from torch.distributed.tensor import DTensor

    sds = rank_files(role)
    out = {}
    for k, v in sds[0].items():
        if isinstance(v, DTensor):
            (pl,) = v.placements
            t = (torch.cat([sd[k]._local_tensor for sd in sds], dim=pl.dim) if pl.is_shard()
                 else v._local_tensor)
        else:
            t = v
        out[merged_names(k)] = t.detach().clone().contiguous()
    return out


def step_tensors(role: Path, tmp: Path) -> dict[str, torch.Tensor]:
    if list(role.glob("model_world_size_*_rank_*.pt")):
        return recombine(role)
    out = tmp / (role.parent.name + "_" + role.name)  # Megatron: ckfs export, checked elsewhere
    if not out.exists():
        run_ckfs("export", "-q", "--dtype", "auto", role, out)
    return load_file(str(out / "model.safetensors"))


# ------------------------------------------------------------------------------------------
# The oracle's statistics
# ------------------------------------------------------------------------------------------
def sums(a: torch.Tensor, b: torch.Tensor):
    x, y = a.double().flatten(), b.double().flatten()
    d = y - x
    return dict(numel=x.numel(), changed=int(((x != y) & ~(x.isnan() & y.isnan())).sum()),
                max_abs=float(d.abs().max()) if x.numel() else 0.0,
                a2=float((x * x).sum()), b2=float((y * y).sum()), d2=float((d * d).sum()),
                dot=float((x * y).sum()),
                identical=a.dtype == b.dtype and torch.equal(a.view(torch.uint8) if a.dtype != torch.bool else a,
                                                             b.view(torch.uint8) if b.dtype != torch.bool else b))


def rel(s):
    if s["a2"] == 0:
        return 0.0 if s["d2"] == 0 else math.inf
    return math.sqrt(s["d2"]) / math.sqrt(s["a2"])


def cosine(s):
    return s["dot"] / (math.sqrt(s["a2"]) * math.sqrt(s["b2"])) if s["a2"] and s["b2"] else math.nan


def layer_of(name: str) -> str:
    s = name.removeprefix("lora_adapter/").removeprefix("base_model.model.")
    parts = s.split(".")
    for i, p in enumerate(parts):
        if i and p.isdigit():
            return ".".join(parts[:i + 1])
    return ".".join(parts[:-1]) if len(parts) > 1 else s


def close(got, want, what):
    if want is None or (isinstance(want, float) and (math.isnan(want) or math.isinf(want))):
        assert got is None, f"{what}: ckfs {got}, torch {want}"  # JSON null
        return
    assert got == pytest.approx(want, rel=RTOL, abs=1e-300), f"{what}: ckfs {got!r}, torch {want!r}"


def check_pair(pair: dict, A: dict, B: dict, label: str):
    by_name = {t["name"]: t for t in pair["tensors"]}
    assert set(by_name) == set(A) | set(B), label
    layers, total = {}, dict(a2=0.0, d2=0.0)
    for name, t in by_name.items():
        what = f"{label} {name}"
        if name not in B:
            assert t["status"] == "only in A", what
            continue
        if name not in A:
            assert t["status"] == "only in B", what
            continue
        a, b = A[name], B[name]
        if a.shape != b.shape:
            assert t["status"] == "shape differs", what
            continue
        s = sums(a, b)
        assert t["status"] == ("identical" if s["identical"] else "changed"), what
        assert t["numel"] == s["numel"] and t["changed_elements"] == s["changed"], what
        assert t["max_abs_diff"] == s["max_abs"], what  # exact: a difference of floats in double
        close(t["rel_l2"], rel(s), what + " rel_l2")
        close(t["cosine"], cosine(s), what + " cosine")
        close(t["norm_a"], math.sqrt(s["a2"]), what + " norm_a")
        assert t["layer"] == layer_of(name), what
        g = layers.setdefault(t["layer"], dict(a2=0.0, d2=0.0, changed=0))
        for k in ("a2", "d2"):
            g[k] += s[k]
            total[k] += s[k]
        g["changed"] += not s["identical"]
    for g in pair["layers"]:
        want = layers.get(g["name"])
        if want is None:
            continue
        assert g["changed"] == want["changed"], f"{label} layer {g['name']}"
        close(g["rel_l2"], rel(want), f"{label} layer {g['name']} rel_l2")
    close(pair["total"]["rel_l2"], rel(total), f"{label} total rel_l2")


def run_json(run: Path, *extra):
    return json.loads(run_ckfs("diff", "--json", *extra, run).stdout)


@pytest.mark.parametrize("run", RUNS, ids=[f"{r.parent.name}/{r.name}" for r in RUNS])
def test_run_pairs_agree_with_torch(run, tmp_path):
    """Every pair of consecutive steps of every role, as `ckfs diff RUN --json` reports it."""
    got = run_json(run)
    pairs = 0
    for role in got["roles"]:
        for pair in role["pairs"]:
            ra = run / f"global_step_{int(pair['a_step'])}" / role["role"]
            rb = run / f"global_step_{int(pair['b_step'])}" / role["role"]
            if "absent" in pair:
                assert not (ra if pair["absent"] == "a" else rb).exists()
                continue
            check_pair(pair, step_tensors(ra, tmp_path), step_tensors(rb, tmp_path),
                       f"{run.name} {role['role']} {pair['a_step']}->{pair['b_step']}")
            pairs += 1
    assert pairs >= 1


def test_frozen_tensors_identical_trained_changed():
    """What the generator froze is identical byte for byte; what it trained changed."""
    got = run_json(HISTORY / "frozen_run")
    trainable = set(MANIFEST["runs"]["frozen_run"]["trainable"])
    for pair in got["roles"][0]["pairs"]:
        for t in pair["tensors"]:
            assert t["status"] == ("changed" if t["name"] in trainable else "identical"), t["name"]


def test_lora_base_identical_adapter_changed():
    got = run_json(HISTORY / "lora_run")
    for pair in got["roles"][0]["pairs"]:
        for t in pair["tensors"]:
            adapter = t["name"].startswith("lora_adapter/")
            assert t["status"] == ("changed" if adapter else "identical"), t["name"]
        assert pair["total"]["identical"] > 0 and pair["total"]["changed"] > 0


def test_bf16_against_torch_cast(tmp_path):
    """--dtype bf16: the values compared are the served bf16 ones, as torch's .to(bfloat16)."""
    ra, rb = (HISTORY / "frozen_run" / f"global_step_{s}" / "actor" for s in (1, 3))
    got = json.loads(run_ckfs("diff", "--json", "--dtype", "bf16", ra, rb).stdout)
    A = {k: v.to(torch.bfloat16) for k, v in recombine(ra).items()}
    B = {k: v.to(torch.bfloat16) for k, v in recombine(rb).items()}
    check_pair(got, A, B, "bf16")
    assert all(t["dtype_a"] == "BF16" for t in got["tensors"])


def test_fused_lora_against_torch(tmp_path):
    """--lora fuse: the fused weights change where the adapter does; torch fuses with peft's rule."""
    ra, rb = (HISTORY / "lora_run" / f"global_step_{s}" / "actor" for s in (1, 4))
    got = json.loads(run_ckfs("diff", "--json", "--lora", "fuse", ra, rb).stdout)
    meta = MANIFEST["runs"]["lora_run"]["lora"]
    scale = meta["lora_alpha"] / meta["r"]

    def fused(role):
        sd = recombine(role)
        out = {k: v for k, v in sd.items() if not k.startswith("lora_adapter/")}
        for k in [k for k in sd if k.endswith(".lora_A.weight")]:
            base = k.removeprefix("lora_adapter/base_model.model.").replace(".lora_A.weight", ".weight")
            A, B = sd[k], sd[k.replace("lora_A", "lora_B")]
            out[base] = out[base] + scale * (B @ A)
        return out

    A, B = fused(ra), fused(rb)
    # peft's merge is fp32 B @ A; ckfs fuses bit for bit as peft does (test_lora_vlm), so the
    # figures are those of the same fp32 tensors
    by_name = {t["name"]: t for t in got["tensors"]}
    for name in A:
        s = sums(A[name], B[name])
        assert by_name[name]["status"] == ("identical" if s["identical"] else "changed"), name
        close(by_name[name]["rel_l2"], rel(s), name)
    assert not any(n.startswith("lora_adapter/") for n in by_name)


def test_checkpoint_against_merger_output():
    """A checkpoint and verl's merger output of it: identical as bf16 (what the merger writes)."""
    ck, ex = FIXTURES / "fsdp" / "qwen2_fsdp2_w3", FIXTURES / "expected" / "qwen2_fsdp2_w3"
    got = json.loads(run_ckfs("diff", "--json", "--dtype", "bf16", ck, ex).stdout)
    assert got["total"]["tensors"] > 0 and got["total"]["identical"] == got["total"]["tensors"]
    got = json.loads(run_ckfs("diff", "--json", ck, ex).stdout)  # auto: fp32 against bf16
    for t in got["tensors"]:
        assert t["status"] == "changed" and (t["dtype_a"], t["dtype_b"]) == ("F32", "BF16"), t["name"]
        assert t["max_abs_diff"] > 0 or t["changed_elements"] == 0


def test_one_side_only_and_shapes():
    """Two different models: names on one side are listed, shapes that differ are not compared."""
    a, b = FIXTURES / "fsdp" / "qwen2_fsdp2_w3", FIXTURES / "fsdp" / "llama_tied_fsdp2_w4"
    got = json.loads(run_ckfs("diff", "--json", a, b).stdout)
    sa = load_file(str(FIXTURES / "expected" / "qwen2_fsdp2_w3" / "model.safetensors"))
    sb = load_file(str(FIXTURES / "expected" / "llama_tied_fsdp2_w4" / "model.safetensors"))
    by = {t["name"]: t for t in got["tensors"]}
    assert set(by) == set(sa) | set(sb)
    kinds = set()
    for n, t in by.items():
        want = ("only in A" if n not in sb else "only in B" if n not in sa else
                "shape differs" if sa[n].shape != sb[n].shape else None)
        if want:
            assert t["status"] == want, n
            assert "rel_l2" not in t
            kinds.add(want)
    assert {"only in A", "shape differs"} <= kinds, kinds


def test_threads_do_not_change_figures():
    run = HISTORY / "frozen_run"
    one = run_json(run, "--threads", "1")
    many = run_json(run, "--threads", "7")
    for x in (one, many):
        for role in x["roles"]:
            for p in role["pairs"]:
                p.pop("seconds")
    assert one == many


def test_svg(tmp_path):
    svg = tmp_path / "history.svg"
    run_ckfs("diff", "--svg", svg, HISTORY / "lora_run")
    root = ET.parse(svg).getroot()  # well-formed XML
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == ns + "svg"
    titles = [t.text for t in root.iter(ns + "title")]
    # one cell per layer row per pair of steps: 5 rows x 3 pairs
    assert len(titles) == 15, titles
    assert sum("identical" in t for t in titles) == 9  # embeddings, norm, lm_head
    assert sum("changed" in t for t in titles) == 6    # the two layers holding adapters
    assert len(list(root.iter(ns + "polyline"))) >= 2  # attention and mlp at least
    assert not list(tmp_path.glob("*.ckfs-tmp-*"))


def test_refusals(tmp_path):
    p = subprocess.run([run_ckfs.__globals__["ckfs_bin"](), "diff", FIXTURES / "run" / "fsdp_ppo",
                        FIXTURES / "fsdp" / "qwen2_fsdp2_w3"], capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "a training run" in p.stderr
    p = subprocess.run([run_ckfs.__globals__["ckfs_bin"](), "diff", "--svg", tmp_path / "no" / "x.svg",
                        HISTORY / "lora_run"], capture_output=True, text=True)
    assert p.returncode == 1 and "cannot create" in p.stderr and p.stderr.count("\n") == 1
