#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The serving pattern (issue 15, item 2): 8 processes at once, each opening
# model.safetensors with safe_open and reading its tensor-parallel shard of
# every tensor with get_slice (tests/bench/bench_serving.py: vLLM's split,
# q/k/v/gate/up/embed/lm_head on dim 0, o_proj/down_proj on dim 1), through
# a fresh mount (daemon cache cold, rank files in the page cache) against
# the exported copy (in the page cache), interleaved, RUNS times each.
# Prints medians of wall time, their ratio, the checkpoint bytes the daemon
# read (ckfs stats source_bytes_read, against the rank files' size: each
# source byte once?) and the daemon's peak RSS. Figures only, no assertions.
# With PRELOAD=1 each run also serves from a mount with -o preload whose
# preload has finished (the loader started after `preload_done`: what a
# server that starts after the mount gets), in the same interleaving.
#
#   tests/bench/bench_serving.sh [CKFS]   (env: RUNS=3, BENCH_DIR, BENCH_SIZES=0.5b, TP=8, PRELOAD=0)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -gt 0 ] && CKFS=$1
. "$ROOT/tests/bench/bench_common.sh"
TP=${TP:-8}
MNT=$BENCH_DIR/mnt-serving
mkdir -p "$MNT"
trap 'mountpoint -q "$MNT" && "$CKFS" umount -z "$MNT"' EXIT

serve() { # DIR: "seconds tensors bytes"
	"$PY" "$ROOT/tests/bench/bench_serving.py" "$1" "$TP" || die "serving from $1 failed"
}

for size in $SIZES; do
	D=$(shape_dir "$size")
	out=$D/serving.txt
	: >"$out.mount"
	: >"$out.copy"
	: >"$out.preload"
	src_bytes=$(cat "$D"/ckpt/model_world_size_*_rank_*.pt | wc -c)
	load0=$(load_now)
	for _ in $(seq "$RUNS"); do
		cat "$D"/ckpt/model_world_size_*_rank_*.pt >/dev/null
		"$CKFS" mount --log-level err --cache-size "$BENCH_MOUNT_CACHE" "$D/ckpt" "$MNT"
		pid=$(stats_field "$MNT" pid)
		read -r s n b <<<"$(serve "$MNT")"
		echo "$s $(stats_field "$MNT" source_bytes_read) $(hwm_mib "$pid") $n $b" >>"$out.mount"
		"$CKFS" umount "$MNT"
		wait_gone "$pid"
		cat "$D/export.ckfs/model.safetensors" >/dev/null
		read -r s n2 b2 <<<"$(serve "$D/export.ckfs")"
		[ "$n $b" = "$n2 $b2" ] || die "mount gave $n tensors/$b bytes, the copy $n2/$b2"
		echo "$s" >>"$out.copy"
		[ "${PRELOAD:-0}" = 1 ] || continue
		"$CKFS" mount --log-level err --cache-size "$BENCH_MOUNT_CACHE" -o preload "$D/ckpt" "$MNT"
		pid=$(stats_field "$MNT" pid)
		t=$(t_now)
		until [ "$(stats_field "$MNT" preload_done)" = 1 ]; do sleep 0.05; done
		pre=$(t_since "$t")
		read -r s n3 b3 <<<"$(serve "$MNT")"
		[ "$n $b" = "$n3 $b3" ] || die "the preloaded mount gave $n3 tensors/$b3 bytes"
		echo "$s $pre $(stats_field "$MNT" preload_stored)" >>"$out.preload"
		"$CKFS" umount "$MNT"
		wait_gone "$pid"
	done
	m=$(col_median 1 "$out.mount")
	c=$(col_median 1 "$out.copy")
	printf '%s serving, %s processes of safe_open + get_slice (%s runs each, interleaved; load %s -> %s)\n' \
		"$size" "$TP" "$RUNS" "$load0" "$(load_now)"
	printf '  %-34s %8s s  (runs: %s)\n' "exported copy (page cache)" "$c" "$(paste -sd' ' "$out.copy")"
	printf '  %-34s %8s s  (runs: %s)  %sx the copy (target <= 1.3x)\n' "fresh mount" "$m" \
		"$(cut -d' ' -f1 "$out.mount" | paste -sd' ')" "$(ratio "$m" "$c")"
	printf '  %-34s %8.2f GB of %.2f GB rank files (%sx)\n' "source bytes read (median)" \
		"$(awk -v v="$(col_median 2 "$out.mount")" 'BEGIN { print v / 1e9 }')" \
		"$(awk -v v="$src_bytes" 'BEGIN { print v / 1e9 }')" "$(ratio "$(col_median 2 "$out.mount")" "$src_bytes")"
	printf '  %-34s %8s MiB (max %s; cache %s)\n' "daemon peak RSS (median)" "$(col_median 3 "$out.mount")" \
		"$(cut -d' ' -f3 "$out.mount" | sort -n | tail -1)" "$BENCH_MOUNT_CACHE"
	[ -s "$out.preload" ] || continue
	p=$(col_median 1 "$out.preload")
	printf '  %-34s %8s s  (runs: %s)  %sx the copy; the preload took %s s before, storing %.2f GB\n' \
		"mount -o preload, once it is done" "$p" "$(cut -d' ' -f1 "$out.preload" | paste -sd' ')" \
		"$(ratio "$p" "$c")" "$(col_median 2 "$out.preload")" \
		"$(awk -v v="$(col_median 3 "$out.preload")" 'BEGIN { print v / 1e9 }')"
done
