#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ckfs export --part I/N (src/cli/export_part.c): one export split over N
# processes.
#  - 4 parts run at once give the folder one export gives, byte for byte,
#    with the same modes, and leave no staging folder;
#  - I and N from a launcher's environment (torchrun's RANK/WORLD_SIZE, a
#    Slurm array's, a Kubernetes Indexed Job's JOB_COMPLETION_INDEX);
#  - the weight files are shared by bytes to read: each of 2 parts within
#    the largest file of half;
#  - a part run again writes only what its killed run did not finish;
#    part 0 interrupted while it waits leaves the staging folder, and a
#    rerun completes it;
#  - parts started with other options are refused in one line; bad
#    --part values and --since with --part are usage errors.
# Usage: test_export_part.sh CKFS_BINARY FIXTURES_DIR
set -uo pipefail
CKFS=$1
FIX=$2
SRC=$FIX/w4a16/qwen2_fsdp2_w2
WORK=$(mktemp -d /tmp/ckfs-part.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
SHARD=(--max-shard-size 100KB)
# the launcher's variables only where a case sets them
unset RANK WORLD_SIZE SLURM_ARRAY_TASK_ID SLURM_ARRAY_TASK_MIN SLURM_ARRAY_TASK_COUNT JOB_COMPLETION_INDEX

# every file's bytes and mode the same as the one export's
same_as_ref() { # DIR
	diff -r "$WORK/ref" "$1" >/dev/null &&
		[ "$(cd "$WORK/ref" && stat -c '%a %n' . *)" = "$(cd "$1" && stat -c '%a %n' . *)" ]
}

"$CKFS" export -q "${SHARD[@]}" "$SRC" "$WORK/ref" || { echo "FAIL the reference export"; exit 1; }
files=$(ls "$WORK/ref" | grep -c '\.safetensors$')
[ "$files" -ge 6 ] && ok "the reference has $files weight files" || bad "the reference has $files weight files"

# 4 parts at once
pids=()
for i in 1 2 3; do
	"$CKFS" export -q "${SHARD[@]}" --part "$i/4" "$SRC" "$WORK/four" & pids+=($!)
done
"$CKFS" export -q "${SHARD[@]}" --part 0/4 "$SRC" "$WORK/four"
rc0=$? rcs=0
for p in "${pids[@]}"; do wait "$p" || rcs=1; done
[ $rc0 = 0 ] && [ $rcs = 0 ] && same_as_ref "$WORK/four" && [ ! -e "$WORK/four.ckfs-parts" ] &&
	ok "4 parts at once: the one export's bytes and modes, no staging left" ||
	bad "4 parts at once: rc $rc0/$rcs, $(diff -r "$WORK/ref" "$WORK/four" 2>&1 | head -3)"

# I and N from the launcher's environment
RANK=1 WORLD_SIZE=2 "$CKFS" export -q "${SHARD[@]}" --part auto "$SRC" "$WORK/env" &
p=$!
RANK=0 WORLD_SIZE=2 "$CKFS" export -q "${SHARD[@]}" --part auto "$SRC" "$WORK/env" && wait $p &&
	same_as_ref "$WORK/env" && ok "--part auto from RANK and WORLD_SIZE" || bad "--part auto from RANK and WORLD_SIZE"
SLURM_ARRAY_TASK_ID=2 SLURM_ARRAY_TASK_MIN=1 SLURM_ARRAY_TASK_COUNT=2 \
	"$CKFS" export -q "${SHARD[@]}" --part auto "$SRC" "$WORK/slurm" &
p=$!
SLURM_ARRAY_TASK_ID=1 SLURM_ARRAY_TASK_MIN=1 SLURM_ARRAY_TASK_COUNT=2 \
	"$CKFS" export -q "${SHARD[@]}" --part auto "$SRC" "$WORK/slurm" && wait $p &&
	same_as_ref "$WORK/slurm" && ok "--part auto: a Slurm array from 1" || bad "--part auto: a Slurm array from 1"
JOB_COMPLETION_INDEX=1 "$CKFS" export -q "${SHARD[@]}" --part auto/2 "$SRC" "$WORK/k8s" &
p=$!
JOB_COMPLETION_INDEX=0 "$CKFS" export -q "${SHARD[@]}" --part auto/2 "$SRC" "$WORK/k8s" && wait $p &&
	same_as_ref "$WORK/k8s" && ok "--part auto/2: a Kubernetes Indexed Job" || bad "--part auto/2: a Kubernetes Indexed Job"

# shared by bytes: part 1 of 2 alone leaves exactly its files in the
# staging folder; their bytes are within the largest file of half
"$CKFS" export -q "${SHARD[@]}" --part 1/2 "$SRC" "$WORK/half"
stage=$WORK/half.ckfs-parts
mine=$(cat "$stage"/*.safetensors | wc -c)
total=$(cat "$WORK/ref"/*.safetensors | wc -c)
largest=$(stat -c %s "$WORK/ref"/*.safetensors | sort -n | tail -1)
d=$((2 * mine - total))
[ "${d#-}" -le $((2 * largest)) ] && [ "$mine" -gt 0 ] &&
	ok "part 1 of 2 wrote $mine of $total bytes (largest file $largest)" ||
	bad "part 1 of 2 wrote $mine of $total bytes (largest file $largest)"

# a part run again writes only what is missing
kept=$(ls "$stage"/*.safetensors | head -1)
gone=$(ls "$stage"/*.safetensors | tail -1)
ino=$(stat -c %i "$kept")
rm -f "$gone" "$stage"/.ckfs-part-1-of-2
"$CKFS" export -q "${SHARD[@]}" --part 1/2 "$SRC" "$WORK/half" &&
	[ "$(stat -c %i "$kept")" = "$ino" ] && [ -s "$gone" ] &&
	ok "part 1 run again: only its missing file written" || bad "part 1 run again"

# parts with other options are refused, and leave the staging folder
"$CKFS" export -q --max-shard-size 200KB --part 0/2 "$SRC" "$WORK/half" 2>"$WORK/e"
rc=$?
[ $rc = 1 ] && [ "$(wc -l <"$WORK/e")" = 1 ] && grep -q "half.ckfs-parts': left by an export of another SRC, other options or another part count" "$WORK/e" &&
	[ -d "$stage" ] && ok "other options refused: $(cat "$WORK/e")" || bad "other options: rc $rc, $(cat "$WORK/e")"

# part 0 interrupted while it waits: the staging folder stays, a rerun
# (the other part done by then) completes it
rm -f "$stage"/.ckfs-part-1-of-2
"$CKFS" export -q "${SHARD[@]}" --part 0/2 "$SRC" "$WORK/half" 2>"$WORK/e" &
p=$!
for _ in $(seq 100); do [ -e "$stage/.ckfs-part-0-of-2" ] && break; sleep 0.1; done
kill -TERM $p
wait $p
rc=$?
[ $rc = 130 ] && [ -d "$stage" ] && [ ! -e "$WORK/half" ] && ok "part 0 interrupted while waiting: exit 130, staging kept" ||
	bad "part 0 interrupted: rc $rc, $(cat "$WORK/e")"
"$CKFS" export -q "${SHARD[@]}" --part 1/2 "$SRC" "$WORK/half" &&
	"$CKFS" export -q "${SHARD[@]}" --part 0/2 "$SRC" "$WORK/half" && same_as_ref "$WORK/half" &&
	[ ! -e "$stage" ] && ok "rerun completes the folder" || bad "rerun completes the folder"

# usage errors
usage() { # NAME PATTERN ARGS...
	local name=$1 pat=$2
	shift 2
	"$CKFS" export "$@" "$SRC" "$WORK/never" 2>"$WORK/e"
	local rc=$?
	[ $rc = 2 ] && grep -qE -- "$pat" "$WORK/e" && [ ! -e "$WORK/never" ] && [ ! -e "$WORK/never.ckfs-parts" ] &&
		ok "$name: usage error" || bad "$name: rc $rc, $(cat "$WORK/e")"
}
usage "--part 4/4" "bad --part '4/4' \(the part index is not below the count\)" --part 4/4
usage "--part x" "bad --part 'x' \(I/N, auto or auto/N" --part x
usage "--part auto without a launcher" "bad --part 'auto' \(auto: none of RANK" --part auto
usage "--since with --part" "--since and --part do not go together" --since "$WORK/ref" --part 0/2

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
