/* SPDX-License-Identifier: MIT */
/* Checkpoints in an object store as read-only folders: include/ckfs/remote.h. */
#include "ckfs/remote.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckfs/log.h"
#include "store/disk_cache.h"

/* While metadata is read, reads shorter than BLOCK are served from
 * aligned blocks of BLOCK bytes, the last BLOCKS of them kept per object:
 * neighbouring zip records, a device mesh read element by element, a
 * safetensors header's length and text are then one request. Small
 * blocks: a rank file's local zip headers lie megabytes apart, and a
 * larger block would fetch tensor bytes around each for nothing (16 KiB:
 * 3 MB and 183 requests to mount a 0.5B actor at world size 8; 1 MiB:
 * 101 MB and 100 requests). */
enum { BLOCK = 16 << 10, BLOCKS = 2 };

/* Read ahead (ckfs_file_ahead): ranges of one object at most AHEAD_GAP
 * apart are fetched as one (the gap between two tensors' storages in a
 * torch.save zip is a local header and its padding, under 200 bytes),
 * and one read holds at most AHEAD_MAX bytes (an 8 MiB window of bf16
 * output converted from fp32 takes 16 MiB). */
enum { AHEAD_GAP = 4 << 10, AHEAD_MAX = 32 << 20 };

/* One listed prefix: its keys in byte order (binary search). */
struct root {
	char *url;                   /* "s3://bucket/prefix", no trailing '/' */
	size_t url_len;
	char bucket[64];
	char *prefix;                /* "prefix/", or "" for a whole bucket;
				      * an object root: the object's key */
	bool object;                 /* the URL names one object (a --config file) */
	struct ckfs_s3_listing list;
};

static struct {
	pthread_mutex_t lock;
	char *endpoint;
	struct ckfs_disk_cache *cache; /* --s3-cache, or NULL */
	struct ckfs_s3 *s3;
	struct root **roots;
	size_t n_roots;
} store = { .lock = PTHREAD_MUTEX_INITIALIZER };

struct block {
	uint64_t off;                /* UINT64_MAX: empty */
	unsigned char *bytes;
	uint64_t used;               /* LRU tick */
};

struct ckfs_remote_file {
	struct ckfs_s3 *s3;
	struct ckfs_disk_cache *cache;
	char *bucket;
	char *cache_id;              /* "bucket/key ETag": its blocks on disk */
	struct ckfs_s3_object obj;   /* obj.key owned */
	pthread_mutex_t lock;        /* blocks */
	struct block blocks[BLOCKS];
	uint64_t tick;
	_Atomic bool exact;          /* metadata read: no more blocks */
};

void ckfs_remote_set_endpoint(const char *endpoint)
{
	pthread_mutex_lock(&store.lock);
	free(store.endpoint);
	store.endpoint = endpoint ? strdup(endpoint) : NULL;
	pthread_mutex_unlock(&store.lock);
}

enum ckfs_code ckfs_remote_set_cache(const char *dir, uint64_t budget, struct ckfs_error *err)
{
	struct ckfs_disk_cache *c;

	CKFS_TRY(ckfs_disk_cache_open(dir, budget, &c, err));
	pthread_mutex_lock(&store.lock);
	ckfs_disk_cache_free(store.cache);
	store.cache = c;
	pthread_mutex_unlock(&store.lock);
	return CKFS_OK;
}

const char *ckfs_remote_cache_dir(void)
{
	return store.cache ? ckfs_disk_cache_dir(store.cache) : NULL;
}

static int by_key(const void *a, const void *b)
{
	return strcmp(((const struct ckfs_s3_object *)a)->key,
		      ((const struct ckfs_s3_object *)b)->key);
}

/* Keys ending in '/' are the folder markers some tools create: folders
 * follow from the other keys' names, and a marker is no file. An object
 * root keeps its own key alone. */
static void drop_markers(struct ckfs_s3_listing *l, const char *only)
{
	size_t kept = 0;

	for (size_t i = 0; i < l->n_objects; i++) {
		size_t n = strlen(l->objects[i].key);
		if ((n && l->objects[i].key[n - 1] == '/') ||
		    (only && strcmp(l->objects[i].key, only) != 0))
			free((char *)l->objects[i].key);
		else
			l->objects[kept++] = l->objects[i];
	}
	l->n_objects = kept;
}

/* The attached root url lies under, or NULL; *rel the rest of url
 * ("" for the root itself). Caller holds store.lock. */
static struct root *root_of(const char *url, const char **rel)
{
	for (size_t i = 0; i < store.n_roots; i++) {
		struct root *r = store.roots[i];
		if (strncmp(url, r->url, r->url_len) != 0 ||
		    (url[r->url_len] != '\0' && url[r->url_len] != '/'))
			continue;
		*rel = url + r->url_len;
		while (**rel == '/')
			(*rel)++;
		return r;
	}
	return NULL;
}

static void root_free(struct root *r)
{
	if (!r)
		return;
	ckfs_s3_listing_free(&r->list);
	free(r->url);
	free(r->prefix);
	free(r);
}

static bool rel_ok(const char *rel);

/* Keys that name nothing under the prefix (an empty component, as
 * `aws s3 cp x s3://b/p//y` writes, or "." / ".."): dropped, and named in
 * one warning, so that one stray key does not hide the folder it is in. */
static void drop_unnamed(struct ckfs_s3_listing *l, const struct root *r)
{
	size_t kept = 0, n_bad = 0, np = strlen(r->prefix);
	char shown[512] = "";

	for (size_t i = 0; i < l->n_objects; i++) {
		const char *key = l->objects[i].key;
		if (strncmp(key, r->prefix, np) == 0 && rel_ok(key + np)) {
			l->objects[kept++] = l->objects[i];
			continue;
		}
		if (n_bad++ < 3) {
			size_t k = strlen(shown);
			snprintf(shown + k, sizeof(shown) - k, "%s's3://%s/%s'", k ? ", " : "",
				 r->bucket, key);
		}
		free((char *)key);
	}
	l->n_objects = kept;
	if (n_bad)
		ckfs_log(CKFS_LOG_WARNING, "%s: %zu key%s with an empty, '.' or '..' path "
			 "component skipped (they name no file): %s%s", r->url, n_bad,
			 n_bad == 1 ? "" : "s", shown, n_bad > 3 ? ", ..." : "");
}

/* r's prefix listed, markers and keys that name nothing dropped, in key
 * order. r's bucket, prefix and kind never change once it is attached: no
 * lock needed. */
static enum ckfs_code list_prefix(struct ckfs_s3 *s3, const struct root *r,
				  struct ckfs_s3_listing *out, struct ckfs_error *err)
{
	CKFS_TRY(ckfs_s3_list(s3, r->bucket, r->prefix, false, out, err));
	drop_markers(out, r->object ? r->prefix : NULL);
	if (!r->object)
		drop_unnamed(out, r);
	if (out->n_objects) /* (an empty listing has no array) */
		qsort(out->objects, out->n_objects, sizeof(*out->objects), by_key);
	return CKFS_OK;
}

static enum ckfs_code list_root(struct root *r, struct ckfs_error *err)
{
	struct ckfs_s3_listing l;

	CKFS_TRY(list_prefix(store.s3, r, &l, err));
	ckfs_s3_listing_free(&r->list);
	r->list = l;
	return CKFS_OK;
}

/* The client, made on first use from the environment's settings. Caller
 * holds store.lock. */
static enum ckfs_code client(struct ckfs_error *err)
{
	struct ckfs_s3_config cfg;

	if (store.s3)
		return CKFS_OK;
	CKFS_TRY(ckfs_s3_config_load(&cfg, store.endpoint, CKFS_S3_AUTO, err));
	return ckfs_s3_new(&cfg, &store.s3, err);
}

enum ckfs_code ckfs_remote_client(struct ckfs_s3 **out, struct ckfs_error *err)
{
	pthread_mutex_lock(&store.lock);
	enum ckfs_code rc = client(err);
	*out = store.s3;
	pthread_mutex_unlock(&store.lock);
	return rc;
}

static enum ckfs_code attach_locked(const char *url, struct ckfs_error *err)
{
	char bucket[64];
	const char *key, *rel;
	struct root *r;
	enum ckfs_code rc;

	if (ckfs_s3_parse_url(url, bucket, sizeof(bucket), &key) != 0)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': not an s3://bucket/prefix URL", url);
	if (root_of(url, &rel))
		return CKFS_OK;
	CKFS_TRY(client(err));
	struct root **grown = realloc(store.roots, (store.n_roots + 1) * sizeof(*grown));
	if (!grown || !(r = calloc(1, sizeof(*r))))
		return ckfs_nomem(err);
	store.roots = grown;
	size_t klen = strlen(key);
	while (klen && key[klen - 1] == '/')
		klen--;
	r->url_len = strlen(url);
	while (r->url_len > 5 && url[r->url_len - 1] == '/')
		r->url_len--;
	memcpy(r->bucket, bucket, sizeof(bucket));
	r->url = strndup(url, r->url_len);
	r->prefix = malloc(klen + 2);
	if (!r->url || !r->prefix) {
		root_free(r);
		return ckfs_nomem(err);
	}
	memcpy(r->prefix, key, klen);
	strcpy(r->prefix + klen, klen ? "/" : "");
	rc = list_root(r, err);
	if (rc == CKFS_OK && r->list.n_objects == 0 && klen) {
		r->prefix[klen] = '\0'; /* no folder: maybe one object */
		r->object = true;
		rc = list_root(r, err);
	}
	if (rc == CKFS_OK && r->list.n_objects == 0)
		rc = ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': no such object, nor objects under "
			       "this prefix", r->url);
	if (rc != CKFS_OK) {
		root_free(r);
		return rc;
	}
	store.roots[store.n_roots++] = r;
	return CKFS_OK;
}

enum ckfs_code ckfs_remote_attach(const char *url, struct ckfs_error *err)
{
	pthread_mutex_lock(&store.lock);
	enum ckfs_code rc = attach_locked(url, err);
	pthread_mutex_unlock(&store.lock);
	return rc;
}

enum ckfs_code ckfs_remote_attach_urls(const char *const *paths, size_t n,
				       struct ckfs_error *err)
{
	for (size_t i = 0; i < n; i++)
		if (paths[i] && ckfs_s3_is_url(paths[i]))
			CKFS_TRY(ckfs_remote_attach(paths[i], err));
	return CKFS_OK;
}

enum ckfs_code ckfs_remote_refresh(const char *url, struct ckfs_error *err)
{
	struct ckfs_s3_listing l;
	const char *rel;

	pthread_mutex_lock(&store.lock);
	struct root *r = root_of(url, &rel);
	struct ckfs_s3 *s3 = store.s3;
	pthread_mutex_unlock(&store.lock);
	if (!r)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': not under an attached store prefix",
				 url);
	/* Listed without the lock: lookups go on meanwhile, on the old
	 * snapshot, until the new one takes its place. */
	CKFS_TRY(list_prefix(s3, r, &l, err));
	pthread_mutex_lock(&store.lock);
	struct ckfs_s3_listing old = r->list;
	r->list = l;
	pthread_mutex_unlock(&store.lock);
	ckfs_s3_listing_free(&old);
	return CKFS_OK;
}

void ckfs_remote_detach_all(void)
{
	pthread_mutex_lock(&store.lock);
	for (size_t i = 0; i < store.n_roots; i++)
		root_free(store.roots[i]);
	free(store.roots);
	store.roots = NULL;
	store.n_roots = 0;
	free(store.endpoint);
	store.endpoint = NULL;
	if (store.s3) {
		struct ckfs_s3_counts n;
		ckfs_s3_counts(store.s3, &n);
		ckfs_log(CKFS_LOG_INFO, "object store: %llu requests (%llu retried), %llu bytes "
			 "received", (unsigned long long)n.requests,
			 (unsigned long long)n.retries, (unsigned long long)n.bytes);
	}
	ckfs_s3_free(store.s3);
	store.s3 = NULL;
	ckfs_disk_cache_free(store.cache);
	store.cache = NULL;
	pthread_mutex_unlock(&store.lock);
}

void ckfs_remote_counts(struct ckfs_s3_counts *out)
{
	pthread_mutex_lock(&store.lock);
	if (store.s3)
		ckfs_s3_counts(store.s3, out);
	else
		memset(out, 0, sizeof(*out));
	pthread_mutex_unlock(&store.lock);
}

/* The first key >= key. */
static size_t lower_bound(const struct ckfs_s3_listing *l, const char *key)
{
	size_t lo = 0, hi = l->n_objects;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (strcmp(l->objects[mid].key, key) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* What a path under r names: the object (exact key), else whether keys
 * continue it as a folder. *key (malloc'd) is the key it maps to. */
struct lookup {
	char *key;                          /* prefix + rel */
	const struct ckfs_s3_object *obj;   /* a file, or NULL */
	bool dir;
};

/* "." and ".." and empty components are not names in a store. */
static bool rel_ok(const char *rel)
{
	for (const char *c = rel; *c;) {
		size_t n = strcspn(c, "/");
		if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
			return false;
		c += n;
		if (*c == '/' && *++c == '\0')
			return false;
	}
	return true;
}

static int look_up(const struct root *r, const char *rel, struct lookup *out)
{
	size_t np = strlen(r->prefix), nr = strlen(rel);

	memset(out, 0, sizeof(*out));
	if (!rel_ok(rel)) {
		errno = ENOENT;
		return -1;
	}
	if (!(out->key = malloc(np + nr + 2))) {
		errno = ENOMEM;
		return -1;
	}
	memcpy(out->key, r->prefix, np);
	memcpy(out->key + np, rel, nr + 1);
	if (r->object) {
		out->obj = nr ? NULL : &r->list.objects[0];
		if (out->obj)
			return 0;
		free(out->key);
		out->key = NULL;
		errno = ENOENT;
		return -1;
	}
	if (nr) {
		size_t i = lower_bound(&r->list, out->key);
		if (i < r->list.n_objects && strcmp(r->list.objects[i].key, out->key) == 0) {
			out->obj = &r->list.objects[i];
			return 0;
		}
		strcpy(out->key + np + nr, "/");
	}
	size_t i = lower_bound(&r->list, out->key);
	size_t n = strlen(out->key);
	out->dir = i < r->list.n_objects && strncmp(r->list.objects[i].key, out->key, n) == 0;
	if (!out->dir) {
		free(out->key);
		out->key = NULL;
		errno = ENOENT;
		return -1;
	}
	return 0;
}

static void fill_stat(struct stat *st, const struct ckfs_s3_object *obj)
{
	memset(st, 0, sizeof(*st));
	/* Readable by the mounting user alone: whoever holds the store's
	 * credentials decides whom to show its bytes (-o allow_other). */
	st->st_mode = obj ? S_IFREG | 0400 : S_IFDIR | 0500;
	st->st_nlink = 1;
	st->st_uid = geteuid();
	st->st_gid = getegid();
	st->st_size = obj ? (off_t)obj->size : 0;
	if (obj)
		st->st_mtim = st->st_ctim = obj->mtime;
	st->st_blksize = BLOCK;
}

int ckfs_remote_stat(const char *path, struct stat *st)
{
	const char *rel;
	struct lookup lk;
	int rc = -1;

	pthread_mutex_lock(&store.lock);
	struct root *r = root_of(path, &rel);
	if (!r)
		errno = ENOENT;
	else if ((rc = look_up(r, rel, &lk)) == 0) {
		fill_stat(st, lk.obj);
		free(lk.key);
	}
	pthread_mutex_unlock(&store.lock);
	return rc;
}

/* A handle on the object obj (its key copied) of bucket. */
static enum ckfs_code file_new(struct ckfs_s3 *s3, struct ckfs_disk_cache *cache,
			       const char *bucket, const struct ckfs_s3_object *obj,
			       struct ckfs_remote_file **out, struct ckfs_error *err)
{
	struct ckfs_remote_file *f = calloc(1, sizeof(*f));

	if (!f || !(f->bucket = strdup(bucket)) || !(f->obj.key = strdup(obj->key)) ||
	    asprintf(&f->cache_id, "%s %s/%s %s", ckfs_s3_identity(s3), bucket, obj->key,
		     obj->etag) < 0) {
		if (f) {
			free(f->bucket);
			free((char *)f->obj.key);
		}
		free(f);
		return ckfs_nomem(err);
	}
	f->s3 = s3;
	f->cache = cache;
	f->obj.size = obj->size;
	f->obj.mtime = obj->mtime;
	memcpy(f->obj.etag, obj->etag, sizeof(f->obj.etag));
	pthread_mutex_init(&f->lock, NULL);
	for (int i = 0; i < BLOCKS; i++)
		f->blocks[i].off = UINT64_MAX;
	*out = f;
	return CKFS_OK;
}

enum ckfs_code ckfs_remote_dup(const struct ckfs_remote_file *f, struct ckfs_remote_file **out,
			       struct ckfs_error *err)
{
	return file_new(f->s3, f->cache, f->bucket, &f->obj, out, err);
}

static enum ckfs_code open_locked(const char *path, struct ckfs_remote_file **out,
				  struct stat *st, struct ckfs_error *err)
{
	const char *rel;
	struct lookup lk;
	struct root *r = root_of(path, &rel);

	if (!r || look_up(r, rel, &lk) != 0)
		return errno == ENOMEM ? ckfs_nomem(err)
				       : ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': not found", path);
	if (!lk.obj) {
		free(lk.key);
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': not a regular file", path);
	}
	if (!lk.obj->etag[0]) {
		free(lk.key);
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': the store lists no ETag for "
				 "it, so a changed object could not be told", path);
	}
	struct ckfs_s3_object obj = *lk.obj;
	obj.key = lk.key;
	enum ckfs_code rc = file_new(store.s3, store.cache, r->bucket, &obj, out, err);
	free(lk.key);
	if (rc == CKFS_OK && st)
		fill_stat(st, &obj);
	return rc;
}

enum ckfs_code ckfs_remote_open(const char *path, struct ckfs_remote_file **out,
				struct stat *st, struct ckfs_error *err)
{
	pthread_mutex_lock(&store.lock);
	enum ckfs_code rc = open_locked(path, out, st, err);
	pthread_mutex_unlock(&store.lock);
	return rc;
}

const char *ckfs_remote_etag(const struct ckfs_remote_file *f)
{
	return f->obj.etag;
}

void ckfs_remote_fstat(const struct ckfs_remote_file *f, struct stat *st)
{
	fill_stat(st, &f->obj);
}

void ckfs_remote_forget(struct ckfs_remote_file *f)
{
	pthread_mutex_lock(&f->lock);
	f->exact = true;
	for (int i = 0; i < BLOCKS; i++) {
		free(f->blocks[i].bytes);
		f->blocks[i] = (struct block){ .off = UINT64_MAX };
	}
	pthread_mutex_unlock(&f->lock);
}

void ckfs_remote_close(struct ckfs_remote_file *f)
{
	if (!f)
		return;
	for (int i = 0; i < BLOCKS; i++)
		free(f->blocks[i].bytes);
	pthread_mutex_destroy(&f->lock);
	free((char *)f->obj.key);
	free(f->bucket);
	free(f->cache_id);
	free(f);
}

/* One ranged GET; a failure becomes an errno as pread(2) would give, and
 * is logged (the store's words) when report is set. */
static int fetch(struct ckfs_remote_file *f, uint64_t off, size_t len, void *buf, bool report)
{
	struct ckfs_error err;

	ckfs_error_clear(&err);
	if (ckfs_s3_get(f->s3, f->bucket, &f->obj, off, len, buf, &err) == CKFS_OK)
		return 0;
	if (report)
		ckfs_log(CKFS_LOG_ERR, "%s", err.msg);
	ckfs_error_note_cause(err.msg);
	errno = err.code == CKFS_E_CHANGED ? ESTALE : err.code == CKFS_E_NOMEM ? ENOMEM : EIO;
	return -1;
}

static size_t disk_block_len(const struct ckfs_remote_file *f, uint64_t b)
{
	uint64_t left = f->obj.size - b * CKFS_DISK_BLOCK;
	return left < CKFS_DISK_BLOCK ? (size_t)left : CKFS_DISK_BLOCK;
}

/* The part of [src_off, src_off + n) of src that falls in [off, off + len)
 * of buf, copied there. */
static void copy_overlap(unsigned char *buf, uint64_t off, size_t len, const unsigned char *src,
			 uint64_t src_off, uint64_t n)
{
	uint64_t lo = off > src_off ? off : src_off;
	uint64_t hi = off + len < src_off + n ? off + len : src_off + n;

	memcpy(buf + (lo - off), src + (lo - src_off), (size_t)(hi - lo));
}

/* [off, off + len) through the cache on disk: its blocks held there are
 * read from it, each run of the others fetched in one GET and kept. Each
 * block is looked up once. */
static int get_cached(struct ckfs_remote_file *f, uint64_t off, size_t len,
		      unsigned char *buf, bool report)
{
	uint64_t first = off / CKFS_DISK_BLOCK, last = (off + len - 1) / CKFS_DISK_BLOCK;
	unsigned char *one = malloc(CKFS_DISK_BLOCK), *run = NULL;
	int rc = 0;

	if (!one) {
		errno = ENOMEM;
		return -1;
	}
	for (uint64_t b = first; b <= last && rc == 0;) {
		uint64_t b0 = b * CKFS_DISK_BLOCK;
		if (ckfs_disk_cache_get(f->cache, f->cache_id, b, one, disk_block_len(f, b))) {
			copy_overlap(buf, off, len, one, b0, disk_block_len(f, b));
			b++;
			continue;
		}
		uint64_t end = b + 1; /* the run of blocks not held; block end (if any) is */
		while (end <= last && !ckfs_disk_cache_get(f->cache, f->cache_id, end, one,
							   disk_block_len(f, end)))
			end++;
		uint64_t run_len = (end - 1) * CKFS_DISK_BLOCK + disk_block_len(f, end - 1) - b0;
		if (!(run = malloc((size_t)run_len))) {
			errno = ENOMEM;
			rc = -1;
			break;
		}
		if ((rc = fetch(f, b0, (size_t)run_len, run, report)) == 0) {
			for (uint64_t k = b; k < end; k++)
				ckfs_disk_cache_put(f->cache, f->cache_id, k,
						    run + (k - b) * CKFS_DISK_BLOCK,
						    disk_block_len(f, k));
			copy_overlap(buf, off, len, run, b0, run_len);
			if (end <= last) /* the held block that ended the run, in one */
				copy_overlap(buf, off, len, one, end * CKFS_DISK_BLOCK,
					     disk_block_len(f, end));
		}
		free(run);
		run = NULL;
		b = end + 1;
	}
	free(one);
	return rc;
}

/* len bytes at off: from the cache on disk when there is one. */
static int get(struct ckfs_remote_file *f, uint64_t off, size_t len, void *buf, bool report)
{
	if (f->cache && len)
		return get_cached(f, off, len, buf, report);
	return fetch(f, off, len, buf, report);
}

/* The block at boff, from those kept or fetched (and kept). Copies
 * [off, off + len) of it to buf. */
static int block_read(struct ckfs_remote_file *f, uint64_t boff, uint64_t off, size_t len,
		      unsigned char *buf)
{
	struct block *b = NULL;

	pthread_mutex_lock(&f->lock);
	for (int i = 0; i < BLOCKS; i++)
		if (f->blocks[i].off == boff)
			b = &f->blocks[i];
	if (b) {
		b->used = ++f->tick;
		memcpy(buf, b->bytes + (off - boff), len);
		pthread_mutex_unlock(&f->lock);
		return 0;
	}
	pthread_mutex_unlock(&f->lock);

	/* Fetched without the lock: other reads of the object go on. */
	size_t blen = (size_t)(f->obj.size - boff < BLOCK ? f->obj.size - boff : BLOCK);
	unsigned char *bytes = malloc(blen);
	if (!bytes) {
		errno = ENOMEM;
		return -1;
	}
	if (get(f, boff, blen, bytes, true) != 0) {
		free(bytes);
		return -1;
	}
	memcpy(buf, bytes + (off - boff), len);
	pthread_mutex_lock(&f->lock);
	b = &f->blocks[0];
	for (int i = 1; i < BLOCKS; i++)
		if (f->blocks[i].used < b->used)
			b = &f->blocks[i];
	free(b->bytes);
	*b = (struct block){ .off = boff, .bytes = bytes, .used = ++f->tick };
	pthread_mutex_unlock(&f->lock);
	return 0;
}

/* What this thread fetched ahead for the read it is doing. */
struct held {
	const struct ckfs_remote_file *f;
	uint64_t off;
	size_t len;
	unsigned char *bytes;
};
static _Thread_local struct {
	struct held *v;
	size_t n;
} ahead;

static int by_file_pos(const void *a, const void *b)
{
	const struct ckfs_file_range *x = a, *y = b;
	uintptr_t fx = (uintptr_t)x->f.remote, fy = (uintptr_t)y->f.remote;

	if (fx != fy)
		return fx < fy ? -1 : 1;
	return x->pos < y->pos ? -1 : x->pos > y->pos;
}

void ckfs_remote_ahead(struct ckfs_file_range *v, size_t n)
{
	size_t total = 0;

	ckfs_remote_ahead_drop();
	if (!n || !(ahead.v = calloc(n, sizeof(*ahead.v))))
		return;
	qsort(v, n, sizeof(*v), by_file_pos);
	for (size_t i = 0; i < n;) {
		struct ckfs_remote_file *f = v[i].f.remote;
		uint64_t lo = v[i].pos, hi = v[i].pos + v[i].len;
		for (i++; i < n && v[i].f.remote == f && v[i].pos <= hi + AHEAD_GAP; i++)
			if (v[i].pos + v[i].len > hi)
				hi = v[i].pos + v[i].len;
		if (lo >= f->obj.size)
			continue;
		if (hi > f->obj.size)
			hi = f->obj.size;
		size_t len = (size_t)(hi - lo);
		if (len > AHEAD_MAX - total)
			break;
		/* A failure is left to the read's own pread to meet again
		 * and report (one line), and stops fetching ahead. */
		unsigned char *bytes = malloc(len);
		if (!bytes || get(f, lo, len, bytes, false) != 0) {
			free(bytes);
			break;
		}
		ahead.v[ahead.n++] = (struct held){ .f = f, .off = lo, .len = len, .bytes = bytes };
		total += len;
	}
}

void ckfs_remote_ahead_drop(void)
{
	for (size_t i = 0; i < ahead.n; i++)
		free(ahead.v[i].bytes);
	free(ahead.v);
	ahead.v = NULL;
	ahead.n = 0;
}

/* [off, off + len) of f from what this thread holds; false if it holds
 * none of it whole. */
static bool held_read(const struct ckfs_remote_file *f, void *buf, size_t len, uint64_t off)
{
	for (size_t i = 0; i < ahead.n; i++) {
		const struct held *h = &ahead.v[i];
		if (h->f == f && off >= h->off && off - h->off <= h->len &&
		    len <= h->len - (off - h->off)) {
			memcpy(buf, h->bytes + (off - h->off), len);
			return true;
		}
	}
	return false;
}

ssize_t ckfs_remote_pread(struct ckfs_remote_file *f, void *buf, size_t len, uint64_t off)
{
	if (off >= f->obj.size)
		return 0;
	if (len > f->obj.size - off)
		len = (size_t)(f->obj.size - off);
	if (held_read(f, buf, len, off))
		return (ssize_t)len;
	/* Data reads fetch exactly their range: a node reading its tensor-
	 * parallel shard must not pull its neighbours' bytes. */
	if (len >= BLOCK || atomic_load_explicit(&f->exact, memory_order_relaxed))
		return get(f, off, len, buf, true) == 0 ? (ssize_t)len : -1;
	for (size_t done = 0; done < len;) {
		uint64_t at = off + done, boff = at - at % BLOCK;
		size_t n = (size_t)(boff + BLOCK - at < len - done ? boff + BLOCK - at : len - done);
		if (block_read(f, boff, at, n, (unsigned char *)buf + done) != 0)
			return -1;
		done += n;
	}
	return (ssize_t)len;
}

/* A folder's names, gathered when it is opened. */
struct ckfs_remote_dir {
	char **names;
	bool *dirs;
	size_t n, next;
};

void ckfs_remote_closedir(struct ckfs_remote_dir *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < d->n; i++)
		free(d->names[i]);
	free(d->names);
	free(d->dirs);
	free(d);
}

static int dir_add(struct ckfs_remote_dir *d, const char *name, size_t n, bool dir)
{
	char **names = realloc(d->names, (d->n + 1) * sizeof(*names));
	if (names)
		d->names = names;
	bool *dirs = realloc(d->dirs, (d->n + 1) * sizeof(*dirs));
	if (dirs)
		d->dirs = dirs;
	if (!names || !dirs || !(d->names[d->n] = strndup(name, n)))
		return -1;
	d->dirs[d->n++] = dir;
	return 0;
}

static struct ckfs_remote_dir *opendir_locked(const char *path)
{
	const char *rel;
	struct lookup lk;
	struct root *r = root_of(path, &rel);

	if (!r || look_up(r, rel, &lk) != 0) {
		if (!r)
			errno = ENOENT;
		return NULL;
	}
	if (lk.obj) {
		free(lk.key);
		errno = ENOTDIR;
		return NULL;
	}
	struct ckfs_remote_dir *d = calloc(1, sizeof(*d));
	size_t n = strlen(lk.key);
	const struct ckfs_s3_listing *l = &r->list;
	char *child = malloc(n + 1 + 1024 + 2);
	size_t i = lower_bound(l, lk.key);
	while (d && child && i < l->n_objects && strncmp(l->objects[i].key, lk.key, n) == 0) {
		const char *name = l->objects[i].key + n;
		size_t len = strcspn(name, "/");
		bool sub = name[len] == '/';
		if (!sub) {
			i++;
		} else if (len > 1024) {
			i++; /* no such name from a listing: S3 keys are at most 1024 bytes */
			continue;
		} else {
			/* The keys under "<name>/" are all here, in a row: one entry,
			 * then past them ('0' follows '/'). A file of the same name
			 * ("a" and "a/b") shows as the file, listed on its own. */
			memcpy(child, l->objects[i].key, n + len);
			child[n + len] = '\0';
			size_t f = lower_bound(l, child);
			bool file_too = f < l->n_objects && strcmp(l->objects[f].key, child) == 0;
			strcpy(child + n + len, "0");
			i = lower_bound(l, child);
			if (file_too)
				continue;
		}
		if (dir_add(d, name, len, sub) != 0) {
			ckfs_remote_closedir(d);
			d = NULL;
		}
	}
	if (!child) {
		ckfs_remote_closedir(d);
		d = NULL;
	}
	free(child);
	free(lk.key);
	if (!d)
		errno = ENOMEM;
	return d;
}

struct ckfs_remote_dir *ckfs_remote_opendir(const char *path)
{
	pthread_mutex_lock(&store.lock);
	struct ckfs_remote_dir *d = opendir_locked(path);
	pthread_mutex_unlock(&store.lock);
	return d;
}

const char *ckfs_remote_readdir(struct ckfs_remote_dir *d, bool *is_dir)
{
	if (d->next == d->n)
		return NULL;
	*is_dir = d->dirs[d->next];
	return d->names[d->next++];
}
