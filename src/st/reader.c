/* SPDX-License-Identifier: MIT */
/*
 * Reader of existing safetensors folders (model.safetensors, or an index
 * and its shards), used by `ckfs verify` to compare against a reference.
 * Headers are validated with the reference loader's rules (formats.md
 * section 6.4): size limits, known dtypes, offsets contiguous from 0, byte
 * sizes matching shapes, data ending exactly at end of file.
 */
#include "ckfs/st.h"

#include "ckfs/json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int cmp_entry(const void *a, const void *b)
{
	return strcmp(((const struct ckfs_st_entry *)a)->name,
		      ((const struct ckfs_st_entry *)b)->name);
}

static int cmp_begin(const void *a, const void *b)
{
	const struct ckfs_st_entry *x = *(const struct ckfs_st_entry *const *)a;
	const struct ckfs_st_entry *y = *(const struct ckfs_st_entry *const *)b;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Append the entries of one file to a growing array. */
static enum ckfs_code read_file(struct ckfs_st_set *set, const char *path,
				struct ckfs_st_entry **arr, size_t *n, size_t *cap,
				struct ckfs_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	uint64_t hlen;
	char *json = NULL;
	cJSON *root = NULL;
	enum ckfs_code rc = CKFS_OK;
	size_t first = *n;

	if (fd < 0)
		return ckfs_fail_errno(err, "'%s': cannot open", path);
	if (set->n_fds == sizeof(set->fds) / sizeof(set->fds[0])) {
		close(fd);
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': too many shards", path);
	}
	set->fds[set->n_fds++] = fd;
	if (fstat(fd, &st) != 0)
		return ckfs_fail_errno(err, "'%s': stat failed", path);
	ssize_t got = st.st_size < 8 ? 0 : pread(fd, &hlen, 8, 0);
	if (got < 0)
		return ckfs_fail_errno(err, "'%s': cannot read", path);
	if (got != 8)
		return ckfs_fail(err, CKFS_E_TRUNCATED, "'%s': shorter than a "
				 "safetensors header", path);
	if (hlen > CKFS_MAX_ST_HEADER || hlen + 8 > (uint64_t)st.st_size)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': bad header length %llu",
				 path, (unsigned long long)hlen);
	json = malloc(hlen + 1);
	if (!json)
		return ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
	got = pread(fd, json, hlen, 8);
	if (got != (ssize_t)hlen) {
		rc = got < 0 ? ckfs_fail_errno(err, "'%s': cannot read", path)
			     : ckfs_fail(err, CKFS_E_TRUNCATED, "'%s': header truncated", path);
		goto out;
	}
	json[hlen] = '\0';
	bool oom;
	root = ckfs_json_parse(json, hlen, NULL, &oom);
	if (oom) {
		rc = ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory", path);
		goto out;
	}
	if (!root || !cJSON_IsObject(root)) {
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': header is not a JSON object",
			       path);
		goto out;
	}
	uint64_t data = 8 + hlen;
	const char *fpath = ckfs_arena_strdup(&set->arena, path);
	if (!fpath) {
		rc = ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
		goto out;
	}
	for (cJSON *it = root->child; it; it = it->next) {
		if (strcmp(it->string, "__metadata__") == 0)
			continue;
		if (*n == *cap) {
			size_t nc = *cap ? *cap * 2 : 256;
			struct ckfs_st_entry *p = realloc(*arr, nc * sizeof(*p));
			if (!p) {
				rc = ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
				goto out;
			}
			*arr = p;
			*cap = nc;
		}
		struct ckfs_st_entry *e = &(*arr)[*n];
		memset(e, 0, sizeof(*e));
		cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
		cJSON *shape = cJSON_GetObjectItemCaseSensitive(it, "shape");
		cJSON *offs = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
		e->name = ckfs_arena_strdup(&set->arena, it->string);
		e->file = fpath;
		e->fd = fd;
		if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) ||
		    !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
		    cJSON_GetArraySize(shape) > CKFS_MAX_DIMS) {
			rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': bad entry '%s'", path,
				       it->string);
			goto out;
		}
		e->dtype = ckfs_dtype_from_st_name(dt->valuestring);
		if (e->dtype == CKFS_DTYPE_INVALID) {
			rc = ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' has dtype "
				       "%s", path, it->string, dt->valuestring);
			goto out;
		}
		uint64_t numel = 1;
		for (cJSON *d = shape->child; d; d = d->next) {
			if (!cJSON_IsNumber(d) || d->valuedouble < 0 ||
			    d->valuedouble > 9e15) {
				rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': bad shape of "
					       "'%s'", path, it->string);
				goto out;
			}
			e->shape[e->ndim++] = (int64_t)d->valuedouble;
			numel *= (uint64_t)d->valuedouble;
		}
		double b = cJSON_GetArrayItem(offs, 0)->valuedouble;
		double en = cJSON_GetArrayItem(offs, 1)->valuedouble;
		if (!(b >= 0 && en >= b && en < 9e18) ||
		    (uint64_t)en - (uint64_t)b != numel * ckfs_dtype_size(e->dtype)) {
			rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': data offsets of '%s' do "
				       "not match its shape", path, it->string);
			goto out;
		}
		e->begin = data + (uint64_t)b;
		e->end = data + (uint64_t)en;
		if (!e->name) {
			rc = ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
			goto out;
		}
		(*n)++;
	}
	/* Contiguous from 0, ending at end of file. */
	size_t k = *n - first;
	struct ckfs_st_entry **by = calloc(k + 1, sizeof(*by));
	if (!by) {
		rc = ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < k; i++)
		by[i] = &(*arr)[first + i];
	qsort(by, k, sizeof(*by), cmp_begin);
	uint64_t pos = data;
	for (size_t i = 0; i < k && rc == CKFS_OK; i++) {
		if (by[i]->begin != pos)
			rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': tensor data not "
				       "contiguous at '%s'", path, by[i]->name);
		pos = by[i]->end;
	}
	free(by);
	if (rc == CKFS_OK && pos != (uint64_t)st.st_size)
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': data ends at %llu but the "
			       "file has %llu bytes", path, (unsigned long long)pos,
			       (unsigned long long)st.st_size);
out:
	cJSON_Delete(root);
	free(json);
	return rc;
}

enum ckfs_code ckfs_st_set_open(const char *dir, struct ckfs_st_set *set,
				struct ckfs_error *err)
{
	char path[4096];
	struct ckfs_st_entry *arr = NULL;
	size_t n = 0, cap = 0;
	enum ckfs_code rc = CKFS_OK;
	struct stat st;

	memset(set, 0, sizeof(*set));
	ckfs_arena_init(&set->arena);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	if (stat(path, &st) == 0) {
		rc = read_file(set, path, &arr, &n, &cap, err);
	} else {
		snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': no model.safetensors "
					 "or model.safetensors.index.json", dir);
		char *text = NULL;
		if (fstat(fd, &st) == 0 && st.st_size < CKFS_MAX_JSON_BYTES &&
		    !(text = malloc((size_t)st.st_size + 1))) {
			close(fd);
			return ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
		}
		ssize_t r = text ? pread(fd, text, (size_t)st.st_size, 0) : -1;
		int read_errno = errno;
		close(fd);
		if (r != st.st_size) {
			int read_failed = text && r < 0;
			free(text);
			errno = read_errno;
			return read_failed ? ckfs_fail_errno(err, "'%s': cannot read", path)
					   : ckfs_fail(err, CKFS_E_IO, "'%s': cannot read", path);
		}
		bool oom;
		cJSON *idx = ckfs_json_parse(text, (size_t)r, NULL, &oom);
		free(text);
		if (oom)
			return ckfs_fail(err, CKFS_E_NOMEM, "'%s': out of memory", path);
		cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
		if (!cJSON_IsObject(wm)) {
			cJSON_Delete(idx);
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': no weight_map", path);
		}
		/* Each distinct shard once, in order of first mention. */
		for (cJSON *it = wm->child; it && rc == CKFS_OK; it = it->next) {
			int seen = 0;
			if (!cJSON_IsString(it) || strchr(it->valuestring, '/')) {
				rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': bad shard name",
					       path);
				break;
			}
			for (cJSON *p = wm->child; p != it; p = p->next)
				seen |= strcmp(p->valuestring, it->valuestring) == 0;
			if (seen)
				continue;
			char shard[4096];
			snprintf(shard, sizeof(shard), "%s/%s", dir, it->valuestring);
			rc = read_file(set, shard, &arr, &n, &cap, err);
		}
		cJSON_Delete(idx);
	}
	if (rc == CKFS_OK) {
		qsort(arr, n, sizeof(*arr), cmp_entry);
		for (size_t i = 1; i < n && rc == CKFS_OK; i++)
			if (strcmp(arr[i].name, arr[i - 1].name) == 0)
				rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': tensor '%s' "
					       "appears twice", dir, arr[i].name);
	}
	if (rc == CKFS_OK) {
		set->entries = ckfs_arena_calloc(&set->arena, n + 1, sizeof(*arr));
		if (!set->entries)
			rc = ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
		else if (n)
			memcpy(set->entries, arr, n * sizeof(*arr));
		set->n_entries = n;
	}
	free(arr);
	if (rc != CKFS_OK)
		ckfs_st_set_release(set);
	return rc;
}

void ckfs_st_set_release(struct ckfs_st_set *set)
{
	for (size_t i = 0; i < set->n_fds; i++)
		close(set->fds[i]);
	set->n_fds = 0;
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
