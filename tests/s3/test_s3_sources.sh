#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Checkpoints read from an object store (s3:// sources) against the same
# checkpoints on disk, on a real SeaweedFS on loopback:
#   - export from s3:// is byte-identical to export from the local folder,
#     for a verl FSDP actor (FSDP1 and FSDP2), a Megatron torch_dist folder,
#     a legacy Megatron checkpoint, DeepSpeed ZeRO (its config from the
#     store too), a DCP checkpoint, a Hugging Face folder and a LoRA actor;
#     inspect --json says the same apart from the source's name
#   - export fetches neighbouring shards of a rank file in one GET
#   - diff of a training run in the store equals diff of it on disk
#   - a mount of s3:// serves the same bytes; verify agrees; with
#     --s3-cache, a second mount (another daemon) fetches only the listing
#   - faults, each ending with correct bytes or EIO and a live daemon:
#     every request dropped, throttled (503 SlowDown) and cut short once
#     (tests/s3/flaky_proxy.py); an object overwritten while mounted (EIO,
#     no mixed bytes); the server killed while mounted (EIO) and started
#     again (correct bytes again)
#   - a training run in the store: its steps shown, a step saved while
#     mounted appears (listed again every -o s3_poll seconds) with `latest`.
# Usage: test_s3_sources.sh CKFS_BINARY
set -uo pipefail
CKFS=$1
HERE=$(cd "$(dirname "$0")" && pwd)
FIX=$(cd "$HERE/../fixtures" && pwd -P)
source "$HERE/seaweedfs.sh"

MOUNTS=()
PROXY=
session_cleanup() {
	for m in "${MOUNTS[@]}"; do
		fusermount3 -uz "$m" 2>/dev/null
	done
	[ -z "$PROXY" ] || kill "$PROXY" 2>/dev/null
}
B=ckfs-src
seaweedfs_session WORK /tmp/ckfs-s3src.XXXXXX "$B" || exit 1

fails=0
fail() {
	echo "FAIL: $*" >&2
	fails=$((fails + 1))
}

# name  local folder (under tests/fixtures)  extra options (--config may name s3://)
CASES=(
	"fsdp2|fsdp/qwen2_fsdp2_w2|"
	"fsdp1_w8|fsdp/qwen2_fsdp1_w8|"
	"mcore_dist|mcore_dist/qwen2_tp2|"
	"megatron|megatron/llama_tp2|"
	"deepspeed_trainer|deepspeed/trainer_z2_w2_bf16|"
	"deepspeed_z3|deepspeed/z3_w2_fp32|--config @deepspeed/trainer_z2_w2_bf16/config.json"
	"dcp|dcp/qwen2_fsdp2_w2_optim|"
	"hf|hf/qwen2_sharded|"
	"lora|lora/lora_qwen2_fsdp2_w2|"
)
uploaded=" "
upload() { # FIXTURE: once, at s3://$B/FIXTURE
	[[ $uploaded == *" $1 "* ]] && return 0
	s3_put_tree "$FIX/$1" "$AWS_ENDPOINT_URL/$B/$1" || { fail "could not upload $1"; return 1; }
	uploaded+="$1 "
}
options() { # EXTRA WHERE (local | s3): the case's options for a source there
	local o=${1//@/$FIX/}
	[ "$2" = s3 ] && o=${1//@/s3:\/\/$B/}
	echo "$o"
}

echo "== export and inspect: s3:// against the same folder on disk"
for c in "${CASES[@]}"; do
	IFS='|' read -r name dir extra <<<"$c"
	if [ ! -d "$FIX/$dir" ]; then
		fail "$name: fixture $dir is missing"
		continue
	fi
	upload "$dir" || continue
	[[ $extra == *@* ]] && { cfg=${extra#*@}; upload "$(dirname "$cfg")" || continue; }
	# shellcheck disable=SC2046
	"$CKFS" export -q $(options "$extra" local) "$FIX/$dir" "$WORK/$name.local" ||
		{ fail "$name: local export"; continue; }
	# shellcheck disable=SC2046
	if ! "$CKFS" export -q $(options "$extra" s3) "s3://$B/$dir" "$WORK/$name.s3" 2>"$WORK/err"; then
		fail "$name: export from s3:// failed: $(cat "$WORK/err")"
		continue
	fi
	if diff -r "$WORK/$name.local" "$WORK/$name.s3" >/dev/null; then
		echo "ok: $name: export identical ($(ls "$WORK/$name.s3" | wc -l) files)"
	else
		fail "$name: export from s3:// differs from the local one"
	fi
	# shellcheck disable=SC2046
	"$CKFS" inspect --json $(options "$extra" local) "$FIX/$dir" |
		sed "s|$FIX/|@/|g" >"$WORK/$name.local.json"
	# shellcheck disable=SC2046
	"$CKFS" inspect --json $(options "$extra" s3) "s3://$B/$dir" |
		sed "s|s3://$B/|@/|g" >"$WORK/$name.s3.json"
	if cmp -s "$WORK/$name.local.json" "$WORK/$name.s3.json"; then
		echo "ok: $name: inspect --json the same"
	else
		fail "$name: inspect --json differs"
		diff "$WORK/$name.local.json" "$WORK/$name.s3.json" | head -5 >&2
	fi
done

echo "== requests: neighbouring tensor bytes come in one GET per rank file"
# The FSDP1 actor at world size 8 holds each of its tensors' shards in
# each of 8 rank files: read one by one, a GET per shard (204 here). Its
# whole model.safetensors is one export window, so fetched ahead with
# their neighbours (ckfs_file_ahead) each rank file's shards come in one
# or two. inspect reads the same metadata as export, without the data.
requests() { sed -n 's/^ckfs: object store: \([0-9]*\) requests.*/\1/p' "$1"; }
CKFS_PLAN_CACHE=off "$CKFS" inspect --log-level info "s3://$B/fsdp/qwen2_fsdp1_w8" \
	>/dev/null 2>"$WORK/req.meta"
CKFS_PLAN_CACHE=off "$CKFS" export --log-level info "s3://$B/fsdp/qwen2_fsdp1_w8" \
	"$WORK/req.out" >/dev/null 2>"$WORK/req.export"
meta=$(requests "$WORK/req.meta") all=$(requests "$WORK/req.export")
if [ -n "$meta" ] && [ -n "$all" ] && [ $((all - meta)) -le 16 ] &&
	cmp -s "$WORK/req.out/model.safetensors" "$WORK/fsdp1_w8.local/model.safetensors"; then
	echo "ok: requests: export $all, of which data $((all - meta)) for 8 rank files"
else
	fail "requests: export ${all:-?}, metadata ${meta:-?}: more than 16 GETs of data" \
		"for 8 rank files, or the bytes differ"
fi

echo "== diff of a run in the store: every pair of steps, as on disk"
upload history/frozen_run
"$CKFS" diff --json "$FIX/history/frozen_run" >"$WORK/diff.local.json" 2>"$WORK/diff.err"
"$CKFS" diff --json "s3://$B/history/frozen_run" >"$WORK/diff.s3.json" 2>>"$WORK/diff.err"
if python3 - "$WORK/diff.local.json" "$WORK/diff.s3.json" <<'EOF'; then
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for d in (a, b):  # all but the source's name and the time taken
    d.pop("run")
    for r in d["roles"]:
        for p in r["pairs"]:
            p.pop("seconds")
pairs = [p for r in a["roles"] for p in r["pairs"]]
changed = sum(t["status"] == "changed" for p in pairs for t in p["tensors"])
print("ok: diff: %d pairs of steps, %d tensors changed, the same from s3://" % (len(pairs), changed))
sys.exit(0 if a == b and len(pairs) >= 2 and changed else 1)
EOF
	:
else
	fail "diff of the run from s3:// differs from the local one: $(tail -2 "$WORK/diff.err")"
fi

# A mount; prints nothing, fails the test when it cannot mount.
mount_at() { # URL MOUNTPOINT [OPTIONS...]
	local url=$1 mnt=$2
	shift 2
	mkdir -p "$mnt"
	if ! "$CKFS" mount "$@" "$url" "$mnt" 2>"$WORK/mount.err"; then
		fail "mount $url: $(cat "$WORK/mount.err")"
		return 1
	fi
	MOUNTS+=("$mnt")
}
same_as() { # MOUNTPOINT EXPORTED_FOLDER LABEL
	local f bad=0
	for f in "$2"/*; do
		cmp -s "$f" "$1/$(basename "$f")" || { bad=1; fail "$3: $(basename "$f") differs"; }
	done
	[ "$bad" = 0 ] && echo "ok: $3: every file the same as the local export"
}
alive() { # MOUNTPOINT LABEL
	if "$CKFS" stats "$1" >/dev/null 2>&1 && ls "$1" >/dev/null; then
		echo "ok: $2: the daemon is alive"
	else
		fail "$2: the daemon is gone"
	fi
}

echo "== mounts"
M=$WORK/m
mount_at "s3://$B/fsdp/qwen2_fsdp2_w2" "$M/fsdp2" && same_as "$M/fsdp2" "$WORK/fsdp2.local" "mount fsdp2"
if [ -d "$M/fsdp2" ] && "$CKFS" verify "s3://$B/fsdp/qwen2_fsdp2_w2" --against "$WORK/fsdp2.local" \
	>"$WORK/verify.out" 2>&1; then
	echo "ok: verify s3:// against the local export"
else
	fail "verify: $(tail -2 "$WORK/verify.out")"
fi
mount_at "s3://$B/deepspeed/z3_w2_fp32" "$M/ds" --config "s3://$B/deepspeed/trainer_z2_w2_bf16/config.json" &&
	same_as "$M/ds" "$WORK/deepspeed_z3.local" "mount deepspeed_z3 (config from the store)"

echo "== names in a store: folder markers, a file and a folder of one name"
# A Hugging Face folder with side files beside it: "notes" a file and a
# folder ("notes/old.txt"), "notes.txt" between them in key order, a
# folder marker ("extras/") and a file in it; folders are no side files.
upload hf/qwen2_single
printf 'side' >"$WORK/side"
for k in notes notes/old.txt notes.txt extras/ extras/a.json; do
	s3curl -f -T "$WORK/side" "$AWS_ENDPOINT_URL/$B/hf/qwen2_single/$k" >/dev/null ||
		fail "could not upload $k"
done
if mount_at "s3://$B/hf/qwen2_single" "$M/names"; then
	got=$(ls "$M/names" | tr '\n' ' ')
	want=$( (ls "$FIX/hf/qwen2_single" | grep -v '\.safetensors$'; echo notes; echo notes.txt; echo model.safetensors) |
		sort | tr '\n' ' ')
	[ "$got" = "$want" ] && cmp -s "$M/names/notes" "$WORK/side" &&
		echo "ok: names: $got" || fail "names: '$got', not '$want'"
fi

echo "== the cache on disk (--s3-cache): a second daemon fetches nothing again"
for i in 1 2; do
	if mount_at "s3://$B/fsdp/qwen2_fsdp1_w8" "$M/cached$i" --s3-cache "$WORK/s3cache,64MiB"; then
		same_as "$M/cached$i" "$WORK/fsdp1_w8.local" "cached mount $i"
		"$CKFS" stats --json "$M/cached$i" >"$WORK/cached$i.json"
		"$CKFS" umount "$M/cached$i"
	fi
done
python3 - "$WORK/cached1.json" "$WORK/cached2.json" <<'PY' || fail "cache: the second mount fetched again"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
print("ok: cache: first mount %d requests (%d bytes), second %d (%d bytes)" % (
    a["store_requests"], a["store_bytes"], b["store_requests"], b["store_bytes"]))
# the second: the listing alone
sys.exit(0 if a["store_requests"] > 1 and b["store_requests"] == 1 else 1)
PY
mkdir -p "$WORK/opencache" && chmod 0777 "$WORK/opencache"
if "$CKFS" export -q --s3-cache "$WORK/opencache,1GiB" "s3://$B/fsdp/qwen2_fsdp2_w2" "$WORK/no" \
	2>"$WORK/opencache.err"; then
	fail "cache: a folder others may write to was used"
else
	echo "ok: cache: refused: $(cat "$WORK/opencache.err")"
fi

echo "== faults: dropped, throttled and truncated answers"
python3 "$HERE/flaky_proxy.py" "${AWS_ENDPOINT_URL##*:}" >"$WORK/proxy.port" &
PROXY=$!
for i in $(seq 1 100); do
	[ -s "$WORK/proxy.port" ] && break
	sleep 0.1
done
mount_at "s3://$B/megatron/llama_tp2" "$M/flaky" --s3-endpoint "http://127.0.0.1:$(cat "$WORK/proxy.port")" &&
	same_as "$M/flaky" "$WORK/megatron.local" "through the flaky endpoint" &&
	"$CKFS" stats --json "$M/flaky" | python3 -c '
import json, sys
s = json.load(sys.stdin)
print("ok: through the flaky endpoint: %d requests, %d retried" % (s["store_requests"], s["store_retries"]))
# the first request of each kind fails twice or three times before it
# goes through (the same range asked again later goes through at once)
sys.exit(0 if s["store_retries"] >= 3 else 1)' ||
	fail "flaky endpoint: the faults were not met"
kill "$PROXY" 2>/dev/null
PROXY=

echo "== faults: an object overwritten while mounted"
cp -r "$FIX/mcore_dist/qwen2_tp2" "$WORK/changing"
upload_changing() { s3_put_tree "$WORK/changing" "$AWS_ENDPOINT_URL/$B/changing"; }
upload_changing || fail "could not upload the copy"
if mount_at "s3://$B/changing" "$M/changed"; then
	cmp -s "$M/changed/config.json" "$WORK/mcore_dist.local/config.json" ||
		fail "overwrite: config.json differs before the change"
	victim=$(cd "$WORK/changing" && find . -name '*.distcp' | sort | head -1)
	printf 'x' >>"$WORK/changing/$victim"
	s3curl -f -T "$WORK/changing/$victim" "$AWS_ENDPOINT_URL/$B/changing/${victim#./}" >/dev/null ||
		fail "could not overwrite $victim"
	if cat "$M/changed/model.safetensors" >"$WORK/changed.out" 2>"$WORK/changed.err"; then
		fail "overwrite: model.safetensors read although ${victim#./} changed"
	elif grep -q 'Input/output error' "$WORK/changed.err"; then
		echo "ok: overwrite: reading model.safetensors fails with EIO"
	else
		fail "overwrite: not EIO: $(cat "$WORK/changed.err")"
	fi
	alive "$M/changed" overwrite
fi

echo "== faults: the server killed mid-mount and started again"
# (nothing read before: a small model is one slice, cached once read)
if mount_at "s3://$B/fsdp/qwen2_fsdp1_w8" "$M/restart"; then
	kill -9 "$SEAWEED_PID"
	wait "$SEAWEED_PID" 2>/dev/null
	SEAWEED_PID=
	if cat "$M/restart/model.safetensors" >/dev/null 2>"$WORK/down.err"; then
		fail "server down: model.safetensors read anyway"
	elif grep -q 'Input/output error' "$WORK/down.err"; then
		echo "ok: server down: EIO"
	else
		fail "server down: not EIO: $(cat "$WORK/down.err")"
	fi
	alive "$M/restart" "server down"
	seaweedfs_start "$WORK/weed" || fail "the server did not start again"
	# It answers before its volumes are back (500 InternalError for a
	# second or so): wait until it serves an object again.
	for i in $(seq 1 120); do
		s3curl -fs -o /dev/null "$AWS_ENDPOINT_URL/$B/fsdp/qwen2_fsdp1_w8/huggingface/config.json" 2>/dev/null && break
		sleep 0.5
	done
	same_as "$M/restart" "$WORK/fsdp1_w8.local" "server back"
fi

echo "== a training run in the store: steps by polling"
upload run/fsdp_ppo
if mount_at "s3://$B/run/fsdp_ppo" "$M/run" -o s3_poll=1; then
	mount_at "$FIX/run/fsdp_ppo" "$M/run.local"
	want=$(cd "$M/run.local" && ls -d global_step_* | tr '\n' ' ')
	got=$(cd "$M/run" && ls -d global_step_* | tr '\n' ' ')
	[ "$got" = "$want" ] && echo "ok: run: steps $got" || fail "run: steps '$got', not '$want'"
	mkdir -p "$WORK/step7"
	cp -r "$FIX/run/fsdp_ppo/global_step_4/." "$WORK/step7/"
	s3_put_tree "$WORK/step7" "$AWS_ENDPOINT_URL/$B/run/fsdp_ppo/global_step_7" &&
		echo 7 >"$WORK/tracker" &&
		s3curl -f -T "$WORK/tracker" "$AWS_ENDPOINT_URL/$B/run/fsdp_ppo/latest_checkpointed_iteration.txt" \
			>/dev/null || fail "run: could not save step 7"
	for i in $(seq 1 120); do
		[ "$(readlink "$M/run/latest")" = global_step_7 ] && break
		sleep 0.5
	done
	if [ "$(readlink "$M/run/latest")" = global_step_7 ]; then
		echo "ok: run: step 7 shown and latest after it was saved"
		"$CKFS" export -q "$FIX/run/fsdp_ppo/global_step_4/actor" "$WORK/step4.local"
		same_as "$M/run/global_step_7/actor" "$WORK/step4.local" "run: step 7 (a copy of step 4)"
	else
		fail "run: latest is '$(readlink "$M/run/latest")' a minute after step 7 was saved"
	fi
fi

for m in "${MOUNTS[@]}"; do
	"$CKFS" umount "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null
done
MOUNTS=()
if [ "$fails" -gt 0 ]; then
	echo "$fails check(s) failed" >&2
	exit 1
fi
echo "all s3:// source checks passed"
