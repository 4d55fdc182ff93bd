# SPDX-License-Identifier: MIT
"""vLLM (CPU build) against ckfs mounts: for each case, the model is loaded by vLLM from the
mount and from the reference folder, and greedy generation of a few prompts must give the same
tokens and the same log-probabilities, bit for bit (same weights, same kernels, same batch).

Run by tests/clients/run_clients.py in ~/.cache/ckfs/client-vllm-cpu:

    python client_vllm.py SPEC.json

One process loads every folder in turn (the engine in-process: VLLM_ENABLE_V1_MULTIPROCESSING=0
and the uni executor, so the imports and the engine set-up are paid once, not per folder). The
script needs the __main__ guard all the same: vLLM spawns processes in other set-ups. The
weight-loading phase vLLM logs ("Loading weights took ...") is recorded per folder.
"""

from __future__ import annotations

import gc
import os
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes most of the RAM
os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import common  # noqa: E402

# Token ids below the fixtures' vocabulary (300), varied lengths; 12 new tokens each.
PROMPTS = [[1, 17, 42, 99, 5], [3, 250, 7, 7, 7, 31, 160, 2, 88, 120, 64], [200], [11, 12, 13, 14, 15, 16, 17]]
MAX_TOKENS = 12
# vLLM's default loader (safetensors files, memory-mapped) and the Run:ai streamer it ships as
# --load-format runai_streamer (the package is in this venv as vLLM's "runai" extra pins it).
# Its --load-format fastsafetensors is CUDA only in 0.32.0 (the iterator makes
# torch.device(f"cuda:{current_device()}"): "Invalid device string: 'cuda:cpu'"), so fastsafetensors
# runs alone (client_fastsafetensors.py).
LOAD_FORMATS = ["safetensors", "runai_streamer"]


class LoadTimes:
    """The weight-loading phase, timed around vLLM's DefaultModelLoader.load_weights (what its log
    line "Loading weights took ..." measures; the engine runs in this process, so it can be
    wrapped: vLLM reconfigures its loggers when an engine starts, which would drop a handler)."""

    def __init__(self):
        from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

        self.found = {}
        orig = DefaultModelLoader.load_weights
        times = self

        def load_weights(loader, *a, **kw):
            t0 = time.monotonic()
            try:
                return orig(loader, *a, **kw)
            finally:
                times.found["weights_s"] = round(time.monotonic() - t0, 3)

        DefaultModelLoader.load_weights = load_weights


def generate(path, handler, load_format="safetensors"):
    from vllm import LLM, SamplingParams

    handler.found = {}
    t0 = time.monotonic()
    llm = LLM(model=path, skip_tokenizer_init=True, enforce_eager=True, max_model_len=64, dtype="bfloat16",
              seed=0, distributed_executor_backend="uni", load_format=load_format)
    t_load = time.monotonic() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=1, detokenize=False, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], sp, use_tqdm=False)
    result = []
    for o in outs:
        c = o.outputs[0]
        lps = [step[tok].logprob for step, tok in zip(c.logprobs, c.token_ids)]
        result.append((list(c.token_ids), lps))
    arch = llm.llm_engine.model_config.architecture
    del llm
    gc.collect()
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception:  # noqa: BLE001 (older/newer layouts: nothing to clean then)
        pass
    return dict(outputs=result, llm_s=round(t_load, 2), arch=arch, **handler.found)


def main():
    spec = common.load_spec()
    t0 = time.monotonic()
    import vllm

    handler = LoadTimes()
    common.say(f"vllm {vllm.__version__} imported in {time.monotonic() - t0:.1f} s")
    records = []
    for case in spec["cases"]:
        rec = dict(name=case["name"], ok=False)
        try:
            ref = generate(case["reference"], handler)
            # the mount through vLLM's default loader (safetensors, mmap) and its Run:ai streamer
            loads = {fmt: generate(case["mount"], handler, fmt) for fmt in LOAD_FORMATS}
            mnt = loads["safetensors"]
            same_tokens = {f: all(m[0] == r[0] for m, r in zip(v["outputs"], ref["outputs"])) for f, v in loads.items()}
            same_lps = {f: all(m[1] == r[1] for m, r in zip(v["outputs"], ref["outputs"])) for f, v in loads.items()}
            distinct = {t for toks, _ in ref["outputs"] for t in toks}
            rec.update(mount=mnt, loads=loads, reference=ref, same_tokens=all(same_tokens.values()),
                       same_logprobs=all(same_lps.values()), distinct_tokens=len(distinct))
            # A degenerate model (one token forever) would make equal outputs prove little.
            rec["ok"] = rec["same_tokens"] and rec["same_logprobs"] and len(distinct) >= 4
            verdict = ", ".join(f"{f} {'equal' if same_tokens[f] and same_lps[f] else 'DIFFERENT'}" for f in loads)
            rec["checked"] = (f"{case['name']}: {mnt['arch']} loaded by vLLM from the mount "
                              f"(weights {mnt.get('weights_s', '?')} s, LLM() {mnt['llm_s']} s) and from "
                              f"{case['reference_tool']}'s folder (weights {ref.get('weights_s', '?')} s): "
                              f"{len(PROMPTS)} prompts x {MAX_TOKENS} greedy tokens and their log-probs, "
                              f"mount loaded by --load-format {verdict} to the reference bit for bit "
                              f"({len(distinct)} distinct tokens; first: {ref['outputs'][0][0]})")
            if not rec["ok"] and rec["same_tokens"] and rec["same_logprobs"]:
                rec["checked"] += " -- too few distinct tokens for the comparison to mean anything"
            for f, v in loads.items():
                if not same_tokens[f]:
                    rec["checked"] += f"; {f} from the mount gave {[o[0] for o in v['outputs']]}"
        except Exception as e:  # noqa: BLE001 (the record says what failed; the tier fails on it)
            import traceback

            traceback.print_exc()
            rec["checked"] = f"{case['name']}: vLLM FAILED: {type(e).__name__}: {e}"
        common.say(("ok   " if rec["ok"] else "FAIL ") + rec["checked"])
        records.append(rec)
    common.write_result(spec, records)


if __name__ == "__main__":
    main()
