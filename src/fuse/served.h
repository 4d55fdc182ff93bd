/* SPDX-License-Identifier: MIT */
/*
 * A served folder (private to src/fuse): one checkpoint opened as `ckfs
 * export` opens it (its model and folder), with what the mount adds to
 * show it: the modes shown, per weight file and slice the bytes replied
 * to the kernel, the counters of its reads and a clock per file that
 * keeps its read errors from flooding the log. A checkpoint mount serves
 * one (src/fuse/checkpoint_tree.c); a run mount one per role it has built
 * (src/fuse/run_plans.c). Immutable once opened but for the counters,
 * clocks and replied bytes, which are atomic.
 */
#ifndef CKFS_FUSE_SERVED_H
#define CKFS_FUSE_SERVED_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "ckfs/err.h"
#include "ckfs/folder.h"
#include "ckfs/model.h"

struct ckfs_mount_options;

/* What is counted of the files served: per mount, and per step of a run. */
enum ckfs_io {
	CKFS_IO_OPENS,
	CKFS_IO_READS,              /* READ requests */
	CKFS_IO_BYTES_READ,         /* bytes replied */
	CKFS_IO_ERRORS,             /* READ requests answered with an error */
	CKFS_IO_COUNTERS
};
struct ckfs_io_counters {
	atomic_uint_fast64_t n[CKFS_IO_COUNTERS];
};

struct ckfs_served {
	char label[96];             /* "global_step_N/role" in a run, else "":
				     * what log lines name its files under */
	struct ckfs_model *m;
	struct ckfs_folder *f;
	mode_t *modes;              /* permission bits of node i */
	mode_t root_mode;           /* of its top folder */
	/* Per weight node (NULL for others), per slice: bytes of it replied
	 * to the kernel since it last asked again for bytes it had. A slice
	 * replied in full sits in the kernel's page cache (keep_cache), so
	 * read-ahead does not fill it again for another handle. */
	_Atomic uint32_t **replied;
	atomic_int_fast64_t *err_logged_at; /* per node: last error log, seconds + 1 */
	/* Set by the owner after opening: */
	struct ckfs_io_counters *counters; /* a run step's, or NULL */
	uint64_t file_base;         /* cache file id of node 0 (ids are
				     * file_base + node) */
};

/*
 * Open the checkpoint role_dir of a run (under its symlink policy), or
 * opt->src itself when role_dir is NULL, with the mount's options; its
 * warnings are logged under label. The modes are shown for owner uid:gid
 * (umask= as given, or carried from the sources). s is closed with
 * ckfs_served_close even on failure.
 */
enum ckfs_code ckfs_served_open(struct ckfs_served *s, const struct ckfs_mount_options *opt,
				const char *role_dir, const char *label, uid_t uid, gid_t gid,
				struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Free what open made and close its sources; no request may use s. */
void ckfs_served_close(struct ckfs_served *s);

/* "/" after a non-empty label: log lines name a file '<label><sep><name>'. */
const char *ckfs_served_sep(const struct ckfs_served *s);
/* Log a failed read of node at most once every CKFS_ERR_LOG_INTERVAL
 * seconds per file: a reader retrying must not flood the log. */
void ckfs_served_log_read_error(struct ckfs_served *s, size_t node, uint64_t off, size_t len,
				const struct ckfs_error *err);

#endif
