/* SPDX-License-Identifier: MIT */
/*
 * A whole training run as one mount: listing the run again as it changes
 * (src/fuse/run_tree.h for the whole).
 *
 * Steps. The run folder is listed at mount (names, the tracker and stat
 * only: src/layouts/run.c) and again whenever inotify reports a change in
 * it or in a step folder (a step created or removed, the tracker closed
 * after writing, a role folder removed by rotation). Without a tracker the
 * newest step is re-checked by a timer, armed only while it waits for its
 * quiet time, so an idle mount costs nothing. Each rescan is compared with
 * what is shown: steps that appeared or left, and `latest`, are
 * invalidated in the kernel (fuse_lowlevel_notify_inval_entry) at once;
 * the top folder's entries also time out after a second.
 *
 * A run in an object store (an s3:// source) has no inotify: its prefix
 * is listed again every -o s3_poll seconds (include/ckfs/remote.h), then
 * rescanned as after an event.
 */
#define FUSE_USE_VERSION 312

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "ckfs/remote.h"
#include "ckfs/run.h"
#include "ckfs/s3.h"
#include "fuse/run_tree.h"

/* Coalescing of inotify bursts (rmtree removes many files): wait this
 * long for the burst to end before listing the run again. */
#define SETTLE_MS 50

/* ---- listing the run again ---- */

/* The kernel forgets an entry of the top folder. */
static void inval_top(struct ckfs_run *run, const char *name)
{
	if (run->se && !run->single)
		fuse_lowlevel_notify_inval_entry(run->se, FUSE_ROOT_ID, name, strlen(name));
}

/* What a listing changed in the step table. */
struct change {
	char **gone, **came;                /* step names (NULL: out of memory) */
	size_t n_gone, n_came;
	struct run_plan **drop;             /* the plans of steps gone */
	size_t n_drop;
	bool latest_moved;
};

static void change_free(struct change *c)
{
	for (size_t i = 0; i < c->n_gone; i++)
		free(c->gone[i]);
	for (size_t i = 0; i < c->n_came; i++)
		free(c->came[i]);
	free(c->gone);
	free(c->came);
	free(c->drop);
}

/* List the run folder, without the lock (I/O); only the tracker's last
 * good value is taken from the previous listing. *pending: when to list
 * again without an event. */
static enum ckfs_code list_run(struct ckfs_run *run, struct ckfs_run_scan *scan, long *pending,
			       struct ckfs_error *err)
{
	struct ckfs_run_scan prev;
	struct timespec now;

	memset(&prev, 0, sizeof(prev));
	pthread_mutex_lock(&run->lock);
	prev.tracker_ok = run->scan.tracker_ok;
	prev.tracker = run->scan.tracker;
	pthread_mutex_unlock(&run->lock);
	CKFS_TRY(ckfs_run_scan(run->base, &prev, scan, err));
	clock_gettime(CLOCK_REALTIME, &now);
	*pending = ckfs_run_classify(scan, &now);
	if (scan->tracker_error[0])
		ckfs_log(CKFS_LOG_WARNING, "%s%s", scan->tracker_error,
			 scan->tracker_ok ? "; the step it named before is kept" : "");
	return CKFS_OK;
}

/* The steps scan shows, in next[]: a shown step is kept as it is when
 * still shown with the same roles; anything else is new (its old inodes
 * die with its serial). Returns how many (run->lock held). */
static size_t next_steps_locked(struct ckfs_run *run, const struct ckfs_run_scan *scan,
				struct run_step **next, struct change *c)
{
	size_t n_next = 0;

	for (size_t i = 0; i < scan->n_steps; i++) {
		const struct ckfs_run_step *rs = &scan->steps[i];
		bool shown = rs->state == CKFS_STEP_SHOWN || (run->single && i == 0);
		if (!shown)
			continue;
		struct run_step *s = run_step_by_name(run, rs->name);
		if (s && s->roles_hash == rs->roles_hash) {
			next[n_next++] = s;
			continue;
		}
		struct run_step *ns = run_step_new(run, rs);
		if (!ns)
			continue; /* left out; the next event tries again */
		next[n_next++] = ns;
		c->came[c->n_came++] = strdup(rs->name);
	}
	return n_next;
}

/* Make the step table and latest match scan, which it takes (run->lock
 * held); false when out of memory (nothing changed). */
static bool apply_locked(struct ckfs_run *run, struct ckfs_run_scan *scan, struct change *c)
{
	char old_latest[40];
	size_t roles = 0;

	for (size_t i = 0; i < run->n_steps; i++)
		roles += run->steps[i]->n_roles;
	c->gone = calloc(run->n_steps + 1, sizeof(*c->gone));
	c->came = calloc(scan->n_steps + 1, sizeof(*c->came));
	c->drop = calloc(roles + 1, sizeof(*c->drop));
	struct run_step **next = calloc(scan->n_steps + 1, sizeof(*next));
	if (!c->gone || !c->came || !c->drop || !next) {
		free(next);
		return false;
	}
	size_t n_next = next_steps_locked(run, scan, next, c);
	for (size_t i = 0; i < run->n_steps; i++) {
		struct run_step *s = run->steps[i];
		bool kept = false;
		for (size_t k = 0; k < n_next && !kept; k++)
			kept = next[k] == s;
		if (kept)
			continue;
		c->gone[c->n_gone++] = strdup(s->name);
		run_step_free_locked(run, s, c->drop, &c->n_drop);
	}
	free(run->steps);
	run->steps = next;
	run->n_steps = n_next;
	snprintf(old_latest, sizeof(old_latest), "%s", run->latest);
	const struct ckfs_run_step *lt = ckfs_run_latest(scan);
	snprintf(run->latest, sizeof(run->latest), "%s",
		 lt && run_step_by_name(run, lt->name) ? lt->name : "");
	c->latest_moved = strcmp(old_latest, run->latest) != 0;
	ckfs_run_scan_release(&run->scan);
	run->scan = *scan;
	return true;
}

/* After the table changed: drop the plans of steps gone, say what
 * changed, and have the kernel forget it. */
static void publish_change(struct ckfs_run *run, struct change *c)
{
	for (size_t i = 0; i < c->n_drop; i++)
		run_plan_put(run, c->drop[i]);
	for (size_t i = 0; i < c->n_gone; i++) {
		if (c->gone[i]) {
			ckfs_log(CKFS_LOG_NOTICE, "%s: no longer shown", c->gone[i]);
			inval_top(run, c->gone[i]);
		}
	}
	for (size_t i = 0; i < c->n_came; i++) {
		if (c->came[i]) {
			ckfs_log(CKFS_LOG_INFO, "%s: shown", c->came[i]);
			inval_top(run, c->came[i]);
		}
	}
	if (c->latest_moved) {
		inval_top(run, "latest");
		if (run->se && !run->single)
			fuse_lowlevel_notify_inval_inode(run->se, INO_LATEST, 0, 0);
		ckfs_log(CKFS_LOG_INFO, "latest -> %s", run->latest[0] ? run->latest : "(none)");
	}
	if ((c->n_gone || c->n_came || c->latest_moved) && run->se && !run->single)
		fuse_lowlevel_notify_inval_inode(run->se, FUSE_ROOT_ID, 0, 0);
}

/* List the run folder and make the step table match it. Returns the
 * seconds until it must be listed again without an event (0: never); or,
 * when the folder cannot be listed, -1 with *fail set (fail given: the
 * first listing) or 0 after logging it (the steps shown stay). */
static long rescan(struct ckfs_run *run, struct ckfs_error *fail)
{
	struct ckfs_run_scan scan;
	struct change c = { 0 };
	struct ckfs_error err;
	long pending = 0;

	ckfs_error_clear(&err);
	if (list_run(run, &scan, &pending, &err) != CKFS_OK) {
		if (fail) {
			*fail = err;
			return -1;
		}
		ckfs_log(CKFS_LOG_ERR, "%s; the steps shown stay as they were", err.msg);
		return 0;
	}
	pthread_mutex_lock(&run->lock);
	bool applied = apply_locked(run, &scan, &c);
	pthread_mutex_unlock(&run->lock);
	if (applied) {
		publish_change(run, &c);
	} else {
		ckfs_log(CKFS_LOG_ERR, "out of memory listing '%s'", run->base);
		ckfs_run_scan_release(&scan);
		pending = 0;
	}
	change_free(&c);
	return pending;
}

/* ---- the watcher thread ---- */

#define WATCH_TOP (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_CLOSE_WRITE | \
		   IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
#define WATCH_STEP (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ONLYDIR)

/* Watch every step folder (roles removed by rotation are noticed there);
 * a watch already on a folder is kept (inotify returns the same one). */
static void watch_steps(struct ckfs_run *run)
{
	char path[PATH_MAX];

	pthread_mutex_lock(&run->lock);
	size_t n = run->scan.n_steps;
	char (*names)[40] = calloc(n ? n : 1, sizeof(*names));
	for (size_t i = 0; names && i < n; i++)
		memcpy(names[i], run->scan.steps[i].name, sizeof(names[i]));
	pthread_mutex_unlock(&run->lock);
	for (size_t i = 0; names && i < n; i++) {
		snprintf(path, sizeof(path), "%s/%s", run->base, names[i]);
		inotify_add_watch(run->ino_fd, path, WATCH_STEP);
	}
	free(names);
}

/* The store's listing of the run again (its snapshot); on failure the
 * last one stays. */
static void refresh_store(struct ckfs_run *run)
{
	struct ckfs_error err;

	ckfs_error_clear(&err);
	if (ckfs_remote_refresh(run->base, &err) != CKFS_OK)
		ckfs_log(CKFS_LOG_ERR, "%s; the steps shown stay as they were", err.msg);
}

static void *watcher_main(void *arg)
{
	struct ckfs_run *run = arg;
	char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
	bool store = ckfs_s3_is_url(run->base);

	for (;;) {
		/* (a store's run: no inotify descriptor, poll skips it) */
		struct pollfd pfd[2] = { { run->ino_fd, POLLIN, 0 }, { run->wake[0], POLLIN, 0 } };
		/* Without tracker, the newest step waits for its quiet time:
		 * a timer only then, so an idle mount sleeps; a store's run
		 * is listed every s3_poll seconds. */
		int timeout = run->pending_s > 0 ? (int)run->pending_s * 1000 + 100 : -1;
		if (store && (timeout < 0 || timeout > run->opt->s3_poll_s * 1000))
			timeout = run->opt->s3_poll_s * 1000;
		int n = poll(pfd, 2, timeout);
		if (n < 0 && errno != EINTR)
			break;
		if (pfd[1].revents)
			break;
		if (n > 0 && (pfd[0].revents & POLLIN)) {
			/* Drain the burst: rmtree and a save make many events. */
			do {
				while (read(run->ino_fd, buf, sizeof(buf)) > 0)
					;
				pfd[0].revents = 0;
			} while (poll(pfd, 1, SETTLE_MS) > 0 && (pfd[0].revents & POLLIN));
		}
		if (store)
			refresh_store(run);
		run->pending_s = rescan(run, NULL);
		if (!store)
			watch_steps(run);
	}
	return NULL;
}

/* ---- life cycle ---- */

/* Watched before the first listing: what changes meanwhile waits in the
 * inotify queue for the watcher (started once mounted). */
enum ckfs_code run_watch_init(struct ckfs_run *run, struct ckfs_error *err)
{
	bool store = ckfs_s3_is_url(run->base);

	if (!store) {
		run->ino_fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
		if (run->ino_fd < 0 || inotify_add_watch(run->ino_fd, run->base, WATCH_TOP) < 0)
			return ckfs_fail_errno(err, "cannot watch '%s' (inotify)", run->base);
	}
	run->pending_s = rescan(run, err);
	if (run->pending_s < 0)
		return err->code;
	if (!store)
		watch_steps(run);
	return CKFS_OK;
}

enum ckfs_code run_watch_start(struct ckfs_run *run, struct fuse_session *se,
			       struct ckfs_error *err)
{
	run->se = se;
	if (run->single)
		return CKFS_OK;
	if (pipe2(run->wake, O_CLOEXEC) != 0)
		return ckfs_fail_errno(err, "cannot create a pipe");
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int rc = pthread_create(&run->watcher, NULL, watcher_main, run);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0)
		return ckfs_fail(err, CKFS_E_NOMEM, "cannot start the run watcher");
	run->watching = true;
	return CKFS_OK;
}

void run_watch_stop(struct ckfs_run *run)
{
	if (run->watching) {
		char c = 0;
		ssize_t w = write(run->wake[1], &c, 1);
		(void)w;
		pthread_join(run->watcher, NULL);
		run->watching = false;
	}
	run->se = NULL;
}

void run_watch_close(struct ckfs_run *run)
{
	if (run->ino_fd >= 0)
		close(run->ino_fd);
	if (run->wake[0] >= 0) {
		close(run->wake[0]);
		close(run->wake[1]);
	}
	run->ino_fd = run->wake[0] = run->wake[1] = -1;
}
