#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ckfs export --since PREV (issue #26 item 2): every export since an
# earlier one is byte for byte the full export of the same step (cmp of
# every file, and the same modes); unchanged files are hard links to
# PREV's (the same inode) where the modes allow, and reflinks where the
# file system shares blocks (an XFS image with reflink=1, when root can
# make one; said so when not); what changed is written; the refusals
# (no PREV, another model or other options, not a folder, the checkpoint
# itself) are one line, exit 1 and leave nothing; --force DIR --since DIR
# updates an export in place.
# Usage: test_since.sh CKFS_BINARY FIXTURES_DIR
set -uo pipefail
CKFS=$1
FIX=$2
WORK=$(mktemp -d /tmp/ckfs-since.XXXXXX)
trap 'umount "$WORK/xfs" 2>/dev/null; rm -rf "$WORK"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
LORA=$FIX/history/lora_run
FROZEN=$FIX/history/frozen_run

# same DIR A B: the same files, bytes and modes
same_folder() {
	(cd "$1" && find . -type f | sort) >"$WORK/fa" && (cd "$2" && find . -type f | sort) >"$WORK/fb" &&
		cmp -s "$WORK/fa" "$WORK/fb" || return 1
	while read -r f; do
		cmp -s "$1/$f" "$2/$f" || { echo "  $f differs"; return 1; }
		[ "$(stat -c %a "$1/$f")" = "$(stat -c %a "$2/$f")" ] || { echo "  $f: mode"; return 1; }
	done <"$WORK/fa"
}
inode() { stat -c %i "$1"; }

# a run exported step by step, each --since the previous: ROOT NAME RUN STEPS OPTS...
chain() {
	local root=$1 name=$2 run=$3 steps=$4 prev=""
	shift 4
	for s in $steps; do
		local out=$root/$name-$s full=$root/$name-$s-full
		"$CKFS" export -q "$@" "$run/global_step_$s/actor" "$full" || { bad "$name $s: full export"; return; }
		if [ -z "$prev" ]; then
			"$CKFS" export -q "$@" "$run/global_step_$s/actor" "$out"
		else
			"$CKFS" export "$@" "$run/global_step_$s/actor" "$out" --since "$prev" 2>"$WORK/say" ||
				{ bad "$name $s: export --since failed: $(cat "$WORK/say")"; return; }
			grep -q "since PREV: wrote " "$WORK/say" || bad "$name $s: no summary: $(cat "$WORK/say")"
		fi
		same_folder "$out" "$full" && ok "$name step $s: --since equals the full export" ||
			bad "$name step $s: --since equals the full export"
		prev=$out
	done
}

# ---- byte identity, on this file system (ext4 here: links and copies) ----
chain "$WORK" lora "$LORA" "1 2 3 4"
[ "$(inode "$WORK/lora-1/model.safetensors")" = "$(inode "$WORK/lora-4/model.safetensors")" ] &&
	ok "lora: the frozen base is one file (hard links) across the steps" ||
	bad "lora: the frozen base is one file (hard links) across the steps"
[ "$(inode "$WORK/lora-3/lora_adapter/adapter_model.safetensors")" != \
	"$(inode "$WORK/lora-4/lora_adapter/adapter_model.safetensors")" ] &&
	ok "lora: the trained adapter is written" || bad "lora: the trained adapter is written"
grep -qE "wrote [0-9.]+ KiB of a full export's 80.6 KiB \([0-9.]+%\), 27 of 55 tensors unchanged; from PREV: 1 files hard-linked" \
	"$WORK/say" && ok "lora: the summary" || bad "lora: the summary: $(cat "$WORK/say")"
chain "$WORK" frozen "$FROZEN" "1 2 3" --max-shard-size 20KB
n=0
for f in "$WORK"/frozen-3/model-*.safetensors; do
	[ "$(inode "$f")" = "$(inode "$WORK/frozen-2/$(basename "$f")")" ] && n=$((n + 1))
done
[ "$n" = 1 ] && ok "frozen: the one shard holding only frozen tensors is linked" ||
	bad "frozen: the one shard holding only frozen tensors is linked ($n)"
chain "$WORK" fused "$LORA" "1 3" --lora fuse --dtype fp32
chain "$WORK" plain "$FIX/run/fsdp_ppo" "3 4"

# a PREV file whose mode the export would not give is copied, not linked
"$CKFS" export -q "$LORA/global_step_1/actor" "$WORK/m1"
chmod 600 "$WORK/m1/model.safetensors"
"$CKFS" export -q "$LORA/global_step_2/actor" "$WORK/m2" --since "$WORK/m1" &&
	same_folder "$WORK/m2" "$WORK/lora-2-full" &&
	[ "$(inode "$WORK/m2/model.safetensors")" != "$(inode "$WORK/m1/model.safetensors")" ] &&
	ok "another mode in PREV: copied, the full export's mode kept" ||
	bad "another mode in PREV: copied, the full export's mode kept"

# --force DIR --since DIR: an export updated in place
cp -a "$WORK/lora-1" "$WORK/inplace"
"$CKFS" export -q --force "$LORA/global_step_4/actor" "$WORK/inplace" --since "$WORK/inplace" &&
	same_folder "$WORK/inplace" "$WORK/lora-4-full" && ! ls "$WORK" | grep -q 'ckfs-' &&
	ok "--force DIR --since DIR updates in place" || bad "--force DIR --since DIR updates in place"

# ---- refusals: one line, exit 1, nothing left ----
expect() { # NAME PATTERN -- command...
	local name=$1 pattern=$2 err rc
	shift 3
	err=$("$@" 2>&1 >/dev/null)
	rc=$?
	if [ "$rc" = 1 ] && [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] && grep -qE -- "$pattern" <<<"$err" &&
		[ ! -e "$WORK/none" ] && ! ls "$WORK" | grep -q 'ckfs-tmp'; then
		ok "$name"
	else
		bad "$name: exit $rc: $err"
	fi
}
expect "no PREV" "^ckfs: '$WORK/nothere': not found$" -- \
	"$CKFS" export "$LORA/global_step_2/actor" "$WORK/none" --since "$WORK/nothere"
expect "PREV a file" "^ckfs: '.*/config.json': not a folder; --since needs an earlier export" -- \
	"$CKFS" export "$LORA/global_step_2/actor" "$WORK/none" --since "$WORK/lora-1/config.json"
expect "PREV of other options (dtype)" \
	"^ckfs: '$WORK/lora-1/(lora_adapter/adapter_model|model).safetensors': its header differs from this export's \(other tensors, dtypes or shapes\); --since needs an earlier export of this model with the same options$" -- \
	"$CKFS" export --dtype fp32 "$LORA/global_step_2/actor" "$WORK/none" --since "$WORK/lora-1"
expect "PREV of another model" "plain-3/model.safetensors': its header differs" -- \
	"$CKFS" export "$FROZEN/global_step_2/actor" "$WORK/none" --since "$WORK/plain-3"
expect "PREV without a weight file" "'$WORK/frozen-1/model.safetensors': not found; --since needs" -- \
	"$CKFS" export "$FROZEN/global_step_2/actor" "$WORK/none" --since "$WORK/frozen-1"
expect "PREV the checkpoint itself" "the checkpoint itself; --since needs" -- \
	"$CKFS" export --dtype auto "$FIX/hf/qwen2_single" "$WORK/none" --since "$FIX/hf/qwen2_single"

# ---- reflinks: an XFS image (root only) ----
if [ "$(id -u)" = 0 ] && command -v mkfs.xfs >/dev/null && truncate -s 300M "$WORK/xfs.img" &&
	mkfs.xfs -q -f -m reflink=1 "$WORK/xfs.img" 2>/dev/null && mkdir -p "$WORK/xfs" &&
	mount -o loop "$WORK/xfs.img" "$WORK/xfs" 2>/dev/null; then
	chain "$WORK/xfs" frozen "$FROZEN" "1 2" --max-shard-size 20KB
	grep -qE "from PREV: 0 files hard-linked \(0 B\), [0-9.]+ KiB reflinked \(1 whole files\)" "$WORK/say" &&
		ok "xfs: the unchanged shard and unchanged blocks reflinked, not linked" ||
		bad "xfs: the unchanged shard and unchanged blocks reflinked: $(cat "$WORK/say")"
	chain "$WORK/xfs" lora "$LORA" "1 2"
	umount "$WORK/xfs"
else
	echo "note: reflinks not checked (needs root, mkfs.xfs and a loop device)"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
