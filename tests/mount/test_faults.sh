#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Source safety: a shard truncated, deleted, replaced or rewritten while
# mounted makes reads of the weights fail with EIO (never stale or mixed
# bytes), logs one line naming the file and the cause, and leaves the
# daemon alive: config.json and the side files keep working, the stats
# xattr answers, and the mount unmounts cleanly.
#
# Every case works on a private copy of a fixture, mounted in the
# foreground (stderr captured, readiness through NOTIFY_SOCKET) with
# nothing of model.safetensors read before the fault, so that no byte of
# it is in the slice cache or the page cache yet. (Bytes assembled before
# a change stay valid and may still be served: docs/mount.md.)
source "$(dirname "$0")/lib.sh"
require_fuse

FIX=$FIXTURES/qwen2_fsdp2_w2
EXP=$WORK/exp
"$CKFS" export --quiet "$FIX" "$EXP" || die "export of $FIX failed"

run_case() { # NAME COMMAND-ON-$CK
	local name=$1 action=$2
	CK=$WORK/ck-$name
	local mnt=$WORK/mnt-$name logf=$WORK/log-$name
	cp -a "$FIX" "$CK"
	mkdir -p "$mnt"
	start_foreground "$logf" "$WORK/notify-$name.sock" "$CK" "$mnt"
	local pid=$FG_PID
	cmp -s "$mnt/config.json" "$EXP/config.json" || fail "$name: config.json before the fault"
	eval "$action"
	# dd: exit status and message
	if out=$(dd if="$mnt/model.safetensors" of=/dev/null bs=1M 2>&1); then
		fail "$name: dd of model.safetensors succeeded after the fault"
	else
		case $out in *"Input/output error"*) ;; *) fail "$name: dd said '$out'" ;; esac
	fi
	# errno through a plain read, and through O_DIRECT preads
	"$PY" "$HELPER" errno "$mnt/model.safetensors" EIO || fail "$name: read errno"
	kill -0 "$pid" 2>/dev/null || die "$name: the daemon died"
	# everything else still works
	cmp -s "$mnt/config.json" "$EXP/config.json" || fail "$name: config.json after the fault"
	cmp -s "$mnt/tokenizer.json" "$EXP/tokenizer.json" || fail "$name: tokenizer.json after the fault"
	ls -l "$mnt" >/dev/null || fail "$name: ls after the fault"
	"$PY" "$HELPER" stats "$mnt" >/dev/null || fail "$name: stats after the fault"
	local errs
	errs=$("$CKFS" stats --json "$mnt" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["errors"])')
	[ "$errs" -gt 0 ] || fail "$name: stats count no errors"
	# one log line names the mount file, EIO and the source file
	grep -q "'model.safetensors': read of .* failed (Input/output error): .*$CK/model_world_size_2_rank_" "$logf" ||
		fail "$name: no log line naming the file and cause: $(cat "$logf")"
	[ "$(grep -c "'model.safetensors'" "$logf")" = 1 ] ||
		fail "$name: expected one error line (rate limit), got: $(cat "$logf")"
	kill -TERM "$pid"
	wait "$pid" || fail "$name: daemon exit status $? after SIGTERM"
	is_mounted "$mnt" && fail "$name: still mounted"
	log "$name: $(grep -o "failed (Input/output error): .*" "$logf" | head -1)"
}

run_case truncated 'truncate -s 100000 "$CK/model_world_size_2_rank_1.pt"'
run_case deleted 'rm "$CK/model_world_size_2_rank_0.pt"'
run_case replaced 'cp "$CK/model_world_size_2_rank_0.pt" "$WORK/r0" && mv "$WORK/r0" "$CK/model_world_size_2_rank_0.pt"'
run_case rewritten 'dd if=/dev/zero of="$CK/model_world_size_2_rank_1.pt" bs=1 count=1 seek=5000 conv=notrunc status=none'
run_case touched 'touch -d "2001-01-01" "$CK/model_world_size_2_rank_0.pt"'

# A side file changed: only that file fails.
CK=$WORK/ck-side
cp -a "$FIX" "$CK"
mkdir -p "$WORK/mnt-side"
do_mount "$CK" "$WORK/mnt-side" || die "mount of $CK failed"
echo '{}' >"$CK/huggingface/tokenizer.json"
"$PY" "$HELPER" errno "$WORK/mnt-side/tokenizer.json" EIO || fail "side file: changed tokenizer.json still reads"
cmp -s "$WORK/mnt-side/model.safetensors" "$EXP/model.safetensors" || fail "side file: weights broken by a side file"
"$CKFS" umount "$WORK/mnt-side" || fail "side file: umount"
finish
