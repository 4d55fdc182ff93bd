/* SPDX-License-Identifier: MIT */
/* What the S3 client's files share (s3.c: the connection pool and
 * perform(); s3_write.c: the requests that write). Not installed. */
#ifndef CKFS_STORE_S3_INT_H
#define CKFS_STORE_S3_INT_H

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "ckfs/s3.h"
#include "ckfs/strbuf.h"

enum {
	S3_POOL = 64
};

struct ckfs_s3 {
	struct ckfs_s3_config cfg;
	char sigv4[128];
	char identity[700];
	long timeout_floor_ms; /* CKFS_S3_TIMEOUT, read once (deadline_ms) */
	pthread_mutex_t lock;
	CURL *idle[S3_POOL];
	int n_idle;
	_Atomic uint64_t requests, retries, bytes;
};

/* One request's answer. */
struct reply {
	CURL *h;
	char *buf; /* where a successful body goes */
	size_t cap, len;
	bool grow; /* buf is malloc'd and may grow up to cap */
	bool overflow;
	char etag[80];
	char content_range[96];
	char content_length[24];
	char meta[96];    /* x-amz-meta-ckfs */
	char error[1024]; /* an error's body (its start), never in buf */
	size_t error_len;
};

struct request {
	const char *bucket, *key; /* for messages */
	const char *url;
	bool head;
	const char *range, *if_match;
	size_t expect;      /* bytes the answer should carry, for its deadline */
	const char *method; /* NULL: GET (HEAD with head) */
	const void *body;   /* sent as is (body_len bytes), or NULL */
	size_t body_len;
	const char *const *headers; /* more header lines, NULL-terminated, or NULL */
};

/* Send req until it succeeds or may not be retried: the HTTP status in
 * *status, or a failure in err. */
enum ckfs_code s3_perform(struct ckfs_s3 *s3, const struct request *req, struct reply *r,
			  long *status, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The object's (key "": the bucket's) URL by the addressing style. */
void s3_object_url(const struct ckfs_s3 *s3, struct ckfs_strbuf *b, const char *bucket,
		   const char *key);
/* s percent-encoded as SigV4 wants ('/' kept when keep_slash). */
void s3_encode(struct ckfs_strbuf *b, const char *s, bool keep_slash);
/* The S3 error code of an error body ("<Code>NoSuchKey</Code>"). */
void s3_error_code(const struct reply *r, char *out, size_t size);
/* A status other than success as a failure. */
enum ckfs_code s3_status_error(const struct request *req, long status, const char *code,
			       struct ckfs_error *err);

#endif
