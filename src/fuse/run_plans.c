/* SPDX-License-Identifier: MIT */
/*
 * A whole training run as one mount: its steps and plans
 * (src/fuse/run_tree.h for the whole and the lock rules): the step table
 * and its serials, the plans with their references and LRU, and building
 * a plan.
 *
 * Plans. A role's plan (its served folder: model and folder) is built on
 * the first lookup that needs it, with the mount's options, exactly as
 * `ckfs export` builds it, and kept in an LRU of at most max_plans. Every
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
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/run.h"
#include "fuse/run_tree.h"

/* ---- plans and their references (run->lock held where noted) ---- */

static void stats_put_locked(struct run_stats *s)
{
	if (s && --s->refs == 0)
		free(s);
}

static void plan_free(struct run_plan *p)
{
	ckfs_served_close(&p->served);
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
		plan_free(p);
}

/* The live plan with this id, with a reference; NULL when gone. */
struct run_plan *run_plan_by_id(struct ckfs_run *run, uint64_t id)
{
	struct run_plan *p;

	pthread_mutex_lock(&run->lock);
	for (p = run->all; p && p->id != id; p = p->all_next)
		;
	if (p)
		p->refs++;
	pthread_mutex_unlock(&run->lock);
	return p;
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

/* The roles of the step with this serial, listed on first use (a lookup
 * or readdir in the step folder): 0, ENOENT when the step is gone, or
 * ENOMEM. */
int run_step_roles(struct ckfs_run *run, uint64_t serial)
{
	char path[PATH_MAX], **names;
	size_t n;
	struct ckfs_error err;

	pthread_mutex_lock(&run->lock);
	struct run_step *s = run_step_by_serial(run, serial);
	bool listed = !s || s->roles_listed;
	if (s)
		snprintf(path, sizeof(path), "%s/%s", run->base, s->name);
	pthread_mutex_unlock(&run->lock);
	if (listed)
		return s ? 0 : ENOENT;
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
		return ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		roles[i].name = names[i];
		names[i] = NULL;
	}
	ckfs_run_roles_free(names, all);
	pthread_mutex_lock(&run->lock);
	/* Still shown, and nobody listed it meanwhile? */
	s = run_step_by_serial(run, serial);
	if (s && !s->roles_listed) {
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

/* ---- building a plan: find, build, publish ---- */

/* What one build of role r of the step with this serial knows. */
struct build {
	uint64_t serial;
	size_t r;
	char path[PATH_MAX];                /* the role folder */
	char label[96];                     /* global_step_N/role */
	uint64_t id, fp;
	bool fp_ok;
	struct run_stats *stats;            /* the step's, with a reference */
};

/* Role r of the step with this serial, or NULL (run->lock held). */
static struct run_role *role_locked(struct ckfs_run *run, uint64_t serial, size_t r)
{
	struct run_step *s = run_step_by_serial(run, serial);

	return s && r < s->n_roles ? &s->roles[r] : NULL;
}

/* The role's plan with a new reference, now the LRU's most recent; NULL
 * when it has none (run->lock held). */
static struct run_plan *plan_take_locked(struct ckfs_run *run, struct run_role *role)
{
	struct run_plan *p = role->plan;

	if (p) {
		p->refs++;
		lru_front_locked(run, p);
	}
	return p;
}

/* Find: the plan when built, else b->path set to the role's folder ("" when
 * the role is gone). */
static struct run_plan *plan_find(struct ckfs_run *run, struct build *b)
{
	struct run_plan *p = NULL;

	b->path[0] = '\0';
	pthread_mutex_lock(&run->lock);
	struct run_role *role = role_locked(run, b->serial, b->r);
	if (role && !(p = plan_take_locked(run, role)))
		snprintf(b->path, sizeof(b->path), "%s/%s/%s", run->base,
			 run_step_by_serial(run, b->serial)->name, role->name);
	pthread_mutex_unlock(&run->lock);
	return p;
}

/* Open the plan of b's role folder; *out is freed by the caller (plan_free)
 * even on failure. */
static enum ckfs_code plan_open(struct ckfs_run *run, const struct build *b,
				struct run_plan **out, struct ckfs_error *err)
{
	struct run_plan *p = calloc(1, sizeof(*p));

	*out = p;
	if (!p)
		return ckfs_nomem(err);
	p->id = b->id;
	CKFS_TRY(ckfs_served_open(&p->served, run->opt, b->path, b->label, run->fs.uid,
				  run->fs.gid, err));
	if (p->served.f->n_nodes > MAX_NODES)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': %zu files, more than a run mount serves "
				 "per role (%u)", b->path, p->served.f->n_nodes, MAX_NODES);
	p->served.file_base = b->id << ROLE_SHIFT;
	return CKFS_OK;
}

/* Record why the role cannot be served, and drop what was built. */
static void plan_failed(struct ckfs_run *run, struct build *b, struct run_plan *p,
			enum ckfs_code rc, const struct ckfs_error *err)
{
	pthread_mutex_lock(&run->lock);
	struct run_role *role = role_locked(run, b->serial, b->r);
	if (role && rc != CKFS_OK) {
		free(role->error);
		role->error = strdup(err->msg[0] ? err->msg : ckfs_strerror(rc));
		role->error_fp = b->fp;
	}
	stats_put_locked(b->stats);
	pthread_mutex_unlock(&run->lock);
	if (rc != CKFS_OK)
		ckfs_log(CKFS_LOG_ERR, "%s: left empty: %s", b->label,
			 err->msg[0] ? err->msg : ckfs_strerror(rc));
	if (p)
		plan_free(p);
}

/*
 * Publish: p becomes the role's plan, in the LRU, with a reference for
 * the caller. A step whose files changed since its first plan gets a new
 * serial; p is then not handed out (NULL), since the caller holds an old
 * inode. NULL too when the role went away meanwhile.
 */
static struct run_plan *plan_publish(struct ckfs_run *run, struct build *b, struct run_plan *p)
{
	struct run_plan *drop[8];
	size_t n_drop = 0;

	pthread_mutex_lock(&run->lock);
	struct run_step *s = run_step_by_serial(run, b->serial);
	struct run_role *role = role_locked(run, b->serial, b->r);
	if (!role) {
		pthread_mutex_unlock(&run->lock);
		plan_failed(run, b, p, CKFS_OK, NULL);
		return NULL;
	}
	if (role->has_fp && b->fp_ok && b->fp != role->fp) {
		/* The kernel's inodes describe the old files: a new serial
		 * retires them; the caller (holding an old inode) gets ENOENT. */
		s->serial = ++run->next_serial;
		ckfs_log(CKFS_LOG_NOTICE, "%s: changed since it was first read; served anew",
			 b->label);
	}
	role->has_fp = b->fp_ok;
	role->fp = b->fp;
	free(role->error);
	role->error = NULL;
	p->stats = b->stats; /* the build's reference moves to the plan */
	p->served.counters = &b->stats->io;
	p->refs = 2; /* the LRU's and the caller's */
	role->plan = p;
	p->all_next = run->all;
	run->all = p;
	lru_front_locked(run, p);
	lru_trim_locked(run, (size_t)run->opt->max_plans, drop, &n_drop, 8);
	bool retired = s->serial != b->serial;
	pthread_mutex_unlock(&run->lock);
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

/* Build, under run->build_lock: the plan, unless another thread built it
 * meanwhile or the role is known broken and unchanged (*broken). */
static struct run_plan *plan_build(struct ckfs_run *run, struct build *b, bool *broken)
{
	struct ckfs_error err;
	struct run_plan *p;

	ckfs_error_clear(&err);
	b->fp_ok = ckfs_run_fingerprint(b->path, &b->fp, NULL, &err) == CKFS_OK;
	pthread_mutex_lock(&run->lock);
	struct run_role *role = role_locked(run, b->serial, b->r);
	if (!role || (p = plan_take_locked(run, role))) {
		pthread_mutex_unlock(&run->lock);
		return role ? p : NULL;
	}
	if (role->error && b->fp_ok && b->fp == role->error_fp) {
		pthread_mutex_unlock(&run->lock);
		*broken = true;
		return NULL;
	}
	struct run_step *s = run_step_by_serial(run, b->serial);
	b->stats = s->stats;
	b->stats->refs++;
	b->id = ++run->next_plan;
	snprintf(b->label, sizeof(b->label), "%s/%s", s->name, role->name);
	pthread_mutex_unlock(&run->lock);

	ckfs_error_clear(&err);
	enum ckfs_code rc = plan_open(run, b, &p, &err);
	atomic_fetch_add(rc == CKFS_OK ? &b->stats->plans_built : &b->stats->plan_errors, 1);
	if (rc != CKFS_OK) {
		plan_failed(run, b, p, rc, &err);
		*broken = true;
		return NULL;
	}
	return plan_publish(run, b, p);
}

/*
 * The plan of role r of the step with this serial, with a reference the
 * caller drops (run_plan_put); NULL when the step is gone, the role does not
 * exist or its plan cannot be built (*broken then).
 */
struct run_plan *run_role_plan(struct ckfs_run *run, uint64_t serial, size_t r, bool *broken)
{
	struct build b = { .serial = serial, .r = r };
	struct run_plan *p;

	*broken = false;
	if ((p = plan_find(run, &b)) || !b.path[0])
		return p;
	pthread_mutex_lock(&run->build_lock);
	p = plan_build(run, &b, broken);
	pthread_mutex_unlock(&run->build_lock);
	return p;
}

/* Drop every plan and step; no request may be in flight, so every plan
 * left is the LRU's. */
void run_plans_free(struct ckfs_run *run)
{
	pthread_mutex_lock(&run->lock);
	for (size_t i = 0; i < run->n_steps; i++) {
		struct run_step *s = run->steps[i];
		for (size_t r = 0; r < s->n_roles; r++) {
			struct run_plan *p = s->roles[r].plan;
			if (!p)
				continue;
			lru_unlink_locked(run, p);
			s->roles[r].plan = NULL;
			pthread_mutex_unlock(&run->lock);
			run_plan_put(run, p);
			pthread_mutex_lock(&run->lock);
		}
		size_t n_drop = 0;
		run_step_free_locked(run, s, NULL, &n_drop);
	}
	free(run->steps);
	run->steps = NULL;
	run->n_steps = 0;
	pthread_mutex_unlock(&run->lock);
}
