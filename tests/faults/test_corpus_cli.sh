#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The broken-checkpoint corpus through the command line: for every case of
# tests/corpus/checkpoints/ (whose exact codes and messages
# tests/unit/test_corpus.c asserts), `ckfs export`, `ckfs inspect` and
# `ckfs mount` must exit 1 with exactly one stderr line "ckfs: '<path in
# the case>...", print nothing on stdout, leave no output folder or
# temporary folder behind and mount nothing. The ok_* controls export;
# the symlink cases export with --follow-symlinks.
# Usage: test_corpus_cli.sh CKFS_BINARY
set -uo pipefail
CKFS=$1
CORPUS=$(cd "$(dirname "$0")/../corpus/checkpoints" && pwd -P)
WORK=$(mktemp -d /tmp/ckfs-corpus-cli.XXXXXX)
trap 'umount -l "$WORK/mnt" 2>/dev/null; rm -rf "$WORK"' EXIT
mkdir "$WORK/mnt"
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

# refused CASE_DIR COMMAND...: exit 1, one "ckfs: '<CASE_DIR>..." line, no stdout
refused() {
	local dir=$1 out err rc
	shift
	out=$("$@" 2>"$WORK/err")
	rc=$?
	err=$(cat "$WORK/err")
	if [ "$rc" != 1 ]; then
		bad "$(basename "$dir"): $2 exit $rc, expected 1 ($err)"
	elif [ "$(printf '%s\n' "$err" | wc -l)" != 1 ] || [ "${err#ckfs: \'"$dir"}" = "$err" ]; then
		bad "$(basename "$dir"): $2 should say one line naming the case, said: $err"
	elif [ -n "$out" ]; then
		bad "$(basename "$dir"): $2 printed on stdout: $out"
	else
		ok
	fi
}

n=0
for dir in "$CORPUS"/*/; do
	dir=${dir%/}
	name=$(basename "$dir")
	case $name in _*) continue ;; esac
	n=$((n + 1))
	if [ "${name#ok_}" != "$name" ]; then
		"$CKFS" export -q "$dir" "$WORK/out" && [ -s "$WORK/out/model.safetensors" ] &&
			ok || bad "$name: export of a valid control failed"
		rm -rf "$WORK/out"
		continue
	fi
	refused "$dir" "$CKFS" export -q "$dir" "$WORK/out"
	[ -e "$WORK/out" ] && bad "$name: export left '$WORK/out'"
	left=$(find "$WORK" -mindepth 1 -maxdepth 1 ! -name mnt ! -name err)
	[ -z "$left" ] || bad "$name: export left $left"
	refused "$dir" "$CKFS" inspect "$dir"
	refused "$dir" "$CKFS" mount "$dir" "$WORK/mnt"
	awk -v m="$WORK/mnt" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo &&
		bad "$name: something is mounted at $WORK/mnt"
	case $name in
	fs_symlink_outside_*)
		"$CKFS" export -q --follow-symlinks "$dir" "$WORK/out" && [ -s "$WORK/out/model.safetensors" ] &&
			ok || bad "$name: export --follow-symlinks failed"
		rm -rf "$WORK/out"
		;;
	esac
done
# --follow-symlinks reaches the model options from every command.
side=$CORPUS/fs_symlink_outside_side_file
"$CKFS" inspect --follow-symlinks "$side" >/dev/null && ok || bad "inspect --follow-symlinks"
"$CKFS" export -q "$side" "$WORK/ref" 2>/dev/null && bad "export without --follow-symlinks succeeded"
"$CKFS" export -q --follow-symlinks --dtype fp32 "$side" "$WORK/ref" &&
	cmp -s "$WORK/ref/tokenizer.json" "$CORPUS/_outside/huggingface/tokenizer.json" &&
	ok || bad "export --follow-symlinks serves the linked side file"
"$CKFS" verify --follow-symlinks --dtype fp32 "$side" --against "$WORK/ref" >/dev/null &&
	ok || bad "verify --follow-symlinks"
if [ -c /dev/fuse ] && [ "$(id -u)" = 0 ]; then
	for opt in --follow-symlinks "-o follow_symlinks"; do
		# shellcheck disable=SC2086
		if "$CKFS" mount $opt "$side" "$WORK/mnt"; then
			cmp -s "$WORK/mnt/tokenizer.json" "$CORPUS/_outside/huggingface/tokenizer.json" &&
				ok || bad "mount $opt: tokenizer.json"
			"$CKFS" umount "$WORK/mnt" || bad "umount after mount $opt"
		else
			bad "mount $opt"
		fi
	done
fi
rm -rf "$WORK/ref"
echo "corpus through the CLI: $n cases, $pass checks passed, $fail failed"
[ "$n" -ge 40 ] && [ "$fail" = 0 ]
