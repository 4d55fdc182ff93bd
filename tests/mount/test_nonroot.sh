#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# An unprivileged user mounts through fusermount3 (setuid), reads, sees its
# own uid on every file, and unmounts with ckfs umount (fusermount3 -u).
# allow_other without user_allow_other in /etc/fuse.conf is refused with a
# message and leaves no mount. Run as root, the test drops to "nobody"; run
# as a user, it runs as that user.
#
# libfuse mounts as a user only after opening /dev/fuse itself, so the node
# must be mode 0666 (Debian's udev rule). Where it is 0600 (some
# containers) and the test runs as root, it re-runs itself in a private
# mount namespace with a 0666 node for the same device bound over
# /dev/fuse; the system's node is not touched.
if [ -z "${CKFS_NONROOT_NS:-}" ] && [ "$(id -u)" = 0 ] && [ -c /dev/fuse ] &&
	[ "$(stat -c %a /dev/fuse)" != 666 ] && command -v unshare >/dev/null; then
	CKFS_NONROOT_NS=1 exec unshare --mount --propagation private bash "$0" "$@"
fi
source "$(dirname "$0")/lib.sh"
require_fuse
command -v fusermount3 >/dev/null || skip "fusermount3 is not installed (package fuse3)"
if [ -n "${CKFS_NONROOT_NS:-}" ]; then
	mknod -m 666 "$WORK/fuse" c "$((0x$(stat -c %t /dev/fuse)))" "$((0x$(stat -c %T /dev/fuse)))" &&
		mount --bind "$WORK/fuse" /dev/fuse ||
		skip "/dev/fuse is mode $(stat -c %a /dev/fuse) and no 0666 node can be made here"
	log "/dev/fuse is 0600 on this machine: using a private 0666 node"
elif [ "$(id -u)" != 0 ] && ! [ -r /dev/fuse -a -w /dev/fuse ]; then
	skip "/dev/fuse is not readable and writable by uid $(id -u) (mode $(stat -c %a /dev/fuse))"
fi

if [ "$(id -u)" = 0 ]; then
	command -v setpriv >/dev/null || die "setpriv (util-linux) is needed to drop privileges"
	id nobody >/dev/null 2>&1 || die "no user 'nobody' to drop to"
	RUN_UID=$(id -u nobody)
	RUN_GID=$(id -g nobody)
	as_user() { setpriv --reuid="$RUN_UID" --regid="$RUN_GID" --clear-groups -- "$@"; }
else
	RUN_UID=$(id -u)
	RUN_GID=$(id -g)
	as_user() { "$@"; }
fi

FIX=$FIXTURES/qwen2_fsdp2_w2
EXP=$WORK/exp
MNT=$WORK/mnt
"$CKFS" export --quiet "$FIX" "$EXP" || die "export failed"
chmod -R a+rX "$EXP"
mkdir -p "$MNT"
chown "$RUN_UID:$RUN_GID" "$MNT"
as_user test -r "$FIX/model_world_size_2_rank_0.pt" || skip "fixtures are not readable by uid $RUN_UID"
as_user test -x "$CKFS" || skip "the ckfs binary is not executable by uid $RUN_UID"

as_user "$CKFS" mount "$FIX" "$MNT" || die "unprivileged mount failed"
is_mounted "$MNT" || fail "not in the mount table"
for f in "$EXP"/*; do
	as_user cmp -s "$MNT/$(basename "$f")" "$f" || fail "$(basename "$f") differs"
done
[ "$(as_user stat -c %u:%g "$MNT/model.safetensors")" = "$RUN_UID:$RUN_GID" ] ||
	fail "files are not owned by the mounting user"
as_user "$PY" "$HELPER" stats "$MNT" >/dev/null || fail "stats xattr as the user"
if [ "$(id -u)" = 0 ]; then
	# Without allow_other even root is kept out (FUSE's default).
	stat "$MNT/config.json" >/dev/null 2>&1 && fail "root could access a mount without allow_other"
fi
as_user "$CKFS" umount "$MNT" || fail "unprivileged umount failed"
is_mounted "$MNT" && fail "still mounted after ckfs umount"

if ! grep -q '^[[:space:]]*user_allow_other' /etc/fuse.conf 2>/dev/null; then
	if as_user "$CKFS" mount -o allow_other "$FIX" "$MNT" 2>"$WORK/err"; then
		fail "allow_other was accepted without user_allow_other"
		as_user "$CKFS" umount "$MNT"
	fi
	grep -q "user_allow_other" "$WORK/err" || fail "allow_other refusal does not say why: $(cat "$WORK/err")"
	is_mounted "$MNT" && fail "refused allow_other left a mount"
	log "allow_other refused: $(tr '\n' ' ' <"$WORK/err")"
fi
finish
