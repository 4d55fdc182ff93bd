/* SPDX-License-Identifier: MIT */
/*
 * ckfs_diff_models (include/ckfs/history.h): the tensors two models
 * serve, paired by name, compared window by window on worker threads.
 *
 * Work is cut into windows of CKFS_DIFF_WINDOW elements over every
 * compared tensor, numbered in tensor order; a worker takes the next
 * window, reads it from both models through the read path (the bytes a
 * mount would serve, in the served dtype), and writes that window's sums
 * into its slot. Once every worker is done the slots are added per tensor
 * in window order, so the figures are the same whatever the number of
 * threads. Memory: two window buffers per thread, plus one slot (72
 * bytes) per window.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/history.h"

struct served {
	const char *name;
	const struct ckfs_tensor *t;
};

/* The tensors m serves, named as the folder names them: the model's,
 * then a LoRA adapter's when it is served (in lora_adapter/, or alone). */
static enum ckfs_code served_list(const struct ckfs_model *m, struct ckfs_arena *ar,
				  struct served **out, size_t *n, struct ckfs_error *err)
{
	const struct ckfs_lora *l = m->lora;
	bool adapter = l && l->mode == CKFS_LORA_ADAPTER;
	bool alone = l && l->only && m->n_tensors == 0;
	size_t total = m->n_tensors + (adapter ? l->n_tensors : 0);
	struct served *v = ckfs_arena_calloc(ar, total + 1, sizeof(*v));

	if (!v)
		return ckfs_nomem(err);
	for (size_t i = 0; i < m->n_tensors; i++)
		v[i] = (struct served){ m->tensors[i].name, &m->tensors[i] };
	for (size_t i = 0; adapter && i < l->n_tensors; i++) {
		const char *name = alone ? l->tensors[i].name
					 : ckfs_arena_printf(ar, "lora_adapter/%s", l->tensors[i].name);
		if (!name)
			return ckfs_nomem(err);
		v[m->n_tensors + i] = (struct served){ name, &l->tensors[i] };
	}
	*out = v;
	*n = total;
	return CKFS_OK;
}

static int cmp_served(const void *x, const void *y)
{
	return strcmp(((const struct served *)x)->name, ((const struct served *)y)->name);
}

static bool same_shape(const struct ckfs_tensor *a, const struct ckfs_tensor *b)
{
	return a->ndim == b->ndim &&
	       memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(a->shape[0])) == 0;
}

/* d->tensors: A's tensors in A's order, each with its partner in B, then
 * B's tensors A lacks, in B's order. */
static enum ckfs_code pair(struct ckfs_diff *d, const struct ckfs_model *a,
			   const struct ckfs_model *b, struct ckfs_error *err)
{
	struct served *va, *vb, *sorted;
	size_t na, nb;
	bool *matched;

	CKFS_TRY(served_list(a, &d->arena, &va, &na, err));
	CKFS_TRY(served_list(b, &d->arena, &vb, &nb, err));
	sorted = ckfs_arena_calloc(&d->arena, nb + 1, sizeof(*sorted));
	matched = ckfs_arena_calloc(&d->arena, nb + 1, sizeof(*matched));
	d->tensors = ckfs_arena_calloc(&d->arena, na + nb + 1, sizeof(*d->tensors));
	if (!sorted || !matched || !d->tensors)
		return ckfs_nomem(err);
	memcpy(sorted, vb, nb * sizeof(*vb));
	qsort(sorted, nb, sizeof(*sorted), cmp_served);
	for (size_t i = 0; i < na; i++) {
		struct ckfs_diff_tensor *t = &d->tensors[d->n_tensors++];
		const struct served *hit = bsearch(&va[i], sorted, nb, sizeof(*sorted), cmp_served);
		t->name = va[i].name;
		t->a = va[i].t;
		t->status = CKFS_DIFF_ONLY_A;
		if (hit) {
			matched[hit - sorted] = true;
			t->b = hit->t;
			t->status = same_shape(t->a, t->b) ? CKFS_DIFF_CHANGED : CKFS_DIFF_SHAPE;
		}
	}
	for (size_t i = 0; i < nb; i++) {
		const struct served *hit = bsearch(&vb[i], sorted, nb, sizeof(*sorted), cmp_served);
		if (matched[hit - sorted])
			continue;
		struct ckfs_diff_tensor *t = &d->tensors[d->n_tensors++];
		t->name = vb[i].name;
		t->b = vb[i].t;
		t->status = CKFS_DIFF_ONLY_B;
	}
	return CKFS_OK;
}

struct job {
	const struct ckfs_model *ma, *mb;
	struct ckfs_diff_tensor **compared;  /* the tensors compared, in order */
	size_t n_compared;
	size_t *first;                       /* per compared tensor: its first
					      * window; n_compared + 1 */
	struct ckfs_diff_sums *win;
	size_t n_windows, max_elem;
	atomic_size_t next;
	struct ckfs_first_error fail;
};

/* The compared tensor window w belongs to. */
static size_t tensor_of(const struct job *j, size_t w)
{
	size_t lo = 0, hi = j->n_compared; /* first[lo] <= w < first[hi] */

	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if (j->first[mid] <= w)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

static void *worker(void *arg)
{
	struct job *j = arg;
	struct ckfs_read_scratch scratch = { 0 };
	struct ckfs_error err;
	unsigned char *a = malloc((size_t)CKFS_DIFF_WINDOW * j->max_elem);
	unsigned char *b = malloc((size_t)CKFS_DIFF_WINDOW * j->max_elem);

	ckfs_error_clear(&err);
	if (!a || !b) {
		ckfs_nomem(&err);
		ckfs_first_error_set(&j->fail, &err);
	}
	while (a && b && !atomic_load(&j->fail.failed)) {
		size_t w = atomic_fetch_add(&j->next, 1);
		if (w >= j->n_windows)
			break;
		size_t i = tensor_of(j, w);
		const struct ckfs_diff_tensor *t = j->compared[i];
		uint64_t first = (uint64_t)(w - j->first[i]) * CKFS_DIFF_WINDOW;
		uint64_t left = t->a->numel - first;
		size_t n = left < CKFS_DIFF_WINDOW ? (size_t)left : CKFS_DIFF_WINDOW;
		if (ckfs_tensor_read(j->ma, t->a, first, n, a, &scratch, &err) != CKFS_OK ||
		    ckfs_tensor_read(j->mb, t->b, first, n, b, &scratch, &err) != CKFS_OK) {
			ckfs_first_error_set(&j->fail, &err);
			break;
		}
		ckfs_diff_window(t->a->out_dtype, a, t->b->out_dtype, b, n, &j->win[w]);
	}
	free(a);
	free(b);
	ckfs_read_scratch_release(&scratch);
	return NULL;
}

/* Run the workers over every window of the compared tensors. */
static enum ckfs_code compare(struct job *j, int threads, struct ckfs_error *err)
{
	pthread_t tids[256];
	int started = 0;

	if (threads < 1)
		threads = 1;
	if (threads > 256)
		threads = 256;
	if ((size_t)threads > j->n_windows)
		threads = j->n_windows ? (int)j->n_windows : 1;
	ckfs_first_error_init(&j->fail);
	for (int i = 0; i < threads && j->n_windows; i++) {
		if (pthread_create(&tids[i], NULL, worker, j) != 0) {
			ckfs_first_error_no_thread(&j->fail);
			break;
		}
		started++;
	}
	for (int i = 0; i < started; i++)
		pthread_join(tids[i], NULL);
	ckfs_first_error_destroy(&j->fail);
	if (j->fail.err.code != CKFS_OK) {
		*err = j->fail.err;
		return err->code;
	}
	return CKFS_OK;
}

static void group_add(struct ckfs_diff_group *g, const struct ckfs_diff_tensor *t)
{
	g->tensors++;
	if (t->status == CKFS_DIFF_IDENTICAL)
		g->identical++;
	else if (t->status == CKFS_DIFF_CHANGED)
		g->changed++;
	else
		g->other++;
	if (t->status <= CKFS_DIFF_CHANGED)
		ckfs_diff_sums_add(&g->sums, &t->sums);
}

/* The layer rows (in order of first appearance), the kinds and the total. */
static enum ckfs_code summarize(struct ckfs_diff *d, struct ckfs_error *err)
{
	char key[512];
	size_t last = 0;

	d->layers = ckfs_arena_calloc(&d->arena, d->n_tensors + 1, sizeof(*d->layers));
	if (!d->layers)
		return ckfs_nomem(err);
	for (int k = 0; k < CKFS_KIND_COUNT; k++)
		d->kinds[k].name = ckfs_diff_kind_name((enum ckfs_diff_kind)k);
	d->total.name = "total";
	for (size_t i = 0; i < d->n_tensors; i++) {
		struct ckfs_diff_tensor *t = &d->tensors[i];
		size_t l = d->n_layers;
		ckfs_diff_layer_of(t->name, key, sizeof(key));
		/* consecutive tensors mostly share their row */
		if (last < d->n_layers && strcmp(d->layers[last].name, key) == 0)
			l = last;
		for (size_t k = 0; l == d->n_layers && k < d->n_layers; k++)
			if (strcmp(d->layers[k].name, key) == 0)
				l = k;
		if (l == d->n_layers) {
			if (!(d->layers[l].name = ckfs_arena_strdup(&d->arena, key)))
				return ckfs_nomem(err);
			d->n_layers++;
		}
		last = t->layer = l;
		t->kind = ckfs_diff_kind_of(t->name);
		group_add(&d->layers[l], t);
		group_add(&d->kinds[t->kind], t);
		group_add(&d->total, t);
	}
	return CKFS_OK;
}

/* The job over d's compared tensors: their windows numbered in order. */
static enum ckfs_code plan_windows(struct ckfs_diff *d, struct job *j, struct ckfs_error *err)
{
	j->compared = ckfs_arena_calloc(&d->arena, d->n_tensors + 1, sizeof(*j->compared));
	j->first = ckfs_arena_calloc(&d->arena, d->n_tensors + 1, sizeof(*j->first));
	if (!j->compared || !j->first)
		return ckfs_nomem(err);
	for (size_t i = 0; i < d->n_tensors; i++) {
		struct ckfs_diff_tensor *t = &d->tensors[i];
		if (t->status != CKFS_DIFF_CHANGED) /* the pairs of one shape, so far */
			continue;
		size_t ea = ckfs_dtype_size(t->a->out_dtype), eb = ckfs_dtype_size(t->b->out_dtype);
		j->max_elem = ea > j->max_elem ? ea : j->max_elem;
		j->max_elem = eb > j->max_elem ? eb : j->max_elem;
		j->first[j->n_compared] = j->n_windows;
		j->compared[j->n_compared++] = t;
		j->n_windows += (t->a->numel + CKFS_DIFF_WINDOW - 1) / CKFS_DIFF_WINDOW;
		d->bytes_read += t->a->numel * (ea + eb);
	}
	j->first[j->n_compared] = j->n_windows;
	j->win = calloc(j->n_windows + 1, sizeof(*j->win));
	return j->win ? CKFS_OK : ckfs_nomem(err);
}

enum ckfs_code ckfs_diff_models(const struct ckfs_model *a, const struct ckfs_model *b,
				int threads, struct ckfs_diff **out, struct ckfs_error *err)
{
	struct ckfs_diff *d = calloc(1, sizeof(*d));
	struct job j = { .ma = a, .mb = b };
	enum ckfs_code rc;

	*out = NULL;
	if (!d)
		return ckfs_nomem(err);
	ckfs_arena_init(&d->arena);
	rc = ckfs_model_checked(a, err);
	if (rc == CKFS_OK)
		rc = ckfs_model_checked(b, err);
	if (rc == CKFS_OK)
		rc = pair(d, a, b, err);
	if (rc == CKFS_OK)
		rc = plan_windows(d, &j, err);
	if (rc == CKFS_OK)
		rc = compare(&j, threads, err);
	for (size_t i = 0; rc == CKFS_OK && i < j.n_compared; i++) {
		struct ckfs_diff_tensor *t = j.compared[i];
		t->sums.bytes_differ = t->a->out_dtype != t->b->out_dtype;
		for (size_t w = j.first[i]; w < j.first[i + 1]; w++)
			ckfs_diff_sums_add(&t->sums, &j.win[w]);
		t->status = t->sums.bytes_differ ? CKFS_DIFF_CHANGED : CKFS_DIFF_IDENTICAL;
	}
	free(j.win);
	if (rc == CKFS_OK)
		rc = summarize(d, err);
	if (rc != CKFS_OK) {
		ckfs_diff_free(d);
		return rc;
	}
	*out = d;
	return CKFS_OK;
}

void ckfs_diff_free(struct ckfs_diff *d)
{
	if (!d)
		return;
	ckfs_arena_release(&d->arena);
	free(d);
}
