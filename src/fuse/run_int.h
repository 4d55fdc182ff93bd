/* SPDX-License-Identifier: MIT */
/*
 * A whole training run as one mount (include/ckfs/run.h for the rules):
 *
 *     MNT/global_step_<N>/<role>/   what `ckfs export SRC/global_step_<N>/<role>` writes
 *     MNT/latest -> global_step_<N> the step the tracker file names
 *
 * or, for SRC a single global_step_<N> folder, its roles at the top.
 *
 * The state the run's files share (private to them; src/fuse/run.h is what
 * the session sees). Files: run.c (the run's state: steps, serials, plans
 * and their references, the LRU, plan building, the cache's fill, life
 * cycle), run_ops.c (the FUSE handlers: inodes, attributes, listings,
 * reads, the stats xattr), run_watch.c (listing the run again: rescan,
 * inotify, the timer, kernel invalidation).
 *
 * Locks. run->lock guards the step table, plans' reference counts and the
 * LRU; it is never held while building a plan, reading a file or talking
 * to the kernel. run->build_lock makes builds one at a time.
 */
#ifndef CKFS_FUSE_RUN_INT_H
#define CKFS_FUSE_RUN_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "ckfs/err.h"
#include "ckfs/run.h"
#include "fuse/fs.h"
#include "fuse/run.h"

/* Inodes and cache file ids (run_ops.c, "Inodes"; run.c, "Cache"), and
 * the roles per step and files per role they have room for. */
#define INO_LATEST 2
#define ROLE_SHIFT 20
#define SERIAL_SHIFT 32
#define MAX_ROLES 4094
#define MAX_NODES ((1u << ROLE_SHIFT) - 2)

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
};

/* ---- run.c: plans and the step table (each described where defined) ---- */

void run_plan_put(struct ckfs_run *run, struct run_plan *p);
struct run_step *run_step_by_serial(struct ckfs_run *run, uint64_t serial);
struct run_step *run_step_by_name(struct ckfs_run *run, const char *name);
struct run_step *run_step_new(struct ckfs_run *run, const struct ckfs_run_step *rs);
void run_step_free_locked(struct ckfs_run *run, struct run_step *s, struct run_plan **drop,
			  size_t *n_drop);
int run_step_roles(struct ckfs_run *run, struct run_step *s);
struct run_plan *run_role_plan(struct ckfs_run *run, uint64_t serial, size_t r, bool *broken);

/* ---- run_watch.c ---- */

/* Watch the run folder, list it the first time (failing as the listing
 * does) and watch its steps; the watcher thread itself starts with
 * ckfs_run_start. */
enum ckfs_code run_watch_init(struct ckfs_run *run, struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
