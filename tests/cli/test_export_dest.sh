#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Guards that compare folders compare identities (st_dev, st_ino), not
# names (issue #22): a bind mount shows one folder under two paths, and
# `mount --bind d b; ckfs export --force b/ckpt d` used to delete d/ckpt.
# With bind mounts (root only: exits 77, skipped, otherwise), a symlinked
# DIR and ".." in paths:
#  - export --force: DIR may not be SRC or above it, nor hold (as the
#    removal would reach it) a file the export reads, nor a mount point;
#    each refusal names the paths and leaves every file where it was;
#  - the symlink policy: a link inside the checkpoint that reaches it
#    through another name is inside; one leading out is still refused;
#  - a run's role linked to the run through another name is inside;
#  - mount: a mount point that is the checkpoint through a bind mount.
# Usage: test_export_dest.sh CKFS_BINARY FIXTURES_DIR
set -uo pipefail
CKFS=$1
FIX=$2
if [ "$(id -u)" != 0 ]; then
	echo "skipped: bind mounts need root"
	exit 77
fi
WORK=$(mktemp -d /tmp/ckfs-dest.XXXXXX)
W=$(cd "$WORK" && pwd -P)
# Every mount under WORK, deepest first, wherever it ended up (an export
# that renames a folder moves the mounts inside it along).
cleanup() {
	local m
	for m in $(awk -v w="$W/" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m"
	done
	rm -rf "$WORK"
}
trap cleanup EXIT
bind() { # FROM TO
	mkdir -p "$2" && mount --bind "$1" "$2"
}
mkdir "$WORK/probe" "$WORK/probe-b"
if ! bind "$WORK/probe" "$WORK/probe-b"; then
	echo "skipped: mount --bind does not work here"
	exit 77
fi
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
# expect NAME PATTERN -- command...: exit status 1 and one stderr line
expect() {
	local name=$1 pattern=$2 err rc
	shift 3
	err=$("$@" 2>&1 >/dev/null)
	rc=$?
	if [ "$rc" != 1 ]; then
		bad "$name: exit $rc, expected 1 ($err)"
	elif ! printf '%s' "$err" | grep -qE -- "$pattern"; then
		bad "$name: stderr '$err' does not match '$pattern'"
	elif [ "$(printf '%s\n' "$err" | wc -l)" != 1 ]; then
		bad "$name: expected one line, got: $err"
	else
		ok "$name"
	fi
}
SAMPLE=$FIX/fsdp/qwen2_fsdp2_w3
EXPECTED=$FIX/expected/qwen2_fsdp2_w3
snapshot() { (cd "$WORK" && find d p c x -printf '%p %s %T@\n' 2>/dev/null | sort); }

# d/ckpt, seen as b/ckpt through a bind mount of d on b
mkdir -p "$WORK/d" && cp -r "$SAMPLE" "$WORK/d/ckpt"
bind "$WORK/d" "$WORK/b"
# p/d2/ckpt, seen as b2/ckpt (b2 outside p): DIR p holds it under another name
mkdir -p "$WORK/p/d2" && cp -r "$SAMPLE" "$WORK/p/d2/ckpt"
bind "$WORK/p/d2" "$WORK/b2"
# a --config folder c, seen as bc
mkdir "$WORK/c" && cp "$SAMPLE/huggingface/config.json" "$WORK/c/"
bind "$WORK/c" "$WORK/bc"
# an old output o holding a bind mount of x, whose file is not ckfs's
mkdir -p "$WORK/x" "$WORK/o/m" && echo keep >"$WORK/x/data"
bind "$WORK/x" "$WORK/o/m"
ln -s d "$WORK/d-link"
before=$(snapshot)

expect "DIR d, SRC b/ckpt (d bound on b): the reproduction" \
	"^ckfs: '$W/d': is the checkpoint '$W/b/ckpt' or a folder above it" -- \
	"$CKFS" export -q --force "$W/b/ckpt" "$W/d"
expect "DIR b (the mount point), SRC d/ckpt" "^ckfs: '$W/b': is the checkpoint '$W/d/ckpt'" -- \
	"$CKFS" export -q --force "$W/d/ckpt" "$W/b"
expect "DIR a symlink to d, SRC b/ckpt" "^ckfs: '$W/d-link': is the checkpoint '$W/b/ckpt'" -- \
	"$CKFS" export -q --force "$W/b/ckpt" "$W/d-link"
expect "DIR b/../d, SRC b/ckpt" "^ckfs: '$W/b/../d': is the checkpoint '$W/b/ckpt'" -- \
	"$CKFS" export -q --force "$W/b/ckpt" "$W/b/../d"
expect "DIR d/ckpt/huggingface/.., SRC b/ckpt" "^ckfs: '$W/d/ckpt/huggingface/..': name the folder" -- \
	"$CKFS" export -q --force "$W/b/ckpt" "$W/d/ckpt/huggingface/.."
expect "DIR b/ckpt/huggingface/../.., SRC d/ckpt" "name the folder to write" -- \
	"$CKFS" export -q --force "$W/d/ckpt" "$W/b/ckpt/huggingface/../.."
expect "DIR d/./ckpt/huggingface (SRC b/ckpt): its Hugging Face folder" \
	"^ckfs: '$W/d/./ckpt/huggingface': is the checkpoint's Hugging Face folder" -- \
	"$CKFS" export -q --force "$W/b/ckpt" "$W/d/./ckpt/huggingface"
expect "DIR p, above d2 bound on b2, SRC b2/ckpt" \
	"^ckfs: '$W/p': holds the checkpoint '$W/b2/ckpt' \(as '$W/p/d2/ckpt'\); replacing the folder would delete it" -- \
	"$CKFS" export -q --force "$W/b2/ckpt" "$W/p"
expect "DIR c, --config bc/config.json (c bound on bc)" \
	"^ckfs: '$W/c': holds '$W/bc/config.json', which this export reads" -- \
	"$CKFS" export -q --force --config "$W/bc/config.json" "$SAMPLE" "$W/c"
expect "DIR holding a bind mount" \
	"^ckfs: '$W/o': holds a mount point, '$W/o/m'; replacing the folder would delete files through it" -- \
	"$CKFS" export -q --force "$SAMPLE" "$W/o"
[ "$(snapshot)" = "$before" ] && [ "$(cat "$WORK/x/data")" = keep ] && ok "refused exports touch nothing" ||
	bad "refused exports touch nothing"

# what is not the checkpoint is replaced as before, through any name
mkdir "$WORK/out" && touch "$WORK/out/stale"
"$CKFS" export -q --force "$W/b/ckpt" "$W/out" && [ ! -e "$WORK/out/stale" ] &&
	cmp -s "$WORK/out/model.safetensors" "$EXPECTED/model.safetensors" &&
	ok "--force replaces an unrelated folder" || bad "--force replaces an unrelated folder"
"$CKFS" export -q "$W/b/ckpt" "$W/d/ckpt/merged" && [ -f "$WORK/b/ckpt/merged/model.safetensors" ] &&
	ok "a new DIR inside SRC, through the other name" || bad "a new DIR inside SRC, through the other name"
rm -rf "$WORK/d/ckpt/merged"

# the symlink policy: inside by identity, outside still refused
mv "$WORK/d/ckpt/huggingface/tokenizer_config.json" "$WORK/d/ckpt/tok.json"
ln -s "$W/b/ckpt/tok.json" "$WORK/d/ckpt/huggingface/tokenizer_config.json"
"$CKFS" export -q "$W/d/ckpt" "$W/viaalias" && [ -f "$WORK/viaalias/tokenizer_config.json" ] &&
	ok "a side file linked to the checkpoint through a bind mount is inside" ||
	bad "a side file linked to the checkpoint through a bind mount is inside"
mkdir "$WORK/elsewhere" && echo '{}' >"$WORK/elsewhere/tok.json"
ln -sfn "$W/elsewhere/tok.json" "$WORK/d/ckpt/huggingface/tokenizer_config.json"
expect "a side file linked outside is still refused" \
	"tokenizer_config.json': symlink leads outside the checkpoint; use --follow-symlinks" -- \
	"$CKFS" export -q "$W/d/ckpt" "$W/none"

# a run: a role linked into the run through the bind mount is inside
RUNFIX=$FIX/run/fsdp_ppo
if [ -d "$RUNFIX" ]; then
	cp -a "$RUNFIX" "$WORK/run" && bind "$WORK/run" "$WORK/brun"
	step=global_step_4
	mv "$WORK/run/$step/critic" "$WORK/run/$step/critic.real"
	ln -s "$W/brun/$step/critic.real" "$WORK/run/$step/critic"
	out=$("$CKFS" inspect "$W/run" 2>&1)
	grep -q "symlink leads outside" <<<"$out" &&
		bad "a role linked into the run through a bind mount: $out" ||
		ok "a role linked into the run through a bind mount is inside"
else
	bad "run fixture $RUNFIX missing"
fi

# mount: a mount point that is the checkpoint through a bind mount
expect "mount over the checkpoint through a bind mount" \
	"^ckfs: '$W/b/ckpt': is the checkpoint '$W/d/ckpt' or a folder above it: mount elsewhere" -- \
	"$CKFS" mount "$W/d/ckpt" "$W/b/ckpt"
expect "mount above the checkpoint through a bind mount" \
	"^ckfs: '$W/d': is the checkpoint '$W/b/ckpt' or a folder above it: mount elsewhere" -- \
	"$CKFS" mount "$W/b/ckpt" "$W/d"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
