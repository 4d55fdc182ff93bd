#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Checkpoints in an object store (issue "Past one machine", item 6): the
# bench actor uploaded to a SeaweedFS on loopback (tests/s3/seaweedfs.sh),
# then, side by side in one run, RUNS times each, interleaved:
#   (a) download + export: `aws s3 cp --recursive` (awscli, pinned, its own
#       venv) of the step, then `ckfs export` of the copy, against
#       `ckfs export s3://...` directly;
#   (b) 8 nodes: 8 mounts of the same s3:// step (8 daemons), each read by
#       one tensor-parallel worker taking its shard of every tensor
#       (bench_serving.py's split); the bytes all 8 daemons fetched from the
#       store against one copy of the rank files, and the wall time, with
#       the mount's defaults and with options for shard readers (SHARD_OPTS),
#       beside 8 mounts of the step on local disk, and the least any mount
#       can fetch for these readers (tp_page_floor.py);
#   (c) first byte of model.safetensors from `ckfs mount` on, s3:// against
#       local disk (rank files and the store's files in the page cache).
# Figures only, no assertions: medians, ratios, the load.
#
#   tests/bench/bench_s3.sh [CKFS]   (env: RUNS=3, BENCH_DIR, BENCH_SIZES=0.5b)
#
# More env: PARTS=abc (the parts to run); DELAY_MS=N: every request
# reaches the store N ms late after the upload (tests/bench/latency_proxy.py,
# as a store across a network would answer; loopback has no latency);
# WHERE="s3 s3-shard local" (part (b)'s mounts); CKFS_BEFORE=BINARY adds
# "s3-before" to them: the same s3 mounts by another build, interleaved.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -gt 0 ] && CKFS=$1
. "$ROOT/tests/bench/bench_common.sh"
. "$ROOT/tests/s3/seaweedfs.sh"
TP=8
# Mount options for a node that reads its shard alone: small slices, no
# read-ahead by the daemon or (beyond a page) the kernel.
SHARD_OPTS=${SHARD_OPTS:-slice_size=64KiB,readahead=0,kernel_readahead=4KiB}
PARTS=${PARTS:-abc} WHERE=${WHERE:-s3 s3-shard local}
[ -n "${CKFS_BEFORE:-}" ] && WHERE="s3-before $WHERE"
MOUNTS=() PROXY=
session_cleanup() {
	for m in "${MOUNTS[@]}"; do
		mountpoint -q "$m" && "$CKFS" umount -z "$m"
	done
	[ -z "$PROXY" ] || kill "$PROXY"
}

awscli_install || die "cannot install awscli"
seaweedfs_session W "$BENCH_DIR/s3.XXXXXX" bench || die "no SeaweedFS"

mount_at() { # SRC MOUNTPOINT [OPTIONS...]
	mkdir -p "$2"
	"${MOUNT_CKFS:-$CKFS}" mount "${@:3}" "$1" "$2" || die "mount $1 failed"
	MOUNTS+=("$2")
}
umount_all() {
	for m in "${MOUNTS[@]}"; do
		"$CKFS" umount "$m"
	done
	MOUNTS=()
}

for size in $SIZES; do
	D=$(shape_dir "$size")
	URL=s3://bench/$size
	t=$(t_now)
	s3_put_tree "$D/ckpt" "$AWS_ENDPOINT_URL/bench/$size" || die "upload failed"
	model=$(du -cb "$D"/ckpt/*.pt | tail -1 | cut -f1)
	echo "== $size: uploaded $(du -sh "$D/ckpt" | cut -f1) in $(t_since "$t") s; rank files $model bytes; load $(load_now)"
	if [ -n "${DELAY_MS:-}" ] && [ -z "$PROXY" ]; then
		port=${AWS_ENDPOINT_URL##*:}
		coproc LAT { exec python3 "$ROOT/tests/bench/latency_proxy.py" "$port" "$DELAY_MS"; }
		PROXY=$LAT_PID
		read -r lport <&"${LAT[0]}" || die "the latency proxy did not start"
		export AWS_ENDPOINT_URL=http://127.0.0.1:$lport
		echo "   every request $DELAY_MS ms late from here on (tests/bench/latency_proxy.py)"
	fi

	: >"$W/a.txt" >"$W/b.txt" >"$W/c.txt"
	for run in $(seq 1 "$RUNS"); do
		# (a) download then export, against export from the store
		case $PARTS in *a*) ;; *) false ;; esac && {
		rm -rf "$W/dl" "$W/out1" "$W/out2"
		t=$(t_now)
		"$AWSCLI/bin/python" -m awscli s3 cp --quiet --recursive --endpoint-url "$AWS_ENDPOINT_URL" \
			"$URL" "$W/dl" || die "aws s3 cp failed"
		t_dl=$(t_since "$t")
		"$CKFS" export -q "$W/dl" "$W/out1"
		t_dlx=$(t_since "$t")
		t=$(t_now)
		"$CKFS" export -q "$URL" "$W/out2"
		t_direct=$(t_since "$t")
		cmp -s "$W/out1/model.safetensors" "$W/out2/model.safetensors" ||
			die "export from the store differs from export of the download"
		echo "$t_dl $t_dlx $t_direct" >>"$W/a.txt"
		rm -rf "$W/dl" "$W/out1" "$W/out2"
		}

		# (b) 8 nodes, 8 mounts, one TP shard each; local disk beside it
		for where in $WHERE; do
			case $PARTS in *b*) ;; *) break ;; esac
			src=$URL opts=() MOUNT_CKFS=
			[ "$where" = local ] && src=$D/ckpt
			[ "$where" = s3-shard ] && opts=(-o "$SHARD_OPTS")
			[ "$where" = s3-before ] && MOUNT_CKFS=$CKFS_BEFORE
			dirs=
			for r in $(seq 0 $((TP - 1))); do
				mount_at "$src" "$W/m$r" "${opts[@]}"
				dirs+="${dirs:+,}$W/m$r"
			done
			MOUNT_CKFS=
			read -r secs _ bytes < <("$PY" "$ROOT/tests/bench/bench_serving.py" "$dirs" "$TP")
			fetched=0 requests=0
			for r in $(seq 0 $((TP - 1))); do
				fetched=$((fetched + $(stats_field "$W/m$r" store_bytes)))
				requests=$((requests + $(stats_field "$W/m$r" store_requests)))
			done
			umount_all
			echo "$where $secs $bytes $fetched $requests" >>"$W/b.txt"
		done

		# (c) first byte after the mount returns
		for where in s3 local; do
			case $PARTS in *c*) ;; *) break ;; esac
			src=$URL
			[ "$where" = local ] && src=$D/ckpt
			t=$(t_now)
			mount_at "$src" "$W/first"
			t_mount=$(t_since "$t")
			head -c 1 "$W/first/model.safetensors" >/dev/null
			echo "$where $t_mount $(t_since "$t")" >>"$W/c.txt"
			umount_all
		done
	done

	case $PARTS in *a*)
	echo "(a) download + export vs export from the store (s, median of $RUNS)"
	dl=$(col_median 1 "$W/a.txt") dlx=$(col_median 2 "$W/a.txt") direct=$(col_median 3 "$W/a.txt")
	printf '    aws s3 cp --recursive       %8.2f\n' "$dl"
	printf '    + ckfs export of the copy   %8.2f\n' "$dlx"
	printf '    ckfs export s3://           %8.2f   (%sx faster)\n' "$direct" "$(ratio "$dlx" "$direct")"
	;; esac
	case $PARTS in *b*)
	echo "(b) $TP nodes, $TP mounts, one tensor-parallel shard each (median of $RUNS)"
	for where in $WHERE; do
		grep "^$where " "$W/b.txt" | cut -d' ' -f2- >"$W/b.$where"
		secs=$(col_median 1 "$W/b.$where")
		if [ "$where" != local ]; then
			fetched=$(col_median 3 "$W/b.$where") requests=$(col_median 4 "$W/b.$where")
			printf '    %-10s %7.2f s; fetched %s bytes = %sx one copy of the rank files, in %s requests\n' \
				"$where" "$secs" "$fetched" "$(ratio "$fetched" "$model")" "$requests"
		else
			printf '    local disk %7.2f s (rank files in the page cache)\n' "$secs"
		fi
	done
	echo "    (s3-shard: -o $SHARD_OPTS)"
	read -r floor _ < <("$PY" "$ROOT/tests/bench/tp_page_floor.py" "$D/export.ckfs/model.safetensors" "$TP")
	echo "    the least any mount can fetch for these readers (whole 4 KiB pages): ${floor}x"

	[ -n "${CKFS_BEFORE:-}" ] && echo "    (s3-before: $CKFS_BEFORE)"
	first=${WHERE%% *}
	echo "    served bytes (all workers): $(col_median 2 "$W/b.$first")"
	;; esac
	case $PARTS in *c*)
	echo "(c) first byte of model.safetensors from the mount command (s, median of $RUNS)"
	for where in s3 local; do
		grep "^$where " "$W/c.txt" | cut -d' ' -f2- >"$W/c.$where"
		printf '    %-10s mount returned %6.3f, first byte %6.3f\n' "$where" \
			"$(col_median 1 "$W/c.$where")" "$(col_median 2 "$W/c.$where")"
	done
	;; esac
	echo "load now: $(load_now)"
done
