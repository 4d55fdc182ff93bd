#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The least a mount can fetch for tensor-parallel readers (benchmark
helper for bench_s3.sh, not a test).

    tp_page_floor.py MODEL.safetensors [TP]   prints "FLOOR PAGES"

A mount serves whole pages: the kernel asks for 4 KiB pages of the served
file, and each must be assembled whole from its source bytes. For each
tensor and each of TP ranks, the pages its shard touches under
bench_serving.py's split (dim 0 for column-parallel weights, dim 1 for
row-parallel ones, whole otherwise), summed over ranks, are the served
bytes no mount can avoid; FLOOR is their size over the weights' (one
copy), and as a multiple of one copy of the rank files it is the same: a
served byte needs its share of source bytes. A row-parallel shard touches a page in every row, so
its pages cover most of the tensor for every rank: this, not the mount,
is why TP readers cannot fetch only one copy between them.
"""
import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serving import shard_dim  # noqa: E402

PAGE = 4096


def main():
    path = sys.argv[1]
    tp = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    base = 8 + n
    served = pages = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        shape = t["shape"]
        b0, b1 = (base + o for o in t["data_offsets"])
        served += b1 - b0
        es = (b1 - b0) // max(1, math.prod(shape))
        dim = shard_dim(name, len(shape))
        for r in range(tp):
            touched = set()
            if dim is None or shape[dim] % tp:
                touched.update(range(b0 // PAGE, (b1 - 1) // PAGE + 1))
            elif dim == 0:
                k = (b1 - b0) // tp
                s, e = b0 + r * k, b0 + (r + 1) * k
                touched.update(range(s // PAGE, (e - 1) // PAGE + 1))
            else:
                rows, cols = shape[0], (b1 - b0) // es // shape[0]
                k = cols // tp
                for i in range(rows):
                    s = b0 + (i * cols + r * k) * es
                    touched.update(range(s // PAGE, (s + k * es - 1) // PAGE + 1))
            pages += len(touched)
    print("%.2f %d" % (pages * PAGE / served, pages))


if __name__ == "__main__":
    main()
