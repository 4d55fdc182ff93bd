/* SPDX-License-Identifier: MIT */
/*
 * The GGUF view (--format gguf): one file, model.gguf, as llama.cpp's
 * convert_hf_to_gguf.py writes it from the Hugging Face folder ckfs
 * serves (the bf16 view): header, metadata key-values (the model's
 * hyperparameters, the tokenizer from tokenizer.model), tensor infos,
 * then the tensors, each aligned to 32 bytes. The header is rendered at
 * build from metadata; tensor bytes are converted on read, a row at a
 * time (docs/gguf.md).
 */
#ifndef CKFS_GGUF_H
#define CKFS_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckfs/arena.h"
#include "ckfs/err.h"
#include "ckfs/model.h"

/* ggml's tensor types, by their numbers in the file. */
enum ckfs_gguf_type {
	CKFS_GGUF_F32 = 0,
	CKFS_GGUF_F16 = 1,
	CKFS_GGUF_Q4_0 = 2,
	CKFS_GGUF_Q8_0 = 8,
	CKFS_GGUF_BF16 = 30,
};

struct ckfs_gguf_options {
	enum ckfs_gguf_type type;   /* what the 2-D weights become */
	const char *model_name;     /* general.name; NULL: the checkpoint
				     * folder's name */
};

struct ckfs_gguf_tensor {
	const char *name;                 /* "blk.0.attn_q.weight" */
	const struct ckfs_tensor *src;    /* its values (the bf16 view) */
	/* A MoE layer's stacked experts ([n_expert, rows, cols], as the
	 * converter stacks them): src is experts[0], row r of expert e is
	 * row r of experts[e]; NULL (n_expert 0) for a tensor of its own. */
	const struct ckfs_tensor *const *experts;
	int64_t n_expert;
	enum ckfs_gguf_type type;
	int64_t ne0, rows;                /* row length, rows (all leading dims) */
	int64_t perm_heads;               /* > 0: Llama's Q/K row order over
					   * that many heads; 0: as stored */
	/* One part of DeepSeek's kv_b_proj, split per head (gguf_mla.c):
	 * heads > 0: 3-D [heads, rows / heads, ne0]; head h's part starts
	 * at src row h * head_stride + head_skip. transposed: its output
	 * row (h, c) is column c of that part's ne0 rows (attn_k_b); else
	 * its rows are the part's rows (attn_v_b). */
	int64_t heads, head_stride, head_skip;
	bool transposed;
	uint64_t row_bytes;
	uint64_t offset;                  /* in the file */
};

struct ckfs_gguf_file {
	struct ckfs_arena arena;
	const char *name;                 /* "model.gguf" */
	unsigned char *header;            /* everything before the first tensor */
	uint64_t header_len;
	size_t n_tensors;
	struct ckfs_gguf_tensor *tensors; /* in file order */
	uint64_t size;
	/* The side files it is made from (tokenizer.model, tokenizer_config.json,
	 * chat_template.jinja, generation_config.json), for who may read it (perm.c). */
	struct ckfs_file_access from[4];
	size_t n_from;
};

/* The file for model m, or a one-line refusal naming what ckfs does not
 * reproduce (an architecture, a tokenizer, a config key). */
enum ckfs_code ckfs_gguf_build(const struct ckfs_model *m, const struct ckfs_gguf_options *opt,
			       struct ckfs_gguf_file *out,
			       struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_gguf_release(struct ckfs_gguf_file *g);

/* Bytes [off, off + len) of g; the range must lie inside the file. */
enum ckfs_code ckfs_gguf_read(const struct ckfs_model *m, const struct ckfs_gguf_file *g,
			      uint64_t off, size_t len, void *buf,
			      struct ckfs_read_scratch *scratch,
			      struct ckfs_error *err) CKFS_WARN_UNUSED;

/* A row of n floats (n a multiple of 32 for the block types) as type t:
 * exactly gguf-py's quantizers (BF16: round to nearest even, quiet NaN;
 * Q8_0: per 32 values d = amax / 127, round half away from zero; Q4_0:
 * d = (value of largest magnitude) / -8, trunc(x / d + 8.5) clipped to 15). */
void ckfs_gguf_encode_row(enum ckfs_gguf_type t, const float *x, int64_t n, unsigned char *out);
/* Bytes of a row of n values of type t. */
uint64_t ckfs_gguf_row_bytes(enum ckfs_gguf_type t, int64_t n);

#endif
