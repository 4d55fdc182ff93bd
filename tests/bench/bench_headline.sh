#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The headline (issue 15, item 5): time to a loaded model. From the verl
# FSDP checkpoint (rank files in the page cache) to a transformers model
# on the CPU with every page of every parameter touched:
#   ckfs:  `ckfs mount` (returns when ready), then from_pretrained of the
#          mount (tests/bench/bench_readers.py, a fresh process); and the
#          same with `-o preload` (issue 28: the weight files stored into
#          the page cache from the mount's start, while Python starts)
#   verl:  `python -m verl.model_merger merge --backend fsdp` (the whole
#          command, as one runs it), then from_pretrained of its output
# and, beside them, `ckfs export` then from_pretrained of the copy. The
# loader's figure excludes its Python start and imports (the same for all
# three, bench_readers.py); verl's merger is timed as a whole. Interleaved,
# RUNS times each; medians and the ratio. Figures only, no assertions.
#
#   tests/bench/bench_headline.sh [CKFS]   (env: RUNS=3, BENCH_DIR, BENCH_SIZES=0.5b)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -gt 0 ] && CKFS=$1
. "$ROOT/tests/bench/bench_common.sh"
MNT=$BENCH_DIR/mnt-headline
mkdir -p "$MNT"
trap 'mountpoint -q "$MNT" && "$CKFS" umount -z "$MNT"' EXIT

load() { # DIR: seconds of from_pretrained + touching every page
	local line
	line=$("$PY" "$ROOT/tests/bench/bench_readers.py" from_pretrained "$1") || die "from_pretrained of $1 failed"
	echo "${line%% *}"
}

for size in $SIZES; do
	D=$(shape_dir "$size")
	CK=$D/ckpt
	out=$D/headline.txt
	: >"$out.ckfs"
	: >"$out.preload"
	: >"$out.verl"
	: >"$out.export"
	load0=$(load_now)
	for _ in $(seq "$RUNS"); do
		cat "$CK"/model_world_size_*_rank_*.pt >/dev/null
		t=$(t_now)
		"$CKFS" mount --log-level err --cache-size "$BENCH_MOUNT_CACHE" "$CK" "$MNT"
		m=$(t_since "$t")
		l=$(load "$MNT")
		echo "$(awk -v a="$m" -v b="$l" 'BEGIN { printf "%.3f", a + b }') $m $l" >>"$out.ckfs"
		pid=$(stats_field "$MNT" pid)
		"$CKFS" umount "$MNT"
		wait_gone "$pid"

		cat "$CK"/model_world_size_*_rank_*.pt >/dev/null
		t=$(t_now)
		"$CKFS" mount --log-level err --cache-size "$BENCH_MOUNT_CACHE" -o preload "$CK" "$MNT"
		m=$(t_since "$t")
		l=$(load "$MNT")
		echo "$(awk -v a="$m" -v b="$l" 'BEGIN { printf "%.3f", a + b }') $m $l" >>"$out.preload"
		pid=$(stats_field "$MNT" pid)
		"$CKFS" umount "$MNT"
		wait_gone "$pid"

		rm -rf "$D/headline.verl"
		cat "$CK"/model_world_size_*_rank_*.pt >/dev/null
		t=$(t_now)
		(cd "$D" && "$PY" -m verl.model_merger merge --backend fsdp --local_dir "$CK" \
			--target_dir "$D/headline.verl" >"$D/headline-verl.log" 2>&1) ||
			{ cat "$D/headline-verl.log" >&2; die "verl's merger failed"; }
		m=$(t_since "$t")
		l=$(load "$D/headline.verl")
		echo "$(awk -v a="$m" -v b="$l" 'BEGIN { printf "%.3f", a + b }') $m $l" >>"$out.verl"
		rm -rf "$D/headline.verl"

		rm -rf "$D/headline.export"
		cat "$CK"/model_world_size_*_rank_*.pt >/dev/null
		t=$(t_now)
		"$CKFS" export -q "$CK" "$D/headline.export"
		m=$(t_since "$t")
		l=$(load "$D/headline.export")
		echo "$(awk -v a="$m" -v b="$l" 'BEGIN { printf "%.3f", a + b }') $m $l" >>"$out.export"
		rm -rf "$D/headline.export"
	done
	c=$(col_median 1 "$out.ckfs")
	v=$(col_median 1 "$out.verl")
	e=$(col_median 1 "$out.export")
	p=$(col_median 1 "$out.preload")
	printf '%s time to a loaded model (from_pretrained, every page touched; %s runs each, interleaved; load %s -> %s)\n' \
		"$size" "$RUNS" "$load0" "$(load_now)"
	printf '  %-32s %8s s  (%s s + %s s; runs: %s)\n' "verl merger + from_pretrained" "$v" \
		"$(col_median 2 "$out.verl")" "$(col_median 3 "$out.verl")" "$(cut -d' ' -f1 "$out.verl" | paste -sd' ')"
	printf '  %-32s %8s s  (%s s + %s s; runs: %s)  %sx faster than verl (target >= 5x)\n' \
		"ckfs mount + from_pretrained" "$c" "$(col_median 2 "$out.ckfs")" "$(col_median 3 "$out.ckfs")" \
		"$(cut -d' ' -f1 "$out.ckfs" | paste -sd' ')" "$(ratio "$v" "$c")"
	printf '  %-32s %8s s  (%s s + %s s; runs: %s)  %sx faster than verl (target >= 5x)\n' \
		"ckfs mount -o preload + load" "$p" "$(col_median 2 "$out.preload")" "$(col_median 3 "$out.preload")" \
		"$(cut -d' ' -f1 "$out.preload" | paste -sd' ')" "$(ratio "$v" "$p")"
	printf '  %-32s %8s s  (%s s + %s s; runs: %s)  %sx faster than verl\n' \
		"ckfs export + from_pretrained" "$e" "$(col_median 2 "$out.export")" "$(col_median 3 "$out.export")" \
		"$(cut -d' ' -f1 "$out.export" | paste -sd' ')" "$(ratio "$v" "$e")"
done
