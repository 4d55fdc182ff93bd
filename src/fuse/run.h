/* SPDX-License-Identifier: MIT */
/*
 * A training run, or one of its steps, served as one mount (src/fuse/run.c,
 * run_ops.c, run_watch.c, sharing run_int.h; private to src/fuse and
 * src/cli/mount.c through session.c).
 */
#ifndef CKFS_FUSE_RUN_H
#define CKFS_FUSE_RUN_H

#include <stdbool.h>

#include "ckfs/err.h"
#include "fuse/fs.h"

struct ckfs_run;
struct fuse_session;
struct fuse_lowlevel_ops;

/* List the run opt->src (single: SRC is one global_step_<N> folder) and
 * set up its cache; reads no rank file. *out is freed with ckfs_run_free
 * even on failure. */
enum ckfs_code ckfs_run_new(const struct ckfs_mount_options *opt, bool single,
			    struct ckfs_run **out, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Once mounted: mark the moment serving starts, and watch the run folder
 * (inotify) for steps coming and going. */
enum ckfs_code ckfs_run_start(struct ckfs_run *run, struct fuse_session *se,
			      struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Stop watching (before the session goes); NULL is ignored. */
void ckfs_run_stop(struct ckfs_run *run);
/* Stop watching, close every plan, free; no request may be in flight. */
void ckfs_run_free(struct ckfs_run *run);
/* The handlers of a run mount; their userdata is the struct ckfs_run. */
const struct fuse_lowlevel_ops *ckfs_run_ops(void);

#endif
