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
#include <stdio.h>
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

static inline int test_summary(void)
{
	printf("%d passed, %d failed\n", test_cases - test_failures_total,
	       test_failures_total);
	return test_failures_total ? 1 : 0;
}

#endif
