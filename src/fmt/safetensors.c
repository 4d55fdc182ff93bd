/* SPDX-License-Identifier: MIT */
/*
 * Reader of existing safetensors folders (model.safetensors, or an index
 * and its shards): the weights of a Hugging Face folder served as they are
 * (src/layouts/hf.c), and the reference `ckfs verify` compares against.
 *
 * It accepts exactly what the reference loader (safetensors 0.7, which
 * safe_open, transformers and vLLM use) accepts, so that ckfs never serves
 * a file other readers would read differently or refuse:
 *   - an 8-byte little-endian header length of at most CKFS_MAX_ST_HEADER,
 *     inside the file; a header that is UTF-8 and starts with '{';
 *   - JSON (duplicate keys refused, include/ckfs/json.h) whose numbers are
 *     all non-negative integers (shapes and offsets are usize there: 1.0,
 *     1e3 and -0 are refused, not truncated);
 *   - "__metadata__", when present, an object of strings;
 *   - every other key a tensor: a known dtype, a shape, two offsets;
 *   - offsets, taken in order, contiguous from 0 (no gap, no overlap),
 *     each tensor's bytes matching its shape and dtype, and the data
 *     ending exactly at the end of the file.
 * For a sharded folder, the index's weight_map and the shards must hold
 * the same tensors: each indexed tensor in the shard the index names, and
 * no shard tensor missing from the index (loaders that follow the index
 * and loaders that list the shards would otherwise see different models).
 * Files are opened under a file policy (include/ckfs/file.h) before any
 * byte of them is read.
 */
#include "ckfs/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckfs/json.h"
#include "ckfs/text.h"

/* Offsets and sizes past 2^53 lose precision as JSON doubles; no real
 * file comes near (8 PiB). */
#define MAX_EXACT_NUMBER 9007199254740992.0

static int cmp_entry(const void *a, const void *b)
{
	return strcmp(((const struct ckfs_st_entry *)a)->name,
		      ((const struct ckfs_st_entry *)b)->name);
}

static int cmp_begin(const void *a, const void *b)
{
	const struct ckfs_st_entry *x = *(const struct ckfs_st_entry *const *)a;
	const struct ckfs_st_entry *y = *(const struct ckfs_st_entry *const *)b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

/* Every number token of the JSON text (outside strings) is a plain
 * non-negative integer: digits only, no leading zero (serde's usize). */
static int numbers_are_integers(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '"') {
			for (i++; i < n && s[i] != '"'; i++)
				if (s[i] == '\\')
					i++;
		} else if (s[i] == '-' || (s[i] >= '0' && s[i] <= '9')) {
			size_t start = i;
			while (i + 1 < n && strchr("0123456789+-.eE", s[i + 1]))
				i++;
			for (size_t k = start; k <= i; k++)
				if (s[k] < '0' || s[k] > '9')
					return 0;
			if (s[start] == '0' && i > start)
				return 0;
		}
	}
	return 1;
}

/* A JSON number that is an exact usize: *out. */
static int get_uint(const cJSON *v, uint64_t *out)
{
	if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= MAX_EXACT_NUMBER)
		return 0;
	*out = (uint64_t)v->valuedouble;
	return (double)*out == v->valuedouble;
}

static enum ckfs_code check_metadata(const char *path, const cJSON *md,
				     struct ckfs_error *err)
{
	if (cJSON_IsNull(md))
		return CKFS_OK;
	if (!cJSON_IsObject(md))
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': __metadata__ is not an object",
				 path);
	for (const cJSON *it = md->child; it; it = it->next)
		if (!cJSON_IsString(it))
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': __metadata__ value of "
					 "'%s' is not a string", path, it->string);
	return CKFS_OK;
}

/* One tensor entry of a header (data at byte `data` of the file). */
static enum ckfs_code parse_entry(struct ckfs_st_set *set, const char *path,
				  const cJSON *it, uint64_t data, struct ckfs_st_entry *e,
				  struct ckfs_error *err)
{
	const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
	const cJSON *shape = cJSON_GetObjectItemCaseSensitive(it, "shape");
	const cJSON *offs = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
	uint64_t numel = 1, b, en, nbytes;

	memset(e, 0, sizeof(*e));
	if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) ||
	    cJSON_GetArraySize(offs) != 2)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': bad entry '%s'", path, it->string);
	if (cJSON_GetArraySize(shape) > CKFS_MAX_DIMS)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': '%s' has more than %d dims",
				 path, it->string, CKFS_MAX_DIMS);
	e->dtype = ckfs_dtype_from_st_name(dt->valuestring);
	if (e->dtype == CKFS_DTYPE_INVALID)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' has dtype %s", path,
				 it->string, dt->valuestring);
	for (const cJSON *d = shape->child; d; d = d->next) {
		uint64_t v;
		if (!get_uint(d, &v))
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': bad shape of '%s'", path,
					 it->string);
		if (__builtin_mul_overflow(numel, v, &numel))
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': shape of '%s' overflows",
					 path, it->string);
		e->shape[e->ndim++] = (int64_t)v;
	}
	if (!get_uint(cJSON_GetArrayItem(offs, 0), &b) ||
	    !get_uint(cJSON_GetArrayItem(offs, 1), &en))
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': bad data offsets of '%s'", path,
				 it->string);
	if (en < b || __builtin_mul_overflow(numel, (uint64_t)ckfs_dtype_size(e->dtype),
					     &nbytes) || en - b != nbytes)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': data offsets of '%s' do not "
				 "match its shape", path, it->string);
	e->begin = data + b;
	e->end = data + en;
	e->name = ckfs_arena_strdup(&set->arena, it->string);
	return e->name ? CKFS_OK : ckfs_nomem(err);
}

/* Data offsets contiguous from the data start, ending at end of file. */
static enum ckfs_code check_tiling(const char *path, struct ckfs_st_entry *v, size_t k,
				   uint64_t data, uint64_t file_size, struct ckfs_error *err)
{
	struct ckfs_st_entry **by = calloc(k + 1, sizeof(*by));
	enum ckfs_code rc = CKFS_OK;

	if (!by)
		return ckfs_nomem(err);
	for (size_t i = 0; i < k; i++)
		by[i] = &v[i];
	qsort(by, k, sizeof(*by), cmp_begin);
	uint64_t pos = data;
	for (size_t i = 0; i < k && rc == CKFS_OK; i++) {
		if (by[i]->begin != pos)
			rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': tensor data not "
				       "contiguous at '%s'", path, by[i]->name);
		pos = by[i]->end;
	}
	free(by);
	if (rc == CKFS_OK && pos != file_size)
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': data ends at %llu but the "
			       "file has %llu bytes", path, (unsigned long long)pos,
			       (unsigned long long)file_size);
	return rc;
}

/* The header JSON of an open file (in set->files). */
static enum ckfs_code read_header(const char *path, struct ckfs_file f, uint64_t size, char **json,
				  uint64_t *hlen, struct ckfs_error *err)
{
	unsigned char len8[8];
	ssize_t got = size < 8 ? 0 : ckfs_file_pread(f, len8, 8, 0);

	if (got < 0)
		return ckfs_fail_errno(err, "'%s': cannot read", path);
	if (got != 8)
		return ckfs_fail(err, CKFS_E_TRUNCATED, "'%s': shorter than a "
				 "safetensors header", path);
	*hlen = 0;
	for (int i = 7; i >= 0; i--)
		*hlen = *hlen << 8 | len8[i];
	if (*hlen > CKFS_MAX_ST_HEADER || *hlen + 8 > size)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': bad header length %llu", path,
				 (unsigned long long)*hlen);
	char *j = malloc(*hlen + 1);
	if (!j)
		return ckfs_nomem(err);
	got = ckfs_file_pread(f, j, *hlen, 8);
	if (got != (ssize_t)*hlen) {
		free(j);
		return got < 0 ? ckfs_fail_errno(err, "'%s': cannot read", path)
			       : ckfs_fail(err, CKFS_E_TRUNCATED, "'%s': header truncated", path);
	}
	j[*hlen] = '\0';
	const unsigned char *p = (const unsigned char *)j;
	for (size_t k; p < (const unsigned char *)j + *hlen; p += k)
		if (!(k = ckfs_utf8_seq(p))) {
			size_t at = (size_t)(p - (const unsigned char *)j);
			free(j);
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': header is not UTF-8 "
					 "(byte %zu)", path, at);
		}
	if (*hlen == 0 || j[0] != '{') {
		free(j);
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': header does not start with '{'",
				 path);
	}
	if (!numbers_are_integers(j, *hlen)) {
		free(j);
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': header holds a number that is not "
				 "a non-negative integer", path);
	}
	*json = j;
	return CKFS_OK;
}

/* One ckfs_st_set_open: the set, the policy its files are opened under,
 * and the entries of the files read so far (arr, n of cap). */
struct st_open {
	struct ckfs_st_set *set;
	const struct ckfs_file_policy *pol;
	struct ckfs_st_entry *arr;
	size_t n, cap;
	struct ckfs_error *err;
};

/* Append the entries of one file to o's array. */
static enum ckfs_code read_file(struct st_open *o, const char *path)
{
	struct ckfs_st_set *set = o->set;
	struct ckfs_error *err = o->err;
	struct stat st;
	uint64_t hlen = 0;
	char *json = NULL;
	cJSON *root = NULL;
	enum ckfs_code rc;
	size_t first = o->n;
	struct ckfs_file f;

	if (set->n_files == sizeof(set->files) / sizeof(set->files[0]))
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': too many shards", path);
	CKFS_TRY(ckfs_file_open(o->pol, path, &f, &st, err));
	set->files[set->n_files++] = f;
	CKFS_TRY(read_header(path, f, (uint64_t)st.st_size, &json, &hlen, err));
	rc = ckfs_json_parse_object(path, json, hlen, &root, err);
	free(json);
	CKFS_TRY(rc);
	const char *fpath = ckfs_arena_strdup(&set->arena, path);
	if (!fpath)
		rc = ckfs_nomem(err);
	for (cJSON *it = root->child; it && rc == CKFS_OK; it = it->next) {
		if (strcmp(it->string, "__metadata__") == 0) {
			rc = check_metadata(path, it, err);
			continue;
		}
		if (o->n == o->cap) {
			size_t nc = o->cap ? o->cap * 2 : 256;
			struct ckfs_st_entry *p = realloc(o->arr, nc * sizeof(*p));
			if (!p) {
				rc = ckfs_nomem(err);
				break;
			}
			o->arr = p;
			o->cap = nc;
		}
		struct ckfs_st_entry *e = &o->arr[o->n];
		rc = parse_entry(set, path, it, 8 + hlen, e, err);
		e->file = fpath;
		e->f = f;
		if (rc == CKFS_OK)
			o->n++;
	}
	cJSON_Delete(root);
	CKFS_TRY(rc);
	return check_tiling(path, o->arr + first, o->n - first, 8 + hlen, (uint64_t)st.st_size,
			    err);
}

/* A shard name from an index: a file name in the same folder. */
static int plain_file_name(const char *s)
{
	return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

struct index_item {
	const char *name, *shard;
};

static int cmp_item_name(const void *a, const void *b)
{
	return strcmp(((const struct index_item *)a)->name, ((const struct index_item *)b)->name);
}

static int cmp_item_shard(const void *a, const void *b)
{
	return strcmp(((const struct index_item *)a)->shard,
		      ((const struct index_item *)b)->shard);
}

/* The tensors of the shards an index names; the index and the shards must
 * hold the same tensors. items (n_items) is the weight_map. */
static enum ckfs_code read_shards(struct st_open *o, const char *dir, const char *path,
				  struct index_item *items, size_t n_items)
{
	struct ckfs_error *err = o->err;
	struct index_item *by_name = malloc((n_items + 1) * sizeof(*by_name));
	enum ckfs_code rc = CKFS_OK;

	if (!by_name)
		return ckfs_nomem(err);
	memcpy(by_name, items, n_items * sizeof(*items));
	qsort(by_name, n_items, sizeof(*by_name), cmp_item_name);
	qsort(items, n_items, sizeof(*items), cmp_item_shard);
	for (size_t i = 0; i < n_items && rc == CKFS_OK; i++) {
		if (i && strcmp(items[i].shard, items[i - 1].shard) == 0)
			continue; /* each distinct shard once */
		char shard[4096];
		if ((size_t)snprintf(shard, sizeof(shard), "%s/%s", dir, items[i].shard) >=
		    sizeof(shard)) {
			rc = ckfs_fail(err, CKFS_E_LIMIT, "'%s': shard path too long", path);
			break;
		}
		size_t from = o->n;
		rc = read_file(o, shard);
		for (size_t k = from; k < o->n && rc == CKFS_OK; k++) {
			struct index_item key = { .name = o->arr[k].name };
			const struct index_item *named =
				bsearch(&key, by_name, n_items, sizeof(key), cmp_item_name);
			if (!named || strcmp(named->shard, items[i].shard) != 0)
				rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': tensor '%s' is not "
					       "in the index for this shard", shard,
					       o->arr[k].name);
		}
	}
	/* Every shard tensor is indexed to its shard (and names are unique
	 * per file); fewer of them than index entries means one is missing. */
	if (rc == CKFS_OK && o->n != n_items) {
		qsort(o->arr, o->n, sizeof(*o->arr), cmp_entry);
		for (size_t i = 0; i < n_items && rc == CKFS_OK; i++) {
			struct ckfs_st_entry key = { .name = by_name[i].name };
			if (!bsearch(&key, o->arr, o->n, sizeof(key), cmp_entry))
				rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': tensor '%s' is not in "
					       "its shard '%s'", path, by_name[i].name,
					       by_name[i].shard);
		}
	}
	free(by_name);
	return rc;
}

static enum ckfs_code read_index(struct st_open *o, const char *dir, const char *path)
{
	struct ckfs_error *err = o->err;
	struct index_item *items = NULL;
	size_t n_items = 0;
	char *text;
	size_t len;
	cJSON *idx;
	enum ckfs_code rc;

	CKFS_TRY(ckfs_file_read_small(o->pol, path, CKFS_MAX_JSON_BYTES, &text, &len, NULL, err));
	rc = ckfs_json_parse_object(path, text, len, &idx, err);
	free(text);
	CKFS_TRY(rc);
	cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
	if (!cJSON_IsObject(wm))
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': no weight_map", path);
	else if (!(items = calloc((size_t)cJSON_GetArraySize(wm) + 1, sizeof(*items))))
		rc = ckfs_nomem(err);
	for (cJSON *it = wm ? wm->child : NULL; it && rc == CKFS_OK; it = it->next) {
		if (!cJSON_IsString(it) || !plain_file_name(it->valuestring))
			rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': tensor '%s' has a bad "
				       "shard name", path, it->string);
		items[n_items].name = it->string;
		items[n_items++].shard = it->valuestring;
	}
	if (rc == CKFS_OK)
		rc = read_shards(o, dir, path, items, n_items);
	free(items);
	cJSON_Delete(idx);
	return rc;
}

enum ckfs_code ckfs_st_set_open(const char *dir, const struct ckfs_file_policy *pol,
				struct ckfs_st_set *set, struct ckfs_error *err)
{
	char path[4096];
	struct st_open o = { .set = set, .pol = pol, .err = err };
	enum ckfs_code rc = CKFS_OK;

	memset(set, 0, sizeof(*set));
	ckfs_arena_init(&set->arena);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	struct stat lst;
	if (ckfs_lstat(path, &lst) == 0) {
		rc = read_file(&o, path);
	} else {
		snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
		if (ckfs_lstat(path, &lst) != 0) {
			ckfs_arena_release(&set->arena);
			return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': no model.safetensors "
					 "or model.safetensors.index.json", dir);
		}
		rc = read_index(&o, dir, path);
	}
	if (rc == CKFS_OK) {
		qsort(o.arr, o.n, sizeof(*o.arr), cmp_entry);
		for (size_t i = 1; i < o.n && rc == CKFS_OK; i++)
			if (strcmp(o.arr[i].name, o.arr[i - 1].name) == 0)
				rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': tensor '%s' "
					       "appears twice", dir, o.arr[i].name);
	}
	if (rc == CKFS_OK) {
		set->entries = ckfs_arena_calloc(&set->arena, o.n + 1, sizeof(*o.arr));
		if (!set->entries)
			rc = ckfs_nomem(err);
		else if (o.n)
			memcpy(set->entries, o.arr, o.n * sizeof(*o.arr));
		set->n_entries = o.n;
	}
	free(o.arr);
	if (rc != CKFS_OK)
		ckfs_st_set_release(set);
	return rc;
}

void ckfs_st_set_release(struct ckfs_st_set *set)
{
	for (size_t i = 0; i < set->n_files; i++)
		ckfs_file_close(&set->files[i]);
	set->n_files = 0;
	ckfs_arena_release(&set->arena);
	set->entries = NULL;
	set->n_entries = 0;
}

const struct ckfs_st_entry *ckfs_st_set_find(const struct ckfs_st_set *set,
					     const char *name)
{
	struct ckfs_st_entry key = { .name = name };
	return bsearch(&key, set->entries, set->n_entries, sizeof(key), cmp_entry);
}
