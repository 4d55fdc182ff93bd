#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A store that lies (tests/s3/lying_store.py, issue 37), each case one line
# out and nothing half-written, or the right bytes:
#   - two stores with the same bucket, key and ETag through one --s3-cache:
#     each export holds its own store's bytes (the cache knows the store)
#   - a damaged block in the cache is fetched again, not served
#   - a listing whose continuation token repeats: refused, naming it
#   - a store that trickles (2 B/s): fails in bounded time (CKFS_S3_TIMEOUT)
#   - a store that ignores Range (200, whole object): said so
#   - a 300 KiB response header: curl's account, not "Out of memory"
#   - a stray key with an empty path component: skipped with a warning
#   - a failing read's last line carries the store's cause
#   - credentials in AWS_ENDPOINT_URL never printed
# Usage: test_s3_hostile.sh CKFS_BINARY
set -uo pipefail
CKFS=$1
HERE=$(cd "$(dirname "$0")" && pwd)
FIX=$(cd "$HERE/../fixtures" && pwd -P)
WORK=$(mktemp -d /tmp/ckfs-s3hostile.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	rm -rf "$WORK"
}
trap cleanup EXIT
export AWS_ACCESS_KEY_ID= AWS_SECRET_ACCESS_KEY= AWS_REGION=us-east-1
export AWS_SHARED_CREDENTIALS_FILE=/nonexistent AWS_CONFIG_FILE=/nonexistent
unset AWS_ENDPOINT_URL_S3
failures=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; failures=$((failures + 1)); }

# store DIR MODE: starts one, its endpoint in $EP
store() {
	python3 "$HERE/lying_store.py" "$1" ckpt model "$2" >"$WORK/port" &
	PIDS+=($!)
	for _ in $(seq 100); do [ -s "$WORK/port" ] && break; sleep 0.1; done
	EP=http://127.0.0.1:$(cat "$WORK/port")
	: >"$WORK/port"
}

# two folders: A's weights, and B with the same file names and sizes but other bytes
A=$FIX/hf/qwen2_single
B=$WORK/b
cp -r "$A" "$B"
python3 - "$B/model.safetensors" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = int.from_bytes(b[:8], "little")
for i in range(8 + n, len(b)):
    b[i] ^= 0x5a  # every weight byte changed, header and size kept
open(p, "wb").write(b)
PY
"$CKFS" export -q "$A" "$WORK/want-a" && "$CKFS" export -q "$B" "$WORK/want-b" ||
	bad "local exports"

# ---- one cache, two stores, same bucket/key/ETag ----
store "$A" honest; EP_A=$EP
store "$B" honest; EP_B=$EP
CACHE="$WORK/cache"
AWS_ENDPOINT_URL=$EP_A "$CKFS" export -q --s3-cache "$CACHE,64MiB" s3://ckpt/model "$WORK/from-a" &&
	AWS_ENDPOINT_URL=$EP_B "$CKFS" export -q --s3-cache "$CACHE,64MiB" s3://ckpt/model "$WORK/from-b" ||
	bad "exports through one cache"
cmp -s "$WORK/from-a/model.safetensors" "$WORK/want-a/model.safetensors" &&
	cmp -s "$WORK/from-b/model.safetensors" "$WORK/want-b/model.safetensors" &&
	ok "two stores, one cache: each export holds its own store's bytes" ||
	bad "two stores, one cache: each export holds its own store's bytes"
# damage every cached block's payload (its last byte): fetched again
for f in "$CACHE"/*/*; do
	[ -f "$f" ] && printf '\xff' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") - 1)) conv=notrunc 2>/dev/null
done
AWS_ENDPOINT_URL=$EP_A "$CKFS" export -q --s3-cache "$CACHE,64MiB" s3://ckpt/model "$WORK/again-a" 2>"$WORK/say" &&
	cmp -s "$WORK/again-a/model.safetensors" "$WORK/want-a/model.safetensors" &&
	grep -q "damaged cache block" "$WORK/say" &&
	ok "a damaged cache block is fetched again, not served" ||
	bad "a damaged cache block is fetched again, not served: $(cat "$WORK/say")"

# refused CASE EXPECT MODE [env...]: the export fails with one line holding EXPECT, writes nothing
refused() {
	local what=$1 want=$2 mode=$3
	shift 3
	store "$A" "$mode"
	local t0=$SECONDS
	env AWS_ENDPOINT_URL="$EP" "$@" timeout 300 "$CKFS" export -q s3://ckpt/model "$WORK/never" \
		2>"$WORK/say"
	local rc=$? last
	last=$(tail -n 1 "$WORK/say")
	if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ ! -e "$WORK/never" ] && [[ $last == *"$want"* ]]; then
		ok "$what ($((SECONDS - t0)) s): $last"
	else
		bad "$what: exit $rc, last line: $last"
	fi
}
refused "a continuation token repeated" "repeats a continuation token" endless
refused "a store that trickles" "s3://ckpt/model/" trickle CKFS_S3_TIMEOUT=2
grep -qi "timeout\|too slow\|low speed\|Operation" "$WORK/say" && ok "  ... and says it timed out" ||
	bad "  ... and says it timed out: $(cat "$WORK/say")"
refused "a store that ignores Range" "ignored the Range header" norange
refused "a 300 KiB header" "header" bigheader
grep -q "Out of memory" "$WORK/say" && bad "  ... reported as Out of memory" || ok "  ... not Out of memory"
refused "a read that fails: the last line says why" "HTTP 503" fail503

# ---- a stray key: skipped, named ----
store "$A" stray
AWS_ENDPOINT_URL=$EP "$CKFS" export -q s3://ckpt/model "$WORK/stray" 2>"$WORK/say" &&
	cmp -s "$WORK/stray/model.safetensors" "$WORK/want-a/model.safetensors" &&
	grep -q "empty, '.' or '..' path component skipped.*//" "$WORK/say" &&
	ok "a key with an empty path component: skipped and named" ||
	bad "a key with an empty path component: $(cat "$WORK/say")"

# ---- credentials in the endpoint ----
for ep in "ftp://user:s3cr3tPASS@127.0.0.1:1" "http://user:s3cr3tPASS@127.0.0.1:1"; do
	AWS_ENDPOINT_URL=$ep "$CKFS" inspect s3://ckpt/model >/dev/null 2>"$WORK/say"
	if [ $? -ne 0 ] && ! grep -q s3cr3tPASS "$WORK/say" && grep -q '\*\*\*@127.0.0.1' "$WORK/say"; then
		ok "endpoint ${ep%%:*}:// with a password: refused, redacted"
	else
		bad "endpoint ${ep%%:*}:// with a password: $(cat "$WORK/say")"
	fi
done

[ $failures -eq 0 ] && echo "s3 hostile: all passed" || echo "s3 hostile: $failures failed"
exit $((failures > 0))
