/* SPDX-License-Identifier: MIT */
/*
 * A rank file read through its pickle and by a template (include/ckfs/
 * torch.h, ckfs_torch_open with .like) compared: the one property the template
 * must keep. Shared by test_torch_like and fuzz_like.
 */
#ifndef CKFS_LIKE_DIFF_H
#define CKFS_LIKE_DIFF_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "ckfs/torch.h"

#define LIKE_SAME(cond, ...) \
	do { if (!(cond)) { snprintf(why, size, __VA_ARGS__); return false; } } while (0)

static inline bool like_same_view(const struct ckfs_tensor_view *a,
				  const struct ckfs_tensor_view *b, char *why, size_t size)
{
	size_t nd = a->ndim > 0 ? (size_t)a->ndim : 0;

	LIKE_SAME(a->dtype == b->dtype && a->ndim == b->ndim, "dtype or ndim");
	LIKE_SAME(memcmp(a->shape, b->shape, sizeof(a->shape[0]) * nd) == 0 &&
		  memcmp(a->stride, b->stride, sizeof(a->stride[0]) * nd) == 0, "shape or stride");
	LIKE_SAME(a->storage_offset == b->storage_offset && a->neg == b->neg, "offset or neg");
	LIKE_SAME(a->storage_pos == b->storage_pos && a->storage_bytes == b->storage_bytes,
		  "storage position or size");
	LIKE_SAME(strcmp(a->storage_key ? a->storage_key : "", b->storage_key ? b->storage_key : "") == 0,
		  "storage key");
	LIKE_SAME((!a->storage_entry && !b->storage_entry) ||
		  (a->storage_entry && b->storage_entry &&
		   a->storage_entry->data_offset == b->storage_entry->data_offset &&
		   a->storage_entry->derived == b->storage_entry->derived &&
		   strcmp(a->storage_entry->name, b->storage_entry->name) == 0), "storage record");
	return true;
}

static inline bool like_same_dtensor(const struct ckfs_dtensor_info *a,
				     const struct ckfs_dtensor_info *b, char *why, size_t size)
{
	size_t nd = (size_t)a->ndim, md = (size_t)a->mesh_ndim;

	LIKE_SAME(a->ndim == b->ndim && a->mesh_ndim == b->mesh_ndim, "ndim or mesh ndim");
	LIKE_SAME(memcmp(a->global_shape, b->global_shape, sizeof(int64_t) * nd) == 0, "global shape");
	LIKE_SAME(memcmp(a->mesh_shape, b->mesh_shape, sizeof(int64_t) * md) == 0, "mesh shape");
	for (size_t i = 0; i < md; i++)
		LIKE_SAME(strcmp(a->mesh_dim_names[i] ? a->mesh_dim_names[i] : "-",
				 b->mesh_dim_names[i] ? b->mesh_dim_names[i] : "-") == 0, "mesh dim names");
	LIKE_SAME(a->have_coord == b->have_coord &&
		  (!a->have_coord || memcmp(a->coord, b->coord, sizeof(int64_t) * md) == 0),
		  "mesh coordinate");
	LIKE_SAME(memcmp(a->placements, b->placements, sizeof(a->placements[0]) * md) == 0,
		  "placements");
	LIKE_SAME(a->have_mesh_tensor == b->have_mesh_tensor, "mesh tensor");
	return !a->have_mesh_tensor || like_same_view(&a->mesh_tensor, &b->mesh_tensor, why, size);
}

/*
 * The file at f read through its pickle and with like and coord: false,
 * with why, when the two differ (result, message, or any entry); *taken
 * says whether the template was used.
 */
static inline bool like_agrees(struct ckfs_file f, const char *label,
			       const struct ckfs_torch_like *like, const int64_t *coord,
			       bool *taken, char *why, size_t size)
{
	struct ckfs_torch_file a, b;
	struct ckfs_error ea, eb;
	bool same = true;

	*taken = false;
	ckfs_error_clear(&ea);
	ckfs_error_clear(&eb);
	const struct ckfs_torch_open_opts oa = { .label = label, .derive_locals = true };
	const struct ckfs_torch_open_opts ob = { .label = label, .derive_locals = true,
						 .like = like, .coord = coord };
	enum ckfs_code ra = ckfs_torch_open(&a, f, &oa, &ea);
	enum ckfs_code rb = ckfs_torch_open(&b, f, &ob, &eb);
	if (ra != CKFS_OK || rb != CKFS_OK) {
		if (ra != rb || strcmp(ea.msg, eb.msg) != 0) {
			snprintf(why, size, "pickle: %d '%s'; template: %d '%s'", ra, ea.msg, rb, eb.msg);
			same = false;
		}
		goto out;
	}
	*taken = b.from_like;
	if (a.n_entries != b.n_entries || a.writer_lo != b.writer_lo || a.writer_hi != b.writer_hi) {
		snprintf(why, size, "entry count or writer release");
		same = false;
	}
	for (size_t i = 0; same && i < a.n_entries; i++) {
		struct ckfs_sd_entry scratch;
		const struct ckfs_sd_entry *x = &a.entries[i], *y = ckfs_torch_entry(&b, i, &scratch);
		same = strcmp(x->key, y->key) == 0 && x->kind == y->kind;
		if (!same)
			snprintf(why, size, "entry %zu: key or kind", i);
		else
			same = like_same_view(&x->local, &y->local, why, size) &&
			       (x->kind != CKFS_ENTRY_DTENSOR ||
				like_same_dtensor(x->dtensor, y->dtensor, why, size));
	}
out:
	if (ra == CKFS_OK)
		ckfs_torch_close(&a);
	if (rb == CKFS_OK)
		ckfs_torch_close(&b);
	return same;
}

#undef LIKE_SAME
#endif
