/* SPDX-License-Identifier: MIT */
/*
 * The S3 client against a real store (tests/s3/test_s3_client.sh starts
 * SeaweedFS and fills bucket "ckfs-test"): usage: s3_check BUCKET OLD_ETAG FLAKY_ENDPOINT. Settings
 * come from the environment as for ckfs itself; FLAKY_ENDPOINT is
 * tests/s3/flaky_proxy.py in front of the same store.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/s3.h"
#include "test.h"

static const char *bucket;
static struct ckfs_s3 *s3;

/* f.bin holds bytes i % 251 for i in [0, 300000) (made by the script). */
static void test_head_and_ranges(void)
{
	struct ckfs_s3_object o;
	struct ckfs_error err;
	unsigned char buf[70000];

	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_s3_head(s3, bucket, "dir/f.bin", &o, &err), CKFS_OK);
	CHECK(o.size == 300000);
	CHECK(o.etag[0] == '"');
	uint64_t offs[] = { 0, 1, 65535, 299999 - 69999 };
	for (size_t k = 0; k < 4; k++) {
		memset(buf, 0xee, sizeof(buf));
		CHECK_EQ_INT(ckfs_s3_get(s3, bucket, &o, offs[k], sizeof(buf),
					 buf, &err), CKFS_OK);
		int same = 1;
		for (size_t i = 0; i < sizeof(buf); i++)
			same &= buf[i] == (unsigned char)((offs[k] + i) % 251);
		CHECK(same);
	}
	/* past the end: refused, the caller's buffer untouched past what fits */
	CHECK_EQ_INT(ckfs_s3_get(s3, bucket, &o, 299990, 20, buf, &err),
		     CKFS_E_TRUNCATED);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_s3_get(s3, bucket, &o, 400000, 20, buf, &err),
		     CKFS_E_TRUNCATED);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_s3_head(s3, bucket, "dir/none", &o, &err), CKFS_E_NOTFOUND);
	fprintf(stderr, "  %s\n", err.msg);
}

/* g.bin was replaced after the script took its first ETag (argv). */
static void test_changed(const char *old_etag)
{
	struct ckfs_error err;
	char buf[16];

	ckfs_error_clear(&err);
	struct ckfs_s3_object g = { .key = "dir/g.bin" };
	snprintf(g.etag, sizeof(g.etag), "%s", old_etag);
	CHECK_EQ_INT(ckfs_s3_get(s3, bucket, &g, 0, sizeof(buf), buf, &err), CKFS_E_CHANGED);
	fprintf(stderr, "  %s\n", err.msg);
}

/* many/ holds 1003 keys: more than one page of 1000. */
static void test_listing(void)
{
	struct ckfs_s3_listing l;
	struct ckfs_s3_counts before, after;
	struct ckfs_error err;

	ckfs_error_clear(&err);
	ckfs_s3_counts(s3, &before);
	CHECK_EQ_INT(ckfs_s3_list(s3, bucket, "many/", false, &l, &err), CKFS_OK);
	ckfs_s3_counts(s3, &after);
	CHECK_EQ_INT((int)l.n_objects, 1003);
	CHECK(after.requests - before.requests == 2);
	for (size_t i = 1; i < l.n_objects; i++)
		CHECK(strcmp(l.objects[i - 1].key, l.objects[i].key) < 0);
	ckfs_s3_listing_free(&l);
	CHECK_EQ_INT(ckfs_s3_list(s3, bucket, "", true, &l, &err), CKFS_OK);
	CHECK_EQ_INT((int)l.n_objects, 0);
	CHECK_EQ_INT((int)l.n_prefixes, 2);
	if (l.n_prefixes == 2) {
		CHECK_EQ_STR(l.prefixes[0], "dir/");
		CHECK_EQ_STR(l.prefixes[1], "many/");
	}
	ckfs_s3_listing_free(&l);
	CHECK_EQ_INT(ckfs_s3_list(s3, bucket, "dir/", true, &l, &err), CKFS_OK);
	CHECK_EQ_INT((int)l.n_objects, 3); /* f.bin, g.bin, "odd name+&=.txt" */
	if (l.n_objects == 3)
		CHECK_EQ_STR(l.objects[2].key, "dir/odd name+&=.txt");
	ckfs_s3_listing_free(&l);
}

/* A key with characters that must be encoded in the path. */
static void test_odd_key(void)
{
	struct ckfs_s3_object o;
	struct ckfs_error err;
	char buf[5];

	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_s3_head(s3, bucket, "dir/odd name+&=.txt", &o, &err), CKFS_OK);
	CHECK_EQ_INT(ckfs_s3_get(s3, bucket, &o, 0, 5, buf, &err),
		     CKFS_OK);
	CHECK(memcmp(buf, "hello", 5) == 0);
}

static void test_bad_credentials(void)
{
	struct ckfs_s3_config c;
	struct ckfs_s3 *wrong;
	struct ckfs_s3_object o;
	struct ckfs_error err;

	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_s3_config_load(&c, NULL, CKFS_S3_AUTO, &err), CKFS_OK);
	strcpy(c.secret_key, "not-the-secret");
	CHECK_EQ_INT(ckfs_s3_new(&c, &wrong, &err), CKFS_OK);
	CHECK_EQ_INT(ckfs_s3_list(wrong, bucket, "dir/", true, &(struct ckfs_s3_listing){ 0 }, &err),
		     CKFS_E_IO);
	fprintf(stderr, "  %s\n", err.msg);
	CHECK(strstr(err.msg, "HTTP 403 SignatureDoesNotMatch") != NULL);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_s3_head(wrong, bucket, "dir/f.bin", &o, &err), CKFS_E_IO);
	ckfs_s3_free(wrong);
}

/* Through tests/s3/flaky_proxy.py: each request first gets a dropped
 * connection, then 503 SlowDown, a ranged GET then half its answer, then
 * it goes through; "always-503" never does. */
static const char *flaky;

static void test_retries(void)
{
	struct ckfs_s3_config c;
	struct ckfs_s3 *f;
	struct ckfs_s3_object o;
	struct ckfs_s3_listing l;
	struct ckfs_s3_counts n;
	struct ckfs_error err;
	unsigned char buf[1000];

	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_s3_config_load(&c, flaky, CKFS_S3_AUTO, &err), CKFS_OK);
	CHECK_EQ_INT(ckfs_s3_new(&c, &f, &err), CKFS_OK);
	CHECK_EQ_INT(ckfs_s3_head(f, bucket, "dir/f.bin", &o, &err), CKFS_OK);
	CHECK_EQ_INT(ckfs_s3_get(f, bucket, &o, 1000, sizeof(buf), buf, &err),
		     CKFS_OK);
	CHECK(buf[0] == 1000 % 251 && buf[999] == 1999 % 251);
	CHECK_EQ_INT(ckfs_s3_list(f, bucket, "dir/", true, &l, &err), CKFS_OK);
	ckfs_s3_listing_free(&l);
	ckfs_s3_counts(f, &n);
	fprintf(stderr, "  %llu requests, %llu retried\n", (unsigned long long)n.requests,
		(unsigned long long)n.retries);
	/* HEAD and the listing: two retries each; the ranged GET three */
	CHECK(n.requests == 10 && n.retries == 7);
	if (err.code)
		fprintf(stderr, "  %s\n", err.msg);
	/* the attempts run out: one line, the store's code */
	c.max_attempts = 3;
	ckfs_s3_free(f);
	CHECK_EQ_INT(ckfs_s3_new(&c, &f, &err), CKFS_OK);
	struct ckfs_s3_object never = { .key = "dir/always-503" }; /* any version */
	CHECK_EQ_INT(ckfs_s3_get(f, bucket, &never, 0, 10, buf, &err), CKFS_E_IO);
	CHECK_EQ_STR(err.msg, "s3://ckfs-test/dir/always-503: HTTP 503 SlowDown");
	ckfs_s3_counts(f, &n);
	CHECK(n.requests == 3 && n.retries == 2);
	ckfs_s3_free(f);
}

int main(int argc, char **argv)
{
	struct ckfs_s3_config c;
	struct ckfs_error err;

	if (argc != 4) {
		fprintf(stderr, "usage: s3_check BUCKET OLD_ETAG_OF_G FLAKY_ENDPOINT\n");
		return 2;
	}
	bucket = argv[1];
	flaky = argv[3];
	ckfs_error_clear(&err);
	if (ckfs_s3_config_load(&c, NULL, CKFS_S3_AUTO, &err) != CKFS_OK ||
	    ckfs_s3_new(&c, &s3, &err) != CKFS_OK) {
		fprintf(stderr, "%s\n", err.msg);
		return 1;
	}
	RUN(test_head_and_ranges);
	test_case_failed = 0;
	test_cases++;
	test_changed(argv[2]);
	fprintf(stderr, "%s test_changed\n", test_case_failed ? "FAIL" : "ok  ");
	test_failures_total += test_case_failed;
	RUN(test_listing);
	RUN(test_odd_key);
	RUN(test_bad_credentials);
	RUN(test_retries);
	ckfs_s3_free(s3);
	return test_summary();
}
