/* SPDX-License-Identifier: MIT */
/*
 * DeepSpeed ZeRO checkpoints (docs/formats.md, "Input: DeepSpeed ZeRO
 * checkpoints"), served as DeepSpeed's zero_to_fp32 reconstructs them, and
 * lazily: the fp32 master weights live only in the optimizer files' flat
 * partitions, so each output tensor is the stretches of those partitions
 * that hold it, cut into blocks (flat.c). Opening reads metadata only (the
 * zip directories and pickles of every *_model_states.pt and
 * *_optim_states.pt); a read then reads the partition bytes it needs,
 * never padding, never the Adam moments.
 *
 * Which folder: SRC when it holds DeepSpeed files (a step folder,
 * global_stepN/), else the step folder named by SRC/latest
 * (engine.save_checkpoint's folder, or the HF Trainer's checkpoint-N/,
 * whose config.json and tokenizer are served beside the weights).
 *
 * The pickles hold DeepSpeed's own classes (ZeroStageEnum, LossScaler,
 * fragment_address): the pickle VM keeps them as opaque values and only
 * zero_stage's int is read. A value found where a dict, a list or a tensor
 * belongs is refused: what an object holds cannot be known without running
 * its class.
 *
 * The rules, those of zero_to_fp32 in DeepSpeed 0.19.8 (checked bit for
 * bit against it and against the fp32 masters of the training processes):
 *  - ZeRO-1/2: per param group, the ranks' single_partition_of_fp32_groups
 *    end to end are the group's flat buffer (the tail padding dropped);
 *    param_shapes[g] walks it in order, each parameter followed by its
 *    param_alignment_paddings entry;
 *  - BF16_Optimizer (no zero_stage: zero_to_fp32 refuses it): the same
 *    walk, but every rank keeps its padding, which group_paddings places
 *    at the tail;
 *  - ZeRO-3: each parameter is cut into pieces of ceil(numel/ws), one per
 *    rank; every rank's fp32_flat_groups end to end hold its pieces in
 *    param_shapes order; the tail of the last pieces is padding
 *    (uninitialised memory, never read);
 *  - frozen parameters from frozen_param_fragments (ZeRO-1/2: whole;
 *    ZeRO-3: one 1-D piece per rank), persistent buffers from rank 0's
 *    module, tied aliases (shared_params) as their owner's tensor;
 *  - zero_to_fp32's order: buffers, frozen, trained, aliases; then, as
 *    for the other layouts of names held in memory, the wrapper rule
 *    (names.c) and what save_pretrained writes (hf_save.c: the tie rule,
 *    vision-language prefixes, fused expert stacks; the row's flag, applied
 *    by open.c); PEFT names refused.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/strbuf.h"

#include "layouts/layouts.h"

/* ---- the build ---- */

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

/* What only this layout knows of a model, for its describe. */
struct ds_info {
	int zero_stage;            /* 1, 2, 3; 0: BF16_Optimizer (none recorded) */
	const char *tag;           /* of the step folder served; NULL: SRC is it */
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

static const char *src_path(const struct ds_build *b, uint32_t i)
{
	return b->m->sources[i].path;
}

/* ---- pickled values ---- */

static size_t seq_len(const struct ckfs_pv *v)
{
	return v && (v->kind == CKFS_PV_LIST || v->kind == CKFS_PV_TUPLE) ? v->u.seq.n : 0;
}

static int is_seq(const struct ckfs_pv *v)
{
	return v && (v->kind == CKFS_PV_LIST || v->kind == CKFS_PV_TUPLE);
}

static int is_none(const struct ckfs_pv *v)
{
	return !v || v->kind == CKFS_PV_NONE;
}

/* What a value is, for messages: its kind, and an object's class. */
static const char *what_is(const struct ckfs_pv *v, char *buf, size_t size)
{
	const struct ckfs_pv *cls = !v ? NULL
				    : v->kind == CKFS_PV_OBJECT ? v->u.obj.cls
				    : v->kind == CKFS_PV_CALL	? v->u.call.fn
								: NULL;

	if (cls && cls->kind == CKFS_PV_GLOBAL)
		snprintf(buf, size, "a %s.%s %s", cls->u.global.module, cls->u.global.name,
			 v->kind == CKFS_PV_OBJECT ? "object" : "call");
	else
		snprintf(buf, size, "a %s", v ? ckfs_pv_kind_name(v->kind) : "nothing");
	return buf;
}

/* A value that must be a dict (or, with seq, a list or tuple), else the
 * one line saying that its tensors cannot be located. */
static enum ckfs_code need_kind(const char *path, const char *key, const struct ckfs_pv *v,
				int seq, struct ckfs_error *err)
{
	char what[256];

	if (!v)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': no %s", path, key);
	if (seq ? is_seq(v) : v->kind == CKFS_PV_DICT)
		return CKFS_OK;
	return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': %s is %s, not a %s: where its tensors "
			 "are cannot be known without running it", path, key,
			 what_is(v, what, sizeof(what)), seq ? "list" : "dict");
}

static int get_int(const struct ckfs_pv *v, int64_t *out)
{
	if (!v || v->kind != CKFS_PV_INT)
		return 0;
	*out = v->u.i;
	return 1;
}

/* A parameter's shape, as param_shapes and frozen_param_shapes hold it. */
struct ds_shape {
	int ndim;
	int64_t v[CKFS_MAX_DIMS];
	uint64_t numel;
};

/* A pickled torch.Size (a tuple after the VM) as a shape. */
static enum ckfs_code get_shape(const char *path, const char *where, const char *name,
				const struct ckfs_pv *v, struct ds_shape *s, struct ckfs_error *err)
{
	size_t n = seq_len(v);

	if (!is_seq(v) || n > CKFS_MAX_DIMS)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': the shape of '%s' in %s is not a "
				 "torch.Size", path, name, where);
	s->numel = 1;
	for (size_t k = 0; k < n; k++) {
		if (!get_int(v->u.seq.items[k], &s->v[k]) || s->v[k] < 0)
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': the shape of '%s' in %s is "
					 "not a torch.Size", path, name, where);
		if (__builtin_mul_overflow(s->numel, (uint64_t)s->v[k], &s->numel) ||
		    s->numel > CKFS_MAX_SERVED_BYTES)
			return ckfs_fail(err, CKFS_E_LIMIT, "'%s': '%s' in %s is too large",
					 path, name, where);
	}
	s->ndim = (int)n;
	return CKFS_OK;
}

/* The keys of a dict must be strings (names). */
static enum ckfs_code check_str_keys(const char *path, const char *what,
				     const struct ckfs_pv *d, struct ckfs_error *err)
{
	for (size_t i = 0; i < d->u.dict.n; i++)
		if (!d->u.dict.keys[i] || d->u.dict.keys[i]->kind != CKFS_PV_STR)
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': key %zu of %s is not a "
					 "string", path, i, what);
	return CKFS_OK;
}

/* A plain tensor value of a pickle, named key in messages. */
static enum ckfs_code decode_tensor(struct ckfs_torch_file *tf, const struct ckfs_pv *v,
				    const char *key, struct ckfs_sd_entry *e,
				    struct ckfs_error *err)
{
	CKFS_TRY(ckfs_torch_decode_value(tf, v, key, e, err));
	if (e->kind != CKFS_ENTRY_TENSOR)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': %s is not a plain tensor",
				 tf->label, key);
	return CKFS_OK;
}

/* A 1-D contiguous tensor of a pickle as a stretch of a flat buffer. */
static enum ckfs_code decode_flat(struct ckfs_torch_file *tf, const struct ckfs_pv *v,
				  const char *key, uint32_t source, int rank,
				  struct ckfs_flat_seg *seg, struct ckfs_error *err)
{
	struct ckfs_sd_entry e;

	CKFS_TRY(decode_tensor(tf, v, key, &e, err));
	if (e.local.ndim != 1 || (e.local.shape[0] > 1 && e.local.stride[0] != 1))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': %s is not a flat (contiguous "
				 "1-d) tensor", tf->label, key);
	*seg = (struct ckfs_flat_seg){
		.source = source, .rank = rank, .dtype = e.local.dtype, .neg = e.local.neg,
		.pos = e.local.storage_pos +
		       (uint64_t)e.local.storage_offset * ckfs_dtype_size(e.local.dtype),
		.len = (uint64_t)e.local.shape[0],
	};
	return CKFS_OK;
}

static enum ckfs_code open_source(struct ds_build *b, const char *name, uint32_t *index,
				  struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	const char *path = ckfs_arena_printf(&m->arena, "%s/%s", b->files.step, name);
	const char *rel = ckfs_arena_printf(&m->arena, "%s%s", b->files.step_rel, name);

	if (!path || !rel)
		return ckfs_nomem(err);
	CKFS_TRY(ckfs_source_open(&m->sources[m->n_sources], &m->policy, path, rel, err));
	*index = (uint32_t)m->n_sources++;
	return CKFS_OK;
}

/* ---- optimizer states ---- */

/* zero_stage: DeepSpeed pickles ZeroStageEnum(n) (a REDUCE of the class
 * with (n,)); older releases an int. 0 when absent. */
static enum ckfs_code zero_stage(const char *path, const struct ckfs_pv *osd, int *stage,
				 struct ckfs_error *err)
{
	const struct ckfs_pv *v = ckfs_pv_dict_get(osd, "zero_stage");
	int64_t n = 0;
	char what[256];

	*stage = 0;
	if (!v)
		return CKFS_OK;
	if (v->kind == CKFS_PV_CALL && ckfs_pv_is_global_named(v->u.call.fn, "deepspeed",
							       "ZeroStageEnum") &&
	    seq_len(v->u.call.args) == 1)
		v = v->u.call.args->u.seq.items[0];
	if (!get_int(v, &n))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': zero_stage is %s, not a ZeRO "
				 "stage", path, what_is(v, what, sizeof(what)));
	if (n < 1 || n > 3)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': ZeRO stage %lld is not "
				 "supported", path, (long long)n);
	*stage = (int)n;
	return CKFS_OK;
}

/* partition_count: an int (ZeRO-3) or one per param group (ZeRO-1/2), all
 * the same world size. */
static enum ckfs_code partition_count(const char *path, const struct ckfs_pv *osd, int *ws,
				      struct ckfs_error *err)
{
	const struct ckfs_pv *v = ckfs_pv_dict_get(osd, "partition_count");
	int64_t n = 0, x;

	if (get_int(v, &n)) {
		/* one world size */
	} else if (is_seq(v) && seq_len(v) > 0) {
		for (size_t i = 0; i < seq_len(v); i++) {
			if (!get_int(v->u.seq.items[i], &x))
				goto bad;
			if (i && x != n)
				return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': param groups "
						 "partitioned over different world sizes (%lld and "
						 "%lld: MoE expert groups) are not supported", path,
						 (long long)n, (long long)x);
			n = x;
		}
	} else {
		goto bad;
	}
	if (n < 1 || n > (int64_t)CKFS_MAX_RANKS)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': partition_count %lld is not a world "
				 "size from 1 to %u", path, (long long)n, CKFS_MAX_RANKS);
	*ws = (int)n;
	return CKFS_OK;
bad:
	return ckfs_fail(err, CKFS_E_FORMAT, "'%s': no partition_count (the world size)", path);
}

/* The optimizer_state_dict of an optimizer file's pickle. */
static enum ckfs_code optim_state(const struct ckfs_torch_file *tf, const struct ckfs_pv **osd,
				  struct ckfs_error *err)
{
	const struct ckfs_pv *root = tf->root;

	CKFS_TRY(need_kind(tf->label, "the pickled root", root, 0, err));
	*osd = ckfs_pv_dict_get(root, "optimizer_state_dict");
	if (!*osd)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': no optimizer_state_dict (not a "
				 "DeepSpeed ZeRO optimizer file)", tf->label);
	CKFS_TRY(need_kind(tf->label, "optimizer_state_dict", *osd, 0, err));
	if (ckfs_pv_dict_get(*osd, "ds_zero_partition_groups"))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': AutoEP expert partition groups "
				 "are not supported", tf->label);
	return CKFS_OK;
}

/* Stage and world size from one optimizer file: ZeRO-1/2/3, or a
 * BF16_Optimizer state (no zero_stage, but its fp32 partitions and their
 * padding), the only zero-stage-less layout served. */
static enum ckfs_code optim_kind(const char *path, const struct ckfs_pv *osd, int *stage,
				 int *ws, struct ckfs_error *err)
{
	CKFS_TRY(zero_stage(path, osd, stage, err));
	if (*stage == 0 && (!is_seq(ckfs_pv_dict_get(osd, "single_partition_of_fp32_groups")) ||
			    !is_seq(ckfs_pv_dict_get(osd, "group_paddings"))))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': no zero_stage, and not a "
				 "BF16_Optimizer state (no single_partition_of_fp32_groups and "
				 "group_paddings): not a ZeRO checkpoint", path);
	return partition_count(path, osd, ws, err);
}

/* Rank 0's optimizer file: stage and world size, which decide the rest. */
static enum ckfs_code read_optim0(struct ds_build *b, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	uint32_t src;

	if (b->files.n_optim == 0 || !b->files.optim[0]) {
		char name[128];
		ckfs_ds_optim_name(&b->files, 0, name, sizeof(name));
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s/%s': not found (rank 0 is needed)",
				 b->files.step, name);
	}
	CKFS_TRY(open_source(b, b->files.optim[0], &src, err));
	CKFS_TRY(ckfs_torch_open_tree(&b->optim0, m->sources[src].fd, src_path(b, src), err));
	CKFS_TRY(optim_state(&b->optim0, &b->osd0, err));
	CKFS_TRY(optim_kind(src_path(b, src), b->osd0, &b->stage, &b->ws, err));
	m->world_size = b->ws;
	return CKFS_OK;
}

/* ---- model states ---- */

static enum ckfs_code model_view(const struct ckfs_torch_file *tf, struct ds_model_view *v,
				 struct ckfs_error *err)
{
	const char *path = tf->label;
	const struct ckfs_pv *root = tf->root;

	memset(v, 0, sizeof(*v));
	CKFS_TRY(need_kind(path, "the pickled root", root, 0, err));
	if (!is_none(ckfs_pv_dict_get(root, "ds_autoep_layers")) ||
	    !is_none(ckfs_pv_dict_get(root, "autoep_layers")))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': AutoEP expert layers are not "
				 "supported", path);
	v->buffer_names = ckfs_pv_dict_get(root, "buffer_names");
	v->param_shapes = ckfs_pv_dict_get(root, "param_shapes");
	if (!v->buffer_names || !v->param_shapes)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': no %s (not a DeepSpeed model states "
				 "file)", path, v->buffer_names ? "param_shapes" : "buffer_names");
	v->module = ckfs_pv_dict_get(root, "module");
	v->shared = ckfs_pv_dict_get(root, "shared_params");
	CKFS_TRY(need_kind(path, "module", v->module, 0, err));
	CKFS_TRY(need_kind(path, "buffer_names", v->buffer_names, 1, err));
	CKFS_TRY(need_kind(path, "param_shapes", v->param_shapes, 1, err));
	CKFS_TRY(need_kind(path, "shared_params", v->shared, 0, err));
	CKFS_TRY(check_str_keys(path, "module", v->module, err));
	CKFS_TRY(check_str_keys(path, "shared_params", v->shared, err));
	for (size_t g = 0; g < seq_len(v->param_shapes); g++) {
		char what[64];
		snprintf(what, sizeof(what), "param_shapes[%zu]", g);
		CKFS_TRY(need_kind(path, what, v->param_shapes->u.seq.items[g], 0, err));
		CKFS_TRY(check_str_keys(path, what, v->param_shapes->u.seq.items[g], err));
	}
	for (size_t i = 0; i < seq_len(v->buffer_names); i++)
		if (v->buffer_names->u.seq.items[i]->kind != CKFS_PV_STR)
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': buffer_names holds a %s",
					 path, ckfs_pv_kind_name(v->buffer_names->u.seq.items[i]->kind));
	const struct ckfs_pv *fs = ckfs_pv_dict_get(root, "frozen_param_shapes");
	const struct ckfs_pv *ff = ckfs_pv_dict_get(root, "frozen_param_fragments");
	if (!is_none(fs)) {
		CKFS_TRY(need_kind(path, "frozen_param_shapes", fs, 0, err));
		CKFS_TRY(check_str_keys(path, "frozen_param_shapes", fs, err));
		v->frozen_shapes = fs;
	}
	if (v->frozen_shapes && v->frozen_shapes->u.dict.n) {
		CKFS_TRY(need_kind(path, "frozen_param_fragments", ff, 0, err));
		v->frozen_frags = ff;
	}
	return CKFS_OK;
}

/* Two shape dicts (name -> torch.Size) alike: NULL when they are, else
 * the first name that differs ("" for their sizes). */
static const char *shapes_differ(const struct ckfs_pv *a, const struct ckfs_pv *b)
{
	if (!a || !b)
		return a == b ? NULL : "";
	if (a->u.dict.n != b->u.dict.n)
		return "";
	for (size_t i = 0; i < a->u.dict.n; i++) {
		const struct ckfs_pv *x = a->u.dict.vals[i], *y = b->u.dict.vals[i];
		const char *name = a->u.dict.keys[i]->u.str.s;
		if (strcmp(name, b->u.dict.keys[i]->u.str.s) != 0 || seq_len(x) != seq_len(y))
			return name;
		for (size_t k = 0; k < seq_len(x); k++) {
			int64_t p, q;
			if (!get_int(x->u.seq.items[k], &p) || !get_int(y->u.seq.items[k], &q) ||
			    p != q)
				return name;
		}
	}
	return NULL;
}

/* A ZeRO-3 rank's model states describe the same model as rank 0's. */
static enum ckfs_code same_model(const struct ds_build *b, const struct ckfs_torch_file *tf,
				 const struct ds_model_view *v, struct ckfs_error *err)
{
	const struct ds_model_view *v0 = &b->mv0;
	const char *d = NULL, *what = "param_shapes";

	if (seq_len(v->param_shapes) != seq_len(v0->param_shapes))
		d = "";
	for (size_t g = 0; !d && g < seq_len(v->param_shapes); g++)
		d = shapes_differ(v->param_shapes->u.seq.items[g], v0->param_shapes->u.seq.items[g]);
	if (!d) {
		what = "frozen_param_shapes";
		d = shapes_differ(v->frozen_shapes, v0->frozen_shapes);
	}
	if (!d)
		return CKFS_OK;
	return ckfs_fail(err, CKFS_E_INVALID, "'%s': %s differ from rank 0's%s%s%s: files of "
			 "different checkpoints?", tf->label, what, d[0] ? " at '" : "", d,
			 d[0] ? "'" : "");
}

/* ---- output tensors ---- */

static struct ckfs_out *out_at(struct ds_build *b, size_t i)
{
	return &b->outs.v[i];
}

static enum ckfs_code add_out(struct ds_build *b, const struct ckfs_out_spec *s, size_t *index,
			      struct ckfs_error *err)
{
	*index = 0;
	if (!ckfs_outs_add(b->m, &b->outs, s, err))
		return err->code;
	*index = b->outs.n - 1;
	return CKFS_OK;
}

/* Persistent buffers: rank 0's module entries named in buffer_names, in
 * module order (zero_to_fp32 keeps them, floating ones as fp32). */
static enum ckfs_code add_buffers(struct ds_build *b, struct ckfs_error *err)
{
	const struct ckfs_pv *mod = b->mv0.module, *bn = b->mv0.buffer_names;
	const int64_t coord[CKFS_MAX_DIMS] = { 0 };

	for (size_t i = 0; i < mod->u.dict.n; i++) {
		const char *name = mod->u.dict.keys[i]->u.str.s;
		int listed = 0;
		for (size_t k = 0; k < seq_len(bn) && !listed; k++)
			listed = strcmp(bn->u.seq.items[k]->u.str.s, name) == 0;
		if (!listed)
			continue;
		struct ckfs_sd_entry e;
		size_t o;
		CKFS_TRY(decode_tensor(&b->model0, mod->u.dict.vals[i], name, &e, err));
		struct ckfs_out_spec s = { .name = name, .placement = "buffer", .dtype = e.local.dtype,
					   .ndim = e.local.ndim, .shape = e.local.shape };
		CKFS_TRY(add_out(b, &s, &o, err));
		CKFS_TRY(ckfs_entry_chunks(&e, coord, b->model_src, 0, &out_at(b, o)->chunks, err));
	}
	b->n_buffers = b->outs.n;
	return CKFS_OK;
}

/* ZeRO-1/2 frozen parameter: its fragment is the whole tensor. */
static enum ckfs_code frozen_whole(struct ds_build *b, const char *name,
				   const struct ds_shape *shape, struct ckfs_error *err)
{
	int ndim = shape->ndim;
	const struct ckfs_pv *frag = ckfs_pv_dict_get(b->mv0.frozen_frags, name);
	const int64_t coord[CKFS_MAX_DIMS] = { 0 };
	struct ckfs_sd_entry e;
	char key[CKFS_MAX_NAME + 64], a[128], c[128];
	size_t o;

	snprintf(key, sizeof(key), "frozen_param_fragments['%s']", name);
	if (!frag)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': no %s", b->model0.label, key);
	CKFS_TRY(decode_tensor(&b->model0, frag, key, &e, err));
	if (e.local.ndim != ndim ||
	    memcmp(e.local.shape, shape->v, sizeof(int64_t) * (size_t)ndim) != 0)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': %s has shape %s, "
				 "frozen_param_shapes says %s", b->model0.label, key,
				 ckfs_format_dims(e.local.ndim, e.local.shape, "[", "]", a, sizeof(a)),
				 ckfs_format_dims(ndim, shape->v, "[", "]", c, sizeof(c)));
	struct ckfs_out_spec s = { .name = name, .placement = "frozen", .dtype = e.local.dtype,
				   .ndim = ndim, .shape = shape->v };
	CKFS_TRY(add_out(b, &s, &o, err));
	return ckfs_entry_chunks(&e, coord, b->model_src, 0, &out_at(b, o)->chunks, err);
}

/* Frozen parameters in frozen_param_shapes order: whole fragments under
 * ZeRO-1/2, per-rank pieces under ZeRO-3 (filled rank by rank). */
static enum ckfs_code add_frozen(struct ds_build *b, struct ckfs_error *err)
{
	const struct ckfs_pv *fs = b->mv0.frozen_shapes;

	for (size_t i = 0; fs && i < fs->u.dict.n; i++) {
		const char *name = fs->u.dict.keys[i]->u.str.s;
		struct ds_shape shape;
		size_t o;
		CKFS_TRY(get_shape(b->model0.label, "frozen_param_shapes", name, fs->u.dict.vals[i],
				   &shape, err));
		if (b->stage != 3) {
			CKFS_TRY(frozen_whole(b, name, &shape, err));
			continue;
		}
		/* The dtype comes with rank 0's piece (plan_frozen3). */
		struct ckfs_out_spec s = { .name = name, .placement = "frozen, partitioned",
					   .dtype = CKFS_DTYPE_INVALID, .ndim = shape.ndim,
					   .shape = shape.v };
		CKFS_TRY(add_out(b, &s, &o, err));
	}
	return CKFS_OK;
}

/* param_alignment_paddings[g][i] (rank 0's, as zero_to_fp32 reads it): 0
 * when the file has none (BF16_Optimizer, DeepSpeed before 0.19). */
static enum ckfs_code align_pad(const struct ds_build *b, size_t g, size_t i, size_t n,
				uint64_t *pad, struct ckfs_error *err)
{
	const struct ckfs_pv *all = ckfs_pv_dict_get(b->osd0, "param_alignment_paddings");
	const struct ckfs_pv *grp;
	int64_t v;

	*pad = 0;
	if (is_none(all) || b->stage == 3)
		return CKFS_OK;
	grp = g < seq_len(all) ? all->u.seq.items[g] : NULL;
	if (!is_seq(grp) || seq_len(grp) != n)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': param_alignment_paddings has no %zu "
				 "entries for the %zu parameters of param group %zu",
				 b->optim0.label, n, n, g);
	if (!get_int(grp->u.seq.items[i], &v) || v < 0)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': param_alignment_paddings[%zu][%zu] is "
				 "not a count", b->optim0.label, g, i);
	*pad = (uint64_t)v;
	return CKFS_OK;
}

/* Trained parameters in param_shapes order, with their flat offsets. */
static enum ckfs_code add_trained(struct ds_build *b, struct ckfs_error *err)
{
	const struct ckfs_pv *ps = b->mv0.param_shapes;
	size_t total = 0;
	uint64_t off = 0;

	b->n_groups = seq_len(ps);
	for (size_t g = 0; g < b->n_groups; g++)
		total += ps->u.seq.items[g]->u.dict.n;
	if (total > CKFS_MAX_TENSORS)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': too many parameters", b->model0.label);
	b->params = calloc(total + 1, sizeof(*b->params));
	b->need = calloc(b->n_groups + 1, sizeof(*b->need));
	if (!b->params || !b->need)
		return ckfs_nomem(err);
	for (size_t g = 0; g < b->n_groups; g++) {
		const struct ckfs_pv *d = ps->u.seq.items[g];
		char where[64], place[32];
		snprintf(where, sizeof(where), "param_shapes[%zu]", g);
		snprintf(place, sizeof(place), "flat group %zu", g);
		if (b->stage != 3)
			off = 0; /* each group is a flat buffer of its own */
		for (size_t i = 0; i < d->u.dict.n; i++) {
			const char *name = d->u.dict.keys[i]->u.str.s;
			struct ds_param *p = &b->params[b->n_params];
			struct ds_shape shape;
			uint64_t step, pad;
			CKFS_TRY(get_shape(b->model0.label, where, name, d->u.dict.vals[i], &shape,
					   err));
			p->numel = shape.numel;
			CKFS_TRY(align_pad(b, g, i, d->u.dict.n, &pad, err));
			const char *placement = b->stage == 3 ? "partitioned"
						: ckfs_arena_strdup(&b->m->arena, place);
			if (!placement)
				return ckfs_nomem(err);
			/* The dtype is the fp32 partitions' (b->master). */
			struct ckfs_out_spec s = { .name = name, .placement = placement,
						   .dtype = CKFS_DTYPE_INVALID, .ndim = shape.ndim,
						   .shape = shape.v };
			CKFS_TRY(add_out(b, &s, &p->out, err));
			p->group = (int)g;
			p->off = off;
			step = b->stage == 3 ? (p->numel + (uint64_t)b->ws - 1) / (uint64_t)b->ws
					     : p->numel + pad;
			if (__builtin_add_overflow(off, step, &off))
				return ckfs_fail(err, CKFS_E_LIMIT, "'%s': param_shapes overflow",
						 b->model0.label);
			b->n_params++;
		}
		b->need[b->stage == 3 ? 0 : g] = off;
	}
	return CKFS_OK;
}

/* ---- the fp32 partitions ---- */

/* The groups list of rank r's optimizer state, each entry a flat stretch
 * of source src: into segs[0..n). */
static enum ckfs_code read_groups(struct ds_build *b, struct ckfs_torch_file *tf,
				  const struct ckfs_pv *osd, int r, struct ckfs_flat_seg **segs,
				  size_t *n, struct ckfs_error *err)
{
	const char *key = b->stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
	const struct ckfs_pv *groups = ckfs_pv_dict_get(osd, key);

	*segs = NULL;
	*n = 0;
	if (!groups)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': no %s (where the fp32 master weights "
				 "are)", tf->label, key);
	CKFS_TRY(need_kind(tf->label, key, groups, 1, err));
	if (seq_len(groups) > CKFS_MAX_TENSORS)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': too many %s", tf->label, key);
	*segs = calloc(seq_len(groups) + 1, sizeof(**segs));
	if (!*segs)
		return ckfs_nomem(err);
	for (size_t g = 0; g < seq_len(groups); g++) {
		char name[96];
		snprintf(name, sizeof(name), "%s[%zu]", key, g);
		CKFS_TRY(decode_flat(tf, groups->u.seq.items[g], name, (uint32_t)r, r, &(*segs)[g],
				     err));
		if (b->master == CKFS_DTYPE_INVALID)
			b->master = (*segs)[g].dtype;
		if ((*segs)[g].dtype != b->master)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': %s is %s, the other fp32 "
					 "partitions %s", tf->label, name,
					 ckfs_dtype_st_name((*segs)[g].dtype),
					 ckfs_dtype_st_name(b->master));
		(*n)++;
	}
	return CKFS_OK;
}

/* Rank r's optimizer state agrees with rank 0's on the stage and the
 * world size. */
static enum ckfs_code same_kind(const struct ds_build *b, const char *path,
				const struct ckfs_pv *osd, struct ckfs_error *err)
{
	int stage, ws;

	CKFS_TRY(optim_kind(path, osd, &stage, &ws, err));
	if (stage != b->stage || ws != b->ws)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': ZeRO stage %d of world size %d, rank "
				 "0's is stage %d of world size %d: files of different "
				 "checkpoints?", path, stage, ws, b->stage, b->ws);
	return CKFS_OK;
}

/* ZeRO-1/2: rank r's partitions and group_paddings kept for the walk. */
static enum ckfs_code keep_groups12(struct ds_build *b, struct ckfs_torch_file *tf,
				    const struct ckfs_pv *osd, int r, struct ckfs_error *err)
{
	struct ckfs_flat_seg *segs;
	size_t n;
	enum ckfs_code rc = read_groups(b, tf, osd, r, &segs, &n, err);
	const struct ckfs_pv *gp = ckfs_pv_dict_get(osd, "group_paddings");

	if (rc == CKFS_OK && n != b->n_groups)
		rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': %zu fp32 partitions for the %zu param "
			       "groups of param_shapes", tf->label, n, b->n_groups);
	for (size_t g = 0; rc == CKFS_OK && g < n; g++) {
		int64_t pad = -1;
		b->segs[g * (size_t)b->ws + (size_t)r] = segs[g];
		if (!is_none(gp) && (!is_seq(gp) || seq_len(gp) != n ||
				     !get_int(gp->u.seq.items[g], &pad) || pad < 0))
			rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': group_paddings is not one count "
				       "per param group", tf->label);
		b->group_pad[g * (size_t)b->ws + (size_t)r] = pad;
	}
	free(segs);
	return rc;
}

/* ZeRO-1/2 and BF16_Optimizer: group g's flat buffer (the ranks' saved
 * partitions end to end) holds exactly what param_shapes walks, plus the
 * padding group_paddings places at its tail when the partitions kept it. */
static enum ckfs_code check_group12(const struct ds_build *b, size_t g, uint64_t need,
				    struct ckfs_error *err)
{
	const struct ckfs_flat_seg *s = &b->segs[g * (size_t)b->ws];
	const int64_t *gp = &b->group_pad[g * (size_t)b->ws];
	uint64_t total = 0, pads = 0, part = 0;
	int have_pads = 1;

	for (int r = 0; r < b->ws; r++) {
		total += s[r].len;
		have_pads &= gp[r] >= 0;
		pads += gp[r] > 0 ? (uint64_t)gp[r] : 0;
	}
	uint64_t want = b->stage == 0 ? need + pads : need;
	if (!have_pads && b->stage == 0)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': no group_paddings", src_path(b, 0));
	if (total != want && b->stage == 0)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': the fp32 partitions of param group "
				 "%zu hold %llu elements, param_shapes (%s) need %llu and "
				 "group_paddings %llu (no zero_stage: a BF16_Optimizer state, whose "
				 "partitions keep their padding)", src_path(b, 0), g,
				 (unsigned long long)total, b->files.model_all, (unsigned long long)need,
				 (unsigned long long)pads);
	if (total != want)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': the fp32 partitions of param group "
				 "%zu hold %llu elements, param_shapes (%s) need %llu", src_path(b, 0),
				 g, (unsigned long long)total, b->files.model_all, (unsigned long long)want);
	if (!have_pads)
		return CKFS_OK;
	/* Every rank's partition is the same size P with its padding; the
	 * padding is the tail of the group's buffer. */
	for (int r = 0; r < b->ws; r++) {
		uint64_t p = b->stage == 0 ? s[r].len : s[r].len + (uint64_t)gp[r];
		uint64_t end = (uint64_t)(r + 1) * p, tail;
		if (r == 0)
			part = p;
		tail = end > need ? end - need : 0;
		tail = tail < part ? tail : part;
		if (p != part || (uint64_t)gp[r] != tail)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': the fp32 partition of param "
					 "group %zu holds %llu elements with %lld of padding, which "
					 "does not continue rank 0's partitions of %llu", src_path(b, r),
					 g, (unsigned long long)s[r].len, (long long)gp[r],
					 (unsigned long long)part);
	}
	return CKFS_OK;
}

/* ZeRO-1/2 and BF16_Optimizer: every rank's partitions, then each
 * parameter cut from its group's buffer. */
static enum ckfs_code plan_trained12(struct ds_build *b, struct ckfs_error *err)
{
	size_t n = b->n_groups * (size_t)b->ws;

	b->segs = calloc(n + 1, sizeof(*b->segs));
	b->group_pad = calloc(n + 1, sizeof(*b->group_pad));
	if (!b->segs || !b->group_pad)
		return ckfs_nomem(err);
	enum ckfs_code rc = keep_groups12(b, &b->optim0, b->osd0, 0, err);
	for (int r = 1; rc == CKFS_OK && r < b->ws; r++) {
		struct ckfs_torch_file tf;
		const struct ckfs_pv *osd;
		if ((rc = ckfs_torch_open_tree(&tf, b->m->sources[r].fd, src_path(b, (uint32_t)r),
					       err)) != CKFS_OK)
			break;
		if ((rc = optim_state(&tf, &osd, err)) == CKFS_OK &&
		    (rc = same_kind(b, tf.label, osd, err)) == CKFS_OK)
			rc = keep_groups12(b, &tf, osd, r, err);
		ckfs_torch_close(&tf);
	}
	for (size_t g = 0; rc == CKFS_OK && g < b->n_groups; g++)
		rc = check_group12(b, g, b->need[g], err);
	for (size_t i = 0; rc == CKFS_OK && i < b->n_params; i++) {
		const struct ds_param *p = &b->params[i];
		struct ckfs_out *o = out_at(b, p->out);
		struct ckfs_elem_range el = { .ndim = o->ndim, .shape = o->shape, .first = 0,
					      .count = p->numel };
		o->dtype = b->master;
		rc = ckfs_flat_cut(&b->segs[(size_t)p->group * (size_t)b->ws], (size_t)b->ws, p->off,
				   &el, &o->chunks, err);
	}
	return rc;
}

/* ZeRO-3, rank r: its fp32_flat_groups end to end hold piece r of every
 * parameter (ceil(numel/ws) elements, the tail of the last pieces
 * padding), in param_shapes order. */
static enum ckfs_code plan_rank3(struct ds_build *b, struct ckfs_torch_file *tf,
				 const struct ckfs_pv *osd, int r, struct ckfs_error *err)
{
	struct ckfs_flat_seg *segs;
	size_t n;
	uint64_t len = 0, ws = (uint64_t)b->ws;
	enum ckfs_code rc = read_groups(b, tf, osd, r, &segs, &n, err);

	for (size_t g = 0; rc == CKFS_OK && g < n; g++)
		if (__builtin_add_overflow(len, segs[g].len, &len))
			rc = ckfs_fail(err, CKFS_E_LIMIT, "'%s': fp32_flat_groups overflow",
				       tf->label);
	if (rc == CKFS_OK && len != b->need[0])
		rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': fp32_flat_groups hold %llu elements, "
			       "param_shapes (%s) need %llu (ceil(numel/%d) per parameter)",
			       tf->label, (unsigned long long)len, b->files.model_rank[0],
			       (unsigned long long)b->need[0], b->ws);
	for (size_t i = 0; rc == CKFS_OK && i < b->n_params; i++) {
		const struct ds_param *p = &b->params[i];
		struct ckfs_out *o = out_at(b, p->out);
		uint64_t part = (p->numel + ws - 1) / ws, first = (uint64_t)r * part;
		struct ckfs_elem_range el = { .ndim = o->ndim, .shape = o->shape, .first = first,
					      .count = p->numel - first < part ? p->numel - first
									: part };
		o->dtype = b->master;
		if (first < p->numel)
			rc = ckfs_flat_cut(segs, n, p->off, &el, &o->chunks, err);
	}
	free(segs);
	return rc;
}

/* ZeRO-3, rank r's model states (source src): piece r of every frozen
 * parameter, a 1-D fragment of ceil(numel/ws) elements. */
static enum ckfs_code plan_frozen3(struct ds_build *b, struct ckfs_torch_file *tf,
				   const struct ds_model_view *v, int r, uint32_t src,
				   struct ckfs_error *err)
{
	const struct ckfs_pv *fs = v->frozen_shapes;
	uint64_t ws = (uint64_t)b->ws;

	for (size_t i = 0; fs && i < fs->u.dict.n; i++) {
		const char *name = fs->u.dict.keys[i]->u.str.s;
		struct ckfs_out *o = out_at(b, b->n_buffers + i);
		char key[CKFS_MAX_NAME + 64];
		struct ckfs_flat_seg seg;
		uint64_t numel = 1, part, first;
		for (int k = 0; k < o->ndim; k++)
			numel *= (uint64_t)o->shape[k];
		part = (numel + ws - 1) / ws;
		first = (uint64_t)r * part;
		snprintf(key, sizeof(key), "frozen_param_fragments['%s']", name);
		const struct ckfs_pv *frag = ckfs_pv_dict_get(v->frozen_frags, name);
		if (!frag)
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': no %s", tf->label, key);
		CKFS_TRY(decode_flat(tf, frag, key, src, r, &seg, err));
		if (seg.len != part)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': %s holds %llu elements, "
					 "ceil(%llu/%d) = %llu expected", tf->label, key,
					 (unsigned long long)seg.len, (unsigned long long)numel, b->ws,
					 (unsigned long long)part);
		if (o->dtype == CKFS_DTYPE_INVALID)
			o->dtype = seg.dtype;
		if (seg.dtype != o->dtype)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': %s is %s, rank 0's is %s",
					 tf->label, key, ckfs_dtype_st_name(seg.dtype),
					 ckfs_dtype_st_name(o->dtype));
		struct ckfs_elem_range el = { .ndim = o->ndim, .shape = o->shape, .first = first,
					      .count = numel - first < part ? numel - first : part };
		if (first < numel)
			CKFS_TRY(ckfs_flat_blocks(&el, &seg, seg.pos, &o->chunks, err));
	}
	return CKFS_OK;
}

/* ZeRO-3, rank r > 0: its optimizer file and its model states file, one
 * at a time (rank 0's stay open). */
static enum ckfs_code plan_rank3_files(struct ds_build *b, int r, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	uint32_t msrc = b->model_src + (uint32_t)r;
	struct ckfs_torch_file tf;
	const struct ckfs_pv *osd;
	struct ds_model_view v;
	enum ckfs_code rc;

	CKFS_TRY(ckfs_torch_open_tree(&tf, m->sources[r].fd, src_path(b, (uint32_t)r), err));
	if ((rc = optim_state(&tf, &osd, err)) == CKFS_OK &&
	    (rc = same_kind(b, tf.label, osd, err)) == CKFS_OK)
		rc = plan_rank3(b, &tf, osd, r, err);
	ckfs_torch_close(&tf);
	CKFS_TRY(rc);
	CKFS_TRY(ckfs_torch_open_tree(&tf, m->sources[msrc].fd, src_path(b, msrc), err));
	if ((rc = model_view(&tf, &v, err)) == CKFS_OK && (rc = same_model(b, &tf, &v, err)) == CKFS_OK)
		rc = plan_frozen3(b, &tf, &v, r, msrc, err);
	ckfs_torch_close(&tf);
	return rc;
}

static enum ckfs_code plan3(struct ds_build *b, struct ckfs_error *err)
{
	CKFS_TRY(plan_rank3(b, &b->optim0, b->osd0, 0, err));
	CKFS_TRY(plan_frozen3(b, &b->model0, &b->mv0, 0, b->model_src, err));
	for (int r = 1; r < b->ws; r++)
		CKFS_TRY(plan_rank3_files(b, r, err));
	return CKFS_OK;
}

/* ---- names ---- */

static const char *out_name(const struct ds_build *b, size_t i)
{
	return b->outs.v[i].name;
}

static int cmp_out_name(const void *x, const void *y, void *ctx)
{
	const struct ds_build *b = ctx;
	return strcmp(out_name(b, *(const size_t *)x), out_name(b, *(const size_t *)y));
}

/* The outputs' indices sorted by name (*by, malloc'd). */
static enum ckfs_code sort_outs(const struct ds_build *b, size_t **by, struct ckfs_error *err)
{
	*by = malloc((b->outs.n + 1) * sizeof(**by));
	if (!*by)
		return ckfs_nomem(err);
	for (size_t i = 0; i < b->outs.n; i++)
		(*by)[i] = i;
	qsort_r(*by, b->outs.n, sizeof(**by), cmp_out_name, (void *)b);
	return CKFS_OK;
}

static int find_out(const struct ds_build *b, const size_t *by, const char *name)
{
	size_t lo = 0, hi = b->outs.n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(out_name(b, by[mid]), name);
		if (c == 0)
			return 1;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

/* Buffers, frozen and trained parameters name different tensors
 * (zero_to_fp32's dict would keep one of two). */
static enum ckfs_code check_unique(const struct ds_build *b, struct ckfs_error *err)
{
	size_t *by;
	enum ckfs_code rc = CKFS_OK;

	CKFS_TRY(sort_outs(b, &by, err));
	for (size_t i = 1; rc == CKFS_OK && i < b->outs.n; i++)
		if (strcmp(out_name(b, by[i]), out_name(b, by[i - 1])) == 0)
			rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' is listed twice among the "
				       "buffers, frozen and trained parameters", b->model0.label,
				       out_name(b, by[i]));
	free(by);
	return rc;
}

static size_t out_index(const struct ds_build *b, const char *name)
{
	for (size_t i = 0; i < b->outs.n; i++)
		if (strcmp(out_name(b, i), name) == 0)
			return i;
	return SIZE_MAX;
}

/* Tied parameters (shared_params alias -> owner): the owner's tensor
 * under the alias too, when zero_to_fp32 has the owner. */
static enum ckfs_code add_aliases(struct ds_build *b, struct ckfs_error *err)
{
	const struct ckfs_pv *sp = b->mv0.shared;

	for (size_t i = 0; i < sp->u.dict.n; i++) {
		const char *alias = sp->u.dict.keys[i]->u.str.s;
		const struct ckfs_pv *owner = sp->u.dict.vals[i];
		size_t o, a;
		if (!owner || owner->kind != CKFS_PV_STR)
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': shared_params['%s'] is not a "
					 "name", b->model0.label, alias);
		if (out_index(b, alias) != SIZE_MAX)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': shared_params ties '%s', "
					 "which is a tensor of its own, to '%s'", b->model0.label,
					 alias, owner->u.str.s);
		o = out_index(b, owner->u.str.s);
		if (o == SIZE_MAX)
			continue; /* zero_to_fp32 skips it too (warned as left out) */
		const struct ckfs_out *src = out_at(b, o);
		struct ckfs_out_spec s = { .name = alias, .placement = "shared", .dtype = src->dtype,
					   .ndim = src->ndim, .shape = src->shape };
		CKFS_TRY(add_out(b, &s, &a, err));
		for (size_t k = 0; k < out_at(b, o)->chunks.n; k++)
			CKFS_TRY(ckfs_chunk_list_push(&out_at(b, a)->chunks,
						      &out_at(b, o)->chunks.v[k], err));
	}
	return CKFS_OK;
}

/* Module entries zero_to_fp32 leaves out (ZeRO-1 and BF16_Optimizer save
 * no frozen parameters): served without them too, with a warning. */
static enum ckfs_code warn_left_out(struct ds_build *b, struct ckfs_error *err)
{
	const struct ckfs_pv *mod = b->mv0.module;
	char list[512] = "";
	size_t n = 0, *by;

	CKFS_TRY(sort_outs(b, &by, err));
	for (size_t i = 0; i < mod->u.dict.n; i++) {
		const char *name = mod->u.dict.keys[i]->u.str.s;
		if (find_out(b, by, name))
			continue;
		if (n++ < 3)
			snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
				 n > 1 ? ", " : "", name);
	}
	free(by);
	if (!n)
		return CKFS_OK;
	return ckfs_model_warn(b->m, err, "%zu entr%s of the model's state dict %s not in the "
			       "ZeRO data and left out, as zero_to_fp32 leaves %s out (ZeRO-1 "
			       "saves no frozen parameters): %s%s", n, n == 1 ? "y" : "ies",
			       n == 1 ? "is" : "are", n == 1 ? "it" : "them", list,
			       n > 3 ? ", ..." : "");
}

/* Hugging Face names through the one name rule (names.c). */
static enum ckfs_code apply_names(struct ds_build *b, struct ckfs_error *err)
{
	size_t n = b->outs.n;
	const char **keys = calloc(n + 1, sizeof(*keys)), **names = calloc(n + 1, sizeof(*names));
	enum ckfs_code rc = CKFS_OK;

	if (!keys || !names)
		rc = ckfs_nomem(err);
	for (size_t i = 0; rc == CKFS_OK && i < n; i++)
		keys[i] = out_name(b, i);
	if (rc == CKFS_OK)
		rc = ckfs_hf_names(b->m, b->model0.label, keys, names, n, true, err);
	for (size_t i = 0; rc == CKFS_OK && i < n; i++)
		b->outs.v[i].name = names[i];
	free(keys);
	free(names);
	return rc;
}

/* ---- the whole ---- */

/* config.json: --config, else the one beside the step folder (the HF
 * Trainer's checkpoint-N/, whose files are then the side files), else
 * SRC/huggingface/. */
static enum ckfs_code load_config(struct ds_build *b, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	char *own = ckfs_arena_printf(&m->arena, "%s/config.json", m->src_dir);
	char *hf_cfg = ckfs_arena_printf(&m->arena, "%s/huggingface/config.json", m->src_dir);
	char *parent = ckfs_arena_printf(&m->arena, "%s/../config.json", m->src_dir);

	if (!own || !hf_cfg || !parent)
		return ckfs_nomem(err);
	int beside = ckfs_path_exists(own);
	const char *hf = beside ? m->src_dir : ckfs_arena_printf(&m->arena, "%s/huggingface",
								     m->src_dir);
	if (!hf)
		return ckfs_nomem(err);
	if (!b->opt->config_path && !beside && !ckfs_path_exists(hf_cfg)) {
		/* SRC is the Trainer's global_stepN/: its config is one up */
		char *up = !b->files.tag ? realpath(parent, NULL) : NULL;
		enum ckfs_code rc = ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': no config.json (only "
					      "the Hugging Face Trainer saves one beside a DeepSpeed "
					      "checkpoint); pass --config PATH to a Hugging Face "
					      "config.json%s%s%s", m->src_dir, up ? ", e.g. '" : "",
					      up ? up : "", up ? "'" : "");
		free(up);
		return rc;
	}
	return ckfs_model_load_config_from(m, hf, b->opt->config_path, err);
}

/* Optimizer files 1 .. ws-1 as sources 1 .. ws-1 (rank 0's is source 0),
 * then the model states files, whose pickles describe the tensors. */
static enum ckfs_code open_files(struct ds_build *b, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	uint32_t src;

	for (long r = 1; r < b->ws; r++)
		CKFS_TRY(open_source(b, b->files.optim[r], &src, err));
	b->model_src = (uint32_t)m->n_sources;
	for (long r = 0; r < (b->stage == 3 ? b->ws : 1); r++) {
		CKFS_TRY(open_source(b, b->stage == 3 ? b->files.model_rank[r] : b->files.model_all, &src, err));
		CKFS_TRY(ckfs_model_note_meta_source(m, &m->sources[src], err));
	}
	m->ranks_read = ckfs_arena_calloc(&m->arena, (size_t)b->ws, sizeof(int));
	if (!m->ranks_read)
		return ckfs_nomem(err);
	for (int r = 0; r < b->ws; r++)
		m->ranks_read[r] = r;
	m->n_ranks_read = (size_t)b->ws;
	return CKFS_OK;
}

/* The output tensors in zero_to_fp32's order (buffers, frozen, trained,
 * aliases), each with its chunks. */
static enum ckfs_code plan(struct ds_build *b, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;

	CKFS_TRY(ckfs_torch_open_tree(&b->model0, m->sources[b->model_src].fd,
				      src_path(b, b->model_src), err));
	CKFS_TRY(model_view(&b->model0, &b->mv0, err));
	CKFS_TRY(add_buffers(b, err));
	CKFS_TRY(add_frozen(b, err));
	CKFS_TRY(add_trained(b, err));
	CKFS_TRY(check_unique(b, err));
	CKFS_TRY(b->stage == 3 ? plan3(b, err) : plan_trained12(b, err));
	CKFS_TRY(add_aliases(b, err));
	if (b->outs.n == 0)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': no parameters or buffers",
				 b->model0.label);
	return warn_left_out(b, err);
}

/* m's tensors from the outputs; floating buffers served as fp32 unless
 * --dtype says otherwise (zero_to_fp32 calls .float() on them). The names
 * are those a module holds in memory, made what save_pretrained writes as
 * for FSDP and DCP (the row's flag: the tie rule, vision-language
 * prefixes, fused expert stacks; hf_save.c); PEFT (LoRA) names are
 * refused: how a DeepSpeed-trained adapter should be served has not been
 * checked against a reference. */
static enum ckfs_code finish(struct ds_build *b, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;

	CKFS_TRY(apply_names(b, err));
	CKFS_TRY(ckfs_outs_to_model(m, &b->outs, b->files.step, err));
	for (size_t i = 0; i < b->n_buffers; i++)
		if (ckfs_dtype_is_float(m->tensors[i].stored_dtype))
			m->tensors[i].out_dtype = CKFS_DTYPE_F32;
	if (ckfs_peft_names(m))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': it holds PEFT (LoRA) names "
				 "(base_model.model., lora_): LoRA checkpoints of DeepSpeed are "
				 "not supported yet", b->model0.label);
	return CKFS_OK;
}

static enum ckfs_code build(struct ds_build *b, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	size_t cap;

	CKFS_TRY(ckfs_ds_find_files(m, &b->files, err));
	cap = (size_t)b->files.n_optim + (size_t)b->files.n_model_rank + 1;
	if (!(m->sources = ckfs_arena_calloc(&m->arena, cap, sizeof(*m->sources))))
		return ckfs_nomem(err);
	CKFS_TRY(read_optim0(b, err));
	b->files.ws = b->ws;
	b->files.stage = b->stage;
	CKFS_TRY(ckfs_ds_check_files(&b->files, err));
	CKFS_TRY(load_config(b, err));
	CKFS_TRY(open_files(b, err));
	CKFS_TRY(plan(b, err));
	return finish(b, err);
}

static void release(struct ds_build *b)
{
	ckfs_ds_files_release(&b->files);
	ckfs_torch_close(&b->optim0);
	ckfs_torch_close(&b->model0);
	ckfs_outs_release(&b->outs);
	free(b->params);
	free(b->need);
	free(b->segs);
	free(b->group_pad);
}

static enum ckfs_code deepspeed_build(struct ckfs_model *m, const struct ckfs_model_options *opt,
				      struct ckfs_error *err)
{
	struct ds_build b = { .m = m, .opt = opt, .master = CKFS_DTYPE_INVALID };
	struct ds_info *info = ckfs_arena_calloc(&m->arena, 1, sizeof(*info));
	enum ckfs_code rc = info ? build(&b, err) : ckfs_nomem(err);

	if (rc == CKFS_OK) {
		info->zero_stage = b.stage;
		info->tag = b.files.tag;
		m->layout_info = info;
	}
	release(&b);
	return rc;
}

/* The ZeRO stage, the optimizer it implies, and the tag. */
static enum ckfs_code deepspeed_describe(const struct ckfs_model *m, struct ckfs_facts *f,
					 struct ckfs_error *err)
{
	const struct ds_info *info = m->layout_info;
	struct ckfs_strbuf line = { 0 };

	CKFS_TRY(ckfs_facts_layout_line(f, m, false, err));
	if (info->zero_stage)
		ckfs_strbuf_fmt(&line, "ZeRO-%d", info->zero_stage);
	else
		ckfs_strbuf_str(&line, "BF16_Optimizer (no ZeRO stage recorded)");
	ckfs_strbuf_fmt(&line, ", world size %d", m->world_size);
	if (info->tag)
		ckfs_strbuf_fmt(&line, ", tag %s", info->tag);
	cJSON *o = cJSON_CreateObject();
	bool ok = cJSON_AddNumberToObject(o, "zero_stage", info->zero_stage) &&
		  cJSON_AddStringToObject(o, "optimizer",
					  info->zero_stage == 3 ? "DeepSpeedZeroOptimizer_Stage3"
					  : info->zero_stage    ? "DeepSpeedZeroOptimizer"
								: "BF16_Optimizer") &&
		  (info->tag ? cJSON_AddStringToObject(o, "tag", info->tag)
			     : cJSON_AddNullToObject(o, "tag"));
	return ckfs_facts_add(f, "zero", &line, "deepspeed", ckfs_facts_json(o, ok), err);
}

const struct ckfs_layout ckfs_layout_deepspeed = {
	.name = "deepspeed",
	.what = "a DeepSpeed checkpoint",
	.looks_for = "*_optim_states.pt in it or a step folder",
	.detect = ckfs_ds_detect,
	.build = deepspeed_build,
	.describe = deepspeed_describe,
	.flags = CKFS_LAYOUT_HELD_NAMES,
};
