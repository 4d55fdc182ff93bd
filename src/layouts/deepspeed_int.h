/* SPDX-License-Identifier: MIT */
/*
 * The DeepSpeed ZeRO reader's state shared by its files (private to them):
 * deepspeed.c (the build: outputs in zero_to_fp32's order, names, the
 * layout row), deepspeed_states.c (what the model and optimizer states
 * pickles say), deepspeed_zero12.c (ZeRO-1/2 and BF16_Optimizer: flat
 * partitions per param group) and deepspeed_zero3.c (ZeRO-3: a piece of
 * every parameter per rank). deepspeed_files.c finds the files.
 */
#ifndef CKFS_LAYOUTS_DEEPSPEED_INT_H
#define CKFS_LAYOUTS_DEEPSPEED_INT_H

#include <stddef.h>
#include <stdint.h>

#include "layouts/layouts.h"

/* What a model states file says, as zero_to_fp32 reads it. */
struct ds_model_view {
	const struct ckfs_pv *module;        /* name -> tensor (ZeRO-3: placeholders) */
	const struct ckfs_pv *buffer_names;  /* list of names */
	const struct ckfs_pv *param_shapes;  /* list of dicts name -> shape */
	const struct ckfs_pv *frozen_shapes; /* dict or NULL (None) */
	const struct ckfs_pv *frozen_frags;  /* dict or NULL (None) */
	const struct ckfs_pv *shared;        /* dict alias -> owner */
};

/* A trained parameter: where its elements are in the flat buffers. */
struct ds_param {
	size_t out;          /* its output in b->outs */
	int group;           /* param group (ZeRO-3: sub-group) */
	uint64_t off;        /* ZeRO-1/2: in its group's flat buffer; ZeRO-3: in
			      * every rank's flat_groups end to end */
	uint64_t numel;
};

struct ds_build {
	struct ckfs_model *m;
	const struct ckfs_model_options *opt;
	struct ckfs_ds_files files; /* the step folder's (deepspeed_files.c) */
	int ws;
	int stage;                 /* 1, 2, 3; 0: BF16_Optimizer */
	uint32_t model_src;        /* rank 0's model states (ZeRO-3: ranks follow);
				    * optimizer files are sources 0..ws-1 */
	struct ckfs_torch_file optim0, model0; /* rank 0's, open to the end */
	const struct ckfs_pv *osd0;            /* rank 0's optimizer_state_dict */
	struct ds_model_view mv0;
	struct ckfs_outs outs;     /* zero_to_fp32's order */
	size_t n_buffers;          /* outs [0, n_buffers) are buffers */
	struct ds_param *params;   /* trained, flat order */
	size_t n_params;
	size_t n_groups;
	uint64_t *need;            /* elements param_shapes walks: ZeRO-1/2 per
				    * group, ZeRO-3 per rank (need[0]) */
	enum ckfs_dtype master;    /* dtype of the fp32 partitions */
	struct ckfs_flat_seg *segs;/* ZeRO-1/2: [group * ws + rank] */
	int64_t *group_pad;        /* ZeRO-1/2: [group * ws + rank]; -1: none */
};

/* A parameter's shape, as param_shapes and frozen_param_shapes hold it. */
struct ds_shape {
	int ndim;
	int64_t v[CKFS_MAX_DIMS];
	uint64_t numel;
};

static inline const char *ds_src_path(const struct ds_build *b, uint32_t i)
{
	return b->m->sources[i].path;
}

/* Source i's torch.save file as a value tree (DeepSpeed's dicts are
 * read where they hold tensors; nothing is decoded up front). */
static inline enum ckfs_code ds_open_tree(const struct ds_build *b, uint32_t i,
					  struct ckfs_torch_file *tf, struct ckfs_error *err)
{
	const struct ckfs_torch_open_opts o = { .label = ds_src_path(b, i),
						.root = CKFS_TORCH_ROOT_TREE };

	return ckfs_torch_open(tf, b->m->sources[i].f, &o, err);
}

static inline struct ckfs_out *ds_out_at(struct ds_build *b, size_t i)
{
	return &b->outs.v[i];
}

/* ---- deepspeed.c ---- */

/* A new output as s says; *index its place in b->outs. */
enum ckfs_code ds_add_out(struct ds_build *b, const struct ckfs_out_spec *s, size_t *index,
			  struct ckfs_error *err) CKFS_WARN_UNUSED;

/* ---- deepspeed_states.c ---- */

/* A pickled torch.Size (a tuple after the VM) as a shape; path, where and
 * name for messages. */
enum ckfs_code ds_get_shape(const char *path, const char *where, const char *name,
			    const struct ckfs_pv *v, struct ds_shape *s,
			    struct ckfs_error *err) CKFS_WARN_UNUSED;
/* A plain tensor value of a pickle, named key in messages. */
enum ckfs_code ds_decode_tensor(struct ckfs_torch_file *tf, const struct ckfs_pv *v,
				const char *key, struct ckfs_sd_entry *e,
				struct ckfs_error *err) CKFS_WARN_UNUSED;
/* A 1-D contiguous tensor of a pickle as a stretch of a flat buffer. */
enum ckfs_code ds_decode_flat(struct ckfs_torch_file *tf, const struct ckfs_pv *v,
			      const char *key, uint32_t source, int rank,
			      struct ckfs_flat_seg *seg, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The optimizer_state_dict of an optimizer file's pickle. */
enum ckfs_code ds_optim_state(const struct ckfs_torch_file *tf, const struct ckfs_pv **osd,
			      struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Stage (0: BF16_Optimizer) and world size from one optimizer state. */
enum ckfs_code ds_optim_kind(const char *path, const struct ckfs_pv *osd, int *stage,
			     int *ws, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Rank r's optimizer state agrees with rank 0's on the stage and the
 * world size. */
enum ckfs_code ds_same_kind(const struct ds_build *b, const char *path,
			    const struct ckfs_pv *osd, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* What a model states file says, checked for the kinds zero_to_fp32 needs. */
enum ckfs_code ds_model_states(const struct ckfs_torch_file *tf, struct ds_model_view *v,
			       struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The fp32 partitions of rank r's optimizer state, each a flat stretch of
 * source r: *segs (malloc'd) of *n; b->master set by the first. */
enum ckfs_code ds_read_groups(struct ds_build *b, struct ckfs_torch_file *tf,
			      const struct ckfs_pv *osd, int r, struct ckfs_flat_seg **segs,
			      size_t *n, struct ckfs_error *err) CKFS_WARN_UNUSED;

/* ---- deepspeed_zero12.c ---- */

/* A frozen parameter of ZeRO-1/2 as an output: its fragment whole. */
enum ckfs_code ds_frozen_zero12(struct ds_build *b, const char *name,
				const struct ds_shape *shape,
				struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The trained parameters' chunks: every rank's partitions, then each
 * parameter cut from its group's buffer. */
enum ckfs_code ds_plan_zero12(struct ds_build *b, struct ckfs_error *err) CKFS_WARN_UNUSED;

/* ---- deepspeed_zero3.c ---- */

/* The trained and frozen parameters' chunks, rank by rank. */
enum ckfs_code ds_plan_zero3(struct ds_build *b, struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
