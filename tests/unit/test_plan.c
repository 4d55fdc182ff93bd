/* SPDX-License-Identifier: MIT */
/*
 * Plan validation: a plan is served only when every element of a tensor
 * has exactly one source. Plans are built by hand here (no checkpoint is
 * involved) to hit each refusal: overlap, gap, a chunk outside the tensor,
 * plus the accepted tilings (row blocks, column blocks, a 0-d tensor).
 */
#include "ckfs/model.h"
#include "test.h"

/* The chunks' dims are interned in this model, as a reader's are. */
static struct ckfs_model dims_model;

static struct ckfs_chunk block(int rank, int64_t r0, int64_t rows, int64_t c0, int64_t cols)
{
	struct ckfs_chunk_spec s = { .rank = rank, .dtype = CKFS_DTYPE_F32 };
	struct ckfs_chunk c;
	struct ckfs_error err;
	s.offset[0] = r0;
	s.offset[1] = c0;
	s.shape[0] = rows;
	s.shape[1] = cols;
	s.stride[0] = cols;
	s.stride[1] = 1;
	CHECK_EQ_INT(ckfs_chunk_pack(&dims_model, &s, 2, &c, &err), CKFS_OK);
	return c;
}

/* Equal vectors share one array; the scalar's block is one element. */
static void test_dims_interned(void)
{
	struct ckfs_chunk a = block(0, 0, 4, 0, 6), b = block(1, 4, 4, 0, 6);
	CHECK(a.shape == b.shape && a.stride == b.stride && a.offset != b.offset);
	CHECK_EQ_INT((int)b.offset[0], 4);
	struct ckfs_chunk_spec s;
	ckfs_chunk_unpack(&b, 2, &s);
	CHECK(s.offset[0] == 4 && s.shape[1] == 6 && s.stride[0] == 6 && s.shape[2] == 0);
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
	struct ckfs_chunk_spec one_spec = { .rank = 0, .dtype = CKFS_DTYPE_F32 };
	struct ckfs_chunk one;
	one_spec.shape[0] = 1;
	one_spec.stride[0] = 1;
	CHECK_EQ_INT(ckfs_chunk_pack(&dims_model, &one_spec, 0, &one, &err), CKFS_OK);
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
	RUN(test_dims_interned);
	RUN(test_tilings_accepted);
	RUN(test_overlap_refused);
	RUN(test_gap_refused);
	RUN(test_outside_refused);
	ckfs_model_dims_release(&dims_model);
	ckfs_arena_release(&dims_model.arena);
	return test_summary();
}
