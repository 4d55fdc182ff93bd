/* SPDX-License-Identifier: MIT */
/*
 * Shared by the unit tests of the layout readers (include after test.h): a
 * scratch folder per test program, the check that tensors read through a
 * plan equal a reference safetensors set, byte for byte, and what a
 * layout says of a model (its facts, as inspect --json shows them).
 */
#ifndef CKFS_TEST_MODEL_CHECK_H
#define CKFS_TEST_MODEL_CHECK_H

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/layouts.h"
#include "ckfs/model.h"
#include "ckfs/safetensors.h"

static char test_tmp_root[256];

/* /tmp/ckfs-test-<tag>-<pid>/<name>, the root made on first use (the last
 * four results stay valid); test_tmp_cleanup removes it all. */
static inline const char *test_tmp_dir(const char *tag, const char *name)
{
	static char buf[4][512];
	static int k;
	char *p = buf[k++ % 4];

	if (!test_tmp_root[0]) {
		snprintf(test_tmp_root, sizeof(test_tmp_root), "/tmp/ckfs-test-%s-%d", tag,
			 (int)getpid());
		mkdir(test_tmp_root, 0755);
	}
	snprintf(p, 512, "%s/%s", test_tmp_root, name);
	return p;
}

static inline void test_tmp_cleanup(void)
{
	if (test_tmp_root[0])
		test_sh("rm -rf '%s'", test_tmp_root);
}

/* Member `member` of the fact inspect --json shows of m under `key`, as a
 * number (-1 when absent, null or not a number); a string member is
 * copied into str (NULL member: str "" when null). */
static inline double test_fact(const struct ckfs_model *m, const char *key, const char *member,
			       char *str, size_t size)
{
	struct ckfs_facts facts;
	struct ckfs_error err;
	double v = -1;

	ckfs_error_clear(&err);
	CHECK(ckfs_model_describe(m, &facts, &err) == CKFS_OK);
	if (str)
		str[0] = '\0';
	for (size_t i = 0; i < facts.n; i++) {
		if (!facts.v[i].key || strcmp(facts.v[i].key, key) != 0)
			continue;
		const cJSON *x = member ? cJSON_GetObjectItemCaseSensitive(facts.v[i].value,
									  member)
					: facts.v[i].value;
		if (cJSON_IsNumber(x))
			v = x->valuedouble;
		if (cJSON_IsString(x) && str)
			snprintf(str, size, "%s", x->valuestring);
	}
	ckfs_facts_release(&facts);
	return v;
}

/* Element k of the array `member` of the fact under `key`, or -1. */
static inline double test_fact_at(const struct ckfs_model *m, const char *key,
				  const char *member, int k)
{
	struct ckfs_facts facts;
	struct ckfs_error err;
	double v = -1;

	ckfs_error_clear(&err);
	CHECK(ckfs_model_describe(m, &facts, &err) == CKFS_OK);
	for (size_t i = 0; i < facts.n; i++)
		if (facts.v[i].key && strcmp(facts.v[i].key, key) == 0) {
			const cJSON *a = cJSON_GetObjectItemCaseSensitive(facts.v[i].value, member);
			const cJSON *x = cJSON_GetArrayItem(a, k);
			v = cJSON_IsNumber(x) ? x->valuedouble : -1;
		}
	ckfs_facts_release(&facts);
	return v;
}

/*
 * Every tensor of m is in ref with the same dtype, shape and bytes, read
 * whole and (when it has over 40 elements) from element 17 to 23 before
 * its end, across chunk boundaries. stored: the dtype every tensor must be
 * stored in, or CKFS_DTYPE_INVALID for the reference's. what names the
 * model in messages.
 */
static inline void test_model_equals(const struct ckfs_model *m, const struct ckfs_st_set *ref,
				     enum ckfs_dtype stored, const char *what)
{
	struct ckfs_read_scratch s = { 0 };
	struct ckfs_error err;

	for (size_t k = 0; k < m->n_tensors; k++) {
		const struct ckfs_tensor *t = &m->tensors[k];
		const struct ckfs_st_entry *e = ckfs_st_set_find(ref, t->name);
		if (!e) {
			fprintf(stderr, "%s: %s not in the reference\n", what, t->name);
			CHECK(0);
			continue;
		}
		CHECK_EQ_INT(t->stored_dtype, stored == CKFS_DTYPE_INVALID ? e->dtype : stored);
		CHECK_EQ_INT(t->out_dtype, e->dtype);
		CHECK_EQ_INT(t->ndim, e->ndim);
		CHECK(memcmp(t->shape, e->shape, sizeof(int64_t) * (size_t)t->ndim) == 0);
		size_t bytes = (size_t)ckfs_tensor_out_bytes(t);
		CHECK_EQ_INT(bytes, e->end - e->begin);
		unsigned char *a = malloc(bytes + 1), *b = malloc(bytes + 1);
		ckfs_error_clear(&err);
		CHECK(ckfs_tensor_read(m, t, 0, t->numel, a, &s, &err) == CKFS_OK);
		CHECK(ckfs_file_pread(e->f, b, bytes, e->begin) == (ssize_t)bytes);
		if (memcmp(a, b, bytes) != 0) {
			fprintf(stderr, "%s: %s differs from the reference\n", what, t->name);
			CHECK(0);
		}
		if (t->numel > 40) {
			uint64_t first = 17, count = t->numel - 40;
			size_t es = ckfs_dtype_size(t->out_dtype);
			CHECK(ckfs_tensor_read(m, t, first, count, a, &s, &err) == CKFS_OK);
			CHECK(memcmp(a, b + first * es, count * es) == 0);
		}
		free(a);
		free(b);
	}
	ckfs_read_scratch_release(&s);
}

#endif
