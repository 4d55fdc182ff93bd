#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A training run mounted whole (src/fuse/run_tree.c) with small slices, a small
# cache and max_plans=1, so reads straddle slices, slices and plans are
# evicted all the time: every file of every step and role equals
# `ckfs export` of that role (cat, dd at odd block sizes, O_DIRECT, mmap);
# inodes and attributes stay the same across two looks; the tracker moving
# moves `latest` and shows the step; a step removed leaves; an idle
# daemon uses no CPU (inotify, no polling); umount stops it.
source "$(dirname "$0")/lib.sh"
require_fuse

RUN=$WORK/run
EXP=$WORK/exp
MNT=$WORK/mnt
mkdir -p "$EXP" "$MNT"
cp -a "$CKFS_ROOT/tests/fixtures/run/fsdp_ppo" "$RUN" || die "cannot copy the run fixture"

do_mount "$RUN" "$MNT" -o slice_size=4KiB,cache_size=32KiB,readahead=4,max_plans=1 ||
	die "mount of the run failed"

# Wait (up to 60 s: only a hang takes that long) for "$@" to succeed.
wait_until() {
	local n=1200
	until "$@"; do
		n=$((n - 1))
		[ $n -gt 0 ] || return 1
		sleep 0.05
	done
}

check_role() { # STEP ROLE
	local step=$1 role=$2 f
	rm -rf "$EXP/$step-$role"
	"$CKFS" export -q "$RUN/$step/$role" "$EXP/$step-$role" || { fail "export $step/$role"; return; }
	[ "$(ls "$MNT/$step/$role")" = "$(ls "$EXP/$step-$role")" ] || fail "$step/$role: names differ"
	for f in "$EXP/$step-$role"/*; do
		local m=$MNT/$step/$role/$(basename "$f")
		cmp -s "$m" "$f" || fail "$m: cat differs from export"
		dd if="$m" bs=4093 status=none | cmp -s - "$f" || fail "$m: dd bs=4093 differs"
		dd if="$m" bs=4096 iflag=direct status=none | cmp -s - "$f" ||
			fail "$m: dd iflag=direct differs"
		"$PY" -c 'import mmap,sys
a=open(sys.argv[1],"rb"); b=open(sys.argv[2],"rb").read()
m=mmap.mmap(a.fileno(),0,prot=mmap.PROT_READ) if b else b""
sys.exit(m[:] != b)' "$m" "$f" || fail "$m: mmap differs"
	done
}

[ "$(ls "$MNT" | tr '\n' ' ')" = "global_step_3 global_step_4 latest " ] ||
	fail "top: $(ls "$MNT" | tr '\n' ' ')"
[ "$(readlink "$MNT/latest")" = global_step_4 ] || fail "latest -> $(readlink "$MNT/latest")"
for step in global_step_3 global_step_4; do
	for role in actor critic; do
		check_role $step $role
	done
done
a1=$(cd "$MNT" && stat -c '%n %i %s %a' global_step_3 global_step_3/actor global_step_3/actor/*)
a2=$(cd "$MNT" && stat -c '%n %i %s %a' global_step_3 global_step_3/actor global_step_3/actor/*)
[ "$a1" = "$a2" ] || fail "attributes moved between two looks"
[ "$(stat -c %i "$MNT/global_step_3")" != "$(stat -c %i "$MNT/global_step_4")" ] ||
	fail "two steps share an inode"

# The save of step 5 ends (its second rank file lands), then the tracker
# names it, as verl does: the step appears and latest moves.
[ -e "$MNT/global_step_5" ] && fail "step 5 shown before the tracker names it"
cp "$RUN/global_step_4/actor/model_world_size_2_rank_1.pt" "$RUN/global_step_5/actor/"
cp -r "$RUN/global_step_4/actor/huggingface" "$RUN/global_step_4/actor/fsdp_config.json" \
	"$RUN/global_step_5/actor/"
[ -e "$MNT/global_step_5" ] && fail "step 5 shown before the tracker names it"
printf 5 >"$RUN/latest_checkpointed_iteration.txt"
latest_is() { [ "$(readlink "$MNT/latest")" = "$1" ]; }
wait_until latest_is global_step_5 || fail "latest never moved to step 5"
check_role global_step_5 actor

# Rotation: verl removes the role folders; the step leaves.
rm -rf "$RUN/global_step_3/actor" "$RUN/global_step_3/critic"
wait_until test ! -e "$MNT/global_step_3" || fail "rotated step 3 still shown"
[ "$(ls "$MNT" | tr '\n' ' ')" = "global_step_4 global_step_5 latest " ] ||
	fail "top after rotation: $(ls "$MNT" | tr '\n' ' ')"

# Idle: no timer, no polling. The daemon's CPU ticks over 2 s stay put
# (one tick of slack for the stats read itself) in one of three windows
# in a row: the rotation's last work may spill into the first on a busy
# machine (a TSan run once used 2 ticks there), while a daemon that
# polls uses ticks in every window.
pid=$(daemon_pid "$MNT")
ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
used=
for i in 1 2 3; do
	t0=$(ticks)
	sleep 2
	t1=$(ticks)
	used="$used $((t1 - t0))"
	[ $((t1 - t0)) -le 1 ] && break
done
[ $((t1 - t0)) -le 1 ] || fail "idle daemon used CPU ticks in each of three 2 s windows:$used"

"$CKFS" umount "$MNT" || fail "umount failed"
wait_gone "$pid" || fail "daemon $pid still running after umount"
finish
