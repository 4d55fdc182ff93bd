/* SPDX-License-Identifier: MIT */
/*
 * The store's XML answers, read with the little XML they use: elements,
 * text, the five named entities and character references. Anything else
 * (CDATA, comments, a document type, an element that does not close) is
 * refused rather than guessed at: the names listed become file names.
 * One reader for all: ListObjectsV2, ListMultipartUploads, and the small
 * answers of the writes (an upload's id, a completed upload's ETag or
 * its error), of which a child of the root is read (ckfs_s3_parse_child).
 */
#include "ckfs/s3.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/limits.h"

enum { MAX_DEPTH = 8, MAX_TEXT = 4096 };

struct xml {
	const char *p, *end;
	const char *path[MAX_DEPTH]; /* open elements' names (not terminated) */
	size_t path_len[MAX_DEPTH];
	int depth;
	bool uploads;     /* a ListMultipartUploads response */
	const char *child; /* a small answer: the root's child wanted */
	char *child_out;   /* its text (size child_size), the root's name */
	size_t child_size;
	char *root;
	size_t root_size;
	bool child_seen;
	const char *what; /* for messages: "S3 listing", "S3 answer" */
	char *key_marker; /* its NextKeyMarker and NextUploadIdMarker */
	char *id_marker;
	struct ckfs_error *err;
};

static enum ckfs_code bad(struct xml *x, const char *what)
{
	return ckfs_fail(x->err, CKFS_E_FORMAT, "%s: %s", x->what ? x->what : "S3 listing", what);
}

/* One UTF-8 character for code point cp into out: its length, 0 if cp is
 * not one a key may hold. */
static size_t utf8(unsigned long cp, char *out)
{
	if (cp == 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | cp >> 6);
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xe0 | cp >> 12);
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | cp >> 18);
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	out[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/* The text from x->p to the next '<', entities decoded, into out. */
static enum ckfs_code text(struct xml *x, char *out, size_t *len)
{
	static const struct { const char *name; char c; } named[] = {
		{ "amp;", '&' }, { "lt;", '<' }, { "gt;", '>' }, { "quot;", '"' }, { "apos;", '\'' },
	};
	size_t n = 0;

	while (x->p < x->end && *x->p != '<') {
		char c[4];
		size_t k = 1;
		if (*x->p != '&') {
			c[0] = *x->p++;
		} else {
			const char *semi = memchr(x->p, ';', (size_t)(x->end - x->p));
			size_t i;
			if (!semi || semi - x->p > 12)
				return bad(x, "an entity that does not end");
			for (i = 0; i < sizeof(named) / sizeof(named[0]); i++)
				if ((size_t)(semi + 1 - (x->p + 1)) == strlen(named[i].name) &&
				    memcmp(x->p + 1, named[i].name, strlen(named[i].name)) == 0)
					break;
			if (i < sizeof(named) / sizeof(named[0])) {
				c[0] = named[i].c;
			} else if (x->p[1] == '#') {
				int hex = x->p[2] == 'x';
				char *stop;
				errno = 0;
				unsigned long cp = strtoul(x->p + 2 + hex, &stop, hex ? 16 : 10);
				if (stop != semi || stop == x->p + 2 + hex || errno ||
				    !(k = utf8(cp, c)))
					return bad(x, "a bad character reference");
			} else {
				return bad(x, "an unknown entity");
			}
			x->p = semi + 1;
		}
		if (n + k >= MAX_TEXT)
			return bad(x, "a value too long");
		memcpy(out + n, c, k);
		n += k;
	}
	out[n] = '\0';
	*len = n;
	return CKFS_OK;
}

static bool in(const struct xml *x, int depth, const char *name)
{
	return x->depth > depth && x->path_len[depth] == strlen(name) &&
	       memcmp(x->path[depth], name, x->path_len[depth]) == 0;
}

/* Room for one more element of an array that doubles (a listing of
 * 300,000 keys once took one realloc each). */
static bool grow(void **v, size_t *cap, size_t n, size_t elem)
{
	if (n < *cap)
		return true;
	size_t nc = *cap ? 2 * *cap : 64;
	void *p = realloc(*v, nc * elem);
	if (!p)
		return false;
	*v = p;
	*cap = nc;
	return true;
}

static enum ckfs_code add_object(struct xml *x, struct ckfs_s3_listing *l)
{
	if (l->n_objects >= CKFS_S3_MAX_KEYS)
		return ckfs_fail(x->err, CKFS_E_LIMIT, "S3 listing: more than %d keys",
				 CKFS_S3_MAX_KEYS);
	if (!grow((void **)&l->objects, &l->cap_objects, l->n_objects, sizeof(*l->objects)))
		return ckfs_nomem(x->err);
	memset(&l->objects[l->n_objects++], 0, sizeof(*l->objects));
	return CKFS_OK;
}

/* ISO 8601 in UTC as S3 writes it, "2026-12-01T21:18:03.000Z" (the
 * fraction optional): seconds since the epoch, or -1. */
static int parse_time(const char *t, struct timespec *out)
{
	struct tm tm = { 0 };
	const char *end = strptime(t, "%Y-%m-%dT%H:%M:%S", &tm);
	long ns = 0;

	if (!end)
		return -1;
	if (*end == '.') {
		long scale = 100000000;
		for (end++; *end >= '0' && *end <= '9'; end++, scale /= 10)
			ns += (*end - '0') * scale;
	}
	if (strcmp(end, "Z") != 0)
		return -1;
	time_t s = timegm(&tm);
	if (s == (time_t)-1)
		return -1;
	out->tv_sec = s;
	out->tv_nsec = ns;
	return 0;
}

/* A leaf's text where it means something: a listed object's Key, Size,
 * ETag or LastModified, a folder's Prefix, whether the listing goes on and from where. */
static enum ckfs_code leaf(struct xml *x, const char *t, size_t n, struct ckfs_s3_listing *l,
			   char **next, bool *truncated)
{
	char *end;

	if (x->child) {
		if (x->depth != 2 || !in(x, 1, x->child))
			return CKFS_OK;
		if (x->child_seen)
			return bad(x, "an element twice");
		if (n >= x->child_size)
			return bad(x, "a value too long");
		memcpy(x->child_out, t, n + 1);
		x->child_seen = true;
	} else if (x->uploads && x->depth == 3 && in(x, 1, "Upload")) {
		struct ckfs_s3_object *o = &l->objects[l->n_objects - 1];
		char **to = in(x, 2, "Key")        ? (char **)&o->key
			    : in(x, 2, "UploadId") ? &o->upload_id
						   : NULL;
		if (to) {
			if (*to || !(*to = strdup(t)))
				return *to ? bad(x, "an upload with two keys or ids")
					   : ckfs_nomem(x->err);
		} else if (in(x, 2, "Initiated") && parse_time(t, &o->mtime) != 0) {
			return bad(x, "a bad Initiated time");
		}
	} else if (x->uploads && x->depth == 2 &&
		   (in(x, 1, "NextKeyMarker") || in(x, 1, "NextUploadIdMarker"))) {
		char **to = in(x, 1, "NextKeyMarker") ? &x->key_marker : &x->id_marker;
		free(*to);
		if (!(*to = strdup(t)))
			return ckfs_nomem(x->err);
	} else if (x->uploads && x->depth == 2 && in(x, 1, "IsTruncated")) {
		*truncated = strcmp(t, "true") == 0;
	} else if (x->uploads) {
		return CKFS_OK;
	} else if (x->depth == 3 && in(x, 1, "Contents")) {
		struct ckfs_s3_object *o = &l->objects[l->n_objects - 1];
		if (in(x, 2, "Key")) {
			if (o->key || !(o->key = strdup(t)))
				return o->key ? bad(x, "an object with two keys") : ckfs_nomem(x->err);
		} else if (in(x, 2, "Size")) {
			errno = 0;
			o->size = strtoull(t, &end, 10);
			if (!n || *end || errno || *t == '-')
				return bad(x, "a bad object size");
		} else if (in(x, 2, "ETag")) {
			if (n + 1 > sizeof(o->etag))
				return bad(x, "an ETag too long");
			memcpy(o->etag, t, n + 1);
		} else if (in(x, 2, "LastModified")) {
			if (parse_time(t, &o->mtime) != 0)
				return bad(x, "a bad LastModified time");
		}
	} else if (x->depth == 3 && in(x, 1, "CommonPrefixes") && in(x, 2, "Prefix")) {
		if (l->n_prefixes >= CKFS_S3_MAX_KEYS)
			return ckfs_fail(x->err, CKFS_E_LIMIT, "S3 listing: more than %d folders",
					 CKFS_S3_MAX_KEYS);
		if (!grow((void **)&l->prefixes, &l->cap_prefixes, l->n_prefixes,
			  sizeof(*l->prefixes)) ||
		    !(l->prefixes[l->n_prefixes] = strdup(t)))
			return ckfs_nomem(x->err);
		l->n_prefixes++;
	} else if (x->depth == 2 && in(x, 1, "IsTruncated")) {
		*truncated = strcmp(t, "true") == 0;
	} else if (x->depth == 2 && in(x, 1, "NextContinuationToken")) {
		free(*next);
		if (!(*next = strdup(t)))
			return ckfs_nomem(x->err);
	}
	return CKFS_OK;
}

/* An element opens: Contents starts an object. */
static enum ckfs_code open_element(struct xml *x, const char *name, size_t len,
				   struct ckfs_s3_listing *l)
{
	if (x->depth == MAX_DEPTH)
		return bad(x, "elements nested too deep");
	const char *root = x->uploads ? "ListMultipartUploadsResult" : "ListBucketResult";
	if (x->depth == 0 && x->child) {
		if (len >= x->root_size)
			return bad(x, "a root element's name too long");
		memcpy(x->root, name, len);
		x->root[len] = '\0';
	} else if (x->depth == 0 && (len != strlen(root) || memcmp(name, root, len) != 0)) {
		return x->uploads ? bad(x, "not a ListMultipartUploadsResult")
				  : bad(x, "not a ListBucketResult");
	}
	x->path[x->depth] = name;
	x->path_len[x->depth++] = len;
	if (!x->child && x->depth == 2 && in(x, 1, x->uploads ? "Upload" : "Contents"))
		return add_object(x, l);
	return CKFS_OK;
}

static enum ckfs_code parse(struct xml *x, struct ckfs_s3_listing *l, char **next,
			    bool *truncated)
{
	char t[MAX_TEXT];
	size_t n = 0;
	bool seen_root = false;

	while (x->p < x->end) {
		if (*x->p != '<') {
			CKFS_TRY(text(x, t, &n));
			continue;
		}
		const char *gt = memchr(x->p, '>', (size_t)(x->end - x->p));
		if (!gt)
			return bad(x, "a tag that does not end");
		const char *name = x->p + 1;
		x->p = gt + 1;
		if (*name == '?' && !seen_root) {
			continue; /* the XML declaration */
		} else if (*name == '!' || *name == '?') {
			return bad(x, "XML ckfs does not read (comments, CDATA, declarations)");
		} else if (*name == '/') {
			size_t len = (size_t)(gt - name - 1);
			if (x->depth == 0 || x->path_len[x->depth - 1] != len ||
			    memcmp(x->path[x->depth - 1], name + 1, len) != 0)
				return bad(x, "an element closed that is not open");
			CKFS_TRY(leaf(x, t, n, l, next, truncated));
			x->depth--;
			n = 0;
			t[0] = '\0';
		} else {
			size_t len = strcspn(name, " \t\r\n/>");
			if (len == 0 || name + len > gt)
				return bad(x, "a tag without a name");
			if (seen_root && x->depth == 0)
				return bad(x, "two root elements");
			seen_root = true;
			CKFS_TRY(open_element(x, name, len, l));
			if (gt[-1] == '/')
				x->depth--; /* <Empty/> */
			n = 0;
			t[0] = '\0';
		}
	}
	if (x->depth || !seen_root)
		return bad(x, "the document ends inside an element");
	return CKFS_OK;
}

enum ckfs_code ckfs_s3_parse_listing(const char *xml, size_t len, struct ckfs_s3_listing *out,
				     char **next, struct ckfs_error *err)
{
	struct xml x = { .p = xml, .end = xml + len, .err = err };
	bool truncated = false;
	size_t before = out->n_objects;

	*next = NULL;
	enum ckfs_code rc = parse(&x, out, next, &truncated);
	for (size_t i = before; rc == CKFS_OK && i < out->n_objects; i++)
		if (!out->objects[i].key)
			rc = bad(&x, "an object without a key");
	if (rc == CKFS_OK && truncated != (*next != NULL))
		rc = bad(&x, truncated ? "truncated without a continuation token"
				       : "a continuation token on a complete listing");
	if (rc != CKFS_OK) {
		free(*next);
		*next = NULL;
	}
	return rc;
}

enum ckfs_code ckfs_s3_parse_uploads(const char *xml, size_t len, struct ckfs_s3_listing *out,
				     char **next, struct ckfs_error *err)
{
	struct xml x = { .p = xml, .end = xml + len, .uploads = true, .err = err };
	bool truncated = false;
	size_t before = out->n_objects;

	*next = NULL;
	enum ckfs_code rc = parse(&x, out, next, &truncated);
	for (size_t i = before; rc == CKFS_OK && i < out->n_objects; i++)
		if (!out->objects[i].key || !out->objects[i].upload_id)
			rc = bad(&x, "an upload without a key or an id");
	if (rc == CKFS_OK && truncated) {
		if (!x.key_marker || !x.id_marker)
			rc = bad(&x, "truncated without its markers");
		else if (asprintf(next, "%s\n%s", x.key_marker, x.id_marker) < 0)
			rc = ckfs_nomem(err), *next = NULL;
	}
	free(x.key_marker);
	free(x.id_marker);
	return rc;
}

enum ckfs_code ckfs_s3_parse_child(const char *xml, size_t len, const char *child, char *root,
				   size_t root_size, char *out, size_t size, struct ckfs_error *err)
{
	struct xml x = { .p = xml ? xml : "",
			 .end = xml ? xml + len : "",
			 .child = child,
			 .child_out = out,
			 .child_size = size,
			 .root = root,
			 .root_size = root_size,
			 .what = "S3 answer",
			 .err = err };
	struct ckfs_s3_listing none = { 0 };
	bool truncated = false;
	char *next = NULL;

	out[0] = root[0] = '\0';
	enum ckfs_code rc = parse(&x, &none, &next, &truncated);
	free(next); /* no listing's elements are read: stays NULL */
	if (rc != CKFS_OK)
		out[0] = root[0] = '\0';
	return rc;
}

void ckfs_s3_listing_free(struct ckfs_s3_listing *l)
{
	for (size_t i = 0; i < l->n_objects; i++) {
		free((char *)l->objects[i].key);
		free(l->objects[i].upload_id);
	}
	for (size_t i = 0; i < l->n_prefixes; i++)
		free(l->prefixes[i]);
	free(l->objects);
	free(l->prefixes);
	memset(l, 0, sizeof(*l));
}
