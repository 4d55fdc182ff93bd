# SPDX-License-Identifier: MIT
"""fastsafetensors (CPU mode, no GDS) against ckfs mounts: SafeTensorsFileLoader(device "cpu",
nogds=True) with its defaults (16 threads, 16 MiB bounce buffers; on a local filesystem such as
fuse.ckfs it opens the files with O_DIRECT) loads every mounted weight file and hands out each
tensor, compared bit for bit with the reference folder's file, read with plain reads.

Run by tests/clients/run_clients.py in ~/.cache/ckfs/client-fastsafetensors:

    python client_fastsafetensors.py SPEC.json
"""

from __future__ import annotations

import os
import time

import common


def load(files):
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup

    loader = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)
    try:
        loader.add_filenames({0: files})
        bufs = loader.copy_files_to_device()
        try:
            got = {}
            for name in loader.get_keys():
                got[name] = common.torch_raw(bufs.get_tensor(name))
        finally:
            bufs.close()
    finally:
        loader.close()
    return got


def main():
    spec = common.load_spec()
    from importlib.metadata import version

    odirect = os.environ.get("FASTSAFETENSORS_ODIRECT")
    common.say(f"fastsafetensors {version('fastsafetensors')}, CPU, nogds=True, "
               f"{'FASTSAFETENSORS_ODIRECT=' + odirect if odirect is not None else 'default I/O policy'}")
    records = []
    for case in spec["cases"]:
        rec = dict(name=case["name"], ok=False)
        try:
            files = common.weight_files(case["mount"])
            t0 = time.monotonic()
            got = load(files)
            dt = time.monotonic() - t0
            want = common.folder_raw_tensors(case["reference"])
            diffs = common.compare_tensors(got, want)
            nbytes = sum(len(v[2]) for v in got.values())
            rec.update(ok=not diffs and len(got) > 0, seconds=round(dt, 3), tensors=len(got), bytes=nbytes,
                       files=len(files), differences=diffs[:20])
            rec["checked"] = (f"{case['name']}: {len(got)} tensors ({nbytes / 1e6:.2f} MB) loaded from "
                              f"{len(files)} mounted file(s) in {dt:.2f} s, "
                              + ("equal bit for bit to " if not diffs else f"{len(diffs)} DIFFERENT from ")
                              + f"{case['reference_tool']}'s" + (f": {diffs[:3]}" if diffs else ""))
        except Exception as e:  # noqa: BLE001 (the record says what failed; the tier fails on it)
            import traceback

            traceback.print_exc()
            rec["checked"] = f"{case['name']}: fastsafetensors FAILED: {type(e).__name__}: {e}"
        common.say(("ok   " if rec["ok"] else "FAIL ") + rec["checked"])
        records.append(rec)
    common.write_result(spec, records)


if __name__ == "__main__":
    main()
