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
PY=${PY:-/root/.cache/ckfs/venv/bin/python}
RUNS=${RUNS:-5}
R=${R:-16}
DIR=${BENCH_DIR:-/tmp/ckfs-bench}
SRC=$DIR/qwen2.5-0.5b-lora$R
MNT=$DIR/mnt-lora
mkdir -p "$DIR" "$MNT"
[ -f "$SRC/model_world_size_8_rank_7.pt" ] ||
	"$PY" "$ROOT/tests/gen/make_bench_checkpoint.py" "$SRC" --shape qwen2.5-0.5b --lora "$R"
cat "$SRC"/model_world_size_8_rank_*.pt >/dev/null # sources in the page cache

# one_read MODE: "wall_s cpu_s" of the first cat of model.safetensors
one_read() {
	"$CKFS" mount "$SRC" "$MNT" --lora="$1" 2>/dev/null
	local pid t0 t1 ticks
	pid=$("$CKFS" stats --json "$MNT" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
	t0=$(date +%s.%N)
	cat "$MNT/model.safetensors" >/dev/null
	t1=$(date +%s.%N)
	ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat")
	"$CKFS" umount "$MNT"
	echo "$(echo "$t1 - $t0" | bc) $(echo "scale=3; $ticks / $(getconf CLK_TCK)" | bc)"
}

median() { sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

: >"$DIR/lora-base.txt"
: >"$DIR/lora-fuse.txt"
for i in $(seq "$RUNS"); do
	one_read base >>"$DIR/lora-base.txt"
	one_read fuse >>"$DIR/lora-fuse.txt"
done
bw=$(cut -d' ' -f1 "$DIR/lora-base.txt" | median)
bc_=$(cut -d' ' -f2 "$DIR/lora-base.txt" | median)
fw=$(cut -d' ' -f1 "$DIR/lora-fuse.txt" | median)
fc=$(cut -d' ' -f2 "$DIR/lora-fuse.txt" | median)
size=$("$CKFS" inspect --json --lora=fuse "$SRC" |
	"$PY" -c 'import json,sys; print(json.load(sys.stdin)["totals"]["output_bytes"])')
printf 'LoRA fused on read (r %s, %s runs each, interleaved; medians)\n' "$R" "$RUNS"
printf '  %-22s %8s s wall %8s CPU-s (daemon)\n' "first read, --lora=base" "$bw" "$bc_"
printf '  %-22s %8s s wall %8s CPU-s (daemon)\n' "first read, --lora=fuse" "$fw" "$fc"
printf '  fuse / base: %.2fx wall, %.2fx CPU; %.1f MB served\n' \
	"$(echo "$fw / $bw" | bc -l)" "$(echo "$fc / $bc_" | bc -l)" "$(echo "$size / 1000000" | bc -l)"
