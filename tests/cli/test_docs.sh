#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# --help, the manual page and the bash completion cannot disagree: every
# command of `ckfs --help`, every option of every command's --help and
# every -o key of the mount's appear in the man page (in that command's
# section; the keys under MOUNT OPTIONS) and are offered by the completion,
# run as bash runs it. The man page renders without a groff warning, and
# the built files are what the binary prints. --version prints CMake's
# project version and the libraries.
# Usage: test_docs.sh CKFS_BINARY MAN_PAGE COMPLETION_SCRIPT VERSION
set -uo pipefail
CKFS=$1 MAN_PAGE=$2 COMPLETION=$3 VERSION=$4
WORK=$(mktemp -d /tmp/ckfs-docs.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
pass=0 fail=0

ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
check() { # NAME command...
	local name=$1
	shift
	if "$@"; then ok "$name"; else bad "$name"; fi
}

# ---- --version ----
"$CKFS" --version >"$WORK/version"
check "--version: 'ckfs $VERSION' (CMake's project version)" \
	test "$(head -1 "$WORK/version")" = "ckfs $VERSION"
check "--version: the libraries built with" \
	grep -qE '^built with libfuse [0-9.]+, libzip [0-9.]+, zlib [0-9.]+, cJSON [0-9.]+, xxHash [0-9.]+, libcurl [0-9.]+$' \
	"$WORK/version"

# ---- the built files are the binary's, and the page renders cleanly ----
"$CKFS" help --man >"$WORK/ckfs.1"
"$CKFS" help --bash-completion >"$WORK/completion"
check "the built man page is 'ckfs help --man'" cmp -s "$MAN_PAGE" "$WORK/ckfs.1"
check "the built completion is 'ckfs help --bash-completion'" cmp -s "$COMPLETION" "$WORK/completion"
groff -man -ww -z "$MAN_PAGE" 2>"$WORK/groff.err"
check "groff -man -ww: no warnings" test ! -s "$WORK/groff.err"
[ -s "$WORK/groff.err" ] && cat "$WORK/groff.err"
check "the man page's version is $VERSION" grep -q "^\.TH CKFS 1 .*\"ckfs $VERSION\"" "$MAN_PAGE"
# Rendered as text: ASCII hyphens, no hyphenation, lines long enough that
# an option's tag is never wrapped.
groff -man -Tascii -P-cbou -rLL=250n -rHY=0 "$MAN_PAGE" 2>/dev/null | sed 's/^ *//' >"$WORK/man.txt"
check "bash -n on the completion" bash -n "$COMPLETION"

# ---- what --help says, command by command ----
commands=$("$CKFS" --help | awk '/^  [a-z]/ { print $1 }')
check "ckfs --help lists commands" test -n "$commands"
# The man page's part between a heading and the next one.
man_section() { # HEADING-REGEX
	awk -v h="$1" '$0 ~ h { on = 1; next } on && /^(ckfs [a-z]+ |[A-Z][A-Z ]+$)/ { on = 0 } on' \
		"$WORK/man.txt"
}
# Completion candidates for a command line, as bash would ask for them.
complete_line() { # LINE
	bash -c 'source "$1"; COMP_LINE=$2; COMP_POINT=${#2}; COMPREPLY=(); _ckfs
		printf "%s\n" "${COMPREPLY[@]}"' complete "$COMPLETION" "$1"
}
# Options of `ckfs CMD --help`: "-x", "--long" from the option column.
help_options() { # CMD
	"$CKFS" "$1" --help | awk '/^  +-/ && !/^  -o [a-z_]+/ { sub(/^ +/, ""); print }' |
		grep -oE '^(-[a-zA-Z], )?--[a-z0-9-]+' | tr ',' '\n' | sed 's/^ *//'
}
# -o keys of `ckfs CMD --help`: "(-o key...)" after a long option, "-o key..." alone.
help_keys() { # CMD
	"$CKFS" "$1" --help | grep -oE '(^  -o |\(-o )[a-z0-9_]+' | sed 's/.*-o //'
}

man_commands=$(grep -oE '^ckfs [a-z]+' "$WORK/man.txt" | sort -u | cut -d' ' -f2)
completed=$(complete_line "ckfs ")
for cmd in $commands; do
	grep -qx "$cmd" <<<"$man_commands" || bad "man page: no command $cmd"
	grep -qx "$cmd" <<<"$completed" || bad "completion: command $cmd not offered"
	man_section "^ckfs $cmd [A-Z]" >"$WORK/section.$cmd"
	[ -s "$WORK/section.$cmd" ] || bad "man page: no section for ckfs $cmd"
	options=$(help_options "$cmd")
	[ -n "$options" ] || bad "ckfs $cmd --help: no options found"
	offered=$(complete_line "ckfs $cmd -")
	n=0 before=$fail
	for opt in $options; do
		n=$((n + 1))
		# a tag line: "-f, --foreground", "--dtype T, -o dtype=T"
		grep -qE -- "(^|, )$opt( |,|$)" "$WORK/section.$cmd" ||
			bad "man page, ckfs $cmd: no $opt"
		grep -qx -- "$opt" <<<"$offered" || bad "completion: ckfs $cmd $opt not offered"
	done
	[ "$fail" = "$before" ] && ok "ckfs $cmd: $n options of --help in the man page and the completion"
done

# ---- the mount's -o keys ----
man_section '^MOUNT OPTIONS$' >"$WORK/section.keys"
keys=$(help_keys mount)
check "ckfs mount --help shows -o keys" test -n "$keys"
offered=$(complete_line "ckfs mount -o ")
n=0 before=$fail
for key in $keys; do
	n=$((n + 1))
	grep -qE "^$key(=| |$)" "$WORK/section.keys" || bad "man page, MOUNT OPTIONS: no $key"
	grep -qxE "$key=?" <<<"$offered" || bad "completion: -o $key not offered"
done
[ "$fail" = "$before" ] && ok "ckfs mount: $n -o keys in the man page and the completion"

# ---- the completion in use: values, comma lists, what bash replaces ----
expect_completion() { # LINE EXPECTED...
	local line=$1 got want
	shift
	got=$(complete_line "$line" | tr '\n' ' ')
	want="$* "
	[ "$got" = "$want" ] && ok "completion of '$line'" ||
		bad "completion of '$line': got '$got', expected '$want'"
}
expect_completion "ckfs mo" mount
expect_completion "ckfs mount --cache-s" --cache-size
expect_completion "ckfs export --dtype f" fp16 f16 float16 fp32 f32 float32 float fp8
expect_completion "ckfs mount -o cache_s" cache_size=
expect_completion "ckfs mount -o dtype=fp" fp16 fp32 fp8    # bash replaces after '='
expect_completion "ckfs export --dtype w" w4a16
expect_completion "ckfs mount -o ro,dtype=bf16,slice_s" bf16,slice_size=
expect_completion "ckfs mount -o allow_ot" allow_other
expect_completion "ckfs help st" stats
expect_completion "ckfs export --config " # a path: bash's own completion
# Every value the parser takes is offered, and every word offered is
# taken (a word that is none exits 2). The parser's words, written down
# here apart from the table both come from (src/cli/options.c):
takes() { # OPTION-ARGS-PREFIX COMPLETION-LINE WORDS...
	local opt=$1 line=$2
	shift 2
	local offered
	offered=" $(complete_line "$line" | tr '\n' ' ')"
	for w in "$@"; do
		case "$offered" in *" $w "*) ;; *) bad "'$line' does not offer '$w'"; continue ;; esac
		if "$CKFS" mount $opt"$w" --help >/dev/null 2>&1; then
			ok "'$line' offers '$w', which the parser takes"
		else
			bad "'$line' offers '$w', which the parser refuses"
		fi
	done
	for w in $offered; do
		case " $* " in *" $w "*) ;; *) bad "'$line' offers '$w', not in this test's list" ;; esac
	done
	"$CKFS" mount $opt"no-such-value" --help >/dev/null 2>&1
	[ $? = 2 ] && ok "'${opt}no-such-value' is refused" || bad "'${opt}no-such-value' is taken"
}
takes "--dtype=" "ckfs mount --dtype " bf16 bfloat16 fp16 f16 float16 half fp32 f32 float32 float auto fp8 w4a16 nvfp4 q8_0 q4_0
takes "--lora=" "ckfs mount --lora " adapter fuse base
takes "--log-level=" "ckfs mount --log-level " err error warning warn notice info debug
takes "--transformers-version=" "ckfs mount --transformers-version " 5.10 5.23
takes "--format=" "ckfs mount --format " safetensors gguf
takes "-orank_checks=" "ckfs mount -o rank_checks=" mount read auto
(source "$COMPLETION" && complete -p ckfs | grep -q -- '-F _ckfs') &&
	ok "complete -F _ckfs ckfs" || bad "the script does not register _ckfs for ckfs"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
