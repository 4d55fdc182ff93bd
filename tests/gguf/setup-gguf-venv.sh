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
# sha256 is left alone; a new one is built aside and renamed into place
# under a lock (tests/lib/cache.sh), so two runs at once build it once.
set -eu
print_path=0 runtime=0
[ "${1:-}" = "--print-path" ] && print_path=1
[ "${1:-}" = "--runtime" ] && runtime=1
exec 3>&1 1>&2 # progress on stderr; stdout (fd 3) carries only the path

here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib/cache.sh"
LLAMA_CPP_PYTHON=0.3.36
venv=$CKFS_CACHE/gguf-venv
rt=$CKFS_CACHE/gguf-runtime-venv
lock=$here/requirements.txt

# The converter's venv, and llama.cpp's converter from the source package.
build_venv() { # TMP
	python3 -m venv --without-pip "$1" || return 1
	echo "setup-gguf-venv: installing $lock into $1"
	"$CKFS_UV" pip sync -q --python "$1/bin/python" "$lock" || return 1
	echo "setup-gguf-venv: fetching the llama-cpp-python $LLAMA_CPP_PYTHON source package"
	# (pip of uv's own venv: uv has no download command)
	"$CKFS_UV_PYTHON" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
		--no-build-isolation -d "$1/sdist" "llama-cpp-python==$LLAMA_CPP_PYTHON" 2>/dev/null ||
		"$CKFS_UV_PYTHON" -m pip download -q --disable-pip-version-check --no-deps \
			--no-binary :all: -d "$1/sdist" "llama-cpp-python==$LLAMA_CPP_PYTHON" || return 1
	top=llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
	tar -xzf "$1/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$1/sdist" \
		"$top/convert_hf_to_gguf.py" "$top/conversion" "$top/gguf-py" &&
		mv "$1/sdist/$top" "$1/llama.cpp" && rm -rf "$1/sdist"
}

# llama.cpp itself: portable code (no -march=native), CPU only, no
# multimodal library, tools or server (the tests use none).
build_runtime() { # TMP
	python3 -m venv "$1" || return 1
	echo "setup-gguf-venv: building llama-cpp-python $LLAMA_CPP_PYTHON into $1 (compiles llama.cpp)"
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
		CMAKE_BUILD_PARALLEL_LEVEL=${CKFS_JOBS:-2} \
		"$1/bin/python" -m pip install -q --disable-pip-version-check --no-binary llama-cpp-python \
		"llama-cpp-python==$LLAMA_CPP_PYTHON" "numpy==2.3.5"
}

want="$(sha256sum "$lock" | cut -d' ' -f1) llama-cpp-python==$LLAMA_CPP_PYTHON"
if ckfs_cache_fresh "$venv" "$want"; then
	echo "setup-gguf-venv: $venv up to date"
else
	start=$(date +%s)
	ckfs_uv
	ckfs_cached "$venv" "$want" build_venv
	echo "setup-gguf-venv: $venv ready in $(($(date +%s) - start)) s"
fi
if [ "$runtime" = 1 ]; then
	want=llama-cpp-python==$LLAMA_CPP_PYTHON
	if ckfs_cache_fresh "$rt" "$want"; then
		echo "setup-gguf-venv: $rt up to date"
	else
		start=$(date +%s)
		ckfs_cached "$rt" "$want" build_runtime
		echo "setup-gguf-venv: $rt ready in $(($(date +%s) - start)) s"
	fi
fi
[ "$print_path" = 1 ] && echo "$venv" >&3
exit 0
