/* SPDX-License-Identifier: MIT */
/* JSON inputs: see include/ckfs/json.h. cJSON's allocation hook notes a
 * failure in a per-thread flag. */
#include "ckfs/json.h"
#include "ckfs/text.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local bool alloc_failed;

static void *noting_malloc(size_t n)
{
	void *p = malloc(n);
	alloc_failed |= !p;
	return p;
}

static void install_hooks(void)
{
	cJSON_Hooks h = { noting_malloc, free };
	cJSON_InitHooks(&h);
}

static int cmp_key(const void *a, const void *b)
{
	return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* The first key that appears twice in an object of the tree at v (sorting
 * each object's keys: a safetensors header holds tens of thousands), or
 * NULL; *oom on a failed allocation. The recursion is as deep as the
 * input's nesting, which cJSON bounds (CJSON_NESTING_LIMIT, 1000). */
static const char *duplicate_key(const cJSON *v, bool *oom)
{
	const char *dup = NULL;
	size_t n = 0;

	for (const cJSON *c = v->child; c && !dup && !*oom; c = c->next) {
		dup = duplicate_key(c, oom);
		n++;
	}
	if (dup || *oom || !cJSON_IsObject(v) || n < 2)
		return dup;
	const cJSON **keys = malloc(n * sizeof(*keys));
	if (!keys) {
		*oom = true;
		return NULL;
	}
	n = 0;
	for (const cJSON *c = v->child; c; c = c->next)
		keys[n++] = c;
	qsort(keys, n, sizeof(*keys), cmp_key);
	for (size_t i = 1; i < n && !dup; i++)
		if (strcmp(keys[i]->string, keys[i - 1]->string) == 0)
			dup = keys[i]->string;
	free(keys);
	return dup;
}

/* The UTF-8 sequence at s (avail bytes left): its length, 0 when it is
 * not one. Never reads past avail. */
static size_t utf8_at(const unsigned char *s, size_t avail)
{
	unsigned char b[4] = { 0 };

	memcpy(b, s, avail < 4 ? avail : 4);
	size_t k = ckfs_utf8_seq(b);
	return k <= avail ? k : 0;
}

static bool json_space(unsigned char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* What cJSON takes and Python's json and serde_json refuse, anywhere in
 * the text: a NUL (cJSON's whitespace is any byte up to 32, and a C
 * string ends there: a reader in C would stop where Python sees more), a
 * raw control character in a string or between tokens, bytes that are not
 * UTF-8, a byte order mark. */
static enum ckfs_code check_bytes(const char *what, const unsigned char *s, size_t len,
				  struct ckfs_error *err)
{
	bool in_string = false;

	if (len >= 3 && s[0] == 0xEF && s[1] == 0xBB && s[2] == 0xBF)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': starts with a byte order mark", what);
	for (size_t i = 0, k; i < len; i += k) {
		unsigned char c = s[i];
		k = 1;
		if (c == 0)
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': NUL byte at offset %zu", what, i);
		if (c < 0x20 && (in_string || !json_space(c)))
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': control character 0x%02x "
					 "at offset %zu", what, c, i);
		if (c >= 0x80 && !(k = utf8_at(s + i, len - i)))
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': not UTF-8 at offset %zu", what, i);
		if (in_string && c == '\\' && i + 1 < len && s[i + 1] >= 0x20 && s[i + 1] < 0x80)
			k = 2; /* an escaped quote does not end the string */
		else if (c == '"')
			in_string = !in_string;
	}
	return CKFS_OK;
}

/* Only JSON whitespace after the value, as Python's json ("Extra data")
 * and serde_json ("trailing characters") require. */
static enum ckfs_code check_end(const char *what, const char *text, size_t len,
				const char *end, struct ckfs_error *err)
{
	size_t at = (size_t)(end - text);

	while (at < len && json_space((unsigned char)text[at]))
		at++;
	if (at < len)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': data after the JSON value at "
				 "offset %zu", what, at);
	return CKFS_OK;
}

enum ckfs_code ckfs_json_parse(const char *what, const char *text, size_t len,
			       cJSON **out, struct ckfs_error *err)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	const char *end = NULL;
	bool oom = false;

	*out = NULL;
	CKFS_TRY(check_bytes(what, (const unsigned char *)text, len, err));
	pthread_once(&once, install_hooks);
	alloc_failed = false;
	cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
	if (!j && alloc_failed)
		return ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory", what);
	if (!j) {
		size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
		unsigned line = 1, col = 1;
		for (size_t i = 0; i < at; i++) {
			col = text[i] == '\n' ? 1 : col + 1;
			line += text[i] == '\n';
		}
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': invalid JSON at line %u, "
				 "column %u", what, line, col);
	}
	if (check_end(what, text, len, end, err) != CKFS_OK) {
		cJSON_Delete(j);
		return CKFS_E_FORMAT;
	}
	const char *dup = duplicate_key(j, &oom);
	if (oom || dup) {
		enum ckfs_code rc = oom ? ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory", what)
					: ckfs_fail(err, CKFS_E_FORMAT, "'%s': key '%s' appears "
						    "twice in one object", what, dup);
		cJSON_Delete(j);
		return rc;
	}
	*out = j;
	return CKFS_OK;
}

enum ckfs_code ckfs_json_parse_object(const char *what, const char *text, size_t len,
				      cJSON **out, struct ckfs_error *err)
{
	CKFS_TRY(ckfs_json_parse(what, text, len, out, err));
	if (!cJSON_IsObject(*out)) {
		cJSON_Delete(*out);
		*out = NULL;
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': not a JSON object", what);
	}
	return CKFS_OK;
}

bool ckfs_json_whole(const cJSON *x, int64_t max, int64_t *out)
{
	if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0) || x->valuedouble > (double)max ||
	    x->valuedouble != (double)(int64_t)x->valuedouble)
		return false;
	*out = (int64_t)x->valuedouble;
	return true;
}

void ckfs_json_push(cJSON *arr, cJSON *item)
{
	if (!cJSON_AddItemToArray(arr, item))
		cJSON_Delete(item);
}
