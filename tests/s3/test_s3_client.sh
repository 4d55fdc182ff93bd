#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The S3 client (src/store) against a real SeaweedFS on loopback: ranged
# GETs byte for byte, an object replaced after it was looked at (If-Match
# refuses it), listings of more than one page, keys that need encoding,
# wrong credentials, retries through an endpoint that answers 503
# SlowDown and drops connections (flaky_proxy.py). Usage: test_s3_client.sh S3_CHECK_BINARY
set -uo pipefail
CHECK=$1
source "$(dirname "$0")/seaweedfs.sh"

PROXY=
session_cleanup() {
	[ -z "$PROXY" ] || kill "$PROXY" 2>/dev/null
}
seaweedfs_session WORK /tmp/ckfs-s3.XXXXXX ckfs-test || exit 1
E=$AWS_ENDPOINT_URL/ckfs-test

python3 -c 'import sys; sys.stdout.buffer.write(bytes(i % 251 for i in range(300000)))' >"$WORK/f.bin"
printf 'first version' >"$WORK/g1"
printf 'second version, longer' >"$WORK/g2"
printf 'hello' >"$WORK/odd"
s3curl -f -T "$WORK/f.bin" "$E/dir/f.bin" >/dev/null &&
	s3curl -f -T "$WORK/g1" "$E/dir/g.bin" >/dev/null &&
	s3curl -f -T "$WORK/odd" "$E/dir/odd%20name%2B%26%3D.txt" >/dev/null || {
	echo "FAIL: could not fill the bucket" >&2
	exit 1
}
old=$(s3curl -fI "$E/dir/g.bin" | tr -d '\r' | sed -n 's/^[Ee][Tt]ag: //p')
s3curl -f -T "$WORK/g2" "$E/dir/g.bin" >/dev/null || exit 1
# 1003 keys in one curl run (one process, one connection)
args=()
for i in $(seq -w 1 1003); do
	args+=(-T "$WORK/odd" "$E/many/k$i")
done
s3curl -f "${args[@]}" >/dev/null || { echo "FAIL: could not write many/" >&2; exit 1; }
# An unreliable endpoint in front of it, for the retries.
python3 "$(dirname "$0")/flaky_proxy.py" "${AWS_ENDPOINT_URL##*:}" >"$WORK/proxy.port" &
PROXY=$!
for i in $(seq 1 100); do
	[ -s "$WORK/proxy.port" ] && break
	sleep 0.1
done
"$CHECK" ckfs-test "$old" "http://127.0.0.1:$(cat "$WORK/proxy.port")"
