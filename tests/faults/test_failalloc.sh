#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Allocation failures: `ckfs inspect` and `ckfs export` of the layouts
# (verl FSDP2, DCP, Megatron TP / critic / TP x EP MoE with TE names and
# with whole experts (expert tensor parallel size 1),
# sharded HF safetensors, a DeepSpeed ZeRO-3 Trainer checkpoint) run once per N with
# the Nth allocation failing (tests/faults/failalloc.c, LD_PRELOAD), for
# every N from 1 to the number of allocations the command makes
# (CKFS_FAILALLOC_RUNS=R thins it to about R values of N per command, as
# the ASan tier does; CKFS_FAILALLOC_STEP=S takes every S-th). Every run
# must either succeed with
# the same output as a run without faults (inspect's text, export's files
# byte for byte), or exit 1 with exactly one stderr line that says "out of
# memory", print nothing on stdout and leave no export folder or temporary
# folder behind. A signal, another exit status or another message fails.
# A second pass fails every allocation from the Nth on ("after" mode).
# Usage: test_failalloc.sh CKFS_BINARY FAILALLOC_SO
set -uo pipefail
CKFS=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
SHIM=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
FIX=$(cd "$(dirname "$0")/../fixtures" && pwd -P)
RUNS=${CKFS_FAILALLOC_RUNS:-0}
WORK=$(mktemp -d /tmp/ckfs-failalloc.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
pass=0 fail=0 runs=0 oom=0
bad() {
	fail=$((fail + 1))
	echo "FAIL $*"
}

# CMD SRC DEST, with the arguments of EXTRA: export (after its options),
# diff (after A: B and options) or inspect.
EXTRA=()
run_cmd() {
	case $1 in
	export) "$CKFS" export -q "${EXTRA[@]}" "$2" "$3" ;;
	diff) "$CKFS" diff "$2" "${EXTRA[@]}" ;;
	*) "$CKFS" "$1" "$2" ;;
	esac
}

# sweep NAME SRC CMD MODE
sweep() {
	local name=$1 src=$2 cmd=$3 mode=$4 total n rc out err
	local dest=$WORK/exp/out
	mkdir -p "$WORK/exp"
	# Reference: no fault (armed past the end, which also counts).
	rm -f "$WORK/rep"
	CKFS_FAIL_ALLOC=999999999 CKFS_FAIL_REPORT=$WORK/rep LD_PRELOAD=$SHIM \
		run_cmd "$cmd" "$src" "$WORK/ref" >"$WORK/ref.txt" 2>/dev/null ||
		{ bad "$name: $cmd without faults failed"; return; }
	total=$(awk '$1 == "count" { print $2 }' "$WORK/rep")
	[ -n "$total" ] && [ "$total" -gt 0 ] || { bad "$name: the shim counted nothing"; return; }
	local ok_runs=0 clean_runs=0 STEP=${CKFS_FAILALLOC_STEP:-${SWEEP_STEP:-1}}
	[ "$RUNS" -gt 0 ] && [ -z "${CKFS_FAILALLOC_STEP:-}" ] && STEP=$(((total + RUNS - 1) / RUNS))
	for ((n = 1; n <= total; n += STEP)); do
		rm -rf "$dest" "$WORK/rep"
		CKFS_FAIL_ALLOC=$n CKFS_FAIL_ALLOC_MODE=$mode CKFS_FAIL_REPORT=$WORK/rep \
			LD_PRELOAD=$SHIM run_cmd "$cmd" "$src" "$dest" >"$WORK/out.txt" 2>"$WORK/err.txt"
		rc=$?
		runs=$((runs + 1))
		err=$(cat "$WORK/err.txt")
		if [ "$rc" = 0 ]; then
			ok_runs=$((ok_runs + 1))
			if [ "$cmd" = export ]; then
				diff -r "$WORK/ref" "$dest" >/dev/null ||
					bad "$name N=$n: export succeeded with different files"
			elif [ "$cmd" = diff ]; then # but the time it took
				cmp -s <(grep -vE '"seconds":|^read .* s$' "$WORK/ref.txt") \
					<(grep -vE '"seconds":|^read .* s$' "$WORK/out.txt") ||
					bad "$name N=$n: diff succeeded with different output"
			else
				cmp -s "$WORK/ref.txt" "$WORK/out.txt" ||
					bad "$name N=$n: inspect succeeded with different output"
			fi
		elif [ "$rc" = 1 ]; then
			if [ "$(printf '%s\n' "$err" | wc -l)" != 1 ] ||
				[ "${err#ckfs: }" = "$err" ] || [ "${err%out of memory*}" = "$err" ]; then
				bad "$name N=$n: stderr is not one 'out of memory' line: $err"
			elif [ -s "$WORK/out.txt" ]; then
				bad "$name N=$n: printed on stdout while failing"
			elif [ -e "$dest" ] || [ -n "$(find "$WORK/exp" -mindepth 1 -print -quit)" ]; then
				bad "$name N=$n: export left $(find "$WORK/exp" -mindepth 1 | head -3)"
			else
				oom=$((oom + 1))
				clean_runs=$((clean_runs + 1))
			fi
		else
			bad "$name N=$n: exit status $rc: $err"
		fi
	done
	pass=$((pass + 1))
	echo "$name ($mode): $total allocations, $(((total + STEP - 1) / STEP)) runs," \
		"$clean_runs failed cleanly, $ok_runs succeeded with the right output"
	rm -rf "$WORK/ref" "$WORK/ref.txt"
}

for spec in fsdp/qwen2_fsdp2_w2 dcp/qwen2_tied_fsdp2_w3 megatron/llama_tp2 megatron/qwen2_critic_tp2 \
	megatron/qwen2_moe_tp2_ep2_te megatron/qwen2_moe_tp2_ep2_etp1 hf/qwen2_sharded \
	deepspeed/trainer_z3_w3_bf16_tied; do
	for cmd in inspect export; do
		sweep "$cmd ${spec}" "$FIX/$spec" "$cmd" once
	done
done
# export --since (a LoRA step since the one before: the base linked, the
# adapter written) and diff (a run's two steps, and a whole run).
"$CKFS" export -q "$FIX/history/lora_run/global_step_1/actor" "$WORK/prev"
EXTRA=(--since "$WORK/prev")
sweep "export --since history/lora_run" "$FIX/history/lora_run/global_step_2/actor" export once
EXTRA=("$FIX/history/frozen_run/global_step_2/actor")
sweep "diff history/frozen_run" "$FIX/history/frozen_run/global_step_1/actor" diff once
EXTRA=(--json)
SWEEP_STEP=13 # 5,500 allocations, most of them the JSON's: every 13th
sweep "diff --json RUN history/lora_run" "$FIX/history/lora_run" diff once
SWEEP_STEP=
EXTRA=()
# Every allocation failing from N on: error paths that allocate are hit too.
for spec in fsdp/qwen2_fsdp2_w2 dcp/qwen2_tied_fsdp2_w3 deepspeed/trainer_z3_w3_bf16_tied; do
	sweep "export ${spec}" "$FIX/$spec" export after
done
echo "$runs runs, $oom clean out-of-memory failures, $fail failures"
[ "$fail" = 0 ] && [ "$pass" -gt 0 ]
