/* SPDX-License-Identifier: MIT */
/*
 * The FUSE front end (private to src/fuse and src/cli/mount.c): the
 * options a mount runs with, the state the low-level handlers share, and
 * the one place ckfs error codes become errno values.
 *
 * A mount serves one immutable struct ckfs_folder (the files `ckfs export`
 * writes) through libfuse's low-level API. Inode numbers are fixed at
 * build time: the root directory is 1 and node i of the folder's sorted
 * node array is i + 2, so they are the same on every mount of the same
 * checkpoint. Weight files are read through the slice cache
 * (include/ckfs/cache.h, file id = node index); rendered and passthrough
 * files are small and read directly.
 *
 * Files: session.c (mount life cycle: checks, build, mount, daemonize,
 * readiness, signals, loop, teardown), ll.c (the handlers), errno.c,
 * mountinfo.c (mount-point lookups shared with umount and stats); a whole
 * run: run.h (run.c, run_ops.c, run_watch.c).
 */
#ifndef CKFS_FUSE_FS_H
#define CKFS_FUSE_FS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "ckfs/cache.h"
#include "ckfs/err.h"
#include "ckfs/folder.h"
#include "ckfs/log.h"
#include "ckfs/layouts.h"
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
	unsigned kernel_readahead_kb; /* the mount's read_ahead_kb; 0 leaves
				       * the kernel's (root only) */
	bool foreground;
	bool debug;                 /* libfuse request tracing (implies -f) */
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

/* Per open file: read-ahead state of one file handle (fi->fh). */
struct ckfs_handle {
	size_t node;
	pthread_mutex_t lock;       /* protects the fields below */
	uint64_t prev_end;          /* end of the latest sequential read */
	uint64_t slice;             /* slice holding the latest read's end */
	uint64_t ra_next;           /* first slice not yet queued */
	unsigned window;            /* read-ahead window, slices; 0 = random */
	bool seen;                  /* a read happened on this handle */
};

/* Counters of the front end; the cache keeps its own. */
struct ckfs_fs_stats {
	atomic_uint_fast64_t reads;         /* READ requests */
	atomic_uint_fast64_t bytes_read;    /* bytes replied */
	atomic_uint_fast64_t errors;        /* READ requests answered with an error */
	atomic_uint_fast64_t opens;
	atomic_uint_fast64_t ra_sequential; /* reads seen as sequential */
	atomic_uint_fast64_t ra_slices;     /* slices handed to prefetch */
	atomic_uint_fast64_t ra_skipped;    /* not handed: the kernel has them */
};

/* Everything the handlers share; immutable after ckfs_fs_init except the
 * counters and the per-node error-log clocks. */
struct ckfs_fs {
	const struct ckfs_mount_options *opt;
	const struct ckfs_model *model;
	const struct ckfs_folder *folder;
	struct ckfs_cache *cache;
	size_t slice_size;
	uid_t uid;
	gid_t gid;
	mode_t *node_modes;         /* permission bits of node i */
	mode_t root_mode;           /* of the root folder */
	pthread_key_t scratch_key;  /* per-thread struct ckfs_read_scratch */
	bool scratch_key_made;
	atomic_int_fast64_t *err_logged_at; /* per node: last error log, seconds */
	/* Per weight node (NULL for others), per slice: bytes of it replied
	 * to the kernel since it last asked again for bytes it had. A slice
	 * replied in full sits in the kernel's page cache (keep_cache), so
	 * read-ahead does not fill it again for another handle (read_ahead). */
	_Atomic uint32_t **replied;
	struct ckfs_fs_stats stats;
	uint64_t source_bytes_at_ready; /* ckfs_source_bytes_read() then */
	struct timespec ready_at;   /* CLOCK_MONOTONIC */
	/* /sys/class/bdi/<dev>/read_ahead_kb to set to opt->kernel_readahead_kb
	 * once the kernel has taken the INIT reply (which would lower it
	 * again); ra_pending says it is still to do. */
	char bdi_ra_path[96];
	atomic_bool ra_pending;
};

/* Set up fs for a built folder: the modes shown, the scratch key,
 * per-node state and the slice cache with its read-ahead workers. */
enum ckfs_code ckfs_fs_init(struct ckfs_fs *fs,
			    const struct ckfs_mount_options *opt,
			    const struct ckfs_model *model,
			    const struct ckfs_folder *folder,
			    struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The part of ckfs_fs_init a run mount shares (src/fuse/run.c): the
 * scratch key and the slice cache, filled by fill(ctx, ...). */
enum ckfs_code ckfs_fs_init_shared(struct ckfs_fs *fs, const struct ckfs_mount_options *opt,
				   ckfs_cache_fill_fn fill, void *ctx,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;
/* This thread's scratch for the core read path (NULL when out of memory). */
struct ckfs_read_scratch *ckfs_fs_scratch(struct ckfs_fs *fs);
/* Bytes [off, off + len) of cache file file_id (size bytes long) replied
 * to req from pinned slices, after h's read-ahead (which skips slices
 * replied in full, by the file's counters replied, when not NULL); err
 * cleared by the caller. On failure nothing is replied: the caller answers the error. */
struct fuse_req;
enum ckfs_code ckfs_fs_read_cached(struct fuse_req *req, struct ckfs_fs *fs,
				   struct ckfs_handle *h, uint64_t file_id,
				   _Atomic uint32_t *replied, uint64_t size,
				   uint64_t off, size_t len,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The replied counters (see struct ckfs_fs) of every weight file of f:
 * per node, NULL for other nodes; freed with ckfs_fs_replied_free. */
enum ckfs_code ckfs_fs_replied_new(const struct ckfs_folder *f, uint64_t slice_size,
				   _Atomic uint32_t ***out,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_fs_replied_free(const struct ckfs_folder *f, _Atomic uint32_t **r);
/* Stop the workers and free what ckfs_fs_init made; no request may be in
 * flight. */
void ckfs_fs_release(struct ckfs_fs *fs);
/* Mark the moment serving begins (baseline for source_bytes_read), and
 * plan the kernel readahead of the mount at mnt (see ckfs_mount_options). */
void ckfs_fs_mark_ready(struct ckfs_fs *fs, const char *mnt);

/* The modes shown for folder f (ll.c, also a run mount's plans): umask=
 * as given, or carried from the sources for owner uid:gid. *modes (one
 * per node, malloc'd) is the caller's to free, also on failure. */
enum ckfs_code ckfs_fs_modes(const struct ckfs_mount_options *opt, uid_t uid, gid_t gid,
			     const struct ckfs_folder *f, mode_t **modes, mode_t *root_mode,
			     struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The attributes of node n of folder f (NULL: its top folder) shown as
 * inode ino with permission bits mode, owned by uid:gid. */
struct stat;
void ckfs_fs_stat_node(const struct ckfs_folder *f, const struct ckfs_node *n, mode_t mode,
		       uid_t uid, gid_t gid, uint64_t ino, struct stat *st);
/* Answer a getxattr of value (len bytes) asked with size: size 0 gets
 * size_hint, a smaller size ERANGE. */
void ckfs_fs_reply_xattr(struct fuse_req *req, const char *value, size_t len, size_t size,
			 size_t size_hint);

/* The low-level operations table (ll.c). */
struct fuse_lowlevel_ops;
extern const struct fuse_lowlevel_ops ckfs_ll_ops;

/* Canonical absolute form of path, resolving every component but the last
 * (which may be a dead FUSE mount). 0, or -1 with errno. */
int ckfs_abs_path(const char *path, char *out, size_t size);
/* Whether the absolute, canonical path is a mount point: 1 (its type, e.g.
 * "fuse.ckfs", copied to fstype, and its device "major:minor" to dev when
 * dev is not NULL), 0, or -1 when mountinfo is unreadable. */
int ckfs_mountinfo_lookup(const char *path, char *fstype, size_t fstype_size,
			  char *dev, size_t dev_size);


#endif
