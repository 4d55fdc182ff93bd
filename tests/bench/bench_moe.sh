#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Frontier-MoE metadata (issue 15, item 1; docs/benchmarks.md): a
# Qwen3-235B-A22B-shaped verl FSDP2 actor at world size 64 (36,945 keys,
# every expert's matrices separate; 940 GB of fp32 rank files left as
# holes), or with MOE_SHAPE=deepseek-v3-671b a DeepSeek-V3-shaped one as
# transformers 5 holds it (967 keys, experts fused, split into 44,544
# tensors on open; 2.7 TB of holes; issue 36), written once by
# tests/gen/make_bench_moe.py under BENCH_DIR. Each figure is the median
# of RUNS runs, printed against its target:
#
#   ready        `ckfs mount --max-shard-size 5GB` until the first shard's
#                safetensors header has been read: with an empty plan
#                cache (the other 63 ranks checked by threads after the
#                mount, before the first tensor byte; the kernel's
#                read-ahead past the header waits for them), and again
#                with the plan cache of the first run
#   mount        how long `ckfs mount` itself takes (rank 0 parsed, the
#                plan foreseen), and with -o rank_checks=mount (every rank
#                checked before it returns)
#   inspect      `ckfs inspect`, empty plan cache and cached
#   RSS          the daemon's VmRSS right after `ckfs mount` returned,
#                after the checks (once the header was read) and its peak
#   ls -l        of the fresh mount (95 shards and the index)
#
# BASE_CKFS=path/to/another/ckfs adds its figures side by side, measured
# in the same runs, interleaved ("before" in docs/benchmarks.md is the main
# branch's binary). CPU-seconds (the daemon's until the header was read;
# inspect's user + system) are given beside wall times: on a shared
# machine they move less.
#
#   tests/bench/bench_moe.sh [CKFS]   (env: RUNS=3, BENCH_DIR, BASE_CKFS, BASE_RUNS, MOE_SHAPE)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CKFS=${1:-$ROOT/build/ckfs}
PY=${PY:-${CKFS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckfs}/venv/bin/python}
RUNS=${RUNS:-3}
BASE_RUNS=${BASE_RUNS:-$RUNS}
DIR=${BENCH_DIR:-/tmp/ckfs-bench}
SHAPE=${MOE_SHAPE:-qwen3-235b}
CK=$DIR/$SHAPE/ckpt
MNT=$DIR/mnt-moe
PLANS=$DIR/moe-plans
OUT=$DIR/moe-results.txt
mkdir -p "$DIR" "$MNT"

say() { echo "bench_moe: $*" >&2; }
die() { echo "bench_moe: $*" >&2; exit 1; }

if [ ! -e "$CK/.bench-complete" ]; then
	say "generating the $SHAPE actor in $CK (once; the 235B one about 10 min on 2 cores)"
	rm -rf "$CK.tmp"
	nice -n 10 "$PY" "$ROOT/tests/gen/make_bench_moe.py" "$CK.tmp" --shape "$SHAPE" --world 64 \
		>"$DIR/gen-$SHAPE.log" 2>&1 || { tail "$DIR/gen-$SHAPE.log" >&2; die "generation failed"; }
	rm -rf "$CK"
	mv "$CK.tmp" "$CK"
	touch "$CK/.bench-complete"
fi

t_now() { echo "$EPOCHREALTIME"; }
t_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.4f", b - a }'; }
rec() { echo "$1 $2 $3" >>"$OUT"; } # WHO KEY VALUE
kib() { awk -v k="$2:" '$1 == k { print $2 * 1024 }' "/proc/$1/status"; }
first_shard() { ls "$MNT"/model-00001-of-*.safetensors; }
read_header() {
	local f n
	f=$(first_shard)
	n=$(od -An -tu8 -N8 "$f" | tr -d ' ')
	head -c $((8 + n)) "$f" >/dev/null
}
daemon_pid() { "$1" stats --json "$MNT" | sed -n 's/.*"pid":\([0-9]*\).*/\1/p'; }
umount_wait() { # BIN PID
	"$1" umount "$MNT"
	for _ in $(seq 100); do kill -0 "$2" 2>/dev/null || return 0; sleep 0.1; done
}
cleanup() { if mountpoint -q "$MNT"; then "$CKFS" umount -z "$MNT" || true; fi; }
trap cleanup EXIT
cleanup

mount_ready() { # WHO BIN KEY [mount options]: mount until the header is read
	local who=$1 bin=$2 key=$3 t pid
	shift 3
	t=$(t_now)
	"$bin" mount --log-level err --max-shard-size 5GB "$@" "$CK" "$MNT"
	rec "$who" "${key}_mount_s" "$(t_since "$t")"
	pid=$(daemon_pid "$bin")
	rec "$who" "${key}_rss_mounted" "$(kib "$pid" VmRSS)"
	local l
	l=$(t_now)
	ls -l "$MNT" >/dev/null
	rec "$who" "${key}_ls_s" "$(t_since "$l")"
	read_header
	rec "$who" "${key}_ready_s" "$(t_since "$t")"
	rec "$who" "${key}_ready_cpu" "$(awk '{ printf "%.2f", ($14 + $15) / 100 }' "/proc/$pid/stat")"
	rec "$who" "${key}_rss_checked" "$(kib "$pid" VmRSS)"
	rec "$who" "${key}_rss_peak" "$(kib "$pid" VmHWM)"
	umount_wait "$bin" "$pid"
}

inspect() { # WHO BIN KEY
	local t
	t=$(t_now)
	/usr/bin/time -f "%U %S" -o "$DIR/moe-time" "$2" inspect "$CK" >/dev/null
	rec "$1" "${3}_inspect_s" "$(t_since "$t")"
	rec "$1" "${3}_inspect_cpu" "$(awk '{ printf "%.2f", $1 + $2 }' "$DIR/moe-time")"
}

: >"$OUT"
# The metadata pages (zip directories, data.pkl) reach the page cache in
# the first run (a cat would read 940 GB of holes); later runs find them.
for run in $(seq "$RUNS"); do
	say "run $run/$RUNS"
	for who in ckfs ${BASE_CKFS:+base}; do
		bin=$CKFS
		if [ "$who" = base ]; then
			[ "$run" -le "$BASE_RUNS" ] || continue
			bin=$BASE_CKFS
		fi
		rm -rf "$PLANS"
		export CKFS_PLAN_CACHE=$PLANS
		mount_ready "$who" "$bin" cold
		if [ "$who" = base ]; then
			rm -rf "$PLANS" # the mount above wrote a record
			inspect "$who" "$bin" cold
			continue # the figures below need the new code
		fi
		mount_ready "$who" "$bin" cached
		rm -rf "$PLANS"
		mount_ready "$who" "$bin" atmount -o rank_checks=mount
		rm -rf "$PLANS"
		inspect "$who" "$bin" cold
		inspect "$who" "$bin" cached
	done
done

median() { # WHO KEY
	awk -v w="$1" -v k="$2" '$1 == w && $2 == k { print $3 }' "$OUT" | sort -g |
		awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
row() { # LABEL KEY UNIT TARGET
	local a b
	a=$(median ckfs "$2")
	b=$(median base "$2")
	if [ "$3" = MiB ]; then
		a=$(awk -v v="$a" 'BEGIN { printf "%.0f", v / 1048576 }')
		[ "$b" = - ] || b=$(awk -v v="$b" 'BEGIN { printf "%.0f", v / 1048576 }')
	fi
	printf '  %-44s %10s %-5s %10s   %s\n' "$1" "$a" "$3" "${BASE_CKFS:+$b}" "$4"
}
printf '%s-shaped verl FSDP2 actor, world size 64, %s tensors served (medians of %s runs; %s CPUs)\n' "$SHAPE" \
	"$("$CKFS" inspect --json "$CK" | "$PY" -c 'import json,sys; print(len(json.load(sys.stdin)["tensors"]))')" \
	"$RUNS" "$(nproc)"
printf '  %-44s %16s %10s   %s\n' "" "ckfs" "${BASE_CKFS:+base}" "target"
printf '  (load average at the end: %s)\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
row "mount until header read, empty plan cache" cold_ready_s s "$([ "$SHAPE" = qwen3-235b ] && echo "< 1 s" || echo "< 2 s")"
row "  daemon CPU-s until then" cold_ready_cpu CPU-s ""
row "mount until header read, plan cache" cached_ready_s s "< 1 s"
row "  daemon CPU-s until then" cached_ready_cpu CPU-s ""
row "ckfs mount returns, empty plan cache" cold_mount_s s ""
row "ckfs mount -o rank_checks=mount returns" atmount_mount_s s ""
row "ckfs inspect, empty plan cache" cold_inspect_s s "< 2 s"
row "  its CPU-s" cold_inspect_cpu CPU-s ""
row "ckfs inspect, plan cache" cached_inspect_s s "< 2 s"
row "  its CPU-s" cached_inspect_cpu CPU-s ""
row "daemon RSS when mount returned" cold_rss_mounted MiB "< 256 MiB"
row "daemon RSS after the checks" cold_rss_checked MiB "< 256 MiB"
row "daemon RSS peak" cold_rss_peak MiB ""
row "daemon RSS after mount, plan cache" cached_rss_checked MiB "< 256 MiB"
row "ls -l of the mount (5 GB shards + index)" cold_ls_s s "< 0.1 s"
