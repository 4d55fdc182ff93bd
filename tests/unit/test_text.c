/* SPDX-License-Identifier: MIT */
/*
 * Text from a checkpoint made safe to print (include/ckfs/text.h): the
 * escaper itself, and that every way a message leaves ckfs (error records,
 * prefixes, log lines, model warnings) goes through it, so one error is
 * one line and a name cannot write to a terminal.
 */
#include <errno.h>
#include <string.h>

#include "ckfs/err.h"
#include "ckfs/log.h"
#include "ckfs/text.h"
#include "ckfs/strbuf.h"
#include "test.h"

/* No byte a terminal would act on: C0, DEL, C1, or bytes outside valid
 * UTF-8. */
static int printable(const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p;) {
		size_t k = ckfs_utf8_seq(p);
		if (!k || *p < 0x20 || *p == 0x7F || (*p == 0xC2 && p[1] < 0xA0))
			return 0;
		p += k;
	}
	return 1;
}

static void test_escape(void)
{
	static const struct {
		const char *in, *out;
	} cases[] = {
		{ "model.layers.0.weight", "model.layers.0.weight" },
		{ "a\nb", "a\\x0ab" },
		{ "\r\t", "\\x0d\\x09" },
		{ "\x1b[31mred", "\\x1b[31mred" },
		{ "del\x7f", "del\\x7f" },
		{ "csi\xc2\x9b" "2J", "csi\\xc2\\x9b2J" },   /* U+009B, the 8-bit CSI */
		{ "raw\x9b", "raw\\x9b" },                   /* not UTF-8 at all */
		{ "caf\xc3\xa9 \xe6\x97\xa5\xf0\x9f\x98\x80", "caf\xc3\xa9 \xe6\x97\xa5\xf0\x9f\x98\x80" },
		{ "\xe6\x97", "\\xe6\\x97" },                /* cut sequence */
		{ "\xed\xa0\x80", "\\xed\\xa0\\x80" },       /* a surrogate */
		{ "\xc0\xaf", "\\xc0\\xaf" },                /* overlong '/' */
		{ "back\\slash", "back\\slash" },
	};
	char out[256];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ckfs_text_escape(out, sizeof(out), cases[i].in);
		CHECK_EQ_STR(out, cases[i].out);
		CHECK(printable(out));
	}
	/* Cut at the capacity between whole escapes and characters. */
	CHECK_EQ_INT(ckfs_text_escape(out, 6, "ab\ncd"), 2);
	CHECK_EQ_STR(out, "ab");
	CHECK_EQ_INT(ckfs_text_escape(out, 7, "ab\ncd"), 6);
	CHECK_EQ_STR(out, "ab\\x0a");
	CHECK_EQ_INT(ckfs_text_escape(out, 3, "a\xc3\xa9"), 1);
	CHECK_EQ_STR(out, "a");
	CHECK_EQ_INT(ckfs_text_escape(out, 1, "abc"), 0);
}

static void test_error_messages(void)
{
	struct ckfs_error err;

	ckfs_error_clear(&err);
	ckfs_fail(&err, CKFS_E_FORMAT, "tensor '%s': bad", "x\n\x1b]0;owned\x07y");
	CHECK_EQ_STR(err.msg, "tensor 'x\\x0a\\x1b]0;owned\\x07y': bad");
	ckfs_error_prefix(&err, "'%s'", "/ckpt/dir\rname");
	CHECK_EQ_STR(err.msg, "'/ckpt/dir\\x0dname': tensor 'x\\x0a\\x1b]0;owned\\x07y': bad");
	CHECK(printable(err.msg));
	ckfs_error_clear(&err);
	errno = ENOENT;
	ckfs_fail_errno(&err, "'%s': cannot open", "a\x9b" "b");
	CHECK_EQ_STR(err.msg, "'a\\x9bb': cannot open: No such file or directory");
}

static char logged[4096];

static void sink(enum ckfs_log_level level, const char *line)
{
	(void)level;
	snprintf(logged, sizeof(logged), "%s", line);
}

static void test_log_lines(void)
{
	ckfs_log_set_sink(sink);
	ckfs_log(CKFS_LOG_ERR, "'%s': read failed", "model\n.safetensors\x1b[2J");
	ckfs_log_set_sink(NULL);
	CHECK_EQ_STR(logged, "'model\\x0a.safetensors\\x1b[2J': read failed");
}

/* ckfs_strbuf_fmt appends the whole formatted text, however long (it
 * kept 127 bytes: the plan cache's identity lost the checkpoint folder's
 * end, the source count and, for long lines, the sources' ctimes). */
static void test_strbuf_fmt_long(void)
{
	struct ckfs_strbuf b = { 0 };
	char path[301];

	memset(path, 'p', 300);
	path[300] = '\0';
	ckfs_strbuf_fmt(&b, "x\n%s\n%d sources\n", path, 3);
	CHECK(!b.failed);
	CHECK_EQ_INT(b.len, 2 + 300 + 11);
	CHECK(b.p && strncmp(b.p + 2, path, 300) == 0 && strcmp(b.p + 302, "\n3 sources\n") == 0);
	ckfs_strbuf_fmt(&b, "%s", "");
	CHECK_EQ_INT(b.len, 313);
	free(b.p);
}

int main(void)
{
	RUN(test_escape);
	RUN(test_strbuf_fmt_long);
	RUN(test_error_messages);
	RUN(test_log_lines);
	return test_summary();
}
