#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A training run as one mount (not a test; no figure is asserted): runs of
# 10 and 100 steps, every step the same hole-backed verl FSDP2 checkpoint
# (tests/gen/make_bench_checkpoint.py --holes: torch's real pickles and zip
# records, tensor bytes left as holes) hard-linked into
# global_step_<N>/actor/, and the tracker naming the last. Medians of RUNS:
#
#   mount_s       `ckfs mount` until it returns (the mount is ready)
#   ls_s          the first `ls -l` of the top folder after that
#   latest_s      from a new step's tracker update until MNT/latest names it
#                 (inotify; the figure the 2 s promise is about)
#   ratio         100 steps / 10 steps, for mount_s + ls_s (target: about 1,
#                 under 0.2 s either way)
#   rss           the daemon's RSS after mounting, with the plan LRU full
#                 (max_plans steps looked up), and after looking up every
#                 step's actor once and reading its first 8 MiB; the bound
#                 is the RSS with the LRU full plus the cache budget
#
#   tests/bench/bench_run.sh [PATH/TO/ckfs]
#
# Environment: BENCH_DIR (default /tmp/ckfs-bench), RUNS (default 5),
# BENCH_RUN_SHAPE (default qwen2.5-0.5b), BENCH_RUN_STEPS (default
# "10 100"), BENCH_MOUNT_CACHE (default 256MiB), MAX_PLANS (default 8),
# TORCH_PYTHON (default: the pinned venv).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CKFS=${1:-${CKFS_BIN:-$ROOT/build/ckfs}}
BENCH_DIR=${BENCH_DIR:-/tmp/ckfs-bench}
RUNS=${RUNS:-5}
SHAPE=${BENCH_RUN_SHAPE:-qwen2.5-0.5b}
STEPS=${BENCH_RUN_STEPS:-10 100}
CACHE=${BENCH_MOUNT_CACHE:-256MiB}
MAX_PLANS=${MAX_PLANS:-8}
if [ -z "${TORCH_PYTHON:-}" ]; then
	TORCH_PYTHON=$("$ROOT/tests/setup-venv.sh" --print-path)/bin/python
fi

say() { echo "bench_run: $*" >&2; }
die() { echo "bench_run: $*" >&2; exit 1; }
[ -x "$CKFS" ] || die "no ckfs at $CKFS"
t_now() { echo "$EPOCHREALTIME"; }
t_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.4f", b - a }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
rss_kb() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f MiB", k / 1024 }'; }

D=$BENCH_DIR/run-$SHAPE
ONE=$D/one
mkdir -p "$D"
if [ ! -e "$ONE/.bench-complete" ]; then
	say "generating $SHAPE with holes in $ONE (once)"
	rm -rf "$ONE"
	nice -n 10 "$TORCH_PYTHON" "$ROOT/tests/gen/make_bench_checkpoint.py" "$ONE" --shape "$SHAPE" \
		--holes >"$D/gen.log" 2>&1 || { cat "$D/gen.log" >&2; die "generation failed"; }
	touch "$ONE/.bench-complete"
fi

make_run() { # N: $D/run<N>, steps 10, 20, ..., N*10, each a hard-linked copy
	local n=$1 run=$D/run$1 k
	[ -e "$run/.bench-complete" ] && return 0
	rm -rf "$run"
	mkdir -p "$run"
	for k in $(seq 1 "$n"); do
		mkdir "$run/global_step_$((k * 10))"
		cp -al "$ONE" "$run/global_step_$((k * 10))/actor"
		rm -f "$run/global_step_$((k * 10))/actor/.bench-complete"
	done
	printf '%d' $((n * 10)) >"$run/latest_checkpointed_iteration.txt"
	touch "$run/.bench-complete"
}

MNT=$D/mnt
mkdir -p "$MNT"
mountpoint -q "$MNT" && "$CKFS" umount "$MNT"
pid_of() { "$CKFS" stats --json "$MNT" | "$TORCH_PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["pid"])'; }
unmount() { local p; p=$(pid_of); "$CKFS" umount "$MNT"; while kill -0 "$p" 2>/dev/null; do sleep 0.02; done; }

declare -A MED
for n in $STEPS; do
	make_run "$n"
	run=$D/run$n
	m=() l=() lt=()
	for r in $(seq "$RUNS"); do
		sync
		echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true # cold dentries where root
		t=$(t_now)
		"$CKFS" mount --log-level err --cache-size "$CACHE" -o max_plans="$MAX_PLANS" "$run" "$MNT"
		m+=("$(t_since "$t")")
		t=$(t_now)
		ls -l "$MNT" >/dev/null
		l+=("$(t_since "$t")")
		[ "$(readlink "$MNT/latest")" = "global_step_$((n * 10))" ] || die "latest is wrong"
		# A new step saved, then the tracker: how long until latest names it.
		new=$(((n + r) * 10))
		mkdir "$run/global_step_$new"
		cp -al "$ONE" "$run/global_step_$new/actor"
		t=$(t_now)
		printf '%d' "$new" >"$run/latest_checkpointed_iteration.txt"
		until [ "$(readlink "$MNT/latest")" = "global_step_$new" ]; do sleep 0.005; done
		lt+=("$(t_since "$t")")
		unmount
		rm -rf "$run/global_step_$new"
		printf '%d' $((n * 10)) >"$run/latest_checkpointed_iteration.txt"
	done
	MED[mount$n]=$(printf '%s\n' "${m[@]}" | median)
	MED[ls$n]=$(printf '%s\n' "${l[@]}" | median)
	MED[latest$n]=$(printf '%s\n' "${lt[@]}" | median)
	say "$n steps: mount ${MED[mount$n]} s, first ls ${MED[ls$n]} s, tracker to latest ${MED[latest$n]} s"
done

# Memory: the largest run, each step's actor looked up once and its first
# 8 MiB read (holes read as zeros through the whole read path).
last=${STEPS##* }
run=$D/run$last
"$CKFS" mount --log-level err --cache-size "$CACHE" -o max_plans="$MAX_PLANS" "$run" "$MNT"
pid=$(pid_of)
rss0=$(rss_kb "$pid")
# The LRU full: max_plans steps looked up (each role's plan built).
for k in $(seq 1 "$MAX_PLANS"); do
	stat "$MNT/global_step_$((k * 10))/actor/model.safetensors" >/dev/null
done
rss1=$(rss_kb "$pid")
t=$(t_now)
for k in $(seq 1 "$last"); do
	head -c 8388608 "$MNT/global_step_$((k * 10))/actor/model.safetensors" >/dev/null
done
walk=$(t_since "$t")
rss2=$(rss_kb "$pid")
plans=$("$CKFS" stats --json "$MNT" | "$TORCH_PYTHON" -c 'import json,sys; s=json.load(sys.stdin); print(s["plans_cached"], "plans kept,", s["bytes_cached"], "cache bytes")')
unmount
plan_kb=$(((rss1 - rss0) / MAX_PLANS))
budget_kb=$("$TORCH_PYTHON" -c "import re,sys; v='$CACHE'; m=re.fullmatch(r'(\d+)([KMG]i?B)?', v); u={'KiB':1,'KB':1,'MiB':1024,'MB':1024,'GiB':1048576,'GB':1048576,None:0}[m.group(2)]; print(int(m.group(1))*u if u else int(m.group(1))//1024)")
bound=$((rss1 + budget_kb))

first=${STEPS%% *}
echo
echo "ckfs run mount, $SHAPE (holes) per step, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), medians of $RUNS"
printf '%-34s' "steps"; for n in $STEPS; do printf '%12s' "$n"; done; echo
printf '%-34s' "mount to ready (s)"; for n in $STEPS; do printf '%12s' "${MED[mount$n]}"; done; echo
printf '%-34s' "first ls -l of the top (s)"; for n in $STEPS; do printf '%12s' "${MED[ls$n]}"; done; echo
printf '%-34s' "mount + ls (s, target < 0.2)"; for n in $STEPS; do
	printf '%12s' "$(awk -v a="${MED[mount$n]}" -v b="${MED[ls$n]}" 'BEGIN { printf "%.4f", a + b }')"; done; echo
printf '%-34s' "tracker to latest (s, target < 2)"; for n in $STEPS; do printf '%12s' "${MED[latest$n]}"; done; echo
echo "ratio $last/$first steps, mount + ls: $(awk -v a="${MED[mount$last]}" -v b="${MED[ls$last]}" \
	-v c="${MED[mount$first]}" -v d="${MED[ls$first]}" 'BEGIN { printf "%.2f", (a + b) / (c + d) }')"
echo "daemon RSS, $last steps: after mount $(mib "$rss0"); $MAX_PLANS plans built $(mib "$rss1") ($(mib "$plan_kb") each); every step looked up and 8 MiB of it read $(mib "$rss2") (walk $walk s; $plans)"
echo "bound (mount + $MAX_PLANS plans + cache $CACHE): $(mib "$bound"); RSS/bound $(awk -v a="$rss2" -v b="$bound" 'BEGIN { printf "%.3f", a / b }')"
