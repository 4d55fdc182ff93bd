"""A training run as one mount (src/fuse/run_tree.c, include/ckfs/run.h).

Fixtures: tests/fixtures/run/ (tests/gen/make_run_fixtures.py: a real FSDP2 training loop saving
step after step through verl's checkpoint manager with rotation and the tracker file, a run
without tracker, a Megatron run). Every run is copied to a temporary folder first, since several
tests change it under the mount.

Waits (`wait_for`) only catch hangs: their limits are wide and nothing is asserted about time;
the bench (tests/bench/bench_run.sh) measures how fast the mount follows the run.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, ckfs_bin, run_ckfs

RUNS = REPO / "tests" / "fixtures" / "run"
MANIFEST = json.loads((REPO / "tests" / "fixtures" / "MANIFEST_run.json").read_text())["runs"]
HANG = 60.0  # seconds: only a hang takes this long


def wait_for(cond, what, limit=HANG):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    pytest.fail(f"gave up waiting ({limit:.0f} s) for {what}", pytrace=False)


def copy_run(name, dst: Path) -> Path:
    """The fixture run, mtimes kept (its steps are long complete), plus the empty step folder
    verl leaves behind when it rotates a step (git keeps no empty folder)."""
    shutil.copytree(RUNS / name, dst, symlinks=True)
    if name == "fsdp_ppo":
        (dst / "global_step_1").mkdir(exist_ok=True)
    return dst


class Mount:
    def __init__(self, src: Path, mnt: Path, *opts):
        self.src, self.mnt = src, mnt
        mnt.mkdir(exist_ok=True)
        p = subprocess.run([ckfs_bin(), "mount", *map(str, opts), str(src), str(mnt)], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, f"ckfs mount failed: {p.stderr}"

    def stats(self):
        return json.loads(run_ckfs("stats", "--json", self.mnt).stdout)

    def close(self):
        subprocess.run([ckfs_bin(), "umount", str(self.mnt)], capture_output=True, timeout=60)


@pytest.fixture
def mount(tmp_path):
    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing: the mount tier cannot run on this machine", pytrace=False)
    made = []

    def make(src, *opts, name="mnt"):
        m = Mount(src, tmp_path / name, *opts)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def export(src: Path, out: Path, *opts) -> Path:
    run_ckfs("export", "-q", *opts, src, out)
    return out


def same_tree(a: Path, b: Path):
    """Exactly the same files, byte for byte (b: an export)."""
    names_a = sorted(str(p.relative_to(a)) for p in a.rglob("*"))
    names_b = sorted(str(p.relative_to(b)) for p in b.rglob("*"))
    assert names_a == names_b
    for n in names_b:
        if (b / n).is_file():
            assert (a / n).read_bytes() == (b / n).read_bytes(), n


def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------
# The tree
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fsdp_ppo", "megatron", "fsdp_grpo"])
def test_run_tree_equals_export(name, tmp_path, mount):
    """MNT/global_step_N/<role>/ is what `ckfs export SRC/global_step_N/<role>` writes; only
    complete steps are shown; latest names the tracker's step (without one, the newest)."""
    src = copy_run(name, tmp_path / name)
    m = mount(src)
    want = MANIFEST[name]
    top = sorted(os.listdir(m.mnt))
    assert top == sorted(want["shown"] + ["latest"])
    assert os.readlink(m.mnt / "latest") == (want["latest"] or want["shown"][-1])
    for step in want["shown"]:
        roles = want["roles"] if isinstance(want["roles"], list) else want["roles"][step]
        assert sorted(os.listdir(m.mnt / step)) == roles
        for role in roles:
            same_tree(m.mnt / step / role, export(src / step / role, tmp_path / f"x_{step}_{role}"))
    for step in want.get("hidden", []):
        assert not (m.mnt / step).exists()  # newer than the tracker: being saved
    if name == "fsdp_ppo":
        assert not (m.mnt / "global_step_1").exists()  # rotated away: no role left


def test_run_options_apply_to_every_step(tmp_path, mount):
    src = copy_run("fsdp_ppo", tmp_path / "run")
    opts = ("--dtype", "fp32", "--max-shard-size", "20KB")
    m = mount(src, *opts)
    for step in ("global_step_3", "global_step_4"):
        for role in ("actor", "critic"):
            out = export(src / step / role, tmp_path / f"x_{step}_{role}", *opts)
            assert len([f for f in os.listdir(out) if f.endswith(".safetensors")]) > 1
            same_tree(m.mnt / step / role, out)


def test_step_folder_shows_its_roles(tmp_path, mount):
    src = copy_run("megatron", tmp_path / "run")
    m = mount(src / "global_step_2")
    assert sorted(os.listdir(m.mnt)) == ["actor", "critic"]
    same_tree(m.mnt / "critic", export(src / "global_step_2" / "critic", tmp_path / "x"))


def test_mount_reads_no_rank_file(tmp_path, mount):
    """Mounting and listing the run, the steps and their roles opens no rank file: the plans
    are built when a role's files are looked up."""
    src = copy_run("fsdp_ppo", tmp_path / "run")
    m = mount(src)
    for step in os.listdir(m.mnt):
        os.listdir(m.mnt / step)
    s = m.stats()
    assert s["source_bytes_read"] == 0
    assert all(st["plans_built"] == 0 for st in s["steps"]), s["steps"]
    (m.mnt / "global_step_4" / "actor" / "config.json").read_bytes()
    s = m.stats()
    built = {st["name"]: st["plans_built"] for st in s["steps"]}
    assert built == {"global_step_3": 0, "global_step_4": 1}


# ------------------------------------------------------------------------------------------
# Errors per step, plans in a bounded LRU
# ------------------------------------------------------------------------------------------
def test_broken_role_is_an_empty_folder(tmp_path, mount):
    src = copy_run("fsdp_ppo", tmp_path / "run")
    (src / "global_step_3" / "critic" / "model_world_size_2_rank_1.pt").unlink()
    m = mount(src)
    assert os.listdir(m.mnt / "global_step_3" / "critic") == []
    same_tree(m.mnt / "global_step_3" / "actor", export(src / "global_step_3" / "actor", tmp_path / "a"))
    same_tree(m.mnt / "global_step_4" / "critic", export(src / "global_step_4" / "critic", tmp_path / "c"))
    step3 = [s for s in m.stats()["steps"] if s["name"] == "global_step_3"][0]
    assert [b["role"] for b in step3["broken"]] == ["critic"]
    assert "model_world_size_2_rank_1.pt" in step3["broken"][0]["error"]
    out = run_ckfs("inspect", src).stdout
    assert "critic       empty: " in out and "rank_1" in out


def test_plan_lru_is_bounded_and_rebuilt(tmp_path, mount):
    src = copy_run("fsdp_ppo", tmp_path / "run")
    m = mount(src, "-o", "max_plans=1")
    want = {(s, r): sha(export(src / s / r, tmp_path / f"x_{s}_{r}") / "model.safetensors")
            for s in ("global_step_3", "global_step_4") for r in ("actor", "critic")}
    for _ in range(2):
        for (s, r), h in want.items():
            assert sha(m.mnt / s / r / "model.safetensors") == h
            st = m.stats()
            assert st["plans_cached"] <= 1
    built = sum(s["plans_built"] for s in m.stats()["steps"])
    assert built > len(want)  # evicted plans were built again


def test_changed_step_is_served_anew(tmp_path, mount):
    """A step whose files change while its plan is evicted is described afresh (new inodes),
    never with the old plan's offsets."""
    src = copy_run("fsdp_ppo", tmp_path / "run")
    m = mount(src, "-o", "max_plans=1")
    f3 = m.mnt / "global_step_3" / "actor" / "model.safetensors"
    old = sha(f3)
    sha(m.mnt / "global_step_4" / "critic" / "model.safetensors")  # evicts step 3's actor
    a3 = src / "global_step_3" / "actor"
    for p in (src / "global_step_4" / "actor").iterdir():
        if p.is_file():
            shutil.copy(p, a3 / p.name)  # step 4's actor bytes in step 3's files
    new = sha(export(a3, tmp_path / "new") / "model.safetensors")
    assert new != old

    def served():
        try:
            return sha(f3)
        except FileNotFoundError:
            return None  # the kernel's old inode: retired, looked up anew within a second

    wait_for(lambda: served() == new, "step 3 served with its new files")


# ------------------------------------------------------------------------------------------
# Live: steps coming and going
# ------------------------------------------------------------------------------------------
def test_rotated_step_open_file_never_mixes(tmp_path, mount):
    """verl's rotation (rmtree of global_step_N/<role>) removes the step from the mount; a file
    of it that is open keeps its bytes or fails with EIO, never serves other bytes."""
    src = copy_run("fsdp_ppo", tmp_path / "run")
    want = (export(src / "global_step_3" / "actor", tmp_path / "x") / "model.safetensors").read_bytes()
    m = mount(src, "--cache-size", "64KiB", "-o", "slice_size=4KiB")
    path = m.mnt / "global_step_3" / "actor" / "model.safetensors"
    fd = os.open(path, os.O_RDONLY)
    try:
        head = os.pread(fd, 4096, 0)
        assert head == want[:4096]
        shutil.rmtree(src / "global_step_3" / "actor")  # as verl's checkpoint managers do
        shutil.rmtree(src / "global_step_3" / "critic")
        wait_for(lambda: "global_step_3" not in os.listdir(m.mnt), "the rotated step to leave")
        for off in range(0, len(want), 4096):
            try:
                got = os.pread(fd, 4096, off)
            except OSError as e:
                assert e.errno == errno.EIO
                continue
            assert got == want[off:off + 4096], off
    finally:
        os.close(fd)
    assert not path.exists()


def test_run_without_tracker_waits_for_quiet(tmp_path, mount):
    """Without a tracker the newest step is shown once nothing under it changed for 10 s."""
    src = copy_run("fsdp_grpo", tmp_path / "run")
    m = mount(src)
    shutil.copytree(src / "global_step_2", src / "global_step_3")  # fresh mtimes: being saved
    # Keep it being saved (its files touched every half second) while it is
    # checked to be hidden: a stall of the busy test machine must not let
    # the quiet time pass before the check.
    files = [p for p in (src / "global_step_3").rglob("*") if p.is_file()]
    saving = threading.Event()
    saving.set()

    def save():
        while saving.is_set():
            for p in files:
                os.utime(p)
            time.sleep(0.5)

    saver = threading.Thread(target=save)
    saver.start()
    try:
        wait_for(lambda: m.stats() and True, "stats")
        time.sleep(2)
        assert "global_step_3" not in os.listdir(m.mnt)
        assert os.readlink(m.mnt / "latest") == "global_step_2"
    finally:
        saving.clear()
        saver.join()
    wait_for(lambda: "global_step_3" in os.listdir(m.mnt), "the quiet step to appear")
    assert os.readlink(m.mnt / "latest") == "global_step_3"


READER = r"""
import hashlib, json, os, sys, time
mnt, stop, out = sys.argv[1], sys.argv[2], sys.argv[3]
res = []
while not os.path.exists(stop):
    try:
        before = os.readlink(os.path.join(mnt, "latest"))
        fd = os.open(os.path.join(mnt, "latest", "actor", "model.safetensors"), os.O_RDONLY)
    except OSError as e:
        res.append(["open_error", e.errno]); time.sleep(0.01); continue
    opened = time.monotonic()
    after = os.readlink(os.path.join(mnt, "latest"))
    h = hashlib.sha256()
    try:
        while True:
            b = os.read(fd, 8192)
            if not b:
                break
            h.update(b)
        res.append(["read", before, after, opened, h.hexdigest()])
    except OSError as e:
        res.append(["read_error", before, after, opened, e.errno])
    finally:
        os.close(fd)
json.dump(res, open(out, "w"))
"""


def test_live_run_readers_never_see_wrong_bytes(tmp_path, mount):
    """A writer trains and saves steps (verl's checkpoint manager, rotation, tracker) while
    readers read latest/actor/model.safetensors in a loop: every read equals the export of the
    step it opened, and no step is opened before its tracker update."""
    run = tmp_path / "run"
    archive = tmp_path / "archive"  # hard links of every saved step: rotation cannot take them
    archive.mkdir()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    writer = subprocess.Popen([sys.executable, str(REPO / "tests" / "gen" / "make_run_fixtures.py"), "--live",
                               str(run), "--steps", "6", "--keep", "2", "--pause", "1.0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    saved = {}  # step -> CLOCK_MONOTONIC time its files were all written (the writer's)
    readers, stop = [], tmp_path / "stop"
    m = None
    try:
        for line in writer.stdout:
            if not line.startswith("saved "):
                continue
            n, complete = int(line.split()[1]), float(line.split()[2])
            saved[n] = complete
            dst = archive / f"global_step_{n}"
            shutil.copytree(run / f"global_step_{n}", dst, copy_function=os.link)
            if m is None:
                m = mount(run)
                for i in range(2):
                    readers.append(subprocess.Popen([sys.executable, "-c", READER, str(m.mnt), str(stop),
                                                     str(tmp_path / f"r{i}.json")]))
        assert writer.wait(timeout=600) == 0
        wait_for(lambda: os.readlink(m.mnt / "latest") == "global_step_6", "latest to reach step 6")
        wait_for(lambda: sorted(os.listdir(m.mnt)) == ["global_step_5", "global_step_6", "latest"],
                 "rotation to leave steps 5 and 6")
    finally:
        stop.touch()
        for r in readers:
            r.wait(timeout=120)
        if writer.poll() is None:
            writer.kill()
    want = {f"global_step_{n}": sha(export(archive / f"global_step_{n}" / "actor", tmp_path / f"x{n}")
                                    / "model.safetensors") for n in saved}
    reads = errors = other = 0
    steps_read = set()
    for i in range(len(readers)):
        for rec in json.loads((tmp_path / f"r{i}.json").read_text()):
            if rec[0] == "open_error":
                other += 1
                continue
            _, before, after, opened = rec[:4]
            if before != after:
                other += 1  # latest moved around the open: which step is unknown
                continue
            n = int(before.rsplit("_", 1)[1])
            assert n in saved
            assert opened > saved[n], f"{before} opened before all its files were written"
            if rec[0] == "read":
                assert rec[4] == want[before], f"wrong bytes from {before}"
                reads += 1
                steps_read.add(before)
            else:
                assert rec[4] == errno.EIO, rec
                errors += 1
    assert reads > 0
    assert len(steps_read) >= 2, steps_read
    print(f"live: {reads} whole reads of {len(steps_read)} steps, {errors} EIO, {other} skipped")
