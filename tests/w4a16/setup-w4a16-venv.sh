#!/bin/sh
# SPDX-License-Identifier: MIT
# Create the W4A16 oracle's venv: compressed-tensors 0.20.1 (its own quantize
# and pack functions, the serialization of its quantization_config) with
# torch and transformers, pinned in tests/w4a16/requirements.txt:
#
#   ~/.cache/ckfs/w4a16-venv                python with torch, transformers, compressed-tensors
#
#   tests/w4a16/setup-w4a16-venv.sh [--print-path]   (then the venv path on stdout)
#
# Nothing is compiled: a minute or two the first time, most of it torch
# (hardlinked from uv's cache when the GGUF or client venvs exist).
# Idempotent: a venv whose stamp holds the lock's sha256 is left alone;
# a new one is built aside and renamed into place under a lock
# (tests/lib/cache.sh), so two runs at once build it once.
set -eu
print_path=0
[ "${1:-}" = "--print-path" ] && print_path=1
exec 3>&1 1>&2 # progress on stderr; stdout (fd 3) carries only the path

here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib/cache.sh"
venv=${CKFS_W4A16_VENV:-$CKFS_CACHE/w4a16-venv}
lock=$here/requirements.txt
want=$(sha256sum "$lock" | cut -d' ' -f1)

build_venv() { # TMP
	echo "setup-w4a16-venv: installing $lock into $1"
	python3 -m venv --without-pip "$1" &&
		"$CKFS_UV" pip sync -q --python "$1/bin/python" "$lock"
}

if ckfs_cache_fresh "$venv" "$want"; then
	echo "setup-w4a16-venv: $venv up to date"
else
	start=$(date +%s)
	ckfs_uv
	ckfs_cached "$venv" "$want" build_venv
	echo "setup-w4a16-venv: ready in $(($(date +%s) - start)) s"
fi
[ "$print_path" = 1 ] && echo "$venv" >&3
exit 0
