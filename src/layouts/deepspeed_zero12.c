/* SPDX-License-Identifier: MIT */
/*
 * DeepSpeed ZeRO-1/2 and BF16_Optimizer (deepspeed_int.h), as zero_to_fp32
 * reads them: per param group, the ranks' single_partition_of_fp32_groups
 * end to end are the group's flat buffer (the tail padding dropped);
 * param_shapes[g] walks it in order, each parameter followed by its
 * param_alignment_paddings entry. BF16_Optimizer (no zero_stage:
 * zero_to_fp32 refuses it) is the same walk, but every rank keeps its
 * padding, which group_paddings places at the tail. Frozen parameters are
 * whole in frozen_param_fragments.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/deepspeed_int.h"

/* ZeRO-1/2 frozen parameter: its fragment is the whole tensor. */
enum ckfs_code ds_frozen_zero12(struct ds_build *b, const char *name,
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
	CKFS_TRY(ds_decode_tensor(&b->model0, frag, key, &e, err));
	if (e.local.ndim != ndim ||
	    memcmp(e.local.shape, shape->v, sizeof(int64_t) * (size_t)ndim) != 0)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': %s has shape %s, "
				 "frozen_param_shapes says %s", b->model0.label, key,
				 ckfs_format_dims(e.local.ndim, e.local.shape, "[", "]", a, sizeof(a)),
				 ckfs_format_dims(ndim, shape->v, "[", "]", c, sizeof(c)));
	struct ckfs_out_spec s = { .name = name, .placement = "frozen", .dtype = e.local.dtype,
				   .ndim = ndim, .shape = shape->v };
	CKFS_TRY(ds_add_out(b, &s, &o, err));
	return ckfs_entry_chunks(&e, coord, b->model_src, 0, &ds_out_at(b, o)->chunks, err);
}

/* ZeRO-1/2: rank r's partitions and group_paddings kept for the walk. */
static enum ckfs_code keep_groups12(struct ds_build *b, struct ckfs_torch_file *tf,
				    const struct ckfs_pv *osd, int r, struct ckfs_error *err)
{
	struct ckfs_flat_seg *segs;
	size_t n;
	enum ckfs_code rc = ds_read_groups(b, tf, osd, r, &segs, &n, err);
	const struct ckfs_pv *gp = ckfs_pv_dict_get(osd, "group_paddings");

	if (rc == CKFS_OK && n != b->n_groups)
		rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': %zu fp32 partitions for the %zu param "
			       "groups of param_shapes", tf->label, n, b->n_groups);
	for (size_t g = 0; rc == CKFS_OK && g < n; g++) {
		int64_t pad = -1;
		b->segs[g * (size_t)b->ws + (size_t)r] = segs[g];
		if (!ckfs_pv_is_none(gp) && (!ckfs_pv_is_seq(gp) || ckfs_pv_seq_len(gp) != n ||
					     !ckfs_pv_get_int(gp->u.seq.items[g], &pad) || pad < 0))
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
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': no group_paddings", ds_src_path(b, 0));
	if (total != want && b->stage == 0)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': the fp32 partitions of param group "
				 "%zu hold %llu elements, param_shapes (%s) need %llu and "
				 "group_paddings %llu (no zero_stage: a BF16_Optimizer state, whose "
				 "partitions keep their padding)", ds_src_path(b, 0), g,
				 (unsigned long long)total, b->files.model_all, (unsigned long long)need,
				 (unsigned long long)pads);
	if (total != want)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': the fp32 partitions of param group "
				 "%zu hold %llu elements, param_shapes (%s) need %llu", ds_src_path(b, 0),
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
					 "does not continue rank 0's partitions of %llu", ds_src_path(b, r),
					 g, (unsigned long long)s[r].len, (long long)gp[r],
					 (unsigned long long)part);
	}
	return CKFS_OK;
}

/* ZeRO-1/2 and BF16_Optimizer: every rank's partitions, then each
 * parameter cut from its group's buffer. */
enum ckfs_code ds_plan_zero12(struct ds_build *b, struct ckfs_error *err)
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
		if ((rc = ds_open_tree(b, (uint32_t)r, &tf, err)) != CKFS_OK)
			break;
		if ((rc = ds_optim_state(&tf, &osd, err)) == CKFS_OK &&
		    (rc = ds_same_kind(b, tf.label, osd, err)) == CKFS_OK)
			rc = keep_groups12(b, &tf, osd, r, err);
		ckfs_torch_close(&tf);
	}
	for (size_t g = 0; rc == CKFS_OK && g < b->n_groups; g++)
		rc = check_group12(b, g, b->need[g], err);
	for (size_t i = 0; rc == CKFS_OK && i < b->n_params; i++) {
		const struct ds_param *p = &b->params[i];
		struct ckfs_out *o = ds_out_at(b, p->out);
		struct ckfs_elem_range el = { .ndim = o->ndim, .shape = o->shape, .first = 0,
					      .count = p->numel };
		o->dtype = b->master;
		rc = ckfs_flat_cut(&b->segs[(size_t)p->group * (size_t)b->ws], (size_t)b->ws, p->off,
				   &el, &o->chunks, err);
	}
	return rc;
}
