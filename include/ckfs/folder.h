/* SPDX-License-Identifier: MIT */
/*
 * The Hugging Face folder a model is served as: weight files (from the
 * safetensors layout), rendered files (config.json with the output dtype,
 * model.safetensors.index.json) and side files passed through unchanged
 * from the checkpoint's huggingface/ folder (tokenizer, generation config,
 * chat template, remote code); for a LoRA actor, the adapter in
 * lora_adapter/ as verl writes it (or, for an adapter saved alone, the
 * adapter folder by itself). `ckfs export` writes exactly these files;
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
#include "ckfs/gguf.h"
#include "ckfs/model.h"
#include "ckfs/weights.h"

enum ckfs_node_kind {
	CKFS_NODE_WEIGHTS,     /* a safetensors or GGUF file, assembled on read */
	CKFS_NODE_RENDERED,    /* bytes held in memory */
	CKFS_NODE_PASSTHROUGH, /* a side file, read from its source */
	CKFS_NODE_DIR,         /* a folder inside the folder */
};

struct ckfs_node {
	const char *name;               /* path in the folder: "a" or "d/a" */
	const char *base;               /* its last component */
	size_t parent;                  /* the folder's node index + 1; 0: top */
	enum ckfs_node_kind kind;
	uint64_t size;
	const struct ckfs_st_file *st;  /* WEIGHTS: safetensors */
	const struct ckfs_gguf_file *gguf; /* WEIGHTS: GGUF (st NULL) */
	const char *data;               /* RENDERED */
	/* RENDERED: what it is rendered from, for who may read it: a file
	 * (config.json) and the weight files of a layout (the index,
	 * adapter_config.json); either may be NULL. */
	const struct ckfs_file_access *from;
	const struct ckfs_st_layout *from_weights;
	struct ckfs_source src;         /* PASSTHROUGH, opened read-only */
	const size_t *children;         /* DIR: node indices, by name */
	size_t n_children;
};

/* What verl's merger writes into config.json differs by the transformers
 * release it runs with (docs/formats.md "config.json by transformers
 * release", recorded in tests/fixtures/matrix/transformers-*): the
 * releases ckfs imitates, and what differs between them. */
struct ckfs_transformers_release {
	const char *release;            /* "5.23": every 5.23.x */
	bool vl_drops_token_ids;        /* Qwen2-VL / Qwen2.5-VL lose their
					 * top-level bos, eos and pad ids */
};
/* The release a version string ("5.10.4", "5.23") names, or NULL when
 * ckfs does not know what that release's merger writes; NULL (the
 * default) gives the newest known. */
const struct ckfs_transformers_release *ckfs_transformers_release(const char *version);
/* "5.10, 5.23": the releases known, for messages. */
const char *ckfs_transformers_releases_known(void);

struct ckfs_folder_options {
	uint64_t max_shard_size;        /* 0: one model.safetensors */
	/* --transformers-version; NULL: the newest known */
	const struct ckfs_transformers_release *transformers;
	/* --format gguf: the folder is model.gguf alone (include/ckfs/gguf.h) */
	bool gguf;
	struct ckfs_gguf_options gguf_options;
};

struct ckfs_folder {
	struct ckfs_arena arena;
	const struct ckfs_model *model; /* borrowed */
	struct ckfs_st_layout layout;
	struct ckfs_st_layout adapter;  /* a LoRA adapter's weights, if served */
	struct ckfs_gguf_file gguf;     /* --format gguf */
	size_t n_nodes;
	struct ckfs_node *nodes;        /* sorted by path: a folder before
					 * what it holds */
	const size_t *top;              /* the top level's nodes, by name */
	size_t n_top;
	struct timespec mtime;          /* newest source mtime */
};

enum ckfs_code ckfs_folder_build(const struct ckfs_model *m,
				 const struct ckfs_folder_options *opt,
				 struct ckfs_folder **out,
				 struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_folder_free(struct ckfs_folder *f);

/* The node named name in folder dir (NULL: the top level), or NULL. */
const struct ckfs_node *ckfs_folder_lookup(const struct ckfs_folder *f,
					   const struct ckfs_node *dir, const char *name);

/* Read up to len bytes at off; *got is short only at end of file. */
enum ckfs_code ckfs_folder_read(const struct ckfs_folder *f,
				const struct ckfs_node *n, uint64_t off,
				size_t len, void *buf, size_t *got,
				struct ckfs_read_scratch *scratch,
				struct ckfs_error *err) CKFS_WARN_UNUSED;

/* What config.json is rendered with. */
struct ckfs_config_edits {
	const char *dtype;          /* the dtype keys' value ("bfloat16") */
	const char *model_type;     /* per-model rules; NULL when unknown */
	bool vl_drops_token_ids;    /* see struct ckfs_transformers_release */
	const char *quantization;   /* a JSON object for "quantization_config";
				     * NULL: none added */
	bool drop_quantization;     /* a quantized release served dequantized:
				     * "quantization_config" dropped */
};

/*
 * config.json for the output (config_json.c): the source text with the
 * dtype keys of the top level and of its sub-configs set to e->dtype,
 * attn_implementation dropped, for Qwen2-VL / Qwen2.5-VL the top-level
 * token ids dropped when e->vl_drops_token_ids, and e->quantization as "quantization_config";
 * everything else byte for byte. Returns a malloc'd NUL-terminated string.
 */
enum ckfs_code ckfs_render_config(const char *json, size_t len, const struct ckfs_config_edits *e,
				  char **out, size_t *out_len,
				  struct ckfs_error *err) CKFS_WARN_UNUSED;
/* lora_adapter/adapter_config.json (adapter.c): peft's LoraConfig as verl
 * writes it. Returns a malloc'd NUL-terminated string. */
enum ckfs_code ckfs_render_adapter_config(const struct ckfs_lora *l, char **out,
					  size_t *out_len,
					  struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
