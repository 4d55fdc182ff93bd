/* SPDX-License-Identifier: MIT */
/*
 * safetensors output: the layout of the weight files of a model (which
 * tensors go to which file, header bytes, data offsets) and reads of any
 * byte range of those virtual files.
 *
 * Files are byte-identical to safetensors.torch.save_file(tensors,
 * metadata={"format": "pt"}): tensors sorted by dtype (descending, in the
 * safetensors crate's enum order) then name, compact JSON with
 * "__metadata__" first, header padded with spaces to a multiple of 8, data
 * packed from offset 0. With --dtype fp8 (m->n_fp8) tensors are in name
 * order instead, each weight beside its scales (docs/formats.md "FP8").
 * With a shard size, tensors are split greedily in state-dict order as
 * huggingface_hub's split_torch_state_dict_into_shards does, files are
 * named model-0000K-of-0000N.safetensors and an index is rendered as
 * transformers' save_pretrained writes it.
 */
#ifndef CKFS_WEIGHTS_H
#define CKFS_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "ckfs/arena.h"
#include "ckfs/err.h"
#include "ckfs/model.h"

struct ckfs_st_file {
	const char *name;
	unsigned char *header;          /* u64 length + JSON + padding */
	uint64_t header_len;
	uint64_t size;
	size_t n_tensors;
	const struct ckfs_tensor **tensors; /* in data order */
	uint64_t *offsets;              /* file offset of each tensor, n+1 */
};

struct ckfs_st_layout {
	struct ckfs_arena arena;
	size_t n_files;
	struct ckfs_st_file *files;
	char *index_json;               /* NULL with a single file */
	size_t index_len;
};

/* max_shard_size 0: everything in model.safetensors. */
enum ckfs_code ckfs_st_layout_build(const struct ckfs_model *m,
				    uint64_t max_shard_size,
				    struct ckfs_st_layout *out,
				    struct ckfs_error *err) CKFS_WARN_UNUSED;
/* One file of the n tensors ts, named name, without "__metadata__":
 * safetensors.torch.save_file(tensors) as verl writes a LoRA adapter. */
enum ckfs_code ckfs_st_layout_single(const struct ckfs_tensor *ts, size_t n, const char *name,
				     struct ckfs_st_layout *out,
				     struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_st_layout_release(struct ckfs_st_layout *l);

/* The first tensor of f whose data ends after byte off (the one holding
 * it, for off among the tensors' bytes); n_tensors when none does. */
size_t ckfs_st_tensor_at(const struct ckfs_st_file *f, uint64_t off);

/* Bytes [off, off + len) of f; the range must lie inside the file. */
enum ckfs_code ckfs_st_file_read(const struct ckfs_model *m,
				 const struct ckfs_st_file *f, uint64_t off,
				 size_t len, void *buf,
				 struct ckfs_read_scratch *scratch,
				 struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
