#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ckfs export --dtype w4a16 and nvfp4 without Python: each fixture of
# tests/fixtures/w4a16/ has the sha256 of the model.safetensors and
# config.json ckfs writes for it in each (expected.json: recorded by, and
# checked against compressed-tensors itself in, tests/py/test_ct_views.py);
# the same bytes with 1 thread; refusals are one line with exit 1 and leave
# nothing behind.
# Usage: test_ct_views.sh CKFS_BINARY FIXTURES_DIR
set -uo pipefail
CKFS=$1
FIXTURES=$2
FIX=$FIXTURES/w4a16
WORK=$(mktemp -d /tmp/ckfs-ct-views.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

expected() { # DTYPE/CASE/FILE -> its sha256 in expected.json
	sed -n "s|^  \"$1\": \"\([0-9a-f]\{64\}\)\",\{0,1\}$|\1|p" "$FIX/expected.json"
}

for case in w4a16/qwen2_fsdp2_w2 w4a16/edge_bf16 nvfp4/qwen2_fsdp2_w2 nvfp4/edge_bf16 \
	nvfp4/edge_nvfp4_bf16; do
	dt=${case%%/*} c=${case#*/}
	for threads in 0 1; do
		rm -rf "$WORK/out"
		opts=()
		[ "$threads" = 1 ] && opts=(--threads 1)
		if ! "$CKFS" export -q --dtype "$dt" "${opts[@]}" "$FIX/$c" "$WORK/out"; then
			bad "$case: export failed"
			continue
		fi
		for f in model.safetensors config.json; do
			want=$(expected "$case/$f")
			got=$(sha256sum "$WORK/out/$f" | cut -d' ' -f1)
			[ -n "$want" ] && [ "$got" = "$want" ] && ok "$case $f (threads ${threads/0/default}): the recorded bytes" ||
				bad "$case $f (threads ${threads/0/default}): sha256 $got, recorded '$want'"
		done
	done
done

# refusals: one line, exit 1, nothing left behind
refused() { # NAME PATTERN SRC [OPTIONS...]
	local name=$1 pat=$2 src=$3
	shift 3
	rm -rf "$WORK/never"
	"$CKFS" export "$@" "$src" "$WORK/never" >"$WORK/o" 2>"$WORK/e"
	local rc=$?
	if [ "$rc" = 1 ] && [ "$(grep -vc '^ckfs: warning: ' "$WORK/e")" = 1 ] && grep -qE -- "$pat" "$WORK/e" &&
		[ ! -e "$WORK/never" ]; then
		ok "$name: refused ($(cat "$WORK/e"))"
	else
		bad "$name: exit $rc, stderr: $(cat "$WORK/e")"
	fi
}
# hidden size 64: q_proj's input dim is not a multiple of the group
refused "input dim 64" "'model\.layers\.0\.self_attn\.q_proj\.weight': --dtype w4a16 quantizes in groups of 128 along the input dim, which 64 is not a multiple of" \
	"$FIXTURES/fsdp/qwen2_fsdp2_w2" --dtype w4a16
# NVFP4's groups are 16: a Qwen2-MoE expert's input dim 8 is not a multiple
refused "input dim 8" "'model\.layers\.0\.mlp\.experts\.0\.down_proj\.weight': --dtype nvfp4 quantizes in groups of 16 along the input dim, which 8 is not a multiple of" \
	"$FIXTURES/moe_fsdp/qwen2_moe_fsdp2_w2" --dtype nvfp4
refused "nvfp4 found nothing" "--dtype nvfp4 found no linear weight to quantize" "$FIX/qwen2_fsdp2_w2" --dtype nvfp4 --quant-skip 'proj'
# a skip pattern that leaves nothing to quantize (--fp8-skip: the
# former name of --quant-skip, still taken)
refused "every weight skipped" "found no linear weight to quantize" "$FIX/qwen2_fsdp2_w2" --dtype w4a16 --fp8-skip 'proj'
refused "bad skip pattern" "--quant-skip: '\(' is not a regular expression" "$FIX/qwen2_fsdp2_w2" --dtype w4a16 --quant-skip '('

# GGUF has its own types
"$CKFS" export --format gguf --dtype w4a16 "$FIX/qwen2_fsdp2_w2" "$WORK/never" 2>"$WORK/e"
[ $? = 2 ] && grep -q "takes --dtype bf16, fp16, q8_0 or q4_0" "$WORK/e" && ok "--format gguf --dtype w4a16: usage error" ||
	bad "--format gguf --dtype w4a16: $(cat "$WORK/e")"

# inspect lists the served tensors
"$CKFS" inspect --dtype w4a16 "$FIX/qwen2_fsdp2_w2" >"$WORK/i" 2>&1 &&
	grep -q "model.layers.0.mlp.down_proj.weight_packed" "$WORK/i" && grep -q "weight_scale" "$WORK/i" &&
	ok "inspect --dtype w4a16 lists the packed weights" || bad "inspect --dtype w4a16: $(head -c 600 "$WORK/i")"
"$CKFS" inspect --dtype nvfp4 "$FIX/qwen2_fsdp2_w2" >"$WORK/i" 2>&1 &&
	grep -q "model.layers.0.mlp.down_proj.weight_global_scale" "$WORK/i" && grep -q "F8_E4M3" "$WORK/i" &&
	ok "inspect --dtype nvfp4 lists the packed weights" || bad "inspect --dtype nvfp4: $(head -c 600 "$WORK/i")"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
