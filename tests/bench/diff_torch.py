#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What `ckfs diff A B` replaces: load both verl FSDP checkpoints with torch and compare them.

    python tests/bench/diff_torch.py RUN/global_step_1/actor RUN/global_step_2/actor

The way a researcher would without ckfs: torch.load every rank file of both steps, rebuild each
full tensor (DTensor shards concatenated along their Shard dim), then per tensor max |B-A|,
||B-A|| / ||A||, cosine and the changed elements in float64. Prints the total relative change
(the same figure `ckfs diff` prints last) and the tensor count; tests/bench/bench_history.sh times
it and reads its peak RSS.
"""

import math
import re
import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor


def load(role: Path) -> dict:
    files = sorted(role.glob("model_world_size_*_rank_*.pt"),
                   key=lambda p: int(re.search(r"rank_(\d+)", p.name).group(1)))
    sds = [torch.load(f, map_location="cpu", weights_only=False) for f in files]
    out = {}
    for k, v in sds[0].items():
        if isinstance(v, DTensor):
            (pl,) = v.placements
            out[k] = (torch.cat([sd[k]._local_tensor for sd in sds], dim=pl.dim) if pl.is_shard()
                      else v._local_tensor)
        else:
            out[k] = v
    return out


def main():
    a, b = load(Path(sys.argv[1])), load(Path(sys.argv[2]))
    a2 = d2 = 0.0
    changed = 0
    for k in a:
        if k not in b or a[k].shape != b[k].shape:
            continue
        x, y = a[k].double().flatten(), b[k].double().flatten()
        d = y - x
        s_a2, s_d2 = float((x * x).sum()), float((d * d).sum())
        _ = float(d.abs().max()) if x.numel() else 0.0
        _ = float((x * y).sum()) / math.sqrt(s_a2 * float((y * y).sum()) or 1.0)
        changed += int(((x != y) & ~(x.isnan() & y.isnan())).sum())
        a2 += s_a2
        d2 += s_d2
    print(f"tensors {len(a)} changed_elements {changed} rel_l2 {math.sqrt(d2) / math.sqrt(a2):.9g}")


if __name__ == "__main__":
    main()
