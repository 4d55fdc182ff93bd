/* SPDX-License-Identifier: MIT */
/*
 * LoRA actors (PEFT). An FSDP actor trained with LoRA holds peft's names:
 * base_model.model.<module>.base_layer.weight for an adapted layer's base,
 * base_model.model.<name> for the other weights, and the adapter as
 * base_model.model.<module>.lora_A.default.weight [r, in] and
 * ...lora_B.default.weight [out, r]. verl 0.9.1's merger writes the base
 * weights under Hugging Face names and the adapter apart, in lora_adapter/
 * (docs/formats.md "LoRA actors"); this file splits the model the same way:
 *
 *  - every name holding "lora_" is an adapter tensor (verl's test), served
 *    with ".default.weight" made ".weight";
 *  - every other name loses "base_model.model.", and ".base_layer.weight"
 *    and ".base_layer.bias" become ".weight" and ".bias";
 *  - r, lora_alpha and task_type come from lora_train_meta.json as verl
 *    reads them (no file: r from the weights, lora_alpha 0, with verl's
 *    warning).
 *
 * What verl would write somewhere no loader looks is refused: DoRA
 * magnitudes, embedding LoRA, adapters not named "default", modules_to_save
 * copies, adapters of different ranks, an adapter that does not fit its
 * base weight, and lora_train_meta.json values that are not what verl
 * writes (or a rank the weights contradict).
 *
 * --lora=fuse gives each adapted weight its pair (the read path adds
 * scale * (B @ A), src/model/view_lora.c); --base supplies the base weights of a
 * checkpoint saved with save_lora_only.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/json.h"
#include "layouts/layouts.h"

static const char peft_prefix[] = "base_model.model.";
#define PEFT_PREFIX_LEN (sizeof(peft_prefix) - 1)

/* The adapter tensors of one module. */
struct module {
	const char *name;               /* <module>, PEFT prefix removed */
	const struct ckfs_tensor *ab[2];
};

struct split {
	struct ckfs_model *m;
	const struct ckfs_model_options *opt;
	struct ckfs_lora *lora;
	struct module *modules;
	size_t n_modules;
};

/* s with every `from` replaced by `to` (as Python's str.replace), in m's
 * arena; NULL when out of memory. */
static char *replace_all(struct ckfs_model *m, const char *s, const char *from, const char *to)
{
	size_t fl = strlen(from), tl = strlen(to), n = 0;
	char *out = ckfs_arena_alloc(&m->arena, strlen(s) * (tl > fl ? tl : 1) + 1);

	if (!out)
		return NULL;
	for (const char *p = s; *p;) {
		if (strncmp(p, from, fl) == 0) {
			memcpy(out + n, to, tl);
			n += tl;
			p += fl;
		} else {
			out[n++] = *p++;
		}
	}
	out[n] = '\0';
	return out;
}

int ckfs_peft_names(const struct ckfs_model *m)
{
	for (size_t i = 0; i < m->n_tensors; i++)
		if (ckfs_starts_with(m->tensors[i].name, peft_prefix) ||
		    strstr(m->tensors[i].name, "lora_"))
			return 1;
	return 0;
}

/* An adapter tensor: base_model.model.<module>.lora_{A,B}.default.weight,
 * nothing else. */
static enum ckfs_code add_adapter(struct split *s, struct ckfs_tensor *t,
				  struct ckfs_error *err)
{
	static const char *const tails[2] = { ".lora_A.default.weight", ".lora_B.default.weight" };
	const char *name = t->name;
	int which = ckfs_ends_with(name, tails[0]) ? 0 : ckfs_ends_with(name, tails[1]) ? 1 : -1;

	if (which < 0 || !ckfs_starts_with(name, peft_prefix) ||
	    strlen(name) <= PEFT_PREFIX_LEN + strlen(tails[which]))
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' is a LoRA tensor ckfs "
				 "does not read: only lora_A and lora_B weights of the "
				 "adapter named default are (no DoRA, embedding LoRA or "
				 "second adapter)", s->m->src_dir, name);
	if (t->ndim != 2)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': LoRA tensor '%s' has %d dims, "
				 "not 2", s->m->src_dir, name, t->ndim);
	struct module *mod = &s->modules[s->n_modules++];
	mod->name = ckfs_arena_strndup(&s->m->arena, name + PEFT_PREFIX_LEN,
				       strlen(name) - PEFT_PREFIX_LEN - strlen(tails[which]));
	struct ckfs_tensor *a = &s->lora->tensors[s->lora->n_tensors++];
	*a = *t;
	a->name = replace_all(s->m, name, ".default.weight", ".weight");
	if (!mod->name || !a->name)
		return ckfs_nomem(err);
	mod->ab[which] = a;
	mod->ab[!which] = NULL;
	return CKFS_OK;
}

/* A base tensor under its Hugging Face name, as verl renames it. */
static enum ckfs_code rename_base(struct split *s, struct ckfs_tensor *t,
				  struct ckfs_error *err)
{
	static const char *const refused[] = { "base_layer", "original_module",
					       "modules_to_save", "base_model" };
	const char *name = t->name;

	if (!ckfs_starts_with(name, peft_prefix))
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' is outside the PEFT "
				 "model (base_model.model.) the other tensors are in",
				 s->m->src_dir, name);
	char *a = replace_all(s->m, name, peft_prefix, "");
	char *b = a ? replace_all(s->m, a, ".base_layer.weight", ".weight") : NULL;
	char *c = b ? replace_all(s->m, b, ".base_layer.bias", ".bias") : NULL;
	if (!c)
		return ckfs_nomem(err);
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
		if (ckfs_name_has_segment(c, refused[i]))
			return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' is a PEFT name "
					 "ckfs does not read (%s)", s->m->src_dir, name,
					 refused[i]);
	t->name = c;
	return CKFS_OK;
}

static int cmp_module(const void *a, const void *b)
{
	const struct module *x = a, *y = b;
	return strcmp(x->name, y->name);
}

/* Each module's A and B side by side, one rank for all. */
static enum ckfs_code pair_modules(struct split *s, struct ckfs_error *err)
{
	size_t n = 0;

	qsort(s->modules, s->n_modules, sizeof(*s->modules), cmp_module);
	for (size_t i = 0; i < s->n_modules; i++) {
		struct module *mod = &s->modules[i];
		if (n && strcmp(s->modules[n - 1].name, mod->name) == 0) {
			int w = mod->ab[0] ? 0 : 1;
			s->modules[n - 1].ab[w] = mod->ab[w];
			continue;
		}
		s->modules[n++] = *mod;
	}
	s->n_modules = n;
	for (size_t i = 0; i < n; i++) {
		const struct module *mod = &s->modules[i];
		if (!mod->ab[0] || !mod->ab[1])
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': module '%s' has lora_%s "
					 "but no lora_%s", s->m->src_dir, mod->name,
					 mod->ab[0] ? "A" : "B", mod->ab[0] ? "B" : "A");
		int64_t r = mod->ab[0]->shape[0];
		if (mod->ab[1]->shape[1] != r || r < 1)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': module '%s': lora_A "
					 "[%lld, %lld] and lora_B [%lld, %lld] do not share a rank",
					 s->m->src_dir, mod->name, (long long)r,
					 (long long)mod->ab[0]->shape[1],
					 (long long)mod->ab[1]->shape[0],
					 (long long)mod->ab[1]->shape[1]);
		if (i && r != s->lora->r)
			return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': adapters of different "
					 "ranks ('%s' %lld, '%s' %lld): adapter_config.json has "
					 "one r", s->m->src_dir, s->modules[0].name,
					 (long long)s->lora->r, mod->name, (long long)r);
		s->lora->r = r;
	}
	return CKFS_OK;
}

/* target_modules: each module's last name, once, sorted (verl lists a
 * Python set, in no fixed order). */
static enum ckfs_code target_modules(struct split *s, struct ckfs_error *err)
{
	struct ckfs_lora *l = s->lora;

	l->target_modules = ckfs_arena_calloc(&s->m->arena, s->n_modules + 1,
					      sizeof(*l->target_modules));
	if (!l->target_modules)
		return ckfs_nomem(err);
	for (size_t i = 0; i < s->n_modules; i++) {
		const char *dot = strrchr(s->modules[i].name, '.');
		const char *last = dot ? dot + 1 : s->modules[i].name;
		size_t k = 0;
		while (k < l->n_target_modules && strcmp(l->target_modules[k], last) < 0)
			k++;
		if (k < l->n_target_modules && strcmp(l->target_modules[k], last) == 0)
			continue;
		memmove(&l->target_modules[k + 1], &l->target_modules[k],
			(l->n_target_modules - k) * sizeof(*l->target_modules));
		l->target_modules[k] = last;
		l->n_target_modules++;
	}
	return CKFS_OK;
}

/* lora_train_meta.json as verl writes it: r and lora_alpha whole numbers,
 * task_type a string or null; other keys are not read. */
static enum ckfs_code read_meta(struct split *s, struct ckfs_error *err)
{
	struct ckfs_model *m = s->m;
	struct ckfs_lora *l = s->lora;
	char *path = ckfs_arena_printf(&m->arena, "%s/lora_train_meta.json", m->src_dir);
	char *text;
	size_t len;
	cJSON *j;
	int64_t v;

	if (!path)
		return ckfs_nomem(err);
	if (!ckfs_path_exists(path))
		return ckfs_model_warn(m, err, "no lora_train_meta.json: r %lld from the "
				       "adapter weights", (long long)l->r);
	CKFS_TRY(ckfs_model_read_meta(m, path, CKFS_MAX_JSON_BYTES, &text, &len, err));
	enum ckfs_code rc = ckfs_json_parse_object(path, text, len, &j, err);
	free(text);
	CKFS_TRY(rc);
	const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "r");
	const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha");
	const cJSON *task = cJSON_GetObjectItemCaseSensitive(j, "task_type");
	if (r && !ckfs_json_whole(r, INT32_MAX, &v))
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': r is not a whole number", path);
	else if (r && v > 0 && v != l->r)
		rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': r %lld does not match the rank of "
			       "the adapter weights, %lld", path, (long long)v, (long long)l->r);
	else if (alpha && !ckfs_json_whole(alpha, INT32_MAX, &l->alpha))
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': lora_alpha is not a whole number",
			       path);
	else if (task && !cJSON_IsString(task) && !cJSON_IsNull(task))
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': task_type is not a string", path);
	else if (cJSON_IsString(task) &&
		 !(l->task_type = ckfs_arena_strdup(&m->arena, task->valuestring)))
		rc = ckfs_nomem(err);
	cJSON_Delete(j);
	return rc;
}

/* What adapter_config.json says, and what fusing needs. */
static enum ckfs_code settle_config(struct split *s, struct ckfs_error *err)
{
	struct ckfs_model *m = s->m;
	struct ckfs_lora *l = s->lora;

	CKFS_TRY(read_meta(s, err));
	if (s->opt->lora_alpha) {
		if (l->alpha && l->alpha != s->opt->lora_alpha)
			CKFS_TRY(ckfs_model_warn(m, err, "lora_alpha %lld from --lora-alpha, not "
						 "%lld as lora_train_meta.json says",
						 (long long)s->opt->lora_alpha, (long long)l->alpha));
		l->alpha = s->opt->lora_alpha;
	}
	l->rslora = s->opt->rslora;
	if (l->alpha == 0 && l->mode == CKFS_LORA_FUSE)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': lora_alpha is not recorded "
				 "(lora_train_meta.json): --lora=fuse needs it; pass "
				 "--lora-alpha N as trained", m->src_dir);
	if (l->alpha == 0)
		CKFS_TRY(ckfs_model_warn(m, err, "lora_alpha is not recorded: 0 in "
					 "adapter_config.json, as verl writes it, and the adapter "
					 "does nothing until it is set (pass --lora-alpha N as "
					 "trained)"));
	return CKFS_OK;
}

/* Split m's tensors into the base (renamed) and the adapter. */
static enum ckfs_code split(struct split *s, struct ckfs_error *err)
{
	struct ckfs_model *m = s->m;
	size_t n_base = 0;

	s->lora = ckfs_arena_calloc(&m->arena, 1, sizeof(*s->lora));
	s->modules = calloc(m->n_tensors + 1, sizeof(*s->modules));
	if (!s->lora || !s->modules)
		return ckfs_nomem(err);
	s->lora->mode = s->opt->lora;
	s->lora->tensors = ckfs_arena_calloc(&m->arena, m->n_tensors + 1,
					     sizeof(*s->lora->tensors));
	if (!s->lora->tensors)
		return ckfs_nomem(err);
	for (size_t i = 0; i < m->n_tensors; i++) {
		struct ckfs_tensor *t = &m->tensors[i];
		if (strstr(t->name, "lora_")) {
			CKFS_TRY(add_adapter(s, t, err));
			continue;
		}
		CKFS_TRY(rename_base(s, t, err));
		m->tensors[n_base++] = *t;
	}
	m->n_tensors = n_base;
	if (s->n_modules == 0)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': PEFT names but no LoRA adapter",
				 m->src_dir);
	s->lora->only = n_base == 0;
	CKFS_TRY(pair_modules(s, err));
	CKFS_TRY(target_modules(s, err));
	return settle_config(s, err);
}

/* The pairs, in module order, for the base weights to find by name. */
static enum ckfs_code make_pairs(struct split *s, struct ckfs_error *err)
{
	struct ckfs_lora *l = s->lora;
	double r = (double)l->r, scale = l->rslora ? (double)l->alpha / sqrt(r)
						   : (double)l->alpha / r;

	l->pairs = ckfs_arena_calloc(&s->m->arena, s->n_modules + 1, sizeof(*l->pairs));
	l->modules = ckfs_arena_calloc(&s->m->arena, s->n_modules + 1, sizeof(*l->modules));
	if (!l->pairs || !l->modules)
		return ckfs_nomem(err);
	for (size_t i = 0; i < s->n_modules; i++) {
		struct ckfs_lora_pair *p = &l->pairs[i];
		p->a = s->modules[i].ab[0];
		p->b = s->modules[i].ab[1];
		p->scale = (float)scale; /* torch multiplies fp32 by the scale as fp32 */
		pthread_mutex_init(&p->lock, NULL);
		l->modules[i] = s->modules[i].name;
		l->n_pairs++;
	}
	return CKFS_OK;
}

enum ckfs_code ckfs_peft_split(struct ckfs_model *m, const struct ckfs_model_options *opt,
			       struct ckfs_error *err)
{
	struct split s = { .m = m, .opt = opt };
	enum ckfs_code rc;

	if (!ckfs_peft_names(m))
		return CKFS_OK;
	rc = split(&s, err);
	if (rc == CKFS_OK)
		rc = make_pairs(&s, err);
	free(s.modules);
	if (rc == CKFS_OK)
		m->lora = s.lora;
	return rc;
}

/* ---- the base weights: from the checkpoint or --base ---- */

/* t's chunks, their sources moved by off, in m's arena. */
static struct ckfs_chunk *moved_chunks(struct ckfs_model *m, const struct ckfs_chunk *c,
				       uint32_t n, uint32_t off)
{
	struct ckfs_chunk *v = ckfs_arena_calloc(&m->arena, n + 1, sizeof(*v));

	for (uint32_t i = 0; v && i < n; i++) {
		v[i] = c[i];
		v[i].source += off;
	}
	return v;
}

/* b's tensors become m's, b's sources appended to m's (m owns their
 * descriptors from here), b's metadata files and config.json joining the
 * files who may read the folder is decided by. */
static enum ckfs_code take_tensors(struct ckfs_model *m, struct ckfs_model *b,
				   struct ckfs_error *err)
{
	uint32_t off = (uint32_t)m->n_sources;
	struct ckfs_source *src = ckfs_arena_calloc(&m->arena, m->n_sources + b->n_sources + 1,
						    sizeof(*src));
	struct ckfs_tensor *ts = ckfs_arena_calloc(&m->arena, b->n_tensors + 1, sizeof(*ts));
	struct ckfs_file_access *meta = ckfs_arena_calloc(&m->arena,
							  m->n_meta_files + b->n_meta_files + 2,
							  sizeof(*meta));

	if (!src || !ts || !meta)
		return ckfs_nomem(err);
	for (size_t i = 0; i < b->n_tensors; i++) {
		ts[i] = b->tensors[i];
		ts[i].chunks = moved_chunks(m, b->tensors[i].chunks, ts[i].n_chunks, off);
		ts[i].copies = moved_chunks(m, b->tensors[i].copies, ts[i].n_copies, off);
		if (!ts[i].chunks || !ts[i].copies)
			return ckfs_nomem(err);
	}
	if (m->n_sources) /* (memcpy from NULL is undefined, even of 0 bytes) */
		memcpy(src, m->sources, m->n_sources * sizeof(*src));
	if (b->n_sources)
		memcpy(src + m->n_sources, b->sources, b->n_sources * sizeof(*src));
	if (m->n_meta_files)
		memcpy(meta, m->meta_files, m->n_meta_files * sizeof(*meta));
	if (b->n_meta_files)
		memcpy(meta + m->n_meta_files, b->meta_files, b->n_meta_files * sizeof(*meta));
	size_t n_meta = m->n_meta_files + b->n_meta_files;
	if (b->config_path)
		meta[n_meta++] = b->config_access;
	m->sources = src;
	m->n_sources += b->n_sources;
	b->n_sources = 0;
	m->tensors = ts;
	m->n_tensors = b->n_tensors;
	m->meta_files = meta;
	m->n_meta_files = n_meta;
	for (size_t i = 0; i < b->n_warnings; i++)
		CKFS_TRY(ckfs_model_warn(m, err, "--base: %s", b->warnings[i]));
	return CKFS_OK;
}

/* --base BASE: the weights of a checkpoint saved with save_lora_only. */
static enum ckfs_code open_base(struct ckfs_model *m, const struct ckfs_model_options *opt,
				struct ckfs_error *err)
{
	struct ckfs_model_options bo = *opt;
	struct ckfs_model *b;

	bo.base_path = NULL;
	bo.config_path = NULL;
	bo.as_stored = true; /* m's dtype rule applies to them once */
	bo.quant = CKFS_QUANT_NONE;
	bo.lora = CKFS_LORA_ADAPTER;
	bo.lora_alpha = 0;
	bo.rslora = false;
	CKFS_TRY(ckfs_model_open(opt->base_path, &bo, &b, err));
	m->base = b;
	if (b->lora)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': the base is itself a LoRA "
				 "checkpoint", opt->base_path);
	if (b->model_type && m->model_type && strcmp(b->model_type, m->model_type) != 0)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': model_type %s, but the LoRA "
				 "checkpoint's is %s", b->config_path, b->model_type,
				 m->model_type);
	CKFS_TRY(take_tensors(m, b, err));
	return ckfs_model_drop_tied(m, err);
}

static struct ckfs_tensor *find_tensor(struct ckfs_model *m, const char *name)
{
	for (size_t i = 0; i < m->n_tensors; i++)
		if (strcmp(m->tensors[i].name, name) == 0)
			return &m->tensors[i];
	return NULL;
}

/* Each adapter's base weight: there, 2-D and of the adapter's shape; with
 * --lora=fuse it gets its pair. */
static enum ckfs_code fit_pairs(struct ckfs_model *m, struct ckfs_error *err)
{
	struct ckfs_lora *l = m->lora;
	char name[1024];
	bool held = false;

	for (size_t i = 0; i < l->n_pairs; i++)
		held |= ckfs_hf_held_as_vlm(l->modules[i]);
	for (size_t i = 0; i < l->n_pairs; i++) {
		struct ckfs_lora_pair *p = &l->pairs[i];
		snprintf(name, sizeof(name), "%s.weight", l->modules[i]);
		CKFS_TRY(ckfs_hf_save_name(m, name, held, name, sizeof(name), err));
		struct ckfs_tensor *w = find_tensor(m, name);
		if (!w)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': LoRA module '%s' has no "
					 "base weight '%s'", m->src_dir, l->modules[i], name);
		if (w->ndim != 2 || w->shape[0] != p->b->shape[0] ||
		    w->shape[1] != p->a->shape[1])
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': base weight '%s' is not "
					 "[%lld, %lld], the shape of its LoRA adapter", m->src_dir,
					 name, (long long)p->b->shape[0],
					 (long long)p->a->shape[1]);
		if (l->mode == CKFS_LORA_FUSE) {
			w->view = &ckfs_view_lora;
			w->view_state = p;
		}
	}
	return CKFS_OK;
}

enum ckfs_code ckfs_peft_finish(struct ckfs_model *m, const struct ckfs_model_options *opt,
				struct ckfs_error *err)
{
	struct ckfs_lora *l = m->lora;

	if (!l)
		return CKFS_OK;
	if (l->only && opt->base_path)
		CKFS_TRY(open_base(m, opt, err));
	else if (opt->base_path)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s' holds its base weights: --base is "
				 "for LoRA checkpoints saved with the adapter only",
				 m->src_dir);
	else if (l->only && l->mode != CKFS_LORA_ADAPTER)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s' holds a LoRA adapter only "
				 "(save_lora_only): --lora=%s needs the base weights; pass "
				 "--base DIR", m->src_dir,
				 l->mode == CKFS_LORA_FUSE ? "fuse" : "base");
	if (l->only && !opt->base_path)
		return ckfs_model_warn(m, err, "a LoRA adapter only (saved with "
				       "save_lora_only): served as the adapter folder; "
				       "pass --base DIR for the whole model");
	return fit_pairs(m, err);
}
