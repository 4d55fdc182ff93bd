#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The GGUF view (--format gguf, docs/gguf.md) against the real pipeline it
# replaces, on bench.sh's fp32 actors (0.5b and/or 1.5b, world size 8,
# Qwen2-shaped, tied), interleaved, RUNS times each, medians:
#
#   1. q8_0: `ckfs export --format gguf --dtype q8_0`, and a fresh mount +
#      `cat model.gguf`, against the merge (`ckfs export` to the bf16 HF
#      folder: verl's merger writes the same bytes) + llama.cpp's
#      convert_hf_to_gguf.py --outtype q8_0; the two q8_0 files must be
#      identical (cmp, every run: the script stops otherwise);
#      q4_0: `ckfs export --format gguf --dtype q4_0` against merge +
#      convert --outtype bf16 + llama.cpp's own quantizer (llama_model_quantize
#      of the llama-cpp-python runtime venv, LLAMA_FTYPE_MOSTLY_Q4_0, default
#      params: what `llama-quantize IN OUT Q4_0` does); the files differ by
#      design (llama.cpp picks other types for some tensors), so sizes and
#      tensor types are printed.
#      Wall, CPU (user + sys) and peak RSS from /usr/bin/time; for a mount,
#      the daemon's CPU (/proc/PID/stat) and VmHWM plus cat's.
#   2. the first read of a fresh mount's model.gguf per --dtype (bf16, fp16,
#      q8_0, q4_0): wall, the daemon's CPU seconds and MB of fp32 input per
#      daemon CPU-second.
#
# The actors' huggingface/ folder has config.json only; the converter needs a
# tokenizer, so each runs on a copy ($BENCH_DIR/gguf-SHAPE/ckpt: rank files
# hardlinked) whose huggingface/ also holds the real Qwen2 byte-level BPE
# tokenizer (tests/fixtures/gguf_bpe/: tokenizer.json and its
# tokenizer_config.json; 151936 ids, the actors' vocab_size), which both
# name `qwen2` by the hash of its ids. Figures only, no assertions on speed.
#
#   tests/bench/bench_gguf.sh [CKFS]
#     env: RUNS (3), BENCH_SIZES ("0.5b"; "0.5b 1.5b" for both), BENCH_DIR,
#          GGUF_VENV (~/.cache/ckfs/gguf-venv), GGUF_RUNTIME_VENV
#          (~/.cache/ckfs/gguf-runtime-venv: tests/gguf/setup-gguf-venv.sh --runtime)
# Disk: up to about 2x the bf16 model at once (1.5b: ~7 GB), deleted as it goes.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CKFS=${1:-${CKFS:-$ROOT/build/ckfs}}
. "$ROOT/tests/bench/bench_common.sh" # CKFS PY BENCH_DIR RUNS SIZES, median, ratio, hwm_mib
CACHE=${CKFS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckfs}
GVENV=${GGUF_VENV:-$CACHE/gguf-venv}
RTVENV=${GGUF_RUNTIME_VENV:-$CACHE/gguf-runtime-venv}
CONVERT=$GVENV/llama.cpp/convert_hf_to_gguf.py
TOK=$ROOT/tests/fixtures/gguf_bpe/qwen2
NAME=bench
[ -x "$CKFS" ] || die "no ckfs binary at $CKFS"
[ -f "$CONVERT" ] || die "no converter ($CONVERT): run tests/gguf/setup-gguf-venv.sh"
"$RTVENV/bin/python" -c 'import llama_cpp' 2>/dev/null ||
	die "no llama-cpp-python in $RTVENV: run tests/gguf/setup-gguf-venv.sh --runtime"
CLK=$(getconf CLK_TCK)

# gguf_src SIZE: a copy of the bench actor with the real Qwen2 tokenizer
gguf_src() {
	local base shape g f
	shape=qwen2.5-$1
	base=$BENCH_DIR/$shape
	# generated once by bench.sh (shape_dir also exports it: not needed here)
	[ -e "$base/ckpt/.bench-complete" ] || base=$(shape_dir "$1")
	g=$BENCH_DIR/gguf-$shape
	if [ ! -e "$g/ckpt/.gguf-bpe-complete" ]; then
		rm -rf "$g/ckpt" && mkdir -p "$g/ckpt/huggingface"
		for f in "$base/ckpt"/*; do
			if [ -f "$f" ]; then ln "$f" "$g/ckpt/" 2>/dev/null || cp "$f" "$g/ckpt/"; fi
		done
		cp "$base/ckpt/huggingface"/* "$g/ckpt/huggingface/"
		gzip -dc "$TOK.tokenizer.json.gz" >"$g/ckpt/huggingface/tokenizer.json"
		cp "$TOK.tokenizer_config.json" "$g/ckpt/huggingface/tokenizer_config.json"
		touch "$g/ckpt/.gguf-bpe-complete"
	fi
	echo "$g"
}

# timed OUTFILE CMD...: appends "wall_s cpu_s peak_rss_mb" of CMD to OUTFILE
timed() {
	local out=$1 tf
	shift
	tf=$(mktemp)
	/usr/bin/time -f '%e %U %S %M' -o "$tf" "$@" >/dev/null 2>"$tf.err" || {
		cat "$tf.err" >&2
		die "failed: $*"
	}
	awk '{ printf "%s %.2f %.0f\n", $1, $2 + $3, $4 / 1024 }' "$tf" >>"$out"
	rm -f "$tf" "$tf.err"
}

# mount_read SRC MNT OUT DTYPE [COPY_TO]: a fresh mount, `cat model.gguf`
# (into COPY_TO if given, else /dev/null); appends "wall_s daemon_cpu_s
# daemon_hwm_mb cat_cpu_s" (wall: mount + cat)
mount_read() {
	local src=$1 mnt=$2 out=$3 dtype=$4 dst=${5:-/dev/null} t0 pid wall ticks hwm tf
	tf=$(mktemp)
	t0=$(t_now)
	"$CKFS" mount --format gguf --dtype "$dtype" --model-name "$NAME" "$src" "$mnt" 2>/dev/null
	pid=$(stats_field "$mnt" pid)
	/usr/bin/time -f '%U %S' -o "$tf" cat "$mnt/model.gguf" >"$dst"
	wall=$(t_since "$t0")
	ticks=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
	hwm=$(hwm_mib "$pid")
	"$CKFS" umount "$mnt"
	wait_gone "$pid"
	echo "$wall $(awk -v t="$ticks" -v c="$CLK" 'BEGIN { printf "%.2f", t / c }') $hwm $(awk '{ printf "%.2f", $1 + $2 }' "$tf")" >>"$out"
	rm -f "$tf"
}

# types FILE: tensor types of a GGUF, "TYPE xCOUNT ..." and the names of the
# tensors not of the majority 2-D type
types() {
	PYTHONPATH=$GVENV/llama.cpp/gguf-py "$GVENV/bin/python" - "$1" <<'PYEOF'
import sys, collections
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
c = collections.Counter(t.tensor_type.name for t in r.tensors)
print(" ".join(f"{k} x{v}" for k, v in sorted(c.items())), end="")
odd = [f"{t.name}={t.tensor_type.name}" for t in r.tensors
       if len(t.shape) > 1 and t.tensor_type.name not in ("Q4_0",)]
print("; 2-D not Q4_0: " + (", ".join(odd) or "none"))
PYEOF
}

# llama.cpp's llama_model_quantize, as `llama-quantize IN OUT Q4_0` (argv: IN OUT)
QUANT_PY='
import ctypes, sys
import llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)) != 0)
'

med() { col_median "$1" "$2"; }
fsize_mb() { awk -v b="$(stat -c %s "$1")" 'BEGIN { printf "%.0f", b / 1e6 }'; }

echo "bench_gguf: $CKFS, RUNS=$RUNS, sizes: $SIZES; load at start $(load_now)"
for size in $SIZES; do
	g=$(gguf_src "$size")
	src=$g/ckpt
	res=$g/res
	mnt=$g/mnt
	work=$g/work
	mkdir -p "$mnt"
	rm -rf "$res" "$work" && mkdir -p "$res" "$work"
	cat "$src"/model_world_size_*_rank_*.pt >/dev/null # sources in the page cache
	in_bytes=$(cat "$src"/model_world_size_*_rank_*.pt | wc -c)
	loads=()
	for i in $(seq "$RUNS"); do
		echo "bench_gguf: $size run $i/$RUNS (load $(load_now))" >&2
		loads+=("$(load_now)")
		# 1. q8_0
		timed "$res/ckfs-q8_0" "$CKFS" export -q --format gguf --dtype q8_0 --model-name "$NAME" "$src" "$work/ckfs-q8"
		rm -rf "$work/hf"
		timed "$res/merge" "$CKFS" export -q "$src" "$work/hf"
		timed "$res/conv-q8_0" "$GVENV/bin/python" "$CONVERT" "$work/hf" --outtype q8_0 \
			--outfile "$work/conv-q8_0.gguf" --model-name "$NAME"
		cmp "$work/ckfs-q8/model.gguf" "$work/conv-q8_0.gguf" ||
			die "$size run $i: ckfs's q8_0 differs from the converter's"
		echo "identical" >>"$res/cmp"
		q8_ckfs_mb=$(fsize_mb "$work/ckfs-q8/model.gguf")
		rm -rf "$work/ckfs-q8" "$work/conv-q8_0.gguf"
		# q4_0: ckfs against convert bf16 + llama.cpp's quantizer
		timed "$res/conv-bf16" "$GVENV/bin/python" "$CONVERT" "$work/hf" --outtype bf16 \
			--outfile "$work/conv-bf16.gguf" --model-name "$NAME"
		rm -rf "$work/hf"
		timed "$res/quant-q4_0" "$RTVENV/bin/python" -c "$QUANT_PY" "$work/conv-bf16.gguf" "$work/llama-q4_0.gguf"
		rm -f "$work/conv-bf16.gguf"
		timed "$res/ckfs-q4_0" "$CKFS" export -q --format gguf --dtype q4_0 --model-name "$NAME" "$src" "$work/ckfs-q4"
		if [ "$i" = 1 ]; then
			q4_llama_mb=$(fsize_mb "$work/llama-q4_0.gguf")
			q4_ckfs_mb=$(fsize_mb "$work/ckfs-q4/model.gguf")
			q4_llama_types=$(types "$work/llama-q4_0.gguf")
			q4_ckfs_types=$(types "$work/ckfs-q4/model.gguf")
		fi
		rm -rf "$work/ckfs-q4" "$work/llama-q4_0.gguf"
		# 2. first reads through fresh mounts (q8_0 is also 1's mount figure)
		for d in bf16 fp16 q8_0 q4_0; do
			mount_read "$src" "$mnt" "$res/read-$d" "$d"
		done
	done
	rmdir "$work" 2>/dev/null || true

	in_mb=$(awk -v b="$in_bytes" 'BEGIN { printf "%.0f", b / 1e6 }')
	sum() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a + b }'; }
	# per-run sums of merge + convert (+ convert bf16 + quantize), then medians
	paste -d' ' "$res/merge" "$res/conv-q8_0" | awk '{ printf "%.2f %.2f %d\n", $1 + $4, $2 + $5, ($3 > $6) ? $3 : $6 }' >"$res/pipe-q8_0"
	paste -d' ' "$res/merge" "$res/conv-bf16" "$res/quant-q4_0" |
		awk '{ printf "%.2f %.2f %d\n", $1 + $4 + $7, $2 + $5 + $8, ($3 > $6) ? (($3 > $9) ? $3 : $9) : (($6 > $9) ? $6 : $9) }' >"$res/pipe-q4_0"
	awk '{ printf "%.2f %.2f %d\n", $1, $2 + $4, $3 }' "$res/read-q8_0" >"$res/mount-q8_0"

	echo
	# medians per column (a pipeline's are of its per-run sums)
	printf 'GGUF %s (%s MB fp32 in %s rank files; %s runs each, interleaved; medians; load per run: %s)\n' \
		"$size" "$in_mb" "$(find "$src" -maxdepth 1 -name 'model_world_size_*_rank_*.pt' | wc -l)" "$RUNS" "$(printf '[%s] ' "${loads[@]}")"
	printf '  %-52s %9s %9s %10s\n' "q8_0 ($q8_ckfs_mb MB, cmp identical $(wc -l <"$res/cmp")/$RUNS)" "wall s" "CPU s" "peak MB"
	row() { printf '  %-52s %9s %9s %10s\n' "$1" "$(med 1 "$2")" "$(med 2 "$2")" "$(med 3 "$2")"; }
	row "ckfs export --format gguf --dtype q8_0" "$res/ckfs-q8_0"
	row "ckfs mount + cat model.gguf (daemon + cat CPU)" "$res/mount-q8_0"
	row "merge: ckfs export (bf16 HF folder)" "$res/merge"
	row "convert_hf_to_gguf.py --outtype q8_0" "$res/conv-q8_0"
	row "merge + convert" "$res/pipe-q8_0"
	printf '  pipeline / ckfs export: %sx wall, %sx CPU; pipeline / mount: %sx wall, %sx CPU\n' \
		"$(ratio "$(med 1 "$res/pipe-q8_0")" "$(med 1 "$res/ckfs-q8_0")")" \
		"$(ratio "$(med 2 "$res/pipe-q8_0")" "$(med 2 "$res/ckfs-q8_0")")" \
		"$(ratio "$(med 1 "$res/pipe-q8_0")" "$(med 1 "$res/mount-q8_0")")" \
		"$(ratio "$(med 2 "$res/pipe-q8_0")" "$(med 2 "$res/mount-q8_0")")"
	printf '  %-52s %9s %9s %10s\n' "q4_0 (ckfs $q4_ckfs_mb MB, llama.cpp $q4_llama_mb MB)" "wall s" "CPU s" "peak MB"
	row "ckfs export --format gguf --dtype q4_0" "$res/ckfs-q4_0"
	row "convert_hf_to_gguf.py --outtype bf16" "$res/conv-bf16"
	row "llama_model_quantize (Q4_0)" "$res/quant-q4_0"
	row "merge + convert bf16 + quantize" "$res/pipe-q4_0"
	printf '  pipeline / ckfs export: %sx wall, %sx CPU\n' \
		"$(ratio "$(med 1 "$res/pipe-q4_0")" "$(med 1 "$res/ckfs-q4_0")")" \
		"$(ratio "$(med 2 "$res/pipe-q4_0")" "$(med 2 "$res/ckfs-q4_0")")"
	echo "  tensor types, llama.cpp: $q4_llama_types"
	echo "  tensor types, ckfs:      $q4_ckfs_types"
	printf '  %-52s %9s %9s %10s %14s\n' "first read of model.gguf (fresh mount)" "wall s" "daemon CPU" "daemon MB" "fp32 MB/CPU-s"
	for d in bf16 fp16 q8_0 q4_0; do
		printf '  %-52s %9.2f %9s %10s %14s\n' "--dtype $d" "$(med 1 "$res/read-$d")" "$(med 2 "$res/read-$d")" \
			"$(med 3 "$res/read-$d")" "$(awk -v m="$in_mb" '{ if ($2 > 0) printf "%.0f\n", m / $2 }' "$res/read-$d" | median)"
	done
done
echo "bench_gguf: load at end $(load_now)"
