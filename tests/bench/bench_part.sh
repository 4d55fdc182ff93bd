#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ckfs export --part I/N on one machine: bench.sh's Qwen2.5-0.5B-shaped
# fp32 actor (world size 8, 1.98 GB of rank files, in the page cache)
# exported with --max-shard-size 100MB (10 weight files) as one export,
# and as N = 1, 2 and 4 parts run at once, the same total threads (the
# CPUs) spread over the parts; interleaved, RUNS times each. Prints the
# medians of wall time and of the CPU seconds all processes took (user +
# system), and each against the one export. On one machine the parts
# share its CPUs and page cache, so this measures what splitting costs,
# not what N nodes gain (docs/benchmarks.md: the paper model for that).
# Figures only, no assertions.
#
#   tests/bench/bench_part.sh [CKFS]    (env: RUNS=5, BENCH_DIR)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CKFS=${1:-${CKFS:-$ROOT/build/ckfs}}
RUNS=${RUNS:-5}
. "$ROOT/tests/bench/bench_common.sh" # CKFS PY BENCH_DIR, shape_dir
DIR=$BENCH_DIR
SRC=$(shape_dir 0.5b)/ckpt # bench.sh's 0.5b checkpoint
OUT=$DIR/part-out
CPUS=$(nproc)
cat "$SRC"/model_world_size_8_rank_*.pt >/dev/null # sources in the page cache

# run N: "wall_s cpu_s" of one export (N 0) or N parts at once
run() {
	local n=$1 t0 t1 times=$DIR/part-times.txt pids=()
	rm -rf "$OUT" "$OUT.ckfs-parts" "$times"
	sync
	t0=$(date +%s.%N)
	if [ "$n" = 0 ]; then
		/usr/bin/time -a -o "$times" -f '%U %S' "$CKFS" export -q --max-shard-size 100MB "$SRC" "$OUT"
	else
		local th=$((CPUS / n))
		[ "$th" -ge 1 ] || th=1
		for i in $(seq 0 $((n - 1))); do
			/usr/bin/time -a -o "$times" -f '%U %S' "$CKFS" export -q --max-shard-size 100MB \
				--threads "$th" --part "$i/$n" "$SRC" "$OUT" &
			pids+=($!)
		done
		for p in "${pids[@]}"; do wait "$p"; done
	fi
	sync
	t1=$(date +%s.%N)
	echo "$(echo "$t1 - $t0" | bc) $(awk '{ s += $1 + $2 } END { print s }' "$times")"
}
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

modes="0 1 2 4"
for m in $modes; do : >"$DIR/part-$m.txt"; done
for _ in $(seq "$RUNS"); do
	for m in $modes; do run "$m" >>"$DIR/part-$m.txt"; done
done
rm -rf "$OUT"
printf 'export --part on one machine (%s CPUs, %s runs each, interleaved; medians; load %s)\n' \
	"$CPUS" "$RUNS" "$(cut -d' ' -f1-3 /proc/loadavg)"
w0=$(cut -d' ' -f1 "$DIR/part-0.txt" | median)
c0=$(cut -d' ' -f2 "$DIR/part-0.txt" | median)
for m in $modes; do
	w=$(cut -d' ' -f1 "$DIR/part-$m.txt" | median)
	c=$(cut -d' ' -f2 "$DIR/part-$m.txt" | median)
	printf '  %-14s wall %6.2f s (%.2fx)   CPU %6.2f s (%.2fx)\n' \
		"$([ "$m" = 0 ] && echo "one export" || echo "parts: $m")" "$w" "$(echo "$w / $w0" | bc -l)" \
		"$c" "$(echo "$c / $c0" | bc -l)"
done
