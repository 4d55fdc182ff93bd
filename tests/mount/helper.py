#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Read checks for the mount tests (tests/mount/*.sh); standard library only.

Every check compares bytes read through the mount with the file `ckfs export`
wrote for the same checkpoint, and exits non-zero with one line naming the
file, offset and length at the first difference.

  check MNTFILE EXPFILE        preads at offsets that matter (header end, tensor
                               boundaries, EOF) x sizes (1, 4093, 4096, 131072,
                               1000003, ...), buffered and O_DIRECT
  random MNTFILE EXPFILE [--threads 8] [--count 400] [--direct]
                               concurrent random preads from several threads
  mmap MNTFILE EXPFILE         mmap the file, compare slices and the whole
  offsets FILE                 print "header_end first_tensor_end size"
  erofs MNT                    every way to modify the tree fails with EROFS
  stats MNT                    the stats xattr parses; prints the daemon pid
  errno FILE EXPECT            read FILE whole; exit 0 iff it fails with errno
                               EXPECT (e.g. EIO)
  seqerr FILE EXPFILE          read FILE front to back in 4 KiB O_DIRECT preads,
                               going on past failures; every read must return
                               the expected bytes or fail with EIO; prints
                               "ok N eio M"
  notify SOCK                  bind a datagram socket (abstract if SOCK starts
                               with '@'), print "bound", then wait for READY=1
                               and print it
  hold FILE EXPFILE            open FILE, read 4 KiB, print "holding", wait for
                               a line on stdin, read the rest, compare, exit
  deny FILE UID                give FILE a POSIX ACL that shuts uid UID out and
                               otherwise grants what its mode bits grant (the
                               kernel's xattr format; no setfacl needed)
"""
import errno
import json
import mmap
import os
import random
import socket
import struct
import sys
import threading


def die(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def header_info(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
    base = 8 + n
    bounds = sorted(
        {base + v["data_offsets"][0] for k, v in hdr.items() if k != "__metadata__"}
        | {base + v["data_offsets"][1] for k, v in hdr.items() if k != "__metadata__"}
    )
    return base, bounds


def interesting_offsets(path, size):
    offs = {0, 1, 7, 8, 9, 4095, 4096, 4097, size - 1, size, size + 1, size // 2}
    if path.endswith(".safetensors"):
        base, bounds = header_info(path)
        offs |= {base - 1, base, base + 1}
        # every tensor boundary is cheap for small fixtures; cap for big files
        picked = bounds if len(bounds) <= 64 else bounds[:32] + bounds[-32:]
        for b in picked:
            offs |= {b - 1, b, b + 1}
    for s in (1 << 16, 1 << 20, 4 << 20):  # slice and request boundaries
        for k in range(1, 4):
            offs |= {k * s - 1, k * s, k * s + 1}
    return sorted(o for o in offs if 0 <= o <= size + 1)


SIZES = (1, 2, 7, 4093, 4096, 4097, 65537, 131072, 1000003, 1 << 20, (1 << 20) + 1)


def compare_preads(fd, exp, label, offsets, sizes):
    for off in offsets:
        for n in sizes:
            got = os.pread(fd, n, off)
            want = exp[off : off + n]
            if got != want:
                die("%s: pread(%d bytes at %d) gave %d bytes, %s" % (
                    label, n, off, len(got),
                    "short" if len(got) != len(want) else "different bytes"))


def cmd_check(mnt_file, exp_file):
    exp = open(exp_file, "rb").read()
    offs = interesting_offsets(exp_file, len(exp))
    fd = os.open(mnt_file, os.O_RDONLY)
    compare_preads(fd, exp, mnt_file, offs, SIZES)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    compare_preads(fd, exp, mnt_file + " (after DONTNEED)", reversed(offs), SIZES)
    os.close(fd)
    # O_DIRECT sends each pread to the daemon as is: odd offsets and sizes
    # reach the read handler instead of page-sized readahead requests.
    fd = os.open(mnt_file, os.O_RDONLY | os.O_DIRECT)
    compare_preads(fd, exp, mnt_file + " (O_DIRECT)", offs, SIZES)
    os.close(fd)


def cmd_random(mnt_file, exp_file, threads=8, count=400, direct=False):
    exp = open(exp_file, "rb").read()
    size = len(exp)
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        fd = os.open(mnt_file, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        try:
            for _ in range(count):
                off = rng.randrange(0, size + 1)
                n = rng.choice((1, 3, 512, 4093, 4096, 65536, 131072, 1000003,
                                rng.randrange(1, 3 << 20)))
                got = os.pread(fd, n, off)
                if got != exp[off : off + n]:
                    errors.append("pread(%d at %d) differs (seed %d)" % (n, off, seed))
                    return
        except OSError as e:
            errors.append("pread failed: %s" % e)
        finally:
            os.close(fd)

    ts = [threading.Thread(target=worker, args=(1000 + i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        die("%s: %s" % (mnt_file, errors[0]))


def cmd_mmap(mnt_file, exp_file):
    exp = open(exp_file, "rb").read()
    if not exp:
        return
    with open(mnt_file, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        rng = random.Random(7)
        for _ in range(200):
            off = rng.randrange(0, len(exp))
            n = rng.randrange(1, 1 << 18)
            if m[off : off + n] != exp[off : off + n]:
                die("%s: mmap bytes at %d (+%d) differ" % (mnt_file, off, n))
        if m[:] != exp:
            die("%s: mmap of the whole file differs" % mnt_file)
        m.close()


def cmd_offsets(path):
    size = os.path.getsize(path)
    base, bounds = header_info(path)
    first_end = bounds[1] if len(bounds) > 1 else size
    print(base, first_end, size)


def expect_errno(label, want, fn, *args):
    try:
        fn(*args)
    except OSError as e:
        if e.errno != want:
            die("%s: errno %s, expected %s" % (label, errno.errorcode.get(e.errno),
                                              errno.errorcode[want]))
        return
    die("%s: succeeded on a read-only mount" % label)


def cmd_erofs(mnt):
    names = sorted(os.listdir(mnt))
    f = os.path.join(mnt, names[0])
    new = os.path.join(mnt, "new_file")
    E = errno.EROFS
    expect_errno("open O_WRONLY", E, os.open, f, os.O_WRONLY)
    expect_errno("open O_RDWR", E, os.open, f, os.O_RDWR)
    expect_errno("open O_RDONLY|O_TRUNC", E, os.open, f, os.O_RDONLY | os.O_TRUNC)
    expect_errno("open O_WRONLY|O_APPEND", E, os.open, f, os.O_WRONLY | os.O_APPEND)
    expect_errno("create", E, os.open, new, os.O_WRONLY | os.O_CREAT, 0o644)
    expect_errno("mknod", E, os.mknod, new)
    expect_errno("mkdir", E, os.mkdir, os.path.join(mnt, "d"))
    expect_errno("rmdir", E, os.rmdir, f)
    expect_errno("unlink", E, os.unlink, f)
    expect_errno("rename", E, os.rename, f, new)
    expect_errno("link", E, os.link, f, new)
    expect_errno("symlink", E, os.symlink, "x", new)
    expect_errno("chmod", E, os.chmod, f, 0o644)
    expect_errno("chown", E, os.chown, f, 0, 0)
    expect_errno("utime", E, os.utime, f, (0, 0))
    expect_errno("truncate", E, os.truncate, f, 0)
    expect_errno("setxattr", E, os.setxattr, f, "user.x", b"1")
    expect_errno("removexattr", E, os.removexattr, mnt, "user.ckfs.stats")
    if os.access(f, os.W_OK):
        die("access(W_OK) of %s succeeded on a read-only mount" % f)
    if os.listxattr(f) != []:
        die("listxattr of %s is not empty" % f)


STATS_KEYS = ("hits", "misses", "evictions", "bytes_filled", "bytes_cached", "budget",
              "prefetch_queued", "prefetch_dropped", "prefetch_hits",
              "source_bytes_read", "errors", "reads", "pid")


def cmd_stats(mnt):
    raw = os.getxattr(mnt, "user.ckfs.stats")
    st = json.loads(raw)
    missing = [k for k in STATS_KEYS if k not in st]
    if missing:
        die("stats of %s lack %s" % (mnt, ", ".join(missing)))
    if any(not isinstance(st[k], int) or st[k] < 0 for k in STATS_KEYS):
        die("stats of %s hold a non-counter: %s" % (mnt, raw))
    print(st["pid"])


def cmd_errno(path, name):
    want = getattr(errno, name)
    try:
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    except OSError as e:
        if e.errno == want:
            return
        die("%s: read failed with %s, expected %s" % (path, errno.errorcode.get(e.errno), name))
    die("%s: read succeeded, expected %s" % (path, name))


def cmd_deny(path, uid):
    # system.posix_acl_access: version 2, then (tag, perm, id) entries in
    # tag order: USER_OBJ, USER, GROUP_OBJ, MASK, OTHER.
    mode = os.stat(path).st_mode
    none = 0xFFFFFFFF
    entries = [(0x01, (mode >> 6) & 7, none), (0x02, 0, int(uid)),
               (0x04, (mode >> 3) & 7, none), (0x10, (mode >> 3) & 7, none),
               (0x20, mode & 7, none)]
    acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    os.setxattr(path, "system.posix_acl_access", acl)


def cmd_seqerr(path, exp_file):
    exp = open(exp_file, "rb").read()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    ok = eio = 0
    try:
        for off in range(0, len(exp), 4096):
            try:
                got = os.pread(fd, 4096, off)
            except OSError as e:
                if e.errno != errno.EIO:
                    die("%s: pread(4096 at %d) failed with %s" % (path, off, e))
                eio += 1
                continue
            if got != exp[off:off + 4096]:
                die("%s: pread(4096 at %d) returned other bytes" % (path, off))
            ok += 1
    finally:
        os.close(fd)
    print("ok %d eio %d" % (ok, eio))


def cmd_notify(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + path[1:] if path.startswith("@") else path)
    s.settimeout(60)
    print("bound", flush=True)
    while True:
        try:
            msg = s.recv(4096).decode()
        except socket.timeout:
            print("TIMEOUT", flush=True)
            sys.exit(1)
        if "READY=1" in msg.split("\n"):
            print(msg.replace("\n", " "), flush=True)
            return


def cmd_hold(path, exp_file):
    exp = open(exp_file, "rb").read()
    with open(path, "rb", buffering=0) as f:
        head = f.read(4096)
        print("holding", flush=True)
        sys.stdin.readline()
        rest = b""
        while True:
            b = f.read(1 << 16)
            if not b:
                break
            rest += b
    if head + rest != exp:
        die("%s: bytes read across the unmount differ" % path)
    print("done", flush=True)


def main(argv):
    if len(argv) < 2:
        die("usage: helper.py COMMAND ARGS (see the file)")
    cmd, args = argv[1], argv[2:]
    if cmd == "random":
        direct = "--direct" in args
        args = [a for a in args if a != "--direct"]
        threads, count = 8, 400
        if "--threads" in args:
            i = args.index("--threads")
            threads = int(args[i + 1])
            del args[i : i + 2]
        if "--count" in args:
            i = args.index("--count")
            count = int(args[i + 1])
            del args[i : i + 2]
        return cmd_random(args[0], args[1], threads, count, direct)
    table = {"check": cmd_check, "mmap": cmd_mmap, "offsets": cmd_offsets,
             "erofs": cmd_erofs, "stats": cmd_stats, "errno": cmd_errno, "deny": cmd_deny,
             "notify": cmd_notify, "hold": cmd_hold, "seqerr": cmd_seqerr}
    if cmd not in table:
        die("unknown command " + cmd)
    return table[cmd](*args)


if __name__ == "__main__":
    sys.exit(main(sys.argv) or 0)
