/* SPDX-License-Identifier: MIT */
/*
 * The verl FSDP reader's fast path (fsdp.c is the rest; fsdp_int.h what
 * they share): FSDP2 actors take it, the plan from rank 0 alone, the other
 * ranks checked on threads, at open or, for a mount, after it
 * (-o rank_checks), with their file positions kept in the plan cache
 * (plan_cache.c).
 *
 * When rank 0 sits at mesh position 0 and holds only DTensors and plain
 * tensors (FSDP2), every rank's blocks follow from rank 0's metadata: the
 * global shape, the placements and the rank's mesh coordinate
 * (ckfs_entry_predict). The plan is built from rank 0's file alone; each
 * other rank's file is then parsed and checked against rank 0 exactly as
 * fsdp.c's sequential path does (fsdp_check_entry, ckfs_entry_chunks), and
 * gives its blocks their file positions and strides. The checks of
 * different ranks touch disjoint chunks, so they run on several threads;
 * they run before the model is handed out (inspect, export, verify, mount
 * with rank_checks=mount) or, for a mount, after it, with no tensor byte
 * served until they passed (src/model/checks.c). Errors are those of the
 * first failing rank in mesh order, as the sequential path reports them.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "ckfs/log.h"
#include "layouts/fsdp_int.h"

/* ---- the fast path: a plan from rank 0, the other ranks checked after ---- */

#define RANK_CHECK_THREADS 8
#define AUTO_DEFER_ENTRIES 100000 /* (ranks - 1) x keys: about 0.1 s of checks */

/* The failure with the lowest index among workers that take indices in
 * increasing order (keys, mesh positions): what one thread would report. */
struct lowest_fail {
	pthread_mutex_t lock;
	size_t at;               /* the lowest failing index, or SIZE_MAX */
	struct ckfs_error err;
};

static void lowest_fail_init(struct lowest_fail *f)
{
	pthread_mutex_init(&f->lock, NULL);
	f->at = SIZE_MAX;
}

/* Whether an index below i failed already (work on i would be wasted). */
static bool lowest_fail_below(struct lowest_fail *f, size_t i)
{
	pthread_mutex_lock(&f->lock);
	bool below = f->at < i;
	pthread_mutex_unlock(&f->lock);
	return below;
}

static void lowest_fail_note(struct lowest_fail *f, size_t i, const struct ckfs_error *e)
{
	pthread_mutex_lock(&f->lock);
	if (i < f->at) {
		f->at = i;
		f->err = *e;
	}
	pthread_mutex_unlock(&f->lock);
}

/* CKFS_OK, or the lowest failure in *err; f destroyed. */
static enum ckfs_code lowest_fail_end(struct lowest_fail *f, struct ckfs_error *err)
{
	pthread_mutex_destroy(&f->lock);
	if (f->at == SIZE_MAX)
		return CKFS_OK;
	*err = f->err;
	return err->code;
}

struct rank_plan {
	struct ckfs_model *m;
	size_t n_keys, world;
	const char **keys;        /* rank 0's keys, m's arena */
	size_t *order;            /* key indices sorted by key */
	struct expect *x;         /* per key, in m's arena */
	struct acc *accs;         /* borrowed from the build until it ends */
	struct ckfs_chunk **chunks, **copies; /* per key, m's arena */
	uint32_t *start;          /* per key, world + 1: see plan_key */
	uint32_t *lo, *hi;        /* per key: ranks 1.. blocks in chunks or copies */
	_Atomic bool irregular;   /* a rank's strides or neg bits differ from
				   * the foreseen: no plan cache record */
	long *ranks;
	int64_t (*coords)[CKFS_MAX_DIMS];
	pthread_mutex_t lock;     /* interning into m (ckfs_model_dims) */
	_Atomic size_t next;      /* the next position to check */
	struct lowest_fail fail;  /* of the positions checked */
	_Atomic bool *stop;
	struct ckfs_torch_like *like; /* rank 0's file, to read the others by */
	_Atomic size_t n_like;        /* rank files read by it */
};

void fsdp_rank_plan_free(void *p)
{
	struct rank_plan *rp = p;

	if (!rp)
		return;
	free(rp->order);
	free(rp->chunks);
	free(rp->copies);
	free(rp->start);
	free(rp->lo);
	free(rp->hi);
	free(rp->ranks);
	free(rp->coords);
	ckfs_torch_like_free(rp->like);
	pthread_mutex_destroy(&rp->lock);
	pthread_mutex_destroy(&rp->fail.lock);
	free(rp);
}

/* Whether rank 0's state dict allows the fast path, and no later step
 * derives chunks from the plan's (LoRA pairs, fused expert stacks cut per
 * expert, --base): those copy file positions the checks fill in later. */
static bool plan_eligible(const struct build *b)
{
	if (b->ranks[0] != 0 || b->opt->base_path || b->m->world_size < 2)
		return false;
	for (size_t i = 0; i < b->n_keys; i++) {
		const struct ckfs_sd_entry *e = &b->first.entries[i];
		if (e->kind == CKFS_ENTRY_SHARDED || e->local.dtype == CKFS_DTYPE_INVALID ||
		    strstr(e->key, "lora_") || strncmp(e->key, "base_model.", 11) == 0 ||
		    strstr(e->key, "experts.gate_up_proj") || strstr(e->key, "experts.down_proj"))
			return false;
	}
	return true;
}

/* Key k's chunks for every position: position 0's from rank 0's entry
 * (checked against itself: its mesh coordinate), the others foreseen.
 * start[p] (p >= 1) is where position p's blocks begin in the copies
 * (plain tensor) or the chunks (DTensor); start[world] ends them. */
static enum ckfs_code plan_key(struct rank_plan *rp, const struct ckfs_sd_entry *e, size_t k,
			       struct ckfs_chunk_list *cl, struct ckfs_chunk_list *pl,
			       struct ckfs_error *err)
{
	struct ckfs_model *m = rp->m;
	uint32_t *start = &rp->start[k * (rp->world + 1)];
	struct acc *a = &rp->accs[k];
	bool plain = e->kind == CKFS_ENTRY_TENSOR;
	int ndim = rp->x[k].ndim;

	cl->n = pl->n = 0;
	CKFS_TRY(fsdp_check_entry(&rp->x[k], e, 0, rp->coords[0], err));
	CKFS_TRY(ckfs_entry_chunks(e, rp->coords[0], 0, 0, cl, err));
	for (size_t p = 1; p < rp->world; p++) {
		struct ckfs_chunk_list *l = plain ? pl : cl;
		start[p] = (uint32_t)l->n;
		CKFS_TRY(ckfs_entry_predict(e, rp->coords[p], (uint32_t)rp->ranks[p],
					    (int)rp->ranks[p], l, err));
	}
	start[rp->world] = (uint32_t)(plain ? pl->n : cl->n);
	rp->lo[k] = start[1];
	rp->hi[k] = start[rp->world];
	if (cl->n > UINT32_MAX || pl->n > UINT32_MAX)
		return ckfs_fail(err, CKFS_E_LIMIT, "tensor '%s': too many pieces", e->key);
	pthread_mutex_lock(&rp->lock); /* keys are planned on several threads */
	a->packed = ckfs_model_chunks(m, cl->v, cl->n, ndim);
	a->packed_copies = ckfs_model_chunks(m, pl->v, pl->n, ndim);
	pthread_mutex_unlock(&rp->lock);
	if (!a->packed || !a->packed_copies)
		return ckfs_nomem(err);
	a->n_packed = (uint32_t)cl->n;
	a->n_packed_copies = (uint32_t)pl->n;
	a->key = rp->keys[k];
	a->first = e;
	a->x = rp->x[k];
	rp->chunks[k] = a->packed;
	rp->copies[k] = a->packed_copies;
	return CKFS_OK;
}

/* The expectation of key k from rank 0's entry e, kept in m: its shape
 * interned, its mesh and placements shared with the previous key's when
 * equal (FSDP2 gives every parameter the same). */
static enum ckfs_code plan_expect(struct rank_plan *rp, const struct ckfs_sd_entry *e, size_t k,
				  const struct ckfs_dtensor_info **last, struct ckfs_error *err)
{
	struct ckfs_model *m = rp->m;
	struct expect x = fsdp_expect_of(e, 0);

	x.shape = ckfs_model_dims(m, x.shape, x.ndim > 0 ? x.ndim : 1);
	rp->keys[k] = ckfs_arena_strdup(&m->arena, e->key);
	if (!x.shape || !rp->keys[k])
		return ckfs_nomem(err);
	if (x.di) {
		const struct ckfs_dtensor_info *d = e->dtensor, *l = *last;
		if (!l || l->mesh_ndim != d->mesh_ndim ||
		    memcmp(l->mesh_shape, d->mesh_shape, sizeof(d->mesh_shape)) != 0 ||
		    memcmp(l->placements, d->placements, sizeof(d->placements)) != 0) {
			struct ckfs_dtensor_info *c = ckfs_arena_calloc(&m->arena, 1, sizeof(*c));
			if (!c)
				return ckfs_nomem(err);
			c->mesh_ndim = d->mesh_ndim;
			memcpy(c->mesh_shape, d->mesh_shape, sizeof(c->mesh_shape));
			memcpy(c->placements, d->placements, sizeof(c->placements));
			*last = c;
		}
		x.di = *last;
	}
	rp->x[k] = x;
	return CKFS_OK;
}

/* The CPUs, at most RANK_CHECK_THREADS and at most most (>= 1). */
static size_t worker_count(size_t most)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t n = cpus > 1 ? (size_t)cpus : 1;

	n = n < RANK_CHECK_THREADS ? n : RANK_CHECK_THREADS;
	return n < most ? n : most > 0 ? most : 1;
}

/* fn(arg) on n threads, this one among them, until all return. */
static void run_workers(void *(*fn)(void *), void *arg, size_t n)
{
	pthread_t th[RANK_CHECK_THREADS];
	size_t started = 0;

	for (; started + 1 < n && started + 1 < RANK_CHECK_THREADS; started++)
		if (pthread_create(&th[started], NULL, fn, arg) != 0)
			break;
	fn(arg);
	for (size_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
}

/* Keys planned on several threads (plan_key), a batch at a time; the
 * error is that of the first failing key, as one thread would report. */
struct plan_job {
	struct rank_plan *rp;
	const struct ckfs_sd_entry *entries;
	size_t batch;
	_Atomic size_t next;
	struct lowest_fail fail;
};

static void *plan_worker(void *arg)
{
	struct plan_job *j = arg;
	struct rank_plan *rp = j->rp;
	struct ckfs_chunk_list cl = { 0 }, pl = { 0 };
	struct ckfs_error err;

	for (;;) {
		size_t k = atomic_fetch_add(&j->next, j->batch), end = k + j->batch;
		if (k >= rp->n_keys || lowest_fail_below(&j->fail, k))
			break;
		for (; k < end && k < rp->n_keys; k++) {
			ckfs_error_clear(&err);
			if (plan_key(rp, &j->entries[k], k, &cl, &pl, &err) != CKFS_OK) {
				lowest_fail_note(&j->fail, k, &err);
				break;
			}
		}
	}
	free(cl.v);
	free(pl.v);
	return NULL;
}

static enum ckfs_code plan_keys(struct rank_plan *rp, const struct ckfs_sd_entry *entries,
				struct ckfs_error *err)
{
	struct plan_job j = { .rp = rp, .entries = entries };
	size_t n = worker_count(RANK_CHECK_THREADS);

	/* about 16 batches a thread, of at most 64 keys */
	j.batch = rp->n_keys / (16 * n);
	j.batch = j.batch < 1 ? 1 : j.batch > 64 ? 64 : j.batch;
	lowest_fail_init(&j.fail);
	run_workers(plan_worker, &j, n);
	return lowest_fail_end(&j.fail, err);
}

static enum ckfs_code plan_build(struct build *b, struct rank_plan **out, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	size_t n = b->n_keys, w = (size_t)m->world_size;
	struct rank_plan *rp = calloc(1, sizeof(*rp));
	const struct ckfs_dtensor_info *last = NULL;
	enum ckfs_code rc = CKFS_OK;

	*out = NULL;
	if (!rp)
		return ckfs_nomem(err);
	pthread_mutex_init(&rp->lock, NULL);
	lowest_fail_init(&rp->fail);
	rp->m = m;
	rp->n_keys = n;
	rp->world = w;
	rp->accs = b->accs;
	rp->keys = ckfs_arena_calloc(&m->arena, n, sizeof(*rp->keys));
	rp->x = ckfs_arena_calloc(&m->arena, n, sizeof(*rp->x));
	rp->order = malloc(n * sizeof(*rp->order));
	rp->chunks = calloc(n, sizeof(*rp->chunks));
	rp->copies = calloc(n, sizeof(*rp->copies));
	rp->start = calloc(n * (w + 1), sizeof(*rp->start));
	rp->lo = calloc(n + 1, sizeof(*rp->lo));
	rp->hi = calloc(n + 1, sizeof(*rp->hi));
	rp->ranks = malloc(w * sizeof(*rp->ranks));
	rp->coords = malloc(w * sizeof(*rp->coords));
	if (!rp->keys || !rp->x || !rp->order || !rp->chunks || !rp->copies || !rp->start ||
	    !rp->ranks || !rp->coords || !rp->lo || !rp->hi) {
		fsdp_rank_plan_free(rp);
		return ckfs_nomem(err);
	}
	memcpy(rp->order, b->order, n * sizeof(*rp->order));
	memcpy(rp->ranks, b->ranks, w * sizeof(*rp->ranks));
	memcpy(rp->coords, b->coords, w * sizeof(*rp->coords));
	rc = ckfs_torch_like_new(&b->first, &rp->like, err);
	m->ranks_read[0] = 0;
	for (size_t k = 0; rc == CKFS_OK && k < n; k++)
		rc = plan_expect(rp, &b->first.entries[k], k, &last, err);
	if (rc == CKFS_OK && (rc = plan_keys(rp, b->first.entries, err)) != CKFS_OK)
		ckfs_error_prefix(err, "'%s'", m->sources[0].path);
	for (size_t p = 0; p < w; p++)
		m->ranks_read[p] = (int)b->ranks[p];
	if (rc != CKFS_OK) {
		fsdp_rank_plan_free(rp);
		return rc;
	}
	*out = rp;
	return CKFS_OK;
}

/* Rank file of position p against rank 0's plan: each entry checked as
 * the sequential path checks it; its blocks give the foreseen chunks
 * their file positions and strides. */
static enum ckfs_code check_position(struct rank_plan *rp, size_t p, struct ckfs_arena *spare,
				     struct ckfs_error *err)
{
	struct ckfs_model *m = rp->m;
	int rank = (int)rp->ranks[p];
	const struct ckfs_source *s = &m->sources[rank];
	struct ckfs_torch_file tf;
	struct ckfs_chunk_list got = { 0 };
	unsigned char *seen = calloc(rp->n_keys + 1, 1);
	enum ckfs_code rc;

	if (!seen)
		return ckfs_nomem(err);
	const struct ckfs_torch_open_opts o = {
		.label = s->path, .derive_locals = true, .spare = spare,
		.like = rp->like, .coord = rp->coords[p],
	};
	rc = ckfs_torch_open(&tf, s->f, &o, err);
	if (rc != CKFS_OK) {
		free(seen);
		return rc;
	}
	if (tf.from_like)
		atomic_fetch_add(&rp->n_like, 1);
	/* this thread alone writes rank's source until the checks report */
	rc = ckfs_torch_guards(&m->sources[rank], &tf, err);
	for (size_t i = 0; rc == CKFS_OK && i < tf.n_entries; i++) {
		struct ckfs_sd_entry scratch;
		const struct ckfs_sd_entry *e = ckfs_torch_entry(&tf, i, &scratch);
		/* ranks save their state dicts in the same order: try i first */
		size_t k = i < rp->n_keys && strcmp(rp->keys[i], e->key) == 0
				   ? i : fsdp_find_key(rp->keys, rp->order, rp->n_keys, e->key);
		if (k == SIZE_MAX) {
			rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': tensor '%s' is not in rank "
				       "0's state dict", s->path, e->key);
			break;
		}
		if (seen[k]) {
			rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': duplicate key '%s'", s->path,
				       e->key);
			break;
		}
		seen[k] = 1;
		got.n = 0;
		rc = fsdp_check_entry(&rp->x[k], e, rank, rp->coords[p], err);
		if (rc == CKFS_OK)
			rc = ckfs_entry_chunks(e, rp->coords[p], (uint32_t)rank, rank, &got, err);
		if (rc != CKFS_OK) {
			ckfs_error_prefix(err, "'%s'", s->path);
			break;
		}
		const uint32_t *start = &rp->start[k * (rp->world + 1)];
		struct ckfs_chunk *dst = e->kind == CKFS_ENTRY_TENSOR ? rp->copies[k] : rp->chunks[k];
		uint32_t a = start[p], z = p + 1 < rp->world ? start[p + 1] : start[rp->world];
		int nd = rp->x[k].ndim > 0 ? rp->x[k].ndim : 1;
		bool same = got.n == z - a;
		for (size_t j = 0; same && j < got.n; j++)
			same = memcmp(got.v[j].shape, dst[a + j].shape, sizeof(int64_t) * nd) == 0 &&
			       memcmp(got.v[j].offset, dst[a + j].offset, sizeof(int64_t) * nd) == 0;
		if (!same) { /* cannot happen when fsdp_check_entry passed: a bug */
			rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': tensor '%s': the blocks of "
				       "rank %d differ from those rank 0's placement gives",
				       s->path, e->key, rank);
			break;
		}
		for (size_t j = 0; j < got.n; j++) {
			struct ckfs_chunk *c = &dst[a + j];
			c->pos = got.v[j].pos;
			c->neg = got.v[j].neg;
			if (c->neg)
				atomic_store(&rp->irregular, true);
			if (memcmp(got.v[j].stride, c->stride, sizeof(int64_t) * nd) == 0)
				continue;
			atomic_store(&rp->irregular, true);
			pthread_mutex_lock(&rp->lock);
			c->stride = ckfs_model_dims(m, got.v[j].stride, nd);
			pthread_mutex_unlock(&rp->lock);
			if (!c->stride) {
				rc = ckfs_nomem(err);
				break;
			}
		}
	}
	/* Keys of rank 0 this rank lacks (extra ones failed above). */
	for (size_t k = 0; rc == CKFS_OK && k < rp->n_keys; k++)
		if (!seen[k])
			rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': tensor '%s' of rank 0's "
				       "state dict is missing", s->path, rp->keys[k]);
	free(got.v);
	free(seen);
	ckfs_torch_close_keep(&tf, spare);
	return rc;
}

static void *check_worker(void *arg)
{
	struct rank_plan *rp = arg;
	struct ckfs_error err;
	/* One rank's parse after another in the same memory (ckfs_arena_recycle) */
	struct ckfs_arena spare = CKFS_ARENA_INIT;

	for (;;) {
		size_t p = atomic_fetch_add(&rp->next, 1);
		if (p >= rp->world || (rp->stop && atomic_load(rp->stop)))
			break;
		if (lowest_fail_below(&rp->fail, p))
			break;
		ckfs_error_clear(&err);
		if (check_position(rp, p, &spare, &err) != CKFS_OK)
			lowest_fail_note(&rp->fail, p, &err);
	}
	ckfs_arena_release(&spare);
	return NULL;
}

/* The plan cache's record: the file position of every block of ranks
 * 1 .. world-1, key by key in rank order (store: from the chunks into v;
 * else from v into the chunks). Its length with v NULL. */
#define PLAN_CACHE_KIND "verl FSDP: file positions of the blocks of ranks 1 and up, their storages' guards"
static size_t plan_positions(struct rank_plan *rp, uint64_t *v, bool store)
{
	size_t n = 0;

	for (size_t k = 0; k < rp->n_keys; k++) {
		struct ckfs_chunk *dst = rp->x[k].kind == CKFS_ENTRY_TENSOR ? rp->copies[k]
									 : rp->chunks[k];
		for (uint32_t j = rp->lo[k]; j < rp->hi[k]; j++, n++) {
			if (!v)
				continue;
			if (store)
				v[n] = dst[j].pos;
			else
				dst[j].pos = v[n];
		}
	}
	return n;
}

/* After the positions, the record holds the guards of ranks 1 ..
 * world-1 in position order (torch_guards.c: what is left to check
 * before each storage is read; an empty table where a rank has none),
 * so that a plan from the cache is read through the same checks. */
static size_t plan_guard_words(struct rank_plan *rp, uint64_t *v)
{
	static const struct ckfs_guards none = { .ctx = "" };
	size_t n = 0;

	for (size_t p = 1; p < rp->world; p++) {
		const struct ckfs_guards *gs = rp->m->sources[rp->ranks[p]].guards;
		n += ckfs_guards_words(gs ? gs : &none, v ? v + n : NULL);
	}
	return n;
}

/* The guards of ranks 1 .. world-1 dropped. */
static void plan_guards_drop(struct rank_plan *rp)
{
	for (size_t p = 1; p < rp->world; p++) {
		struct ckfs_source *s = &rp->m->sources[rp->ranks[p]];
		ckfs_guards_free(s->guards);
		s->guards = NULL;
	}
}

/* The guards of the words at v (n of them) installed, or false (none). */
static bool plan_guards_load(struct rank_plan *rp, const uint64_t *v, size_t n)
{
	struct ckfs_error err;
	size_t at = 0;

	plan_guards_drop(rp);
	for (size_t p = 1; p < rp->world; p++) {
		struct ckfs_source *s = &rp->m->sources[rp->ranks[p]];
		struct ckfs_guards *gs;
		size_t used;
		if (ckfs_guards_from_words(ckfs_torch_guard_fn(), v + at, n - at, &used, &gs,
					   &err) != CKFS_OK)
			break;
		at += used;
		if (gs->n == 0)
			ckfs_guards_free(gs);
		else
			s->guards = gs;
		if (p + 1 == rp->world && at == n)
			return true;
	}
	plan_guards_drop(rp);
	return false;
}

/* Positions from the plan cache when it holds these very files: then
 * the checks ran on them before and need not run again; what they left
 * to check before each storage is read (the guards) comes back too. */
static bool plan_from_cache(struct rank_plan *rp)
{
	size_t n = plan_positions(rp, NULL, false), got = 0;
	uint64_t *v = NULL;
	bool hit = ckfs_plan_cache_load_any(rp->m, PLAN_CACHE_KIND, n + 2 * (rp->world - 1), &v,
					    &got) &&
		   plan_guards_load(rp, v + n, got - n);

	if (hit)
		plan_positions(rp, v, false);
	free(v);
	return hit;
}

static void plan_to_cache(struct rank_plan *rp)
{
	size_t n = plan_positions(rp, NULL, true), gn = plan_guard_words(rp, NULL);
	uint64_t *v = malloc((n + gn + 1) * sizeof(*v));

	if (!v || atomic_load(&rp->irregular))
		goto out;
	plan_positions(rp, v, true);
	plan_guard_words(rp, v + n);
	ckfs_plan_cache_store(rp->m, PLAN_CACHE_KIND, v, n + gn);
out:
	free(v);
}

/* Check positions 1 .. world-1 on up to RANK_CHECK_THREADS threads. */
static enum ckfs_code check_positions(void *ctx, _Atomic bool *stop, struct ckfs_error *err)
{
	struct rank_plan *rp = ctx;

	rp->stop = stop;
	atomic_store(&rp->next, 1);
	run_workers(check_worker, rp, worker_count(rp->world - 1));
	if (stop && atomic_load(stop))
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': the rank checks were stopped",
				 rp->m->src_dir);
	if (rp->fail.at != SIZE_MAX) { /* the workers have returned */
		*err = rp->fail.err;
		return err->code;
	}
	plan_to_cache(rp);
	ckfs_log(CKFS_LOG_DEBUG, "'%s': %zu of %zu rank files read as rank 0's but for the "
		 "mesh coordinate, without running their pickles", rp->m->src_dir,
		 atomic_load(&rp->n_like), rp->world - 1);
	/* Done: what only the checks needed goes now, and the memory the
	 * parsed rank files used goes back to the system. */
	free(rp->start);
	rp->start = NULL;
	ckfs_torch_like_free(rp->like);
	rp->like = NULL;
#ifdef __GLIBC__
	malloc_trim(0);
#endif
	return CKFS_OK;
}

/* Whether the checks wait until after open: a mount asked for it, or
 * for auto, with many entries to check. */
static bool plan_defer(const struct build *b, const struct rank_plan *rp)
{
	if (b->opt->rank_checks == CKFS_RANK_CHECKS_AUTO)
		return (rp->world - 1) * rp->n_keys >= AUTO_DEFER_ENTRIES;
	return b->opt->rank_checks == CKFS_RANK_CHECKS_READ;
}

static int cmp_ptr(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)*(void *const *)a, y = (uintptr_t)*(void *const *)b;
	return x < y ? -1 : x > y;
}

/* Every served tensor's chunks are among the plan's arrays (LoRA, expert
 * splits and --base were ruled out by plan_eligible; this makes sure).
 * -1 when out of memory. */
static int plan_owns(const struct rank_plan *rp, const struct ckfs_model *m)
{
	struct ckfs_chunk **v = malloc((rp->n_keys + 1) * sizeof(*v));
	int owns = 1;

	if (!v)
		return -1;
	memcpy(v, rp->chunks, rp->n_keys * sizeof(*v));
	qsort(v, rp->n_keys, sizeof(*v), cmp_ptr);
	for (size_t i = 0; owns && i < m->n_tensors; i++) {
		const struct ckfs_tensor *t = &m->tensors[i];
		owns = (t->n_chunks == 0 && t->n_copies == 0) ||
		       bsearch(&t->chunks, v, rp->n_keys, sizeof(*v), cmp_ptr) != NULL;
	}
	free(v);
	return owns;
}

enum ckfs_code fsdp_plan_open(struct build *b, struct rank_plan **out, bool *defer,
			      struct ckfs_error *err)
{
	struct rank_plan *rp = NULL;
	enum ckfs_code rc;

	*out = NULL;
	*defer = false;
	if (!plan_eligible(b))
		return CKFS_OK;
	rc = plan_build(b, &rp, err);
	bool cached = rc == CKFS_OK && plan_from_cache(rp);
	*defer = rc == CKFS_OK && !cached && plan_defer(b, rp);
	if (rc == CKFS_OK && !cached && !*defer)
		rc = check_positions(rp, NULL, err);
	*out = rp;
	return rc;
}

/* The finished model still serves the plan's chunks (checked when the
 * thread is about to start, after names and dtypes were applied). */
static enum ckfs_code plan_ready(void *ctx, const struct ckfs_model *m, struct ckfs_error *err)
{
	int owns = m->lora ? 0 : plan_owns(ctx, m);

	if (owns < 0)
		return ckfs_nomem(err);
	if (!owns)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': the plan was changed "
				 "before its ranks were checked (a bug)", m->src_dir);
	return CKFS_OK;
}

enum ckfs_code fsdp_plan_defer_checks(struct rank_plan *rp, struct ckfs_model *m,
				      struct ckfs_error *err)
{
	const struct ckfs_checks_job job = {
		.run = check_positions,
		.ready = plan_ready,
		.free_ctx = fsdp_rank_plan_free,
		.ctx = rp,
	};

	rp->accs = NULL; /* the build's, freed with it */
	return ckfs_checks_defer(m, &job, err);
}
