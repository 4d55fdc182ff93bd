/* SPDX-License-Identifier: MIT */
/*
 * The checkpoint layouts ckfs reads (src/layouts/): the one entry point
 * that detects a folder's layout and fills a struct ckfs_model
 * (include/ckfs/model.h) with its tensors as chunks of its files, reading
 * metadata only. Detection order and every layout's rules:
 * docs/formats.md.
 */
#ifndef CKFS_LAYOUTS_H
#define CKFS_LAYOUTS_H

#include <stdbool.h>

#include "ckfs/dtype.h"
#include "ckfs/err.h"
#include "ckfs/model.h"

struct ckfs_model_options {
	/* Output dtype; CKFS_DTYPE_INVALID keeps each tensor as stored. */
	enum ckfs_dtype out_dtype;
	/* --config: a config.json, or a folder holding one; NULL for the
	 * checkpoint's huggingface/config.json. */
	const char *config_path;
	/* --follow-symlinks: serve files whose symlinks lead outside the
	 * checkpoint folder (refused by default: include/ckfs/file.h). */
	bool follow_symlinks;
	/* --raw-names: serve Megatron keys without a Hugging Face name under
	 * their own names, one tensor per rank (megatron.c raw_key); refused
	 * otherwise. */
	bool raw_names;
	/* LoRA actors (src/layouts/peft.c): what to serve (--lora), the
	 * folder of base weights of an adapter-only checkpoint (--base, NULL
	 * without), lora_alpha when the checkpoint does not record it or
	 * records it wrongly (--lora-alpha; 0: as recorded) and rsLoRA
	 * scaling, alpha / sqrt(r) (--rslora). */
	enum ckfs_lora_mode lora;
	const char *base_path;
	int64_t lora_alpha;
	bool rslora;
};

/* Open SRC: a verl actor/critic folder (FSDP rank files, legacy Megatron
 * model/mp_rank_*, or a Megatron dist_ckpt), a torch.distributed.checkpoint
 * folder or a folder of Hugging Face safetensors weights (detection in
 * src/layouts/detect.c). On success *out is a new model the caller frees
 * with ckfs_model_free. */
enum ckfs_code ckfs_model_open(const char *src,
			       const struct ckfs_model_options *opt,
			       struct ckfs_model **out,
			       struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
