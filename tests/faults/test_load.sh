#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Faults under load: a mounted checkpoint read by 16 threads (random-range
# preads on model.safetensors and config.json, half of them O_DIRECT) for
# ~20 s while its rank files are truncated and restored, replaced by
# rename, deleted and touched (tests/faults/load.py). Every read that
# returns must return the bytes `ckfs export` wrote (zero wrong bytes);
# every read that fails must fail with EIO; config.json never fails; the
# daemon stays alive; once every fault is undone the file reads back
# whole; `ckfs umount` ends the daemon with status 0.
#
# The slice cache is made tiny (4 KiB slices, 16 KiB budget) so that most
# reads are assembled from the rank files while they change, instead of
# being served from bytes cached before a fault.
#
# Usage: bash tests/faults/test_load.sh [PATH/TO/ckfs]   (CKFS_LOAD_SECONDS=20)
# Exit 77 only when /dev/fuse is missing (tests/mount/lib.sh).
source "$(dirname "$0")/../mount/lib.sh"
require_fuse

LOAD_SECONDS=${CKFS_LOAD_SECONDS:-20}
FIX=$FIXTURES/qwen2_fsdp2_w8
CK=$WORK/ck
MNT=$WORK/mnt
cp -a "$FIX" "$CK" || die "cannot copy $FIX"
"$CKFS" export --quiet "$CK" "$WORK/exp" || die "export of $CK failed"
mkdir "$MNT"
start_foreground "$WORK/log" "$WORK/notify.sock" -o slice_size=4096 --cache-size 16KiB \
	"$CK" "$MNT"
pid=$FG_PID
cmp -s "$MNT/model.safetensors" "$WORK/exp/model.safetensors" || fail "model.safetensors differs before any fault"

"$PY" "$(dirname "$0")/load.py" "$MNT" "$CK" "$WORK/exp" "$pid" --seconds "$LOAD_SECONDS" ||
	fail "readers under faults (see the lines above)"

if ! kill -0 "$pid" 2>/dev/null; then
	wait "$pid"
	st=$?
	how="exit status $st"
	[ "$st" -gt 128 ] && how="killed by signal $((st - 128)) (SIG$(kill -l $((st - 128))))"
	die "the daemon died, $how (log: $(tail -5 "$WORK/log"))"
fi
errs=$("$CKFS" stats --json "$MNT" | "$PY" -c 'import json,sys; s=json.load(sys.stdin); print(s["errors"], s["fill_errors"])') ||
	fail "stats after the load"
log "daemon counted failed reads, failed slice fills: $errs"
log "daemon log: $(grep -c "'model.safetensors'" "$WORK/log") error line(s) about model.safetensors (rate-limited)"
"$CKFS" umount "$MNT" || fail "ckfs umount"
wait "$pid" || fail "daemon exit status $? after umount"
is_mounted "$MNT" && fail "still mounted after ckfs umount"
# Nothing else in the log, up to the daemon's exit: no sanitizer report,
# no error about other files.
unexpected=$(grep -v -e "^ckfs: serving '" -e "^ckfs: cannot notify '" -e "^ckfs: '$MNT': unmounting$" \
	-e "^ckfs: 'model.safetensors': read of [0-9]* bytes at [0-9]* failed (Input/output error): '$CK/model_world_size_8_rank_[0-7].pt': " \
	"$WORK/log")
[ -z "$unexpected" ] || fail "unexpected daemon log lines: $(printf '%s\n' "$unexpected" | head -5)"
finish
