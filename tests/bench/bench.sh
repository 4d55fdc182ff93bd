#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The ckfs benchmark (not a test; no figure here is ever asserted): one
# command that measures ckfs side by side with verl's merger and with the
# FUSE transport ceiling of this machine, all in the same run, and prints
# one table of medians, ratios and targets (docs/benchmarks.md explains
# every figure).
#
#   tests/bench/bench.sh
#
# Environment:
#   BENCH_DIR    where checkpoints, exports and mount points live (default
#                /tmp/ckfs-bench); checkpoints are generated there once, by
#                tests/gen/make_bench_checkpoint.py, and reused
#   RUNS         runs of every measurement (default 3); medians are printed
#   BENCH_SIZES  which checkpoints (default "0.5b 1.5b 7b 70b"): 0.5b and
#                1.5b get every measurement, 7b and 70b (tensor bytes left as
#                holes) mount-to-ready and `ckfs inspect` only
#   BENCH_MOUNT_CACHE   the mounts' --cache-size (default 1GiB)
#   BENCH_MD     also write the table as markdown to this file
#   BENCH_ONLY   a subset of the measurements, e.g. "read" while working
#                on the read path: export (1), ready (2, with inspect), read
#                (3), safe_open (4), from_pretrained (5); 6 comes with 3-5;
#                and the figures of separate scripts, each printing its own
#                medians and ratios after the table (0.5b and 1.5b only):
#                serving (bench_serving.sh), cold (bench_cold.sh), headline
#                (bench_headline.sh, needs BENCH_VERL=1), preload
#                (bench_preload.sh: first loads with -o preload), lora
#                (bench_lora.sh), fp8 (bench_fp8.sh, 0.5b), w4a16 and nvfp4 (bench_ct_views.sh, 0.5b), clients
#                (bench_clients.sh: vLLM CPU, the Run:ai streamer and
#                fastsafetensors, in the client tier's venvs), run
#                (bench_run.sh: 10- and 100-step hole-backed runs) and moe
#                (bench_moe.sh: a 235B-shaped MoE actor at world size 64,
#                hole-backed, 10 GB on disk, 9 minutes to generate once),
#                s3 (bench_s3.sh: the 0.5b actor in a SeaweedFS on loopback),
#                gguf (bench_gguf.sh: --format gguf against merge +
#                convert_hf_to_gguf.py (+ llama.cpp's quantizer), and first
#                reads per --dtype; needs tests/gguf/setup-gguf-venv.sh
#                --runtime; 1.5b: about 7 minutes a run), memory
#                (bench_memory.sh: RssAnon and throughput under random,
#                strided and sequential readers at 64 MiB to 1 GiB caches)
#                (default: all)
#   BENCH_VERL   0 skips verl's merger (it needs about 1.5x the fp32
#                checkpoint in RAM: over 9 GB for 1.5b)
#   BUILD_DIR    CMake build directory (default build); it is configured
#                and built first (incremental), ckfs and ckfs_bench_ceiling
#   BENCH_BUILD  0 uses the binaries already in BUILD_DIR without building
#   TORCH_PYTHON a python with torch, transformers, safetensors and verl
#                (default: the pinned venv of tests/setup-venv.sh)
# Run as root to also measure read_ahead_kb = 1024 on the mounts' bdi.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH_DIR=${BENCH_DIR:-/tmp/ckfs-bench}
RUNS=${RUNS:-3}
BENCH_SIZES=${BENCH_SIZES:-0.5b 1.5b 7b 70b}
BENCH_MOUNT_CACHE=${BENCH_MOUNT_CACHE:-1GiB}
BENCH_VERL=${BENCH_VERL:-1}
BENCH_ONLY=${BENCH_ONLY:-export ready read safe_open from_pretrained serving cold headline preload lora fp8 w4a16 clients run moe s3 gguf memory}
BENCH_ONLY=${BENCH_ONLY//,/ }
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
case $BUILD_DIR in /*) ;; *) BUILD_DIR=$ROOT/$BUILD_DIR ;; esac
IS_ROOT=0
[ "$(id -u)" = 0 ] && IS_ROOT=1

say() { echo "bench: $*" >&2; }
die() { echo "bench: $*" >&2; exit 1; }

# ---- build and environment ----

CKFS=$BUILD_DIR/ckfs
CEIL=$BUILD_DIR/ckfs_bench_ceiling
CONV=$BUILD_DIR/ckfs_bench_convert
if [ "${BENCH_BUILD:-1}" != 0 ]; then
	say "building ckfs and ckfs_bench_ceiling in $BUILD_DIR"
	cmake -S "$ROOT" -B "$BUILD_DIR" >/dev/null
	cmake --build "$BUILD_DIR" -j2 --target ckfs ckfs_bench_ceiling ckfs_bench_convert >/dev/null ||
		die "the build failed (BENCH_BUILD=0 runs the binaries already built)"
fi
for b in "$CKFS" "$CEIL" "$CONV"; do
	[ -x "$b" ] || die "no $b (build it, or unset BENCH_BUILD)"
done
if [ -z "${TORCH_PYTHON:-}" ]; then
	TORCH_PYTHON=$("$ROOT/tests/setup-venv.sh" --print-path)/bin/python
fi
[ -x "$TORCH_PYTHON" ] || die "no python at $TORCH_PYTHON"
READERS=$ROOT/tests/bench/bench_readers.py
export HF_HUB_OFFLINE=1 CUDA_VISIBLE_DEVICES='' TRANSFORMERS_VERBOSITY=error

mkdir -p "$BENCH_DIR"
MNT=$BENCH_DIR/mnt        # ckfs mounts
CMNT=$BENCH_DIR/mnt-ceil  # the ceiling's mounts
mkdir -p "$MNT" "$CMNT"
RESULTS=$BENCH_DIR/results.txt
: >"$RESULTS"

cleanup() {
	if mountpoint -q "$MNT"; then "$CKFS" umount -z "$MNT" || true; fi
	if mountpoint -q "$CMNT"; then umount -l "$CMNT" || fusermount3 -uz "$CMNT" || true; fi
}
trap cleanup EXIT
cleanup

# ---- helpers ----

t_now() { echo "$EPOCHREALTIME"; }
t_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.4f", b - a }'; }
rec() { echo "$SIZE $1 $2" >>"$RESULTS"; } # KEY VALUE, one run's figure
meta() { echo "$SIZE meta:$1 $2" >>"$RESULTS"; }

# The safetensors header (8-byte length, then JSON) of FILE, read in full.
read_header() {
	local n
	n=$(od -An -tu8 -N8 "$1" | tr -d ' ')
	if [ -z "$n" ] || [ "$n" -le 0 ]; then die "$1: no safetensors header"; fi
	head -c $((8 + n)) "$1" >/dev/null
}

stat_field() { "$CKFS" stats --json "$MNT" | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"; }
hwm_bytes() { awk '/^VmHWM:/ { printf "%.0f\n", $2 * 1024 }' "/proc/$1/status"; }

wait_gone() { # PID: the daemon exits after its unmount; do not overlap runs
	local tries=50
	while [ $tries -gt 0 ] && kill -0 "$1" 2>/dev/null; do
		sleep 0.1
		tries=$((tries - 1))
	done
}

# ckfs mount of $CK at $MNT (timed by the callers: nothing else in here).
ckfs_mount() { "$CKFS" mount --log-level err --cache-size "$BENCH_MOUNT_CACHE" "$@" "$CK" "$MNT"; }
ckfs_umount() { # records the daemon's peak RSS first (measurement 6)
	local pid
	pid=$(stat_field pid)
	[ -n "${BUDGET:-}" ] || { BUDGET=$(stat_field budget); echo "all meta:budget $BUDGET" >>"$RESULTS"; }
	[ "${1:-}" = nohwm ] || rec daemon_hwm "$(hwm_bytes "$pid")"
	"$CKFS" umount "$MNT"
	wait_gone "$pid"
}
# The ceiling serves the exported folder (the bytes ckfs serves) from
# memory. As root, ckfs mounts raise their read_ahead_kb to 1024 (its
# kernel_readahead default); the ceiling gets the same, or KB if given.
ceil_mount() { # [KB]
	"$CEIL" --pid-file "$BENCH_DIR/ceil.pid" "$D/export.ckfs" "$CMNT"
	CPID=$(cat "$BENCH_DIR/ceil.pid")
	if [ "$IS_ROOT" = 1 ]; then set_ra "$CMNT" "${1:-1024}"; fi
}
ceil_umount() { umount "$CMNT" 2>/dev/null || fusermount3 -u "$CMNT"; wait_gone "$CPID"; }

# read_ahead_kb of the bdi of MOUNTPOINT (root only; it goes with the mount).
set_ra() { echo "$2" >"/sys/class/bdi/$(stat -c '%Hd:%Ld' "$1")/read_ahead_kb"; }

# CPU time used on the whole machine so far, in seconds (/proc/stat: all
# but idle and iowait), to show whether a read was bound by the CPUs.
busy_s() { awk '/^cpu / { printf "%.2f\n", ($2 + $3 + $4 + $7 + $8 + $9) / 100 }' /proc/stat; }

timed_cat() { # KEY FILE...: also KEY's busy CPU-seconds as KEY_cpu
	local t b key=$1
	shift
	b=$(busy_s)
	t=$(t_now)
	cat "$@" >/dev/null
	rec "$key" "$(t_since "$t")"
	rec "${key%_s}_cpu" "$(awk -v a="$b" -v b="$(busy_s)" 'BEGIN { printf "%.2f", b - a }')"
}

reader() { # KEY MODE DIR: one fresh python process; checks tensor count and bytes
	local line
	line=$("$TORCH_PYTHON" "$READERS" "$2" "$3" 2>"$D/log.$2") ||
		{ cat "$D/log.$2" >&2; die "$2 of $3 failed"; }
	rec "$1" "${line%% *}"
	if [ -n "${READER_SEEN[$2]:-}" ] && [ "${READER_SEEN[$2]}" != "${line#* }" ]; then
		die "$2: $3 gave tensors/bytes ${line#* }, another copy gave ${READER_SEEN[$2]}"
	fi
	READER_SEEN[$2]=${line#* }
}

warm() { cat "$@" >/dev/null; } # into the page cache
only() { [[ " $BENCH_ONLY " == *" $1 "* ]]; }

# ---- checkpoints ----

shape_of() {
	case $1 in
	0.5b) echo qwen2.5-0.5b ;;
	1.5b) echo qwen2.5-1.5b ;;
	7b) echo qwen2.5-7b ;;
	70b) echo llama3-70b ;;
	*) die "unknown size '$1' in BENCH_SIZES (0.5b 1.5b 7b 70b)" ;;
	esac
}

generate() { # SHAPE DIR: once; a finished checkpoint carries .bench-complete
	[ -e "$2/.bench-complete" ] && return 0
	say "generating $1 in $2 (once; reused by later runs)"
	rm -rf "$2.tmp"
	local t
	t=$(t_now)
	nice -n 10 "$TORCH_PYTHON" "$ROOT/tests/gen/make_bench_checkpoint.py" "$2.tmp" \
		--shape "$1" >"$BENCH_DIR/gen-$1.log" 2>&1 ||
		{ cat "$BENCH_DIR/gen-$1.log" >&2; die "generating $1 failed"; }
	say "generated $1 in $(t_since "$t") s"
	rm -rf "$2"
	mv "$2.tmp" "$2"
	touch "$2/.bench-complete"
}

# ---- measurements ----

# 1. ckfs export vs verl's merger: wall time and peak RSS (/usr/bin/time).
bench_export() {
	local out=$D/export
	warm "$CK"/model_world_size_*_rank_*.pt
	rm -rf "$out.ckfs"
	/usr/bin/time -f "%e %M" -o "$D/time.ckfs" "$CKFS" export -q "$CK" "$out.ckfs" \
		>"$D/log.ckfs" 2>&1 || { cat "$D/log.ckfs" >&2; die "ckfs export failed"; }
	rec export_ckfs_s "$(cut -d' ' -f1 "$D/time.ckfs")"
	rec export_ckfs_rss "$(($(cut -d' ' -f2 "$D/time.ckfs") * 1024))"
	[ "$BENCH_VERL" = 1 ] || return 0
	rm -rf "$out.verl"
	(cd "$D" && /usr/bin/time -f "%e %M" -o "$D/time.verl" "$TORCH_PYTHON" -m verl.model_merger \
		merge --backend fsdp --local_dir "$CK" --target_dir "$out.verl" >"$D/log.verl" 2>&1) ||
		{ cat "$D/log.verl" >&2; die "verl's merger failed"; }
	rec export_verl_s "$(cut -d' ' -f1 "$D/time.verl")"
	rec export_verl_rss "$(($(cut -d' ' -f2 "$D/time.verl") * 1024))"
	# ckfs export syncs its output before renaming it into place; verl's
	# merger leaves it in the page cache. Its time until durable, too:
	local t
	t=$(t_now)
	sync
	rec export_verl_sync_s "$(awk -v v="$(cut -d' ' -f1 "$D/time.verl")" -v s="$(t_since "$t")" \
		'BEGIN { printf "%.2f", v + s }')"
	cmp -s "$out.ckfs/model.safetensors" "$out.verl/model.safetensors" ||
		die "$SIZE: ckfs export and verl's merger wrote different model.safetensors"
	rm -rf "$out.verl"
}

# 2. Mount to ready: from `ckfs mount` until the safetensors header has been
# read (the mount stays for the first read of measurement 3).
bench_ready() {
	local t
	t=$(t_now)
	ckfs_mount
	read_header "$MNT/model.safetensors"
	rec ready_s "$(t_since "$t")"
}

bench_inspect() {
	local t
	t=$(t_now)
	"$CKFS" inspect "$CK" >/dev/null 2>"$D/log.inspect" ||
		{ cat "$D/log.inspect" >&2; die "ckfs inspect failed"; }
	rec inspect_s "$(t_since "$t")"
}

# 3. First sequential read through a fresh mount (daemon cache cold, rank
# files in the page cache) vs the ceiling, read the same way; second reads;
# cat of the rank files; as root, both again at the kernel's default
# read_ahead_kb of 128 (ckfs -o kernel_readahead=0) instead of 1024.
bench_read() {
	warm "$CK"/model_world_size_*_rank_*.pt
	timed_cat src_cat_s "$CK"/model_world_size_*_rank_*.pt
	bench_ready # a fresh mount: the header (tens of KB) is all it has served
	timed_cat ckfs_cat1_s "$MNT/model.safetensors"
	timed_cat ckfs_cat2_s "$MNT/model.safetensors"
	ckfs_umount

	ceil_mount
	timed_cat ceil_cat1_s "$CMNT/model.safetensors"
	timed_cat ceil_cat2_s "$CMNT/model.safetensors"
	ceil_umount

	# The conversion floor: CPU time to turn the rank files into bf16 with
	# ckfs's own loop and nothing else (tests/bench/convert_floor.c).
	rec convert_floor_cpu "$("$CONV" "$CK"/model_world_size_*_rank_*.pt | cut -d' ' -f1)"
	# The same from mapped windows (MAP_POPULATE), what ckfs did before.
	rec convert_floor_mmap_cpu "$("$CONV" --mmap "$CK"/model_world_size_*_rank_*.pt | cut -d' ' -f1)"

	[ "$IS_ROOT" = 1 ] || return 0
	warm "$CK"/model_world_size_*_rank_*.pt
	ckfs_mount -o kernel_readahead=0
	timed_cat ckfs_cat1_ra128_s "$MNT/model.safetensors"
	ckfs_umount
	ceil_mount 128
	timed_cat ceil_cat1_ra128_s "$CMNT/model.safetensors"
	ceil_umount
}

# 4 and 5. A fresh mount per run (first load; then a second load on the same
# mount, from the page cache) vs the exported copy, itself in the page cache,
# and vs the ceiling serving the exported copy (a fresh mount: its first
# load is the FUSE transport's share of the mount's).
bench_loader() { # MODE PREFIX
	warm "$CK"/model_world_size_*_rank_*.pt
	ckfs_mount
	reader "$2_mount_s" "$1" "$MNT"
	reader "$2_mount2_s" "$1" "$MNT"
	ckfs_umount
	warm "$D/export.ckfs/model.safetensors"
	reader "$2_export_s" "$1" "$D/export.ckfs"
	ceil_mount
	reader "$2_ceil_s" "$1" "$CMNT"
	ceil_umount
}

declare -A READER_SEEN
for S in $BENCH_SIZES; do
	SIZE=$S
	SHAPE=$(shape_of "$S")
	D=$BENCH_DIR/$SHAPE
	CK=$D/ckpt
	mkdir -p "$D"
	generate "$SHAPE" "$CK"
	meta src_bytes "$(stat -c %s "$CK"/model_world_size_*_rank_*.pt | awk '{ s += $1 } END { printf "%.0f\n", s }')"
	meta src_disk "$(du -sB1 "$CK" | cut -f1)"
	meta shape "$SHAPE"
	meta world "$(find "$CK" -maxdepth 1 -name 'model_world_size_*_rank_*.pt' | wc -l)"
	READER_SEEN=()
	for run in $(seq "$RUNS"); do
		say "$SHAPE: run $run/$RUNS"
		case $S in
		7b | 70b)
			only ready || continue
			bench_inspect
			bench_ready
			[ "$run" = 1 ] && meta out_bytes "$(stat -c %s "$MNT/model.safetensors")"
			ckfs_umount nohwm
			;;
		*)
			# The exported copy is also what 4 and 5 compare with.
			if only export; then
				bench_export
			elif [ ! -e "$D/export.ckfs/model.safetensors" ]; then
				"$CKFS" export -q "$CK" "$D/export.ckfs" 2>/dev/null
			fi
			OUT_BYTES=$(stat -c %s "$D/export.ckfs/model.safetensors")
			[ "$run" = 1 ] && meta out_bytes "$OUT_BYTES"
			if only ready; then
				bench_inspect
				only read || { bench_ready; ckfs_umount nohwm; }
			fi
			if only read; then bench_read; fi
			if only safe_open; then bench_loader safe_open st; fi
			if only from_pretrained; then bench_loader from_pretrained hf; fi
			;;
		esac
	done
done
SIZE=all
meta env "ckfs $("$CKFS" --version | head -1 | cut -d' ' -f2), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB RAM", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r), libfuse $(pkg-config --modversion fuse3 2>/dev/null || echo '?'), root=$IS_ROOT, cache $BENCH_MOUNT_CACHE, $RUNS runs"

"$TORCH_PYTHON" "$ROOT/tests/bench/bench_report.py" "$RESULTS" ${BENCH_MD:+--markdown "$BENCH_MD"}

# The figures of separate scripts (each prints its own medians and ratios),
# on the sizes with real bytes, with this run's settings.
REAL_SIZES=$(for s in $BENCH_SIZES; do case $s in 0.5b | 1.5b) echo "$s" ;; esac; done | xargs)
export CKFS BENCH_DIR RUNS BENCH_MOUNT_CACHE TORCH_PYTHON BENCH_SIZES=$REAL_SIZES PY=$TORCH_PYTHON
if [ -n "$REAL_SIZES" ]; then
	only serving && { echo; "$ROOT/tests/bench/bench_serving.sh"; }
	only cold && { echo; "$ROOT/tests/bench/bench_cold.sh"; }
	only headline && [ "$BENCH_VERL" = 1 ] && { echo; "$ROOT/tests/bench/bench_headline.sh"; }
	only preload && { echo; "$ROOT/tests/bench/bench_preload.sh"; }
	only lora && { echo; "$ROOT/tests/bench/bench_lora.sh" "$CKFS"; }
	only fp8 && { echo; "$ROOT/tests/bench/bench_fp8.sh" "$CKFS"; }
	only w4a16 && { echo; "$ROOT/tests/bench/bench_ct_views.sh" "$CKFS"; }
	only clients && { echo; "$ROOT/tests/bench/bench_clients.sh" "$CKFS"; }
	only gguf && { echo; "$ROOT/tests/bench/bench_gguf.sh" "$CKFS"; }
	only memory && { echo; "$ROOT/tests/bench/bench_memory.sh" "$CKFS"; }
fi
# Hole-backed checkpoints of their own, any size: a training run as one
# mount, and the 235B MoE metadata figures.
only run && { echo; BENCH_MOUNT_CACHE=256MiB "$ROOT/tests/bench/bench_run.sh" "$CKFS"; }
only moe && { echo; "$ROOT/tests/bench/bench_moe.sh" "$CKFS"; echo;
	MOE_SHAPE=deepseek-v3-671b "$ROOT/tests/bench/bench_moe.sh" "$CKFS"; }
only s3 && { echo; "$ROOT/tests/bench/bench_s3.sh" "$CKFS"; }
true
