/* SPDX-License-Identifier: MIT */
/*
 * Output tensors under construction (src/layouts/layouts.h): readers that
 * cut their source tensors into other tensors (Megatron's fused QKV and
 * gate/up, expert stacks) or gather them from flat buffers (DeepSpeed)
 * collect each output's chunks here, then hand the list to the model as
 * validated tensors; and a box of a tensor cut as a tensor of its own
 * (hf_save.c's fused expert stacks).
 */
#include <stdlib.h>
#include <string.h>

#include "layouts/layouts.h"

struct ckfs_out *ckfs_outs_add(struct ckfs_model *m, struct ckfs_outs *l,
			       const struct ckfs_out_spec *s, struct ckfs_error *err)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		struct ckfs_out *v = realloc(l->v, cap * sizeof(*v));
		if (!v) {
			ckfs_nomem(err);
			return NULL;
		}
		l->v = v;
		l->cap = cap;
	}
	struct ckfs_out *o = &l->v[l->n];
	memset(o, 0, sizeof(*o));
	if (!(o->name = ckfs_arena_strdup(&m->arena, s->name))) {
		ckfs_nomem(err);
		return NULL;
	}
	o->placement = s->placement;
	o->dtype = s->dtype;
	o->ndim = s->ndim;
	memcpy(o->shape, s->shape, sizeof(int64_t) * (size_t)s->ndim);
	o->group = s->group;
	o->layer = s->layer;
	o->order = s->order;
	l->n++;
	return o;
}

void ckfs_outs_release(struct ckfs_outs *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i].chunks.v);
	free(l->v);
	memset(l, 0, sizeof(*l));
}

bool ckfs_tensor_set(struct ckfs_tensor *t, enum ckfs_dtype dtype, int ndim,
		     const int64_t *shape)
{
	t->stored_dtype = t->out_dtype = dtype;
	t->ndim = ndim;
	memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
	t->numel = 1;
	for (int d = 0; d < ndim; d++)
		if (__builtin_mul_overflow(t->numel, (uint64_t)shape[d], &t->numel))
			return false;
	return true;
}

enum ckfs_code ckfs_outs_to_model(struct ckfs_model *m, const struct ckfs_outs *l,
				  const char *label, struct ckfs_error *err)
{
	m->tensors = ckfs_arena_calloc(&m->arena, l->n + 1, sizeof(*m->tensors));
	if (!m->tensors)
		return ckfs_nomem(err);
	m->n_tensors = 0;
	for (size_t k = 0; k < l->n; k++) {
		const struct ckfs_out *o = &l->v[k];
		struct ckfs_tensor *t = &m->tensors[m->n_tensors];
		t->name = o->name;
		t->placement = o->placement;
		if (!ckfs_tensor_set(t, o->dtype, o->ndim, o->shape))
			return ckfs_fail(err, CKFS_E_FORMAT, "tensor '%s': shape overflows",
					 t->name);
		t->n_chunks = (uint32_t)o->chunks.n;
		t->chunks = ckfs_model_chunks(m, o->chunks.v, o->chunks.n, t->ndim);
		if (!t->chunks)
			return ckfs_nomem(err);
		if (ckfs_plan_validate_tensor(m, t, err) != CKFS_OK) {
			ckfs_error_prefix(err, "'%s'", label);
			return err->code;
		}
		m->n_tensors++;
	}
	return CKFS_OK;
}

enum ckfs_code ckfs_tensor_cut(struct ckfs_model *m, const struct ckfs_tensor *r,
			       const struct ckfs_box *box, const char *name,
			       struct ckfs_tensor *out, struct ckfs_error *err)
{
	struct ckfs_chunk_list l = { 0 };
	int64_t dst[CKFS_MAX_DIMS] = { 0 };
	int ndrop = box->ndrop;
	enum ckfs_code rc = ckfs_chunks_box(&l, r, box, dst, err);

	memset(out, 0, sizeof(*out));
	out->name = ckfs_arena_strdup(&m->arena, name);
	out->chunks = ckfs_model_chunks(m, l.v, l.n, r->ndim - ndrop);
	if (rc == CKFS_OK && (!out->name || !out->chunks))
		rc = ckfs_nomem(err);
	if (rc == CKFS_OK) {
		out->n_chunks = (uint32_t)l.n;
		out->placement = r->placement;
		out->stored_dtype = r->stored_dtype;
		out->out_dtype = r->out_dtype;
		out->ndim = r->ndim - ndrop;
		out->numel = 1;
		for (int d = 0; d < out->ndim; d++) {
			out->shape[d] = box->n[ndrop + d];
			out->numel *= (uint64_t)out->shape[d]; /* inside r */
		}
		rc = ckfs_plan_validate_tensor(m, out, err);
	}
	free(l.v);
	return rc;
}
