/* SPDX-License-Identifier: MIT */
/*
 * The compressed-tensors views, --dtype w4a16 and nvfp4
 * (src/layouts/ct_select.c chooses, src/model/view_w4a16.c and
 * view_nvfp4.c compute; the bytes are checked against compressed-tensors
 * itself by tests/py/test_ct_views.py and by their recorded hashes in
 * tests/cli/test_ct_views.sh): every tensor of a weight
 * equals what one whole read of a fresh model gives,
 *  - read in odd pieces from the end backwards, values first or scales
 *    first, and the scales twice (the second time after the kept ones
 *    were all served and dropped, so computed again);
 *  - read by four threads at once, each in its own order and pieces, so
 *    scales are kept and taken concurrently (TSan in CI);
 * the served tensors have the library's names, dtypes and shapes, and the
 * rest is bf16.
 */
#include <pthread.h>
#include <string.h>

#include "ckfs/layouts.h"
#include "ckfs/model.h"
#include "test.h"

#define FIX CKFS_FIXTURES

static const struct view_case {
	const char *fixture;
	enum ckfs_quant quant;
} cases[] = {
	{ "w4a16/qwen2_fsdp2_w2", CKFS_QUANT_W4A16 },  { "w4a16/edge_bf16", CKFS_QUANT_W4A16 },
	{ "w4a16/qwen2_fsdp2_w2", CKFS_QUANT_NVFP4 },  { "w4a16/edge_bf16", CKFS_QUANT_NVFP4 },
	{ "w4a16/edge_nvfp4_bf16", CKFS_QUANT_NVFP4 },
};

static struct ckfs_model *open_view(const struct view_case *c)
{
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16, .quant = c->quant };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;
	char src[512];

	snprintf(src, sizeof(src), FIX "/%s", c->fixture);
	ckfs_error_clear(&err);
	if (ckfs_model_open(src, &opt, &m, &err) != CKFS_OK) {
		fprintf(stderr, "%s: %s\n", c->fixture, err.msg);
		CHECK(0);
	}
	return m;
}

/* Elements [0, numel) of t read in pieces from the last back to the
 * first, into a new buffer (NULL when a read failed). */
static unsigned char *read_backwards(const struct ckfs_model *m, const struct ckfs_tensor *t,
				     uint64_t piece, struct ckfs_read_scratch *s)
{
	size_t es = ckfs_dtype_size(t->out_dtype);
	unsigned char *got = malloc(t->numel * es + 1);
	struct ckfs_error err;

	ckfs_error_clear(&err);
	for (uint64_t end = t->numel; end > 0 && got;) {
		uint64_t first = end > piece ? end - piece : 0;
		if (ckfs_tensor_read(m, t, first, end - first, got + first * es, s, &err) !=
		    CKFS_OK) {
			fprintf(stderr, "%s: %s\n", t->name, err.msg);
			free(got);
			got = NULL;
		}
		end = first;
	}
	return got;
}

/* Every view tensor of a fresh model read whole, in the file's order
 * (values before scales): the reference the other orders must equal. */
static unsigned char **reference(const struct view_case *c, size_t *n)
{
	struct ckfs_model *m = open_view(c);
	struct ckfs_read_scratch s = { 0 };
	unsigned char **v;

	if (!m)
		return NULL;
	*n = m->n_tensors;
	v = calloc(m->n_tensors + 1, sizeof(*v));
	for (size_t i = 0; i < m->n_tensors; i++)
		if (m->tensors[i].view == m->view)
			v[i] = read_backwards(m, &m->tensors[i], m->tensors[i].numel, &s);
	ckfs_read_scratch_release(&s);
	ckfs_model_free(m);
	return v;
}

static void free_reference(unsigned char **v, size_t n)
{
	for (size_t i = 0; v && i < n; i++)
		free(v[i]);
	free(v);
}

static int same(const struct ckfs_model *m, size_t i, const unsigned char *want, uint64_t piece,
		struct ckfs_read_scratch *s)
{
	const struct ckfs_tensor *t = &m->tensors[i];
	unsigned char *got = read_backwards(m, t, piece, s);
	int ok = got && want && memcmp(got, want, t->numel * ckfs_dtype_size(t->out_dtype)) == 0;

	if (!ok)
		fprintf(stderr, "%s differs (piece %llu)\n", t->name, (unsigned long long)piece);
	free(got);
	return ok;
}

static void check_order(const struct view_case *c, unsigned char **want, int scales_first,
			uint64_t piece)
{
	struct ckfs_model *m = open_view(c);
	struct ckfs_read_scratch s = { 0 };

	if (!m)
		return;
	for (int pass = 0; pass < 3; pass++)
		for (size_t i = 0; i < m->n_tensors; i++) {
			const struct ckfs_tensor *t = &m->tensors[i];
			int quantized = t->view == m->view;
			int scale = quantized && (uint32_t)t->view_part == m->view->ct->scale_part;
			/* pass 0 and 1: one kind each; pass 2: the scales again */
			int wanted =
				pass == 2 ? scale
					  : (scale == (pass == 0 ? scales_first : !scales_first));
			if (quantized && wanted)
				CHECK(same(m, i, want[i], piece ? piece : t->numel, &s));
		}
	ckfs_read_scratch_release(&s);
	ckfs_model_free(m);
}

static void test_orders(void)
{
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		size_t n = 0;
		const struct view_case *c = &cases[k];
		unsigned char **want = reference(c, &n);
		CHECK(want != NULL);
		check_order(c, want, 0, 0);
		check_order(c, want, 1, 0);
		check_order(c, want, 0, 977); /* pieces across groups and rows */
		check_order(c, want, 1, 7);
		check_order(c, want, 0, 1);
		free_reference(want, n);
	}
}

/* What the library names each weight's tensors, in name order: the
 * dtype, and the shape from W [rows, cols] (cols / per; per 0: [len]). */
struct want_part {
	const char *suffix;
	enum ckfs_dtype dtype;
	int per, len;
};
static const struct want_part w4a16_parts[] = {
	{ ".weight_packed", CKFS_DTYPE_I32, 8, 0 },
	{ ".weight_scale", CKFS_DTYPE_BF16, 128, 0 },
	{ ".weight_shape", CKFS_DTYPE_I64, 0, 2 },
};
static const struct want_part nvfp4_parts[] = {
	{ ".weight_global_scale", CKFS_DTYPE_F32, 0, 1 },
	{ ".weight_packed", CKFS_DTYPE_U8, 2, 0 },
	{ ".weight_scale", CKFS_DTYPE_F8_E4M3, 16, 0 },
};

static void check_layout(const struct view_case *c, const struct ckfs_view *view,
			 const struct want_part *parts)
{
	struct ckfs_model *m = open_view(c);
	struct ckfs_read_scratch s = { 0 };
	struct ckfs_error err;
	int weights = 0;

	if (!m)
		return;
	CHECK(m->view == view);
	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct ckfs_tensor *t = &m->tensors[i];
		if (t->view != view) {
			CHECK_EQ_INT(t->out_dtype, CKFS_DTYPE_BF16);
			continue;
		}
		const struct ckfs_tensor *w =
			&((const struct ckfs_ct_weight *)t->view_state)->weight;
		const struct want_part *p = &parts[t->view_part];
		CHECK(t->view_part >= 0 && t->view_part < 3);
		CHECK(strlen(t->name) > strlen(p->suffix) &&
		      strcmp(t->name + strlen(t->name) - strlen(p->suffix), p->suffix) == 0);
		CHECK_EQ_INT(t->out_dtype, p->dtype);
		if (p->per)
			CHECK(t->ndim == 2 && t->shape[0] == w->shape[0] &&
			      t->shape[1] == w->shape[1] / p->per);
		else
			CHECK(t->ndim == 1 && t->shape[0] == p->len);
		/* the parts of one weight follow each other, in name order */
		if (t->view_part > 0)
			CHECK(t[-1].view_state == t->view_state &&
			      t[-1].view_part == t->view_part - 1 &&
			      strcmp(t[-1].name, t->name) < 0);
		weights += t->view_part == 0;
		if (view == &ckfs_view_w4a16 && t->view_part == 2) {
			int64_t v[2] = { 0, 0 };
			ckfs_error_clear(&err);
			CHECK(ckfs_tensor_read(m, t, 0, 2, v, &s, &err) == CKFS_OK);
			CHECK(v[0] == w->shape[0] && v[1] == w->shape[1]);
		}
	}
	CHECK_EQ_INT(weights, 14); /* 2 layers x 7 projections; lm_head and embeddings bf16 */
	const struct ckfs_ct_set *set = m->view_state;
	CHECK(set->n_ignore == 1 && strcmp(set->ignore[0], "lm_head") == 0);
	ckfs_read_scratch_release(&s);
	ckfs_model_free(m);
}

static void test_layout(void)
{
	check_layout(&cases[0], &ckfs_view_w4a16, w4a16_parts);
	check_layout(&cases[2], &ckfs_view_nvfp4, nvfp4_parts);
}

struct reader {
	const struct ckfs_model *m;
	unsigned char **want;
	int order;
	int bad;
};

static void *read_all(void *arg)
{
	struct reader *r = arg;
	struct ckfs_read_scratch s = { 0 };
	size_t n = r->m->n_tensors;

	for (int round = 0; round < 2; round++)
		for (size_t k = 0; k < n; k++) {
			size_t i = r->order & 1 ? n - 1 - k : k;
			if (r->m->tensors[i].view == r->m->view &&
			    !same(r->m, i, r->want[i], 301 + 100 * (uint64_t)r->order, &s))
				r->bad++;
		}
	ckfs_read_scratch_release(&s);
	return NULL;
}

static void check_threads(const struct view_case *c)
{
	size_t n = 0;
	unsigned char **want = reference(c, &n);
	struct ckfs_model *m = open_view(c);
	struct reader r[4];
	pthread_t tid[4];

	if (!m || !want) {
		CHECK(0);
		free_reference(want, n);
		ckfs_model_free(m);
		return;
	}
	for (int i = 0; i < 4; i++) {
		r[i] = (struct reader){ .m = m, .want = want, .order = i };
		CHECK(pthread_create(&tid[i], NULL, read_all, &r[i]) == 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(tid[i], NULL);
		CHECK_EQ_INT(r[i].bad, 0);
	}
	free_reference(want, n);
	ckfs_model_free(m);
}

static void test_threads(void)
{
	check_threads(&cases[0]);
	check_threads(&cases[2]); /* nvfp4: the global scale computed concurrently too */
}

int main(void)
{
	RUN(test_layout);
	RUN(test_orders);
	RUN(test_threads);
	return test_summary();
}
