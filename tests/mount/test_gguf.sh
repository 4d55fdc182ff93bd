#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# --format gguf through FUSE: for every fixture of tests/fixtures/gguf, the
# mounted model.gguf is export --format gguf's file, byte for byte, however
# it is read (cat, dd at odd block sizes and O_DIRECT, preads at the
# header end, tensor starts and EOF, 8 threads of random preads, mmap):
# q8_0 with the defaults, q4_0 with 4 KiB slices, a 32 KiB cache and a
# 4-slice read-ahead (reads straddle rows, blocks and padding; the cache
# evicts all the time). The folder holds model.gguf alone, mode 0444 or
# 0400 as the sources allow. A model the view refuses refuses to mount with
# export's one line.
source "$(dirname "$0")/lib.sh"
require_fuse
# the MoE fixtures' tokenizer by the SentencePiece path (tests only,
# docs/gguf.md "MoE"); no other architecture reads it
export CKFS_GGUF_TEST_MOE_SPM=1

GGUF=$CKFS_ROOT/tests/fixtures/gguf
MNT=$WORK/mnt
mkdir -p "$MNT"
SMALL=slice_size=4KiB,cache_size=32KiB,readahead=4

n=0
for src in "$GGUF"/*/; do
	src=${src%/}
	name=$(basename "$src")
	for t in q8_0 q4_0; do
		exp=$WORK/$name-$t
		"$CKFS" export -q --format gguf --dtype $t --model-name tiny "$src" "$exp" ||
			{ fail "$name $t: export"; continue; }
		opts=()
		[ $t = q4_0 ] && opts=(-o "$SMALL")
		do_mount "${opts[@]}" --format gguf --dtype $t --model-name tiny "$src" "$MNT" ||
			{ fail "$name $t: mount"; continue; }
		m=$MNT/model.gguf e=$exp/model.gguf
		[ "$(ls "$MNT")" = model.gguf ] || fail "$name $t: names: $(ls "$MNT")"
		cmp -s "$m" "$e" || fail "$name $t: cat differs from export"
		for bs in 4k 4093 1000003; do
			dd if="$m" bs=$bs status=none | cmp -s - "$e" || fail "$name $t: dd bs=$bs differs"
		done
		dd if="$m" bs=4093 iflag=direct status=none | cmp -s - "$e" ||
			fail "$name $t: dd iflag=direct differs"
		"$PY" "$HELPER" check "$m" "$e" || fail "$name $t: pread checks"
		"$PY" "$HELPER" random "$m" "$e" --threads 8 --count 200 || fail "$name $t: random preads"
		"$PY" "$HELPER" mmap "$m" "$e" || fail "$name $t: mmap"
		case $(stat -c %a "$m") in 444 | 400) ;; *) fail "$name $t: mode $(stat -c %a "$m")" ;; esac
		"$CKFS" umount "$MNT" || fail "$name $t: umount"
		n=$((n + 1))
	done
done
[ $n = 14 ] || fail "$n fixture mounts checked, not 14"

# a refusal: export's line, no mount left
cp -r "$GGUF/llama_fsdp2_w2" "$WORK/bad"
printf '\x0a\x05\x0a\x01a\x18\x09' >"$WORK/bad/huggingface/tokenizer.model"
"$CKFS" export --format gguf "$WORK/bad" "$WORK/never" 2>"$WORK/export.err" && fail "broken tokenizer exported"
if "$CKFS" mount --format gguf "$WORK/bad" "$MNT" 2>"$WORK/mount.err"; then
	fail "broken tokenizer mounted"
	"$CKFS" umount "$MNT"
fi
is_mounted "$MNT" && fail "a failed mount left a mount"
cmp -s "$WORK/export.err" "$WORK/mount.err" ||
	fail "mount's error '$(cat "$WORK/mount.err")' is not export's '$(cat "$WORK/export.err")'"
finish
