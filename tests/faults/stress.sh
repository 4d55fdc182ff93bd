#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Not part of CI: the fault tests that race readers against changing
# sources (faults_load: tests/faults/test_load.sh; mount_faults:
# tests/mount/test_faults.sh), run RUNS times in a row beside CPU hogs, to
# show whether they are flaky on a busy machine. Prints each failure (its
# first FAIL line, the daemon's fate, any sanitizer report) and the
# failure counts; exits 1 when any run failed.
#
# Usage: bash tests/faults/stress.sh [-n RUNS] [-c HOGS] [-s SECONDS] [-t TESTS] [BUILD]
#   -n RUNS     rounds (default 20); each round runs every test once
#   -c HOGS     CPU hogs beside them (default: one per CPU): stress-ng --cpu
#               when installed, else `yes >/dev/null` loops
#   -s SECONDS  faults_load's length (CKFS_LOAD_SECONDS, default 20 as in CI)
#   -t TESTS    which tests, comma separated: load, faults (default both)
#   BUILD       build folder holding ckfs (default build). A sanitizer build
#               (CKFS_SANITIZE in its CMakeCache.txt) runs with the options
#               of tests/run-tests.sh, reports written to files; a run that
#               leaves a report fails.
# Needs root and /dev/fuse, like the tests themselves. Output of failed
# runs is kept under the folder printed at the end.
set -u

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RUNS=20 HOGS=$(nproc) SECONDS_LOAD=${CKFS_LOAD_SECONDS:-20} TESTS=load,faults
while getopts n:c:s:t: opt; do
	case $opt in
	n) RUNS=$OPTARG ;;
	c) HOGS=$OPTARG ;;
	s) SECONDS_LOAD=$OPTARG ;;
	t) TESTS=$OPTARG ;;
	*) echo "usage: $0 [-n RUNS] [-c HOGS] [-s SECONDS] [-t load,faults] [BUILD]" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
BUILD=$(cd "${1:-$ROOT/build}" && pwd) || exit 2
CKFS=$BUILD/ckfs
[ -x "$CKFS" ] || { echo "stress: no ckfs in '$BUILD'" >&2; exit 2; }
SANITIZE=$(sed -n 's/^CKFS_SANITIZE:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
OUT=$(mktemp -d /tmp/ckfs-stress.XXXXXX)
chmod 1777 "$OUT"

HOG_PIDS=()
stop_hogs() {
	local p
	for p in "${HOG_PIDS[@]}"; do
		kill "$p" 2>/dev/null
	done
	for p in "${HOG_PIDS[@]}"; do
		wait "$p" 2>/dev/null
	done
	HOG_PIDS=()
}
trap stop_hogs EXIT
if [ "$HOGS" -gt 0 ]; then
	if command -v stress-ng >/dev/null; then
		stress-ng --cpu "$HOGS" --quiet &
		HOG_PIDS+=($!)
	else
		for _ in $(seq "$HOGS"); do
			yes >/dev/null &
			HOG_PIDS+=($!)
		done
	fi
fi

# The sanitizer options of tests/run-tests.sh (tiers 2 and 3).
sanitizer_env() { # LOGDIR: prints VAR=VALUE words for env
	case $SANITIZE in
	*address*)
		echo "ASAN_OPTIONS=detect_leaks=1:verify_asan_link_order=0:log_path=$1/asan"
		echo "LSAN_OPTIONS=suppressions=$ROOT/tests/faults/lsan.supp:print_suppressions=0"
		echo "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path=$1/ubsan" ;;
	*thread*)
		echo "TSAN_OPTIONS=halt_on_error=1:log_path=$1/tsan" ;;
	esac
}

script_of() {
	case $1 in
	load) echo "$ROOT/tests/faults/test_load.sh" ;;
	faults) echo "$ROOT/tests/mount/test_faults.sh" ;;
	*) echo "stress: unknown test '$1' (load, faults)" >&2; exit 2 ;;
	esac
}

declare -A FAILED
IFS=, read -r -a NAMES <<<"$TESTS"
for name in "${NAMES[@]}"; do
	script_of "$name" >/dev/null || exit 2
	FAILED[$name]=0
done
echo "stress: $RUNS rounds of ${TESTS} with $CKFS (${SANITIZE:-no sanitizer}) beside $HOGS CPU hog(s); output in $OUT"
start=$SECONDS
for i in $(seq "$RUNS"); do
	for name in "${NAMES[@]}"; do
		dir=$OUT/$i-$name
		mkdir -p "$dir/san"
		chmod 1777 "$dir/san"
		# shellcheck disable=SC2046 # one word per variable
		env $(sanitizer_env "$dir/san") CKFS_LOAD_SECONDS="$SECONDS_LOAD" \
			timeout 600 bash "$(script_of "$name")" "$CKFS" >"$dir/out" 2>&1
		rc=$?
		reports=$(grep -lv '^==[0-9]*==WARNING: AddressSanitizer failed to allocate 0x[0-9a-f]* bytes$' \
			"$dir"/san/* 2>/dev/null)
		if [ "$rc" = 0 ] && [ -z "$reports" ]; then
			rm -rf "$dir"
			continue
		fi
		FAILED[$name]=$((FAILED[$name] + 1))
		why=$(grep -m1 'FAIL' "$dir/out")
		printf 'stress: round %d %s FAILED (exit %d): %s\n' "$i" "$name" "$rc" "${why:-no FAIL line}"
		grep -h 'the daemon\|daemon DEAD\|killed by signal' "$dir/out" | head -3 | sed 's/^/stress:     /'
		for r in $reports; do
			printf 'stress:     sanitizer report %s: %s\n' "$r" \
				"$(grep -m1 -E 'ERROR|WARNING|SUMMARY|runtime error' "$r")"
		done
	done
done
stop_hogs
total=0
for name in "${NAMES[@]}"; do
	printf 'stress: %s failed %d of %d runs\n' "$name" "${FAILED[$name]}" "$RUNS"
	total=$((total + FAILED[$name]))
done
printf 'stress: %d failure(s) in %d s (%s)\n' "$total" $((SECONDS - start)) "${SANITIZE:-release}"
[ "$total" = 0 ] && rm -rf "$OUT"
[ "$total" = 0 ]
