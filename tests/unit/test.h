/* SPDX-License-Identifier: MIT */
/*
 * Minimal assertion helpers for the unit tests: each test file is one
 * executable whose main() calls RUN(fn) per case and returns test_summary().
 * A failed check prints file:line and the expression and marks the case
 * failed; the case keeps running so one run reports every failure.
 */
#ifndef CKFS_TEST_H
#define CKFS_TEST_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures_total, test_cases, test_case_failed;

#define CHECK(cond)                                                          \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #cond);                            \
			test_case_failed = 1;                                \
		}                                                            \
	} while (0)

#define CHECK_EQ_INT(a, b)                                                   \
	do {                                                                 \
		long long a_ = (long long)(a), b_ = (long long)(b);          \
		if (a_ != b_) {                                              \
			fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", \
				__FILE__, __LINE__, #a, #b, a_, b_);         \
			test_case_failed = 1;                                \
		}                                                            \
	} while (0)

#define CHECK_EQ_STR(a, b)                                                   \
	do {                                                                 \
		const char *a_ = (a), *b_ = (b);                             \
		if (!a_ || !b_ || strcmp(a_, b_) != 0) {                     \
			fprintf(stderr, "%s:%d: %s == %s failed: '%s' != '%s'\n", \
				__FILE__, __LINE__, #a, #b, a_ ? a_ : "(null)", \
				b_ ? b_ : "(null)");                         \
			test_case_failed = 1;                                \
		}                                                            \
	} while (0)

#define RUN(fn)                                                              \
	do {                                                                 \
		test_case_failed = 0;                                        \
		test_cases++;                                                \
		fn();                                                        \
		fprintf(stderr, "%s %s\n", test_case_failed ? "FAIL" : "ok  ", #fn); \
		test_failures_total += test_case_failed;                     \
	} while (0)

/* A whole file in a new buffer (NUL-terminated, *len bytes), or NULL. */
static inline unsigned char *test_slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	unsigned char *buf = NULL;
	long n;

	*len = 0;
	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
	    fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
		if (fread(buf, 1, (size_t)n, f) == (size_t)n) {
			buf[n] = '\0';
			*len = (size_t)n;
		} else {
			free(buf);
			buf = NULL;
		}
	}
	fclose(f);
	return buf;
}

/* Run a shell command built with printf; returns system()'s status. */
static inline int test_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int test_sh(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	return system(cmd);
}

static inline int test_summary(void)
{
	printf("%d passed, %d failed\n", test_cases - test_failures_total,
	       test_failures_total);
	return test_failures_total ? 1 : 0;
}

#endif
