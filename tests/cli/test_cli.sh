#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The ckfs command line as a user meets it: exit codes, one-line errors that
# name the file and the cause, no partial output on failure, --force,
# sharded export, inspect --json, verify pass and fail.
# Usage: test_cli.sh CKFS_BINARY FIXTURES_DIR
set -uo pipefail
CKFS=$1
FIX=$2
WORK=$(mktemp -d /tmp/ckfs-cli.XXXXXX)
trap 'umount "$WORK/tiny" 2>/dev/null; rm -rf "$WORK"' EXIT
pass=0 fail=0

ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
# expect NAME STATUS PATTERN -- command...: exit status and one stderr line
expect() {
	local name=$1 status=$2 pattern=$3
	shift 4
	local err
	err=$("$@" 2>&1 >/dev/null)
	local rc=$?
	if [ "$rc" != "$status" ]; then
		bad "$name: exit $rc, expected $status ($err)"
	elif [ -n "$pattern" ] && ! printf '%s' "$err" | grep -qE -- "$pattern"; then
		bad "$name: stderr '$err' does not match '$pattern'"
	elif [ "$status" = 1 ] && [ "$(printf '%s\n' "$err" | wc -l)" != 1 ]; then
		bad "$name: expected one line, got: $err"
	else
		ok "$name"
	fi
}
SAMPLE=$FIX/fsdp/qwen2_fsdp2_w3
EXPECTED=$FIX/expected/qwen2_fsdp2_w3

"$CKFS" --version | grep -q '^ckfs ' && ok version || bad version
expect "unknown command" 2 "^ckfs: 'frobnicate' is not a ckfs command. See 'ckfs --help'.$" -- "$CKFS" frobnicate
# A mistyped command is never taken as the short mount form (ckfs SRC MNT,
# what mount.fuse3 runs), even with two arguments: git's suggestion instead.
expect "typo: a suggestion" 2 "^ckfs: 'inpsect' is not a ckfs command. Did you mean 'inspect'\?$" -- "$CKFS" inpsect "$SAMPLE"
expect "typo: never a mount" 2 "Did you mean 'mount'\?$" -- "$CKFS" mnt "$SAMPLE" "$WORK"
expect "typo: swapped letters" 2 "Did you mean 'export'\?$" -- "$CKFS" exprot "$SAMPLE" "$WORK/x"
expect "unknown option" 2 "^ckfs: unknown option '--frob'" -- "$CKFS" --frob
[ ! -e "$WORK/x" ] && ok "typo: nothing written" || bad "typo: nothing written"
# llama.cpp's and llama-quantize's spellings of the dtypes
"$CKFS" inspect --dtype f16 "$SAMPLE" | grep -q 'F32>F16' && ok "--dtype f16 is fp16" || bad "--dtype f16 is fp16"
"$CKFS" inspect --dtype BF16 "$SAMPLE" | grep -q 'F32>BF16' && ok "--dtype BF16 is bf16" || bad "--dtype BF16 is bf16"
expect "export without DIR" 2 "expected SRC and DIR" -- "$CKFS" export "$SAMPLE"
expect "bad dtype" 2 "unknown --dtype 'int7' \\(bf16, fp16, fp32, auto, fp8, w4a16, nvfp4, q8_0 or q4_0\\)" -- "$CKFS" export --dtype int7 "$SAMPLE" "$WORK/x"
expect "bad size" 2 "bad --max-shard-size '12XB' \\(a size such as" -- "$CKFS" export --max-shard-size 12XB "$SAMPLE" "$WORK/x"

# export: success, then refuse to overwrite, then --force
"$CKFS" export -q "$SAMPLE" "$WORK/out" && cmp -s "$WORK/out/model.safetensors" "$EXPECTED/model.safetensors" &&
	ok "export equals verl's output" || bad "export equals verl's output"
expect "existing DIR refused" 1 "^ckfs: '.*/out': already exists; use --force" -- "$CKFS" export -q "$SAMPLE" "$WORK/out"
touch "$WORK/out/stale-file"
"$CKFS" export -q --force "$SAMPLE" "$WORK/out" && [ ! -e "$WORK/out/stale-file" ] &&
	cmp -s "$WORK/out/model.safetensors" "$EXPECTED/model.safetensors" && ok "--force replaces" || bad "--force replaces"
ls "$WORK" | grep -q ckfs- && bad "no temporary folders left" || ok "no temporary folders left"

# failures leave nothing behind
expect "missing source" 1 "^ckfs: '/nonexistent/ckpt': not found$" -- "$CKFS" export /nonexistent/ckpt "$WORK/none"
mkdir "$WORK/empty"
expect "not a checkpoint" 1 "not a verl FSDP checkpoint" -- "$CKFS" export "$WORK/empty" "$WORK/none"
cp -r "$SAMPLE" "$WORK/norank"
rm "$WORK/norank/model_world_size_3_rank_1.pt"
expect "missing rank" 1 "model_world_size_3_rank_1.pt': not found \(rank 1 is needed\)" -- "$CKFS" export "$WORK/norank" "$WORK/none"
cp -r "$SAMPLE" "$WORK/nocfg"
rm "$WORK/nocfg/huggingface/config.json"
expect "missing config" 1 "config.json': not found; pass --config PATH" -- "$CKFS" export "$WORK/nocfg" "$WORK/none"
"$CKFS" export -q --config "$SAMPLE/huggingface/config.json" "$WORK/nocfg" "$WORK/withcfg" &&
	ok "--config" || bad "--config"
cp -r "$SAMPLE" "$WORK/trunc"
truncate -s 5000 "$WORK/trunc/model_world_size_3_rank_2.pt"
expect "truncated rank file" 1 "model_world_size_3_rank_2.pt" -- "$CKFS" export "$WORK/trunc" "$WORK/none"
[ ! -e "$WORK/none" ] && ! ls "$WORK" | grep -q "none.ckfs" && ok "failed exports leave no output" ||
	bad "failed exports leave no output"

# values ckfs cannot serve are refused naming the file and the key
EDGE=$FIX/edge
expect "non-tensor value" 1 "rank_0.pt': value of 'step' is not a supported tensor \(int\)" -- "$CKFS" inspect "$EDGE/refused_value_w1"
expect "quantized tensor" 1 "value of 'qweight' is not a supported tensor \(call torch._utils._rebuild_qtensor\)" -- "$CKFS" inspect "$EDGE/refused_quantized_w1"
expect "Partial placement" 1 "rank_0.pt': tensor 'weight': Partial placement \(unreduced values\) is not supported" -- "$CKFS" export "$EDGE/refused_partial_w2" "$WORK/none"
cp -r "$SAMPLE" "$WORK/legacy"
cp "$FIX/zip/legacy.pt" "$WORK/legacy/model_world_size_3_rank_0.pt"
expect "legacy torch format" 1 "legacy \(non-zip\) torch.save format is not supported" -- "$CKFS" inspect "$WORK/legacy"

# dtype and sharding
"$CKFS" export -q --dtype fp32 "$SAMPLE" "$WORK/fp32" && grep -q '"dtype": "float32"\|"torch_dtype": "float32"' "$WORK/fp32/config.json" &&
	ok "fp32 export, config dtype" || bad "fp32 export, config dtype"
grep -q '"dtype": "bfloat16"\|"torch_dtype": "bfloat16"' "$WORK/out/config.json" && ok "bf16 config dtype" || bad "bf16 config dtype"
"$CKFS" export -q --max-shard-size 100KB "$SAMPLE" "$WORK/sharded" &&
	[ -f "$WORK/sharded/model.safetensors.index.json" ] && [ ! -e "$WORK/sharded/model.safetensors" ] &&
	ls "$WORK/sharded" | grep -q 'model-00001-of-0000[0-9].safetensors' && ok "sharded export" || bad "sharded export"
"$CKFS" verify "$SAMPLE" --against "$WORK/sharded" >/dev/null && ok "verify sharded" || bad "verify sharded"

# inspect
"$CKFS" inspect --json "$SAMPLE" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["world_size"]==3 and len(d["tensors"])==27, d' &&
	ok "inspect --json" || bad "inspect --json"
"$CKFS" inspect "$SAMPLE" | grep -q "Shard(0)" && ok "inspect text" || bad "inspect text"

# verify: pass, then fail on a changed reference
"$CKFS" verify "$SAMPLE" --against "$EXPECTED" >/dev/null && ok "verify passes" || bad "verify passes"
cp -r "$EXPECTED" "$WORK/ref"
python3 - "$WORK/ref/model.safetensors" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[-2] ^= 0x01
open(p, "wb").write(b)
PY
"$CKFS" verify "$SAMPLE" --against "$WORK/ref" >"$WORK/verify.out"
[ $? = 1 ] && grep -q "values differ" "$WORK/verify.out" && ok "verify fails on changed values" ||
	bad "verify fails on changed values"
"$CKFS" verify --atol 1 "$SAMPLE" --against "$WORK/ref" >/dev/null && ok "verify --atol" || bad "verify --atol"

# Control characters in names and paths are escaped in every message:
# one error is one line, and nothing reaches the terminal as a control.
mkdir "$WORK/bad"$'\n'"name"$'\e[31m'
expect "newline and ESC in a path" 1 "bad\\\\x0aname\\\\x1b\\[31m': not a verl FSDP checkpoint" -- \
	"$CKFS" inspect "$WORK/bad"$'\n'"name"$'\e[31m'
expect "C1 control in an option value" 2 "unknown --dtype 'x\\\\xc2\\\\x9by'" -- "$CKFS" export --dtype x$'\xc2\x9b'y "$SAMPLE" "$WORK/x"
rmdir "$WORK/bad"$'\n'"name"$'\e[31m'

# An export never deletes or overwrites what it reads (docs/reliability.md):
# DIR must not be SRC or above it (through symlinks too), and --force must
# not replace a folder holding a file the plan reads. Each refusal names
# both paths and leaves every file where it was.
cp -r "$SAMPLE" "$WORK/own"
OWN=$(cd "$WORK/own" && pwd -P)
snapshot() { (cd "$WORK" && find own -printf '%p %s %T@\n' | sort); }
before=$(snapshot)
expect "DIR is SRC" 1 "^ckfs: '.*/own': is the checkpoint '$OWN' or a folder above it" -- \
	"$CKFS" export -q --force "$WORK/own" "$WORK/own"
expect "DIR is SRC (trailing slash)" 1 "is the checkpoint '$OWN'" -- \
	"$CKFS" export -q --force "$WORK/own" "$WORK/own/"
expect "DIR above SRC" 1 "^ckfs: '$WORK': is the checkpoint '$OWN' or a folder above it" -- \
	"$CKFS" export -q --force "$WORK/own" "$WORK"
ln -s own "$WORK/own-link"
expect "DIR a symlink to SRC" 1 "own-link': is the checkpoint '$OWN'" -- \
	"$CKFS" export -q --force "$WORK/own" "$WORK/own-link"
expect "DIR the checkpoint's huggingface/" 1 "own/huggingface': is the checkpoint's Hugging Face folder.*export to a new folder, e.g. '$OWN/merged'" -- \
	"$CKFS" export -q --force "$WORK/own" "$WORK/own/huggingface"
mkdir "$WORK/cfgdir" && cp "$SAMPLE/huggingface/config.json" "$WORK/cfgdir/"
expect "DIR holding the --config file" 1 "cfgdir': holds '.*cfgdir/config.json', which this export reads" -- \
	"$CKFS" export -q --force --config "$WORK/cfgdir/config.json" "$WORK/own" "$WORK/cfgdir"
expect "DIR '.'" 1 "name the folder to write" -- "$CKFS" export -q --force "$WORK/own" "$WORK/own/."
[ "$(snapshot)" = "$before" ] && [ -f "$WORK/cfgdir/config.json" ] && ok "refused exports touch nothing" ||
	bad "refused exports touch nothing"
"$CKFS" export -q "$WORK/own" "$WORK/own/merged" && cmp -s "$WORK/own/merged/model.safetensors" "$EXPECTED/model.safetensors" &&
	ok "a new DIR inside SRC is allowed" || bad "a new DIR inside SRC is allowed"
"$CKFS" export -q --force "$WORK/own" "$WORK/own/merged" && ok "--force on a DIR inside SRC" || bad "--force on a DIR inside SRC"
rm -rf "$WORK/own/merged"
echo x > "$WORK/afile"
expect "--force on a file" 1 "afile': not a folder; --force replaces only a folder" -- \
	"$CKFS" export -q --force "$SAMPLE" "$WORK/afile"
[ "$(cat "$WORK/afile")" = x ] && ok "the file is kept" || bad "the file is kept"

# A killed export's temporary folder is removed by the next export to the
# same DIR (its process is gone and its lock is free); a live export's is
# not (this shell's pid stands for a live one; a lock held by this shell
# for a live one whose pid was reused). An old folder left by a killed
# --force is removed once DIR exists again, kept (and pointed out) if not.
( exec true ) & dead=$!; wait $dead
mkdir -p "$WORK/k.ckfs-tmp-$dead" "$WORK/k.ckfs-tmp-$$" "$WORK/k.ckfs-tmp-${dead}x"
touch "$WORK/k.ckfs-tmp-$dead/model.safetensors"
"$CKFS" export -q "$SAMPLE" "$WORK/k" 2>"$WORK/k.err"
[ ! -e "$WORK/k.ckfs-tmp-$dead" ] && grep -q "removed '.*k.ckfs-tmp-$dead', left by an interrupted export (process $dead, gone)" "$WORK/k.err" &&
	ok "stale temporary folder removed" || bad "stale temporary folder removed: $(cat "$WORK/k.err")"
[ -d "$WORK/k.ckfs-tmp-$$" ] && [ -d "$WORK/k.ckfs-tmp-${dead}x" ] && ok "a live export's folder and other names are kept" ||
	bad "a live export's folder and other names are kept"
mkdir -p "$WORK/k.ckfs-old-$dead"
"$CKFS" export -q --force "$SAMPLE" "$WORK/k" 2>"$WORK/k.err"
[ ! -e "$WORK/k.ckfs-old-$dead" ] && ok "stale old folder removed once DIR exists" || bad "stale old folder removed once DIR exists"
mkdir -p "$WORK/n.ckfs-old-$dead"
"$CKFS" export -q "$SAMPLE" "$WORK/n" 2>"$WORK/n.err"
[ -d "$WORK/n.ckfs-old-$dead" ] && grep -q "n.ckfs-old-$dead' holds what '.*/n' held before an interrupted --force export.*kept" "$WORK/n.err" &&
	ok "stale old folder kept while DIR was missing" || bad "stale old folder kept while DIR was missing: $(cat "$WORK/n.err")"
mkdir "$WORK/m.ckfs-tmp-$dead"
exec 9<"$WORK/m.ckfs-tmp-$dead"
flock -x 9
"$CKFS" export -q "$SAMPLE" "$WORK/m" 2>/dev/null
[ -d "$WORK/m.ckfs-tmp-$dead" ] && ok "a locked temporary folder is kept" || bad "a locked temporary folder is kept"
exec 9<&-
rm -rf "$WORK"/k* "$WORK"/m* "$WORK"/n*

# plain (non-DTensor) tensors saved on every rank: verify compares every
# rank's copy with the served one, as verl's merger refuses copies that differ
for c in plain_copies_w2 copies_differ_w2 copies_differ_scalar_w3 copies_differ_hsdp_2x2; do
	"$CKFS" export -q "$EDGE/$c" "$WORK/ref-$c" || bad "export $c"
done
"$CKFS" verify "$EDGE/plain_copies_w2" --against "$WORK/ref-plain_copies_w2" >"$WORK/verify.out" &&
	grep -q "^copies: 5 plain tensors, 5 copies on other ranks, all equal" "$WORK/verify.out" &&
	ok "verify: equal copies on every rank" || bad "verify: equal copies on every rank"
expect "verify: copies differ" 1 "copies_differ_w2/model_world_size_2_rank_1.pt': tensor 'model.embed_tokens.weight' differs between ranks 0 and 1 \(1 of 24 elements; " -- \
	"$CKFS" verify "$EDGE/copies_differ_w2" --against "$WORK/ref-copies_differ_w2"
expect "verify: 0-d copies differ" 1 "rank_2.pt': tensor 'model.step' differs between ranks 0 and 2 \(1 of 1 elements; " -- \
	"$CKFS" verify "$EDGE/copies_differ_scalar_w3" --against "$WORK/ref-copies_differ_scalar_w3"
expect "verify: HSDP replica copy differs" 1 "rank_3.pt': tensor 'model.rotary.inv_freq' differs between ranks 0 and 3 \(1 of 5 elements; " -- \
	"$CKFS" verify "$EDGE/copies_differ_hsdp_2x2" --against "$WORK/ref-copies_differ_hsdp_2x2"
"$CKFS" inspect --json "$EDGE/copies_differ_w2" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["ranks_read"]==[0, 1], d["ranks_read"]' &&
	ok "inspect: every rank of a plain checkpoint read" || bad "inspect: every rank of a plain checkpoint read"

# keys of wrapped modules: one warning counting the names served without the
# wrappers; FSDP1 flat parameters refused naming the state dict type to use
WRAPPED=$FIX/wrapped
err=$("$CKFS" export "$WRAPPED/compiled_ddp_w2" "$WORK/wrapped" 2>&1 >/dev/null | grep warning)
[ "$err" = "ckfs: warning: 12 of 12 tensor names carried torch wrapper names (_orig_mod., leading module.), served without them" ] &&
	ok "wrapper names: one warning" || bad "wrapper names: one warning, got: $err"
"$CKFS" verify --dtype fp32 "$WRAPPED/compiled_ddp_w2" --against "$WRAPPED/original" >/dev/null 2>&1 &&
	ok "wrapper names: served as the unwrapped model" || bad "wrapper names: served as the unwrapped model"
expect "FSDP1 LOCAL_STATE_DICT" 1 "rank_0.pt': '_flat_param' is an FSDP1 flat parameter .*; save the state dict with StateDictType.SHARDED_STATE_DICT$" -- \
	"$CKFS" export "$WRAPPED/refused_fsdp1_local_w2" "$WORK/none"

# LoRA actors: the modes, --base, what each refuses
LORA=$FIX/lora
expect "--lora value" 2 "unknown --lora 'merge' \\(adapter, fuse or base\\)" -- "$CKFS" export --lora=merge "$LORA/lora_qwen2_fsdp2_w2" "$WORK/x"
expect "--lora-alpha value" 2 "bad --lora-alpha '1.5' \\(a whole number from 1 to 2147483647\\)" -- "$CKFS" export --lora-alpha 1.5 "$LORA/lora_qwen2_fsdp2_w2" "$WORK/x"
expect "fuse without lora_alpha" 1 "lora_qwen2_fsdp2_w2_nometa': lora_alpha is not recorded \(lora_train_meta.json\): --lora=fuse needs it; pass --lora-alpha N as trained$" -- \
	"$CKFS" export --lora=fuse "$LORA/lora_qwen2_fsdp2_w2_nometa" "$WORK/none"
expect "fuse of an adapter alone" 1 "holds a LoRA adapter only \(save_lora_only\): --lora=fuse needs the base weights; pass --base DIR$" -- \
	"$CKFS" export --lora=fuse "$LORA/lora_qwen2_fsdp2_w2_loraonly" "$WORK/none"
expect "--base beside base weights" 1 "lora_qwen2_fsdp2_w2' holds its base weights: --base is for LoRA checkpoints saved with the adapter only$" -- \
	"$CKFS" export --base "$EXPECTED" "$LORA/lora_qwen2_fsdp2_w2" "$WORK/none"
expect "--base for a plain checkpoint" 1 "qwen2_fsdp2_w3' is not a LoRA adapter saved alone: --base is for those$" -- \
	"$CKFS" export --base "$EXPECTED" "$SAMPLE" "$WORK/none"
# a base of another model: its model_type, or its shapes, do not fit
expect "--base of another model_type" 1 "config.json': model_type llama, but the LoRA checkpoint's is qwen2$" -- \
	"$CKFS" export --base "$FIX/expected/llama_fsdp1_sharded_w2" "$LORA/lora_qwen2_fsdp2_w2_loraonly" "$WORK/none"
expect "--base of other shapes" 1 "base weight 'model.layers.0.mlp.down_proj.weight' is not \[32, 64\], the shape of its LoRA adapter$" -- \
	"$CKFS" export --base "$EXPECTED" "$LORA/lora_qwen2_fsdp2_w2_loraonly" "$WORK/none"
[ ! -e "$WORK/none" ] && ok "LoRA refusals write nothing" || bad "LoRA refusals write nothing"
# an adapter saved alone exports as the adapter folder, saying so
err=$("$CKFS" export "$LORA/lora_qwen2_fsdp2_w2_loraonly" "$WORK/adapter" 2>&1 >/dev/null | grep warning)
[ "$err" = "ckfs: warning: a LoRA adapter only (saved with save_lora_only): served as the adapter folder; pass --base DIR for the whole model" ] &&
	[ "$(ls "$WORK/adapter" | tr '\n' ' ')" = "adapter_config.json adapter_model.safetensors " ] &&
	ok "adapter saved alone: the adapter folder" || bad "adapter saved alone: the adapter folder ($err; $(ls "$WORK/adapter"))"
# lora_adapter/ is written, synced and removed with the folder
"$CKFS" export -q "$LORA/lora_qwen2_fsdp2_w2" "$WORK/lora" &&
	cmp -s "$WORK/lora/lora_adapter/adapter_model.safetensors" "$FIX/expected_lora/lora_qwen2_fsdp2_w2/lora_adapter/adapter_model.safetensors" &&
	"$CKFS" export -q --force --lora=base "$LORA/lora_qwen2_fsdp2_w2" "$WORK/lora" && [ ! -e "$WORK/lora/lora_adapter" ] &&
	ok "export: lora_adapter/, then --force --lora=base without it" || bad "export: lora_adapter/, then --force --lora=base without it"
"$CKFS" inspect --json --lora=fuse "$LORA/lora_qwen2_fsdp2_w2" | python3 -c '
import json, sys
d = json.load(sys.stdin)["lora"]
assert (d["mode"], d["r"], d["lora_alpha"], len(d["adapter_tensors"])) == ("fuse", 8, 16, 28), d' &&
	ok "inspect: the LoRA adapter" || bad "inspect: the LoRA adapter"

# a Trainer checkpoint-N/ holds the model's files beside the run's: only the
# model's are served
files=$("$CKFS" inspect "$FIX/deepspeed/trainer_z2_w2_bf16" | sed -n 's/^files: //p')
[ "$files" = "config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json" ] &&
	ok "training artifacts are not side files" || bad "training artifacts are not side files: $files"

# a training run: export names what to export instead; inspect lists the
# steps, their state and roles, the refused names
RUNFIX=$FIX/run/fsdp_ppo
expect "export of a run" 1 "a training run \(global_step_<N>/ folders\); export one role of a step" -- \
	"$CKFS" export "$RUNFIX" "$WORK/none"
cp -a "$RUNFIX" "$WORK/run" && mkdir "$WORK/run/global_step_007"
out=$("$CKFS" inspect "$WORK/run")
grep -q "^global_step_4  shown" <<<"$out" && grep -q "^global_step_5  hidden: newer than the tracker" <<<"$out" &&
	grep -q "^  critic       verl-fsdp, world size 2" <<<"$out" &&
	grep -q "^ignored        global_step_007: leading zero in the step number" <<<"$out" &&
	ok "inspect: a run" || bad "inspect: a run: $out"
"$CKFS" inspect --json "$WORK/run" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["kind"] == "run" and d["latest"] == "global_step_4" and d["tracker"]["step"] == 4, d
st = {s["name"]: s["state"] for s in d["steps"] if s["state"] != "left out"}  # rotated: empty folders
assert st == {"global_step_3": "shown", "global_step_4": "shown", "global_step_5": "hidden"}, st' &&
	ok "inspect --json: a run" || bad "inspect --json: a run"
# a role folder that is a symlink out of the run is refused like any file
# leading outside the checkpoint (the mount shows it empty), unless
# --follow-symlinks
mkdir "$WORK/outside" && mv "$WORK/run/global_step_4/critic" "$WORK/outside/critic" &&
	ln -s "$WORK/outside/critic" "$WORK/run/global_step_4/critic"
out=$("$CKFS" inspect "$WORK/run")
grep -q "^  critic       .*critic': symlink leads outside the checkpoint; use --follow-symlinks" <<<"$out" &&
	grep -q "^  actor        verl-fsdp" <<<"$out" &&
	ok "inspect: a role linked out of the run" || bad "inspect: a role linked out of the run: $out"
out=$("$CKFS" inspect --follow-symlinks "$WORK/run")
[ "$(grep -c "^  critic       verl-fsdp, world size 2" <<<"$out")" = 2 ] &&
	ok "inspect --follow-symlinks: a role linked out of the run" ||
	bad "inspect --follow-symlinks: a role linked out of the run: $out"
expect "bad max_plans" 2 "bad -o max_plans '0' \\(a whole number from 1 to 4096\\)" -- "$CKFS" mount -o max_plans=0 "$RUNFIX" "$WORK/none"
# Values are checked by their option's kind (src/cli/options.h), the
# defaults come from the same rows and --help shows them.
expect "a tolerance is a number" 2 "bad --atol 'x' \\(a number from 0\\)" -- "$CKFS" verify --atol x --against "$SAMPLE" "$SAMPLE"
expect "a umask is octal" 2 "bad -o umask '0999' \\(octal, 0 to 0777\\)" -- "$CKFS" mount -o umask=0999 "$SAMPLE" "$WORK/none"
expect "a count has bounds" 2 "bad --threads '257' \\(a whole number from 1 to 256\\)" -- "$CKFS" mount --threads 257 "$SAMPLE" "$WORK/none"
help=$("$CKFS" mount --help)
grep -q "slice cache budget (default 1GiB)" <<<"$help" && grep -q "(default bf16)" <<<"$help" &&
	ok "--help shows the rows' defaults" || bad "--help shows the rows' defaults: $help"

# The plan cache (docs/mount.md): a folder others may write, or that is not
# this user's, is not used (no record read or written) and says so in one
# line; a record is as trusted as the user's own files: one this user
# forged, checksum recomputed, is used; the same record owned by another
# user, or in a folder others may write, is not.
PC=$WORK/plans
mkdir -m 0777 "$PC" && chmod 0777 "$PC"
pc_inspect() { CKFS_PLAN_CACHE=$PC "$CKFS" inspect --log-level info "$SAMPLE" 2>&1 >/dev/null; }
out=$(pc_inspect; pc_inspect)
[ "$(grep -c "^ckfs: warning: '$PC': plan cache folder writable by others (mode 0777, owner $(id -u)); plan cache off" <<<"$out")" = 2 ] &&
	[ "$(wc -l <<<"$out")" = 2 ] && [ -z "$(ls -A "$PC")" ] &&
	ok "plan cache: a folder others may write is not used, one line each time" ||
	bad "plan cache: a folder others may write is not used: $out; $(ls -A "$PC")"
chmod 0700 "$PC"
out=$(pc_inspect; pc_inspect)
rec=$(ls "$PC"/*.plan 2>/dev/null | head -1)
[ -n "$rec" ] && ! grep -q warning <<<"$out" && [ "$(grep -c "from the plan cache" <<<"$out")" = 1 ] &&
	ok "plan cache: a folder of ours is used" || bad "plan cache: a folder of ours is used: $out"
# forge: the first position moved, the checksum (FNV-1a 64 over the
# identity text and the values) recomputed, in place
forged=$(python3 - "$rec" <<'PY'

import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
lines, at = 0, 0
while lines < 4 or lines < 4 + int(b[:at].split(b"\n")[3].split()[0]):
    at = b.index(b"\n", at) + 1
    lines += 1
n = struct.unpack_from("<Q", b, at)[0]
v = list(struct.unpack_from(f"<{n}Q", b, at + 8))
v[0] += 64
def fnv(h, data):
    for c in data:
        h = ((h ^ c) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h
vals = struct.pack(f"<{n}Q", *v)
b[at + 8:] = vals + struct.pack("<Q", fnv(fnv(0xcbf29ce484222325, bytes(b[:at])), vals))
open(sys.argv[1], "r+b").write(b)
print("forged")
PY
)
[ "$forged" = forged ] && grep -q "from the plan cache" <<<"$(pc_inspect)" &&
	ok "plan cache: a record this user forged is trusted (the documented boundary)" ||
	bad "plan cache: a record this user forged is trusted ($forged)"
if [ "$(id -u)" = 0 ]; then
	chown nobody "$rec"
	out=$(pc_inspect)
	! grep -q "from the plan cache" <<<"$out" && ok "plan cache: a record owned by another user is not used" ||
		bad "plan cache: a record owned by another user is not used: $out"
	rm -f "$PC"/*.plan && chown nobody "$PC"
	out=$(pc_inspect)
	grep -q "^ckfs: warning: '$PC': plan cache folder not owned by this user" <<<"$out" && [ -z "$(ls -A "$PC")" ] &&
		ok "plan cache: a folder of another user is not used" ||
		bad "plan cache: a folder of another user is not used: $out"
else
	echo "note: plan cache cases of another user's files not run (needs root to chown)"
fi

# ckfs diff: usage, refusals, output (the figures: tests/py/test_diff.py)
HIST=$FIX/history
expect "diff without A" 2 "expected A and \[B\]" -- "$CKFS" diff
expect "diff with three" 2 "expected A and \[B\]" -- "$CKFS" diff "$SAMPLE" "$SAMPLE" "$SAMPLE"
expect "diff of one checkpoint" 2 "expected A and B, or a training run alone" -- "$CKFS" diff "$SAMPLE"
expect "diff of a run and B" 1 "^ckfs: '.*fsdp_ppo': a training run .*compare two of its roles" -- \
	"$CKFS" diff "$FIX/run/fsdp_ppo" "$SAMPLE"
expect "diff of a missing B" 1 "^ckfs: '/nonexistent/b': not found$" -- "$CKFS" diff "$SAMPLE" /nonexistent/b
mkdir -p "$WORK/onestep"
cp -r "$HIST/frozen_run/global_step_1" "$WORK/onestep/" && echo 1 >"$WORK/onestep/latest_checkpointed_iteration.txt"
expect "diff of a run of one step" 1 "a run with 1 complete step; diff compares consecutive steps" -- \
	"$CKFS" diff "$WORK/onestep"
expect "diff --svg into a missing folder" 1 "^ckfs: '$WORK/none/x.svg.ckfs-tmp-[0-9]+': cannot create" -- \
	"$CKFS" diff --svg "$WORK/none/x.svg" "$HIST/frozen_run"
out=$("$CKFS" diff "$HIST/frozen_run/global_step_1/actor" "$HIST/frozen_run/global_step_2/actor")
grep -qE '^model\.layers\.0\.mlp\.up_proj\.weight +identical *$' <<<"$out" &&
	grep -qE '^model\.layers\.1\.mlp\.up_proj\.weight +changed +[0-9.e-]+ +[0-9.e-]+ +0\.[0-9]+ +[0-9]+ of 2048$' <<<"$out" &&
	grep -qE '^total +39 +13 +26 +0 ' <<<"$out" && ok "diff: text per tensor and in total" ||
	bad "diff: text per tensor and in total: $out"
"$CKFS" diff --svg "$WORK/run.svg" "$HIST/lora_run" >"$WORK/run.txt" && grep -q '^<svg ' "$WORK/run.svg" &&
	grep -qE '^  global_step_1 -> global_step_2: 28 of 55 tensors changed, 27 identical' "$WORK/run.txt" &&
	! ls "$WORK" | grep -q 'ckfs-tmp' && ok "diff RUN: the pairs and the picture" ||
	bad "diff RUN: the pairs and the picture: $(cat "$WORK/run.txt")"

# a full disk fails before anything lands (root only: needs a tiny tmpfs)
if [ "$(id -u)" = 0 ] && mkdir -p "$WORK/tiny" && mount -t tmpfs -o size=64k tmpfs "$WORK/tiny" 2>/dev/null; then
	expect "full disk" 1 "No space left on device" -- "$CKFS" export -q "$SAMPLE" "$WORK/tiny/out"
	[ -z "$(ls -A "$WORK/tiny")" ] && ok "full disk leaves nothing" || bad "full disk leaves nothing"
	umount "$WORK/tiny"
else
	echo "note: full-disk case not run (needs root to mount a tmpfs)"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
