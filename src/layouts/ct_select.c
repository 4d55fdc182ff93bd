/* SPDX-License-Identifier: MIT */
/*
 * --dtype w4a16 and nvfp4: which weights are served as a compressed-tensors
 * scheme (the formats llm-compressor writes for its W4A16 and NVFP4A16
 * schemes and vLLM loads; docs/formats.md "W4A16", "NVFP4"). The weights
 * are those --dtype fp8 quantizes (ckfs_quant_linear: the linear
 * projections, not matched by the skip pattern); each `<module>.weight`
 * [rows, cols] is replaced by the scheme's tensors (struct ckfs_ct_scheme:
 * W4A16's weight_packed, weight_scale, weight_shape; NVFP4's
 * weight_global_scale, weight_packed, weight_scale), computed on read from
 * the weight (src/model/view_w4a16.c, view_nvfp4.c). Everything else is
 * bf16 (ckfs_model_open's dtype rule). The 2-D weights of other modules,
 * embeddings aside, and lm_head always are listed as the config's
 * "ignore" under their served names, as compressed-tensors maps its ignore
 * list to checkpoint names: a loader then expects scales exactly where
 * they are. A weight whose input dim is not a multiple of the scheme's
 * group is refused, as the library's quantize refuses it.
 */
#include <regex.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/layouts.h"

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The module of a served tensor name, in m's arena. */
static const char *module_of(struct ckfs_model *m, const char *name)
{
	const char *dot = strrchr(name, '.');
	return ckfs_arena_printf(&m->arena, "%.*s", dot ? (int)(dot - name) : (int)strlen(name),
				 name);
}

/* Embeddings are not Linear modules: left out of the ignore list. */
static int is_embedding(const char *module)
{
	const char *last = strrchr(module, '.') ? strrchr(module, '.') + 1 : module;
	return strstr(last, "embed") != NULL || strcmp(last, "wte") == 0 ||
	       strcmp(last, "wpe") == 0;
}

/* lm_head and the modules of the other 2-D weights left bf16, sorted, once
 * each. */
static enum ckfs_code list_ignored(struct ckfs_model *m, struct ckfs_error *err)
{
	const char **v = ckfs_arena_calloc(&m->arena, m->n_tensors + 2, sizeof(*v));
	size_t n = 0, k = 0;

	if (!v)
		return ckfs_nomem(err);
	v[n++] = "lm_head";
	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct ckfs_tensor *t = &m->tensors[i];
		if (t->view == m->view || t->ndim != 2 || !ckfs_ends_with(t->name, ".weight"))
			continue;
		const char *mod = module_of(m, t->name);
		if (!mod)
			return ckfs_nomem(err);
		if (!is_embedding(mod))
			v[n++] = mod;
	}
	qsort(v, n, sizeof(*v), cmp_str);
	for (size_t i = 0; i < n; i++)
		if (!k || strcmp(v[k - 1], v[i]) != 0)
			v[k++] = v[i];
	struct ckfs_ct_set *set = m->view_state;
	set->ignore = v;
	set->n_ignore = k;
	return CKFS_OK;
}

/* Part `which` of w's scheme: name <module>.<suffix>. */
static enum ckfs_code part(struct ckfs_model *m, struct ckfs_ct_weight *w, uint32_t which,
			   struct ckfs_tensor *out, struct ckfs_error *err)
{
	const struct ckfs_ct_part *p = &w->scheme->parts[which];
	const char *mod = module_of(m, w->weight.name);

	memset(out, 0, sizeof(*out));
	if (!mod || !(out->name = ckfs_arena_printf(&m->arena, "%s.%s", mod, p->suffix)))
		return ckfs_nomem(err);
	out->stored_dtype = out->out_dtype = p->dtype;
	out->ndim = p->per ? 2 : 1;
	out->shape[0] = p->per ? w->weight.shape[0] : p->len;
	out->shape[1] = p->per ? w->weight.shape[1] / p->per : 0;
	out->numel = (uint64_t)out->shape[0] * (uint64_t)(p->per ? out->shape[1] : 1);
	out->placement = w->scheme->word;
	out->view = m->view;
	out->view_state = w;
	out->view_part = (int)which;
	return CKFS_OK;
}

static enum ckfs_code select_weights(struct ckfs_model *m, const struct ckfs_view *view,
				     const regex_t *skip, struct ckfs_error *err)
{
	const struct ckfs_ct_scheme *sch = view->ct;
	size_t n_q = 0, k = 0, n = m->n_tensors;

	for (size_t i = 0; i < n; i++) {
		const struct ckfs_tensor *t = &m->tensors[i];
		if (!ckfs_quant_linear(t, skip))
			continue;
		if (t->shape[1] % sch->group != 0)
			return ckfs_fail(err, CKFS_E_UNSUPPORTED,
					 "'%s': --dtype %s quantizes "
					 "in groups of %u along the input dim, which %lld is not "
					 "a multiple of (serve it as --dtype bf16 or fp8, or "
					 "leave it out with --quant-skip)",
					 t->name, sch->word, sch->group, (long long)t->shape[1]);
		n_q++;
	}
	if (n_q == 0)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': --dtype %s found no linear "
				 "weight to quantize (docs/formats.md, \"Output: W4A16\", "
				 "\"Output: NVFP4\")",
				 m->src_dir, sch->word);
	struct ckfs_tensor *ts =
		ckfs_arena_calloc(&m->arena, n + (sch->n_parts - 1) * n_q + 1, sizeof(*ts));
	struct ckfs_ct_set *set = ckfs_arena_calloc(&m->arena, 1, sizeof(*set));
	if (!ts || !set ||
	    !(set->weights = ckfs_arena_calloc(&m->arena, n_q, sizeof(*set->weights))) ||
	    !(set->kept = ckfs_arena_calloc(&m->arena, 1, sizeof(*set->kept))))
		return ckfs_nomem(err);
	pthread_mutex_init(&set->kept->lock, NULL);
	m->view = view;
	m->view_state = set;
	/* The parts in the weight's place, in name order: a reader going by
	 * name reads each weight's source for its values, then its scales
	 * are kept (view_ct.c). */
	for (size_t i = 0; i < n; i++) {
		if (!ckfs_quant_linear(&m->tensors[i], skip)) {
			ts[k++] = m->tensors[i];
			continue;
		}
		struct ckfs_ct_weight *w = &set->weights[set->n++];
		pthread_mutex_init(&w->lock, NULL);
		w->kept = set->kept;
		w->scheme = sch;
		w->weight = m->tensors[i];
		w->weight.out_dtype = CKFS_DTYPE_BF16;
		for (uint32_t p = 0; p < sch->n_parts; p++)
			CKFS_TRY(part(m, w, p, &ts[k++], err));
	}
	m->tensors = ts;
	m->n_tensors = k;
	return list_ignored(m, err);
}

enum ckfs_code ckfs_ct_select(struct ckfs_model *m, const struct ckfs_model_options *opt,
			      struct ckfs_error *err)
{
	static const struct ckfs_view *const views[] = {
		[CKFS_QUANT_W4A16] = &ckfs_view_w4a16,
		[CKFS_QUANT_NVFP4] = &ckfs_view_nvfp4,
	};
	regex_t skip;

	if (opt->quant >= sizeof(views) / sizeof(views[0]) || !views[opt->quant])
		return CKFS_OK;
	CKFS_TRY(ckfs_quant_skip(opt, &skip, err));
	enum ckfs_code rc = select_weights(m, views[opt->quant], &skip, err);
	regfree(&skip);
	return rc;
}
