#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Disk errors. Read errors are injected by tests/faults/failalloc.c
# (LD_PRELOAD): reads of one source file fail with EIO after its first K
# reads succeeded.
#
# 1. `ckfs export` of four layouts (FSDP2, DCP, Megatron, sharded HF), one
#    source file failing, for K = 0, 1, 2, ... until the export no longer
#    reaches the fault (metadata reads at open, then tensor reads): each
#    run exits 1 with one line naming that file and "Input/output error",
#    and leaves no output folder and no temporary folder; the run past the
#    last read succeeds with the files of a fault-free export.
# 2. A mount whose rank file fails while armed (CKFS_FAIL_IO_ARM): reads
#    of model.safetensors fail with EIO, the daemon stays up, config.json
#    still reads; disarmed, the whole file reads back equal to the export;
#    SIGTERM ends the daemon with status 0.
# 3. A full disk: export into a tmpfs a little smaller than the export
#    fails with "No space left on device" naming the file, leaving the
#    tmpfs empty.
# Usage: test_eio.sh CKFS_BINARY FAILALLOC_SO   (exit 77: no /dev/fuse)
SHIM=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
source "$(dirname "$0")/../mount/lib.sh"
ALL=$CKFS_ROOT/tests/fixtures
runs=0

# export_sweep NAME SRC PATTERN
export_sweep() {
	local name=$1 src=$2 pat=$3 k rc err dest=$WORK/x/out
	mkdir -p "$WORK/x"
	"$CKFS" export -q "$src" "$WORK/ref-$name" || die "$name: export without faults failed"
	for ((k = 0; k < 10000; k = k < 8 ? k + 1 : k * 2)); do
		rm -f "$WORK/rep"
		CKFS_FAIL_IO=$pat CKFS_FAIL_IO_AFTER=$k CKFS_FAIL_REPORT=$WORK/rep LD_PRELOAD=$SHIM \
			"$CKFS" export -q "$src" "$dest" >"$WORK/out.txt" 2>"$WORK/err.txt"
		rc=$?
		runs=$((runs + 1))
		err=$(cat "$WORK/err.txt")
		if [ ! -s "$WORK/rep" ]; then # the fault was not reached
			[ "$rc" = 0 ] || fail "$name K=$k: no fault injected, yet exit $rc: $err"
			diff -r "$WORK/ref-$name" "$dest" >/dev/null ||
				fail "$name K=$k: export differs from the fault-free one"
			log "$name: $pat failing after K reads, K = 0..$k: each export failed cleanly until K=$k passed"
			rm -rf "$dest" "$WORK/ref-$name"
			return
		fi
		if [ "$rc" != 1 ]; then
			fail "$name K=$k: exit $rc, expected 1: $err"
		elif [ "$(printf '%s\n' "$err" | wc -l)" != 1 ] ||
			[ "${err#*"$pat"*Input/output error}" = "$err" ]; then
			fail "$name K=$k: not one line naming $pat and EIO: $err"
		elif [ -s "$WORK/out.txt" ]; then
			fail "$name K=$k: printed on stdout"
		elif [ -n "$(find "$WORK/x" -mindepth 1 -print -quit)" ]; then
			fail "$name K=$k: left $(find "$WORK/x" -mindepth 1 | head -3)"
		fi
		rm -rf "$dest"
	done
	fail "$name: the fault was still reached after 10000 reads"
}

export_sweep fsdp "$ALL/fsdp/qwen2_fsdp2_w2" model_world_size_2_rank_1.pt
export_sweep dcp "$ALL/dcp/qwen2_tied_fsdp2_w3" __1_0.distcp
export_sweep megatron "$ALL/megatron/llama_tp2" mp_rank_01/model.pt
export_sweep hf "$ALL/hf/qwen2_sharded" model-00002-of-00004.safetensors
log "$runs export runs"

# ---- through the mount ----
if [ -e /dev/fuse ] && command -v fusermount3 >/dev/null; then
	FIX=$ALL/fsdp/qwen2_fsdp2_w2
	CK=$WORK/ck
	MNT=$WORK/mnt
	cp -a "$FIX" "$CK"
	mkdir "$MNT"
	"$CKFS" export -q "$CK" "$WORK/exp" || die "export of $CK failed"
	CKFS_FAIL_IO=model_world_size_2_rank_1.pt CKFS_FAIL_IO_ARM=$WORK/armed LD_PRELOAD=$SHIM \
		start_foreground "$WORK/log" "$WORK/notify.sock" "$CK" "$MNT"
	pid=$FG_PID
	# Armed once serving (the open reads the rank file's metadata), before
	# any byte of model.safetensors is cached.
	touch "$WORK/armed"
	if out=$(dd if="$MNT/model.safetensors" of=/dev/null bs=1M 2>&1); then
		fail "mount: model.safetensors read whole while its rank file fails"
	else
		case $out in *"Input/output error"*) ;; *) fail "mount: dd said '$out'" ;; esac
	fi
	"$PY" "$HELPER" errno "$MNT/model.safetensors" EIO || fail "mount: read errno is not EIO"
	kill -0 "$pid" 2>/dev/null || die "mount: the daemon died"
	cmp -s "$MNT/config.json" "$WORK/exp/config.json" || fail "mount: config.json while failing"
	grep -q "'model.safetensors': read of .* failed (Input/output error): .*model_world_size_2_rank_1.pt" "$WORK/log" ||
		fail "mount: no log line naming the rank file and EIO: $(cat "$WORK/log")"
	rm "$WORK/armed"
	cmp -s "$MNT/model.safetensors" "$WORK/exp/model.safetensors" ||
		fail "mount: model.safetensors differs once the disk recovered"
	kill -TERM "$pid"
	wait "$pid" || fail "mount: daemon exit status $? after SIGTERM"
	is_mounted "$MNT" && fail "mount: still mounted"
	log "mount: EIO while armed, daemon alive, whole file equal after disarming"
else
	log "SKIP: mount case (no /dev/fuse or fusermount3)"
	SKIPPED=1
fi

# ---- a full disk ----
SRC=$ALL/fsdp/qwen2_fsdp2_w2
"$CKFS" export -q "$SRC" "$WORK/full-ref" || die "export of $SRC failed"
need=$(du -sk "$WORK/full-ref" | cut -f1)
mkdir "$WORK/tiny"
mount -t tmpfs -o size=$((need - 16))k tmpfs "$WORK/tiny" || die "cannot mount a tmpfs (root needed)"
"$CKFS" export -q "$SRC" "$WORK/tiny/out" 2>"$WORK/err.txt"
rc=$?
err=$(cat "$WORK/err.txt")
[ "$rc" = 1 ] || fail "full disk: exit $rc: $err"
[ "$(printf '%s\n' "$err" | wc -l)" = 1 ] && [ "${err#*"$WORK/tiny/"*No space left on device}" != "$err" ] ||
	fail "full disk: not one line naming a file and ENOSPC: $err"
[ -z "$(ls -A "$WORK/tiny")" ] || fail "full disk: left $(ls -A "$WORK/tiny")"
umount "$WORK/tiny"
log "full disk (tmpfs of $((need - 16)) KiB for a $need KiB export): $err"
[ "${SKIPPED:-0}" = 1 ] && [ "$FAILS" = 0 ] && exit 77
finish
