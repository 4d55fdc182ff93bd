#!/bin/sh
# Create the Python environment used by tests/py and tests/gen (real torch, transformers,
# safetensors and verl, pinned in tests/python-requirements.txt).
#
#   tests/setup-venv.sh                 # venv at <repo>/.venv
#   CKFS_VENV=/opt/ckfs-venv tests/setup-venv.sh
#
# Idempotent: the install is skipped when the venv's stamp file holds the sha256 of the
# requirements file.  Needs python3 with the venv module (Debian: apt-get install python3-venv).
set -eu

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
    exit 0
fi

echo "setup-venv: installing $req into $venv"
"$venv/bin/python" -m pip install --disable-pip-version-check -r "$req"
echo "$want" > "$stamp"
echo "setup-venv: done; run tests with $venv/bin/python -m pytest -q tests/py"
