/* SPDX-License-Identifier: MIT */
/*
 * ckfs_json_parse reads a JSON input the way Python's json (verl,
 * transformers) and serde_json (safetensors) read it, over its whole
 * length: what they refuse and cJSON would take (a NUL and what follows
 * it, data after the value, raw control characters, bytes that are not
 * UTF-8, a byte order mark) is refused naming the file and the offset;
 * JSON whitespace around the value is fine. Every JSON file ckfs reads
 * goes through it (the corpus has a case per file kind).
 */
#include <cjson/cJSON.h>
#include <string.h>

#include "ckfs/json.h"
#include "test.h"

/* Parse len bytes of text as "f.json": the code, and the message when it
 * is not CKFS_OK (want NULL: must parse). */
static void expect(const char *text, size_t len, const char *want)
{
	struct ckfs_error err;
	cJSON *j = NULL;

	ckfs_error_clear(&err);
	enum ckfs_code rc = ckfs_json_parse("f.json", text, len, &j, &err);
	if (!want) {
		if (rc != CKFS_OK)
			fprintf(stderr, "refused %.*s: %s\n", (int)len, text, err.msg);
		CHECK_EQ_INT(rc, CKFS_OK);
		CHECK(j != NULL);
	} else {
		CHECK_EQ_INT(rc, CKFS_E_FORMAT);
		CHECK(j == NULL);
		CHECK_EQ_STR(err.msg, want);
	}
	cJSON_Delete(j);
}

#define EXPECT(lit, want) expect(lit, sizeof(lit) - 1, want)

static void test_whole_length(void)
{
	/* The reproduction: world size 1 up to the NUL, 9 after it. */
	EXPECT("{\"world_size\": 1}\0{\"world_size\": 9}", "'f.json': NUL byte at offset 17");
	EXPECT("{\"world_size\": 1}\n\0", "'f.json': NUL byte at offset 18");
	EXPECT("{\"a\": \"x\0y\"}", "'f.json': NUL byte at offset 8");
	EXPECT("{\"a\": 1}\n{\"a\": 2}\n", "'f.json': data after the JSON value at offset 9");
	EXPECT("{\"a\": 1} x", "'f.json': data after the JSON value at offset 9");
	EXPECT("[1] ]", "'f.json': data after the JSON value at offset 4");
	EXPECT("{\"a\": 1}\f", "'f.json': control character 0x0c at offset 8");
}

static void test_control_characters(void)
{
	/* Raw in a string: escaped is fine, raw is not (JSON, Python). */
	EXPECT("{\"a\": \"x\\ty\"}", NULL);
	EXPECT("{\"a\": \"x\ty\"}", "'f.json': control character 0x09 at offset 8");
	EXPECT("{\"a\": \"x\ny\"}", "'f.json': control character 0x0a at offset 8");
	EXPECT("{\"a\\\"\x01\": 1}", "'f.json': control character 0x01 at offset 5");
	/* Between tokens only space, tab, newline and carriage return. */
	EXPECT("{\"a\":\x01 1}", "'f.json': control character 0x01 at offset 5");
	EXPECT("\x0b{\"a\": 1}", "'f.json': control character 0x0b at offset 0");
	EXPECT(" \t\r\n{\"a\":\t1}\r\n \t", NULL);
}

static void test_encoding(void)
{
	EXPECT("{\"a\": \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}", NULL);
	EXPECT("{\"a\": \"x\xff\"}", "'f.json': not UTF-8 at offset 8");
	EXPECT("{\"a\": \"\xc0\xaf\"}", "'f.json': not UTF-8 at offset 7"); /* overlong */
	EXPECT("{\"a\": \"\xed\xa0\x80\"}", "'f.json': not UTF-8 at offset 7"); /* surrogate */
	/* cut inside a sequence, at the very end (nothing read past len) */
	expect("\"\xe2\x82\xac\"", 3, "'f.json': not UTF-8 at offset 1");
	EXPECT("\xef\xbb\xbf{\"a\": 1}", "'f.json': starts with a byte order mark");
}

static void test_still_refused(void)
{
	struct ckfs_error err;
	cJSON *j = NULL;

	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_json_parse("f.json", "{\"a\": 1, \"a\": 2}", 16, &j, &err),
		     CKFS_E_FORMAT);
	CHECK_EQ_STR(err.msg, "'f.json': key 'a' appears twice in one object");
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_json_parse("f.json", "{\"a\": }", 7, &j, &err), CKFS_E_FORMAT);
	CHECK_EQ_STR(err.msg, "'f.json': invalid JSON at line 1, column 7");
	/* len, not the NUL, ends the text: a value cut by len is cut */
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_json_parse("f.json", "{\"a\": 12}", 8, &j, &err), CKFS_E_FORMAT);
	CHECK(j == NULL);
}

int main(void)
{
	RUN(test_whole_length);
	RUN(test_control_characters);
	RUN(test_encoding);
	RUN(test_still_refused);
	return test_summary();
}
