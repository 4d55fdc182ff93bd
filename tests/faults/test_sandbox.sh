#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The serving daemon's sandbox (src/fuse/sandbox.c, docs/reliability.md).
# The fault shim (tests/faults/failalloc.c, LD_PRELOAD) makes the running
# daemon try to open a file outside its sources and to make an Internet
# socket (CKFS_PROBE_OPEN, on its first read once armed: a FUSE worker
# reading /dev/fuse):
#   - sandboxed (the default): the open is refused (EACCES, Landlock), the
#     socket too (EPERM, the system-call filter: a local source needs
#     none), the mount still serves the right bytes, the daemon has
#     no_new_privs and a seccomp filter;
#   - -o nosandbox: the same open and socket succeed (the probe can pass,
#     so the refusals above are the sandbox's);
#   - SIGTERM: unmounted and exit 0 (the helper unmounts for the daemon,
#     which a Landlock domain may not do);
#   - SIGKILL: the helper still removes the dead mount;
#   - as root with -o uid=65534: the daemon runs as that user (all four
#     ids, its groups), serves the same bytes, SIGTERM still unmounts (the
#     helper stays root); sources that user cannot read are refused at
#     mount time with one line naming them, and nothing is left mounted;
#   - ckfs umount then a new mount on the same point at once: the old
#     daemon's helper leaves the new mount alone;
#   - every other mount test runs sandboxed: the sandbox is on by default.
# Usage: test_sandbox.sh CKFS_BINARY FAILALLOC_SO   (exit 77: no /dev/fuse)
SHIM=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
source "$(dirname "$0")/../mount/lib.sh"
require_fuse

SRC=$WORK/src
cp -r "$CKFS_ROOT/tests/fixtures/hf/qwen2_single" "$SRC"
"$CKFS" export -q "$SRC" "$WORK/exp" || die "export failed"
echo secret >"$WORK/outside"

# probe_mount NAME [mount options...]: mount with the probe, arm it, read,
# and leave the report's probe line in $PROBE; the daemon's pid in $PID
probe_mount() {
	local name=$1
	shift
	MNT=$WORK/mnt-$name
	mkdir -p "$MNT"
	rm -f "$WORK/arm" "$WORK/rep"
	CKFS_PROBE_OPEN=$WORK/outside CKFS_PROBE_ARM=$WORK/arm CKFS_FAIL_REPORT=$WORK/rep \
		LD_PRELOAD=$SHIM do_mount "$@" "$SRC" "$MNT" || die "$name: mount failed"
	PID=$(daemon_pid "$MNT")
	touch "$WORK/arm"
	cmp -s "$MNT/model.safetensors" "$WORK/exp/model.safetensors" ||
		fail "$name: model.safetensors differs from the export"
	cmp -s "$MNT/config.json" "$WORK/exp/config.json" || fail "$name: config.json differs"
	PROBE=$(grep "^probe " "$WORK/rep" 2>/dev/null)
	SOCKET=$(grep "^probe-socket " "$WORK/rep" 2>/dev/null)
}

probe_mount sandboxed
[ "$PROBE" = "probe $WORK/outside EACCES" ] ||
	fail "sandboxed: the daemon's open outside its sources was not refused: '${PROBE:-no probe}'"
[ "$SOCKET" = "probe-socket EPERM" ] ||
	fail "sandboxed: the daemon's Internet socket was not refused: '${SOCKET:-no probe}'"
grep -q "^NoNewPrivs:[[:space:]]*1" "/proc/$PID/status" || fail "sandboxed: no no_new_privs"
grep -q "^Seccomp:[[:space:]]*2" "/proc/$PID/status" || fail "sandboxed: no seccomp filter"
log "sandboxed: $PROBE, $SOCKET, same bytes served, no_new_privs, seccomp filter"
kill -TERM "$PID"
wait_gone "$PID" || fail "sandboxed: the daemon did not stop on SIGTERM"
wait_unmounted "$MNT" || fail "sandboxed: still mounted after SIGTERM"
log "sandboxed: SIGTERM unmounted it"

probe_mount control -o nosandbox
[ "$PROBE" = "probe $WORK/outside ok" ] ||
	fail "-o nosandbox: the probe did not open the file: '${PROBE:-no probe}'"
[ "$SOCKET" = "probe-socket ok" ] ||
	fail "-o nosandbox: the probe did not make a socket: '${SOCKET:-no probe}'"
grep -q "^NoNewPrivs:[[:space:]]*0" "/proc/$PID/status" || fail "-o nosandbox: no_new_privs set"
grep -q "^Seccomp:[[:space:]]*0" "/proc/$PID/status" || fail "-o nosandbox: a seccomp filter"
log "-o nosandbox: $PROBE, $SOCKET"
"$CKFS" umount "$MNT" || fail "-o nosandbox: umount failed"

probe_mount killed
kill -KILL "$PID"
wait_unmounted "$MNT" || fail "SIGKILL: the dead mount was left behind"
log "SIGKILL: the helper removed the dead mount"

if [ "$(id -u)" = 0 ]; then
	probe_mount dropped -o uid=65534,gid=65534
	[ "$PROBE" = "probe $WORK/outside EACCES" ] || fail "uid=: the open was not refused: '$PROBE'"
	grep -q "^Uid:[[:space:]]*65534[[:space:]]*65534[[:space:]]*65534[[:space:]]*65534$" \
		"/proc/$PID/status" || fail "uid=: the daemon is not user 65534: $(grep ^Uid: "/proc/$PID/status")"
	grep -q "^Gid:[[:space:]]*65534[[:space:]]*65534[[:space:]]*65534[[:space:]]*65534$" \
		"/proc/$PID/status" || fail "uid=: the daemon is not group 65534: $(grep ^Gid: "/proc/$PID/status")"
	grep -q "^Groups:[[:space:]]*65534[[:space:]]*$" "/proc/$PID/status" ||
		fail "uid=: the daemon kept other groups: $(grep ^Groups: "/proc/$PID/status")"
	grep -q "^Seccomp:[[:space:]]*2" "/proc/$PID/status" || fail "uid=: no seccomp filter"
	log "uid=65534: the daemon runs as 65534:65534, same bytes served, $PROBE"
	kill -TERM "$PID"
	wait_gone "$PID" || fail "uid=: the daemon did not stop on SIGTERM"
	wait_unmounted "$MNT" || fail "uid=: still mounted after SIGTERM"
	log "uid=65534: SIGTERM unmounted it (the helper stayed root)"

	cp -r "$SRC" "$WORK/private"
	chmod 700 "$WORK/private"
	mkdir -p "$WORK/mnt-private"
	if "$CKFS" mount -o uid=65534,gid=65534 "$WORK/private" "$WORK/mnt-private" 2>"$WORK/err.all"; then
		fail "uid=: a source the user cannot read was mounted"
	fi
	# (a coverage build's libgcov, in the dropped daemon, cannot write
	# root's .gcda files and says so: not ckfs's lines)
	grep -v '^profiling:' "$WORK/err.all" >"$WORK/err"
	grep -q "^ckfs: -o uid=65534: .* cannot read '$WORK/private': Permission denied$" "$WORK/err" ||
		fail "uid=: unexpected refusal: $(cat "$WORK/err")"
	[ "$(wc -l <"$WORK/err")" = 1 ] || fail "uid=: the refusal is not one line: $(cat "$WORK/err")"
	mountpoint -q "$WORK/mnt-private" && fail "uid=: the refused mount was left behind"
	log "uid=65534, a 0700 source: $(cat "$WORK/err")"
else
	log "not root: the uid= drop (root only) is not tested here"
fi

# umount, then at once a new mount on the same point (mount ids are reused
# before kernel 6.8): the old daemon's helper must leave the new one alone
M=$WORK/mnt-again
mkdir -p "$M"
for i in 1 2 3 4 5; do
	do_mount "$SRC" "$M" || die "remount $i failed"
	"$CKFS" umount "$M" || fail "umount $i failed"
	do_mount "$SRC" "$M" || die "remount $i failed"
	sleep 0.5
	cmp -s "$M/config.json" "$WORK/exp/config.json" ||
		fail "remount $i: the new mount was taken down by the old daemon's helper"
	"$CKFS" umount "$M" || fail "umount $i failed"
done
log "umount then remount at once, 5 times: the new mounts stayed"
finish
