/* SPDX-License-Identifier: MIT */
/*
 * What the compressed-tensors views (view_w4a16.c, view_nvfp4.c) share:
 * a weight's groups read as bf16, its group scales kept from a read of
 * the packed values for the read of the scales that follows it in the
 * file (so a reader in file order reads the weight once for both: within
 * a budget per model, CKFS_CT_KEPT_BYTES, a weight's freed once all its
 * scales were served; a scale not kept is computed again from the
 * weight), max |w| on the bits, the config's common keys, the release.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/dtype.h"
#include "ckfs/model.h"

static uint64_t n_groups(const struct ckfs_ct_weight *w)
{
	return w->weight.numel / w->scheme->group;
}

/* The bytes of one scale. */
static size_t scale_size(const struct ckfs_ct_weight *w)
{
	return ckfs_dtype_size(w->scheme->parts[w->scheme->scale_part].dtype);
}

/* Take (sign 1) or give back (-1) bytes of the model's budget: 0 when
 * they do not fit. */
static int budget(struct ckfs_ct_kept *k, uint64_t bytes, int sign)
{
	int ok = 1;

	pthread_mutex_lock(&k->lock);
	if (sign < 0)
		k->bytes -= bytes;
	else if ((ok = k->bytes + bytes <= CKFS_CT_KEPT_BYTES))
		k->bytes += bytes;
	pthread_mutex_unlock(&k->lock);
	return ok;
}

static void drop(struct ckfs_ct_weight *w)
{
	size_t size = scale_size(w);

	free(w->scales);
	free(w->known);
	w->scales = NULL;
	w->known = NULL;
	w->served = 0;
	budget(w->kept, n_groups(w) * (size + 1), -1);
}

void ckfs_ct_keep(struct ckfs_ct_weight *w, uint64_t g, uint64_t n, const void *sc)
{
	uint64_t total = n_groups(w);
	size_t size = scale_size(w);

	pthread_mutex_lock(&w->lock);
	if (!w->scales && budget(w->kept, total * (size + 1), 1)) {
		w->scales = malloc((size_t)total * size);
		w->known = calloc((size_t)total, 1);
		if (!w->scales || !w->known)
			drop(w);
	}
	if (w->scales) {
		memcpy(w->scales + g * size, sc, (size_t)n * size);
		memset(w->known + g, 1, (size_t)n);
	}
	pthread_mutex_unlock(&w->lock);
}

int ckfs_ct_take(struct ckfs_ct_weight *w, uint64_t first, uint64_t count, void *dst)
{
	size_t size = scale_size(w);
	int all = 0;

	pthread_mutex_lock(&w->lock);
	if (w->scales && (all = memchr(w->known + first, 0, (size_t)count) == NULL)) {
		memcpy(dst, w->scales + first * size, (size_t)count * size);
		/* every scale served: a read again computes them again */
		if ((w->served += count) >= n_groups(w))
			drop(w);
	}
	pthread_mutex_unlock(&w->lock);
	return all;
}

void ckfs_ct_release(struct ckfs_model *m)
{
	struct ckfs_ct_set *set = m->view_state;

	for (size_t i = 0; i < set->n; i++) {
		free(set->weights[i].scales);
		free(set->weights[i].known);
		pthread_mutex_destroy(&set->weights[i].lock);
	}
	if (set->kept)
		pthread_mutex_destroy(&set->kept->lock);
}

enum ckfs_code ckfs_ct_read_groups(const struct ckfs_model *m, const struct ckfs_ct_weight *w,
				   uint64_t g, uint64_t n, const uint16_t **out,
				   struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	uint64_t group = w->scheme->group;
	uint16_t *buf = ckfs_view_scratch(scratch, (size_t)(n * group) * sizeof(uint16_t));

	if (!buf)
		return ckfs_nomem(err);
	*out = buf;
	return ckfs_tensor_read(m, &w->weight, g * group, n * group, buf, scratch, err);
}

size_t ckfs_ct_inputs(const struct ckfs_tensor *t, const struct ckfs_tensor *in[2])
{
	const struct ckfs_ct_weight *w = t->view_state;

	in[0] = &w->weight;
	return 1;
}

enum ckfs_code ckfs_ct_config(const struct ckfs_model *m, const char *head,
			      struct ckfs_view_config *c, struct ckfs_error *err)
{
	/* after "ignore", as compressed-tensors 0.20.1's update_config writes
	 * it (keys sorted, null fields kept) */
	static const char tail[] =
		"], \"kv_cache_scheme\": null, \"moe_sparsity_config\": null, "
		"\"quant_method\": \"compressed-tensors\", \"quantization_status\": "
		"\"compressed\", \"sparsity_config\": {}, \"transform_config\": {}, "
		"\"version\": \"0.20.1\"}";
	const struct ckfs_ct_set *set = m->view_state;

	return ckfs_view_quantization(c, head, set->ignore, set->n_ignore, tail, err);
}

/* On the bits: |w| orders as its magnitude bits do, NaNs above Inf.
 * Vectorised: with the quantizing, most of the views' cost. */
CKFS_VECTOR_CLONES
float ckfs_ct_amax(const uint16_t *restrict w, size_t n)
{
	uint32_t m = 0, nan = 0;

	for (size_t k = 0; k < n; k++) {
		uint32_t a = w[k] & 0x7FFFu;
		nan |= a > 0x7F80u;
		m = a > m ? a : m;
	}
	if (nan)
		return __builtin_nanf("");
	uint32_t u = m << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}
