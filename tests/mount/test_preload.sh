#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# -o preload (issue #28 item 2): the weight files are stored into the
# kernel's page cache from the mount's start (src/fuse/preload.c).
#   - once the stats say the preload is done, every weight file equals
#     `ckfs export` of the checkpoint and reading it whole sends the
#     daemon no READ at all: the kernel had exactly those bytes;
#   - sharded output (several weight files, in file order) with a budget:
#     the first preload_max bytes only, the rest read through FUSE, all
#     equal to the export;
#   - readers while the preload runs (8 threads of random preads, then a
#     second round while it runs free): every byte equal, and the slices
#     the readers had brought in are skipped, not stored again;
#   - the page cache dropped mid-preload (drop_caches, the inode with it):
#     the preload carries on, and the pages it had stored are read again
#     through FUSE, equal to the export;
#   - a rank file changed mid-preload: the preload stops with an error
#     and reads of what it had not stored fail with EIO, as without
#     preload.
# The preload is stopped at a chosen slice through its test gate
# (CKFS_PRELOAD_GATE, a FIFO it reads one byte from per slice), never by
# timing.
source "$(dirname "$0")/lib.sh"
require_fuse

FIX=$FIXTURES/qwen2_fsdp2_w2
CK=$WORK/ck
MNT=$WORK/mnt
EXP=$WORK/exp
mkdir -p "$MNT"
cp -a "$FIX" "$CK"
"$CKFS" export -q "$CK" "$EXP" || die "export"
"$CKFS" export -q --max-shard-size 100KB "$CK" "$WORK/exp-sharded" || die "export sharded"
SIZE=$(stat -c %s "$EXP/model.safetensors")
S=4096

stat_of() { # MNT KEY
	"$CKFS" stats --json "$1" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2"
}
# Wait (up to 60 s) until stat KEY of MNT is at least N.
wait_stat() { # MNT KEY N
	local n=1200
	while [ "$(stat_of "$1" "$2")" -lt "$3" ]; do
		n=$((n - 1))
		[ $n -gt 0 ] || return 1
		sleep 0.05
	done
}
# The gate: a FIFO held open here (read-write: the open does not block)
# on fd 7, which ckfs must not inherit.
open_gate() {
	mkfifo "$WORK/gate"
	exec 7<>"$WORK/gate"
}
close_gate() {
	exec 7>&-
	rm -f "$WORK/gate"
}

# ---- done: the kernel holds exactly the exported bytes ----
do_mount "$CK" "$MNT" -o preload,slice_size=4KiB || die "mount -o preload"
wait_stat "$MNT" preload_done 1 || die "preload never done"
[ "$(stat_of "$MNT" preload_bytes)" = "$SIZE" ] || fail "preload_bytes is not the file's size"
[ "$(stat_of "$MNT" preload_stored)" = "$SIZE" ] || fail "preload_stored: $(stat_of "$MNT" preload_stored) of $SIZE"
[ "$(stat_of "$MNT" preload_errors)" = 0 ] || fail "preload errors"
cmp -s "$MNT/model.safetensors" "$EXP/model.safetensors" || fail "preloaded model.safetensors differs"
"$PY" "$HELPER" mmap "$MNT/model.safetensors" "$EXP/model.safetensors" || fail "mmap of the preloaded file"
[ "$(stat_of "$MNT" reads)" = 0 ] ||
	fail "$(stat_of "$MNT" reads) READs reached the daemon after the preload"
"$CKFS" stats "$MNT" | grep -qE '^preload +[0-9.]+ [KMG]?i?B of .* stored \(done\)' ||
	fail "ckfs stats: no 'preload' line"
"$CKFS" umount "$MNT" || fail "umount"
log "done: $SIZE bytes stored, the file read from the page cache alone"

# Without -o preload nothing is stored.
do_mount "$CK" "$MNT" -o slice_size=4KiB || die "mount"
[ "$(stat_of "$MNT" preload_bytes) $(stat_of "$MNT" preload_stored)" = "0 0" ] ||
	fail "preloaded without -o preload"
"$CKFS" umount "$MNT" || fail "umount"

# ---- sharded, within a budget: the first bytes in file order ----
do_mount "$CK" "$MNT" -o preload,preload_max=150KiB,slice_size=4KiB,max_shard_size=100KB ||
	die "mount sharded"
wait_stat "$MNT" preload_done 1 || die "sharded: preload never done"
shards=$(cd "$WORK/exp-sharded" && ls model-*.safetensors)
[ "$(echo "$shards" | wc -l)" -ge 2 ] || die "the sharded export has one file"
first=$(echo "$shards" | head -1)
want=$(( $(stat -c %s "$WORK/exp-sharded/$first") ))
# Whole slices of the first shard, then of the second while 150 KiB last.
"$PY" - "$WORK/exp-sharded" 153600 $S $(echo $shards) >"$WORK/want" <<'PY'
import os, sys
d, left, s, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
stored = 0
for n in names:
    size = os.path.getsize(os.path.join(d, n))
    for off in range(0, size, s):
        ln = min(s, size - off)
        if ln > left:
            print(stored)
            sys.exit()
        left -= ln
        stored += ln
print(stored)
PY
[ "$(stat_of "$MNT" preload_stored)" = "$(cat "$WORK/want")" ] ||
	fail "sharded: stored $(stat_of "$MNT" preload_stored), expected $(cat "$WORK/want")"
for f in $shards model.safetensors.index.json; do
	cmp -s "$MNT/$f" "$WORK/exp-sharded/$f" || fail "sharded: $f differs"
done
[ "$(stat_of "$MNT" reads)" -gt 0 ] || fail "sharded: nothing beyond the budget was read through FUSE"
"$CKFS" umount "$MNT" || fail "umount"
log "sharded: $(cat "$WORK/want") bytes of $(echo $shards | wc -w) files stored within 150 KiB"

# ---- readers beside the preload ----
open_gate
CKFS_PRELOAD_GATE=$WORK/gate do_mount "$CK" "$MNT" -o preload,slice_size=4KiB 7>&- ||
	die "mount with the gate"
printf 'xxxxxxxxxx' >&7
wait_stat "$MNT" preload_stored $((10 * S)) || die "gate: ten slices never stored"
"$PY" "$HELPER" random "$MNT/model.safetensors" "$EXP/model.safetensors" --count 50 ||
	fail "readers: random reads beside a held preload"
close_gate
"$PY" "$HELPER" random "$MNT/model.safetensors" "$EXP/model.safetensors" --count 50 ||
	fail "readers: random reads beside a running preload"
wait_stat "$MNT" preload_done 1 || die "readers: preload never done"
[ "$(stat_of "$MNT" preload_errors)" = 0 ] || fail "readers: preload errors"
[ "$(stat_of "$MNT" preload_skipped)" -gt 0 ] || fail "readers: nothing skipped"
[ $(( $(stat_of "$MNT" preload_stored) + $(stat_of "$MNT" preload_skipped) )) = "$SIZE" ] ||
	fail "readers: stored + skipped is not the file"
cmp -s "$MNT/model.safetensors" "$EXP/model.safetensors" || fail "readers: model.safetensors differs"
log "readers beside the preload: equal, $(stat_of "$MNT" preload_skipped) bytes left to them"
"$CKFS" umount "$MNT" || fail "umount"

# ---- the page cache dropped mid-preload ----
if [ -w /proc/sys/vm/drop_caches ]; then
	open_gate
	CKFS_PRELOAD_GATE=$WORK/gate do_mount "$CK" "$MNT" -o preload,slice_size=4KiB 7>&- ||
		die "mount with the gate"
	printf 'xxxx' >&7
	wait_stat "$MNT" preload_stored $((4 * S)) || die "gate: four slices never stored"
	sync
	echo 3 >/proc/sys/vm/drop_caches
	close_gate
	wait_stat "$MNT" preload_done 1 || die "drop: preload never done"
	[ "$(stat_of "$MNT" preload_stored)" = "$SIZE" ] || fail "drop: stored $(stat_of "$MNT" preload_stored) of $SIZE"
	[ "$(stat_of "$MNT" preload_errors)" = 0 ] || fail "drop: preload errors"
	cmp -s "$MNT/model.safetensors" "$EXP/model.safetensors" || fail "drop: model.safetensors differs"
	[ "$(stat_of "$MNT" reads)" -gt 0 ] || fail "drop: the dropped pages were not read through FUSE"
	log "drop_caches mid-preload: equal, $(stat_of "$MNT" reads) READs for the dropped pages"
	"$CKFS" umount "$MNT" || fail "umount"
else
	log "SKIP: drop_caches case (/proc/sys/vm/drop_caches is not writable)"
fi

# ---- a rank file changed mid-preload ----
open_gate
CKFS_PRELOAD_GATE=$WORK/gate do_mount "$CK" "$MNT" -o preload,slice_size=4KiB 7>&- ||
	die "mount with the gate"
printf 'x' >&7
wait_stat "$MNT" preload_stored $S || die "gate: one slice never stored"
touch "$CK/model_world_size_2_rank_1.pt"
close_gate
wait_stat "$MNT" preload_done 1 || die "changed: preload never done"
[ "$(stat_of "$MNT" preload_errors)" = 1 ] || fail "changed: preload_errors is not 1"
[ "$(stat_of "$MNT" preload_stored)" -lt "$SIZE" ] || fail "changed: everything stored"
"$PY" "$HELPER" errno "$MNT/model.safetensors" EIO || fail "changed: read errno is not EIO"
daemon_pid "$MNT" >/dev/null || fail "changed: the daemon is gone"
"$CKFS" umount "$MNT" || fail "umount"
log "changed mid-preload: preload stopped, reads fail with EIO"

finish
