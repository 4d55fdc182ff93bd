#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The cost of --dtype fp8 (block-wise FP8 computed on read) on a
# Qwen2.5-0.5B-shaped fp32 actor (tests/gen/make_bench_checkpoint.py, world
# size 8): through fresh mounts, interleaved, RUNS times each,
#   1. `cat model.safetensors` with --dtype fp8 against --dtype bf16 (the
#      file order: every weight's scales come first, so the quantized
#      weights' sources are read twice);
#   2. a loader's order, safetensors' safe_open reading every tensor by
#      sorted name (a weight before its scales, as vLLM and transformers
#      iterate them), fp8 against bf16;
# medians of wall time, daemon CPU and source bytes read (ckfs stats), and
# their ratios. Figures only, no assertions.
#
#   tests/bench/bench_fp8.sh [CKFS]    (env: RUNS=5, BENCH_DIR)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CKFS=${1:-$ROOT/build/ckfs}
PY=${PY:-${CKFS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckfs}/venv/bin/python}
RUNS=${RUNS:-5}
DIR=${BENCH_DIR:-/tmp/ckfs-bench}
SRC=$DIR/qwen2.5-0.5b/ckpt # bench.sh's 0.5b checkpoint
MNT=$DIR/mnt-fp8
mkdir -p "$DIR/qwen2.5-0.5b" "$MNT"
if [ ! -e "$SRC/.bench-complete" ]; then
	rm -rf "$SRC.tmp"
	"$PY" "$ROOT/tests/gen/make_bench_checkpoint.py" "$SRC.tmp" --shape qwen2.5-0.5b
	mv "$SRC.tmp" "$SRC" && touch "$SRC/.bench-complete"
fi
cat "$SRC"/model_world_size_8_rank_*.pt >/dev/null # sources in the page cache

. "$ROOT/tests/bench/first_read.sh"

for f in cat-bf16 cat-fp8 load-bf16 load-fp8; do : >"$DIR/fp8-$f.txt"; done
for i in $(seq "$RUNS"); do
	first_read model.safetensors --dtype bf16 >>"$DIR/fp8-cat-bf16.txt"
	first_read model.safetensors --dtype fp8 >>"$DIR/fp8-cat-fp8.txt"
	loader_read bf16 >>"$DIR/fp8-load-bf16.txt"
	loader_read fp8 >>"$DIR/fp8-load-fp8.txt"
done
printf 'fp8 on read (%s runs each, interleaved; medians)\n' "$RUNS"
printf '  %-26s %9s %10s %12s\n' "" "wall s" "CPU-s" "source MB"
for f in cat-bf16 cat-fp8 load-bf16 load-fp8; do
	printf '  %-26s %9s %10s %12.0f\n' "$f" "$(col_median 1 "$DIR/fp8-$f.txt")" \
		"$(col_median 2 "$DIR/fp8-$f.txt")" "$(echo "$(col_median 3 "$DIR/fp8-$f.txt") / 1000000" | bc -l)"
done
for k in cat load; do
	printf '  %s: fp8 / bf16 = %.2fx wall, %.2fx CPU, %.2fx source bytes\n' "$k" \
		"$(echo "$(col_median 1 "$DIR/fp8-$k-fp8.txt") / $(col_median 1 "$DIR/fp8-$k-bf16.txt")" | bc -l)" \
		"$(echo "$(col_median 2 "$DIR/fp8-$k-fp8.txt") / $(col_median 2 "$DIR/fp8-$k-bf16.txt")" | bc -l)" \
		"$(echo "$(col_median 3 "$DIR/fp8-$k-fp8.txt") / $(col_median 3 "$DIR/fp8-$k-bf16.txt")" | bc -l)"
done
