#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The README's second command: the whole test suite, on a fresh Debian 12
# machine as root. Installs what is missing (Debian packages; Python venvs,
# SeaweedFS and llama.cpp under ~/.cache/ckfs, or $XDG_CACHE_HOME/ckfs,
# each built once under a lock: tests/lib/cache.sh), builds with warnings
# as errors, then runs the tiers (--list names them). Every selected tier
# runs, whatever the others did; a table at the end gives each one's result
# and time, and the exit status is non-zero when any failed.
#
#   tests/run-tests.sh                 every tier (what CI runs)
#   tests/run-tests.sh --tier 2        one tier; --tier 1,4 several
#   tests/run-tests.sh --list          the tiers, a line each
set -uo pipefail
source "$(dirname "$0")/lib/deps.sh"
cd "$CKFS_ROOT"

TIER_WHAT=(
	[1]="ctest: unit, cli, real FUSE mounts, fault injection, S3 against SeaweedFS"
	[2]="ctest again under ASan + UBSan (+ LeakSanitizer), mount daemons included"
	[3]="the cache and the threaded mount tests under TSan, daemon included"
	[4]="Python oracles: verl's merger, originals, safetensors/transformers, llama.cpp, compressed-tensors, pip package"
	[5]="the Debian package installed, used and purged in a clean Debian 12 root"
	[6]="clients on mounts: vLLM (CPU), Run:ai Model Streamer, fastsafetensors"
)

usage() {
	echo "usage: tests/run-tests.sh [--tier N[,M...]] [--list]" >&2
	exit 2
}
selected=(1 2 3 4 5 6)
while [ $# -gt 0 ]; do
	case $1 in
	--list)
		for t in 1 2 3 4 5 6; do printf '%s  %s\n' "$t" "${TIER_WHAT[$t]}"; done
		exit 0 ;;
	--tier) [ $# -ge 2 ] || usage; sel=$2; shift 2 ;;
	--tier=*) sel=${1#--tier=}; shift ;;
	*) usage ;;
	esac
	IFS=, read -r -a selected <<<"$sel"
	for t in "${selected[@]}"; do
		[ -n "${TIER_WHAT[$t]+x}" ] 2>/dev/null || { echo "run-tests: no tier '$t' (--list)" >&2; exit 2; }
	done
done

banner() { printf '\n==== %s\n' "$*"; }

# Sanitizer reports are written to files (log_path), one per process, so
# that those of daemons (whose stderr is a log or /dev/null) and of
# children count too: a tier fails when any report was written, whatever
# the tests' exit statuses. World-writable: test_nonroot runs as nobody.
new_sanlog() {
	SANLOG=$(mktemp -d /tmp/ckfs-sanitizers.XXXXXX) && chmod 1777 "$SANLOG"
}
sanitizer_reports() { # TIER CTEST_STATUS: the status, or 1 when a report was written
	local f found=0
	for f in "$SANLOG"/*; do
		[ -e "$f" ] || continue
		# test_cache asks for 2^62 bytes on purpose (allocator_may_return_null):
		# ASan's warning about it is the only line that is not a report.
		grep -qv '^==[0-9]*==WARNING: AddressSanitizer failed to allocate 0x[0-9a-f]* bytes$' "$f" ||
			continue
		printf '\n---- %s\n' "$f"
		head -60 "$f"
		found=1
	done
	rm -rf "$SANLOG"
	if [ "$found" = 1 ]; then
		echo "$1: sanitizer reports above" >&2
		return 1
	fi
	return "$2"
}

tier1() {
	ctest --test-dir build --output-on-failure -j2 -LE package
}

tier2() {
	ckfs_build build-asan -DCKFS_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug || return
	# LeakSanitizer stops the world with ptrace; where ptrace is forbidden
	# (some containers) it dies with a fatal error instead of checking. Say
	# so and fail, unless CKFS_ALLOW_NO_LSAN=1 accepts running without leak checks.
	local leaks=1 out rc=0
	if ! out=$(ASAN_OPTIONS=detect_leaks=1 build-asan/ckfs --version 2>&1) &&
		grep -q "LeakSanitizer has encountered a fatal error\|does not work under ptrace" <<<"$out"; then
		if [ "${CKFS_ALLOW_NO_LSAN:-0}" != 1 ]; then
			echo "LeakSanitizer cannot run here (ptrace restricted); set CKFS_ALLOW_NO_LSAN=1 to run tier 2 without leak checks" >&2
			return 1
		fi
		echo "LeakSanitizer cannot run here (ptrace restricted): tier 2 runs WITHOUT leak checks"
		leaks=0
	fi
	# verify_asan_link_order=0: the fault injection tests LD_PRELOAD their
	# shim (tests/faults/failalloc.c) ahead of the ASan runtime; the shim
	# calls through to it. The allocation-failure sweep is thinned (about 40
	# values of N per command instead of up to 250) to keep the tier short.
	# lsan.supp: the deliberate leaks (handles of files still open when a
	# daemon is stopped; glibc's dlopen records under the shim), with reasons.
	new_sanlog || return
	ASAN_OPTIONS=detect_leaks=$leaks:verify_asan_link_order=0:log_path=$SANLOG/asan \
	LSAN_OPTIONS=suppressions=$CKFS_ROOT/tests/faults/lsan.supp:print_suppressions=0 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path=$SANLOG/ubsan \
	CKFS_FAILALLOC_RUNS=40 \
		ctest --test-dir build-asan --output-on-failure -j2 -LE package || rc=$?
	sanitizer_reports "tier 2" "$rc"
}

tier3() {
	ckfs_build build-tsan -DCKFS_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug || return
	# The slice cache alone, the lazily computed parts of the read path under
	# four threads (LoRA pairs read once, fp8 block rows computed once), then a
	# TSan-built daemon under 16 reader threads with faults (faults_load) and
	# 8-thread random reads of every fixture (mount_files), the rank checks
	# on threads after the mount (mount_rank_checks), a run's watcher and
	# plan LRU (mount_run), the preload thread storing beside the readers
	# (mount_preload) and a store mount's rows fetched ahead on the
	# read-ahead workers (s3_stream); the other mount tests exercise
	# lifecycle, not threads.
	local rc=0
	new_sanlog || return
	TSAN_OPTIONS=halt_on_error=1:log_path=$SANLOG/tsan \
		ctest --test-dir build-tsan -R '^(test_cache|test_cache_stress|test_fp8|test_ct_views|test_lora_vlm|faults_load|mount_files|mount_rank_checks|mount_run|mount_preload|s3_stream)$' \
		--output-on-failure || rc=$?
	sanitizer_reports "tier 3" "$rc"
}

tier4() {
	local venv
	venv=$(CKFS_VENV=${CKFS_VENV:-$CKFS_CACHE/venv} "$CKFS_ROOT/tests/setup-venv.sh" --print-path) || return
	# The GGUF oracle: llama.cpp's converter and gguf-py, unmodified, in their own
	# venv, and llama.cpp itself (llama-cpp-python built from its source package:
	# 13 minutes on 2 busy CPUs the first time, kept in the cache after).
	sh tests/gguf/setup-gguf-venv.sh --runtime || return
	# The W4A16 oracle: compressed-tensors 0.20.1 (its own quantize and pack) with
	# transformers, in their own venv (torch hardlinked from uv's cache: seconds).
	sh tests/w4a16/setup-w4a16-venv.sh || return
	CKFS_BIN="$CKFS_ROOT/build/ckfs" "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs tests/py
}

tier5() {
	# Run directly, not through ctest: a machine that cannot run it (not
	# root, no /dev/fuse) makes it say why and exit 77, which fails the run
	# here instead of counting as a skipped test. debootstrap's root is
	# cached as a tarball, so only the first run downloads it.
	bash tests/package/test_deb.sh build
}

tier6() {
	# Each client in its own venv in the cache (tests/clients/setup-client-venvs.sh,
	# about 6.5 GB the first time, shared through uv's hard links); the main venv
	# of tier 4 writes and merges the bigger checkpoint the streaming clients
	# read. A client that cannot run fails here.
	local venv
	venv=$(CKFS_VENV=${CKFS_VENV:-$CKFS_CACHE/venv} "$CKFS_ROOT/tests/setup-venv.sh" --print-path) || return
	CKFS_BIN="$CKFS_ROOT/build/ckfs" CKFS_VENV="$venv" python3 tests/clients/run_clients.py
}

source "$CKFS_ROOT/tests/lib/cache.sh"
RESULT=() TIME=()
fmt_time() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

banner "set-up: Debian packages, build (warnings are errors)"
start=$SECONDS
setup_ok=1
ckfs_install_deps && ckfs_build build || setup_ok=0
setup_time=$((SECONDS - start))

for t in "${selected[@]}"; do
	banner "tier $t: ${TIER_WHAT[$t]}"
	start=$SECONDS
	if [ "$setup_ok" = 0 ]; then
		echo "tier $t: not run: the set-up failed"
		RESULT[$t]="NOT RUN"
	# a subshell: a tier's cd, exports or exit stay in it (each step of
	# a tier says `|| return`: set -e does not hold in a condition)
	elif ("tier$t"); then
		RESULT[$t]=PASS
	else
		RESULT[$t]=FAIL
	fi
	TIME[$t]=$((SECONDS - start))
done

banner "summary"
failed=0
printf '%-6s %-8s %8s  %s\n' tier result time "what it tested"
printf '%-6s %-8s %8s  %s\n' set-up "$([ $setup_ok = 1 ] && echo PASS || echo FAIL)" \
	"$(fmt_time "$setup_time")" "Debian packages, build/ with -Werror"
[ "$setup_ok" = 1 ] || failed=1
for t in "${selected[@]}"; do
	printf '%-6s %-8s %8s  %s\n' "$t" "${RESULT[$t]}" "$(fmt_time "${TIME[$t]}")" "${TIER_WHAT[$t]}"
	[ "${RESULT[$t]}" = PASS ] || failed=1
done
[ "$failed" = 0 ] && echo "all passed" || echo "FAILED: see the tiers above"
exit "$failed"
