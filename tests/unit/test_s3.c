/* SPDX-License-Identifier: MIT */
/*
 * The S3 client's offline parts: listings (a page SeaweedFS 4.48 sent, and
 * broken ones, which are refused), s3:// URLs, and settings read from the
 * environment and the AWS files as the AWS CLI reads them. The requests
 * themselves run against a real SeaweedFS (tests/s3/test_s3_client.sh).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckfs/md5.h"
#include "ckfs/s3.h"
#include "test.h"

/* A page as SeaweedFS 4.48 answered `list-type=2&prefix=run/` (keys
 * changed, layout kept), with a continuation token as AWS sends one. */
static const char page[] =
	"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	"<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>bkt</Name>"
	"<Prefix>run/</Prefix><MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated>"
	"<Contents><Key>run/a&amp;b.pt</Key><ETag>&#34;fddebb76529e8fb481bb94059c171a70&#34;</ETag>"
	"<Size>23</Size><StorageClass>STANDARD</StorageClass>"
	"<LastModified>2026-12-01T18:27:54Z</LastModified></Contents>"
	"<Contents><Key>run/caf&#xE9;.json</Key><ETag>&quot;x-2&quot;</ETag><Size>0</Size></Contents>"
	"<CommonPrefixes><Prefix>run/global_step_1/</Prefix></CommonPrefixes>"
	"<KeyCount>3</KeyCount><NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="
	"</NextContinuationToken></ListBucketResult>";

static void test_listing(void)
{
	struct ckfs_s3_listing l = { 0 };
	struct ckfs_error err;
	char *next = NULL;

	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_s3_parse_listing(page, sizeof(page) - 1, &l, &next, &err), CKFS_OK);
	CHECK_EQ_INT((int)l.n_objects, 2);
	CHECK_EQ_INT((int)l.n_prefixes, 1);
	if (l.n_objects == 2 && l.n_prefixes == 1) {
		CHECK_EQ_STR(l.objects[0].key, "run/a&b.pt");
		CHECK_EQ_STR(l.objects[0].etag, "\"fddebb76529e8fb481bb94059c171a70\"");
		CHECK(l.objects[0].size == 23);
		CHECK_EQ_STR(l.objects[1].key, "run/caf\xc3\xa9.json");
		CHECK_EQ_STR(l.prefixes[0], "run/global_step_1/");
	}
	CHECK_EQ_STR(next, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
	free(next);
	ckfs_s3_listing_free(&l);
}

static void refused(const char *xml, const char *want)
{
	struct ckfs_s3_listing l = { 0 };
	struct ckfs_error err;
	char *next = NULL;

	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_s3_parse_listing(xml, strlen(xml), &l, &next, &err), CKFS_E_FORMAT);
	CHECK_EQ_STR(err.msg, want);
	CHECK(next == NULL);
	ckfs_s3_listing_free(&l);
}

#define ROOT "<ListBucketResult>"
#define END "</ListBucketResult>"

static void test_broken_listings(void)
{
	refused("", "S3 listing: the document ends inside an element");
	refused("<Error><Code>AccessDenied</Code></Error>", "S3 listing: not a ListBucketResult");
	refused(ROOT "<Contents><Key>a", "S3 listing: the document ends inside an element");
	refused(ROOT "<Contents><Key>a</Size></Contents>" END,
		"S3 listing: an element closed that is not open");
	refused(ROOT "<Contents><Size>1</Size></Contents>" END,
		"S3 listing: an object without a key");
	refused(ROOT "<Contents><Key>a</Key><Key>b</Key></Contents>" END,
		"S3 listing: an object with two keys");
	refused(ROOT "<Contents><Key>a</Key><Size>-1</Size></Contents>" END,
		"S3 listing: a bad object size");
	refused(ROOT "<Contents><Key>a&nbsp;</Key></Contents>" END, "S3 listing: an unknown entity");
	refused(ROOT "<Contents><Key>a&#0;b</Key></Contents>" END,
		"S3 listing: a bad character reference");
	refused(ROOT "<Contents><Key><![CDATA[a]]></Key></Contents>" END,
		"S3 listing: XML ckfs does not read (comments, CDATA, declarations)");
	refused(ROOT "<IsTruncated>true</IsTruncated>" END,
		"S3 listing: truncated without a continuation token");
	refused(ROOT "<IsTruncated>false</IsTruncated><NextContinuationToken>t"
		"</NextContinuationToken>" END,
		"S3 listing: a continuation token on a complete listing");
	refused(ROOT END ROOT END, "S3 listing: two root elements");
	refused(ROOT "<a><b><c><d><e><f><g><h>" END, "S3 listing: elements nested too deep");
}

static void test_urls(void)
{
	char bucket[64];
	const char *key;

	CHECK_EQ_INT(ckfs_s3_parse_url("s3://my-bucket.x/run/step", bucket, sizeof(bucket), &key), 0);
	CHECK_EQ_STR(bucket, "my-bucket.x");
	CHECK_EQ_STR(key, "run/step");
	CHECK_EQ_INT(ckfs_s3_parse_url("s3://bkt", bucket, sizeof(bucket), &key), 0);
	CHECK_EQ_STR(key, "");
	CHECK_EQ_INT(ckfs_s3_parse_url("s3://bkt//a", bucket, sizeof(bucket), &key), 0);
	CHECK_EQ_STR(key, "a");
	CHECK_EQ_INT(ckfs_s3_parse_url("s3://Bkt/a", bucket, sizeof(bucket), &key), -1);
	CHECK_EQ_INT(ckfs_s3_parse_url("s3://ab/a", bucket, sizeof(bucket), &key), -1);
	CHECK_EQ_INT(ckfs_s3_parse_url("s3://-bkt/a", bucket, sizeof(bucket), &key), -1);
	CHECK_EQ_INT(ckfs_s3_parse_url("/local/path", bucket, sizeof(bucket), &key), -1);

	/* what reaches a message: no password, no signature */
	char out[256];
	CHECK_EQ_STR(ckfs_url_redact("ftp://user:PASS@host:9/x", out, sizeof(out)),
		     "ftp://***@host:9/x");
	CHECK_EQ_STR(ckfs_url_redact("https://a@b@host/p@q", out, sizeof(out)), "https://***@host/p@q");
	CHECK_EQ_STR(ckfs_url_redact("http://host:9000", out, sizeof(out)), "http://host:9000");
	CHECK_EQ_STR(ckfs_url_redact("https://h/k?X-Amz-Credential=AK%2F1&x=1&X-Amz-Signature=ff",
				     out, sizeof(out)),
		     "https://h/k?X-Amz-Credential=***&x=1&X-Amz-Signature=***");
	CHECK_EQ_STR(ckfs_url_redact("https://user:PASS@host", out, 12), "https://***");
}

static void clear_env(void)
{
	static const char *const vars[] = {
		"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
		"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
		"AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
	};
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
}

static void test_config(void)
{
	char dir[] = "/tmp/ckfs-s3cfg.XXXXXX", creds[64], conf[64];
	struct ckfs_s3_config c;
	struct ckfs_error err;
	FILE *f;

	CHECK(mkdtemp(dir) != NULL);
	snprintf(creds, sizeof(creds), "%s/credentials", dir);
	snprintf(conf, sizeof(conf), "%s/config", dir);
	f = fopen(creds, "w");
	fputs("[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n"
	      "[ci]\naws_access_key_id=CI\naws_secret_access_key=cisecret\n"
	      "aws_session_token = tok\n", f);
	fclose(f);
	f = fopen(conf, "w");
	fputs("[default]\nregion = eu-west-1\n[profile ci]\nregion=ap-south-1\n", f);
	fclose(f);
	clear_env();
	setenv("HOME", dir, 1); /* no ~/.aws there: anonymous */
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_s3_config_load(&c, NULL, CKFS_S3_AUTO, &err), CKFS_OK);
	CHECK(c.anonymous);
	CHECK_EQ_STR(c.region, "us-east-1");
	CHECK_EQ_STR(c.endpoint, "https://s3.us-east-1.amazonaws.com");
	CHECK_EQ_INT(c.addressing, CKFS_S3_VIRTUAL);

	setenv("AWS_SHARED_CREDENTIALS_FILE", creds, 1);
	setenv("AWS_CONFIG_FILE", conf, 1);
	CHECK_EQ_INT(ckfs_s3_config_load(&c, NULL, CKFS_S3_AUTO, &err), CKFS_OK);
	CHECK(!c.anonymous);
	CHECK_EQ_STR(c.access_key, "DEF");
	CHECK_EQ_STR(c.region, "eu-west-1");
	setenv("AWS_PROFILE", "ci", 1);
	setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/", 1);
	CHECK_EQ_INT(ckfs_s3_config_load(&c, NULL, CKFS_S3_AUTO, &err), CKFS_OK);
	CHECK_EQ_STR(c.access_key, "CI");
	CHECK_EQ_STR(c.session_token, "tok");
	CHECK_EQ_STR(c.region, "ap-south-1");
	CHECK_EQ_STR(c.endpoint, "http://127.0.0.1:9000");
	CHECK_EQ_INT(c.addressing, CKFS_S3_PATH);
	/* the environment's keys win over the profile; --s3-endpoint over both */
	setenv("AWS_ACCESS_KEY_ID", "ENV", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "envsecret", 1);
	setenv("AWS_REGION", "us-west-2", 1);
	CHECK_EQ_INT(ckfs_s3_config_load(&c, "https://minio.example", CKFS_S3_VIRTUAL, &err),
		     CKFS_OK);
	CHECK_EQ_STR(c.access_key, "ENV");
	CHECK_EQ_STR(c.session_token, "");
	CHECK_EQ_STR(c.region, "us-west-2");
	CHECK_EQ_STR(c.endpoint, "https://minio.example");
	CHECK_EQ_INT(c.addressing, CKFS_S3_VIRTUAL);
	/* half a key pair, a profile that is not there, a bad endpoint */
	unsetenv("AWS_SECRET_ACCESS_KEY");
	CHECK_EQ_INT(ckfs_s3_config_load(&c, NULL, CKFS_S3_AUTO, &err), CKFS_E_INVALID);
	unsetenv("AWS_ACCESS_KEY_ID");
	setenv("AWS_PROFILE", "nope", 1);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_s3_config_load(&c, NULL, CKFS_S3_AUTO, &err), CKFS_E_NOTFOUND);
	unsetenv("AWS_PROFILE");
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_s3_config_load(&c, "ftp://x", CKFS_S3_AUTO, &err), CKFS_E_INVALID);
	CHECK_EQ_STR(err.msg, "S3 endpoint 'ftp://x': not an http:// or https:// URL");
	unlink(creds);
	unlink(conf);
	rmdir(dir);
	clear_env();
}

/* RFC 1321's test suite (appendix A.5), and lengths around a block's
 * padding boundary checked against Python's hashlib. */
static void test_md5(void)
{
	static const char *const cases[][2] = {
		{ "", "d41d8cd98f00b204e9800998ecf8427e" },
		{ "a", "0cc175b9c0f1b6a831c399e269772661" },
		{ "abc", "900150983cd24fb0d6963f7d28e17f72" },
		{ "message digest", "f96b697d7cb7938d525a2f31aaf161d0" },
		{ "abcdefghijklmnopqrstuvwxyz", "c3fcd3d76192e4007dfb496cca67e13b" },
		{ "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
		  "d174ab98d277d9f5a5611c2c9f419d9f" },
		{ "1234567890123456789012345678901234567890123456789012345678901234567890123456"
		  "7890",
		  "57edf4a22be3c955ac49da2e2107b67a" },
	};
	unsigned char d[16];
	char hex[33];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ckfs_md5(cases[i][0], strlen(cases[i][0]), d);
		for (int k = 0; k < 16; k++)
			snprintf(hex + 2 * k, 3, "%02x", d[k]);
		CHECK_EQ_STR(hex, cases[i][1]);
	}
	/* 55, 56 and 64 bytes of 'x', fed one byte at a time: the padding
	 * edge cases, and update's carry between calls */
	static const char *const xs[] = { "04364420e25c512fd958a70738aa8f72",
					  "668a72d5ba17f08e62dabcafad6db14b",
					  "c1bb4f81d892b2d57947682aeb252456" };
	const size_t lens[] = { 55, 56, 64 };
	for (size_t i = 0; i < 3; i++) {
		struct ckfs_md5 m;
		ckfs_md5_init(&m);
		for (size_t k = 0; k < lens[i]; k++)
			ckfs_md5_update(&m, "x", 1);
		ckfs_md5_final(&m, d);
		for (int k = 0; k < 16; k++)
			snprintf(hex + 2 * k, 3, "%02x", d[k]);
		CHECK_EQ_STR(hex, xs[i]);
	}
	/* a million 'a' in one call: many blocks through one state */
	char *many = malloc(1000000);
	CHECK(many != NULL);
	memset(many, 'a', 1000000);
	ckfs_md5(many, 1000000, d);
	free(many);
	for (int k = 0; k < 16; k++)
		snprintf(hex + 2 * k, 3, "%02x", d[k]);
	CHECK_EQ_STR(hex, "7707d6ae4e027c70eea2a935c2296f21");
}

/* ListMultipartUploads as SeaweedFS 4.48 answers it (ids changed), a
 * page that goes on, and broken ones. */
static void test_uploads(void)
{
	static const char uploads_page[] =
		"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
		"<ListMultipartUploadsResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
		"<Bucket>out</Bucket><KeyMarker></KeyMarker><UploadIdMarker></UploadIdMarker>"
		"<NextKeyMarker>m/b.safetensors</NextKeyMarker><NextUploadIdMarker>id-2"
		"</NextUploadIdMarker><MaxUploads>2</MaxUploads><IsTruncated>true</IsTruncated>"
		"<Upload><Key>m/a.safetensors</Key><UploadId>id-1</UploadId><Initiator><ID>ckfs</ID>"
		"</Initiator><StorageClass>STANDARD</StorageClass>"
		"<Initiated>2026-12-07T03:01:02Z</Initiated></Upload>"
		"<Upload><Key>m/b.safetensors</Key><UploadId>id-2</UploadId>"
		"<Initiated>2026-12-07T03:01:03Z</Initiated></Upload></ListMultipartUploadsResult>";
	struct ckfs_s3_listing l = { 0 };
	struct ckfs_error err;
	char *next = NULL;

	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_s3_parse_uploads(uploads_page, sizeof(uploads_page) - 1, &l, &next, &err),
		     CKFS_OK);
	CHECK_EQ_INT((int)l.n_objects, 2);
	if (l.n_objects == 2) {
		CHECK_EQ_STR(l.objects[0].key, "m/a.safetensors");
		CHECK_EQ_STR(l.objects[0].upload_id, "id-1");
		CHECK(l.objects[1].mtime.tv_sec == 1796612463);
	}
	CHECK_EQ_STR(next, "m/b.safetensors\nid-2");
	free(next);
	ckfs_s3_listing_free(&l);

	static const char *const broken[][2] = {
		{ "<ListBucketResult></ListBucketResult>",
		  "S3 listing: not a ListMultipartUploadsResult" },
		{ "<ListMultipartUploadsResult><Upload><Key>k</Key></Upload>"
		  "</ListMultipartUploadsResult>",
		  "S3 listing: an upload without a key or an id" },
		{ "<ListMultipartUploadsResult><IsTruncated>true</IsTruncated>"
		  "</ListMultipartUploadsResult>",
		  "S3 listing: truncated without its markers" },
	};
	for (size_t i = 0; i < 3; i++) {
		memset(&l, 0, sizeof(l));
		ckfs_error_clear(&err);
		CHECK_EQ_INT(ckfs_s3_parse_uploads(broken[i][0], strlen(broken[i][0]), &l, &next,
						   &err),
			     CKFS_E_FORMAT);
		CHECK_EQ_STR(err.msg, broken[i][1]);
		ckfs_s3_listing_free(&l);
	}
}

/* The writes' small answers, through the listings' strict reader: ETags
 * with &quot; or &#34; decoded, an <Error> told by its root, and what
 * the reader refuses. */
static void test_answers(void)
{
	static const char initiate[] =
		"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<InitiateMultipartUploadResult "
		"xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Bucket>b</Bucket><Key>k</Key>"
		"<UploadId>id+1/2=</UploadId></InitiateMultipartUploadResult>";
	/* AWS sends spaces ahead of a Complete's answer while it works */
	static const char complete[] =
		"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n   \n<CompleteMultipartUploadResult>"
		"<Location>http://x/b/k</Location><Bucket>b</Bucket><Key>k</Key>"
		"<ETag>&quot;0123456789abcdef0123456789abcdef-2&quot;</ETag>"
		"</CompleteMultipartUploadResult>";
	static const char complete34[] = "<CompleteMultipartUploadResult><ETag>&#34;ab-2&#34;"
					 "</ETag></CompleteMultipartUploadResult>";
	static const char error[] = "<?xml version=\"1.0\"?><Error><Code>InternalError</Code>"
				    "<Message>We encountered an internal error.</Message></Error>";
	char root[64], out[96];
	struct ckfs_error err;

	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_s3_parse_child(initiate, strlen(initiate), "UploadId", root, sizeof(root),
					 out, sizeof(out), &err),
		     CKFS_OK);
	CHECK_EQ_STR(root, "InitiateMultipartUploadResult");
	CHECK_EQ_STR(out, "id+1/2=");
	CHECK_EQ_INT(ckfs_s3_parse_child(complete, strlen(complete), "ETag", root, sizeof(root),
					 out, sizeof(out), &err),
		     CKFS_OK);
	CHECK_EQ_STR(root, "CompleteMultipartUploadResult");
	CHECK_EQ_STR(out, "\"0123456789abcdef0123456789abcdef-2\"");
	CHECK_EQ_INT(ckfs_s3_parse_child(complete34, strlen(complete34), "ETag", root, sizeof(root),
					 out, sizeof(out), &err),
		     CKFS_OK);
	CHECK_EQ_STR(out, "\"ab-2\"");
	CHECK_EQ_INT(ckfs_s3_parse_child(complete, strlen(complete), "Code", root, sizeof(root),
					 out, sizeof(out), &err),
		     CKFS_OK);
	CHECK_EQ_STR(out, "");
	CHECK_EQ_INT(ckfs_s3_parse_child(error, strlen(error), "Code", root, sizeof(root), out,
					 sizeof(out), &err),
		     CKFS_OK);
	CHECK_EQ_STR(root, "Error");
	CHECK_EQ_STR(out, "InternalError");
	/* only the root's own child counts */
	static const char deep[] = "<R><Part><ETag>x</ETag></Part></R>";
	CHECK_EQ_INT(ckfs_s3_parse_child(deep, strlen(deep), "ETag", root, sizeof(root), out,
					 sizeof(out), &err),
		     CKFS_OK);
	CHECK_EQ_STR(out, "");

	static const char *const broken[][2] = {
		{ "", "S3 answer: the document ends inside an element" },
		{ "<R><ETag>a</ETag><ETag>b</ETag></R>", "S3 answer: an element twice" },
		{ "<R><ETag><![CDATA[x]]></ETag></R>",
		  "S3 answer: XML ckfs does not read (comments, CDATA, declarations)" },
		{ "<R><ETag>&unknown;</ETag></R>", "S3 answer: an unknown entity" },
		{ "<R><ETag>x</Code></R>", "S3 answer: an element closed that is not open" },
		{ "<R><ETag>0123456789012345678901234567890123456789012345678901234567890123456789"
		  "0123456789012345678901234567890123456789</ETag></R>",
		  "S3 answer: a value too long" },
	};
	for (size_t i = 0; i < sizeof(broken) / sizeof(broken[0]); i++) {
		ckfs_error_clear(&err);
		CHECK_EQ_INT(ckfs_s3_parse_child(broken[i][0], strlen(broken[i][0]), "ETag", root,
						 sizeof(root), out, sizeof(out), &err),
			     CKFS_E_FORMAT);
		CHECK_EQ_STR(err.msg, broken[i][1]);
	}
	CHECK_EQ_INT(ckfs_s3_parse_child(NULL, 0, "ETag", root, sizeof(root), out, sizeof(out),
					 &err),
		     CKFS_E_FORMAT);
}

int main(void)
{
	RUN(test_md5);
	RUN(test_answers);
	RUN(test_uploads);
	RUN(test_listing);
	RUN(test_broken_listings);
	RUN(test_urls);
	RUN(test_config);
	return test_summary();
}
