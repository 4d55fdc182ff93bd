/* SPDX-License-Identifier: MIT */
/*
 * The S3 requests (include/ckfs/s3.h) over libcurl. Connections are kept
 * in a small pool of easy handles so that any thread reuses a warm one;
 * libcurl signs each request (CURLOPT_AWS_SIGV4). curl 7.88 signs the
 * query string as written, so queries are written already in SigV4's
 * canonical form: names sorted, values percent-encoded.
 */
#include "store/s3_int.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckfs/hash.h"
#include "ckfs/strbuf.h"

enum {
	MAX_LISTING = 16 << 20
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
	curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* Every request's deadline: a floor (CKFS_S3_TIMEOUT seconds, default
 * 30: boto3's read timeout is 60, the AWS CLI's connect timeout 60) plus
 * its length at 512 KiB/s, so a store that trickles (2 B/s: two hours for
 * a 16 KiB block) fails in bounded time and is retried like any failure.
 * A transfer under 1 KiB/s for 20 s fails sooner. */
static long timeout_floor_ms(void)
{
	const char *e = getenv("CKFS_S3_TIMEOUT");
	char *end;
	long floor_s = 30;

	if (e && *e) {
		long v = strtol(e, &end, 10);
		if (!*end && v > 0 && v < 86400)
			floor_s = v;
	}
	return floor_s * 1000;
}

enum ckfs_code ckfs_s3_new(const struct ckfs_s3_config *c, struct ckfs_s3 **out,
			   struct ckfs_error *err)
{
	struct ckfs_s3 *s3;

	pthread_once(&curl_once, curl_init);
	if (curl_init_rc != CURLE_OK)
		return ckfs_fail(err, CKFS_E_IO, "S3: libcurl: %s", curl_easy_strerror(curl_init_rc));
	if (!(s3 = calloc(1, sizeof(*s3))))
		return ckfs_nomem(err);
	s3->cfg = *c;
	if (s3->cfg.max_attempts < 1)
		s3->cfg.max_attempts = 1;
	snprintf(s3->sigv4, sizeof(s3->sigv4), "aws:amz:%s:s3", c->region);
	char ep[600];
	snprintf(s3->identity, sizeof(s3->identity), "%s %s %s",
		 ckfs_url_redact(c->endpoint, ep, sizeof(ep)), c->region,
		 c->addressing == CKFS_S3_VIRTUAL ? "virtual" : "path");
	s3->timeout_floor_ms = timeout_floor_ms();
	pthread_mutex_init(&s3->lock, NULL);
	*out = s3;
	return CKFS_OK;
}

const char *ckfs_s3_identity(const struct ckfs_s3 *s3)
{
	return s3->identity;
}

void ckfs_s3_free(struct ckfs_s3 *s3)
{
	if (!s3)
		return;
	for (int i = 0; i < s3->n_idle; i++)
		curl_easy_cleanup(s3->idle[i]);
	pthread_mutex_destroy(&s3->lock);
	free(s3);
}

void ckfs_s3_counts(const struct ckfs_s3 *s3, struct ckfs_s3_counts *out)
{
	out->requests = atomic_load(&s3->requests);
	out->retries = atomic_load(&s3->retries);
	out->bytes = atomic_load(&s3->bytes);
}

static CURL *take(struct ckfs_s3 *s3)
{
	CURL *h = NULL;

	pthread_mutex_lock(&s3->lock);
	if (s3->n_idle)
		h = s3->idle[--s3->n_idle];
	pthread_mutex_unlock(&s3->lock);
	if (h)
		curl_easy_reset(h); /* its connection stays open */
	return h ? h : curl_easy_init();
}

static void give_back(struct ckfs_s3 *s3, CURL *h)
{
	pthread_mutex_lock(&s3->lock);
	if (s3->n_idle < S3_POOL) {
		s3->idle[s3->n_idle++] = h;
		h = NULL;
	}
	pthread_mutex_unlock(&s3->lock);
	if (h)
		curl_easy_cleanup(h);
}

/* s percent-encoded as SigV4 wants: unreserved characters kept, and '/'
 * too when keep_slash (a key's path), everything else %XX. */
void s3_encode(struct ckfs_strbuf *b, const char *s, bool keep_slash)
{
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		    c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/'))
			ckfs_strbuf_put(b, (const char *)&c, 1);
		else
			ckfs_strbuf_fmt(b, "%%%02X", c);
	}
}

/* The object's (or with key "" the bucket's) URL by the addressing style. */
void s3_object_url(const struct ckfs_s3 *s3, struct ckfs_strbuf *b, const char *bucket,
		   const char *key)
{
	const char *ep = s3->cfg.endpoint, *host = strstr(ep, "://") + 3;

	if (s3->cfg.addressing == CKFS_S3_VIRTUAL)
		ckfs_strbuf_fmt(b, "%.*s%s.%s/", (int)(host - ep), ep, bucket, host);
	else
		ckfs_strbuf_fmt(b, "%s/%s%s", ep, bucket, *key ? "/" : "");
	s3_encode(b, key, true);
}

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
	struct reply *r = arg;
	size_t len = size * n;
	long status = 0;

	curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &status);
	if (status < 200 || status > 299) {
		size_t k = sizeof(r->error) - 1 - r->error_len;
		memcpy(r->error + r->error_len, data, len < k ? len : k);
		r->error_len += len < k ? len : k;
		r->error[r->error_len] = '\0';
		return len;
	}
	if (r->len + len > r->cap) {
		r->overflow = true;
		return 0; /* stops the transfer */
	}
	if (r->grow) {
		char *p = realloc(r->buf, r->len + len + 1);
		if (!p) {
			r->overflow = true;
			return 0;
		}
		r->buf = p;
	}
	memcpy(r->buf + r->len, data, len);
	r->len += len;
	if (r->grow)
		r->buf[r->len] = '\0';
	return len;
}

/* "Name: value" into out when the header line is name's. */
static void header_value(const char *line, size_t n, const char *name, char *out, size_t size)
{
	size_t k = strlen(name);

	if (n <= k + 1 || strncasecmp(line, name, k) != 0 || line[k] != ':')
		return;
	line += k + 1;
	n -= k + 1;
	while (n && (*line == ' ' || *line == '\t'))
		line++, n--;
	while (n && (line[n - 1] == '\r' || line[n - 1] == '\n' || line[n - 1] == ' '))
		n--;
	if (n < size) {
		memcpy(out, line, n);
		out[n] = '\0';
	}
}

static size_t on_header(char *data, size_t size, size_t n, void *arg)
{
	struct reply *r = arg;

	header_value(data, size * n, "ETag", r->etag, sizeof(r->etag));
	header_value(data, size * n, "Content-Range", r->content_range, sizeof(r->content_range));
	header_value(data, size * n, "Content-Length", r->content_length,
		     sizeof(r->content_length));
	header_value(data, size * n, "x-amz-meta-ckfs", r->meta, sizeof(r->meta));
	return size * n;
}

/* A request body sent from memory, from its start at each attempt. */
struct body {
	const char *p;
	size_t len, off;
};

static size_t on_read(char *out, size_t size, size_t n, void *arg)
{
	struct body *b = arg;
	size_t k = size * n < b->len - b->off ? size * n : b->len - b->off;

	memcpy(out, b->p + b->off, k);
	b->off += k;
	return k;
}

static int on_seek(void *arg, curl_off_t off, int origin)
{
	struct body *b = arg;

	if (origin != SEEK_SET || off < 0 || (uint64_t)off > b->len)
		return CURL_SEEKFUNC_CANTSEEK;
	b->off = (size_t)off;
	return CURL_SEEKFUNC_OK;
}

/* The method, body and headers of a request that writes. */
static struct curl_slist *set_body(CURL *h, const struct request *req, struct body *b,
				   struct curl_slist *hdr)
{
	for (const char *const *x = req->headers; x && *x; x++)
		hdr = curl_slist_append(hdr, *x);
	if (req->body) {
		*b = (struct body){ .p = req->body, .len = req->body_len };
		curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(h, CURLOPT_READDATA, b);
		curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
		curl_easy_setopt(h, CURLOPT_SEEKDATA, b);
		curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)req->body_len);
		/* the body is checked by its Content-MD5, not signed (as the
		 * AWS CLI sends parts); no 100-continue round trip */
	} else if (req->method && strcmp(req->method, "POST") == 0) {
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
	}
	if (req->method)
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
	return hdr;
}

static bool retryable(CURLcode cc, long status)
{
	switch (cc) {
	case CURLE_OK:
		return status >= 500 || status == 429;
	case CURLE_COULDNT_CONNECT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_PARTIAL_FILE:
	case CURLE_GOT_NOTHING:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SSL_CONNECT_ERROR:
		return true;
	default:
		return false;
	}
}

/* Full jitter: a random wait up to cap, the cap doubling each attempt. */
static void backoff(const struct ckfs_s3 *s3, int attempt)
{
	unsigned cap = s3->cfg.backoff_ms << (attempt < 10 ? attempt : 10);
	unsigned seed = (unsigned)time(NULL) ^ (unsigned)(uintptr_t)&attempt;
	unsigned ms = cap ? (unsigned)rand_r(&seed) % (cap > 20000 ? 20000 : cap) : 0;
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/* The S3 error code of an error body ("<Code>NoSuchKey</Code>"). */
void s3_error_code(const struct reply *r, char *out, size_t size)
{
	const char *c, *e;

	out[0] = '\0';
	if ((c = strstr(r->error, "<Code>")) && (e = strstr(c, "</Code>")) &&
	    (size_t)(e - c - 6) < size) {
		memcpy(out, c + 6, (size_t)(e - c - 6));
		out[e - c - 6] = '\0';
	}
}

/* A request's deadline (see timeout_floor_ms). */
static long deadline_ms(const struct ckfs_s3 *s3, size_t expect)
{
	return s3->timeout_floor_ms + (long)(expect / 512);
}

/* A ranged GET answered 200 with the whole object: a store (or proxy)
 * that does not do ranges, which ckfs needs for every read. */
static enum ckfs_code ignored_range(const struct request *req, struct ckfs_error *err)
{
	return ckfs_fail(err, CKFS_E_UNSUPPORTED, "s3://%s/%s: the store ignored the Range "
			 "header (HTTP 200 with the whole object, not 206 with %s): ranged "
			 "reads are needed", req->bucket, req->key, req->range);
}

/* Send req until it succeeds or may not be retried: the HTTP status, or
 * a failure recorded in err. An error's body goes to a buffer of its own
 * so that it never lands in the caller's. */
enum ckfs_code s3_perform(struct ckfs_s3 *s3, const struct request *req, struct reply *r,
			  long *status, struct ckfs_error *err)
{
	char range[96], if_match[128], token[2100], why[CURL_ERROR_SIZE];
	struct body body;
	CURLcode cc = CURLE_OK;
	size_t start = r->len;

	for (int attempt = 0;; attempt++) {
		CURL *h = take(s3);
		struct curl_slist *hdr = NULL;
		if (!h)
			return ckfs_nomem(err);
		curl_easy_setopt(h, CURLOPT_URL, req->url);
		/* curl's own account of a failure ("Rejected 307200 bytes
		 * header"), more than curl_easy_strerror's "Out of memory" */
		why[0] = '\0';
		curl_easy_setopt(h, CURLOPT_ERRORBUFFER, why);
		curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
		curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
		curl_easy_setopt(h, CURLOPT_TIMEOUT_MS,
				 deadline_ms(s3, req->expect + req->body_len));
		curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L); /* a stalled read fails */
		curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 20L);
		curl_easy_setopt(h, CURLOPT_NOBODY, req->head ? 1L : 0L);
		curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
		curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
		curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
		curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
		if (!s3->cfg.anonymous) {
			curl_easy_setopt(h, CURLOPT_AWS_SIGV4, s3->sigv4);
			curl_easy_setopt(h, CURLOPT_USERNAME, s3->cfg.access_key);
			curl_easy_setopt(h, CURLOPT_PASSWORD, s3->cfg.secret_key);
		}
		if (req->range) {
			snprintf(range, sizeof(range), "Range: %s", req->range);
			hdr = curl_slist_append(hdr, range);
		}
		if (req->if_match) {
			snprintf(if_match, sizeof(if_match), "If-Match: %s", req->if_match);
			hdr = curl_slist_append(hdr, if_match);
		}
		if (s3->cfg.session_token[0]) {
			snprintf(token, sizeof(token), "x-amz-security-token: %s",
				 s3->cfg.session_token);
			hdr = curl_slist_append(hdr, token);
		}
		hdr = set_body(h, req, &body, hdr);
		curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
		r->h = h;
		r->len = start;
		r->overflow = false;
		r->etag[0] = r->content_range[0] = r->content_length[0] = r->error[0] = r->meta[0] =
			'\0';
		r->error_len = 0;
		*status = 0;
		atomic_fetch_add(&s3->requests, 1);
		cc = curl_easy_perform(h);
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
		curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL); /* why[] is this frame's */
		curl_slist_free_all(hdr);
		give_back(s3, h);
		atomic_fetch_add(&s3->bytes, r->len - start);
		if (cc == CURLE_WRITE_ERROR && r->overflow && req->range && *status == 200)
			return ignored_range(req, err);
		if (cc == CURLE_WRITE_ERROR && r->overflow)
			return ckfs_fail(err, CKFS_E_LIMIT, "s3://%s/%s: the answer is longer "
					 "than asked for", req->bucket, req->key);
		if (!retryable(cc, *status) || attempt + 1 >= s3->cfg.max_attempts)
			break;
		atomic_fetch_add(&s3->retries, 1);
		backoff(s3, attempt);
	}
	if (cc == CURLE_OUT_OF_MEMORY && !why[0]) /* what curl 7.88 says of huge headers */
		return ckfs_fail(err, CKFS_E_IO, "s3://%s/%s: the answer could not be held: its "
				 "headers are over curl's 100 KiB, or memory ran out", req->bucket,
				 req->key);
	if (cc != CURLE_OK)
		return ckfs_fail(err, CKFS_E_IO, "s3://%s/%s: %s", req->bucket, req->key,
				 why[0] ? why : curl_easy_strerror(cc));
	return CKFS_OK;
}

/* A status other than success as a failure. */
enum ckfs_code s3_status_error(const struct request *req, long status, const char *code,
			       struct ckfs_error *err)
{
	const char *b = req->bucket, *k = req->key;

	switch (status) {
	case 404:
		return ckfs_fail(err, CKFS_E_NOTFOUND, "s3://%s/%s: not found%s%s", b, k,
				 *code ? ": " : "", code);
	case 412:
		return ckfs_fail(err, CKFS_E_CHANGED, "s3://%s/%s: object changed since it "
				 "was opened (its ETag is no longer %s)", b, k, req->if_match);
	case 416:
		return ckfs_fail(err, CKFS_E_TRUNCATED, "s3://%s/%s: range %s is past the "
				 "object's end", b, k, req->range);
	default:
		return ckfs_fail(err, CKFS_E_IO, "s3://%s/%s: HTTP %ld%s%s", b, k, status,
				 *code ? " " : "", code);
	}
}

enum ckfs_code ckfs_s3_head(struct ckfs_s3 *s3, const char *bucket, const char *key,
			    struct ckfs_s3_object *out, struct ckfs_error *err)
{
	struct ckfs_strbuf url = { 0 };
	struct reply r = { 0 };
	struct request req = { .bucket = bucket, .key = key, .head = true };
	char *end;
	long status;
	enum ckfs_code rc;

	s3_object_url(s3, &url, bucket, key);
	if (url.failed)
		return ckfs_nomem(err);
	req.url = url.p;
	rc = s3_perform(s3, &req, &r, &status, err);
	free(url.p);
	CKFS_TRY(rc);
	if (status != 200)
		return s3_status_error(&req, status, "", err);
	memset(out, 0, sizeof(*out));
	out->key = key;
	out->size = strtoull(r.content_length, &end, 10);
	if (!r.content_length[0] || *end)
		return ckfs_fail(err, CKFS_E_FORMAT, "s3://%s/%s: no object size in the "
				 "answer", bucket, key);
	if (!r.etag[0])
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "s3://%s/%s: the store sent no "
				 "ETag, so a changed object could not be told", bucket, key);
	memcpy(out->etag, r.etag, sizeof(out->etag));
	memcpy(out->meta, r.meta, sizeof(out->meta));
	return CKFS_OK;
}

enum ckfs_code ckfs_s3_get(struct ckfs_s3 *s3, const char *bucket,
			   const struct ckfs_s3_object *o, uint64_t off, size_t len, void *buf,
			   struct ckfs_error *err)
{
	const char *key = o->key, *etag = o->etag[0] ? o->etag : NULL;
	struct ckfs_strbuf url = { 0 };
	struct reply r = { .buf = buf, .cap = len };
	char range[64], want[96];
	struct request req = { .bucket = bucket, .key = key, .range = range, .if_match = etag,
			       .expect = len };
	long status;
	enum ckfs_code rc;

	if (len == 0)
		return CKFS_OK;
	snprintf(range, sizeof(range), "bytes=%llu-%llu", (unsigned long long)off,
		 (unsigned long long)(off + len - 1));
	s3_object_url(s3, &url, bucket, key);
	if (url.failed)
		return ckfs_nomem(err);
	req.url = url.p;
	rc = s3_perform(s3, &req, &r, &status, err);
	if (rc == CKFS_OK && status == 200)
		rc = ignored_range(&req, err);
	else if (rc == CKFS_OK && status != 206) {
		char code[64];
		s3_error_code(&r, code, sizeof(code));
		rc = s3_status_error(&req, status, code, err);
	}
	free(url.p);
	CKFS_TRY(rc);
	/* The store must have sent exactly the range asked for. */
	snprintf(want, sizeof(want), "bytes %llu-%llu/", (unsigned long long)off,
		 (unsigned long long)(off + len - 1));
	if (strncmp(r.content_range, want, strlen(want)) != 0 || r.len != len)
		return ckfs_fail(err, CKFS_E_TRUNCATED, "s3://%s/%s: asked for %s, got %zu "
				 "bytes (%s)", bucket, key, range, r.len,
				 r.content_range[0] ? r.content_range : "no Content-Range");
	if (etag && r.etag[0] && strcmp(r.etag, etag) != 0)
		return ckfs_fail(err, CKFS_E_CHANGED, "s3://%s/%s: object changed since it "
				 "was opened (ETag %s, not %s)", bucket, key, r.etag, etag);
	return CKFS_OK;
}

/* Whether token was seen before on this listing (its hash among seen[0..n)):
 * a store that hands out a token twice would list forever. */
static bool token_repeats(uint64_t *seen, size_t n, const char *token)
{
	uint64_t h = ckfs_fnv1a(CKFS_FNV1A_START, token, strlen(token));

	for (size_t i = 0; i < n; i++)
		if (seen[i] == h)
			return true;
	seen[n] = h;
	return false;
}

enum ckfs_code ckfs_s3_list(struct ckfs_s3 *s3, const char *bucket, const char *prefix,
			    bool folders, struct ckfs_s3_listing *out, struct ckfs_error *err)
{
	char *token = NULL;
	enum ckfs_code rc = CKFS_OK;
	uint64_t *seen = malloc(CKFS_S3_MAX_PAGES * sizeof(*seen));
	size_t pages = 0;

	memset(out, 0, sizeof(*out));
	if (!seen)
		return ckfs_nomem(err);
	do {
		struct ckfs_strbuf url = { 0 };
		struct reply r = { .cap = MAX_LISTING, .grow = true };
		struct request req = { .bucket = bucket, .key = prefix, .expect = 1 << 20 };
		long status;
		/* SigV4's canonical query: names in order, values encoded. */
		s3_object_url(s3, &url, bucket, "");
		ckfs_strbuf_str(&url, "?");
		if (token) {
			ckfs_strbuf_str(&url, "continuation-token=");
			s3_encode(&url, token, false);
			ckfs_strbuf_str(&url, "&");
		}
		if (folders)
			ckfs_strbuf_str(&url, "delimiter=%2F&");
		ckfs_strbuf_str(&url, "list-type=2&prefix=");
		s3_encode(&url, prefix, false);
		free(token);
		token = NULL;
		if (url.failed) {
			rc = ckfs_nomem(err);
			break;
		}
		req.url = url.p;
		rc = s3_perform(s3, &req, &r, &status, err);
		if (rc == CKFS_OK && status != 200) {
			char code[64];
			s3_error_code(&r, code, sizeof(code));
			rc = s3_status_error(&req, status, code, err);
		}
		if (rc == CKFS_OK) {
			struct ckfs_error why;
			ckfs_error_clear(&why);
			rc = ckfs_s3_parse_listing(r.buf ? r.buf : "", r.len, out, &token, &why);
			if (rc != CKFS_OK) /* which listing, in a message about its XML */
				rc = ckfs_fail(err, rc, "s3://%s/%s: %s (page %zu)", bucket, prefix,
					       why.msg, pages + 1);
		}
		free(r.buf);
		free(url.p);
		pages++;
		if (rc == CKFS_OK && token && pages >= CKFS_S3_MAX_PAGES)
			rc = ckfs_fail(err, CKFS_E_LIMIT, "s3://%s/%s: the listing goes on past %d "
				       "pages", bucket, prefix, CKFS_S3_MAX_PAGES);
		else if (rc == CKFS_OK && token && token_repeats(seen, pages - 1, token))
			rc = ckfs_fail(err, CKFS_E_FORMAT, "s3://%s/%s: the store repeats a "
				       "continuation token (page %zu): a listing that never ends",
				       bucket, prefix, pages);
	} while (rc == CKFS_OK && token);
	free(token);
	free(seen);
	if (rc != CKFS_OK)
		ckfs_s3_listing_free(out);
	return rc;
}
