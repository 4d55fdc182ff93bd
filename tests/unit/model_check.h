/* SPDX-License-Identifier: MIT */
/*
 * Shared by the unit tests of the layout readers (include after test.h): a
 * scratch folder per test program, and the check that tensors read through
 * a plan equal a reference safetensors set, byte for byte.
 */
#ifndef CKFS_TEST_MODEL_CHECK_H
#define CKFS_TEST_MODEL_CHECK_H

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

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
		CHECK(pread(e->fd, b, bytes, (off_t)e->begin) == (ssize_t)bytes);
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
