#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ckfs export --format gguf without Python: each fixture of
# tests/fixtures/gguf/ in bf16, f16 and q8_0 has the sha256 of the file
# llama.cpp's unmodified converter writes for it (expected.json, recorded
# and re-checked against the live converter by tests/py/test_gguf.py);
# q4_0 is checked there. Plus: the file is the same read through a
# mount-free second export with 1 thread, refusals are one line with
# exit 1 and leave nothing, and broken tokenizer files never crash ckfs.
# The MoE actors (Qwen3-MoE, Qwen2-MoE) are compared with the test switch
# CKFS_GGUF_TEST_MOE_SPM=1, as tests/py/test_gguf.py records them: the
# converter reads their tokenizer as BPE only (docs/gguf.md).
# Usage: test_gguf.sh CKFS_BINARY FIXTURES_DIR
set -uo pipefail
CKFS=$1
FIX=$2/gguf
WORK=$(mktemp -d /tmp/ckfs-gguf.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

expected() { # CASE/TYPE -> its sha256 in expected.json
	sed -n "s|^  \"$1\": \"\([0-9a-f]\{64\}\)\",\{0,1\}$|\1|p" "$FIX/expected.json"
}

n=0
for c in llama_fsdp2_w2 llama_tied_fsdp2_w2 mistral_fsdp2_w2 qwen2_fsdp2_w2 qwen3_fsdp2_w2 \
	qwen3_moe_fsdp2_w2 qwen2_moe_fsdp2_w2; do
	spm=
	case $c in *_moe_*) spm=1 ;; esac
	for t in bf16 f16 q8_0; do
		want=$(expected "$c/$t")
		[ -n "$want" ] || { bad "$c/$t: no hash in expected.json"; continue; }
		dt=$t
		[ "$t" = f16 ] && dt=fp16
		rm -rf "$WORK/out"
		if ! CKFS_GGUF_TEST_MOE_SPM=$spm "$CKFS" export -q --format gguf --dtype "$dt" \
			--model-name tiny "$FIX/$c" "$WORK/out"; then
			bad "$c $t: export failed"
			continue
		fi
		got=$(sha256sum "$WORK/out/model.gguf" | cut -d' ' -f1)
		if [ "$got" = "$want" ] && [ "$(ls "$WORK/out")" = model.gguf ]; then
			ok "$c $t: the converter's bytes"
		else
			bad "$c $t: sha256 $got, the converter's $want"
		fi
		n=$((n + 1))
	done
done
[ "$n" = 21 ] && ok "21 files compared" || bad "compared $n files, not 21"

# refusals: one line (besides the model's warnings), exit 1, nothing left behind
refused() { # NAME PATTERN SRC [OPTIONS...]
	local name=$1 pat=$2 src=$3
	shift 3
	rm -rf "$WORK/never"
	"$CKFS" export --format gguf "$@" "$src" "$WORK/never" >"$WORK/o" 2>"$WORK/e"
	local rc=$?
	if [ "$rc" = 1 ] && [ "$(grep -vc '^ckfs: warning: ' "$WORK/e")" = 1 ] && grep -q -- "$pat" "$WORK/e" &&
		[ ! -e "$WORK/never" ]; then
		ok "$name: refused ($(cat "$WORK/e"))"
	else
		bad "$name: exit $rc, stderr: $(cat "$WORK/e")"
	fi
}
cp -r "$FIX/llama_fsdp2_w2" "$WORK/src"
HF=$WORK/src/huggingface
cp "$HF/tokenizer.model" "$WORK/tok"
head -c 1000 "$WORK/tok" >"$HF/tokenizer.model"
refused "truncated tokenizer.model" "tokenizer.model" "$WORK/src"
printf '\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01' >"$HF/tokenizer.model"
refused "a length past the end" "tokenizer.model" "$WORK/src"
printf '\x0a\x05\x0a\x01a\x18\x09' >"$HF/tokenizer.model"
refused "piece type 9" "piece type" "$WORK/src"
printf '\x12\x00' >"$HF/tokenizer.model"
refused "no pieces" "no pieces" "$WORK/src"
for seed in 1 2 3 4 5 6 7 8; do # bytes flipped anywhere: refused or served, never a crash
	cp "$WORK/tok" "$HF/tokenizer.model"
	printf "\\x$(printf %02x $((seed * 37 % 256)))" |
		dd of="$HF/tokenizer.model" bs=1 seek=$((seed * 997)) conv=notrunc status=none
	rm -rf "$WORK/fz"
	"$CKFS" export -q --format gguf "$WORK/src" "$WORK/fz" 2>/dev/null
	rc=$?
	[ "$rc" -le 1 ] && ok "flipped byte $seed: exit $rc" || bad "flipped byte $seed: exit $rc"
done
rm "$HF/tokenizer.model"
refused "no tokenizer.model" "no tokenizer.model" "$WORK/src"
cp "$WORK/tok" "$HF/tokenizer.model"
echo '{}' >"$HF/tokenizer.json"
refused "tokenizer.json" "tokenizer.json" "$WORK/src"
rm "$HF/tokenizer.json"
sed -i 's/"LlamaForCausalLM"/"GPT2LMHeadModel"/' "$HF/config.json"
refused "another architecture" "architecture GPT2LMHeadModel" "$WORK/src"
sed -i 's/"GPT2LMHeadModel"/"LlamaForCausalLM"/; s/"rope_type": "default"/"rope_type": "yarn"/' "$HF/config.json"
refused "yarn rope" "rope scaling" "$WORK/src"
refused "a LoRA actor" "plain models" "$2/lora/lora_qwen2_fsdp2_w2" --lora=fuse
refused "another MoE architecture" "architecture MixtralForCausalLM" \
	"$2/moe_fsdp/mixtral_fsdp2_w2"
refused "DeepSeek-V3 without scoring_func" "scoring_func missing" \
	"$2/moe_fsdp/deepseek_v3_fsdp2_w2"
refused "Qwen3-MoE's tokenizer.model" "tokenizer.model': the converter reads this architecture's tokenizer from tokenizer.json (byte-level BPE) only" "$FIX/qwen3_moe_fsdp2_w2"
CKFS_GGUF_TEST_MOE_SPM=1 refused "norm_topk_prob false" "norm_topk_prob false" \
	"$2/moe_fsdp/qwen3_moe_fsdp2_w2"

# byte-level BPE (tests/py/test_gguf_bpe.py serves it, on actors grown to its
# 151936 ids): the real Qwen2 tokenizer.json is named (its hash is in the
# converter's table) and then refused for the 320-id actor; with one merge
# less its hash is unknown, with another regex it is not run
rm -rf "$WORK/src"
cp -r "$FIX/qwen2_fsdp2_w2" "$WORK/src"
rm "$HF/tokenizer.model"
zcat "$2/gguf_bpe/qwen2.tokenizer.json.gz" >"$HF/tokenizer.json"
cp "$2/gguf_bpe/qwen2.tokenizer_config.json" "$HF/tokenizer_config.json"
refused "Qwen2's tokenizer.json on 320 ids" "tokenizer.json': .* past config.json's vocab_size" "$WORK/src"
sed -i '0,/^      "\xc4\xa0 \xc4\xa0",$/{//d}' "$HF/tokenizer.json"
refused "one merge less" "tokenizer.json': .*the converter does not recognize" "$WORK/src"
zcat "$2/gguf_bpe/qwen2.tokenizer.json.gz" | sed 's/|\\\\p{N}|/|\\\\p{N}+|/' >"$HF/tokenizer.json"
refused "another regex" "regex the GGUF view does not implement" "$WORK/src"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
