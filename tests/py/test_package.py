# SPDX-License-Identifier: MIT
"""The Python package, installed the way its users install it.

Once per run: a fresh venv, `pip wheel <clone>` (pip's build isolation installs
scikit-build-core, which drives the CMake build), then `pip install` of that
wheel. The build requirements are downloaded from the package registry once into
~/.cache/ckfs/build-wheels and taken from there (--no-index) on later runs. Then, in that venv: the `ckfs` command on its PATH
is the C binary with CMake's version, the man page and the completion are
installed, and the module `ckfs` inspects, exports and mounts a fixture
through its API (context manager, explicit mount points, `-o` keys, errors as
`ckfs.Error` with the one-line message, unmounting at interpreter exit).

The tier's $CKFS_BIN is removed from the venv's environment, so everything
here runs the installed binary.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO

VERSION = re.search(r"project\(ckfs VERSION ([0-9.]+)", (REPO / "CMakeLists.txt").read_text())[1]
FIXTURE = FIXTURES / "fsdp" / "llama_tied_fsdp2_w4"
EXPECTED = FIXTURES / "expected" / "llama_tied_fsdp2_w4" / "model.safetensors"
CACHE = Path(os.environ.get("CKFS_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ckfs"))
WHEELHOUSE = CACHE / "build-wheels"  # scikit-build-core and its dependencies
TIMEOUT = 900  # the build; a hang, not a measure


class Venv:
    def __init__(self, root: Path, wheel: Path, tmp: Path):
        self.root, self.wheel, self.tmp = root, wheel, tmp
        self.bin = root / "bin"
        env = {k: v for k, v in os.environ.items() if k not in ("CKFS_BIN", "PYTHONPATH")}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        env["TMPDIR"] = str(tmp)  # temporary mount points land here, to be counted
        self.env = env

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=300)
        if check and p.returncode != 0:
            pytest.fail(f"{' '.join(args)} exited {p.returncode}\n{p.stdout[-3000:]}\n"
                        f"{p.stderr[-3000:]}", pytrace=False)
        return p

    def python(self, code: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run(str(self.bin / "python"), "-c", textwrap.dedent(code), *map(str, args),
                        check=check)


def _say(request, line: str) -> None:
    """One line on the terminal, past pytest's output capture."""
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter and capture:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"test_package: {line}")


@pytest.fixture(scope="module")
def venv(tmp_path_factory, request) -> Venv:
    work = tmp_path_factory.mktemp("package")
    root, dist = work / "venv", work / "dist"
    base = getattr(sys, "_base_executable", sys.executable)
    python = str(root / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("CKFS_BIN", "PYTHONPATH")}
    env.update(PIP_CACHE_DIR=str(CACHE / "pip"), PIP_DISABLE_PIP_VERSION_CHECK="1",
               CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    # The build requirements come from the package registry once, into a
    # wheelhouse kept under ~/.cache/ckfs (the registry's answers are not
    # cacheable by pip's own cache); the build itself then needs no network.
    # Filled under a lock, its stamp written last: a run beside this one
    # waits, and an interrupted fill is fetched again.
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    stamp = WHEELHOUSE / ".requires"
    t0 = time.monotonic()

    def run(cmd):
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        if p.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-4000:]}\n"
                        f"{p.stderr[-4000:]}", pytrace=False)

    run([base, "-m", "venv", str(root)])
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    with open(f"{WHEELHOUSE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fetch = stamp.read_text() != "\n".join(requires) if stamp.exists() else True
        if fetch:
            run([python, "-m", "pip", "download", "-q", "-d", str(WHEELHOUSE), *requires])
            stamp.write_text("\n".join(requires))
        run([python, "-m", "pip", "wheel", "--no-deps", "--no-index", "--find-links",
             str(WHEELHOUSE), "-w", str(dist), str(REPO)])
    built = time.monotonic() - t0
    wheels = sorted(dist.glob("ckfs-*.whl"))
    assert len(wheels) == 1, f"pip wheel made {wheels}"
    p = subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "--no-deps",
                        str(wheels[0])], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr[-4000:]
    # pip keeps the wheels it builds from a folder but never reuses them: drop them.
    for stale in (CACHE / "pip" / "wheels").rglob("ckfs-*.whl"):
        stale.unlink()
    tmp = work / "tmp"
    tmp.mkdir()
    how = "downloaded into" if fetch else "offline, from"
    _say(request, f"built {wheels[0].name} from {REPO} in a fresh venv ({base}) in {built:.0f} s "
                  f"(build requirements {how} {WHEELHOUSE}), installed in "
                  f"{time.monotonic() - t0 - built:.0f} s into {root}")
    return Venv(root, wheels[0], tmp)


def mounted(path: str) -> bool:
    esc = path.replace("\\", "\\134").replace(" ", "\\040")
    return any(line.split()[4] == esc for line in open("/proc/self/mountinfo"))


def test_wheel_contents(venv):
    assert venv.wheel.name == f"ckfs-{VERSION}-py3-none-linux_x86_64.whl"
    names = set(zipfile.ZipFile(venv.wheel).namelist())
    data = f"ckfs-{VERSION}.data"
    for want in ["ckfs/__init__.py", "ckfs/py.typed", f"{data}/scripts/ckfs",
                 f"{data}/data/share/man/man1/ckfs.1",
                 f"{data}/data/share/bash-completion/completions/ckfs",
                 f"ckfs-{VERSION}.dist-info/licenses/LICENSE"]:
        assert want in names, f"the wheel lacks {want}: {sorted(names)}"
    meta = zipfile.ZipFile(venv.wheel).read(f"ckfs-{VERSION}.dist-info/METADATA").decode()
    assert f"\nVersion: {VERSION}\n" in meta


def test_command_is_the_c_binary(venv):
    exe = venv.bin / "ckfs"
    assert exe.read_bytes()[:4] == b"\x7fELF", "bin/ckfs is not the C binary"
    assert venv.run("sh", "-c", "command -v ckfs").stdout.strip() == str(exe)
    out = venv.run("ckfs", "--version").stdout.splitlines()
    assert out[0] == f"ckfs {VERSION}"
    assert out[1].startswith("built with libfuse ")
    man = venv.root / "share" / "man" / "man1" / "ckfs.1"
    completion = venv.root / "share" / "bash-completion" / "completions" / "ckfs"
    assert man.read_text() == venv.run("ckfs", "help", "--man").stdout
    assert completion.read_text() == venv.run("ckfs", "help", "--bash-completion").stdout
    # the module's version and the binary it runs
    p = venv.python("import ckfs; print(ckfs.__version__); print(ckfs.binary())")
    assert p.stdout.split() == [VERSION, str(exe)]


def test_inspect_and_export(venv, tmp_path):
    p = venv.python("""
        import json, sys, ckfs
        info = ckfs.inspect(sys.argv[1])
        out = ckfs.export(sys.argv[1], sys.argv[2])
        print(json.dumps({"layout": info["layout"], "world_size": info["world_size"],
                          "files": [f["name"] for f in info["files"]], "out": str(out)}))
        """, FIXTURE, tmp_path / "merged")
    got = json.loads(p.stdout)
    assert got["layout"] == "verl-fsdp" and got["world_size"] == 4
    assert "model.safetensors" in got["files"]
    assert (tmp_path / "merged" / "model.safetensors").read_bytes() == EXPECTED.read_bytes()

    # exists already: refused with the one line; force=True replaces it;
    # dtype and max_shard_size reach the command
    p = venv.python("""
        import json, sys, ckfs
        try:
            ckfs.export(sys.argv[1], sys.argv[2])
        except ckfs.Error as e:
            print(json.dumps([e.message, e.returncode]))
        ckfs.export(sys.argv[1], sys.argv[2], dtype="fp32", max_shard_size="100KB", force=True)
        """, FIXTURE, tmp_path / "merged")
    message, code = json.loads(p.stdout)
    assert code == 1 and "\n" not in message and message.startswith(f"'{tmp_path / 'merged'}'")
    index = json.loads((tmp_path / "merged" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["dtype"] == "float32"

    # an s3:// DIR reaches the command as written (the store's own tests
    # are tests/s3/test_s3_export.sh): a bucket alone is refused there
    p = venv.python("""
        import json, sys, ckfs
        try:
            ckfs.export(sys.argv[1], "s3://bucket")
        except ckfs.Error as e:
            print(json.dumps(e.message))
        """, FIXTURE)
    assert "'s3://bucket': name a prefix for the folder" in json.loads(p.stdout)


def test_mount_context_manager(venv, tmp_path):
    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing: the mount API cannot be tested here", pytrace=False)
    p = venv.python("""
        import json, os, sys, ckfs
        with ckfs.mount(sys.argv[1]) as path:
            data = open(os.path.join(path, "model.safetensors"), "rb").read()
            same = data == open(sys.argv[2], "rb").read()
            inside = [isinstance(path, str), os.path.ismount(path), same, ckfs.stats(path)["files"]]
        after = [os.path.exists(path)]
        mnt = os.path.join(sys.argv[3], "mnt")
        os.mkdir(mnt)
        try:
            with ckfs.mount(sys.argv[1], mnt, dtype="fp32", cache_size="64MiB") as p2:
                cfg = json.load(open(os.path.join(p2, "config.json")))
                raise KeyError("inside")
        except KeyError:
            pass
        after += [p2 == mnt, os.path.ismount(mnt), os.path.isdir(mnt), cfg["dtype"]]
        print(json.dumps({"path": path, "inside": inside, "after": after}))
        """, FIXTURE, EXPECTED, tmp_path)
    got = json.loads(p.stdout)
    assert got["inside"] == [True, True, True, 6], got
    # the temporary mount point is gone; a given one is unmounted and kept;
    # an exception in the block unmounts too
    assert got["after"] == [False, True, False, True, "float32"], got
    assert not mounted(got["path"])
    assert not os.listdir(venv.tmp), f"left in TMPDIR: {os.listdir(venv.tmp)}"


def test_mount_errors(venv, tmp_path):
    p = venv.python("""
        import json, sys, ckfs
        out = []
        for src, opts in [(sys.argv[1] + "/nonexistent", {}), (sys.argv[2], {"bogus": 1}),
                          (sys.argv[2], {"dtype": "int7"})]:
            try:
                ckfs.mount(src, **opts)
                out.append("mounted")
            except ckfs.Error as e:
                out.append([str(e), e.returncode])
        print(json.dumps(out))
        """, tmp_path, FIXTURE)
    missing, bogus, dtype = json.loads(p.stdout)
    assert missing == [f"'{tmp_path}/nonexistent': not found", 1]
    assert bogus == ["unknown mount option 'bogus=1'", 2]
    assert dtype == ["unknown --dtype 'int7' (bf16, fp16, fp32, auto, fp8, w4a16, nvfp4, q8_0 or q4_0)", 2]
    assert not os.listdir(venv.tmp), f"temporary mount points left: {os.listdir(venv.tmp)}"


def test_option_names_checked(venv, tmp_path):
    """Keyword names are checked against the binary's own option tables (`ckfs help
    --options-json`), as values are: a name that would add options (issue #22:
    `**{"dtype=fp32,allow_other": True}` mounted with allow_other), an unknown name, a value
    for a flag, True for a key that needs a value and a comma in a value are refused with
    ckfs.Error naming the key (usage error, 2) before anything is mounted or run."""
    p = venv.python("""
        import json, os, sys, ckfs
        out = []
        def attempt(fn, *args, **opts):
            try:
                fn(*args, **opts)
                out.append("ran")
            except ckfs.Error as e:
                out.append([str(e), e.returncode])
        src, mnt = sys.argv[1], os.path.join(sys.argv[2], "mnt")
        os.mkdir(mnt)
        for opts in [{"dtype=fp32,allow_other": True}, {"allow_other,dtype": "fp32"},
                     {"allow_other": "1"}, {"dtype": True}, {"dtype": "fp32,allow_other"},
                     {"x\\ny": True}]:
            attempt(ckfs.mount, src, mnt, **opts)
        attempt(ckfs.inspect, src, **{"config=/etc/passwd": True})
        attempt(ckfs.inspect, src, raw_namez=True)
        attempt(ckfs.export, src, os.path.join(sys.argv[2], "out"), **{"force --quiet": True})
        attempt(ckfs.inspect, src, raw_names=True, dtype="fp32")  # names of the table: run
        # a flag and a valued key of the table, named by their Python spelling, mount
        with ckfs.mount(src, mnt, follow_symlinks=True, dtype="fp32") as path:
            out.append(json.load(open(os.path.join(path, "config.json")))["dtype"])
        print(json.dumps([out, os.listdir(mnt), os.path.ismount(mnt)]))
        """, FIXTURE, tmp_path)
    out, left, still = json.loads(p.stdout)
    assert out == [
        ["unknown mount option 'dtype=fp32,allow_other'", 2],
        ["unknown mount option 'allow_other,dtype=fp32'", 2],
        ["option 'allow_other' takes no value (pass True)", 2],
        ["option 'dtype' needs a value", 2],
        ["mount option 'dtype=fp32,allow_other': a value cannot hold a comma", 2],
        ["unknown mount option 'x\\ny'", 2],
        ["unknown option 'config=/etc/passwd' of ckfs inspect", 2],
        ["unknown option 'raw_namez' of ckfs inspect", 2],
        ["unknown option 'force --quiet' of ckfs export", 2],
        "ran", "float32"], out
    assert left == [] and not still
    assert not (tmp_path / "out").exists()
    # the names are the binary's, flags and keys that take a value told apart
    keys = json.loads(venv.run("ckfs", "help", "--options-json").stdout)["mount"]["keys"]
    assert keys["allow_other"] is False and keys["cache_size"] is True and "bogus" not in keys


def test_mount_into_non_empty_folder(venv, tmp_path):
    """A given mount point must be empty: a folder holding a file is refused with ckfs.Error
    naming it, nothing mounted, the file still there (`ckfs mount` itself mounts over it, as
    mount(8) and libfuse 3 do: docs/mount.md)."""
    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing: the mount API cannot be tested here", pytrace=False)
    mnt = tmp_path / "full"
    mnt.mkdir()
    (mnt / "keep").write_text("x")
    p = venv.python("""
        import json, sys, ckfs
        try:
            ckfs.mount(sys.argv[1], sys.argv[2])
            print(json.dumps("mounted"))
        except ckfs.Error as e:
            print(json.dumps([str(e), e.returncode]))
        """, FIXTURE, mnt)
    assert json.loads(p.stdout) == [f"'{mnt}': mount point is not empty; mount on an empty folder", 1]
    assert not mounted(str(mnt)) and (mnt / "keep").read_text() == "x"


@pytest.mark.parametrize("ending", ["returns", "raises"])
def test_unmounted_at_interpreter_exit(venv, ending):
    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing: the mount API cannot be tested here", pytrace=False)
    p = venv.python(f"""
        import os, sys, ckfs
        m = ckfs.mount(sys.argv[1])
        print(m.path, flush=True)
        assert os.path.ismount(m.path)
        if {ending == "raises"}:
            raise SystemExit("leaving with the mount in place")
        """, FIXTURE, check=False)
    path = p.stdout.strip()
    assert path and p.returncode == (1 if ending == "raises" else 0), p.stderr
    assert not mounted(path), f"{path} still mounted after the interpreter exited"
    assert not os.path.exists(path)
