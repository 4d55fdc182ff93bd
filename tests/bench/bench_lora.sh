#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The cost of fusing LoRA on read: the first read of model.safetensors
# through a fresh mount with --lora=fuse (W + scale * B @ A for every
# adapted weight) against --lora=base (the same base bytes, not fused), on a
# Qwen2.5-0.5B-shaped LoRA actor (rank 16 on the seven projections, world
# size 8) written by tests/gen/make_bench_checkpoint.py --lora. The two are
# run interleaved, RUNS times each; the figures are medians of wall time and
# of the daemon's CPU time (utime + stime from /proc, read before unmount),
# and their ratios. Figures only, no assertions.
#
#   tests/bench/bench_lora.sh [CKFS]    (env: RUNS=5, BENCH_DIR, R=16)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CKFS=${1:-$ROOT/build/ckfs}
PY=${PY:-${CKFS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckfs}/venv/bin/python}
RUNS=${RUNS:-5}
R=${R:-16}
DIR=${BENCH_DIR:-/tmp/ckfs-bench}
SRC=$DIR/qwen2.5-0.5b-lora$R
MNT=$DIR/mnt-lora
mkdir -p "$DIR" "$MNT"
[ -f "$SRC/model_world_size_8_rank_7.pt" ] ||
	"$PY" "$ROOT/tests/gen/make_bench_checkpoint.py" "$SRC" --shape qwen2.5-0.5b --lora "$R"
cat "$SRC"/model_world_size_8_rank_*.pt >/dev/null # sources in the page cache

. "$ROOT/tests/bench/first_read.sh"

: >"$DIR/lora-base.txt"
: >"$DIR/lora-fuse.txt"
for i in $(seq "$RUNS"); do
	first_read model.safetensors --lora=base >>"$DIR/lora-base.txt"
	first_read model.safetensors --lora=fuse >>"$DIR/lora-fuse.txt"
done
bw=$(col_median 1 "$DIR/lora-base.txt")
bc_=$(col_median 2 "$DIR/lora-base.txt")
fw=$(col_median 1 "$DIR/lora-fuse.txt")
fc=$(col_median 2 "$DIR/lora-fuse.txt")
size=$("$CKFS" inspect --json --lora=fuse "$SRC" |
	"$PY" -c 'import json,sys; print(json.load(sys.stdin)["totals"]["output_bytes"])')
printf 'LoRA fused on read (r %s, %s runs each, interleaved; medians)\n' "$R" "$RUNS"
printf '  %-22s %8s s wall %8s CPU-s (daemon)\n' "first read, --lora=base" "$bw" "$bc_"
printf '  %-22s %8s s wall %8s CPU-s (daemon)\n' "first read, --lora=fuse" "$fw" "$fc"
printf '  fuse / base: %.2fx wall, %.2fx CPU; %.1f MB served\n' \
	"$(echo "$fw / $bw" | bc -l)" "$(echo "$fc / $bc_" | bc -l)" "$(echo "$size / 1000000" | bc -l)"
