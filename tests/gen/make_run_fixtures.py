#!/usr/bin/env python3
"""Generate training runs as verl writes them: global_step_<N>/<role>/ and the tracker file.

    .venv/bin/python tests/gen/make_run_fixtures.py                 # tests/fixtures/run/ (~1 min)
    .venv/bin/python tests/gen/make_run_fixtures.py --live OUT ...   # the live test's writer

A run is written by a real, short training loop: two torch processes (gloo, CPU) hold a tiny
Qwen2 actor (and a Qwen2ForTokenClassification critic with one label, verl's critic) under FSDP2,
take real AdamW steps on a next-token (actor) and value (critic) loss, and every `--save-freq`
steps save through verl's own FSDPCheckpointManager.save_checkpoint(local_path=
RUN/global_step_<N>/<role>, global_step=N, max_ckpt_to_keep=K), which rotates old steps out as
in training (shutil.rmtree of global_step_<M>/<role>). After the save, rank 0 writes
RUN/latest_checkpointed_iteration.txt the way verl's RayPPOTrainer._save_checkpoint does
(open("w") + write(str(step)): rewritten in place, not atomically).

Outputs (tests/fixtures/run/):
    fsdp_ppo/       actor + critic, 4 steps saved every step, max_ckpt_to_keep=2: global_step_3,
                    global_step_4 left, tracker "4"; plus global_step_5/actor half-written (rank
                    0's file only, no tracker update: a save caught in the middle)
    fsdp_grpo/      actor only, no tracker (a run whose trainer does not write it), 2 steps
    megatron/       global_step_1/actor, global_step_2/actor and global_step_2/critic made by
                    tests/gen/make_megatron_fixtures.py's make_case (megatron-core 0.12.2) with
                    different seeds per step, tracker "2"
    MANIFEST_run.json  steps, roles, what is expected to be shown

--live OUT: the same loop for the live test (tests/py/test_run.py), --steps N --keep K
[--no-tracker] [--pause S between steps]; prints "saved <N> <T>" after each tracker update, T
the CLOCK_MONOTONIC time at which every rank had finished the step's files.

Deviation from a GPU run (as in make_fixtures.py): FSDP2 on CPU modules, gloo, weights filled
from stable seeds instead of a hub model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("USE_LIBUV", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VERL_LOGGING_LEVEL", "WARN")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
# make_fixtures.py re-executes itself for byte-reproducible pickles on import; this script
# only borrows its helpers (tokenizer, seeded weights).
os.environ["CKFS_GEN_REEXEC"] = "1"

import torch  # noqa: E402

torch.set_num_threads(1)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mf  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(REPO, "tests", "fixtures", "run")
TRACKER = "latest_checkpointed_iteration.txt"
WORLD = 2
# Small enough for KBs per step: fp32, one layer.
MODEL = dict(vocab_size=131, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
             num_attention_heads=4, num_key_value_heads=2)


def log(*a):
    print(*a, flush=True)


def qwen2_config(critic: bool):
    from transformers import Qwen2Config

    c = Qwen2Config(max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                    pad_token_id=0, rms_norm_eps=1e-6, rope_theta=10000.0, use_sliding_window=False, **MODEL)
    if critic:
        c.num_labels = 1
    c.architectures = ["Qwen2ForTokenClassification" if critic else "Qwen2ForCausalLM"]
    return c


def prepare_sources(tmp):
    """The 'pretrained' folders verl's actor and critic would be loaded from."""
    import transformers

    dirs = {}
    for role in ("actor", "critic"):
        d = os.path.join(tmp, "src_" + role)
        c = qwen2_config(role == "critic")
        cls = transformers.Qwen2ForTokenClassification if role == "critic" else transformers.Qwen2ForCausalLM
        m = cls(c)
        mf.fill_weights(m, "run_" + role, torch.float32)
        m.config.dtype = torch.float32
        m.save_pretrained(d)
        mf.build_tokenizer().save_pretrained(d)
        dirs[role] = d
    return dirs


def worker(rank, args, srcs, store):
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        train(rank, args, srcs)
    finally:
        dist.destroy_process_group()


def build(role, src, mesh):
    import transformers
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from verl.utils.fsdp_utils import apply_fsdp2

    cls = transformers.Qwen2ForTokenClassification if role == "critic" else transformers.Qwen2ForCausalLM
    model = cls.from_pretrained(src, dtype=torch.float32)
    full = model.state_dict()
    apply_fsdp2(model, {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(param_dtype=torch.float32,
                                                                        reduce_dtype=torch.float32),
                        "offload_policy": None, "reshard_after_forward": True}, {})
    set_model_state_dict(model, full if dist.get_rank() == 0 else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return model


def train(rank, args, srcs):
    from omegaconf import DictConfig
    from torch.distributed.device_mesh import init_device_mesh
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.tokenizer import hf_tokenizer
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    mesh = init_device_mesh("cpu", mesh_shape=(WORLD,), mesh_dim_names=("fsdp",))
    roles = ["actor"] + (["critic"] if args.critic else [])
    parts = {}
    for role in roles:
        model = build(role, srcs[role], mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01)
        sched = get_constant_schedule_with_warmup(optimizer=opt, num_warmup_steps=0)
        mgr = FSDPCheckpointManager(model=model, optimizer=opt, lr_scheduler=sched,
                                    processing_class=hf_tokenizer(srcs[role]),
                                    checkpoint_config=DictConfig({"save_contents": ["model", "extra"],
                                                                  "load_contents": ["model", "extra"]}))
        parts[role] = (model, opt, sched, mgr)
    g = torch.Generator().manual_seed(1234 + rank)
    for step in range(1, args.steps + 1):
        ids = torch.randint(3, MODEL["vocab_size"], (2, 12), generator=g)
        for role, (model, opt, sched, _) in parts.items():
            if role == "actor":
                loss = model(input_ids=ids, labels=ids).loss
            else:
                values = model(input_ids=ids).logits.squeeze(-1)
                loss = ((values - torch.rand(values.shape, generator=g)) ** 2).mean()
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        if step % args.save_freq:
            continue
        for role, (_, _, _, mgr) in parts.items():
            path = os.path.join(args.out, f"global_step_{step}", role)
            mgr.save_checkpoint(local_path=path, global_step=step, max_ckpt_to_keep=args.keep)
        dist.barrier()
        if rank == 0:
            complete = time.monotonic()  # every rank's files are closed (barrier above)
            if args.tracker:
                # verl's RayPPOTrainer._save_checkpoint
                with open(os.path.join(args.out, TRACKER), "w") as f:
                    f.write(str(step))
            log(f"saved {step} {complete:.6f}")
        dist.barrier()
        if args.pause:
            time.sleep(args.pause)


def write_run(out, steps, keep, critic, tracker, save_freq=1, pause=0.0):
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    try:
        srcs = prepare_sources(tmp)
        a = argparse.Namespace(out=out, steps=steps, keep=keep, critic=critic, tracker=tracker,
                               save_freq=save_freq, pause=pause)
        mp.start_processes(worker, args=(a, srcs, os.path.join(tmp, "store")), nprocs=WORLD,
                           start_method="fork", join=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def half_written_step(run, step, src_step):
    """A save caught in the middle: rank 0's file of step `step` only, tracker not updated."""
    src = os.path.join(run, f"global_step_{src_step}", "actor")
    dst = os.path.join(run, f"global_step_{step}", "actor")
    os.makedirs(dst)
    shutil.copy(os.path.join(src, f"model_world_size_{WORLD}_rank_0.pt"), dst)


def megatron_run(out):
    import make_megatron_fixtures as mm

    tmp = tempfile.mkdtemp()
    saved = mm.OUT
    mm.OUT = os.path.join(tmp, "cases")
    try:
        cases = {c[0]: c for c in mm.CASES + mm.MOE_CASES}
        plan = [(1, "actor", "llama_tp2", 0), (2, "actor", "llama_tp2", 1), (2, "critic", "qwen2_critic_tp2", 2)]
        for step, role, name, seed in plan:
            os.makedirs(os.path.join(tmp, "work"), exist_ok=True)
            mm.make_case(seed, cases[name], os.path.join(tmp, "work"))
            dst = os.path.join(out, f"global_step_{step}", role)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.move(os.path.join(mm.OUT, name), dst)
            shutil.rmtree(os.path.join(dst, "original"))  # ground truth of the case, not verl's
        with open(os.path.join(out, TRACKER), "w") as f:
            f.write("2")
    finally:
        mm.OUT = saved
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--live")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--keep", type=int, default=2)
    ap.add_argument("--pause", type=float, default=0.0)
    ap.add_argument("--no-tracker", action="store_true")
    args = ap.parse_args()
    if args.live:
        write_run(args.live, args.steps, args.keep, critic=False, tracker=not args.no_tracker, pause=args.pause)
        return 0
    shutil.rmtree(OUT, ignore_errors=True)
    ppo = os.path.join(OUT, "fsdp_ppo")
    write_run(ppo, steps=4, keep=2, critic=True, tracker=True)
    half_written_step(ppo, 5, 4)
    grpo = os.path.join(OUT, "fsdp_grpo")
    write_run(grpo, steps=2, keep=None, critic=False, tracker=False)
    megatron_run(os.path.join(OUT, "megatron"))
    manifest = {
        "generator": "tests/gen/make_run_fixtures.py",
        "versions": {"torch": torch.__version__},
        "runs": {
            "fsdp_ppo": {"shown": ["global_step_3", "global_step_4"], "latest": "global_step_4",
                         "roles": ["actor", "critic"], "hidden": ["global_step_5"]},
            "fsdp_grpo": {"shown": ["global_step_1", "global_step_2"], "latest": None, "roles": ["actor"]},
            "megatron": {"shown": ["global_step_1", "global_step_2"], "latest": "global_step_2",
                         "roles": {"global_step_1": ["actor"], "global_step_2": ["actor", "critic"]}},
        },
    }
    with open(os.path.join(OUT, "..", "MANIFEST_run.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    log("NOTE: FSDP2 on CPU with gloo; weights from stable seeds, then real AdamW steps.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
