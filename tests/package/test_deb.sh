#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Debian package, installed the way an operator installs it, into a
# clean Debian 12 root:
#   1. `cpack -G DEB` in the build folder makes ckfs_<version>_<arch>.deb:
#      its version is CMake's, it holds the binary, the systemd units (which
#      run /usr/bin/ckfs), the man page, the completion, the docs and the
#      license, and its Depends name fuse3 and the package of every shared
#      library the binary links (as the host's dpkg knows them);
#   2. a minbase Debian 12 root (debootstrap, cached as a tarball under
#      ~/.cache/ckfs, with apt's downloaded packages beside it) gets the
#      package through `apt-get install ./ckfs_*.deb`, which pulls exactly
#      what Depends names from the archive;
#   3. in a private mount namespace, chrooted there with /dev/fuse bound
#      in: `ckfs --version`, the man page and the completion are there, a
#      fixture mounted by `ckfs mount` and by mount(8) (fuse.ckfs, through
#      fuse3's mount.fuse3) reads byte-identical to verl's merger output;
#   4. `apt-get purge --autoremove ckfs` leaves no file of the package and
#      the root's file list as it was before the install.
# Usage: test_deb.sh BUILD_DIR. Exit 0 pass, 1 fail, 77 only when this
# machine cannot run it at all (not root, no /dev/fuse), saying why.
set -Eeuo pipefail
# Whatever fails unchecked still says where (never a silent exit).
trap 'printf "test_deb: FAIL: line %s: %s\n" "$LINENO" "$BASH_COMMAND" >&2' ERR

BUILD=$(cd "${1:?usage: test_deb.sh BUILD_DIR}" && pwd)
CKFS_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$CKFS_ROOT/tests/lib/cache.sh"
ROOT_CACHE=$CKFS_CACHE/debian12-minbase
ROOT_TARBALL=$ROOT_CACHE/root.tar.gz
APT_ARCHIVES=$CKFS_CACHE/debian12-apt-archives
FIXTURE=llama_tied_fsdp2_w4

say() { printf 'test_deb: %s\n' "$*"; }
fail() {
	say "FAIL: $*" >&2
	exit 1
}
skip() {
	say "NOT RUN: $*" >&2
	exit 77
}

[ "$(id -u)" = 0 ] || skip "chroot and mounts need root (running as uid $(id -u))"
[ -c /dev/fuse ] || skip "/dev/fuse is missing, so nothing can be mounted in the chroot"
for tool in debootstrap chroot unshare dpkg-deb dpkg-shlibdeps cpack objdump; do
	command -v "$tool" >/dev/null ||
		fail "'$tool' not found (install the packages of tests/lib/deps.sh)"
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ckfs-deb.XXXXXX")
ROOT=$WORK/root
cleanup() {
	# Daemons left by a failed run hold the chroot: end them, by pid.
	local p
	for p in /proc/[0-9]*; do
		[ "$(readlink "$p/root" 2>/dev/null)" = "$ROOT" ] && kill -9 "${p#/proc/}" 2>/dev/null
	done
	rm -rf "$WORK"
}
trap cleanup EXIT

VERSION=$(sed -n 's/^project(ckfs VERSION \([0-9.]*\).*/\1/p' "$CKFS_ROOT/CMakeLists.txt")
ARCH=$(dpkg --print-architecture)
[ -n "$VERSION" ] || fail "no project version in CMakeLists.txt"

# ---- 1. the package ----
start=$SECONDS
cpack --config "$BUILD/CPackConfig.cmake" -G DEB -B "$WORK/pkg" >"$WORK/cpack.log" 2>&1 ||
	{ cat "$WORK/cpack.log" >&2; fail "cpack -G DEB failed"; }
DEB=$WORK/pkg/ckfs_${VERSION}_${ARCH}.deb
[ -f "$DEB" ] || fail "cpack did not make $(basename "$DEB"): $(ls "$WORK/pkg")"
say "made $(basename "$DEB") ($(stat -c %s "$DEB") bytes) in $((SECONDS - start)) s"
[ "$(dpkg-deb -f "$DEB" Version)" = "$VERSION" ] || fail "package version is not $VERSION"
[ "$(dpkg-deb -f "$DEB" Package)" = ckfs ] || fail "package name is not ckfs"

# Every path of the package, "/usr/bin/ckfs", folders without their "/".
dpkg-deb -c "$DEB" | awk '{ print $6 }' | sed 's|^\./|/|; s|/$||' | grep . >"$WORK/contents"
for f in /usr/bin/ckfs /usr/share/man/man1/ckfs.1 /usr/share/bash-completion/completions/ckfs \
	/usr/share/doc/ckfs/copyright /usr/share/doc/ckfs/README.md /usr/share/doc/ckfs/mount.md \
	'/lib/systemd/system/ckfs@.service' /lib/systemd/system/mnt-merged.mount; do
	grep -qx -- "$f" "$WORK/contents" || grep -qx -- "/usr$f" "$WORK/contents" ||
		fail "the package lacks $f"
done
unit=$(dpkg-deb --fsys-tarfile "$DEB" | tar -xO --wildcards '*/ckfs@.service')
grep -q '^ExecStart=/usr/bin/ckfs mount ' <<<"$unit" || fail "ckfs@.service does not run /usr/bin/ckfs"
grep -q '^Documentation=file:///usr/share/doc/ckfs/mount.md' <<<"$unit" ||
	fail "ckfs@.service does not point at /usr/share/doc/ckfs/mount.md"

# Depends: fuse3, and for each library the binary needs, its package.
depends=$(dpkg-deb -f "$DEB" Depends)
say "Depends: $depends"
grep -qE '(^|, )fuse3(,|$| )' <<<"$depends" || fail "Depends lacks fuse3"
for lib in $(objdump -p "$BUILD/ckfs" | awk '$1 == "NEEDED" { print $2 }'); do
	# (awk reads every line: an early exit would kill the writer with SIGPIPE)
	path=$(ldconfig -p | awk -v l="$lib" '$1 == l && !p { p = $NF } END { print p }')
	[ -n "$path" ] || fail "the binary needs $lib, which ldconfig does not know"
	pkg=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | awk -F: 'NR == 1 { print $1 }') || pkg=
	[ -n "$pkg" ] || pkg=$(dpkg -S "$path" 2>/dev/null | awk -F: 'NR == 1 { print $1 }') ||
		fail "no package ships $path ($lib)"
	[ -n "$pkg" ] || fail "no package ships $path ($lib)"
	grep -qE "(^|, )$pkg( |,|$)" <<<"$depends" || fail "Depends lacks $pkg (for $lib)"
done

# ---- 2. the clean Debian 12 root ----
# The mirror apt uses here (deb822 or one-line sources), else Debian's.
debian_mirror() {
	local m
	m=$(awk 'BEGIN { RS = ""; IGNORECASE = 1 }
		/Suites:[^\n]*bookworm( |\n|$)/ && !/security/ {
			if (match($0, /URIs: *[^ \n]+/)) { u = substr($0, RSTART, RLENGTH); sub(/URIs: */, "", u); print u; exit }
		}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
	[ -n "$m" ] || m=$(awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }' \
		/etc/apt/sources.list 2>/dev/null || true)
	echo "${m:-http://deb.debian.org/debian}"
}
# The root, made once (tests/lib/cache.sh: aside, under a lock).
make_root() { # TMP
	local mirror tmp=$1 root=$1/root
	mirror=$(debian_mirror)
	mkdir -p "$root"
	say "no cached root: debootstrap --variant=minbase bookworm from $mirror"
	debootstrap --variant=minbase bookworm "$root" "$mirror" >"$WORK/debootstrap.log" 2>&1 ||
		{ tail -30 "$WORK/debootstrap.log" >&2; say "debootstrap failed (log above)"; return 1; }
	cp /etc/resolv.conf "$root/etc/resolv.conf"
	chroot "$root" apt-get update -qq >"$WORK/update.log" 2>&1 ||
		{ cat "$WORK/update.log" >&2; say "apt-get update in the new root failed"; return 1; }
	rm -f "$root"/var/cache/apt/archives/*.deb
	tar -C "$root" -czf "$tmp/root.tar.gz" . && rm -rf "$root"
}
mkdir -p "$APT_ARCHIVES/partial" "$ROOT"
start=$SECONDS
ckfs_cached "$ROOT_CACHE" "debootstrap minbase bookworm" make_root || fail "cannot make the Debian 12 root"
tar -C "$ROOT" -xzf "$ROOT_TARBALL" || fail "cannot unpack $ROOT_TARBALL (remove $ROOT_CACHE to remake it)"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
say "the cached root $ROOT_TARBALL unpacked in $((SECONDS - start)) s"
[ -x "$ROOT/usr/bin/apt-get" ] || fail "the root has no apt-get"

# What is on the root before the package, for the check after its removal
# (logs, caches and apt's and dpkg's own records aside; root's ~/.cache is
# the user's, as ckfs's plan cache there: a purge leaves user data alone).
snapshot() {
	(cd "$ROOT" && find . -xdev \( -path ./proc -o -path ./dev -o -path ./tmp -o -path ./run \
		-o -path ./var/log -o -path ./var/cache -o -path ./var/lib/apt -o -path ./var/lib/dpkg \
		-o -path ./srv -o -path ./mnt -o -path ./root/.cache \) -prune -o -print | sort)
}
snapshot >"$WORK/before"

cp "$DEB" "$ROOT/tmp/"
mkdir -p "$ROOT/srv/ckpt" "$ROOT/srv/expected"
cp -r "$CKFS_ROOT/tests/fixtures/fsdp/$FIXTURE/." "$ROOT/srv/ckpt/"
cp "$CKFS_ROOT/tests/fixtures/expected/$FIXTURE/model.safetensors" "$ROOT/srv/expected/"

# ---- 3. inside: install, use, remove ----
cat >"$ROOT/tmp/inside.sh" <<'INSIDE'
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin
VERSION=$1 DEB=$2
say() { printf 'test_deb (chroot): %s\n' "$*"; }
fail() { say "FAIL: $*" >&2; exit 1; }
install() { apt-get install -y -q --no-install-recommends "$DEB" >/tmp/install.log 2>&1; }

if ! install; then
	say "apt-get install failed with the cached package lists; updating them and retrying"
	apt-get update -qq >/dev/null 2>&1 || { cat /tmp/install.log; fail "apt-get update failed"; }
	install || { cat /tmp/install.log >&2; fail "apt-get install $DEB failed"; }
fi
grep -E '^(Setting up|Unpacking) ' /tmp/install.log | sed 's/^/  /'

[ "$(command -v ckfs)" = /usr/bin/ckfs ] || fail "ckfs is not /usr/bin/ckfs"
out=$(ckfs --version) || fail "ckfs --version failed: $out"
say "$(tr '\n' ';' <<<"$out")"
[ "$(head -1 <<<"$out")" = "ckfs $VERSION" ] || fail "ckfs --version says '$(head -1 <<<"$out")'"
grep -q '^built with libfuse ' <<<"$out" || fail "ckfs --version names no libraries"
[ -s /usr/share/man/man1/ckfs.1 ] || fail "no man page"
bash -c 'source /usr/share/bash-completion/completions/ckfs && complete -p ckfs' >/dev/null ||
	fail "the completion script does not load"

mkdir -p /mnt/merged
ckfs mount /srv/ckpt /mnt/merged 2>/tmp/mount.log || { cat /tmp/mount.log; fail "ckfs mount failed"; }
cmp /mnt/merged/model.safetensors /srv/expected/model.safetensors ||
	fail "the mounted model.safetensors differs from verl's"
metrics=$(ckfs stats --prometheus /mnt/merged) || fail "ckfs stats --prometheus failed"
grep -q '^ckfs_read_bytes_total{mountpoint="/mnt/merged"} [1-9]' <<<"$metrics" ||
	fail "ckfs stats --prometheus shows no bytes read"
ckfs umount /mnt/merged || fail "ckfs umount failed"
say "ckfs mount: model.safetensors byte-identical to verl's merger output; unmounted"

# mount(8) -> mount.fuse3 (package fuse3, from Depends) -> ckfs
mount -t fuse.ckfs /srv/ckpt /mnt/merged -o dtype=bf16,cache_size=64MiB 2>/tmp/mount.log ||
	{ cat /tmp/mount.log; fail "mount -t fuse.ckfs failed"; }
grep -q ' /mnt/merged .* fuse.ckfs ' /proc/self/mountinfo || fail "no fuse.ckfs mount at /mnt/merged"
cmp /mnt/merged/model.safetensors /srv/expected/model.safetensors ||
	fail "model.safetensors through mount(8) differs from verl's"
umount /mnt/merged || fail "umount failed"
say "mount -t fuse.ckfs: the same bytes; unmounted"

apt-get purge -y -q --autoremove ckfs >/tmp/purge.log 2>&1 || { cat /tmp/purge.log >&2; fail "apt-get purge failed"; }
grep -E '^(Removing|Purging) ' /tmp/purge.log | sed 's/^/  /'
if dpkg-query -W -f='${Status}\n' ckfs 2>/dev/null | grep -q installed; then
	fail "ckfs is still installed"
fi
INSIDE

start=$SECONDS
rm -f "$ROOT/dev/fuse"
touch "$ROOT/dev/fuse"
# apt's downloaded packages are shared between runs: one install at a time.
flock -w 3600 "$APT_ARCHIVES.lock" unshare --mount --propagation private bash -euc '
	ROOT=$1 ARCHIVES=$2
	mount --bind /dev/fuse "$ROOT/dev/fuse"
	mount -t proc proc "$ROOT/proc"
	mount --bind "$ARCHIVES" "$ROOT/var/cache/apt/archives"
	chroot "$ROOT" bash /tmp/inside.sh "$3" "/tmp/$(basename "$4")"
' inside "$ROOT" "$APT_ARCHIVES" "$VERSION" "$DEB" || fail "in the Debian 12 root (see above)"
say "installed, used and removed in $((SECONDS - start)) s"

# ---- 4. nothing left behind ----
rm -f "$ROOT/dev/fuse"
while read -r f; do
	# a folder that was there before (as its real path: /lib is usr/lib)
	[ -d "$ROOT$f" ] && grep -qx "./$(realpath --relative-to="$ROOT" "$ROOT$f")" "$WORK/before" &&
		continue
	[ -e "$ROOT$f" ] || [ -L "$ROOT$f" ] && fail "$f is still there after the purge"
done <"$WORK/contents"
snapshot >"$WORK/after"
if ! diff -u "$WORK/before" "$WORK/after" >"$WORK/diff"; then
	cat "$WORK/diff" >&2
	fail "the root's files differ from before the install (diff above)"
fi
say "PASS: nothing of the package is left, and the root's file list is as before"
echo "package_deb: 1 passed, 0 failed"
