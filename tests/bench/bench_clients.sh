#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The client tier's loaders, timed (issue #24): vLLM (CPU build), the Run:ai
# Model Streamer and fastsafetensors, each in its venv of
# tests/clients/setup-client-venvs.sh, load the bench checkpoints' model
# through a fresh mount (daemon cache cold, rank files in the page cache)
# and from the exported copy (in the page cache), interleaved, RUNS times
# each, one fresh process per load (tests/bench/bench_clients.py). Prints
# medians, their ratio, vLLM's weight-loading phase apart from its start-up,
# and the checkpoint bytes the daemon read (ckfs stats). Figures only.
#
#   tests/bench/bench_clients.sh [CKFS]   (env: RUNS=3, BENCH_DIR, BENCH_SIZES="0.5b 1.5b",
#                                          CLIENTS="vllm runai fastsafetensors")
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -gt 0 ] && CKFS=$1
BENCH_SIZES=${BENCH_SIZES:-0.5b 1.5b}
. "$ROOT/tests/bench/bench_common.sh"
CLIENTS=${CLIENTS:-vllm runai fastsafetensors}
CACHE=${CKFS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckfs}
MNT=$BENCH_DIR/mnt-clients
mkdir -p "$MNT"
trap 'mountpoint -q "$MNT" && "$CKFS" umount -z "$MNT"' EXIT
sh "$ROOT/tests/clients/setup-client-venvs.sh" >&2

venv_of() { case $1 in vllm) echo vllm-cpu ;; *) echo "$1" ;; esac; }
load() { # CLIENT DIR: the client's JSON line
	VLLM_LOGGING_LEVEL=WARNING "$CACHE/client-$(venv_of "$1")/bin/python" \
		"$ROOT/tests/bench/bench_clients.py" "$1" "$2" 2>"$BENCH_DIR/clients-last.log" | tail -1 ||
		{ tail -20 "$BENCH_DIR/clients-last.log" >&2; die "$1 on $2 failed"; }
}
field() { "$PY" -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2]); print("-" if v is None else v)' "$1" "$2"; }

for size in $SIZES; do
	D=$(shape_dir "$size")
	src_bytes=$(cat "$D"/ckpt/model_world_size_*_rank_*.pt | wc -c)
	out_bytes=$(stat -c %s "$D/export.ckfs/model.safetensors")
	for client in $CLIENTS; do
		out=$D/clients-$client.txt
		: >"$out.mount"
		: >"$out.copy"
		load0=$(load_now)
		for _ in $(seq "$RUNS"); do
			cat "$D"/ckpt/model_world_size_*_rank_*.pt >/dev/null
			"$CKFS" mount --log-level err --cache-size "$BENCH_MOUNT_CACHE" "$D/ckpt" "$MNT"
			j=$(load "$client" "$MNT")
			echo "$(field "$j" seconds) $(field "$j" weights_s) $(stats_field "$MNT" source_bytes_read) $(field "$j" process_s)" >>"$out.mount"
			"$CKFS" umount "$MNT"
			cat "$D/export.ckfs/model.safetensors" >/dev/null
			j=$(load "$client" "$D/export.ckfs")
			echo "$(field "$j" seconds) $(field "$j" weights_s) 0 $(field "$j" process_s)" >>"$out.copy"
		done
		m=$(col_median 1 "$out.mount")
		c=$(col_median 1 "$out.copy")
		printf '%s %s: load of %.2f GB (%s runs each, interleaved; load %s -> %s)\n' "$size" "$client" \
			"$(awk -v v="$out_bytes" 'BEGIN { print v / 1e9 }')" "$RUNS" "$load0" "$(load_now)"
		printf '  %-30s %8s s  (runs: %s)\n' "exported copy (page cache)" "$c" "$(cut -d' ' -f1 "$out.copy" | paste -sd' ')"
		printf '  %-30s %8s s  (runs: %s)  %sx the copy\n' "fresh mount" "$m" \
			"$(cut -d' ' -f1 "$out.mount" | paste -sd' ')" "$(ratio "$m" "$c")"
		if [ "$client" = vllm ]; then
			printf '  %-30s %8s s mount, %s s copy (median)\n' "weight loading phase" \
				"$(col_median 2 "$out.mount")" "$(col_median 2 "$out.copy")"
			printf '  %-30s %8s s mount, %s s copy (median)\n' "process start to loaded" \
				"$(col_median 4 "$out.mount")" "$(col_median 4 "$out.copy")"
		fi
		printf '  %-30s %8.2f GB of %.2f GB rank files (%sx)\n' "source bytes read (median)" \
			"$(awk -v v="$(col_median 3 "$out.mount")" 'BEGIN { print v / 1e9 }')" \
			"$(awk -v v="$src_bytes" 'BEGIN { print v / 1e9 }')" "$(ratio "$(col_median 3 "$out.mount")" "$src_bytes")"
	done
done
