#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `ckfs export` vs verl's merger only: tests/bench/bench.sh with
# BENCH_ONLY=export (see there for the environment). An optional argument,
# the path of a built ckfs, picks its build directory.
if [ $# -gt 0 ]; then
	BUILD_DIR=$(cd "$(dirname "$1")" && pwd) || exit 1
	export BUILD_DIR
fi
export BENCH_ONLY=export
exec "$(dirname "$0")/bench.sh"
