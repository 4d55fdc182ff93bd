/* SPDX-License-Identifier: MIT */
/*
 * The FUSE front end as src/cli sees it (private to src/fuse and
 * src/cli): the options a mount runs with, the entry point, the one place
 * ckfs error codes become errno values, mount-point lookups.
 *
 * A mount serves the files `ckfs export` writes, of one checkpoint or of
 * every step and role of a training run, through libfuse's low-level API:
 * one set of handlers over the mount's tree (src/fuse/tree.h).
 *
 * Files: session.c (mount life cycle: checks, mount, daemonize,
 * readiness, signals, loop, teardown), fs.c (the front end's state, life
 * cycle, attributes), ll_ops.c (the handlers), read_reply.c (READ, the
 * cache's fill, read-ahead), read_stream.c (READs of an s3:// source that
 * follow the reader), preload.c (-o preload: the weight files
 * stored into the page cache), served.c (a served folder), counters.c (the
 * stats), checkpoint_tree.c and run_tree.c (the trees; a run's with
 * run_plans.c and run_watch.c), errno.c, mountinfo.c (mount-point lookups
 * shared with umount and stats).
 */
#ifndef CKFS_FUSE_FS_H
#define CKFS_FUSE_FS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "ckfs/err.h"
#include "ckfs/folder.h"
#include "ckfs/layouts.h"
#include "ckfs/log.h"
#include "ckfs/model.h"

/* Name of the root xattr holding the daemon's counters as JSON. */
#define CKFS_STATS_XATTR "user.ckfs.stats"
/* Name of the root xattr holding the source checkpoint path. */
#define CKFS_SOURCE_XATTR "user.ckfs.source"

/* Largest request the kernel may send: 1 MiB = 256 pages, the most a 6.1
 * kernel negotiates (FUSE_MAX_PAGES_PER_REQ); set as max_read and
 * max_write, from which libfuse derives max_pages. */
#define CKFS_FUSE_MAX_REQUEST (1u << 20)

struct ckfs_mount_options {
	const char *src;            /* checkpoint folder, absolute */
	const char *mountpoint;     /* absolute, or /dev/fd/N from mount.fuse3 */
	struct ckfs_model_options model;
	struct ckfs_folder_options folder;
	uint64_t cache_size;        /* slice cache budget, bytes */
	size_t slice_size;          /* bytes, power of two */
	int threads;                /* FUSE worker threads */
	int prefetch_threads;       /* read-ahead workers; 0 disables */
	int readahead;              /* largest read-ahead window, in slices */
	int max_plans;              /* a run: step roles kept built (LRU) */
	int s3_poll_s;              /* a run in a store: listed again this often */
	/* share_slices=: equal slices held once in the cache (include/ckfs/
	 * cache.h): CKFS_SHARE_AUTO (a run's mount: yes; one checkpoint: no),
	 * _ON or _OFF */
	enum { CKFS_SHARE_AUTO, CKFS_SHARE_ON, CKFS_SHARE_OFF } share_slices;
	/* -o preload: a checkpoint's weight files stored into the kernel's
	 * page cache from the mount's start (src/fuse/preload.c), as much of
	 * them as preload_max allows */
	bool preload;
	uint64_t preload_max;       /* bytes, when has_preload_max; otherwise
				     * half of MemAvailable at mount */
	bool has_preload_max;
	unsigned kernel_readahead_kb; /* the mount's read_ahead_kb; 0 leaves
				       * the kernel's (root only) */
	bool kernel_readahead_set;    /* given: an s3:// source's reads do not
				     * stream (src/fuse/read_stream.c) */
	bool foreground;
	bool debug;                 /* libfuse request tracing (implies -f) */
	bool nosandbox;             /* -o nosandbox, for debugging: the serving daemon
				     * is not confined (src/fuse/sandbox.h) */
	bool has_uid, has_gid;
	uid_t uid;
	gid_t gid;
	/* umask=: files 0444 & ~umask, folders 0555 & ~umask, whatever the
	 * sources allow (publishing on purpose); otherwise the modes are
	 * carried from the sources (include/ckfs/perm.h). */
	bool has_umask;
	mode_t umask;
	bool allow_other;           /* given: others may reach the mount */
	enum ckfs_log_level log_level;
	/* Mount options for libfuse (comma list, escaped), already holding
	 * ro, fsname, subtype, max_read and default_permissions. */
	char *fuse_opts;
};

/*
 * Mount opt->src at opt->mountpoint and serve it until unmounted or sent
 * SIGTERM/SIGINT/SIGHUP. Without opt->foreground it returns in the parent
 * only once the mount is ready (status 0) or has failed (status 1, after
 * one "ckfs: ..." line on stderr); the daemon itself never returns.
 * Returns the process exit status.
 */
int ckfs_fuse_run(const struct ckfs_mount_options *opt);
/* Append opt to the comma list *list (libfuse's fuse_opt_add_opt; escape:
 * commas and backslashes in opt escaped, for a value such as a path).
 * 0, or -1 when out of memory. */
int ckfs_fuse_opts_add(char **list, const char *opt, bool escape);

/* The single mapping from ckfs codes to errno values. */
int ckfs_err_to_errno(const struct ckfs_error *err);

/* Canonical absolute form of path, resolving every component but the last
 * (which may be a dead FUSE mount). 0, or -1 with errno. */
int ckfs_abs_path(const char *path, char *out, size_t size);
/* Whether the absolute, canonical path is a mount point: 1 (its type, e.g.
 * "fuse.ckfs", copied to fstype, and its device "major:minor" to dev when
 * dev is not NULL), 0, or -1 when mountinfo is unreadable. */
int ckfs_mountinfo_lookup(const char *path, char *fstype, size_t fstype_size,
			  char *dev, size_t dev_size);

#endif
