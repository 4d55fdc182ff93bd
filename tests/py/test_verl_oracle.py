"""ckfs export == verl's merger, byte for byte; verl run live (the real oracle)."""

import filecmp
import json
import re

from conftest import BY_NAME, expected_dir, json_without_version, weight_files


def assert_config_matches_verl(out, oracle):
    """config.json equal to verl's, apart from transformers_version.

    One documented deviation: for a *ForTokenClassification critic whose source config says
    float32, transformers 5.10.4 builds verl's shell model half in fp32 and stamps
    "dtype": "float32" into config.json although every weight it writes is bf16.  ckfs
    states the dtype it serves (docs/formats.md); the weights themselves are byte-identical.
    """
    ours, theirs = json_without_version(out / "config.json"), json_without_version(oracle / "config.json")
    arch = (theirs.get("architectures") or [""])[0]
    if arch.endswith("ForTokenClassification") and theirs.get("dtype") == "float32" \
            and ours.get("dtype") == "bfloat16":
        header = json.loads((out / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
            (out / "model.safetensors").read_bytes()[:8], "little")])
        assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
        theirs["dtype"] = "bfloat16"
    assert ours == theirs, "config.json differs from verl's (ignoring transformers_version)"


def _live_oracle(verl_live, config):
    """Live oracle output for this config; for checkpoints verl refuses, its twin's output."""
    name = config["expected"]
    rc, target, tail = verl_live("oracle", name)
    assert rc == 0, f"oracle merge of {name} failed (exit {rc}):\n{tail}"
    return target


def test_live_verl_equals_committed(config, verl_live):
    """The committed expected output is what verl produces in this environment (catches drift)."""
    if config["expected"] != config["name"]:
        return  # no output of its own; covered by test_verl_refuses and by its twin
    rc, target, tail = verl_live("oracle", config["name"])
    assert rc == 0, f"oracle merge failed (exit {rc}):\n{tail}"
    exp = expected_dir(config)
    assert weight_files(target) == weight_files(exp)
    for fn in weight_files(exp):
        assert filecmp.cmp(target / fn, exp / fn, shallow=False), \
            f"live verl {fn} differs from committed {exp / fn}: regenerate fixtures (tests/gen/make_fixtures.py)"
    assert json_without_version(target / "config.json") == json_without_version(exp / "config.json")


def test_verl_refuses(config, verl_live):
    """Checkpoints recorded as refused by verl's merger are still refused (documents the gap ckfs fills)."""
    if config["verl_merger"] == "ok":
        return
    rc, _, tail = verl_live("verl_cli", config["name"])
    assert rc != 0, f"verl's merger now accepts {config['name']}; update the fixtures' MANIFEST"
    m = re.search(r"(\w+Error)", config["verl_merger"])
    assert m and m.group(1) in tail, f"verl failed differently than recorded ({config['verl_merger']}):\n{tail}"


def test_ckfs_export_equals_verl(config, verl_live, ckfs_export):
    oracle = _live_oracle(verl_live, config)
    out = ckfs_export(config)
    assert weight_files(out) == weight_files(oracle), "ckfs and verl split the weights differently"
    for fn in weight_files(oracle):
        assert filecmp.cmp(out / fn, oracle / fn, shallow=False), \
            f"{fn}: ckfs bytes differ from verl's merger ({oracle / fn})"
    if (oracle / "model.safetensors.index.json").exists():
        assert json.loads((out / "model.safetensors.index.json").read_text()) == \
            json.loads((oracle / "model.safetensors.index.json").read_text())
    assert_config_matches_verl(out, oracle)
    if (oracle / "generation_config.json").exists() and (out / "generation_config.json").exists():
        assert json_without_version(out / "generation_config.json") == \
            json_without_version(oracle / "generation_config.json")


def test_ckfs_export_equals_committed(config, ckfs_export):
    """Same comparison against the committed output (needs no verl run)."""
    exp = expected_dir(config)
    out = ckfs_export(config)
    for fn in weight_files(exp):
        assert filecmp.cmp(out / fn, exp / fn, shallow=False), f"{fn}: ckfs bytes differ from {exp / fn}"
    assert_config_matches_verl(out, exp)


def test_manifest_twins_exist():
    for c in BY_NAME.values():
        assert c["expected"] in BY_NAME, c["name"]
        assert (expected_dir(c) / "model.safetensors").exists() or \
            (expected_dir(c) / "model.safetensors.index.json").exists(), c["name"]
