#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Equal slices held once in a run mount (issue #26 item 3). The steps of the
# verl LoRA run (tests/fixtures/history/lora_run: the base frozen) and of
# the run with frozen layers, mounted with 4 KiB slices, every step's
# weights read whole (cat and O_DIRECT, so every slice reaches the daemon):
# every file equals `ckfs export` of its step; and the stats equal what an
# oracle that knows nothing of ckfs counts from those exports (python's
# hashlib over their 4 KiB slices): one fill per slice read, every fill
# hashed, a fill shared for each slice whose bytes an earlier step's slice
# held, bytes_cached the distinct slices' bytes, bytes_saved the rest. Off
# (share_slices=off), nothing is hashed; a single checkpoint does not share
# unless asked (share_slices=on); a budget smaller than one step still
# serves the right bytes and ends within the budget.
source "$(dirname "$0")/lib.sh"
require_fuse

HIST=$CKFS_ROOT/tests/fixtures/history
EXP=$WORK/exp
MNT=$WORK/mnt
mkdir -p "$EXP" "$MNT"

stat_of() { # MNT KEY
	"$CKFS" stats --json "$1" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2"
}

# The oracle: over the steps' exported weight files, in the order read,
# fills (slices), shared (slices whose bytes an earlier slice had),
# distinct bytes and saved bytes. ORDERED FILES...
oracle() {
	"$PY" - "$@" <<'PY'
import hashlib, sys
seen, fills, shared, distinct, saved = set(), 0, 0, 0, 0
for path in sys.argv[1:]:
    data = open(path, "rb").read()
    for i in range(0, len(data), 4096):
        piece = data[i:i + 4096]
        key = (len(piece), hashlib.sha256(piece).digest())
        fills += 1
        if key in seen:
            shared += 1
            saved += len(piece)
        else:
            seen.add(key)
            distinct += len(piece)
print(fills, shared, distinct, saved)
PY
}

# read_run RUN MNT FILE STEPS: every step's FILE, checked against an export.
read_run() {
	local run=$1 mnt=$2 file=$3 s
	shift 3
	for s in "$@"; do
		[ -d "$EXP/$(basename "$run")-$s" ] ||
			"$CKFS" export -q "$run/global_step_$s/actor" "$EXP/$(basename "$run")-$s" ||
			fail "export of step $s"
		dd if="$mnt/global_step_$s/actor/$file" iflag=direct bs=1M status=none |
			cmp -s - "$EXP/$(basename "$run")-$s/$file" || fail "$run step $s: $file (O_DIRECT) differs"
		cmp -s "$mnt/global_step_$s/actor/$file" "$EXP/$(basename "$run")-$s/$file" ||
			fail "$run step $s: $file (cat) differs"
	done
}

check_shared() { # NAME MNT RUN-NAME FILE STEPS...
	local name=$1 mnt=$2 rn=$3 file=$4 s files=()
	shift 4
	for s in "$@"; do files+=("$EXP/$rn-$s/$file"); done
	read -r fills shared distinct saved <<<"$(oracle "${files[@]}")"
	local got="$(stat_of "$mnt" fills) $(stat_of "$mnt" shared_slices) $(stat_of "$mnt" bytes_cached) $(stat_of "$mnt" bytes_saved)"
	[ "$got" = "$fills $shared $distinct $saved" ] &&
		log "ok: $name: $fills fills, $shared shared, $distinct bytes held, $saved saved" ||
		fail "$name: fills shared cached saved: ckfs $got, oracle $fills $shared $distinct $saved"
	local size=0
	for f in "${files[@]}"; do size=$((size + $(stat -c %s "$f"))); done
	[ "$(stat_of "$mnt" bytes_hashed)" = "$size" ] || fail "$name: bytes_hashed is not every byte filled"
}

# The LoRA run: the base's model.safetensors is one file four times.
do_mount "$HIST/lora_run" "$MNT" -o slice_size=4KiB,cache_size=16MiB,readahead=0 || die "mount lora_run"
read_run "$HIST/lora_run" "$MNT" model.safetensors 1 2 3 4
check_shared "lora base" "$MNT" lora_run model.safetensors 1 2 3 4
[ "$(stat_of "$MNT" shared_slices)" -gt 0 ] || fail "lora: nothing shared"
"$CKFS" stats "$MNT" | grep -qE '^shared +[0-9]+ slices held once' || fail "ckfs stats: no 'shared' line"
"$CKFS" umount "$MNT" || fail "umount"

# The frozen run: the shards' slices of the frozen layers are shared.
do_mount "$HIST/frozen_run" "$MNT" -o slice_size=4KiB,cache_size=16MiB,readahead=0 || die "mount frozen_run"
read_run "$HIST/frozen_run" "$MNT" model.safetensors 1 2 3
check_shared "frozen layers" "$MNT" frozen_run model.safetensors 1 2 3
"$CKFS" umount "$MNT" || fail "umount"

# Off: nothing hashed, every slice its own (done ones recycled as before).
do_mount "$HIST/lora_run" "$MNT" -o slice_size=4KiB,cache_size=16MiB,readahead=0,share_slices=off ||
	die "mount share_slices=off"
read_run "$HIST/lora_run" "$MNT" model.safetensors 1 2
[ "$(stat_of "$MNT" bytes_hashed) $(stat_of "$MNT" shared_slices) $(stat_of "$MNT" bytes_saved)" = "0 0 0" ] ||
	fail "share_slices=off: hashed or shared"
"$CKFS" umount "$MNT" || fail "umount"

# One checkpoint: auto is off, on shares (nothing here is equal twice).
one=$HIST/lora_run/global_step_1/actor
do_mount "$one" "$MNT" -o slice_size=4KiB,readahead=0 || die "mount one checkpoint"
cat "$MNT/model.safetensors" >/dev/null
[ "$(stat_of "$MNT" bytes_hashed)" = 0 ] || fail "one checkpoint: hashed with share_slices=auto"
"$CKFS" umount "$MNT" || fail "umount"
do_mount "$one" "$MNT" -o slice_size=4KiB,readahead=0,share_slices=on || die "mount share_slices=on"
cmp -s "$MNT/model.safetensors" "$EXP/lora_run-1/model.safetensors" || fail "share_slices=on: bytes differ"
[ "$(stat_of "$MNT" bytes_hashed)" = "$(stat -c %s "$EXP/lora_run-1/model.safetensors")" ] ||
	fail "one checkpoint, share_slices=on: not hashed"
"$CKFS" umount "$MNT" || fail "umount"

# A budget of four slices: evictions of shared and unshared slices alike,
# the right bytes, and within the budget once nothing is read.
do_mount "$HIST/lora_run" "$MNT" -o slice_size=4KiB,cache_size=16KiB,readahead=0 || die "mount small"
for pass in 1 2; do
	read_run "$HIST/lora_run" "$MNT" model.safetensors 1 2 3 4
	read_run "$HIST/lora_run" "$MNT" lora_adapter/adapter_model.safetensors 1 2 3 4
done
[ "$(stat_of "$MNT" bytes_cached)" -le 16384 ] || fail "small budget: $(stat_of "$MNT" bytes_cached) bytes held"
[ "$(stat_of "$MNT" evictions)" -gt 0 ] || fail "small budget: no eviction"
[ "$(stat_of "$MNT" errors)" = 0 ] || fail "small budget: read errors"
"$CKFS" umount "$MNT" || fail "umount"

finish
