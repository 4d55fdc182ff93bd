# SPDX-License-Identifier: MIT
# Shared by tests/mount/test_*.sh (sourced, not run). Usage of a test:
#   bash tests/mount/test_X.sh [PATH/TO/ckfs]     (or CKFS_BIN=...)
# Exit status: 0 pass, 1 fail, 77 skip (only when FUSE itself is missing:
# no /dev/fuse, or no fusermount3 for an unprivileged user).
#
# Every test works in a private temporary folder; an EXIT trap unmounts
# everything mounted under it (lazily, so a stuck reader cannot block the
# cleanup), stops the daemons the test started and removes the folder.
# Readiness never relies on sleeping: `ckfs mount` returns only once the
# mount is ready, and foreground daemons announce READY=1 on NOTIFY_SOCKET.

set -u

MOUNT_TESTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CKFS_ROOT=$(cd "$MOUNT_TESTS/../.." && pwd)
FIXTURES=$CKFS_ROOT/tests/fixtures/fsdp
CKFS=${1:-${CKFS_BIN:-$CKFS_ROOT/build/ckfs}}
CKFS=$(cd "$(dirname "$CKFS")" && pwd)/$(basename "$CKFS")
# System python (no packages needed); an unprivileged user can run it too.
PY=${PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}
HELPER=$MOUNT_TESTS/helper.py
TEST_NAME=$(basename "$0" .sh)
FAILS=0
PIDS=""

log() { printf '%s: %s\n' "$TEST_NAME" "$*"; }
skip() { log "SKIP: $*"; exit 77; }
fail() {
	log "FAIL: $*"
	FAILS=$((FAILS + 1))
}
die() {
	log "FAIL: $*"
	exit 1
}

[ -x "$CKFS" ] || die "no ckfs binary at '$CKFS' (pass its path as the first argument)"
[ -n "$PY" ] || die "python3 not found"

require_fuse() {
	[ -c /dev/fuse ] || skip "/dev/fuse is missing (load the fuse module or run with --device /dev/fuse)"
	if [ "$(id -u)" != 0 ] && ! command -v fusermount3 >/dev/null; then
		skip "not root and fusermount3 is not installed (package fuse3)"
	fi
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ckfs-$TEST_NAME.XXXXXX")
chmod 755 "$WORK"

# Mount points under $WORK, from the kernel's table (octal escapes decoded).
mounts_under() {
	awk -v w="$WORK/" '{ p = $5; gsub(/\\040/, " ", p); if (index(p, w) == 1) print p }' \
		/proc/self/mountinfo
}

cleanup() {
	local m p
	for m in $(mounts_under | sort -r); do
		umount -l "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null
	done
	[ -n "${CKFS_FSTAB_NS:-}" ] && umount -l /usr/local/sbin 2>/dev/null
	[ -n "${CKFS_NONROOT_NS:-}" ] && umount -l /dev/fuse 2>/dev/null
	for p in $PIDS; do
		kill -9 "$p" 2>/dev/null
	done
	rm -rf "$WORK"
}
trap cleanup EXIT

is_mounted() {
	awk -v m="$1" '{ if ($5 == m) f = 1 } END { exit !f }' /proc/self/mountinfo
}

# Wait (up to $2 seconds, default 10) for process $1 to be gone.
wait_gone() {
	local pid=$1 n=$(( ${2:-10} * 20 ))
	while kill -0 "$pid" 2>/dev/null; do
		# A zombie (exited, parent gone) counts as gone.
		[ "$(ps -o stat= -p "$pid" 2>/dev/null | cut -c1)" = Z ] && return 0
		n=$((n - 1))
		[ $n -gt 0 ] || return 1
		sleep 0.05
	done
}

# Wait (up to 10 s) for mount point $1 to leave the mount table.
wait_unmounted() {
	local n=200
	while is_mounted "$1"; do
		n=$((n - 1))
		[ $n -gt 0 ] || return 1
		sleep 0.05
	done
}

# ckfs mount, daemonized: returns once the mount is ready.
do_mount() {
	"$CKFS" mount "$@"
}

# The daemon pid, from the stats xattr.
daemon_pid() {
	"$PY" "$HELPER" stats "$1"
}

# Foreground daemon with readiness through NOTIFY_SOCKET:
#   start_foreground LOG SOCK ckfs-mount-args...
# sets FG_PID; fails the test when READY=1 does not come.
start_foreground() {
	local logf=$1 sock=$2 fifo line
	shift 2
	fifo=$WORK/notify.$$.$RANDOM
	mkfifo "$fifo"
	"$PY" "$HELPER" notify "$sock" >"$fifo" &
	local lpid=$!
	exec 8<"$fifo"
	read -r line <&8 # "bound": the socket exists before ckfs starts
	# A script's background job ignores SIGINT; the tests send it.
	NOTIFY_SOCKET=$sock env --default-signal=INT,QUIT "$CKFS" mount -f "$@" 2>"$logf" &
	FG_PID=$!
	PIDS="$PIDS $FG_PID"
	if ! read -r line <&8 || [ "${line#READY=1}" = "$line" ]; then
		exec 8<&-
		rm -f "$fifo"
		kill "$lpid" 2>/dev/null
		cat "$logf" >&2
		die "foreground daemon never announced READY=1 (got '${line:-nothing}')"
	fi
	exec 8<&-
	rm -f "$fifo"
	wait "$lpid"
}

finish() {
	if [ "$FAILS" -gt 0 ]; then
		log "$FAILS check(s) failed"
		exit 1
	fi
	log "PASS"
	exit 0
}
