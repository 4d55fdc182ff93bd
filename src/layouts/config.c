/* SPDX-License-Identifier: MIT */
/*
 * Files around the tensors (src/layouts/layouts.h): the Hugging Face
 * config.json a model is served with (and who may read it, for the served
 * modes), the layout metadata files read whole, and the warnings a model
 * collects while it is opened.
 */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/json.h"
#include "ckfs/text.h"
#include "layouts/layouts.h"

/* The n elements of size at old copied into a new array of the arena
 * with room for one more (zeroed), or NULL. */
static void *grown(struct ckfs_arena *a, const void *old, size_t n, size_t size)
{
	void *p = ckfs_arena_calloc(a, n + 1, size);

	if (p && n)
		memcpy(p, old, n * size);
	return p;
}

enum ckfs_code ckfs_model_warn(struct ckfs_model *m, struct ckfs_error *err,
			       const char *fmt, ...)
{
	char raw[1024], buf[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(raw, sizeof(raw), fmt, ap);
	va_end(ap);
	ckfs_text_escape(buf, sizeof(buf), raw); /* names from the checkpoint */
	const char **w = grown(&m->arena, m->warnings, m->n_warnings, sizeof(*w));
	char *copy = ckfs_arena_strdup(&m->arena, buf);
	if (!w || !copy)
		return ckfs_nomem(err);
	w[m->n_warnings++] = copy;
	m->warnings = w;
	return CKFS_OK;
}

/* Append who may read path (access) to m->meta_files. */
static enum ckfs_code add_meta_access(struct ckfs_model *m, const char *path,
				      struct ckfs_file_access access, struct ckfs_error *err)
{
	struct ckfs_file_access *list;

	list = grown(&m->arena, m->meta_files, m->n_meta_files, sizeof(*list));
	access.path = ckfs_arena_strdup(&m->arena, path);
	if (!list || !access.path)
		return ckfs_nomem(err);
	list[m->n_meta_files++] = access;
	m->meta_files = list;
	return CKFS_OK;
}

enum ckfs_code ckfs_model_read_meta(struct ckfs_model *m, const char *path, size_t max,
				    char **out, size_t *len, struct ckfs_error *err)
{
	struct ckfs_file_access access;

	CKFS_TRY(ckfs_file_read_small(&m->policy, path, max, out, len, &access, err));
	if (add_meta_access(m, path, access, err) != CKFS_OK) {
		free(*out);
		*out = NULL;
		return err->code;
	}
	return CKFS_OK;
}

enum ckfs_code ckfs_model_note_meta_source(struct ckfs_model *m, const struct ckfs_source *s,
					   struct ckfs_error *err)
{
	const struct ckfs_file_access access = {
		.mode = s->mode, .uid = s->uid, .gid = s->gid, .acl = s->acl,
	};
	return add_meta_access(m, s->path, access, err);
}

enum ckfs_code ckfs_model_load_config(struct ckfs_model *m, const char *config_opt,
				      struct ckfs_error *err)
{
	char *hf = ckfs_arena_printf(&m->arena, "%s/huggingface", m->src_dir);

	if (!hf)
		return ckfs_nomem(err);
	return ckfs_model_load_config_from(m, hf, config_opt, err);
}

/* Model types whose transformers 5.10 config class ties the embeddings
 * when config.json does not say (the decoders and vision-language models
 * among them; the others default to false). */
static const char *const tied_by_default[] = {
	"aya_vision", "bloom", "cohere", "cohere2", "cohere2_moe", "ernie4_5",
	"ernie4_5_moe", "falcon", "gemma", "gemma2", "gemma3", "gemma3_text",
	"gemma3n", "gemma4", "gpt2", "gpt_neo", "internvl", "jetmoe", "lfm2",
	"lfm2_moe", "lfm2_vl", "mistral3", "mpt", "opt", "paligemma",
	"qwen2_5_omni", "qwen3_vl_moe", "recurrent_gemma", "smollm3",
	"starcoder2", "vaultgemma",
};

/* model_type and tie_word_embeddings. Python takes any truthy value
 * ("true", 1) for true: only a JSON boolean means the same to verl,
 * transformers and ckfs. */
static enum ckfs_code read_config_keys(struct ckfs_model *m, const char *path, const cJSON *j,
				       struct ckfs_error *err)
{
	const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "model_type");
	const cJSON *tie = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");

	if (type && !cJSON_IsString(type))
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': model_type is not a string", path);
	if (tie && !cJSON_IsBool(tie))
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': tie_word_embeddings is not true "
				 "or false", path);
	m->model_type = type ? ckfs_arena_strdup(&m->arena, type->valuestring) : NULL;
	if (type && !m->model_type)
		return ckfs_nomem(err);
	m->tie_word_embeddings = cJSON_IsTrue(tie);
	for (size_t i = 0; !tie && m->model_type &&
			   i < sizeof(tied_by_default) / sizeof(tied_by_default[0]); i++)
		m->tie_word_embeddings |= strcmp(m->model_type, tied_by_default[i]) == 0;
	return CKFS_OK;
}

enum ckfs_code ckfs_model_load_config_from(struct ckfs_model *m, const char *hf,
					   const char *config_opt,
					   struct ckfs_error *err)
{
	const char *path;
	char *text;
	size_t len;

	if (!hf)
		return ckfs_nomem(err);
	if (ckfs_path_is_dir(hf)) {
		CKFS_TRY(ckfs_file_check_policy(&m->policy, hf, err));
		m->hf_dir = hf;
	}
	/* The file --config names is the user's choice: no symlink policy
	 * for it. A folder it names supplies the side files too, which may
	 * then resolve inside that folder (policy.alt_root). */
	const struct ckfs_file_policy *pol = &m->policy;
	if (config_opt) {
		char *abs = ckfs_realpath(config_opt);
		if (!abs)
			return ckfs_fail_errno(err, "'%s': cannot resolve", config_opt);
		bool is_dir = ckfs_path_is_dir(abs);
		path = is_dir ? ckfs_arena_printf(&m->arena, "%s/config.json", abs)
			      : ckfs_arena_strdup(&m->arena, abs);
		if (path && !m->hf_dir && is_dir) {
			m->hf_dir = m->policy.alt_root = ckfs_arena_strdup(&m->arena, abs);
			if (!m->hf_dir)
				path = NULL;
		}
		free(abs);
		pol = NULL;
	} else {
		path = ckfs_arena_printf(&m->arena, "%s/config.json", hf);
	}
	if (!path)
		return ckfs_nomem(err);
	struct ckfs_file_access access;
	enum ckfs_code rc = ckfs_file_read_small(pol, path, CKFS_MAX_JSON_BYTES, &text, &len,
						 &access, err);
	if (rc == CKFS_E_NOTFOUND && !config_opt) {
		ckfs_error_clear(err);
		return ckfs_fail(err, CKFS_E_NOTFOUND,
				 "'%s': not found; pass --config PATH to a "
				 "Hugging Face config.json", path);
	}
	if (rc != CKFS_OK)
		return rc;
	cJSON *j;
	rc = ckfs_json_parse_object(path, text, len, &j, err);
	if (rc != CKFS_OK) {
		free(text);
		return rc;
	}
	rc = read_config_keys(m, path, j, err);
	cJSON_Delete(j);
	if (rc != CKFS_OK) {
		free(text);
		return rc;
	}
	m->config_json = ckfs_arena_strndup(&m->arena, text, len);
	free(text);
	if (!m->config_json)
		return ckfs_nomem(err);
	m->config_len = len;
	m->config_path = path;
	m->config_access = access;
	m->config_access.path = path;
	return CKFS_OK;
}
