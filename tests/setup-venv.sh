#!/bin/sh
# Create the Python environment used by tests/py and tests/gen (real torch, transformers,
# safetensors and verl, pinned in tests/python-requirements.txt).
#
#   tests/setup-venv.sh                 # venv at <repo>/.venv
#   CKFS_VENV=/opt/ckfs-venv tests/setup-venv.sh
#   tests/setup-venv.sh --print-path    # the same, then print the venv path on stdout
#                                       # (progress goes to stderr)
#
# Idempotent: the install is skipped when the venv's stamp file holds the sha256 of the
# requirements file.  Needs python3 with the venv module (Debian: apt-get install python3-venv).
set -eu
print_path=0
[ "${1:-}" = "--print-path" ] && print_path=1
exec 3>&1 1>&2   # progress on stderr; stdout (fd 3) carries only the path

repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${CKFS_VENV:-$repo/.venv}
req=$repo/tests/python-requirements.txt
stamp=$venv/.ckfs-requirements.sha256

want=$(sha256sum "$req" | cut -d' ' -f1)

if [ -x "$venv/bin/python" ]; then
    echo "setup-venv: using existing venv $venv"
else
    echo "setup-venv: creating venv $venv"
    python3 -m venv "$venv"
fi

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "setup-venv: requirements unchanged (sha256 $want), nothing to install"
    [ "$print_path" = 1 ] && echo "$venv" >&3
    exit 0
fi

echo "setup-venv: installing $req into $venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
echo "$want" > "$stamp"
echo "setup-venv: done; run tests with $venv/bin/python -m pytest -q tests/py"
[ "$print_path" = 1 ] && echo "$venv" >&3
exit 0
