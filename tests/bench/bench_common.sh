# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# Shared by bench_serving.sh, bench_cold.sh, bench_headline.sh, bench_gguf.sh,
# bench_part.sh and bench_ct_views.sh (sourced):
# the bench checkpoints of tests/bench/bench.sh (generated once into
# $BENCH_DIR/SHAPE/ckpt, exported once into $BENCH_DIR/SHAPE/export.ckfs)
# and small helpers. Needs ROOT; sets CKFS, PY, BENCH_DIR, RUNS, SIZES,
# BENCH_MOUNT_CACHE.
CKFS=${CKFS:-$ROOT/build/ckfs}
PY=${TORCH_PYTHON:-${CKFS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckfs}/venv/bin/python}
BENCH_DIR=${BENCH_DIR:-/tmp/ckfs-bench}
RUNS=${RUNS:-3}
SIZES=${BENCH_SIZES:-0.5b}
BENCH_MOUNT_CACHE=${BENCH_MOUNT_CACHE:-1GiB}
export HF_HUB_OFFLINE=1 CUDA_VISIBLE_DEVICES='' TRANSFORMERS_VERBOSITY=error
. "$ROOT/tests/bench/first_read.sh" # median, col_median

die() { echo "bench: $*" >&2; exit 1; }

# shape_dir SIZE: the checkpoint's folder (SHAPE/), generated and exported
# once; the 7b and 70b shapes (holes) have no use here.
shape_dir() {
	local shape d
	case $1 in
	0.5b) shape=qwen2.5-0.5b ;;
	1.5b) shape=qwen2.5-1.5b ;;
	*) die "size '$1': only 0.5b and 1.5b have real bytes" ;;
	esac
	d=$BENCH_DIR/$shape
	if [ ! -e "$d/ckpt/.bench-complete" ]; then
		echo "bench: generating $shape in $d/ckpt (once)" >&2
		mkdir -p "$d"
		rm -rf "$d/ckpt.tmp"
		nice -n 10 "$PY" "$ROOT/tests/gen/make_bench_checkpoint.py" "$d/ckpt.tmp" \
			--shape "$shape" >"$d/gen.log" 2>&1 || { cat "$d/gen.log" >&2; die "generating $shape failed"; }
		rm -rf "$d/ckpt" && mv "$d/ckpt.tmp" "$d/ckpt" && touch "$d/ckpt/.bench-complete"
	fi
	[ -e "$d/export.ckfs/model.safetensors" ] || "$CKFS" export -q "$d/ckpt" "$d/export.ckfs"
	echo "$d"
}

# awscli_install: the AWS CLI (pinned) in its own venv at $AWSCLI, once.
AWSCLI_VERSION=1.46.3
AWSCLI=${CKFS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckfs}/awscli-$AWSCLI_VERSION
awscli_build() { # TMP
	python3 -m venv "$1" && "$1/bin/python" -m pip install -q "awscli==$AWSCLI_VERSION"
}
awscli_install() { ckfs_cached "$AWSCLI" "awscli==$AWSCLI_VERSION" awscli_build; }

t_now() { echo "$EPOCHREALTIME"; }
t_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.4f", b - a }'; }
stats_field() { "$CKFS" stats --json "$1" | sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p"; }
hwm_mib() { awk '/^VmHWM:/ { printf "%.0f\n", $2 / 1024 }' "/proc/$1/status"; }
wait_gone() { local n=50; while [ $n -gt 0 ] && kill -0 "$1" 2>/dev/null; do sleep 0.1; n=$((n - 1)); done; }
# ratio A B: A / B to two decimals
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }'; }
load_now() { cut -d' ' -f1-3 /proc/loadavg; }
