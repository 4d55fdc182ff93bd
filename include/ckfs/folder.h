/* SPDX-License-Identifier: MIT */
/*
 * The Hugging Face folder a model is served as: weight files (from the
 * safetensors layout), rendered files (config.json with the output dtype,
 * model.safetensors.index.json) and side files passed through unchanged
 * from the checkpoint's huggingface/ folder (tokenizer, generation config,
 * chat template, remote code). `ckfs export` writes exactly these files;
 * the mount shows exactly these files. Immutable once built.
 */
#ifndef CKFS_FOLDER_H
#define CKFS_FOLDER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "ckfs/arena.h"
#include "ckfs/err.h"
#include "ckfs/model.h"
#include "ckfs/weights.h"

enum ckfs_node_kind {
	CKFS_NODE_WEIGHTS,     /* a safetensors file, assembled on read */
	CKFS_NODE_RENDERED,    /* bytes held in memory */
	CKFS_NODE_PASSTHROUGH, /* a side file, read from its source */
};

struct ckfs_node {
	const char *name;
	enum ckfs_node_kind kind;
	uint64_t size;
	const struct ckfs_st_file *st;  /* WEIGHTS */
	const char *data;               /* RENDERED */
	/* RENDERED: the file it is rendered from (config.json); NULL for
	 * the index, which comes from the weight files. */
	const struct ckfs_file_access *from;
	struct ckfs_source src;         /* PASSTHROUGH, opened read-only */
};

struct ckfs_folder_options {
	uint64_t max_shard_size;        /* 0: one model.safetensors */
};

struct ckfs_folder {
	struct ckfs_arena arena;
	const struct ckfs_model *model; /* borrowed */
	struct ckfs_st_layout layout;
	size_t n_nodes;
	struct ckfs_node *nodes;        /* sorted by name */
	struct timespec mtime;          /* newest source mtime */
};

enum ckfs_code ckfs_folder_build(const struct ckfs_model *m,
				 const struct ckfs_folder_options *opt,
				 struct ckfs_folder **out,
				 struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_folder_free(struct ckfs_folder *f);

/* Read up to len bytes at off; *got is short only at end of file. */
enum ckfs_code ckfs_folder_read(const struct ckfs_folder *f,
				const struct ckfs_node *n, uint64_t off,
				size_t len, void *buf, size_t *got,
				struct ckfs_read_scratch *scratch,
				struct ckfs_error *err) CKFS_WARN_UNUSED;

/*
 * config.json for the output: the source text with the value of every
 * top-level "torch_dtype" / "dtype" key set to the string dtype_name, everything
 * else byte for byte; when neither key exists "torch_dtype" is added first.
 * Returns a malloc'd NUL-terminated string.
 */
enum ckfs_code ckfs_render_config(const char *json, size_t len,
				  const char *dtype_name, char **out,
				  size_t *out_len,
				  struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
