/* SPDX-License-Identifier: MIT */
/*
 * --dtype fp8: which weights are served as block-wise FP8, in the format
 * vLLM, SGLang and transformers load natively (DeepSeek-V3's and Qwen3's FP8
 * releases; docs/formats.md "FP8"). A weight is quantized when it is
 *
 *  - 2-D, named <module>.weight, of a linear layer by its module's name
 *    (the attention, MLP and expert projections of `projections[]`), and
 *  - not matched by the skip pattern: `--quant-skip REGEX` (POSIX extended,
 *    against the served name), by default the vision tower and the
 *    multimodal projector.
 *
 * It is then served as F8_E4M3 with `<name>_scale_inv` beside it (F32, one
 * per 128 x 128 block; src/model/view_fp8.c computes both on read). Everything
 * else is served as bf16 (ckfs_model_open's dtype rule): embeddings, norms, biases, lm_head, MoE routers,
 * the skipped layers. Every other matrix's module is listed for config.json
 * (quantization_config.modules_to_not_convert, under the names transformers
 * holds them by), with lm_head always, so a loader converts exactly the
 * layers that have scales.
 *
 * A checkpoint that is already block-quantized (F8 tensors with
 * `*_scale_inv` or `*weight_scale` companions) is fp8_release.c's: served
 * as stored, or DeepSeek's block FP8 dequantized to a float dtype; never
 * its values cast without their scales.
 */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/layouts.h"

/* The linear layers' last module names. */
static const char *const projections[] = {
	"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "gate_proj", "up_proj",
	"down_proj", "gate_up_proj", "w1", "w2", "w3", "q_a_proj", "q_b_proj",
	"kv_a_proj_with_mqa", "kv_b_proj", "dense", "fc1", "fc2", "out_proj", "qkv", "proj",
	"linear_fc1", "linear_fc2", "c_attn", "c_proj", "c_fc", "query_key_value",
	"dense_h_to_4h", "dense_4h_to_h",
};

const char ckfs_quant_default_skip[] =
	"(^|\\.)(visual|vision_tower|vision_model|multi_modal_projector|audio_tower)\\.";

/* The module of a weight: its name less the last component, into out. */
static const char *module_of(const char *name, char *out, size_t cap)
{
	const char *dot = strrchr(name, '.');
	snprintf(out, cap, "%.*s", dot ? (int)(dot - name) : (int)strlen(name), name);
	return out;
}

static int is_projection(const char *name)
{
	char mod[1024];
	const char *last;

	if (!ckfs_ends_with(name, ".weight"))
		return 0;
	module_of(name, mod, sizeof(mod));
	last = strrchr(mod, '.') ? strrchr(mod, '.') + 1 : mod;
	for (size_t i = 0; i < sizeof(projections) / sizeof(projections[0]); i++)
		if (strcmp(last, projections[i]) == 0)
			return 1;
	return 0;
}

int ckfs_quant_linear(const struct ckfs_tensor *t, const regex_t *skip)
{
	return t->ndim == 2 && t->shape[0] > 0 && t->shape[1] > 0 &&
	       ckfs_dtype_is_float(t->stored_dtype) && t->stored_dtype != CKFS_DTYPE_F8_E4M3 &&
	       t->stored_dtype != CKFS_DTYPE_F8_E5M2 && is_projection(t->name) &&
	       regexec(skip, t->name, 0, NULL, 0) != 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The modules of the matrices left unquantized, as transformers holds
 * them, sorted, once each; lm_head always. */
static enum ckfs_code list_unconverted(struct ckfs_model *m, struct ckfs_error *err)
{
	const char **v = ckfs_arena_calloc(&m->arena, m->n_tensors + 2, sizeof(*v));
	char mod[1024], mem[1024];
	size_t n = 0;

	if (!v)
		return ckfs_nomem(err);
	v[n++] = "lm_head";
	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct ckfs_tensor *t = &m->tensors[i];
		if (t->view == &ckfs_view_fp8 || t->ndim < 2 ||
		    (!ckfs_ends_with(t->name, ".weight") && !ckfs_ends_with(t->name, "_proj")))
			continue;
		module_of(t->name, mod, sizeof(mod));
		CKFS_TRY(ckfs_hf_memory_name(m, mod, mem, sizeof(mem), err));
		if (strcmp(mem, "lm_head") != 0 && !(v[n++] = ckfs_arena_strdup(&m->arena, mem)))
			return ckfs_nomem(err);
	}
	qsort(v, n, sizeof(*v), cmp_str);
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (!k || strcmp(v[k - 1], v[i]) != 0)
			v[k++] = v[i];
	struct ckfs_fp8_set *set = m->view_state;
	set->unconverted = v;
	set->n_unconverted = k;
	return CKFS_OK;
}

/* t's quantization: t served as F8_E4M3, and its scale tensor into *s. */
static enum ckfs_code quantize(struct ckfs_model *m, struct ckfs_tensor *t, struct ckfs_fp8 *q,
			       struct ckfs_tensor *s, struct ckfs_error *err)
{
	q->rows = t->shape[0];
	q->cols = t->shape[1];
	q->block_rows = (q->rows + CKFS_FP8_BLOCK - 1) / CKFS_FP8_BLOCK;
	q->block_cols = (q->cols + CKFS_FP8_BLOCK - 1) / CKFS_FP8_BLOCK;
	q->scales = ckfs_arena_calloc(&m->arena, (size_t)(q->block_rows * q->block_cols),
				      sizeof(float));
	q->ready = ckfs_arena_calloc(&m->arena, (size_t)q->block_rows, 1);
	memset(s, 0, sizeof(*s));
	s->name = ckfs_arena_printf(&m->arena, "%s_scale_inv", t->name);
	if (!q->scales || !q->ready || !s->name)
		return ckfs_nomem(err);
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->done, NULL);
	q->weight = *t;
	t->out_dtype = CKFS_DTYPE_F8_E4M3;
	t->view = &ckfs_view_fp8;
	t->view_state = q;
	t->view_part = 0;
	s->stored_dtype = s->out_dtype = CKFS_DTYPE_F32;
	s->ndim = 2;
	s->shape[0] = q->block_rows;
	s->shape[1] = q->block_cols;
	s->numel = (uint64_t)(q->block_rows * q->block_cols);
	s->placement = "fp8 scales";
	s->view = &ckfs_view_fp8;
	s->view_state = q;
	s->view_part = CKFS_FP8_SCALES;
	return CKFS_OK;
}

static enum ckfs_code select_weights(struct ckfs_model *m, const regex_t *skip,
				     struct ckfs_error *err)
{
	size_t n_q = 0, k = 0, n = m->n_tensors;

	for (size_t i = 0; i < n; i++)
		n_q += ckfs_quant_linear(&m->tensors[i], skip);
	if (n_q == 0)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': --dtype fp8 found no linear "
				 "weight to quantize (docs/formats.md, \"FP8\")", m->src_dir);
	struct ckfs_tensor *ts = ckfs_arena_calloc(&m->arena, n + n_q + 1, sizeof(*ts));
	struct ckfs_fp8_set *set = ckfs_arena_calloc(&m->arena, 1, sizeof(*set));
	if (!ts || !set ||
	    !(set->weights = ckfs_arena_calloc(&m->arena, n_q, sizeof(*set->weights))) ||
	    !(set->kept = ckfs_arena_calloc(&m->arena, 1, sizeof(*set->kept))))
		return ckfs_nomem(err);
	pthread_mutex_init(&set->kept->lock, NULL);
	m->view = &ckfs_view_fp8;
	m->view_state = set;
	/* Each weight's scales right after it, in the same shard: a loader
	 * reading a shard's weights then their scales reads each source once. */
	for (size_t i = 0; i < n; i++) {
		struct ckfs_tensor *t = &ts[k++];
		*t = m->tensors[i];
		if (!ckfs_quant_linear(t, skip))
			continue;
		struct ckfs_fp8 *q = &set->weights[set->n++];
		q->kept = set->kept;
		CKFS_TRY(quantize(m, t, q, &ts[k++], err));
	}
	m->tensors = ts;
	m->n_tensors = k;
	return list_unconverted(m, err);
}

enum ckfs_code ckfs_quant_skip(const struct ckfs_model_options *opt, regex_t *skip,
			       struct ckfs_error *err)
{
	const char *pattern = opt->quant_skip ? opt->quant_skip : ckfs_quant_default_skip;

	if (regcomp(skip, pattern, REG_EXTENDED | REG_NOSUB) != 0)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "--quant-skip: '%s' is not a regular "
				 "expression",
				 pattern);
	return CKFS_OK;
}

enum ckfs_code ckfs_fp8_select(struct ckfs_model *m, const struct ckfs_model_options *opt,
			       struct ckfs_error *err)
{
	regex_t skip;

	if (opt->quant != CKFS_QUANT_FP8)
		return CKFS_OK;
	CKFS_TRY(ckfs_quant_skip(opt, &skip, err));
	enum ckfs_code rc = select_weights(m, &skip, err);
	regfree(&skip);
	return rc;
}
