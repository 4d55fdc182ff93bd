#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The README's first command: install what is missing (Debian 12, as root),
# build ckfs, and run it on the bundled sample checkpoint (a tiny real verl
# FSDP2 actor, world size 4, written by torch 2.8):
#   1. inspect it (metadata only);
#   2. export the merged Hugging Face folder and verify it against verl's
#      own merger output;
#   3. mount it, list the mounted folder and read it with a real reader
#      (the safetensors package): every tensor of an fp32 view of the mount
#      equals the model's original weights, and the default bf16 mount is
#      byte-identical to the export; then unmount.
set -euo pipefail
source "$(dirname "$0")/lib/deps.sh"

ckfs_install_deps
ckfs_build "$CKFS_ROOT/build"
CKFS=$CKFS_ROOT/build/ckfs
NAME=llama_tied_fsdp2_w4
SAMPLE=$CKFS_ROOT/tests/fixtures/fsdp/$NAME
OUT=${CKFS_QUICKSTART_OUT:-/tmp/ckfs-quickstart}
mkdir -p "$OUT"

step() { printf '\n== %s\n' "$*"; }

step "ckfs inspect $SAMPLE"
"$CKFS" inspect "$SAMPLE"

step "ckfs export $SAMPLE $OUT/merged"
"$CKFS" export --force "$SAMPLE" "$OUT/merged"
ls -l "$OUT/merged"
step "ckfs verify against verl's merger output"
"$CKFS" verify "$SAMPLE" --against "$CKFS_ROOT/tests/fixtures/expected/$NAME"
cmp "$OUT/merged/model.safetensors" "$CKFS_ROOT/tests/fixtures/expected/$NAME/model.safetensors" &&
	echo "model.safetensors is byte-identical to verl's"

# A real reader: the safetensors package (and numpy) in a small venv,
# built once under a lock (tests/lib/cache.sh).
source "$CKFS_ROOT/tests/lib/cache.sh"
READER=$CKFS_CACHE/reader-venv
READER_PINS="$(grep '^safetensors==' "$CKFS_ROOT/tests/python-requirements.txt") $(grep '^numpy==' "$CKFS_ROOT/tests/python-requirements.txt")"
build_reader() { # TMP
	step "installing the safetensors reader ($READER_PINS) into $READER"
	python3 -m venv "$1" &&
		"$1/bin/python" -m pip install -q --disable-pip-version-check $READER_PINS
}
ckfs_cached "$READER" "$READER_PINS" build_reader

MNT=$OUT/mnt MNT32=$OUT/mnt-fp32
mkdir -p "$MNT" "$MNT32"
for m in "$MNT" "$MNT32"; do
	grep -q " $m " /proc/mounts && "$CKFS" umount "$m"
done
trap '"$CKFS" umount "$MNT" 2>/dev/null; "$CKFS" umount "$MNT32" 2>/dev/null' EXIT

step "ckfs mount $SAMPLE $MNT"
"$CKFS" mount "$SAMPLE" "$MNT"
"$CKFS" mount --dtype fp32 "$SAMPLE" "$MNT32"
ls -l "$MNT"
cmp "$MNT/model.safetensors" "$OUT/merged/model.safetensors" &&
	echo "the mounted model.safetensors is byte-identical to the export"

step "reading the mount with safetensors"
"$READER/bin/python" - "$MNT" "$MNT32" "$CKFS_ROOT/tests/fixtures/original/$NAME.safetensors" <<'PY'
import sys
import numpy as np
from safetensors import safe_open

mnt, mnt32, original = sys.argv[1:]
with safe_open(f"{mnt}/model.safetensors", framework="np") as f:
    print(f"{mnt}/model.safetensors: metadata {f.metadata()}, {len(f.keys())} tensors")
    for k in list(f.keys())[:4]:
        s = f.get_slice(k)
        print(f"  {k}: {s.get_dtype()} {s.get_shape()}")
with safe_open(f"{mnt32}/model.safetensors", framework="np") as got, \
        safe_open(original, framework="np") as want:
    names = [k for k in want.keys() if k in got.keys()]
    for k in names:
        assert np.array_equal(got.get_tensor(k), want.get_tensor(k)), k
    print(f"{mnt32}: all {len(names)} tensors equal the original fp32 weights "
          f"(lm_head.weight is tied to the embeddings and not served)")
PY
"$CKFS" stats "$MNT"
step "done: unmounting (mount it yourself with: $CKFS mount $SAMPLE /some/dir)"
