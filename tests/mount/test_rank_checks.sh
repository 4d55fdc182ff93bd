#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# -o rank_checks (docs/mount.md): with rank_checks=read a verl FSDP
# actor's ranks other than rank 0 are checked by a thread after the mount
# is ready, and no tensor byte is served before they all passed. A rank
# inconsistent with rank 0 (tests/corpus/checkpoints/model_shape_mismatch:
# rank 1's global shape differs) is refused before any byte of it is
# served: reads of the weights fail with EIO, nothing was read from the
# sources to serve them, one log line names the file and the cause, and
# the rest of the folder keeps working. With rank_checks=mount the mount
# itself fails with that message. A consistent actor serves the same bytes
# as `ckfs export` with the checks deferred, and again when a second mount
# takes the positions from the plan cache; a damaged record, a record
# others may write, and a rank file changed since (its ctime moves) make
# the ranks checked again. The cache keeps to its budget (256 MiB): a
# store removes the records used least recently.
source "$(dirname "$0")/lib.sh"
require_fuse

CORPUS=$CKFS_ROOT/tests/corpus/checkpoints
export CKFS_PLAN_CACHE=$WORK/plans

stat_of() { # MNT KEY
	"$CKFS" stats --json "$1" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['$2'])"
}

# ---- an inconsistent rank, checks deferred: mounted, reads refused ----
BAD=$WORK/bad
cp -a "$CORPUS/model_shape_mismatch" "$BAD"
CAUSE="'$BAD/model_world_size_2_rank_1.pt': tensor 'model.embed_tokens.weight': global shape [8, 4] on rank 0 but [10, 4] on rank 1"
mnt=$WORK/mnt-read
mkdir -p "$mnt"
start_foreground "$WORK/log-read" "$WORK/notify-read.sock" -o rank_checks=read "$BAD" "$mnt"
pid=$FG_PID
[ -s "$mnt/config.json" ] || fail "read: config.json is not served"
ls -l "$mnt" >/dev/null || fail "read: ls"
if out=$(dd if="$mnt/model.safetensors" of=/dev/null bs=1M 2>&1); then
	fail "read: dd of model.safetensors succeeded with an inconsistent rank 1"
else
	case $out in *"Input/output error"*) ;; *) fail "read: dd said '$out'" ;; esac
fi
"$PY" "$HELPER" errno "$mnt/model.safetensors" EIO || fail "read: read errno"
[ "$(stat_of "$mnt" source_bytes_read)" = 0 ] ||
	fail "read: $(stat_of "$mnt" source_bytes_read) source bytes were read to serve data"
# the checks' line, once, and the failed read's, which names the cause too
[ "$(grep -cxF "ckfs: $CAUSE" "$WORK/log-read")" = 1 ] ||
	fail "read: expected one log line '$CAUSE', got: $(cat "$WORK/log-read")"
grep -qF "'model.safetensors': read of " "$WORK/log-read" ||
	fail "read: no log line for the failed read: $(cat "$WORK/log-read")"
kill -0 "$pid" 2>/dev/null || die "read: the daemon died"
kill -TERM "$pid"
wait "$pid" || fail "read: daemon exit status $? after SIGTERM"
is_mounted "$mnt" && fail "read: still mounted"
log "read: refused, '$(grep -F "$CAUSE" "$WORK/log-read" | head -1)'"

# ---- the same, checks at mount: the mount fails ----
mnt=$WORK/mnt-mount
mkdir -p "$mnt"
if "$CKFS" mount -o rank_checks=mount "$BAD" "$mnt" 2>"$WORK/log-mount"; then
	fail "mount: rank_checks=mount mounted an inconsistent actor"
	"$CKFS" umount "$mnt"
fi
grep -qF "$CAUSE" "$WORK/log-mount" || fail "mount: message '$(cat "$WORK/log-mount")'"
is_mounted "$mnt" && fail "mount: mounted"
if "$CKFS" mount -o rank_checks=sometimes "$BAD" "$mnt" 2>/dev/null; then
	fail "rank_checks=sometimes was accepted"
fi

# ---- a consistent actor: deferred checks, then the plan cache ----
GOOD=$WORK/good
cp -a "$FIXTURES/qwen2_fsdp2_w2" "$GOOD"
CKFS_PLAN_CACHE=off "$CKFS" export --quiet "$GOOD" "$WORK/exp" || die "export of $GOOD failed"
for run in checked cached; do
	mnt=$WORK/mnt-$run
	mkdir -p "$mnt"
	"$CKFS" mount --log-level info -f -o rank_checks=read "$GOOD" "$mnt" 2>"$WORK/log-$run" &
	PIDS="$PIDS $!"
	for _ in $(seq 100); do is_mounted "$mnt" && break; sleep 0.1; done
	cmp -s "$mnt/model.safetensors" "$WORK/exp/model.safetensors" ||
		fail "$run: model.safetensors differs from the export"
	"$CKFS" umount "$mnt" || fail "$run: umount"
	wait
done
ls "$CKFS_PLAN_CACHE"/*.plan >/dev/null 2>&1 || fail "no plan cache record was written"
grep -q "from the plan cache" "$WORK/log-checked" && fail "checked: the first mount used the cache"
grep -q "from the plan cache" "$WORK/log-cached" || fail "cached: the second mount did not use the cache"

# ---- a rank file changed after it was cached: checked again ----
# model_shape_mismatch is ok_base with rank 1 from a wider model
cp "$BAD/model_world_size_2_rank_1.pt" "$WORK/r1"
cp -a "$CORPUS/ok_base" "$WORK/base"
"$CKFS" inspect "$WORK/base" >/dev/null || fail "inspect of ok_base"
"$CKFS" inspect "$WORK/base" >/dev/null || fail "inspect of ok_base, cached"
# a damaged record is not used (its checksum), nor one others may write
rec=$(ls -t "$CKFS_PLAN_CACHE"/*.plan | head -1)
"$CKFS" inspect --log-level info "$WORK/base" 2>&1 >/dev/null | grep -q "from the plan cache" ||
	fail "cache: ok_base's record was not used"
printf '\x01' | dd of="$rec" bs=1 seek=$(($(stat -c %s "$rec") - 12)) conv=notrunc status=none
"$CKFS" inspect --log-level info "$WORK/base" 2>&1 >/dev/null | grep -q "from the plan cache" &&
	fail "cache: a damaged record was used"
chmod 0666 "$rec" # rewritten by the inspect above: now writable by anyone
"$CKFS" inspect --log-level info "$WORK/base" 2>&1 >/dev/null | grep -q "from the plan cache" &&
	fail "cache: a record writable by others was used"
cat "$WORK/r1" >"$WORK/base/model_world_size_2_rank_1.pt" # same inode, new ctime
if "$CKFS" inspect "$WORK/base" >/dev/null 2>"$WORK/log-changed"; then
	fail "changed: inspect accepted rank 1 from the cache"
fi
grep -qF "global shape [8, 4] on rank 0 but [10, 4] on rank 1" "$WORK/log-changed" ||
	fail "changed: message '$(cat "$WORK/log-changed")'"

# ---- the budget: a store removes the least recently used records ----
# (sparse stand-ins: their sizes count, not their blocks)
truncate -s 200M "$CKFS_PLAN_CACHE/0000000000000001.plan"
truncate -s 100M "$CKFS_PLAN_CACHE/0000000000000002.plan"
touch -d '2 days ago' "$CKFS_PLAN_CACHE/0000000000000001.plan"
touch -d '1 day ago' "$CKFS_PLAN_CACHE/0000000000000002.plan"
rm -rf "$WORK/good2" && cp -a "$FIXTURES/qwen2_fsdp2_w2" "$WORK/good2"
"$CKFS" inspect "$WORK/good2" >/dev/null || fail "budget: inspect"
[ -e "$CKFS_PLAN_CACHE/0000000000000001.plan" ] && fail "budget: the oldest record was kept"
[ -e "$CKFS_PLAN_CACHE/0000000000000002.plan" ] || fail "budget: a record within the budget was removed"
[ "$(ls "$CKFS_PLAN_CACHE"/*.plan | wc -l)" -ge 3 ] || fail "budget: the new record is missing"
finish
