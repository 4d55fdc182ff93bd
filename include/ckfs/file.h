/* SPDX-License-Identifier: MIT */
/*
 * Opening the files of a checkpoint, the one way every reader does it.
 *
 * A checkpoint may come from someone else, so a file is checked before
 * anything is opened or read: it must resolve inside the checkpoint
 * folder (the symlink policy, unless --follow-symlinks: under its real
 * path, or below it by identity where a bind mount gives it another
 * name), and be a regular file (a FIFO would block the open or the read,
 * a device could do anything on open, a folder is not a file). The open
 * itself cannot block (O_NONBLOCK) and the opened file must be the one
 * checked, so a link swapped in between is noticed. Readers then keep
 * the opened file, and src/model/source.c records its identity to detect
 * later changes.
 *
 * A path that is an "s3://bucket/prefix/..." URL under a prefix attached
 * with ckfs_remote_attach (include/ckfs/remote.h) names an object in a
 * store instead: every function here answers for it from the store's
 * listing, and an opened object reads by ranged GETs pinned to its
 * version. There are no links in a store, so the policy is met.
 */
#ifndef CKFS_FILE_H
#define CKFS_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "ckfs/err.h"

/* Who may read a file: recorded when it is read, so that what is served
 * from it is never shown more widely (include/ckfs/perm.h). */
struct ckfs_file_access {
	const char *path;      /* NULL: nothing recorded */
	mode_t mode;
	uid_t uid;
	gid_t gid;
	bool acl;              /* it has an access ACL */
};

/* Where files may come from. */
struct ckfs_file_policy {
	const char *root;      /* real path files must resolve inside; NULL: anywhere */
	const char *alt_root;  /* a second such folder (a --config folder outside
				* root), or NULL */
	bool follow_symlinks;  /* accept files that resolve anywhere */
};

/*
 * The symlink policy alone, for a file or a folder: path must resolve
 * inside pol's roots, else CKFS_E_INVALID "'<path>': symlink leads outside
 * the checkpoint; use --follow-symlinks". pol NULL, no root or
 * follow_symlinks: always CKFS_OK. A missing path is CKFS_E_NOTFOUND
 * ("not found", or "dangling symlink").
 */
enum ckfs_code ckfs_file_check_policy(const struct ckfs_file_policy *pol, const char *path,
				      struct ckfs_error *err) CKFS_WARN_UNUSED;

/* An opened file: a local descriptor (fd >= 0), or an object in a store
 * (remote). Small, passed by value; closed by whoever opened it. */
struct ckfs_file {
	int fd;
	struct ckfs_remote_file *remote;
};
#define CKFS_FILE_NONE ((struct ckfs_file){ .fd = -1, .remote = NULL })

/* A local descriptor as an opened file (the caller keeps owning fd). */
static inline struct ckfs_file ckfs_file_of_fd(int fd)
{
	return (struct ckfs_file){ .fd = fd, .remote = NULL };
}

static inline bool ckfs_file_is_open(struct ckfs_file f)
{
	return f.fd >= 0 || f.remote;
}

/*
 * Open path read-only as a regular file under pol (NULL: no symlink
 * policy): the policy first, then the file's type (CKFS_E_INVALID "not a
 * regular file" without opening it), then the open, then a check that
 * the opened file is the one looked at (CKFS_E_CHANGED). On success *f
 * is the caller's, and *st (when not NULL) its fstat.
 */
enum ckfs_code ckfs_file_open(const struct ckfs_file_policy *pol, const char *path,
			      struct ckfs_file *f, struct stat *st,
			      struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_file_close(struct ckfs_file *f);
/* The metadata is read: what was kept to read it in few requests (a store
 * object's blocks) goes; later reads fetch what they need. */
void ckfs_file_metadata_done(struct ckfs_file f);

/* pread(2) until len bytes at off are read, again after EINTR and short
 * reads: the bytes read, fewer than len only at end of file; -1 with
 * errno when a read fails (ESTALE: a store's object is no longer the
 * version opened). */
ssize_t ckfs_file_pread(struct ckfs_file f, void *buf, size_t len, uint64_t off);

/* Bytes of a file that a read is about to take. */
struct ckfs_file_range {
	struct ckfs_file f;
	uint64_t pos, len;
};

/*
 * Fetch ahead what one read of the calling thread will take: the ranges
 * of v[0..n) in a store (local ones are left to the page cache) are
 * fetched now, neighbours in one object merged into one GET, and held
 * for this thread's ckfs_file_pread until ckfs_file_ahead_drop. A store
 * charges per request, and a read assembles its bytes from many small
 * runs. Best effort: what is not held (a failed fetch, a range past the
 * bound) is fetched, and its failure reported, by the pread itself. v is
 * reordered.
 */
void ckfs_file_ahead(struct ckfs_file_range *v, size_t n);
void ckfs_file_ahead_drop(void);

/* fstat(2) of the file now (a store's object: as opened); -1 with errno. */
int ckfs_file_stat(struct ckfs_file f, struct stat *st);
/* Its size, the same way; -1 with errno. */
int64_t ckfs_file_size(struct ckfs_file f);
/* A second handle on the same file (dup(2); a store's object: on the
 * same version). */
enum ckfs_code ckfs_file_dup(struct ckfs_file f, struct ckfs_file *out,
			     struct ckfs_error *err) CKFS_WARN_UNUSED;

/* A whole regular file of at most max bytes (CKFS_E_LIMIT beyond), opened
 * as ckfs_file_open does, into a malloc'd NUL-terminated buffer; who may
 * read it into *access when not NULL (its path left to the caller). */
enum ckfs_code ckfs_file_read_small(const struct ckfs_file_policy *pol, const char *path,
				    size_t max, char **out, size_t *len,
				    struct ckfs_file_access *access,
				    struct ckfs_error *err) CKFS_WARN_UNUSED;

/* Whether a file has an access ACL (POSIX or NFSv4), whose entries may
 * deny users its mode bits let in. */
bool ckfs_fd_has_acl(int fd);
bool ckfs_path_has_acl(const char *path);

/* path names root or something under it (both real paths). */
bool ckfs_path_under(const char *path, const char *root);

/*
 * Whether the folder dir (its stat) is path (a folder) or a folder above
 * what path names, following symlinks: walked up from path's folder by
 * "..", comparing (st_dev, st_ino). Names cannot tell: a bind mount, or
 * an export mounted twice, shows one folder under two paths. 1: it is;
 * 0: it is not; -1 (errno): path cannot be resolved.
 */
int ckfs_path_within(const char *path, const struct stat *dir);

/* stat(2) says: a folder; anything that exists. */
bool ckfs_path_is_dir(const char *path);
bool ckfs_path_exists(const char *path);

/* stat(2), lstat(2) and realpath(3) for local paths and store URLs alike (a URL's
 * real path is itself, without trailing slashes). */
int ckfs_stat(const char *path, struct stat *st);
int ckfs_lstat(const char *path, struct stat *st);
char *ckfs_realpath(const char *path);

/* A folder's entries, "." and ".." left out: opendir(3)/readdir(3) for
 * local paths and store URLs alike. is_dir: the entry is a folder
 * (following links). NULL with errno. */
struct ckfs_dir;
struct ckfs_dir *ckfs_opendir(const char *path);
const char *ckfs_readdir(struct ckfs_dir *d, bool *is_dir);
void ckfs_closedir(struct ckfs_dir *d);

#endif
