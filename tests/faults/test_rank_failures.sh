#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Rank files that fail at different points of the rank checks, exported
# many times while CPU hogs load the machine. The checks of ranks 1.. run
# on several threads, each reusing one arena from rank file to rank file
# (src/layouts/fsdp_plan.c, check_worker): which worker meets the bad file,
# and after how many good ones, changes from run to run. Every export must
# exit 1 with one line naming the lowest bad rank's file and its cause,
# write nothing, and (in the ASan build of tier 2) leak nothing: a leak
# makes LeakSanitizer end the process with status 23, not 1.
#
# The corruptions, each of one real verl rank file (FSDP2 world size 8,
# and an HSDP 2x4 mesh): the zip's end truncated (fails inside the zip
# reader, after the worker's arena was handed to the file: the leak of
# issue 35), an empty file, a directory, a neighbour's file (wrong mesh
# coordinate), another world size's file (wrong mesh), a key renamed in
# data.pkl (a full pickle parse after the template missed); at ranks 1,
# 4 and 7; and two bad ranks at once (the lower one is reported).
# Usage: test_rank_failures.sh CKFS_BINARY [ROUNDS]
set -uo pipefail
CKFS=$1
ROUNDS=${2:-${CKFS_RANK_FAIL_ROUNDS:-3}}
FIX=$(cd "$(dirname "$0")/../fixtures/fsdp" && pwd -P)
WORK=$(mktemp -d /tmp/ckfs-rank-failures.XXXXXX)
HOGS=()
cleanup() {
	[ ${#HOGS[@]} -gt 0 ] && kill "${HOGS[@]}" 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT
pass=0 fail=0
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

if [ -n "${ASAN_OPTIONS+x}" ] || grep -q 'CKFS_SANITIZE:STRING=.*address' \
	"$(dirname "$CKFS")/CMakeCache.txt" 2>/dev/null; then
	echo "leak checks: on (an ASan build: a leak ends an export with status 23)"
else
	echo "leak checks: off in this build (tier 2 runs this test under ASan/LSan)"
fi

# corrupt KIND FILE: damage one rank file as KIND says; prints the cause
# the export must report for it (a glob).
corrupt() {
	local kind=$1 f=$2 r
	r=${f##*_rank_}
	r=${r%.pt}
	case $kind in
	truncated)
		truncate -s $(($(stat -c %s "$f") - 10)) "$f"
		echo "zip end of central directory truncated" ;;
	empty)
		: >"$f"
		echo "empty file" ;;
	directory)
		rm "$f" && mkdir "$f"
		echo "not a regular file" ;;
	neighbour)
		cp "${f%_rank_*}_rank_$((r - 1)).pt" "$f"
		echo "tensor '*': the file is for mesh coordinate (*) but rank $r is at (*) in the device mesh" ;;
	foreign)
		cp "$FIX/qwen2_fsdp2_w2/model_world_size_2_rank_1.pt" "$f"
		echo "tensor '*': device mesh (*) on rank 0 but (2) on rank $r" ;;
	renamed)
		python3 - "$f" <<-'PY'
		import sys
		p = sys.argv[1]
		b = bytearray(open(p, "rb").read())
		b[b.index(b"lm_head") + 1] ^= 0x20  # lm_head -> lM_head, same length
		open(p, "wb").write(b)
		PY
		echo "tensor 'lM_head.weight' is not in rank 0's state dict" ;;
	esac
}

# One CPU hog per CPU, so that the checks' threads interleave differently.
for _ in $(seq "$(nproc)"); do
	(while :; do :; done) &
	HOGS+=($!)
done

# run_case NAME FIXTURE "KIND@RANK ..." REPORTED_RANK: the fixture damaged
# so, exported ROUNDS times, two at a time.
run_case() {
	local name=$1 fixture=$2 spec=$3 report=$4 dir=$WORK/$1 kind rank cause="" c
	cp -r "$FIX/$fixture" "$dir"
	for c in $spec; do
		kind=${c%@*} rank=${c#*@}
		f=$(ls "$dir"/model_world_size_*_rank_"$rank".pt)
		c=$(corrupt "$kind" "$f")
		[ "$rank" = "$report" ] && cause=$c
	done
	local i j pids
	for ((i = 0; i < ROUNDS; i++)); do
		pids=()
		for j in 0 1; do
			"$CKFS" export -q "$dir" "$WORK/out-$j" >"$WORK/stdout-$j" 2>"$WORK/err-$j" &
			pids+=($!)
		done
		for j in 0 1; do
			wait "${pids[$j]}"
			check_one "$name" "$dir" "$report" "$cause" "$j" $?
		done
	done
	rm -rf "$dir"
}

check_one() { # NAME DIR RANK CAUSE J STATUS
	local name=$1 dir=$2 rank=$3 cause=$4 j=$5 rc=$6 err file
	err=$(cat "$WORK/err-$j")
	file=$(cd "$dir" && ls -d model_world_size_*_rank_"$rank".pt)
	if [ "$rc" != 1 ]; then
		bad "$name: export exit $rc, expected 1 (23: a leak): $(head -c 2000 <<<"$err")"
	elif [ "$(printf '%s\n' "$err" | wc -l)" != 1 ]; then
		bad "$name: expected one line, got: $err"
	# shellcheck disable=SC2053
	elif [[ $err != "ckfs: '$dir/$file': "$cause ]]; then
		bad "$name: expected \"ckfs: '$dir/$file': $cause\", got: $err"
	elif [ -s "$WORK/stdout-$j" ] || [ -e "$WORK/out-$j" ]; then
		bad "$name: export printed on stdout or left $WORK/out-$j"
	else
		pass=$((pass + 1))
	fi
}

for fixture in qwen2_fsdp2_w8 qwen2_hsdp_2x4; do
	for kind in truncated empty directory neighbour renamed; do
		for rank in 1 4 7; do
			run_case "$fixture-$kind-$rank" "$fixture" "$kind@$rank" "$rank"
		done
	done
	run_case "$fixture-foreign-5" "$fixture" "foreign@5" 5
	run_case "$fixture-two-bad" "$fixture" "neighbour@3 truncated@6" 3
done
echo "rank failures: $pass exports refused as expected, $fail failed ($ROUNDS rounds of 2 beside $(nproc) CPU hogs)"
[ "$fail" = 0 ]
