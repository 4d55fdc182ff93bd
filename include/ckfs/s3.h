/* SPDX-License-Identifier: MIT */
/*
 * An S3 client of the few requests ckfs needs (HEAD, ranged GET,
 * ListObjectsV2), over libcurl, which signs them itself (SigV4). Works
 * with AWS S3 and S3-compatible stores (Ceph RGW, MinIO, SeaweedFS, GCS's
 * S3 API). Settings come the way every S3 tool takes them (see
 * ckfs_s3_config_load).
 *
 * Never mixed bytes: a ranged GET names the ETag its object had when it
 * was looked at (If-Match), so an object replaced meanwhile fails with
 * CKFS_E_CHANGED instead of serving bytes of two versions. 5xx, 429 and
 * dropped connections are retried with capped exponential backoff and full
 * jitter; what still fails is one error line. Thread-safe: each thread
 * keeps its own connection.
 */
#ifndef CKFS_S3_H
#define CKFS_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "ckfs/err.h"

enum ckfs_s3_addressing {
	CKFS_S3_AUTO,    /* path style with a custom endpoint, else virtual */
	CKFS_S3_PATH,    /* https://endpoint/bucket/key */
	CKFS_S3_VIRTUAL, /* https://bucket.endpoint/key */
};

struct ckfs_s3_config {
	char endpoint[512];   /* scheme://host[:port], no trailing slash */
	char region[64];
	char access_key[256], secret_key[256], session_token[2048];
	bool anonymous;       /* no credentials: unsigned requests */
	enum ckfs_s3_addressing addressing;
	int max_attempts;     /* per request, retries included (>= 1) */
	unsigned backoff_ms;  /* the first retry's cap; doubled each time */
};

/*
 * Settings from the environment, as the AWS CLI and SDKs read them:
 * endpoint: endpoint (when not NULL), else AWS_ENDPOINT_URL_S3, else
 * AWS_ENDPOINT_URL, else https://s3.<region>.amazonaws.com; region:
 * AWS_REGION, else AWS_DEFAULT_REGION, else the profile's region in
 * ~/.aws/config (AWS_CONFIG_FILE), else us-east-1; credentials:
 * AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), else
 * the profile (AWS_PROFILE, else "default") in ~/.aws/credentials
 * (AWS_SHARED_CREDENTIALS_FILE); none at all: anonymous requests.
 */
enum ckfs_code ckfs_s3_config_load(struct ckfs_s3_config *c, const char *endpoint,
				   enum ckfs_s3_addressing addressing,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;

/* url with any credentials in it (user:password@ before the host, or
 * X-Amz-Credential/X-Amz-Signature/X-Amz-Security-Token query values)
 * replaced by "***", into out (cut to size): every URL that reaches a
 * message, log line, stats or the process's arguments goes through it. */
const char *ckfs_url_redact(const char *url, char *out, size_t size);

/* "s3://bucket/prefix" into bucket and prefix (without leading slashes):
 * 0, or -1 when url is not an S3 URL with a valid bucket name. */
int ckfs_s3_parse_url(const char *url, char *bucket, size_t bucket_size, const char **key);
/* url starts with "s3://". */
bool ckfs_s3_is_url(const char *path);

struct ckfs_s3;

enum ckfs_code ckfs_s3_new(const struct ckfs_s3_config *c, struct ckfs_s3 **out,
			   struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The store's identity for the disk cache: endpoint (redacted), region and
 * addressing, so two stores with the same bucket, key and ETag never share
 * a block. */
const char *ckfs_s3_identity(const struct ckfs_s3 *s3);
void ckfs_s3_free(struct ckfs_s3 *s3);

struct ckfs_s3_object {
	const char *key;      /* a listing's: malloc'd, freed with it; HEAD's: the caller's */
	uint64_t size;
	char etag[80];        /* quoted, as the store sends it */
	struct timespec mtime; /* LastModified (listings only; 0 unknown); an upload's Initiated */
	char *upload_id;       /* ckfs_s3_uploads' listings only (malloc'd) */
	char meta[96];         /* HEAD: x-amz-meta-ckfs (ckfs_s3_put's meta), "" if none */
};

/* The object's size and ETag (HEAD), out->key = key (not copied):
 * CKFS_E_NOTFOUND when there is none. */
enum ckfs_code ckfs_s3_head(struct ckfs_s3 *s3, const char *bucket, const char *key,
			    struct ckfs_s3_object *out, struct ckfs_error *err) CKFS_WARN_UNUSED;

/* len bytes at off of object o of bucket as it was (o->etag; "": any
 * version) into buf: exactly len, or a failure (CKFS_E_CHANGED when the
 * object is no longer that version, CKFS_E_TRUNCATED past its end). */
enum ckfs_code ckfs_s3_get(struct ckfs_s3 *s3, const char *bucket,
			   const struct ckfs_s3_object *o, uint64_t off, size_t len, void *buf,
			   struct ckfs_error *err) CKFS_WARN_UNUSED;

struct ckfs_s3_listing {
	struct ckfs_s3_object *objects; /* keys under the prefix, key order */
	size_t n_objects, cap_objects;
	char **prefixes;                /* "folders" (ending in the delimiter) */
	size_t n_prefixes, cap_prefixes;
};
/* A listing longer than this many pages or keys is refused (a store that
 * never ends it, or a prefix that is not a checkpoint). */
#define CKFS_S3_MAX_PAGES 20000
#define CKFS_S3_MAX_KEYS 2000000

/* Every key under prefix (all pages), with delimiter '/' when folders is
 * set: the immediate children only, their folders in prefixes. */
enum ckfs_code ckfs_s3_list(struct ckfs_s3 *s3, const char *bucket, const char *prefix,
			    bool folders, struct ckfs_s3_listing *out,
			    struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_s3_listing_free(struct ckfs_s3_listing *l);

/* ---- Writing (s3_write.c) ----
 * Every body goes with its Content-MD5, which the store checks; a part's
 * and a whole multipart object's ETag are checked against the MD5s sent
 * where the store makes them of MD5s (AWS without KMS, SeaweedFS, MinIO).
 * meta, where a call takes it, is stored as the object's x-amz-meta-ckfs
 * (ASCII, under 90 bytes; NULL: none). */

/* An object of len bytes (one request: up to 5 GiB). */
enum ckfs_code ckfs_s3_put(struct ckfs_s3 *s3, const char *bucket, const char *key,
			   const void *data, size_t len, const char *meta,
			   struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Remove an object (gone already: success). */
enum ckfs_code ckfs_s3_delete(struct ckfs_s3 *s3, const char *bucket, const char *key,
			      struct ckfs_error *err) CKFS_WARN_UNUSED;

/* A multipart upload: start it (*id malloc'd), send parts 1..n (each but
 * the last at least 5 MiB; any order, from any thread), then finish it
 * (the object appears whole) or abort it (the parts are dropped). */
struct ckfs_s3_part {
	char etag[80]; /* as the store answered */
	unsigned char md5[16];
};
enum ckfs_code ckfs_s3_upload_start(struct ckfs_s3 *s3, const char *bucket, const char *key,
				    const char *meta, char **id,
				    struct ckfs_error *err) CKFS_WARN_UNUSED;
enum ckfs_code ckfs_s3_upload_part(struct ckfs_s3 *s3, const char *bucket, const char *key,
				   const char *id, unsigned number, const void *data, size_t len,
				   struct ckfs_s3_part *out,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;
enum ckfs_code ckfs_s3_upload_finish(struct ckfs_s3 *s3, const char *bucket, const char *key,
				     const char *id, const struct ckfs_s3_part *parts, unsigned n,
				     struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Gone already (finished or aborted): success. */
enum ckfs_code ckfs_s3_upload_abort(struct ckfs_s3 *s3, const char *bucket, const char *key,
				    const char *id, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The multipart uploads open under prefix: objects with key, upload_id
 * and mtime (when it was started); freed with ckfs_s3_listing_free. */
enum ckfs_code ckfs_s3_uploads(struct ckfs_s3 *s3, const char *bucket, const char *prefix,
			       struct ckfs_s3_listing *out,
			       struct ckfs_error *err) CKFS_WARN_UNUSED;

/* Requests sent and retried, bytes received: for stats and tests. */
struct ckfs_s3_counts {
	uint64_t requests, retries, bytes;
};
void ckfs_s3_counts(const struct ckfs_s3 *s3, struct ckfs_s3_counts *out);

/* Parse a ListObjectsV2 response body (s3_list.c; here for the tests):
 * appends to out; *next gets the continuation token (malloc'd) when the
 * listing is truncated, else NULL. */
enum ckfs_code ckfs_s3_parse_listing(const char *xml, size_t len,
				     struct ckfs_s3_listing *out, char **next,
				     struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The same for a ListMultipartUploads response; *next gets
 * "KEY-MARKER\nUPLOAD-ID-MARKER" when it goes on. */
enum ckfs_code ckfs_s3_parse_uploads(const char *xml, size_t len, struct ckfs_s3_listing *out,
				     char **next, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* A small XML answer of the store (InitiateMultipartUploadResult,
 * CompleteMultipartUploadResult, Error), read as strictly as a listing:
 * its root element's name into root, the text of the root's child
 * element `child` (entities decoded) into out, "" where it has none.
 * CKFS_E_FORMAT for XML ckfs does not read, or the child twice. */
enum ckfs_code ckfs_s3_parse_child(const char *xml, size_t len, const char *child, char *root,
				   size_t root_size, char *out, size_t size,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
