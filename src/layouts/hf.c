/* SPDX-License-Identifier: MIT */
/*
 * Folders that already hold Hugging Face safetensors weights: SRC,
 * SRC/huggingface or SRC/model/huggingface (the first that has them) with
 * model.safetensors, or model.safetensors.index.json and its shards.
 * They are served as they are, through the same plan as every other
 * layout: each tensor is one chunk pointing at its bytes in its file, so
 * --dtype conversions and --max-shard-size re-sharding work as usual.
 *
 * Headers are read and validated by the safetensors reader of
 * src/fmt/safetensors.c (ckfs_st_set_open: the reference loader's rules), which opens the files
 * under the model's file policy before reading them. Each weight file
 * becomes a source (the reader's descriptor, duplicated, so the identity
 * recorded is that of the file whose header was validated).
 *
 * Names are the file's, less torch wrapper names (names.c; unchanged for
 * what save_pretrained writes).
 *
 * Order: files by name (model-00001-of-N first), tensors in data order
 * within each file. A single file is thus re-served byte for byte, since
 * the writer's sort (dtype, then name) is the file's own order. No tie
 * rule: the folder's tensors are exactly what it serves. config.json and
 * side files come from the same folder (or --config).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckfs/safetensors.h"
#include "layouts/layouts.h"

static int cmp_file_then_pos(const void *a, const void *b)
{
	const struct ckfs_st_entry *x = *(const struct ckfs_st_entry *const *)a;
	const struct ckfs_st_entry *y = *(const struct ckfs_st_entry *const *)b;
	int c = strcmp(x->file, y->file);

	if (c)
		return c;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Source index for e's file, opening (duplicating) it on first use. */
static enum ckfs_code source_of(struct ckfs_model *m, const struct ckfs_st_entry *e,
				uint32_t *out, struct ckfs_error *err)
{
	/* Entries arrive grouped by file: the last source is the only
	 * candidate. */
	if (m->n_sources && strcmp(m->sources[m->n_sources - 1].path, e->file) == 0) {
		*out = (uint32_t)(m->n_sources - 1);
		return CKFS_OK;
	}
	size_t dl = strlen(m->src_dir);
	const char *rel = strncmp(e->file, m->src_dir, dl) == 0 && e->file[dl] == '/'
				  ? e->file + dl + 1 : e->file;
	const char *path = ckfs_arena_strdup(&m->arena, e->file);
	const char *name = ckfs_arena_strdup(&m->arena, rel);
	if (!path || !name)
		return ckfs_nomem(err);
	struct ckfs_file f;
	if (ckfs_file_dup(e->f, &f, err) != CKFS_OK) {
		ckfs_error_prefix(err, "'%s': ", path);
		return err->code;
	}
	/* The reader opened it under m's file policy. */
	if (ckfs_source_init(&m->sources[m->n_sources], f, path, name, err) != CKFS_OK) {
		ckfs_file_close(&f);
		return err->code;
	}
	*out = (uint32_t)m->n_sources++;
	return CKFS_OK;
}

static enum ckfs_code add_tensor(struct ckfs_model *m, const struct ckfs_st_entry *e,
				 struct ckfs_error *err)
{
	struct ckfs_tensor *t = &m->tensors[m->n_tensors];
	struct ckfs_chunk_list list = { 0 };
	struct ckfs_sd_entry se = { .kind = CKFS_ENTRY_TENSOR };
	uint32_t src = 0;
	enum ckfs_code rc;

	CKFS_TRY(source_of(m, e, &src, err));
	t->name = ckfs_arena_strdup(&m->arena, e->name);
	if (!t->name)
		return ckfs_nomem(err);
	/* (The reader checked end - begin == numel * element size.) */
	if (!ckfs_tensor_set(t, e->dtype, e->ndim, e->shape))
		return ckfs_fail(err, CKFS_E_FORMAT, "tensor '%s': shape overflows", t->name);
	t->placement = "whole";

	/* A row-major view of the file at begin: placement.c turns it into
	 * a chunk (scalars, size-1 dims) as for a plain torch tensor. */
	se.key = t->name;
	se.local.dtype = e->dtype;
	se.local.ndim = e->ndim;
	memcpy(se.local.shape, e->shape, sizeof(se.local.shape));
	int64_t stride = 1;
	for (int k = e->ndim - 1; k >= 0; k--) {
		se.local.stride[k] = stride;
		stride *= e->shape[k] ? e->shape[k] : 1;
	}
	se.local.storage_pos = e->begin;
	se.local.storage_bytes = e->end - e->begin;
	rc = ckfs_entry_chunks(&se, NULL, src, 0, &list, err);
	if (rc == CKFS_OK) {
		t->chunks = ckfs_model_chunks(m, list.v, list.n, t->ndim);
		if (!t->chunks)
			rc = ckfs_nomem(err);
		t->n_chunks = (uint32_t)list.n;
	}
	free(list.v);
	if (rc == CKFS_OK && (rc = ckfs_plan_validate_tensor(m, t, err)) != CKFS_OK)
		ckfs_error_prefix(err, "'%s'", e->file);
	if (rc == CKFS_OK)
		m->n_tensors++;
	return rc;
}

/* The name rule of torch state-dict keys (names.c): a folder written by
 * save_file(model.state_dict()) of a wrapped module (DDP, torch.compile)
 * carries the wrappers in its names, which no Hugging Face model loads. */
static enum ckfs_code hf_names(struct ckfs_model *m, const char *label, struct ckfs_error *err)
{
	const char **keys = calloc(m->n_tensors + 1, sizeof(*keys));
	const char **names = calloc(m->n_tensors + 1, sizeof(*names));
	enum ckfs_code rc = keys && names ? CKFS_OK : ckfs_nomem(err);

	for (size_t i = 0; rc == CKFS_OK && i < m->n_tensors; i++)
		keys[i] = m->tensors[i].name;
	if (rc == CKFS_OK)
		rc = ckfs_hf_names(m, label, keys, names, m->n_tensors, false, err);
	for (size_t i = 0; rc == CKFS_OK && i < m->n_tensors; i++)
		m->tensors[i].name = names[i];
	free(keys);
	free(names);
	return rc;
}

/* Where weights may be, relative to SRC, in the order they are looked for. */
static const char *const weight_dirs[] = { "", "/huggingface", "/model/huggingface" };

/* Does dir + sub hold model.safetensors or model.safetensors.index.json? */
static bool has_weights(const char *dir, const char *sub)
{
	char path[4096];

	if ((size_t)snprintf(path, sizeof(path), "%s%s/model.safetensors", dir, sub) >=
	    sizeof(path))
		return false;
	if (ckfs_path_exists(path))
		return true;
	snprintf(path, sizeof(path), "%s%s/model.safetensors.index.json", dir, sub);
	return ckfs_path_exists(path);
}

static int hf_detect(const char *dir, const struct ckfs_file_policy *pol)
{
	(void)pol;
	for (size_t i = 0; i < sizeof(weight_dirs) / sizeof(weight_dirs[0]); i++)
		if (has_weights(dir, weight_dirs[i]))
			return 1;
	return 0;
}

static enum ckfs_code build_from(struct ckfs_model *m, const struct ckfs_model_options *opt,
				 const char *dir, struct ckfs_error *err)
{
	struct ckfs_st_set set;
	const struct ckfs_st_entry **order = NULL;
	enum ckfs_code rc;

	CKFS_TRY(ckfs_st_set_open(dir, &m->policy, &set, err));
	if (set.n_entries == 0) {
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': the safetensors weights hold "
			       "no tensors", dir);
		goto out;
	}
	if (set.n_entries > CKFS_MAX_TENSORS) {
		rc = ckfs_fail(err, CKFS_E_LIMIT, "'%s': %zu tensors (limit %u)", dir,
			       set.n_entries, CKFS_MAX_TENSORS);
		goto out;
	}
	order = calloc(set.n_entries, sizeof(*order));
	m->tensors = ckfs_arena_calloc(&m->arena, set.n_entries, sizeof(*m->tensors));
	m->sources = ckfs_arena_calloc(&m->arena, set.n_files + 1, sizeof(*m->sources));
	if (!order || !m->tensors || !m->sources) {
		rc = ckfs_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < set.n_entries; i++)
		order[i] = &set.entries[i];
	qsort(order, set.n_entries, sizeof(*order), cmp_file_then_pos);
	rc = CKFS_OK;
	for (size_t i = 0; i < set.n_entries && rc == CKFS_OK; i++)
		rc = add_tensor(m, order[i], err);
	if (rc == CKFS_OK) {
		/* messages name the one weight file, or the index naming them */
		char *index = ckfs_arena_printf(&m->arena, "%s/model.safetensors.index.json", dir);
		rc = !index ? ckfs_nomem(err)
			    : hf_names(m, m->n_sources == 1 ? m->sources[0].path : index, err);
	}
	if (rc == CKFS_OK)
		rc = ckfs_model_load_config_from(m, dir, opt->config_path, err);
	if (rc == CKFS_OK)
		m->world_size = 1;
out:
	free(order);
	ckfs_st_set_release(&set);
	return rc;
}

static enum ckfs_code hf_build(struct ckfs_model *m, const struct ckfs_model_options *opt,
			       struct ckfs_error *err)
{
	for (size_t i = 0; i < sizeof(weight_dirs) / sizeof(weight_dirs[0]); i++) {
		if (!has_weights(m->src_dir, weight_dirs[i]))
			continue;
		const char *dir = ckfs_arena_printf(&m->arena, "%s%s", m->src_dir, weight_dirs[i]);
		return dir ? build_from(m, opt, dir, err) : ckfs_nomem(err);
	}
	return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': no model.safetensors", m->src_dir);
}

const struct ckfs_layout ckfs_layout_hf = {
	.name = "hf",
	.what = "Hugging Face weights",
	.looks_for = "model.safetensors or model.safetensors.index.json in it, huggingface/ "
		     "or model/huggingface/",
	.detect = hf_detect,
	.build = hf_build,
};
