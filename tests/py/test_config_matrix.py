"""config.json by transformers release (tests/gen/make_config_matrix.py).

verl's merger re-serialises config.json through the transformers it runs with. ckfs serves the
checkpoint's own config.json with the merger's edits (docs/formats.md "config.json by
transformers release"), whatever transformers the reader has. For every recorded release:
- loaded.json, written by that release when the matrix was made, must list no key: the release
  builds the same config from ckfs's file as from the one its own merger run writes;
- as JSON text, ckfs's file and the release's may differ only in the keys DIFFERS lists (and
  docs/formats.md), so a new difference fails the test until it is looked at and written down.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import FIXTURES, run_ckfs

MATRIX = FIXTURES / "matrix"
RELEASES = sorted(p for p in MATRIX.glob("transformers-*") if (p / "versions.json").exists())

# (release, config) -> top-level keys whose presence or value differs, as JSON, between ckfs's
# config.json (--transformers-version release; 4.x is not imitated: the default) and what that
# release's merger writes (docs/formats.md "config.json by transformers release").
ROPE = {"rope_scaling", "rope_theta"}
DIFFERS: dict[tuple[str, str], set[str]] = {
    ("4.57.6", "llama_tied"): ROPE,
    ("4.57.6", "qwen2"): ROPE,
    ("4.57.6", "qwen2_critic"): ROPE | {"dtype"},
    ("4.57.6", "qwen2_vl"): {"dtype", "text_config", "vision_config"},
    ("4.57.6", "qwen3_moe"): ROPE | {"num_experts"},
    ("5.10.4", "qwen2_critic"): {"dtype"},
    ("5.23.0", "qwen2_vl"): {"vision_config"},
}
# (release, config) -> keys whose values differ when that release loads ckfs's file and its own.
LOADS_DIFFERENTLY: dict[tuple[str, str], list[str]] = {
    ("4.57.6", "qwen2_critic"): ["dtype"],
    ("4.57.6", "qwen2_vl"): ["dtype", "text_config", "vision_config"],
    ("5.10.4", "qwen2_critic"): ["dtype"],
}
ALWAYS = {"transformers_version"}


def release_args(release: str) -> list[str]:
    return ["--transformers-version", release] if release.startswith("5.") else []


def flat_diff(a: dict, b: dict) -> set[str]:
    return {k for k in set(a) | set(b) if a.get(k, object()) != b.get(k, object())}


def cases():
    for rel in RELEASES:
        versions = json.loads((rel / "versions.json").read_text())
        for name, src in versions["configs"].items():
            yield pytest.param(versions["transformers"], name, src, id=f"{rel.name}-{name}")


def test_matrix_present():
    assert len(RELEASES) >= 3, f"tests/fixtures/matrix has {len(RELEASES)} transformers releases"


@pytest.mark.parametrize("release,name,src", list(cases()))
def test_release_loads_the_same(release, name, src):
    loaded = json.loads((MATRIX / f"transformers-{release}" / name / "loaded.json").read_text())
    got = [k for k in loaded["keys_that_load_differently"] if k != "_name_or_path"]
    assert got == LOADS_DIFFERENTLY.get((release, name), []), (release, name, got)


@pytest.mark.parametrize("release,name,src", list(cases()))
def test_config_against_release(tmp_path, release, name, src):
    out = tmp_path / "out"
    run_ckfs("export", FIXTURES / src / "..", out, "--dtype", "bf16", *release_args(release))
    ours = json.loads((out / "config.json").read_text())
    theirs = json.loads((MATRIX / f"transformers-{release}" / name / "config.json").read_text())
    got = flat_diff(ours, theirs) - ALWAYS
    want = DIFFERS.get((release, name), set())
    detail = {k: (ours.get(k, "<absent>"), theirs.get(k, "<absent>")) for k in sorted(got)}
    print(f"transformers {release} {name}: differs in {sorted(got) or 'nothing'}")
    assert got == want, f"transformers {release} {name}: ckfs vs release differ in {detail}"
