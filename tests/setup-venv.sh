#!/bin/sh
# Create the Python environment used by tests/py and tests/gen (real torch, transformers,
# safetensors and verl, pinned in tests/python-requirements.txt).
#
#   tests/setup-venv.sh                 # venv at <repo>/.venv
#   CKFS_VENV=/opt/ckfs-venv tests/setup-venv.sh
#   tests/setup-venv.sh --print-path    # the same, then print the venv path on stdout
#                                       # (progress goes to stderr)
#
# Idempotent: nothing is installed when the venv's stamp holds the sha256 of the
# requirements file. Otherwise a new venv is built beside it and renamed into place
# under a lock (tests/lib/cache.sh): two runs at once build it once, and an
# interrupted build leaves no venv to trust. Needs python3 with the venv module
# (Debian: apt-get install python3-venv).
set -eu
print_path=0
[ "${1:-}" = "--print-path" ] && print_path=1
exec 3>&1 1>&2   # progress on stderr; stdout (fd 3) carries only the path

repo=$(cd "$(dirname "$0")/.." && pwd)
. "$repo/tests/lib/cache.sh"
venv=${CKFS_VENV:-$repo/.venv}
req=$repo/tests/python-requirements.txt
want=$(sha256sum "$req" | cut -d' ' -f1)

build_venv() { # TMP
    echo "setup-venv: installing $req into $1"
    python3 -m venv "$1" &&
        "$1/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
}

if ckfs_cache_fresh "$venv" "$want"; then
    echo "setup-venv: requirements unchanged (sha256 $want), nothing to install"
else
    ckfs_cached "$venv" "$want" build_venv
    echo "setup-venv: done; run tests with $venv/bin/python -m pytest -q tests/py"
fi
[ "$print_path" = 1 ] && echo "$venv" >&3
exit 0
