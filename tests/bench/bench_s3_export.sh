#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Export into an object store (issue "Past one machine, round two", item
# 5): the bench actor exported to a SeaweedFS on loopback
# (tests/s3/seaweedfs.sh), side by side in one run, RUNS times each,
# interleaved:
#   (a) `ckfs export SRC s3://...` against `ckfs export SRC DIR` to local
#       disk followed by `aws s3 cp --recursive DIR s3://...` (awscli,
#       pinned, its own venv, as bench_s3.sh installs it); the objects of
#       both are compared by their ETags (both send 8 MiB parts, so equal
#       ETags are equal bytes);
#   (b) `--part I/N` into the store with N = 1, 2 and 4 processes on this
#       machine against one export (the same total threads).
# Figures only, no assertions: medians, ratios, CPU seconds, the load.
# On loopback the store shares this machine's two CPUs and no link limits
# it; STORE_LINK=RATE (e.g. 1gbit, root) puts SeaweedFS
# behind a shaped link instead (tests/s3/shaped_link.sh), where an upload
# is bound by the network as it is to a real store. PARTS=a leaves (b) out.
#
#   tests/bench/bench_s3_export.sh [CKFS]
#   (env: RUNS=3, BENCH_DIR, BENCH_SIZES=0.5b, STORE_LINK, PARTS=ab)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -gt 0 ] && CKFS=$1
. "$ROOT/tests/bench/bench_common.sh"
. "$ROOT/tests/s3/seaweedfs.sh"
. "$ROOT/tests/s3/shaped_link.sh"
THREADS=${THREADS:-16}
PARTS=${PARTS:-ab}
session_cleanup() { # the server first: it hangs if its link goes before it
	seaweedfs_stop
	shaped_link_down
}

awscli_install || die "cannot install awscli"
if [ -n "${STORE_LINK:-}" ]; then
	shaped_link_up "$STORE_LINK" || die "cannot make a shaped link (root, ip, tc)"
	SEAWEED_NETNS=$SHAPED_NS SEAWEED_IP=$SHAPED_IP
	echo "== the store behind a link of $STORE_LINK each way"
fi
seaweedfs_session W "$BENCH_DIR/s3x.XXXXXX" bench || die "no SeaweedFS"

# The ETags under s3://bench/PREFIX/, key by key, relative.
etags() {
	s3curl -f "$AWS_ENDPOINT_URL/bench?list-type=2&prefix=$1%2F" | python3 -c '
import re, sys
p = sys.argv[1] + "/"
for k, e in re.findall(r"<Key>([^<]*)</Key>.*?<ETag>([^<]*)</ETag>", sys.stdin.read()):
    print(k[len(p):], e.replace("&#34;", "").replace("&quot;", "").strip("\""))' "$1"
}
drop_prefix() { # PREFIX: every object under it removed, its space freed
	local k
	for k in $(etags "$1" | cut -d' ' -f1); do
		s3curl -f -X DELETE "$AWS_ENDPOINT_URL/bench/$1/$k" >/dev/null
	done
	# SeaweedFS keeps deleted bytes in its volumes until a vacuum; a 1.5B
	# run writes 19 GB of objects
	curl -sf "http://${SEAWEED_IP:-127.0.0.1}:$(cut -d' ' -f2 "$W/weed/ports")/vol/vacuum?garbageThreshold=0.0001" \
		>/dev/null || true
}
# timed CMD...: runs it; prints wall and CPU seconds (user + sys)
timed() {
	local t
	t=$(t_now)
	/usr/bin/time -f "%U %S" -o "$W/time" "$@" >/dev/null
	echo "$(t_since "$t") $(awk '{ printf "%.2f", $1 + $2 }' "$W/time")"
}

for size in $SIZES; do
	D=$(shape_dir "$size")
	bytes=$(du -cb "$D"/export.ckfs/* | tail -1 | cut -f1)
	echo "== $size: the export is $bytes bytes; $THREADS threads; load $(load_now)"
	: >"$W/a.txt" >"$W/b.txt"
	for run in $(seq 1 "$RUNS"); do
		# (a) straight into the store, against local + aws s3 cp
		drop_prefix direct
		drop_prefix copied
		rm -rf "$W/local"
		read -r t_direct c_direct < <(timed "$CKFS" export -q --threads "$THREADS" "$D/ckpt" s3://bench/direct)
		read -r t_local c_local < <(timed "$CKFS" export -q --threads "$THREADS" "$D/ckpt" "$W/local")
		read -r t_cp c_cp < <(timed "$AWSCLI/bin/python" -m awscli s3 cp --quiet --recursive \
			--endpoint-url "$AWS_ENDPOINT_URL" "$W/local" s3://bench/copied)
		[ "$(etags direct)" = "$(etags copied)" ] ||
			die "the objects of ckfs export and aws s3 cp differ: $(etags direct) / $(etags copied)"
		echo "$t_direct $c_direct $t_local $c_local $t_cp $c_cp" >>"$W/a.txt"
		rm -rf "$W/local"

		[[ $PARTS == *b* ]] || continue
		# (b) --part over N processes on this machine, the same threads in all
		for n in 1 2 4; do
			drop_prefix "parts$n"
			t=$(t_now)
			: >"$W/cpu"
			pids=()
			for i in $(seq 0 $((n - 1))); do
				/usr/bin/time -f "%U %S" -a -o "$W/cpu" "$CKFS" export -q --threads $((THREADS / n)) \
					--max-shard-size 200MB --part "$i/$n" "$D/ckpt" "s3://bench/parts$n" &
				pids+=($!)
			done
			for p in "${pids[@]}"; do
				wait "$p" || die "a part failed"
			done
			echo "$n $(t_since "$t") $(awk '{ s += $1 + $2 } END { printf "%.2f", s }' "$W/cpu")" >>"$W/b.txt"
		done
		drop_prefix one
		read -r t_one c_one < <(timed "$CKFS" export -q --threads "$THREADS" --max-shard-size 200MB \
			"$D/ckpt" s3://bench/one)
		echo "0 $t_one $c_one" >>"$W/b.txt"
		[ "$(etags one)" = "$(etags parts4)" ] || die "4 parts differ from one export"
		for n in 1 2 4; do drop_prefix "parts$n"; done
		drop_prefix one
	done
	echo "(a) into the store, s and CPU-s, median of $RUNS (load $(load_now))"
	direct=$(col_median 1 "$W/a.txt") local=$(col_median 3 "$W/a.txt") cp=$(col_median 5 "$W/a.txt")
	both=$(awk -v a="$local" -v b="$cp" 'BEGIN { printf "%.2f", a + b }')
	printf '    ckfs export s3://                  %7.2f s  %6.2f CPU-s\n' "$direct" "$(col_median 2 "$W/a.txt")"
	printf '    ckfs export to local disk          %7.2f s  %6.2f CPU-s\n' "$local" "$(col_median 4 "$W/a.txt")"
	printf '    + aws s3 cp --recursive            %7.2f s  %6.2f CPU-s\n' "$cp" "$(col_median 6 "$W/a.txt")"
	printf '    the two together                   %7.2f s: s3:// directly takes %sx their time\n' \
		"$both" "$(ratio "$direct" "$both")"
	echo "    (objects of both: the same ETags)"
	[[ $PARTS == *b* ]] || continue
	echo "(b) --part N into the store, --max-shard-size 200MB, $THREADS threads in all, median of $RUNS"
	for n in 0 1 2 4; do
		grep "^$n " "$W/b.txt" | cut -d' ' -f2- >"$W/b.$n"
	done
	one=$(col_median 1 "$W/b.0")
	printf '    one export           %7.2f s  %6.2f CPU-s\n' "$one" "$(col_median 2 "$W/b.0")"
	for n in 1 2 4; do
		printf '    %d part(s) at once    %7.2f s  %6.2f CPU-s  (%sx one export)\n' "$n" \
			"$(col_median 1 "$W/b.$n")" "$(col_median 2 "$W/b.$n")" "$(ratio "$(col_median 1 "$W/b.$n")" "$one")"
	done
	echo "load now: $(load_now)"
done
