/* SPDX-License-Identifier: MIT */
/*
 * A whole training run as one mount (include/ckfs/run.h for the rules):
 *
 *     MNT/global_step_<N>/<role>/   what `ckfs export SRC/global_step_<N>/<role>` writes
 *     MNT/latest -> global_step_<N> the step the tracker file names
 *
 * or, for SRC a single global_step_<N> folder, its roles at the top.
 *
 * The state the run's files share (private to them; the handlers see the
 * run only as a tree, src/fuse/tree.h). Files: run_tree.c (the tree:
 * inodes, what they are, listings, the stats, life cycle), run_plans.c
 * (steps, serials, plans and their references, the LRU, plan building),
 * run_watch.c (listing the run again: rescan, inotify, the timer, kernel
 * invalidation).
 *
 * Locks. run->lock guards the step table, plans' reference counts and the
 * LRU; it is never held while building a plan, reading a file or talking
 * to the kernel. run->build_lock makes builds one at a time.
 */
#ifndef CKFS_FUSE_RUN_TREE_H
#define CKFS_FUSE_RUN_TREE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "ckfs/err.h"
#include "ckfs/run.h"
#include "fuse/served.h"
#include "fuse/tree.h"

/* Inodes and cache file ids (run_tree.c, "Inodes"; run_plans.c, "Cache"),
 * and the roles per step and files per role they have room for. */
#define INO_LATEST 2
#define ROLE_SHIFT 20
#define SERIAL_SHIFT 32
#define MAX_ROLES 4094
#define MAX_NODES ((1u << ROLE_SHIFT) - 2)

/* Counters of one step, kept while the step or a plan of it lives. */
struct run_stats {
	int refs;                           /* under run->lock */
	uint64_t step;
	struct ckfs_io_counters io;         /* its files' opens, reads, ... */
	atomic_uint_fast64_t plans_built, plan_errors;
};

/* A role's plan: its served folder, shared by the handlers. */
struct run_plan {
	struct ckfs_served served;          /* first: a served folder is its plan */
	int refs;                           /* LRU + open files + users; run->lock */
	uint64_t id;
	struct run_stats *stats;
	struct run_plan *prev, *next;       /* LRU, most recent first */
	struct run_plan *all_next;          /* every live plan, for the fill */
	bool in_lru;
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
	struct ckfs_fs fs;                  /* first: the handlers' userdata */
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
};

/* ---- run_plans.c: plans and the step table (each described where defined) ---- */

void run_plan_put(struct ckfs_run *run, struct run_plan *p);
struct run_plan *run_plan_by_id(struct ckfs_run *run, uint64_t id);
struct run_step *run_step_by_serial(struct ckfs_run *run, uint64_t serial);
struct run_step *run_step_by_name(struct ckfs_run *run, const char *name);
struct run_step *run_step_new(struct ckfs_run *run, const struct ckfs_run_step *rs);
void run_step_free_locked(struct ckfs_run *run, struct run_step *s, struct run_plan **drop,
			  size_t *n_drop);
int run_step_roles(struct ckfs_run *run, uint64_t serial);
struct run_plan *run_role_plan(struct ckfs_run *run, uint64_t serial, size_t r, bool *broken);
void run_plans_free(struct ckfs_run *run);

/* ---- run_watch.c ---- */

/* Watch the run folder, list it the first time (failing as the listing
 * does) and watch its steps; the watcher thread itself starts with
 * run_watch_start, once mounted. */
enum ckfs_code run_watch_init(struct ckfs_run *run, struct ckfs_error *err) CKFS_WARN_UNUSED;
enum ckfs_code run_watch_start(struct ckfs_run *run, struct fuse_session *se,
			       struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Stop watching (before the session goes); then close the watch. */
void run_watch_stop(struct ckfs_run *run);
void run_watch_close(struct ckfs_run *run);

#endif
