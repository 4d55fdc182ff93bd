/* SPDX-License-Identifier: MIT */
/*
 * A checkpoint already block-quantized to FP8, as DeepSeek-V3/R1 and
 * Kimi-K2 are released (and transformers' FineGrainedFP8 saves): each
 * quantized linear weight `X.weight` is F8_E4M3 [rows, cols] beside
 * `X.weight_scale_inv` F32 [ceil(rows / 128), ceil(cols / 128)], one scale
 * per 128 x 128 block; everything else is as trained (bf16 norms,
 * embeddings, routers).
 *
 *  - --dtype not given (or auto): served as stored, scales and all, as
 *    vLLM and SGLang load it;
 *  - --dtype bf16, fp16 or fp32: each such weight dequantized on read
 *    (src/model/view_fp8_dequant.c: what DeepSeek's fp8_cast_bf16.py writes),
 *    its scale not served, quantization_config dropped from config.json;
 *  - --dtype fp8, w4a16 or nvfp4: refused (quantizing quantized values again).
 *
 * Fail closed: an F8 tensor without its scale, a scale without its F8
 * weight, a scale grid of another shape, and other FP8 forms (F8_E5M2,
 * compressed-tensors' weight_scale, static activation scales, any other
 * "_scale_inv") are refused
 * with any dtype but the stored one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/layouts.h"

static int cmp_name(const void *a, const void *b)
{
	return strcmp((*(const struct ckfs_tensor *const *)a)->name,
		      (*(const struct ckfs_tensor *const *)b)->name);
}

static struct ckfs_tensor *find(struct ckfs_tensor **sorted, size_t n, const char *name)
{
	struct ckfs_tensor key = { .name = name }, *k = &key, **hit;

	hit = bsearch(&k, sorted, n, sizeof(*sorted), cmp_name);
	return hit ? *hit : NULL;
}

static int is_scale(const char *name)
{
	return ckfs_ends_with(name, ".weight_scale_inv");
}

/* Another FP8 form than DeepSeek's blocks: its name, or NULL. Any other
 * "_scale_inv" (a k/v cache scale, say) counts: cast as a plain tensor it
 * would be served as if it were a weight. */
static const char *other_form(const struct ckfs_model *m)
{
	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct ckfs_tensor *t = &m->tensors[i];
		if (t->stored_dtype == CKFS_DTYPE_F8_E5M2 || ckfs_ends_with(t->name, ".weight_scale") ||
		    ckfs_ends_with(t->name, ".input_scale") ||
		    ckfs_ends_with(t->name, ".activation_scale") ||
		    (ckfs_ends_with(t->name, "_scale_inv") && !is_scale(t->name)))
			return t->name;
	}
	return NULL;
}

/* Pair every F8 weight with its scale grid; the scales leave the tensors. */
static enum ckfs_code pair_scales(struct ckfs_model *m, struct ckfs_error *err)
{
	struct ckfs_tensor **sorted = calloc(m->n_tensors + 1, sizeof(*sorted));
	struct ckfs_fp8_dequant_set *set = ckfs_arena_calloc(&m->arena, 1, sizeof(*set));
	enum ckfs_code rc = CKFS_OK;
	char name[CKFS_MAX_NAME];
	size_t n_out = 0;

	if (!sorted || !set) {
		free(sorted);
		return ckfs_nomem(err);
	}
	m->view = &ckfs_view_fp8_dequant;
	m->view_state = set;
	for (size_t i = 0; i < m->n_tensors; i++)
		sorted[i] = &m->tensors[i];
	qsort(sorted, m->n_tensors, sizeof(*sorted), cmp_name);
	for (size_t i = 0; i < m->n_tensors && rc == CKFS_OK; i++) {
		struct ckfs_tensor *t = &m->tensors[i];
		if (is_scale(t->name)) {
			snprintf(name, sizeof(name), "%.*s", (int)(strlen(t->name) - 10), t->name);
			const struct ckfs_tensor *w = find(sorted, m->n_tensors, name);
			if (!w || w->stored_dtype != CKFS_DTYPE_F8_E4M3)
				rc = ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' scales no "
					       "F8_E4M3 weight '%s'", m->src_dir, t->name, name);
			continue;
		}
		if (t->stored_dtype != CKFS_DTYPE_F8_E4M3)
			continue;
		snprintf(name, sizeof(name), "%s_scale_inv", t->name);
		const struct ckfs_tensor *s = find(sorted, m->n_tensors, name);
		int64_t br = t->ndim == 2 ? (t->shape[0] + CKFS_FP8_BLOCK - 1) / CKFS_FP8_BLOCK : 0;
		int64_t bc = t->ndim == 2 ? (t->shape[1] + CKFS_FP8_BLOCK - 1) / CKFS_FP8_BLOCK : 0;
		if (!s || t->ndim != 2 || s->ndim != 2 || s->stored_dtype != CKFS_DTYPE_F32 ||
		    s->shape[0] != br || s->shape[1] != bc)
			rc = ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' is F8_E4M3 without "
				       "block scales '%s' F32 [%lld, %lld] (one per %d x %d block) "
				       "beside it", m->src_dir, t->name, name, (long long)br,
				       (long long)bc, CKFS_FP8_BLOCK, CKFS_FP8_BLOCK);
		else {
			struct ckfs_tensor *copy = ckfs_arena_alloc(&m->arena, sizeof(*copy));
			if (!copy) {
				rc = ckfs_nomem(err);
				break;
			}
			*copy = *s; /* m->tensors is compacted below */
			t->view = &ckfs_view_fp8_dequant;
			t->view_state = copy;
			set->n++;
		}
	}
	free(sorted);
	if (rc != CKFS_OK)
		return rc;
	for (size_t i = 0; i < m->n_tensors; i++)
		if (!is_scale(m->tensors[i].name))
			m->tensors[n_out++] = m->tensors[i];
	m->n_tensors = n_out;
	return CKFS_OK;
}

/* Already block-quantized: F8 values beside their scales. */
static const char *quantized_scale(const struct ckfs_model *m)
{
	int f8 = 0;
	const char *scale = NULL;

	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct ckfs_tensor *t = &m->tensors[i];
		f8 |= t->stored_dtype == CKFS_DTYPE_F8_E4M3 ||
		      t->stored_dtype == CKFS_DTYPE_F8_E5M2;
		if (!scale && (ckfs_ends_with(t->name, "_scale_inv") ||
			       ckfs_ends_with(t->name, "weight_scale")))
			scale = t->name;
	}
	return f8 ? scale : NULL;
}

enum ckfs_code ckfs_prequantized_pass(struct ckfs_model *m, const struct ckfs_model_options *opt,
				      struct ckfs_error *err)
{
	const char *scale = quantized_scale(m), *other;

	if (!scale || opt->as_stored)
		return CKFS_OK;
	if (opt->dtype_is_default) {
		/* not asked for a dtype: as stored, as --dtype auto */
		for (size_t i = 0; i < m->n_tensors; i++)
			m->tensors[i].out_dtype = m->tensors[i].stored_dtype;
		return CKFS_OK;
	}
	if ((other = other_form(m)))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': already quantized, and '%s' is "
				 "not of DeepSeek's block FP8 (F8_E4M3 with weight_scale_inv): "
				 "serve it as stored (--dtype auto)", m->src_dir, other);
	if (opt->quant != CKFS_QUANT_NONE ||
	    (opt->out_dtype != CKFS_DTYPE_BF16 && opt->out_dtype != CKFS_DTYPE_F16 &&
	     opt->out_dtype != CKFS_DTYPE_F32))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': already quantized ('%s' holds "
				 "block scales): serve it as stored (--dtype auto) or "
				 "dequantized (--dtype bf16, fp16 or fp32)", m->src_dir, scale);
	return pair_scales(m, err);
}
