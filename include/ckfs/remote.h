/* SPDX-License-Identifier: MIT */
/*
 * Checkpoints in an object store, seen as read-only folders of files
 * (src/store/remote.c), under URLs "s3://bucket/prefix/...". The files
 * module (include/ckfs/file.h) sends every path that is such a URL here,
 * so readers and layouts work on a store as on a local folder.
 *
 * A root is attached once: its whole prefix is listed (ListObjectsV2,
 * every page) into a snapshot of keys, sizes and ETags. Lookups, folder
 * listings and opens answer from that snapshot, so a checkpoint is seen
 * as it was at one moment, and an open costs no request. An opened
 * object is pinned to the ETag it had in the snapshot: every read names
 * it (If-Match), and an object replaced since fails instead of serving
 * bytes of two versions.
 *
 * Reads: while a file's metadata is parsed, small ones (headers, pickles,
 * zip records) are served from aligned blocks fetched whole and kept per
 * object, so it takes a few requests, not one per record; afterwards, and
 * for large ones, each read is one ranged GET of exactly its bytes,
 * unless a read of the served files fetched it ahead with its neighbours
 * (ckfs_file_ahead).
 */
#ifndef CKFS_REMOTE_H
#define CKFS_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "ckfs/err.h"
#include "ckfs/file.h"
#include "ckfs/s3.h"

/* Settings for the store, before the first attach: the endpoint
 * (--s3-endpoint; NULL: from the environment, see ckfs_s3_config_load). */
void ckfs_remote_set_endpoint(const char *endpoint);

/* Keep fetched bytes in the folder dir, at most budget bytes, shared with
 * other processes naming it (--s3-cache; src/store/disk_cache.h). */
enum ckfs_code ckfs_remote_set_cache(const char *dir, uint64_t budget,
				     struct ckfs_error *err) CKFS_WARN_UNUSED;
/* That folder, or NULL when there is no cache on disk. */
const char *ckfs_remote_cache_dir(void);

/* List the prefix url names ("s3://bucket/prefix") into a snapshot that
 * paths under it are looked up in. Attaching a root again, or one under
 * an attached root, is a no-op; CKFS_E_NOTFOUND when nothing is stored
 * under it. */
enum ckfs_code ckfs_remote_attach(const char *url, struct ckfs_error *err) CKFS_WARN_UNUSED;

/* ckfs_remote_attach for each of paths[0..n) that is an s3:// URL (NULL
 * and local paths are skipped). */
enum ckfs_code ckfs_remote_attach_urls(const char *const *paths, size_t n,
				       struct ckfs_error *err) CKFS_WARN_UNUSED;

/* The store's client (made on first use from the settings; owned by
 * this module): for what writes to the store (`export` to s3://). */
enum ckfs_code ckfs_remote_client(struct ckfs_s3 **out, struct ckfs_error *err) CKFS_WARN_UNUSED;

/* List the attached root holding url again (runs on a store: new steps). */
enum ckfs_code ckfs_remote_refresh(const char *url, struct ckfs_error *err) CKFS_WARN_UNUSED;

/* Forget every root and the client (the process ends, or a test starts
 * over), after every object opened is closed. */
void ckfs_remote_detach_all(void);

/* stat(2) of a path under an attached root: a regular file (mode 0400,
 * owner the process's, size from the listing) or a folder (a prefix some
 * key continues). -1 with errno ENOENT otherwise. */
int ckfs_remote_stat(const char *path, struct stat *st);

/* An object opened for reading. */
struct ckfs_remote_file;

enum ckfs_code ckfs_remote_open(const char *path, struct ckfs_remote_file **out,
				struct stat *st, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* pread(2)'s contract: the bytes read, fewer than len only past the end;
 * -1 with errno EIO (the store's error is logged, one line) or ESTALE
 * (the object is no longer the version opened). Thread-safe. */
ssize_t ckfs_remote_pread(struct ckfs_remote_file *f, void *buf, size_t len, uint64_t off);
/* ckfs_file_ahead and ckfs_file_ahead_drop: v[0..n) are ranges of
 * store objects; held per thread, so no lock guards them. */
void ckfs_remote_ahead(struct ckfs_file_range *v, size_t n);
void ckfs_remote_ahead_drop(void);
/* The ETag it was opened at (quoted, as the store sends it). */
const char *ckfs_remote_etag(const struct ckfs_remote_file *f);
/* What ckfs_remote_stat said of it when it was opened. */
void ckfs_remote_fstat(const struct ckfs_remote_file *f, struct stat *st);
/* A second handle on the same version of the object. */
enum ckfs_code ckfs_remote_dup(const struct ckfs_remote_file *f, struct ckfs_remote_file **out,
			       struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_remote_close(struct ckfs_remote_file *f);
/* A model's metadata is read: drop the blocks kept for small reads, and
 * from now on fetch every read's exact range. */
void ckfs_remote_forget(struct ckfs_remote_file *f);

/* The names in a folder of an attached root, each once, with whether it
 * is a folder; NULL with errno (ENOENT, ENOTDIR, ENOMEM). */
struct ckfs_remote_dir;
struct ckfs_remote_dir *ckfs_remote_opendir(const char *path);
const char *ckfs_remote_readdir(struct ckfs_remote_dir *d, bool *is_dir);
void ckfs_remote_closedir(struct ckfs_remote_dir *d);

/* The store's request counts so far (all roots), for stats and tests. */
void ckfs_remote_counts(struct ckfs_s3_counts *out);

#endif
