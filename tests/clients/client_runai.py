# SPDX-License-Identifier: MIT
"""Run:ai Model Streamer (runai-model-streamer, the loader behind vLLM's --load-format
runai_streamer) against ckfs mounts: every tensor of the mounted model.safetensors (or of every
shard the index names) is streamed with the streamer's defaults (16 workers, 2 MiB blocks; on a
local mount it picks io_uring with O_DIRECT, measuring the mount's direct-I/O block first) and
compared bit for bit with the reference folder's file, read with plain reads.

Run by tests/clients/run_clients.py in ~/.cache/ckfs/client-runai:

    python client_runai.py SPEC.json
"""

from __future__ import annotations

import os
import time

import common


def stream(files):
    from runai_model_streamer import SafetensorsStreamer

    got = {}
    with SafetensorsStreamer() as s:
        s.stream_files(files)
        for name, t in s.get_tensors():  # owned tensors (the default): safe to keep
            if name in got:
                raise ValueError(f"tensor {name} streamed twice")
            got[name] = common.torch_raw(t)
    return got


def main():
    spec = common.load_spec()
    from importlib.metadata import version

    env = {k: v for k, v in os.environ.items() if k.startswith("RUNAI_STREAMER_")}
    common.say(f"runai-model-streamer {version('runai-model-streamer')}, "
               f"{'settings ' + str(env) if env else 'default settings'}")
    records = []
    for case in spec["cases"]:
        rec = dict(name=case["name"], ok=False)
        try:
            files = common.weight_files(case["mount"])
            t0 = time.monotonic()
            got = stream(files)
            dt = time.monotonic() - t0
            want = common.folder_raw_tensors(case["reference"])
            diffs = common.compare_tensors(got, want)
            nbytes = sum(len(v[2]) for v in got.values())
            rec.update(ok=not diffs and len(got) > 0, seconds=round(dt, 3), tensors=len(got), bytes=nbytes,
                       files=len(files), differences=diffs[:20])
            rec["checked"] = (f"{case['name']}: {len(got)} tensors ({nbytes / 1e6:.2f} MB) streamed from "
                              f"{len(files)} mounted file(s) in {dt:.2f} s, "
                              + ("equal bit for bit to " if not diffs else f"{len(diffs)} DIFFERENT from ")
                              + f"{case['reference_tool']}'s" + (f": {diffs[:3]}" if diffs else ""))
        except Exception as e:  # noqa: BLE001 (the record says what failed; the tier fails on it)
            import traceback

            traceback.print_exc()
            rec["checked"] = f"{case['name']}: Run:ai streamer FAILED: {type(e).__name__}: {e}"
        common.say(("ok   " if rec["ok"] else "FAIL ") + rec["checked"])
        records.append(rec)
    common.write_result(spec, records)


if __name__ == "__main__":
    main()
