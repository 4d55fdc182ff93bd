/* SPDX-License-Identifier: MIT */
/* GGUF key-values as bytes (little-endian hosts only, as the rest of ckfs),
 * and the side files they are made from. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/json.h"
#include "folder/gguf_int.h"

void gguf_put_u32(struct ckfs_strbuf *b, uint32_t v)
{
	ckfs_strbuf_put(b, (const char *)&v, 4);
}

void gguf_put_u64(struct ckfs_strbuf *b, uint64_t v)
{
	ckfs_strbuf_put(b, (const char *)&v, 8);
}

void gguf_put_str(struct ckfs_strbuf *b, const char *s, size_t len)
{
	gguf_put_u64(b, len);
	ckfs_strbuf_put(b, s, len);
}

static void key(struct gguf_kv *kv, const char *k, enum gguf_value type)
{
	gguf_put_str(&kv->b, k, strlen(k));
	gguf_put_u32(&kv->b, type);
	kv->n++;
}

void gguf_kv_str(struct gguf_kv *kv, const char *k, const char *val)
{
	key(kv, k, GGUF_STRING);
	gguf_put_str(&kv->b, val, strlen(val));
}

void gguf_kv_u32(struct gguf_kv *kv, const char *k, uint32_t val)
{
	key(kv, k, GGUF_UINT32);
	gguf_put_u32(&kv->b, val);
}

void gguf_kv_i32(struct gguf_kv *kv, const char *k, int32_t val)
{
	key(kv, k, GGUF_INT32);
	gguf_put_u32(&kv->b, (uint32_t)val);
}

void gguf_kv_f32(struct gguf_kv *kv, const char *k, float val)
{
	key(kv, k, GGUF_FLOAT32);
	ckfs_strbuf_put(&kv->b, (const char *)&val, 4);
}

void gguf_kv_bool(struct gguf_kv *kv, const char *k, bool val)
{
	char c = val ? 1 : 0;
	key(kv, k, GGUF_BOOL);
	ckfs_strbuf_put(&kv->b, &c, 1);
}

void gguf_kv_array(struct gguf_kv *kv, const char *k, enum gguf_value type, uint64_t n)
{
	key(kv, k, GGUF_ARRAY);
	gguf_put_u32(&kv->b, type);
	gguf_put_u64(&kv->b, n);
}

enum ckfs_code gguf_side_file(const struct ckfs_model *m, struct ckfs_gguf_file *g,
			      const char *name, size_t max, char **text, size_t *len,
			      struct ckfs_error *err)
{
	struct ckfs_file_access *acc = &g->from[g->n_from];
	char path[4096];

	*text = NULL;
	*len = 0;
	if (!m->hf_dir)
		return CKFS_OK;
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", m->hf_dir, name) >= sizeof(path))
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': path too long", m->hf_dir);
	if (!ckfs_path_exists(path))
		return CKFS_OK;
	if (g->n_from == sizeof(g->from) / sizeof(g->from[0]))
		abort(); /* more side files than gguf.h has room for: a bug */
	CKFS_TRY(ckfs_file_read_small(&m->policy, path, max, text, len, acc, err));
	if (!(acc->path = ckfs_arena_strdup(&g->arena, path))) {
		free(*text);
		*text = NULL;
		return ckfs_nomem(err);
	}
	g->n_from++;
	return CKFS_OK;
}

enum ckfs_code gguf_side_json(const struct ckfs_model *m, struct ckfs_gguf_file *g,
			      const char *name, struct cJSON **obj, struct ckfs_error *err)
{
	char *text;
	size_t len;

	*obj = NULL;
	CKFS_TRY(gguf_side_file(m, g, name, CKFS_MAX_JSON_BYTES, &text, &len, err));
	if (!text)
		return CKFS_OK;
	enum ckfs_code rc = ckfs_json_parse_object(name, text, len, obj, err);
	free(text);
	return rc;
}
