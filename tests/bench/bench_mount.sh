#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Mount benchmark (not a test): prints figures and ratios, medians of RUNS
# runs (default 3), all measured in the same run so they compare.
#
#   tests/bench/bench_mount.sh [PATH/TO/ckfs]
#
# Environment: BENCH_DIR (default /tmp/ckfs-bench; the checkpoint is made
# there by tests/gen/make_bench_checkpoint.py when missing, 2.4 GB of fp32
# shards, world size 4), RUNS, TORCH_PYTHON (a python with torch; default
# the repository's .venv). Run as root to measure read_ahead_kb = 1024
# (written to the mount's bdi in /sys/class/bdi/0:NN) and cold sources.
#
# Figures:
#   ready        `ckfs mount` wall time (returns when the mount is ready)
#   first cat    cat model.safetensors > /dev/null on a fresh mount
#   first dd     dd bs=1M on a fresh mount
#   second cat   cat again on the same mount (kernel page cache)
#   source cat   cat of the rank files (page cache), the floor for any reader
#   peak RSS     VmHWM of the daemon after the reads, vs the cache budget
# Throughput is bytes of model.safetensors (bf16) per second; "source
# equiv." is the fp32 source bytes per second that throughput implies.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CKFS=${1:-$ROOT/build/ckfs}
BENCH_DIR=${BENCH_DIR:-/tmp/ckfs-bench}
RUNS=${RUNS:-3}
TORCH_PYTHON=${TORCH_PYTHON:-$ROOT/.venv/bin/python}
PY=$(command -v /usr/bin/python3 || command -v python3)
CK=$BENCH_DIR/ckpt
MNT=$BENCH_DIR/mnt
ROOT_USER=0
[ "$(id -u)" = 0 ] && ROOT_USER=1

[ -x "$CKFS" ] || { echo "no ckfs at $CKFS" >&2; exit 1; }
mkdir -p "$BENCH_DIR" "$MNT"
if ! ls "$CK"/model_world_size_4_rank_3.pt >/dev/null 2>&1; then
	echo "generating the benchmark checkpoint in $CK ..." >&2
	"$TORCH_PYTHON" "$ROOT/tests/gen/make_bench_checkpoint.py" "$CK" >&2
fi
mountpoint -q "$MNT" && "$CKFS" umount -z "$MNT"
trap 'mountpoint -q "$MNT" && "$CKFS" umount -z "$MNT"' EXIT

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.4f", b - a }'; }
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
gbps() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.2f", b / s / 1e9 }'; }
daemon_pid() { "$PY" -c 'import json,os,sys; print(json.loads(os.getxattr(sys.argv[1], "user.ckfs.stats"))["pid"])' "$MNT"; }
set_ra() { # KB: the mount's bdi read_ahead_kb
	local dev
	dev=$(stat -c '%Hd:%Ld' "$MNT")
	echo "$1" >"/sys/class/bdi/$dev/read_ahead_kb"
}
drop_sources() { "$PY" -c '
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
' "$CK"/model_world_size_4_rank_*.pt; }
warm_sources() { cat "$CK"/model_world_size_4_rank_*.pt >/dev/null; }

declare -A R
rec() { R[$1]="${R[$1]:-} $2"; }

SRC_BYTES=$(cat "$CK"/model_world_size_4_rank_*.pt | wc -c)
for run in $(seq 1 "$RUNS"); do
	echo "run $run/$RUNS ..." >&2
	warm_sources
	t=$(now); cat "$CK"/model_world_size_4_rank_*.pt >/dev/null; rec src_cat "$(secs "$t")"

	for ra in default 1024; do
		[ $ra = 1024 ] && [ $ROOT_USER = 0 ] && continue
		t=$(now); "$CKFS" mount "$CK" "$MNT"; rec ready "$(secs "$t")"
		[ $ra = 1024 ] && set_ra 1024
		OUT_BYTES=$(stat -c %s "$MNT/model.safetensors")
		t=$(now); cat "$MNT/model.safetensors" >/dev/null; rec "cat1_$ra" "$(secs "$t")"
		t=$(now); cat "$MNT/model.safetensors" >/dev/null; rec "cat2_$ra" "$(secs "$t")"
		rec "rss_$ra" "$(awk '/VmHWM/ { print $2 * 1024 }' /proc/"$(daemon_pid)"/status)"
		"$CKFS" umount "$MNT"
		"$CKFS" mount "$CK" "$MNT"
		[ $ra = 1024 ] && set_ra 1024
		t=$(now); dd if="$MNT/model.safetensors" of=/dev/null bs=1M status=none; rec "dd1_$ra" "$(secs "$t")"
		"$CKFS" umount "$MNT"
	done

	# A small cache: memory follows the budget, not the model.
	"$CKFS" mount --cache-size 256MiB "$CK" "$MNT"
	t=$(now); cat "$MNT/model.safetensors" >/dev/null; rec cat1_small "$(secs "$t")"
	rec rss_small "$(awk '/VmHWM/ { print $2 * 1024 }' /proc/"$(daemon_pid)"/status)"
	"$CKFS" umount "$MNT"

	if [ $ROOT_USER = 1 ]; then
		# Cold sources: the rank files evicted from the page cache first.
		drop_sources
		t=$(now); cat "$CK"/model_world_size_4_rank_*.pt >/dev/null; rec src_cold "$(secs "$t")"
		drop_sources
		"$CKFS" mount "$CK" "$MNT"
		t=$(now); cat "$MNT/model.safetensors" >/dev/null; rec cat1_cold "$(secs "$t")"
		"$CKFS" umount "$MNT"
		warm_sources
	fi
done

m() { echo "${R[$1]:-}" | tr ' ' '\n' | grep . | median; }
line() { # LABEL KEY BYTES
	local s
	s=$(m "$2")
	[ -n "$s" ] || return 0
	printf '| %-44s | %8.3f s | %6s GB/s | %6s GB/s |\n' "$1" "$s" "$(gbps "$3" "$s")" \
		"$(gbps "$SRC_BYTES" "$s")"
}
ratio() { awk -v a="$(m "$1")" -v b="$(m "$2")" 'BEGIN { if (a && b) printf "%.2f", b / a; else printf "n/a" }'; }

echo
echo "ckfs $("$CKFS" --version | cut -d' ' -f2), $(nproc) CPUs, kernel $(uname -r), medians of $RUNS runs"
echo "checkpoint: $(awk -v b="$SRC_BYTES" 'BEGIN { printf "%.2f GB", b / 1e9 }') fp32 in 4 rank files;" \
	"model.safetensors (bf16): $(awk -v b="$OUT_BYTES" 'BEGIN { printf "%.2f GB", b / 1e9 }')"
echo
echo "| figure                                       |     time |  output rate | source equiv. |"
echo "|----------------------------------------------|----------|--------------|---------------|"
printf '| %-44s | %8.3f s |              |               |\n' "mount to ready" "$(m ready)"
line "source cat (rank files, page cache)" src_cat "$SRC_BYTES"
line "first cat, read_ahead_kb 128 (default)" cat1_default "$OUT_BYTES"
line "first dd bs=1M, read_ahead_kb 128" dd1_default "$OUT_BYTES"
line "second cat (page cache), read_ahead_kb 128" cat2_default "$OUT_BYTES"
line "first cat, read_ahead_kb 1024" cat1_1024 "$OUT_BYTES"
line "first dd bs=1M, read_ahead_kb 1024" dd1_1024 "$OUT_BYTES"
line "second cat (page cache), read_ahead_kb 1024" cat2_1024 "$OUT_BYTES"
line "first cat, --cache-size 256MiB" cat1_small "$OUT_BYTES"
line "source cat, cold (evicted) rank files" src_cold "$SRC_BYTES"
line "first cat, cold rank files" cat1_cold "$OUT_BYTES"
echo
echo "ratios (time of the reference / time of the figure; > 1 means faster):"
echo "  first cat vs source cat (warm):           $(ratio cat1_default src_cat)"
echo "  first cat vs source cat (cold):           $(ratio cat1_cold src_cold)"
echo "  first cat, read_ahead_kb 1024 vs 128:     $(ratio cat1_1024 cat1_default)"
echo "  first dd, read_ahead_kb 1024 vs 128:      $(ratio dd1_1024 dd1_default)"
echo "  second cat vs first cat:                  $(ratio cat2_default cat1_default)"
echo
awk -v a="$(m rss_default)" -v b="$(m rss_small)" 'BEGIN {
	printf "daemon peak RSS (VmHWM): %.0f MiB with the default 1024 MiB budget, %.0f MiB with 256 MiB\n", a / 1048576, b / 1048576 }'
