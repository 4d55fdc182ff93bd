#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The cost of --dtype w4a16 (compressed-tensors' pack-quantized INT4
# computed on read) on a Qwen2.5-0.5B-shaped fp32 actor
# (tests/gen/make_bench_checkpoint.py, world size 8; its hidden 896 and
# MLP 4864 are multiples of the group, 128): through fresh mounts,
# interleaved, RUNS times each,
#   1. the first read of model.safetensors (`cat`), --dtype w4a16 against
#      --dtype bf16;
#   2. a loader's order, safetensors' safe_open reading every tensor by
#      sorted name (a weight's packed values, then its scales: the weight
#      read twice), w4a16 against bf16;
# medians of wall time, daemon CPU, source bytes read (ckfs stats) and
# source MB per daemon CPU-second (MB/s of input per core), and their
# ratios. Figures only, no assertions.
#
#   tests/bench/bench_w4a16.sh [CKFS]    (env: RUNS=5, BENCH_DIR)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CKFS=${1:-$ROOT/build/ckfs}
PY=${PY:-${CKFS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckfs}/venv/bin/python}
RUNS=${RUNS:-5}
DIR=${BENCH_DIR:-/tmp/ckfs-bench}
SRC=$DIR/qwen2.5-0.5b/ckpt # bench.sh's 0.5b checkpoint
MNT=$DIR/mnt-w4a16
mkdir -p "$DIR/qwen2.5-0.5b" "$MNT"
if [ ! -e "$SRC/.bench-complete" ]; then
	rm -rf "$SRC.tmp"
	"$PY" "$ROOT/tests/gen/make_bench_checkpoint.py" "$SRC.tmp" --shape qwen2.5-0.5b
	mv "$SRC.tmp" "$SRC" && touch "$SRC/.bench-complete"
fi
cat "$SRC"/model_world_size_8_rank_*.pt >/dev/null # sources in the page cache

. "$ROOT/tests/bench/first_read.sh"

for f in cat-bf16 cat-w4a16 load-bf16 load-w4a16; do : >"$DIR/w4a16-$f.txt"; done
for i in $(seq "$RUNS"); do
	first_read model.safetensors --dtype bf16 >>"$DIR/w4a16-cat-bf16.txt"
	first_read model.safetensors --dtype w4a16 >>"$DIR/w4a16-cat-w4a16.txt"
	loader_read bf16 >>"$DIR/w4a16-load-bf16.txt"
	loader_read w4a16 >>"$DIR/w4a16-load-w4a16.txt"
done
# MB of source per daemon CPU-second, per run, then the median
per_core() { awk '{ if ($2 > 0) printf "%.1f\n", $3 / 1e6 / $2 }' "$1" | median; }
printf 'w4a16 on read (%s runs each, interleaved; medians)\n' "$RUNS"
printf '  %-16s %9s %10s %12s %16s\n' "" "wall s" "CPU-s" "source MB" "MB/s per core"
for f in cat-bf16 cat-w4a16 load-bf16 load-w4a16; do
	printf '  %-16s %9s %10s %12.0f %16s\n' "$f" "$(col_median 1 "$DIR/w4a16-$f.txt")" \
		"$(col_median 2 "$DIR/w4a16-$f.txt")" "$(echo "$(col_median 3 "$DIR/w4a16-$f.txt") / 1000000" | bc -l)" \
		"$(per_core "$DIR/w4a16-$f.txt")"
done
for k in cat load; do
	printf '  %s: w4a16 / bf16 = %.2fx wall, %.2fx CPU, %.2fx source bytes\n' "$k" \
		"$(echo "$(col_median 1 "$DIR/w4a16-$k-w4a16.txt") / $(col_median 1 "$DIR/w4a16-$k-bf16.txt")" | bc -l)" \
		"$(echo "$(col_median 2 "$DIR/w4a16-$k-w4a16.txt") / $(col_median 2 "$DIR/w4a16-$k-bf16.txt")" | bc -l)" \
		"$(echo "$(col_median 3 "$DIR/w4a16-$k-w4a16.txt") / $(col_median 3 "$DIR/w4a16-$k-bf16.txt")" | bc -l)"
done
