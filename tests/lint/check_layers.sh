#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The layering rules of docs/architecture.md, checked on every #include:
# each module may include only the modules below it, and each third-party
# library lives in one module. Prints every broken rule and fails on any.
# Usage: check_layers.sh REPO_ROOT
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$ROOT" || exit 1

# Which module a public header belongs to.
header_module() {
	case $1 in
	arena | err | log | text | json | dtype | limits | units | strbuf | hash | md5 | io) echo util ;;
	zip | pickle | torch | safetensors) echo fmt ;;
	model) echo model ;;
	layouts | run) echo layouts ;;
	folder | weights | perm | gguf) echo folder ;;
	history) echo history ;;
	cache) echo cache ;;
	s3 | remote | file) echo store ;;
	*) echo "?$1" ;;
	esac
}
# What each module may include (itself included).
allowed() {
	case $1 in
	util) echo "util" ;;
	fmt) echo "util store fmt" ;;
	model) echo "util store model" ;;
	layouts) echo "util store fmt model layouts" ;;
	folder) echo "util store model folder" ;;
	history) echo "util model history" ;;
	cache) echo "util cache" ;;
	store) echo "util store" ;;
	fuse) echo "util store model layouts folder cache fuse" ;;
	cli) echo "util fmt model layouts folder history cache store fuse cli" ;;
	esac
}
# Third-party headers and the modules they may appear in.
library_home() {
	case $1 in
	fuse*.h) echo "fuse" ;;
	zip.h | zlib.h) echo "fmt" ;;
	xxhash.h | xxh_x86dispatch.h) echo "cache store" ;;
	curl/curl.h) echo "store" ;;
	cjson/cJSON.h) echo "util fmt layouts folder cli" ;;
	*) echo "*" ;;
	esac
}

bad=0 checked=0
check_file() { # FILE MODULE
	local file=$1 mod=$2 inc target ok home
	while read -r inc; do
		checked=$((checked + 1))
		case $inc in
		\"ckfs/*) target=$(header_module "$(basename "${inc#\"ckfs/}" .h\")") ;;
		\"*/*) target=${inc#\"}; target=${target%%/*} ;;
		\<*) home=$(library_home "${inc:1:${#inc}-2}")
			if [ "$home" != "*" ] && [[ " $home " != *" $mod "* ]]; then
				echo "$file: includes $inc, which belongs in $home only"
				bad=$((bad + 1))
			fi
			continue ;;
		*) continue ;;
		esac
		if [[ $target == \?* ]]; then
			echo "$file: includes $inc, a header no module owns (add it to $0)"
			bad=$((bad + 1))
		elif [[ " $(allowed "$mod") " != *" $target "* ]]; then
			echo "$file: $mod includes $inc ($target): $mod may include only $(allowed "$mod")"
			bad=$((bad + 1))
		fi
	done < <(sed -n 's/^#include \([<"][^>"]*[>"]\).*/\1/p' "$file")
}

for f in src/*/*.[ch]; do
	mod=${f#src/}
	check_file "$f" "${mod%%/*}"
done
for f in include/ckfs/*.h; do
	m=$(header_module "$(basename "$f" .h)")
	if [[ $m == \?* ]]; then
		echo "$f: no module owns this header (add it to $0)"
		bad=$((bad + 1))
		continue
	fi
	check_file "$f" "$m"
done
echo "layers: $checked includes checked, $bad broken"
[ "$bad" = 0 ]
