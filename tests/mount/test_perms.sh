#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Permissions carry over from the sources to the mount and to exports
# (docs/mount.md, "Permissions"): a served file is 0444 masked by what
# every file it is made from allows, the root 0555 masked by the
# checkpoint folder, so `-o allow_other` never lets anyone read what they
# could not read on disk. `-o umask=` publishes on purpose.
#
# Other users are played by root through runuser: nobody (group nogroup)
# and daemon (uid 1, not in nogroup). Cases:
#   a 0600 rank file under allow_other: nobody gets EACCES (the regression)
#   a 0600 tokenizer: only that side file is closed; a 0644 one symlinked
#     into a 0700 folder likewise
#   a 0700 huggingface/: config.json and side files closed, root unlistable
#   a 0700 checkpoint folder: the root cannot be traversed
#   0640 rank files of group nogroup: readable with gid=nogroup by nobody,
#     not by daemon; without gid= the group shown is root's, so closed
#   a 0644 rank file whose ACL shuts daemon out: owner only
#   umask=0222 publishes, umask=0227 publishes to the group only
#   without allow_other nobody cannot even stat (FUSE's rule)
#   a source chmod-ed after mounting fails reads with EIO
#   nobody mounts its own 0600 checkpoint with and without allow_other
#   ckfs export writes 0600 files for 0600 sources (weights read-only:
#     0400), a 0700 folder for a 0700 checkpoint
# The test runs in a private mount namespace: a fuse.conf with
# user_allow_other is bound over /etc/fuse.conf there (and a 0666 node
# over /dev/fuse where it is 0600), leaving the system untouched.
if [ -z "${CKFS_PERMS_NS:-}" ] && [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
	CKFS_PERMS_NS=1 exec unshare --mount --propagation private bash "$0" "$@"
fi
source "$(dirname "$0")/lib.sh"
require_fuse
umask 022

FIX=$FIXTURES/qwen2_fsdp2_w2
EXP=$WORK/exp
MNT=$WORK/mnt
mkdir -p "$MNT"
"$CKFS" export --quiet "$FIX" "$EXP" || die "export failed"
chmod -R a+rX "$EXP"

# A fresh copy of the checkpoint (weights, fsdp_config.json, huggingface/).
fresh() {
	rm -rf "$WORK/ck"
	mkdir -p "$WORK/ck"
	cp "$FIX"/model_world_size_2_rank_*.pt "$FIX"/fsdp_config.json "$WORK/ck/"
	cp -r "$FIX/huggingface" "$WORK/ck/"
	chmod -R u=rwX,go=rX "$WORK/ck"
	CK=$WORK/ck
}
expect_mode() { # PATH MODE LABEL [USER]: the mode USER (default: this one) sees
	local got
	if [ -n "${4:-}" ]; then
		got=$(runuser -u "$4" -- stat -c %a "$1")
	else
		got=$(stat -c %a "$1")
	fi
	[ "$got" = "$2" ] || fail "$3: $(basename "$1") is '$got', expected $2"
}

if [ "$(id -u)" != 0 ]; then
	# No other user to act as: check the modes shown to this user only.
	fresh
	chmod 600 "$CK/model_world_size_2_rank_1.pt"
	do_mount "$CK" "$MNT" || die "mount failed"
	expect_mode "$MNT/model.safetensors" 400 "uid $(id -u), 0600 rank file"
	expect_mode "$MNT/config.json" 444 "uid $(id -u), 0600 rank file"
	cmp -s "$MNT/model.safetensors" "$EXP/model.safetensors" || fail "owner cannot read"
	"$CKFS" umount "$MNT" || fail "umount"
	log "not root: other users not tested"
	finish
fi

[ -n "${CKFS_PERMS_NS:-}" ] || die "cannot make a private mount namespace (unshare)"
command -v runuser >/dev/null || die "runuser (util-linux) is needed to act as other users"
id nobody >/dev/null 2>&1 && id daemon >/dev/null 2>&1 || die "users nobody and daemon are needed"
NOGROUP=$(id -g nobody)
id -G daemon | tr ' ' '\n' | grep -qx "$NOGROUP" && die "daemon is in nobody's group"
as() { local u=$1; shift; runuser -u "$u" -- "$@"; }
as nobody test -x "$CKFS" || skip "the ckfs binary is not executable by nobody"
as nobody test -r "$HELPER" || skip "tests/mount is not readable by nobody"

# Whether USER reads FILE equal to the export.
reads() { as "$1" cmp -s "$2" "$EXP/$(basename "$2")"; }
# Whether USER is refused reading FILE with EACCES.
denied() { as "$1" "$PY" "$HELPER" errno "$2" EACCES 2>/dev/null; }
# Whether USER is refused stat(FILE) with EACCES.
stat_denied() {
	! as "$1" stat "$2" >/dev/null 2>"$WORK/err" && grep -q "Permission denied" "$WORK/err"
}
mount_ck() { do_mount "$@" "$CK" "$MNT" || die "mount $* failed"; }
unmount() { "$CKFS" umount "$MNT" || die "umount failed"; }

# ---- the regression: a 0600 rank file under allow_other ----
fresh
chmod 600 "$CK/model_world_size_2_rank_1.pt"
mount_ck -o allow_other
expect_mode "$MNT/model.safetensors" 400 "0600 rank file"
expect_mode "$MNT/config.json" 444 "0600 rank file"
expect_mode "$MNT/tokenizer.json" 444 "0600 rank file"
expect_mode "$MNT" 555 "0600 rank file"
denied nobody "$MNT/model.safetensors" || fail "nobody read a weight file made from a 0600 rank file"
reads nobody "$MNT/config.json" || fail "nobody cannot read config.json (0644 source)"
reads nobody "$MNT/tokenizer.json" || fail "nobody cannot read tokenizer.json (0644 source)"
cmp -s "$MNT/model.safetensors" "$EXP/model.safetensors" || fail "root cannot read its own mount"
unmount

# The same with shards: only the shards holding tensors of rank 1 close.
fresh
"$CKFS" export --quiet --max-shard-size 100KB "$FIX" "$WORK/exp_sharded" || die "sharded export failed"
chmod -R a+rX "$WORK/exp_sharded"
chmod 600 "$CK/model_world_size_2_rank_1.pt"
mount_ck -o allow_other,max_shard_size=100KB
n_shards=0
for f in "$MNT"/model-*.safetensors; do
	n_shards=$((n_shards + 1))
	expect_mode "$f" 400 "sharded, 0600 rank file"
done
[ "$n_shards" -gt 1 ] || fail "expected several shards, got $n_shards"
expect_mode "$MNT/model.safetensors.index.json" 400 "sharded, 0600 rank file"
denied nobody "$MNT/model.safetensors.index.json" || fail "nobody read the index of 0600 weights"
unmount

# ---- a 0600 tokenizer: that side file alone ----
fresh
chmod 600 "$CK/huggingface/tokenizer.json"
mount_ck -o allow_other
expect_mode "$MNT/tokenizer.json" 400 "0600 tokenizer"
expect_mode "$MNT/tokenizer_config.json" 444 "0600 tokenizer"
expect_mode "$MNT/model.safetensors" 444 "0600 tokenizer"
denied nobody "$MNT/tokenizer.json" || fail "nobody read a 0600 tokenizer"
reads nobody "$MNT/tokenizer_config.json" || fail "nobody cannot read tokenizer_config.json"
reads nobody "$MNT/model.safetensors" || fail "nobody cannot read the weights (0644 sources)"
unmount

# A 0644 tokenizer reached through a symlink into a 0700 folder: as private.
fresh
mkdir -m 700 "$CK/private"
mv "$CK/huggingface/tokenizer.json" "$CK/private/"
ln -s ../private/tokenizer.json "$CK/huggingface/tokenizer.json"
mount_ck -o allow_other
expect_mode "$MNT/tokenizer.json" 400 "tokenizer symlinked into a 0700 folder"
denied nobody "$MNT/tokenizer.json" || fail "nobody read a tokenizer symlinked into a 0700 folder"
unmount

# ---- a 0700 huggingface/: everything from it closes; its names too ----
fresh
chmod 700 "$CK/huggingface"
mount_ck -o allow_other
expect_mode "$MNT/config.json" 400 "0700 huggingface/"
expect_mode "$MNT/tokenizer.json" 400 "0700 huggingface/"
expect_mode "$MNT/model.safetensors" 444 "0700 huggingface/"
expect_mode "$MNT" 511 "0700 huggingface/"
denied nobody "$MNT/config.json" || fail "nobody read config.json from a 0700 huggingface/"
denied nobody "$MNT/chat_template.jinja" || fail "nobody read a side file from a 0700 huggingface/"
as nobody ls "$MNT" >/dev/null 2>&1 && fail "nobody listed side-file names of a 0700 huggingface/"
reads nobody "$MNT/model.safetensors" || fail "nobody cannot read the weights (0644 sources)"
unmount

# ---- a 0700 checkpoint folder: the root cannot be traversed ----
fresh
chmod 700 "$CK"
mount_ck -o allow_other
expect_mode "$MNT" 500 "0700 checkpoint folder"
stat_denied nobody "$MNT/config.json" || fail "nobody could stat inside a 0700 checkpoint"
as nobody ls "$MNT" >/dev/null 2>&1 && fail "nobody listed a 0700 checkpoint"
cmp -s "$MNT/config.json" "$EXP/config.json" || fail "root cannot read config.json"
unmount

# ---- 0640 rank files of group nogroup ----
fresh
chgrp "$NOGROUP" "$CK"/model_world_size_2_rank_*.pt
chmod 640 "$CK"/model_world_size_2_rank_*.pt
mount_ck -o allow_other,gid="$NOGROUP"
expect_mode "$MNT/model.safetensors" 440 "0640 group nogroup, gid=nogroup"
[ "$(stat -c %g "$MNT/model.safetensors")" = "$NOGROUP" ] || fail "gid= not shown"
reads nobody "$MNT/model.safetensors" || fail "nobody (in nogroup) cannot read 0640 weights of group nogroup"
denied daemon "$MNT/model.safetensors" || fail "daemon (not in nogroup) read 0640 weights of group nogroup"
reads daemon "$MNT/config.json" || fail "daemon cannot read config.json"
unmount
mount_ck -o allow_other
# Shown as group root, which the sources did not open to: owner only.
expect_mode "$MNT/model.safetensors" 400 "0640 group nogroup, shown as group root"
denied nobody "$MNT/model.safetensors" || fail "nobody read 0640 weights shown as group root"
unmount

# ---- an ACL shutting daemon out of a 0644 rank file ----
# ckfs does not read ACL entries: only the owner keeps read (fail closed).
fresh
if "$PY" "$HELPER" deny "$CK/model_world_size_2_rank_0.pt" "$(id -u daemon)" 2>"$WORK/err"; then
	as daemon cat "$CK/model_world_size_2_rank_0.pt" >/dev/null 2>&1 &&
		die "the ACL did not shut daemon out of the rank file"
	mount_ck -o allow_other
	expect_mode "$MNT/model.safetensors" 400 "ACL"
	denied daemon "$MNT/model.safetensors" || fail "daemon read weights whose rank file's ACL shuts it out"
	reads daemon "$MNT/config.json" || fail "daemon cannot read config.json (no ACL)"
	unmount
else
	log "no POSIX ACLs on $WORK ($(cat "$WORK/err")): ACL case not run"
fi

# ---- umask= publishes on purpose ----
fresh
chmod 600 "$CK/model_world_size_2_rank_1.pt"
chmod 700 "$CK"
mount_ck -o allow_other,umask=0222
expect_mode "$MNT" 555 "umask=0222"
expect_mode "$MNT/model.safetensors" 444 "umask=0222"
reads nobody "$MNT/model.safetensors" || fail "umask=0222: nobody cannot read"
unmount
mount_ck -o allow_other,umask=0227,gid="$NOGROUP"
expect_mode "$MNT" 550 "umask=0227"
expect_mode "$MNT/model.safetensors" 440 "umask=0227"
reads nobody "$MNT/model.safetensors" || fail "umask=0227: nobody (group) cannot read"
stat_denied daemon "$MNT/model.safetensors" || fail "umask=0227: daemon could stat"
unmount
for bad in umask=0888 umask=abc umask= umask=01000; do
	if do_mount -o "$bad" "$CK" "$MNT" 2>"$WORK/err"; then
		fail "-o $bad was accepted"
		unmount
		continue
	fi
	grep -q "umask" "$WORK/err" || fail "-o $bad: $(cat "$WORK/err")"
done

# ---- without allow_other nobody cannot even stat ----
fresh
mount_ck
expect_mode "$MNT/model.safetensors" 444 "no allow_other"
stat_denied nobody "$MNT/config.json" || fail "nobody could stat a mount without allow_other"
unmount

# ---- a source chmod-ed after mounting: reads that need it fail ----
fresh
mount_ck -o allow_other
chmod 600 "$CK/model_world_size_2_rank_1.pt"
as nobody "$PY" "$HELPER" errno "$MNT/model.safetensors" EIO ||
	fail "a rank file chmod-ed to 0600 after mounting still served its bytes"
reads nobody "$MNT/config.json" || fail "config.json broken by a rank file's chmod"
unmount

# ---- an unprivileged mount, with and without allow_other ----
# libfuse opens /dev/fuse as the user; fusermount3 reads /etc/fuse.conf.
if [ "$(stat -c %a /dev/fuse)" != 666 ]; then
	mknod -m 666 "$WORK/fuse" c "$((0x$(stat -c %t /dev/fuse)))" "$((0x$(stat -c %T /dev/fuse)))" &&
		mount --bind "$WORK/fuse" /dev/fuse || die "cannot bind a 0666 /dev/fuse"
fi
printf 'user_allow_other\n' >"$WORK/fuse.conf"
mount --bind "$WORK/fuse.conf" /etc/fuse.conf || die "cannot bind a fuse.conf over /etc/fuse.conf"
fresh
chmod 600 "$CK/model_world_size_2_rank_1.pt"
chown -R nobody:"$NOGROUP" "$CK"
chown nobody "$MNT"
as nobody "$CKFS" mount "$CK" "$MNT" || die "nobody's mount failed"
expect_mode "$MNT/model.safetensors" 400 "nobody's mount" nobody
reads nobody "$MNT/model.safetensors" || fail "nobody cannot read its own 0600 checkpoint"
stat "$MNT/config.json" >/dev/null 2>&1 && fail "root could stat nobody's mount without allow_other"
as nobody "$CKFS" umount "$MNT" || die "nobody's umount failed"
as nobody "$CKFS" mount -o allow_other "$CK" "$MNT" || die "nobody's allow_other mount failed"
expect_mode "$MNT/model.safetensors" 400 "nobody's allow_other mount"
reads nobody "$MNT/model.safetensors" || fail "nobody cannot read its own allow_other mount"
denied daemon "$MNT/model.safetensors" || fail "daemon read nobody's 0600 rank file through allow_other"
reads daemon "$MNT/config.json" || fail "daemon cannot read config.json of nobody's allow_other mount"
as nobody "$CKFS" umount "$MNT" || die "nobody's umount failed"
chown root "$MNT"

# ---- ckfs export carries them too ----
fresh
chmod 600 "$CK/model_world_size_2_rank_1.pt" "$CK/huggingface/tokenizer.json"
"$CKFS" export --quiet "$CK" "$WORK/out" || die "export of a 0600 rank file failed"
expect_mode "$WORK/out/model.safetensors" 400 "export (weights read-only)"
expect_mode "$WORK/out/tokenizer.json" 600 "export"
expect_mode "$WORK/out/config.json" 644 "export"
expect_mode "$WORK/out" 755 "export"
cmp -s "$WORK/out/model.safetensors" "$EXP/model.safetensors" || fail "export differs"
chmod 700 "$CK"
"$CKFS" export --quiet --force "$CK" "$WORK/out" || die "export of a 0700 checkpoint failed"
expect_mode "$WORK/out" 700 "export of a 0700 checkpoint"
expect_mode "$WORK/out/model.safetensors" 400 "export of a 0700 checkpoint"
expect_mode "$WORK/out/config.json" 600 "export of a 0700 checkpoint"
finish
