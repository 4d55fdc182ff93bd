#!/usr/bin/env python3
"""verl's FSDP merger, extended just enough to read FSDP1 ShardedTensor checkpoints.

FSDP1 without a device mesh saves SHARDED_STATE_DICT values as
torch.distributed._shard.sharded_tensor.ShardedTensor.  verl's merger (0.9.1, and every earlier
version) cannot load those: ShardedTensor.__setstate__ demands an initialised default process
group whose rank and world size equal the saving rank's ("Need to initialize default process
group ... before loading ShardedTensor").

This script keeps everything of verl's FSDPModelMerger (argument parsing, config, shell model,
tokenizer, save_pretrained) and replaces only the loading step: each rank file is unpickled with
ShardedTensor.__setstate__ relaxed to store its state without a process group, and every
ShardedTensor is assembled from its local shards at their `shard_offsets`, each shard cast with
`.bfloat16()` first (the same cast-then-concatenate order as verl's DTensor path).  Any other
value goes through verl's own merge code unchanged.

    python tests/gen/merge_sharded_tensor.py merge --backend fsdp --local_dir CKPT --target_dir OUT
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch.distributed._shard.sharded_tensor import ShardedTensor  # noqa: E402
from verl.model_merger.base_model_merger import generate_config_from_args, parse_args  # noqa: E402
from verl.model_merger.fsdp_model_merger import FSDPModelMerger  # noqa: E402


def _relaxed_setstate(self, state):
    self._sharded_tensor_id = None
    self._local_shards, self._metadata, _pg_state, self._sharding_spec, self._init_rrefs = state
    self._process_group = None


class ShardedTensorFSDPMerger(FSDPModelMerger):
    def _load_and_merge_state_dicts(self, world_size, total_shards, mesh_shape, mesh_dim_names):
        from pathlib import Path

        paths = [Path(self.config.local_dir) / f"model_world_size_{world_size}_rank_{r}.pt" for r in range(world_size)]
        rank_dicts = [torch.load(p, map_location="cpu", weights_only=False) for p in paths]
        if not any(isinstance(v, ShardedTensor) for v in rank_dicts[0].values()):
            return super()._load_and_merge_state_dicts(world_size, total_shards, mesh_shape, mesh_dim_names)
        merged = {}
        for key in rank_dicts[0]:
            v0 = rank_dicts[0][key]
            if not isinstance(v0, ShardedTensor):
                merged[key] = v0.bfloat16()
                continue
            out = torch.empty(tuple(v0.size()), dtype=torch.bfloat16)
            covered = 0
            for sd in rank_dicts:
                for shard in sd[key].local_shards():
                    idx = tuple(slice(o, o + s) for o, s in zip(shard.metadata.shard_offsets,
                                                                shard.metadata.shard_sizes))
                    out[idx] = shard.tensor.bfloat16()
                    covered += shard.tensor.numel()
            if covered != out.numel():
                raise ValueError(f"{key}: shards cover {covered} of {out.numel()} elements")
            merged[key] = out
        return merged


def main():
    ShardedTensor.__setstate__ = _relaxed_setstate
    args = parse_args()
    config = generate_config_from_args(args)
    merger = ShardedTensorFSDPMerger(config)
    merger.merge_and_save()
    merger.cleanup()


if __name__ == "__main__":
    sys.exit(main())
