/* SPDX-License-Identifier: MIT */
/*
 * Deferred checks (include/ckfs/model.h): a layout may hand out a model
 * whose plan was built from part of its sources (verl FSDP: rank 0's file)
 * while the rest are checked by a thread started at the end of open, once
 * the shared passes (names, dtypes) have made the model final. Until that
 * thread has finished, no tensor byte is served: ckfs_model_checked waits
 * for it, and after a failure every tensor read fails with the check's
 * message (fail closed; the failure is also logged once, on one line,
 * naming the file and the cause). The thread writes the parts of the plan
 * it checked (file positions, strides) before it reports, under the lock
 * the readers take, so a reader that got CKFS_OK sees the whole plan.
 */
#include "ckfs/model.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/log.h"

struct ckfs_checks {
	pthread_mutex_t lock;
	pthread_cond_t done_cv;
	pthread_t thread;
	bool done;                 /* under lock */
	_Atomic int ok;            /* done without failure: readers' fast path */
	_Atomic bool stop;         /* the model is being freed */
	struct ckfs_error err;     /* the failure, when done && !ok */
	struct ckfs_checks_job job;
	bool started;              /* the thread runs: set once, at open */
};

static void *checks_main(void *arg)
{
	struct ckfs_checks *c = arg;
	struct ckfs_error err;

	ckfs_error_clear(&err);
	enum ckfs_code rc = c->job.run(c->job.ctx, &c->stop, &err);
	if (rc != CKFS_OK && !atomic_load(&c->stop))
		ckfs_log(CKFS_LOG_ERR, "%s", err.msg[0] ? err.msg : ckfs_strerror(rc));
	pthread_mutex_lock(&c->lock);
	c->done = true;
	if (rc == CKFS_OK)
		atomic_store(&c->ok, 1);
	else
		c->err = err;
	pthread_cond_broadcast(&c->done_cv);
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

enum ckfs_code ckfs_checks_defer(struct ckfs_model *m, const struct ckfs_checks_job *job,
				 struct ckfs_error *err)
{
	struct ckfs_checks *c = calloc(1, sizeof(*c));

	if (!c) {
		job->free_ctx(job->ctx);
		return ckfs_nomem(err);
	}
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->done_cv, NULL);
	c->job = *job;
	m->checks = c;
	return CKFS_OK;
}

enum ckfs_code ckfs_checks_start(struct ckfs_model *m, struct ckfs_error *err)
{
	struct ckfs_checks *c = m->checks;

	if (!c || c->started)
		return CKFS_OK;
	if (c->job.ready)
		CKFS_TRY(c->job.ready(c->job.ctx, m, err));
	int e = pthread_create(&c->thread, NULL, checks_main, c);
	if (e != 0) {
		errno = e;
		return ckfs_fail_errno(err, "cannot start the rank checks");
	}
	c->started = true;
	return CKFS_OK;
}

enum ckfs_code ckfs_model_checked(const struct ckfs_model *m, struct ckfs_error *err)
{
	struct ckfs_checks *c = m->checks;

	if (!c || atomic_load_explicit(&c->ok, memory_order_acquire))
		return CKFS_OK;
	if (!c->started) /* a model that did not come from ckfs_model_open */
		return ckfs_fail(err, CKFS_E_INVALID, "the deferred checks never started");
	pthread_mutex_lock(&c->lock);
	while (!c->done)
		pthread_cond_wait(&c->done_cv, &c->lock);
	enum ckfs_code rc = CKFS_OK;
	if (!atomic_load(&c->ok)) {
		rc = c->err.code != CKFS_OK ? c->err.code : CKFS_E_INVALID;
		if (err) {
			*err = c->err;
			err->code = rc;
		}
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}

void ckfs_checks_free(struct ckfs_model *m)
{
	struct ckfs_checks *c = m->checks;

	if (!c)
		return;
	atomic_store(&c->stop, true);
	if (c->started)
		pthread_join(c->thread, NULL);
	c->job.free_ctx(c->job.ctx);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->done_cv);
	free(c);
	m->checks = NULL;
}
