#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The client tier: real loaders read ckfs mounts, and what they load must equal the reference.

    python3 tests/clients/run_clients.py [--only vllm,runai,fastsafetensors] [--cases w4a16,...] [--keep DIR]
        env: CKFS_BIN (default build/ckfs), CKFS_VENV (the main venv, default ~/.cache/ckfs/venv)

Run by tests/run-tests.sh after the Python tier. Each client runs in its own venv
(tests/clients/setup-client-venvs.sh, called here) against fresh mounts of the cases of
tests/fixtures/clients/MANIFEST_clients.json (real checkpoints: tests/gen/make_client_fixtures.py):

  vllm             vLLM 0.32.0 (CPU build), one process: each case's model loaded from the mount
                   and from the reference folder, greedy tokens and log-probs compared
  runai            runai-model-streamer 0.17.1 with its defaults (16 workers, io_uring + O_DIRECT
                   here), then again with RUNAI_STREAMER_FS_STRATEGY=sync_buffered (16 threads of
                   buffered reads): every tensor compared bit for bit
  fastsafetensors  fastsafetensors 0.5.0, CPU, nogds=True with its defaults (O_DIRECT on a local
                   filesystem), then FASTSAFETENSORS_ODIRECT=0 (buffered): every tensor compared

runai and fastsafetensors also read a bigger checkpoint made here (tests/gen/make_bench_checkpoint.py
bench-600m with 2 layers: 350 MB of fp32 rank files, a 176 MB model.safetensors), whose reference
is verl's merger run live, so that their threads have many blocks to read at once.

Every mount is fresh (mounted for one client run, its `ckfs stats` read, unmounted), so no client
reads another's page cache. A client that cannot run fails the tier with the reason; the last
line counts the checks: "N passed, N failed".
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

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "clients")
CKFS = os.environ.get("CKFS_BIN", os.path.join(REPO, "build", "ckfs"))
CACHE = os.environ.get("CKFS_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ckfs")
MAIN_VENV = os.environ.get("CKFS_VENV", os.path.join(CACHE, "venv"))
CLIENT_TIMEOUT = 1800  # catches hangs only: the vLLM run takes 2-4 minutes here

# (client, venv, script, extra environment, what the run is)
RUNS = [
    ("vllm", "vllm-cpu", "client_vllm.py", {}, "vLLM 0.32.0 CPU"),
    ("runai", "runai", "client_runai.py", {}, "Run:ai streamer, defaults"),
    ("runai", "runai", "client_runai.py", {"RUNAI_STREAMER_FS_STRATEGY": "sync_buffered"},
     "Run:ai streamer, buffered reads"),
    ("fastsafetensors", "fastsafetensors", "client_fastsafetensors.py", {}, "fastsafetensors, defaults"),
    ("fastsafetensors", "fastsafetensors", "client_fastsafetensors.py", {"FASTSAFETENSORS_ODIRECT": "0"},
     "fastsafetensors, buffered reads"),
]


def say(*a):
    print(*a, flush=True)


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


class Mounts:
    """Mount points under ROOT/mnt; unmounts whatever is left on close."""

    def __init__(self, root):
        self.root = root
        self.live = []

    def mount(self, name, src, options):
        mp = os.path.join(self.root, "mnt", name)
        os.makedirs(mp, exist_ok=True)
        run([CKFS, "mount", "--log-level", "warn", src, mp, *options])
        self.live.append(mp)
        return mp

    def stats(self, mp):
        out = subprocess.run([CKFS, "stats", "--json", mp], capture_output=True, text=True, check=True).stdout
        return json.loads(out)

    def umount(self, mp):
        run([CKFS, "umount", mp])
        self.live.remove(mp)

    def close(self):
        for mp in list(self.live):
            subprocess.run([CKFS, "umount", "-z", mp])
            self.live.remove(mp)


def reference_folder(root, name, case):
    """A folder with the reference's config.json and weights (links), as a loader wants it."""
    ref = os.path.join(FIXTURES, case["reference"])
    d = os.path.join(root, "ref", name)
    os.makedirs(d, exist_ok=True)
    cfg = os.path.join(FIXTURES, case["reference_config"]) if "reference_config" in case else \
        os.path.join(ref, "config.json")
    os.symlink(cfg, os.path.join(d, "config.json"))
    if "reference_weights" in case:
        os.symlink(os.path.join(ref, case["reference_weights"]), os.path.join(d, "model.safetensors"))
    else:
        for fn in os.listdir(ref):
            if fn.endswith(".safetensors") or fn == "model.safetensors.index.json":
                os.symlink(os.path.join(ref, fn), os.path.join(d, fn))
    return d


def make_bulk(root):
    """A 350 MB verl-FSDP2-style checkpoint (4 ranks) and verl's merger output for it."""
    py = os.path.join(MAIN_VENV, "bin", "python")
    if not os.path.exists(py):
        raise SystemExit(f"clients: the main venv ({MAIN_VENV}) is missing: tests/setup-venv.sh makes it")
    src, ref = os.path.join(root, "bulk", "ckpt"), os.path.join(root, "bulk", "verl_merged")
    t0 = time.monotonic()
    env = dict(os.environ, HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="", PYTHONHASHSEED="0",
               VERL_LOGGING_LEVEL="WARN", TRANSFORMERS_VERBOSITY="error")
    run([py, os.path.join(REPO, "tests", "gen", "make_bench_checkpoint.py"), src, "--shape", "bench-600m",
         "--layers", "2"], stdout=subprocess.DEVNULL, env=env)
    t1 = time.monotonic()
    p = subprocess.run([py, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", src,
                        "--target_dir", ref], capture_output=True, text=True, env=env, cwd=REPO)
    if p.returncode != 0:
        raise SystemExit(f"clients: verl's merger failed on the bulk checkpoint:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    say(f"bulk checkpoint: bench-600m with 2 layers, 4 rank files ({dir_size(src) / 1e6:.0f} MB) written in "
        f"{t1 - t0:.0f} s, verl's merger in {time.monotonic() - t1:.0f} s ({dir_size(ref) / 1e6:.0f} MB)")
    return dict(kind="bench-shaped FSDP2 checkpoint, 176 MB of bf16", src=src, options=[], compare_options=[],
                reference=ref, reference_tool="verl 0.9.1 model_merger", clients={"runai", "fastsafetensors"})


def make_fp8(root, amx):
    """A verl FSDP2 Llama actor with heads of 128 (what vLLM's CPU block-FP8 path takes) and the
    reference quantizer's FP8 folder for it (tests/gen/make_client_fixtures.py --fp8)."""
    py = os.path.join(MAIN_VENV, "bin", "python")
    out = os.path.join(root, "fp8")
    t0 = time.monotonic()
    p = subprocess.run([py, os.path.join(REPO, "tests", "gen", "make_client_fixtures.py"), "--fp8", out],
                       capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0:
        raise SystemExit(f"clients: writing the FP8 case failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    say(f"fp8 case: verl FSDP2 Llama (W=2, heads of 128), verl's merger and the reference FP8 folder written "
        f"in {time.monotonic() - t0:.0f} s")
    return dict(kind="verl FSDP2 Llama actor, --dtype fp8", src=os.path.join(out, "fsdp", "llama_fp8_fsdp2_w2"),
                options=["--dtype", "fp8"], compare_options=["--dtype", "fp8"],
                reference=os.path.join(out, "fp8_reference"),
                reference_tool="the reference FP8 quantizer (tests/gen/make_fp8_expected.py)",
                clients={"runai", "fastsafetensors"} | ({"vllm"} if amx else set()))


def make_w4a16(root):
    """The W4A16 case: tests/fixtures/w4a16/qwen2_fsdp2_w2 (a verl FSDP2 Qwen2 with 128-multiple
    dims) and, as the reference, what compressed-tensors 0.20.1 itself writes from ckfs's bf16 export
    of it (tests/w4a16/oracle.py: its quantize, pack_to_int32 and ModelCompressor, in the venv of
    tests/w4a16/setup-w4a16-venv.sh)."""
    src = os.path.join(REPO, "tests", "fixtures", "w4a16", "qwen2_fsdp2_w2")
    bf16, ref = os.path.join(root, "w4a16", "bf16"), os.path.join(root, "w4a16", "reference")
    t0 = time.monotonic()
    os.makedirs(os.path.join(root, "w4a16"), exist_ok=True)
    run(["sh", os.path.join(REPO, "tests", "w4a16", "setup-w4a16-venv.sh")])
    run([CKFS, "export", "-q", src, bf16])
    venv = os.environ.get("CKFS_W4A16_VENV", os.path.join(CACHE, "w4a16-venv"))
    p = subprocess.run([os.path.join(venv, "bin", "python"), os.path.join(REPO, "tests", "w4a16", "oracle.py"),
                        bf16, ref, "--model"], capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0:
        raise SystemExit(f"clients: compressed-tensors' W4A16 of the w4a16 case failed:\n{p.stderr[-2000:]}")
    say(f"w4a16 case: compressed-tensors 0.20.1's folder written in {time.monotonic() - t0:.0f} s")
    return dict(kind="verl FSDP2 Qwen2 actor, --dtype w4a16", src=src, options=["--dtype", "w4a16"],
                compare_options=["--dtype", "w4a16"], reference=ref,
                reference_tool="compressed-tensors 0.20.1 (quantize, pack_to_int32, ModelCompressor)",
                clients={"vllm", "runai", "fastsafetensors"})


def dir_size(d):
    return sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(d) for f in fs)


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated clients: vllm,runai,fastsafetensors")
    ap.add_argument("--keep", help="work folder to use and keep (default: a temporary one, removed)")
    ap.add_argument("--cases", help="comma-separated cases to run (default: all), e.g. w4a16")
    a = ap.parse_args()
    only = set(a.only.split(",")) if a.only else {r[0] for r in RUNS}
    runs = [r for r in RUNS if r[0] in only]
    if not runs:
        raise SystemExit(f"clients: nothing to run for --only {a.only}")
    if not os.access(CKFS, os.X_OK):
        raise SystemExit(f"clients: no ckfs binary at {CKFS}")
    with open(os.path.join(FIXTURES, "MANIFEST_clients.json")) as f:
        cases = json.load(f)["cases"]

    t_start = time.monotonic()
    venvs = sorted({r[1] for r in runs})
    run(["sh", os.path.join(HERE, "setup-client-venvs.sh"), *venvs])
    say("GPU: no GPU machine is lent to this task; vLLM's CUDA build, fastsafetensors' GDS and the "
        "streamer's device paths are not run (CPU paths only)")
    amx = "amx_tile" in cpu_flags()
    if "vllm" in only:
        say("FP8 (--dtype fp8): " + ("these CPUs have AMX (amx_tile), which vLLM's CPU block-FP8 kernel needs: "
                                     "vLLM serves the fp8 case" if amx else
            "NOT served by vLLM here: its CPU block-FP8 kernel needs AMX, and these CPUs have none "
            "(no amx_tile in /proc/cpuinfo); the streaming clients still read the FP8 view"))

    if "vllm" in only:
        say("W4A16 (--dtype w4a16): vLLM's CPU build serves compressed-tensors' pack-quantized INT4 with its "
            "CPUWNA16 kernel (uint4b8, no AMX needed): vLLM serves the w4a16 case")
    root = a.keep or tempfile.mkdtemp(prefix="ckfs-clients-")
    if a.keep:
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
    mounts = Mounts(root)
    passed, failed = 0, 0
    failures = []
    try:
        todo_cases = {}
        wanted = set(a.cases.split(",")) if a.cases else None
        use = lambda name: wanted is None or name in wanted  # noqa: E731
        for name, c in cases.items():
            if use(name):
                todo_cases[name] = dict(c, src=os.path.join(FIXTURES, c["src"]),
                                        reference=reference_folder(root, name, c),
                                        clients={"vllm", "runai", "fastsafetensors"})
        if only & {"runai", "fastsafetensors"} and use("bulk"):
            todo_cases["bulk"] = make_bulk(root)
        if (only & {"runai", "fastsafetensors"} or amx) and use("fp8"):
            todo_cases["fp8"] = make_fp8(root, amx)
        if use("w4a16"):
            todo_cases["w4a16"] = make_w4a16(root)
        if not todo_cases:
            raise SystemExit(f"clients: no case named in --cases {a.cases}")
        for client, venv, script, extra, title in runs:
            say(f"\n---- {title} ({client}, venv {os.path.join(CACHE, 'client-' + venv)}"
                f"{', ' + ' '.join(f'{k}={v}' for k, v in extra.items()) if extra else ''})")
            tensor_client = client != "vllm"
            todo = []
            for name, c in todo_cases.items():
                if client not in c["clients"]:
                    continue
                opts = c["compare_options"] if tensor_client else c["options"]
                mp = mounts.mount(f"{client}-{name}", c["src"], opts)
                served = os.path.join(mp, c["subdir"]) if "subdir" in c else mp
                todo.append(dict(name=name, kind=c["kind"], mount=served, mount_point=mp, reference=c["reference"],
                                 reference_tool=c["reference_tool"], options=opts))
            spec_path = os.path.join(root, f"{client}-{len(extra)}.spec.json")
            result_path = spec_path.replace(".spec.json", ".result.json")
            with open(spec_path, "w") as f:
                json.dump(dict(cases=todo, result=result_path), f, indent=1)
            py = os.path.join(CACHE, "client-" + venv, "bin", "python")
            env = dict(os.environ, **extra)
            env.pop("PYTHONPATH", None)
            t0 = time.monotonic()
            logf = os.path.join(root, f"{client}-{len(extra)}.log")
            with open(logf, "w") as lf:
                p = subprocess.Popen([py, "-u", os.path.join(HERE, script), spec_path], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=HERE, env=env)
                for line in p.stdout:  # the client's own lines (what it checked) go to the tier's log
                    lf.write(line)
                    if line.startswith(("ok ", "FAIL ", "vllm ", "runai-model-streamer ", "fastsafetensors ",
                                        "Traceback")):
                        print("  " + line.rstrip(), flush=True)
                try:
                    rc = p.wait(timeout=CLIENT_TIMEOUT)
                except subprocess.TimeoutExpired:
                    p.kill()
                    rc = "timeout"
            records = {}
            if os.path.exists(result_path):
                with open(result_path) as f:
                    records = {r["name"]: r for r in json.load(f)}
            for t in todo:
                st = mounts.stats(t["mount_point"])
                mounts.umount(t["mount_point"])
                r = records.get(t["name"])
                ok = bool(r and r["ok"]) and st.get("source_bytes_read", 0) > 0 and st.get("errors", 1) == 0
                if r and r["ok"] and not ok:
                    failures.append(f"{title}: {t['name']}: the mount read no source byte or counted errors")
                elif not r:
                    failures.append(f"{title}: {t['name']}: no result (client exit {rc}; log {logf})")
                elif not r["ok"]:
                    failures.append(f"{title}: {r['checked']}")
                passed += ok
                failed += not ok
                say(f"  {'pass' if ok else 'FAIL'} {t['name']:13s} {t['kind']}; mount "
                    f"{' '.join(t['options']) or '(defaults)'}: {st.get('source_bytes_read', 0) / 1e6:.2f} MB of "
                    f"checkpoint read, {st.get('errors', 0)} errors")
            say(f"  {title}: exit {rc}, {time.monotonic() - t0:.0f} s")
            if rc != 0:
                failures.append(f"{title}: client exited {rc} (log {logf})")
                failed += 1
    finally:
        mounts.close()
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    say(f"\nclients: {time.monotonic() - t_start:.0f} s")
    for f in failures:
        say("FAILED: " + f)
    say(f"clients: {passed} passed, {failed} failed")
    return 1 if failed or failures else 0


if __name__ == "__main__":
    sys.exit(main())
