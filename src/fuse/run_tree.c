/* SPDX-License-Identifier: MIT */
/*
 * A whole training run as one mount: the tree the handlers serve
 * (src/fuse/tree.h; src/fuse/run_tree.h for the whole).
 *
 * Inodes. A step shown gets a serial number that is never reused; its
 * inodes are serial << 32 (the step folder), | (role + 1) << 20 (a role
 * folder: its plan's served folder), | (node + 1) (node of the role's
 * folder). The top is 1 and `latest` 2. A step whose roles change, or
 * whose files differ from what its first plan described when the plan is
 * built again, gets a new serial: the kernel's old inodes then answer
 * ENOENT, never other bytes. One step mounted alone is the top itself,
 * under its current serial.
 *
 * The top and latest change as the run does (short timeouts, the watcher
 * invalidates them); a step's roles and a role's files are fixed for the
 * step's serial. A role whose plan cannot be built is an empty folder that
 * may be fixed meanwhile, so it is not kept long either.
 */
#define FUSE_USE_VERSION 312

#include <errno.h>
#include <fuse_lowlevel.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/strbuf.h"
#include "fuse/counters.h"
#include "fuse/run_tree.h"

static struct ckfs_run *run_of(struct ckfs_fs *fs)
{
	return (struct ckfs_run *)fs;
}

/* ---- inodes ---- */

enum ino_kind { INO_NONE, INO_TOP, INO_LINK, INO_STEP, INO_ROLE, INO_NODE };

struct ino_ref {
	enum ino_kind kind;
	uint64_t serial;
	size_t role;    /* INO_ROLE, INO_NODE */
	size_t node;    /* INO_NODE */
};

static struct ino_ref ino_decode(struct ckfs_run *run, uint64_t ino)
{
	struct ino_ref r = { INO_NONE, 0, 0, 0 };
	uint64_t role = (ino >> ROLE_SHIFT) & ((1u << (SERIAL_SHIFT - ROLE_SHIFT)) - 1);
	uint64_t node = ino & ((1u << ROLE_SHIFT) - 1);

	if (ino == FUSE_ROOT_ID) {
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

static uint64_t step_ino(const struct ckfs_run *run, uint64_t serial)
{
	return run->single ? FUSE_ROOT_ID : serial << SERIAL_SHIFT;
}

static uint64_t role_ino(uint64_t serial, size_t r)
{
	return serial << SERIAL_SHIFT | (uint64_t)(r + 1) << ROLE_SHIFT;
}

/* ---- what an inode is ---- */

static int resolve_top(struct ckfs_run *run, struct ckfs_at *at)
{
	at->kind = CKFS_AT_DIR;
	at->fixed = false;
	at->parent = FUSE_ROOT_ID;
	pthread_mutex_lock(&run->lock);
	ckfs_fs_stat_dir(&run->fs, at->ino, run->dir_mode, (nlink_t)run->n_steps,
			 run->scan.mtime, &at->st);
	pthread_mutex_unlock(&run->lock);
	return 0;
}

static int resolve_latest(struct ckfs_run *run, struct ckfs_at *at)
{
	at->kind = CKFS_AT_LINK;
	at->fixed = false;
	pthread_mutex_lock(&run->lock);
	snprintf(at->link, sizeof(at->link), "%s", run->latest);
	ckfs_fs_stat_link(&run->fs, at->ino, strlen(at->link), run->scan.mtime, &at->st);
	pthread_mutex_unlock(&run->lock);
	return at->link[0] ? 0 : ENOENT;
}

/* The role count of the listing: a step's attributes cost no listing of
 * its folder (ls -l of a run of many steps). */
static int resolve_step(struct ckfs_run *run, uint64_t serial, struct ckfs_at *at)
{
	at->kind = CKFS_AT_DIR;
	at->fixed = !run->single;
	at->parent = FUSE_ROOT_ID;
	pthread_mutex_lock(&run->lock);
	struct run_step *s = run_step_by_serial(run, serial);
	if (s)
		ckfs_fs_stat_dir(&run->fs, at->ino, run->dir_mode,
				 (nlink_t)(s->roles_listed ? s->n_roles : s->n_roles_seen),
				 s->mtime, &at->st);
	pthread_mutex_unlock(&run->lock);
	return s ? 0 : ENOENT;
}

/* A role folder, or a node in it: its plan, built when needed. */
static int resolve_plan(struct ckfs_run *run, const struct ino_ref *r, struct ckfs_at *at)
{
	bool broken;
	struct run_plan *p = run_role_plan(run, r->serial, r->role, &broken);

	at->parent = step_ino(run, r->serial);
	if (!p) {
		if (!broken || r->kind != INO_ROLE)
			return ENOENT;
		/* A role that cannot be served: an empty folder. */
		at->kind = CKFS_AT_DIR;
		at->fixed = false;
		ckfs_fs_stat_dir(&run->fs, at->ino, run->dir_mode, 0, (struct timespec){ 0, 0 },
				 &at->st);
		return 0;
	}
	if (r->kind == INO_NODE && r->node >= p->served.f->n_nodes) {
		run_plan_put(run, p);
		return ENOENT;
	}
	at->kind = CKFS_AT_SERVED;
	at->fixed = true;
	at->served = &p->served;
	at->node = r->kind == INO_NODE ? &p->served.f->nodes[r->node] : NULL;
	at->top = role_ino(r->serial, r->role);
	return 0;
}

static int run_resolve(struct ckfs_fs *fs, uint64_t ino, struct ckfs_at *at)
{
	struct ckfs_run *run = run_of(fs);
	struct ino_ref r = ino_decode(run, ino);

	at->ino = ino;
	switch (r.kind) {
	case INO_TOP:
		return resolve_top(run, at);
	case INO_LINK:
		return resolve_latest(run, at);
	case INO_STEP:
		return resolve_step(run, r.serial, at);
	case INO_ROLE:
	case INO_NODE:
		return resolve_plan(run, &r, at);
	case INO_NONE:
		break;
	}
	return ENOENT;
}

static void run_put(struct ckfs_fs *fs, struct ckfs_served *s)
{
	run_plan_put(run_of(fs), (struct run_plan *)s);
}

/* ---- the run's own folders: the top, a step, a role left empty ---- */

static int run_list(struct ckfs_fs *fs, const struct ckfs_at *dir, struct ckfs_list *l)
{
	struct ckfs_run *run = run_of(fs);
	struct ino_ref r = ino_decode(run, dir->ino);
	int rc = r.kind == INO_STEP ? run_step_roles(run, r.serial) : 0;

	if (rc)
		return rc;
	pthread_mutex_lock(&run->lock);
	if (r.kind == INO_TOP) {
		for (size_t i = 0; i < run->n_steps && !rc; i++)
			rc = ckfs_list_add(l, run->steps[i]->name,
					   step_ino(run, run->steps[i]->serial), S_IFDIR, false);
		if (!rc && run->latest[0])
			rc = ckfs_list_add(l, "latest", INO_LATEST, S_IFLNK, false);
	} else if (r.kind == INO_STEP) {
		/* A role's attributes need its plan: listing a step stays cheap. */
		struct run_step *s = run_step_by_serial(run, r.serial);
		for (size_t i = 0; s && i < s->n_roles && !rc; i++)
			rc = ckfs_list_add(l, s->roles[i].name, role_ino(r.serial, i), S_IFDIR,
					   true);
	}
	pthread_mutex_unlock(&run->lock);
	return rc;
}

/* ---- the cache's files ---- */

static struct ckfs_served *run_file(struct ckfs_fs *fs, uint64_t file_id,
				    struct ckfs_error *err)
{
	struct run_plan *p = run_plan_by_id(run_of(fs), file_id >> ROLE_SHIFT);

	if (!p) {
		ckfs_fail(err, CKFS_E_CHANGED, "file %" PRIu64 " is no longer served", file_id);
		return NULL;
	}
	return &p->served;
}

/* ---- stats: the run's plans, and per step ---- */

static void run_stats_head(struct ckfs_fs *fs, struct ckfs_strbuf *b)
{
	struct ckfs_run *run = run_of(fs);
	uint64_t v[CKFS_STAT_ROWS] = { 0 };

	ckfs_strbuf_str(b, ",\"run\":true");
	ckfs_stats_put_pid(b);
	ckfs_stats_put_uptime(fs, b);
	pthread_mutex_lock(&run->lock);
	for (struct run_plan *p = run->all; p; p = p->all_next) {
		v[CKFS_STAT_PLANS_OPEN]++;
		v[CKFS_STAT_FILES] += p->served.f->n_nodes;
	}
	ckfs_strbuf_str(b, ",\"latest\":");
	if (run->latest[0])
		ckfs_strbuf_json(b, run->latest);
	else
		ckfs_strbuf_str(b, "null");
	v[CKFS_STAT_STEPS_SHOWN] = run->n_steps;
	v[CKFS_STAT_PLANS_CACHED] = run->n_lru;
	v[CKFS_STAT_MAX_PLANS] = (uint64_t)run->opt->max_plans;
	pthread_mutex_unlock(&run->lock);
	/* steps_shown .. max_plans, then files (the order of the first run
	 * mounts' JSON) */
	ckfs_stats_put(b, &ckfs_stat_rows[CKFS_STAT_STEPS_SHOWN],
		       CKFS_STAT_ROWS - CKFS_STAT_STEPS_SHOWN, &v[CKFS_STAT_STEPS_SHOWN]);
	ckfs_stats_put(b, &ckfs_stat_rows[CKFS_STAT_FILES], 1, &v[CKFS_STAT_FILES]);
}

/* The object of step s (run->lock held). */
static void step_json(struct ckfs_strbuf *b, const struct run_step *s, bool first)
{
	struct run_stats *st = s->stats;
	uint64_t v[CKFS_STEP_ROWS] = { 0 };

	for (size_t r = 0; r < s->n_roles; r++)
		v[CKFS_STEP_PLANS_CACHED] += s->roles[r].plan != NULL;
	v[CKFS_STEP_PLANS_BUILT] = atomic_load(&st->plans_built);
	v[CKFS_STEP_PLAN_ERRORS] = atomic_load(&st->plan_errors);
	v[CKFS_STEP_OPENS] = atomic_load(&st->io.n[CKFS_IO_OPENS]);
	v[CKFS_STEP_READS] = atomic_load(&st->io.n[CKFS_IO_READS]);
	v[CKFS_STEP_BYTES_READ] = atomic_load(&st->io.n[CKFS_IO_BYTES_READ]);
	v[CKFS_STEP_ERRORS] = atomic_load(&st->io.n[CKFS_IO_ERRORS]);
	ckfs_strbuf_fmt(b, "%s{\"step\":%" PRIu64 ",\"name\":", first ? "" : ",", s->step);
	ckfs_strbuf_json(b, s->name);
	ckfs_stats_put(b, ckfs_step_stat_rows, CKFS_STEP_ROWS, v);
	ckfs_strbuf_str(b, ",\"broken\":[");
	first = true;
	for (size_t r = 0; r < s->n_roles; r++) {
		if (!s->roles[r].error)
			continue;
		ckfs_strbuf_str(b, first ? "{\"role\":" : ",{\"role\":");
		ckfs_strbuf_json(b, s->roles[r].name);
		ckfs_strbuf_str(b, ",\"error\":");
		ckfs_strbuf_json(b, s->roles[r].error);
		ckfs_strbuf_str(b, "}");
		first = false;
	}
	ckfs_strbuf_str(b, "]}");
}

static void run_stats_tail(struct ckfs_fs *fs, struct ckfs_strbuf *b)
{
	struct ckfs_run *run = run_of(fs);

	ckfs_strbuf_str(b, ",\"steps\":[");
	pthread_mutex_lock(&run->lock);
	for (size_t i = 0; i < run->n_steps; i++)
		step_json(b, run->steps[i], i == 0);
	pthread_mutex_unlock(&run->lock);
	ckfs_strbuf_str(b, "]");
}

static void run_log_serving(struct ckfs_fs *fs, const char *cache_size)
{
	const struct ckfs_mount_options *opt = fs->opt;

	ckfs_log(CKFS_LOG_NOTICE, "serving the %s '%s' at '%s': cache %s, %d plans, "
		 "%d threads", run_of(fs)->single ? "step" : "run", opt->src,
		 opt->mountpoint, cache_size, opt->max_plans, opt->threads);
}

/* ---- life cycle ---- */

static enum ckfs_code run_start(struct ckfs_fs *fs, struct fuse_session *se,
				struct ckfs_error *err)
{
	return run_watch_start(run_of(fs), se, err);
}

static void run_stop(struct ckfs_fs *fs)
{
	run_watch_stop(run_of(fs));
}

static void run_free(struct ckfs_fs *fs)
{
	struct ckfs_run *run = run_of(fs);

	run_watch_stop(run);
	run_watch_close(run);
	run_plans_free(run);
	ckfs_run_scan_release(&run->scan);
	pthread_mutex_destroy(&run->lock);
	pthread_mutex_destroy(&run->build_lock);
	free(run->base);
	free(run);
}

static const struct ckfs_tree_ops run_tree_ops = {
	.resolve = run_resolve,
	.put = run_put,
	.list = run_list,
	.file = run_file,
	.stats_head = run_stats_head,
	.stats_tail = run_stats_tail,
	.log_serving = run_log_serving,
	.start = run_start,
	.stop = run_stop,
	.free = run_free,
};

/* SRC as a run of one step: its parent folder, this name. */
static enum ckfs_code list_single(struct ckfs_run *run, const struct stat *st,
				  struct ckfs_error *err)
{
	const char *src = run->opt->src;
	struct ckfs_run_step rs;
	const char *why;
	uint64_t step;

	memset(&rs, 0, sizeof(rs));
	if (ckfs_run_step_name(strrchr(src, '/') + 1, &step, &why) != CKFS_STEP_NAME_OK)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': not a step folder", src);
	rs.step = step;
	rs.mtime = st->st_mtim;
	snprintf(rs.name, sizeof(rs.name), CKFS_RUN_STEP_PREFIX "%" PRIu64, step);
	run->steps = calloc(1, sizeof(*run->steps));
	if (!run->steps || !(run->steps[0] = run_step_new(run, &rs)))
		return ckfs_nomem(err);
	run->n_steps = 1;
	return CKFS_OK;
}

/* The folder steps are in, its modes, and the first listing: names, the
 * tracker, stat; no rank file. */
static enum ckfs_code run_list_first(struct ckfs_run *run, struct ckfs_error *err)
{
	const char *src = run->opt->src;
	struct stat st;

	if (run->single) {
		const char *slash = strrchr(src, '/');
		if (!slash || slash == src)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': a step at the top of the "
					 "file system", src);
		run->base = strndup(src, (size_t)(slash - src));
	} else {
		run->base = strdup(src);
	}
	if (!run->base)
		return ckfs_nomem(err);
	if (ckfs_stat(src, &st) != 0)
		return ckfs_fail_errno(err, "'%s'", src);
	run->dir_mode = run->opt->has_umask ? 0555 & ~run->opt->umask : st.st_mode & 0555;
	if (run->single)
		return list_single(run, &st, err);
	CKFS_TRY(run_watch_init(run, err));
	pthread_mutex_lock(&run->lock);
	size_t n = run->n_steps;
	pthread_mutex_unlock(&run->lock);
	ckfs_log(CKFS_LOG_INFO, "'%s': a run, %zu step%s shown%s%s", src, n,
		 n == 1 ? "" : "s", run->latest[0] ? ", latest " : "", run->latest);
	return CKFS_OK;
}

enum ckfs_code ckfs_run_tree_open(const struct ckfs_mount_options *opt, bool single,
				  struct ckfs_fs **out, struct ckfs_error *err)
{
	struct ckfs_run *run = calloc(1, sizeof(*run));

	*out = NULL;
	if (!run)
		return ckfs_nomem(err);
	ckfs_fs_init(&run->fs, &run_tree_ops, opt);
	run->opt = opt;
	run->single = single;
	run->ino_fd = run->wake[0] = run->wake[1] = -1;
	pthread_mutex_init(&run->lock, NULL);
	pthread_mutex_init(&run->build_lock, NULL);
	if (run_list_first(run, err) != CKFS_OK) {
		run_free(&run->fs);
		return err->code;
	}
	*out = &run->fs;
	return CKFS_OK;
}
