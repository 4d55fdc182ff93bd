#!/bin/sh
# SPDX-License-Identifier: MIT
# Create the GGUF oracle's venv: llama.cpp's own convert_hf_to_gguf.py and
# gguf-py, unmodified, from the registry's llama-cpp-python 0.3.36 source
# package (which vendors llama.cpp), with the packages they import pinned in
# tests/gguf/requirements.txt:
#
#   ~/.cache/ckfs/gguf-venv                 python with torch, transformers, sentencepiece
#   ~/.cache/ckfs/gguf-venv/llama.cpp/      convert_hf_to_gguf.py, conversion/, gguf-py/
#
#   tests/gguf/setup-gguf-venv.sh [--print-path]   (then the venv path on stdout)
#   tests/gguf/setup-gguf-venv.sh --runtime        also llama.cpp itself:
#
#   ~/.cache/ckfs/gguf-runtime-venv         llama-cpp-python 0.3.36 built from its
#                                           source package, numpy. This compiles
#                                           llama.cpp (without its multimodal
#                                           library, tools and server): 13 minutes
#                                           on 2 CPUs shared with other work
#
# Nothing is compiled (the converter is pure Python): a few minutes the first
# time, most of it torch (hardlinked from uv's cache when the client venvs
# exist). Idempotent: a venv whose stamp holds the lock's and the sdist's
# sha256 is left alone.
set -eu
print_path=0 runtime=0
[ "${1:-}" = "--print-path" ] && print_path=1
[ "${1:-}" = "--runtime" ] && runtime=1
exec 3>&1 1>&2 # progress on stderr; stdout (fd 3) carries only the path

here=$(cd "$(dirname "$0")" && pwd)
cache=${CKFS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckfs}
UV_VERSION=0.13.8
LLAMA_CPP_PYTHON=0.3.36
uvenv=$cache/uv-$UV_VERSION
venv=$cache/gguf-venv
lock=$here/requirements.txt
export UV_CACHE_DIR=$cache/uv-cache UV_LINK_MODE=hardlink UV_NO_PROGRESS=1 UV_PYTHON_DOWNLOADS=never

if [ ! -x "$uvenv/bin/uv" ]; then
	echo "setup-gguf-venv: installing uv $UV_VERSION into $uvenv"
	rm -rf "$uvenv"
	python3 -m venv "$uvenv"
	"$uvenv/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
fi

stamp=$venv/.ckfs-stamp
want="$(sha256sum "$lock" | cut -d' ' -f1) llama-cpp-python==$LLAMA_CPP_PYTHON"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$venv/llama.cpp/convert_hf_to_gguf.py" ]; then
	echo "setup-gguf-venv: $venv up to date"
else
	start=$(date +%s)
	[ -x "$venv/bin/python" ] || { echo "setup-gguf-venv: creating $venv"; python3 -m venv --without-pip "$venv"; }
	echo "setup-gguf-venv: installing $lock into $venv"
	"$uvenv/bin/uv" pip sync -q --python "$venv/bin/python" "$lock"
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	echo "setup-gguf-venv: fetching the llama-cpp-python $LLAMA_CPP_PYTHON source package"
	"$uvenv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
		--no-build-isolation -d "$tmp" "llama-cpp-python==$LLAMA_CPP_PYTHON" 2>/dev/null ||
		"$uvenv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
			-d "$tmp" "llama-cpp-python==$LLAMA_CPP_PYTHON"
	top=llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
	tar -xzf "$tmp/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$tmp" \
		"$top/convert_hf_to_gguf.py" "$top/conversion" "$top/gguf-py"
	rm -rf "$venv/llama.cpp"
	mv "$tmp/$top" "$venv/llama.cpp"
	echo "$want" >"$stamp"
	echo "setup-gguf-venv: installed in $(($(date +%s) - start)) s"
fi
if [ "$runtime" = 1 ]; then
	rt=$cache/gguf-runtime-venv
	if [ -f "$rt/.ckfs-stamp" ] && [ "$(cat "$rt/.ckfs-stamp")" = "llama-cpp-python==$LLAMA_CPP_PYTHON" ]; then
		echo "setup-gguf-venv: $rt up to date"
	else
		start=$(date +%s)
		rm -rf "$rt"
		python3 -m venv "$rt"
		echo "setup-gguf-venv: building llama-cpp-python $LLAMA_CPP_PYTHON into $rt (compiles llama.cpp)"
		# portable code (no -march=native: the venv may be copied), CPU only, 2 jobs
		# (no multimodal library, tools or server: the tests use none)
		CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
			CMAKE_BUILD_PARALLEL_LEVEL=${CKFS_JOBS:-2} \
			"$rt/bin/python" -m pip install -q --disable-pip-version-check --no-binary llama-cpp-python \
			"llama-cpp-python==$LLAMA_CPP_PYTHON" "numpy==2.3.5"
		echo "llama-cpp-python==$LLAMA_CPP_PYTHON" >"$rt/.ckfs-stamp"
		echo "setup-gguf-venv: llama-cpp-python built in $(($(date +%s) - start)) s"
	fi
fi
[ "$print_path" = 1 ] && echo "$venv" >&3
exit 0
