#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The README's second command: the whole test suite, on a fresh Debian 12
# machine as root. Installs what is missing (Debian packages; a Python venv
# with the pinned packages of tests/python-requirements.txt), builds with
# warnings as errors, then runs every tier:
#   1. ctest: unit tests, CLI tests, real FUSE mount tests
#   2. the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer
#   3. the cache stress test under ThreadSanitizer
#   4. the Python oracle tier: verl's own merger, original weights,
#      safetensors and transformers readers (tests/py)
# Any failure stops the run with a non-zero exit.
set -euo pipefail
source "$(dirname "$0")/lib/deps.sh"
cd "$CKFS_ROOT"

tier() { printf '\n==== %s\n' "$*"; }

tier "dependencies"
ckfs_install_deps

tier "build (warnings are errors)"
ckfs_build build
tier "tier 1: ctest (unit, cli, mount)"
ctest --test-dir build --output-on-failure -j2

tier "tier 2: unit tests under ASan + UBSan"
ckfs_build build-asan -DCKFS_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	ctest --test-dir build-asan -L unit --output-on-failure -j2

tier "tier 3: cache stress under TSan"
ckfs_build build-tsan -DCKFS_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug
TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan -R 'cache' --output-on-failure

tier "tier 4: Python oracles (verl merger, originals, real readers)"
# The venv lives outside the clone so CI runs on fresh clones reuse it.
VENV=$(CKFS_VENV=${CKFS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ckfs/venv} \
	"$CKFS_ROOT/tests/setup-venv.sh" --print-path)
CKFS_BIN="$CKFS_ROOT/build/ckfs" "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/py
