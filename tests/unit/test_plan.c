/* SPDX-License-Identifier: MIT */
/*
 * Plan validation: a plan is served only when every element of a tensor
 * has exactly one source. Plans are built by hand here (no checkpoint is
 * involved) to hit each refusal: overlap, gap, a chunk outside the tensor,
 * plus the accepted tilings (row blocks, column blocks, a 0-d tensor).
 */
#include "ckfs/model.h"
#include "test.h"

static struct ckfs_chunk block(int rank, int64_t r0, int64_t rows, int64_t c0, int64_t cols)
{
	struct ckfs_chunk c = { .rank = rank, .dtype = CKFS_DTYPE_F32 };
	c.offset[0] = r0;
	c.offset[1] = c0;
	c.shape[0] = rows;
	c.shape[1] = cols;
	c.stride[0] = cols;
	c.stride[1] = 1;
	return c;
}

static enum ckfs_code validate(struct ckfs_chunk *chunks, uint32_t n, struct ckfs_error *err)
{
	struct ckfs_tensor t = { .name = "w", .ndim = 2, .numel = 10 * 6,
				 .n_chunks = n, .chunks = chunks };
	t.shape[0] = 10;
	t.shape[1] = 6;
	ckfs_error_clear(err);
	return ckfs_plan_validate_tensor(NULL, &t, err);
}

static void test_tilings_accepted(void)
{
	struct ckfs_error err;
	struct ckfs_chunk rows[3] = { block(0, 0, 4, 0, 6), block(1, 4, 4, 0, 6), block(2, 8, 2, 0, 6) };
	struct ckfs_chunk cols[2] = { block(0, 0, 10, 0, 3), block(1, 0, 10, 3, 3) };
	CHECK_EQ_INT(validate(rows, 3, &err), CKFS_OK);
	CHECK_EQ_INT(validate(cols, 2, &err), CKFS_OK);
	struct ckfs_chunk one = { .rank = 0, .dtype = CKFS_DTYPE_F32 };
	one.shape[0] = 1;
	one.stride[0] = 1;
	struct ckfs_tensor scalar = { .name = "s", .ndim = 0, .numel = 1, .n_chunks = 1, .chunks = &one };
	CHECK_EQ_INT(ckfs_plan_validate_tensor(NULL, &scalar, &err), CKFS_OK);
}

static void test_overlap_refused(void)
{
	struct ckfs_error err;
	struct ckfs_chunk c[2] = { block(0, 0, 6, 0, 6), block(1, 5, 5, 0, 6) };
	CHECK_EQ_INT(validate(c, 2, &err), CKFS_E_INVALID);
	CHECK_EQ_STR(err.msg, "tensor 'w': shards of ranks 0 and 1 overlap");
}

static void test_gap_refused(void)
{
	struct ckfs_error err;
	struct ckfs_chunk c[2] = { block(0, 0, 4, 0, 6), block(2, 8, 2, 0, 6) };
	CHECK_EQ_INT(validate(c, 2, &err), CKFS_E_INVALID);
	CHECK_EQ_STR(err.msg, "tensor 'w': shards hold 36 of 60 elements (missing or extra ranks?)");
}

static void test_outside_refused(void)
{
	struct ckfs_error err;
	struct ckfs_chunk c[2] = { block(0, 0, 5, 0, 6), block(1, 5, 6, 0, 6) };
	CHECK_EQ_INT(validate(c, 2, &err), CKFS_E_INVALID);
	CHECK_EQ_STR(err.msg, "tensor 'w': the shard of rank 1 lies outside the global shape");
	struct ckfs_chunk neg[1] = { block(3, -1, 10, 0, 6) };
	CHECK_EQ_INT(validate(neg, 1, &err), CKFS_E_INVALID);
}

int main(void)
{
	RUN(test_tilings_accepted);
	RUN(test_overlap_refused);
	RUN(test_gap_refused);
	RUN(test_outside_refused);
	return test_summary();
}
