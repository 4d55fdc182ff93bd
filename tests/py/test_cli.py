"""ckfs inspect / verify / export behaviour at the command line."""

import json
import shutil
import struct

from pathlib import Path

from conftest import (FIXTURES, ckpt_dir, expected_dir, load_file, original_path, run_ckfs,
                      weight_files)


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def test_inspect_json_lists_every_tensor(config):
    p = run_ckfs("inspect", ckpt_dir(config), "--json")
    doc = json.loads(p.stdout)
    names = set(load_file(original_path(config)))
    if config["tied"]:
        names.discard("lm_head.weight")
    found = set(_strings(doc))
    assert names <= found, f"inspect --json does not mention {sorted(names - found)[:10]}"


def test_verify_against_verl_output_passes(config):
    p = run_ckfs("verify", ckpt_dir(config), "--against", expected_dir(config), check=False)
    assert p.returncode == 0, f"verify failed (exit {p.returncode}): {p.stdout[-1000:]} {p.stderr[-1000:]}"


def _corrupt_one_tensor(folder):
    """Change one element of the largest tensor of the first weight file (bf16: +1.0 to it)."""
    fn = folder / weight_files(folder)[0]
    data = bytearray(fn.read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    name, info = max(((k, v) for k, v in header.items() if k != "__metadata__"),
                     key=lambda kv: kv[1]["data_offsets"][1] - kv[1]["data_offsets"][0])
    off = 8 + n + info["data_offsets"][0] + 2 * 7  # element 7
    old = struct.unpack_from("<H", data, off)[0]
    struct.pack_into("<H", data, off, old ^ 0x4000)  # flips an exponent bit: a large change
    fn.write_bytes(bytes(data))
    return name


def test_verify_against_modified_copy_fails(config, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(expected_dir(config), bad)
    name = _corrupt_one_tensor(bad)
    p = run_ckfs("verify", ckpt_dir(config), "--against", bad, check=False)
    assert p.returncode != 0, f"verify passed although {name} was modified"


def test_export_refuses_existing_dir(tmp_path):
    from conftest import CONFIGS

    config = CONFIGS[0]
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    p = run_ckfs("export", ckpt_dir(config), out, check=False)
    assert p.returncode != 0, "export overwrote an existing directory without --force"
    assert p.stderr.strip(), "no error message"
    assert (out / "keep.txt").read_text() == "mine"
    run_ckfs("export", ckpt_dir(config), out, "--force")
    assert (out / "model.safetensors").exists()


def test_export_of_non_checkpoint_fails_cleanly(tmp_path):
    src = tmp_path / "not_a_checkpoint"
    src.mkdir()
    (src / "README.txt").write_text("nothing to see\n")
    out = tmp_path / "out"
    p = run_ckfs("export", src, out, check=False)
    assert p.returncode != 0
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected a one-line error, got:\n{p.stderr}"
    assert not out.exists(), "a failed export left its output directory behind"


def test_export_of_missing_dir_fails_cleanly(tmp_path):
    out = tmp_path / "out"
    p = run_ckfs("export", tmp_path / "does_not_exist", out, check=False)
    assert p.returncode != 0
    assert len([ln for ln in p.stderr.splitlines() if ln.strip()]) == 1, p.stderr
    assert not out.exists()


def test_export_large_weights_direct_and_buffered(tmp_path):
    """A weights file of several 8 MiB blocks and a short last one: export writes the whole blocks
    with O_DIRECT where the file system takes it (ext4 under the test's tmp_path) and everything
    through the page cache where it does not (tmpfs, /dev/shm); both outputs are the same bytes
    and hold the input's tensors (safetensors' own writer made the input)."""
    import os
    import tempfile

    import torch
    from safetensors.torch import load_file as st_load, save_file

    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(FIXTURES / "fsdp" / "qwen2_fsdp2_w2" / "huggingface" / "config.json",
                src / "config.json")
    g = torch.Generator().manual_seed(28)
    weights = {"model.embed_tokens.weight": torch.randn(9000, 1024, generator=g).to(torch.bfloat16),
               "model.norm.weight": torch.randn(1024, generator=g).to(torch.bfloat16)}
    save_file(weights, str(src / "model.safetensors"), metadata={"format": "pt"})
    outs = [tmp_path / "disk"]
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        outs.append(Path(tempfile.mkdtemp(dir=shm)) / "out")
    try:
        for out in outs:
            run_ckfs("export", "-q", src, out)
        blobs = [(out / "model.safetensors").read_bytes() for out in outs]
        assert len(blobs[0]) > 2 * 8 * 1024 * 1024 and len(blobs[0]) % (8 * 1024 * 1024) != 0
        assert all(b == blobs[0] for b in blobs), "the disk and tmpfs exports differ"
        got = st_load(str(outs[0] / "model.safetensors"))
        assert got.keys() == weights.keys()
        for k, v in weights.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    finally:
        for out in outs[1:]:
            shutil.rmtree(out.parent, ignore_errors=True)
