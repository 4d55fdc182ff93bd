#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Readers and a mutator against a live ckfs mount (tests/faults/test_load.sh).

    load.py MNT CKPT EXPDIR PID [--seconds 20] [--readers 16] [--seed 1]

MNT is a ckfs mount of checkpoint folder CKPT, EXPDIR what `ckfs export`
wrote for it (the ground truth), PID the daemon. For --seconds:

  readers   16 threads of random-range preads (1 byte to 256 KiB, offsets
            anywhere up to EOF) on MNT/model.safetensors, half of them
            through O_DIRECT so each pread reaches the daemon, and on
            MNT/config.json. A read that returns must return exactly the
            ground-truth bytes (full length except at EOF); a read that
            fails must fail with EIO. A buffered read may come back partial
            (the kernel returns the pages it got before one failed, as
            POSIX allows): its bytes must be correct and reading on from
            there must give the rest or EIO. config.json is rendered in
            memory and must never fail.
  mutator   one fault at a time on a random rank file, held 0.15-0.5 s and
            then undone, then 0.1-0.5 s without a fault: truncate to half
            (restored with the same bytes and mtime), replace by rename (a
            copy with the same bytes; the original renamed back), delete (a
            hard link kept; renamed back), touch (mtime restored). Every
            undo leaves the original inode with its original size and mtime
            under its name, so the daemon may serve from it again. Every
            0.25 s it drops the mount file's page cache
            (POSIX_FADV_DONTNEED), every 2 s all page caches when root may
            (/proc/sys/vm/drop_caches), so that buffered readers reach the
            daemon too.
            For the last 15% of the run it scribbles 4 KiB of garbage over
            the middle of one rank file, in place and left there: the one
            fault after which the daemon's own descriptor would deliver
            wrong bytes, so only the source check stands between them and
            a reader. Restored (bytes and mtime) after the readers stop.
  watchdog  the daemon must stay alive (checked every 0.1 s).

Bytes the kernel or the slice cache kept from before a fault are the
checkpoint's bytes and may still be served: the check is that every byte
that comes back equals the ground truth, never that reads fail during a
fault. After the run every fault is undone and the whole file, read with
O_DIRECT, must equal the ground truth again.

Prints the figures and exits 0 only with zero wrong bytes, zero errors
other than EIO, the daemon alive, and both successful and EIO reads seen.
Standard library only.
"""
import argparse
import errno
import os
import random
import sys
import threading
import time


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.attempted = self.ok = self.ok_config = self.eio = 0
        self.other = self.wrong = self.bytes_checked = self.partial = 0
        self.problems = []

    def add(self, **kw):
        with self.lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def problem(self, text):
        with self.lock:
            if len(self.problems) < 10:
                self.problems.append(text)


def reader(idx, mnt, truth, cfg_truth, stop, c, seed):
    rng = random.Random(seed * 1000 + idx)
    direct = idx % 2 == 1
    path = os.path.join(mnt, "model.safetensors")
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    cfd = os.open(os.path.join(mnt, "config.json"), os.O_RDONLY)
    size, csize = len(truth), len(cfg_truth)
    n_local = dict(attempted=0, ok=0, ok_config=0, eio=0, other=0, wrong=0, bytes_checked=0,
                   partial=0)
    try:
        while not stop.is_set():
            config = rng.random() < 0.1
            want_all, f = (cfg_truth, cfd) if config else (truth, fd)
            total = csize if config else size
            off = rng.randrange(0, total + 1)
            if rng.random() < 0.3:
                off -= off % 4096
            n = rng.choice((1, 7, 4093, 4096, 65536, 131072, rng.randrange(1, 1 << 18)))
            n_local["attempted"] += 1
            try:
                got = os.pread(f, n, off)
            except OSError as e:
                if e.errno == errno.EIO and not config:
                    n_local["eio"] += 1
                else:
                    n_local["other"] += 1
                    c.problem("%s: pread(%d at %d) failed: %s" % (
                        "config.json" if config else "model.safetensors", n, off, e))
                continue
            want = want_all[off:off + n]
            name = "config.json" if config else "model.safetensors"
            # A buffered read whose later pages fail returns the bytes it
            # had (POSIX partial read); the rest must then read correctly
            # or fail with EIO, never come back different or short.
            partial = len(got) < len(want)
            while 0 < len(got) < len(want) and not config:
                try:
                    more = os.pread(f, len(want) - len(got), off + len(got))
                except OSError as e:
                    if e.errno == errno.EIO:
                        n_local["eio"] += 1
                        want = want[:len(got)]
                    else:
                        n_local["other"] += 1
                        c.problem("%s: pread after a partial read failed: %s" % (name, e))
                    break
                if not more:
                    break
                got += more
            bad = sum(1 for x, y in zip(got, want) if x != y) + abs(len(got) - len(want))
            if bad:
                n_local["wrong"] += bad
                c.problem("%s: pread(%d at %d, %s) returned %d bytes, %d wrong or missing" % (
                    name, n, off, "O_DIRECT" if direct else "buffered", len(got), bad))
            else:
                n_local["ok_config" if config else "ok"] += 1
                n_local["partial"] += partial
                n_local["bytes_checked"] += len(got)
    finally:
        os.close(fd)
        os.close(cfd)
        c.add(**n_local)


class Mutator:
    KINDS = ("truncate", "rename", "delete", "touch")
    SCRIBBLE = 4096

    def __init__(self, ckpt, mnt, seed):
        self.ckpt, self.mnt = ckpt, mnt
        self.rng = random.Random(seed)
        self.ranks = sorted(f for f in os.listdir(ckpt) if f.startswith("model_world_size_"))
        self.originals = {f: open(os.path.join(ckpt, f), "rb").read() for f in self.ranks}
        self.stats = {f: os.stat(os.path.join(ckpt, f)) for f in self.ranks}
        self.counts = {k: 0 for k in self.KINDS + ("scribble",)}
        self.scribbled = None
        self.drops = self.global_drops = 0
        self.undo = None

    def restore_times(self, path, name):
        st = self.stats[name]
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    def apply(self, kind, name):
        path = os.path.join(self.ckpt, name)
        if kind == "truncate":
            fd = os.open(path, os.O_WRONLY)
            os.ftruncate(fd, len(self.originals[name]) // 2)

            def undo():
                os.pwrite(fd, self.originals[name], 0)  # same bytes, no hole
                os.close(fd)
                self.restore_times(path, name)
        elif kind == "rename":
            os.link(path, path + ".orig")
            with open(path + ".new", "wb") as f:
                f.write(self.originals[name])
            os.rename(path + ".new", path)

            def undo():
                os.rename(path + ".orig", path)
        elif kind == "delete":
            os.link(path, path + ".orig")
            os.unlink(path)

            def undo():
                os.rename(path + ".orig", path)
        else:
            os.utime(path, ns=(time.time_ns(), time.time_ns()))

            def undo():
                self.restore_times(path, name)
        self.counts[kind] += 1
        self.undo = undo

    def finish(self):
        if self.undo:
            self.undo()
            self.undo = None

    def scribble(self):
        """Garbage over the middle of a rank file, left in place."""
        name = self.rng.choice(self.ranks)
        path = os.path.join(self.ckpt, name)
        at = len(self.originals[name]) // 2
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(bytes(b ^ 0x5A for b in self.originals[name][at:at + self.SCRIBBLE]))
        self.counts["scribble"] += 1
        self.scribbled = name

    def unscribble(self):
        if self.scribbled:
            path = os.path.join(self.ckpt, self.scribbled)
            with open(path, "r+b") as f:
                f.write(self.originals[self.scribbled])
            self.restore_times(path, self.scribbled)
            self.scribbled = None

    def run(self, stop, scribble_at):
        mfd = os.open(os.path.join(self.mnt, "model.safetensors"), os.O_RDONLY)
        next_drop = next_global = 0.0
        try:
            while not stop.is_set():
                if time.monotonic() >= scribble_at and not self.scribbled:
                    self.scribble()
                if not self.scribbled:
                    self.apply(self.rng.choice(self.KINDS), self.rng.choice(self.ranks))
                hold_until = time.monotonic() + self.rng.uniform(0.15, 0.5)
                while time.monotonic() < hold_until and not stop.is_set():
                    now = time.monotonic()
                    if now >= next_drop:
                        os.posix_fadvise(mfd, 0, 0, os.POSIX_FADV_DONTNEED)
                        self.drops += 1
                        next_drop = now + 0.25
                    if now >= next_global:
                        next_global = now + 2.0
                        try:
                            with open("/proc/sys/vm/drop_caches", "w") as f:
                                f.write("3\n")
                            self.global_drops += 1
                        except OSError:
                            pass
                    time.sleep(0.02)
                self.finish()
                time.sleep(self.rng.uniform(0.1, 0.5))
        finally:
            self.finish()
            os.close(mfd)


def daemon_alive(pid):
    try:
        os.kill(pid, 0)
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def read_whole_direct(path, size):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        out = bytearray()
        while len(out) < size + 1:
            b = os.pread(fd, 1 << 20, len(out))
            if not b:
                break
            out += b
        return bytes(out)
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mnt")
    ap.add_argument("ckpt")
    ap.add_argument("expdir")
    ap.add_argument("pid", type=int)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--readers", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    truth = open(os.path.join(a.expdir, "model.safetensors"), "rb").read()
    cfg_truth = open(os.path.join(a.expdir, "config.json"), "rb").read()
    c = Counters()
    stop = threading.Event()
    mut = Mutator(a.ckpt, a.mnt, a.seed)
    errors = []

    def guarded(fn, *args):
        try:
            fn(*args)
        except Exception as e:  # a crash of a thread is a failure, not a hang
            errors.append("%s: %r" % (fn.__name__, e))
            stop.set()

    threads = [threading.Thread(target=guarded, args=(reader, i, a.mnt, truth, cfg_truth, stop, c, a.seed))
               for i in range(a.readers)]
    start = time.monotonic()
    threads.append(threading.Thread(target=guarded,
                                    args=(mut.run, stop, start + 0.85 * a.seconds)))
    for t in threads:
        t.start()
    alive = True
    while time.monotonic() - start < a.seconds and not stop.is_set():
        if not daemon_alive(a.pid):
            alive = False
            break
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    time.sleep(0.5)  # slice fills in flight (read-ahead) end before the undo
    mut.unscribble()
    alive = alive and daemon_alive(a.pid)

    recovered = False
    if alive:
        got = read_whole_direct(os.path.join(a.mnt, "model.safetensors"), len(truth))
        recovered = got == truth
    faults = sum(mut.counts.values())
    print("load: %.1f s, %d readers (%d O_DIRECT)" % (elapsed, a.readers, a.readers // 2))
    print("load: reads attempted %d, succeeded %d (model.safetensors %d, config.json %d), "
          "EIO %d, other errors %d" % (c.attempted, c.ok + c.ok_config, c.ok, c.ok_config,
                                        c.eio, c.other))
    print("load: bytes checked %d, wrong bytes %d; %d buffered reads came back partial "
          "(correct bytes; the rest then read back or failed with EIO)" % (c.bytes_checked, c.wrong, c.partial))
    print("load: faults injected %d (%s), page cache drops %d per file + %d global" % (
        faults, ", ".join("%s %d" % kv for kv in mut.counts.items()), mut.drops,
        mut.global_drops))
    print("load: daemon %s; after undoing every fault the whole file reads back %s" % (
        "alive" if alive else "DEAD", "equal" if recovered else "DIFFERENT or failed"))
    for p in c.problems + errors:
        print("load: FAIL: " + p, file=sys.stderr)
    ok = (alive and recovered and not errors and c.wrong == 0 and c.other == 0 and
          c.ok > 0 and c.eio > 0 and faults > 0)
    if c.eio == 0:
        print("load: FAIL: no read failed: the faults never reached the daemon", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
