#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Export benchmark (not a test): `ckfs export` vs verl's own merger
# (`python -m verl.model_merger merge --backend fsdp`) on the same
# checkpoint, side by side in one run: wall time and peak RSS, medians of
# RUNS runs (default 3), source files in the page cache. Every run checks
# that the two model.safetensors are byte-identical.
#
#   tests/bench/bench_export.sh [PATH/TO/ckfs]
#
# Environment: BENCH_DIR (default /tmp/ckfs-bench; the checkpoint is made
# there by tests/gen/make_bench_checkpoint.py when missing), RUNS,
# TORCH_PYTHON (a python with torch and verl; default the repository's
# .venv, see tests/setup-venv.sh).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CKFS=${1:-$ROOT/build/ckfs}
BENCH_DIR=${BENCH_DIR:-/tmp/ckfs-bench}
RUNS=${RUNS:-3}
TORCH_PYTHON=${TORCH_PYTHON:-$ROOT/.venv/bin/python}
CK=$BENCH_DIR/ckpt
OUT=$BENCH_DIR/export

[ -x "$CKFS" ] || { echo "no ckfs at $CKFS" >&2; exit 1; }
mkdir -p "$BENCH_DIR"
if ! ls "$CK"/model_world_size_4_rank_3.pt >/dev/null 2>&1; then
	echo "generating the benchmark checkpoint in $CK ..." >&2
	"$TORCH_PYTHON" "$ROOT/tests/gen/make_bench_checkpoint.py" "$CK" >&2
fi
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
measure() { # LABEL CMD...: appends "seconds kbytes" to $BENCH_DIR/LABEL
	local label=$1
	shift
	/usr/bin/time -f "%e %M" -o "$BENCH_DIR/time.$label" "$@" >"$BENCH_DIR/log.$label" 2>&1 ||
		{ cat "$BENCH_DIR/log.$label" >&2; exit 1; }
	cat "$BENCH_DIR/time.$label" >>"$BENCH_DIR/runs.$label"
}

rm -f "$BENCH_DIR"/runs.*
cat "$CK"/model_world_size_*_rank_*.pt >/dev/null # sources in the page cache
for i in $(seq "$RUNS"); do
	rm -rf "$OUT.ckfs" "$OUT.verl"
	measure ckfs "$CKFS" export -q "$CK" "$OUT.ckfs"
	(cd "$BENCH_DIR" && HF_HUB_OFFLINE=1 CUDA_VISIBLE_DEVICES= \
		measure verl "$TORCH_PYTHON" -m verl.model_merger merge --backend fsdp \
		--local_dir "$CK" --target_dir "$OUT.verl")
	cmp "$OUT.ckfs/model.safetensors" "$OUT.verl/model.safetensors" ||
		{ echo "outputs differ" >&2; exit 1; }
done
ck_t=$(cut -d' ' -f1 "$BENCH_DIR/runs.ckfs" | median)
ck_m=$(cut -d' ' -f2 "$BENCH_DIR/runs.ckfs" | median)
vl_t=$(cut -d' ' -f1 "$BENCH_DIR/runs.verl" | median)
vl_m=$(cut -d' ' -f2 "$BENCH_DIR/runs.verl" | median)
in_bytes=$(stat -c %s "$CK"/model_world_size_*_rank_*.pt | awk '{ s += $1 } END { print s }')
out_bytes=$(stat -c %s "$OUT.ckfs/model.safetensors")
awk -v ck="$CK" -v in_b="$in_bytes" -v out_b="$out_bytes" -v runs="$RUNS" \
	-v ct="$ck_t" -v cm="$ck_m" -v vt="$vl_t" -v vm="$vl_m" 'BEGIN {
	printf "checkpoint: %s (%.2f GB of rank files -> %.2f GB model.safetensors), %d runs, medians\n",
		ck, in_b / 1e9, out_b / 1e9, runs
	printf "%-28s %9s %12s\n", "", "wall (s)", "peak RSS"
	printf "%-28s %9.2f %8.0f MiB\n", "ckfs export", ct, cm / 1024
	printf "%-28s %9.2f %8.0f MiB\n", "verl model_merger (fsdp)", vt, vm / 1024
	printf "ratios: ckfs is %.1fx faster and uses 1/%.0f of the memory; outputs byte-identical in every run\n",
		vt / ct, vm / cm
}'
