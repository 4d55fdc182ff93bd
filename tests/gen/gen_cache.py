# SPDX-License-Identifier: MIT
"""The cache of tests/lib/cache.sh, for the generators written in Python.

CACHE is $CKFS_CACHE_DIR, else $XDG_CACHE_HOME/ckfs, else ~/.cache/ckfs.
cached(path, stamp, build) gives path holding what build(tmp) made: built
once, aside, under an flock of path + ".lock", the stamp written last and
the folder renamed into place, so two generators at once build it once and
an interrupted build is never trusted. scratch_venv(prefix) is a throwaway
venv folder of this process's own; locked(path) an flock held in a with.
"""
import contextlib
import fcntl
import glob
import os
import shutil
import tempfile

CACHE = os.environ.get("CKFS_CACHE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ckfs")
STAMP = ".ckfs-stamp"


def _fresh(path, stamp):
    try:
        with open(os.path.join(path, STAMP)) as f:
            return f.read().strip() == stamp
    except OSError:
        return False


@contextlib.contextmanager
def locked(path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def cached(path, stamp, build):
    if _fresh(path, stamp):
        return path
    with locked(path):
        if _fresh(path, stamp):
            return path
        for stale in glob.glob(glob.escape(path) + ".tmp.*") + [path + ".old"]:
            shutil.rmtree(stale, ignore_errors=True)
        tmp = f"{path}.tmp.{os.getpid()}"
        try:
            build(tmp)
            with open(os.path.join(tmp, STAMP), "w") as f:
                f.write(stamp + "\n")
            if os.path.exists(path):
                os.rename(path, path + ".old")
            os.rename(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(path + ".old", ignore_errors=True)
    return path


def scratch_venv(prefix):
    os.makedirs(CACHE, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix + ".", dir=CACHE)
