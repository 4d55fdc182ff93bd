#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Training runs as histories: what changes between steps (issue #26).

    ~/.cache/ckfs/venv/bin/python tests/gen/make_history_fixtures.py            # tests/fixtures/history/
    ~/.cache/ckfs/venv/bin/python tests/gen/make_history_fixtures.py --only lora_run
    ~/.cache/ckfs/venv/bin/python tests/gen/make_history_fixtures.py --bench OUT --kind lora --steps 10 \
        --hidden 512 --layers 8 --vocab 32000        # a larger run for tests/bench/bench_history.sh

Outputs (tests/fixtures/history/):
    lora_run/     a verl LoRA actor saved every step: verl 0.9.1's own FSDPEngine (FSDP2, W=2,
                  tiny Qwen2, LoRA r=8 alpha=16 on attention and MLP; the base is frozen by peft)
                  runs the CPU patches of make_lora_vlm_fixtures.py, takes one real optimizer step
                  (verl's engine.optimizer_step) per training step and saves
                  global_step_<N>/actor through engine.save_checkpoint(global_step=N) for N = 1..4,
                  with checkpoint.save_contents ["model", "extra"] (no optimizer: keeps the
                  fixture small; a verl option); the tracker is written after each save as verl's
                  trainer does.
    frozen_run/   a verl FSDP run with frozen layers: the loop of make_run_fixtures.py (two gloo
                  processes, FSDP2 by verl's apply_fsdp2, real AdamW over the parameters that
                  require grad) on a 3-layer Qwen2 whose embeddings and layer 0 are frozen
                  (requires_grad_(False) before wrapping, as a script freezing its bottom layers
                  does), saved every step through verl's FSDPCheckpointManager for 3 steps,
                  tracker "3".
    MANIFEST_history.json  for each run: its steps, and the tensors that were trainable (so
                  changed) and frozen (so byte-identical from step to step), by the rank files'
                  own keys.

--bench OUT writes one larger run of either kind (--kind lora|frozen|plain; plain trains every
parameter: the worst case, everything changes) with --steps steps, for the benchmarks; sizes from
--hidden/--layers/--vocab/--intermediate.

The plain run of the tests (everything changes between steps) is tests/fixtures/run/fsdp_ppo and
fsdp_grpo (make_run_fixtures.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

# Same re-exec as make_lora_vlm_fixtures.py (fixed hash seed, no ASLR): done here, before importing it.
if os.environ.get("CKFS_GEN_REEXEC") != "1":
    env = dict(os.environ, PYTHONHASHSEED="0", CKFS_GEN_REEXEC="1")
    argv = [sys.executable] + sys.argv
    setarch = shutil.which("setarch")
    if setarch and subprocess.run([setarch, os.uname().machine, "-R", "true"],
                                  stderr=subprocess.DEVNULL).returncode == 0:
        argv = [setarch, os.uname().machine, "-R"] + argv
    os.execve(argv[0], argv, env)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_lora_vlm_fixtures as ml  # noqa: E402  (sets the environment, imports torch)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(REPO, "tests", "fixtures", "history")
TRACKER = "latest_checkpointed_iteration.txt"
WORLD = 2


def log(*a):
    print(*a, flush=True)


def qwen2_dims(hidden=32, layers=2, vocab=131, intermediate=64):
    return dict(arch="qwen2", vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2)


# --------------------------------------------------------------------------------------------
# A LoRA run: verl's own engine, saved every step
# --------------------------------------------------------------------------------------------
def lora_spec(name, dims, steps):
    spec = ml.lora_case(name, dims, "fsdp2", WORLD, False, 8, 16, ml.ATTN_MLP,
                        desc="history: verl LoRA actor saved every step")
    spec["train_steps"] = 1  # per saved step
    spec["saved_steps"] = steps
    return spec


def lora_worker(rank, spec, srcdir, run, store, infodir):
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        _lora_worker(rank, spec, srcdir, run, infodir)
    finally:
        dist.destroy_process_group()


def _lora_worker(rank, spec, srcdir, run, infodir):
    import random

    import numpy as np
    from verl.trainer.config import CheckpointConfig

    impl = ml.install_cpu_patches(spec)
    torch.manual_seed(ml.stable_seed("init", spec["name"]))
    np.random.seed(ml.stable_seed("np", spec["name"], rank))
    random.seed(ml.stable_seed("py", spec["name"], rank))
    model_cfg, engine_cfg, optim_cfg, _ = ml.engine_configs(spec, srcdir)
    ckpt_cfg = CheckpointConfig(save_contents=["model", "extra"], load_contents=["model", "extra"])
    engine = impl.FSDPEngineWithLMHead(model_cfg, engine_cfg, optim_cfg, ckpt_cfg)
    engine.initialize()
    losses = []
    for step in range(1, spec["saved_steps"] + 1):
        one = dict(spec, name=f"{spec['name']}_{step}")  # a new batch per step
        losses += ml.train_steps(engine, one, rank)
        torch.manual_seed(ml.stable_seed("rng", spec["name"], rank, step))
        engine.save_checkpoint(local_path=os.path.join(run, f"global_step_{step}", "actor"),
                               global_step=step, max_ckpt_to_keep=None)
        dist.barrier()
        if rank == 0:
            with open(os.path.join(run, TRACKER), "w") as f:  # verl's RayPPOTrainer._save_checkpoint
                f.write(str(step))
        dist.barrier()
    trainable = sorted(n for n, p in engine.module.named_parameters() if p.requires_grad)
    with open(os.path.join(infodir, f"rank{rank}.json"), "w") as f:
        json.dump(dict(losses=losses, trainable=trainable), f)


def write_lora_run(run, dims, steps, name="history_lora"):
    spec = lora_spec(name, dims, steps)
    tmp = tempfile.mkdtemp(prefix="ckfs-history-")
    try:
        srcdir = os.path.join(tmp, "src")
        os.makedirs(srcdir)
        ml.prepare_source(spec, srcdir)
        infodir = os.path.join(tmp, "info")
        os.makedirs(infodir)
        os.makedirs(run, exist_ok=True)
        mp.start_processes(lora_worker, args=(spec, srcdir, run, os.path.join(tmp, "store"), infodir),
                           nprocs=WORLD, start_method="fork", join=True)
        info = json.load(open(os.path.join(infodir, "rank0.json")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dict(kind="lora", steps=list(range(1, steps + 1)), roles=["actor"], losses_rank0=info["losses"],
                trainable=info["trainable"], lora=spec["lora"], model=dims)


# --------------------------------------------------------------------------------------------
# A run with frozen layers (or none: plain), make_run_fixtures.py's loop
# --------------------------------------------------------------------------------------------
def frozen_prefixes(kind):
    # Frozen: the embeddings and the first decoder layer (a script freezing its bottom layers).
    return ("model.embed_tokens.", "model.layers.0.") if kind == "frozen" else ()


def prepare_plain_source(dims, tmp, key):
    import transformers

    import make_fixtures as mf

    d = os.path.join(tmp, "src_actor")
    c = ml.hf_config(dict(model=dims, tied=False))
    m = transformers.Qwen2ForCausalLM(c)
    ml.fill_weights(m, key)  # seeded N(0, 0.05), norms near 1: a trained model's magnitudes
    m.config.dtype = torch.float32
    m.save_pretrained(d)
    mf.build_tokenizer().save_pretrained(d)
    return d


def plain_worker(rank, a, src, store, infodir):
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        _plain_worker(rank, a, src, infodir)
    finally:
        dist.destroy_process_group()


def _plain_worker(rank, a, src, infodir):
    from omegaconf import DictConfig
    from torch.distributed.device_mesh import init_device_mesh
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.tokenizer import hf_tokenizer
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    import make_run_fixtures as mr

    mesh = init_device_mesh("cpu", mesh_shape=(WORLD,), mesh_dim_names=("fsdp",))
    frozen = frozen_prefixes(a.kind)
    model = build_frozen(mr, src, mesh, frozen)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01)
    sched = get_constant_schedule_with_warmup(optimizer=opt, num_warmup_steps=0)
    mgr = FSDPCheckpointManager(model=model, optimizer=opt, lr_scheduler=sched, processing_class=hf_tokenizer(src),
                                checkpoint_config=DictConfig({"save_contents": ["model", "extra"],
                                                              "load_contents": ["model", "extra"]}))
    g = torch.Generator().manual_seed(4321 + rank)
    for step in range(1, a.steps + 1):
        ids = torch.randint(3, a.vocab, (2, 12), generator=g)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        mgr.save_checkpoint(local_path=os.path.join(a.out, f"global_step_{step}", "actor"), global_step=step,
                            max_ckpt_to_keep=None)
        dist.barrier()
        if rank == 0:
            with open(os.path.join(a.out, TRACKER), "w") as f:
                f.write(str(step))
        dist.barrier()
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    with open(os.path.join(infodir, f"rank{rank}.json"), "w") as f:
        json.dump(dict(trainable=trainable), f)


def build_frozen(mr, src, mesh, frozen):
    """make_run_fixtures.build with the frozen parameters marked before FSDP2 wraps them."""
    import transformers
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from verl.utils.fsdp_utils import apply_fsdp2

    model = transformers.Qwen2ForCausalLM.from_pretrained(src, dtype=torch.float32)
    for n, p in model.named_parameters():
        if n.startswith(frozen):
            p.requires_grad_(False)
    full = model.state_dict()
    apply_fsdp2(model, {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(param_dtype=torch.float32,
                                                                        reduce_dtype=torch.float32),
                        "offload_policy": None, "reshard_after_forward": True}, {})
    set_model_state_dict(model, full if dist.get_rank() == 0 else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return model


def write_plain_run(run, dims, steps, kind):
    tmp = tempfile.mkdtemp(prefix="ckfs-history-")
    try:
        src = prepare_plain_source(dims, tmp, "history_" + kind)
        infodir = os.path.join(tmp, "info")
        os.makedirs(infodir)
        os.makedirs(run, exist_ok=True)
        a = argparse.Namespace(out=run, steps=steps, kind=kind, vocab=dims["vocab_size"])
        mp.start_processes(plain_worker, args=(a, src, os.path.join(tmp, "store"), infodir), nprocs=WORLD,
                           start_method="fork", join=True)
        info = json.load(open(os.path.join(infodir, "rank0.json")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dict(kind=kind, steps=list(range(1, steps + 1)), roles=["actor"], trainable=info["trainable"],
                frozen_prefixes=list(frozen_prefixes(kind)), model=dims)


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------
RUNS = {
    "lora_run": lambda out: write_lora_run(out, qwen2_dims(layers=2), 4),
    "frozen_run": lambda out: write_plain_run(out, qwen2_dims(layers=3), 3, "frozen"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append")
    ap.add_argument("--bench")
    ap.add_argument("--kind", choices=["lora", "frozen", "plain"], default="lora")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--intermediate", type=int, default=1408)
    args = ap.parse_args()
    t0 = time.time()
    if args.bench:
        dims = qwen2_dims(args.hidden, args.layers, args.vocab, args.intermediate)
        shutil.rmtree(args.bench, ignore_errors=True)
        if args.kind == "lora":
            rec = write_lora_run(args.bench, dims, args.steps, name="bench_lora")
        else:
            rec = write_plain_run(args.bench, dims, args.steps, args.kind)
        with open(os.path.join(args.bench, "history.json"), "w") as f:
            json.dump(rec, f, indent=1)
        log(f"wrote {args.bench} ({args.kind}, {args.steps} steps) in {time.time() - t0:.0f} s")
        return 0
    manifest_path = os.path.join(REPO, "tests", "fixtures", "MANIFEST_history.json")
    runs = {}
    if os.path.exists(manifest_path):
        runs = json.load(open(manifest_path)).get("runs", {})
    for name, make in RUNS.items():
        if args.only and name not in args.only:
            continue
        out = os.path.join(OUT, name)
        shutil.rmtree(out, ignore_errors=True)
        runs[name] = make(out)
        log(f"[{name}] written in {time.time() - t0:.0f} s")
    import transformers
    import verl

    manifest = dict(generator="tests/gen/make_history_fixtures.py",
                    versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                                  verl=verl.__version__),
                    runs={k: runs[k] for k in sorted(runs)})
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    log("NOTE: verl's engine and checkpoint manager on CPU/gloo (patches: make_lora_vlm_fixtures.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
