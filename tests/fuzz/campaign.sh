#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A fuzz campaign: each libFuzzer target of BUILD (a -DCKFS_FUZZ=ON build)
# for SECONDS, one at a time, niced, with its dictionary, starting from the
# replay corpus and seeds. New inputs and crash artifacts go to WORK; the
# last libFuzzer status line of each target goes to WORK/summary.txt.
# Add what is worth keeping with
#   fuzz_X -merge=1 tests/corpus/fuzz/X WORK/X
# Usage: tests/fuzz/campaign.sh BUILD SECONDS WORK [target...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$1 secs=$2 work=$3
shift 3
targets=${*:-dcp plan zip pickle torch config like}
declare -A seeds=(
	[zip]="corpus/fuzz/zip corpus/zip fixtures/zip"
	[pickle]="corpus/fuzz/pickle corpus/pickle fixtures/pickle"
	[torch]="corpus/fuzz/torch fixtures/zip"
	[config]="corpus/fuzz/config"
	[dcp]="corpus/fuzz/dcp fixtures/dcp/broken"
	[plan]="corpus/fuzz/plan"
	[like]="corpus/fuzz/like fixtures/matrix/torch-2.13.0/fsdp2 fixtures/matrix/torch-2.8.0/fsdp2")
declare -A dicts=([zip]=zip.dict [torch]=zip.dict [like]=zip.dict [pickle]=dcp.dict [dcp]=dcp.dict)
mkdir -p "$work"
for t in $targets; do
	mkdir -p "$work/$t" "$work/$t.crashes"
	dirs=()
	for s in ${seeds[$t]}; do dirs+=("$root/tests/$s"); done
	dict=()
	[[ -n ${dicts[$t]:-} ]] && dict=(-dict="$root/tests/fuzz/${dicts[$t]}")
	start=$(date +%s)
	rc=0
	nice -n 10 "$build/fuzz_$t" "${dict[@]}" -max_total_time="$secs" -jobs=1 \
		-workers=1 -rss_limit_mb=2048 -timeout=10 -max_len=65536 \
		-artifact_prefix="$work/$t.crashes/" "$work/$t" "${dirs[@]}" \
		>"$work/$t.log" 2>&1 || rc=$?
	[[ -f fuzz-0.log ]] && mv fuzz-0.log "$work/$t.log"
	end=$(date +%s)
	last=$(grep -E '^#[0-9]+' "$work/$t.log" | tail -1 || true)
	echo "$t rc=$rc seconds=$((end - start)) crashes=$(ls "$work/$t.crashes" | wc -l) $last" |
		tee -a "$work/summary.txt"
done
