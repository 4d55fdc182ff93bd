#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# DeepSpeed benchmark (not a test; nothing here is asserted): `ckfs export`
# and a mount's first read against DeepSpeed's zero_to_fp32 conversion to
# safetensors, on a Qwen2.5-0.5B-shaped ZeRO-3 checkpoint of world size 8
# (bf16 training: fp32 masters and Adam moments in the optimizer files,
# 5.9 GB), side by side in the same run; prints medians (docs/benchmarks.md,
# "DeepSpeed ZeRO-3"). Beside each export, the same run measures its write
# bound: `dd conv=fsync` of the same size into the same folder (from
# /dev/zero, and a copy of the same bytes from /dev/shm), and the export
# with its output on /dev/shm (no disk); /proc/diskstats deltas (sectors
# written, time writing, time busy) of the folder's disk for each.
#
#   tests/bench/bench_deepspeed.sh
#
# Environment:
#   BENCH_DIR    checkpoints and outputs (default /tmp/ckfs-bench); the
#                checkpoint is generated there once by
#                tests/gen/make_bench_deepspeed.py and reused
#   RUNS         runs of every measurement (default 3); medians are printed
#   DS_SHAPE     a shape of make_bench_checkpoint.py (default qwen2.5-0.5b)
#   DS_WORLD     data-parallel ranks (default 8)
#   BENCH_MOUNT_CACHE   the mount's --cache-size (default 1GiB)
#   BUILD_DIR    CMake build directory (default build), built first unless
#                BENCH_BUILD=0
#   TORCH_PYTHON a python with torch, safetensors and deepspeed (default:
#                the pinned venv of tests/setup-venv.sh)
#   CKFS_OTHER   another ckfs binary whose export is timed beside (an A/B of
#                a change to the export writer), optional
#   SHM_DIR      a folder on tmpfs for the exports without disk (default
#                /dev/shm/ckfs-bench-deepspeed; removed at the end)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH_DIR=${BENCH_DIR:-/tmp/ckfs-bench}
RUNS=${RUNS:-3}
DS_SHAPE=${DS_SHAPE:-qwen2.5-0.5b}
DS_WORLD=${DS_WORLD:-8}
BENCH_MOUNT_CACHE=${BENCH_MOUNT_CACHE:-1GiB}
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
case $BUILD_DIR in /*) ;; *) BUILD_DIR=$ROOT/$BUILD_DIR ;; esac

say() { echo "bench: $*" >&2; }
die() { echo "bench: $*" >&2; exit 1; }

CKFS=$BUILD_DIR/ckfs
if [ "${BENCH_BUILD:-1}" != 0 ]; then
	cmake -S "$ROOT" -B "$BUILD_DIR" >/dev/null
	cmake --build "$BUILD_DIR" -j2 --target ckfs >/dev/null || die "the build failed"
fi
[ -x "$CKFS" ] || die "no $CKFS"
if [ -z "${TORCH_PYTHON:-}" ]; then
	TORCH_PYTHON=$("$ROOT/tests/setup-venv.sh" --print-path)/bin/python
fi
[ -x "$TORCH_PYTHON" ] || die "no python at $TORCH_PYTHON"
[ -x /usr/bin/time ] || die "no /usr/bin/time (GNU time) for the peak RSS"
export DS_ACCELERATOR=cpu HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
Z2F="$TORCH_PYTHON $ROOT/tests/bench/zero_to_fp32_export.py"

D=$BENCH_DIR/deepspeed-$DS_SHAPE-w$DS_WORLD
CK=$D/ckpt
MNT=$D/mnt
mkdir -p "$D" "$MNT"
RESULTS=$D/results.txt
: >"$RESULTS"
SHM=${SHM_DIR:-/dev/shm/ckfs-bench-deepspeed}
cleanup() {
	if mountpoint -q "$MNT"; then "$CKFS" umount -z "$MNT" || true; fi
	rm -rf "$SHM" "$D/dd.out"
}
trap cleanup EXIT
cleanup
mkdir -p "$SHM"

if [ ! -e "$CK/.bench-complete" ]; then
	say "generating $DS_SHAPE at world size $DS_WORLD in $CK (once; reused by later runs)"
	rm -rf "$CK.tmp"
	nice -n 10 "$TORCH_PYTHON" "$ROOT/tests/gen/make_bench_deepspeed.py" "$CK.tmp" \
		--shape "$DS_SHAPE" --world "$DS_WORLD" >"$D/gen.log" 2>&1 ||
		{ tail -20 "$D/gen.log" >&2; die "generating the checkpoint failed"; }
	rm -rf "$CK"
	mv "$CK.tmp" "$CK"
	touch "$CK/.bench-complete"
fi

rec() { echo "$1 $2" >>"$RESULTS"; }
t_now() { echo "$EPOCHREALTIME"; }
t_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }'; }
# every file into the page cache, for both tools; others' dirty pages written first
warm() { cat "$CK"/*/*.pt >/dev/null; sync; }

# The disk under $D in /proc/diskstats (none on tmpfs or a device it lacks):
# sectors written, milliseconds writing, milliseconds busy.
DEV=$(basename "$(df --output=source "$D" | tail -1)")
grep -q " $DEV " /proc/diskstats || DEV=
diskstats() { awk -v d="$DEV" '$3 == d { print $10, $11, $13; f = 1 } END { if (!f) print 0, 0, 0 }' /proc/diskstats; }
DS0=
disk_start() { DS0=$(diskstats); }
disk_end() { # KEY: MiB written, write ms and busy ms since disk_start (the whole disk's)
	local a
	a=$(diskstats)
	set -- "$1" $DS0 $a
	rec "${1}_wmib" "$(awk -v a="$2" -v b="$5" 'BEGIN { printf "%.0f", (b - a) * 512 / 2^20 }')"
	rec "${1}_wms" "$(($6 - $3))"
	rec "${1}_busyms" "$(($7 - $4))"
}

timed() { # KEY CMD...: wall seconds, CPU seconds (user + system) and peak RSS (bytes) of CMD
	local key=$1
	shift
	/usr/bin/time -f "%e %M %U %S" -o "$D/time" "$@" >"$D/log.$key" 2>&1 ||
		{ tail -5 "$D/log.$key" >&2; die "$key failed: $*"; }
	rec "${key}_s" "$(cut -d' ' -f1 "$D/time")"
	rec "${key}_rss" "$(($(cut -d' ' -f2 "$D/time") * 1024))"
	rec "${key}_cpu" "$(awk '{ printf "%.2f", $3 + $4 }' "$D/time")"
}

same_file() { cmp -s "$1" "$2" || die "$1 and $2 differ"; }

# zero_to_fp32's conversion as shipped, once: it fails on tied embeddings.
if $Z2F "$CK" "$D/z2f.unchanged" --unchanged >"$D/log.unchanged" 2>&1; then
	UNCHANGED="succeeded"
else
	UNCHANGED=$(tail -1 "$D/log.unchanged")
fi
rm -rf "$D/z2f.unchanged"

for run in $(seq "$RUNS"); do
	say "run $run/$RUNS"
	for dt in fp32 bf16; do
		rm -rf "$D/ckfs.$dt" "$D/z2f.$dt" "$SHM/ckfs.$dt"
		warm
		disk_start
		timed "ckfs_$dt" "$CKFS" export -q --dtype "$dt" "$CK" "$D/ckfs.$dt"
		disk_end "ckfs_$dt"
		if [ -n "${CKFS_OTHER:-}" ]; then
			rm -rf "$D/other.$dt"
			warm
			disk_start
			timed "other_$dt" "$CKFS_OTHER" export -q --dtype "$dt" "$CK" "$D/other.$dt"
			disk_end "other_$dt"
			same_file "$D/ckfs.$dt/model.safetensors" "$D/other.$dt/model.safetensors"
			rm -rf "$D/other.$dt"
		fi
		# The same export without a disk: its output on tmpfs.
		warm
		timed "ckfs_${dt}_shm" "$CKFS" export -q --dtype "$dt" "$CK" "$SHM/ckfs.$dt"
		same_file "$D/ckfs.$dt/model.safetensors" "$SHM/ckfs.$dt/model.safetensors"
		# The write bound: dd of the output's size into the same folder,
		# 8 MiB blocks, synced before it exits, as the export syncs.
		size=$(du -sb "$D/ckfs.$dt" | cut -f1)
		rec "out_${dt}_bytes" "$size"
		warm
		disk_start
		timed "dd_$dt" dd if=/dev/zero of="$D/dd.out" bs=8M count=$(((size + (8 << 20) - 1) >> 23)) conv=fsync
		disk_end "dd_$dt"
		rm -f "$D/dd.out"
		# The disk without the page cache: the same, O_DIRECT.
		warm
		disk_start
		timed "dddir_$dt" dd if=/dev/zero of="$D/dd.out" bs=8M count=$(((size + (8 << 20) - 1) >> 23)) oflag=direct conv=fsync
		disk_end "dddir_$dt"
		rm -f "$D/dd.out"
		# The same bytes (the export's output, in memory), in case the
		# disk under the VM makes zeroes cheap.
		warm
		disk_start
		timed "ddcp_$dt" dd if="$SHM/ckfs.$dt/model.safetensors" of="$D/dd.out" bs=8M conv=fsync
		disk_end "ddcp_$dt"
		rm -f "$D/dd.out"
		rm -rf "$SHM/ckfs.$dt"
		warm
		disk_start
		timed "z2f_$dt" $Z2F "$CK" "$D/z2f.$dt" --dtype "$dt"
		# ckfs export syncs its output before renaming it into place;
		# zero_to_fp32 leaves it in the page cache. Its time until durable:
		t=$(t_now)
		sync
		rec "z2f_${dt}_sync_s" "$(awk -v a="$(cut -d' ' -f1 "$D/time")" -v b="$(t_since "$t")" \
			'BEGIN { printf "%.2f", a + b }')"
		disk_end "z2f_$dt"
		same_file "$D/ckfs.$dt/model.safetensors" "$D/z2f.$dt/model.safetensors"
		rm -rf "$D/z2f.$dt"
	done
	# A fresh mount: ready (the safetensors header read), then the first
	# sequential read of the whole file; the daemon's peak RSS.
	warm
	t=$(t_now)
	"$CKFS" mount --log-level err --cache-size "$BENCH_MOUNT_CACHE" "$CK" "$MNT"
	head -c 8 "$MNT/model.safetensors" >/dev/null
	rec mount_ready_s "$(t_since "$t")"
	t2=$(t_now)
	cat "$MNT/model.safetensors" >/dev/null
	rec mount_read_s "$(t_since "$t2")"
	rec mount_total_s "$(t_since "$t")"
	stats=$("$CKFS" stats --json "$MNT")
	pid=$(echo "$stats" | sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
	rec mount_source_bytes "$(echo "$stats" | sed -n 's/.*"source_bytes_read":\([0-9]*\).*/\1/p')"
	rec mount_rss "$(awk '/^VmHWM:/ { printf "%.0f\n", $2 * 1024 }' "/proc/$pid/status")"
	same_file "$MNT/model.safetensors" "$D/ckfs.bf16/model.safetensors"
	"$CKFS" umount "$MNT"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
done

"$TORCH_PYTHON" - "$RESULTS" "$CK" "$UNCHANGED" "$RUNS" <<'EOF'
import os, statistics, sys
from collections import defaultdict
res, ck, unchanged, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
v = defaultdict(list)
for line in open(res):
    k, x = line.split()
    v[k].append(float(x))
m = {k: statistics.median(x) for k, x in v.items()}
size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(ck) for f in fs)
gib = lambda b: "%.2f GiB" % (b / 2**30) if b >= 2**30 else "%.0f MiB" % (b / 2**20)
print("checkpoint: %s, %s in all; medians of %s runs, files in the page cache; load average at the end %s"
      % (ck, gib(size), runs, " ".join(open("/proc/loadavg").read().split()[:3])))
print("zero_to_fp32 unchanged (--safe_serialization): %s" % unchanged)
print("bytes the mount's first read took from the checkpoint: %s (%.1f%% of it; the fp32 masters)"
      % (gib(m["mount_source_bytes"]), 100 * m["mount_source_bytes"] / size))
print()
print("| | ckfs | zero_to_fp32 | ckfs is | target |")
print("|---|---:|---:|---:|---|")
for dt in ("fp32", "bf16"):
    a, b = m["ckfs_%s_s" % dt], m["z2f_%s_s" % dt]
    print("| export %s, wall | %.2f s | %.2f s | %.1fx faster | 5x: %s |" % (dt, a, b, b / a, "met" if b / a >= 5 else "NOT met"))
    b = m["z2f_%s_sync_s" % dt]
    print("| export %s, wall, zero_to_fp32 + sync (both durable) | %.2f s | %.2f s | %.1fx faster | |" % (dt, a, b, b / a))
    a, b = m["ckfs_%s_cpu" % dt], m["z2f_%s_cpu" % dt]
    print("| export %s, CPU time (user + system) | %.2f s | %.2f s | %.1fx less | |" % (dt, a, b, b / a))
    a, b = m["ckfs_%s_rss" % dt], m["z2f_%s_rss" % dt]
    print("| export %s, peak RSS | %s | %s | 1/%.0f | 1/10: %s |" % (dt, gib(a), gib(b), b / a, "met" if b / a >= 10 else "NOT met"))
a, b = m["mount_total_s"], m["z2f_bf16_s"]
print("| mount + first read (bf16) vs export bf16, wall | %.2f s (ready %.2f s) | %.2f s | %.1fx faster | 5x: %s |"
      % (a, m["mount_ready_s"], b, b / a, "met" if b / a >= 5 else "NOT met"))
a, b = m["mount_rss"], m["z2f_bf16_rss"]
print("| mount daemon peak RSS (cache %s) | %s | %s | 1/%.0f | 1/10: %s |"
      % (os.environ.get("BENCH_MOUNT_CACHE", "1GiB"), gib(a), gib(b), b / a, "met" if b / a >= 10 else "NOT met"))
print()
print("Write bound: the same output size written to the same disk (dd bs=8M conv=fsync) and the")
print("export with its output on /dev/shm; disk columns are /proc/diskstats deltas of the whole disk")
print("during the command (z2f: until its sync returns), medians.")
print()
print("| %s | wall | CPU | written | disk writing | disk busy | ckfs export / this |" % "")
print("|---|---:|---:|---:|---:|---:|---:|")
for dt in ("fp32", "bf16"):
    c = m["ckfs_%s_s" % dt]
    def row(name, key, wall=None, disk=True):
        w = m[key + "_s"] if wall is None else wall
        d = ("| %.0f MiB | %.2f s | %.0f%% " % (m[key + "_wmib"], m[key + "_wms"] / 1e3,
                                               100 * m[key + "_busyms"] / 1e3 / w)) if disk else "| | | "
        print("| %s | %.2f s | %.2f s %s| %s |" % (name, w, m[key + "_cpu"], d,
              "" if key == "ckfs_" + dt else "%.2fx" % (c / w)))
    print("| **%s** (output %s) | | | | | | |" % (dt, gib(m["out_%s_bytes" % dt])))
    row("ckfs export", "ckfs_" + dt)
    if "other_%s_s" % dt in m:
        row("ckfs export, CKFS_OTHER", "other_" + dt)
    row("ckfs export to /dev/shm", "ckfs_%s_shm" % dt, disk=False)
    row("dd from /dev/zero", "dd_" + dt)
    row("dd from /dev/zero, oflag=direct", "dddir_" + dt)
    row("dd of the same bytes from /dev/shm", "ddcp_" + dt)
    row("zero_to_fp32 + sync", "z2f_" + dt, wall=m["z2f_%s_sync_s" % dt])
print()
for dt in ("fp32", "bf16"):
    c = m["ckfs_%s_s" % dt]
    print("%s: zero_to_fp32 / ckfs %.1fx (+ sync %.1fx); ckfs / dd %.2fx (/ dd direct %.2fx, / dd copy %.2fx); ckfs / ckfs to /dev/shm %.2fx"
          % (dt, m["z2f_%s_s" % dt] / c, m["z2f_%s_sync_s" % dt] / c, c / m["dd_%s_s" % dt],
             c / m["dddir_%s_s" % dt], c / m["ddcp_%s_s" % dt], c / m["ckfs_%s_shm_s" % dt]))
print()
print("every run: " + "; ".join("%s %s" % (k, " ".join("%g" % x for x in v[k])) for k in sorted(v)))
EOF
