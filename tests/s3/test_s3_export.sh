#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `ckfs export SRC s3://bucket/prefix` against a real SeaweedFS on
# loopback:
#   - the objects are byte for byte a local export's files, and only
#     those: sharded safetensors (multipart uploads of 5 MiB parts, small
#     files in one PUT), a GGUF file, from a local and from an s3:// SRC
#   - every request dropped once and throttled once (flaky_proxy.py):
#     the same bytes, the writes retried
#   - an existing prefix refused without --force; --force replaces it
#     with exactly the new folder (old shards removed)
#   - an export killed (SIGKILL) mid-upload: no config.json, an upload
#     left open; run again it aborts that upload and completes the same
#     bytes, none left open; killed after some files were written, run
#     again it keeps those (their digest is its own) and writes the rest;
#     the same for a part of two while part 0 waits
#   - Ctrl-C mid-upload: exit 130, no upload left open, no config.json
#   - --part I/N: 4 parts at once give the one export's objects (markers
#     removed); a part run again after part 0 finished does nothing; part 0
#     waits for parts started later, and past a part run with other
#     options, whose files end up removed
#   - a part resumed makes 3 requests, not 12 (it HEADs its own files'
#     objects, not every object under the prefix)
#   - refused in one line: a bucket without a prefix, a prefix inside or
#     above the checkpoint's, a part into a prefix not all ckfs's, --since
# Usage: test_s3_export.sh CKFS_BINARY
set -uo pipefail
CKFS=$1
HERE=$(cd "$(dirname "$0")" && pwd)
FIX=$(cd "$HERE/../fixtures" && pwd -P)
source "$HERE/seaweedfs.sh"

PROXY=
session_cleanup() {
	[ -z "$PROXY" ] || kill "$PROXY" 2>/dev/null
}
B=ckfs-out
seaweedfs_session WORK /tmp/ckfs-s3exp.XXXXXX "$B" || exit 1
# S3's smallest parts (5 MiB), so that a small fixture's weight file goes
# in several: the FP8 DeepSeek-V3 checkpoint as float32 (6 MB)
export CKFS_S3_PART_SIZE=5242880
BIG=("$FIX/fp8_release/deepseek_v3_tiny/release" --dtype float32)

fails=0
fail() {
	echo "FAIL: $*" >&2
	fails=$((fails + 1))
}

# The keys under s3://$B/PREFIX/, relative, sorted.
keys() {
	s3curl -f "$AWS_ENDPOINT_URL/$B?list-type=2&prefix=$1%2F" |
		python3 -c '
import re, sys
p = sys.argv[1] + "/"
print("\n".join(sorted(k[len(p):] for k in re.findall(r"<Key>([^<]*)</Key>", sys.stdin.read()))))' "$1"
}

# The multipart uploads open under PREFIX/.
open_uploads() {
	s3curl -f "$AWS_ENDPOINT_URL/$B?prefix=$1%2F&uploads=" | grep -o "<UploadId>" | wc -l
}

# PREFIX holds exactly DIR's files, byte for byte.
same_as() { # PREFIX DIR WHAT
	local f ok=1
	if [ "$(keys "$1")" != "$(cd "$2" && find . -type f | sed 's|^\./||' | sort)" ]; then
		fail "$3: the keys are not the local export's files: $(keys "$1" | tr '\n' ' ')"
		return 1
	fi
	while IFS= read -r f; do
		s3curl -f "$AWS_ENDPOINT_URL/$B/$1/$f" -o "$WORK/got" && cmp -s "$WORK/got" "$2/$f" ||
			{ fail "$3: $f differs"; ok=0; }
	done < <(keys "$1")
	[ $ok = 1 ] && echo "ok: $3: $(keys "$1" | wc -l) objects, byte-identical to the local export"
}

# tests/s3/flaky_proxy.py in front of the store (ARGS: its own, after the
# port); its port in $WORK/proxy.port, its pid in PROXY.
start_proxy() {
	rm -f "$WORK/proxy.port"
	python3 "$HERE/flaky_proxy.py" "${AWS_ENDPOINT_URL##*:}" "$@" >"$WORK/proxy.port" &
	PROXY=$!
	for i in $(seq 1 100); do
		[ -s "$WORK/proxy.port" ] && break
		sleep 0.1
	done
}

SHARDED=(--max-shard-size 200KB)
"$CKFS" export -q "${SHARDED[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "$WORK/local" || fail "local export"
ls "$WORK/local"/model-0000*-of-* >/dev/null 2>&1 || fail "the local export is not sharded"

echo "== a local SRC to the store"
"$CKFS" export "${SHARDED[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/fsdp2" 2>"$WORK/err" ||
	fail "export to s3://: $(cat "$WORK/err")"
cat "$WORK/err"
same_as fsdp2 "$WORK/local" "s3:// export"

echo "== a multipart upload"
"$CKFS" export -q "${BIG[@]}" "$WORK/big" && "$CKFS" export -q "${BIG[@]}" "s3://$B/big" &&
	same_as big "$WORK/big" "multipart" || fail "multipart export"
s3curl -sI "$AWS_ENDPOINT_URL/$B/big/model.safetensors" | grep -qi '^etag: "[0-9a-f]*-2"' &&
	echo "ok: model.safetensors went in 2 parts" || fail "not a multipart upload of 2 parts"
[ "$(open_uploads big)" = 0 ] || fail "uploads left open"

echo "== GGUF"
"$CKFS" export -q --format gguf --dtype q8_0 "$FIX/gguf/llama_fsdp2_w2" "$WORK/gguf" &&
	"$CKFS" export -q --format gguf --dtype q8_0 "$FIX/gguf/llama_fsdp2_w2" "s3://$B/gguf" &&
	same_as gguf "$WORK/gguf" "GGUF to s3://" || fail "GGUF export to s3://"

echo "== an s3:// SRC to the store"
s3_put_tree "$FIX/fsdp/qwen2_fsdp2_w2" "$AWS_ENDPOINT_URL/$B/ckpt" || fail "upload the checkpoint"
"$CKFS" export -q "${SHARDED[@]}" "s3://$B/ckpt" "s3://$B/from-store" &&
	same_as from-store "$WORK/local" "s3:// to s3://" || fail "s3:// to s3:// export"

echo "== through a flaky endpoint (each request dropped, then throttled, once)"
start_proxy
FLAKY=(--s3-endpoint "http://127.0.0.1:$(cat "$WORK/proxy.port")")
"$CKFS" export -q "${SHARDED[@]}" "${FLAKY[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/flaky" 2>"$WORK/err" &&
	same_as flaky "$WORK/local" "through the flaky endpoint" ||
	fail "through the flaky endpoint: $(cat "$WORK/err")"
kill "$PROXY" 2>/dev/null
PROXY=

echo "== --part: 4 processes at once"
PARTS=(--max-shard-size 100KB)
"$CKFS" export -q "${PARTS[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "$WORK/parts" || fail "local export (4 shards)"
[ "$(ls "$WORK/parts" | grep -c 'of-00004')" = 4 ] || fail "the local export has not 4 shards"
pids=()
for i in 3 2 1 0; do
	"$CKFS" export -q --part $i/4 "${PARTS[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/parts" \
		2>"$WORK/part$i.err" &
	pids+=($!)
done
for p in "${pids[@]}"; do
	wait "$p" || fail "a part failed: $(cat "$WORK"/part*.err)"
done
same_as parts "$WORK/parts" "4 parts at once (markers removed)"
[ "$(open_uploads parts)" = 0 ] || fail "parts: uploads left open"
"$CKFS" export --part 2/4 "${PARTS[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/parts" 2>"$WORK/err" &&
	grep -q "complete already" "$WORK/err" && echo "ok: a part run again: $(cat "$WORK/err")" ||
	fail "a part run again: $(cat "$WORK/err")"
# A part looks only at its own files' objects (and any of no part), not
# at all 9: a listing, a HEAD of its shard, its marker (3 requests; a
# HEAD of each of the 9 objects made 12; room for a retry or two)
s3curl -f -X DELETE "$AWS_ENDPOINT_URL/$B/parts/config.json" || fail "remove config.json"
"$CKFS" export --part 2/4 "${PARTS[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/parts" 2>"$WORK/err" &&
	n=$(sed -n 's/.*(\([0-9]*\) requests, files of an earlier run kept).*/\1/p' "$WORK/err") &&
	[ -n "$n" ] && [ "$n" -le 5 ] && echo "ok: a part resumed in $n requests: $(cat "$WORK/err")" ||
	fail "a part resumed: $(cat "$WORK/err")"

echo "== --part: part 0 waits; a part of another export is waited past"
"$CKFS" export -q --part 1/3 "${PARTS[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/late" ||
	fail "late: part 1"
"$CKFS" export --part 0/3 "${PARTS[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/late" 2>"$WORK/part0.err" &
p0=$!
"$CKFS" export -q --part 2/3 --dtype float32 "${PARTS[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/late" ||
	fail "late: part 2 with other options"
for i in $(seq 1 200); do
	grep -q "another export's" "$WORK/part0.err" && break
	sleep 0.1
done
keys late | grep -qx config.json && fail "late: config.json before every part of this export"
"$CKFS" export -q --part 2/3 "${PARTS[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/late" ||
	fail "late: part 2"
wait $p0 || fail "late: part 0: $(cat "$WORK/part0.err")"
grep -q "another export's" "$WORK/part0.err" && echo "ok: part 0 said: $(head -2 "$WORK/part0.err" | tr '\n' ' ')" ||
	fail "late: part 0 said $(cat "$WORK/part0.err")"
same_as late "$WORK/parts" "3 parts, one run first with other options (its files removed)"

echo "== an existing prefix"
if "$CKFS" export -q "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/fsdp2" 2>"$WORK/err"; then
	fail "an existing export was replaced without --force"
else
	grep -q "already holds .* use --force" "$WORK/err" && echo "ok: refused: $(cat "$WORK/err")" ||
		fail "refusal: $(cat "$WORK/err")"
fi
"$CKFS" export -q "$FIX/fsdp/qwen2_fsdp2_w2" "$WORK/whole" || fail "local export (one file)"
"$CKFS" export -q --force "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/fsdp2" 2>"$WORK/err" &&
	same_as fsdp2 "$WORK/whole" "--force over a sharded export" ||
	fail "--force: $(cat "$WORK/err")"

# Start an export of BIG through a slow endpoint and stop it with SIGNAL
# once a multipart upload is open (or with "objects", once an object is
# there: of SHARDED's files).
stop_mid_upload() { # PREFIX SIGNAL [objects [OPTIONS...]]
	local pid i what=("${BIG[@]}")
	[ $# -ge 3 ] && what=("${@:4}" "${SHARDED[@]}" "$FIX/fsdp/qwen2_fsdp2_w2")
	"$CKFS" export -q --threads 1 "${what[@]}" "${SLOW[@]}" "s3://$B/$1" 2>"$WORK/stopped.err" &
	pid=$!
	for i in $(seq 1 600); do
		if [ $# -ge 3 ]; then
			[ -n "$(keys "$1")" ] && break
		else
			[ "$(open_uploads "$1")" != 0 ] && break
		fi
		sleep 0.05
	done
	kill "-$2" "$pid"
	wait "$pid"
	local rc=$?
	sleep 1 # a request the proxy holds still reaches the store, 0.3 s late
	return $rc
}

echo "== stopped mid-upload"
start_proxy 0.3
SLOW=(--s3-endpoint "http://127.0.0.1:$(cat "$WORK/proxy.port")")
stop_mid_upload killed KILL
left=$(open_uploads killed)
if keys killed | grep -qx config.json; then
	fail "killed: config.json is there"
elif [ "$left" = 0 ]; then
	fail "killed: no upload was open when it was killed (the test did not stop it mid-upload)"
else
	echo "ok: killed: no config.json (objects: $(keys killed | tr '\n' ' ')), $left upload(s) open"
fi
"$CKFS" export "${BIG[@]}" "s3://$B/killed" 2>"$WORK/err" ||
	fail "killed: run again: $(cat "$WORK/err")"
grep -q "aborted $left multipart upload" "$WORK/err" &&
	echo "ok: run again: $(tr '\n' ' ' <"$WORK/err")" || fail "run again said: $(cat "$WORK/err")"
same_as killed "$WORK/big" "killed, then run again"
[ "$(open_uploads killed)" = 0 ] || fail "killed: uploads still open after the second run"

stop_mid_upload resumed KILL objects
had=$(keys resumed)
"$CKFS" export "${SHARDED[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/resumed" 2>"$WORK/err" ||
	fail "resumed: $(cat "$WORK/err")"
grep -q "resuming an export" "$WORK/err" && grep -q "files of an earlier run kept" "$WORK/err" &&
	echo "ok: killed after $(echo $had) was written; run again: $(tr '\n' ' ' <"$WORK/err")" ||
	fail "resumed: it said $(cat "$WORK/err")"
same_as resumed "$WORK/local" "killed, then resumed"

stop_mid_upload part KILL objects --part 1/2
had=$(keys part)
"$CKFS" export --part 0/2 "${SHARDED[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/part" 2>"$WORK/part0.err" &
p0=$!
"$CKFS" export --part 1/2 "${SHARDED[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/part" 2>"$WORK/err" ||
	fail "killed part: run again: $(cat "$WORK/err")"
wait $p0 || fail "killed part: part 0: $(cat "$WORK/part0.err")"
# kept its files; or, where the killed run got its marker out, part 0
# needed no wait and may be done before the second run looks
grep -q "files of an earlier run kept\|is this export, complete already" "$WORK/err" &&
	echo "ok: part 1/2 killed after $(echo $had) was written; run again: $(tr '\n' ' ' <"$WORK/err")" ||
	fail "killed part: it said $(cat "$WORK/err")"
same_as part "$WORK/local" "a part killed, then run again while part 0 waited"

stop_mid_upload interrupted INT
rc=$?
[ $rc = 130 ] || fail "Ctrl-C: exit $rc, not 130: $(cat "$WORK/stopped.err")"
[ "$(open_uploads interrupted)" = 0 ] && ! keys interrupted | grep -qx config.json &&
	echo "ok: Ctrl-C: exit 130, no upload open, no config.json" ||
	fail "Ctrl-C: uploads open or config.json there"
kill "$PROXY" 2>/dev/null
PROXY=

# A part run again while part 0 finishes: it found the export unfinished,
# and writes its marker after part 0 removed the markers. It must remove
# its own (it finds this export's config.json); before, it stayed. Part 1
# behind a store 1 s late a request, part 0 straight.
echo "== a part run again while part 0 finishes"
"$CKFS" export -q --part 1/2 "${SHARDED[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/rerun" ||
	fail "rerun: part 1"
start_proxy 1
"$CKFS" export -q --part 1/2 "${SHARDED[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" \
	--s3-endpoint "http://127.0.0.1:$(cat "$WORK/proxy.port")" "s3://$B/rerun" 2>"$WORK/err" &
p1=$!
sleep 1.5 # its listing is in: no config.json
"$CKFS" export -q --part 0/2 "${SHARDED[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/rerun" ||
	fail "rerun: part 0"
kill -0 $p1 2>/dev/null && order="part 0 done first" || order="part 1 done first: not the race"
wait $p1 || fail "rerun: part 1 again: $(cat "$WORK/err")"
kill "$PROXY" 2>/dev/null
PROXY=
same_as rerun "$WORK/local" "a part run again while part 0 finished ($order)"
# a part's files and marker, then one export without --part: it resumes,
# and the marker goes with the rest of what is not the folder's
"$CKFS" export -q --part 1/2 "${SHARDED[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/unparted" ||
	fail "unparted: part 1"
"$CKFS" export -q "${SHARDED[@]}" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/unparted" ||
	fail "unparted: the whole export"
same_as unparted "$WORK/local" "one export over a part's files and marker"

echo "== refused"
refused() { # WHAT WANT ARGS...
	local what=$1 want=$2
	shift 2
	if "$CKFS" export -q "$@" 2>"$WORK/err"; then
		fail "$what: not refused"
	elif ! grep -q -- "$want" "$WORK/err" || [ "$(wc -l <"$WORK/err")" -gt 2 ]; then
		fail "$what: $(cat "$WORK/err")"
	else
		echo "ok: $what: $(head -1 "$WORK/err")"
	fi
}
refused "a bucket alone" "name a prefix" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B"
refused "inside the checkpoint" "is there or above it" "s3://$B/ckpt" "s3://$B/ckpt/merged"
refused "above the checkpoint" "is there or above it" "s3://$B/ckpt" "s3://$B/ckpt/"
echo notes >"$WORK/notes.txt"
s3curl -f -T "$WORK/notes.txt" "$AWS_ENDPOINT_URL/$B/foreign/notes.txt" >/dev/null ||
	fail "put notes.txt"
refused "a part, into a prefix not ckfs's" "not all of them ckfs's" --part 1/2 "${SHARDED[@]}" \
	"$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/foreign"
[ "$(keys foreign)" = notes.txt ] || fail "a refused part wrote objects: $(keys foreign)"
refused "--since" "for a local DIR" --since "$WORK/local" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/x"
refused "--since s3:// to s3://" "for a local DIR" --since "s3://$B/fsdp2" "$FIX/fsdp/qwen2_fsdp2_w2" "s3://$B/x"
refused "--since s3:// into a local DIR" "is for an s3:// DIR" --since "s3://$B/fsdp2" \
	"$FIX/fsdp/qwen2_fsdp2_w2" "$WORK/since-local"
[ ! -e "$WORK/since-local" ] || fail "a refused export made its DIR"
[ -z "$(keys x)" ] || fail "a refused export wrote objects"

if [ $fails -ne 0 ]; then
	echo "$fails check(s) failed" >&2
	exit 1
fi
echo "all s3 export checks passed"
