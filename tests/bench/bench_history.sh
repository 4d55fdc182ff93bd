#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A training run as a history (issue #26). Not a test: no figure is
# asserted; medians of RUNS and ratios are printed. The runs are written
# once by tests/gen/make_history_fixtures.py --bench (verl's engine and
# checkpoint manager on the CPU; Qwen2-shaped, hidden 512, 4 layers, vocab
# 16000: 28 M parameters, 112 MB of fp32 rank files a step):
#
#   lora   10 steps of a verl LoRA actor (the base frozen)
#   plain  3 steps of a run where every parameter trains (worst case)
#
# 1. export   the 10 LoRA steps exported one after another, each --since
#             the previous, against 10 full exports: bytes written (the
#             summary's), disk used by the 10 folders (du, each inode
#             once), wall time
# 2. serving  four LoRA steps read at once by four O_DIRECT readers
#             (1 MiB requests), each its step's model.safetensors twice,
#             share_slices on and off, cache CACHE: the most the cache
#             held (sampled), hit rate, source bytes read, wall time
# 3. hashing  the plain run's three steps read with cat, share_slices on
#             and off: wall time and the daemon's CPU seconds (the hash's
#             cost where nothing is shared)
# 4. diff     `ckfs diff` of two plain steps against tests/bench/
#             diff_torch.py (torch loads both and compares): time, peak RSS
#
#   tests/bench/bench_history.sh [PATH/TO/ckfs]
#
# Environment: BENCH_DIR (default /tmp/ckfs-bench), RUNS (default 3),
# CACHE (default 128MiB), TORCH_PYTHON (default: the pinned venv),
# BENCH_ONLY (a comma list of export, serving, hashing, diff; default all).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CKFS=${1:-${CKFS_BIN:-$ROOT/build/ckfs}}
. "$ROOT/tests/bench/bench_common.sh"
CACHE=${CACHE:-128MiB}
H=$BENCH_DIR/history
mkdir -p "$H"
say() { echo "bench_history: $*" >&2; }
median_of() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

gen() { # NAME KIND STEPS
	if [ ! -e "$H/$1/.bench-complete" ]; then
		say "generating $1 ($2, $3 steps) in $H/$1 (once)"
		nice -n 10 "$PY" "$ROOT/tests/gen/make_history_fixtures.py" --bench "$H/$1" --kind "$2" \
			--steps "$3" --hidden 512 --layers 4 --vocab 16000 >"$H/$1.log" 2>&1 ||
			{ tail "$H/$1.log" >&2; die "generating $1 failed"; }
		touch "$H/$1/.bench-complete"
	fi
}
gen lora lora 10
gen plain plain 3
LORA=$H/lora PLAIN=$H/plain
echo "load: $(load_now)"
want() { [ -z "${BENCH_ONLY:-}" ] || [[ ",$BENCH_ONLY," == *",$1,"* ]]; }

# ---- 1. export: 10 steps --since the previous, against 10 full exports ----
if want export; then
echo "== export: 10 LoRA steps, --since the previous vs full (RUNS=$RUNS)"
since_t="" full_t="" written=0 fullb=0 du_since=0 du_full=0
for r in $(seq "$RUNS"); do
	rm -rf "$H/exp" && mkdir -p "$H/exp"
	t=$(t_now)
	for s in $(seq 10); do
		"$CKFS" export -q "$LORA/global_step_$s/actor" "$H/exp/full-$s"
	done
	full_t="$full_t $(t_since "$t")"
	t=$(t_now) prev="" written=0
	for s in $(seq 10); do
		if [ -z "$prev" ]; then
			"$CKFS" export -q "$LORA/global_step_$s/actor" "$H/exp/since-$s"
			w=$(du -sb "$H/exp/since-$s" | cut -f1)
		else
			line=$("$CKFS" export "$LORA/global_step_$s/actor" "$H/exp/since-$s" --since "$prev" 2>&1 |
				grep 'since PREV')
			w=$(sed -n 's/.*wrote \([0-9.]*\) \([KMG]*i*B\) of.*/\1 \2/p' <<<"$line" |
				awk '{ m = $2 == "B" ? 1 : $2 == "KiB" ? 1024 : $2 == "MiB" ? 1048576 : 1073741824; printf "%.0f", $1 * m }')
		fi
		written=$((written + w))
		[ -z "$prev" ] && first=$w
		prev=$H/exp/since-$s
	done
	since_t="$since_t $(t_since "$t")"
	for s in $(seq 10); do cmp -s "$H/exp/since-$s/model.safetensors" "$H/exp/full-$s/model.safetensors" ||
		die "step $s: --since differs from the full export"; done
	fullb=$(du -sb --apparent-size "$H"/exp/full-* | awk '{ s += $1 } END { print s }')
	du_full=$(du -sk "$H"/exp/full-* | tail -1 >/dev/null; du -skc "$H"/exp/full-* | tail -1 | cut -f1)
	du_since=$(du -skc "$H"/exp/since-* | tail -1 | cut -f1)
done
ts=$(median_of <<<"$since_t") tf=$(median_of <<<"$full_t")
echo "full exports:   $(mib "$fullb") written, disk $((du_full / 1024)) MiB, ${tf} s"
echo "--since chain:  $(mib "$written") written ($(awk -v a="$written" -v b="$fullb" 'BEGIN { printf "%.1f%%", 100 * a / b }') of full), disk $((du_since / 1024)) MiB, ${ts} s (x$(ratio "$tf" "$ts") faster)"
echo "                after the first (a full export): $(mib $(((written - first) / 9))) a step, $(awk -v a="$((written - first))" -v b="$first" 'BEGIN { printf "%.2f%%", 100 * a / 9 / b }') of a full export"
rm -rf "$H/exp"
fi

# ---- 2. serving four LoRA steps at once, shared and not ----
cat >"$H/odirect_read.py" <<'PY'
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 1 << 20)
for _ in range(int(sys.argv[2])):
    off = 0
    while True:
        n = os.preadv(fd, [buf], off)
        if n <= 0:
            break
        off += n
os.close(fd)
PY
serve_once() { # SHARE
	local m=$H/mnt pid peak=0 v t
	mkdir -p "$m"
	"$CKFS" mount -o "cache_size=$CACHE,share_slices=$1" "$LORA" "$m"
	for s in 7 8 9 10; do stat "$m/global_step_$s/actor/model.safetensors" >/dev/null; done
	t=$(t_now)
	for s in 7 8 9 10; do "$PY" "$H/odirect_read.py" "$m/global_step_$s/actor/model.safetensors" 2 & done
	while [ "$(jobs -rp | wc -l)" -gt 0 ]; do
		v=$(stats_field "$m" bytes_cached); [ "${v:-0}" -gt "$peak" ] && peak=$v
		sleep 0.05
	done
	wait
	local secs hits misses src
	secs=$(t_since "$t")
	hits=$(stats_field "$m" hits) misses=$(stats_field "$m" misses) src=$(stats_field "$m" source_bytes_read)
	echo "$secs $peak $(awk -v h="$hits" -v m="$misses" 'BEGIN { printf "%.3f", h / (h + m) }') $src $(stats_field "$m" bytes_saved)"
	"$CKFS" umount "$m"
}
if want serving; then
echo "== serving: steps 7-10 at once, four O_DIRECT readers, each its model.safetensors twice, cache $CACHE"
for share in on off; do
	rows=""
	for r in $(seq "$RUNS"); do rows="$rows$(serve_once $share)"$'\n'; done
	echo "share_slices=$share: $(awk '{ print $1 }' <<<"$rows" | median_of) s, cache held at most $(mib "$(awk '{ print $2 }' <<<"$rows" | median_of)"), hit rate $(awk '{ print $3 }' <<<"$rows" | median_of), sources read $(mib "$(awk '{ print $4 }' <<<"$rows" | median_of)"), saved at the end $(mib "$(awk '{ print $5 }' <<<"$rows" | median_of)")"
done
fi

# ---- 3. the hash's cost where nothing is shared: the plain run ----
cpu_s() { awk '{ printf "%.2f", ($14 + $15) / 100 }' "/proc/$1/stat"; } # clock ticks of 10 ms
read_once() { # SHARE DTYPE
	local m=$H/mnt t pid secs cpu
	mkdir -p "$m"
	"$CKFS" mount -o "cache_size=$CACHE,share_slices=$1,dtype=$2" "$PLAIN" "$m"
	pid=$("$CKFS" stats --json "$m" | sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
	t=$(t_now)
	cat "$m"/global_step_*/actor/model.safetensors >/dev/null
	secs=$(t_since "$t") cpu=$(cpu_s "$pid")
	echo "$secs $cpu $(stats_field "$m" bytes_hashed) $(stats_field "$m" shared_slices)"
	"$CKFS" umount "$m"
}
if want hashing; then
echo "== hashing: the plain run's 3 steps read with cat (nothing equal), on and off interleaved"
cat "$PLAIN"/global_step_*/actor/model_world_size_* >/dev/null # sources in the page cache
for dt in bf16 fp32; do
	on="" off=""
	for r in $(seq "$RUNS"); do on="$on$(read_once on $dt)"$'\n'; off="$off$(read_once off $dt)"$'\n'; done
	won=$(awk '{ print $1 }' <<<"$on" | median_of) woff=$(awk '{ print $1 }' <<<"$off" | median_of)
	con=$(awk '{ print $2 }' <<<"$on" | median_of) coff=$(awk '{ print $2 }' <<<"$off" | median_of)
	echo "$dt share on:  ${won} s, daemon CPU ${con} s, hashed $(mib "$(head -1 <<<"$on" | cut -d' ' -f3)"), shared $(head -1 <<<"$on" | cut -d' ' -f4) slices"
	echo "$dt share off: ${woff} s, daemon CPU ${coff} s"
	echo "$dt on / off:  wall x$(ratio "$won" "$woff"), CPU x$(ratio "$con" "$coff")"
done
fi

# ---- 4. ckfs diff against torch loading both ----
if want diff; then
echo "== diff: two plain steps (everything changed), ckfs diff vs torch (RUNS=$RUNS)"
A=$PLAIN/global_step_1/actor B=$PLAIN/global_step_2/actor
ct="" cr="" tt="" tr=""
for r in $(seq "$RUNS"); do
	/usr/bin/time -f "%e %M" -o "$H/time" "$CKFS" diff --json "$A" "$B" >"$H/diff.json"
	ct="$ct $(cut -d' ' -f1 "$H/time")" cr="$cr $(cut -d' ' -f2 "$H/time")"
	/usr/bin/time -f "%e %M" -o "$H/time" "$PY" "$ROOT/tests/bench/diff_torch.py" "$A" "$B" >"$H/torch.txt"
	tt="$tt $(cut -d' ' -f1 "$H/time")" tr="$tr $(cut -d' ' -f2 "$H/time")"
done
crel=$("$PY" -c 'import json,sys; print("%.9g" % json.load(open(sys.argv[1]))["total"]["rel_l2"])' "$H/diff.json")
echo "ckfs diff:  $(median_of <<<"$ct") s, peak RSS $(($(median_of <<<"$cr") / 1024)) MiB, total ||B-A||/||A|| $crel"
echo "torch:      $(median_of <<<"$tt") s, peak RSS $(($(median_of <<<"$tr") / 1024)) MiB, $(cat "$H/torch.txt")"
echo "ckfs diff is x$(ratio "$(median_of <<<"$tt")" "$(median_of <<<"$ct")") faster, x$(ratio "$(median_of <<<"$tr")" "$(median_of <<<"$cr")") less memory"
fi
echo "load: $(load_now)"
