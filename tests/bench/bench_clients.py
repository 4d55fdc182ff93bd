# SPDX-License-Identifier: MIT
"""One load of a model folder by one client, timed (tests/bench/bench_clients.sh runs it in the
client's venv, in a fresh process per load). Prints one JSON line:

    {"client": ..., "seconds": wall time of the load, "tensors": N, "bytes": B, ...}

  vllm             LLM(folder) as tests/clients/client_vllm.py makes it (in-process engine,
                   enforce_eager, bf16), then one greedy token; "seconds" is LLM() (start-up
                   included), "weights_s" the weight-loading phase alone (DefaultModelLoader
                   .load_weights, what vLLM logs as "Loading weights took"), "process_s" from
                   the interpreter's start (imports included)
  runai            SafetensorsStreamer.stream_files + get_tensors with its defaults
  fastsafetensors  SafeTensorsFileLoader(cpu, nogds=True) with its defaults, every tensor taken

    python bench_clients.py CLIENT FOLDER
"""

from __future__ import annotations

import json
import os
import sys
import time

T_START = time.monotonic()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "clients"))


def vllm_load(folder):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import client_vllm
    from vllm import LLM, SamplingParams

    times = client_vllm.LoadTimes()
    t0 = time.monotonic()
    llm = LLM(model=folder, skip_tokenizer_init=True, enforce_eager=True, max_model_len=64, dtype="bfloat16",
              seed=0, distributed_executor_backend="uni", load_format="safetensors")
    dt = time.monotonic() - t0
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(temperature=0, max_tokens=1,
                                                                         detokenize=False), use_tqdm=False)
    return dict(seconds=round(dt, 3), weights_s=times.found.get("weights_s"), token=out[0].outputs[0].token_ids[0],
                process_s=round(time.monotonic() - T_START, 3))


def runai_load(folder):
    import common
    from runai_model_streamer import SafetensorsStreamer

    files = common.weight_files(folder)
    t0 = time.monotonic()
    n = b = 0
    with SafetensorsStreamer() as s:
        s.stream_files(files)
        for _, t in s.get_tensors():
            n += 1
            b += t.numel() * t.element_size()
    return dict(seconds=round(time.monotonic() - t0, 3), tensors=n, bytes=b)


def fastsafetensors_load(folder):
    import common
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup

    files = common.weight_files(folder)
    t0 = time.monotonic()
    loader = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)
    loader.add_filenames({0: files})
    bufs = loader.copy_files_to_device()
    n = b = 0
    for name in loader.get_keys():
        t = bufs.get_tensor(name)
        n += 1
        b += t.numel() * t.element_size()
    dt = time.monotonic() - t0
    bufs.close()
    loader.close()
    return dict(seconds=round(dt, 3), tensors=n, bytes=b)


if __name__ == "__main__":
    client, folder = sys.argv[1], sys.argv[2]
    res = {"vllm": vllm_load, "runai": runai_load, "fastsafetensors": fastsafetensors_load}[client](folder)
    print(json.dumps(dict(client=client, **res)), flush=True)
