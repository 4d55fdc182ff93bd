#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The daemon's memory against --cache-size (issue 41), on the
# Qwen2.5-0.5B-shaped fp32 actor of bench.sh: 64 MiB, 256 MiB and 1 GiB
# caches under 16 random, strided (tensor-parallel shard) and sequential
# readers, O_DIRECT so that every read reaches the daemon, each for
# SECONDS: throughput beside RssAnon at ready, its peak and the slice
# buffers' peak (tests/bench/bench_memory.py). Give a second binary to
# compare two builds in the same run. Figures only, no assertions.
#
#   tests/bench/bench_memory.sh [CKFS [OTHER_CKFS]]   (env: SECONDS_EACH=20, RUNS=3, BENCH_DIR)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CKFS=${1:-$ROOT/build/ckfs}
PY=${PY:-${CKFS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckfs}/venv/bin/python}
DIR=${BENCH_DIR:-/tmp/ckfs-bench}
SRC=$DIR/qwen2.5-0.5b/ckpt # bench.sh's 0.5b checkpoint
mkdir -p "$DIR/qwen2.5-0.5b"
if [ ! -e "$SRC/.bench-complete" ]; then
	rm -rf "$SRC.tmp"
	"$PY" "$ROOT/tests/gen/make_bench_checkpoint.py" "$SRC.tmp" --shape qwen2.5-0.5b
	mv "$SRC.tmp" "$SRC" && touch "$SRC/.bench-complete"
fi
EXP=$DIR/qwen2.5-0.5b/memory-expected
[ -e "$EXP/model.safetensors" ] || "$CKFS" export -q --force "$SRC" "$EXP"
cat "$SRC"/model_world_size_8_rank_*.pt >/dev/null # sources in the page cache
bins=(--ckfs "$CKFS=this")
[ $# -ge 2 ] && bins+=(--ckfs "$2=other")
echo "memory under readers (16 threads, O_DIRECT, ${SECONDS_EACH:-20} s each)"
python3 "$ROOT/tests/bench/bench_memory.py" "$SRC" "$EXP/model.safetensors" "${bins[@]}" \
	--threads 16 --seconds "${SECONDS_EACH:-20}" --runs "${RUNS:-3}" --direct
