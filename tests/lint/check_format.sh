#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The C style of .clang-format, checked on the lines a change touches: the
# tree as a whole is hand-wrapped and clang-format would re-wrap about one
# line in eleven, so only what differs from BASE (committed since it, and
# not yet committed) must be as clang-format writes it. Prints the fix as a
# diff (apply it with `git clang-format BASE`) and fails on any.
#
# Usage: check_format.sh [REPO_ROOT [BASE]]
# BASE: $CKFS_FORMAT_BASE, else where HEAD left main (origin/main or main);
# on main itself, or with no main, HEAD~1 (the newest commit is checked).
# Exits 77 (skipped) without clang-format and git-clang-format (Debian 12:
# apt-get install clang-format) or outside a git checkout.
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$ROOT" || exit 1

for tool in clang-format git-clang-format; do
	if ! command -v "$tool" >/dev/null; then
		echo "check_format: SKIP: no $tool (Debian 12: apt-get install clang-format)"
		exit 77
	fi
done
if ! git rev-parse --verify -q HEAD >/dev/null 2>&1; then
	echo "check_format: SKIP: $ROOT is not a git checkout"
	exit 77
fi

base=${2:-${CKFS_FORMAT_BASE:-}}
if [ -z "$base" ]; then
	for ref in origin/main main; do
		git rev-parse --verify -q "$ref" >/dev/null || continue
		base=$(git merge-base HEAD "$ref") && break
	done
	if [ -z "$base" ] || [ "$base" = "$(git rev-parse HEAD)" ]; then
		base=$(git rev-parse -q --verify HEAD~1) || base=HEAD
	fi
fi

# git-clang-format 14 exits 0 whether or not it would change anything:
# the diff it prints is the verdict.
out=$(git clang-format --diff --extensions c,h "$base" -- src include tests 2>&1)
rc=$?
case $out in
"" | "no modified files to format" | "clang-format did not modify any files")
	[ $rc = 0 ] || { echo "check_format: git clang-format failed ($rc)"; exit 1; }
	echo "check_format: the C lines changed since $(git rev-parse --short "$base") are formatted"
	exit 0 ;;
esac
printf '%s\n' "$out"
echo "check_format: the lines above, changed since $(git rev-parse --short "$base"), are not" \
	"as .clang-format writes them: git clang-format $(git rev-parse --short "$base")" >&2
exit 1
