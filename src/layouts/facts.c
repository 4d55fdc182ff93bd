/* SPDX-License-Identifier: MIT */
/*
 * What a layout says of a model beyond its tensors (include/ckfs/layouts.h):
 * each row's describe turns what only it knows (m->layout_info: a mesh,
 * Megatron's parallel sizes, a ZeRO stage) into facts, lines of inspect's
 * text and members of its JSON at once, so inspect shows every layout
 * without knowing any.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/strbuf.h"
#include "layouts/layouts.h"

void ckfs_facts_release(struct ckfs_facts *f)
{
	for (size_t i = 0; i < f->n; i++) {
		free(f->v[i].text);
		cJSON_Delete(f->v[i].value);
	}
	free(f->v);
	memset(f, 0, sizeof(*f));
}

enum ckfs_code ckfs_facts_add(struct ckfs_facts *f, const char *label, struct ckfs_strbuf *text,
			      const char *key, struct cJSON *value, struct ckfs_error *err)
{
	bool lost = (text && text->failed) || (key && !value);

	if (!lost && f->n == f->cap) {
		size_t cap = f->cap ? 2 * f->cap : 4;
		struct ckfs_fact *v = realloc(f->v, cap * sizeof(*v));
		lost = !v;
		if (v) {
			f->v = v;
			f->cap = cap;
		}
	}
	if (lost) {
		if (text)
			free(text->p);
		cJSON_Delete(value);
		return ckfs_nomem(err);
	}
	f->v[f->n++] = (struct ckfs_fact){ .label = label, .text = text ? text->p : NULL,
					   .key = key, .value = value };
	return CKFS_OK;
}

struct cJSON *ckfs_facts_json(struct cJSON *o, bool ok)
{
	if (ok)
		return o;
	cJSON_Delete(o);
	return NULL;
}

enum ckfs_code ckfs_facts_layout_line(struct ckfs_facts *f, const struct ckfs_model *m,
				      bool saved_by, struct ckfs_error *err)
{
	struct ckfs_strbuf b = { 0 };

	ckfs_strbuf_fmt(&b, "%s, %zu source file%s", m->layout->name, m->n_sources,
			m->n_sources == 1 ? "" : "s");
	if (saved_by && m->world_size > 0)
		ckfs_strbuf_fmt(&b, ", saved by %d rank%s", m->world_size,
				m->world_size == 1 ? "" : "s");
	return ckfs_facts_add(f, "layout", &b, NULL, NULL, err);
}

enum ckfs_code ckfs_facts_saved_by(const struct ckfs_model *m, struct ckfs_facts *f,
				   struct ckfs_error *err)
{
	return ckfs_facts_layout_line(f, m, true, err);
}

struct cJSON *ckfs_facts_mesh_json(int ndim, const int64_t *shape, const char *const *names)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *s = cJSON_AddArrayToObject(o, "shape");
	cJSON *d = cJSON_AddArrayToObject(o, "dim_names");
	bool ok = o && s && d;

	for (int i = 0; ok && i < ndim; i++)
		ok = cJSON_AddItemToArray(s, cJSON_CreateNumber((double)shape[i])) &&
		     cJSON_AddItemToArray(d, names[i] ? cJSON_CreateString(names[i])
						      : cJSON_CreateNull());
	return ckfs_facts_json(o, ok);
}

enum ckfs_code ckfs_model_describe(const struct ckfs_model *m, struct ckfs_facts *out,
				   struct ckfs_error *err)
{
	enum ckfs_code rc;
	bool mesh = false;

	memset(out, 0, sizeof(*out));
	rc = m->layout->describe ? m->layout->describe(m, out, err)
				 : ckfs_facts_layout_line(out, m, false, err);
	for (size_t i = 0; i < out->n; i++)
		mesh |= out->v[i].key && strcmp(out->v[i].key, "mesh") == 0;
	if (rc == CKFS_OK && !mesh)
		rc = ckfs_facts_add(out, NULL, NULL, "mesh", ckfs_facts_mesh_json(0, NULL, NULL),
				    err);
	if (rc != CKFS_OK)
		ckfs_facts_release(out);
	return rc;
}
