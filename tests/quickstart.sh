#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The README's first command: install what is missing (Debian 12, as root),
# build ckfs, and run it on the bundled sample checkpoint (a tiny real verl
# FSDP2 actor, world size 4, written by torch 2.8): inspect it, export the
# merged Hugging Face folder and verify it against verl's own merger output.
set -euo pipefail
source "$(dirname "$0")/lib/deps.sh"

ckfs_install_deps
ckfs_build "$CKFS_ROOT/build"
CKFS=$CKFS_ROOT/build/ckfs
SAMPLE=$CKFS_ROOT/tests/fixtures/fsdp/llama_tied_fsdp2_w4
OUT=${CKFS_QUICKSTART_OUT:-/tmp/ckfs-quickstart}

echo
echo "== ckfs inspect $SAMPLE"
"$CKFS" inspect "$SAMPLE"
echo
echo "== ckfs export $SAMPLE $OUT"
"$CKFS" export --force "$SAMPLE" "$OUT"
ls -l "$OUT"
echo
echo "== ckfs verify against verl's merger output"
"$CKFS" verify "$SAMPLE" --against "$CKFS_ROOT/tests/fixtures/expected/llama_tied_fsdp2_w4"
cmp "$OUT/model.safetensors" "$CKFS_ROOT/tests/fixtures/expected/llama_tied_fsdp2_w4/model.safetensors" &&
	echo "model.safetensors is byte-identical to verl's"
