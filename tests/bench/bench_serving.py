#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The serving pattern for tests/bench/bench_serving.sh (benchmark helper,
not a test).

    bench_serving.py DIR [TP]     prints "SECONDS TENSORS BYTES"

DIR may be several folders joined by commas: worker r then reads the
r-th (modulo their count), as TP nodes would each from their own mount.

Starts TP (default 8) worker processes at once, as vLLM and SGLang do with
tensor parallelism, each of which opens every *.safetensors in DIR with
safetensors' safe_open and reads its own shard of every tensor with
get_slice(name)[...], the way vLLM's Qwen2/Llama loaders shard them:

  column-parallel, split on dim 0: q_proj, k_proj, v_proj (weight and
      bias), gate_proj, up_proj, embed_tokens, lm_head
  row-parallel, split on dim 1: o_proj, down_proj
  everything else (norms) whole

A dim that does not divide by TP is read whole (vLLM replicates such KV
heads; the bench shapes' dims all divide by 8). Every page of every slice
is touched, as a copy to the GPU would. Workers import torch and
safetensors first and report ready; the clock runs from the moment all are
told to go until the last one has finished. The tensor count and the bytes
read (all workers together) let bench_serving.sh check that the mount and
the exported copy gave the same.
"""
import glob
import os
import sys
import time

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")
ROW = ("o_proj", "down_proj")


def shard_dim(name, ndim):
    parts = name.split(".")
    if any(p in COLUMN for p in parts):
        return 0
    if any(p in ROW for p in parts) and ndim >= 2:
        return 1
    return None


def worker(d, rank, tp):
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    if not files:
        raise SystemExit("bench_serving: no *.safetensors in %s" % d)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("bench_serving: worker %d not told to go" % rank)
    n = nbytes = 0
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                s = f.get_slice(name)
                shape = s.get_shape()
                dim = shard_dim(name, len(shape))
                if dim is None or shape[dim] % tp:
                    t = s[:]
                else:
                    k = shape[dim] // tp
                    idx = [slice(None)] * len(shape)
                    idx[dim] = slice(rank * k, (rank + 1) * k)
                    t = s[tuple(idx)]
                flat = t.reshape(-1)
                flat[:: max(1, 4096 // t.element_size())].float().sum().item()
                n += 1
                nbytes += t.numel() * t.element_size()
    sys.stdout.write("%d %d\n" % (n, nbytes))
    sys.stdout.flush()


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    if len(sys.argv) not in (2, 3):
        raise SystemExit("usage: bench_serving.py DIR [TP]")
    import subprocess

    dirs, tp = sys.argv[1].split(","), int(sys.argv[2]) if len(sys.argv) == 3 else 8
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", dirs[r % len(dirs)], str(r),
                               str(tp)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for r in range(tp)]
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            raise SystemExit("bench_serving: a worker failed to start")
    t0 = time.perf_counter()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    counts = [p.stdout.readline().split() for p in procs]
    dt = time.perf_counter() - t0
    for p in procs:
        if p.wait() != 0 or not p:
            raise SystemExit("bench_serving: a worker failed")
    if any(len(c) != 2 for c in counts) or len({c[0] for c in counts}) != 1:
        raise SystemExit("bench_serving: workers disagree on the tensors: %s" % counts)
    print("%.4f %s %d" % (dt, counts[0][0], sum(int(c[1]) for c in counts)))


if __name__ == "__main__":
    main()
