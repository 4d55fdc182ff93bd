#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Cold sources (issue 15, item 3): the rank files evicted from the page
# cache before each measurement (posix_fadvise DONTNEED per file, through
# `dd iflag=nocache count=0`, checked with fincore), then
#   1. `cat` of the rank files one after the other (what one reader gets
#      from this storage), and one `cat` per rank file, all at once (what
#      this storage gives to concurrent readers),
#   2. the first read of model.safetensors through a fresh mount (`cat`;
#      the read-ahead workers keep several rank files in flight),
#   3. `ckfs export` into /dev/shm (tmpfs: the write costs no disk time),
# interleaved, RUNS times each: medians, rates and ratios; and the storage
# the rank files sit on. Figures only, no assertions.
#
#   tests/bench/bench_cold.sh [CKFS]   (env: RUNS=3, BENCH_DIR, BENCH_SIZES=0.5b)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -gt 0 ] && CKFS=$1
. "$ROOT/tests/bench/bench_common.sh"
MNT=$BENCH_DIR/mnt-cold
SHM=/dev/shm/ckfs-bench-cold
mkdir -p "$MNT"
trap 'mountpoint -q "$MNT" && "$CKFS" umount -z "$MNT"; rm -rf "$SHM"' EXIT

evict() { # FILE...: out of the page cache, and check it
	local f left
	sync
	for f in "$@"; do dd if="$f" iflag=nocache count=0 status=none; done
	left=$(fincore -bn -o RES "$@" | awk '{ s += $1 } END { print s + 0 }')
	[ "$left" -lt $((64 << 20)) ] || die "eviction left $left bytes of the rank files cached"
}

for size in $SIZES; do
	D=$(shape_dir "$size")
	CK=$D/ckpt
	RANKS=("$CK"/model_world_size_*_rank_*.pt)
	out=$D/cold.txt
	: >"$out.cat"
	: >"$out.par"
	: >"$out.mount"
	: >"$out.export"
	src_bytes=$(cat "${RANKS[@]}" | wc -c)
	out_bytes=$(stat -c %s "$D/export.ckfs/model.safetensors")
	load0=$(load_now)
	for _ in $(seq "$RUNS"); do
		evict "${RANKS[@]}"
		t=$(t_now)
		cat "${RANKS[@]}" >/dev/null
		echo "$(t_since "$t")" >>"$out.cat"

		evict "${RANKS[@]}"
		t=$(t_now)
		for f in "${RANKS[@]}"; do cat "$f" >/dev/null & done
		wait
		echo "$(t_since "$t")" >>"$out.par"

		evict "${RANKS[@]}"
		"$CKFS" mount --log-level err --cache-size "$BENCH_MOUNT_CACHE" "$CK" "$MNT"
		t=$(t_now)
		cat "$MNT/model.safetensors" >/dev/null
		echo "$(t_since "$t") $(stats_field "$MNT" source_bytes_read)" >>"$out.mount"
		pid=$(stats_field "$MNT" pid)
		"$CKFS" umount "$MNT"
		wait_gone "$pid"

		rm -rf "$SHM"
		evict "${RANKS[@]}"
		t=$(t_now)
		"$CKFS" export -q "$CK" "$SHM"
		echo "$(t_since "$t")" >>"$out.export"
		rm -rf "$SHM"
	done
	c=$(col_median 1 "$out.cat")
	m=$(col_median 1 "$out.mount")
	e=$(col_median 1 "$out.export")
	dev=$(df --output=source "$CK" | tail -1)
	printf '%s cold rank files (%s on %s, %s; %s runs each, interleaved; load %s -> %s)\n' "$size" \
		"$(df --output=fstype "$CK" | tail -1)" "$dev" \
		"$(cat "/sys/class/block/$(basename "$dev")/device/vendor" 2>/dev/null || echo '?') vendor id" \
		"$RUNS" "$load0" "$(load_now)"
	rate() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.2f GB/s", b / s / 1e9 }'; }
	printf '  %-36s %8s s  %s of rank files  (runs: %s)\n' "cat of the rank files, one by one" "$c" \
		"$(rate "$src_bytes" "$c")" "$(paste -sd' ' "$out.cat")"
	p=$(col_median 1 "$out.par")
	printf '  %-36s %8s s  %s of rank files  (runs: %s)  %sx faster than cat\n' "cat of each rank file, all at once" \
		"$p" "$(rate "$src_bytes" "$p")" "$(paste -sd' ' "$out.par")" "$(ratio "$c" "$p")"
	printf '  %-36s %8s s  %s of rank files  (runs: %s)  %sx faster than cat (target >= 1.5x)\n' \
		"ckfs mount: first read (cat)" "$m" "$(rate "$src_bytes" "$m")" \
		"$(cut -d' ' -f1 "$out.mount" | paste -sd' ')" "$(ratio "$c" "$m")"
	printf '  %-36s %8s s  %s of rank files  (runs: %s)  %sx faster than cat\n' \
		"ckfs export to tmpfs" "$e" "$(rate "$src_bytes" "$e")" "$(paste -sd' ' "$out.export")" "$(ratio "$c" "$e")"
	printf '  %-36s %8.2f GB of %.2f GB rank files; served %.2f GB\n' "mount: source bytes read (median)" \
		"$(awk -v v="$(col_median 2 "$out.mount")" 'BEGIN { print v / 1e9 }')" \
		"$(awk -v v="$src_bytes" 'BEGIN { print v / 1e9 }')" "$(awk -v v="$out_bytes" 'BEGIN { print v / 1e9 }')"
done
