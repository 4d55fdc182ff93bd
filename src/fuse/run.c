/* SPDX-License-Identifier: MIT */
/*
 * A whole training run as one mount: the run's state (src/fuse/run_int.h
 * for the whole and the lock rules): the step table and its serials, the
 * plans with their references and LRU, the cache's fill callback, and the
 * life cycle. The handlers are in run_ops.c, the watcher in run_watch.c.
 *
 * Plans. A role's model and folder (its plan) are built on the first
 * lookup that needs them, with the mount's options, exactly as `ckfs
 * export` builds them, and kept in an LRU of at most max_plans. Every
 * open file holds a reference to its plan, so a plan evicted, or of a step
 * rotated away, keeps its sources open until the last file of it is
 * closed; the sources re-check their files before and after each read, so
 * a file deleted under an open handle fails with EIO instead of mixing
 * bytes (src/model/source.c). A plan that cannot be built makes its role
 * an empty folder, its reason logged and kept for the stats; it is tried
 * again when the role's files change.
 *
 * Cache. All plans share the one slice cache; a plan's files are cache
 * file ids (plan id << 20) | node, plan ids never reused, so a rebuilt
 * plan never sees the slices of another.
 */
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/run.h"
#include "fuse/fs.h"
#include "fuse/run.h"
#include "fuse/run_int.h"

/* ---- plans and their references (run->lock held where noted) ---- */

static void stats_put_locked(struct run_stats *s)
{
	if (s && --s->refs == 0)
		free(s);
}

static void plan_free(struct ckfs_run *run, struct run_plan *p)
{
	(void)run;
	if (p->replied)
		ckfs_fs_replied_free(p->f, p->replied);
	ckfs_folder_free(p->f);
	ckfs_model_free(p->m);
	free(p->modes);
	free(p);
	/* A plan's metadata (pickle trees of every rank while it was built,
	 * then the plan) is freed in many small pieces on the thread that
	 * built it; give the pages back so that a walk over many steps stays
	 * within the cache budget plus the LRU's plans. */
	malloc_trim(0);
}

/* Drop a reference; the plan is freed (its sources closed) with the last.
 * Takes run->lock. */
void run_plan_put(struct ckfs_run *run, struct run_plan *p)
{
	bool last;

	if (!p)
		return;
	pthread_mutex_lock(&run->lock);
	last = --p->refs == 0;
	if (last) {
		for (struct run_plan **pp = &run->all; *pp; pp = &(*pp)->all_next)
			if (*pp == p) {
				*pp = p->all_next;
				break;
			}
		stats_put_locked(p->stats);
	}
	pthread_mutex_unlock(&run->lock);
	if (last)
		plan_free(run, p);
}

static void lru_unlink_locked(struct ckfs_run *run, struct run_plan *p)
{
	if (p->prev)
		p->prev->next = p->next;
	else
		run->lru_head = p->next;
	if (p->next)
		p->next->prev = p->prev;
	else
		run->lru_tail = p->prev;
	p->prev = p->next = NULL;
	p->in_lru = false;
	run->n_lru--;
}

static void lru_front_locked(struct ckfs_run *run, struct run_plan *p)
{
	if (p->in_lru)
		lru_unlink_locked(run, p);
	p->next = run->lru_head;
	p->prev = NULL;
	if (run->lru_head)
		run->lru_head->prev = p;
	run->lru_head = p;
	if (!run->lru_tail)
		run->lru_tail = p;
	p->in_lru = true;
	run->n_lru++;
}

/* The role whose plan p is, or NULL. */
static struct run_role *plan_role_locked(struct ckfs_run *run, const struct run_plan *p)
{
	for (size_t i = 0; i < run->n_steps; i++)
		for (size_t r = 0; r < run->steps[i]->n_roles; r++)
			if (run->steps[i]->roles[r].plan == p)
				return &run->steps[i]->roles[r];
	return NULL;
}

/* Take plans out of the LRU down to max_plans; their LRU references are
 * appended to drop[] (at most *n_drop of room) for run_plan_put after unlock. */
static void lru_trim_locked(struct ckfs_run *run, size_t max, struct run_plan **drop,
			    size_t *n_drop, size_t cap)
{
	while (run->n_lru > max && *n_drop < cap) {
		struct run_plan *p = run->lru_tail;
		struct run_role *role = plan_role_locked(run, p);
		if (role)
			role->plan = NULL;
		lru_unlink_locked(run, p);
		drop[(*n_drop)++] = p;
	}
}

/* ---- the step table (run->lock held) ---- */

struct run_step *run_step_by_serial(struct ckfs_run *run, uint64_t serial)
{
	for (size_t i = 0; i < run->n_steps; i++)
		if (run->steps[i]->serial == serial)
			return run->steps[i];
	return NULL;
}

struct run_step *run_step_by_name(struct ckfs_run *run, const char *name)
{
	for (size_t i = 0; i < run->n_steps; i++)
		if (strcmp(run->steps[i]->name, name) == 0)
			return run->steps[i];
	return NULL;
}

/* Free a step taken out of the table; its plans' LRU references go to
 * drop[] (room: its role count). */
void run_step_free_locked(struct ckfs_run *run, struct run_step *s, struct run_plan **drop,
			  size_t *n_drop)
{
	for (size_t r = 0; r < s->n_roles; r++) {
		struct run_role *role = &s->roles[r];
		if (role->plan) {
			lru_unlink_locked(run, role->plan);
			drop[(*n_drop)++] = role->plan;
		}
		free(role->name);
		free(role->error);
	}
	free(s->roles);
	stats_put_locked(s->stats);
	free(s);
}

struct run_step *run_step_new(struct ckfs_run *run, const struct ckfs_run_step *rs)
{
	struct run_step *s = calloc(1, sizeof(*s));
	struct run_stats *st = calloc(1, sizeof(*st));

	if (!s || !st) {
		free(s);
		free(st);
		return NULL;
	}
	s->step = rs->step;
	snprintf(s->name, sizeof(s->name), "%s", rs->name);
	s->roles_hash = rs->roles_hash;
	s->mtime = rs->mtime;
	s->n_roles_seen = rs->n_roles;
	s->serial = ++run->next_serial;
	st->refs = 1;
	st->step = rs->step;
	s->stats = st;
	return s;
}

/* The roles of s, listed on first use (a readdir of the step folder). */
int run_step_roles(struct ckfs_run *run, struct run_step *s)
{
	char path[PATH_MAX], **names;
	size_t n;
	struct ckfs_error err;
	uint64_t serial;

	pthread_mutex_lock(&run->lock);
	bool listed = s->roles_listed;
	serial = s->serial;
	snprintf(path, sizeof(path), "%s/%s", run->base, s->name);
	pthread_mutex_unlock(&run->lock);
	if (listed)
		return 0;
	ckfs_error_clear(&err);
	if (ckfs_run_roles(path, &names, &n, &err) != CKFS_OK) {
		ckfs_log(CKFS_LOG_WARNING, "%s", err.msg);
		names = NULL;
		n = 0;
	}
	size_t all = n;
	if (n > MAX_ROLES)
		n = MAX_ROLES; /* the rest are never shown */
	struct run_role *roles = calloc(n ? n : 1, sizeof(*roles));
	if (!roles) {
		ckfs_run_roles_free(names, all);
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		roles[i].name = names[i];
		names[i] = NULL;
	}
	ckfs_run_roles_free(names, all);
	pthread_mutex_lock(&run->lock);
	/* Still the same step, and nobody listed it meanwhile? */
	if (run_step_by_serial(run, serial) == s && !s->roles_listed) {
		s->roles = roles;
		s->n_roles = n;
		s->roles_listed = true;
		roles = NULL;
	}
	pthread_mutex_unlock(&run->lock);
	if (roles) {
		for (size_t i = 0; i < n; i++)
			free(roles[i].name);
		free(roles);
	}
	return 0;
}

/* ---- building a plan ---- */

static enum ckfs_code build_plan(struct ckfs_run *run, const char *path, struct run_plan *p,
				 struct ckfs_error *err)
{
	const struct ckfs_mount_options *opt = run->opt;

	CKFS_TRY(ckfs_run_open_role(opt->src, path, &opt->model, &p->m, err));
	for (size_t i = 0; i < p->m->n_warnings; i++)
		ckfs_log(CKFS_LOG_WARNING, "%s: warning: %s", p->label, p->m->warnings[i]);
	CKFS_TRY(ckfs_folder_build(p->m, &opt->folder, &p->f, err));
	if (p->f->n_nodes > MAX_NODES)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': %zu files, more than a run mount serves "
				 "per role (%u)", path, p->f->n_nodes, MAX_NODES);
	CKFS_TRY(ckfs_fs_replied_new(p->f, opt->slice_size, &p->replied, err));
	return ckfs_fs_modes(opt, run->fs.uid, run->fs.gid, p->f, &p->modes, &p->root_mode, err);
}

/*
 * The plan of role r of the step with this serial, with a reference the
 * caller drops (run_plan_put); NULL when the step is gone, the role does not
 * exist or its plan cannot be built (*broken then).
 */
struct run_plan *run_role_plan(struct ckfs_run *run, uint64_t serial, size_t r, bool *broken)
{
	char path[PATH_MAX];
	struct run_plan *p, *drop[8];
	size_t n_drop = 0;
	struct ckfs_error err;
	uint64_t fp = 0;
	bool fp_ok;

	*broken = false;
	pthread_mutex_lock(&run->lock);
	struct run_step *s = run_step_by_serial(run, serial);
	if (!s || r >= s->n_roles) {
		pthread_mutex_unlock(&run->lock);
		return NULL;
	}
	if ((p = s->roles[r].plan)) {
		p->refs++;
		lru_front_locked(run, p);
		pthread_mutex_unlock(&run->lock);
		return p;
	}
	snprintf(path, sizeof(path), "%s/%s/%s", run->base, s->name, s->roles[r].name);
	pthread_mutex_unlock(&run->lock);

	pthread_mutex_lock(&run->build_lock);
	ckfs_error_clear(&err);
	fp_ok = ckfs_run_fingerprint(path, &fp, NULL, &err) == CKFS_OK;
	/* Built by another thread meanwhile, or known broken and unchanged? */
	pthread_mutex_lock(&run->lock);
	s = run_step_by_serial(run, serial);
	if (!s || r >= s->n_roles) {
		pthread_mutex_unlock(&run->lock);
		pthread_mutex_unlock(&run->build_lock);
		return NULL;
	}
	struct run_role *role = &s->roles[r];
	if ((p = role->plan)) {
		p->refs++;
		lru_front_locked(run, p);
		pthread_mutex_unlock(&run->lock);
		pthread_mutex_unlock(&run->build_lock);
		return p;
	}
	if (role->error && fp_ok && fp == role->error_fp) {
		pthread_mutex_unlock(&run->lock);
		pthread_mutex_unlock(&run->build_lock);
		*broken = true;
		return NULL;
	}
	struct run_stats *stats = s->stats;
	stats->refs++;
	uint64_t id = ++run->next_plan;
	char label[96];
	snprintf(label, sizeof(label), "%s/%s", s->name, role->name);
	pthread_mutex_unlock(&run->lock);

	p = calloc(1, sizeof(*p));
	enum ckfs_code rc = CKFS_OK;
	if (!p) {
		rc = ckfs_nomem(&err);
	} else {
		p->id = id;
		p->stats = stats;
		snprintf(p->label, sizeof(p->label), "%s", label);
		ckfs_error_clear(&err);
		rc = build_plan(run, path, p, &err);
	}
	atomic_fetch_add(rc == CKFS_OK ? &stats->plans_built : &stats->plan_errors, 1);

	pthread_mutex_lock(&run->lock);
	s = run_step_by_serial(run, serial);
	role = s && r < s->n_roles ? &s->roles[r] : NULL;
	if (rc != CKFS_OK || !role) {
		if (role && rc != CKFS_OK) {
			free(role->error);
			role->error = strdup(err.msg[0] ? err.msg : ckfs_strerror(rc));
			role->error_fp = fp;
		}
		stats_put_locked(stats);
		pthread_mutex_unlock(&run->lock);
		pthread_mutex_unlock(&run->build_lock);
		if (rc != CKFS_OK)
			ckfs_log(CKFS_LOG_ERR, "%s: left empty: %s", label,
				 err.msg[0] ? err.msg : ckfs_strerror(rc));
		if (p) {
			stats = NULL;
			p->stats = NULL;
			plan_free(run, p);
		}
		*broken = rc != CKFS_OK;
		return NULL;
	}
	if (role->has_fp && fp_ok && fp != role->fp) {
		/* The step changed since its first plan: the kernel's inodes
		 * describe the old files. A new serial retires them; the caller
		 * (holding an old inode) gets ENOENT. */
		s->serial = ++run->next_serial;
		ckfs_log(CKFS_LOG_NOTICE, "%s: changed since it was first read; served anew",
			 label);
	}
	role->has_fp = fp_ok;
	role->fp = fp;
	free(role->error);
	role->error = NULL;
	p->refs = 2; /* the LRU's and the caller's */
	role->plan = p;
	p->all_next = run->all;
	run->all = p;
	lru_front_locked(run, p);
	lru_trim_locked(run, (size_t)run->opt->max_plans, drop, &n_drop, 8);
	bool retired = s->serial != serial;
	pthread_mutex_unlock(&run->lock);
	pthread_mutex_unlock(&run->build_lock);
	for (size_t i = 0; i < n_drop; i++)
		run_plan_put(run, drop[i]);
	if (retired) {
		/* Not invalidated from here (a handler must not wait on the
		 * kernel): the top's entries time out within a second. */
		run_plan_put(run, p);
		return NULL;
	}
	return p;
}

/* ---- the cache's fill callback ---- */

static enum ckfs_code run_fill(void *ctx, uint64_t file_id, uint64_t offset, size_t len,
			       void *buf, struct ckfs_error *err)
{
	struct ckfs_run *run = ctx;
	uint64_t id = file_id >> ROLE_SHIFT, node = file_id & ((1u << ROLE_SHIFT) - 1);
	struct run_plan *p;
	size_t got = 0;

	pthread_mutex_lock(&run->lock);
	for (p = run->all; p && p->id != id; p = p->all_next)
		;
	if (p)
		p->refs++;
	pthread_mutex_unlock(&run->lock);
	if (!p)
		return ckfs_fail(err, CKFS_E_CHANGED, "file %" PRIu64 " is no longer served",
				 file_id);
	enum ckfs_code rc = CKFS_OK;
	struct ckfs_read_scratch *scratch = ckfs_fs_scratch(&run->fs);
	if (node >= p->f->n_nodes)
		rc = ckfs_fail(err, CKFS_E_INVALID, "no file with id %" PRIu64, file_id);
	else if (!scratch)
		rc = ckfs_nomem(err);
	else
		rc = ckfs_folder_read(p->f, &p->f->nodes[node], offset, len, buf, &got, scratch,
				      err);
	if (rc == CKFS_OK && got != len)
		rc = ckfs_fail(err, CKFS_E_TRUNCATED, "'%s/%s': %zu bytes at %" PRIu64
			       " read as %zu", p->label, p->f->nodes[node].name, len, offset, got);
	run_plan_put(run, p);
	return rc;
}

/* ---- life cycle ---- */

enum ckfs_code ckfs_run_new(const struct ckfs_mount_options *opt, bool single,
			    struct ckfs_run **out, struct ckfs_error *err)
{
	struct ckfs_run *run = calloc(1, sizeof(*run));
	struct stat st;

	*out = NULL;
	if (!run)
		return ckfs_nomem(err);
	run->opt = opt;
	run->single = single;
	run->ino_fd = run->wake[0] = run->wake[1] = -1;
	pthread_mutex_init(&run->lock, NULL);
	pthread_mutex_init(&run->build_lock, NULL);
	*out = run;
	run->fs.uid = opt->has_uid ? opt->uid : getuid();
	run->fs.gid = opt->has_gid ? opt->gid : getgid();
	if (single) {
		/* Listed as a run of one step: its parent folder, this name. */
		const char *slash = strrchr(opt->src, '/');
		if (!slash || slash == opt->src)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': a step at the top of the "
					 "file system", opt->src);
		run->base = strndup(opt->src, (size_t)(slash - opt->src));
	} else {
		run->base = strdup(opt->src);
	}
	if (!run->base)
		return ckfs_nomem(err);
	if (stat(opt->src, &st) != 0)
		return ckfs_fail_errno(err, "'%s'", opt->src);
	run->dir_mode = opt->has_umask ? 0555 & ~opt->umask : st.st_mode & 0555;
	CKFS_TRY(ckfs_fs_init_shared(&run->fs, opt, run_fill, run, err));

	/* The first listing: names, the tracker, stat; no rank file. */
	if (single) {
		struct ckfs_run_step rs;
		uint64_t step;
		const char *why;
		memset(&rs, 0, sizeof(rs));
		if (ckfs_run_step_name(strrchr(opt->src, '/') + 1, &step, &why) !=
		    CKFS_STEP_NAME_OK)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': not a step folder", opt->src);
		rs.step = step;
		rs.mtime = st.st_mtim;
		snprintf(rs.name, sizeof(rs.name), CKFS_RUN_STEP_PREFIX "%" PRIu64, step);
		run->steps = calloc(1, sizeof(*run->steps));
		if (!run->steps || !(run->steps[0] = run_step_new(run, &rs)))
			return ckfs_nomem(err);
		run->n_steps = 1;
		return CKFS_OK;
	}
	CKFS_TRY(run_watch_init(run, err));
	pthread_mutex_lock(&run->lock);
	size_t n = run->n_steps;
	pthread_mutex_unlock(&run->lock);
	ckfs_log(CKFS_LOG_INFO, "'%s': a run, %zu step%s shown%s%s", opt->src, n,
		 n == 1 ? "" : "s", run->latest[0] ? ", latest " : "", run->latest);
	return CKFS_OK;
}

void ckfs_run_free(struct ckfs_run *run)
{
	struct run_plan *drop[1];

	if (!run)
		return;
	ckfs_run_stop(run);
	if (run->ino_fd >= 0)
		close(run->ino_fd);
	if (run->wake[0] >= 0) {
		close(run->wake[0]);
		close(run->wake[1]);
	}
	/* No request is in flight: every plan left is the LRU's. */
	pthread_mutex_lock(&run->lock);
	for (size_t i = 0; i < run->n_steps; i++) {
		struct run_step *s = run->steps[i];
		for (size_t r = 0; r < s->n_roles; r++) {
			struct run_plan *p = s->roles[r].plan;
			if (!p)
				continue;
			lru_unlink_locked(run, p);
			s->roles[r].plan = NULL;
			size_t n = 0;
			drop[n++] = p;
			pthread_mutex_unlock(&run->lock);
			run_plan_put(run, drop[0]);
			pthread_mutex_lock(&run->lock);
		}
		size_t n_drop = 0;
		run_step_free_locked(run, s, drop, &n_drop);
	}
	free(run->steps);
	ckfs_run_scan_release(&run->scan);
	pthread_mutex_unlock(&run->lock);
	ckfs_fs_release(&run->fs);
	pthread_mutex_destroy(&run->lock);
	pthread_mutex_destroy(&run->build_lock);
	free(run->base);
	free(run);
}
