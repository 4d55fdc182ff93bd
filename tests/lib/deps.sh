# SPDX-License-Identifier: MIT
# Shared by tests/quickstart.sh and tests/run-tests.sh (sourced, not run):
# install the Debian 12 packages ckfs needs when any is missing, and build.

CKFS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# Build and test dependencies, all from Debian 12's archive. Packaging:
# dpkg-dev (dpkg-shlibdeps computes the .deb's Depends), debootstrap (the
# clean Debian 12 root the .deb is installed into), groff-base (the man
# page is rendered and checked). curl: the S3 tests fill their bucket
# with it (tests/s3). clang-format: the format lint (tests/lint).
CKFS_APT_PACKAGES="build-essential cmake pkg-config libfuse3-dev fuse3 \
libzip-dev zlib1g-dev libcjson-dev libxxhash-dev libcurl4-openssl-dev python3 python3-venv \
clang clang-format libclang-rt-14-dev dpkg-dev debootstrap groff-base curl"

ckfs_install_deps() {
	local missing=""
	for p in $CKFS_APT_PACKAGES; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
			missing="$missing $p"
	done
	if [ -z "$missing" ]; then
		echo "deps: all Debian packages present"
		return 0
	fi
	echo "deps: installing$missing"
	if [ "$(id -u)" != 0 ]; then
		echo "deps: run as root (or install:$missing)" >&2
		return 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq && apt-get install -y -qq $missing >/dev/null
}

# ckfs_build DIR [cmake args...]
ckfs_build() {
	local dir=$1
	shift
	cmake -S "$CKFS_ROOT" -B "$dir" -DCKFS_WERROR=ON "$@" >/dev/null &&
		cmake --build "$dir" -j"$(nproc)"
}
