/* SPDX-License-Identifier: MIT */
/*
 * DeepSpeed ZeRO-3 (deepspeed_int.h), as zero_to_fp32 reads it: each
 * parameter is cut into pieces of ceil(numel/ws), one per rank; every
 * rank's fp32_flat_groups end to end hold its pieces in param_shapes
 * order; the tail of the last pieces is padding (uninitialised memory,
 * never read). Frozen parameters are one 1-D piece per rank in that
 * rank's frozen_param_fragments. Every rank has its own model states
 * file, which must describe rank 0's model.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/deepspeed_int.h"

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
		if (strcmp(name, b->u.dict.keys[i]->u.str.s) != 0 ||
		    ckfs_pv_seq_len(x) != ckfs_pv_seq_len(y))
			return name;
		for (size_t k = 0; k < ckfs_pv_seq_len(x); k++) {
			int64_t p, q;
			if (!ckfs_pv_get_int(x->u.seq.items[k], &p) ||
			    !ckfs_pv_get_int(y->u.seq.items[k], &q) || p != q)
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

	if (ckfs_pv_seq_len(v->param_shapes) != ckfs_pv_seq_len(v0->param_shapes))
		d = "";
	for (size_t g = 0; !d && g < ckfs_pv_seq_len(v->param_shapes); g++)
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

/* ZeRO-3, rank r: its fp32_flat_groups end to end hold piece r of every
 * parameter (ceil(numel/ws) elements, the tail of the last pieces
 * padding), in param_shapes order. */
static enum ckfs_code plan_rank3(struct ds_build *b, struct ckfs_torch_file *tf,
				 const struct ckfs_pv *osd, int r, struct ckfs_error *err)
{
	struct ckfs_flat_seg *segs;
	size_t n;
	uint64_t len = 0, ws = (uint64_t)b->ws;
	enum ckfs_code rc = ds_read_groups(b, tf, osd, r, &segs, &n, err);

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
		struct ckfs_out *o = ds_out_at(b, p->out);
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
		struct ckfs_out *o = ds_out_at(b, b->n_buffers + i);
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
		CKFS_TRY(ds_decode_flat(tf, frag, key, src, r, &seg, err));
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
	uint32_t msrc = b->model_src + (uint32_t)r;
	struct ckfs_torch_file tf;
	const struct ckfs_pv *osd;
	struct ds_model_view v;
	enum ckfs_code rc;

	CKFS_TRY(ds_open_tree(b, (uint32_t)r, &tf, err));
	if ((rc = ds_optim_state(&tf, &osd, err)) == CKFS_OK &&
	    (rc = ds_same_kind(b, tf.label, osd, err)) == CKFS_OK)
		rc = plan_rank3(b, &tf, osd, r, err);
	ckfs_torch_close(&tf);
	CKFS_TRY(rc);
	CKFS_TRY(ds_open_tree(b, msrc, &tf, err));
	if ((rc = ds_model_states(&tf, &v, err)) == CKFS_OK &&
	    (rc = same_model(b, &tf, &v, err)) == CKFS_OK)
		rc = plan_frozen3(b, &tf, &v, r, msrc, err);
	ckfs_torch_close(&tf);
	return rc;
}

enum ckfs_code ds_plan_zero3(struct ds_build *b, struct ckfs_error *err)
{
	CKFS_TRY(plan_rank3(b, &b->optim0, b->osd0, 0, err));
	CKFS_TRY(plan_frozen3(b, &b->model0, &b->mv0, 0, b->model_src, err));
	for (int r = 1; r < b->ws; r++)
		CKFS_TRY(plan_rank3_files(b, r, err));
	return CKFS_OK;
}
