#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Preload (issue 28, item 2): a loader's first load through a mount with
# and without -o preload, beside the exported copy (in the page cache).
# Each run, interleaved: rank files warmed, `ckfs mount` (timed; returns
# when ready), then a fresh Python process that imports transformers and
# runs from_pretrained with every page of every parameter touched
# (tests/bench/bench_readers.py). Per arm: the loader's own figure (the
# clock starts after its imports, so with preload the daemon has had the
# interpreter's start to work), the process's wall time, and mount + that
# wall time: what a user waits from `ckfs mount` to a loaded model. Beside
# them, how long the preload alone takes to store the file (a mount with
# nobody reading, polled until the stats say done). Medians, ratios to the
# copy, the load average before and after. Figures only, no assertions.
#
#   tests/bench/bench_preload.sh [CKFS]   (env: RUNS=5, BENCH_SIZES=0.5b, BENCH_DIR)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -gt 0 ] && CKFS=$1
RUNS=${RUNS:-5}
. "$ROOT/tests/bench/bench_common.sh"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ckfs-bench-preload.XXXXXX")
MNT=$WORK/mnt
mkdir -p "$MNT"
trap 'mountpoint -q "$MNT" && "$CKFS" umount -z "$MNT"; rm -rf "$WORK"' EXIT

# load DIR: "LOADER_S WALL_S" of a fresh from_pretrained process
load() {
	local t line
	t=$(t_now)
	line=$("$PY" "$ROOT/tests/bench/bench_readers.py" from_pretrained "$1") || die "from_pretrained of $1 failed"
	echo "${line%% *} $(t_since "$t")"
}
mount_ck() { # extra -o keys (may be empty)
	"$CKFS" mount --log-level err --cache-size "$BENCH_MOUNT_CACHE" ${1:+-o "$1"} "$CK" "$MNT"
}
umount_ck() {
	local pid
	pid=$(stats_field "$MNT" pid)
	"$CKFS" umount "$MNT"
	wait_gone "$pid"
}
# arm NAME OPTS: one mount + load, appended to $out.NAME as
# "TOTAL MOUNT LOADER WALL READS"
arm() {
	local t m l r
	cat "$CK"/model_world_size_*_rank_*.pt >/dev/null
	t=$(t_now)
	mount_ck "$2"
	m=$(t_since "$t")
	l=$(load "$MNT")
	r=$(stats_field "$MNT" reads)
	umount_ck
	echo "$(awk -v a="$m" -v b="${l#* }" 'BEGIN { printf "%.3f", a + b }') $m $l $r" >>"$out.$1"
}

for size in $SIZES; do
	case $size in
	0.5b) shape=qwen2.5-0.5b ;;
	1.5b) shape=qwen2.5-1.5b ;;
	*) die "size '$size': only 0.5b and 1.5b" ;;
	esac
	CK=$BENCH_DIR/$shape/ckpt
	[ -e "$CK/.bench-complete" ] || CK=$(shape_dir "$size")/ckpt
	"$CKFS" export -q "$CK" "$WORK/copy"
	bytes=$(stat -c %s "$WORK/copy/model.safetensors")
	out=$WORK/$size
	: >"$out.plain"
	: >"$out.preload"
	: >"$out.copy"
	: >"$out.alone"
	load0=$(load_now)
	for _ in $(seq "$RUNS"); do
		arm plain ""
		arm preload preload
		cat "$WORK/copy/model.safetensors" >/dev/null
		echo "$(load "$WORK/copy" | awk '{ printf "%s 0 %s %s 0", $2, $1, $2 }')" >>"$out.copy"
		# The preload alone: mount, then the stats polled until done.
		cat "$CK"/model_world_size_*_rank_*.pt >/dev/null
		t=$(t_now)
		mount_ck preload
		while [ "$(stats_field "$MNT" preload_done)" != 1 ]; do sleep 0.02; done
		echo "$(t_since "$t") $(stats_field "$MNT" preload_stored)" >>"$out.alone"
		umount_ck
	done
	printf '%s first load through a mount, with and without -o preload (%s, %s runs each, interleaved; load %s -> %s)\n' \
		"$size" "$(awk -v b="$bytes" 'BEGIN { printf "%.2f GB", b / 1e9 }')" "$RUNS" "$load0" "$(load_now)"
	cl=$(col_median 3 "$out.copy")
	cw=$(col_median 4 "$out.copy")
	for a in copy plain preload; do
		case $a in
		copy) label="exported copy (page cache)" ;;
		plain) label="ckfs mount" ;;
		preload) label="ckfs mount -o preload" ;;
		esac
		l=$(col_median 3 "$out.$a")
		w=$(col_median 4 "$out.$a")
		printf '  %-28s loader %6s s (%sx copy)  process %6s s  mount %6s s  mount+process %6s s (%sx copy)  READs %s\n' \
			"$label" "$l" "$(ratio "$l" "$cl")" "$w" "$(col_median 2 "$out.$a")" \
			"$(col_median 1 "$out.$a")" "$(ratio "$(col_median 1 "$out.$a")" "$cw")" \
			"$(col_median 5 "$out.$a")"
		printf '  %-28s loader runs: %s\n' "" "$(cut -d' ' -f3 "$out.$a" | paste -sd' ')"
	done
	printf '  %-28s %s s from `ckfs mount` to all stored (%s GB/s; runs: %s)\n' "preload alone" \
		"$(col_median 1 "$out.alone")" \
		"$(awk -v b="$bytes" -v t="$(col_median 1 "$out.alone")" 'BEGIN { printf "%.2f", b / 1e9 / t }')" \
		"$(cut -d' ' -f1 "$out.alone" | paste -sd' ')"
	rm -rf "$WORK/copy"
done
