#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The cost of --dtype w4a16 and nvfp4 (compressed-tensors' pack-quantized
# INT4 and nvfp4-pack-quantized FP4 computed on read) on a
# Qwen2.5-0.5B-shaped fp32 actor (tests/gen/make_bench_checkpoint.py,
# world size 8; its hidden 896 and MLP 4864 are multiples of both groups,
# 128 and 16): through fresh mounts, interleaved, RUNS times each,
#   1. the first read of model.safetensors (`cat`), each against --dtype
#      bf16;
#   2. a loader's order, safetensors' safe_open reading every tensor by
#      sorted name (w4a16: a weight's packed values, then its scales;
#      nvfp4: its global scale first, which reads the whole weight), each
#      against bf16;
# medians of wall time, daemon CPU, source bytes read (ckfs stats) and
# source MB per daemon CPU-second (MB/s of input per core), and their
# ratios. Figures only, no assertions.
#
#   tests/bench/bench_ct_views.sh [CKFS]    (env: RUNS=5, BENCH_DIR, QUANTS="w4a16 nvfp4")
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CKFS=${1:-${CKFS:-$ROOT/build/ckfs}}
RUNS=${RUNS:-5}
. "$ROOT/tests/bench/bench_common.sh" # CKFS PY BENCH_DIR, shape_dir
DIR=$BENCH_DIR
SRC=$(shape_dir 0.5b)/ckpt # bench.sh's 0.5b checkpoint
MNT=$DIR/mnt-ct-views
QUANTS=${QUANTS:-w4a16 nvfp4}
mkdir -p "$MNT"
cat "$SRC"/model_world_size_8_rank_*.pt >/dev/null # sources in the page cache

. "$ROOT/tests/bench/first_read.sh"

for q in bf16 $QUANTS; do : >"$DIR/ct-cat-$q.txt"; : >"$DIR/ct-load-$q.txt"; done
for i in $(seq "$RUNS"); do
	for q in bf16 $QUANTS; do
		first_read model.safetensors --dtype "$q" >>"$DIR/ct-cat-$q.txt"
		loader_read "$q" >>"$DIR/ct-load-$q.txt"
	done
done
# MB of source per daemon CPU-second, per run, then the median
per_core() { awk '{ if ($2 > 0) printf "%.1f\n", $3 / 1e6 / $2 }' "$1" | median; }
col_ratio() { echo "$(col_median "$1" "$2") / $(col_median "$1" "$3")" | bc -l; }
printf 'compressed-tensors views on read (%s runs each, interleaved; medians)\n' "$RUNS"
printf '  %-16s %9s %10s %12s %16s\n' "" "wall s" "CPU-s" "source MB" "MB/s per core"
for k in cat load; do
	for q in bf16 $QUANTS; do
		f=$DIR/ct-$k-$q.txt
		printf '  %-16s %9s %10s %12.0f %16s\n' "$k-$q" "$(col_median 1 "$f")" "$(col_median 2 "$f")" \
			"$(echo "$(col_median 3 "$f") / 1000000" | bc -l)" "$(per_core "$f")"
	done
done
for k in cat load; do
	for q in $QUANTS; do
		printf '  %s: %s / bf16 = %.2fx wall, %.2fx CPU, %.2fx source bytes\n' "$k" "$q" \
			"$(col_ratio 1 "$DIR/ct-$k-$q.txt" "$DIR/ct-$k-bf16.txt")" \
			"$(col_ratio 2 "$DIR/ct-$k-$q.txt" "$DIR/ct-$k-bf16.txt")" \
			"$(col_ratio 3 "$DIR/ct-$k-$q.txt" "$DIR/ct-$k-bf16.txt")"
	done
done
