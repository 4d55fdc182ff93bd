#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# mount(8) and /etc/fstab: "mount -t fuse.ckfs SRC MNT -o OPTS" runs
# mount.fuse3, which runs "ckfs SRC MNT -o OPTS,dev,suid" from PATH. ckfs
# keys, libfuse options and mount(8)-only options (noauto, nofail,
# x-systemd.*) all go through -o; umount(8) unmounts. allow_other from an
# fstab line carries the sources' permissions as anywhere else, and umask=
# reaches ckfs. A checkpoint that cannot be served makes mount(8) fail and
# leaves no mount.
#
# mount(8) runs helpers with the standard PATH (/usr/local/sbin:/usr/local/
# bin:/usr/sbin:...), so an installed ckfs is required; the test runs in a
# private mount namespace where a folder holding the ckfs under test is
# bind-mounted over /usr/local/sbin, leaving the real system untouched.
if [ -z "${CKFS_FSTAB_NS:-}" ] && [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
	CKFS_FSTAB_NS=1 exec unshare --mount --propagation private bash "$0" "$@"
fi
source "$(dirname "$0")/lib.sh"
require_fuse
HELPER_BIN=$(command -v mount.fuse3 || ls /sbin/mount.fuse3 /usr/sbin/mount.fuse3 2>/dev/null | head -1)
[ -n "$HELPER_BIN" ] || skip "mount.fuse3 is not installed (package fuse3)"

if [ "$(id -u)" != 0 ]; then
	# mount(8) needs root (or a "user" fstab line) for a fuse.ckfs type;
	# run the helper it would run, as this user, through fusermount3.
	FIX=$FIXTURES/qwen2_fsdp2_w2
	MNT=$WORK/mnt
	mkdir -p "$MNT" "$WORK/bin"
	ln -s "$CKFS" "$WORK/bin/ckfs"
	"$CKFS" export --quiet "$FIX" "$WORK/exp" || die "export failed"
	PATH=$WORK/bin:$PATH "$HELPER_BIN" "$FIX" "$MNT" -t fuse.ckfs -o dtype=bf16,noauto,nofail ||
		die "mount.fuse3 as uid $(id -u) failed"
	for f in "$WORK/exp"/*; do
		cmp -s "$MNT/$(basename "$f")" "$f" || fail "$(basename "$f") differs"
	done
	"$CKFS" umount "$MNT" || fail "umount"
	finish
fi
[ -n "${CKFS_FSTAB_NS:-}" ] || die "cannot make a private mount namespace (unshare)"

FIX=$FIXTURES/qwen2_fsdp2_w2
EXP=$WORK/exp
MNT=$WORK/mnt
mkdir -p "$MNT"
"$CKFS" export --quiet --dtype fp32 --max-shard-size 100KB "$FIX" "$EXP" || die "export failed"
# mount.fuse3 finds the file system type's program in mount(8)'s PATH.
mkdir -p "$WORK/bin"
ln -s "$CKFS" "$WORK/bin/ckfs"
mount --bind "$WORK/bin" /usr/local/sbin || die "cannot bind $WORK/bin over /usr/local/sbin"

mount -t fuse.ckfs "$FIX" "$MNT" \
	-o dtype=fp32,max_shard_size=100KB,cache_size=64MiB,threads=4,noauto,nofail,_netdev,x-systemd.automount,allow_other,noatime ||
	die "mount -t fuse.ckfs failed"
awk -v m="$MNT" '$2 == m && $3 == "fuse.ckfs" { f = 1 } END { exit !f }' /proc/mounts ||
	fail "/proc/mounts lacks a fuse.ckfs entry at $MNT"
grep " $MNT " /proc/mounts | grep -q allow_other || fail "allow_other not applied"
[ "$(ls "$MNT")" = "$(ls "$EXP")" ] || fail "names differ from export (sharded fp32)"
for f in "$EXP"/*; do
	cmp -s "$MNT/$(basename "$f")" "$f" || fail "$(basename "$f") differs"
done
stats=$("$CKFS" stats --json "$MNT") || fail "stats"
case $stats in *'"budget":67108864'*) ;; *) fail "cache_size not applied: $stats" ;; esac
umount "$MNT" || fail "umount(8) failed"
is_mounted "$MNT" && fail "still mounted after umount(8)"

# fstab: mount MNT alone reads the entry (through a private fstab file).
printf '%s %s fuse.ckfs ro,dtype=bf16,noauto 0 0\n' "$FIX" "$MNT" >"$WORK/fstab"
mount -T "$WORK/fstab" "$MNT" || fail "mount -T fstab failed"
cmp -s "$MNT/config.json" "$WORK/exp/config.json" && fail "fstab dtype=bf16 ignored (config says fp32)"
grep -q '"bfloat16"' "$MNT/config.json" || fail "fstab mount: config.json does not say bfloat16"
umount "$MNT" || fail "umount of the fstab mount"

# allow_other from mount(8) carries the sources' permissions: a 0600 rank
# file keeps the weights from nobody; umask=0222 (through mount.fuse3)
# publishes them on purpose.
CK=$WORK/ck
mkdir -p "$CK"
cp -r "$FIX"/model_world_size_2_rank_*.pt "$FIX"/fsdp_config.json "$FIX"/huggingface "$CK/"
chmod -R a+rX "$CK"
chmod 600 "$CK/model_world_size_2_rank_1.pt"
mount -t fuse.ckfs "$CK" "$MNT" -o dtype=fp32,max_shard_size=100KB,allow_other,nofail ||
	die "mount -t fuse.ckfs of a 0600 rank file failed"
for f in "$MNT"/model-*.safetensors; do
	[ "$(stat -c %a "$f")" = 400 ] || fail "mount(8), 0600 rank file: $(basename "$f") is $(stat -c %a "$f")"
	runuser -u nobody -- "$PY" "$HELPER" errno "$f" EACCES ||
		fail "mount(8) allow_other: nobody read $(basename "$f") made from a 0600 rank file"
done
runuser -u nobody -- cmp -s "$MNT/config.json" "$EXP/config.json" ||
	fail "mount(8) allow_other: nobody cannot read config.json"
umount "$MNT" || fail "umount(8) failed"
mount -t fuse.ckfs "$CK" "$MNT" -o dtype=fp32,max_shard_size=100KB,allow_other,umask=0222 ||
	die "mount -t fuse.ckfs with umask=0222 failed"
for f in "$EXP"/*; do
	runuser -u nobody -- cmp -s "$MNT/$(basename "$f")" "$f" ||
		fail "mount(8) umask=0222: nobody cannot read $(basename "$f")"
done
umount "$MNT" || fail "umount(8) failed"

# A refusal through mount(8): non-zero, no mount left.
mkdir -p "$WORK/empty"
if mount -t fuse.ckfs "$WORK/empty" "$MNT" 2>"$WORK/err"; then
	fail "mount(8) of an empty folder succeeded"
	umount "$MNT"
fi
grep -q "not a verl FSDP checkpoint" "$WORK/err" || fail "mount(8) error: $(cat "$WORK/err")"
is_mounted "$MNT" && fail "refused mount(8) left a mount"
log "refusal: $(cat "$WORK/err")"
finish
