# SPDX-License-Identifier: MIT
"""ckfs from Python: inspect, export and mount sharded training checkpoints.

Every function runs the ``ckfs`` binary installed with this package (the C
program itself; ``$CKFS_BIN`` overrides it), so Python sees exactly what the
command line does. A failure raises :class:`Error`, whose text is ckfs's
one-line message (``'<file>': <cause>``).

    import ckfs
    info = ckfs.inspect("checkpoints/global_step_100/actor")
    with ckfs.mount("checkpoints/global_step_100/actor") as path:
        llm = vllm.LLM(path)
    ckfs.export("checkpoints/global_step_100/actor", "merged", max_shard_size="5GB")
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any, Dict, List, Optional, Set, Type, Union

__all__ = ["Error", "Mount", "binary", "export", "inspect", "mount", "stats", "__version__"]

StrPath = Union[str, "os.PathLike[str]"]
OptionValue = Union[str, int, float, bool, None, "os.PathLike[str]"]

try:
    __version__: str = metadata.version("ckfs")
except metadata.PackageNotFoundError:  # imported from a source tree
    __version__ = "0+unknown"

_log = logging.getLogger("ckfs")


class Error(Exception):
    """A ckfs command failed.

    ``str(err)`` (and ``err.message``) is ckfs's one-line message, such as
    ``'/ckpt/model_world_size_2_rank_1.pt': truncated zip``; ``err.returncode``
    is its exit status (1: failure, 2: usage error) and ``err.command`` the
    command that was run.
    """

    def __init__(self, message: str, returncode: int, command: List[str]):
        super().__init__(message)
        self.message = message
        self.returncode = returncode
        self.command = command


def binary() -> str:
    """The path of the ``ckfs`` executable this module runs.

    ``$CKFS_BIN`` when set; otherwise the binary installed with this package
    (in the environment's ``bin/``); otherwise ``ckfs`` on ``PATH``.
    """
    override = os.environ.get("CKFS_BIN")
    if override:
        return override
    try:
        files = metadata.distribution("ckfs").files or []
    except metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == "ckfs" and f.parent.name in ("bin", "scripts"):
            path = Path(str(f.locate()))
            if os.access(path, os.X_OK):
                return str(path.resolve())
    found = shutil.which("ckfs")
    if found:
        return found
    raise Error("ckfs binary not found: install the package (pip install .) or set CKFS_BIN",
                127, [])


def _message(stderr: str) -> str:
    """ckfs's error line, without its "ckfs: " (or "ckfs mount: ") prefix."""
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("Try 'ckfs")]
    if not lines:
        return "failed without a message"
    line = lines[-1]
    head, sep, rest = line.partition(": ")
    return rest if sep and head.startswith("ckfs") else line


def _run(args: List[str]) -> subprocess.CompletedProcess:
    command = [binary(), *args]
    proc = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    for line in proc.stderr.splitlines():
        if line.startswith("ckfs: warning: "):
            _log.warning("%s", line[len("ckfs: warning: "):])
    if proc.returncode != 0:
        raise Error(_message(proc.stderr), proc.returncode, command)
    return proc


_tables: Dict[tuple, Dict[str, Any]] = {}
_tables_lock = threading.Lock()


def _names(command: str, kind: str) -> Dict[str, bool]:
    """The names ``command`` takes, each mapped to whether it takes a value:
    kind "options" its long options, "keys" the mount's -o keys. Asked of
    the binary itself (``ckfs help --options-json``, made from the option
    tables of its C source), once per binary, so the two cannot drift."""
    path = binary()
    try:
        st = os.stat(path)
        key: tuple = (path, st.st_mtime_ns, st.st_size)
    except OSError:
        key = (path,)
    with _tables_lock:
        table = _tables.get(key)
    if table is None:
        table = json.loads(_run(["help", "--options-json"]).stdout)
        with _tables_lock:
            _tables[key] = table
    return table[command][kind]


def _quoted(text: str) -> str:
    """text in quotes on one line: control characters escaped."""
    return "'" + "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text) + "'"


def _usage(message: str) -> Error:
    """A usage error found before anything runs (exit status 2, as ckfs's)."""
    return Error(message, 2, [])


def _value_text(value: OptionValue) -> str:
    return os.fspath(value) if isinstance(value, os.PathLike) else str(value)


def _check_value(name: str, value: OptionValue, takes_value: bool) -> None:
    if takes_value and value is True:
        raise _usage(f"option {_quoted(name)} needs a value")
    if not takes_value and value is not True:
        raise _usage(f"option {_quoted(name)} takes no value (pass True)")


def _long_options(command: str, options: Dict[str, OptionValue]) -> List[str]:
    """Keyword arguments as ``command``'s long options: raw_names=True ->
    --raw-names, dtype="fp32" -> --dtype fp32; False and None leave an
    option out. A name that is not one of its options is refused (a name
    such as "config=/etc/passwd" would otherwise be read as an option and
    its value)."""
    table: Optional[Dict[str, bool]] = None
    args: List[str] = []
    for name, value in options.items():
        if value is None or value is False:
            continue
        table = table or _names(command, "options")  # asked only when there is a name
        flag = name.replace("_", "-")
        if flag not in table:
            raise _usage(f"unknown option {_quoted(name)} of ckfs {command}")
        _check_value(name, value, table[flag])
        args += ["--" + flag] if value is True else ["--" + flag, _value_text(value)]
    return args


def _mount_options(options: Dict[str, OptionValue]) -> List[str]:
    """Keyword arguments as the mount's -o keys: cache_size="2GiB" ->
    cache_size=2GiB, allow_other=True -> allow_other. Names are checked as
    values are: a name that is not a key of the mount's option table (such
    as "dtype=fp32,allow_other", which would add allow_other), and a value
    holding a comma, are refused before anything is mounted."""
    table: Optional[Dict[str, bool]] = None
    keys: List[str] = []
    for name, value in options.items():
        if value is None or value is False:
            continue
        table = table or _names("mount", "keys")
        whole = name if value is True else f"{name}={_value_text(value)}"
        if name not in table:
            raise _usage(f"unknown mount option {_quoted(whole)}")
        _check_value(name, value, table[name])
        if "," in whole:
            raise _usage(f"mount option {_quoted(whole)}: a value cannot hold a comma")
        keys.append(whole)
    return ["-o", ",".join(keys)] if keys else []


def inspect(src: StrPath, **options: OptionValue) -> Dict[str, Any]:
    """What ckfs finds in checkpoint ``src``, from metadata only.

    Returns the object of ``ckfs inspect --json``: ``layout``, ``world_size``,
    ``tensors`` (name, shape, dtypes, placement), ``files`` of the folder it
    serves, ``totals`` and ``warnings``. For a training run or one of its
    ``global_step_<N>`` folders, ``kind`` is ``"run"`` or ``"step"`` and
    ``steps`` lists each step's ``state`` and its ``roles`` (``layout``,
    ``bytes``, ... or ``error``). Keyword arguments are ``inspect``'s
    long options (``dtype="fp32"``, ``config=path``, ``raw_names=True``);
    any other name is refused with :class:`Error` (``returncode`` 2).
    """
    proc = _run(["inspect", "--json", *_long_options("inspect", options), "--", os.fspath(src)])
    return json.loads(proc.stdout)


def export(src: StrPath, dst: StrPath, dtype: str = "bf16",
           max_shard_size: Union[str, int, None] = None, force: bool = False,
           **options: OptionValue) -> Union[Path, str]:
    """Write the merged Hugging Face folder of checkpoint ``src`` to ``dst``.

    ``dtype``: ``bf16`` (verl's output), ``fp16``, ``fp32`` or ``auto`` (as
    stored); ``max_shard_size``: bytes, or a size such as ``"5GB"``, for
    sharded weights with an index; ``force``: replace an existing ``dst``.
    Other keyword arguments are ``export``'s long options (any other name
    is refused with :class:`Error`, ``returncode`` 2). ``dst`` appears
    only once every file is written. ``dst`` may be ``"s3://bucket/prefix"``:
    the files are uploaded there, ``config.json`` last (``part="I/N"``
    splits the export over N processes, locally or to the store). Returns
    ``dst`` as a Path, or the ``s3://`` URL as given.
    """
    args = ["export", "--dtype", dtype]
    if max_shard_size is not None:
        args += ["--max-shard-size", str(max_shard_size)]
    if force:
        args.append("--force")
    dst = os.fspath(dst)
    _run([*args, *_long_options("export", options), "--", os.fspath(src), dst])
    return dst if dst.startswith("s3://") else Path(dst)


def stats(mountpoint: StrPath) -> Dict[str, Any]:
    """The counters of a running mount (``ckfs stats --json``)."""
    return json.loads(_run(["stats", "--json", "--", os.fspath(mountpoint)]).stdout)


_live: Set["Mount"] = set()
_live_lock = threading.Lock()


def _unmount_all() -> None:
    with _live_lock:
        mounts = list(_live)
    for m in mounts:
        try:
            m.unmount()
        except Error as e:  # at exit nothing can be raised to; say it
            _log.error("%s", e)


atexit.register(_unmount_all)


class Mount:
    """A checkpoint mounted by ``ckfs mount``; see :func:`mount`.

    Used as a context manager, its value is the mounted folder's path, and
    leaving the block unmounts it. ``path`` is that folder, ``source`` the
    checkpoint; :meth:`unmount` unmounts it at any time (once).
    """

    def __init__(self, src: StrPath, mountpoint: Optional[StrPath] = None,
                 **options: OptionValue):
        self.source = os.path.abspath(os.fspath(src))
        self._made_dir: Optional[str] = None
        args = _mount_options(options)  # refuse a bad name or value before mounting
        if mountpoint is None:
            self._made_dir = tempfile.mkdtemp(prefix="ckfs-")
            mountpoint = self._made_dir
        self.path = os.path.abspath(os.fspath(mountpoint))
        if self._made_dir is None:
            _check_empty(self.path)
        try:
            _run(["mount", *args, "--", self.source, self.path])
        except BaseException:
            self._remove_made_dir()
            raise
        with _live_lock:
            _live.add(self)

    @property
    def mounted(self) -> bool:
        """Whether this object's mount is still in place."""
        with _live_lock:
            return self in _live

    def unmount(self) -> None:
        """Unmount (lazily: readers still holding a file keep it until they
        close it) and remove the mount point if it was made here."""
        with _live_lock:
            if self not in _live:
                return
            _live.discard(self)
        try:
            _run(["umount", "-z", "--", self.path])
        except Error:
            if _is_mount_point(self.path):
                raise
            # already unmounted by someone else: nothing to do
        self._remove_made_dir()

    def _remove_made_dir(self) -> None:
        if self._made_dir:
            try:
                os.rmdir(self._made_dir)
            except OSError as e:
                _log.warning("'%s': %s", self._made_dir, e.strerror)
            self._made_dir = None

    def __enter__(self) -> str:
        return self.path

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.unmount()

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        state = "mounted" if self.mounted else "unmounted"
        return f"<ckfs.Mount {self.source!r} at {self.path!r} ({state})>"


def _check_empty(path: str) -> None:
    """A given mount point must be an empty folder: mounting over files
    hides them until the unmount, and a caller naming a full folder has
    most likely named the wrong one. (`ckfs mount` itself mounts over a
    non-empty folder, as mount(8) and libfuse 3 do for fstab and systemd;
    docs/mount.md.)"""
    try:
        entries = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return  # ckfs mount says what is wrong with it
    except OSError as e:
        raise Error(f"{_quoted(path)}: cannot list: {e.strerror}", 1, []) from None
    if entries:
        raise Error(f"{_quoted(path)}: mount point is not empty; mount on an empty "
                    f"folder", 1, [])


def _is_mount_point(path: str) -> bool:
    """Whether path is in this process's mount table (a dead FUSE mount too)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            targets = [line.split()[4] for line in f]
    except OSError:
        return os.path.ismount(path)
    escaped = path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011") \
        .replace("\n", "\\012")
    return escaped in targets


def mount(src: StrPath, mountpoint: Optional[StrPath] = None, **options: OptionValue) -> Mount:
    """Mount checkpoint ``src`` as its merged Hugging Face folder.

    ``mountpoint``: an existing empty folder (a folder holding anything is
    refused with :class:`Error`); a temporary one (removed afterwards) when
    not given. Keyword arguments are the mount's ``-o`` keys
    (``dtype="fp32"``, ``cache_size="2GiB"``, ``allow_other=True``,
    ``max_shard_size="5GB"``; see ``ckfs mount --help``): any other name,
    a value for a flag, ``True`` for a key that needs a value, or a value
    holding a comma is refused with :class:`Error` (``returncode`` 2)
    before anything is mounted. Returns once the
    folder is ready, as a :class:`Mount`; as a context manager its value is
    the folder's path, unmounted when the block ends, and every mount still
    in place is unmounted when the interpreter exits::

        with ckfs.mount("checkpoints/global_step_100/actor") as path:
            llm = vllm.LLM(path)
    """
    return Mount(src, mountpoint, **options)
