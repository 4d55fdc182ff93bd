#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The mount figures only (mount to ready, first and second reads against the
# FUSE ceiling, daemon RSS): tests/bench/bench.sh with BENCH_ONLY="ready
# read" (see there for the environment). An optional argument, the path of
# a built ckfs, picks its build directory.
if [ $# -gt 0 ]; then
	BUILD_DIR=$(cd "$(dirname "$1")" && pwd) || exit 1
	export BUILD_DIR
fi
export BENCH_ONLY="ready read"
exec "$(dirname "$0")/bench.sh"
