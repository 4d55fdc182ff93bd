#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Reads of an s3:// mount that follow the reader (src/fuse/read_stream.c),
# on a real SeaweedFS on loopback, with the mount's default options:
#   - a tensor-parallel shard reader taking a piece of every row (an mmap,
#     as safetensors' get_slice under vLLM) gets the bytes of a local mount
#     and makes the daemon fetch at most 1.25x the pages its piece touches
#     (the least a page-serving mount can fetch), where whole slices and
#     the windowed read-ahead fetched the whole tensor (4x); its pieces are
#     found to be a piece of every row and fetched ahead: most rows' pages
#     are stored before the reader faults them (readahead_rows), so it
#     makes a READ for at most a quarter of its 512 rows (one each before);
#   - a sequential reader (`cat`) gets the same bytes, is judged
#     sequential, is stored ahead into the page cache, and each source byte
#     is fetched about once;
#   - kernel_readahead= given (the shard-reader options) turns it off.
# Counts, not timings. Needs root (the mount's read_ahead_kb); 77 otherwise.
# Usage: test_s3_stream.sh CKFS_BINARY
set -uo pipefail
CKFS=$1
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/seaweedfs.sh"

if [ "$(id -u)" != 0 ] || [ ! -e /dev/fuse ]; then
	echo "SKIP: needs root and /dev/fuse (the mount's kernel readahead)"
	exit 77
fi
MOUNTS=()
session_cleanup() {
	for m in "${MOUNTS[@]}"; do
		fusermount3 -uz "$m" 2>/dev/null
	done
}
B=ckfs-stream
seaweedfs_session WORK /tmp/ckfs-s3stream.XXXXXX "$B" || exit 1

fails=0
fail() {
	echo "FAIL: $*" >&2
	fails=$((fails + 1))
}
field() { "$CKFS" stats --json "$1" | sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p"; }
mount_at() { # SRC MOUNTPOINT [OPTIONS...]
	mkdir -p "$2"
	if ! "$CKFS" mount "${@:3}" "$1" "$2" 2>"$WORK/mount.err"; then
		fail "mount $1: $(cat "$WORK/mount.err")"
		return 1
	fi
	MOUNTS+=("$2")
}

# A Hugging Face folder: three bf16 tensors of 512 rows of 16 KiB (4
# pages), 24 MiB in all, then one of 512 rows of 9.5 KiB (2.375 pages,
# as Qwen2.5-0.5B's down_proj), served as they are.
SRC=$WORK/hf
mkdir -p "$SRC"
cp "$HERE/../fixtures/hf/qwen2_single/config.json" "$SRC/"
python3 - "$SRC/model.safetensors" <<'EOF' || exit 1
import json, random, struct, sys
random.seed(40)
shapes = [[512, 8192]] * 3 + [[512, 4864]]
hdr, at = {}, 0
for i, shape in enumerate(shapes):
    n = shape[0] * shape[1] * 2
    hdr["model.w%d.weight" % i] = {"dtype": "BF16", "shape": shape, "data_offsets": [at, at + n]}
    at += n
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + random.randbytes(at))
EOF
s3_put_tree "$SRC" "$AWS_ENDPOINT_URL/$B/hf" || { echo "FAIL: upload" >&2; exit 1; }
M=$WORK/m
mount_at "$SRC" "$M/local" || exit 1

# shard.py FILE RANK TP TENSOR: rank RANK's piece of every row of TENSOR
# through an mmap; prints the pages the pieces touch, then the bytes' md5.
cat >"$WORK/shard.py" <<'EOF'
import hashlib, json, mmap, os, struct, sys
path, rank, tp, name = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
fd = os.open(path, os.O_RDONLY)
n = struct.unpack("<Q", os.pread(fd, 8, 0))[0]
t = json.loads(os.pread(fd, n, 8))[name]
base = 8 + n + t["data_offsets"][0]
rows, cols = t["shape"]
k = cols // tp * 2
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
md5, pages = hashlib.md5(), set()
for i in range(rows):
    s = base + i * cols * 2 + rank * k
    md5.update(m[s:s + k])
    pages.update(range(s // 4096, (s + k - 1) // 4096 + 1))
print(len(pages), md5.hexdigest())
EOF

# 1. A shard reader: a piece of every row, pages fetched within 1.25x,
# most rows ahead of the reader. Rows of whole pages (w1: rank 3's piece
# of 2 KiB straddles a page in every row), then rows of 2.375 pages (w3:
# rank 5's piece of 1216 bytes in 1 or 2 pages, in 8 phases).
shard_case() { # MOUNT TENSOR RANK
	local pages want got before reads0 fetched reads rows0 rows floor
	read -r pages want < <(python3 "$WORK/shard.py" "$M/local/model.safetensors" "$3" 8 "$2")
	before=$(field "$1" store_bytes) reads0=$(field "$1" reads) rows0=$(field "$1" readahead_rows)
	read -r _ got < <(python3 "$WORK/shard.py" "$1/model.safetensors" "$3" 8 "$2")
	fetched=$(($(field "$1" store_bytes) - before))
	reads=$(($(field "$1" reads) - reads0)) rows=$(($(field "$1" readahead_rows) - ${rows0:-0}))
	floor=$((pages * 4096))
	if [ "$got" != "$want" ]; then
		fail "shard reader of $2: its bytes differ from the local mount's"
	elif [ -z "$before" ] || [ "$floor" -lt $((512 * 4096)) ]; then
		fail "shard reader of $2: no count (store_bytes '$before', $pages pages)"
	elif [ "$fetched" -gt $((floor * 5 / 4)) ]; then
		fail "shard reader of $2: fetched $fetched bytes for $pages pages ($floor bytes; at most 1.25x)"
	else
		echo "ok: shard reader of $2: $fetched bytes fetched for $floor bytes of pages touched"
	fi
	if [ -z "$rows0" ] || [ "$rows" -lt 256 ] || [ "$reads" -gt 128 ]; then
		fail "shard reader of $2: rows not fetched ahead (readahead_rows ${rows0:+$rows}, $reads READs for 512 rows)"
	else
		echo "ok: shard reader of $2: $rows pieces of rows stored ahead, $reads READs for 512 rows"
	fi
}
if mount_at "s3://$B/hf" "$M/shard"; then
	shard_case "$M/shard" model.w1.weight 3
	shard_case "$M/shard" model.w3.weight 5
fi

# 2. A sequential reader: same bytes, streamed, each byte fetched about once.
if mount_at "s3://$B/hf" "$M/seq"; then
	before=$(field "$M/seq" store_bytes)
	size=$(stat -c %s "$M/seq/model.safetensors")
	if ! cmp -s "$M/seq/model.safetensors" "$M/local/model.safetensors"; then
		fail "cat: the bytes differ from the local mount's"
	fi
	fetched=$(($(field "$M/seq" store_bytes) - before))
	seq=$(field "$M/seq" readahead_sequential) stored=$(field "$M/seq" readahead_stored)
	if [ "${seq:-0}" -eq 0 ] || [ "${stored:-0}" -lt $((size / 2)) ]; then
		fail "cat: not streamed (readahead_sequential ${seq:-none}, readahead_stored ${stored:-none} of $size)"
	elif [ "$fetched" -lt "$((size - 4096))" ] || [ "$fetched" -gt $((size + size / 20)) ]; then
		fail "cat: fetched $fetched bytes for a file of $size"
	else
		echo "ok: cat: $seq sequential reads, $stored bytes stored ahead, $fetched fetched for $size"
	fi
fi

# 3. kernel_readahead= given: the windowed read-ahead as for local sources.
if mount_at "s3://$B/hf" "$M/tuned" -o kernel_readahead=4KiB; then
	cmp -s "$M/tuned/model.safetensors" "$M/local/model.safetensors" ||
		fail "kernel_readahead=4KiB: the bytes differ"
	stored=$(field "$M/tuned" readahead_stored) seq=$(field "$M/tuned" readahead_sequential)
	if [ "$stored" != 0 ] || [ "${seq:-0}" -eq 0 ]; then
		fail "kernel_readahead=4KiB: readahead_stored ${stored:-none}, readahead_sequential ${seq:-none}"
	else
		echo "ok: kernel_readahead=4KiB: windowed read-ahead, nothing stored"
	fi
fi

[ "$fails" = 0 ] && echo "all s3 stream checks passed"
exit $((fails > 0))
