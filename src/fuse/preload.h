/* SPDX-License-Identifier: MIT */
/*
 * Preload (private to src/fuse): from the mount's start, one thread
 * assembles the weight files of a served folder in file order, slice by
 * slice through the slice cache, and pushes each slice into the kernel's
 * page cache with fuse_lowlevel_notify_store, so a loader that comes later
 * finds the bytes there and never waits on a FUSE round trip. The essay on
 * why it is safe and how it yields to the loader is in preload.c.
 */
#ifndef CKFS_FUSE_PRELOAD_H
#define CKFS_FUSE_PRELOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "ckfs/err.h"

struct ckfs_fs;
struct ckfs_served;
struct fuse_session;
struct ckfs_preload;

/* What the preload did so far (the stats rows of src/fuse/counters.h). */
struct ckfs_preload_stats {
	uint64_t target;            /* bytes it set out to store */
	uint64_t stored;            /* bytes stored into the page cache */
	uint64_t skipped;           /* bytes left alone: a read had sent them */
	uint64_t errors;            /* slices that could not be assembled or stored */
	bool done;                  /* it has stopped: all stored, or an error */
};

/*
 * Preload the weight files of s, served at mount point mnt with node i at
 * inode top + 1 + i: their first budget bytes in file order (whole
 * slices). The thread inherits the caller's signal mask. *out is NULL when
 * nothing is to be preloaded.
 */
enum ckfs_code ckfs_preload_start(struct ckfs_fs *fs, struct fuse_session *se,
				  struct ckfs_served *s, uint64_t top, const char *mnt,
				  uint64_t budget, struct ckfs_preload **out,
				  struct ckfs_error *err) CKFS_WARN_UNUSED;
/* No store into the session after this returns (call it before the
 * session is unmounted); the thread may still be finishing. NULL ignored. */
void ckfs_preload_stop(struct ckfs_preload *p);
/* Stop, wait for the thread (after the unmount: a lookup of its own may be
 * pending until then) and free. NULL ignored. */
void ckfs_preload_free(struct ckfs_preload *p);
/* Half of MemAvailable now: the budget when none is given (0 when
 * /proc/meminfo cannot be read). */
uint64_t ckfs_preload_default_budget(void);
/* NULL: all zero. */
void ckfs_preload_get_stats(struct ckfs_preload *p, struct ckfs_preload_stats *out);

#endif
