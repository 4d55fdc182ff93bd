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
# Idempotent: a venv whose stamp holds the lock's sha256 is left alone.
set -eu
print_path=0
[ "${1:-}" = "--print-path" ] && print_path=1
exec 3>&1 1>&2 # progress on stderr; stdout (fd 3) carries only the path

here=$(cd "$(dirname "$0")" && pwd)
cache=${CKFS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckfs}
UV_VERSION=0.13.8
uvenv=$cache/uv-$UV_VERSION
venv=${CKFS_W4A16_VENV:-$cache/w4a16-venv}
lock=$here/requirements.txt
export UV_CACHE_DIR=$cache/uv-cache UV_LINK_MODE=hardlink UV_NO_PROGRESS=1 UV_PYTHON_DOWNLOADS=never

if [ ! -x "$uvenv/bin/uv" ]; then
	echo "setup-w4a16-venv: installing uv $UV_VERSION into $uvenv"
	rm -rf "$uvenv"
	python3 -m venv "$uvenv"
	"$uvenv/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
fi

stamp=$venv/.ckfs-stamp
want=$(sha256sum "$lock" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
	echo "setup-w4a16-venv: $venv up to date"
else
	start=$(date +%s)
	[ -x "$venv/bin/python" ] || { echo "setup-w4a16-venv: creating $venv"; python3 -m venv --without-pip "$venv"; }
	echo "setup-w4a16-venv: installing $lock into $venv"
	"$uvenv/bin/uv" pip sync -q --python "$venv/bin/python" "$lock"
	echo "$want" >"$stamp"
	echo "setup-w4a16-venv: installed in $(($(date +%s) - start)) s"
fi
[ "$print_path" = 1 ] && echo "$venv" >&3
exit 0
