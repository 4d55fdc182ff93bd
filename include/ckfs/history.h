/* SPDX-License-Identifier: MIT */
/*
 * What changed between two checkpoints (src/history/): the tensors two
 * models serve, paired by name and compared element by element through
 * the read path (ckfs_tensor_read), a window at a time, so memory is
 * threads x two windows whatever the model size; their layer and kind
 * groups; and the pictures (an SVG heat map and lines).
 *
 * Pairing is by served name only: a name on one side only, or the same
 * name with another shape, is reported as such and never compared with
 * anything else. Values are compared as served: with --dtype auto as
 * stored, otherwise after the conversion the mount would apply.
 *
 * Accumulation (what "the same as torch" rests on, docs/formats.md
 * "ckfs diff"): every element is widened to double; a, b and d = b - a
 * are summed as a², b², d² and a·b in 8 interleaved double lanes per
 * window of CKFS_DIFF_WINDOW elements (element i to lane i mod 8), the
 * lanes added pairwise at the end of the window, the windows added in
 * order. The maximum and the counts are exact.
 */
#ifndef CKFS_HISTORY_H
#define CKFS_HISTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckfs/arena.h"
#include "ckfs/dtype.h"
#include "ckfs/err.h"
#include "ckfs/model.h"

/* Elements read from each side per step of a comparison. */
#define CKFS_DIFF_WINDOW (1u << 20)

/* Sums over some elements of a pair (a window, a tensor, a group). */
struct ckfs_diff_sums {
	uint64_t numel;          /* elements compared */
	uint64_t changed;        /* elements whose values differ (NaN equals NaN,
				  * -0 equals 0) */
	bool bytes_differ;       /* some byte differs, or the dtypes do */
	double max_abs;          /* max |b - a|; NaN when one is NaN */
	double a2, b2, d2, dot;  /* sums of a², b², (b - a)², a·b */
};

/* Sums of n elements a (dtype da) and b (dtype db), in a window. */
void ckfs_diff_window(enum ckfs_dtype da, const void *a, enum ckfs_dtype db, const void *b,
		      size_t n, struct ckfs_diff_sums *out);
/* into += w, the order kept by the caller (windows in order). */
void ckfs_diff_sums_add(struct ckfs_diff_sums *into, const struct ckfs_diff_sums *w);
/* ||B - A|| / ||A||: 0 when both are 0, infinity when only ||A|| is. */
double ckfs_diff_rel_l2(const struct ckfs_diff_sums *s);
/* A·B / (||A|| ||B||); NaN when either norm is 0. */
double ckfs_diff_cosine(const struct ckfs_diff_sums *s);

enum ckfs_diff_status {
	CKFS_DIFF_IDENTICAL,     /* same shape and dtype, every byte equal */
	CKFS_DIFF_CHANGED,       /* same shape; some byte (or the dtype) differs */
	CKFS_DIFF_SHAPE,         /* same name, another shape: not compared */
	CKFS_DIFF_ONLY_A,        /* served by A only */
	CKFS_DIFF_ONLY_B,        /* served by B only */
};
const char *ckfs_diff_status_name(enum ckfs_diff_status s);

/* What a tensor is, by its name, for the lines of the picture. */
enum ckfs_diff_kind {
	CKFS_KIND_ATTENTION,
	CKFS_KIND_MLP,
	CKFS_KIND_EXPERTS,       /* MoE experts, shared experts and routers */
	CKFS_KIND_NORM,
	CKFS_KIND_EMBEDDING,     /* token embeddings and the output head */
	CKFS_KIND_OTHER,
	CKFS_KIND_COUNT,
};
const char *ckfs_diff_kind_name(enum ckfs_diff_kind k);
enum ckfs_diff_kind ckfs_diff_kind_of(const char *name);
/* The layer row a tensor belongs to: its name up to the number of the
 * block holding it ("model.layers.3"), or, outside numbered blocks, its
 * name less the last part ("model.embed_tokens"). A peft prefix
 * ("base_model.model.") and "lora_adapter/" are dropped first, so an
 * adapter's tensors share their layer's row. Written to buf (size). */
void ckfs_diff_layer_of(const char *name, char *buf, size_t size);

struct ckfs_diff_tensor {
	const char *name;        /* as served; adapter tensors "lora_adapter/<name>" */
	enum ckfs_diff_status status;
	const struct ckfs_tensor *a, *b; /* NULL on the side that lacks it */
	enum ckfs_diff_kind kind;
	size_t layer;            /* index in ckfs_diff.layers */
	struct ckfs_diff_sums sums; /* IDENTICAL and CHANGED only */
};

/* Tensors grouped (a layer, a kind, everything). */
struct ckfs_diff_group {
	const char *name;
	size_t tensors, identical, changed, other; /* other: shape, one side */
	struct ckfs_diff_sums sums; /* of the compared tensors, in tensor order */
};

struct ckfs_diff {
	struct ckfs_arena arena;
	struct ckfs_diff_tensor *tensors; /* A's order, then B's tensors A lacks */
	size_t n_tensors;
	struct ckfs_diff_group *layers;   /* in order of first appearance */
	size_t n_layers;
	struct ckfs_diff_group kinds[CKFS_KIND_COUNT];
	struct ckfs_diff_group total;
	uint64_t bytes_read;              /* served bytes read, both sides */
};

/*
 * Compare every tensor model a serves with the tensor of the same name b
 * serves (a LoRA actor's adapter too, when it is served as lora_adapter/),
 * on up to `threads` threads. On success *out is a new diff the caller
 * frees with ckfs_diff_free; a failed read fails the whole comparison
 * (the first error, naming the file).
 */
enum ckfs_code ckfs_diff_models(const struct ckfs_model *a, const struct ckfs_model *b,
				int threads, struct ckfs_diff **out,
				struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_diff_free(struct ckfs_diff *d);

/*
 * The pictures (svg.c). A history is a row of diffs (columns: the pairs of
 * consecutive steps, labelled) of one role: a heat map of the relative
 * change per layer (rows, the union of the diffs' layers in order of first
 * appearance) per pair (columns), log-scaled, identical layers drawn
 * apart; and one line per tensor kind over the pairs. Several roles are
 * drawn one below the other. The SVG is appended to out (a malloc'd,
 * NUL-terminated string on success).
 */
struct ckfs_diff_history {
	const char *title;                 /* "actor" */
	const char *const *labels;         /* n column labels ("1→2") */
	const struct ckfs_diff *const *diffs; /* n; a NULL column: the pair
					       * was not compared */
	size_t n;
};
enum ckfs_code ckfs_diff_svg(const struct ckfs_diff_history *h, size_t n_histories,
			     char **out, size_t *len, struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
