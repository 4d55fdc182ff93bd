/* SPDX-License-Identifier: MIT */
/*
 * What the pickles of a DeepSpeed checkpoint say (deepspeed_int.h): the
 * model states files (module, buffer_names, param_shapes, the frozen
 * parameters, shared_params) and the optimizer states files (zero_stage,
 * partition_count, the fp32 partitions), checked as zero_to_fp32 needs
 * them.
 *
 * The pickles hold DeepSpeed's own classes (ZeroStageEnum, LossScaler,
 * fragment_address): the pickle VM keeps them as opaque values and only
 * zero_stage's int is read. A value found where a dict, a list or a tensor
 * belongs is refused: what an object holds cannot be known without running
 * its class.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/deepspeed_int.h"

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
	if (seq ? ckfs_pv_is_seq(v) : v->kind == CKFS_PV_DICT)
		return CKFS_OK;
	return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': %s is %s, not a %s: where its tensors "
			 "are cannot be known without running it", path, key,
			 what_is(v, what, sizeof(what)), seq ? "list" : "dict");
}

/* A pickled torch.Size (a tuple after the VM) as a shape. */
enum ckfs_code ds_get_shape(const char *path, const char *where, const char *name,
			    const struct ckfs_pv *v, struct ds_shape *s, struct ckfs_error *err)
{
	size_t n = ckfs_pv_seq_len(v);

	if (!ckfs_pv_is_seq(v) || n > CKFS_MAX_DIMS)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': the shape of '%s' in %s is not a "
				 "torch.Size", path, name, where);
	s->numel = 1;
	for (size_t k = 0; k < n; k++) {
		if (!ckfs_pv_get_int(v->u.seq.items[k], &s->v[k]) || s->v[k] < 0)
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
enum ckfs_code ds_decode_tensor(struct ckfs_torch_file *tf, const struct ckfs_pv *v,
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
enum ckfs_code ds_decode_flat(struct ckfs_torch_file *tf, const struct ckfs_pv *v,
			      const char *key, uint32_t source, int rank,
			      struct ckfs_flat_seg *seg, struct ckfs_error *err)
{
	struct ckfs_sd_entry e;

	CKFS_TRY(ds_decode_tensor(tf, v, key, &e, err));
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
	    ckfs_pv_seq_len(v->u.call.args) == 1)
		v = v->u.call.args->u.seq.items[0];
	if (!ckfs_pv_get_int(v, &n))
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

	if (ckfs_pv_get_int(v, &n)) {
		/* one world size */
	} else if (ckfs_pv_is_seq(v) && ckfs_pv_seq_len(v) > 0) {
		for (size_t i = 0; i < ckfs_pv_seq_len(v); i++) {
			if (!ckfs_pv_get_int(v->u.seq.items[i], &x))
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
enum ckfs_code ds_optim_state(const struct ckfs_torch_file *tf, const struct ckfs_pv **osd,
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
enum ckfs_code ds_optim_kind(const char *path, const struct ckfs_pv *osd, int *stage,
			     int *ws, struct ckfs_error *err)
{
	CKFS_TRY(zero_stage(path, osd, stage, err));
	const struct ckfs_pv *parts = ckfs_pv_dict_get(osd, "single_partition_of_fp32_groups");
	const struct ckfs_pv *pads = ckfs_pv_dict_get(osd, "group_paddings");

	if (*stage == 0 && (!ckfs_pv_is_seq(parts) || !ckfs_pv_is_seq(pads)))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': no zero_stage, and not a "
				 "BF16_Optimizer state (no single_partition_of_fp32_groups and "
				 "group_paddings): not a ZeRO checkpoint", path);
	return partition_count(path, osd, ws, err);
}

enum ckfs_code ds_model_states(const struct ckfs_torch_file *tf, struct ds_model_view *v,
			       struct ckfs_error *err)
{
	const char *path = tf->label;
	const struct ckfs_pv *root = tf->root;

	memset(v, 0, sizeof(*v));
	CKFS_TRY(need_kind(path, "the pickled root", root, 0, err));
	if (!ckfs_pv_is_none(ckfs_pv_dict_get(root, "ds_autoep_layers")) ||
	    !ckfs_pv_is_none(ckfs_pv_dict_get(root, "autoep_layers")))
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
	for (size_t g = 0; g < ckfs_pv_seq_len(v->param_shapes); g++) {
		char what[64];
		snprintf(what, sizeof(what), "param_shapes[%zu]", g);
		CKFS_TRY(need_kind(path, what, v->param_shapes->u.seq.items[g], 0, err));
		CKFS_TRY(check_str_keys(path, what, v->param_shapes->u.seq.items[g], err));
	}
	for (size_t i = 0; i < ckfs_pv_seq_len(v->buffer_names); i++)
		if (v->buffer_names->u.seq.items[i]->kind != CKFS_PV_STR)
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': buffer_names holds a %s",
					 path, ckfs_pv_kind_name(v->buffer_names->u.seq.items[i]->kind));
	const struct ckfs_pv *fs = ckfs_pv_dict_get(root, "frozen_param_shapes");
	const struct ckfs_pv *ff = ckfs_pv_dict_get(root, "frozen_param_fragments");
	if (!ckfs_pv_is_none(fs)) {
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

/* The groups list of rank r's optimizer state, each entry a flat stretch
 * of source src: into segs[0..n). */
enum ckfs_code ds_read_groups(struct ds_build *b, struct ckfs_torch_file *tf,
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
	if (ckfs_pv_seq_len(groups) > CKFS_MAX_TENSORS)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': too many %s", tf->label, key);
	*segs = calloc(ckfs_pv_seq_len(groups) + 1, sizeof(**segs));
	if (!*segs)
		return ckfs_nomem(err);
	for (size_t g = 0; g < ckfs_pv_seq_len(groups); g++) {
		char name[96];
		snprintf(name, sizeof(name), "%s[%zu]", key, g);
		CKFS_TRY(ds_decode_flat(tf, groups->u.seq.items[g], name, (uint32_t)r, r,
					&(*segs)[g], err));
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
enum ckfs_code ds_same_kind(const struct ds_build *b, const char *path,
			    const struct ckfs_pv *osd, struct ckfs_error *err)
{
	int stage, ws;

	CKFS_TRY(ds_optim_kind(path, osd, &stage, &ws, err));
	if (stage != b->stage || ws != b->ws)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': ZeRO stage %d of world size %d, rank "
				 "0's is stage %d of world size %d: files of different "
				 "checkpoints?", path, stage, ws, b->stage, b->ws);
	return CKFS_OK;
}
