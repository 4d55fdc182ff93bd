/* SPDX-License-Identifier: MIT */
/*
 * src/history: the window statistics against a plain double loop (and
 * their NaN, -0 and dtype rules), the layer and kind of a name, the
 * comparison of two real steps (tests/fixtures/history, written by verl:
 * what the generator froze is identical, what it trained changed), and
 * the SVG's escaping of names. The figures against torch are
 * tests/py/test_diff.py's.
 */
#include <math.h>

#include "ckfs/history.h"
#include "ckfs/layouts.h"
#include "test.h"

#define HISTORY CKFS_FIXTURES "/history"

static void naive(const float *a, const float *b, size_t n, double *a2, double *d2, double *mx)
{
	*a2 = *d2 = *mx = 0;
	for (size_t i = 0; i < n; i++) {
		double d = (double)b[i] - (double)a[i];
		*a2 += (double)a[i] * a[i];
		*d2 += d * d;
		*mx = fabs(d) > *mx ? fabs(d) : *mx;
	}
}

static void test_window_sums(void)
{
	enum { N = 5003 }; /* not a multiple of the lanes or the blocks */
	static float a[N], b[N];
	struct ckfs_diff_sums s;
	double a2, d2, mx;

	for (int i = 0; i < N; i++) {
		a[i] = (float)sin(i * 0.37) * 0.05f;
		b[i] = i % 7 ? a[i] : a[i] + 0.001f * (float)(i % 13);
	}
	naive(a, b, N, &a2, &d2, &mx);
	ckfs_diff_window(CKFS_DTYPE_F32, a, CKFS_DTYPE_F32, b, N, &s);
	CHECK_EQ_INT(s.numel, N);
	CHECK(s.bytes_differ);
	CHECK(s.max_abs == mx); /* exact */
	CHECK(fabs(s.a2 - a2) <= 1e-13 * a2);
	CHECK(fabs(s.d2 - d2) <= 1e-13 * d2);
	uint64_t changed = 0;
	for (int i = 0; i < N; i++)
		changed += a[i] != b[i];
	CHECK_EQ_INT(s.changed, changed);
	CHECK(fabs(ckfs_diff_rel_l2(&s) - sqrt(d2) / sqrt(a2)) < 1e-12);

	ckfs_diff_window(CKFS_DTYPE_F32, a, CKFS_DTYPE_F32, a, N, &s);
	CHECK(!s.bytes_differ);
	CHECK_EQ_INT(s.changed, 0);
	CHECK(s.max_abs == 0 && s.d2 == 0);
	CHECK(ckfs_diff_rel_l2(&s) == 0);
	CHECK(fabs(ckfs_diff_cosine(&s) - 1) < 1e-15);
}

static void test_window_edges(void)
{
	const float za[4] = { 0.0f, 1.0f, NAN, 2.0f }, zb[4] = { -0.0f, 1.0f, NAN, 2.0f };
	struct ckfs_diff_sums s;

	/* -0 against 0: bytes differ, no element changed; NaN against NaN:
	 * not changed either, but the max is NaN (torch's (b - a).abs().max()) */
	ckfs_diff_window(CKFS_DTYPE_F32, za, CKFS_DTYPE_F32, zb, 4, &s);
	CHECK(s.bytes_differ);
	CHECK_EQ_INT(s.changed, 0);
	CHECK(isnan(s.max_abs));

	/* the same values in two dtypes: compared by value, bytes differ */
	const float f[3] = { 1.0f, -2.5f, 0.125f };
	const uint16_t h[3] = { 0x3F80, 0xC020, 0x3E00 }; /* the same values as bf16 */
	ckfs_diff_window(CKFS_DTYPE_F32, f, CKFS_DTYPE_BF16, h, 3, &s);
	CHECK(s.bytes_differ);
	CHECK_EQ_INT(s.changed, 0);
	CHECK(s.max_abs == 0);

	/* ||A|| = 0: no relative change when nothing changed, infinite otherwise */
	struct ckfs_diff_sums z = { 0 };
	CHECK(ckfs_diff_rel_l2(&z) == 0);
	z.d2 = 1;
	CHECK(isinf(ckfs_diff_rel_l2(&z)));
	CHECK(isnan(ckfs_diff_cosine(&z)));

	/* windows add up; a NaN maximum stays */
	struct ckfs_diff_sums t = { 0 }, w1 = { .numel = 2, .max_abs = 3, .a2 = 1 },
			      w2 = { .numel = 1, .max_abs = NAN, .a2 = 2 };
	ckfs_diff_sums_add(&t, &w1);
	ckfs_diff_sums_add(&t, &w2);
	ckfs_diff_sums_add(&t, &w1);
	CHECK_EQ_INT(t.numel, 5);
	CHECK(isnan(t.max_abs) && t.a2 == 4);
}

static void test_names(void)
{
	static const struct {
		const char *name, *layer;
		enum ckfs_diff_kind kind;
	} cases[] = {
		{ "model.layers.3.self_attn.q_proj.weight", "model.layers.3", CKFS_KIND_ATTENTION },
		{ "model.layers.3.self_attn.q_norm.weight", "model.layers.3", CKFS_KIND_NORM },
		{ "model.layers.12.mlp.down_proj.weight", "model.layers.12", CKFS_KIND_MLP },
		{ "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0", CKFS_KIND_EXPERTS },
		{ "model.layers.0.mlp.experts.7.w1.weight", "model.layers.0", CKFS_KIND_EXPERTS },
		{ "model.layers.0.mlp.gate.weight", "model.layers.0", CKFS_KIND_EXPERTS },
		{ "model.layers.0.mlp.shared_expert_gate.weight", "model.layers.0", CKFS_KIND_EXPERTS },
		{ "model.layers.1.input_layernorm.weight", "model.layers.1", CKFS_KIND_NORM },
		{ "model.embed_tokens.weight", "model.embed_tokens", CKFS_KIND_EMBEDDING },
		{ "lm_head.weight", "lm_head", CKFS_KIND_EMBEDDING },
		{ "model.norm.weight", "model.norm", CKFS_KIND_NORM },
		{ "score.weight", "score", CKFS_KIND_OTHER },
		{ "model.visual.blocks.2.attn.qkv.weight", "model.visual.blocks.2", CKFS_KIND_ATTENTION },
		{ "lora_adapter/base_model.model.model.layers.4.mlp.up_proj.lora_B.weight",
		  "model.layers.4", CKFS_KIND_MLP },
		{ "bias", "bias", CKFS_KIND_OTHER },
		{ "x1.2a.weight", "x1.2a", CKFS_KIND_OTHER }, /* "2a" is no number */
	};
	char buf[256];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ckfs_diff_layer_of(cases[i].name, buf, sizeof(buf));
		CHECK_EQ_STR(buf, cases[i].layer);
		CHECK_EQ_STR(ckfs_diff_kind_name(ckfs_diff_kind_of(cases[i].name)),
			     ckfs_diff_kind_name(cases[i].kind));
	}
}

static struct ckfs_model *open_step(const char *run, int step, const struct ckfs_model_options *o)
{
	char path[1024];
	struct ckfs_model *m = NULL;
	struct ckfs_error err;

	ckfs_error_clear(&err);
	snprintf(path, sizeof(path), HISTORY "/%s/global_step_%d/actor", run, step);
	if (ckfs_model_open(path, o, &m, &err) != CKFS_OK)
		fprintf(stderr, "%s\n", err.msg);
	return m;
}

/* The frozen run: the embeddings and layer 0 were frozen by the generator. */
static void test_frozen_steps(void)
{
	const struct ckfs_model_options o = { .as_stored = true };
	struct ckfs_model *a = open_step("frozen_run", 1, &o), *b = open_step("frozen_run", 3, &o);
	struct ckfs_diff *d1 = NULL, *d4 = NULL;
	struct ckfs_error err;

	ckfs_error_clear(&err);
	CHECK(a && b);
	if (!a || !b)
		goto out;
	CHECK(ckfs_diff_models(a, b, 1, &d1, &err) == CKFS_OK);
	CHECK(ckfs_diff_models(a, b, 4, &d4, &err) == CKFS_OK);
	if (!d1 || !d4)
		goto out;
	for (size_t i = 0; i < d1->n_tensors; i++) {
		const struct ckfs_diff_tensor *t = &d1->tensors[i];
		bool frozen = strncmp(t->name, "model.embed_tokens.", 19) == 0 ||
			      strncmp(t->name, "model.layers.0.", 15) == 0;
		CHECK_EQ_INT(t->status, frozen ? CKFS_DIFF_IDENTICAL : CKFS_DIFF_CHANGED);
		/* the same figures whatever the threads */
		CHECK(memcmp(&t->sums, &d4->tensors[i].sums, sizeof(t->sums)) == 0);
	}
	CHECK_EQ_INT(d1->n_layers, 6);
	CHECK_EQ_STR(d1->layers[0].name, "model.embed_tokens");
	CHECK_EQ_INT(d1->layers[1].identical, d1->layers[1].tensors);
	CHECK(d1->layers[2].changed > 0);
	CHECK_EQ_INT(d1->total.tensors, d1->n_tensors);
	CHECK(d1->bytes_read > 0);
	/* a model against itself: everything identical */
	ckfs_diff_free(d4);
	d4 = NULL;
	CHECK(ckfs_diff_models(a, a, 2, &d4, &err) == CKFS_OK);
	CHECK(d4 && d4->total.identical == d4->total.tensors);
out:
	ckfs_diff_free(d1);
	ckfs_diff_free(d4);
	ckfs_model_free(a);
	ckfs_model_free(b);
}

/* The LoRA run against the frozen run: other models, so names and shapes
 * on one side; never compared across. */
static void test_one_side(void)
{
	const struct ckfs_model_options o = { .as_stored = true };
	struct ckfs_model *a = open_step("lora_run", 2, &o), *b = open_step("frozen_run", 2, &o);
	struct ckfs_diff *d = NULL;
	struct ckfs_error err;
	size_t only_a = 0, only_b = 0;

	ckfs_error_clear(&err);
	CHECK(a && b && ckfs_diff_models(a, b, 2, &d, &err) == CKFS_OK);
	for (size_t i = 0; d && i < d->n_tensors; i++) {
		const struct ckfs_diff_tensor *t = &d->tensors[i];
		if (strncmp(t->name, "lora_adapter/", 13) == 0) {
			CHECK_EQ_INT(t->status, CKFS_DIFF_ONLY_A);
			only_a++;
		}
		if (strncmp(t->name, "model.layers.2.", 15) == 0) {
			CHECK_EQ_INT(t->status, CKFS_DIFF_ONLY_B);
			only_b++;
		}
		if (t->status == CKFS_DIFF_ONLY_A)
			CHECK(t->a && !t->b);
	}
	CHECK(only_a > 0 && only_b > 0);
	CHECK_EQ_INT(d ? d->total.other : 0, only_a + only_b);
	ckfs_diff_free(d);
	ckfs_model_free(a);
	ckfs_model_free(b);
}

static void test_svg_escapes(void)
{
	struct ckfs_diff d = { 0 };
	struct ckfs_diff_group layer = { .name = "x<&\"\x01y", .tensors = 1, .changed = 1,
					 .sums = { .numel = 1, .changed = 1, .a2 = 4, .d2 = 1 } };
	const struct ckfs_diff *col = &d;
	const char *label = "1→2";
	struct ckfs_diff_history h = { .title = "ro<le", .labels = &label, .diffs = &col, .n = 1 };
	struct ckfs_error err;
	char *svg = NULL;
	size_t len = 0;

	d.layers = &layer;
	d.n_layers = 1;
	d.kinds[CKFS_KIND_OTHER] = layer;
	ckfs_error_clear(&err);
	CHECK(ckfs_diff_svg(&h, 1, &svg, &len, &err) == CKFS_OK);
	CHECK(svg && strlen(svg) == len);
	CHECK(svg && strstr(svg, "x&lt;&amp;&quot;?y"));
	CHECK(svg && strstr(svg, "ro&lt;le"));
	CHECK(svg && !strstr(svg, "x<&"));
	CHECK(svg && strstr(svg, "1→2"));
	CHECK(svg && strncmp(svg, "<?xml", 5) == 0 && strstr(svg, "</svg>\n"));
	free(svg);
}

int main(void)
{
	RUN(test_window_sums);
	RUN(test_window_edges);
	RUN(test_names);
	RUN(test_frozen_steps);
	RUN(test_one_side);
	RUN(test_svg_escapes);
	return test_summary();
}
