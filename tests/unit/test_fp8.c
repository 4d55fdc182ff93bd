/* SPDX-License-Identifier: MIT */
/*
 * --dtype fp8 (src/layouts/fp8_select.c chooses, src/model/view_fp8.c computes) against
 * the torch reference quantizer's bytes (tests/gen/make_fp8_expected.py:
 * fp32 and bf16 sources, partial edge blocks, NaN of both signs, Inf, an
 * all-zero block, subnormals, huge values; two FSDP checkpoints): every
 * quantized weight and its scales, bit for bit,
 *  - read whole, values before scales and scales before values;
 *  - read in odd pieces from the end backwards, so a block row's scales
 *    are first computed for a read of a few of its rows;
 *  - read by four threads at once, each in its own order (TSan in CI);
 * and every other tensor served as bf16; every block of finite values
 * (a subnormal among zeros, all zeros) dequantizes to finite values.
 *
 * A block-FP8 release (tests/gen/make_fp8_release_fixtures.py: DeepSeek-V3
 * shaped, quantized by transformers' own FP8 op, two shards) with --dtype
 * bf16: every tensor bit for bit what transformers' Fp8Dequantize makes of
 * it, read whole and in pieces, the scales not served; without an asked
 * dtype served as stored; --dtype fp8 refused; broken releases (a scale
 * ckfs does not know, a scale grid of another shape, a scale without its
 * F8 weight) refused with one line.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "ckfs/layouts.h"
#include "ckfs/model.h"
#include "ckfs/safetensors.h"
#include "test.h"
#include "model_check.h"

#define FIX CKFS_FIXTURES

struct fp8_case {
	const char *src;        /* under tests/fixtures */
	const char *expected;   /* tests/fixtures/fp8/expected_<name>.safetensors */
};

static const struct fp8_case cases[] = {
	{ "fp8/edge_fp32", "edge_fp32" },
	{ "fp8/edge_bf16", "edge_bf16" },
	{ "fsdp/qwen2_fsdp2_w2", "qwen2_fsdp2_w2" },
	{ "fsdp/llama_bf16_fsdp2_w2", "llama_bf16_fsdp2_w2" },
};

static struct ckfs_model *open_fp8(const struct fp8_case *c)
{
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16, .quant = CKFS_QUANT_FP8 };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;
	char src[512];

	snprintf(src, sizeof(src), FIX "/%s", c->src);
	ckfs_error_clear(&err);
	if (ckfs_model_open(src, &opt, &m, &err) != CKFS_OK) {
		fprintf(stderr, "%s: %s\n", c->src, err.msg);
		CHECK(0);
	}
	return m;
}

static int open_expected(const struct fp8_case *c, struct ckfs_st_set *ref)
{
	const char *dir = test_tmp_dir("fp8", c->expected);
	struct ckfs_error err;

	test_sh("rm -rf '%s' && mkdir -p '%s' && ln -s '" FIX "/fp8/expected_%s.safetensors' "
		"'%s/model.safetensors'", dir, dir, c->expected, dir);
	ckfs_error_clear(&err);
	if (ckfs_st_set_open(dir, NULL, ref, &err) != CKFS_OK) {
		fprintf(stderr, "%s: %s\n", c->expected, err.msg);
		CHECK(0);
		return 0;
	}
	return 1;
}

static const struct ckfs_tensor *find(const struct ckfs_model *m, const char *name)
{
	for (size_t i = 0; i < m->n_tensors; i++)
		if (strcmp(m->tensors[i].name, name) == 0)
			return &m->tensors[i];
	return NULL;
}

/* Elements [first, first + count) of t equal the reference's, read in
 * pieces of `piece` elements from the last piece back to the first. */
static int same_backwards(const struct ckfs_model *m, const struct ckfs_tensor *t,
			  const unsigned char *want, uint64_t piece,
			  struct ckfs_read_scratch *s)
{
	size_t es = ckfs_dtype_size(t->out_dtype);
	unsigned char *got = malloc(t->numel * es + 1);
	struct ckfs_error err;
	int ok = 1;

	ckfs_error_clear(&err);
	for (uint64_t end = t->numel; end > 0 && ok;) {
		uint64_t first = end > piece ? end - piece : 0;
		ok = ckfs_tensor_read(m, t, first, end - first, got + first * es, s, &err) == CKFS_OK;
		end = first;
	}
	ok = ok && memcmp(got, want, t->numel * es) == 0;
	free(got);
	return ok;
}

/* Every entry of ref, read from m in the given order of kinds: scales
 * first or values first; whole (piece 0) or in pieces backwards. */
static void check_case_order(const struct fp8_case *c, int scales_first, uint64_t piece)
{
	struct ckfs_model *m = open_fp8(c);
	struct ckfs_st_set ref;
	struct ckfs_read_scratch s = { 0 };

	if (!m || !open_expected(c, &ref)) {
		ckfs_model_free(m);
		return;
	}
	for (int pass = 0; pass < 2; pass++)
		for (size_t i = 0; i < ref.n_entries; i++) {
			const struct ckfs_st_entry *e = &ref.entries[i];
			int is_scale = strstr(e->name, "_scale_inv") != NULL;
			if (is_scale != (pass == 0 ? scales_first : !scales_first))
				continue;
			const struct ckfs_tensor *t = find(m, e->name);
			CHECK(t != NULL);
			if (!t)
				continue;
			CHECK_EQ_INT(t->out_dtype, e->dtype);
			size_t bytes = e->end - e->begin;
			unsigned char *want = malloc(bytes + 1);
			CHECK(ckfs_file_pread(e->f, want, bytes, e->begin) == (ssize_t)bytes);
			if (!same_backwards(m, t, want, piece ? piece : t->numel, &s)) {
				fprintf(stderr, "%s: %s differs (scales first %d, piece %llu)\n", c->src,
					e->name, scales_first, (unsigned long long)piece);
				CHECK(0);
			}
			free(want);
		}
	/* everything else: bf16 */
	for (size_t i = 0; i < m->n_tensors; i++)
		if (m->tensors[i].view != &ckfs_view_fp8)
			CHECK_EQ_INT(m->tensors[i].out_dtype, CKFS_DTYPE_BF16);
	CHECK(m->view == &ckfs_view_fp8);
	CHECK_EQ_INT(((struct ckfs_fp8_set *)m->view_state)->n * 2, ref.n_entries);
	ckfs_read_scratch_release(&s);
	ckfs_st_set_release(&ref);
	ckfs_model_free(m);
}

static void test_bit_identical(void)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		check_case_order(&cases[i], 0, 0);
		check_case_order(&cases[i], 1, 0);
		check_case_order(&cases[i], 0, 977);  /* a few rows, across blocks */
		check_case_order(&cases[i], 0, 7);
	}
}

struct reader {
	const struct ckfs_model *m;
	const struct ckfs_st_set *ref;
	int order;
	int bad;
};

static void *read_all(void *arg)
{
	struct reader *r = arg;
	struct ckfs_read_scratch s = { 0 };
	size_t n = r->ref->n_entries;

	for (size_t k = 0; k < n; k++) {
		const struct ckfs_st_entry *e = &r->ref->entries[r->order & 1 ? n - 1 - k : k];
		const struct ckfs_tensor *t = find(r->m, e->name);
		size_t bytes = e->end - e->begin;
		unsigned char *want = malloc(bytes + 1);
		if (!t || ckfs_file_pread(e->f, want, bytes, e->begin) != (ssize_t)bytes ||
		    !same_backwards(r->m, t, want, 301 + 100 * (uint64_t)r->order, &s))
			r->bad++;
		free(want);
	}
	ckfs_read_scratch_release(&s);
	return NULL;
}

static void test_threads(void)
{
	const struct fp8_case *c = &cases[0];
	struct ckfs_model *m = open_fp8(c);
	struct ckfs_st_set ref;
	struct reader r[4];
	pthread_t tid[4];

	if (!m || !open_expected(c, &ref)) {
		ckfs_model_free(m);
		return;
	}
	for (int i = 0; i < 4; i++) {
		r[i] = (struct reader){ .m = m, .ref = &ref, .order = i };
		CHECK(pthread_create(&tid[i], NULL, read_all, &r[i]) == 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(tid[i], NULL);
		CHECK_EQ_INT(r[i].bad, 0);
	}
	ckfs_st_set_release(&ref);
	ckfs_model_free(m);
}

/* Whole tensor t as bytes (NULL on a failed read). */
static unsigned char *read_whole(const struct ckfs_model *m, const struct ckfs_tensor *t)
{
	unsigned char *buf = malloc(t->numel * ckfs_dtype_size(t->out_dtype) + 1);
	struct ckfs_read_scratch s = { 0 };
	struct ckfs_error err;

	ckfs_error_clear(&err);
	if (buf && ckfs_tensor_read(m, t, 0, t->numel, buf, &s, &err) != CKFS_OK) {
		fprintf(stderr, "%s: %s\n", t->name, err.msg);
		free(buf);
		buf = NULL;
	}
	ckfs_read_scratch_release(&s);
	return buf;
}

/* Every block of finite values dequantizes to finite values: its scale
 * is finite and above 0, and none of its values is NaN (0x7f, 0xff), also
 * for a block whose amax / 448 underflows (one fp32 subnormal among
 * zeros: 0 / 0 before the floor) and an all-zero block. The reference's
 * bytes are compared by test_bit_identical. */
static void test_blocks_finite(void)
{
	for (size_t c = 0; c < 2; c++) { /* the edge weights, fp32 and bf16 */
		struct ckfs_model *m = open_fp8(&cases[c]);
		size_t checked = 0;
		for (size_t i = 0; m && i < m->n_tensors; i++) {
			const struct ckfs_tensor *t = &m->tensors[i];
			if (t->view != &ckfs_view_fp8 || t->view_part == CKFS_FP8_SCALES)
				continue;
			const struct ckfs_fp8 *q = t->view_state;
			const struct ckfs_tensor *st = NULL;
			for (size_t k = 0; k < m->n_tensors && !st; k++)
				if (m->tensors[k].view_state == q &&
				    m->tensors[k].view_part == CKFS_FP8_SCALES)
					st = &m->tensors[k];
			CHECK(st != NULL);
			unsigned char *v = read_whole(m, t);
			float *sc = st ? (float *)read_whole(m, st) : NULL;
			CHECK(v && sc);
			for (int64_t r = 0; v && sc && r < q->rows; r++)
				for (int64_t col = 0; col < q->cols; col++) {
					float s = sc[(r / CKFS_FP8_BLOCK) * q->block_cols + col / CKFS_FP8_BLOCK];
					unsigned char b = v[r * q->cols + col];
					if (!isfinite(s))
						continue; /* the block holds a NaN or an Inf */
					if (!(s > 0.0f) || (b & 0x7f) == 0x7f) {
						fprintf(stderr, "%s: %s [%lld, %lld]: scale %g, value 0x%02x\n",
							cases[c].src, t->name, (long long)r,
							(long long)col, (double)s, b);
						CHECK(0);
						r = q->rows;
						break;
					}
					checked++;
				}
			free(v);
			free(sc);
		}
		CHECK(checked > 0);
		ckfs_model_free(m);
	}
}

#define RELEASE FIX "/fp8_release/deepseek_v3_tiny"

static void test_release(void)
{
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
	struct ckfs_model *m = NULL;
	struct ckfs_st_set ref;
	struct ckfs_error err;
	size_t scales = 0, dequantized = 0;

	ckfs_error_clear(&err);
	CHECK(ckfs_st_set_open(RELEASE "/expected", NULL, &ref, &err) == CKFS_OK);
	if (ckfs_model_open(RELEASE "/release", &opt, &m, &err) != CKFS_OK) {
		fprintf(stderr, "release: %s\n", err.msg);
		CHECK(0);
		ckfs_st_set_release(&ref);
		return;
	}
	CHECK_EQ_INT(m->n_tensors, ref.n_entries);
	struct ckfs_read_scratch s = { 0 };
	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct ckfs_tensor *t = &m->tensors[i];
		const struct ckfs_st_entry *e = ckfs_st_set_find(&ref, t->name);
		size_t bytes = (size_t)ckfs_tensor_out_bytes(t);
		CHECK(e && e->dtype == t->out_dtype && bytes == e->end - e->begin);
		if (!e || bytes != e->end - e->begin)
			continue;
		unsigned char *want = malloc(bytes);
		CHECK(ckfs_file_pread(e->f, want, bytes, e->begin) == (ssize_t)bytes);
		/* whole, and backwards in odd pieces across blocks and rows */
		CHECK(same_backwards(m, t, want, t->numel, &s));
		CHECK(same_backwards(m, t, want, 301, &s));
		dequantized += t->view == &ckfs_view_fp8_dequant;
		free(want);
	}
	ckfs_read_scratch_release(&s);
	CHECK_EQ_INT(dequantized, 26);
	CHECK(m->view == &ckfs_view_fp8_dequant);
	CHECK_EQ_INT(((struct ckfs_fp8_dequant_set *)m->view_state)->n, 26);
	ckfs_model_free(m);
	ckfs_st_set_release(&ref);

	/* not asked for a dtype: as stored, scales served */
	opt.dtype_is_default = true;
	CHECK(ckfs_model_open(RELEASE "/release", &opt, &m, &err) == CKFS_OK);
	for (size_t i = 0; m && i < m->n_tensors; i++) {
		scales += strstr(m->tensors[i].name, ".weight_scale_inv") != NULL;
		CHECK_EQ_INT(m->tensors[i].out_dtype, m->tensors[i].stored_dtype);
		CHECK(m->tensors[i].view == NULL);
	}
	CHECK_EQ_INT(scales, 26);
	ckfs_model_free(m);

	opt = (struct ckfs_model_options){ .out_dtype = CKFS_DTYPE_BF16, .quant = CKFS_QUANT_FP8 };
	m = NULL;
	CHECK_EQ_INT(ckfs_model_open(RELEASE "/release", &opt, &m, &err), CKFS_E_UNSUPPORTED);
	CHECK(strstr(err.msg, "already quantized") != NULL);
	CHECK(m == NULL);
}

/* A hand-made broken release (one F8 weight [2, 2] and what is beside it)
 * asked for bf16: refused with one line naming the tensor. (An F8 tensor
 * with no scale anywhere is no release: cast by value, as torch's .to.) */
static void expect_release_refused(const char *tensors, size_t data, const char *needle)
{
	const char *dir = test_tmp_dir("fp8", "broken_release");
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;
	char header[1024], path[512];
	int n = snprintf(header, sizeof(header), "{%s}", tensors);
	unsigned char len[8], zero[64] = { 0 };

	CHECK(test_sh("rm -rf '%s' && mkdir -p '%s' && printf '%%s' '{\"architectures\": "
		      "[\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\"}' > "
		      "'%s/config.json'", dir, dir, dir) == 0);
	for (int k = 0; k < 8; k++)
		len[k] = (unsigned char)((uint64_t)n >> (8 * k));
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	FILE *f = fopen(path, "wb");
	CHECK(f && data <= sizeof(zero));
	if (f) {
		CHECK(fwrite(len, 1, 8, f) == 8 && fwrite(header, 1, (size_t)n, f) == (size_t)n &&
		      fwrite(zero, 1, data, f) == data);
		fclose(f);
	}
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(dir, &opt, &m, &err), CKFS_E_UNSUPPORTED);
	CHECK(m == NULL);
	ckfs_model_free(m);
	fprintf(stderr, "  (expected) %s\n", err.msg);
	CHECK(strstr(err.msg, needle) != NULL);
	CHECK(strchr(err.msg, '\n') == NULL);
}

#define F8_W "\"a.weight\": {\"dtype\": \"F8_E4M3\", \"shape\": [2, 2], \"data_offsets\": [0, 4]}"
#define F8_S "\"a.weight_scale_inv\": {\"dtype\": \"F32\", \"shape\": [1, 1], " \
	     "\"data_offsets\": [4, 8]}"

static void test_release_broken(void)
{
	/* a scale ckfs does not know (a k-cache scale): not cast as a weight */
	expect_release_refused(F8_W ", " F8_S ", \"a.k_scale_inv\": {\"dtype\": \"F32\", "
			       "\"shape\": [1], \"data_offsets\": [8, 12]}", 12,
			       "already quantized, and 'a.k_scale_inv' is not of DeepSeek's block FP8");
	expect_release_refused(F8_W ", \"a.weight_scale_inv\": {\"dtype\": \"F32\", \"shape\": "
			       "[2, 1], \"data_offsets\": [4, 12]}", 12, "without block scales");
	expect_release_refused(F8_W ", " F8_S ", \"b.weight\": {\"dtype\": \"BF16\", \"shape\": "
			       "[2], \"data_offsets\": [8, 12]}, \"b.weight_scale_inv\": {\"dtype\": "
			       "\"F32\", \"shape\": [1, 1], \"data_offsets\": [12, 16]}", 16,
			       "'b.weight_scale_inv' scales no F8_E4M3 weight 'b.weight'");
}

int main(void)
{
	RUN(test_bit_identical);
	RUN(test_release);
	RUN(test_release_broken);
	RUN(test_blocks_finite);
	RUN(test_threads);
	test_tmp_cleanup();
	return test_summary();
}
