"""The export loads in real readers: safetensors.safe_open and transformers.from_pretrained."""

import json

import pytest
import torch

from conftest import ckpt_dir, load_file, load_folder, original_path, same_bits, weight_files

SHARD_SIZES = {"200KB": 200 * 10**3, "100KB": 100 * 10**3}  # huggingface_hub's reading of the units


def auto_class(config):
    import transformers

    if "ForTokenClassification" in config["model_class"]:
        return transformers.AutoModelForTokenClassification
    return transformers.AutoModelForCausalLM


def prompt_ids(config):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ckpt_dir(config) / "huggingface"))
    from conftest import MANIFEST

    return tok(MANIFEST["prompt"], return_tensors="pt", add_special_tokens=False)["input_ids"]


def reference_logits(config, ids):
    """The original weights cast to bf16, in the model class the checkpoint was trained as."""
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(str(ckpt_dir(config) / "huggingface"))
    model = getattr(transformers, config["model_class"])._from_config(cfg, attn_implementation="eager")
    model = model.to(torch.bfloat16)
    sd = {k: v.to(torch.bfloat16) for k, v in load_file(original_path(config)).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and not [m for m in missing if m != "lm_head.weight"], (missing, unexpected)
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def exported_logits(config, d, ids):
    model = auto_class(config).from_pretrained(str(d), dtype=torch.bfloat16, attn_implementation="eager")
    assert type(model).__name__ == config["model_class"]
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_safe_open(config, ckfs_export):
    from safetensors import safe_open

    out = ckfs_export(config)
    for fn in weight_files(out):
        with safe_open(str(out / fn), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}, f"{fn}: metadata {f.metadata()}"
            for k in f.keys():
                f.get_tensor(k)
                f.get_slice(k)[:1]


def test_transformers_logits(config, ckfs_export):
    torch.set_num_threads(1)
    ids = prompt_ids(config)
    want = reference_logits(config, ids)
    got = exported_logits(config, ckfs_export(config), ids)
    assert torch.isfinite(want).all()
    assert torch.equal(got, want), f"logits differ (max abs diff {(got.float() - want.float()).abs().max()})"


def test_tokenizer_side_files(config, ckfs_export):
    """Side files from huggingface/ come along, so the tokenizer loads from the export."""
    from transformers import AutoTokenizer

    from conftest import MANIFEST

    out = ckfs_export(config)
    a = AutoTokenizer.from_pretrained(str(out))(MANIFEST["prompt"])["input_ids"]
    b = AutoTokenizer.from_pretrained(str(ckpt_dir(config) / "huggingface"))(MANIFEST["prompt"])["input_ids"]
    assert a == b


@pytest.mark.parametrize("max_shard", list(SHARD_SIZES))
def test_sharded_export(config, max_shard, ckfs_export):
    from safetensors import safe_open

    limit = SHARD_SIZES[max_shard]
    out = ckfs_export(config, "--max-shard-size", max_shard)
    whole = load_folder(ckfs_export(config))
    total = sum(t.numel() * t.element_size() for t in whole.values())
    if not (out / "model.safetensors.index.json").exists():
        # one shard: huggingface_hub / verl write a plain model.safetensors and no index
        assert total <= limit, f"{total} bytes of tensors in one file despite --max-shard-size {max_shard}"
        assert weight_files(out) == ["model.safetensors"]
    else:
        assert total > limit, f"sharded although all {total} bytes fit in {max_shard}"
        assert not (out / "model.safetensors").exists(), "sharded export also wrote model.safetensors"
        index = json.loads((out / "model.safetensors.index.json").read_text())
        files = sorted(set(index["weight_map"].values()))
        n = len(files)
        assert n > 1
        assert files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
        assert sorted(p.name for p in out.glob("*.safetensors")) == files
        seen, sum_bytes = {}, 0
        for fn in files:
            shard_bytes, count = 0, 0
            with safe_open(str(out / fn), framework="pt") as f:
                assert f.metadata() == {"format": "pt"}
                for k in f.keys():
                    t = f.get_tensor(k)
                    seen[k] = fn
                    shard_bytes += t.numel() * t.element_size()
                    count += 1
            assert shard_bytes <= limit or count == 1, f"{fn}: {shard_bytes} bytes in {count} tensors"
            sum_bytes += shard_bytes
        assert seen == index["weight_map"], "index weight_map does not match the shards' contents"
        assert index["metadata"]["total_size"] == sum_bytes == total

    parts = load_folder(out)
    assert set(parts) == set(whole)
    for k in whole:
        assert same_bits(parts[k], whole[k]), k
    ids = prompt_ids(config)
    assert torch.equal(exported_logits(config, out, ids), reference_logits(config, ids))
