#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Timed model readers for tests/bench/bench.sh (benchmark helper, not a test).

    bench_readers.py safe_open DIR        safetensors.safe_open + get_tensor of
                                          every tensor of every *.safetensors
    bench_readers.py from_pretrained DIR  transformers AutoModelForCausalLM
                                          .from_pretrained(DIR, dtype="auto"), CPU

Both then touch every page of every tensor (one element per 4 KiB, inside the
clock): safetensors and transformers may hand out tensors that map the file,
which are only read when used, so without it a lazy load would look fast by
reading half the file. A server copying the weights to a device reads it all.

Run in a fresh process per measurement (bench.sh does), so nothing is cached
in the interpreter. Imports happen before the clock starts: the figure is the
reading itself. Prints one line, "SECONDS TENSORS BYTES", on stdout; bench.sh
checks that the mount and the exported copy give the same tensor count and
bytes.
"""
import glob
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def touch(t):
    flat = t.reshape(-1)
    return flat[:: max(1, 4096 // t.element_size())].float().sum().item()


def safe_open_all(d):
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    if not files:
        raise SystemExit("bench_readers: no *.safetensors in %s" % d)
    t0 = time.perf_counter()
    n = nbytes = 0
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            for key in f.keys():
                t = f.get_tensor(key)
                touch(t)
                n += 1
                nbytes += t.numel() * t.element_size()
    return time.perf_counter() - t0, n, nbytes


def from_pretrained(d):
    import torch  # noqa: F401  (imported before the clock)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    t0 = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype="auto")
    # Tied weights appear under two names; count and touch each tensor once.
    seen = {id(t): t for t in model.state_dict().values()}
    for t in seen.values():
        touch(t)
    dt = time.perf_counter() - t0
    return dt, len(seen), sum(t.numel() * t.element_size() for t in seen.values())


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("safe_open", "from_pretrained"):
        raise SystemExit("usage: bench_readers.py safe_open|from_pretrained DIR")
    fn = safe_open_all if sys.argv[1] == "safe_open" else from_pretrained
    dt, n, nbytes = fn(sys.argv[2])
    print("%.4f %d %d" % (dt, n, nbytes))


if __name__ == "__main__":
    main()
