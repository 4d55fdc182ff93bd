/* SPDX-License-Identifier: MIT */
/*
 * A whole training run as one mount (include/ckfs/run.h for the rules):
 *
 *     MNT/global_step_<N>/<role>/   what `ckfs export SRC/global_step_<N>/<role>` writes
 *     MNT/latest -> global_step_<N> the step the tracker file names
 *
 * or, for SRC a single global_step_<N> folder, its roles at the top.
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
 * Inodes. A step shown gets a serial number that is never reused; its
 * inodes are serial << 32 (the step folder), | (role + 1) << 20 (a role
 * folder), | (node + 1) (node of the role's folder). The top is 1 and
 * `latest` 2. A step whose roles change, or whose files differ from what
 * its first plan described when the plan is built again, gets a new
 * serial: the kernel's old inodes then answer ENOENT, never other bytes.
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
 *
 * Locks. run->lock guards the step table, plans' reference counts and the
 * LRU; it is never held while building a plan, reading a file or talking
 * to the kernel. run->build_lock makes builds one at a time.
 */
#define FUSE_USE_VERSION 312

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ckfs/perm.h"
#include "ckfs/run.h"
#include "ckfs/strbuf.h"
#include "fuse/fs.h"
#include "fuse/run.h"

#define RUN_TOP_TIMEOUT 1.0     /* the top folder: steps come and go */
#define RUN_STEP_TIMEOUT 86400.0 /* inside a step: fixed per serial */
#define RUN_BLKSIZE (1u << 20)
#define INO_LATEST 2
#define ROLE_SHIFT 20
#define SERIAL_SHIFT 32
#define MAX_ROLES 4094
#define MAX_NODES ((1u << ROLE_SHIFT) - 2)
/* Coalescing of inotify bursts (rmtree removes many files): wait this
 * long for the burst to end before listing the run again. */
#define SETTLE_MS 50

/* Counters of one step, kept while the step or a plan of it lives. */
struct run_stats {
	int refs;                           /* under run->lock */
	uint64_t step;
	atomic_uint_fast64_t plans_built, plan_errors, opens, reads, bytes_read, errors;
};

struct run_plan {
	int refs;                           /* LRU + open files + users; run->lock */
	uint64_t id;
	char label[96];                     /* global_step_N/role */
	struct ckfs_model *m;
	struct ckfs_folder *f;
	mode_t *modes;
	mode_t root_mode;
	_Atomic uint32_t **replied;         /* per node and slice (fuse/fs.h) */
	struct run_stats *stats;
	struct run_plan *prev, *next;       /* LRU, most recent first */
	struct run_plan *all_next;          /* every live plan, for the fill */
	bool in_lru;
	atomic_int_fast64_t err_logged_at;
};

struct run_role {
	char *name;
	struct run_plan *plan;              /* in the LRU, or NULL */
	bool has_fp;                        /* fp of the first plan built */
	uint64_t fp;
	char *error;                        /* why the last build failed */
	uint64_t error_fp;
};

struct run_step {
	uint64_t step;
	uint64_t serial;
	char name[40];
	uint64_t roles_hash;
	struct timespec mtime;
	size_t n_roles_seen;                /* by the listing, before roles_listed */
	bool roles_listed;
	size_t n_roles;
	struct run_role *roles;
	struct run_stats *stats;
};

struct ckfs_run {
	struct ckfs_fs fs;                  /* the cache, scratch, counters */
	const struct ckfs_mount_options *opt;
	struct fuse_session *se;
	bool single;                        /* SRC is one step */
	char *base;                         /* the folder steps are in */
	pthread_mutex_t lock, build_lock;
	struct run_step **steps;            /* shown, by step number */
	size_t n_steps;
	uint64_t next_serial, next_plan;
	struct ckfs_run_scan scan;          /* the latest listing */
	char latest[40];                    /* "" when none */
	struct run_plan *lru_head, *lru_tail, *all;
	size_t n_lru;
	mode_t dir_mode;
	/* the watcher */
	int ino_fd, wake[2];
	pthread_t watcher;
	bool watching;
	long pending_s;                     /* no tracker: re-check in this long */
	char scan_error[1100];
};

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
static void plan_put(struct ckfs_run *run, struct run_plan *p)
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
 * appended to drop[] (at most *n_drop of room) for plan_put after unlock. */
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

static struct run_step *step_by_serial(struct ckfs_run *run, uint64_t serial)
{
	for (size_t i = 0; i < run->n_steps; i++)
		if (run->steps[i]->serial == serial)
			return run->steps[i];
	return NULL;
}

static struct run_step *step_by_name(struct ckfs_run *run, const char *name)
{
	for (size_t i = 0; i < run->n_steps; i++)
		if (strcmp(run->steps[i]->name, name) == 0)
			return run->steps[i];
	return NULL;
}

/* Free a step taken out of the table; its plans' LRU references go to
 * drop[] (room: its role count). */
static void step_free_locked(struct ckfs_run *run, struct run_step *s, struct run_plan **drop,
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

static struct run_step *step_new(struct ckfs_run *run, const struct ckfs_run_step *rs)
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
static int step_roles(struct ckfs_run *run, struct run_step *s)
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
	if (step_by_serial(run, serial) == s && !s->roles_listed) {
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
	p->modes = calloc(p->f->n_nodes ? p->f->n_nodes : 1, sizeof(*p->modes));
	if (!p->modes)
		return ckfs_nomem(err);
	if (opt->has_umask) {
		for (size_t i = 0; i < p->f->n_nodes; i++)
			p->modes[i] = 0444 & ~opt->umask;
		p->root_mode = 0555 & ~opt->umask;
		return CKFS_OK;
	}
	struct ckfs_owner owner;
	CKFS_TRY(ckfs_owner_init(&owner, run->fs.uid, run->fs.gid, err));
	enum ckfs_code rc = ckfs_folder_modes(p->f, &owner, p->modes, &p->root_mode, err);
	ckfs_owner_release(&owner);
	return rc;
}

/*
 * The plan of role r of the step with this serial, with a reference the
 * caller drops (plan_put); NULL when the step is gone, the role does not
 * exist or its plan cannot be built (*broken then).
 */
static struct run_plan *role_plan(struct ckfs_run *run, uint64_t serial, size_t r, bool *broken)
{
	char path[PATH_MAX];
	struct run_plan *p, *drop[8];
	size_t n_drop = 0;
	struct ckfs_error err;
	uint64_t fp = 0;
	bool fp_ok;

	*broken = false;
	pthread_mutex_lock(&run->lock);
	struct run_step *s = step_by_serial(run, serial);
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
	s = step_by_serial(run, serial);
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
	s = step_by_serial(run, serial);
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
		plan_put(run, drop[i]);
	if (retired) {
		/* Not invalidated from here (a handler must not wait on the
		 * kernel): the top's entries time out within a second. */
		plan_put(run, p);
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
	plan_put(run, p);
	return rc;
}

/* ---- inodes ---- */

enum ino_kind { INO_NONE, INO_TOP, INO_LINK, INO_STEP, INO_ROLE, INO_NODE };

struct ino_ref {
	enum ino_kind kind;
	uint64_t serial;
	size_t role;    /* INO_ROLE, INO_NODE */
	size_t node;    /* INO_NODE */
};

static struct ino_ref ino_decode(struct ckfs_run *run, fuse_ino_t ino)
{
	struct ino_ref r = { INO_NONE, 0, 0, 0 };
	uint64_t role = (ino >> ROLE_SHIFT) & ((1u << (SERIAL_SHIFT - ROLE_SHIFT)) - 1);
	uint64_t node = ino & ((1u << ROLE_SHIFT) - 1);

	if (ino == FUSE_ROOT_ID) {
		/* One step mounted alone: the top is that step (under its
		 * current serial: a change of its files renews it). */
		if (run->single) {
			r.kind = INO_STEP;
			pthread_mutex_lock(&run->lock);
			r.serial = run->n_steps ? run->steps[0]->serial : 0;
			pthread_mutex_unlock(&run->lock);
		} else {
			r.kind = INO_TOP;
		}
		return r;
	}
	if (ino == INO_LATEST && !run->single) {
		r.kind = INO_LINK;
		return r;
	}
	r.serial = ino >> SERIAL_SHIFT;
	if (r.serial == 0)
		return r;
	if (role == 0)
		r.kind = node == 0 ? INO_STEP : INO_NONE;
	else
		r.kind = node == 0 ? INO_ROLE : INO_NODE;
	r.role = role ? role - 1 : 0;
	r.node = node ? node - 1 : 0;
	return r;
}

static fuse_ino_t step_ino(const struct ckfs_run *run, uint64_t serial)
{
	return run->single ? FUSE_ROOT_ID : (fuse_ino_t)(serial << SERIAL_SHIFT);
}

static fuse_ino_t role_ino(uint64_t serial, size_t r)
{
	return (fuse_ino_t)(serial << SERIAL_SHIFT | (uint64_t)(r + 1) << ROLE_SHIFT);
}

static fuse_ino_t node_ino(uint64_t serial, size_t r, size_t i)
{
	return role_ino(serial, r) | (fuse_ino_t)(i + 1);
}

static void stat_base(const struct ckfs_run *run, struct stat *st, fuse_ino_t ino)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = run->fs.uid;
	st->st_gid = run->fs.gid;
	st->st_blksize = RUN_BLKSIZE;
}

static void stat_dir(const struct ckfs_run *run, struct stat *st, fuse_ino_t ino, mode_t mode,
		     nlink_t subdirs)
{
	stat_base(run, st, ino);
	st->st_mode = S_IFDIR | mode;
	st->st_nlink = 2 + subdirs;
	st->st_size = 4096;
	st->st_blocks = 8;
}

/* Attributes of a node of plan p (a file or a folder inside the role). */
static void stat_node(const struct ckfs_run *run, const struct run_plan *p, size_t i,
		      fuse_ino_t ino, struct stat *st)
{
	const struct ckfs_node *n = &p->f->nodes[i];

	stat_base(run, st, ino);
	st->st_mtim = st->st_atim = st->st_ctim = p->f->mtime;
	if (n->kind == CKFS_NODE_DIR) {
		nlink_t k = 0;
		for (size_t c = 0; c < n->n_children; c++)
			k += p->f->nodes[n->children[c]].kind == CKFS_NODE_DIR;
		stat_dir(run, st, ino, p->modes[i], k);
		st->st_mtim = st->st_atim = st->st_ctim = p->f->mtime;
		return;
	}
	st->st_mode = S_IFREG | p->modes[i];
	st->st_nlink = 1;
	st->st_size = (off_t)n->size;
	st->st_blocks = (blkcnt_t)((n->size + 511) / 512);
}

/*
 * Attributes of ino: 0, or an errno. For roles and nodes the plan is
 * built when needed; *plan_out (when not NULL) receives it with a
 * reference, for INO_ROLE and INO_NODE.
 */
static int ino_stat(struct ckfs_run *run, fuse_ino_t ino, struct stat *st,
		    struct run_plan **plan_out)
{
	struct ino_ref r = ino_decode(run, ino);
	bool broken;

	if (plan_out)
		*plan_out = NULL;
	switch (r.kind) {
	case INO_NONE:
		return ENOENT;
	case INO_TOP:
		pthread_mutex_lock(&run->lock);
		stat_dir(run, st, ino, run->dir_mode, (nlink_t)run->n_steps);
		st->st_mtim = st->st_atim = st->st_ctim = run->scan.mtime;
		pthread_mutex_unlock(&run->lock);
		return 0;
	case INO_LINK:
		pthread_mutex_lock(&run->lock);
		bool has = run->latest[0] != '\0';
		size_t len = strlen(run->latest);
		pthread_mutex_unlock(&run->lock);
		if (!has)
			return ENOENT;
		stat_base(run, st, ino);
		pthread_mutex_lock(&run->lock);
		st->st_mtim = st->st_atim = st->st_ctim = run->scan.mtime;
		pthread_mutex_unlock(&run->lock);
		st->st_mode = S_IFLNK | 0777;
		st->st_nlink = 1;
		st->st_size = (off_t)len;
		return 0;
	case INO_STEP: {
		/* The role count of the listing: a step's attributes cost no
		 * readdir of it (ls -l of a run of many steps). */
		pthread_mutex_lock(&run->lock);
		struct run_step *s = step_by_serial(run, r.serial);
		nlink_t k = s ? (nlink_t)(s->roles_listed ? s->n_roles : s->n_roles_seen) : 0;
		struct timespec mt = s ? s->mtime : (struct timespec){ 0, 0 };
		pthread_mutex_unlock(&run->lock);
		if (!s)
			return ENOENT;
		stat_dir(run, st, ino, run->dir_mode, k);
		st->st_mtim = st->st_atim = st->st_ctim = mt;
		return 0;
	}
	case INO_ROLE:
	case INO_NODE: {
		struct run_plan *p = role_plan(run, r.serial, r.role, &broken);
		if (!p) {
			if (!broken || r.kind != INO_ROLE)
				return ENOENT;
			/* A role that cannot be served: an empty folder. */
			stat_dir(run, st, ino, run->dir_mode, 0);
			return 0;
		}
		if (r.kind == INO_ROLE) {
			nlink_t k = 0;
			for (size_t c = 0; c < p->f->n_top; c++)
				k += p->f->nodes[p->f->top[c]].kind == CKFS_NODE_DIR;
			stat_dir(run, st, ino, p->root_mode, k);
			st->st_mtim = st->st_atim = st->st_ctim = p->f->mtime;
		} else if (r.node >= p->f->n_nodes) {
			plan_put(run, p);
			return ENOENT;
		} else {
			stat_node(run, p, r.node, ino, st);
		}
		if (plan_out)
			*plan_out = p;
		else
			plan_put(run, p);
		return 0;
	}
	}
	return ENOENT;
}

/* ---- handlers ---- */

static struct ckfs_run *req_run(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static void reply_entry(fuse_req_t req, struct ckfs_run *run, fuse_ino_t ino, double timeout)
{
	struct fuse_entry_param e;
	int rc;

	memset(&e, 0, sizeof(e));
	e.entry_timeout = timeout;
	if (ino) {
		rc = ino_stat(run, ino, &e.attr, NULL);
		if (rc == ENOENT) {
			/* Gone between the name and its attributes: a negative
			 * entry that times out like the top's. */
			e.entry_timeout = RUN_TOP_TIMEOUT;
			fuse_reply_entry(req, &e);
			return;
		}
		if (rc) {
			fuse_reply_err(req, rc);
			return;
		}
		e.ino = ino;
		e.generation = 1;
		e.attr_timeout = timeout;
	}
	fuse_reply_entry(req, &e);
}

static void run_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct ckfs_run *run = req_run(req);
	struct ino_ref r = ino_decode(run, parent);
	fuse_ino_t ino = 0;

	switch (r.kind) {
	case INO_TOP:
		pthread_mutex_lock(&run->lock);
		if (strcmp(name, "latest") == 0) {
			ino = run->latest[0] ? INO_LATEST : 0;
		} else {
			struct run_step *s = step_by_name(run, name);
			ino = s ? step_ino(run, s->serial) : 0;
		}
		pthread_mutex_unlock(&run->lock);
		reply_entry(req, run, ino, RUN_TOP_TIMEOUT);
		return;
	case INO_STEP: {
		pthread_mutex_lock(&run->lock);
		struct run_step *s = step_by_serial(run, r.serial);
		pthread_mutex_unlock(&run->lock);
		if (!s) {
			fuse_reply_err(req, ENOENT);
			return;
		}
		if (step_roles(run, s) != 0) {
			fuse_reply_err(req, ENOMEM);
			return;
		}
		pthread_mutex_lock(&run->lock);
		s = step_by_serial(run, r.serial);
		for (size_t i = 0; s && i < s->n_roles; i++)
			if (strcmp(s->roles[i].name, name) == 0)
				ino = role_ino(r.serial, i);
		pthread_mutex_unlock(&run->lock);
		reply_entry(req, run, ino, run->single ? RUN_TOP_TIMEOUT : RUN_STEP_TIMEOUT);
		return;
	}
	case INO_ROLE:
	case INO_NODE: {
		bool broken;
		struct run_plan *p = role_plan(run, r.serial, r.role, &broken);
		if (!p) {
			if (broken && r.kind == INO_ROLE)
				reply_entry(req, run, 0, RUN_TOP_TIMEOUT);
			else
				fuse_reply_err(req, ENOENT);
			return;
		}
		const struct ckfs_node *dir = NULL;
		if (r.kind == INO_NODE) {
			dir = r.node < p->f->n_nodes ? &p->f->nodes[r.node] : NULL;
			if (!dir || dir->kind != CKFS_NODE_DIR) {
				plan_put(run, p);
				fuse_reply_err(req, dir ? ENOTDIR : ENOENT);
				return;
			}
		}
		const struct ckfs_node *n = ckfs_folder_lookup(p->f, dir, name);
		ino = n ? node_ino(r.serial, r.role, (size_t)(n - p->f->nodes)) : 0;
		plan_put(run, p);
		reply_entry(req, run, ino, RUN_STEP_TIMEOUT);
		return;
	}
	case INO_LINK:
		fuse_reply_err(req, ENOTDIR);
		return;
	case INO_NONE:
		break;
	}
	fuse_reply_err(req, ENOENT);
}

static void run_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_run *run = req_run(req);
	struct stat st;
	struct ino_ref r = ino_decode(run, ino);
	int rc;

	(void)fi;
	rc = ino_stat(run, ino, &st, NULL);
	if (rc)
		fuse_reply_err(req, rc);
	else
		fuse_reply_attr(req, &st, r.kind == INO_TOP || r.kind == INO_LINK ||
					  (run->single && r.kind == INO_STEP)
					  ? RUN_TOP_TIMEOUT : RUN_STEP_TIMEOUT);
}

static void run_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct ckfs_run *run = req_run(req);
	char target[40];

	pthread_mutex_lock(&run->lock);
	snprintf(target, sizeof(target), "%s", run->latest);
	pthread_mutex_unlock(&run->lock);
	if (ino != INO_LATEST || run->single || !target[0])
		fuse_reply_err(req, ino == INO_LATEST ? ENOENT : EINVAL);
	else
		fuse_reply_readlink(req, target);
}

/* Per open file: the read-ahead state and the plan it reads. */
struct run_handle {
	struct ckfs_handle ra;
	struct run_plan *plan;
	uint64_t file_id;
};

static void run_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_run *run = req_run(req);
	struct ino_ref r = ino_decode(run, ino);
	struct run_plan *p = NULL;
	struct stat st;
	int rc;

	if (r.kind != INO_NODE) {
		fuse_reply_err(req, r.kind == INO_NONE ? ENOENT
				    : r.kind == INO_LINK ? ELOOP : EISDIR);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & (O_TRUNC | O_APPEND))) {
		fuse_reply_err(req, EROFS);
		return;
	}
	rc = ino_stat(run, ino, &st, &p);
	if (rc || !p) {
		plan_put(run, p);
		fuse_reply_err(req, rc ? rc : ENOENT);
		return;
	}
	if (S_ISDIR(st.st_mode)) {
		plan_put(run, p);
		fuse_reply_err(req, EISDIR);
		return;
	}
	struct run_handle *h = calloc(1, sizeof(*h));
	if (!h) {
		plan_put(run, p);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	h->plan = p; /* the reference travels with the handle */
	h->ra.node = r.node;
	h->file_id = p->id << ROLE_SHIFT | r.node;
	pthread_mutex_init(&h->ra.lock, NULL);
	fi->fh = (uint64_t)(uintptr_t)h;
	fi->keep_cache = 1; /* a serial's files never change */
	fi->noflush = 1;
	atomic_fetch_add(&run->fs.stats.opens, 1);
	atomic_fetch_add(&p->stats->opens, 1);
	if (fuse_reply_open(req, fi) != 0) {
		pthread_mutex_destroy(&h->ra.lock);
		plan_put(run, h->plan);
		free(h);
	}
}

static void run_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_run *run = req_run(req);
	struct run_handle *h = (struct run_handle *)(uintptr_t)fi->fh;

	(void)ino;
	if (h) {
		pthread_mutex_destroy(&h->ra.lock);
		plan_put(run, h->plan);
		free(h);
	}
	fuse_reply_err(req, 0);
}

static void log_read_error(struct run_plan *p, const struct ckfs_node *n, uint64_t off,
			   size_t len, const struct ckfs_error *err)
{
	struct timespec now;
	int_fast64_t last, sec;

	clock_gettime(CLOCK_MONOTONIC, &now);
	sec = (int_fast64_t)now.tv_sec + 1;
	last = atomic_load(&p->err_logged_at);
	if ((last && sec - last < 10) ||
	    !atomic_compare_exchange_strong(&p->err_logged_at, &last, sec))
		return;
	ckfs_log(CKFS_LOG_ERR, "'%s/%s': read of %zu bytes at %" PRIu64 " failed (%s): %s",
		 p->label, n->name, len, off, strerror(ckfs_err_to_errno(err)),
		 err->msg[0] ? err->msg : ckfs_strerror(err->code));
}

static void run_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct ckfs_run *run = req_run(req);
	struct run_handle *h = (struct run_handle *)(uintptr_t)fi->fh;
	struct run_plan *p = h->plan;
	const struct ckfs_node *n = &p->f->nodes[h->ra.node];
	struct ckfs_error err;
	size_t got = 0;

	(void)ino;
	atomic_fetch_add(&run->fs.stats.reads, 1);
	atomic_fetch_add(&p->stats->reads, 1);
	if (off < 0) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	if ((uint64_t)off >= n->size || size == 0) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	size_t len = n->size - (uint64_t)off < size ? (size_t)(n->size - (uint64_t)off) : size;
	ckfs_error_clear(&err);
	if (n->kind == CKFS_NODE_WEIGHTS) {
		if (ckfs_fs_read_cached(req, &run->fs, &h->ra, h->file_id,
					p->replied[h->ra.node], n->size,
					(uint64_t)off, len, &err) == CKFS_OK) {
			atomic_fetch_add(&p->stats->bytes_read, len);
			return;
		}
	} else if (n->kind == CKFS_NODE_RENDERED) {
		atomic_fetch_add(&run->fs.stats.bytes_read, len);
		atomic_fetch_add(&p->stats->bytes_read, len);
		fuse_reply_buf(req, n->data + off, len);
		return;
	} else {
		struct ckfs_read_scratch *scratch = ckfs_fs_scratch(&run->fs);
		char *buf = malloc(len);
		if (!buf || !scratch)
			ckfs_nomem(&err);
		else if (ckfs_folder_read(p->f, n, (uint64_t)off, len, buf, &got, scratch,
					  &err) == CKFS_OK) {
			atomic_fetch_add(&run->fs.stats.bytes_read, got);
			atomic_fetch_add(&p->stats->bytes_read, got);
			fuse_reply_buf(req, buf, got);
			free(buf);
			return;
		}
		free(buf);
	}
	atomic_fetch_add(&run->fs.stats.errors, 1);
	atomic_fetch_add(&p->stats->errors, 1);
	log_read_error(p, n, (uint64_t)off, len, &err);
	fuse_reply_err(req, ckfs_err_to_errno(&err));
}

static void run_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_run *run = req_run(req);
	struct ino_ref r = ino_decode(run, ino);

	if (r.kind == INO_NONE || r.kind == INO_LINK) {
		fuse_reply_err(req, r.kind == INO_NONE ? ENOENT : ENOTDIR);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY) {
		fuse_reply_err(req, EROFS);
		return;
	}
	/* Inside a step the listing is fixed for its serial. */
	fi->cache_readdir = r.kind != INO_TOP && !(run->single && r.kind == INO_STEP);
	fi->keep_cache = fi->cache_readdir;
	fuse_reply_open(req, fi);
}

/* One listing: names and inodes, made under the lock, replied after. */
struct listing {
	size_t n;
	char **names;
	fuse_ino_t *inos;
};

static void listing_free(struct listing *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->names[i]);
	free(l->names);
	free(l->inos);
}

static int listing_add(struct listing *l, size_t cap, const char *name, fuse_ino_t ino)
{
	if (l->n >= cap)
		return 0;
	if (!(l->names[l->n] = strdup(name)))
		return -1;
	l->inos[l->n++] = ino;
	return 0;
}

/* The entries of folder ino ("." and ".." first); an errno on failure. */
static int make_listing(struct ckfs_run *run, fuse_ino_t ino, struct listing *l)
{
	struct ino_ref r = ino_decode(run, ino);
	struct run_plan *p = NULL;
	size_t cap = 0;
	int rc = 0;
	bool broken;

	memset(l, 0, sizeof(*l));
	if (r.kind == INO_STEP) {
		pthread_mutex_lock(&run->lock);
		struct run_step *s = step_by_serial(run, r.serial);
		pthread_mutex_unlock(&run->lock);
		if (!s)
			return ENOENT;
		if (step_roles(run, s) != 0)
			return ENOMEM;
	} else if (r.kind == INO_ROLE || r.kind == INO_NODE) {
		p = role_plan(run, r.serial, r.role, &broken);
		if (!p && !(broken && r.kind == INO_ROLE))
			return ENOENT;
		if (p && r.kind == INO_NODE &&
		    (r.node >= p->f->n_nodes || p->f->nodes[r.node].kind != CKFS_NODE_DIR)) {
			plan_put(run, p);
			return ENOTDIR;
		}
	} else if (r.kind != INO_TOP) {
		return ENOENT;
	}
	pthread_mutex_lock(&run->lock);
	struct run_step *s = r.kind == INO_STEP ? step_by_serial(run, r.serial) : NULL;
	if (r.kind == INO_TOP)
		cap = run->n_steps + 3;
	else if (r.kind == INO_STEP)
		cap = (s ? s->n_roles : 0) + 2;
	else if (!p)
		cap = 2;
	else if (r.kind == INO_ROLE)
		cap = p->f->n_top + 2;
	else
		cap = p->f->nodes[r.node].n_children + 2;
	l->names = calloc(cap, sizeof(*l->names));
	l->inos = calloc(cap, sizeof(*l->inos));
	if (!l->names || !l->inos) {
		rc = ENOMEM;
		goto out;
	}
	fuse_ino_t parent = r.kind == INO_TOP ? FUSE_ROOT_ID
			    : r.kind == INO_STEP ? FUSE_ROOT_ID
			    : r.kind == INO_ROLE ? step_ino(run, r.serial)
			    : p->f->nodes[r.node].parent
				  ? node_ino(r.serial, r.role, p->f->nodes[r.node].parent - 1)
				  : role_ino(r.serial, r.role);
	if (listing_add(l, cap, ".", ino) || listing_add(l, cap, "..", parent)) {
		rc = ENOMEM;
		goto out;
	}
	if (r.kind == INO_TOP) {
		for (size_t i = 0; i < run->n_steps && !rc; i++)
			rc = listing_add(l, cap, run->steps[i]->name,
					 step_ino(run, run->steps[i]->serial)) ? ENOMEM : 0;
		if (!rc && run->latest[0])
			rc = listing_add(l, cap, "latest", INO_LATEST) ? ENOMEM : 0;
	} else if (r.kind == INO_STEP) {
		for (size_t i = 0; s && i < s->n_roles && !rc; i++)
			rc = listing_add(l, cap, s->roles[i].name, role_ino(r.serial, i))
				     ? ENOMEM : 0;
	} else if (p) {
		const size_t *list = r.kind == INO_ROLE ? p->f->top : p->f->nodes[r.node].children;
		size_t n = r.kind == INO_ROLE ? p->f->n_top : p->f->nodes[r.node].n_children;
		for (size_t i = 0; i < n && !rc; i++)
			rc = listing_add(l, cap, p->f->nodes[list[i]].base,
					 node_ino(r.serial, r.role, list[i])) ? ENOMEM : 0;
	}
out:
	pthread_mutex_unlock(&run->lock);
	plan_put(run, p);
	if (rc)
		listing_free(l);
	return rc;
}

static void run_reply_dir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, int plus)
{
	struct ckfs_run *run = req_run(req);
	struct listing l;
	size_t pos = 0;
	char *buf;
	int rc = make_listing(run, ino, &l);

	if (rc) {
		fuse_reply_err(req, rc);
		return;
	}
	if (off < 0 || (uint64_t)off >= l.n) {
		listing_free(&l);
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	buf = malloc(size ? size : 1);
	if (!buf) {
		listing_free(&l);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	for (size_t k = (size_t)off; k < l.n; k++) {
		size_t want;
		struct stat st;
		memset(&st, 0, sizeof(st));
		if (plus && k >= 2) {
			struct fuse_entry_param e;
			struct ino_ref r = ino_decode(run, l.inos[k]);
			memset(&e, 0, sizeof(e));
			/* Entries carry attributes only where no plan must be
			 * built for them (a role's needs its plan): listing the
			 * top or a step stays cheap; the kernel looks the rest
			 * up when used. */
			if (r.kind == INO_ROLE) {
				e.attr.st_ino = l.inos[k];
				e.attr.st_mode = S_IFDIR;
			} else if (ino_stat(run, l.inos[k], &e.attr, NULL) == 0) {
				double t = r.kind == INO_STEP || r.kind == INO_LINK
						   ? RUN_TOP_TIMEOUT : RUN_STEP_TIMEOUT;
				e.ino = l.inos[k];
				e.generation = 1;
				e.attr_timeout = t;
				e.entry_timeout = t;
			}
			want = fuse_add_direntry_plus(req, buf + pos, size - pos, l.names[k], &e,
						      (off_t)k + 1);
		} else {
			st.st_ino = l.inos[k];
			struct ino_ref r = ino_decode(run, l.inos[k]);
			st.st_mode = r.kind == INO_LINK ? S_IFLNK
				     : r.kind == INO_NODE ? 0 : S_IFDIR;
			if (plus) {
				/* "." and "..": no entry, only their numbers. */
				struct fuse_entry_param e;
				memset(&e, 0, sizeof(e));
				e.attr = st;
				want = fuse_add_direntry_plus(req, buf + pos, size - pos, l.names[k],
							      &e, (off_t)k + 1);
			} else {
				want = fuse_add_direntry(req, buf + pos, size - pos, l.names[k], &st,
							 (off_t)k + 1);
			}
		}
		if (want > size - pos)
			break;
		pos += want;
	}
	fuse_reply_buf(req, buf, pos);
	free(buf);
	listing_free(&l);
}

static void run_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			struct fuse_file_info *fi)
{
	(void)fi;
	run_reply_dir(req, ino, size, off, 0);
}

static void run_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			    struct fuse_file_info *fi)
{
	(void)fi;
	run_reply_dir(req, ino, size, off, 1);
}

static void run_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs st;

	(void)ino;
	memset(&st, 0, sizeof(st));
	st.f_bsize = RUN_BLKSIZE;
	st.f_frsize = 4096;
	st.f_namemax = NAME_MAX;
	st.f_flag = ST_RDONLY;
	fuse_reply_statfs(req, &st);
}

static void run_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
	struct ckfs_run *run = req_run(req);

	if (ino_decode(run, ino).kind == INO_NONE)
		fuse_reply_err(req, ENOENT);
	else
		fuse_reply_err(req, (mask & W_OK) ? EROFS : 0);
}

/* ---- stats: the front end's and the cache's counters, and per step ---- */

static void json_str(struct ckfs_strbuf *b, const char *s)
{
	ckfs_strbuf_json(b, s);
}

/* ,"key":value (ckfs_strbuf_fmt formats 128 bytes at most: one pair per call). */
static void kv(struct ckfs_strbuf *b, const char *key, uint64_t v)
{
	ckfs_strbuf_fmt(b, ",\"%s\":%" PRIu64, key, v);
}

static uint64_t ld(atomic_uint_fast64_t *a)
{
	return (uint64_t)atomic_load(a);
}

static void stats_json(struct ckfs_run *run, struct ckfs_strbuf *b)
{
	struct ckfs_cache_stats cs;
	struct timespec now;

	ckfs_cache_get_stats(run->fs.cache, &cs);
	clock_gettime(CLOCK_MONOTONIC, &now);
	ckfs_strbuf_str(b, "{\"source\":");
	json_str(b, run->opt->src);
	ckfs_strbuf_fmt(b, ",\"run\":true,\"pid\":%ld,\"uptime_s\":%.3f", (long)getpid(),
			(double)(now.tv_sec - run->fs.ready_at.tv_sec) +
				(double)(now.tv_nsec - run->fs.ready_at.tv_nsec) / 1e9);
	pthread_mutex_lock(&run->lock);
	size_t live = 0, files = 0;
	for (struct run_plan *p = run->all; p; p = p->all_next) {
		live++;
		files += p->f->n_nodes;
	}
	ckfs_strbuf_str(b, ",\"latest\":");
	if (run->latest[0])
		json_str(b, run->latest);
	else
		ckfs_strbuf_str(b, "null");
	kv(b, "steps_shown", run->n_steps);
	kv(b, "plans_cached", run->n_lru);
	kv(b, "plans_open", live);
	kv(b, "max_plans", (uint64_t)run->opt->max_plans);
	kv(b, "files", files);
	const struct { const char *k; uint64_t v; } c[] = {
		{ "hits", cs.hits }, { "misses", cs.misses }, { "waits", cs.waits },
		{ "evictions", cs.evictions }, { "fills", cs.fills }, { "fill_errors", cs.fill_errors },
		{ "bytes_filled", cs.bytes_filled }, { "bytes_cached", cs.bytes_cached },
		{ "slices_cached", cs.slices_cached }, { "budget", cs.budget_bytes },
		{ "slice_size", run->fs.slice_size }, { "prefetch_queued", cs.prefetch_queued },
		{ "prefetch_dropped", cs.prefetch_dropped }, { "prefetch_hits", cs.prefetch_hits },
		{ "recycled", cs.recycled },
		{ "readahead_sequential", ld(&run->fs.stats.ra_sequential) },
		{ "readahead_slices", ld(&run->fs.stats.ra_slices) },
		{ "source_bytes_read", ckfs_source_bytes_read() - run->fs.source_bytes_at_ready },
		{ "reads", ld(&run->fs.stats.reads) }, { "bytes_read", ld(&run->fs.stats.bytes_read) },
		{ "opens", ld(&run->fs.stats.opens) }, { "errors", ld(&run->fs.stats.errors) },
	};
	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++)
		kv(b, c[i].k, c[i].v);
	ckfs_strbuf_str(b, ",\"steps\":[");
	for (size_t i = 0; i < run->n_steps; i++) {
		struct run_step *s = run->steps[i];
		struct run_stats *st = s->stats;
		size_t cached = 0;
		for (size_t r = 0; r < s->n_roles; r++)
			cached += s->roles[r].plan != NULL;
		ckfs_strbuf_fmt(b, "%s{\"step\":%" PRIu64 ",\"name\":", i ? "," : "", s->step);
		json_str(b, s->name);
		kv(b, "plans_cached", cached);
		kv(b, "plans_built", ld(&st->plans_built));
		kv(b, "plan_errors", ld(&st->plan_errors));
		kv(b, "opens", ld(&st->opens));
		kv(b, "reads", ld(&st->reads));
		kv(b, "bytes_read", ld(&st->bytes_read));
		kv(b, "errors", ld(&st->errors));
		ckfs_strbuf_str(b, ",\"broken\":[");
		bool first = true;
		for (size_t r = 0; r < s->n_roles; r++) {
			if (!s->roles[r].error)
				continue;
			ckfs_strbuf_str(b, first ? "{\"role\":" : ",{\"role\":");
			json_str(b, s->roles[r].name);
			ckfs_strbuf_str(b, ",\"error\":");
			json_str(b, s->roles[r].error);
			ckfs_strbuf_str(b, "}");
			first = false;
		}
		ckfs_strbuf_str(b, "]}");
	}
	pthread_mutex_unlock(&run->lock);
	ckfs_strbuf_str(b, "]}\n");
}

static void run_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct ckfs_run *run = req_run(req);
	struct ckfs_strbuf b;
	const char *value;
	size_t len;

	if (ino != FUSE_ROOT_ID) {
		fuse_reply_err(req, ino_decode(run, ino).kind == INO_NONE ? ENOENT : ENODATA);
		return;
	}
	memset(&b, 0, sizeof(b));
	if (strcmp(name, CKFS_STATS_XATTR) == 0) {
		stats_json(run, &b);
		if (b.failed || !b.p) {
			free(b.p);
			fuse_reply_err(req, ENOMEM);
			return;
		}
		value = b.p;
		len = b.len;
	} else if (strcmp(name, CKFS_SOURCE_XATTR) == 0) {
		value = run->opt->src;
		len = strlen(value);
	} else {
		fuse_reply_err(req, ENODATA);
		return;
	}
	if (size == 0)
		/* An upper bound: counters move between the query and the read. */
		fuse_reply_xattr(req, len + 4096);
	else if (size < len)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, value, len);
	free(b.p);
}

static void run_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	(void)ino;
	if (size == 0)
		fuse_reply_xattr(req, 0);
	else
		fuse_reply_buf(req, NULL, 0);
}

/* ---- listing the run again ---- */

/* The kernel forgets an entry of the top folder. */
static void inval_top(struct ckfs_run *run, const char *name)
{
	if (run->se && !run->single)
		fuse_lowlevel_notify_inval_entry(run->se, FUSE_ROOT_ID, name, strlen(name));
}

/* List the run folder and make the step table match it. Returns the
 * seconds until it must be listed again without an event (0: never); or,
 * when the folder cannot be listed, -1 with *fail set (fail given: the
 * first listing) or 0 after logging it (the steps shown stay). */
static long rescan(struct ckfs_run *run, struct ckfs_error *fail)
{
	struct ckfs_run_scan scan;
	struct ckfs_error err;
	struct timespec now;
	char **gone = NULL, **came = NULL, old_latest[40];
	size_t n_gone = 0, n_came = 0, n_drop = 0;
	struct run_plan **drop = NULL;
	long pending;

	/* Listed without the lock (I/O); only the tracker's last good value
	 * is taken from the previous listing. */
	struct ckfs_run_scan prev;
	memset(&prev, 0, sizeof(prev));
	ckfs_error_clear(&err);
	pthread_mutex_lock(&run->lock);
	prev.tracker_ok = run->scan.tracker_ok;
	prev.tracker = run->scan.tracker;
	pthread_mutex_unlock(&run->lock);
	enum ckfs_code rc = ckfs_run_scan(run->base, &prev, &scan, &err);
	if (rc != CKFS_OK && fail) {
		*fail = err;
		return -1;
	}
	if (rc != CKFS_OK) {
		ckfs_log(CKFS_LOG_ERR, "%s; the steps shown stay as they were", err.msg);
		return 0;
	}
	clock_gettime(CLOCK_REALTIME, &now);
	pending = ckfs_run_classify(&scan, &now);
	if (scan.tracker_error[0])
		ckfs_log(CKFS_LOG_WARNING, "%s%s", scan.tracker_error,
			 scan.tracker_ok ? "; the step it named before is kept" : "");

	pthread_mutex_lock(&run->lock);
	size_t room = run->n_steps + scan.n_steps;
	gone = calloc(room + 1, sizeof(*gone));
	came = calloc(room + 1, sizeof(*came));
	size_t roles = 0;
	for (size_t i = 0; i < run->n_steps; i++)
		roles += run->steps[i]->n_roles;
	drop = calloc(roles + 1, sizeof(*drop));
	struct run_step **next = calloc(scan.n_steps + 1, sizeof(*next));
	if (!gone || !came || !drop || !next) {
		pthread_mutex_unlock(&run->lock);
		ckfs_log(CKFS_LOG_ERR, "out of memory listing '%s'", run->base);
		free(gone);
		free(came);
		free(drop);
		free(next);
		ckfs_run_scan_release(&scan);
		return 0;
	}
	size_t n_next = 0;
	/* Keep a shown step as it is when it is still shown with the same
	 * roles; anything else leaves (its inodes die with its serial). */
	for (size_t i = 0; i < scan.n_steps; i++) {
		const struct ckfs_run_step *rs = &scan.steps[i];
		bool shown = rs->state == CKFS_STEP_SHOWN || (run->single && i == 0);
		if (!shown)
			continue;
		struct run_step *s = step_by_name(run, rs->name);
		if (s && s->roles_hash == rs->roles_hash) {
			next[n_next++] = s;
			continue;
		}
		struct run_step *ns = step_new(run, rs);
		if (!ns)
			continue; /* left out; the next event tries again */
		next[n_next++] = ns;
		came[n_came++] = strdup(rs->name);
	}
	for (size_t i = 0; i < run->n_steps; i++) {
		struct run_step *s = run->steps[i];
		bool kept = false;
		for (size_t k = 0; k < n_next && !kept; k++)
			kept = next[k] == s;
		if (kept)
			continue;
		gone[n_gone++] = strdup(s->name);
		step_free_locked(run, s, drop, &n_drop);
	}
	free(run->steps);
	run->steps = next;
	run->n_steps = n_next;
	snprintf(old_latest, sizeof(old_latest), "%s", run->latest);
	const struct ckfs_run_step *lt = ckfs_run_latest(&scan);
	snprintf(run->latest, sizeof(run->latest), "%s",
		 lt && step_by_name(run, lt->name) ? lt->name : "");
	bool latest_moved = strcmp(old_latest, run->latest) != 0;
	ckfs_run_scan_release(&run->scan);
	run->scan = scan;
	pthread_mutex_unlock(&run->lock);

	for (size_t i = 0; i < n_drop; i++)
		plan_put(run, drop[i]);
	for (size_t i = 0; i < n_gone; i++) {
		if (gone[i]) {
			ckfs_log(CKFS_LOG_NOTICE, "%s: no longer shown", gone[i]);
			inval_top(run, gone[i]);
		}
		free(gone[i]);
	}
	for (size_t i = 0; i < n_came; i++) {
		if (came[i]) {
			ckfs_log(CKFS_LOG_INFO, "%s: shown", came[i]);
			inval_top(run, came[i]);
		}
		free(came[i]);
	}
	if (latest_moved) {
		inval_top(run, "latest");
		if (run->se && !run->single)
			fuse_lowlevel_notify_inval_inode(run->se, INO_LATEST, 0, 0);
		ckfs_log(CKFS_LOG_INFO, "latest -> %s", run->latest[0] ? run->latest : "(none)");
	}
	if ((n_gone || n_came || latest_moved) && run->se && !run->single)
		fuse_lowlevel_notify_inval_inode(run->se, FUSE_ROOT_ID, 0, 0);
	free(gone);
	free(came);
	free(drop);
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

static void *watcher_main(void *arg)
{
	struct ckfs_run *run = arg;
	char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));

	for (;;) {
		struct pollfd pfd[2] = { { run->ino_fd, POLLIN, 0 }, { run->wake[0], POLLIN, 0 } };
		/* Without tracker, the newest step waits for its quiet time:
		 * a timer only then, so an idle mount sleeps. */
		int timeout = run->pending_s > 0 ? (int)run->pending_s * 1000 + 100 : -1;
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
		run->pending_s = rescan(run, NULL);
		watch_steps(run);
	}
	return NULL;
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
		if (!run->steps || !(run->steps[0] = step_new(run, &rs)))
			return ckfs_nomem(err);
		run->n_steps = 1;
		return CKFS_OK;
	}
	/* Watched before the first listing: what changes meanwhile waits in
	 * the inotify queue for the watcher (started once mounted). */
	run->ino_fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
	if (run->ino_fd < 0 || inotify_add_watch(run->ino_fd, run->base, WATCH_TOP) < 0)
		return ckfs_fail_errno(err, "cannot watch '%s' (inotify)", run->base);
	run->pending_s = rescan(run, err);
	if (run->pending_s < 0)
		return err->code;
	watch_steps(run);
	pthread_mutex_lock(&run->lock);
	size_t n = run->n_steps;
	pthread_mutex_unlock(&run->lock);
	ckfs_log(CKFS_LOG_INFO, "'%s': a run, %zu step%s shown%s%s", opt->src, n,
		 n == 1 ? "" : "s", run->latest[0] ? ", latest " : "", run->latest);
	return CKFS_OK;
}

enum ckfs_code ckfs_run_start(struct ckfs_run *run, struct fuse_session *se,
			      struct ckfs_error *err)
{
	run->se = se;
	ckfs_fs_mark_ready(&run->fs, run->opt->mountpoint);
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

void ckfs_run_stop(struct ckfs_run *run)
{
	if (!run)
		return;
	if (run->watching) {
		char c = 0;
		ssize_t w = write(run->wake[1], &c, 1);
		(void)w;
		pthread_join(run->watcher, NULL);
		run->watching = false;
	}
	run->se = NULL;
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
			plan_put(run, drop[0]);
			pthread_mutex_lock(&run->lock);
		}
		size_t n_drop = 0;
		step_free_locked(run, s, drop, &n_drop);
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

static struct fuse_lowlevel_ops run_ops;

/* ckfs_ll_ops with the handlers that know the run; the rest (EROFS for
 * every write, init, forget, releasedir) are the same. */
static void run_ops_init(void)
{
	run_ops = ckfs_ll_ops;
	run_ops.lookup = run_lookup;
	run_ops.getattr = run_getattr;
	run_ops.readlink = run_readlink;
	run_ops.open = run_open;
	run_ops.read = run_read;
	run_ops.release = run_release;
	run_ops.opendir = run_opendir;
	run_ops.readdir = run_readdir;
	run_ops.readdirplus = run_readdirplus;
	run_ops.statfs = run_statfs;
	run_ops.getxattr = run_getxattr;
	run_ops.listxattr = run_listxattr;
	run_ops.access = run_access;
}

const struct fuse_lowlevel_ops *ckfs_run_ops(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, run_ops_init);
	return &run_ops;
}
