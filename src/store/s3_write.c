/* SPDX-License-Identifier: MIT */
/*
 * The S3 requests that write (include/ckfs/s3.h): PUT, DELETE and the
 * multipart upload's five. Each body is sent with its Content-MD5, so the
 * store refuses bytes damaged on the way; what the store answers is
 * checked too where it can be (a part's ETag is its MD5 on stores without
 * KMS; a multipart object's is the MD5 of the parts' MD5s, "-N").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/md5.h"
#include "store/s3_int.h"

enum {
	MAX_ANSWER = 1 << 20
};

static void hex(const unsigned char *b, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* Content-MD5's value: base64 of the digest. */
static void base64_md5(const unsigned char d[16], char out[25])
{
	static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t o = 0;

	for (size_t i = 0; i < 16; i += 3) {
		unsigned v = (unsigned)d[i] << 16 | (i + 1 < 16 ? (unsigned)d[i + 1] << 8 : 0) |
			     (i + 2 < 16 ? d[i + 2] : 0);
		out[o++] = a[v >> 18 & 63];
		out[o++] = a[v >> 12 & 63];
		out[o++] = i + 1 < 16 ? a[v >> 6 & 63] : '=';
		out[o++] = i + 2 < 16 ? a[v & 63] : '=';
	}
	out[o] = '\0';
}

/* An ETag that is a plain MD5 ("\"<32 hex>\""), into d: whether it is. */
static bool etag_md5(const char *etag, unsigned char d[16])
{
	if (strlen(etag) != 34 || etag[0] != '"' || etag[33] != '"')
		return false;
	for (int i = 0; i < 16; i++) {
		unsigned v;
		if (sscanf(etag + 1 + 2 * i, "%2x", &v) != 1)
			return false;
		d[i] = (unsigned char)v;
	}
	return strspn(etag + 1, "0123456789abcdefABCDEF") == 32;
}

/* key's URL with a query (already in SigV4's canonical order). */
static char *url_of(struct ckfs_s3 *s3, const char *bucket, const char *key, const char *query)
{
	struct ckfs_strbuf b = { 0 };

	s3_object_url(s3, &b, bucket, key);
	if (query)
		ckfs_strbuf_fmt(&b, "?%s", query);
	if (b.failed) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

/* Send req to url; an answer other than `ok` (or also `ok2`) fails. */
static enum ckfs_code send_checked(struct ckfs_s3 *s3, struct request *req, char *url,
				   struct reply *r, long ok, long ok2, long *status,
				   struct ckfs_error *err)
{
	enum ckfs_code rc;

	if (!url)
		return ckfs_nomem(err);
	req->url = url;
	rc = s3_perform(s3, req, r, status, err);
	if (rc == CKFS_OK && *status != ok && *status != ok2) {
		char code[64];
		s3_error_code(r, code, sizeof(code));
		rc = s3_status_error(req, *status, code, err);
	}
	free(url);
	return rc;
}

static enum ckfs_code check_meta(const char *meta, char *line, size_t size, struct ckfs_error *err)
{
	line[0] = '\0';
	if (!meta)
		return CKFS_OK;
	for (const char *c = meta; *c; c++)
		if (*c < 0x20 || *c > 0x7e)
			return ckfs_fail(err, CKFS_E_INVALID,
					 "S3: metadata '%s' is not printable "
					 "ASCII",
					 meta);
	if ((size_t)snprintf(line, size, "x-amz-meta-ckfs: %s", meta) >= size)
		return ckfs_fail(err, CKFS_E_INVALID, "S3: metadata '%s' is too long", meta);
	return CKFS_OK;
}

/* Send data to url (a PUT of an object or a part), Content-MD5 with it;
 * out gets the store's ETag and the MD5, checked against each other. */
static enum ckfs_code put_body(struct ckfs_s3 *s3, const char *bucket, const char *key, char *url,
			       const void *data, size_t len, const char *meta,
			       struct ckfs_s3_part *out, struct ckfs_error *err)
{
	char md5_line[64], b64[25], meta_line[128];
	unsigned char sent[16];
	struct reply r = { .cap = MAX_ANSWER, .grow = true };
	long status;
	enum ckfs_code rc = check_meta(meta, meta_line, sizeof(meta_line), err);

	if (rc != CKFS_OK) {
		free(url);
		return rc;
	}
	ckfs_md5(data, len, out->md5);
	base64_md5(out->md5, b64);
	snprintf(md5_line, sizeof(md5_line), "Content-MD5: %s", b64);
	const char *headers[] = { md5_line, "Content-Type: application/octet-stream",
				  meta_line[0] ? meta_line : NULL, NULL };
	struct request req = { .bucket = bucket,
			       .key = key,
			       .method = "PUT",
			       .body = data ? data : "",
			       .body_len = len,
			       .headers = headers };
	rc = send_checked(s3, &req, url, &r, 200, 200, &status, err);
	free(r.buf);
	CKFS_TRY(rc);
	if (!r.etag[0])
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "s3://%s/%s: the store sent no ETag for "
				 "what was written",
				 bucket, key);
	if (etag_md5(r.etag, sent) && memcmp(sent, out->md5, 16) != 0)
		return ckfs_fail(err, CKFS_E_IO,
				 "s3://%s/%s: the store holds other bytes than "
				 "were sent (ETag %s)",
				 bucket, key, r.etag);
	memcpy(out->etag, r.etag, sizeof(out->etag));
	return CKFS_OK;
}

enum ckfs_code ckfs_s3_put(struct ckfs_s3 *s3, const char *bucket, const char *key,
			   const void *data, size_t len, const char *meta, struct ckfs_error *err)
{
	struct ckfs_s3_part p;

	return put_body(s3, bucket, key, url_of(s3, bucket, key, NULL), data, len, meta, &p, err);
}

/* DELETE of key (with query, an upload's): gone already is success. */
static enum ckfs_code delete_gone(struct ckfs_s3 *s3, const char *bucket, const char *key,
				  const char *query, struct ckfs_error *err)
{
	struct reply r = { .cap = MAX_ANSWER, .grow = true };
	struct request req = { .bucket = bucket, .key = key, .method = "DELETE" };
	long status;
	enum ckfs_code rc =
		send_checked(s3, &req, url_of(s3, bucket, key, query), &r, 204, 200, &status, err);

	free(r.buf);
	if (rc == CKFS_E_NOTFOUND) {
		ckfs_error_clear(err);
		return CKFS_OK;
	}
	return rc;
}

enum ckfs_code ckfs_s3_delete(struct ckfs_s3 *s3, const char *bucket, const char *key,
			      struct ckfs_error *err)
{
	return delete_gone(s3, bucket, key, NULL, err);
}

enum ckfs_code ckfs_s3_upload_start(struct ckfs_s3 *s3, const char *bucket, const char *key,
				    const char *meta, char **id, struct ckfs_error *err)
{
	char meta_line[128], got[1024], root[64];
	struct reply r = { .cap = MAX_ANSWER, .grow = true };
	struct ckfs_error why;
	long status;

	CKFS_TRY(check_meta(meta, meta_line, sizeof(meta_line), err));
	const char *headers[] = { "Content-Type: application/octet-stream",
				  meta_line[0] ? meta_line : NULL, NULL };
	struct request req = { .bucket = bucket, .key = key, .method = "POST", .headers = headers };
	enum ckfs_code rc = send_checked(s3, &req, url_of(s3, bucket, key, "uploads="), &r, 200,
					 200, &status, err);
	ckfs_error_clear(&why);
	if (rc == CKFS_OK && ckfs_s3_parse_child(r.buf, r.len, "UploadId", root, sizeof(root), got,
						 sizeof(got), &why) != CKFS_OK)
		rc = ckfs_fail(err, CKFS_E_FORMAT,
			       "s3://%s/%s: the answer to starting a multipart upload: %s", bucket,
			       key, why.msg);
	else if (rc == CKFS_OK && (strcmp(root, "InitiateMultipartUploadResult") != 0 || !got[0]))
		rc = ckfs_fail(err, CKFS_E_FORMAT,
			       "s3://%s/%s: no upload id in the store's "
			       "answer to starting a multipart upload",
			       bucket, key);
	free(r.buf);
	CKFS_TRY(rc);
	return (*id = strdup(got)) ? CKFS_OK : ckfs_nomem(err);
}

/* "partNumber=N&uploadId=ID" (canonical: names in order, id encoded). */
static char *part_query(const char *id, unsigned number)
{
	struct ckfs_strbuf b = { 0 };

	if (number)
		ckfs_strbuf_fmt(&b, "partNumber=%u&", number);
	ckfs_strbuf_str(&b, "uploadId=");
	s3_encode(&b, id, false);
	if (b.failed) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

enum ckfs_code ckfs_s3_upload_part(struct ckfs_s3 *s3, const char *bucket, const char *key,
				   const char *id, unsigned number, const void *data, size_t len,
				   struct ckfs_s3_part *out, struct ckfs_error *err)
{
	char *q = part_query(id, number);
	char *url = q ? url_of(s3, bucket, key, q) : NULL;

	free(q);
	if (number < 1 || number > 10000) {
		free(url);
		return ckfs_fail(err, CKFS_E_INVALID, "s3://%s/%s: part %u is not in 1..10000",
				 bucket, key, number);
	}
	return put_body(s3, bucket, key, url, data, len, NULL, out, err);
}

/* The ETag a multipart object of these parts gets on stores that make it
 * of MD5s: "\"<MD5 of the parts' MD5s>-N\"". */
static void multipart_etag(const struct ckfs_s3_part *parts, unsigned n, char out[48])
{
	struct ckfs_md5 m;
	unsigned char d[16];

	ckfs_md5_init(&m);
	for (unsigned i = 0; i < n; i++)
		ckfs_md5_update(&m, parts[i].md5, 16);
	ckfs_md5_final(&m, d);
	out[0] = '"';
	hex(d, 16, out + 1);
	snprintf(out + 33, 15, "-%u\"", n);
}

/* Whether the store's ETag for the whole object says other parts than
 * those sent: only an ETag of the "md5-N" form can tell. */
static bool etag_differs(const char *got, const char *want)
{
	const char *dash = strrchr(got, '-');

	return dash && strlen(got) == strlen(want) && got[0] == '"' &&
	       strspn(got + 1, "0123456789abcdef") == 32 && strcmp(got, want) != 0;
}

enum ckfs_code ckfs_s3_upload_finish(struct ckfs_s3 *s3, const char *bucket, const char *key,
				     const char *id, const struct ckfs_s3_part *parts, unsigned n,
				     struct ckfs_error *err)
{
	struct ckfs_strbuf body = { 0 };
	struct reply r = { .cap = MAX_ANSWER, .grow = true };
	char want[48], got[96], code[64], root[64], *q = part_query(id, 0);
	long status;

	ckfs_strbuf_str(&body, "<CompleteMultipartUpload>");
	for (unsigned i = 0; i < n; i++)
		ckfs_strbuf_fmt(&body, "<Part><PartNumber>%u</PartNumber><ETag>%s</ETag></Part>",
				i + 1, parts[i].etag);
	ckfs_strbuf_str(&body, "</CompleteMultipartUpload>");
	if (body.failed || !q) {
		free(body.p);
		free(q);
		return ckfs_nomem(err);
	}
	const char *headers[] = { "Content-Type: application/xml", NULL };
	struct request req = { .bucket = bucket,
			       .key = key,
			       .method = "POST",
			       .body = body.p,
			       .body_len = body.len,
			       .headers = headers,
			       .expect = 1 << 20 };
	enum ckfs_code rc =
		send_checked(s3, &req, url_of(s3, bucket, key, q), &r, 200, 200, &status, err);
	free(q);
	free(body.p);
	multipart_etag(parts, n, want);
	if (rc == CKFS_E_NOTFOUND) {
		/* A retry after the store finished it but the answer was lost:
		 * the upload is gone, and the object is there when it has the
		 * ETag of these parts. */
		struct ckfs_s3_object o;
		struct ckfs_error why;
		ckfs_error_clear(&why);
		if (ckfs_s3_head(s3, bucket, key, &o, &why) == CKFS_OK &&
		    strcmp(o.etag, want) == 0) {
			ckfs_error_clear(err);
			rc = CKFS_OK;
		}
	} else if (rc == CKFS_OK) {
		/* a 200 may still carry an error that came up while it was
		 * being assembled */
		struct ckfs_error why;
		ckfs_error_clear(&why);
		if (ckfs_s3_parse_child(r.buf, r.len, "Code", root, sizeof(root), code,
					sizeof(code), &why) != CKFS_OK ||
		    (strcmp(root, "CompleteMultipartUploadResult") == 0 &&
		     ckfs_s3_parse_child(r.buf, r.len, "ETag", root, sizeof(root), got, sizeof(got),
					 &why) != CKFS_OK))
			rc = ckfs_fail(err, CKFS_E_IO,
				       "s3://%s/%s: the answer to completing the multipart "
				       "upload: %s",
				       bucket, key, why.msg);
		else if (strcmp(root, "CompleteMultipartUploadResult") != 0 || code[0])
			rc = ckfs_fail(err, CKFS_E_IO,
				       "s3://%s/%s: the multipart upload was not "
				       "completed%s%s",
				       bucket, key, code[0] ? ": " : "", code);
		else if (got[0] && etag_differs(got, want))
			rc = ckfs_fail(err, CKFS_E_IO,
				       "s3://%s/%s: the store assembled other parts "
				       "than were sent (ETag %s, not %s)",
				       bucket, key, got, want);
	}
	free(r.buf);
	return rc;
}

enum ckfs_code ckfs_s3_upload_abort(struct ckfs_s3 *s3, const char *bucket, const char *key,
				    const char *id, struct ckfs_error *err)
{
	char *q = part_query(id, 0);
	enum ckfs_code rc = q ? delete_gone(s3, bucket, key, q, err) : ckfs_nomem(err);

	free(q);
	return rc;
}

enum ckfs_code ckfs_s3_uploads(struct ckfs_s3 *s3, const char *bucket, const char *prefix,
			       struct ckfs_s3_listing *out, struct ckfs_error *err)
{
	char *next = NULL;
	enum ckfs_code rc = CKFS_OK;
	size_t pages = 0;

	memset(out, 0, sizeof(*out));
	do {
		struct ckfs_strbuf q = { 0 };
		struct reply r = { .cap = MAX_ANSWER * 16, .grow = true };
		struct request req = { .bucket = bucket, .key = prefix, .expect = 1 << 20 };
		long status;
		char *nl = next ? strchr(next, '\n') : NULL;
		if (nl) { /* canonical order: key-marker, prefix, upload-id-marker, uploads */
			*nl = '\0';
			ckfs_strbuf_str(&q, "key-marker=");
			s3_encode(&q, next, false);
			ckfs_strbuf_str(&q, "&");
		}
		ckfs_strbuf_str(&q, "prefix=");
		s3_encode(&q, prefix, false);
		if (nl) {
			ckfs_strbuf_str(&q, "&upload-id-marker=");
			s3_encode(&q, nl + 1, false);
		}
		ckfs_strbuf_str(&q, "&uploads=");
		free(next);
		next = NULL;
		rc = q.failed ? ckfs_nomem(err)
			      : send_checked(s3, &req, url_of(s3, bucket, "", q.p), &r, 200, 200,
					     &status, err);
		free(q.p);
		if (rc == CKFS_OK) {
			struct ckfs_error why;
			ckfs_error_clear(&why);
			rc = ckfs_s3_parse_uploads(r.buf ? r.buf : "", r.len, out, &next, &why);
			if (rc != CKFS_OK)
				rc = ckfs_fail(err, rc, "s3://%s/%s: %s (page %zu)", bucket, prefix,
					       why.msg, pages + 1);
		}
		free(r.buf);
		if (rc == CKFS_OK && next && ++pages >= CKFS_S3_MAX_PAGES)
			rc = ckfs_fail(err, CKFS_E_LIMIT,
				       "s3://%s/%s: the uploads' listing goes "
				       "on past %d pages",
				       bucket, prefix, CKFS_S3_MAX_PAGES);
	} while (rc == CKFS_OK && next);
	free(next);
	if (rc != CKFS_OK)
		ckfs_s3_listing_free(out);
	return rc;
}
