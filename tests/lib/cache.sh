# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# What the tests install under the cache: $CKFS_CACHE_DIR, else
# $XDG_CACHE_HOME/ckfs, else ~/.cache/ckfs. Sourced (sh or bash), not run.
#
#   ckfs_cached DIR STAMP CMD [ARG...]
#       DIR holds what CMD builds, whole or not at all. When DIR/.ckfs-stamp
#       reads STAMP, DIR is used as it is. Otherwise, under an flock of
#       DIR.lock (a second process asking for DIR waits, then finds it
#       built), `CMD ARG... TMP` builds into the new folder TMP beside DIR;
#       when it succeeds the stamp is written last into TMP and TMP is
#       renamed to DIR. A build that fails or is interrupted leaves no DIR
#       (its TMP is removed then, or by the next build), so a half-built
#       one is never trusted. What is built must work after the rename:
#       venvs are used through DIR/bin/python, never a script's #! line.
#   ckfs_uv
#       uv (pinned) in the cache, as $CKFS_UV (its venv's python, with pip:
#       $CKFS_UV_PYTHON), with its cache in the cache and its venvs
#       hard-linked to it (UV_* exported).
CKFS_CACHE=${CKFS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckfs}
CKFS_UV_VERSION=0.13.8

ckfs_cache_fresh() { # DIR STAMP
	[ -f "$1/.ckfs-stamp" ] && [ "$(cat "$1/.ckfs-stamp")" = "$2" ]
}

ckfs_cached() {
	local dir=$1 stamp=$2
	shift 2
	ckfs_cache_fresh "$dir" "$stamp" && return 0
	mkdir -p "$(dirname "$dir")" || return 1
	(
		if ! flock -n 9; then
			echo "$(basename "$dir"): waiting for the process building it" >&2
			flock -w 7200 9 || { echo "$(basename "$dir"): lock not free after 2 hours" >&2; exit 1; }
		fi
		ckfs_cache_fresh "$dir" "$stamp" && exit 0
		# left by builds that failed or were interrupted (the lock is ours)
		rm -rf "$dir".tmp.* "$dir.old"
		tmp=$dir.tmp.$$
		if ! "$@" "$tmp"; then
			rm -rf "$tmp"
			echo "$(basename "$dir"): build failed" >&2
			exit 1
		fi
		printf '%s\n' "$stamp" >"$tmp/.ckfs-stamp" || exit 1
		if [ -e "$dir" ]; then mv "$dir" "$dir.old" || exit 1; fi
		mv "$tmp" "$dir" || exit 1
		rm -rf "$dir.old"
	) 9>"$dir.lock"
}

ckfs_uv_build() { # TMP
	python3 -m venv "$1" &&
		"$1/bin/python" -m pip install -q --disable-pip-version-check "uv==$CKFS_UV_VERSION"
}

ckfs_uv() {
	ckfs_cached "$CKFS_CACHE/uv-$CKFS_UV_VERSION" "uv==$CKFS_UV_VERSION" ckfs_uv_build || return 1
	CKFS_UV=$CKFS_CACHE/uv-$CKFS_UV_VERSION/bin/uv
	CKFS_UV_PYTHON=$CKFS_CACHE/uv-$CKFS_UV_VERSION/bin/python
	export UV_CACHE_DIR="$CKFS_CACHE/uv-cache" UV_LINK_MODE=hardlink UV_NO_PROGRESS=1 \
		UV_PYTHON_DOWNLOADS=never
}
