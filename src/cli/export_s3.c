/* SPDX-License-Identifier: MIT */
/*
 * ckfs export SRC s3://bucket/prefix (export_s3.h). Nothing is staged on
 * disk: each weight file goes to the store as a multipart upload straight
 * from the read path, its parts assembled and sent by the worker threads
 * (memory: threads x part size), every part with its MD5.
 *
 * A prefix has no rename, so it is made visible in an order instead: the
 * weight files first, the side files next, then
 * model.safetensors.index.json and config.json last: readers (and ckfs's
 * own run watcher) take a folder without config.json as incomplete. With
 * --force over an earlier export, its config.json and index are removed
 * first, for the same reason, and its other objects not written again
 * once the new folder is complete.
 *
 * Every object carries x-amz-meta-ckfs, a digest of what decides its
 * bytes (the sources' identities, its header or text). An export killed
 * part-way leaves objects that say so and no config.json: the same
 * command run again keeps the objects whose digest is its own, writes the
 * rest, and aborts the multipart uploads left open under the prefix
 * (uploads of a crash are otherwise kept, and billed, by the store).
 * Nothing is written or removed outside prefix/.
 *
 * --part I/N: each part uploads its share of the weight files
 * (export_part.h), then a marker object prefix/.ckfs-part-I-of-N whose
 * metadata is a hash of the whole plan. Part 0 waits for every marker
 * of its own plan, writes the rest (config.json last), aborts what
 * uploads are left open (all parts are done: none is anyone's), and
 * removes the markers (a part that writes its marker after that removes
 * it itself: mark_done).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckfs/hash.h"
#include "ckfs/remote.h"
#include "ckfs/s3.h"
#include "ckfs/units.h"
#include "cli/cli.h"
#include "cli/export_s3.h"

#define MIN_PART   (8u << 20)
#define MAX_PARTS  10000u
#define DIGEST_TAG "ckfs-export-1"
#define PLAN_TAG   "ckfs-parts-1"

struct dest {
	struct ckfs_s3 *s3;
	char bucket[64];
	char root[1024]; /* "prefix/" */
	const struct export_store_opts *o;
};

/* The part size asked for: CKFS_S3_PART_SIZE bytes (S3's limits: 5 MiB
 * to 5 GiB), else 8 MiB, the AWS CLI's default. */
static uint64_t part_wanted(void)
{
	const char *e = getenv("CKFS_S3_PART_SIZE");
	char *end;

	if (e && *e) {
		unsigned long long v = strtoull(e, &end, 10);
		if (!*end && v >= (5u << 20) && v <= (5ull << 30))
			return v;
	}
	return MIN_PART;
}

/* The part size for a file of size bytes: as asked, more where 10,000
 * parts would not hold it (S3's limit; then in whole MiB). */
static size_t part_size(uint64_t size)
{
	uint64_t want = part_wanted();

	if ((size + want - 1) / want <= MAX_PARTS)
		return (size_t)want;
	uint64_t p = (size + MAX_PARTS - 1) / MAX_PARTS;
	return (size_t)((p + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1));
}

/* ---- the digest stored with each object ---- */

static uint64_t mix(uint64_t h, const void *p, size_t n)
{
	return ckfs_fnv1a(h, p, n);
}

static uint64_t mix_source(uint64_t h, const struct ckfs_source *s)
{
	int64_t t[2] = { s->mtime.tv_sec, s->mtime.tv_nsec };

	if (s->name)
		h = mix(h, s->name, strlen(s->name) + 1);
	h = mix(h, &s->size, sizeof(s->size));
	return mix(h, t, sizeof(t));
}

/* "ckfs-export-1 <16 hex>": SRC, every source's name, size and mtime,
 * the node's name, size and what decides its bytes. */
static void digest(const struct export_store_opts *o, const struct ckfs_model *m,
		   const struct ckfs_node *n, char out[64])
{
	uint64_t h = mix(CKFS_FNV1A_START, o->src, strlen(o->src) + 1);

	for (const struct ckfs_model *x = m; x; x = x == m ? m->base : NULL)
		for (size_t i = 0; i < x->n_sources; i++)
			h = mix_source(h, &x->sources[i]);
	h = mix(h, n->name, strlen(n->name) + 1);
	h = mix(h, &n->size, sizeof(n->size));
	if (n->st)
		h = mix(h, n->st->header, n->st->header_len);
	else if (n->gguf)
		h = mix(h, n->gguf->header, n->gguf->header_len);
	else if (n->kind == CKFS_NODE_RENDERED)
		h = mix(h, n->data, n->size);
	else if (n->kind == CKFS_NODE_PASSTHROUGH)
		h = mix_source(h, &n->src);
	snprintf(out, 64, DIGEST_TAG " %016llx", (unsigned long long)h);
}

/* "ckfs-parts-1 <16 hex>": N and every file's digest, so that parts of
 * one plan agree and a part of another (SRC, options, N) is told. */
static void plan_digest(const struct export_store_opts *o, const struct ckfs_model *m,
			const struct ckfs_folder *f, char out[64])
{
	uint64_t h = mix(CKFS_FNV1A_START, &o->part.count, sizeof(o->part.count));
	char d[64];

	for (size_t i = 0; i < f->n_nodes; i++)
		if (f->nodes[i].kind != CKFS_NODE_DIR) {
			digest(o, m, &f->nodes[i], d);
			h = mix(h, d, strlen(d));
		}
	snprintf(out, 64, PLAN_TAG " %016llx", (unsigned long long)h);
}

/* ---- one file ---- */

struct upload {
	const struct dest *d;
	const struct ckfs_folder *f;
	const struct ckfs_node *n;
	const char *key, *id;
	size_t part;
	unsigned n_parts;
	struct ckfs_s3_part *parts;
	atomic_uint next;
	struct ckfs_first_error fail;
};

/* len bytes at off of n, all of them: a read is short only at the file's
 * end (ckfs_folder_read), which no range here passes. */
static enum ckfs_code read_range(const struct ckfs_folder *f, const struct ckfs_node *n,
				 uint64_t off, size_t len, char *buf,
				 struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	size_t got;

	CKFS_TRY(ckfs_folder_read(f, n, off, len, buf, &got, scratch, err));
	if (got != len)
		return ckfs_fail(err, CKFS_E_TRUNCATED, "'%s': ends before its size", n->name);
	return CKFS_OK;
}

static void *send_parts(void *arg)
{
	struct upload *u = arg;
	struct ckfs_read_scratch scratch = { 0 };
	struct ckfs_error err;
	char *buf = malloc(u->part);

	ckfs_error_clear(&err);
	if (!buf) {
		ckfs_nomem(&err);
		ckfs_first_error_set(&u->fail, &err);
	}
	while (buf && !atomic_load(&u->fail.failed) && !*u->d->o->interrupted) {
		unsigned i = atomic_fetch_add(&u->next, 1);
		if (i >= u->n_parts)
			break;
		uint64_t off = (uint64_t)i * u->part;
		size_t len = u->n->size - off < u->part ? (size_t)(u->n->size - off) : u->part;
		if (read_range(u->f, u->n, off, len, buf, &scratch, &err) != CKFS_OK ||
		    ckfs_s3_upload_part(u->d->s3, u->d->bucket, u->key, u->id, i + 1, buf, len,
					&u->parts[i], &err) != CKFS_OK) {
			ckfs_first_error_set(&u->fail, &err);
			break;
		}
	}
	free(buf);
	ckfs_read_scratch_release(&scratch);
	return NULL;
}

/* A weight file of several parts: started, sent by the workers, finished;
 * aborted on any failure, so that no upload stays open. */
static enum ckfs_code put_multipart(const struct dest *d, const struct ckfs_folder *f,
				    const struct ckfs_node *n, const char *key, const char *meta,
				    struct ckfs_error *err)
{
	struct upload u = { .d = d, .f = f, .n = n, .key = key, .part = part_size(n->size) };
	char *id = NULL;
	pthread_t tids[256];
	int started = 0;
	enum ckfs_code rc;

	u.n_parts = (unsigned)((n->size + u.part - 1) / u.part);
	if (!(u.parts = calloc(u.n_parts, sizeof(*u.parts))))
		return ckfs_nomem(err);
	CKFS_TRY(ckfs_s3_upload_start(d->s3, d->bucket, key, meta, &id, err));
	u.id = id;
	ckfs_first_error_init(&u.fail);
	int nt = d->o->threads < (int)u.n_parts ? d->o->threads : (int)u.n_parts;
	for (int i = 0; i < nt && i < 256; i++) {
		if (pthread_create(&tids[i], NULL, send_parts, &u) != 0) {
			ckfs_first_error_no_thread(&u.fail);
			break;
		}
		started++;
	}
	for (int i = 0; i < started; i++)
		pthread_join(tids[i], NULL);
	if (u.fail.err.code != CKFS_OK) {
		*err = u.fail.err;
		rc = err->code;
	} else if (*d->o->interrupted || !started) {
		rc = ckfs_fail(err, CKFS_E_IO, "interrupted");
	} else {
		rc = ckfs_s3_upload_finish(d->s3, d->bucket, key, id, u.parts, u.n_parts, err);
	}
	if (rc != CKFS_OK) {
		struct ckfs_error why;
		ckfs_error_clear(&why);
		if (ckfs_s3_upload_abort(d->s3, d->bucket, key, id, &why) != CKFS_OK)
			ckfs_cli_say("warning: %s (the upload stays open; the next export to "
				     "this prefix aborts it)",
				     why.msg);
	}
	ckfs_first_error_destroy(&u.fail);
	free(u.parts);
	free(id);
	return rc;
}

static enum ckfs_code put_file(const struct dest *d, const struct ckfs_folder *f,
			       const struct ckfs_node *n, const char *key, const char *meta,
			       struct ckfs_error *err)
{
	struct ckfs_read_scratch scratch = { 0 };
	enum ckfs_code rc;

	if (n->size > part_size(n->size))
		return put_multipart(d, f, n, key, meta, err);
	if (n->kind == CKFS_NODE_RENDERED)
		return ckfs_s3_put(d->s3, d->bucket, key, n->data, n->size, meta, err);
	char *buf = malloc(n->size ? n->size : 1);
	if (!buf)
		return ckfs_nomem(err);
	rc = read_range(f, n, 0, n->size, buf, &scratch, err);
	if (rc == CKFS_OK)
		rc = ckfs_s3_put(d->s3, d->bucket, key, buf, n->size, meta, err);
	ckfs_read_scratch_release(&scratch);
	free(buf);
	return rc;
}

/* ---- the prefix ---- */

/* The order objects become visible in: weight files, side files, the
 * index, config.json (a folder without it reads as incomplete). */
static int rank(const struct ckfs_node *n)
{
	if (n->kind == CKFS_NODE_WEIGHTS)
		return 0;
	if (strcmp(n->name, "config.json") == 0)
		return 3;
	if (strcmp(n->name, "model.safetensors.index.json") == 0)
		return 2;
	return 1;
}

/* The file written last: the one whose presence says "complete". */
static const struct ckfs_node *last_node(const struct ckfs_folder *f)
{
	const struct ckfs_node *last = NULL;

	for (size_t i = 0; i < f->n_nodes; i++)
		if (f->nodes[i].kind != CKFS_NODE_DIR &&
		    (!last || rank(&f->nodes[i]) >= rank(last)))
			last = &f->nodes[i];
	return last;
}

/* What was under the prefix at the start. A listing carries no metadata,
 * so an object's digest costs a HEAD: taken once, when first needed. */
struct before {
	struct ckfs_s3_listing l;
	bool *headed; /* l.objects[i].meta is the HEAD's */
};

/* The index of key in b, or -1. */
static long find(const struct before *b, const char *key)
{
	for (size_t i = 0; i < b->l.n_objects; i++)
		if (strcmp(b->l.objects[i].key, key) == 0)
			return (long)i;
	return -1;
}

/* Object i's x-amz-meta-ckfs ("" if none), by a HEAD the first time. */
static enum ckfs_code meta_of(const struct dest *d, struct before *b, size_t i, const char **meta,
			      struct ckfs_error *err)
{
	struct ckfs_s3_object *o = &b->l.objects[i], h;

	if (!b->headed[i]) {
		CKFS_TRY(ckfs_s3_head(d->s3, d->bucket, o->key, &h, err));
		memcpy(o->meta, h.meta, sizeof(o->meta));
		b->headed[i] = true;
	}
	*meta = o->meta;
	return CKFS_OK;
}

/* Whether this process writes node i of f (a part: its share of the
 * weight files; part 0 also every other file). */
static bool writes(const struct dest *d, const struct ckfs_folder *f, const unsigned *owner,
		   size_t i)
{
	const struct export_store_opts *o = d->o;

	return !o->part.count ||
	       (export_part_file(f, i) ? owner[i] == o->part.index : o->part.index == 0);
}

/* Whether f has a file of that name. */
static bool holds(const struct ckfs_folder *f, const char *name)
{
	for (size_t i = 0; i < f->n_nodes; i++)
		if (f->nodes[i].kind != CKFS_NODE_DIR && strcmp(f->nodes[i].name, name) == 0)
			return true;
	return false;
}

static bool ours(const char *meta)
{
	return strncmp(meta, DIGEST_TAG " ", strlen(DIGEST_TAG) + 1) == 0 ||
	       strncmp(meta, PLAN_TAG " ", strlen(PLAN_TAG) + 1) == 0;
}

/* A part's marker key, "prefix/.ckfs-part-I-of-N". */
static void marker(const struct dest *d, unsigned index, char *out, size_t size)
{
	snprintf(out, size, "%s.ckfs-part-%u-of-%u", d->root, index, d->o->part.count);
}

/* Part 0: wait until every part's marker says this plan. A marker of
 * another plan (an earlier export's) is waited past, saying so once.
 * Each poll is one listing of the markers; a marker listed is HEADed for
 * its plan (a listing has no metadata) until it says this one. */
static enum ckfs_code wait_for_parts(const struct dest *d, const char *plan, struct ckfs_error *err)
{
	unsigned n = d->o->part.count, left = n - 1;
	bool *done = calloc(n, sizeof(*done)), said = false, said_other = false;
	char key[1100], markers[1100];
	enum ckfs_code rc = CKFS_OK;

	if (!done)
		return ckfs_nomem(err);
	done[0] = true;
	snprintf(markers, sizeof(markers), "%s.ckfs-part-", d->root);
	while (left && rc == CKFS_OK) {
		struct ckfs_s3_listing l = { 0 }; /* freed however the listing ends */
		rc = ckfs_s3_list(d->s3, d->bucket, markers, false, &l, err);
		for (unsigned p = 1; p < n && rc == CKFS_OK; p++) {
			struct ckfs_s3_object o;
			bool listed = false;
			if (done[p])
				continue;
			marker(d, p, key, sizeof(key));
			for (size_t i = 0; i < l.n_objects && !listed; i++)
				listed = strcmp(l.objects[i].key, key) == 0;
			if (!listed)
				continue;
			rc = ckfs_s3_head(d->s3, d->bucket, key, &o, err);
			if (rc == CKFS_E_NOTFOUND) { /* removed since it was listed */
				ckfs_error_clear(err);
				rc = CKFS_OK;
			} else if (rc == CKFS_OK && strcmp(o.meta, plan) == 0) {
				done[p] = true;
				left--;
			} else if (rc == CKFS_OK && !said_other && !d->o->quiet) {
				ckfs_cli_say("part 0/%u: 's3://%s/%s' is another export's (%s, not "
					     "%s): waiting for part %u of this one",
					     n, d->bucket, key, o.meta, plan, p);
				said_other = true;
			}
		}
		ckfs_s3_listing_free(&l);
		if (!left || rc != CKFS_OK)
			break;
		if (*d->o->interrupted) {
			rc = ckfs_fail(err, CKFS_E_IO, "interrupted");
			break;
		}
		if (!said && !d->o->quiet)
			ckfs_cli_say(
				"part 0/%u: waiting for the other parts' files under 's3://%s/%s'",
				n, d->bucket, d->root);
		said = true;
		usleep(500 * 1000);
	}
	free(done);
	return rc;
}

/* Whether part I > 0 leaves the object at key to be looked at by
 * another part: a file of the folder, or a marker, that another part
 * writes (which refuses it if it is not ckfs's, as part 0 does with
 * anything foreign: it looks at every object). So each part HEADs its own
 * files' objects and those of no part, not all: N parts made N HEADs of
 * every object. */
static bool anothers(const struct dest *d, const struct ckfs_folder *f, const unsigned *owner,
		     const char *key)
{
	const char *name = key + strlen(d->root);
	unsigned i, n;
	char end;

	if (!d->o->part.index)
		return false;
	for (size_t k = 0; k < f->n_nodes; k++)
		if (f->nodes[k].kind != CKFS_NODE_DIR && strcmp(f->nodes[k].name, name) == 0)
			return !writes(d, f, owner, k);
	return sscanf(name, ".ckfs-part-%u-of-%u%c", &i, &n, &end) == 2 && n == d->o->part.count &&
	       i != d->o->part.index;
}

/* What is under the prefix already: nothing; an export ckfs did not
 * finish (every object carries a digest, config.json is missing), which
 * this one resumes; this very export, complete (a part run again after
 * part 0 finished: *done); else a folder only --force replaces, whose
 * marking files go first. */
static enum ckfs_code look_at_prefix(const struct dest *d, const struct ckfs_model *m,
				     const struct ckfs_folder *f, const unsigned *owner,
				     struct before *old, const char *url, bool *done,
				     struct ckfs_error *err)
{
	char key[2048], want[64];
	const struct ckfs_node *last = last_node(f);
	const char *meta;
	bool foreign = false;

	*done = false;
	if (!old->l.n_objects)
		return CKFS_OK;
	snprintf(key, sizeof(key), "%s%s", d->root, last ? last->name : "config.json");
	long at = find(old, key);
	bool complete = at >= 0;
	if (complete && last && d->o->part.count) {
		digest(d->o, m, last, want);
		CKFS_TRY(meta_of(d, old, (size_t)at, &meta, err));
		if ((*done = strcmp(meta, want) == 0))
			return CKFS_OK;
	}
	for (size_t i = 0; i < old->l.n_objects && !complete && !foreign; i++) {
		if (anothers(d, f, owner, old->l.objects[i].key))
			continue;
		enum ckfs_code rc = meta_of(d, old, i, &meta, err);
		if (rc == CKFS_E_NOTFOUND) { /* removed since: part 0 ends, its markers go */
			ckfs_error_clear(err);
			continue;
		}
		CKFS_TRY(rc);
		foreign = !ours(meta);
	}
	if (!complete && !foreign) {
		/* the other parts' objects are no earlier run's */
		if (!d->o->quiet && !d->o->part.count)
			ckfs_cli_say("'%s': resuming an export that did not finish (%zu objects "
				     "there)",
				     url, old->l.n_objects);
		return CKFS_OK;
	}
	if (!d->o->force)
		return ckfs_fail(err, CKFS_E_EXISTS,
				 "'%s': already holds %zu objects%s; use "
				 "--force to replace them",
				 url, old->l.n_objects, complete ? "" : ", not all of them ckfs's");
	/* --force: it reads as incomplete from here on */
	static const char *const marking[] = { "config.json", "model.safetensors.index.json" };
	for (size_t i = 0; i < 2; i++) {
		snprintf(key, sizeof(key), "%s%s", d->root, marking[i]);
		if (find(old, key) >= 0)
			CKFS_TRY(ckfs_s3_delete(d->s3, d->bucket, key, err));
	}
	return CKFS_OK;
}

/* Abort the multipart uploads open under the prefix: an earlier export's,
 * killed before it could. */
static void abort_stale(const struct dest *d)
{
	struct ckfs_s3_listing l;
	struct ckfs_error err;
	size_t n = 0;

	ckfs_error_clear(&err);
	if (ckfs_s3_uploads(d->s3, d->bucket, d->root, &l, &err) != CKFS_OK) {
		ckfs_cli_say("warning: %s", err.msg);
		return;
	}
	for (size_t i = 0; i < l.n_objects; i++) {
		ckfs_error_clear(&err);
		if (ckfs_s3_upload_abort(d->s3, d->bucket, l.objects[i].key, l.objects[i].upload_id,
					 &err) == CKFS_OK)
			n++;
		else
			ckfs_cli_say("warning: %s", err.msg);
	}
	if (n && !d->o->quiet)
		ckfs_cli_say("aborted %zu multipart upload%s an earlier export left open", n,
			     n == 1 ? "" : "s");
	ckfs_s3_listing_free(&l);
}

/* Whether the S3 prefixes a and b (of one bucket) are the same or one
 * holds the other. */
static bool nested(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b), k = la < lb ? la : lb;

	while (la && a[la - 1] == '/')
		la--;
	while (lb && b[lb - 1] == '/')
		lb--;
	k = la < lb ? la : lb;
	return strncmp(a, b, k) == 0 &&
	       (la == lb || (la > lb ? a[k] == '/' || k == 0 : b[k] == '/' || k == 0));
}

/* The export may not write where it reads: SRC, or a --base model. */
static enum ckfs_code check_apart(const struct dest *d, const struct ckfs_model *m, const char *url,
				  struct ckfs_error *err)
{
	for (const struct ckfs_model *x = m; x; x = x == m ? m->base : NULL) {
		char bucket[64];
		const char *key;
		if (!x->src_dir || ckfs_s3_parse_url(x->src_dir, bucket, sizeof(bucket), &key) != 0)
			continue;
		if (strcmp(bucket, d->bucket) == 0 && nested(key, d->root))
			return ckfs_fail(err, CKFS_E_INVALID,
					 "'%s': the checkpoint '%s' is there "
					 "or above it; export to a prefix of its own",
					 url, x->src_dir);
	}
	return CKFS_OK;
}

/* Write f's files of visibility rank r that are this part's. */
static enum ckfs_code write_rank(const struct dest *d, const struct ckfs_model *m,
				 const struct ckfs_folder *f, const unsigned *owner, int r,
				 struct before *old, uint64_t *written, size_t *files, size_t *kept,
				 struct ckfs_error *err)
{
	const struct export_store_opts *o = d->o;
	char k[2048], meta[64];

	for (size_t i = 0; i < f->n_nodes; i++) {
		const struct ckfs_node *n = &f->nodes[i];
		if (n->kind == CKFS_NODE_DIR || rank(n) != r || !writes(d, f, owner, i))
			continue;
		if (*o->interrupted)
			return ckfs_fail(err, CKFS_E_IO, "interrupted");
		snprintf(k, sizeof(k), "%s%s", d->root, n->name);
		digest(o, m, n, meta);
		(*files)++;
		long had = find(old, k);
		const char *was;
		struct ckfs_error why;
		ckfs_error_clear(&why);
		/* --force writes every file again, as for a local DIR */
		if (!o->force && had >= 0 && old->l.objects[had].size == n->size &&
		    meta_of(d, old, (size_t)had, &was, &why) == CKFS_OK && strcmp(was, meta) == 0) {
			(*kept)++; /* written by an earlier run of this export */
			continue;
		}
		CKFS_TRY(put_file(d, f, n, k, meta, err));
		*written += n->size;
	}
	return CKFS_OK;
}

/* Part I of N (I > 0), its files written: its marker. */
/* Part I > 0: its marker written. Part 0 removes the markers once
 * config.json is written; a part run again at that moment (it found the
 * export unfinished) may write its marker after that removal, so it looks
 * for this export's config.json afterwards and, there, removes its own.
 * Either part 0's listing of the markers comes after the marker, or the
 * marker after config.json, which the look then finds. */
static enum ckfs_code mark_done(const struct dest *d, const struct ckfs_model *m,
				const struct ckfs_folder *f, const char *plan,
				struct ckfs_error *err)
{
	const struct ckfs_node *last = last_node(f);
	struct ckfs_s3_object o;
	char key[1100], want[64];

	marker(d, d->o->part.index, key, sizeof(key));
	CKFS_TRY(ckfs_s3_put(d->s3, d->bucket, key, "", 0, plan, err));
	if (!last)
		return CKFS_OK;
	char cfg[2048];
	snprintf(cfg, sizeof(cfg), "%s%s", d->root, last->name);
	enum ckfs_code rc = ckfs_s3_head(d->s3, d->bucket, cfg, &o, err);
	if (rc == CKFS_E_NOTFOUND) {
		ckfs_error_clear(err);
		return CKFS_OK;
	}
	CKFS_TRY(rc);
	digest(d->o, m, last, want);
	return strcmp(o.meta, want) == 0 ? ckfs_s3_delete(d->s3, d->bucket, key, err) : CKFS_OK;
}

/* Whether name (under the prefix) is a part's marker. */
static bool is_marker(const char *name)
{
	return strncmp(name, ".ckfs-part-", strlen(".ckfs-part-")) == 0;
}

/* Whether the prefix held parts' markers at the start. */
static bool had_markers(const struct dest *d, const struct before *b)
{
	for (size_t i = 0; i < b->l.n_objects; i++)
		if (is_marker(b->l.objects[i].key + strlen(d->root)))
			return true;
	return false;
}

/* What is under the prefix now and not in the folder: with markers,
 * every part's marker (once config.json is written); without, what the
 * folder replaced held (--force) and an unfinished earlier export's files
 * of other names. Listed again: parts wrote meanwhile. */
static enum ckfs_code remove_stale(const struct dest *d, const struct ckfs_folder *f, bool markers,
				   struct ckfs_error *err)
{
	struct ckfs_s3_listing now;
	enum ckfs_code rc;

	CKFS_TRY(ckfs_s3_list(d->s3, d->bucket, d->root, false, &now, err));
	rc = CKFS_OK;
	for (size_t i = 0; i < now.n_objects && rc == CKFS_OK; i++) {
		const char *k = now.objects[i].key, *name = k + strlen(d->root);
		if (markers ? is_marker(name) : !holds(f, name) && !is_marker(name))
			rc = ckfs_s3_delete(d->s3, d->bucket, k, err);
	}
	ckfs_s3_listing_free(&now);
	return rc;
}

enum ckfs_code export_store(const struct export_store_opts *o, const struct ckfs_model *m,
			    const struct ckfs_folder *f, const char *url, struct ckfs_error *err)
{
	struct dest d = { .o = o };
	struct before old = { 0 };
	struct timespec t0, t1;
	const char *key;
	char plan[64];
	uint64_t written = 0;
	size_t files = 0, kept = 0;
	unsigned *owner = NULL;
	uint64_t *bytes = NULL;
	enum ckfs_code rc;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (ckfs_s3_parse_url(url, d.bucket, sizeof(d.bucket), &key) != 0)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': not an s3://bucket/prefix URL", url);
	size_t klen = strlen(key);
	while (klen && key[klen - 1] == '/')
		klen--;
	if (!klen)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "'%s': name a prefix for the folder "
				 "(s3://%s/PREFIX), not the bucket",
				 url, d.bucket);
	if (klen + 2 > sizeof(d.root))
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': the prefix is too long", url);
	snprintf(d.root, sizeof(d.root), "%.*s/", (int)klen, key);
	CKFS_TRY(check_apart(&d, m, url, err));
	if (o->part.count) {
		owner = calloc(f->n_nodes + 1, sizeof(*owner));
		bytes = calloc(o->part.count, sizeof(*bytes));
		if (!owner || !bytes) {
			free(owner);
			free(bytes);
			return ckfs_nomem(err);
		}
		export_part_assign(f, o->part.count, owner, bytes);
		plan_digest(o, m, f, plan);
	}
	rc = ckfs_remote_client(&d.s3, err);
	if (rc == CKFS_OK)
		rc = ckfs_s3_list(d.s3, d.bucket, d.root, false, &old.l, err);
	if (rc == CKFS_OK && !(old.headed = calloc(old.l.n_objects + 1, sizeof(bool))))
		rc = ckfs_nomem(err);
	bool done = false;
	if (rc == CKFS_OK)
		rc = look_at_prefix(&d, m, f, owner, &old, url, &done, err);
	if (rc == CKFS_OK && done) {
		if (!o->quiet)
			ckfs_cli_say("part %u/%u: '%s' is this export, complete already",
				     o->part.index, o->part.count, url);
		ckfs_s3_listing_free(&old.l);
		free(old.headed);
		free(owner);
		free(bytes);
		return CKFS_OK;
	}
	if (rc == CKFS_OK && !o->part.count)
		abort_stale(&d); /* no one else writes here */
	/* in the order they become visible */
	if (rc == CKFS_OK)
		rc = write_rank(&d, m, f, owner, 0, &old, &written, &files, &kept, err);
	if (rc == CKFS_OK && o->part.count)
		rc = o->part.index ? mark_done(&d, m, f, plan, err) : wait_for_parts(&d, plan, err);
	bool rest = rc == CKFS_OK && o->part.index == 0;
	if (rest)
		rc = write_rank(&d, m, f, owner, 1, &old, &written, &files, &kept, err);
	/* before the index and config.json make the folder whole */
	if (rest && rc == CKFS_OK)
		rc = remove_stale(&d, f, false, err);
	for (int r = 2; r <= 3 && rest && rc == CKFS_OK; r++)
		rc = write_rank(&d, m, f, owner, r, &old, &written, &files, &kept, err);
	if (rest && rc == CKFS_OK && o->part.count)
		abort_stale(&d); /* every part is done: what is open is no one's */
	/* the markers: this export's parts', or an earlier one's it resumed */
	if (rest && rc == CKFS_OK && (o->part.count || had_markers(&d, &old)))
		rc = remove_stale(&d, f, true, err);
	ckfs_s3_listing_free(&old.l);
	free(old.headed);
	free(owner);
	free(bytes);
	if (rc != CKFS_OK || o->quiet)
		return rc;
	char size[32], who[48] = "";
	struct ckfs_s3_counts c;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ckfs_s3_counts(d.s3, &c);
	ckfs_format_bytes((double)written, size, sizeof(size));
	if (o->part.count)
		snprintf(who, sizeof(who), "part %u/%u: ", o->part.index, o->part.count);
	ckfs_cli_say("%swrote %zu files (%s) to '%s' in %.2f s (%llu requests%s)%s", who,
		     files - kept, size, url,
		     (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9,
		     (unsigned long long)c.requests, kept ? ", files of an earlier run kept" : "",
		     o->part.index ? "; part 0 writes config.json once all are done" : "");
	return CKFS_OK;
}
